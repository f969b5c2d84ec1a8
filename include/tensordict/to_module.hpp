// to_module: a TensorDict's tensors swapped into a module for a scope (an
// RAII guard that puts the originals back, also on exceptions), typed and
// run-time; to_module_ copies values into the module's own tensors.
//
//   {
//     auto swap = tensordict::to_module(zeros, net);     // net now computes with `zeros`
//     auto y = net->forward(x);
//   }                                                    // originals back, also on throw
//
// libtorch modules keep their tensors in members (LinearImpl::weight) and in
// a registry (named_parameters, state dict). Swapping assigns both, so the
// forward uses the new tensors, gradients flow to them, and the registry
// shows them; set_data would send gradients to the old leaf and fails on
// functorch's batched tensors.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/grad_mode.h>

#include "any_tensordict.hpp"
#include "detail/config.hpp"
#include "detail/format.hpp"
#include "detail/module_access.hpp"
#include "detail/module_slots.hpp"
#include "errors.hpp"
#include "nn/module_registry.hpp"
#include "typed_tensordict.hpp"

namespace tensordict {

namespace detail {
// A module tensor that a swap replaced, to put back when it ends.
struct swapped_tensor {
  at::Tensor* member = nullptr;  // null: the swap left this leaf alone
  at::Tensor* registry = nullptr;
  at::Tensor old_member;
  at::Tensor old_registry;
  flag_change flag;
};
// module_swap's work, not a template: checks every set leaf incoming[i] of `leaves` against the
// module's tensor at slots[i] before changing anything (errors name leaves.path(i); batched: the
// TensorDict has batch dims), then puts it in the member and the registry, saved[i] keeping what it replaced.
TENSORDICT_DECL void swap_in(const module_slot* slots, const at::Tensor* incoming, entry_table leaves, bool batched, swap_mode mode,
                             swapped_tensor* saved);
// Puts back what swap_in replaced: in reverse, so a tensor reached twice (a shared sub-module) ends as it began.
TENSORDICT_DECL void swap_back(swapped_tensor* saved, std::size_t count) noexcept;
}  // namespace detail

// While it lives, the module computes with the TensorDict's tensors; its
// destructor puts the originals back (members and registry), also during
// stack unwinding. Movable, not copyable. release() keeps the new tensors and
// returns the originals as a TensorDict (the non-scoped form).
template <class Impl>
class [[nodiscard]] module_swap {
 public:
  using schema_t = nn::schema_of<Impl>;
  static constexpr std::size_t leaf_count = schema_t::leaf_count;

  module_swap(Impl& module, const TensorDict<schema_t>& params, swap_mode mode = swap_mode::keep_module_flags)
      : module_(&module) {
    const auto slots = detail::slots_of<Impl>(module);
    // A TensorDict's leaves lie one after another in its storage.
    detail::swap_in(slots.data(), leaf_count ? &params.leaf(0) : nullptr, detail::leaf_entries<schema_t>(), params.batch_dims() != 0,
                    mode, saved_.data());
  }

  module_swap(module_swap&& other) noexcept : module_(std::exchange(other.module_, nullptr)), saved_(std::move(other.saved_)) {}
  module_swap& operator=(module_swap&&) = delete;
  module_swap(const module_swap&) = delete;
  module_swap& operator=(const module_swap&) = delete;

  ~module_swap() { restore(); }

  // Puts the originals back now (the destructor then does nothing).
  void restore() noexcept {
    if (!module_) return;
    detail::swap_back(saved_.data(), leaf_count);
    module_ = nullptr;
  }

  // Keeps the swap; returns the tensors it replaced (unset where nothing was replaced).
  TensorDict<schema_t> release() {
    std::array<at::Tensor, leaf_count> old;
    for (std::size_t i = 0; i < leaf_count; ++i) old[i] = saved_[i].old_member;
    module_ = nullptr;
    return TensorDict<schema_t>(std::move(old));
  }

 private:
  Impl* module_;
  std::array<detail::swapped_tensor, leaf_count> saved_{};
};

namespace compile_error {
template <class ModuleSchema, class ParamsSchema>
struct params_of_another_schema {
  static_assert(always_false<ParamsSchema>,
                "tensordict: these parameters do not fit this module: the TensorDict's schema (second in "
                "'params_of_another_schema<...>' above) is not the module's (first), nor its flatten_keys<\".\">() "
                "form. Build the parameters with from_module(module) or from_modules(...) of this module type.");
};
}  // namespace compile_error

namespace detail {
// Params of the module's schema, or of its flattened form (state-dict names).
template <class Impl, class S>
decltype(auto) as_module_params(const TensorDict<S>& params) {
  using M = nn::schema_of<Impl>;
  if constexpr (std::is_same_v<S, M>)
    return params;
  else if constexpr (std::is_same_v<S, flatten_t<M, ".">>)
    return params.template unflatten_keys<".">();
  else {
    compile_error::report<compile_error::params_of_another_schema<M, S>>();
    return TensorDict<M>();
  }
}
}  // namespace detail

// Swaps the TensorDict's tensors into the module until the guard dies; each
// takes the requires_grad flag of the tensor it replaces unless mode is
// swap_mode::as_given (see swap_mode).
template <class Module, class S>
  requires(!nn::dynamic_module<Module> && !nn::runtime_layout_module<Module>)  // those take an AnyTensorDict (below)
module_swap<nn::impl_of_t<Module>> to_module(const TensorDict<S>& params, Module&& module,
                                             swap_mode mode = swap_mode::keep_module_flags) {
  using Impl = nn::impl_of_t<Module>;
  return module_swap<Impl>(detail::impl_ref(module), detail::as_module_params<Impl>(params), mode);
}

// Copies the TensorDict's values into the module's own tensors (no swap, no
// gradient tracking): the module keeps its tensors, with new values.
template <class Module, class S>
  requires(!nn::dynamic_module<Module> && !nn::runtime_layout_module<Module>)
void to_module_(const TensorDict<S>& params, Module&& module) {
  using Impl = nn::impl_of_t<Module>;
  decltype(auto) p = detail::as_module_params<Impl>(params);
  auto& impl = detail::impl_ref(module);
  auto slots = detail::slots_of<Impl>(impl);
  using schema_t = nn::schema_of<Impl>;
  for (std::size_t i = 0; i < schema_t::leaf_count; ++i) {
    const at::Tensor& incoming = p.leaf(i);
    const at::Tensor& current = *slots[i].member;
    if (incoming.defined() && (!current.defined() || current.sizes() != incoming.sizes()))
      throw shape_error("tensordict::to_module_: the leaf " + to_string(leaf_path<schema_t>(i)) + " is " +
                        describe(incoming) + " but the module's tensor is " + describe(current));
  }
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < schema_t::leaf_count; ++i)
    if (p.leaf(i).defined()) slots[i].member->copy_(p.leaf(i));
}

namespace detail {

// A leaf of params and where it goes in the module.
struct dynamic_target {
  any_key_path path;
  at::Tensor value;
  at::Tensor* member = nullptr;    // what the forward reads
  at::Tensor* registry = nullptr;  // named_parameters() / named_buffers()
};

// Every leaf of params matched with a module's registered tensor of the same
// shape and dtype (after `batch_dims` leading dims), in a module type whose
// members are known (unless members_needed is false: a copy into the
// registered tensor, which is the one the forward reads, needs no member; so
// the tensors of a TensorDictParams' children, plain modules, can take one).
// Throws before anything changes.
TENSORDICT_DECL std::vector<dynamic_target> resolve_targets(torch::nn::Module& root, const AnyTensorDict& params,
                                                            std::size_t batch_dims, const char* op, bool members_needed = true);

}  // namespace detail

// While it lives, the module computes with the AnyTensorDict's tensors; its
// destructor puts the originals back (members and registry), also during
// stack unwinding. release() keeps the new tensors and returns the originals.
class [[nodiscard]] dynamic_module_swap {
 public:
  dynamic_module_swap(torch::nn::Module& module, const AnyTensorDict& params, swap_mode mode = swap_mode::keep_module_flags,
                      const char* op = "tensordict::to_module");
  // Out of line, with restore(): a program's TU does not instantiate the
  // saved entries' vector for a guard it only creates and destroys.
  TENSORDICT_DECL dynamic_module_swap(dynamic_module_swap&& other) noexcept;
  dynamic_module_swap& operator=(dynamic_module_swap&&) = delete;
  TENSORDICT_DECL ~dynamic_module_swap();

  TENSORDICT_DECL void restore() noexcept;

  TENSORDICT_DECL AnyTensorDict release();

 private:
  struct saved {
    any_key_path path;
    at::Tensor* member;
    at::Tensor* registry;
    at::Tensor old_member;
    at::Tensor old_registry;
    detail::flag_change flag;
  };
  std::vector<saved> saved_;
  bool active_ = false;
};

// Swaps the AnyTensorDict's tensors into any module until the guard dies.
// params may hold a subset of the module's tensors, nested or flat ("0.weight").
template <class M>
  requires std::is_base_of_v<torch::nn::Module, nn::impl_of_t<M>> || nn::dynamic_module<M>
dynamic_module_swap to_module(const AnyTensorDict& params, M&& module, swap_mode mode = swap_mode::keep_module_flags) {
  return dynamic_module_swap(detail::dynamic_ref(module), params, mode);
}

// Copies the values into the module's own tensors (no swap, no gradient tracking).
template <class M>
  requires std::is_base_of_v<torch::nn::Module, nn::impl_of_t<M>> || nn::dynamic_module<M>
void to_module_(const AnyTensorDict& params, M&& module) {
  auto targets = detail::resolve_targets(detail::dynamic_ref(module), detail::unflatten_if_flat(params), 0,
                                         "tensordict::to_module_", /*members_needed=*/false);
  at::NoGradGuard no_grad;
  for (auto& t : targets) t.member->copy_(t.value);
}

}  // namespace tensordict

#if TENSORDICT_DEFINITIONS
namespace tensordict {
namespace detail {
// Whether a module on the way from root to `owner` is a TensorDictParams
// (by type name: this header does not know nn/params.hpp).
inline bool held_by_tensordict_params(torch::nn::Module& root, const any_key_path& owner) {
  torch::nn::Module* m = &root;
  for (std::size_t k = 0;; ++k) {
    if (m->name().find("TensorDictParamsImpl") != std::string::npos) return true;
    if (k == owner.size() || !(m = find_child(*m, owner[k]))) return false;
  }
}

TENSORDICT_DECL std::vector<dynamic_target> resolve_targets(torch::nn::Module& root, const AnyTensorDict& params,
                                                            std::size_t batch_dims, const char* op, bool members_needed) {
  std::vector<dynamic_target> out;
  // The last leaf's module and kind: a module's leaves come one after another.
  torch::nn::Module* last_module = nullptr;
  std::shared_ptr<const nn::module_kind> last_kind;
  params.for_each_leaf([&](const any_key_path& path, const at::Tensor& value) {
    torch::nn::Module* m = &root;
    for (std::size_t k = 0; k + 1 < path.size(); ++k) {
      torch::nn::Module* child = find_child(*m, path[k]);
      if (!child) {
        const std::string names = quoted_names(m->named_children().keys());
        throw key_error(std::string(op) + ": " + to_string(path) + ": " + where(any_key_path(path.begin(), path.begin() + k)) +
                        " (" + module_type_name(*m) + ") has no child \"" + path[k] + "\"; its children are " +
                        (names.empty() ? "none" : names));
      }
      m = child;
    }
    const std::string& name = path.back();
    at::Tensor* registry = module_parameters(*m).find(name);
    if (!registry) registry = module_buffers(*m).find(name);
    const any_key_path owner(path.begin(), path.end() - 1);
    if (!registry || !registry->defined()) {
      std::vector<std::string> own;
      for (const auto& t : m->named_parameters(false))
        if (t.value().defined()) own.push_back(t.key());
      for (const auto& t : m->named_buffers(false))
        if (t.value().defined()) own.push_back(t.key());
      const std::string names = quoted_names(own);
      throw key_error(std::string(op) + ": " + to_string(path) + ": " + where(owner) + " (" + module_type_name(*m) +
                      ") has no tensor \"" + name + "\"; its tensors are " + (names.empty() ? "none" : names));
    }
    const at::Tensor& current = *registry;
    if (value.dim() < static_cast<std::int64_t>(batch_dims) || value.sizes().slice(batch_dims) != current.sizes() ||
        value.scalar_type() != current.scalar_type()) {
      std::string expected = describe(current);
      if (batch_dims) expected += " after the " + std::to_string(batch_dims) + " batch dim(s)";
      throw shape_error(std::string(op) + ": " + to_string(path) + " is " + describe(value) + ", but the module's tensor is " +
                        expected);
    }
    if (!members_needed) {
      out.push_back({path, value, registry, registry});
      return;
    }
    if (m != last_module) {
      last_kind = nn::detail::module_registry::instance().find(*m);
      last_module = m;
    }
    const auto& kind = last_kind;
    if (!kind && held_by_tensordict_params(root, owner))
      throw module_error(std::string(op) + ": " + to_string(path) + " is a leaf of a TensorDictParams, whose tensors are its TensorDict's: swap them with to_module on what its tensordict() "
                         "holds, or copy values in with to_module_");
    if (!kind)
      throw module_error(std::string(op) + ": " + to_string(path) + " belongs to " + where(owner) + ", a " +
                         module_type_name(*m) +
                         ", whose type tensordict does not know, so the tensor its forward reads cannot be swapped. "
                         "Register the type once: tensordict::nn::register_module_type<" + module_type_name(*m) +
                         ">() (it needs TENSORDICT_MODULE).");
    at::Tensor* member = nullptr;
    for (auto& [member_name, pointer] : kind->members(*m))
      if (member_name == name) member = pointer;
    if (!member)
      throw module_error(std::string(op) + ": " + to_string(path) + ": the schema of " + kind->type_name +
                         " does not name its tensor \"" + name + "\"; add it to TENSORDICT_MODULE");
    out.push_back({path, value, member, registry});
  });
  return out;
}

}  // namespace detail

TENSORDICT_DECL void detail::swap_in(const module_slot* slots, const at::Tensor* incoming, entry_table leaves, bool batched,
                                     swap_mode mode, swapped_tensor* saved) {
  for (std::size_t i = 0; i < leaves.count; ++i) {
    if (!incoming[i].defined()) continue;
    const at::Tensor& current = *slots[i].member;
    if (!current.defined())
      throw key_error("tensordict::to_module: the module has no tensor at " + to_string(leaves.path(i)) +
                      ", but the TensorDict sets it to " + describe(incoming[i]));
    if (current.sizes() != incoming[i].sizes() || current.scalar_type() != incoming[i].scalar_type())
      throw shape_error("tensordict::to_module: the leaf " + to_string(leaves.path(i)) + " is " + describe(incoming[i]) +
                        " but the module's tensor is " + describe(current) +
                        (batched ? " (a TensorDict with batch dims goes through vmap or functional_vmap)" : ""));
  }
  for (std::size_t i = 0; i < leaves.count; ++i) {
    if (!incoming[i].defined()) continue;
    swapped_tensor& s = saved[i];
    s.member = slots[i].member;
    s.registry = registry_entry(slots[i]);
    if (auto change = adopt_requires_grad(incoming[i], *s.member, mode)) s.flag = std::move(*change);
    s.old_member = std::exchange(*s.member, incoming[i]);
    if (s.registry) s.old_registry = std::exchange(*s.registry, incoming[i]);
  }
}

TENSORDICT_DECL void detail::swap_back(swapped_tensor* saved, std::size_t count) noexcept {
  for (std::size_t i = count; i-- > 0;) {
    swapped_tensor& s = saved[i];
    if (!s.member) continue;
    *s.member = std::move(s.old_member);
    if (s.registry) *s.registry = std::move(s.old_registry);
    s.flag.undo();
  }
}

TENSORDICT_DECL dynamic_module_swap::dynamic_module_swap(torch::nn::Module& module, const AnyTensorDict& params, swap_mode mode,
                                                     const char* op) {
    auto targets = detail::resolve_targets(module, detail::unflatten_if_flat(params), 0, op);
    saved_.reserve(targets.size());
    for (auto& t : targets) {
      saved s{t.path, t.member, t.registry, {}, {}, {}};
      if (auto change = detail::adopt_requires_grad(t.value, *t.member, mode)) s.flag = std::move(*change);
      s.old_member = std::exchange(*t.member, t.value);
      s.old_registry = std::exchange(*t.registry, t.value);
      saved_.push_back(std::move(s));
    }
    active_ = true;
  }

TENSORDICT_DECL dynamic_module_swap::dynamic_module_swap(dynamic_module_swap&& other) noexcept
    : saved_(std::move(other.saved_)), active_(std::exchange(other.active_, false)) {}

TENSORDICT_DECL dynamic_module_swap::~dynamic_module_swap() { restore(); }

TENSORDICT_DECL void dynamic_module_swap::restore() noexcept {
  if (!active_) return;
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    *it->member = std::move(it->old_member);
    *it->registry = std::move(it->old_registry);
    it->flag.undo();
  }
  active_ = false;
}

TENSORDICT_DECL AnyTensorDict dynamic_module_swap::release() {
  AnyTensorDict old;
  for (const auto& s : saved_) old.set(s.path, s.old_member);
  active_ = false;
  return old;
}
}  // namespace tensordict
#endif  // TENSORDICT_DEFINITIONS
