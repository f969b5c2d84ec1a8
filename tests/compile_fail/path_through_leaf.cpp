// A key path that goes on after a leaf.
// expect: key_path_continues_past_a_leaf<tensordict::key<6>{"weight"}, tensordict::key<4>{"data"}>
// expect: the key path goes on after a leaf
#include <tensordict/typed_tensordict.hpp>

using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;
using mlp = tensordict::schema<tensordict::field<"0", linear>>;

at::Tensor weight_of(const tensordict::TensorDict<mlp>& td) {
#ifdef TENSORDICT_COMPILE_FAIL
  return td.get<"0", "weight", "data">();
#else
  return td.get<"0", "weight">();
#endif
}
