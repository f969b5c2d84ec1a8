// Adam in one pass per parameter: torch.optim.Adam's update (as libtorch's
// torch::optim::Adam computes it, the same operations in the same order) for
// networks whose step is dominated by per-op dispatch, as RL critics are.
//
//   tensordict::optim::Adam adam(critics->parameters(), {.lr = 1e-3});
//   adam.zero_grad();  loss.backward();  adam.step();
//
// torch::optim::Adam runs 7 ATen ops per parameter and step (13 parameters of
// a SAC agent: ~90 ops, ~4 us each); here a dense contiguous float32/float64
// CPU parameter is one loop over its elements, updating the parameter and both
// moments together (float32: 8 lanes at a time on AVX2; the scalar loop, which
// std::sqrt's errno keeps from vectorizing, took 320 us of a 1.9 ms SAC update). Other parameters (non-contiguous, other dtypes or
// devices) take libtorch's ops. zero_grad sets the gradients to none (Python's
// default since torch 2.0), and step skips a parameter without a gradient.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros_like.h>

#include "../detail/config.hpp"
#include "../errors.hpp"

namespace tensordict::optim {

namespace detail {
// One step's constants, rounded to the parameter's dtype as ATen rounds its scalars.
template <class T>
struct adam_constants {
  T b1, one_minus_b1, b2, one_minus_b2, decay, eps, correction, minus_step;
  bool decays;
};
// The update of elements [begin, end) of a float32 parameter, its gradient and moments:
// 8 at a time where the CPU has AVX2 (the scalar loop does not vectorize: std::sqrt sets
// errno), the same operations in the same order as the scalar form, so the same values.
TENSORDICT_DECL void adam_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t begin,
                                 std::int64_t end, const adam_constants<float>& c);

// The scalar form of that update (float64, and the vector form's last elements).
template <class T>
inline void adam_update_scalar(T* param, const T* g, T* m, T* v, std::int64_t begin, std::int64_t end, const adam_constants<T>& c) {
  for (std::int64_t k = begin; k < end; ++k) {
    const T gk = c.decays ? g[k] + c.decay * param[k] : g[k];
    const T mk = m[k] * c.b1 + c.one_minus_b1 * gk;
    const T vk = v[k] * c.b2 + c.one_minus_b2 * gk * gk;
    m[k] = mk;
    v[k] = vk;
    const T denom = std::sqrt(vk) / c.correction + c.eps;
    param[k] = param[k] + c.minus_step * (mk / denom);
  }
}
}  // namespace detail

struct adam_options {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;  // L2 penalty added to the gradient, as torch.optim.Adam's
};

class Adam {
 public:
  explicit Adam(std::vector<at::Tensor> params, adam_options options = {}) : params_(std::move(params)), options_(options) {
    const auto [beta1, beta2] = options_.betas;
    auto refuse = [](const std::string& what) { throw value_error("tensordict::optim::Adam: " + what); };
    if (!(options_.lr >= 0)) refuse("lr must be >= 0, got " + std::to_string(options_.lr));
    if (!(options_.eps >= 0)) refuse("eps must be >= 0, got " + std::to_string(options_.eps));
    if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
      refuse("betas must be in [0, 1), got (" + std::to_string(beta1) + ", " + std::to_string(beta2) + ")");
    if (!(options_.weight_decay >= 0)) refuse("weight_decay must be >= 0, got " + std::to_string(options_.weight_decay));
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!params_[i].defined() || !params_[i].is_leaf())
        refuse("parameter " + std::to_string(i) + " is " + (params_[i].defined() ? "not a leaf" : "undefined") +
               " (give the tensors autograd accumulates gradients into: module->parameters())");
    state_.resize(params_.size());
  }

  const adam_options& options() const { return options_; }
  const std::vector<at::Tensor>& parameters() const { return params_; }
  // The steps taken by parameter i (those with a gradient count), as torch's state["step"].
  std::int64_t steps(std::size_t i) const { return state_.at(i).step; }
  const at::Tensor& exp_avg(std::size_t i) const { return state_.at(i).exp_avg; }
  const at::Tensor& exp_avg_sq(std::size_t i) const { return state_.at(i).exp_avg_sq; }

  void zero_grad() {
    for (auto& p : params_) p.mutable_grad().reset();
  }

  void step() {
    at::NoGradGuard no_grad;
    const auto [beta1, beta2] = options_.betas;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      at::Tensor& p = params_[i];
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      state& s = state_[i];
      if (!s.exp_avg.defined()) {
        s.exp_avg = at::zeros_like(p, at::MemoryFormat::Preserve);
        s.exp_avg_sq = at::zeros_like(p, at::MemoryFormat::Preserve);
      }
      ++s.step;
      const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(s.step));
      const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(s.step));
      const double step_size = options_.lr / bias_correction1;
      const double sqrt_bias_correction2 = std::sqrt(bias_correction2);
      if (one_pass(p, grad, s)) {
        if (p.scalar_type() == at::kFloat)
          update<float>(p, grad, s, step_size, sqrt_bias_correction2);
        else
          update<double>(p, grad, s, step_size, sqrt_bias_correction2);
        continue;
      }
      // libtorch's torch::optim::Adam::step, op for op.
      at::Tensor g = options_.weight_decay != 0 ? grad.add(p, options_.weight_decay) : grad;
      s.exp_avg.mul_(beta1).add_(g, 1 - beta1);
      s.exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2);
      const at::Tensor denom = s.exp_avg_sq.sqrt().div_(sqrt_bias_correction2).add_(options_.eps);
      p.addcdiv_(s.exp_avg, denom, -step_size);
    }
  }

 private:
  struct state {
    at::Tensor exp_avg, exp_avg_sq;
    std::int64_t step = 0;
  };

  static bool one_pass(const at::Tensor& p, const at::Tensor& grad, const state& s) {
    auto plain = [&](const at::Tensor& t) {
      return t.is_cpu() && t.layout() == at::kStrided && t.is_contiguous() && t.scalar_type() == p.scalar_type() &&
             !t.is_neg() && !t.is_conj();
    };
    return (p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble) && plain(p) && plain(grad) && plain(s.exp_avg) &&
           plain(s.exp_avg_sq);
  }

  // Each element as libtorch's ops compute it: mul_ then add_ with alpha, addcmul_,
  // sqrt then the division and add_, addcdiv_; scalars rounded to T as ATen does.
  template <class T>
  void update(at::Tensor& p, const at::Tensor& grad, state& s, double step_size, double sqrt_bias_correction2) const {
    const auto [beta1, beta2] = options_.betas;
    const detail::adam_constants<T> c{static_cast<T>(beta1),         static_cast<T>(1 - beta1),
                                      static_cast<T>(beta2),         static_cast<T>(1 - beta2),
                                      static_cast<T>(options_.weight_decay), static_cast<T>(options_.eps),
                                      static_cast<T>(sqrt_bias_correction2), static_cast<T>(-step_size),
                                      options_.weight_decay != 0};
    T* param = p.data_ptr<T>();
    const T* g = grad.data_ptr<T>();
    T* m = s.exp_avg.data_ptr<T>();
    T* v = s.exp_avg_sq.data_ptr<T>();
    at::parallel_for(0, p.numel(), 1 << 15, [&](std::int64_t begin, std::int64_t end) {
      if constexpr (std::is_same_v<T, float>)
        detail::adam_update(param, g, m, v, begin, end, c);
      else
        detail::adam_update_scalar(param, g, m, v, begin, end, c);
    });
  }

  std::vector<at::Tensor> params_;
  std::vector<state> state_;
  adam_options options_;
};

}  // namespace tensordict::optim

#if TENSORDICT_DEFINITIONS
#include "../detail/kernels/cpu_features.hpp"

namespace tensordict::optim::detail {
#if TENSORDICT_X86_KERNELS
// Without FMA: a fused multiply-add would round differently from the scalar form.
__attribute__((target("avx2"))) inline std::int64_t adam_update_avx2(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                                                                     std::int64_t begin, std::int64_t end, const adam_constants<float>& c) {
  const __m256 b1 = _mm256_set1_ps(c.b1), one_minus_b1 = _mm256_set1_ps(c.one_minus_b1), b2 = _mm256_set1_ps(c.b2),
               one_minus_b2 = _mm256_set1_ps(c.one_minus_b2), decay = _mm256_set1_ps(c.decay), eps = _mm256_set1_ps(c.eps),
               correction = _mm256_set1_ps(c.correction), minus_step = _mm256_set1_ps(c.minus_step);
  std::int64_t k = begin;
  for (; k + 8 <= end; k += 8) {
    const __m256 p = _mm256_loadu_ps(param + k);
    __m256 g = _mm256_loadu_ps(grad + k);
    if (c.decays) g = _mm256_add_ps(g, _mm256_mul_ps(decay, p));
    const __m256 m = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(exp_avg + k), b1), _mm256_mul_ps(one_minus_b1, g));
    const __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(exp_avg_sq + k), b2), _mm256_mul_ps(_mm256_mul_ps(one_minus_b2, g), g));
    _mm256_storeu_ps(exp_avg + k, m);
    _mm256_storeu_ps(exp_avg_sq + k, v);
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), correction), eps);
    _mm256_storeu_ps(param + k, _mm256_add_ps(p, _mm256_mul_ps(minus_step, _mm256_div_ps(m, denom))));
  }
  return k;
}
#endif

TENSORDICT_DECL void adam_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t begin,
                                 std::int64_t end, const adam_constants<float>& c) {
#if TENSORDICT_X86_KERNELS
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) begin = adam_update_avx2(param, grad, exp_avg, exp_avg_sq, begin, end, c);
#endif
  adam_update_scalar(param, grad, exp_avg, exp_avg_sq, begin, end, c);
}
}  // namespace tensordict::optim::detail
#endif  // TENSORDICT_DEFINITIONS
