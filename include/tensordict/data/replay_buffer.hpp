// TorchRL's replay buffer (torchrl.data.TensorDictReplayBuffer), composed as
// there of a storage (data/storages.hpp), a sampler (data/samplers.hpp) and a
// round-robin writer (data/writers.hpp):
//
//   namespace data = tensordict::data;
//   data::ReplayBuffer buffer(data::LazyMemmapStorage(1'000'000, "buffer"),
//                             data::PrioritizedSampler(1'000'000, /*alpha=*/0.7, /*beta=*/0.5), {.batch_size = 256});
//   buffer.extend(transitions);                   // batch_size [n]: n rows, wrapping around at max_size
//   tensordict::AnyTensorDict batch = buffer.sample();    // 256 rows, "index" and "priority_weight" beside them
//   buffer.update_tensordict_priority(batch);     // after batch.set("td_error", ...), as TorchRL's loss writes it
//   buffer.dumps("checkpoint/buffer");           // storage/, sampler/, writer/, buffer_metadata.json, as TorchRL
//
// A sample is a TensorDict of the rows drawn (memory of its own), with
// "index" (int64, the rows) and, from a prioritized sampler, the importance
// weights under options.weight_key. extend and add write a typed TensorDict
// too (it converts); the keys "index" and options.weight_key of the data are
// not stored. Every call locks the buffer: a collector thread may extend it
// while the learner samples, as with TorchRL's buffer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include <ATen/core/Tensor.h>

#include "../any_tensordict.hpp"
#include "../errors.hpp"
#include "../files/detail/io.hpp"
#include "samplers.hpp"
#include "storages.hpp"
#include "writers.hpp"

namespace tensordict::data {

struct replay_buffer_options {
  std::int64_t batch_size = 0;              // sample()'s batch size (0: sample(n) must give one)
  std::string priority_key = "td_error";    // update_tensordict_priority reads the priorities there
  std::string weight_key = "priority_weight";  // sample() writes a prioritized sampler's weights there
};

class ReplayBuffer {
 public:
  template <class Storage, class SamplerT = RandomSampler>
    requires std::derived_from<Storage, TensorStorage> && std::derived_from<SamplerT, Sampler>
  explicit ReplayBuffer(Storage storage, SamplerT sampler = SamplerT(), replay_buffer_options options = {})
      : storage_(std::make_unique<Storage>(std::move(storage))),
        sampler_(std::make_unique<SamplerT>(std::move(sampler))),
        options_(std::move(options)) {
    if constexpr (std::is_same_v<SamplerT, PrioritizedSampler>) {
      const auto& prioritized = static_cast<const PrioritizedSampler&>(*sampler_);
      if (prioritized.max_capacity() < storage_->max_size())
        throw value_error("ReplayBuffer: the PrioritizedSampler's max_capacity " + std::to_string(prioritized.max_capacity()) +
                          " is smaller than the storage's max_size " + std::to_string(storage_->max_size()));
    }
    if (options_.batch_size < 0) throw value_error("ReplayBuffer: batch_size must be >= 0, got " + std::to_string(options_.batch_size));
  }

  // The rows written so far (TorchRL's len(buffer)), at most max_size.
  std::int64_t size() const {
    std::lock_guard lock(mutex_);
    return storage_->size();
  }
  std::int64_t max_size() const { return storage_->max_size(); }
  std::int64_t write_count() const {
    std::lock_guard lock(mutex_);
    return writer_.write_count();
  }
  const replay_buffer_options& options() const { return options_; }

  // `data`'s rows (its first batch dim) after the last ones written; the rows they went to.
  at::Tensor extend(const AnyTensorDict& data) {
    const AnyTensorDict rows = without_buffer_keys(data);
    std::lock_guard lock(mutex_);
    at::Tensor index = writer_.extend(*storage_, rows);
    sampler_->extend(index);
    return index;
  }
  // One row (a TensorDict of the storage's row batch size); the row it went to.
  std::int64_t add(const AnyTensorDict& row) { return extend(row.unsqueeze(0)).item<std::int64_t>(); }

  // `batch_size` rows (options.batch_size by default) drawn by the sampler.
  AnyTensorDict sample(std::optional<std::int64_t> batch_size = std::nullopt) {
    const std::int64_t n = batch_size.value_or(options_.batch_size);
    if (n <= 0)
      throw value_error("ReplayBuffer.sample: no batch size; give one (sample(256)) or replay_buffer_options{.batch_size = 256}");
    std::lock_guard lock(mutex_);
    const sampled_rows rows = sampler_->draw(*storage_, n);
    AnyTensorDict out = storage_->get(rows.index);
    out.set({"index"}, rows.index);
    if (rows.weight.defined()) out.set({options_.weight_key}, rows.weight);
    for (const auto& [key, value] : rows.info) out.set(key, value);
    return out;
  }
  // The same rows as the schema S: its leaves must be in the buffer (or be "index" and
  // the weights), keys S lacks are left out.
  template <class S>
  TensorDict<S> sample(std::optional<std::int64_t> batch_size = std::nullopt) {
    return sample(batch_size).template to_typed<S>({.ignore_extra = true});
  }
  // SamplerWithoutReplacement without drop_last: the epoch's last batch was drawn.
  bool ran_out() const {
    std::lock_guard lock(mutex_);
    return sampler_->ran_out();
  }

  // New raw priorities for the rows `index` (a prioritized sampler's).
  void update_priority(const at::Tensor& index, const at::Tensor& priority) {
    std::lock_guard lock(mutex_);
    sampler_->update_priority(index, priority);
  }
  // TorchRL's update_tensordict_priority: the priorities at options.priority_key of a
  // sample (the rows in its "index"), reduced to one per row by their max.
  void update_tensordict_priority(const AnyTensorDict& sampled) {
    for (const std::string& key : {std::string("index"), options_.priority_key})
      if (!sampled.contains({key}) || !sampled.is_leaf({key}))
        throw key_error("ReplayBuffer.update_tensordict_priority: the TensorDict has no tensor \"" + key + "\" (a sample holds \"index\"; "
                        "write the priorities at \"" + options_.priority_key + "\" first)");
    const at::Tensor index = sampled.get({"index"});
    at::Tensor priority = sampled.get({options_.priority_key}).detach();
    if (priority.dim() > 1) priority = priority.reshape({priority.size(0), -1}).amax(1);
    update_priority(index, priority);
  }

  TensorStorage& storage() { return *storage_; }
  const TensorStorage& storage() const { return *storage_; }
  Sampler& sampler() { return *sampler_; }
  const RoundRobinWriter& writer() const { return writer_; }

  // TorchRL's buffer.dumps(dir): storage/ (a memmap folder and storage_metadata.json),
  // sampler/, writer/metadata.json and buffer_metadata.json {"batch_size"}.
  void dumps(const std::string& dir) const {
    const std::filesystem::path root(dir);
    std::lock_guard lock(mutex_);
    std::filesystem::create_directories(root);
    storage_->dumps(root / "storage");
    sampler_->dumps(root / "sampler");
    writer_.dumps(root / "writer");
    nlohmann::ordered_json meta = {{"batch_size", nullptr}};
    if (options_.batch_size > 0) meta["batch_size"] = options_.batch_size;
    const std::string text = meta.dump();
    tensordict::detail::write_file_atomically((root / "buffer_metadata.json").string(), "ReplayBuffer.dumps",
                                              [&](std::ostream& out) { out << text; });
  }
  // The state dumps wrote, into a buffer made with the same kinds of storage and sampler.
  void loads(const std::string& dir) {
    const std::filesystem::path root(dir);
    std::lock_guard lock(mutex_);
    storage_->loads(root / "storage");
    sampler_->loads(root / "sampler");
    writer_.loads(root / "writer", storage_->max_size());
    const std::string where = (root / "buffer_metadata.json").string();
    const auto meta = nlohmann::json::parse(tensordict::detail::read_file(where, "ReplayBuffer.loads"), nullptr, false);
    if (meta.is_discarded() || !meta.is_object()) throw file_error(where + " is not a JSON object");
    if (meta.contains("batch_size") && meta["batch_size"].is_number_integer()) options_.batch_size = meta["batch_size"].get<std::int64_t>();
  }

 private:
  AnyTensorDict without_buffer_keys(const AnyTensorDict& data) const {
    std::vector<any_key_path> own;
    for (const std::string& key : {std::string("index"), options_.weight_key})
      if (data.contains({key})) own.push_back({key});
    return own.empty() ? data : data.exclude(own);
  }

  std::unique_ptr<TensorStorage> storage_;
  std::unique_ptr<Sampler> sampler_;
  RoundRobinWriter writer_;
  replay_buffer_options options_;
  mutable std::mutex mutex_;
};

}  // namespace tensordict::data
