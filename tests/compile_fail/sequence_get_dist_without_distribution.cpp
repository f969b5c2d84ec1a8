// get_dist on a sequence whose last module builds no distribution.
// expect: get_dist and log_prob need a probabilistic last module
#include <tensordict/nn/tensordict_sequential.hpp>

namespace tdn = tensordict::nn;
using net_t = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<"obs">, tdn::out_keys<"logits">>;
using head_t = tdn::ProbabilisticTensorDictModule<tdn::Categorical, tdn::in_keys<"logits">, tdn::out_keys<"action">>;
#ifdef TENSORDICT_COMPILE_FAIL
using policy_t = tdn::TensorDictSequential<net_t>;
#else
using policy_t = tdn::TensorDictSequential<net_t, head_t>;
#endif

auto action_distribution(policy_t& policy, const tensordict::TensorDict<tensordict::schema<tensordict::leaf<"obs">>>& td) {
  return policy->get_dist(td);
}
