// The tests that share modules, TensorDicts, files or generators between
// threads: run in the unit suite and, built on their own, under
// ThreadSanitizer (the sanitize suite).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "catch_torch.hpp"
#include "test_helpers.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/arange.h>

#include <tensordict/files/torch_save.hpp>
#include <tensordict/functional.hpp>
#include <tensordict/files/memmap.hpp>
#include <tensordict/files/safetensors.hpp>
#include <tensordict/vmap.hpp>
#include <tensordict/data/replay_buffer.hpp>
#include <tensordict/threads.hpp>
#include <tensordict/cpu_cache.hpp>
#include <tensordict/detail/kernels/parallel_sets.hpp>

using namespace tensordict;
namespace tdn = tensordict::nn;
using test::debris;
using test::temporary_dir;

namespace {
using mlp_t = tdn::Sequential<torch::nn::Linear, torch::nn::ReLU, torch::nn::Linear>;
mlp_t make_mlp() { return mlp_t(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 1)); }

// A user module without a functional form: functional_call swaps its tensors in.
struct ScaledImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  at::Tensor scale;
  ScaledImpl() {
    fc = register_module("fc", torch::nn::Linear(3, 2));
    scale = register_parameter("scale", at::ones({2}));
  }
  at::Tensor forward(const at::Tensor& x) { return fc->forward(x) * scale; }
};
TORCH_MODULE(Scaled);
}  // namespace
TENSORDICT_MODULE(ScaledImpl, fc, scale);

namespace {
// Calls functional_call from two threads, 2000 times each with its own parameters; counts results
// that differ from the serial ones.
template <class Net>
int wrong_results_from_two_threads(Net& net, const at::Tensor& x) {
  auto a = from_module(net).detach().clone();
  auto b = a.apply([](const at::Tensor& t) { return t * -3; });
  const at::Tensor expected_a = functional_call(net, a, x);
  const at::Tensor expected_b = functional_call(net, b, x);
  REQUIRE(!expected_a.allclose(expected_b));
  std::atomic<int> wrong{0};
  auto worker = [&](const auto& params, const at::Tensor& expected) {
    for (int i = 0; i < 2000; ++i)
      if (!functional_call(net, params, x).equal(expected)) ++wrong;
  };
  std::thread t1([&] { worker(a, expected_a); });
  std::thread t2([&] { worker(b, expected_b); });
  t1.join();
  t2.join();
  return wrong;
}
}  // namespace

namespace {
struct ShiftImpl : torch::nn::Module {
  at::Tensor shift;
  ShiftImpl() { shift = register_parameter("shift", at::ones({2})); }
  at::Tensor forward(const at::Tensor& x) { return x + shift; }
};
TORCH_MODULE(Shift);
}  // namespace
TENSORDICT_MODULE(ShiftImpl, shift);

template <>
struct tensordict::nn::functional<ShiftImpl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const ShiftImpl&, const TensorDict<schema_of<ShiftImpl>>& p, const at::Tensor& x) {
    return x + p.leaf(0);
  }
};

TEST_CASE("functional_call is safe from two threads on one module", "[threads]") {
  auto net = make_mlp();
  CHECK(wrong_results_from_two_threads(net, at::randn({5, 3})) == 0);
}

TEST_CASE("functional_call on a Sequential with a user module: which calls touch the module, and threads", "[threads]") {
  // Issue 12, defect 3: the README said the typed Sequential never touches the module, but a child
  // without a functional form had its tensors swapped in, unguarded.
  using swapped_t = tdn::Sequential<torch::nn::Linear, Scaled>;
  using pure_t = tdn::Sequential<torch::nn::Linear, Shift>;
  STATIC_REQUIRE(tdn::touches_module_v<swapped_t::Impl>);
  STATIC_REQUIRE_FALSE(tdn::touches_module_v<pure_t::Impl>);
  STATIC_REQUIRE_FALSE(tdn::touches_module_v<mlp_t::Impl>);
  STATIC_REQUIRE_FALSE(tdn::touches_module_v<torch::nn::BatchNorm1dImpl>);

  const auto x = at::randn({5, 3});
  swapped_t swapped(torch::nn::Linear(3, 3), Scaled());
  const at::Tensor own = swapped->forward(x);
  CHECK(wrong_results_from_two_threads(swapped, x) == 0);  // serialized by the swap lock
  CHECK(swapped->forward(x).equal(own));                   // the module's own tensors again
  pure_t pure(torch::nn::Linear(3, 2), Shift());
  CHECK(wrong_results_from_two_threads(pure, x) == 0);
}

TEST_CASE("functional_call of BatchNorm in training from two threads, each with its statistics", "[threads]") {
  torch::nn::BatchNorm1d bn(4);
  const auto x = at::randn({8, 4});
  const auto start = from_module(bn).detach().clone();
  auto serial = start.clone();
  for (int i = 0; i < 200; ++i) (void)functional_call(bn, serial, x);
  auto first = start.clone(), second = start.clone();
  auto worker = [&](TensorDict<tdn::schema_of<torch::nn::BatchNorm1dImpl>>& stats) {
    for (int i = 0; i < 200; ++i) (void)functional_call(bn, stats, x);
  };
  std::thread t1(worker, std::ref(first));
  std::thread t2(worker, std::ref(second));
  t1.join();
  t2.join();
  CHECK((first == serial).all());
  CHECK((second == serial).all());
  CHECK(bn->num_batches_tracked.item<std::int64_t>() == 0);  // the module's own statistics are untouched
  CHECK(bn->running_mean.eq(0).all().item<bool>());
}

TEST_CASE("randomness same with chunks while another thread draws from the generator", "[threads]") {
  // Issue 12, defect 8: each chunk re-set the CPU generator's state without its mutex, racing with
  // other threads' draws (a data race that the TSan suite reports). The replay now takes the mutex
  // of the inputs' device's generator; another thread's draws may still fall between two chunks,
  // so this checks only that both sides run (under TSan: without a race).
  auto x = at::ones({4, 100});
  auto drop = [](const at::Tensor& v) { return at::dropout(v, 0.5, true); };
  std::atomic<bool> done{false};
  std::thread other([&] {
    while (!done) (void)at::rand({16});
  });
  for (int i = 0; i < 50; ++i) {
    auto out = vmap(drop, {}, {.randomness = randomness::same, .chunk_size = 1})(x);
    CHECK(out.sizes() == c10::IntArrayRef{4, 100});
  }
  done = true;
  other.join();
  auto alone = vmap(drop, {}, {.randomness = randomness::same, .chunk_size = 1})(x);
  CHECK(alone[0].equal(alone[3]));
}

TEST_CASE("saves replace a file keeping its mode, write through symbolic links, and race safely", "[threads]") {
  temporary_dir dir("replace");
  AnyTensorDict one, two;
  one.set("w", at::full({8}, 1.0));
  two.set("w", at::full({8}, 2.0));
  const std::string path = dir / "private.pt";
  save(one, path);
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  save(two, path);
  CHECK(std::filesystem::status(path).permissions() ==
        (std::filesystem::perms::owner_read | std::filesystem::perms::owner_write));
  save_safetensors(one, path + ".safetensors");
  std::filesystem::permissions(path + ".safetensors", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  save_safetensors(two, path + ".safetensors");
  CHECK(std::filesystem::status(path + ".safetensors").permissions() ==
        (std::filesystem::perms::owner_read | std::filesystem::perms::owner_write));

  std::filesystem::create_directory(dir / "ckpt");
  save(one, dir / "ckpt/epoch1.pt");
  std::filesystem::create_symlink("ckpt/epoch1.pt", dir / "latest.pt");
  save(two, dir / "latest.pt");
  CHECK(std::filesystem::is_symlink(dir / "latest.pt"));
  CHECK((load(dir / "ckpt/epoch1.pt") == two).all());

  // Two threads saving one path: every save succeeds and the file is always whole.
  std::atomic<int> failures{0};
  auto saver = [&](const AnyTensorDict& what) {
    for (int i = 0; i < 20; ++i) try {
        save(what, dir / "raced.pt");
        save_memmap(what, dir / "raced");
      } catch (const std::exception&) {
        ++failures;
      }
  };
  std::thread a(saver, one), b(saver, two);
  a.join();
  b.join();
  CHECK(failures == 0);
  const auto raced = load(dir / "raced.pt", {.verify_checksums = true});
  CHECK(((raced == one).all() || (raced == two).all()));
  const auto raced_dir = load_memmap(dir / "raced");
  CHECK(((raced_dir == one).all() || (raced_dir == two).all()));
  CHECK(debris(dir.path).empty());
}

TEST_CASE("a collector thread extends a replay buffer while the learner samples and updates priorities", "[threads]") {
  // TorchRL's pattern: the buffer's lock orders extend, sample and update_priority; rows are
  // never seen half written (each row's columns hold the same transition number).
  const temporary_dir dir("threads_replay_buffer");
  namespace data = tensordict::data;
  data::ReplayBuffer buffer(data::LazyMemmapStorage(64, dir / "buffer"), data::PrioritizedSampler(64, 0.6, 0.4),
                            {.batch_size = 16});
  auto transitions = [](std::int64_t first, std::int64_t n) {
    const at::Tensor id = at::arange(first, first + n, at::kLong);
    AnyTensorDict td({n});
    td.set({"obs"}, id.to(at::kFloat).unsqueeze(1).expand({n, 8}).contiguous());
    td.set({"action"}, id.clone());
    return td;
  };
  buffer.extend(transitions(0, 4));
  constexpr std::int64_t batches = 200, per_batch = 3;
  std::thread collector([&] {
    for (std::int64_t b = 0; b < batches; ++b) buffer.extend(transitions(4 + b * per_batch, per_batch));
  });
  bool consistent = true;
  for (int step = 0; step < 200; ++step) {
    AnyTensorDict batch = buffer.sample();
    consistent = consistent && batch.get({"obs"}).select(1, 7).to(at::kLong).equal(batch.get({"action"}));
    batch.set({"td_error"}, at::rand({16}) + 0.1);
    buffer.update_tensordict_priority(batch);
  }
  collector.join();
  CHECK(consistent);
  CHECK(buffer.write_count() == 4 + batches * per_batch);
  CHECK(buffer.size() == 64);
}

TEST_CASE("set_num_threads sets libtorch's intra-op threads and OpenBLAS's", "[threads]") {
  const int before = at::get_num_threads(), blas_before = tensordict::blas_num_threads();
  tensordict::set_num_threads(1);
  CHECK(at::get_num_threads() == 1);
  // 0: the BLAS libblas.so.3 points to is not OpenBLAS (the reference BLAS has no threads).
  CHECK(tensordict::blas_num_threads() <= 1);
  tensordict::set_num_threads(2);
  CHECK(at::get_num_threads() == 2);
  CHECK(tensordict::blas_num_threads() <= 1);  // OpenBLAS's pool stays at one: its threads would spin against OpenMP's
  if (blas_before > 0) {
    tensordict::set_num_threads(2, 2);
    CHECK(tensordict::blas_num_threads() == 2);
  }
  CHECK_THROWS_WITH(tensordict::set_num_threads(0), test::Contains("n must be at least 1, got 0"));
  CHECK_THROWS_WITH(tensordict::set_num_threads(3, 0), test::Contains("blas_threads must be at least 1, got 0"));
  CHECK(at::get_num_threads() == 2);  // a refused call changes nothing
  if (blas_before > 0) CHECK(tensordict::blas_num_threads() == 2);
  tensordict::set_num_threads(before, std::max(blas_before, 1));
  if (blas_before > 0) CHECK(tensordict::blas_num_threads() == blas_before);
}

// The helper threads of a Linear run's groups: every body once, on helpers that may start late.
TEST_CASE("for_each_claimed runs every body once, with the caller's state, waiting only for begun bodies", "[threads]") {
  for (const int threads : {1, 2, 4}) {
    INFO(threads << " threads");
    std::vector<std::atomic<int>> runs(257);
    at::AutoGradMode off(false);  // the caller's grad mode reaches the helpers
    std::atomic<bool> grad_mode_seen{false};
    tensordict::detail::for_each_claimed(257, threads, [&](std::int64_t i) {
      runs[static_cast<std::size_t>(i)].fetch_add(1);
      if (at::GradMode::is_enabled()) grad_mode_seen = true;
      if (i % 64 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    CHECK(std::all_of(runs.begin(), runs.end(), [](const std::atomic<int>& r) { return r.load() == 1; }));
    CHECK_FALSE(grad_mode_seen.load());
  }
  // A body's exception reaches the caller after the other begun bodies end; nested calls run inline.
  std::atomic<int> ran{0};
  CHECK_THROWS_WITH(tensordict::detail::for_each_claimed(16, 2,
                                                          [&](std::int64_t i) {
                                                            tensordict::detail::for_each_claimed(4, 2, [&](std::int64_t) { ran.fetch_add(1); });
                                                            if (i == 5) throw tensordict::value_error("body 5 failed");
                                                          }),
                    test::Contains("body 5 failed"));
  CHECK(ran.load() == 64);
  // Many short calls back to back: a helper waking for an old call finds it done.
  std::atomic<std::int64_t> sum{0};
  for (int call = 0; call < 2000; ++call) tensordict::detail::for_each_claimed(3, 2, [&](std::int64_t i) { sum.fetch_add(i + 1); });
  CHECK(sum.load() == 2000 * 6);
}

TEST_CASE("the CPU cache serves threads that free each other's blocks", "[threads]") {
  // (priority 100: test_functional_vmap.cpp's counting allocator may have run in this process)
  tensordict::cache_cpu_allocations({.max_cached_bytes = 4 << 20, .max_block_bytes = 1 << 20, .priority = 100});
  // Each thread fills tensors and checks them; then each one's kept half is freed on another thread.
  std::vector<at::Tensor> handed[2];
  std::atomic<bool> intact{true};
  auto work = [&](int me) {
    std::vector<at::Tensor> mine;
    for (int round = 0; round < 200; ++round) {
      const at::Tensor t = at::full({64 + 16 * (round % 5)}, static_cast<double>(me * 1000 + round));
      const at::Tensor twice = t * 2;  // an op's output from the cache too
      if (!twice.eq(2.0 * (me * 1000 + round)).all().item<bool>()) intact = false;
      if (round % 2 == 0) mine.push_back(t);
    }
    handed[me] = std::move(mine);
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  std::thread free_a([&] { handed[0].clear(); }), free_b([&] { handed[1].clear(); });
  free_a.join();
  free_b.join();
  CHECK(intact);
  const auto stats = tensordict::cpu_cache_stats();
  tensordict::stop_caching_cpu_allocations();
  CHECK(stats.reused > 0);
  CHECK(tensordict::cpu_cache_stats().cached_bytes == 0);
}
