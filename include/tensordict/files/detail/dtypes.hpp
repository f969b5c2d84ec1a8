// The element types the file formats name, with their sizes: torch's Python
// names (memmap directories' meta.json) and safetensors' names. Libtorch-free,
// for the format parsers; files/detail/tensors.hpp maps them to at::ScalarType
// (where the libtorch in use has the type).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tensordict::detail {

struct file_dtype {
  std::string_view torch_name;        // "torch.float32"
  std::string_view safetensors_name;  // "F32"; empty: safetensors has no such type
  std::size_t element_size;
};

inline constexpr std::array<file_dtype, 18> file_dtypes{{
    {"torch.float32", "F32", 4},
    {"torch.float64", "F64", 8},
    {"torch.float16", "F16", 2},
    {"torch.bfloat16", "BF16", 2},
    {"torch.int64", "I64", 8},
    {"torch.int32", "I32", 4},
    {"torch.int16", "I16", 2},
    {"torch.int8", "I8", 1},
    {"torch.uint8", "U8", 1},
    {"torch.bool", "BOOL", 1},
    {"torch.complex64", "C64", 8},
    {"torch.complex128", "", 16},
    {"torch.float8_e4m3fn", "F8_E4M3", 1},
    {"torch.float8_e5m2", "F8_E5M2", 1},
    {"torch.uint16", "U16", 2},
    {"torch.uint32", "U32", 4},
    {"torch.uint64", "U64", 8},
    {"torch.complex32", "", 4},
}};

inline const file_dtype* find_torch_dtype(std::string_view torch_name) {
  for (const auto& d : file_dtypes)
    if (d.torch_name == torch_name) return &d;
  return nullptr;
}

inline const file_dtype* find_safetensors_dtype(std::string_view name) {
  for (const auto& d : file_dtypes)
    if (!d.safetensors_name.empty() && d.safetensors_name == name) return &d;
  return nullptr;
}

// numel * element_size, or nullopt on overflow or a negative size.
template <class Shape>
std::optional<std::uint64_t> byte_size(const Shape& shape, std::size_t element_size) {
  std::uint64_t n = element_size;
  for (auto s : shape) {
    if (s < 0) return std::nullopt;
    const auto d = static_cast<std::uint64_t>(s);
    if (d != 0 && n > UINT64_MAX / d) return std::nullopt;
    n *= d;
  }
  return n;
}

}  // namespace tensordict::detail
