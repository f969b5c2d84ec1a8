// Files shared with Python. The fixtures in tests/data are made by
// tests/data/make_fixtures.py; their tensors hold value(shape, scale) =
// arange(numel).reshape(shape) * scale, computed here again.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "catch_torch.hpp"
#include "test_helpers.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>

#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>

#include <tensordict/files/torch_save.hpp>
#include <tensordict/functional.hpp>
#include <tensordict/files/memmap.hpp>
#include <tensordict/files/safetensors.hpp>
#include <tensordict/files/consolidated.hpp>
#include <tensordict/files/detail/zip_reader.hpp>  // archive::zip_entries: a .tdz's members

using namespace tensordict;
using test::Contains;
using test::debris;
using test::temporary;
using test::temporary_dir;

namespace {
std::string fixture(const std::string& name) { return test::test_data(name); }

at::Tensor value(c10::IntArrayRef shape, double scale = 0.5, at::ScalarType dtype = at::kFloat) {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return (at::arange(n, at::kDouble) * scale).reshape(shape).to(dtype);
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

void write_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <class Load>
bool refuses_cleanly(Load&& load) {
  try {
    load();
    return false;
  } catch (const file_error&) {
    return true;
  }
}
}  // namespace

TEST_CASE("load: a state_dict() (an OrderedDict, which torch::pickle_load rejects)", "[files]") {
  const std::string by = GENERATE(as<std::string>{}, "", "torch-2.6/");  // Python torch 1.13, 2.6
  auto sd = load(fixture(by + "state_dict.pt"));
  CHECK(sd.level_keys() == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
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
  CHECK(td.level_keys() == std::vector<std::string>{"model"});
  CHECK(td.get("model", "0.weight").equal(value({4, 3}, 0.1)));
}

namespace {
// A torch.save pickle written opcode by opcode, for the state_dict() layouts
// of Python tensordict releases (this machine has no Python tensordict).
struct pickle_writer {
  std::string bytes = "\x80\x02";
  pickle_writer& global(const std::string& module, const std::string& name) { return raw("c" + module + "\n" + name + "\n"); }
  pickle_writer& str(const std::string& s) {
    bytes += 'X';
    for (int i = 0; i < 4; ++i) bytes += static_cast<char>((s.size() >> (8 * i)) & 0xFF);
    bytes += s;
    return *this;
  }
  pickle_writer& small_int(int v) { return raw(std::string("K") + static_cast<char>(v)); }
  pickle_writer& ints(std::initializer_list<int> values) {
    raw("(");
    for (int v : values) small_int(v);
    return raw("t");
  }
  pickle_writer& torch_size(std::initializer_list<int> values) { return global("torch", "Size").ints(values).raw("\x85R"); }
  // A float tensor of `sizes`, contiguous, over its own storage `key` of `numel` elements.
  pickle_writer& tensor(const std::string& key, int numel, std::initializer_list<int> sizes, std::initializer_list<int> strides) {
    global("torch._utils", "_rebuild_tensor_v2").raw("((").str("storage").global("torch", "FloatStorage").str(key).str("cpu");
    small_int(numel).raw("tQ").small_int(0).ints(sizes).ints(strides);
    return raw("\x89)tR");
  }
  pickle_writer& raw(const std::string& s) {
    bytes += s;
    return *this;
  }
};

// The archive of `pickle` with float storages "0", "1", ... of `numels` elements.
std::string torch_save_archive(const std::string& pickle, std::initializer_list<int> numels) {
  std::string zip;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, std::size_t n) {
    zip.append(static_cast<const char*>(bytes), n);
    return n;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  int key = 0;
  for (int numel : numels) {
    const std::vector<float> data(static_cast<std::size_t>(numel), 1.5f);
    writer.writeRecord("data/" + std::to_string(key++), data.data(), data.size() * sizeof(float));
  }
  writer.writeEndOfFile();
  return zip;
}
}  // namespace

TEST_CASE("load: a Python TensorDict's state_dict() is that TensorDict, with its batch sizes", "[files]") {
  // 0.12+: flat keys; _metadata names each TensorDict ("" the root) with its batch size.
  auto flat = [](bool with_sub) {
    pickle_writer p;
    p.global("collections", "OrderedDict").raw(")R(");
    p.str("a.b").tensor("0", 2, {2}, {1});
    p.str("sub.x").tensor("1", 6, {2, 3}, {3, 1});
    p.raw("u}").str("_metadata").raw("}");
    p.str("").raw("}(").str("batch_size").torch_size({2}).str("device").raw("Nus");
    if (with_sub) {
      p.str("sub").raw("}(").str("batch_size").torch_size({2, 3}).str("device").raw("Nus");
      p.str("sub.empty").raw("}(").str("batch_size").torch_size({2, 3, 1}).str("device").raw("Nus");
    }
    return torch_save_archive(p.raw("sb.").bytes, {2, 6});
  };
  const auto td = load_from_string(flat(true));
  CHECK(td.batch_size() == c10::IntArrayRef{2});
  CHECK((td.level_keys() == std::vector<std::string>{"a.b", "sub"}));  // "a" is no TensorDict: "a.b" stays one key
  CHECK(td.get({"a.b"}).sizes() == c10::IntArrayRef{2});
  CHECK(td.get_tensordict("sub").batch_size() == c10::IntArrayRef{2, 3});
  CHECK(td.get("sub", "x").equal(at::full({2, 3}, 1.5)));
  CHECK(td.get_tensordict("sub", "empty").empty());
  CHECK(td.get_tensordict("sub", "empty").batch_size() == c10::IntArrayRef{2, 3, 1});
  // Without "sub" recorded, "sub.x" is a key of the root as the file has it.
  CHECK((load_from_string(flat(false)).level_keys() == std::vector<std::string>{"a.b", "sub.x"}));

  // 0.7: nested dicts, each with "__batch_size" and "__device" entries.
  auto nested = [](std::initializer_list<int> root_batch, bool device_alone) {
    pickle_writer p;
    p.global("collections", "OrderedDict").raw(")R(");
    p.str("x").tensor("0", 2, {2}, {1});
    p.str("sub").global("collections", "OrderedDict").raw(")R(").str("y").tensor("1", 6, {2, 3}, {3, 1});
    p.str("__batch_size").torch_size({2, 3}).str("__device").raw("Nu");
    if (!device_alone) p.str("__batch_size").torch_size(root_batch);
    p.str("__device").raw("Nu");
    return torch_save_archive(p.raw(".").bytes, {2, 6});
  };
  const auto old = load_from_string(nested({2}, false));
  CHECK(old.batch_size() == c10::IntArrayRef{2});
  CHECK((old.level_keys() == std::vector<std::string>{"x", "sub"}));
  CHECK(old.get_tensordict("sub").batch_size() == c10::IntArrayRef{2, 3});
  CHECK(old.get("sub", "y").equal(at::full({2, 3}, 1.5)));
  // A recorded batch size the tensors do not have: the file's fault, named.
  CHECK_THROWS_AS(load_from_string(nested({3}, false)), file_error);
  CHECK_THROWS_WITH(load_from_string(nested({3}, false)), Contains("\"x\"") && Contains("recorded"));
  // A "__device" without a "__batch_size" is a value like any other.
  CHECK_THROWS_WITH(load_from_string(nested({2}, true)), Contains("__device") && Contains("None, not a tensor"));
  CHECK((load_from_string(nested({2}, true), {.skip_non_tensors = true}).level_keys() == std::vector<std::string>{"x", "sub"}));

  // A module's state_dict() has _metadata too ({"": {"version": 1}}): its dotted keys stay flat.
  pickle_writer module;
  module.global("collections", "OrderedDict").raw(")R(").str("0.weight").tensor("0", 2, {2}, {1});
  module.raw("u}").str("_metadata").raw("}").str("").raw("}").str("version").small_int(1).raw("sssb.");
  const auto flat_module = load_from_string(torch_save_archive(module.bytes, {2}));
  CHECK((flat_module.level_keys() == std::vector<std::string>{"0.weight"}));
  CHECK(flat_module.batch_size().empty());
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
  CHECK(flat.level_keys() == std::vector<std::string>{"0.weight", "0.bias", "steps", "mask", "strided", "empty", "param"});
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
  std::string zip;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, std::size_t n) {
      zip.append(static_cast<const char*>(bytes), n);
      return n;
    });
    writer.writeRecord("data.pkl", "\x80\x02]q\x00.", 6);
    writer.writeEndOfFile();
  }
  CHECK_THROWS_WITH(load_from_string(zip), Contains("holds list, not a dict"));
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

// ---- mapped loading ---------------------------------------------------------------------------

// A storage over a mapping is not resizable; at::empty's is.
bool mapped(const at::Tensor& t) { return !t.storage().resizable(); }

TEST_CASE("load: mapped, tensors point into a private mapping that they keep alive", "[files]") {
  const std::string path = temporary("mapped.pt");
  AnyTensorDict td;
  td.set("w", value({64, 32}));
  td.set("b", value({64}, 1.0, at::kDouble));
  td.set("tied", td.get("w")[3]);
  save(td, path);
  const std::string before = bytes_of(path);

  auto back = load(path, {.memory = load_memory::mapped});
  CHECK(mapped(back.get("w")));
  CHECK(same_storage(back.get("w"), back.get("tied")));
  CHECK(reinterpret_cast<std::uintptr_t>(back.get("b").data_ptr()) % 8 == 0);  // libtorch aligns records to 64 bytes
  std::remove(path.c_str());  // the mapping outlives the name
  CHECK((back == td).all());
  back.get("w").add_(1);  // copy-on-write: this process's pages only
  CHECK(back.get("tied").equal(value({64, 32})[3] + 1));

  write_bytes(path, before);
  auto again = load(path);
  CHECK(again.get("w").equal(value({64, 32})));
  CHECK(bytes_of(path) == before);

  auto owned = load(path, {.memory = load_memory::owned});
  CHECK_FALSE(mapped(owned.get("w")));
  CHECK(same_storage(owned.get("w"), owned.get("tied")));
  CHECK((owned == td).all());
  std::remove(path.c_str());
}

TEST_CASE("load: a mapped load leaves the tensor records' checksums to verify_checksums", "[files]") {
  const std::string path = temporary("flipped.pt");
  AnyTensorDict td;
  td.set("w", at::zeros({256}));
  save(td, path);
  std::string bytes = bytes_of(path);
  const auto entries = tensordict::detail::archive::zip_entries(bytes);
  const auto data = std::find_if(entries.begin(), entries.end(), [](const auto& e) { return e.name.find("/data/") != std::string::npos; });
  REQUIRE(data != entries.end());
  bytes[data->offset + 8] ^= 0x40;
  write_bytes(path, bytes);
  const load_options mapped{.memory = load_memory::mapped};
  CHECK(load(path, mapped).get("w").abs().sum().item<float>() > 0);  // read as it is, without reading the file through
  CHECK_THROWS_WITH(load(path, {.memory = load_memory::mapped, .verify_checksums = true}), Contains("is corrupted"));
  CHECK_THROWS_WITH(load(path), Contains("is corrupted"));  // owned, the default
  CHECK_THROWS_WITH(load_from_string(bytes), Contains("is corrupted"));
  std::remove(path.c_str());
}

TEST_CASE("save: libtorch's writer lifts the 65535-storage limit (zip64)", "[files]") {
  AnyTensorDict td;
  constexpr int count = 70000;
  for (int k = 0; k < count; ++k) {
    std::string key = "t";
    key += std::to_string(k);  // g++ 12 warns (falsely) on "t" + std::to_string(k)
    td.set({key}, at::full({1}, static_cast<float>(k)));
  }
  const std::string bytes = save_to_string(td);
  auto back = load_from_string(bytes);
  REQUIRE(back.leaf_count() == count);
  CHECK(back.get({"t69999"}).item<float>() == 69999.0f);
  CHECK(back.level_keys()[12345] == "t12345");
}

// ---- safetensors -----------------------------------------------------------------------------

// A safetensors file from a header's JSON and a buffer.
std::string safetensors_bytes(const std::string& header, std::string_view buffer) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  return out + header + std::string(buffer);
}

TEST_CASE("safetensors: round trip, dotted names, dtypes, metadata", "[files]") {
  AnyTensorDict td;
  td.set("0", "weight", value({4, 3}));
  td.set("0", "bias", value({4}, 1.0, at::kDouble));
  td.set("steps", at::tensor(5, at::kLong));
  td.set("mask", at::tensor({1, 0, 1}).to(at::kBool));
  td.set("half", value({3}, 0.25, at::kHalf));
  td.set("bf16", value({2, 2}, 0.5, at::kBFloat16));
  td.set("i8", value({5}, 1.0, at::kChar));
  td.set("strided", value({5, 6}).t());
  td.set("empty", at::zeros({0, 3}));
  const std::string path = temporary("round.safetensors");
  save_safetensors(td, path, {{"format", "pt"}, {"note", "made in C++"}});

  const std::string bytes = bytes_of(path);
  const auto header = tensordict::detail::safetensors::parse(bytes);
  CHECK(header.buffer_offset % 8 == 0);
  for (const auto& t : header.tensors) CHECK(t.begin % t.dtype->element_size == 0);
  CHECK(load_safetensors_metadata(path) == safetensors_metadata{{"format", "pt"}, {"note", "made in C++"}});

  auto back = load_safetensors(path, {.memory = load_memory::mapped});
  CHECK(back.get("0", "weight").equal(td.get("0", "weight")));  // "0.weight" unflattened
  for (const auto& [key, t] : td.items()) {
    INFO(to_string(key));
    CHECK(back.get(key).scalar_type() == t.scalar_type());
    CHECK(back.get(key).sizes() == t.sizes());
    CHECK(back.get(key).equal(t));
  }
  CHECK(mapped(back.get("0", "weight")));
  back.get("0", "weight").zero_();  // copy-on-write
  CHECK(bytes_of(path) == bytes);
  CHECK_FALSE(mapped(load_safetensors(path).get("0", "weight")));  // owned, the default
  CHECK((load_safetensors_from_string(bytes) == td).all());

  torch::nn::Linear linear(3, 2);
  save_safetensors(from_module(linear), path);
  auto typed = load_safetensors(path, from_module(linear));
  CHECK(typed.get<"weight">().equal(linear->weight));
  std::remove(path.c_str());
}

TEST_CASE("safetensors: files Python's safetensors wrote", "[files]") {
  auto td = load_safetensors(fixture("safetensors/python.safetensors"));
  CHECK(td.get("layers", "0", "weight").equal(value({4, 3})));
  CHECK(td.get("layers", "0", "bias").equal(value({4}, 1.0, at::kDouble)));
  CHECK(td.get("bf16").equal(value({2, 3}, 0.5, at::kBFloat16)));
  CHECK(td.get("f16").equal(value({3}, 0.25, at::kHalf)));
  CHECK(td.get("i64").equal(value({2}, 3.0, at::kLong)));
  CHECK(td.get("u8").equal(value({4}, 2.0, at::kByte)));
  CHECK(td.get("b").equal(at::tensor({1, 0}).to(at::kBool)));
  CHECK(load_safetensors_metadata(fixture("safetensors/python.safetensors")) == safetensors_metadata{{"format", "pt"}});
}

TEST_CASE("safetensors: float8 and unsigned types where this libtorch has them", "[files]") {
  const std::string path = fixture("safetensors/python_float8.safetensors");
#if TENSORDICT_TORCH_AT_LEAST(2, 1)
  auto td = load_safetensors(path);
  CHECK(td.get("e4m3").scalar_type() == at::ScalarType::Float8_e4m3fn);
  CHECK(td.get("e4m3").to(at::kFloat).equal(at::tensor({0.5f, 1.0f, -2.0f, 448.0f})));
  CHECK(td.get("e5m2").to(at::kFloat).equal(at::tensor({0.5f, 1.0f, -2.0f, 57344.0f})));
  CHECK((load_safetensors_from_string(save_safetensors_to_string(td)) == td).all());
#else
  CHECK_THROWS_WITH(load_safetensors(path), Contains("\"e4m3\" has dtype torch.float8_e4m3fn, which this libtorch (1.13"));
#endif
#if TENSORDICT_TORCH_AT_LEAST(2, 3)
  AnyTensorDict u;
  u.set("u16", at::tensor(std::vector<std::int64_t>{1, 2, 65535}).to(at::ScalarType::UInt16));
  u.set("u32", at::tensor(std::vector<std::int64_t>{7, 4000000000LL}).to(at::ScalarType::UInt32));
  const std::string bytes = save_safetensors_to_string(u);
  CHECK(bytes.find("\"U16\"") != std::string::npos);
  auto back = load_safetensors_from_string(bytes);
  CHECK(back.get("u32").scalar_type() == at::ScalarType::UInt32);
  CHECK(back.get("u32").to(at::kLong).equal(at::tensor(std::vector<std::int64_t>{7, 4000000000LL})));
#endif
}

TEST_CASE("safetensors: files that break the format's rules throw file_error", "[files]") {
  const std::string f32x2(8, '\0');
  auto refused = [](const std::string& bytes) {
    try {
      (void)load_safetensors_from_string(bytes);
    } catch (const file_error& e) {
      return std::string(e.what());
    }
    return std::string("loaded");
  };
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  REQUIRE(refused(safetensors_bytes(good, f32x2)) == "loaded");
  CHECK_THAT(refused("1234"), Contains("too short"));
  CHECK_THAT(refused(safetensors_bytes(good, f32x2).substr(0, 20)), Contains("reaches past the end"));
  std::string huge = safetensors_bytes(good, f32x2);
  huge[5] = 1;
  CHECK_THAT(refused(huge), Contains("over the format's limit"));
  CHECK_THAT(refused(safetensors_bytes("[1, 2]", "")), Contains("not a JSON object"));
  CHECK_THAT(refused(safetensors_bytes("{\"a\": ", "")), Contains("not valid JSON"));
  CHECK_THAT(refused(safetensors_bytes(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", f32x2)),
             Contains("\"a\" has the unknown dtype \"F33\""));
  CHECK_THAT(refused(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f32x2)),
             Contains("needs 12 bytes, its data_offsets span 8"));
  CHECK_THAT(refused(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", f32x2)),
             Contains("outside the buffer of 8 bytes"));
  CHECK_THAT(refused(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[2],"data_offsets":[2,10]}})",
                                       std::string(10, '\0'))),
             Contains("overlaps"));
  CHECK_THAT(refused(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f32x2)), Contains("hole of 4 bytes"));
  CHECK_THAT(refused(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f32x2)),
             Contains("4 bytes after its last tensor"));
  CHECK_THAT(refused(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f32x2)),
             Contains("names \"a\" twice"));
  CHECK_THAT(refused(safetensors_bytes(R"({"__metadata__":{"n":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f32x2)),
             Contains("metadata \"n\" is not a string"));
  CHECK_THAT(refused(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32x2)),
             Contains("not a list of non-negative integers"));
  CHECK_THAT(refused(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2]}})", f32x2)), Contains("lacks"));
  CHECK_THROWS_WITH(load_safetensors(fixture("does_not_exist.safetensors")), Contains("does_not_exist.safetensors") && Contains("cannot open"));

  // Every truncation of a good file is refused, never a crash.
  const std::string whole = bytes_of(fixture("safetensors/python.safetensors"));
  for (std::size_t n = 0; n < whole.size(); ++n) {
    INFO("truncated to " << n << " bytes");
    CHECK(refuses_cleanly([&] { (void)load_safetensors_from_string(std::string_view(whole).substr(0, n)); }));
  }

  AnyTensorDict bad;
  bad.set("c", at::zeros({2}, at::kComplexDouble));
  CHECK_THROWS_WITH(save_safetensors_to_string(bad), Contains("\"c\" has dtype ComplexDouble"));
}

// ---- tensordict memmap directories --------------------------------------------------------------

TEST_CASE("memmap: directories Python tensordict 0.4 wrote load with their keys, batch size, dtypes and values", "[files]") {
  const std::string dir = fixture("tensordict-v0.4-memmap/");
  auto mlp = load_memmap(dir + "mlp_params");
  CHECK(mlp.batch_size().empty());
  CHECK(mlp.level_keys() == std::vector<std::string>{"0", "1", "2"});
  CHECK(mlp.get_tensordict("1").empty());  // the ReLU's empty sub-TensorDict
  CHECK((mlp.flatten_keys() == load(dir + "mlp_params.expected.pt")).all());
  CHECK(mlp.get("0", "weight").sizes() == c10::IntArrayRef{4, 3});
  CHECK(mapped(mlp.get("0", "weight")));
  const std::string weight_file = bytes_of(dir + "mlp_params/0/weight.memmap");
  mlp.get("0", "weight").fill_(3);  // copy-on-write: the (read-only) fixture is not touched
  CHECK(bytes_of(dir + "mlp_params/0/weight.memmap") == weight_file);
  CHECK(load_memmap(dir + "mlp_params").get("0", "weight").equal(load(dir + "mlp_params.expected.pt").get("0.weight")));

  auto batch = load_memmap(dir + "sample_batch");
  CHECK(batch.batch_size() == c10::IntArrayRef{5});
  CHECK(batch.device() == at::Device(at::kCPU));
  const auto expected = load(dir + "sample_batch.expected.pt");
  CHECK(batch.flatten_keys().keys() == expected.keys());
  CHECK((batch.flatten_keys() == expected).all());
  CHECK(batch.get("next", "obs").scalar_type() == at::kBFloat16);
  CHECK(batch.get("action").scalar_type() == at::kLong);
  CHECK(batch.get("done").scalar_type() == at::kBool);
  CHECK(batch.get("next", "mask").scalar_type() == at::kByte);

  auto stacked = load_memmap(dir + "stacked_linear", {.memory = load_memory::owned});
  CHECK(stacked.batch_size() == c10::IntArrayRef{3});
  CHECK((stacked == load(dir + "stacked_linear.expected.pt")).all());
  CHECK_FALSE(mapped(stacked.get("weight")));

  torch::nn::Linear linear(2, 3);
  auto typed = load_memmap<nn::schema_of<torch::nn::LinearImpl>>(dir + "stacked_linear");
  CHECK(typed.get<"weight">().sizes() == c10::IntArrayRef{3, 3, 2});

  // strict = false (Python's load_state_dict(strict=False)): the schema's keys, the file's others left out;
  // a key of the schema must still fit it.
  using obs_only = schema<leaf<"obs">, node<"next", leaf<"obs">>>;
  CHECK_THROWS_WITH(load_memmap<obs_only>(dir + "sample_batch"), Contains("\"action\": not a leaf of the schema"));
  const auto part = load_memmap<obs_only>(dir + "sample_batch", {.strict = false});
  CHECK(part.get<"obs">().equal(batch.get("obs")));
  CHECK(part.get<"next", "obs">().equal(batch.get("next", "obs")));
  const TensorDict<obs_only> like({batch.get("obs"), batch.get("next", "obs")}, {5});
  CHECK(load_memmap(dir + "sample_batch", like, {.strict = false}).get<"obs">().equal(batch.get("obs")));
  const TensorDict<obs_only> wrong_shape({at::zeros({5, 9}), batch.get("next", "obs")}, {5});
  CHECK_THROWS_WITH(load_memmap(dir + "sample_batch", wrong_shape, {.strict = false}), Contains("\"obs\": expected f32[5,9]"));
  using with_missing = schema<leaf<"obs">, leaf<"not_there">>;
  const TensorDict<with_missing> missing_like({batch.get("obs"), at::zeros({5})}, {5});
  CHECK_THROWS_WITH(load_memmap(dir + "sample_batch", missing_like, {.strict = false}), Contains("\"not_there\": missing"));
}

TEST_CASE("memmap: what save_memmap writes has Python's layout and meta.json fields", "[files]") {
  const std::string from = fixture("tensordict-v0.4-memmap/sample_batch");
  temporary_dir out("memmap_layout");
  save_memmap(load_memmap(from), out / "sample_batch", {.memmap = memmap_layout::v0_4});
  for (const auto& sub : {std::string(""), std::string("/next")}) {
    std::vector<std::string> ours, theirs;
    for (const auto& e : std::filesystem::directory_iterator(out / ("sample_batch" + sub))) ours.push_back(e.path().filename());
    for (const auto& e : std::filesystem::directory_iterator(from + sub)) theirs.push_back(e.path().filename());
    std::sort(ours.begin(), ours.end());
    std::sort(theirs.begin(), theirs.end());
    CHECK(ours == theirs);
    const auto our_meta = nlohmann::ordered_json::parse(bytes_of(out / ("sample_batch" + sub + "/meta.json")));
    const auto their_meta = nlohmann::ordered_json::parse(bytes_of(from + sub + "/meta.json"));
    CHECK(our_meta == their_meta);  // the same fields, values and order
    for (const auto& name : theirs)
      if (name != "meta.json" && name != "next") CHECK(bytes_of(out / ("sample_batch" + sub + "/" + name)) == bytes_of(from + sub + "/" + name));
  }

  // Round trip with strided and shared leaves; a second save replaces the directory whole.
  AnyTensorDict td({2});
  td.set("t", value({3, 2}).t());
  td.set("tied", td.get("t"));
  td.set("empty", AnyTensorDict({2}));
  td.set("sub", "x", value({2, 4}, 1.0, at::kInt));
  save_memmap(td, out / "td");
  auto back = load_memmap(out / "td");
  CHECK(back.keys() == td.keys());
  CHECK((back == td).all());
  CHECK(back.get_tensordict("empty").empty());
  save_memmap(td, out / "new/parents/td/");  // parents made, the trailing separator ignored
  CHECK((load_memmap(out / "new/parents/td") == td).all());
  AnyTensorDict smaller({2});
  smaller.set("only", at::ones({2}));
  save_memmap(smaller, out / "td");
  CHECK(load_memmap(out / "td").keys() == std::vector<any_key_path>{{"only"}});
  CHECK_FALSE(std::filesystem::exists(out / "td/sub"));
}

TEST_CASE("memmap: bad directories throw file_error naming the file", "[files]") {
  temporary_dir dir("memmap_bad");
  AnyTensorDict td({2});
  td.set("a", at::ones({2, 3}));
  td.set("n", "b", at::ones({2}, at::kLong));
  save_memmap(td, dir / "good");
  auto broken = [&](const std::string& name, const std::string& file, const std::string& bytes) {
    std::filesystem::copy(dir / "good", dir / name, std::filesystem::copy_options::recursive);
    write_bytes(dir / (name + "/" + file), bytes);
    return dir / name;
  };
  CHECK_THROWS_WITH(load_memmap(broken("short", "a.memmap", std::string(20, '\0'))),
                    Contains("a.memmap has 20 bytes") && Contains("says torch.float32 of shape [2, 3], 24 bytes"));
  CHECK_THROWS_WITH(load_memmap(broken("json", "meta.json", "{\"a\": ")), Contains("meta.json is not valid JSON"));
  CHECK_THROWS_WITH(load_memmap(broken("dtype", "meta.json",
                                       R"({"a": {"device": "cpu", "shape": [2, 3], "dtype": "torch.float17"}, "shape": [2], "device": "cpu"})")),
                    Contains("\"a\" has the unknown dtype \"torch.float17\""));
  CHECK_THROWS_WITH(load_memmap(broken("batch", "meta.json",
                                       R"({"a": {"device": "cpu", "shape": [3, 2], "dtype": "torch.float32"}, "shape": [2], "device": "cpu"})")),
                    Contains("does not start with the batch size [2]"));
  CHECK_THROWS_WITH(load_memmap(broken("escape", "meta.json",
                                       R"({"..": {"type": "TensorDict"}, "shape": [2], "device": "cpu"})")),
                    Contains("names the TensorDict \"..\"") && Contains("%2E%2E is not a directory"));
  CHECK_THROWS_WITH(load_memmap(broken("other", "meta.json", R"({"s": {"type": "KeyedJaggedTensor"}, "shape": [2], "device": "cpu"})")),
                    Contains("\"s\" holds a KeyedJaggedTensor"));
  CHECK_THROWS_WITH(load_memmap(broken("no_value", "meta.json", R"({"s": {"type": "NonTensorData"}, "shape": [2], "device": "cpu"})")),
                    Contains("s/meta.json"));
  CHECK(load_memmap(dir / "other", {.skip_non_tensors = true}).empty());
  std::filesystem::copy(dir / "good", dir / "missing", std::filesystem::copy_options::recursive);
  std::filesystem::remove(dir / "missing/n/b.memmap");
  CHECK_THROWS_WITH(load_memmap(dir / "missing"), Contains("b.memmap") && Contains("cannot open"));
  CHECK_THROWS_WITH(load_memmap(dir / "none"), Contains("not a directory"));

  AnyTensorDict reserved;
  reserved.set("shape", at::ones({1}));
  CHECK_THROWS_WITH(save_memmap(reserved, dir / "reserved"), Contains("\"shape\": a memmap directory cannot hold this key"));
  CHECK_FALSE(std::filesystem::exists(dir / "reserved"));
  CHECK_FALSE(std::filesystem::exists(dir / "reserved.tensordict-partial"));
}

// ---- what loads and saves promise -----------------------------------------------------------

namespace {
// Python's torch.save(obj, path) rewrites a file in place: the same inode, truncated, then written.
void rewrite_in_place(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST_CASE("load and load_safetensors copy by default: a file rewritten or truncated later leaves the tensors", "[files]") {
  temporary_dir dir("owned_default");
  AnyTensorDict td;
  td.set("w", value({64, 32}));
  AnyTensorDict other;
  other.set("w", value({64, 32}, 3.0));
  for (const bool safetensors : {false, true}) {
    INFO((safetensors ? "safetensors" : "torch.save"));
    const std::string path = dir / (safetensors ? "ckpt.safetensors" : "ckpt.pt");
    auto save_any = [&](const AnyTensorDict& what) { safetensors ? save_safetensors(what, path) : save(what, path); };
    auto load_any = [&](const load_options& o) { return safetensors ? load_safetensors(path, o) : load(path, o); };
    save_any(td);
    const auto back = load_any({});
    CHECK_FALSE(mapped(back.get("w")));
    const std::string bytes_of_other = safetensors ? save_safetensors_to_string(other) : save_to_string(other);
    rewrite_in_place(path, bytes_of_other);
    CHECK(back.get("w").equal(value({64, 32})));
    std::filesystem::resize_file(path, 0);  // mapped, touching a page past the end would end the process (SIGBUS)
    CHECK(back.get("w").sum().item<double>() == value({64, 32}).sum().item<double>());
    // Mapped, the explicit choice: a rewrite in place shows through pages this process has not written.
    save_any(td);
    const auto view = load_any({.memory = load_memory::mapped});
    CHECK(mapped(view.get("w")));
    rewrite_in_place(path, bytes_of_other);
    CHECK(view.get("w").equal(value({64, 32}, 3.0)));
  }
}

TEST_CASE("save_safetensors refuses two key paths that flatten to one name, before writing", "[files]") {
  temporary_dir dir("safetensors_clash");
  AnyTensorDict td;
  td.set({"a.b"}, at::ones({2}));
  td.set("a", "b", at::zeros({3}));
  const std::string path = dir / "clash.safetensors";
  CHECK_THROWS_WITH(save_safetensors(td, path), Contains("\"a.b\" and (\"a\", \"b\") are both named \"a.b\""));
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK(debris(dir.path).empty());
  CHECK_THROWS_AS(save_safetensors_to_string(td), file_error);
}

TEST_CASE("failed saves throw file_error naming the path and the reason, and leave no debris", "[files]") {
  temporary_dir dir("failed_saves");
  AnyTensorDict bad_utf8;
  bad_utf8.set({std::string("caf\xe9")}, at::ones({2}));
  CHECK_THROWS_WITH(save_memmap(bad_utf8, dir / "latin1"), Contains("save_memmap") && Contains("not valid UTF-8"));
  CHECK_THROWS_WITH(save_safetensors(bad_utf8, dir / "latin1.safetensors"), Contains("latin1.safetensors") && Contains("not valid UTF-8"));
  CHECK_THROWS_WITH(save_safetensors(AnyTensorDict(), dir / "meta.safetensors", {{"note", "\xff"}}), Contains("not valid UTF-8"));

  AnyTensorDict long_key;
  long_key.set({std::string(300, 'k')}, at::ones({2}));
  CHECK_THROWS_WITH(save_memmap(long_key, dir / "new/parents/long"), Contains("File name too long"));
  CHECK_FALSE(std::filesystem::exists(dir / "new"));  // the folders it made are gone too
  CHECK_THROWS_WITH(save(long_key, dir / std::string(300, 'f')), Contains("File name too long"));
  // Over an existing target, a failed save leaves it as it was.
  AnyTensorDict good({2});
  good.set("x", at::ones({2}));
  save_memmap(good, dir / "existing");
  long_key.set_batch_size({2});
  CHECK_THROWS_AS(save_memmap(long_key, dir / "existing"), file_error);
  CHECK((load_memmap(dir / "existing") == good).all());
  save_safetensors(good, dir / "existing.safetensors");
  const std::string before = bytes_of(dir / "existing.safetensors");
  CHECK_THROWS_AS(save_safetensors(bad_utf8, dir / "existing.safetensors"), file_error);
  CHECK(bytes_of(dir / "existing.safetensors") == before);

  AnyTensorDict td;
  td.set("x", at::ones({2}));
  write_bytes(dir / "plain.txt", "keep me");
  CHECK_THROWS_WITH(save_memmap(td, dir / "plain.txt"), Contains("exists and is not a directory"));
  CHECK(bytes_of(dir / "plain.txt") == "keep me");
  CHECK_THROWS_WITH(save(td, dir.path.string()), Contains("is a directory"));

  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path);
  CHECK_THROWS_WITH(save_memmap(td, "."), Contains("names the current or a parent directory"));
  CHECK_THROWS_WITH(save_memmap(td, ""), Contains("the path is empty"));
  CHECK_THROWS_WITH(save(td, ""), Contains("the path is empty"));
  std::filesystem::current_path(cwd);
  CHECK(debris(dir.path).empty());
  CHECK(debris(dir.path.parent_path()).empty());
}

TEST_CASE("save_memmap writes the device Python tensordict reads back, \"None\" for none", "[files]") {
  temporary_dir dir("memmap_device");
  AnyTensorDict no_device({2}), on_cpu({2}, at::Device(at::kCPU));
  no_device.set("x", at::ones({2}));
  on_cpu.set("x", at::ones({2}));
  save_memmap(no_device, dir / "none");
  save_memmap(on_cpu, dir / "cpu");
  CHECK(nlohmann::json::parse(bytes_of(dir / "none/meta.json"))["device"] == "None");
  CHECK(nlohmann::json::parse(bytes_of(dir / "cpu/meta.json"))["device"] == "cpu");
  CHECK_FALSE(load_memmap(dir / "none").device().has_value());
  CHECK(load_memmap(dir / "cpu").device() == at::Device(at::kCPU));
}

TEST_CASE("loaders take a batch size (batch_dims); a typed load's errors name the file", "[files]") {
  temporary_dir dir("batch_dims");
  auto nets = std::vector<torch::nn::Linear>{torch::nn::Linear(3, 2), torch::nn::Linear(3, 2), torch::nn::Linear(3, 2)};
  const auto stacked = from_modules(nets).detach();
  save_safetensors(stacked, dir / "ensemble.safetensors");
  save(stacked, dir / "ensemble.pt");
  CHECK(load_safetensors(dir / "ensemble.safetensors").batch_size().empty());  // the format has none
  CHECK_THROWS_WITH(load_safetensors(dir / "ensemble.safetensors", stacked),
                    Contains("tensordict::load_safetensors(\"" + (dir / "ensemble.safetensors") + "\")") && Contains("batch_size"));
  const auto typed = load_safetensors(dir / "ensemble.safetensors", stacked, {.batch_dims = 1});
  CHECK(typed.batch_size() == c10::IntArrayRef{3});
  CHECK((typed == stacked).all());
  CHECK(load(dir / "ensemble.pt", {.batch_dims = 1}).batch_size() == c10::IntArrayRef{3});
  CHECK(load(dir / "ensemble.pt", {.batch_dims = 5}).batch_size() == c10::IntArrayRef{3, 2});  // all the leaves share
  CHECK_THROWS_WITH(load(dir / "ensemble.pt", stacked), Contains("tensordict::load(\""));
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

  AnyTensorDict st;
  st.set("0", "weight", value({4, 3}));
  st.set("0", "bias", value({4}, 1.0, at::kDouble));
  st.set("t", value({3, 5}).t());
  st.set("bf16", value({2, 3}, 0.5, at::kBFloat16));
  st.set("b", at::tensor({1, 0}).to(at::kBool));
  st.set("one", "entry", value({2}));
  save_safetensors(st, std::string(dir) + "/cpp.safetensors", {{"format", "pt"}, {"by", "tensordict-cpp"}});
}

TEST_CASE("memmap directories keep each nested level's batch size, as Python writes them", "[files][nested_batch]") {
  // Python: TensorDict({"sub": TensorDict({"x": zeros(4, 3, 2)}, [4, 3, 2]), "y": zeros(4, 3)}, [4, 3]).memmap(dir)
  temporary_dir dir("memmap_nested_batch");
  AnyTensorDict td({{"y", at::zeros({4, 3})}}, {4, 3});
  td.set("sub", AnyTensorDict({{"x", at::arange(24).reshape({4, 3, 2})}}, {4, 3, 2}));
  td.set("empty", AnyTensorDict({}, {4, 3, 7}));
  save_memmap(td, dir / "td");
  CHECK(nlohmann::json::parse(bytes_of(dir / "td/meta.json"))["shape"] == std::vector<int>{4, 3});
  CHECK(nlohmann::json::parse(bytes_of(dir / "td/sub/meta.json"))["shape"] == std::vector<int>{4, 3, 2});
  CHECK(nlohmann::json::parse(bytes_of(dir / "td/empty/meta.json"))["shape"] == std::vector<int>{4, 3, 7});
  const auto loaded = load_memmap(dir / "td");
  CHECK(loaded.batch_size() == c10::IntArrayRef{4, 3});
  CHECK(loaded.get_tensordict("sub").batch_size() == c10::IntArrayRef{4, 3, 2});
  CHECK(loaded.get_tensordict("empty").batch_size() == c10::IntArrayRef{4, 3, 7});
  CHECK(loaded.get("sub", "x").equal(td.get("sub", "x")));
  // Saved again, it is the same directory (the issue: the nested level came back [4, 3]).
  save_memmap(loaded, dir / "again");
  CHECK(bytes_of(dir / "again/sub/meta.json") == bytes_of(dir / "td/sub/meta.json"));
  // A nested level whose batch size does not extend its parent's is refused, naming the file.
  auto meta = nlohmann::json::parse(bytes_of(dir / "td/sub/meta.json"));
  meta["shape"] = {5};
  meta["x"]["shape"] = {5, 3, 2};  // consistent with the level itself
  {
    std::ofstream out(dir / "td/sub/meta.json", std::ios::trunc);
    out << meta.dump();
  }
  CHECK_THROWS_WITH(load_memmap(dir / "td"), Contains("sub/meta.json: the batch size [5] does not start with the enclosing TensorDict's [4,3]"));
}

// ---- files of Python tensordict 0.7, 0.12 and 0.14 (tests/data/tensordict-v0.7-v0.14, made by its make.py) ----

namespace {
// make.py's val(shape, dtype, off).
at::Tensor release_value(c10::IntArrayRef shape, at::ScalarType dtype, double off = 0) {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  const at::Tensor a = at::arange(n, at::kDouble) + off;
  at::Tensor r;
  if (dtype == at::kBool) r = (a.to(at::kLong).remainder(3)).eq(0);
  else if (dtype == at::kByte) r = a.to(at::kLong).remainder(251).to(at::kByte);
  else if (dtype == at::kLong || dtype == at::kInt || dtype == at::kShort || dtype == at::kChar) r = (a.to(at::kLong) - 3).to(dtype);
  else r = (a * 0.5 - 1.0).to(dtype);
  return r.reshape(shape);
}

bool same(const at::Tensor& a, const at::Tensor& b) { return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && a.equal(b); }

// make.py's nested_td(), loaded.
void check_nested(const AnyTensorDict& td) {
  CHECK(td.batch_size() == c10::IntArrayRef{4});
  CHECK(same(td.get("f32"), release_value({4, 3}, at::kFloat)));
  CHECK(same(td.get("f64"), release_value({4}, at::kDouble, 1)));
  CHECK(same(td.get("bf16"), release_value({4, 2}, at::kBFloat16, 2)));
  CHECK(same(td.get("i64"), release_value({4}, at::kLong, 3)));
  CHECK(same(td.get("bool"), release_value({4, 5}, at::kBool, 4)));
  CHECK(same(td.get("u8"), release_value({4, 2, 2}, at::kByte, 5)));
  CHECK(td.get_tensordict("sub").batch_size() == c10::IntArrayRef{4, 3});
  CHECK(same(td.get("sub", "x"), release_value({4, 3, 2}, at::kFloat, 6)));
  CHECK(td.get_tensordict("sub", "deeper").batch_size() == c10::IntArrayRef{4, 3});
  CHECK(same(td.get("sub", "deeper", "y"), release_value({4, 3}, at::kLong, 7)));
  CHECK(td.get_tensordict("empty").empty());
  CHECK(td.get_tensordict("empty").batch_size() == c10::IntArrayRef{4});
}

const std::map<std::string, std::string> odd_keys = {
    {"oddkey_dot", "a.b"},       {"oddkey_space", "with space"}, {"oddkey_pct", "pct%x"},
    {"oddkey_colon", "colon:x"}, {"oddkey_question", "q?"},       {"oddkey_unicode", "uni-\u00e9"},
    {"oddkey_dash_underscore", "a-b_c"}, {"oddkey_drive", "a:b"}, {"oddkey_backslash", "a\\b"}};
}  // namespace

TEST_CASE("every file Python tensordict 0.7.2, 0.12.4 and 0.14.0 wrote loads with its keys, batch sizes, dtypes and values, or is refused with the README's reason", "[files][python_releases]") {
  for (const std::string release : {"v0.7.2", "v0.12.4", "v0.14.0"}) {
    INFO(release);
    const std::string dir = fixture("tensordict-v0.7-v0.14/" + release + "/");
    const auto report = nlohmann::json::parse(bytes_of(dir + "python_write_report.json"));
    int checked = 0;
    for (const auto& [name, result] : report["cases"].items()) {
      INFO(name);
      if (!result["ok"].get<bool>()) continue;  // Python itself refused to write it
      const std::string path = dir + name;
      ++checked;
      if (name == "nested" || name == "nested_save" || name == "nested_device_cpu" || name == "archive.tdz") {
        check_nested(load_memmap(path));
        check_nested(load_memmap(path, {.memory = load_memory::owned}));
        using part = schema<leaf<"f32">, node<"sub", leaf<"x">, node<"deeper", leaf<"y">>>>;
        CHECK(same(load_memmap<part>(path, {.strict = false}).get<"sub", "deeper", "y">(), release_value({4, 3}, at::kLong, 7)));
      } else if (name == "consolidated.bin") {
        check_nested(load_consolidated(path));
        check_nested(load_consolidated(path, {.memory = load_memory::owned}));
        CHECK(mapped(load_consolidated(path).get("f32")));
      } else if (name == "empty_leaf") {
        const auto td = load_memmap(path);  // Python writes no e.memmap
        CHECK(same(td.get("e"), at::empty({0, 3})));
        CHECK(same(td.get("f"), release_value({2}, at::kFloat)));
      } else if (odd_keys.count(name)) {
        const std::string& key = odd_keys.at(name);
        const auto td = load_memmap(path);
        CHECK(same(td.get({key}), release_value({2}, at::kFloat)));
        CHECK(same(td.get({"sub_" + key, "v"}), release_value({2}, at::kLong)));
      } else if (name == "oddkey_space_legacy") {
        CHECK(same(load_memmap(path).get({"with space"}), release_value({2}, at::kFloat)));
      } else if (name.rfind("nt_", 0) == 0) {
        const auto td = load_memmap(path, {.skip_non_tensors = name == "nt_list"});
        if (name == "nt_stack_from_stack") {
          CHECK(same(td.get("obs"), at::stack({release_value({2}, at::kFloat), release_value({2}, at::kFloat, 1),
                                               release_value({2}, at::kFloat, 2)})));
          CHECK((td.non_tensor({"name"}).values() == std::vector<non_tensor_value>{"n0", "n1", "n2"}));
          continue;
        }
        const bool two_d = name == "nt_stack_2d";
        CHECK(same(td.get("obs"), release_value(two_d ? std::vector<std::int64_t>{2, 2} : std::vector<std::int64_t>{3}, at::kFloat)));
        if (name == "nt_str") CHECK((td.non_tensor({"value"}).value() == non_tensor_value("reach")));
        if (name == "nt_int") CHECK((td.non_tensor({"value"}).value() == non_tensor_value(std::int64_t{7})));
        if (name == "nt_float") CHECK((td.non_tensor({"value"}).value() == non_tensor_value(0.5)));
        if (name == "nt_none") CHECK((td.non_tensor({"value"}).value() == non_tensor_value(std::monostate{})));
        if (name == "nt_bool") CHECK((td.non_tensor({"value"}).value() == non_tensor_value(true)));
        if (name == "nt_stack") CHECK((td.non_tensor({"names"}).values() == std::vector<non_tensor_value>{"a", "b", "c"}));
        if (two_d) CHECK((td.non_tensor({"names"}).values() == std::vector<non_tensor_value>{"a", "b", "c", "d"}));
        if (name == "nt_list") {  // a list value: refused (README), left out on request
          CHECK_FALSE(td.is_non_tensor({"value"}));
          CHECK_THROWS_WITH(load_memmap(path), Contains("\"data\" holds [1,2]"));
        }
      } else if (name == "from_module" || name == "params") {
        CHECK((load_memmap(path).flatten_keys() == load(dir + "from_module.ref.pt")).all());
      } else if (name == "params_nested") {
        const auto td = load_memmap(path);
        CHECK((td.get_tensordict("params").flatten_keys() == load(dir + "from_module.ref.pt")).all());
        CHECK(same(td.get("x"), release_value({}, at::kFloat)));
      } else if (name == "params_stacked_plain") {
        const auto td = load_memmap(path);
        CHECK(td.batch_size() == c10::IntArrayRef{2});
        CHECK(td.get("weight").sizes() == c10::IntArrayRef{2, 4, 3});
      } else if (name == "lazy_same" || name == "lazy_ragged" || name == "lazy_nested") {
        const bool ragged = name == "lazy_ragged";
        if (name != "lazy_nested") {
          const auto lazy = load_memmap_lazy_stack(path);
          REQUIRE(lazy.size() == 2);
          CHECK(same(lazy[1].get("obs"), release_value({ragged ? 5 : 3}, at::kFloat, 1)));
          CHECK(same(lazy[0].get("n"), release_value({}, at::kLong)));
        }
        if (ragged) {
          CHECK_THROWS_WITH(load_memmap(path), Contains("LazyStackedTensorDict whose elements differ"));
          continue;
        }
        const auto td = load_memmap(path);
        const AnyTensorDict stacked = name == "lazy_nested" ? td.get_tensordict("ls") : td;
        CHECK(stacked.batch_size() == c10::IntArrayRef{2});
        CHECK(same(stacked.get("obs"), at::stack({release_value({3}, at::kFloat), release_value({3}, at::kFloat, 1)})));
        if (name == "lazy_nested") CHECK(same(td.get("x"), release_value({2}, at::kFloat)));
      } else if (name == "tensorclass" || name == "tensorclass_nested") {
        const auto whole = load_memmap(path);
        const AnyTensorDict td = name == "tensorclass" ? whole : whole.get_tensordict("tc");
        CHECK(td.batch_size() == c10::IntArrayRef{3});
        CHECK(same(td.get("obs"), release_value({3, 2}, at::kFloat)));
        CHECK(same(td.get("reward"), release_value({3}, at::kDouble)));
        CHECK((td.non_tensor({"label"}).value() == non_tensor_value("tc")));
      } else if (name == "state_dict.pt") {
        CHECK(load(path).keys().size() == 4);
      } else if (name == "dtypes.pt" || name == "dtypes.safetensors") {
        const auto td = name == "dtypes.pt" ? load(path) : load_safetensors(path);
        CHECK(same(td.get("bf16"), release_value({4, 2}, at::kBFloat16, 2)));
        CHECK(same(td.get("bool"), release_value({4, 5}, at::kBool, 4)));
        if (name == "dtypes.pt") CHECK(same(td.get("f16"), release_value({3}, at::kHalf, 8)));
      } else if (name == "td_to_dict.pt" || name == "nested.safetensors") {
        const auto td = name == "td_to_dict.pt" ? load(path) : load_safetensors(path);
        CHECK(same(td.get("sub", "deeper", "y"), release_value({4, 3}, at::kLong, 7)));
      } else if (name == "td_state_dict.pt") {
        // 0.7: nested, with __batch_size / __device entries; 0.12+: flat dotted keys, the batch sizes in _metadata.
        check_nested(load(path));
        check_nested(load(path, {.memory = load_memory::mapped}));
        CHECK((load(path).level_keys() == std::vector<std::string>{"f32", "f64", "bf16", "i64", "bool", "u8", "sub", "empty"}));
      } else if (name == "td_object.pt") {  // a pickled TensorDict object: refused (README)
        CHECK_THROWS_WITH(load(path), Contains("not a dict"));
      } else if (name == "model.safetensors") {
        CHECK(load_safetensors(path).flatten_keys().keys().size() == 4);
      } else {
        FAIL("no check for " << name);
      }
    }
    CHECK(checked >= 40);
  }
}

TEST_CASE("memmap: save_memmap writes tensordict 0.14's layout by default and 0.4's on request", "[files][python_releases]") {
  const std::string from = fixture("tensordict-v0.7-v0.14/v0.14.0/");
  temporary_dir out("layout_0_14");
  // The same files and the same meta.json, field for field, as 0.14 wrote.
  for (const std::string name : {"nested", "oddkey_space", "oddkey_pct", "oddkey_backslash", "nt_str", "nt_stack", "empty_leaf"}) {
    INFO(name);
    save_memmap(load_memmap(from + name), out / name);
    std::vector<std::string> ours, theirs;
    for (const auto& e : std::filesystem::recursive_directory_iterator(out / name))
      ours.push_back(std::filesystem::relative(e.path(), out / name).string());
    for (const auto& e : std::filesystem::recursive_directory_iterator(from + name))
      theirs.push_back(std::filesystem::relative(e.path(), from + name).string());
    std::sort(ours.begin(), ours.end());
    std::sort(theirs.begin(), theirs.end());
    CHECK(ours == theirs);
    for (const auto& file : theirs)
      if (file.ends_with("meta.json"))
        CHECK(nlohmann::ordered_json::parse(bytes_of(out / (name + "/" + file))) ==
              nlohmann::ordered_json::parse(bytes_of(from + name + "/" + file)));
  }
  // 0.4's layout: raw names, and keys some release would not find are refused before writing.
  AnyTensorDict odd({2});
  odd.set({"with space"}, at::ones({2}));
  save_memmap(odd, out / "v04", {.memmap = memmap_layout::v0_4});
  CHECK(std::filesystem::exists(out / "v04/with space.memmap"));
  CHECK(load_memmap(out / "v04").get({"with space"}).equal(at::ones({2})));
  for (const std::string key : {"a:b", "a\\b", "a/b", ".", ""}) {
    AnyTensorDict bad({2});
    bad.set({key}, at::ones({2}));
    CHECK_THROWS_WITH(save_memmap(bad, out / "refused", {.memmap = memmap_layout::v0_4}), Contains("memmap_layout::v0_4"));
    CHECK_FALSE(std::filesystem::exists(out / "refused"));
    save_memmap(bad, out / "encoded");  // the default encodes it; read back whole
    CHECK(load_memmap(out / "encoded").get({key}).equal(at::ones({2})));
  }
  AnyTensorDict clash({2});
  clash.set({"a b"}, at::ones({2}));
  clash.set({"a%20b"}, at::zeros({2}));
  CHECK_THROWS_WITH(save_memmap(clash, out / "clash", {.memmap = memmap_layout::v0_4}), Contains("percent-encoded name"));
  save_memmap(clash, out / "clash");
  const auto back = load_memmap(out / "clash");
  CHECK(back.get({"a b"}).equal(at::ones({2})));
  CHECK(back.get({"a%20b"}).equal(at::zeros({2})));
}

namespace {
// make.py's @tensorclass TC (its str field "label" aside) and a TensorDict holding one.
struct TC {
  at::Tensor obs, reward;
  TENSORDICT_TENSORCLASS(TC, obs, reward)
};
struct Holder {
  TC tc;
  at::Tensor x;
  TENSORDICT_TENSORCLASS(Holder, tc, x)
};

// The meta.json files under `dir`, by path relative to it, as unordered JSON.
std::map<std::string, nlohmann::json> metas_under(const std::filesystem::path& dir) {
  std::map<std::string, nlohmann::json> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.path().filename() == "meta.json")
      out[std::filesystem::relative(e.path(), dir).string()] = nlohmann::json::parse(bytes_of(e.path()));
  return out;
}
}  // namespace

TEST_CASE("memmap: tensorclasses are written as tensordict 0.7 and later write them", "[files][python_releases]") {
  const std::string from = fixture("tensordict-v0.7-v0.14/v0.14.0/");
  temporary_dir out("tensorclass_0_14");
  // Python's folders without the str field (a C++ tensorclass holds tensors): the same meta.json files.
  auto python_without_label = [&](const std::string& name) {
    auto metas = metas_under(from + name);
    for (auto it = metas.begin(); it != metas.end();) it = it->first.find("label") != std::string::npos ? metas.erase(it) : std::next(it);
    for (auto& [file, meta] : metas) meta.erase("label");
    return metas;
  };
  // The run-time way: the levels that are tensorclasses named.
  save_memmap(load_memmap(from + "tensorclass", {.skip_non_tensors = true}), out / "any", {{{}, "__main__.TC"}});
  CHECK(metas_under(out / "any") == python_without_label("tensorclass"));
  // load_memmap names the tensorclasses it read, for save_memmap to write them so again.
  std::map<any_key_path, std::string> classes;
  const auto nested = load_memmap(from + "tensorclass_nested", classes, {.skip_non_tensors = true});
  CHECK(classes == std::map<any_key_path, std::string>{{{"tc"}, "__main__.TC"}});
  save_memmap(nested, out / "any_nested", classes);
  CHECK(metas_under(out / "any_nested") == python_without_label("tensorclass_nested"));
  CHECK(bytes_of(out / "any_nested/tc/_tensordict/obs.memmap") == bytes_of(from + "tensorclass_nested/tc/_tensordict/obs.memmap"));

  // The typed way: the class names from the types (Holder is one too: Python's TensorDict
  // holding a TC, in Holder's _tensordict/); without a device, "None" where Python's had "cpu".
  const TC tc{.obs = release_value({3, 2}, at::kFloat), .reward = release_value({3}, at::kDouble), .batch_size = {3}};
  save_memmap(Holder{.tc = tc, .x = release_value({3}, at::kFloat, 1), .batch_size = {3}}, out / "typed");
  std::map<std::string, nlohmann::json> expected{{"meta.json", {{"_type", "<class '__main__.Holder'>"}}}};
  for (const auto& [file, meta] : python_without_label("tensorclass_nested")) expected["_tensordict/" + file] = meta;
  auto ours = metas_under(out / "typed");
  for (auto* metas : {&expected, &ours})
    for (auto& [file, meta] : *metas)
      if (meta.contains("device")) meta.erase("device");
  CHECK(ours == expected);
  const Holder back = load_memmap<Holder>(out / "typed");
  CHECK(same(back.tc.obs, tc.obs));
  CHECK(same(back.tc.reward, tc.reward));
  CHECK(back.batch_size == std::vector<std::int64_t>{3});
  // Python's folder into the C++ tensorclass (its str field left out).
  const TC python = load_memmap<TC>(from + "tensorclass", {.skip_non_tensors = true});
  CHECK(same(python.obs, tc.obs));
  CHECK(same(python.reward, tc.reward));
  save_memmap(tc, out / "tc.tdz", {}, "rl.data");
  const std::string zip = bytes_of(out / "tc.tdz");
  for (const auto& member : tensordict::detail::archive::zip_entries(zip, ".tdz"))
    if (member.name == "meta.json") CHECK(nlohmann::json::parse(zip.substr(member.offset, member.size)) == nlohmann::json{{"_type", "<class 'rl.data.TC'>"}});
  CHECK(same(load_memmap<TC>(out / "tc.tdz").obs, tc.obs));

  // Refused before anything is written: 0.4's layout, a name Python cannot import, a level that is no TensorDict.
  const auto any = load_memmap(from + "tensorclass", {.skip_non_tensors = true});
  CHECK_THROWS_WITH(save_memmap(any, out / "v04", {{{}, "__main__.TC"}}, {.memmap = memmap_layout::v0_4}),
                    Contains("memmap_layout::v0_4 does not write"));
  CHECK_THROWS_WITH(save_memmap(any, out / "bad", {{{}, "TC"}}), Contains("not a Python class's \"module.Name\""));
  CHECK_THROWS_WITH(save_memmap(any, out / "bad", {{{"obs"}, "__main__.TC"}}), Contains("\"obs\"") && Contains("no TensorDict level"));
  CHECK_FALSE(std::filesystem::exists(out / "v04"));
  CHECK_FALSE(std::filesystem::exists(out / "bad"));
}

TEST_CASE("consolidated files, .tdz archives and lazy stacks round-trip in Python's layout", "[files][python_releases]") {
  const std::string from = fixture("tensordict-v0.7-v0.14/v0.14.0/");
  temporary_dir out("formats_0_14");
  const auto nested = load_memmap(from + "nested");
  // Consolidated: the bytes Python wrote, metadata included.
  save_consolidated(nested, out / "c.bin");
  check_nested(load_consolidated(out / "c.bin"));
  AnyTensorDict with_value({2});
  with_value.set("x", at::ones({2, 3}, at::kHalf));
  with_value.set_non_tensor({"label"}, "run-1");
  save_consolidated(with_value, out / "v.bin");
  const auto v = load_consolidated(out / "v.bin", {.memory = load_memory::owned});
  CHECK(v.get("x").equal(at::ones({2, 3}, at::kHalf)));
  CHECK((v.non_tensor({"label"}).value() == non_tensor_value("run-1")));
  AnyTensorDict reserved({2});
  reserved.set("leaves", "x", at::ones({2}));
  CHECK_THROWS_WITH(save_consolidated(reserved, out / "r.bin"), Contains("uses this name for itself"));
  CHECK_FALSE(std::filesystem::exists(out / "r.bin"));
  CHECK_THROWS_AS(load_consolidated(from + "nested/f32.memmap"), file_error);
  // .tdz: a zip of the folder's files, each member 64-aligned, read back mapped; 0.4's layout makes a folder.
  save_memmap(nested, out / "n.tdz");
  CHECK(std::filesystem::is_regular_file(out / "n.tdz"));
  check_nested(load_memmap(out / "n.tdz"));
  CHECK(mapped(load_memmap(out / "n.tdz").get("f64")));
  const std::string zip = bytes_of(out / "n.tdz");
  for (const auto& member : tensordict::detail::archive::zip_entries(zip, ".tdz")) CHECK(member.offset % 64 == 0);
  save_memmap(nested, out / "old.tdz", {.memmap = memmap_layout::v0_4});
  CHECK(std::filesystem::is_directory(out / "old.tdz"));
  CHECK_THROWS_WITH(memmap_like(nested, out / "buffer.tdz"), Contains("cannot be written through"));
  // A ragged lazy stack, written as Python writes one.
  AnyTensorDict a, b;
  a.set("obs", at::ones({3}));
  b.set("obs", at::zeros({5}));
  save_memmap(LazyStackedTensorDict<AnyTensorDict>({a, b}), out / "lazy");
  CHECK(nlohmann::ordered_json::parse(bytes_of(out / "lazy/meta.json")) ==
        nlohmann::ordered_json::parse(bytes_of(from + "lazy_ragged/meta.json")));
  const auto lazy = load_memmap_lazy_stack(out / "lazy");
  CHECK(lazy[1].get("obs").equal(at::zeros({5})));
  CHECK_THROWS_WITH(load_memmap(out / "lazy"), Contains("elements differ"));
}
