// The adapters of CosineSimilarity and PairwiseDistance: no tensors (an
// empty schema); their functional form is their own forward of two inputs;
// their batched form takes the two inputs, each shared or per set, with the
// sets in front of both (dims counted from the front move past them).
#pragma once

#include <array>
#include <cstdint>
#include <tuple>

#include <ATen/ops/cosine_similarity.h>
#include <torch/nn/modules/distance.h>

#include "adapter.hpp"

namespace tensordict::nn {

namespace detail {
using distance_family = type_list<torch::nn::CosineSimilarityImpl, torch::nn::PairwiseDistanceImpl>;

// Two inputs with the sets in front and as many dims each, so that each
// set's pair broadcasts as the pair would alone.
inline std::array<at::Tensor, 2> sets_in_front(const std::tuple<at::Tensor, at::Tensor>& inputs,
                                                const std::array<bool, 2>& mapped, std::int64_t sets) {
  std::array<at::Tensor, 2> v{expand_sets({std::get<0>(inputs), mapped[0]}, sets),
                              expand_sets({std::get<1>(inputs), mapped[1]}, sets)};
  const std::int64_t dims = std::max(v[0].dim(), v[1].dim());
  for (auto& t : v)
    while (t.dim() < dims) t = t.unsqueeze(1);
  return v;
}
}  // namespace detail

template <class Impl>
  requires detail::in_list_v<Impl, detail::distance_family>
struct module_traits<Impl> {
  using members = member_list<>;
};

template <class Impl>
  requires detail::in_list_v<Impl, detail::distance_family>
struct batched<Impl> {
  static constexpr bool is_batched = true;
  static at::Tensor forward(Impl& m, const TensorDict<schema<>>&, const std::tuple<at::Tensor, at::Tensor>& inputs,
                            const std::array<bool, 2>& mapped, const batch_context& ctx) {
    const auto [a, b] = detail::sets_in_front(inputs, mapped, ctx.sets);
    if constexpr (std::is_same_v<Impl, torch::nn::CosineSimilarityImpl>)
      return at::cosine_similarity(a, b, past_sets(m.options.dim(), true), m.options.eps());
    else
      return m.forward(a, b);  // over the last dim
  }
};

}  // namespace tensordict::nn
