// The source of libtensordict: the definitions of the library's non-template
// functions (detail/config.hpp). Meson builds it into the library its
// dependency, pkg-config file and CMake package link. A program built without
// them may instead include this header in exactly one of its TUs, before any
// other tensordict header:
//
//   // tensordict_library.cpp
//   #include <tensordict/library.hpp>
#pragma once

#if defined(TENSORDICT_CONFIG_INCLUDED)
#error "include <tensordict/library.hpp> before any other tensordict header of its translation unit"
#endif
#if defined(TENSORDICT_HEADER_ONLY)
#error "with -DTENSORDICT_HEADER_ONLY every TU defines the library's functions inline: leave <tensordict/library.hpp> out"
#endif
#define TENSORDICT_LIBRARY_SOURCE 1

#include "tensordict.hpp"

#include "cpu_cache.hpp"
#include "files/memmap.hpp"
#include "files/safetensors.hpp"
#include "files/consolidated.hpp"
#include "optim/adam.hpp"
