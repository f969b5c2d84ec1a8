// reset_parameters: fresh initial values drawn into a TensorDict instead of
// the module, with each module type's own initialisation (its adapter's
// nn::initializer, else its reset_parameters()). On stacked params every set
// gets its own draw; the module keeps its values. Typed and run-time.
//
//   auto fresh = tensordict::from_module(net).clone();
//   tensordict::nn::reset_parameters(net, fresh);            // net unchanged
//   auto stacked = tensordict::from_modules(members);         // batch_size [N]
//   tensordict::nn::reset_parameters(members[0], stacked);    // N draws, one per set
//
// The draws are written into params' tensors in place, without gradient
// tracking: params must hold every tensor the initialisation writes (else
// key_error, before any draw), and its leaves must not be views that autograd
// guards (a leaf that requires grad is fine: no_grad).
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "../to_module.hpp"

#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>

#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include "../any_tensordict.hpp"
#include "../detail/module_access.hpp"
#include "../detail/module_slots.hpp"
#include "../errors.hpp"
#include "../from_module.hpp"
#include "module_registry.hpp"
#include "../typed_tensordict.hpp"

namespace tensordict::nn {

namespace detail {
// Calls draw(one set) for every set of params (every index of its batch
// dims), each a view of params.
template <class TD, class Draw>
void for_each_set(const TD& params, Draw& draw) {
  if (params.batch_dims() == 0) {
    draw(params);
    return;
  }
  for (std::int64_t i = 0; i < params.batch_size()[0]; ++i) for_each_set(params[i], draw);
}

// A module reached through its base class: its type's initialisation from
// the registry, else its children's.
inline void reset_module_dynamic(torch::nn::Module& m) {
  auto kind = module_registry::instance().find(m);
  if (kind && kind->reset) {
    kind->reset(m);
    return;
  }
  for (const auto& child : m.children()) reset_module_dynamic(*child);
}
}  // namespace detail

template <class Module, class S>
  requires(!dynamic_module<Module> && !runtime_layout_module<Module>)
void reset_parameters(Module&& module, const TensorDict<S>& params) {
  using Impl = impl_of_t<Module>;
  using M = schema_of<Impl>;
  auto& impl = ::tensordict::detail::impl_ref(module);
  decltype(auto) p = ::tensordict::detail::as_module_params<Impl>(params);
  const auto slots = ::tensordict::detail::slots_of<Impl>(impl);
  for (std::size_t i = 0; i < M::leaf_count; ++i)
    if (slots[i].member->defined() && !p.leaf(i).defined())
      throw key_error("tensordict::nn::reset_parameters: params has no " + to_string(leaf_path<M>(i)) +
                      ", which the module's initialisation writes; it would be drawn into the module's own tensor");
  at::NoGradGuard no_grad;
  std::lock_guard<std::recursive_mutex> serialized(::tensordict::detail::swap_call_lock());
  auto draw = [&](const TensorDict<M>& one) {
    auto swap = module_swap<Impl>(impl, one, swap_mode::as_given);
    detail::reset_module(impl);
  };
  detail::for_each_set(p, draw);
}

template <class Module>
  requires std::is_base_of_v<torch::nn::Module, impl_of_t<Module>> || dynamic_module<Module>
void reset_parameters(Module&& module, const AnyTensorDict& params) {
  torch::nn::Module& m = ::tensordict::detail::dynamic_ref(module);
  const AnyTensorDict p = ::tensordict::detail::unflatten_if_flat(params);
  (void)::tensordict::detail::resolve_targets(m, p, p.batch_dims(), "tensordict::nn::reset_parameters");
  if (const auto key = ::tensordict::detail::first_missing_tensor(m, p))
    throw key_error("tensordict::nn::reset_parameters: params has no " + to_string(*key) +
                    ", which the module's initialisation writes; it would be drawn into the module's own tensor");
  at::NoGradGuard no_grad;
  std::lock_guard<std::recursive_mutex> serialized(::tensordict::detail::swap_call_lock());
  auto draw = [&](const AnyTensorDict& one) {
    ::tensordict::dynamic_module_swap swap(m, one, swap_mode::as_given, "tensordict::nn::reset_parameters");
    detail::reset_module_dynamic(m);
  };
  detail::for_each_set(p, draw);
}

}  // namespace tensordict::nn
