// tensordict-cpp: everything. Include the headers named for a concept instead
// when compile time matters (keys.hpp and schema.hpp need no libtorch).
#pragma once

#include "errors.hpp"
#include "keys.hpp"
#include "schema.hpp"
#include "typed_tensordict.hpp"
