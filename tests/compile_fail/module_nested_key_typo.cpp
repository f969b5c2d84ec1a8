// A TensorDictModule whose nested in key has a typo: the message lists the keys under "agent", where the key
// path stops matching (it listed the top level's).
// expect: tensordict_lacks_in_key<tensordict::key_path_t<tensordict::key<5>{"agent"}, tensordict::key<6>{"actoin"}>, tensordict::compile_error::available_keys<tensordict::key<6>{"action"}, tensordict::key<3>{"obs"}> >
// expect: the keys at the level where the key path stops matching
#include <tensordict/nn/tensordict_module.hpp>

namespace tdn = tensordict::nn;
using tensordict::nested_key;
#ifdef TENSORDICT_COMPILE_FAIL
using member_t = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<nested_key<"agent", "actoin">>, tdn::out_keys<"y">>;
#else
using member_t = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<nested_key<"agent", "action">>, tdn::out_keys<"y">>;
#endif
using input_schema =
    tensordict::schema<tensordict::leaf<"top">, tensordict::node<"agent", tensordict::leaf<"action">, tensordict::leaf<"obs">>>;

auto apply(member_t& member, const tensordict::TensorDict<input_schema>& td) { return member->forward(td); }
