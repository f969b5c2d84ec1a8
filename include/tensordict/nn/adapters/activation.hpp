// The adapter of the activation with a parameter: PReLU, schema {weight};
// its batched form broadcasts each set's weights over that set's input.
// (The activations without tensors are in parameter_free.hpp.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/where.h>
#include <torch/nn/modules/activation.h>

#include "adapter.hpp"

namespace tensordict::nn {

namespace detail {
using activation_family = type_list<torch::nn::PReLUImpl>;
}  // namespace detail

TENSORDICT_MODULE_MEMBERS(torch::nn::PReLUImpl, TENSORDICT_MEMBER(torch::nn::PReLUImpl, weight))

template <>
struct functional<torch::nn::PReLUImpl> {
  static constexpr bool is_functional = true;
  // at::prelu's value, written element-wise: functorch's batching rule for
  // prelu refuses stacked weights of one parameter (libtorch 1.13).
  static at::Tensor forward(const torch::nn::PReLUImpl&, const TensorDict<schema_of<torch::nn::PReLUImpl>>& p,
                            const at::Tensor& x) {
    at::Tensor w = p.leaf(0);
    if (w.numel() > 1 && x.dim() >= 2) {  // one weight per channel, dim 1
      std::vector<std::int64_t> shape(static_cast<std::size_t>(x.dim()), 1);
      shape[1] = w.numel();
      w = w.view(shape);
    }
    return at::where(x > 0, x, x * w);
  }
};

// PReLUImpl::reset() registers a new weight; its initial value is options.init().
template <>
struct initializer<torch::nn::PReLUImpl> {
  static void reset(torch::nn::PReLUImpl& m) { m.weight.fill_(m.options.init()); }
};

template <>
struct batched<torch::nn::PReLUImpl> {
  static constexpr bool is_batched = true;
  static stacked forward(const torch::nn::PReLUImpl&, const TensorDict<schema_of<torch::nn::PReLUImpl>>& p,
                         const stacked& x, const batch_context& ctx) {
    const at::Tensor v = detail::expand_sets(x, ctx.sets);  // [sets, ...]
    const at::Tensor& w = p.leaf(0);                      // [sets, 1] or [sets, C]
    std::vector<std::int64_t> shape(static_cast<std::size_t>(v.dim()), 1);
    shape[0] = ctx.sets;
    if (w.size(1) > 1) shape[v.dim() >= 3 ? 2 : 1] = w.size(1);  // one weight per channel: each set's dim 1 (dim 0 of a 1-d input)
    return {at::where(v > 0, v, v * w.view(shape)), true};
  }
};

}  // namespace tensordict::nn
