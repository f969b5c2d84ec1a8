// libFuzzer target for the torch.save reader (tests/fuzz/run.sh builds and runs it).
// The reader is libtorch-free, so clang compiles it; every input must either
// parse or throw tensordict::file_error, under ASan and UBSan.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <tensordict/detail/torch_archive.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace archive = tensordict::detail::archive;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (bool checksums : {true, false}) {
    try {
      (void)archive::parse(bytes, checksums);
    } catch (const tensordict::file_error&) {
    }
  }
  try {
    (void)archive::unpickle(bytes);  // the pickle machine alone, on raw bytes
  } catch (const tensordict::file_error&) {
  }
  return 0;
}
