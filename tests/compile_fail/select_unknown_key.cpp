// select<...>() with a key the schema does not have.
// expect: unknown_key<tensordict::key<5>{"bias_"}
// expect: tensordict: unknown key.
#include <tensordict/typed_tensordict.hpp>

using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;

auto bias_only(const tensordict::TensorDict<linear>& td) {
#ifdef TENSORDICT_COMPILE_FAIL
  return td.select<"bias_">();
#else
  return td.select<"bias">();
#endif
}
