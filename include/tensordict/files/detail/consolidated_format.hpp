// Python tensordict's consolidated files (`td.consolidate(filename=path)`,
// 0.5 and later; `TensorDict.from_consolidated(path)` reads them):
//
//   <every leaf's bytes, each padded to 8> <metadata JSON, UTF-8> <its length: int64, little-endian>
//
// The metadata is one object per TensorDict level:
//   {"cls": "TensorDict", "non_tensors": {"<key>": [<value>, [<batch size>], <device or null>]},
//    "leaves": {"<key>": ["torch.float32", [4, 3], <start>, <stop>, <pad>]},
//    "cls_metadata": {"device": null, "names": [null], "batch_size": [4], "is_locked": false},
//    "<sub>": {<the same for the nested TensorDict>}, ...}
// A leaf's bytes are [start, stop - pad) from the top of the file, in the
// order Python visits the tree (each level's keys in order, a nested level's
// leaves where it comes). This header parses and writes the metadata
// (libtorch-free, for the fuzz target); files/consolidated.hpp reads and
// writes the files.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../errors.hpp"
#include "../../non_tensor.hpp"
#include "dtypes.hpp"
#include "memmap_format.hpp"

namespace tensordict::detail::consolidated {

// The fields a level's object uses for itself, which no nested key may be.
inline bool reserved_key(std::string_view key) {
  return key == "cls" || key == "non_tensors" || key == "leaves" || key == "cls_metadata" || key == "size";
}

struct leaf {
  std::string name;
  const file_dtype* dtype = nullptr;
  std::vector<std::int64_t> shape;
  std::uint64_t start = 0, bytes = 0;
};

struct level {
  std::vector<std::int64_t> batch_size;
  std::optional<std::string> device;
  std::vector<leaf> leaves;
  std::vector<std::pair<std::string, non_tensor_value>> non_tensors;
  std::vector<std::string> child_names;  // (a vector of pairs cannot hold the incomplete level)
  std::vector<level> children;
};

// `data_size`: the bytes before the metadata, which every leaf must lie in.
inline level parse_level(const nlohmann::ordered_json& v, const std::string& where, std::uint64_t data_size) {
  if (!v.is_object()) throw file_error(where + " is not a JSON object");
  const auto cls = v.find("cls");
  if (cls == v.end() || !cls->is_string()) throw file_error(where + " has no \"cls\"");
  if (cls->get<std::string>() != "TensorDict")
    throw file_error(where + " holds a " + cls->dump() + "; consolidated files are read where every level is a TensorDict");
  level out;
  const auto meta = v.find("cls_metadata");
  if (meta == v.end() || !meta->is_object()) throw file_error(where + " has no \"cls_metadata\" object");
  const auto batch = meta->find("batch_size");
  if (batch == meta->end()) throw file_error(where + ": \"cls_metadata\" has no \"batch_size\"");
  out.batch_size = memmap::int_list(*batch, where + ": the batch size");
  if (const auto device = meta->find("device"); device != meta->end() && !device->is_null()) {
    if (!device->is_string()) throw file_error(where + ": \"device\" is not a string");
    out.device = device->get<std::string>();
  }
  const auto leaves = v.find("leaves");
  if (leaves == v.end() || !leaves->is_object()) throw file_error(where + " has no \"leaves\" object");
  for (auto it = leaves->begin(); it != leaves->end(); ++it) {
    const std::string at = where + ": the leaf \"" + it.key() + "\"";
    const auto& f = it.value();
    if (!f.is_array() || f.size() < 5 || !f[0].is_string())
      throw file_error(at + " is not [dtype, shape, start, stop, pad]");
    if (f.size() > 5) throw file_error(at + " is a nested (jagged) tensor, which this library does not read");
    leaf l;
    l.name = it.key();
    l.dtype = find_torch_dtype(f[0].get<std::string>());
    if (!l.dtype) throw file_error(at + " has the unknown dtype " + f[0].dump());
    l.shape = memmap::int_list(f[1], at + ": its shape");
    if (l.shape.size() < out.batch_size.size() || !std::equal(out.batch_size.begin(), out.batch_size.end(), l.shape.begin()))
      throw file_error(at + ": its shape " + f[1].dump() + " does not start with the batch size " + batch->dump());
    for (int k = 2; k < 5; ++k)
      if (!f[k].is_number_unsigned()) throw file_error(at + ": start, stop and pad are not non-negative integers");
    const auto start = f[2].get<std::uint64_t>(), stop = f[3].get<std::uint64_t>(), pad = f[4].get<std::uint64_t>();
    const auto bytes = byte_size(l.shape, l.dtype->element_size);
    if (!bytes || stop < start || stop - start < pad || stop - start - pad != *bytes || stop > data_size)
      throw file_error(at + ": bytes [" + std::to_string(start) + ", " + std::to_string(stop) + ") less " + std::to_string(pad) +
                       " of padding do not hold " + f[0].get<std::string>() + " of shape " + f[1].dump() + " within the " +
                       std::to_string(data_size) + " bytes of data");
    l.start = start;
    l.bytes = *bytes;
    out.leaves.push_back(std::move(l));
  }
  const auto non_tensors = v.find("non_tensors");
  if (non_tensors != v.end()) {
    if (!non_tensors->is_object()) throw file_error(where + ": \"non_tensors\" is not an object");
    for (auto it = non_tensors->begin(); it != non_tensors->end(); ++it) {
      const std::string at = where + ": the non-tensor \"" + it.key() + "\"";
      if (!it.value().is_array() || it.value().empty()) throw file_error(at + " is not [value, batch size, device]");
      out.non_tensors.emplace_back(it.key(), memmap::json_to_value(it.value()[0], at));
    }
  }
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (reserved_key(it.key())) continue;
    level child = parse_level(it.value(), where + ": \"" + it.key() + "\"", data_size);
    if (child.batch_size.size() < out.batch_size.size() ||
        !std::equal(out.batch_size.begin(), out.batch_size.end(), child.batch_size.begin()))
      throw file_error(where + ": \"" + it.key() + "\" has a batch size that does not start with its parent's");
    out.child_names.push_back(it.key());
    out.children.push_back(std::move(child));
  }
  return out;
}

// The metadata of a consolidated file's bytes; `data_size` is set to the bytes before it.
inline level parse(std::string_view file, std::uint64_t& data_size) {
  if (file.size() < 8) throw file_error("not a consolidated file: " + std::to_string(file.size()) + " bytes is too short");
  std::uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= std::uint64_t(static_cast<unsigned char>(file[file.size() - 8 + i])) << (8 * i);
  if (length > file.size() - 8)
    throw file_error("not a consolidated file: its last 8 bytes give a metadata length of " + std::to_string(length) +
                     " bytes, more than the file holds");
  data_size = file.size() - 8 - length;
  const std::string marked = memmap::with_non_finite_marked(file.substr(data_size, length));
  const auto root = nlohmann::ordered_json::parse(marked.begin(), marked.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) throw file_error("not a consolidated file: its metadata is not valid JSON");
  return parse_level(root, "the metadata", data_size);
}

}  // namespace tensordict::detail::consolidated
