// The adapter of torch::nn::TransformerEncoderLayer: schema {self_attn,
// linear1, linear2, norm1, norm2} (its dropouts hold no tensors); functional
// form: its children's functional forms in the order of its own forward
// (attention, add & norm, feed-forward with its activation, add & norm); its
// initialisation is its reset_parameters(). Batched form (without masks):
// the batched self-attention, then the Linear, LayerNorm and Dropout batched
// forms in the same order.
#pragma once

#include <functional>
#include <tuple>

#include <ATen/TensorOperators.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/relu.h>
#include <torch/nn/modules/transformerlayer.h>

#include "../detail/compat.hpp"
#include "../errors.hpp"
#include "adapter.hpp"
#include "attention.hpp"
#include "linear.hpp"
#include "normalization.hpp"
#include "parameter_free.hpp"

namespace tensordict::nn {

namespace detail {
using transformer_family = type_list<torch::nn::TransformerEncoderLayerImpl>;

// The layer's activation on any tensor (a stacked one too).
inline at::Tensor feed_forward_activation(const torch::nn::TransformerEncoderLayerImpl& m, const at::Tensor& h) {
  const auto& activation = m.options.activation();
  if (::tensordict::detail::compat::get_if<torch::enumtype::kGELU>(&activation)) return at::gelu(h);
  if (::tensordict::detail::compat::get_if<torch::enumtype::kReLU>(&activation)) return at::relu(h);
  if (const auto* callable = ::tensordict::detail::compat::get_if<std::function<at::Tensor(const at::Tensor&)>>(&activation))
    return (*callable)(h);
  throw module_error("tensordict::functional_call: TransformerEncoderLayer's activation is neither kGELU, kReLU nor a callable");
}
}  // namespace detail

TENSORDICT_DETAIL_TENSORS(torch::nn::TransformerEncoderLayerImpl,
                          TENSORDICT_DETAIL_TENSOR(torch::nn::TransformerEncoderLayerImpl, self_attn),
                          TENSORDICT_DETAIL_TENSOR(torch::nn::TransformerEncoderLayerImpl, linear1),
                          TENSORDICT_DETAIL_TENSOR(torch::nn::TransformerEncoderLayerImpl, dropout),
                          TENSORDICT_DETAIL_TENSOR(torch::nn::TransformerEncoderLayerImpl, linear2),
                          TENSORDICT_DETAIL_TENSOR(torch::nn::TransformerEncoderLayerImpl, norm1),
                          TENSORDICT_DETAIL_TENSOR(torch::nn::TransformerEncoderLayerImpl, norm2),
                          TENSORDICT_DETAIL_TENSOR(torch::nn::TransformerEncoderLayerImpl, dropout1),
                          TENSORDICT_DETAIL_TENSOR(torch::nn::TransformerEncoderLayerImpl, dropout2))

template <>
struct functional<torch::nn::TransformerEncoderLayerImpl> {
  static constexpr bool is_functional = true;
  using Impl = torch::nn::TransformerEncoderLayerImpl;

  // As TransformerEncoderLayerImpl::forward (post-norm); the dropouts are the
  // module's own (random in training).
  static at::Tensor forward(Impl& m, const TensorDict<schema_of<Impl>>& p, const at::Tensor& src,
                            const at::Tensor& src_mask = {}, const at::Tensor& src_key_padding_mask = {}) {
    using torch::nn::LayerNormImpl;
    using torch::nn::LinearImpl;
    const at::Tensor attended = std::get<0>(functional<torch::nn::MultiheadAttentionImpl>::forward(
        *m.self_attn, p.template get<"self_attn">(), src, src, src, src_key_padding_mask, true, src_mask));
    const at::Tensor x = functional<LayerNormImpl>::forward(*m.norm1, p.template get<"norm1">(), src + m.dropout1->forward(attended));
    at::Tensor h = functional<LinearImpl>::forward(*m.linear1, p.template get<"linear1">(), x);
    h = functional<LinearImpl>::forward(*m.linear2, p.template get<"linear2">(), m.dropout->forward(detail::feed_forward_activation(m, h)));
    return functional<LayerNormImpl>::forward(*m.norm2, p.template get<"norm2">(), x + m.dropout2->forward(h));
  }
};


template <>
struct batched<torch::nn::TransformerEncoderLayerImpl> {
  static constexpr bool is_batched = true;
  using Impl = torch::nn::TransformerEncoderLayerImpl;
  static bool supports(const Impl& m) { return detail::batched_self_attention::supports(*m.self_attn); }
  // src [L, N, E], shared or per set; the callable activation must be element-wise.
  static stacked forward(Impl& m, const TensorDict<schema_of<Impl>>& p, const stacked& src, const batch_context& ctx) {
    using torch::nn::DropoutImpl;
    using torch::nn::LayerNormImpl;
    using torch::nn::LinearImpl;
    const TensorDict<schema<>> none;
    const at::Tensor x = detail::expand_sets(src, ctx.sets);
    const stacked attended{detail::batched_self_attention::forward(*m.self_attn, p.template get<"self_attn">(), x), true};
    const stacked x1 = batched<LayerNormImpl>::forward(
        *m.norm1, p.template get<"norm1">(), {x + batched<DropoutImpl>::forward(*m.dropout1, none, attended, ctx).value, true}, ctx);
    stacked h = batched<LinearImpl>::forward(*m.linear1, p.template get<"linear1">(), x1, ctx);
    h = batched<DropoutImpl>::forward(*m.dropout, none, {detail::feed_forward_activation(m, h.value), true}, ctx);
    h = batched<LinearImpl>::forward(*m.linear2, p.template get<"linear2">(), h, ctx);
    const at::Tensor residual = x1.value + detail::expand_sets(batched<DropoutImpl>::forward(*m.dropout2, none, h, ctx), ctx.sets);
    return batched<LayerNormImpl>::forward(*m.norm2, p.template get<"norm2">(), {residual, true}, ctx);
  }
};

}  // namespace tensordict::nn
