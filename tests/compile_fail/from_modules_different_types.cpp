// from_modules of modules of different types.
// expect: from_modules_of_different_types<torch::nn::LinearImpl, torch::nn::Conv1dImpl>
// expect: every module must have the same type
#include <tensordict/functional.hpp>
#include <tensordict/nn/adapters/conv.hpp>
#include <tensordict/nn/adapters/linear.hpp>

auto stacked(const torch::nn::Linear& a, const torch::nn::Linear& b, const torch::nn::Conv1d& c) {
#ifdef TENSORDICT_COMPILE_FAIL
  return tensordict::from_modules(a, c);
#else
  (void)c;
  return tensordict::from_modules(a, b);
#endif
}
