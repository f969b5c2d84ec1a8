// The safetensors format (https://huggingface.co/docs/safetensors), its
// header checked as the format's rules say:
//
//   8 bytes      N, the header's length, little-endian unsigned
//   N bytes      a JSON object (UTF-8, may end in spaces):
//                  {"__metadata__": {"key": "value", ...},          (optional, strings only)
//                   "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//   the rest     the byte buffer: each tensor row-major, little-endian, at
//                [begin, end) relative to the buffer's start
//
// Offsets must be in bounds, sized as dtype and shape say, and cover the buffer
// without holes or overlaps; names appear once. Anything else throws
// file_error naming the problem. Libtorch-free (the fuzz target compiles it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../errors.hpp"
#include "dtypes.hpp"

namespace tensordict::detail::safetensors {

// The format's own limit on the header (the reference implementation refuses larger ones).
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

struct tensor_entry {
  std::string name;
  const file_dtype* dtype = nullptr;
  std::string dtype_name;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // relative to the buffer
};

struct header {
  std::vector<tensor_entry> tensors;  // in the header's order
  std::vector<std::pair<std::string, std::string>> metadata;
  std::uint64_t buffer_offset = 0;  // 8 + N
  std::uint64_t buffer_size = 0;
};

inline header parse(std::string_view file) {
  using json = nlohmann::ordered_json;
  if (file.size() < 8)
    throw file_error("not a safetensors file: " + std::to_string(file.size()) + " bytes is too short for its header length");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(file[i])) << (8 * i);
  if (n > max_header_bytes)
    throw file_error("the safetensors header length " + std::to_string(n) + " is over the format's limit of " +
                     std::to_string(max_header_bytes) + " bytes");
  if (n > file.size() - 8)
    throw file_error("the safetensors header length " + std::to_string(n) + " reaches past the end of the file (" +
                     std::to_string(file.size()) + " bytes)");
  const std::string_view text = file.substr(8, n);
  if (text.empty() || text.front() != '{') throw file_error("the safetensors header is not a JSON object (it must start with '{')");

  // Duplicate names would make one tensor silently replace another: refused.
  std::unordered_set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t on_key = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && !seen.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json root = json::parse(text.begin(), text.end(), on_key, /*allow_exceptions=*/false);
  if (root.is_discarded()) throw file_error("the safetensors header is not valid JSON");
  if (!duplicate.empty()) throw file_error("the safetensors header names \"" + duplicate + "\" twice");
  if (!root.is_object()) throw file_error("the safetensors header is not a JSON object");

  header out;
  out.buffer_offset = 8 + n;
  out.buffer_size = file.size() - out.buffer_offset;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw file_error("the safetensors \"__metadata__\" is not a JSON object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          throw file_error("the safetensors metadata \"" + m.key() + "\" is not a string (the format allows only strings)");
        out.metadata.emplace_back(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    const std::string where = "the safetensors tensor \"" + name + "\"";
    if (!v.is_object()) throw file_error(where + " is not described by a JSON object");
    const auto dtype = v.find("dtype");
    const auto shape = v.find("shape");
    const auto offsets = v.find("data_offsets");
    if (dtype == v.end() || shape == v.end() || offsets == v.end())
      throw file_error(where + " lacks \"dtype\", \"shape\" or \"data_offsets\"");
    tensor_entry t;
    t.name = name;
    if (!dtype->is_string()) throw file_error(where + ": \"dtype\" is not a string");
    t.dtype_name = dtype->get<std::string>();
    t.dtype = find_safetensors_dtype(t.dtype_name);
    if (!t.dtype) throw file_error(where + " has the unknown dtype \"" + t.dtype_name + "\"");
    if (!shape->is_array()) throw file_error(where + ": \"shape\" is not an array");
    if (shape->size() > 64) throw file_error(where + " has " + std::to_string(shape->size()) + " dimensions, more than 64");
    for (const auto& s : *shape) {
      if (!s.is_number_unsigned() || s.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
        throw file_error(where + ": its shape " + shape->dump() + " is not a list of non-negative integers");
      t.shape.push_back(s.get<std::int64_t>());
    }
    if (!offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned())
      throw file_error(where + ": \"data_offsets\" is not [begin, end]");
    t.begin = (*offsets)[0].get<std::uint64_t>();
    t.end = (*offsets)[1].get<std::uint64_t>();
    if (t.begin > t.end || t.end > out.buffer_size)
      throw file_error(where + " has data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                       "] outside the buffer of " + std::to_string(out.buffer_size) + " bytes");
    const auto bytes = byte_size(t.shape, t.dtype->element_size);
    if (!bytes || *bytes != t.end - t.begin)
      throw file_error(where + ": " + t.dtype_name + " of shape " + shape->dump() + " needs " +
                       (bytes ? std::to_string(*bytes) : std::string("too many")) + " bytes, its data_offsets span " +
                       std::to_string(t.end - t.begin));
    out.tensors.push_back(std::move(t));
  }
  // The buffer is covered exactly: no overlap, no hole (the format forbids both).
  std::vector<const tensor_entry*> by_offset;
  for (const auto& t : out.tensors) by_offset.push_back(&t);
  std::stable_sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin || (a->begin == b->begin && a->end < b->end); });
  std::uint64_t covered = 0;
  for (const auto* t : by_offset) {
    if (t->begin < covered)
      throw file_error("the safetensors tensor \"" + t->name + "\" overlaps another (data_offsets [" + std::to_string(t->begin) +
                       ", " + std::to_string(t->end) + "])");
    if (t->begin > covered)
      throw file_error("the safetensors buffer has a hole of " + std::to_string(t->begin - covered) + " bytes before \"" +
                       t->name + "\"");
    covered = t->end;
  }
  if (covered != out.buffer_size)
    throw file_error("the safetensors buffer has " + std::to_string(out.buffer_size - covered) +
                     " bytes after its last tensor that no tensor covers");
  return out;
}

}  // namespace tensordict::detail::safetensors
