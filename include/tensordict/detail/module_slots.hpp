// Where a module's tensors live, for the verbs: the typed slots (the member
// that the forward reads, and the registry entry) of a module of a described
// type, and the walk over a run-time model's registered tensors.
#pragma once

#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <c10/util/Type.h>
#include <torch/nn/module.h>
#include <c10/util/FunctionRef.h>  // after ATen's headers: 1.13's needs c10::invoke_result_t declared

#include "../any_tensordict.hpp"
#include "../errors.hpp"
#include "config.hpp"
#include "../nn/adapters/adapter.hpp"
#include "module_access.hpp"

namespace tensordict {

namespace detail {

// Where leaf i of a module's schema lives: the member that the forward reads,
// and the module whose registry holds it under `name`.
struct module_slot {
  at::Tensor* member = nullptr;
  torch::nn::Module* owner = nullptr;
  std::string_view name;
};

template <class Impl, class... Members>
void collect_slots(Impl& m, module_slot*& out, nn::member_list<Members...>) {
  [[maybe_unused]] auto visit = [&]<class Member>(std::type_identity<Member>) {
    if constexpr (nn::detail::is_tensor_member<Impl, Member>) {
      *out++ = module_slot{&typename Member::getter{}(m), &m, Member::name.view()};
    } else {
      using sub = nn::detail::submodule_t<Impl, Member>;
      if constexpr (nn::schema_of<sub>::leaf_count > 0)
        collect_slots(nn::detail::submodule<Impl, Member>(m), out, typename nn::detail::members_of_impl<sub>::type{});
    }
  };
  (visit(std::type_identity<Members>{}), ...);
}

template <class Impl>
std::array<module_slot, nn::schema_of<Impl>::leaf_count> slots_of(Impl& m) {
  std::array<module_slot, nn::schema_of<Impl>::leaf_count> slots{};
  module_slot* out = slots.data();
  collect_slots(m, out, typename nn::detail::members_of_impl<Impl>::type{});
  return slots;
}

// The registry entry of a slot (a parameter or a buffer), or nullptr.
inline at::Tensor* registry_entry(const module_slot& slot) {
  const std::string name(slot.name);
  if (at::Tensor* p = module_parameters(*slot.owner).find(name)) return p;
  return module_buffers(*slot.owner).find(name);
}

// The module behind a holder (torch::nn::Linear), a shared_ptr, or the module
// itself. Holders are shared handles: a const one still names a mutable module.
template <class M>
nn::impl_of_t<M>& impl_ref(M&& m) {
  if constexpr (requires { m.ptr(); })
    return *m.ptr();
  else if constexpr (requires { m.get(); *m; })
    return *m;
  else
    return const_cast<nn::impl_of_t<M>&>(m);
}

// The full check, naming what the schema (its leaves) does not know.
TENSORDICT_DECL void check_registry_names(const torch::nn::Module& m, entry_table leaves);
// Whether the tensors registered under the slots' names are all the module has.
TENSORDICT_DECL bool registry_holds_only(torch::nn::Module& m, c10::ArrayRef<module_slot> slots);

template <class Impl>
void check_registry_matches_schema(const Impl& m) {
  using S = nn::schema_of<Impl>;
  check_registry_names(m, leaf_entries<S>());
}

// Every registered tensor of the module must be a leaf of its schema: a
// member forgotten in TENSORDICT_MODULE would otherwise be silently ignored.
// The common case costs a registry lookup per leaf and a count: the tensors
// registered under the slots' names are all the module has. Only a mismatch
// builds the names, to say which.
template <class Impl, std::size_t N>
void check_registry_matches_schema(Impl& m, const std::array<module_slot, N>& slots) {
  if (!registry_holds_only(m, slots)) check_registry_matches_schema(m);
}

}  // namespace detail

namespace detail {

// The torch::nn::Module behind a holder, a shared_ptr, an AnyModule, or a reference.
template <class M>
torch::nn::Module& dynamic_ref(M&& m) {
  using T = std::remove_cvref_t<M>;
  if constexpr (std::is_same_v<T, torch::nn::AnyModule>) {
    if (m.is_empty()) throw value_error("tensordict: the AnyModule is empty");
    return *m.ptr();
  } else if constexpr (requires { m.ptr(); }) {
    return *m.ptr();
  } else if constexpr (requires { m.get(); *m; }) {
    return *m;
  } else {
    return const_cast<torch::nn::Module&>(static_cast<const torch::nn::Module&>(m));
  }
}

inline std::string module_type_name(const torch::nn::Module& m) { return c10::demangle(typeid(m).name()); }

inline std::string where(const any_key_path& path) { return path.empty() ? "the root module" : to_string(path); }

// The module's registered tensors (with_buffers: parameters and buffers, else
// parameters only) and its children's, by path, into out.
TENSORDICT_DECL void collect(const torch::nn::Module& m, AnyTensorDict& out, any_key_path& path, bool with_buffers = true);

// The first of the module's tensors that params lacks (std::nullopt: params
// holds them all).
TENSORDICT_DECL std::optional<any_key_path> first_missing_tensor(const torch::nn::Module& m, const AnyTensorDict& params);

}  // namespace detail

#if TENSORDICT_DEFINITIONS
namespace detail {
TENSORDICT_DECL void check_registry_names(const torch::nn::Module& m, entry_table leaves) {
  std::vector<std::string> known;
  known.reserve(leaves.count);
  for (std::size_t i = 0; i < leaves.count; ++i) known.push_back(leaves.path(i).join("."));
  std::string unknown;
  auto check = [&](const torch::OrderedDict<std::string, at::Tensor>& registry, const char* kind) {
    for (const auto& item : registry)
      if (std::find(known.begin(), known.end(), item.key()) == known.end())
        unknown += std::string(unknown.empty() ? "" : ", ") + kind + " \"" + item.key() + "\"";
  };
  check(m.named_parameters(true), "parameter");
  check(m.named_buffers(true), "buffer");
  if (!unknown.empty())
    throw key_error("tensordict::from_module: the module registered " + unknown +
                    " that its schema does not know. Name every tensor and sub-module member in TENSORDICT_MODULE.");
}

TENSORDICT_DECL bool registry_holds_only(torch::nn::Module& m, c10::ArrayRef<module_slot> slots) {
  std::size_t known = 0;
  for (const auto& slot : slots)
    if (const at::Tensor* entry = registry_entry(slot); entry && entry->defined()) ++known;
  return known == registered_tensor_count(m);
}

TENSORDICT_DECL void collect(const torch::nn::Module& m, AnyTensorDict& out, any_key_path& path, bool with_buffers) {
  auto add = [&](const torch::OrderedDict<std::string, at::Tensor>& tensors) {
    for (const auto& item : tensors) {
      if (!item.value().defined()) continue;  // a Linear built with bias(false)
      path.push_back(item.key());
      out.set(path, item.value());
      path.pop_back();
    }
  };
  add(m.named_parameters(false));
  if (with_buffers) add(m.named_buffers(false));
  for (const auto& child : m.named_children()) {
    path.push_back(child.key());
    collect(*child.value(), out, path, with_buffers);
    path.pop_back();
  }
}

TENSORDICT_DECL std::optional<any_key_path> first_missing_tensor(const torch::nn::Module& m, const AnyTensorDict& params) {
  AnyTensorDict own;
  any_key_path path;
  collect(m, own, path);
  for (const auto& key : own.keys(true, true))
    if (!params.contains(key)) return key;
  return std::nullopt;
}
}  // namespace detail
#endif  // TENSORDICT_DEFINITIONS

}  // namespace tensordict
