// The process settings the GEMM benchmarks run under, set before libtorch's
// BLAS reads them: run_again_with_bench_settings(argv) sets what is missing
// and runs the program again (it returns only where nothing had to change).
//   - One BLAS thread (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS): the intra-op
//     threads are the parallelism measured.
//   - glibc keeps freed memory: it gives blocks over 32 MiB (a stacked
//     [8, 512, 2048] activation) back to the OS on free, and the page faults of
//     taking them again cost more than the GEMM that fills them (measured: a
//     bmm of that size 110 ms, 12 ms with the memory kept), as a long-running
//     training process would not see.
//   - OpenBLAS's kernels for this CPU: OpenBLAS picks them by CPU model, and
//     0.3.21 (Debian 12) does not know recent Xeons (a Sapphire Rapids under a
//     hypervisor here): it falls back to Prescott's SSE3 kernels (measured:
//     at::mm 512x512 13 GFLOP/s, 146 with SkylakeX's). Where it did, and the
//     CPU has AVX-512 (or AVX2), OPENBLAS_CORETYPE names SkylakeX (Haswell).
#pragma once

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace bench {

// The core OpenBLAS chose its kernels for ("" where the BLAS is not OpenBLAS).
inline std::string openblas_core() {
  using corename_fn = char* (*)();
  auto corename = reinterpret_cast<corename_fn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  return corename ? corename() : "";
}

// Which BLAS library this process loaded (libblas.so.3 is an alternative), and OpenBLAS's core.
inline std::string blas_in_use() {
  std::ifstream maps("/proc/self/maps");
  std::string line, path = "unknown";
  while (std::getline(maps, line))
    if (line.find("blas") != std::string::npos) {
      path = line.substr(line.find('/'));
      break;
    }
  const std::string core = openblas_core();
  if (core.empty()) return path;
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  return path + ", OpenBLAS core " + core + (forced ? " (OPENBLAS_CORETYPE)" : "");
}

inline void run_again_with_bench_settings(char** argv) {
  bool changed = false;
  auto set = [&](const char* name, const char* value) {
    if (const char* now = std::getenv(name); now && std::strcmp(now, value) == 0) return;
    setenv(name, value, 1);
    changed = true;
  };
  set("OPENBLAS_NUM_THREADS", "1");
  set("OMP_NUM_THREADS", "1");
  set("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296");
  if (!std::getenv("OPENBLAS_CORETYPE") && openblas_core() == "Prescott") {
    if (__builtin_cpu_supports("avx512f"))
      set("OPENBLAS_CORETYPE", "SkylakeX");
    else if (__builtin_cpu_supports("avx2"))
      set("OPENBLAS_CORETYPE", "Haswell");
  }
  if (changed) execv("/proc/self/exe", argv);
}

}  // namespace bench
