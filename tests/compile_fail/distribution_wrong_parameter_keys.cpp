// A probabilistic module whose in keys are not its distribution's parameters.
// expect: in_keys_are_not_the_distribution_parameters<tensordict::nn::Normal, tensordict::nn::in_keys<tensordict::key<3>{"loc"}, tensordict::key<3>{"std"}>
// expect: the in keys must name the distribution's parameters
#include <tensordict/nn/probabilistic.hpp>

namespace tdn = tensordict::nn;
#ifdef TENSORDICT_COMPILE_FAIL
using head_t = tdn::ProbabilisticTensorDictModule<tdn::Normal, tdn::in_keys<"loc", "std">, tdn::out_keys<"action">>;
#else
using head_t = tdn::ProbabilisticTensorDictModule<tdn::Normal, tdn::in_keys<"loc", "scale">, tdn::out_keys<"action">>;
#endif

head_t make_head() { return head_t(); }
