// Distributed TensorDicts on 2 processes of this machine (Gloo over loopback),
// one intra-op thread per process:
//   1. all_reduce of a 100-leaf TensorDict: coalesced (one collective per
//      dtype) against one collective per leaf;
//   2. a sharded ensemble forward: 16 MLPs in one process against 8 per
//      process on 2 processes, outputs gathered to every rank.
// Prints ratios measured in this run (medians of interleaved rounds).
// Run: build/bench/bench_distributed   (it launches its 2 ranks itself)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/randn.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <tensordict/distributed.hpp>
#include <tensordict/nn/functional_vmap.hpp>

namespace td = tensordict;
namespace dist = tensordict::distributed;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Microseconds per call of f, measured over `calls` calls after a barrier, so that both ranks start together.
double time_us(c10d::ProcessGroup& group, int calls, const std::function<void()>& f) {
  group.barrier()->wait();
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < calls; ++k) f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / calls;
}

void per_leaf_all_reduce(td::AnyTensorDict& t, c10d::ProcessGroup& group) {
  for (at::Tensor leaf : t.values()) {
    std::vector<at::Tensor> one{leaf};
    group.allreduce(one)->wait();
  }
}
}  // namespace

int main(int argc, char** argv) {
  auto options = dist::group_from_environment();
  if (!options) {
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    return dist::launch_local(2, argv, std::chrono::seconds(600));
  }
  at::set_num_threads(1);
  auto group = dist::make_process_group(*options);
  const bool report = group->getRank() == 0;
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;

  // 1. 100 leaves, 20 nested groups of 5, two sizes.
  for (std::int64_t numel : {256, 16384}) {
    td::AnyTensorDict t;
    for (int i = 0; i < 100; ++i) {
      std::string layer = "layer", leaf = "p";  // appended, not operator+: g++ 12 warns (-Wrestrict) on "x" + std::string
      layer += std::to_string(i / 5);
      leaf += std::to_string(i % 5);
      t.set(layer, leaf, at::randn({numel}));
    }
    std::vector<double> coalesced, per_leaf;
    for (int r = 0; r < rounds; ++r) {
      coalesced.push_back(time_us(*group, 20, [&] { dist::all_reduce(t, *group, c10d::ReduceOp::SUM, {.check_structure = false}); }));
      per_leaf.push_back(time_us(*group, 20, [&] { per_leaf_all_reduce(t, *group); }));
    }
    if (report)
      std::printf("all_reduce of 100 leaves of %lld floats: coalesced %.0f us, per leaf %.0f us: per_leaf/coalesced = %.1f\n",
                  static_cast<long long>(numel), median(coalesced), median(per_leaf), median(per_leaf) / median(coalesced));
  }

  // 2. 16 members of 64-256-256-16, batch 256.
  constexpr int members = 16;
  std::vector<torch::nn::Sequential> nets;
  for (int m = 0; m < members; ++m) {
    torch::manual_seed(m);
    nets.push_back(torch::nn::Sequential(torch::nn::Linear(64, 256), torch::nn::ReLU(), torch::nn::Linear(256, 256),
                                         torch::nn::ReLU(), torch::nn::Linear(256, 16)));
  }
  at::NoGradGuard no_grad;
  auto stacked = td::from_modules(nets);
  auto mine = dist::shard(stacked, *group);
  torch::manual_seed(99);
  auto x = at::randn({256, 64});
  std::vector<double> one_process, two_processes, two_no_gather;
  for (int r = 0; r < rounds; ++r) {
    // One process: rank 0 runs all members while rank 1 waits at the next barrier.
    one_process.push_back(time_us(*group, 10, [&] {
      if (report) td::nn::functional_vmap(nets[0], stacked, td::nn::args(x));
    }));
    two_processes.push_back(time_us(*group, 10, [&] {
      dist::gather_shards(td::nn::functional_vmap(nets[0], mine, td::nn::args(x)), *group, members);
    }));
    two_no_gather.push_back(time_us(*group, 10, [&] { td::nn::functional_vmap(nets[0], mine, td::nn::args(x)); }));
  }
  if (report)
    std::printf("sharded ensemble forward (16 x 64-256-256-16, batch 256): 1 process %.0f us, 2 processes %.0f us "
                "(outputs gathered): 1/2 processes = %.2f\n",
                median(one_process), median(two_processes), median(one_process) / median(two_processes));
  if (report)
    std::printf("  of which the forward of 8 members, both processes at once: %.0f us (1 process of 16 / this = %.2f)\n",
                median(two_no_gather), median(one_process) / median(two_no_gather));
  return 0;
}
