// An ensemble of 8 MLPs trained on 2 processes: each rank holds 4 members
// (its shard of the stacked parameters), trains them with functional_vmap,
// and the predictions of all 8 are gathered to every rank. Rank 0 then trains
// the same 8 members in one process with the same seeds and prints that the
// predictions agree.
// Run: build/examples/distributed_ensemble   (it launches its 2 ranks itself;
// a rank can also be started by hand with TENSORDICT_RANK, TENSORDICT_WORLD_SIZE
// and TENSORDICT_STORE set, e.g. on two machines sharing a file system)
#include <cmath>
#include <iostream>

#include <ATen/ops/linspace.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sin.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <tensordict/distributed.hpp>
#include <tensordict/nn/functional_vmap.hpp>

namespace td = tensordict;
namespace dist = tensordict::distributed;

constexpr int members = 8;
constexpr int steps = 200;
constexpr double tolerance = 1e-4;

torch::nn::Sequential make_member(int member) {
  torch::manual_seed(1000 + member);  // member m starts the same wherever it runs
  return torch::nn::Sequential(torch::nn::Linear(1, 32), torch::nn::Tanh(), torch::nn::Linear(32, 32), torch::nn::Tanh(),
                               torch::nn::Linear(32, 1));
}

// Trains the members in `params` (batch dim 0) on y = sin(3x) + noise; returns their predictions on `grid`.
at::Tensor train(const torch::nn::Sequential& shape, td::AnyTensorDict params, const at::Tensor& x, const at::Tensor& y,
                 const at::Tensor& grid) {
  torch::optim::Adam adam(params.values(), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < steps; ++step) {
    adam.zero_grad();
    // Members are independent: the sum of their losses gives each its own gradient.
    (td::nn::functional_vmap(shape, params, td::nn::args(x)) - y).pow(2).mean({1, 2}).sum().backward();
    adam.step();
  }
  at::NoGradGuard no_grad;
  return td::nn::functional_vmap(shape, params, td::nn::args(grid));
}

int main(int, char** argv) try {
  auto options = dist::group_from_environment();
  if (!options) {
    std::cout << "launching 2 ranks on this machine\n" << std::flush;
    const int status = dist::launch_local(2, argv, std::chrono::seconds(300));
    if (status != 0) std::cerr << "a rank failed with status " << status << "\n";
    return status;
  }
  at::set_num_threads(1);  // two processes share this machine's cores
  auto group = dist::make_process_group(*options);
  const int rank = group->getRank();

  std::vector<torch::nn::Sequential> nets;
  for (int m = 0; m < members; ++m) nets.push_back(make_member(m));
  torch::manual_seed(7);  // the same data on every rank
  const at::Tensor x = at::linspace(-1, 1, 64).unsqueeze(1);
  const at::Tensor y = at::sin(3 * x) + 0.05 * at::randn({64, 1});
  const at::Tensor grid = at::linspace(-1, 1, 9).unsqueeze(1);

  // This rank's members: new leaves, trained here only.
  const td::AnyTensorDict all = td::from_modules(nets);
  const auto range = dist::shard_of(members, rank, group->getSize());
  auto mine = dist::shard(all, *group).apply([](const at::Tensor& t) { return t.detach().clone().requires_grad_(); });
  std::cout << "rank " << rank << " trains members " << range.start << ".." << range.start + range.size - 1 << "\n"
            << std::flush;
  const at::Tensor local = train(nets[0], mine, x, y, grid);          // [4, 9, 1]
  const at::Tensor predictions = dist::gather_shards(local, *group, members);  // [8, 9, 1] on every rank

  if (rank == 0) {
    const at::Tensor single = train(nets[0], all.apply([](const at::Tensor& t) { return t.detach().clone().requires_grad_(); }),
                                    x, y, grid);
    const double difference = (predictions - single).abs().max().item<double>();
    std::cout << "predictions of the 8 members on 9 points: " << td::describe(predictions) << "\n";
    std::cout << "ensemble mean at x = -1, 0, 1: " << predictions.mean(0)[0].item<double>() << " "
              << predictions.mean(0)[4].item<double>() << " " << predictions.mean(0)[8].item<double>()
              << " (sin(3x): " << std::sin(-3.0) << " 0 " << std::sin(3.0) << ")\n";
    std::cout << "largest difference from a single-process run with the same seeds: " << difference
              << (difference <= tolerance ? " <= " : " > ") << tolerance << "\n";
    if (difference > tolerance) return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "distributed_ensemble: " << e.what() << "\n";
  return 1;
}
