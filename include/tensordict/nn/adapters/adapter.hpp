// What the library knows about one module type, and how to teach it a new
// one. An adapter is up to three specializations side by side, in one header
// per family of module types under modules/:
//   module_traits<Impl>  its tensors and sub-modules by registered name (its
//                        key schema, schema_of<Impl>); TENSORDICT_MODULE
//                        writes it for a user module;
//   functional<Impl>     its forward computed from a TensorDict, without
//                        touching the module (threads may share the module);
//   batched<Impl>        its forward for N stacked parameter sets at once,
//                        lowered to batched libtorch ops (functional_vmap).
// The verbs (from_module.hpp, to_module.hpp, from_modules.hpp,
// functional_call.hpp, nn/functional_vmap.hpp) and the run-time registry
// (nn/module_registry.hpp) read only these.
//
//   using S = tensordict::nn::schema_of<torch::nn::LinearImpl>;   // {weight, bias}
//
// A user module names its members once with TENSORDICT_MODULE (a
// BOOST_HANA_ADAPT_STRUCT), and its schema follows from the members' types:
// at::Tensor members are leaves, module holders are sub-trees, sub-modules
// without tensors are left out (as the reference's filter_empty).
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "../../vmap.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/hana/accessors.hpp>
#include <boost/hana/adapt_struct.hpp>
#include <boost/hana/at.hpp>
#include <boost/hana/concept/struct.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/second.hpp>

#include <c10/core/GradMode.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "../../keys.hpp"
#include "../../schema.hpp"
#include "../../typed_tensordict.hpp"

// Names the members of a user module once:
//   struct NetImpl : torch::nn::Module { torch::nn::Linear fc{nullptr}; at::Tensor scale; ... };
//   TENSORDICT_MODULE(NetImpl, fc, scale);
// Each name must be the one the module registered. Use it at global scope.
#define TENSORDICT_MODULE(Type, ...) BOOST_HANA_ADAPT_STRUCT(Type, __VA_ARGS__)

namespace torch::nn {
class SequentialImpl;
class Sequential;
class ModuleListImpl;
class ModuleList;
class ModuleDictImpl;
class ModuleDict;
class AnyModule;
}  // namespace torch::nn

namespace tensordict::nn {

// One member of a module type: its key and a stateless getter that returns
// a reference to the member (an at::Tensor, a module holder or a shared_ptr).
template <key Name, class Getter>
struct member {
  static constexpr auto name = Name;
  using getter = Getter;
};

template <auto Pointer>
struct member_pointer {
  template <class Impl>
  decltype(auto) operator()(Impl& m) const {
    return (m.*Pointer);
  }
};

template <class... Members>
struct member_list {};

// module_traits<Impl>::members lists Impl's tensors and sub-modules in
// registration order. Specialize it, or use TENSORDICT_MODULE.
template <class Impl>
struct module_traits;

template <class Impl>
  requires boost::hana::Struct<Impl>::value
struct module_traits<Impl> {
  using accessors = decltype(boost::hana::accessors<Impl>());
  template <std::size_t I>
  using pair_at = std::remove_cvref_t<decltype(boost::hana::at_c<I>(std::declval<accessors>()))>;
  template <std::size_t... I>
  static auto make(std::index_sequence<I...>)
      -> member_list<member<from_hana_string(std::remove_cvref_t<decltype(boost::hana::first(std::declval<pair_at<I>>()))>{}),
                            std::remove_cvref_t<decltype(boost::hana::second(std::declval<pair_at<I>>()))>>...>;
  using members = decltype(make(std::make_index_sequence<decltype(boost::hana::length(std::declval<accessors>()))::value>{}));
};

template <class Impl>
concept described_module = requires { typename module_traits<Impl>::members; };

namespace detail {

// What a member is: a tensor, or a sub-module (through a holder or a shared_ptr).
template <class T>
struct submodule_of {
  using type = void;
};
template <class Contained>
struct submodule_of<torch::nn::ModuleHolder<Contained>> {
  using type = Contained;
};
template <class T>
  requires std::is_base_of_v<torch::nn::Module, T>
struct submodule_of<std::shared_ptr<T>> {
  using type = T;
};
template <class T>
  requires requires { typename T::ContainedType; } && std::is_base_of_v<torch::nn::ModuleHolder<typename T::ContainedType>, T>
struct submodule_of<T> {
  using type = typename T::ContainedType;
};

template <class Impl, class Member>
using member_type = std::remove_cvref_t<decltype(typename Member::getter{}(std::declval<Impl&>()))>;

template <class Impl, class Member>
inline constexpr bool is_tensor_member = std::is_same_v<member_type<Impl, Member>, at::Tensor>;

template <class Impl, class Member>
using submodule_t = typename submodule_of<member_type<Impl, Member>>::type;

template <class Impl, class Member>
decltype(auto) submodule(Impl& m) {
  auto& held = typename Member::getter{}(m);
  if constexpr (requires { held.ptr(); })
    return *held.ptr();  // ModuleHolder
  else
    return *held;  // shared_ptr
}

template <class T>
struct members_of_impl {
  static_assert(described_module<T>,
                "tensordict::nn: this module type has no schema. Name its members once with "
                "TENSORDICT_MODULE(Type, member, ...) at global scope, or specialize "
                "tensordict::nn::module_traits<Type>; for a torch::nn type, include its family's adapter "
                "(tensordict/modules/<family>.hpp, or tensordict/nn/adapters/builtin.hpp for all).");
  using type = member_list<>;
};
template <described_module T>
struct members_of_impl<T> {
  using type = typename module_traits<T>::members;
};

template <class Impl, class Member>
struct field_of;

template <class... Fields>
struct schema_from_tuple;
template <class... Fields>
struct schema_from_tuple<std::tuple<Fields...>> {
  using type = schema<Fields...>;
};

template <class Impl, class Members>
struct schema_of_impl;
template <class Impl, class... Members>
struct schema_of_impl<Impl, member_list<Members...>> {
  using type = typename schema_from_tuple<decltype(std::tuple_cat(std::declval<typename field_of<Impl, Members>::type>()...))>::type;
};

}  // namespace detail

// The module type behind a holder (torch::nn::Linear -> LinearImpl) or a
// std::shared_ptr; a module type itself otherwise.
template <class M>
struct impl_of {
  using type = M;
};
template <class M>
  requires requires { typename M::ContainedType; }
struct impl_of<M> {
  using type = typename M::ContainedType;
};
template <class T>
struct impl_of<std::shared_ptr<T>> {
  using type = T;
};
template <class M>
using impl_of_t = typename impl_of<std::remove_cvref_t<M>>::type;

// The schema of a module type (or of the one a holder holds).
template <class Module>
using schema_of =
    typename detail::schema_of_impl<impl_of_t<Module>, typename detail::members_of_impl<impl_of_t<Module>>::type>::type;

namespace detail {
template <class Impl, class Member>
struct field_of {
  static auto pick() {
    if constexpr (is_tensor_member<Impl, Member>) {
      return std::type_identity<std::tuple<field<Member::name, tensor_leaf>>>{};
    } else {
      using sub = submodule_t<Impl, Member>;
      static_assert(!std::is_void_v<sub>,
                    "tensordict::nn: a module member named in TENSORDICT_MODULE is neither an at::Tensor nor a "
                    "module (a ModuleHolder such as torch::nn::Linear, or a std::shared_ptr to a module).");
      if constexpr (std::is_void_v<sub>)
        return std::type_identity<std::tuple<>>{};
      else if constexpr (schema_of<sub>::leaf_count == 0)
        return std::type_identity<std::tuple<>>{};  // no tensors: left out, as filter_empty
      else
        return std::type_identity<std::tuple<field<Member::name, schema_of<sub>>>>{};
    }
  }
  using type = typename decltype(pick())::type;
};
}  // namespace detail

namespace detail {
template <class... Impl>
struct type_list {};

template <class T, class List>
inline constexpr bool in_list_v = false;
template <class T, class... Ts>
inline constexpr bool in_list_v<T, type_list<Ts...>> = (std::is_same_v<T, Ts> || ...);

// A module that a ReLU before it in a Sequential may run after: the max poolings, whose adapters
// (pooling.hpp) say so. Sequential asks this, not the pooling family, so that it does not include
// every pooling module's header for programs without one.
template <class Impl>
inline constexpr bool relu_commutes_v = false;

template <class... Lists>
struct concat_lists;
template <>
struct concat_lists<> {
  using type = type_list<>;
};
template <class... A>
struct concat_lists<type_list<A...>> {
  using type = type_list<A...>;
};
template <class... A, class... B, class... Rest>
struct concat_lists<type_list<A...>, type_list<B...>, Rest...> {
  using type = typename concat_lists<type_list<A..., B...>, Rest...>::type;
};
}  // namespace detail

// Names a module type's members with getters (the built-in adapters use it;
// TENSORDICT_MODULE does the same for a type whose members are its public
// fields, through Hana). In namespace tensordict::nn:
//   TENSORDICT_MODULE_MEMBERS(MyImpl, TENSORDICT_MEMBER(MyImpl, weight), member<"scale", MyScaleGetter>)
//   TENSORDICT_MODULE_MEMBERS(MyPoolImpl)   // a type without tensors: an empty schema
#define TENSORDICT_MODULE_MEMBERS(Impl, ...) \
  template <>                                \
  struct module_traits<Impl> {               \
    using members = member_list<__VA_ARGS__>; \
  };
#define TENSORDICT_MEMBER(Impl, name) member<#name, member_pointer<&Impl::name>>

#define TENSORDICT_MODULE_WEIGHT_BIAS(Impl) \
  TENSORDICT_MODULE_MEMBERS(Impl, TENSORDICT_MEMBER(Impl, weight), TENSORDICT_MEMBER(Impl, bias))

// The module type behind a holder, a shared_ptr or a module itself.
// The types whose structure is only known at run time: their functional
// calls take an AnyTensorDict, not a typed one.
template <class M>
inline constexpr bool is_dynamic_module_v =
    std::is_same_v<M, torch::nn::Module> || std::is_same_v<M, torch::nn::SequentialImpl> ||
    std::is_same_v<M, torch::nn::Sequential> || std::is_same_v<M, torch::nn::ModuleListImpl> ||
    std::is_same_v<M, torch::nn::ModuleList> || std::is_same_v<M, torch::nn::ModuleDictImpl> ||
    std::is_same_v<M, torch::nn::ModuleDict> || std::is_same_v<M, torch::nn::AnyModule>;
template <class T>
inline constexpr bool is_dynamic_module_v<std::shared_ptr<T>> = is_dynamic_module_v<T>;

template <class M>
concept dynamic_module = is_dynamic_module_v<std::remove_cvref_t<M>>;

// ---- module types whose tensors depend on their options ------------------------

// runtime_layout<Impl>::members(module) lists the tensors that the forward of
// a module of type Impl reads, by registered name, for a type whose names
// depend on its options (an LSTM's layers and directions): no compile-time
// schema, so its calls take an AnyTensorDict. Specialize it (with
// `static constexpr bool is_runtime_layout = true;`) beside a functional form
// whose params are an AnyTensorDict.
template <class Impl>
struct runtime_layout;

template <class M>
concept runtime_layout_module = requires { runtime_layout<impl_of_t<M>>::is_runtime_layout; };

// ---- functional forms -------------------------------------------------------

// functional<Impl>::forward(module, params, inputs...) computes the module's
// forward with the given parameters without touching the module's tensors,
// so that threads can share one module. Specialize it for your own modules.
template <class Impl>
struct functional;

template <class Impl>
concept has_functional_form = requires { functional<Impl>::is_functional; };

// Modules without tensors compute the same whatever the parameters.
template <class Impl>
  requires(schema_of<Impl>::leaf_count == 0 && !requires { typename Impl::is_sequential; })
struct functional<Impl> {
  static constexpr bool is_functional = true;
  template <class... Args>
    requires requires(Impl& m, Args&&... args) { m.forward(std::forward<Args>(args)...); }
  static auto forward(Impl& m, const TensorDict<schema<>>&, Args&&... args) {
    return m.forward(std::forward<Args>(args)...);
  }
};

// ---- initialisation -----------------------------------------------------------

// initializer<Impl>::reset(module) draws a module's initial values into the
// tensors it holds, for a type whose reset_parameters() does not (PReLU's
// reset() registers new tensors). Specialize it in the type's adapter.
template <class Impl>
struct initializer;

namespace detail {
// Draws a module's initial values into its own tensors (in place): its
// adapter's initializer, else its reset_parameters() (which covers its
// children), else each sub-module's. Tensors of a module type with neither
// are left as they are.
template <class Impl>
void reset_module(Impl& m) {
  if constexpr (requires { initializer<Impl>::reset(m); }) {
    initializer<Impl>::reset(m);
  } else if constexpr (requires { m.reset_parameters(); }) {
    m.reset_parameters();
  } else if constexpr (described_module<Impl>) {
    [&]<class... Members>(member_list<Members...>) {
      [[maybe_unused]] auto visit = [&]<class Member>(std::type_identity<Member>) {
        if constexpr (!is_tensor_member<Impl, Member>) reset_module(submodule<Impl, Member>(m));
      };
      (visit(std::type_identity<Members>{}), ...);
    }(typename members_of_impl<Impl>::type{});
  }
}
}  // namespace detail

// ---- batched forms ----------------------------------------------------------

// A value flowing through a lowered module: when `mapped`, dim 0 indexes the
// sets; otherwise every set sees the same value.
struct stacked {
  at::Tensor value;
  bool mapped = false;
  // value is a tensor this call made and nothing else refers to (a batched
  // Linear's output): the next batched form may overwrite it where autograd
  // does not record (an in-place ReLU saves a pass over a tensor that may not fit the cache).
  bool own = false;
};

// Whether a batched form may overwrite x.value: x owns it and autograd does not record.
inline bool may_overwrite(const stacked& x) {
  return x.own && !(at::GradMode::is_enabled() && x.value.requires_grad());
}

struct batch_context {
  std::int64_t sets = 0;
  tensordict::randomness randomness = tensordict::randomness::error;
};

// batched<Impl>::forward(module, params with a leading sets dim, input, context).
template <class Impl>
struct batched;

template <class Impl>
concept has_batched_form = requires { batched<Impl>::is_batched; };

// A batched form of one stacked value (a layer in a chain): forward(module,
// params, stacked, context) -> stacked. A type whose forward takes several
// inputs (a decoder layer: target and memory) has instead forward(module,
// params, inputs tuple, which inputs are mapped, context) -> its outputs.
template <class Impl>
concept has_stacked_form =
    has_batched_form<Impl> && !runtime_layout_module<Impl> &&
    requires(Impl& m, const TensorDict<schema_of<Impl>>& p, const stacked& x, const batch_context& ctx) {
      { batched<Impl>::forward(m, p, x, ctx) } -> std::convertible_to<stacked>;
    };

// ---- helpers for batched forms ------------------------------------------------

// A value with its sets in front: a shared one expanded (a view, no copy).
inline at::Tensor expand_sets(const stacked& x, std::int64_t sets) {
  if (x.mapped) return x.value;
  std::vector<std::int64_t> sizes{sets};
  sizes.insert(sizes.end(), x.value.sizes().begin(), x.value.sizes().end());
  return x.value.unsqueeze(0).expand(sizes);
}

// Shapes a [sets, k] parameter so it broadcasts against a [sets, ..., k] value of `dims` dims.
inline at::Tensor per_set(const at::Tensor& p, std::int64_t value_dims, std::int64_t trailing) {
  std::vector<std::int64_t> shape{p.size(0)};
  for (std::int64_t d = 1; d < value_dims - trailing; ++d) shape.push_back(1);
  shape.insert(shape.end(), p.sizes().begin() + 1, p.sizes().end());
  return p.view(shape);
}

// Modules that take dims (Softmax(dim=1), Flatten(1, -1)): on a mapped value
// a dim counted from the front moves past the sets dim.
inline std::int64_t past_sets(std::int64_t dim, bool mapped) { return mapped && dim >= 0 ? dim + 1 : dim; }

// Runs `f`, a function whose input's dim 0 indexes independent slices (a
// batch of samples, or an unbatched sample's channels: pooling, padding,
// Upsample, Fold), over every set at once: a mapped value's sets fold into
// its dim 0 ([sets, d0, ...] -> [sets * d0, ...]) and unfold from the
// result's. A shared value stays shared (f runs once).
template <class F>
stacked fold_sets(const stacked& x, F&& f) {
  if (!x.mapped) return {f(x.value), false};
  if (x.value.dim() < 2) return {f(x.value), true};  // one number per set: nothing to fold
  const std::int64_t sets = x.value.size(0);
  const at::Tensor y = f(x.value.flatten(0, 1));
  return {y.unflatten(0, {sets, y.size(0) / sets}), true};
}

// As fold_sets, for `f` that computes each channel of a batched [N, C, ...]
// input on its own (pooling, padding, Upsample) and an input of
// `batched_dims` dims per set when batched (-1: every input is batched):
// where a mapped value lies in memory as [N, sets * C, ...] (a batched
// convolution's output), its sets fold into the channels instead, so that
// neither way needs a copy.
template <class F>
stacked fold_sets_channel_wise(const stacked& x, std::int64_t batched_dims, F&& f) {
  const at::Tensor& v = x.value;
  const bool batched = batched_dims < 0 ? v.dim() >= 4 : v.dim() - 1 == batched_dims;
  // Which dims the sets dim's stride merges with without a copy: the batch's, or the channels'.
  const bool sets_by_channels = v.dim() >= 3 && v.stride(0) == v.size(2) * v.stride(2);
  const bool sets_by_batch = v.dim() >= 2 && v.stride(0) == v.size(1) * v.stride(1);
  if (!x.mapped || !batched || sets_by_batch || !sets_by_channels) return fold_sets(x, f);
  const std::int64_t sets = v.size(0);
  const at::Tensor y = f(v.transpose(0, 1).flatten(1, 2));  // [N, sets * C, ...], a view
  return {y.unflatten(1, {sets, y.size(1) / sets}).transpose(0, 1), true};
}

// Batched forms for a module type without tensors; specialize batched<Impl>
// as one of them:
//   template <> struct tensordict::nn::batched<MyPoolImpl> : tensordict::nn::sample_wise_batched<MyPoolImpl> {};
// element-wise (an activation): its forward on the value as it is, sets and all.
template <class Impl>
struct elementwise_batched {
  static constexpr bool is_batched = true;
  static stacked forward(Impl& m, const TensorDict<schema<>>&, const stacked& x, const batch_context&) {
    return {m.forward(x.value), x.mapped};
  }
};
// Sample-wise, its input's dim 0 independent slices: its forward through fold_sets.
template <class Impl>
struct sample_wise_batched {
  static constexpr bool is_batched = true;
  static stacked forward(Impl& m, const TensorDict<schema<>>&, const stacked& x, const batch_context&) {
    return fold_sets(x, [&](const at::Tensor& v) { return m.forward(v); });
  }
};

// Channel-wise (pooling, padding): its forward through fold_sets_channel_wise;
// BatchedDims: the dims of its batched input ([N, C, H, W]: 4), -1 when every input is batched.
template <class Impl, std::int64_t BatchedDims>
struct channel_wise_batched {
  static constexpr bool is_batched = true;
  static stacked forward(Impl& m, const TensorDict<schema<>>&, const stacked& x, const batch_context&) {
    return fold_sets_channel_wise(x, BatchedDims, [&](const at::Tensor& v) { return m.forward(v); });
  }
};

namespace detail {
using ::tensordict::nn::expand_sets;
using ::tensordict::nn::past_sets;
using ::tensordict::nn::per_set;
}  // namespace detail

}  // namespace tensordict::nn
