// zeros<S>(batch, kv...) that leaves a leaf of S without a leaf_spec.
// expect: leaf_without_spec<tensordict::key<9>{"next.done"}>
// expect: tensordict: zeros<S>(batch, kv<...>(leaf_spec{...}), ...) and empty<S>(...) allocate every leaf of S
#include <tensordict/preallocate.hpp>

using step = tensordict::schema<tensordict::leaf<"obs">, tensordict::node<"next", tensordict::leaf<"obs">, tensordict::leaf<"done">>>;

auto buffer() {
  using tensordict::kv;
  using tensordict::leaf_spec;
#ifdef TENSORDICT_COMPILE_FAIL
  return tensordict::zeros<step>({64}, kv<"obs">(leaf_spec{{4}}), kv<"next", "obs">(leaf_spec{{4}}));
#else
  return tensordict::zeros<step>({64}, kv<"obs">(leaf_spec{{4}}), kv<"next", "obs">(leaf_spec{{4}}),
                                 kv<"next", "done">(leaf_spec{{}, at::kBool}));
#endif
}
