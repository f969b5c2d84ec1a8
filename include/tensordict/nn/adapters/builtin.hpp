// Every built-in adapter, and their list: the run-time registry
// (nn/module_registry.hpp) knows each type of each family's list. A family is
// one header here; a type is added to its family's list beside its adapter.
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "transformer.hpp"

#include <type_traits>

#include "activation.hpp"
#include "adapter.hpp"
#include "adaptive.hpp"
#include "attention.hpp"
#include "conv.hpp"
#include "distance.hpp"
#include "../distribution_params.hpp"
#include "embedding.hpp"
#include "linear.hpp"
#include "loss.hpp"
#include "normalization.hpp"
#include "padding.hpp"
#include "parameter_free.hpp"
#include "pooling.hpp"
#include "recurrent.hpp"
#include "resampling.hpp"
#include "../sequential.hpp"

namespace tensordict::nn::detail {

using builtin_modules = typename concat_lists<linear_family, conv_family, normalization_family, embedding_family,
                                              activation_family, recurrent_family, attention_family, transformer_family,
                                              parameter_free_family, pooling_family, padding_family, resampling_family,
                                              distance_family, loss_family, distribution_params_family>::type;

// The built-in types whose tensors are named by their options (no schema).
using builtin_runtime_layout_modules = typename concat_lists<recurrent_layers_family, transformer_stacks_family, adaptive_family>::type;

// A type in a family's list has a schema and a functional form (its adapter).
template <class... Impl>
constexpr bool every_adapter_complete(type_list<Impl...>) {
  return ((described_module<Impl> && has_functional_form<Impl>) && ...);
}
static_assert(every_adapter_complete(builtin_modules{}),
              "tensordict: a built-in family lists a module type without a schema or a functional form");

}  // namespace tensordict::nn::detail
