// Distributions, against Python: the tensordict 0.4 fixtures
// (tests/data/tensordict-v0.4-nn: the distributions their policies built, with
// the parameters, fixed actions, log-probs and entropies Python computed) and
// tests/data/distributions.pt (torch.distributions' values and samples, made by
// tests/data/make_distributions.py).
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "catch_torch.hpp"
#include "test_helpers.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/nan_to_num.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isinf.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd.h>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <tensordict/nn/distributions.hpp>
#include <tensordict/files/torch_save.hpp>
#include <tensordict/from_module.hpp>
#include <tensordict/functional_call.hpp>
#include <tensordict/files/memmap.hpp>
#include <tensordict/nn/adapters/builtin.hpp>
#include <tensordict/to_module.hpp>

using namespace tensordict;
namespace tdn = tensordict::nn;
using test::Contains;

namespace {

// The message of the E that f throws ("" for none, "other exception" for another type).
template <class E, class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (...) {
    return "other exception";
  }
  return "";
}

at::Generator seeded(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

}  // namespace

TEST_CASE("Normal and Independent(Normal) give tensordict 0.4's log_prob, entropy, mode and mean", "[distributions]") {
  for (const bool independent : {false, true}) {
    const auto dir = test::nn_fixture(independent ? "independent_normal_policy" : "gaussian_policy");
    const auto mode_out = load_memmap(dir + "output_mode");
    const auto mean_out = load_memmap(dir + "output_mean");
    const auto action = load_memmap(dir + "fixed_action").get("action");
    const auto expected = load_memmap(dir + "dist_values");
    const tdn::Normal normal(mode_out.get("loc"), mode_out.get("scale"));
    const tdn::Independent joint(normal, 1);
    const tdn::Distribution& dist = independent ? static_cast<const tdn::Distribution&>(joint) : normal;
    INFO(dist.repr());
    CHECK(test::near_python(dist.log_prob(action), expected.get("log_prob")));
    CHECK(test::near_python(dist.entropy(), expected.get("entropy")));
    CHECK(test::near_python(dist.mode(), mode_out.get("agents", "action")));
    CHECK(test::near_python(dist.log_prob(dist.mode()), mode_out.get("sample_log_prob")));
    CHECK(test::near_python(dist.mean(), mean_out.get("agents", "action")));
    CHECK(dist.batch_shape() == (independent ? std::vector<int64_t>{5} : std::vector<int64_t>{5, 4}));
    CHECK(dist.event_shape() == (independent ? std::vector<int64_t>{4} : std::vector<int64_t>{}));
    // 0.4 refuses the median; it is loc.
    CHECK(dist.median().equal(mode_out.get("loc")));
  }
}

TEST_CASE("OneHotCategorical and Categorical give tensordict 0.4's log_prob, entropy and mode", "[distributions]") {
  {
    const auto dir = test::nn_fixture("categorical_policy");
    const auto out = load_memmap(dir + "output_mode");
    const auto expected = load_memmap(dir + "dist_values");
    const tdn::OneHotCategorical dist(out.get("logits"));
    CHECK(test::near_python(dist.log_prob(load_memmap(dir + "fixed_action").get("action")), expected.get("log_prob")));
    CHECK(test::near_python(dist.entropy(), expected.get("entropy")));
    CHECK(dist.mode().equal(out.get("action")));
    CHECK(test::near_python(dist.log_prob(dist.mode()), out.get("sample_log_prob")));
    CHECK(dist.deterministic_sample().equal(out.get("action")));
    CHECK(dist.batch_shape() == std::vector<int64_t>{5});
    CHECK(dist.event_shape() == std::vector<int64_t>{3});
    CHECK(test::near_python(dist.mean(), out.get("logits").softmax(-1)));
  }
  {
    const auto dir = test::nn_fixture("categorical_policy_torch_categorical");
    const auto out = load_memmap(dir + "output_mode");
    const auto expected = load_memmap(dir + "dist_values");
    const tdn::Categorical dist(out.get("logits"));
    CHECK(test::near_python(dist.log_prob(load_memmap(dir + "fixed_action").get("action")), expected.get("log_prob")));
    CHECK(test::near_python(dist.entropy(), expected.get("entropy")));
    CHECK(dist.mode().equal(out.get("action")));
    CHECK(test::near_python(dist.log_prob(dist.mode()), out.get("sample_log_prob")));
    CHECK(dist.event_shape().empty());
    // As torch's: NaN of batch_shape (an index has no mean).
    CHECK(dist.mean().isnan().all().item<bool>());
    CHECK(dist.mean().sizes() == at::IntArrayRef{5});
    // from_probs: the same distribution.
    const auto from_probs = tdn::Categorical::from_probs(out.get("logits").softmax(-1));
    CHECK(at::allclose(from_probs.log_prob(dist.mode()), dist.log_prob(dist.mode()), 1e-5, 1e-6));
  }
}

TEST_CASE("TruncatedNormal and Delta give tensordict 0.4's values", "[distributions]") {
  {
    const auto dir = test::nn_fixture("truncated_normal");
    const auto out = load_memmap(dir + "output_mean");
    const auto expected = load_memmap(dir + "dist_values");
    const tdn::TruncatedNormal dist(out.get("loc"), out.get("scale"), {.a = -1.0, .b = 1.0});
    CHECK(test::near_python(dist.log_prob(load_memmap(dir + "fixed_action").get("action")), expected.get("log_prob")));
    CHECK(test::near_python(dist.entropy(), expected.get("entropy")));
    CHECK(test::near_python(dist.mean(), out.get("action")));
    CHECK(test::near_python(dist.log_prob(dist.mean()), out.get("sample_log_prob")));
    // 0.4 refuses the mode and the median: loc clamped into [a, b], and the icdf at 0.5.
    CHECK(dist.mode().equal(out.get("loc").clamp(-1, 1)));
    CHECK(at::allclose(dist.cdf(dist.median()), at::full({5, 4}, 0.5), 1e-4, 1e-5));
  }
  {
    const auto dir = test::nn_fixture("delta");
    const auto out = load_memmap(dir + "output_mode");
    const auto param = out.get("param");
    const tdn::Delta dist(param);
    const auto expected = load_memmap(dir + "dist_values").get("log_prob");
    CHECK(dist.log_prob(load_memmap(dir + "fixed_action").get("action")).equal(expected));
    CHECK(dist.mode().equal(out.get("action")));
    CHECK(dist.log_prob(dist.mode()).equal(out.get("sample_log_prob")));
    CHECK(dist.mean().equal(load_memmap(dir + "output_mean").get("action")));
    CHECK(dist.batch_shape() == std::vector<int64_t>{5});
    CHECK(dist.event_shape() == std::vector<int64_t>{2});
    // One element off by more than atol + rtol * |param| makes the whole event -inf.
    auto off = param.clone();
    off.index_put_({0, 1}, off.index({0, 1}) + 1e-3);
    const auto lp = dist.log_prob(off);
    CHECK(lp.index({0}).item<float>() == -std::numeric_limits<float>::infinity());
    CHECK(at::isinf(lp).all().item<bool>());
    CHECK((lp.narrow(0, 1, 4) > 0).all().item<bool>());
  }
}

TEST_CASE("Bernoulli and TanhNormal equal torch.distributions", "[distributions]") {
  const auto py = load(test::test_data("distributions.pt"));
  const auto loc = py.get("param.loc"), scale = py.get("param.scale"), logits = py.get("param.logits");

  const auto bern = tdn::Bernoulli::from_logits(logits);
  CHECK(test::near_python(bern.log_prob(py.get("bernoulli.value")), py.get("bernoulli.log_prob")));
  CHECK(test::near_python(bern.entropy(), py.get("bernoulli.entropy")));
  CHECK(test::near_python(bern.mean(), py.get("bernoulli.mean")));
  CHECK(bern.mode().equal(py.get("bernoulli.mode")));
  const tdn::Bernoulli from_probs(py.get("bernoulli_probs.probs"));
  CHECK(test::near_python(from_probs.log_prob(at::tensor({0.0, 1.0, 1.0, 1.0}, at::kDouble)), py.get("bernoulli_probs.log_prob")));
  CHECK(test::near_python(from_probs.entropy(), py.get("bernoulli_probs.entropy")));
  // NaN at probs 0.5, as torch's.
  CHECK(at::allclose(from_probs.mode(), py.get("bernoulli_probs.mode"), 0, 0, /*equal_nan=*/true));

  const tdn::TanhNormal tanh(loc, scale);
  CHECK(test::near_python(tanh.log_prob(py.get("tanh_normal.value")), py.get("tanh_normal.log_prob")));
  CHECK(test::near_python(tanh.mode(), py.get("tanh_normal.mode")));
  CHECK(tanh.batch_shape() == std::vector<int64_t>{3});
  CHECK(tanh.event_shape() == std::vector<int64_t>{4});
  const tdn::TanhNormal bounded(loc, scale, {.low = -2.0, .high = 3.0});
  CHECK(test::near_python(bounded.log_prob(py.get("tanh_normal_bounds.value")), py.get("tanh_normal_bounds.log_prob")));
  CHECK(test::near_python(bounded.deterministic_sample(), py.get("tanh_normal_bounds.mode")));
  CHECK(test::near_python(bounded.median(), py.get("tanh_normal_bounds.mode")));
}

TEST_CASE("samples drawn with a generator seeded as torch.manual_seed equal Python's", "[distributions]") {
  const auto py = load(test::test_data("distributions.pt"));
  const auto loc = py.get("param.loc"), scale = py.get("param.scale"), logits = py.get("param.logits");
  const uint64_t seed = 1234;
  CHECK(test::near_python(tdn::Normal(loc, scale).sample({2}, seeded(seed)), py.get("sample.normal")));
  CHECK(test::near_python(tdn::Normal(loc, scale).rsample({2}, seeded(seed)), py.get("sample.normal_rsample")));
  CHECK(tdn::Categorical(logits).sample({5}, seeded(seed)).equal(py.get("sample.categorical")));
  CHECK(tdn::OneHotCategorical(logits).sample({5}, seeded(seed)).equal(py.get("sample.one_hot_categorical").to(at::kLong)));
  CHECK(test::near_python(tdn::Bernoulli::from_logits(logits).sample({2}, seeded(seed)), py.get("sample.bernoulli")));
  CHECK(test::near_python(tdn::TanhNormal(loc, scale).rsample({2}, seeded(seed)), py.get("sample.tanh_normal")));
  // The same seed, the same draws; the shapes are sample_shape + batch_shape + event_shape.
  const tdn::TruncatedNormal trunc(loc, scale, {.a = -0.5, .b = 1.0});
  const auto a = trunc.sample({7, 2}, seeded(3));
  CHECK(a.equal(trunc.sample({7, 2}, seeded(3))));
  CHECK(a.sizes() == at::IntArrayRef{7, 2, 3, 4});
  CHECK(tdn::Independent(tdn::Normal(loc, scale), 2).sample({6}, seeded(1)).sizes() == at::IntArrayRef{6, 3, 4});
}

// At the edges of the dtypes: a TanhNormal's clamp is the dtype's resolution (torch.finfo(dtype).resolution, as
// TorchRL's SafeTanhTransform; 1e-6 rounded to exactly +-1 in bfloat16 and log_prob of its own samples was NaN),
// a Categorical's entropy clamps with the dtype's own smallest finite number (float32's was -inf in bfloat16:
// NaN), and a float64 TruncatedNormal draws float32 uniforms, as tensordict's does whatever the dtype.
TEST_CASE("distributions at the edges of their dtypes, as Python computes them", "[distributions]") {
  for (const auto dtype : {at::kBFloat16, at::kFloat, at::kDouble}) {
    INFO(c10::toString(dtype));
    const auto loc = at::tensor({-4.0, 0.0, 3.0, 8.0}).to(dtype), scale = at::full({4}, 2.0, at::TensorOptions(dtype));
    const tdn::TanhNormal tanh(loc, scale);
    const auto y = tanh.rsample({64}, seeded(5));
    CHECK(y.scalar_type() == dtype);
    CHECK((y.abs() < 1).all().item<bool>());
    CHECK(tanh.log_prob(y).isfinite().all().item<bool>());
    CHECK(tanh.log_prob(tanh.mode()).isfinite().all().item<bool>());

    const auto logits = at::tensor({0.0, 1.0, -std::numeric_limits<double>::infinity()}).to(dtype);
    const auto entropy = tdn::Categorical(logits).entropy();
    CHECK(entropy.isfinite().all().item<bool>());
    CHECK(entropy.to(at::kDouble).allclose(tdn::Categorical(logits.to(at::kDouble)).entropy(), 1e-2, 1e-2));
  }

  const auto loc = at::tensor({-0.3, 0.0, 0.4}, at::kFloat), scale = at::tensor({0.5, 1.0, 2.0}, at::kFloat);
  const tdn::TruncatedNormal single(loc, scale, {.a = -1.0, .b = 1.0});
  const tdn::TruncatedNormal twice(loc.to(at::kDouble), scale.to(at::kDouble), {.a = -1.0, .b = 1.0});
  const auto s32 = single.rsample({50}, seeded(11)), s64 = twice.rsample({50}, seeded(11));
  CHECK(s64.scalar_type() == at::kDouble);
  CHECK(s64.to(at::kFloat).allclose(s32, 1e-4, 1e-5));  // the same draws
  // Python: p = torch.empty(shape).uniform_(1e-6, 1 - 1e-6) (float32), then the icdf in float64.
  auto p = at::empty({50, 3});
  p.uniform_(1e-6, 1 - 1e-6, seeded(11));
  CHECK(s64.equal(twice.icdf(p.to(at::kDouble))));
}

// OneHotCategorical.rsample's gradient is Python's default (ReparamGradientStrategy.PassThrough): the one-hot
// sample that sample() draws, plus probs - probs.detach(); relaxed_one_hot is the Gumbel-softmax one.
TEST_CASE("OneHotCategorical.rsample: pass-through gradients by default, relaxed on request", "[distributions]") {
  const auto logits = at::tensor({0.1, 0.5, -0.3}, at::kDouble).requires_grad_();
  const auto weights = at::tensor({1.0, 2.0, 3.0}, at::kDouble);
  const tdn::OneHotCategorical through(logits);
  CHECK(through.grad_method() == tdn::reparam_gradient_strategy::pass_through);
  const auto drawn = through.rsample({6}, seeded(4));
  CHECK(drawn.scalar_type() == at::kDouble);
  CHECK(drawn.detach().allclose(through.sample({6}, seeded(4)).to(at::kDouble)));  // Python's draws
  const auto g = torch::autograd::grad({(drawn * weights).sum()}, {logits}, {}, /*retain_graph=*/true)[0];
  const auto expected = torch::autograd::grad({(through.probs() * weights).sum() * 6}, {logits})[0];
  CHECK(g.allclose(expected));

  const tdn::OneHotCategorical relaxed(logits, tdn::reparam_gradient_strategy::relaxed_one_hot);
  const auto hard = relaxed.rsample({5}, seeded(4));
  CHECK((hard.detach().sum(-1) == 1).all().item<bool>());
  CHECK(((hard.detach() == 0) | (hard.detach() == 1)).all().item<bool>());
  CHECK(torch::autograd::grad({(hard * weights).sum()}, {logits})[0].abs().sum().item<double>() > 0);
}

TEST_CASE("samples stay in the support and average to the mean", "[distributions]") {
  // (Bounds a few scales from loc: far out, Z is clamped at 1e-6, as Python's.)
  const auto loc = at::tensor({-2.0, 0.0, 0.3, 1.2}, at::kDouble);
  const auto scale = at::tensor({1.0, 0.5, 2.0, 0.4}, at::kDouble);
  const tdn::TruncatedNormal trunc(loc, scale, {.a = -1.0, .b = 1.0});
  const auto draws = trunc.sample({20000}, seeded(7));
  CHECK((draws >= -1).all().item<bool>());
  CHECK((draws <= 1).all().item<bool>());
  CHECK(at::allclose(draws.mean(0), trunc.mean(), 0, 0.02));
  CHECK(at::allclose(draws.var(0), trunc.variance(), 0, 0.02));

  const tdn::TanhNormal tanh(loc, scale, {.low = 0.0, .high = 5.0});
  const auto y = tanh.sample({1000}, seeded(8));
  CHECK(((y >= 0) & (y <= 5)).all().item<bool>());

  const auto p = at::tensor({0.1, 0.5, 0.9}, at::kDouble);
  CHECK(at::allclose(tdn::Bernoulli(p).sample({20000}, seeded(9)).mean(0), p, 0, 0.02));
  const auto probs = at::tensor({0.2, 0.3, 0.5}, at::kDouble);
  CHECK(at::allclose(tdn::OneHotCategorical::from_probs(probs).sample({20000}, seeded(10)).to(at::kDouble).mean(0), probs, 0, 0.02));
}

TEST_CASE("rsample differentiates to the parameters; sample does not", "[distributions]") {
  auto loc = at::zeros({3}, at::kDouble).requires_grad_();
  auto scale = at::ones({3}, at::kDouble).requires_grad_();

  const tdn::Normal normal(loc, scale);
  CHECK_FALSE(normal.sample({2}, seeded(1)).requires_grad());
  const auto x = normal.rsample({2}, seeded(1));
  auto grads = torch::autograd::grad({x.sum()}, {loc, scale});
  CHECK(grads[0].equal(at::full({3}, 2.0, at::kDouble)));
  CHECK(at::allclose(grads[1], x.detach().sum(0)));  // d(loc + eps * scale)/dscale = eps = x at loc 0, scale 1

  const tdn::TanhNormal tanh(loc, scale);
  const auto y = tanh.rsample({}, seeded(2));
  grads = torch::autograd::grad({y.sum()}, {loc});
  CHECK(at::allclose(grads[0], 1 - y.detach().pow(2)));

  // One distribution, two backward passes: each call's graph is its own.
  const tdn::TanhNormal squashed(loc, scale, {.tanh_loc = true});
  (void)torch::autograd::grad({squashed.rsample({}, seeded(5)).sum()}, {loc});
  grads = torch::autograd::grad({squashed.log_prob(at::full({3}, 0.5, at::kDouble)).sum()}, {loc});
  CHECK(grads[0].abs().sum().item<double>() > 0);
  CHECK(at::allclose(squashed.mode(), ((loc / 5).tanh() * 5).tanh()));

  const tdn::TruncatedNormal trunc(loc, scale);
  grads = torch::autograd::grad({trunc.rsample({4}, seeded(3)).sum()}, {loc, scale});
  CHECK(grads[0].abs().sum().item<double>() > 0);
  grads = torch::autograd::grad({trunc.log_prob(at::full({3}, 0.25, at::kDouble)).sum()}, {loc, scale});
  CHECK(grads[1].abs().sum().item<double>() > 0);

  auto logits = at::tensor({0.1, 0.5, -0.3}, at::kDouble).requires_grad_();
  const tdn::OneHotCategorical onehot(logits);
  const auto hard = onehot.rsample({5}, seeded(4));
  CHECK(hard.detach().sum(-1).allclose(at::ones({5}, at::kDouble)));
  grads = torch::autograd::grad({(hard * at::tensor({1.0, 2.0, 3.0}, at::kDouble)).sum()}, {logits});
  CHECK(grads[0].abs().sum().item<double>() > 0);

  const tdn::Delta delta(loc);
  grads = torch::autograd::grad({delta.rsample({2}).sum()}, {loc});
  CHECK(grads[0].equal(at::full({3}, 2.0, at::kDouble)));
}

// rsample_and_log_prob against its two calls on the same draws: TanhNormal's fused pass (one
// autograd node) for each option, dtype and event size, at values its clamps cut, with NaN and
// infinities; gradients from the action, the log-probability or both, and second derivatives.
TEST_CASE("TanhNormal.rsample_and_log_prob: rsample then log_prob of it, in one pass", "[distributions]") {
  struct options_case {
    const char* name;
    tdn::TanhNormalOptions options;
  };
  const options_case cases[] = {{"default", {}},
                                {"bounds [-2, 2]", {.low = -2.0, .high = 2.0}},
                                {"bounds [0, 5], no safe tanh", {.low = 0.0, .high = 5.0, .safe_tanh = false}},
                                {"event_dims 0", {.event_dims = 0}},
                                {"event_dims 2", {.low = -3.0, .high = 1.0, .event_dims = 2}},
                                {"tanh_loc (the two calls)", {.tanh_loc = true}}};
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    const double tol = dtype == at::kFloat ? 2e-5 : 1e-11;
    for (const auto& c : cases) {
      INFO(c.name << ", " << at::toString(dtype));
      at::manual_seed(11);
      // [6, 4] parameters as NormalParamExtractor leaves them (chunks of one tensor: not contiguous); loc
      // reaches 9 (tanh rounds to 1: the safe clamp cuts it), one row holds NaN and one an infinite scale.
      const at::Tensor param = at::randn({6, 8}, dtype);
      param.narrow(1, 0, 4)[2].fill_(9.0);
      param.narrow(1, 0, 4)[3][1] = std::numeric_limits<double>::quiet_NaN();
      auto loc0 = param.narrow(1, 0, 4).clone(), scale0 = param.narrow(1, 4, 4).abs() + 0.1;
      scale0[4][0] = std::numeric_limits<double>::infinity();
      for (const bool contiguous : {false, true}) {
        INFO((contiguous ? "contiguous" : "chunks of one tensor"));
        const at::Tensor both = at::cat({loc0, scale0}, 1).requires_grad_();
        const at::Tensor loc = contiguous ? both.narrow(1, 0, 4).contiguous() : both.narrow(1, 0, 4);
        const at::Tensor scale = contiguous ? both.narrow(1, 4, 4).contiguous() : both.narrow(1, 4, 4);
        const tdn::TanhNormal dist(loc, scale, c.options);
        const auto [action, log_prob] = dist.rsample_and_log_prob(seeded(7));
        const at::Tensor reference_action = dist.rsample({}, seeded(7));
        const at::Tensor reference_log_prob = dist.log_prob(reference_action);
        CHECK(action.sizes() == reference_action.sizes());
        CHECK(log_prob.sizes() == reference_log_prob.sizes());
        CHECK(at::allclose(action, reference_action, tol, tol, /*equal_nan=*/true));
        CHECK(at::allclose(log_prob, reference_log_prob, tol, tol, /*equal_nan=*/true));
        CHECK(log_prob.isnan().any().item<bool>());  // the NaN row and the infinite scale stay visible

        // Gradients of both parameters from the action alone, the log-probability alone, and both.
        const at::Tensor g_action = at::randn(action.sizes(), dtype), g_log_prob = at::randn(log_prob.sizes(), dtype);
        for (int which = 0; which < 3; ++which) {
          INFO("gradient from " << (which == 0 ? "the action" : which == 1 ? "the log-probability" : "both"));
          const auto grads_of = [&](const at::Tensor& a, const at::Tensor& lp) {
            std::vector<at::Tensor> ys, gs;
            if (which != 1) ys.push_back(a), gs.push_back(g_action);
            if (which != 0) ys.push_back(lp), gs.push_back(g_log_prob);
            return torch::autograd::grad(ys, {both}, gs, /*retain_graph=*/true)[0];
          };
          const at::Tensor ours = grads_of(action, log_prob), theirs = grads_of(reference_action, reference_log_prob);
          // Row 2 saturates tanh: its log-probability's gradient is 1 / (1 - y^2) ~ 1e6 (float) times tanh's last bit,
          // where glibc's tanh and ATen's vectorized one may round apart; only where they are finite is compared there.
          const at::Tensor rows = at::tensor({0, 1, 3, 4, 5}, at::kLong);
          CHECK(at::allclose(ours.index_select(0, rows), theirs.index_select(0, rows), 20 * tol, 20 * tol, /*equal_nan=*/true));
          CHECK(at::isfinite(ours[2]).equal(at::isfinite(theirs[2])));  // (without the safe clamp, float32's atanh(1): both infinite)
        }
        // Second derivatives (create_graph): the composed ops' own.
        const auto second = [&](const at::Tensor& a, const at::Tensor& lp) {
          const at::Tensor keep = at::isfinite(lp.detach()).all(-1, true).to(dtype);  // rows without NaN
          const at::Tensor g = torch::autograd::grad({((a * a).sum(-1, true) * keep).sum() + (lp * keep.squeeze(-1)).sum()}, {both}, {},
                                                     /*retain_graph=*/true, /*create_graph=*/true)[0];
          return torch::autograd::grad({(g.nan_to_num(0, 0, 0) * g.nan_to_num(0, 0, 0)).sum()}, {both}, {}, true)[0];
        };
        if (c.options.event_dims == 1) {
          const at::Tensor rows = at::tensor({0, 1, 3, 4, 5}, at::kLong);
          CHECK(at::allclose(second(action, log_prob).index_select(0, rows), second(reference_action, reference_log_prob).index_select(0, rows),
                             100 * tol, 100 * tol, /*equal_nan=*/true));
        }
      }
    }
  }
  // Without gradients (a policy acting): the values alone, no graph.
  at::NoGradGuard no_grad;
  const tdn::TanhNormal dist(at::zeros({3, 2}), at::ones({3, 2}), {.low = -2.0, .high = 2.0});
  const auto [action, log_prob] = dist.rsample_and_log_prob(seeded(3));
  CHECK(at::allclose(log_prob, dist.log_prob(dist.rsample({}, seeded(3))), 1e-5, 1e-5));
  CHECK_FALSE(action.requires_grad());
}

// scale_mapping::at_least (NormalParamExtractor's scale): the softplus mappings' one pass and one
// autograd node against the mapping's ops then clamp_min, on the layouts a chunk leaves, with
// values the clamp cuts, beyond softplus's threshold, NaN and infinities.
TEST_CASE("scale_mapping.at_least: the mapping's ops and clamp_min in one pass", "[distributions]") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    const double tol = dtype == at::kFloat ? 1e-6 : 1e-12;
    for (const char* name : {"biased_softplus_1.0", "softplus", "biased_softplus_2.0_0.5"}) {
      const tdn::scale_mapping mapping(name);
      for (const double lower : {1e-4, 0.6}) {
        INFO(name << ", lower " << lower << ", " << at::toString(dtype));
        at::manual_seed(4);
        at::Tensor base = at::randn({2, 3, 8}, dtype) * 4;
        base[0][1][5] = 30.0;  // beyond softplus's threshold
        base[0][2][6] = -40.0;  // softplus rounds to its exp
        base[1][0][4] = nan;
        base[1][1][5] = inf;
        base[1][2][7] = -inf;
        // The layouts: a chunk's second half (rows of 4 at a stride of 8), the same of a 2-d tensor, contiguous.
        const std::vector<std::pair<const char*, std::function<at::Tensor(const at::Tensor&)>>> layouts = {
            {"chunk of [2, 3, 8]", [](const at::Tensor& t) { return t.chunk(2, -1)[1]; }},
            {"chunk of [6, 8]", [](const at::Tensor& t) { return t.view({6, 8}).chunk(2, -1)[1]; }},
            {"contiguous", [](const at::Tensor& t) { return t.chunk(2, -1)[1].contiguous(); }}};
        for (const auto& [layout, take] : layouts) {
          INFO(layout);
          const at::Tensor ours_in = base.clone().requires_grad_(), theirs_in = base.clone().requires_grad_();
          const at::Tensor ours = mapping.at_least(take(ours_in), lower), theirs = mapping(take(theirs_in)).clamp_min(lower);
          REQUIRE(ours.sizes() == theirs.sizes());
          CHECK(at::allclose(ours, theirs, tol, tol, /*equal_nan=*/true));
          CHECK(std::string(ours.grad_fn()->name()).find("scale_function") != std::string::npos);  // one node
          const at::Tensor g = at::randn(ours.sizes(), dtype);
          const at::Tensor ours_grad = torch::autograd::grad({ours}, {ours_in}, {g}, /*retain_graph=*/true)[0];
          const at::Tensor theirs_grad = torch::autograd::grad({theirs}, {theirs_in}, {g}, /*retain_graph=*/true)[0];
          CHECK(at::allclose(ours_grad, theirs_grad, tol, tol, /*equal_nan=*/true));
          // Second derivatives: the ops' own.
          const auto second = [&](const at::Tensor& y, const at::Tensor& in) {
            const at::Tensor keep = at::isfinite(y.detach()).to(dtype);
            const at::Tensor g1 = torch::autograd::grad({(y * y * keep).sum()}, {in}, {}, true, /*create_graph=*/true)[0];
            return torch::autograd::grad({(g1.nan_to_num(0, 0, 0) * g1.nan_to_num(0, 0, 0)).sum()}, {in}, {}, true)[0];
          };
          CHECK(at::allclose(second(ours, ours_in), second(theirs, theirs_in), 100 * tol, 100 * tol, /*equal_nan=*/true));
        }
        // Without gradients: the values alone.
        at::NoGradGuard no_grad;
        const at::Tensor values = mapping.at_least(base.chunk(2, -1)[1], lower);
        CHECK(at::allclose(values, mapping(base.chunk(2, -1)[1]).clamp_min(lower), tol, tol, /*equal_nan=*/true));
        CHECK_FALSE(values.requires_grad());
      }
    }
  }
  // Other mappings and layouts take the ops.
  const at::Tensor x = at::randn({4, 6}).requires_grad_();
  CHECK(tdn::scale_mapping("exp").at_least(x, 0.5).equal(x.exp().clamp_min(0.5)));
  CHECK(std::string(tdn::scale_mapping("softplus").at_least(x.t(), 0.5).grad_fn()->name()).find("ClampMin") != std::string::npos);
}

TEST_CASE("distribution errors name the distribution, the call and the shapes", "[distributions]") {
  const auto loc = at::zeros({5, 4}), scale = at::ones({3});
  CHECK_THAT(thrown<shape_error>([&] { (void)tdn::Normal(loc, scale); }), Contains("tensordict::nn::Normal: the parameters do not broadcast (loc f32[5,4], scale f32[3])"));
  CHECK_THAT(thrown<dtype_error>([&] { (void)tdn::Normal(at::zeros({4}, at::kLong), at::ones({4})); }), Contains("Normal: the parameter loc is i64[4], expected a floating-point tensor"));
  const tdn::Normal normal(loc, at::ones({4}));
  CHECK_THAT(thrown<shape_error>([&] { (void)normal.log_prob(at::zeros({3})); }), Contains("tensordict::nn::Normal.log_prob: the value f32[3] does not broadcast with "
                                              "batch_shape + event_shape = [5,4]"));
  CHECK_THAT(thrown<shape_error>([&] { (void)tdn::TanhNormal(loc, at::ones({4}), {.event_dims = -1}); }),
             Contains("tensordict::nn::TanhNormal: event_dims=-1 for loc f32[5,4]"));
  CHECK_THAT(thrown<shape_error>([&] { (void)tdn::Independent(normal, 3); }), Contains("reinterpreted_batch_ndims=3 must be between 0 and the base's batch dims "
                                              "(Normal(batch_shape=[5,4], event_shape=[]))"));
  CHECK_THAT(thrown<value_error>([&] { (void)tdn::Bernoulli(at::full({2}, 0.5)).rsample(); }), Contains("tensordict::nn::Bernoulli.rsample: it has no reparameterized sample; "
                                              "sample() draws without gradients"));
  CHECK_THAT(thrown<value_error>([&] { (void)tdn::TanhNormal(loc, at::ones({4})).mean(); }), Contains("TanhNormal.mean: it has no closed form; estimate it with sample({N}).mean(0)"));
  CHECK_THAT(thrown<value_error>([&] { (void)tdn::Delta(loc).entropy(); }), Contains("Delta.entropy: a point mass has no density"));
  CHECK_THAT(thrown<value_error>([&] { (void)tdn::TruncatedNormal(loc, at::ones({4}), {.a = 1.0, .b = 1.0}); }), Contains("TruncatedNormal: the bounds a=1.000000 and b=1.000000 need a < b"));
  CHECK_THAT(thrown<dtype_error>([&] { (void)tdn::Categorical(at::zeros({}, at::kFloat)); }), Contains("Categorical: logits is f32[], expected a floating-point tensor with at least one dim"));
  CHECK_THAT(thrown<value_error>([&] { (void)tdn::Categorical(loc).median(); }), Contains("Categorical.median"));
}

TEST_CASE("NormalParamExtractor and AddStateIndependentNormalScale give tensordict 0.4's loc and scale", "[distributions]") {
  namespace nn = torch::nn;
  {
    // MLP 4->32->32->8 (params module.0.module), then the extractor (Python's defaults).
    const auto dir = test::nn_fixture("gaussian_policy");
    const auto out = load_memmap(dir + "output_mode");
    nn::Sequential mlp(nn::Linear(4, 32), nn::Tanh(), nn::Linear(32, 32), nn::Tanh(), nn::Linear(32, 8));
    const auto param = functional_call(mlp, load_memmap(dir + "params").get_tensordict("module", "0", "module"),
                                       load_memmap(dir + "input").get("agents", "observation"));
    CHECK(test::near_python(param, out.get("param")));
    tdn::NormalParamExtractor extractor;
    const auto [loc, scale] = extractor(param);
    CHECK(test::near_python(loc, out.get("loc")));
    CHECK(test::near_python(scale, out.get("scale")));
    STATIC_REQUIRE(tdn::schema_of<tdn::NormalParamExtractorImpl>::leaf_count == 0);
  }
  {
    // Sequential(MLP 4->32->4, AddStateIndependentNormalScale(4)): exp of the trained scale.
    const auto dir = test::nn_fixture("state_independent_scale");
    const auto out = load_memmap(dir + "output_mode");
    nn::Sequential net(nn::Linear(4, 32), nn::Tanh(), nn::Linear(32, 4), tdn::AddStateIndependentNormalScale(std::vector<int64_t>{4}));
    const auto params = load_memmap(dir + "params").get_tensordict("module", "0", "module");
    CHECK(from_module(net).flatten_keys().keys() == params.flatten_keys().keys());
    auto swap = to_module(params, net);
    const auto [loc, scale] = net->forward<std::tuple<at::Tensor, at::Tensor>>(load_memmap(dir + "input").get("observation"));
    CHECK(test::near_python(loc, out.get("loc")));
    CHECK(test::near_python(scale, out.get("scale")));
  }
}

TEST_CASE("scale mappings as Python names them; the scale parameter trains", "[distributions]") {
  const auto x = at::tensor({-3.0, 0.0, 2.5}, at::kDouble);
  CHECK(at::allclose(tdn::scale_mapping("biased_softplus_1.0")(at::zeros({1})), at::ones({1})));
  CHECK(at::allclose(tdn::scale_mapping("biased_softplus")(x), tdn::scale_mapping("biased_softplus_1.0")(x)));
  const auto two = tdn::scale_mapping("biased_softplus_2.0_0.5")(x);
  CHECK(at::allclose(two.index({1}), at::scalar_tensor(2.0, at::kDouble), 1e-6, 1e-6));
  CHECK((two > 0.5).all().item<bool>());
  CHECK(tdn::scale_mapping("exp")(x).equal(x.exp()));
  CHECK(tdn::scale_mapping("none")(x).equal(x));
  CHECK_THAT(thrown<value_error>([] { tdn::scale_mapping("softmax"); }), Contains("unknown mapping \"softmax\""));
  CHECK_THAT(thrown<value_error>([] { tdn::scale_mapping("biased_softplus_x"); }),
             Contains("\"biased_softplus_x\" is not biased_softplus_{bias} or biased_softplus_{bias}_{min_val} with numbers"));

  tdn::NormalParamExtractor extractor(tdn::NormalParamExtractorOptions().mapping("exp").scale_lb(0.5));
  const auto [loc, scale] = extractor(at::tensor({1.0, 2.0, -3.0, 0.0}, at::kDouble));
  CHECK(loc.equal(at::tensor({1.0, 2.0}, at::kDouble)));
  CHECK(at::allclose(scale, at::tensor({0.5, 1.0}, at::kDouble)));
  CHECK_THAT(thrown<shape_error>([&] { (void)extractor(at::zeros({3, 1})); }),
             Contains("the input f32[3,1] needs a last dim of at least 2"));

  tdn::AddStateIndependentNormalScale head(std::vector<int64_t>{3});
  CHECK(from_module(head).get<"state_independent_scale">().sizes() == at::IntArrayRef{3});
  const auto obs = at::randn({5, 3});
  auto params = from_module(head).apply([](const at::Tensor& t) { return (t.detach() + 0.5).requires_grad_(); });
  const auto [same_loc, s] = functional_call(head, params, obs);
  CHECK(same_loc.equal(obs));
  CHECK(at::allclose(s, at::full({5, 3}, std::exp(0.5))));
  const auto grad = torch::autograd::grad({s.sum()}, {params.get<"state_independent_scale">()});
  CHECK(at::allclose(grad[0], at::full({3}, 5 * std::exp(0.5))));
  CHECK_THAT(thrown<shape_error>([&] { (void)head(at::zeros({5, 4})); }),
             Contains("the last dims of loc f32[5,4] differ from scale_shape [3]"));
}
