// What the CPU running the program offers the library's own kernels
// (detail/kernels/fused_lstm_cell.hpp, detail/kernels/batched_gemm.hpp): they are compiled for
// AVX2 + FMA with a function attribute whatever the translation unit's flags,
// and called only where this CPU has both; elsewhere libtorch's ops run.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TENSORDICT_X86_KERNELS 1
#else
#define TENSORDICT_X86_KERNELS 0
#endif

namespace tensordict::detail {

// Whether this CPU runs the AVX2 + FMA kernels (checked once).
inline bool avx2_fma_supported() {
#if TENSORDICT_X86_KERNELS
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
#else
  return false;
#endif
}

}  // namespace tensordict::detail
