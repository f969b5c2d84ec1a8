// Target networks (TorchRL's torchrl.objectives.SoftUpdate / HardUpdate):
// a copy of a network's parameters that follows the trained ones slowly
// (Polyak averaging) or by periodic copies, as DQN, DDPG, TD3 and SAC use.
//
//   auto online = tensordict::from_module(*critic);            // the tensors the optimizer trains
//   auto target = tensordict::from_module(*target_critic);     // the target network's own tensors
//   tensordict::objectives::SoftUpdate update(target, online, /*tau=*/0.005);
//   update.init_();                                   // target <- online
//   ... optimizer.step(); update.step();             // target <- (1 - tau) target + tau online
//
// Both TensorDicts view the networks' tensors (from_module), so a step moves
// the target network's parameters in place, under no-grad. The keys, shapes
// and dtypes must match; that is checked when the updater is made, and each
// step writes every leaf or none.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>

#include "../any_tensordict.hpp"
#include "../errors.hpp"

namespace tensordict::objectives {

namespace detail {
// The same keys, shapes and dtypes, named in the error.
inline void check_target(const AnyTensorDict& target, const AnyTensorDict& source, const char* who) {
  const auto target_items = target.items(), source_items = source.items();
  for (const auto& [path, leaf] : source_items) {
    if (!target.contains(path) || !target.is_leaf(path))
      throw key_error(std::string(who) + ": the target has no leaf " + to_string(path) + " (the source's keys: make the target "
                      "from the same kind of network)");
    const at::Tensor& mine = target.get(path);
    if (mine.sizes() != leaf.sizes() || mine.scalar_type() != leaf.scalar_type())
      throw shape_error(std::string(who) + ": " + to_string(path) + " is " + c10::toString(mine.scalar_type()) +
                        format_sizes(mine.sizes()) + " in the target and " + c10::toString(leaf.scalar_type()) +
                        format_sizes(leaf.sizes()) + " in the source");
  }
  if (target_items.size() != source_items.size())
    throw key_error(std::string(who) + ": the target has " + std::to_string(target_items.size()) + " leaves, the source " +
                    std::to_string(source_items.size()));
}
}  // namespace detail

// target <- (1 - tau) * target + tau * source at each step (TorchRL: SoftUpdate(tau=...), eps = 1 - tau).
class SoftUpdate {
 public:
  SoftUpdate(AnyTensorDict target, AnyTensorDict source, double tau) : target_(std::move(target)), source_(std::move(source)), tau_(tau) {
    if (!(tau > 0 && tau <= 1)) throw value_error("SoftUpdate: tau must be in (0, 1], got " + std::to_string(tau));
    detail::check_target(target_, source_, "SoftUpdate");
  }
  double tau() const { return tau_; }
  // The target set to the source (TorchRL's init_).
  void init_() {
    at::NoGradGuard no_grad;
    target_.update_(source_);
  }
  void step() {
    at::NoGradGuard no_grad;
    target_.lerp_(source_, tau_);
  }

 private:
  AnyTensorDict target_, source_;
  double tau_;
};

// The source copied into the target every `value_network_update_interval` steps (TorchRL's HardUpdate).
class HardUpdate {
 public:
  HardUpdate(AnyTensorDict target, AnyTensorDict source, std::int64_t value_network_update_interval)
      : target_(std::move(target)), source_(std::move(source)), interval_(value_network_update_interval) {
    if (interval_ <= 0)
      throw value_error("HardUpdate: value_network_update_interval must be positive, got " + std::to_string(interval_));
    detail::check_target(target_, source_, "HardUpdate");
  }
  std::int64_t steps() const { return steps_; }
  void init_() {
    at::NoGradGuard no_grad;
    target_.update_(source_);
  }
  // Counts a step; on every interval-th, copies.
  void step() {
    if (++steps_ % interval_ == 0) init_();
  }

 private:
  AnyTensorDict target_, source_;
  std::int64_t interval_;
  std::int64_t steps_ = 0;
};

}  // namespace tensordict::objectives
