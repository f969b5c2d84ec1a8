// get<...>() with a key that the schema does not have.
// expect: unknown_key<tensordict::key<6>{"weigth"}, tensordict::compile_error::available_keys<tensordict::key<6>{"weight"}, tensordict::key<4>{"bias"}> >
// expect: tensordict: unknown key.
#include <tensordict/typed_tensordict.hpp>

using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;

at::Tensor weight_of(const tensordict::TensorDict<linear>& td) {
#ifdef TENSORDICT_COMPILE_FAIL
  return td.get<"weigth">();
#else
  return td.get<"weight">();
#endif
}
