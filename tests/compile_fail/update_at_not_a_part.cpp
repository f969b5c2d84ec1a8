// update_at_(other, index) where other's schema has a key that this one lacks.
// expect: unknown_key<tensordict::key<4>{"done"}
// expect: tensordict: unknown key.
#include <tensordict/typed_tensordict.hpp>

using step = tensordict::schema<tensordict::leaf<"obs">, tensordict::leaf<"reward">>;
#ifdef TENSORDICT_COMPILE_FAIL
using part = tensordict::schema<tensordict::leaf<"done">>;
#else
using part = tensordict::schema<tensordict::leaf<"reward">>;
#endif

void write_rows(tensordict::TensorDict<step>& buffer, const tensordict::TensorDict<part>& rows, std::int64_t at) {
  buffer.update_at_(rows, {at::indexing::Slice(at, at + rows.batch_size()[0])});
}
