// set<...>(tensor) at a non_tensor<...> field of the schema.
// expect: at a non_tensor<...> field takes its data
#include <string>

#include <ATen/ops/zeros.h>
#include <tensordict/typed_tensordict.hpp>

using step = tensordict::schema<tensordict::leaf<"obs">, tensordict::non_tensor<"task">>;

void label(tensordict::TensorDict<step>& td) {
#ifdef TENSORDICT_COMPILE_FAIL
  td.set<"task">(at::zeros({1}));
#else
  td.set<"task">(std::string("reach-target"));
#endif
}
