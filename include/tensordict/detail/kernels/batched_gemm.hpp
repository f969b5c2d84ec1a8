// Many small float32 matrix products at once, c[s] = a[s] b[s] (+ bias[s],
// then ReLU if asked), for ensembles of small members. libtorch's CPU
// bmm/baddbmm hands every set above ~400 multiply-adds to BLAS one set at a
// time, and OpenBLAS (0.3.21, Zen kernels) takes 8.9 us for one 32x32x32
// sgemm here (7 GFLOP/s on a core whose at::mm 512 runs at 34): a
// [16, 32, 32] baddbmm took 164 us. A register tile of 6x16 (AVX2 + FMA,
// chosen at run time) runs the same at ~36 GFLOP/s. Operands are read through
// their strides (a transposed or shared operand needs no copy); b is packed
// per set into a zero-padded panel so that its rows load as whole vectors.
// The caller checks takes() and fits(), and keeps libtorch's ops elsewhere.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "cpu_features.hpp"

namespace tensordict::detail::batched_gemm {

// An operand's element (set, row, col) lies at data[set * set_stride + row * row_stride + col * col_stride];
// set_stride 0: every set shares it.
struct strided {
  const float* data = nullptr;
  std::int64_t set_stride = 0, row_stride = 0, col_stride = 0;
};

// [sets, rows, cols], or [rows, cols] shared by every set.
inline strided view(const at::Tensor& t) {
  const float* data = t.data_ptr<float>();
  if (t.dim() == 2) return {data, 0, t.stride(0), t.stride(1)};
  return {data, t.stride(0), t.stride(1), t.stride(2)};
}
// The transpose of view(t): rows and columns swapped.
inline strided transposed(const at::Tensor& t) {
  const strided v = view(t);
  return {v.data, v.set_stride, v.col_stride, v.row_stride};
}

// Where these products beat BLAS one set at a time: float32 CPU tensors with
// storage and no forward-mode tangent, a CPU with AVX2 and FMA, and sets small
// enough (multiply-adds per set) that BLAS's fixed cost per call dominates; beyond them a BLAS with wider kernels
// (AVX-512) is faster. Measured here: 32x32x32 4.9x faster, 64x64x64 1.9x.
constexpr std::int64_t most_products_per_set = std::int64_t{1} << 18;

// Whether the products of m x k by k x n per set are small enough for them.
inline bool fits(std::int64_t m, std::int64_t n, std::int64_t k) { return m * n * k <= most_products_per_set; }

// Whether these kernels (the products where fits(), relu_backward, row_sums) take the operands.
inline bool takes(std::initializer_list<const at::Tensor*> operands) {
  if (!avx2_fma_supported()) return false;
  return std::all_of(operands.begin(), operands.end(), [](const at::Tensor* t) {
    // Inside vmap or a functorch transform a tensor is a wrapper without storage of its own; a
    // dual tensor's tangent (forward-mode AD) these products would not carry.
    return !t->defined() || (t->is_cpu() && t->layout() == at::kStrided && t->scalar_type() == at::kFloat &&
                             t->has_storage() && !t->_fw_grad(/*level=*/0).defined());
  });
}

#if TENSORDICT_X86_KERNELS
// The mask of a maskload or maskstore that keeps the first `count` (0 to 8) of 8 lanes.
__attribute__((target("avx2"))) inline __m256i first_lanes(std::int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The tile c[6 x 8V] (row stride ldc; its first `rows` rows and `cols` columns
// are stored) = a's rows [rows x k] (strides a_row, a_col) times the packed
// panel b[k x ldb], + bias[8V]. a is read where it lies (each of its numbers
// is broadcast, so it needs no packing); the rows past `rows` repeat row 0
// and are not stored. Each accumulator is a variable of its own: GCC 12 kept
// an array of them on the stack, at half the speed.
template <int V>
__attribute__((target("avx2,fma"))) inline void tile(const float* a, std::int64_t a_row, std::int64_t a_col, const float* b,
                                                     std::int64_t ldb, std::int64_t k, const float* bias, bool relu, float* c,
                                                     std::int64_t ldc, std::int64_t rows, std::int64_t cols) {
  static_assert(V == 1 || V == 2);
  const float* const a0 = a;
  const float* const a1 = rows > 1 ? a + a_row : a;
  const float* const a2 = rows > 2 ? a + 2 * a_row : a;
  const float* const a3 = rows > 3 ? a + 3 * a_row : a;
  const float* const a4 = rows > 4 ? a + 4 * a_row : a;
  const float* const a5 = rows > 5 ? a + 5 * a_row : a;
  const __m256 b0 = _mm256_loadu_ps(bias), b1 = V == 2 ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
  __m256 c00 = b0, c10 = b0, c20 = b0, c30 = b0, c40 = b0, c50 = b0;
  __m256 c01 = b1, c11 = b1, c21 = b1, c31 = b1, c41 = b1, c51 = b1;
  for (std::int64_t p = 0, at = 0; p < k; ++p, at += a_col, b += ldb) {
    const __m256 x0 = _mm256_loadu_ps(b);
    const __m256 x1 = V == 2 ? _mm256_loadu_ps(b + 8) : x0;
    __m256 y = _mm256_broadcast_ss(a0 + at);
    c00 = _mm256_fmadd_ps(y, x0, c00);
    if constexpr (V == 2) c01 = _mm256_fmadd_ps(y, x1, c01);
    y = _mm256_broadcast_ss(a1 + at);
    c10 = _mm256_fmadd_ps(y, x0, c10);
    if constexpr (V == 2) c11 = _mm256_fmadd_ps(y, x1, c11);
    y = _mm256_broadcast_ss(a2 + at);
    c20 = _mm256_fmadd_ps(y, x0, c20);
    if constexpr (V == 2) c21 = _mm256_fmadd_ps(y, x1, c21);
    y = _mm256_broadcast_ss(a3 + at);
    c30 = _mm256_fmadd_ps(y, x0, c30);
    if constexpr (V == 2) c31 = _mm256_fmadd_ps(y, x1, c31);
    y = _mm256_broadcast_ss(a4 + at);
    c40 = _mm256_fmadd_ps(y, x0, c40);
    if constexpr (V == 2) c41 = _mm256_fmadd_ps(y, x1, c41);
    y = _mm256_broadcast_ss(a5 + at);
    c50 = _mm256_fmadd_ps(y, x0, c50);
    if constexpr (V == 2) c51 = _mm256_fmadd_ps(y, x1, c51);
  }
  if (relu) {
    // max(0, c) with c second: its NaN and -0.0 come through, as libtorch's relu (clamp_min) gives them.
    const __m256 zero = _mm256_setzero_ps();
    c00 = _mm256_max_ps(zero, c00), c10 = _mm256_max_ps(zero, c10), c20 = _mm256_max_ps(zero, c20);
    c30 = _mm256_max_ps(zero, c30), c40 = _mm256_max_ps(zero, c40), c50 = _mm256_max_ps(zero, c50);
    c01 = _mm256_max_ps(zero, c01), c11 = _mm256_max_ps(zero, c11), c21 = _mm256_max_ps(zero, c21);
    c31 = _mm256_max_ps(zero, c31), c41 = _mm256_max_ps(zero, c41), c51 = _mm256_max_ps(zero, c51);
  }
  if (rows == 6 && cols == 8 * V) {  // a whole tile: straight stores (the general path below costs as much as 16 steps of k)
    _mm256_storeu_ps(c, c00), _mm256_storeu_ps(c + ldc, c10), _mm256_storeu_ps(c + 2 * ldc, c20);
    _mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 4 * ldc, c40), _mm256_storeu_ps(c + 5 * ldc, c50);
    if constexpr (V == 2) {
      _mm256_storeu_ps(c + 8, c01), _mm256_storeu_ps(c + ldc + 8, c11), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
      _mm256_storeu_ps(c + 3 * ldc + 8, c31), _mm256_storeu_ps(c + 4 * ldc + 8, c41), _mm256_storeu_ps(c + 5 * ldc + 8, c51);
    }
    return;
  }
  const __m256 row_tiles[6][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  for (int v = 0; v < V; ++v) {
    const std::int64_t left = std::clamp<std::int64_t>(cols - 8 * v, 0, 8);
    const __m256i mask = first_lanes(left);
    for (std::int64_t r = 0; r < rows; ++r) {
      const __m256 value = row_tiles[r][v];
      if (left == 8)
        _mm256_storeu_ps(c + r * ldc + 8 * v, value);
      else
        _mm256_maskstore_ps(c + r * ldc + 8 * v, mask, value);
    }
  }
}

// Copies the [rows x cols] matrix at `from` (strides row_stride, col_stride)
// into `to` with row length ld. A transposed one (row_stride 1: a Linear's
// weight as the forward's b) goes 8x8 blocks at a time through registers; a
// scalar copy along strides cost ~1 ns a number, a fifth of the products.
__attribute__((target("avx2,fma"))) inline void pack(const float* from, std::int64_t row_stride, std::int64_t col_stride,
                                                     std::int64_t rows, std::int64_t cols, float* to, std::int64_t ld) {
  if (col_stride == 1) {
    for (std::int64_t i = 0; i < rows; ++i)
      std::memcpy(to + i * ld, from + i * row_stride, static_cast<std::size_t>(cols) * sizeof(float));
    return;
  }
  std::int64_t i0 = 0, j0 = 0;
  if (row_stride == 1) {
    for (; j0 + 8 <= cols; j0 += 8) {
      for (i0 = 0; i0 + 8 <= rows; i0 += 8) {
        // Column j0 + c of the block is the contiguous run from[(j0 + c) * col_stride + i0 ...]: load 8, transpose.
        __m256 r[8], t[8];
        for (int c = 0; c < 8; ++c) r[c] = _mm256_loadu_ps(from + (j0 + c) * col_stride + i0);
        t[0] = _mm256_unpacklo_ps(r[0], r[1]), t[1] = _mm256_unpackhi_ps(r[0], r[1]);
        t[2] = _mm256_unpacklo_ps(r[2], r[3]), t[3] = _mm256_unpackhi_ps(r[2], r[3]);
        t[4] = _mm256_unpacklo_ps(r[4], r[5]), t[5] = _mm256_unpackhi_ps(r[4], r[5]);
        t[6] = _mm256_unpacklo_ps(r[6], r[7]), t[7] = _mm256_unpackhi_ps(r[6], r[7]);
        r[0] = _mm256_shuffle_ps(t[0], t[2], 0x44), r[1] = _mm256_shuffle_ps(t[0], t[2], 0xEE);
        r[2] = _mm256_shuffle_ps(t[1], t[3], 0x44), r[3] = _mm256_shuffle_ps(t[1], t[3], 0xEE);
        r[4] = _mm256_shuffle_ps(t[4], t[6], 0x44), r[5] = _mm256_shuffle_ps(t[4], t[6], 0xEE);
        r[6] = _mm256_shuffle_ps(t[5], t[7], 0x44), r[7] = _mm256_shuffle_ps(t[5], t[7], 0xEE);
        for (int c = 0; c < 4; ++c) {
          _mm256_storeu_ps(to + (i0 + c) * ld + j0, _mm256_permute2f128_ps(r[c], r[c + 4], 0x20));
          _mm256_storeu_ps(to + (i0 + c + 4) * ld + j0, _mm256_permute2f128_ps(r[c], r[c + 4], 0x31));
        }
      }
      for (std::int64_t i = i0; i < rows; ++i)
        for (std::int64_t j = j0; j < j0 + 8; ++j) to[i * ld + j] = from[i + j * col_stride];
    }
  }
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = j0; j < cols; ++j) to[i * ld + j] = from[i * row_stride + j * col_stride];
}

// The sum of v's lanes.
__attribute__((target("avx2,fma"))) inline float lane_sum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

// c[R x N] (row stride ldc; its first `rows` rows stored) = a's rows (stride a_row) times b's N columns
// (stride b_col), + bias, where a's rows and b's columns are contiguous along k: one accumulator per
// output, 8 products of k per FMA, their lanes summed at the end. Rows past `rows` repeat row 0.
template <int R, int N>
__attribute__((target("avx2,fma"))) inline void dot_tile(const float* a, std::int64_t a_row, const float* b, std::int64_t b_col,
                                                         std::int64_t k, const float* bias, bool relu, float* c, std::int64_t ldc,
                                                         std::int64_t rows) {
  const float* ar[R];
  const float* bc[N];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) ar[r] = a + (r < rows ? r : 0) * a_row;
#pragma GCC unroll 4
  for (int j = 0; j < N; ++j) bc[j] = b + j * b_col;
  __m256 acc[R][N];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < N; ++j) acc[r][j] = _mm256_setzero_ps();
  // The last k % 8 products load zeros past k.
  const __m256i tail = first_lanes(k % 8);
  for (std::int64_t p = 0; p < k; p += 8) {
    const bool last = p + 8 > k;
    __m256 bv[N];
#pragma GCC unroll 4
    for (int j = 0; j < N; ++j) bv[j] = last ? _mm256_maskload_ps(bc[j] + p, tail) : _mm256_loadu_ps(bc[j] + p);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m256 av = last ? _mm256_maskload_ps(ar[r] + p, tail) : _mm256_loadu_ps(ar[r] + p);
#pragma GCC unroll 4
      for (int j = 0; j < N; ++j) acc[r][j] = _mm256_fmadd_ps(av, bv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    if (r >= rows) break;
#pragma GCC unroll 4
    for (int j = 0; j < N; ++j) {
      const float value = lane_sum(acc[r][j]) + (bias ? bias[j] : 0.0f);
      c[r * ldc + j] = relu && value < 0.0f ? 0.0f : value;  // NaN and -0.0 kept, as in tile()
    }
  }
}

// c (contiguous [sets, m, N]) = a[s] b[s] (+ bias, ReLU) by dot_tile, 12 / N rows at a time.
template <int N>
__attribute__((target("avx2,fma"))) inline void multiply_narrow(std::int64_t sets, std::int64_t m, std::int64_t k, const strided& a,
                                                                const strided& b, const float* bias, std::int64_t bias_set_stride,
                                                                bool relu, float* c) {
  constexpr int R = N == 4 ? 2 : 12 / N;  // accumulators, a and b in the 16 registers
  for (std::int64_t s = 0; s < sets; ++s) {
    const float* as = a.data + s * a.set_stride;
    const float* bs = b.data + s * b.set_stride;
    const float* bias_s = bias ? bias + s * bias_set_stride : nullptr;
    for (std::int64_t i = 0; i < m; i += R)
      dot_tile<R, N>(as + i * a.row_stride, a.row_stride, bs, b.col_stride, k, bias_s, relu, c + (s * m + i) * N, N,
                     std::min<std::int64_t>(R, m - i));
  }
}

// c (contiguous [sets, m, n]) = a[s] (m x k) b[s] (k x n) + bias[s] (n; null: none), ReLU'd if asked.
__attribute__((target("avx2,fma"))) inline void multiply_avx2(std::int64_t sets, std::int64_t m, std::int64_t n,
                                                             std::int64_t k, const strided& a, const strided& b,
                                                             const float* bias, std::int64_t bias_set_stride, bool relu,
                                                             float* c) {
  // Few columns (a Linear with few outputs: a critic's value, a policy's mean) would fill 4 of a
  // tile's lanes or fewer, in 6 chains of FMAs: where k is contiguous in both operands (a Linear's
  // forward), dot products along k fill every lane in 8-12 chains (16 sets of [32, 32] x [32, 4]: 16.5 -> 8.3
  // us here; x [32, 1]: 14.4 -> 2.8 us).
  if (n <= 4 && a.col_stride == 1 && b.row_stride == 1) {
    switch (n) {
      case 1: return multiply_narrow<1>(sets, m, k, a, b, bias, bias_set_stride, relu, c);
      case 2: return multiply_narrow<2>(sets, m, k, a, b, bias, bias_set_stride, relu, c);
      case 3: return multiply_narrow<3>(sets, m, k, a, b, bias, bias_set_stride, relu, c);
      default: return multiply_narrow<4>(sets, m, k, a, b, bias, bias_set_stride, relu, c);
    }
  }
  const std::int64_t ldb = (n + 15) / 16 * 16;
  // Per set: b as [k x ldb] and the bias [ldb], zero-padded.
  thread_local std::vector<float> buffer;
  buffer.assign(static_cast<std::size_t>((k + 1) * ldb), 0.0f);
  float* const packed_b = buffer.data();
  float* const packed_bias = packed_b + k * ldb;
  for (std::int64_t s = 0; s < sets; ++s) {
    if (s == 0 || b.set_stride != 0) pack(b.data + s * b.set_stride, b.row_stride, b.col_stride, k, n, packed_b, ldb);
    if (bias) std::memcpy(packed_bias, bias + s * bias_set_stride, static_cast<std::size_t>(n) * sizeof(float));
    const float* as = a.data + s * a.set_stride;
    float* cs = c + s * m * n;
    for (std::int64_t j = 0; j < n; j += 16) {
      const std::int64_t cols = std::min<std::int64_t>(16, n - j);
      for (std::int64_t i = 0; i < m; i += 6) {
        const std::int64_t rows = std::min<std::int64_t>(6, m - i);
        if (cols > 8)
          tile<2>(as + i * a.row_stride, a.row_stride, a.col_stride, packed_b + j, ldb, k, packed_bias + j, relu, cs + i * n + j,
                  n, rows, cols);
        else
          tile<1>(as + i * a.row_stride, a.row_stride, a.col_stride, packed_b + j, ldb, k, packed_bias + j, relu, cs + i * n + j,
                  n, rows, cols);
      }
    }
  }
}
#endif

// The operand from set `first` on.
inline strided from_set(strided v, std::int64_t first) {
  v.data += first * v.set_stride;
  return v;
}

// out (a contiguous float [sets, m, n] tensor) = a[s] b[s] (+ bias[s]; undefined: none; [sets, n], or
// [n] shared), ReLU'd if asked, for the sets [first, first + count) (count < 0: to the last).
// Call only where takes() and fits() said so.
inline void multiply(const strided& a, const strided& b, const at::Tensor& bias, bool relu, std::int64_t k, at::Tensor& out,
                     std::int64_t first = 0, std::int64_t count = -1) {
  const std::int64_t sets = count < 0 ? out.size(0) - first : count, m = out.size(1), n = out.size(2);
  const std::int64_t bias_set_stride = bias.defined() && bias.dim() == 2 ? bias.stride(0) : 0;
  const float* bias_data = bias.defined() ? bias.data_ptr<float>() + first * bias_set_stride : nullptr;
  TORCH_CHECK(!bias.defined() || bias.stride(-1) == 1, "tensordict: batched_gemm: a bias with strided columns");
#if TENSORDICT_X86_KERNELS
  multiply_avx2(sets, m, n, k, from_set(a, first), from_set(b, first), bias_data, bias_set_stride, relu,
                out.data_ptr<float>() + first * m * n);
#else
  (void)a, (void)b, (void)relu, (void)k, (void)bias_data, (void)bias_set_stride, (void)sets, (void)m, (void)n;
  TORCH_CHECK(false, "tensordict: batched_gemm::multiply on a CPU without AVX2 (takes() said no)");
#endif
}

#if TENSORDICT_X86_KERNELS
// The row of relu_backward: o = 0 where h <= 0, else g (libtorch's
// threshold_backward: a NaN output passes its gradient on). A blend, not a
// branch: the signs are random, and a branch mispredicted at ~5 ns a number.
__attribute__((target("avx2,fma"))) inline void relu_backward_row(const float* g, std::int64_t g_stride, const float* h, float* o,
                                                                  std::int64_t n) {
  std::int64_t j = 0;
  if (g_stride == 1)
    for (; j + 8 <= n; j += 8) {
      const __m256 passes = _mm256_cmp_ps(_mm256_loadu_ps(h + j), _mm256_setzero_ps(), _CMP_NLE_UQ);
      _mm256_storeu_ps(o + j, _mm256_and_ps(passes, _mm256_loadu_ps(g + j)));
    }
  for (; j < n; ++j) o[j] = h[j] <= 0.0f ? 0.0f : g[j * g_stride];
}

// o[j] = the sum over the rows of g[i][j] (strides row_stride, col_stride), row after row as the
// scalar sum would add them; 32 columns at a time in registers (a row at a time through memory
// took 5 us for 16 x [32, 32] here).
__attribute__((target("avx2,fma"))) inline void column_sums(const float* g, std::int64_t rows, std::int64_t n, std::int64_t row_stride,
                                                           std::int64_t col_stride, float* o) {
  std::int64_t j = 0;
  if (col_stride == 1) {
    for (; j + 32 <= n; j += 32) {
      __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      for (std::int64_t i = 0; i < rows; ++i) {
        const float* row = g + i * row_stride + j;
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(row)), s1 = _mm256_add_ps(s1, _mm256_loadu_ps(row + 8));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(row + 16)), s3 = _mm256_add_ps(s3, _mm256_loadu_ps(row + 24));
      }
      _mm256_storeu_ps(o + j, s0), _mm256_storeu_ps(o + j + 8, s1), _mm256_storeu_ps(o + j + 16, s2), _mm256_storeu_ps(o + j + 24, s3);
    }
    for (; j + 8 <= n; j += 8) {
      __m256 sum = _mm256_setzero_ps();
      for (std::int64_t i = 0; i < rows; ++i) sum = _mm256_add_ps(sum, _mm256_loadu_ps(g + i * row_stride + j));
      _mm256_storeu_ps(o + j, sum);
    }
  }
  for (; j < n; ++j) {
    float sum = 0.0f;
    for (std::int64_t i = 0; i < rows; ++i) sum += g[i * row_stride + j * col_stride];
    o[j] = sum;
  }
}
#endif

// out = 0 where h <= 0, else g (a ReLU's backward from its output h), for
// [sets, rows, n] float tensors: out and h contiguous, g read through its
// strides (autograd's gradient may be an expanded one); out may be g. For the
// sets [first, first + count) (count < 0: to the last). Call only where takes() said so.
inline void relu_backward(const at::Tensor& g, const at::Tensor& h, at::Tensor& out, std::int64_t first = 0, std::int64_t count = -1) {
  const std::int64_t rows = out.size(1), n = out.size(2), end = count < 0 ? out.size(0) : first + count;
  const strided gv = view(g);
  const float* hv = h.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (std::int64_t s = first; s < end; ++s)
    for (std::int64_t i = 0; i < rows; ++i) {
      const std::int64_t at = (s * rows + i) * n;
#if TENSORDICT_X86_KERNELS
      relu_backward_row(gv.data + s * gv.set_stride + i * gv.row_stride, gv.col_stride, hv + at, o + at, n);
#else
      (void)hv, (void)o, (void)at;
#endif
    }
}

// out[s] = the sum over the rows of g[s] (g [sets, rows, n] read through its strides, out a
// contiguous float [sets, n] tensor), for the sets [first, first + count). Call only where takes() said so.
inline void row_sums(const at::Tensor& g, at::Tensor& out, std::int64_t first, std::int64_t count) {
  const std::int64_t rows = g.size(1), n = g.size(2);
  const strided gv = view(g);
  float* o = out.data_ptr<float>();
#if TENSORDICT_X86_KERNELS
  for (std::int64_t s = first; s < first + count; ++s)
    column_sums(gv.data + s * gv.set_stride, rows, n, gv.row_stride, gv.col_stride, o + s * n);
#else
  (void)o, (void)rows, (void)n, (void)first, (void)count;
#endif
}

}  // namespace tensordict::detail::batched_gemm
