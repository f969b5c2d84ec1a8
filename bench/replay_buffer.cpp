// The replay buffer's extend and sample (tensordict::data::ReplayBuffer),
// measured in one run against a memcpy of the same bytes: extend of 1 and of
// 256 transitions (each leaf's rows copied to the rows the writer chose) and
// sample(256) (rows drawn by at::randint, each row of each leaf copied out,
// one memcpy per row and leaf), from a buffer of 10^6 rows of 525 bytes (5 leaves), in memory
// (LazyTensorStorage) and in a memmap folder (LazyMemmapStorage), with a
// uniform sampler and a prioritized one; and prioritized against uniform.
// "x memcpy" is the memcpy's time over the buffer's: 1 is memcpy's speed.
// Python's buffer (torchrl's TensorDictReplayBuffer over LazyTensorStorage, or
// where torchrl is not importable tensordict's td[idx] = batch / td[idx], or
// torch's per-leaf indexing) runs in a python3 child where torch is importable.
//   build/bench/bench_replay_buffer [rows, default 1000000] [folder for the memmap buffer, default the temp folder]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ops/empty_like.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <tensordict/data/replay_buffer.hpp>
#include <tensordict/threads.hpp>

#include "transitions.hpp"

namespace td = tensordict;
namespace data = tensordict::data;

namespace {

using bench::row_bytes;
using bench::transitions;

// Median seconds per call of each f, taking turns, `calls` calls a turn.
std::vector<double> median_seconds(int calls, const std::vector<std::function<void()>>& fs) {
  std::vector<std::vector<double>> times(fs.size());
  for (int rep = 0; rep < 7; ++rep)
    for (std::size_t k = 0; k < fs.size(); ++k) {
      const auto start = std::chrono::steady_clock::now();
      for (int c = 0; c < calls; ++c) fs[k]();
      times[k].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls);
    }
  std::vector<double> out;
  for (auto& t : times) {
    std::sort(t.begin(), t.end());
    out.push_back(t[t.size() / 2]);
  }
  return out;
}

struct result {
  double extend1, extend256, sample256;
};

// One buffer: filled to `rows`, then extend(1), extend(256) and sample(256) each against its memcpy.
template <class Storage, class Sampler>
result measure(const char* name, std::int64_t rows, Storage storage, Sampler sampler) {
  data::ReplayBuffer buffer(std::move(storage), std::move(sampler), {.batch_size = 256});
  const std::int64_t chunk = 1 << 16;
  const td::AnyTensorDict fill = transitions(chunk);
  for (std::int64_t written = 0; written < rows; written += chunk)
    buffer.extend(written + chunk <= rows ? fill : fill.index({at::indexing::Slice(0, rows - written)}));
  const std::vector<at::Tensor> stored = buffer.storage().tensordict().values();
  const td::AnyTensorDict one = transitions(1), batch = transitions(256);
  const std::vector<at::Tensor> one_leaves = one.values(), batch_leaves = batch.values();

  std::int64_t cursor = 0;
  auto copy_in = [&](const std::vector<at::Tensor>& source, std::int64_t n) {
    if (cursor + n > rows) cursor = 0;
    for (std::size_t k = 0; k < stored.size(); ++k) {
      const std::int64_t row = source[k].nbytes() / n;
      std::memcpy(static_cast<char*>(stored[k].data_ptr()) + cursor * row, source[k].data_ptr(), source[k].nbytes());
    }
    cursor += n;
  };
  std::vector<at::Tensor> out;
  for (const auto& t : batch_leaves) out.push_back(at::empty_like(t));
  auto copy_out = [&] {
    // Rows drawn afresh each call, as the sampler's: the same rows each time would stay in cache.
    const at::Tensor drawn = at::randint(rows, {256}, at::kLong);
    const std::int64_t* index = drawn.data_ptr<std::int64_t>();
    for (std::size_t k = 0; k < stored.size(); ++k) {
      const std::int64_t row = out[k].nbytes() / 256;
      const char* from = static_cast<const char*>(stored[k].data_ptr());
      char* to = static_cast<char*>(out[k].data_ptr());
      for (std::int64_t r = 0; r < 256; ++r) std::memcpy(to + r * row, from + index[r] * row, row);
    }
  };
  const auto t1 = median_seconds(2000, {[&] { buffer.extend(one); }, [&] { copy_in(one_leaves, 1); }});
  const auto t256 = median_seconds(200, {[&] { buffer.extend(batch); }, [&] { copy_in(batch_leaves, 256); }});
  const auto ts = median_seconds(200, {[&] { (void)buffer.sample(); }, [&] { copy_out(); }});
  std::printf("%-22s extend(1) %7.2f us (%.3f x memcpy)  extend(256) %7.2f us (%.3f x memcpy)  sample(256) %7.2f us (%.3f x memcpy)\n",
              name, 1e6 * t1[0], t1[1] / t1[0], 1e6 * t256[0], t256[1] / t256[0], 1e6 * ts[0], ts[1] / ts[0]);
  return {t1[0], t256[0], ts[0]};
}

// Python's seconds per extend(256) and sample(256) of a buffer of `rows` (or nothing where python3 has no torch).
std::string python_line(std::int64_t rows) {
  const std::string script = R"PY(
import time, torch
torch.set_num_threads(1)
rows, dim = )PY" + std::to_string(rows) + R"PY(, 64
def data(n):
    return {"obs": torch.randn(n, dim), "action": torch.randint(0, 4, (n,)), "reward": torch.randn(n),
            "done": torch.zeros(n, dtype=torch.bool), "next": {"obs": torch.randn(n, dim)}}
def median(f, calls):
    times = []
    for rep in range(7):
        start = time.perf_counter()
        for c in range(calls): f()
        times.append((time.perf_counter() - start) / calls)
    return sorted(times)[3]
try:
    from tensordict import TensorDict
    from torchrl.data import TensorDictReplayBuffer, LazyTensorStorage
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(rows), batch_size=256)
    chunk = TensorDict(data(65536), batch_size=[65536])
    for i in range(0, rows, 65536): rb.extend(chunk[: min(65536, rows - i)])
    batch = TensorDict(data(256), batch_size=[256])
    e, s = median(lambda: rb.extend(batch), 200), median(lambda: rb.sample(), 200)
    what = "torchrl TensorDictReplayBuffer(LazyTensorStorage)"
except ImportError:
    try:
        from tensordict import TensorDict
        buf = TensorDict(data(rows), batch_size=[rows])
        batch = TensorDict(data(256), batch_size=[256])
        def write(): buf[torch.arange(256)] = batch
        def draw(): return buf[torch.randint(rows, (256,))]
        what = "tensordict td[idx] = batch / td[idx] (torchrl not importable)"
    except ImportError:
        buf, batch = data(rows), data(256)
        def write():
            idx = torch.arange(256)
            for k in ("obs", "action", "reward", "done"): buf[k][idx] = batch[k]
            buf["next"]["obs"][idx] = batch["next"]["obs"]
        def draw():
            idx = torch.randint(rows, (256,))
            return {k: buf[k][idx] for k in ("obs", "action", "reward", "done")}, buf["next"]["obs"][idx]
        what = "torch per-leaf indexing (tensordict not importable)"
    e, s = median(write, 200), median(draw, 200)
print(e, s, what)
)PY";
  FILE* pipe = ::popen(("python3 -c '" + script + "' 2>/dev/null").c_str(), "r");
  if (!pipe) return {};
  char line[512] = {0}, last[512] = {0};
  while (std::fgets(line, sizeof line, pipe) != nullptr) std::memcpy(last, line, sizeof line);
  if (::pclose(pipe) != 0 || last[0] == 0) return {};
  return last;
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t rows = argc > 1 ? std::atoll(argv[1]) : 1'000'000;
  const std::filesystem::path folder = argc > 2 ? argv[2] : std::filesystem::temp_directory_path().string();
  td::set_num_threads(1);
  at::manual_seed(0);
  std::printf("replay buffer of %lld rows of %lld bytes (5 leaves), one thread; medians of 7 turns\n", static_cast<long long>(rows),
              static_cast<long long>(row_bytes(transitions(1))));
  const std::string scratch = (folder / ("bench_replay_buffer_" + std::to_string(::getpid()))).string();
  const result memory = measure("memory, uniform", rows, data::LazyTensorStorage(rows), data::RandomSampler());
  const result prioritized =
      measure("memory, prioritized", rows, data::LazyTensorStorage(rows), data::PrioritizedSampler(rows, 0.7, 0.5));
  const result memmap = measure("memmap, uniform", rows, data::LazyMemmapStorage(rows, scratch + "_u"), data::RandomSampler());
  measure("memmap, prioritized", rows, data::LazyMemmapStorage(rows, scratch + "_p"), data::PrioritizedSampler(rows, 0.7, 0.5));
  std::filesystem::remove_all(scratch + "_u");
  std::filesystem::remove_all(scratch + "_p");
  std::printf("prioritized / uniform (memory): extend(1) %.2f, extend(256) %.2f, sample(256) %.2f; memmap / memory (uniform): "
              "extend(256) %.2f, sample(256) %.2f\n",
              prioritized.extend1 / memory.extend1, prioritized.extend256 / memory.extend256, prioritized.sample256 / memory.sample256,
              memmap.extend256 / memory.extend256, memmap.sample256 / memory.sample256);
  const std::string python = python_line(rows);
  if (python.empty()) {
    std::printf("python: python3 with torch not found, no Python comparison\n");
    return 0;
  }
  char* rest = nullptr;
  const double extend = std::strtod(python.c_str(), &rest);
  const double sample = std::strtod(rest, &rest);
  std::string what(rest);
  what.erase(0, what.find_first_not_of(' '));
  if (!what.empty() && what.back() == '\n') what.pop_back();
  std::printf("python (%s): extend(256) %.2f us, sample(256) %.2f us; ours (memory, uniform) %.2fx and %.2fx faster\n", what.c_str(),
              1e6 * extend, 1e6 * sample, extend / memory.extend256, sample / memory.sample256);
  return 0;
}
