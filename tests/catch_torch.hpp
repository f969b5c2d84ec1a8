// Catch2 next to libtorch: c10's logging header defines a CHECK macro of its
// own, so it is included first and Catch2's CHECK replaces it.
#pragma once

#include <ATen/core/Tensor.h>
#undef CHECK
#include <catch2/catch.hpp>
