// The registries of a torch::nn::Module (its parameters_ and buffers_ dicts),
// which to_module must update so that named_parameters() and the state dict
// show the swapped tensors. libtorch offers no way to replace a registered
// tensor (register_parameter and register_buffer refuse an existing name).
//   parameters_ is protected: a class derived from Module names it legally.
//   buffers_ and children_ are private: only a template argument of an explicit
//   specialization may name it without an access check (C++20, P0692). Such a
//   specialization is a class definition, allowed in every translation unit
//   like any other (unlike an explicit instantiation definition, which the
//   standard allows once per program); naming it forces the implicit
//   instantiation that defines the friend below, an inline function.
// Kept in this one header: it depends on libtorch's member names.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include <torch/nn/module.h>
#include <torch/ordered_dict.h>

#include "config.hpp"

namespace tensordict::detail {

using tensor_registry = torch::OrderedDict<std::string, at::Tensor>;

struct module_parameters_access : torch::nn::Module {
  static tensor_registry& of(torch::nn::Module& m) { return m.*(&module_parameters_access::parameters_); }
};

struct module_buffers_tag {
  friend constexpr auto member_pointer(module_buffers_tag);
};
template <class Tag, auto Member>
struct grant_access {
  friend constexpr auto member_pointer(Tag) { return Member; }
};
template <class Grant, std::size_t = sizeof(Grant)>  // sizeof: Grant is instantiated
struct instantiate {};
template <>
struct instantiate<grant_access<module_buffers_tag, &torch::nn::Module::buffers_>> {};
struct module_children_tag {
  friend constexpr auto member_pointer(module_children_tag);
};
template <>
struct instantiate<grant_access<module_children_tag, &torch::nn::Module::children_>> {};

inline tensor_registry& module_parameters(torch::nn::Module& m) { return module_parameters_access::of(m); }
inline tensor_registry& module_buffers(torch::nn::Module& m) { return m.*member_pointer(module_buffers_tag{}); }

// The defined tensors registered in a module and its descendants (as
// named_parameters(true) and named_buffers(true) count them), without
// building their names.
// A registered child by name (one hash lookup; named_children() copies them all), or nullptr.
inline torch::nn::Module* find_child(torch::nn::Module& m, const std::string& name) {
  const auto* child = (m.*member_pointer(module_children_tag{})).find(name);
  return child ? child->get() : nullptr;
}

TENSORDICT_DECL std::size_t registered_tensor_count(torch::nn::Module& m);

// Module::register_module(name, child) for a child of any module type. libtorch's
// is a template over the child's type (with OrderedDict::insert, ~1.5 KB of code
// per type); the library registers every child as a torch::nn::Module, once.
TENSORDICT_DECL void register_child(torch::nn::Module& parent, std::string name, std::shared_ptr<torch::nn::Module> child);
// The same for a typed pointer or a ModuleHolder, which it returns (to initialize a member with).
template <class Child>
Child registered_child(torch::nn::Module& parent, std::string name, Child child) {
  if constexpr (requires { child.ptr(); })
    register_child(parent, std::move(name), child.ptr());
  else
    register_child(parent, std::move(name), child);
  return child;
}

}  // namespace tensordict::detail

namespace tensordict {

// How to_module installs a TensorDict's tensors in a module. Either way a
// tensor replaces the registry entry of the one it swaps out, so a parameter
// stays a parameter and a buffer a buffer (named_parameters, named_buffers).
enum class swap_mode {
  // As Python tensordict's to_module: each swapped-in tensor takes the
  // requires_grad flag of the module's tensor it replaces (a detached copy
  // over a trainable bias is trainable during the swap; a frozen weight stays
  // frozen), and gets its own flag back when the swap ends. Only leaf tensors
  // take a flag (autograd refuses it on others, which track their history).
  keep_module_flags,
  // The tensors exactly as given (functional_call and vmap swap this way:
  // they compute with the caller's tensors).
  as_given,
};

namespace detail {

// functional_call on a module without a functional form swaps the tensors in
// for the call: under this one process-wide lock, so that concurrent calls
// compute with their own tensors (serialized). Recursive: a forward may call
// functional_call again.
inline std::recursive_mutex& swap_call_lock() {
  static std::recursive_mutex lock;
  return lock;
}

// A requires_grad flag that a swap changed, to put back when it ends.
struct flag_change {
  at::Tensor tensor;
  bool old_value = false;
  void undo() noexcept {
    if (tensor.defined()) tensor.set_requires_grad(old_value);
  }
};

inline std::optional<flag_change> adopt_requires_grad(const at::Tensor& incoming, const at::Tensor& current, swap_mode mode) {
  if (mode != swap_mode::keep_module_flags || !incoming.defined() || !current.defined()) return std::nullopt;
  const bool wanted = current.requires_grad();
  if (incoming.requires_grad() == wanted || !incoming.is_leaf() || !(at::isFloatingType(incoming.scalar_type()) || at::isComplexType(incoming.scalar_type())))
    return std::nullopt;
  flag_change change{incoming, incoming.requires_grad()};
  incoming.set_requires_grad(wanted);
  return change;
}

}  // namespace detail
}  // namespace tensordict

#if TENSORDICT_DEFINITIONS
namespace tensordict::detail {
TENSORDICT_DECL std::size_t registered_tensor_count(torch::nn::Module& m) {
  std::size_t count = 0;
  for (const auto& item : module_parameters(m))
    if (item.value().defined()) ++count;
  for (const auto& item : module_buffers(m))
    if (item.value().defined()) ++count;
  for (const auto& child : m.*member_pointer(module_children_tag{})) count += registered_tensor_count(*child.value());
  return count;
}

TENSORDICT_DECL void register_child(torch::nn::Module& parent, std::string name, std::shared_ptr<torch::nn::Module> child) {
  parent.register_module(std::move(name), std::move(child));
}
}  // namespace tensordict::detail
#endif  // TENSORDICT_DEFINITIONS
