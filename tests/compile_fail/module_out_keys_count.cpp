// A TensorDictModule whose out keys do not match the tensors its module returns.
// expect: the number of out keys differs from the number of tensors that the module returns
#include <tensordict/nn/adapters/recurrent.hpp>
#include <tensordict/nn/tensordict_module.hpp>

namespace tdn = tensordict::nn;
#ifdef TENSORDICT_COMPILE_FAIL
using member_t = tdn::TensorDictModule<torch::nn::LSTM, tdn::in_keys<"x">, tdn::out_keys<"y", "h">>;
#else
using member_t = tdn::TensorDictModule<torch::nn::LSTM, tdn::in_keys<"x">, tdn::out_keys<"y", "h", "c">>;
#endif

auto apply(member_t& member, const tensordict::TensorDict<tensordict::schema<tensordict::leaf<"x">>>& td) {
  return member->forward(td);
}
