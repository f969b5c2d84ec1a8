// mlp_functional_vmap.cpp with the headers of what it uses, not the umbrella.
#include <tensordict/from_modules.hpp>
#include <tensordict/functional_call.hpp>
#include <tensordict/nn/adapters/linear.hpp>
#include <tensordict/nn/adapters/parameter_free.hpp>
#include <tensordict/nn/functional_vmap.hpp>
#include <tensordict/nn/sequential.hpp>
#include "mlp_ensemble_main.inc"
