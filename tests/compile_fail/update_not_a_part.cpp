// update(other) where other's schema has a key that this one lacks.
// expect: unknown_key<tensordict::key<5>{"scale"}
// expect: tensordict: unknown key.
#include <tensordict/typed_tensordict.hpp>

using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;
using mlp = tensordict::schema<tensordict::field<"0", linear>, tensordict::field<"2", linear>>;
#ifdef TENSORDICT_COMPILE_FAIL
using part = tensordict::schema<tensordict::node<"2", tensordict::leaf<"scale">>>;
#else
using part = tensordict::schema<tensordict::node<"2", tensordict::leaf<"bias">>>;
#endif

void refresh(tensordict::TensorDict<mlp>& td, const tensordict::TensorDict<part>& fresh) { td.update(fresh); }
