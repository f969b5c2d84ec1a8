// unflatten_keys where one key is a leaf and also the prefix of another.
// expect: key_is_both_a_leaf_and_a_prefix<tensordict::key<1>{"a"}>
// expect: unflatten_keys cannot build a tree
#include <tensordict/schema.hpp>

#ifdef TENSORDICT_COMPILE_FAIL
using flat = tensordict::schema<tensordict::leaf<"a">, tensordict::leaf<"a.b">>;
#else
using flat = tensordict::schema<tensordict::leaf<"a.c">, tensordict::leaf<"a.b">>;
#endif

using tree = tensordict::unflatten_t<flat, ".">;
inline constexpr std::size_t leaves = tensordict::leaf_count_v<tree>;
