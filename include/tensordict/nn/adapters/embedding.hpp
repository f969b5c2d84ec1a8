// The adapters of torch::nn::Embedding and torch::nn::EmbeddingBag: schema
// {weight}, functional forms, and batched forms without max_norm or
// padding_idx: Embedding one gather, EmbeddingBag one embedding_bag over the
// sets' tables laid end to end (each set's indices shifted to its table, its
// bags after the previous set's).
#pragma once

#include <array>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>

#include <torch/nn/functional/embedding.h>
#include <torch/nn/modules/embedding.h>

#include "adapter.hpp"

namespace tensordict::nn {

namespace detail {
using embedding_family = type_list<torch::nn::EmbeddingImpl, torch::nn::EmbeddingBagImpl>;
}  // namespace detail

TENSORDICT_MODULE_MEMBERS(torch::nn::EmbeddingImpl, TENSORDICT_MEMBER(torch::nn::EmbeddingImpl, weight))
TENSORDICT_MODULE_MEMBERS(torch::nn::EmbeddingBagImpl, TENSORDICT_MEMBER(torch::nn::EmbeddingBagImpl, weight))

template <>
struct functional<torch::nn::EmbeddingImpl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const torch::nn::EmbeddingImpl& m, const TensorDict<schema_of<torch::nn::EmbeddingImpl>>& p,
                            const at::Tensor& x) {
    const auto& o = m.options;
    return torch::nn::functional::detail::embedding(x, p.leaf(0), o.padding_idx(), o.max_norm(), o.norm_type(),
                                                    o.scale_grad_by_freq(), o.sparse());
  }
};

template <>
struct batched<torch::nn::EmbeddingImpl> {
  static constexpr bool is_batched = true;
  // max_norm renormalizes rows in place and padding_idx keeps a row's gradient at zero: those go through vmap.
  static bool supports(const torch::nn::EmbeddingImpl& m) {
    return !m.options.max_norm().has_value() && !m.options.padding_idx().has_value();
  }
  static stacked forward(const torch::nn::EmbeddingImpl&, const TensorDict<schema_of<torch::nn::EmbeddingImpl>>& p,
                         const stacked& x, const batch_context& ctx) {
    const at::Tensor& w = p.leaf(0);  // [sets, num, dim]
    const std::int64_t dim = w.size(2);
    if (!x.mapped) {
      std::vector<std::int64_t> shape{ctx.sets};
      shape.insert(shape.end(), x.value.sizes().begin(), x.value.sizes().end());
      shape.push_back(dim);
      return {w.index_select(1, x.value.reshape({-1})).view(shape), true};
    }
    at::Tensor flat = x.value.reshape({ctx.sets, -1});  // [sets, k]
    at::Tensor picked = w.gather(1, flat.unsqueeze(-1).expand({ctx.sets, flat.size(1), dim}));
    std::vector<std::int64_t> shape(x.value.sizes().begin(), x.value.sizes().end());
    shape.push_back(dim);
    return {picked.view(shape), true};
  }
};

template <>
struct functional<torch::nn::EmbeddingBagImpl> {
  static constexpr bool is_functional = true;
  using Impl = torch::nn::EmbeddingBagImpl;
  static at::Tensor forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const at::Tensor& input,
                            const at::Tensor& offsets = {}, const at::Tensor& per_sample_weights = {}) {
    const auto& o = m.options;
    return torch::nn::functional::detail::embedding_bag(input, p.leaf(0), offsets, o.max_norm(), o.norm_type(),
                                                        o.scale_grad_by_freq(), o.mode(), o.sparse(), per_sample_weights,
                                                        o.include_last_offset(), o.padding_idx());
  }
};

// Inputs (input[, offsets[, per_sample_weights]]), each shared or per set.
template <>
struct batched<torch::nn::EmbeddingBagImpl> {
  static constexpr bool is_batched = true;
  using Impl = torch::nn::EmbeddingBagImpl;
  // max_norm renormalizes rows in place, padding_idx is one row of one table,
  // and a sparse gradient does not pass the tables' reshape: those loop.
  static bool supports(const Impl& m) {
    return !m.options.max_norm().has_value() && !m.options.padding_idx().has_value() && !m.options.sparse();
  }

  template <class... Inputs>
    requires(sizeof...(Inputs) <= 3 && (std::is_same_v<Inputs, at::Tensor> && ...))
  static at::Tensor forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const std::tuple<Inputs...>& inputs,
                            const std::array<bool, sizeof...(Inputs)>& mapped, const batch_context& ctx) {
    const auto& o = m.options;
    const std::int64_t sets = ctx.sets;
    const at::Tensor& w = p.leaf(0);  // [sets, num, dim]
    const std::int64_t num = w.size(1), dim = w.size(2);
    auto input_at = [&](auto k) -> at::Tensor {
      if constexpr (k < sizeof...(Inputs))
        return std::get<k>(inputs).defined() ? detail::expand_sets({std::get<k>(inputs), mapped[k]}, sets) : at::Tensor();
      else
        return at::Tensor();
    };
    const at::Tensor input = input_at(std::integral_constant<std::size_t, 0>{});
    at::Tensor offsets = input_at(std::integral_constant<std::size_t, 1>{});
    at::Tensor weights = input_at(std::integral_constant<std::size_t, 2>{});
    // Set s's indices point into its table, rows s*num.. of the tables laid end to end.
    std::vector<std::int64_t> shift_shape(static_cast<std::size_t>(input.dim()), 1);
    shift_shape[0] = sets;
    const at::Tensor shifted = input + at::arange(sets, input.options()).mul_(num).view(shift_shape);
    at::Tensor indices, bag_offsets;
    std::int64_t bags = 0;
    if (input.dim() == 3) {  // [sets, B, L]: fixed-length bags
      bags = input.size(1);
      indices = shifted.reshape({sets * bags, input.size(2)});
      if (weights.defined()) weights = weights.reshape({sets * bags, input.size(2)});
    } else {  // [sets, n] with offsets [sets, bags(+1)]: set s's bags start after set s-1's n indices
      const std::int64_t n = input.size(1);
      indices = shifted.reshape({-1});
      if (weights.defined()) weights = weights.reshape({-1});
      at::Tensor starts = offsets + at::arange(sets, offsets.options()).mul_(n).unsqueeze(1);
      if (o.include_last_offset()) starts = starts.narrow(1, 0, starts.size(1) - 1);
      bags = starts.size(1);
      bag_offsets = starts.reshape({-1});
      if (o.include_last_offset()) bag_offsets = at::cat({bag_offsets, at::full({1}, sets * n, bag_offsets.options())});
    }
    const at::Tensor out = torch::nn::functional::detail::embedding_bag(
        indices, w.reshape({sets * num, dim}), bag_offsets, o.max_norm(), o.norm_type(), o.scale_grad_by_freq(), o.mode(),
        o.sparse(), weights, o.include_last_offset(), o.padding_idx());  // (max_norm, padding_idx: none, sparse: false)
    return out.view({sets, bags, dim});
  }
  // In a chain: fixed-length bags.
  static stacked forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const stacked& x, const batch_context& ctx) {
    return {forward(m, p, std::make_tuple(x.value), std::array<bool, 1>{x.mapped}, ctx), true};
  }
};

}  // namespace tensordict::nn
