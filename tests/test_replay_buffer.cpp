// Replay buffers (tensordict::data, TorchRL's torchrl.data) and target
// network updates (tensordict::objectives).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "catch_torch.hpp"
#include "test_helpers.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/bincount.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/modules/linear.h>

#include <nlohmann/json.hpp>

#include <tensordict/data/replay_buffer.hpp>
#include <tensordict/from_module.hpp>
#include <tensordict/objectives/target_updates.hpp>

using namespace tensordict;
namespace data = tensordict::data;
using test::Contains;
using test::temporary_dir;

namespace {
// n transitions numbered from `first`: obs [n, 3] = first + row, action [n] int64, ("next", "reward") [n, 1].
AnyTensorDict transitions(std::int64_t first, std::int64_t n) {
  const at::Tensor id = at::arange(first, first + n, at::kLong);
  AnyTensorDict td({n});
  td.set({"obs"}, id.to(at::kFloat).unsqueeze(1).expand({n, 3}).contiguous());
  td.set({"action"}, id * 10);
  td.set({"next", "reward"}, id.to(at::kDouble).unsqueeze(1) / 2);
  return td;
}

// The transition numbers a TensorDict of rows holds.
std::vector<std::int64_t> ids_of(const AnyTensorDict& rows) {
  const at::Tensor action = (rows.get({"action"}) / 10).to(at::kLong).contiguous();
  return {action.data_ptr<std::int64_t>(), action.data_ptr<std::int64_t>() + action.numel()};
}

// Pearson's chi-square of counts against expected probabilities.
double chi_square(const at::Tensor& counts, const std::vector<double>& probability) {
  const double total = counts.sum().item<double>();
  double chi = 0;
  for (std::size_t i = 0; i < probability.size(); ++i) {
    const double expected = total * probability[i];
    const double seen = counts[static_cast<std::int64_t>(i)].item<double>();
    chi += (seen - expected) * (seen - expected) / expected;
  }
  return chi;
}

// Equal within a relative tolerance.
bool close(double a, double b, double relative = 1e-9) { return std::abs(a - b) <= relative * std::max(std::abs(a), std::abs(b)); }

bool rows_consistent(const AnyTensorDict& rows) {
  const at::Tensor id = (rows.get({"action"}) / 10).to(at::kLong);
  return rows.get({"obs"}).select(1, 2).to(at::kLong).equal(id) &&
         rows.get({"next", "reward"}).squeeze(1).equal(id.to(at::kDouble) / 2);
}
}  // namespace

TEST_CASE("replay buffer: a lazy storage allocated by the first write, rows written round robin", "[replay_buffer]") {
  data::ReplayBuffer buffer(data::LazyTensorStorage(5));
  CHECK(buffer.size() == 0);
  CHECK_FALSE(buffer.storage().initialized());
  CHECK(buffer.extend(transitions(0, 3)).equal(at::arange(3, at::kLong)));
  CHECK(buffer.size() == 3);
  const AnyTensorDict& storage = buffer.storage().tensordict();
  CHECK(storage.batch_size() == c10::IntArrayRef{5});
  CHECK(storage.get({"obs"}).sizes() == c10::IntArrayRef{5, 3});
  CHECK(storage.get({"action"}).scalar_type() == at::kLong);
  CHECK(storage.get_tensordict({"next"}).batch_size() == c10::IntArrayRef{5});
  // Wrapping around: rows 3, 4, then 0 and 1 again.
  CHECK(buffer.extend(transitions(3, 4)).equal(at::tensor({3, 4, 0, 1}, at::kLong)));
  CHECK(buffer.size() == 5);
  CHECK(buffer.write_count() == 7);
  CHECK(buffer.writer().cursor() == 2);
  CHECK((ids_of(buffer.storage().tensordict()) == std::vector<std::int64_t>{5, 6, 2, 3, 4}));
  CHECK(rows_consistent(buffer.storage().tensordict()));
  CHECK(buffer.add(transitions(7, 1)[0]) == 2);
  CHECK((ids_of(buffer.storage().tensordict()) == std::vector<std::int64_t>{5, 6, 7, 3, 4}));
  // More rows than the buffer holds, at once: refused whole.
  CHECK_THROWS_WITH(buffer.extend(transitions(0, 6)), Contains("6 rows do not fit a storage of max_size 5"));
  CHECK(buffer.write_count() == 8);

  // A sample: the rows drawn, their "index".
  const AnyTensorDict batch = buffer.sample(64);
  CHECK(batch.batch_size() == c10::IntArrayRef{64});
  CHECK(rows_consistent(batch));
  const at::Tensor index = batch.get({"index"});
  CHECK(index.scalar_type() == at::kLong);
  CHECK(buffer.storage().tensordict().get({"action"}).index({index}).equal(batch.get({"action"})));
  CHECK_FALSE(batch.contains({"priority_weight"}));
  // A sample is memory of its own: writing it leaves the buffer.
  batch.get({"obs"}).fill_(-1);
  CHECK(rows_consistent(buffer.storage().tensordict()));
  // Sampled data written again: its "index" is not stored.
  buffer.extend(batch.index({at::indexing::Slice(0, 2)}));
  CHECK_FALSE(buffer.storage().tensordict().contains({"index"}));
}

TEST_CASE("replay buffer: a sample's rows are the storage's rows at its index, whatever the leaves' layout", "[replay_buffer]") {
  // Leaves of every kind the row copies meet: nested, multi-dim, bool, half, a nested level with a
  // dim of its own, a transposed (non-contiguous) leaf, and non-tensor data (those go through index).
  auto make = [](bool transposed, bool with_string) {
    AnyTensorDict td({40});
    td.set({"obs"}, at::randn({40, 3, 2}));
    td.set({"done"}, at::rand({40, 1}).gt(0.5));
    td.set({"half"}, at::randn({40, 5}).to(at::kHalf));
    td.set({"next", "reward"}, at::randn({40, 1}, at::kDouble));
    AnyTensorDict agents({40, 2});
    agents.set({"action"}, at::randint(0, 9, {40, 2, 4}, at::kLong));
    td.set({"agents"}, agents);
    if (transposed) td.set({"t"}, at::randn({6, 40}).t());
    if (with_string) td.set_non_tensor({"tag"}, NonTensor(std::string("episode")));
    return td;
  };
  for (const bool transposed : {false, true})
    for (const bool with_string : {false, true}) {
      const AnyTensorDict all = make(transposed, with_string);
      data::ReplayBuffer buffer(data::TensorStorage(all.clone()));
      buffer.extend(all);
      const AnyTensorDict batch = buffer.sample(64);
      const at::Tensor index = batch.get({"index"});
      const AnyTensorDict expected = buffer.storage().tensordict().index({index});
      CHECK(batch.batch_size() == c10::IntArrayRef{64});
      CHECK(batch.get_tensordict({"agents"}).batch_size() == c10::IntArrayRef{64, 2});
      CHECK((batch.exclude({{"index"}}) == expected).all());
      for (const auto& [path, leaf] : expected.items(true, true))
        CHECK(std::get<at::Tensor>(leaf).scalar_type() == batch.get(path).scalar_type());
      CHECK(batch.get({"obs"}).data_ptr() != buffer.storage().tensordict().get({"obs"}).data_ptr());
      if (with_string) CHECK(batch.get_non_tensor<std::string>({"tag"}) == "episode");
    }
}

TEST_CASE("replay buffer: a failed write changes nothing; errors name the key and the fix", "[replay_buffer]") {
  data::ReplayBuffer buffer(data::LazyTensorStorage(4), data::RandomSampler(), {.batch_size = 2});
  CHECK_THROWS_WITH(buffer.sample(), Contains("holds nothing yet"));
  buffer.extend(transitions(0, 3));
  AnyTensorDict wrong = transitions(3, 2);
  wrong.set({"obs"}, at::zeros({2, 4}));
  CHECK_THROWS_AS(buffer.extend(wrong), shape_error);
  AnyTensorDict missing = transitions(3, 2).exclude({{"action"}});
  CHECK_THROWS_AS(buffer.extend(missing), error);
  CHECK(buffer.size() == 3);
  CHECK(buffer.write_count() == 3);
  CHECK(buffer.writer().cursor() == 3);
  CHECK((ids_of(buffer.storage().tensordict().index({at::indexing::Slice(0, 3)})) == std::vector<std::int64_t>{0, 1, 2}));
  CHECK_THROWS_WITH(buffer.update_priority(at::tensor({0}, at::kLong), at::ones({1})), Contains("not prioritized"));
  CHECK_THROWS_WITH(data::ReplayBuffer(data::LazyTensorStorage(4)).sample(), Contains("no batch size"));
  CHECK_THROWS_WITH(data::ReplayBuffer(data::LazyTensorStorage(8), data::PrioritizedSampler(4, 0.6, 0.4)),
                    Contains("max_capacity 4 is smaller than the storage's max_size 8"));
  CHECK(buffer.sample().batch_size() == c10::IntArrayRef{2});
}

TEST_CASE("replay buffer: uniform draws pass a chi-square test", "[replay_buffer]") {
  torch::manual_seed(7);
  data::ReplayBuffer buffer(data::LazyTensorStorage(10));
  buffer.extend(transitions(0, 10));
  const at::Tensor index = buffer.sample(20000).get({"index"});
  // 9 degrees of freedom: 27.9 at p = 0.001.
  CHECK(chi_square(at::bincount(index, {}, 10), std::vector<double>(10, 0.1)) < 27.9);
}

TEST_CASE("replay buffer: without replacement, each row once per epoch", "[replay_buffer]") {
  torch::manual_seed(3);
  data::ReplayBuffer buffer(data::LazyTensorStorage(16), data::SamplerWithoutReplacement());
  buffer.extend(transitions(0, 10));
  std::vector<std::int64_t> seen;
  std::vector<std::int64_t> sizes;
  for (int k = 0; k < 3; ++k) {
    const auto batch = buffer.sample(4);
    sizes.push_back(batch.batch_size()[0]);
    const auto ids = ids_of(batch);
    seen.insert(seen.end(), ids.begin(), ids.end());
    CHECK(buffer.ran_out() == (k == 2));
  }
  CHECK((sizes == std::vector<std::int64_t>{4, 4, 2}));
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(buffer.sample(4).batch_size()[0] == 4);  // a new epoch

  data::ReplayBuffer dropping(data::LazyTensorStorage(16), data::SamplerWithoutReplacement(/*drop_last=*/true));
  dropping.extend(transitions(0, 10));
  std::set<std::int64_t> epoch;
  for (int k = 0; k < 2; ++k)
    for (std::int64_t id : ids_of(dropping.sample(4))) epoch.insert(id);
  CHECK(epoch.size() == 8);  // two full batches, the last 2 rows dropped
  CHECK(dropping.sample(4).batch_size()[0] == 4);
  CHECK_FALSE(dropping.ran_out());
  CHECK_THROWS_WITH(dropping.sample(11), Contains("drop_last"));
}

namespace {
// Episodes of the given lengths one after another: "episode" holds each row's
// episode, ("next", "done") is true at each episode's last row, "step" counts
// the rows from 0.
AnyTensorDict episodes(const std::vector<std::int64_t>& lengths) {
  std::vector<std::int64_t> episode, done;
  for (std::size_t e = 0; e < lengths.size(); ++e)
    for (std::int64_t k = 0; k < lengths[e]; ++k) {
      episode.push_back(static_cast<std::int64_t>(e));
      done.push_back(k + 1 == lengths[e]);
    }
  const auto n = static_cast<std::int64_t>(episode.size());
  AnyTensorDict td({n});
  td.set({"episode"}, at::tensor(episode, at::kLong));
  td.set({"step"}, at::arange(n, at::kLong));
  td.set({"next", "done"}, at::tensor(done, at::kLong).to(at::kBool).unsqueeze(1));
  return td;
}

// Slices of `slice_len` rows in a sample: each one run of consecutive rows of one episode.
std::vector<std::int64_t> slice_starts(const AnyTensorDict& batch, std::int64_t slice_len) {
  const at::Tensor step = batch.get({"step"}), episode = batch.get({"episode"});
  std::vector<std::int64_t> starts;
  for (std::int64_t s = 0; s < step.size(0) / slice_len; ++s) {
    const at::Tensor rows = step.slice(0, s * slice_len, (s + 1) * slice_len);
    REQUIRE(rows.equal(at::arange(slice_len, at::kLong) + rows[0]));
    REQUIRE((episode.slice(0, s * slice_len, (s + 1) * slice_len) == episode[s * slice_len]).all().item<bool>());
    starts.push_back(rows[0].item<std::int64_t>());
  }
  return starts;
}
}  // namespace

TEST_CASE("slice sampler: sub-trajectories within episodes, as TorchRL draws and marks them", "[replay_buffer]") {
  torch::manual_seed(11);
  // Episodes of 5, 3, 8 and 4 rows: rows 0-4, 5-7, 8-15, 16-19.
  data::ReplayBuffer buffer(data::LazyTensorStorage(20), data::SliceSampler({.slice_len = 4}));
  buffer.extend(episodes({5, 3, 8, 4}));
  const AnyTensorDict batch = buffer.sample(4000);
  REQUIRE(batch.batch_size() == c10::IntArrayRef{4000});
  const std::vector<std::int64_t> starts = slice_starts(batch, 4);
  // The 3-row episode is never drawn (strict_length); the others equally often, and within
  // each every start equally often: 1/3 * 1/2 for starts 0, 1; 1/3 * 1/5 for 8..12; 1/3 for 16.
  at::Tensor counts = at::zeros({20}, at::kLong);
  for (std::int64_t start : starts) counts[start] += 1;
  CHECK(counts.slice(0, 5, 8).sum().item<std::int64_t>() == 0);
  const at::Tensor used = at::tensor({0, 1, 8, 9, 10, 11, 12, 16}, at::kLong);
  CHECK(counts.index({used}).sum().item<std::int64_t>() == 1000);
  std::vector<double> probability = {1. / 6, 1. / 6, 1. / 15, 1. / 15, 1. / 15, 1. / 15, 1. / 15, 1. / 3};
  CHECK(chi_square(counts.index({used}), probability) < 24.32);  // 7 degrees of freedom, p = 0.001

  // truncated at each slice's last row, unless it is the episode's last: terminated there.
  const at::Tensor truncated = batch.get({"next", "truncated"}), terminated = batch.get({"next", "terminated"});
  CHECK(truncated.sizes() == c10::IntArrayRef{4000, 1});
  CHECK(truncated.scalar_type() == at::kBool);
  CHECK(batch.get({"next", "done"}).equal(truncated | terminated));
  const at::Tensor step = batch.get({"step"});
  for (std::int64_t s = 0; s < 1000; s += 37) {
    const std::int64_t last = s * 4 + 3, row = step[last].item<std::int64_t>();
    const bool episode_end = row == 4 || row == 15 || row == 19;
    CHECK(terminated[last].item<bool>() == episode_end);
    CHECK(truncated[last].item<bool>() == !episode_end);
    CHECK_FALSE(truncated.slice(0, s * 4, last).any().item<bool>());
    CHECK_FALSE(terminated.slice(0, s * 4, last).any().item<bool>());
  }

  // The same trajectories from the episode ids, and from num_slices.
  data::ReplayBuffer by_id(data::LazyTensorStorage(20), data::SliceSampler({.num_slices = 10, .end_key = {}, .traj_key = {"episode"}}));
  AnyTensorDict without_done = episodes({5, 3, 8, 4}).exclude({{"next"}});
  by_id.extend(without_done);
  const AnyTensorDict ten = by_id.sample(40);
  for (std::int64_t start : slice_starts(ten, 4)) CHECK(((start >= 0 && start <= 1) || (start >= 8 && start <= 12) || start == 16));

  // strict_length = false: the 3-row episode gives 3-row slices, and the batch is shorter.
  data::ReplayBuffer loose(data::LazyTensorStorage(20), data::SliceSampler({.slice_len = 4, .strict_length = false}));
  loose.extend(episodes({5, 3, 8, 4}));
  bool shorter = false;
  for (int k = 0; k < 20 && !shorter; ++k) shorter = loose.sample(40).batch_size()[0] < 40;
  CHECK(shorter);

  // Errors name the fix.
  CHECK_THROWS_WITH(buffer.sample(6), Contains("not a multiple of slice_len 4"));
  data::ReplayBuffer too_long(data::LazyTensorStorage(20), data::SliceSampler({.slice_len = 9}));
  too_long.extend(episodes({5, 3, 8, 4}));
  CHECK_THROWS_WITH(too_long.sample(9), Contains("the longest has 8") && Contains("strict_length = false"));
  data::ReplayBuffer no_key(data::LazyTensorStorage(20), data::SliceSampler({.slice_len = 2, .traj_key = {"trajectory"}}));
  no_key.extend(episodes({5, 3, 8, 4}));
  CHECK_THROWS_WITH(no_key.sample(4), Contains("no tensor \"trajectory\"") && Contains("traj_key"));
  CHECK_THROWS_WITH(data::SliceSampler({.num_slices = 2, .slice_len = 4}), Contains("exactly one of num_slices and slice_len"));
}

TEST_CASE("slice sampler: the newest row ends a trajectory once the buffer wrapped around", "[replay_buffer]") {
  torch::manual_seed(3);
  // One episode of 12 steps into 10 rows: steps 10, 11 overwrite rows 0, 1, so rows 0-1 and 2-9 are apart.
  data::ReplayBuffer buffer(data::LazyTensorStorage(10), data::SliceSampler({.slice_len = 3}));
  AnyTensorDict long_episode = episodes({12});
  long_episode.get({"next", "done"}).fill_(false);
  buffer.extend(long_episode.index({at::indexing::Slice(0, 8)}));
  buffer.extend(long_episode.index({at::indexing::Slice(8, 12)}));
  std::set<std::int64_t> seen;
  for (std::int64_t start : slice_starts(buffer.sample(300), 3)) seen.insert(start);
  CHECK((seen == std::set<std::int64_t>{2, 3, 4, 5, 6, 7}));  // steps 2..9 live in rows 2..9
}

TEST_CASE("replay buffer: a sample as a typed TensorDict", "[replay_buffer]") {
  using transition = schema<leaf<"obs">, leaf<"action">, field<"next", schema<leaf<"reward">>>, leaf<"index">>;
  data::ReplayBuffer buffer(data::LazyTensorStorage(8), data::RandomSampler(), {.batch_size = 5});
  buffer.extend(transitions(0, 6));
  const TensorDict<transition> batch = buffer.sample<transition>();
  CHECK(batch.batch_size() == c10::IntArrayRef{5});
  CHECK(batch.get<"action">().equal(buffer.storage().tensordict().get({"action"}).index({batch.get<"index">()})));
  using typo = schema<leaf<"obs">, leaf<"actoin">>;
  CHECK_THROWS_WITH(buffer.sample<typo>(), Contains("actoin"));
}

TEST_CASE("prioritized sampler: draws, weights and default priorities against a brute-force reference", "[replay_buffer]") {
  torch::manual_seed(11);
  const double alpha = 0.7, beta = 0.5, eps = 1e-8;
  data::ReplayBuffer buffer(data::LazyTensorStorage(8), data::PrioritizedSampler(8, alpha, beta, eps), {.batch_size = 4});
  buffer.extend(transitions(0, 6));
  auto& sampler = static_cast<data::PrioritizedSampler&>(buffer.sampler());
  // New rows get the largest priority so far: 1 before any update.
  for (std::int64_t row = 0; row < 6; ++row) CHECK(close(sampler.tree_value(row), std::pow(1 + eps, alpha)));
  CHECK(sampler.tree_value(6) == 0);
  const std::vector<double> raw{0.5, 2.0, 0.1, 4.0, 1.0, 0.25};
  buffer.update_priority(at::arange(6, at::kLong), at::tensor(raw, at::kDouble));
  CHECK(sampler.default_priority() == 4.0);
  std::vector<double> p;
  for (double r : raw) p.push_back(std::pow(r + eps, alpha));
  double total = 0, least = INFINITY;
  for (double v : p) total += v, least = std::min(least, v);
  std::vector<double> probability;
  for (double v : p) probability.push_back(v / total);

  const AnyTensorDict batch = buffer.sample(40000);
  CHECK(rows_consistent(batch));
  const at::Tensor index = batch.get({"index"});
  CHECK(chi_square(at::bincount(index, {}, 6), probability) < 20.5);  // 5 dof, p = 0.001
  const at::Tensor weight = batch.get({"priority_weight"});
  CHECK(weight.scalar_type() == at::kFloat);
  for (std::int64_t k = 0; k < 50; ++k) {
    const auto row = index[k].item<std::int64_t>();
    CHECK(close(weight[k].item<double>(), std::pow(p[static_cast<std::size_t>(row)] / least, -beta), 1e-5));
  }
  // The row with the least priority has weight 1.
  CHECK(close(weight.max().item<double>(), 1.0, 1e-6));

  // New rows after updates: the largest raw priority given so far.
  buffer.extend(transitions(6, 2));
  CHECK(close(sampler.tree_value(7), std::pow(4.0 + eps, alpha)));

  // update_tensordict_priority: the sample's "td_error", reduced to one per row by the max.
  AnyTensorDict drawn = buffer.sample(3);
  const at::Tensor rows = drawn.get({"index"});
  drawn.set({"td_error"}, at::tensor({0.0, 9.0, 1.0, 3.0, 2.0, 0.5}, at::kDouble).reshape({3, 2}));
  buffer.update_tensordict_priority(drawn);
  const std::vector<double> reduced{9.0, 3.0, 2.0};
  for (std::int64_t k = 0; k < 3; ++k) {
    // A row drawn twice holds the last priority written for it.
    std::int64_t last = k;
    for (std::int64_t j = k + 1; j < 3; ++j)
      if (rows[j].item<std::int64_t>() == rows[k].item<std::int64_t>()) last = j;
    CHECK(close(sampler.tree_value(rows[k].item<std::int64_t>()), std::pow(reduced[static_cast<std::size_t>(last)] + eps, alpha)));
  }
  CHECK_THROWS_WITH(buffer.update_tensordict_priority(transitions(0, 2)), Contains("no tensor \"index\""));
  CHECK_THROWS_WITH(buffer.update_priority(at::tensor({1}, at::kLong), at::tensor({-1.0})), Contains("row 1") && Contains(">= 0"));
  CHECK_THROWS_WITH(buffer.update_priority(at::tensor({8}, at::kLong), at::tensor({1.0})), Contains("row 8 is outside [0, 8)"));
  CHECK_THROWS_WITH(buffer.update_priority(at::tensor({1, 2}, at::kLong), at::tensor({1.0, 2.0, 3.0})), Contains("3 priorities for 2 rows"));
}

TEST_CASE("prioritized sampler: the sum and min trees agree with sums and mins over the rows", "[replay_buffer]") {
  std::mt19937 random(5);
  std::uniform_real_distribution<double> value(0.0, 3.0);
  for (std::int64_t size : {1, 2, 5, 8, 13, 100}) {
    auto sums = data::detail::make_sum_tree(size);
    auto mins = data::detail::make_min_tree(size);
    std::vector<double> rows(static_cast<std::size_t>(size));
    for (int round = 0; round < 3; ++round)
      for (std::int64_t r = 0; r < size; ++r) {
        rows[static_cast<std::size_t>(r)] = value(random);
        sums.set(r, rows[static_cast<std::size_t>(r)]);
        mins.set(r, rows[static_cast<std::size_t>(r)]);
      }
    for (std::int64_t begin = 0; begin < size; begin += 3)
      for (std::int64_t end = begin + 1; end <= size; end += 2) {
        double sum = 0, least = INFINITY;
        for (std::int64_t r = begin; r < end; ++r) sum += rows[static_cast<std::size_t>(r)], least = std::min(least, rows[static_cast<std::size_t>(r)]);
        CHECK(close(sums.query(begin, end), sum));
        CHECK(mins.query(begin, end) == least);
      }
    double running = 0;
    for (std::int64_t r = 0; r < size; ++r) {
      CHECK(sums.scan(running + rows[static_cast<std::size_t>(r)] / 2) == r);  // the middle of row r's share
      running += rows[static_cast<std::size_t>(r)];
    }
  }
}

TEST_CASE("replay buffer: a memmap storage writes through to Python's memmap folder", "[replay_buffer]") {
  temporary_dir dir("replay_memmap");
  {
    data::ReplayBuffer buffer(data::LazyMemmapStorage(1000, dir / "buffer"));
    buffer.extend(transitions(0, 3));
    // Full-size files of zeros past the rows written, as TorchRL's LazyMemmapStorage makes.
    CHECK(std::filesystem::file_size(dir / "buffer/obs.memmap") == 1000 * 3 * sizeof(float));
    const auto files = load_memmap(dir / "buffer");
    CHECK(files.batch_size() == c10::IntArrayRef{1000});
    CHECK((ids_of(files.index({at::indexing::Slice(0, 3)})) == std::vector<std::int64_t>{0, 1, 2}));
    CHECK(files.get({"obs"}).index({at::indexing::Slice(3, 1000)}).eq(0).all().item<bool>());
    buffer.extend(transitions(3, 2));
    CHECK(load_memmap(dir / "buffer").get({"action"})[4].item<std::int64_t>() == 40);
  }
  CHECK(std::filesystem::exists(dir / "buffer"));  // a folder given is the user's
  std::string scratch;
  {
    data::LazyMemmapStorage storage(10);
    data::ReplayBuffer buffer(std::move(storage));
    buffer.extend(transitions(0, 2));
    scratch = static_cast<const data::LazyMemmapStorage&>(buffer.storage()).scratch_dir();
    CHECK(std::filesystem::exists(scratch + "/meta.json"));
  }
  CHECK_FALSE(std::filesystem::exists(scratch));  // a temporary one goes with the buffer
  CHECK_THROWS_WITH(data::ReplayBuffer(data::LazyMemmapStorage(10, dir / "buffer")).extend(transitions(0, 2)), Contains("it exists"));
}

TEST_CASE("replay buffer: dumps and loads in TorchRL's layout, the state whole", "[replay_buffer]") {
  temporary_dir dir("replay_dumps");
  torch::manual_seed(1);
  data::ReplayBuffer buffer(data::LazyMemmapStorage(8, dir / "scratch"), data::PrioritizedSampler(8, 0.6, 0.4), {.batch_size = 3});
  buffer.extend(transitions(0, 6));
  buffer.extend(transitions(6, 4));  // wrapped: cursor 2
  buffer.update_priority(at::tensor({0, 3, 5}, at::kLong), at::tensor({2.0, 0.5, 7.0}));
  buffer.dumps(dir / "ckpt");
  for (const char* file : {"storage/meta.json", "storage/obs.memmap", "storage/next/meta.json", "storage/storage_metadata.json",
                           "sampler/sumtree.memmap", "sampler/mintree.memmap", "sampler/sampler_metadata.json",
                           "writer/metadata.json", "buffer_metadata.json"})
    CHECK(std::filesystem::exists(dir / ("ckpt/" + std::string(file))));
  const auto writer = nlohmann::json::parse(std::ifstream(dir / "ckpt/writer/metadata.json"));
  CHECK(writer == nlohmann::json{{"cursor", 2}, {"write_count", 10}});
  const auto storage = nlohmann::json::parse(std::ifstream(dir / "ckpt/storage/storage_metadata.json"));
  CHECK(storage == nlohmann::json{{"metadata", nlohmann::json::object()}, {"is_pytree", false}, {"len", 8}});
  const auto sampler = nlohmann::json::parse(std::ifstream(dir / "ckpt/sampler/sampler_metadata.json"));
  CHECK(sampler["_max_capacity"] == 8.0);
  CHECK(sampler["_max_priority"][0] == 7.0);
  CHECK(nlohmann::json::parse(std::ifstream(dir / "ckpt/buffer_metadata.json")) == nlohmann::json{{"batch_size", 3}});

  data::ReplayBuffer restored(data::LazyTensorStorage(8), data::PrioritizedSampler(8, 0.6, 0.4));
  restored.loads(dir / "ckpt");
  CHECK(restored.size() == 8);
  CHECK(restored.write_count() == 10);
  CHECK(restored.writer().cursor() == 2);
  CHECK(restored.options().batch_size == 3);
  CHECK(ids_of(restored.storage().tensordict()) == ids_of(buffer.storage().tensordict()));
  auto& mine = static_cast<data::PrioritizedSampler&>(buffer.sampler());
  auto& theirs = static_cast<data::PrioritizedSampler&>(restored.sampler());
  for (std::int64_t row = 0; row < 8; ++row) CHECK(theirs.tree_value(row) == mine.tree_value(row));
  CHECK(theirs.default_priority() == 7.0);
  torch::manual_seed(9);
  const auto a = buffer.sample();
  torch::manual_seed(9);
  const auto b = restored.sample();
  CHECK(a.get({"index"}).equal(b.get({"index"})));
  CHECK(a.get({"priority_weight"}).equal(b.get({"priority_weight"})));
  // Writing on continues at the cursor, in both.
  CHECK(restored.extend(transitions(10, 1)).item<std::int64_t>() == 2);

  // Bad state files: file_error naming the file.
  std::ofstream(dir / "ckpt/writer/metadata.json") << "{\"cursor\": 99}";
  CHECK_THROWS_WITH(restored.loads(dir / "ckpt"), Contains("metadata.json") && Contains("cursor 99 is outside"));
  std::filesystem::resize_file(dir / "ckpt/sampler/sumtree.memmap", 12);
  CHECK_THROWS_AS(data::ReplayBuffer(data::LazyTensorStorage(8), data::PrioritizedSampler(8, 0.6, 0.4)).loads(dir / "ckpt"), file_error);
}

TEST_CASE("target networks: SoftUpdate moves the target by tau, HardUpdate copies every interval", "[replay_buffer][objectives]") {
  torch::nn::Linear online(3, 2), target(3, 2);
  const auto source = from_module(*online), copy = from_module(*target);
  tensordict::objectives::SoftUpdate soft(copy, source, 0.25);
  soft.init_();
  CHECK(target->weight.equal(online->weight));
  CHECK(target->weight.data_ptr() != online->weight.data_ptr());
  const at::Tensor before = target->weight.detach().clone();
  {
    at::NoGradGuard no_grad;
    online->weight.add_(4.0);
  }
  soft.step();
  CHECK(target->weight.allclose(before + 1.0));
  CHECK(target->weight.requires_grad());  // still the module's parameter

  tensordict::objectives::HardUpdate hard(copy, source, 3);
  const at::Tensor held = target->bias.detach().clone();
  {
    at::NoGradGuard no_grad;
    online->bias.add_(1.0);
  }
  hard.step();
  hard.step();
  CHECK(target->bias.equal(held));
  hard.step();
  CHECK(target->bias.equal(online->bias));

  torch::nn::Linear other(4, 2);
  CHECK_THROWS_WITH(tensordict::objectives::SoftUpdate(from_module(*other), source, 0.1), Contains("\"weight\"") && Contains("[2,4]"));
  CHECK_THROWS_WITH(tensordict::objectives::SoftUpdate(copy, source, 0.0), Contains("tau must be in (0, 1]"));
  CHECK_THROWS_WITH(tensordict::objectives::HardUpdate(copy, source, 0), Contains("must be positive"));
}
