// Applying a TensorDictModule to a TensorDict without its in key.
// expect: tensordict_lacks_in_key<tensordict::key_path_t<tensordict::key<1>{"x"}>, tensordict::compile_error::available_keys<tensordict::key<5>{"input"}> >
// expect: the TensorDict has no leaf for an in key
#include <tensordict/nn/tensordict_module.hpp>

namespace tdn = tensordict::nn;
using member_t = tdn::TensorDictModule<torch::nn::Linear, tdn::in_keys<"x">, tdn::out_keys<"y">>;

#ifdef TENSORDICT_COMPILE_FAIL
using input_schema = tensordict::schema<tensordict::leaf<"input">>;
#else
using input_schema = tensordict::schema<tensordict::leaf<"x">>;
#endif

auto apply(member_t& member, const tensordict::TensorDict<input_schema>& td) { return member->forward(td); }
