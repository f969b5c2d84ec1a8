// The outside project of the consumption tests: it finds tensordict through
// Meson, pkg-config or CMake, builds a TensorDict and checks what it prints,
// and checks that functional_vmap's parallel sets can use two threads where
// libtorch's intra-op backend is OpenMP (the consumer's build must pass
// -fopenmp: without it at::parallel_for runs every task on the caller's thread).
// It includes the one header it uses, as the README advises: the three builds
// compile in 13 s each at -O1 where the umbrella header took 32 s.
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>

#include <ATen/Parallel.h>
#include <ATen/ops/zeros.h>
#include <tensordict/typed_tensordict.hpp>

int main() {
  using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;
  tensordict::TensorDict<linear> td({at::zeros({4, 3}), at::zeros({4})});
  std::ostringstream os;
  os << tensordict::stack({td, td});
  std::cout << os.str() << "\n";
  if (os.str() != "TensorDict(batch_size=[2], fields={bias: f32[2,4], weight: f32[2,4,3]})") return 1;

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
