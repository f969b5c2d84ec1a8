// The outside project of the consumption tests: it finds tensordict through
// Meson, pkg-config or CMake, builds a TensorDict and checks what it prints,
// and checks that functional_vmap's parallel sets can use two threads where
// libtorch's intra-op backend is OpenMP (the consumer's build must pass
// -fopenmp: without it at::parallel_for runs every task on the caller's thread).
// A lowered MLP ensemble calls the library's compiled kernels (libtensordict,
// linked by default; -DTENSORDICT_HEADER_ONLY compiles them here instead).
// It includes the headers it uses, as the README advises.
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>

#include <ATen/Parallel.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/function.h>
#include <tensordict/from_modules.hpp>
#include <tensordict/nn/adapters/linear.hpp>
#include <tensordict/nn/adapters/parameter_free.hpp>
#include <tensordict/nn/functional_vmap.hpp>
#include <tensordict/nn/sequential.hpp>
#include <tensordict/typed_tensordict.hpp>

int main() {
  using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;
  tensordict::TensorDict<linear> td({at::zeros({4, 3}), at::zeros({4})});
  std::ostringstream os;
  os << tensordict::stack({td, td});
  std::cout << os.str() << "\n";
  if (os.str() != "TensorDict(batch_size=[2], fields={bias: f32[2,4], weight: f32[2,4,3]})") return 1;

  using mlp = tensordict::nn::Sequential<torch::nn::Linear, torch::nn::ReLU, torch::nn::Linear>;
  std::vector<mlp> members;
  for (int i = 0; i < 3; ++i) members.emplace_back(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
  const at::Tensor x = at::randn({5, 4});
  const at::Tensor y = tensordict::nn::functional_vmap(members[0], tensordict::from_modules(members), tensordict::nn::args(x));
  const std::string node = y.grad_fn() ? y.grad_fn()->name() : "none";
  std::cout << "functional_vmap of 3 MLPs: " << y.sizes() << ", autograd node " << node << "\n";
  if (node.find("linear_run") == std::string::npos || !at::allclose(y[2], members[2]->forward(x), 1e-5, 1e-6)) return 1;

  at::set_num_threads(2);
  std::mutex m;
  std::set<int> threads;
  at::parallel_for(0, 2, 1, [&](std::int64_t, std::int64_t) {
    const std::lock_guard<std::mutex> lock(m);
    threads.insert(at::get_thread_num());
  });
  std::cout << "at::parallel_for ran on " << threads.size() << " thread(s), AT_PARALLEL_OPENMP=" << AT_PARALLEL_OPENMP
            << "\n";
#if AT_PARALLEL_OPENMP
  if (threads.size() != 2) {
    std::cout << "libtorch's intra-op backend is OpenMP, but this program was compiled without it (-fopenmp): "
                 "functional_vmap would run its sets in one task\n";
    return 1;
  }
#endif
  return 0;
}
