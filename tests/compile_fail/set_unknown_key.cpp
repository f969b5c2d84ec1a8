// set<...>() with a nested key that the sub-schema does not have.
// expect: unknown_key<tensordict::key<4>{"bais"}
// expect: tensordict: unknown key.
#include <tensordict/typed_tensordict.hpp>

using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;
using mlp = tensordict::schema<tensordict::field<"0", linear>, tensordict::field<"2", linear>>;

void reset_bias(tensordict::TensorDict<mlp>& td, const at::Tensor& bias) {
#ifdef TENSORDICT_COMPILE_FAIL
  td.set<"2", "bais">(bias);
#else
  td.set<"2", "bias">(bias);
#endif
}
