// TensorDictParams: a TensorDict that is also a torch::nn::Module, so that
// parameters(), named_parameters(), to() and an optimizer see its leaves.
//
//   auto params = tensordict::nn::TensorDictParams<S>(tensordict::from_module(net));
//   struct Holder : torch::nn::Module { ... register_module("params", params); };
//   // named_parameters(): "params.0.weight", "params.0.bias", ...
//
// Each nested key becomes a child module, so the reference's dotted names come
// out of libtorch's own naming (which refuses dots inside one name). A tensor
// held at two paths (tied) is registered once, at the first. The
// wrapped TensorDict is not copied: a write through either side shows in the
// other, and the registry follows writes made through the TensorDictParams.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/ordered_dict.h>

#include "../any_tensordict.hpp"
#include "../detail/module_access.hpp"
#include "../detail/module_slots.hpp"
#include "../errors.hpp"
#include "../functional.hpp"
#include "../typed_tensordict.hpp"

namespace tensordict::nn {

// How a leaf is registered: by the dtype rule, or as it already was.
enum class leaf_kind : std::uint8_t { automatic, parameter, buffer };

struct params_options {
  bool no_convert = false;  // every leaf a buffer (unless its kind says parameter)
  bool lock = false;        // lock the wrapped TensorDict; writes through the TensorDictParams still work
};

namespace detail {
// A module's leaves to register: (path, tensor, as a parameter); an undefined tensor is skipped.
using leaves_to_register = std::vector<std::tuple<any_key_path, at::Tensor, bool>>;

// Registers each distinct tensor of `leaves` once below root, at the first path
// (in `leaves`' order) that holds it, and removes the registration of a later
// path holding it: a weight tied between two paths is one parameter, as in
// Python's parameters(), and an optimizer steps it once. Each parent key is a
// child module, created on first use; a leaf registered at a path before is
// replaced in place, or moved between the registries.
TENSORDICT_DECL void register_distinct(torch::nn::Module& root, const leaves_to_register& leaves);

inline bool float_dtype(const at::Tensor& t) {
  const auto dtype = t.defined() ? t.scalar_type() : at::kFloat;
  return dtype == at::kHalf || dtype == at::kFloat || dtype == at::kDouble;
}
}  // namespace detail

template <schema_type S>
class TensorDictParamsImpl : public torch::nn::Module {
 public:
  using schema_t = S;
  static constexpr std::size_t leaf_count = S::leaf_count;
  using kinds_t = std::array<leaf_kind, leaf_count>;
  // Called as hook(params, value) after each read of a leaf; a defined result replaces the value read.
  using get_hook = std::function<at::Tensor(const TensorDictParamsImpl&, const at::Tensor&)>;

  explicit TensorDictParamsImpl(TensorDict<S> td, params_options options = {}, kinds_t kinds = {})
      : td_(std::move(td)), options_(options), kinds_(kinds) {
    register_leaves();
    if (options_.lock) td_.lock_();
  }

  // The wrapped TensorDict itself (same storage).
  const TensorDict<S>& tensordict() const { return td_; }

  template <key... Path>
  decltype(auto) get() const {
    decltype(auto) value = td_.template get<Path...>();
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(value)>, at::Tensor>)
      return read(value);
    else
      return value;
  }

  // Replaces a leaf in the wrapped TensorDict and in the registry; a new
  // tensor follows the dtype rule (float: parameter, other: buffer).
  template <key... Path>
  TensorDictParamsImpl& set(at::Tensor value) {
    constexpr std::size_t i = leaf_index_v<S, Path...>;
    const bool relock = td_.is_locked();
    if (relock) td_.unlock_();
    try {
      td_.template set<Path...>(value);
    } catch (...) {
      if (relock) td_.lock_();
      throw;
    }
    if (relock) td_.lock_();
    kinds_[i] = leaf_kind::automatic;
    register_leaves();  // a tie made or broken changes what is registered where
    return *this;
  }

  // Leaf i in schema order, through the get hooks (undefined when unset).
  at::Tensor leaf(std::size_t i) const { return td_.leaf(i).defined() ? read(td_.leaf(i)) : at::Tensor(); }

  std::vector<at::Tensor> values() const {
    std::vector<at::Tensor> out;
    for (const auto& t : td_.values()) out.push_back(read(t));
    return out;
  }
  std::vector<std::pair<key_path, at::Tensor>> items() const {
    auto out = td_.items();
    for (auto& item : out) item.second = read(item.second);
    return out;
  }

  void register_get_post_hook(get_hook hook) { hooks_.push_back(std::move(hook)); }

  // Python's params.lerp_(end, weight), without recording gradients: each leaf
  // moved towards end's by weight in place (a target network's soft update,
  // target->lerp_(*online, 1 - tau)), so the registry and an optimizer keep it.
  TensorDictParamsImpl& lerp_(const TensorDict<S>& end, const at::Scalar& weight) {
    const at::NoGradGuard no_grad;
    td_.lerp_(end, weight);
    return *this;
  }
  TensorDictParamsImpl& lerp_(const TensorDict<S>& end, const at::Tensor& weight) {
    const at::NoGradGuard no_grad;
    td_.lerp_(end, weight);
    return *this;
  }
  TensorDictParamsImpl& lerp_(const TensorDictParamsImpl& end, const at::Scalar& weight) { return lerp_(end.td_, weight); }
  TensorDictParamsImpl& lerp_(const TensorDictParamsImpl& end, const at::Tensor& weight) { return lerp_(end.td_, weight); }

  bool is_parameter(std::size_t i) const { return kind_of(i) == leaf_kind::parameter; }

  // Flat state-dict names ("0.weight") to tensors, in schema order.
  torch::OrderedDict<std::string, at::Tensor> state_dict() const {
    torch::OrderedDict<std::string, at::Tensor> out;
    for (std::size_t i = 0; i < leaf_count; ++i)
      if (td_.leaf(i).defined()) out.insert(leaf_path<S>(i).join("."), td_.leaf(i));
    return out;
  }

  // Copies values in; the leaves keep their identity. strict: every leaf must
  // be given and nothing else (key_error naming the missing and unexpected
  // keys). Shapes are checked before anything is written.
  void load_state_dict(const torch::OrderedDict<std::string, at::Tensor>& dict, bool strict = true) {
    std::string missing, unexpected;
    std::vector<std::pair<std::size_t, at::Tensor>> loads;
    std::unordered_map<std::string, std::size_t> index;
    for (std::size_t i = 0; i < leaf_count; ++i) {
      if (!td_.leaf(i).defined()) continue;
      std::string name = leaf_path<S>(i).join(".");
      if (const at::Tensor* v = dict.find(name)) {
        if (v->sizes() != td_.leaf(i).sizes())
          throw shape_error("TensorDictParams.load_state_dict: \"" + name + "\" is " + describe(*v) + " but the leaf is " +
                            describe(td_.leaf(i)));
        loads.emplace_back(i, *v);
      } else {
        missing += (missing.empty() ? "\"" : ", \"") + name + "\"";
      }
      index.emplace(std::move(name), i);
    }
    for (const auto& item : dict)
      if (!index.count(item.key())) unexpected += (unexpected.empty() ? "\"" : ", \"") + item.key() + "\"";
    if (strict && (!missing.empty() || !unexpected.empty()))
      throw key_error("TensorDictParams.load_state_dict(strict): missing keys [" + missing + "], unexpected keys [" +
                      unexpected + "]");
    at::NoGradGuard no_grad;
    for (auto& [i, value] : loads) td_.leaf(i).copy_(value);
  }

  // New tensors of the same kinds; a tensor reached at two paths stays shared.
  std::shared_ptr<TensorDictParamsImpl> clone_params() const {
    std::unordered_map<const c10::TensorImpl*, at::Tensor> copies;
    std::array<at::Tensor, leaf_count> leaves;
    kinds_t kinds{};
    for (std::size_t i = 0; i < leaf_count; ++i) {
      const at::Tensor& t = td_.leaf(i);
      kinds[i] = kind_of(i);
      if (!t.defined()) continue;
      auto [it, fresh] = copies.try_emplace(t.unsafeGetTensorImpl());
      if (fresh) it->second = t.detach().clone().requires_grad_(t.requires_grad());
      leaves[i] = it->second;
    }
    return std::make_shared<TensorDictParamsImpl>(TensorDict<S>(std::move(leaves), td_.batch_size(), td_.device()),
                                                  params_options{options_.no_convert, false}, kinds);
  }

  // torch::nn::Module::clone, as Python's clone() (deepcopy): new tensors of
  // the same kinds, ties kept, moved to `device` if one is given.
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& device = c10::nullopt) const override {
    auto copy = clone_params();
    if (device) copy->to(*device);
    return copy;
  }

  void pretty_print(std::ostream& stream) const override { stream << "TensorDictParams(params=" << td_.repr() << ")"; }

 private:
  at::Tensor read(const at::Tensor& value) const {
    at::Tensor out = value;
    for (const auto& hook : hooks_)
      if (at::Tensor r = hook(*this, out); r.defined()) out = r;
    return out;
  }

  leaf_kind kind_of(std::size_t i) const {
    if (kinds_[i] != leaf_kind::automatic) return kinds_[i];
    if (options_.no_convert) return leaf_kind::buffer;
    return detail::float_dtype(td_.leaf(i)) ? leaf_kind::parameter : leaf_kind::buffer;
  }

  void register_leaves() {
    detail::leaves_to_register leaves;
    leaves.reserve(leaf_count);
    for (std::size_t i = 0; i < leaf_count; ++i) {
      const auto& entry = leaf_paths_v<S>[i];
      leaves.emplace_back(std::vector<std::string>(entry.parts.begin(), entry.parts.begin() + entry.depth), td_.leaf(i),
                          kind_of(i) == leaf_kind::parameter);
    }
    detail::register_distinct(*this, leaves);
  }

  TensorDict<S> td_;
  params_options options_;
  kinds_t kinds_;
  std::vector<get_hook> hooks_;
};

template <schema_type S>
class TensorDictParams : public torch::nn::ModuleHolder<TensorDictParamsImpl<S>> {
 public:
  using torch::nn::ModuleHolder<TensorDictParamsImpl<S>>::ModuleHolder;
  using Impl = TensorDictParamsImpl<S>;
  // TensorDictParams(td, {.no_convert = true}), S deduced: ModuleHolder's forwarding constructor cannot take a braced list.
  explicit TensorDictParams(TensorDict<S> td, params_options options = {})
      : torch::nn::ModuleHolder<Impl>(std::make_shared<Impl>(std::move(td), options)) {}
};

// The run-time form: a TensorDictParams over an AnyTensorDict (a model whose
// structure is known at run time: from_module(seq, nn::as_module)). Its
// leaves are registered as the typed form's; `parameters` has a leaf at each
// path to register as a parameter (the others are buffers: a module's, from
// detail::parameters_of); without it, the dtype rule (float: parameter).
class AnyTensorDictParamsImpl : public torch::nn::Module {
 public:
  TENSORDICT_DECL explicit AnyTensorDictParamsImpl(AnyTensorDict td, std::optional<AnyTensorDict> parameters = std::nullopt);

  // The wrapped AnyTensorDict itself (same storage).
  const AnyTensorDict& tensordict() const { return td_; }

  // As TensorDictParamsImpl::lerp_: in place, without recording gradients.
  AnyTensorDictParamsImpl& lerp_(const AnyTensorDict& end, const at::Scalar& weight) {
    const at::NoGradGuard no_grad;
    td_.lerp_(end, weight);
    return *this;
  }
  AnyTensorDictParamsImpl& lerp_(const AnyTensorDict& end, const at::Tensor& weight) {
    const at::NoGradGuard no_grad;
    td_.lerp_(end, weight);
    return *this;
  }

  TENSORDICT_DECL void pretty_print(std::ostream& stream) const override;

 private:
  AnyTensorDict td_;
};

class AnyTensorDictParams : public torch::nn::ModuleHolder<AnyTensorDictParamsImpl> {
 public:
  using torch::nn::ModuleHolder<AnyTensorDictParamsImpl>::ModuleHolder;
  using Impl = AnyTensorDictParamsImpl;
};

// The tag of the from_module / from_modules overloads that return a TensorDictParams.
inline constexpr struct as_module_t {
} as_module{};

// Every parameter of `module` (and of its children, with recurse) once, in
// parameters()' order: what an optimizer should be given. libtorch's
// parameters() lists a tensor once per registration, so a weight tied
// between two TensorDictParams (or two modules) would be stepped twice;
// Python's module.parameters() lists it once, as this does.
//   torch::optim::SGD sgd(tensordict::nn::unique_parameters(*holder), 0.1);
TENSORDICT_DECL std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module, bool recurse = true);

namespace detail {
// Parameter or buffer, as the module registered each leaf.
template <class Impl>
typename TensorDictParamsImpl<schema_of<Impl>>::kinds_t kinds_of(Impl& m) {
  typename TensorDictParamsImpl<schema_of<Impl>>::kinds_t kinds{};
  auto slots = ::tensordict::detail::slots_of<Impl>(m);
  for (std::size_t i = 0; i < slots.size(); ++i)
    kinds[i] = ::tensordict::detail::module_parameters(*slots[i].owner).find(std::string(slots[i].name))
                   ? leaf_kind::parameter
                   : leaf_kind::buffer;
  return kinds;
}

// The module's registered parameters (its children's too) by path.
TENSORDICT_DECL AnyTensorDict parameters_of(const torch::nn::Module& m);
}  // namespace detail

}  // namespace tensordict::nn

namespace tensordict {

// from_module(m, nn::as_module): the module's own tensors in a TensorDictParams,
// each registered as the module registered it.
template <class Module>
  requires(!nn::dynamic_module<Module> && !nn::runtime_layout_module<Module>)
auto from_module(Module&& module, nn::as_module_t) {
  using S = nn::schema_of<nn::impl_of_t<Module>>;
  auto& impl = detail::impl_ref(module);
  return nn::TensorDictParams<S>(
      std::make_shared<nn::TensorDictParamsImpl<S>>(from_module(impl), nn::params_options{}, nn::detail::kinds_of(impl)));
}

// from_modules(ms, nn::as_module): the stacked parameters in a TensorDictParams, for an optimizer.
template <class Module>
  requires(!nn::dynamic_module<Module> && !nn::runtime_layout_module<Module>)
auto from_modules(const std::vector<Module>& modules, nn::as_module_t) {
  using S = nn::schema_of<nn::impl_of_t<Module>>;
  auto kinds = nn::detail::kinds_of(detail::impl_ref(modules.at(0)));
  return nn::TensorDictParams<S>(std::make_shared<nn::TensorDictParamsImpl<S>>(from_modules(modules), nn::params_options{}, kinds));
}

// The run-time forms: an AnyTensorDictParams, each leaf registered as the
// module registered it.
template <class M>
  requires nn::dynamic_module<M> || nn::runtime_layout_module<M>
nn::AnyTensorDictParams from_module(M&& module, nn::as_module_t) {
  return nn::AnyTensorDictParams(std::make_shared<nn::AnyTensorDictParamsImpl>(
      from_module(module), nn::detail::parameters_of(detail::dynamic_ref(module))));
}

template <class M>
  requires nn::dynamic_module<M> || nn::runtime_layout_module<M>
nn::AnyTensorDictParams from_modules(const std::vector<M>& modules, nn::as_module_t) {
  return nn::AnyTensorDictParams(std::make_shared<nn::AnyTensorDictParamsImpl>(
      from_modules(modules), nn::detail::parameters_of(detail::dynamic_ref(modules.at(0)))));
}

}  // namespace tensordict

#if TENSORDICT_DEFINITIONS
namespace tensordict::nn {
namespace detail {
// The module that holds the leaf at `path` below root: the child modules of
// its parent keys, created on the way with create, else nullptr where one is missing.
TENSORDICT_DECL torch::nn::Module* owner_of(torch::nn::Module& root, c10::ArrayRef<std::string> path, bool create) {
  torch::nn::Module* owner = &root;
  for (std::size_t d = 0; d + 1 < path.size(); ++d) {
    auto children = owner->named_children();
    if (auto* child = children.find(path[d]))
      owner = child->get();
    else if (create)
      owner = owner->register_module(path[d], std::make_shared<torch::nn::Module>()).get();
    else
      return nullptr;
  }
  return owner;
}

// Registers t under `path` below root (one child module per parent key,
// created on first use) as a parameter or a buffer; a leaf registered there
// before is replaced in place, or moved between the registries.
TENSORDICT_DECL void register_leaf_at(torch::nn::Module& root, c10::ArrayRef<std::string> path, const at::Tensor& t, bool parameter) {
  torch::nn::Module* owner = owner_of(root, path, /*create=*/true);
  const std::string& name = path.back();
  auto& params = ::tensordict::detail::module_parameters(*owner);
  auto& buffers = ::tensordict::detail::module_buffers(*owner);
  if (parameter && t.is_floating_point() && t.is_leaf() && !t.requires_grad()) t.set_requires_grad(true);
  if (at::Tensor* p = params.find(name)) {
    if (parameter) {
      *p = t;
      return;
    }
    params.erase(name);
  }
  if (at::Tensor* b = buffers.find(name)) {
    if (!parameter) {
      *b = t;
      return;
    }
    buffers.erase(name);
  }
  if (parameter)
    owner->register_parameter(name, t, /*requires_grad=*/t.requires_grad());
  else
    owner->register_buffer(name, t);
}

// Removes what is registered under `path` below root, if anything.
TENSORDICT_DECL void unregister_leaf_at(torch::nn::Module& root, c10::ArrayRef<std::string> path) {
  torch::nn::Module* owner = owner_of(root, path, /*create=*/false);
  if (!owner) return;
  for (auto* registry : {&::tensordict::detail::module_parameters(*owner), &::tensordict::detail::module_buffers(*owner)})
    if (registry->find(path.back())) registry->erase(path.back());
}

TENSORDICT_DECL void register_distinct(torch::nn::Module& root, const leaves_to_register& leaves) {
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& [path, t, parameter] : leaves) {
    if (!t.defined()) continue;
    if (seen.insert(t.unsafeGetTensorImpl()).second)
      register_leaf_at(root, path, t, parameter);
    else
      unregister_leaf_at(root, path);
  }
}

TENSORDICT_DECL AnyTensorDict parameters_of(const torch::nn::Module& m) {
  AnyTensorDict out;
  any_key_path path;
  ::tensordict::detail::collect(m, out, path, /*with_buffers=*/false);
  return out;
}
}  // namespace detail

TENSORDICT_DECL AnyTensorDictParamsImpl::AnyTensorDictParamsImpl(AnyTensorDict td, std::optional<AnyTensorDict> parameters)
    : td_(std::move(td)) {
  detail::leaves_to_register leaves;
  td_.for_each_leaf([&](const any_key_path& path, const at::Tensor& t) {
    leaves.emplace_back(path, t, parameters ? parameters->contains(path) : detail::float_dtype(t));
  });
  detail::register_distinct(*this, leaves);
}

TENSORDICT_DECL void AnyTensorDictParamsImpl::pretty_print(std::ostream& stream) const {
  stream << "TensorDictParams(params=" << td_.repr() << ")";
}

TENSORDICT_DECL std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module, bool recurse) {
  std::vector<at::Tensor> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const at::Tensor& p : module.parameters(recurse))
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}
}  // namespace tensordict::nn
#endif  // TENSORDICT_DEFINITIONS
