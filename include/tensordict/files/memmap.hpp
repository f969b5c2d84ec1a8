// Python tensordict's memmap directories, both ways: what `td.memmap(prefix)`
// writes and `TensorDict.load_memmap(prefix)` reads (TorchRL's replay buffers
// and checkpoints use them).
//
//   auto batch = tensordict::load_memmap("replay/sample");   // batch size, keys, dtypes from meta.json
//   tensordict::save_memmap(td, "out/params");                // Python: TensorDict.load_memmap("out/params")
//
// The layout (files/detail/memmap_format.hpp) is a meta.json per nested level
// and one raw <key>.memmap file per leaf, as every Python release since 0.4
// writes it; loading reads what each release wrote (0.13+'s percent-encoded
// names, 0.4's raw ones; a leaf without elements has no file), saving writes
// 0.14's layout or, with save_options{.memmap = memmap_layout::v0_4}, 0.4's
// (files/options.hpp says which releases read which). Every file's size must
// be what meta.json says. Tensors load on the CPU, by default each pointing
// into a private mapping of its file (load_memory::mapped: files/options.hpp
// says what it promises; load_memory::owned copies); the TensorDict's
// device is the CPU when meta.json names one. NonTensorData and
// NonTensorStack entries (non_tensor.hpp) are read and written as Python
// does, when their values are None, bool, int, float or str; other
// entries that are not tensors or TensorDicts throw file_error.
// load_options::skip_non_tensors leaves all of them out. save writes into a folder beside `dir` and
// puts it in place in one step, so `dir` is either the old or the new one whole.
// Keys must be valid UTF-8 and not "shape", "device" or "_type", which meta.json
// uses itself.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "../any_tensordict.hpp"
#include "../detail/config.hpp"
#include "detail/io.hpp"
#include "detail/tensors.hpp"
#include "../errors.hpp"
#include "../lazy_stack.hpp"
#include "../tensorclass.hpp"
#include "options.hpp"
#include "../typed_tensordict.hpp"

namespace tensordict {

namespace detail {
// The levels of a TensorDict that are Python tensorclasses, by key path ({} the root): the
// class's Python name, "module.Name" ("__main__.Transition").
using tensorclass_names = std::map<any_key_path, std::string>;
}  // namespace detail

TENSORDICT_DECL AnyTensorDict load_memmap(const std::string& dir, const load_options& options = {});

// Writes into a directory of its own beside `dir` and puts it in place in
// one step (detail::replace_directory), so `dir` is the old or the new one
// whole. Keys and dtypes are checked before anything is written; a failed
// save removes what it created (folders above `dir` included) and throws
// file_error naming `dir` and the reason. A TensorDict without a device
// writes the device "None", which Python tensordict reads back as none.
// options.memmap: tensordict 0.14's by default, 0.4's on request (files/options.hpp says who reads which).
TENSORDICT_DECL void save_memmap(const AnyTensorDict& td, const std::string& dir, const save_options& options = {});

// As load_memmap, and `tensorclasses` receives the levels that are Python tensorclasses
// (their fields are the level's TensorDict), by key path ({} for the root), with the
// class's Python name ("__main__.TC"): save_memmap(td, dir, tensorclasses) writes them so again.
TENSORDICT_DECL AnyTensorDict load_memmap(const std::string& dir, std::map<any_key_path, std::string>& tensorclasses,
                                          const load_options& options = {});

// A TensorDict some of whose levels are Python tensorclasses, written as tensordict 0.7
// and later write them: `tensorclasses` maps each such level's key path ({} for the
// root) to its class's Python name, "module.Name" ("__main__.Transition"), which
// Python's TensorDict.load_memmap imports. memmap_layout::v0_4 refuses them.
TENSORDICT_DECL void save_memmap(const AnyTensorDict& td, const std::string& dir, const std::map<any_key_path, std::string>& tensorclasses,
                                 const save_options& options = {});

// Python's td.memmap_like(dir): a memmap directory with `like`'s keys,
// shapes, dtypes and batch size, whose files are full size and zero without
// being written (sparse where the file system allows), loaded shared
// (load_memory::shared: writes into the result reach the files) and locked.
// Write rows into it with index_put_ / update_at_ / set_at_; Python's
// TensorDict.load_memmap(dir) reads it meanwhile. `dir` must not exist (or be
// empty): reopen a buffer with load_memmap(dir, {.memory = load_memory::shared}).
// The directory appears whole (meta.json included) or not at all.
TENSORDICT_DECL AnyTensorDict memmap_like(const AnyTensorDict& like, const std::string& dir, const save_options& options = {});

// A LazyStackedTensorDict's folder (or .tdz archive), its elements kept apart
// as Python keeps them: their shapes may differ ("obs" of 3 and of 5 steps),
// where load_memmap stacks them into one TensorDict and so needs them equal.
TENSORDICT_DECL LazyStackedTensorDict<AnyTensorDict> load_memmap_lazy_stack(const std::string& dir, const load_options& options = {});

// Writes a lazy stack as Python does: meta.json holds {"_type": LazyStackedTensorDict, "stack_dim": d},
// each element a TensorDict level in folders 0, 1, ... (Python: TensorDict.load_memmap(dir)).
TENSORDICT_DECL void save_memmap(const LazyStackedTensorDict<AnyTensorDict>& stack, const std::string& dir,
                                 const save_options& options = {});

// Into a typed TensorDict: every key must be a leaf of S; unset leaves stay unset.
template <schema_type S>
TensorDict<S> load_memmap(const std::string& dir, const load_options& options = {}) {
  return detail::naming_the_file("tensordict::load_memmap", dir, [&] {
    TensorDict<S> out = detail::typed_from_file<S>(load_memmap(dir, options), options);
    if (options.memory == load_memory::shared) out.lock_();
    return out;
  });
}

// As load_memmap<S>, and the keys, shapes and dtypes must be those of `like`.
template <schema_type S>
TensorDict<S> load_memmap(const std::string& dir, const TensorDict<S>& like, const load_options& options = {}) {
  return detail::naming_the_file("tensordict::load_memmap", dir, [&] {
    TensorDict<S> out = detail::typed_from_file(load_memmap(dir, options), like, options);
    if (options.memory == load_memory::shared) out.lock_();
    return out;
  });
}

namespace detail {
// The Python names of a tensorclass and of the tensorclasses among its members, by key path.
template <tensorclass_type T>
void collect_tensorclass_names(tensorclass_names& out, any_key_path& path, const std::string& module) {
  out[path] = module + "." + T::tensorclass_name;
  const T probe{};
  std::size_t index = 0;
  std::apply(
      [&](const auto&... member) {
        (
            [&](const auto& m) {
              using M = std::remove_cvref_t<decltype(m)>;
              if constexpr (!std::is_same_v<M, at::Tensor>) {
                path.emplace_back(T::schema_t::names[index]);
                collect_tensorclass_names<M>(out, path, module);
                path.pop_back();
              }
              ++index;
            }(member),
            ...);
      },
      probe.tensordict_fields());
}
}  // namespace detail

// A tensorclass (tensorclass.hpp) as Python writes an instance of the @tensorclass of the
// same name in `python_module` ("__main__" where the Python program defines it): its
// nested tensorclasses too. load_memmap<T> reads it back, and Python's TensorDict.load_memmap.
template <tensorclass_type T>
void save_memmap(const T& value, const std::string& dir, const save_options& options = {}, const std::string& python_module = "__main__") {
  detail::tensorclass_names classes;
  any_key_path path;
  detail::collect_tensorclass_names<T>(classes, path, python_module);
  save_memmap(AnyTensorDict(value.to_tensordict()), dir, classes, options);
}

// A tensorclass's folder (Python's, or save_memmap's above) as T, its fields by name
// (a folder of the TensorDict of T's fields loads too).
template <tensorclass_type T>
T load_memmap(const std::string& dir, const load_options& options = {}) {
  return T::from_tensordict(load_memmap<typename T::schema_t>(dir, options));
}

// As memmap_like, typed as `like`.
template <schema_type S>
TensorDict<S> memmap_like(const TensorDict<S>& like, const std::string& dir, const save_options& options = {}) {
  const AnyTensorDict loaded = memmap_like(AnyTensorDict(like), dir, options);
  return detail::naming_the_file("tensordict::memmap_like", dir, [&] {
    TensorDict<S> out = detail::typed_from_file(loaded, like, load_options{});
    out.lock_();
    return out;
  });
}

}  // namespace tensordict

// The format's work (the folder and .tdz readers and writers, meta.json) compiles in libtensordict: a
// program's TUs do not parse nlohmann/json or the zip code for it.
#if TENSORDICT_DEFINITIONS
#include <nlohmann/json.hpp>
#include "detail/memmap_format.hpp"
#include "detail/zip_reader.hpp"
#include "detail/zip_writer.hpp"

namespace tensordict {
namespace detail {

// Where a memmap TensorDict's files are: a folder, or 0.14's .tdz archive (the
// folder's files as the stored members of a zip, mapped whole). Paths are
// relative, "/"-separated; "" is the top.
class memmap_source {
 public:
  static memmap_source folder(const std::string& root) {
    memmap_source out;
    out.root_ = root;
    return out;
  }
  static memmap_source archive(const std::string& path, load_memory memory) {
    memmap_source out;
    out.root_ = path;
    // Owned: read without a mapping, as the other formats (nothing done to the file later reaches the tensors).
    if (memory == load_memory::owned) {
      out.owned_ = std::make_shared<const std::string>(read_file(path, ""));
      out.archive_bytes_ = *out.owned_;
    } else {
      out.file_ = mapped_file::open(path, "");
      out.archive_bytes_ = out.file_->bytes();
    }
    for (auto& e : archive::zip_entries(out.archive_bytes_, ".tdz")) {
      const std::string name = e.name;
      if (!out.members_.emplace(name, std::move(e)).second) throw file_error(path + ": the member " + name + " is there twice");
    }
    return out;
  }

  bool is_archive() const { return !archive_bytes_.empty() || file_ || owned_; }
  std::string where(const std::string& rel) const {
    return is_archive() ? root_ + " (member " + rel + ")" : (std::filesystem::path(root_) / rel).string();
  }
  bool has_file(const std::string& rel) const {
    std::error_code ec;
    return is_archive() ? members_.count(rel) != 0 : std::filesystem::is_regular_file(std::filesystem::path(root_) / rel, ec);
  }
  bool has_folder(const std::string& rel) const {
    std::error_code ec;
    if (!is_archive()) return std::filesystem::is_directory(std::filesystem::path(root_) / rel, ec);
    const std::string prefix = rel.empty() ? rel : rel + "/";
    const auto next = members_.lower_bound(prefix);
    return next != members_.end() && next->first.compare(0, prefix.size(), prefix) == 0;
  }
  std::string read(const std::string& rel) const {
    if (!is_archive()) return read_file((std::filesystem::path(root_) / rel).string(), "");
    const auto it = members_.find(rel);
    if (it == members_.end()) throw file_error(where(rel) + ": the archive has no such member");
    return std::string(archive_bytes_.substr(it->second.offset, it->second.size));
  }
  // A file's bytes as a 1-D tensor: over the mapping where `memory` maps, else copied.
  at::Tensor tensor(const std::string& rel, std::uint64_t expected, at::ScalarType dtype, load_memory memory,
                    const std::string& meta, const std::string& described) const {
    const bool mapped = memory != load_memory::owned;
    std::shared_ptr<const mapped_file> file = file_;
    std::string owned;
    std::string_view bytes;
    if (is_archive()) {
      const auto it = members_.find(rel);
      if (it == members_.end()) throw file_error(where(rel) + ": the archive has no such member");
      bytes = archive_bytes_.substr(it->second.offset, it->second.size);
    } else {
      const std::string path = where(rel);
      if (mapped) file = mapped_file::open(path, "", memory == load_memory::shared);
      else owned = read_file(path, "");
      bytes = mapped ? file->bytes() : std::string_view(owned);
    }
    if (bytes.size() != expected)
      throw file_error(where(rel) + " has " + std::to_string(bytes.size()) + " bytes; " + meta + " says " + described + ", " +
                       std::to_string(expected) + " bytes");
    return tensor_over(file, bytes, dtype, memory);
  }

 private:
  std::string root_;
  std::shared_ptr<const mapped_file> file_;
  std::shared_ptr<const std::string> owned_;
  std::string_view archive_bytes_;
  std::map<std::string, archive::zip_entry> members_;
};

inline std::string joined(const std::string& dir, const std::string& name) { return dir.empty() ? name : dir + "/" + name; }

// Where a level's entry lives: 0.13+ name its file or folder percent-encoded
// (memmap::file_name), earlier releases (and 0.12+'s robust_key=False) raw.
// The raw name comes first where the encoded one is another key's raw name
// (keys "a b" and "a%20b" in a folder 0.12 wrote).
inline std::string entry_path(const memmap_source& src, const std::string& dir, const memmap::level& level,
                              const std::string& key, bool file) {
  const std::string suffix = file ? ".memmap" : "";
  const std::string encoded = memmap::file_name(key);
  const std::string encoded_path = joined(dir, encoded + suffix);
  if (encoded == key || !memmap::usable_key(key)) return encoded_path;
  const std::string raw_path = joined(dir, key + suffix);
  const bool encoded_is_a_key = std::any_of(level.entries.begin(), level.entries.end(),
                                            [&](const memmap::entry& other) { return other.name == encoded; });
  const auto there = [&](const std::string& p) { return file ? src.has_file(p) : src.has_folder(p); };
  const auto& first = encoded_is_a_key ? raw_path : encoded_path;
  const auto& second = encoded_is_a_key ? encoded_path : raw_path;
  if (there(first)) return first;
  return there(second) ? second : encoded_path;
}

// `classes`, where given, receives the tensorclasses met (not those inside a lazy stack's elements).
inline AnyTensorDict load_memmap_node(const memmap_source& src, const std::string& dir, any_key_path& path,
                                      const load_options& options, c10::IntArrayRef enclosing = {},
                                      tensorclass_names* classes = nullptr);

// Loads a level's entries into `out`, a view of that level (whose batch size is the level's).
inline void load_memmap_level(AnyTensorDict& out, const memmap_source& src, const std::string& dir, const memmap::level& level,
                              any_key_path& path, const load_options& options, tensorclass_names* classes) {
  const std::string where = src.where(joined(dir, "meta.json"));
  for (const auto& e : level.entries) {
    path.push_back(e.name);
    if (e.type == memmap::entry::kind::leaf) {
      const std::string file = entry_path(src, dir, level, e.name, true);
      const at::ScalarType dtype = checked_scalar_type(*e.dtype, to_string(path));
      if (e.bytes == 0 && !src.has_file(file)) {  // Python writes no file for it
        out.set({e.name}, at::empty(e.shape, at::TensorOptions().dtype(dtype)));
      } else {
        const std::string described = std::string(e.dtype->torch_name) + " of shape " + c10::str(c10::IntArrayRef(e.shape));
        out.set({e.name}, src.tensor(file, e.bytes, dtype, options.memory.value_or(load_memory::mapped), where, described).view(e.shape));
      }
    } else if (e.type == memmap::entry::kind::nested || e.other == "LazyStackedTensorDict" ||
               (e.other != "NonTensorData" && e.other != "NonTensorStack" &&
                src.has_file(joined(entry_path(src, dir, level, e.name, false), "meta.json")))) {
      // A TensorDict, a lazy stack or a tensorclass (whose "type" is its class name).
      const std::string sub = entry_path(src, dir, level, e.name, false);
      if (!src.has_folder(sub))
        throw file_error(where + " names the " + (e.other.empty() ? "TensorDict" : e.other) + " \"" + e.name + "\", but " +
                         src.where(sub) + " is not a directory");
      AnyTensorDict child = load_memmap_node(src, sub, path, options, out.batch_size(), classes);
      // Each level has its batch size (Python's nested TensorDicts may add dims), starting with its parent's.
      if (!starts_with(child.batch_size(), out.batch_size()))
        throw file_error(src.where(joined(sub, "meta.json")) + ": the batch size " + format_sizes(child.batch_size()) +
                         " does not start with the enclosing TensorDict's " + format_sizes(out.batch_size()));
      out.set({e.name}, child);
    } else if (options.skip_non_tensors) {
    } else if (e.other == "NonTensorData" || e.other == "NonTensorStack") {
      const std::string file = src.where(joined(entry_path(src, dir, level, e.name, false), "meta.json"));
      out.set_non_tensor({e.name}, memmap::parse_non_tensor(src.read(joined(entry_path(src, dir, level, e.name, false), "meta.json")),
                                                            file, e.other, out.batch_size().vec()));
    } else {
      throw file_error(to_string(path) + " holds a " + e.other + " (" + where +
                       "), not a tensor; load with load_options{.skip_non_tensors = true} to leave such values out");
    }
    path.pop_back();
  }
}

// A folder with its meta.json: a TensorDict level, a lazy stack (its elements
// stacked, as they have the same keys and shapes) or a tensorclass (the
// TensorDict of its fields).
// `enclosing`: the batch size a nested level's must start with, checked before its files are read.
inline AnyTensorDict load_memmap_node(const memmap_source& src, const std::string& dir, any_key_path& path,
                                      const load_options& options, c10::IntArrayRef enclosing, tensorclass_names* classes) {
  const std::string meta = joined(dir, "meta.json");
  const std::string where = src.where(meta);
  const std::string text = src.read(meta);
  const memmap::node node = memmap::parse_node(text, where);
  if (node.type == memmap::node::kind::tensorclass) {
    if (!src.has_folder(joined(dir, "_tensordict")))
      throw file_error(where + " holds a " + node.class_name + " without a _tensordict folder (tensordict 0.7 and later "
                       "write a tensorclass's fields there), which this library does not read");
    if (classes) (*classes)[path] = node.qualified_name;
    return load_memmap_node(src, joined(dir, "_tensordict"), path, options, enclosing, classes);
  }
  if (node.type == memmap::node::kind::lazy_stack) {
    if (options.memory == load_memory::shared)
      throw file_error(where + " holds a LazyStackedTensorDict, which this library reads stacked into memory of its own: "
                       "load_memory::shared cannot write it through to the files; load it mapped or owned");
    std::vector<AnyTensorDict> elements;
    for (std::int64_t k = 0; src.has_file(joined(joined(dir, std::to_string(k)), "meta.json")); ++k)
      elements.push_back(load_memmap_node(src, joined(dir, std::to_string(k)), path, options));
    if (elements.empty()) throw file_error(where + " holds a LazyStackedTensorDict without elements (folders 0, 1, ...)");
    const std::int64_t dims = static_cast<std::int64_t>(elements.front().batch_size().size());
    if (node.stack_dim < -(dims + 1) || node.stack_dim > dims)
      throw file_error(where + ": the stack_dim " + std::to_string(node.stack_dim) + " is outside the elements' " +
                       std::to_string(dims) + " batch dims");
    try {
      return stack(elements, node.stack_dim);
    } catch (const std::exception& e) {
      throw file_error(where + " holds a LazyStackedTensorDict whose elements differ (" + e.what() +
                       "); this library reads a lazy stack as one TensorDict, stacked, where its elements have the same "
                       "keys and shapes");
    }
  }
  const memmap::level level = memmap::parse_meta(text, where);
  if (!starts_with(level.batch_size, enclosing))
    throw file_error(where + ": the batch size " + format_sizes(level.batch_size) + " does not start with the enclosing "
                     "TensorDict's " + format_sizes(enclosing));
  std::optional<at::Device> device;
  if (level.device && *level.device == "cpu") device = at::Device(at::kCPU);
  AnyTensorDict out(level.batch_size, device);
  load_memmap_level(out, src, dir, level, path, options, classes);
  return out;
}

// Every key and leaf a memmap directory can hold, checked before anything is written.
// The last key of path names a folder or file of the directory and a key of its meta.json.
inline void check_memmap_key(const any_key_path& path, memmap_layout layout) {
  const std::string& key = path.back();
  if (memmap::reserved_key(key))
    throw file_error(to_string(path) + ": a memmap directory cannot hold this key (its meta.json uses \"shape\", "
                     "\"device\" and \"_type\" for the TensorDict itself); rename it");
  if (!valid_utf8(key)) throw file_error(to_string(path) + ": the key is not valid UTF-8, which meta.json needs");
  if (layout == memmap_layout::v0_4 && !memmap::readable_raw_by_every_release(key))
    throw file_error(to_string(path) + ": memmap_layout::v0_4 names each file by its key as it is, and some release of "
                     "Python tensordict would not find this one (\"/\", a backslash, \":\", \"\", \".\" or \"..\"); "
                     "write memmap_layout::v0_14 (the default, read by tensordict 0.13 and later: " +
                     memmap::file_name(key) + ") or rename the key");
}

inline void check_memmap_savable(const AnyTensorDict& td, any_key_path& path, memmap_layout layout) {
  std::vector<std::string> names = td.level_keys();
  for (const any_key_path& key : td.non_tensor_keys(false)) names.push_back(key.front());
  for (const std::string& name : names) {
    path.push_back(name);
    check_memmap_key(path, layout);
    // 0.13+ try the encoded name first: another key's raw file there would be read instead.
    const std::string encoded = memmap::file_name(name);
    if (layout == memmap_layout::v0_4 && encoded != name && std::find(names.begin(), names.end(), encoded) != names.end())
      throw file_error(to_string(path) + ": memmap_layout::v0_4 writes it raw, and Python tensordict 0.13 and later "
                       "would read the key \"" + encoded + "\"'s file for it (its percent-encoded name); write "
                       "memmap_layout::v0_14 (the default) or rename one of them");
    if (td.is_non_tensor({name})) {
      for (const non_tensor_value& v : td.non_tensor({name}).values()) {
        if (const std::string* text = std::get_if<std::string>(&v); text && !valid_utf8(*text))
          throw file_error(to_string(path) + ": a string value is not valid UTF-8, which meta.json needs");
      }
    } else if (td.is_leaf({name})) {
      const at::Tensor& t = td.get({name});
      check_writable(t, path, file_dtype_of(t.scalar_type()) != nullptr, "memmap files");
    } else {
      check_memmap_savable(td.get_tensordict({name}), path, layout);
    }
    path.pop_back();
  }
}

inline void create_new_directory(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::create_directory(dir, ec) || ec)
    throw file_error("cannot create the directory " + dir.string() + ": " + (ec ? ec.message() : "it exists"));
}

// A meta.json of a TensorDict level holding nothing, of the given batch size.
inline void write_empty_level(const std::filesystem::path& dir, c10::IntArrayRef batch, const nlohmann::ordered_json& device) {
  create_new_directory(dir);
  nlohmann::ordered_json meta = {{"shape", batch.vec()}, {"device", device}, {"_type", memmap::tensordict_type}};
  const std::string text = meta.dump();
  write_new_file(dir / "meta.json", text.data(), text.size(), "");
}

// A non-tensor entry's folder (files/detail/memmap_format.hpp): 0.4 adds TensorDict levels holding nothing.
inline void write_non_tensor(const std::filesystem::path& dir, const NonTensor& v, c10::IntArrayRef batch,
                             const nlohmann::ordered_json& device, memmap_layout layout) {
  create_new_directory(dir);
  const std::string text = memmap::non_tensor_meta(v, layout);
  write_new_file(dir / "meta.json", text.data(), text.size(), "");
  if (layout != memmap_layout::v0_4) return;
  if (!v.is_stack()) return write_empty_level(dir / "_tensordict", batch, device);
  for (std::int64_t k = 0; k < batch[0]; ++k) write_empty_level(dir / std::to_string(k), batch.slice(1), device);
}

inline void check_tensorclasses(const AnyTensorDict& td, const tensorclass_names& classes, memmap_layout layout) {
  for (const auto& [path, name] : classes) {
    const std::string where = path.empty() ? std::string("the root") : to_string(path);
    if (layout == memmap_layout::v0_4)
      throw file_error(where + " is a tensorclass (" + name + "), which memmap_layout::v0_4 does not write (tensordict 0.4 "
                       "laid tensorclasses out otherwise); write memmap_layout::v0_14, the default (tensordict 0.7 and later)");
    const std::size_t dot = name.rfind('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 == name.size() || name.find_first_of("'<> ") != std::string::npos)
      throw file_error(where + ": the tensorclass name \"" + name + "\" is not a Python class's \"module.Name\" "
                       "(\"__main__.Transition\")");
    if (!path.empty() && (!td.contains(path) || td.is_leaf(path) || td.is_non_tensor(path)))
      throw file_error(where + " is named a tensorclass (" + name + ") but is no TensorDict level of the TensorDict saved");
  }
}

// A tensorclass's folder, as tensordict 0.7 and later write it: its meta.json names the class,
// its fields are the TensorDict level in _tensordict/.
inline std::filesystem::path tensorclass_folder(const std::filesystem::path& dir, const std::string& python_name) {
  create_new_directory(dir);
  const nlohmann::ordered_json meta = {{"_type", "<class '" + python_name + "'>"}};
  const std::string text = meta.dump();
  write_new_file(dir / "meta.json", text.data(), text.size(), "");
  return dir / "_tensordict";
}

// with_data false: each file full size and zero, without writing it (memmap_like).
inline void save_memmap_level(const AnyTensorDict& td, const std::filesystem::path& dir, const nlohmann::ordered_json& device,
                              bool with_data, memmap_layout layout, const tensorclass_names& classes = {},
                              any_key_path* at = nullptr) {
  any_key_path root;
  any_key_path& path = at ? *at : root;
  create_new_directory(dir);
  const auto name_of = [&](const std::string& key) { return layout == memmap_layout::v0_4 ? key : memmap::file_name(key); };
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const std::string& name : td.level_keys()) {
    if (td.is_leaf({name})) {
      const at::Tensor& t = td.get({name});
      const auto file = dir / (name_of(name) + ".memmap");
      if (t.numel() == 0) {
        // No file, as every Python release writes such a leaf (and reads it).
      } else if (with_data) {
        const at::Tensor bytes = file_contiguous(t);
        write_new_file(file, static_cast<const char*>(bytes.data_ptr()), bytes.nbytes(), "");
      } else {
        create_sized_file(file, static_cast<std::uint64_t>(t.numel()) * t.element_size(), "");
      }
      meta[name] = {{"device", t.device().str()},
                    {"shape", std::vector<std::int64_t>(t.sizes().begin(), t.sizes().end())},
                    {"dtype", file_dtype_of(t.scalar_type())->torch_name}};
      if (layout == memmap_layout::v0_14) meta[name]["is_nested"] = false;
    } else {
      path.push_back(name);
      const auto tensorclass = classes.find(path);
      if (tensorclass == classes.end()) {
        save_memmap_level(td.get_tensordict({name}), dir / name_of(name), device, with_data, layout, classes, &path);
        meta[name] = {{"type", "TensorDict"}};
      } else {
        save_memmap_level(td.get_tensordict({name}), tensorclass_folder(dir / name_of(name), tensorclass->second), device,
                          with_data, layout, classes, &path);
        meta[name] = {{"type", tensorclass->second.substr(tensorclass->second.rfind('.') + 1)}};  // Python: the class's __name__
      }
      path.pop_back();
    }
  }
  for (const any_key_path& key : td.non_tensor_keys(false)) {
    const NonTensor& v = td.non_tensor(key);
    write_non_tensor(dir / name_of(key.front()), v, td.batch_size(), device, layout);
    meta[key.front()] = {{"type", v.is_stack() ? "NonTensorStack" : "NonTensorData"}};
  }
  meta["shape"] = td.batch_size().vec();  // each level its own: a nested one may add dims
  meta["device"] = device;
  meta["_type"] = memmap::tensordict_type;
  const std::string text = meta.dump();
  write_new_file(dir / "meta.json", text.data(), text.size(), "");
}

// The folder's files as a .tdz archive: each level's meta.json first, then its
// files, then its folders, each in name order.
inline void write_tdz(const std::filesystem::path& folder, std::ostream& out) {
  archive::zip_writer zip(out);
  const auto add_level = [&](auto& self, const std::filesystem::path& dir, const std::string& prefix) -> void {
    std::vector<std::filesystem::path> files, folders;
    for (const auto& e : std::filesystem::directory_iterator(dir)) (e.is_directory() ? folders : files).push_back(e.path());
    std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) {
      return std::make_pair(a.filename() != "meta.json", a.filename().string()) < std::make_pair(b.filename() != "meta.json", b.filename().string());
    });
    std::sort(folders.begin(), folders.end());
    for (const auto& f : files) {
      const auto mapped = mapped_file::open(f.string(), "");
      zip.add(prefix + f.filename().string(), mapped->bytes());
    }
    for (const auto& f : folders) self(self, f, prefix + f.filename().string() + "/");
  };
  add_level(add_level, folder, "");
  zip.finish();
}

}  // namespace detail

namespace detail {

// Writes the directory beside `dir` and puts it in place in one step; a
// failed write removes what it created (folders above `dir` included).
// replace: an existing `dir` is replaced (save_memmap); else it is refused.
// `stack_dim`: `tds` are a lazy stack's elements, written as Python writes a
// LazyStackedTensorDict; else `tds` holds the one TensorDict.
inline void write_memmap_directory(const std::vector<AnyTensorDict>& tds, std::optional<std::int64_t> stack_dim,
                                   const std::string& dir, const char* verb, bool with_data, bool replace, memmap_layout layout,
                                   const tensorclass_names& classes = {}) {
  namespace fs = std::filesystem;
  const std::string where = std::string(verb) + "(\"" + dir + "\"): ";
  if (dir.empty()) throw file_error(where + "the path is empty");
  fs::path normal = fs::path(dir).lexically_normal();
  if (!normal.has_filename()) normal = normal.parent_path();  // "out/params/"
  const std::string name = normal.filename().string();
  if (normal.empty() || name == "." || name == "..")
    throw file_error(where + "it names the current or a parent directory; give the TensorDict a directory of its own "
                     "(\"out/params\")");
  const fs::path target = write_target(normal.string(), where);
  // 0.14's save("x.tdz") writes the folder's files into one zip archive; 0.4 to 0.12 make a folder of that name.
  const bool archive = layout == memmap_layout::v0_14 && target.extension() == ".tdz";
  if (archive && !with_data)
    throw file_error(where + "a .tdz archive cannot be written through; give memmap_like a folder (a name without .tdz)");
  std::error_code ec;
  if (archive && fs::is_directory(target, ec))
    throw file_error(where + "it is a directory; memmap_layout::v0_14 writes \"" + name + "\" as a .tdz archive (a file), "
                     "as tensordict 0.14 does; remove the directory, or write memmap_layout::v0_4 (a folder of that name)");
  if (!archive && fs::exists(fs::symlink_status(target, ec)) && !fs::is_directory(target, ec))
    throw file_error(where + "it exists and is not a directory");
  const auto refuse_existing = [&] {
    throw file_error(where + "it exists; reopen it with load_memmap(dir, {.memory = load_memory::shared}), or remove it first");
  };
  if (!replace && fs::exists(target, ec) && !fs::is_empty(target, ec)) refuse_existing();
  if (replace && fs::exists(target, ec)) {
    // A buffer saved onto its own folder: the new folder would take the old one's place while the
    // leaves keep writing into the old files (Python's memmap writes in place instead).
    const fs::path folder = fs::weakly_canonical(target, ec);
    for (const AnyTensorDict& td : tds)
      for (const auto& [key, leaf] : td.items()) {
        const fs::path file = written_through_file({leaf});
        if (!file.empty() && std::mismatch(folder.begin(), folder.end(), file.begin(), file.end()).first == folder.end())
          throw file_error(where + "the leaf " + to_string(key) + " writes through to " + file.string() +
                           " in this folder (load_memory::shared), so its files hold every write already; replacing the "
                           "folder would cut the leaves off from it. Save to another folder");
      }
  }
  try {
    for (const AnyTensorDict& td : tds) {
      any_key_path path;
      check_memmap_savable(td, path, layout);
      check_tensorclasses(td, classes, layout);
    }
  } catch (const file_error& e) {
    throw file_error(where + e.what());
  }

  fs::path created;  // the outermost folder above `dir` that this call creates
  for (fs::path p = target.parent_path(); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) created = p;
  const fs::path partial = unique_beside(target, "tensordict-partial");
  auto undo = [&] {
    fs::remove_all(partial, ec);
    if (!created.empty()) fs::remove_all(created, ec);
  };
  try {
    if (!created.empty()) fs::create_directories(target.parent_path());
    const auto device_of = [](const AnyTensorDict& td) -> nlohmann::ordered_json { return td.device() ? td.device()->str() : "None"; };
    if (!stack_dim) {
      const auto root = classes.find(any_key_path{});
      save_memmap_level(tds.front(), root == classes.end() ? partial : tensorclass_folder(partial, root->second),
                        device_of(tds.front()), with_data, layout, classes);
    } else {
      create_new_directory(partial);
      const nlohmann::ordered_json meta = {{"_type", std::string(memmap::lazy_stack_type)}, {"stack_dim", *stack_dim}};
      const std::string text = meta.dump();
      write_new_file(partial / "meta.json", text.data(), text.size(), "");
      for (std::size_t k = 0; k < tds.size(); ++k)
        save_memmap_level(tds[k], partial / std::to_string(k), device_of(tds[k]), with_data, layout);
    }
    if (archive) {
      write_file_atomically(target.string(), "", [&](std::ostream& out) { write_tdz(partial, out); });
      fs::remove_all(partial, ec);
    } else if (replace) {
      replace_directory(partial, target, where);
    } else if (std::rename(partial.c_str(), target.c_str()) != 0) {  // only where `dir` is missing or empty
      if (errno == EEXIST || errno == ENOTEMPTY) refuse_existing();
      throw file_error(where + "cannot put the directory in place: " + std::strerror(errno));
    }
  } catch (const fs::filesystem_error& e) {
    undo();
    throw file_error(where + e.what());
  } catch (const file_error& e) {
    undo();
    if (std::string_view(e.what()).substr(0, where.size()) == where) throw;
    throw file_error(where + e.what());
  } catch (...) {
    undo();
    throw;
  }
}

}  // namespace detail

TENSORDICT_DECL AnyTensorDict load_memmap(const std::string& dir, const load_options& options) {
  std::map<any_key_path, std::string> tensorclasses;
  return load_memmap(dir, tensorclasses, options);
}

TENSORDICT_DECL AnyTensorDict load_memmap(const std::string& dir, std::map<any_key_path, std::string>& tensorclasses,
                                          const load_options& options) {
  tensorclasses.clear();
  return detail::naming_the_file("tensordict::load_memmap", dir, [&] {
    std::error_code ec;
    const bool folder = std::filesystem::is_directory(dir, ec);
    if (!folder && !std::filesystem::is_regular_file(dir, ec))
      throw file_error("not a directory (a memmap TensorDict is one) nor a .tdz archive");
    if (!folder && options.memory == load_memory::shared)
      throw value_error("load_memory::shared maps memmap directories, not .tdz archives; load it mapped or owned");
    const detail::memmap_source src = folder ? detail::memmap_source::folder(dir)
                                             : detail::memmap_source::archive(dir, options.memory.value_or(load_memory::mapped));
    any_key_path path;
    AnyTensorDict out = detail::load_memmap_node(src, "", path, options, {}, &tensorclasses);
    out = detail::with_loaded_batch(std::move(out), options);
    if (options.memory == load_memory::shared) out.lock_();  // a replaced leaf would no longer reach its file
    return out;
  });
}

TENSORDICT_DECL void save_memmap(const AnyTensorDict& td, const std::string& dir, const save_options& options) {
  detail::write_memmap_directory({td}, std::nullopt, dir, "tensordict::save_memmap", /*with_data=*/true, /*replace=*/true,
                                 options.memmap);
}

TENSORDICT_DECL void save_memmap(const AnyTensorDict& td, const std::string& dir, const std::map<any_key_path, std::string>& tensorclasses,
                                 const save_options& options) {
  detail::write_memmap_directory({td}, std::nullopt, dir, "tensordict::save_memmap", /*with_data=*/true, /*replace=*/true,
                                 options.memmap, tensorclasses);
}

TENSORDICT_DECL void save_memmap(const LazyStackedTensorDict<AnyTensorDict>& stack, const std::string& dir, const save_options& options) {
  detail::write_memmap_directory(stack.tensordicts(), stack.stack_dim(), dir, "tensordict::save_memmap", /*with_data=*/true,
                                 /*replace=*/true, options.memmap);
}

TENSORDICT_DECL LazyStackedTensorDict<AnyTensorDict> load_memmap_lazy_stack(const std::string& dir, const load_options& options) {
  return detail::naming_the_file("tensordict::load_memmap_lazy_stack", dir, [&] {
    if (options.memory == load_memory::shared)
      throw value_error("load_memory::shared: a lazy stack's elements are read mapped or owned");
    std::error_code ec;
    const bool folder = std::filesystem::is_directory(dir, ec);
    if (!folder && !std::filesystem::is_regular_file(dir, ec)) throw file_error("not a directory nor a .tdz archive");
    const detail::memmap_source src = folder ? detail::memmap_source::folder(dir)
                                             : detail::memmap_source::archive(dir, options.memory.value_or(load_memory::mapped));
    const std::string where = src.where("meta.json");
    const detail::memmap::node node = detail::memmap::parse_node(src.read("meta.json"), where);
    if (node.type != detail::memmap::node::kind::lazy_stack)
      throw file_error(where + " holds no LazyStackedTensorDict; load it with load_memmap");
    std::vector<AnyTensorDict> elements;
    any_key_path path;
    for (std::int64_t k = 0; src.has_file(std::to_string(k) + "/meta.json"); ++k)
      elements.push_back(detail::with_loaded_batch(detail::load_memmap_node(src, std::to_string(k), path, options), options));
    if (elements.empty()) throw file_error(where + " holds a LazyStackedTensorDict without elements (folders 0, 1, ...)");
    return LazyStackedTensorDict<AnyTensorDict>(std::move(elements), node.stack_dim);
  });
}

TENSORDICT_DECL AnyTensorDict memmap_like(const AnyTensorDict& like, const std::string& dir, const save_options& options) {
  detail::write_memmap_directory({like}, std::nullopt, dir, "tensordict::memmap_like", /*with_data=*/false, /*replace=*/false,
                                 options.memmap);
  load_options shared;
  shared.memory = load_memory::shared;
  return load_memmap(dir, shared);
}

}  // namespace tensordict
#endif  // TENSORDICT_DEFINITIONS
