// Soft actor-critic (SAC) on Pendulum-v1, ported from a TorchRL script:
//   actor    MLP -> NormalParamExtractor -> TanhNormal on [-2, 2] (a TensorDictSequential)
//   critics  two Q-networks in one EnsembleModule (one lowered functional_vmap call for both),
//            target copies of their parameters moved by SoftUpdate, the smaller of the two used
//   alpha    the entropy temperature, learned towards an entropy of -1 (minus the action's dims)
//   buffer   data::ReplayBuffer over a LazyMemmapStorage (files allocated by the first write)
// Pendulum's dynamics are gym's (g = 10, dt = 0.05, torques in [-2, 2], speeds in [-8, 8],
// 200 steps an episode), computed here for `envs` pendulums side by side.
//
// Every `eval_every` frames the deterministic policy (tanh of the loc) runs from 16 fixed
// start states; the curve goes to OUT/sac_curve.csv. At the end OUT/checkpoint holds the
// actor's, critics' and target critics' parameters and log_alpha as a memmap folder Python
// reads (TensorDict.load_memmap), OUT/buffer the replay buffer as TorchRL dumps it; a fresh
// actor loaded from the checkpoint must act as the trained one.
//
// Run: build/examples/sac [--frames N] [--out DIR] [--min-gain G] [--lr LR] [--seed S]
//   --frames    environment steps (default 20000: an evaluation return of -135, 56 s here)
//   --out       where the curve, checkpoint and buffer go (default: a temporary folder, removed)
//   --min-gain  exit 1 unless the last evaluation beats the random policy's by G (default 0)
//   --lr        Adam's learning rate for actor, critics and alpha (default 1e-3); --seed S: torch's seed (0)
//   --bench N   after the random frames, N updates timed alone: microseconds per update, its GEMM FLOPs
//               against at::linear's rate on the same sizes, and the ATen ops it dispatches
//   --threads T libtorch's and OpenBLAS's threads (default 1)
//   --cpu-cache C 1 (default): freed CPU blocks reused (tensordict::cache_cpu_allocations); 0: libtorch's allocator
//   --flush-denormal F 1 (default): denormal floats computed as zero (torch.set_flush_denormal(True)); 0: kept
//   --versus E,C with --bench: Python's update in microseconds, eager and compiled (bench/python/sac_update.py
//               prints them; C may be 0: not measured), for the vs_python_eager= and vs_compiled= ratios
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/remainder.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <tensordict/data/replay_buffer.hpp>
#include <tensordict/files/memmap.hpp>
#include <tensordict/from_module.hpp>
#include <tensordict/nn/adapters/activation.hpp>
#include <tensordict/nn/adapters/linear.hpp>
#include <tensordict/nn/distribution_params.hpp>
#include <tensordict/nn/sequential.hpp>
#include <tensordict/nn/probabilistic.hpp>
#include <tensordict/nn/tensordict_sequential.hpp>
#include <tensordict/objectives/target_updates.hpp>
#include <tensordict/optim/adam.hpp>
#include <tensordict/cpu_cache.hpp>
#include <tensordict/threads.hpp>
#include <tensordict/to_module.hpp>

namespace td = tensordict;
namespace tdn = tensordict::nn;
namespace data = tensordict::data;
using torch::nn::Linear;
using torch::nn::ReLU;

using mlp = tdn::Sequential<Linear, ReLU, Linear, ReLU, Linear>;
mlp make_mlp(std::int64_t in, std::int64_t out) {
  constexpr std::int64_t hidden = 64;
  return mlp(Linear(in, hidden), ReLU(), Linear(hidden, hidden), ReLU(), Linear(hidden, out));
}

// observation -> param -> (loc, scale) -> action in [-2, 2] and its log-probability (TorchRL's ProbabilisticActor).
using actor_net = tdn::TensorDictModule<mlp, tdn::in_keys<"observation">, tdn::out_keys<"param">>;
using extractor = tdn::TensorDictModule<tdn::NormalParamExtractor, tdn::in_keys<"param">, tdn::out_keys<"loc", "scale">>;
using action_head = tdn::ProbabilisticTensorDictModule<tdn::TanhNormal, tdn::in_keys<"loc", "scale">, tdn::out_keys<"action">,
                                                       tdn::log_prob_key<"sample_log_prob">>;
using actor_t = tdn::TensorDictSequential<actor_net, extractor, action_head>;
// [observation, action] -> Q.
using critic_t = tdn::TensorDictModule<mlp, tdn::in_keys<"observation_action">, tdn::out_keys<"state_action_value">>;

using observations = td::schema<td::leaf<"observation">>;
using critic_input = td::schema<td::leaf<"observation_action">>;
// A transition as TorchRL's collectors write it: what follows the action under "next".
using transition = td::schema<td::leaf<"observation">, td::leaf<"action">,
                              td::node<"next", td::leaf<"observation">, td::leaf<"reward">, td::leaf<"done">, td::leaf<"terminated">,
                                       td::leaf<"truncated">>>;

// gym's Pendulum-v1 for n pendulums; every episode starts and ends together.
struct pendulum {
  static constexpr double max_speed = 8, max_torque = 2, dt = 0.05, g = 10, m = 1, l = 1;
  static constexpr std::int64_t episode_length = 200;  // gym's TimeLimit
  at::Tensor th, thdot;                                // [n] angle (0: upright) and angular speed
  std::int64_t t = 0;

  static pendulum random_start(std::int64_t n) {
    return {(at::rand({n}, at::kDouble) * 2 - 1) * std::numbers::pi, at::rand({n}, at::kDouble) * 2 - 1};
  }
  at::Tensor observation() const { return at::stack({th.cos(), th.sin(), thdot}, -1).to(at::kFloat); }
  // Applies torques u [n, 1]; the rewards [n].
  at::Tensor step(const at::Tensor& action) {
    const at::Tensor u = action.select(1, 0).to(at::kDouble).clamp(-max_torque, max_torque);
    const at::Tensor upright = at::remainder(th + std::numbers::pi, 2 * std::numbers::pi) - std::numbers::pi;
    const at::Tensor reward = -(upright.pow(2) + 0.1 * thdot.pow(2) + 0.001 * u.pow(2));
    thdot = (thdot + (3 * g / (2 * l) * th.sin() + 3.0 / (m * l * l) * u) * dt).clamp(-max_speed, max_speed);
    th = th + thdot * dt;
    ++t;
    return reward.to(at::kFloat);
  }
  bool episode_over() const { return t == episode_length; }
};

// 16 fixed start states: angles all around the circle, at rest.
pendulum evaluation_starts() {
  constexpr std::int64_t n = 16;
  const at::Tensor k = at::arange(n, at::kDouble);
  return {(k + 0.5) / n * 2 * std::numbers::pi - std::numbers::pi, at::zeros({n}, at::kDouble)};
}

// The mean return of full episodes from the evaluation starts; `act` maps observations [n, 3] to torques [n, 1].
template <class Act>
double evaluate(Act&& act) {
  at::NoGradGuard no_grad;
  pendulum env = evaluation_starts();
  at::Tensor total = at::zeros({env.th.size(0)});
  while (!env.episode_over()) total += env.step(act(env.observation()));
  return total.mean().item<double>();
}

at::Tensor actor_actions(actor_t& actor, const at::Tensor& observation) {
  return actor(td::TensorDict<observations>({observation}, {observation.size(0)})).get<"action">();
}

// The ATen ops one call of f dispatches, an op's own inner ops not counted again; its backward's count.
std::int64_t ops_of(const std::function<void()>& f) {
  static std::atomic<std::int64_t> seen{0};
  static thread_local int depth = 0;
  seen = 0;
  const auto handle = at::addGlobalCallback(at::RecordFunctionCallback(
                                                [](const at::RecordFunction&) -> std::unique_ptr<at::ObserverContext> {
                                                  if (depth++ == 0) ++seen;
                                                  return nullptr;
                                                },
                                                [](const at::RecordFunction&, at::ObserverContext*) { --depth; })
                                                .scopes({at::RecordScope::FUNCTION}));
  f();
  at::removeCallback(handle);
  return seen;
}

// Median seconds per call of f over 7 rounds of `calls` calls.
double median_seconds(const std::function<void()>& f, std::int64_t calls) {
  std::vector<double> rounds;
  for (int round = 0; round < 7; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (std::int64_t c = 0; c < calls; ++c) f();
    rounds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[3];
}

struct options {
  std::int64_t frames = 20000;
  std::int64_t envs = 4;                    // pendulums stepped side by side
  std::int64_t random_frames = 1000;        // uniform random actions before learning starts
  std::int64_t batch = 256;
  std::int64_t eval_every = 2000;
  double gamma = 0.99, tau = 0.005, lr = 1e-3;
  double min_gain = 0;
  std::int64_t seed = 0;
  std::int64_t bench_updates = 0;  // > 0: time that many updates after the random frames, print, stop
  int threads = 1;
  bool cpu_cache = true;
  bool flush_denormal = true;
  double python_eager_us = 0, python_compiled_us = 0;  // --versus: 0 where not measured
  std::filesystem::path out;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--frames") o.frames = std::stoll(value);
    else if (flag == "--out") o.out = value;
    else if (flag == "--min-gain") o.min_gain = std::stod(value);
    else if (flag == "--lr") o.lr = std::stod(value);
    else if (flag == "--seed") o.seed = std::stoll(value);
    else if (flag == "--bench") o.bench_updates = std::stoll(value);
    else if (flag == "--threads") o.threads = std::stoi(value);
    else if (flag == "--cpu-cache") o.cpu_cache = std::stoi(value) != 0;
    else if (flag == "--flush-denormal") o.flush_denormal = std::stoi(value) != 0;
    else if (flag == "--versus") {
      const auto comma = value.find(',');
      o.python_eager_us = std::stod(value.substr(0, comma));
      if (comma != std::string::npos) o.python_compiled_us = std::stod(value.substr(comma + 1));
    }
    else {
      std::fprintf(stderr, "unknown option %s (options: --frames N, --out DIR, --min-gain G, --lr LR, --seed S, --bench N, --threads T, --cpu-cache C, --flush-denormal F, --versus E,C)\n", flag.c_str());
      std::exit(2);
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "option %s has no value\n", argv[argc - 1]);
    std::exit(2);
  }
  return o;
}

// Multiply-adds per row of an MLP in -> 64 -> 64 -> out, and of its first layer.
constexpr std::int64_t mlp_macs(std::int64_t in, std::int64_t out) { return in * 64 + 64 * 64 + 64 * out; }

// --bench: the update alone, against the FLOP time of its GEMMs at at::linear's rate on a 64x64 layer.
template <class Update>
void bench_updates(Update& update, const options& o) {
  for (int k = 0; k < 20; ++k) update();  // warm: the optimizers' state, the allocator's blocks
  const std::int64_t ops = ops_of(update);
  const double seconds = median_seconds(update, std::max<std::int64_t>(o.bench_updates / 7, 1));
  // Per row: the next actions and the target critics (forward); the critics (forward, then
  // weight and input gradients but the first layer's input); the actor's action through the
  // critics (forward, input gradients all through the critics) and the actor's backward.
  const std::int64_t actor = mlp_macs(3, 2), critic = mlp_macs(4, 1);
  const std::int64_t macs = actor + 2 * critic                      // target
                            + 2 * critic + 2 * (2 * critic - 4 * 64)  // critics' loss
                            + actor + 2 * critic + 2 * critic + (2 * actor - 3 * 64);  // actor's loss
  const double flops = 2.0 * static_cast<double>(macs) * static_cast<double>(o.batch);
  const at::Tensor x = at::randn({o.batch, 64}), w = at::randn({64, 64}), b = at::randn({64});
  const double linear = median_seconds([&] { (void)at::linear(x, w, b); }, 2000);
  const double linear_gflops = 2.0 * static_cast<double>(o.batch) * 64 * 64 / linear / 1e9;
  std::printf("sac_update batch=%lld threads=%d cpu_cache=%d flush_denormal=%d update_us=%.1f flops=%.1fM linear_gflops=%.1f flop_time_ratio=%.1f ops=%lld "
              "us_per_op=%.2f",
              static_cast<long long>(o.batch), at::get_num_threads(), o.cpu_cache ? 1 : 0, o.flush_denormal ? 1 : 0, 1e6 * seconds, flops / 1e6, linear_gflops,
              seconds / (flops / (linear_gflops * 1e9)), static_cast<long long>(ops), 1e6 * seconds / static_cast<double>(ops));
  if (o.python_eager_us > 0) std::printf(" vs_python_eager=%.2f", o.python_eager_us / (1e6 * seconds));
  if (o.python_compiled_us > 0) std::printf(" vs_compiled=%.2f", o.python_compiled_us / (1e6 * seconds));
  std::printf("\n");
}

int main(int argc, char** argv) {
  options o = parse(argc, argv);
  const bool temporary = o.out.empty();
  if (temporary) o.out = std::filesystem::temp_directory_path() / ("sac_" + std::to_string(::getpid()));
  std::filesystem::remove_all(o.out);
  std::filesystem::create_directories(o.out);
  torch::manual_seed(static_cast<std::uint64_t>(o.seed));
  // libtorch's and OpenBLAS's threads: batch 256 and 64 units gain little from a second one.
  td::set_num_threads(o.threads);
  // Every update allocates the same ~160 tensors: reused blocks instead of malloc and free (8% of an update).
  if (o.cpu_cache) td::cache_cpu_allocations();
  // Adam's first moment of a unit that ReLU keeps dead decays by beta1 each update into the
  // denormal range and stops at the smallest denormal (0.9 x 1.4e-45 rounds back to it): a fifth
  // of the critics' hidden weights after 2000 updates, each a microcode assist in every step
  // (Adam took 6% of the update, 0.7% flushed). The flag is the calling thread's, where both the
  // update and its backward run. A parameter moves as without it unless it is itself below 1e-30
  // (a flushed moment's share of a step is under 1e-37).
  if (o.flush_denormal) at::globalContext().setFlushDenormal(true);

  actor_t actor(actor_net(make_mlp(3, 2)), extractor(tdn::NormalParamExtractor()),
                action_head({.distribution = {.low = -pendulum::max_torque, .high = pendulum::max_torque}}));
  tdn::EnsembleModule<critic_t> critics(critic_t(make_mlp(4, 1)), 2);
  // The target critics: the same architecture, called with parameters of their own.
  auto target_params = critics->params_td->tensordict().detach().clone();
  td::objectives::SoftUpdate target_update(target_params, critics->params_td->tensordict(), o.tau);
  const at::Tensor log_alpha = at::zeros({1}).requires_grad_();
  const double target_entropy = -1;  // minus the action's dims

  // torch.optim.Adam's update, one pass per parameter (torch::optim::Adam: 7 ATen ops per parameter).
  td::optim::Adam actor_adam(actor->parameters(), {.lr = o.lr});
  td::optim::Adam critic_adam(critics->parameters(), {.lr = o.lr});
  td::optim::Adam alpha_adam({log_alpha}, {.lr = o.lr});

  data::ReplayBuffer buffer(data::LazyMemmapStorage(o.frames, (o.out / "buffer" / "storage").string()), data::RandomSampler(),
                            {.batch_size = o.batch});

  // The Q-values [2, batch, 1] of both critics for `params`: the online ones (what
  // critics->forward computes), detached ones, or the targets.
  auto q_values = [&](const auto& params, const at::Tensor& observation, const at::Tensor& action) {
    const td::TensorDict<critic_input> input({at::cat({observation, action}, -1)}, {observation.size(0)});
    return tdn::functional_vmap(critics->module, params, input).template get<"state_action_value">();
  };

  // The smaller of the two critics' values [2, batch, 1]: an elementwise minimum, where libtorch's
  // min(0) opens an OpenMP region even for 256 values (beside a busy process, each one waits ms).
  auto smaller = [](const at::Tensor& q) { return at::minimum(q[0], q[1]); };

  // The last update's losses, read (one sync each) only when a report prints them.
  at::Tensor last_actor_loss, last_critic_loss;
  auto value_of = [](const at::Tensor& loss) { return loss.defined() ? loss.item<double>() : 0.0; };
  auto update = [&] {
    const auto batch = buffer.sample<transition>();
    const at::Tensor observation = batch.get<"observation">(), action = batch.get<"action">();
    const at::Tensor alpha = log_alpha.exp();
    tdn::set_interaction_type explore(tdn::interaction_type::random);  // rsample

    // Critics: towards r + gamma (min of the target critics - alpha log pi) at the next state.
    at::Tensor target;
    {
      at::NoGradGuard no_grad;
      const auto next = actor(td::TensorDict<observations>({batch.get<"next", "observation">()}, {o.batch}));
      const at::Tensor next_q = smaller(q_values(target_params, next.get<"observation">(), next.get<"action">()));
      const at::Tensor not_terminated = 1 - batch.get<"next", "terminated">().to(at::kFloat);
      target = batch.get<"next", "reward">() +
               o.gamma * not_terminated * (next_q - alpha * next.get<"sample_log_prob">().unsqueeze(-1));
    }
    const at::Tensor critic_loss =
        0.5 * (q_values(critics->params_td->tensordict(), observation, action) - target).pow(2).mean({1, 2}).sum();

    // Actor: the smaller Q of its own reparameterized action, minus alpha log pi; the
    // critics' parameters detached so that this loss moves the actor alone.
    const auto now = actor(td::TensorDict<observations>({observation}, {o.batch}));
    const at::Tensor log_prob = now.get<"sample_log_prob">().unsqueeze(-1);
    const at::Tensor q = smaller(q_values(critics->params_td->tensordict().detach(), observation, now.get<"action">()));
    const at::Tensor actor_loss = (alpha.detach() * log_prob - q).mean();
    const at::Tensor alpha_loss = -(log_alpha * (log_prob.detach() + target_entropy)).mean();

    actor_adam.zero_grad();
    critic_adam.zero_grad();
    alpha_adam.zero_grad();
    (critic_loss + actor_loss + alpha_loss).backward();
    critic_adam.step();
    actor_adam.step();
    alpha_adam.step();
    target_update.step();
    last_actor_loss = actor_loss.detach();
    last_critic_loss = critic_loss.detach();
  };

  auto policy = [&](const at::Tensor& observation) {
    tdn::set_interaction_type deterministic(tdn::interaction_type::deterministic);
    return actor_actions(actor, observation);
  };
  at::Generator uniform = at::detail::createCPUGenerator(0);
  const double random_return =
      evaluate([&](const at::Tensor& observation) { return at::rand({observation.size(0), 1}, uniform) * 4 - 2; });
  const double initial_return = evaluate(policy);
  std::printf("SAC on Pendulum-v1: %lld frames from %lld pendulums, batch %lld, actor %s\n", static_cast<long long>(o.frames),
              static_cast<long long>(o.envs), static_cast<long long>(o.batch), td::from_module(actor).flatten_keys().repr().c_str());
  std::printf("evaluation return of the random policy %.1f, of the untrained actor %.1f (16 fixed starts)\n", random_return,
              initial_return);

  std::ofstream curve(o.out / "sac_curve.csv");
  curve << "frames,updates,train_return,eval_return,critic_loss,actor_loss,alpha\n";
  const bool terminal = isatty(STDERR_FILENO) != 0;
  const auto start = std::chrono::steady_clock::now();
  pendulum env = pendulum::random_start(o.envs);
  at::Tensor episode_return = at::zeros({o.envs});
  double recent_return = std::nan("");
  double eval_return = initial_return;
  std::int64_t frames = 0, updates = 0;
  while (frames < o.frames) {
    const at::Tensor observation = env.observation();
    at::Tensor action;
    if (frames < o.random_frames) {
      action = at::rand({o.envs, 1}) * 4 - 2;
    } else {
      at::NoGradGuard no_grad;
      tdn::set_interaction_type explore(tdn::interaction_type::random);
      action = actor_actions(actor, observation);
    }
    const at::Tensor reward = env.step(action);
    episode_return += reward;
    const at::Tensor done = at::full({o.envs, 1}, env.episode_over(), at::kBool);
    buffer.extend(td::make<transition>({o.envs}, td::kv<"observation">(observation), td::kv<"action">(action),
                                             td::kv<"next", "observation">(env.observation()),
                                             td::kv<"next", "reward">(reward.unsqueeze(-1)), td::kv<"next", "done">(done),
                                             td::kv<"next", "terminated">(at::zeros({o.envs, 1}, at::kBool)),
                                             td::kv<"next", "truncated">(done)));  // gym's TimeLimit: truncated, never terminated
    frames += o.envs;
    if (env.episode_over()) {
      recent_return = episode_return.mean().item<double>();
      env = pendulum::random_start(o.envs);
      episode_return.zero_();
    }
    if (o.bench_updates > 0 && frames >= o.random_frames) break;
    if (frames >= o.random_frames)
      for (std::int64_t k = 0; k < o.envs; ++k, ++updates) update();  // one update per frame

    const bool report = frames % o.eval_every == 0 || frames >= o.frames;
    if (report || (terminal && frames % 200 == 0)) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (report) eval_return = evaluate(policy);
      std::fprintf(stderr, "%sframes %lld/%lld, %.0f updates/s, recent return %.1f, evaluation %.1f, alpha %.3f%s",
                   terminal ? "\r" : "", static_cast<long long>(frames), static_cast<long long>(o.frames), updates / seconds,
                   recent_return, eval_return, log_alpha.exp().item<double>(), terminal && !report ? "" : "\n");
      if (report)
        curve << frames << ',' << updates << ',' << recent_return << ',' << eval_return << ',' << value_of(last_critic_loss) << ',' << value_of(last_actor_loss)
              << ',' << log_alpha.exp().item<double>() << '\n';
    }
  }
  curve.close();
  if (o.bench_updates > 0) {
    bench_updates(update, o);
    if (temporary) std::filesystem::remove_all(o.out);
    return 0;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("trained: %lld frames, %lld updates in %.1f s (%.0f us an update with its frame); evaluation return %.1f "
              "(random policy %.1f)\n",
              static_cast<long long>(frames), static_cast<long long>(updates), seconds, 1e6 * seconds / std::max<std::int64_t>(updates, 1),
              eval_return, random_return);

  // The checkpoint: one memmap folder, read in Python with TensorDict.load_memmap(OUT + "/checkpoint").
  td::AnyTensorDict checkpoint;
  checkpoint.set({"actor"}, td::AnyTensorDict(td::from_module(actor)));
  checkpoint.set({"critics"}, td::AnyTensorDict(critics->params_td->tensordict()));
  checkpoint.set({"target_critics"}, td::AnyTensorDict(target_params));
  checkpoint.set({"log_alpha"}, log_alpha.detach());
  td::save_memmap(checkpoint, (o.out / "checkpoint").string());
  buffer.dumps((o.out / "buffer").string());  // onto the storage's own folder: the metadata alone

  // A fresh actor loaded from the checkpoint acts as the trained one.
  actor_t restored(actor_net(make_mlp(3, 2)), extractor(tdn::NormalParamExtractor()),
                   action_head({.distribution = {.low = -pendulum::max_torque, .high = pendulum::max_torque}}));
  td::to_module_(td::load_memmap((o.out / "checkpoint").string()).get_tensordict({"actor"}), restored);
  const at::Tensor probe = evaluation_starts().observation();
  tdn::set_interaction_type deterministic(tdn::interaction_type::deterministic);
  at::NoGradGuard no_grad;
  const bool same = actor_actions(restored, probe).equal(actor_actions(actor, probe));
  std::printf("checkpoint %s: a fresh actor loaded from it acts %s; curve in %s, buffer (%lld rows) in %s\n",
              (o.out / "checkpoint").c_str(), same ? "as the trained one" : "DIFFERENTLY", (o.out / "sac_curve.csv").c_str(),
              static_cast<long long>(buffer.size()), (o.out / "buffer").c_str());
  if (temporary) std::filesystem::remove_all(o.out);
  if (!same) return 1;
  if (!(eval_return > random_return + o.min_gain)) {
    std::printf("the agent did not learn: evaluation return %.1f, random policy %.1f, required gain %.1f\n", eval_return,
                random_return, o.min_gain);
    return 1;
  }
  return 0;
}
