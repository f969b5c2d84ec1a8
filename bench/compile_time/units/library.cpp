// libtensordict's one TU (<tensordict/library.hpp>): compiled once when the
// package is built, never by a consumer's edit.
#include <tensordict/library.hpp>
