// functional_vmap on a torch::nn::Sequential with two inputs: its forward takes one tensor.
// expect: functional_vmap on a run-time model passes one input tensor
#include <torch/nn/modules/container/sequential.h>
#include <tensordict/nn/functional_vmap.hpp>

at::Tensor run(torch::nn::Sequential& net, const tensordict::AnyTensorDict& stacked, const at::Tensor& x) {
  namespace tdn = tensordict::nn;
#ifdef TENSORDICT_COMPILE_FAIL
  return tdn::functional_vmap(net, stacked, tdn::args(x, x));
#else
  return tdn::functional_vmap(net, stacked, tdn::args(x));
#endif
}
