// Files shared with Python. The fixtures in tests/data are made by
// tests/data/make_fixtures.py; their tensors hold value(shape, scale) =
// arange(numel).reshape(shape) * scale, computed here again.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "catch_torch.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>

#include <tensordict/files.hpp>
#include <tensordict/functional.hpp>

using namespace tensordict;
using test::Contains;

namespace {
std::string fixture(const std::string& name) { return std::string(TENSORDICT_TEST_DATA) + "/" + name; }

at::Tensor value(c10::IntArrayRef shape, double scale = 0.5, at::ScalarType dtype = at::kFloat) {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return (at::arange(n, at::kDouble) * scale).reshape(shape).to(dtype);
}

std::string temporary(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("tensordict_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

bool same_storage(const at::Tensor& a, const at::Tensor& b) {
  return a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl();
}

// A load that either succeeds or throws file_error; anything else fails the test.
bool loads(std::string_view bytes) {
  try {
    (void)load_from_string(bytes);
    return true;
  } catch (const file_error&) {
    return false;
  }
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
}  // namespace

TEST_CASE("load: a state_dict() (an OrderedDict, which torch::pickle_load rejects)", "[files]") {
  const std::string by = GENERATE(as<std::string>{}, "", "torch-2.6/");  // Python torch 1.13, 2.6
  auto sd = load(fixture(by + "state_dict.pt"));
  CHECK(sd.names() == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  CHECK(sd.get("0.weight").equal(value({4, 3}, 0.1)));
  CHECK(at::allclose(sd.get("0.bias"), value({4}, 0.2)));
  CHECK(at::allclose(sd.get("2.weight"), value({2, 4}, 0.1 * 3)));
  CHECK(at::allclose(sd.get("2.bias"), value({2}, 0.4)));
  CHECK_FALSE(sd.get("0.weight").requires_grad());
  auto nested = sd.unflatten_keys();
  CHECK(nested.get("2", "bias").sizes() == c10::IntArrayRef{2});
}

TEST_CASE("load: pickle protocol 4 (torch.save(..., pickle_protocol=4))", "[files]") {
  const std::string by = GENERATE(as<std::string>{}, "", "torch-2.6/");  // Python torch 1.13, 2.6
  auto v4 = load(fixture(by + "state_dict_protocol4.pt"));
  auto v2 = load(fixture(by + "state_dict.pt"));
  CHECK(v4.keys() == v2.keys());
  CHECK((v4 == v2).all());
}

TEST_CASE("load: a one-entry dict (SETITEM, which torch::pickle_load rejects)", "[files]") {
  const std::string by = GENERATE(as<std::string>{}, "", "torch-2.6/");  // Python torch 1.13, 2.6
  auto td = load(fixture(by + "one_entry.pt"));
  CHECK(td.keys() == std::vector<any_key_path>{{"weight"}});
  CHECK(td.get("weight").equal(value({2, 3})));
}

TEST_CASE("load: nested dicts and dtypes", "[files]") {
  const std::string by = GENERATE(as<std::string>{}, "", "torch-2.6/");  // Python torch 1.13, 2.6
  auto td = load(fixture(by + "nested.pt"));
  CHECK(td.get("0", "weight").equal(value({4, 3})));
  CHECK(td.get("0", "bias").scalar_type() == at::kDouble);
  CHECK(td.get("0", "bias").equal(value({4}, 1.0, at::kDouble)));
  CHECK(td.get("counts", "steps").dim() == 0);
  CHECK(td.get("counts", "steps").item<std::int64_t>() == 7);
  CHECK(td.get("counts", "mask").equal(at::tensor({1, 0, 1}).to(at::kBool)));
  CHECK(td.get("half").scalar_type() == at::kHalf);
  CHECK(td.get("half").equal(value({2, 2}, 0.25, at::kHalf)));
  CHECK(td.repr() ==
        "TensorDict(batch_size=[], fields={0: {bias: f64[4], weight: f32[4,3]}, counts: {mask: bool[3], steps: i64[]}, "
        "half: f16[2,2]})");
}

TEST_CASE("load: bfloat16 and the other dtypes, as Python torch 2.6 writes them", "[files]") {
  auto td = load(fixture("torch-2.6/dtypes.pt"));
  CHECK(td.get("bf16").scalar_type() == at::kBFloat16);
  CHECK(td.get("bf16").equal(value({2, 3}, 0.5, at::kBFloat16)));
  CHECK(td.get("f16").equal(value({3}, 0.25, at::kHalf)));
  CHECK(td.get("f64").equal(value({2, 2}, 0.1, at::kDouble)));
  CHECK(td.get("i8").equal(value({4}, 1.0, at::kChar)));
  CHECK(td.get("u8").equal(value({4}, 2.0, at::kByte)));
  CHECK(td.get("i32").equal(value({2}, 3.0, at::kInt)));
  CHECK(td.get("b").equal(at::tensor({1, 0}).to(at::kBool)));
}

TEST_CASE("load: nn.Parameters keep requires_grad", "[files]") {
  const std::string by = GENERATE(as<std::string>{}, "", "torch-2.6/");  // Python torch 1.13, 2.6
  auto td = load(fixture(by + "parameters.pt"));
  CHECK(td.leaf_count() == 4);
  for (const auto& t : td.values()) CHECK(t.requires_grad());
}

TEST_CASE("load: tensors that share a storage in the file share one after loading", "[files]") {
  const std::string by = GENERATE(as<std::string>{}, "", "torch-2.6/");  // Python torch 1.13, 2.6
  auto td = load(fixture(by + "shared.pt"));
  const at::Tensor base = value({3, 4});
  CHECK(td.get("a").equal(base));
  CHECK(td.get("row").equal(base[1]));
  CHECK(td.get("t").equal(base.t()));
  CHECK(same_storage(td.get("a"), td.get("tied")));
  CHECK(same_storage(td.get("a"), td.get("row")));
  CHECK(same_storage(td.get("a"), td.get("t")));
  td.get("a").zero_();
  CHECK(td.get("row").eq(0).all().item<bool>());
}

TEST_CASE("load: a value that is not a tensor is named, or left out on request", "[files]") {
  const std::string by = GENERATE(as<std::string>{}, "", "torch-2.6/");  // Python torch 1.13, 2.6
  CHECK_THROWS_AS(load(fixture(by + "checkpoint.pt")), file_error);
  CHECK_THROWS_WITH(load(fixture(by + "checkpoint.pt")), Contains("checkpoint.pt") && Contains("\"epoch\" holds a Python int") &&
                                                        Contains("skip_non_tensors"));
  auto td = load(fixture(by + "checkpoint.pt"), {.skip_non_tensors = true});
  CHECK(td.names() == std::vector<std::string>{"model"});
  CHECK(td.get("model", "0.weight").equal(value({4, 3}, 0.1)));
}

TEST_CASE("load: BatchNorm's buffers, into a typed TensorDict checked against the module", "[files]") {
  const std::string by = GENERATE(as<std::string>{}, "", "torch-2.6/");  // Python torch 1.13, 2.6
  torch::nn::BatchNorm1d bn(3);
  auto typed = load(fixture(by + "batchnorm.pt"), from_module(bn));
  CHECK(typed.get<"running_var">().equal(at::ones({3})));
  CHECK(typed.get<"num_batches_tracked">().scalar_type() == at::kLong);

  torch::nn::BatchNorm1d wider(4);
  try {
    (void)load(fixture(by + "batchnorm.pt"), from_module(wider));
    FAIL("expected key_error");
  } catch (const key_error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Contains("\"weight\": expected f32[4], got f32[3]"));
    CHECK_THAT(msg, Contains("\"running_mean\": expected f32[4], got f32[3]"));
  }
}

TEST_CASE("load: a state_dict into the typed schema of the same model", "[files]") {
  const std::string by = GENERATE(as<std::string>{}, "", "torch-2.6/");  // Python torch 1.13, 2.6
  using net_t = nn::Sequential<torch::nn::Linear, torch::nn::ReLU, torch::nn::Linear>;
  net_t net(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
  auto params = load(fixture(by + "state_dict.pt"), from_module(net));  // flat keys, unflattened for the schema
  CHECK(params.get<"0", "weight">().equal(value({4, 3}, 0.1)));
  auto loose = load<nn::schema_of<net_t::Impl>>(fixture(by + "state_dict.pt"));
  CHECK(loose.get<"2", "bias">().sizes() == c10::IntArrayRef{2});
  using wrong = schema<leaf<"weight">>;
  CHECK_THROWS_WITH(load<wrong>(fixture(by + "state_dict.pt")), Contains("\"0.weight\": not a leaf of the schema"));
}

TEST_CASE("save: round trips, nested and flat", "[files]") {
  AnyTensorDict td;
  td.set("0", "weight", at::randn({4, 3}));
  td.set("0", "bias", at::randn({4}).to(at::kDouble));
  td.set("steps", at::tensor(5, at::kLong));
  td.set("mask", at::tensor({1, 0}).to(at::kBool));
  td.set("strided", at::randn({5, 6}).t());
  td.set("empty", at::randn({0, 3}));
  td.set("param", at::randn({2}).requires_grad_());

  const std::string nested_path = temporary("nested.pt");
  save(td, nested_path);
  auto back = load(nested_path);
  CHECK(back.keys() == td.keys());
  CHECK((back == td).all());
  for (const auto& [path, t] : td.items()) {
    CHECK(back.get(path).scalar_type() == t.scalar_type());
    CHECK(back.get(path).sizes() == t.sizes());
    CHECK(back.get(path).requires_grad() == t.requires_grad());
  }

  const std::string flat_path = temporary("flat.pt");
  save(td, flat_path, {.layout = file_layout::flat});
  auto flat = load(flat_path);
  CHECK(flat.names() == std::vector<std::string>{"0.weight", "0.bias", "steps", "mask", "strided", "empty", "param"});
  CHECK((flat.unflatten_keys() == td).all());
  std::remove(nested_path.c_str());
  std::remove(flat_path.c_str());
}

TEST_CASE("save: tensors that share a storage are written once and share it again", "[files]") {
  at::Tensor base = at::randn({4, 4});
  AnyTensorDict td;
  td.set("a", base);
  td.set("tied", base);
  td.set("col", base.select(1, 2));
  td.set("as_int", base.view(at::kInt));  // the same bytes as another dtype: its own copy
  const std::string bytes = save_to_string(td);
  auto back = load_from_string(bytes);
  CHECK(same_storage(back.get("a"), back.get("tied")));
  CHECK(same_storage(back.get("a"), back.get("col")));
  CHECK_FALSE(same_storage(back.get("a"), back.get("as_int")));
  CHECK(back.get("col").equal(base.select(1, 2)));
  CHECK(back.get("as_int").equal(base.view(at::kInt)));
  CHECK(bytes.size() < 2 * 64 * 4 + 2048);  // base once, as_int once, plus headers
}

TEST_CASE("save: a typed TensorDict, and a failed save leaves the old file", "[files]") {
  torch::nn::Linear linear(3, 2);
  const std::string path = temporary("linear.pt");
  save(from_module(linear), path);
  auto back = load(path, from_module(linear));
  CHECK(back.get<"weight">().equal(linear->weight));
  const std::string before = bytes_of(path);

  AnyTensorDict bad;
  bad.set("ok", at::ones({2}));
  bad.set("unsupported", at::empty({2}, at::kComplexHalf));
  CHECK_THROWS_WITH(save(bad, path), Contains("\"unsupported\" has dtype ComplexHalf"));
  CHECK(bytes_of(path) == before);
  CHECK_THROWS_WITH(save(bad, "/nonexistent-dir/x.pt"), Contains("/nonexistent-dir/x.pt"));
  std::remove(path.c_str());
}

TEST_CASE("load: files that are not torch.save dicts throw file_error", "[files]") {
  CHECK_THROWS_WITH(load(fixture("legacy.pt")), Contains("legacy format"));
  CHECK_THROWS_WITH(load(fixture("torch-2.6/legacy.pt")), Contains("legacy format"));
  CHECK_THROWS_WITH(load(fixture("does_not_exist.pt")), Contains("does_not_exist.pt") && Contains("cannot open"));
  // Issue 12, defect 5: a directory threw std::ios_base::failure without the path.
  CHECK_THROWS_AS(load(fixture("torch-2.6")), file_error);
  CHECK_THROWS_WITH(load(fixture("torch-2.6")), Contains("torch-2.6") && Contains("is a directory"));
  CHECK_THROWS_WITH(load_from_string("hello"), Contains("too short for a zip archive"));
  CHECK_THROWS_WITH(load_from_string(std::string(100, 'x')), Contains("no zip end record"));

  // A pickle whose root is a list, in a well-formed archive.
  tensordict::detail::archive::zip_writer zip;
  zip.add("archive/data.pkl", std::string("\x80\x02]q\x00.", 6));
  zip.add("archive/version", "3\n");
  CHECK_THROWS_WITH(load_from_string(std::move(zip).finish()), Contains("holds list, not a dict"));
}

TEST_CASE("load: every truncation of a file throws file_error", "[files]") {
  const std::string by = GENERATE(as<std::string>{}, "", "torch-2.6/");  // Python torch 1.13, 2.6
  const std::string bytes = bytes_of(fixture(by + "nested.pt"));
  REQUIRE(loads(bytes));
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    INFO("truncated to " << n << " bytes");
    CHECK_FALSE(loads(std::string_view(bytes).substr(0, n)));
  }
}

TEST_CASE("load: corrupted bytes throw file_error or load, never crash", "[files]") {
  const std::string by = GENERATE(as<std::string>{}, "", "torch-2.6/");  // Python torch 1.13, 2.6
  const std::string original = bytes_of(fixture(by + "state_dict.pt"));
  std::mt19937 rng(1234);
  std::size_t refused = 0, trials = 0;
  // torch.save pads each record to 64 bytes with 'Z's in its zip header's extra field.
  auto padding = [&](std::size_t pos) {
    return original[pos] == 'Z' && ((pos > 0 && original[pos - 1] == 'Z') || (pos + 1 < original.size() && original[pos + 1] == 'Z'));
  };
  for (std::size_t pos = 0; pos < original.size(); pos += 3) {
    if (padding(pos)) continue;
    std::string bytes = original;
    bytes[pos] = static_cast<char>(bytes[pos] ^ (1 + rng() % 255));
    refused += !loads(bytes);
    ++trials;
  }
  // Most single-byte changes are caught (CRC-32 on every record, checked headers); changes to padding are harmless
  // and not counted.
  CHECK(refused > trials / 2);

  // A record whose bytes change is refused by its CRC.
  for (const auto& entry : tensordict::detail::archive::zip_entries(original)) {
    std::string flipped = original;
    flipped[entry.offset + entry.size / 2] ^= 0x01;
    INFO(entry.name);
    CHECK_THROWS_WITH(load_from_string(flipped), Contains("\"" + entry.name + "\" is corrupted"));
  }
}

// Written for tests/data/check_python_reads.py (run when Python has torch); hidden from the default run.
TEST_CASE("files for Python", "[.python_interop]") {
  const char* dir = std::getenv("TENSORDICT_OUT");
  REQUIRE(dir);
  AnyTensorDict td;
  td.set("0", "weight", value({4, 3}));
  td.set("0", "bias", value({4}, 1.0, at::kDouble));
  td.set("steps", at::tensor(7, at::kLong));
  td.set("t", value({3, 5}).t());
  td.set("tied", td.get("0", "weight"));
  td.set("one", "entry", value({2}));
  save(td, std::string(dir) + "/nested.pt");
  save(td, std::string(dir) + "/flat.pt", {.layout = file_layout::flat});
}
