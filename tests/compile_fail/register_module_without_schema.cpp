// Registering a user module type whose members were never named: its tensors could not be swapped.
// expect: register_module_type<Impl>(): Impl (named above in 'registered_type_without_schema<...>') has no schema
#include <tensordict/nn/module_registry.hpp>

struct ScaleImpl : torch::nn::Module {
  at::Tensor scale;
  ScaleImpl() { scale = register_parameter("scale", at::ones({1})); }
};
TENSORDICT_MODULE(ScaleImpl, scale);

struct UnnamedScaleImpl : torch::nn::Module {
  at::Tensor scale;
  UnnamedScaleImpl() { scale = register_parameter("scale", at::ones({1})); }
};

void registration() {
#ifdef TENSORDICT_COMPILE_FAIL
  tensordict::nn::register_module_type<UnnamedScaleImpl>();
#else
  tensordict::nn::register_module_type<ScaleImpl>();
#endif
}
