// Indexed writes of a batch of transitions into a preallocated buffer, measured
// in one run as throughput ratios against a raw memcpy of the same bytes (each
// leaf's rows copied to the same place): index_put_ with a slice, with an
// index tensor built per write as a circular buffer does (arange; runs of
// consecutive rows are copied as one), and with rows drawn at random (a
// memcpy per row, no memcpy baseline of the same pattern), into memory and into a
// memmap directory loaded shared (memmap_like). Python's td[idx] = batch (or,
// where tensordict is not importable, torch's per-leaf t[idx] = v) runs in a
// python3 child where torch is importable, for the same rows.
//   build/bench/bench_storage [rows per batch, default 256] [folder for the memmap buffer, default the temp folder]
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

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/zeros.h>
#include <tensordict/files/memmap.hpp>
#include <tensordict/preallocate.hpp>

#include "transitions.hpp"

namespace td = tensordict;
using at::indexing::Slice;

namespace {

constexpr std::int64_t capacity = 1 << 16;
using bench::row_bytes;
using bench::transitions;

// Median seconds per call of each write(cursor), the cursor walking the
// buffer batch by batch; the writes take turns, a pass over the buffer each.
std::vector<double> median_seconds(std::int64_t rows, const std::vector<std::function<void(std::int64_t)>>& writes) {
  std::vector<std::vector<double>> times(writes.size());
  for (int rep = 0; rep < 9; ++rep) {
    for (std::size_t w = 0; w < writes.size(); ++w) {
      const int calls = static_cast<int>(capacity / rows);
      std::int64_t cursor = 0;
      const auto start = std::chrono::steady_clock::now();
      for (int c = 0; c < calls; ++c) {
        writes[w](cursor);
        cursor = (cursor + rows) % (capacity - rows + 1);
      }
      times[w].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls);
    }
  }
  std::vector<double> out;
  for (auto& t : times) {
    std::sort(t.begin(), t.end());
    out.push_back(t[t.size() / 2]);
  }
  return out;
}

// memcpy of each leaf's rows of `batch` into `buffer` at `cursor`.
void raw_copy(const std::vector<at::Tensor>& destination, const std::vector<at::Tensor>& source, std::int64_t cursor) {
  for (std::size_t k = 0; k < destination.size(); ++k) {
    const std::int64_t row = source[k].nbytes() / source[k].size(0);
    std::memcpy(static_cast<char*>(destination[k].data_ptr()) + cursor * row, source[k].data_ptr(), source[k].nbytes());
  }
}

// Python's seconds per td[idx] = batch (or per-leaf writes); negative where python3 has no torch.
double python_seconds(std::int64_t rows, std::string& what) {
  const std::string script = R"PY(
import time, torch
torch.set_num_threads(1)
capacity, rows, dim = 65536, )PY" + std::to_string(rows) +
                             R"PY(, 64
def data(n):
    return {"obs": torch.randn(n, dim), "action": torch.randint(0, 4, (n,)), "reward": torch.randn(n),
            "done": torch.zeros(n, dtype=torch.bool), "next": {"obs": torch.randn(n, dim)}}
try:
    from tensordict import TensorDict
    buf = TensorDict(data(capacity), batch_size=[capacity]).zero_()
    batch = TensorDict(data(rows), batch_size=[rows])
    def write(i): buf[i:i + rows] = batch
    what = "tensordict td[i:i+n] = batch"
except ImportError:
    buf, batch = data(capacity), data(rows)
    def write(i):
        for k in ("obs", "action", "reward", "done"): buf[k][i:i + rows] = batch[k]
        buf["next"]["obs"][i:i + rows] = batch["next"]["obs"]
    what = "torch per-leaf t[i:i+n] = v (tensordict not importable)"
times = []
for rep in range(7):
    calls, cursor = capacity // rows, 0
    start = time.perf_counter()
    for c in range(calls):
        write(cursor)
        cursor = (cursor + rows) % (capacity - rows + 1)
    times.append((time.perf_counter() - start) / calls)
print(sorted(times)[3], what)
)PY";
  FILE* pipe = ::popen(("python3 -c '" + script + "' 2>/dev/null").c_str(), "r");
  if (!pipe) return -1;
  char line[512] = {0}, last[512] = {0};
  bool got = false;
  while (std::fgets(line, sizeof line, pipe) != nullptr) {  // the result is the last line (libraries may print before it)
    std::memcpy(last, line, sizeof line);
    got = true;
  }
  std::memcpy(line, last, sizeof line);
  if (::pclose(pipe) != 0 || !got) return -1;
  char* rest = nullptr;
  const double seconds = std::strtod(line, &rest);
  what = std::string(rest + 1);
  if (!what.empty() && what.back() == '\n') what.pop_back();
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t rows = argc > 1 ? std::atoll(argv[1]) : 256;
  const std::filesystem::path folder = argc > 2 ? argv[2] : std::filesystem::temp_directory_path().string();
  at::set_num_threads(1);
  const td::AnyTensorDict batch = transitions(rows);
  const std::vector<at::Tensor> source = batch.values();
  const double bytes = static_cast<double>(row_bytes(batch) * rows);

  const std::filesystem::path dir = folder / ("bench_storage_" + std::to_string(::getpid()));
  td::AnyTensorDict in_memory = td::zeros_like(batch, {capacity});
  td::AnyTensorDict mapped = td::memmap_like(in_memory, dir.string());
  for (std::int64_t c = 0; c + rows <= capacity; c += rows) mapped.index_put_({Slice(c, c + rows)}, batch);  // pages allocated

  std::printf("indexed writes of %lld transitions (%.0f bytes each, 5 leaves) into a buffer of %lld, 1 thread\n",
              static_cast<long long>(rows), bytes / static_cast<double>(rows), static_cast<long long>(capacity));
  std::printf("%-10s %-40s %12s %12s %14s\n", "buffer", "write", "us / batch", "GB/s", "memcpy / this");
  // Rows drawn at random (built beforehand): a write of scattered rows, a memcpy per row.
  std::vector<at::Tensor> scattered;
  for (std::int64_t c = 0; c <= capacity; c += rows) scattered.push_back(at::randperm(capacity, at::kLong).slice(0, 0, rows));
  for (auto* buffer : {&in_memory, &mapped}) {
    const char* where = buffer == &in_memory ? "memory" : "memmap";
    const std::vector<at::Tensor> destination = buffer->values();
    const auto s = median_seconds(rows, {[&](std::int64_t c) { raw_copy(destination, source, c); },
                                         [&](std::int64_t c) { buffer->index_put_({Slice(c, c + rows)}, batch); },
                                         [&](std::int64_t c) {
                                           // the index a circular buffer builds
                                           buffer->index_put_({at::arange(c, c + rows, at::kLong)}, batch);
                                         },
                                         [&](std::int64_t c) { buffer->index_put_({scattered[c / rows]}, batch); }});
    const double memcpy_s = s[0], slice_s = s[1], tensor_s = s[2], scattered_s = s[3];
    const auto line = [&](const char* write, double s) {
      std::printf("%-10s %-40s %12.2f %12.2f %14.2f\n", where, write, s * 1e6, bytes / s / 1e9, memcpy_s / s);
    };
    line("memcpy of each leaf's rows", memcpy_s);
    line("index_put_({Slice(c, c + n)}, batch)", slice_s);
    line("index_put_({arange(c, c + n)}, batch)", tensor_s);
    line("index_put_({n random rows}, batch)", scattered_s);
  }
  std::string what;
  if (const double python_s = python_seconds(rows, what); python_s > 0) {
    const std::vector<at::Tensor> destination = in_memory.values();
    const auto s = median_seconds(rows, {[&](std::int64_t c) { raw_copy(destination, source, c); },
                                         [&](std::int64_t c) { in_memory.index_put_({Slice(c, c + rows)}, batch); }});
    const double memcpy_s = s[0], slice_s = s[1];
    std::printf("%-10s %-40s %12.2f %12.2f %14.2f   (Python: %s; ours / Python %.2f)\n", "memory", "Python", python_s * 1e6,
                bytes / python_s / 1e9, memcpy_s / python_s, what.c_str(), python_s / slice_s);
  } else {
    std::printf("Python: python3 with torch not found, not measured\n");
  }
  std::filesystem::remove_all(dir);
  return 0;
}
