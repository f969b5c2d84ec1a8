// functional_vmap: calls a module once per set of stacked parameters.
//
//   auto params = tensordict::from_modules(nets);                   // batch_size [4]
//   auto y = tensordict::nn::functional_vmap(nets[0], params, tensordict::nn::args(x));   // [4, N, out]
//   auto z = tensordict::nn::functional_vmap(nets[0], params, {},
//                tensordict::nn::kwargs(tensordict::nn::kw<"input">(x_per_set)),
//                tensordict::nn::in_dims(tensordict::nn::in_dim_of<"input">(0)));
//
// As the reference: params' batch dims index the sets (several are flattened
// into one and restored in the outputs); args are shared by every set;
// kwargs are named inputs, passed after args in their order; in_dims maps
// kwargs to the dim that indexes the sets; randomness, chunk_size and loop as
// the reference; `method` calls another member function than forward.
//
// Module types with a batched form (nn::batched<Impl> in their adapter under
// modules/: Linear, Conv1d/2d/3d, LayerNorm, GroupNorm, InstanceNorm,
// Embedding, BatchNorm in eval, PReLU, the parameter-free modules and Dropout,
// TransformerEncoderLayer, RNN/LSTM/GRU, and the typed Sequential of them) are
// lowered to batched libtorch ops: one baddbmm for the sets of a Linear
// instead of one linear each. The others go through vmap with the stacked
// tensors swapped in; loop = true calls the sets one by one.
//
// On a run-time model (a torch::nn::Sequential, AnyModule, ...), params is an
// AnyTensorDict and the forward takes one tensor. On RNN, LSTM and GRU, params
// is an AnyTensorDict and the outputs are the module's (output, state).
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "../functional.hpp"  // the verbs it builds on, from_modules to stack the sets among them

#include <array>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Config.h>
#include <ATen/Parallel.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/stack.h>
#include <c10/util/Type.h>
#include <c10/util/accumulate.h>
#include <torch/nn/modules/activation.h>

#include "../any_tensordict.hpp"
#include "../detail/kernels/parallel_sets.hpp"
#include "../functional_call.hpp"
#include "module_registry.hpp"
#include "adapters/linear.hpp"
#include "sequential.hpp"  // lowers_whole: whether the batched forms take a module whole
#include "../vmap.hpp"

namespace tensordict {

namespace nn {

// ---- named inputs -------------------------------------------------------------

template <key Name, class T>
struct kwarg {
  static constexpr auto name = Name;
  T value;
};
template <key Name, class T>
kwarg<Name, std::decay_t<T>> kw(T&& value) {
  return {std::forward<T>(value)};
}

template <class... Kwargs>
struct kwargs_t {
  std::tuple<Kwargs...> values;
  static constexpr std::array<std::string_view, sizeof...(Kwargs)> names{Kwargs::name.view()...};
};
template <class... Kwargs>
kwargs_t<Kwargs...> kwargs(Kwargs... values) {
  return {{std::move(values)...}};
}

template <key Name>
struct in_dim_of {
  static constexpr auto name = Name;
  std::int64_t dim;
};

template <class... Dims>
struct in_dims_t {
  std::tuple<Dims...> dims;
};
template <class... Dims>
in_dims_t<Dims...> in_dims(Dims... dims) {
  return {{dims...}};
}

template <class... Args>
std::tuple<Args...> args(Args... values) {
  return {std::move(values)...};
}

struct functional_vmap_options {
  tensordict::randomness randomness = tensordict::randomness::error;
  std::optional<std::int64_t> chunk_size{};
  bool loop = false;
  // Where the call is lowered (and randomness is "error"), its sets run in
  // tasks of this many sets across at::get_num_threads() threads, each task
  // the whole call on its sets. Unset: with one thread, one task; with more,
  // detail::sets_per_task's choice (a cache-fitting estimate, at most two
  // tasks per thread, about 4 MFLOP per task at least). A call with a
  // convolution runs one task whatever is set. Results and gradients equal
  // the one-task path's.
  std::optional<std::int64_t> sets_per_task{};
};

namespace compile_error {
template <key InDim, class Kwargs>
struct in_dims_names_no_kwarg {
  static_assert(::tensordict::compile_error::always_false<Kwargs>,
                "tensordict::nn::functional_vmap: in_dims names an input (first in 'in_dims_names_no_kwarg<...>' above) "
                "that is not among the kwargs (the reference's KeyError). Add it with kw<\"name\">(value) to kwargs, or "
                "remove it from in_dims.");
};
}  // namespace compile_error

// Calls one module on a stacked value: its batched form when it has one (and
// supports its options), else vmap of its functional call.
template <class Impl, class S>
stacked call_stacked(Impl& m, const TensorDict<S>& p, const stacked& x, const batch_context& ctx) {
  if constexpr (has_stacked_form<Impl>) {
    bool lowered = true;
    if constexpr (requires { batched<Impl>::supports(m); }) lowered = batched<Impl>::supports(m);
    if (lowered) return batched<Impl>::forward(m, p, x, ctx);
  }
  auto one_set = [&m](const TensorDict<S>& params, const at::Tensor& input) { return functional_call(m, params, input); };
  return {vmap(one_set, {0, x.mapped ? in_dim(0) : std::nullopt}, {.randomness = ctx.randomness})(p, x.value), true};
}

// ---- functional_vmap ----------------------------------------------------------------

namespace detail {
using ::tensordict::detail::is_tensor_v;

// A leaf of params whose `batch_dims` leading dims become one sets dim.
TENSORDICT_DECL at::Tensor leaf_with_one_sets_dim(const at::Tensor& t, std::int64_t batch_dims, std::int64_t sets);

// Flattens params' batch dims into one sets dim.
template <class TD>
TD flatten_sets(const TD& params, std::int64_t sets) {
  const auto nb = static_cast<std::int64_t>(params.batch_dims());
  if (nb == 1) return params;
  return params.apply([&](const at::Tensor& t) { return leaf_with_one_sets_dim(t, nb, sets); }, {sets});
}

// Restores params' batch dims at the front of an output.
template <class Out>
Out unflatten_sets(const Out& out, c10::IntArrayRef batch) {
  if constexpr (std::is_same_v<Out, at::Tensor>) {
    if (batch.size() == 1) return out;  // already so (a reshape would cost an op and an autograd node)
    std::vector<std::int64_t> shape(batch.begin(), batch.end());
    shape.insert(shape.end(), out.sizes().begin() + 1, out.sizes().end());
    return out.reshape(shape);
  } else if constexpr (requires { std::tuple_size<Out>::value; }) {
    return std::apply([&](const auto&... parts) { return Out{unflatten_sets(parts, batch)...}; }, out);
  } else {
    Out result;
    for (const auto& part : out) result.push_back(unflatten_sets(part, batch));
    return result;
  }
}
}  // namespace detail

namespace detail {
// How many tensors a module's output holds (a tensor, or nested tuples of them).
template <class T>
inline constexpr std::size_t tensor_count = 0;
template <>
inline constexpr std::size_t tensor_count<at::Tensor> = 1;
template <class... Ts>
inline constexpr std::size_t tensor_count<std::tuple<Ts...>> = (tensor_count<std::remove_cvref_t<Ts>> + ... + 0);

// The output's tensors in order, depth first.
template <class T>
void flatten_output(const T& out, at::Tensor*& to) {
  if constexpr (std::is_same_v<T, at::Tensor>)
    *to++ = out;
  else
    std::apply([&](const auto&... parts) { (flatten_output(parts, to), ...); }, out);
}

// Whether an output is a tensor or nested tuples of tensors only.
template <class T>
inline constexpr bool is_tensor_tree = std::is_same_v<T, at::Tensor>;
template <class... Ts>
inline constexpr bool is_tensor_tree<std::tuple<Ts...>> = (is_tensor_tree<Ts> && ...);

// The output of type T from its tensors in flatten_output's order.
template <class T>
T unflatten_output(const at::Tensor*& from) {
  if constexpr (std::is_same_v<T, at::Tensor>)
    return *from++;
  else
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return T{unflatten_output<std::tuple_element_t<I, T>>(from)...};  // braced: in order
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
}

// Whether a call's inputs are one tensor.
template <class Inputs>
constexpr bool one_tensor() {
  if constexpr (std::tuple_size_v<Inputs> == 1)
    return std::is_convertible_v<std::tuple_element_t<0, Inputs>, at::Tensor>;
  else
    return false;
}

// One set's output (a tensor, or a tuple of them) with a sets dim of 1 in front.
template <class Out>
Out with_sets_dim(const Out& out) {
  if constexpr (std::is_same_v<Out, at::Tensor>)
    return out.unsqueeze(0);
  else
    return std::apply([](const auto&... parts) { return Out{with_sets_dim(parts)...}; }, out);
}

// The lowering of a one-tensor call: lower(p, stacked input, ctx) gives the
// batched form's result, or std::nullopt when there is none. A `lower` that
// always has one (it returns stacked) gives the tensor itself, not an optional:
// run_functional_vmap then compiles no vmap fallback for the call.
template <class Lower>
auto one_tensor_lowering(Lower lower) {
  return [lower](const auto& p, const auto& inputs, const auto& mapped, const batch_context& ctx) {
    using Inputs = std::remove_cvref_t<decltype(inputs)>;
    if constexpr (std::tuple_size_v<Inputs> == 1 && is_tensor_v<std::tuple_element_t<0, Inputs>>) {
      if constexpr (std::is_same_v<decltype(lower(p, std::declval<const stacked&>(), ctx)), stacked>) {
        return expand_sets(lower(p, stacked{std::get<0>(inputs), mapped[0]}, ctx), ctx.sets);
      } else {
        if (std::optional<stacked> out = lower(p, stacked{std::get<0>(inputs), mapped[0]}, ctx))
          return std::optional<at::Tensor>(expand_sets(*out, ctx.sets));
        return std::optional<at::Tensor>();
      }
    } else {
      return std::optional<at::Tensor>();
    }
  };
}

// The tensors inside a call's non-tensor inputs (an LSTM's optional (h, c)
// state, an attention mask): visited in order and rebuilt from replacements,
// so that every tensor a task reads is one of the task's tensors. A type
// whose tensors cannot be seen (a user's struct) keeps the call in one task.
template <class T>
concept optional_like = requires(const T& o) {
  typename T::value_type;
  { o.has_value() } -> std::convertible_to<bool>;
  *o;
};
template <class T>
inline constexpr bool is_vector_v = false;
template <class T, class A>
inline constexpr bool is_vector_v<std::vector<T, A>> = true;
template <class T>
concept tuple_like = requires { std::tuple_size<T>::value; };

template <class T>
constexpr bool tensors_visible() {
  if constexpr (is_tensor_v<T> || std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_same_v<T, std::string> ||
                std::is_same_v<T, std::string_view> || std::is_same_v<T, std::nullptr_t>)
    return true;
  else if constexpr (optional_like<T> || is_vector_v<T>)
    return tensors_visible<std::remove_cvref_t<typename T::value_type>>();
  else if constexpr (tuple_like<T>)
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (tensors_visible<std::remove_cvref_t<std::tuple_element_t<I, T>>>() && ...);
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  else
    return false;
}

template <class T, class F>
void for_each_nested_tensor(const T& x, F& f) {
  if constexpr (is_tensor_v<T>)
    f(x);
  else if constexpr (optional_like<T>) {
    if (x.has_value()) for_each_nested_tensor(*x, f);
  } else if constexpr (is_vector_v<T>) {
    for (const auto& e : x) for_each_nested_tensor(e, f);
  } else if constexpr (tuple_like<T>)
    std::apply([&](const auto&... e) { (for_each_nested_tensor(e, f), ...); }, x);
}

// x with its tensors replaced by next() in for_each_nested_tensor's order.
template <class T, class Next>
T with_nested_tensors(const T& x, Next& next) {
  if constexpr (is_tensor_v<T>)
    return next();
  else if constexpr (optional_like<T>)
    return x.has_value() ? T(with_nested_tensors(*x, next)) : T();
  else if constexpr (is_vector_v<T>) {
    T out;
    out.reserve(x.size());
    for (const auto& e : x) out.push_back(with_nested_tensors(e, next));
    return out;
  } else if constexpr (tuple_like<T>)
    return std::apply([&](const auto&... e) { return T{with_nested_tensors(e, next)...}; }, x);  // braced: in order
  else
    return x;
}

// Throws where the call cannot be made: in_dims mapping inputs of params
// without a batch dim, or loop=true with randomness "same".
TENSORDICT_DECL void check_mapping(c10::IntArrayRef batch, bool any_mapped, const functional_vmap_options& options);

// Sets per chunk: options.chunk_size (checked), else all of them.
TENSORDICT_DECL std::int64_t chunk_of(std::int64_t sets, const functional_vmap_options& options);

// Whether a lowered call's sets may run in parallel tasks at all: false with
// one thread and no sets_per_task, or inside a functorch transform (its
// batched tensors and levels are the calling thread's). Throws for a
// sets_per_task that is not positive.
TENSORDICT_DECL bool tasks_allowed(const functional_vmap_options& options);

// Sets per task for a lowered call over `tensors` (its params' leaves, the
// first n_params, then its inputs' tensors; `mapped` marks those whose dim 0
// indexes the sets), or std::nullopt where one task takes them all: too few
// sets, or a convolution.
TENSORDICT_DECL std::optional<std::int64_t> task_sets(const std::vector<at::Tensor>& tensors, const std::vector<bool>& mapped,
                                                      std::size_t n_params, std::int64_t sets,
                                                      const functional_vmap_options& options);

// An input that in_dims maps at dim d, with the dims there that index
// params' batch (checked against it) flattened into one sets dim in front.
TENSORDICT_DECL at::Tensor flatten_mapped_input(const at::Tensor& in, std::int64_t d, c10::IntArrayRef batch, std::int64_t sets);

// A lowered call's sets in parallel tasks (detail/kernels/parallel_sets.hpp), or
// std::nullopt where they run as one (tasks_allowed, task_sets, or an input
// whose tensors cannot be seen). Params and every tensor of the inputs become
// the tasks' tensors; each task rebuilds them and calls lowered on its sets.
// Randomness "error" only: tasks drawing in parallel would not follow the seed.
template <class Out, class Params, class Inputs, std::size_t N, class Lowered>
std::optional<Out> run_in_tasks(const Params& p, const Inputs& inputs, const std::array<bool, N>& is_mapped,
                                std::int64_t sets, const functional_vmap_options& options, Lowered& lowered) {
  if (!tasks_allowed(options) || !tensors_visible<std::remove_cvref_t<Inputs>>()) return std::nullopt;
  std::vector<at::Tensor> tensors = p.values();  // in the order p.apply visits them
  const std::size_t n_params = tensors.size();
  std::vector<bool> mapped(n_params, true);
  std::apply(
      [&](const auto&... in) {
        std::size_t k = 0;
        (
            [&](const auto& x) {
              // Only a tensor input itself may be mapped (in_dims on another throws before).
              auto add = [&](const at::Tensor& t) {
                tensors.push_back(t);
                mapped.push_back(is_tensor_v<std::remove_cvref_t<decltype(x)>> && is_mapped[k]);
              };
              for_each_nested_tensor(x, add);
              ++k;
            }(in),
            ...);
      },
      inputs);
  const std::optional<std::int64_t> per_task = task_sets(tensors, mapped, n_params, sets, options);
  if (!per_task) return std::nullopt;

  const ::tensordict::detail::set_task task = [&](const std::vector<at::Tensor>& own, std::int64_t, std::int64_t length) {
    std::size_t next = 0;
    const std::array<std::int64_t, 1> task_sets{length};
    const Params task_params = p.apply([&](const at::Tensor&) { return own[next++]; }, task_sets);
    auto take = [&] { return own[next++]; };
    const Inputs task_inputs = with_nested_tensors(inputs, take);
    auto out = lowered(task_params, task_inputs, is_mapped, batch_context{length, options.randomness});
    std::vector<at::Tensor> flat(tensor_count<Out>);
    at::Tensor* to = flat.data();
    if constexpr (std::is_same_v<decltype(out), Out>) {
      flatten_output(std::move(out), to);
    } else {
      if (!out) throw error("functional_vmap: internal: a task's sets did not lower, the whole call did");
      flatten_output(Out(std::move(*out)), to);
    }
    return flat;
  };
  const std::vector<at::Tensor> joined = ::tensordict::detail::run_set_tasks(sets, *per_task, tensors, mapped, task);
  const at::Tensor* from = joined.data();
  return unflatten_output<Out>(from);
}

// What functional_vmap does once the inputs are known: params (in the
// module's own form), the inputs with the dims that map them, call_one(p,
// inputs...) for one set or under vmap, and lowered(p, inputs, mapped, ctx)
// giving the batched form's outputs (std::nullopt when there is none).
// `in_tasks`: lowered gives a value for these inputs, and its sets may run in parallel tasks.
template <class Params, class Inputs, std::size_t N, class CallOne, class Lowered>
auto run_functional_vmap(const Params& params, const Inputs& inputs, std::array<in_dim, N> dims, bool any_mapped,
                         const functional_vmap_options& options, CallOne& call_one, Lowered& lowered, bool in_tasks) {
  constexpr std::size_t n_inputs = std::tuple_size_v<Inputs>;
  static_assert(n_inputs == N);
  const c10::IntArrayRef batch = params.batch_size();
  check_mapping(batch, any_mapped, options);
  if (batch.empty()) return std::apply([&](const auto&... in) { return call_one(params, in...); }, inputs);
  const std::int64_t sets = c10::multiply_integers(batch);

  // Mapped inputs: check params' batch sizes at their dim, then flatten them into one dim.
  auto prepare = [&](const auto& in, const in_dim& d) {
    using T = std::remove_cvref_t<decltype(in)>;
    if constexpr (is_tensor_v<T>) {
      return d ? flatten_mapped_input(in, *d, batch, sets) : in;
    } else {
      if (d)
        throw value_error("functional_vmap: in_dims maps an input that is not a tensor (a state tuple?); pass its tensors "
                          "as inputs of their own, or pass it shared");
      return in;
    }
  };
  auto flat_inputs = [&]<std::size_t... I>(std::index_sequence<I...>) {
    return std::make_tuple(prepare(std::get<I>(inputs), dims[I])...);
  }(std::make_index_sequence<n_inputs>{});
  for (auto& d : dims)
    if (d) d = 0;
  auto flat_params = flatten_sets(params, sets);

  // One chunk of sets [start, start + length).
  auto run = [&](std::int64_t start, std::int64_t length) {
    auto p = length == sets ? flat_params : ::tensordict::detail::narrow_arg(flat_params, in_dim(0), start, length);
    auto chunk_inputs = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::make_tuple(::tensordict::detail::narrow_arg(std::get<I>(flat_inputs), dims[I], start, length)...);
    }(std::make_index_sequence<n_inputs>{});
    using Out = decltype(std::apply([&](const auto&... in) { return call_one(p, in...); }, chunk_inputs));

    if (options.loop) {
      std::vector<Out> each;
      for (std::int64_t i = 0; i < length; ++i) {
        auto one = p[i];
        auto picked = [&]<std::size_t... I>(std::index_sequence<I...>) {
          return std::make_tuple([&](const auto& in, const in_dim& d) {
            if constexpr (is_tensor_v<std::remove_cvref_t<decltype(in)>>)
              return d ? at::Tensor(in[i]) : at::Tensor(in);
            else
              return in;
          }(std::get<I>(chunk_inputs), dims[I])...);
        }(std::make_index_sequence<n_inputs>{});
        each.push_back(with_sets_dim(std::apply([&](const auto&... in) { return call_one(one, in...); }, picked)));
      }
      return ::tensordict::detail::concatenate(each);
    } else {
      std::array<bool, n_inputs> is_mapped{};
      for (std::size_t k = 0; k < n_inputs; ++k) is_mapped[k] = dims[k].has_value();
      if constexpr (is_tensor_tree<Out>)
        if (in_tasks && options.randomness == tensordict::randomness::error)
          if (auto out = run_in_tasks<Out>(p, chunk_inputs, is_mapped, length, options, lowered)) return std::move(*out);
      auto out = lowered(p, chunk_inputs, is_mapped, batch_context{length, options.randomness});
      if constexpr (std::is_same_v<decltype(out), Out>) {
        return out;  // a batched form that always applies: no vmap fallback
      } else {
        if constexpr (std::is_same_v<decltype(out), std::optional<Out>>)
          if (out) return std::move(*out);
        std::vector<in_dim> vmap_dims{0};
        vmap_dims.insert(vmap_dims.end(), dims.begin(), dims.end());
        auto mapped = vmap(call_one, vmap_dims, {.randomness = options.randomness});
        return std::apply([&](const auto&... in) { return mapped(p, in...); }, chunk_inputs);
      }
    }
  };

  const std::int64_t chunk = chunk_of(sets, options);
  if (chunk >= sets) return unflatten_sets(run(0, sets), batch);
  return unflatten_sets(
      ::tensordict::detail::run_chunks(sets, chunk, options.randomness, ::tensordict::detail::draw_device(params), run),
      batch);
}

// A call of one tensor input whose batched form always applies (a typed
// Sequential of Linears and activations): run_functional_vmap's work on
// params' leaves (schema order, undefined where unset), compiled once in
// libtensordict. call_one(leaves, batch, input) calls the module on params of
// that batch size (none: one set); lowered(leaves, x, ctx) is the batched
// form on params whose dim 0 holds ctx.sets sets.
using leaves_call = c10::function_ref<at::Tensor(const std::vector<at::Tensor>&, c10::IntArrayRef, const at::Tensor&)>;
using leaves_lowered = c10::function_ref<at::Tensor(const std::vector<at::Tensor>&, const stacked&, const batch_context&)>;
TENSORDICT_DECL at::Tensor run_lowered_call(const std::vector<at::Tensor>& leaves, c10::IntArrayRef batch,
                                            std::optional<at::Device> device, const at::Tensor& input, in_dim dim,
                                            bool any_mapped, const functional_vmap_options& options, bool in_tasks,
                                            leaves_call call_one, leaves_lowered lowered);

// Whether functional_vmap<Method>(module of Impl, params, inputs) takes run_lowered_call.
template <auto Method, class Impl, class Inputs>
constexpr bool lowered_one_tensor() {
  if constexpr (!std::is_same_v<decltype(Method), std::nullptr_t> || !has_stacked_form<Impl> ||
                !std::is_same_v<Inputs, std::tuple<at::Tensor>>) {
    return false;
  } else {
    using P = TensorDict<schema_of<Impl>>;
    constexpr bool several_input_form = requires(Impl& m, const P& p, const Inputs& in, std::array<bool, 1> mapped) {
      batched<Impl>::forward(m, p, in, mapped, batch_context{});
    };
    using Out = decltype(functional_call(std::declval<Impl&>(), std::declval<const P&>(), std::declval<const at::Tensor&>()));
    return !several_input_form && std::is_same_v<Out, at::Tensor>;
  }
}

// run_lowered_call on a typed module: the callbacks rebuild its params from leaves.
template <class Impl, class P>
at::Tensor run_lowered(Impl& impl, const P& params, const at::Tensor& input, in_dim dim, bool any_mapped,
                       const functional_vmap_options& options, bool in_tasks) {
  std::vector<at::Tensor> leaves(P::leaf_count);
  for (std::size_t i = 0; i < P::leaf_count; ++i) leaves[i] = params.leaf(i);
  const std::optional<at::Device> device = params.device();
  auto rebuilt = [&device](const std::vector<at::Tensor>& from, c10::IntArrayRef batch) {
    std::array<at::Tensor, P::leaf_count> own;
    std::copy(from.begin(), from.end(), own.begin());
    return P(std::move(own), batch, device);
  };
  auto call_one = [&](const std::vector<at::Tensor>& from, c10::IntArrayRef batch, const at::Tensor& x) -> at::Tensor {
    return functional_call(impl, rebuilt(from, batch), x);
  };
  auto lowered = [&](const std::vector<at::Tensor>& from, const stacked& x, const batch_context& ctx) {
    const std::array<std::int64_t, 1> sets{ctx.sets};
    return expand_sets(call_stacked(impl, rebuilt(from, sets), x, ctx), ctx.sets);
  };
  return run_lowered_call(leaves, params.batch_size(), device, input, dim, any_mapped, options, in_tasks, call_one, lowered);
}

// args then kwargs as one tuple, and the dim of each (args are never mapped).
template <class Args, class Kwargs, std::size_t NKw>
auto gather_inputs(const Args& args, const Kwargs& kwargs, const std::array<in_dim, NKw>& kwarg_dims) {
  auto inputs = std::tuple_cat(args, std::apply([](const auto&... kw) { return std::make_tuple(kw.value...); }, kwargs.values));
  constexpr std::size_t n_args = std::tuple_size_v<Args>;
  std::array<in_dim, std::tuple_size_v<decltype(inputs)>> dims{};
  for (std::size_t k = 0; k < NKw; ++k) dims[n_args + k] = kwarg_dims[k];
  return std::make_pair(std::move(inputs), dims);
}

// The dims that in_dims gives each kwarg; in_dims may only name kwargs: known at compile time.
template <class Kwargs, class InDims>
auto kwarg_dims_of(const InDims& in_dims) {
  std::array<in_dim, std::tuple_size_v<decltype(Kwargs{}.values)>> kwarg_dims{};
  std::apply(
      [&](const auto&... dims) {
        (
            [&](const auto& d) {
              using D = std::remove_cvref_t<decltype(d)>;
              constexpr std::size_t at = ::tensordict::detail::find_name(Kwargs::names, D::name.view());
              if constexpr (at == npos)
                ::tensordict::compile_error::report<::tensordict::nn::compile_error::in_dims_names_no_kwarg<D::name, Kwargs>>();
              else
                kwarg_dims[at] = d.dim;
            }(dims),
            ...);
      },
      in_dims.dims);
  return kwarg_dims;
}
}  // namespace detail

// See the top of this header. Method = nullptr calls forward; otherwise a
// member function pointer of the module type, e.g. functional_vmap<&NetImpl::encode>(...).
template <auto Method = nullptr, class Module, class S, class Args = std::tuple<>, class Kwargs = kwargs_t<>,
          class InDims = in_dims_t<>>
  requires(!::tensordict::detail::is_tensordict<Args>::value)  // a TensorDict input: nn/tensordict_module.hpp's form for key-wired modules
auto functional_vmap(Module&& module, const TensorDict<S>& params, Args args = {}, Kwargs kwargs = {},
                     InDims in_dims = {}, functional_vmap_options options = {}) {
  using Impl = impl_of_t<Module>;
  Impl& impl = ::tensordict::detail::impl_ref(module);
  const auto kwarg_dims = detail::kwarg_dims_of<Kwargs>(in_dims);
  auto [inputs, dims] = detail::gather_inputs(args, kwargs, kwarg_dims);

  auto call_one = [&impl](const TensorDict<schema_of<Impl>>& p, const auto&... in) {
    if constexpr (std::is_same_v<decltype(Method), std::nullptr_t>) {
      return functional_call(impl, p, in...);
    } else {
      auto swap = to_module(p, impl, swap_mode::as_given);
      return (impl.*Method)(in...);
    }
  };
  auto one_tensor = detail::one_tensor_lowering([&impl](const TensorDict<schema_of<Impl>>& p, const stacked& x,
                                                        const batch_context& ctx) {
    if constexpr (std::is_same_v<decltype(Method), std::nullptr_t> && has_stacked_form<Impl>) {
      return call_stacked(impl, p, x, ctx);  // always applies
    } else {
      (void)impl, (void)p, (void)x, (void)ctx;  // used by the lowered branch only
      return std::optional<stacked>();
    }
  });
  // A batched form of several inputs (a decoder layer's target and memory).
  auto lowered = [&impl, &one_tensor](const TensorDict<schema_of<Impl>>& p, const auto& in, const auto& mapped,
                                      const batch_context& ctx) {
    if constexpr (std::is_same_v<decltype(Method), std::nullptr_t> &&
                  requires { batched<Impl>::forward(impl, p, in, mapped, ctx); }) {
      using Out = decltype(batched<Impl>::forward(impl, p, in, mapped, ctx));
      if constexpr (requires { batched<Impl>::supports(impl); })
        if (!batched<Impl>::supports(impl)) return std::optional<Out>();
      return std::optional<Out>(batched<Impl>::forward(impl, p, in, mapped, ctx));
    } else {
      (void)impl;  // used by the branch above only
      return one_tensor(p, in, mapped, ctx);
    }
  };
  bool in_tasks = false;
  if constexpr (std::is_same_v<decltype(Method), std::nullptr_t>) {
    if constexpr (requires { batched<Impl>::forward(impl, std::declval<const TensorDict<schema_of<Impl>>&>(), inputs,
                                                    std::array<bool, std::tuple_size_v<decltype(inputs)>>{}, batch_context{}); }) {
      in_tasks = true;
      if constexpr (requires { batched<Impl>::supports(impl); }) in_tasks = batched<Impl>::supports(impl);
    } else if constexpr (detail::one_tensor<decltype(inputs)>()) {
      in_tasks = lowers_whole(impl);
    }
  }
  // A chain of Linears spreads its sets over the threads inside its runs (detail::linear_run), without
  // the tasks' views, graphs and joins around it, unless sets_per_task asks for tasks.
  if constexpr (linear_runs_only_v<Impl>)
    if (in_tasks && !options.sets_per_task && detail::linear_run::takes(params.values())) in_tasks = false;
  constexpr bool any_mapped = std::tuple_size_v<decltype(in_dims.dims)> > 0;
  if constexpr (detail::lowered_one_tensor<Method, Impl, decltype(inputs)>())
    return detail::run_lowered(impl, ::tensordict::detail::as_module_params<Impl>(params), std::get<0>(inputs), dims[0],
                               any_mapped, options, in_tasks);
  else
    return detail::run_functional_vmap(::tensordict::detail::as_module_params<Impl>(params), inputs, dims, any_mapped,
                                       options, call_one, lowered, in_tasks);
}

}  // namespace nn

namespace nn {
namespace detail {
// Whether every module of a run-time model lowers with these params.
TENSORDICT_DECL bool dynamic_lowers(torch::nn::Module& m, const AnyTensorDict& params);

// The batched form of a whole run-time model, where dynamic_lowers says it has one.
TENSORDICT_DECL stacked dynamic_lowered(torch::nn::Module& m, const AnyTensorDict& params, const stacked& x,
                                        const batch_context& ctx);

}  // namespace detail

// ---- does it lower? ---------------------------------------------------------------------

// Whether functional_vmap lowers a module to batched ops (the module and
// every child; a typed or run-time Sequential lowers only whole), and where
// not, the first child that does not and why. Inputs other than one tensor
// (a state, masks) may still keep a type that lowers from lowering: the
// type's batched form says per call.
//   auto how = tensordict::nn::lowering_of(net);
//   if (!how) std::cout << how.path << ": " << how.reason;   // "2: torch::nn::FunctionalImpl has no batched form ..."
struct lowering {
  bool lowers = true;
  std::string path;    // the child that does not lower, dotted as named_modules() names it ("" for the module itself)
  std::string reason;  // why not
  explicit operator bool() const { return lowers; }
};

namespace detail {
inline std::string joined_path(const std::string& parent, const std::string& child) {
  return parent.empty() ? child : parent + "." + child;
}

// A Sequential's child lowers by a batched form of one tensor (chained: its
// input is the previous child's output); a module called by itself by any.
template <class Impl>
lowering typed_lowering(Impl& m, const std::string& path, bool chained = false) {
  if constexpr (requires { typename Impl::is_sequential; }) {
    lowering out;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((out.lowers ? (void)(out = typed_lowering(*m.template child<I>(), joined_path(path, std::to_string(I)), true))
                   : (void)0),
       ...);
    }(std::make_index_sequence<Impl::size()>{});
    return out;
  } else if constexpr (has_batched_form<Impl>) {
    if constexpr (!has_stacked_form<Impl>)
      if (chained)
        return {false, path, c10::demangle(typeid(Impl).name()) + "'s batched form takes its inputs as a tuple (a state, a " +
                                 "second input), not a Sequential's chained tensor (functional_vmap runs it through vmap)"};
    if constexpr (requires { batched<Impl>::supports(m); })
      if (!batched<Impl>::supports(m))
        return {false, path, c10::demangle(typeid(Impl).name()) + "'s batched form does not support its options (" +
                                 "functional_vmap runs it through vmap)"};
    return {};
  } else {
    return {false, path,
            c10::demangle(typeid(Impl).name()) + " has no batched form (functional_vmap runs it through vmap; README: "
                                                 "\"Adding a module type\")"};
  }
}

// The first child of a run-time model that does not lower, and why.
TENSORDICT_DECL lowering dynamic_lowering(torch::nn::Module& m, const AnyTensorDict& params, const std::string& path);
}  // namespace detail

template <class M>
lowering lowering_of(M&& module) {
  if constexpr (dynamic_module<M>) {
    torch::nn::Module& m = ::tensordict::detail::dynamic_ref(module);
    AnyTensorDict own;
    any_key_path path;
    ::tensordict::detail::collect(m, own, path);
    return detail::dynamic_lowering(m, own, "");
  } else {
    return detail::typed_lowering(::tensordict::detail::impl_ref(module), "");
  }
}

// functional_vmap on a run-time model: params (an AnyTensorDict whose batch
// dims index the sets, e.g. from_modules) as in the typed form; the model's
// forward takes one tensor, given in args (shared by every set) or as the
// kwarg "input" (mapped with in_dim_of<"input">(dim)).
template <tensordict::nn::dynamic_module M, class Args = std::tuple<>, class Kwargs = kwargs_t<>, class InDims = in_dims_t<>>
at::Tensor functional_vmap(M&& module, const AnyTensorDict& params, Args args = {}, Kwargs kwargs = {}, InDims in_dims = {},
                           functional_vmap_options options = {}) {
  torch::nn::Module& m = ::tensordict::detail::dynamic_ref(module);
  torch::nn::AnyModule* any = nullptr;
  if constexpr (std::is_same_v<std::remove_cvref_t<M>, torch::nn::AnyModule>) any = const_cast<torch::nn::AnyModule*>(&module);
  const auto kwarg_dims = detail::kwarg_dims_of<Kwargs>(in_dims);
  auto [inputs, dims] = detail::gather_inputs(args, kwargs, kwarg_dims);
  if constexpr (!detail::one_tensor<decltype(inputs)>()) {
    static_assert(detail::one_tensor<decltype(inputs)>(),
                  "tensordict::nn::functional_vmap on a run-time model passes one input tensor: args(x), or "
                  "kwargs(kw<\"input\">(x)) with in_dims(in_dim_of<\"input\">(0)).");
    return at::Tensor();
  } else {
    const AnyTensorDict p = ::tensordict::detail::unflatten_if_flat(params);
    // Check the keys, shapes and dtypes once, against the module, before any call.
    (void)::tensordict::detail::resolve_targets(m, p, p.batch_dims(), "tensordict::nn::functional_vmap");
    auto call_one = [&](const AnyTensorDict& one, const at::Tensor& x) {
      return ::tensordict::detail::dynamic_call(m, any, one, x);
    };
    const bool lowers = detail::dynamic_lowers(m, p);
    auto lowered = detail::one_tensor_lowering([&](const AnyTensorDict& stacked_params, const stacked& x,
                                                   const batch_context& ctx) -> std::optional<stacked> {
      if (!lowers) return std::nullopt;
      return detail::dynamic_lowered(m, stacked_params, x, ctx);
    });
    return detail::run_functional_vmap(p, inputs, dims, std::tuple_size_v<decltype(in_dims.dims)> > 0, options, call_one,
                                       lowered, lowers);
  }
}

// functional_vmap on a module whose tensors are named by its options (RNN,
// LSTM, GRU): params an AnyTensorDict whose batch dims index the sets (e.g.
// from_modules of such modules); args, kwargs and in_dims as the typed form;
// the outputs are the module's, with params' batch dims in front. Lowered by
// the type's batched form where it supports the options and params hold every
// tensor, else a loop over the sets (vmap has no batching rule for the fused
// recurrent ops).
template <class M, class Args = std::tuple<>, class Kwargs = kwargs_t<>, class InDims = in_dims_t<>>
  requires runtime_layout_module<M> && (!dynamic_module<M>)
auto functional_vmap(M&& module, const AnyTensorDict& params, Args args = {}, Kwargs kwargs = {}, InDims in_dims = {},
                     functional_vmap_options options = {}) {
  using Impl = impl_of_t<M>;
  Impl& impl = ::tensordict::detail::impl_ref(module);
  const auto kwarg_dims = detail::kwarg_dims_of<Kwargs>(in_dims);
  auto [inputs, dims] = detail::gather_inputs(args, kwargs, kwarg_dims);
  const AnyTensorDict p = ::tensordict::detail::unflatten_if_flat(params);
  (void)::tensordict::detail::resolve_targets(impl, p, p.batch_dims(), "tensordict::nn::functional_vmap");
  auto call_one = [&impl](const AnyTensorDict& one, const auto&... in) {
    return functional<Impl>::forward(impl, ::tensordict::detail::with_module_tensors(impl, one), in...);
  };
  // Lowered where the type's batched form takes these inputs and supports
  // the options, and params hold every tensor of the module (a partial
  // params fills the rest from the module per set: the loop).
  constexpr bool has_form = requires(const std::array<bool, std::tuple_size_v<decltype(inputs)>>& mapped) {
    batched<Impl>::forward(impl, p, inputs, mapped, batch_context{});
  };
  bool lowers = has_form;
  if constexpr (requires { batched<Impl>::supports(impl); }) lowers = lowers && batched<Impl>::supports(impl);
  lowers = lowers && !::tensordict::detail::first_missing_tensor(impl, p);
  if (!lowers && !options.loop && options.randomness == tensordict::randomness::same)
    throw value_error("functional_vmap: " + c10::demangle(typeid(Impl).name()) +
                      " runs these sets one at a time (its batched form does not take these inputs or options: masks, "
                      "dropout between layers in training, libtorch's fused kernel, or params without every tensor), "
                      "which cannot give every set the same randomness; use randomness \"different\"");
  if (!lowers) options.loop = true;
  auto lowered = [&impl](const AnyTensorDict& stacked_params, const auto& in, const auto& mapped, const batch_context& ctx) {
    using Out = decltype(std::apply(
        [&](const auto&... x) { return functional<Impl>::forward(impl, stacked_params, x...); }, in));
    if constexpr (has_form)
      return std::optional<Out>(batched<Impl>::forward(impl, stacked_params, in, mapped, ctx));
    else
      return std::optional<Out>();
  };
  return detail::run_functional_vmap(p, inputs, dims, std::tuple_size_v<decltype(in_dims.dims)> > 0, options, call_one,
                                     lowered, lowers);
}

}  // namespace nn
}  // namespace tensordict

#if TENSORDICT_DEFINITIONS
#include <torch/nn/modules/container/sequential.h>

namespace tensordict::nn::detail {
TENSORDICT_DECL void check_mapping(c10::IntArrayRef batch, bool any_mapped, const functional_vmap_options& options) {
  if (batch.empty() && any_mapped)
    throw value_error("functional_vmap: in_dims maps inputs, but params has no batch dim (batch_size=[]) to map over");
  if (!batch.empty() && options.loop && options.randomness == tensordict::randomness::same)
    throw value_error("functional_vmap: loop=true cannot give every set the same randomness; use randomness \"different\"");
}

TENSORDICT_DECL std::int64_t chunk_of(std::int64_t sets, const functional_vmap_options& options) {
  const std::int64_t chunk = options.chunk_size.value_or(std::max<std::int64_t>(sets, 1));  // no sets: one empty call
  if (chunk <= 0) throw value_error("functional_vmap: chunk_size must be positive, got " + std::to_string(chunk));
  return chunk;
}

TENSORDICT_DECL at::Tensor leaf_with_one_sets_dim(const at::Tensor& t, std::int64_t batch_dims, std::int64_t sets) {
  std::vector<std::int64_t> shape{sets};
  shape.insert(shape.end(), t.sizes().begin() + batch_dims, t.sizes().end());
  return t.reshape(shape);
}

TENSORDICT_DECL at::Tensor flatten_mapped_input(const at::Tensor& in, std::int64_t d, c10::IntArrayRef batch, std::int64_t sets) {
  const auto nb = static_cast<std::int64_t>(batch.size());
  const std::int64_t dim = d < 0 ? d + in.dim() : d;
  if (dim < 0 || dim + nb > in.dim() || in.sizes().slice(dim, nb) != batch)
    throw value_error("functional_vmap: the input mapped at dim " + std::to_string(d) + " is " + describe(in) +
                      ", but it needs params.batch_size " + format_sizes(batch) + " there");
  std::vector<std::int64_t> shape(in.sizes().begin(), in.sizes().begin() + dim);
  shape.push_back(sets);
  shape.insert(shape.end(), in.sizes().begin() + dim + nb, in.sizes().end());
  return in.reshape(shape).movedim(dim, 0);
}

TENSORDICT_DECL bool tasks_allowed(const functional_vmap_options& options) {
  if (options.sets_per_task && *options.sets_per_task <= 0)
    throw value_error("functional_vmap: sets_per_task must be positive, got " + std::to_string(*options.sets_per_task));
#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
  // at::parallel_for would run every task on this thread (see parallel_sets.hpp): split only where asked.
  if (!options.sets_per_task) return false;
#endif
  if (!options.sets_per_task && (at::get_num_threads() < 2 || at::in_parallel_region())) return false;
  return !::tensordict::detail::functorch::inside_transform();
}

TENSORDICT_DECL std::optional<std::int64_t> task_sets(const std::vector<at::Tensor>& tensors, const std::vector<bool>& mapped,
                                                      std::size_t n_params, std::int64_t sets,
                                                      const functional_vmap_options& options) {
  // A convolution's kernel (sets, out, in, k...) keeps the call in one task: with
  // two tasks at once, libtorch 2.6's oneDNN convolution gave wrong gradients
  // (measured: 0.46 off in a Conv1d's; 1.13 agreed), as oneDNN's scratchpad is
  // shared between threads unless it was built for concurrent use.
  for (std::size_t k = 0; k < n_params; ++k)
    if (tensors[k].dim() >= 4) return std::nullopt;
  std::int64_t per_task = sets;
  if (options.sets_per_task) {
    per_task = std::min(sets, *options.sets_per_task);
  } else {
    // Working set of one set: its parameters, and its rows at the widest layer
    // in, out and saved; its work: every parameter meets every row once.
    std::int64_t bytes = 0, widest = 1, rows = 0, numel = 0;
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      const at::Tensor& t = tensors[k];
      if (!t.defined()) continue;
      const std::int64_t per_set = mapped[k] ? t.numel() / std::max<std::int64_t>(1, t.size(0)) : t.numel();
      if (k < n_params) {
        bytes += per_set * static_cast<std::int64_t>(t.element_size());
        numel += per_set;
        for (std::int64_t d = 1; d < t.dim(); ++d) widest = std::max(widest, t.size(d));
      } else if (t.dim() > 0) {
        rows = std::max(rows, per_set / std::max<std::int64_t>(1, t.size(-1)));
      }
    }
    bytes += 3 * rows * widest * static_cast<std::int64_t>(sizeof(float));
    const double flops = 2.0 * static_cast<double>(std::max<std::int64_t>(1, rows)) * static_cast<double>(numel);
    per_task = ::tensordict::detail::sets_per_task(sets, bytes, flops, at::get_num_threads());
  }
  if (per_task >= sets) return std::nullopt;
  return per_task;
}

// run_in_tasks for run_lowered_call: p's defined leaves, then the input.
inline std::optional<at::Tensor> lowered_in_tasks(const std::vector<at::Tensor>& p, const at::Tensor& input, bool mapped,
                                                  std::int64_t sets, const functional_vmap_options& options,
                                                  leaves_lowered lowered) {
  if (!tasks_allowed(options)) return std::nullopt;
  std::vector<at::Tensor> tensors;
  for (const at::Tensor& t : p)
    if (t.defined()) tensors.push_back(t);
  const std::size_t n_params = tensors.size();
  std::vector<bool> is_mapped(n_params, true);
  tensors.push_back(input);
  is_mapped.push_back(mapped);
  const std::optional<std::int64_t> per_task = task_sets(tensors, is_mapped, n_params, sets, options);
  if (!per_task) return std::nullopt;
  const ::tensordict::detail::set_task task = [&](const std::vector<at::Tensor>& own, std::int64_t, std::int64_t length) {
    std::size_t next = 0;
    std::vector<at::Tensor> task_params(p.size());
    for (std::size_t k = 0; k < p.size(); ++k)
      if (p[k].defined()) task_params[k] = own[next++];
    return std::vector<at::Tensor>{lowered(task_params, stacked{own[next], mapped}, batch_context{length, options.randomness})};
  };
  return ::tensordict::detail::run_set_tasks(sets, *per_task, tensors, is_mapped, task)[0];
}

TENSORDICT_DECL at::Tensor run_lowered_call(const std::vector<at::Tensor>& leaves, c10::IntArrayRef batch,
                                            std::optional<at::Device> device, const at::Tensor& input, in_dim dim,
                                            bool any_mapped, const functional_vmap_options& options, bool in_tasks,
                                            leaves_call call_one, leaves_lowered lowered) {
  check_mapping(batch, any_mapped, options);
  if (batch.empty()) return call_one(leaves, batch, input);
  const std::int64_t sets = c10::multiply_integers(batch);
  const bool mapped = dim.has_value();
  const at::Tensor x = mapped ? flatten_mapped_input(input, *dim, batch, sets) : input;
  std::vector<at::Tensor> flat = leaves;  // flatten_sets
  if (batch.size() != 1)
    for (at::Tensor& t : flat)
      if (t.defined()) t = leaf_with_one_sets_dim(t, static_cast<std::int64_t>(batch.size()), sets);

  // One chunk of sets [start, start + length).
  auto run = [&](std::int64_t start, std::int64_t length) {
    std::vector<at::Tensor> p = flat;
    if (length != sets)
      for (at::Tensor& t : p)
        if (t.defined()) t = t.narrow(0, start, length);
    const at::Tensor in = mapped ? x.narrow(0, start, length) : x;
    if (options.loop) {
      std::vector<at::Tensor> each, one(p.size());
      for (std::int64_t i = 0; i < length; ++i) {
        for (std::size_t k = 0; k < p.size(); ++k) one[k] = p[k].defined() ? at::Tensor(p[k][i]) : at::Tensor();
        each.push_back(call_one(one, {}, mapped ? at::Tensor(in[i]) : in).unsqueeze(0));
      }
      return at::cat(each, 0);
    }
    if (in_tasks && options.randomness == tensordict::randomness::error)
      if (std::optional<at::Tensor> out = lowered_in_tasks(p, in, mapped, length, options, lowered)) return std::move(*out);
    return lowered(p, stacked{in, mapped}, batch_context{length, options.randomness});
  };

  const std::int64_t chunk = chunk_of(sets, options);
  if (chunk >= sets) return unflatten_sets(run(0, sets), batch);
  const at::Device draw = ::tensordict::detail::draw_device_of_leaves(device, leaves).value_or(at::Device(at::kCPU));
  return unflatten_sets(::tensordict::detail::run_chunks(sets, chunk, options.randomness, draw, run), batch);
}

TENSORDICT_DECL bool dynamic_lowers(torch::nn::Module& m, const AnyTensorDict& params) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&m)) {
    // All children lowered, or none: vmap then runs the whole chain once.
    auto names = seq->named_children();
    std::size_t i = 0;
    for (auto& child : *seq)
      if (!dynamic_lowers(*child.ptr(), ::tensordict::detail::child_params(params, names[i++].key()))) return false;
    return true;
  }
  auto kind = module_registry::instance().find(m);
  return kind && kind->batched && kind->lowers(m, params);
}

TENSORDICT_DECL stacked dynamic_lowered(torch::nn::Module& m, const AnyTensorDict& params, const stacked& x,
                                        const batch_context& ctx) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&m)) {
    auto names = seq->named_children();
    std::size_t i = 0;
    stacked value = x;
    // Linears and the ReLUs after them run as one detail::linear_run, as in a typed Sequential.
    std::optional<linear_run> run;
    for (auto& child : *seq) {
      const AnyTensorDict child_params = ::tensordict::detail::child_params(params, names[i++].key());
      torch::nn::Module& module = *child.ptr();
      if (dynamic_cast<torch::nn::LinearImpl*>(&module)) {
        if (!run) run.emplace(value, ctx.sets);
        if (run->add(child_params.get("weight"), child_params.contains("bias") ? child_params.get("bias") : at::Tensor())) continue;
      } else if (run && dynamic_cast<torch::nn::ReLUImpl*>(&module) && run->add_relu()) {
        continue;
      }
      if (run && !run->empty()) value = run->run();
      run.reset();
      value = dynamic_lowered(module, child_params, value, ctx);
    }
    return run && !run->empty() ? run->run() : value;
  }
  return module_registry::instance().find(m)->batched(m, params, x, ctx);
}

TENSORDICT_DECL lowering dynamic_lowering(torch::nn::Module& m, const AnyTensorDict& params, const std::string& path) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&m)) {
    auto names = seq->named_children();
    std::size_t i = 0;
    for (auto& child : *seq) {
      const std::string& name = names[i++].key();
      if (lowering out = dynamic_lowering(*child.ptr(), ::tensordict::detail::child_params(params, name), joined_path(path, name));
          !out)
        return out;
    }
    return {};
  }
  const std::string type = c10::demangle(typeid(m).name());
  auto kind = module_registry::instance().find(m);
  if (!kind) return {false, path, type + " is not in the module registry (nn::module_registry::add, README: \"Adding a module type\")"};
  if (!kind->batched) return {false, path, type + " has no batched form (functional_vmap runs it through vmap)"};
  if (!kind->lowers(m, params))
    return {false, path, type + "'s batched form does not support its options (functional_vmap runs it through vmap)"};
  return {};
}
}  // namespace tensordict::nn::detail
#endif  // TENSORDICT_DEFINITIONS
