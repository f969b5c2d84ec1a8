// Max pooling over the last two dims of contiguous memory, for the batched
// MaxPool2d: libtorch 2.6's max_pool2d took 29 ms a call on a contiguous
// [64, 128, 26, 26] (its channels-last kernel: 3.3 ms), and the lowered
// convolutions of libtorch 2.x leave their outputs contiguous.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gather.h>

#include "cpu_features.hpp"

namespace tensordict::detail {

// A max pooling's options along one spatial dim.
struct pooling_axis {
  std::int64_t kernel, stride, padding, dilation;
};

// One window along a dim: the input positions begin, begin + dilation, ... < end.
struct pooling_window {
  std::int64_t begin, end;
};

// The windows of each output position along a dim, as libtorch's pooling places them (its output size, ceil_mode's
// last window, the padding's skipped positions); empty where one would hold no input position.
inline std::vector<pooling_window> pooling_windows(std::int64_t in, const pooling_axis& a, bool ceil_mode) {
  const std::int64_t span = in + 2 * a.padding - a.dilation * (a.kernel - 1) - 1 + (ceil_mode ? a.stride - 1 : 0);
  std::int64_t out = (span >= 0 ? span / a.stride : -((-span + a.stride - 1) / a.stride)) + 1;
  if (ceil_mode && (out - 1) * a.stride >= in + a.padding) --out;
  std::vector<pooling_window> windows;
  if (out <= 0) return windows;
  windows.reserve(static_cast<std::size_t>(out));
  for (std::int64_t o = 0; o < out; ++o) {
    std::int64_t begin = o * a.stride - a.padding;
    const std::int64_t end = std::min(begin + (a.kernel - 1) * a.dilation + 1, in);
    while (begin < 0) begin += a.dilation;
    if (begin >= end) return {};
    windows.push_back({begin, end});
  }
  return windows;
}

// The rule of libtorch's max_pool2d_with_indices: a window's first max in row-major order, or its last NaN.
template <class T>
void take_max(T v, std::int64_t index, T& max, std::int64_t& best) {
  if (v > max || v != v) {
    max = v;
    best = index;
  }
}

// One row of whole 2x2 windows at stride 2 (MaxPool2d(2)): `top` and `top + width` are the window's two input rows.
// Four windows at a time in SSE2 lanes, where a branch per element mispredicted on random values (libtorch 2.6's
// contiguous kernel: ~20 ns an output).
inline void max_pool_row_2x2(const float* top, std::int64_t width, std::int64_t first_col, std::int64_t out_cols,
                             float* out, std::int64_t* indices, std::int64_t first_index) {
  std::int64_t ow = 0;
#if TENSORDICT_X86_KERNELS
  const float* bottom = top + width;
  const std::int32_t w = static_cast<std::int32_t>(width);  // the caller's width < 2^30
  // Each candidate's offset from its window's first index, and each lane's first index from the first lane's.
  const __m128i offsets[4] = {_mm_setzero_si128(), _mm_set1_epi32(1), _mm_set1_epi32(w), _mm_set1_epi32(w + 1)};
  const __m128i lanes = _mm_setr_epi32(0, 2, 4, 6), zero = _mm_setzero_si128();
  for (; ow + 4 <= out_cols; ow += 4) {
    const float* t = top + first_col + 2 * ow;
    const float* b = bottom + first_col + 2 * ow;
    const __m128 t0 = _mm_loadu_ps(t), t1 = _mm_loadu_ps(t + 4), b0 = _mm_loadu_ps(b), b1 = _mm_loadu_ps(b + 4);
    const __m128 candidates[4] = {_mm_shuffle_ps(t0, t1, _MM_SHUFFLE(2, 0, 2, 0)), _mm_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 1, 3, 1)),
                                  _mm_shuffle_ps(b0, b1, _MM_SHUFFLE(2, 0, 2, 0)), _mm_shuffle_ps(b0, b1, _MM_SHUFFLE(3, 1, 3, 1))};
    __m128 max = candidates[0];
    __m128i best = offsets[0];
    for (int k = 1; k < 4; ++k) {
      const __m128 v = candidates[k];
      const __m128 better = _mm_or_ps(_mm_cmpgt_ps(v, max), _mm_cmpunord_ps(v, v));
      max = _mm_or_ps(_mm_and_ps(better, v), _mm_andnot_ps(better, max));
      const __m128i mask = _mm_castps_si128(better);
      best = _mm_or_si128(_mm_and_si128(mask, offsets[k]), _mm_andnot_si128(mask, best));
    }
    _mm_storeu_ps(out + ow, max);
    best = _mm_add_epi32(best, lanes);  // non-negative: widened with zeros
    const __m128i base = _mm_set1_epi64x(first_index + 2 * ow);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(indices + ow), _mm_add_epi64(base, _mm_unpacklo_epi32(best, zero)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(indices + ow + 2), _mm_add_epi64(base, _mm_unpackhi_epi32(best, zero)));
  }
#endif
  for (; ow < out_cols; ++ow) {
    const std::int64_t index = first_index + 2 * ow;
    float max = -std::numeric_limits<float>::infinity();
    std::int64_t best = index;
    for (const std::int64_t offset : {std::int64_t{0}, std::int64_t{1}, width, width + 1})
      take_max(top[first_col + 2 * ow + offset], index + offset, max, best);
    out[ow] = max;
    indices[ow] = best;
  }
}

// Each plane's max per window and its index in the plane (h * W + w), as libtorch's max_pool2d_with_indices.
template <class T>
void max_pool_planes(const T* in, T* out, std::int64_t* indices, std::int64_t planes, std::int64_t height,
                     std::int64_t width, const std::vector<pooling_window>& rows, const std::vector<pooling_window>& cols,
                     std::int64_t row_dilation, std::int64_t col_dilation) {
  const auto out_rows = static_cast<std::int64_t>(rows.size()), out_cols = static_cast<std::int64_t>(cols.size());
  const std::int64_t plane_out = out_rows * out_cols;
  const auto whole_pairs = [](const std::vector<pooling_window>& windows) {
    for (std::size_t i = 0; i < windows.size(); ++i)
      if (windows[i].begin != windows[0].begin + 2 * static_cast<std::int64_t>(i) || windows[i].end != windows[i].begin + 2)
        return false;
    return true;
  };
  const bool two_by_two = std::is_same_v<T, float> && width < (std::int64_t{1} << 30) && row_dilation == 1 && col_dilation == 1 && whole_pairs(rows) &&
                          whole_pairs(cols);
  const std::int64_t grain = std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(plane_out, 1));
  at::parallel_for(0, planes, grain, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t p = first; p < last; ++p) {
      const T* plane = in + p * height * width;
      T* o = out + p * plane_out;
      std::int64_t* idx = indices + p * plane_out;
      for (std::int64_t oh = 0; oh < out_rows; ++oh) {
        const pooling_window r = rows[static_cast<std::size_t>(oh)];
        if constexpr (std::is_same_v<T, float>) {
          if (two_by_two) {
            max_pool_row_2x2(plane + r.begin * width, width, cols[0].begin, out_cols, o + oh * out_cols,
                             idx + oh * out_cols, r.begin * width + cols[0].begin);
            continue;
          }
        }
        for (std::int64_t ow = 0; ow < out_cols; ++ow) {
          const pooling_window c = cols[static_cast<std::size_t>(ow)];
          std::int64_t best = r.begin * width + c.begin;
          T max = -std::numeric_limits<T>::infinity();
          for (std::int64_t ih = r.begin; ih < r.end; ih += row_dilation)
            for (std::int64_t iw = c.begin; iw < c.end; iw += col_dilation)
              take_max(plane[ih * width + iw], ih * width + iw, max, best);
          o[oh * out_cols + ow] = max;
          idx[oh * out_cols + ow] = best;
        }
      }
    }
  });
}

// libtorch's max_pool2d of `x` ([C, H, W] or [N, C, H, W]) computed by max_pool_planes, where x is a contiguous float
// or double CPU tensor and the options are ones libtorch takes; empty otherwise (the caller's libtorch call decides,
// and says why it refuses). Under autograd the result is a gather of x by the window indices: the gradient goes to
// the same positions as max_pool2d's, and a create_graph backward differentiates it again.
inline std::optional<at::Tensor> max_pool2d_planes(const at::Tensor& x, const std::array<pooling_axis, 2>& axes,
                                                   bool ceil_mode) {
  // Inside vmap or a functorch transform a tensor is a wrapper without storage of its own; a dual tensor's tangent
  // (forward-mode AD) this kernel would not carry.
  if (!x.defined() || !x.device().is_cpu() || x.layout() != at::kStrided || (x.dim() != 3 && x.dim() != 4) ||
      !x.has_storage() || x._fw_grad(/*level=*/0).defined() || !x.is_contiguous() ||
      (x.scalar_type() != at::kFloat && x.scalar_type() != at::kDouble) || x.numel() == 0)
    return std::nullopt;
  for (const pooling_axis& a : axes)
    if (a.kernel <= 0 || a.stride <= 0 || a.dilation <= 0 || a.padding < 0 || a.padding > a.kernel / 2)
      return std::nullopt;
  const std::int64_t height = x.size(-2), width = x.size(-1);
  const auto rows = pooling_windows(height, axes[0], ceil_mode), cols = pooling_windows(width, axes[1], ceil_mode);
  if (rows.empty() || cols.empty()) return std::nullopt;
  std::vector<std::int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape[shape.size() - 2] = static_cast<std::int64_t>(rows.size());
  shape.back() = static_cast<std::int64_t>(cols.size());
  at::Tensor out = at::empty(shape, x.options());
  at::Tensor indices = at::empty(shape, x.options().dtype(at::kLong));
  const std::int64_t planes = x.numel() / (height * width);
  const at::Tensor in = x.detach();
  if (x.scalar_type() == at::kFloat)
    max_pool_planes(in.data_ptr<float>(), out.data_ptr<float>(), indices.data_ptr<std::int64_t>(), planes, height,
                    width, rows, cols, axes[0].dilation, axes[1].dilation);
  else
    max_pool_planes(in.data_ptr<double>(), out.data_ptr<double>(), indices.data_ptr<std::int64_t>(), planes, height,
                    width, rows, cols, axes[0].dilation, axes[1].dilation);
  if (!at::GradMode::is_enabled() || !x.requires_grad()) return out;
  return x.flatten(-2).gather(-1, indices.flatten(-2)).view(shape);
}

}  // namespace tensordict::detail
