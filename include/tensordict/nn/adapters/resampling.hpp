// The adapters of the modules that resample or rearrange pixels: Upsample,
// PixelShuffle, PixelUnshuffle, Fold and Unfold. No tensors (an empty
// schema); their functional form is their own forward; their batched form
// folds the sets into dim 0 (one call for every set: a batch of samples, or
// an unbatched sample's channels, keeps its order).
#pragma once

#include <type_traits>

#include <torch/nn/modules/fold.h>
#include <torch/nn/modules/pixelshuffle.h>
#include <torch/nn/modules/upsampling.h>

#include "adapter.hpp"

namespace tensordict::nn {

namespace detail {
using resampling_family = type_list<torch::nn::UpsampleImpl, torch::nn::PixelShuffleImpl, torch::nn::PixelUnshuffleImpl,
                                    torch::nn::FoldImpl, torch::nn::UnfoldImpl>;
}  // namespace detail

template <class Impl>
  requires detail::in_list_v<Impl, detail::resampling_family>
struct module_traits<Impl> {
  using members = member_list<>;
};

// Upsample's input is always batched, and it scales each channel on its own.
template <>
struct batched<torch::nn::UpsampleImpl> : channel_wise_batched<torch::nn::UpsampleImpl, -1> {};
template <class Impl>
  requires detail::in_list_v<Impl, detail::resampling_family> && (!std::is_same_v<Impl, torch::nn::UpsampleImpl>)
struct batched<Impl> : sample_wise_batched<Impl> {};

}  // namespace tensordict::nn
