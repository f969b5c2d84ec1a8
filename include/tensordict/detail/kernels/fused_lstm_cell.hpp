// The element-wise part of one LSTM step for every set at once, in one pass:
// from the gate pre-activations (input side + hidden side, [sets, B, 4H]) and
// the previous cell state to the new (h, c). libtorch's CPU ops make five
// passes over the gates per step (sigmoid, tanh, three products), and its
// sigmoid and tanh cost 0.8 and 3 ns per float here (libtorch 1.13, AVX2
// build): for the 8 x LSTM(32, 128) bench that was 255-290 us of a ~750 us
// step. This kernel (AVX2 + FMA, chosen at run time) takes ~175 us for the
// same inside the forward (perf: 15% of it), most of it the five exps.
// Where it does not apply (another CPU or dtype, autograd recording a graph
// that needs second derivatives through it) the caller keeps libtorch's ops.
#pragma once

#include <cstdint>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "cpu_features.hpp"

namespace tensordict::detail::fused_lstm {

// exp(x) to ~2 ulp on [-87.3, 88.3] (clamped outside, NaN kept): Cody-Waite
// range reduction and Cephes' degree-6 polynomial, the scalar twin of exp8.
inline float exp_scalar(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it leaves round(x / ln 2) in the low mantissa bits
  const float t = x * 1.44269504088896341f + shifter;
  const float n = t - shifter;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  std::int32_t k;
  __builtin_memcpy(&k, &t, sizeof k);
  std::int32_t shifter_bits;
  __builtin_memcpy(&shifter_bits, &shifter, sizeof shifter_bits);
  // Unsigned: a NaN's bits make any exponent, and the shift must not overflow an int.
  const std::uint32_t scale_bits = static_cast<std::uint32_t>(k - shifter_bits + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &scale_bits, sizeof scale);
  return p * scale;
}
inline float sigmoid_scalar(float x) { return 1.0f / (1.0f + exp_scalar(-x)); }
inline float tanh_scalar(float x) { return 1.0f - 2.0f / (1.0f + exp_scalar(2.0f * x)); }

// Row pointers of a [sets, B, width] tensor whose last dim is contiguous.
// An undefined tensor gives null rows (a zero gradient).
struct rows_view {
  float* data = nullptr;
  std::int64_t set_stride = 0, row_stride = 0, batch = 1;
  explicit rows_view(const at::Tensor& t) {
    if (!t.defined()) return;
    data = t.data_ptr<float>();
    set_stride = t.stride(0);
    row_stride = t.stride(1);
    batch = t.size(1);
  }
  float* row(std::int64_t r) const { return data ? data + (r / batch) * set_stride + (r % batch) * row_stride : nullptr; }
};

// The step's saved activations for the backward: i, f, g, o, tanh(c) of each row.
constexpr std::int64_t saved_gates = 5;

#if TENSORDICT_X86_KERNELS
__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x) {
  // max(lo, x), min(hi, x): a NaN x is their second operand, so it stays NaN.
  x = _mm256_min_ps(_mm256_set1_ps(88.3f), _mm256_max_ps(_mm256_set1_ps(-87.3f), x));
  const __m256 shifter = _mm256_set1_ps(12582912.0f);
  const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shifter);
  const __m256 n = _mm256_sub_ps(t, shifter);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i k = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(shifter));
  return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23)));
}
__attribute__((target("avx2,fma"))) inline __m256 sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}
__attribute__((target("avx2,fma"))) inline __m256 tanh8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(one, exp8(_mm256_add_ps(x, x)))));
}

__attribute__((target("avx2,fma"))) inline __m256 gate8(const float* x, const float* y, const float* b, std::int64_t at) {
  const __m256 sum = _mm256_add_ps(_mm256_loadu_ps(x + at), _mm256_loadu_ps(y + at));
  return b ? _mm256_add_ps(sum, _mm256_loadu_ps(b + at)) : sum;
}

__attribute__((target("avx2,fma"))) inline void forward_avx2(const rows_view& gx, const rows_view& gh, const rows_view& bias,
                                                            const rows_view& c_prev, float* h, float* c, float* saved,
                                                            std::int64_t rows, std::int64_t hidden) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* x = gx.row(r);
    const float* y = gh.row(r);
    const float* b = bias.row(r);
    const float* cp = c_prev.row(r);
    float* hr = h + r * hidden;
    float* cr = c + r * hidden;
    float* s = saved ? saved + r * saved_gates * hidden : nullptr;
    std::int64_t j = 0;
    for (; j + 8 <= hidden; j += 8) {
      const __m256 i = sigmoid8(gate8(x, y, b, j)), f = sigmoid8(gate8(x, y, b, hidden + j)),
                   g = tanh8(gate8(x, y, b, 2 * hidden + j)), o = sigmoid8(gate8(x, y, b, 3 * hidden + j));
      const __m256 cn = _mm256_fmadd_ps(f, _mm256_loadu_ps(cp + j), _mm256_mul_ps(i, g));
      const __m256 tc = tanh8(cn);
      _mm256_storeu_ps(cr + j, cn);
      _mm256_storeu_ps(hr + j, _mm256_mul_ps(o, tc));
      if (s) {
        _mm256_storeu_ps(s + j, i);
        _mm256_storeu_ps(s + hidden + j, f);
        _mm256_storeu_ps(s + 2 * hidden + j, g);
        _mm256_storeu_ps(s + 3 * hidden + j, o);
        _mm256_storeu_ps(s + 4 * hidden + j, tc);
      }
    }
    for (; j < hidden; ++j) {
      const auto gate = [&](std::int64_t k) { return x[k * hidden + j] + y[k * hidden + j] + (b ? b[k * hidden + j] : 0.0f); };
      const float i = sigmoid_scalar(gate(0)), f = sigmoid_scalar(gate(1)), g = tanh_scalar(gate(2)),
                  o = sigmoid_scalar(gate(3));
      const float cn = f * cp[j] + i * g, tc = tanh_scalar(cn);
      cr[j] = cn;
      hr[j] = o * tc;
      if (s) {
        s[j] = i;
        s[hidden + j] = f;
        s[2 * hidden + j] = g;
        s[3 * hidden + j] = o;
        s[4 * hidden + j] = tc;
      }
    }
  }
}

// dh, dc: the gradients of the step's outputs (nullptr: zero); writes the
// gradient of the gate pre-activations [rows, 4H] and of c_prev [rows, H].
__attribute__((target("avx2,fma"))) inline void backward_avx2(const rows_view& dh_rows, const rows_view& dc_rows, const float* saved,
                                                             const rows_view& c_prev, float* d_gates, float* d_c_prev,
                                                             std::int64_t rows, std::int64_t hidden) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* s = saved + r * saved_gates * hidden;
    const float* cp = c_prev.row(r);
    float* dg = d_gates + r * 4 * hidden;
    float* dcp = d_c_prev + r * hidden;
    const float* dh = dh_rows.row(r);
    const float* dc = dc_rows.row(r);
    std::int64_t j = 0;
    for (; j + 8 <= hidden; j += 8) {
      const __m256 i = _mm256_loadu_ps(s + j), f = _mm256_loadu_ps(s + hidden + j), g = _mm256_loadu_ps(s + 2 * hidden + j),
                   o = _mm256_loadu_ps(s + 3 * hidden + j), tc = _mm256_loadu_ps(s + 4 * hidden + j);
      const __m256 dhv = dh ? _mm256_loadu_ps(dh + j) : zero, dcv = dc ? _mm256_loadu_ps(dc + j) : zero;
      // dc_total = dc + dh * o * (1 - tanh(c)^2)
      const __m256 dct = _mm256_fmadd_ps(_mm256_mul_ps(dhv, o), _mm256_fnmadd_ps(tc, tc, one), dcv);
      const __m256 d_i = _mm256_mul_ps(_mm256_mul_ps(dct, g), _mm256_mul_ps(i, _mm256_sub_ps(one, i)));
      const __m256 d_f = _mm256_mul_ps(_mm256_mul_ps(dct, _mm256_loadu_ps(cp + j)), _mm256_mul_ps(f, _mm256_sub_ps(one, f)));
      const __m256 d_g = _mm256_mul_ps(_mm256_mul_ps(dct, i), _mm256_fnmadd_ps(g, g, one));
      const __m256 d_o = _mm256_mul_ps(_mm256_mul_ps(dhv, tc), _mm256_mul_ps(o, _mm256_sub_ps(one, o)));
      _mm256_storeu_ps(dg + j, d_i);
      _mm256_storeu_ps(dg + hidden + j, d_f);
      _mm256_storeu_ps(dg + 2 * hidden + j, d_g);
      _mm256_storeu_ps(dg + 3 * hidden + j, d_o);
      _mm256_storeu_ps(dcp + j, _mm256_mul_ps(dct, f));
    }
    for (; j < hidden; ++j) {
      const float i = s[j], f = s[hidden + j], g = s[2 * hidden + j], o = s[3 * hidden + j], tc = s[4 * hidden + j];
      const float dhv = dh ? dh[j] : 0.0f, dcv = dc ? dc[j] : 0.0f;
      const float dct = dcv + dhv * o * (1.0f - tc * tc);
      dg[j] = dct * g * i * (1.0f - i);
      dg[hidden + j] = dct * cp[j] * f * (1.0f - f);
      dg[2 * hidden + j] = dct * i * (1.0f - g * g);
      dg[3 * hidden + j] = dhv * tc * o * (1.0f - o);
      dcp[j] = dct * f;
    }
  }
}
#endif

// Whether the kernel takes these: float32 CPU tensors on a CPU that runs it.
inline bool applies(const at::Tensor& x, const at::Tensor& h, const at::Tensor& c) {
  const auto is_float_cpu = [](const at::Tensor& t) { return t.is_cpu() && t.scalar_type() == at::kFloat; };
  return avx2_fma_supported() && is_float_cpu(x) && is_float_cpu(h) && is_float_cpu(c);
}

// The rows of t [sets, B, width], each contiguous.
inline at::Tensor rows_contiguous(const at::Tensor& t) {
  return !t.defined() || t.stride(2) == 1 ? t : t.contiguous();
}

// (h, c) [sets, B, H] of the step from the gates gx + gh [sets, B, 4H] (+ bias
// [sets, 4H] where defined) and c_prev; with `saved`, also the activations
// the backward needs ([sets * B, 5H]).
inline std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& gx, const at::Tensor& gh, const at::Tensor& bias,
                                                  const at::Tensor& c_prev, at::Tensor* saved) {
  const std::int64_t sets = c_prev.size(0), batch = c_prev.size(1), hidden = c_prev.size(2), rows = sets * batch;
  TORCH_CHECK(gx.sizes() == gh.sizes() && gx.size(2) == 4 * hidden, "tensordict: LSTM step: gates ", gx.sizes(), " and ",
              gh.sizes(), " for a cell state ", c_prev.sizes());
  const at::Tensor x = rows_contiguous(gx), y = rows_contiguous(gh), cp = rows_contiguous(c_prev);
  const at::Tensor b = bias.defined() ? rows_contiguous(bias.unsqueeze(1).expand({sets, batch, 4 * hidden})) : bias;
  at::Tensor h = at::empty({sets, batch, hidden}, c_prev.options()), c = at::empty({sets, batch, hidden}, c_prev.options());
  if (saved) *saved = at::empty({rows, saved_gates * hidden}, c_prev.options());
#if TENSORDICT_X86_KERNELS
  forward_avx2(rows_view(x), rows_view(y), rows_view(b), rows_view(cp), h.data_ptr<float>(), c.data_ptr<float>(),
               saved ? saved->data_ptr<float>() : nullptr, rows, hidden);
#endif
  return {h, c};
}

// The gradients of the gate pre-activations [sets, B, 4H] and of c_prev from
// those of h and c (undefined: zero) and what forward saved.
inline std::tuple<at::Tensor, at::Tensor> backward(const at::Tensor& dh, const at::Tensor& dc, const at::Tensor& saved,
                                                   const at::Tensor& c_prev) {
  const std::int64_t sets = c_prev.size(0), batch = c_prev.size(1), hidden = c_prev.size(2);
  const at::Tensor gh = rows_contiguous(dh), gc = rows_contiguous(dc), cp = rows_contiguous(c_prev);
  at::Tensor d_gates = at::empty({sets, batch, 4 * hidden}, c_prev.options());
  at::Tensor d_c_prev = at::empty({sets, batch, hidden}, c_prev.options());
#if TENSORDICT_X86_KERNELS
  backward_avx2(rows_view(gh), rows_view(gc), saved.data_ptr<float>(), rows_view(cp), d_gates.data_ptr<float>(),
                d_c_prev.data_ptr<float>(), sets * batch, hidden);
#endif
  return {d_gates, d_c_prev};
}

}  // namespace tensordict::detail::fused_lstm
