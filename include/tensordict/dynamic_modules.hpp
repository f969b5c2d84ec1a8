// Functional calls on models whose structure is known at run time only: a
// torch::nn::Sequential built from a config file, ModuleList, ModuleDict,
// AnyModule, or any torch::nn::Module reached through its base class.
//
//   torch::nn::Sequential net(torch::nn::Linear(3, 8), torch::nn::ReLU(), torch::nn::Linear(8, 1));
//   tensordict::AnyTensorDict params = tensordict::from_module(net);        // the module's own tensors
//   auto y = tensordict::functional_call(net, params, x);
//   auto stacked = tensordict::from_modules(std::vector{net_a, net_b, net_c, net_d});   // batch_size [4]
//   auto ys = tensordict::nn::functional_vmap(net, stacked, tensordict::nn::args(x));  // [4, N, 1]
//
// The same verbs as the typed API (functional.hpp, functional_vmap.hpp),
// with the keys checked at run time. A module that owns tensors must be of a
// type whose members are known: the built-ins are, and a user type is
// registered once with nn::register_module_type<Impl>() (its TENSORDICT_MODULE
// schema, and its nn::functional form or a forward given at run time). A
// tensor that belongs to a module of an unknown type throws module_error
// naming its path and type: swapping only the registry would compute with
// the old tensors, a silent wrong answer.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <typeindex>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/util/Type.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include "any_tensordict.hpp"
#include "detail/module_access.hpp"
#include "errors.hpp"
#include "functional.hpp"
#include "functional_vmap.hpp"

namespace tensordict {
namespace nn {

// What the library knows of a module type at run time.
struct module_kind {
  std::string type_name;
  // The module's own tensor members (not its children's), by registered name.
  std::function<std::vector<std::pair<std::string, at::Tensor*>>(torch::nn::Module&)> members;
  // forward(module, its params, input) without touching the module; empty when it has none.
  std::function<at::Tensor(torch::nn::Module&, const AnyTensorDict&, const at::Tensor&)> forward;
  // The batched form for functional_vmap; empty, or std::nullopt for options it does not lower.
  std::function<std::optional<stacked>(torch::nn::Module&, const AnyTensorDict&, const stacked&, const batch_context&)> batched;
};

namespace detail {

template <class Impl>
std::vector<std::pair<std::string, at::Tensor*>> own_members(torch::nn::Module& m) {
  auto& impl = dynamic_cast<Impl&>(m);
  std::vector<std::pair<std::string, at::Tensor*>> out;
  if constexpr (schema_of<Impl>::leaf_count > 0)
    for (const auto& slot : ::tensordict::detail::slots_of<Impl>(impl))
      if (slot.owner == &m) out.emplace_back(std::string(slot.name), slot.member);
  return out;
}

namespace compile_error {
template <class Impl>
struct registered_type_without_schema {
  static_assert(::tensordict::compile_error::always_false<Impl>,
                "tensordict::nn::register_module_type<Impl>(): Impl (named above in "
                "'registered_type_without_schema<...>') has no schema. Name its members once with "
                "TENSORDICT_MODULE(Impl, member, ...) at global scope, so that its tensors can be swapped.");
};
}  // namespace compile_error

template <class Impl>
module_kind kind_of() {
  module_kind kind;
  if constexpr (!described_module<Impl>) {
    ::tensordict::compile_error::report<compile_error::registered_type_without_schema<Impl>>();
    return kind;
  } else {
    kind.type_name = c10::demangle(typeid(Impl).name());
    kind.members = &own_members<Impl>;
    using S = schema_of<Impl>;
    if constexpr (has_functional_form<Impl>) {
      if constexpr (requires(Impl& m, const TensorDict<S>& p, const at::Tensor& x) {
                      { functional<Impl>::forward(m, p, x) } -> std::convertible_to<at::Tensor>;
                    })
        kind.forward = [](torch::nn::Module& m, const AnyTensorDict& p, const at::Tensor& x) -> at::Tensor {
          return functional<Impl>::forward(dynamic_cast<Impl&>(m), p.to_typed<S>({.allow_missing = true}), x);
        };
    }
    if constexpr (has_batched_form<Impl>) {
      kind.batched = [](torch::nn::Module& m, const AnyTensorDict& p, const stacked& x,
                        const batch_context& ctx) -> std::optional<stacked> {
        auto& impl = dynamic_cast<Impl&>(m);
        if constexpr (requires { batched<Impl>::supports(impl); })
          if (!batched<Impl>::supports(impl)) return std::nullopt;
        return batched<Impl>::forward(impl, p.to_typed<S>({.allow_missing = true}), x, ctx);
      };
    }
    return kind;
  }
}

class module_registry {
 public:
  static module_registry& instance() {
    static module_registry registry;
    return registry;
  }

  void add(std::type_index type, module_kind kind) {
    std::unique_lock lock(mutex_);
    kinds_.insert_or_assign(type, std::make_shared<const module_kind>(std::move(kind)));
  }

  std::shared_ptr<const module_kind> find(const torch::nn::Module& m) const {
    std::shared_lock lock(mutex_);
    auto it = kinds_.find(std::type_index(typeid(m)));
    return it == kinds_.end() ? nullptr : it->second;
  }

 private:
  template <class... Impl>
  void add_builtins(type_list<Impl...>) {
    (add(typeid(Impl), kind_of<Impl>()), ...);
  }

  module_registry() { add_builtins(builtin_modules{}); }

  mutable std::shared_mutex mutex_;
  std::unordered_map<std::type_index, std::shared_ptr<const module_kind>> kinds_;
};

}  // namespace detail

// Registers a user module type: its tensors come from its TENSORDICT_MODULE
// schema; its functional form from nn::functional<Impl> when specialized
// (otherwise its tensors are swapped in for the call). Thread-safe; call once.
template <class Impl>
void register_module_type() {
  detail::module_registry::instance().add(typeid(Impl), detail::kind_of<Impl>());
}

// As above, with a functional form given at run time: forward(module, its
// params (keys as its schema), input) must not write into the module.
template <class Impl, class Forward>
  requires std::is_invocable_r_v<at::Tensor, Forward&, Impl&, const AnyTensorDict&, const at::Tensor&>
void register_module_type(Forward forward) {
  module_kind kind = detail::kind_of<Impl>();
  kind.forward = [f = std::move(forward)](torch::nn::Module& m, const AnyTensorDict& p, const at::Tensor& x) mutable {
    return at::Tensor(f(dynamic_cast<Impl&>(m), p, x));
  };
  detail::module_registry::instance().add(typeid(Impl), std::move(kind));
}

}  // namespace nn

namespace detail {

// The torch::nn::Module behind a holder, a shared_ptr, an AnyModule, or a reference.
template <class M>
torch::nn::Module& dynamic_ref(M&& m) {
  using T = std::remove_cvref_t<M>;
  if constexpr (std::is_same_v<T, torch::nn::AnyModule>) {
    if (m.is_empty()) throw value_error("tensordict: the AnyModule is empty");
    return *m.ptr();
  } else if constexpr (requires { m.ptr(); }) {
    return *m.ptr();
  } else if constexpr (requires { m.get(); *m; }) {
    return *m;
  } else {
    return const_cast<torch::nn::Module&>(static_cast<const torch::nn::Module&>(m));
  }
}

inline std::string module_type_name(const torch::nn::Module& m) { return c10::demangle(typeid(m).name()); }

inline std::string where(const any_key_path& path) { return path.empty() ? "the root module" : to_string(path); }

inline void collect(const torch::nn::Module& m, AnyTensorDict& out, any_key_path& path) {
  auto add = [&](const torch::OrderedDict<std::string, at::Tensor>& tensors) {
    for (const auto& item : tensors) {
      if (!item.value().defined()) continue;  // a Linear built with bias(false)
      path.push_back(item.key());
      out.set(path, item.value());
      path.pop_back();
    }
  };
  add(m.named_parameters(false));
  add(m.named_buffers(false));
  for (const auto& child : m.named_children()) {
    path.push_back(child.key());
    collect(*child.value(), out, path);
    path.pop_back();
  }
}

// A leaf of params and where it goes in the module.
struct dynamic_target {
  any_key_path path;
  at::Tensor value;
  at::Tensor* member = nullptr;    // what the forward reads
  at::Tensor* registry = nullptr;  // named_parameters() / named_buffers()
};

// Every leaf of params matched with a module's registered tensor of the same
// shape and dtype (after `batch_dims` leading dims), in a module type whose
// members are known. Throws before anything changes.
inline std::vector<dynamic_target> resolve_targets(torch::nn::Module& root, const AnyTensorDict& params,
                                                   std::size_t batch_dims, const char* op) {
  std::vector<dynamic_target> out;
  params.for_each_leaf([&](const any_key_path& path, const at::Tensor& value) {
    torch::nn::Module* m = &root;
    for (std::size_t k = 0; k + 1 < path.size(); ++k) {
      std::shared_ptr<torch::nn::Module> child;
      for (const auto& c : m->named_children())
        if (c.key() == path[k]) child = c.value();
      if (!child) {
        const std::string names = quoted_names(m->named_children().keys());
        throw key_error(std::string(op) + ": " + to_string(path) + ": " + where(any_key_path(path.begin(), path.begin() + k)) +
                        " (" + module_type_name(*m) + ") has no child \"" + path[k] + "\"; its children are " +
                        (names.empty() ? "none" : names));
      }
      m = child.get();
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
    auto kind = nn::detail::module_registry::instance().find(*m);
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

// ---- from_module / to_module ------------------------------------------------------------

// The module's registered parameters and buffers, and its children's, as an
// AnyTensorDict of the module's own tensors (batch_size []). Children without
// tensors are left out, as in the typed form.
template <nn::dynamic_module M>
AnyTensorDict from_module(M&& module) {
  AnyTensorDict out;
  any_key_path path;
  detail::collect(detail::dynamic_ref(module), out, path);
  return out;
}

// While it lives, the module computes with the AnyTensorDict's tensors; its
// destructor puts the originals back (members and registry), also during
// stack unwinding. release() keeps the new tensors and returns the originals.
class [[nodiscard]] dynamic_module_swap {
 public:
  dynamic_module_swap(torch::nn::Module& module, const AnyTensorDict& params, swap_mode mode = swap_mode::keep_module_flags,
                      const char* op = "tensordict::to_module") {
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
  dynamic_module_swap(dynamic_module_swap&& other) noexcept
      : saved_(std::move(other.saved_)), active_(std::exchange(other.active_, false)) {}
  dynamic_module_swap& operator=(dynamic_module_swap&&) = delete;
  ~dynamic_module_swap() { restore(); }

  void restore() noexcept {
    if (!active_) return;
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      *it->member = std::move(it->old_member);
      *it->registry = std::move(it->old_registry);
      it->flag.undo();
    }
    active_ = false;
  }

  AnyTensorDict release() {
    AnyTensorDict old;
    for (const auto& s : saved_) old.set(s.path, s.old_member);
    active_ = false;
    return old;
  }

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
  auto targets = detail::resolve_targets(detail::dynamic_ref(module), detail::unflatten_if_flat(params), 0, "tensordict::to_module_");
  at::NoGradGuard no_grad;
  for (auto& t : targets) t.member->copy_(t.value);
}

// The modules' tensors stacked along a new leading dim (batch_size [N]); new
// leaves, as the typed from_modules.
template <nn::dynamic_module M>
AnyTensorDict from_modules(const std::vector<M>& modules, from_modules_options options = {}) {
  if (modules.empty()) throw shape_error("tensordict::from_modules: needs at least one module");
  std::vector<AnyTensorDict> each;
  for (const auto& m : modules) each.push_back(from_module(m));
  AnyTensorDict stacked = [&] {
    at::NoGradGuard no_grad;
    return stack(each);
  }();
  AnyTensorDict out(stacked.batch_size());
  std::vector<at::Tensor> parts(each.size());
  stacked.for_each_leaf([&](const any_key_path& path, const at::Tensor& t) {
    for (std::size_t k = 0; k < each.size(); ++k) parts[k] = each[k].get(path);
    out.set(path, detail::stacked_leaf(t, parts, options));
  });
  return out;
}

// ---- functional_call -------------------------------------------------------------------------

namespace detail {
at::Tensor dynamic_call(torch::nn::Module& m, torch::nn::AnyModule* any, const AnyTensorDict& params,
                        const at::Tensor& input);

// The sub-tree of params for a child, or an empty one.
inline AnyTensorDict child_params(const AnyTensorDict& params, const std::string& name) {
  return params.contains(name) ? params.get_tensordict(name) : AnyTensorDict(params.batch_size());
}

// A Sequential's children in order, each with its sub-tree of params.
inline at::Tensor sequential_call(torch::nn::SequentialImpl& seq, const AnyTensorDict& params, const at::Tensor& input) {
  at::Tensor x = input;
  auto names = seq.named_children();
  std::size_t i = 0;
  for (auto& child : seq) x = dynamic_call(*child.ptr(), &child, child_params(params, names[i++].key()), x);
  return x;
}

// params, with the module's own tensors where params leaves them out (as
// Python's functional_call with a partial dict).
inline AnyTensorDict with_module_tensors(const torch::nn::Module& m, const AnyTensorDict& params) {
  AnyTensorDict full;
  any_key_path path;
  collect(m, full, path);
  params.for_each_leaf([&](const any_key_path& p, const at::Tensor& t) { full.set(p, t); });
  return full;
}

// One module: its functional form when its type has one, a Sequential child
// by child, any other module with its tensors swapped in for the call.
inline at::Tensor dynamic_call(torch::nn::Module& m, torch::nn::AnyModule* any, const AnyTensorDict& params,
                               const at::Tensor& input) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&m)) return sequential_call(*seq, params, input);
  auto call_forward = [&] {
    if (!any)
      throw module_error("tensordict::functional_call: " + module_type_name(m) +
                         " is reached only as a torch::nn::Module, whose forward cannot be called; pass its holder "
                         "or an AnyModule");
    return any->forward(input);
  };
  if (params.empty()) return call_forward();
  auto kind = nn::detail::module_registry::instance().find(m);
  if (kind && kind->forward) {
    (void)resolve_targets(m, params, 0, "tensordict::functional_call");  // the keys, shapes and dtypes
    return kind->forward(m, with_module_tensors(m, params), input);
  }
  std::lock_guard<std::recursive_mutex> serialized(::tensordict::detail::swap_call_lock());
  dynamic_module_swap swap(m, params, swap_mode::as_given, "tensordict::functional_call");
  return call_forward();
}
}  // namespace detail

// Calls the module's forward with `params` in place of its tensors. A
// Sequential calls its children one by one, each through its functional form
// when its type has one (the module is then not touched, so threads may share
// it); other modules are swapped with to_module for the call (not thread-safe).
template <class M>
  requires nn::dynamic_module<M> && (!std::is_same_v<std::remove_cvref_t<M>, torch::nn::Module>)
at::Tensor functional_call(M&& module, const AnyTensorDict& params, const at::Tensor& input) {
  const AnyTensorDict p = detail::unflatten_if_flat(params);
  if constexpr (std::is_same_v<std::remove_cvref_t<M>, torch::nn::AnyModule>)
    return detail::dynamic_call(detail::dynamic_ref(module), const_cast<torch::nn::AnyModule*>(&module), p, input);
  else
    return detail::dynamic_call(detail::dynamic_ref(module), nullptr, p, input);
}

// A module of a static type (a holder of a user module) with run-time params:
// its registered functional form, or its forward with the tensors swapped in.
template <class M, class... Args>
  requires(!nn::dynamic_module<M> && std::is_base_of_v<torch::nn::Module, nn::impl_of_t<M>>)
auto functional_call(M&& module, const AnyTensorDict& params, Args&&... args) {
  auto& impl = detail::impl_ref(module);
  const AnyTensorDict p = detail::unflatten_if_flat(params);
  if constexpr (sizeof...(Args) == 1 && (std::is_convertible_v<Args, at::Tensor> && ...)) {
    auto kind = nn::detail::module_registry::instance().find(impl);
    if (kind && kind->forward) {
      (void)detail::resolve_targets(impl, p, 0, "tensordict::functional_call");
      return at::Tensor(kind->forward(impl, detail::with_module_tensors(impl, p), args...));
    }
  }
  std::lock_guard<std::recursive_mutex> serialized(::tensordict::detail::swap_call_lock());
  dynamic_module_swap swap(impl, p, swap_mode::as_given, "tensordict::functional_call");
  return impl.forward(std::forward<Args>(args)...);
}

// ---- functional_vmap ------------------------------------------------------------------------

namespace nn {
namespace detail {
// The batched form of a whole run-time model, or std::nullopt when some module has none.
inline std::optional<stacked> dynamic_lowered(torch::nn::Module& m, const AnyTensorDict& params, const stacked& x,
                                              const batch_context& ctx) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&m)) {
    // All children lowered, or none: vmap then runs the whole chain once.
    auto names = seq->named_children();
    std::size_t i = 0;
    stacked value = x;
    for (auto& child : *seq) {
      auto out = dynamic_lowered(*child.ptr(), ::tensordict::detail::child_params(params, names[i++].key()), value, ctx);
      if (!out) return std::nullopt;
      value = std::move(*out);
    }
    return value;
  }
  auto kind = module_registry::instance().find(m);
  if (!kind || !kind->batched) return std::nullopt;
  // The batched forms take every tensor stacked; a module's own unstacked ones go through vmap.
  for (const auto& [name, member] : kind->members(m))
    if (member->defined() && !params.contains(name)) return std::nullopt;
  return kind->batched(m, params, x, ctx);
}

template <class Inputs>
constexpr bool one_tensor() {
  if constexpr (std::tuple_size_v<Inputs> == 1)
    return std::is_convertible_v<std::tuple_element_t<0, Inputs>, at::Tensor>;
  else
    return false;
}
}  // namespace detail

// functional_vmap on a run-time model: params (an AnyTensorDict whose batch
// dims index the sets, e.g. from_modules) as in the typed form; the model's
// forward takes one tensor, given in args (shared by every set) or as the
// kwarg "input" (mapped with in_dim_of<"input">(dim)).
template <tensordict::nn::dynamic_module M, class Args = std::tuple<>, class Kwargs = kwargs_t<>, class InDims = in_dims_t<>>
at::Tensor functional_vmap(M&& module, const AnyTensorDict& params, Args args = {}, Kwargs kwargs = {}, InDims in_dims = {},
                           functional_vmap_options options = {}) {
  torch::nn::Module& m = ::tensordict::detail::dynamic_ref(module);
  torch::nn::AnyModule* any = nullptr;
  if constexpr (std::is_same_v<std::remove_cvref_t<M>, torch::nn::AnyModule>) any = const_cast<torch::nn::AnyModule*>(&module);
  const auto kwarg_dims = detail::kwarg_dims_of<Kwargs>(in_dims);
  auto [inputs, dims] = detail::gather_inputs(args, kwargs, kwarg_dims);
  if constexpr (!detail::one_tensor<decltype(inputs)>()) {
    static_assert(detail::one_tensor<decltype(inputs)>(),
                  "tensordict::nn::functional_vmap on a run-time model passes one input tensor: args(x), or "
                  "kwargs(kw<\"input\">(x)) with in_dims(in_dim_of<\"input\">(0)).");
    return at::Tensor();
  } else {
    const AnyTensorDict p = ::tensordict::detail::unflatten_if_flat(params);
    // Check the keys, shapes and dtypes once, against the module, before any call.
    (void)::tensordict::detail::resolve_targets(m, p, p.batch_dims(), "tensordict::nn::functional_vmap");
    auto call_one = [&](const AnyTensorDict& one, const at::Tensor& x) {
      return ::tensordict::detail::dynamic_call(m, any, one, x);
    };
    auto lowered = [&](const AnyTensorDict& stacked_params, const stacked& x, const batch_context& ctx) {
      return detail::dynamic_lowered(m, stacked_params, x, ctx);
    };
    return detail::run_functional_vmap(p, inputs, dims, std::tuple_size_v<decltype(in_dims.dims)> > 0, options, call_one,
                                       lowered);
  }
}

}  // namespace nn
}  // namespace tensordict
