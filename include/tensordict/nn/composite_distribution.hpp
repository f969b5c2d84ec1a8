// CompositeDistribution (Python's tensordict.nn.CompositeDistribution): one
// distribution per action head, built from a TensorDict of their parameters,
// whose values are TensorDicts keyed by head.
//
//   AnyTensorDict params({3});                          // params["move"]: loc, scale; params[("grip", "open")]: logits
//   tdn::CompositeDistribution dist(params, {{{"move"}, tdn::distribution_builder::of<tdn::Normal>()},
//                                            {{"grip", "open"}, tdn::distribution_builder::of<tdn::Categorical>()}});
//   AnyTensorDict action = dist.sample();              // "move": [3, 4], ("grip", "open"): [3]
//   AnyTensorDict lp = dist.log_prob(action);         // plus "move_log_prob", ("grip", "open_log_prob"), "sample_log_prob"
//
// As Python's: a head whose parameters params lacks is left out; log_prob
// adds "<head>_log_prob" beside each head's value and "sample_log_prob", the
// heads' log-probabilities summed down to the sample's batch dims; entropy
// gives "<head>_entropy" and "entropy" alike. Unlike Python, log_prob returns
// a new TensorDict (the sample's tensors and the log-probabilities) instead of
// writing into the sample.
// CompositeProbabilisticTensorDictModule reads the parameters from a key of
// the input and writes the sample's leaves (and, with return_log_prob, the
// log-probabilities) into the output, as Python's ProbabilisticTensorDictModule
// does with a CompositeDistribution; its out_keys() are Python's (the heads and
// "sample_log_prob"). At the end of an AnyTensorDictSequential, the sequence's
// get_composite_dist and log_prob ("sample_log_prob") reach it.
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "probabilistic.hpp"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "../any_tensordict.hpp"
#include "../errors.hpp"
#include "tensordict_module.hpp"

namespace tensordict::nn {

// Head name → how its distribution is built from its parameters' names.
using distribution_map = std::vector<std::pair<any_key_path, distribution_builder>>;

namespace detail {
// Python's _add_suffix: ("grip", "open") with "_log_prob" is ("grip", "open_log_prob").
inline any_key_path suffixed(any_key_path head, const std::string& suffix) {
  head.back() += suffix;
  return head;
}
}  // namespace detail

class CompositeDistribution {
 public:
  // params[head] holds each head's parameters by their names ("loc", "scale";
  // "logits" or "probs"); every head's batch shape starts with params' batch size.
  CompositeDistribution(const AnyTensorDict& params, const distribution_map& distributions) : batch_(params.batch_size().vec()) {
    for (const auto& [head, builder] : distributions) {
      if (!params.contains(head)) continue;  // Python leaves out a head without parameters
      if (params.is_leaf(head))
        throw value_error("tensordict::nn::CompositeDistribution: params holds a tensor at " + to_string(head) +
                          "; it must hold a TensorDict of the head's parameters (\"loc\", \"scale\", ...)");
      const AnyTensorDict p = params.get_tensordict(head);
      std::vector<std::string> names;
      std::vector<at::Tensor> tensors;
      for (const auto& name : p.level_keys()) {
        names.push_back(name);
        tensors.push_back(p.get({name}));
      }
      auto dist = builder.build(names, tensors);
      const auto& shape = dist->batch_shape();
      if (shape.size() < batch_.size() || !std::equal(batch_.begin(), batch_.end(), shape.begin()))
        throw shape_error("tensordict::nn::CompositeDistribution: the head " + to_string(head) + "'s " + dist->name() +
                          " has batch shape " + format_sizes(shape) + ", which does not start with params' batch size " +
                          format_sizes(batch_));
      heads_.emplace_back(head, std::move(dist));
    }
  }

  const std::vector<std::int64_t>& batch_shape() const { return batch_; }
  std::size_t size() const { return heads_.size(); }
  // A head's distribution (key_error when there is none).
  const Distribution& head(const any_key_path& name) const {
    for (const auto& [k, d] : heads_)
      if (k == name) return *d;
    throw key_error("tensordict::nn::CompositeDistribution: no head " + to_string(name));
  }

  AnyTensorDict sample(at::IntArrayRef sample_shape = {}, std::optional<at::Generator> generator = std::nullopt) const {
    return values(sample_shape, [&](const Distribution& d) { return d.sample(sample_shape, generator); });
  }
  AnyTensorDict rsample(at::IntArrayRef sample_shape = {}, std::optional<at::Generator> generator = std::nullopt) const {
    return values(sample_shape, [&](const Distribution& d) { return d.rsample(sample_shape, generator); });
  }
  AnyTensorDict mode() const {
    return values({}, [](const Distribution& d) { return d.mode(); });
  }
  AnyTensorDict mean() const {
    return values({}, [](const Distribution& d) { return d.mean(); });
  }
  AnyTensorDict deterministic_sample() const {
    return values({}, [](const Distribution& d) { return d.deterministic_sample(); });
  }
  // Each head's value for an interaction type (random: rsample where the head has it).
  AnyTensorDict draw(interaction_type type) const {
    return values({}, [type](const Distribution& d) { return ::tensordict::nn::draw(d, type); });
  }

  // The sample's tensors plus "<head>_log_prob" per head and "sample_log_prob"
  // (their sum down to the sample's batch dims).
  AnyTensorDict log_prob(const AnyTensorDict& sample) const {
    AnyTensorDict out = sample.exclude({});
    out.set({"sample_log_prob"}, summed(out, "_log_prob", sample.batch_dims(),
                                        [&](const Distribution& d, const any_key_path& k) { return d.log_prob(sample.get(k)); }));
    return out;
  }
  // "<head>_entropy" per head and "entropy", their sum down to the batch dims.
  AnyTensorDict entropy() const {
    AnyTensorDict out(batch_);
    out.set({"entropy"}, summed(out, "_entropy", static_cast<std::int64_t>(batch_.size()),
                                [](const Distribution& d, const any_key_path&) { return d.entropy(); }));
    return out;
  }

 private:
  template <class F>
  AnyTensorDict values(at::IntArrayRef sample_shape, F f) const {
    std::vector<std::int64_t> batch(sample_shape.begin(), sample_shape.end());
    batch.insert(batch.end(), batch_.begin(), batch_.end());
    AnyTensorDict out(batch);
    for (const auto& [k, d] : heads_) out.set(k, f(*d));
    return out;
  }
  // Writes f(head) at "<head><suffix>" in out for each head; returns their sum
  // with each summed over its trailing dims down to `dims`.
  template <class F>
  at::Tensor summed(AnyTensorDict& out, const std::string& suffix, std::int64_t dims, F f) const {
    at::Tensor total;
    for (const auto& [k, d] : heads_) {
      at::Tensor v = f(*d, k);
      out.set(detail::suffixed(k, suffix), v);
      while (v.dim() > dims) v = v.sum(-1);
      total = total.defined() ? total + v : v;
    }
    if (!total.defined()) throw value_error("tensordict::nn::CompositeDistribution: no head has parameters");
    return total;
  }

  std::vector<std::int64_t> batch_;
  std::vector<std::pair<any_key_path, std::shared_ptr<const Distribution>>> heads_;
};

struct composite_options {
  // Also write "<head>_log_prob" per head and "sample_log_prob" (Python's return_log_prob).
  bool return_log_prob = false;
  interaction_type default_interaction_type = interaction_type::mode;
};

// Python's ProbabilisticTensorDictModule(in_keys=["params"], out_keys=[heads...],
// distribution_class=CompositeDistribution, distribution_kwargs={"distribution_map": ...}):
// builds the distribution from the TensorDict at params_key and writes each
// head's value at its name.
//   tdn::CompositeProbabilisticTensorDictModule head({"params"}, {{{"move"}, normal}, {{"grip"}, categorical}},
//                                                    {.return_log_prob = true});
class CompositeProbabilisticTensorDictModuleImpl : public AnyTensorDictModuleBase {
 public:
  CompositeProbabilisticTensorDictModuleImpl(any_key_path params_key, distribution_map distributions,
                                             composite_options options_ = {})
      : AnyTensorDictModuleBase({std::move(params_key)}, outs(distributions, options_)),
        options(options_),
        distributions_(std::move(distributions)) {}

  interaction_type interaction() const { return current_interaction_type().value_or(options.default_interaction_type); }

  CompositeDistribution get_dist(const AnyTensorDict& td) const {
    if (!td.contains(in_keys_[0]) || td.is_leaf(in_keys_[0]))
      throw key_error("tensordict::nn::CompositeProbabilisticTensorDictModule: the TensorDict has no sub-TensorDict " +
                      to_string(in_keys_[0]) + " of the heads' parameters");
    return CompositeDistribution(td.get_tensordict(in_keys_[0]), distributions_);
  }

  AnyTensorDict forward(const AnyTensorDict& td) override {
    const auto dist = get_dist(td);
    AnyTensorDict result = td.exclude({});
    result.update(dist.draw(interaction()));
    return options.return_log_prob ? dist.log_prob(result) : result;
  }

  // The log-probabilities (per head and "sample_log_prob") of the values td holds at the heads' keys.
  AnyTensorDict log_prob(const AnyTensorDict& td) const { return get_dist(td).log_prob(td); }

  composite_options options;

 private:
  // As Python's out_keys: the heads, then "sample_log_prob" (the per-head log-probabilities are written, not listed).
  static std::vector<any_key_path> outs(const distribution_map& distributions, const composite_options& o) {
    std::vector<any_key_path> out;
    for (const auto& [head, builder] : distributions) out.push_back(head);
    if (o.return_log_prob) out.push_back({"sample_log_prob"});
    return out;
  }
  distribution_map distributions_;
};

class CompositeProbabilisticTensorDictModule : public torch::nn::ModuleHolder<CompositeProbabilisticTensorDictModuleImpl> {
 public:
  using torch::nn::ModuleHolder<CompositeProbabilisticTensorDictModuleImpl>::ModuleHolder;
  CompositeProbabilisticTensorDictModule(any_key_path params_key, distribution_map distributions, composite_options options = {})
      : torch::nn::ModuleHolder<CompositeProbabilisticTensorDictModuleImpl>(std::make_shared<CompositeProbabilisticTensorDictModuleImpl>(
            std::move(params_key), std::move(distributions), options)) {}
  AnyTensorDict operator()(const AnyTensorDict& td) const { return this->ptr()->forward(td); }
};

}  // namespace tensordict::nn
