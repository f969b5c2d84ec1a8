// The adapters of the transformer modules.
//   TransformerEncoderLayer: schema {self_attn, linear1, linear2, norm1,
//   norm2}; TransformerDecoderLayer: {self_attn, norm1, multihead_attn,
//   norm2, linear1, linear2, norm3} (their dropouts hold no tensors).
//   Functional forms: their children's functional forms in the order of
//   their own forward (attention, add & norm, feed-forward with the layer's
//   activation, add & norm); their initialisation is their
//   reset_parameters(). Batched forms (without masks): the batched attention,
//   then the Linear, LayerNorm and Dropout batched forms in the same order.
//   TransformerEncoder, TransformerDecoder, Transformer: their layers are a
//   ModuleList of options.num_layers() clones, so they have a run-time layout
//   ("layers.0.self_attn.in_proj_weight", "norm.weight"; a Transformer's
//   under "encoder" and "decoder"): their calls take an AnyTensorDict, their
//   functional and batched forms run their layers' in turn, then the norm
//   (a LayerNorm, or a norm without tensors).
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "attention.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/relu.h>
#include <c10/util/Type.h>
#include <torch/nn/modules/transformer.h>
#include <torch/nn/modules/transformercoder.h>
#include <torch/nn/modules/transformerlayer.h>

#include "../../any_tensordict.hpp"
#include "../../detail/compat.hpp"
#include "../../detail/core_cache.hpp"
#include "../../errors.hpp"
#include "adapter.hpp"
#include "linear.hpp"
#include "normalization.hpp"
#include "parameter_free.hpp"

namespace tensordict::nn {

namespace detail {
using transformer_family = type_list<torch::nn::TransformerEncoderLayerImpl, torch::nn::TransformerDecoderLayerImpl>;
using transformer_stacks_family =
    type_list<torch::nn::TransformerEncoderImpl, torch::nn::TransformerDecoderImpl, torch::nn::TransformerImpl>;

// A layer's activation on any tensor (a stacked one too); overwrite: a ReLU
// may overwrite h (nn::may_overwrite of the stacked value it came from).
template <class Layer>
at::Tensor feed_forward_activation(const Layer& m, const at::Tensor& h, bool overwrite = false) {
  const auto& activation = m.options.activation();
  if (::tensordict::detail::compat::get_if<torch::enumtype::kGELU>(&activation)) return at::gelu(h);
  if (::tensordict::detail::compat::get_if<torch::enumtype::kReLU>(&activation)) {
    if (overwrite) {
      at::Tensor own = h;
      return own.relu_();
    }
    return at::relu(h);
  }
  if (const auto* callable = ::tensordict::detail::compat::get_if<std::function<at::Tensor(const at::Tensor&)>>(&activation))
    return (*callable)(h);
  throw module_error("tensordict::functional_call: " + c10::demangle(typeid(Layer).name()) +
                     "'s activation is neither kGELU, kReLU nor a callable");
}

// linear2(dropout(activation(linear1(x)))): a layer's feed-forward block.
template <class Layer, class P>
at::Tensor feed_forward(Layer& m, const P& p, const at::Tensor& x) {
  using torch::nn::LinearImpl;
  const at::Tensor h = functional<LinearImpl>::forward(*m.linear1, p.template get<"linear1">(), x);
  return functional<LinearImpl>::forward(*m.linear2, p.template get<"linear2">(), m.dropout->forward(feed_forward_activation(m, h)));
}

template <class Layer, class Linear>
stacked batched_feed_forward_group(Layer& m, const Linear& linear1, const Linear& linear2, const stacked& x,
                                   const batch_context& ctx) {
  using torch::nn::LinearImpl;
  stacked h = batched<LinearImpl>::forward(*m.linear1, linear1, x, ctx);
  h = batched<torch::nn::DropoutImpl>::forward(*m.dropout, TensorDict<schema<>>(), {feed_forward_activation(m, h.value, may_overwrite(h)), true},
                                                ctx);
  return batched<LinearImpl>::forward(*m.linear2, linear2, h, ctx);
}

// The block's hidden activation is [sets, rows, dim_feedforward] (8 sets of
// 512 rows at the default 2048: 32 MB), and linear1, the activation and
// linear2 each pass over it. In groups of sets whose part fits in a core's
// cache it stays there (measured at one thread under the profiler, 8 sets of
// 2 layers on 32x16 tokens: a forward 129 ms in one group, 100 ms a set at a
// time; the members' own modules 81-87 ms). A training dropout keeps one
// group, so that its masks follow the seed as before.
template <class Layer, class P>
stacked batched_feed_forward(Layer& m, const P& p, const stacked& x, const batch_context& ctx) {
  const auto linear1 = p.template get<"linear1">();
  const auto linear2 = p.template get<"linear2">();
  const at::Tensor& w1 = linear1.template get<"weight">();  // [sets, dim_feedforward, d_model]
  const std::int64_t rows = x.value.numel() / (x.mapped ? ctx.sets : 1) / std::max<std::int64_t>(1, x.value.size(-1));
  const std::int64_t hidden_bytes = std::max<std::int64_t>(1, rows * w1.size(1) * static_cast<std::int64_t>(w1.element_size()));
  const std::int64_t group = std::max<std::int64_t>(1, ::tensordict::detail::core_cache_bytes() / hidden_bytes);
  const bool draws = m.dropout->is_training() && m.dropout->options.p() > 0;
  if (group >= ctx.sets || draws) return batched_feed_forward_group(m, linear1, linear2, x, ctx);

  // Split once (one autograd node per tensor, whose backward joins the groups' gradients).
  auto split_leaves = [&](const auto& linear) {
    std::vector<std::vector<at::Tensor>> parts;
    for (const at::Tensor& t : linear.values()) parts.push_back(t.split(group));  // in the order apply visits them
    return parts;
  };
  const auto parts1 = split_leaves(linear1), parts2 = split_leaves(linear2);
  const std::vector<at::Tensor> inputs = x.mapped ? x.value.split(group) : std::vector<at::Tensor>{};
  std::vector<at::Tensor> outs;
  for (std::size_t g = 0; g < parts1.front().size(); ++g) {
    const std::array<std::int64_t, 1> length{parts1.front()[g].size(0)};
    auto group_of = [&](const auto& linear, const auto& parts) {
      std::size_t k = 0;
      return linear.apply([&](const at::Tensor&) { return parts[k++][g]; }, length);
    };
    const stacked in{x.mapped ? inputs[g] : x.value, x.mapped};
    outs.push_back(batched_feed_forward_group(m, group_of(linear1, parts1), group_of(linear2, parts2), in,
                                              batch_context{length[0], ctx.randomness})
                       .value);
  }
  return {at::cat(outs), true};
}

// norm(x + dropout(y)) of stacked values: the add & norm after each block.
template <class P>
at::Tensor batched_add_norm(torch::nn::LayerNormImpl& norm, const P& p, torch::nn::DropoutImpl& dropout, const at::Tensor& x,
                            const stacked& y, const batch_context& ctx) {
  const at::Tensor residual = x + expand_sets(batched<torch::nn::DropoutImpl>::forward(dropout, TensorDict<schema<>>(), y, ctx), ctx.sets);
  return batched<torch::nn::LayerNormImpl>::forward(norm, p, {residual, true}, ctx).value;
}
}  // namespace detail

// ---- TransformerEncoderLayer ------------------------------------------------------

TENSORDICT_MODULE_MEMBERS(torch::nn::TransformerEncoderLayerImpl,
                          TENSORDICT_MEMBER(torch::nn::TransformerEncoderLayerImpl, self_attn),
                          TENSORDICT_MEMBER(torch::nn::TransformerEncoderLayerImpl, linear1),
                          TENSORDICT_MEMBER(torch::nn::TransformerEncoderLayerImpl, dropout),
                          TENSORDICT_MEMBER(torch::nn::TransformerEncoderLayerImpl, linear2),
                          TENSORDICT_MEMBER(torch::nn::TransformerEncoderLayerImpl, norm1),
                          TENSORDICT_MEMBER(torch::nn::TransformerEncoderLayerImpl, norm2),
                          TENSORDICT_MEMBER(torch::nn::TransformerEncoderLayerImpl, dropout1),
                          TENSORDICT_MEMBER(torch::nn::TransformerEncoderLayerImpl, dropout2))

template <>
struct functional<torch::nn::TransformerEncoderLayerImpl> {
  static constexpr bool is_functional = true;
  using Impl = torch::nn::TransformerEncoderLayerImpl;

  // As TransformerEncoderLayerImpl::forward (post-norm); the dropouts are the
  // module's own (random in training).
  static at::Tensor forward(Impl& m, const TensorDict<schema_of<Impl>>& p, const at::Tensor& src,
                            const at::Tensor& src_mask = {}, const at::Tensor& src_key_padding_mask = {}) {
    using torch::nn::LayerNormImpl;
    const at::Tensor attended = std::get<0>(functional<torch::nn::MultiheadAttentionImpl>::forward(
        *m.self_attn, p.template get<"self_attn">(), src, src, src, src_key_padding_mask, true, src_mask));
    const at::Tensor x = functional<LayerNormImpl>::forward(*m.norm1, p.template get<"norm1">(), src + m.dropout1->forward(attended));
    return functional<LayerNormImpl>::forward(*m.norm2, p.template get<"norm2">(), x + m.dropout2->forward(detail::feed_forward(m, p, x)));
  }
};

template <>
struct batched<torch::nn::TransformerEncoderLayerImpl> {
  static constexpr bool is_batched = true;
  using Impl = torch::nn::TransformerEncoderLayerImpl;
  static bool supports(const Impl& m) { return detail::batched_attention::supports(*m.self_attn); }
  // src [L, N, E], shared or per set; the callable activation must be element-wise.
  static stacked forward(Impl& m, const TensorDict<schema_of<Impl>>& p, const stacked& src, const batch_context& ctx) {
    const at::Tensor x = detail::expand_sets(src, ctx.sets);
    const stacked attended{detail::batched_attention::forward(*m.self_attn, p.template get<"self_attn">(), x, x), true};
    const at::Tensor x1 = detail::batched_add_norm(*m.norm1, p.template get<"norm1">(), *m.dropout1, x, attended, ctx);
    return {detail::batched_add_norm(*m.norm2, p.template get<"norm2">(), *m.dropout2, x1,
                                     detail::batched_feed_forward(m, p, {x1, true}, ctx), ctx),
            true};
  }
};

// ---- TransformerDecoderLayer ------------------------------------------------------

TENSORDICT_MODULE_MEMBERS(torch::nn::TransformerDecoderLayerImpl,
                          TENSORDICT_MEMBER(torch::nn::TransformerDecoderLayerImpl, self_attn),
                          TENSORDICT_MEMBER(torch::nn::TransformerDecoderLayerImpl, dropout1),
                          TENSORDICT_MEMBER(torch::nn::TransformerDecoderLayerImpl, norm1),
                          TENSORDICT_MEMBER(torch::nn::TransformerDecoderLayerImpl, multihead_attn),
                          TENSORDICT_MEMBER(torch::nn::TransformerDecoderLayerImpl, dropout2),
                          TENSORDICT_MEMBER(torch::nn::TransformerDecoderLayerImpl, norm2),
                          TENSORDICT_MEMBER(torch::nn::TransformerDecoderLayerImpl, linear1),
                          TENSORDICT_MEMBER(torch::nn::TransformerDecoderLayerImpl, dropout),
                          TENSORDICT_MEMBER(torch::nn::TransformerDecoderLayerImpl, linear2),
                          TENSORDICT_MEMBER(torch::nn::TransformerDecoderLayerImpl, dropout3),
                          TENSORDICT_MEMBER(torch::nn::TransformerDecoderLayerImpl, norm3))

template <>
struct functional<torch::nn::TransformerDecoderLayerImpl> {
  static constexpr bool is_functional = true;
  using Impl = torch::nn::TransformerDecoderLayerImpl;

  // As TransformerDecoderLayerImpl::forward: self-attention over tgt, then
  // attention over memory, then the feed-forward block, each with add & norm.
  static at::Tensor forward(Impl& m, const TensorDict<schema_of<Impl>>& p, const at::Tensor& tgt, const at::Tensor& memory,
                            const at::Tensor& tgt_mask = {}, const at::Tensor& memory_mask = {},
                            const at::Tensor& tgt_key_padding_mask = {}, const at::Tensor& memory_key_padding_mask = {}) {
    using torch::nn::LayerNormImpl;
    using attention = functional<torch::nn::MultiheadAttentionImpl>;
    const at::Tensor self = std::get<0>(
        attention::forward(*m.self_attn, p.template get<"self_attn">(), tgt, tgt, tgt, tgt_key_padding_mask, false, tgt_mask));
    at::Tensor x = functional<LayerNormImpl>::forward(*m.norm1, p.template get<"norm1">(), tgt + m.dropout1->forward(self));
    const at::Tensor cross = std::get<0>(attention::forward(*m.multihead_attn, p.template get<"multihead_attn">(), x, memory,
                                                            memory, memory_key_padding_mask, false, memory_mask));
    x = functional<LayerNormImpl>::forward(*m.norm2, p.template get<"norm2">(), x + m.dropout2->forward(cross));
    return functional<LayerNormImpl>::forward(*m.norm3, p.template get<"norm3">(), x + m.dropout3->forward(detail::feed_forward(m, p, x)));
  }
};

// Its batched form takes (tgt, memory), each shared or per set, without masks.
template <>
struct batched<torch::nn::TransformerDecoderLayerImpl> {
  static constexpr bool is_batched = true;
  using Impl = torch::nn::TransformerDecoderLayerImpl;
  static bool supports(const Impl& m) {
    return detail::batched_attention::supports(*m.self_attn) && detail::batched_attention::supports(*m.multihead_attn);
  }
  // tgt and memory with the sets in front.
  static at::Tensor layer(Impl& m, const TensorDict<schema_of<Impl>>& p, const at::Tensor& tgt, const at::Tensor& memory,
                          const batch_context& ctx) {
    const stacked self{detail::batched_attention::forward(*m.self_attn, p.template get<"self_attn">(), tgt, tgt), true};
    const at::Tensor x1 = detail::batched_add_norm(*m.norm1, p.template get<"norm1">(), *m.dropout1, tgt, self, ctx);
    const stacked cross{detail::batched_attention::forward(*m.multihead_attn, p.template get<"multihead_attn">(), x1, memory), true};
    const at::Tensor x2 = detail::batched_add_norm(*m.norm2, p.template get<"norm2">(), *m.dropout2, x1, cross, ctx);
    return detail::batched_add_norm(*m.norm3, p.template get<"norm3">(), *m.dropout3, x2,
                                    detail::batched_feed_forward(m, p, {x2, true}, ctx), ctx);
  }
  static at::Tensor forward(Impl& m, const TensorDict<schema_of<Impl>>& p, const std::tuple<at::Tensor, at::Tensor>& inputs,
                            const std::array<bool, 2>& mapped, const batch_context& ctx) {
    return layer(m, p, detail::expand_sets({std::get<0>(inputs), mapped[0]}, ctx.sets),
                 detail::expand_sets({std::get<1>(inputs), mapped[1]}, ctx.sets), ctx);
  }
};

// ---- TransformerEncoder, TransformerDecoder, Transformer -----------------------------

template <class Impl>
  requires detail::in_list_v<Impl, detail::transformer_stacks_family>
struct runtime_layout<Impl> {
  static constexpr bool is_runtime_layout = true;
  // Every tensor belongs to a layer or the norm: none of its own.
  static std::vector<std::pair<std::string, at::Tensor*>> members(Impl&) { return {}; }
};

namespace detail {
// Layer i's params, typed as its schema.
template <class Layer>
TensorDict<schema_of<Layer>> layer_params(const AnyTensorDict& p, std::size_t i) {
  return p.get_tensordict("layers", std::to_string(i)).template to_typed<schema_of<Layer>>({.allow_missing = true});
}

// The stack's final norm: a LayerNorm through its functional form, a norm
// without tensors as it is; stacked_input: x has the sets in front.
inline at::Tensor coder_norm(torch::nn::AnyModule& norm, const AnyTensorDict& p, const at::Tensor& x, bool stacked_input,
                             const batch_context& ctx) {
  using torch::nn::LayerNormImpl;
  if (auto* layer_norm = dynamic_cast<LayerNormImpl*>(norm.ptr().get())) {
    const auto np = p.contains("norm") ? p.get_tensordict("norm").template to_typed<schema_of<LayerNormImpl>>({.allow_missing = true})
                                       : TensorDict<schema_of<LayerNormImpl>>();
    if (stacked_input) return batched<LayerNormImpl>::forward(*layer_norm, np, {x, true}, ctx).value;
    return functional<LayerNormImpl>::forward(*layer_norm, np, x);
  }
  if (norm.ptr()->parameters().empty() && norm.ptr()->buffers().empty()) return norm.forward(x);
  const torch::nn::Module& norm_module = *norm.ptr();  // typeid of a named object: clang warns on *call()
  throw module_error("tensordict::functional_call: the transformer stack's norm is a " +
                     c10::demangle(typeid(norm_module).name()) +
                     ", which has tensors but no functional form here; use a LayerNorm (or swap with to_module)");
}

inline bool coder_norm_lowered(const torch::nn::AnyModule& norm) {
  if (norm.is_empty()) return true;
  if (dynamic_cast<torch::nn::LayerNormImpl*>(norm.ptr().get())) return true;
  return norm.ptr()->parameters().empty() && norm.ptr()->buffers().empty();
}

template <class Layer>
bool layers_lowered(torch::nn::ModuleList& layers) {
  for (std::size_t i = 0; i < layers->size(); ++i)
    if (!batched<Layer>::supports(layers->at<Layer>(i))) return false;
  return true;
}

// The encoder or decoder of a Transformer (an AnyModule that may hold any module).
template <class Stack>
Stack& part_of(const torch::nn::AnyModule& part, const char* name) {
  auto* stack = part.is_empty() ? nullptr : dynamic_cast<Stack*>(part.ptr().get());
  if (!stack) {
    std::string found = "empty";
    if (!part.is_empty()) {
      const torch::nn::Module& module = *part.ptr();
      found = c10::demangle(typeid(module).name());
    }
    throw module_error(std::string("tensordict::functional_call: the Transformer's ") + name + " is " + found + ", not a " +
                       c10::demangle(typeid(Stack).name()) + "; swap it with to_module instead");
  }
  return *stack;
}
}  // namespace detail

template <>
struct functional<torch::nn::TransformerEncoderImpl> {
  static constexpr bool is_functional = true;
  using Impl = torch::nn::TransformerEncoderImpl;
  using Layer = torch::nn::TransformerEncoderLayerImpl;
  static at::Tensor forward(Impl& m, const AnyTensorDict& p, const at::Tensor& src, const at::Tensor& src_mask = {},
                            const at::Tensor& src_key_padding_mask = {}) {
    at::Tensor x = src;
    for (std::size_t i = 0; i < m.layers->size(); ++i)
      x = functional<Layer>::forward(m.layers->at<Layer>(i), detail::layer_params<Layer>(p, i), x, src_mask, src_key_padding_mask);
    return m.norm.is_empty() ? x : detail::coder_norm(m.norm, p, x, false, {});
  }
};

template <>
struct functional<torch::nn::TransformerDecoderImpl> {
  static constexpr bool is_functional = true;
  using Impl = torch::nn::TransformerDecoderImpl;
  using Layer = torch::nn::TransformerDecoderLayerImpl;
  static at::Tensor forward(Impl& m, const AnyTensorDict& p, const at::Tensor& tgt, const at::Tensor& memory,
                            const at::Tensor& tgt_mask = {}, const at::Tensor& memory_mask = {},
                            const at::Tensor& tgt_key_padding_mask = {}, const at::Tensor& memory_key_padding_mask = {}) {
    at::Tensor x = tgt;
    for (std::size_t i = 0; i < m.layers->size(); ++i)
      x = functional<Layer>::forward(m.layers->at<Layer>(i), detail::layer_params<Layer>(p, i), x, memory, tgt_mask,
                                     memory_mask, tgt_key_padding_mask, memory_key_padding_mask);
    return m.norm.is_empty() ? x : detail::coder_norm(m.norm, p, x, false, {});
  }
};

template <>
struct functional<torch::nn::TransformerImpl> {
  static constexpr bool is_functional = true;
  using Impl = torch::nn::TransformerImpl;
  static at::Tensor forward(Impl& m, const AnyTensorDict& p, const at::Tensor& src, const at::Tensor& tgt,
                            const at::Tensor& src_mask = {}, const at::Tensor& tgt_mask = {}, const at::Tensor& memory_mask = {},
                            const at::Tensor& src_key_padding_mask = {}, const at::Tensor& tgt_key_padding_mask = {},
                            const at::Tensor& memory_key_padding_mask = {}) {
    using torch::nn::TransformerDecoderImpl;
    using torch::nn::TransformerEncoderImpl;
    const at::Tensor memory = functional<TransformerEncoderImpl>::forward(
        detail::part_of<TransformerEncoderImpl>(m.encoder, "encoder"), p.get_tensordict("encoder"), src, src_mask,
        src_key_padding_mask);
    return functional<TransformerDecoderImpl>::forward(detail::part_of<TransformerDecoderImpl>(m.decoder, "decoder"),
                                                       p.get_tensordict("decoder"), tgt, memory, tgt_mask, memory_mask,
                                                       tgt_key_padding_mask, memory_key_padding_mask);
  }
};

// Their batched forms (without masks): params with the sets in front, the
// inputs shared or per set; the output with the sets in front.
template <>
struct batched<torch::nn::TransformerEncoderImpl> {
  static constexpr bool is_batched = true;
  using Impl = torch::nn::TransformerEncoderImpl;
  using Layer = torch::nn::TransformerEncoderLayerImpl;
  static bool supports(Impl& m) { return detail::layers_lowered<Layer>(m.layers) && detail::coder_norm_lowered(m.norm); }
  static at::Tensor run(Impl& m, const AnyTensorDict& p, const at::Tensor& src, const batch_context& ctx) {
    stacked x{src, true};
    for (std::size_t i = 0; i < m.layers->size(); ++i)
      x = batched<Layer>::forward(m.layers->at<Layer>(i), detail::layer_params<Layer>(p, i), x, ctx);
    return m.norm.is_empty() ? x.value : detail::coder_norm(m.norm, p, x.value, true, ctx);
  }
  static at::Tensor forward(Impl& m, const AnyTensorDict& p, const std::tuple<at::Tensor>& inputs, const std::array<bool, 1>& mapped,
                            const batch_context& ctx) {
    return run(m, p, detail::expand_sets({std::get<0>(inputs), mapped[0]}, ctx.sets), ctx);
  }
};

template <>
struct batched<torch::nn::TransformerDecoderImpl> {
  static constexpr bool is_batched = true;
  using Impl = torch::nn::TransformerDecoderImpl;
  using Layer = torch::nn::TransformerDecoderLayerImpl;
  static bool supports(Impl& m) { return detail::layers_lowered<Layer>(m.layers) && detail::coder_norm_lowered(m.norm); }
  static at::Tensor run(Impl& m, const AnyTensorDict& p, const at::Tensor& tgt, const at::Tensor& memory, const batch_context& ctx) {
    at::Tensor x = tgt;
    for (std::size_t i = 0; i < m.layers->size(); ++i)
      x = batched<Layer>::layer(m.layers->at<Layer>(i), detail::layer_params<Layer>(p, i), x, memory, ctx);
    return m.norm.is_empty() ? x : detail::coder_norm(m.norm, p, x, true, ctx);
  }
  static at::Tensor forward(Impl& m, const AnyTensorDict& p, const std::tuple<at::Tensor, at::Tensor>& inputs,
                            const std::array<bool, 2>& mapped, const batch_context& ctx) {
    return run(m, p, detail::expand_sets({std::get<0>(inputs), mapped[0]}, ctx.sets),
               detail::expand_sets({std::get<1>(inputs), mapped[1]}, ctx.sets), ctx);
  }
};

template <>
struct batched<torch::nn::TransformerImpl> {
  static constexpr bool is_batched = true;
  using Impl = torch::nn::TransformerImpl;
  using Encoder = torch::nn::TransformerEncoderImpl;
  using Decoder = torch::nn::TransformerDecoderImpl;
  static bool supports(Impl& m) {
    auto* encoder = m.encoder.is_empty() ? nullptr : dynamic_cast<Encoder*>(m.encoder.ptr().get());
    auto* decoder = m.decoder.is_empty() ? nullptr : dynamic_cast<Decoder*>(m.decoder.ptr().get());
    return encoder && decoder && batched<Encoder>::supports(*encoder) && batched<Decoder>::supports(*decoder);
  }
  static at::Tensor forward(Impl& m, const AnyTensorDict& p, const std::tuple<at::Tensor, at::Tensor>& inputs,
                            const std::array<bool, 2>& mapped, const batch_context& ctx) {
    const at::Tensor memory = batched<Encoder>::run(detail::part_of<Encoder>(m.encoder, "encoder"), p.get_tensordict("encoder"),
                                                    detail::expand_sets({std::get<0>(inputs), mapped[0]}, ctx.sets), ctx);
    return batched<Decoder>::run(detail::part_of<Decoder>(m.decoder, "decoder"), p.get_tensordict("decoder"),
                                 detail::expand_sets({std::get<1>(inputs), mapped[1]}, ctx.sets), memory, ctx);
  }
};

}  // namespace tensordict::nn
