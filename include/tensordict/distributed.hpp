// TensorDicts and ensembles on torch.distributed's c10d.
//
//   auto group = tensordict::distributed::make_process_group(
//       {.rank = r, .world_size = 2, .rendezvous = tensordict::distributed::file_store{"/tmp/rdv"}});
//   tensordict::distributed::all_reduce(grads, *group);          // one collective per dtype, in place
//   auto mine = tensordict::distributed::shard(stacked, *group);  // this rank's members of an ensemble
//   at::Tensor all = tensordict::distributed::gather_shards(
//       tensordict::nn::functional_vmap(net, mine, tensordict::nn::args(x)), *group, members);   // [members, ...]
//
// Collectives take a typed TensorDict or an AnyTensorDict. Leaves are
// coalesced into one flat buffer per dtype and device, so a TensorDict of 100
// leaves costs one collective, not 100. all_reduce and broadcast write the
// results into the same tensors (no identity change); all_gather and
// reduce_scatter return new TensorDicts. Every collective completes before
// the first write: a collective that fails (a rank died, the timeout passed)
// throws distributed_error and leaves the caller's TensorDict as it was.
// Each call first compares the TensorDicts' structure across ranks (keys,
// dtypes, shapes: one small collective) so that a mismatch is an error
// naming the rank, not a hang or garbage; {.check_structure = false} skips it.
//
// Engine: ProcessGroupGloo (CPU tensors) from libtorch, with libgloo-dev's
// headers; ProcessGroupNCCL for CUDA tensors when the libtorch build has it.
// libtorch declares ProcessGroupGloo only under USE_C10D_GLOO, which must be
// defined for the whole translation unit (on the command line: Meson's
// tensordict_distributed_dep adds it), not by this header: a libtorch header
// included before it would have been read without. The umbrella header
// tensordict.hpp leaves this one out. Without Gloo's headers (or with
// TENSORDICT_NO_DISTRIBUTED defined) this header is empty but for
// TENSORDICT_HAS_DISTRIBUTED 0.
#pragma once

#if !defined(TENSORDICT_NO_DISTRIBUTED) && __has_include(<gloo/config.h>) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>)
#ifdef USE_C10D_GLOO
#define TENSORDICT_HAS_DISTRIBUTED 1
#else
#error "tensordict/distributed.hpp needs -DUSE_C10D_GLOO on the command line (libtorch declares ProcessGroupGloo only under it): use Meson's tensordict_distributed_dep, or add the flag, or define TENSORDICT_NO_DISTRIBUTED to leave this header empty"
#define TENSORDICT_HAS_DISTRIBUTED 0  // one error, not a cascade
#endif
#else
#define TENSORDICT_HAS_DISTRIBUTED 0
#endif

#if TENSORDICT_HAS_DISTRIBUTED

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(USE_C10D_NCCL) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define TENSORDICT_HAS_NCCL 1
#else
#define TENSORDICT_HAS_NCCL 0
#endif

#define TENSORDICT_COMPAT_C10D
#include "any_tensordict.hpp"
#include "detail/compat.hpp"
#include "errors.hpp"
#include "typed_tensordict.hpp"

namespace tensordict {

namespace distributed {

// ---- process groups ----------------------------------------------------------------------

struct file_store {
  std::string path;  // a file every rank can reach; remove it before a new run
};
struct tcp_store {
  std::string host = "127.0.0.1";
  std::uint16_t port = 29500;  // rank 0 serves it
};

enum class backend { automatic, gloo, nccl };

struct group_options {
  int rank = 0;
  int world_size = 1;
  std::variant<file_store, tcp_store> rendezvous{};
  std::chrono::milliseconds timeout{30000};  // how long a collective waits for the other ranks
  backend engine = backend::automatic;       // automatic: NCCL when built with it and CUDA is there, else Gloo
  std::string interface_host = "127.0.0.1";  // the address Gloo binds on this machine
};

inline c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(const group_options& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size)
    throw value_error("distributed::make_process_group: rank " + std::to_string(options.rank) + " of world_size " +
                      std::to_string(options.world_size));
  c10::intrusive_ptr<c10d::Store> store;
  try {
    if (const auto* f = std::get_if<file_store>(&options.rendezvous)) {
      store = c10::make_intrusive<c10d::FileStore>(f->path, options.world_size);
    } else {
      const auto& t = std::get<tcp_store>(options.rendezvous);
      c10d::TCPStoreOptions tcp;
      tcp.port = t.port;
      tcp.isServer = options.rank == 0;
      tcp.numWorkers = options.world_size;
      tcp.timeout = options.timeout;
      ::tensordict::detail::compat::use_classic_tcp_server(tcp);
      store = c10::make_intrusive<c10d::TCPStore>(t.host, tcp);
    }
    store->setTimeout(options.timeout);
#if TENSORDICT_HAS_NCCL
    if (options.engine == backend::nccl || (options.engine == backend::automatic && at::hasCUDA())) {
      auto nccl = c10d::ProcessGroupNCCL::Options::create();
      nccl->timeout = options.timeout;
      return ::tensordict::detail::compat::as_process_group(
          c10::make_intrusive<c10d::ProcessGroupNCCL>(store, options.rank, options.world_size, nccl), store,
          ::tensordict::detail::compat::c10d_engine::nccl);
    }
#else
    if (options.engine == backend::nccl)
      throw value_error("distributed::make_process_group: this libtorch has no NCCL (a CPU build); use backend::gloo");
#endif
    auto gloo = c10d::ProcessGroupGloo::Options::create(options.timeout);
    gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.interface_host));
    return ::tensordict::detail::compat::as_process_group(
        c10::make_intrusive<c10d::ProcessGroupGloo>(store, options.rank, options.world_size, gloo), store,
        ::tensordict::detail::compat::c10d_engine::gloo);
  } catch (const tensordict::error&) {
    throw;
  } catch (const std::exception& e) {
    throw distributed_error("distributed::make_process_group (rank " + std::to_string(options.rank) + " of " +
                            std::to_string(options.world_size) + "): " + e.what());
  }
}

struct collective_options {
  bool check_structure = true;
};

// The members [start, start + size) of `members` that rank `rank` of `world` holds:
// the first members % world ranks hold one more.
struct shard_range {
  std::int64_t start = 0;
  std::int64_t size = 0;
};
inline shard_range shard_of(std::int64_t members, int rank, int world) {
  const std::int64_t base = members / world, extra = members % world;
  return {rank * base + std::min<std::int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

namespace detail {

template <class TD>
inline constexpr bool is_tensordict_v = ::tensordict::detail::is_tensordict<std::remove_cvref_t<TD>>::value;

inline std::string path_text(const key_path& p) { return p.join("."); }
inline std::string path_text(const any_key_path& p) { return join(p, "."); }

// A collective, waited on; failures become distributed_error.
template <class F>
void run(c10d::ProcessGroup& group, const char* op, F&& start) {
  try {
    start()->wait();
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (auto cut = what.find("\nException raised from"); cut != std::string::npos) what.resize(cut);
    throw distributed_error(std::string("distributed::") + op + " (rank " + std::to_string(group.getRank()) + " of " +
                            std::to_string(group.getSize()) + ") failed: " + what +
                            ". The TensorDict is unchanged.");
  }
}

// Leaves of one dtype and device, as one flat buffer.
struct flat_group {
  std::vector<std::size_t> leaves;
  at::Tensor buffer;
};

inline std::vector<flat_group> coalesce(const std::vector<at::Tensor>& leaves) {
  std::vector<flat_group> groups;
  std::vector<std::pair<at::ScalarType, at::Device>> kinds;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const std::pair<at::ScalarType, at::Device> kind{leaves[i].scalar_type(), leaves[i].device()};
    auto it = std::find(kinds.begin(), kinds.end(), kind);
    if (it == kinds.end()) {
      kinds.push_back(kind);
      groups.emplace_back();
      it = kinds.end() - 1;
    }
    groups[it - kinds.begin()].leaves.push_back(i);
  }
  for (auto& g : groups) {
    std::vector<at::Tensor> parts;
    for (std::size_t i : g.leaves) parts.push_back(leaves[i].reshape({-1}));
    g.buffer = at::cat(parts);
  }
  return groups;
}

// Writes each group's buffer back into its leaves (after every collective succeeded).
inline void scatter_back(const std::vector<flat_group>& groups, const std::vector<at::Tensor>& leaves) {
  at::NoGradGuard no_grad;
  for (const auto& g : groups) {
    std::int64_t offset = 0;
    for (std::size_t i : g.leaves) {
      const std::int64_t n = leaves[i].numel();
      leaves[i].copy_(g.buffer.narrow(0, offset, n).view(leaves[i].sizes()));
      offset += n;
    }
  }
}

// What every rank's TensorDict must share, and its batch size; exchanged in one collective.
constexpr std::size_t max_batch_dims = 8;

template <class TD>
std::vector<std::vector<std::int64_t>> exchange_structure(const TD& td, c10d::ProcessGroup& group, const char* op,
                                                          std::size_t free_dim = SIZE_MAX, bool consolidated = false) {
  const auto batch = td.batch_size();
  if (batch.size() > max_batch_dims)
    throw value_error(std::string("distributed::") + op + ": at most " + std::to_string(max_batch_dims) + " batch dims");
  // The keys, dtypes and leaf dims past the batch dims; the batch size apart from free_dim.
  std::size_t h = std::hash<std::string>{}(std::to_string(batch.size()));
  auto mix = [&](std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  for (const auto& [path, t] : td.items()) {
    mix(std::hash<std::string>{}(path_text(path)));
    mix(static_cast<std::size_t>(t.scalar_type()));
    for (std::size_t d = batch.size(); d < static_cast<std::size_t>(t.dim()); ++d) mix(static_cast<std::size_t>(t.size(d)));
  }
  for (std::size_t d = 0; d < batch.size(); ++d)
    if (d != free_dim) mix(static_cast<std::size_t>(batch[d]));
  if (consolidated) mix(0x636f6e73ull);  // every rank takes the one-buffer path, or none
  std::vector<std::int64_t> mine(2 + max_batch_dims, 0);
  mine[0] = static_cast<std::int64_t>(h & 0x7fffffffffffffffull);
  mine[1] = static_cast<std::int64_t>(batch.size());
  std::copy(batch.begin(), batch.end(), mine.begin() + 2);
  std::vector<at::Tensor> input{at::tensor(mine, at::kLong)};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < group.getSize(); ++r) output[0].push_back(at::empty_like(input[0]));
  run(group, op, [&] { return group.allgather(output, input); });
  std::vector<std::vector<std::int64_t>> batches;
  for (int r = 0; r < group.getSize(); ++r) {
    const at::Tensor& t = output[0][r];
    const auto* v = t.data_ptr<std::int64_t>();
    if (v[0] != mine[0])
      throw distributed_error(std::string("distributed::") + op + ": the TensorDict of rank " + std::to_string(r) +
                              " differs from rank " + std::to_string(group.getRank()) +
                              "'s (keys, dtypes, leaf shapes, batch size, or for broadcast whether it is consolidated); "
                              "every rank must pass the same structure");
    batches.emplace_back(v + 2, v + 2 + v[1]);
  }
  return batches;
}

template <class TD>
void check_cpu_or_cuda(const TD& td, const char* op) {
  for (const auto& [path, t] : td.items())
    if (!t.device().is_cpu() && !t.device().is_cuda())
      throw value_error(std::string("distributed::") + op + ": " + path_text(path) + " is on " + t.device().str());
}

}  // namespace detail

// ---- collectives -------------------------------------------------------------------------

// Reduces every leaf over the ranks, in place (same tensors). AVG is a sum
// divided by the world size (Gloo has no AVG), for floating dtypes.
template <class TD>
  requires detail::is_tensordict_v<TD>
void all_reduce(TD& td, c10d::ProcessGroup& group, c10d::ReduceOp op = c10d::ReduceOp::SUM,
                collective_options options = {}) {
  if (options.check_structure) detail::exchange_structure(td, group, "all_reduce");
  const std::vector<at::Tensor> leaves = td.values();
  const bool average = op == c10d::ReduceOp::AVG;
  for (const auto& t : leaves)
    if (average && !at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type()))
      throw dtype_error("distributed::all_reduce: AVG of " + describe(t) + "; average floating-point leaves only");
  auto groups = [&] {
    at::NoGradGuard no_grad;
    return detail::coalesce(leaves);
  }();
  c10d::AllreduceOptions reduce;
  reduce.reduceOp = average ? c10d::ReduceOp(c10d::ReduceOp::SUM) : op;
  for (auto& g : groups) {
    std::vector<at::Tensor> buffers{g.buffer};
    detail::run(group, "all_reduce", [&] { return group.allreduce(buffers, reduce); });
  }
  if (average)
    for (auto& g : groups) g.buffer.div_(group.getSize());
  detail::scatter_back(groups, leaves);
}

// Every rank's leaves become rank `root`'s values, in place. A TensorDict
// consolidated on every rank (td.consolidate()) goes as its one buffer, in
// one collective; that path needs options.check_structure, which makes every
// rank agree on it (a rank whose TensorDict is not consolidated is then an error everywhere).
template <class TD>
  requires detail::is_tensordict_v<TD>
void broadcast(TD& td, c10d::ProcessGroup& group, int root = 0, collective_options options = {}) {
  if (root < 0 || root >= group.getSize())
    throw value_error("distributed::broadcast: root " + std::to_string(root) + " of world_size " + std::to_string(group.getSize()));
  const at::Tensor storage = options.check_structure ? td.consolidated_storage() : at::Tensor();
  if (options.check_structure) detail::exchange_structure(td, group, "broadcast", SIZE_MAX, storage.defined());
  if (storage.defined()) {
    // Received into a buffer of its own, then copied into the one the leaves view: a failed collective writes nothing.
    std::vector<at::Tensor> buffers{group.getRank() == root ? storage : at::empty_like(storage)};
    c10d::BroadcastOptions b;
    b.rootRank = root;
    detail::run(group, "broadcast", [&] { return group.broadcast(buffers, b); });
    if (group.getRank() != root) storage.copy_(buffers[0]);
    return;
  }
  const std::vector<at::Tensor> leaves = td.values();
  auto groups = [&] {
    at::NoGradGuard no_grad;
    return detail::coalesce(leaves);
  }();
  c10d::BroadcastOptions b;
  b.rootRank = root;
  for (auto& g : groups) {
    std::vector<at::Tensor> buffers{g.buffer};
    detail::run(group, "broadcast", [&] { return group.broadcast(buffers, b); });
  }
  if (group.getRank() != root) detail::scatter_back(groups, leaves);
}

// Every rank's TensorDict, on every rank: stacked along a new leading batch
// dim (dim = std::nullopt: batch_size [world, *batch]), or concatenated along
// an existing batch dim, whose size may differ between ranks.
template <class TD>
  requires detail::is_tensordict_v<TD>
TD all_gather(const TD& td, c10d::ProcessGroup& group, std::optional<std::int64_t> dim = std::nullopt) {
  const auto nb = static_cast<std::int64_t>(td.batch_dims());
  if (dim && (*dim < -nb || *dim >= nb))
    throw index_error("distributed::all_gather: dim " + std::to_string(*dim) + " is out of range for batch_size=" +
                      format_sizes(td.batch_size()));
  const std::size_t free_dim = dim ? static_cast<std::size_t>(*dim < 0 ? *dim + nb : *dim) : SIZE_MAX;
  // Always exchanged here: the batch sizes along `dim` are needed.
  const auto batches = detail::exchange_structure(td, group, "all_gather", free_dim);
  const int world = group.getSize();
  const std::vector<at::Tensor> leaves = td.values();
  at::NoGradGuard no_grad;
  auto groups = detail::coalesce(leaves);
  // Each rank's element count per leaf: its own dims times its batch size.
  auto numel_on = [&](std::size_t leaf, int rank) {
    std::int64_t n = 1;
    for (auto b : batches[rank]) n *= b;
    const at::Tensor& t = leaves[leaf];
    for (std::int64_t d = nb; d < t.dim(); ++d) n *= t.size(d);
    return n;
  };
  std::vector<std::vector<at::Tensor>> gathered(groups.size());
  for (std::size_t k = 0; k < groups.size(); ++k) {
    std::int64_t longest = 0;
    for (int r = 0; r < world; ++r) {
      std::int64_t total = 0;
      for (std::size_t i : groups[k].leaves) total += numel_on(i, r);
      longest = std::max(longest, total);
    }
    at::Tensor padded = at::zeros({longest}, groups[k].buffer.options());
    padded.narrow(0, 0, groups[k].buffer.numel()).copy_(groups[k].buffer);
    std::vector<at::Tensor> input{padded};
    std::vector<std::vector<at::Tensor>> output(1);
    for (int r = 0; r < world; ++r) output[0].push_back(at::empty_like(padded));
    detail::run(group, "all_gather", [&] { return group.allgather(output, input); });
    gathered[k] = std::move(output[0]);
  }
  // The pieces of each leaf, rank by rank.
  std::vector<at::Tensor> results(leaves.size());
  for (std::size_t k = 0; k < groups.size(); ++k) {
    std::vector<std::int64_t> offsets(world, 0);
    for (std::size_t i : groups[k].leaves) {
      std::vector<at::Tensor> pieces;
      for (int r = 0; r < world; ++r) {
        std::vector<std::int64_t> shape = batches[r];
        shape.insert(shape.end(), leaves[i].sizes().begin() + nb, leaves[i].sizes().end());
        const std::int64_t n = numel_on(i, r);
        pieces.push_back(gathered[k][r].narrow(0, offsets[r], n).view(shape));
        offsets[r] += n;
      }
      results[i] = dim ? at::cat(pieces, static_cast<std::int64_t>(free_dim)) : at::stack(pieces);
    }
  }
  std::vector<std::int64_t> batch(td.batch_size().begin(), td.batch_size().end());
  if (dim) {
    batch[free_dim] = 0;
    for (int r = 0; r < world; ++r) batch[free_dim] += batches[r][free_dim];
  } else {
    batch.insert(batch.begin(), world);
  }
  std::size_t next = 0;
  return td.apply([&](const at::Tensor&) { return results[next++]; }, batch);
}

// The reduction over the ranks, split along batch dim 0: rank r gets its
// shard_of(batch[0], r, world) part. Gloo has no reduce_scatter, so this is
// an all_reduce of a copy followed by a slice; the caller's TensorDict is unchanged.
template <class TD>
  requires detail::is_tensordict_v<TD>
TD reduce_scatter(const TD& td, c10d::ProcessGroup& group, c10d::ReduceOp op = c10d::ReduceOp::SUM,
                  collective_options options = {}) {
  if (td.batch_dims() == 0) throw index_error("distributed::reduce_scatter: the TensorDict has no batch dim to split");
  TD reduced = td.clone();
  all_reduce(reduced, group, op, options);
  const auto part = shard_of(td.batch_size()[0], group.getRank(), group.getSize());
  std::vector<std::int64_t> batch(td.batch_size().begin(), td.batch_size().end());
  batch[0] = part.size;
  return reduced.apply([&](const at::Tensor& t) { return t.narrow(0, part.start, part.size); }, batch);
}

// ---- sharded ensembles -------------------------------------------------------------------

// This rank's members of stacked ensemble parameters (batch dim 0 indexes the
// members): views of the same storage, shard_of(members, rank, world).
template <class TD>
  requires detail::is_tensordict_v<TD>
TD shard(const TD& stacked, const c10d::ProcessGroup& group) {
  if (stacked.batch_dims() == 0) throw index_error("distributed::shard: the TensorDict has no batch dim to shard");
  const auto part = shard_of(stacked.batch_size()[0], group.getRank(), group.getSize());
  std::vector<std::int64_t> batch(stacked.batch_size().begin(), stacked.batch_size().end());
  batch[0] = part.size;
  return stacked.apply([&](const at::Tensor& t) { return t.narrow(0, part.start, part.size); }, batch);
}

// The outputs of every rank's members, in member order, on every rank:
// `local` is [this rank's members, ...] (shard_of(members, rank, world)),
// the result [members, ...]. One collective: the shard sizes are known.
inline at::Tensor gather_shards(const at::Tensor& local, c10d::ProcessGroup& group, std::int64_t members) {
  const int world = group.getSize();
  const auto mine = shard_of(members, group.getRank(), world);
  if (local.dim() == 0 || local.size(0) != mine.size)
    throw shape_error("distributed::gather_shards: rank " + std::to_string(group.getRank()) + " holds members [" +
                      std::to_string(mine.start) + ", " + std::to_string(mine.start + mine.size) + ") of " +
                      std::to_string(members) + ", but its output is " + describe(local));
  at::NoGradGuard no_grad;
  // Each rank's shard in place in a zeroed [members, ...] buffer, summed over
  // the ranks: exact (x + 0 == x, but for the sign of -0.0), and faster than
  // Gloo's allgather here (bench_distributed: 1.21 -> 1.38 for 1/2 processes).
  std::vector<std::int64_t> shape(local.sizes().begin(), local.sizes().end());
  shape[0] = members;
  at::Tensor all = at::zeros(shape, local.options());
  all.narrow(0, mine.start, mine.size).copy_(local);
  std::vector<at::Tensor> buffers{all};
  detail::run(group, "gather_shards", [&] { return group.allreduce(buffers); });
  return all;
}

// Data-parallel training of a whole ensemble: the gradients of the stacked
// parameters averaged over the ranks, as one coalesced all_reduce, in place.
// Leaves without a gradient are left out.
template <class TD>
  requires detail::is_tensordict_v<TD>
void all_reduce_gradients(const TD& params, c10d::ProcessGroup& group, collective_options options = {}) {
  TD grads = params.apply([](const at::Tensor& t) { return t.grad(); });  // the gradient tensors themselves
  all_reduce(grads, group, c10d::ReduceOp::AVG, options);
}

// ---- launching ranks on one machine -----------------------------------------------------

// Runs this program again as `world_size` processes (as torchrun
// --nproc-per-node does): each gets TENSORDICT_RANK, TENSORDICT_WORLD_SIZE and
// TENSORDICT_STORE (a fresh FileStore path) in its environment, and the same
// arguments. Returns 0 when every rank exits with 0 within the timeout; else
// the first failing exit status, or 124 after killing the ranks on timeout.
inline int launch_local(int world_size, char** argv, std::chrono::seconds timeout = std::chrono::seconds(300)) {
  static int launches = 0;
  const std::string store = "/tmp/tensordict-store-" + std::to_string(::getpid()) + "-" + std::to_string(launches++);
  std::remove(store.c_str());
  // Everything the children need is built before fork: between fork and exec only exec is called.
  std::vector<std::vector<std::string>> envs(world_size);
  for (int r = 0; r < world_size; ++r) {
    for (char** e = ::environ; *e; ++e)  // declared by <unistd.h> (g++ defines _GNU_SOURCE)
      if (std::string_view(*e).rfind("TENSORDICT_", 0) != 0) envs[r].emplace_back(*e);
    envs[r].push_back("TENSORDICT_RANK=" + std::to_string(r));
    envs[r].push_back("TENSORDICT_WORLD_SIZE=" + std::to_string(world_size));
    envs[r].push_back("TENSORDICT_STORE=" + store);
  }
  std::vector<std::vector<char*>> env_pointers(world_size);
  for (int r = 0; r < world_size; ++r) {
    for (auto& e : envs[r]) env_pointers[r].push_back(e.data());
    env_pointers[r].push_back(nullptr);
  }
  std::vector<pid_t> children;
  for (int r = 0; r < world_size; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execve("/proc/self/exe", argv, env_pointers[r].data());
      ::_exit(127);
    }
    if (pid < 0) throw error("distributed::launch_local: fork failed");
    children.push_back(pid);
  }
  int result = 0;
  std::size_t running = children.size();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running > 0) {
    for (auto& pid : children) {
      int status = 0;
      if (pid > 0 && ::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        --running;
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (code != 0 && result == 0) result = code;
      }
    }
    if (running > 0 && std::chrono::steady_clock::now() > deadline) {
      for (pid_t pid : children)
        if (pid > 0) ::kill(pid, SIGKILL);
      for (pid_t pid : children)
        if (pid > 0) ::waitpid(pid, nullptr, 0);
      result = 124;
      break;
    }
    if (running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::remove(store.c_str());
  return result;
}

// In a process started by launch_local: its rank, world size and store; std::nullopt elsewhere.
inline std::optional<group_options> group_from_environment() {
  const char* rank = std::getenv("TENSORDICT_RANK");
  const char* world = std::getenv("TENSORDICT_WORLD_SIZE");
  const char* store = std::getenv("TENSORDICT_STORE");
  if (!rank || !world || !store) return std::nullopt;
  group_options options;
  options.rank = std::atoi(rank);
  options.world_size = std::atoi(world);
  options.rendezvous = file_store{store};
  return options;
}

}  // namespace distributed
}  // namespace tensordict

#endif  // TENSORDICT_HAS_DISTRIBUTED
