// A model whose structure is known only at run time: read a text spec of
// layers, build a torch::nn::Sequential, stack 4 differently initialised
// copies, and run all of them at once with functional_vmap.
// Run: build/examples/dynamic_model [examples/dynamic_model.spec] [params.pt]
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <ATen/ops/randn.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <ATen/core/grad_mode.h>
#include <torch/utils.h>

#include <tensordict/nn/functional_vmap.hpp>
#include <tensordict/files/torch_save.hpp>

namespace td = tensordict;


torch::nn::Sequential build(const std::string& spec_path) {
  std::ifstream spec(spec_path);
  if (!spec) throw std::runtime_error("cannot read the model spec " + spec_path);
  torch::nn::Sequential net;
  std::string line;
  for (int number = 1; std::getline(spec, line); ++number) {
    std::istringstream words(line);
    std::string kind;
    if (!(words >> kind) || kind[0] == '#') continue;
    std::int64_t a = 0, b = 0;
    double p = 0;
    if (kind == "linear" && words >> a >> b) net->push_back(torch::nn::Linear(a, b));
    else if (kind == "relu") net->push_back(torch::nn::ReLU());
    else if (kind == "tanh") net->push_back(torch::nn::Tanh());
    else if (kind == "gelu") net->push_back(torch::nn::GELU());
    else if (kind == "layernorm" && words >> a) net->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({a})));
    else if (kind == "dropout" && words >> p) net->push_back(torch::nn::Dropout(p));
    else throw std::runtime_error(spec_path + ":" + std::to_string(number) + ": cannot read \"" + line + "\"");
  }
  return net;
}

int main(int argc, char** argv) try {
  const std::string spec = argc > 1 ? argv[1] : "examples/dynamic_model.spec";
  constexpr int members = 4;
  std::vector<torch::nn::Sequential> nets;
  for (int i = 0; i < members; ++i) {
    torch::manual_seed(i);  // differently initialised copies
    nets.push_back(build(spec));
  }
  std::cout << "model from " << spec << ":\n" << *nets[0] << "\n";

  // The copies' parameters, stacked: one AnyTensorDict with batch_size [4].
  td::AnyTensorDict stacked = td::from_modules(nets);
  std::cout << "stacked parameters: " << stacked << "\n";

  torch::manual_seed(100);
  at::Tensor x = at::randn({64, nets[0][0]->as<torch::nn::Linear>()->options.in_features()});
  at::Tensor all = td::nn::functional_vmap(nets[0], stacked, td::nn::args(x));  // [4, 64, out]
  double worst = 0;
  for (int i = 0; i < members; ++i) worst = std::max(worst, (all[i] - nets[i]->forward(x)).abs().max().item<double>());
  std::cout << "functional_vmap output: " << td::describe(all) << "; largest difference from each copy's own forward: "
            << worst << "\n";
  std::cout << "mean output per copy:";
  for (int i = 0; i < members; ++i) std::cout << " " << all[i].mean().item<double>();
  std::cout << "\n";

  // Both ways, 200 calls each, inference only.
  at::NoGradGuard no_grad;
  auto time_us = [](auto&& f) {
    f();
    const auto start = std::chrono::steady_clock::now();
    for (int k = 0; k < 200; ++k) f();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / 200;
  };
  const double vmap_us = time_us([&] { return td::nn::functional_vmap(nets[0], stacked, td::nn::args(x)); });
  const double loop_us = time_us([&] {
    for (auto& net : nets) net->forward(x);
  });
  std::cout << "per call: functional_vmap " << vmap_us << " us, a loop of 4 forwards " << loop_us
            << " us (loop/vmap = " << loop_us / vmap_us << ")\n";
  if (worst > 1e-5) throw std::runtime_error("functional_vmap differs from the copies' own forwards");

  // The stacked parameters as a file Python reads: torch.load(path)["0"]["weight"].shape == (4, 32, 4).
  if (argc > 2) {
    td::save(stacked, argv[2]);
    auto back = td::load(argv[2]);
    std::cout << "saved to " << argv[2] << " and loaded back: " << std::boolalpha << (back == stacked).all() << "\n";
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "dynamic_model: " << e.what() << "\n";
  return 1;
}
