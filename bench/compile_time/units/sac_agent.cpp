// A SAC-like agent in one file, as a user ports one from Python: typed
// TensorDicts, a tensordict.nn actor (MLP -> NormalParamExtractor ->
// TanhNormal), two critics stacked and called through functional_vmap, target
// critics updated with lerp_, a buffer written through to a memmap folder, and
// a checkpoint Python's torch.load reads. The compile-time units time this file.
#include <cstdio>
#include <filesystem>
#include <string>

#include <ATen/ops/cat.h>
#include <ATen/ops/min.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <tensordict/files/memmap.hpp>
#include <tensordict/files/torch_save.hpp>
#include <tensordict/from_modules.hpp>
#include <tensordict/nn/distribution_params.hpp>
#include <tensordict/nn/functional_vmap.hpp>
#include <tensordict/nn/params.hpp>
#include <tensordict/nn/probabilistic.hpp>
#include <tensordict/nn/tensordict_sequential.hpp>
#include <tensordict/preallocate.hpp>

namespace td = tensordict;
namespace tdn = tensordict::nn;
using torch::nn::Linear;
using torch::nn::ReLU;

using mlp = tdn::Sequential<Linear, ReLU, Linear, ReLU, Linear>;
mlp make_mlp(int64_t in, int64_t out) { return mlp(Linear(in, 64), ReLU(), Linear(64, 64), ReLU(), Linear(64, out)); }

using actor_net = tdn::TensorDictModule<mlp, tdn::in_keys<"observation">, tdn::out_keys<"param">>;
using extractor = tdn::TensorDictModule<tdn::NormalParamExtractor, tdn::in_keys<"param">, tdn::out_keys<"loc", "scale">>;
using action_head = tdn::ProbabilisticTensorDictModule<tdn::TanhNormal, tdn::in_keys<"loc", "scale">, tdn::out_keys<"action">,
                                                       tdn::log_prob_key<"sample_log_prob">>;
using actor_t = tdn::TensorDictSequential<actor_net, extractor, action_head>;

using transition = td::schema<td::leaf<"observation">, td::leaf<"action">, td::leaf<"reward">, td::leaf<"done">,
                              td::node<"next", td::leaf<"observation">>>;
using observations = td::schema<td::leaf<"observation">>;

constexpr int64_t capacity = 1024, batch = 128, obs_dim = 3, act_dim = 1;

struct agent {
  actor_t actor{actor_net(make_mlp(obs_dim, 2 * act_dim)), extractor(tdn::NormalParamExtractor()), action_head()};
  std::vector<mlp> critics{make_mlp(obs_dim + act_dim, 1), make_mlp(obs_dim + act_dim, 1)};
  decltype(td::from_modules(critics)) critic_params = td::from_modules(critics).apply([](const at::Tensor& t) {
    return t.detach().requires_grad_();
  });
  decltype(td::from_modules(critics)) target_params = critic_params.detach().clone();
  torch::optim::Adam actor_adam{actor->parameters(), torch::optim::AdamOptions(3e-4)};
  torch::optim::Adam critic_adam{critic_params.values(), torch::optim::AdamOptions(3e-4)};

  // Both critics on (observation, action): [2, rows, 1].
  at::Tensor q(const decltype(critic_params)& params, const at::Tensor& observation, const at::Tensor& action) {
    return tdn::functional_vmap(critics[0], params, tdn::args(at::cat({observation, action}, -1)));
  }

  double update(const td::TensorDict<transition>& drawn, double gamma, double alpha) {
    at::Tensor target;
    {
      at::NoGradGuard no_grad;
      const auto next = actor(td::TensorDict<observations>({drawn.get<"next", "observation">()}, {batch}));
      const at::Tensor next_q = std::get<0>(at::min(q(target_params, drawn.get<"next", "observation">(), next.get<"action">()), 0));
      target = drawn.get<"reward">() + gamma * (1 - drawn.get<"done">().to(at::kFloat)) *
                                           (next_q - alpha * next.get<"sample_log_prob">().unsqueeze(-1));
    }
    const at::Tensor critic_loss = (q(critic_params, drawn.get<"observation">(), drawn.get<"action">()) - target).pow(2).mean();
    critic_adam.zero_grad();
    critic_loss.backward();
    critic_adam.step();

    const auto now = actor(td::TensorDict<observations>({drawn.get<"observation">()}, {batch}));
    const at::Tensor actor_q = std::get<0>(at::min(q(critic_params, drawn.get<"observation">(), now.get<"action">()), 0));
    const at::Tensor actor_loss = (alpha * now.get<"sample_log_prob">().unsqueeze(-1) - actor_q).mean();
    actor_adam.zero_grad();
    actor_loss.backward();
    actor_adam.step();

    at::NoGradGuard no_grad;
    target_params.lerp_(critic_params, 0.005);
    return critic_loss.item<double>();
  }
};

// A pendulum-like toy: the action pushes the state, the reward is minus its size.
td::TensorDict<transition> step(const at::Tensor& observation, const at::Tensor& action) {
  const at::Tensor next = observation * 0.95 + at::cat({action, action, action}, -1) * 0.1;
  return td::make<transition>({observation.size(0)}, td::kv<"observation">(observation), td::kv<"action">(action),
                              td::kv<"reward">(-next.pow(2).sum(-1, true)), td::kv<"done">(at::zeros({observation.size(0), 1}, at::kBool)),
                              td::kv<"next", "observation">(next));
}

int main(int argc, char** argv) {
  const std::filesystem::path dir = argc > 1 ? argv[1] : (std::filesystem::temp_directory_path() / "sac_agent");
  std::filesystem::remove_all(dir);
  torch::manual_seed(0);
  agent a;
  tdn::set_interaction_type explore(tdn::interaction_type::random);
  at::Tensor observation = at::randn({1, obs_dim});
  auto buffer = td::memmap_like(td::zeros_like(step(observation, at::zeros({1, act_dim}))[0], {capacity}), (dir / "buffer").string());
  int64_t written = 0;
  double loss = 0;
  for (int t = 0; t < 600; ++t) {
    at::Tensor action;
    {
      at::NoGradGuard no_grad;
      action = a.actor(td::TensorDict<observations>({observation}, {1})).get<"action">();
    }
    const auto transition_now = step(observation, action);
    buffer.index_put_({at::full({1}, written % capacity, at::kLong)}, transition_now);
    ++written;
    observation = transition_now.get<"next", "observation">();
    if (written >= batch) loss = a.update(buffer.index({at::randint(0, std::min(written, capacity), {batch}, at::kLong)}), 0.99, 0.2);
  }
  td::save(td::from_module(a.actor).detach(), (dir / "actor.pt").string());
  const auto reloaded = td::load((dir / "actor.pt").string(), td::from_module(a.actor));
  std::printf("critic loss %.4f, actor leaves %zu\n", loss, reloaded.values().size());
  std::filesystem::remove_all(dir);
  return 0;
}
