// make<S>(kv...) with the same key path twice.
// expect: key_given_twice<tensordict::key<8>{"0.weight"}>
// expect: tensordict: the key named in 'key_given_twice<...>' above is given twice
#include <tensordict/typed_tensordict.hpp>

using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;
using mlp = tensordict::schema<tensordict::field<"0", linear>, tensordict::field<"2", linear>>;

auto build(const at::Tensor& w, const at::Tensor& b) {
  using tensordict::kv;
#ifdef TENSORDICT_COMPILE_FAIL
  return tensordict::make<mlp>(kv<"0", "weight">(w), kv<"0", "weight">(b));
#else
  return tensordict::make<mlp>(kv<"0", "weight">(w), kv<"0", "bias">(b));
#endif
}
