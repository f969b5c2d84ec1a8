// Compiled with clang (-fsyntax-only): keys.hpp and schema.hpp must not depend
// on libtorch, whose 1.13 headers clang 14 cannot parse in C++20 mode.
#include "schema_assertions.hpp"

int main() { return 0; }
