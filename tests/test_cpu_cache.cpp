// tensordict::cache_cpu_allocations: freed CPU blocks reused (the same
// memory for the next tensor of that size), within their bounds, with the
// same results as libtorch's allocator, and libtorch's allocator back after.
#include "catch_torch.hpp"

#include <cstdint>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/autograd.h>

#include <tensordict/cpu_cache.hpp>

using test::Contains;

namespace {
// The priority test_functional_vmap.cpp's counting allocator registers with: libtorch's
// priorities only rise in a process, and the suite may run both files in one.
constexpr std::uint8_t priority = 100;

// Leaves libtorch's allocator as it was however a test ends.
struct caching_for_this_test {
  explicit caching_for_this_test(tensordict::CpuCacheOptions options = {}) {
    options.priority = priority;
    tensordict::cache_cpu_allocations(options);
  }
  ~caching_for_this_test() { tensordict::stop_caching_cpu_allocations(); }
};

// A two-layer network's loss and gradients at fixed inputs.
std::vector<at::Tensor> step(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2) {
  const at::Tensor loss = (x.matmul(w1).relu().matmul(w2)).pow(2).mean();
  auto grads = torch::autograd::grad({loss}, {w1, w2});
  grads.push_back(loss.detach());
  return grads;
}
}  // namespace

TEST_CASE("a freed block serves the next tensor of its size; libtorch's allocator is back after", "[cpu_cache]") {
  c10::Allocator* const before = c10::GetCPUAllocator();
  {
    caching_for_this_test cache;
    CHECK(c10::GetCPUAllocator() != before);
    const void* first = nullptr;
    {
      const at::Tensor a = at::empty({256, 64});
      first = a.data_ptr();
      CHECK(reinterpret_cast<std::uintptr_t>(first) % 64 == 0);  // libtorch's alignment
    }
    CHECK(tensordict::cpu_cache_stats().cached_bytes == 256 * 64 * 4);
    const at::Tensor b = at::empty({64, 256});  // the same bytes: the same block
    CHECK(b.data_ptr() == first);
    const auto stats = tensordict::cpu_cache_stats();
    CHECK(stats.reused == 1);
    CHECK(stats.cached_blocks == 0);
    // Above 1 KiB, sizes within 1/8 of a power of two share a class: 4000 and 4080 bytes (4096), not 4400 (4608).
    at::Tensor c = at::empty({1000});
    const void* block = c.data_ptr();
    c = at::Tensor();
    c = at::empty({1020});
    CHECK(c.data_ptr() == block);
    c = at::Tensor();
    const at::Tensor e = at::empty({1100});
    CHECK(e.data_ptr() != block);
    CHECK(tensordict::cpu_cache_stats().cached_blocks == 1);
    const at::Tensor empty = at::empty({0});  // no block at all
    CHECK(empty.numel() == 0);
  }
  CHECK(c10::GetCPUAllocator() == before);
  CHECK(tensordict::cpu_cache_stats().cached_bytes == 0);
}

TEST_CASE("tensors allocated while caching outlive the cache; blocks stay within their bounds", "[cpu_cache]") {
  at::Tensor kept;
  {
    caching_for_this_test cache({.max_cached_bytes = 1 << 20, .max_block_bytes = 512 << 10});
    kept = at::full({1000}, 3.0);
    { const at::Tensor large = at::empty({1 << 18}); }  // 1 MiB: over max_block_bytes, back to malloc
    CHECK(tensordict::cpu_cache_stats().cached_bytes == 0);
    {
      std::vector<at::Tensor> blocks;
      for (int i = 0; i < 6; ++i) blocks.push_back(at::empty({1 << 16}));  // 256 KiB each
    }
    CHECK(tensordict::cpu_cache_stats().cached_bytes == 1 << 20);  // four of the six: max_cached_bytes
    CHECK(tensordict::cpu_cache_stats().cached_blocks == 4);
    tensordict::empty_cpu_cache();
    CHECK(tensordict::cpu_cache_stats().cached_bytes == 0);
  }
  CHECK(kept.sum().item<double>() == 3000.0);
  kept = at::Tensor();  // freed after the cache stopped: to malloc
  CHECK(tensordict::cpu_cache_stats().cached_blocks == 0);
}

TEST_CASE("a training step gives the same values and gradients with the cache", "[cpu_cache]") {
  at::manual_seed(5);
  const at::Tensor x = at::randn({256, 8}), w1 = at::randn({8, 64}).requires_grad_(), w2 = at::randn({64, 4}).requires_grad_();
  const auto without = step(x, w1, w2);
  caching_for_this_test cache;
  for (int round = 0; round < 3; ++round) {  // from the second round on, every block is a reused one
    const auto with = step(x, w1, w2);
    for (std::size_t i = 0; i < with.size(); ++i) CHECK(with[i].equal(without[i]));
  }
  CHECK(tensordict::cpu_cache_stats().reused > 0);
}

TEST_CASE("cache_cpu_allocations refuses bounds that keep nothing and an allocator's higher priority, changing nothing", "[cpu_cache]") {
  c10::Allocator* const before = c10::GetCPUAllocator();
  CHECK_THROWS_AS(tensordict::cache_cpu_allocations({.max_cached_bytes = 1024, .max_block_bytes = 4096, .priority = priority}),
                  tensordict::value_error);
  CHECK_THROWS_WITH(tensordict::cache_cpu_allocations({.max_cached_bytes = 1024, .max_block_bytes = 4096, .priority = priority}),
                    Contains("max_block_bytes (4096) is larger than max_cached_bytes (1024)"));
  CHECK(c10::GetCPUAllocator() == before);
  // The allocator in place registered with a priority above the one asked for (libtorch's own is
  // registered with 0; here it was replaced with `priority`).
  c10::SetCPUAllocator(before, priority);
  CHECK_THROWS_WITH(tensordict::cache_cpu_allocations({.priority = priority - 1}),
                    Contains("registered with a priority above 99 (c10::SetCPUAllocator); give CpuCacheOptions::priority at least that one"));
  CHECK(c10::GetCPUAllocator() == before);
  CHECK(tensordict::cpu_cache_stats().cached_bytes == 0);
}
