// An ensemble of 8 MLPs trained together on a synthetic regression task:
// one EnsembleModule, one Adam optimizer over its stacked parameters, one
// lowered functional_vmap call per step. Run: build/examples/ensemble_training
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <ATen/ops/randn.h>
#include <torch/optim/adam.h>
#include <tensordict/tensordict.hpp>

namespace td = tensordict;
namespace tdn = tensordict::nn;
using torch::nn::Linear;
using torch::nn::ReLU;

using mlp = tdn::Sequential<Linear, ReLU, Linear, ReLU, Linear>;
using member_t = tdn::TensorDictModule<mlp, tdn::in_keys<"x">, tdn::out_keys<"y">>;
using data = td::schema<td::leaf<"x">>;

int main() {
  torch::manual_seed(0);
  const auto start = std::chrono::steady_clock::now();

  // y = sin(3 x0) + x1^2 / 2 + noise, 512 samples of 2 features.
  const at::Tensor x = at::randn({512, 2});
  const at::Tensor target = ((x.select(1, 0) * 3).sin() + x.select(1, 1).pow(2) / 2 + at::randn({512}) * 0.05).unsqueeze(1);
  td::TensorDict<data> batch({x}, {512});

  member_t member(mlp(Linear(2, 32), ReLU(), Linear(32, 32), ReLU(), Linear(32, 1)));
  tdn::EnsembleModule<member_t> ensemble(member, 8);
  torch::optim::Adam adam(ensemble->parameters(), torch::optim::AdamOptions(1e-2));
  std::printf("ensemble of %lld MLPs, parameters: %s\n", static_cast<long long>(ensemble->num_copies()),
              ensemble->params_td->tensordict().repr().c_str());

  const int steps = 300;
  // A live progress line on a terminal; in a log, one line per report.
  const bool terminal = isatty(STDERR_FILENO) != 0;
  for (int step = 1; step <= steps; ++step) {
    adam.zero_grad();
    at::Tensor per_member = (ensemble->forward(batch).get<"y">() - target).pow(2).mean({1, 2});  // [8]
    per_member.sum().backward();
    adam.step();
    if (terminal)
      std::fprintf(stderr, "\rtraining: step %d/%d, mean loss %.4f", step, steps, per_member.mean().item<double>());
    else if (step % 50 == 0)
      std::fprintf(stderr, "training: step %d/%d, mean loss %.4f\n", step, steps, per_member.mean().item<double>());
    if (step % 50 == 0) {
      if (terminal) std::fprintf(stderr, "\n");
      std::printf("step %3d loss per member:", step);
      for (std::int64_t m = 0; m < per_member.size(0); ++m) std::printf(" %.4f", per_member[m].item<double>());
      std::printf("\n");
    }
  }

  at::NoGradGuard no_grad;
  const at::Tensor probe = at::randn({256, 2});
  td::TensorDict<data> probe_td({probe}, {256});
  const at::Tensor predictions = ensemble->forward(probe_td).get<"y">();  // [8, 256, 1]
  const at::Tensor truth = ((probe.select(1, 0) * 3).sin() + probe.select(1, 1).pow(2) / 2).unsqueeze(1);
  std::printf("held-out MSE of the ensemble mean: %.4f\n", (predictions.mean(0) - truth).pow(2).mean().item<double>());
  std::printf("spread of predictions across members (mean std): %.4f\n", predictions.std(0).mean().item<double>());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wall time: %.2f s\n", seconds);
  return 0;
}
