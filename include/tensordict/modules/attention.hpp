// The adapter of torch::nn::MultiheadAttention: schema {in_proj_weight,
// in_proj_bias, bias_k, bias_v, out_proj: {weight, bias}, q_proj_weight,
// k_proj_weight, v_proj_weight}, unset where the options leave a tensor out
// (packed or separate in-projections, bias, add_bias_kv); functional form:
// F::multi_head_attention_forward with the TensorDict's tensors, as the
// module's own forward (masks, need_weights, average_attn_weights); its
// initialisation is its _reset_parameters(). No batched form yet.
#pragma once

#include <cstddef>
#include <tuple>

#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/activation.h>

#include "adapter.hpp"
#include "linear.hpp"

namespace tensordict::nn {

namespace detail {
using attention_family = type_list<torch::nn::MultiheadAttentionImpl>;
}  // namespace detail

TENSORDICT_DETAIL_TENSORS(torch::nn::MultiheadAttentionImpl,
                          TENSORDICT_DETAIL_TENSOR(torch::nn::MultiheadAttentionImpl, in_proj_weight),
                          TENSORDICT_DETAIL_TENSOR(torch::nn::MultiheadAttentionImpl, in_proj_bias),
                          TENSORDICT_DETAIL_TENSOR(torch::nn::MultiheadAttentionImpl, bias_k),
                          TENSORDICT_DETAIL_TENSOR(torch::nn::MultiheadAttentionImpl, bias_v),
                          TENSORDICT_DETAIL_TENSOR(torch::nn::MultiheadAttentionImpl, out_proj),
                          TENSORDICT_DETAIL_TENSOR(torch::nn::MultiheadAttentionImpl, q_proj_weight),
                          TENSORDICT_DETAIL_TENSOR(torch::nn::MultiheadAttentionImpl, k_proj_weight),
                          TENSORDICT_DETAIL_TENSOR(torch::nn::MultiheadAttentionImpl, v_proj_weight))

template <>
struct functional<torch::nn::MultiheadAttentionImpl> {
  static constexpr bool is_functional = true;
  using Impl = torch::nn::MultiheadAttentionImpl;
  using S = schema_of<Impl>;

  // A leaf by key path; undefined where the options leave it out (get<> would throw).
  template <::tensordict::key... Path>
  static const at::Tensor& leaf(const TensorDict<S>& p) {
    return p.leaf(leaf_index_v<S, Path...>);
  }

  // (attention output, attention weights) as MultiheadAttentionImpl::forward.
  static std::tuple<at::Tensor, at::Tensor> forward(const Impl& m, const TensorDict<S>& p, const at::Tensor& query,
                                                    const at::Tensor& key, const at::Tensor& value,
                                                    const at::Tensor& key_padding_mask = {}, bool need_weights = true,
                                                    const at::Tensor& attn_mask = {}, bool average_attn_weights = true) {
    namespace F = torch::nn::functional;
    const auto& o = m.options;
    auto options = F::MultiheadAttentionForwardFuncOptions(
                       o.embed_dim(), o.num_heads(), leaf<"in_proj_weight">(p),
                       leaf<"in_proj_bias">(p), leaf<"bias_k">(p),
                       leaf<"bias_v">(p), o.add_zero_attn(), o.dropout(),
                       leaf<"out_proj", "weight">(p), leaf<"out_proj", "bias">(p))
                       .training(m.is_training())
                       .key_padding_mask(key_padding_mask)
                       .need_weights(need_weights)
                       .attn_mask(attn_mask)
                       .average_attn_weights(average_attn_weights);
    if (!m._qkv_same_embed_dim)
      options.use_separate_proj_weight(true)
          .q_proj_weight(leaf<"q_proj_weight">(p))
          .k_proj_weight(leaf<"k_proj_weight">(p))
          .v_proj_weight(leaf<"v_proj_weight">(p));
    return F::multi_head_attention_forward(query, key, value, options);
  }
};

template <>
struct initializer<torch::nn::MultiheadAttentionImpl> {
  static void reset(torch::nn::MultiheadAttentionImpl& m) { m._reset_parameters(); }
};

}  // namespace tensordict::nn
