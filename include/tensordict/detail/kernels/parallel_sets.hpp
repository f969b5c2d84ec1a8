// Runs the sets of a lowered functional_vmap in tasks across libtorch's
// intra-op threads (at::parallel_for): the sets are independent, so each task
// runs the whole layer stack on its own sets, one BLAS thread inside, and the
// outputs are joined. With gradients wanted, the tasks' graphs sit behind one
// autograd node whose backward runs them in parallel again (the autograd
// engine would otherwise run every task's backward on one thread).
//
// Where libtorch's intra-op backend is OpenMP (AT_PARALLEL_OPENMP, Debian's
// build), at::parallel_for's threads are OpenMP pragmas in libtorch's own
// headers: a translation unit compiled without -fopenmp runs every task on
// the calling thread. Meson's tensordict dependency adds -fopenmp; elsewhere
// pass it (CMake: OpenMP::OpenMP_CXX).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "../config.hpp"

namespace tensordict::detail {

// task(tensors, start, length): the outputs of sets [start, start + length)
// (dim 0 of each indexes them), given the call's tensors narrowed to them
// (dim 0 of those marked `mapped` indexes the sets; the others every set shares).
using set_task = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&, std::int64_t, std::int64_t)>;

// Sets per task for a call whose sets each need bytes_per_set of working set and flops_per_set.
TENSORDICT_DECL std::int64_t sets_per_task(std::int64_t sets, std::int64_t bytes_per_set, double flops_per_set, std::int64_t threads);

// The joined outputs of task(...) over `sets` sets in tasks of `per_task`,
// differentiable with respect to `tensors` where gradients are wanted.
TENSORDICT_DECL std::vector<at::Tensor> run_set_tasks(std::int64_t sets, std::int64_t per_task, const std::vector<at::Tensor>& tensors,
                                                      const std::vector<bool>& mapped, const set_task& task);

// Runs body(i) for every i in [0, count) on the calling thread and on up to
// threads - 1 helper threads of the library's own, each taking the next i.
// The caller waits only for the bodies a helper has begun: a helper that a
// busy machine keeps from starting costs nothing, where an OpenMP region
// waits in its barrier for every thread to arrive (measured: a SAC update at
// two threads beside a CPU-bound process, 1389 us at one thread, 4059 us with
// the Linear runs' groups in at::parallel_for). Idle helpers sleep on a
// condition variable: no spinning. Bodies run with the caller's thread-local
// state (grad mode, dispatch keys); the first exception a body throws is
// rethrown here once every begun body has ended. Called from a helper's body
// or inside a parallel region, it runs every body on the calling thread.
TENSORDICT_DECL void for_each_claimed(std::int64_t count, int threads, const std::function<void(std::int64_t)>& body);

}  // namespace tensordict::detail

#if TENSORDICT_DEFINITIONS
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <ATen/Config.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../../errors.hpp"
#include "../core_cache.hpp"

namespace tensordict::detail {

// The work a task or thread must have to outweigh its start: 4 MFLOP, some 50 us of a core.
inline constexpr double flops_worth_a_thread = 4e6;

// Sets per task: as many as fit in a core's cache by the estimate, but at
// most two tasks per thread (each task costs its ops' fixed overheads again;
// measured on 128 and 8 sets, more tasks did not pay), at least one per
// thread, a number the threads share evenly, and flops_worth_a_thread per task.
TENSORDICT_DECL std::int64_t sets_per_task(std::int64_t sets, std::int64_t bytes_per_set, double flops_per_set, std::int64_t threads) {
  const std::int64_t fit = std::max<std::int64_t>(1, core_cache_bytes() / std::max<std::int64_t>(1, bytes_per_set));
  const std::int64_t worth = static_cast<std::int64_t>(flops_worth_a_thread / std::max(1.0, flops_per_set)) + 1;
  const std::int64_t fewest = (sets + 2 * threads - 1) / (2 * threads);
  std::int64_t tasks = (sets + std::max({fit, worth, fewest}) - 1) / std::max({fit, worth, fewest});
  if (tasks < 2) return sets;
  tasks = std::min(sets, (tasks + threads - 1) / threads * threads);
  return (sets + tasks - 1) / tasks;
}

struct set_tasks_plan {
  std::int64_t sets = 0;
  std::int64_t per_task = 0;
  std::vector<bool> mapped;
  const set_task* task = nullptr;

  std::int64_t count() const { return (sets + per_task - 1) / per_task; }
  std::int64_t start(std::int64_t t) const { return t * per_task; }
  std::int64_t length(std::int64_t t) const { return std::min(per_task, sets - t * per_task); }

  // The tensors of task t: views of the caller's (narrowed to its sets where
  // mapped), so that a graph recorded from them reaches the caller's tensors.
  std::vector<at::Tensor> inputs_of(const std::vector<at::Tensor>& tensors, std::int64_t t) const {
    std::vector<at::Tensor> out;
    out.reserve(tensors.size());
    for (std::size_t k = 0; k < tensors.size(); ++k)
      out.push_back(mapped[k] && tensors[k].defined() ? tensors[k].narrow(0, start(t), length(t)) : tensors[k]);
    return out;
  }

  // Runs body(t) for every task, across the intra-op threads, each with the
  // caller's thread-local state and one OpenMP thread for what it calls:
  // oneDNN (libtorch's convolutions) sizes its own OpenMP teams by
  // omp_get_max_threads(), and inside a task its team would have one thread
  // where its barriers wait for more (measured: a convolution's backward spun
  // forever). Inside the caller's own parallel region at::parallel_for runs
  // the body on the caller's thread, so the setting is restored after it.
  template <class Body>
  void for_each_task(Body&& body) const {
    const at::ThreadLocalState state;
    at::parallel_for(0, count(), 1, [&](std::int64_t begin, std::int64_t end) {
      const at::ThreadLocalStateGuard guard(state);
#ifdef _OPENMP
      struct one_omp_thread {
        int before = omp_get_max_threads();
        bool set = omp_in_parallel();
        one_omp_thread() {
          if (set) omp_set_num_threads(1);
        }
        ~one_omp_thread() {
          if (set) omp_set_num_threads(before);
        }
      } const omp_threads;
#endif
      for (std::int64_t t = begin; t < end; ++t) body(t);
    });
  }
};

// The autograd node of the parallel tasks. Each task records its graph from
// views of the caller's tensors; the node keeps edges into those graphs, not
// the tasks' outputs, so the joined outputs are the only copy of them. Its
// next edges are the caller's tensors and then every task output's edge, so
// that the task graphs are part of the caller's graph. Two ways back:
//  - parallel (a first-order backward): the task graphs' backward runs in
//    parallel tasks here (the engine would run them on one thread), each
//    stopped at its task's views and kept; the gradients are joined (mapped
//    tensors' along their sets, shared ones' summed) and returned for the
//    caller's tensors, none for the task outputs. The engine then passes
//    through the task graphs with no gradient (it computes nothing there) and
//    frees them as it frees the caller's graph: retain_graph, and a second
//    backward failing without it, are as through one task.
//  - through the engine (a backward that records a graph, create_graph, and
//    every backward after one): the incoming gradients go to the task
//    outputs, none to the caller's tensors, and the engine runs the task
//    graphs in the caller's graph task, as one task's graph. A graph of
//    gradients refers to tensors inside the task graphs, which a later
//    backward reaches directly; running the task graphs in a graph task of
//    their own then would free them under it.
class set_tasks_backward : public torch::autograd::Node {
 public:
  // tensors: the caller's tensors (mapped ones narrowed per task);
  // task_targets[t][k]: the edge of task t's view of tensor k (invalid where
  // tensor k takes no gradient); task_roots[t][j]: the edge of task t's output
  // j (invalid where it takes none).
  set_tasks_backward(std::int64_t sets, std::int64_t per_task, std::vector<bool> mapped, const std::vector<at::Tensor>& tensors,
                     std::vector<std::vector<torch::autograd::Edge>> task_targets,
                     std::vector<std::vector<torch::autograd::Edge>> task_roots)
      : sets_(sets), per_task_(per_task), mapped_(std::move(mapped)), targets_(std::move(task_targets)) {
    torch::autograd::edge_list next;
    for (const at::Tensor& x : tensors) {
      const bool takes = x.defined() && x.requires_grad();
      next.push_back(takes ? torch::autograd::impl::gradient_edge(x) : torch::autograd::Edge());
      gradient_like_.push_back(takes ? at::zeros({}, x.options()).expand(x.sizes()) : at::Tensor());
    }
    outputs_ = task_roots.empty() ? 0 : task_roots[0].size();
    for (auto& task : task_roots)
      for (auto& root : task) next.push_back(std::move(root));
    set_next_edges(std::move(next));
  }

  std::string name() const override { return "tensordict::detail::set_tasks_backward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const std::size_t n = mapped_.size();
    const auto count = static_cast<std::int64_t>(targets_.size());
    const set_tasks_plan plan{sets_, per_task_, mapped_, nullptr};
    torch::autograd::variable_list result(num_outputs());
    if (at::GradMode::is_enabled()) through_engine_ = true;
    if (through_engine_) {
      for (std::int64_t t = 0; t < count; ++t)
        for (std::size_t j = 0; j < outputs_; ++j)
          if (grads[j].defined()) result[n + static_cast<std::size_t>(t) * outputs_ + j] = grads[j].narrow(0, plan.start(t), plan.length(t));
      return result;
    }

    // A mapped tensor's gradient is joined by each task writing its sets' part (in parallel: a copy after the
    // tasks took a fifth of a small ensemble's step at two threads); a shared one's parts are summed after.
    std::vector<at::Tensor> joined(n);
    for (std::size_t k = 0; k < n; ++k)
      if (mapped_[k] && gradient_like_[k].defined()) joined[k] = at::empty(gradient_like_[k].sizes(), gradient_like_[k].options());
    std::vector<std::vector<at::Tensor>> task_grads(targets_.size(), std::vector<at::Tensor>(n));
    plan.for_each_task([&](std::int64_t t) {
      auto& own = task_grads[static_cast<std::size_t>(t)];
      const auto& targets = targets_[static_cast<std::size_t>(t)];
      torch::autograd::edge_list from, to;
      torch::autograd::variable_list from_grads;
      for (std::size_t j = 0; j < outputs_; ++j) {
        const torch::autograd::Edge& root = next_edge(n + static_cast<std::size_t>(t) * outputs_ + j);
        if (!root.is_valid() || !grads[j].defined()) continue;
        from.push_back(root);
        from_grads.push_back(grads[j].narrow(0, plan.start(t), plan.length(t)));
      }
      std::vector<std::size_t> which;
      for (std::size_t k = 0; k < n; ++k)
        if (targets[k].is_valid()) {
          to.push_back(targets[k]);
          which.push_back(k);
        }
      if (!from.empty() && !to.empty()) {
        const auto got = torch::autograd::Engine::get_default_engine().execute(from, from_grads, /*keep_graph=*/true,
                                                                               /*create_graph=*/false, /*accumulate_grad=*/false, to);
        for (std::size_t i = 0; i < which.size(); ++i) own[which[i]] = got[i];
      }
      for (std::size_t k = 0; k < n; ++k) {
        if (!joined[k].defined()) continue;
        at::Tensor part = joined[k].narrow(0, plan.start(t), plan.length(t));
        if (own[k].defined())
          part.copy_(own[k]);
        else
          part.zero_();  // this task's graph did not reach the tensor
      }
    });
    for (std::size_t k = 0; k < n; ++k) {
      bool any = false;
      for (const auto& g : task_grads) any = any || g[k].defined();
      if (!any) continue;
      if (mapped_[k]) {
        result[k] = joined[k];
      } else {
        for (const auto& g : task_grads)
          if (g[k].defined()) result[k] = result[k].defined() ? at::add(result[k], g[k]) : g[k];  // not in place: g may alias grads
      }
    }
    return result;
  }

 private:
  std::int64_t sets_, per_task_;
  std::vector<bool> mapped_;
  std::size_t outputs_ = 0;
  std::vector<std::vector<torch::autograd::Edge>> targets_;
  // Per tensor that takes a gradient, one of its shape and options (expanded zeros: no memory).
  std::vector<at::Tensor> gradient_like_;
  bool through_engine_ = false;
};

// Each output's parts of the tasks, joined along the sets.
inline std::vector<at::Tensor> join_set_tasks(const std::vector<std::vector<at::Tensor>>& outputs) {
  std::vector<at::Tensor> joined;
  for (std::size_t j = 0; j < outputs[0].size(); ++j) {
    std::vector<at::Tensor> parts;
    for (const auto& o : outputs) parts.push_back(o[j]);
    joined.push_back(at::cat(parts, 0));
  }
  return joined;
}

TENSORDICT_DECL std::vector<at::Tensor> run_set_tasks(std::int64_t sets, std::int64_t per_task, const std::vector<at::Tensor>& tensors,
                                                      const std::vector<bool>& mapped, const set_task& task) {
  const set_tasks_plan plan{sets, per_task, mapped, &task};
  const auto count = static_cast<std::size_t>(plan.count());
  const bool wants_grad = at::GradMode::is_enabled() &&
                          std::any_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
  std::vector<std::vector<at::Tensor>> outputs(count);
  if (!wants_grad) {
    plan.for_each_task([&](std::int64_t t) { outputs[t] = task(plan.inputs_of(tensors, t), plan.start(t), plan.length(t)); });
    return join_set_tasks(outputs);
  }

  using torch::autograd::Edge;
  std::vector<std::vector<Edge>> roots(count), targets(count);
  plan.for_each_task([&](std::int64_t t) {
    const std::vector<at::Tensor> own = plan.inputs_of(tensors, t);
    outputs[t] = task(own, plan.start(t), plan.length(t));
    for (const at::Tensor& x : own)
      targets[t].push_back(x.defined() && x.requires_grad() ? torch::autograd::impl::gradient_edge(x) : Edge());
    for (const at::Tensor& y : outputs[t])
      roots[t].push_back(y.defined() && y.requires_grad() ? torch::autograd::impl::gradient_edge(y) : Edge());
  });
  std::vector<at::Tensor> joined;
  {
    const at::NoGradGuard no_grad;
    joined = join_set_tasks(outputs);
  }
  std::vector<bool> differentiable(joined.size(), false);
  for (const auto& task_roots : roots)
    for (std::size_t j = 0; j < task_roots.size(); ++j) differentiable[j] = differentiable[j] || task_roots[j].is_valid();
  outputs.clear();  // the joined outputs are the only copy

  std::shared_ptr<set_tasks_backward> node(
      new set_tasks_backward(sets, per_task, mapped, tensors, std::move(targets), std::move(roots)), torch::autograd::deleteNode);
  for (std::size_t j = 0; j < joined.size(); ++j) {
    if (differentiable[j])
      torch::autograd::set_history(joined[j], node);
    else
      node->add_input_metadata(torch::autograd::Node::undefined_input());
  }
  return joined;
}

namespace claimed {
// One call's bodies: taken by index (next), counted when ended (done).
struct job {
  std::int64_t count = 0;
  const std::function<void(std::int64_t)>* body = nullptr;  // valid while done < count: the caller waits for that
  at::ThreadLocalState state;
  std::atomic<std::int64_t> next{0}, done{0};
  std::mutex error_mutex;
  std::exception_ptr error;

  void work() {
    for (std::int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) {
      try {
        (*body)(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      if (done.fetch_add(1) + 1 == count) done.notify_all();
    }
  }
};

inline thread_local bool on_helper = false;

// The helper threads, started as calls want them and kept (asleep) for the program's life.
class helpers {
 public:
  static helpers& instance() {
    static helpers* pool = new helpers;  // never destroyed: threads asleep at exit need no join
    return *pool;
  }
  void post(const std::shared_ptr<job>& j, int wanted) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      while (static_cast<int>(threads_.size()) < wanted) threads_.emplace_back([this] { loop(); }).detach();
      current_ = j;
      ++generation_;
    }
    wake_.notify_all();
  }

 private:
  void loop() {
    on_helper = true;
    std::uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<job> j;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        j = current_;
      }
      if (j && j->next.load() < j->count) {  // (work() checks again; this spares a taken job the guard)
        const at::ThreadLocalStateGuard guard(j->state);
        j->work();
      }
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::thread> threads_;
  std::shared_ptr<job> current_;
  std::uint64_t generation_ = 0;
};
}  // namespace claimed

TENSORDICT_DECL void for_each_claimed(std::int64_t count, int threads, const std::function<void(std::int64_t)>& body) {
  const int helpers = static_cast<int>(std::min<std::int64_t>(threads, count)) - 1;
  if (helpers < 1 || claimed::on_helper || at::in_parallel_region()) {
    for (std::int64_t i = 0; i < count; ++i) body(i);
    return;
  }
  auto j = std::make_shared<claimed::job>();
  j->count = count;
  j->body = &body;
  claimed::helpers::instance().post(j, helpers);
  j->work();
  for (std::int64_t d = j->done.load(); d < count; d = j->done.load()) j->done.wait(d);
  j->body = nullptr;
  if (j->error) std::rethrow_exception(j->error);
}
}  // namespace tensordict::detail
#endif  // TENSORDICT_DEFINITIONS
