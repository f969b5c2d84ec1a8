// The adapters of the modules without tensors: activations, Dropout,
// Softmax/LogSoftmax, Flatten, Identity. Their schema is empty and their
// functional form is their own forward (adapter.hpp); their batched forms move
// dims past the sets dim and give Dropout its randomness per set or shared.
#pragma once

#include <ATen/TensorOperators.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/relu.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

#include "../errors.hpp"

#include "adapter.hpp"

namespace tensordict::nn {

namespace detail {
using parameter_free_family =
    type_list<torch::nn::ReLUImpl, torch::nn::ReLU6Impl, torch::nn::LeakyReLUImpl, torch::nn::ELUImpl, torch::nn::SELUImpl,
              torch::nn::GELUImpl, torch::nn::SiLUImpl, torch::nn::MishImpl, torch::nn::SigmoidImpl, torch::nn::TanhImpl,
              torch::nn::SoftplusImpl, torch::nn::SoftmaxImpl, torch::nn::LogSoftmaxImpl, torch::nn::DropoutImpl,
              torch::nn::FlattenImpl, torch::nn::IdentityImpl>;

}  // namespace detail

// Every type of the family: an empty schema.
template <class Impl>
  requires detail::in_list_v<Impl, detail::parameter_free_family>
struct module_traits<Impl> {
  using members = member_list<>;
};

template <>
struct batched<torch::nn::DropoutImpl> {
  static constexpr bool is_batched = true;
  static stacked forward(torch::nn::DropoutImpl& m, const TensorDict<schema<>>&, const stacked& x, const batch_context& ctx) {
    const double prob = m.options.p();
    if (!m.is_training() || prob == 0) return x;
    switch (ctx.randomness) {
      case tensordict::randomness::error:
        throw value_error(
            "functional_vmap: Dropout in training mode draws random numbers, and randomness is \"error\". Pass "
            "randomness::different (a mask per set) or randomness::same (one mask for all sets), or call eval().");
      case tensordict::randomness::same:
        if (!x.mapped) return {at::dropout(x.value, prob, true), false};
        return {x.value * at::dropout(at::ones(x.value.sizes().slice(1), x.value.options()), prob, true), true};
      default:
        return {at::dropout(detail::expand_sets(x, ctx.sets), prob, true), true};
    }
  }
};

template <class Impl>
  requires std::is_same_v<Impl, torch::nn::SoftmaxImpl> || std::is_same_v<Impl, torch::nn::LogSoftmaxImpl> ||
           std::is_same_v<Impl, torch::nn::FlattenImpl>
struct batched<Impl> {
  static constexpr bool is_batched = true;
  static stacked forward(Impl& m, const TensorDict<schema<>>&, const stacked& x, const batch_context&) {
    if constexpr (std::is_same_v<Impl, torch::nn::FlattenImpl>)
      return {x.value.flatten(detail::past_sets(m.options.start_dim(), x.mapped), detail::past_sets(m.options.end_dim(), x.mapped)),
              x.mapped};
    else if constexpr (std::is_same_v<Impl, torch::nn::SoftmaxImpl>)
      return {x.value.softmax(detail::past_sets(m.options.dim(), x.mapped)), x.mapped};
    else
      return {x.value.log_softmax(detail::past_sets(m.options.dim(), x.mapped)), x.mapped};
  }
};

// The family's other modules act element-wise, the same way for every set.
// (Only these: a parameter-free module of another type may use dims, which a
// stacked value moves; it goes through vmap.)
template <class Impl>
  requires(detail::in_list_v<Impl, detail::parameter_free_family> && !std::is_same_v<Impl, torch::nn::DropoutImpl> &&
           !std::is_same_v<Impl, torch::nn::SoftmaxImpl> && !std::is_same_v<Impl, torch::nn::LogSoftmaxImpl> &&
           !std::is_same_v<Impl, torch::nn::FlattenImpl>)
struct batched<Impl> {
  static constexpr bool is_batched = true;
  static stacked forward(Impl& m, const TensorDict<schema<>>&, const stacked& x, const batch_context&) {
    if constexpr (std::is_same_v<Impl, torch::nn::ReLUImpl>)
      if (may_overwrite(x)) {
        at::Tensor v = x.value;
        return {v.relu_(), x.mapped, true};
      }
    return {m.forward(x.value), x.mapped};
  }
};

}  // namespace tensordict::nn
