// The adapters of the pooling modules: Max, Avg, AdaptiveMax, AdaptiveAvg and
// LP pooling 1-3d, MaxUnpool 1-3d and FractionalMaxPool 2-3d. No tensors
// (an empty schema); their functional form is their own forward; their
// batched forms fold the sets into the batch dim (one pooling call for every
// set). FractionalMaxPool draws its pooling regions at random, per set or
// shared as functional_vmap's randomness says.
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "parameter_free.hpp"  // random_batched

#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ops/rand.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/modules/pooling.h>

#include "../../detail/compat.hpp"
#include "../../detail/config.hpp"
#include "../../errors.hpp"

#include "adapter.hpp"

namespace tensordict::nn {

namespace detail {
using fractional_pooling_family = type_list<torch::nn::FractionalMaxPool2dImpl, torch::nn::FractionalMaxPool3dImpl>;
using unpooling_family = type_list<torch::nn::MaxUnpool1dImpl, torch::nn::MaxUnpool2dImpl, torch::nn::MaxUnpool3dImpl>;
using sample_pooling_family =
    type_list<torch::nn::MaxPool1dImpl, torch::nn::MaxPool2dImpl, torch::nn::MaxPool3dImpl, torch::nn::AvgPool1dImpl,
              torch::nn::AvgPool2dImpl, torch::nn::AvgPool3dImpl, torch::nn::AdaptiveMaxPool1dImpl,
              torch::nn::AdaptiveMaxPool2dImpl, torch::nn::AdaptiveMaxPool3dImpl, torch::nn::AdaptiveAvgPool1dImpl,
              torch::nn::AdaptiveAvgPool2dImpl, torch::nn::AdaptiveAvgPool3dImpl, torch::nn::LPPool1dImpl,
#if TENSORDICT_HAS_TORCH_2_2_MODULES
              torch::nn::LPPool3dImpl,
#endif
              torch::nn::LPPool2dImpl>;
// Each window's max of a ReLU's output is the ReLU of its max (sequential.hpp runs the ReLU after).
template <>
inline constexpr bool relu_commutes_v<torch::nn::MaxPool1dImpl> = true;
template <>
inline constexpr bool relu_commutes_v<torch::nn::MaxPool2dImpl> = true;
template <>
inline constexpr bool relu_commutes_v<torch::nn::MaxPool3dImpl> = true;
using pooling_family = typename concat_lists<sample_pooling_family, unpooling_family, fractional_pooling_family>::type;
}  // namespace detail

namespace detail {
// FractionalMaxPool's given pooling regions: its options' tensor, which it registers as the buffer "_random_samples".
struct given_random_samples {
  template <class Impl>
  at::Tensor& operator()(Impl& m) const {
    return m.options._random_samples();
  }
};
}  // namespace detail

template <class Impl>
  requires detail::in_list_v<Impl, detail::sample_pooling_family> || detail::in_list_v<Impl, detail::unpooling_family>
struct module_traits<Impl> {
  using members = member_list<>;
};
// {_random_samples}: unset unless the options give the pooling regions.
template <class Impl>
  requires detail::in_list_v<Impl, detail::fractional_pooling_family>
struct module_traits<Impl> {
  using members = member_list<member<"_random_samples", detail::given_random_samples>>;
};

namespace detail {
// The spatial dims of a pooling or padding type, from its options' sizes (an ExpandingArray<D>): unevaluated.
template <std::size_t D, class T>
std::integral_constant<std::int64_t, static_cast<std::int64_t>(D)> expanding_size(const torch::ExpandingArray<D, T>*);
template <class Array>
inline constexpr std::int64_t expanding_size_v = decltype(expanding_size(std::declval<Array*>()))::value;
template <class Impl>
constexpr std::int64_t pooled_dims() {
  using options = decltype(std::declval<Impl&>().options);
  if constexpr (requires(options& o) { o.kernel_size(); })
    return expanding_size_v<std::remove_reference_t<decltype(std::declval<options&>().kernel_size())>>;
  else
    return expanding_size_v<std::remove_reference_t<decltype(std::declval<options&>().output_size())>>;
}
}  // namespace detail

namespace detail {
// Whether an adaptive average pooling averages each channel to one number (global average pooling).
template <class Impl>
bool averages_to_one(const Impl& m) {
  if constexpr (in_list_v<Impl, type_list<torch::nn::AdaptiveAvgPool1dImpl, torch::nn::AdaptiveAvgPool2dImpl,
                                          torch::nn::AdaptiveAvgPool3dImpl>>) {
    for (const auto& size : *m.options.output_size()) {
      if constexpr (requires { size.has_value(); }) {
        if (!size.has_value() || *size != 1) return false;
      } else if (size != 1) {
        return false;
      }
    }
    return true;
  } else {
    return false;
  }
}
}  // namespace detail

namespace detail {
// MaxPool2d's forward by the library's kernel where it takes the value (contiguous memory, as libtorch 2.x's lowered
// convolutions leave it), else by the module's own.
TENSORDICT_DECL at::Tensor max_pool2d(torch::nn::MaxPool2dImpl& m, const at::Tensor& v);
}  // namespace detail

// Each channel pooled on its own: the sets fold into the batch, or into the channels of a convolution's output.
// Global average pooling is a sum over the pooled dims and one division, on the value as it lies: its backward
// broadcasts the gradient, where libtorch's mean materializes a contiguous one, which then meets a channels-last
// activation's saved input (libtorch 1.13's threshold_backward on [64, 256, 11, 11]: 2.8 ms with both
// channels-last or the gradient broadcast, 27 ms with the gradient contiguous).
template <class Impl>
  requires detail::in_list_v<Impl, detail::sample_pooling_family>
struct batched<Impl> {
  static constexpr bool is_batched = true;
  static constexpr std::int64_t pooled = detail::pooled_dims<Impl>();
  static stacked forward(Impl& m, const TensorDict<schema<>>& p, const stacked& x, const batch_context& ctx) {
    // Inputs libtorch refuses (other dims, no numbers to average) go to its own forward, which says why.
    const std::int64_t dims_per_set = x.value.dim() - (x.mapped ? 1 : 0);
    if (detail::averages_to_one(m) && (dims_per_set == pooled + 1 || dims_per_set == pooled + 2)) {
      std::vector<std::int64_t> dims;
      std::int64_t count = 1;
      for (std::int64_t d = 1; d <= pooled; ++d) {
        dims.push_back(-d);
        count *= x.value.size(-d);
      }
      if (count > 0) return {x.value.sum(dims, /*keepdim=*/true).div(count), x.mapped};
    }
    if constexpr (std::is_same_v<Impl, torch::nn::MaxPool2dImpl>)
      return fold_sets_channel_wise(x, pooled + 2, [&](const at::Tensor& v) { return detail::max_pool2d(m, v); });
    return channel_wise_batched<Impl, pooled + 2>::forward(m, p, x, ctx);
  }
};

// (input, indices), each shared or per set: one unpooling of the sets folded into the batch dim.
template <class Impl>
  requires detail::in_list_v<Impl, detail::unpooling_family>
struct batched<Impl> {
  static constexpr bool is_batched = true;
  static at::Tensor forward(Impl& m, const TensorDict<schema<>>&, const std::tuple<at::Tensor, at::Tensor>& inputs,
                            const std::array<bool, 2>& mapped, const batch_context& ctx) {
    const at::Tensor x = expand_sets({std::get<0>(inputs), mapped[0]}, ctx.sets);
    const at::Tensor indices = expand_sets({std::get<1>(inputs), mapped[1]}, ctx.sets);
    const at::Tensor y = m.forward(x.flatten(0, 1), indices.flatten(0, 1));
    return y.unflatten(0, {ctx.sets, y.size(0) / ctx.sets});
  }
};

namespace detail {
template <class Impl>
at::Tensor fractional_max_pool(Impl& m, const at::Tensor& x, const at::Tensor& samples) {
  auto options = m.options;
  options._random_samples(samples);
  if constexpr (std::is_same_v<Impl, torch::nn::FractionalMaxPool2dImpl>)
    return torch::nn::functional::fractional_max_pool2d(x, options);
  else
    return torch::nn::functional::fractional_max_pool3d(x, options);
}
}  // namespace detail

// The module's forward, with the TensorDict's pooling regions where it has them (else a draw).
template <class Impl>
  requires detail::in_list_v<Impl, detail::fractional_pooling_family>
struct functional<Impl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(Impl& m, const TensorDict<schema_of<Impl>>& p, const at::Tensor& x) {
    return detail::fractional_max_pool(m, x, p.leaf(0));
  }
};

template <class Impl>
  requires detail::in_list_v<Impl, detail::fractional_pooling_family>
struct batched<Impl> {
  static constexpr bool is_batched = true;
  static constexpr std::int64_t dims = std::is_same_v<Impl, torch::nn::FractionalMaxPool2dImpl> ? 2 : 3;

  // One draw of the pooling regions of a value of this shape, as libtorch draws them: [batch, C, dims].
  static at::Tensor draw(const at::Tensor& v) {
    const std::int64_t batch = v.dim() == dims + 1 ? 1 : v.size(0);
    return at::rand({batch, v.size(-dims - 1), dims}, v.options());
  }
  // The pooling of [sets, ...] folded into dim 0, with `samples` [sets, batch, C, dims] (each set's regions).
  static at::Tensor pool_folded(Impl& m, const at::Tensor& v, const at::Tensor& samples) {
    const std::int64_t sets = v.size(0);
    const bool unbatched = v.dim() - 1 == dims + 1;  // [C, spatial...] per set: the sets fold into the channels
    const at::Tensor folded = unbatched ? samples.reshape({1, -1, dims}) : samples.flatten(0, 1);
    const at::Tensor y = detail::fractional_max_pool(m, v.flatten(0, 1), folded);
    return y.unflatten(0, {sets, y.size(0) / sets});
  }

  static stacked forward(Impl& m, const TensorDict<schema_of<Impl>>& p, const stacked& x, const batch_context& ctx) {
    const at::Tensor& given = p.leaf(0);  // [sets, batch, C, dims]: no draw
    if (given.defined()) return {pool_folded(m, expand_sets(x, ctx.sets), given), true};
    const auto own = [&](const at::Tensor& v) { return detail::fractional_max_pool(m, v, at::Tensor()); };
    return random_batched<Impl>(x, ctx, own, [&](const at::Tensor& v) {
      const at::Tensor one = draw(v.select(0, 0));
      return pool_folded(m, v, one.unsqueeze(0).expand({v.size(0), one.size(0), one.size(1), one.size(2)}));
    });
  }
};

}  // namespace tensordict::nn

#if TENSORDICT_DEFINITIONS
#include <array>

#include "../../detail/kernels/max_pool_planes.hpp"

namespace tensordict::nn::detail {
TENSORDICT_DECL at::Tensor max_pool2d(torch::nn::MaxPool2dImpl& m, const at::Tensor& v) {
  const auto& o = m.options;
  std::array<::tensordict::detail::pooling_axis, 2> axes{};
  for (std::size_t d = 0; d < 2; ++d)
    axes[d] = {(*o.kernel_size())[d], (*o.stride())[d], (*o.padding())[d], (*o.dilation())[d]};
  if (auto y = ::tensordict::detail::max_pool2d_planes(v, axes, o.ceil_mode())) return *std::move(y);
  return m.forward(v);
}
}  // namespace tensordict::nn::detail
#endif  // TENSORDICT_DEFINITIONS
