// The adapters of the normalizations: LayerNorm and GroupNorm ({weight,
// bias}), BatchNorm1d/2d/3d and InstanceNorm1d/2d/3d ({weight, bias,
// running_mean, running_var, num_batches_tracked}, unset where the options
// leave them out). Batched forms: LayerNorm, GroupNorm and InstanceNorm (the
// sets as groups of channels), and BatchNorm in eval. LocalResponseNorm and
// CrossMapLRN2d have no tensors; their batched form folds the sets into the
// batch dim.
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "conv.hpp"  // the sets-as-channels reshapes

#include <cstdint>
#include <type_traits>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/group_norm.h>
#include <ATen/ops/layer_norm.h>
#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/functional/instancenorm.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/normalization.h>

#include "adapter.hpp"

namespace tensordict::nn {

namespace detail {
using normalization_family = type_list<torch::nn::LayerNormImpl, torch::nn::GroupNormImpl, torch::nn::BatchNorm1dImpl,
                                       torch::nn::BatchNorm2dImpl, torch::nn::BatchNorm3dImpl, torch::nn::InstanceNorm1dImpl,
                                       torch::nn::InstanceNorm2dImpl, torch::nn::InstanceNorm3dImpl,
                                       torch::nn::LocalResponseNormImpl, torch::nn::CrossMapLRN2dImpl>;
}  // namespace detail

TENSORDICT_MODULE_MEMBERS(torch::nn::LocalResponseNormImpl)
TENSORDICT_MODULE_MEMBERS(torch::nn::CrossMapLRN2dImpl)
template <>
struct batched<torch::nn::LocalResponseNormImpl> : sample_wise_batched<torch::nn::LocalResponseNormImpl> {};
template <>
struct batched<torch::nn::CrossMapLRN2dImpl> : sample_wise_batched<torch::nn::CrossMapLRN2dImpl> {};

TENSORDICT_MODULE_WEIGHT_BIAS(torch::nn::LayerNormImpl)
TENSORDICT_MODULE_WEIGHT_BIAS(torch::nn::GroupNormImpl)
#define TENSORDICT_DETAIL_BATCHNORM(Impl)                                                                            \
  TENSORDICT_MODULE_MEMBERS(Impl, TENSORDICT_MEMBER(Impl, weight), TENSORDICT_MEMBER(Impl, bias),       \
                            TENSORDICT_MEMBER(Impl, running_mean), TENSORDICT_MEMBER(Impl, running_var), \
                            TENSORDICT_MEMBER(Impl, num_batches_tracked))
TENSORDICT_DETAIL_BATCHNORM(torch::nn::BatchNorm1dImpl)
TENSORDICT_DETAIL_BATCHNORM(torch::nn::BatchNorm2dImpl)
TENSORDICT_DETAIL_BATCHNORM(torch::nn::BatchNorm3dImpl)
TENSORDICT_DETAIL_BATCHNORM(torch::nn::InstanceNorm1dImpl)
TENSORDICT_DETAIL_BATCHNORM(torch::nn::InstanceNorm2dImpl)
TENSORDICT_DETAIL_BATCHNORM(torch::nn::InstanceNorm3dImpl)
#undef TENSORDICT_DETAIL_BATCHNORM

template <class Impl>
  requires std::is_same_v<Impl, torch::nn::BatchNorm1dImpl> || std::is_same_v<Impl, torch::nn::BatchNorm2dImpl> ||
           std::is_same_v<Impl, torch::nn::BatchNorm3dImpl>
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

namespace detail {
// The dims of an unbatched input ([C, L], [C, H, W], [C, D, H, W]).
template <class Impl>
inline constexpr std::int64_t instance_norm_unbatched_dims = std::is_same_v<Impl, torch::nn::InstanceNorm1dImpl>   ? 2
                                                             : std::is_same_v<Impl, torch::nn::InstanceNorm2dImpl> ? 3
                                                                                                                     : 4;
}  // namespace detail

template <class Impl>
  requires std::is_same_v<Impl, torch::nn::InstanceNorm1dImpl> || std::is_same_v<Impl, torch::nn::InstanceNorm2dImpl> ||
           std::is_same_v<Impl, torch::nn::InstanceNorm3dImpl>
struct functional<Impl> {
  static constexpr bool is_functional = true;
  // As InstanceNormImpl::forward: with running stats in training, the
  // TensorDict's buffers are updated in place.
  static at::Tensor forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const at::Tensor& x) {
    constexpr std::int64_t unbatched_dims = detail::instance_norm_unbatched_dims<Impl>;
    const auto& o = m.options;
    auto norm = [&](const at::Tensor& input) {
      return torch::nn::functional::detail::instance_norm(input, p.leaf(2), p.leaf(3), p.leaf(0), p.leaf(1),
                                                          m.is_training() || !o.track_running_stats(), o.momentum(), o.eps());
    };
    return x.dim() == unbatched_dims ? norm(x.unsqueeze(0)).squeeze(0) : norm(x);
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
struct batched<torch::nn::LayerNormImpl> {
  static constexpr bool is_batched = true;
  static stacked forward(const torch::nn::LayerNormImpl& m, const TensorDict<schema_of<torch::nn::LayerNormImpl>>& p,
                         const stacked& x, const batch_context& ctx) {
    const auto& shape = m.options.normalized_shape();
    at::Tensor y = at::layer_norm(x.value, shape, {}, {}, m.options.eps());  // over trailing dims: same for every set
    if (!p.leaf(0).defined()) return {y, x.mapped};
    at::Tensor v = detail::expand_sets({y, x.mapped}, ctx.sets);
    const auto trailing = static_cast<std::int64_t>(shape.size());
    v = v * detail::per_set(p.leaf(0), v.dim(), trailing);
    if (p.leaf(1).defined()) v = v + detail::per_set(p.leaf(1), v.dim(), trailing);
    return {v, true};
  }
};

template <class Impl>
  requires std::is_same_v<Impl, torch::nn::BatchNorm1dImpl> || std::is_same_v<Impl, torch::nn::BatchNorm2dImpl> ||
           std::is_same_v<Impl, torch::nn::BatchNorm3dImpl>
struct batched<Impl> {
  static constexpr bool is_batched = true;
  // Running statistics only: in training, batch statistics and their updates go through vmap.
  static bool supports(const Impl& m) { return !m.is_training() && m.options.track_running_stats(); }
  static stacked forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const stacked& x, const batch_context& ctx) {
    at::Tensor v = detail::expand_sets(x, ctx.sets);  // [sets, N, C, ...]
    auto view = [&](const at::Tensor& t) {
      std::vector<std::int64_t> shape{ctx.sets, 1, t.size(1)};
      for (std::int64_t d = 3; d < v.dim(); ++d) shape.push_back(1);
      return t.view(shape);
    };
    at::Tensor y = (v - view(p.leaf(2))) * view((p.leaf(3) + m.options.eps()).rsqrt());
    if (p.leaf(0).defined()) y = y * view(p.leaf(0));
    if (p.leaf(1).defined()) y = y + view(p.leaf(1));
    return {y, true};
  }
};

// The sets as groups of channels: [N, sets*C, ...], sets*G groups.
template <>
struct batched<torch::nn::GroupNormImpl> {
  static constexpr bool is_batched = true;
  static stacked forward(const torch::nn::GroupNormImpl& m, const TensorDict<schema_of<torch::nn::GroupNormImpl>>& p,
                         const stacked& x, const batch_context& ctx) {
    const at::Tensor input = detail::sets_as_channels(x, ctx.sets, false);
    auto flat = [](const at::Tensor& t) { return t.defined() ? t.reshape({-1}) : at::Tensor(); };
    const at::Tensor y = at::group_norm(input, ctx.sets * m.options.num_groups(), flat(p.leaf(0)), flat(p.leaf(1)), m.options.eps());
    return {detail::channels_as_sets(y, ctx.sets, false), true};
  }
};

// The sets as more channels; running statistics (eval, or their update in
// training) are the stacked buffers seen as [sets*C] (updated in place where
// they are contiguous, as from_modules stacks them).
template <class Impl>
  requires std::is_same_v<Impl, torch::nn::InstanceNorm1dImpl> || std::is_same_v<Impl, torch::nn::InstanceNorm2dImpl> ||
           std::is_same_v<Impl, torch::nn::InstanceNorm3dImpl>
struct batched<Impl> {
  static constexpr bool is_batched = true;
  static stacked forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const stacked& x, const batch_context& ctx) {
    constexpr std::int64_t unbatched_dims = detail::instance_norm_unbatched_dims<Impl>;
    const auto& o = m.options;
    const bool unbatched = x.value.dim() - (x.mapped ? 1 : 0) == unbatched_dims;
    const at::Tensor input = detail::sets_as_channels(x, ctx.sets, unbatched);
    auto flat = [](const at::Tensor& t) { return t.defined() ? t.reshape({-1}) : at::Tensor(); };
    const at::Tensor y = torch::nn::functional::detail::instance_norm(
        input, flat(p.leaf(2)), flat(p.leaf(3)), flat(p.leaf(0)), flat(p.leaf(1)),
        m.is_training() || !o.track_running_stats(), o.momentum(), o.eps());
    return {detail::channels_as_sets(y, ctx.sets, unbatched), true};
  }
};

}  // namespace tensordict::nn
