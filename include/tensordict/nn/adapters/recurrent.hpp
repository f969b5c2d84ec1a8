// The adapters of the recurrent modules.
//   RNNCell, GRUCell, LSTMCell: schema {weight_ih, weight_hh, bias_ih,
//   bias_hh} (the biases unset with bias(false)); their functional forms call
//   the same ATen cell as their own forward, with the hidden state optional
//   (zeros) and unbatched inputs; their batched forms take the input and
//   state of every set: one baddbmm for the input side, one for the hidden.
//   RNN, LSTM, GRU: their tensors are named by their options (weight_ih_l0,
//   bias_hh_l1_reverse, weight_hr_l0 with projections), so they have a
//   run-time layout, not a schema: from_module gives an AnyTensorDict, and
//   functional_call takes one. Their forward reads a cached list of the
//   weights (flat_weights_) beside the registry: a swap writes that list too,
//   so a swapped LSTM computes with the new weights, and puts it back.
//   Their batched forms run every set at once: one GEMM for the input
//   projections of all sets and time steps ([sets, T*B, in] x [sets, in,
//   gates]), then one bmm per time step for the recurrence. Where libtorch's
//   own forward is a fused kernel (an LSTM on libtorch 2.x with oneDNN on the
//   CPU, cuDNN) they run each set through it in turn instead (measured faster),
//   and functional_vmap's tasks put those loops on every core. In training
//   with dropout between layers functional_vmap loops over the sets itself.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <ATen/ops/addcmul.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/gru.h>
#include <ATen/ops/gru_cell.h>
#include <ATen/ops/lstm.h>
#include <ATen/ops/lstm_cell.h>
#include <ATen/ops/rnn_relu.h>
#include <ATen/ops/rnn_relu_cell.h>
#include <ATen/ops/rnn_tanh.h>
#include <ATen/ops/rnn_tanh_cell.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/rnn.h>

#include "../../any_tensordict.hpp"
#include "../../detail/compat.hpp"
#include "../../detail/kernels/fused_lstm_cell.hpp"
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
  TENSORDICT_MODULE_MEMBERS(Impl, TENSORDICT_MEMBER(Impl, weight_ih), TENSORDICT_MEMBER(Impl, weight_hh), \
                            TENSORDICT_MEMBER(Impl, bias_ih), TENSORDICT_MEMBER(Impl, bias_hh))
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

// ---- batched forms of RNN, LSTM, GRU ----------------------------------------------

namespace detail {
enum class recurrent_cell { lstm, gru, rnn_tanh, rnn_relu };

// One direction of one layer, as stacked tensors: weights [sets, gates, in],
// biases [sets, gates] (undefined without bias), the LSTM projection
// [sets, proj, hidden] (undefined without).
struct direction_weights {
  at::Tensor w_ih, w_hh, b_ih, b_hh, w_hr;
};

// tanh as 2 sigmoid(2x) - 1: libtorch's CPU tanh costs 4x a sigmoid per
// element (1.13: 78 us for 32k floats against 19 us), and the recurrence runs
// it at every step.
inline at::Tensor tanh_by_sigmoid(const at::Tensor& x) { return x.mul(2).sigmoid_().mul(2).sub_(1); }

// The biases an RNN or LSTM adds to its gates (GRU adds its hidden bias
// inside its reset gate instead): [sets, gates], undefined without bias.
inline at::Tensor gate_bias(recurrent_cell cell, const direction_weights& w) {
  if (cell == recurrent_cell::gru || !w.b_hh.defined()) return w.b_ih;
  return w.b_ih.defined() ? w.b_ih + w.b_hh : w.b_hh;
}

// The input projections of rows [sets, R, in], with the gate biases unless
// each step adds them (the fused LSTM step: then the projection is a bmm
// instead of a baddbmm, whose copy of the bias into every row of every step
// wrote the whole [sets, T*B, gates] once more).
inline at::Tensor input_projection(recurrent_cell cell, const direction_weights& w, const at::Tensor& rows,
                                   bool bias_in_steps = false) {
  const at::Tensor input_bias = cell == recurrent_cell::gru ? w.b_ih : bias_in_steps ? at::Tensor() : gate_bias(cell, w);
  const at::Tensor w_ih_t = w.w_ih.transpose(1, 2).contiguous();
  return input_bias.defined() ? at::baddbmm(input_bias.unsqueeze(1), rows, w_ih_t) : at::bmm(rows, w_ih_t);
}

// The hidden-side weights of one step, transposed once for every step's bmm
// (contiguous: a transposed view made each step's bmm 630 us instead of 430 us).
struct step_weights {
  at::Tensor w_hh_t, b_hh, w_hr_t;  // b_hh: GRU's hidden bias [sets, 1, gates], else undefined
  at::Tensor step_bias;             // the gate biases where each step adds them (see input_projection)
  step_weights(recurrent_cell cell, const direction_weights& w, bool bias_in_steps = false)
      : w_hh_t(w.w_hh.transpose(1, 2).contiguous()),
        b_hh(cell == recurrent_cell::gru && w.b_hh.defined() ? w.b_hh.unsqueeze(1) : at::Tensor()),
        w_hr_t(w.w_hr.defined() ? w.w_hr.transpose(1, 2).contiguous() : at::Tensor()),
        step_bias(bias_in_steps ? gate_bias(cell, w) : at::Tensor()) {}
};

// An LSTM step's element-wise part with libtorch's ops: (h, c) from the gate
// pre-activations [sets, B, 4H] and the previous c.
inline std::tuple<at::Tensor, at::Tensor> lstm_pointwise(const at::Tensor& gates, const at::Tensor& c_prev) {
  const auto sig = gates.sigmoid().chunk(4, 2);  // input, forget, (cell), output: one pass over all four
  const std::int64_t hidden = c_prev.size(2);
  at::Tensor c = at::addcmul(sig[1] * c_prev, sig[0], tanh_by_sigmoid(gates.narrow(2, 2 * hidden, hidden)));
  at::Tensor h = sig[3] * tanh_by_sigmoid(c);
  return {h, c};
}

// The fused kernel (detail/kernels/fused_lstm_cell.hpp) as an autograd function of
// (gx, gh, bias, c_prev) -> (h, c), the gates being gx + gh + bias [sets, 4H].
// Its backward is the fused kernel too; where a graph of the backward is asked
// for (create_graph), it differentiates lstm_pointwise on the saved inputs
// instead, so second derivatives stay exact.
struct fused_lstm_step : torch::autograd::Function<fused_lstm_step> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gx,
                                                const at::Tensor& gh, const at::Tensor& bias, const at::Tensor& c_prev) {
    at::Tensor saved;
    auto [h, c] = ::tensordict::detail::fused_lstm::forward(gx, gh, bias, c_prev, &saved);
    ctx->save_for_backward({gx, gh, bias, c_prev});
    ctx->saved_data["activations"] = saved;
    // No gradient at all (the engine passing through a graph whose gradients
    // were computed elsewhere: detail/kernels/parallel_sets.hpp) computes nothing.
    ctx->set_materialize_grads(false);
    return {h, c};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto inputs = ctx->get_saved_variables();
    if (!grads[0].defined() && !grads[1].defined()) return torch::autograd::variable_list(4);
    if (at::GradMode::is_enabled()) {
      std::vector<at::Tensor> wrt;
      for (const auto& t : inputs)
        if (t.defined() && t.requires_grad()) wrt.push_back(t);
      const at::Tensor& bias = inputs[2];
      const at::Tensor gates = bias.defined() ? inputs[0] + inputs[1] + bias.unsqueeze(1) : inputs[0] + inputs[1];
      auto [h, c] = lstm_pointwise(gates, inputs[3]);
      const auto zero_if_none = [](const at::Tensor& g, const at::Tensor& like) { return g.defined() ? g : at::zeros_like(like); };
      const auto d = torch::autograd::grad({h, c}, wrt, {zero_if_none(grads[0], h), zero_if_none(grads[1], c)},
                                           /*retain_graph=*/true, /*create_graph=*/true, /*allow_unused=*/true);
      torch::autograd::variable_list out(4);
      for (std::size_t k = 0, next = 0; k < 4; ++k)
        if (inputs[k].defined() && inputs[k].requires_grad()) out[k] = d[next++];
      return out;
    }
    const at::Tensor activations = ctx->saved_data["activations"].toTensor();
    const auto given = [&](const at::Tensor& g, const at::Tensor& like) { return g.defined() ? g : at::zeros_like(like); };
    auto [d_gates, d_c_prev] = ::tensordict::detail::fused_lstm::backward(given(grads[0], inputs[3]), given(grads[1], inputs[3]),
                                                                           activations, inputs[3]);
    const at::Tensor d_bias = ctx->needs_input_grad(2) ? d_gates.sum(1) : at::Tensor();
    return {d_gates, d_gates, d_bias, d_c_prev};
  }
};

// One step of the recurrence from the step's input projection gx [sets, B, gates]: (h, c) -> (h, c).
inline void recurrent_step(recurrent_cell cell, const step_weights& w, const at::Tensor& gx, at::Tensor& h, at::Tensor& c) {
  switch (cell) {
    case recurrent_cell::lstm: {
      if (::tensordict::detail::fused_lstm::applies(gx, h, c)) {
        const at::Tensor gh = at::bmm(h, w.w_hh_t);
        const at::Tensor& bias = w.step_bias;
        const bool records = at::GradMode::is_enabled() && (gx.requires_grad() || gh.requires_grad() ||
                                                            (bias.defined() && bias.requires_grad()) || c.requires_grad());
        if (records) {
          // libtorch 1.13's Function::apply takes defined tensors only: no bias is a zero one.
          const auto hc = fused_lstm_step::apply(gx, gh, bias.defined() ? bias : at::zeros({gx.size(0), gx.size(2)}, gx.options()), c);
          h = hc[0];
          c = hc[1];
        } else {
          std::tie(h, c) = ::tensordict::detail::fused_lstm::forward(gx, gh, bias, c, nullptr);
        }
      } else {
        const at::Tensor input_side = w.step_bias.defined() ? gx + w.step_bias.unsqueeze(1) : gx;
        std::tie(h, c) = lstm_pointwise(at::baddbmm(input_side, h, w.w_hh_t), c);
      }
      if (w.w_hr_t.defined()) h = at::bmm(h, w.w_hr_t);
      break;
    }
    case recurrent_cell::gru: {
      const auto gh = (w.b_hh.defined() ? at::baddbmm(w.b_hh, h, w.w_hh_t) : at::bmm(h, w.w_hh_t)).chunk(3, 2);
      const auto gi = gx.chunk(3, 2);
      const at::Tensor reset = (gi[0] + gh[0]).sigmoid(), update = (gi[1] + gh[1]).sigmoid();
      const at::Tensor candidate = tanh_by_sigmoid(gi[2] + reset * gh[2]);
      h = candidate + update * (h - candidate);
      break;
    }
    case recurrent_cell::rnn_tanh: h = tanh_by_sigmoid(at::baddbmm(gx, h, w.w_hh_t)); break;
    case recurrent_cell::rnn_relu: h = at::baddbmm(gx, h, w.w_hh_t).relu(); break;
  }
}

// Runs one direction over the sequence x [sets, T, B, in] from (h, c)
// [sets, B, .]: the outputs [sets, T, B, h] and the last (h, c).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> run_direction(recurrent_cell cell, const direction_weights& w,
                                                                     const at::Tensor& x, at::Tensor h, at::Tensor c,
                                                                     bool reverse) {
  const std::int64_t sets = x.size(0), steps = x.size(1), batch = x.size(2);
  const bool bias_in_steps = cell == recurrent_cell::lstm && ::tensordict::detail::fused_lstm::applies(x, h, c);
  const at::Tensor gates_x = input_projection(cell, w, x.reshape({sets, steps * batch, x.size(3)}), bias_in_steps);
  // One slice per step up front: a select per step would give each step's
  // gradient as a zero-filled tensor of the whole sequence.
  const std::vector<at::Tensor> step_gates = gates_x.view({sets, steps, batch, -1}).unbind(1);
  const step_weights hidden_side(cell, w, bias_in_steps);
  std::vector<at::Tensor> outputs(static_cast<std::size_t>(steps));
  for (std::int64_t s = 0; s < steps; ++s) {
    const std::int64_t t = reverse ? steps - 1 - s : s;
    recurrent_step(cell, hidden_side, step_gates[static_cast<std::size_t>(t)], h, c);
    outputs[static_cast<std::size_t>(t)] = h;
  }
  return {at::stack(outputs, 1), h, c};
}

template <class Impl>
recurrent_cell cell_of(const Impl& m) {
  if constexpr (std::is_same_v<Impl, torch::nn::LSTMImpl>) return recurrent_cell::lstm;
  else if constexpr (std::is_same_v<Impl, torch::nn::GRUImpl>) return recurrent_cell::gru;
  else if (::tensordict::detail::compat::get_if<torch::enumtype::kRNN_RELU>(&m.options_base.mode())) return recurrent_cell::rnn_relu;
  else return recurrent_cell::rnn_tanh;
}

// An LSTM's (h, c) input, given as is or as an optional; nullptr when absent.
template <class State>
const std::tuple<at::Tensor, at::Tensor>* lstm_state(const State& state) {
  if constexpr (requires { state.has_value(); })
    return state ? &*state : nullptr;
  else
    return &state;
}

// A shared or per-set value with the sets dim in front.
inline at::Tensor with_sets(const at::Tensor& t, bool mapped, std::int64_t sets) {
  return expand_sets({t, mapped}, sets);
}

// The stacked forward of every layer and direction: input [sets, ...] as the
// module's input, states [sets, layers*dirs, B, .] (undefined: zeros).
// Returns (output, h_n, c_n) with the sets in front, shaped as the module's.
template <class Impl>
std::tuple<at::Tensor, at::Tensor, at::Tensor> recurrent_batched(const Impl& m, const AnyTensorDict& p,
                                                                 const at::Tensor& input, at::Tensor h0, at::Tensor c0) {
  const auto& o = m.options_base;
  const std::int64_t sets = input.size(0);
  const bool batched = input.dim() == 4;
  // Time-major with a batch dim: [sets, T, B, in].
  at::Tensor x = !batched ? input.unsqueeze(2) : o.batch_first() ? input.transpose(1, 2) : input;
  const std::int64_t batch = x.size(2), directions = o.bidirectional() ? 2 : 1;
  const std::int64_t out_size = o.proj_size() > 0 ? o.proj_size() : o.hidden_size();
  if (h0.defined() && !batched) h0 = h0.unsqueeze(2);
  if (c0.defined() && !batched) c0 = c0.unsqueeze(2);
  const auto get = [&](const std::string& name) { return p.contains(name) ? p.get(name) : at::Tensor(); };
  const recurrent_cell cell = cell_of(m);
  std::vector<at::Tensor> h_n, c_n;
  for (std::int64_t layer = 0; layer < o.num_layers(); ++layer) {
    std::vector<at::Tensor> outs;
    for (std::int64_t d = 0; d < directions; ++d) {
      const std::string suffix = "_l" + std::to_string(layer) + (d == 1 ? "_reverse" : "");
      const direction_weights w{get("weight_ih" + suffix), get("weight_hh" + suffix), get("bias_ih" + suffix),
                                get("bias_hh" + suffix), get("weight_hr" + suffix)};
      const std::int64_t k = layer * directions + d;
      at::Tensor h = h0.defined() ? h0.select(1, k) : at::zeros({sets, batch, out_size}, x.options());
      at::Tensor c = cell != recurrent_cell::lstm ? at::Tensor()
                     : c0.defined()               ? c0.select(1, k)
                                                  : at::zeros({sets, batch, o.hidden_size()}, x.options());
      auto [out, h_last, c_last] = run_direction(cell, w, x, h, c, d == 1);
      outs.push_back(out);
      h_n.push_back(h_last);
      if (c_last.defined()) c_n.push_back(c_last);
    }
    x = directions == 1 ? outs[0] : at::cat(outs, 3);
  }
  at::Tensor output = !batched ? x.squeeze(2) : o.batch_first() ? x.transpose(1, 2) : x;
  at::Tensor h = at::stack(h_n, 1), c = c_n.empty() ? at::Tensor() : at::stack(c_n, 1);
  if (!batched) {
    h = h.squeeze(2);
    if (c.defined()) c = c.squeeze(2);
  }
  return {output, h, c};
}

// The same as recurrent_batched, each set through libtorch's own forward in turn.
template <class Impl>
std::tuple<at::Tensor, at::Tensor, at::Tensor> recurrent_per_set(const Impl& m, const AnyTensorDict& p,
                                                                 const at::Tensor& input, const at::Tensor& h0,
                                                                 const at::Tensor& c0) {
  std::vector<at::Tensor> outputs, h, c;
  for (std::int64_t s = 0; s < input.size(0); ++s) {
    const AnyTensorDict own = p[s];
    if constexpr (std::is_same_v<Impl, torch::nn::LSTMImpl>) {
      using state = functional<torch::nn::LSTMImpl>::state;
      auto [y, hc] = functional<Impl>::forward(m, own, input[s], h0.defined() ? std::optional<state>(state{h0[s], c0[s]})
                                                                              : std::nullopt);
      outputs.push_back(y);
      h.push_back(std::get<0>(hc));
      c.push_back(std::get<1>(hc));
    } else {
      auto [y, h_n] = functional<Impl>::forward(m, own, input[s], h0.defined() ? h0[s] : at::Tensor());
      outputs.push_back(y);
      h.push_back(h_n);
    }
  }
  return {at::stack(outputs), at::stack(h), c.empty() ? at::Tensor() : at::stack(c)};
}
}  // namespace detail

// The batched forms of the run-time layout types: forward(module, stacked
// params, inputs, mapped, context) takes the call's inputs (input, and the
// state when given) with whether each has the sets in front, and gives the
// module's outputs with the sets in front.
template <class Impl>
  requires detail::in_list_v<Impl, detail::recurrent_layers_family>
struct batched<Impl> {
  static constexpr bool is_batched = true;
  static bool supports(const Impl& m) {
    return !(m.is_training() && m.options_base.dropout() > 0);  // dropout between layers draws per set
  }
  // Where libtorch's own forward is one fused kernel (oneDNN's LSTM on libtorch 2.x's CPU, cuDNN's), the
  // sets go through it one at a time, as the members' own forwards do: the decomposition measured
  // slower than that kernel (libtorch 2.6, oneDNN, 8 LSTMs 32-128x2 on 50x32: per set 40.7 ms,
  // decomposed 62.3 ms; 1.13 has no such kernel: 100.6 / 91.2 ms). functional_vmap's parallel tasks
  // run such loops on every core: oneDNN's RNN gave the same values and gradients, to the last bit,
  // with two threads calling it at once (8 LSTMs of 4 shapes, forward and backward, 30 rounds),
  // which its convolution did not (nn/functional_vmap.hpp).
  static bool per_set(const Impl& m) {
    const auto own = m.parameters();
    if (own.empty()) return false;
    bool onednn_lstm = false;  // as libtorch's use_mkldnn: float32 or bfloat16, no projections
    if constexpr (std::is_same_v<Impl, torch::nn::LSTMImpl>)
      onednn_lstm = at::hasMKLDNN() && at::globalContext().userEnabledMkldnn() && m.options_base.proj_size() == 0 &&
                    (own.front().scalar_type() == at::kFloat || own.front().scalar_type() == at::kBFloat16);
    return ::tensordict::detail::compat::fused_recurrent_kernel(own.front().is_cuda(), onednn_lstm);
  }

  template <class... Inputs>
  static auto forward(const Impl& m, const AnyTensorDict& p, const std::tuple<Inputs...>& inputs,
                      const std::array<bool, sizeof...(Inputs)>& mapped, const batch_context& ctx) {
    const at::Tensor input = detail::with_sets(std::get<0>(inputs), mapped[0], ctx.sets);
    at::Tensor h0, c0;
    if constexpr (sizeof...(Inputs) == 2) {
      const auto& state = std::get<1>(inputs);
      if constexpr (std::is_same_v<Impl, torch::nn::LSTMImpl>) {
        if (const auto* hc = detail::lstm_state(state)) {
          h0 = detail::with_sets(std::get<0>(*hc), mapped[1], ctx.sets);
          c0 = detail::with_sets(std::get<1>(*hc), mapped[1], ctx.sets);
        }
      } else if (state.defined()) {
        h0 = detail::with_sets(state, mapped[1], ctx.sets);
      }
    }
    auto [output, h, c] = per_set(m) ? detail::recurrent_per_set(m, p, input, h0, c0)
                                     : detail::recurrent_batched(m, p, input, h0, c0);
    if constexpr (std::is_same_v<Impl, torch::nn::LSTMImpl>)
      return std::tuple<at::Tensor, std::tuple<at::Tensor, at::Tensor>>{output, {h, c}};
    else
      return std::tuple<at::Tensor, at::Tensor>{output, h};
  }
};

// ---- batched forms of the cells ---------------------------------------------------

// Inputs (input[, state]), each shared or per set; the outputs as the
// functional form's with the sets in front: one baddbmm for the input
// projection, one for the hidden side.
template <class Impl>
  requires detail::in_list_v<Impl, detail::recurrent_family>
struct batched<Impl> {
  static constexpr bool is_batched = true;
  static constexpr bool is_lstm = std::is_same_v<Impl, torch::nn::LSTMCellImpl>;

  template <class... Inputs>
    requires(sizeof...(Inputs) >= 1 && sizeof...(Inputs) <= 2)
  static auto forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const std::tuple<Inputs...>& inputs,
                      const std::array<bool, sizeof...(Inputs)>& mapped, const batch_context& ctx) {
    const at::Tensor input = detail::with_sets(std::get<0>(inputs), mapped[0], ctx.sets);
    const bool unbatched = input.dim() == 2;  // [sets, in]
    auto rows = [&](const at::Tensor& t) { return unbatched ? t.unsqueeze(1) : t; };
    auto unrows = [&](const at::Tensor& t) { return unbatched ? t.squeeze(1) : t; };
    const at::Tensor x = rows(input);  // [sets, B, in]
    const std::int64_t hidden = m.options.hidden_size();
    at::Tensor h, c;
    if constexpr (sizeof...(Inputs) == 2) {
      const auto& state = std::get<1>(inputs);
      if constexpr (is_lstm) {
        if (const auto* hc = detail::lstm_state(state)) {
          h = rows(detail::with_sets(std::get<0>(*hc), mapped[1], ctx.sets));
          c = rows(detail::with_sets(std::get<1>(*hc), mapped[1], ctx.sets));
        }
      } else if (state.defined()) {
        h = rows(detail::with_sets(state, mapped[1], ctx.sets));
      }
    }
    if (!h.defined()) h = at::zeros({ctx.sets, x.size(1), hidden}, x.options());
    if (is_lstm && !c.defined()) c = at::zeros_like(h);
    const detail::recurrent_cell cell = cell_of(m);
    const detail::direction_weights w{p.leaf(0), p.leaf(1), p.leaf(2), p.leaf(3), at::Tensor()};
    detail::recurrent_step(cell, detail::step_weights(cell, w), detail::input_projection(cell, w, x), h, c);
    if constexpr (is_lstm)
      return std::tuple<at::Tensor, at::Tensor>{unrows(h), unrows(c)};
    else
      return unrows(h);
  }

  // In a chain (RNNCell, GRUCell): the input alone, from a zero state.
  static stacked forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const stacked& x, const batch_context& ctx)
    requires(!is_lstm)
  {
    return {forward(m, p, std::make_tuple(x.value), std::array<bool, 1>{x.mapped}, ctx), true};
  }

 private:
  static detail::recurrent_cell cell_of(const Impl& m) {
    if constexpr (is_lstm) return detail::recurrent_cell::lstm;
    else if constexpr (std::is_same_v<Impl, torch::nn::GRUCellImpl>) return detail::recurrent_cell::gru;
    else if (::tensordict::detail::compat::get_if<torch::enumtype::kReLU>(&m.options.nonlinearity())) return detail::recurrent_cell::rnn_relu;
    else return detail::recurrent_cell::rnn_tanh;
  }
};

}  // namespace tensordict::nn
