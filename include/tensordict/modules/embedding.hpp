// The adapter of torch::nn::Embedding: schema {weight}, functional form, and
// a batched form (one gather) without max_norm or padding_idx.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/nn/functional/embedding.h>
#include <torch/nn/modules/embedding.h>

#include "adapter.hpp"

namespace tensordict::nn {

namespace detail {
using embedding_family = type_list<torch::nn::EmbeddingImpl>;
}  // namespace detail

TENSORDICT_DETAIL_TENSORS(torch::nn::EmbeddingImpl, TENSORDICT_DETAIL_TENSOR(torch::nn::EmbeddingImpl, weight))

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

template <>
struct batched<torch::nn::EmbeddingImpl> {
  static constexpr bool is_batched = true;
  // max_norm renormalizes rows in place and padding_idx keeps a row's gradient at zero: those go through vmap.
  static bool supports(const torch::nn::EmbeddingImpl& m) {
    return !m.options.max_norm().has_value() && !m.options.padding_idx().has_value();
  }
  static stacked forward(const torch::nn::EmbeddingImpl&, const TensorDict<schema_of<torch::nn::EmbeddingImpl>>& p,
                         const stacked& x, const batch_context& ctx) {
    const at::Tensor& w = p.leaf(0);  // [sets, num, dim]
    const std::int64_t dim = w.size(2);
    if (!x.mapped) {
      std::vector<std::int64_t> shape{ctx.sets};
      shape.insert(shape.end(), x.value.sizes().begin(), x.value.sizes().end());
      shape.push_back(dim);
      return {w.index_select(1, x.value.reshape({-1})).view(shape), true};
    }
    at::Tensor flat = x.value.reshape({ctx.sets, -1});  // [sets, k]
    at::Tensor picked = w.gather(1, flat.unsqueeze(-1).expand({ctx.sets, flat.size(1), dim}));
    std::vector<std::int64_t> shape(x.value.sizes().begin(), x.value.sizes().end());
    shape.push_back(dim);
    return {picked.view(shape), true};
  }
};

}  // namespace tensordict::nn
