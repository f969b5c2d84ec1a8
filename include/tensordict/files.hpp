// Files shared with Python: what torch.save writes, read and written here.
//
//   tensordict::save(td, "params.pt");                     // Python: torch.load("params.pt") -> dict
//   auto any = tensordict::load("model_state.pt");        // torch.save(model.state_dict(), ...) from Python
//   auto typed = tensordict::load(path, tensordict::from_module(net));   // keys, shapes, dtypes checked
//
// The file is Python's torch.save zip format (protocol 2 pickle). save
// writes nested dicts by default: a TensorDict with keys ("0", "weight")
// loads in Python as {"0": {"weight": tensor}}; file_layout::flat writes
// dotted keys {"0.weight": tensor}, which model.load_state_dict() takes.
// load reads dicts, OrderedDicts (every state_dict()), one-entry dicts and
// nested dicts, whose values are tensors or nn.Parameters; tensors that share
// a storage in the file share one after loading. Values that are not tensors
// (an "epoch": 3) throw file_error naming their key, or are left out with
// load_options::skip_non_tensors. The legacy (non-zip) format and TorchScript
// archives are refused with file_error. Tensors load on the CPU.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <unordered_map>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "any_tensordict.hpp"
#include "detail/torch_archive.hpp"
#include "errors.hpp"
#include "typed_tensordict.hpp"

namespace tensordict {

enum class file_layout { nested, flat };

struct save_options {
  file_layout layout = file_layout::nested;
  std::string separator = ".";  // for file_layout::flat
};

struct load_options {
  bool skip_non_tensors = false;
};

namespace detail {

// The same order as archive::storage_types.
inline constexpr std::array<at::ScalarType, 12> file_dtypes{
    at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong, at::kInt,
    at::kShort, at::kChar,   at::kByte, at::kBool,     at::kComplexFloat, at::kComplexDouble,
};

inline std::size_t file_dtype_index(at::ScalarType dtype, const std::string& where) {
  for (std::size_t i = 0; i < file_dtypes.size(); ++i)
    if (file_dtypes[i] == dtype) return i;
  throw file_error("tensordict::save: " + where + " has dtype " + std::string(c10::toString(dtype)) +
                   ", which torch.save files of this version cannot hold");
}

inline std::string read_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw file_error("tensordict::load(\"" + path + "\"): it is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw file_error("tensordict::load(\"" + path + "\"): cannot open it: " + std::strerror(errno));
  try {  // libstdc++'s filebuf throws std::ios_base::failure on a read error
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw file_error("tensordict::load(\"" + path + "\"): reading failed");
    return bytes;
  } catch (const std::ios_base::failure& e) {
    throw file_error("tensordict::load(\"" + path + "\"): reading failed: " + e.what());
  }
}

// Writes next to the target and renames, so a failed save leaves an existing file whole.
inline void write_file(const std::string& path, const std::string& bytes) {
  const std::string temporary = path + ".tensordict-partial";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw file_error("tensordict::save(\"" + path + "\"): cannot create it: " + std::strerror(errno));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      std::remove(temporary.c_str());
      throw file_error("tensordict::save(\"" + path + "\"): writing failed");
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    throw file_error("tensordict::save(\"" + path + "\"): cannot replace it: " + reason);
  }
}

class file_writer {
 public:
  std::string write(const AnyTensorDict& td) {
    archive::pickler p;
    write_dict(p, td, {});
    archive::zip_writer zip;
    zip.add("archive/data.pkl", std::move(p).finish());
    for (std::size_t k = 0; k < storages_.size(); ++k) {
      const at::Tensor& s = storages_[k];
      zip.add("archive/data/" + std::to_string(k),
              std::string_view(static_cast<const char*>(s.data_ptr()), s.numel() * s.element_size()));
    }
    zip.add("archive/version", "3\n");
    return std::move(zip).finish();
  }

 private:
  void write_dict(archive::pickler& p, const AnyTensorDict& td, any_key_path path) {
    p.empty_dict();
    if (td.empty()) return;
    p.mark();
    for (const std::string& name : td.names()) {
      path.push_back(name);
      p.string(name);
      if (td.is_leaf({name}))
        write_tensor(p, td.get({name}), path);
      else
        write_dict(p, td.get_tensordict({name}), path);
      path.pop_back();
    }
    p.set_items();
  }

  void write_tensor(archive::pickler& p, const at::Tensor& t, const any_key_path& path) {
    const std::size_t type = file_dtype_index(t.scalar_type(), to_string(path));
    at::Tensor view = t.detach();
    if (view.is_sparse() || view.is_quantized() || !view.has_storage())
      throw file_error("tensordict::save: " + to_string(path) + " is not a dense tensor");
    const void* storage = view.storage().unsafeGetStorageImpl();
    auto it = keys_.find(storage);
    if (it == keys_.end() || storages_[it->second].scalar_type() != view.scalar_type()) {
      // The whole storage, once: tensors that share it in memory share it in the file.
      const std::int64_t numel = static_cast<std::int64_t>(view.storage().nbytes() / view.element_size());
      at::Tensor whole = at::empty({0}, view.options()).set_(view.storage(), 0, {numel}, {1});
      if (!whole.device().is_cpu()) whole = whole.cpu();
      if (it != keys_.end()) {  // the same bytes as another dtype: this tensor gets its own copy
        whole = view.contiguous().cpu().reshape({-1}).clone();
        view = whole.view(view.sizes());
      }
      storages_.push_back(whole);
      it = keys_.insert_or_assign(storage, storages_.size() - 1).first;
    }
    const at::Tensor& s = storages_[it->second];
    p.tensor(type, std::to_string(it->second), s.numel(), view.storage_offset(),
             std::vector<std::int64_t>(view.sizes().begin(), view.sizes().end()),
             std::vector<std::int64_t>(view.strides().begin(), view.strides().end()), t.requires_grad());
  }

  std::unordered_map<const void*, std::size_t> keys_;
  std::vector<at::Tensor> storages_;
};

inline void fill(AnyTensorDict& out, const archive::dict_record& dict, any_key_path& path,
                 std::unordered_map<std::string, at::Tensor>& storages, const load_options& options) {
  for (const auto& e : dict.entries) {
    path.push_back(e.key);
    if (e.tensor) {
      const auto& t = *e.tensor;
      const at::ScalarType dtype = file_dtypes[t.storage_type];
      at::Tensor& base = storages[t.storage_key];
      if (!base.defined()) {
        const auto numel = static_cast<std::int64_t>(t.storage_bytes.size() / archive::storage_types[t.storage_type].element_size);
        base = at::empty({numel}, at::TensorOptions().dtype(dtype));
        if (numel > 0) std::memcpy(base.data_ptr(), t.storage_bytes.data(), numel * base.element_size());
      } else if (base.scalar_type() != dtype) {
        throw file_error(to_string(path) + ": its storage \"" + t.storage_key + "\" is read as two dtypes");
      }
      at::Tensor tensor = base.as_strided(t.sizes, t.strides, t.offset);
      if (t.requires_grad) tensor.requires_grad_();
      out.set(path, tensor);
    } else if (e.dict) {
      if (e.dict->entries.empty())
        out.set(path, AnyTensorDict(out.batch_size()));
      else
        fill(out, *e.dict, path, storages, options);
    } else if (!options.skip_non_tensors) {
      throw file_error(to_string(path) + " holds a Python " + e.other +
                       ", not a tensor; load with load_options{.skip_non_tensors = true} to leave such values out");
    }
    path.pop_back();
  }
}

// A state_dict() names leaves "0.weight"; a nested schema wants them as a tree.
template <schema_type S>
AnyTensorDict shaped_for(const AnyTensorDict& any) {
  if constexpr (S::depth > 1)
    return unflatten_if_flat(any);
  else
    return any;
}

}  // namespace detail

// The bytes of a torch.save file holding the TensorDict (typed ones convert implicitly).
inline std::string save_to_string(const AnyTensorDict& td, const save_options& options = {}) {
  return detail::file_writer().write(options.layout == file_layout::flat ? td.flatten_keys(options.separator) : td);
}

inline void save(const AnyTensorDict& td, const std::string& path, const save_options& options = {}) {
  std::string bytes;
  try {
    bytes = save_to_string(td, options);
  } catch (const file_error& e) {
    throw file_error("tensordict::save(\"" + path + "\"): " + e.what());
  }
  detail::write_file(path, bytes);
}

// A torch.save file's dict as an AnyTensorDict with batch_size [].
inline AnyTensorDict load_from_string(std::string_view bytes, const load_options& options = {}) {
  const auto root = detail::archive::parse(bytes);
  AnyTensorDict out;
  any_key_path path;
  std::unordered_map<std::string, at::Tensor> storages;
  detail::fill(out, *root, path, storages, options);
  return out;
}

inline AnyTensorDict load(const std::string& path, const load_options& options = {}) {
  const std::string bytes = detail::read_file(path);
  try {
    return load_from_string(bytes, options);
  } catch (const file_error& e) {
    throw file_error("tensordict::load(\"" + path + "\"): " + e.what());
  }
}

// Into a typed TensorDict: every key must be a leaf of S (a flat state_dict
// is unflattened first); unset leaves stay unset.
template <schema_type S>
TensorDict<S> load(const std::string& path, const load_options& options = {}) {
  return detail::shaped_for<S>(load(path, options)).template to_typed<S>({.allow_missing = true});
}

// As load<S>, and the keys, shapes and dtypes must be those of `like`
// (from_module(net) for a checkpoint of net); one error lists every difference.
template <schema_type S>
TensorDict<S> load(const std::string& path, const TensorDict<S>& like, const load_options& options = {}) {
  return detail::shaped_for<S>(load(path, options)).to_typed(like);
}

}  // namespace tensordict
