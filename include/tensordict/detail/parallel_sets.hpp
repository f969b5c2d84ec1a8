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

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/Config.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../errors.hpp"
#include "core_cache.hpp"

namespace tensordict::detail {

// Sets per task: as many as fit in a core's cache by the estimate, but at
// most two tasks per thread (each task costs its ops' fixed overheads again;
// measured on 128 and 8 sets, more tasks did not pay), at least one per
// thread, a number the threads share evenly, and enough work per task
// (4 MFLOP, some 50 us of a core) to outweigh a task's start.
inline std::int64_t sets_per_task(std::int64_t sets, std::int64_t bytes_per_set, double flops_per_set, std::int64_t threads) {
  const std::int64_t fit = std::max<std::int64_t>(1, core_cache_bytes() / std::max<std::int64_t>(1, bytes_per_set));
  const std::int64_t worth = static_cast<std::int64_t>(4e6 / std::max(1.0, flops_per_set)) + 1;
  const std::int64_t fewest = (sets + 2 * threads - 1) / (2 * threads);
  std::int64_t tasks = (sets + std::max({fit, worth, fewest}) - 1) / std::max({fit, worth, fewest});
  if (tasks < 2) return sets;
  tasks = std::min(sets, (tasks + threads - 1) / threads * threads);
  return (sets + tasks - 1) / tasks;
}

// task(tensors, start, length): the outputs of sets [start, start + length)
// (dim 0 of each indexes them), given the call's tensors narrowed to them
// (dim 0 of those marked `mapped` indexes the sets; the others every set shares).
using set_task = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&, std::int64_t, std::int64_t)>;

struct set_tasks_plan {
  std::int64_t sets = 0;
  std::int64_t per_task = 0;
  std::vector<bool> mapped;
  const set_task* task = nullptr;

  std::int64_t count() const { return (sets + per_task - 1) / per_task; }
  std::int64_t start(std::int64_t t) const { return t * per_task; }
  std::int64_t length(std::int64_t t) const { return std::min(per_task, sets - t * per_task); }

  // The tensors of task t, as new autograd leaves where `as_leaves`.
  std::vector<at::Tensor> inputs_of(const std::vector<at::Tensor>& tensors, std::int64_t t, bool as_leaves) const {
    std::vector<at::Tensor> out;
    out.reserve(tensors.size());
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      const at::Tensor& whole = tensors[k];
      at::Tensor part = mapped[k] ? whole.narrow(0, start(t), length(t)) : whole;
      if (as_leaves) {
        part = part.detach();
        if (whole.requires_grad()) part.requires_grad_(true);
      }
      out.push_back(std::move(part));
    }
    return out;
  }

  // Runs body(t) for every task, across the intra-op threads, each with the
  // caller's thread-local state and one thread for what it calls: oneDNN
  // (libtorch's convolutions) sizes its own OpenMP teams by
  // omp_get_max_threads(), and inside a task its team would have one thread
  // where its barriers wait for more (measured: a convolution's backward spun forever).
  template <class Body>
  void for_each_task(Body&& body) const {
    const at::ThreadLocalState state;
    at::parallel_for(0, count(), 1, [&](std::int64_t begin, std::int64_t end) {
      const at::ThreadLocalStateGuard guard(state);
#ifdef _OPENMP
      if (omp_in_parallel()) omp_set_num_threads(1);  // this task's own setting, not the caller's
#endif
      for (std::int64_t t = begin; t < end; ++t) body(t);
    });
  }
};

// The autograd node of the parallel tasks: forward runs them, each recording
// its own graph from leaves of its own; backward runs those graphs in
// parallel and joins the gradients (mapped tensors' by their sets, shared
// ones' summed). First-order only: a graph of the gradients would not reach
// the caller's tensors.
struct set_tasks_function : torch::autograd::Function<set_tasks_function> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const set_tasks_plan* plan,
                                                at::TensorList tensors) {
    const std::vector<at::Tensor> whole(tensors.begin(), tensors.end());
    const std::int64_t count = plan->count();
    std::vector<std::vector<at::Tensor>> outputs(static_cast<std::size_t>(count));
    std::vector<std::vector<at::Tensor>> leaves(static_cast<std::size_t>(count));
    plan->for_each_task([&](std::int64_t t) {
      const at::AutoGradMode record(true);
      leaves[t] = plan->inputs_of(whole, t, true);
      outputs[t] = (*plan->task)(leaves[t], plan->start(t), plan->length(t));
    });
    std::vector<at::Tensor> flat_leaves, flat_outputs;
    for (auto& l : leaves) flat_leaves.insert(flat_leaves.end(), l.begin(), l.end());
    for (auto& o : outputs) flat_outputs.insert(flat_outputs.end(), o.begin(), o.end());
    ctx->saved_data["outputs"] = flat_outputs;
    ctx->saved_data["tasks"] = count;
    ctx->saved_data["leaves"] = flat_leaves;
    ctx->saved_data["per_task"] = plan->per_task;
    c10::List<bool> mapped;
    for (bool m : plan->mapped) mapped.push_back(m);
    ctx->saved_data["mapped"] = mapped;
    return join(outputs, true);
  }

  // Each output's parts of the tasks, joined along the sets.
  static std::vector<at::Tensor> join(const std::vector<std::vector<at::Tensor>>& outputs, bool detached) {
    std::vector<at::Tensor> joined;
    for (std::size_t j = 0; j < outputs[0].size(); ++j) {
      std::vector<at::Tensor> parts;
      for (const auto& o : outputs) parts.push_back(detached ? o[j].detach() : o[j]);
      joined.push_back(at::cat(parts, 0));
    }
    return joined;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    if (at::GradMode::is_enabled())
      throw error(
          "functional_vmap: a graph of the gradients (create_graph=true) through sets run in parallel tasks is not "
          "supported; run them in one task (functional_vmap_options{.sets_per_task = <the number of sets>})");
    const std::vector<at::Tensor> outputs = ctx->saved_data["outputs"].toTensorVector();
    const std::vector<at::Tensor> flat_leaves = ctx->saved_data["leaves"].toTensorVector();
    std::vector<bool> mapped;
    for (bool m : ctx->saved_data["mapped"].toBoolList()) mapped.push_back(m);
    const std::size_t n = mapped.size();
    const std::int64_t count = ctx->saved_data["tasks"].toInt();
    const std::size_t n_out = outputs.size() / static_cast<std::size_t>(count);
    const std::int64_t per_task = ctx->saved_data["per_task"].toInt();

    // Per task, the gradients of its leaves that take one.
    std::vector<std::vector<at::Tensor>> grads(static_cast<std::size_t>(count), std::vector<at::Tensor>(n));
    const set_tasks_plan plan{count * per_task, per_task, mapped, nullptr};
    plan.for_each_task([&](std::int64_t t) {
        // The task's outputs that carry a gradient, with theirs.
        std::vector<at::Tensor> outs, outs_grads;
        for (std::size_t j = 0; j < n_out; ++j) {
          const at::Tensor& out = outputs[static_cast<std::size_t>(t) * n_out + j];
          if (!grad_outputs[j].defined() || !out.requires_grad()) continue;
          outs.push_back(out);
          outs_grads.push_back(grad_outputs[j].narrow(0, t * per_task, out.size(0)));
        }
        if (outs.empty()) return;
        std::vector<at::Tensor> wanted;
        std::vector<std::size_t> where;
        for (std::size_t k = 0; k < n; ++k) {
          const at::Tensor& leaf = flat_leaves[static_cast<std::size_t>(t) * n + k];
          if (leaf.requires_grad()) {
            wanted.push_back(leaf);
            where.push_back(k);
          }
        }
        const auto g = torch::autograd::grad(outs, wanted, outs_grads, /*retain_graph=*/false, /*create_graph=*/false,
                                             /*allow_unused=*/true);
        for (std::size_t j = 0; j < where.size(); ++j) grads[t][where[j]] = g[j];
      });
    // One per forward argument: none for the plan, then the tensors'.
    torch::autograd::variable_list result{at::Tensor()};
    for (std::size_t k = 0; k < n; ++k) {
      std::vector<at::Tensor> parts;
      bool any = false;
      for (std::int64_t t = 0; t < count; ++t) {
        const at::Tensor& leaf = flat_leaves[static_cast<std::size_t>(t) * n + k];
        at::Tensor g = grads[t][k];
        any = any || g.defined();
        if (!g.defined() && mapped[k]) g = at::zeros_like(leaf);
        parts.push_back(std::move(g));
      }
      if (!any) {
        result.emplace_back();
      } else if (mapped[k]) {
        result.push_back(at::cat(parts, 0));
      } else {
        at::Tensor sum;
        for (auto& g : parts)
          if (g.defined()) sum = sum.defined() ? at::add(sum, g) : g;  // not in place: g may alias grad_outputs
        result.push_back(sum);
      }
    }
    return result;
  }
};

// The joined outputs of task(...) over `sets` sets in tasks of `per_task`,
// differentiable with respect to `tensors` where gradients are wanted.
inline std::vector<at::Tensor> run_set_tasks(std::int64_t sets, std::int64_t per_task, const std::vector<at::Tensor>& tensors,
                                const std::vector<bool>& mapped, const set_task& task) {
  const set_tasks_plan plan{sets, per_task, mapped, &task};
  const bool wants_grad = at::GradMode::is_enabled() &&
                          std::any_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) { return t.requires_grad(); });
  if (wants_grad) return set_tasks_function::apply(&plan, at::TensorList(tensors));
  std::vector<std::vector<at::Tensor>> outputs(static_cast<std::size_t>(plan.count()));
  plan.for_each_task([&](std::int64_t t) { outputs[t] = task(plan.inputs_of(tensors, t, false), plan.start(t), plan.length(t)); });
  return set_tasks_function::join(outputs, false);
}

}  // namespace tensordict::detail
