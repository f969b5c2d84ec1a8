// What differs between the libtorch versions tensordict supports (1.13 on
// Debian 12, 2.6 on Debian 13), in one place. Each difference is chosen by a
// feature test where one exists, else by TORCH_VERSION_MAJOR/MINOR; the rest
// of the library calls the names here and has no version branches.
//
// Three sections, each compiled once however often the header is included:
//   core       always: the variant that libtorch's options hold.
//   functorch  with TENSORDICT_COMPAT_FUNCTORCH defined before the include:
//              the functorch primitives vmap needs (internal to PyTorch).
//   c10d       with TENSORDICT_COMPAT_C10D defined before the include (and
//              c10d's headers included): process groups over a backend.
// The sections are opt-in so that a header pays only for the libtorch
// headers it uses; hence per-section guards instead of #pragma once.

#ifndef TENSORDICT_DETAIL_COMPAT_CORE
#define TENSORDICT_DETAIL_COMPAT_CORE

#include <cstdint>
#include <type_traits>

#include <torch/version.h>

#if __has_include(<c10/util/variant.h>)
#include <c10/util/variant.h>  // libtorch 1.x: options hold c10::variant
#else
#include <variant>  // libtorch 2.1+: std::variant
#endif

namespace tensordict::detail::compat {

inline constexpr int torch_major = TORCH_VERSION_MAJOR;
inline constexpr int torch_minor = TORCH_VERSION_MINOR;

#if __has_include(<c10/util/variant.h>)
using c10::get;
using c10::get_if;
#else
using std::get;
using std::get_if;
#endif

// A slice bound (at::indexing::Slice::start() and the like: c10::SymInt from
// libtorch 2.0, int64_t before) as an int64_t.
template <class Int>
std::int64_t as_int(const Int& value) {
  if constexpr (std::is_integral_v<Int>) return value;
  else return value.expect_int();
}

// Whether libtorch's own RNN/LSTM/GRU forward is one fused kernel: on CUDA
// (cuDNN), and from libtorch 2.0 an LSTM that oneDNN takes on the CPU
// (2.6's GRU and RNN step op by op there, as 1.13 steps every one).
inline bool fused_recurrent_kernel(bool cuda, bool onednn_lstm) { return cuda || (torch_major >= 2 && onednn_lstm); }

}  // namespace tensordict::detail::compat

// c10::Allocator: allocate() is const in libtorch 1.13 and not in 2.6, which
// also adds the pure virtual copy_data (both from libtorch 2.3).
#if TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR >= 203
#define TENSORDICT_COMPAT_ALLOCATE_CONST
#define TENSORDICT_COMPAT_ALLOCATOR_COPY_DATA 1
#else
#define TENSORDICT_COMPAT_ALLOCATE_CONST const
#define TENSORDICT_COMPAT_ALLOCATOR_COPY_DATA 0
#endif

// Module types that libtorch 2.2 added (LPPool3d, ZeroPad1d, ZeroPad3d).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
#define TENSORDICT_HAS_TORCH_2_2_MODULES 1
#else
#define TENSORDICT_HAS_TORCH_2_2_MODULES 0
#endif

#endif  // TENSORDICT_DETAIL_COMPAT_CORE

#if defined(TENSORDICT_COMPAT_FUNCTORCH) && !defined(TENSORDICT_DETAIL_COMPAT_FUNCTORCH)
#define TENSORDICT_DETAIL_COMPAT_FUNCTORCH

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "config.hpp"

// functorch's layer stack. Only libtensordict includes functorch's headers
// (a program's TU would parse them, and instantiate the interpreters'
// std::variant, for these six calls).
namespace tensordict::detail::functorch {

enum class randomness_kind { error, same, different };

// Pushes a vmap level of `batch_size` on functorch's layer stack; returns its level.
TENSORDICT_DECL std::int64_t push_vmap_layer(std::int64_t batch_size, randomness_kind r);
TENSORDICT_DECL void pop_vmap_layer();
TENSORDICT_DECL at::Tensor add_batch_dim(const at::Tensor& t, std::int64_t dim, std::int64_t level);
// The inverse of add_batch_dim, as functorch's _remove_batch_dim: the mapped
// dim of `level` moves to out_dim; a result that does not depend on the
// mapped inputs is expanded along it.
TENSORDICT_DECL at::Tensor remove_batch_dim(const at::Tensor& t, std::int64_t level, std::int64_t batch_size,
                                           std::int64_t out_dim);
TENSORDICT_DECL bool is_batched(const at::Tensor& t);
// Whether a functorch transform (a vmap level, ...) is active on this thread.
TENSORDICT_DECL bool inside_transform();

}  // namespace tensordict::detail::functorch

#if TENSORDICT_DEFINITIONS
#include <vector>

#include <ATen/functorch/BatchedTensorImpl.h>
#include <ATen/functorch/DynamicLayer.h>
#include <ATen/ops/movedim.h>

// 1.13 and 2.6 both export these; 2.x takes the batch size as
// optional<SymInt>, to which an int64_t converts.
namespace tensordict::detail::functorch {

inline at::functorch::RandomnessType to_functorch(randomness_kind r) {
  switch (r) {
    case randomness_kind::same: return at::functorch::RandomnessType::Same;
    case randomness_kind::different: return at::functorch::RandomnessType::Different;
    default: return at::functorch::RandomnessType::Error;
  }
}

TENSORDICT_DECL std::int64_t push_vmap_layer(std::int64_t batch_size, randomness_kind r) {
  return at::functorch::initAndPushDynamicLayer(at::functorch::TransformType::Vmap, batch_size, to_functorch(r));
}

TENSORDICT_DECL void pop_vmap_layer() { at::functorch::popDynamicLayerAndDeleteMetadata(); }

TENSORDICT_DECL at::Tensor add_batch_dim(const at::Tensor& t, std::int64_t dim, std::int64_t level) {
  return at::functorch::addBatchDim(t, dim, level);
}

TENSORDICT_DECL at::Tensor remove_batch_dim(const at::Tensor& t, std::int64_t level, std::int64_t batch_size,
                                           std::int64_t out_dim) {
  const auto* batched = at::functorch::maybeGetBatchedImpl(t);
  if (batched == nullptr || batched->level() != level) {
    std::vector<std::int64_t> sizes(t.sizes().begin(), t.sizes().end());
    sizes.insert(sizes.begin() + out_dim, batch_size);
    return t.expand(sizes);
  }
  return at::movedim(batched->value(), batched->bdim(), out_dim);
}

TENSORDICT_DECL bool is_batched(const at::Tensor& t) { return at::functorch::isBatchedTensor(t); }

TENSORDICT_DECL bool inside_transform() { return at::functorch::maybeCurrentDynamicLayer().has_value(); }

}  // namespace tensordict::detail::functorch
#endif  // TENSORDICT_DEFINITIONS

#endif  // TENSORDICT_COMPAT_FUNCTORCH

#if defined(TENSORDICT_COMPAT_C10D) && !defined(TENSORDICT_DETAIL_COMPAT_C10D)
#define TENSORDICT_DETAIL_COMPAT_C10D

#include <type_traits>
#include <utility>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace tensordict::detail::compat {

// libtorch 2.x splits c10d: a Backend (ProcessGroupGloo, ProcessGroupNCCL)
// does the work, and a ProcessGroup dispatches to the backend of each device
// type. In 1.13 ProcessGroupGloo is itself the ProcessGroup. The test is the
// class hierarchy; Group is a parameter only so that the 2.x names are looked
// up when that branch is taken.
enum class c10d_engine { gloo, nccl };

template <class Backend, class Group = c10d::ProcessGroup>
c10::intrusive_ptr<Group> as_process_group(c10::intrusive_ptr<Backend> backend,
                                           [[maybe_unused]] const c10::intrusive_ptr<c10d::Store>& store,
                                           [[maybe_unused]] c10d_engine engine) {
  if constexpr (std::is_base_of_v<Group, Backend>) {
    return backend;
  } else {
    using backend_base = typename decltype(std::declval<Group&>().getDefaultBackend())::element_type;
    using type = typename Group::BackendType;
    const type backend_type = engine == c10d_engine::nccl ? type::NCCL : type::GLOO;
    const c10::DeviceType device = engine == c10d_engine::nccl ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
    auto group = c10::make_intrusive<Group>(store, backend->getRank(), backend->getSize());
    group->setBackend(device, backend_type, c10::intrusive_ptr<backend_base>(std::move(backend)));
    group->setDefaultBackend(backend_type);
    return group;
  }
}

// TCPStore's libuv server is the default from libtorch 2.4 on, but builds
// without libuv (Debian's) refuse it: use the classic server where the option exists.
template <class Options>
void use_classic_tcp_server(Options& options) {
  if constexpr (requires { options.useLibUV; }) options.useLibUV = false;
}

}  // namespace tensordict::detail::compat

#endif  // TENSORDICT_COMPAT_C10D
