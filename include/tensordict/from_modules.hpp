// from_modules: N modules' parameters stacked along a new leading dim
// (batch_size [N]), typed or run-time, for ensembles and functional_vmap.
//
//   auto stacked = tensordict::from_modules(a, b, c);                        // batch_size [3]
//   auto shared = tensordict::from_modules(ms, {.expand_identical = true});  // shared tensors expanded
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/stack.h>

#include "any_tensordict.hpp"
#include "errors.hpp"
#include "from_module.hpp"
#include "typed_tensordict.hpp"

namespace tensordict {

namespace compile_error {
template <class First, class Other>
struct from_modules_of_different_types {
  static_assert(always_false<Other>,
                "tensordict::from_modules: every module must have the same type (the first two that differ are "
                "named above in 'from_modules_of_different_types<...>'); their parameters are stacked leaf by leaf.");
};
}  // namespace compile_error

// How from_modules stacks (Python's from_modules(..., expand_identical=...)).
struct from_modules_options {
  // A tensor that every module shares (the same tensor: a shared sub-module)
  // is not copied: the leaf is that tensor expanded along the new dim, so it
  // shares its storage and gradients reach it.
  bool expand_identical = false;
};

namespace detail {
// The leaf for the tensors `parts` of every module, stacked into `stacked`.
inline at::Tensor stacked_leaf(const at::Tensor& stacked, c10::ArrayRef<at::Tensor> parts, from_modules_options options) {
  const bool identical = std::all_of(parts.begin(), parts.end(), [&](const at::Tensor& t) { return t.is_same(parts[0]); });
  if (options.expand_identical && identical) return parts[0].expand(stacked.sizes());
  return stacked.detach().requires_grad_(parts[0].requires_grad());
}
}  // namespace detail

// The modules' parameters stacked along a new leading dim (batch_size [N]).
// The leaves are new tensors: gradients reach them, not the modules' own
// (but see from_modules_options::expand_identical).
template <class Module>
  requires(!nn::dynamic_module<Module> && !nn::runtime_layout_module<Module>)
auto from_modules(const std::vector<Module>& modules, from_modules_options options = {}) {
  using S = nn::schema_of<nn::impl_of_t<Module>>;
  if (modules.empty()) throw shape_error("tensordict::from_modules: needs at least one module");
  std::vector<TensorDict<S>> each;
  each.reserve(modules.size());
  for (const auto& m : modules) each.push_back(from_module(m));
  TensorDict<S> stacked = [&] {
    at::NoGradGuard no_grad;
    return stack(each);
  }();
  std::array<at::Tensor, S::leaf_count> leaves;
  std::vector<at::Tensor> parts(each.size());
  for (std::size_t i = 0; i < S::leaf_count; ++i) {
    if (!stacked.leaf(i).defined()) continue;
    for (std::size_t k = 0; k < each.size(); ++k) parts[k] = each[k].leaf(i);
    leaves[i] = detail::stacked_leaf(stacked.leaf(i), parts, options);
  }
  return TensorDict<S>(std::move(leaves), stacked.batch_size());
}

template <class First, class... Rest>
  requires(sizeof...(Rest) > 0 && !nn::dynamic_module<First> && !nn::runtime_layout_module<First>)
auto from_modules(const First& first, const Rest&... rest) {
  using F = nn::impl_of_t<First>;
  using mismatch = typename detail::first_mismatch<F, nn::impl_of_t<Rest>...>::type;
  if constexpr (!std::is_void_v<mismatch>) {
    compile_error::report<compile_error::from_modules_of_different_types<F, mismatch>>();
    return TensorDict<nn::schema_of<F>>();
  } else {
    return from_modules(std::vector<First>{first, rest...});
  }
}

// The modules' tensors stacked along a new leading dim (batch_size [N]); new
// leaves, as the typed from_modules.
template <class M>
  requires nn::dynamic_module<M> || nn::runtime_layout_module<M>
AnyTensorDict from_modules(const std::vector<M>& modules, from_modules_options options = {}) {
  if (modules.empty()) throw shape_error("tensordict::from_modules: needs at least one module");
  std::vector<AnyTensorDict> each;
  for (const auto& m : modules) each.push_back(from_module(m));
  AnyTensorDict stacked = [&] {
    at::NoGradGuard no_grad;
    return stack(each);
  }();
  AnyTensorDict out(stacked.batch_size());
  std::vector<at::Tensor> parts(each.size());
  stacked.for_each_leaf([&](const any_key_path& path, const at::Tensor& t) {
    for (std::size_t k = 0; k < each.size(); ++k) parts[k] = each[k].get(path);
    out.set(path, detail::stacked_leaf(t, parts, options));
  });
  return out;
}

}  // namespace tensordict
