// A 3-module policy (MLP 8-64-64-8 -> NormalParamExtractor -> Normal with its
// log-probability, mode) called through TensorDictSequential against the same
// modules called by hand on tensors, at batch 256 and 1, inference and with
// autograd recording. Prints the ratio of median times over interleaved
// passes measured in this one run (absolute times on a shared machine are
// noise). Goal (issue 28): at most 1.05x at batch 256. bench/python/policy.py
// times Python's same policy (tensordict's, where it is importable).
//   build/bench/bench_policy
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/randn.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/version.h>
#include <tensordict/tensordict.hpp>

#include "blas_settings.hpp"

namespace td = tensordict;
namespace tdn = tensordict::nn;
using torch::nn::Linear;
using torch::nn::Tanh;

namespace {
template <class T>
inline void keep(const T& value) {
  asm volatile("" : : "r,m"(value) : "memory");
}

template <class F>
double us_per_call(F&& f, int calls) {
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / calls;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

using mlp = tdn::Sequential<Linear, Tanh, Linear, Tanh, Linear>;
using net_t = tdn::TensorDictModule<mlp, tdn::in_keys<"observation">, tdn::out_keys<"param">>;
using extractor_t = tdn::TensorDictModule<tdn::NormalParamExtractor, tdn::in_keys<"param">, tdn::out_keys<"loc", "scale">>;
using head_t = tdn::ProbabilisticTensorDictModule<tdn::Normal, tdn::in_keys<"loc", "scale">, tdn::out_keys<"action">,
                                                  tdn::log_prob_key<"sample_log_prob">>;
using policy_t = tdn::TensorDictSequential<net_t, extractor_t, head_t>;
}  // namespace

int main(int, char** argv) {
  bench::run_again_with_bench_settings(argv);
  std::printf("libtorch %s, compiler %s, 1 intra-op thread\n", TORCH_VERSION, __VERSION__);
  at::set_num_threads(1);
  policy_t policy(net_t(mlp(Linear(8, 64), Tanh(), Linear(64, 64), Tanh(), Linear(64, 8))),
                  extractor_t(tdn::NormalParamExtractor()), head_t());
  mlp& net = policy->child<0>()->module;
  tdn::NormalParamExtractor& extractor = policy->child<1>()->module;

  for (const int64_t batch : {256, 1}) {
    for (const bool grad : {false, true}) {
      c10::AutoGradMode mode(grad);
      const at::Tensor obs = at::randn({batch, 8});
      const td::TensorDict<td::schema<td::leaf<"observation">>> input({obs}, {batch});
      auto through_sequence = [&] { keep(policy(input)); };
      auto by_hand = [&] {
        const at::Tensor param = net->forward(obs);
        const auto [loc, scale] = extractor->forward(param);
        const tdn::Normal dist(loc, scale);
        const at::Tensor action = dist.mode();
        keep(action);
        keep(dist.log_prob(action));
      };
      const int calls = batch == 1 ? 2000 : 500;
      std::vector<double> ours, hand;
      for (int pass = 0; pass < 7; ++pass) {
        ours.push_back(us_per_call(through_sequence, calls));
        hand.push_back(us_per_call(by_hand, calls));
      }
      std::printf("batch %3lld, %s: TensorDictSequential %.1f us, by hand %.1f us: %.3fx\n", static_cast<long long>(batch),
                  grad ? "autograd recording" : "inference         ", median(ours), median(hand), median(ours) / median(hand));
    }
  }
  return 0;
}
