// tensordict::optim::Adam against libtorch's torch::optim::Adam: the same
// parameters and moments step by step, one-pass and fallback paths.
#include "catch_torch.hpp"
#include "test_helpers.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/randn.h>
#include <torch/optim/adam.h>

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
