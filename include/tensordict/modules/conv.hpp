// The adapters of the convolutions: Conv1d/2d/3d and ConvTranspose1d/2d/3d, schema
// {weight, bias}; functional forms for all (with the padding modes);
// Conv2d's batched form is one grouped convolution, the sets as groups.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <ATen/ops/conv2d.h>
#include <ATen/ops/conv_transpose1d.h>
#include <ATen/ops/conv_transpose2d.h>
#include <ATen/ops/conv_transpose3d.h>
#include <torch/nn/functional/conv.h>
#include <torch/nn/functional/padding.h>
#include <torch/nn/modules/conv.h>

#include "../detail/compat.hpp"
#include "../errors.hpp"

#include "adapter.hpp"

namespace tensordict::nn {

namespace detail {
using conv_family = type_list<torch::nn::Conv1dImpl, torch::nn::Conv2dImpl, torch::nn::Conv3dImpl,
                              torch::nn::ConvTranspose1dImpl, torch::nn::ConvTranspose2dImpl, torch::nn::ConvTranspose3dImpl>;
}  // namespace detail

TENSORDICT_DETAIL_WEIGHT_BIAS(torch::nn::Conv1dImpl)
TENSORDICT_DETAIL_WEIGHT_BIAS(torch::nn::Conv2dImpl)
TENSORDICT_DETAIL_WEIGHT_BIAS(torch::nn::Conv3dImpl)
TENSORDICT_DETAIL_WEIGHT_BIAS(torch::nn::ConvTranspose1dImpl)
TENSORDICT_DETAIL_WEIGHT_BIAS(torch::nn::ConvTranspose2dImpl)
TENSORDICT_DETAIL_WEIGHT_BIAS(torch::nn::ConvTranspose3dImpl)

template <class Impl>
  requires std::is_same_v<Impl, torch::nn::Conv1dImpl> || std::is_same_v<Impl, torch::nn::Conv2dImpl> ||
           std::is_same_v<Impl, torch::nn::Conv3dImpl>
struct functional<Impl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const at::Tensor& x) {
    namespace F = torch::nn::functional;
    const auto& o = m.options;
    auto conv = [&](const at::Tensor& input, const auto& padding) {
      if constexpr (std::is_same_v<Impl, torch::nn::Conv1dImpl>)
        return F::detail::conv1d(input, p.leaf(0), p.leaf(1), o.stride(), padding, o.dilation(), o.groups());
      else if constexpr (std::is_same_v<Impl, torch::nn::Conv2dImpl>)
        return F::detail::conv2d(input, p.leaf(0), p.leaf(1), o.stride(), padding, o.dilation(), o.groups());
      else
        return F::detail::conv3d(input, p.leaf(0), p.leaf(1), o.stride(), padding, o.dilation(), o.groups());
    };
    if (::tensordict::detail::compat::get_if<torch::enumtype::kZeros>(&o.padding_mode())) return conv(x, o.padding());
    F::PadFuncOptions::mode_t mode = torch::kReflect;
    if (::tensordict::detail::compat::get_if<torch::enumtype::kReplicate>(&o.padding_mode())) mode = torch::kReplicate;
    if (::tensordict::detail::compat::get_if<torch::enumtype::kCircular>(&o.padding_mode())) mode = torch::kCircular;
    constexpr std::size_t dims = std::is_same_v<Impl, torch::nn::Conv1dImpl> ? 1 : std::is_same_v<Impl, torch::nn::Conv2dImpl> ? 2 : 3;
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
  requires std::is_same_v<Impl, torch::nn::ConvTranspose1dImpl> || std::is_same_v<Impl, torch::nn::ConvTranspose2dImpl> ||
           std::is_same_v<Impl, torch::nn::ConvTranspose3dImpl>
struct functional<Impl> {
  static constexpr bool is_functional = true;
  // As forward(input) without output_size: the options' output_padding.
  static at::Tensor forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const at::Tensor& x) {
    const auto& o = m.options;
    if (!::tensordict::detail::compat::get_if<torch::enumtype::kZeros>(&o.padding_mode()))
      throw module_error("tensordict::functional_call: a transposed convolution supports only zero padding, as libtorch's own");
    constexpr std::size_t dims = std::is_same_v<Impl, torch::nn::ConvTranspose1dImpl>   ? 1
                                 : std::is_same_v<Impl, torch::nn::ConvTranspose2dImpl> ? 2
                                                                                          : 3;
    const auto& padding = ::tensordict::detail::compat::get<torch::ExpandingArray<dims>>(o.padding());
    if constexpr (dims == 1)
      return at::conv_transpose1d(x, p.leaf(0), p.leaf(1), o.stride(), padding, o.output_padding(), o.groups(), o.dilation());
    else if constexpr (dims == 2)
      return at::conv_transpose2d(x, p.leaf(0), p.leaf(1), o.stride(), padding, o.output_padding(), o.groups(), o.dilation());
    else
      return at::conv_transpose3d(x, p.leaf(0), p.leaf(1), o.stride(), padding, o.output_padding(), o.groups(), o.dilation());
  }
};

template <>
struct batched<torch::nn::Conv2dImpl> {
  static constexpr bool is_batched = true;
  static bool supports(const torch::nn::Conv2dImpl& m) {
    return ::tensordict::detail::compat::get_if<torch::enumtype::kZeros>(&m.options.padding_mode()) != nullptr;
  }
  // One grouped convolution: the sets become groups.
  static stacked forward(const torch::nn::Conv2dImpl& m, const TensorDict<schema_of<torch::nn::Conv2dImpl>>& p,
                         const stacked& x, const batch_context& ctx) {
    const auto& o = m.options;
    const std::int64_t sets = ctx.sets, groups = o.groups();
    const at::Tensor& w = p.leaf(0);  // [sets, out, in/groups, kh, kw]
    const bool unbatched = x.value.dim() == (x.mapped ? 4 : 3);
    at::Tensor input = expand_input(x, sets, unbatched);  // [N, sets*C, H, W]
    at::Tensor weight = w.reshape({sets * w.size(1), w.size(2), w.size(3), w.size(4)});
    at::Tensor bias = p.leaf(1).defined() ? p.leaf(1).reshape({-1}) : at::Tensor();
    at::Tensor y = torch::nn::functional::detail::conv2d(input, weight, bias, o.stride(), o.padding(), o.dilation(),
                                                         sets * groups);
    y = y.view({y.size(0), sets, w.size(1), y.size(2), y.size(3)}).transpose(0, 1);  // [sets, N, out, H', W']
    if (unbatched) y = y.squeeze(1);
    return {y, true};
  }

 private:
  static at::Tensor expand_input(const stacked& x, std::int64_t sets, bool unbatched) {
    if (x.mapped) {
      at::Tensor v = unbatched ? x.value.unsqueeze(1) : x.value;  // [sets, N, C, H, W]
      return v.transpose(0, 1).reshape({v.size(1), sets * v.size(2), v.size(3), v.size(4)});
    }
    at::Tensor v = unbatched ? x.value.unsqueeze(0) : x.value;  // [N, C, H, W]
    return v.repeat({1, sets, 1, 1});
  }
};

}  // namespace tensordict::nn
