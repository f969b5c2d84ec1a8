// Equinox-style short descriptions of tensors: f32[4,3]. The two functions at
// the end are public (tensordict::describe, tensordict::format_sizes).
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "config.hpp"

namespace tensordict::detail {

inline const char* dtype_abbreviation(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf: return "f16";
    case at::kBFloat16: return "bf16";
    case at::kFloat: return "f32";
    case at::kDouble: return "f64";
    case at::kChar: return "i8";
    case at::kShort: return "i16";
    case at::kInt: return "i32";
    case at::kLong: return "i64";
    case at::kByte: return "u8";
    case at::kBool: return "bool";
    case at::kComplexHalf: return "c32";
    case at::kComplexFloat: return "c64";
    case at::kComplexDouble: return "c128";
    default: return c10::toString(dtype);
  }
}

}  // namespace tensordict::detail

namespace tensordict {

// "[4,3]", as batch sizes and shapes print in a TensorDict.
TENSORDICT_DECL std::string format_sizes(c10::IntArrayRef sizes);

// "f32[4,3]"; "undefined" for an undefined tensor.
TENSORDICT_DECL std::string describe(const at::Tensor& t);

#if TENSORDICT_DEFINITIONS
TENSORDICT_DECL std::string format_sizes(c10::IntArrayRef sizes) {
  std::string out = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(sizes[i]);
  }
  return out + "]";
}

TENSORDICT_DECL std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  return detail::dtype_abbreviation(t.scalar_type()) + format_sizes(t.sizes());
}
#endif  // TENSORDICT_DEFINITIONS

}  // namespace tensordict
