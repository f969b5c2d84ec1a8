// TensorDict basics: the parameter tree of a Linear-ReLU-Linear network as a
// typed TensorDict. Run: build/examples/tensordict_basics
#include <iostream>

#include <ATen/ops/randn.h>
#include <tensordict/tensordict.hpp>

namespace td = tensordict;

// The keys of nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)).
using linear = td::schema<td::leaf<"weight">, td::leaf<"bias">>;
using mlp = td::schema<td::field<"0", linear>, td::field<"2", linear>>;

int main() {
  td::TensorDict<mlp> params({at::randn({4, 3}), at::randn({4}), at::randn({1, 4}), at::randn({1})});
  std::cout << params << "\n";

  // Operations apply to every leaf at once.
  auto params_zero = params.detach().clone().zero_();
  std::cout << "All zeros: " << std::boolalpha << (params_zero == 0).all() << "\n";

  // A sub-tree is a view: writing through it writes into params.
  auto first = params.get<"0">();
  first.get<"bias">().fill_(0.5);
  std::cout << "params[\"0\", \"bias\"] after a write through the view: " << params.get<"0", "bias">().sum().item<float>()
            << "\n";

  // Stacking adds a batch dim, one entry per set of parameters.
  auto params_ones = params.detach().clone().apply_([](at::Tensor& t) { return t.fill_(1.0); });
  auto params_stack = td::stack({params_zero, params_ones, params});
  std::cout << "Stacked params batch_size: " << td::format_sizes(params_stack.batch_size()) << "\n";
  std::cout << params_stack.repr(td::print_style::multiline) << "\n";
  std::cout << "Set 1 is all ones: " << (params_stack[1] == 1).all() << "\n";

  // The state-dict names of functional_call.
  auto flat = params.flatten_keys<".">();
  for (const auto& [path, tensor] : flat.items()) std::cout << path.join(".") << ": " << td::describe(tensor) << "\n";

  // A locked TensorDict keeps its leaves.
  params.lock_();
  try {
    params.set<"2", "bias">(at::randn({1}));
  } catch (const td::lock_error& e) {
    std::cout << "lock_error: " << e.what() << "\n";
  }
  return 0;
}
