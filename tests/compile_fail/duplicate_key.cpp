// A schema level that names a key twice.
// expect: duplicate_key<tensordict::key<6>{"weight"}>
// expect: Keys must be unique at each level.
#include <tensordict/typed_tensordict.hpp>

#ifdef TENSORDICT_COMPILE_FAIL
using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::node<"sub", tensordict::leaf<"weight">, tensordict::leaf<"weight">>>;
#else
using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::node<"sub", tensordict::leaf<"weight">, tensordict::leaf<"bias">>>;
#endif

tensordict::TensorDict<linear> make() { return tensordict::TensorDict<linear>(); }
