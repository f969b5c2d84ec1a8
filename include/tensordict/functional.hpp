// The functional verbs together: a module's parameters as a TensorDict,
// swapped in and out. One header per verb, typed and run-time side by side:
//   from_module.hpp      the module's own tensors
//   to_module.hpp        swapped in for a scope (and to_module_)
//   from_modules.hpp     N modules stacked
//   functional_call.hpp  the forward with other tensors
// (nn/functional_vmap.hpp calls a module once per stacked set.)
#pragma once

#include "from_module.hpp"
#include "from_modules.hpp"
#include "functional_call.hpp"
#include "to_module.hpp"
