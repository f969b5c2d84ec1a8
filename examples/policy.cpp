// A Gaussian actor and an ensemble of critics built from tensordict.nn's
// modules, trained on a point mass that must reach a target: the actor is a
// TensorDictSequential (MLP -> NormalParamExtractor -> TanhNormal), trained
// through its reparameterized samples (rsample) and the task's differentiable
// dynamics; four critics in one EnsembleModule learn each step's return to go.
// Run: build/examples/policy
#include <cstdio>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/stack.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <tensordict/from_module.hpp>
#include <tensordict/nn/distribution_params.hpp>
#include <tensordict/nn/probabilistic.hpp>
#include <tensordict/nn/tensordict_sequential.hpp>
#include <tensordict/threads.hpp>

namespace td = tensordict;
namespace tdn = tensordict::nn;
using torch::nn::Linear;
using torch::nn::Tanh;

using mlp = tdn::Sequential<Linear, Tanh, Linear, Tanh, Linear>;
mlp make_mlp(int64_t in, int64_t out) { return mlp(Linear(in, 64), Tanh(), Linear(64, 64), Tanh(), Linear(64, out)); }

// observation -> param -> (loc, scale) -> action in [-1, 1]^2 and its log-probability.
using actor_net = tdn::TensorDictModule<mlp, tdn::in_keys<"observation">, tdn::out_keys<"param">>;
using extractor = tdn::TensorDictModule<tdn::NormalParamExtractor, tdn::in_keys<"param">, tdn::out_keys<"loc", "scale">>;
using action_head = tdn::ProbabilisticTensorDictModule<tdn::TanhNormal, tdn::in_keys<"loc", "scale">, tdn::out_keys<"action">,
                                                       tdn::log_prob_key<"sample_log_prob">>;
using actor_t = tdn::TensorDictSequential<actor_net, extractor, action_head>;
// (observation, action) -> the return to go.
using critic_t = tdn::TensorDictModule<mlp, tdn::in_keys<"observation_action">, tdn::out_keys<"value">>;

constexpr int horizon = 10;
constexpr int64_t episodes = 128;  // run side by side: the TensorDicts' batch dim

struct rollout {
  at::Tensor returns;            // [episodes], differentiable in the actor's parameters
  at::Tensor log_prob;           // [episodes, horizon]
  at::Tensor observation_action; // [horizon * episodes, 6]
  at::Tensor return_to_go;       // [horizon * episodes, 1]
};

// Position p moves by 0.25 * action per step; the reward is minus the distance to the target.
rollout run(actor_t& actor, const at::Tensor& start, const at::Tensor& target) {
  at::Tensor p = start;
  std::vector<at::Tensor> rewards, log_probs, observation_actions;
  for (int t = 0; t < horizon; ++t) {
    const at::Tensor observation = at::cat({p, target - p}, -1);
    const auto out = actor(td::TensorDict<td::schema<td::leaf<"observation">>>({observation}, {episodes}));
    const at::Tensor action = out.get<"action">();
    p = p + 0.25 * action;
    rewards.push_back(-(p - target).norm(2, -1));
    log_probs.push_back(out.get<"sample_log_prob">());
    observation_actions.push_back(at::cat({observation, action}, -1).detach());
  }
  std::vector<at::Tensor> to_go(horizon);
  at::Tensor sum = at::zeros_like(rewards[0]);
  for (int t = horizon - 1; t >= 0; --t) to_go[t] = (sum = sum + rewards[t]).detach();
  return {at::stack(rewards, 1).sum(1), at::stack(log_probs, 1), at::cat(observation_actions, 0),
          at::cat(to_go, 0).unsqueeze(1)};
}

double evaluate(actor_t& actor, const at::Tensor& start, const at::Tensor& target) {
  at::NoGradGuard no_grad;
  tdn::set_interaction_type deterministic(tdn::interaction_type::deterministic);  // tanh of loc
  return run(actor, start, target).returns.mean().item<double>();
}

int main() {
  torch::manual_seed(0);
  td::set_num_threads(1);  // ops on [128, 64] tensors: a second thread (libtorch's or OpenBLAS's) costs more than it gives
  actor_t actor(actor_net(make_mlp(4, 4)), extractor(tdn::NormalParamExtractor()), action_head());
  tdn::EnsembleModule<critic_t> critics(critic_t(make_mlp(6, 1)), 4);
  torch::optim::Adam actor_adam(actor->parameters(), torch::optim::AdamOptions(3e-3));
  torch::optim::Adam critic_adam(critics->parameters(), torch::optim::AdamOptions(1e-2));
  std::printf("actor parameters: %s\n", td::from_module(actor).flatten_keys().repr().c_str());

  const at::Tensor held_out_start = at::rand({episodes, 2}) * 4 - 2, held_out_target = at::rand({episodes, 2}) * 4 - 2;
  const double before = evaluate(actor, held_out_start, held_out_target);
  std::printf("return before training: %.3f (held-out episodes, deterministic actions)\n", before);

  tdn::set_interaction_type explore(tdn::interaction_type::random);  // rsample: gradients reach the actor
  const int steps = 200;
  for (int step = 1; step <= steps; ++step) {
    const at::Tensor start = at::rand({episodes, 2}) * 4 - 2, target = at::rand({episodes, 2}) * 4 - 2;
    const rollout r = run(actor, start, target);
    // Maximize the return, keeping some entropy (minus the log-probability).
    actor_adam.zero_grad();
    (-r.returns.mean() + 0.01 * r.log_prob.sum(1).mean()).backward();
    actor_adam.step();

    critic_adam.zero_grad();
    const auto predicted = critics->forward(td::TensorDict<td::schema<td::leaf<"observation_action">>>(
                                                {r.observation_action}, {r.observation_action.size(0)}))
                               .get<"value">();  // [4, horizon * episodes, 1]
    const at::Tensor critic_loss = (predicted - r.return_to_go).pow(2).mean({1, 2});
    critic_loss.sum().backward();
    critic_adam.step();
    if (step % 50 == 0)
      std::printf("step %3d: return %.3f (sampled actions), critic loss per member %.3f %.3f %.3f %.3f\n", step,
                  r.returns.mean().item<double>(), critic_loss[0].item<double>(), critic_loss[1].item<double>(),
                  critic_loss[2].item<double>(), critic_loss[3].item<double>());
  }

  const double after = evaluate(actor, held_out_start, held_out_target);
  std::printf("return after training: %.3f (held-out episodes, deterministic actions)\n", after);
  at::NoGradGuard no_grad;
  const rollout check = run(actor, held_out_start, held_out_target);
  const auto values = critics->forward(td::TensorDict<td::schema<td::leaf<"observation_action">>>(
                                           {check.observation_action}, {check.observation_action.size(0)}))
                          .get<"value">();
  std::printf("critics on held-out steps: mean squared error %.3f, spread across members (std) %.3f\n",
              (values.mean(0) - check.return_to_go).pow(2).mean().item<double>(), values.std(0).mean().item<double>());
  if (!(after > before + 1.0)) {
    std::printf("the actor did not learn\n");
    return 1;
  }
  return 0;
}
