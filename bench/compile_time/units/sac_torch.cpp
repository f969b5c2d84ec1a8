// sac_agent.cpp's program with libtorch alone, as a user writes it without the
// library: the actor's MLP, its (loc, scale) split and tanh-normal sample by
// hand, the two critics in a loop, target critics as deep copies, a buffer of
// file-backed tensors per leaf and a checkpoint through torch::save. It is the
// floor a one-file program of this size pays for libtorch's own templates.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/ops/cat.h>
#include <ATen/ops/from_file.h>
#include <ATen/ops/min.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/serialize.h>

using torch::nn::Linear;
using torch::nn::ReLU;

torch::nn::Sequential make_mlp(int64_t in, int64_t out) {
  return torch::nn::Sequential(Linear(in, 64), ReLU(), Linear(64, 64), ReLU(), Linear(64, out));
}

constexpr int64_t capacity = 1024, batch = 128, obs_dim = 3, act_dim = 1;

struct transitions {
  at::Tensor observation, action, reward, done, next_observation;
};

// The actor's action and its log-probability: a tanh-transformed normal.
std::pair<at::Tensor, at::Tensor> act(torch::nn::Sequential& actor, const at::Tensor& observation) {
  const auto parts = actor->forward(observation).chunk(2, -1);
  const at::Tensor scale = torch::nn::functional::softplus(parts[1] + std::log(std::expm1(1.0))) + 1e-4;
  const at::Tensor pre = parts[0] + scale * at::randn_like(scale);
  const at::Tensor action = pre.tanh();
  const at::Tensor log_prob = (-((pre - parts[0]) / scale).pow(2) / 2 - scale.log() - 0.5 * std::log(2 * M_PI) -
                               (1 - action.pow(2) + 1e-6).log())
                                  .sum(-1);
  return {action, log_prob};
}

struct agent {
  torch::nn::Sequential actor = make_mlp(obs_dim, 2 * act_dim);
  std::vector<torch::nn::Sequential> critics{make_mlp(obs_dim + act_dim, 1), make_mlp(obs_dim + act_dim, 1)};
  std::vector<torch::nn::Sequential> targets;
  torch::optim::Adam actor_adam{actor->parameters(), torch::optim::AdamOptions(3e-4)};
  std::vector<at::Tensor> critic_parameters;
  std::unique_ptr<torch::optim::Adam> critic_adam;

  agent() {
    for (auto& c : critics) {
      targets.push_back(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(c->clone()));
      for (const auto& p : c->parameters()) critic_parameters.push_back(p);
    }
    critic_adam = std::make_unique<torch::optim::Adam>(critic_parameters, torch::optim::AdamOptions(3e-4));
  }

  // Both critics on (observation, action): [2, rows, 1].
  static at::Tensor q(std::vector<torch::nn::Sequential>& nets, const at::Tensor& observation, const at::Tensor& action) {
    const at::Tensor input = at::cat({observation, action}, -1);
    std::vector<at::Tensor> out;
    for (auto& n : nets) out.push_back(n->forward(input));
    return at::stack(out);
  }

  double update(const transitions& drawn, double gamma, double alpha) {
    at::Tensor target;
    {
      at::NoGradGuard no_grad;
      const auto [next_action, next_log_prob] = act(actor, drawn.next_observation);
      const at::Tensor next_q = std::get<0>(at::min(q(targets, drawn.next_observation, next_action), 0));
      target = drawn.reward + gamma * (1 - drawn.done.to(at::kFloat)) * (next_q - alpha * next_log_prob.unsqueeze(-1));
    }
    const at::Tensor critic_loss = (q(critics, drawn.observation, drawn.action) - target).pow(2).mean();
    critic_adam->zero_grad();
    critic_loss.backward();
    critic_adam->step();

    const auto [action, log_prob] = act(actor, drawn.observation);
    const at::Tensor actor_q = std::get<0>(at::min(q(critics, drawn.observation, action), 0));
    const at::Tensor actor_loss = (alpha * log_prob.unsqueeze(-1) - actor_q).mean();
    actor_adam.zero_grad();
    actor_loss.backward();
    actor_adam.step();

    at::NoGradGuard no_grad;
    for (std::size_t c = 0; c < critics.size(); ++c) {
      const auto from = critics[c]->parameters();
      auto to = targets[c]->parameters();
      for (std::size_t i = 0; i < to.size(); ++i) to[i].lerp_(from[i], 0.005);
    }
    return critic_loss.item<double>();
  }
};

// A pendulum-like toy: the action pushes the state, the reward is minus its size.
transitions step(const at::Tensor& observation, const at::Tensor& action) {
  const at::Tensor next = observation * 0.95 + at::cat({action, action, action}, -1) * 0.1;
  return {observation, action, -next.pow(2).sum(-1, true), at::zeros({observation.size(0), 1}, at::kBool), next};
}

// A leaf of the buffer: `capacity` rows in a file of its own, shared with the tensor.
at::Tensor file_backed(const std::filesystem::path& file, const at::Tensor& row) {
  std::vector<int64_t> sizes{capacity};
  for (int64_t d = 1; d < row.dim(); ++d) sizes.push_back(row.size(d));
  const int64_t count = capacity * (row.dim() > 1 ? row[0].numel() : 1);
  at::from_file(file.string(), true, count, row.options()).zero_();
  return at::from_file(file.string(), true, count, row.options()).view(sizes);
}

int main(int argc, char** argv) {
  const std::filesystem::path dir = argc > 1 ? argv[1] : (std::filesystem::temp_directory_path() / "sac_torch");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  torch::manual_seed(0);
  agent a;
  at::Tensor observation = at::randn({1, obs_dim});
  const transitions first = step(observation, at::zeros({1, act_dim}));
  transitions buffer{file_backed(dir / "observation", first.observation), file_backed(dir / "action", first.action),
                     file_backed(dir / "reward", first.reward), file_backed(dir / "done", first.done),
                     file_backed(dir / "next_observation", first.next_observation)};
  int64_t written = 0;
  double loss = 0;
  for (int t = 0; t < 600; ++t) {
    at::Tensor action;
    {
      at::NoGradGuard no_grad;
      action = act(a.actor, observation).first;
    }
    const transitions now = step(observation, action);
    const int64_t row = written % capacity;
    buffer.observation[row].copy_(now.observation[0]);
    buffer.action[row].copy_(now.action[0]);
    buffer.reward[row].copy_(now.reward[0]);
    buffer.done[row].copy_(now.done[0]);
    buffer.next_observation[row].copy_(now.next_observation[0]);
    ++written;
    observation = now.next_observation;
    if (written >= batch) {
      const at::Tensor rows = at::randint(0, std::min(written, capacity), {batch}, at::kLong);
      loss = a.update({buffer.observation.index_select(0, rows), buffer.action.index_select(0, rows),
                       buffer.reward.index_select(0, rows), buffer.done.index_select(0, rows),
                       buffer.next_observation.index_select(0, rows)},
                      0.99, 0.2);
    }
  }
  torch::save(a.actor, (dir / "actor.pt").string());
  torch::nn::Sequential reloaded = make_mlp(obs_dim, 2 * act_dim);
  torch::load(reloaded, (dir / "actor.pt").string());
  std::printf("critic loss %.4f, actor parameters %zu\n", loss, reloaded->parameters().size());
  std::filesystem::remove_all(dir);
  return 0;
}
