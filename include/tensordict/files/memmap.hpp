// Python tensordict's memmap directories, both ways: what `td.memmap(prefix)`
// writes and `TensorDict.load_memmap(prefix)` reads (TorchRL's replay buffers
// and checkpoints use them).
//
//   auto batch = tensordict::load_memmap("replay/sample");   // batch size, keys, dtypes from meta.json
//   tensordict::save_memmap(td, "out/params");                // Python: TensorDict.load_memmap("out/params")
//
// The layout is tensordict 0.4's (files/detail/memmap_format.hpp): a meta.json per
// nested level and one raw <key>.memmap file per leaf. Every file's size must
// be what meta.json says. Tensors load on the CPU, by default each pointing
// into a private mapping of its file (load_memory::mapped: files/options.hpp
// says what it promises; load_memory::owned copies); the TensorDict's
// device is the CPU when meta.json names one. NonTensorData and
// NonTensorStack entries (non_tensor.hpp) are read and written as tensordict
// 0.4 does, when their values are None, bool, int, float or str; other
// entries that are not tensors or TensorDicts throw file_error.
// load_options::skip_non_tensors leaves all of them out. save writes into a folder beside `dir` and
// puts it in place in one step, so `dir` is either the old or the new one whole.
// Keys must be usable as file names (no "/", not "." or "..") and not
// "shape", "device" or "_type", which meta.json uses itself.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <ATen/core/Tensor.h>

#include "../any_tensordict.hpp"
#include "../detail/config.hpp"
#include "detail/io.hpp"
#include "detail/tensors.hpp"
#include "detail/memmap_format.hpp"
#include "../errors.hpp"
#include "options.hpp"
#include "../typed_tensordict.hpp"

namespace tensordict {

namespace detail {

inline memmap::level read_meta(const std::filesystem::path& dir) {
  const std::string where = (dir / "meta.json").string();
  return memmap::parse_meta(read_file(where, ""), where);
}

// Loads a level's entries into `out`, a view of that level (whose batch size is the level's).
inline void load_memmap_level(AnyTensorDict& out, const std::filesystem::path& dir, const memmap::level& level,
                              any_key_path& path, const load_options& options) {
  const std::string where = (dir / "meta.json").string();
  for (const auto& e : level.entries) {
    path.push_back(e.name);
    if (e.type == memmap::entry::kind::leaf) {
      const std::string file_path = (dir / (e.name + ".memmap")).string();
      const at::ScalarType dtype = checked_scalar_type(*e.dtype, to_string(path));
      // Owned: read without a mapping (nothing done to the file later reaches the tensor).
      const load_memory memory = options.memory.value_or(load_memory::mapped);
      const bool mapped = memory != load_memory::owned;
      const auto file = mapped ? mapped_file::open(file_path, "", memory == load_memory::shared) : nullptr;
      const std::string owned = mapped ? std::string() : read_file(file_path, "");
      const std::string_view bytes = mapped ? file->bytes() : std::string_view(owned);
      if (bytes.size() != e.bytes)
        throw file_error(file_path + " has " + std::to_string(bytes.size()) + " bytes; " + where + " says " +
                         std::string(e.dtype->torch_name) + " of shape " + c10::str(c10::IntArrayRef(e.shape)) + ", " +
                         std::to_string(e.bytes) + " bytes");
      out.set({e.name}, tensor_over(file, bytes, dtype, memory).view(e.shape));
    } else if (e.type == memmap::entry::kind::nested) {
      const auto sub = dir / e.name;
      std::error_code ec;
      if (!std::filesystem::is_directory(sub, ec)) throw file_error(where + " names the TensorDict \"" + e.name + "\", but " + sub.string() + " is not a directory");
      const memmap::level sub_level = read_meta(sub);
      // Each level has its batch size (Python's nested TensorDicts may add dims), starting with its parent's.
      if (!starts_with(sub_level.batch_size, out.batch_size()))
        throw file_error((sub / "meta.json").string() + ": the batch size " + format_sizes(sub_level.batch_size) +
                         " does not start with the enclosing TensorDict's " + format_sizes(out.batch_size()));
      out.set({e.name}, AnyTensorDict(sub_level.batch_size));
      AnyTensorDict child = out.get_tensordict({e.name});
      load_memmap_level(child, sub, sub_level, path, options);
    } else if (options.skip_non_tensors) {
    } else if (e.other == "NonTensorData" || e.other == "NonTensorStack") {
      const std::string file = (dir / e.name / "meta.json").string();
      out.set_non_tensor({e.name}, memmap::parse_non_tensor(read_file(file, ""), file, e.other, out.batch_size().vec()));
    } else {
      throw file_error(to_string(path) + " holds a " + e.other + " (" + where +
                       "), not a tensor; load with load_options{.skip_non_tensors = true} to leave such values out");
    }
    path.pop_back();
  }
}

// Every key and leaf a memmap directory can hold, checked before anything is written.
// The last key of path can name a folder or file of a memmap directory and a key of its meta.json.
inline void check_memmap_key(const any_key_path& path) {
  if (!memmap::usable_key(path.back()) || memmap::reserved_key(path.back()))
    throw file_error(to_string(path) + ": a memmap directory cannot hold this key (it must be usable as a file name, and "
                     "not \"shape\", \"device\" or \"_type\")");
  if (!valid_utf8(path.back())) throw file_error(to_string(path) + ": the key is not valid UTF-8, which meta.json needs");
}

inline void check_memmap_savable(const AnyTensorDict& td, any_key_path& path) {
  for (const std::string& name : td.level_keys()) {
    path.push_back(name);
    check_memmap_key(path);
    if (td.is_leaf({name})) {
      const at::Tensor& t = td.get({name});
      check_writable(t, path, file_dtype_of(t.scalar_type()) != nullptr, "memmap files");
    } else {
      check_memmap_savable(td.get_tensordict({name}), path);
    }
    path.pop_back();
  }
  for (const any_key_path& key : td.non_tensor_keys(false)) {
    path.push_back(key.front());
    check_memmap_key(path);
    for (const non_tensor_value& v : td.non_tensor(key).values()) {
      if (const std::string* text = std::get_if<std::string>(&v); text && !valid_utf8(*text))
        throw file_error(to_string(path) + ": a string value is not valid UTF-8, which meta.json needs");
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

// A non-tensor entry's folder, as tensordict 0.4 writes it (files/detail/memmap_format.hpp).
inline void write_non_tensor(const std::filesystem::path& dir, const NonTensor& v, c10::IntArrayRef batch,
                             const nlohmann::ordered_json& device) {
  create_new_directory(dir);
  const std::string text = memmap::non_tensor_meta(v);
  write_new_file(dir / "meta.json", text.data(), text.size(), "");
  if (!v.is_stack()) return write_empty_level(dir / "_tensordict", batch, device);
  for (std::int64_t k = 0; k < batch[0]; ++k) write_empty_level(dir / std::to_string(k), batch.slice(1), device);
}

// with_data false: each file full size and zero, without writing it (memmap_like).
inline void save_memmap_level(const AnyTensorDict& td, const std::filesystem::path& dir, const nlohmann::ordered_json& device,
                              bool with_data) {
  create_new_directory(dir);
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const std::string& name : td.level_keys()) {
    if (td.is_leaf({name})) {
      const at::Tensor& t = td.get({name});
      if (with_data) {
        const at::Tensor bytes = file_contiguous(t);
        write_new_file(dir / (name + ".memmap"), static_cast<const char*>(bytes.data_ptr()), bytes.nbytes(), "");
      } else {
        create_sized_file(dir / (name + ".memmap"), static_cast<std::uint64_t>(t.numel()) * t.element_size(), "");
      }
      meta[name] = {{"device", t.device().str()},
                    {"shape", std::vector<std::int64_t>(t.sizes().begin(), t.sizes().end())},
                    {"dtype", file_dtype_of(t.scalar_type())->torch_name}};
    } else {
      save_memmap_level(td.get_tensordict({name}), dir / name, device, with_data);
      meta[name] = {{"type", "TensorDict"}};
    }
  }
  for (const any_key_path& key : td.non_tensor_keys(false)) {
    const NonTensor& v = td.non_tensor(key);
    write_non_tensor(dir / key.front(), v, td.batch_size(), device);
    meta[key.front()] = {{"type", v.is_stack() ? "NonTensorStack" : "NonTensorData"}};
  }
  meta["shape"] = td.batch_size().vec();  // each level its own: a nested one may add dims
  meta["device"] = device;
  meta["_type"] = memmap::tensordict_type;
  const std::string text = meta.dump();
  write_new_file(dir / "meta.json", text.data(), text.size(), "");
}

}  // namespace detail

TENSORDICT_DECL AnyTensorDict load_memmap(const std::string& dir, const load_options& options = {});

namespace detail {

// Writes the directory beside `dir` and puts it in place in one step; a
// failed write removes what it created (folders above `dir` included).
// replace: an existing `dir` is replaced (save_memmap); else it is refused.
inline void write_memmap_directory(const AnyTensorDict& td, const std::string& dir, const char* verb, bool with_data, bool replace) {
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
  std::error_code ec;
  if (fs::exists(fs::symlink_status(target, ec)) && !fs::is_directory(target, ec))
    throw file_error(where + "it exists and is not a directory");
  const auto refuse_existing = [&] {
    throw file_error(where + "it exists; reopen it with load_memmap(dir, {.memory = load_memory::shared}), or remove it first");
  };
  if (!replace && fs::exists(target, ec) && !fs::is_empty(target, ec)) refuse_existing();
  if (replace && fs::exists(target, ec)) {
    // A buffer saved onto its own folder: the new folder would take the old one's place while the
    // leaves keep writing into the old files (Python's memmap writes in place instead).
    const fs::path folder = fs::weakly_canonical(target, ec);
    for (const auto& [key, leaf] : td.items()) {
      const fs::path file = written_through_file({leaf});
      if (!file.empty() && std::mismatch(folder.begin(), folder.end(), file.begin(), file.end()).first == folder.end())
        throw file_error(where + "the leaf " + to_string(key) + " writes through to " + file.string() +
                         " in this folder (load_memory::shared), so its files hold every write already; replacing the "
                         "folder would cut the leaves off from it. Save to another folder");
    }
  }
  any_key_path path;
  try {
    check_memmap_savable(td, path);
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
    const nlohmann::ordered_json device = td.device() ? td.device()->str() : "None";
    save_memmap_level(td, partial, device, with_data);
    if (replace) {
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

// Writes into a directory of its own beside `dir` and puts it in place in
// one step (detail::replace_directory), so `dir` is the old or the new one
// whole. Keys and dtypes are checked before anything is written; a failed
// save removes what it created (folders above `dir` included) and throws
// file_error naming `dir` and the reason. A TensorDict without a device
// writes the device "None", which Python tensordict reads back as none.
TENSORDICT_DECL void save_memmap(const AnyTensorDict& td, const std::string& dir);

// Python's td.memmap_like(dir): a memmap directory with `like`'s keys,
// shapes, dtypes and batch size, whose files are full size and zero without
// being written (sparse where the file system allows), loaded shared
// (load_memory::shared: writes into the result reach the files) and locked.
// Write rows into it with index_put_ / update_at_ / set_at_; Python's
// TensorDict.load_memmap(dir) reads it meanwhile. `dir` must not exist (or be
// empty): reopen a buffer with load_memmap(dir, {.memory = load_memory::shared}).
// The directory appears whole (meta.json included) or not at all.
TENSORDICT_DECL AnyTensorDict memmap_like(const AnyTensorDict& like, const std::string& dir);

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

// As memmap_like, typed as `like`.
template <schema_type S>
TensorDict<S> memmap_like(const TensorDict<S>& like, const std::string& dir) {
  const AnyTensorDict loaded = memmap_like(AnyTensorDict(like), dir);
  return detail::naming_the_file("tensordict::memmap_like", dir, [&] {
    TensorDict<S> out = detail::typed_from_file(loaded, like, load_options{});
    out.lock_();
    return out;
  });
}

}  // namespace tensordict

#if TENSORDICT_DEFINITIONS
namespace tensordict {

TENSORDICT_DECL AnyTensorDict load_memmap(const std::string& dir, const load_options& options) {
  return detail::naming_the_file("tensordict::load_memmap", dir, [&] {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) throw file_error("not a directory (a memmap TensorDict is one)");
    const auto level = detail::read_meta(dir);
    std::optional<at::Device> device;
    if (level.device && *level.device == "cpu") device = at::Device(at::kCPU);
    AnyTensorDict out(level.batch_size, device);
    any_key_path path;
    detail::load_memmap_level(out, dir, level, path, options);
    out = detail::with_loaded_batch(std::move(out), options);
    if (options.memory == load_memory::shared) out.lock_();  // a replaced leaf would no longer reach its file
    return out;
  });
}

TENSORDICT_DECL void save_memmap(const AnyTensorDict& td, const std::string& dir) {
  detail::write_memmap_directory(td, dir, "tensordict::save_memmap", /*with_data=*/true, /*replace=*/true);
}

TENSORDICT_DECL AnyTensorDict memmap_like(const AnyTensorDict& like, const std::string& dir) {
  detail::write_memmap_directory(like, dir, "tensordict::memmap_like", /*with_data=*/false, /*replace=*/false);
  load_options options;
  options.memory = load_memory::shared;
  return load_memmap(dir, options);
}

}  // namespace tensordict
#endif  // TENSORDICT_DEFINITIONS
