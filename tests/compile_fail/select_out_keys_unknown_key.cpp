// select_out_keys asked for a key that no module of the sequence writes.
// expect: selected_key_is_not_an_out_key<tensordict::key<3>{"obs"}
// expect: a key that no module of the sequence writes
#include <tensordict/nn/tensordict_sequential.hpp>

namespace tdn = tensordict::nn;
using encoder_t = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<"obs">, tdn::out_keys<"hidden">>;
using head_t = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<"hidden">, tdn::out_keys<"value">>;
using policy_t = tdn::TensorDictSequential<encoder_t, head_t>;

auto value_only(policy_t& policy) {
#ifdef TENSORDICT_COMPILE_FAIL
  return policy->select_out_keys<"obs">();
#else
  return policy->select_out_keys<"value">();
#endif
}
