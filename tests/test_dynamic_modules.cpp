#include "catch_torch.hpp"
#include "test_helpers.hpp"

#include <cmath>

#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/randn_like.h>
#include <ATen/ops/zeros.h>

#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/transformer.h>
#include <torch/nn/modules/transformercoder.h>

#include <tensordict/nn/functional_vmap.hpp>
#include <tensordict/nn/reset_parameters.hpp>
#include <tensordict/files/torch_save.hpp>

using namespace tensordict;
using test::impl;
using test::Contains;

// A user module that owns a tensor: known once registered.
struct ScaleImpl : torch::nn::Module {
  at::Tensor scale;
  ScaleImpl() { scale = register_parameter("scale", at::full({1}, 2.0)); }
  at::Tensor forward(const at::Tensor& x) { return x * scale; }
};
TORCH_MODULE(Scale);
TENSORDICT_MODULE(ScaleImpl, scale);

// The same, never registered.
struct UnregisteredImpl : torch::nn::Module {
  at::Tensor shift;
  UnregisteredImpl() { shift = register_parameter("shift", at::zeros({1})); }
  at::Tensor forward(const at::Tensor& x) { return x + shift; }
};
TORCH_MODULE(Unregistered);
TENSORDICT_MODULE(UnregisteredImpl, shift);

// Registered with a functional form given at run time.
struct OffsetImpl : torch::nn::Module {
  at::Tensor offset;
  OffsetImpl() { offset = register_parameter("offset", at::zeros({3})); }
  at::Tensor forward(const at::Tensor& x) { return x + offset; }
};
TORCH_MODULE(Offset);
TENSORDICT_MODULE(OffsetImpl, offset);

// A user container without tensors of its own, over a ModuleList.
struct BlockImpl : torch::nn::Module {
  torch::nn::ModuleList layers;
  BlockImpl() : layers(register_module("layers", torch::nn::ModuleList(torch::nn::Linear(3, 3), torch::nn::Linear(3, 3)))) {}
  at::Tensor forward(at::Tensor x) {
    for (const auto& layer : *layers) x = layer->as<torch::nn::Linear>()->forward(x).relu();
    return x;
  }
};
TORCH_MODULE(Block);

// A tensor-free user activation: its type is unknown, and it needs not be.
struct SquareImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) { return x * x; }
};
TORCH_MODULE(Square);

namespace {
torch::nn::Sequential make_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(3, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
}

AnyTensorDict randn_like(const AnyTensorDict& td) {
  return td.apply([](const at::Tensor& t) { return at::randn(t.sizes()); });
}
}  // namespace

TEST_CASE("dynamic from_module: a Sequential's own tensors, children without tensors left out", "[dynamic_modules]") {
  auto net = make_mlp();
  auto params = from_module(net);
  CHECK(params.keys() == std::vector<any_key_path>{{"0", "weight"}, {"0", "bias"}, {"2", "weight"}, {"2", "bias"}});
  CHECK(impl(params.get("0", "weight")) == impl(net[0]->as<torch::nn::Linear>()->weight));
  CHECK(params.get("2", "weight").requires_grad());

  torch::nn::Sequential with_bn(torch::nn::Linear(torch::nn::LinearOptions(3, 4).bias(false)), torch::nn::BatchNorm1d(4));
  auto bn = from_module(with_bn);
  CHECK(bn.keys() == std::vector<any_key_path>{{"0", "weight"}, {"1", "weight"}, {"1", "bias"}, {"1", "running_mean"},
                                               {"1", "running_var"}, {"1", "num_batches_tracked"}});
}

TEST_CASE("dynamic from_module: ModuleList, ModuleDict, AnyModule, a base-class reference", "[dynamic_modules]") {
  torch::nn::ModuleList list(torch::nn::Linear(2, 2), torch::nn::ReLU(), Scale());
  CHECK(from_module(list).keys() == std::vector<any_key_path>{{"0", "weight"}, {"0", "bias"}, {"2", "scale"}});

  torch::nn::ModuleDict dict(torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>(
      {{"encoder", torch::nn::Linear(2, 3).ptr()}, {"head", torch::nn::Linear(3, 1).ptr()}}));
  CHECK(from_module(dict).keys() ==
        std::vector<any_key_path>{{"encoder", "weight"}, {"encoder", "bias"}, {"head", "weight"}, {"head", "bias"}});

  torch::nn::AnyModule any(torch::nn::Linear(2, 3));
  CHECK(from_module(any).level_keys() == std::vector<std::string>{"weight", "bias"});

  Block block;
  auto params = from_module(static_cast<torch::nn::Module&>(*block));
  CHECK(params.keys().size() == 4);
  CHECK(params.contains("layers", "1", "bias"));
  std::shared_ptr<torch::nn::Module> base = block.ptr();
  CHECK(from_module(base).leaf_count() == 4);
}

TEST_CASE("dynamic to_module: the forward computes with the new tensors until the guard dies", "[dynamic_modules]") {
  auto net = make_mlp();
  auto x = at::randn({5, 3});
  const at::Tensor before = net->forward(x);
  auto originals = from_module(net);
  auto other = randn_like(originals);
  const at::Tensor w0 = net[0]->as<torch::nn::Linear>()->weight;
  {
    auto swap = to_module(other, net);
    CHECK(impl(net[0]->as<torch::nn::Linear>()->weight) == impl(other.get("0", "weight")));
    CHECK(impl(net->named_parameters()["2.bias"]) == impl(other.get("2", "bias")));
    CHECK_FALSE(at::allclose(net->forward(x), before));
  }
  CHECK(impl(net[0]->as<torch::nn::Linear>()->weight) == impl(w0));
  CHECK(impl(net->named_parameters()["0.weight"]) == impl(w0));
  CHECK(net->forward(x).equal(before));

  // Also when the scope ends with an exception.
  try {
    auto swap = to_module(other, net);
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  CHECK(impl(net[0]->as<torch::nn::Linear>()->weight) == impl(w0));

  // release() keeps the swap and returns the originals; flat (state-dict) keys work too.
  auto kept = to_module(other.flatten_keys(), net).release();
  CHECK(impl(net[2]->as<torch::nn::Linear>()->bias) == impl(other.get("2", "bias")));
  CHECK(impl(kept.get("0", "weight")) == impl(w0));
  auto back = to_module(kept, net).release();
  CHECK(impl(net[0]->as<torch::nn::Linear>()->weight) == impl(w0));
}

TEST_CASE("dynamic to_module: errors name the path, and nothing changes", "[dynamic_modules]") {
  auto net = make_mlp();
  const at::Tensor w0 = net[0]->as<torch::nn::Linear>()->weight;
  AnyTensorDict bad;
  bad.set("0", "weight", at::zeros({8, 3}));
  bad.set("3", "weight", at::zeros({8, 3}));
  CHECK_THROWS_AS(to_module(bad, net), key_error);
  CHECK_THROWS_WITH(to_module(bad, net),
                    Contains("(\"3\", \"weight\")") && Contains("has no child \"3\"; its children are \"0\", \"1\", \"2\""));
  CHECK(impl(net[0]->as<torch::nn::Linear>()->weight) == impl(w0));

  AnyTensorDict typo;
  typo.set("2", "wieght", at::zeros({2, 8}));
  CHECK_THROWS_WITH(to_module(typo, net), Contains("has no tensor \"wieght\"; its tensors are \"weight\", \"bias\""));
  AnyTensorDict shape;
  shape.set("0", "weight", at::zeros({8, 4}));
  CHECK_THROWS_AS(to_module(shape, net), shape_error);
  CHECK_THROWS_WITH(to_module(shape, net), Contains("(\"0\", \"weight\") is f32[8,4], but the module's tensor is f32[8,3]"));

  torch::nn::Sequential user(torch::nn::Linear(1, 1), Unregistered());
  AnyTensorDict p = from_module(user).clone();
  CHECK_THROWS_AS(to_module(p, user), module_error);
  CHECK_THROWS_WITH(to_module(p, user), Contains("(\"1\", \"shift\") belongs to \"1\", a UnregisteredImpl") &&
                                            Contains("register_module_type<UnregisteredImpl>()"));
  CHECK(impl(user[0]->as<torch::nn::Linear>()->weight) != impl(p.get("0", "weight")));
}

TEST_CASE("dynamic functional_call: a Sequential with built-in and registered modules", "[dynamic_modules]") {
  nn::register_module_type<ScaleImpl>();
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::Tanh(), Scale(), Square(), torch::nn::Linear(4, 2));
  auto x = at::randn({6, 3});
  auto params = from_module(net);
  auto other = randn_like(params).apply([](const at::Tensor& t) { return t.requires_grad_(); });

  at::Tensor expected;
  {
    auto swap = to_module(other, net);
    expected = net->forward(x);
  }
  const auto before = from_module(net);
  at::Tensor y = functional_call(net, other, x);
  CHECK(at::allclose(y, expected));
  for (const auto& [path, t] : before.items()) CHECK(impl(from_module(net).get(path)) == impl(t));  // untouched

  y.sum().backward();
  CHECK(other.get("2", "scale").grad().defined());
  CHECK(other.get("0", "weight").grad().defined());
  CHECK_FALSE(params.get("0", "weight").grad().defined());

  // Partial params: the module's own tensors for the rest, as Python's functional_call.
  AnyTensorDict partial;
  partial.set("4", "weight", other.get("4", "weight"));
  at::Tensor mixed;
  {
    auto swap = to_module(partial, net);
    mixed = net->forward(x);
  }
  CHECK(at::allclose(functional_call(net, partial, x), mixed));
  CHECK(at::allclose(functional_call(net, other.flatten_keys(), x), expected));

  // An AnyModule holding a Linear.
  torch::nn::AnyModule any(torch::nn::Linear(3, 2));
  auto any_params = randn_like(from_module(any));
  CHECK(at::allclose(functional_call(any, any_params, x), at::linear(x, any_params.get("weight"), any_params.get("bias"))));
}

TEST_CASE("dynamic functional_call and functional_vmap through the new adapters", "[dynamic_modules]") {
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Linear(3, 4), torch::nn::PReLU(), torch::nn::GRUCell(4, 5),
                                 torch::nn::Unflatten(torch::nn::UnflattenOptions(1, {1, 5})),
                                 torch::nn::InstanceNorm1d(torch::nn::InstanceNorm1dOptions(1).affine(true)),
                                 torch::nn::Flatten());
  };
  auto net = make();
  auto x = at::randn({6, 3});
  auto other = randn_like(from_module(net)).apply([](const at::Tensor& t) { return t.requires_grad_(); });
  at::Tensor expected;
  {
    auto swap = to_module(other, net);
    expected = net->forward(x);
  }
  at::Tensor y = functional_call(net, other, x);
  CHECK(at::allclose(y, expected, 1e-5, 1e-6));
  y.sum().backward();
  CHECK(other.get("2", "weight_hh").grad().defined());
  CHECK(other.get("1", "weight").grad().defined());

  std::vector<torch::nn::Sequential> nets{make(), make(), make()};
  auto stacked = from_modules(nets);
  at::Tensor ys = nn::functional_vmap(nets[0], stacked, nn::args(x));
  REQUIRE(ys.sizes() == c10::IntArrayRef{3, 6, 5});
  for (int i = 0; i < 3; ++i) CHECK(at::allclose(ys[i], nets[i]->forward(x), 1e-5, 1e-6));

  // EmbeddingBag and a transposed convolution, lowered in a run-time Sequential and through a ModuleDict.
  auto make_bags = [] {
    return torch::nn::Sequential(torch::nn::EmbeddingBag(torch::nn::EmbeddingBagOptions(10, 4).mode(torch::kMean)),
                                 torch::nn::Unflatten(torch::nn::UnflattenOptions(1, {2, 2})),
                                 torch::nn::ConvTranspose1d(torch::nn::ConvTranspose1dOptions(2, 3, 2).stride(2)));
  };
  std::vector<torch::nn::Sequential> bag_nets{make_bags(), make_bags()};
  auto words = at::randint(0, 10, {5, 3});
  at::Tensor bag_ys = nn::functional_vmap(bag_nets[0], from_modules(bag_nets), nn::args(words));
  for (int i = 0; i < 2; ++i) CHECK(at::allclose(bag_ys[i], bag_nets[static_cast<std::size_t>(i)]->forward(words), 1e-5, 1e-6));
  torch::nn::ModuleDict dict(torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>({{"bag", torch::nn::EmbeddingBag(10, 4).ptr()}}));
  auto bag_params = randn_like(from_module(dict));
  torch::nn::EmbeddingBag bag_twin(10, 4);
  bag_twin->weight.data().copy_(bag_params.get("bag", "weight"));
  CHECK(at::allclose(functional_call(dict["bag"], bag_params.get_tensordict("bag"), words), bag_twin->forward(words)));
}

TEST_CASE("LSTM: from_module, to_module (the cached weights list follows and is restored), functional_call", "[dynamic_modules]") {
  torch::nn::LSTM lstm(torch::nn::LSTMOptions(3, 5).num_layers(2).bidirectional(true).batch_first(true));
  auto params = from_module(lstm);
  CHECK(params.keys().size() == 16);  // 2 layers x 2 directions x {weight_ih, weight_hh, bias_ih, bias_hh}
  CHECK(impl(params.get("weight_hh_l1_reverse")) == impl(lstm->named_parameters()["weight_hh_l1_reverse"]));
  auto x = at::randn({4, 6, 3});
  const at::Tensor y0 = std::get<0>(lstm->forward(x));

  auto other = randn_like(params);
  torch::nn::LSTM twin(lstm->options);  // holds `other` as its own values: what the swapped LSTM must compute
  to_module_(other, twin);
  auto [expected, expected_state] = twin->forward(x);
  {
    auto swap = to_module(other, lstm);
    CHECK(impl(lstm->named_parameters()["weight_ih_l0"]) == impl(other.get("weight_ih_l0")));
    CHECK(at::allclose(std::get<0>(lstm->forward(x)), expected));
  }
  CHECK(at::allclose(std::get<0>(lstm->forward(x)), y0));
  CHECK(impl(from_module(lstm).get("weight_ih_l0")) == impl(params.get("weight_ih_l0")));

  auto trainable = other.apply([](const at::Tensor& t) { return t.detach().requires_grad_(); });
  auto [y, state] = functional_call(lstm, trainable, x);
  CHECK(at::allclose(y, expected, 1e-5, 1e-6));
  CHECK(at::allclose(std::get<1>(state), std::get<1>(expected_state), 1e-5, 1e-6));
  CHECK(at::allclose(std::get<0>(lstm->forward(x)), y0));  // the module untouched
  y.sum().backward();
  CHECK(trainable.get("weight_hh_l1_reverse").grad().defined());
  CHECK_FALSE(params.get("weight_hh_l1_reverse").grad().defined());

  // With a state given, unbatched, and with projections.
  auto h = at::randn({4, 5}), c = at::randn({4, 5}), seq = at::randn({6, 3});
  auto [yu, su] = functional_call(lstm, other, seq, std::make_tuple(h, c));  // unbatched (Python's; libtorch 1.13's forward refuses it)
  auto [tu, tsu] = twin->forward(seq.unsqueeze(0), std::make_tuple(h.unsqueeze(1), c.unsqueeze(1)));
  CHECK(at::allclose(yu, tu.squeeze(0), 1e-5, 1e-6));
  CHECK(at::allclose(std::get<0>(su), std::get<0>(tsu).squeeze(1), 1e-5, 1e-6));
  torch::nn::LSTM proj(torch::nn::LSTMOptions(3, 6).proj_size(2));
  auto proj_params = randn_like(from_module(proj));
  CHECK(proj_params.contains("weight_hr_l0"));
  torch::nn::LSTM proj_twin(proj->options);
  to_module_(proj_params, proj_twin);
  auto xs = at::randn({7, 2, 3});
  CHECK(at::allclose(std::get<0>(functional_call(proj, proj_params, xs)), std::get<0>(proj_twin->forward(xs)), 1e-5, 1e-6));

  // A wrong shape throws before anything changes, naming the key.
  AnyTensorDict wrong = other.clone();
  wrong.set("weight_ih_l0", at::randn({20, 4}));
  CHECK_THROWS_WITH(to_module(wrong, lstm), Contains("\"weight_ih_l0\" is f32[20,4], but the module's tensor is f32[20,3]"));
  CHECK(at::allclose(std::get<0>(lstm->forward(x)), y0));
}

TEST_CASE("GRU and RNN: functional_call and to_module follow the new weights; from_modules stacks them", "[dynamic_modules]") {
  torch::nn::GRU gru(torch::nn::GRUOptions(3, 4).num_layers(2));
  torch::nn::RNN rnn(torch::nn::RNNOptions(3, 4).nonlinearity(torch::kReLU).bias(false));
  auto x = at::randn({5, 2, 3});
  auto gru_params = randn_like(from_module(gru));
  auto rnn_params = randn_like(from_module(rnn));
  CHECK_FALSE(rnn_params.contains("bias_ih_l0"));
  torch::nn::GRU gru_twin(gru->options);
  torch::nn::RNN rnn_twin(rnn->options);
  to_module_(gru_params, gru_twin);
  to_module_(rnn_params, rnn_twin);
  auto h = at::randn({2, 2, 4});
  CHECK(at::allclose(std::get<0>(functional_call(gru, gru_params, x, h)), std::get<0>(gru_twin->forward(x, h)), 1e-5, 1e-6));
  CHECK(at::allclose(std::get<1>(functional_call(rnn, rnn_params, x)), std::get<1>(rnn_twin->forward(x)), 1e-5, 1e-6));
  {
    auto swap = to_module(gru_params, gru);
    CHECK(at::allclose(std::get<0>(gru->forward(x)), std::get<0>(gru_twin->forward(x)), 1e-5, 1e-6));
  }

  std::vector<torch::nn::GRU> grus{gru, gru_twin, torch::nn::GRU(gru->options)};
  auto stacked = from_modules(grus);
  CHECK(stacked.batch_size() == c10::IntArrayRef{3});
  CHECK(at::equal(stacked.get("weight_ih_l1")[1], gru_params.get("weight_ih_l1")));
  for (int i = 0; i < 3; ++i)
    CHECK(at::allclose(std::get<0>(functional_call(grus[0], stacked[i], x)), std::get<0>(grus[i]->forward(x)), 1e-5, 1e-6));
}

namespace {
// The members' own forwards, stacked: what functional_vmap must give.
template <class Module, class... State>
auto members_forward(std::vector<Module>& members, const at::Tensor& x, const State&... state) {
  std::vector<at::Tensor> outputs, hidden;
  for (auto& m : members) {
    auto [y, h] = m->forward(x, state...);
    outputs.push_back(y);
    if constexpr (std::is_same_v<Module, torch::nn::LSTM>)
      hidden.push_back(std::get<1>(h));  // c_n: the state the output does not show
    else
      hidden.push_back(h);
  }
  return std::make_pair(at::stack(outputs), at::stack(hidden));
}
}  // namespace

TEST_CASE("recurrent functional_vmap: lowered equals the members' own forwards, gradients reach the stacked weights",
          "[dynamic_modules]") {
  SECTION("LSTM: 2 layers, bidirectional, batch_first") {
    std::vector<torch::nn::LSTM> members;
    for (int i = 0; i < 3; ++i)
      members.emplace_back(torch::nn::LSTMOptions(3, 5).num_layers(2).bidirectional(true).batch_first(true));
    auto params = from_modules(members).apply([](const at::Tensor& t) { return t.detach().requires_grad_(); });
    auto x = at::randn({4, 6, 3});
    auto [expected, expected_c] = members_forward(members, x);
    auto [y, state] = nn::functional_vmap(members[0], params, nn::args(x));
    CHECK(y.sizes() == c10::IntArrayRef{3, 4, 6, 10});
    CHECK(at::allclose(y, expected, 1e-5, 1e-6));
    CHECK(at::allclose(std::get<1>(state), expected_c, 1e-5, 1e-6));
    auto [looped, looped_state] = nn::functional_vmap(members[0], params, nn::args(x), {}, {}, {.loop = true});
    CHECK(at::allclose(looped, y, 1e-5, 1e-6));
    // The batched form itself, whichever path functional_vmap takes with this libtorch.
    auto [direct, direct_state] = nn::batched<torch::nn::LSTMImpl>::forward(*members[0], params, std::make_tuple(x),
                                                                            std::array<bool, 1>{false}, {.sets = 3});
    CHECK(at::allclose(direct, expected, 1e-5, 1e-6));
    CHECK(at::allclose(std::get<1>(direct_state), expected_c, 1e-5, 1e-6));
    {
      // Where libtorch has a fused kernel the batched form runs each set through it; without
      // oneDNN every libtorch takes the decomposition (the input projection as one GEMM, ...).
      struct mkldnn_off {
        bool before = at::globalContext().userEnabledMkldnn();
        mkldnn_off() { at::globalContext().setUserEnabledMkldnn(false); }
        ~mkldnn_off() { at::globalContext().setUserEnabledMkldnn(before); }
      } const off;
      CHECK_FALSE(nn::batched<torch::nn::LSTMImpl>::per_set(*members[0]));
      auto [decomposed, decomposed_state] = nn::batched<torch::nn::LSTMImpl>::forward(
          *members[0], params, std::make_tuple(x), std::array<bool, 1>{false}, {.sets = 3});
      CHECK(at::allclose(decomposed, expected, 1e-5, 1e-6));
      CHECK(at::allclose(std::get<1>(decomposed_state), expected_c, 1e-5, 1e-6));
    }

    // Gradients: the same as through the loop over the sets.
    auto grads = [&](const at::Tensor& out) {
      return torch::autograd::grad({out.pow(2).sum()}, {params.get("weight_hh_l1_reverse"), params.get("bias_ih_l0")});
    };
    auto lowered_grads = grads(y), loop_grads = grads(looped);
    CHECK(at::allclose(lowered_grads[0], loop_grads[0], 1e-4, 1e-5));
    CHECK(at::allclose(lowered_grads[1], loop_grads[1], 1e-4, 1e-5));
  }
  SECTION("LSTM with projections, a given state, an input mapped per set") {
    std::vector<torch::nn::LSTM> members;
    for (int i = 0; i < 2; ++i) members.emplace_back(torch::nn::LSTMOptions(3, 6).proj_size(2));
    auto params = from_modules(members);
    auto xs = at::randn({2, 7, 4, 3});  // [sets, T, B, in]
    auto h = at::randn({1, 4, 2}), c = at::randn({1, 4, 6});
    auto [y, state] = nn::functional_vmap(members[0], params, nn::args(), nn::kwargs(nn::kw<"input">(xs), nn::kw<"hx">(std::make_tuple(h, c))),
                                          nn::in_dims(nn::in_dim_of<"input">(0)));
    for (int i = 0; i < 2; ++i) {
      auto [own, own_state] = members[static_cast<std::size_t>(i)]->forward(xs[i], std::make_tuple(h, c));
      CHECK(at::allclose(y[i], own, 1e-5, 1e-6));
      CHECK(at::allclose(std::get<0>(state)[i], std::get<0>(own_state), 1e-5, 1e-6));
    }
  }
  SECTION("GRU with a state, RNN (relu, no bias), unbatched input") {
    std::vector<torch::nn::GRU> grus;
    std::vector<torch::nn::RNN> rnns;
    for (int i = 0; i < 3; ++i) {
      grus.emplace_back(torch::nn::GRUOptions(3, 4).num_layers(2));
      rnns.emplace_back(torch::nn::RNNOptions(3, 4).nonlinearity(torch::kReLU).bias(false));
    }
    // libtorch's own CPU GRU and RNN step op by op (no fused kernel on any libtorch, oneDNN
    // on or off), so they take the decomposition; an LSTM runs per set where oneDNN takes it.
    CHECK_FALSE(nn::batched<torch::nn::GRUImpl>::per_set(*grus[0]));
    CHECK_FALSE(nn::batched<torch::nn::RNNImpl>::per_set(*rnns[0]));
    CHECK(nn::batched<torch::nn::LSTMImpl>::per_set(*torch::nn::LSTM(torch::nn::LSTMOptions(3, 4))) ==
          (TORCH_VERSION_MAJOR >= 2 && at::hasMKLDNN() && at::globalContext().userEnabledMkldnn()));
    auto x = at::randn({5, 2, 3});
    auto h = at::randn({2, 2, 4});
    auto [gru_expected, gru_h] = members_forward(grus, x, h);
    auto [gru_y, gru_state] = nn::functional_vmap(grus[0], from_modules(grus), nn::args(x, h));
    CHECK(at::allclose(gru_y, gru_expected, 1e-5, 1e-6));
    CHECK(at::allclose(gru_state, gru_h, 1e-5, 1e-6));
    auto [gru_direct, gru_direct_h] = nn::batched<torch::nn::GRUImpl>::forward(*grus[0], from_modules(grus), std::make_tuple(x, h),
                                                                               std::array<bool, 2>{false, false}, {.sets = 3});
    CHECK(at::allclose(gru_direct, gru_expected, 1e-5, 1e-6));
    auto [rnn_expected, rnn_h] = members_forward(rnns, x);
    auto [rnn_y, rnn_state] = nn::functional_vmap(rnns[0], from_modules(rnns), nn::args(x));
    CHECK(at::allclose(rnn_y, rnn_expected, 1e-5, 1e-6));
    auto seq = at::randn({5, 3});
    auto [unbatched, unbatched_h] = nn::functional_vmap(rnns[0], from_modules(rnns), nn::args(seq));
    CHECK(unbatched.sizes() == c10::IntArrayRef{3, 5, 4});
    CHECK(at::allclose(unbatched[2], std::get<0>(functional_call(rnns[2], from_module(rnns[2]), seq)), 1e-5, 1e-6));
  }
  SECTION("in training with dropout between layers: a loop over the sets, each its own draw") {
    std::vector<torch::nn::LSTM> members;
    for (int i = 0; i < 2; ++i) members.emplace_back(torch::nn::LSTMOptions(3, 4).num_layers(2).dropout(0.5));
    auto params = from_modules(members);
    auto x = at::randn({5, 2, 3});
    CHECK_THROWS_AS(nn::functional_vmap(members[0], params, nn::args(x), {}, {}, {.randomness = randomness::same}),
                    value_error);
    CHECK_THROWS_WITH(nn::functional_vmap(members[0], params, nn::args(x), {}, {}, {.randomness = randomness::same}),
                      Contains("LSTMImpl runs these sets one at a time") && Contains("use randomness \"different\""));
    auto [y, state] = nn::functional_vmap(members[0], params, nn::args(x), {}, {}, {.randomness = randomness::different});
    CHECK(y.sizes() == c10::IntArrayRef{2, 5, 2, 4});
    members[0]->eval();
    auto [eval_y, eval_state] = nn::functional_vmap(members[0], params, nn::args(x));
    CHECK(at::allclose(eval_y[1], std::get<0>(functional_call(members[0], params[1], x)), 1e-5, 1e-6));
  }
}

TEST_CASE("the fused LSTM step: equals libtorch's ops in values, NaN, gradients and second derivatives", "[dynamic_modules]") {
  SECTION("the step alone, hidden 12 (a vector of 8 and a tail of 4), c_prev a strided view") {
    if (!tensordict::detail::avx2_fma_supported()) {
      WARN("this CPU has no AVX2 + FMA: libtorch's ops run instead of the fused step");
      return;
    }
    auto gx = (at::randn({3, 5, 48}) * 4).requires_grad_(), gh = at::randn({3, 5, 48}).requires_grad_();
    auto c_prev = at::randn({3, 2, 5, 12}).select(1, 1).detach().requires_grad_();
    {
      at::NoGradGuard no_grad;
      gx.select(1, 0).select(1, 0).fill_(90.0f);  // beyond the clamp of exp: sigmoid 1
      gx.select(1, 0).select(1, 1).fill_(-90.0f);
    }
    auto bias = at::randn({3, 48}).requires_grad_();
    auto [h_ref, c_ref] = nn::detail::lstm_pointwise(gx + gh + bias.unsqueeze(1), c_prev);
    auto hc = nn::detail::fused_lstm_step::apply(gx, gh, bias, c_prev);
    CHECK(at::allclose(hc[0], h_ref, 1e-5, 1e-6));
    CHECK(at::allclose(hc[1], c_ref, 1e-5, 1e-6));

    // First order through the fused backward, second order through the create_graph branch.
    auto w_h = at::randn({3, 5, 12}), w_c = at::randn({3, 5, 12});
    auto first = [&](const at::Tensor& h, const at::Tensor& c) {
      return torch::autograd::grad({(h * w_h).sum() + (c * w_c).pow(2).sum()}, {gx, gh, bias, c_prev}, {}, true, true);
    };
    auto fused_first = first(hc[0], hc[1]), ref_first = first(h_ref, c_ref);
    for (std::size_t k = 0; k < 4; ++k) CHECK(at::allclose(fused_first[k], ref_first[k], 1e-4, 1e-5));
    auto second = [&](const std::vector<at::Tensor>& g) {
      return torch::autograd::grad({g[0].pow(2).sum() + g[2].pow(2).sum() + g[3].pow(2).sum()}, {gx, bias, c_prev});
    };
    auto fused_second = second(fused_first), ref_second = second(ref_first);
    // Products of float gradients up to ~300 in size: compared to their largest element.
    for (std::size_t k = 0; k < 3; ++k)
      CHECK((fused_second[k] - ref_second[k]).abs().max().item<double>() <= 1e-5 * ref_second[k].abs().max().item<double>());

    at::NoGradGuard no_grad;
    auto nan_gates = gx.detach().clone();
    nan_gates[1][2][3] = std::nanf("");       // an input gate in the vector part
    nan_gates[2][4][24 + 10] = std::nanf("");  // a cell gate in the scalar tail
    auto [h_nan, c_nan] = tensordict::detail::fused_lstm::forward(nan_gates, gh.detach(), {}, c_prev.detach(), nullptr);
    CHECK(std::isnan(h_nan[1][2][3].item<float>()));
    CHECK(std::isnan(c_nan[1][2][3].item<float>()));
    CHECK(std::isnan(h_nan[2][4][10].item<float>()));
    CHECK(std::isnan(c_nan[2][4][10].item<float>()));
    CHECK(at::isfinite(h_nan[0]).all().item<bool>());
  }
  SECTION("LSTMs of hidden 12 in the batched form: the members' own forwards and gradients") {
    std::vector<torch::nn::LSTM> members;
    for (int i = 0; i < 3; ++i) members.emplace_back(torch::nn::LSTMOptions(5, 12).num_layers(2));
    auto params = from_modules(members).apply([](const at::Tensor& t) { return t.detach().requires_grad_(); });
    auto x = at::randn({7, 4, 5});
    auto [expected, expected_c] = members_forward(members, x);
    auto target = at::randn_like(expected);
    (expected * target).sum().backward();
    auto [y, state] = nn::batched<torch::nn::LSTMImpl>::forward(*members[0], params, std::make_tuple(x),
                                                                 std::array<bool, 1>{false}, {.sets = 3});
    CHECK(at::allclose(y, expected, 1e-5, 1e-6));
    CHECK(at::allclose(std::get<1>(state), expected_c, 1e-5, 1e-6));
    (y * target).sum().backward();
    for (const char* name : {"weight_ih_l0", "weight_hh_l0", "bias_hh_l1", "weight_hh_l1"}) {
      std::vector<at::Tensor> own;
      for (auto& m : members) own.push_back(m->named_parameters()[name].grad());
      INFO(name);
      CHECK(at::allclose(params.get(name).grad(), at::stack(own), 1e-4, 1e-5));
    }
    // Without grad, against the members' own forwards without grad: libtorch 2.6's oneDNN LSTM
    // has an inference kernel of its own, which on AVX-512 CPUs differs from its training
    // kernel by up to ~0.08 (and from a float64 LSTM; ONEDNN_MAX_CPU_ISA=AVX2 makes them agree).
    at::NoGradGuard no_grad;
    auto [inference, inference_state] = nn::batched<torch::nn::LSTMImpl>::forward(
        *members[0], params, std::make_tuple(x), std::array<bool, 1>{false}, {.sets = 3});
    CHECK(at::allclose(inference, std::get<0>(members_forward(members, x)), 1e-5, 1e-6));
  }
}

TEST_CASE("TransformerEncoder, TransformerDecoder, Transformer: from_module, to_module, functional_call, functional_vmap",
          "[dynamic_modules]") {
  using namespace torch::nn;
  auto encoder_layer = TransformerEncoderLayer(TransformerEncoderLayerOptions(8, 2).dim_feedforward(16).dropout(0.0));
  auto decoder_layer = TransformerDecoderLayer(TransformerDecoderLayerOptions(8, 2).dim_feedforward(16).dropout(0.0));
  auto make_encoder = [&] { return TransformerEncoder(TransformerEncoderOptions(encoder_layer, 2).norm(AnyModule(LayerNorm(LayerNormOptions({8}))))); };
  auto make_decoder = [&] { return TransformerDecoder(TransformerDecoderOptions(decoder_layer, 2)); };
  TransformerEncoder encoder = make_encoder();
  TransformerDecoder decoder = make_decoder();
  auto src = at::randn({5, 3, 8}), tgt = at::randn({4, 3, 8});
  auto src_mask = at::zeros({5, 5});
  src_mask.select(0, 1).select(0, 4).fill_(-1e4);
  auto tgt_padding = at::zeros({3, 4}, at::kBool);
  tgt_padding.select(0, 2).select(0, 3).fill_(true);

  auto params = from_module(encoder);
  CHECK(params.keys(true, true).size() == 2 * 12 + 2);  // 2 layers of 12 tensors, the norm's 2
  CHECK(impl(params.get("layers", "1", "linear2", "weight")) == impl(encoder->layers->at<TransformerEncoderLayerImpl>(1).linear2->weight));
  const at::Tensor y0 = encoder->forward(src, src_mask);
  auto other = randn_like(params).apply([](const at::Tensor& t) { return t.mul(0.3).requires_grad_(); });
  TransformerEncoder twin = make_encoder();  // holds `other` as its own values
  to_module_(other.detach(), twin);
  const at::Tensor expected = twin->forward(src, src_mask);
  {
    auto swap = to_module(other, encoder);
    CHECK(at::allclose(encoder->forward(src, src_mask), expected, 1e-5, 1e-6));
  }
  CHECK(at::allclose(encoder->forward(src, src_mask), y0));
  at::Tensor y = functional_call(encoder, other, src, src_mask);
  CHECK(at::allclose(y, expected, 1e-5, 1e-6));
  CHECK(at::allclose(encoder->forward(src, src_mask), y0));  // the module untouched
  y.sum().backward();
  CHECK(other.get("layers", "0", "self_attn", "in_proj_weight").grad().defined());
  CHECK(other.get("norm", "weight").grad().defined());

  auto memory = at::randn({6, 3, 8});
  auto decoder_params = randn_like(from_module(decoder)).apply([](const at::Tensor& t) { return t.mul(0.3); });
  TransformerDecoder decoder_twin = make_decoder();
  to_module_(decoder_params, decoder_twin);
  CHECK_FALSE(decoder_params.contains("norm"));
  CHECK(at::allclose(functional_call(decoder, decoder_params, tgt, memory, at::Tensor(), at::Tensor(), tgt_padding),
                     decoder_twin->forward(tgt, memory, {}, {}, tgt_padding), 1e-5, 1e-6));

  Transformer transformer(TransformerOptions(8, 2, 1, 1).dim_feedforward(16).dropout(0.0));
  auto transformer_params = randn_like(from_module(transformer)).apply([](const at::Tensor& t) { return t.mul(0.3); });
  CHECK(transformer_params.contains("encoder", "layers", "0", "linear1", "bias"));
  CHECK(transformer_params.contains("decoder", "norm", "weight"));
  Transformer transformer_twin(transformer->options);
  to_module_(transformer_params, transformer_twin);
  auto causal = TransformerImpl::generate_square_subsequent_mask(4);
  CHECK(at::allclose(functional_call(transformer, transformer_params, src, tgt, at::Tensor(), causal),
                     transformer_twin->forward(src, tgt, {}, causal), 1e-5, 1e-6));

  // A wrong shape throws before anything changes, naming the key.
  auto wrong = params.clone();
  wrong.set(any_key_path{"layers", "1", "norm1", "weight"}, at::ones({7}));
  CHECK_THROWS_WITH(to_module(wrong, encoder), Contains("\"layers\", \"1\", \"norm1\", \"weight\""));
  CHECK(at::allclose(encoder->forward(src, src_mask), y0));

  // functional_vmap: lowered (without masks) equals the members' own forwards and the loop, with gradients.
  std::vector<TransformerEncoder> encoders{make_encoder(), make_encoder(), make_encoder()};
  auto stacked = from_modules(encoders).apply([](const at::Tensor& t) { return t.detach().requires_grad_(); });
  at::Tensor ys = nn::functional_vmap(encoders[0], stacked, nn::args(src));
  at::Tensor looped = nn::functional_vmap(encoders[0], stacked, nn::args(src), {}, {}, {.loop = true});
  REQUIRE(ys.sizes() == c10::IntArrayRef{3, 5, 3, 8});
  for (int i = 0; i < 3; ++i) CHECK(at::allclose(ys[i], encoders[static_cast<std::size_t>(i)]->forward(src), 1e-4, 1e-5));
  CHECK(at::allclose(ys, looped, 1e-4, 1e-5));
  const auto& w = stacked.get("layers", "1", "linear1", "weight");
  auto lowered_grad = torch::autograd::grad({ys.pow(2).sum()}, {w})[0];
  auto loop_grad = torch::autograd::grad({looped.pow(2).sum()}, {w})[0];
  CHECK(at::allclose(lowered_grad, loop_grad, 1e-4, 1e-5));
  at::Tensor direct = nn::batched<TransformerEncoderImpl>::forward(*encoders[0], stacked, std::make_tuple(src),
                                                                   std::array<bool, 1>{false}, {.sets = 3});
  CHECK(at::allclose(direct, ys, 1e-5, 1e-6));
  // With a mask: the loop.
  at::Tensor masked = nn::functional_vmap(encoders[0], stacked, nn::args(src, src_mask));
  CHECK(at::allclose(masked[1], encoders[1]->forward(src, src_mask), 1e-4, 1e-5));

  std::vector<Transformer> transformers{Transformer(transformer->options), Transformer(transformer->options)};
  auto tgts = at::randn({2, 4, 3, 8});  // per set
  at::Tensor outs = nn::functional_vmap(transformers[0], from_modules(transformers), nn::args(src),
                                        nn::kwargs(nn::kw<"tgt">(tgts)), nn::in_dims(nn::in_dim_of<"tgt">(0)));
  for (int i = 0; i < 2; ++i)
    CHECK(at::allclose(outs[i], transformers[static_cast<std::size_t>(i)]->forward(src, tgts[i]), 1e-4, 1e-5));

  // In a run-time Sequential: the encoder's functional and batched forms from the registry.
  auto make_net = [&] { return Sequential(Linear(4, 8), make_encoder()); };
  std::vector<Sequential> nets{make_net(), make_net()};
  auto x = at::randn({5, 3, 4});
  at::Tensor net_ys = nn::functional_vmap(nets[0], from_modules(nets), nn::args(x));
  for (int i = 0; i < 2; ++i) CHECK(at::allclose(net_ys[i], nets[static_cast<std::size_t>(i)]->forward(x), 1e-4, 1e-5));
  CHECK(at::allclose(functional_call(nets[0], from_module(nets[1]), x), nets[1]->forward(x), 1e-5, 1e-6));
}

TEST_CASE("dynamic reset_parameters: a Sequential and an LSTM, one draw per set, the modules untouched", "[dynamic_modules]") {
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
  const auto own = from_module(net);
  const auto before = own.clone();
  auto stacked = from_modules(std::vector<torch::nn::Sequential>{net, net});
  nn::reset_parameters(net, stacked);
  CHECK_FALSE(at::allclose(stacked.get("0", "weight")[0], stacked.get("0", "weight")[1]));
  CHECK(stacked.get("2", "weight").abs().max().item<double>() <= 0.5);  // 1/sqrt(4)
  CHECK(at::equal(from_module(net).get("0", "weight"), before.get("0", "weight")));
  CHECK(impl(from_module(net).get("0", "weight")) == impl(own.get("0", "weight")));

  torch::nn::LSTM lstm(torch::nn::LSTMOptions(3, 4).num_layers(2));
  const auto lstm_before = from_module(lstm).clone();
  auto fresh = from_module(lstm).clone();
  nn::reset_parameters(lstm, fresh);
  CHECK_FALSE(at::allclose(fresh.get("weight_hh_l1"), lstm_before.get("weight_hh_l1")));
  CHECK(fresh.get("weight_hh_l1").abs().max().item<double>() <= 0.5);  // 1/sqrt(hidden)
  CHECK(at::equal(from_module(lstm).get("weight_hh_l1"), lstm_before.get("weight_hh_l1")));

  AnyTensorDict partial;
  partial.set("0", "weight", at::zeros({4, 3}));
  CHECK_THROWS_WITH(nn::reset_parameters(net, partial), Contains("params has no (\"0\", \"bias\")"));
}

TEST_CASE("dynamic calls take a typed TensorDict of the same keys", "[dynamic_modules]") {
  auto net = make_mlp();
  using linear = schema<leaf<"weight">, leaf<"bias">>;
  using mlp = schema<field<"0", linear>, field<"2", linear>>;
  auto typed = from_module(net).to_typed<mlp>().detach().clone().zero_();
  auto x = at::randn({2, 3});
  CHECK(functional_call(net, typed, x).eq(0).all().item<bool>());
  {
    auto swap = to_module(typed, net);
    CHECK(net->forward(x).eq(0).all().item<bool>());
  }
  CHECK_FALSE(net->forward(x).eq(0).all().item<bool>());
}

TEST_CASE("dynamic functional_call: a user container is swapped for the call; unknown owners throw", "[dynamic_modules]") {
  torch::nn::Sequential net(Block(), torch::nn::Linear(3, 1));
  auto x = at::randn({4, 3});
  auto params = randn_like(from_module(net));
  at::Tensor expected;
  {
    auto swap = to_module(params, net);
    expected = net->forward(x);
  }
  const at::Tensor w = from_module(net).get("0", "layers", "0", "weight");
  CHECK(at::allclose(functional_call(net, params, x), expected));
  CHECK(impl(from_module(net).get("0", "layers", "0", "weight")) == impl(w));

  Block block;
  auto block_params = randn_like(from_module(static_cast<torch::nn::Module&>(*block)));
  at::Tensor direct;
  {
    auto swap = to_module(block_params, block);
    direct = block->forward(x);
  }
  CHECK(at::allclose(functional_call(block, block_params, x), direct));

  torch::nn::Sequential unknown{Unregistered()};
  CHECK_THROWS_AS(functional_call(unknown, from_module(unknown).clone(), x), module_error);
}

TEST_CASE("dynamic functional_call: a functional form registered at run time", "[dynamic_modules]") {
  int calls = 0;
  nn::register_module_type<OffsetImpl>([&calls](OffsetImpl&, const AnyTensorDict& p, const at::Tensor& x) {
    ++calls;
    return x + p.get("offset");
  });
  torch::nn::Sequential net(torch::nn::Linear(3, 3), Offset());
  auto params = randn_like(from_module(net));
  auto x = at::randn({2, 3});
  at::Tensor y = functional_call(net, params, x);
  CHECK(calls == 1);
  CHECK(at::allclose(y, at::linear(x, params.get("0", "weight"), params.get("0", "bias")) + params.get("1", "offset")));
  nn::register_module_type<OffsetImpl>();  // back to the schema alone: swapped for the call
}

TEST_CASE("dynamic from_modules: stacked new leaves", "[dynamic_modules]") {
  std::vector<torch::nn::Sequential> nets{make_mlp(), make_mlp(), make_mlp()};
  auto stacked = from_modules(nets);
  CHECK(stacked.batch_size() == c10::IntArrayRef{3});
  CHECK(stacked.get("2", "weight").sizes() == c10::IntArrayRef{3, 2, 8});
  CHECK(stacked.get("0", "bias")[1].equal(nets[1][0]->as<torch::nn::Linear>()->bias));
  CHECK(stacked.get("0", "weight").is_leaf());
  CHECK(stacked.get("0", "weight").requires_grad());
  std::vector<torch::nn::Sequential> different{make_mlp(), torch::nn::Sequential(torch::nn::Linear(3, 8))};
  CHECK_THROWS_AS(from_modules(different), key_error);
}

TEST_CASE("dynamic from_modules with expand_identical stores a shared sub-module once", "[dynamic_modules]") {
  torch::nn::Linear shared(3, 8);
  std::vector<torch::nn::Sequential> nets{torch::nn::Sequential(shared, torch::nn::ReLU(), torch::nn::Linear(8, 2)),
                                          torch::nn::Sequential(shared, torch::nn::ReLU(), torch::nn::Linear(8, 2))};
  auto stacked = from_modules(nets, {.expand_identical = true});
  CHECK(stacked.get("0", "bias").sizes() == c10::IntArrayRef{2, 8});
  CHECK(stacked.get("0", "bias").data_ptr() == shared->bias.data_ptr());
  CHECK(stacked.get("2", "bias").is_leaf());
  at::Tensor y = nn::functional_vmap(nets[0], stacked, nn::args(at::randn({5, 3})));
  y.sum().backward();
  CHECK(shared->weight.grad().defined());
  CHECK(stacked.get("2", "weight").grad().defined());
}

TEST_CASE("dynamic functional_vmap: lowered, vmapped and looped agree", "[dynamic_modules]") {
  std::vector<torch::nn::Sequential> nets;
  for (int i = 0; i < 4; ++i) nets.push_back(make_mlp());
  auto stacked = from_modules(nets);
  auto x = at::randn({5, 3});
  at::Tensor lowered = nn::functional_vmap(nets[0], stacked, nn::args(x));
  at::Tensor looped = nn::functional_vmap(nets[0], stacked, nn::args(x), {}, {}, {.loop = true});
  at::Tensor chunked = nn::functional_vmap(nets[0], stacked, nn::args(x), {}, {}, {.chunk_size = 3});
  REQUIRE(lowered.sizes() == c10::IntArrayRef{4, 5, 2});
  for (int i = 0; i < 4; ++i) CHECK(at::allclose(lowered[i], nets[i]->forward(x), 1e-5, 1e-6));
  CHECK(at::allclose(looped, lowered, 1e-5, 1e-6));
  CHECK(at::allclose(chunked, lowered, 1e-5, 1e-6));
  CHECK(nn::detail::dynamic_lowers(*nets[0], stacked));

  // Modules that take dims see them past the sets dim when lowered.
  std::vector<torch::nn::Sequential> dims;
  for (int i = 0; i < 3; ++i)
    dims.push_back(torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 3)), torch::nn::Flatten(),
                                         torch::nn::Linear(12, 4), torch::nn::Softmax(1), torch::nn::LogSoftmax(-1)));
  auto dims_params = from_modules(dims);
  auto images = at::randn({5, 2, 4, 4});
  CHECK(nn::detail::dynamic_lowers(*dims[0], dims_params));
  at::Tensor per_set = nn::functional_vmap(dims[0], dims_params, nn::args(images));
  for (int i = 0; i < 3; ++i) CHECK(at::allclose(per_set[i], dims[i]->forward(images), 1e-5, 1e-6));

  // A mapped input, and a model with a module of unknown type (no tensors): vmap instead of lowering.
  auto xs = at::randn({4, 5, 3});
  at::Tensor mapped = nn::functional_vmap(nets[0], stacked, {}, nn::kwargs(nn::kw<"input">(xs)),
                                          nn::in_dims(nn::in_dim_of<"input">(0)));
  for (int i = 0; i < 4; ++i) CHECK(at::allclose(mapped[i], nets[i]->forward(xs[i]), 1e-5, 1e-6));

  std::vector<torch::nn::Sequential> squares;
  for (int i = 0; i < 3; ++i) squares.push_back(torch::nn::Sequential(torch::nn::Linear(3, 4), Square(), torch::nn::Linear(4, 1)));
  auto sq = from_modules(squares);
  at::Tensor y = nn::functional_vmap(squares[0], sq, nn::args(x));
  for (int i = 0; i < 3; ++i) CHECK(at::allclose(y[i], squares[i]->forward(x), 1e-5, 1e-6));

  // Gradients reach the stacked leaves.
  y.sum().backward();
  CHECK(sq.get("0", "weight").grad().defined());
  CHECK(sq.get("0", "weight").grad().sizes() == c10::IntArrayRef{3, 4, 3});

  // Errors come before any call, naming the path.
  AnyTensorDict wrong = stacked.clone();
  wrong.set("0", "weight", at::randn({4, 8, 5}));
  CHECK_THROWS_WITH(nn::functional_vmap(nets[0], wrong, nn::args(x)),
                    Contains("(\"0\", \"weight\") is f32[4,8,5], but the module's tensor is f32[8,3] after the 1 batch dim(s)"));
  torch::nn::Sequential dropout(torch::nn::Linear(3, 3), torch::nn::Dropout(0.5));
  auto dp = from_modules(std::vector<torch::nn::Sequential>{dropout, dropout});
  CHECK_THROWS_AS(nn::functional_vmap(dropout, dp, nn::args(x)), value_error);
}

TEST_CASE("dynamic functional_vmap matches Python's functorch.vmap + functional_call", "[dynamic_modules]") {
  // tests/data/make_fixtures.py: 3 Sequential(Linear(3, 4), Tanh(), Linear(4, 2)), stacked, run on x.
  auto file = load(test::test_data("ensemble_parity.pt"));
  const AnyTensorDict stacked = file.get_tensordict("stacked").apply(
      [](const at::Tensor& t) { return t; }, {file.get("stacked", "0.weight").size(0)});  // batch_size [3]
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::Tanh(), torch::nn::Linear(4, 2));
  const at::Tensor y = nn::functional_vmap(net, stacked, nn::args(file.get("x")));  // flat keys, unflattened
  CHECK(at::allclose(y, file.get("y"), 1e-6, 1e-6));
  const at::Tensor looped = nn::functional_vmap(net, stacked, nn::args(file.get("x")), {}, {}, {.loop = true});
  CHECK(at::allclose(looped, file.get("y"), 1e-6, 1e-6));
}
