// Setting a sub-tree from a TensorDict of another schema.
// expect: set<...>(value) at a sub-tree takes a TensorDict with that sub-tree's schema
#include <tensordict/typed_tensordict.hpp>

using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;
using no_bias = tensordict::schema<tensordict::leaf<"weight">>;
using mlp = tensordict::schema<tensordict::field<"0", linear>>;

void replace(tensordict::TensorDict<mlp>& td, const tensordict::TensorDict<linear>& good,
             const tensordict::TensorDict<no_bias>& bad) {
#ifdef TENSORDICT_COMPILE_FAIL
  td.set<"0">(bad);
#else
  (void)bad;
  td.set<"0">(good);
#endif
}
