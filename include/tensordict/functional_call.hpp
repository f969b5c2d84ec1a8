// functional_call: a module's forward computed with other tensors than its
// own, typed or run-time. Module types with a functional form (the adapters
// of modules/) are computed without touching the module, so threads may share
// it; others get the tensors swapped in for the call.
//
//   auto y = tensordict::functional_call(net, params, x);
//   auto z = tensordict::functional_call(seq, any_params, x);   // a torch::nn::Sequential
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "nn/module_registry.hpp"

#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "any_tensordict.hpp"
#include "errors.hpp"
#include "to_module.hpp"
#include "typed_tensordict.hpp"

namespace tensordict {

// Calls the module's forward with `params` in place of its tensors. params
// has the module's schema, or its flatten_keys<".">() form ("0.weight").
// Module types with a functional form (every built-in, user modules that
// specialize nn::functional, and a typed Sequential whose children all have
// one: nn::touches_module_v<Impl> is false) never touch the module, so threads
// may share it. Other modules get the tensors swapped in for the call, under
// one process-wide lock: concurrent functional_calls stay correct but run one
// at a time, and a forward() called directly meanwhile sees the swapped tensors.
// BatchNorm in training writes its running statistics into params' buffers,
// never the module's: threads that share one params TensorDict there share them.
template <class Module, class S, class... Args>
  requires(!nn::dynamic_module<Module>)
auto functional_call(Module&& module, const TensorDict<S>& params, Args&&... args) {
  using Impl = nn::impl_of_t<Module>;
  auto& impl = detail::impl_ref(module);
  decltype(auto) p = detail::as_module_params<Impl>(params);
  if constexpr (nn::has_functional_form<Impl>) {
    return nn::functional<Impl>::forward(impl, p, std::forward<Args>(args)...);
  } else {
    std::lock_guard<std::recursive_mutex> serialized(::tensordict::detail::swap_call_lock());
    auto swap = module_swap<Impl>(impl, p, swap_mode::as_given);
    return impl.forward(std::forward<Args>(args)...);
  }
}

namespace detail {
// One module: its functional form when its type has one, a Sequential child
// by child, any other module with its tensors swapped in for the call. any:
// the AnyModule that holds m, whose forward is called; nullptr where m is
// reached only as a torch::nn::Module.
TENSORDICT_DECL at::Tensor dynamic_call(torch::nn::Module& m, torch::nn::AnyModule* any, const AnyTensorDict& params,
                                        const at::Tensor& input);

// params, with the module's own tensors where params leaves them out (as
// Python's functional_call with a partial dict).
TENSORDICT_DECL AnyTensorDict with_module_tensors(const torch::nn::Module& m, const AnyTensorDict& params);

}  // namespace detail

// Calls the module's forward with `params` in place of its tensors. A
// Sequential calls its children one by one, each through its functional form
// when its type has one (the module is then not touched, so threads may share
// it); other modules are swapped with to_module for the call (not thread-safe).
template <class M>
  requires nn::dynamic_module<M> && (!std::is_same_v<std::remove_cvref_t<M>, torch::nn::Module>)
at::Tensor functional_call(M&& module, const AnyTensorDict& params, const at::Tensor& input) {
  const AnyTensorDict p = detail::unflatten_if_flat(params);
  if constexpr (std::is_same_v<std::remove_cvref_t<M>, torch::nn::AnyModule>)
    return detail::dynamic_call(detail::dynamic_ref(module), const_cast<torch::nn::AnyModule*>(&module), p, input);
  else
    return detail::dynamic_call(detail::dynamic_ref(module), nullptr, p, input);
}

// A module of a static type (a holder of a user module, an LSTM) with
// run-time params: its functional form keyed at run time (RNN, LSTM, GRU),
// its registered one, or its forward with the tensors swapped in.
template <class M, class... Args>
  requires(!nn::dynamic_module<M> && std::is_base_of_v<torch::nn::Module, nn::impl_of_t<M>>)
auto functional_call(M&& module, const AnyTensorDict& params, Args&&... args) {
  using Impl = nn::impl_of_t<M>;
  auto& impl = detail::impl_ref(module);
  const AnyTensorDict p = detail::unflatten_if_flat(params);
  if constexpr (nn::runtime_layout_module<M>) {
    // A functional form keyed at run time (an LSTM's): the module is not touched.
    (void)detail::resolve_targets(impl, p, 0, "tensordict::functional_call");
    return nn::functional<Impl>::forward(impl, detail::with_module_tensors(impl, p), std::forward<Args>(args)...);
  } else {
    if constexpr (sizeof...(Args) == 1 && (std::is_convertible_v<Args, at::Tensor> && ...)) {
      auto kind = nn::detail::module_registry::instance().find(impl);
      if (kind && kind->forward) {
        (void)detail::resolve_targets(impl, p, 0, "tensordict::functional_call");
        return at::Tensor(kind->forward(impl, detail::with_module_tensors(impl, p), args...));
      }
    }
    std::lock_guard<std::recursive_mutex> serialized(::tensordict::detail::swap_call_lock());
    dynamic_module_swap swap(impl, p, swap_mode::as_given, "tensordict::functional_call");
    return impl.forward(std::forward<Args>(args)...);
  }
}

}  // namespace tensordict

#if TENSORDICT_DEFINITIONS
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

namespace tensordict::detail {
TENSORDICT_DECL AnyTensorDict with_module_tensors(const torch::nn::Module& m, const AnyTensorDict& params) {
  AnyTensorDict full;
  any_key_path path;
  collect(m, full, path);
  params.for_each_leaf([&](const any_key_path& p, const at::Tensor& t) { full.set(p, t); });
  return full;
}

// The sub-tree of params for a child, or an empty one.
inline AnyTensorDict child_params(const AnyTensorDict& params, const std::string& name) {
  return params.contains(name) ? params.get_tensordict(name) : AnyTensorDict(params.batch_size());
}

// A Sequential's children in order, each with its sub-tree of params.
inline at::Tensor sequential_call(torch::nn::SequentialImpl& seq, const AnyTensorDict& params, const at::Tensor& input) {
  at::Tensor x = input;
  auto names = seq.named_children();
  std::size_t i = 0;
  for (auto& child : seq) x = dynamic_call(*child.ptr(), &child, child_params(params, names[i++].key()), x);
  return x;
}

TENSORDICT_DECL at::Tensor dynamic_call(torch::nn::Module& m, torch::nn::AnyModule* any, const AnyTensorDict& params,
                                        const at::Tensor& input) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&m)) return sequential_call(*seq, params, input);
  auto call_forward = [&] {
    if (!any)
      throw module_error("tensordict::functional_call: " + module_type_name(m) +
                         " is reached only as a torch::nn::Module, whose forward cannot be called; pass its holder "
                         "or an AnyModule");
    return any->forward(input);
  };
  if (params.empty()) return call_forward();
  auto kind = nn::detail::module_registry::instance().find(m);
  if (kind && kind->forward) {
    (void)resolve_targets(m, params, 0, "tensordict::functional_call");  // the keys, shapes and dtypes
    return kind->forward(m, with_module_tensors(m, params), input);
  }
  std::lock_guard<std::recursive_mutex> serialized(::tensordict::detail::swap_call_lock());
  dynamic_module_swap swap(m, params, swap_mode::as_given, "tensordict::functional_call");
  return call_forward();
}
}  // namespace tensordict::detail
#endif  // TENSORDICT_DEFINITIONS
