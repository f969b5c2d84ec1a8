// Catch2 next to libtorch, v2 (Debian 12) or v3 (Debian 13): the tests'
// one compat header. Every test file includes it instead of Catch2.
//   - c10's logging header defines a CHECK macro of its own, so it is
//     included first and Catch2's CHECK replaces it (libtorch 2.x no longer
//     pulls it in through Tensor.h, so it is named here).
//   - test::Contains matches a substring (v3 renamed it ContainsSubstring;
//     v3's Contains matches range elements).
//   - A file that defines CATCH_CONFIG_RUNNER before including this gets
//     Catch::Session for its own main().
#pragma once

#include <string>

#include <ATen/core/Tensor.h>
#include <c10/util/Logging.h>
#undef CHECK

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
namespace test {
inline auto Contains(const std::string& text) { return Catch::Matchers::ContainsSubstring(text); }
}  // namespace test
#else
#include <catch2/catch.hpp>
namespace test {
inline auto Contains(const std::string& text) { return Catch::Matchers::Contains(text); }
}  // namespace test
#endif
