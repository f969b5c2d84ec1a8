// A wrong key in user code, on the parameters of a user module.
// expect: unknown_key<tensordict::key<6>{"wieght"}, tensordict::compile_error::available_keys<tensordict::key<6>{"weight"}, tensordict::key<4>{"bias"}> >
#include <tensordict/functional.hpp>
#include <tensordict/nn/adapters/linear.hpp>

struct NetImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  NetImpl() { fc = register_module("fc", torch::nn::Linear(3, 2)); }
};
TENSORDICT_MODULE(NetImpl, fc);

at::Tensor weight_of(std::shared_ptr<NetImpl> net) {
  auto params = tensordict::from_module(net);
#ifdef TENSORDICT_COMPILE_FAIL
  return params.get<"fc", "wieght">();
#else
  return params.get<"fc", "weight">();
#endif
}
