// The storages of a replay buffer (data/replay_buffer.hpp), as TorchRL's
// torchrl.data names them: a TensorDict whose first batch dim is the
// buffer's capacity, written and read by rows.
//
//   tensordict::data::LazyTensorStorage memory(100'000);            // RAM, allocated by the first write
//   tensordict::data::LazyMemmapStorage files(1'000'000, "buffer");  // one file per leaf, allocated the same way
//   tensordict::data::TensorStorage given(tensordict::zeros_like(transition, {4096}));
//
// The lazy ones take their keys, leaf shapes and dtypes from the first write
// (its rows' batch dims after the first too): LazyTensorStorage allocates
// them uninitialized in memory, LazyMemmapStorage creates full-size files of
// zeros without writing them (memmap_like), so the buffer is never held in
// RAM whole. Later writes must have the same keys, shapes and dtypes (the
// indexed write checks them before the first byte). The files are Python
// tensordict's memmap folder, which TorchRL's LazyMemmapStorage maps too.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>

#include <nlohmann/json.hpp>

#include "../any_tensordict.hpp"
#include "../errors.hpp"
#include "../files/memmap.hpp"
#include "../preallocate.hpp"

namespace tensordict::data {

// The rows of a TensorDict of batch size [max_size, ...]: TorchRL's TensorStorage.
class TensorStorage {
 public:
  // A storage over a TensorDict allocated by the caller (zeros<S>, memmap_like, ...).
  explicit TensorStorage(AnyTensorDict storage) : max_size_(first_dim(storage)), storage_(std::move(storage)) {}
  virtual ~TensorStorage() = default;
  TensorStorage(TensorStorage&&) = default;  // a buffer takes its storage by value
  TensorStorage& operator=(TensorStorage&&) = delete;

  std::int64_t max_size() const { return max_size_; }
  // The rows written so far (TorchRL's len(storage)): one past the highest row written, at most max_size.
  std::int64_t size() const { return size_; }
  bool initialized() const { return storage_.has_value(); }
  // The whole TensorDict, of batch size [max_size, ...]; throws before the first write of a lazy storage.
  const AnyTensorDict& tensordict() const {
    if (!storage_) throw value_error("TensorStorage.tensordict(): the lazy storage holds nothing before its first write");
    return *storage_;
  }

  // Writes `data`'s rows (its first batch dim) at the rows `index` (int64, one per row).
  void set(const at::Tensor& index, const AnyTensorDict& data) {
    check_rows(index, data, "set");
    if (index.numel() == 0) return;
    if (!storage_) storage_ = allocate(data);
    storage_->index_put_({index}, data);
    grow_to(index.max().item<std::int64_t>() + 1);
  }
  // Writes `data`'s rows at the consecutive rows start, start + 1, ... (wrapping at
  // max_size): at most two contiguous copies, as a round-robin writer's.
  void set_range(std::int64_t start, const AnyTensorDict& data) {
    const std::int64_t n = data.batch_size().empty() ? 0 : data.batch_size()[0];
    if (n > max_size_)
      throw shape_error("TensorStorage.set: " + std::to_string(n) + " rows do not fit a storage of max_size " +
                        std::to_string(max_size_));
    if (start < 0 || start >= max_size_)
      throw index_error("TensorStorage.set: row " + std::to_string(start) + " is outside [0, " + std::to_string(max_size_) + ")");
    if (n == 0) return;
    if (!storage_) storage_ = allocate(data);
    using at::indexing::Slice;
    const std::int64_t first = std::min(n, max_size_ - start);
    if (first == n) {
      storage_->index_put_({Slice(start, start + n)}, data);
    } else {
      // The parts differ in their row counts alone: a write the first part passes, the second does.
      const AnyTensorDict head = data.index({Slice(0, first)}), tail = data.index({Slice(first, n)});
      storage_->index_put_({Slice(start, max_size_)}, head);
      storage_->index_put_({Slice(0, n - first)}, tail);
    }
    grow_to(first == n ? start + n : max_size_);
  }
  // The rows `index` (int64), gathered into memory of their own.
  AnyTensorDict get(const at::Tensor& index) const {
    const AnyTensorDict& all = tensordict();
    const bool plain = index.scalar_type() == at::kLong && index.dim() == 1 && index.is_cpu() && index.is_contiguous();
    if (index.numel() > 0) {
      std::int64_t low = 0, high = 0;
      if (plain) {
        const std::int64_t* rows = index.data_ptr<std::int64_t>();
        low = *std::min_element(rows, rows + index.numel());
        high = *std::max_element(rows, rows + index.numel());
      } else {
        low = index.min().item<std::int64_t>();
        high = index.max().item<std::int64_t>();
      }
      if (low < 0 || high >= size_)
        throw index_error("TensorStorage.get: row " + std::to_string(low < 0 ? low : high) + " is outside the " +
                          std::to_string(size_) + " rows written");
    }
    if (!plain || !all.non_tensor_keys().empty()) return all.index({index});
    // A sample's rows copied one by one: at::index's TensorIterator costs ~10x the bytes' memcpy at 256 rows.
    std::vector<std::int64_t> batch(all.batch_size().begin(), all.batch_size().end());
    batch.front() = index.numel();
    return all.apply([&](const at::Tensor& leaf) { return gather_rows(leaf, index); }, batch);
  }

  // TorchRL's storage.dumps(dir): the TensorDict as a memmap folder and
  // storage_metadata.json {"metadata": {}, "is_pytree": false, "len": size}.
  virtual void dumps(const std::filesystem::path& dir) const {
    save_memmap(tensordict(), dir.string());
    write_metadata(dir);
  }
  // TorchRL's storage.loads(dir): the rows and size dumps wrote (a lazy storage allocates them first).
  virtual void loads(const std::filesystem::path& dir) {
    const std::int64_t size = read_length(dir);
    AnyTensorDict saved = load_memmap(dir.string());
    if (first_dim(saved) != max_size_)
      throw file_error("TensorStorage.loads(\"" + dir.string() + "\"): the saved storage has " + std::to_string(first_dim(saved)) +
                       " rows, this one max_size " + std::to_string(max_size_));
    if (!storage_) storage_ = allocate(saved);
    storage_->index_put_({at::indexing::Slice()}, saved);
    size_ = size;
  }

 protected:
  explicit TensorStorage(std::int64_t max_size) : max_size_(max_size) {
    if (max_size <= 0) throw value_error("TensorStorage: max_size must be positive, got " + std::to_string(max_size));
  }
  // The storage for rows like `data`'s (lazy storages).
  virtual AnyTensorDict allocate(const AnyTensorDict& data) const {
    (void)data;
    throw value_error("TensorStorage: no storage to write into");
  }
  // Batch size [max_size, data's batch dims after the first].
  std::vector<std::int64_t> storage_batch(const AnyTensorDict& data) const {
    std::vector<std::int64_t> batch(data.batch_size().begin(), data.batch_size().end());
    batch.front() = max_size_;
    return batch;
  }
  void write_metadata(const std::filesystem::path& dir) const {
    const nlohmann::ordered_json meta = {{"metadata", nlohmann::ordered_json::object()}, {"is_pytree", false}, {"len", size_}};
    const std::string text = meta.dump();
    tensordict::detail::write_file_atomically((dir / "storage_metadata.json").string(), "TensorStorage.dumps",
                                              [&](std::ostream& out) { out << text; });
  }
  std::int64_t read_length(const std::filesystem::path& dir) const {
    const std::string where = (dir / "storage_metadata.json").string();
    const std::string text = tensordict::detail::read_file(where, "TensorStorage.loads");
    const auto meta = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (meta.is_discarded() || !meta.is_object() || !meta.contains("len") || !meta["len"].is_number_integer())
      throw file_error(where + ": not TorchRL's storage metadata (an integer \"len\")");
    const auto len = meta["len"].get<std::int64_t>();
    if (len < 0 || len > max_size_)
      throw file_error(where + ": \"len\" " + std::to_string(len) + " is outside [0, " + std::to_string(max_size_) + "]");
    if (meta.value("is_pytree", false)) throw file_error(where + ": a pytree storage, which this library does not read");
    return len;
  }
  std::optional<AnyTensorDict>& storage() { return storage_; }

 private:
  static std::int64_t first_dim(const AnyTensorDict& td) {
    if (td.batch_size().empty())
      throw shape_error("TensorStorage: the storage needs a batch dim (its rows), got batch_size=" + format_sizes(td.batch_size()));
    return td.batch_size()[0];
  }
  void check_rows(const at::Tensor& index, const AnyTensorDict& data, const char* op) const {
    if (index.scalar_type() != at::kLong || index.dim() != 1)
      throw dtype_error(std::string("TensorStorage.") + op + ": the index must be a 1-d int64 tensor, got " +
                        std::string(c10::toString(index.scalar_type())) + format_sizes(index.sizes()));
    if (data.batch_size().empty() || data.batch_size()[0] != index.numel())
      throw shape_error(std::string("TensorStorage.") + op + ": " + std::to_string(index.numel()) +
                        " rows to write, and data of batch_size=" + format_sizes(data.batch_size()));
    if (index.numel() > 0) {
      const auto low = index.min().item<std::int64_t>(), high = index.max().item<std::int64_t>();
      if (low < 0 || high >= max_size_)
        throw index_error(std::string("TensorStorage.") + op + ": row " + std::to_string(low < 0 ? low : high) +
                          " is outside [0, " + std::to_string(max_size_) + ")");
    }
  }
  void grow_to(std::int64_t rows) { size_ = std::max(size_, std::min(rows, max_size_)); }
  // leaf[index] (index: in-bounds CPU int64), a memcpy per row where the leaf is a plain CPU array.
  static at::Tensor gather_rows(const at::Tensor& leaf, const at::Tensor& index) {
    if (!leaf.is_cpu() || leaf.layout() != at::kStrided || !leaf.is_contiguous() || leaf.requires_grad() || leaf.is_neg() ||
        leaf.is_conj())
      return leaf.index_select(0, index);
    std::vector<std::int64_t> shape(leaf.sizes().begin(), leaf.sizes().end());
    shape.front() = index.numel();
    at::Tensor out = at::empty(shape, leaf.options());
    if (index.numel() == 0) return out;
    const std::size_t row = static_cast<std::size_t>(leaf.numel() / leaf.size(0)) * leaf.element_size();
    const char* from = static_cast<const char*>(leaf.data_ptr());
    char* to = static_cast<char*>(out.data_ptr());
    const std::int64_t* rows = index.data_ptr<std::int64_t>();
    for (std::int64_t r = 0; r < index.numel(); ++r) std::memcpy(to + r * row, from + rows[r] * row, row);
    return out;
  }

  std::int64_t max_size_;
  std::int64_t size_ = 0;
  std::optional<AnyTensorDict> storage_;
};

// TorchRL's LazyTensorStorage: allocated in memory (uninitialized) by the first write.
class LazyTensorStorage : public TensorStorage {
 public:
  explicit LazyTensorStorage(std::int64_t max_size) : TensorStorage(max_size) {}

 protected:
  AnyTensorDict allocate(const AnyTensorDict& data) const override { return empty_like(data, storage_batch(data)); }
};

// TorchRL's LazyMemmapStorage: by the first write, a memmap folder at
// `scratch_dir` (which must not exist, or be empty) of full-size zero files,
// written through by every later write. Without a scratch_dir, a new folder
// in the system's temporary directory, removed with the storage.
class LazyMemmapStorage : public TensorStorage {
 public:
  explicit LazyMemmapStorage(std::int64_t max_size, std::string scratch_dir = {})
      : TensorStorage(max_size), scratch_dir_(std::move(scratch_dir)), owned_(scratch_dir_.empty()) {}
  LazyMemmapStorage(LazyMemmapStorage&& other) noexcept
      : TensorStorage(std::move(other)), scratch_dir_(std::move(other.scratch_dir_)), owned_(other.owned_) {
    other.owned_ = false;  // the folder goes with the storage moved to
  }
  ~LazyMemmapStorage() override {
    if (owned_ && !scratch_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir_, ec);
    }
  }
  const std::string& scratch_dir() const { return scratch_dir_; }

  // Onto its own folder, the files hold every row already: only the metadata is written.
  void dumps(const std::filesystem::path& dir) const override {
    std::error_code ec;
    if (initialized() && std::filesystem::equivalent(dir, scratch_dir_, ec)) return write_metadata(dir);
    TensorStorage::dumps(dir);
  }

 protected:
  AnyTensorDict allocate(const AnyTensorDict& data) const override {
    if (scratch_dir_.empty()) {
      std::random_device random;
      scratch_dir_ = (std::filesystem::temp_directory_path() / ("tensordict-buffer-" + std::to_string(random()) + "-" +
                                                                 std::to_string(random())))
                         .string();
    }
    // Every leaf as its first row expanded to the storage's shape: memmap_like reads shapes and
    // dtypes alone, so nothing of the buffer's size is allocated in memory.
    const std::vector<std::int64_t> batch = storage_batch(data);
    const AnyTensorDict like = data.index({0}).apply(
        [&](const at::Tensor& row) {
          std::vector<std::int64_t> shape{batch.front()};
          shape.insert(shape.end(), row.sizes().begin(), row.sizes().end());
          return row.unsqueeze(0).expand(shape);
        },
        batch);
    return memmap_like(like, scratch_dir_);
  }

 private:
  mutable std::string scratch_dir_;
  bool owned_;
};

}  // namespace tensordict::data
