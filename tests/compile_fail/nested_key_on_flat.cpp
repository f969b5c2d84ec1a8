// A nested key path on a flattened TensorDict.
// expect: use_the_flattened_key<tensordict::key<8>{"0.weight"}>
// expect: this TensorDict's keys are flattened
#include <tensordict/typed_tensordict.hpp>

using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;
using mlp = tensordict::schema<tensordict::field<"0", linear>>;

at::Tensor weight_of(const tensordict::TensorDict<mlp>& td) {
  auto flat = td.flatten_keys<".">();
#ifdef TENSORDICT_COMPILE_FAIL
  return flat.get<"0", "weight">();
#else
  return flat.get<"0.weight">();
#endif
}
