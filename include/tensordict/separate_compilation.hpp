// The definitions of the library's non-template functions, for a program
// whose translation units are compiled with -DTENSORDICT_SEPARATE_COMPILATION
// (detail/config.hpp): include this header in exactly one of them, before any
// other tensordict header, and that TU compiles the lowered ensemble
// machinery (batched GEMM kernels, fused autograd nodes, parallel tasks) once
// for the program instead of once per TU that calls it.
//
//   // tensordict_definitions.cpp, compiled as every TU with -DTENSORDICT_SEPARATE_COMPILATION
//   #include <tensordict/separate_compilation.hpp>
#pragma once

#if defined(TENSORDICT_CONFIG_INCLUDED)
#error "include <tensordict/separate_compilation.hpp> before any other tensordict header of its translation unit"
#endif
#if !defined(TENSORDICT_SEPARATE_COMPILATION)
#error "compile every translation unit with -DTENSORDICT_SEPARATE_COMPILATION, this one too (without it each TU defines the functions inline)"
#endif
#define TENSORDICT_SEPARATE_COMPILATION_SOURCE 1

#include "tensordict.hpp"
