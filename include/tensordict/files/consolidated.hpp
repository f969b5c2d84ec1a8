// Python tensordict's consolidated files, both ways: what
// `td.consolidate(filename=path)` writes (tensordict 0.5 and later) and
// `TensorDict.from_consolidated(path)` reads: every leaf in one file, then the
// tree's metadata (files/detail/consolidated_format.hpp has the layout).
//
//   auto batch = tensordict::load_consolidated("batch.bin");   // mapped: leaves point into the file
//   tensordict::save_consolidated(td, "out.bin");              // Python: TensorDict.from_consolidated("out.bin")
//
// Loading maps the file by default (load_memory::mapped, as Python maps it;
// files/options.hpp says what that promises) or copies (owned); a nested
// level keeps its own batch size; NonTensorData entries are read when their
// values are None, bool, int, float or str (load_options::skip_non_tensors
// leaves them out). Saving writes the file whole or not at all; a
// NonTensorStack, a leaf whose dtype Python lacks, or a nested key that the
// metadata uses itself ("cls", "leaves", "non_tensors", "cls_metadata",
// "size") is refused before anything is written.
#pragma once

#include "options.hpp"

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <ATen/core/Tensor.h>

#include "../any_tensordict.hpp"
#include "../detail/config.hpp"
#include "../errors.hpp"
#include "../typed_tensordict.hpp"
#include "detail/consolidated_format.hpp"
#include "detail/io.hpp"
#include "detail/tensors.hpp"

namespace tensordict {

namespace detail {

inline void fill_consolidated(AnyTensorDict& out, const consolidated::level& level, std::string_view bytes,
                              const std::shared_ptr<const mapped_file>& file, load_memory memory, const load_options& options) {
  for (const auto& leaf : level.leaves) {
    const at::ScalarType dtype = checked_scalar_type(*leaf.dtype, "the leaf \"" + leaf.name + "\"");
    out.set({leaf.name}, tensor_over(file, bytes.substr(leaf.start, leaf.bytes), dtype, memory).view(leaf.shape));
  }
  if (!options.skip_non_tensors)
    for (const auto& [name, value] : level.non_tensors) out.set_non_tensor({name}, NonTensor(value));
  for (std::size_t k = 0; k < level.children.size(); ++k) {
    out.set({level.child_names[k]}, AnyTensorDict(level.children[k].batch_size));
    AnyTensorDict view = out.get_tensordict({level.child_names[k]});
    fill_consolidated(view, level.children[k], bytes, file, memory, options);
  }
}

// The metadata and the leaves in the order written, checked before a file is touched.
struct consolidated_plan {
  nlohmann::ordered_json metadata;
  std::vector<at::Tensor> leaves;  // contiguous, CPU
  std::uint64_t data_size = 0;
};

inline nlohmann::ordered_json plan_consolidated_level(const AnyTensorDict& td, any_key_path& path, consolidated_plan& plan) {
  using json = nlohmann::ordered_json;
  json level = json::object();
  level["cls"] = "TensorDict";
  level["non_tensors"] = json::object();
  level["leaves"] = json::object();
  json names = json::array();
  for (std::size_t d = 0; d < td.batch_size().size(); ++d) names.push_back(nullptr);
  level["cls_metadata"] = {{"device", td.device() ? json(td.device()->str()) : json(nullptr)},
                           {"names", names},
                           {"batch_size", td.batch_size().vec()},
                           {"is_locked", false}};
  for (const any_key_path& key : td.non_tensor_keys(false)) {
    path.push_back(key.front());
    const NonTensor& v = td.non_tensor(key);
    if (v.is_stack())
      throw file_error(to_string(path) + " holds a NonTensorStack, which this library does not write into consolidated "
                       "files; save_memmap writes it, or leave it out with td.exclude(...)");
    if (const std::string* text = std::get_if<std::string>(&v.value()); text && !valid_utf8(*text))
      throw file_error(to_string(path) + ": a string value is not valid UTF-8, which the metadata needs");
    if (!valid_utf8(key.front())) throw file_error(to_string(path) + ": the key is not valid UTF-8, which the metadata needs");
    level["non_tensors"][key.front()] = json::array({memmap::value_to_json(v.value()), td.batch_size().vec(), nullptr});
    path.pop_back();
  }
  for (const std::string& name : td.level_keys()) {
    path.push_back(name);
    if (!valid_utf8(name)) throw file_error(to_string(path) + ": the key is not valid UTF-8, which the metadata needs");
    if (td.is_leaf({name})) {
      const at::Tensor& t = td.get({name});
      const file_dtype* dtype = file_dtype_of(t.scalar_type());
      check_writable(t, path, dtype != nullptr, "consolidated files");
      const auto n = static_cast<std::uint64_t>(t.numel()) * static_cast<std::uint64_t>(t.element_size());
      const std::uint64_t pad = (8 - n % 8) % 8;
      level["leaves"][name] = json::array({std::string(dtype->torch_name), t.sizes().vec(), plan.data_size, plan.data_size + n + pad, pad});
      plan.data_size += n + pad;
      plan.leaves.push_back(file_contiguous(t));
    } else {
      if (consolidated::reserved_key(name))
        throw file_error(to_string(path) + ": a consolidated file's metadata uses this name for itself (\"cls\", \"leaves\", "
                         "\"non_tensors\", \"cls_metadata\", \"size\"); rename the nested TensorDict");
      level[name] = plan_consolidated_level(td.get_tensordict({name}), path, plan);
    }
    path.pop_back();
  }
  return level;
}

inline void write_consolidated(const consolidated_plan& plan, std::ostream& out) {
  static constexpr char zeros[8] = {};
  for (const at::Tensor& t : plan.leaves) {
    const auto n = static_cast<std::streamsize>(t.nbytes());
    out.write(static_cast<const char*>(t.data_ptr()), n);
    out.write(zeros, (8 - n % 8) % 8);
  }
  // Python's json_dumps (orjson) writes compact JSON, NaN as the bare word.
  const std::string text = memmap::python_json_dump(plan.metadata);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((static_cast<std::uint64_t>(text.size()) >> (8 * i)) & 0xFF);
  out.write(length, 8);
}

}  // namespace detail

// load_options::memory: mapped (the default) or owned; shared is refused.
TENSORDICT_DECL AnyTensorDict load_consolidated(const std::string& path, const load_options& options = {});

TENSORDICT_DECL void save_consolidated(const AnyTensorDict& td, const std::string& path);

// Into a typed TensorDict: every key must be a leaf of S; unset leaves stay unset.
template <schema_type S>
TensorDict<S> load_consolidated(const std::string& path, const load_options& options = {}) {
  return detail::naming_the_file("tensordict::load_consolidated", path,
                                 [&] { return detail::typed_from_file<S>(load_consolidated(path, options), options); });
}

// As load_consolidated<S>, and the keys, shapes and dtypes must be those of `like`.
template <schema_type S>
TensorDict<S> load_consolidated(const std::string& path, const TensorDict<S>& like, const load_options& options = {}) {
  return detail::naming_the_file("tensordict::load_consolidated", path,
                                 [&] { return detail::typed_from_file(load_consolidated(path, options), like, options); });
}

}  // namespace tensordict

#if TENSORDICT_DEFINITIONS
namespace tensordict {

TENSORDICT_DECL AnyTensorDict load_consolidated(const std::string& path, const load_options& options) {
  detail::refuse_shared(options, "tensordict::load_consolidated", path);
  const load_memory memory = options.memory.value_or(load_memory::mapped);
  std::shared_ptr<const detail::mapped_file> file;
  std::string owned;
  if (memory == load_memory::owned) owned = detail::read_file(path, "tensordict::load_consolidated");
  else file = detail::mapped_file::open(path, "tensordict::load_consolidated");
  const std::string_view bytes = file ? file->bytes() : std::string_view(owned);
  return detail::naming_the_file("tensordict::load_consolidated", path, [&] {
    std::uint64_t data_size = 0;
    const auto level = detail::consolidated::parse(bytes, data_size);
    std::optional<at::Device> device;
    if (level.device && *level.device == "cpu") device = at::Device(at::kCPU);
    AnyTensorDict out(level.batch_size, device);
    detail::fill_consolidated(out, level, bytes, file, memory, options);
    return detail::with_loaded_batch(std::move(out), options);
  });
}

TENSORDICT_DECL void save_consolidated(const AnyTensorDict& td, const std::string& path) {
  detail::naming_the_file("tensordict::save_consolidated", path, [&] {
    detail::consolidated_plan plan;
    any_key_path key;
    plan.metadata = detail::plan_consolidated_level(td, key, plan);
    detail::write_file_atomically(path, "tensordict::save_consolidated",
                                  [&](std::ostream& out) { detail::write_consolidated(plan, out); });
  });
}

}  // namespace tensordict
#endif  // TENSORDICT_DEFINITIONS
