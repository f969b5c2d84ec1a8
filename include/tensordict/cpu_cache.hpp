// Reuse of freed CPU tensor memory, as CUDA's caching allocator does on the GPU:
//
//   tensordict::cache_cpu_allocations();   // before the training loop starts its threads
//   ...                                     // at::empty and every CPU op's output reuse freed blocks
//   tensordict::stop_caching_cpu_allocations();
//
// A training step allocates the same tensors every iteration: activations,
// gradients, optimizer temporaries. libtorch's CPU allocator takes each from
// malloc and gives it back, and glibc's malloc consolidates its fast bins
// whenever a block of 64 KiB or more is freed (a [256, 64] float tensor): a
// SAC update (batch 256) spent 8% of its time in malloc and free. With the
// cache on, a freed block waits in a list of its size class and the next
// allocation of that class takes it without calling malloc.
//
// Blocks are 64-byte aligned, as libtorch's own. The cache is process-wide:
// blocks freed on one thread serve allocations on another. Memory kept is
// bounded (CpuCacheOptions); empty_cpu_cache() hands it back to malloc.
// Allocations made while the cache is on are not reported to libtorch's
// memory profiler.
#pragma once

#include <cstddef>
#include <cstdint>

#include "detail/config.hpp"
#include "errors.hpp"  // what the calls below throw

namespace tensordict {

struct CpuCacheOptions {
  // Freed bytes kept for reuse, at most; a block freed beyond them goes back to malloc.
  std::size_t max_cached_bytes = std::size_t{256} << 20;
  // Larger blocks are never kept (malloc serves those from mmap, and a step rarely repeats them).
  std::size_t max_block_bytes = std::size_t{16} << 20;
  // c10::SetCPUAllocator's priority for the cache and, when it stops, for the allocator it replaced:
  // libtorch keeps an allocator registered with a higher one (priorities only rise in a process).
  std::uint8_t priority = 0;
};

struct CpuCacheStats {
  std::size_t cached_bytes = 0;    // kept now, in blocks waiting for reuse
  std::size_t cached_blocks = 0;
  std::uint64_t reused = 0;        // allocations served from the cache since it was turned on
  std::uint64_t allocated = 0;     // allocations that called malloc since then
};

// Makes the cache libtorch's CPU allocator (c10::SetCPUAllocator: what
// at::empty and CPU kernels allocate with) and sets its bounds. Call it while
// no other thread allocates tensors (libtorch swaps the allocator without a
// lock). Calling it again changes the bounds. Throws value_error for
// max_block_bytes > max_cached_bytes and error where an allocator registered
// with a higher priority than options.priority keeps its place; either way
// nothing changes.
TENSORDICT_DECL void cache_cpu_allocations(const CpuCacheOptions& options = {});

// Gives libtorch the allocator it had before, then the cached blocks back to
// malloc. Tensors allocated while the cache was on stay valid; their blocks
// go to malloc when they are freed.
TENSORDICT_DECL void stop_caching_cpu_allocations();

// Hands every cached block back to malloc (the cache stays on).
TENSORDICT_DECL void empty_cpu_cache();

TENSORDICT_DECL CpuCacheStats cpu_cache_stats();

}  // namespace tensordict

#if TENSORDICT_DEFINITIONS
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include "detail/compat.hpp"

namespace tensordict::detail {

// Every block starts 64 bytes before the pointer a tensor gets; those bytes
// hold its size class, so that the deleter (a plain function, as libtorch's
// raw_deleter needs) knows which list the block returns to.
struct cpu_cache {
  static constexpr std::size_t alignment = 64;

  // Multiples of 64 bytes up to 1 KiB, then eight classes per power of two
  // (a block is at most 1/8 larger than asked for).
  static std::size_t size_class(std::size_t n) {
    if (n <= 1024) return (n + 63) / 64 * 64;
    std::size_t step = std::size_t{1} << (63 - __builtin_clzll(n) - 3);
    return (n + step - 1) / step * step;
  }

  std::mutex mutex;
  std::unordered_map<std::size_t, std::vector<void*>> free_blocks;  // by size class
  CpuCacheOptions options;
  std::size_t cached_bytes = 0, cached_blocks = 0;
  std::uint64_t reused = 0, allocated = 0;
  std::atomic<bool> on{false};
  c10::Allocator* previous = nullptr;
  std::uint8_t priority = 0;  // the one the cache was registered with

  // Never destroyed: a tensor freed while static objects are destroyed still finds the cache.
  static cpu_cache& instance() {
    static cpu_cache* cache = new cpu_cache;
    return *cache;
  }

  static void* block_start(void* data) { return static_cast<char*>(data) - alignment; }
  static std::size_t& class_of(void* start) { return *static_cast<std::size_t*>(start); }

  void* take(std::size_t n) {
    if (n == 0) return nullptr;
    const std::size_t size = size_class(n);
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (auto it = free_blocks.find(size); it != free_blocks.end() && !it->second.empty()) {
        void* start = it->second.back();
        it->second.pop_back();
        cached_bytes -= size;
        --cached_blocks;
        ++reused;
        return static_cast<char*>(start) + alignment;
      }
      ++allocated;
    }
    void* start = nullptr;
    if (posix_memalign(&start, alignment, size + alignment) != 0)
      throw std::bad_alloc();  // libtorch's allocator fails the same way, as c10::Error; bad_alloc says what ran out
    class_of(start) = size;
    return static_cast<char*>(start) + alignment;
  }

  static void give_back(void* data) {
    if (data == nullptr) return;
    void* start = block_start(data);
    const std::size_t size = class_of(start);
    cpu_cache& cache = instance();
    if (cache.on.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(cache.mutex);
      if (size <= cache.options.max_block_bytes && cache.cached_bytes + size <= cache.options.max_cached_bytes) {
        cache.free_blocks[size].push_back(start);
        cache.cached_bytes += size;
        ++cache.cached_blocks;
        return;
      }
    }
    std::free(start);
  }

  void release_all() {
    std::vector<void*> blocks;
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (auto& [size, list] : free_blocks) blocks.insert(blocks.end(), list.begin(), list.end());
      free_blocks.clear();
      cached_bytes = cached_blocks = 0;
    }
    for (void* start : blocks) std::free(start);
  }
};

struct cpu_cache_allocator final : c10::Allocator {
  c10::DataPtr allocate(std::size_t n) TENSORDICT_COMPAT_ALLOCATE_CONST override {
    void* data = cpu_cache::instance().take(n);
    return {data, data, &cpu_cache::give_back, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &cpu_cache::give_back; }
#if TENSORDICT_COMPAT_ALLOCATOR_COPY_DATA
  void copy_data(void* destination, const void* source, std::size_t count) const override { default_copy_data(destination, source, count); }
#endif
};

inline cpu_cache_allocator& the_cpu_cache_allocator() {
  static cpu_cache_allocator* allocator = new cpu_cache_allocator;  // never destroyed, as the cache
  return *allocator;
}

}  // namespace tensordict::detail

namespace tensordict {

TENSORDICT_DECL void cache_cpu_allocations(const CpuCacheOptions& options) {
  if (options.max_block_bytes > options.max_cached_bytes)
    throw value_error("tensordict::cache_cpu_allocations: max_block_bytes (" + std::to_string(options.max_block_bytes) +
                      ") is larger than max_cached_bytes (" + std::to_string(options.max_cached_bytes) + "): no block that size could be kept");
  auto& cache = detail::cpu_cache::instance();
  auto* ours = &detail::the_cpu_cache_allocator();
  c10::Allocator* current = c10::GetCPUAllocator();
  const bool installing = current != ours;
  if (installing) {
    c10::SetCPUAllocator(ours, options.priority);
    if (c10::GetCPUAllocator() != ours)
      throw error("tensordict::cache_cpu_allocations: libtorch kept its CPU allocator, registered with a priority above " +
                  std::to_string(options.priority) + " (c10::SetCPUAllocator); give CpuCacheOptions::priority at least that one. "
                  "The cache is not on");
  }
  bool over_bounds = false;
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    if (installing) {
      cache.previous = current;
      cache.priority = options.priority;
      cache.reused = cache.allocated = 0;
    }
    cache.options = options;
    over_bounds = cache.cached_bytes > options.max_cached_bytes;
  }
  cache.on.store(true, std::memory_order_release);
  if (over_bounds) cache.release_all();  // blocks kept beyond new, smaller bounds go back now
}

TENSORDICT_DECL void stop_caching_cpu_allocations() {
  auto& cache = detail::cpu_cache::instance();
  c10::Allocator* previous = nullptr;
  std::uint8_t priority = 0;
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    previous = cache.previous;
    priority = cache.priority;
  }
  if (previous != nullptr && c10::GetCPUAllocator() == &detail::the_cpu_cache_allocator()) c10::SetCPUAllocator(previous, priority);
  cache.on.store(false, std::memory_order_release);
  cache.release_all();
}

TENSORDICT_DECL void empty_cpu_cache() { detail::cpu_cache::instance().release_all(); }

TENSORDICT_DECL CpuCacheStats cpu_cache_stats() {
  auto& cache = detail::cpu_cache::instance();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return {cache.cached_bytes, cache.cached_blocks, cache.reused, cache.allocated};
}

}  // namespace tensordict
#endif
