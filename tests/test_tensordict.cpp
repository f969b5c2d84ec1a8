#include <sstream>

#include "catch_torch.hpp"
#include "test_helpers.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>

#include <ATen/ops/arange.h>

#include <tensordict/any_tensordict.hpp>
#include <tensordict/dict.hpp>
#include <tensordict/lazy_stack.hpp>
#include <tensordict/files/safetensors.hpp>
#include <tensordict/tensorclass.hpp>
#include <tensordict/typed_tensordict.hpp>

using namespace tensordict;
using test::impl;
using test::printed;
using test::Contains;
namespace idx = at::indexing;

namespace {
using linear = schema<leaf<"weight">, leaf<"bias">>;
using mlp = schema<field<"0", linear>, field<"2", linear>>;

TensorDict<mlp> make_mlp(c10::IntArrayRef batch = {}) {
  std::vector<std::int64_t> b(batch.begin(), batch.end());
  auto shape = [&](std::initializer_list<std::int64_t> own) {
    std::vector<std::int64_t> s = b;
    s.insert(s.end(), own);
    return s;
  };
  return TensorDict<mlp>({at::randn(shape({4, 3})), at::randn(shape({4})), at::randn(shape({1, 4})), at::randn(shape({1}))},
                         batch);
}

}  // namespace

TEST_CASE("get returns the stored tensor itself", "[tensordict]") {
  at::Tensor w = at::randn({4, 3});
  TensorDict<linear> td({w, at::zeros({4})});
  CHECK(impl(td.get<"weight">()) == impl(w));
  CHECK(td.batch_size().empty());
  CHECK(td.batch_dims() == 0);
}

TEST_CASE("a sub-tree is a view that aliases its parent", "[tensordict]") {
  auto td = make_mlp();
  auto first = td.get<"0">();
  STATIC_REQUIRE(std::is_same_v<decltype(first), TensorDict<linear>>);
  CHECK(impl(first.get<"weight">()) == impl(td.get<"0", "weight">()));

  at::Tensor w = at::ones({4, 3});
  first.set<"weight">(w);
  CHECK(impl(td.get<"0", "weight">()) == impl(w));

  at::Tensor b = at::ones({4});
  td.set<"0", "bias">(b);
  CHECK(impl(first.get<"bias">()) == impl(b));
}

TEST_CASE("set checks the batch dims and changes nothing when it throws", "[tensordict]") {
  auto td = make_mlp({3});
  at::Tensor before = td.get<"2", "bias">();
  try {
    td.set<"2", "bias">(at::zeros({5, 1}));
    FAIL("set accepted a tensor without the batch dims");
  } catch (const shape_error& e) {
    CHECK_THAT(e.what(), Contains(R"(("2", "bias"))") && Contains("f32[5,1]") && Contains("[3]"));
  }
  CHECK(impl(td.get<"2", "bias">()) == impl(before));

  td.set<"2", "bias">(at::zeros({3, 7}));  // the leaf's own dims are free
  CHECK(td.get<"2", "bias">().sizes() == c10::IntArrayRef({3, 7}));
  CHECK_THROWS_AS((TensorDict<linear>({at::zeros({2, 4}), at::zeros({3})}, {2})), shape_error);
}

TEST_CASE("a sub-tree is set from a TensorDict of its schema", "[tensordict]") {
  auto td = make_mlp({2});
  TensorDict<linear> replacement({at::zeros({2, 4, 3}), at::zeros({2, 4})}, {2});
  td.set<"0">(replacement);
  CHECK(impl(td.get<"0", "weight">()) == impl(replacement.get<"weight">()));

  TensorDict<linear> wrong_batch({at::zeros({4, 3}), at::zeros({4})});
  CHECK_THROWS_AS(td.set<"0">(wrong_batch), shape_error);
  CHECK(impl(td.get<"0", "weight">()) == impl(replacement.get<"weight">()));
}

TEST_CASE("unset leaves are absent", "[tensordict]") {
  TensorDict<linear> td;
  CHECK(td.keys().empty());
  CHECK(printed(td) == "TensorDict(batch_size=[], fields={})");
  CHECK_THROWS_WITH(td.get<"bias">(), Contains(R"(leaf "bias" is not set)"));
  td.set<"weight">(at::zeros({2, 2}));
  REQUIRE(td.keys().size() == 1);
  CHECK(td.keys()[0].join(".") == "weight");
  CHECK(printed(td.clone()) == "TensorDict(batch_size=[], fields={weight: f32[2,2]})");
}

TEST_CASE("keys, values and items follow the schema order", "[tensordict]") {
  auto td = make_mlp();
  std::vector<std::string> names;
  for (const auto& k : td.keys()) names.push_back(k.join("."));
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  auto values = td.values();
  auto items = td.items();
  REQUIRE(values.size() == 4);
  REQUIRE(items.size() == 4);
  CHECK(impl(values[2]) == impl(td.get<"2", "weight">()));
  CHECK(items[3].first.join("/") == "2/bias");
  CHECK(impl(items[3].second) == impl(td.get<"2", "bias">()));
  CHECK(impl(td.leaf(leaf_index_v<mlp, "2", "bias">)) == impl(td.get<"2", "bias">()));
}

TEST_CASE("apply makes a new TensorDict, apply_ writes into the leaves", "[tensordict]") {
  auto td = make_mlp();
  auto doubled = td.apply([](const at::Tensor& t) { return t * 2; });
  CHECK(doubled.get<"0", "weight">().equal(td.get<"0", "weight">() * 2));
  CHECK(impl(doubled.get<"0", "weight">()) != impl(td.get<"0", "weight">()));

  const c10::TensorImpl* before = impl(td.get<"2", "weight">());
  td.apply_([](at::Tensor& t) { return t.fill_(1.0); });
  CHECK(impl(td.get<"2", "weight">()) == before);
  CHECK((td == 1).all());

  td.apply_([](at::Tensor& t) { return at::full_like(t, 3.0); });  // a new tensor: values copied in
  CHECK(impl(td.get<"2", "weight">()) == before);
  CHECK((td == 3).all());

  auto dropped = td.apply([](const at::Tensor& t) { return t.dim() == 2 ? t : at::Tensor(); });
  CHECK(dropped.keys().size() == 2);

  CHECK_THROWS_WITH(td.apply([](const at::Tensor& t) { return t; }, {4}),
                    Contains("apply") && Contains(R"(("2", "weight"))") && Contains("f32[1,4]") && Contains("[4]"));
}

TEST_CASE("clone, detach, zero_ and to", "[tensordict]") {
  auto td = make_mlp().apply([](const at::Tensor& t) { return t.detach().requires_grad_(); });
  auto copy = td.clone();
  CHECK(impl(copy.get<"0", "weight">()) != impl(td.get<"0", "weight">()));
  CHECK(copy.get<"0", "weight">().equal(td.get<"0", "weight">()));
  CHECK(copy.get<"0", "weight">().requires_grad());

  auto detached = td.detach();
  CHECK(!detached.get<"0", "weight">().requires_grad());
  CHECK(detached.get<"0", "weight">().data_ptr() == td.get<"0", "weight">().data_ptr());

  auto zeros = td.detach().clone().zero_();
  CHECK((zeros == 0).all());
  CHECK(!(td == 0).all());

  auto doubles = td.to(at::kDouble);
  CHECK(doubles.get<"2", "bias">().scalar_type() == at::kDouble);
  auto on_cpu = td.to(at::Device(at::kCPU));
  REQUIRE(on_cpu.device().has_value());
  CHECK(on_cpu.device()->is_cpu());
  CHECK(printed(on_cpu).rfind("TensorDict(batch_size=[], device=cpu, fields={", 0) == 0);
}

TEST_CASE("gradients flow through stack and apply to the original leaves", "[tensordict]") {
  auto a = make_mlp().apply([](const at::Tensor& t) { return t.detach().requires_grad_(); });
  auto b = make_mlp().apply([](const at::Tensor& t) { return t.detach().requires_grad_(); });
  auto stacked = stack({a, b}).apply([](const at::Tensor& t) { return t * 3; });
  stacked.get<"0", "weight">().sum().backward();
  CHECK(a.get<"0", "weight">().grad().equal(at::full({4, 3}, 3.0)));
  CHECK(b.get<"0", "weight">().grad().equal(at::full({4, 3}, 3.0)));
  CHECK(!a.get<"2", "weight">().grad().defined());
}

TEST_CASE("comparisons give a TensorDict of bools", "[tensordict]") {
  auto td = make_mlp();
  auto same = td == td.clone();
  CHECK(same.get<"0", "weight">().scalar_type() == at::kBool);
  CHECK(same.all());
  auto other = td.clone();
  other.get<"2", "bias">().add_(1);
  CHECK(!(td == other).all());
  CHECK((td != other).any());
  CHECK(!(td != td).any());
}

TEST_CASE("indexing along the batch dims", "[tensordict]") {
  auto td = make_mlp({3, 2});
  auto row = td[1];
  CHECK(row.batch_size() == c10::IntArrayRef({2}));
  CHECK(row.get<"0", "weight">().sizes() == c10::IntArrayRef({2, 4, 3}));
  CHECK(row.get<"0", "weight">().data_ptr() != td.get<"0", "weight">().data_ptr());  // offset view
  row.get<"0", "weight">().fill_(7);
  CHECK(td.get<"0", "weight">()[1].eq(7).all().item<bool>());  // a view

  auto cols = td.index({idx::Slice(), 0});
  CHECK(cols.batch_size() == c10::IntArrayRef({3}));
  CHECK(cols.get<"2", "bias">().sizes() == c10::IntArrayRef({3, 1}));

  auto ell = td.index({idx::Ellipsis, 1});  // the Ellipsis covers batch dims only
  CHECK(ell.batch_size() == c10::IntArrayRef({3}));
  CHECK(ell.get<"0", "weight">().sizes() == c10::IntArrayRef({3, 4, 3}));

  auto mask = at::tensor({1, 0, 1}).to(at::kBool);
  auto picked = td.index({mask});
  CHECK(picked.batch_size() == c10::IntArrayRef({2, 2}));
  CHECK(picked.get<"0", "bias">().equal(td.get<"0", "bias">().index({mask})));

  CHECK_THROWS_AS(td.index({0, 0, 0}), index_error);
}

TEST_CASE("unbind and expand", "[tensordict]") {
  auto td = make_mlp({3, 2});
  auto rows = td.unbind(0);
  REQUIRE(rows.size() == 3);
  CHECK(rows[2].batch_size() == c10::IntArrayRef({2}));
  CHECK(rows[2].get<"0", "weight">().equal(td.get<"0", "weight">()[2]));
  auto cols = td.unbind(-1);
  REQUIRE(cols.size() == 2);
  CHECK(cols[1].get<"2", "bias">().equal(td.get<"2", "bias">().select(1, 1)));
  CHECK_THROWS_WITH(td.unbind(2), Contains("unbind") && Contains("[3,2]"));

  auto single = make_mlp();
  auto four = single.expand(4);
  CHECK(four.batch_size() == c10::IntArrayRef({4}));
  CHECK(four.get<"0", "weight">().sizes() == c10::IntArrayRef({4, 4, 3}));
  CHECK(four.get<"0", "weight">().data_ptr() == single.get<"0", "weight">().data_ptr());
  auto more = td.expand({5, 3, -1});
  CHECK(more.batch_size() == c10::IntArrayRef({5, 3, 2}));
  CHECK_THROWS_AS(td.expand({4, 2}), shape_error);
  CHECK_THROWS_AS(td.expand({2}), shape_error);
}

TEST_CASE("stack adds a batch dim", "[tensordict]") {
  auto a = make_mlp(), b = make_mlp(), c = make_mlp();
  auto s = stack({a, b, c});
  CHECK(s.batch_size() == c10::IntArrayRef({3}));
  CHECK(s.get<"2", "weight">()[1].equal(b.get<"2", "weight">()));
  auto v = stack(a, b, c);
  CHECK((v == s).all());
  auto from_vector = stack(std::vector<TensorDict<mlp>>{a, b});
  CHECK(from_vector.batch_size() == c10::IntArrayRef({2}));

  auto batched = stack({make_mlp({2}), make_mlp({2})}, 1);
  CHECK(batched.batch_size() == c10::IntArrayRef({2, 2}));
  CHECK(batched.get<"0", "weight">().sizes() == c10::IntArrayRef({2, 2, 4, 3}));
}

TEST_CASE("stack names the odd key, both shapes and the index", "[tensordict]") {
  auto a = make_mlp(), b = make_mlp(), c = make_mlp();
  c.set<"2", "weight">(at::zeros({1, 5}));
  CHECK_THROWS_WITH(stack({a, b, c}), Contains(R"(("2", "weight"))") && Contains("f32[1,4]") && Contains("f32[1,5]") &&
                                          Contains("TensorDict 2"));
  CHECK_THROWS_AS(stack({a, b, c}), shape_error);
  CHECK_THROWS_WITH(stack({make_mlp({2}), make_mlp({3})}), Contains("batch_size=[2]") && Contains("batch_size=[3]"));
}

TEST_CASE("flatten_keys and unflatten_keys keep the tensors", "[tensordict]") {
  auto td = make_mlp();
  auto flat = td.flatten_keys<".">();
  STATIC_REQUIRE(std::is_same_v<decltype(flat)::schema_t, flatten_t<mlp, ".">>);
  CHECK(impl(flat.get<"0.weight">()) == impl(td.get<"0", "weight">()));
  CHECK(printed(flat) == "TensorDict(batch_size=[], fields={0.bias: f32[4], 0.weight: f32[4,3], 2.bias: f32[1], 2.weight: f32[1,4]})");
  auto back = flat.unflatten_keys<".">();
  STATIC_REQUIRE(std::is_same_v<decltype(back), TensorDict<mlp>>);
  CHECK(impl(back.get<"2", "bias">()) == impl(td.get<"2", "bias">()));

  using interleaved = schema<leaf<"a.x">, leaf<"b">, leaf<"a.y">>;
  TensorDict<interleaved> mixed({at::zeros({1}), at::zeros({2}), at::zeros({3})});
  auto tree = mixed.unflatten_keys();
  CHECK(impl(tree.get<"a", "y">()) == impl(mixed.get<"a.y">()));
  CHECK(impl(tree.get<"b">()) == impl(mixed.get<"b">()));
}

TEST_CASE("a locked TensorDict refuses new leaves but allows in-place writes", "[tensordict]") {
  auto td = make_mlp();
  CHECK(!td.is_locked());
  td.lock_();
  CHECK(td.is_locked());
  CHECK(td.get<"0">().is_locked());  // locks propagate to sub-trees
  at::Tensor before = td.get<"0", "weight">();
  CHECK_THROWS_AS((td.set<"0", "weight">(at::zeros({4, 3}))), lock_error);
  CHECK_THROWS_WITH(td.get<"0">().set<"weight">(at::zeros({4, 3})),
                    Contains(R"("weight")") && Contains("locked") && Contains("unlock_()"));
  CHECK(impl(td.get<"0", "weight">()) == impl(before));
  td.get<"0", "weight">().zero_();  // in place is fine
  CHECK(td.get<"0", "weight">().eq(0).all().item<bool>());
  td.zero_();

  CHECK(!td.clone().is_locked());
  CHECK_THROWS_WITH(td.get<"0">().unlock_(), Contains("part of a locked TensorDict"));
  td.unlock_();
  CHECK(!td.get<"0">().is_locked());
  td.set<"0", "weight">(at::zeros({4, 3}));

  td.get<"2">().lock_();  // a child's lock does not lock its parent
  CHECK(!td.is_locked());
  td.set<"0", "bias">(at::zeros({4}));
  CHECK_THROWS_AS((td.set<"2", "bias">(at::zeros({1}))), lock_error);
  td.get<"2">().unlock_();
  td.set<"2", "bias">(at::zeros({1}));
}

TEST_CASE("printing follows the reference format", "[tensordict]") {
  auto td = make_mlp();
  CHECK(printed(td) ==
        "TensorDict(batch_size=[], fields={0: {bias: f32[4], weight: f32[4,3]}, 2: {bias: f32[1], weight: f32[1,4]}})");
  CHECK(td.repr(print_style::multiline) ==
        "TensorDict(batch_size=[], fields={\n"
        "    0: {bias: f32[4], weight: f32[4,3]},\n"
        "    2: {bias: f32[1], weight: f32[1,4]}})");
  CHECK(printed(stack({td, td, td})) ==
        "TensorDict(batch_size=[3], fields={0: {bias: f32[3,4], weight: f32[3,4,3]}, 2: {bias: f32[3,1], weight: "
        "f32[3,1,4]}})");

  // Keys sort as strings, as Python's sorted() does.
  using many = schema<leaf<"b">, leaf<"10">, leaf<"2">, leaf<"a">>;
  TensorDict<many> m({at::zeros({}), at::zeros({1}), at::zeros({2}), at::zeros({3})});
  CHECK(printed(m) == "TensorDict(batch_size=[], fields={10: f32[1], 2: f32[2], a: f32[3], b: f32[]})");

  using dtypes = schema<leaf<"a">, leaf<"b">, leaf<"c">, leaf<"d">, leaf<"e">, leaf<"f">, leaf<"g">, leaf<"h">, leaf<"i">,
                        leaf<"j">, leaf<"k">, leaf<"l">>;
  auto of = [](at::ScalarType t) { return at::zeros({2}, t); };
  TensorDict<dtypes> d({of(at::kHalf), of(at::kBFloat16), of(at::kFloat), of(at::kDouble), of(at::kChar), of(at::kShort),
                        of(at::kInt), of(at::kLong), of(at::kByte), of(at::kBool), of(at::kComplexFloat),
                        of(at::kComplexDouble)});
  CHECK(printed(d) ==
        "TensorDict(batch_size=[], fields={a: f16[2], b: bf16[2], c: f32[2], d: f64[2], e: i8[2], f: i16[2], g: i32[2], "
        "h: i64[2], i: u8[2], j: bool[2], k: c64[2], l: c128[2]})");
}

TEST_CASE("to(device) builds the result on the target device; index() follows the index's device", "[tensordict]") {
  // Issue 12, defect 2: the result was built on the old device and every leaf copied back
  // ("Cannot copy out of meta tensor"); index() probed the batch size with a CPU tensor.
  TensorDict<mlp> td({at::randn({3, 4, 3}), at::randn({3, 4}), at::randn({3, 1, 4}), at::randn({3, 1})}, {3},
                     at::Device(at::kCPU));
  auto meta = td.to(at::Device(at::kMeta));
  CHECK(meta.device() == at::Device(at::kMeta));
  for (const at::Tensor& t : meta.values()) CHECK(t.device().is_meta());
  CHECK(td.get<"0", "weight">().device().is_cpu());
  auto picked = meta.index({at::tensor({0, 2}, at::kLong).to(at::kMeta)});
  CHECK(picked.batch_size() == c10::IntArrayRef{2});
  CHECK(picked.get<"0", "weight">().device().is_meta());
  CHECK(picked.get<"0", "weight">().sizes() == c10::IntArrayRef{2, 4, 3});
}

// ---- the everyday verbs, shared by the typed and the run-time forms ------------------------

namespace {
using verbs_schema = schema<leaf<"a">, field<"n", schema<leaf<"b">>>>;

// batch_size [2, 3]; "a" f32[2,3,4] = arange, ("n", "b") i64[2,3] = arange.
template <class TD>
TD verbs_td() {
  TensorDict<verbs_schema> typed({at::arange(24, at::kFloat).reshape({2, 3, 4}), at::arange(6, at::kLong).reshape({2, 3})}, {2, 3});
  if constexpr (std::is_same_v<TD, AnyTensorDict>)
    return AnyTensorDict(typed);
  else
    return typed;
}

bool shares(const at::Tensor& a, const at::Tensor& b) { return a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl(); }
}  // namespace

TEMPLATE_TEST_CASE("shape verbs act on the batch dims; leaves follow, as views", "[tensordict]", TensorDict<verbs_schema>, AnyTensorDict) {
  const auto td = verbs_td<TestType>();
  const at::Tensor a = td.values()[0], b = td.values()[1];
  CHECK(td.shape() == c10::IntArrayRef{2, 3});
  CHECK(td.ndim() == 2);
  CHECK(td.numel() == 6);
  CHECK_FALSE(td.is_empty());

  auto r = td.reshape({3, -1});
  CHECK(r.batch_size() == c10::IntArrayRef{3, 2});
  CHECK(r.values()[0].sizes() == c10::IntArrayRef{3, 2, 4});
  CHECK(r.values()[0].equal(a.reshape({3, 2, 4})));
  CHECK(shares(r.values()[0], a));
  CHECK(td.view({6}).values()[1].equal(b.view({6})));
  auto f = td.flatten();
  CHECK(f.batch_size() == c10::IntArrayRef{6});
  CHECK(f.values()[0].sizes() == c10::IntArrayRef{6, 4});
  CHECK(f.unflatten(0, {2, -1}).values()[0].equal(a));
  CHECK(td.unsqueeze(1).batch_size() == c10::IntArrayRef{2, 1, 3});
  CHECK(td.unsqueeze(-1).values()[0].sizes() == c10::IntArrayRef{2, 3, 1, 4});
  CHECK(td.unsqueeze(1).squeeze().batch_size() == c10::IntArrayRef{2, 3});
  CHECK(td.unsqueeze(0).squeeze(0).values()[0].equal(a));
  auto t = td.transpose(0, 1);
  CHECK(t.batch_size() == c10::IntArrayRef{3, 2});
  CHECK(t.values()[0].equal(a.transpose(0, 1)));
  CHECK(shares(t.values()[0], a));
  CHECK(td.permute({1, 0}).values()[1].equal(b.t()));

  auto parts = td.split(2, 1);
  REQUIRE(parts.size() == 2);
  CHECK(parts[1].batch_size() == c10::IntArrayRef{2, 1});
  CHECK(parts[1].values()[0].equal(a.narrow(1, 2, 1)));
  CHECK(shares(parts[0].values()[0], a));
  CHECK(td.split({1, 2}, 1)[1].values()[1].equal(b.narrow(1, 1, 2)));
  CHECK(td.chunk(2, 0).size() == 2);
  CHECK(td.chunk(2, 0)[1].values()[0].equal(a[1].unsqueeze(0)));

  CHECK_THROWS_WITH(td.reshape({4, 2}), Contains("batch_size=[2,3] (6 elements) cannot be [4,2]"));
  CHECK_THROWS_AS(td.transpose(0, 2), index_error);
  CHECK_THROWS_WITH(td.permute({0, 0}), Contains("is not a permutation"));
  CHECK_THROWS_WITH(td.split({1, 1}, 1), Contains("do not add up"));
  CHECK_THROWS_WITH(td.unflatten(1, {2, 2}), Contains("batch dim 1 of size 3 cannot be [2,2]"));
}

TEMPLATE_TEST_CASE("element-wise verbs, arithmetic and reductions keep the keys", "[tensordict]", TensorDict<verbs_schema>, AnyTensorDict) {
  auto td = verbs_td<TestType>();
  const at::Tensor a = td.values()[0], b = td.values()[1];

  auto sum = td + td;
  CHECK(sum.values()[0].equal(a * 2));
  CHECK((td * 2).values()[1].equal(b * 2));
  CHECK((1 - td).values()[0].equal(1 - a));
  CHECK((td / 2).values()[0].equal(a / 2));
  CHECK((-td).values()[1].equal(-b));
  CHECK(td.abs().values()[0].equal(a));
  CHECK(td.clamp(2, 5).values()[1].equal(b.clamp(2, 5)));
  CHECK(td.clamp(std::nullopt, 3).values()[0].equal(a.clamp_max(3)));
  CHECK(td.exp().values()[0].equal(a.exp()));

  auto norms = td.to(at::kFloat).norm();  // libtorch has no norm of integers
  CHECK(norms.batch_size().empty());
  CHECK(norms.values()[0].allclose(a.norm()));
  // Without a dim, every leaf to a scalar as Python's td.sum(); over a list of batch dims, the batch only.
  CHECK(td.sum().batch_size().empty());
  CHECK(td.sum().values()[0].equal(a.sum()));
  CHECK(td.sum().values()[0].dim() == 0);
  CHECK(td.to(at::kFloat).mean().values()[1].allclose(b.to(at::kFloat).mean()));
  CHECK(td.max().values()[1].equal(b.max()));
  CHECK(td.sum({0, 1}).values()[0].equal(a.sum(std::vector<std::int64_t>{0, 1})));
  CHECK(td.sum({-1, 0}, true).batch_size() == c10::IntArrayRef{1, 1});
  CHECK_THROWS_AS(td.sum({0, 0}), index_error);
  CHECK(td.sum(1).values()[1].equal(b.sum(1)));
  CHECK(td.to(at::kFloat).mean(0, true).batch_size() == c10::IntArrayRef{1, 3});
  CHECK(td.max(1).values()[1].equal(b.amax(1)));
  CHECK(td.min({0, 1}).values()[0].equal(a.amin(std::vector<std::int64_t>{0, 1})));

  // In place: the same tensors, new values; a failed call writes nothing.
  auto copy = td.clone();
  const at::Tensor ca = copy.values()[0];
  copy.add_(td).mul_(td * 0 + 1).sub_(td);  // (a + a) * 1 - a
  CHECK(copy.values()[0].is_same(ca));
  CHECK(ca.equal(a));
  auto other = td.clone();
  other.sub_(1);
  CHECK(other.values()[1].equal(b - 1));
  auto wider = td.unsqueeze(0);
  CHECK_THROWS_WITH(copy.add_(wider), Contains("batch_size=[2,3] and batch_size=[1,2,3] differ"));
  CHECK(ca.equal(a));

  auto mask = at::tensor({1, 0}).to(at::kBool);
  auto filled = td.clone();
  filled.masked_fill_(mask, -1);
  CHECK(filled.values()[0][0].eq(-1).all().template item<bool>());
  CHECK(filled.values()[0][1].equal(a[1]));
  CHECK(td.masked_fill(mask, 0).values()[1][0].eq(0).all().template item<bool>());
  auto chosen = td.where(mask, td * 10);
  CHECK(chosen.values()[1][0].equal(b[0]));
  CHECK(chosen.values()[1][1].equal(b[1] * 10));
  CHECK(td.where(mask, 7).values()[0][1].eq(7).all().template item<bool>());
  // Scalars and leaves of other dtypes promote as torch.where does: int64 with 0.5 gives float32.
  const auto half = td.where(mask, 0.5);
  CHECK(half.values()[1].scalar_type() == at::kFloat);
  CHECK(half.values()[1][1].eq(0.5).all().template item<bool>());
  CHECK(half.values()[1][0].equal(b[0].to(at::kFloat)));
  CHECK(td.where(mask, td.to(at::kDouble)).values()[1].scalar_type() == at::kDouble);
  CHECK((0.5 - td).values()[1].equal(0.5 - b.to(at::kFloat)));  // float32, as Python's 0.5 - td
  CHECK_THROWS_WITH(td.masked_fill_(at::tensor({1, 0, 1}).to(at::kBool), 0), Contains("is not batch_size=[2,3]"));

  auto padded = pad(td, {1, 0, 0, 2}, 9);
  CHECK(padded.batch_size() == c10::IntArrayRef{3, 5});
  CHECK(padded.values()[0].sizes() == c10::IntArrayRef{3, 5, 4});
  CHECK(padded.values()[0][0].eq(9).all().template item<bool>());
  CHECK(padded.values()[0].narrow(0, 1, 2).narrow(1, 0, 3).equal(a));
  CHECK_THROWS_WITH(pad(td, {1, 0, 0}), Contains("is not (before, after) pairs"));
}

// Python's lerp / lerp_ (a target network's soft update: target.lerp_(online, 1 - tau)).
TEMPLATE_TEST_CASE("lerp and lerp_: each leaf towards end's by a scalar or tensor weight", "[tensordict]", TensorDict<verbs_schema>,
                   AnyTensorDict) {
  const auto mixed = verbs_td<TestType>();  // "a" f32, ("n", "b") i64
  const auto td = mixed.apply([](const at::Tensor& t) { return t.to(at::kFloat); });
  const auto end = td.apply([](const at::Tensor& t) { return t * 3 + 1; });
  const at::Tensor a = td.values()[0], b = td.values()[1];
  const auto moved = td.lerp(end, 0.25);
  CHECK(moved.values()[0].allclose(a + 0.25 * (end.values()[0] - a)));
  CHECK(moved.values()[1].equal(b.lerp(end.values()[1], 0.25)));
  CHECK(td.lerp(end, at::full({1}, 0.5)).values()[0].equal(a.lerp(end.values()[0], at::full({1}, 0.5))));
  CHECK(td.values()[0].equal(a));  // lerp: a new TensorDict
  auto named = td.clone();
  named.refine_names({"time", std::nullopt});
  // As Python's, whose lerp keeps the batch dims' names.
  CHECK(tensordict::detail::format_names(named.lerp(end, 0.5).names()) == "[\"time\", None]");

  auto target = td.clone();
  const at::Tensor leaf = target.values()[0];
  target.lerp_(end, 0.1);
  CHECK(impl(target.values()[0]) == impl(leaf));  // in place: the leaves keep their identity
  CHECK(target.values()[1].equal(b.lerp(end.values()[1], 0.1)));
  target.lerp_(end, at::full({}, 1.0));
  CHECK(target.values()[0].equal(end.values()[0]));

  // Checked before the first leaf is written: end's dtype, the weight's dtype and shape.
  auto kept = td.clone();
  CHECK_THROWS_AS(kept.lerp_(mixed, 0.5), dtype_error);
  CHECK_THROWS_WITH(kept.lerp_(mixed, 0.5), Contains("TensorDict.lerp_((\"n\", \"b\")): the leaf is f32[2,3] and end's i64[2,3]"));
  CHECK_THROWS_WITH(kept.lerp_(end, at::full({}, 0.5, at::kDouble)), Contains("TensorDict.lerp_(\"a\"): the weight is f64[]"));
  CHECK_THROWS_AS(kept.lerp_(end, at::full({4}, 0.5)), shape_error);  // fits "a" [2,3,4], not ("n", "b") [2,3]
  CHECK_THROWS_WITH(kept.lerp(end, at::full({4}, 0.5)), Contains("the weight f32[4] does not broadcast to the leaf f32[2,3]"));
  CHECK((kept == td).all());
}

TEMPLATE_TEST_CASE("apply over several TensorDicts, named_apply, set_ and cat", "[tensordict]", TensorDict<verbs_schema>, AnyTensorDict) {
  auto td = verbs_td<TestType>();
  const at::Tensor a = td.values()[0], b = td.values()[1];
  auto twice = td * 2;
  auto three = td.apply([](const at::Tensor& x, const at::Tensor& y, const at::Tensor& z) { return x + y + z; }, td, twice);
  CHECK(three.values()[0].equal(a * 4));
  CHECK_THROWS_WITH(td.apply([](const at::Tensor& x, const at::Tensor& y) { return x + y; }, td.unsqueeze(0)),
                    Contains("batch_size=[2,3] and batch_size=[1,2,3] differ"));

  std::vector<std::string> seen;
  auto named = td.named_apply([&](const auto& path, const at::Tensor& t) {
    std::string joined;
    for (const auto& part : path) {
      if (!joined.empty()) joined += '.';
      joined += part;
    }
    seen.push_back(joined);
    return t + 1;
  });
  CHECK(seen == std::vector<std::string>{"a", "n.b"});
  CHECK(named.values()[1].equal(b + 1));

  // set_ writes into the leaf itself; broadcasting is allowed, a wrong shape throws naming both.
  auto copy = td.clone();
  const at::Tensor leaf = copy.values()[0];
  if constexpr (std::is_same_v<TestType, AnyTensorDict>) {
    copy.lock_();
    copy.set_({"a"}, at::ones({4}));
    CHECK_THROWS_WITH(copy.set_({"a"}, at::ones({3})), Contains("cannot write f32[3] into the leaf, which is f32[2,3,4]"));
    CHECK_THROWS_WITH(copy.set_({"x"}, at::ones({3})), Contains("no key \"x\""));
  } else {
    copy.lock_();
    copy.template set_<"a">(at::ones({4}));
    CHECK_THROWS_WITH(copy.template set_<"a">(at::ones({3})), Contains("(\"a\"): cannot write f32[3] into the leaf, which is f32[2,3,4]"));
  }
  CHECK(copy.values()[0].is_same(leaf));
  CHECK(leaf.eq(1).all().template item<bool>());

  auto joined = cat({td, td.index({idx::Slice(0, 1)})}, 0);
  CHECK(joined.batch_size() == c10::IntArrayRef{3, 3});
  CHECK(joined.values()[0].equal(at::cat({a, a.narrow(0, 0, 1)})));
  CHECK(cat({td, td}, -1).values()[1].equal(at::cat({b, b}, 1)));
  CHECK_THROWS_WITH(cat({td, td.unsqueeze(0)}, 0), Contains("has batch_size=[1,2,3]"));
  CHECK(cat({td, td.to(at::kDouble)}, 0).values()[0].scalar_type() == at::kDouble);  // promoted, as torch.cat
  CHECK(stack({td, td.to(at::kDouble)}).values()[0].scalar_type() == at::kDouble);
  CHECK_THROWS_AS(cat({td, td}, 2), index_error);
}

TEMPLATE_TEST_CASE("batch dim names follow the dims", "[tensordict]", TensorDict<verbs_schema>, AnyTensorDict) {
  auto td = verbs_td<TestType>();
  CHECK(tensordict::detail::format_names(td.names()) == "[None, None]");
  td.refine_names({"time", std::nullopt});
  CHECK(tensordict::detail::format_names(td.names()) == "[\"time\", None]");
  td.refine_names({"time", "env"});
  CHECK_THROWS_WITH(td.refine_names({"env", "time"}), Contains("batch dim 0 is named \"time\""));
  CHECK(tensordict::detail::format_names(td.names()) == "[\"time\", \"env\"]");
  CHECK(tensordict::detail::format_names(td.clone().names()) == "[\"time\", \"env\"]");
  CHECK(tensordict::detail::format_names((td + 1).names()) == "[\"time\", \"env\"]");
  CHECK(tensordict::detail::format_names(td.transpose(0, 1).names()) == "[\"env\", \"time\"]");
  CHECK(tensordict::detail::format_names(td.permute({1, 0}).names()) == "[\"env\", \"time\"]");
  CHECK(tensordict::detail::format_names(td.unsqueeze(1).names()) == "[\"time\", None, \"env\"]");
  CHECK(tensordict::detail::format_names(td.unsqueeze(1).squeeze(1).names()) == "[\"time\", \"env\"]");
  CHECK(tensordict::detail::format_names(td.sum(0).names()) == "[None]");  // a new batch shape: names are not guessed
  auto renamed = td.rename({"a", "b"});
  CHECK(tensordict::detail::format_names(renamed.names()) == "[\"a\", \"b\"]");
  CHECK(renamed.values()[0].is_same(td.values()[0]));
  CHECK(tensordict::detail::format_names(td.names()) == "[\"time\", \"env\"]");
  td.rename_({std::nullopt, std::nullopt});
  CHECK(tensordict::detail::format_names(td.names()) == "[None, None]");
  CHECK_THROWS_WITH(td.rename_({"x"}), Contains("1 names [\"x\"] for the 2 batch dims of batch_size=[2,3]"));
  CHECK_THROWS_WITH(td.rename_({"x", "x"}), Contains("the name \"x\" is given to two batch dims"));
}

TEMPLATE_TEST_CASE("keys and items with Python's flags", "[tensordict]", TensorDict<verbs_schema>, AnyTensorDict) {
  auto td = verbs_td<TestType>();
  using P = any_key_path;
  CHECK(td.keys(false) == std::vector<P>{{"a"}, {"n"}});
  CHECK(td.keys(false, true) == std::vector<P>{{"a"}});
  CHECK(td.keys(true) == std::vector<P>{{"a"}, {"n"}, {"n", "b"}});
  CHECK(td.keys(true, true) == std::vector<P>{{"a"}, {"n", "b"}});
  auto items = td.items(true);
  REQUIRE(items.size() == 3);
  CHECK(std::get<at::Tensor>(items[0].second).is_same(td.values()[0]));
  CHECK(std::get<AnyTensorDict>(items[1].second).get("b").is_same(td.values()[1]));
  CHECK(std::get<at::Tensor>(items[2].second).is_same(td.values()[1]));
}

TEST_CASE("make builds a typed TensorDict by key, in any order", "[tensordict]") {
  const at::Tensor w = at::randn({4, 3}), bias = at::randn({4}), w2 = at::randn({1, 4});
  auto td = make<mlp>(kv<"2", "weight">(w2), kv<"0", "weight">(w), kv<"0", "bias">(bias));
  CHECK(impl(td.get<"0", "weight">()) == impl(w));
  CHECK(impl(td.get<"2", "weight">()) == impl(w2));
  CHECK_FALSE(td.is_set(leaf_index_v<mlp, "2", "bias">));
  auto batched = make<linear>({5}, kv<"weight">(at::zeros({5, 2})));
  CHECK(batched.batch_size() == c10::IntArrayRef{5});
  CHECK_THROWS_WITH(make<linear>({5}, kv<"bias">(at::zeros({4}))), Contains("the leaf \"bias\" is f32[4], but its leading dims must be the batch size [5]"));
  auto with_sub = make<mlp>(kv<"0">(make<linear>(kv<"bias">(bias))));
  CHECK(impl(with_sub.get<"0", "bias">()) == impl(bias));

  const AnyTensorDict any({{"a", at::zeros({4})}, {{"b", "c"}, at::ones({4, 2})}}, {4});
  CHECK(any.keys() == std::vector<any_key_path>{{"a"}, {"b", "c"}});
  CHECK(any.batch_size() == c10::IntArrayRef{4});
  CHECK_THROWS_WITH((AnyTensorDict({{"a", at::zeros({4})}, {"a", at::zeros({4})}})), Contains("the key \"a\" is given twice"));
  CHECK_THROWS_WITH((AnyTensorDict({{"a", at::zeros({3})}}, {4})), Contains("\"a\" is f32[3], but its leading dims must be the batch size [4]"));
}

TEST_CASE("select, exclude and rename_key give the sub-schema over the same tensors", "[tensordict]") {
  using three = schema<field<"0", linear>, leaf<"scale">, field<"2", linear>>;
  TensorDict<three> td({at::randn({4, 3}), at::randn({4}), at::ones({2}), at::randn({1, 4}), at::randn({1})}, {}, std::nullopt);
  auto picked = td.select<"2", "scale">();
  static_assert(std::is_same_v<decltype(picked), TensorDict<schema<field<"2", linear>, leaf<"scale">>>>);
  CHECK(impl(picked.get<"2", "bias">()) == impl(td.get<"2", "bias">()));
  CHECK(impl(picked.get<"scale">()) == impl(td.get<"scale">()));
  auto rest = td.exclude<"scale">();
  static_assert(std::is_same_v<decltype(rest), TensorDict<mlp>>);
  CHECK(impl(rest.get<"2", "weight">()) == impl(td.get<"2", "weight">()));
  auto renamed = td.rename_key<"scale", "gain">();
  CHECK(impl(renamed.get<"gain">()) == impl(td.get<"scale">()));
  CHECK(renamed.keys().size() == 5);

  // update replaces the leaves the other sets; update_ writes into them.
  auto target = td.clone();
  TensorDict<schema<field<"2", schema<leaf<"bias">>>>> part({at::full({1}, 5.0)});
  const at::Tensor old_bias = target.get<"2", "bias">();
  target.update(part);
  CHECK(impl(target.get<"2", "bias">()) == impl(part.get<"2", "bias">()));
  target.set<"2", "bias">(old_bias);
  target.update_(part);
  CHECK(impl(target.get<"2", "bias">()) == impl(old_bias));
  CHECK(old_bias.item<float>() == 5.0f);
  target.lock_();
  CHECK_THROWS_AS(target.update(part), lock_error);
  target.update_(part);  // in place is allowed when locked
  TensorDict<schema<field<"2", schema<leaf<"bias">>>>> wrong({at::ones({3})});
  target.unlock_();
  CHECK_THROWS_WITH(target.update_(wrong), Contains("update_((\"2\", \"bias\")): cannot write f32[3] into the leaf, which is f32[1]"));
  TensorDict<schema<field<"2", schema<leaf<"bias">>>>> batched({at::ones({1})}, {});
  auto b2 = td.unsqueeze(0).expand({2});
  CHECK_THROWS_WITH(b2.update(part), Contains("its leading dims must be the batch size [2]"));
  CHECK(impl(b2.get<"2", "bias">()) != impl(part.get<"2", "bias">()));
}

TEST_CASE("the run-time select, exclude, rename_key_ and update", "[tensordict]") {
  AnyTensorDict td({{"a", at::zeros({2})}, {{"n", "b"}, at::ones({2, 3})}, {{"n", "c"}, at::ones({2})}}, {2});
  auto picked = td.select({{"n", "b"}, {"a"}});
  CHECK(picked.keys() == std::vector<any_key_path>{{"n", "b"}, {"a"}});
  CHECK(picked.get("n", "b").is_same(td.get("n", "b")));
  CHECK_THROWS_WITH(td.select({{"x"}}), Contains("no key \"x\" at the top level"));
  CHECK(td.select({{"x"}, {"a"}}, false).keys() == std::vector<any_key_path>{{"a"}});
  auto rest = td.exclude({{"n", "b"}, {"missing"}});
  CHECK(rest.keys() == std::vector<any_key_path>{{"a"}, {"n", "c"}});
  CHECK(td.keys().size() == 3);

  td.rename_key_({"n", "b"}, {"m", "d"});
  CHECK(td.keys() == std::vector<any_key_path>{{"a"}, {"n", "c"}, {"m", "d"}});
  td.rename_key_({"n"}, {"k"});
  CHECK(td.get_tensordict("k").get("c").sizes() == c10::IntArrayRef{2});
  CHECK_THROWS_WITH(td.rename_key_({"a"}, {"k"}, true), Contains("the new key exists"));
  td.lock_();
  CHECK_THROWS_AS(td.rename_key_({"a"}, {"z"}), lock_error);
  td.unlock_();

  AnyTensorDict other({{"a", at::full({2}, 3.0)}, {{"new", "x"}, at::ones({2})}}, {2});
  const at::Tensor a = td.get("a");
  td.update(other);
  CHECK(td.get("a").is_same(other.get("a")));
  CHECK(td.get("new", "x").is_same(other.get("new", "x")));
  td.set("a", a);
  AnyTensorDict only_a({{"a", at::full({2}, 4.0)}}, {2});
  td.update_(only_a);
  CHECK(td.get("a").is_same(a));
  CHECK(a.eq(4).all().item<bool>());
  CHECK_THROWS_WITH(td.update_(AnyTensorDict({{"zz", at::ones({2})}}, {2})), Contains("no key \"zz\""));
  td.lock_();
  CHECK_THROWS_AS(td.update(only_a), lock_error);
  td.update_(only_a);  // in place is allowed when locked
  td.unlock_();
  CHECK_THROWS_WITH(td.update(AnyTensorDict({{{"a", "x"}, at::ones({2})}}, {2})), Contains("update((\"a\", \"x\")): \"a\" holds a tensor"));
}

// ---- dicts, lazy stacks, tensorclasses ------------------------------------------------------

TEST_CASE("to_dict and from_dict, flat, ordered and nested, both ways", "[tensordict]") {
  auto td = make_mlp({2});
  auto flat = to_dict(td);
  CHECK(flat.size() == 4);
  CHECK(impl(flat.at("2.bias")) == impl(td.get<"2", "bias">()));
  auto sd = to_state_dict(td);
  CHECK(sd.keys() == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  auto nested = to_nested_dict(td);
  CHECK(impl(nested.dicts.at("0").tensors.at("weight")) == impl(td.get<"0", "weight">()));

  // Without a batch size, from_dict takes the leading shape every leaf shares, as Python does.
  auto back = from_dict(flat);
  CHECK(back.batch_size() == c10::IntArrayRef{2});
  CHECK(back.get("0", "weight").is_same(td.get<"0", "weight">()));
  CHECK(from_dict(flat, std::vector<std::int64_t>{}).batch_size().empty());
  CHECK(from_dict(sd, std::vector<std::int64_t>{2}).keys() == AnyTensorDict(td).keys());
  CHECK(from_dict(nested).get("2", "bias").is_same(td.get<"2", "bias">()));
  // Python's batch-size setters: td.batch_size = [...] (checked) and auto_batch_size_.
  auto resized = from_dict(flat, std::vector<std::int64_t>{});
  resized.set_batch_size({2});
  CHECK(resized.batch_size() == c10::IntArrayRef{2});
  CHECK(resized.get("0", "weight").is_same(td.get<"0", "weight">()));
  CHECK_THROWS_WITH(resized.set_batch_size({3}), Contains("the nested TensorDict \"0\" has batch_size=[2], which does not start with [3]"));
  CHECK(resized.batch_size() == c10::IntArrayRef{2});  // unchanged by the failed call
  CHECK(resized.set_batch_size({}).auto_batch_size_().batch_size() == c10::IntArrayRef{2});
  auto typed_resized = td;
  CHECK(typed_resized.set_batch_size({}).batch_size().empty());
  CHECK(typed_resized.auto_batch_size_(1).batch_size() == c10::IntArrayRef{2});
  CHECK(td.batch_size() == c10::IntArrayRef{2});

  // An empty sub-TensorDict (a ReLU's params) stays, as Python keeps it.
  AnyTensorDict with_empty({2});
  with_empty.set("0", "weight", at::ones({2, 3}));
  with_empty.set("1", AnyTensorDict({2}));
  const auto round_trip = from_dict(to_nested_dict(with_empty));
  CHECK(round_trip.keys(true, false) == with_empty.keys(true, false));
  CHECK(round_trip.get_tensordict("1").empty());
  auto typed = from_dict<mlp>(sd);
  CHECK(impl(typed.get<"0", "bias">()) == impl(td.get<"0", "bias">()));
  flat.erase("0.bias");
  CHECK_THROWS_WITH(from_dict<mlp>(flat), Contains("(\"0\", \"bias\"): missing"));
  CHECK_THROWS_WITH(from_dict(flat, std::vector<std::int64_t>{3}), Contains("leading dims must be the batch size [3]"));

  // The state-dict shape is what module code copies parameters from.
  torch::nn::Linear source(3, 2), target(3, 2);
  AnyTensorDict params;
  for (const auto& p : source->named_parameters()) params.set({p.key()}, p.value());
  const auto state = to_state_dict(params);
  torch::NoGradGuard no_grad;
  for (auto& p : target->named_parameters()) p.value().copy_(state[p.key()]);
  CHECK(target->weight.equal(source->weight));
}

TEST_CASE("lazy_stack keeps the originals and stacks leaves on demand", "[tensordict]") {
  AnyTensorDict a({{"obs", at::ones({4, 3})}, {"r", at::zeros({4})}}, {4});
  AnyTensorDict b({{"obs", at::ones({4, 5})}, {"r", at::ones({4})}, {"extra", at::ones({4})}}, {4});
  auto lazy = lazy_stack(std::vector{a, b});
  CHECK(lazy.batch_size() == c10::IntArrayRef{2, 4});
  CHECK(lazy[1].is_same(b));
  CHECK(lazy[-2].is_same(a));
  CHECK(lazy.unbind()[0].get("obs").is_same(a.get("obs")));
  CHECK(lazy.keys() == std::vector<any_key_path>{{"obs"}, {"r"}});
  CHECK(lazy.get("r").sizes() == c10::IntArrayRef{2, 4});
  CHECK(lazy.get("r")[1].equal(b.get("r")));
  CHECK_THROWS_WITH(lazy.get("obs"), Contains("the leaf is f32[4,3] in TensorDict 0 but f32[4,5] in TensorDict 1, so it cannot be stacked"));
  auto padded = lazy.get_padded({"obs"}, -1);
  CHECK(padded.sizes() == c10::IntArrayRef{2, 4, 5});
  CHECK(padded[0].narrow(1, 3, 2).eq(-1).all().item<bool>());
  CHECK(padded[1].equal(b.get("obs")));
  CHECK_THROWS_WITH(lazy.get("extra"), Contains("TensorDict 0 has no such key"));
  CHECK(printed(lazy) == "LazyStackedTensorDict(batch_size=[2,4], stack_dim=0, fields={obs: f32[2,4,-1], r: f32[2,4]})");
  CHECK(lazy.apply([](const at::Tensor& t) { return t * 2; }).get("r")[1].eq(2).all().item<bool>());
  CHECK_THROWS_WITH(lazy.contiguous(), Contains("stack"));
  CHECK_THROWS_WITH(lazy_stack(std::vector{a, a.unsqueeze(0)}), Contains("has batch_size=[1,4]"));

  auto on_dim1 = lazy_stack(std::vector{a, a}, 1);
  CHECK(on_dim1.batch_size() == c10::IntArrayRef{4, 2});
  CHECK(on_dim1.get("obs").sizes() == c10::IntArrayRef{4, 2, 3});

  auto typed = lazy_stack(std::vector{make_mlp({3}), make_mlp({3})});
  CHECK(typed.get<"0", "weight">().sizes() == c10::IntArrayRef{2, 3, 4, 3});
  CHECK(typed.contiguous().batch_size() == c10::IntArrayRef{2, 3});
}

namespace {
struct Step {
  at::Tensor obs, reward;
  TENSORDICT_TENSORCLASS(Step, obs, reward)
};
struct Transition {
  at::Tensor obs, action;
  Step next;
  TENSORDICT_TENSORCLASS(Transition, obs, action, next)
};
}  // namespace

TEST_CASE("a tensorclass is a struct with the TensorDict verbs", "[tensordict]") {
  static_assert(std::is_same_v<Transition::schema_t,
                               schema<leaf<"obs">, leaf<"action">, field<"next", schema<leaf<"obs">, leaf<"reward">>>>>);
  const at::Tensor obs = at::randn({5, 3}), action = at::randn({5}), next_obs = at::randn({5, 3}), reward = at::randn({5});
  Transition t{.obs = obs, .action = action, .next = {.obs = next_obs, .reward = reward}, .batch_size = {5}};
  auto td = t.to_tensordict();
  CHECK(impl(td.get<"next", "reward">()) == impl(reward));
  CHECK(td.batch_size() == c10::IntArrayRef{5});

  Transition first = t[0];
  CHECK(first.batch_size.empty());
  CHECK(first.next.reward.equal(reward[0]));
  CHECK(shares(first.obs, obs));
  Transition picked = t.index({at::tensor(std::vector<std::int64_t>{4, 0})});
  CHECK(picked.batch_size == std::vector<std::int64_t>{2});
  CHECK(picked.action[0].equal(action[4]));
  auto batch = stack(std::vector{t, t});
  CHECK(batch.batch_size == std::vector<std::int64_t>{2, 5});
  CHECK(batch.next.obs[1].equal(next_obs));
  CHECK(cat(std::vector{t, t}).obs.sizes() == c10::IntArrayRef{10, 3});
  CHECK(t.to(at::kDouble).next.reward.scalar_type() == at::kDouble);
  CHECK(t.to(at::Device(at::kMeta)).obs.device().is_meta());
  CHECK(t.apply([](const at::Tensor& x) { return x * 0; }).obs.eq(0).all().item<bool>());
  CHECK(t.flatten_keys().get<"next.reward">().is_same(reward));

  Transition partial{.obs = obs, .action = {}, .next = {}, .batch_size = {5}};  // unset members are unset leaves
  CHECK(partial.to_tensordict().keys().size() == 1);
  CHECK_THROWS_WITH((Transition{.obs = obs, .action = {}, .next = {}, .batch_size = {4}}).to_tensordict(), Contains("the leaf \"obs\" is f32[5,3]"));

  const std::string bytes = save_safetensors_to_string(t.to_tensordict());
  Transition loaded = Transition::from_tensordict(load_safetensors_from_string(bytes).to_typed<Transition::schema_t>());
  CHECK(loaded.next.obs.equal(next_obs));
}

TEST_CASE("TensorDict: a nested level may add batch dims of its own, kept by the verbs", "[tensordict][nested_batch]") {
  // Python: TensorDict({"obs": TensorDict({"x": ...}, [4, 3, 2]), "inner": {"deep": {"z": ...}}, "y": ...}, [4, 3]).
  using observation = schema<leaf<"x">>;
  using nested = schema<field<"obs", observation>, field<"inner", schema<field<"deep", schema<leaf<"z">>>>>, leaf<"y">>;
  TensorDict<nested> td(c10::IntArrayRef{4, 3});
  td.set<"y">(at::zeros({4, 3}));
  td.set<"inner", "deep", "z">(at::zeros({4, 3, 5}));
  TensorDict<observation> obs(c10::IntArrayRef{4, 3, 2});
  obs.set<"x">(at::arange(24).reshape({4, 3, 2}).to(at::kFloat));
  td.set<"obs">(obs);
  CHECK(td.get<"obs">().batch_size() == c10::IntArrayRef{4, 3, 2});
  CHECK(td.get<"inner", "deep">().batch_size() == c10::IntArrayRef{4, 3});
  CHECK(printed(td) == "TensorDict(batch_size=[4,3], fields={inner: {deep: {z: f32[4,3,5]}}, obs: {batch_size=[4,3,2], x: f32[4,3,2]}, y: f32[4,3]})");
  CHECK(printed(td.get<"inner">()) == "TensorDict(batch_size=[4,3], fields={deep: {z: f32[4,3,5]}})");
  // A level with nothing set prints empty; with dims of its own, its batch size alone (as AnyTensorDict prints it).
  TensorDict<nested> unset(c10::IntArrayRef{4, 3});
  unset.set<"obs">(TensorDict<observation>(c10::IntArrayRef{4, 3, 2}));
  CHECK(printed(unset) == "TensorDict(batch_size=[4,3], fields={inner: {deep: {}}, obs: {batch_size=[4,3,2]}})");
  CHECK_THROWS_WITH((td.set<"obs", "x">(at::zeros({4, 3}))), Contains("must be the batch size [4,3,2]"));
  CHECK_THROWS_WITH((td.set<"obs">(TensorDict<observation>(c10::IntArrayRef{4}))),
                    Contains("expected a TensorDict whose batch_size starts with [4,3], got batch_size=[4]"));
  auto obs_batch = [](const TensorDict<nested>& t) { return t.get<"obs">().batch_size().vec(); };
  CHECK(obs_batch(td[1]) == std::vector<std::int64_t>{3, 2});
  CHECK(obs_batch(td.reshape({12})) == std::vector<std::int64_t>{12, 2});
  CHECK(obs_batch(td.permute({1, 0})) == std::vector<std::int64_t>{3, 4, 2});
  CHECK(obs_batch(td.clone()) == std::vector<std::int64_t>{4, 3, 2});
  CHECK(obs_batch(td * td) == std::vector<std::int64_t>{4, 3, 2});
  CHECK(obs_batch(td.sum(1)) == std::vector<std::int64_t>{4, 2});
  CHECK(td.sum().get<"obs">().batch_size().empty());
  CHECK(td.sum().get<"obs", "x">().item<float>() == 276.f);
  CHECK(obs_batch(stack({td, td}, 0)) == std::vector<std::int64_t>{2, 4, 3, 2});
  CHECK(obs_batch(cat({td, td}, 1)) == std::vector<std::int64_t>{4, 6, 2});
  CHECK(td.select<"obs">().get<"obs">().batch_size() == c10::IntArrayRef{4, 3, 2});
  CHECK(td.exclude<"y">().get<"obs">().batch_size() == c10::IntArrayRef{4, 3, 2});
  CHECK(td.rename_key<"obs", "o">().get<"o">().batch_size() == c10::IntArrayRef{4, 3, 2});
  CHECK(AnyTensorDict(td).get_tensordict("obs").batch_size() == c10::IntArrayRef{4, 3, 2});
  // Python's setter and auto_batch_size_.
  auto resized = td.clone();
  resized.set_batch_size({4});
  CHECK(obs_batch(resized) == std::vector<std::int64_t>{4, 3, 2});
  CHECK(resized.get<"inner">().batch_size() == c10::IntArrayRef{4, 3});
  CHECK_THROWS_WITH(resized.set_batch_size({4, 5}), Contains("the nested TensorDict \"obs\" has batch_size=[4,3,2], which does not start with [4,5]"));
  auto automatic = TensorDict<nested>({at::zeros({4, 3, 2}), at::zeros({4, 3, 5}), at::zeros({4, 3})});
  automatic.auto_batch_size_();
  CHECK(automatic.batch_size() == c10::IntArrayRef{4, 3});
  CHECK(obs_batch(automatic) == std::vector<std::int64_t>{4, 3, 2});
  CHECK(automatic.get<"inner", "deep">().batch_size() == c10::IntArrayRef{4, 3, 5});
  CHECK(automatic.get<"inner">().batch_size() == c10::IntArrayRef{4, 3, 5});
  automatic.auto_batch_size_(1);
  CHECK(obs_batch(automatic) == std::vector<std::int64_t>{4});
}
