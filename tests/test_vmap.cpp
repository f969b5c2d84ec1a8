#include <stdexcept>

#include "catch_torch.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/functorch/DynamicLayer.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/stack.h>

#include <tensordict/nn/adapters/builtin.hpp>  // every family: the suite uses them all
#include <tensordict/functional.hpp>
#include <tensordict/vmap.hpp>

using namespace tensordict;
namespace tdn = tensordict::nn;
using test::Contains;

namespace {
at::Tensor loop(c10::IntArrayRef, std::int64_t n, auto&& f) {
  std::vector<at::Tensor> out;
  for (std::int64_t i = 0; i < n; ++i) out.push_back(f(i));
  return at::stack(out);
}
const c10::TensorImpl* tensor_impl(const at::Tensor& t) { return t.unsafeGetTensorImpl(); }
bool no_vmap_layer_left() { return !at::functorch::maybeCurrentDynamicLayer().has_value(); }
}  // namespace

TEST_CASE("vmap equals a loop", "[vmap]") {
  auto w = at::randn({4, 3, 5}), b = at::randn({4, 3}), x = at::randn({2, 5});
  auto linear = vmap([](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) { return at::linear(x, w, b); },
                     {std::nullopt, 0, 0});
  CHECK(linear(x, w, b).allclose(loop({}, 4, [&](std::int64_t i) { return at::linear(x, w[i], b[i]); }), 1e-4, 1e-6));

  auto kernels = at::randn({3, 2, 1, 3, 3}), images = at::randn({3, 4, 1, 8, 8});
  auto conv = vmap([](const at::Tensor& img, const at::Tensor& k) { return at::conv2d(img, k); });
  CHECK(conv(images, kernels).allclose(loop({}, 3, [&](std::int64_t i) { return at::conv2d(images[i], kernels[i]); }),
                                       1e-5, 1e-6));

  auto a = at::randn({6, 3}), m = at::randn({3, 6, 2});  // in_dim 1 on m
  auto mm = vmap([](const at::Tensor& a, const at::Tensor& m) { return at::matmul(a, m); }, {0, 1});
  // A batched product sums in another order than each row's: the tolerance of the other checks, not allclose's 1e-8.
  CHECK(mm(a, m).allclose(loop({}, 6, [&](std::int64_t i) { return at::matmul(a[i], m.select(1, i)); }), 1e-4, 1e-6));

  // Nested: an outer map over rows, an inner map over columns.
  auto grid = at::randn({3, 4});
  auto inner = vmap([](const at::Tensor& v) { return v * 2 + 1; });
  auto outer = vmap([&](const at::Tensor& row) { return inner(row); });
  CHECK(outer(grid).allclose(grid * 2 + 1, 1e-4, 1e-6));
  CHECK(no_vmap_layer_left());
}

TEST_CASE("gradients reach the stacked weights", "[vmap]") {
  auto w = at::randn({4, 3, 5}).requires_grad_();
  auto x = at::randn({2, 5});
  auto y = vmap([](const at::Tensor& x, const at::Tensor& w) { return at::linear(x, w); }, {std::nullopt, 0})(x, w);
  y.pow(2).sum().backward();
  auto w2 = w.detach().clone().requires_grad_();
  loop({}, 4, [&](std::int64_t i) { return at::linear(x, w2[i]); }).pow(2).sum().backward();
  CHECK(w.grad().allclose(w2.grad(), 1e-4, 1e-6));
}

TEST_CASE("a mapped TensorDict loses its batch dim inside and gets it back outside", "[vmap]") {
  using S = schema<leaf<"a">, node<"sub", leaf<"b">>>;
  TensorDict<S> td({at::randn({4, 2, 3}), at::randn({4, 2})}, {4, 2});
  std::vector<std::int64_t> inside;
  auto f = vmap([&](const TensorDict<S>& t) {
    inside.assign(t.batch_size().begin(), t.batch_size().end());
    return t.apply([](const at::Tensor& leaf) { return leaf * 2; });
  });
  auto out = f(td);
  CHECK(inside == std::vector<std::int64_t>{2});
  CHECK(out.batch_size() == c10::IntArrayRef({4, 2}));
  CHECK(out.get<"sub", "b">().allclose(td.get<"sub", "b">() * 2));

  auto over_second = vmap([](const TensorDict<S>& t) { return t.get<"a">().sum(); }, {1})(td);
  CHECK(over_second.sizes() == c10::IntArrayRef({2}));
  CHECK(over_second.allclose(td.get<"a">().sum(at::IntArrayRef({0, 2})), 1e-4, 1e-6));
}

TEST_CASE("the tutorial's vmap(call) with to_module inside", "[vmap]") {
  tdn::Sequential<torch::nn::Linear, torch::nn::ReLU, torch::nn::Linear> module(torch::nn::Linear(3, 4), torch::nn::ReLU(),
                                                                                 torch::nn::Linear(4, 1));
  auto params = from_module(module);
  auto zeros = params.detach().clone().zero_();
  auto stack3 = stack({zeros, params.detach().clone(), params});
  auto call = [&](const at::Tensor& x, const auto& p) {
    auto swap = to_module(p, module);
    return module->forward(x);
  };
  auto x = at::randn({3, 5, 3});
  auto y = vmap(call)(x, stack3);
  CHECK(y.sizes() == c10::IntArrayRef({3, 5, 1}));
  CHECK((y[0] == 0).all().item<bool>());
  CHECK(y[2].allclose(module->forward(x[2]), 1e-4, 1e-6));
  CHECK(tensor_impl(module->child<0>()->weight) == tensor_impl(params.get<"0", "weight">()));
}

TEST_CASE("tuple and vector outputs", "[vmap]") {
  auto x = at::randn({3, 4});
  auto both = vmap([](const at::Tensor& v) { return std::make_tuple(v.sum(), v * 2); })(x);
  CHECK(std::get<0>(both).allclose(x.sum(1), 1e-4, 1e-6));
  CHECK(std::get<1>(both).allclose(x * 2, 1e-4, 1e-6));
  auto many = vmap([](const at::Tensor& v) { return std::vector<at::Tensor>{v.max(), v.min()}; })(x);
  REQUIRE(many.size() == 2);
  CHECK(many[1].allclose(std::get<0>(x.min(1)), 1e-4, 1e-6));
  // An output that does not depend on the mapped input is expanded.
  auto constant = vmap([](const at::Tensor&) { return at::ones({2}); })(x);
  CHECK(constant.sizes() == c10::IntArrayRef({3, 2}));
}

TEST_CASE("randomness: error, different, same", "[vmap]") {
  auto x = at::ones({4, 100});
  auto drop = [](const at::Tensor& v) { return at::dropout(v, 0.5, true); };
  CHECK_THROWS(vmap(drop)(x));
  CHECK(no_vmap_layer_left());
  auto different = vmap(drop, {}, {.randomness = randomness::different})(x);
  CHECK(!different[0].equal(different[1]));
  auto same = vmap(drop, {}, {.randomness = randomness::same})(x);
  CHECK(same[0].equal(same[3]));
  auto same_chunked = vmap(drop, {}, {.randomness = randomness::same, .chunk_size = 1})(x);
  CHECK(same_chunked[0].equal(same_chunked[3]));
}

TEST_CASE("chunk_size gives the same result", "[vmap]") {
  auto w = at::randn({7, 3, 5}), x = at::randn({2, 5});
  auto f = [](const at::Tensor& x, const at::Tensor& w) { return at::linear(x, w); };
  auto whole = vmap(f, {std::nullopt, 0})(x, w);
  for (std::int64_t chunk : {1, 2, 3, 7, 10})
    CHECK(vmap(f, {std::nullopt, 0}, {.chunk_size = chunk})(x, w).allclose(whole, 1e-4, 1e-6));
  using S = schema<leaf<"w">>;
  TensorDict<S> td({w}, {7});
  auto td_out = vmap([](const TensorDict<S>& t) { return t.apply([](const at::Tensor& l) { return l + 1; }); }, {0},
                     {.chunk_size = 3})(td);
  CHECK(td_out.batch_size() == c10::IntArrayRef({7}));
  CHECK(td_out.get<"w">().allclose(w + 1, 1e-4, 1e-6));
}

TEST_CASE("a throw inside vmap pops the layer", "[vmap]") {
  auto x = at::randn({3, 2});
  CHECK_THROWS_WITH(vmap([](const at::Tensor&) -> at::Tensor { throw std::runtime_error("inside"); })(x), "inside");
  CHECK(no_vmap_layer_left());
  CHECK(vmap([](const at::Tensor& v) { return v + 1; })(x).allclose(x + 1, 1e-4, 1e-6));
}

TEST_CASE("vmap errors name the arguments and sizes", "[vmap]") {
  auto f = [](const at::Tensor& a, const at::Tensor& b) { return a + b; };
  CHECK_THROWS_WITH(vmap(f)(at::randn({3, 2}), at::randn({4, 2})),
                    Contains("argument 0 has size 3") && Contains("argument 1 has size 4"));
  CHECK_THROWS_AS(vmap(f)(at::randn({3, 2}), at::randn({4, 2})), shape_error);
  CHECK_THROWS_AS(vmap(f, {2, 0})(at::randn({3, 2}), at::randn({3, 2})), index_error);
  CHECK_THROWS_WITH(vmap(f, {std::nullopt, std::nullopt})(at::randn({3}), at::randn({3})), Contains("no argument is mapped"));
  CHECK(no_vmap_layer_left());
}
