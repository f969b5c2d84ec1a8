// from_module: a module's parameters and buffers as a TensorDict of the
// module's own tensors (same TensorImpl), typed for a module of a described
// type, an AnyTensorDict for a run-time model.
//
//   auto params = tensordict::from_module(net);                  // TensorDict<schema_of<NetImpl>>
//   tensordict::AnyTensorDict any = tensordict::from_module(seq);  // a torch::nn::Sequential
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "nn/module_registry.hpp"  // (with every module family where it is header-only)

#include <array>
#include <cstddef>
#include <utility>

#include "any_tensordict.hpp"
#include "detail/module_slots.hpp"
#include "typed_tensordict.hpp"

namespace tensordict {

// The module's parameters and buffers as a TensorDict with batch_size [],
// holding the module's own tensors (same TensorImpl). Unset leaves stand for
// tensors the module does not have (a Linear built with bias(false)).
// (The return type is deduced: clang would form TensorDict<schema_of<...>>
// for a run-time module before its requires clause excludes this overload.)
template <class Module>
  requires(!nn::dynamic_module<Module> && !nn::runtime_layout_module<Module>)
auto from_module(Module&& module) {
  using Impl = nn::impl_of_t<Module>;
  auto& impl = detail::impl_ref(module);
  auto slots = detail::slots_of<Impl>(impl);
  detail::check_registry_matches_schema(impl, slots);
  std::array<at::Tensor, nn::schema_of<Impl>::leaf_count> leaves;
  for (std::size_t i = 0; i < leaves.size(); ++i) leaves[i] = *slots[i].member;
  return TensorDict<nn::schema_of<Impl>>(std::move(leaves));
}

// The module's registered parameters and buffers, and its children's, as an
// AnyTensorDict of the module's own tensors (batch_size []). Children without
// tensors are left out, as in the typed form.
// (Also for a module type whose tensors are named by its options: an LSTM.)
template <class M>
  requires nn::dynamic_module<M> || nn::runtime_layout_module<M>
AnyTensorDict from_module(M&& module) {
  AnyTensorDict out;
  any_key_path path;
  detail::collect(detail::dynamic_ref(module), out, path);
  return out;
}

}  // namespace tensordict
