// What mlp_functional_vmap.cpp does with libtorch alone: the members' own
// forwards in a loop, stacked.
#include <torch/torch.h>
#include <vector>
int main() {
  std::vector<torch::nn::Sequential> ms;
  for (int i = 0; i < 4; ++i) ms.emplace_back(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 2));
  std::vector<at::Tensor> ys;
  const at::Tensor x = at::randn({5, 8});
  for (auto& m : ms) ys.push_back(m->forward(x));
  return at::stack(ys).sum().item<float>() > 1e9;
}
