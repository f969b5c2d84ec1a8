// tensordict-cpp: everything but distributed.hpp (c10d and Gloo, which need
// -DUSE_C10D_GLOO: include it on its own). Include the headers named for a
// concept instead when compile time matters (keys.hpp and schema.hpp need no libtorch).
#pragma once

#include "any_tensordict.hpp"
#include "dict.hpp"
#include "distributions.hpp"
#include "errors.hpp"
#include "files.hpp"
#include "from_module.hpp"
#include "from_modules.hpp"
#include "functional.hpp"
#include "functional_call.hpp"
#include "functional_vmap.hpp"
#include "keys.hpp"
#include "lazy_stack.hpp"
#include "modules/builtin.hpp"
#include "module_registry.hpp"
#include "modules.hpp"
#include "params.hpp"
#include "probabilistic.hpp"
#include "reset_parameters.hpp"
#include "schema.hpp"
#include "tensorclass.hpp"
#include "tensordict_sequential.hpp"
#include "to_module.hpp"
#include "typed_tensordict.hpp"
#include "vmap.hpp"
