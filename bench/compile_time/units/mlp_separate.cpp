// mlp_functional_vmap.cpp compiled separately (-DTENSORDICT_SEPARATE_COMPILATION):
// the headers of what it uses, not the umbrella; the library's non-template
// functions are compiled once, in separate_definitions.cpp.
#include <tensordict/from_modules.hpp>
#include <tensordict/functional_call.hpp>
#include <tensordict/functional_vmap.hpp>
#include <tensordict/modules/linear.hpp>
#include <tensordict/modules/parameter_free.hpp>
#include <tensordict/modules/sequential.hpp>
#include "mlp_ensemble_main.inc"
