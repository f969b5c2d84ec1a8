// tensordict/distributed.hpp in a translation unit compiled without -DUSE_C10D_GLOO
// (libtorch declares ProcessGroupGloo only under it); the twin defines it first, as
// Meson's tensordict_distributed_dep does on the command line.
// expect: tensordict/distributed.hpp needs -DUSE_C10D_GLOO on the command line
#ifndef TENSORDICT_COMPILE_FAIL
#define USE_C10D_GLOO
#endif
#include <tensordict/distributed.hpp>

int ranks() { return tensordict::distributed::shard_of(8, 0, 2).size > 0 ? 2 : 0; }
