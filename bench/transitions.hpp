// The RL transitions the buffer benchmarks write: 5 leaves, 525 bytes a row
// (observation and next observation of 64 floats, an int64 action, a float
// reward, a bool done), as bench/python's scripts make them.
#pragma once

#include <cstdint>

#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <tensordict/any_tensordict.hpp>

namespace bench {

constexpr std::int64_t obs_dim = 64;

inline tensordict::AnyTensorDict transitions(std::int64_t n) {
  return tensordict::AnyTensorDict({{"obs", at::randn({n, obs_dim})},
                                    {"action", at::randint(0, 4, {n}, at::kLong)},
                                    {"reward", at::randn({n})},
                                    {"done", at::zeros({n}, at::kBool)},
                                    {{"next", "obs"}, at::randn({n, obs_dim})}},
                                   {n});
}

inline std::int64_t row_bytes(const tensordict::AnyTensorDict& batch) {
  std::int64_t n = 0;
  for (const at::Tensor& t : batch.values()) n += t.nbytes() / batch.batch_size()[0];
  return n;
}

}  // namespace bench
