// The reference tutorial "Functional calls and ensembles with TensorDict",
// ported line by line (examples/README.md shows both side by side).
// Run: build/examples/functional
#include <iostream>

#include <ATen/ops/randn.h>
#include <tensordict/tensordict.hpp>

namespace td = tensordict;
using Linear = torch::nn::Linear;
using ReLU = torch::nn::ReLU;

int main() {
  // TensorDict as a parameter container
  torch::manual_seed(0);
  td::nn::Sequential<Linear, ReLU, Linear> module(Linear(3, 4), ReLU(), Linear(4, 1));
  auto params = td::from_module(module);
  std::cout << params.repr(td::print_style::multiline) << "\n";

  auto params_zero = params.detach().clone().zero_();
  std::cout << "All zeros: " << std::boolalpha << (params_zero == 0).all() << "\n";

  // Swapping parameters with a scope guard
  auto x = at::randn({5, 3});
  at::Tensor y_zero;
  {
    auto swap = td::to_module(params_zero, module);
    y_zero = module->forward(x);
  }
  std::cout << "Output with zeroed params: " << y_zero << "\n";
  TORCH_CHECK((y_zero == 0).all().item<bool>());

  auto y_original = module->forward(x);
  std::cout << "Output with original params: " << y_original << "\n";
  TORCH_CHECK(!(y_original == 0).all().item<bool>());

  // Model ensembling with vmap
  auto params_ones = params.detach().clone().apply_([](at::Tensor& t) { return t.fill_(1.0); });
  auto params_stack = td::stack({params_zero, params_ones, params});
  std::cout << "Stacked params batch_size: " << td::format_sizes(params_stack.batch_size()) << "\n";

  auto call = [&](const at::Tensor& input, const auto& set) {
    auto swap = td::to_module(set, module);
    return module->forward(input);
  };
  auto xs = at::randn({3, 5, 3});
  auto y = td::vmap(call)(xs, params_stack);
  std::cout << "Output shape: " << td::format_sizes(y.sizes()) << "\n";
  TORCH_CHECK((y[0] == 0).all().item<bool>());

  // Stacking the parameters of several modules
  std::vector<decltype(module)> modules;
  for (int i = 0; i < 3; ++i) modules.emplace_back(Linear(3, 4), ReLU(), Linear(4, 1));
  auto ensemble_params = td::from_modules(modules);
  std::cout << "Ensemble params batch_size: " << td::format_sizes(ensemble_params.batch_size()) << "\n";

  x = at::randn({5, 3});
  y = td::vmap(call, {std::nullopt, 0})(x, ensemble_params);
  std::cout << "Output shape: " << td::format_sizes(y.sizes()) << "\n";
  for (std::size_t i = 0; i < modules.size(); ++i) TORCH_CHECK(y[i].allclose(modules[i]->forward(x)));

  // Functional calls
  auto flat_params = params.flatten_keys<".">();
  x = at::randn({5, 3});
  y = td::functional_call(module, flat_params, x);
  std::cout << "functional_call output: " << td::format_sizes(y.sizes()) << "\n";
  return 0;
}
