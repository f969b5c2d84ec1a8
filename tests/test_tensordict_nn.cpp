// tensordict.nn's key-wired modules: ProbabilisticTensorDictModule and the
// interaction types, against the policies tensordict 0.4 saved
// (tests/data/tensordict-v0.4-nn; each folder's spec.json says what made it).
#include <string>
#include <thread>
#include <vector>

#include "catch_torch.hpp"
#include "test_helpers.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd.h>

#include <tensordict/memmap.hpp>
#include <tensordict/probabilistic.hpp>

using namespace tensordict;
namespace tdn = tensordict::nn;
using test::Contains;

namespace {

bool near(const at::Tensor& ours, const at::Tensor& python) {
  INFO("ours " << describe(ours) << ", Python's " << describe(python));
  return ours.sizes() == python.sizes() && ours.scalar_type() == python.scalar_type() &&
         at::allclose(ours, python, 1e-6, 1e-7);
}

std::string nn_fixture(const std::string& name) { return test::test_data("tensordict-v0.4-nn/" + name + "/"); }

using loc_scale = schema<leaf<"loc">, leaf<"scale">>;

}  // namespace

TEST_CASE("ProbabilisticTensorDictModule writes tensordict 0.4's action and sample_log_prob", "[tensordict_nn]") {
  SECTION("OneHotCategorical from logits, mode") {
    const auto out = load_memmap(nn_fixture("categorical_policy") + "output_mode");
    TensorDict<schema<leaf<"logits">>> td({out.get("logits")}, {5});
    tdn::ProbabilisticTensorDictModule<tdn::OneHotCategorical, tdn::in_keys<"logits">, tdn::out_keys<"action">,
                                       tdn::log_prob_key<"sample_log_prob">>
        head;
    const auto result = head(td);
    CHECK(result.get<"action">().equal(out.get("action")));
    CHECK(near(result.get<"sample_log_prob">(), out.get("sample_log_prob")));
    CHECK(test::impl(result.get<"logits">()) == test::impl(td.get<"logits">()));
  }
  SECTION("TruncatedNormal with its bounds, mean (0.4 refuses its mode)") {
    const auto out = load_memmap(nn_fixture("truncated_normal") + "output_mean");
    TensorDict<loc_scale> td({out.get("loc"), out.get("scale")}, {5});
    tdn::ProbabilisticTensorDictModule<tdn::TruncatedNormal, tdn::in_keys<"scale", "loc">, tdn::out_keys<"action">,
                                       tdn::log_prob_key<"sample_log_prob">>
        head({.distribution = {.a = -1.0, .b = 1.0}});
    tdn::set_interaction_type mean(tdn::interaction_type::mean);
    const auto result = head(td);
    CHECK(near(result.get<"action">(), out.get("action")));
    CHECK(near(result.get<"sample_log_prob">(), out.get("sample_log_prob")));
  }
  SECTION("Independent(Normal, 1), Delta, Categorical") {
    const auto indep = load_memmap(nn_fixture("independent_normal_policy") + "output_mode");
    TensorDict<loc_scale> td({indep.get("loc"), indep.get("scale")}, {5});
    tdn::ProbabilisticTensorDictModule<tdn::independent<tdn::Normal, 1>, tdn::in_keys<"loc", "scale">,
                                       tdn::out_keys<"action">, tdn::log_prob_key<"sample_log_prob">>
        head;
    const auto result = head(td);
    CHECK(near(result.get<"action">(), indep.get("agents", "action")));
    CHECK(near(result.get<"sample_log_prob">(), indep.get("sample_log_prob")));

    const auto delta = load_memmap(nn_fixture("delta") + "output_mode");
    tdn::ProbabilisticTensorDictModule<tdn::Delta, tdn::in_keys<"param">, tdn::out_keys<"action">,
                                       tdn::log_prob_key<"sample_log_prob">>
        delta_head;
    const auto delta_out = delta_head(TensorDict<schema<leaf<"param">>>({delta.get("param")}, {5}));
    CHECK(delta_out.get<"action">().equal(delta.get("action")));
    CHECK(delta_out.get<"sample_log_prob">().equal(delta.get("sample_log_prob")));

    const auto cat = load_memmap(nn_fixture("categorical_policy_torch_categorical") + "output_mode");
    tdn::ProbabilisticTensorDictModule<tdn::Categorical, tdn::in_keys<"logits">, tdn::out_keys<"action">> cat_head;
    const auto cat_out = cat_head(TensorDict<schema<leaf<"logits">>>({cat.get("logits")}, {5}));
    CHECK(cat_out.get<"action">().equal(cat.get("action")));
    STATIC_REQUIRE(std::remove_cvref_t<decltype(cat_out)>::schema_t::leaf_count == 2);  // no log-prob key asked for
  }
}

TEST_CASE("interaction types: the guard's per thread, else the module's default; random draws rsample", "[tensordict_nn]") {
  auto loc = at::zeros({4, 3}).requires_grad_();
  TensorDict<loc_scale> td({loc, at::ones({4, 3})}, {4});
  tdn::ProbabilisticTensorDictModule<tdn::Normal, tdn::in_keys<"loc", "scale">, tdn::out_keys<"action">,
                                     tdn::log_prob_key<"sample_log_prob">>
      head;
  CHECK(head->interaction() == tdn::interaction_type::mode);
  CHECK(head(td).get<"action">().equal(loc));
  {
    tdn::set_interaction_type random(tdn::interaction_type::random);
    CHECK(head->interaction() == tdn::interaction_type::random);
    const auto drawn = head(td).get<"action">();
    CHECK_FALSE(drawn.equal(loc));
    // rsample: gradients reach loc.
    CHECK(torch::autograd::grad({drawn.sum()}, {loc})[0].equal(at::ones({4, 3})));
    {
      tdn::set_interaction_type inner(tdn::interaction_type::mean);
      CHECK(head->interaction() == tdn::interaction_type::mean);
    }
    CHECK(head->interaction() == tdn::interaction_type::random);
    // Another thread has its own (none set there).
    tdn::interaction_type other{};
    std::thread([&] { other = head->interaction(); }).join();
    CHECK(other == tdn::interaction_type::mode);
  }
  CHECK(head->interaction() == tdn::interaction_type::mode);
  tdn::ProbabilisticTensorDictModule<tdn::Bernoulli, tdn::in_keys<"logits">, tdn::out_keys<"action">> coin(
      {.default_interaction_type = tdn::interaction_type::random});
  const auto flips = coin(TensorDict<schema<leaf<"logits">>>({at::zeros({1000})}, {1000})).get<"action">();
  CHECK_FALSE(flips.requires_grad());  // no rsample: sample
  CHECK(flips.sum().item<float>() > 400);
  CHECK(flips.sum().item<float>() < 600);

  // log_prob(td) of the value at the out key; get_dist.
  const auto out = head(td);
  CHECK(head->log_prob(out).equal(out.get<"sample_log_prob">()));
  CHECK(head->get_dist(td).batch_shape() == std::vector<int64_t>{4, 3});
}
