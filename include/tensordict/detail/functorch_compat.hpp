// The functorch primitives that libtorch 1.13 exports, behind one small
// interface: they are internal to PyTorch and change across versions (later
// releases take levels in addBatchDim differently and rename the layer calls).
// Everything tensordict's vmap needs from functorch goes through here.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/functorch/BatchedTensorImpl.h>
#include <ATen/functorch/DynamicLayer.h>
#include <ATen/ops/movedim.h>

namespace tensordict::detail::functorch {

enum class randomness_kind { error, same, different };

inline at::functorch::RandomnessType to_functorch(randomness_kind r) {
  switch (r) {
    case randomness_kind::same: return at::functorch::RandomnessType::Same;
    case randomness_kind::different: return at::functorch::RandomnessType::Different;
    default: return at::functorch::RandomnessType::Error;
  }
}

// Pushes a vmap level of `batch_size` on functorch's layer stack; returns its level.
inline std::int64_t push_vmap_layer(std::int64_t batch_size, randomness_kind r) {
  return at::functorch::initAndPushDynamicLayer(at::functorch::TransformType::Vmap, batch_size, to_functorch(r));
}

inline void pop_vmap_layer() { at::functorch::popDynamicLayerAndDeleteMetadata(); }

inline at::Tensor add_batch_dim(const at::Tensor& t, std::int64_t dim, std::int64_t level) {
  return at::functorch::addBatchDim(t, dim, level);
}

// The inverse of add_batch_dim, as functorch's _remove_batch_dim: the mapped
// dim of `level` moves to out_dim; a result that does not depend on the
// mapped inputs is expanded along it.
inline at::Tensor remove_batch_dim(const at::Tensor& t, std::int64_t level, std::int64_t batch_size, std::int64_t out_dim) {
  const auto* batched = at::functorch::maybeGetBatchedImpl(t);
  if (batched == nullptr || batched->level() != level) {
    std::vector<std::int64_t> sizes(t.sizes().begin(), t.sizes().end());
    sizes.insert(sizes.begin() + out_dim, batch_size);
    return t.expand(sizes);
  }
  return at::movedim(batched->value(), batched->bdim(), out_dim);
}

inline bool is_batched(const at::Tensor& t) { return at::functorch::isBatchedTensor(t); }

}  // namespace tensordict::detail::functorch
