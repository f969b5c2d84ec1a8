// select_subsequence asked for a key that no module of the sequence reads or writes.
// expect: subsequence_key_unknown<tensordict::key<5>{"valeu"}
// expect: a key that no module of the sequence reads or writes
#include <tensordict/nn/tensordict_sequential.hpp>

namespace tdn = tensordict::nn;
using encoder_t = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<"obs">, tdn::out_keys<"hidden">>;
using head_t = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<"hidden">, tdn::out_keys<"value">>;
using policy_t = tdn::TensorDictSequential<encoder_t, head_t>;

auto head_only(policy_t& policy) {
#ifdef TENSORDICT_COMPILE_FAIL
  return policy->select_subsequence<tdn::in_keys<"hidden">, tdn::out_keys<"valeu">>();
#else
  return policy->select_subsequence<tdn::in_keys<"hidden">, tdn::out_keys<"value">>();
#endif
}
