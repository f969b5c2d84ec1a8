// The adapters of the padding modules: Reflection, Replication, Zero and
// Constant padding, 1-3d. No tensors (an empty schema); their functional
// form is their own forward; their batched form folds the sets into the
// batch or the channels (one padding call for every set).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include <torch/nn/modules/padding.h>

#include "../../detail/compat.hpp"

#include "adapter.hpp"

namespace tensordict::nn {

namespace detail {
using padding_family =
    type_list<torch::nn::ReflectionPad1dImpl, torch::nn::ReflectionPad2dImpl, torch::nn::ReflectionPad3dImpl,
              torch::nn::ReplicationPad1dImpl, torch::nn::ReplicationPad2dImpl, torch::nn::ReplicationPad3dImpl,
              torch::nn::ConstantPad1dImpl, torch::nn::ConstantPad2dImpl, torch::nn::ConstantPad3dImpl,
#if TENSORDICT_HAS_TORCH_2_2_MODULES
              torch::nn::ZeroPad1dImpl, torch::nn::ZeroPad3dImpl,
#endif
              torch::nn::ZeroPad2dImpl>;
}  // namespace detail

template <class Impl>
  requires detail::in_list_v<Impl, detail::padding_family>
struct module_traits<Impl> {
  using members = member_list<>;
};

namespace detail {
template <std::size_t D, class T>
std::integral_constant<std::int64_t, static_cast<std::int64_t>(D / 2)> padded_dims(const torch::ExpandingArray<D, T>*);  // a size before and after each dim
template <class Impl>
inline constexpr std::int64_t padded_dims_v =
    decltype(padded_dims(std::declval<std::remove_reference_t<decltype(std::declval<Impl&>().options.padding())>*>()))::value;
}  // namespace detail

// Each channel padded on its own: the sets fold into the batch, or into the channels of a convolution's output.
template <class Impl>
  requires detail::in_list_v<Impl, detail::padding_family>
struct batched<Impl> : channel_wise_batched<Impl, detail::padded_dims_v<Impl> + 2> {};

}  // namespace tensordict::nn
