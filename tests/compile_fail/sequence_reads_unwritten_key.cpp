// A TensorDictSequential whose second module reads a (nested) key that nothing before it writes: the message
// lists the keys under "agents", where the key path stops matching.
// expect: sequence_module_reads_unwritten_key<1, tensordict::key_path_t<tensordict::key<6>{"agents"}, tensordict::key<6>{"latent"}>, tensordict::compile_error::available_keys<tensordict::key<6>{"hidden"}> >
// expect: a module reads a key that neither the input nor an earlier module writes
#include <tensordict/nn/tensordict_sequential.hpp>

namespace tdn = tensordict::nn;
using tensordict::nested_key;
using encoder_t = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<"obs">, tdn::out_keys<nested_key<"agents", "hidden">>>;
#ifdef TENSORDICT_COMPILE_FAIL
using head_t = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<nested_key<"agents", "latent">>, tdn::out_keys<"value">>;
#else
using head_t = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<nested_key<"agents", "hidden">>, tdn::out_keys<"value">>;
#endif
using policy_t = tdn::TensorDictSequential<encoder_t, head_t>;

auto run(policy_t& policy, const tensordict::TensorDict<tensordict::schema<tensordict::leaf<"obs">>>& td) {
  return policy(td);
}
