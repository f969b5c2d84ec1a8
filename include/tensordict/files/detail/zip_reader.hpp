// Reading zip archives whose members are stored (uncompressed), as
// torch.save writes them: the central directory, zip64, each member's bytes
// located in the file without copying. Every length and offset is checked
// against the bytes given (they come from outside); anything else throws
// tensordict::file_error. Libtorch-free, so the fuzz target compiles it with
// clang's libFuzzer.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "../../errors.hpp"

namespace tensordict::detail::archive {

// ---- bytes ----------------------------------------------------------------------

// CRC-32 (zip's polynomial), eight bytes a step ("slicing by 8"): about 8x
// the byte-wise table's speed, which matters when a load checks every record.
inline std::uint32_t crc32(const unsigned char* data, std::size_t size, std::uint32_t crc = 0) {
  static const auto tables = [] {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i)
      for (std::size_t k = 1; k < 8; ++k) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
    return t;
  }();
  crc = ~crc;
  std::size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    const std::uint32_t low = crc ^ (std::uint32_t(data[i]) | std::uint32_t(data[i + 1]) << 8 |
                                     std::uint32_t(data[i + 2]) << 16 | std::uint32_t(data[i + 3]) << 24);
    crc = tables[7][low & 0xFF] ^ tables[6][(low >> 8) & 0xFF] ^ tables[5][(low >> 16) & 0xFF] ^ tables[4][low >> 24] ^
          tables[3][data[i + 4]] ^ tables[2][data[i + 5]] ^ tables[1][data[i + 6]] ^ tables[0][data[i + 7]];
  }
  for (; i < size; ++i) crc = tables[0][(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

// Little-endian reads that check the bounds.
class reader {
 public:
  reader(std::string_view bytes, const char* what) : bytes_(bytes), what_(what) {}

  std::size_t position() const { return pos_; }
  std::size_t remaining() const { return bytes_.size() - pos_; }
  bool at_end() const { return pos_ == bytes_.size(); }

  std::string_view take(std::size_t n) {
    if (n > remaining())
      throw file_error(std::string(what_) + " is truncated: needs " + std::to_string(n) + " bytes at offset " +
                       std::to_string(pos_) + ", " + std::to_string(remaining()) + " left");
    auto out = bytes_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  template <class T>
  T little() {
    auto raw = take(sizeof(T));
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= std::uint64_t(static_cast<unsigned char>(raw[i])) << (8 * i);
    T out;
    std::memcpy(&out, &v, sizeof(T));  // the low bytes on a little-endian machine
    return out;
  }
  std::uint8_t byte() { return static_cast<std::uint8_t>(take(1)[0]); }
  std::string_view line() {
    const std::size_t end = bytes_.find('\n', pos_);
    if (end == std::string_view::npos) throw file_error(std::string(what_) + " is truncated: a line has no end");
    auto out = bytes_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }

 private:
  std::string_view bytes_;
  const char* what_;
  std::size_t pos_ = 0;
};

// ---- zip ------------------------------------------------------------------------------

struct zip_entry {
  std::string name;
  std::size_t offset = 0;  // of the data
  std::size_t size = 0;
  std::uint32_t crc = 0;
};

// The entries of a zip archive whose members are stored (torch.save and
// tensordict's .tdz never compress); `format` names the file's kind in errors.
inline std::vector<zip_entry> zip_entries(std::string_view file, std::string_view format = "torch.save") {
  const std::string not_a = "not a " + std::string(format) + " file: ";
  constexpr std::uint32_t end_signature = 0x06054b50, zip64_locator = 0x07064b50, zip64_end = 0x06064b50;
  constexpr std::uint32_t central_signature = 0x02014b50, local_signature = 0x04034b50;
  if (file.size() < 22) throw file_error(not_a + std::to_string(file.size()) + " bytes is too short for a zip archive");
  // The end record is within the last 64 KiB + 22 bytes (its comment is at most 65535 bytes).
  std::size_t end = std::string_view::npos;
  const std::size_t lowest = file.size() > 65557 ? file.size() - 65557 : 0;
  for (std::size_t p = file.size() - 22 + 1; p-- > lowest;) {
    reader r(file.substr(p, 4), "the zip archive");
    if (r.little<std::uint32_t>() == end_signature) {
      end = p;
      break;
    }
  }
  if (end == std::string_view::npos) {
    if (format == "torch.save" && static_cast<unsigned char>(file[0]) == 0x80)
      throw file_error("a torch.save file in the legacy format (_use_new_zipfile_serialization=False) is not supported; "
                       "save it again with torch.save's default format");
    throw file_error(not_a + "no zip end record (truncated, or not a zip archive)");
  }
  reader e(file.substr(end), "the zip end record");
  e.take(4);
  const std::uint16_t disk = e.little<std::uint16_t>(), directory_disk = e.little<std::uint16_t>();
  e.take(2);
  std::uint64_t count = e.little<std::uint16_t>();
  std::uint64_t directory_size = e.little<std::uint32_t>();
  std::uint64_t directory_offset = e.little<std::uint32_t>();
  if (disk != 0 || directory_disk != 0) throw file_error("the zip archive spans several disks");
  if (count == 0xFFFF || directory_size == 0xFFFFFFFF || directory_offset == 0xFFFFFFFF) {
    if (end < 20) throw file_error("the zip64 locator is missing");
    reader l(file.substr(end - 20, 20), "the zip64 locator");
    if (l.little<std::uint32_t>() != zip64_locator) throw file_error("the zip64 locator is missing");
    l.take(4);
    const std::uint64_t at = l.little<std::uint64_t>();
    if (at >= file.size()) throw file_error("the zip64 end record is outside the file");
    reader z(file.substr(at), "the zip64 end record");
    if (z.little<std::uint32_t>() != zip64_end) throw file_error("the zip64 end record has a wrong signature");
    z.take(8 + 2 + 2 + 4 + 4 + 8);
    count = z.little<std::uint64_t>();
    directory_size = z.little<std::uint64_t>();
    directory_offset = z.little<std::uint64_t>();
  }
  if (directory_offset > file.size() || directory_size > file.size() - directory_offset)
    throw file_error("the zip central directory lies outside the file (offset " + std::to_string(directory_offset) + ", " +
                     std::to_string(directory_size) + " bytes, file " + std::to_string(file.size()) + " bytes)");
  if (count > directory_size / 46) throw file_error("the zip central directory is too small for its entry count");
  reader d(file.substr(directory_offset, directory_size), "the zip central directory");
  std::vector<zip_entry> out;
  out.reserve(count);
  for (std::uint64_t k = 0; k < count; ++k) {
    if (d.little<std::uint32_t>() != central_signature) throw file_error("a zip central directory entry has a wrong signature");
    d.take(4);
    const std::uint16_t flags = d.little<std::uint16_t>(), method = d.little<std::uint16_t>();
    d.take(4);
    zip_entry entry;
    entry.crc = d.little<std::uint32_t>();
    std::uint64_t compressed = d.little<std::uint32_t>();
    std::uint64_t size = d.little<std::uint32_t>();
    const std::uint16_t name_length = d.little<std::uint16_t>(), extra_length = d.little<std::uint16_t>(),
                        comment_length = d.little<std::uint16_t>();
    d.take(8);
    std::uint64_t local = d.little<std::uint32_t>();
    entry.name = std::string(d.take(name_length));
    reader extra(d.take(extra_length), "a zip extra field");
    while (extra.remaining() >= 4) {
      const std::uint16_t id = extra.little<std::uint16_t>(), length = extra.little<std::uint16_t>();
      reader field(extra.take(length), "a zip64 extra field");
      if (id != 0x0001) continue;
      if (size == 0xFFFFFFFF) size = field.little<std::uint64_t>();
      if (compressed == 0xFFFFFFFF) compressed = field.little<std::uint64_t>();
      if (local == 0xFFFFFFFF) local = field.little<std::uint64_t>();
    }
    d.take(comment_length);
    if (method != 0)
      throw file_error("the zip entry \"" + entry.name + "\" is compressed (method " + std::to_string(method) +
                       "); " + std::string(format) + " stores entries uncompressed");
    if (flags & 1) throw file_error("the zip entry \"" + entry.name + "\" is encrypted");
    if (compressed != size) throw file_error("the zip entry \"" + entry.name + "\" has different stored and real sizes");
    if (local > file.size() || file.size() - local < 30)
      throw file_error("the zip entry \"" + entry.name + "\" has its header outside the file");
    reader h(file.substr(local, 30), "a zip local header");
    if (h.little<std::uint32_t>() != local_signature) throw file_error("the zip entry \"" + entry.name + "\" has a wrong local header signature");
    h.take(22);
    const std::uint64_t data = local + 30 + h.little<std::uint16_t>() + std::uint64_t{h.little<std::uint16_t>()};
    if (data > file.size() || size > file.size() - data)
      throw file_error("the zip entry \"" + entry.name + "\" (" + std::to_string(size) + " bytes) extends past the end of the file");
    entry.offset = data;
    entry.size = size;
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace tensordict::detail::archive
