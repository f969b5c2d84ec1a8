// Module types as schemas: the compiler derives a module's parameter tree
// from its type.
//
//   using S = tensordict::nn::schema_of<torch::nn::LinearImpl>;   // {weight, bias}
//   tensordict::nn::Sequential<torch::nn::Linear, torch::nn::ReLU, torch::nn::Linear> net(...);
//   // schema_of<decltype(net)::Impl> is {0: {weight, bias}, 2: {weight, bias}}
//
// Built-in libtorch modules are described here; a user module names its
// members once with TENSORDICT_MODULE (a BOOST_HANA_ADAPT_STRUCT), and its
// schema follows from the members' types: at::Tensor members are leaves,
// module holders are sub-trees, sub-modules without tensors are left out (as
// the reference's filter_empty).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <boost/hana/accessors.hpp>
#include <boost/hana/adapt_struct.hpp>
#include <boost/hana/at.hpp>
#include <boost/hana/concept/struct.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/second.hpp>

#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "keys.hpp"
#include "schema.hpp"

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
                "tensordict::nn::module_traits<Type>.");
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

// The schema of a module type.
template <class Impl>
using schema_of = typename detail::schema_of_impl<Impl, typename detail::members_of_impl<Impl>::type>::type;

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

// ---- built-in libtorch modules ------------------------------------------------

#define TENSORDICT_DETAIL_TENSORS(Impl, ...) \
  template <>                                \
  struct module_traits<Impl> {               \
    using members = member_list<__VA_ARGS__>; \
  };
#define TENSORDICT_DETAIL_TENSOR(Impl, name) member<#name, member_pointer<&Impl::name>>

#define TENSORDICT_DETAIL_WEIGHT_BIAS(Impl) \
  TENSORDICT_DETAIL_TENSORS(Impl, TENSORDICT_DETAIL_TENSOR(Impl, weight), TENSORDICT_DETAIL_TENSOR(Impl, bias))
TENSORDICT_DETAIL_WEIGHT_BIAS(torch::nn::LinearImpl)
TENSORDICT_DETAIL_WEIGHT_BIAS(torch::nn::Conv1dImpl)
TENSORDICT_DETAIL_WEIGHT_BIAS(torch::nn::Conv2dImpl)
TENSORDICT_DETAIL_WEIGHT_BIAS(torch::nn::Conv3dImpl)
TENSORDICT_DETAIL_WEIGHT_BIAS(torch::nn::ConvTranspose2dImpl)
TENSORDICT_DETAIL_WEIGHT_BIAS(torch::nn::LayerNormImpl)
TENSORDICT_DETAIL_WEIGHT_BIAS(torch::nn::GroupNormImpl)
#undef TENSORDICT_DETAIL_WEIGHT_BIAS

#define TENSORDICT_DETAIL_BATCHNORM(Impl)                                                                            \
  TENSORDICT_DETAIL_TENSORS(Impl, TENSORDICT_DETAIL_TENSOR(Impl, weight), TENSORDICT_DETAIL_TENSOR(Impl, bias),       \
                            TENSORDICT_DETAIL_TENSOR(Impl, running_mean), TENSORDICT_DETAIL_TENSOR(Impl, running_var), \
                            TENSORDICT_DETAIL_TENSOR(Impl, num_batches_tracked))
TENSORDICT_DETAIL_BATCHNORM(torch::nn::BatchNorm1dImpl)
TENSORDICT_DETAIL_BATCHNORM(torch::nn::BatchNorm2dImpl)
#undef TENSORDICT_DETAIL_BATCHNORM

TENSORDICT_DETAIL_TENSORS(torch::nn::EmbeddingImpl, TENSORDICT_DETAIL_TENSOR(torch::nn::EmbeddingImpl, weight))

// Modules without tensors: an empty schema.
#define TENSORDICT_DETAIL_NO_TENSORS(Impl) TENSORDICT_DETAIL_TENSORS(Impl)
TENSORDICT_DETAIL_NO_TENSORS(torch::nn::ReLUImpl)
TENSORDICT_DETAIL_NO_TENSORS(torch::nn::ReLU6Impl)
TENSORDICT_DETAIL_NO_TENSORS(torch::nn::LeakyReLUImpl)
TENSORDICT_DETAIL_NO_TENSORS(torch::nn::ELUImpl)
TENSORDICT_DETAIL_NO_TENSORS(torch::nn::SELUImpl)
TENSORDICT_DETAIL_NO_TENSORS(torch::nn::GELUImpl)
TENSORDICT_DETAIL_NO_TENSORS(torch::nn::SiLUImpl)
TENSORDICT_DETAIL_NO_TENSORS(torch::nn::MishImpl)
TENSORDICT_DETAIL_NO_TENSORS(torch::nn::SigmoidImpl)
TENSORDICT_DETAIL_NO_TENSORS(torch::nn::TanhImpl)
TENSORDICT_DETAIL_NO_TENSORS(torch::nn::SoftplusImpl)
TENSORDICT_DETAIL_NO_TENSORS(torch::nn::SoftmaxImpl)
TENSORDICT_DETAIL_NO_TENSORS(torch::nn::LogSoftmaxImpl)
TENSORDICT_DETAIL_NO_TENSORS(torch::nn::DropoutImpl)
TENSORDICT_DETAIL_NO_TENSORS(torch::nn::FlattenImpl)
TENSORDICT_DETAIL_NO_TENSORS(torch::nn::IdentityImpl)
#undef TENSORDICT_DETAIL_NO_TENSORS

namespace detail {
template <class... Impl>
struct type_list {};
// Every built-in module type described above: the run-time registry of
// dynamic_modules.hpp knows these. A type added above goes here too.
using builtin_modules = type_list<
    torch::nn::LinearImpl, torch::nn::Conv1dImpl, torch::nn::Conv2dImpl, torch::nn::Conv3dImpl,
    torch::nn::ConvTranspose2dImpl, torch::nn::LayerNormImpl, torch::nn::GroupNormImpl, torch::nn::BatchNorm1dImpl,
    torch::nn::BatchNorm2dImpl, torch::nn::EmbeddingImpl, torch::nn::ReLUImpl, torch::nn::ReLU6Impl,
    torch::nn::LeakyReLUImpl, torch::nn::ELUImpl, torch::nn::SELUImpl, torch::nn::GELUImpl, torch::nn::SiLUImpl,
    torch::nn::MishImpl, torch::nn::SigmoidImpl, torch::nn::TanhImpl, torch::nn::SoftplusImpl, torch::nn::SoftmaxImpl,
    torch::nn::LogSoftmaxImpl, torch::nn::DropoutImpl, torch::nn::FlattenImpl, torch::nn::IdentityImpl>;
}  // namespace detail

// ---- a typed sequential container ------------------------------------------

// A torch::nn::Module whose children are typed: registered as "0", "1", ...
// (the names of Python's nn.Sequential), forward chains them.
template <class... Holders>
class SequentialImpl : public torch::nn::Module {
  static_assert(sizeof...(Holders) > 0, "tensordict::nn::Sequential needs at least one module.");

 public:
  using is_sequential = void;

  explicit SequentialImpl(Holders... children) : children_(std::move(children)...) {
    register_children(std::index_sequence_for<Holders...>{});
  }

  template <class Input>
  at::Tensor forward(Input&& input) {
    return chain<0>(std::forward<Input>(input));
  }

  template <std::size_t I>
  auto& child() {
    return std::get<I>(children_);
  }
  template <std::size_t I>
  const auto& child() const {
    return std::get<I>(children_);
  }

  static constexpr std::size_t size() { return sizeof...(Holders); }

 private:
  template <std::size_t... I>
  void register_children(std::index_sequence<I...>) {
    ((std::get<I>(children_) = register_module(std::to_string(I), std::get<I>(children_))), ...);
  }

  template <std::size_t I, class Input>
  at::Tensor chain(Input&& input) {
    if constexpr (I + 1 == sizeof...(Holders))
      return std::get<I>(children_)->forward(std::forward<Input>(input));
    else
      return chain<I + 1>(std::get<I>(children_)->forward(std::forward<Input>(input)));
  }

  std::tuple<Holders...> children_;
};

template <class... Holders>
class Sequential : public torch::nn::ModuleHolder<SequentialImpl<Holders...>> {
 public:
  using torch::nn::ModuleHolder<SequentialImpl<Holders...>>::ModuleHolder;
  using Impl = SequentialImpl<Holders...>;
};

namespace detail {
// "0", "1", ... "99" as compile-time keys.
template <std::size_t I>
constexpr auto index_key() {
  if constexpr (I < 10) {
    key<1> k{};
    k.chars[0] = static_cast<char>('0' + I);
    return k;
  } else {
    static_assert(I < 100, "tensordict::nn::Sequential holds at most 100 modules.");
    key<2> k{};
    k.chars[0] = static_cast<char>('0' + I / 10);
    k.chars[1] = static_cast<char>('0' + I % 10);
    return k;
  }
}

template <std::size_t I>
struct child_getter {
  template <class Impl>
  auto& operator()(Impl& m) const {
    return m.template child<I>();
  }
};

template <class Indices, class... Holders>
struct sequential_members;
template <std::size_t... I, class... Holders>
struct sequential_members<std::index_sequence<I...>, Holders...> {
  using type = member_list<member<index_key<I>(), child_getter<I>>...>;
};
}  // namespace detail

template <class... Holders>
struct module_traits<SequentialImpl<Holders...>> {
  using members = typename detail::sequential_members<std::index_sequence_for<Holders...>, Holders...>::type;
};

// The module type behind a holder, a shared_ptr or a module itself.
// The types whose structure is only known at run time: their functional
// calls take an AnyTensorDict (dynamic_modules.hpp), not a typed one.
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

}  // namespace tensordict::nn
