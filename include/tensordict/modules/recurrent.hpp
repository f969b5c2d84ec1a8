// The adapters of the recurrent modules.
//   RNNCell, GRUCell, LSTMCell: schema {weight_ih, weight_hh, bias_ih,
//   bias_hh} (the biases unset with bias(false)); their functional forms call
//   the same ATen cell as their own forward, with the hidden state optional
//   (zeros) and unbatched inputs. No batched form yet: functional_vmap maps
//   them with vmap.
//   RNN, LSTM, GRU: their tensors are named by their options (weight_ih_l0,
//   bias_hh_l1_reverse, weight_hr_l0 with projections), so they have a
//   run-time layout, not a schema: from_module gives an AnyTensorDict, and
//   functional_call takes one. Their forward reads a cached list of the
//   weights (flat_weights_) beside the registry: a swap writes that list too,
//   so a swapped LSTM computes with the new weights, and puts it back.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ops/gru.h>
#include <ATen/ops/gru_cell.h>
#include <ATen/ops/lstm.h>
#include <ATen/ops/lstm_cell.h>
#include <ATen/ops/rnn_relu.h>
#include <ATen/ops/rnn_relu_cell.h>
#include <ATen/ops/rnn_tanh.h>
#include <ATen/ops/rnn_tanh_cell.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/modules/rnn.h>

#include "../any_tensordict.hpp"
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

// ---- RNN, LSTM, GRU -----------------------------------------------------------

namespace detail {
using recurrent_layers_family = type_list<torch::nn::RNNImpl, torch::nn::LSTMImpl, torch::nn::GRUImpl>;

// The weights list that the forward reads, and its names (protected members
// of RNNImplBase, named through a derived class).
template <class Impl>
struct rnn_access : torch::nn::detail::RNNImplBase<Impl> {
  static std::vector<at::Tensor>& flat_weights(torch::nn::detail::RNNImplBase<Impl>& m) {
    return m.*(&rnn_access::flat_weights_);
  }
  static const std::vector<std::string>& flat_names(const torch::nn::detail::RNNImplBase<Impl>& m) {
    return m.*(&rnn_access::flat_weights_names_);
  }
};

// params' tensors in the order of the module's weights list.
template <class Impl>
std::vector<at::Tensor> flat_weights_of(const Impl& m, const AnyTensorDict& params) {
  std::vector<at::Tensor> out;
  for (const auto& name : rnn_access<Impl>::flat_names(m)) out.push_back(params.get(name));
  return out;
}

// The input with a batch dim, whether it had one, and the batch size.
inline std::tuple<at::Tensor, bool, std::int64_t> sequence_batch(const at::Tensor& input, bool batch_first) {
  const std::int64_t batch_dim = batch_first ? 0 : 1;
  const bool batched = input.dim() == 3;
  at::Tensor x = batched ? input : input.unsqueeze(batch_dim);
  return {x, batched, x.size(batch_dim)};
}
}  // namespace detail

template <class Impl>
  requires detail::in_list_v<Impl, detail::recurrent_layers_family>
struct runtime_layout<Impl> {
  static constexpr bool is_runtime_layout = true;
  // The forward's own tensors are the entries of its weights list.
  static std::vector<std::pair<std::string, at::Tensor*>> members(Impl& m) {
    auto& weights = detail::rnn_access<Impl>::flat_weights(m);
    const auto& names = detail::rnn_access<Impl>::flat_names(m);
    std::vector<std::pair<std::string, at::Tensor*>> out;
    for (std::size_t i = 0; i < names.size() && i < weights.size(); ++i) out.emplace_back(names[i], &weights[i]);
    return out;
  }
};

namespace detail {
// RNN and GRU: (output, h_n) as their forward, from params keyed as their tensors.
template <class Impl>
std::tuple<at::Tensor, at::Tensor> rnn_layers_forward(const Impl& m, const AnyTensorDict& p, const at::Tensor& input,
                                                      const at::Tensor& hx) {
  const auto& o = m.options_base;
  auto [x, batched, batch] = sequence_batch(input, o.batch_first());
  const std::int64_t directions = o.bidirectional() ? 2 : 1;
  at::Tensor h = hx.defined() ? (batched ? hx : hx.unsqueeze(1))
                              : at::zeros({o.num_layers() * directions, batch, o.hidden_size()}, x.options());
  const auto weights = flat_weights_of(m, p);
  std::tuple<at::Tensor, at::Tensor> out;
  if constexpr (std::is_same_v<Impl, torch::nn::GRUImpl>)
    out = at::gru(x, h, weights, o.bias(), o.num_layers(), o.dropout(), m.is_training(), o.bidirectional(), o.batch_first());
  else if (::tensordict::detail::compat::get_if<torch::enumtype::kRNN_RELU>(&o.mode()))
    out = at::rnn_relu(x, h, weights, o.bias(), o.num_layers(), o.dropout(), m.is_training(), o.bidirectional(),
                       o.batch_first());
  else
    out = at::rnn_tanh(x, h, weights, o.bias(), o.num_layers(), o.dropout(), m.is_training(), o.bidirectional(),
                       o.batch_first());
  if (batched) return out;
  return {std::get<0>(out).squeeze(o.batch_first() ? 0 : 1), std::get<1>(out).squeeze(1)};
}
}  // namespace detail

// (Full specializations: a constrained one would make the compiler check the
// parameter-free form's constraint, which needs a schema these types lack.)
template <>
struct functional<torch::nn::RNNImpl> {
  static constexpr bool is_functional = true;
  static std::tuple<at::Tensor, at::Tensor> forward(const torch::nn::RNNImpl& m, const AnyTensorDict& p,
                                                    const at::Tensor& input, const at::Tensor& hx = {}) {
    return detail::rnn_layers_forward(m, p, input, hx);
  }
};

template <>
struct functional<torch::nn::GRUImpl> {
  static constexpr bool is_functional = true;
  static std::tuple<at::Tensor, at::Tensor> forward(const torch::nn::GRUImpl& m, const AnyTensorDict& p,
                                                    const at::Tensor& input, const at::Tensor& hx = {}) {
    return detail::rnn_layers_forward(m, p, input, hx);
  }
};

// LSTM: (output, (h_n, c_n)) as its forward; projections (proj_size) too.
template <>
struct functional<torch::nn::LSTMImpl> {
  static constexpr bool is_functional = true;
  using state = std::tuple<at::Tensor, at::Tensor>;
  static std::tuple<at::Tensor, state> forward(const torch::nn::LSTMImpl& m, const AnyTensorDict& p, const at::Tensor& input,
                                               const std::optional<state>& hx = std::nullopt) {
    const auto& o = m.options_base;
    auto [x, batched, batch] = detail::sequence_batch(input, o.batch_first());
    const std::int64_t layers = o.num_layers() * (o.bidirectional() ? 2 : 1);
    at::Tensor h, c;
    if (hx) {
      h = batched ? std::get<0>(*hx) : std::get<0>(*hx).unsqueeze(1);
      c = batched ? std::get<1>(*hx) : std::get<1>(*hx).unsqueeze(1);
    } else {
      h = at::zeros({layers, batch, o.proj_size() > 0 ? o.proj_size() : o.hidden_size()}, x.options());
      c = at::zeros({layers, batch, o.hidden_size()}, x.options());
    }
    auto [out, h1, c1] = at::lstm(x, {h, c}, detail::flat_weights_of(m, p), o.bias(), o.num_layers(), o.dropout(),
                                  m.is_training(), o.bidirectional(), o.batch_first());
    if (batched) return {out, {h1, c1}};
    return {out.squeeze(o.batch_first() ? 0 : 1), {h1.squeeze(1), c1.squeeze(1)}};
  }
};

}  // namespace tensordict::nn
