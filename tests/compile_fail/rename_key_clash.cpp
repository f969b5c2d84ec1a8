// rename_key<old, new>() onto a key the schema already has.
// expect: rename_onto_an_existing_key<tensordict::key<6>{"weight"}, tensordict::key<4>{"bias"}>
// expect: tensordict: rename_key<old, new>() would give two fields the same key
#include <tensordict/typed_tensordict.hpp>

using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;

auto renamed(const tensordict::TensorDict<linear>& td) {
#ifdef TENSORDICT_COMPILE_FAIL
  return td.rename_key<"weight", "bias">();
#else
  return td.rename_key<"weight", "kernel">();
#endif
}
