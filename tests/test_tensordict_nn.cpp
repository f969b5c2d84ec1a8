// tensordict.nn's key-wired modules: ProbabilisticTensorDictModule, the
// interaction types and TensorDictSequential, against the policies tensordict 0.4 saved
// (tests/data/tensordict-v0.4-nn; each folder's spec.json says what made it).
#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "catch_torch.hpp"
#include "test_helpers.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd.h>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>

#include <tensordict/nn/composite_distribution.hpp>
#include <tensordict/files/torch_save.hpp>
#include <tensordict/functional_call.hpp>
#include <tensordict/files/memmap.hpp>
#include <tensordict/nn/distribution_params.hpp>
#include <tensordict/nn/probabilistic.hpp>
#include <tensordict/nn/tensordict_sequential.hpp>
#include <tensordict/to_module.hpp>

using namespace tensordict;
namespace tdn = tensordict::nn;
using test::Contains;

namespace {

using loc_scale = schema<leaf<"loc">, leaf<"scale">>;

// Every key of Python's output, in its order, with its shape, dtype and value (1e-6 relative).
void check_matches_python(const AnyTensorDict& ours, const AnyTensorDict& python) {
  CHECK(ours.keys(true, true) == python.keys(true, true));
  for (const auto& k : python.keys(true, true)) {
    INFO(to_string(k));
    CHECK(test::near_python(ours.get(k), python.get(k)));
  }
}

}  // namespace

TEST_CASE("ProbabilisticTensorDictModule writes tensordict 0.4's action and sample_log_prob", "[tensordict_nn]") {
  SECTION("OneHotCategorical from logits, mode") {
    const auto out = load_memmap(test::nn_fixture("categorical_policy") + "output_mode");
    TensorDict<schema<leaf<"logits">>> td({out.get("logits")}, {5});
    tdn::ProbabilisticTensorDictModule<tdn::OneHotCategorical, tdn::in_keys<"logits">, tdn::out_keys<"action">,
                                       tdn::log_prob_key<"sample_log_prob">>
        head;
    const auto result = head(td);
    CHECK(result.get<"action">().equal(out.get("action")));
    CHECK(test::near_python(result.get<"sample_log_prob">(), out.get("sample_log_prob")));
    CHECK(test::impl(result.get<"logits">()) == test::impl(td.get<"logits">()));
  }
  SECTION("TruncatedNormal with its bounds, mean (0.4 refuses its mode)") {
    const auto out = load_memmap(test::nn_fixture("truncated_normal") + "output_mean");
    TensorDict<loc_scale> td({out.get("loc"), out.get("scale")}, {5});
    tdn::ProbabilisticTensorDictModule<tdn::TruncatedNormal, tdn::in_keys<"scale", "loc">, tdn::out_keys<"action">,
                                       tdn::log_prob_key<"sample_log_prob">>
        head({.distribution = {.a = -1.0, .b = 1.0}});
    tdn::set_interaction_type mean(tdn::interaction_type::mean);
    const auto result = head(td);
    CHECK(test::near_python(result.get<"action">(), out.get("action")));
    CHECK(test::near_python(result.get<"sample_log_prob">(), out.get("sample_log_prob")));
  }
  SECTION("Independent(Normal, 1), Delta, Categorical") {
    const auto indep = load_memmap(test::nn_fixture("independent_normal_policy") + "output_mode");
    TensorDict<loc_scale> td({indep.get("loc"), indep.get("scale")}, {5});
    tdn::ProbabilisticTensorDictModule<tdn::independent<tdn::Normal, 1>, tdn::in_keys<"loc", "scale">,
                                       tdn::out_keys<"action">, tdn::log_prob_key<"sample_log_prob">>
        head;
    const auto result = head(td);
    CHECK(test::near_python(result.get<"action">(), indep.get("agents", "action")));
    CHECK(test::near_python(result.get<"sample_log_prob">(), indep.get("sample_log_prob")));

    const auto delta = load_memmap(test::nn_fixture("delta") + "output_mode");
    tdn::ProbabilisticTensorDictModule<tdn::Delta, tdn::in_keys<"param">, tdn::out_keys<"action">,
                                       tdn::log_prob_key<"sample_log_prob">>
        delta_head;
    const auto delta_out = delta_head(TensorDict<schema<leaf<"param">>>({delta.get("param")}, {5}));
    CHECK(delta_out.get<"action">().equal(delta.get("action")));
    CHECK(delta_out.get<"sample_log_prob">().equal(delta.get("sample_log_prob")));

    const auto cat = load_memmap(test::nn_fixture("categorical_policy_torch_categorical") + "output_mode");
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

// MEAN as Python's module computes it: the distribution's mean, else (no closed form: TanhNormal) the mean of
// n_empirical_estimate draws; a Categorical's mean (NaN, no class index) is refused with value_error (the NaN
// was cast to an index: c10::Error "index -9223372036854775808 is out of bounds").
TEST_CASE("interaction_type::mean: estimated where there is no closed form, refused where it is no value", "[tensordict_nn]") {
  const auto loc = at::tensor({-0.5, 0.0, 2.0}).unsqueeze(0).expand({4, 3}).contiguous();
  TensorDict<loc_scale> td({loc, at::full({4, 3}, 0.1)}, {4});
  tdn::set_interaction_type mean(tdn::interaction_type::mean);
  tdn::ProbabilisticTensorDictModule<tdn::TanhNormal, tdn::in_keys<"loc", "scale">, tdn::out_keys<"action">> tanh_head(
      {.n_empirical_estimate = 500});
  at::manual_seed(3);
  const auto action = tanh_head(td).get<"action">();
  at::manual_seed(3);
  const auto expected = tanh_head->get_dist(td).rsample({500}).mean(0);
  CHECK(action.equal(expected));
  CHECK(action.allclose(loc.tanh(), 0, 0.05));  // narrow scales: near tanh(loc)

  using logits_only = schema<leaf<"logits">>;
  const TensorDict<logits_only> scores({at::randn({4, 5})}, {4});
  tdn::ProbabilisticTensorDictModule<tdn::Categorical, tdn::in_keys<"logits">, tdn::out_keys<"action">,
                                     tdn::log_prob_key<"sample_log_prob">>
      categorical;
  CHECK_THROWS_AS(categorical(scores), value_error);
  CHECK_THROWS_WITH(categorical(scores), Contains("interaction_type::mean has no value for Categorical(batch_shape=[4]"));
  tdn::ProbabilisticTensorDictModule<tdn::OneHotCategorical, tdn::in_keys<"logits">, tdn::out_keys<"action">> one_hot;
  CHECK_THROWS_WITH(one_hot(scores), Contains("interaction_type::mean has no value for OneHotCategorical"));
  tdn::AnyProbabilisticTensorDictModule any_head(tdn::distribution_builder::of<tdn::Categorical>(), {{"logits", {"logits"}}},
                                                 {"action"});
  CHECK_THROWS_WITH(any_head(AnyTensorDict(scores)), Contains("interaction_type::mean has no value for Categorical"));
}

// ---- TensorDictSequential ---------------------------------------------------------

namespace {

using mlp_4_16_3 = tdn::Sequential<torch::nn::Linear, torch::nn::Tanh, torch::nn::Linear>;
mlp_4_16_3 mlp(int64_t in, int64_t hidden, int64_t out) {
  return mlp_4_16_3(torch::nn::Linear(in, hidden), torch::nn::Tanh(), torch::nn::Linear(hidden, out));
}

// Python's parameters, loaded by name into the policy's typed schema, and its state dict's names.
template <class Policy>
auto python_params(Policy& policy, const std::string& dir) {
  using S = tdn::schema_of<typename Policy::Impl>;
  auto params = load_memmap<S>(dir + "params");
  const auto state_dict = load(dir + "state_dict.pt");
  std::vector<std::string> ours, python;
  for (const auto& p : policy->named_parameters()) ours.push_back(p.key());
  state_dict.for_each_leaf([&](const any_key_path& path, const at::Tensor&) { python.push_back(path.front()); });
  std::sort(ours.begin(), ours.end());
  std::sort(python.begin(), python.end());
  CHECK(ours == python);
  return params;
}

}  // namespace

TEST_CASE("TensorDictSequential policies load Python's parameters by name and give its outputs", "[tensordict_nn]") {
  using obs_only = schema<leaf<"observation">>;
  SECTION("categorical policy: MLP -> logits -> OneHotCategorical") {
    const auto dir = test::nn_fixture("categorical_policy");
    using net_t = tdn::TensorDictModule<mlp_4_16_3, tdn::in_keys<"observation">, tdn::out_keys<"logits">>;
    using head_t = tdn::ProbabilisticTensorDictModule<tdn::OneHotCategorical, tdn::in_keys<"logits">, tdn::out_keys<"action">,
                                                      tdn::log_prob_key<"sample_log_prob">>;
    tdn::ProbabilisticTensorDictSequential<net_t, head_t> policy(net_t(mlp(4, 16, 3)), head_t());
    STATIC_REQUIRE(std::is_same_v<decltype(policy)::Impl::in_keys_t, tdn::in_keys<"observation">>);
    STATIC_REQUIRE(std::is_same_v<decltype(policy)::Impl::out_keys_t, tdn::out_keys<"logits", "action", "sample_log_prob">>);
    const auto params = python_params(policy, dir);
    TensorDict<obs_only> td({load_memmap(dir + "input").get("observation")}, {5});
    const auto expected = load_memmap(dir + "output_mode");
    auto swap = to_module(params, policy);
    const auto out = policy(td);
    CHECK(test::near_python(out.get<"logits">(), expected.get("logits")));
    CHECK(out.get<"action">().equal(expected.get("action")));
    CHECK(test::near_python(out.get<"sample_log_prob">(), expected.get("sample_log_prob")));

    // Python's policy.get_dist(input): the MLP runs, then the head builds its distribution.
    const auto values = load_memmap(dir + "dist_values");
    const auto fixed = load_memmap(dir + "fixed_action").get("action");
    const auto dist = policy->get_dist(td);
    CHECK(test::near_python(dist.log_prob(fixed), values.get("log_prob")));
    CHECK(test::near_python(dist.entropy(), values.get("entropy")));
    TensorDict<schema<leaf<"observation">, leaf<"action">>> with_action({td.get<"observation">(), fixed}, {5});
    CHECK(test::near_python(policy->log_prob(with_action), values.get("log_prob")));
  }
  SECTION("Delta and TruncatedNormal policies, through functional_call") {
    const auto delta_dir = test::nn_fixture("delta");
    using delta_net = tdn::TensorDictModule<mlp_4_16_3, tdn::in_keys<"observation">, tdn::out_keys<"param">>;
    using delta_head = tdn::ProbabilisticTensorDictModule<tdn::Delta, tdn::in_keys<"param">, tdn::out_keys<"action">,
                                                          tdn::log_prob_key<"sample_log_prob">>;
    tdn::TensorDictSequential<delta_net, delta_head> delta(delta_net(mlp(4, 16, 2)), delta_head());
    const auto delta_out = functional_call(delta, python_params(delta, delta_dir),
                                           TensorDict<obs_only>({load_memmap(delta_dir + "input").get("observation")}, {5}));
    const auto delta_expected = load_memmap(delta_dir + "output_mode");
    CHECK(test::near_python(delta_out.get<"action">(), delta_expected.get("action")));
    CHECK(delta_out.get<"sample_log_prob">().equal(delta_expected.get("sample_log_prob")));

    const auto dir = test::nn_fixture("truncated_normal");
    using net_t = tdn::TensorDictModule<mlp_4_16_3, tdn::in_keys<"observation">, tdn::out_keys<"param">>;
    using extractor_t = tdn::TensorDictModule<tdn::NormalParamExtractor, tdn::in_keys<"param">, tdn::out_keys<"loc", "scale">>;
    using head_t = tdn::ProbabilisticTensorDictModule<tdn::TruncatedNormal, tdn::in_keys<"loc", "scale">, tdn::out_keys<"action">,
                                                      tdn::log_prob_key<"sample_log_prob">>;
    tdn::TensorDictSequential<net_t, extractor_t, head_t> policy(net_t(mlp(4, 32, 8)), extractor_t(tdn::NormalParamExtractor()),
                                                                 head_t({.distribution = {.a = -1.0, .b = 1.0}}));
    tdn::set_interaction_type mean(tdn::interaction_type::mean);
    const auto out = functional_call(policy, python_params(policy, dir),
                                     TensorDict<obs_only>({load_memmap(dir + "input").get("observation")}, {5}));
    const auto expected = load_memmap(dir + "output_mean");
    for (const char* k : {"param", "loc", "scale", "action", "sample_log_prob"}) {
      INFO(k);
      CHECK(test::near_python(AnyTensorDict(out).get(k), expected.get(k)));
    }
  }
}

// The modules of the sequential_keys fixture (make.py's TwoHeads and CatLinear).
struct TwoHeadsImpl : torch::nn::Module {
  torch::nn::Linear l1{nullptr}, l2{nullptr};
  TwoHeadsImpl() : l1(register_module("l1", torch::nn::Linear(3, 4))), l2(register_module("l2", torch::nn::Linear(3, 2))) {}
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x) { return {l1(x).tanh(), l2(x)}; }
};
TORCH_MODULE(TwoHeads);
TENSORDICT_MODULE(TwoHeadsImpl, l1, l2);

struct CatLinearImpl : torch::nn::Module {
  torch::nn::Linear lin{nullptr};
  CatLinearImpl() : lin(register_module("lin", torch::nn::Linear(7, 2))) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& z) { return lin(at::cat({x, z}, -1)); }
};
TORCH_MODULE(CatLinear);
TENSORDICT_MODULE(CatLinearImpl, lin);

TEST_CASE("TensorDictSequential: nested keys, keys computed at compile time, several out keys, select_subsequence as "
          "Python's", "[tensordict_nn]") {
  // tensordict 0.4's sequential_keys, with its nested keys.
  using tensordict::nested_key;
  using m0_t = tdn::TensorDictModule<TwoHeads, tdn::in_keys<nested_key<"obs", "a">>,
                                     tdn::out_keys<nested_key<"hidden", "x">, nested_key<"hidden", "y">>>;
  using m1_t = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<nested_key<"obs", "b">>, tdn::out_keys<nested_key<"other", "z">>>;
  using m2_t = tdn::TensorDictModule<CatLinear, tdn::in_keys<nested_key<"hidden", "x">, nested_key<"other", "z">>, tdn::out_keys<"out">>;
  using seq_t = tdn::TensorDictSequential<m0_t, m1_t, m2_t>;
  seq_t seq(m0_t(TwoHeads()), m1_t(torch::nn::Linear(2, 3)), m2_t(CatLinear()));
  STATIC_REQUIRE(std::is_same_v<seq_t::Impl::in_keys_t, tdn::in_keys<nested_key<"obs", "a">, nested_key<"obs", "b">>>);
  STATIC_REQUIRE(std::is_same_v<seq_t::Impl::out_keys_t, tdn::out_keys<nested_key<"hidden", "x">, nested_key<"hidden", "y">,
                                                                        nested_key<"other", "z">, "out">>);

  const auto dir = test::nn_fixture("sequential_keys");
  const auto params = python_params(seq, dir);
  CHECK(params.get<"module", "0", "module", "l1", "weight">().sizes() == at::IntArrayRef{4, 3});
  auto swap = to_module(params, seq);
  const auto input = load_memmap(dir + "input");
  using obs = schema<node<"obs", leaf<"a">, leaf<"b">>>;
  TensorDict<obs> td({input.get("obs", "a"), input.get("obs", "b")}, {5});

  const auto out = seq(td);
  STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(out)>::schema_t,
                                schema<node<"obs", leaf<"a">, leaf<"b">>, node<"hidden", leaf<"x">, leaf<"y">>,
                                       node<"other", leaf<"z">>, leaf<"out">>>);
  check_matches_python(AnyTensorDict(out), load_memmap(dir + "output"));
  CHECK(out.get<"obs", "a">().is_same(td.get<"obs", "a">()));

  // (a) out_keys=[hidden.y]: the first module alone, shared with the sequence.
  auto sub_a = seq->select_subsequence<void, tdn::out_keys<nested_key<"hidden", "y">>>();
  STATIC_REQUIRE(std::is_same_v<decltype(sub_a), tdn::TensorDictSequential<m0_t>>);
  CHECK(sub_a->child<0>().get() == seq->child<0>().get());
  check_matches_python(AnyTensorDict(sub_a(td)), load_memmap(dir + "subseq_a_output"));
  // (b) in_keys=[obs.b, hidden.x], out_keys=[out]: the second and third.
  auto sub_b = seq->select_subsequence<tdn::in_keys<nested_key<"obs", "b">, nested_key<"hidden", "x">>, tdn::out_keys<"out">>();
  STATIC_REQUIRE(std::is_same_v<decltype(sub_b), tdn::TensorDictSequential<m1_t, m2_t>>);
  const auto b_input = load_memmap(dir + "subseq_b_input");
  using b_schema = schema<node<"obs", leaf<"b">>, node<"hidden", leaf<"x">>>;
  check_matches_python(AnyTensorDict(sub_b(b_input.to_typed<b_schema>())), load_memmap(dir + "subseq_b_output"));
  // (c) in_keys=[obs.b]: the second alone.
  auto sub_c = seq->select_subsequence<tdn::in_keys<nested_key<"obs", "b">>>();
  STATIC_REQUIRE(std::is_same_v<decltype(sub_c), tdn::TensorDictSequential<m1_t>>);
  check_matches_python(AnyTensorDict(sub_c(td)), load_memmap(dir + "subseq_c_output"));

  // select_out_keys: the input's keys and the selected out keys (Python's select_out_keys_output).
  auto selected = seq->select_out_keys<"out", nested_key<"hidden", "y">>();
  STATIC_REQUIRE(std::is_same_v<decltype(selected)::Impl::out_keys_t, tdn::out_keys<"out", nested_key<"hidden", "y">>>);
  const auto sel_out = selected(td);
  STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(sel_out)>::schema_t,
                                schema<node<"obs", leaf<"a">, leaf<"b">>, leaf<"out">, node<"hidden", leaf<"y">>>>);
  check_matches_python(AnyTensorDict(sel_out), load_memmap(dir + "select_out_keys_output"));
  CHECK(tdn::unique_parameters(*selected).size() == tdn::unique_parameters(*seq).size());
  CHECK(from_module(selected).get<"module", "0", "module", "l1", "weight">().is_same(params.get<"module", "0", "module", "l1", "weight">()));
  CHECK(at::allclose(functional_call(selected, params, td).get<"out">(), sel_out.get<"out">()));

  // A sequence inside a sequence: the same outputs, Python's nested names.
  using inner_t = tdn::TensorDictSequential<m0_t, m1_t>;
  tdn::TensorDictSequential<inner_t, m2_t> nested(inner_t(seq->child<0>(), seq->child<1>()), seq->child<2>());
  STATIC_REQUIRE(std::is_same_v<decltype(nested)::Impl::in_keys_t, tdn::in_keys<nested_key<"obs", "a">, nested_key<"obs", "b">>>);
  check_matches_python(AnyTensorDict(nested(td)), load_memmap(dir + "output"));
  CHECK(from_module(nested).flatten_keys().get<"module.0.module.0.module.l1.weight">().is_same(params.get<"module", "0", "module", "l1", "weight">()));

  // As a TensorDictParams (Python's TensorDictParams(TensorDict.from_module(seq))): the same tensors, Python's names.
  const auto as_params = from_module(seq, tdn::as_module);
  CHECK(as_params->named_parameters()["module.0.module.l1.weight"].is_same(params.get<"module", "0", "module", "l1", "weight">()));

  // Gradients reach the parameters through functional_call.
  auto trained = from_module(seq).apply([](const at::Tensor& t) { return t.detach().clone().requires_grad_(); });
  const auto y = functional_call(seq, trained, td).get<"out">();
  const auto grads = torch::autograd::grad({y.sum()}, {trained.get<"module", "0", "module", "l1", "weight">()});
  CHECK(grads[0].abs().sum().item<float>() > 0);
}

TEST_CASE("TensorDictSequential: two modules may write one key, the later one's value stays (as Python)", "[tensordict_nn]") {
  using first_t = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<"x">, tdn::out_keys<"y">>;
  using again_t = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<"y">, tdn::out_keys<"y">>;
  tdn::TensorDictSequential<first_t, again_t> seq(first_t(torch::nn::Linear(3, 2)), again_t(torch::nn::Linear(2, 2)));
  STATIC_REQUIRE(std::is_same_v<decltype(seq)::Impl::in_keys_t, tdn::in_keys<"x">>);
  STATIC_REQUIRE(std::is_same_v<decltype(seq)::Impl::out_keys_t, tdn::out_keys<"y">>);
  TensorDict<schema<leaf<"x">>> td({at::randn({4, 3})}, {4});
  const auto out = seq(td);
  STATIC_REQUIRE(std::remove_cvref_t<decltype(out)>::schema_t::leaf_count == 2);
  CHECK(at::allclose(out.get<"y">(), seq->child<1>()->module(seq->child<0>()->module(td.get<"x">()))));
}

// ---- run-time twins -----------------------------------------------------------

namespace {
std::vector<std::string> parameter_names(torch::nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& p : m.named_parameters()) out.push_back(p.key());
  std::sort(out.begin(), out.end());
  return out;
}
std::vector<std::string> state_dict_names(const std::string& dir) {
  std::vector<std::string> out;
  load(dir + "state_dict.pt", {.skip_non_tensors = true}).for_each_leaf([&](const any_key_path& path, const at::Tensor&) { out.push_back(path.front()); });
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

TEST_CASE("typed nested keys give tensordict 0.4's Gaussian policy, outputs and get_dist", "[tensordict_nn]") {
  using tensordict::nested_key;
  using mlp_t = tdn::Sequential<torch::nn::Linear, torch::nn::Tanh, torch::nn::Linear, torch::nn::Tanh, torch::nn::Linear>;
  using net_t = tdn::TensorDictModule<mlp_t, tdn::in_keys<nested_key<"agents", "observation">>, tdn::out_keys<"param">>;
  using extractor_t = tdn::TensorDictModule<tdn::NormalParamExtractor, tdn::in_keys<"param">, tdn::out_keys<"loc", "scale">>;
  using head_t = tdn::ProbabilisticTensorDictModule<tdn::Normal, tdn::in_keys<"loc", "scale">,
                                                    tdn::out_keys<nested_key<"agents", "action">>, tdn::log_prob_key<"sample_log_prob">>;
  tdn::ProbabilisticTensorDictSequential<net_t, extractor_t, head_t> policy(
      net_t(mlp_t(torch::nn::Linear(4, 32), torch::nn::Tanh(), torch::nn::Linear(32, 32), torch::nn::Tanh(), torch::nn::Linear(32, 8))),
      extractor_t(tdn::NormalParamExtractor()), head_t());
  const auto dir = test::nn_fixture("gaussian_policy");
  auto swap = to_module(python_params(policy, dir), policy);
  using input_t = schema<node<"agents", leaf<"observation">>>;
  const auto input = load_memmap(dir + "input").to_typed<input_t>();
  for (const auto& [folder, type] : {std::pair{"output_mode", tdn::interaction_type::mode},
                                     std::pair{"output_mean", tdn::interaction_type::mean}}) {
    tdn::set_interaction_type guard(type);
    INFO(folder);
    check_matches_python(AnyTensorDict(policy(input)), load_memmap(dir + folder));
  }
  const auto values = load_memmap(dir + "dist_values");
  TensorDict<schema<node<"agents", leaf<"observation">, leaf<"action">>>> with_action(
      {input.get<"agents", "observation">(), load_memmap(dir + "fixed_action").get("action")}, {5});
  CHECK(test::near_python(policy->log_prob(with_action), values.get("log_prob")));
  CHECK(test::near_python(policy->get_dist(input).entropy(), values.get("entropy")));
}

// A typed head that reads its parameters from other keys, as Python's dict in_keys ({"loc": ("agents", "robot",
// "mu"), ...}: param_keys) and list of nested keys (by their last part) do: the policy still ends a
// ProbabilisticTensorDictSequential, has a schema (from_module, functional_call, load_memmap<S>) and get_dist,
// and gives Python's Gaussian policy's values (only the keys of loc and scale differ).
TEST_CASE("typed probabilistic heads read their parameters from other keys (Python's dict in_keys)", "[tensordict_nn]") {
  using tensordict::nested_key;
  using mlp_t = tdn::Sequential<torch::nn::Linear, torch::nn::Tanh, torch::nn::Linear, torch::nn::Tanh, torch::nn::Linear>;
  using net_t = tdn::TensorDictModule<mlp_t, tdn::in_keys<nested_key<"agents", "observation">>, tdn::out_keys<"param">>;
  constexpr auto mu = nested_key<"agents", "robot", "mu">;
  constexpr auto sigma = nested_key<"agents", "robot", "sigma">;
  using extractor_t = tdn::TensorDictModule<tdn::NormalParamExtractor, tdn::in_keys<"param">, tdn::out_keys<mu, sigma>>;
  using head_t = tdn::ProbabilisticTensorDictModule<tdn::Normal, tdn::param_keys<tdn::param<"scale", sigma>, tdn::param<"loc", mu>>,
                                                    tdn::out_keys<nested_key<"agents", "action">>, tdn::log_prob_key<"sample_log_prob">>;
  tdn::ProbabilisticTensorDictSequential<net_t, extractor_t, head_t> policy(
      net_t(mlp_t(torch::nn::Linear(4, 32), torch::nn::Tanh(), torch::nn::Linear(32, 32), torch::nn::Tanh(), torch::nn::Linear(32, 8))),
      extractor_t(tdn::NormalParamExtractor()), head_t());
  const auto dir = test::nn_fixture("gaussian_policy");
  const auto params = python_params(policy, dir);  // load_memmap<schema_of<...>>: the sequence has a schema
  using input_t = schema<node<"agents", leaf<"observation">>>;
  const auto input = load_memmap(dir + "input").to_typed<input_t>();
  const auto python = load_memmap(dir + "output_mode");
  const auto out = functional_call(policy, params, input);
  CHECK(test::near_python(out.get<"agents", "robot", "mu">(), python.get("loc")));
  CHECK(test::near_python(out.get<"agents", "action">(), python.get("agents", "action")));
  CHECK(test::near_python(out.get<"sample_log_prob">(), python.get("sample_log_prob")));
  auto swap = to_module(params, policy);
  CHECK(test::near_python(policy->get_dist(input).entropy(), load_memmap(dir + "dist_values").get("entropy")));
  CHECK(test::near_python(policy(input).get<"agents", "action">(), python.get("agents", "action")));

  // A list of nested keys feeds the parameters by their last part (Python's rule).
  using by_last_part = tdn::ProbabilisticTensorDictModule<tdn::Normal, tdn::in_keys<nested_key<"agents", "scale">, nested_key<"agents", "loc">>,
                                                          tdn::out_keys<"action">>;
  using nested_input = schema<node<"agents", leaf<"loc">, leaf<"scale">>>;
  const TensorDict<nested_input> nested_td({at::randn({3, 2}), at::rand({3, 2}) + 0.5}, {3});
  const auto dist = by_last_part().ptr()->get_dist(nested_td);
  CHECK(dist.loc().equal(nested_td.get<"agents", "loc">()));
  CHECK(dist.scale().equal(nested_td.get<"agents", "scale">()));
}

TEST_CASE("run-time twins with nested keys give tensordict 0.4's Gaussian and Independent(Normal) policies",
          "[tensordict_nn]") {
  for (const bool independent : {false, true}) {
    const auto dir = test::nn_fixture(independent ? "independent_normal_policy" : "gaussian_policy");
    torch::nn::Sequential mlp(torch::nn::Linear(4, 32), torch::nn::Tanh(), torch::nn::Linear(32, 32), torch::nn::Tanh(),
                              torch::nn::Linear(32, 8));
    auto dist = independent ? tdn::distribution_builder::of<tdn::independent<tdn::Normal, 1>>()
                            : tdn::distribution_builder::of<tdn::Normal>();
    tdn::AnyTensorDictSequential policy(
        tdn::AnyTensorDictModule(mlp, {{"agents", "observation"}}, {{"param"}}),
        tdn::AnyTensorDictModule(tdn::NormalParamExtractor(), {{"param"}}, {{"loc"}, {"scale"}}),
        tdn::AnyProbabilisticTensorDictModule(dist, {{"loc", {"loc"}}, {"scale", {"scale"}}}, {"agents", "action"},
                                              {.log_prob_key = any_key_path{"sample_log_prob"}}));
    CHECK(policy->in_keys() == std::vector<any_key_path>{{"agents", "observation"}});
    CHECK(policy->out_keys() == std::vector<any_key_path>{{"param"}, {"loc"}, {"scale"}, {"agents", "action"}, {"sample_log_prob"}});
    CHECK(parameter_names(*policy) == state_dict_names(dir));

    auto swap = to_module(load_memmap(dir + "params"), static_cast<torch::nn::Module&>(*policy));
    const auto input = load_memmap(dir + "input");
    for (const auto& [folder, type] : {std::pair{"output_mode", tdn::interaction_type::mode},
                                       std::pair{"output_mean", tdn::interaction_type::mean}}) {
      tdn::set_interaction_type guard(type);
      INFO(folder);
      check_matches_python(policy(input), load_memmap(dir + folder));
    }
    CHECK_FALSE(input.contains("param"));  // the input is not written

    // Python's ProbabilisticTensorDictSequential.get_dist(input) and log_prob.
    const auto values = load_memmap(dir + "dist_values");
    const auto fixed = load_memmap(dir + "fixed_action").get("action");
    const auto built = policy->get_dist(input);
    CHECK(test::near_python(built->log_prob(fixed), values.get("log_prob")));
    CHECK(test::near_python(built->entropy(), values.get("entropy")));
    AnyTensorDict with_action = input.exclude({});
    with_action.set({"agents", "action"}, fixed);
    CHECK(test::near_python(policy->log_prob(with_action), values.get("log_prob")));
  }
}

TEST_CASE("as_any_module: a typed module in a run-time sequence, Python's names and outputs", "[tensordict_nn]") {
  using tensordict::nested_key;
  using mlp_t = tdn::Sequential<torch::nn::Linear, torch::nn::Tanh, torch::nn::Linear, torch::nn::Tanh, torch::nn::Linear>;
  using net_t = tdn::TensorDictModule<mlp_t, tdn::in_keys<nested_key<"agents", "observation">>, tdn::out_keys<"param">>;
  net_t net(mlp_t(torch::nn::Linear(4, 32), torch::nn::Tanh(), torch::nn::Linear(32, 32), torch::nn::Tanh(), torch::nn::Linear(32, 8)));
  auto erased = tdn::as_any_module(net);
  CHECK(erased->in_keys() == std::vector<any_key_path>{{"agents", "observation"}});
  CHECK(erased->out_keys() == std::vector<any_key_path>{{"param"}});
  tdn::AnyTensorDictSequential policy(erased, tdn::AnyTensorDictModule(tdn::NormalParamExtractor(), {{"param"}}, {{"loc"}, {"scale"}}),
                                      tdn::AnyProbabilisticTensorDictModule(tdn::distribution_builder::of<tdn::Normal>(),
                                                                            {{"loc", {"loc"}}, {"scale", {"scale"}}}, {"agents", "action"},
                                                                            {.log_prob_key = any_key_path{"sample_log_prob"}}));
  const auto dir = test::nn_fixture("gaussian_policy");
  CHECK(parameter_names(*policy) == state_dict_names(dir));
  to_module_(load_memmap(dir + "params"), static_cast<torch::nn::Module&>(*policy));
  CHECK(net->module->child<0>()->weight.equal(load_memmap(dir + "params").get("module", "0", "module", "0", "weight")));  // shared
  const auto input = load_memmap(dir + "input");
  const auto out = policy(input);
  const auto expected = load_memmap(dir + "output_mode");
  check_matches_python(out, expected);
  CHECK(out.get("agents", "observation").is_same(input.get("agents", "observation")));
  CHECK_THROWS_AS(erased(AnyTensorDict({5})), key_error);

  // The other way: a run-time head in a typed sequence, its keys checked when it is made.
  tdn::AnyProbabilisticTensorDictModule any_head(tdn::distribution_builder::of<tdn::Normal>(), {{"loc", {"loc"}}, {"scale", {"scale"}}},
                                                 {"agents", "action"}, {.log_prob_key = any_key_path{"sample_log_prob"}});
  using head_keys = tdn::out_keys<nested_key<"agents", "action">, "sample_log_prob">;
  auto head = tdn::as_typed_module<tdn::in_keys<"loc", "scale">, head_keys>(any_head);
  using extractor_t = tdn::TensorDictModule<tdn::NormalParamExtractor, tdn::in_keys<"param">, tdn::out_keys<"loc", "scale">>;
  tdn::TensorDictSequential<net_t, extractor_t, decltype(head)> typed(net, extractor_t(tdn::NormalParamExtractor()), head);
  STATIC_REQUIRE(std::is_same_v<decltype(typed)::Impl::out_keys_t,
                                tdn::out_keys<"param", "loc", "scale", nested_key<"agents", "action">, "sample_log_prob">>);
  const AnyTensorDict typed_out(typed(input.to_typed<schema<node<"agents", leaf<"observation">>>>()));
  check_matches_python(typed_out, expected);
  CHECK_THROWS_AS((tdn::as_typed_module<tdn::in_keys<"loc">, tdn::out_keys<"action">>(any_head)), value_error);
  CHECK_THROWS_WITH((tdn::as_typed_module<tdn::in_keys<"loc">, tdn::out_keys<"action">>(any_head)),
                    Contains("the module reads \"loc\", \"scale\" and writes (\"agents\", \"action\"), \"sample_log_prob\"; "
                             "the typed keys say it reads \"loc\" and writes \"action\""));
}

TEST_CASE("run-time twins: the sequential_keys fixture with its nested keys, select_subsequence, and errors",
          "[tensordict_nn]") {
  const auto dir = test::nn_fixture("sequential_keys");
  tdn::AnyTensorDictModule m0(TwoHeads(), {{"obs", "a"}}, {{"hidden", "x"}, {"hidden", "y"}});
  tdn::AnyTensorDictModule m1(torch::nn::Linear(2, 3), {{"obs", "b"}}, {{"other", "z"}});
  tdn::AnyTensorDictModule m2(CatLinear(), {{"hidden", "x"}, {"other", "z"}}, {{"out"}});
  tdn::AnyTensorDictSequential seq(m0, m1, m2);
  CHECK(parameter_names(*seq) == state_dict_names(dir));
  auto swap = to_module(load_memmap(dir + "params"), static_cast<torch::nn::Module&>(*seq));
  const auto input = load_memmap(dir + "input");
  check_matches_python(seq(input), load_memmap(dir + "output"));
  const auto sub_a = seq->select_subsequence(std::nullopt, std::vector<any_key_path>{{"hidden", "y"}});
  CHECK(sub_a->size() == 1);
  CHECK(sub_a->child(0).get() == m0.get());
  check_matches_python(sub_a(input), load_memmap(dir + "subseq_a_output"));
  const auto sub_b = seq->select_subsequence(std::vector<any_key_path>{{"obs", "b"}, {"hidden", "x"}},
                                             std::vector<any_key_path>{{"out"}});
  CHECK(sub_b->size() == 2);
  check_matches_python(sub_b(load_memmap(dir + "subseq_b_input")), load_memmap(dir + "subseq_b_output"));
  check_matches_python(seq->select_subsequence(std::vector<any_key_path>{{"obs", "b"}})(input), load_memmap(dir + "subseq_c_output"));

  // Errors: before any module runs, naming the module, the key and what could be read.
  tdn::AnyTensorDictSequential miswired(m0, m2);
  CHECK_THROWS_AS(miswired(input), key_error);
  CHECK_THROWS_WITH(miswired(input), Contains("AnyTensorDictSequential: module 1 reads (\"other\", \"z\"), which neither the "
                                              "input nor an earlier module writes"));
  CHECK_THROWS_WITH(seq->select_subsequence(std::vector<any_key_path>{{"obs", "c"}}), Contains("no module reads or writes"));
  // select_out_keys: Python's select_out_keys_output (the input's keys and the selected out keys).
  seq->select_out_keys({{"out"}, {"hidden", "y"}});
  CHECK(seq->out_keys() == std::vector<any_key_path>{{"out"}, {"hidden", "y"}});
  const auto selected = seq(input), sel_expected = load_memmap(dir + "select_out_keys_output");
  auto sorted_keys = [](const AnyTensorDict& td) {
    auto keys = td.keys(true, true);
    std::sort(keys.begin(), keys.end());
    return keys;
  };
  CHECK(sorted_keys(selected) == sorted_keys(sel_expected));  // Python's order is that of its select call
  for (const auto& k : sel_expected.keys(true, true)) CHECK(test::near_python(selected.get(k), sel_expected.get(k)));
  CHECK_THROWS_WITH(seq->select_out_keys({{"obs", "a"}}), Contains("no module writes (\"obs\", \"a\")"));
  seq->reset_out_keys();
  check_matches_python(seq(input), load_memmap(dir + "output"));
  CHECK_THROWS_AS(seq->get_dist(input), value_error);
  CHECK_THROWS_WITH(seq->get_dist(input), Contains("get_dist and log_prob need a probabilistic last module"));
  CHECK_THROWS_AS(tdn::AnyProbabilisticTensorDictModule(tdn::distribution_builder::of<tdn::Normal>(),
                                                        {{"loc", {"loc"}}, {"std", {"std"}}}, {"action"}),
                  value_error);
  CHECK_THROWS_WITH(tdn::AnyProbabilisticTensorDictModule(tdn::distribution_builder::of<tdn::Normal>(),
                                                          {{"loc", {"loc"}}, {"std", {"std"}}}, {"action"}),
                    Contains("tensordict::nn::Normal takes the parameters loc, scale, got loc, std"));
  CHECK_THROWS_WITH(m1(AnyTensorDict({5})), Contains("has no leaf (\"obs\", \"b\") for the in key"));
}

TEST_CASE("EnsembleModule: tensordict 0.4's ensemble_value, by Python's names, with its TensorDictParams",
          "[tensordict_nn]") {
  const auto dir = test::nn_fixture("ensemble_value");
  using value_t = tdn::TensorDictModule<mlp_4_16_3, tdn::in_keys<"obs">, tdn::out_keys<"value">>;
  tdn::EnsembleModule<value_t> ensemble(value_t(mlp(6, 16, 1)), 3);
  // Python's state_dict holds two values that are not tensors (params_td.__batch_size, __device).
  CHECK_THROWS_WITH(load(dir + "state_dict.pt"), Contains("params_td.__batch_size"));
  CHECK(parameter_names(*ensemble) == state_dict_names(dir));

  // params/ tags params_td "TensorDictParams"; it loads as the TensorDict it wraps.
  const auto python = load_memmap(dir + "params");
  CHECK(python.get_tensordict({"params_td"}).batch_size() == c10::IntArrayRef{3});
  CHECK_THROWS_WITH(to_module(python, static_cast<torch::nn::Module&>(*ensemble)),
                    Contains("(\"params_td\", \"module\", \"0\", \"weight\") is a leaf of a TensorDictParams"));
  to_module_(python, static_cast<torch::nn::Module&>(*ensemble));  // copies, by name
  const auto& stacked = ensemble->params_td->tensordict();
  const auto expected_stack = load_memmap(dir + "stacked_params");
  CHECK(stacked.batch_size() == c10::IntArrayRef{3});
  CHECK(stacked.get<"module", "0", "weight">().equal(expected_stack.get({"module", "0", "weight"})));
  CHECK(stacked.get<"module", "2", "bias">().equal(expected_stack.get({"module", "2", "bias"})));

  TensorDict<schema<leaf<"obs">>> input({load_memmap(dir + "input").get("obs")}, {5});
  const auto out = ensemble(input);
  CHECK(out.batch_size() == c10::IntArrayRef{3, 5});
  for (const auto* folder : {"output", "output_loop"}) {
    INFO(folder);
    const auto expected = load_memmap(dir + folder);
    CHECK(out.get<"obs">().equal(expected.get("obs")));
    CHECK(test::near_python(out.get<"value">(), expected.get("value")));
  }
  // The member's own tensors (module.module.*) are Python's too, and forward does not use them.
  CHECK(ensemble->module->module->named_parameters()["0.weight"].equal(python.get({"module", "module", "0", "weight"})));
}

TEST_CASE("EnsembleModule over a TensorDictSequential policy: every module over every copy at once", "[tensordict_nn]") {
  using net_t = tdn::TensorDictModule<mlp_4_16_3, tdn::in_keys<"observation">, tdn::out_keys<"param">>;
  using extractor_t = tdn::TensorDictModule<tdn::NormalParamExtractor, tdn::in_keys<"param">, tdn::out_keys<"loc", "scale">>;
  using head_t = tdn::ProbabilisticTensorDictModule<tdn::Normal, tdn::in_keys<"loc", "scale">, tdn::out_keys<"action">,
                                                    tdn::log_prob_key<"sample_log_prob">>;
  using body_t = tdn::TensorDictSequential<net_t, extractor_t>;  // nested, as Python allows
  using policy_t = tdn::TensorDictSequential<body_t, head_t>;
  policy_t policy(body_t(net_t(mlp(4, 16, 4)), extractor_t(tdn::NormalParamExtractor())), head_t());
  tdn::EnsembleModule<policy_t> ensemble(policy, 3);
  CHECK(ensemble->named_parameters().contains("params_td.module.0.module.0.module.0.weight"));
  const auto& p = ensemble->params_td->tensordict();
  CHECK_FALSE(p.get<"module", "0", "module", "0", "module", "0", "weight">()[0].equal(
      p.get<"module", "0", "module", "0", "module", "0", "weight">()[1]));  // fresh copies

  TensorDict<schema<leaf<"observation">>> td({at::randn({5, 4})}, {5});
  const auto out = ensemble(td);
  CHECK(out.batch_size() == c10::IntArrayRef{3, 5});
  CHECK(out.get<"action">().sizes() == c10::IntArrayRef{3, 5, 2});
  CHECK(out.get<"sample_log_prob">().sizes() == c10::IntArrayRef{3, 5, 2});
  for (std::int64_t i = 0; i < 3; ++i) {
    const auto one = functional_call(policy, p[i].detach(), td);
    INFO("copy " << i);
    CHECK(at::allclose(out.get<"loc">()[i], one.get<"loc">(), 1e-5, 1e-6));
    CHECK(at::allclose(out.get<"action">()[i], one.get<"action">(), 1e-5, 1e-6));
    CHECK(at::allclose(out.get<"sample_log_prob">()[i], one.get<"sample_log_prob">(), 1e-5, 1e-6));
  }
  // functional_vmap over the policy with the stacked params: the same computation.
  const auto vmapped = tdn::functional_vmap(policy, p, td);
  CHECK(vmapped.batch_size() == c10::IntArrayRef{3, 5});
  CHECK(at::allclose(vmapped.get<"sample_log_prob">(), out.get<"sample_log_prob">()));
  CHECK_THROWS_WITH(tdn::functional_vmap(policy, p, td, 0), Contains("batch dim 0 must index the 3 sets"));

  // Gradients reach every copy's parameters through the distribution's log-prob.
  out.get<"sample_log_prob">().sum().backward();
  const auto grad = p.get<"module", "0", "module", "0", "module", "0", "weight">().grad();
  REQUIRE(grad.defined());
  for (std::int64_t i = 0; i < 3; ++i) CHECK(grad[i].abs().sum().item<double>() > 0);

  // expand_input = false: the input's first batch dim indexes the copies.
  tdn::EnsembleModule<policy_t> mapped(policy, 3, {.expand_input = false});
  TensorDict<schema<leaf<"observation">>> per_copy({at::randn({3, 5, 4})}, {3, 5});
  const auto mapped_out = mapped(per_copy);
  const auto& mp = mapped->params_td->tensordict();
  CHECK(at::allclose(mapped_out.get<"action">()[2], functional_call(policy, mp[2].detach(), per_copy[2]).get<"action">(),
                     1e-5, 1e-6));
  CHECK(at::allclose(tdn::functional_vmap(policy, mp, per_copy, 0).get<"action">(), mapped_out.get<"action">()));
}

TEST_CASE("CompositeDistribution: one distribution per head, Python's key names and sums", "[tensordict_nn]") {
  // Python's docstring example: a Normal head and a nested Categorical head over batch [3].
  const auto loc = at::randn({3, 4}), scale = at::rand({3, 4}) + 0.1, logits = at::randn({3, 10});
  AnyTensorDict params({3});
  params.set({"cont", "loc"}, loc);
  params.set({"cont", "scale"}, scale);
  params.set({"nested", "disc", "logits"}, logits);
  const tdn::distribution_map heads{{{"cont"}, tdn::distribution_builder::of<tdn::Normal>()},
                                    {{"nested", "disc"}, tdn::distribution_builder::of<tdn::Categorical>()},
                                    {{"absent"}, tdn::distribution_builder::of<tdn::Normal>()}};
  const tdn::CompositeDistribution dist(params, heads);
  CHECK(dist.size() == 2);  // a head without parameters is left out, as in Python
  CHECK(dist.batch_shape() == std::vector<std::int64_t>{3});

  const auto sample = dist.sample({4});
  CHECK(sample.batch_size() == c10::IntArrayRef{4, 3});
  CHECK(sample.get("cont").sizes() == c10::IntArrayRef{4, 3, 4});
  CHECK(sample.get("nested", "disc").sizes() == c10::IntArrayRef{4, 3});
  const auto lp = dist.log_prob(sample);
  const auto cont_lp = tdn::Normal(loc, scale).log_prob(sample.get("cont"));
  const auto disc_lp = tdn::Categorical(logits).log_prob(sample.get("nested", "disc"));
  CHECK(at::allclose(lp.get("cont_log_prob"), cont_lp));
  CHECK(at::allclose(lp.get("nested", "disc_log_prob"), disc_lp));
  CHECK(at::allclose(lp.get("sample_log_prob"), cont_lp.sum(-1) + disc_lp));  // summed down to the sample's batch dims
  CHECK(lp.get("cont").is_same(sample.get("cont")));
  CHECK_FALSE(sample.contains("sample_log_prob"));  // the sample is not written

  const auto mode = dist.mode();
  CHECK(mode.get("cont").equal(loc));
  CHECK(mode.get("nested", "disc").equal(logits.argmax(-1)));
  const auto entropy = dist.entropy();
  CHECK(at::allclose(entropy.get("cont_entropy"), tdn::Normal(loc, scale).entropy()));
  CHECK(at::allclose(entropy.get("entropy"), tdn::Normal(loc, scale).entropy().sum(-1) + tdn::Categorical(logits).entropy()));

  // rsample's gradients reach the parameters of the heads that have one.
  const auto trained_loc = loc.clone().requires_grad_();
  AnyTensorDict p2 = params.exclude({});
  p2.set({"cont", "loc"}, trained_loc);
  const auto drawn = tdn::CompositeDistribution(p2, {heads[0]}).rsample();
  CHECK(torch::autograd::grad({drawn.get("cont").sum()}, {trained_loc})[0].equal(at::ones_like(loc)));

  AnyTensorDict leaf_params({3});
  leaf_params.set({"cont"}, loc);
  CHECK_THROWS_AS(tdn::CompositeDistribution(leaf_params, heads), value_error);
  // A Categorical over [3, 4] logits has batch shape [3]: not params' [3, 4].
  AnyTensorDict deep({3, 4});
  deep.set({"nested", "disc", "logits"}, at::randn({3, 4}));
  CHECK_THROWS_AS(tdn::CompositeDistribution(deep, heads), shape_error);
  CHECK_THROWS_WITH(tdn::CompositeDistribution(deep, heads), Contains("batch shape [3], which does not start with params' batch size [3,4]"));
  CHECK_THROWS_WITH(tdn::CompositeDistribution(params, {{{"cont"}, tdn::distribution_builder::of<tdn::Categorical>()}}),
                    Contains("Categorical takes the parameters"));
}

TEST_CASE("CompositeProbabilisticTensorDictModule writes every head's value and log-probabilities", "[tensordict_nn]") {
  AnyTensorDict td({3});
  td.set({"params", "move", "loc"}, at::randn({3, 2}));
  td.set({"params", "move", "scale"}, at::rand({3, 2}) + 0.1);
  td.set({"params", "grip", "logits"}, at::randn({3, 4}));
  tdn::CompositeProbabilisticTensorDictModule head(
      {"params"}, {{{"move"}, tdn::distribution_builder::of<tdn::Normal>()}, {{"grip"}, tdn::distribution_builder::of<tdn::Categorical>()}},
      {.return_log_prob = true});
  CHECK(head->in_keys() == std::vector<any_key_path>{{"params"}});
  CHECK(head->out_keys() == std::vector<any_key_path>{{"move"}, {"grip"}, {"sample_log_prob"}});  // Python's: no per-head keys
  const auto out = head(td);  // mode by default
  CHECK(out.get("move").equal(td.get("params", "move", "loc")));
  CHECK(out.get("grip").equal(td.get("params", "grip", "logits").argmax(-1)));
  CHECK(at::allclose(out.get("sample_log_prob"), out.get("move_log_prob").sum(-1) + out.get("grip_log_prob")));
  CHECK(at::allclose(head->log_prob(out).get("sample_log_prob"), out.get("sample_log_prob")));
  {
    tdn::set_interaction_type random(tdn::interaction_type::random);
    CHECK_FALSE(head(td).get("move").equal(out.get("move")));
  }
  CHECK_THROWS_AS(head(AnyTensorDict({3})), key_error);

  // In a typed policy: a network writes every head's parameters under ("params", head, name), and the
  // composite head, made typed by as_typed_module, writes the actions.
  using tensordict::nested_key;
  struct Heads : torch::nn::Module {
    std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& x) {
      return {x.narrow(-1, 0, 2), x.narrow(-1, 2, 2).exp(), x.narrow(-1, 4, 4)};
    }
  };
  using net_t = tdn::TensorDictModule<std::shared_ptr<Heads>, tdn::in_keys<"obs">,
                                      tdn::out_keys<nested_key<"params", "move", "loc">, nested_key<"params", "move", "scale">,
                                                    nested_key<"params", "grip", "logits">>>;
  auto typed_head = tdn::as_typed_module<tdn::in_keys<"params">,
                                         tdn::out_keys<"move", "grip", "move_log_prob", "grip_log_prob", "sample_log_prob">>(head);
  tdn::TensorDictSequential<net_t, decltype(typed_head)> policy(net_t(std::make_shared<Heads>()), typed_head);
  TensorDict<schema<leaf<"obs">>> obs({at::randn({3, 8})}, {3});
  const auto acted = policy(obs);
  STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(acted)>::schema_t,
                                schema<leaf<"obs">, node<"params", node<"move", leaf<"loc">, leaf<"scale">>, node<"grip", leaf<"logits">>>,
                                       leaf<"move">, leaf<"grip">, leaf<"move_log_prob">, leaf<"grip_log_prob">, leaf<"sample_log_prob">>>);
  CHECK(acted.get<"move">().equal(obs.get<"obs">().narrow(-1, 0, 2)));
  CHECK(acted.get<"grip">().equal(obs.get<"obs">().narrow(-1, 4, 4).argmax(-1)));
  // The typed sequence ending in the composite head (a ProbabilisticTensorDictSequential) has get_dist and log_prob.
  tdn::ProbabilisticTensorDictSequential<net_t, decltype(typed_head)> typed_policy(net_t(std::make_shared<Heads>()), typed_head);
  const tdn::CompositeDistribution typed_dist = typed_policy->get_dist(obs);
  CHECK(typed_dist.size() == 2);
  CHECK(typed_dist.mode().get("grip").equal(acted.get<"grip">()));
  CHECK(at::allclose(typed_policy->log_prob(acted), acted.get<"sample_log_prob">()));

  // In a run-time sequence: the composite head reads the sub-TensorDict "params", which the input holds or an
  // earlier module writes (the wiring check counted leaves only); get_composite_dist and log_prob reach it.
  tdn::AnyTensorDictSequential alone(std::make_shared<tdn::AnyTensorDictSequentialImpl>(head));
  CHECK(alone(td).get("move").equal(out.get("move")));
  tdn::AnyTensorDictSequential any_policy(tdn::as_any_module(net_t(std::make_shared<Heads>())), head);
  const AnyTensorDict any_obs(obs);
  const auto any_acted = any_policy(any_obs);
  CHECK(any_acted.get("grip").equal(acted.get<"grip">()));
  CHECK(any_acted.contains({"move_log_prob"}));
  const tdn::CompositeDistribution composite = any_policy->get_composite_dist(any_obs);
  CHECK(composite.size() == 2);
  CHECK(composite.head({"move"}).name() == "Normal");
  CHECK(at::allclose(any_policy->log_prob(any_acted), any_acted.get("sample_log_prob")));
  CHECK_THROWS_WITH(any_policy->get_dist(any_obs), Contains("whose distribution is a CompositeDistribution; call get_composite_dist(td)"));
  tdn::AnyTensorDictSequential nested(tdn::as_any_module(net_t(std::make_shared<Heads>())), alone);
  CHECK(at::allclose(nested->log_prob(any_acted), any_acted.get("sample_log_prob")));
  CHECK(nested->get_composite_dist(any_obs).size() == 2);
  CHECK_THROWS_AS(alone(AnyTensorDict({3})), key_error);
}
