// The adapters of torch::nn::Linear (schema {weight, bias}, functional form
// at::linear, batched form one GEMM or baddbmm for every set) and
// torch::nn::Bilinear ({weight, bias}, functional form at::bilinear of its two
// inputs).
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "adapter.hpp"

#include <cstdint>
#include <vector>

#include <ATen/ops/addmm.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/bilinear.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/linear.h>
#include <torch/nn/modules/linear.h>

namespace tensordict::nn {

namespace detail {
using linear_family = type_list<torch::nn::LinearImpl, torch::nn::BilinearImpl>;
}  // namespace detail

TENSORDICT_MODULE_WEIGHT_BIAS(torch::nn::LinearImpl)
TENSORDICT_MODULE_WEIGHT_BIAS(torch::nn::BilinearImpl)

template <>
struct functional<torch::nn::LinearImpl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const torch::nn::LinearImpl&, const TensorDict<schema_of<torch::nn::LinearImpl>>& p,
                            const at::Tensor& x) {
    return at::linear(x, p.leaf(0), p.leaf(1));
  }
};

template <>
struct batched<torch::nn::LinearImpl> {
  static constexpr bool is_batched = true;
  // One baddbmm: [sets, rows, in] x [sets, in, out]; a shared input is broadcast, not copied.
  static stacked forward(const torch::nn::LinearImpl&, const TensorDict<schema_of<torch::nn::LinearImpl>>& p,
                         const stacked& x, const batch_context& ctx) {
    const at::Tensor& w = p.leaf(0);  // [sets, out, in]
    const at::Tensor& b = p.leaf(1);  // [sets, out] or unset
    const std::int64_t in = w.size(2), out = w.size(1);
    // [sets, rows, in]; the common shapes need no reshape (each op costs about a microsecond here).
    const std::int64_t own_dims = x.value.dim() - (x.mapped ? 1 : 0);
    if (!x.mapped && own_dims == 2 && b.defined()) {
      // A shared input meets every set's weights in one GEMM: [rows, in] x [in, sets*out].
      at::Tensor y = at::addmm(b.reshape({-1}), x.value, w.reshape({ctx.sets * out, in}).t());
      return {y.view({x.value.size(0), ctx.sets, out}).transpose(0, 1), true, true};
    }
    at::Tensor rows;
    if (x.mapped)
      rows = own_dims == 2 ? x.value : x.value.reshape({ctx.sets, -1, in});
    else
      rows = (own_dims == 2 ? x.value : x.value.reshape({-1, in})).unsqueeze(0).expand({ctx.sets, -1, in});
    at::Tensor y;
    if (!b.defined())
      y = at::bmm(rows, w.transpose(1, 2));
    else if (rows.size(1) * in * out < (1 << 16))
      y = at::baddbmm(b.unsqueeze(1), rows, w.transpose(1, 2));  // small: the bias fused in
    else
      y = at::bmm(rows, w.transpose(1, 2)).add_(b.unsqueeze(1));  // large: measured faster than baddbmm's bias copy
    if (own_dims == 2) return {y, true, true};
    std::vector<std::int64_t> shape{ctx.sets};
    shape.insert(shape.end(), x.value.sizes().begin() + (x.mapped ? 1 : 0), x.value.sizes().end() - 1);
    shape.push_back(out);
    return {y.view(shape), true, true};
  }
};

template <>
struct functional<torch::nn::BilinearImpl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const torch::nn::BilinearImpl&, const TensorDict<schema_of<torch::nn::BilinearImpl>>& p,
                            const at::Tensor& x1, const at::Tensor& x2) {
    return at::bilinear(x1, x2, p.leaf(0), p.leaf(1));
  }
};

}  // namespace tensordict::nn
