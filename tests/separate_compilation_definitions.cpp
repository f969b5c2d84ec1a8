// The one translation unit of separate_compilation_tests that defines the
// library's non-template functions (compiled, like the test, with
// -DTENSORDICT_SEPARATE_COMPILATION).
#include <tensordict/separate_compilation.hpp>
