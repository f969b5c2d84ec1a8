#include <tensordict/tensordict.hpp>
#include "mlp_ensemble_main.inc"
