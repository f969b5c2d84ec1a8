// A replay buffer of RL transitions, each a plain struct that is also a typed
// TensorDict (Python's @tensorclass): collect steps, stack them into a buffer,
// sample a batch by index, move it to the training device, save and load it.
// Run: build/examples/tensorclass
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <vector>

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <tensordict/files/safetensors.hpp>
#include <tensordict/tensorclass.hpp>

namespace td = tensordict;

struct Next {
  at::Tensor obs, reward, done;
  TENSORDICT_TENSORCLASS(Next, obs, reward, done)
};

struct Transition {
  at::Tensor obs, action;
  Next next;
  TENSORDICT_TENSORCLASS(Transition, obs, action, next)
};

int main() {
  constexpr std::int64_t envs = 4, obs_dim = 3, steps = 50, batch = 32;

  // Collect: one Transition per step, for `envs` environments at once (batch_size [envs]).
  std::vector<Transition> collected;
  at::Tensor obs = at::randn({envs, obs_dim});
  for (std::int64_t s = 0; s < steps; ++s) {
    at::Tensor action = at::randint(0, 2, {envs});
    at::Tensor next_obs = obs + action.unsqueeze(-1).to(at::kFloat) - 0.5;
    collected.push_back(Transition{.obs = obs,
                                   .action = action,
                                   .next = {.obs = next_obs, .reward = -next_obs.norm(2, {1}), .done = at::zeros({envs}, at::kBool)},
                                   .batch_size = {envs}});
    obs = next_obs;
  }

  // The buffer: every step stacked, then the (step, env) dims flattened into one.
  Transition buffer = Transition::from_tensordict(td::stack(collected).to_tensordict().flatten(0, 1));
  std::cout << "buffer: " << buffer.to_tensordict() << "\n";

  // Sample a batch by index and move it where training runs.
  const at::Device device = at::hasCUDA() ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  at::Tensor picks = at::randint(0, steps * envs, {batch});
  Transition sample = buffer.index({picks}).to(device);
  std::cout << "sample: " << sample.to_tensordict() << "\n";

  // The sample's fields are the buffer's rows.
  const std::int64_t row = picks[3].item<std::int64_t>();
  const bool same = sample.next.reward[3].cpu().equal(buffer.next.reward[row]) && sample.obs[3].cpu().equal(buffer.obs[row]);
  std::cout << "sample row 3 is buffer row " << row << ": " << (same ? "yes" : "NO") << "\n";

  // Save the buffer as safetensors (flat "next.reward" names) and load it back.
  const auto path = std::filesystem::temp_directory_path() / "tensorclass_buffer.safetensors";
  td::save_safetensors(buffer.to_tensordict(), path);
  Transition loaded = Transition::from_tensordict(td::load_safetensors<Transition::schema_t>(path).apply(
      [](const at::Tensor& t) { return t; }, buffer.batch_size));
  std::filesystem::remove(path);
  const bool round_trip = loaded.next.obs.equal(buffer.next.obs) && loaded.action.equal(buffer.action);
  std::cout << "saved and loaded " << loaded.to_tensordict().keys().size() << " leaves: " << (round_trip ? "equal" : "DIFFERENT") << "\n";
  return same && round_trip ? 0 : 1;
}
