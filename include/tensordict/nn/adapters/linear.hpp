// The adapters of torch::nn::Linear (schema {weight, bias}, functional form
// at::linear, batched form a detail::linear_run, else one GEMM or baddbmm for every set) and
// torch::nn::Bilinear ({weight, bias}, functional form at::bilinear of its two
// inputs).
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "adapter.hpp"

#include <cstdint>
#include <vector>

#include <ATen/ops/bilinear.h>
#include <ATen/ops/linear.h>
#include <torch/nn/modules/linear.h>

#include "../../detail/config.hpp"

namespace tensordict::nn {

namespace detail {
using linear_family = type_list<torch::nn::LinearImpl, torch::nn::BilinearImpl>;

// A run of Linears, each maybe followed by a ReLU, lowered as one autograd
// node where detail/kernels/batched_gemm.hpp's kernels take the tensors (float32 CPU
// tensors, a CPU with AVX2 and FMA): each layer's products on the library's
// kernel where its sets are small, else one BLAS call per set (the members'
// own GEMMs), with the bias, the ReLU and their backward in the library's
// passes. A typed or run-time Sequential gathers its children into one (add,
// add_relu) and runs it where a child does not join; a lone Linear is a run of one.
class linear_run {
 public:
  TENSORDICT_DECL linear_run(const stacked& x, std::int64_t sets);
  // Whether runs take these params (float32 CPU tensors on a CPU with AVX2 and FMA).
  TENSORDICT_DECL static bool takes(const std::vector<at::Tensor>& params);
  // Whether the run takes this Linear's params (w [sets, out, in], b [sets, out] or undefined) next.
  TENSORDICT_DECL bool add(const at::Tensor& w, const at::Tensor& b);
  // Whether the run takes a ReLU next (after a Linear without one).
  bool add_relu() {
    if (relu_.empty() || relu_.back()) return false;
    relu_.back() = 1;
    return true;
  }
  bool empty() const { return relu_.empty(); }
  // The run's output, [sets, ..., out] with the input's middle dims.
  TENSORDICT_DECL stacked run() const;
  // The input as [sets, rows, in], or [rows, in] where the sets share it.
  const at::Tensor& flat_input() const { return flat_; }
  // [sets, rows, out] -> [sets, ..., out] with the input's middle dims.
  TENSORDICT_DECL stacked shaped(const at::Tensor& y) const;

 private:
  stacked x_;
  std::int64_t sets_, rows_ = 0, width_ = 0;
  at::Tensor flat_;                    // x as [sets, rows, in] or shared [rows, in]
  std::vector<at::Tensor> tensors_;    // w, b per layer
  std::vector<std::int64_t> relu_;     // per layer: whether a ReLU follows
};

// A plain run of Linears (weights [out, in], biases [out] or undefined), each maybe followed by a
// ReLU (relu[l]), applied to x [..., in] as one autograd node on the library's kernels: what a
// typed Sequential of Linears and ReLUs computes outside functional_vmap (an actor, a critic, a
// target network), as a linear_run of one set. Undefined where the kernels do not take the
// tensors (linear_run::takes, shapes that do not chain, empty products): the caller runs the
// modules one by one.
TENSORDICT_DECL at::Tensor linear_chain(const at::Tensor& x, const std::vector<at::Tensor>& tensors, const std::vector<std::int64_t>& relu);
}  // namespace detail

// Whether the batched form of a module type is linear_runs alone (a Linear;
// sequential.hpp: a typed Sequential of Linears and ReLUs that starts with
// one): those spread their sets over the intra-op threads themselves.
template <class Impl>
inline constexpr bool linear_runs_only_v = std::is_same_v<Impl, torch::nn::LinearImpl>;

TENSORDICT_MODULE_WEIGHT_BIAS(torch::nn::LinearImpl)
TENSORDICT_MODULE_WEIGHT_BIAS(torch::nn::BilinearImpl)

template <>
struct functional<torch::nn::LinearImpl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const torch::nn::LinearImpl&, const TensorDict<schema_of<torch::nn::LinearImpl>>& p,
                            const at::Tensor& x) {
    return at::linear(x, p.leaf(0), p.leaf(1));
  }
};

template <>
struct batched<torch::nn::LinearImpl> {
  static constexpr bool is_batched = true;
  // A linear_run of one where it takes the tensors, else one baddbmm: [sets, rows, in] x [sets, in, out]
  // (a shared input is broadcast, not copied).
  TENSORDICT_DECL static stacked forward(const torch::nn::LinearImpl&, const TensorDict<schema_of<torch::nn::LinearImpl>>& p,
                                         const stacked& x, const batch_context& ctx);
};

template <>
struct functional<torch::nn::BilinearImpl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const torch::nn::BilinearImpl&, const TensorDict<schema_of<torch::nn::BilinearImpl>>& p,
                            const at::Tensor& x1, const at::Tensor& x2) {
    return at::bilinear(x1, x2, p.leaf(0), p.leaf(1));
  }
};

}  // namespace tensordict::nn

#if TENSORDICT_DEFINITIONS
#include <algorithm>
#include <cstring>

#include <ATen/Parallel.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/relu.h>  // Tensor::relu_
#include <ATen/ops/sum.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "../../detail/kernels/batched_gemm.hpp"
#include "../../detail/kernels/blas_symbols.hpp"
#include "../../detail/core_cache.hpp"
#include "../../detail/format.hpp"
#include "../../detail/kernels/parallel_sets.hpp"
#include "../../errors.hpp"

namespace tensordict::nn {

namespace detail {
namespace gemm = ::tensordict::detail::batched_gemm;

// Fortran BLAS's sgemm_, the one libtorch's CPU GEMMs call (Debian's
// libtorch links libblas.so.3), found at run time; null where the process
// exports none (a libtorch with MKL linked in): libtorch's ops run instead.
using sgemm_function = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
                                const float*, const int*, const float*, float*, const int*);
inline sgemm_function blas_sgemm() {
  static const sgemm_function f = ::tensordict::detail::blas_symbol<std::remove_pointer_t<sgemm_function>>("sgemm_");
  return f;
}

// o = a b (+ bias on every row where defined) by one sgemm_ call on the
// operands' memory, as libtorch's addmm calls it (the bias copied into o,
// then beta 1), without its dispatch, views and checks (~5 us a call, as
// much as a 256x64x64 product takes here). False where the layouts need
// libtorch's copies (no unit stride, leading dims below BLAS's minimum,
// sizes beyond int).
inline bool sgemm_product(const float* a, std::int64_t a_row, std::int64_t a_col, const float* b, std::int64_t b_row,
                          std::int64_t b_col, const float* bias, float* o, std::int64_t o_row, std::int64_t m, std::int64_t n,
                          std::int64_t k) {
  const sgemm_function sgemm = blas_sgemm();
  constexpr std::int64_t most = 1 << 30;
  if (sgemm == nullptr || m < 1 || n < 1 || k < 1 || m > most || n > most || k > most || o_row < n) return false;
  // Column-major, o^T = b^T a^T: b as the first operand (n x k), a as the second (k x m).
  char b_trans, a_trans;
  std::int64_t ldb, lda;
  if (b_col == 1 && b_row >= n) b_trans = 'N', ldb = b_row;
  else if (b_row == 1 && b_col >= k) b_trans = 'T', ldb = b_col;
  else return false;
  if (a_col == 1 && a_row >= k) a_trans = 'N', lda = a_row;
  else if (a_row == 1 && a_col >= m) a_trans = 'T', lda = a_col;
  else return false;
  if (std::max({ldb, lda, o_row}) > most) return false;
  if (bias != nullptr)
    for (std::int64_t r = 0; r < m; ++r) std::memcpy(o + r * o_row, bias, static_cast<std::size_t>(n) * sizeof(float));
  const int in = static_cast<int>(n), im = static_cast<int>(m), ik = static_cast<int>(k), il_b = static_cast<int>(ldb),
            il_a = static_cast<int>(lda), il_o = static_cast<int>(o_row);
  const float one = 1, beta = bias != nullptr ? 1.0f : 0.0f;
  sgemm(&b_trans, &a_trans, &in, &im, &ik, &one, b, &il_b, a, &il_a, &beta, o, &il_o);
  return true;
}

// out[s] = a[s] b[s] (+ bias[s] where defined) for the sets [first, first +
// count), by one BLAS call per set as the members' own Linears make them (an
// operand of 2 dims: every set shares it): the layers beyond batched_gemm's
// sizes. A batched matmul would take the same calls, plus the copies of its
// transposed gradients. float32 operands (linear_run::takes).
TENSORDICT_DECL void blas_products(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias, at::Tensor& out, std::int64_t first,
                                   std::int64_t count) {
  const std::int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const float *a_data = a.data_ptr<float>(), *b_data = b.data_ptr<float>();
  float* o_data = out.data_ptr<float>();
  const bool unit_bias = !bias.defined() || bias.stride(-1) == 1;
  for (std::int64_t s = first; s < first + count; ++s) {
    const float* as = a.dim() == 2 ? a_data : a_data + s * a.stride(0);
    const float* bs = b.dim() == 2 ? b_data : b_data + s * b.stride(0);
    const float* bias_s = bias.defined() ? bias.data_ptr<float>() + s * bias.stride(0) : nullptr;
    if (out.stride(-1) == 1 && unit_bias &&
        sgemm_product(as, a.stride(-2), a.stride(-1), bs, b.stride(-2), b.stride(-1), bias_s, o_data + s * out.stride(0), out.stride(-2), m, n, k))
      continue;
    at::Tensor o = out.select(0, s);
    const at::Tensor a_s = a.dim() == 2 ? a : a.select(0, s), b_s = b.dim() == 2 ? b : b.select(0, s);
    if (bias.defined())
      at::addmm_out(o, bias.select(0, s), a_s, b_s);
    else
      at::mm_out(o, a_s, b_s);
  }
}

// Sets per group: a linear_run takes its layers a group of sets at a time,
// so that one layer's output is still in the core's cache when the next
// reads it (a layer at a time over every set streamed each activation
// through memory, which two threads then shared). A set's part: its
// weights, and its rows in and out of each layer.
TENSORDICT_DECL std::int64_t sets_per_group(std::int64_t rows, at::TensorList tensors) {
  std::int64_t bytes = 0;
  for (std::size_t l = 0; 2 * l < tensors.size(); ++l) {
    const at::Tensor& w = tensors[2 * l];
    bytes += static_cast<std::int64_t>(sizeof(float)) * (w.size(1) * w.size(2) + rows * (w.size(1) + w.size(2)));
  }
  return std::max<std::int64_t>(1, ::tensordict::detail::core_cache_bytes() / 2 / std::max<std::int64_t>(1, bytes));
}

// Runs body(first, count) over the sets a group at a time, the groups spread
// over as many threads as libtorch's intra-op setting allows where the run's
// products are worth a second thread (flops_worth_a_thread, as for set
// tasks; for_each_claimed: a helper that a busy machine keeps waiting is not
// waited for): inside one autograd node, without a task's views, graph and joins.
template <class Body>
void for_each_group(std::int64_t sets, std::int64_t rows, at::TensorList tensors, Body&& body) {
  const std::int64_t group = sets_per_group(rows, tensors), groups = (sets + group - 1) / group;
  double flops = 0;
  for (std::size_t l = 0; 2 * l < tensors.size(); ++l)
    flops += 2.0 * static_cast<double>(sets * rows) * static_cast<double>(tensors[2 * l].size(1) * tensors[2 * l].size(2));
  const std::int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  const std::int64_t worth = std::min(threads, static_cast<std::int64_t>(flops / ::tensordict::detail::flops_worth_a_thread));
  if (std::min(groups, worth) < 2) {
    for (std::int64_t first = 0; first < sets; first += group) body(first, std::min(group, sets - first));
    return;
  }
  ::tensordict::detail::for_each_claimed(groups, static_cast<int>(worth),
                                         [&](std::int64_t g) { body(g * group, std::min(group, sets - g * group)); });
}

// The layers of a linear_run applied to x ([sets, rows, in], or [rows, in]
// every set shares): tensors are w, b per layer (b empty: none), relu whether
// a ReLU follows each. Returns every layer's output, [sets, rows, out] each.
TENSORDICT_DECL std::vector<at::Tensor> linear_run_forward(const at::Tensor& x, at::TensorList tensors, const std::vector<std::int64_t>& relu) {
  const std::size_t layers = relu.size();
  const std::int64_t sets = tensors[0].size(0), rows = x.size(-2);
  std::vector<at::Tensor> outputs, biases;
  for (std::size_t l = 0; l < layers; ++l) {
    const at::Tensor &w = tensors[2 * l], &b = tensors[2 * l + 1];
    outputs.push_back(at::empty({sets, rows, w.size(1)}, w.options()));
    biases.push_back(b.numel() == 0 ? at::Tensor() : b.is_contiguous() ? b : b.contiguous());
  }
  for_each_group(sets, rows, tensors, [&](std::int64_t first, std::int64_t count) {
    for (std::size_t l = 0; l < layers; ++l) {
      const at::Tensor& w = tensors[2 * l];
      const at::Tensor& h = l == 0 ? x : outputs[l - 1];
      if (gemm::fits(rows, w.size(1), w.size(2))) {
        gemm::multiply(gemm::view(h), gemm::transposed(w), biases[l], relu[l] != 0, w.size(2), outputs[l], first, count);
      } else {
        blas_products(h, w.transpose(1, 2), biases[l], outputs[l], first, count);
        if (relu[l]) outputs[l].narrow(0, first, count).relu_();
      }
    }
  });
  return outputs;
}

// The same with libtorch's ops, which autograd records (for create_graph).
TENSORDICT_DECL at::Tensor linear_run_reference(const at::Tensor& x, at::TensorList tensors, const std::vector<std::int64_t>& relu) {
  at::Tensor h = x.dim() == 2 ? x.unsqueeze(0).expand({tensors[0].size(0), x.size(0), x.size(1)}) : x;
  for (std::size_t l = 0; l < relu.size(); ++l) {
    const at::Tensor &w = tensors[2 * l], &b = tensors[2 * l + 1];
    h = b.numel() == 0 ? at::bmm(h, w.transpose(1, 2)) : at::baddbmm(b.unsqueeze(1), h, w.transpose(1, 2));
    if (relu[l]) h = h.relu();
  }
  return h;
}

// The backward of a linear_run's layers (linear_run_function's, without a graph): the gradients of
// x and each w, b where `needs` asks (x's as [sets, rows, in] even where x is shared), from the
// gradient `grad` [sets, rows, out] of the last output; outputs: the layer outputs the forward saved.
TENSORDICT_DECL std::vector<at::Tensor> linear_run_backward(const at::Tensor& x, at::TensorList tensors, const std::vector<std::int64_t>& relu,
                                                            const std::vector<at::Tensor>& outputs, const at::Tensor& grad,
                                                            const std::vector<bool>& needs) {
  const std::size_t layers = relu.size(), count = 1 + 2 * layers;
  std::vector<at::Tensor> out(count);
  // The input of layer l: x, or the output of layer l - 1.
  const auto input_of = [&](std::size_t l) -> const at::Tensor& { return l == 0 ? x : outputs[l - 1]; };
  std::size_t wanted = 0;  // the first input that needs a gradient: layers before its own need none
  while (wanted < count && !needs[wanted]) ++wanted;
  const std::int64_t sets = tensors[0].size(0), rows = grad.size(1);
  // Per layer that the backward reaches (from `last` on): the gradient at its output (before the
  // ReLU's mask: the next layer's input gradient, or the call's), and where wanted the mask's
  // result (in place where the gradient is the library's own), gw, gb and the input's gradient.
  std::size_t last = 0;
  while (2 * last + 2 < wanted) ++last;
  std::vector<at::Tensor> g_out(layers), masked(layers), g_in(layers);
  for (std::size_t l = layers; l-- > last;) {
    const at::Tensor& w = tensors[2 * l];
    g_out[l] = l + 1 == layers ? grad : g_in[l + 1];
    if (relu[l]) masked[l] = l + 1 < layers ? g_out[l] : at::empty(outputs[l].sizes(), grad.options());
    if (tensors[2 * l + 1].numel() > 0 && needs[2 * l + 2]) out[2 * l + 2] = at::empty({sets, w.size(1)}, grad.options());
    if (needs[2 * l + 1]) out[2 * l + 1] = at::empty({sets, w.size(1), w.size(2)}, grad.options());
    if (2 * l + 1 > wanted) g_in[l] = at::empty({sets, rows, w.size(2)}, grad.options());  // an earlier input needs it
  }
  for_each_group(sets, rows, tensors, [&](std::int64_t first, std::int64_t n) {
    for (std::size_t l = layers; l-- > last;) {
      const at::Tensor& w = tensors[2 * l];
      const std::int64_t out_features = w.size(1), in = w.size(2);
      const bool kernel = gemm::fits(rows, out_features, in);  // the forward's choice: the three products have its size
      const at::Tensor& g = relu[l] ? masked[l] : g_out[l];
      if (relu[l]) gemm::relu_backward(g_out[l], outputs[l], masked[l], first, n);
      if (out[2 * l + 2].defined()) gemm::row_sums(g, out[2 * l + 2], first, n);
      if (out[2 * l + 1].defined()) {
        if (kernel)
          gemm::multiply(gemm::transposed(g), gemm::view(input_of(l)), at::Tensor(), false, rows, out[2 * l + 1], first, n);
        else
          blas_products(g.transpose(1, 2), input_of(l), at::Tensor(), out[2 * l + 1], first, n);
      }
      if (g_in[l].defined()) {
        if (kernel)
          gemm::multiply(gemm::view(g), gemm::view(w), at::Tensor(), false, out_features, g_in[l], first, n);
        else
          blas_products(g, w, at::Tensor(), g_in[l], first, n);
      }
    }
  });
  if (needs[0]) out[0] = g_in[0];
  return out;
}

// The layers as one set: weights [1, out, in], biases [1, out] (none: an empty tensor).
inline std::vector<at::Tensor> as_one_set(at::TensorList tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) out.push_back(i % 2 == 1 && tensors[i].numel() == 0 ? tensors[i] : tensors[i].unsqueeze(0));
  return out;
}

// A linear_run as one autograd node of (x, w0, b0, w1, b1, ...); with one_set (linear_chain) the
// weights are 2-d and x [rows, in]: a run of one set. Its backward is the forward's products too, a
// group of sets at a time (linear_run_backward); where a graph of the backward is asked for
// (create_graph) it differentiates libtorch's ops on the saved inputs instead (linear_run_reference),
// so that second derivatives stay exact.
struct linear_run_function : torch::autograd::Function<linear_run_function> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs, std::vector<std::int64_t> relu, bool one_set) {
    std::vector<at::Tensor> outputs = one_set ? linear_run_forward(inputs[0], as_one_set(inputs.slice(1)), relu)
                                              : linear_run_forward(inputs[0], inputs.slice(1), relu);
    // Saved: the inputs, then each layer's output the backward reads (all but the last, unless a ReLU follows it).
    std::vector<at::Tensor> saved(inputs.begin(), inputs.end());
    saved.insert(saved.end(), outputs.begin(), outputs.end() - (relu.back() ? 0 : 1));
    ctx->save_for_backward(saved);
    ctx->saved_data["relu"] = relu;
    ctx->saved_data["one_set"] = one_set;
    ctx->set_materialize_grads(false);
    return one_set ? outputs.back().select(0, 0) : outputs.back();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::vector<std::int64_t> relu = ctx->saved_data["relu"].toIntVector();
    const bool one_set = ctx->saved_data["one_set"].toBool();
    const std::size_t layers = relu.size(), count = 1 + 2 * layers;
    torch::autograd::variable_list out(count + 2);  // the last two for `relu` and `one_set`, not tensors
    if (!grads[0].defined()) return out;
    const at::Tensor& x = saved[0];
    const at::TensorList tensors(saved.data() + 1, 2 * layers);
    std::vector<bool> needs(count);
    for (std::size_t i = 0; i < count; ++i) needs[i] = ctx->needs_input_grad(i);
    if (at::GradMode::is_enabled()) {
      std::vector<at::Tensor> wrt;
      for (std::size_t i = 0; i < count; ++i)
        if (needs[i]) wrt.push_back(saved[i]);
      // (as_one_set's unsqueeze is a view autograd records: the gradients reach the 2-d tensors)
      const at::Tensor y =
          one_set ? linear_run_reference(x, as_one_set(tensors), relu).select(0, 0) : linear_run_reference(x, tensors, relu);
      const auto d = torch::autograd::grad({y}, wrt, {grads[0]}, /*retain_graph=*/true, /*create_graph=*/true, /*allow_unused=*/true);
      for (std::size_t i = 0, next = 0; i < count; ++i)
        if (needs[i]) out[i] = d[next++];
      return out;
    }
    const std::vector<at::Tensor> outputs(saved.begin() + static_cast<std::ptrdiff_t>(count), saved.end());
    auto d = one_set ? linear_run_backward(x, as_one_set(tensors), relu, outputs, grads[0].unsqueeze(0), needs)
                     : linear_run_backward(x, tensors, relu, outputs, grads[0], needs);
    for (std::size_t i = 0; i < count; ++i) {
      if (!d[i].defined()) continue;
      // x's gradient comes as [sets, rows, in]: a shared x takes their sum.
      out[i] = one_set ? d[i].select(0, 0) : i == 0 && x.dim() == 2 ? d[i].sum(0) : d[i];
    }
    return out;
  }
};

// Whether a run on input `flat` whose last layer gives `width` features takes a layer w [..., out, in]
// (bias b or undefined): widths that chain, the kernels' dtypes and layouts, no empty product (the
// kernels' tiles assume a column and a row; libtorch's ops take those).
inline bool run_takes_layer(const at::Tensor& flat, std::int64_t width, const at::Tensor& w, const at::Tensor& b) {
  return w.size(-1) == width && w.numel() > 0 && flat.numel() > 0 && gemm::takes({&flat, &w, &b});
}

TENSORDICT_DECL at::Tensor linear_chain(const at::Tensor& x, const std::vector<at::Tensor>& tensors, const std::vector<std::int64_t>& relu) {
  if (x.dim() < 1 || tensors.empty() || tensors.size() != 2 * relu.size()) return {};
  std::int64_t width = x.size(-1);
  const at::Tensor flat = x.dim() == 2 ? x : x.reshape({-1, width});
  std::vector<at::Tensor> inputs{flat};
  bool records = at::GradMode::is_enabled() && flat.requires_grad();
  for (std::size_t l = 0; l < relu.size(); ++l) {
    const at::Tensor &w = tensors[2 * l], &b = tensors[2 * l + 1];
    if (w.dim() != 2 || (b.defined() && (b.dim() != 1 || b.size(0) != w.size(0))) || !run_takes_layer(flat, width, w, b))
      return {};
    width = w.size(0);
    inputs.push_back(w);
    inputs.push_back(b.defined() ? b : at::empty({0}, w.options()));
    records = records || (at::GradMode::is_enabled() && (w.requires_grad() || (b.defined() && b.requires_grad())));
  }
  at::Tensor y = records ? linear_run_function::apply(at::TensorList(inputs), relu, true)
                         : linear_run_forward(flat, as_one_set(at::TensorList(inputs).slice(1)), relu).back().select(0, 0);
  if (x.dim() == 2) return y;
  std::vector<std::int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(width);
  return y.view(shape);
}

TENSORDICT_DECL linear_run::linear_run(const stacked& x, std::int64_t sets) : x_(x), sets_(sets) {
  const std::int64_t own_dims = x.value.dim() - (x.mapped ? 1 : 0);
  if (own_dims < 1)
    throw shape_error("tensordict::nn::functional_vmap: a Linear's input needs at least 1 dim per set (its features); got " +
                      tensordict::describe(x.value) + (x.mapped ? " mapped over the sets" : " shared by the sets"));
  width_ = x.value.size(-1);
  // The common shapes need no reshape (each op costs about a microsecond here).
  flat_ = x.mapped ? (own_dims == 2 ? x.value : x.value.reshape({sets, -1, width_}))
                   : (own_dims == 2 ? x.value : x.value.reshape({-1, width_}));
  rows_ = flat_.size(-2);
}

TENSORDICT_DECL bool linear_run::takes(const std::vector<at::Tensor>& params) {
  return std::all_of(params.begin(), params.end(), [](const at::Tensor& t) { return gemm::takes({&t}); });
}

TENSORDICT_DECL bool linear_run::add(const at::Tensor& w, const at::Tensor& b) {
  if (w.dim() != 3 || w.size(0) != sets_ || !run_takes_layer(flat_, width_, w, b)) return false;
  tensors_.push_back(w);
  tensors_.push_back(b.defined() ? b : at::empty({0}, w.options()));
  relu_.push_back(0);
  width_ = w.size(1);
  return true;
}

TENSORDICT_DECL stacked linear_run::run() const {
  bool records = at::GradMode::is_enabled() && flat_.requires_grad();
  for (const auto& t : tensors_) records = records || (at::GradMode::is_enabled() && t.requires_grad());
  at::Tensor y;
  if (records) {
    std::vector<at::Tensor> inputs{flat_};
    inputs.insert(inputs.end(), tensors_.begin(), tensors_.end());
    y = linear_run_function::apply(at::TensorList(inputs), relu_, false);
  } else {
    y = linear_run_forward(flat_, tensors_, relu_).back();
  }
  return shaped(y);
}

TENSORDICT_DECL stacked linear_run::shaped(const at::Tensor& y) const {
  const std::int64_t own_dims = x_.value.dim() - (x_.mapped ? 1 : 0);
  if (own_dims == 2) return {y, true, true};
  std::vector<std::int64_t> shape{sets_};
  shape.insert(shape.end(), x_.value.sizes().begin() + (x_.mapped ? 1 : 0), x_.value.sizes().end() - 1);
  shape.push_back(y.size(-1));
  return {y.view(shape), true, true};
}
}  // namespace detail

TENSORDICT_DECL stacked batched<torch::nn::LinearImpl>::forward(const torch::nn::LinearImpl&,
                                                                const TensorDict<schema_of<torch::nn::LinearImpl>>& p, const stacked& x,
                                                                const batch_context& ctx) {
  const at::Tensor& w = p.leaf(0);  // [sets, out, in]
  const at::Tensor& b = p.leaf(1);  // [sets, out] or unset
  const std::int64_t in = w.size(2), out = w.size(1);
  detail::linear_run run(x, ctx.sets);
  if (run.add(w, b)) return run.run();
  const at::Tensor& flat = run.flat_input();
  if (!x.mapped && flat.dim() == 2 && b.defined()) {
    // A shared input meets every set's weights in one GEMM: [rows, in] x [in, sets*out].
    at::Tensor y = at::addmm(b.reshape({-1}), flat, w.reshape({ctx.sets * out, in}).t());
    return run.shaped(y.view({flat.size(0), ctx.sets, out}).transpose(0, 1));
  }
  const at::Tensor rows = x.mapped ? flat : flat.unsqueeze(0).expand({ctx.sets, -1, in});
  at::Tensor y;
  if (!b.defined())
    y = at::bmm(rows, w.transpose(1, 2));
  else if (rows.size(1) * in * out < (1 << 16))
    y = at::baddbmm(b.unsqueeze(1), rows, w.transpose(1, 2));  // small: the bias fused in
  else
    y = at::bmm(rows, w.transpose(1, 2)).add_(b.unsqueeze(1));  // large: measured faster than baddbmm's bias copy
  return run.shaped(y);
}

}  // namespace tensordict::nn
#endif  // TENSORDICT_DEFINITIONS
