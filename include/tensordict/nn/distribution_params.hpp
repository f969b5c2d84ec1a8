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
  // The mapping, then clamp_min(lower): a scale of at least `lower`. The softplus mappings on a
  // float32/float64 CPU tensor take one pass and one autograd node (the four ops' values and
  // gradients; their own backward where a graph of the backward is asked for).
  TENSORDICT_DECL at::Tensor at_least(const at::Tensor& x, double lower) const;
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
    return {halves[0], options.mapping().at_least(halves[1], options.scale_lb())};
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
    return {loc, options.mapping().at_least(broadcast, options.scale_lb())};
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

// The modules' vtables and virtual members (clone, clone_) compile once, in libtensordict, instead
// of in every TU that constructs one: explicit instantiations of their Cloneable bases.
#if !TENSORDICT_DEFINITIONS
extern template class torch::nn::Cloneable<tensordict::nn::NormalParamExtractorImpl>;
extern template class torch::nn::Cloneable<tensordict::nn::AddStateIndependentNormalScaleImpl>;
#elif !defined(TENSORDICT_HEADER_ONLY)
template class torch::nn::Cloneable<tensordict::nn::NormalParamExtractorImpl>;
template class torch::nn::Cloneable<tensordict::nn::AddStateIndependentNormalScaleImpl>;
#endif

#if TENSORDICT_DEFINITIONS
#include <algorithm>
#include <optional>

#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "../detail/kernels/scalar_math.hpp"

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

namespace tensordict::nn::detail {
// softplus(x + shift) + min_val, then clamp_min(lower), per element in T as ATen's kernels round
// them (the scalars cast to T); x as `rows` runs of `cols` values, run r at r * row_stride (the
// halves NormalParamExtractor's chunk leaves), y and `unclamped` contiguous.
struct scale_pass {
  double shift, min_val, lower;
  std::int64_t rows, cols, row_stride;

  template <class T>
  void forward(const T* x, T* y, T* unclamped) const {
    const T s = static_cast<T>(shift), m = static_cast<T>(min_val), lo = static_cast<T>(lower);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) {
        const T v = ::tensordict::detail::softplus(x[r * row_stride + c] + s) + m;
        unclamped[r * cols + c] = v;
        y[r * cols + c] = std::isnan(v) ? v : std::max(v, lo);
      }
  }
  // clamp_min's gradient passes where the unclamped value is at least `lower` (not NaN), then
  // softplus's at x + shift.
  template <class T>
  void backward(const T* x, const T* unclamped, const T* g, T* gx) const {
    const T s = static_cast<T>(shift), lo = static_cast<T>(lower);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::int64_t k = r * cols + c;
        gx[k] = ::tensordict::detail::softplus_backward(unclamped[k] >= lo ? g[k] : T(0), x[r * row_stride + c] + s);
      }
  }
};

// x's layout for scale_pass, where its strides allow one.
inline std::optional<scale_pass> scale_pass_for(const at::Tensor& x, double shift, double min_val, double lower) {
  // Inside vmap or a functorch transform a tensor has no storage of its own; a dual tensor's tangent this pass would not carry.
  if (!x.is_cpu() || x.layout() != at::kStrided || (x.scalar_type() != at::kFloat && x.scalar_type() != at::kDouble) ||
      !x.has_storage() || x._fw_grad(/*level=*/0).defined() || x.is_neg() || x.is_conj() || x.numel() == 0)
    return std::nullopt;
  const std::int64_t dim = x.dim(), cols = dim == 0 ? 1 : x.size(-1);
  if (dim > 0 && cols > 1 && x.stride(-1) != 1) return std::nullopt;
  // The leading dims walk the runs as one dim: each (but those of size 1) steps over the runs inside it.
  std::int64_t row_stride = cols;
  for (std::int64_t d = dim - 2; d >= 0; --d)
    if (x.size(d) != 1) {
      row_stride = x.stride(d);
      break;
    }
  if (row_stride < cols) return std::nullopt;
  for (std::int64_t d = dim - 2, expected = row_stride; d >= 0; expected *= x.size(d), --d)
    if (x.size(d) != 1 && x.stride(d) != expected) return std::nullopt;
  return scale_pass{shift, min_val, lower, x.numel() / cols, cols, row_stride};
}

// The pass as one autograd node of x.
struct scale_function : torch::autograd::Function<scale_function> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, scale_pass pass) {
    auto [y, unclamped] = run(x, pass);
    ctx->save_for_backward({x, unclamped});
    ctx->saved_data["shift"] = pass.shift;
    ctx->saved_data["min_val"] = pass.min_val;
    ctx->saved_data["lower"] = pass.lower;
    ctx->set_materialize_grads(false);
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &unclamped = saved[1];
    const double shift = ctx->saved_data["shift"].toDouble(), min_val = ctx->saved_data["min_val"].toDouble(),
                 lower = ctx->saved_data["lower"].toDouble();
    torch::autograd::variable_list out(2);  // x, the pass (not a tensor)
    if (!grads[0].defined()) return out;
    if (at::GradMode::is_enabled()) {  // a graph of the backward: the four ops' own
      const at::Tensor y = (at::softplus(x + shift) + min_val).clamp_min(lower);
      out[0] = torch::autograd::grad({y}, {x}, {grads[0]}, /*retain_graph=*/true, /*create_graph=*/true)[0];
      return out;
    }
    const scale_pass pass = *scale_pass_for(x, shift, min_val, lower);
    const at::Tensor g = grads[0].contiguous();
    out[0] = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "tensordict::nn::scale_mapping", [&] {
      pass.backward(x.data_ptr<scalar_t>(), unclamped.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(), out[0].data_ptr<scalar_t>());
    });
    return out;
  }
  static std::pair<at::Tensor, at::Tensor> run(const at::Tensor& x, const scale_pass& pass) {
    const auto options = x.options().memory_format(at::MemoryFormat::Contiguous);
    at::Tensor y = at::empty(x.sizes(), options), unclamped = at::empty(x.sizes(), options);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "tensordict::nn::scale_mapping", [&] {
      pass.forward(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), unclamped.data_ptr<scalar_t>());
    });
    return {std::move(y), std::move(unclamped)};
  }
};
}  // namespace tensordict::nn::detail

namespace tensordict::nn {
TENSORDICT_DECL at::Tensor scale_mapping::at_least(const at::Tensor& x, double lower) const {
  const bool softplus = biased_ || name_ == "softplus";
  const auto pass = softplus ? detail::scale_pass_for(x, biased_ ? shift_ : 0.0, biased_ ? min_val_ : 0.0, lower) : std::nullopt;
  if (!pass) return (*this)(x).clamp_min(lower);
  if (at::GradMode::is_enabled() && x.requires_grad()) return detail::scale_function::apply(x, *pass);
  return detail::scale_function::run(x, *pass).first;
}
}  // namespace tensordict::nn
#endif  // TENSORDICT_DEFINITIONS
