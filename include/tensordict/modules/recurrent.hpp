// The adapters of the recurrent cells: RNNCell, GRUCell and LSTMCell, schema
// {weight_ih, weight_hh, bias_ih, bias_hh} (the biases unset with
// bias(false)); their functional forms call the same ATen cell as their own
// forward, with the hidden state optional (zeros) and unbatched inputs. They
// have no batched form yet: functional_vmap maps them with vmap.
#pragma once

#include <optional>
#include <tuple>
#include <type_traits>

#include <ATen/ops/gru_cell.h>
#include <ATen/ops/lstm_cell.h>
#include <ATen/ops/rnn_relu_cell.h>
#include <ATen/ops/rnn_tanh_cell.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/modules/rnn.h>

#include "../detail/compat.hpp"
#include "adapter.hpp"

namespace tensordict::nn {

namespace detail {
using recurrent_family = type_list<torch::nn::RNNCellImpl, torch::nn::GRUCellImpl, torch::nn::LSTMCellImpl>;

// A cell's input as a batch of rows, and its hidden state (zeros when not given).
inline std::tuple<at::Tensor, at::Tensor, bool> cell_batch(const at::Tensor& input, const at::Tensor& hx,
                                                           std::int64_t hidden_size) {
  const bool batched = input.dim() == 2;
  at::Tensor rows = batched ? input : input.unsqueeze(0);
  at::Tensor h = hx.defined() ? (batched ? hx : hx.unsqueeze(0)) : at::zeros({rows.size(0), hidden_size}, rows.options());
  return {rows, h, batched};
}
}  // namespace detail

#define TENSORDICT_DETAIL_CELL(Impl)                                                                          \
  TENSORDICT_DETAIL_TENSORS(Impl, TENSORDICT_DETAIL_TENSOR(Impl, weight_ih), TENSORDICT_DETAIL_TENSOR(Impl, weight_hh), \
                            TENSORDICT_DETAIL_TENSOR(Impl, bias_ih), TENSORDICT_DETAIL_TENSOR(Impl, bias_hh))
TENSORDICT_DETAIL_CELL(torch::nn::RNNCellImpl)
TENSORDICT_DETAIL_CELL(torch::nn::GRUCellImpl)
TENSORDICT_DETAIL_CELL(torch::nn::LSTMCellImpl)
#undef TENSORDICT_DETAIL_CELL

template <class Impl>
  requires std::is_same_v<Impl, torch::nn::RNNCellImpl> || std::is_same_v<Impl, torch::nn::GRUCellImpl>
struct functional<Impl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const at::Tensor& input,
                            const at::Tensor& hx = {}) {
    auto [rows, h, batched] = detail::cell_batch(input, hx, m.options.hidden_size());
    at::Tensor out;
    if constexpr (std::is_same_v<Impl, torch::nn::GRUCellImpl>)
      out = at::gru_cell(rows, h, p.leaf(0), p.leaf(1), p.leaf(2), p.leaf(3));
    else if (::tensordict::detail::compat::get_if<torch::enumtype::kTanh>(&m.options.nonlinearity()))
      out = at::rnn_tanh_cell(rows, h, p.leaf(0), p.leaf(1), p.leaf(2), p.leaf(3));
    else
      out = at::rnn_relu_cell(rows, h, p.leaf(0), p.leaf(1), p.leaf(2), p.leaf(3));
    return batched ? out : out.squeeze(0);
  }
};

template <>
struct functional<torch::nn::LSTMCellImpl> {
  static constexpr bool is_functional = true;
  // (h, c) as LSTMCellImpl::forward; hx is (h, c) or nothing (zeros).
  static std::tuple<at::Tensor, at::Tensor> forward(const torch::nn::LSTMCellImpl& m,
                                                    const TensorDict<schema_of<torch::nn::LSTMCellImpl>>& p,
                                                    const at::Tensor& input,
                                                    const std::optional<std::tuple<at::Tensor, at::Tensor>>& hx = std::nullopt) {
    auto [rows, h, batched] = detail::cell_batch(input, hx ? std::get<0>(*hx) : at::Tensor(), m.options.hidden_size());
    at::Tensor c = hx ? (batched ? std::get<1>(*hx) : std::get<1>(*hx).unsqueeze(0)) : at::zeros_like(h);
    auto [h1, c1] = at::lstm_cell(rows, {h, c}, p.leaf(0), p.leaf(1), p.leaf(2), p.leaf(3));
    if (batched) return {h1, c1};
    return {h1.squeeze(0), c1.squeeze(0)};
  }
};

}  // namespace tensordict::nn
