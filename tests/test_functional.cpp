#include <stdexcept>

#include "catch_torch.hpp"
#include "test_helpers.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>

#include <tensordict/functional.hpp>
#include <tensordict/nn/functional_vmap.hpp>
#include <tensordict/nn/reset_parameters.hpp>

using namespace tensordict;
using test::impl;
using test::printed;
namespace tdn = tensordict::nn;
using test::Contains;

// ---- user modules of the tests ----------------------------------------------

struct ScaledNetImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  at::Tensor scale;
  ScaledNetImpl() {
    fc = register_module("fc", torch::nn::Linear(3, 2));
    scale = register_parameter("scale", at::ones({2}));
  }
  at::Tensor forward(const at::Tensor& x) { return fc->forward(x) * scale; }
};
TENSORDICT_MODULE(ScaledNetImpl, fc, scale);
TORCH_MODULE(ScaledNet);

// Names only one of its two tensors.
struct ForgetfulImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  at::Tensor extra;
  ForgetfulImpl() {
    fc = register_module("fc", torch::nn::Linear(3, 2));
    extra = register_buffer("extra", at::zeros({2}));
  }
};
TENSORDICT_MODULE(ForgetfulImpl, fc);

struct ThrowingImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  ThrowingImpl() { fc = register_module("fc", torch::nn::Linear(3, 2)); }
  at::Tensor forward(const at::Tensor& x) {
    fc->forward(x);
    throw std::runtime_error("forward failed");
  }
};
TENSORDICT_MODULE(ThrowingImpl, fc);

// One Linear registered under two names.
struct TwiceImpl : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr};
  TwiceImpl() {
    a = register_module("a", torch::nn::Linear(3, 3));
    b = register_module("b", a);
  }
  at::Tensor forward(const at::Tensor& x) { return b->forward(a->forward(x)); }
};
TENSORDICT_MODULE(TwiceImpl, a, b);

namespace {
using mlp_t = tdn::Sequential<torch::nn::Linear, torch::nn::ReLU, torch::nn::Linear>;
mlp_t make_mlp() { return mlp_t(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 1)); }

std::vector<std::string> names_of(const torch::OrderedDict<std::string, at::Tensor>& dict) {
  std::vector<std::string> out;
  for (const auto& item : dict) out.push_back(item.key());
  return out;
}
}  // namespace

// ---- schemas ------------------------------------------------------------------

using linear_schema = schema<leaf<"weight">, leaf<"bias">>;
static_assert(std::is_same_v<tdn::schema_of<torch::nn::LinearImpl>, linear_schema>);
static_assert(std::is_same_v<tdn::schema_of<torch::nn::Conv2dImpl>, linear_schema>);
static_assert(std::is_same_v<tdn::schema_of<torch::nn::EmbeddingImpl>, schema<leaf<"weight">>>);
static_assert(std::is_same_v<tdn::schema_of<torch::nn::BatchNorm1dImpl>,
                             schema<leaf<"weight">, leaf<"bias">, leaf<"running_mean">, leaf<"running_var">,
                                    leaf<"num_batches_tracked">>>);
static_assert(std::is_same_v<tdn::schema_of<torch::nn::ReLUImpl>, schema<>>);
static_assert(std::is_same_v<tdn::schema_of<torch::nn::DropoutImpl>, schema<>>);
static_assert(std::is_same_v<tdn::schema_of<mlp_t::Impl>, schema<field<"0", linear_schema>, field<"2", linear_schema>>>);
static_assert(std::is_same_v<tdn::schema_of<ScaledNetImpl>, schema<field<"fc", linear_schema>, leaf<"scale">>>);
// A holder names the schema of the module it holds, as its Impl does.
static_assert(std::is_same_v<tdn::schema_of<mlp_t>, tdn::schema_of<mlp_t::Impl>>);
static_assert(std::is_same_v<tdn::schema_of<torch::nn::Linear>, linear_schema>);
static_assert(std::is_same_v<tdn::schema_of<std::shared_ptr<torch::nn::LinearImpl>>, linear_schema>);

TEST_CASE("the typed Sequential registers its children as Python's nn.Sequential", "[functional]") {
  auto net = make_mlp();
  CHECK(names_of(net->named_parameters()) == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  auto x = at::randn({5, 3});
  auto expected = net->child<2>()->forward(net->child<1>()->forward(net->child<0>()->forward(x)));
  // Linears and ReLUs run as one Linear run (the library's kernels): the modules' values within rounding.
  CHECK(net->forward(x).allclose(expected, 1e-6, 1e-6));
}

// ---- from_module ------------------------------------------------------------------

TEST_CASE("from_module holds the module's own tensors", "[functional]") {
  auto net = make_mlp();
  auto params = from_module(net);
  CHECK(printed(params) ==
        "TensorDict(batch_size=[], fields={0: {bias: f32[4], weight: f32[4,3]}, 2: {bias: f32[1], weight: f32[1,4]}})");
  CHECK(impl(params.get<"0", "weight">()) == impl(net->child<0>()->weight));
  CHECK(impl(params.get<"2", "bias">()) == impl(net->named_parameters()["2.bias"]));

  torch::nn::BatchNorm1d bn(4);
  auto stats = from_module(bn);
  CHECK(impl(stats.get<"running_mean">()) == impl(bn->running_mean));
  CHECK(impl(stats.get<"num_batches_tracked">()) == impl(bn->num_batches_tracked));

  ScaledNet user;
  auto p = from_module(user);
  CHECK(impl(p.get<"fc", "weight">()) == impl(user->fc->weight));
  CHECK(impl(p.get<"scale">()) == impl(user->scale));
}

TEST_CASE("a Linear without bias has no bias key", "[functional]") {
  torch::nn::Linear no_bias(torch::nn::LinearOptions(3, 4).bias(false));
  auto params = from_module(no_bias);
  REQUIRE(params.keys().size() == 1);
  CHECK(params.keys()[0].join(".") == "weight");
  CHECK(printed(params) == "TensorDict(batch_size=[], fields={weight: f32[4,3]})");
  CHECK_THROWS_AS(params.get<"bias">(), key_error);
  auto x = at::randn({2, 3});
  CHECK(functional_call(no_bias, params, x).equal(no_bias->forward(x)));

  // A bias where the module has none is refused, and nothing changes.
  torch::nn::Linear with_bias(3, 4);
  auto full = from_module(with_bias).clone();
  CHECK_THROWS_WITH(to_module(full, no_bias), Contains(R"("bias")") && Contains("no tensor"));
  CHECK(!no_bias->bias.defined());
}

TEST_CASE("from_module refuses a module that registered a tensor its schema lacks", "[functional]") {
  auto m = std::make_shared<ForgetfulImpl>();
  CHECK_THROWS_WITH(from_module(m), Contains(R"(buffer "extra")") && Contains("TENSORDICT_MODULE"));
}

// ---- to_module ----------------------------------------------------------------------

TEST_CASE("to_module swaps the tensors for the scope of the guard", "[functional]") {
  auto net = make_mlp();
  auto params = from_module(net);
  auto zeros = params.detach().clone().zero_();
  auto x = at::randn({5, 3});
  const at::Tensor original_weight = net->child<0>()->weight;
  {
    auto swap = to_module(zeros, net);
    CHECK((net->forward(x) == 0).all().item<bool>());
    // The registry shows the swapped tensors too.
    CHECK(impl(net->named_parameters()["0.weight"]) == impl(zeros.get<"0", "weight">()));
    CHECK(impl(net->child<2>()->named_parameters()["bias"]) == impl(zeros.get<"2", "bias">()));
  }
  CHECK(impl(net->child<0>()->weight) == impl(original_weight));
  CHECK(impl(net->named_parameters()["0.weight"]) == impl(original_weight));
  CHECK(!(net->forward(x) == 0).all().item<bool>());
}

TEST_CASE("to_module restores after a throwing forward", "[functional]") {
  auto m = std::make_shared<ThrowingImpl>();
  const at::Tensor w = m->fc->weight;
  auto zeros = from_module(m).detach().clone().zero_();
  try {
    auto swap = to_module(zeros, m);
    m->forward(at::randn({1, 3}));
    FAIL("forward did not throw");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "forward failed");
  }
  CHECK(impl(m->fc->weight) == impl(w));
  CHECK(impl(m->named_parameters()["fc.weight"]) == impl(w));
}

TEST_CASE("gradients reach the swapped-in tensors, not the module's", "[functional]") {
  auto net = make_mlp();
  auto params = from_module(net).detach().clone().apply([](const at::Tensor& t) { return t.requires_grad_(); });
  {
    auto swap = to_module(params, net);
    net->forward(at::randn({5, 3})).sum().backward();
  }
  CHECK(params.get<"0", "weight">().grad().defined());
  CHECK(params.get<"2", "bias">().grad().defined());
  CHECK(!net->child<0>()->weight.grad().defined());
}

TEST_CASE("a mismatched shape throws before anything is swapped", "[functional]") {
  auto net = make_mlp();
  auto params = from_module(net).detach().clone();
  params.set<"2", "bias">(at::zeros({3}));  // the last leaf is wrong
  const at::Tensor w = net->child<0>()->weight;
  CHECK_THROWS_WITH(to_module(params, net), Contains(R"(("2", "bias"))") && Contains("f32[3]") && Contains("f32[1]"));
  CHECK(impl(net->child<0>()->weight) == impl(w));
  params.set<"2", "bias">(at::zeros({1}, at::kDouble));
  CHECK_THROWS_AS(to_module(params, net), shape_error);
}

TEST_CASE("nested guards unwind in order; release keeps the swap", "[functional]") {
  auto net = make_mlp();
  auto original = from_module(net);
  auto ones = original.detach().clone().apply_([](at::Tensor& t) { t.fill_(1); });
  auto twos = original.detach().clone().apply_([](at::Tensor& t) { t.fill_(2); });
  {
    auto outer = to_module(ones, net);
    {
      auto inner = to_module(twos, net);
      CHECK(impl(net->child<0>()->weight) == impl(twos.get<"0", "weight">()));
    }
    CHECK(impl(net->child<0>()->weight) == impl(ones.get<"0", "weight">()));
    auto moved = std::move(outer);  // the guard moves; only one restores
  }
  CHECK(impl(net->child<0>()->weight) == impl(original.get<"0", "weight">()));

  auto replaced = to_module(ones, net).release();
  CHECK(impl(net->child<2>()->weight) == impl(ones.get<"2", "weight">()));
  CHECK(impl(replaced.get<"2", "weight">()) == impl(original.get<"2", "weight">()));
  to_module(replaced, net).release();
  CHECK(impl(net->child<2>()->weight) == impl(original.get<"2", "weight">()));
}

TEST_CASE("a sub-module used twice is swapped and restored", "[functional]") {
  auto m = std::make_shared<TwiceImpl>();
  auto params = from_module(m);
  CHECK(impl(params.get<"a", "weight">()) == impl(params.get<"b", "weight">()));
  const at::Tensor w = m->a->weight;
  auto zeros = params.detach().clone().zero_();
  {
    auto swap = to_module(zeros, m);
    CHECK((m->forward(at::randn({2, 3})) == 0).all().item<bool>());
  }
  CHECK(impl(m->a->weight) == impl(w));
  CHECK(impl(m->b->weight) == impl(w));
}

TEST_CASE("to_module_ copies values into the module's own tensors", "[functional]") {
  auto net = make_mlp();
  const at::Tensor w = net->child<0>()->weight;
  auto ones = from_module(net).detach().clone().apply_([](at::Tensor& t) { t.fill_(1); });
  to_module_(ones, net);
  CHECK(impl(net->child<0>()->weight) == impl(w));
  CHECK((w == 1).all().item<bool>());
  CHECK(w.requires_grad());
}

// ---- from_modules -------------------------------------------------------------------

TEST_CASE("from_modules stacks new leaves", "[functional]") {
  std::vector<mlp_t> nets{make_mlp(), make_mlp(), make_mlp()};
  auto stacked = from_modules(nets);
  CHECK(stacked.batch_size() == c10::IntArrayRef({3}));
  for (int i = 0; i < 3; ++i) CHECK(stacked.get<"0", "weight">()[i].equal(nets[i]->child<0>()->weight));
  CHECK(stacked.get<"0", "weight">().requires_grad());
  CHECK(stacked.get<"0", "weight">().is_leaf());
  stacked.get<"0", "weight">().sum().backward();
  CHECK(stacked.get<"0", "weight">().grad().defined());
  CHECK(!nets[0]->child<0>()->weight.grad().defined());

  auto variadic = from_modules(nets[0], nets[1]);
  CHECK(variadic.batch_size() == c10::IntArrayRef({2}));

  torch::nn::BatchNorm1d bn1(4), bn2(4);
  auto stats = from_modules(bn1, bn2);
  CHECK(!stats.get<"running_mean">().requires_grad());

  std::vector<torch::nn::Linear> odd{torch::nn::Linear(3, 4), torch::nn::Linear(3, 4), torch::nn::Linear(3, 5)};
  CHECK_THROWS_WITH(from_modules(odd), Contains(R"("weight")") && Contains("f32[4,3]") && Contains("f32[5,3]") &&
                                           Contains("TensorDict 2"));
}

TEST_CASE("from_modules with expand_identical stores a shared sub-module once", "[functional]") {
  torch::nn::Linear shared(3, 4);
  std::vector<mlp_t> nets{mlp_t(shared, torch::nn::ReLU(), torch::nn::Linear(4, 1)),
                          mlp_t(shared, torch::nn::ReLU(), torch::nn::Linear(4, 1))};
  REQUIRE(impl(nets[0]->child<0>()->weight) == impl(nets[1]->child<0>()->weight));
  auto stacked = from_modules(nets, {.expand_identical = true});
  const at::Tensor w = stacked.get<"0", "weight">();
  CHECK(w.sizes() == c10::IntArrayRef{2, 4, 3});
  CHECK(w.stride(0) == 0);
  CHECK(w.data_ptr() == shared->weight.data_ptr());
  CHECK(stacked.get<"2", "weight">().is_leaf());  // not shared: stacked copies, as without the option
  CHECK(stacked.get<"2", "weight">().data_ptr() != nets[0]->child<2>()->weight.data_ptr());
  (w * 2).sum().backward();
  REQUIRE(shared->weight.grad().defined());
  CHECK(shared->weight.grad().eq(4).all().item<bool>());  // 2 members x 2
  CHECK_FALSE(from_modules(nets).get<"0", "weight">().data_ptr() == shared->weight.data_ptr());
}

// ---- functional_call ----------------------------------------------------------------

template <class Module, class Input>
void check_functional_call(Module module, const Input& x) {
  auto params = from_module(module).detach().clone().apply_([](at::Tensor& t) {
    if (t.is_floating_point()) t.mul_(0.5);
  });
  at::Tensor expected;
  {
    auto swap = to_module(params, module);
    expected = module->forward(x);
  }
  auto before = from_module(module);
  CHECK(functional_call(module, params, x).allclose(expected));
  CHECK(functional_call(module, params.flatten_keys(), x).allclose(expected));
  CHECK((from_module(module) == before).all());
}

TEST_CASE("functional_call matches the module's forward for every built-in type", "[functional]") {
  check_functional_call(torch::nn::Linear(3, 4), at::randn({5, 3}));
  check_functional_call(torch::nn::Conv1d(torch::nn::Conv1dOptions(2, 3, 3).padding(1)), at::randn({2, 2, 8}));
  check_functional_call(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 3).stride(2).groups(1)), at::randn({2, 2, 9, 9}));
  check_functional_call(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 4, 3).padding(1).padding_mode(torch::kReflect).groups(2)),
                        at::randn({1, 2, 6, 6}));
  check_functional_call(torch::nn::Conv3d(torch::nn::Conv3dOptions(1, 2, 2)), at::randn({1, 1, 4, 4, 4}));
  check_functional_call(torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(2, 3, 3).stride(2).output_padding(1)),
                        at::randn({1, 2, 5, 5}));
  check_functional_call(torch::nn::LayerNorm(torch::nn::LayerNormOptions({4})), at::randn({3, 4}));
  check_functional_call(torch::nn::GroupNorm(2, 4), at::randn({3, 4, 5}));
  check_functional_call(torch::nn::Embedding(10, 3), at::randint(0, 10, {4, 2}));
  torch::nn::BatchNorm1d bn(4);
  bn->eval();
  check_functional_call(bn, at::randn({6, 4}));
  check_functional_call(make_mlp(), at::randn({5, 3}));
  check_functional_call(ScaledNet(), at::randn({5, 3}));
}

TEST_CASE("functional_call matches the forward of the convolution, normalization, activation and cell adapters", "[functional]") {
  check_functional_call(torch::nn::ConvTranspose1d(torch::nn::ConvTranspose1dOptions(2, 3, 3).stride(2).output_padding(1)),
                        at::randn({2, 2, 6}));
  check_functional_call(torch::nn::ConvTranspose3d(torch::nn::ConvTranspose3dOptions(1, 2, 2).groups(1)), at::randn({1, 1, 3, 3, 3}));
  torch::nn::BatchNorm3d bn3(2);
  bn3->eval();
  check_functional_call(bn3, at::randn({2, 2, 3, 3, 3}));
  check_functional_call(torch::nn::InstanceNorm1d(torch::nn::InstanceNorm1dOptions(3).affine(true)), at::randn({2, 3, 7}));
  check_functional_call(torch::nn::InstanceNorm1d(torch::nn::InstanceNorm1dOptions(3).affine(true)), at::randn({3, 7}));  // unbatched
  torch::nn::InstanceNorm2d tracked(torch::nn::InstanceNorm2dOptions(2).affine(true).track_running_stats(true));
  tracked->eval();
  tracked->running_mean.normal_();
  check_functional_call(tracked, at::randn({2, 2, 4, 4}));
  check_functional_call(torch::nn::InstanceNorm3d(2), at::randn({1, 2, 3, 3, 3}));
  CHECK(from_module(torch::nn::InstanceNorm3d(2)).keys().empty());  // without affine or statistics: no tensors
  check_functional_call(torch::nn::PReLU(torch::nn::PReLUOptions().num_parameters(3)), at::randn({4, 3, 5}));
  check_functional_call(torch::nn::RNNCell(torch::nn::RNNCellOptions(3, 5).nonlinearity(torch::kReLU)), at::randn({4, 3}));
  check_functional_call(torch::nn::RNNCell(3, 5), at::randn({4, 3}));
  check_functional_call(torch::nn::GRUCell(torch::nn::GRUCellOptions(3, 5).bias(false)), at::randn({4, 3}));
}

TEST_CASE("functional_call of the cells with a hidden state, unbatched, and of Bilinear: values and gradients", "[functional]") {
  torch::nn::GRUCell gru(3, 4);
  auto x = at::randn({2, 3}), h = at::randn({2, 4});
  auto gru_params = from_module(gru).detach().clone().apply([](const at::Tensor& t) { return t.mul(0.5).requires_grad_(); });
  at::Tensor expected;
  {
    auto swap = to_module(gru_params, gru);
    expected = gru->forward(x, h);
    expected.sum().backward();
  }
  const at::Tensor module_grad = gru_params.get<"weight_hh">().grad().clone();
  gru_params.apply_([](at::Tensor& t) { t.mutable_grad().reset(); });
  at::Tensor y = functional_call(gru, gru_params, x, h);
  CHECK(at::allclose(y, expected));
  y.sum().backward();
  CHECK(at::allclose(gru_params.get<"weight_hh">().grad(), module_grad));
  CHECK(at::allclose(functional_call(gru, gru_params, x[0], h[0]), expected[0]));  // unbatched

  torch::nn::LSTMCell lstm(3, 4);
  auto lstm_params = from_module(lstm).detach().clone().apply([](const at::Tensor& t) { return t.mul(-0.5); });
  auto c = at::randn({2, 4});
  std::tuple<at::Tensor, at::Tensor> state;
  {
    auto swap = to_module(lstm_params, lstm);
    state = lstm->forward(x, std::make_tuple(h, c));
  }
  auto [h1, c1] = functional_call(lstm, lstm_params, x, std::make_tuple(h, c));
  CHECK(at::allclose(h1, std::get<0>(state)));
  CHECK(at::allclose(c1, std::get<1>(state)));
  auto [h0, c0] = functional_call(lstm, lstm_params, x);  // zeros for (h, c), as the module's forward
  {
    auto swap = to_module(lstm_params, lstm);
    CHECK(at::allclose(h0, std::get<0>(lstm->forward(x))));
    CHECK(at::allclose(c0, std::get<1>(lstm->forward(x))));
  }
  auto [hu, cu] = functional_call(lstm, lstm_params, x[1], std::make_tuple(h[1], c[1]));
  CHECK(at::allclose(hu, std::get<0>(state)[1]));
  CHECK(at::allclose(cu, std::get<1>(state)[1]));

  torch::nn::Bilinear bilinear(3, 2, 4);
  auto b_params = from_module(bilinear).detach().clone().apply([](const at::Tensor& t) { return t.mul(2); });
  auto x1 = at::randn({5, 3}), x2 = at::randn({5, 2});
  at::Tensor b_expected;
  {
    auto swap = to_module(b_params, bilinear);
    b_expected = bilinear->forward(x1, x2);
  }
  CHECK(at::allclose(functional_call(bilinear, b_params, x1, x2), b_expected));
}

TEST_CASE("functional_vmap over the new adapters equals a loop over the members", "[functional]") {
  std::vector<torch::nn::GRUCell> cells{torch::nn::GRUCell(3, 4), torch::nn::GRUCell(3, 4), torch::nn::GRUCell(3, 4)};
  auto stacked = from_modules(cells);
  auto x = at::randn({5, 3});
  at::Tensor y = nn::functional_vmap(cells[0], stacked, nn::args(x));
  REQUIRE(y.sizes() == c10::IntArrayRef{3, 5, 4});
  for (int i = 0; i < 3; ++i) CHECK(at::allclose(y[i], cells[i]->forward(x), 1e-5, 1e-6));

  std::vector<torch::nn::PReLU> prelus{torch::nn::PReLU(), torch::nn::PReLU()};
  prelus[1]->weight.data().fill_(0.1);
  auto p = from_modules(prelus);
  auto z = at::randn({4, 2});
  at::Tensor out = nn::functional_vmap(prelus[0], p, nn::args(z));
  for (int i = 0; i < 2; ++i) CHECK(at::allclose(out[i], prelus[i]->forward(z)));
}

TEST_CASE("reset_parameters draws into the TensorDict, one draw per set; the module keeps its values", "[functional]") {
  auto net = make_mlp();  // Linear(3, 4), ReLU, Linear(4, 1)
  const auto own = from_module(net);
  const auto before = own.detach().clone();
  auto fresh = own.detach().clone();
  nn::reset_parameters(net, fresh);
  CHECK_FALSE(at::allclose(fresh.get<"0", "weight">(), before.get<"0", "weight">()));
  CHECK(fresh.get<"0", "weight">().abs().max().item<double>() <= 1 / std::sqrt(3.0));  // Linear's own bound, 1/sqrt(in)
  CHECK(fresh.get<"2", "bias">().abs().max().item<double>() <= 1 / std::sqrt(4.0));
  CHECK((from_module(net) == before).all());
  CHECK(impl(from_module(net).get<"0", "weight">()) == impl(own.get<"0", "weight">()));

  std::vector<decltype(net)> members{make_mlp(), make_mlp(), make_mlp()};
  auto stacked = from_modules(members);
  const auto stacked_before = stacked.detach().clone();
  const auto* w = impl(stacked.get<"0", "weight">());
  nn::reset_parameters(members[0], stacked);
  CHECK(impl(stacked.get<"0", "weight">()) == w);  // written in place
  CHECK_FALSE(at::allclose(stacked.get<"0", "weight">()[0], stacked.get<"0", "weight">()[1]));
  CHECK_FALSE(at::allclose(stacked.get<"0", "weight">()[2], stacked_before.get<"0", "weight">()[2]));
  CHECK(at::allclose(from_module(members[0]).get<"0", "weight">(), stacked_before.get<"0", "weight">()[0]));

  // Buffers and a type whose reset() would register new tensors (PReLU: its adapter's initializer).
  torch::nn::BatchNorm1d bn(4);
  auto stats = from_module(bn).detach().clone();
  stats.get<"running_mean">().fill_(3);
  nn::reset_parameters(bn, stats);
  CHECK(stats.get<"running_mean">().abs().max().item<double>() == 0);
  torch::nn::PReLU prelu(torch::nn::PReLUOptions().num_parameters(2).init(0.5));
  auto slopes = from_module(prelu).detach().clone().apply([](const at::Tensor& t) { return t.mul(3); });
  nn::reset_parameters(prelu, slopes);
  CHECK(at::allclose(slopes.get<"weight">(), at::full({2}, 0.5)));

  // Params that lack a tensor the initialisation writes: refused before any draw.
  TensorDict<nn::schema_of<torch::nn::LinearImpl>> partial;
  torch::nn::Linear linear(2, 2);
  partial.set<"weight">(at::zeros({2, 2}));
  CHECK_THROWS_WITH(nn::reset_parameters(linear, partial), Contains("params has no \"bias\""));
  CHECK(at::allclose(partial.get<"weight">(), at::zeros({2, 2})));
}

TEST_CASE("MultiheadAttention: schema, functional_call with masks and separate projections, gradients, reset_parameters", "[functional]") {
  using namespace torch::nn;
  MultiheadAttention packed(MultiheadAttentionOptions(8, 2));
  auto params = from_module(packed);
  CHECK(params.leaf(leaf_index_v<nn::schema_of<MultiheadAttentionImpl>, "in_proj_weight">).sizes() == c10::IntArrayRef{24, 8});
  CHECK_FALSE(params.leaf(leaf_index_v<nn::schema_of<MultiheadAttentionImpl>, "q_proj_weight">).defined());
  CHECK(impl(params.get<"out_proj", "weight">()) == impl(packed->out_proj->weight));

  auto q = at::randn({5, 3, 8}), k = at::randn({4, 3, 8}), v = at::randn({4, 3, 8});
  auto other = params.detach().clone().apply([](const at::Tensor& t) { return t.mul(0.7).requires_grad_(); });
  auto padding = at::zeros({3, 4}, at::kBool);
  padding.index_put_({1, 3}, true);
  auto attn_mask = at::zeros({5, 4});
  attn_mask.index_put_({0, 0}, -1e4);
  std::tuple<at::Tensor, at::Tensor> expected;
  {
    auto swap = to_module(other, packed, swap_mode::as_given);
    expected = packed->forward(q, k, v, padding, true, attn_mask);
  }
  auto [out, weights] = functional_call(packed, other, q, k, v, padding, true, attn_mask);
  CHECK(at::allclose(out, std::get<0>(expected), 1e-5, 1e-6));
  CHECK(at::allclose(weights, std::get<1>(expected), 1e-5, 1e-6));
  out.sum().backward();
  CHECK(other.get<"in_proj_weight">().grad().defined());
  CHECK(other.get<"out_proj", "bias">().grad().defined());
  CHECK_FALSE(packed->in_proj_weight.grad().defined());

  MultiheadAttention separate(MultiheadAttentionOptions(8, 4).kdim(6).vdim(6).add_bias_kv(true));  // libtorch wants key and value of one shape
  auto sep = from_module(separate).detach().clone().apply([](const at::Tensor& t) { return t.mul(-0.5); });
  CHECK(sep.get<"k_proj_weight">().sizes() == c10::IntArrayRef{8, 6});
  CHECK(sep.get<"bias_k">().sizes() == c10::IntArrayRef{1, 1, 8});
  auto ks = at::randn({4, 3, 6}), vs = at::randn({4, 3, 6});
  at::Tensor sep_expected;
  {
    auto swap = to_module(sep, separate);
    sep_expected = std::get<0>(separate->forward(q, ks, vs, {}, false));
  }
  CHECK(at::allclose(std::get<0>(functional_call(separate, sep, q, ks, vs, at::Tensor(), false)), sep_expected, 1e-5, 1e-6));

  auto fresh = from_module(packed).detach().clone();
  const auto kept = from_module(packed).detach().clone();
  nn::reset_parameters(packed, fresh);
  CHECK_FALSE(at::allclose(fresh.get<"in_proj_weight">(), kept.get<"in_proj_weight">()));
  CHECK(fresh.get<"in_proj_bias">().abs().max().item<double>() == 0);  // _reset_parameters: zero biases
  CHECK(at::equal(packed->in_proj_weight, kept.get<"in_proj_weight">()));
  CHECK(at::equal(packed->out_proj->weight, kept.get<"out_proj", "weight">()));
}

TEST_CASE("TransformerEncoderLayer: functional_call equals its forward (ReLU, GELU), gradients; a run-time Sequential", "[functional]") {
  using namespace torch::nn;
  for (bool gelu : {false, true}) {
    auto options = TransformerEncoderLayerOptions(8, 2).dim_feedforward(16).dropout(0.0);
    if (gelu) options.activation(torch::kGELU);
    TransformerEncoderLayer layer(options);
    auto params = from_module(layer).detach().clone().apply([](const at::Tensor& t) { return t.mul(0.9).requires_grad_(); });
    CHECK(params.get<"self_attn", "in_proj_weight">().sizes() == c10::IntArrayRef{24, 8});
    auto src = at::randn({5, 3, 8});
    auto mask = at::zeros({5, 5});
    mask.index_put_({0, 4}, -1e4);
    at::Tensor expected;
    {
      auto swap = to_module(params, layer, swap_mode::as_given);
      expected = layer->forward(src, mask);
    }
    at::Tensor y = functional_call(layer, params, src, mask);
    CHECK(at::allclose(y, expected, 1e-5, 1e-6));
    y.sum().backward();
    CHECK(params.get<"linear1", "weight">().grad().defined());
    CHECK(params.get<"self_attn", "out_proj", "weight">().grad().defined());
  }

  Sequential net(Linear(4, 8), TransformerEncoderLayer(TransformerEncoderLayerOptions(8, 2).dim_feedforward(16).dropout(0.0)));
  auto any = from_module(net);
  auto other = any.clone().apply([](const at::Tensor& t) { return t.mul(1.1); });
  auto x = at::randn({6, 2, 4});
  at::Tensor expected;
  {
    auto swap = to_module(other, net);
    expected = net->forward(x);
  }
  CHECK(at::allclose(functional_call(net, other, x), expected, 1e-5, 1e-6));
}

TEST_CASE("TransformerDecoderLayer: functional_call equals its forward with masks, gradients; reset_parameters", "[functional]") {
  using namespace torch::nn;
  for (bool gelu : {false, true}) {
    auto options = TransformerDecoderLayerOptions(8, 2).dim_feedforward(16).dropout(0.0);
    if (gelu) options.activation(torch::kGELU);
    TransformerDecoderLayer layer(options);
    auto params = from_module(layer).detach().clone().apply([](const at::Tensor& t) { return t.mul(0.9).requires_grad_(); });
    CHECK(params.get<"multihead_attn", "in_proj_weight">().sizes() == c10::IntArrayRef{24, 8});
    CHECK(impl(from_module(layer).get<"norm3", "weight">()) == impl(layer->norm3->weight));
    auto tgt = at::randn({4, 3, 8}), memory = at::randn({6, 3, 8});
    auto tgt_mask = at::zeros({4, 4});
    tgt_mask.select(0, 0).select(0, 3).fill_(-1e4);
    auto memory_padding = at::zeros({3, 6}, at::kBool);
    memory_padding.select(0, 1).select(0, 5).fill_(true);
    at::Tensor expected;
    {
      auto swap = to_module(params, layer, swap_mode::as_given);
      expected = layer->forward(tgt, memory, tgt_mask, {}, {}, memory_padding);
    }
    at::Tensor y = functional_call(layer, params, tgt, memory, tgt_mask, at::Tensor(), at::Tensor(), memory_padding);
    CHECK(at::allclose(y, expected, 1e-5, 1e-6));
    y.sum().backward();
    CHECK(params.get<"multihead_attn", "in_proj_weight">().grad().defined());
    CHECK(params.get<"norm3", "bias">().grad().defined());
  }
  TransformerDecoderLayer layer(TransformerDecoderLayerOptions(8, 2).dim_feedforward(16));
  auto fresh = from_module(layer).detach().clone();
  const auto kept = from_module(layer).detach().clone();
  nn::reset_parameters(layer, fresh);
  CHECK_FALSE(at::allclose(fresh.get<"multihead_attn", "in_proj_weight">(), kept.get<"multihead_attn", "in_proj_weight">()));
  CHECK(at::equal(layer->linear1->weight, kept.get<"linear1", "weight">()));
}

TEST_CASE("EmbeddingBag: functional_call equals its forward (modes, offsets, per-sample weights), gradients", "[functional]") {
  using namespace torch::nn;
  check_functional_call(EmbeddingBag(EmbeddingBagOptions(10, 3).mode(torch::kMax)), at::randint(0, 10, {4, 5}));
  EmbeddingBag bag(EmbeddingBagOptions(10, 3).mode(torch::kSum).include_last_offset(true));
  auto params = from_module(bag).detach().clone().apply([](const at::Tensor& t) { return t.mul(0.5).requires_grad_(); });
  CHECK(impl(from_module(bag).get<"weight">()) == impl(bag->weight));
  auto indices = at::randint(0, 10, {7});
  auto offsets = at::tensor(std::vector<std::int64_t>{0, 2, 2, 7});
  auto per_sample = at::randn({7});
  at::Tensor expected;
  {
    auto swap = to_module(params, bag, swap_mode::as_given);
    expected = bag->forward(indices, offsets, per_sample);
  }
  at::Tensor y = functional_call(bag, params, indices, offsets, per_sample);
  CHECK(y.sizes() == c10::IntArrayRef{3, 3});
  CHECK(at::allclose(y, expected, 1e-5, 1e-6));
  y.sum().backward();
  CHECK(params.get<"weight">().grad().defined());
  CHECK_FALSE(bag->weight.grad().defined());
}

TEST_CASE("functional_call of BatchNorm in training updates the TensorDict's statistics", "[functional]") {
  torch::nn::BatchNorm1d bn(4);
  auto stats = from_module(bn).detach().clone();
  auto x = at::randn({8, 4});
  auto y = functional_call(bn, stats, x);
  CHECK(stats.get<"num_batches_tracked">().item<std::int64_t>() == 1);
  CHECK(bn->num_batches_tracked.item<std::int64_t>() == 0);
  CHECK(!stats.get<"running_mean">().equal(bn->running_mean));
  CHECK(y.allclose(bn->forward(x)));
  CHECK(stats.get<"running_mean">().allclose(bn->running_mean));
}

TEST_CASE("to_module keeps the module's requires_grad flags; swap_mode::as_given installs tensors as they are", "[functional]") {
  // Issue 12, defect 4: detached tensors over a Linear with a frozen weight made the bias untrainable.
  torch::nn::Linear net(3, 2);
  net->weight.set_requires_grad(false);
  auto values = from_module(net).detach().clone();  // neither requires grad
  {
    auto swap = to_module(values, net);
    CHECK(impl(net->weight) == impl(values.get<"weight">()));  // the same tensors
    CHECK_FALSE(net->weight.requires_grad());
    CHECK(net->bias.requires_grad());  // still trainable during the swap
    CHECK(net->named_parameters()["bias"].requires_grad());
    auto y = net->forward(at::randn({4, 3})).sum();
    y.backward();
    CHECK(values.get<"bias">().grad().defined());
  }
  CHECK_FALSE(values.get<"bias">().requires_grad());  // its own flag again
  CHECK(net->bias.requires_grad());
  {
    auto swap = to_module(values, net, swap_mode::as_given);
    CHECK_FALSE(net->bias.requires_grad());
    CHECK_FALSE(net->named_parameters()["bias"].requires_grad());
  }
}

TEST_CASE("to_module: a tensor that requires grad over a registered buffer stays a buffer", "[functional]") {
  torch::nn::BatchNorm1d bn(3);
  auto values = from_module(bn).detach().clone();
  values.get<"running_mean">().set_requires_grad(true);
  auto swap = to_module(values, bn);
  CHECK(bn->named_buffers().contains("running_mean"));
  CHECK_FALSE(bn->named_parameters().contains("running_mean"));
  CHECK(impl(bn->named_buffers()["running_mean"]) == impl(values.get<"running_mean">()));
  CHECK_FALSE(bn->running_mean.requires_grad());  // the buffer's flag
}
