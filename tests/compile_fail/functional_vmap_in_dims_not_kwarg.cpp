// functional_vmap with an in_dims key that is not a kwarg (the reference's KeyError).
// expect: in_dims_names_no_kwarg<tensordict::key<5>{"image"}
// expect: in_dims names an input
#include <tensordict/nn/functional_vmap.hpp>

namespace tdn = tensordict::nn;

at::Tensor ensemble(torch::nn::Linear& net, const tensordict::TensorDict<tdn::schema_of<torch::nn::LinearImpl>>& params,
                    const at::Tensor& x) {
#ifdef TENSORDICT_COMPILE_FAIL
  return tdn::functional_vmap(net, params, {}, tdn::kwargs(tdn::kw<"input">(x)), tdn::in_dims(tdn::in_dim_of<"image">(0)));
#else
  return tdn::functional_vmap(net, params, {}, tdn::kwargs(tdn::kw<"input">(x)), tdn::in_dims(tdn::in_dim_of<"input">(0)));
#endif
}
