// The default build (detail/config.hpp): this file includes only the headers
// it uses, and the library's non-template functions come from libtensordict,
// which the suite links as a user's program does. The lowered ensemble gives
// what the members give, gradients included, and the run-time registry
// (defined in the library) knows every built-in type, also of families this
// TU never included.
#include "catch_torch.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/stack.h>
#include <torch/csrc/autograd/function.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/rnn.h>

#include <tensordict/from_modules.hpp>
#include <tensordict/functional_call.hpp>
#include <tensordict/nn/functional_vmap.hpp>
#include <tensordict/nn/adapters/linear.hpp>
#include <tensordict/nn/adapters/parameter_free.hpp>
#include <tensordict/nn/sequential.hpp>

#if defined(TENSORDICT_HEADER_ONLY) || TENSORDICT_DEFINITIONS
#error "tests/meson.build compiles this file as a program's TU that links libtensordict"
#endif

namespace td = tensordict;
namespace tdn = tensordict::nn;
using MLP = tdn::Sequential<torch::nn::Linear, torch::nn::ReLU, torch::nn::Linear>;

// The typed adapters this TU sees are those of the families it included.
static_assert(tdn::described_module<torch::nn::LinearImpl>);
static_assert(!tdn::described_module<torch::nn::Conv2dImpl>);

TEST_CASE("linked to libtensordict: a typed MLP ensemble lowers and equals its members", "[compiled_library]") {
  std::vector<MLP> members;
  for (int i = 0; i < 4; ++i) members.emplace_back(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
  auto params = td::from_modules(members);
  CHECK(tdn::fully_lowered<tdn::SequentialImpl<torch::nn::Linear, torch::nn::ReLU, torch::nn::Linear>>());
  const at::Tensor x = at::randn({5, 8});

  const at::Tensor y = tdn::functional_vmap(members[0], params, tdn::args(x));
  std::vector<at::Tensor> each;
  for (auto& m : members) each.push_back(m->forward(x));
  const at::Tensor expected = at::stack(each);
  REQUIRE(y.sizes() == expected.sizes());
  CHECK(at::allclose(y, expected, 1e-5, 1e-6));
  // The lowered chain is one autograd node (linear_run, defined in libtensordict).
  CHECK(std::string(y.grad_fn()->name()).find("linear_run") != std::string::npos);

  y.pow(2).sum().backward();
  expected.pow(2).sum().backward();
  for (std::size_t i = 0; i < members.size(); ++i) {
    const auto own = members[i]->named_parameters();
    CHECK(at::allclose(params.get<"0", "weight">().grad()[i], own["0.weight"].grad(), 1e-4, 1e-5));
    CHECK(at::allclose(params.get<"2", "bias">().grad()[i], own["2.bias"].grad(), 1e-4, 1e-5));
  }

  auto p0 = td::from_module(members[0]);
  CHECK(at::allclose(td::functional_call(members[0], p0, x), each[0]));
}

TEST_CASE("linked to libtensordict: the registry knows the families this TU did not include", "[compiled_library]") {
  const auto types = tdn::supported_module_types();
  for (const char* type : {"torch::nn::Conv2dImpl", "torch::nn::LSTMImpl", "torch::nn::LinearImpl"})
    CHECK(std::find(types.begin(), types.end(), type) != types.end());

  // A run-time model with a Conv2d: its tensors and functional form come from the registry.
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 3)), torch::nn::ReLU());
  const at::Tensor x = at::randn({1, 2, 5, 5});
  td::AnyTensorDict p = td::from_module(net);
  CHECK(p.contains("0", "weight"));
  CHECK(at::allclose(td::functional_call(net, p, x), net->forward(x)));

  // An LSTM's tensors are named by its options (the recurrent family's run-time layout).
  torch::nn::Sequential holder(torch::nn::LSTM(torch::nn::LSTMOptions(3, 4).num_layers(2)));
  CHECK(td::from_module(holder).contains("0", "weight_hh_l1"));
}
