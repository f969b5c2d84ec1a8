// update(other) where a key is a tensor in other but a sub-tree here.
// expect: leaf_against_a_sub_tree<tensordict::key<1>{"0"}>
// expect: holds a tensor on one side and a sub-tree on the other
#include <tensordict/typed_tensordict.hpp>

using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;
using mlp = tensordict::schema<tensordict::field<"0", linear>, tensordict::field<"2", linear>>;
#ifdef TENSORDICT_COMPILE_FAIL
using part = tensordict::schema<tensordict::leaf<"0">>;
#else
using part = tensordict::schema<tensordict::node<"0", tensordict::leaf<"weight">>>;
#endif

void refresh(tensordict::TensorDict<mlp>& td, const tensordict::TensorDict<part>& fresh) { td.update_(fresh); }
