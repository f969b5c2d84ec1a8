// The files this process maps shared (load_memory::shared: a memmap buffer's
// leaves write through to them), by the memory each mapping covers: a save
// onto the folder a TensorDict's own leaves map, or a write that the files
// cannot take (a non-tensor value), is refused with the file's name.
// libtorch-free.
#pragma once

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

namespace tensordict::detail {

struct shared_mapping {
  const char* begin;
  const char* end;
  std::string file;  // absolute
};

inline std::mutex& shared_mappings_mutex() {
  static std::mutex m;
  return m;
}
inline std::vector<shared_mapping>& shared_mappings() {
  static std::vector<shared_mapping> v;
  return v;
}

inline void add_shared_mapping(const char* begin, std::size_t size, std::string file) {
  const std::lock_guard<std::mutex> lock(shared_mappings_mutex());
  shared_mappings().push_back({begin, begin + size, std::move(file)});
}
inline void remove_shared_mapping(const char* begin) {
  const std::lock_guard<std::mutex> lock(shared_mappings_mutex());
  auto& v = shared_mappings();
  v.erase(std::remove_if(v.begin(), v.end(), [&](const shared_mapping& m) { return m.begin == begin; }), v.end());
}

// The file whose shared mapping holds the byte at p, or empty.
inline std::string shared_file_at(const void* p) {
  if (!p) return {};
  const char* c = static_cast<const char*>(p);
  const std::lock_guard<std::mutex> lock(shared_mappings_mutex());
  for (const shared_mapping& m : shared_mappings())
    if (c >= m.begin && c < m.end) return m.file;
  return {};
}

}  // namespace tensordict::detail
