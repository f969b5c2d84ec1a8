// Functional calls: a module's parameters as a TensorDict, swapped in and out.
//
//   auto params = tensordict::from_module(net);          // the module's own tensors
//   {
//     auto swap = tensordict::to_module(zeros, net);     // net now computes with `zeros`
//     auto y = net->forward(x);
//   }                                                    // originals back, also on throw
//   auto stacked = tensordict::from_modules(a, b, c);    // batch_size [3], new leaves
//   auto y = tensordict::functional_call(net, params, x);
//
// libtorch modules keep their tensors in members (LinearImpl::weight) and in
// a registry (named_parameters, state dict). Swapping assigns both, so the
// forward uses the new tensors, gradients flow to them, and the registry
// shows them; set_data would send gradients to the old leaf and fails on
// functorch's batched tensors.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/stack.h>
#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/functional/conv.h>
#include <torch/nn/functional/embedding.h>
#include <torch/nn/functional/normalization.h>
#include <torch/nn/functional/padding.h>

#include "detail/compat.hpp"
#include "detail/format.hpp"
#include "detail/module_access.hpp"
#include "errors.hpp"
#include "module_schema.hpp"
#include "typed_tensordict.hpp"

namespace tensordict {

namespace detail {

// Where leaf i of a module's schema lives: the member that the forward reads,
// and the module whose registry holds it under `name`.
struct module_slot {
  at::Tensor* member = nullptr;
  torch::nn::Module* owner = nullptr;
  std::string_view name;
};

template <class Impl, class... Members>
void collect_slots(Impl& m, module_slot*& out, nn::member_list<Members...>) {
  auto visit = [&]<class Member>(std::type_identity<Member>) {
    if constexpr (nn::detail::is_tensor_member<Impl, Member>) {
      *out++ = module_slot{&typename Member::getter{}(m), &m, Member::name.view()};
    } else {
      using sub = nn::detail::submodule_t<Impl, Member>;
      if constexpr (nn::schema_of<sub>::leaf_count > 0)
        collect_slots(nn::detail::submodule<Impl, Member>(m), out, typename nn::detail::members_of_impl<sub>::type{});
    }
  };
  (visit(std::type_identity<Members>{}), ...);
}

template <class Impl>
std::array<module_slot, nn::schema_of<Impl>::leaf_count> slots_of(Impl& m) {
  std::array<module_slot, nn::schema_of<Impl>::leaf_count> slots{};
  module_slot* out = slots.data();
  collect_slots(m, out, typename nn::detail::members_of_impl<Impl>::type{});
  return slots;
}

// The registry entry of a slot (a parameter or a buffer), or nullptr.
inline at::Tensor* registry_entry(const module_slot& slot) {
  const std::string name(slot.name);
  if (at::Tensor* p = module_parameters(*slot.owner).find(name)) return p;
  return module_buffers(*slot.owner).find(name);
}

// The module behind a holder (torch::nn::Linear), a shared_ptr, or the module
// itself. Holders are shared handles: a const one still names a mutable module.
template <class M>
nn::impl_of_t<M>& impl_ref(M&& m) {
  if constexpr (requires { m.ptr(); })
    return *m.ptr();
  else if constexpr (requires { m.get(); *m; })
    return *m;
  else
    return const_cast<nn::impl_of_t<M>&>(m);
}

// Every registered tensor of the module must be a leaf of its schema: a
// member forgotten in TENSORDICT_MODULE would otherwise be silently ignored.
template <class Impl>
void check_registry_matches_schema(const Impl& m) {
  using S = nn::schema_of<Impl>;
  std::vector<std::string> known;
  known.reserve(S::leaf_count);
  for (std::size_t i = 0; i < S::leaf_count; ++i) known.push_back(leaf_path<S>(i).join("."));
  std::string unknown;
  auto check = [&](const torch::OrderedDict<std::string, at::Tensor>& registry, const char* kind) {
    for (const auto& item : registry)
      if (std::find(known.begin(), known.end(), item.key()) == known.end())
        unknown += std::string(unknown.empty() ? "" : ", ") + kind + " \"" + item.key() + "\"";
  };
  check(m.named_parameters(true), "parameter");
  check(m.named_buffers(true), "buffer");
  if (!unknown.empty())
    throw key_error("tensordict::from_module: the module registered " + unknown +
                    " that its schema does not know. Name every tensor and sub-module member in TENSORDICT_MODULE.");
}

}  // namespace detail

// The module's parameters and buffers as a TensorDict with batch_size [],
// holding the module's own tensors (same TensorImpl). Unset leaves stand for
// tensors the module does not have (a Linear built with bias(false)).
// (The return type is deduced: clang would form TensorDict<schema_of<...>>
// for a run-time module before its requires clause excludes this overload.)
template <class Module>
  requires(!nn::dynamic_module<Module>)
auto from_module(Module&& module) {
  using Impl = nn::impl_of_t<Module>;
  auto& impl = detail::impl_ref(module);
  detail::check_registry_matches_schema(impl);
  auto slots = detail::slots_of<Impl>(impl);
  std::array<at::Tensor, nn::schema_of<Impl>::leaf_count> leaves;
  for (std::size_t i = 0; i < leaves.size(); ++i) leaves[i] = *slots[i].member;
  return TensorDict<nn::schema_of<Impl>>(std::move(leaves));
}

// ---- to_module -----------------------------------------------------------------

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
    auto slots = detail::slots_of<Impl>(module);
    // Check everything before changing anything.
    for (std::size_t i = 0; i < leaf_count; ++i) {
      const at::Tensor& incoming = params.leaf(i);
      if (!incoming.defined()) continue;
      const at::Tensor& current = *slots[i].member;
      if (!current.defined())
        throw key_error("tensordict::to_module: the module has no tensor at " + to_string(leaf_path<schema_t>(i)) +
                        ", but the TensorDict sets it to " + describe(incoming));
      if (current.sizes() != incoming.sizes() || current.scalar_type() != incoming.scalar_type())
        throw shape_error("tensordict::to_module: the leaf " + to_string(leaf_path<schema_t>(i)) + " is " +
                          describe(incoming) + " but the module's tensor is " + describe(current) +
                          (params.batch_dims() ? " (a TensorDict with batch dims goes through vmap or functional_vmap)" : ""));
    }
    for (std::size_t i = 0; i < leaf_count; ++i) {
      const at::Tensor& incoming = params.leaf(i);
      saved& s = saved_[i];
      if (!incoming.defined()) continue;
      s.member = slots[i].member;
      s.registry = detail::registry_entry(slots[i]);
      if (auto change = detail::adopt_requires_grad(incoming, *s.member, mode)) s.flag = std::move(*change);
      s.old_member = std::exchange(*s.member, incoming);
      if (s.registry) s.old_registry = std::exchange(*s.registry, incoming);
    }
  }

  module_swap(module_swap&& other) noexcept : module_(std::exchange(other.module_, nullptr)), saved_(std::move(other.saved_)) {}
  module_swap& operator=(module_swap&&) = delete;
  module_swap(const module_swap&) = delete;
  module_swap& operator=(const module_swap&) = delete;

  ~module_swap() { restore(); }

  // Puts the originals back now (the destructor then does nothing).
  void restore() noexcept {
    if (!module_) return;
    // In reverse, so a tensor reached twice (a shared sub-module) ends as it began.
    for (std::size_t i = leaf_count; i-- > 0;) {
      saved& s = saved_[i];
      if (!s.member) continue;
      *s.member = std::move(s.old_member);
      if (s.registry) *s.registry = std::move(s.old_registry);
      s.flag.undo();
    }
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
  struct saved {
    at::Tensor* member = nullptr;
    at::Tensor* registry = nullptr;
    at::Tensor old_member;
    at::Tensor old_registry;
    detail::flag_change flag;
  };
  Impl* module_;
  std::array<saved, leaf_count> saved_{};
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
  requires(!nn::dynamic_module<Module>)  // those take an AnyTensorDict (dynamic_modules.hpp)
module_swap<nn::impl_of_t<Module>> to_module(const TensorDict<S>& params, Module&& module,
                                             swap_mode mode = swap_mode::keep_module_flags) {
  using Impl = nn::impl_of_t<Module>;
  return module_swap<Impl>(detail::impl_ref(module), detail::as_module_params<Impl>(params), mode);
}

// Copies the TensorDict's values into the module's own tensors (no swap, no
// gradient tracking): the module keeps its tensors, with new values.
template <class Module, class S>
  requires(!nn::dynamic_module<Module>)
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

// ---- from_modules ----------------------------------------------------------------

namespace compile_error {
template <class First, class Other>
struct from_modules_of_different_types {
  static_assert(always_false<Other>,
                "tensordict::from_modules: every module must have the same type (the first two that differ are "
                "named above in 'from_modules_of_different_types<...>'); their parameters are stacked leaf by leaf.");
};
}  // namespace compile_error

// How from_modules stacks (Python's from_modules(..., expand_identical=...)).
struct from_modules_options {
  // A tensor that every module shares (the same tensor: a shared sub-module)
  // is not copied: the leaf is that tensor expanded along the new dim, so it
  // shares its storage and gradients reach it.
  bool expand_identical = false;
};

namespace detail {
// The leaf for the tensors `parts` of every module, stacked into `stacked`.
inline at::Tensor stacked_leaf(const at::Tensor& stacked, c10::ArrayRef<at::Tensor> parts, from_modules_options options) {
  const bool identical = std::all_of(parts.begin(), parts.end(), [&](const at::Tensor& t) { return t.is_same(parts[0]); });
  if (options.expand_identical && identical) return parts[0].expand(stacked.sizes());
  return stacked.detach().requires_grad_(parts[0].requires_grad());
}
}  // namespace detail

// The modules' parameters stacked along a new leading dim (batch_size [N]).
// The leaves are new tensors: gradients reach them, not the modules' own
// (but see from_modules_options::expand_identical).
template <class Module>
  requires(!nn::dynamic_module<Module>)
auto from_modules(const std::vector<Module>& modules, from_modules_options options = {}) {
  using S = nn::schema_of<nn::impl_of_t<Module>>;
  if (modules.empty()) throw shape_error("tensordict::from_modules: needs at least one module");
  std::vector<TensorDict<S>> each;
  each.reserve(modules.size());
  for (const auto& m : modules) each.push_back(from_module(m));
  TensorDict<S> stacked = [&] {
    at::NoGradGuard no_grad;
    return stack(each);
  }();
  std::array<at::Tensor, S::leaf_count> leaves;
  std::vector<at::Tensor> parts(each.size());
  for (std::size_t i = 0; i < S::leaf_count; ++i) {
    if (!stacked.leaf(i).defined()) continue;
    for (std::size_t k = 0; k < each.size(); ++k) parts[k] = each[k].leaf(i);
    leaves[i] = detail::stacked_leaf(stacked.leaf(i), parts, options);
  }
  return TensorDict<S>(std::move(leaves), stacked.batch_size());
}

template <class First, class... Rest>
  requires(sizeof...(Rest) > 0 && !nn::dynamic_module<First>)
auto from_modules(const First& first, const Rest&... rest) {
  using F = nn::impl_of_t<First>;
  using mismatch = typename detail::first_mismatch<F, nn::impl_of_t<Rest>...>::type;
  if constexpr (!std::is_void_v<mismatch>) {
    compile_error::report<compile_error::from_modules_of_different_types<F, mismatch>>();
    return TensorDict<nn::schema_of<F>>();
  } else {
    return from_modules(std::vector<First>{first, rest...});
  }
}

// ---- functional_call ---------------------------------------------------------------

namespace nn {
// functional<Impl>::forward(module, params, inputs...) computes the module's
// forward with the given parameters without touching the module's tensors,
// so that threads can share one module. Specialize it for your own modules.
template <class Impl>
struct functional;

template <class Impl>
concept has_functional_form = requires { functional<Impl>::is_functional; };

template <>
struct functional<torch::nn::LinearImpl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const torch::nn::LinearImpl&, const TensorDict<schema_of<torch::nn::LinearImpl>>& p,
                            const at::Tensor& x) {
    return at::linear(x, p.leaf(0), p.leaf(1));
  }
};

template <class Impl>
  requires std::is_same_v<Impl, torch::nn::Conv1dImpl> || std::is_same_v<Impl, torch::nn::Conv2dImpl> ||
           std::is_same_v<Impl, torch::nn::Conv3dImpl>
struct functional<Impl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const at::Tensor& x) {
    namespace F = torch::nn::functional;
    const auto& o = m.options;
    auto conv = [&](const at::Tensor& input, const auto& padding) {
      if constexpr (std::is_same_v<Impl, torch::nn::Conv1dImpl>)
        return F::detail::conv1d(input, p.leaf(0), p.leaf(1), o.stride(), padding, o.dilation(), o.groups());
      else if constexpr (std::is_same_v<Impl, torch::nn::Conv2dImpl>)
        return F::detail::conv2d(input, p.leaf(0), p.leaf(1), o.stride(), padding, o.dilation(), o.groups());
      else
        return F::detail::conv3d(input, p.leaf(0), p.leaf(1), o.stride(), padding, o.dilation(), o.groups());
    };
    if (::tensordict::detail::compat::get_if<torch::enumtype::kZeros>(&o.padding_mode())) return conv(x, o.padding());
    F::PadFuncOptions::mode_t mode = torch::kReflect;
    if (::tensordict::detail::compat::get_if<torch::enumtype::kReplicate>(&o.padding_mode())) mode = torch::kReplicate;
    if (::tensordict::detail::compat::get_if<torch::enumtype::kCircular>(&o.padding_mode())) mode = torch::kCircular;
    constexpr std::size_t dims = std::is_same_v<Impl, torch::nn::Conv1dImpl> ? 1 : std::is_same_v<Impl, torch::nn::Conv2dImpl> ? 2 : 3;
    const auto* padding = ::tensordict::detail::compat::get_if<torch::ExpandingArray<dims>>(&o.padding());
    if (!padding)
      throw module_error("tensordict::functional_call: a convolution with padding_mode other than zeros needs explicit "
                         "padding sizes (padding=same or valid is not supported there)");
    std::vector<std::int64_t> pad_sizes;  // F::pad wants the last dim first, each size twice
    for (std::size_t d = dims; d-- > 0;) pad_sizes.insert(pad_sizes.end(), 2, (*padding)->at(d));
    return conv(F::pad(x, F::PadFuncOptions(pad_sizes).mode(mode)), torch::ExpandingArray<dims>(0));
  }
};

template <>
struct functional<torch::nn::ConvTranspose2dImpl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const torch::nn::ConvTranspose2dImpl& m,
                            const TensorDict<schema_of<torch::nn::ConvTranspose2dImpl>>& p, const at::Tensor& x) {
    const auto& o = m.options;
    if (!::tensordict::detail::compat::get_if<torch::enumtype::kZeros>(&o.padding_mode()))
      throw module_error("tensordict::functional_call: ConvTranspose2d supports only zero padding, as libtorch's own");
    return at::conv_transpose2d(x, p.leaf(0), p.leaf(1), o.stride(), ::tensordict::detail::compat::get<torch::ExpandingArray<2>>(o.padding()),
                                o.output_padding(), o.groups(), o.dilation());
  }
};

template <class Impl>
  requires std::is_same_v<Impl, torch::nn::BatchNorm1dImpl> || std::is_same_v<Impl, torch::nn::BatchNorm2dImpl>
struct functional<Impl> {
  static constexpr bool is_functional = true;
  // As BatchNormImplBase::forward: in training with running stats, the
  // TensorDict's buffers are updated in place, as Python's functional_call does.
  static at::Tensor forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const at::Tensor& x) {
    const auto& o = m.options;
    double momentum = o.momentum().value_or(0.0);
    const at::Tensor& tracked = p.leaf(4);
    if (m.is_training() && o.track_running_stats() && tracked.defined()) {
      tracked.add_(1);
      if (!o.momentum()) momentum = 1.0 / tracked.template item<double>();
    }
    return torch::nn::functional::detail::batch_norm(x, p.leaf(2), p.leaf(3), p.leaf(0), p.leaf(1),
                                                     m.is_training() || !o.track_running_stats(), momentum, o.eps());
  }
};

template <>
struct functional<torch::nn::LayerNormImpl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const torch::nn::LayerNormImpl& m, const TensorDict<schema_of<torch::nn::LayerNormImpl>>& p,
                            const at::Tensor& x) {
    return at::layer_norm(x, m.options.normalized_shape(), p.leaf(0), p.leaf(1), m.options.eps());
  }
};

template <>
struct functional<torch::nn::GroupNormImpl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const torch::nn::GroupNormImpl& m, const TensorDict<schema_of<torch::nn::GroupNormImpl>>& p,
                            const at::Tensor& x) {
    return at::group_norm(x, m.options.num_groups(), p.leaf(0), p.leaf(1), m.options.eps());
  }
};

template <>
struct functional<torch::nn::EmbeddingImpl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const torch::nn::EmbeddingImpl& m, const TensorDict<schema_of<torch::nn::EmbeddingImpl>>& p,
                            const at::Tensor& x) {
    const auto& o = m.options;
    return torch::nn::functional::detail::embedding(x, p.leaf(0), o.padding_idx(), o.max_norm(), o.norm_type(),
                                                    o.scale_grad_by_freq(), o.sparse());
  }
};

// Modules without tensors compute the same whatever the parameters.
template <class Impl>
  requires(schema_of<Impl>::leaf_count == 0 && !requires { typename Impl::is_sequential; })
struct functional<Impl> {
  static constexpr bool is_functional = true;
  template <class... Args>
  static auto forward(Impl& m, const TensorDict<schema<>>&, Args&&... args) {
    return m.forward(std::forward<Args>(args)...);
  }
};
}  // namespace nn

template <class Module, class S, class... Args>
  requires(!nn::dynamic_module<Module>)
auto functional_call(Module&& module, const TensorDict<S>& params, Args&&... args);

namespace nn {
namespace detail {
// The params of child I of a typed sequential: its sub-tree, or nothing.
template <std::size_t I, class S>
auto child_params(const TensorDict<S>& p) {
  constexpr auto name = ::tensordict::nn::detail::index_key<I>();
  if constexpr (S::find(name.view()) == npos)
    return TensorDict<schema<>>();
  else
    return p.template get<name>();
}
}  // namespace detail

template <class... Holders>
struct functional<SequentialImpl<Holders...>> {
  static constexpr bool is_functional = true;
  template <class Input>
  static at::Tensor forward(SequentialImpl<Holders...>& m, const TensorDict<schema_of<SequentialImpl<Holders...>>>& p,
                            Input&& input) {
    return chain<0>(m, p, std::forward<Input>(input));
  }

 private:
  template <std::size_t I, class Input>
  static at::Tensor chain(SequentialImpl<Holders...>& m, const TensorDict<schema_of<SequentialImpl<Holders...>>>& p,
                          Input&& input) {
    auto& child = m.template child<I>();
    at::Tensor out = call_child(child, detail::child_params<I>(p), std::forward<Input>(input));
    if constexpr (I + 1 == sizeof...(Holders))
      return out;
    else
      return chain<I + 1>(m, p, std::move(out));
  }

  template <class Child, class CS, class Input>
  static at::Tensor call_child(Child& child, const TensorDict<CS>& params, Input&& input) {
    using ChildImpl = impl_of_t<Child>;
    if constexpr (schema_of<ChildImpl>::leaf_count == 0)
      return child->forward(std::forward<Input>(input));
    else
      return ::tensordict::functional_call(child, params, std::forward<Input>(input));
  }
};
// Whether functional_call swaps tensors into a module of type Impl (true) or
// computes without touching it (false): a module with tensors and no
// functional form, or a typed Sequential with such a child.
template <class Impl>
struct touches_module : std::bool_constant<schema_of<Impl>::leaf_count != 0 && !has_functional_form<Impl>> {};
template <class... Holders>
struct touches_module<SequentialImpl<Holders...>> : std::disjunction<touches_module<impl_of_t<Holders>>...> {};
template <class Impl>
inline constexpr bool touches_module_v = touches_module<Impl>::value;
}  // namespace nn

// Calls the module's forward with `params` in place of its tensors. params
// has the module's schema, or its flatten_keys<".">() form ("0.weight").
// Module types with a functional form (every built-in, user modules that
// specialize nn::functional, and a typed Sequential whose children all have
// one: nn::touches_module_v<Impl> is false) never touch the module, so threads
// may share it. Other modules get the tensors swapped in for the call, under
// one process-wide lock: concurrent functional_calls stay correct but run one
// at a time, and a forward() called directly meanwhile sees the swapped tensors.
// BatchNorm in training writes its running statistics into params' buffers,
// never the module's: threads that share one params TensorDict there share them.
template <class Module, class S, class... Args>
  requires(!nn::dynamic_module<Module>)
auto functional_call(Module&& module, const TensorDict<S>& params, Args&&... args) {
  using Impl = nn::impl_of_t<Module>;
  auto& impl = detail::impl_ref(module);
  decltype(auto) p = detail::as_module_params<Impl>(params);
  if constexpr (nn::has_functional_form<Impl>) {
    return nn::functional<Impl>::forward(impl, p, std::forward<Args>(args)...);
  } else {
    std::lock_guard<std::recursive_mutex> serialized(::tensordict::detail::swap_call_lock());
    auto swap = module_swap<Impl>(impl, p, swap_mode::as_given);
    return impl.forward(std::forward<Args>(args)...);
  }
}

}  // namespace tensordict
