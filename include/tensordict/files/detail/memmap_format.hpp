// Python tensordict's memmap directories (`td.memmap(prefix)`,
// `TensorDict.load_memmap(prefix)`), as tensordict 0.4 writes them:
//
//   <dir>/meta.json          {"<leaf>": {"device": "cpu", "shape": [5, 3], "dtype": "torch.float32"},
//                             "<sub>": {"type": "TensorDict"},
//                             "shape": [5], "device": "cpu", "_type": "<class 'tensordict._td.TensorDict'>"}
//   <dir>/<leaf>.memmap      the leaf's bytes, row-major, little-endian
//   <dir>/<sub>/meta.json    the same for each nested TensorDict (an empty one has only its meta.json)
//   <dir>/<key>/meta.json    a non-tensor entry ("<key>": {"type": "NonTensorData"} above):
//                            {"_type": "<class 'tensordict.tensorclass.NonTensorData'>", "data": "reach-target",
//                             "_metadata": null, "_is_non_tensor": true}, beside <key>/_tensordict/meta.json
//                            (a TensorDict level of the same batch size, holding nothing); a NonTensorStack's
//                            {"_type": "<class 'tensordict.tensorclass.NonTensorStack'>", "stack_dim": 0,
//                             "device": null, "data": [["alpha", "alpha"], ["beta", "beta"]]} holds the values
//                            as nested lists over the batch size, beside <key>/0/meta.json ... one per element
//                            along dim 0 (TensorDict levels holding nothing, which readers need not open)
//
// What later releases changed (read either way; written as memmap_layout says, files/options.hpp):
//   0.5+   a leaf's fields end with "is_nested": false (true: a jagged tensor, with a
//          <key>.shape.memmap sidecar, which this library refuses); a NonTensorData folder
//          holds only its meta.json, {"_type": ..., "data": ..., "_is_non_tensor": true,
//          "_metadata": null}; a NonTensorStack no per-element folders; compact JSON.
//   0.13+  a key that is not a safe file name names its file and folder percent-encoded
//          (file_name below: "with space" -> with%20space.memmap, sub_with%20space/), and
//          meta.json keeps the raw key; loaders try the encoded name, then the raw one.
//   every  a leaf with no elements has no .memmap file.
//
// This header checks one level's meta.json (libtorch-free, for the fuzz
// target); files/memmap.hpp walks the directories and checks every file's size.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../errors.hpp"
#include "../../non_tensor.hpp"
#include "../options.hpp"
#include "dtypes.hpp"

namespace tensordict::detail::memmap {

inline constexpr std::string_view tensordict_type = "<class 'tensordict._td.TensorDict'>";
inline constexpr std::string_view non_tensor_data_type = "<class 'tensordict.tensorclass.NonTensorData'>";
inline constexpr std::string_view non_tensor_stack_type = "<class 'tensordict.tensorclass.NonTensorStack'>";
inline constexpr std::string_view lazy_stack_type = "<class 'tensordict._lazy.LazyStackedTensorDict'>";

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

// A name the file system takes as one file or folder name: no separators, not "." or "..".
inline bool usable_key(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

// The file (without ".memmap") or folder name tensordict 0.13+ gives a key:
// NUL, control characters, DEL and space / \ < > : " | ? * % percent-encoded
// (upper-case hex); "" is "%", "." and ".." every dot encoded. Other bytes
// (dots inside a name, UTF-8) stay.
inline std::string file_name(std::string_view key) {
  if (key.empty()) return "%";
  if (key == "." || key == "..") return key.size() == 1 ? "%2E" : "%2E%2E";
  static constexpr std::string_view encoded = " /\\<>:\"|?*%";
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : key) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7F || encoded.find(c) != std::string_view::npos) {
      out += '%';
      out += hex[byte >> 4];
      out += hex[byte & 15];
    } else {
      out += c;
    }
  }
  return out;
}

// Whether every release (0.4 to 0.14) finds a key's file under its raw name
// (memmap_layout::v0_4): 0.4 to 0.12 look only there; 0.13+ try the encoded
// name first, then the raw one unless the key holds "/" or a backslash or starts
// with a drive ("a:"; any ":" is refused here, as Windows refuses it in a name).
inline bool readable_raw_by_every_release(std::string_view key) {
  return usable_key(key) && key.find_first_of("\\:") == std::string_view::npos;
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

// Python's json module writes a float that is not finite as the bare word
// NaN, Infinity or -Infinity, which JSON lacks. Read, each becomes a string
// of its own (the marker, then the word) that json_to_value turns back into
// the float; written, the marker's string becomes the word again.
inline constexpr std::string_view non_finite_marker = "\x01tensordict-non-finite:";
inline constexpr std::string_view non_finite_words[] = {"NaN", "Infinity", "-Infinity"};

inline std::string with_non_finite_marked(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) out += text[++i];
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    bool word = false;
    for (std::string_view w : non_finite_words)
      if (text.substr(i, w.size()) == w) {
        out += "\"\\u0001" + std::string(non_finite_marker.substr(1)) + std::string(w) + '"';
        i += w.size() - 1;
        word = true;
        break;
      }
    if (!word) out += c;
  }
  return out;
}

// JSON text as Python's json.dumps writes it (compact separators aside): NaN, Infinity, -Infinity bare.
inline std::string python_json_dump(const nlohmann::ordered_json& v) {
  std::string text = v.dump();
  for (std::string_view w : non_finite_words) {
    const std::string marked = "\"\\u0001" + std::string(non_finite_marker.substr(1)) + std::string(w) + '"';
    for (std::size_t at = text.find(marked); at != std::string::npos; at = text.find(marked, at + w.size()))
      text.replace(at, marked.size(), w);
  }
  return text;
}

// What a folder's meta.json describes: a TensorDict level (parse_meta reads
// it); a LazyStackedTensorDict, {"_type": "<class 'tensordict._lazy.LazyStackedTensorDict'>",
// "stack_dim": 0}, its elements in folders 0, 1, ...; or a tensorclass,
// {"_type": "<class '__main__.TC'>"}, its fields a TensorDict level in _tensordict/.
struct node {
  enum class kind { tensordict, lazy_stack, tensorclass };
  kind type = kind::tensordict;
  std::int64_t stack_dim = 0;
  std::string class_name;  // tensorclass: "TC" of "<class '__main__.TC'>"
  std::string qualified_name;  // and "__main__.TC"
};

inline node parse_node(std::string_view text, const std::string& where) {
  using json = nlohmann::ordered_json;
  const std::string marked = with_non_finite_marked(text);
  const json root = json::parse(marked.begin(), marked.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) throw file_error(where + " is not valid JSON");
  if (!root.is_object()) throw file_error(where + " is not a JSON object");
  node out;
  const auto type = root.find("_type");
  if (type == root.end() || !type->is_string()) return out;
  const std::string t = type->get<std::string>();
  const auto ends_with = [&](std::string_view tail) { return t.size() >= tail.size() && t.compare(t.size() - tail.size(), tail.size(), tail) == 0; };
  if (ends_with(".TensorDict'>") || root.contains("shape")) return out;
  if (ends_with(".LazyStackedTensorDict'>")) {
    out.type = node::kind::lazy_stack;
    const auto dim = root.find("stack_dim");
    if (dim == root.end() || !dim->is_number_integer() || dim->get<std::int64_t>() < -64 || dim->get<std::int64_t>() > 64)
      throw file_error(where + ": a LazyStackedTensorDict without an integer \"stack_dim\"");
    out.stack_dim = dim->get<std::int64_t>();
    return out;
  }
  if (t.rfind("<class '", 0) != 0 || !ends_with("'>"))
    throw file_error(where + ": \"_type\" " + type->dump() + " is not a Python class");
  out.type = node::kind::tensorclass;
  const std::string qualified = t.substr(8, t.size() - 10);
  out.class_name = qualified.substr(qualified.rfind('.') == std::string::npos ? 0 : qualified.rfind('.') + 1);
  out.qualified_name = qualified;
  return out;
}

// `where` names the file in errors.
inline level parse_meta(std::string_view text, const std::string& where) {
  using json = nlohmann::ordered_json;
  const std::string marked = with_non_finite_marked(text);
  json root = json::parse(marked.begin(), marked.end(), nullptr, /*allow_exceptions=*/false);
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
    if (const auto jagged = v.find("is_nested"); jagged != v.end() && !(jagged->is_boolean() && !jagged->get<bool>()))
      throw file_error(at + " is a nested (jagged) tensor (\"is_nested\": " + jagged->dump() +
                       "), which this library does not read; save it as a padded tensor or leave it out");
    out.entries.push_back(std::move(e));
  }
  return out;
}

// A value of a non-tensor folder's "data": None, bool, int, float or str.
inline non_tensor_value json_to_value(const nlohmann::ordered_json& v, const std::string& where) {
  if (v.is_null()) return std::monostate{};
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
    throw file_error(where + ": the integer " + v.dump() + " does not fit 64 bits");
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_number_float()) return v.get<double>();
  if (v.is_string()) {
    std::string text = v.get<std::string>();
    if (std::string_view(text).substr(0, non_finite_marker.size()) != non_finite_marker) return text;
    const std::string_view word = std::string_view(text).substr(non_finite_marker.size());
    if (word == "NaN") return std::numeric_limits<double>::quiet_NaN();
    return word == "-Infinity" ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  }
  std::string text = v.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  throw file_error(where + " holds " + text + "; non-tensor values are read when they are None, a bool, an int, a float or a "
                   "str (load with load_options{.skip_non_tensors = true} to leave non-tensor entries out)");
}

inline nlohmann::ordered_json value_to_json(const non_tensor_value& v) {
  struct {
    nlohmann::ordered_json operator()(std::monostate) const { return nullptr; }
    nlohmann::ordered_json operator()(bool b) const { return b; }
    nlohmann::ordered_json operator()(std::int64_t i) const { return i; }
    nlohmann::ordered_json operator()(double d) const {
      if (std::isfinite(d)) return d;
      return std::string(non_finite_marker) + (std::isnan(d) ? "NaN" : d > 0 ? "Infinity" : "-Infinity");
    }
    nlohmann::ordered_json operator()(const std::string& s) const { return s; }
  } to_json;
  return std::visit(to_json, v);
}

// A non-tensor entry's meta.json (`text`, read from `where`): `kind` is what
// the level's meta.json calls it ("NonTensorData" or "NonTensorStack"),
// `batch` that level's batch size, whose shape a stack's nested lists must have.
inline NonTensor parse_non_tensor(std::string_view text, const std::string& where, const std::string& kind,
                                  const std::vector<std::int64_t>& batch) {
  using json = nlohmann::ordered_json;
  const std::string marked = with_non_finite_marked(text);
  const json root = json::parse(marked.begin(), marked.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) throw file_error(where + " is not valid JSON");
  if (!root.is_object()) throw file_error(where + " is not a JSON object");
  const auto type = root.find("_type");
  const auto data = root.find("data");
  const std::string_view expected = kind == "NonTensorStack" ? non_tensor_stack_type : non_tensor_data_type;
  if (type == root.end() || !type->is_string() || type->get<std::string>() != expected)
    throw file_error(where + ": \"_type\" is not \"" + std::string(expected) + "\", as the enclosing meta.json's \"" + kind + "\" needs");
  if (data == root.end()) throw file_error(where + " has no \"data\"");
  if (kind == "NonTensorData") return NonTensor(json_to_value(*data, where + ": \"data\""));
  if (batch.empty()) throw file_error(where + ": a NonTensorStack in a TensorDict of batch size [] (it needs a dim)");
  // Nested lists over the batch dims, the last varying fastest.
  std::vector<non_tensor_value> values;
  auto read = [&](auto& self, const json& v, std::size_t dim) -> void {
    if (dim == batch.size()) return values.push_back(json_to_value(v, where + ": \"data\""));
    if (!v.is_array() || v.size() != static_cast<std::uint64_t>(batch[dim]))
      throw file_error(where + ": \"data\" is not nested lists of the batch size's shape (dim " + std::to_string(dim) +
                       " should have " + std::to_string(batch[dim]) + " items)");
    for (const json& item : v) self(self, item, dim + 1);
  };
  read(read, *data, 0);
  return NonTensor::stack(std::move(values), batch);
}

// What parse_non_tensor reads: the entry's meta.json text, its fields in the order of the layout's release.
inline std::string non_tensor_meta(const NonTensor& v, memmap_layout layout) {
  using json = nlohmann::ordered_json;
  json meta = json::object();
  if (!v.is_stack()) {
    meta["_type"] = non_tensor_data_type;
    meta["data"] = value_to_json(v.value());
    if (layout == memmap_layout::v0_14) meta["_is_non_tensor"] = true;
    meta["_metadata"] = nullptr;
    if (layout == memmap_layout::v0_4) meta["_is_non_tensor"] = true;
    return python_json_dump(meta);
  }
  const auto& shape = v.shape();
  std::size_t next = 0;
  auto nest = [&](auto& self, std::size_t dim) -> json {
    if (dim == shape.size()) return value_to_json(v.values()[next++]);
    json list = json::array();
    for (std::int64_t i = 0; i < shape[dim]; ++i) list.push_back(self(self, dim + 1));
    return list;
  };
  meta["_type"] = non_tensor_stack_type;
  meta["stack_dim"] = 0;
  meta["device"] = nullptr;
  meta["data"] = nest(nest, 0);
  return python_json_dump(meta);
}

}  // namespace tensordict::detail::memmap
