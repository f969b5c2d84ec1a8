// exclude<...>() with a key the schema does not have: a typo would silently exclude nothing.
// expect: unknown_key<tensordict::key<6>{"wegiht"}
// expect: tensordict: unknown key.
#include <tensordict/typed_tensordict.hpp>

using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;

auto without_weight(const tensordict::TensorDict<linear>& td) {
#ifdef TENSORDICT_COMPILE_FAIL
  return td.exclude<"wegiht">();
#else
  return td.exclude<"weight">();
#endif
}
