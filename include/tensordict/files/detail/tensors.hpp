// Tensors over a file's bytes, for every format the loaders read: the dtype
// names mapped to this libtorch's types, and storages that point into a
// mapping (which they keep alive) or copy out of it.
#pragma once

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <torch/version.h>

#include "../../any_tensordict.hpp"
#include "../../detail/config.hpp"
#include "../../errors.hpp"
#include "../options.hpp"
#include "dtypes.hpp"
#include "io.hpp"

// Float8 types came with libtorch 2.1, unsigned 16-64 bit ones with 2.3.
#define TENSORDICT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace tensordict::detail {

struct dtype_pair {
  std::string_view torch_name;
  at::ScalarType type;
};

inline constexpr dtype_pair known_dtypes[] = {
    {"torch.float32", at::kFloat},        {"torch.float64", at::kDouble},      {"torch.float16", at::kHalf},
    {"torch.bfloat16", at::kBFloat16},    {"torch.int64", at::kLong},          {"torch.int32", at::kInt},
    {"torch.int16", at::kShort},          {"torch.int8", at::kChar},           {"torch.uint8", at::kByte},
    {"torch.bool", at::kBool},            {"torch.complex64", at::kComplexFloat}, {"torch.complex128", at::kComplexDouble},
    {"torch.complex32", at::kComplexHalf},
#if TENSORDICT_TORCH_AT_LEAST(2, 1)
    {"torch.float8_e4m3fn", at::ScalarType::Float8_e4m3fn}, {"torch.float8_e5m2", at::ScalarType::Float8_e5m2},
#endif
#if TENSORDICT_TORCH_AT_LEAST(2, 3)
    {"torch.uint16", at::ScalarType::UInt16}, {"torch.uint32", at::ScalarType::UInt32}, {"torch.uint64", at::ScalarType::UInt64},
#endif
};

// nullopt: this libtorch has no such type.
inline std::optional<at::ScalarType> scalar_type_of(const file_dtype& d) {
  for (const auto& k : known_dtypes)
    if (k.torch_name == d.torch_name) return k.type;
  return std::nullopt;
}

inline const file_dtype* file_dtype_of(at::ScalarType type) {
  for (const auto& k : known_dtypes)
    if (k.type == type) return find_torch_dtype(k.torch_name);
  return nullptr;
}

inline at::ScalarType checked_scalar_type(const file_dtype& d, const std::string& where) {
  if (auto t = scalar_type_of(d)) return *t;
  throw file_error(where + " has dtype " + std::string(d.torch_name) + ", which this libtorch (" + TORCH_VERSION +
                   ") does not have");
}

// load_memory::shared writes through to memmap files only: a tensor written
// into a torch.save or safetensors file would not change what its header says.
inline void refuse_shared(const load_options& options, const char* verb, const std::string& path) {
  if (options.memory == load_memory::shared)
    throw value_error(naming(verb, path) + "load_memory::shared maps memmap directories only (tensordict::load_memmap); "
                      "load with load_memory::mapped or owned, or save_memmap the TensorDict and load that shared");
}

// A 1-D tensor of the bytes' elements: pointing into the mapping (kept alive
// by the tensor) when mapped and aligned, else copied.
inline at::Tensor tensor_over(const std::shared_ptr<const mapped_file>& file, std::string_view bytes, at::ScalarType dtype,
                              load_memory memory) {
  const auto element = static_cast<std::size_t>(c10::elementSize(dtype));
  const auto numel = static_cast<std::int64_t>(bytes.size() / element);
  const auto options = at::TensorOptions().dtype(dtype);
  const bool aligned = reinterpret_cast<std::uintptr_t>(bytes.data()) % element == 0;
  if (memory != load_memory::owned && file && numel > 0 && aligned) {
    char* data = file->data() + (bytes.data() - file->bytes().data());
    return at::from_blob(data, {numel}, [keep = file](void*) {}, options);
  }
  at::Tensor out = at::empty({numel}, options);
  if (numel > 0) std::memcpy(out.data_ptr(), bytes.data(), static_cast<std::size_t>(numel) * element);
  return out;
}

// A leaf that a file can hold: a dtype the format has (`format_has_dtype`;
// `files` names the format in the error) and a dense tensor.
inline void check_writable(const at::Tensor& t, const any_key_path& path, bool format_has_dtype, const char* files) {
  if (!format_has_dtype)
    throw file_error(to_string(path) + " has dtype " + std::string(c10::toString(t.scalar_type())) + ", which " + files +
                     " cannot hold");
  if (t.is_sparse() || t.is_quantized() || !t.has_storage()) throw file_error(to_string(path) + " is not a dense tensor");
}

// torch.save and safetensors files written here hold tensors only: a
// non-tensor entry is refused rather than left out.
inline void check_no_non_tensors(const AnyTensorDict& td, const char* files) {
  const std::vector<any_key_path> keys = td.non_tensor_keys();
  if (keys.empty()) return;
  throw file_error(to_string(keys.front()) + " holds non-tensor data (" + td.non_tensor(keys.front()).repr() + "), which " + files +
                   " written here cannot hold; save_memmap keeps it, or leave it out with td.exclude(td.non_tensor_keys())");
}

// The bytes of a tensor as a file holds them: contiguous, on the CPU.
inline at::Tensor file_contiguous(const at::Tensor& t) { return t.detach().to(at::kCPU).contiguous(); }

// A loaded TensorDict with the batch size load_options::batch_dims asks for.
inline AnyTensorDict with_loaded_batch(AnyTensorDict td, const load_options& options) {
  if (options.batch_dims) td.auto_batch_size_(*options.batch_dims);
  return td;
}

// A state_dict() names leaves "0.weight"; a nested schema wants them as a tree.
template <schema_type S>
AnyTensorDict shaped_for(const AnyTensorDict& any) {
  if constexpr (S::depth > 1)
    return unflatten_if_flat(any);
  else
    return any;
}

// What the typed loaders return: every key a leaf of S (strict; else other keys left out), unset leaves unset...
template <schema_type S>
TensorDict<S> typed_from_file(const AnyTensorDict& any, const load_options& options) {
  return shaped_for<S>(any).template to_typed<S>({.allow_missing = true, .ignore_extra = !options.strict});
}

// ...or exactly the keys, shapes and dtypes of `like`.
template <schema_type S>
TensorDict<S> typed_from_file(const AnyTensorDict& any, const TensorDict<S>& like, const load_options& options) {
  return shaped_for<S>(any).to_typed(like, {.ignore_extra = !options.strict});
}

// Called in a handler of a tensordict error: throws it again, a file, key, shape
// or dtype error with `verb("path"): ` in front where it lacks it (keeping its type).
[[noreturn]] TENSORDICT_DECL void rethrow_naming_the_file(const char* verb, const std::string& path);

// Runs f; a tensordict error without `verb("path")` in front gets it, and
// keeps its type (a typed load's shape_error names the file it read).
template <class F>
decltype(auto) naming_the_file(const char* verb, const std::string& path, F&& f) {
  try {
    return f();
  } catch (const error&) {
    rethrow_naming_the_file(verb, path);
  }
}

#if TENSORDICT_DEFINITIONS
TENSORDICT_DECL void rethrow_naming_the_file(const char* verb, const std::string& path) {
  const std::string prefix = std::string(verb) + "(\"" + path + "\")";
  auto named = [&](const error& e) { return prefix + ": " + e.what(); };
  auto has_it = [&](const error& e) { return std::string_view(e.what()).substr(0, prefix.size()) == prefix; };
  try {
    throw;
  } catch (const file_error& e) {
    if (has_it(e)) throw;
    throw file_error(named(e));
  } catch (const key_error& e) {
    if (has_it(e)) throw;
    throw key_error(named(e));
  } catch (const shape_error& e) {
    if (has_it(e)) throw;
    throw shape_error(named(e));
  } catch (const dtype_error& e) {
    if (has_it(e)) throw;
    throw dtype_error(named(e));
  }
}
#endif  // TENSORDICT_DEFINITIONS

}  // namespace tensordict::detail
