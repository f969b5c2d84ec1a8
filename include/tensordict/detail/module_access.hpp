// The registries of a torch::nn::Module (its parameters_ and buffers_ dicts),
// which to_module must update so that named_parameters() and the state dict
// show the swapped tensors. libtorch 1.13 offers no way to replace a
// registered tensor (register_parameter refuses an existing name), so this
// reaches the members through an explicit instantiation, which the standard
// exempts from access checks. Kept in this one header: it depends on
// libtorch's member names.
#pragma once

#include <torch/nn/module.h>
#include <torch/ordered_dict.h>

namespace tensordict::detail {

using tensor_registry = torch::OrderedDict<std::string, at::Tensor>;

template <auto Member, class Tag>
struct grant_access {
  friend constexpr auto member_pointer(Tag) { return Member; }
};

struct module_parameters_tag {
  friend constexpr auto member_pointer(module_parameters_tag);
};
struct module_buffers_tag {
  friend constexpr auto member_pointer(module_buffers_tag);
};

template struct grant_access<&torch::nn::Module::parameters_, module_parameters_tag>;
template struct grant_access<&torch::nn::Module::buffers_, module_buffers_tag>;

inline tensor_registry& module_parameters(torch::nn::Module& m) { return m.*member_pointer(module_parameters_tag{}); }
inline tensor_registry& module_buffers(torch::nn::Module& m) { return m.*member_pointer(module_buffers_tag{}); }

}  // namespace tensordict::detail
