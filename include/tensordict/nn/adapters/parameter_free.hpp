// The adapters of the activations and dropouts without tensors, Softmax and
// its kin, Flatten, Unflatten, Identity and Functional. Their schema is empty and their
// functional form is their own forward (adapter.hpp); their batched forms act
// element-wise, move dims past the sets dim, or draw their random numbers per
// set or shared (functional_vmap's randomness).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/glu.h>
#include <ATen/ops/where.h>
#include <c10/util/Type.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/linear.h>

#include "../../errors.hpp"

#include "adapter.hpp"

namespace tensordict::nn {

namespace detail {
using elementwise_family =
    type_list<torch::nn::ReLUImpl, torch::nn::ReLU6Impl, torch::nn::LeakyReLUImpl, torch::nn::ELUImpl, torch::nn::SELUImpl,
              torch::nn::CELUImpl, torch::nn::GELUImpl, torch::nn::SiLUImpl, torch::nn::MishImpl, torch::nn::SigmoidImpl,
              torch::nn::LogSigmoidImpl, torch::nn::TanhImpl, torch::nn::SoftplusImpl, torch::nn::SoftsignImpl,
              torch::nn::SoftshrinkImpl, torch::nn::HardshrinkImpl, torch::nn::TanhshrinkImpl, torch::nn::HardtanhImpl,
              torch::nn::ThresholdImpl, torch::nn::IdentityImpl>;
using dim_taking_family = type_list<torch::nn::SoftmaxImpl, torch::nn::LogSoftmaxImpl, torch::nn::SoftminImpl,
                                    torch::nn::Softmax2dImpl, torch::nn::GLUImpl, torch::nn::FlattenImpl, torch::nn::UnflattenImpl>;
using random_family = type_list<torch::nn::DropoutImpl, torch::nn::Dropout2dImpl, torch::nn::Dropout3dImpl,
                                torch::nn::AlphaDropoutImpl, torch::nn::FeatureAlphaDropoutImpl, torch::nn::RReLUImpl>;
// A torch::nn::Functional wraps any function: its forward, through vmap.
using parameter_free_family =
    typename concat_lists<elementwise_family, dim_taking_family, random_family, type_list<torch::nn::FunctionalImpl>>::type;
}  // namespace detail

// Every type of the family: an empty schema.
template <class Impl>
  requires detail::in_list_v<Impl, detail::parameter_free_family>
struct module_traits<Impl> {
  using members = member_list<>;
};

// The batched form of a module that draws random numbers: per ctx.randomness,
// its forward `f` over the sets folded into dim 0, each set with its own
// draws (different); once on a shared value, which stays shared (same);
// `same_mapped` on a mapped value, with one draw for every set (same); or a
// value_error naming the module type (error).
template <class Impl, class Forward, class SameMapped>
stacked random_batched(const stacked& x, const batch_context& ctx, Forward&& f, SameMapped&& same_mapped) {
  switch (ctx.randomness) {
    case tensordict::randomness::error:
      throw value_error("functional_vmap: " + c10::demangle(typeid(Impl).name()) +
                        " in training mode draws random numbers, and randomness is \"error\". Pass randomness::different "
                        "(each set its own draws) or randomness::same (one draw for all sets), or call eval().");
    case tensordict::randomness::same:
      if (!x.mapped) return {f(x.value), false};
      return {same_mapped(x.value), true};
    default:
      return fold_sets({expand_sets(x, ctx.sets), true}, f);
  }
}

namespace detail {
// A dropout's draw for a value whose dim 0 indexes the sets, made once for
// one set's shape and broadcast over all (ATen's _dropout_impl: feature
// dropouts draw per channel, alpha dropouts keep the mean and variance).
// `unbatched_dims`: a feature dropout's input dims without a batch dim.
inline at::Tensor shared_dropout(const at::Tensor& x, double p, bool feature, std::int64_t unbatched_dims, bool alpha) {
  std::vector<std::int64_t> shape(x.sizes().begin() + 1, x.sizes().end());
  if (feature) {
    const std::size_t keep = static_cast<std::int64_t>(shape.size()) == unbatched_dims ? 1 : 2;
    for (std::size_t d = keep; d < shape.size(); ++d) shape[d] = 1;
  }
  if (p == 1) return x * 0;
  at::Tensor noise = at::empty(shape, x.options()).bernoulli_(1 - p);
  if (!alpha) return x * noise.div_(1 - p);
  constexpr double selu_alpha = 1.7580993408473766;
  const double a = 1. / std::sqrt((selu_alpha * selu_alpha * p + 1) * (1 - p));
  const at::Tensor shift = noise.add(-1).mul_(selu_alpha * a).add_(selu_alpha * a * p);
  return x * noise.mul_(a) + shift;
}
}  // namespace detail

template <class Impl>
  requires detail::in_list_v<Impl, detail::elementwise_family>
struct batched<Impl> : elementwise_batched<Impl> {
  static stacked forward(Impl& m, const TensorDict<schema<>>& p, const stacked& x, const batch_context& ctx) {
    if constexpr (std::is_same_v<Impl, torch::nn::ReLUImpl>)
      if (may_overwrite(x)) {
        at::Tensor v = x.value;
        return {v.relu_(), x.mapped, true};
      }
    return elementwise_batched<Impl>::forward(m, p, x, ctx);
  }
};

template <class Impl>
  requires detail::in_list_v<Impl, detail::dim_taking_family>
struct batched<Impl> {
  static constexpr bool is_batched = true;
  static stacked forward(Impl& m, const TensorDict<schema<>>&, const stacked& x, const batch_context&) {
    const bool mapped = x.mapped;
    const auto past = [&](std::int64_t dim) { return past_sets(dim, mapped); };
    if constexpr (std::is_same_v<Impl, torch::nn::FlattenImpl>)
      return {x.value.flatten(past(m.options.start_dim()), past(m.options.end_dim())), mapped};
    else if constexpr (std::is_same_v<Impl, torch::nn::UnflattenImpl>)
      return {x.value.unflatten(past(m.options.dim()), m.options.sizes()), mapped};
    else if constexpr (std::is_same_v<Impl, torch::nn::SoftmaxImpl>)
      return {x.value.softmax(past(m.options.dim())), mapped};
    else if constexpr (std::is_same_v<Impl, torch::nn::LogSoftmaxImpl>)
      return {x.value.log_softmax(past(m.options.dim())), mapped};
    else if constexpr (std::is_same_v<Impl, torch::nn::SoftminImpl>)
      return {(-x.value).softmax(past(m.options.dim())), mapped};
    else if constexpr (std::is_same_v<Impl, torch::nn::GLUImpl>)
      return {at::glu(x.value, past(m.options.dim())), mapped};
    else {  // Softmax2d: over the channels, dim -3 of a [C, H, W] or [N, C, H, W] input
      if (!mapped) return {m.forward(x.value), false};
      const std::int64_t dims = x.value.dim() - 1;
      TORCH_CHECK(dims == 3 || dims == 4, "Softmax2d: expected an input of 3 or 4 dims for each set, got ", dims);
      return {x.value.softmax(-3), true};
    }
  }
};

template <class Impl>
  requires detail::in_list_v<Impl, detail::random_family>
struct batched<Impl> {
  static constexpr bool is_batched = true;
  static stacked forward(Impl& m, const TensorDict<schema<>>&, const stacked& x, const batch_context& ctx) {
    const auto own = [&](const at::Tensor& v) { return m.forward(v); };
    if constexpr (std::is_same_v<Impl, torch::nn::RReLUImpl>) {
      if (!m.is_training()) return {m.forward(x.value), x.mapped};
      return random_batched<Impl>(x, ctx, own, [&](const at::Tensor& v) {
        std::vector<std::int64_t> shape(v.sizes().begin() + 1, v.sizes().end());
        const at::Tensor slope = at::empty(shape, v.options()).uniform_(m.options.lower(), m.options.upper());
        return at::where(v >= 0, v, v * slope);
      });
    } else {
      const double prob = m.options.p();
      if (!m.is_training() || prob == 0) return x;
      constexpr bool alpha =
          std::is_same_v<Impl, torch::nn::AlphaDropoutImpl> || std::is_same_v<Impl, torch::nn::FeatureAlphaDropoutImpl>;
      constexpr bool feature = !std::is_same_v<Impl, torch::nn::DropoutImpl> && !std::is_same_v<Impl, torch::nn::AlphaDropoutImpl>;
      constexpr std::int64_t unbatched_dims = std::is_same_v<Impl, torch::nn::Dropout2dImpl>   ? 3
                                              : std::is_same_v<Impl, torch::nn::Dropout3dImpl> ? 4
                                                                                              : 0;
      return random_batched<Impl>(x, ctx, own, [&](const at::Tensor& v) {
        return detail::shared_dropout(v, prob, feature, unbatched_dims, alpha);
      });
    }
  }
};

}  // namespace tensordict::nn
