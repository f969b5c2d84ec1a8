// TensorDictModule and EnsembleModule.
//
//   using member_t = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<"x">, tdn::out_keys<"y">>;
//   member_t member(torch::nn::Linear(3, 1));
//   tdn::EnsembleModule<member_t> ensemble(member, 4);          // 4 fresh copies
//   auto out = ensemble->forward(td);                           // batch_size [4, *td.batch_size]
//
// A TensorDictModule reads its in keys from a TensorDict and writes its out
// keys; the output schema (input schema plus the out keys) is computed by the
// compiler, and a TensorDict that lacks an in key does not compile.
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "functional_vmap.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>
#include <utility>

#include <ATen/ops/cat.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "../detail/module_access.hpp"
#include "sequential.hpp"  // nn::touches_module, specialized here
#include "params.hpp"
#include "reset_parameters.hpp"

namespace tensordict::nn {

template <key... Keys>
struct in_keys {};
template <key... Keys>
struct out_keys {};

// How a TensorDictModule hands its in keys' tensors to the module: one
// argument each (separate_inputs, the default), or concatenated along their
// last dim into one (cat_inputs, as TorchRL's MLP takes a critic's
// observation and action): TensorDictModule<Mlp, in_keys<"observation",
// "action">, out_keys<"value">, cat_inputs>.
struct separate_inputs {};
struct cat_inputs {};

namespace compile_error {
template <class InKey, class Available>
struct tensordict_lacks_in_key {
  static_assert(::tensordict::compile_error::always_false<Available>,
                "tensordict::nn::TensorDictModule: the TensorDict has no leaf for an in key (first in "
                "'tensordict_lacks_in_key<...>' above; then the keys at the level where the key path stops "
                "matching). Set it before calling the module.");
};
}  // namespace compile_error

namespace detail {
// S with a leaf at the key path Path, and the sub-TensorDicts on the way, where it has none.
template <class S, key... Path>
struct with_leaf_at {
  using type = S;  // a path through a leaf: left for get/set to report
};
template <class... Fields, key Name>
struct with_leaf_at<schema<Fields...>, Name> {
  using type = std::conditional_t<schema<Fields...>::find(Name.view()) == npos, schema<Fields..., leaf<Name>>, schema<Fields...>>;
};
template <class... Fields, key Name, key Next, key... Rest>
struct with_leaf_at<schema<Fields...>, Name, Next, Rest...> {
  template <class F>
  using grown = std::conditional_t<F::name == Name, field<Name, typename with_leaf_at<typename F::type, Next, Rest...>::type>, F>;
  using type = std::conditional_t<schema<Fields...>::find(Name.view()) == npos,
                                  schema<Fields..., field<Name, typename with_leaf_at<schema<>, Next, Rest...>::type>>,
                                  schema<grown<Fields>...>>;
};
template <class S>
struct leaf_adder {
  template <key... Path>
  using type = typename with_leaf_at<S, Path...>::type;
};

// S with a leaf for each out key (a key, or a nested_key) it does not have yet.
template <class S, key... Out>
struct with_out_keys;
template <class S>
struct with_out_keys<S> {
  using type = S;
};
template <class S, key First, key... Rest>
struct with_out_keys<S, First, Rest...> {
  using grown = typename ::tensordict::detail::key_parts_of<First>::template apply<leaf_adder<S>::template type>;
  using type = typename with_out_keys<grown, Rest...>::type;
};

// Whether S has a leaf or sub-tree at the path K names.
template <class S>
struct path_query {
  template <key... Path>
  struct has : std::bool_constant<has_path_v<S, Path...>> {};
};
template <class S, key K>
inline constexpr bool has_key_v = ::tensordict::detail::key_parts_of<K>::template apply<path_query<S>::template has>::value;

// td's value at the path K names, and setting it.
template <key K, class TD>
decltype(auto) get_key(const TD& td) {
  return []<key... Path>(key_path_t<Path...>, const TD& t) -> decltype(auto) { return t.template get<Path...>(); }(
      key_parts_t<K>{}, td);
}
template <key K, class TD>
void set_key(TD& td, at::Tensor value) {
  []<key... Path>(key_path_t<Path...>, TD& t, at::Tensor v) { t.template set<Path...>(std::move(v)); }(key_parts_t<K>{}, td,
                                                                                                         std::move(value));
}

// A TensorDict of schema O (S grown by out keys) holding td's leaves, the out keys' not set yet.
template <class O, class S>
TensorDict<O> with_leaves_of(const TensorDict<S>& td, c10::IntArrayRef batch) {
  constexpr auto& where = ::tensordict::detail::embedding<S, O>::leaves;
  std::array<at::Tensor, O::leaf_count> leaves;
  for (std::size_t i = 0; i < S::leaf_count; ++i) leaves[where[i]] = td.leaf(i);
  return TensorDict<O>(std::move(leaves), batch, td.device());
}

// The in keys' tensors joined along their last dim (cat_inputs); their
// leading dims must be equal (shape_error naming each key's tensor).
inline at::Tensor cat_last(const std::vector<at::Tensor>& parts, const std::vector<std::string>& keys, const std::string& who) {
  bool same = true;
  for (const at::Tensor& t : parts)
    same = same && t.dim() >= 1 && t.dim() == parts.front().dim() &&
           std::equal(t.sizes().begin(), t.sizes().end() - 1, parts.front().sizes().begin());
  if (!same) {
    std::string listed;
    for (std::size_t i = 0; i < parts.size(); ++i) listed += (i ? ", " : "") + keys[i] + " " + describe(parts[i]);
    throw shape_error(who + ": cat_inputs joins the in keys' tensors along their last dim, so their other dims must be "
                      "equal; got " + listed);
  }
  return parts.size() == 1 ? parts.front() : at::cat(parts, -1);
}
template <key... In>
at::Tensor cat_in_keys(const std::vector<at::Tensor>& parts) {
  return cat_last(parts, {key_parts_t<In>::describe()...}, "tensordict::nn::TensorDictModule");
}
// f(the in keys' tensors): one argument each, or joined (cat_inputs) into one.
template <class Inputs, key... In, class F, class... T>
decltype(auto) with_inputs(F&& f, const T&... tensors) {
  if constexpr (std::is_same_v<Inputs, cat_inputs>)
    return f(cat_in_keys<In...>({tensors...}));
  else
    return f(tensors...);
}

// Reports (does not compile) the first in key that S lacks.
template <class S, key... In>
constexpr void report_missing_in_keys() {
  auto one = []<key K>() {
    if constexpr (!has_key_v<S, K>)
      ::tensordict::compile_error::report<
          ::tensordict::nn::compile_error::tensordict_lacks_in_key<
              key_parts_t<K>, typename ::tensordict::detail::keys_where_path_fails<S, key_parts_t<K>>::type>>();
  };
  (one.template operator()<In>(), ...);
}

}  // namespace detail

// (The wrapped module's type is not called Module: inside a class derived from
// torch::nn::Module that name means the base.)
template <class Wrapped, class In, class Out, class Inputs = separate_inputs>
class TensorDictModuleImpl;

template <class Wrapped, key... In, key... Out, class Inputs>
class TensorDictModuleImpl<Wrapped, in_keys<In...>, out_keys<Out...>, Inputs> : public torch::nn::Module {
  static_assert(sizeof...(Out) >= 1, "tensordict::nn::TensorDictModule: name an out key for each tensor the module returns.");
  static_assert(std::is_same_v<Inputs, separate_inputs> || std::is_same_v<Inputs, cat_inputs>,
                "tensordict::nn::TensorDictModule: its fourth argument is separate_inputs (the default) or cat_inputs.");

 public:
  using module_type = Wrapped;
  using inner_impl = impl_of_t<Wrapped>;
  using in_keys_t = in_keys<In...>;
  using out_keys_t = out_keys<Out...>;
  using inputs_t = Inputs;

  explicit TensorDictModuleImpl(Wrapped wrapped)
      : module(::tensordict::detail::registered_child(*this, "module", std::move(wrapped))) {}

  template <class S>
  using output_schema = typename detail::with_out_keys<S, Out...>::type;

  // Reads the in keys, writes the out key; the result shares the input's tensors.
  template <class S>
  static constexpr bool has_in_keys() {
    return (detail::has_key_v<S, In> && ...);
  }

  template <class S>
  TensorDict<output_schema<S>> forward(const TensorDict<S>& td) {
    if constexpr (!has_in_keys<S>()) {
      check_in_keys<S>();  // reports the missing key; nothing more to compile
      return TensorDict<output_schema<S>>();
    } else {
      return with_output(td, detail::with_inputs<Inputs, In...>([&](const auto&... x) { return module->forward(x...); },
                                                                 detail::get_key<In>(td)...));
    }
  }

  // The input plus the output's tensors at the out keys, in order (an LSTM's
  // (output, (h, c)) fills three keys); batch size of the input, or `batch`.
  template <class S, class Output>
  static TensorDict<output_schema<S>> with_output(const TensorDict<S>& td, const Output& out,
                                                  std::optional<c10::IntArrayRef> batch = std::nullopt) {
    constexpr std::size_t count = detail::tensor_count<Output>;
    static_assert(count == sizeof...(Out),
                  "tensordict::nn::TensorDictModule: the number of out keys differs from the number of tensors that "
                  "the module returns (nested tuples count each tensor: an LSTM's (output, (h, c)) needs three).");
    auto result = detail::with_leaves_of<output_schema<S>>(td, batch.value_or(td.batch_size()));
    if constexpr (count == sizeof...(Out)) {
      std::array<at::Tensor, count> parts;
      at::Tensor* to = parts.data();
      detail::flatten_output(out, to);
      std::size_t k = 0;
      (detail::set_key<Out>(result, parts[k++]), ...);
    }
    return result;
  }

  template <class S>
  static constexpr void check_in_keys() {
    detail::report_missing_in_keys<S, In...>();
  }

  Wrapped module;
};

template <class Wrapped, class In, class Out, class Inputs = separate_inputs>
class TensorDictModule : public torch::nn::ModuleHolder<TensorDictModuleImpl<Wrapped, In, Out, Inputs>> {
 public:
  using Impl = TensorDictModuleImpl<Wrapped, In, Out, Inputs>;
  using torch::nn::ModuleHolder<Impl>::ModuleHolder;
  explicit TensorDictModule(Wrapped wrapped) : torch::nn::ModuleHolder<Impl>(std::make_shared<Impl>(std::move(wrapped))) {}
  // module(td), as in Python (ModuleHolder's operator() cannot see a template forward).
  template <class S>
  auto operator()(const TensorDict<S>& td) const {
    return this->ptr()->forward(td);
  }
};

// ---- adapter: schema and functional form ------------------------------------------

template <class Wrapped, class In, class Out, class Inputs>
struct module_traits<TensorDictModuleImpl<Wrapped, In, Out, Inputs>> {
  using members = member_list<member<"module", member_pointer<&TensorDictModuleImpl<Wrapped, In, Out, Inputs>::module>>>;
};

// A TensorDictModule's forward with its wrapped module's functional form (or
// its tensors swapped in, for a module type without one).
template <class Wrapped, key... In, class Out, class Inputs>
struct functional<TensorDictModuleImpl<Wrapped, in_keys<In...>, Out, Inputs>> {
  static constexpr bool is_functional = true;
  using Impl = TensorDictModuleImpl<Wrapped, in_keys<In...>, Out, Inputs>;
  template <class S>
  static auto forward(Impl& m, const TensorDict<schema_of<Impl>>& p, const TensorDict<S>& td) {
    if constexpr (schema_of<Impl>::leaf_count == 0)
      return m.forward(td);
    else
      return Impl::with_output(td, detail::with_inputs<Inputs, In...>(
                                       [&](const auto&... x) {
                                         return ::tensordict::functional_call(m.module, p.template get<"module">(), x...);
                                       },
                                       detail::get_key<In>(td)...));
  }
};

template <class Wrapped, class In, class Out, class Inputs>
struct touches_module<TensorDictModuleImpl<Wrapped, In, Out, Inputs>> : touches_module<impl_of_t<Wrapped>> {};

namespace detail {
// Whether an ensemble of this member keeps its copies in an AnyTensorDict: a
// TensorDictModule whose wrapped module's tensors are named at run time (an
// LSTM, a torch::nn::Sequential).
template <class MemberImpl>
constexpr bool runtime_member() {
  if constexpr (requires { typename MemberImpl::inner_impl; })
    return dynamic_module<typename MemberImpl::inner_impl> || runtime_layout_module<typename MemberImpl::inner_impl>;
  else
    return false;
}

// Whether a (typed) member has no tensors.
template <class MemberImpl>
constexpr bool tensor_free_member() {
  if constexpr (runtime_member<MemberImpl>())
    return false;
  else
    return schema_of<MemberImpl>::leaf_count == 0;
}

// A TensorDictModule's params: its wrapped module's ("module"), typed or run-time.
template <class S>
auto wrapped_params(const TensorDict<S>& p) {
  return p.template get<"module">();
}
inline AnyTensorDict wrapped_params(const AnyTensorDict& p) { return p.get_tensordict({"module"}); }
}  // namespace detail

// ---- the copies of an ensemble, at once ---------------------------------------------

// ensemble_forward<Impl>::forward(m, params, td, options, shared_batch): Impl's
// forward once per set of params (params' batch dim 0 indexes the sets), as
// EnsembleModule runs its member. With shared_batch empty, td's batch dim 0
// indexes the sets too; else every set reads td, and the result's batch size
// is shared_batch ([sets, *td's batch size]). Specialized beside each key-wired
// module type.
template <class Impl>
struct ensemble_forward;

template <class Wrapped, key... In, class Out, class Inputs>
struct ensemble_forward<TensorDictModuleImpl<Wrapped, in_keys<In...>, Out, Inputs>> {
  using Impl = TensorDictModuleImpl<Wrapped, in_keys<In...>, Out, Inputs>;
  template <class P, class S>
  static auto forward(Impl& m, const P& params, const TensorDict<S>& td, const functional_vmap_options& o,
                      c10::IntArrayRef shared_batch) {
    if constexpr (detail::tensor_free_member<Impl>()) {
      return m.forward(shared_batch.empty() ? td : td.expand(shared_batch));  // no tensors: the sets' dim is a batch dim
    } else if constexpr (std::is_same_v<Inputs, cat_inputs>) {
      // The joined tensor is mapped (td's batch dim 0 indexes the sets) or shared as td is: one input, named by the first key.
      const auto p = detail::wrapped_params(params);
      const at::Tensor x = detail::cat_in_keys<In...>({detail::get_key<In>(td)...});
      constexpr auto first = std::get<0>(std::make_tuple(In...));
      if (shared_batch.empty())
        return Impl::with_output(td, functional_vmap(*m.module, p, {}, kwargs(kw<first>(x)), in_dims(in_dim_of<first>{0}), o));
      return Impl::with_output(td.expand(shared_batch), functional_vmap(*m.module, p, args(x), {}, {}, o), shared_batch);
    } else {
      const auto p = detail::wrapped_params(params);
      if (shared_batch.empty())
        return Impl::with_output(td, functional_vmap(*m.module, p, {}, kwargs(kw<In>(detail::get_key<In>(td))...),
                                                     in_dims(in_dim_of<In>{0}...), o));
      return Impl::with_output(td.expand(shared_batch), functional_vmap(*m.module, p, args(detail::get_key<In>(td)...), {}, {}, o),
                               shared_batch);
    }
  }
};

namespace detail {
// impl once per set of params (n of them) on td: shared by every set (the
// result's batch size [n, *td's]), or mapped (td's batch dim 0 indexes the sets).
template <class Impl, class P, class S>
auto forward_over_sets(Impl& impl, const P& params, std::int64_t n, const TensorDict<S>& td, bool mapped,
                       const functional_vmap_options& o, const std::string& who) {
  if (mapped) {
    if (td.batch_dims() == 0 || td.batch_size()[0] != n)
      throw value_error(who + ": the input's batch dim 0 must index the " + std::to_string(n) + " sets (num_copies=" +
                        std::to_string(n) + "), got batch_size=" + format_sizes(td.batch_size()));
    return ensemble_forward<Impl>::forward(impl, params, td, o, {});
  }
  std::vector<std::int64_t> batch{n};
  batch.insert(batch.end(), td.batch_size().begin(), td.batch_size().end());
  return ensemble_forward<Impl>::forward(impl, params, td, o, batch);
}
}  // namespace detail

// functional_vmap over a key-wired module (a TensorDictModule, a
// TensorDictSequential, a probabilistic module): Python's
// vmap(module, (None, 0))(td, params) with td shared by every set, or, with
// td_in_dim = 0, vmap(module, (0, 0)): td's batch dim 0 indexes the sets.
// params are the module's stacked (from_modules, an EnsembleModule's
// params_td), one batch dim; the result's batch size is [sets, *td's].
//   auto out = tdn::functional_vmap(policy, stacked, td);
template <class Module, class P, class S>
  requires requires { sizeof(ensemble_forward<impl_of_t<Module>>); }
auto functional_vmap(Module&& module, const TensorDict<P>& params, const TensorDict<S>& td,
                     std::optional<std::int64_t> td_in_dim = std::nullopt, functional_vmap_options options = {}) {
  using Impl = impl_of_t<Module>;
  if (params.batch_dims() != 1)
    throw value_error("tensordict::nn::functional_vmap: a key-wired module's params have one batch dim (the sets), got "
                      "batch_size=" + format_sizes(params.batch_size()));
  if (td_in_dim && *td_in_dim != 0)
    throw value_error("tensordict::nn::functional_vmap: a TensorDict is mapped over its batch dim 0 or shared, got in_dim " +
                      std::to_string(*td_in_dim));
  return detail::forward_over_sets(::tensordict::detail::impl_ref(module), ::tensordict::detail::as_module_params<Impl>(params),
                                   params.batch_size()[0], td, td_in_dim.has_value(), options, "tensordict::nn::functional_vmap");
}

// ---- EnsembleModule ----------------------------------------------------------------

struct ensemble_options {
  bool expand_input = true;  // every copy sees the same input; false: the input's first batch dim indexes the copies
  tensordict::randomness randomness = tensordict::randomness::error;
};

namespace detail {
// The ensemble's stacked parameters, keyed as from_module(member) (Python's "module.0.weight").
template <class MemberImpl, bool RunTime = runtime_member<MemberImpl>()>
struct ensemble_params {
  using type = TensorDictParams<schema_of<MemberImpl>>;
  static type make(MemberImpl& member, std::int64_t n) {
    auto stacked = stack(std::vector<TensorDict<schema_of<MemberImpl>>>(static_cast<std::size_t>(n), from_module(member).detach()));
    reset_parameters(member, stacked);  // one draw per copy; the member keeps its values
    auto kinds = kinds_of(member);
    for (std::size_t i = 0; i < kinds.size(); ++i)
      if (kinds[i] == leaf_kind::parameter && stacked.leaf(i).defined()) stacked.leaf(i).requires_grad_(true);
    return type(std::make_shared<typename type::Impl>(stacked, params_options{}, kinds));
  }
};
template <class MemberImpl>
struct ensemble_params<MemberImpl, true> {
  using type = AnyTensorDictParams;
  static type make(MemberImpl& member, std::int64_t n) {
    torch::nn::Module& m = member;
    const AnyTensorDict one = from_module(m).apply([](const at::Tensor& t) { return t.detach(); });
    AnyTensorDict stacked = stack(std::vector<AnyTensorDict>(static_cast<std::size_t>(n), one));
    reset_parameters(m, stacked);
    return type(std::make_shared<AnyTensorDictParamsImpl>(stacked, parameters_of(m)));
  }
};

}  // namespace detail

// Python's EnsembleModule: `module` is the member (its own tensors are not
// used by forward), `params_td` the copies' stacked tensors, so the names
// from_module and state_dict give are Python's ("params_td.module.0.weight").
// The member is a TensorDictModule, a TensorDictSequential (of those and
// probabilistic modules) or a ProbabilisticTensorDictModule.
template <class Member>
class EnsembleModuleImpl : public torch::nn::Module {
 public:
  using member_impl = typename Member::Impl;
  using params_t = typename detail::ensemble_params<member_impl>::type;

  // num_copies copies with their own initialization (nn::reset_parameters:
  // one draw per copy); the member keeps its own values.
  EnsembleModuleImpl(Member member, std::int64_t num_copies, ensemble_options options = {}) : options_(options) {
    if (num_copies <= 0) throw value_error("EnsembleModule: num_copies must be positive, got " + std::to_string(num_copies));
    module = ::tensordict::detail::registered_child(*this, "module", std::move(member));
    params_td = ::tensordict::detail::registered_child(*this, "params_td",
                                                       detail::ensemble_params<member_impl>::make(*module, num_copies));
  }

  std::int64_t num_copies() const { return params_td->tensordict().batch_size()[0]; }

  // Output batch size [num_copies, *input batch] (expand_input) or the input's.
  template <class S>
  auto forward(const TensorDict<S>& td) {
    if constexpr (!member_impl::template has_in_keys<S>())
      return module->forward(td);  // reports the missing key, as the member would
    else
      return forward_checked(td);
  }

  Member module{nullptr};
  params_t params_td{nullptr};

 private:
  template <class S>
  auto forward_checked(const TensorDict<S>& td) {
    return detail::forward_over_sets(*module, params_td->tensordict(), num_copies(), td, !options_.expand_input,
                                     {.randomness = options_.randomness}, "EnsembleModule(expand_input=false)");
  }

  ensemble_options options_;
};

template <class Member>
class EnsembleModule : public torch::nn::ModuleHolder<EnsembleModuleImpl<Member>> {
 public:
  using torch::nn::ModuleHolder<EnsembleModuleImpl<Member>>::ModuleHolder;
  EnsembleModule(Member member, std::int64_t num_copies, ensemble_options options = {})
      : torch::nn::ModuleHolder<EnsembleModuleImpl<Member>>(
            std::make_shared<EnsembleModuleImpl<Member>>(std::move(member), num_copies, options)) {}
  // ensemble(td), as in Python.
  template <class S>
  auto operator()(const TensorDict<S>& td) const {
    return this->ptr()->forward(td);
  }
};

// ---- run-time forms -------------------------------------------------------------

namespace detail {
// Key paths for a message: ("a", "b"), "c"; or "none".
inline std::string listed_paths(const std::vector<any_key_path>& paths) {
  std::string out;
  for (const auto& k : paths) out += (out.empty() ? "" : ", ") + to_string(k);
  return out.empty() ? "none" : out;
}

}  // namespace detail

// The run-time key-wired modules (AnyTensorDictModule, AnyProbabilisticTensorDictModule,
// AnyTensorDictSequential): their keys are key paths known at run time (nested
// ones too), they read and write AnyTensorDicts, and a missing key is a
// key_error naming it, thrown before anything runs.
class AnyTensorDictModuleBase : public torch::nn::Module {
 public:
  // A new TensorDict of td's tensors and the out keys' (td is not changed).
  virtual AnyTensorDict forward(const AnyTensorDict& td) = 0;
  const std::vector<any_key_path>& in_keys() const { return in_keys_; }
  const std::vector<any_key_path>& out_keys() const { return out_keys_; }

 protected:
  AnyTensorDictModuleBase(std::vector<any_key_path> in, std::vector<any_key_path> out)
      : in_keys_(std::move(in)), out_keys_(std::move(out)) {}
  void check_in_keys(const AnyTensorDict& td, const std::string& who) const {
    for (const auto& k : in_keys_)
      if (!td.is_leaf(k))
        throw key_error(who + ": the TensorDict has no leaf " + to_string(k) + " for the in key (its keys: " +
                        detail::listed_paths(td.keys(true, true)) + ")");
  }
  std::vector<any_key_path> in_keys_, out_keys_;
};

// TensorDictModule at run time: a module whose forward takes the in keys'
// tensors (1 to 4) and returns a tensor or a tuple of them (nested tuples
// flattened: an LSTM's (output, (h, c)) fills three out keys); keys are key paths.
//   tdn::AnyTensorDictModule m(torch::nn::Linear(4, 2), {{"agents", "observation"}}, {{"agents", "action"}});
struct any_module_options {
  // The in keys' tensors concatenated along their last dim into the module's one input (TensorDictModule's cat_inputs).
  bool cat_inputs = false;
};

class AnyTensorDictModuleImpl : public AnyTensorDictModuleBase {
 public:
  // The module's forward on the in keys' tensors, its result's tensors in order.
  using caller = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

  AnyTensorDictModuleImpl(std::shared_ptr<torch::nn::Module> wrapped, caller call, std::vector<any_key_path> in,
                          std::vector<any_key_path> out, any_module_options options = {})
      : AnyTensorDictModuleBase(std::move(in), std::move(out)), options_(options), call_(std::move(call)) {
    if (!wrapped) throw value_error("tensordict::nn::AnyTensorDictModule: the module is empty");
    if (in_keys_.empty() || (in_keys_.size() > 4 && !options_.cat_inputs))
      throw value_error("tensordict::nn::AnyTensorDictModule: takes 1 to 4 in keys (any number with cat_inputs), got " +
                        std::to_string(in_keys_.size()));
    if (out_keys_.empty()) throw value_error("tensordict::nn::AnyTensorDictModule: name an out key for each tensor the module returns");
    module = ::tensordict::detail::registered_child(*this, "module", std::move(wrapped));
  }

  AnyTensorDict forward(const AnyTensorDict& td) override {
    const std::string who = "tensordict::nn::AnyTensorDictModule(" + module->name() + ")";
    check_in_keys(td, who);
    std::vector<at::Tensor> in;
    for (const auto& k : in_keys_) in.push_back(td.get(k));
    if (options_.cat_inputs) {
      std::vector<std::string> names;
      for (const auto& k : in_keys_) names.push_back(to_string(k));
      in = {detail::cat_last(in, names, who)};
    }
    const auto parts = call_(in);
    if (parts.size() != out_keys_.size())
      throw value_error(who + ": the module returned " + std::to_string(parts.size()) + " tensors for " +
                        std::to_string(out_keys_.size()) + " out keys");
    AnyTensorDict result = td.exclude({});
    for (std::size_t i = 0; i < parts.size(); ++i) result.set(out_keys_[i], parts[i]);
    return result;
  }

  std::shared_ptr<torch::nn::Module> module;

 private:
  any_module_options options_;
  caller call_;
};

namespace detail {
template <class Holder>
AnyTensorDictModuleImpl::caller forward_caller(Holder m) {
  return [m](const std::vector<at::Tensor>& in) mutable -> std::vector<at::Tensor> {
    auto flat = [](const auto& out) {
      std::vector<at::Tensor> parts(tensor_count<std::remove_cvref_t<decltype(out)>>);
      at::Tensor* to = parts.data();
      flatten_output(out, to);
      return parts;
    };
    switch (in.size()) {
      case 1:
        if constexpr (requires { m->forward(in[0]); }) return flat(m->forward(in[0]));
        break;
      case 2:
        if constexpr (requires { m->forward(in[0], in[1]); }) return flat(m->forward(in[0], in[1]));
        break;
      case 3:
        if constexpr (requires { m->forward(in[0], in[1], in[2]); }) return flat(m->forward(in[0], in[1], in[2]));
        break;
      default:
        if constexpr (requires { m->forward(in[0], in[1], in[2], in[3]); })
          return flat(m->forward(in[0], in[1], in[2], in[3]));
        break;
    }
    throw value_error("tensordict::nn::AnyTensorDictModule(" + m->name() + "): its forward does not take " +
                      std::to_string(in.size()) + " tensors (one per in key)");
  };
}
}  // namespace detail

class AnyTensorDictModule : public torch::nn::ModuleHolder<AnyTensorDictModuleImpl> {
 public:
  using torch::nn::ModuleHolder<AnyTensorDictModuleImpl>::ModuleHolder;
  // Any module holder (torch::nn::Linear, a torch::nn::Sequential, a user module).
  template <class Holder>
    requires requires(Holder h) { h.ptr(); }
  AnyTensorDictModule(Holder wrapped, std::vector<any_key_path> in, std::vector<any_key_path> out, any_module_options options = {})
      : torch::nn::ModuleHolder<AnyTensorDictModuleImpl>(std::make_shared<AnyTensorDictModuleImpl>(
            wrapped.ptr(), detail::forward_caller(wrapped), std::move(in), std::move(out), options)) {}
  AnyTensorDict operator()(const AnyTensorDict& td) const { return this->ptr()->forward(td); }
};

}  // namespace tensordict::nn
