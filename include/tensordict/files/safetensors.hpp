// safetensors files (https://huggingface.co/docs/safetensors), the common
// format for sharing models, both ways:
//
//   auto weights = tensordict::load_safetensors("model.safetensors");   // "layers.0.weight" -> ("layers", "0", "weight")
//   auto typed = tensordict::load_safetensors(path, tensordict::from_module(net));   // keys, shapes, dtypes checked
//   tensordict::save_safetensors(td, "out.safetensors", {{"format", "pt"}});
//
// Names are dotted paths: load unflattens them into nested keys (unless two
// names clash, "a" and "a.b": then the keys stay flat) and save flattens with
// ".". Tensors load on the CPU, by default into memory of their own
// (files/options.hpp says what load_memory::mapped promises). Save writes each tensor contiguous, ordered so
// that each is aligned to its element size, the header padded to 8 bytes, as
// the Python writer does; tensors that share memory are written once each
// (the format has no sharing). Dtypes: BOOL, U8, I8, I16, I32, I64, F16, BF16,
// F32, F64, C64, and with libtorch >= 2.1 F8_E4M3, F8_E5M2, >= 2.3 U16, U32,
// U64; anything else, and any file that breaks the format's rules, throws
// file_error naming the problem.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <ATen/core/Tensor.h>

#include "../any_tensordict.hpp"
#include "../detail/config.hpp"
#include "detail/io.hpp"
#include "detail/tensors.hpp"
#include "detail/safetensors_format.hpp"
#include "../errors.hpp"
#include "options.hpp"
#include "../typed_tensordict.hpp"

namespace tensordict {

using safetensors_metadata = std::map<std::string, std::string>;

namespace detail {

inline AnyTensorDict unflatten_unless_clashing(const AnyTensorDict& flat) {
  try {
    return unflatten_if_flat(flat);
  } catch (const key_error&) {
    return flat;
  }
}

// `file`: the mapping that `bytes` views, for mapped loads; null where the bytes are in memory.
inline AnyTensorDict load_safetensors_parsed(std::string_view bytes, const std::shared_ptr<const mapped_file>& file,
                                             const load_options& options) {
  const auto header = safetensors::parse(bytes);
  AnyTensorDict flat;
  for (const auto& t : header.tensors) {
    const at::ScalarType dtype = checked_scalar_type(*t.dtype, "the safetensors tensor \"" + t.name + "\"");
    const std::string_view data = bytes.substr(header.buffer_offset + t.begin, t.end - t.begin);
    flat.set({t.name}, tensor_over(file, data, dtype, file ? load_memory::mapped : load_memory::owned).view(t.shape));
  }
  return with_loaded_batch(unflatten_unless_clashing(flat), options);
}

struct safetensors_leaf {
  std::string name;
  at::Tensor bytes;  // contiguous, CPU
  const file_dtype* dtype;
};

// A safetensors file's header and its tensors' bytes in the order written.
// Everything that can refuse a TensorDict is checked here, before a file is
// touched: dtypes, names that two key paths flatten to, names and metadata
// that are not UTF-8 (the header is JSON).
struct safetensors_layout {
  std::string header;  // the length, then the JSON padded to 8 bytes
  std::vector<safetensors_leaf> leaves;
};

inline safetensors_layout plan_safetensors(const AnyTensorDict& td, const safetensors_metadata& metadata) {
  check_no_non_tensors(td, "safetensors files");
  safetensors_layout out;
  std::map<std::string, any_key_path> named;
  td.for_each_leaf([&](const any_key_path& path, const at::Tensor& t) {
    const file_dtype* dtype = file_dtype_of(t.scalar_type());
    check_writable(t, path, dtype && !dtype->safetensors_name.empty(), "safetensors files");
    std::string name;
    for (const auto& part : path) name += (name.empty() ? "" : ".") + part;
    if (name == "__metadata__") throw file_error("a tensor cannot be named \"__metadata__\" in a safetensors file");
    if (!valid_utf8(name)) throw file_error(to_string(path) + ": the key is not valid UTF-8, which the safetensors header needs");
    if (const auto [it, fresh] = named.emplace(name, path); !fresh)
      throw file_error(to_string(it->second) + " and " + to_string(path) + " are both named \"" + name +
                       "\" in a safetensors file (its names join keys with \".\"); rename one of them");
    out.leaves.push_back({std::move(name), file_contiguous(t), dtype});
  });
  for (const auto& [key, value] : metadata)
    if (!valid_utf8(key) || !valid_utf8(value))
      throw file_error("the metadata entry \"" + key + "\" is not valid UTF-8, which the safetensors header needs");
  // Larger elements first: with the buffer 8-aligned, each tensor is aligned to its element size.
  std::stable_sort(out.leaves.begin(), out.leaves.end(),
                   [](const auto& a, const auto& b) { return a.dtype->element_size > b.dtype->element_size; });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& leaf : out.leaves) {
    const auto n = static_cast<std::uint64_t>(leaf.bytes.nbytes());
    header[leaf.name] = {{"dtype", leaf.dtype->safetensors_name},
                         {"shape", std::vector<std::int64_t>(leaf.bytes.sizes().begin(), leaf.bytes.sizes().end())},
                         {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  out.header.resize(8);
  for (int i = 0; i < 8; ++i) out.header[i] = static_cast<char>((text.size() >> (8 * i)) & 0xFF);
  out.header += text;
  return out;
}

inline void write_safetensors(const safetensors_layout& layout, std::ostream& out) {
  out.write(layout.header.data(), static_cast<std::streamsize>(layout.header.size()));
  for (const auto& leaf : layout.leaves)
    out.write(static_cast<const char*>(leaf.bytes.data_ptr()), static_cast<std::streamsize>(leaf.bytes.nbytes()));
}

}  // namespace detail

// The bytes of a safetensors file holding the TensorDict.
TENSORDICT_DECL std::string save_safetensors_to_string(const AnyTensorDict& td, const safetensors_metadata& metadata = {});

// Checked whole, then written beside `path` and renamed (detail::write_file_atomically):
// a failed save leaves an existing file whole.
TENSORDICT_DECL void save_safetensors(const AnyTensorDict& td, const std::string& path, const safetensors_metadata& metadata = {});

// From bytes in memory; the tensors own their memory.
TENSORDICT_DECL AnyTensorDict load_safetensors_from_string(std::string_view bytes, const load_options& options = {});

// Owned (the default) reads the file into memory and copies the tensors out
// of it; mapped points them into a mapping of the file (files/options.hpp).
TENSORDICT_DECL AnyTensorDict load_safetensors(const std::string& path, const load_options& options = {});

// The header's "__metadata__" (reads the header only).
TENSORDICT_DECL safetensors_metadata load_safetensors_metadata(const std::string& path);

// Into a typed TensorDict: every name must be a leaf of S; unset leaves stay unset.
template <schema_type S>
TensorDict<S> load_safetensors(const std::string& path, const load_options& options = {}) {
  return detail::naming_the_file("tensordict::load_safetensors", path,
                                 [&] { return detail::typed_from_file<S>(load_safetensors(path, options), options); });
}

// As load_safetensors<S>, and the keys, shapes and dtypes must be those of
// `like` (from_module(net)); one error lists every difference.
template <schema_type S>
TensorDict<S> load_safetensors(const std::string& path, const TensorDict<S>& like, const load_options& options = {}) {
  return detail::naming_the_file("tensordict::load_safetensors", path,
                                 [&] { return detail::typed_from_file(load_safetensors(path, options), like, options); });
}

}  // namespace tensordict

#if TENSORDICT_DEFINITIONS
namespace tensordict {

TENSORDICT_DECL std::string save_safetensors_to_string(const AnyTensorDict& td, const safetensors_metadata& metadata) {
  const auto layout = detail::plan_safetensors(td, metadata);
  std::ostringstream out;
  detail::write_safetensors(layout, out);
  return std::move(out).str();
}

TENSORDICT_DECL void save_safetensors(const AnyTensorDict& td, const std::string& path, const safetensors_metadata& metadata) {
  detail::naming_the_file("tensordict::save_safetensors", path, [&] {
    const auto layout = detail::plan_safetensors(td, metadata);
    detail::write_file_atomically(path, "tensordict::save_safetensors",
                                  [&](std::ostream& out) { detail::write_safetensors(layout, out); });
  });
}

TENSORDICT_DECL AnyTensorDict load_safetensors_from_string(std::string_view bytes, const load_options& options) {
  return detail::load_safetensors_parsed(bytes, nullptr, options);
}

TENSORDICT_DECL AnyTensorDict load_safetensors(const std::string& path, const load_options& options) {
  detail::refuse_shared(options, "tensordict::load_safetensors", path);
  if (options.memory.value_or(load_memory::owned) == load_memory::owned) {
    const std::string bytes = detail::read_file(path, "tensordict::load_safetensors");
    return detail::naming_the_file("tensordict::load_safetensors", path,
                                   [&] { return detail::load_safetensors_parsed(bytes, nullptr, options); });
  }
  const auto file = detail::mapped_file::open(path, "tensordict::load_safetensors");
  return detail::naming_the_file("tensordict::load_safetensors", path,
                                 [&] { return detail::load_safetensors_parsed(file->bytes(), file, options); });
}

TENSORDICT_DECL safetensors_metadata load_safetensors_metadata(const std::string& path) {
  const auto file = detail::mapped_file::open(path, "tensordict::load_safetensors_metadata");
  return detail::naming_the_file("tensordict::load_safetensors_metadata", path, [&] {
    const auto header = detail::safetensors::parse(file->bytes());
    return safetensors_metadata(header.metadata.begin(), header.metadata.end());
  });
}

}  // namespace tensordict
#endif  // TENSORDICT_DEFINITIONS
