// functional_call with the parameters of another module type.
// expect: params_of_another_schema<tensordict::schema<tensordict::field<tensordict::key<6>{"weight"}, tensordict::tensor_leaf>, tensordict::field<tensordict::key<4>{"bias"}, tensordict::tensor_leaf> >, tensordict::schema<tensordict::field<tensordict::key<6>{"weight"}, tensordict::tensor_leaf> > >
// expect: these parameters do not fit this module
#include <tensordict/functional.hpp>
#include <tensordict/nn/adapters/embedding.hpp>
#include <tensordict/nn/adapters/linear.hpp>

at::Tensor call(torch::nn::Linear& linear, torch::nn::Embedding& embedding, const at::Tensor& x) {
#ifdef TENSORDICT_COMPILE_FAIL
  return tensordict::functional_call(linear, tensordict::from_module(embedding), x);
#else
  (void)embedding;
  return tensordict::functional_call(linear, tensordict::from_module(linear), x);
#endif
}
