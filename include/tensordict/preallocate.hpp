// Preallocated TensorDicts, the buffers that collectors and replay buffers
// fill row by row with index_put_ / update_at_ / set_at_:
//
//   auto buffer = tensordict::zeros_like(transition, {capacity});   // Python: transition.expand(capacity).clone()
//   auto typed = tensordict::zeros<transition_schema>({capacity},
//       tensordict::kv<"obs">(tensordict::leaf_spec{{4}}),
//       tensordict::kv<"action">(tensordict::leaf_spec{{}, at::kLong}));
//
// empty_like and zeros_like keep every leaf's own dims (those after the batch
// dims), dtype and device, and take a new batch size (by default the old one):
// Python's td.expand(n).clone() idiom without reading the sample n times.
// A nested level with batch dims of its own keeps them after the new batch
// size. Batch dim names and the lock are not kept (the result is new memory).
// The typed schema form needs a leaf_spec for every leaf of the schema: a
// compile error names the first leaf without one.
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include "any_tensordict.hpp"
#include "typed_tensordict.hpp"

namespace tensordict {

// A leaf to allocate: its own dims (after the batch dims) and its options
// (dtype, device; float on the CPU unless given).
struct leaf_spec {
  std::vector<std::int64_t> shape;
  at::TensorOptions options = at::kFloat;
};

namespace compile_error {
template <key Leaf>
struct leaf_without_spec {
  static_assert(always_false<available_keys<Leaf>>,
                "tensordict: zeros<S>(batch, kv<...>(leaf_spec{...}), ...) and empty<S>(...) allocate every leaf of S, "
                "and the leaf named (keys joined with \".\") in 'leaf_without_spec<...>' above has no leaf_spec. "
                "Add kv<\"key\", ...>(leaf_spec{{own dims}, dtype}) for it.");
};
}  // namespace compile_error

namespace detail {

template <class TD, class Allocate>
TD allocated_like(const TD& like, c10::IntArrayRef batch, Allocate&& allocate) {
  const std::size_t nb = like.batch_size().size();
  return like.apply(
      [&](const at::Tensor& t) {
        std::vector<std::int64_t> shape(batch.begin(), batch.end());
        shape.insert(shape.end(), t.sizes().begin() + static_cast<std::ptrdiff_t>(nb), t.sizes().end());
        return allocate(shape, t.options());
      },
      batch);
}

inline at::Tensor allocate_zeros(c10::IntArrayRef shape, const at::TensorOptions& options) { return at::zeros(shape, options); }
inline at::Tensor allocate_empty(c10::IntArrayRef shape, const at::TensorOptions& options) { return at::empty(shape, options); }

// The schema index of the leaf that a kv<Path...>(leaf_spec) names, or npos (a
// path the schema does not have, or a sub-tree: set<Path...> reports those).
template <class S, class Keyed>
struct spec_leaf;
template <class S, class V, key... Path>
struct spec_leaf<S, keyed<V, Path...>> {
  static constexpr std::size_t index() {
    if constexpr (!std::is_void_v<path_error<S, Path...>>) {
      return npos;
    } else if constexpr (!std::is_same_v<typename resolve<S, Path...>::type, tensor_leaf>) {
      return npos;
    } else {
      return resolve<S, Path...>::leaf_offset;
    }
  }
};

// The first leaf of S that no spec names, or npos.
template <class S, class... Keyed>
constexpr std::size_t first_leaf_without_spec() {
  std::array<bool, S::leaf_count + 1> given{};
  ((spec_leaf<S, std::remove_cvref_t<Keyed>>::index() != npos ? given[spec_leaf<S, std::remove_cvref_t<Keyed>>::index()] = true : false), ...);
  for (std::size_t i = 0; i < S::leaf_count; ++i)
    if (!given[i]) return i;
  return npos;
}

template <class S, key... Path>
void allocate_leaf(TensorDict<S>& out, const keyed<leaf_spec, Path...>& spec, c10::IntArrayRef batch,
                   at::Tensor (*allocate)(c10::IntArrayRef, const at::TensorOptions&)) {
  std::vector<std::int64_t> shape(batch.begin(), batch.end());
  shape.insert(shape.end(), spec.value.shape.begin(), spec.value.shape.end());
  out.template set<Path...>(allocate(shape, spec.value.options));
}

template <schema_type S, class... Keyed>
TensorDict<S> allocated(c10::IntArrayRef batch, at::Tensor (*allocate)(c10::IntArrayRef, const at::TensorOptions&),
                        const Keyed&... specs) {
  static_assert((std::is_same_v<decltype(std::declval<Keyed>().value), leaf_spec> && ...),
                "tensordict: zeros<S>(batch, ...) and empty<S>(batch, ...) take kv<\"key\">(leaf_spec{{own dims}, dtype}) "
                "values; to allocate like a TensorDict, use zeros_like(td, batch).");
  constexpr std::size_t repeated = first_repeated_key<Keyed...>();
  constexpr std::size_t missing = first_leaf_without_spec<S, Keyed...>();
  TensorDict<S> out(batch);
  if constexpr (repeated != npos) {
    compile_error::report<compile_error::key_given_twice<keyed_path<pack_at<repeated, Keyed...>>::joined>>();
  } else {
    (allocate_leaf(out, specs, batch, allocate), ...);
    // A path that S lacks is reported by set<...>() above; a missing leaf only where every path is right.
    if constexpr (missing != npos && ((spec_leaf<S, Keyed>::index() != npos) && ...))
      compile_error::report<compile_error::leaf_without_spec<flat_key<S, ".", missing>()>>();
  }
  return out;
}

}  // namespace detail

// Every leaf new and zero, shaped as `like`'s with batch dims `batch_size`.
inline AnyTensorDict zeros_like(const AnyTensorDict& like, c10::IntArrayRef batch_size) {
  return detail::allocated_like(like, batch_size, detail::allocate_zeros);
}
inline AnyTensorDict zeros_like(const AnyTensorDict& like) { return zeros_like(like, like.batch_size()); }
template <schema_type S>
TensorDict<S> zeros_like(const TensorDict<S>& like, c10::IntArrayRef batch_size) {
  return detail::allocated_like(like, batch_size, detail::allocate_zeros);
}
template <schema_type S>
TensorDict<S> zeros_like(const TensorDict<S>& like) {
  return zeros_like(like, like.batch_size());
}

// As zeros_like, the memory left uninitialized (at::empty).
inline AnyTensorDict empty_like(const AnyTensorDict& like, c10::IntArrayRef batch_size) {
  return detail::allocated_like(like, batch_size, detail::allocate_empty);
}
inline AnyTensorDict empty_like(const AnyTensorDict& like) { return empty_like(like, like.batch_size()); }
template <schema_type S>
TensorDict<S> empty_like(const TensorDict<S>& like, c10::IntArrayRef batch_size) {
  return detail::allocated_like(like, batch_size, detail::allocate_empty);
}
template <schema_type S>
TensorDict<S> empty_like(const TensorDict<S>& like) {
  return empty_like(like, like.batch_size());
}

// A TensorDict<S> of batch size `batch_size` whose every leaf is zero, of the
// shape batch_size + spec.shape and spec.options: zeros<S>({n}, kv<"obs">(leaf_spec{{4}}), ...).
template <schema_type S, class... Keyed>
  requires(detail::keyed_value<Keyed> && ...)
TensorDict<S> zeros(c10::IntArrayRef batch_size, const Keyed&... specs) {
  return detail::allocated<S>(batch_size, detail::allocate_zeros, specs...);
}
// As zeros<S>, the memory left uninitialized.
template <schema_type S, class... Keyed>
  requires(detail::keyed_value<Keyed> && ...)
TensorDict<S> empty(c10::IntArrayRef batch_size, const Keyed&... specs) {
  return detail::allocated<S>(batch_size, detail::allocate_empty, specs...);
}

}  // namespace tensordict
