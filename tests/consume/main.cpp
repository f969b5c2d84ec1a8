// The outside project of the consumption tests: it finds tensordict through
// Meson, pkg-config or CMake, builds a TensorDict and checks what it prints.
#include <iostream>
#include <sstream>

#include <ATen/ops/zeros.h>
#include <tensordict/tensordict.hpp>

int main() {
  using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;
  tensordict::TensorDict<linear> td({at::zeros({4, 3}), at::zeros({4})});
  std::ostringstream os;
  os << tensordict::stack({td, td});
  std::cout << os.str() << "\n";
  return os.str() == "TensorDict(batch_size=[2], fields={bias: f32[2,4], weight: f32[2,4,3]})" ? 0 : 1;
}
