// tensordict.nn's modules that turn a network's output into a distribution's
// parameters, with their adapters:
//   NormalParamExtractor            x -> (loc, scale): x's last dim split in two
//                                   halves, the second mapped to positive values;
//   AddStateIndependentNormalScale  loc -> (loc, scale): scale a trained
//                                   parameter of loc's trailing shape, mapped alike.
// The map is named as in Python (tensordict.nn.utils.mappings): "softplus",
// "exp", "relu", "none", "biased_softplus_{bias}" (softplus shifted so that
// f(0) = bias, at least 0.01) or "biased_softplus_{bias}_{min_val}".
//
//   auto policy_head = tdn::NormalParamExtractor();             // "biased_softplus_1.0", scale >= 1e-4
//   auto [loc, scale] = policy_head(net->forward(obs));
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "adapters/adapter.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/softplus.h>
#include <ATen/ops/zeros.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include "../detail/config.hpp"
#include "../errors.hpp"

namespace tensordict::nn {

// A map from the reals to the positive reals, by Python's name for it.
class scale_mapping {
 public:
  // NOLINTNEXTLINE: a name converts, as in Python
  scale_mapping(const char* name) : scale_mapping(std::string(name)) {}
  // NOLINTNEXTLINE: as above
  TENSORDICT_DECL scale_mapping(std::string name);

  TENSORDICT_DECL at::Tensor operator()(const at::Tensor& x) const;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  bool biased_ = false;
  double shift_ = 0, min_val_ = 0;
};

struct NormalParamExtractorOptions {
  TORCH_ARG(scale_mapping, mapping) = "biased_softplus_1.0";
  // The smallest scale (Python's scale_lb).
  TORCH_ARG(double, scale_lb) = 1e-4;
};

// NormalParamExtractor (tensordict.nn's): no tensors.
class NormalParamExtractorImpl : public torch::nn::Cloneable<NormalParamExtractorImpl> {
 public:
  explicit NormalParamExtractorImpl(NormalParamExtractorOptions options_ = {}) : options(std::move(options_)) {}
  void reset() override {}

  // (loc, scale): x's last dim in two halves (an odd size gives loc the larger, as torch.chunk).
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x) {
    if (x.dim() == 0 || x.size(-1) < 2)
      throw shape_error("tensordict::nn::NormalParamExtractor: the input " + describe(x) +
                        " needs a last dim of at least 2 to split into loc and scale");
    auto halves = x.chunk(2, -1);
    return {halves[0], options.mapping()(halves[1]).clamp_min(options.scale_lb())};
  }

  NormalParamExtractorOptions options;
};
TORCH_MODULE(NormalParamExtractor);

struct AddStateIndependentNormalScaleOptions {
  TORCH_ARG(scale_mapping, mapping) = "exp";
  TORCH_ARG(double, scale_lb) = 1e-4;
};

// AddStateIndependentNormalScale (tensordict.nn's): the parameter
// state_independent_scale (zeros of scale_shape) mapped to the scale, whatever
// the input.
class AddStateIndependentNormalScaleImpl : public torch::nn::Cloneable<AddStateIndependentNormalScaleImpl> {
 public:
  explicit AddStateIndependentNormalScaleImpl(std::vector<int64_t> scale_shape,
                                              AddStateIndependentNormalScaleOptions options_ = {})
      : options(std::move(options_)), scale_shape_(std::move(scale_shape)) {
    reset();
  }
  void reset() override {
    state_independent_scale = register_parameter("state_independent_scale", at::zeros(scale_shape_));
  }

  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& loc) { return scaled(loc, state_independent_scale); }

  // The forward with the given parameter (the functional form's).
  std::tuple<at::Tensor, at::Tensor> scaled(const at::Tensor& loc, const at::Tensor& scale) const {
    const auto n = static_cast<int64_t>(scale_shape_.size());
    if (loc.dim() < n || loc.sizes().slice(static_cast<std::size_t>(loc.dim() - n)) != c10::IntArrayRef(scale_shape_))
      throw shape_error("tensordict::nn::AddStateIndependentNormalScale: the last dims of loc " + describe(loc) +
                        " differ from scale_shape " + format_sizes(scale_shape_));
    std::vector<int64_t> view(static_cast<std::size_t>(loc.dim() - n), 1);
    view.insert(view.end(), scale_shape_.begin(), scale_shape_.end());
    const auto broadcast = at::zeros(loc.sizes(), loc.options()) + scale.view(view);
    return {loc, options.mapping()(broadcast).clamp_min(options.scale_lb())};
  }

  AddStateIndependentNormalScaleOptions options;
  at::Tensor state_independent_scale;

 private:
  std::vector<int64_t> scale_shape_;
};
TORCH_MODULE(AddStateIndependentNormalScale);

namespace detail {
using distribution_params_family = type_list<NormalParamExtractorImpl, AddStateIndependentNormalScaleImpl>;
}  // namespace detail

template <>
struct module_traits<NormalParamExtractorImpl> {
  using members = member_list<>;
};
TENSORDICT_MODULE_MEMBERS(AddStateIndependentNormalScaleImpl,
                          TENSORDICT_MEMBER(AddStateIndependentNormalScaleImpl, state_independent_scale))

template <>
struct functional<AddStateIndependentNormalScaleImpl> {
  static constexpr bool is_functional = true;
  using Impl = AddStateIndependentNormalScaleImpl;
  static std::tuple<at::Tensor, at::Tensor> forward(const Impl& m, const TensorDict<schema_of<Impl>>& p,
                                                    const at::Tensor& loc) {
    return m.scaled(loc, p.leaf(0));
  }
};

}  // namespace tensordict::nn

#if TENSORDICT_DEFINITIONS
namespace tensordict::nn {
TENSORDICT_DECL scale_mapping::scale_mapping(std::string name) : name_(std::move(name)) {
  const std::string biased = "biased_softplus";
  if (name_ == "softplus" || name_ == "exp" || name_ == "relu" || name_ == "none") return;
  if (name_.rfind(biased, 0) != 0)
    throw value_error("tensordict::nn::scale_mapping: unknown mapping \"" + name_ +
                      "\" (known: softplus, exp, relu, none, biased_softplus, biased_softplus_{bias}, "
                      "biased_softplus_{bias}_{min_val})");
  double bias = 1.0;
  min_val_ = 0.01;
  const std::string rest = name_.substr(biased.size());
  try {
    if (!rest.empty()) {
      if (rest[0] != '_') throw std::invalid_argument(rest);
      const auto second = rest.find('_', 1);
      std::size_t used = 0;
      bias = std::stod(rest.substr(1, second == std::string::npos ? std::string::npos : second - 1), &used);
      if (used != (second == std::string::npos ? rest.size() - 1 : second - 1)) throw std::invalid_argument(rest);
      if (second != std::string::npos) {
        min_val_ = std::stod(rest.substr(second + 1), &used);
        if (used != rest.size() - second - 1) throw std::invalid_argument(rest);
      }
    }
  } catch (const std::logic_error&) {
    throw value_error("tensordict::nn::scale_mapping: \"" + name_ +
                      "\" is not biased_softplus_{bias} or biased_softplus_{bias}_{min_val} with numbers");
  }
  // inv_softplus(bias - min_val) as Python computes it: in float32, clamped at 1e-6.
  shift_ = at::scalar_tensor(bias - min_val_, at::kFloat).expm1().clamp_min(1e-6).log().item<double>();
  biased_ = true;
}

TENSORDICT_DECL at::Tensor scale_mapping::operator()(const at::Tensor& x) const {
  if (biased_) return at::softplus(x + shift_) + min_val_;
  if (name_ == "softplus") return at::softplus(x);
  if (name_ == "exp") return x.exp();
  if (name_ == "relu") return at::relu(x);
  return x;
}
}  // namespace tensordict::nn
#endif  // TENSORDICT_DEFINITIONS
