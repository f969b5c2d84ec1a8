// The adapters of the convolutions: Conv1d/2d/3d and ConvTranspose1d/2d/3d, schema
// {weight, bias}; functional forms for all (with the padding modes); their
// batched form is one grouped convolution, the sets as groups.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <ATen/ops/conv_transpose1d.h>
#include <ATen/ops/conv_transpose2d.h>
#include <ATen/ops/conv_transpose3d.h>
#include <ATen/ops/stack.h>
#include <torch/nn/functional/conv.h>
#include <torch/nn/functional/padding.h>
#include <torch/nn/modules/conv.h>

#include "../../detail/compat.hpp"
#include "../../errors.hpp"

#include "adapter.hpp"

namespace tensordict::nn {

namespace detail {
using conv_family = type_list<torch::nn::Conv1dImpl, torch::nn::Conv2dImpl, torch::nn::Conv3dImpl,
                              torch::nn::ConvTranspose1dImpl, torch::nn::ConvTranspose2dImpl, torch::nn::ConvTranspose3dImpl>;
}  // namespace detail

TENSORDICT_MODULE_WEIGHT_BIAS(torch::nn::Conv1dImpl)
TENSORDICT_MODULE_WEIGHT_BIAS(torch::nn::Conv2dImpl)
TENSORDICT_MODULE_WEIGHT_BIAS(torch::nn::Conv3dImpl)
TENSORDICT_MODULE_WEIGHT_BIAS(torch::nn::ConvTranspose1dImpl)
TENSORDICT_MODULE_WEIGHT_BIAS(torch::nn::ConvTranspose2dImpl)
TENSORDICT_MODULE_WEIGHT_BIAS(torch::nn::ConvTranspose3dImpl)

namespace detail {
// A convolution's spatial dims, and the convolution of that many dims.
template <class Impl>
inline constexpr std::size_t conv_dims =
    std::is_same_v<Impl, torch::nn::Conv1dImpl> || std::is_same_v<Impl, torch::nn::ConvTranspose1dImpl>   ? 1
    : std::is_same_v<Impl, torch::nn::Conv2dImpl> || std::is_same_v<Impl, torch::nn::ConvTranspose2dImpl> ? 2
                                                                                                            : 3;
template <class Impl>
inline constexpr bool is_transposed_conv = std::is_same_v<Impl, torch::nn::ConvTranspose1dImpl> ||
                                           std::is_same_v<Impl, torch::nn::ConvTranspose2dImpl> ||
                                           std::is_same_v<Impl, torch::nn::ConvTranspose3dImpl>;
template <class Impl, class Padding>
at::Tensor conv_nd(const Impl& m, const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                   const Padding& padding, std::int64_t groups) {
  namespace F = torch::nn::functional;
  const auto& o = m.options;
  if constexpr (conv_dims<Impl> == 1)
    return F::detail::conv1d(input, weight, bias, o.stride(), padding, o.dilation(), groups);
  else if constexpr (conv_dims<Impl> == 2)
    return F::detail::conv2d(input, weight, bias, o.stride(), padding, o.dilation(), groups);
  else
    return F::detail::conv3d(input, weight, bias, o.stride(), padding, o.dilation(), groups);
}

// The transposed convolution as forward(input) without output_size: the options' output_padding.
template <class Impl>
at::Tensor conv_transpose_nd(const Impl& m, const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                             std::int64_t groups) {
  const auto& o = m.options;
  constexpr std::size_t dims = conv_dims<Impl>;
  const auto& padding = ::tensordict::detail::compat::get<torch::ExpandingArray<dims>>(o.padding());
  if constexpr (dims == 1)
    return at::conv_transpose1d(input, weight, bias, o.stride(), padding, o.output_padding(), groups, o.dilation());
  else if constexpr (dims == 2)
    return at::conv_transpose2d(input, weight, bias, o.stride(), padding, o.output_padding(), groups, o.dilation());
  else
    return at::conv_transpose3d(input, weight, bias, o.stride(), padding, o.output_padding(), groups, o.dilation());
}
}  // namespace detail

template <class Impl>
  requires std::is_same_v<Impl, torch::nn::Conv1dImpl> || std::is_same_v<Impl, torch::nn::Conv2dImpl> ||
           std::is_same_v<Impl, torch::nn::Conv3dImpl>
struct functional<Impl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const at::Tensor& x) {
    namespace F = torch::nn::functional;
    const auto& o = m.options;
    auto conv = [&](const at::Tensor& input, const auto& padding) {
      return detail::conv_nd(m, input, p.leaf(0), p.leaf(1), padding, o.groups());
    };
    if (::tensordict::detail::compat::get_if<torch::enumtype::kZeros>(&o.padding_mode())) return conv(x, o.padding());
    F::PadFuncOptions::mode_t mode = torch::kReflect;
    if (::tensordict::detail::compat::get_if<torch::enumtype::kReplicate>(&o.padding_mode())) mode = torch::kReplicate;
    if (::tensordict::detail::compat::get_if<torch::enumtype::kCircular>(&o.padding_mode())) mode = torch::kCircular;
    constexpr std::size_t dims = detail::conv_dims<Impl>;
    const auto* padding = ::tensordict::detail::compat::get_if<torch::ExpandingArray<dims>>(&o.padding());
    if (!padding)
      throw module_error("tensordict::functional_call: a convolution with padding_mode other than zeros needs explicit "
                         "padding sizes (padding=same or valid is not supported there)");
    std::vector<std::int64_t> pad_sizes;  // F::pad wants the last dim first, each size twice
    for (std::size_t d = dims; d-- > 0;) pad_sizes.insert(pad_sizes.end(), 2, (*padding)->at(d));
    return conv(F::pad(x, F::PadFuncOptions(pad_sizes).mode(mode)), torch::ExpandingArray<dims>(0));
  }
};

template <class Impl>
  requires detail::is_transposed_conv<Impl>
struct functional<Impl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const at::Tensor& x) {
    if (!::tensordict::detail::compat::get_if<torch::enumtype::kZeros>(&m.options.padding_mode()))
      throw module_error("tensordict::functional_call: a transposed convolution supports only zero padding, as libtorch's own");
    return detail::conv_transpose_nd(m, x, p.leaf(0), p.leaf(1), m.options.groups());
  }
};

namespace detail {
// A stacked input [sets, N, C, ...] (or one shared [N, C, ...]) as one batch
// of sets*C channels, [N, sets*C, ...]; an unbatched one gets N = 1.
inline at::Tensor sets_as_channels(const stacked& x, std::int64_t sets, bool unbatched) {
  if (x.mapped) {
    at::Tensor v = unbatched ? x.value.unsqueeze(1) : x.value;
    std::vector<std::int64_t> shape{v.size(1), sets * v.size(2)};
    shape.insert(shape.end(), v.sizes().begin() + 3, v.sizes().end());
    return v.transpose(0, 1).reshape(shape);
  }
  at::Tensor v = unbatched ? x.value.unsqueeze(0) : x.value;
  std::vector<std::int64_t> repeats(static_cast<std::size_t>(v.dim()), 1);
  repeats[1] = sets;
  return v.repeat(repeats);
}

// An input of sets * C channels in channels-last memory, where libtorch has
// that format (2-d and 3-d): its convolution's output comes out channels-last
// too, and the pooling after it runs several times faster (libtorch 1.13's
// max_pool2d: 2.3 ms for [64, 128, 26, 26] channels-last, 27 ms contiguous).
// The values are the same.
inline at::Tensor channels_last(const at::Tensor& input) {
  // Only libtorch 1.x: 2.6's oneDNN gave grouped convolutions of one input channel per group that differ from
  // the contiguous ones (tests/test_functional_vmap.cpp).
  if (::tensordict::detail::compat::torch_major >= 2) return input;
  if (input.dim() != 4 && input.dim() != 5) return input;
  const auto format = input.dim() == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::ChannelsLast3d;
  at::Tensor out = input.contiguous(format);
  if (out.suggest_memory_format() == format) return out;
  // One channel (or one pixel): the same memory either way; strides that say
  // channels-last make the convolution's output channels-last.
  std::vector<std::int64_t> strides(static_cast<std::size_t>(out.dim()));
  std::int64_t stride = 1;
  strides[1] = 1;
  stride *= out.size(1);
  for (std::int64_t d = out.dim() - 1; d >= 2; --d) {
    strides[static_cast<std::size_t>(d)] = stride;
    stride *= out.size(d);
  }
  strides[0] = stride;
  return out.as_strided(out.sizes(), strides);
}

// The inverse: [N, sets*C, ...] as [sets, N, C, ...] (unbatched: [sets, C, ...]).
inline at::Tensor channels_as_sets(const at::Tensor& y, std::int64_t sets, bool unbatched) {
  std::vector<std::int64_t> shape{y.size(0), sets, y.size(1) / sets};
  shape.insert(shape.end(), y.sizes().begin() + 2, y.sizes().end());
  at::Tensor out = y.view(shape).transpose(0, 1);
  return unbatched ? out.squeeze(1) : out;
}
}  // namespace detail

// Every convolution: one grouped convolution, the sets as groups (a
// transposed one's weight is [in, out/groups, ...]: the sets stack its in
// channels, as they stack a convolution's out channels).
template <class Impl>
  requires detail::in_list_v<Impl, detail::conv_family>
struct batched<Impl> {
  static constexpr bool is_batched = true;
  static bool supports(const Impl& m) {
    return ::tensordict::detail::compat::get_if<torch::enumtype::kZeros>(&m.options.padding_mode()) != nullptr;
  }
  // One grouped convolution: the sets become groups.
  static stacked forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const stacked& x, const batch_context& ctx) {
    const at::Tensor& w = p.leaf(0);  // [sets, out, in/groups, kernel...] (transposed: [sets, in, out/groups, kernel...])
    const bool unbatched = x.value.dim() - (x.mapped ? 1 : 0) == static_cast<std::int64_t>(detail::conv_dims<Impl>) + 1;
    std::vector<std::int64_t> weight_shape{ctx.sets * w.size(1)};
    weight_shape.insert(weight_shape.end(), w.sizes().begin() + 2, w.sizes().end());
    const at::Tensor weight = w.reshape(weight_shape);
    const at::Tensor bias = p.leaf(1).defined() ? p.leaf(1).reshape({-1}) : at::Tensor();
    at::Tensor y;
    if constexpr (!detail::is_transposed_conv<Impl>)
      if (!x.mapped && m.options.groups() == 1) {
        if (::tensordict::detail::compat::torch_major < 2) {
          // A shared input meets every set's filters in one convolution of sets * out channels (no copies of the
          // input). Only libtorch 1.x: on 2.6 the first layer's weight gradients came out different from the loop's.
          y = detail::conv_nd(m, detail::channels_last(unbatched ? x.value.unsqueeze(0) : x.value), weight, bias,
                              m.options.padding(), 1);
          return {detail::channels_as_sets(y, ctx.sets, unbatched), true, true};
        }
        // On 2.x, each set's own convolution of the shared input, stacked: a grouped convolution of the input
        // repeated per set took 3x the members' backward where each group has one input channel (the CNN config's
        // first layer: 9.4 ms against 8 x 0.38).
        std::vector<at::Tensor> each;
        each.reserve(static_cast<std::size_t>(ctx.sets));
        for (std::int64_t s = 0; s < ctx.sets; ++s)
          each.push_back(detail::conv_nd(m, x.value, w[s], p.leaf(1).defined() ? p.leaf(1)[s] : at::Tensor(),
                                         m.options.padding(), 1));
        return {at::stack(each), true, true};
      }
    const at::Tensor input = detail::channels_last(detail::sets_as_channels(x, ctx.sets, unbatched));
    const std::int64_t groups = ctx.sets * m.options.groups();
    if constexpr (detail::is_transposed_conv<Impl>)
      y = detail::conv_transpose_nd(m, input, weight, bias, groups);
    else
      y = detail::conv_nd(m, input, weight, bias, m.options.padding(), groups);
    return {detail::channels_as_sets(y, ctx.sets, unbatched), true, true};
  }
};

}  // namespace tensordict::nn
