// What the file loaders (files/torch_save.hpp: torch.save; files/safetensors.hpp; files/memmap.hpp)
// share: how loaded tensors hold their memory; what the savers share: the layout they write.
//
// load_memory::owned copies every tensor into memory of its own: the file is
// read once, during the call, without a mapping, and nothing another process
// later does to it (rewriting it in place as Python's torch.save does,
// truncating it) reaches the loaded tensors. It is the default of load() and
// load_safetensors(), as torch.load copies unless given mmap=True.
//
// load_memory::mapped maps the file and points the tensors into the mapping,
// which they keep alive: loading returns before any tensor byte is read, and
// pages are read from the file when first touched. The mapping is private:
// writing a loaded tensor in place copies the pages it touches into this
// process's memory and never changes the file. But the tensors are only as
// stable as the file: a change of the file by another process shows through
// pages this process has not written, and a file truncated under the mapping
// ends the process with SIGBUS when a page past its new end is touched (as
// Python's torch.load(mmap=True) and numpy.memmap). Tensors whose bytes are
// not aligned to their element size in the file are copied. It is the default
// of load_memmap(): a memmap directory is file-backed by design, as Python
// tensordict's.
//
// load_memory::shared (load_memmap and memmap_like only) maps each file
// shared, for reading and writing: a write into a loaded tensor (set_, an
// indexed write, an in-place op) is a write into the file, seen at once by
// every process that maps it (another load_memmap with shared or mapped
// memory, Python's load_memmap, numpy.memmap) and by later readers once the
// kernel writes the page back (at the latest when the mapping goes). Writes
// are not atomic: a reader may see a row half written; a collector that
// hands rows to a reader in another process publishes them after writing
// (a counter in a leaf of its own). The directory must be writable; the files
// keep their size, so a TensorDict loaded shared is locked: its leaves can be
// written in place, never replaced (a replaced leaf would no longer reach the file).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace tensordict {

enum class load_memory { mapped, owned, shared };

struct load_options {
  // Values that are not tensors (a checkpoint's "epoch": 3; a memmap
  // directory's non-tensor entries) are left out instead of refused.
  bool skip_non_tensors = false;
  // Unset: the format's default (owned for torch.save and safetensors files,
  // mapped for memmap directories). shared: memmap directories only.
  std::optional<load_memory> memory{};
  // torch.save files: check the CRC-32 of every tensor record, which reads the
  // whole file. Owned loads always check; mapped ones check the records that
  // describe the tensors (the pickle, the version) unless this is set.
  bool verify_checksums = false;
  // Python's auto_batch_size_(batch_dims): the loaded TensorDict's batch size
  // is the longest leading shape its leaves share, at most this many dims (a
  // stacked ensemble's [5] from a safetensors file). Unset: the format's own,
  // [] for torch.save and safetensors files, meta.json's for memmap directories.
  std::optional<std::size_t> batch_dims{};
  // The typed loaders (load<S>, load_memmap<S>, load_safetensors<S>): false
  // loads the schema's keys and leaves the file's other keys out, as Python's
  // load_state_dict(strict=False); a key of the schema that is there must
  // still fit it (batch size; with `like`, shape and dtype, and no key missing).
  bool strict = true;
};

// The folder layout save_memmap and memmap_like write (files/detail/memmap_format.hpp has both).
enum class memmap_layout {
  // tensordict 0.14's, the default: a key that is not a safe file name names its file and
  // folder percent-encoded ("with space" -> with%20space.memmap), a leaf's fields end with
  // "is_nested": false, a NonTensorData or NonTensorStack folder holds only its meta.json.
  // Python 0.13 and later read every key; 0.4 to 0.12 read such a folder where no key
  // needed encoding (letters, digits, ".", "-", "_" and non-ASCII need none).
  v0_14,
  // tensordict 0.4's: each key names its file and folder as it is, NonTensorData folders hold
  // an empty _tensordict/, stacks a folder per element. Every release from 0.4 to 0.14 reads
  // it; a key that some release would not find ("/", a backslash, ":", "", "." or "..", or a
  // raw name that is another key's encoded one) is refused before anything is written.
  v0_4,
};

// torch.save files: nested dicts ({"0": {"weight": tensor}}) or flat dotted keys ({"0.weight": tensor}).
enum class file_layout { nested, flat };

struct save_options {
  file_layout layout = file_layout::nested;  // torch.save files
  std::string separator = ".";               // for file_layout::flat
  memmap_layout memmap = memmap_layout::v0_14;  // memmap directories
};

}  // namespace tensordict
