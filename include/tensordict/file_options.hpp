// What the file loaders (files.hpp: torch.save; safetensors.hpp; memmap.hpp)
// share: how loaded tensors hold their memory.
//
// load_memory::mapped (the default) maps the file and points the tensors into
// the mapping, which they keep alive: loading returns before any tensor byte
// is read, and pages are read from the file when first touched. The mapping is
// private: writing a loaded tensor in place copies the pages it touches into
// this process's memory and never changes the file. Tensors whose bytes are not
// aligned to their element size in the file are copied. load_memory::owned
// copies every tensor into memory of its own and lets the file go.
#pragma once

namespace tensordict {

enum class load_memory { mapped, owned };

struct load_options {
  // Values that are not tensors (a checkpoint's "epoch": 3; a memmap
  // directory's non-tensor entries) are left out instead of refused.
  bool skip_non_tensors = false;
  load_memory memory = load_memory::mapped;
  // torch.save files: check the CRC-32 of every tensor record, which reads the
  // whole file. Owned loads always check; mapped ones check the records that
  // describe the tensors (the pickle, the version) unless this is set.
  bool verify_checksums = false;
};

}  // namespace tensordict
