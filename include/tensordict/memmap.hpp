// Python tensordict's memmap directories, both ways: what `td.memmap(prefix)`
// writes and `TensorDict.load_memmap(prefix)` reads (TorchRL's replay buffers
// and checkpoints use them).
//
//   auto batch = tensordict::load_memmap("replay/sample");   // batch size, keys, dtypes from meta.json
//   tensordict::save_memmap(td, "out/params");                // Python: TensorDict.load_memmap("out/params")
//
// The layout is tensordict 0.4's (detail/memmap_format.hpp): a meta.json per
// nested level and one raw <key>.memmap file per leaf. Every file's size must
// be what meta.json says. Tensors load on the CPU, by default each pointing
// into a private mapping of its file (file_options.hpp); the TensorDict's
// device is the CPU when meta.json names one. Entries that are not tensors or
// TensorDicts (NonTensorData) throw file_error, or are left out with
// load_options::skip_non_tensors. save writes into a folder beside `dir` and
// renames it into place, so `dir` is either the old or the new one whole.
// Keys must be usable as file names (no "/", not "." or "..") and not
// "shape", "device" or "_type", which meta.json uses itself.
#pragma once

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <ATen/core/Tensor.h>

#include "any_tensordict.hpp"
#include "detail/file_io.hpp"
#include "detail/file_tensors.hpp"
#include "detail/memmap_format.hpp"
#include "errors.hpp"
#include "file_options.hpp"
#include "typed_tensordict.hpp"

namespace tensordict {

namespace detail {

inline memmap::level read_meta(const std::filesystem::path& dir) {
  const std::string where = (dir / "meta.json").string();
  return memmap::parse_meta(read_file(where, ""), where);
}

inline void load_memmap_level(AnyTensorDict& out, const std::filesystem::path& dir, const memmap::level& level,
                              any_key_path& path, const load_options& options) {
  const std::string where = (dir / "meta.json").string();
  const auto batch = out.batch_size();
  if (level.batch_size.size() < batch.size() || !std::equal(batch.begin(), batch.end(), level.batch_size.begin()))
    throw file_error(where + ": the batch size does not start with the enclosing TensorDict's");
  for (const auto& e : level.entries) {
    path.push_back(e.name);
    if (e.type == memmap::entry::kind::leaf) {
      const std::string file_path = (dir / (e.name + ".memmap")).string();
      const at::ScalarType dtype = checked_scalar_type(*e.dtype, to_string(path));
      const auto file = mapped_file::open(file_path, "");
      if (file->size() != e.bytes)
        throw file_error(file_path + " has " + std::to_string(file->size()) + " bytes; " + where + " says " +
                         std::string(e.dtype->torch_name) + " of shape " + c10::str(c10::IntArrayRef(e.shape)) + ", " +
                         std::to_string(e.bytes) + " bytes");
      out.set(path, tensor_over(file, file->bytes(), dtype, options.memory).view(e.shape));
    } else if (e.type == memmap::entry::kind::nested) {
      const auto sub = dir / e.name;
      std::error_code ec;
      if (!std::filesystem::is_directory(sub, ec)) throw file_error(where + " names the TensorDict \"" + e.name + "\", but " + sub.string() + " is not a directory");
      const std::size_t before = out.leaf_count();
      load_memmap_level(out, sub, read_meta(sub), path, options);
      if (out.leaf_count() == before && !out.contains(path)) out.set(path, AnyTensorDict(out.batch_size()));
    } else if (!options.skip_non_tensors) {
      throw file_error(to_string(path) + " holds a " + e.other + " (" + where +
                       "), not a tensor; load with load_options{.skip_non_tensors = true} to leave such values out");
    }
    path.pop_back();
  }
}

inline void save_memmap_level(const AnyTensorDict& td, const std::filesystem::path& dir, any_key_path& path,
                              const nlohmann::ordered_json& batch, const nlohmann::ordered_json& device) {
  std::filesystem::create_directory(dir);
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const std::string& name : td.level_keys()) {
    path.push_back(name);
    if (!memmap::usable_key(name) || memmap::reserved_key(name))
      throw file_error(to_string(path) + ": a memmap directory cannot hold this key (it must be usable as a file name, and "
                       "not \"shape\", \"device\" or \"_type\")");
    if (td.is_leaf({name})) {
      const at::Tensor& t = td.get({name});
      const file_dtype* dtype = file_dtype_of(t.scalar_type());
      check_writable(t, path, dtype != nullptr, "memmap files");
      const at::Tensor bytes = file_contiguous(t);
      const std::string file = (dir / (name + ".memmap")).string();
      std::ofstream out(file, std::ios::binary | std::ios::trunc);
      out.write(static_cast<const char*>(bytes.data_ptr()), static_cast<std::streamsize>(bytes.nbytes()));
      if (!out.flush()) throw file_error("tensordict::save_memmap: writing " + file + " failed (disk full?)");
      meta[name] = {{"device", t.device().str()},
                    {"shape", std::vector<std::int64_t>(t.sizes().begin(), t.sizes().end())},
                    {"dtype", dtype->torch_name}};
    } else {
      save_memmap_level(td.get_tensordict({name}), dir / name, path, batch, device);
      meta[name] = {{"type", "TensorDict"}};
    }
    path.pop_back();
  }
  meta["shape"] = batch;
  meta["device"] = device;
  meta["_type"] = memmap::tensordict_type;
  std::ofstream out(dir / "meta.json", std::ios::trunc);
  out << meta.dump();
  if (!out.flush()) throw file_error("tensordict::save_memmap: writing " + (dir / "meta.json").string() + " failed");
}

}  // namespace detail

inline AnyTensorDict load_memmap(const std::string& dir, const load_options& options = {}) {
  return detail::naming_the_file("tensordict::load_memmap", dir, [&] {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) throw file_error("not a directory (a memmap TensorDict is one)");
    const auto level = detail::read_meta(dir);
    std::optional<at::Device> device;
    if (level.device && *level.device == "cpu") device = at::Device(at::kCPU);
    AnyTensorDict out(level.batch_size, device);
    any_key_path path;
    detail::load_memmap_level(out, dir, level, path, options);
    return out;
  });
}

inline void save_memmap(const AnyTensorDict& td, const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string where = "tensordict::save_memmap(\"" + dir + "\"): ";
  fs::path target = fs::path(dir).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "out/params/"
  const fs::path partial = target.string() + ".tensordict-partial", old = target.string() + ".tensordict-old";
  std::error_code ec;
  fs::remove_all(partial, ec);
  nlohmann::ordered_json device = nullptr;
  if (td.device()) device = td.device()->str();
  any_key_path path;
  try {
    if (target.has_parent_path()) fs::create_directories(target.parent_path());
    detail::save_memmap_level(td, partial, path, td.batch_size().vec(), device);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(partial, ec);
    throw file_error(where + e.what());
  } catch (const file_error& e) {
    fs::remove_all(partial, ec);
    throw file_error(where + e.what());
  }
  try {
    fs::remove_all(old, ec);
    if (fs::exists(target)) fs::rename(target, old);
    fs::rename(partial, target);
    fs::remove_all(old, ec);
  } catch (const fs::filesystem_error& e) {
    throw file_error(where + "cannot put the directory in place: " + e.what());
  }
}

// Into a typed TensorDict: every key must be a leaf of S; unset leaves stay unset.
template <schema_type S>
TensorDict<S> load_memmap(const std::string& dir, const load_options& options = {}) {
  return detail::typed_from_file<S>(load_memmap(dir, options));
}

// As load_memmap<S>, and the keys, shapes and dtypes must be those of `like`.
template <schema_type S>
TensorDict<S> load_memmap(const std::string& dir, const TensorDict<S>& like, const load_options& options = {}) {
  return detail::typed_from_file(load_memmap(dir, options), like);
}

}  // namespace tensordict
