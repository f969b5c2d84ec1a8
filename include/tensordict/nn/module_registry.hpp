// The run-time registry of module types: what the run-time verbs (on a
// torch::nn::Sequential built from a config file, ModuleList, ModuleDict,
// AnyModule, or any torch::nn::Module) know about a module reached through its
// base class. Every built-in adapter's type is in it (nn/adapters/builtin.hpp); a
// user type is added once with nn::register_module_type<Impl>() (its
// TENSORDICT_MODULE schema, and its nn::functional form or a forward given at
// run time). A tensor that belongs to a module of an unknown type throws
// module_error naming its path and type: swapping only the registry would
// compute with the old tensors, a silent wrong answer.
#pragma once

#include <array>
#include <concepts>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string_view>
#include <string>
#include <tuple>
#include <typeindex>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/util/Type.h>
#include <torch/nn/module.h>

#include "../any_tensordict.hpp"
#include "../detail/config.hpp"
#include "../detail/module_slots.hpp"
#include "adapters/adapter.hpp"

namespace tensordict {
namespace nn {

// What the library knows of a module type at run time.
struct module_kind {
  std::string type_name;
  // The module's own tensor members (not its children's), by registered name.
  std::function<std::vector<std::pair<std::string, at::Tensor*>>(torch::nn::Module&)> members;
  // forward(module, its params, input) without touching the module; empty when it has none.
  std::function<at::Tensor(torch::nn::Module&, const AnyTensorDict&, const at::Tensor&)> forward;
  // The batched form for functional_vmap (empty when the type has none), and
  // whether it lowers this module with these params (its options; every
  // tensor stacked): batched is called only where lowers says so.
  std::function<stacked(torch::nn::Module&, const AnyTensorDict&, const stacked&, const batch_context&)> batched;
  std::function<bool(torch::nn::Module&, const AnyTensorDict&)> lowers;
  // Draws its initial values into the tensors it holds (nn::reset_parameters); empty when unknown.
  std::function<void(torch::nn::Module&)> reset;
};

namespace detail {

template <class Impl>
std::vector<std::pair<std::string, at::Tensor*>> own_members(torch::nn::Module& m) {
  auto& impl = dynamic_cast<Impl&>(m);
  std::vector<std::pair<std::string, at::Tensor*>> out;
  if constexpr (schema_of<Impl>::leaf_count > 0)
    for (const auto& slot : ::tensordict::detail::slots_of<Impl>(impl))
      if (slot.owner == &m) out.emplace_back(std::string(slot.name), slot.member);
  return out;
}

namespace compile_error {
template <class Impl>
struct registered_type_without_schema {
  static_assert(::tensordict::compile_error::always_false<Impl>,
                "tensordict::nn::register_module_type<Impl>(): Impl (named above in "
                "'registered_type_without_schema<...>') has no schema. Name its members once with "
                "TENSORDICT_MODULE(Impl, member, ...) at global scope, so that its tensors can be swapped.");
};
}  // namespace compile_error

// (Its forms are captureless lambdas stored as function pointers: std::function
// then instantiates its machinery once per signature, not once per module type,
// which saves every TU that includes the registry about 3 s here.)
template <class Impl>
module_kind kind_of() {
  module_kind kind;
  if constexpr (runtime_layout_module<Impl>) {
    kind.type_name = c10::demangle(typeid(Impl).name());
    kind.members = +[](torch::nn::Module& m) { return runtime_layout<Impl>::members(dynamic_cast<Impl&>(m)); };
    kind.reset = +[](torch::nn::Module& m) { reset_module(dynamic_cast<Impl&>(m)); };
    // Forms of one input tensor (a TransformerEncoder in a Sequential).
    if constexpr (requires(Impl& m, const AnyTensorDict& p, const at::Tensor& x) {
                    { functional<Impl>::forward(m, p, x) } -> std::same_as<at::Tensor>;
                  })
      kind.forward = +[](torch::nn::Module& m, const AnyTensorDict& p, const at::Tensor& x) -> at::Tensor {
        return functional<Impl>::forward(dynamic_cast<Impl&>(m), p, x);
      };
    if constexpr (requires(Impl& m, const AnyTensorDict& p, const at::Tensor& x, const batch_context& ctx) {
                    { batched<Impl>::forward(m, p, std::tuple<at::Tensor>(x), std::array<bool, 1>{}, ctx) } -> std::same_as<at::Tensor>;
                  })
    {
      kind.batched = +[](torch::nn::Module& m, const AnyTensorDict& p, const stacked& x, const batch_context& ctx) {
        return stacked{batched<Impl>::forward(dynamic_cast<Impl&>(m), p, std::tuple<at::Tensor>(x.value),
                                              std::array<bool, 1>{x.mapped}, ctx),
                       true};
      };
      kind.lowers = +[](torch::nn::Module& m, const AnyTensorDict& p) {
        if constexpr (requires(Impl& impl) { batched<Impl>::supports(impl); })
          if (!batched<Impl>::supports(dynamic_cast<Impl&>(m))) return false;
        // Partial params: the rest comes from the module, per set (vmap).
        return !::tensordict::detail::first_missing_tensor(m, p);
      };
    }
    return kind;
  } else if constexpr (!described_module<Impl>) {
    ::tensordict::compile_error::report<compile_error::registered_type_without_schema<Impl>>();
    return kind;
  } else {
    kind.type_name = c10::demangle(typeid(Impl).name());
    kind.members = &own_members<Impl>;
    kind.reset = +[](torch::nn::Module& m) { reset_module(dynamic_cast<Impl&>(m)); };
    using S = schema_of<Impl>;
    if constexpr (has_functional_form<Impl>) {
      if constexpr (requires(Impl& m, const TensorDict<S>& p, const at::Tensor& x) {
                      { functional<Impl>::forward(m, p, x) } -> std::convertible_to<at::Tensor>;
                    })
        kind.forward = +[](torch::nn::Module& m, const AnyTensorDict& p, const at::Tensor& x) -> at::Tensor {
          return functional<Impl>::forward(dynamic_cast<Impl&>(m), p.to_typed<S>({.allow_missing = true}), x);
        };
    }
    if constexpr (has_stacked_form<Impl>) {
      kind.batched = +[](torch::nn::Module& m, const AnyTensorDict& p, const stacked& x, const batch_context& ctx) {
        return batched<Impl>::forward(dynamic_cast<Impl&>(m), p.to_typed<S>({.allow_missing = true}), x, ctx);
      };
      kind.lowers = +[](torch::nn::Module& m, const AnyTensorDict& p) {
        if constexpr (requires(Impl& impl) { batched<Impl>::supports(impl); })
          if (!batched<Impl>::supports(dynamic_cast<Impl&>(m))) return false;
        // The batched forms take every tensor stacked; a module's own unstacked ones go through vmap.
        for (const auto& [name, member] : own_members<Impl>(m))
          if (member->defined() && !p.contains(name)) return false;
        return true;
      };
    }
    return kind;
  }
}

class module_registry {
 public:
  static module_registry& instance() {
    static module_registry registry;
    return registry;
  }

  void add(std::type_index type, module_kind kind) {
    std::unique_lock lock(mutex_);
    kinds_.insert_or_assign(type, std::make_shared<const module_kind>(std::move(kind)));
  }

  std::shared_ptr<const module_kind> find(const torch::nn::Module& m) const {
    std::shared_lock lock(mutex_);
    auto it = kinds_.find(std::type_index(typeid(m)));
    return it == kinds_.end() ? nullptr : it->second;
  }

 private:
  template <class... Impl>
  void add_builtins(type_list<Impl...>) {
    (add(typeid(Impl), kind_of<Impl>()), ...);
  }

  // Every built-in adapter's type (the one place that names them all).
  TENSORDICT_DECL module_registry();

  mutable std::shared_mutex mutex_;
  std::unordered_map<std::type_index, std::shared_ptr<const module_kind>> kinds_;
};

}  // namespace detail

// The torch::nn module types (demangled, "torch::nn::LinearImpl") the library
// knows: every built-in adapter's, and the containers that run-time models
// are made of (Sequential, ModuleList, ModuleDict).
TENSORDICT_DECL std::vector<std::string> supported_module_types();

// The torch::nn module types it has no adapter for, each with the reason (as
// the README's "Supported modules" lists them).
struct unsupported_module_type {
  std::string_view type;
  std::string_view reason;
};
inline constexpr std::array<unsupported_module_type, 2> unsupported_module_types{{
    {"torch::nn::ParameterListImpl",
     "has no forward to call, and its tensors are a list built at run time: hold them in a user module "
     "(TENSORDICT_MODULE) or as a run-time model's parameters"},
    {"torch::nn::ParameterDictImpl",
     "has no forward to call, and its tensors are named at run time: hold them in a user module (TENSORDICT_MODULE) "
     "or as a run-time model's parameters"},
}};

// Registers a user module type: its tensors come from its TENSORDICT_MODULE
// schema; its functional form from nn::functional<Impl> when specialized
// (otherwise its tensors are swapped in for the call). Thread-safe; call once.
template <class Impl>
void register_module_type() {
  detail::module_registry::instance().add(typeid(Impl), detail::kind_of<Impl>());
}

// As above, with a functional form given at run time: forward(module, its
// params (keys as its schema), input) must not write into the module.
template <class Impl, class Forward>
  requires std::is_invocable_r_v<at::Tensor, Forward&, Impl&, const AnyTensorDict&, const at::Tensor&>
void register_module_type(Forward forward) {
  module_kind kind = detail::kind_of<Impl>();
  kind.forward = [f = std::move(forward)](torch::nn::Module& m, const AnyTensorDict& p, const at::Tensor& x) mutable {
    return at::Tensor(f(dynamic_cast<Impl&>(m), p, x));
  };
  detail::module_registry::instance().add(typeid(Impl), std::move(kind));
}

}  // namespace nn
}  // namespace tensordict

// Header-only, the registry's constructor above is compiled in every TU that
// uses the registry, and it names every built-in type: such a TU includes
// every module family. By default (detail/config.hpp) only libtensordict's
// TU does; a program's TUs include the families they use.
#if TENSORDICT_DEFINITIONS
#include "adapters/builtin.hpp"

namespace tensordict::nn {
TENSORDICT_DECL detail::module_registry::module_registry() {
  add_builtins(builtin_modules{});
  add_builtins(builtin_runtime_layout_modules{});
}

TENSORDICT_DECL std::vector<std::string> supported_module_types() {
  std::vector<std::string> out{"torch::nn::SequentialImpl", "torch::nn::ModuleListImpl", "torch::nn::ModuleDictImpl"};
  [&]<class... Impl>(detail::type_list<Impl...>) {
    (out.push_back(c10::demangle(typeid(Impl).name())), ...);
  }(typename detail::concat_lists<detail::builtin_modules, detail::builtin_runtime_layout_modules>::type{});
  return out;
}
}  // namespace tensordict::nn
#endif  // TENSORDICT_DEFINITIONS
