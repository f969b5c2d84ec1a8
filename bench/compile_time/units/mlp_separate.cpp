// mlp_functional_vmap.cpp compiled separately (-DTENSORDICT_SEPARATE_COMPILATION):
// the headers of what it uses, not the umbrella; the library's non-template
// functions are compiled once, in separate_definitions.cpp.
#include <tensordict/from_modules.hpp>
#include <tensordict/functional_call.hpp>
#include <tensordict/functional_vmap.hpp>
#include <tensordict/modules/linear.hpp>
#include <tensordict/modules/parameter_free.hpp>
#include <tensordict/modules/sequential.hpp>
#include <vector>
namespace td = tensordict;
using MLP = td::nn::Sequential<torch::nn::Linear, torch::nn::ReLU, torch::nn::Linear>;
int main() {
  std::vector<MLP> ms;
  for (int i = 0; i < 4; ++i) ms.emplace_back(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 2));
  auto params = td::from_modules(ms);
  at::Tensor y = td::nn::functional_vmap(ms[0], params, td::nn::args(at::randn({5, 8})));
  auto p0 = td::from_module(ms[0]);
  at::Tensor z = td::functional_call(ms[0], p0, at::randn({5, 8}));
  return (y.sum() + z.sum()).item<float>() > 1e9;
}
