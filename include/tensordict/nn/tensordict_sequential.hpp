// TensorDictSequential (Python's tensordict.nn.TensorDictSequential): key-wired
// modules called in turn, each reading keys of the TensorDict that the input or
// an earlier module wrote, the compiler checking the wiring.
//
//   using actor_net = tdn::TensorDictModule<mlp, tdn::in_keys<"observation">, tdn::out_keys<"param">>;
//   using extractor = tdn::TensorDictModule<tdn::NormalParamExtractor, tdn::in_keys<"param">, tdn::out_keys<"loc", "scale">>;
//   using head = tdn::ProbabilisticTensorDictModule<tdn::Normal, tdn::in_keys<"loc", "scale">, tdn::out_keys<"action">>;
//   tdn::TensorDictSequential<actor_net, extractor, head> policy(actor_net(mlp(...)), extractor(tdn::NormalParamExtractor()), head());
//   auto out = policy(td);                           // td plus param, loc, scale and action
//   // decltype(policy)::Impl::in_keys_t is in_keys<"observation">; a module that reads a key
//   // nothing before it writes does not compile, naming the module's index and the key.
//
// Its modules are registered as Python's: "module" (a ModuleList), then "0",
// "1", ..., so parameters are named module.0.module.0.weight as Python names
// them, and a state dict or memmap directory Python saved loads by name.
// Two modules may write one key (the later one's value stays), as in Python.
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "probabilistic.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include "../detail/module_access.hpp"
#include "composite_distribution.hpp"
#include "sequential.hpp"

namespace tensordict::nn {

namespace compile_error {
template <std::size_t ModuleIndex, class Key, class Available>
struct sequence_module_reads_unwritten_key {
  static_assert(::tensordict::compile_error::always_false<Available>,
                "tensordict::nn::TensorDictSequential: a module reads a key that neither the input nor an earlier "
                "module writes (the module's index and the key are in 'sequence_module_reads_unwritten_key<...>' "
                "above; the keys it could read follow). Write the key in an earlier module or put it in the input.");
};
template <key Key, class SequenceKeys>
struct subsequence_key_unknown {
  static_assert(::tensordict::compile_error::always_false<SequenceKeys>,
                "tensordict::nn::TensorDictSequential::select_subsequence: a key that no module of the sequence reads "
                "or writes (in 'subsequence_key_unknown<...>' above; the sequence's keys follow). Check its spelling.");
};
template <key Key, class OutKeys>
struct selected_key_is_not_an_out_key {
  static_assert(::tensordict::compile_error::always_false<OutKeys>,
                "tensordict::nn::TensorDictSequential::select_out_keys: a key that no module of the sequence writes (in "
                "'selected_key_is_not_an_out_key<...>' above; the sequence's out keys follow). Select among its out keys.");
};
template <class LastModule>
struct sequence_ends_in_no_distribution {
  static_assert(::tensordict::compile_error::always_false<LastModule>,
                "tensordict::nn::TensorDictSequential: get_dist and log_prob need a probabilistic last module (a "
                "ProbabilisticTensorDictModule, or a sequence ending in one), as Python's "
                "ProbabilisticTensorDictSequential; the last module's type is in 'sequence_ends_in_no_distribution<...>' above.");
};
template <class InKeys, class OutKeys>
struct subsequence_is_empty {
  static_assert(::tensordict::compile_error::always_false<InKeys>,
                "tensordict::nn::TensorDictSequential::select_subsequence: no module is left (Python: 'No modules left "
                "after selection'). Make the in keys and out keys coherent: a kept module reads only the given in "
                "keys or what a kept module before it writes, and writes one of the out keys or what a later kept "
                "module reads.");
};
}  // namespace compile_error

namespace detail {

template <class List, key K>
struct key_list_has;
template <template <key...> class L, key... Ks, key K>
struct key_list_has<L<Ks...>, K> : std::bool_constant<((Ks == K) || ...)> {};

template <class List, key K>
struct key_list_append;
template <template <key...> class L, key... Ks, key K>
struct key_list_append<L<Ks...>, K> {
  using type = std::conditional_t<key_list_has<L<Ks...>, K>::value, L<Ks...>, L<Ks..., K>>;
};

template <class List, class More>
struct key_list_append_all;
template <class List, template <key...> class M>
struct key_list_append_all<List, M<>> {
  using type = List;
};
template <class List, template <key...> class M, key First, key... Rest>
struct key_list_append_all<List, M<First, Rest...>> {
  using type = typename key_list_append_all<typename key_list_append<List, First>::type, M<Rest...>>::type;
};

// Keys a module reads that are not in Written yet, appended to Needed.
template <class Needed, class Written, class In>
struct needed_from_outside;
template <class Needed, class Written>
struct needed_from_outside<Needed, Written, in_keys<>> {
  using type = Needed;
};
template <class Needed, class Written, key First, key... Rest>
struct needed_from_outside<Needed, Written, in_keys<First, Rest...>> {
  using grown = std::conditional_t<key_list_has<Written, First>::value, Needed,
                                   typename key_list_append<Needed, First>::type>;
  using type = typename needed_from_outside<grown, Written, in_keys<Rest...>>::type;
};

// A sequence's in keys (read before any of its modules writes them) and out
// keys (every module's, in order, once).
template <class Needed, class Written, class... Impls>
struct sequence_keys {
  using in = Needed;
  using out = Written;
};
template <class Needed, class Written, class First, class... Rest>
struct sequence_keys<Needed, Written, First, Rest...>
    : sequence_keys<typename needed_from_outside<Needed, Written, typename First::in_keys_t>::type,
                    typename key_list_append_all<Written, typename First::out_keys_t>::type, Rest...> {};

// The schema after modules First, Rest... ran on S.
template <class S, class... Impls>
struct schema_after {
  using type = S;
};
template <class S, class First, class... Rest>
struct schema_after<S, First, Rest...> : schema_after<typename First::template output_schema<S>, Rest...> {};

template <class List>
struct key_views;
template <template <key...> class L, key... Ks>
struct key_views<L<Ks...>> {
  static constexpr std::array<std::string_view, sizeof...(Ks)> value{Ks.view()...};
};

// Python's select_subsequence: which modules stay (a forward pass keeps those
// whose in keys are all available, a backward pass those that write a wanted
// key). ins[i] and outs[i] are module i's keys; the typed form runs it at
// compile time on key names, the run-time form on key paths.
template <class Key, class KeyLists>
constexpr std::vector<bool> kept_modules(std::vector<Key> available, std::vector<Key> wanted, const KeyLists& ins,
                                         const KeyLists& outs) {
  auto contains = [](const std::vector<Key>& set, const Key& k) { return std::find(set.begin(), set.end(), k) != set.end(); };
  std::vector<bool> keep(ins.size());
  for (std::size_t i = 0; i < keep.size(); ++i) {
    keep[i] = std::all_of(ins[i].begin(), ins[i].end(), [&](const Key& k) { return contains(available, k); });
    if (keep[i]) available.insert(available.end(), outs[i].begin(), outs[i].end());
  }
  for (std::size_t j = keep.size(); j-- > 0;) {
    if (!keep[j]) continue;
    keep[j] = std::any_of(outs[j].begin(), outs[j].end(), [&](const Key& k) { return contains(wanted, k); });
    if (keep[j]) wanted.insert(wanted.end(), ins[j].begin(), ins[j].end());
  }
  return keep;
}

template <class InKeys, class OutKeys, class... Impls>
constexpr std::array<bool, sizeof...(Impls)> subsequence_kept() {
  constexpr auto& in = key_views<InKeys>::value;
  constexpr auto& out = key_views<OutKeys>::value;
  constexpr std::array<std::span<const std::string_view>, sizeof...(Impls)> ins{
      std::span<const std::string_view>(key_views<typename Impls::in_keys_t>::value)...};
  constexpr std::array<std::span<const std::string_view>, sizeof...(Impls)> outs{
      std::span<const std::string_view>(key_views<typename Impls::out_keys_t>::value)...};
  const auto kept = kept_modules(std::vector<std::string_view>(in.begin(), in.end()),
                                 std::vector<std::string_view>(out.begin(), out.end()), ins, outs);
  std::array<bool, sizeof...(Impls)> keep{};
  for (std::size_t i = 0; i < keep.size(); ++i) keep[i] = kept[i];
  return keep;
}

template <auto Keep, std::size_t... I>
constexpr auto kept_indices(std::index_sequence<I...>) {
  constexpr std::size_t count = (std::size_t{0} + ... + (Keep[I] ? 1 : 0));
  std::array<std::size_t, count> out{};
  std::size_t k = 0;
  ((Keep[I] ? (out[k++] = I, 0) : 0), ...);
  return out;
}

}  // namespace detail

template <class... Modules>
class TensorDictSequentialImpl;

namespace detail {
// A probabilistic module, or a sequence whose last module is one.
template <class Impl>
struct ends_in_distribution : std::bool_constant<requires { typename Impl::dist_type; }> {};
template <class... Modules>
struct ends_in_distribution<TensorDictSequentialImpl<Modules...>>
    : ends_in_distribution<impl_of_t<std::tuple_element_t<sizeof...(Modules) - 1, std::tuple<Modules...>>>> {};
}  // namespace detail

template <class... Modules>
class TensorDictSequentialImpl : public torch::nn::Module {
  static_assert(sizeof...(Modules) > 0, "tensordict::nn::TensorDictSequential needs at least one module.");
  using keys = detail::sequence_keys<in_keys<>, out_keys<>, impl_of_t<Modules>...>;

 public:
  using is_tensordict_sequential = void;
  // What the sequence reads from its input, and what its modules write.
  using in_keys_t = typename keys::in;
  using out_keys_t = typename keys::out;
  template <class S>
  using output_schema = typename detail::schema_after<S, impl_of_t<Modules>...>::type;

  explicit TensorDictSequentialImpl(Modules... modules)
      : module(::tensordict::detail::registered_child(*this, "module",
                                                      std::make_shared<SequentialImpl<Modules...>>(std::move(modules)...))) {}

  template <std::size_t I>
  auto& child() {
    return module->template child<I>();
  }
  static constexpr std::size_t size() { return sizeof...(Modules); }

  // Every in key of the sequence in S.
  template <class S>
  static constexpr bool has_in_keys() {
    return has_all<S>(in_keys_t{});
  }

  // The modules in turn; the result holds the input's leaves and every out key.
  template <class S>
  TensorDict<output_schema<S>> forward(const TensorDict<S>& td) {
    return run<0>(td);
  }

  // With a probabilistic last module (Python's ProbabilisticTensorDictSequential):
  // the distribution that module builds from what the modules before it make of td.
  template <class S>
  auto get_dist(const TensorDict<S>& td) {
    if constexpr (detail::ends_in_distribution<last_impl>::value)
      return child<sizeof...(Modules) - 1>()->get_dist(run<0, sizeof...(Modules) - 1>(td));
    else
      ::tensordict::compile_error::report<compile_error::sequence_ends_in_no_distribution<last_impl>>();
  }
  // The log-probability of the value td holds at the last module's out key.
  template <class S>
  at::Tensor log_prob(const TensorDict<S>& td) {
    if constexpr (detail::ends_in_distribution<last_impl>::value)
      return child<sizeof...(Modules) - 1>()->log_prob(run<0, sizeof...(Modules) - 1>(td));
    else
      ::tensordict::compile_error::report<compile_error::sequence_ends_in_no_distribution<last_impl>>();
    return {};
  }

  // Python's select_out_keys (selected_out_keys in later versions): the
  // sequence, its output holding only the input's keys and the given out keys
  // (the keys only earlier modules read are left out). Python changes the
  // module; here the result is a new module sharing this one's modules.
  template <key... Selected>
  auto select_out_keys();

  // Python's select_subsequence: a sequence of the modules that, from in keys
  // (the sequence's own when void), lead to out keys (its own when void). The
  // modules are shared, not copied.
  template <class InKeys = void, class OutKeys = void>
  auto select_subsequence() {
    using in = std::conditional_t<std::is_void_v<InKeys>, in_keys_t, InKeys>;
    using out = std::conditional_t<std::is_void_v<OutKeys>, out_keys_t, OutKeys>;
    constexpr auto keep = detail::subsequence_kept<in, out, impl_of_t<Modules>...>();
    constexpr auto indices = detail::kept_indices<keep>(std::index_sequence_for<Modules...>{});
    if constexpr (!known(in{}) || !known(out{})) {
      report_unknown(in{});
      report_unknown(out{});
      return *this;
    } else if constexpr (indices.size() == 0) {
      ::tensordict::compile_error::report<compile_error::subsequence_is_empty<in, out>>();
      return *this;
    } else {
      return subsequence<indices>(std::make_index_sequence<indices.size()>{});
    }
  }

  // Python's ModuleList: the modules registered as "0", "1", ... (a typed
  // Sequential, whose own forward is not used).
  std::shared_ptr<SequentialImpl<Modules...>> module;

 private:
  template <class S, key... K>
  static constexpr bool has_all(in_keys<K...>) {
    return (detail::has_key_v<S, K> && ...);
  }

  // Modules I to End - 1 on td.
  template <std::size_t I, std::size_t End = sizeof...(Modules), class S>
  auto run(const TensorDict<S>& td) {
    if constexpr (I == End) {
      return td;
    } else {
      using M = impl_of_t<std::tuple_element_t<I, std::tuple<Modules...>>>;
      if constexpr (!M::template has_in_keys<S>()) {
        report_missing<I, S>(typename M::in_keys_t{});
        return TensorDict<typename detail::schema_after<S, impl_of_t<Modules>...>::type>();
      } else {
        return run<I + 1, End>(child<I>()->forward(td));
      }
    }
  }
  using last_impl = impl_of_t<std::tuple_element_t<sizeof...(Modules) - 1, std::tuple<Modules...>>>;

  template <std::size_t I, class S, key... K>
  static constexpr void report_missing(in_keys<K...>) {
    bool reported = false;
    (report_one<I, K, S>(reported), ...);
  }
  template <std::size_t I, key K, class S>
  static constexpr void report_one(bool& reported) {
    if constexpr (!detail::has_key_v<S, K>) {
      if (!reported)
        ::tensordict::compile_error::report<compile_error::sequence_module_reads_unwritten_key<
            I, key_parts_t<K>, typename ::tensordict::detail::keys_where_path_fails<S, key_parts_t<K>>::type>>();
      reported = true;
    }
  }

  // A key some module reads or writes.
  template <key K>
  static constexpr bool known_key() {
    return detail::key_list_has<out_keys_t, K>::value ||
           (detail::key_list_has<typename impl_of_t<Modules>::in_keys_t, K>::value || ...);
  }
  template <template <key...> class L, key... K>
  static constexpr bool known(L<K...>) {
    return (known_key<K>() && ...);
  }
  template <template <key...> class L, key... K>
  static constexpr void report_unknown(L<K...>) {
    (report_unknown_key<K>(), ...);
  }
  template <key K>
  static constexpr void report_unknown_key() {
    if constexpr (!known_key<K>())
      ::tensordict::compile_error::report<
          compile_error::subsequence_key_unknown<K, typename detail::key_list_append_all<in_keys_t, out_keys_t>::type>>();
  }

  template <auto Indices, std::size_t... J>
  auto subsequence(std::index_sequence<J...>);
};

template <class... Modules>
class TensorDictSequential : public torch::nn::ModuleHolder<TensorDictSequentialImpl<Modules...>> {
 public:
  using Impl = TensorDictSequentialImpl<Modules...>;
  using torch::nn::ModuleHolder<Impl>::ModuleHolder;
  explicit TensorDictSequential(Modules... modules)
      : torch::nn::ModuleHolder<Impl>(std::make_shared<Impl>(std::move(modules)...)) {}
  // module(td), as in Python.
  template <class S>
  auto operator()(const TensorDict<S>& td) const {
    return this->ptr()->forward(td);
  }
};

namespace detail {
template <class... Modules>
struct probabilistic_sequence {
  static_assert(ends_in_distribution<impl_of_t<std::tuple_element_t<sizeof...(Modules) - 1, std::tuple<Modules...>>>>::value,
                "tensordict::nn::ProbabilisticTensorDictSequential: the last module must be probabilistic (a "
                "ProbabilisticTensorDictModule, or a sequence ending in one); for other modules use TensorDictSequential.");
  using type = TensorDictSequential<Modules...>;
};
}  // namespace detail

// Python's ProbabilisticTensorDictSequential: a TensorDictSequential whose last
// module is probabilistic (checked), with get_dist and log_prob.
template <class... Modules>
using ProbabilisticTensorDictSequential = typename detail::probabilistic_sequence<Modules...>::type;

template <class... Modules>
template <auto Indices, std::size_t... J>
auto TensorDictSequentialImpl<Modules...>::subsequence(std::index_sequence<J...>) {
  using result = TensorDictSequential<std::tuple_element_t<Indices[J], std::tuple<Modules...>>...>;
  return result(child<Indices[J]>()...);
}

// ---- adapters: schema and functional forms ------------------------------------

template <class... Modules>
struct module_traits<TensorDictSequentialImpl<Modules...>> {
  using members = member_list<member<"module", member_pointer<&TensorDictSequentialImpl<Modules...>::module>>>;
};

namespace detail {
// The sub-tree of params at `name`, or an empty TensorDict where the schema left it out (no tensors).
template <key Name, class S>
auto sub_params(const TensorDict<S>& p) {
  if constexpr (S::find(Name.view()) == npos)
    return TensorDict<schema<>>();
  else
    return p.template get<Name>();
}
}  // namespace detail

// A TensorDictSequential's forward with each module's functional form and its sub-tree of params.
template <class... Modules>
struct functional<TensorDictSequentialImpl<Modules...>> {
  static constexpr bool is_functional = true;
  using Impl = TensorDictSequentialImpl<Modules...>;
  template <class S>
  static auto forward(Impl& m, const TensorDict<schema_of<Impl>>& p, const TensorDict<S>& td) {
    return run<0>(m, detail::sub_params<"module">(p), td);
  }

 private:
  template <std::size_t I, class P, class S>
  static auto run(Impl& m, const TensorDict<P>& p, const TensorDict<S>& td) {
    if constexpr (I == sizeof...(Modules)) {
      return td;
    } else {
      auto& child = m.template child<I>();
      return run<I + 1>(m, p, ::tensordict::functional_call(child, detail::sub_params<detail::index_key<I>()>(p), td));
    }
  }
};

// In an ensemble: each module over every copy at once, with its sub-tree of the
// stacked params; the first reads the shared input, the others what it made.
template <class... Modules>
struct ensemble_forward<TensorDictSequentialImpl<Modules...>> {
  using Impl = TensorDictSequentialImpl<Modules...>;
  template <class P, class S>
  static auto forward(Impl& m, const TensorDict<P>& p, const TensorDict<S>& td, const functional_vmap_options& o,
                      c10::IntArrayRef shared_batch) {
    return run<0>(m, detail::sub_params<"module">(p), td, o, shared_batch);
  }

 private:
  template <std::size_t I, class P, class S>
  static auto run(Impl& m, const TensorDict<P>& p, const TensorDict<S>& td, const functional_vmap_options& o,
                  c10::IntArrayRef shared_batch) {
    if constexpr (I == sizeof...(Modules)) {
      return td;
    } else {
      auto& child = *m.template child<I>();
      using C = std::remove_cvref_t<decltype(child)>;
      return run<I + 1>(m, p, ensemble_forward<C>::forward(child, detail::sub_params<detail::index_key<I>()>(p), td, o, shared_batch), o, {});
    }
  }
};

template <class Dist, class In, class Out, class LogProb>
struct touches_module<ProbabilisticTensorDictModuleImpl<Dist, In, Out, LogProb>> : std::false_type {};
template <class... Modules>
struct touches_module<TensorDictSequentialImpl<Modules...>> : std::disjunction<touches_module<impl_of_t<Modules>>...> {};

// ---- selected out keys --------------------------------------------------------------

// A TensorDictSequential whose output keeps the input's keys and the selected
// out keys (Python's select_out_keys / selected_out_keys). Its modules are
// registered as the sequence's, under "module", so parameter names are unchanged.
template <class Seq, class Selected>
class SelectedOutKeysImpl;

template <class Seq, key... Selected>
class SelectedOutKeysImpl<Seq, out_keys<Selected...>> : public torch::nn::Module {
 public:
  using sequence_impl = impl_of_t<Seq>;
  using in_keys_t = typename sequence_impl::in_keys_t;
  using out_keys_t = out_keys<Selected...>;
  // The input schema and the selected keys, in that order (Python's select order).
  template <class S>
  using output_schema = typename detail::with_out_keys<S, Selected...>::type;

  explicit SelectedOutKeysImpl(Seq seq) : sequence(std::move(seq)) {
    (check_selected<Selected>(), ...);
    module = ::tensordict::detail::registered_child(*this, "module", sequence->module);
  }

  template <class S>
  static constexpr bool has_in_keys() {
    return sequence_impl::template has_in_keys<S>();
  }

  template <class S>
  auto forward(const TensorDict<S>& td) {
    return select<S>(sequence->forward(td));
  }
  template <class S>
  auto get_dist(const TensorDict<S>& td) {
    return sequence->get_dist(td);
  }
  template <class S>
  at::Tensor log_prob(const TensorDict<S>& td) {
    return sequence->log_prob(td);
  }

  // The sequence's output for an input of schema S, less the keys not selected
  // (an input key a module rewrote keeps the new value).
  template <class S, class F>
  static TensorDict<output_schema<S>> select(const TensorDict<F>& full) {
    using O = output_schema<S>;
    constexpr auto& where = ::tensordict::detail::embedding<O, F>::leaves;
    std::array<at::Tensor, O::leaf_count> leaves;
    for (std::size_t i = 0; i < O::leaf_count; ++i) leaves[i] = full.leaf(where[i]);
    return TensorDict<O>(std::move(leaves), full.batch_size(), full.device());
  }

  Seq sequence;  // not registered itself: its modules are, below
  decltype(sequence_impl::module) module;

 private:
  template <key K>
  static constexpr void check_selected() {
    if constexpr (!detail::key_list_has<typename sequence_impl::out_keys_t, K>::value)
      ::tensordict::compile_error::report<
          compile_error::selected_key_is_not_an_out_key<K, typename sequence_impl::out_keys_t>>();
  }
};

template <class Seq, class Selected>
class SelectedOutKeys : public torch::nn::ModuleHolder<SelectedOutKeysImpl<Seq, Selected>> {
 public:
  using Impl = SelectedOutKeysImpl<Seq, Selected>;
  using torch::nn::ModuleHolder<Impl>::ModuleHolder;
  explicit SelectedOutKeys(Seq seq) : torch::nn::ModuleHolder<Impl>(std::make_shared<Impl>(std::move(seq))) {}
  template <class S>
  auto operator()(const TensorDict<S>& td) const {
    return this->ptr()->forward(td);
  }
};

template <class... Modules>
template <key... Selected>
auto TensorDictSequentialImpl<Modules...>::select_out_keys() {
  using holder = TensorDictSequential<Modules...>;
  return SelectedOutKeys<holder, out_keys<Selected...>>(
      holder(std::static_pointer_cast<TensorDictSequentialImpl>(this->shared_from_this())));
}

template <class Seq, class Selected>
struct module_traits<SelectedOutKeysImpl<Seq, Selected>> {
  using members = member_list<member<"module", member_pointer<&SelectedOutKeysImpl<Seq, Selected>::module>>>;
};
template <class Seq, class Selected>
struct functional<SelectedOutKeysImpl<Seq, Selected>> {
  static constexpr bool is_functional = true;
  using Impl = SelectedOutKeysImpl<Seq, Selected>;
  template <class S>
  static auto forward(Impl& m, const TensorDict<schema_of<Impl>>& p, const TensorDict<S>& td) {
    return Impl::template select<S>(functional<typename Impl::sequence_impl>::forward(*m.sequence, p, td));
  }
};
template <class Seq, class Selected>
struct ensemble_forward<SelectedOutKeysImpl<Seq, Selected>> {
  using Impl = SelectedOutKeysImpl<Seq, Selected>;
  template <class P, class S>
  static auto forward(Impl& m, const TensorDict<P>& p, const TensorDict<S>& td, const functional_vmap_options& o,
                      c10::IntArrayRef shared_batch) {
    return Impl::template select<S>(ensemble_forward<typename Impl::sequence_impl>::forward(*m.sequence, p, td, o, shared_batch));
  }
};
template <class Seq, class Selected>
struct touches_module<SelectedOutKeysImpl<Seq, Selected>> : touches_module<impl_of_t<Seq>> {};

// ---- run-time form ----------------------------------------------------------------

// TensorDictSequential at run time: AnyTensorDictModules, probabilistic ones
// and other sequences, keys as run-time key paths (nested ones too). The
// wiring is checked against the input before any module runs: a module that
// reads a key neither the input nor an earlier module writes is a key_error
// naming the module's index and the key.
class AnyTensorDictSequential;

class AnyTensorDictSequentialImpl : public AnyTensorDictModuleBase {
 public:
  TENSORDICT_DECL explicit AnyTensorDictSequentialImpl(std::vector<std::shared_ptr<AnyTensorDictModuleBase>> modules);
  template <class... Holders>
    requires(sizeof...(Holders) > 0 && (std::is_base_of_v<AnyTensorDictModuleBase, typename Holders::ContainedType> && ...))
  explicit AnyTensorDictSequentialImpl(Holders... modules)
      : AnyTensorDictSequentialImpl(std::vector<std::shared_ptr<AnyTensorDictModuleBase>>{modules.ptr()...}) {}

  TENSORDICT_DECL AnyTensorDict forward(const AnyTensorDict& td) override;

  // Python's select_out_keys (selected_out_keys in later versions), in place
  // as Python's: the output holds only the input's keys and these out keys
  // (key_error for a key no module writes); out_keys() lists them.
  TENSORDICT_DECL AnyTensorDictSequentialImpl& select_out_keys(std::vector<any_key_path> keys);
  // Every module's out keys again (Python's reset_out_keys).
  AnyTensorDictSequentialImpl& reset_out_keys() {
    out_keys_ = written_;
    return *this;
  }

  std::size_t size() const { return modules_.size(); }
  const std::shared_ptr<AnyTensorDictModuleBase>& child(std::size_t i) const { return modules_.at(i); }

  // With a probabilistic last module (an AnyProbabilisticTensorDictModule, or a
  // sequence ending in one; else value_error): Python's
  // ProbabilisticTensorDictSequential.get_dist, the distribution that module
  // builds from what the modules before it make of td.
  TENSORDICT_DECL std::shared_ptr<const Distribution> get_dist(const AnyTensorDict& td);
  // The same where the last module is a CompositeProbabilisticTensorDictModule (or a sequence ending in one).
  TENSORDICT_DECL CompositeDistribution get_composite_dist(const AnyTensorDict& td);
  // The log-probability of the value td holds at the last module's out key; for a composite last
  // module, its "sample_log_prob" (the heads' summed), as Python's.
  TENSORDICT_DECL at::Tensor log_prob(const AnyTensorDict& td);
  // Whether the last module is a CompositeProbabilisticTensorDictModule, or a sequence ending in one.
  TENSORDICT_DECL bool ends_in_composite() const;

  // Python's select_subsequence (the sequence's own keys where not given); the modules are shared.
  TENSORDICT_DECL AnyTensorDictSequential select_subsequence(std::optional<std::vector<any_key_path>> in = std::nullopt,
                                                             std::optional<std::vector<any_key_path>> out = std::nullopt) const;

  torch::nn::ModuleList module{nullptr};

 private:
  static bool has(const std::vector<any_key_path>& set, const any_key_path& k) {
    return std::find(set.begin(), set.end(), k) != set.end();
  }
  // The modules with the sequence's in keys (read before any module writes
  // them) and out keys (every module's, once).
  struct wired_modules {
    std::vector<std::shared_ptr<AnyTensorDictModuleBase>> modules;
    std::vector<any_key_path> needed, written;
  };
  TENSORDICT_DECL static wired_modules wired(std::vector<std::shared_ptr<AnyTensorDictModuleBase>> modules);
  TENSORDICT_DECL explicit AnyTensorDictSequentialImpl(wired_modules w);
  // The input's leaves and sub-TensorDicts (a module may read a sub-TensorDict: a composite head's "params"),
  // then each module's out keys.
  TENSORDICT_DECL void check_wiring(const AnyTensorDict& td) const;
  // f(last module, what the modules before it make of td), for a probabilistic last module.
  template <class F>
  std::invoke_result_t<F&, AnyProbabilisticTensorDictModuleImpl&, const AnyTensorDict&> with_last_module(const AnyTensorDict& td, F f);
  // What the modules before the last make of td (the wiring checked first).
  TENSORDICT_DECL AnyTensorDict before_last(const AnyTensorDict& td) const;

  std::vector<std::shared_ptr<AnyTensorDictModuleBase>> modules_;
  std::vector<any_key_path> written_;  // every module's out keys; out_keys_ may select some
};

class AnyTensorDictSequential : public torch::nn::ModuleHolder<AnyTensorDictSequentialImpl> {
 public:
  using torch::nn::ModuleHolder<AnyTensorDictSequentialImpl>::ModuleHolder;
  template <class... Holders>
    requires(sizeof...(Holders) > 0 && (std::is_base_of_v<AnyTensorDictModuleBase, typename Holders::ContainedType> && ...))
  explicit AnyTensorDictSequential(Holders... modules)
      : torch::nn::ModuleHolder<AnyTensorDictSequentialImpl>(std::make_shared<AnyTensorDictSequentialImpl>(std::move(modules)...)) {}
  AnyTensorDict operator()(const AnyTensorDict& td) const { return this->ptr()->forward(td); }
};

// ---- typed to run-time -------------------------------------------------------------

namespace detail {
template <template <key...> class List, key... K>
std::vector<any_key_path> key_paths(List<K...>) {
  std::vector<any_key_path> out;
  auto add = [&]<key... Parts>(key_path_t<Parts...>) { out.push_back({std::string(Parts.view())...}); };
  (add(key_parts_t<K>{}), ...);
  return out;
}
template <class In>
struct schema_of_keys;
template <key... K>
struct schema_of_keys<in_keys<K...>> : with_out_keys<schema<>, K...> {};
}  // namespace detail

// A typed key-wired module (TensorDictModule, ProbabilisticTensorDictModule,
// TensorDictSequential, SelectedOutKeys) as a run-time one, to be placed in an
// AnyTensorDictSequential: it reads its in keys from an AnyTensorDict (a
// key_error names a missing one) and writes its outputs into a copy of it. Its
// modules are registered under the typed module's names, so parameter names
// do not change; the typed module is shared, not copied.
//   tdn::AnyTensorDictSequential policy(tdn::as_any_module(typed_actor), tdn::AnyTensorDictModule(...));
template <class Holder>
class ErasedTensorDictModuleImpl : public AnyTensorDictModuleBase {
  using impl = typename Holder::Impl;

 public:
  explicit ErasedTensorDictModuleImpl(Holder typed)
      : AnyTensorDictModuleBase(detail::key_paths(typename impl::in_keys_t{}), detail::key_paths(typename impl::out_keys_t{})),
        typed_(std::move(typed)) {
    for (const auto& child : typed_->named_children()) register_module(child.key(), child.value());
  }

  AnyTensorDict forward(const AnyTensorDict& td) override {
    check_in_keys(td, "tensordict::nn::as_any_module(" + typed_->name() + ")");
    using S = typename detail::schema_of_keys<typename impl::in_keys_t>::type;
    const AnyTensorDict out(typed_->forward(td.select(in_keys_).template to_typed<S>()));
    AnyTensorDict result = td.exclude({});
    return result.update(out);
  }

  const Holder& typed() const { return typed_; }

 private:
  Holder typed_;
};

template <class Holder>
class ErasedTensorDictModule : public torch::nn::ModuleHolder<ErasedTensorDictModuleImpl<Holder>> {
 public:
  using torch::nn::ModuleHolder<ErasedTensorDictModuleImpl<Holder>>::ModuleHolder;
  AnyTensorDict operator()(const AnyTensorDict& td) const { return this->ptr()->forward(td); }
};

template <class Holder>
  requires requires { typename Holder::Impl::in_keys_t; typename Holder::Impl::out_keys_t; }
ErasedTensorDictModule<Holder> as_any_module(Holder typed) {
  return ErasedTensorDictModule<Holder>(std::make_shared<ErasedTensorDictModuleImpl<Holder>>(std::move(typed)));
}

// ---- run-time to typed -------------------------------------------------------------

// A run-time key-wired module (AnyTensorDictModule, AnyProbabilisticTensorDictModule,
// AnyTensorDictSequential, ...) as a typed one with the given keys, to be placed
// in a TensorDictSequential: its keys are checked against the module's when it
// is made (value_error naming both lists: the typed out keys must list every
// out key, and may name more that it writes), and its output against the output
// schema at each call (to_typed's errors; other keys it writes are left out). The module is shared, registered as
// "module" (its tensors are named at run time, so a typed sequence holding one
// has no from_module / functional_call; the run-time sequence has).
//   auto head = tdn::as_typed_module<tdn::in_keys<"loc", "scale">, tdn::out_keys<"action">>(any_head);
template <class In, class Out, class Wrapped = AnyTensorDictModuleBase>
class TypedTensorDictModuleImpl;

namespace detail {
// A typed wrapper of a composite head ends a (Probabilistic)TensorDictSequential: its dist_type.
template <class Wrapped>
struct typed_wrapper_distribution {};
template <>
struct typed_wrapper_distribution<CompositeProbabilisticTensorDictModuleImpl> {
  using dist_type = CompositeDistribution;
};
}  // namespace detail

template <key... In, key... Out, class Wrapped>
class TypedTensorDictModuleImpl<in_keys<In...>, out_keys<Out...>, Wrapped> : public torch::nn::Module,
                                                                             public detail::typed_wrapper_distribution<Wrapped> {
  static constexpr bool composite = std::is_same_v<Wrapped, CompositeProbabilisticTensorDictModuleImpl>;

 public:
  using in_keys_t = in_keys<In...>;
  using out_keys_t = out_keys<Out...>;
  template <class S>
  using output_schema = typename detail::with_out_keys<S, Out...>::type;

  explicit TypedTensorDictModuleImpl(std::shared_ptr<AnyTensorDictModuleBase> any) {
    if (!any) throw value_error("tensordict::nn::as_typed_module: the module is empty");
    const auto in = detail::key_paths(in_keys_t{}), out = detail::key_paths(out_keys_t{});
    // The typed out keys may name more than out_keys() lists (a composite head's per-head log-probabilities).
    const bool lists_every_out_key = std::all_of(any->out_keys().begin(), any->out_keys().end(), [&](const any_key_path& k) {
      return std::find(out.begin(), out.end(), k) != out.end();
    });
    if (any->in_keys() != in || !lists_every_out_key)
      throw value_error("tensordict::nn::as_typed_module: the module reads " + detail::listed_paths(any->in_keys()) +
                        " and writes " + detail::listed_paths(any->out_keys()) + "; the typed keys say it reads " +
                        detail::listed_paths(in) + " and writes " + detail::listed_paths(out));
    module = register_module("module", std::move(any));
  }

  template <class S>
  static constexpr bool has_in_keys() {
    return (detail::has_key_v<S, In> && ...);
  }
  template <class S>
  static constexpr void check_in_keys() {
    detail::report_missing_in_keys<S, In...>();
  }

  template <class S>
  TensorDict<output_schema<S>> forward(const TensorDict<S>& td) {
    if constexpr (!has_in_keys<S>()) {
      check_in_keys<S>();
      return {};
    } else {
      // Keys beyond the typed ones (written but not declared) are left out.
      return module->forward(AnyTensorDict(td)).template to_typed<output_schema<S>>({.ignore_extra = true});
    }
  }

  // A composite head's distribution, and the "sample_log_prob" of the values td holds (Python's get_dist
  // and log_prob): so a sequence ending in it has get_dist and log_prob.
  template <class S>
    requires composite
  CompositeDistribution get_dist(const TensorDict<S>& td) const {
    return static_cast<const CompositeProbabilisticTensorDictModuleImpl&>(*module).get_dist(AnyTensorDict(td));
  }
  template <class S>
    requires composite
  at::Tensor log_prob(const TensorDict<S>& td) const {
    return get_dist(td).log_prob(AnyTensorDict(td)).get("sample_log_prob");
  }

  std::shared_ptr<AnyTensorDictModuleBase> module;
};

template <class In, class Out, class Wrapped = AnyTensorDictModuleBase>
class TypedTensorDictModule : public torch::nn::ModuleHolder<TypedTensorDictModuleImpl<In, Out, Wrapped>> {
 public:
  using Impl = TypedTensorDictModuleImpl<In, Out, Wrapped>;
  using torch::nn::ModuleHolder<Impl>::ModuleHolder;
  template <class S>
  auto operator()(const TensorDict<S>& td) const {
    return this->ptr()->forward(td);
  }
};

template <class In, class Out, class AnyHolder>
  requires std::is_base_of_v<AnyTensorDictModuleBase, typename AnyHolder::ContainedType>
TypedTensorDictModule<In, Out, typename AnyHolder::ContainedType> as_typed_module(AnyHolder any) {
  using Wrapped = typename AnyHolder::ContainedType;
  return TypedTensorDictModule<In, Out, Wrapped>(std::make_shared<TypedTensorDictModuleImpl<In, Out, Wrapped>>(any.ptr()));
}

}  // namespace tensordict::nn

#if TENSORDICT_DEFINITIONS
namespace tensordict::nn {
TENSORDICT_DECL AnyTensorDictSequentialImpl::AnyTensorDictSequentialImpl(std::vector<std::shared_ptr<AnyTensorDictModuleBase>> modules)
    : AnyTensorDictSequentialImpl(wired(std::move(modules))) {}

TENSORDICT_DECL AnyTensorDictSequentialImpl::wired_modules AnyTensorDictSequentialImpl::wired(
    std::vector<std::shared_ptr<AnyTensorDictModuleBase>> modules) {
  if (modules.empty()) throw value_error("tensordict::nn::AnyTensorDictSequential needs at least one module");
  wired_modules w{std::move(modules), {}, {}};
  for (const auto& m : w.modules) {
    for (const auto& k : m->in_keys())
      if (!has(w.written, k) && !has(w.needed, k)) w.needed.push_back(k);
    for (const auto& k : m->out_keys())
      if (!has(w.written, k)) w.written.push_back(k);
  }
  return w;
}

TENSORDICT_DECL AnyTensorDictSequentialImpl::AnyTensorDictSequentialImpl(wired_modules w)
    : AnyTensorDictModuleBase(std::move(w.needed), w.written), modules_(std::move(w.modules)), written_(std::move(w.written)) {
  module = register_module("module", torch::nn::ModuleList());
  for (const auto& m : modules_) module->push_back(m);
}

TENSORDICT_DECL AnyTensorDict AnyTensorDictSequentialImpl::forward(const AnyTensorDict& td) {
  check_wiring(td);
  AnyTensorDict out = td;
  for (const auto& m : modules_) out = m->forward(out);
  if (out_keys_.size() == written_.size()) return out;
  std::vector<any_key_path> dropped;
  for (const auto& k : written_)
    if (!has(out_keys_, k) && !td.is_leaf(k)) dropped.push_back(k);
  return out.exclude(dropped);
}

TENSORDICT_DECL AnyTensorDictSequentialImpl& AnyTensorDictSequentialImpl::select_out_keys(std::vector<any_key_path> keys) {
  for (const auto& k : keys)
    if (!has(written_, k))
      throw key_error("tensordict::nn::AnyTensorDictSequential.select_out_keys: no module writes " + to_string(k) +
                      " (the out keys: " + detail::listed_paths(written_) + ")");
  out_keys_ = std::move(keys);
  return *this;
}

TENSORDICT_DECL std::shared_ptr<const Distribution> AnyTensorDictSequentialImpl::get_dist(const AnyTensorDict& td) {
  if (ends_in_composite())
    throw value_error("tensordict::nn::AnyTensorDictSequential.get_dist: the last module is a "
                      "CompositeProbabilisticTensorDictModule, whose distribution is a CompositeDistribution; call "
                      "get_composite_dist(td)");
  return with_last_module(td, [](auto& last, const AnyTensorDict& in) { return last.get_dist(in); });
}

TENSORDICT_DECL CompositeDistribution AnyTensorDictSequentialImpl::get_composite_dist(const AnyTensorDict& td) {
  const AnyTensorDict in = before_last(td);
  if (auto* composite = dynamic_cast<CompositeProbabilisticTensorDictModuleImpl*>(modules_.back().get())) return composite->get_dist(in);
  if (auto* sequence = dynamic_cast<AnyTensorDictSequentialImpl*>(modules_.back().get()); sequence && sequence->ends_in_composite())
    return sequence->get_composite_dist(in);
  throw value_error("tensordict::nn::AnyTensorDictSequential.get_composite_dist: module " + std::to_string(modules_.size() - 1) +
                    " (" + modules_.back()->name() + ") is no CompositeProbabilisticTensorDictModule; call get_dist(td)");
}

TENSORDICT_DECL at::Tensor AnyTensorDictSequentialImpl::log_prob(const AnyTensorDict& td) {
  if (ends_in_composite()) return get_composite_dist(td).log_prob(td).get("sample_log_prob");
  return with_last_module(td, [](auto& last, const AnyTensorDict& in) { return last.log_prob(in); });
}

TENSORDICT_DECL bool AnyTensorDictSequentialImpl::ends_in_composite() const {
  if (dynamic_cast<CompositeProbabilisticTensorDictModuleImpl*>(modules_.back().get())) return true;
  auto* sequence = dynamic_cast<AnyTensorDictSequentialImpl*>(modules_.back().get());
  return sequence && sequence->ends_in_composite();
}

namespace detail {
// Whether k can be read given the keys written so far: one of them, or a sub-TensorDict above one.
inline bool readable_in(const std::vector<any_key_path>& readable, const any_key_path& k) {
  return std::any_of(readable.begin(), readable.end(), [&](const any_key_path& r) {
    return r.size() >= k.size() && std::equal(k.begin(), k.end(), r.begin());
  });
}
}  // namespace detail

TENSORDICT_DECL void AnyTensorDictSequentialImpl::check_wiring(const AnyTensorDict& td) const {
  std::vector<any_key_path> readable = td.keys(true, false);
  for (std::size_t i = 0; i < modules_.size(); ++i) {
    for (const auto& k : modules_[i]->in_keys())
      if (!detail::readable_in(readable, k))
        throw key_error("tensordict::nn::AnyTensorDictSequential: module " + std::to_string(i) + " reads " + to_string(k) +
                        ", which neither the input nor an earlier module writes (readable there: " +
                        detail::listed_paths(readable) + ")");
    for (const auto& k : modules_[i]->out_keys())
      if (!has(readable, k)) readable.push_back(k);
  }
}

template <class F>
std::invoke_result_t<F&, AnyProbabilisticTensorDictModuleImpl&, const AnyTensorDict&> AnyTensorDictSequentialImpl::with_last_module(
    const AnyTensorDict& td, F f) {
  auto* probabilistic = dynamic_cast<AnyProbabilisticTensorDictModuleImpl*>(modules_.back().get());
  auto* sequence = dynamic_cast<AnyTensorDictSequentialImpl*>(modules_.back().get());
  if (!probabilistic && !sequence)
    throw value_error("tensordict::nn::AnyTensorDictSequential: get_dist and log_prob need a probabilistic last module "
                      "(an AnyProbabilisticTensorDictModule, or a sequence ending in one); module " +
                      std::to_string(modules_.size() - 1) + " is a " + modules_.back()->name());
  const AnyTensorDict out = before_last(td);
  return probabilistic ? f(*probabilistic, out) : f(*sequence, out);
}

TENSORDICT_DECL AnyTensorDict AnyTensorDictSequentialImpl::before_last(const AnyTensorDict& td) const {
  check_wiring(td);
  AnyTensorDict out = td;
  for (std::size_t i = 0; i + 1 < modules_.size(); ++i) out = modules_[i]->forward(out);
  return out;
}

TENSORDICT_DECL AnyTensorDictSequential AnyTensorDictSequentialImpl::select_subsequence(
    std::optional<std::vector<any_key_path>> in, std::optional<std::vector<any_key_path>> out) const {
  std::vector<any_key_path> available = in.value_or(in_keys_), wanted = out.value_or(out_keys_);
  for (const auto* keys : {&available, &wanted})
    for (const auto& k : *keys) {
      bool known = has(written_, k);
      for (const auto& m : modules_) known = known || has(m->in_keys(), k);
      if (!known)
        throw key_error("tensordict::nn::AnyTensorDictSequential.select_subsequence: no module reads or writes " + to_string(k));
    }
  std::vector<std::span<const any_key_path>> ins, outs;
  for (const auto& m : modules_) {
    ins.emplace_back(m->in_keys());
    outs.emplace_back(m->out_keys());
  }
  const auto keep = detail::kept_modules(std::move(available), std::move(wanted), ins, outs);
  std::vector<std::shared_ptr<AnyTensorDictModuleBase>> kept;
  for (std::size_t i = 0; i < modules_.size(); ++i)
    if (keep[i]) kept.push_back(modules_[i]);
  if (kept.empty())
    throw value_error("tensordict::nn::AnyTensorDictSequential.select_subsequence: no modules left after selection; make "
                      "the in keys and out keys coherent");
  return AnyTensorDictSequential(std::make_shared<AnyTensorDictSequentialImpl>(std::move(kept)));
}
}  // namespace tensordict::nn
#endif  // TENSORDICT_DEFINITIONS
