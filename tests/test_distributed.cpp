// Collectives on TensorDicts and sharded ensembles, over 2 processes.
// The binary launches itself as 2 ranks (distributed::launch_local); each
// rank runs every test case against one shared Gloo process group, so the
// collectives of a test case meet. Results are checked against references
// computed locally.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <iostream>
#include <thread>

#define CATCH_CONFIG_RUNNER
#include "catch_torch.hpp"
#include "test_helpers.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <tensordict/distributed.hpp>
#include <tensordict/nn/functional_vmap.hpp>

using namespace tensordict;
using test::impl;
namespace dist = tensordict::distributed;
using test::Contains;

namespace {
c10::intrusive_ptr<c10d::ProcessGroup> the_group;
int rank() { return the_group->getRank(); }
int world() { return the_group->getSize(); }

// A nested TensorDict whose values depend on the rank, in three dtypes.
AnyTensorDict for_rank(int r, std::int64_t batch = 2) {
  AnyTensorDict td({batch});
  td.set("0", "weight", at::arange(batch * 12, at::kFloat).reshape({batch, 4, 3}) * (r + 1));
  td.set("0", "bias", at::full({batch, 4}, 0.5 * (r + 1), at::kDouble));
  td.set("steps", at::full({batch}, 10 * (r + 1), at::kLong));
  return td;
}

torch::nn::Sequential make_member(int member) {
  torch::manual_seed(1000 + member);
  return torch::nn::Sequential(torch::nn::Linear(3, 16), torch::nn::Tanh(), torch::nn::Linear(16, 1));
}
}  // namespace

TEST_CASE("all_reduce: every leaf reduced in place, one collective per dtype", "[distributed]") {
  auto td = for_rank(rank());
  const auto before = td.values();
  dist::all_reduce(td, *the_group);
  auto expected = for_rank(0);
  for (int r = 1; r < world(); ++r)
    expected.apply_([&, k = std::size_t{0}](at::Tensor& t) mutable { return t + for_rank(r).values()[k++]; });
  CHECK((td == expected).all());
  const auto after = td.values();
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(impl(after[i]) == impl(before[i]));

  auto maxed = for_rank(rank());
  dist::all_reduce(maxed, *the_group, c10d::ReduceOp::MAX);
  CHECK((maxed == for_rank(world() - 1)).all());

  using linear = schema<leaf<"weight">, leaf<"bias">>;
  TensorDict<linear> typed({at::full({2, 2}, double(rank())), at::full({2}, 2.0 * rank())});
  dist::all_reduce(typed, *the_group, c10d::ReduceOp::AVG);
  CHECK(at::allclose(typed.get<"weight">(), at::full({2, 2}, (world() - 1) / 2.0)));
  CHECK(at::allclose(typed.get<"bias">(), at::full({2}, double(world() - 1))));
  auto ints = for_rank(rank());
  CHECK_THROWS_AS(dist::all_reduce(ints, *the_group, c10d::ReduceOp::AVG), dtype_error);
}

TEST_CASE("broadcast: rank 1's values everywhere, same tensors", "[distributed]") {
  auto td = for_rank(rank());
  const at::Tensor w = td.get("0", "weight");
  dist::broadcast(td, *the_group, 1);
  CHECK((td == for_rank(1)).all());
  CHECK(impl(td.get("0", "weight")) == impl(w));
  CHECK_THROWS_AS(dist::broadcast(td, *the_group, world()), value_error);

  // Consolidated on every rank: one buffer, written in place under the same leaves.
  auto one = for_rank(rank()).consolidate();
  const at::Tensor storage = one.consolidated_storage();
  dist::broadcast(one, *the_group, 1);
  CHECK((one == for_rank(1)).all());
  CHECK(one.consolidated_storage().data_ptr() == storage.data_ptr());
  // Consolidated on one rank only: an error on every rank, before anything is sent.
  auto mixed = rank() == 0 ? for_rank(0).consolidate() : for_rank(rank());
  CHECK_THROWS_WITH(dist::broadcast(mixed, *the_group, 0), Contains("whether it is consolidated"));
}

TEST_CASE("all_gather: along a new dim, and along an existing dim of uneven sizes", "[distributed]") {
  auto td = for_rank(rank());
  auto stacked = dist::all_gather(td, *the_group);
  CHECK(stacked.batch_size() == c10::IntArrayRef{world(), 2});
  for (int r = 0; r < world(); ++r) CHECK((stacked[r] == for_rank(r)).all());

  // Rank r holds r + 2 rows.
  auto uneven = for_rank(rank(), rank() + 2);
  auto joined = dist::all_gather(uneven, *the_group, 0);
  std::vector<AnyTensorDict> parts;
  for (int r = 0; r < world(); ++r) parts.push_back(for_rank(r, r + 2));
  CHECK(joined.batch_size()[0] == 2 + 3);
  CHECK((joined == cat(parts, 0)).all());

  using one = schema<leaf<"x">>;
  TensorDict<one> typed({at::full({1, 3}, double(rank()))}, {1});
  auto typed_all = dist::all_gather(typed, *the_group, 0);
  CHECK(typed_all.get<"x">().equal(at::arange(world(), at::kDouble).unsqueeze(1).expand({world(), 3})));
}

TEST_CASE("reduce_scatter: each rank its part of the sum, uneven parts", "[distributed]") {
  auto td = for_rank(rank(), 5);
  auto mine = dist::reduce_scatter(td, *the_group);
  auto total = for_rank(0, 5);
  for (int r = 1; r < world(); ++r)
    total.apply_([&, k = std::size_t{0}](at::Tensor& t) mutable { return t + for_rank(r, 5).values()[k++]; });
  const auto part = dist::shard_of(5, rank(), world());
  CHECK(mine.batch_size()[0] == part.size);
  CHECK((mine == total.index({at::indexing::Slice(part.start, part.start + part.size)})).all());
  CHECK((td == for_rank(rank(), 5)).all());  // the input is unchanged
}

TEST_CASE("a TensorDict that differs between ranks is an error on every rank", "[distributed]") {
  auto td = for_rank(rank());
  if (rank() == 1) td.set("extra", at::zeros({2}));
  const auto before = td.clone();
  CHECK_THROWS_AS(dist::all_reduce(td, *the_group), distributed_error);
  CHECK((td == before).all());
  auto other = for_rank(rank());
  CHECK_THROWS_WITH(dist::all_reduce(rank() == 0 ? other : td, *the_group),
                    Contains("differs from rank") && Contains("every rank must pass the same structure"));
}

TEST_CASE("sharded ensemble: each rank runs its members, outputs gathered in member order", "[distributed]") {
  constexpr int members = 5;  // uneven over 2 ranks: 3 and 2
  std::vector<torch::nn::Sequential> nets;
  for (int m = 0; m < members; ++m) nets.push_back(make_member(m));
  auto stacked = from_modules(nets);
  torch::manual_seed(11);
  auto x = at::randn({7, 3});  // the same on every rank (same seed)
  auto mine = dist::shard(stacked, *the_group);
  CHECK(mine.batch_size()[0] == dist::shard_of(members, rank(), world()).size);
  CHECK(mine.get("0", "weight").data_ptr() ==
        stacked.get("0", "weight")[dist::shard_of(members, rank(), world()).start].data_ptr());  // a view
  at::Tensor local = nn::functional_vmap(nets[0], mine, nn::args(x));
  at::Tensor all = dist::gather_shards(local, *the_group, members);
  at::Tensor reference = nn::functional_vmap(nets[0], stacked, nn::args(x));
  REQUIRE(all.sizes() == reference.sizes());
  CHECK(at::allclose(all, reference, 1e-5, 1e-6));
}

TEST_CASE("data-parallel training: averaged gradients equal the single-process ones", "[distributed]") {
  std::vector<torch::nn::Sequential> nets;
  for (int m = 0; m < 4; ++m) nets.push_back(make_member(m));
  auto params = from_modules(nets);
  torch::manual_seed(7);
  auto x = at::randn({8, 3}), y = at::randn({8, 1});  // the same on every rank (same seed)
  auto loss_of = [&](const AnyTensorDict& p, const at::Tensor& xs, const at::Tensor& ys) {
    return (nn::functional_vmap(nets[0], p, nn::args(xs)) - ys).pow(2).mean(/*dims*/ {1, 2}).sum();
  };
  // This rank's half of the batch.
  const auto rows = dist::shard_of(8, rank(), world());
  loss_of(params, x.narrow(0, rows.start, rows.size), y.narrow(0, rows.start, rows.size)).backward();
  const at::Tensor grad_before = params.get("0", "weight").grad();
  dist::all_reduce_gradients(params, *the_group);
  CHECK(impl(params.get("0", "weight").grad()) == impl(grad_before));

  auto single = from_modules(nets);
  loss_of(single, x, y).backward();
  for (const auto& [path, t] : params.items()) {
    INFO(to_string(path));
    CHECK(at::allclose(t.grad(), single.get(path).grad(), 1e-5, 1e-6));
  }
}

TEST_CASE("member-sharded training equals a single-process run with the same seeds", "[distributed]") {
  constexpr int members = 4;
  std::vector<torch::nn::Sequential> nets;
  for (int m = 0; m < members; ++m) nets.push_back(make_member(m));
  torch::manual_seed(3);
  auto x = at::randn({16, 3}), y = at::randn({16, 1});
  auto train = [&](AnyTensorDict p) {
    torch::optim::Adam adam(p.values(), torch::optim::AdamOptions(1e-2));
    for (int step = 0; step < 5; ++step) {
      adam.zero_grad();
      // Members are independent: the sum of their losses gives each its own gradient.
      (nn::functional_vmap(nets[0], p, nn::args(x)) - y).pow(2).mean({1, 2}).sum().backward();
      adam.step();
    }
    return nn::functional_vmap(nets[0], p, nn::args(x)).detach();
  };
  auto all = from_modules(nets);
  auto mine = dist::shard(all, *the_group).apply([](const at::Tensor& t) { return t.detach().clone().requires_grad_(); });
  at::Tensor gathered = dist::gather_shards(train(mine), *the_group, members);
  CHECK_THROWS_AS(dist::gather_shards(at::zeros({members + 1, 2}), *the_group, members), shape_error);
  at::Tensor single = train(all);
  CHECK(at::allclose(gathered, single, 1e-5, 1e-6));
}

TEST_CASE("a TCPStore rendezvous makes a working group", "[distributed]") {
  // Rank 0 asks the system for a free port and tells rank 1 through the file-store group.
  AnyTensorDict port;
  port.set("port", at::zeros({1}, at::kLong));
  if (rank() == 0) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    ::close(fd);
    port.get("port").fill_(ntohs(address.sin_port));
  }
  dist::broadcast(port, *the_group, 0);
  dist::group_options options;
  options.rank = rank();
  options.world_size = world();
  options.rendezvous = dist::tcp_store{"127.0.0.1", static_cast<std::uint16_t>(port.get("port").item<std::int64_t>())};
  options.timeout = std::chrono::seconds(20);
  auto tcp_group = dist::make_process_group(options);
  auto td = for_rank(rank());
  dist::all_reduce(td, *tcp_group, c10d::ReduceOp::MIN);
  CHECK((td == for_rank(0)).all());
  CHECK_THROWS_AS(dist::make_process_group({.rank = 2, .world_size = 2}), value_error);
}

TEST_CASE("a rank that dies makes the collective fail with a clear error, without a partial write", "[dies]") {
  if (rank() == 1) std::_Exit(0);  // gone before the collective
  auto td = for_rank(rank());
  const auto before = td.clone();
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(dist::all_reduce(td, *the_group, c10d::ReduceOp::SUM, {.check_structure = false}), distributed_error);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 25);  // at the latest the group's timeout (20 s); at once when the peer's socket closes
  CHECK_THROWS_WITH(dist::all_reduce(td, *the_group), Contains("rank 0 of 2") && Contains("The TensorDict is unchanged"));
  CHECK((td == before).all());
}

int main(int argc, char** argv) {
  auto options = dist::group_from_environment();
  if (!options) return dist::launch_local(2, argv, std::chrono::seconds(240));  // the launcher
  options->timeout = std::chrono::seconds(20);
  the_group = dist::make_process_group(*options);
  // Every rank's group is made before any test runs: the [dies] test's rank 1 exits at once, and
  // rank 0, still in its connection handshake then, failed in make_process_group (a CI run).
  the_group->barrier()->wait();
  torch::manual_seed(0);
  const int failed = Catch::Session().run(argc, argv);
  the_group.reset();
  return failed;
}
