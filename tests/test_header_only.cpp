// Header-only (-DTENSORDICT_HEADER_ONLY, detail/config.hpp): this program
// links no libtensordict; its one TU defines inline what it calls. The
// lowered ensemble (kernels, autograd node, parallel sets), the run-time
// registry (every family, included by module_registry.hpp here) and a memmap
// round trip (the file formats) all work without the library.
#include "catch_torch.hpp"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/stack.h>
#include <torch/csrc/autograd/function.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>

#include <tensordict/files/memmap.hpp>
#include <tensordict/tensordict.hpp>

#if !defined(TENSORDICT_HEADER_ONLY) || !TENSORDICT_DEFINITIONS
#error "tests/meson.build compiles this file with -DTENSORDICT_HEADER_ONLY"
#endif

namespace td = tensordict;
namespace tdn = tensordict::nn;
using MLP = tdn::Sequential<torch::nn::Linear, torch::nn::ReLU, torch::nn::Linear>;

TEST_CASE("header-only: a typed MLP ensemble lowers and equals its members", "[header_only]") {
  std::vector<MLP> members;
  for (int i = 0; i < 3; ++i) members.emplace_back(torch::nn::Linear(6, 16), torch::nn::ReLU(), torch::nn::Linear(16, 2));
  auto params = td::from_modules(members).apply([](const at::Tensor& t) { return t.detach().requires_grad_(); });
  const at::Tensor x = at::randn({5, 6});
  const at::Tensor y = tdn::functional_vmap(members[0], params, tdn::args(x));
  std::vector<at::Tensor> each;
  for (auto& m : members) each.push_back(m->forward(x));
  CHECK(at::allclose(y, at::stack(each), 1e-5, 1e-6));
  CHECK(std::string(y.grad_fn()->name()).find("linear_run") != std::string::npos);
  y.sum().backward();
  CHECK(params.get<"2", "bias">().grad().allclose(at::full({3, 2}, 5.0)));
}

TEST_CASE("header-only: the run-time registry and a memmap round trip", "[header_only]") {
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 3)), torch::nn::ReLU());
  const at::Tensor x = at::randn({1, 2, 5, 5});
  const td::AnyTensorDict p = td::from_module(net);
  CHECK(at::allclose(td::functional_call(net, p, x), net->forward(x)));

  const auto dir = std::filesystem::temp_directory_path() / ("header_only_" + std::to_string(::getpid()));
  td::save_memmap(p, dir.string());
  CHECK((td::load_memmap(dir.string()) == p).all());
  std::filesystem::remove_all(dir);
}
