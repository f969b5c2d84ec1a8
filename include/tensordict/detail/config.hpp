// Separate compilation. By default the library is header-only: every
// function is defined in the headers, and every translation unit that calls
// one compiles it (at -O3 the lowered ensemble machinery -- batched GEMM
// kernels, fused autograd nodes, the parallel tasks -- costs seconds per TU).
// Compile every TU of a program with -DTENSORDICT_SEPARATE_COMPILATION and
// those non-template functions are only declared there; exactly one TU
// includes <tensordict/separate_compilation.hpp>, which defines them.
#pragma once

#define TENSORDICT_CONFIG_INCLUDED 1

#if defined(TENSORDICT_SEPARATE_COMPILATION)
// Declared in every TU, defined (not inline) in the one that includes separate_compilation.hpp.
#define TENSORDICT_DECL
#if defined(TENSORDICT_SEPARATE_COMPILATION_SOURCE)
#define TENSORDICT_DEFINITIONS 1
#else
#define TENSORDICT_DEFINITIONS 0
#endif
#else
#define TENSORDICT_DECL inline
#define TENSORDICT_DEFINITIONS 1
#endif
