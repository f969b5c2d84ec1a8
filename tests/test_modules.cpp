#include "catch_torch.hpp"
#include "test_helpers.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/randn.h>
#include <torch/nn/modules/rnn.h>
#include <torch/optim/adam.h>

#include <tensordict/functional.hpp>
#include <tensordict/nn/tensordict_module.hpp>
#include <tensordict/nn/adapters/builtin.hpp>

using namespace tensordict;
namespace tdn = tensordict::nn;
using tensordict::nested_key;
using test::Contains;
using test::impl;

// Counts its re-initializations.
struct CountingImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  int resets = 0;
  CountingImpl() { fc = register_module("fc", torch::nn::Linear(3, 1)); }
  void reset_parameters() {
    ++resets;
    fc->reset_parameters();
  }
  at::Tensor forward(const at::Tensor& x) { return fc->forward(x); }
};
TENSORDICT_MODULE(CountingImpl, fc);
TORCH_MODULE(Counting);

namespace {
using x_only = schema<leaf<"x">>;
using linear_member = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<"x">, tdn::out_keys<"y">>;
}  // namespace

TEST_CASE("TensorDictModule reads in keys and writes out keys", "[modules]") {
  linear_member member(torch::nn::Linear(3, 1));
  TensorDict<x_only> td({at::randn({5, 3})}, {5});
  auto out = member->forward(td);
  STATIC_REQUIRE(std::is_same_v<decltype(out)::schema_t, schema<leaf<"x">, leaf<"y">>>);
  CHECK(out.batch_size() == c10::IntArrayRef({5}));
  CHECK(out.get<"y">().allclose(member->module->forward(td.get<"x">())));
  CHECK(out.get<"x">().is_same(td.get<"x">()));
  CHECK(member->parameters().size() == 2);
}

// A critic reading two keys, as TorchRL's MLP concatenates its inputs: cat_inputs joins the in keys' tensors
// along their last dim into the module's one input, in the forward, the functional call and an ensemble of
// critics; the run-time module takes {.cat_inputs = true}.
TEST_CASE("TensorDictModule with cat_inputs: several in keys joined along the last dim", "[modules]") {
  using critic_net = tdn::Sequential<torch::nn::Linear, torch::nn::ReLU, torch::nn::Linear>;
  using critic_t = tdn::TensorDictModule<critic_net, tdn::in_keys<"observation", nested_key<"agent", "action">>,
                                         tdn::out_keys<"value">, tdn::cat_inputs>;
  using input_t = schema<leaf<"observation">, node<"agent", leaf<"action">>>;
  critic_t critic(critic_net(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 1)));
  TensorDict<input_t> td({at::randn({5, 3}), at::randn({5, 1})}, {5});
  const at::Tensor joined = at::cat({td.get<"observation">(), td.get<"agent", "action">()}, -1);
  const auto out = critic(td);
  CHECK(out.get<"value">().equal(critic->module->forward(joined)));
  CHECK(critic->named_parameters().contains("module.0.weight"));  // Python's names: the MLP's own

  // The functional call and an ensemble of two critics (the input shared, or mapped by its batch dim 0).
  const auto params = from_module(critic);
  CHECK(functional_call(critic, params, td).get<"value">().equal(out.get<"value">()));
  auto stacked = from_modules(std::vector<critic_t>{critic, critic_t(critic_net(torch::nn::Linear(4, 8), torch::nn::ReLU(),
                                                                                   torch::nn::Linear(8, 1)))});
  const auto both = tdn::functional_vmap(critic, stacked, td);
  CHECK(both.batch_size() == c10::IntArrayRef({2, 5}));
  CHECK(both.get<"value">()[0].allclose(out.get<"value">(), 1e-5, 1e-6));
  const auto mapped = tdn::functional_vmap(critic, stacked, td.unsqueeze(0).expand({2, 5}).clone(), 0);
  CHECK(mapped.get<"value">().allclose(both.get<"value">(), 1e-5, 1e-6));

  // Leading dims that differ: shape_error naming each key's tensor.
  TensorDict<input_t> odd({at::randn({5, 3}), at::randn({5, 2, 1})}, {5});
  CHECK_THROWS_AS(critic(odd), shape_error);
  CHECK_THROWS_WITH(critic(odd), Contains("\"observation\" f32[5,3], (\"agent\", \"action\") f32[5,2,1]"));

  torch::nn::Sequential any_net(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 1));
  tdn::AnyTensorDictModule any_critic(any_net, {{"observation"}, {"agent", "action"}}, {{"value"}}, {.cat_inputs = true});
  CHECK(any_critic(AnyTensorDict(td)).get("value").equal(any_net->forward(joined)));
}

TEST_CASE("EnsembleModule: the reference's example", "[modules]") {
  linear_member member(torch::nn::Linear(3, 1));
  tdn::EnsembleModule<linear_member> ensemble(member, 4);
  TensorDict<x_only> td({at::randn({5, 3})}, {5});
  auto out = ensemble->forward(td);
  CHECK(out.batch_size() == c10::IntArrayRef({4, 5}));
  CHECK(out.get<"y">().sizes() == c10::IntArrayRef({4, 5, 1}));
  auto w = ensemble->params_td->tensordict().get<"module", "weight">();
  CHECK(!w[0].equal(w[1]));  // fresh copies
  CHECK(out.get<"y">()[2].allclose(at::linear(td.get<"x">(), w[2], ensemble->params_td->tensordict().get<"module", "bias">()[2]),
                                  1e-5, 1e-6));
  // Python's names: the member's own (unused) tensors, and the copies' stacked ones.
  CHECK(ensemble->parameters().size() == 4);
  CHECK(ensemble->named_parameters().contains("module.module.weight"));
  CHECK(ensemble->named_parameters().contains("params_td.module.weight"));
}

TEST_CASE("each copy is initialized once, and the member keeps its values", "[modules]") {
  using member_t = tdn::TensorDictModule<Counting, tdn::in_keys<"x">, tdn::out_keys<"y">>;
  member_t member{Counting()};
  const auto before = member->module->fc->weight.clone();
  tdn::EnsembleModule<member_t> ensemble(member, 3);
  CHECK(member->module->resets == 3);
  CHECK(member->module->fc->weight.equal(before));
}

TEST_CASE("expand_input false maps the input's first batch dim; ensembles chain", "[modules]") {
  linear_member first(torch::nn::Linear(3, 3));
  tdn::EnsembleModule<linear_member> ensemble(first, 4);
  using head_t = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<"y">, tdn::out_keys<"z">>;
  head_t head(torch::nn::Linear(3, 2));
  tdn::EnsembleModule<head_t> heads(head, 4, {.expand_input = false});
  TensorDict<x_only> td({at::randn({5, 3})}, {5});
  auto mid = ensemble->forward(td);
  auto out = heads->forward(mid);
  CHECK(out.batch_size() == c10::IntArrayRef({4, 5}));
  CHECK(out.get<"z">().sizes() == c10::IntArrayRef({4, 5, 2}));
  const auto hp = heads->params_td->tensordict().get<"module">();
  CHECK(out.get<"z">()[1].allclose(at::linear(mid.get<"y">()[1], hp.get<"weight">()[1], hp.get<"bias">()[1]), 1e-5, 1e-6));
  TensorDict<schema<leaf<"y">>> unmapped({at::randn({5, 3})}, {5});
  CHECK_THROWS_WITH(heads->forward(unmapped), Contains("num_copies=4") && Contains("batch_size=[5]"));
  CHECK_THROWS_AS(heads->forward(unmapped), value_error);
}

TEST_CASE("training an ensemble decreases its loss", "[modules]") {
  using mlp = tdn::Sequential<torch::nn::Linear, torch::nn::ReLU, torch::nn::Linear>;
  using member_t = tdn::TensorDictModule<mlp, tdn::in_keys<"x">, tdn::out_keys<"y">>;
  member_t member(mlp(torch::nn::Linear(2, 16), torch::nn::ReLU(), torch::nn::Linear(16, 1)));
  tdn::EnsembleModule<member_t> ensemble(member, 3);
  torch::optim::Adam adam(ensemble->parameters(), 0.01);
  auto x = at::randn({64, 2});
  auto target = (x.select(1, 0) * 2 - x.select(1, 1)).unsqueeze(1);
  TensorDict<x_only> td({x}, {64});
  auto loss_of = [&] { return (ensemble->forward(td).get<"y">() - target).pow(2).mean(); };
  const double first = loss_of().item<double>();
  for (int step = 0; step < 100; ++step) {
    adam.zero_grad();
    loss_of().backward();
    adam.step();
  }
  CHECK(loss_of().item<double>() < first * 0.2);
}

TEST_CASE("an ensemble of LSTMs: three out keys, run-time params, training decreases the loss", "[modules]") {
  using lstm_member = tdn::TensorDictModule<torch::nn::LSTM, tdn::in_keys<"x">, tdn::out_keys<"y", "h", "c">>;
  lstm_member member(torch::nn::LSTM(torch::nn::LSTMOptions(2, 4).num_layers(2).batch_first(true)));
  TensorDict<x_only> single({at::randn({3, 6, 2})});
  auto one = member->forward(single);
  CHECK(one.get<"y">().allclose(std::get<0>(member->module->forward(single.get<"x">()))));
  CHECK(one.get<"c">().sizes() == c10::IntArrayRef{2, 3, 4});

  tdn::EnsembleModule<lstm_member> ensemble(member, 3);
  STATIC_REQUIRE(std::is_same_v<decltype(ensemble->params_td), tdn::AnyTensorDictParams>);
  CHECK(ensemble->params_td->parameters().size() == 8);  // the 2 layers' 8 tensors, each stacked over the copies
  CHECK(ensemble->named_parameters().contains("params_td.module.weight_hh_l1"));
  const auto p = ensemble->params_td->tensordict().get_tensordict({"module"});
  CHECK(p.batch_size() == c10::IntArrayRef{3});
  CHECK_FALSE(p.get("weight_ih_l0")[0].equal(p.get("weight_ih_l0")[1]));  // fresh copies
  CHECK(impl(p.get("bias_hh_l1")) == impl(ensemble->named_parameters()["params_td.module.bias_hh_l1"]));

  auto x = at::randn({8, 5, 2});
  TensorDict<x_only> td({x});
  auto out = ensemble->forward(td);
  CHECK(out.batch_size() == c10::IntArrayRef{3});
  REQUIRE(out.get<"y">().sizes() == c10::IntArrayRef{3, 8, 5, 4});
  for (std::int64_t i = 0; i < 3; ++i) {
    auto [y, state] = functional_call(member->module, p[i], x);
    CHECK(out.get<"y">()[i].allclose(y, 1e-5, 1e-6));
    CHECK(out.get<"h">()[i].allclose(std::get<0>(state), 1e-5, 1e-6));
  }

  // Each copy learns to give the running mean of the input's first feature at its last hidden unit.
  auto target = x.select(2, 0).cumsum(1) / at::arange(1, 6, x.options());
  torch::optim::Adam adam(ensemble->parameters(), 0.02);
  auto loss_of = [&] { return (ensemble->forward(td).get<"y">().select(3, 3) - target).pow(2).mean(); };
  const double first = loss_of().item<double>();
  for (int step = 0; step < 60; ++step) {
    adam.zero_grad();
    loss_of().backward();
    adam.step();
  }
  CHECK(loss_of().item<double>() < first * 0.5);
}

TEST_CASE("an ensemble of a run-time torch::nn::Sequential", "[modules]") {
  using seq_member = tdn::TensorDictModule<torch::nn::Sequential, tdn::in_keys<"x">, tdn::out_keys<"y">>;
  seq_member member(torch::nn::Sequential(torch::nn::Linear(3, 8), torch::nn::Tanh(), torch::nn::Linear(8, 1)));
  tdn::EnsembleModule<seq_member> ensemble(member, 4);
  CHECK(ensemble->named_parameters().contains("params_td.module.2.bias"));
  TensorDict<x_only> td({at::randn({5, 3})}, {5});
  auto out = ensemble->forward(td);
  CHECK(out.batch_size() == c10::IntArrayRef{4, 5});
  const auto p = ensemble->params_td->tensordict().get_tensordict({"module"});
  CHECK(out.get<"y">()[3].allclose(functional_call(member->module, p[3], td.get<"x">()), 1e-5, 1e-6));
}

TEST_CASE("dropout in an ensemble follows the randomness setting", "[modules]") {
  using net = tdn::Sequential<torch::nn::Linear, torch::nn::Dropout>;
  using member_t = tdn::TensorDictModule<net, tdn::in_keys<"x">, tdn::out_keys<"y">>;
  member_t member(net(torch::nn::Linear(3, 20), torch::nn::Dropout(0.5)));
  TensorDict<x_only> td({at::randn({5, 3})}, {5});
  tdn::EnsembleModule<member_t> strict(member, 2);
  CHECK_THROWS_WITH(strict->forward(td), Contains("randomness"));
  tdn::EnsembleModule<member_t> different(member, 2, {.randomness = randomness::different});
  CHECK(different->forward(td).get<"y">().sizes() == c10::IntArrayRef({2, 5, 20}));
  // With equal copies, "same" drops the same units in every copy and "different" does not.
  tdn::EnsembleModule<member_t> same(member, 2, {.randomness = randomness::same});
  const auto sp = same->params_td->tensordict().get<"module", "0">();
  sp.get<"weight">()[1].detach().copy_(sp.get<"weight">()[0]);
  sp.get<"bias">()[1].detach().copy_(sp.get<"bias">()[0]);
  auto y = same->forward(td).get<"y">();
  CHECK((y[0] == 0).equal(y[1] == 0));
}
