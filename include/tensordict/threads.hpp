// One call for every thread pool a libtorch program computes with:
//
//   tensordict::set_num_threads(2);   // libtorch's intra-op threads; OpenBLAS's pool: one thread
//
// at::set_num_threads sets libtorch's intra-op (OpenMP) threads only. Debian's
// libtorch calls libblas.so.3, OpenBLAS's pthread build where that is
// installed, and OpenBLAS keeps a pool of its own (one thread per core by
// default) whose idle threads yield in a loop: beside libtorch's threads or
// another busy process they take the cores the work needs (measured: a SAC
// update on Pendulum, batch 256, 6 ms with one OpenBLAS thread against 87 ms
// with its default two, on a 2-core machine running a compiler beside it).
#pragma once

#include <string>

#include <ATen/Parallel.h>

#include "detail/kernels/blas_symbols.hpp"
#include "errors.hpp"

namespace tensordict {

namespace detail {
// OpenBLAS's setter where the process loaded OpenBLAS (found at run time: the
// BLAS is whatever libblas.so.3 points to), else null.
inline void (*openblas_thread_setter())(int) { return blas_symbol<void(int)>("openblas_set_num_threads"); }
inline int (*openblas_thread_getter())() { return blas_symbol<int()>("openblas_get_num_threads"); }
}  // namespace detail

// The threads of libtorch's intra-op pool (n) and, where the BLAS is
// OpenBLAS, of OpenBLAS's own pool (blas_threads, one by default). Idle
// OpenMP threads and idle OpenBLAS threads both spin, so two pools of n on
// the same cores take turns at them: a SAC update (batch 256, 2 cores) took
// 3808 us with both at 2, 1458 us with OpenBLAS at 1, 1380 us at one thread.
// With one BLAS thread a GEMM runs on the thread that calls it while
// libtorch's parallel ops (and the library's) use n; a program dominated by
// large GEMMs on an idle machine may give blas_threads = n. Throws
// value_error for n or blas_threads < 1 (and then changes nothing).
inline void set_num_threads(int n, int blas_threads = 1) {
  if (n < 1) throw value_error("tensordict::set_num_threads: n must be at least 1, got " + std::to_string(n));
  if (blas_threads < 1)
    throw value_error("tensordict::set_num_threads: blas_threads must be at least 1, got " + std::to_string(blas_threads));
  at::set_num_threads(n);
  if (auto set_blas = detail::openblas_thread_setter()) set_blas(blas_threads);
}

// OpenBLAS's thread count, or 0 where the process's BLAS is not OpenBLAS.
inline int blas_num_threads() {
  auto get_blas = detail::openblas_thread_getter();
  return get_blas ? get_blas() : 0;
}

}  // namespace tensordict
