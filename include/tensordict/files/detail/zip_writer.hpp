// Writing zip archives of stored (uncompressed) members, as tensordict 0.14
// writes its .tdz archives: zip64 records throughout (no limit on sizes), and
// each member's bytes aligned to 64 in the file by an extra field of padding
// ("td", as Python's writer names it), so that a reader can map them as tensors.
// zip_reader.hpp reads them back. Libtorch-free.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "zip_reader.hpp"

namespace tensordict::detail::archive {

class zip_writer {
 public:
  explicit zip_writer(std::ostream& out) : out_(out) {}

  void add(const std::string& name, std::string_view bytes) {
    constexpr std::uint64_t alignment = 64;
    const std::uint32_t crc = crc32(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
    const std::uint64_t header_end = offset_ + 30 + name.size() + 20 + 4;  // fixed part, name, zip64 field, padding's header
    const std::uint64_t padding = (alignment - header_end % alignment) % alignment;
    entries_.push_back({name, crc, bytes.size(), offset_});
    put32(0x04034b50);
    put16(45);  // version needed: zip64
    put16(0);   // flags
    put16(0);   // stored
    put16(0);   // time
    put16(0x21);  // date: 1980-01-01
    put32(crc);
    put32(0xFFFFFFFF);  // sizes: in the zip64 field
    put32(0xFFFFFFFF);
    put16(static_cast<std::uint16_t>(name.size()));
    put16(static_cast<std::uint16_t>(20 + 4 + padding));
    write(name);
    put16(0x0001);
    put16(16);
    put64(bytes.size());
    put64(bytes.size());
    put16(0x6474);  // "td"
    put16(static_cast<std::uint16_t>(padding));
    write(std::string(padding, '\0'));
    write(bytes);
  }

  // The central directory and the end records.
  void finish() {
    const std::uint64_t directory = offset_;
    for (const auto& e : entries_) {
      put32(0x02014b50);
      put16(45);  // made by
      put16(45);  // needed
      put16(0);
      put16(0);
      put16(0);
      put16(0x21);
      put32(e.crc);
      put32(0xFFFFFFFF);
      put32(0xFFFFFFFF);
      put16(static_cast<std::uint16_t>(e.name.size()));
      put16(4 + 24);
      put16(0);  // comment
      put16(0);  // disk
      put16(0);  // internal attributes
      put32(0100644u << 16);  // a regular file, rw-r--r--
      put32(0xFFFFFFFF);  // the local header's offset: in the zip64 field
      write(e.name);
      put16(0x0001);
      put16(24);
      put64(e.size);
      put64(e.size);
      put64(e.offset);
    }
    const std::uint64_t directory_size = offset_ - directory, end64 = offset_;
    put32(0x06064b50);
    put64(44);
    put16(45);
    put16(45);
    put32(0);
    put32(0);
    put64(entries_.size());
    put64(entries_.size());
    put64(directory_size);
    put64(directory);
    put32(0x07064b50);
    put32(0);
    put64(end64);
    put32(1);
    put32(0x06054b50);
    put16(0);
    put16(0);
    put16(0xFFFF);
    put16(0xFFFF);
    put32(0xFFFFFFFF);
    put32(0xFFFFFFFF);
    put16(0);
  }

  // Whether every name fits a zip record (at most 65535 bytes).
  static bool valid_name(const std::string& name) { return !name.empty() && name.size() <= 0xFFFF; }

 private:
  struct entry {
    std::string name;
    std::uint32_t crc;
    std::uint64_t size, offset;
  };
  void write(std::string_view bytes) {
    out_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    offset_ += bytes.size();
  }
  template <class T>
  void put(T v) {
    char raw[sizeof(T)];
    for (std::size_t i = 0; i < sizeof(T); ++i) raw[i] = static_cast<char>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xFF);
    write(std::string_view(raw, sizeof(T)));
  }
  void put16(std::uint16_t v) { put(v); }
  void put32(std::uint32_t v) { put(v); }
  void put64(std::uint64_t v) { put(v); }

  std::ostream& out_;
  std::uint64_t offset_ = 0;
  std::vector<entry> entries_;
};

}  // namespace tensordict::detail::archive
