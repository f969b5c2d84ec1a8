// tensordict::optim::Adam against libtorch's torch::optim::Adam: the same
// parameters and moments step by step, one-pass and fallback paths.
#include "catch_torch.hpp"
#include "test_helpers.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <torch/optim/adam.h>

#include <cstring>
#include <limits>
#include <utility>

#include <tensordict/optim/adam.hpp>

using test::Contains;

namespace {
// Parameters of every path: float32 and float64 contiguous (one pass), a transposed
// float32 leaf and a bfloat16 one (libtorch's ops), a large one (split across threads).
std::vector<at::Tensor> make_params() {
  return {at::randn({4, 3}).requires_grad_(), at::randn({7}, at::kDouble).requires_grad_(),
          at::randn({5, 2}).t().requires_grad_(), at::randn({6}).to(at::kBFloat16).requires_grad_(),
          at::randn({300, 300}).requires_grad_()};
}
std::vector<at::Tensor> copies(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) {
    at::Tensor c = p.detach().clone(at::MemoryFormat::Preserve);
    out.push_back(c.requires_grad_());
  }
  return out;
}
}  // namespace

TEST_CASE("optim::Adam takes libtorch's Adam steps, parameter by parameter", "[optim]") {
  for (const double weight_decay : {0.0, 0.1}) {
    at::manual_seed(3);
    std::vector<at::Tensor> ours = make_params(), theirs = copies(ours);
    CHECK_FALSE(ours[2].is_contiguous());
    tensordict::optim::Adam adam(ours, {.lr = 0.01, .betas = {0.8, 0.99}, .eps = 1e-6, .weight_decay = weight_decay});
    torch::optim::Adam reference(theirs, torch::optim::AdamOptions(0.01).betas({0.8, 0.99}).eps(1e-6).weight_decay(weight_decay));
    for (int step = 1; step <= 6; ++step) {
      adam.zero_grad();
      for (auto& t : theirs) t.mutable_grad().reset();  // libtorch 1.13's zero_grad zeros them (2.x: none)
      for (std::size_t i = 0; i < ours.size(); ++i) {
        if (i == 1 && step == 3) continue;  // no gradient this step: skipped, its step count stays
        const at::Tensor g = at::randn(ours[i].sizes()).to(ours[i].scalar_type());
        ours[i].mutable_grad() = g.clone();
        theirs[i].mutable_grad() = g.clone();
      }
      adam.step();
      reference.step();
      for (std::size_t i = 0; i < ours.size(); ++i) {
        INFO("parameter " << i << ", step " << step << ", weight decay " << weight_decay);
        const double tolerance = ours[i].scalar_type() == at::kBFloat16 ? 0 : 1e-6;
        CHECK(at::allclose(ours[i].detach().to(at::kDouble), theirs[i].detach().to(at::kDouble), tolerance, tolerance));
      }
    }
    CHECK(adam.steps(0) == 6);
    CHECK(adam.steps(1) == 5);
    CHECK(ours[0].requires_grad());
    CHECK(ours[0].is_leaf());
  }
}

TEST_CASE("optim::Adam: the vector kernel computes the scalar form's values, NaN, infinities and subnormals included", "[optim]") {
  // 37 elements: four vectors of 8 and a scalar tail; the same step from every start, so that each
  // element is seen at every lane and in the tail.
  at::manual_seed(5);
  at::Tensor param = at::randn({37}), grad = at::randn({37}), m = at::randn({37}) * 0.1, v = at::rand({37});
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), -0.0f, std::numeric_limits<float>::denorm_min(), 1e-30f};
  for (int i = 0; i < 6; ++i) {
    grad[3 * i + 1] = specials[i];
    param[5 * i + 2] = specials[(i + 3) % 6];
    v[4 * i] = i % 2 ? 0.0f : std::numeric_limits<float>::denorm_min();
  }
  for (const bool decays : {false, true}) {
    const tensordict::optim::detail::adam_constants<float> c{0.9f, 0.1f, 0.999f, 0.001f, decays ? 0.01f : 0.0f, 1e-8f, 0.3f, -0.002f, decays};
    for (std::int64_t begin : {0, 3, 8, 29}) {
      INFO("elements from " << begin << (decays ? ", weight decay" : ""));
      at::Tensor p1 = param.clone(), m1 = m.clone(), v1 = v.clone(), p2 = param.clone(), m2 = m.clone(), v2 = v.clone();
      tensordict::optim::detail::adam_update(p1.data_ptr<float>(), grad.data_ptr<float>(), m1.data_ptr<float>(), v1.data_ptr<float>(), begin, 37, c);
      tensordict::optim::detail::adam_update_scalar(p2.data_ptr<float>(), grad.data_ptr<float>(), m2.data_ptr<float>(), v2.data_ptr<float>(),
                                                    begin, 37, c);
      // Bit for bit (NaN where NaN): equal() would call NaN unequal.
      for (const auto& [a, b] : {std::pair{p1, p2}, std::pair{m1, m2}, std::pair{v1, v2}})
        CHECK(std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), 37 * sizeof(float)) == 0);
      CHECK(std::memcmp(p1.data_ptr<float>(), param.data_ptr<float>(), begin * sizeof(float)) == 0);  // those before begin untouched
    }
  }
}

TEST_CASE("optim::Adam: zero_grad sets gradients to none; options are checked", "[optim]") {
  at::Tensor w = at::randn({3}).requires_grad_();
  tensordict::optim::Adam adam({w});
  (w * w).sum().backward();
  CHECK(w.grad().defined());
  adam.zero_grad();
  CHECK_FALSE(w.grad().defined());
  const at::Tensor before = w.detach().clone();
  adam.step();  // no gradient: nothing moves
  CHECK(w.equal(before));
  CHECK(adam.steps(0) == 0);
  CHECK_THROWS_WITH(tensordict::optim::Adam({w}, {.lr = -1}), Contains("lr must be >= 0, got -1"));
  CHECK_THROWS_WITH(tensordict::optim::Adam({w}, {.betas = {0.9, 1.0}}), Contains("betas must be in [0, 1)"));
  CHECK_THROWS_WITH(tensordict::optim::Adam({w * 2}), Contains("parameter 0 is not a leaf"));
}
