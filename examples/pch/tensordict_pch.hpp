// Precompiled once (g++) for the examples and benchmarks that include the
// umbrella header (meson.build): bench/get.cpp then compiles at -O3 in 20.0 s
// instead of 39.7. The sources still include it themselves.
#include <tensordict/tensordict.hpp>
