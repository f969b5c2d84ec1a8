// The cache a working set should fit in to be computed at a core's speed:
// the L2 of one core (sysconf), 1 MiB where the system does not say.
#pragma once

#include <unistd.h>

#include <cstdint>

namespace tensordict::detail {

inline std::int64_t core_cache_bytes() {
  static const std::int64_t bytes = [] {
    const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<std::int64_t>(l2) : std::int64_t{1} << 20;
  }();
  return bytes;
}

}  // namespace tensordict::detail
