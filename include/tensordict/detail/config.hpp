// Where the library's non-template functions are compiled (the lowered
// ensemble machinery: batched GEMM kernels, fused autograd nodes, parallel
// tasks; the run-time registry; the file formats; the distributions and their
// vtables; AnyTensorDict's members; the typed TensorDict's work that does not
// depend on its schema: leaf checks, indexed writes, batch sizes of nested
// levels, the conversions to and from AnyTensorDict).
//
// By default they are only declared in a program's TUs and defined once, in
// libtensordict (built from <tensordict/library.hpp>; Meson's dependency, the
// pkg-config file and the CMake package link it), as {fmt} does: a TU that
// calls them does not compile them again, which cost seconds per TU at -O3.
// -DTENSORDICT_HEADER_ONLY (every TU of the program) defines them inline in
// every TU that includes them instead, as FMT_HEADER_ONLY: nothing to link.
#pragma once

#define TENSORDICT_CONFIG_INCLUDED 1

#if defined(TENSORDICT_SEPARATE_COMPILATION)
#error "-DTENSORDICT_SEPARATE_COMPILATION is the default now: drop it and link libtensordict (or compile one TU of <tensordict/library.hpp>)"
#endif

#if defined(TENSORDICT_HEADER_ONLY)
#define TENSORDICT_DECL inline
#define TENSORDICT_DEFINITIONS 1
#else
// Declared in every TU, defined (not inline) in the one of <tensordict/library.hpp>.
#define TENSORDICT_DECL
#if defined(TENSORDICT_LIBRARY_SOURCE)
#define TENSORDICT_DEFINITIONS 1
#else
#define TENSORDICT_DEFINITIONS 0
#endif
#endif
