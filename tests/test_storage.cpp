// Storage for collectors and replay buffers: preallocation, indexed writes,
// write-through memmap directories.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "catch_torch.hpp"
#include "test_helpers.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <tensordict/files/torch_save.hpp>
#include <tensordict/files/memmap.hpp>
#include <tensordict/preallocate.hpp>
#include <tensordict/files/safetensors.hpp>

// The exception's type, then its message (a failed write changes nothing, so the call can run twice).
#define CHECK_THROWS_TYPED(expr, type, matcher) \
  CHECK_THROWS_AS(expr, type);                  \
  CHECK_THROWS_WITH(expr, matcher)

using namespace tensordict;
using at::indexing::Ellipsis;
using at::indexing::Slice;
using test::Contains;
using test::impl;
using test::temporary_dir;

namespace {

using transition = schema<leaf<"obs">, leaf<"action">, leaf<"reward">, node<"next", leaf<"obs">>>;
using reward_only = schema<leaf<"reward">>;

at::Tensor rows(std::int64_t n, std::int64_t width, double start = 1) {
  return (at::arange(n * width, at::kFloat) + start).reshape({n, width});
}

// A buffer of `capacity` transitions (obs f32[4], action i64[], reward f32[], next.obs f32[4]), all zero.
AnyTensorDict any_buffer(std::int64_t capacity) {
  AnyTensorDict sample({{"obs", at::zeros({4})}, {"action", at::zeros({}, at::kLong)}, {"reward", at::zeros({})},
                        {{"next", "obs"}, at::zeros({4})}});
  return zeros_like(sample, {capacity});
}

AnyTensorDict any_batch(std::int64_t n, double start) {
  return AnyTensorDict({{"obs", rows(n, 4, start)}, {"action", at::arange(n, at::kLong) + 10},
                        {"reward", at::arange(n, at::kFloat) + start}, {{"next", "obs"}, rows(n, 4, start) + 100}},
                       {n});
}

// The values of every leaf, cloned: what a failed write must leave.
AnyTensorDict snapshot(const AnyTensorDict& td) { return td.clone(); }
bool same_values(const AnyTensorDict& a, const AnyTensorDict& b) { return (a == b).all(); }

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("zeros_like / empty_like: a new batch size, each leaf's own dims, dtype and device kept", "[storage]") {
  AnyTensorDict sample({{"obs", at::ones({4})}, {"action", at::ones({}, at::kLong)}});
  sample.set({"nested"}, AnyTensorDict({{"x", at::ones({2, 3})}}, {2}));  // a level with a batch dim of its own
  const AnyTensorDict buffer = zeros_like(sample, {5, 3});
  CHECK(buffer.batch_size().vec() == std::vector<std::int64_t>{5, 3});
  CHECK(buffer.get("obs").sizes().vec() == std::vector<std::int64_t>{5, 3, 4});
  CHECK(buffer.get("action").scalar_type() == at::kLong);
  CHECK(buffer.get("action").sizes().vec() == std::vector<std::int64_t>{5, 3});
  CHECK(buffer.get_tensordict("nested").batch_size().vec() == std::vector<std::int64_t>{5, 3, 2});
  CHECK(buffer.get("nested", "x").sizes().vec() == std::vector<std::int64_t>{5, 3, 2, 3});
  CHECK(buffer.get("obs").count_nonzero().item<std::int64_t>() == 0);
  CHECK(buffer.get("obs").data_ptr() != sample.get("obs").data_ptr());

  const AnyTensorDict same = empty_like(buffer);
  CHECK(same.batch_size().vec() == buffer.batch_size().vec());
  CHECK(same.get("nested", "x").sizes().vec() == buffer.get("nested", "x").sizes().vec());

  // From a batch of 8 rows, a buffer of 100: the batch dims are replaced.
  const AnyTensorDict from_batch = zeros_like(any_batch(8, 0), {100});
  CHECK(from_batch.get("next", "obs").sizes().vec() == std::vector<std::int64_t>{100, 4});
}

TEST_CASE("zeros<S> / empty<S>: a typed buffer from its schema and each leaf's shape and dtype", "[storage]") {
  auto buffer = zeros<transition>({6}, kv<"obs">(leaf_spec{{4}}), kv<"action">(leaf_spec{{}, at::kLong}),
                                  kv<"reward">(leaf_spec{{}}), kv<"next", "obs">(leaf_spec{{4}, at::kDouble}));
  CHECK(buffer.get<"obs">().sizes().vec() == std::vector<std::int64_t>{6, 4});
  CHECK(buffer.get<"action">().scalar_type() == at::kLong);
  CHECK(buffer.get<"next", "obs">().scalar_type() == at::kDouble);
  CHECK(buffer.get<"reward">().sum().item<float>() == 0);
  const auto like = zeros_like(buffer, {2, 3});
  CHECK(like.get<"next", "obs">().sizes().vec() == std::vector<std::int64_t>{2, 3, 4});
  const auto uninitialized = empty<transition>({6}, kv<"obs">(leaf_spec{{4}}), kv<"action">(leaf_spec{{}, at::kLong}),
                                               kv<"reward">(leaf_spec{{}}), kv<"next", "obs">(leaf_spec{{4}}));
  CHECK(uninitialized.get<"obs">().sizes().vec() == std::vector<std::int64_t>{6, 4});
}

TEST_CASE("index_put_: every kind of index along the batch dims, the leaves keep their storage", "[storage]") {
  AnyTensorDict buffer = any_buffer(10);
  const auto* obs_impl = impl(buffer.get("obs"));
  const void* obs_data = buffer.get("obs").data_ptr();

  SECTION("an integer") {
    buffer.index_put_({3}, any_batch(1, 5)[0]);
    CHECK(at::equal(buffer.get("obs")[3], rows(1, 4, 5)[0]));
    CHECK(buffer.get("action")[3].item<std::int64_t>() == 10);
    CHECK(buffer.get("obs").sum().item<float>() == rows(1, 4, 5).sum().item<float>());
  }
  SECTION("a slice") {
    buffer.index_put_({Slice(2, 5)}, any_batch(3, 1));
    CHECK(at::equal(buffer.get("obs").slice(0, 2, 5), rows(3, 4, 1)));
    CHECK(at::equal(buffer.get("next", "obs").slice(0, 2, 5), rows(3, 4, 1) + 100));
    CHECK(buffer.get("obs")[1].sum().item<float>() == 0);
  }
  SECTION("an index tensor, wrapping around as a circular buffer does") {
    const at::Tensor where = at::tensor(std::vector<std::int64_t>{8, 9, 0, 1});
    buffer.index_put_({where}, any_batch(4, 1));
    CHECK(at::equal(buffer.get("obs").index({where}), rows(4, 4, 1)));
    CHECK(at::equal(buffer.get("reward").index({where}), at::arange(4, at::kFloat) + 1));
  }
  SECTION("a boolean mask") {
    const at::Tensor mask = at::arange(10) % 3 == 0;  // rows 0, 3, 6, 9
    buffer.index_put_({mask}, any_batch(4, 1));
    CHECK(at::equal(buffer.get("obs").index({mask}), rows(4, 4, 1)));
    CHECK(buffer.get("obs")[1].sum().item<float>() == 0);
  }
  SECTION("a value broadcast over the indexed rows") {
    buffer.index_put_({Slice(0, 4)}, any_batch(1, 7));
    for (std::int64_t r = 0; r < 4; ++r) CHECK(at::equal(buffer.get("obs")[r], rows(1, 4, 7)[0]));
  }
  CHECK(impl(buffer.get("obs")) == obs_impl);
  CHECK(buffer.get("obs").data_ptr() == obs_data);
}

TEST_CASE("index_put_: tuples of indices over two batch dims, and an Ellipsis", "[storage]") {
  AnyTensorDict grid = zeros_like(AnyTensorDict({{"x", at::zeros({2})}}), {4, 5});
  grid.index_put_({1, Slice(1, 3)}, AnyTensorDict({{"x", at::ones({2, 2})}}, {2}));
  CHECK(grid.get("x").sum().item<float>() == 4);
  CHECK(grid.get("x")[1][1].sum().item<float>() == 2);
  grid.index_put_({at::tensor(std::vector<std::int64_t>{0, 3}), at::tensor(std::vector<std::int64_t>{4, 0})},
                  AnyTensorDict({{"x", at::full({2, 2}, 2.0)}}, {2}));
  CHECK(grid.get("x")[3][0][0].item<float>() == 2);
  grid.index_put_({Ellipsis, 4}, AnyTensorDict({{"x", at::full({4, 2}, 3.0)}}, {4}));
  CHECK(grid.get("x").select(1, 4).eq(3).all().item<bool>());
}

TEST_CASE("set_at_ and update_at_: one leaf, or a part of the keys", "[storage]") {
  AnyTensorDict buffer = any_buffer(6);
  buffer.set_at_({"next", "obs"}, at::ones({2, 4}), {Slice(1, 3)});
  CHECK(buffer.get("next", "obs").sum().item<float>() == 8);
  buffer.update_at_(AnyTensorDict({{"reward", at::full({2}, 5.0)}}, {2}), {Slice(4, 6)});
  CHECK(buffer.get("reward").sum().item<float>() == 10);
  CHECK(buffer.get("obs").sum().item<float>() == 0);  // other leaves untouched

  // index_put_ writes whole rows: every key, or key_error naming the one missing.
  CHECK_THROWS_TYPED(buffer.index_put_({0}, AnyTensorDict({{"reward", at::ones({})}})), key_error,
                       Contains("is set on one side only"));

  SECTION("typed: a sub-schema writes a part of each row") {
    auto typed = buffer.to_typed<transition>();
    typed.update_at_(make<reward_only>({2}, kv<"reward">(at::full({2}, 9.0))), {Slice(0, 2)});
    CHECK(buffer.get("reward")[0].item<float>() == 9);
    typed.set_at_<"next", "obs">(at::full({4}, 2.0), {5});
    CHECK(buffer.get("next", "obs")[5].sum().item<float>() == 8);
    typed.get<"next">().update_at_(make<schema<leaf<"obs">>>({1}, kv<"obs">(at::full({1, 4}, 3.0))), {0});
    CHECK(buffer.get("next", "obs")[0].sum().item<float>() == 12);
    typed.index_put_({Slice(2, 4)}, any_batch(2, 1).to_typed<transition>());
    CHECK(at::equal(buffer.get("obs").slice(0, 2, 4), rows(2, 4, 1)));
  }
}

TEST_CASE("indexed writes: checked before the first byte, a failed write changes nothing", "[storage]") {
  AnyTensorDict buffer = any_buffer(6);
  buffer.index_put_({Slice(0, 3)}, any_batch(3, 1));
  const AnyTensorDict before = snapshot(buffer);

  SECTION("a shape that does not fit, in the last leaf written") {
    AnyTensorDict bad = any_batch(2, 50);
    bad.set({"next", "obs"}, at::ones({2, 5}));
    CHECK_THROWS_TYPED(buffer.index_put_({Slice(3, 5)}, bad), shape_error,
                         Contains("TensorDict.index_put_((\"next\", \"obs\")): cannot write f32[2,5]") && Contains("has shape [2,4]"));
  }
  SECTION("a dtype the leaf cannot hold without changing kind") {
    AnyTensorDict bad = any_batch(2, 50);
    bad.set({"action"}, at::ones({2}, at::kFloat));
    CHECK_THROWS_TYPED(buffer.index_put_({Slice(3, 5)}, bad), dtype_error,
                         Contains("TensorDict.index_put_(\"action\"): cannot write f32[2] into the leaf i64[6]"));
  }
  SECTION("an index past the end") {
    CHECK_THROWS_TYPED(buffer.index_put_({at::tensor(std::vector<std::int64_t>{2, 6})}, any_batch(2, 50)), index_error,
                         Contains("the index does not fit batch_size=[6]"));
    CHECK_THROWS_AS(buffer.index_put_({7}, any_batch(1, 50)[0]), index_error);
    // Named as given (it said "index -1", the normalised value, which is valid), and by the call made.
    CHECK_THROWS_TYPED(buffer.index_put_({-9}, any_batch(1, 50)[0]), index_error,
                       Contains("TensorDict.index_put_: the index does not fit batch_size=[6]: index -9 is out of bounds"));
    CHECK_THROWS_TYPED(buffer.update_at_(any_batch(1, 50)[0], {-7}), index_error,
                       Contains("TensorDict.update_at_: the index does not fit batch_size=[6]: index -7 is out of bounds"));
    auto typed = buffer.to_typed<transition>();
    CHECK_THROWS_TYPED(typed.index_put_({-9}, any_batch(1, 50)[0].to_typed<transition>()), index_error,
                       Contains("TensorDict.index_put_: the index does not fit batch_size=[6]: index -9 is out of bounds"));
  }
  SECTION("a key that is not there") {
    CHECK_THROWS_AS(buffer.update_at_(AnyTensorDict({{"obs", at::ones({2, 4})}, {"done", at::ones({2})}}, {2}), {Slice(0, 2)}),
                    key_error);
  }
  SECTION("a leaf of the autograd graph") {
    AnyTensorDict params({{"w", at::zeros({3, 2}).requires_grad_()}}, {3});
    CHECK_THROWS_TYPED(params.set_at_({"w"}, at::ones({2}), {0}), value_error, Contains("write under at::NoGradGuard"));
    at::NoGradGuard no_grad;
    params.set_at_({"w"}, at::ones({2}), {0});
    CHECK(params.get("w").sum().item<float>() == 2);
  }
  CHECK(same_values(buffer, before));
}

TEST_CASE("indexed writes: autograd sees the leaf changed, as after an in-place op", "[storage]") {
  AnyTensorDict td({{"x", at::ones({4, 2})}}, {4});
  const at::Tensor w = at::ones({2}).requires_grad_();
  const at::Tensor y = (td.get("x") * w).sum();  // saves x for w's gradient
  const auto version = td.get("x")._version();
  td.set_at_({"x"}, at::zeros({2}), {0});
  CHECK(td.get("x")._version() > version);
  CHECK_THROWS_WITH(y.backward(), Contains("modified by an inplace operation"));
}

TEST_CASE("indexed writes: a value that views the leaf itself, and a locked TensorDict", "[storage]") {
  AnyTensorDict buffer = any_buffer(6);
  buffer.index_put_({Slice(0, 3)}, any_batch(3, 1));
  buffer.lock_();
  // Rows 1..3 from rows 0..2 of the same tensors: read whole before written.
  buffer.index_put_({Slice(1, 4)}, buffer.index({Slice(0, 3)}));
  CHECK(at::equal(buffer.get("obs").slice(0, 1, 4), rows(3, 4, 1)));
  CHECK_THROWS_AS(buffer.set({"obs"}, at::zeros({6, 4})), lock_error);
}

TEST_CASE("memmap_like: full-size zero files in Python's layout, loaded shared, writes reach the files", "[storage]") {
  temporary_dir dir("memmap_like");
  const std::string path = dir / "buffer";
  AnyTensorDict buffer = memmap_like(any_batch(1000, 0), path);
  CHECK(buffer.batch_size().vec() == std::vector<std::int64_t>{1000});
  CHECK(buffer.is_locked());
  CHECK(std::filesystem::file_size(path + "/obs.memmap") == 1000 * 4 * 4);
  CHECK(std::filesystem::file_size(path + "/next/obs.memmap") == 1000 * 4 * 4);
  CHECK(std::filesystem::exists(path + "/next/meta.json"));
  struct stat st {};
  REQUIRE(::stat((path + "/obs.memmap").c_str(), &st) == 0);
  CHECK(st.st_blocks * 512 < 16000);  // sparse: nothing written yet (tmpfs and ext4 both allocate lazily)
  CHECK(buffer.get("obs").count_nonzero().item<std::int64_t>() == 0);

  buffer.index_put_({Slice(10, 12)}, any_batch(2, 1));
  const std::string obs = file_bytes(path + "/obs.memmap");
  float row[4];
  std::memcpy(row, obs.data() + 11 * 4 * sizeof(float), sizeof row);
  CHECK(row[0] == 5);
  CHECK(row[3] == 8);

  // Another load sees it: a private mapping (the default) and a shared one.
  CHECK(at::equal(load_memmap(path).get("obs").slice(0, 10, 12), rows(2, 4, 1)));
  load_options shared;
  shared.memory = load_memory::shared;
  AnyTensorDict other = load_memmap(path, shared);
  other.set_at_({"reward"}, at::full({}, 42.0), {999});
  CHECK(buffer.get("reward")[999].item<float>() == 42);
  CHECK_THROWS_AS(other.set({"reward"}, at::zeros({1000})), lock_error);

  CHECK_THROWS_TYPED(memmap_like(any_batch(2, 0), path), file_error, Contains("it exists; reopen it with load_memmap"));
  CHECK(buffer.get("reward")[999].item<float>() == 42);  // the refused call left the files alone

  auto typed = memmap_like(any_batch(3, 0).to_typed<transition>(), dir / "typed");
  CHECK(typed.is_locked());
  typed.set_at_<"reward">(at::full({}, 7.0), {2});
  CHECK(load_memmap<transition>(dir / "typed").get<"reward">()[2].item<float>() == 7);
}

TEST_CASE("load_memory::shared: for memmap directories only", "[storage]") {
  temporary_dir dir("shared_only");
  save(any_batch(2, 0), dir / "file.pt");
  load_options shared;
  shared.memory = load_memory::shared;
  CHECK_THROWS_TYPED(load(dir / "file.pt", shared), value_error, Contains("maps memmap directories only"));
}

TEST_CASE("memmap write-through: another process mapping the file sees the rows written", "[storage]") {
  temporary_dir dir("second_process");
  const std::string path = dir / "buffer";
  AnyTensorDict buffer = memmap_like(any_batch(64, 0), path);
  int ready[2], written[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(written) == 0);
  const std::string file = path + "/reward.memmap";
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The reader: plain POSIX calls only (no libtorch, no allocation) after fork.
    const int fd = ::open(file.c_str(), O_RDONLY);
    void* map = fd < 0 ? MAP_FAILED : ::mmap(nullptr, 64 * sizeof(float), PROT_READ, MAP_SHARED, fd, 0);
    char byte = 1;
    if (map == MAP_FAILED || ::write(ready[1], &byte, 1) != 1 || ::read(written[0], &byte, 1) != 1) ::_exit(2);
    const auto* reward = static_cast<const float*>(map);
    for (int r = 0; r < 64; ++r)
      if (reward[r] != (r >= 32 && r < 48 ? float(r - 32) + 3 : 0.0f)) ::_exit(1);
    ::_exit(0);
  }
  char byte = 0;
  REQUIRE(::read(ready[0], &byte, 1) == 1);  // the child has mapped the file before anything is written
  buffer.index_put_({Slice(32, 48)}, any_batch(16, 3));
  REQUIRE(::write(written[1], &byte, 1) == 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  for (int fd : {ready[0], ready[1], written[0], written[1]}) ::close(fd);
}

// For tests/data/check_python_reads.py: fills a memmap buffer in two halves,
// waiting after the first until Python has read it while this process still writes.
TEST_CASE("memmap buffer that Python reads while it is filled", "[.python_memmap_fill]") {
  const char* out = std::getenv("TENSORDICT_OUT");
  REQUIRE(out != nullptr);
  const std::string dir = std::string(out) + "/buffer";
  AnyTensorDict buffer = memmap_like(any_batch(8, 0), dir);
  buffer.index_put_({Slice(0, 4)}, any_batch(4, 1));
  std::ofstream(std::string(out) + "/half_written").put('1');
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(std::string(out) + "/half_read")) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  buffer.index_put_({Slice(4, 8)}, any_batch(4, 5));
}

TEST_CASE("consolidate: every leaf in one buffer, moved and copied as one", "[storage]") {
  AnyTensorDict td = any_batch(3, 1);
  td.set({"flag"}, at::ones({3}, at::kBool));
  CHECK_FALSE(td.is_consolidated());
  const AnyTensorDict one = td.consolidate();
  CHECK(one.is_locked());
  CHECK(same_values(one, td));
  const at::Tensor storage = one.consolidated_storage();
  REQUIRE(storage.defined());
  CHECK(storage.scalar_type() == at::kByte);
  // The layout: values() order, each leaf at a multiple of 8 bytes, the buffer ending with the last.
  // obs f32[3,4] 48 B at 0, action i64[3] 24 B at 48, reward f32[3] 12 B at 72, next.obs 48 B at 88, flag 3 B at 136.
  CHECK(storage.size(0) == 139);
  CHECK(one.get("flag").data_ptr() == static_cast<void*>(static_cast<char*>(storage.data_ptr()) + 136));
  for (const at::Tensor& t : one.values()) CHECK(t.storage().is_alias_of(storage.storage()));

  // A write into a leaf is a write into the buffer; the buffer rebuilds the TensorDict elsewhere.
  one.get("reward").fill_(5);
  const AnyTensorDict rebuilt = td.from_consolidated(storage.clone());
  CHECK(rebuilt.get("reward").eq(5).all().item<bool>());
  CHECK(same_values(rebuilt, one));
  CHECK_THROWS_WITH(td.from_consolidated(at::zeros({10}, at::kByte)), Contains("expected the buffer u8[139]"));

  // clone() and to(device) copy one buffer, and their result is consolidated too.
  const AnyTensorDict copy = one.clone();
  CHECK(copy.is_consolidated());
  CHECK(copy.consolidated_storage().data_ptr() != storage.data_ptr());
  CHECK(same_values(copy, one));

  SECTION("typed") {
    const auto typed = any_batch(2, 0).to_typed<transition>().consolidate();
    CHECK(typed.is_consolidated());
    CHECK(typed.consolidated_storage().size(0) == 32 + 16 + 8 + 32);
  }
  SECTION("a leaf that requires grad keeps autograd's copy in clone()") {
    AnyTensorDict params({{"w", at::ones({2}).requires_grad_()}});
    const AnyTensorDict cloned = params.consolidate().clone();  // consolidate copies values; the clone is a plain copy
    CHECK(cloned.is_consolidated());
    AnyTensorDict live({{"w", at::ones({2}).requires_grad_()}});
    CHECK(live.clone().get("w").requires_grad());
  }
}

// ---- non-tensor data ------------------------------------------------------------------------

namespace {
std::vector<std::string> strings(const NonTensor& v) {
  std::vector<std::string> out;
  for (const auto& value : v.values()) out.push_back(std::get<std::string>(value));
  return out;
}
}  // namespace

TEST_CASE("non-tensor data: set and read beside tensors, never a leaf", "[storage][non_tensor]") {
  AnyTensorDict td({{"obs", rows(3, 2)}}, {3});
  td.set_non_tensor({"task"}, "reach-target");
  td.set_non_tensor({"episode"}, 7);
  td.set_non_tensor({"nested", "label"}, "inner");  // creates the sub-tree
  td.set_non_tensor({"gamma"}, 0.99);
  td.set_non_tensor({"done"}, false);
  td.set_non_tensor({"none"}, std::monostate{});
  CHECK(td.get_non_tensor<std::string>({"task"}) == "reach-target");
  CHECK(td.get_non_tensor<std::int64_t>({"episode"}) == 7);
  CHECK(td.get_non_tensor<std::string>("nested", "label") == "inner");
  CHECK(td.get_non_tensor<double>({"gamma"}) == 0.99);
  CHECK_FALSE(td.get_non_tensor<bool>({"done"}));
  CHECK(td.get_non_tensor({"none"}) == non_tensor_value{});
  CHECK(td.get_tensordict("nested").batch_size().equals({3}));
  CHECK(td.contains("task"));
  CHECK(td.is_non_tensor({"nested", "label"}));
  CHECK_FALSE(td.is_non_tensor({"obs"}));
  CHECK_FALSE(td.is_leaf({"task"}));
  CHECK(td.keys() == std::vector<any_key_path>{{"obs"}});  // tensors only: values(), apply, arithmetic
  CHECK(td.non_tensor_keys() == std::vector<any_key_path>{{"task"}, {"episode"}, {"gamma"}, {"done"}, {"none"}, {"nested", "label"}});
  CHECK(td.non_tensor_keys(false).size() == 5);
  CHECK(td.repr() == "TensorDict(batch_size=[3], fields={done: NonTensorData(False), episode: NonTensorData(7), gamma: "
                     "NonTensorData(0.99), nested: {label: NonTensorData('inner')}, none: NonTensorData(None), obs: f32[3,2], "
                     "task: NonTensorData('reach-target')})");

  // Verbs that keep or change the batch carry NonTensorData as it is.
  const AnyTensorDict doubled = (td * 2).clone();
  CHECK(doubled.get_non_tensor<std::string>({"task"}) == "reach-target");
  CHECK(doubled.get_non_tensor<std::string>("nested", "label") == "inner");
  CHECK(td[1].get_non_tensor<std::int64_t>({"episode"}) == 7);
  CHECK(td.sum().get_non_tensor<std::string>({"task"}) == "reach-target");
  CHECK(td.unsqueeze(0).reshape({3}).get_non_tensor<std::string>({"task"}) == "reach-target");
  CHECK(td.select({{"task"}, {"obs"}}).non_tensor_keys() == std::vector<any_key_path>{{"task"}});
  CHECK(td.exclude({{"task"}, {"nested", "label"}}).non_tensor_keys().size() == 4);
  CHECK(td.flatten_keys().get_non_tensor<std::string>({"nested.label"}) == "inner");
  CHECK(td.flatten_keys().unflatten_keys().get_non_tensor<std::string>("nested", "label") == "inner");
  AnyTensorDict other({3});
  other.update(td);
  CHECK(other.get_non_tensor<std::string>({"task"}) == "reach-target");

  // Errors name the key and what to do.
  CHECK_THROWS_TYPED(td.get("task"), key_error,
                     Contains("\"task\" holds non-tensor data (NonTensorData('reach-target'))") && Contains("get_non_tensor"));
  CHECK_THROWS_TYPED(td.get_non_tensor<std::int64_t>({"task"}), dtype_error,
                     Contains("get_non_tensor(\"task\"): asked for int, but it holds str 'reach-target'"));
  CHECK_THROWS_TYPED(td.get_non_tensor({"obs"}), key_error, Contains("holds a tensor (f32[3,2]), not non-tensor data"));
  CHECK_THROWS_TYPED(td.get_non_tensor({"nope"}), key_error, Contains("no key \"nope\""));
  CHECK_THROWS_TYPED(td.set({"task", "x"}, at::ones({3})), key_error, Contains("holds non-tensor data"));
  CHECK_THROWS_TYPED(td.to_typed<schema<leaf<"obs">>>(), key_error,
                     Contains("\"task\": non-tensor data (NonTensorData('reach-target')), which the schema has no non_tensor<...> field for"));
  CHECK(td.exclude(td.non_tensor_keys()).to_typed<schema<leaf<"obs">>>().get<"obs">().is_same(td.get("obs")));

  // A key holds one kind of entry: setting one kind replaces the other.
  td.set("task", at::zeros({3}));
  CHECK_FALSE(td.is_non_tensor({"task"}));
  td.set_non_tensor({"task"}, "again");
  CHECK(td.keys() == std::vector<any_key_path>{{"obs"}});
  td.rename_key_({"task"}, {"nested", "task"});
  CHECK(td.get_non_tensor<std::string>("nested", "task") == "again");
  td.erase("nested", "task");
  CHECK_FALSE(td.contains("nested", "task"));
  td.lock_();
  CHECK_THROWS_TYPED(td.set_non_tensor({"task"}, "x"), lock_error, Contains("locked"));
  CHECK_THROWS_AS(td.erase("episode"), lock_error);
  CHECK(td.get_non_tensor<std::int64_t>({"episode"}) == 7);
}

TEST_CASE("NonTensorStack: one value per batch element, rearranged with the batch dims", "[storage][non_tensor]") {
  AnyTensorDict td({{"r", at::arange(6, at::kFloat).reshape({3, 2})}}, {3, 2});
  td.set_non_tensor({"name"}, NonTensor::stack({"a0", "a1", "b0", "b1", "c0", "c1"}, {3, 2}));
  CHECK(td.non_tensor({"name"}).is_stack());
  CHECK_THROWS_TYPED(td.get_non_tensor({"name"}), value_error, Contains("one value per batch element") && Contains("index the TensorDict"));
  CHECK(td.index({1, 0}).get_non_tensor<std::string>({"name"}) == "b0");  // one element: a NonTensorData
  CHECK(strings(td[2].non_tensor({"name"})) == std::vector<std::string>{"c0", "c1"});
  CHECK(strings(td.index({at::tensor({2, 0}, at::kLong), Slice(1)}).non_tensor({"name"})) == std::vector<std::string>{"c1", "a1"});
  CHECK(strings(td.index({at::tensor({1, 0, 1}).to(at::kBool)}).non_tensor({"name"})) == std::vector<std::string>{"a0", "a1", "c0", "c1"});
  CHECK(strings(td.transpose(0, 1).non_tensor({"name"})) == std::vector<std::string>{"a0", "b0", "c0", "a1", "b1", "c1"});
  CHECK(td.reshape({6}).non_tensor({"name"}).shape() == std::vector<std::int64_t>{6});
  CHECK(strings(td.unbind(1)[1].non_tensor({"name"})) == std::vector<std::string>{"a1", "b1", "c1"});
  CHECK(strings(td.split(2, 0)[1].non_tensor({"name"})) == std::vector<std::string>{"c0", "c1"});
  CHECK(strings(td[0].unsqueeze(0).expand({2, 2}).non_tensor({"name"})) == std::vector<std::string>{"a0", "a1", "a0", "a1"});
  // The tensors and the values stay aligned through a shuffle.
  const AnyTensorDict shuffled = td.reshape({6}).index({at::tensor({4, 1, 5}, at::kLong)});
  CHECK(at::equal(shuffled.get("r"), at::tensor({4.0f, 1.0f, 5.0f})));
  CHECK(strings(shuffled.non_tensor({"name"})) == std::vector<std::string>{"c0", "a1", "c1"});

  CHECK_THROWS_TYPED(td.sum(), value_error, Contains("\"name\" holds one value per batch element") && Contains("exclude it first"));
  CHECK_THROWS_TYPED(td.set_non_tensor({"bad"}, NonTensor::stack({"x", "y"}, {2})), shape_error,
                     Contains("NonTensorStack of shape [2] where the batch size is [3,2]"));
  CHECK_THROWS_TYPED(NonTensor::stack({"x", "y"}, {3}), shape_error, Contains("2 values for the shape [3]"));
}

TEST_CASE("stack and cat: equal NonTensorData stay one, others become a NonTensorStack", "[storage][non_tensor]") {
  // tensordict 0.4: stacking TensorDicts whose "name" differs gives [[alpha, alpha], [beta, beta], [gamma, gamma]].
  std::vector<AnyTensorDict> parts;
  for (const char* name : {"alpha", "beta", "gamma"}) {
    AnyTensorDict t({{"r", at::full({2}, static_cast<double>(parts.size()))}}, {2});
    t.set_non_tensor({"name"}, name);
    t.set_non_tensor({"env"}, "cartpole");
    parts.push_back(t);
  }
  const AnyTensorDict stacked = stack(parts, 0);
  CHECK(stacked.get_non_tensor<std::string>({"env"}) == "cartpole");
  CHECK(stacked.non_tensor({"name"}).shape() == std::vector<std::int64_t>{3, 2});
  CHECK(strings(stacked.non_tensor({"name"})) == std::vector<std::string>{"alpha", "alpha", "beta", "beta", "gamma", "gamma"});
  CHECK(strings(stack(parts, 1).non_tensor({"name"})) == std::vector<std::string>{"alpha", "beta", "gamma", "alpha", "beta", "gamma"});
  const AnyTensorDict joined = cat({stacked[0], stacked[2]}, 0);
  CHECK(strings(joined.non_tensor({"name"})) == std::vector<std::string>{"alpha", "alpha", "gamma", "gamma"});
  AnyTensorDict missing = parts[1].exclude({{"name"}});
  CHECK_THROWS_TYPED(stack({parts[0], missing}), key_error, Contains("the non-tensor entry \"name\" is in TensorDict 0 but not in TensorDict 1"));
}

TEST_CASE("non-tensor data in memmap directories: tensordict 0.4's files, both ways", "[storage][non_tensor]") {
  const std::string dir = test::test_data("tensordict-v0.4-nontensor/");
  const AnyTensorDict td = load_memmap(dir + "strings_and_ints");
  CHECK(td.batch_size().equals({3}));
  CHECK(at::equal(td.get("obs"), at::arange(6, at::kFloat).reshape({3, 2})));
  CHECK(at::equal(td.get("nested", "x"), at::ones({3})));
  CHECK(td.get_non_tensor<std::string>({"task"}) == "reach-target");
  CHECK(td.get_non_tensor<std::int64_t>({"episode"}) == 7);
  CHECK(td.get_non_tensor<std::string>("nested", "label") == "inner");
  CHECK(load_memmap(dir + "strings_and_ints", {.skip_non_tensors = true}).non_tensor_keys().empty());

  // stacked_names.result.txt: get_non_tensor('name') after stack: [['alpha', 'alpha'], ['beta', 'beta'], ['gamma', 'gamma']]
  const AnyTensorDict stacked = load_memmap(dir + "stacked_names");
  CHECK(stacked.batch_size().equals({3, 2}));
  CHECK(stacked.non_tensor({"name"}).shape() == std::vector<std::int64_t>{3, 2});
  CHECK(strings(stacked.non_tensor({"name"})) == std::vector<std::string>{"alpha", "alpha", "beta", "beta", "gamma", "gamma"});
  CHECK(at::equal(stacked.get("r"), at::tensor({0.0f, 0.0f, 1.0f, 1.0f, 2.0f, 2.0f}).reshape({3, 2})));

  // Written back in the same layout: the files tensordict 0.4 reads (each meta.json compared as JSON).
  temporary_dir out("non_tensor_memmap");
  save_memmap(td, out / "strings_and_ints", {.memmap = memmap_layout::v0_4});  // 0.4 wrote them
  save_memmap(stacked, out / "stacked_names", {.memmap = memmap_layout::v0_4});
  auto json = [](const std::string& path) { return nlohmann::json::parse(std::ifstream(path)); };
  for (const char* file : {"strings_and_ints/task/meta.json", "strings_and_ints/task/_tensordict/meta.json",
                           "strings_and_ints/episode/meta.json", "strings_and_ints/nested/label/meta.json",
                           "strings_and_ints/meta.json", "strings_and_ints/nested/meta.json", "stacked_names/meta.json",
                           "stacked_names/name/meta.json", "stacked_names/name/0/meta.json", "stacked_names/name/2/meta.json"}) {
    INFO(file);
    CHECK(json(out / file) == json(dir + file));
  }
  const AnyTensorDict again = load_memmap(out / "stacked_names");
  CHECK(again.non_tensor({"name"}) == stacked.non_tensor({"name"}));
  CHECK(load_memmap(out / "strings_and_ints").get_non_tensor<std::string>("nested", "label") == "inner");

  // memmap_like keeps the values; a value meta.json cannot hold is refused before anything is written.
  CHECK(memmap_like(stacked, out / "like").non_tensor({"name"}) == stacked.non_tensor({"name"}));
  AnyTensorDict bad({2});
  bad.set_non_tensor({"x"}, std::string("\xff"));
  CHECK_THROWS_TYPED(save_memmap(bad, out / "bad"), file_error, Contains("\"x\": a string value is not valid UTF-8"));
  CHECK_FALSE(std::filesystem::exists(out / "bad"));

  // Floats that are not finite: Python's json writes the bare words NaN, Infinity and -Infinity (no JSON has
  // them), and its loader reads them; so do ours (a folder Python wrote with NonTensorData(float('nan')) did
  // not load: "meta.json is not valid JSON").
  const std::string python = out / "python_nan";
  std::filesystem::copy(dir + "strings_and_ints", python, std::filesystem::copy_options::recursive);
  {
    std::ofstream(python + "/task/meta.json")
        << R"({"_type": "<class 'tensordict.tensorclass.NonTensorData'>", "data": NaN, "_metadata": null, "_is_non_tensor": true})";
    std::ofstream(python + "/nested/label/meta.json")
        << R"({"_type": "<class 'tensordict.tensorclass.NonTensorData'>", "data": -Infinity, "_metadata": "NaN", "_is_non_tensor": true})";
  }
  const AnyTensorDict read = load_memmap(python);
  CHECK(std::isnan(read.get_non_tensor<double>({"task"})));
  CHECK(read.get_non_tensor<double>({"nested", "label"}) == -INFINITY);
  AnyTensorDict floats({3});
  floats.set_non_tensor({"nan"}, std::nan(""));
  floats.set_non_tensor({"inf"}, NonTensor::stack({INFINITY, -INFINITY, 0.5}, {3}));
  floats.set_non_tensor({"text"}, "NaN, Infinity");  // in a string: text
  save_memmap(floats, out / "floats");
  CHECK_THAT(file_bytes(out / "floats/nan/meta.json"), Contains("\"data\":NaN,"));
  CHECK_THAT(file_bytes(out / "floats/inf/meta.json"), Contains("\"data\":[Infinity,-Infinity,0.5]"));
  const AnyTensorDict again_floats = load_memmap(out / "floats");
  CHECK(std::isnan(again_floats.get_non_tensor<double>({"nan"})));
  CHECK(again_floats.non_tensor({"inf"}) == floats.non_tensor({"inf"}));
  CHECK(again_floats.get_non_tensor<std::string>({"text"}) == "NaN, Infinity");
  // The other formats hold tensors only: refused, not left out.
  CHECK_THROWS_TYPED(save(td, out / "td.pt"), file_error,
                     Contains("\"task\" holds non-tensor data (NonTensorData('reach-target')), which torch.save files"));
  CHECK_THROWS_TYPED(save_safetensors(td, out / "td.safetensors"), file_error, Contains("which safetensors files written here cannot hold"));
  CHECK_FALSE(std::filesystem::exists(out / "td.pt"));
  save(td.exclude(td.non_tensor_keys()), out / "td.pt");
}

TEST_CASE("indexed writes carry non-tensor data into a buffer, checked with the tensors", "[storage][non_tensor]") {
  AnyTensorDict sample({{"obs", at::zeros({2})}}, {});
  sample.set_non_tensor({"task"}, "none");
  AnyTensorDict buffer = zeros_like(sample, {4});  // a NonTensorData keeps its value
  CHECK(buffer.get_non_tensor<std::string>({"task"}) == "none");
  buffer.lock_();

  AnyTensorDict steps({{"obs", at::ones({2, 2})}}, {2});
  steps.set_non_tensor({"task"}, "reach");
  buffer.index_put_({Slice(1, 3)}, steps);
  CHECK(strings(buffer.non_tensor({"task"})) == std::vector<std::string>{"none", "reach", "reach", "none"});
  steps.set_non_tensor({"task"}, NonTensor::stack({"push", "pick"}, {2}));
  steps.lock_();
  buffer.update_at_(steps, {at::tensor({3, 0}, at::kLong)});
  CHECK(strings(buffer.non_tensor({"task"})) == std::vector<std::string>{"pick", "reach", "reach", "push"});
  CHECK(buffer[1].get_non_tensor<std::string>({"task"}) == "reach");

  // Checked with the tensors: a failed write changes neither.
  const NonTensor before = buffer.non_tensor({"task"});
  AnyTensorDict wrong({{"obs", at::ones({2, 3})}}, {2});
  wrong.set_non_tensor({"task"}, "lost");
  CHECK_THROWS_AS(buffer.update_at_(wrong, {Slice(0, 2)}), shape_error);
  CHECK(buffer.non_tensor({"task"}) == before);
  AnyTensorDict three({{"obs", at::ones({3, 2})}}, {3});
  three.set_non_tensor({"task"}, NonTensor::stack({"a", "b", "c"}, {3}));
  CHECK_THROWS_TYPED(buffer.update_at_(three, {Slice(0, 2)}), shape_error,
                     Contains("update_at_(\"task\"): cannot write NonTensorStack(shape=[3]") && Contains("selects [2] elements"));
  AnyTensorDict unknown({{"obs", at::ones({2, 2})}}, {2});
  unknown.set_non_tensor({"label"}, "x");
  CHECK_THROWS_TYPED(buffer.update_at_(unknown, {Slice(0, 2)}), key_error, Contains("update_at_(\"label\"): other holds non-tensor data there"));
  CHECK(buffer.non_tensor({"task"}) == before);
  CHECK(at::equal(buffer.get("obs"), at::ones({4, 2})));  // rows 1, 2, then 3, 0

  // One value written everywhere stays (or becomes) a NonTensorData; update_ replaces values in place.
  AnyTensorDict fresh = zeros_like(sample, {4});
  AnyTensorDict all_rows({{"obs", at::ones({4, 2})}}, {4});
  all_rows.set_non_tensor({"task"}, "reach");
  fresh.update_at_(all_rows, {Slice()});
  CHECK(fresh.get_non_tensor<std::string>({"task"}) == "reach");
  all_rows.set_non_tensor({"task"}, NonTensor::stack({"a", "b", "c", "d"}, {4}));
  fresh.lock_().update_(all_rows);
  CHECK(strings(fresh.non_tensor({"task"})) == std::vector<std::string>{"a", "b", "c", "d"});
  CHECK_THROWS_TYPED(fresh.update_(unknown[0].unsqueeze(0).expand({4})), key_error, Contains("update_(\"label\")"));
  AnyTensorDict scalar({{"obs", at::ones({2})}}, {});
  scalar.set_non_tensor({"task"}, "one");
  AnyTensorDict single = sample.clone();
  single.update_(scalar);
  CHECK(single.get_non_tensor<std::string>({"task"}) == "one");

  // A buffer of zero rows: an indexed write has nothing to write (it read the first of no values and crashed).
  AnyTensorDict no_rows = zeros_like(sample, {0});
  AnyTensorDict none({{"obs", at::ones({0, 2})}}, {0});
  none.set_non_tensor({"task"}, "reach");
  no_rows.update_at_(none, {Slice()});
  no_rows.index_put_({Slice()}, none);
  CHECK(no_rows.get_non_tensor<std::string>({"task"}) == "none");
  using one_task = schema<leaf<"obs">, non_tensor<"task">>;
  auto typed_rows = no_rows.to_typed<one_task>();
  typed_rows.update_at_(none.to_typed<one_task>(), {Slice()});
  typed_rows.index_put_({Slice()}, none.to_typed<one_task>());
  CHECK(typed_rows.get<"task">() == NonTensor(std::string("none")));
}

// A buffer written through to its folder: memory and files never disagree. A non-tensor value
// cannot change by an indexed write there (its meta.json would keep the old value; Python
// refuses it too), and save_memmap onto the folder its leaves map is refused (the folder
// would be swapped while the leaves kept writing into the old files).
TEST_CASE("memmap buffers: non-tensor writes and a save onto the buffer's own folder are refused", "[storage][non_tensor]") {
  temporary_dir dir("written_through");
  AnyTensorDict sample({{"obs", at::zeros({4, 2})}}, {4});
  sample.set_non_tensor({"task"}, "none");
  AnyTensorDict buffer = memmap_like(sample, dir / "buffer");
  AnyTensorDict steps({{"obs", at::ones({2, 2})}}, {2});
  steps.set_non_tensor({"task"}, "reach");
  CHECK_THROWS_TYPED(buffer.index_put_({Slice(1, 3)}, steps), value_error,
                     Contains("TensorDict.index_put_(\"task\"): cannot write NonTensorData('reach') over NonTensorData('none')") &&
                         Contains("write through to " + std::filesystem::weakly_canonical(dir / "buffer").string()));
  CHECK_THROWS_TYPED(buffer.update_at_(steps, {Slice(1, 3)}), value_error, Contains("TensorDict.update_at_(\"task\")"));
  CHECK_THROWS_AS(buffer.index({Slice(0, 2)}).update_at_(steps, {Slice()}), value_error);  // a view of the buffer maps the files too
  CHECK(buffer.get("obs").count_nonzero().item<std::int64_t>() == 0);  // checked before the tensors were written
  CHECK(load_memmap(dir / "buffer").get_non_tensor<std::string>({"task"}) == "none");
  // The same value writes the tensors; a copy is memory alone.
  steps.set_non_tensor({"task"}, "none");
  buffer.index_put_({Slice(1, 3)}, steps);
  CHECK(load_memmap(dir / "buffer").get("obs").sum().item<float>() == 4);
  steps.set_non_tensor({"task"}, "reach");
  AnyTensorDict copy = buffer.clone();
  copy.index_put_({Slice(1, 3)}, steps);
  CHECK(copy[1].get_non_tensor<std::string>({"task"}) == "reach");
  // Typed, the same.
  using one_task = schema<leaf<"obs">, non_tensor<"task">>;
  auto typed = load_memmap<one_task>(dir / "buffer", {.memory = load_memory::shared});
  CHECK_THROWS_TYPED(typed.index_put_({Slice(0, 2)}, steps.to_typed<one_task>()), value_error,
                     Contains("TensorDict.index_put_(\"task\"): cannot write NonTensorData('reach')"));

  // save_memmap onto the buffer's own folder (or a folder above it) is refused and leaves the files mapped.
  CHECK_THROWS_TYPED(save_memmap(buffer, dir / "buffer"), file_error,
                     Contains("the leaf \"obs\" writes through to") && Contains("Save to another folder"));
  CHECK_THROWS_AS(save_memmap(buffer, dir.path.string()), file_error);
  buffer.set_at_({"obs"}, at::full({2}, 5.0), {3});
  CHECK(load_memmap(dir / "buffer").get("obs")[3].sum().item<float>() == 10);  // writes still reach the files
  save_memmap(buffer, dir / "saved");  // elsewhere: a snapshot
  CHECK(load_memmap(dir / "saved").get("obs")[3].sum().item<float>() == 10);
  save_memmap(load_memmap(dir / "saved"), dir / "saved");  // a private mapping replaces its own folder as before
}

TEST_CASE("typed TensorDict: non_tensor<...> fields beside the leaves, through every verb", "[storage][non_tensor]") {
  using step = schema<leaf<"obs">, non_tensor<"task">, node<"next", leaf<"obs">, non_tensor<"name">>>;
  TensorDict<step> td(std::vector<std::int64_t>{3});
  td.set<"obs">(rows(3, 2)).set<"task">(std::string("reach")).set<"next", "obs">(rows(3, 2) + 10);
  td.set<"next", "name">(NonTensor::stack({"a", "b", "c"}, {3}));
  CHECK(td.get<"task">() == NonTensor(std::string("reach")));
  CHECK(std::get<std::string>(td.get_non_tensor<"task">()) == "reach");
  CHECK_THROWS_TYPED((td.get_non_tensor<"next", "name">()), value_error,
                     Contains("TensorDict.get_non_tensor((\"next\", \"name\")): it holds one value per batch element"));
  CHECK(td.keys().size() == 2);  // the leaves only, as values() and the arithmetic see them
  CHECK(td.non_tensor_keys().size() == 2);
  CHECK(to_string(td.non_tensor_keys()[1]) == "(\"next\", \"name\")");
  CHECK(td.repr() == "TensorDict(batch_size=[3], fields={next: {name: NonTensorStack(shape=[3], ['a', 'b', 'c']), obs: f32[3,2]}, "
                     "obs: f32[3,2], task: NonTensorData('reach')})");
  CHECK_THROWS_TYPED((td.set<"next", "name">(NonTensor::stack({"x", "y"}, {2}))), shape_error,
                     Contains("NonTensorStack(shape=[2], ['x', 'y']) has one value per element of [2]") && Contains("batch_size=[3]"));
  TensorDict<step> unset(std::vector<std::int64_t>{3});
  CHECK_THROWS_TYPED(unset.get<"task">(), key_error, Contains("the non-tensor field \"task\" is not set"));
  CHECK(unset.repr() == "TensorDict(batch_size=[3], fields={next: {}})");
  TensorDict<step> locked = td.clone().lock_();
  CHECK_THROWS_AS(locked.set<"task">(std::string("push")), lock_error);

  // Verbs that move the batch dims move a NonTensorStack's values; a NonTensorData keeps its value.
  CHECK(td[1].get<"next", "name">() == NonTensor(std::string("b")));
  CHECK(strings(td.index({at::tensor({2, 0}, at::kLong)}).get<"next", "name">()) == std::vector<std::string>{"c", "a"});
  CHECK(strings(td.unsqueeze(0).expand({2, 3}).get<"next", "name">()) == std::vector<std::string>{"a", "b", "c", "a", "b", "c"});
  CHECK(td.unbind(0)[2].get<"task">() == NonTensor(std::string("reach")));
  const TensorDict<step> doubled = (td * 2).clone();
  CHECK(doubled.get<"next", "name">() == td.get<"next", "name">());
  CHECK_THROWS_TYPED(td.sum(), value_error, Contains("(\"next\", \"name\") holds one value per batch element"));
  CHECK(td.exclude<"next">().sum().get<"task">() == NonTensor(std::string("reach")));

  // stack and cat join them as AnyTensorDict does; select, exclude, rename_key, flatten_keys, unflatten_keys keep them.
  TensorDict<step> other = td.clone();
  other.set<"task">(std::string("push"));
  const TensorDict<step> stacked = stack({td, other});
  CHECK(strings(stacked.get<"task">()) == std::vector<std::string>{"reach", "reach", "reach", "push", "push", "push"});
  CHECK(strings(stacked.get<"next", "name">()) == std::vector<std::string>{"a", "b", "c", "a", "b", "c"});
  CHECK(stack({td, td}).get<"task">() == NonTensor(std::string("reach")));
  CHECK(strings(cat({td.index({Slice(0, 1)}), other.index({Slice(2, 3)})}).get<"task">()) == std::vector<std::string>{"reach", "push"});
  TensorDict<step> untasked(std::vector<std::int64_t>{3});
  untasked.set<"obs">(rows(3, 2)).set<"next", "obs">(rows(3, 2)).set<"next", "name">(td.get<"next", "name">());
  CHECK_THROWS_TYPED(stack({td, untasked}), key_error, Contains("the non-tensor field \"task\" is set in TensorDict 0 but not in TensorDict 1"));
  CHECK(td.select<"next">().get<"next", "name">() == td.get<"next", "name">());
  CHECK(td.exclude<"obs">().get<"task">() == td.get<"task">());
  CHECK(td.rename_key<"task", "goal">().get<"goal">() == td.get<"task">());
  CHECK(td.flatten_keys().get<"next.name">() == td.get<"next", "name">());
  CHECK(td.flatten_keys().unflatten_keys().get<"next", "name">() == td.get<"next", "name">());

  // To and from AnyTensorDict, both ways; a schema without the field refuses it, naming it.
  const AnyTensorDict any(td);
  CHECK(any.non_tensor({"next", "name"}) == td.get<"next", "name">());
  CHECK(any.to_typed<step>().get<"task">() == td.get<"task">());
  CHECK(any.to_typed<step>().get<"next", "name">() == td.get<"next", "name">());
  CHECK_THROWS_TYPED((any.to_typed<schema<leaf<"obs">, node<"next", leaf<"obs">, non_tensor<"name">>>>()), key_error,
                     Contains("\"task\": non-tensor data (NonTensorData('reach')), which the schema has no non_tensor<...> field for"));
  // A nested level holding only a NonTensorStack, with a batch dim of its own beyond its parent's, both ways.
  using tagged = schema<leaf<"obs">, field<"tags", schema<non_tensor<"name">>>>;
  TensorDict<tagged> with_tags(std::vector<std::int64_t>{2});
  with_tags.set<"obs">(rows(2, 2));
  TensorDict<schema<non_tensor<"name">>> tags(std::vector<std::int64_t>{2, 3});
  tags.set<"name">(NonTensor::stack({"a", "b", "c", "d", "e", "f"}, {2, 3}));
  with_tags.set<"tags">(tags);
  const AnyTensorDict any_tags(with_tags);
  CHECK(any_tags.get_tensordict("tags").batch_size() == c10::IntArrayRef{2, 3});
  CHECK(any_tags.non_tensor({"tags", "name"}) == tags.get<"name">());
  const TensorDict<tagged> back = any_tags.to_typed<tagged>();
  CHECK(back.get<"tags">().batch_size() == c10::IntArrayRef{2, 3});
  CHECK(back.get<"tags", "name">() == tags.get<"name">());
  CHECK(strings(back[1].get<"tags", "name">()) == std::vector<std::string>{"d", "e", "f"});
  const AnyTensorDict without_task(td.exclude<"task">());
  CHECK_THROWS_TYPED(without_task.to_typed<step>(), key_error, Contains("\"task\": missing"));
  CHECK(without_task.to_typed<step>({.allow_missing = true}).non_tensor_keys().size() == 1);

  // update, update_ and update_at_ write them (checked first: a failed write changes nothing), also when locked.
  TensorDict<step> buffer = zeros_like(td.index({0}), std::vector<std::int64_t>{4});  // NonTensorData kept, as in AnyTensorDict
  CHECK(buffer.get<"next", "name">() == NonTensor(std::string("a")));
  buffer.lock_();
  using row = schema<leaf<"obs">, non_tensor<"task">>;
  TensorDict<row> steps(std::vector<std::int64_t>{2});
  steps.set<"obs">(at::ones({2, 2})).set<"task">(NonTensor::stack({"push", "pick"}, {2}));
  buffer.update_at_(steps, {at::tensor({3, 0}, at::kLong)});
  CHECK(strings(buffer.get<"task">()) == std::vector<std::string>{"pick", "reach", "reach", "push"});
  CHECK(at::equal(buffer.get<"obs">()[3], at::ones({2})));
  const NonTensor before = buffer.get<"task">();
  TensorDict<row> three(std::vector<std::int64_t>{3});
  three.set<"obs">(at::ones({3, 2})).set<"task">(NonTensor::stack({"a", "b", "c"}, {3}));
  CHECK_THROWS_TYPED(buffer.update_at_(three, {Slice(0, 2)}), shape_error,
                     Contains("update_at_(\"task\"): cannot write NonTensorStack(shape=[3]") && Contains("selects [2] elements"));
  TensorDict<row> wrong(std::vector<std::int64_t>{2});
  wrong.set<"obs">(at::ones({2, 3})).set<"task">(std::string("lost"));
  CHECK_THROWS_AS(buffer.update_at_(wrong, {Slice(0, 2)}), shape_error);
  CHECK(buffer.get<"task">() == before);
  CHECK(at::equal(buffer.get<"obs">()[1], at::zeros({2})));

  // One value written over every row stays a NonTensorData; update_ writes in place, update replaces.
  TensorDict<step> fresh = zeros_like(td.index({0}), std::vector<std::int64_t>{4});
  TensorDict<row> all_rows(std::vector<std::int64_t>{4});
  all_rows.set<"obs">(at::ones({4, 2})).set<"task">(std::string("push"));
  fresh.update_at_(all_rows, {Slice()});
  CHECK(fresh.get<"task">() == NonTensor(std::string("push")));
  all_rows.set<"task">(NonTensor::stack({"a", "b", "c", "d"}, {4}));
  fresh.lock_().update_(all_rows);
  CHECK(strings(fresh.get<"task">()) == std::vector<std::string>{"a", "b", "c", "d"});
  using task_only = schema<non_tensor<"task">>;
  TensorDict<task_only> label(std::vector<std::int64_t>{4});
  label.set<"task">(std::string("z"));
  CHECK_THROWS_AS(fresh.update(label), lock_error);
  fresh.unlock_().update(label);
  CHECK(fresh.get<"task">() == NonTensor(std::string("z")));
  TensorDict<task_only> three_labels(std::vector<std::int64_t>{3});
  three_labels.set<"task">(std::string("x"));
  CHECK_THROWS_TYPED(unset.update_(three_labels), key_error, Contains("update_(\"task\"): the non-tensor field is not set here"));

  // A typed buffer with non-tensor fields goes to a memmap directory and back.
  temporary_dir out("typed_non_tensor_memmap");
  save_memmap(stacked, out / "stacked");
  const TensorDict<step> loaded = load_memmap<step>(out / "stacked");
  CHECK(loaded.get<"task">() == stacked.get<"task">());
  CHECK(loaded.get<"next", "name">() == stacked.get<"next", "name">());
  CHECK(at::equal(loaded.get<"next", "obs">(), stacked.get<"next", "obs">()));
}
