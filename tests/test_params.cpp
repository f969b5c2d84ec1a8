#include "catch_torch.hpp"
#include "test_helpers.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/sgd.h>

#include <tensordict/nn/functional_vmap.hpp>
#include <tensordict/nn/params.hpp>

using namespace tensordict;
using test::impl;
namespace tdn = tensordict::nn;
using test::Contains;

namespace {
using mlp_t = tdn::Sequential<torch::nn::Linear, torch::nn::Linear>;
using mlp_schema = tdn::schema_of<mlp_t::Impl>;

mlp_t make_mlp() { return mlp_t(torch::nn::Linear(3, 4), torch::nn::Linear(4, 4)); }

template <class S>
struct Holder : torch::nn::Module {
  tdn::TensorDictParams<S> params;
  explicit Holder(tdn::TensorDictParams<S> p) : params(register_module("params", p)) {}
};

std::vector<std::string> names_of(const torch::OrderedDict<std::string, at::Tensor>& dict) {
  std::vector<std::string> out;
  for (const auto& item : dict) out.push_back(item.key());
  return out;
}
}  // namespace

TEST_CASE("named_parameters give the reference's dotted names", "[params]") {
  auto net = make_mlp();
  auto params = from_module(net);
  params.lock_();
  auto p = tdn::TensorDictParams(params);
  Holder<mlp_schema> m(p);
  CHECK(names_of(m.named_parameters()) ==
        std::vector<std::string>{"params.0.weight", "params.0.bias", "params.1.weight", "params.1.bias"});
  CHECK(m.parameters().size() == 4);
  CHECK(impl(m.named_parameters()["params.1.bias"]) == impl(net->child<1>()->bias));
  std::ostringstream os;
  os << *p;  // libtorch lists the child modules after it
  CHECK(os.str().rfind("TensorDictParams(params=TensorDict(batch_size=[], fields={0: {bias: f32[4], weight: f32[4,3]}, "
                       "1: {bias: f32[4], weight: f32[4,4]}}))",
                       0) == 0);
}

TEST_CASE("unique_parameters lists a tied weight once, so an optimizer steps it once", "[params]") {
  auto net = make_mlp();
  auto shared = from_module(net).detach().clone();
  struct Two : torch::nn::Module {
    Two(const TensorDict<mlp_schema>& td) {
      register_module("a", tdn::TensorDictParams(td));
      register_module("b", tdn::TensorDictParams(td));  // the same tensors again: tied
    }
  } two(shared);
  CHECK(two.parameters().size() == 8);  // libtorch lists each registration
  const auto once = tdn::unique_parameters(two);
  REQUIRE(once.size() == 4);
  CHECK(impl(once[0]) == impl(two.parameters()[0]));
  const at::Tensor before = once[1].detach().clone();
  torch::optim::SGD sgd(once, 1.0);
  for (const auto& p : once) p.mutable_grad() = at::ones(p.sizes());
  sgd.step();
  CHECK(once[1].detach().equal(before - 1));  // -1, not -2
}

TEST_CASE("a tensor at two paths of one TensorDictParams is registered once; set makes and breaks the tie", "[params]") {
  auto td = from_module(make_mlp()).detach().clone();
  td.set<"1", "bias">(td.get<"0", "bias">());  // tied: 0.bias and 1.bias are one tensor
  auto p = tdn::TensorDictParams(td);
  CHECK(names_of(p->named_parameters()) == std::vector<std::string>{"0.weight", "0.bias", "1.weight"});
  CHECK(p->parameters().size() == 3);
  CHECK(impl(p->get<"1", "bias">()) == impl(p->get<"0", "bias">()));  // still readable at both paths
  {
    const at::Tensor before = p->get<"0", "bias">().detach().clone();
    torch::optim::SGD sgd(p->parameters(), 1.0);
    for (const auto& t : p->parameters()) t.mutable_grad() = at::ones(t.sizes());
    sgd.step();
    CHECK(p->get<"1", "bias">().detach().equal(before - 1));  // -1, not -2
  }

  p->set<"1", "bias">(at::zeros({4}));  // the tie broken: both registered
  CHECK(names_of(p->named_parameters()) == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"});
  p->set<"0", "bias">(p->get<"1", "bias">());  // tied again, the other way: registered at the first path
  CHECK(names_of(p->named_parameters()) == std::vector<std::string>{"0.weight", "0.bias", "1.weight"});
  CHECK(impl(p->named_parameters()["0.bias"]) == impl(p->get<"1", "bias">()));

  AnyTensorDict any = AnyTensorDict(td);
  any.set("extra", td.get<"0", "weight">());
  tdn::AnyTensorDictParams dynamic(std::make_shared<tdn::AnyTensorDictParamsImpl>(any));
  CHECK(dynamic->parameters().size() == 3);  // 0.weight and extra are one, and so are the biases
}

TEST_CASE("floating dtypes become parameters, the others buffers", "[params]") {
  using S = schema<leaf<"f16">, leaf<"f32">, leaf<"f64">, leaf<"bf16">, leaf<"i64">, leaf<"flag">, leaf<"c64">>;
  TensorDict<S> td({at::zeros({2}, at::kHalf), at::zeros({2}), at::zeros({2}, at::kDouble), at::zeros({2}, at::kBFloat16),
                    at::zeros({2}, at::kLong), at::zeros({2}, at::kBool), at::zeros({2}, at::kComplexFloat)});
  auto p = tdn::TensorDictParams(td);
  CHECK(names_of(p->named_parameters()) == std::vector<std::string>{"f16", "f32", "f64"});
  CHECK(names_of(p->named_buffers()) == std::vector<std::string>{"bf16", "i64", "flag", "c64"});
  CHECK(p->get<"f32">().requires_grad());

  auto all_buffers = tdn::TensorDictParams(td.clone(), {.no_convert = true});
  CHECK(all_buffers->named_parameters().is_empty());
  CHECK(all_buffers->named_buffers().size() == 7);

  torch::nn::BatchNorm1d bn(4);
  auto kept = from_module(bn, tdn::as_module);  // what already is a buffer stays one
  CHECK(names_of(kept->named_parameters()) == std::vector<std::string>{"weight", "bias"});
  CHECK(names_of(kept->named_buffers()) == std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"});
}

TEST_CASE("writes show on both sides; the registry follows writes through the params", "[params]") {
  auto td = from_module(make_mlp()).detach().clone();
  auto p = tdn::TensorDictParams(td);
  at::NoGradGuard no_grad;  // the leaves are parameters now
  td.get<"0", "bias">().fill_(3);
  CHECK((p->get<"0", "bias">() == 3).all().item<bool>());
  p->get<"1", "weight">().fill_(2);
  CHECK((td.get<"1", "weight">() == 2).all().item<bool>());

  at::Tensor replacement = at::ones({4});
  p->set<"1", "bias">(replacement);
  CHECK(impl(td.get<"1", "bias">()) == impl(replacement));  // the wrapped TensorDict sees it
  CHECK(impl(p->named_parameters()["1.bias"]) == impl(replacement));
  CHECK(replacement.requires_grad());
  p->set<"1", "bias">(at::zeros({4}, at::kLong));  // now an integer: a buffer
  CHECK(p->named_buffers().contains("1.bias"));
  CHECK(!p->named_parameters().contains("1.bias"));
}

TEST_CASE("a leaf set for the first time through the params is registered", "[params]") {
  using S = schema<leaf<"w">, leaf<"steps">>;
  TensorDict<S> td({at::zeros({2}), at::Tensor()});
  auto p = tdn::TensorDictParams(td);
  CHECK(p->named_buffers().is_empty());
  p->set<"steps">(at::zeros({}, at::kLong));
  CHECK(p->named_buffers().contains("steps"));
  CHECK(td.is_set(1));
}

TEST_CASE("lock locks the wrapped TensorDict, writes through the params still work", "[params]") {
  auto td = from_module(make_mlp()).detach().clone();
  auto p = tdn::TensorDictParams(td, {.lock = true});
  CHECK(td.is_locked());
  CHECK_THROWS_AS((td.set<"0", "bias">(at::zeros({4}))), lock_error);
  p->set<"0", "bias">(at::zeros({4}));
  CHECK(td.is_locked());
  CHECK((td.get<"0", "bias">() == 0).all().item<bool>());
}

TEST_CASE("lerp_: a target network's soft update in place, without recording gradients", "[params]") {
  auto online = tdn::TensorDictParams(from_module(make_mlp()).detach().clone());
  auto target = tdn::TensorDictParams(from_module(make_mlp()).detach().clone(), {.lock = true});
  const at::Tensor weight = target->get<"0", "weight">();
  const at::Tensor expected = weight.detach().lerp(online->get<"0", "weight">().detach(), 0.005);
  target->lerp_(*online, 0.005);
  CHECK(impl(target->get<"0", "weight">()) == impl(weight));  // the registry and an optimizer keep it
  CHECK(impl(target->named_parameters()["0.weight"]) == impl(weight));
  CHECK(weight.allclose(expected));
  CHECK(weight.requires_grad());
  CHECK(weight.grad_fn() == nullptr);
  target->lerp_(online->tensordict(), at::full({}, 1.0));
  CHECK(weight.equal(online->get<"0", "weight">()));

  torch::nn::Sequential seq(torch::nn::Linear(3, 2));
  auto any_online = from_module(seq, tdn::as_module);
  auto any_target = tdn::AnyTensorDictParams(std::make_shared<tdn::AnyTensorDictParamsImpl>(any_online->tensordict().detach().clone().zero_()));
  any_target->lerp_(any_online->tensordict(), 0.5);
  CHECK(any_target->tensordict().get("0", "weight").allclose(seq[0]->as<torch::nn::Linear>()->weight * 0.5));
}

TEST_CASE("a get hook sees every read", "[params]") {
  auto p = tdn::TensorDictParams(from_module(make_mlp()).detach().clone());
  int reads = 0;
  p->register_get_post_hook([&](const auto&, const at::Tensor& t) {
    ++reads;
    return t.detach();
  });
  CHECK(!p->get<"0", "weight">().requires_grad());
  CHECK(reads == 1);
  for (const auto& v : p->values()) CHECK(!v.requires_grad());
  CHECK(reads == 5);
  for (const auto& [k, v] : p->items()) CHECK(!v.requires_grad());
  CHECK(reads == 9);
  CHECK(!p->leaf(0).requires_grad());
  CHECK(reads == 10);
  p->register_get_post_hook([](const auto&, const at::Tensor&) { return at::Tensor(); });  // undefined: keep the value
  CHECK(p->get<"0", "bias">().defined());
}

TEST_CASE("state_dict and load_state_dict", "[params]") {
  auto p = tdn::TensorDictParams(from_module(make_mlp()).detach().clone());
  auto q = tdn::TensorDictParams(from_module(make_mlp()).detach().clone());
  const c10::TensorImpl* before = impl(q->get<"0", "weight">());
  q->load_state_dict(p->state_dict());
  CHECK(q->get<"0", "weight">().equal(p->get<"0", "weight">()));
  CHECK(impl(q->get<"0", "weight">()) == before);

  auto partial = p->state_dict();
  partial.erase("1.bias");
  partial.insert("2.weight", at::zeros({1}));
  CHECK_THROWS_WITH(q->load_state_dict(partial), Contains("missing keys [\"1.bias\"]") && Contains("unexpected keys [\"2.weight\"]"));
  auto old_bias = q->get<"1", "bias">().clone();
  p->get<"0", "bias">().detach().fill_(7);
  partial = p->state_dict();
  partial.erase("1.bias");
  q->load_state_dict(partial, /*strict=*/false);
  CHECK((q->get<"0", "bias">() == 7).all().item<bool>());
  CHECK(q->get<"1", "bias">().equal(old_bias));
  auto wrong = p->state_dict();
  wrong["0.bias"] = at::zeros({5});
  CHECK_THROWS_AS(q->load_state_dict(wrong), shape_error);
}

TEST_CASE("an optimizer step changes the wrapped TensorDict", "[params]") {
  std::vector<mlp_t> nets{make_mlp(), make_mlp()};
  auto stacked = from_modules(nets, tdn::as_module);
  auto before = stacked->tensordict().clone();
  torch::optim::SGD sgd(stacked->parameters(), 0.1);
  auto x = at::randn({5, 3});
  tdn::functional_vmap(nets[0], stacked->tensordict(), tdn::args(x)).pow(2).sum().backward();
  sgd.step();
  CHECK(!(stacked->tensordict() == before).all());
}

TEST_CASE("to, and clone with its kinds and ties", "[params]") {
  auto td = from_module(make_mlp()).detach().clone();
  td.set<"1", "bias">(td.get<"0", "bias">());  // one tensor at two paths
  auto p = tdn::TensorDictParams(td);
  p->to(at::kDouble);
  CHECK(td.get<"0", "weight">().scalar_type() == at::kDouble);  // same tensors
  auto c = p->clone_params();
  CHECK(impl(c->get<"0", "weight">()) != impl(p->get<"0", "weight">()));
  CHECK(c->get<"0", "weight">().equal(p->get<"0", "weight">()));
  CHECK(impl(c->get<"0", "bias">()) == impl(c->get<"1", "bias">()));
  CHECK(c->named_parameters().size() == p->named_parameters().size());
}

TEST_CASE("as_module for run-time models: a Sequential's and stacked LSTMs' tensors, registered as the module did", "[params]") {
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
  tdn::AnyTensorDictParams params = from_module(net, tdn::as_module);
  auto named = params->named_parameters();
  CHECK(named.size() == 4);
  CHECK(impl(named["0.weight"]) == impl(net[0]->as<torch::nn::Linear>()->weight));
  CHECK(params->named_buffers().contains("1.running_mean"));
  CHECK_FALSE(named.contains("1.running_mean"));
  CHECK(impl(params->tensordict().get("1", "bias")) == impl(named["1.bias"]));

  std::vector<torch::nn::LSTM> lstms{torch::nn::LSTM(2, 3), torch::nn::LSTM(2, 3)};
  auto stacked = from_modules(lstms, tdn::as_module);
  CHECK(stacked->parameters().size() == 4);
  CHECK(stacked->tensordict().batch_size() == c10::IntArrayRef{2});
  const auto before = stacked->tensordict().get("weight_hh_l0").clone();
  torch::optim::SGD sgd(stacked->parameters(), 0.1);
  auto x = at::randn({4, 1, 2});
  auto [y, state] = tdn::functional_vmap(lstms[0], stacked->tensordict(), tdn::args(x));
  y.sum().backward();
  sgd.step();
  CHECK_FALSE(stacked->tensordict().get("weight_hh_l0").equal(before));
  CHECK_FALSE(lstms[0]->named_parameters()["weight_hh_l0"].equal(stacked->tensordict().get("weight_hh_l0")[0]));  // the modules keep theirs
}

TEST_CASE("torch::nn::Module::clone() works on TensorDictParams, keeping kinds and ties", "[params]") {
  // Issue 12, defect 5: the inherited clone() threw "clone() has not been implemented".
  auto td = from_module(make_mlp()).detach().clone();
  td.set<"1", "bias">(td.get<"0", "bias">());
  auto p = tdn::TensorDictParams(td);
  std::shared_ptr<torch::nn::Module> base = p.ptr();
  auto copy = std::dynamic_pointer_cast<tdn::TensorDictParamsImpl<mlp_schema>>(base->clone());
  REQUIRE(copy);
  CHECK(impl(copy->get<"0", "weight">()) != impl(p->get<"0", "weight">()));
  CHECK(copy->get<"0", "weight">().equal(p->get<"0", "weight">()));
  CHECK(impl(copy->get<"0", "bias">()) == impl(copy->get<"1", "bias">()));
  CHECK(copy->named_parameters().keys() == p->named_parameters().keys());
  CHECK(copy->named_buffers().keys() == p->named_buffers().keys());
}
