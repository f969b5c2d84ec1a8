// The samplers of a replay buffer (data/replay_buffer.hpp), as TorchRL names
// them: which rows of the storage a sample reads.
//
//   tensordict::data::RandomSampler uniform;                       // with replacement
//   tensordict::data::SamplerWithoutReplacement epochs;           // each row once per epoch
//   tensordict::data::PrioritizedSampler per(1'000'000, /*alpha=*/0.7, /*beta=*/0.5);
//   tensordict::data::SliceSampler slices({.slice_len = 8});       // sub-trajectories of 8 steps
//
// Draws use libtorch's default generator (torch::manual_seed makes them
// repeatable). PrioritizedSampler is TorchRL's proportional prioritization
// (Schaul et al. 2015): row i is drawn with probability (p_i + eps)^alpha /
// sum_j (p_j + eps)^alpha, new rows get the largest priority given so far (1
// before any), and each draw comes with its importance weight
// ((p_i + eps)^alpha / min_j (p_j + eps)^alpha)^-beta, 1 for the least likely row.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/ones.h>

#include "../errors.hpp"
#include "../files/detail/io.hpp"
#include "../keys.hpp"
#include "detail/segment_tree.hpp"
#include "storages.hpp"

namespace tensordict::data {

// The rows a sample reads, and their importance weights (prioritized samplers; else undefined).
struct sampled_rows {
  at::Tensor index;   // int64 [n]
  at::Tensor weight;  // float32 [n], or undefined
  std::vector<std::pair<any_key_path, at::Tensor>> info = {};  // written into the sample (SliceSampler's truncation marks)
};

class Sampler {
 public:
  virtual ~Sampler() = default;
  // `batch_size` rows of the `size` rows written (fewer at the end of an epoch without drop_last).
  virtual sampled_rows sample(std::int64_t size, std::int64_t batch_size) = 0;
  // As sample, for samplers that read the rows (SliceSampler reads the trajectories' ends).
  virtual sampled_rows draw(const TensorStorage& storage, std::int64_t batch_size) { return sample(storage.size(), batch_size); }
  // The rows `index` were written (new data: a prioritized sampler gives them the default priority).
  virtual void extend(const at::Tensor& index) { (void)index; }
  virtual void update_priority(const at::Tensor& index, const at::Tensor& priority) {
    (void)index;
    (void)priority;
    throw value_error("update_priority: this buffer's sampler is not prioritized (use PrioritizedSampler)");
  }
  // SamplerWithoutReplacement without drop_last: the epoch's last batch was drawn.
  virtual bool ran_out() const { return false; }
  // TorchRL's sampler.dumps(dir) / loads(dir): its state in `dir`.
  virtual void dumps(const std::filesystem::path& dir) const { std::filesystem::create_directories(dir); }
  virtual void loads(const std::filesystem::path& dir) { (void)dir; }

 protected:
  static void check_not_empty(std::int64_t size) {
    if (size <= 0) throw value_error("sample: the buffer holds nothing yet; extend it first");
  }
};

// Uniform draws with replacement (TorchRL's RandomSampler).
class RandomSampler : public Sampler {
 public:
  sampled_rows sample(std::int64_t size, std::int64_t batch_size) override {
    check_not_empty(size);
    return {at::randint(size, {batch_size}, at::kLong), {}};
  }
};

// Each row once per epoch, in a new random order each epoch (TorchRL's
// SamplerWithoutReplacement). drop_last: an epoch ends when fewer rows than a
// batch are left (they are not drawn); else its last batch is smaller and
// ran_out() says so. A change of the buffer's size starts a new epoch.
class SamplerWithoutReplacement : public Sampler {
 public:
  explicit SamplerWithoutReplacement(bool drop_last = false, bool shuffle = true) : drop_last_(drop_last), shuffle_(shuffle) {}

  sampled_rows sample(std::int64_t size, std::int64_t batch_size) override {
    check_not_empty(size);
    if (drop_last_ && batch_size > size)
      throw value_error("sample: a batch of " + std::to_string(batch_size) + " rows without replacement and drop_last, from " +
                        std::to_string(size) + " rows");
    const bool epoch_over = next_ >= order_.numel() || (drop_last_ && order_.numel() - next_ < batch_size);
    if (size != size_ || epoch_over) {
      order_ = shuffle_ ? at::randperm(size, at::kLong) : at::arange(size, at::kLong);
      next_ = 0;
      size_ = size;
    }
    const std::int64_t n = std::min(batch_size, order_.numel() - next_);
    at::Tensor index = order_.slice(0, next_, next_ + n).clone();
    next_ += n;
    ran_out_ = !drop_last_ && next_ >= order_.numel();
    return {index, {}};
  }
  bool ran_out() const override { return ran_out_; }

 private:
  bool drop_last_, shuffle_;
  at::Tensor order_ = at::empty({0}, at::kLong);
  std::int64_t next_ = 0, size_ = -1;
  bool ran_out_ = false;
};

// TorchRL's PrioritizedSampler (the header says how it draws).
class PrioritizedSampler : public Sampler {
 public:
  PrioritizedSampler(std::int64_t max_capacity, double alpha, double beta, double eps = 1e-8)
      : max_capacity_(checked_capacity(max_capacity)),
        alpha_(alpha),
        beta_(beta),
        eps_(eps),
        sums_(detail::make_sum_tree(max_capacity)),
        mins_(detail::make_min_tree(max_capacity)) {
    if (!(alpha >= 0)) throw value_error("PrioritizedSampler: alpha must be >= 0, got " + std::to_string(alpha));
    if (!(beta >= 0)) throw value_error("PrioritizedSampler: beta must be >= 0, got " + std::to_string(beta));
    if (!(eps >= 0)) throw value_error("PrioritizedSampler: eps must be >= 0, got " + std::to_string(eps));
  }

  std::int64_t max_capacity() const { return max_capacity_; }
  double alpha() const { return alpha_; }
  double beta() const { return beta_; }
  void set_beta(double beta) { beta_ = beta; }  // annealed towards 1 as training goes
  double eps() const { return eps_; }
  // The priority new rows get: the largest given so far (raw, before eps and alpha), 1 before any.
  double default_priority() const { return max_priority_.value_or(1.0); }
  // A row's tree value, (p + eps)^alpha; 0 for a row never written.
  double tree_value(std::int64_t row) const { return sums_[row]; }

  sampled_rows sample(std::int64_t size, std::int64_t batch_size) override {
    check_not_empty(size);
    size = std::min(size, max_capacity_);
    const double total = sums_.query(0, size), least = mins_.query(0, size);
    if (!(total > 0) || !(least > 0) || !std::isfinite(least))
      throw value_error("PrioritizedSampler.sample: the priorities of the " + std::to_string(size) +
                        " rows written sum to " + std::to_string(total) + " (least " + std::to_string(least) +
                        "); every row written needs a positive priority");
    const at::Tensor mass = at::rand({batch_size}, at::kDouble);
    at::Tensor index = at::empty({batch_size}, at::kLong);
    at::Tensor weight = at::empty({batch_size}, at::kFloat);
    const double* m = mass.data_ptr<double>();
    auto* rows = index.data_ptr<std::int64_t>();
    auto* w = weight.data_ptr<float>();
    for (std::int64_t k = 0; k < batch_size; ++k) {
      std::int64_t row = std::min(sums_.scan(m[k] * total), size - 1);
      while (row > 0 && sums_[row] == 0) --row;  // rounding may land past the last row written
      rows[k] = row;
      w[k] = static_cast<float>(std::pow(sums_[row] / least, -beta_));
    }
    return {index, weight};
  }

  void extend(const at::Tensor& index) override {
    const double value = transformed(default_priority());
    for (std::int64_t row : rows_of(index, "extend")) set(row, value);
  }

  // Raw priorities (|TD error|, >= 0), one per row or one for all.
  void update_priority(const at::Tensor& index, const at::Tensor& priority) override {
    const std::vector<std::int64_t> rows = rows_of(index, "update_priority");
    const at::Tensor p = priority.detach().to(at::kCPU, at::kDouble).contiguous().reshape({-1});
    if (p.numel() != 1 && p.numel() != static_cast<std::int64_t>(rows.size()))
      throw shape_error("PrioritizedSampler.update_priority: " + std::to_string(p.numel()) + " priorities for " +
                        std::to_string(rows.size()) + " rows (give one per row, or one for all)");
    const double* values = p.data_ptr<double>();
    for (std::int64_t k = 0; k < p.numel(); ++k)
      if (!(values[k] >= 0) || !std::isfinite(values[k]))
        throw value_error("PrioritizedSampler.update_priority: the priority " + std::to_string(values[k]) + " (row " +
                          std::to_string(rows[p.numel() == 1 ? 0 : static_cast<std::size_t>(k)]) +
                          ") is not a finite number >= 0");
    for (std::size_t k = 0; k < rows.size(); ++k) {
      const double raw = values[p.numel() == 1 ? 0 : k];
      max_priority_ = std::max(max_priority_.value_or(raw), raw);
      set(rows[k], transformed(raw));
    }
  }

  // TorchRL 0.x's layout: sumtree.memmap and mintree.memmap (float64, one value per row) and
  // sampler_metadata.json {"_alpha", "_beta", "_eps", "_max_priority": [value, null], "_max_capacity", "_schema_version": 1}.
  void dumps(const std::filesystem::path& dir) const override {
    std::filesystem::create_directories(dir);
    std::vector<double> sums(static_cast<std::size_t>(max_capacity_)), mins(sums.size());
    for (std::int64_t row = 0; row < max_capacity_; ++row) {
      sums[static_cast<std::size_t>(row)] = sums_[row];
      mins[static_cast<std::size_t>(row)] = mins_[row];
    }
    write(dir / "sumtree.memmap", sums);
    write(dir / "mintree.memmap", mins);
    nlohmann::ordered_json meta = {{"_alpha", alpha_},
                                   {"_beta", beta_},
                                   {"_eps", eps_},
                                   {"_max_priority", {nullptr, nullptr}},
                                   {"_max_capacity", static_cast<double>(max_capacity_)},
                                   {"_schema_version", 1}};
    if (max_priority_) meta["_max_priority"][0] = *max_priority_;
    const std::string text = meta.dump();
    tensordict::detail::write_file_atomically((dir / "sampler_metadata.json").string(), "PrioritizedSampler.dumps",
                                              [&](std::ostream& out) { out << text; });
  }
  void loads(const std::filesystem::path& dir) override {
    const std::string where = (dir / "sampler_metadata.json").string();
    const auto meta = nlohmann::json::parse(tensordict::detail::read_file(where, "PrioritizedSampler.loads"), nullptr, false);
    if (meta.is_discarded() || !meta.is_object() || !meta.contains("_max_capacity") || !meta["_max_capacity"].is_number() ||
        !meta.contains("_alpha") || !meta["_alpha"].is_number() || !meta.contains("_beta") || !meta["_beta"].is_number() ||
        !meta.contains("_eps") || !meta["_eps"].is_number())
      throw file_error(where + ": not TorchRL's prioritized sampler metadata");
    if (meta["_max_capacity"].get<double>() != static_cast<double>(max_capacity_))
      throw file_error(where + ": saved with max_capacity " + meta["_max_capacity"].dump() + ", this sampler has " +
                       std::to_string(max_capacity_));
    const std::vector<double> sums = read(dir / "sumtree.memmap"), mins = read(dir / "mintree.memmap");
    for (std::size_t row = 0; row < sums.size(); ++row)
      if (!(sums[row] >= 0) || !std::isfinite(sums[row]) || !(mins[row] >= 0))
        throw file_error((dir / "sumtree.memmap").string() + ": row " + std::to_string(row) + " holds the priority " +
                         std::to_string(sums[row]) + " / " + std::to_string(mins[row]) + " (sum / min tree), not a number >= 0");
    alpha_ = meta["_alpha"].get<double>();
    beta_ = meta["_beta"].get<double>();
    eps_ = meta["_eps"].get<double>();
    max_priority_.reset();
    if (const auto& mp = meta.value("_max_priority", nlohmann::json()); mp.is_array() && !mp.empty() && mp[0].is_number())
      max_priority_ = mp[0].get<double>();
    for (std::int64_t row = 0; row < max_capacity_; ++row) {
      sums_.set(row, sums[static_cast<std::size_t>(row)]);
      mins_.set(row, mins[static_cast<std::size_t>(row)]);
    }
  }

 private:
  static std::int64_t checked_capacity(std::int64_t capacity) {
    if (capacity <= 0) throw value_error("PrioritizedSampler: max_capacity must be positive, got " + std::to_string(capacity));
    return capacity;
  }
  double transformed(double raw) const { return std::pow(raw + eps_, alpha_); }
  void set(std::int64_t row, double value) {
    sums_.set(row, value);
    mins_.set(row, value);
  }
  std::vector<std::int64_t> rows_of(const at::Tensor& index, const char* op) const {
    const at::Tensor rows = index.to(at::kCPU, at::kLong).contiguous().reshape({-1});
    std::vector<std::int64_t> out(rows.data_ptr<std::int64_t>(), rows.data_ptr<std::int64_t>() + rows.numel());
    for (std::int64_t row : out)
      if (row < 0 || row >= max_capacity_)
        throw index_error(std::string("PrioritizedSampler.") + op + ": row " + std::to_string(row) + " is outside [0, " +
                          std::to_string(max_capacity_) + ")");
    return out;
  }
  void write(const std::filesystem::path& file, const std::vector<double>& values) const {
    tensordict::detail::write_file_atomically(file.string(), "PrioritizedSampler.dumps", [&](std::ostream& out) {
      out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(double)));
    });
  }
  std::vector<double> read(const std::filesystem::path& file) const {
    const std::string bytes = tensordict::detail::read_file(file.string(), "PrioritizedSampler.loads");
    if (bytes.size() != static_cast<std::size_t>(max_capacity_) * sizeof(double))
      throw file_error(file.string() + ": " + std::to_string(bytes.size()) + " bytes, where " + std::to_string(max_capacity_) +
                       " float64 values take " + std::to_string(max_capacity_ * 8));
    std::vector<double> out(static_cast<std::size_t>(max_capacity_));
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }

  std::int64_t max_capacity_;
  double alpha_, beta_, eps_;
  std::optional<double> max_priority_;
  detail::sum_tree sums_;
  detail::min_tree mins_;
};

// Sub-trajectories of consecutive rows (TorchRL's SliceSampler, with
// replacement): a trajectory is a run of rows whose traj_key is the same, or
// (no traj_key) rows up to one whose end_key is true; the newest row written
// and the storage's last row end one too. Each draw picks num_slices
// trajectories uniformly, then in each a slice of slice_len rows at a uniform
// start; the batch is the slices one after another. strict_length: only
// trajectories of slice_len rows or more are picked; else a shorter one gives
// a shorter slice and the batch is smaller. As TorchRL, the sample holds
// truncated_key (bool [n, 1]) true at each slice's last row unless that row
// ends its trajectory, where terminated is true instead, and done = either
// (the keys beside truncated_key); an empty truncated_key writes none of them.
struct slice_sampler_options {
  std::int64_t num_slices = 0;  // give one of num_slices and slice_len; the batch size fixes the other
  std::int64_t slice_len = 0;
  any_key_path end_key = {"next", "done"};
  any_key_path traj_key = {};  // e.g. {"episode"}; empty: trajectories end at end_key
  any_key_path truncated_key = {"next", "truncated"};
  bool strict_length = true;
};

class SliceSampler : public Sampler {
 public:
  explicit SliceSampler(slice_sampler_options options) : options_(std::move(options)) {
    if ((options_.num_slices > 0) == (options_.slice_len > 0) || options_.num_slices < 0 || options_.slice_len < 0)
      throw value_error("SliceSampler: give exactly one of num_slices and slice_len, positive (got num_slices=" +
                        std::to_string(options_.num_slices) + ", slice_len=" + std::to_string(options_.slice_len) + ")");
    if (options_.traj_key.empty() && options_.end_key.empty())
      throw value_error("SliceSampler: give an end_key or a traj_key to find the trajectories");
  }
  const slice_sampler_options& options() const { return options_; }

  sampled_rows sample(std::int64_t, std::int64_t) override {
    throw value_error("SliceSampler reads the trajectories of the storage: draw(storage, batch_size), as ReplayBuffer does");
  }

  sampled_rows draw(const TensorStorage& storage, std::int64_t batch_size) override {
    check_not_empty(storage.size());
    const auto [num_slices, slice_len] = shape_of(batch_size);
    const std::vector<trajectory> all = trajectories(storage);
    std::vector<trajectory> candidates;
    for (const trajectory& t : all)
      if (!options_.strict_length || t.length >= slice_len) candidates.push_back(t);
    if (candidates.empty())
      throw value_error("SliceSampler: none of the " + std::to_string(all.size()) + " trajectories stored has " +
                        std::to_string(slice_len) + " rows or more (the longest has " + std::to_string(longest(all)) +
                        "); shorter slices need slice_sampler_options{.strict_length = false}");
    const at::Tensor pick = at::randint(static_cast<std::int64_t>(candidates.size()), {num_slices}, at::kLong);
    const at::Tensor offset_draw = at::rand({num_slices}, at::kDouble);
    std::vector<std::int64_t> rows;
    std::vector<std::int64_t> ends;  // in the batch: the last row of each slice
    std::vector<bool> reaches_end;
    rows.reserve(static_cast<std::size_t>(batch_size));
    for (std::int64_t s = 0; s < num_slices; ++s) {
      const trajectory& t = candidates[static_cast<std::size_t>(pick[s].item<std::int64_t>())];
      const std::int64_t length = std::min(slice_len, t.length);
      const std::int64_t starts = t.length - length + 1;
      const std::int64_t offset = std::min(starts - 1, static_cast<std::int64_t>(offset_draw[s].item<double>() * static_cast<double>(starts)));
      for (std::int64_t k = 0; k < length; ++k) rows.push_back(t.start + offset + k);
      ends.push_back(static_cast<std::int64_t>(rows.size()) - 1);
      reaches_end.push_back(offset + length == t.length);
    }
    sampled_rows out{at::tensor(rows, at::kLong), {}};
    if (!options_.truncated_key.empty()) {
      const auto n = static_cast<std::int64_t>(rows.size());
      at::Tensor truncated = at::zeros({n, 1}, at::kBool), terminated = at::zeros({n, 1}, at::kBool);
      for (std::size_t s = 0; s < ends.size(); ++s) (reaches_end[s] ? terminated : truncated)[ends[s]].fill_(true);
      any_key_path done_key = options_.truncated_key, terminated_key = options_.truncated_key;
      done_key.back() = "done";
      terminated_key.back() = "terminated";
      out.info = {{options_.truncated_key, truncated}, {done_key, truncated.logical_or(terminated)}, {terminated_key, terminated}};
    }
    return out;
  }

  // The row written last ends a trajectory (the next one holds older data).
  void extend(const at::Tensor& index) override {
    if (index.numel() > 0) newest_ = index.reshape({-1})[-1].item<std::int64_t>();
  }

 private:
  struct trajectory {
    std::int64_t start, length;
  };

  std::pair<std::int64_t, std::int64_t> shape_of(std::int64_t batch_size) const {
    const std::int64_t per = options_.num_slices > 0 ? options_.num_slices : options_.slice_len;
    if (batch_size < per || batch_size % per != 0)
      throw value_error("SliceSampler: the batch size " + std::to_string(batch_size) + " is not a multiple of " +
                        (options_.num_slices > 0 ? "num_slices " : "slice_len ") + std::to_string(per));
    return options_.num_slices > 0 ? std::pair{options_.num_slices, batch_size / per} : std::pair{batch_size / per, options_.slice_len};
  }

  std::vector<trajectory> trajectories(const TensorStorage& storage) const {
    const std::int64_t size = storage.size();
    const AnyTensorDict& rows = storage.tensordict();
    const any_key_path& key = options_.traj_key.empty() ? options_.end_key : options_.traj_key;
    if (!rows.contains(key) || !rows.is_leaf(key))
      throw key_error("SliceSampler: the storage has no tensor " + to_string(key) + " (" +
                      (options_.traj_key.empty() ? "the end-of-trajectory flags; set slice_sampler_options::end_key or traj_key"
                                                 : "the trajectory ids; set slice_sampler_options::traj_key") + ")");
    at::Tensor column = rows.get(key).slice(0, 0, size);
    column = column.reshape({size, -1}).to(at::kCPU);
    at::Tensor ends;  // bool [size]: row i is a trajectory's last
    if (options_.traj_key.empty()) {
      ends = column.ne(0).any(1);
    } else {
      ends = at::ones({size}, at::kBool);
      if (size > 1) ends.slice(0, 0, size - 1).copy_(column.slice(0, 0, size - 1).ne(column.slice(0, 1, size)).any(1));
    }
    ends[size - 1] = true;
    if (newest_ >= 0 && newest_ < size) ends[newest_] = true;
    ends = ends.contiguous();
    const bool* end = ends.data_ptr<bool>();
    std::vector<trajectory> out;
    std::int64_t start = 0;
    for (std::int64_t row = 0; row < size; ++row)
      if (end[row]) {
        out.push_back({start, row - start + 1});
        start = row + 1;
      }
    return out;
  }
  static std::int64_t longest(const std::vector<trajectory>& all) {
    std::int64_t most = 0;
    for (const trajectory& t : all) most = std::max(most, t.length);
    return most;
  }

  slice_sampler_options options_;
  std::int64_t newest_ = -1;
};

}  // namespace tensordict::data
