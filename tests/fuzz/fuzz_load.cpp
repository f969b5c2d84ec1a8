// libFuzzer target for the file readers (tests/fuzz/run.sh builds and runs
// it): torch.save archives, safetensors headers and memmap meta.json. The
// readers are libtorch-free, so clang compiles them; every input must either
// parse or throw tensordict::file_error, under ASan and UBSan. Each input goes
// through every reader (each refuses the others' files quickly).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <tensordict/files/detail/memmap_format.hpp>
#include <tensordict/files/detail/consolidated_format.hpp>
#include <tensordict/files/detail/safetensors_format.hpp>
#include <tensordict/files/detail/torch_archive.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace archive = tensordict::detail::archive;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (auto checksums : {archive::checksums::all, archive::checksums::none}) {
    try {
      (void)archive::parse(bytes, checksums);
    } catch (const tensordict::file_error&) {
    }
  }
  try {
    (void)archive::unpickle(bytes);  // the pickle machine alone, on raw bytes
  } catch (const tensordict::file_error&) {
  }
  try {
    (void)tensordict::detail::safetensors::parse(bytes);
  } catch (const tensordict::file_error&) {
  }
  try {
    (void)tensordict::detail::memmap::parse_meta(bytes, "meta.json");
  } catch (const tensordict::file_error&) {
  }
  try {  // 0.5+: a lazy stack's or a tensorclass's meta.json
    (void)tensordict::detail::memmap::parse_node(bytes, "meta.json");
  } catch (const tensordict::file_error&) {
  }
  try {  // a consolidated file (its metadata at the end) and a .tdz archive's members
    std::uint64_t data_size = 0;
    (void)tensordict::detail::consolidated::parse(bytes, data_size);
    (void)archive::zip_entries(bytes, ".tdz");
  } catch (const tensordict::file_error&) {
  }
  try {  // a non-tensor entry's meta.json, as NonTensorData and as a NonTensorStack of batch size [3, 2] (the seed's)
    (void)tensordict::detail::memmap::parse_non_tensor(bytes, "meta.json", "NonTensorData", {});
    (void)tensordict::detail::memmap::parse_non_tensor(bytes, "meta.json", "NonTensorStack", {3, 2});
  } catch (const tensordict::file_error&) {
  }
  return 0;
}
