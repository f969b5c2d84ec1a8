// Stacking TensorDicts of different schemas.
// expect: stack_of_different_schemas<tensordict::schema<tensordict::field<tensordict::key<6>{"weight"}, tensordict::tensor_leaf>, tensordict::field<tensordict::key<4>{"bias"}, tensordict::tensor_leaf> >, tensordict::schema<tensordict::field<tensordict::key<6>{"weight"}, tensordict::tensor_leaf> > >
// expect: every TensorDict must have the same schema
#include <tensordict/typed_tensordict.hpp>

using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;
using no_bias = tensordict::schema<tensordict::leaf<"weight">>;

auto stacked(const tensordict::TensorDict<linear>& a, const tensordict::TensorDict<no_bias>& b) {
#ifdef TENSORDICT_COMPILE_FAIL
  return tensordict::stack(a, b);
#else
  (void)b;
  return tensordict::stack(a, a);
#endif
}
