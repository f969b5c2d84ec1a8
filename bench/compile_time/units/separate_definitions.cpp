// The one TU of a separately compiled program (-DTENSORDICT_SEPARATE_COMPILATION)
// that defines the library's non-template functions: compiled once per program.
#include <tensordict/separate_compilation.hpp>
