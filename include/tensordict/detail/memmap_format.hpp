// Python tensordict's memmap directories (`td.memmap(prefix)`,
// `TensorDict.load_memmap(prefix)`), as tensordict 0.4 writes them:
//
//   <dir>/meta.json          {"<leaf>": {"device": "cpu", "shape": [5, 3], "dtype": "torch.float32"},
//                             "<sub>": {"type": "TensorDict"},
//                             "shape": [5], "device": "cpu", "_type": "<class 'tensordict._td.TensorDict'>"}
//   <dir>/<leaf>.memmap      the leaf's bytes, row-major, little-endian
//   <dir>/<sub>/meta.json    the same for each nested TensorDict (an empty one has only its meta.json)
//
// This header checks one level's meta.json (libtorch-free, for the fuzz
// target); memmap.hpp walks the directories and checks every file's size.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "../errors.hpp"
#include "file_dtypes.hpp"

namespace tensordict::detail::memmap {

inline constexpr std::string_view tensordict_type = "<class 'tensordict._td.TensorDict'>";

struct entry {
  enum class kind { leaf, nested, other };
  std::string name;
  kind type = kind::leaf;
  const file_dtype* dtype = nullptr;  // leaf
  std::vector<std::int64_t> shape;    // leaf
  std::uint64_t bytes = 0;            // leaf: what its file must hold
  std::string other;                  // other: what meta.json says it is
};

struct level {
  std::vector<entry> entries;  // in meta.json's order
  std::vector<std::int64_t> batch_size;
  std::optional<std::string> device;  // null in the file: none
};

// A key is a file or directory name here: no separators, no "." or "..".
inline bool usable_key(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

// The keys meta.json uses for the level itself, which no entry may have.
inline bool reserved_key(std::string_view name) { return name == "shape" || name == "device" || name == "_type"; }

inline std::vector<std::int64_t> int_list(const nlohmann::ordered_json& v, const std::string& where) {
  if (!v.is_array() || v.size() > 64) throw file_error(where + " is not a list of at most 64 sizes");
  std::vector<std::int64_t> out;
  for (const auto& s : v) {
    if (!s.is_number_unsigned() || s.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
      throw file_error(where + " " + v.dump() + " is not a list of non-negative integers");
    out.push_back(s.get<std::int64_t>());
  }
  return out;
}

// `where` names the file in errors.
inline level parse_meta(std::string_view text, const std::string& where) {
  using json = nlohmann::ordered_json;
  json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) throw file_error(where + " is not valid JSON");
  if (!root.is_object()) throw file_error(where + " is not a JSON object");
  level out;
  const auto shape = root.find("shape");
  if (shape == root.end()) throw file_error(where + " has no \"shape\" (the batch size)");
  out.batch_size = int_list(*shape, where + ": the batch size");
  if (const auto device = root.find("device"); device != root.end() && !device->is_null()) {
    if (!device->is_string()) throw file_error(where + ": \"device\" is not a string");
    out.device = device->get<std::string>();
  }
  if (const auto type = root.find("_type"); type != root.end()) {
    if (!type->is_string()) throw file_error(where + ": \"_type\" is not a string");
    const std::string t = type->get<std::string>();
    // tensordict 0.4 writes tensordict._td.TensorDict, earlier versions tensordict.tensordict.TensorDict.
    if (t.size() < 13 || t.compare(t.size() - 13, 13, ".TensorDict'>") != 0)
      throw file_error(where + " holds a " + t + "; only TensorDict directories are read");
  }
  std::unordered_set<std::string> names;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    if (reserved_key(name)) continue;
    const std::string at = where + ": \"" + name + "\"";
    if (!usable_key(name)) throw file_error(at + " cannot name a file");
    if (!names.insert(name).second) throw file_error(at + " is there twice");
    const json& v = it.value();
    if (!v.is_object()) throw file_error(at + " is not described by a JSON object");
    entry e;
    e.name = name;
    if (const auto type = v.find("type"); type != v.end()) {
      if (!type->is_string()) throw file_error(at + ": \"type\" is not a string");
      e.other = type->get<std::string>();
      // A TensorDictParams (an EnsembleModule's params_td) is saved as the TensorDict it wraps.
      e.type = e.other == "TensorDict" || e.other == "TensorDictParams" ? entry::kind::nested : entry::kind::other;
      out.entries.push_back(std::move(e));
      continue;
    }
    const auto dtype = v.find("dtype");
    const auto leaf_shape = v.find("shape");
    if (dtype == v.end() || leaf_shape == v.end() || !dtype->is_string())
      throw file_error(at + " has neither a \"type\" nor a \"dtype\" and \"shape\"");
    e.dtype = find_torch_dtype(dtype->get<std::string>());
    if (!e.dtype) throw file_error(at + " has the unknown dtype \"" + dtype->get<std::string>() + "\"");
    e.shape = int_list(*leaf_shape, at + ": its shape");
    if (e.shape.size() < out.batch_size.size() ||
        !std::equal(out.batch_size.begin(), out.batch_size.end(), e.shape.begin()))
      throw file_error(at + ": its shape " + leaf_shape->dump() + " does not start with the batch size " + shape->dump());
    const auto bytes = byte_size(e.shape, e.dtype->element_size);
    if (!bytes) throw file_error(at + ": its shape " + leaf_shape->dump() + " is too large");
    e.bytes = *bytes;
    out.entries.push_back(std::move(e));
  }
  return out;
}

}  // namespace tensordict::detail::memmap
