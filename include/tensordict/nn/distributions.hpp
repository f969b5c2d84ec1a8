// Probability distributions over tensors, as Python's torch.distributions and
// tensordict.nn.distributions (libtorch has none): what a probabilistic
// module builds from its in keys.
//
//   tdn::Normal dist(loc, scale);                          // batch_shape loc's and scale's broadcast
//   auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
//   at::Tensor a = dist.rsample({}, gen);                  // gradients flow to loc and scale
//   at::Tensor lp = dist.log_prob(a);                      // batch_shape
//   tdn::Independent joint(dist, 1);                       // last batch dim becomes an event dim
//
// Values, shapes and sampling streams are Python's: a generator seeded as
// torch.manual_seed(s) draws the same samples as Python's dist.sample() after
// it. Python validates no argument values by default under tensordict
// (Distribution.set_default_validate_args(False)); neither does this, but shapes
// and dtypes are checked, and a call a distribution does not define throws
// tensordict::value_error naming the distribution, the call and the way out.
//
// Where tensordict 0.4 refuses a call that has a plain answer, this answers it
// (README, "Distributions"): Normal's median (loc), TruncatedNormal's mode
// (loc clamped into [a, b]) and median, Delta's median (param), TanhNormal's
// median (the transformed loc). OneHotCategorical's event_shape is [n] and its
// mean the probabilities, as torch.distributions.OneHotCategorical's.
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "../detail/config.hpp"
#include "../errors.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/binary_cross_entropy_with_logits.h>
#include <ATen/ops/broadcast_tensors.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/nan_to_num.h>
#include <ATen/ops/normal.h>
#include <ATen/ops/one_hot.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/softplus.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/full_like.h>
#include <c10/core/GradMode.h>

#include "../detail/format.hpp"

namespace tensordict::nn {

namespace detail {
inline c10::optional<at::Generator> generator_arg(const std::optional<at::Generator>& g) {
  if (g) return *g;
  return c10::nullopt;
}

// N(0, 1) draws of `shape`: Normal::rsample's noise, which TanhNormal's fused pass draws the same way.
inline at::Tensor standard_normal(at::IntArrayRef shape, const at::TensorOptions& options, const std::optional<at::Generator>& generator) {
  auto eps = at::empty(shape, options.requires_grad(false));
  eps.normal_(0, 1, generator_arg(generator));
  return eps;
}

// Sums the last n dims (torch.distributions.utils._sum_rightmost).
TENSORDICT_DECL at::Tensor sum_rightmost(const at::Tensor& t, int64_t n);

inline std::vector<int64_t> to_vector(at::IntArrayRef sizes) { return {sizes.begin(), sizes.end()}; }

// The parameters, checked floating-point and broadcast together; dtype_error or
// shape_error naming them otherwise.
TENSORDICT_DECL std::vector<at::Tensor> broadcast_params(const char* dist, const std::vector<std::pair<const char*, at::Tensor>>& params);

// torch.finfo(dtype).min, the most negative finite number of a floating dtype
// (float16: -65504; float32's lowest would be -inf there).
inline double finfo_min(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: return std::numeric_limits<double>::lowest();
    case at::kHalf: return -65504.0;
    case at::kBFloat16: return -3.3895313892515355e38;
    default: return static_cast<double>(std::numeric_limits<float>::lowest());
  }
}

// torch.finfo(dtype).resolution: 10^-(decimal digits the dtype holds).
inline double finfo_resolution(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: return 1e-15;
    case at::kHalf: return 1e-3;
    case at::kBFloat16: return 1e-2;
    default: return 1e-6;
  }
}

// The smallest probability a log may be taken of (torch.distributions.utils.clamp_probs).
TENSORDICT_DECL at::Tensor clamp_probs(const at::Tensor& probs);
}  // namespace detail

// The interface of every distribution here (Python's Distribution). A
// distribution is immutable; its tensors keep their autograd history, so
// log_prob and rsample differentiate to the parameters it was built from.
class Distribution {
 public:
  virtual ~Distribution() = default;

  // "Normal", as Python's class name. The library's distributions define it out of line: their
  // key function, so that their vtables and virtual members compile once, in libtensordict.
  virtual std::string name() const = 0;
  const std::vector<int64_t>& batch_shape() const { return batch_shape_; }
  const std::vector<int64_t>& event_shape() const { return event_shape_; }
  // Whether rsample is defined (Python's has_rsample).
  virtual bool has_rsample() const { return false; }

  // sample_shape + batch_shape + event_shape values, without gradients.
  virtual at::Tensor sample(at::IntArrayRef sample_shape = {},
                            std::optional<at::Generator> generator = std::nullopt) const {
    c10::NoGradGuard no_grad;
    return rsample(sample_shape, std::move(generator));
  }
  // A reparameterized sample: gradients flow to the parameters.
  virtual at::Tensor rsample(at::IntArrayRef /*sample_shape*/ = {},
                             std::optional<at::Generator> /*generator*/ = std::nullopt) const {
    refuse("rsample", "it has no reparameterized sample; sample() draws without gradients");
  }
  // Log-density (or log-mass) of value, of shape value's leading dims + batch_shape.
  virtual at::Tensor log_prob(const at::Tensor& value) const = 0;
  // rsample() and the log_prob of that sample, what a probabilistic module with a log_prob_key
  // computes when it draws; a distribution may fuse the two (TanhNormal: one pass, one autograd node).
  TENSORDICT_DECL virtual std::pair<at::Tensor, at::Tensor> rsample_and_log_prob(std::optional<at::Generator> generator = std::nullopt) const;
  virtual at::Tensor entropy() const { refuse("entropy", "it is not defined in closed form"); }
  virtual at::Tensor mean() const { refuse("mean", "it is not defined in closed form"); }
  virtual at::Tensor mode() const { refuse("mode", "it is not defined in closed form"); }
  virtual at::Tensor median() const { refuse("median", "it is not defined in closed form"); }
  virtual at::Tensor variance() const { refuse("variance", "it is not defined in closed form"); }
  at::Tensor stddev() const { return variance().sqrt(); }
  // Whether mean() is a value the distribution takes, which the MEAN
  // interaction type may write as an action (a Categorical's NaN is not).
  virtual bool mean_is_a_value() const { return true; }
  // A sample without randomness, for the DETERMINISTIC interaction type:
  // the mean, or the mode where the mean is no value of the distribution.
  virtual at::Tensor deterministic_sample() const { return mean(); }

  // "Normal(batch_shape=[5,4], event_shape=[])".
  TENSORDICT_DECL std::string repr() const;

 protected:
  Distribution(std::vector<int64_t> batch_shape, std::vector<int64_t> event_shape)
      : batch_shape_(std::move(batch_shape)), event_shape_(std::move(event_shape)) {}

  // sample_shape + batch_shape + event_shape (Python's _extended_shape).
  TENSORDICT_DECL std::vector<int64_t> extended_shape(at::IntArrayRef sample_shape) const;

  [[noreturn]] TENSORDICT_DECL void refuse(const char* call, const std::string& why) const;

  // value's trailing dims must broadcast with batch_shape + event_shape.
  TENSORDICT_DECL void check_value(const at::Tensor& value, const char* call) const;

 private:
  std::vector<int64_t> batch_shape_;
  std::vector<int64_t> event_shape_;
};

// Normal(loc, scale): torch.distributions.Normal.
class Normal : public Distribution {
 public:
  Normal(const at::Tensor& loc, const at::Tensor& scale)
      : Normal(detail::broadcast_params("Normal", {{"loc", loc}, {"scale", scale}})) {}

  TENSORDICT_DECL std::string name() const override;
  bool has_rsample() const override { return true; }
  const at::Tensor& loc() const { return loc_; }
  const at::Tensor& scale() const { return scale_; }

  at::Tensor sample(at::IntArrayRef sample_shape = {},
                    std::optional<at::Generator> generator = std::nullopt) const override {
    c10::NoGradGuard no_grad;
    const auto shape = extended_shape(sample_shape);
    return at::normal(loc_.expand(shape), scale_.expand(shape), detail::generator_arg(generator));
  }
  at::Tensor rsample(at::IntArrayRef sample_shape = {},
                     std::optional<at::Generator> generator = std::nullopt) const override {
    return loc_ + detail::standard_normal(extended_shape(sample_shape), loc_.options(), generator) * scale_;
  }
  at::Tensor log_prob(const at::Tensor& value) const override {
    check_value(value, "log_prob");
    return -((value - loc_).pow(2)) / (2 * scale_.pow(2)) - scale_.log() - std::log(std::sqrt(2 * M_PI));
  }
  at::Tensor entropy() const override { return 0.5 + 0.5 * std::log(2 * M_PI) + scale_.log(); }
  at::Tensor cdf(const at::Tensor& value) const {
    check_value(value, "cdf");
    return 0.5 * (1 + ((value - loc_) * scale_.reciprocal() / std::sqrt(2.0)).erf());
  }
  at::Tensor icdf(const at::Tensor& p) const { return loc_ + scale_ * (2 * p - 1).erfinv() * std::sqrt(2.0); }
  at::Tensor mean() const override { return loc_; }
  at::Tensor mode() const override { return loc_; }
  at::Tensor median() const override { return loc_; }
  at::Tensor variance() const override { return scale_.pow(2); }

 private:
  explicit Normal(std::vector<at::Tensor> p)
      : Distribution(detail::to_vector(p[0].sizes()), {}), loc_(std::move(p[0])), scale_(std::move(p[1])) {}
  at::Tensor loc_, scale_;
};

// Independent(base, n): the last n batch dims of base become event dims, so
// log_prob and entropy sum over them (torch.distributions.Independent).
class Independent : public Distribution {
 public:
  template <class Base>
    requires std::is_base_of_v<Distribution, Base>
  Independent(Base base, int64_t reinterpreted_batch_ndims)
      : Independent(std::make_shared<const Base>(std::move(base)), reinterpreted_batch_ndims) {}
  Independent(std::shared_ptr<const Distribution> base, int64_t reinterpreted_batch_ndims)
      : Distribution(batch_part(*base, reinterpreted_batch_ndims), event_part(*base, reinterpreted_batch_ndims)),
        base_(std::move(base)),
        n_(reinterpreted_batch_ndims) {}

  TENSORDICT_DECL std::string name() const override;
  const Distribution& base_dist() const { return *base_; }
  int64_t reinterpreted_batch_ndims() const { return n_; }
  bool has_rsample() const override { return base_->has_rsample(); }

  at::Tensor sample(at::IntArrayRef sample_shape = {},
                    std::optional<at::Generator> generator = std::nullopt) const override {
    return base_->sample(sample_shape, std::move(generator));
  }
  at::Tensor rsample(at::IntArrayRef sample_shape = {},
                     std::optional<at::Generator> generator = std::nullopt) const override {
    return base_->rsample(sample_shape, std::move(generator));
  }
  at::Tensor log_prob(const at::Tensor& value) const override {
    return detail::sum_rightmost(base_->log_prob(value), n_);
  }
  at::Tensor entropy() const override { return detail::sum_rightmost(base_->entropy(), n_); }
  at::Tensor mean() const override { return base_->mean(); }
  at::Tensor mode() const override { return base_->mode(); }
  at::Tensor median() const override { return base_->median(); }
  at::Tensor variance() const override { return base_->variance(); }
  at::Tensor deterministic_sample() const override { return base_->deterministic_sample(); }

 private:
  static void check(const Distribution& base, int64_t n) {
    if (n < 0 || n > static_cast<int64_t>(base.batch_shape().size()))
      throw shape_error("tensordict::nn::Independent: reinterpreted_batch_ndims=" + std::to_string(n) +
                        " must be between 0 and the base's batch dims (" + base.repr() + ")");
  }
  static std::vector<int64_t> batch_part(const Distribution& base, int64_t n) {
    check(base, n);
    const auto& b = base.batch_shape();
    return {b.begin(), b.end() - n};
  }
  // (Each part checks n: the order in which the base class's arguments are computed is unspecified.)
  static std::vector<int64_t> event_part(const Distribution& base, int64_t n) {
    check(base, n);
    const auto& b = base.batch_shape();
    std::vector<int64_t> out(b.end() - n, b.end());
    out.insert(out.end(), base.event_shape().begin(), base.event_shape().end());
    return out;
  }
  std::shared_ptr<const Distribution> base_;
  int64_t n_;
};

// Categorical over the last dim of logits (torch.distributions.Categorical):
// values are class indices (int64), batch_shape logits' other dims.
class Categorical : public Distribution {
 public:
  // Logits, normalized (logits - logsumexp).
  explicit Categorical(const at::Tensor& logits) : Categorical(normalized(logits, "logits"), true) {}
  static Categorical from_probs(const at::Tensor& probs) { return Categorical(normalized(probs, "probs"), false); }

  TENSORDICT_DECL std::string name() const override;
  const at::Tensor& logits() const { return logits_; }
  const at::Tensor& probs() const { return probs_; }
  int64_t num_events() const { return logits_.size(-1); }

  at::Tensor sample(at::IntArrayRef sample_shape = {},
                    std::optional<at::Generator> generator = std::nullopt) const override {
    return draw_indices(sample_shape, std::move(generator));
  }
  at::Tensor log_prob(const at::Tensor& value) const override {
    check_value(value, "log_prob");
    return index_log_prob(value);
  }
  at::Tensor entropy() const override {
    return -(logits_.clamp_min(detail::finfo_min(logits_.scalar_type())) * probs_).sum(-1);
  }
  // NaN, as torch's (an index has no mean); deterministic_sample is the mode.
  at::Tensor mean() const override { return at::full(extended_shape({}), NAN, probs_.options()); }
  bool mean_is_a_value() const override { return false; }
  at::Tensor variance() const override { return at::full(extended_shape({}), NAN, probs_.options()); }
  at::Tensor mode() const override { return probs_.argmax(-1); }
  at::Tensor median() const override { refuse("median", "class indices are not ordered; use mode()"); }
  at::Tensor deterministic_sample() const override { return mode(); }

 protected:
  // (Python's parameter names, for the messages.)
  static std::pair<at::Tensor, at::Tensor> normalized(const at::Tensor& param, const char* which) {
    const std::string kind = which;
    if (!param.defined() || !at::isFloatingType(param.scalar_type()) || param.dim() < 1)
      throw dtype_error("tensordict::nn::Categorical: " + kind + " is " + describe(param) +
                        ", expected a floating-point tensor with at least one dim (the classes)");
    if (kind == "logits") {
      auto logits = param - param.logsumexp(-1, true);
      return {logits, logits.softmax(-1)};
    }
    auto probs = param / param.sum(-1, true);
    return {detail::clamp_probs(probs).log(), probs};
  }
  Categorical(std::pair<at::Tensor, at::Tensor> logits_probs, bool /*from_logits*/)
      : Distribution(batch_of(logits_probs.first), {}),
        logits_(std::move(logits_probs.first)),
        probs_(std::move(logits_probs.second)) {}
  // Class indices of shape sample_shape + batch_shape, drawn as torch's Categorical.sample draws them.
  at::Tensor draw_indices(at::IntArrayRef sample_shape, std::optional<at::Generator> generator) const {
    c10::NoGradGuard no_grad;
    int64_t draws = 1;
    for (auto s : sample_shape) draws *= s;
    const auto samples_2d = probs_.reshape({-1, num_events()}).multinomial(draws, true, detail::generator_arg(generator)).t();
    std::vector<int64_t> shape(sample_shape.begin(), sample_shape.end());
    shape.insert(shape.end(), batch_shape().begin(), batch_shape().end());
    return samples_2d.reshape(shape);
  }
  at::Tensor index_log_prob(const at::Tensor& index) const {
    auto bv = at::broadcast_tensors({index.to(at::kLong).unsqueeze(-1), logits_});
    return bv[1].gather(-1, bv[0].narrow(-1, 0, 1)).squeeze(-1);
  }
  Categorical(const Categorical& c, std::vector<int64_t> event_shape)
      : Distribution(c.batch_shape(), std::move(event_shape)), logits_(c.logits_), probs_(c.probs_) {}
  static std::vector<int64_t> batch_of(const at::Tensor& logits) {
    return {logits.sizes().begin(), logits.sizes().end() - 1};
  }

  at::Tensor logits_, probs_;
};

// How OneHotCategorical.rsample passes gradients (Python's
// ReparamGradientStrategy). pass_through (Python's default): the one-hot
// sample that sample() draws, plus probs - probs.detach() (the gradient of the
// probabilities). relaxed_one_hot: one-hot values of a relaxed (Gumbel-softmax,
// temperature 1) sample, with its gradients.
enum class reparam_gradient_strategy { pass_through, relaxed_one_hot };

// OneHotCategorical (tensordict.nn.distributions.OneHotCategorical): a
// Categorical whose values are one-hot int64 vectors; event_shape [n].
// rsample's values are floating (the probabilities' dtype), as Python's.
class OneHotCategorical : public Categorical {
 public:
  explicit OneHotCategorical(const at::Tensor& logits,
                             reparam_gradient_strategy grad_method = reparam_gradient_strategy::pass_through)
      : OneHotCategorical(Categorical(logits), grad_method) {}
  static OneHotCategorical from_probs(const at::Tensor& probs,
                                      reparam_gradient_strategy grad_method = reparam_gradient_strategy::pass_through) {
    return OneHotCategorical(Categorical::from_probs(probs), grad_method);
  }
  reparam_gradient_strategy grad_method() const { return grad_method_; }

  TENSORDICT_DECL std::string name() const override;
  bool has_rsample() const override { return true; }

  at::Tensor sample(at::IntArrayRef sample_shape = {},
                    std::optional<at::Generator> generator = std::nullopt) const override {
    return at::one_hot(draw_indices(sample_shape, std::move(generator)), num_events()).to(at::kLong);
  }
  at::Tensor rsample(at::IntArrayRef sample_shape = {},
                     std::optional<at::Generator> generator = std::nullopt) const override {
    if (grad_method_ == reparam_gradient_strategy::pass_through)
      return sample(sample_shape, std::move(generator)).to(probs_.scalar_type()) + probs_ - probs_.detach();
    auto uniforms = at::empty(extended_shape(sample_shape), logits_.options().requires_grad(false));
    uniforms.uniform_(0, 1, detail::generator_arg(generator));
    const auto gumbels = -(-(detail::clamp_probs(uniforms).log())).log();
    const auto scores = logits_ + gumbels;
    const auto relaxed = (scores - scores.logsumexp(-1, true)).exp();
    const auto hard = (relaxed == std::get<0>(relaxed.max(-1, true))).to(relaxed.scalar_type());
    return relaxed + (hard - relaxed).detach();
  }
  at::Tensor log_prob(const at::Tensor& value) const override {
    check_value(value, "log_prob");
    return index_log_prob(value.argmax(-1));
  }
  // The probabilities, as torch's OneHotCategorical.mean.
  at::Tensor mean() const override { return probs_; }
  at::Tensor variance() const override { return probs_ * (1 - probs_); }
  // 1 at every class of the largest logit (several on a tie), as tensordict's.
  at::Tensor mode() const override {
    return (logits_ == std::get<0>(logits_.max(-1, true))).to(at::kLong);
  }
  at::Tensor median() const override { refuse("median", "classes are not ordered; use mode()"); }
  at::Tensor deterministic_sample() const override { return mode(); }

 private:
  OneHotCategorical(const Categorical& c, reparam_gradient_strategy grad_method)
      : Categorical(c, {c.num_events()}), grad_method_(grad_method) {}
  reparam_gradient_strategy grad_method_;
};

// Bernoulli(probs) (torch.distributions.Bernoulli): values 0 or 1 in the
// parameter's dtype; no rsample.
class Bernoulli : public Distribution {
 public:
  explicit Bernoulli(const at::Tensor& probs) : Bernoulli(checked(probs, "probs"), false) {}
  static Bernoulli from_logits(const at::Tensor& logits) { return Bernoulli(checked(logits, "logits"), true); }

  TENSORDICT_DECL std::string name() const override;
  const at::Tensor& probs() const { return probs_; }
  const at::Tensor& logits() const { return logits_; }

  at::Tensor sample(at::IntArrayRef sample_shape = {},
                    std::optional<at::Generator> generator = std::nullopt) const override {
    c10::NoGradGuard no_grad;
    return probs_.expand(extended_shape(sample_shape)).bernoulli(detail::generator_arg(generator));
  }
  at::Tensor log_prob(const at::Tensor& value) const override {
    check_value(value, "log_prob");
    auto b = at::broadcast_tensors({logits_, value.to(logits_.scalar_type())});
    return -at::binary_cross_entropy_with_logits(b[0], b[1], {}, {}, at::Reduction::None);
  }
  at::Tensor entropy() const override {
    return at::binary_cross_entropy_with_logits(logits_, probs_, {}, {}, at::Reduction::None);
  }
  at::Tensor mean() const override { return probs_; }
  at::Tensor variance() const override { return probs_ * (1 - probs_); }
  // 1 where probs > 0.5, 0 below, NaN at 0.5 (torch's).
  at::Tensor mode() const override {
    auto m = (probs_ >= 0.5).to(probs_.scalar_type());
    return at::where(probs_ == 0.5, at::scalar_tensor(NAN, probs_.options()), m);
  }
  at::Tensor median() const override { refuse("median", "use mode()"); }
  at::Tensor deterministic_sample() const override { return mode(); }

 private:
  static at::Tensor checked(const at::Tensor& t, const char* which) {
    return detail::broadcast_params("Bernoulli", {{which, t}})[0];
  }
  Bernoulli(const at::Tensor& param, bool is_logits)
      : Distribution(detail::to_vector(param.sizes()), {}),
        probs_(is_logits ? param.sigmoid() : param),
        logits_(is_logits ? param : [&] {
          const auto p = detail::clamp_probs(param);
          return p.log() - (-p).log1p();
        }()) {}
  at::Tensor probs_, logits_;
};

struct DeltaOptions {
  double atol = 1e-6;
  double rtol = 1e-6;
  // How many of param's last dims are the event (tensordict's default: 1,
  // none for a 0-dim param).
  int64_t event_dims = 1;
};

// Delta(param) (tensordict.nn.distributions.Delta): all mass at param.
// log_prob is +inf where a value equals param within atol + rtol * |param|
// over the event dims, -inf elsewhere.
class Delta : public Distribution {
 public:
  explicit Delta(const at::Tensor& param, DeltaOptions options = {})
      : Distribution(split(param, options.event_dims, true), split(param, options.event_dims, false)),
        param_(param),
        options_(options) {}

  TENSORDICT_DECL std::string name() const override;
  bool has_rsample() const override { return true; }
  const at::Tensor& param() const { return param_; }

  at::Tensor sample(at::IntArrayRef sample_shape = {}, std::optional<at::Generator> = std::nullopt) const override {
    c10::NoGradGuard no_grad;
    return param_.expand(extended_shape(sample_shape));
  }
  at::Tensor rsample(at::IntArrayRef sample_shape = {}, std::optional<at::Generator> = std::nullopt) const override {
    return param_.expand(extended_shape(sample_shape));
  }
  at::Tensor log_prob(const at::Tensor& value) const override {
    check_value(value, "log_prob");
    const auto param = param_.expand_as(value);
    auto is_equal = (value - param).abs() < options_.atol + options_.rtol * param.abs();
    for (std::size_t i = 0; i < event_shape().size(); ++i) is_equal = is_equal.all(-1);
    const auto inf = std::numeric_limits<double>::infinity();
    return at::where(is_equal, at::scalar_tensor(inf, value.options()), at::scalar_tensor(-inf, value.options()));
  }
  at::Tensor entropy() const override {
    refuse("entropy", "a point mass has no density (its differential entropy is -inf)");
  }
  at::Tensor mean() const override { return param_; }
  at::Tensor mode() const override { return param_; }
  at::Tensor median() const override { return param_; }
  at::Tensor variance() const override { return at::zeros_like(param_); }

 private:
  static std::vector<int64_t> split(const at::Tensor& param, int64_t event_dims, bool batch) {
    if (!param.defined() || event_dims < 0)
      throw shape_error("tensordict::nn::Delta: event_dims=" + std::to_string(event_dims) + " for the parameter " +
                        describe(param));
    event_dims = std::min<int64_t>(event_dims, param.dim());
    const auto s = param.sizes();
    return batch ? std::vector<int64_t>(s.begin(), s.end() - event_dims) : std::vector<int64_t>(s.end() - event_dims, s.end());
  }
  at::Tensor param_;
  DeltaOptions options_;
};

struct TruncatedNormalOptions {
  // The bounds of the support (tensordict 0.4 names them a and b).
  double a = -1.0;
  double b = 1.0;
};

// TruncatedNormal(loc, scale, {a, b}) (tensordict.nn.distributions.
// TruncatedNormal): a Normal restricted to [a, b]. Its log_prob does not
// check the support (values outside get the formula's value, as Python's).
class TruncatedNormal : public Distribution {
 public:
  TruncatedNormal(const at::Tensor& loc, const at::Tensor& scale, TruncatedNormalOptions options = {})
      : TruncatedNormal(detail::broadcast_params("TruncatedNormal", {{"loc", loc}, {"scale", scale}}), options) {}

  TENSORDICT_DECL std::string name() const override;
  bool has_rsample() const override { return true; }
  const at::Tensor& loc() const { return loc_; }
  // scale, at least 1e-6 (computed per call, as everything below: each
  // call's graph is its own, so one backward does not free what another needs).
  at::Tensor scale() const { return raw_scale_.clamp_min(eps); }
  // The probability mass of [a, b] under Normal(loc, scale).
  at::Tensor auc() const { return standardized().z; }

  at::Tensor rsample(at::IntArrayRef sample_shape = {},
                     std::optional<at::Generator> generator = std::nullopt) const override {
    // float32 uniforms whatever the dtype, as tensordict's (torch.empty's default dtype): a seed draws Python's samples.
    auto p = at::empty(extended_shape(sample_shape), loc_.options().dtype(at::kFloat).requires_grad(false));
    p.uniform_(eps, 1 - eps, detail::generator_arg(generator));
    return icdf(p.to(loc_.scalar_type()));
  }
  at::Tensor log_prob(const at::Tensor& value) const override {
    check_value(value, "log_prob");
    const auto z = (value - loc_) / scale();
    return (log_inv_sqrt_2pi - standardized().z.log() - z.pow(2) * 0.5) - scale().log();
  }
  at::Tensor cdf(const at::Tensor& value) const {
    check_value(value, "cdf");
    const auto s = standardized();
    return ((big_phi((value - loc_) / scale()) - s.big_phi_a) / s.z).clamp(0, 1);
  }
  // The value below which a fraction p of the mass lies, clipped into [a, b]
  // without changing its gradient.
  at::Tensor icdf(const at::Tensor& p) const {
    const auto s = standardized();
    const auto y = (s.big_phi_a + p * s.z).clamp(eps, 1 - eps);
    const auto sample = (2 * y - 1).erfinv() * std::sqrt(2.0) * scale() + loc_;
    const auto clipped = sample.detach().clamp(options_.a, options_.b);
    return sample + (clipped - sample.detach());
  }
  at::Tensor entropy() const override {
    const auto s = standardized();
    return log_sqrt_2pi_e + s.z.log() - 0.5 * s.lpbb_m_lpaa_d_z + scale().log();
  }
  at::Tensor mean() const override { return -standardized().d * scale() + loc_; }
  at::Tensor variance() const override {
    const auto s = standardized();
    return (1 - s.lpbb_m_lpaa_d_z - s.d.pow(2)) * scale().pow(2);
  }
  // loc clamped into [a, b] (tensordict 0.4 refuses).
  at::Tensor mode() const override { return loc_.clamp(options_.a, options_.b); }
  at::Tensor median() const override { return icdf(at::full_like(loc_, 0.5)); }

 private:
  static constexpr double eps = 1e-6;
  static constexpr double log_inv_sqrt_2pi = -0.91893853320467274178;  // log(1 / sqrt(2 pi))
  static constexpr double log_sqrt_2pi_e = 1.41893853320467274178;     // log(sqrt(2 pi e))

  static at::Tensor little_phi(const at::Tensor& x) { return (-(x.pow(2)) * 0.5).exp() * 0.39894228040143267794; }
  static at::Tensor big_phi(const at::Tensor& x) {
    return (0.5 * (1 + (x * 0.70710678118654752440).erf())).clamp(eps, 1 - eps);
  }

  TruncatedNormal(std::vector<at::Tensor> p, TruncatedNormalOptions options)
      : Distribution(detail::to_vector(p[0].sizes()), {}),
        loc_(std::move(p[0])),
        raw_scale_(std::move(p[1])),
        options_(options) {
    if (!(options.a < options.b))
      throw value_error("tensordict::nn::TruncatedNormal: the bounds a=" + std::to_string(options.a) +
                        " and b=" + std::to_string(options.b) + " need a < b");
  }

  // The standard normal's quantities at the standardized bounds.
  struct standard_parts {
    at::Tensor big_phi_a, z, lpbb_m_lpaa_d_z, d;
  };
  standard_parts standardized() const {
    const auto a = at::nan_to_num((options_.a - loc_) / scale(), NAN);
    const auto b = at::nan_to_num((options_.b - loc_) / scale(), NAN);
    const auto phi_a = little_phi(a), phi_b = little_phi(b);
    standard_parts s;
    s.big_phi_a = big_phi(a);
    s.z = (big_phi(b) - s.big_phi_a).clamp(eps, 1 - eps);
    s.lpbb_m_lpaa_d_z = (phi_b * b - phi_a * a) / s.z;
    s.d = (phi_b - phi_a) / s.z;
    return s;
  }

  at::Tensor loc_, raw_scale_;
  TruncatedNormalOptions options_;
};

struct TanhNormalOptions {
  // The bounds of the support: values are low + (high - low) * (tanh(x) + 1) / 2.
  double low = -1.0;
  double high = 1.0;
  // With tanh_loc, loc is first mapped to upscale * tanh(loc / upscale).
  double upscale = 5.0;
  bool tanh_loc = false;
  // How many of loc's last dims are the event (log_prob sums over them).
  int64_t event_dims = 1;
  // tanh's output kept within 1 - eps of +-1 (eps: the dtype's resolution,
  // torch.finfo(dtype).resolution: 1e-6 for float32, 1e-2 for bfloat16) so
  // that its inverse stays finite, as TorchRL's SafeTanhTransform.
  bool safe_tanh = true;
};

namespace detail {
struct tanh_normal_function;
}

// TanhNormal(loc, scale, options) (TorchRL's): tanh of an Independent Normal,
// scaled into [low, high]. mean and entropy have no closed form; mode and
// deterministic_sample are the transformed loc, as TorchRL's, and so is the
// median (exact: the transform is monotone).

class TanhNormal : public Distribution {
 public:
  TanhNormal(const at::Tensor& loc, const at::Tensor& scale, TanhNormalOptions options = {})
      : TanhNormal(detail::broadcast_params("TanhNormal", {{"loc", loc}, {"scale", scale}}), options) {}

  TENSORDICT_DECL std::string name() const override;
  bool has_rsample() const override { return true; }
  // Independent(Normal(loc, scale), event_dims), loc mapped by tanh_loc;
  // built per call, so each call's graph is its own.
  TENSORDICT_DECL Independent base_dist() const;
  const at::Tensor& loc() const { return loc_; }
  const at::Tensor& scale() const { return scale_; }

  at::Tensor sample(at::IntArrayRef sample_shape = {},
                    std::optional<at::Generator> generator = std::nullopt) const override {
    c10::NoGradGuard no_grad;
    return transform(base_dist().sample(sample_shape, std::move(generator)));
  }
  at::Tensor rsample(at::IntArrayRef sample_shape = {},
                     std::optional<at::Generator> generator = std::nullopt) const override {
    return transform(base_dist().rsample(sample_shape, std::move(generator)));
  }
  TENSORDICT_DECL at::Tensor log_prob(const at::Tensor& value) const override;
  // rsample() and log_prob() of it, as those two calls compute them (the same draws from the
  // generator, the same values within rounding, the same gradients), in one pass and one autograd
  // node where loc and scale are float32 or float64 CPU tensors: the two calls dispatch ~40 ATen
  // ops and ~25 autograd nodes (~80 us of a SAC actor's call at batch 256).
  TENSORDICT_DECL std::pair<at::Tensor, at::Tensor> rsample_and_log_prob(
      std::optional<at::Generator> generator = std::nullopt) const override;
  // TorchRL's refuses too; the MEAN interaction type estimates it (draw).
  at::Tensor mean() const override {
    refuse("mean", "it has no closed form; estimate it with sample({N}).mean(0) for a large N");
  }
  at::Tensor entropy() const override {
    refuse("entropy", "it has no closed form; estimate it with -log_prob(sample({N})).mean(0) for a large N");
  }
  at::Tensor mode() const override { return transform(mapped_loc()); }
  at::Tensor median() const override { return transform(mapped_loc()); }
  at::Tensor deterministic_sample() const override { return transform(mapped_loc()); }

 private:
  TanhNormal(std::vector<at::Tensor> p, TanhNormalOptions options)
      : Distribution(batch_part(p[0], options), event_part(p[0], options)),
        loc_(std::move(p[0])),
        scale_(std::move(p[1])),
        options_(options) {}

  TENSORDICT_DECL static void check(const at::Tensor& loc, const TanhNormalOptions& o);
  static std::vector<int64_t> batch_part(const at::Tensor& loc, const TanhNormalOptions& o) {
    check(loc, o);
    const auto s = loc.sizes();
    return {s.begin(), s.end() - std::min<int64_t>(o.event_dims, loc.dim())};
  }
  static std::vector<int64_t> event_part(const at::Tensor& loc, const TanhNormalOptions& o) {
    check(loc, o);  // (as batch_part: either may be computed first)
    const auto s = loc.sizes();
    return {s.end() - std::min<int64_t>(o.event_dims, loc.dim()), s.end()};
  }
  at::Tensor mapped_loc() const {
    return options_.tanh_loc ? (loc_ / options_.upscale).tanh() * options_.upscale : loc_;
  }
  bool affine() const { return options_.low != -1.0 || options_.high != 1.0; }
  double affine_loc() const { return (options_.high + options_.low) / 2; }
  double affine_scale() const { return (options_.high - options_.low) / 2; }
  double resolution() const { return detail::finfo_resolution(loc_.scalar_type()); }

  TENSORDICT_DECL at::Tensor transform(const at::Tensor& x) const;

  // The two calls on a given draw eps (loc's shape): what the fused pass computes.
  std::pair<at::Tensor, at::Tensor> composed(const at::Tensor& eps) const {
    at::Tensor value = transform(mapped_loc() + eps * scale_);
    at::Tensor log_probability = log_prob(value);
    return {std::move(value), std::move(log_probability)};
  }
  friend struct detail::tanh_normal_function;

  at::Tensor loc_, scale_;
  TanhNormalOptions options_;
};
}  // namespace tensordict::nn

#if TENSORDICT_DEFINITIONS
#include <tuple>

#include <ATen/Dispatch.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "../detail/kernels/scalar_math.hpp"

namespace tensordict::nn::detail {
// Per element of loc + eps * scale, the operations of TanhNormal's transform and log_prob in
// their order, in T as ATen's kernels round them (the scalars cast to T).
template <class T>
struct tanh_normal_pass {
  T lim;  // tanh's output kept within [-lim, lim] (1 - the dtype's resolution; -lim is exact)
  T half_width, middle, log_half_width;
  bool safe, affine;
  std::int64_t rows, event;
  T log2 = static_cast<T>(std::log(2.0)), log_sqrt_2pi = static_cast<T>(std::log(std::sqrt(2 * M_PI)));

  static T clamp(T v, T lo, T hi) { return std::isnan(v) ? v : std::min(std::max(v, lo), hi); }

  // action, log_prob; work holds tanh(x), y (the value mapped back, before its clamp) and atanh of it.
  void forward(const T* loc, const T* scale, const T* eps, T* action, T* log_prob, T* work) const {
    const std::int64_t n = rows * event;
    T *t_of = work, *y_of = work + n, *xi_of = work + 2 * n;
    for (std::int64_t r = 0; r < rows; ++r) {
      T log_det = 0, base = 0;
      for (std::int64_t k = r * event; k < (r + 1) * event; ++k) {
        const T x = loc[k] + eps[k] * scale[k];
        const T t = std::tanh(x);
        const T v = safe ? t + (clamp(t, -lim, lim) - t) : t;
        const T a = affine ? v * half_width + middle : v;
        action[k] = a;
        const T y = affine ? (a - middle) / half_width : a;
        const T yc = safe ? clamp(y, -lim, lim) : y;
        const T xi = ::tensordict::detail::atanh(yc);
        log_det += T(2) * ((log2 - xi) - ::tensordict::detail::softplus(T(-2) * xi));
        const T d = xi - loc[k];
        base += (-(d * d) / (T(2) * (scale[k] * scale[k])) - std::log(scale[k])) - log_sqrt_2pi;
        t_of[k] = t;
        y_of[k] = y;
        xi_of[k] = xi;
      }
      T lp = affine ? -(static_cast<T>(event) * log_half_width) - log_det : -log_det;
      log_prob[r] = lp + base;
    }
  }

  // The gradients of loc and scale (either may be null) from those of the action (null: none) and log_prob (null: none).
  void backward(const T* loc, const T* scale, const T* eps, const T* work, const T* g_action, const T* g_log_prob, T* g_loc,
                T* g_scale) const {
    const std::int64_t n = rows * event;
    const T *t_of = work, *y_of = work + n, *xi_of = work + 2 * n;
    for (std::int64_t r = 0; r < rows; ++r) {
      const T gp = g_log_prob ? g_log_prob[r] : T(0);
      for (std::int64_t k = r * event; k < (r + 1) * event; ++k) {
        const T xi = xi_of[k], y = y_of[k], s = scale[k], d = xi - loc[k];
        T g_loc_k = 0, g_scale_k = 0, g_a = g_action ? g_action[k] : T(0);
        if (g_log_prob) {
          // -log_det + base, through atanh, the clamp and the affine map to the action.
          const T z = T(-2) * xi, e = std::exp(z);
          const T sigmoid = z > T(20) ? T(1) : e / (e + T(1));
          // Normal's log_prob, -(d^2) / (2 scale^2) - log(scale) - c, as ATen's backward formulas compose
          // (an infinite scale: NaN, as theirs).
          const T den = T(2) * (s * s), g_d = -(gp / den) * (T(2) * d);
          const T g_xi = -gp * (T(2) * (T(-1) + T(2) * sigmoid)) + g_d;
          const T yc = safe ? clamp(y, -lim, lim) : y;
          const bool passes = !safe || (y >= -lim && y <= lim);
          const T g_y = passes ? g_xi / (T(1) - yc * yc) : T(0);
          g_a += affine ? g_y / half_width : g_y;
          g_loc_k -= g_d;
          g_scale_k += (-gp * ((-(d * d) / den) / den)) * T(2) * (T(2) * s) - gp / s;
        }
        // Through the affine map, the clamp (tanh's gradient passes it) and tanh to x = loc + eps * scale.
        const T t = t_of[k];
        const T g_x = (affine ? g_a * half_width : g_a) * (T(1) - t * t);
        if (g_loc) g_loc[k] = g_loc_k + g_x;
        if (g_scale) g_scale[k] = g_scale_k + g_x * eps[k];
      }
    }
  }
};

template <class T>
tanh_normal_pass<T> make_pass(const TanhNormalOptions& o, double resolution, std::int64_t rows, std::int64_t event) {
  const double half_width = (o.high - o.low) / 2;
  return {.lim = static_cast<T>(1 - resolution),
          .half_width = static_cast<T>(half_width),
          .middle = static_cast<T>((o.high + o.low) / 2),
          .log_half_width = static_cast<T>(std::log(std::abs(half_width))),
          .safe = o.safe_tanh,
          .affine = o.low != -1.0 || o.high != 1.0,
          .rows = rows,
          .event = event};
}

// The fused pass as one autograd node of (loc, scale); eps is a constant. Where a graph of the
// backward is asked for (create_graph), the backward differentiates the composed calls instead.
struct tanh_normal_function : torch::autograd::Function<tanh_normal_function> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& loc, const at::Tensor& scale,
                                                const at::Tensor& eps, const TanhNormal* dist) {
    auto [action, log_prob, work] = run(*dist, loc, scale, eps);
    ctx->save_for_backward({loc, scale, eps, work});
    ctx->saved_data["low"] = dist->options_.low;
    ctx->saved_data["high"] = dist->options_.high;
    ctx->saved_data["safe_tanh"] = dist->options_.safe_tanh;
    ctx->saved_data["event_dims"] = dist->options_.event_dims;
    ctx->set_materialize_grads(false);
    return {action, log_prob};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &loc = saved[0], &scale = saved[1], &eps = saved[2], &work = saved[3];
    TanhNormalOptions o;
    o.low = ctx->saved_data["low"].toDouble();
    o.high = ctx->saved_data["high"].toDouble();
    o.safe_tanh = ctx->saved_data["safe_tanh"].toBool();
    o.event_dims = ctx->saved_data["event_dims"].toInt();
    torch::autograd::variable_list out(4);  // loc, scale, eps (a constant), the distribution (not a tensor)
    if (!grads[0].defined() && !grads[1].defined()) return out;
    if (at::GradMode::is_enabled()) {
      const TanhNormal dist(loc, scale, o);
      const auto [action, log_prob] = dist.composed(eps);
      std::vector<at::Tensor> ys, gs, wrt;
      for (int i = 0; i < 2; ++i)
        if (grads[i].defined()) {
          ys.push_back(i == 0 ? action : log_prob);
          gs.push_back(grads[i]);
        }
      for (int i = 0; i < 2; ++i)
        if (ctx->needs_input_grad(i)) wrt.push_back(saved[i]);
      const auto d = torch::autograd::grad(ys, wrt, gs, /*retain_graph=*/true, /*create_graph=*/true, /*allow_unused=*/true);
      for (std::size_t i = 0, next = 0; i < 2; ++i)
        if (ctx->needs_input_grad(i)) out[i] = d[next++];
      return out;
    }
    const at::Tensor g_action = grads[0].defined() ? grads[0].contiguous() : at::Tensor();
    const at::Tensor g_log_prob = grads[1].defined() ? grads[1].contiguous() : at::Tensor();
    if (ctx->needs_input_grad(0)) out[0] = at::empty_like(loc, at::MemoryFormat::Contiguous);
    if (ctx->needs_input_grad(1)) out[1] = at::empty_like(scale, at::MemoryFormat::Contiguous);
    const std::int64_t event = event_numel(loc, o.event_dims), rows = event == 0 ? 0 : loc.numel() / event;
    AT_DISPATCH_FLOATING_TYPES(loc.scalar_type(), "tanh_normal_backward", [&] {
      make_pass<scalar_t>(o, finfo_resolution(loc.scalar_type()), rows, event)
          .backward(loc.data_ptr<scalar_t>(), scale.data_ptr<scalar_t>(), eps.data_ptr<scalar_t>(), work.data_ptr<scalar_t>(),
                    g_action.defined() ? g_action.data_ptr<scalar_t>() : nullptr,
                    g_log_prob.defined() ? g_log_prob.data_ptr<scalar_t>() : nullptr,
                    out[0].defined() ? out[0].data_ptr<scalar_t>() : nullptr, out[1].defined() ? out[1].data_ptr<scalar_t>() : nullptr);
    });
    return out;
  }

  static std::int64_t event_numel(const at::Tensor& loc, std::int64_t event_dims) {
    std::int64_t e = 1;
    for (std::int64_t d = std::max<std::int64_t>(0, loc.dim() - event_dims); d < loc.dim(); ++d) e *= loc.size(d);
    return e;
  }

  // action, log_prob and the backward's work buffer; loc, scale and eps contiguous, of one shape.
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> run(const TanhNormal& dist, const at::Tensor& loc, const at::Tensor& scale,
                                                           const at::Tensor& eps) {
    const TanhNormalOptions& o = dist.options_;
    const std::int64_t event = event_numel(loc, o.event_dims), rows = event == 0 ? 0 : loc.numel() / event;
    const auto batch = loc.sizes().slice(0, loc.dim() - std::min<std::int64_t>(o.event_dims, loc.dim()));
    at::Tensor action = at::empty(loc.sizes(), loc.options()), log_prob = at::empty(batch, loc.options()),
               work = at::empty({3 * loc.numel()}, loc.options());
    if (event == 0) log_prob.fill_(0);  // an empty event: log_prob sums nothing
    AT_DISPATCH_FLOATING_TYPES(loc.scalar_type(), "tanh_normal_forward", [&] {
      make_pass<scalar_t>(o, finfo_resolution(loc.scalar_type()), rows, event)
          .forward(loc.data_ptr<scalar_t>(), scale.data_ptr<scalar_t>(), eps.data_ptr<scalar_t>(), action.data_ptr<scalar_t>(),
                   log_prob.data_ptr<scalar_t>(), work.data_ptr<scalar_t>());
    });
    return {action, log_prob, work};
  }
};
}  // namespace tensordict::nn::detail

namespace tensordict::nn {
TENSORDICT_DECL std::pair<at::Tensor, at::Tensor> TanhNormal::rsample_and_log_prob(std::optional<at::Generator> generator) const {
  const at::Tensor eps = detail::standard_normal(loc_.sizes(), loc_.options(), generator);
  const auto plain = [](const at::Tensor& t) {
    // Inside vmap or a functorch transform a tensor has no storage of its own; a dual tensor's tangent this pass would not carry.
    return t.is_cpu() && t.layout() == at::kStrided && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble) &&
           t.has_storage() && !t._fw_grad(/*level=*/0).defined() && !t.is_neg() && !t.is_conj();
  };
  if (options_.tanh_loc || !plain(loc_) || !plain(scale_) || scale_.scalar_type() != loc_.scalar_type()) return composed(eps);
  const at::Tensor loc = loc_.contiguous(), scale = scale_.contiguous();
  if (at::GradMode::is_enabled() && (loc.requires_grad() || scale.requires_grad())) {
    auto outputs = detail::tanh_normal_function::apply(loc, scale, eps, this);
    return {outputs[0], outputs[1]};
  }
  auto [action, log_prob, work] = detail::tanh_normal_function::run(*this, loc, scale, eps);
  return {action, log_prob};
}
}  // namespace tensordict::nn
#endif  // TENSORDICT_DEFINITIONS

#if TENSORDICT_DEFINITIONS
namespace tensordict::nn {
TENSORDICT_DECL at::Tensor detail::sum_rightmost(const at::Tensor& t, int64_t n) {
  if (n <= 0) return t;
  std::vector<int64_t> dims;
  for (int64_t d = t.dim() - n; d < t.dim(); ++d) dims.push_back(d);
  return t.sum(dims);
}

TENSORDICT_DECL std::vector<at::Tensor> detail::broadcast_params(const char* dist, const std::vector<std::pair<const char*, at::Tensor>>& params) {
  std::vector<at::Tensor> tensors;
  std::string listed;
  for (const auto& [param_name, t] : params) {
    if (!t.defined() || !at::isFloatingType(t.scalar_type()))
      throw dtype_error(std::string("tensordict::nn::") + dist + ": the parameter " + param_name + " is " + describe(t) +
                        ", expected a floating-point tensor");
    tensors.push_back(t);
    listed += std::string(listed.empty() ? "" : ", ") + param_name + " " + describe(t);
  }
  try {
    return at::broadcast_tensors(tensors);
  } catch (const c10::Error&) {
    throw shape_error(std::string("tensordict::nn::") + dist + ": the parameters do not broadcast (" + listed + ")");
  }
}

TENSORDICT_DECL at::Tensor detail::clamp_probs(const at::Tensor& probs) {
  const double eps = probs.scalar_type() == at::kDouble ? std::numeric_limits<double>::epsilon()
                                                        : std::numeric_limits<float>::epsilon();
  return probs.clamp(eps, 1.0 - eps);
}

TENSORDICT_DECL std::pair<at::Tensor, at::Tensor> Distribution::rsample_and_log_prob(std::optional<at::Generator> generator) const {
  at::Tensor value = rsample({}, std::move(generator));
  at::Tensor log_probability = log_prob(value);
  return {std::move(value), std::move(log_probability)};
}

TENSORDICT_DECL std::string Distribution::repr() const {
  return name() + "(batch_shape=" + format_sizes(batch_shape_) + ", event_shape=" + format_sizes(event_shape_) + ")";
}

TENSORDICT_DECL std::vector<int64_t> Distribution::extended_shape(at::IntArrayRef sample_shape) const {
  std::vector<int64_t> out(sample_shape.begin(), sample_shape.end());
  out.insert(out.end(), batch_shape_.begin(), batch_shape_.end());
  out.insert(out.end(), event_shape_.begin(), event_shape_.end());
  return out;
}

[[noreturn]] TENSORDICT_DECL void Distribution::refuse(const char* call, const std::string& why) const {
  throw value_error("tensordict::nn::" + name() + "." + call + ": " + why);
}

TENSORDICT_DECL void Distribution::check_value(const at::Tensor& value, const char* call) const {
  const auto expected = extended_shape({});
  const int64_t n = std::min<int64_t>(value.dim(), static_cast<int64_t>(expected.size()));
  bool ok = value.defined();
  for (int64_t i = 1; ok && i <= n; ++i) {
    const int64_t v = value.size(-i), e = expected[expected.size() - i];
    ok = v == e || v == 1 || e == 1;
  }
  if (!ok)
    throw shape_error("tensordict::nn::" + name() + "." + call + ": the value " + describe(value) +
                      " does not broadcast with batch_shape + event_shape = " + format_sizes(expected));
}

TENSORDICT_DECL Independent TanhNormal::base_dist() const {
  return Independent(Normal(mapped_loc(), scale_), static_cast<int64_t>(event_shape().size()));
}

TENSORDICT_DECL at::Tensor TanhNormal::log_prob(const at::Tensor& value) const {
  check_value(value, "log_prob");
  const int64_t n = static_cast<int64_t>(event_shape().size());
  at::Tensor y = value, log_prob;
  if (affine()) {
    y = (value - affine_loc()) / affine_scale();
    log_prob = -detail::sum_rightmost(at::full_like(y, std::log(std::abs(affine_scale()))), n);
  }
  if (options_.safe_tanh) y = y.clamp(-1 + resolution(), 1 - resolution());
  const auto x = y.atanh();
  const auto log_det = detail::sum_rightmost(2 * (std::log(2.0) - x - at::softplus(-2 * x)), n);
  log_prob = log_prob.defined() ? log_prob - log_det : -log_det;
  return log_prob + base_dist().log_prob(x);
}

TENSORDICT_DECL void TanhNormal::check(const at::Tensor& loc, const TanhNormalOptions& o) {
  if (!(o.low < o.high))
    throw value_error("tensordict::nn::TanhNormal: the bounds low=" + std::to_string(o.low) +
                      " and high=" + std::to_string(o.high) + " need low < high");
  if (o.event_dims < 0)
    throw shape_error("tensordict::nn::TanhNormal: event_dims=" + std::to_string(o.event_dims) + " for loc " +
                      describe(loc));
}

TENSORDICT_DECL at::Tensor TanhNormal::transform(const at::Tensor& x) const {
  auto y = x.tanh();
  if (options_.safe_tanh) {
    const double lim = 1 - resolution();
    y = y + (y.detach().clamp(-lim, lim) - y.detach());  // clamped values, tanh's gradient
  }
  return affine() ? y * affine_scale() + affine_loc() : y;
}

TENSORDICT_DECL std::string Normal::name() const { return "Normal"; }
TENSORDICT_DECL std::string Independent::name() const { return "Independent"; }
TENSORDICT_DECL std::string Categorical::name() const { return "Categorical"; }
TENSORDICT_DECL std::string OneHotCategorical::name() const { return "OneHotCategorical"; }
TENSORDICT_DECL std::string Bernoulli::name() const { return "Bernoulli"; }
TENSORDICT_DECL std::string Delta::name() const { return "Delta"; }
TENSORDICT_DECL std::string TruncatedNormal::name() const { return "TruncatedNormal"; }
TENSORDICT_DECL std::string TanhNormal::name() const { return "TanhNormal"; }
}  // namespace tensordict::nn
#endif  // TENSORDICT_DEFINITIONS
