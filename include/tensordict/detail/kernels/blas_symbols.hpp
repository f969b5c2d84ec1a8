// The process's BLAS, found at run time: Debian's libtorch calls libblas.so.3,
// which is whatever BLAS the system points it to (OpenBLAS, the reference BLAS,
// BLIS), so its functions are looked up by name rather than linked.
#pragma once

#include <dlfcn.h>

namespace tensordict::detail {

// The function `name` as the process exports it (Fortran BLAS's sgemm_,
// OpenBLAS's openblas_set_num_threads), or null where none does.
template <class Function>
Function* blas_symbol(const char* name) {
  return reinterpret_cast<Function*>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace tensordict::detail
