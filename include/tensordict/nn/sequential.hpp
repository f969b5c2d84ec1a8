// The adapter of tensordict::nn::Sequential, a torch::nn::Module whose
// children are typed (dlib's networks as types): its schema is its children's
// under "0", "1", ...; its functional and batched forms chain the children's.
//
//   tensordict::nn::Sequential<torch::nn::Linear, torch::nn::ReLU, torch::nn::Linear> net(...);
//   // schema_of<decltype(net)::Impl> is {0: {weight, bias}, 2: {weight, bias}}
#pragma once

#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../detail/module_access.hpp"
#include "adapters/adapter.hpp"
#include "adapters/linear.hpp"  // its children's Linears and ReLUs run as one detail::linear_run
#include "adapters/parameter_free.hpp"  // its ReLUs join a run of Linears

#include <torch/nn/modules/activation.h>

namespace tensordict::nn {

// ---- a typed sequential container ------------------------------------------

namespace detail {
// A child of a Sequential of Linears and ReLUs, added to the tensors and ReLU marks of a linear_chain
// (a ReLU that does not follow a Linear makes the marks uneven: linear_chain refuses them); a
// Linear's tensors are its own or the functional call's.
inline void add_to_chain(std::vector<at::Tensor>& tensors, std::vector<std::int64_t>& relu, const at::Tensor& weight,
                         const at::Tensor& bias) {
  tensors.push_back(weight);
  tensors.push_back(bias);
  relu.push_back(0);
}
inline void add_to_chain(std::vector<at::Tensor>& tensors, std::vector<std::int64_t>& relu, const torch::nn::LinearImpl& linear) {
  add_to_chain(tensors, relu, linear.weight, linear.bias);
}
inline void add_to_chain(std::vector<at::Tensor>& tensors, std::vector<std::int64_t>& relu, const torch::nn::ReLUImpl&) {
  if (relu.empty() || relu.back() != 0)
    tensors.emplace_back();
  else
    relu.back() = 1;
}
}  // namespace detail

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
    if constexpr (std::is_convertible_v<Input&&, const at::Tensor&> && linear_runs_only_v<SequentialImpl>) {
      // Linears and ReLUs only: one autograd node on the library's kernels where they take the tensors.
      std::vector<at::Tensor> tensors;
      std::vector<std::int64_t> relu;
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (detail::add_to_chain(tensors, relu, *std::get<I>(children_)), ...);
      }(std::index_sequence_for<Holders...>{});
      if (at::Tensor y = detail::linear_chain(input, tensors, relu); y.defined()) return y;
    }
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
    (::tensordict::detail::register_child(*this, std::to_string(I), std::get<I>(children_).ptr()), ...);
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

}  // namespace tensordict::nn

namespace tensordict {

// Defined in functional_call.hpp and nn/functional_vmap.hpp: the chain calls
// them for its children.
template <class Module, class S, class... Args>
  requires(!nn::dynamic_module<Module>)
auto functional_call(Module&& module, const TensorDict<S>& params, Args&&... args);
namespace nn {
template <class Impl, class S>
stacked call_stacked(Impl& m, const TensorDict<S>& p, const stacked& x, const batch_context& ctx);
}  // namespace nn

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
    if constexpr (std::is_convertible_v<Input&&, const at::Tensor&> && linear_runs_only_v<SequentialImpl<Holders...>>) {
      // Linears and ReLUs only: one autograd node on the library's kernels, with the given parameters.
      std::vector<at::Tensor> tensors;
      std::vector<std::int64_t> relu;
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (add_child<I>(m, p, tensors, relu), ...);
      }(std::index_sequence_for<Holders...>{});
      if (at::Tensor y = detail::linear_chain(input, tensors, relu); y.defined()) return y;
    }
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

  template <std::size_t I>
  static void add_child(SequentialImpl<Holders...>& m, const TensorDict<schema_of<SequentialImpl<Holders...>>>& p,
                        std::vector<at::Tensor>& tensors, std::vector<std::int64_t>& relu) {
    if constexpr (std::is_same_v<impl_of_t<std::remove_cvref_t<decltype(m.template child<I>())>>, torch::nn::LinearImpl>) {
      const auto params = detail::child_params<I>(p);
      detail::add_to_chain(tensors, relu, params.leaf(0), params.leaf(1));
    } else {
      detail::add_to_chain(tensors, relu, *m.template child<I>());
    }
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

// A typed Sequential of Linears and ReLUs that starts with a Linear is linear_runs alone (linear.hpp).
template <class First, class... Rest>
inline constexpr bool linear_runs_only_v<SequentialImpl<First, Rest...>> =
    std::is_same_v<impl_of_t<First>, torch::nn::LinearImpl> &&
    ((std::is_same_v<impl_of_t<Rest>, torch::nn::LinearImpl> || std::is_same_v<impl_of_t<Rest>, torch::nn::ReLUImpl>) && ...);
}  // namespace nn

namespace nn {
template <class... Holders>
struct batched<SequentialImpl<Holders...>> {
  static constexpr bool is_batched = true;
  static stacked forward(SequentialImpl<Holders...>& m, const TensorDict<schema_of<SequentialImpl<Holders...>>>& p,
                         const stacked& x, const batch_context& ctx) {
    return chain<0>(m, p, x, ctx);
  }

 private:
  using params_type = TensorDict<schema_of<SequentialImpl<Holders...>>>;
  template <std::size_t I>
  using child_impl = impl_of_t<std::remove_cvref_t<decltype(std::declval<SequentialImpl<Holders...>&>().template child<I>())>>;

  template <std::size_t I>
  static stacked chain(SequentialImpl<Holders...>& m, const params_type& p, const stacked& x, const batch_context& ctx) {
    auto& child = *m.template child<I>();
    if constexpr (std::is_same_v<child_impl<I>, torch::nn::LinearImpl>) {
      // A Linear starts a run that the Linears and ReLUs after it may join.
      detail::linear_run run(x, ctx.sets);
      const auto params = detail::child_params<I>(p);
      if (run.add(params.leaf(0), params.leaf(1))) return gather<I + 1>(m, p, run, ctx);
    }
    if constexpr (I + 1 < sizeof...(Holders) && std::is_same_v<child_impl<I>, torch::nn::ReLUImpl>) {
      if constexpr (detail::relu_commutes_v<child_impl<I + 1>>) {
        // A ReLU before a max pooling runs after it, on a quarter of the values (MaxPool2d(2)), it and its backward:
        // each window's max of the ReLU's output is the ReLU of its max, and the gradient goes to the same input
        // (to none where the max is not positive). Only a zero's sign may differ: the ReLU of [-1, -0.0]'s max is
        // -0.0, the max of its ReLU +0.0.
        const stacked pooled = call_stacked(*m.template child<I + 1>(), detail::child_params<I + 1>(p), x, ctx);
        const stacked out = call_stacked(child, detail::child_params<I>(p), pooled, ctx);
        if constexpr (I + 2 == sizeof...(Holders))
          return out;
        else
          return chain<I + 2>(m, p, out, ctx);
      }
    }
    stacked out = call_stacked(child, detail::child_params<I>(p), x, ctx);
    if constexpr (I + 1 == sizeof...(Holders))
      return out;
    else
      return chain<I + 1>(m, p, out, ctx);
  }

  // From child I on, with a run of Linears and ReLUs pending: the child joins it, or the run runs first.
  template <std::size_t I>
  static stacked gather(SequentialImpl<Holders...>& m, const params_type& p, detail::linear_run& run, const batch_context& ctx) {
    if constexpr (I == sizeof...(Holders)) {
      return run.run();
    } else {
      if constexpr (std::is_same_v<child_impl<I>, torch::nn::LinearImpl>) {
        const auto params = detail::child_params<I>(p);
        if (run.add(params.leaf(0), params.leaf(1))) return gather<I + 1>(m, p, run, ctx);
      } else if constexpr (std::is_same_v<child_impl<I>, torch::nn::ReLUImpl>) {
        if (run.add_relu()) return gather<I + 1>(m, p, run, ctx);
      }
      return chain<I>(m, p, run.run(), ctx);
    }
  }
};

// Whether every module of the type has a batched form (each is then used
// when its options allow: Conv2d with zero padding, BatchNorm in eval, ...):
// a Sequential's children one of one tensor (Chained), a module called by
// itself any (an LSTM's takes its input and state).
template <class Impl, bool Chained = false>
constexpr bool fully_lowered() {
  if constexpr (requires { typename Impl::is_sequential; }) {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (fully_lowered<impl_of_t<std::remove_cvref_t<decltype(std::declval<Impl&>().template child<I>())>>, true>() &&
              ...);
    }(std::make_index_sequence<Impl::size()>{});
  } else if constexpr (Chained) {
    return has_stacked_form<Impl>;
  } else {
    return has_batched_form<Impl>;
  }
}

// Whether the batched forms lower the whole module with its options (the
// run-time part of fully_lowered: a Conv2d's padding mode, a BatchNorm in eval).
template <class Impl>
bool lowers_whole(Impl& m) {
  if constexpr (requires { typename Impl::is_sequential; }) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return (lowers_whole(*m.template child<I>()) && ...);
    }(std::make_index_sequence<Impl::size()>{});
  } else if constexpr (has_stacked_form<Impl>) {
    if constexpr (requires { batched<Impl>::supports(m); })
      return batched<Impl>::supports(m);
    else
      return true;
  } else {
    return false;
  }
}
}  // namespace nn

}  // namespace tensordict
