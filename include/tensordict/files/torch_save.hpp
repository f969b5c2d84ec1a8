// Files shared with Python: what torch.save writes, read and written here.
//
//   tensordict::save(td, "params.pt");                     // Python: torch.load("params.pt") -> dict
//   auto any = tensordict::load("model_state.pt");        // torch.save(model.state_dict(), ...) from Python
//   auto typed = tensordict::load(path, tensordict::from_module(net));   // keys, shapes, dtypes checked
//
// The file is Python's torch.save zip format, written by libtorch's own
// writer (caffe2::serialize::PyTorchStreamWriter, torch::jit::Pickler), so
// Python's torch.load reads it, with weights_only=True too. save writes
// nested dicts by default: a TensorDict with keys ("0", "weight") loads in
// Python as {"0": {"weight": tensor}}; file_layout::flat writes dotted keys
// {"0.weight": tensor}, which model.load_state_dict() takes.
// load reads dicts, OrderedDicts (every state_dict()), one-entry dicts and
// nested dicts, whose values are tensors or nn.Parameters; tensors that share
// a storage in the file share one after loading. A Python TensorDict's
// state_dict() loads as that TensorDict, nested, with its batch sizes: 0.7
// nests dicts with "__batch_size" / "__device" entries; 0.12 and 0.14 flatten
// the keys and record each TensorDict in the OrderedDict's _metadata (the
// recorded device is not kept: tensors load on the CPU). Values that are not tensors
// (an "epoch": 3) throw file_error naming their key, or are left out with
// load_options::skip_non_tensors. The legacy (non-zip) format and TorchScript
// archives are refused with file_error. Tensors load on the CPU, by default
// into memory of their own (load_memory::owned; files/options.hpp says what
// load_memory::mapped promises).
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "options.hpp"

#include <algorithm>
#include <array>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>

#include "../any_tensordict.hpp"
#include "../detail/config.hpp"
#include "detail/io.hpp"
#include "detail/tensors.hpp"
#include "../errors.hpp"
#include "../typed_tensordict.hpp"

namespace tensordict {

// The bytes of a torch.save file holding the TensorDict (typed ones convert implicitly).
TENSORDICT_DECL std::string save_to_string(const AnyTensorDict& td, const save_options& options = {});

// Written beside `path` and renamed: a failed save leaves an existing file whole.
TENSORDICT_DECL void save(const AnyTensorDict& td, const std::string& path, const save_options& options = {});

// A torch.save file's dict as an AnyTensorDict with batch_size []; the tensors
// own their memory (the bytes need not outlive the result).
TENSORDICT_DECL AnyTensorDict load_from_string(std::string_view bytes, const load_options& options = {});

// Owned (the default) reads the file into memory and copies the tensors out
// of it; mapped points them into a mapping of the file (files/options.hpp).
TENSORDICT_DECL AnyTensorDict load(const std::string& path, const load_options& options = {});

// Into a typed TensorDict: every key must be a leaf of S (a flat state_dict
// is unflattened first); unset leaves stay unset.
template <schema_type S>
TensorDict<S> load(const std::string& path, const load_options& options = {}) {
  return detail::naming_the_file("tensordict::load", path, [&] { return detail::typed_from_file<S>(load(path, options), options); });
}

// As load<S>, and the keys, shapes and dtypes must be those of `like`
// (from_module(net) for a checkpoint of net); one error lists every difference.
template <schema_type S>
TensorDict<S> load(const std::string& path, const TensorDict<S>& like, const load_options& options = {}) {
  return detail::naming_the_file("tensordict::load", path, [&] { return detail::typed_from_file(load(path, options), like, options); });
}

}  // namespace tensordict

// The format's work (the pickle writer and reader, the zip archive) compiles in libtensordict: a program's
// TUs do not parse libtorch's serialization headers for it.
#if TENSORDICT_DEFINITIONS
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include "detail/torch_archive.hpp"

namespace tensordict {

namespace detail {

// The dtypes of archive::storage_types, in its order.
inline constexpr std::array<at::ScalarType, 12> archive_dtypes{
    at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong, at::kInt,
    at::kShort, at::kChar,   at::kByte, at::kBool,     at::kComplexFloat, at::kComplexDouble,
};

// The types a torch.save storage can have (torch.<Name>Storage).
inline void check_savable(const at::Tensor& t, const any_key_path& path) {
  check_writable(t, path, std::find(archive_dtypes.begin(), archive_dtypes.end(), t.scalar_type()) != archive_dtypes.end(),
                 "torch.save files of this version");
}

// The TensorDict as nested dicts of tensors, for torch::jit::Pickler. Tensors
// that share a storage keep sharing it (the pickler writes each storage once);
// a tensor viewing another's bytes as a different dtype gets its own copy, as
// a storage has one type in the file.
class ivalue_builder {
 public:
  c10::IValue build(const AnyTensorDict& td) {
    any_key_path path;
    return dict_of(td, path);
  }

 private:
  c10::IValue dict_of(const AnyTensorDict& td, any_key_path& path) {
    c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
    for (const std::string& name : td.level_keys()) {
      path.push_back(name);
      if (td.is_leaf({name}))
        dict.insert(name, tensor_of(td.get({name}), path));
      else
        dict.insert(name, dict_of(td.get_tensordict({name}), path));
      path.pop_back();
    }
    return dict;
  }

  at::Tensor tensor_of(const at::Tensor& t, const any_key_path& path) {
    check_savable(t, path);
    at::Tensor view = t.detach();
    if (!view.device().is_cpu()) view = view.cpu();
    view.set_requires_grad(t.requires_grad());  // torch.load restores the flag (an nn.Parameter's)
    const void* storage = view.storage().unsafeGetStorageImpl();
    const auto [it, first] = storage_types_.emplace(storage, view.scalar_type());
    if (!first && it->second != view.scalar_type()) {
      at::Tensor copy = view.contiguous().clone();
      copy.set_requires_grad(t.requires_grad());
      return copy;
    }
    return view;
  }

  std::unordered_map<const void*, at::ScalarType> storage_types_;
};

// torch.save's zip: archive/data.pkl, archive/data/<key> per storage, version records.
inline void write_torch_save(const AnyTensorDict& td, std::ostream& out) {
  const c10::IValue root = ivalue_builder().build(td);
  std::string pickle;
  // No type tags on dicts (torch.jit._pickle.restore_type_tag): torch.load's weights_only refuses them.
  torch::jit::Pickler pickler([&](const char* bytes, std::size_t n) { pickle.append(bytes, n); }, nullptr, nullptr, nullptr,
                              nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(root);
  pickler.stop();
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, std::size_t n) -> std::size_t {
    out.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
    return out ? n : 0;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  const auto& storages = pickler.tensorData();
  for (std::size_t k = 0; k < storages.size(); ++k) {
    const c10::Storage& s = storages[k].storage();
    writer.writeRecord("data/" + std::to_string(k), s.data(), s.nbytes());
  }
  writer.writeEndOfFile();
}

// A value under the batch sizes a TensorDict's state_dict() recorded: one that
// does not fit them is the file's fault.
template <class V>
void set_as_recorded(AnyTensorDict& out, const any_key_path& path, const V& value) {
  try {
    out.set(path, value);
  } catch (const shape_error& e) {
    throw file_error(std::string(e.what()) + " (the batch sizes are the ones the file's state_dict() recorded)");
  }
}

inline void fill(AnyTensorDict& out, const archive::dict_record& dict, any_key_path& path,
                 std::unordered_map<std::string, at::Tensor>& storages, const std::shared_ptr<const mapped_file>& file,
                 const load_options& options, load_memory memory) {
  for (const auto& e : dict.entries) {
    path.push_back(e.key);
    if (e.tensor) {
      const auto& t = *e.tensor;
      const at::ScalarType dtype = archive_dtypes[t.storage_type];
      at::Tensor& base = storages[t.storage_key];
      if (!base.defined())
        base = tensor_over(file, t.storage_bytes.substr(0, t.storage_bytes.size() / archive::storage_types[t.storage_type].element_size *
                                                               archive::storage_types[t.storage_type].element_size),
                           dtype, memory);
      else if (base.scalar_type() != dtype)
        throw file_error(to_string(path) + ": its storage \"" + t.storage_key + "\" is read as two dtypes");
      at::Tensor tensor = base.as_strided(t.sizes, t.strides, t.offset);
      if (t.requires_grad) tensor.requires_grad_();
      set_as_recorded(out, path, tensor);
    } else if (e.dict) {
      if (e.dict->batch_size)  // a TensorDict's state_dict()
        set_as_recorded(out, path, AnyTensorDict(*e.dict->batch_size));
      else if (e.dict->entries.empty())
        out.set(path, AnyTensorDict(out.batch_size()));
      fill(out, *e.dict, path, storages, file, options, memory);
    } else if (!options.skip_non_tensors) {
      throw file_error(to_string(path) + " holds a Python " + e.other +
                       ", not a tensor; load with load_options{.skip_non_tensors = true} to leave such values out");
    }
    path.pop_back();
  }
}

// `file`: the mapping that `bytes` views, for mapped loads; null where the bytes are in memory.
inline AnyTensorDict load_parsed(std::string_view bytes, const std::shared_ptr<const mapped_file>& file, const load_options& options) {
  const load_memory memory = file ? load_memory::mapped : load_memory::owned;
  const bool mapped = memory == load_memory::mapped;
  const auto root = archive::parse(bytes, mapped && !options.verify_checksums ? archive::checksums::metadata : archive::checksums::all);
  AnyTensorDict out(root->batch_size ? c10::IntArrayRef(*root->batch_size) : c10::IntArrayRef{});
  any_key_path path;
  std::unordered_map<std::string, at::Tensor> storages;
  fill(out, *root, path, storages, file, options, memory);
  return with_loaded_batch(std::move(out), options);
}

}  // namespace detail

namespace detail {
inline AnyTensorDict laid_out(const AnyTensorDict& td, const save_options& options) {
  return options.layout == file_layout::flat ? td.flatten_keys(options.separator) : td;
}
}  // namespace detail

TENSORDICT_DECL std::string save_to_string(const AnyTensorDict& td, const save_options& options) {
  std::ostringstream out;
  detail::write_torch_save(detail::laid_out(td, options), out);
  return std::move(out).str();
}

TENSORDICT_DECL void save(const AnyTensorDict& td, const std::string& path, const save_options& options) {
  const AnyTensorDict laid_out = detail::laid_out(td, options);
  detail::naming_the_file("tensordict::save", path, [&] {
    detail::check_no_non_tensors(td, "torch.save files");
    detail::write_file_atomically(path, "tensordict::save", [&](std::ostream& out) { detail::write_torch_save(laid_out, out); });
  });
}

TENSORDICT_DECL AnyTensorDict load_from_string(std::string_view bytes, const load_options& options) {
  return detail::load_parsed(bytes, nullptr, options);
}

TENSORDICT_DECL AnyTensorDict load(const std::string& path, const load_options& options) {
  detail::refuse_shared(options, "tensordict::load", path);
  if (options.memory.value_or(load_memory::owned) == load_memory::owned) {
    const std::string bytes = detail::read_file(path, "tensordict::load");
    return detail::naming_the_file("tensordict::load", path, [&] { return detail::load_parsed(bytes, nullptr, options); });
  }
  const auto file = detail::mapped_file::open(path, "tensordict::load");
  return detail::naming_the_file("tensordict::load", path, [&] { return detail::load_parsed(file->bytes(), file, options); });
}

}  // namespace tensordict
#endif  // TENSORDICT_DEFINITIONS
