#include <optional>
#include <sstream>

#include "catch_torch.hpp"
#include "test_helpers.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>

#include <tensordict/any_tensordict.hpp>
#include <tensordict/vmap.hpp>

using namespace tensordict;
using test::impl;
using test::printed;
using test::Contains;
namespace idx = at::indexing;

namespace {
using linear = schema<leaf<"weight">, leaf<"bias">>;
using mlp = schema<field<"0", linear>, field<"2", linear>>;

AnyTensorDict make_mlp(c10::IntArrayRef batch = {}) {
  std::vector<std::int64_t> b(batch.begin(), batch.end());
  auto shape = [&](std::initializer_list<std::int64_t> own) {
    std::vector<std::int64_t> s = b;
    s.insert(s.end(), own);
    return s;
  };
  AnyTensorDict td(batch);
  td.set("0", "weight", at::randn(shape({4, 3})));
  td.set("0", "bias", at::randn(shape({4})));
  td.set("2", "weight", at::randn(shape({1, 4})));
  td.set("2", "bias", at::randn(shape({1})));
  return td;
}

}  // namespace

TEST_CASE("AnyTensorDict: set creates sub-trees, get returns the stored tensor", "[any_tensordict]") {
  at::Tensor w = at::randn({4, 3});
  AnyTensorDict td;
  td.set("0", "weight", w);
  CHECK(impl(td.get("0", "weight")) == impl(w));
  CHECK(impl(td.get(any_key_path{"0", "weight"})) == impl(w));
  CHECK(td.contains("0", "weight"));
  CHECK(td.contains("0"));
  CHECK_FALSE(td.contains("0", "bias"));
  CHECK(td.is_leaf({"0", "weight"}));
  CHECK_FALSE(td.is_leaf({"0"}));
  CHECK(td.level_keys() == std::vector<std::string>{"0"});
  CHECK(td.keys() == std::vector<any_key_path>{{"0", "weight"}});
}

TEST_CASE("AnyTensorDict: a sub-tree is a view sharing leaves, batch size and locks", "[any_tensordict]") {
  auto td = make_mlp({2});
  auto first = td.get_tensordict("0");
  CHECK(first.batch_size() == c10::IntArrayRef{2});
  at::Tensor w = at::ones({2, 4, 3});
  first.set("weight", w);
  CHECK(impl(td.get("0", "weight")) == impl(w));
  td.lock_();
  CHECK(first.is_locked());
  CHECK_THROWS_AS(first.set("weight", w), lock_error);
  CHECK_THROWS_WITH(first.unlock_(), Contains("part of a locked TensorDict"));
  td.unlock_();
  CHECK_FALSE(first.is_locked());
}

TEST_CASE("AnyTensorDict: errors name the key path and the keys available there", "[any_tensordict]") {
  auto td = make_mlp();
  CHECK_THROWS_AS(td.get("0", "wieght"), key_error);
  CHECK_THROWS_WITH(td.get("0", "wieght"),
                    Contains("(\"0\", \"wieght\")") && Contains("no key \"wieght\" under \"0\"") &&
                        Contains("the keys there are \"bias\", \"weight\""));
  CHECK_THROWS_WITH(td.get("1"), Contains("at the top level") && Contains("\"0\", \"2\""));
  CHECK_THROWS_WITH(td.get("0"), Contains("holds a sub-tree") && Contains("get_tensordict"));
  CHECK_THROWS_WITH(td.get_tensordict("0", "weight"), Contains("holds a tensor (f32[4,3])"));
  CHECK_THROWS_WITH(td.get("0", "weight", "x"), Contains("goes on after the leaf (\"0\", \"weight\")"));
  CHECK_THROWS_WITH(td.set("0", "weight", "x", at::ones({1})), Contains("holds a tensor"));
}

TEST_CASE("AnyTensorDict: a failed set changes nothing", "[any_tensordict]") {
  AnyTensorDict td({3});
  td.set("a", at::zeros({3, 2}));
  CHECK_THROWS_AS(td.set("b", "c", at::zeros({4, 2})), shape_error);
  CHECK_THROWS_WITH(td.set("b", "c", at::zeros({4, 2})),
                    Contains("(\"b\", \"c\") is f32[4,2]") && Contains("batch size [3]"));
  CHECK_FALSE(td.contains("b"));
  CHECK(td.level_keys().size() == 1);
  td.lock_();
  CHECK_THROWS_AS(td.set("b", "c", at::zeros({3})), lock_error);
  CHECK_FALSE(td.contains("b"));
}

TEST_CASE("AnyTensorDict: set of a sub-tree and erase", "[any_tensordict]") {
  auto td = make_mlp();
  AnyTensorDict layer;
  at::Tensor w = at::ones({2, 2});
  layer.set("weight", w);
  td.set("4", layer);
  CHECK(impl(td.get("4", "weight")) == impl(w));
  CHECK_FALSE(td.get_tensordict("4").is_same(layer));  // a new node holding the same tensors
  td.erase("0");
  CHECK(td.level_keys() == std::vector<std::string>{"2", "4"});
  CHECK_THROWS_AS(td.erase("0"), key_error);
  AnyTensorDict batched({5});
  auto pairs = make_mlp({2});
  CHECK_THROWS_WITH(pairs.set("5", batched), Contains("expected a TensorDict whose batch_size starts with [2], got batch_size=[5]"));
}

TEST_CASE("AnyTensorDict: prints as the typed TensorDict", "[any_tensordict]") {
  auto any = make_mlp({2});
  TensorDict<mlp> typed = any.to_typed<mlp>();
  CHECK(printed(any) == typed.repr());
  CHECK(printed(any) ==
        "TensorDict(batch_size=[2], fields={0: {bias: f32[2,4], weight: f32[2,4,3]}, 2: {bias: f32[2,1], weight: f32[2,1,4]}})");
  CHECK(any.repr(print_style::multiline) == typed.repr(print_style::multiline));
}

TEST_CASE("AnyTensorDict: apply, clone, detach, zero_, to", "[any_tensordict]") {
  auto td = make_mlp({2});
  auto doubled = td.apply([](const at::Tensor& t) { return t * 2; });
  CHECK(doubled.get("0", "weight").equal(td.get("0", "weight") * 2));
  auto cloned = td.clone();
  CHECK(impl(cloned.get("2", "bias")) != impl(td.get("2", "bias")));
  CHECK((cloned == td).all());
  at::Tensor r = at::randn({3}).requires_grad_();
  AnyTensorDict g;
  g.set("r", r * 1);
  CHECK_FALSE(g.detach().get("r").requires_grad());
  at::Tensor before = td.get("0", "weight");
  td.zero_();
  CHECK(impl(td.get("0", "weight")) == impl(before));
  CHECK(before.eq(0).all().item<bool>());
  CHECK(td.to(at::kDouble).get("0", "bias").scalar_type() == at::kDouble);
  auto td_f64 = td.to(at::kDouble);
  CHECK(td_f64.get("0", "bias").scalar_type() == at::kDouble);
  CHECK(td.to(at::Device(at::kCPU)).device() == at::Device(at::kCPU));

  // apply_ computes every result before writing one
  auto small = make_mlp();
  auto copy = small.clone();
  int calls = 0;
  CHECK_THROWS(small.apply_([&](at::Tensor& t) -> at::Tensor {
    if (++calls == 3) throw std::runtime_error("boom");
    return t + 1;
  }));
  CHECK((small == copy).all());

  // apply with a new batch size; results must fit it
  auto first = make_mlp({2}).apply([](const at::Tensor& t) { return t[0]; }, {});
  CHECK(first.batch_size().empty());
  CHECK_THROWS_AS(make_mlp({2}).apply([](const at::Tensor& t) { return t; }, {3}), shape_error);
}

TEST_CASE("AnyTensorDict: comparisons", "[any_tensordict]") {
  auto a = make_mlp();
  auto b = a.clone();
  CHECK((a == b).all());
  CHECK_FALSE((a != b).any());
  b.get("0", "bias").add_(1);
  CHECK_FALSE((a == b).all());
  CHECK((a == a.get("0", "bias").new_zeros({}).item()).get("0", "weight").sizes() == c10::IntArrayRef{4, 3});
  b.erase("2", "bias");
  CHECK_THROWS_WITH(a == b, Contains("(\"2\", \"bias\") is set on one side only"));
  CHECK_THROWS_WITH(b == a, Contains("(\"2\", \"bias\") is set on one side only"));
}

TEST_CASE("AnyTensorDict: index, unbind, expand, stack, cat", "[any_tensordict]") {
  auto td = make_mlp({3, 2});
  auto row = td[1];
  CHECK(row.batch_size() == c10::IntArrayRef{2});
  CHECK(row.get("0", "weight").equal(td.get("0", "weight")[1]));
  auto sliced = td.index({idx::Slice(), 0});
  CHECK(sliced.batch_size() == c10::IntArrayRef{3});
  CHECK_THROWS_AS(td.index({0, 0, 0}), index_error);

  auto parts = td.unbind(1);
  REQUIRE(parts.size() == 2);
  CHECK(parts[1].get("2", "bias").equal(td.get("2", "bias").select(1, 1)));
  CHECK_THROWS_WITH(td.unbind(2), Contains("dim 2 is out of range for batch_size=[3,2]"));

  auto single = make_mlp({1});
  auto wide = single.expand({4, 5, -1});
  CHECK(wide.batch_size() == c10::IntArrayRef{4, 5, 1});
  CHECK(wide.get("0", "weight").sizes() == c10::IntArrayRef{4, 5, 1, 4, 3});
  CHECK_THROWS_AS(td.expand({2}), shape_error);

  auto stacked = stack(parts, 0);
  CHECK(stacked.batch_size() == c10::IntArrayRef{2, 3});
  CHECK(stacked.get("0", "bias").equal(td.get("0", "bias").transpose(0, 1)));
  CHECK(stack({parts[0], parts[1]}, 1).get("0", "weight").equal(td.get("0", "weight")));
  auto other = make_mlp({3});
  other.erase("2", "bias");
  CHECK_THROWS_WITH(stack({parts[0], other}), Contains("(\"2\", \"bias\") is in TensorDict 0 but not in TensorDict 1"));
  // Leaves of other dtypes promote, as torch.stack and torch.cat (bool and int64 give int64).
  const auto promoted = stack({parts[0], parts[1].to(at::kDouble)});
  CHECK(promoted.get("0", "weight").scalar_type() == at::kDouble);
  AnyTensorDict flags({2}), counts({2});
  flags.set("x", at::tensor({1, 0}).to(at::kBool));
  counts.set("x", at::tensor({int64_t{3}, int64_t{4}}));
  CHECK(cat({flags, counts}).get("x").equal(at::tensor({int64_t{1}, int64_t{0}, int64_t{3}, int64_t{4}})));
  CHECK(stack({flags, counts}).get("x").scalar_type() == at::kLong);

  auto joined = cat({td, td}, 0);
  CHECK(joined.batch_size() == c10::IntArrayRef{6, 2});
  CHECK_THROWS_AS(cat({td, make_mlp({3, 1})}, 0), shape_error);
}

TEST_CASE("AnyTensorDict: flatten_keys and unflatten_keys keep the tensors", "[any_tensordict]") {
  auto td = make_mlp();
  auto flat = td.flatten_keys();
  CHECK(flat.level_keys() == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  CHECK(impl(flat.get("0.weight")) == impl(td.get("0", "weight")));
  auto back = flat.unflatten_keys();
  CHECK(back.keys() == td.keys());
  CHECK(impl(back.get("2", "bias")) == impl(td.get("2", "bias")));
  CHECK(td.flatten_keys("/").contains("0/weight"));

  AnyTensorDict clash;
  clash.set("a", at::zeros({1}));
  clash.set("a.b", at::zeros({1}));
  CHECK_THROWS_WITH(clash.unflatten_keys(), Contains("(\"a\", \"b\") needs \"a\" to be a sub-tree, but it is a leaf"));
  AnyTensorDict clash2;
  clash2.set("a", "b", at::zeros({1}));
  clash2.set("a.b", at::zeros({1}));
  CHECK_THROWS_WITH(clash2.flatten_keys(), Contains("two leaves flatten to \"a.b\""));
}

TEST_CASE("AnyTensorDict: typed -> erased -> typed is lossless and keeps the tensors", "[any_tensordict]") {
  TensorDict<mlp> typed({at::randn({2, 4, 3}), at::Tensor(), at::randn({2, 1, 4}), at::randn({2, 1})}, {2});
  AnyTensorDict any = typed;  // implicit, no copies
  CHECK(any.batch_size() == c10::IntArrayRef{2});
  CHECK_FALSE(any.contains("0", "bias"));  // unset leaves are absent, as in Python
  CHECK(impl(any.get("0", "weight")) == impl(typed.get<"0", "weight">()));
  auto back = any.to_typed<mlp>({.allow_missing = true});  // ("0", "bias") is unset on both sides
  for (std::size_t i = 0; i < mlp::leaf_count; ++i) {
    CHECK(back.is_set(i) == typed.is_set(i));
    if (typed.is_set(i)) CHECK(impl(back.leaf(i)) == impl(typed.leaf(i)));
  }
  CHECK(any.to_typed(typed).get<"2", "bias">().is_same(typed.get<"2", "bias">()));
  typed.lock_();
  CHECK(AnyTensorDict(typed).is_locked());
}

TEST_CASE("AnyTensorDict: erased -> typed lists every difference in one error", "[any_tensordict]") {
  TensorDict<mlp> like({at::randn({4, 3}), at::randn({4}), at::randn({1, 4}), at::randn({1})});
  AnyTensorDict any;
  any.set("0", "weight", at::randn({4, 5}));                    // wrong shape
  any.set("0", "bias", at::randn({4}).to(at::kDouble));         // wrong dtype
  any.set("2", "weigth", at::randn({1, 4}));                    // typo: not in the schema
  // ("2", "weight") and ("2", "bias") missing
  try {
    (void)any.to_typed(like);
    FAIL("expected key_error");
  } catch (const key_error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Contains("(\"0\", \"weight\"): expected f32[4,3], got f32[4,5]"));
    CHECK_THAT(msg, Contains("(\"0\", \"bias\"): expected f32[4], got f64[4]"));
    CHECK_THAT(msg, Contains("(\"2\", \"weigth\"): not a leaf of the schema (f32[1,4])"));
    CHECK_THAT(msg, Contains("(\"2\", \"weight\"): missing (expected f32[1,4])"));
    CHECK_THAT(msg, Contains("(\"2\", \"bias\"): missing (expected f32[1])"));
  }
  // Without a reference: every leaf of the schema must be there (issue 12, defect 5: a missing
  // one was accepted silently), unless allow_missing leaves it unset.
  AnyTensorDict partial({3});
  partial.set("0", "weight", at::randn({3, 4, 3}));
  CHECK_THROWS_AS(partial.to_typed<mlp>(), key_error);
  CHECK_THROWS_WITH(partial.to_typed<mlp>(), Contains("(\"0\", \"bias\"): missing") && Contains("(\"2\", \"weight\"): missing") &&
                                                 Contains("allow_missing"));
  auto typed = partial.to_typed<mlp>({.allow_missing = true});
  CHECK(typed.is_set(0));
  CHECK_FALSE(typed.is_set(1));
  partial.set("extra", at::randn({3}));
  CHECK_THROWS_WITH(partial.to_typed<mlp>({.allow_missing = true}), Contains("\"extra\": not a leaf of the schema"));
}

TEST_CASE("AnyTensorDict: vmap maps over an AnyTensorDict", "[any_tensordict]") {
  auto params = make_mlp({5});
  auto x = at::randn({7, 3});
  auto f = [](const AnyTensorDict& p, const at::Tensor& input) {
    return at::linear(input, p.get("0", "weight"), p.get("0", "bias"));
  };
  at::Tensor mapped = vmap(f, {0, std::nullopt})(params, x);
  at::Tensor chunked = vmap(f, {0, std::nullopt}, {.chunk_size = 2})(params, x);
  for (std::int64_t i = 0; i < 5; ++i) {
    CHECK(at::allclose(mapped[i], f(params[i], x), 1e-5, 1e-6));
    CHECK(at::allclose(chunked[i], f(params[i], x), 1e-5, 1e-6));
  }
  auto returns_td = [](const AnyTensorDict& p) { return p.apply([](const at::Tensor& t) { return t * 2; }); };
  auto out = vmap(returns_td, {}, {.chunk_size = 2})(params);
  CHECK(out.batch_size() == c10::IntArrayRef{5});
  CHECK(out.get("2", "bias").equal(params.get("2", "bias") * 2));
}

TEST_CASE("AnyTensorDict: a sub-view outlives the tree above it (any order of destruction)", "[any_tensordict]") {
  // Issue 12, defect 1: the view kept a raw parent pointer; unlock_ then read freed memory (ASan).
  std::optional<AnyTensorDict> sub;
  {
    auto root = make_mlp({2});
    root.lock_();
    sub = root.get_tensordict("0");
    CHECK_THROWS_AS(sub->unlock_(), lock_error);
  }
  CHECK(sub->is_locked());
  sub->unlock_();  // nothing above it is left to hold the lock
  CHECK_FALSE(sub->is_locked());
  sub->set("weight", at::ones({2, 4, 3}));
  CHECK(sub->get("weight").sum().item<float>() == 24.0f);
}

TEST_CASE("AnyTensorDict: to(device) builds the result on the target device; index() follows the index", "[any_tensordict]") {
  // Issue 12, defect 2, erased form.
  AnyTensorDict td({3}, at::Device(at::kCPU));
  td.set("0", "weight", at::randn({3, 4, 3}));
  td.set("b", at::randn({3}));
  auto meta = td.to(at::Device(at::kMeta));
  CHECK(meta.device() == at::Device(at::kMeta));
  for (const at::Tensor& t : meta.values()) CHECK(t.device().is_meta());
  auto picked = meta.index({at::tensor({0, 2}, at::kLong).to(at::kMeta)});
  CHECK(picked.batch_size() == c10::IntArrayRef{2});
  CHECK(picked.get("0", "weight").device().is_meta());
}

TEST_CASE("AnyTensorDict: stack and cat name the key path of a leaf whose shapes differ", "[any_tensordict]") {
  // Issue 12, defect 5: the message said "a leaf is f32[4,3] ... but f32[4,5]" without its path.
  auto a = make_mlp();
  auto b = make_mlp();
  b.set("0", "weight", at::randn({4, 5}));
  CHECK_THROWS_AS(stack({a, b}), shape_error);
  CHECK_THROWS_WITH(stack({a, b}), Contains("(\"0\", \"weight\") is f32[4,3] in TensorDict 0 but f32[4,5] in TensorDict 1"));
  auto c = make_mlp({2});
  auto d = make_mlp({3});
  d.set("2", "bias", at::randn({3, 2}));
  CHECK_THROWS_AS(cat({c, d}), shape_error);
  CHECK_THROWS_WITH(cat({c, d}), Contains("(\"2\", \"bias\") is f32[2,1] in TensorDict 0 but f32[3,2] in TensorDict 1"));
}

namespace {
// Python: TensorDict({"sub": TensorDict({"x": zeros(4, 3, 2)}, [4,3,2]), "y": zeros(4, 3)}, [4,3]).
AnyTensorDict with_longer_nested_batch() {
  AnyTensorDict sub({{"x", at::arange(24).reshape({4, 3, 2}).to(at::kFloat)}}, {4, 3, 2});
  AnyTensorDict td({{"y", at::arange(12).reshape({4, 3}).to(at::kFloat)}}, {4, 3});
  td.set("sub", sub);
  return td;
}
c10::IntArrayRef sub_batch(const AnyTensorDict& td) { return td.get_tensordict("sub").batch_size(); }
}  // namespace

TEST_CASE("AnyTensorDict: a nested level may add batch dims of its own, as in Python", "[any_tensordict][nested_batch]") {
  auto td = with_longer_nested_batch();
  CHECK(td.batch_size() == c10::IntArrayRef{4, 3});
  CHECK(sub_batch(td) == c10::IntArrayRef{4, 3, 2});
  CHECK(printed(td) == "TensorDict(batch_size=[4,3], fields={sub: {batch_size=[4,3,2], x: f32[4,3,2]}, y: f32[4,3]})");
  // A leaf under it starts with its batch size; a sub-tree set there may add more.
  CHECK_THROWS_WITH(td.set("sub", "z", at::zeros({4, 3})), Contains("must be the batch size [4,3,2]"));
  td.set("sub", "z", at::zeros({4, 3, 2, 7}));
  td.set("sub", "deeper", AnyTensorDict({{"w", at::zeros({4, 3, 2, 5})}}, {4, 3, 2, 5}));
  CHECK(td.get_tensordict("sub", "deeper").batch_size() == c10::IntArrayRef{4, 3, 2, 5});
  CHECK_THROWS_WITH(td.set("bad", AnyTensorDict({}, {4})), Contains("whose batch_size starts with [4,3], got batch_size=[4]"));
  // A sub-tree that set creates on the way takes its parent's.
  td.set("sub", "new", "v", at::zeros({4, 3, 2}));
  CHECK(td.get_tensordict("sub", "new").batch_size() == c10::IntArrayRef{4, 3, 2});
  // Moving an entry checks it against the level that will hold it.
  CHECK_THROWS_WITH(td.rename_key_({"y"}, {"sub", "y"}), Contains("does not start with the batch size [4,3,2]"));
  td.rename_key_({"sub", "deeper"}, {"deeper"});
  CHECK(td.get_tensordict("deeper").batch_size() == c10::IntArrayRef{4, 3, 2, 5});
  // A nested view cannot name dims the root does not have.
  CHECK_THROWS_WITH(td.get_tensordict("sub").rename_({"a", "b", "c"}), Contains("longer than the root's 2 batch dims"));
  CHECK(td.get_tensordict("sub").names().size() == 3);
}

TEST_CASE("AnyTensorDict: verbs on the batch dims keep a nested level's own dims", "[any_tensordict][nested_batch]") {
  const auto td = with_longer_nested_batch();
  CHECK(sub_batch(td[1]) == c10::IntArrayRef{3, 2});
  CHECK(sub_batch(td.index({idx::Slice(), 0})) == c10::IntArrayRef{4, 2});
  CHECK(sub_batch(td.reshape({12})) == c10::IntArrayRef{12, 2});
  CHECK(td.reshape({12}).get("sub", "x").equal(td.get("sub", "x").reshape({12, 2})));
  CHECK(sub_batch(td.unsqueeze(0)) == c10::IntArrayRef{1, 4, 3, 2});
  CHECK(sub_batch(td.permute({1, 0})) == c10::IntArrayRef{3, 4, 2});
  CHECK(sub_batch(td.expand({5, 4, 3})) == c10::IntArrayRef{5, 4, 3, 2});
  CHECK(sub_batch(td.unbind(1)[0]) == c10::IntArrayRef{4, 2});
  CHECK(sub_batch(td.split(1, 0)[0]) == c10::IntArrayRef{1, 3, 2});
  CHECK(sub_batch(td.clone()) == c10::IntArrayRef{4, 3, 2});
  CHECK(sub_batch(td.to(at::kDouble)) == c10::IntArrayRef{4, 3, 2});
  CHECK(sub_batch(td + td) == c10::IntArrayRef{4, 3, 2});
  CHECK(sub_batch(td == td) == c10::IntArrayRef{4, 3, 2});
  CHECK(sub_batch(td.sum(0)) == c10::IntArrayRef{3, 2});
  CHECK(sub_batch(td.mean({0, 1}, true)) == c10::IntArrayRef{1, 1, 2});
  CHECK(sub_batch(stack({td, td}, 1)) == c10::IntArrayRef{4, 2, 3, 2});
  CHECK(sub_batch(cat({td, td}, 0)) == c10::IntArrayRef{8, 3, 2});
  CHECK(sub_batch(td.select({{"sub", "x"}})) == c10::IntArrayRef{4, 3, 2});
  CHECK(sub_batch(td.exclude({{"y"}})) == c10::IntArrayRef{4, 3, 2});
  // Python: td.sum() reduces every leaf to a scalar, every level to batch_size [].
  const auto total = td.sum();
  CHECK(sub_batch(total).empty());
  CHECK(total.get("sub", "x").item<float>() == 276.f);
  // Levels that disagree cannot be stacked.
  auto other = with_longer_nested_batch();
  other.set("sub", AnyTensorDict({{"x", at::zeros({4, 3, 2})}}, {4, 3}));
  CHECK_THROWS_WITH(stack({td, other}), Contains("the TensorDict \"sub\" of TensorDict 0 has batch_size=[4,3,2] but TensorDict 1 has batch_size=[4,3]"));
  // update creates the levels it lacks with other's batch sizes.
  AnyTensorDict target({4, 3});
  target.update(td);
  CHECK(sub_batch(target) == c10::IntArrayRef{4, 3, 2});
}

TEST_CASE("AnyTensorDict: batch_size setter and auto_batch_size_ set nested levels as Python does", "[any_tensordict][nested_batch]") {
  auto td = with_longer_nested_batch();
  td.set_batch_size({4});  // the nested level is longer: it keeps [4,3,2]
  CHECK(td.batch_size() == c10::IntArrayRef{4});
  CHECK(sub_batch(td) == c10::IntArrayRef{4, 3, 2});
  AnyTensorDict flat({{"y", at::zeros({4, 3, 2})}, {{"sub", "x"}, at::zeros({4, 3, 2})}}, {4});
  flat.set_batch_size({4, 3, 2});  // a shorter nested level takes the new batch size
  CHECK(sub_batch(flat) == c10::IntArrayRef{4, 3, 2});
  AnyTensorDict mixed({{"y", at::zeros({4, 3, 5})}}, {4, 3});
  mixed.set("sub", with_longer_nested_batch().get_tensordict("sub"));
  CHECK_THROWS_WITH(mixed.set_batch_size({4, 3, 5}), Contains("the nested TensorDict \"sub\" has batch_size=[4,3,2], which does not start with [4,3,5]"));
  CHECK(mixed.batch_size() == c10::IntArrayRef{4, 3});  // unchanged
  // auto_batch_size_: nested levels first, each from its own leaves.
  AnyTensorDict bare({{{"sub", "x"}, at::zeros({4, 3, 2})}, {"y", at::zeros({4, 3})}});
  bare.auto_batch_size_();
  CHECK(bare.batch_size() == c10::IntArrayRef{4, 3});
  CHECK(sub_batch(bare) == c10::IntArrayRef{4, 3, 2});
  bare.auto_batch_size_(1);
  CHECK(bare.batch_size() == c10::IntArrayRef{4});
  CHECK(sub_batch(bare) == c10::IntArrayRef{4});
}

TEST_CASE("AnyTensorDict: a nested level's own batch size survives typed -> erased -> typed", "[any_tensordict][nested_batch]") {
  using nested = schema<field<"sub", schema<leaf<"x">>>, leaf<"y">>;
  const auto any = with_longer_nested_batch();
  const TensorDict<nested> typed = any.to_typed<nested>();
  CHECK(typed.get<"sub">().batch_size() == c10::IntArrayRef{4, 3, 2});
  CHECK(typed.repr() == any.repr());
  const AnyTensorDict back(typed);
  CHECK(sub_batch(back) == c10::IntArrayRef{4, 3, 2});
  TensorDict<nested> like(c10::IntArrayRef{4, 3});
  like.set<"y">(at::zeros({4, 3}));
  like.set<"sub", "x">(at::zeros({4, 3, 2}));
  CHECK_THROWS_WITH(any.to_typed<nested>(like), Contains("\"sub\": batch_size: expected [4,3], got [4,3,2]"));
}
