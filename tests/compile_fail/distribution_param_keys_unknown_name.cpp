// Python's dict in_keys (param_keys) naming a parameter the distribution does not have.
// expect: in_keys_are_not_the_distribution_parameters<tensordict::nn::Normal, tensordict::nn::in_keys<tensordict::key<3>{"loc"}, tensordict::key<5>{"sigma"}>
// expect: the in keys must name the distribution's parameters
#include <tensordict/nn/probabilistic.hpp>

namespace tdn = tensordict::nn;
using tensordict::nested_key;
#ifdef TENSORDICT_COMPILE_FAIL
using head_t = tdn::ProbabilisticTensorDictModule<
    tdn::Normal, tdn::param_keys<tdn::param<"loc", nested_key<"agents", "mu">>, tdn::param<"sigma", nested_key<"agents", "sigma">>>,
    tdn::out_keys<"action">>;
#else
using head_t = tdn::ProbabilisticTensorDictModule<
    tdn::Normal, tdn::param_keys<tdn::param<"loc", nested_key<"agents", "mu">>, tdn::param<"scale", nested_key<"agents", "sigma">>>,
    tdn::out_keys<"action">>;
#endif

head_t make_head() { return head_t(); }
