// ProbabilisticTensorDictModule and interaction types (Python's
// tensordict.nn.probabilistic): a module without tensors that builds a
// distribution from in keys and writes a value of it at its out key.
//
//   using policy_head = tdn::ProbabilisticTensorDictModule<tdn::Normal, tdn::in_keys<"loc", "scale">,
//                                                          tdn::out_keys<"action">, tdn::log_prob_key<"sample_log_prob">>;
//   policy_head head;                                   // default interaction type: mode
//   auto out = head(td);                                // td plus action and sample_log_prob
//   { tdn::set_interaction_type random(tdn::interaction_type::random);
//     auto explored = head(td); }                       // rsample (sample where there is none)
//
// The in keys name the distribution's parameters (Normal: loc and scale;
// Categorical: logits or probs): other keys do not compile, and the message
// names the parameters (distribution_parameters<Dist>). The output schema is
// the input's plus the out key and the log-prob key, computed by the compiler.
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "tensordict_module.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "distributions.hpp"

namespace tensordict::nn {

// How a probabilistic module turns its distribution into a value (Python's
// InteractionType): mode, median, mean, a random draw (rsample where the
// distribution has one, else sample), or deterministic_sample.
enum class interaction_type { mode, median, mean, random, deterministic };

namespace detail {
inline std::optional<interaction_type>& interaction_override() {
  thread_local std::optional<interaction_type> current;
  return current;
}
}  // namespace detail

// The interaction type set by the innermost live set_interaction_type of this
// thread, if any (modules use their default otherwise).
inline std::optional<interaction_type> current_interaction_type() { return detail::interaction_override(); }

// Python's `with set_interaction_type(...)`: every probabilistic module called
// on this thread while the guard lives uses `type`; the previous one comes
// back when it dies. (Per thread, where Python's is global: threads that run
// policies each choose their own.)
class set_interaction_type {
 public:
  explicit set_interaction_type(interaction_type type) : previous_(detail::interaction_override()) {
    detail::interaction_override() = type;
  }
  ~set_interaction_type() { detail::interaction_override() = previous_; }
  set_interaction_type(const set_interaction_type&) = delete;
  set_interaction_type& operator=(const set_interaction_type&) = delete;

 private:
  std::optional<interaction_type> previous_;
};

// A distribution's value for an interaction type. MEAN, where the mean has
// no closed form (TanhNormal), is the mean of `empirical_samples` draws
// (rsample where there is one), as Python's module estimates it
// (n_empirical_estimate); where the mean is no value of the distribution (a
// Categorical's NaN) it throws value_error.
TENSORDICT_DECL at::Tensor draw(const Distribution& dist, interaction_type type, std::int64_t empirical_samples = 1000);

struct no_distribution_options {};

// What a probabilistic module needs to build a distribution type from keys:
// its parameter names (`names`, and where Python takes either, `alternative`),
// its options (the distribution_kwargs that are not tensors), its name
// (`distribution`, for messages) and `make`,
// which takes the tensors in the order of `names` (or of `alternative`).
// Specialize it for a distribution of your own.
template <class Dist>
struct distribution_parameters;

template <>
struct distribution_parameters<Normal> {
  static constexpr std::string_view distribution = "Normal";
  static constexpr std::array<std::string_view, 2> names{"loc", "scale"};
  using options = no_distribution_options;
  static Normal make(const std::array<at::Tensor, 2>& p, const options&, bool) { return Normal(p[0], p[1]); }
};
template <>
struct distribution_parameters<TruncatedNormal> {
  static constexpr std::string_view distribution = "TruncatedNormal";
  static constexpr std::array<std::string_view, 2> names{"loc", "scale"};
  using options = TruncatedNormalOptions;
  static TruncatedNormal make(const std::array<at::Tensor, 2>& p, const options& o, bool) {
    return TruncatedNormal(p[0], p[1], o);
  }
};
template <>
struct distribution_parameters<TanhNormal> {
  static constexpr std::string_view distribution = "TanhNormal";
  static constexpr std::array<std::string_view, 2> names{"loc", "scale"};
  using options = TanhNormalOptions;
  static TanhNormal make(const std::array<at::Tensor, 2>& p, const options& o, bool) { return TanhNormal(p[0], p[1], o); }
};
template <>
struct distribution_parameters<Delta> {
  static constexpr std::string_view distribution = "Delta";
  static constexpr std::array<std::string_view, 1> names{"param"};
  using options = DeltaOptions;
  static Delta make(const std::array<at::Tensor, 1>& p, const options& o, bool) { return Delta(p[0], o); }
};
template <class Dist>
  requires std::is_same_v<Dist, Categorical> || std::is_same_v<Dist, OneHotCategorical>
struct distribution_parameters<Dist> {
  static constexpr std::string_view distribution =
      std::is_same_v<Dist, Categorical> ? std::string_view("Categorical") : std::string_view("OneHotCategorical");
  static constexpr std::array<std::string_view, 1> names{"logits"};
  static constexpr std::array<std::string_view, 1> alternative{"probs"};
  using options = no_distribution_options;
  static Dist make(const std::array<at::Tensor, 1>& p, const options&, bool from_alternative) {
    return from_alternative ? Dist::from_probs(p[0]) : Dist(p[0]);
  }
};
template <>
struct distribution_parameters<Bernoulli> {
  static constexpr std::string_view distribution = "Bernoulli";
  static constexpr std::array<std::string_view, 1> names{"probs"};
  static constexpr std::array<std::string_view, 1> alternative{"logits"};
  using options = no_distribution_options;
  static Bernoulli make(const std::array<at::Tensor, 1>& p, const options&, bool from_alternative) {
    return from_alternative ? Bernoulli::from_logits(p[0]) : Bernoulli(p[0]);
  }
};

// Independent(Dist(...), N) as one distribution type for a module (Python's
// pattern: a function IndepNormal(loc, scale) given as distribution_class).
template <class Dist, int64_t N>
struct independent {};

template <class Dist, int64_t N>
struct distribution_parameters<independent<Dist, N>> : distribution_parameters<Dist> {
  static constexpr std::string_view distribution = "Independent";
  template <std::size_t K>
  static Independent make(const std::array<at::Tensor, K>& p, const typename distribution_parameters<Dist>::options& o,
                          bool from_alternative) {
    return Independent(distribution_parameters<Dist>::make(p, o, from_alternative), N);
  }
};

// The log-probability key of a probabilistic module (Python's return_log_prob
// with log_prob_key): log_prob_key<"sample_log_prob">, or none.
template <key... Key>
struct log_prob_key {
  static_assert(sizeof...(Key) <= 1, "tensordict::nn::log_prob_key takes one key (or none: no log-probability).");
};
using no_log_prob = log_prob_key<>;

namespace compile_error {
template <class Dist, class InKeys, class Names>
struct in_keys_are_not_the_distribution_parameters {
  static_assert(::tensordict::compile_error::always_false<Dist>,
                "tensordict::nn::ProbabilisticTensorDictModule: the in keys must name the distribution's "
                "parameters, in any order (see 'distribution_parameters<Dist>::names' and '::alternative': Normal "
                "takes loc and scale, Categorical logits or probs, Delta param): in_keys<\"loc\", nested_key<\"agents\", "
                "\"scale\">> feeds each by its key's last part; param_keys<param<\"loc\", key>, ...> names the parameter "
                "each key feeds (Python's dict in_keys).");
};
}  // namespace compile_error

namespace detail {
// Where each of `keys` sits among `names` (into out[0, keys.size())), or false
// if the keys are not a permutation of the names. Both forms match a
// distribution's parameters with it: the typed one at compile time.
constexpr bool permutation_positions(std::span<const std::string_view> names, std::span<const std::string_view> keys,
                                     std::size_t* out) {
  if (names.size() != keys.size()) return false;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto found = static_cast<std::size_t>(std::find(names.begin(), names.end(), keys[i]) - names.begin());
    if (found == names.size() || std::find(out, out + i, found) != out + i) return false;
    out[i] = found;
  }
  return true;
}

template <std::size_t M, key... In>
constexpr std::optional<std::array<std::size_t, sizeof...(In)>> parameter_positions(const std::array<std::string_view, M>& names) {
  constexpr std::array<std::string_view, sizeof...(In)> keys{In.view()...};
  std::array<std::size_t, sizeof...(In)> out{};
  if (!permutation_positions(names, keys, out.data())) return std::nullopt;
  return out;
}

template <class Traits, key... In>
constexpr auto keys_as_parameters() {
  constexpr auto direct = parameter_positions<Traits::names.size(), In...>(Traits::names);
  if constexpr (direct.has_value()) {
    return std::pair{*direct, false};
  } else if constexpr (requires { Traits::alternative; }) {
    constexpr auto alt = parameter_positions<Traits::alternative.size(), In...>(Traits::alternative);
    if constexpr (alt.has_value())
      return std::pair{*alt, true};
    else
      return std::nullopt;
  } else {
    return std::nullopt;
  }
}
}  // namespace detail

template <key Name, key Key>
struct param;
namespace detail {
template <class T>
struct is_param : std::false_type {};
template <key Name, key Key>
struct is_param<param<Name, Key>> : std::true_type {};
}  // namespace detail

// Python's dict in_keys, {"loc": ("agents", "robot", "mu")}: the distribution
// parameter Name read from the key Key.
//   tdn::ProbabilisticTensorDictModule<tdn::Normal, tdn::param_keys<tdn::param<"loc", nested_key<"agents", "mu">>,
//                                                                  tdn::param<"scale", nested_key<"agents", "sigma">>>,
//                                      tdn::out_keys<"action">>
template <key Name, key Key>
struct param {};
template <class... Params>
struct param_keys {
  static_assert(sizeof...(Params) > 0 && (detail::is_param<Params>::value && ...),
                "tensordict::nn::param_keys lists param<\"name\", key> entries: param_keys<param<\"loc\", "
                "nested_key<\"agents\", \"mu\">>, ...>.");
};

namespace detail {
// The parameter a key of a plain in-key list feeds: its last part, as Python maps a list of nested keys.
template <key K>
inline constexpr auto parameter_name_v = []<key... Parts>(key_path_t<Parts...>) {
  return std::get<sizeof...(Parts) - 1>(std::tuple{Parts...});
}(key_parts_t<K>{});

template <class Dist, class Names, class In, class Out, class LogProb>
class probabilistic_module;
}  // namespace detail

template <class Dist, class In, class Out, class LogProb = no_log_prob>
class ProbabilisticTensorDictModuleImpl;

// in_keys<...>: each key feeds the parameter its last part names ("loc" or ("agents", "loc")).
template <class Dist, key... In, class Out, class LogProb>
class ProbabilisticTensorDictModuleImpl<Dist, in_keys<In...>, Out, LogProb>
    : public detail::probabilistic_module<Dist, in_keys<detail::parameter_name_v<In>...>, in_keys<In...>, Out, LogProb> {
 public:
  using detail::probabilistic_module<Dist, in_keys<detail::parameter_name_v<In>...>, in_keys<In...>, Out, LogProb>::probabilistic_module;
};
// param_keys<param<Name, Key>...>: Python's dict in_keys.
template <class Dist, key... Name, key... Key, class Out, class LogProb>
class ProbabilisticTensorDictModuleImpl<Dist, param_keys<param<Name, Key>...>, Out, LogProb>
    : public detail::probabilistic_module<Dist, in_keys<Name...>, in_keys<Key...>, Out, LogProb> {
 public:
  using detail::probabilistic_module<Dist, in_keys<Name...>, in_keys<Key...>, Out, LogProb>::probabilistic_module;
};

namespace detail {
// The module: Names are the distribution parameters that the keys In feed, in order.
template <class Dist, key... Names, key... In, key... Out, key... LogProb>
class probabilistic_module<Dist, in_keys<Names...>, in_keys<In...>, out_keys<Out...>, log_prob_key<LogProb...>>
    : public torch::nn::Module {
  static_assert(sizeof...(Out) == 1,
                "tensordict::nn::ProbabilisticTensorDictModule: name one out key, for the distribution's value.");
  using traits = distribution_parameters<Dist>;
  static constexpr auto wiring = detail::keys_as_parameters<traits, Names...>();
  static constexpr bool keys_fit = !std::is_same_v<std::remove_cv_t<decltype(wiring)>, std::nullopt_t>;
  static constexpr bool check_wiring() {
    if constexpr (!keys_fit)
      ::tensordict::compile_error::report<
          ::tensordict::nn::compile_error::in_keys_are_not_the_distribution_parameters<Dist, in_keys<Names...>,
                                                                                       decltype(traits::names)>>();
    return true;
  }
  static_assert(check_wiring());  // reports wrong in keys where the module type is first used

 public:
  using in_keys_t = in_keys<In...>;
  using out_keys_t = out_keys<Out..., LogProb...>;
  using dist_type = decltype(traits::make(std::declval<const std::array<at::Tensor, sizeof...(In)>&>(),
                                          std::declval<const typename traits::options&>(), false));
  // The input schema plus the out key and the log-probability key.
  template <class S>
  using output_schema = typename detail::with_out_keys<S, Out..., LogProb...>::type;

  struct options_t {
    typename traits::options distribution{};
    // Used when no set_interaction_type guard is live (Python 0.4's default).
    interaction_type default_interaction_type = interaction_type::mode;
    // Draws that estimate a mean without closed form for interaction_type::mean (Python's n_empirical_estimate).
    std::int64_t n_empirical_estimate = 1000;
  };

  explicit probabilistic_module(options_t options_ = {}) : options(std::move(options_)) {}

  // The interaction type a call uses now.
  interaction_type interaction() const {
    return current_interaction_type().value_or(options.default_interaction_type);
  }

  template <class S>
  static constexpr bool has_in_keys() {
    return (detail::has_key_v<S, In> && ...);
  }

  // The distribution the in keys describe (Python's get_dist).
  template <class S>
  dist_type get_dist(const TensorDict<S>& td) const {
    if constexpr (keys_fit && has_in_keys<S>()) {
      std::array<at::Tensor, sizeof...(In)> by_name;
      std::size_t i = 0;
      ((by_name[wiring.first[i++]] = detail::get_key<In>(td)), ...);
      return traits::make(by_name, options.distribution, wiring.second);
    } else {
      check_in_keys<S>();
      throw;  // not reached: the line above does not compile
    }
  }

  // The input plus the value at the out key (and its log-probability).
  template <class S>
  TensorDict<output_schema<S>> forward(const TensorDict<S>& td) {
    const auto dist = get_dist(td);
    auto result = detail::with_leaves_of<output_schema<S>>(td, td.batch_size());
    if constexpr (sizeof...(LogProb) == 1) {
      if (interaction() == interaction_type::random && dist.has_rsample()) {
        // The draw and its log-probability together: a distribution may fuse them.
        auto [value, log_prob] = dist.rsample_and_log_prob();
        (detail::set_key<Out>(result, value), ...);
        (detail::set_key<LogProb>(result, log_prob), ...);
        return result;
      }
    }
    const at::Tensor value = draw(dist, interaction(), options.n_empirical_estimate);
    (detail::set_key<Out>(result, value), ...);
    if constexpr (sizeof...(LogProb) == 1) (detail::set_key<LogProb>(result, dist.log_prob(value)), ...);
    return result;
  }

  // The log-probability of the value td holds at the out key (Python's log_prob).
  template <class S>
  at::Tensor log_prob(const TensorDict<S>& td) const {
    return get_dist(td).log_prob(detail::get_key<Out...>(td));
  }

  template <class S>
  static constexpr void check_in_keys() {
    detail::report_missing_in_keys<S, In...>();
  }

  options_t options;
};
}  // namespace detail

template <class Dist, class In, class Out, class LogProb = no_log_prob>
class ProbabilisticTensorDictModule
    : public torch::nn::ModuleHolder<ProbabilisticTensorDictModuleImpl<Dist, In, Out, LogProb>> {
 public:
  using Impl = ProbabilisticTensorDictModuleImpl<Dist, In, Out, LogProb>;
  using torch::nn::ModuleHolder<Impl>::ModuleHolder;
  ProbabilisticTensorDictModule() : torch::nn::ModuleHolder<Impl>(std::make_shared<Impl>()) {}
  explicit ProbabilisticTensorDictModule(typename Impl::options_t options)
      : torch::nn::ModuleHolder<Impl>(std::make_shared<Impl>(std::move(options))) {}
  // module(td), as in Python (ModuleHolder's operator() cannot see a template forward).
  template <class S>
  auto operator()(const TensorDict<S>& td) const {
    return this->ptr()->forward(td);
  }
};

// No tensors: an empty schema, and its forward needs no parameters.
template <class Dist, class In, class Out, class LogProb>
struct module_traits<ProbabilisticTensorDictModuleImpl<Dist, In, Out, LogProb>> {
  using members = member_list<>;
};

// In an ensemble: the distribution over every copy's parameters at once (a
// random draw is one per copy).
template <class Dist, class In, class Out, class LogProb>
struct ensemble_forward<ProbabilisticTensorDictModuleImpl<Dist, In, Out, LogProb>> {
  template <class P, class S>
  static auto forward(ProbabilisticTensorDictModuleImpl<Dist, In, Out, LogProb>& m, const P&, const TensorDict<S>& td,
                      const functional_vmap_options&, c10::IntArrayRef shared_batch) {
    return m.forward(shared_batch.empty() ? td : td.expand(shared_batch));
  }
};

// ---- run-time form ----------------------------------------------------------------

// A distribution type chosen at run time: builds it from named parameters.
//   auto normal = tdn::distribution_builder::of<tdn::Normal>();
//   auto trunc = tdn::distribution_builder::of<tdn::TruncatedNormal>({.a = -1.0, .b = 1.0});
class distribution_builder {
 public:
  template <class Dist>
  static distribution_builder of(typename distribution_parameters<Dist>::options options = {}) {
    using traits = distribution_parameters<Dist>;
    constexpr std::size_t n = traits::names.size();
    distribution_builder b;
    b.name_ = std::string(traits::distribution);
    b.names_.assign(traits::names.begin(), traits::names.end());
    if constexpr (requires { traits::alternative; }) b.alternative_.assign(traits::alternative.begin(), traits::alternative.end());
    b.make_ = [options](const std::vector<at::Tensor>& tensors, bool alternative) -> std::shared_ptr<const Distribution> {
      std::array<at::Tensor, n> by_name;
      for (std::size_t i = 0; i < n; ++i) by_name[i] = tensors[i];
      using made = decltype(traits::make(by_name, options, alternative));
      return std::make_shared<const made>(traits::make(by_name, options, alternative));
    };
    return b;
  }

  const std::string& name() const { return name_; }

  // The order of `names` in the distribution's parameters (and whether they are
  // its alternative set), or value_error naming what it takes.
  TENSORDICT_DECL std::pair<std::vector<std::size_t>, bool> positions(const std::vector<std::string>& names) const;

  TENSORDICT_DECL std::shared_ptr<const Distribution> build(const std::vector<std::string>& names,
                                                            const std::vector<at::Tensor>& tensors) const;

 private:
  std::string name_;
  // (Views of distribution_parameters' static names.)
  std::vector<std::string_view> names_, alternative_;
  std::function<std::shared_ptr<const Distribution>(const std::vector<at::Tensor>&, bool)> make_;
};

struct any_probabilistic_options {
  // Where the log-probability goes (Python's return_log_prob and log_prob_key); none when unset.
  std::optional<any_key_path> log_prob_key;
  interaction_type default_interaction_type = interaction_type::mode;
  // Draws that estimate a mean without closed form for interaction_type::mean (Python's n_empirical_estimate).
  std::int64_t n_empirical_estimate = 1000;
};

// ProbabilisticTensorDictModule at run time: each distribution parameter read
// from a key path (Python's in_keys dict, {"loc": ("agents", "loc")}), checked
// against the distribution's parameter names when it is built.
//   tdn::AnyProbabilisticTensorDictModule head(tdn::distribution_builder::of<tdn::Normal>(),
//       {{"loc", {"loc"}}, {"scale", {"scale"}}}, {"agents", "action"}, {.log_prob_key = any_key_path{"sample_log_prob"}});
class AnyProbabilisticTensorDictModuleImpl : public AnyTensorDictModuleBase {
 public:
  // Checks the parameter names against the distribution's: value_error now, not at the first call.
  TENSORDICT_DECL AnyProbabilisticTensorDictModuleImpl(distribution_builder distribution,
                                                       std::vector<std::pair<std::string, any_key_path>> dist_keys,
                                                       any_key_path out_key, any_probabilistic_options options_ = {});

  interaction_type interaction() const { return current_interaction_type().value_or(options.default_interaction_type); }

  TENSORDICT_DECL std::shared_ptr<const Distribution> get_dist(const AnyTensorDict& td) const;

  TENSORDICT_DECL AnyTensorDict forward(const AnyTensorDict& td) override;

  // The log-probability of the value td holds at the out key.
  TENSORDICT_DECL at::Tensor log_prob(const AnyTensorDict& td) const;

  any_probabilistic_options options;

 private:
  distribution_builder distribution_;
  std::vector<std::string> names_;
};

class AnyProbabilisticTensorDictModule : public torch::nn::ModuleHolder<AnyProbabilisticTensorDictModuleImpl> {
 public:
  using torch::nn::ModuleHolder<AnyProbabilisticTensorDictModuleImpl>::ModuleHolder;
  TENSORDICT_DECL AnyProbabilisticTensorDictModule(distribution_builder distribution,
                                                   std::vector<std::pair<std::string, any_key_path>> dist_keys,
                                                   any_key_path out_key, any_probabilistic_options options = {});
  AnyTensorDict operator()(const AnyTensorDict& td) const { return this->ptr()->forward(td); }
};

}  // namespace tensordict::nn

#if TENSORDICT_DEFINITIONS
namespace tensordict::nn {
TENSORDICT_DECL at::Tensor draw(const Distribution& dist, interaction_type type, std::int64_t empirical_samples) {
  switch (type) {
    case interaction_type::mode: return dist.mode();
    case interaction_type::median: return dist.median();
    case interaction_type::mean: {
      if (!dist.mean_is_a_value())
        throw value_error("tensordict::nn: interaction_type::mean has no value for " + dist.repr() +
                          ": its mean is no value it takes (a class index has none); use interaction_type::mode, "
                          "deterministic or random");
      try {
        return dist.mean();
      } catch (const value_error&) {  // no closed form
        return (dist.has_rsample() ? dist.rsample({empirical_samples}) : dist.sample({empirical_samples})).mean(0);
      }
    }
    case interaction_type::random: return dist.has_rsample() ? dist.rsample() : dist.sample();
    default: return dist.deterministic_sample();
  }
}

TENSORDICT_DECL std::pair<std::vector<std::size_t>, bool> distribution_builder::positions(
    const std::vector<std::string>& names) const {
  const std::vector<std::string_view> keys(names.begin(), names.end());
  for (const bool alternative : {false, true}) {
    const auto& expected = alternative ? alternative_ : names_;
    std::vector<std::size_t> order(keys.size());
    if (!expected.empty() && detail::permutation_positions(expected, keys, order.data())) return {order, alternative};
  }
  auto join = [](const auto& v) {
    std::string out;
    for (const auto& x : v) out += (out.empty() ? "" : ", ") + std::string(x);
    return out;
  };
  throw value_error("tensordict::nn::" + name_ + " takes the parameters " + join(names_) +
                    (alternative_.empty() ? "" : " (or " + join(alternative_) + ")") + ", got " + join(names));
}

TENSORDICT_DECL std::shared_ptr<const Distribution> distribution_builder::build(const std::vector<std::string>& names,
                                                                                const std::vector<at::Tensor>& tensors) const {
  const auto [order, alternative] = positions(names);
  std::vector<at::Tensor> by_name(order.size());
  for (std::size_t i = 0; i < order.size(); ++i) by_name[order[i]] = tensors[i];
  return make_(by_name, alternative);
}

namespace detail {
inline std::vector<any_key_path> probabilistic_out_keys(const any_key_path& out_key, const any_probabilistic_options& o) {
  std::vector<any_key_path> out{out_key};
  if (o.log_prob_key) out.push_back(*o.log_prob_key);
  return out;
}
}  // namespace detail

TENSORDICT_DECL AnyProbabilisticTensorDictModuleImpl::AnyProbabilisticTensorDictModuleImpl(
    distribution_builder distribution, std::vector<std::pair<std::string, any_key_path>> dist_keys, any_key_path out_key,
    any_probabilistic_options options_)
    : AnyTensorDictModuleBase({}, detail::probabilistic_out_keys(out_key, options_)),
      options(std::move(options_)),
      distribution_(std::move(distribution)) {
  for (auto& [name, path] : dist_keys) {
    names_.push_back(name);
    in_keys_.push_back(std::move(path));
  }
  (void)distribution_.positions(names_);
}

TENSORDICT_DECL std::shared_ptr<const Distribution> AnyProbabilisticTensorDictModuleImpl::get_dist(const AnyTensorDict& td) const {
  check_in_keys(td, "tensordict::nn::AnyProbabilisticTensorDictModule(" + distribution_.name() + ")");
  std::vector<at::Tensor> tensors;
  for (const auto& k : in_keys_) tensors.push_back(td.get(k));
  return distribution_.build(names_, tensors);
}

TENSORDICT_DECL AnyTensorDict AnyProbabilisticTensorDictModuleImpl::forward(const AnyTensorDict& td) {
  const auto dist = get_dist(td);
  AnyTensorDict result = td.exclude({});
  if (options.log_prob_key && interaction() == interaction_type::random && dist->has_rsample()) {
    auto [value, log_prob] = dist->rsample_and_log_prob();  // a distribution may fuse the two
    result.set(out_keys_[0], value);
    result.set(*options.log_prob_key, log_prob);
    return result;
  }
  const at::Tensor value = draw(*dist, interaction(), options.n_empirical_estimate);
  result.set(out_keys_[0], value);
  if (options.log_prob_key) result.set(*options.log_prob_key, dist->log_prob(value));
  return result;
}

TENSORDICT_DECL at::Tensor AnyProbabilisticTensorDictModuleImpl::log_prob(const AnyTensorDict& td) const {
  return get_dist(td)->log_prob(td.get(out_keys_[0]));
}

TENSORDICT_DECL AnyProbabilisticTensorDictModule::AnyProbabilisticTensorDictModule(
    distribution_builder distribution, std::vector<std::pair<std::string, any_key_path>> dist_keys, any_key_path out_key,
    any_probabilistic_options options)
    : torch::nn::ModuleHolder<AnyProbabilisticTensorDictModuleImpl>(std::make_shared<AnyProbabilisticTensorDictModuleImpl>(
          std::move(distribution), std::move(dist_keys), std::move(out_key), std::move(options))) {}
}  // namespace tensordict::nn
#endif  // TENSORDICT_DEFINITIONS
