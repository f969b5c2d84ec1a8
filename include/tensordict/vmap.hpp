// vmap for C++: calls a function once per slice of its mapped inputs, in one
// vectorized call, on libtorch's functorch machinery.
//
//   auto f = tensordict::vmap([](const at::Tensor& x, const auto& params) { ... },
//                             {std::nullopt, 0});          // x shared, params mapped over dim 0
//   auto y = f(x, params_stack);                            // outputs get the mapped dim first
//
// Arguments are tensors, typed TensorDicts (mapped over one of their batch
// dims, which they lose inside and get back in the outputs) or anything else
// (passed through, shared). Outputs are tensors, TensorDicts, std::tuples or
// std::vectors of them.
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "errors.hpp"

#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>

#define TENSORDICT_COMPAT_FUNCTORCH
#include "detail/compat.hpp"
#include "detail/config.hpp"
#include "typed_tensordict.hpp"

namespace tensordict {

// What a random op inside vmap does: "error" throws, "different" draws
// different values per mapped slice, "same" draws one set for all slices.
enum class randomness { error, different, same };

// The mapped dim of one argument; std::nullopt shares the argument.
using in_dim = std::optional<std::int64_t>;

struct vmap_options {
  tensordict::randomness randomness = tensordict::randomness::error;
  std::optional<std::int64_t> chunk_size{};  // slices computed at once; all when unset
};

namespace detail {

inline functorch::randomness_kind to_kind(randomness r) {
  switch (r) {
    case randomness::same: return functorch::randomness_kind::same;
    case randomness::different: return functorch::randomness_kind::different;
    default: return functorch::randomness_kind::error;
  }
}

// One vmap level for the scope of a call, popped also when the call throws.
class vmap_level {
 public:
  vmap_level(std::int64_t batch_size, randomness r) : level_(functorch::push_vmap_layer(batch_size, to_kind(r))) {}
  ~vmap_level() { functorch::pop_vmap_layer(); }
  vmap_level(const vmap_level&) = delete;
  vmap_level& operator=(const vmap_level&) = delete;
  std::int64_t level() const { return level_; }

 private:
  std::int64_t level_;
};

template <class T>
inline constexpr bool is_tensor_v = std::is_same_v<std::remove_cvref_t<T>, at::Tensor>;
template <class T>
inline constexpr bool is_td_v = is_tensordict<std::remove_cvref_t<T>>::value;

[[noreturn]] TENSORDICT_DECL void throw_in_dim_out_of_range(std::int64_t dim, std::int64_t ndim, std::size_t arg);
#if TENSORDICT_DEFINITIONS
TENSORDICT_DECL void throw_in_dim_out_of_range(std::int64_t dim, std::int64_t ndim, std::size_t arg) {
  throw index_error("vmap: in_dim " + std::to_string(dim) + " of argument " + std::to_string(arg) +
                    " is out of range for an input with " + std::to_string(ndim) + " (batch) dims");
}
#endif  // TENSORDICT_DEFINITIONS

inline std::int64_t normalize_dim(std::int64_t dim, std::int64_t ndim, std::size_t arg) {
  if (dim < -ndim || dim >= ndim) throw_in_dim_out_of_range(dim, ndim, arg);
  return dim < 0 ? dim + ndim : dim;
}

// Size of an argument at its mapped dim, or -1 when it is not mapped.
template <class Arg>
std::int64_t mapped_size(const Arg& arg, const in_dim& dim, std::size_t index) {
  if (!dim) return -1;
  if constexpr (is_tensor_v<Arg>) {
    return arg.size(normalize_dim(*dim, arg.dim(), index));
  } else if constexpr (is_td_v<Arg>) {
    return arg.batch_size()[normalize_dim(*dim, static_cast<std::int64_t>(arg.batch_dims()), index)];
  } else {
    throw error("vmap: argument " + std::to_string(index) +
                " is neither a tensor nor a TensorDict, so it cannot be mapped; give it the in_dim std::nullopt");
  }
}

template <class Arg>
decltype(auto) narrow_arg(const Arg& arg, const in_dim& dim, std::int64_t start, std::int64_t length) {
  if constexpr (is_tensor_v<Arg>) {
    if (dim) return at::Tensor(arg.narrow(normalize_dim(*dim, arg.dim(), 0), start, length));
    return at::Tensor(arg);
  } else if constexpr (is_td_v<Arg>) {
    if (!dim) return Arg(arg);
    const std::int64_t d = normalize_dim(*dim, static_cast<std::int64_t>(arg.batch_dims()), 0);
    std::vector<std::int64_t> batch(arg.batch_size().begin(), arg.batch_size().end());
    batch[d] = length;
    return arg.apply([&](const at::Tensor& t) { return t.narrow(d, start, length); }, batch);
  } else {
    return (arg);
  }
}

template <class Arg>
decltype(auto) wrap_arg(const Arg& arg, const in_dim& dim, std::int64_t level) {
  if constexpr (is_tensor_v<Arg>) {
    if (!dim) return at::Tensor(arg);
    return functorch::add_batch_dim(arg, normalize_dim(*dim, arg.dim(), 0), level);
  } else if constexpr (is_td_v<Arg>) {
    if (!dim) return Arg(arg);
    const std::int64_t d = normalize_dim(*dim, static_cast<std::int64_t>(arg.batch_dims()), 0);
    std::vector<std::int64_t> batch(arg.batch_size().begin(), arg.batch_size().end());
    batch.erase(batch.begin() + d);
    return arg.apply([&](const at::Tensor& t) { return functorch::add_batch_dim(t, d, level); }, batch);
  } else {
    return (arg);
  }
}

template <class Out>
Out unwrap_output(const Out& out, std::int64_t level, std::int64_t batch_size) {
  if constexpr (is_tensor_v<Out>) {
    return functorch::remove_batch_dim(out, level, batch_size, 0);
  } else if constexpr (is_td_v<Out>) {
    std::vector<std::int64_t> batch{batch_size};
    batch.insert(batch.end(), out.batch_size().begin(), out.batch_size().end());
    return out.apply([&](const at::Tensor& t) { return functorch::remove_batch_dim(t, level, batch_size, 0); }, batch);
  } else if constexpr (requires { std::tuple_size<Out>::value; }) {
    return std::apply([&](const auto&... parts) { return Out{unwrap_output(parts, level, batch_size)...}; }, out);
  } else if constexpr (requires { typename Out::value_type; out.begin(); }) {
    Out result;
    for (const auto& part : out) result.push_back(unwrap_output(part, level, batch_size));
    return result;
  } else {
    static_assert(is_tensor_v<Out>, "tensordict::vmap: the function must return tensors, TensorDicts, or std::tuples "
                                    "or std::vectors of them.");
    return out;
  }
}

template <std::size_t I, class Tuple>
auto column(const std::vector<Tuple>& rows) {
  std::vector<std::remove_cvref_t<std::tuple_element_t<I, Tuple>>> out;
  for (const auto& r : rows) out.push_back(std::get<I>(r));
  return out;
}

// Joins the outputs of the chunks along the mapped dim.
template <class Out>
Out concatenate(const std::vector<Out>& chunks) {
  if constexpr (is_tensor_v<Out>) {
    return at::cat(chunks, 0);
  } else if constexpr (is_td_v<Out>) {
    return cat(chunks, 0);  // the TensorDict's own (argument-dependent lookup): nested batch sizes join too
  } else if constexpr (requires { std::tuple_size<Out>::value; }) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return Out{concatenate(column<I>(chunks))...};
    }(std::make_index_sequence<std::tuple_size_v<Out>>{});
  } else {
    Out result;
    for (std::size_t j = 0; j < chunks[0].size(); ++j) {
      std::vector<std::remove_cvref_t<decltype(chunks[0][0])>> parts;
      for (const auto& c : chunks) parts.push_back(c[j]);
      result.push_back(concatenate(parts));
    }
    return result;
  }
}

// A TensorDict's device for random draws: its own, else its first set leaf's.
TENSORDICT_DECL std::optional<at::Device> draw_device_of_leaves(const std::optional<at::Device>& own,
                                                               c10::ArrayRef<at::Tensor> leaves);
#if TENSORDICT_DEFINITIONS
TENSORDICT_DECL std::optional<at::Device> draw_device_of_leaves(const std::optional<at::Device>& own,
                                                               c10::ArrayRef<at::Tensor> leaves) {
  if (own) return own;
  for (const at::Tensor& t : leaves)
    if (t.defined()) return t.device();
  return std::nullopt;
}
#endif  // TENSORDICT_DEFINITIONS

// The device whose generator an argument's random ops draw from: a tensor's,
// or a TensorDict's (draw_device_of_leaves); none for other values.
template <class Arg>
std::optional<at::Device> draw_device_of(const Arg& arg) {
  if constexpr (is_tensor_v<Arg>) {
    return arg.defined() ? std::optional<at::Device>(arg.device()) : std::nullopt;
  } else if constexpr (is_td_v<Arg>) {
    if constexpr (!requires { Arg::leaf_count; }) return draw_device_of_leaves(arg.device(), arg.values());
    else if constexpr (Arg::leaf_count == 0) return arg.device();
    else return draw_device_of_leaves(arg.device(), c10::ArrayRef<at::Tensor>(&arg.leaf(0), Arg::leaf_count));
  } else {
    return std::nullopt;
  }
}

template <class... Args>
at::Device draw_device(const Args&... args) {
  std::optional<at::Device> device;
  ((device = device ? device : std::optional<at::Device>(draw_device_of(args))), ...);
  return device.value_or(at::Device(at::kCPU));
}

// Calls f(start, length) for each chunk of `total` sets and joins the
// outputs. With "same" randomness every chunk replays one state of the
// generator of `device` (the inputs'), read and written under its mutex so
// that other threads' draws do not tear it; the draws themselves lock it again.
template <class F>
auto run_chunks(std::int64_t total, std::int64_t chunk, randomness r, at::Device device, F&& f) {
  using Out = decltype(f(std::int64_t{0}, total));
  std::vector<Out> parts;
  std::optional<at::Tensor> rng_state;
  at::Generator generator;
  if (r == randomness::same) {
    generator = device.is_cpu() ? at::detail::getDefaultCPUGenerator() : at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    rng_state = generator.get_state();
  }
  for (std::int64_t start = 0; start < total; start += chunk) {
    if (rng_state) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(*rng_state);
    }
    parts.push_back(f(start, std::min(chunk, total - start)));
  }
  return concatenate(parts);
}

}  // namespace detail

// A function mapped over its inputs; made by tensordict::vmap.
template <class F>
class vmapped {
 public:
  vmapped(F f, std::vector<in_dim> in_dims, vmap_options options)
      : f_(std::move(f)), in_dims_(std::move(in_dims)), options_(options) {}

  template <class... Args>
  auto operator()(const Args&... args) const {
    constexpr std::size_t n = sizeof...(Args);
    std::array<in_dim, n> dims{};
    if (in_dims_.empty()) {
      // Python's in_dims=0: every tensor and TensorDict is mapped over its first dim.
      std::size_t i = 0;
      ((dims[i++] = (detail::is_tensor_v<Args> || detail::is_td_v<Args>) ? in_dim(0) : std::nullopt), ...);
    } else if (in_dims_.size() != n) {
      throw error("vmap: " + std::to_string(in_dims_.size()) + " in_dims for " + std::to_string(n) + " arguments");
    } else {
      std::copy(in_dims_.begin(), in_dims_.end(), dims.begin());
    }
    std::int64_t batch_size = -1;
    std::size_t first = 0, index = 0;
    auto check = [&](std::int64_t size) {
      if (size >= 0 && batch_size >= 0 && size != batch_size)
        throw shape_error("vmap: argument " + std::to_string(first) + " has size " + std::to_string(batch_size) +
                          " at its mapped dim but argument " + std::to_string(index) + " has size " + std::to_string(size));
      if (size >= 0 && batch_size < 0) {
        batch_size = size;
        first = index;
      }
      ++index;
    };
    (check(detail::mapped_size(args, dims[index], index)), ...);
    if (batch_size < 0) throw error("vmap: no argument is mapped; give at least one an in_dim");

    const std::int64_t chunk = options_.chunk_size.value_or(batch_size);
    if (chunk <= 0) throw error("vmap: chunk_size must be positive, got " + std::to_string(chunk));
    if (chunk >= batch_size) return call_once(batch_size, dims, args...);

    const at::Device device = detail::draw_device(args...);
    return detail::run_chunks(batch_size, chunk, options_.randomness, device, [&](std::int64_t start, std::int64_t length) {
      auto narrowed = [&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::make_tuple(detail::narrow_arg(args, dims[I], start, length)...);
      }(std::index_sequence_for<Args...>{});
      return std::apply([&](const auto&... parts) { return call_once(length, dims, parts...); }, narrowed);
    });
  }

 private:
  template <class... Args>
  auto call_once(std::int64_t batch_size, const std::array<in_dim, sizeof...(Args)>& dims, const Args&... args) const {
    detail::vmap_level layer(batch_size, options_.randomness);
    auto wrapped = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::make_tuple(detail::wrap_arg(args, dims[I], layer.level())...);
    }(std::index_sequence_for<Args...>{});
    auto out = std::apply(f_, wrapped);
    return detail::unwrap_output(out, layer.level(), batch_size);
  }

  F f_;
  std::vector<in_dim> in_dims_;
  vmap_options options_;
};

// vmap(f, in_dims, options): in_dims has one entry per argument (an empty
// list maps every tensor and TensorDict over dim 0, as Python's in_dims=0).
template <class F>
vmapped<std::decay_t<F>> vmap(F&& f, std::vector<in_dim> in_dims = {}, vmap_options options = {}) {
  return vmapped<std::decay_t<F>>(std::forward<F>(f), std::move(in_dims), options);
}

}  // namespace tensordict
