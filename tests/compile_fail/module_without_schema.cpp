// from_module of a user module whose members were never named.
// expect: this module type has no schema. Name its members once with TENSORDICT_MODULE
#include <tensordict/functional.hpp>
#include <tensordict/nn/adapters/linear.hpp>

struct NamedImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  NamedImpl() { fc = register_module("fc", torch::nn::Linear(3, 2)); }
};
TENSORDICT_MODULE(NamedImpl, fc);

struct UnnamedImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  UnnamedImpl() { fc = register_module("fc", torch::nn::Linear(3, 2)); }
};

auto params(std::shared_ptr<NamedImpl> named, std::shared_ptr<UnnamedImpl> unnamed) {
#ifdef TENSORDICT_COMPILE_FAIL
  (void)named;
  return tensordict::from_module(unnamed).keys();
#else
  (void)unnamed;
  return tensordict::from_module(named).keys();
#endif
}
