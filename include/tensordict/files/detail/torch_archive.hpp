// The file model of Python's torch.save (the zip format, the default since
// PyTorch 1.6), read without libtorch:
//
//   <name>/data.pkl      a pickle (protocol 2) of the saved object; tensors are
//                        torch._utils._rebuild_tensor_v2(persistent storage id,
//                        offset, sizes, strides, requires_grad, hooks)
//   <name>/data/<key>    the bytes of each storage, little-endian, uncompressed
//   <name>/version       "3"
//
// The reader understands what torch.save writes for dicts of tensors: plain
// dicts of any size, collections.OrderedDict (every state_dict(), with its
// _metadata), nested dicts, nn.Parameter, tensors that share a storage. It
// checks every length, offset and extent against the bytes it was given and
// throws tensordict::file_error for anything else: the bytes come from
// outside, and a fuzz target (tests/fuzz) runs it on mutated files.
//
// Libtorch-free on purpose: the fuzz target compiles with clang's libFuzzer.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "unpickler.hpp"
#include "zip_reader.hpp"

namespace tensordict::detail::archive {

// ---- what a torch.save file holds ------------------------------------------------------------

// A tensor of the file: checked against its storage's bytes.
struct tensor_record {
  std::size_t storage_type = 0;
  std::string storage_key;
  std::string_view storage_bytes;  // the whole storage
  std::int64_t offset = 0;
  std::vector<std::int64_t> sizes, strides;
  bool requires_grad = false;
};

// A dict of the file: keys in order; each entry a tensor, a sub-dict, or another Python value.
// A TensorDict's state_dict() records its batch size (and each nested one's).
struct dict_record {
  struct entry {
    std::string key;
    std::optional<tensor_record> tensor;
    std::unique_ptr<dict_record> dict;
    std::string other;  // the Python type of a value that is neither
  };
  std::vector<entry> entries;
  std::optional<std::vector<std::int64_t>> batch_size;
};

namespace detail_checks {
// The largest element a strided view reaches, with every product checked for overflow.
inline bool extent_fits(const tensor_record& t, std::uint64_t storage_elements) {
  if (t.sizes.size() != t.strides.size() || t.offset < 0) return false;
  std::uint64_t last = static_cast<std::uint64_t>(t.offset);
  for (std::size_t d = 0; d < t.sizes.size(); ++d) {
    if (t.sizes[d] < 0 || t.strides[d] < 0) return false;
    if (t.sizes[d] == 0) return t.offset >= 0 && static_cast<std::uint64_t>(t.offset) <= storage_elements;
  }
  for (std::size_t d = 0; d < t.sizes.size(); ++d) {
    const auto span = static_cast<std::uint64_t>(t.sizes[d] - 1), stride = static_cast<std::uint64_t>(t.strides[d]);
    if (stride && span > (std::numeric_limits<std::uint64_t>::max() - last) / stride) return false;
    last += span * stride;
  }
  return last < storage_elements;
}
}  // namespace detail_checks

// Parses a torch.save file held in `file` (which must outlive the result's
// views). Checksums: `all` reads every byte of the file; `metadata` leaves
// out the tensor records (data/...), so that a mapped load touches none of
// them; the fuzz target turns them off (`none`) to reach the pickle.
enum class checksums { all, metadata, none };

inline std::unique_ptr<dict_record> parse(std::string_view file, checksums verify = checksums::all) {
  const auto entries = zip_entries(file);
  std::string prefix;
  for (const auto& e : entries)
    if (e.name.size() >= 8 && e.name.compare(e.name.size() - 8, 8, "data.pkl") == 0 &&
        (e.name.size() == 8 || e.name[e.name.size() - 9] == '/')) {
      prefix = e.name.substr(0, e.name.size() - 8);
      break;
    }
  std::unordered_map<std::string_view, const zip_entry*> by_name;  // files may hold many storages
  for (const auto& e : entries) by_name.emplace(e.name, &e);
  auto find = [&](const std::string& name) -> const zip_entry* {
    const auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second;
  };
  // Every record, read or not (torch 2.x adds .data/serialization_id), once.
  if (verify != checksums::none)
    for (const auto& e : entries) {
      if (verify == checksums::metadata && e.name.compare(0, prefix.size() + 5, prefix + "data/") == 0) continue;
      std::string_view bytes = file.substr(e.offset, e.size);
      if (crc32(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()) != e.crc)
        throw file_error("the record \"" + e.name + "\" is corrupted (its CRC-32 does not match)");
    }
  auto record = [&](const std::string& name) {
    const zip_entry* e = find(prefix + name);
    if (!e) throw file_error("the archive has no record \"" + prefix + name + "\"");
    return file.substr(e->offset, e->size);
  };
  if (!find(prefix + "data.pkl")) {
    if (find(prefix + "constants.pkl") || find("constants.pkl"))
      throw file_error("this is a TorchScript archive (torch.jit.save), not a torch.save file");
    throw file_error("the archive has no data.pkl: not a torch.save file");
  }
  const std::string version_name = find(prefix + "version") ? "version" : ".data/version";
  const std::string_view version = record(version_name);
  if (version.empty() || version.size() > 4 || version[0] < '1' || version[0] > '9')
    throw file_error("the archive's format version \"" + std::string(version.substr(0, 8)) + "\" is not one torch.save writes");
  if (const zip_entry* order = find(prefix + "byteorder"); order && record("byteorder") != "little")
    throw file_error("the file was saved on a big-endian machine; only little-endian files are read");
  const unpickled graph = unpickle(record("data.pkl"));
  const auto& values = graph.values;

  std::unordered_map<std::string, std::string_view> storages;
  auto storage_bytes = [&](const value& s) {
    auto it = storages.find(s.text);
    if (it != storages.end()) return it->second;
    if (s.text.find('/') != std::string::npos || s.text.find("..") != std::string::npos)
      throw file_error("a storage key \"" + s.text + "\" names no record");
    return storages[s.text] = record("data/" + s.text);
  };
  auto tensor = [&](const value& t, const std::string& where) {
    const value& s = values[t.storage];
    tensor_record out;
    out.storage_type = s.storage_type;
    out.storage_key = s.text;
    out.storage_bytes = storage_bytes(s);
    out.offset = t.offset;
    out.sizes = t.sizes;
    out.strides = t.strides;
    out.requires_grad = t.requires_grad;
    const std::size_t element = storage_types[s.storage_type].element_size;
    if (s.integer < 0 || static_cast<std::uint64_t>(s.integer) > out.storage_bytes.size() / element)
      throw file_error(where + ": its storage \"" + s.text + "\" claims " + std::to_string(s.integer) + " elements of " +
                       std::to_string(element) + " bytes, but its record has " + std::to_string(out.storage_bytes.size()) +
                       " bytes");
    if (!detail_checks::extent_fits(out, static_cast<std::uint64_t>(s.integer)))
      throw file_error(where + ": its sizes, strides and offset reach outside its storage of " + std::to_string(s.integer) +
                       " elements");
    return out;
  };
  auto batch_size_of = [&](const value& size, const std::string& where) {
    std::vector<std::int64_t> out;
    for (std::size_t item : size.items) {
      if (values[item].integer < 0) throw file_error(where + ": a batch size has a negative entry");
      out.push_back(values[item].integer);
    }
    return out;
  };
  auto is_torch_size = [&](const value& v) { return v.type == value::kind::tuple && v.text == "torch.Size"; };
  // Dicts nest at most this deep, and each appears once: through the memo, a
  // file could otherwise make a cycle, or a small file a huge tree.
  constexpr int max_depth = 64;
  std::vector<bool> visited(values.size());
  auto convert = [&](auto& self, std::size_t v, const std::string& where, int depth) -> std::unique_ptr<dict_record> {
    if (depth > max_depth) throw file_error(where + ": dicts nest more than " + std::to_string(max_depth) + " deep");
    if (visited[v]) throw file_error((where.empty() ? std::string("the root") : where) + ": the same dict appears twice in the file");
    visited[v] = true;
    auto out = std::make_unique<dict_record>();
    std::unordered_set<std::string> keys;
    const auto& items = values[v].items;
    std::optional<dict_record::entry> device;  // tensordict 0.5-0.11's "__device": dropped beside a "__batch_size"
    for (std::size_t i = 0; i + 1 < items.size(); i += 2) {
      const value& key = values[items[i]];
      const value& item = values[items[i + 1]];
      dict_record::entry e;
      if (key.type == value::kind::string) e.key = key.text;
      else if (key.type == value::kind::integer) e.key = std::to_string(key.integer);
      else throw file_error(where + ": a key is " + kind_name(key.type) + "; keys must be strings");
      const std::string path = where.empty() ? "\"" + e.key + "\"" : where + "/\"" + e.key + "\"";
      if (!keys.insert(e.key).second) throw file_error(path + ": the key is there twice");
      if (e.key == "__batch_size" && is_torch_size(item)) {
        out->batch_size = batch_size_of(item, path);
        continue;
      }
      if (item.type == value::kind::tensor) e.tensor = tensor(item, path);
      else if (item.type == value::kind::dict) e.dict = self(self, items[i + 1], path, depth + 1);
      else e.other = item.type == value::kind::object || is_torch_size(item) ? item.text : kind_name(item.type);
      if (e.key == "__device" && (item.type == value::kind::none || item.type == value::kind::string)) {
        device = std::move(e);
        continue;
      }
      out->entries.push_back(std::move(e));
    }
    if (device && !out->batch_size) out->entries.push_back(std::move(*device));
    return out;
  };
  // tensordict 0.12+'s state_dict(): flat dotted keys, and in the OrderedDict's
  // _metadata each TensorDict's dotted prefix with its batch size (one with no
  // leaves is there only). The keys are split at those prefixes alone: a leaf
  // "a.b" of the root stays "a.b" unless a TensorDict "a" was recorded.
  using batch_sizes = std::map<std::string, std::vector<std::int64_t>>;
  auto tensordict_metadata = [&](std::size_t root) {
    batch_sizes out;
    const value& dict = values[root];
    if (!dict.build_state || values[dict.build_state - 1].type != value::kind::dict) return out;
    const auto& state = values[dict.build_state - 1].items;
    for (std::size_t i = 0; i + 1 < state.size(); i += 2) {
      if (values[state[i]].type != value::kind::string || values[state[i]].text != "_metadata") continue;
      const value& metadata = values[state[i + 1]];
      if (metadata.type != value::kind::dict) return out;
      for (std::size_t j = 0; j + 1 < metadata.items.size(); j += 2) {
        const value& prefix = values[metadata.items[j]];
        const value& fields = values[metadata.items[j + 1]];
        if (prefix.type != value::kind::string || fields.type != value::kind::dict) continue;
        for (std::size_t f = 0; f + 1 < fields.items.size(); f += 2)
          if (values[fields.items[f]].type == value::kind::string && values[fields.items[f]].text == "batch_size" &&
              is_torch_size(values[fields.items[f + 1]]))
            out[prefix.text] = batch_size_of(values[fields.items[f + 1]], "_metadata[\"" + prefix.text + "\"]");
      }
    }
    return out;
  };
  auto nest = [&](std::unique_ptr<dict_record> flat, const batch_sizes& metadata) {
    auto root = std::make_unique<dict_record>();
    if (const auto it = metadata.find(""); it != metadata.end()) root->batch_size = it->second;
    std::unordered_map<std::string, dict_record*> dicts{{"", root.get()}};            // by prefix
    std::unordered_map<const dict_record*, std::unordered_set<std::string>> names;  // each dict's keys
    auto add = [&](dict_record* at, const std::string& prefix, dict_record::entry e) -> dict_record::entry& {
      if (!names[at].insert(e.key).second)
        throw file_error("\"" + (prefix.empty() ? e.key : prefix + "." + e.key) +
                         "\": a TensorDict of the state_dict's _metadata, and a value too");
      at->entries.push_back(std::move(e));
      return at->entries.back();
    };
    // The recorded TensorDict at `prefix`, made with the recorded ones above it on first use.
    auto dict_at = [&](auto& self, const std::string& prefix, int depth) -> dict_record* {
      if (const auto it = dicts.find(prefix); it != dicts.end()) return it->second;
      if (depth > max_depth) throw file_error("\"" + prefix + "\": TensorDicts nest more than " + std::to_string(max_depth) + " deep");
      std::string above;
      for (std::size_t dot = prefix.rfind('.'); dot != std::string::npos && dot > 0; dot = prefix.rfind('.', dot - 1))
        if (metadata.count(prefix.substr(0, dot))) {
          above = prefix.substr(0, dot);
          break;
        }
      dict_record* parent = self(self, above, depth + 1);
      dict_record::entry e;
      e.key = above.empty() ? prefix : prefix.substr(above.size() + 1);
      e.dict = std::make_unique<dict_record>();
      e.dict->batch_size = metadata.at(prefix);
      dict_record* made = add(parent, above, std::move(e)).dict.get();
      return dicts[prefix] = made;
    };
    for (auto& e : flat->entries) {
      std::string prefix;
      for (std::size_t dot = e.key.rfind('.'); dot != std::string::npos && dot > 0; dot = e.key.rfind('.', dot - 1))
        if (metadata.count(e.key.substr(0, dot))) {
          prefix = e.key.substr(0, dot);
          break;
        }
      dict_record* at = dict_at(dict_at, prefix, 0);
      if (!prefix.empty()) e.key = e.key.substr(prefix.size() + 1);
      add(at, prefix, std::move(e));
    }
    for (const auto& [prefix, batch] : metadata) dict_at(dict_at, prefix, 0);
    return root;
  };
  if (values[graph.root].type != value::kind::dict)
    throw file_error(std::string("the file holds ") +
                     (values[graph.root].type == value::kind::object ? values[graph.root].text : kind_name(values[graph.root].type)) +
                     ", not a dict: save a dict (a state_dict() or a TensorDict's to_dict())");
  auto root = convert(convert, graph.root, "", 0);
  const auto metadata = tensordict_metadata(graph.root);
  return metadata.empty() ? std::move(root) : nest(std::move(root), metadata);
}

}  // namespace tensordict::detail::archive
