// The adapter of torch::nn::MultiheadAttention: schema {in_proj_weight,
// in_proj_bias, bias_k, bias_v, out_proj: {weight, bias}, q_proj_weight,
// k_proj_weight, v_proj_weight}, unset where the options leave a tensor out
// (packed or separate in-projections, bias, add_bias_kv); functional form:
// F::multi_head_attention_forward with the TensorDict's tensors, as the
// module's own forward (masks, need_weights, average_attn_weights); its
// initialisation is its _reset_parameters(). Its batched attention (for the
// transformer layers' batched forms) folds the sets into the batch of one
// attention: the in-projections of every set as one baddbmm, the scores of
// every set, batch row and head as one bmm.
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "linear.hpp"

#include <cmath>
#include <cstddef>
#include <tuple>

#include <ATen/ops/baddbmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/softmax.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/activation.h>

#include "adapter.hpp"

namespace tensordict::nn {

namespace detail {
using attention_family = type_list<torch::nn::MultiheadAttentionImpl>;
}  // namespace detail

TENSORDICT_MODULE_MEMBERS(torch::nn::MultiheadAttentionImpl,
                          TENSORDICT_MEMBER(torch::nn::MultiheadAttentionImpl, in_proj_weight),
                          TENSORDICT_MEMBER(torch::nn::MultiheadAttentionImpl, in_proj_bias),
                          TENSORDICT_MEMBER(torch::nn::MultiheadAttentionImpl, bias_k),
                          TENSORDICT_MEMBER(torch::nn::MultiheadAttentionImpl, bias_v),
                          TENSORDICT_MEMBER(torch::nn::MultiheadAttentionImpl, out_proj),
                          TENSORDICT_MEMBER(torch::nn::MultiheadAttentionImpl, q_proj_weight),
                          TENSORDICT_MEMBER(torch::nn::MultiheadAttentionImpl, k_proj_weight),
                          TENSORDICT_MEMBER(torch::nn::MultiheadAttentionImpl, v_proj_weight))

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

namespace detail {
// Attention of a stacked query [sets, Lq, N, E] over a stacked key-value
// sequence [sets, Lk, N, E] (the same tensor for self-attention), without
// masks, as MultiheadAttentionImpl::forward(q, kv, kv)'s output; for the
// options that supports() accepts.
struct batched_attention {
  using Impl = torch::nn::MultiheadAttentionImpl;
  static bool supports(const Impl& m) {
    return m._qkv_same_embed_dim && !m.bias_k.defined() && !m.options.add_zero_attn() &&
           (!m.is_training() || m.options.dropout() == 0);
  }
  static at::Tensor forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const at::Tensor& query,
                            const at::Tensor& key_value) {
    using F = functional<Impl>;
    const std::int64_t sets = query.size(0), length = query.size(1), batch = query.size(2), embed = query.size(3);
    const std::int64_t source_length = key_value.size(1);
    const std::int64_t heads = m.options.num_heads(), head_dim = embed / heads;
    auto project = [](const at::Tensor& rows, const at::Tensor& weight, const at::Tensor& bias) {
      return bias.defined() ? at::baddbmm(bias.unsqueeze(1), rows, weight.transpose(1, 2)) : at::bmm(rows, weight.transpose(1, 2));
    };
    const at::Tensor& w = F::leaf<"in_proj_weight">(p);
    const at::Tensor& b = F::leaf<"in_proj_bias">(p);
    auto rows_of = [&](const at::Tensor& x) { return x.reshape({sets, x.size(1) * batch, embed}); };
    // [sets, L*N, E] -> [sets*N*heads, L, head_dim], as the module folds its batch and heads.
    auto split_heads = [&](const at::Tensor& t, std::int64_t len) {
      return t.view({sets, len, batch, heads, head_dim}).permute({0, 2, 3, 1, 4}).reshape({sets * batch * heads, len, head_dim});
    };
    at::Tensor q, k, v;
    if (query.is_same(key_value)) {  // one GEMM for the three projections
      const auto parts = project(rows_of(query), w, b).chunk(3, 2);
      q = parts[0], k = parts[1], v = parts[2];
    } else {
      auto part = [&](const at::Tensor& t, std::int64_t first, std::int64_t count) {
        return t.defined() ? t.narrow(1, first, count) : t;
      };
      q = project(rows_of(query), part(w, 0, embed), part(b, 0, embed));
      const auto kv = project(rows_of(key_value), part(w, embed, 2 * embed), part(b, embed, 2 * embed)).chunk(2, 2);
      k = kv[0], v = kv[1];
    }
    q = split_heads(q, length) * (1.0 / std::sqrt(static_cast<double>(head_dim)));
    const at::Tensor weights = at::softmax(at::bmm(q, split_heads(k, source_length).transpose(1, 2)), -1);
    const at::Tensor attended = at::bmm(weights, split_heads(v, source_length))
                                    .view({sets, batch * heads, length, head_dim})
                                    .transpose(1, 2)
                                    .reshape({sets, length * batch, embed});
    return project(attended, F::leaf<"out_proj", "weight">(p), F::leaf<"out_proj", "bias">(p))
        .view({sets, length, batch, embed});
  }
};
}  // namespace detail

}  // namespace tensordict::nn
