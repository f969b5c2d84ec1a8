// An ensemble of 8 LSTMs trained together on a synthetic sequence task: at
// each step, output the sum of the last three inputs. One EnsembleModule (its
// parameters an AnyTensorDict: an LSTM's tensors are named by its options),
// one Adam optimizer over the stacked parameters, one lowered functional_vmap
// call per step (one GEMM for the input projections of every member and
// step, one per time step for the recurrence). Run: build/examples/recurrent_ensemble
#include <chrono>
#include <cstdio>

#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/modules/rnn.h>
#include <torch/optim/adam.h>
#include <tensordict/tensordict.hpp>

namespace td = tensordict;
namespace tdn = tensordict::nn;

// The LSTM's (output, (h_n, c_n)) go to three keys.
using member_t = tdn::TensorDictModule<torch::nn::LSTM, tdn::in_keys<"x">, tdn::out_keys<"y", "h", "c">>;
using data = td::schema<td::leaf<"x">>;

namespace {
// Sequences [batch, steps, 1] of noise, and the sum of each step's last three inputs.
std::pair<at::Tensor, at::Tensor> task(std::int64_t batch, std::int64_t steps) {
  const at::Tensor x = at::randn({batch, steps, 1});
  at::Tensor target = x.clone();
  target.narrow(1, 1, steps - 1).add_(x.narrow(1, 0, steps - 1));
  target.narrow(1, 2, steps - 2).add_(x.narrow(1, 0, steps - 2));
  return {x, target};
}
}  // namespace

int main() {
  torch::manual_seed(0);
  const auto start = std::chrono::steady_clock::now();
  const auto [x, target] = task(64, 20);
  td::TensorDict<data> batch({x});

  // Hidden size 24, projected to one output per step.
  member_t member(torch::nn::LSTM(torch::nn::LSTMOptions(1, 24).proj_size(1).batch_first(true)));
  tdn::EnsembleModule<member_t> ensemble(member, 8);
  torch::optim::Adam adam(ensemble->parameters(), torch::optim::AdamOptions(2e-2));
  std::printf("ensemble of %lld LSTMs, parameters: %s\n", static_cast<long long>(ensemble->num_copies()),
              ensemble->params_td->tensordict().repr().c_str());

  const int steps = 150;
  for (int step = 1; step <= steps; ++step) {
    adam.zero_grad();
    at::Tensor per_member = (ensemble->forward(batch).get<"y">() - target).pow(2).mean({1, 2, 3});  // [8]
    per_member.sum().backward();
    adam.step();
    if (step == 1 || step % 50 == 0) {
      std::printf("step %3d loss per member:", step);
      for (std::int64_t m = 0; m < per_member.size(0); ++m) std::printf(" %.4f", per_member[m].item<double>());
      std::printf("\n");
    }
  }

  at::NoGradGuard no_grad;
  const auto [probe, truth] = task(256, 30);  // longer sequences than in training
  const at::Tensor predictions = ensemble->forward(td::TensorDict<data>({probe})).get<"y">();  // [8, 256, 30, 1]
  std::printf("held-out MSE (30 steps): members %.4f on average, their mean %.4f; a zero output %.4f\n",
              (predictions - truth).pow(2).mean().item<double>(), (predictions.mean(0) - truth).pow(2).mean().item<double>(),
              truth.pow(2).mean().item<double>());
  std::printf("spread of predictions across members (mean std): %.4f\n", predictions.std(0).mean().item<double>());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wall time: %.2f s\n", seconds);
  return 0;
}
