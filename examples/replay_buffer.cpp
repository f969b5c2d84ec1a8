// A circular replay buffer in a memmap directory, filled by a collector thread
// while a learner thread samples from it; afterwards a fresh process loads
// the directory and finds the same values (as a learner in Python would, with
// TensorDict.load_memmap).
//
//   collector: steps 16 environments of a point-mass task, writes each step's
//              16 transitions into the buffer at its write cursor (index_put_
//              with an index tensor that wraps around the capacity)
//   learner:   samples uniform batches of 256 stored transitions and fits a
//              linear model of the dynamics (next.obs from obs and action)
//
// Run: build/examples/replay_buffer [DIR]   (DIR: the buffer's directory; a temporary one by default)
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/linalg_lstsq.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <tensordict/files/torch_save.hpp>
#include <tensordict/files/memmap.hpp>
#include <tensordict/preallocate.hpp>

namespace td = tensordict;
using at::indexing::Slice;

// One transition: the observation (position, velocity), the action (push left, none, right), the reward, the next observation.
using transition = td::schema<td::leaf<"obs">, td::leaf<"action">, td::leaf<"reward">, td::leaf<"done">,
                              td::node<"next", td::leaf<"obs">>>;

constexpr std::int64_t capacity = 4096, envs = 16, steps = 600, batch = 256;

// A point mass on a line: the action pushes it, the reward is minus its distance to 0.
td::TensorDict<transition> step(const at::Tensor& obs, std::int64_t t) {
  const at::Tensor action = at::randint(0, 3, {envs}, at::kLong);
  const at::Tensor push = (action - 1).to(at::kFloat) * 0.1;
  const at::Tensor velocity = obs.select(1, 1) * 0.9 + push;
  const at::Tensor position = obs.select(1, 0) + velocity * 0.1;
  const at::Tensor next = at::stack({position, velocity}, 1);
  const at::Tensor done = at::full({envs}, (t + 1) % 200 == 0, at::kBool);
  return td::make<transition>({envs}, td::kv<"obs">(obs), td::kv<"action">(action), td::kv<"reward">(-position.abs()),
                              td::kv<"done">(done), td::kv<"next", "obs">(next));
}

// The check a fresh process makes: `dir` holds what `expected` (a torch.save file) holds.
int verify(const std::string& dir, const std::string& expected) {
  const auto loaded = td::load_memmap<transition>(dir);
  const auto reference = td::load<transition>(expected);
  const bool same = (loaded == reference).all();
  std::cout << "fresh process (pid " << ::getpid() << "): load_memmap(\"" << dir << "\") " << loaded.batch_size() << " rows "
            << (same ? "equal" : "DIFFER FROM") << " the collector's\n";
  return same ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--verify") return verify(argv[2], argv[3]);
  const bool temporary = argc < 2;
  const std::filesystem::path dir =
      temporary ? std::filesystem::temp_directory_path() / ("replay_buffer_" + std::to_string(::getpid())) : std::filesystem::path(argv[1]);
  std::filesystem::remove_all(dir);
  at::manual_seed(0);

  // The buffer: full-size files of zeros, mapped shared (writes reach the files), locked.
  const auto sample = step(at::zeros({envs, 2}), 0)[0];
  td::TensorDict<transition> buffer = td::memmap_like(td::zeros_like(sample, {capacity}), (dir / "buffer").string());
  std::cout << "buffer: " << buffer << " in " << (dir / "buffer").string() << "\n";

  // Writes and samples hold the lock (a sample never sees a row half written);
  // `stored` says how many rows hold transitions.
  std::mutex rows;
  std::atomic<std::int64_t> stored{0}, written{0};
  std::atomic<bool> collecting{true};

  std::thread collector([&] {
    at::Tensor obs = at::randn({envs, 2});
    for (std::int64_t t = 0; t < steps; ++t) {
      const auto transitions = step(obs, t);
      const std::int64_t cursor = written.load() % capacity;
      const at::Tensor where = (at::arange(cursor, cursor + envs, at::kLong)) % capacity;
      {
        std::lock_guard<std::mutex> hold(rows);
        buffer.index_put_({where}, transitions);
      }
      written += envs;
      stored = std::min(written.load(), capacity);
      obs = transitions.get<"done">().any().item<bool>() ? at::randn({envs, 2}) : transitions.get<"next", "obs">();
    }
    collecting = false;
  });

  std::int64_t updates = 0;
  double residual = 0;
  std::thread learner([&] {
    while (collecting || updates == 0) {
      const std::int64_t n = stored.load();
      if (n < batch) {
        std::this_thread::yield();
        continue;
      }
      td::TensorDict<transition> drawn;
      {
        std::lock_guard<std::mutex> hold(rows);
        drawn = buffer.index({at::randint(0, n, {batch}, at::kLong)});  // a copy: the buffer may change after
      }
      // next.obs = [obs, action - 1, 1] @ W, fitted by least squares on the batch.
      const at::Tensor inputs = at::cat({drawn.get<"obs">(), (drawn.get<"action">() - 1).to(at::kFloat).unsqueeze(1), at::ones({batch, 1})}, 1);
      const at::Tensor targets = drawn.get<"next", "obs">();
      const at::Tensor w = std::get<0>(at::linalg_lstsq(inputs, targets));
      residual = (inputs.matmul(w) - targets).abs().max().item<double>();
      ++updates;
    }
  });
  collector.join();
  learner.join();
  std::cout << "collector: " << written.load() << " transitions written (the buffer wrapped "
            << written.load() / capacity << " times); learner: " << updates << " batches of " << batch
            << ", largest residual of the fitted dynamics " << residual << "\n";
  if (updates == 0 || residual > 1e-3) {
    std::cout << "the learner did not recover the dynamics from the buffer's rows\n";
    return 1;
  }

  // A fresh process loads the directory: it holds what this process wrote.
  const std::string expected = (dir / "expected.pt").string();
  td::save(buffer.clone(), expected);
  std::cout.flush();
  const int status = std::system(("'" + std::filesystem::read_symlink("/proc/self/exe").string() + "' --verify '" +
                                  (dir / "buffer").string() + "' '" + expected + "'").c_str());
  if (temporary) std::filesystem::remove_all(dir);
  return status == 0 ? 0 : 1;
}
