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
// Module types with a batched form (nn::batched<Impl>: Linear, Conv2d,
// LayerNorm, Embedding, BatchNorm in eval, the parameter-free modules and
// Dropout, and the typed Sequential of them) are lowered to batched libtorch
// ops: one baddbmm for the sets of a Linear instead of one linear each. The
// others go through vmap with the stacked tensors swapped in; loop = true
// calls the sets one by one.
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/stack.h>

#include "functional.hpp"
#include "vmap.hpp"

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

// ---- batched forms --------------------------------------------------------------

// A value flowing through a lowered module: when `mapped`, dim 0 indexes the
// sets; otherwise every set sees the same value.
struct stacked {
  at::Tensor value;
  bool mapped = false;
};

struct batch_context {
  std::int64_t sets = 0;
  tensordict::randomness randomness = tensordict::randomness::error;
};

// batched<Impl>::forward(module, params with a leading sets dim, input, context).
template <class Impl>
struct batched;

template <class Impl>
concept has_batched_form = requires { batched<Impl>::is_batched; };

namespace detail {
inline at::Tensor expand_sets(const stacked& x, std::int64_t sets) {
  if (x.mapped) return x.value;
  std::vector<std::int64_t> sizes{sets};
  sizes.insert(sizes.end(), x.value.sizes().begin(), x.value.sizes().end());
  return x.value.unsqueeze(0).expand(sizes);
}

// Shapes a [sets, k] parameter so it broadcasts against a [sets, ..., k] value of `dims` dims.
inline at::Tensor per_set(const at::Tensor& p, std::int64_t value_dims, std::int64_t trailing) {
  std::vector<std::int64_t> shape{p.size(0)};
  for (std::int64_t d = 1; d < value_dims - trailing; ++d) shape.push_back(1);
  shape.insert(shape.end(), p.sizes().begin() + 1, p.sizes().end());
  return p.view(shape);
}
}  // namespace detail

template <>
struct batched<torch::nn::LinearImpl> {
  static constexpr bool is_batched = true;
  // One baddbmm: [sets, rows, in] x [sets, in, out]; a shared input is broadcast, not copied.
  static stacked forward(const torch::nn::LinearImpl&, const TensorDict<schema_of<torch::nn::LinearImpl>>& p,
                         const stacked& x, const batch_context& ctx) {
    const at::Tensor& w = p.leaf(0);  // [sets, out, in]
    const at::Tensor& b = p.leaf(1);  // [sets, out] or unset
    const std::int64_t in = w.size(2), out = w.size(1);
    // [sets, rows, in]; the common shapes need no reshape (each op costs about a microsecond here).
    const std::int64_t own_dims = x.value.dim() - (x.mapped ? 1 : 0);
    if (!x.mapped && own_dims == 2 && b.defined()) {
      // A shared input meets every set's weights in one GEMM: [rows, in] x [in, sets*out].
      at::Tensor y = at::addmm(b.reshape({-1}), x.value, w.reshape({ctx.sets * out, in}).t());
      return {y.view({x.value.size(0), ctx.sets, out}).transpose(0, 1), true};
    }
    at::Tensor rows;
    if (x.mapped)
      rows = own_dims == 2 ? x.value : x.value.reshape({ctx.sets, -1, in});
    else
      rows = (own_dims == 2 ? x.value : x.value.reshape({-1, in})).unsqueeze(0).expand({ctx.sets, -1, in});
    at::Tensor y;
    if (!b.defined())
      y = at::bmm(rows, w.transpose(1, 2));
    else if (rows.size(1) * in * out < (1 << 16))
      y = at::baddbmm(b.unsqueeze(1), rows, w.transpose(1, 2));  // small: the bias fused in
    else
      y = at::bmm(rows, w.transpose(1, 2)).add_(b.unsqueeze(1));  // large: measured faster than baddbmm's bias copy
    if (own_dims == 2) return {y, true};
    std::vector<std::int64_t> shape{ctx.sets};
    shape.insert(shape.end(), x.value.sizes().begin() + (x.mapped ? 1 : 0), x.value.sizes().end() - 1);
    shape.push_back(out);
    return {y.view(shape), true};
  }
};

template <>
struct batched<torch::nn::Conv2dImpl> {
  static constexpr bool is_batched = true;
  static bool supports(const torch::nn::Conv2dImpl& m) {
    return ::tensordict::detail::compat::get_if<torch::enumtype::kZeros>(&m.options.padding_mode()) != nullptr;
  }
  // One grouped convolution: the sets become groups.
  static stacked forward(const torch::nn::Conv2dImpl& m, const TensorDict<schema_of<torch::nn::Conv2dImpl>>& p,
                         const stacked& x, const batch_context& ctx) {
    const auto& o = m.options;
    const std::int64_t sets = ctx.sets, groups = o.groups();
    const at::Tensor& w = p.leaf(0);  // [sets, out, in/groups, kh, kw]
    const bool unbatched = x.value.dim() == (x.mapped ? 4 : 3);
    at::Tensor input = expand_input(x, sets, unbatched);  // [N, sets*C, H, W]
    at::Tensor weight = w.reshape({sets * w.size(1), w.size(2), w.size(3), w.size(4)});
    at::Tensor bias = p.leaf(1).defined() ? p.leaf(1).reshape({-1}) : at::Tensor();
    at::Tensor y = torch::nn::functional::detail::conv2d(input, weight, bias, o.stride(), o.padding(), o.dilation(),
                                                         sets * groups);
    y = y.view({y.size(0), sets, w.size(1), y.size(2), y.size(3)}).transpose(0, 1);  // [sets, N, out, H', W']
    if (unbatched) y = y.squeeze(1);
    return {y, true};
  }

 private:
  static at::Tensor expand_input(const stacked& x, std::int64_t sets, bool unbatched) {
    if (x.mapped) {
      at::Tensor v = unbatched ? x.value.unsqueeze(1) : x.value;  // [sets, N, C, H, W]
      return v.transpose(0, 1).reshape({v.size(1), sets * v.size(2), v.size(3), v.size(4)});
    }
    at::Tensor v = unbatched ? x.value.unsqueeze(0) : x.value;  // [N, C, H, W]
    return v.repeat({1, sets, 1, 1});
  }
};

template <>
struct batched<torch::nn::LayerNormImpl> {
  static constexpr bool is_batched = true;
  static stacked forward(const torch::nn::LayerNormImpl& m, const TensorDict<schema_of<torch::nn::LayerNormImpl>>& p,
                         const stacked& x, const batch_context& ctx) {
    const auto& shape = m.options.normalized_shape();
    at::Tensor y = at::layer_norm(x.value, shape, {}, {}, m.options.eps());  // over trailing dims: same for every set
    if (!p.leaf(0).defined()) return {y, x.mapped};
    at::Tensor v = detail::expand_sets({y, x.mapped}, ctx.sets);
    const auto trailing = static_cast<std::int64_t>(shape.size());
    v = v * detail::per_set(p.leaf(0), v.dim(), trailing);
    if (p.leaf(1).defined()) v = v + detail::per_set(p.leaf(1), v.dim(), trailing);
    return {v, true};
  }
};

template <>
struct batched<torch::nn::EmbeddingImpl> {
  static constexpr bool is_batched = true;
  // max_norm renormalizes rows in place and padding_idx keeps a row's gradient at zero: those go through vmap.
  static bool supports(const torch::nn::EmbeddingImpl& m) {
    return !m.options.max_norm().has_value() && !m.options.padding_idx().has_value();
  }
  static stacked forward(const torch::nn::EmbeddingImpl&, const TensorDict<schema_of<torch::nn::EmbeddingImpl>>& p,
                         const stacked& x, const batch_context& ctx) {
    const at::Tensor& w = p.leaf(0);  // [sets, num, dim]
    const std::int64_t dim = w.size(2);
    if (!x.mapped) {
      std::vector<std::int64_t> shape{ctx.sets};
      shape.insert(shape.end(), x.value.sizes().begin(), x.value.sizes().end());
      shape.push_back(dim);
      return {w.index_select(1, x.value.reshape({-1})).view(shape), true};
    }
    at::Tensor flat = x.value.reshape({ctx.sets, -1});  // [sets, k]
    at::Tensor picked = w.gather(1, flat.unsqueeze(-1).expand({ctx.sets, flat.size(1), dim}));
    std::vector<std::int64_t> shape(x.value.sizes().begin(), x.value.sizes().end());
    shape.push_back(dim);
    return {picked.view(shape), true};
  }
};

template <class Impl>
  requires std::is_same_v<Impl, torch::nn::BatchNorm1dImpl> || std::is_same_v<Impl, torch::nn::BatchNorm2dImpl>
struct batched<Impl> {
  static constexpr bool is_batched = true;
  // Running statistics only: in training, batch statistics and their updates go through vmap.
  static bool supports(const Impl& m) { return !m.is_training() && m.options.track_running_stats(); }
  static stacked forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const stacked& x, const batch_context& ctx) {
    at::Tensor v = detail::expand_sets(x, ctx.sets);  // [sets, N, C, ...]
    auto view = [&](const at::Tensor& t) {
      std::vector<std::int64_t> shape{ctx.sets, 1, t.size(1)};
      for (std::int64_t d = 3; d < v.dim(); ++d) shape.push_back(1);
      return t.view(shape);
    };
    at::Tensor y = (v - view(p.leaf(2))) * view((p.leaf(3) + m.options.eps()).rsqrt());
    if (p.leaf(0).defined()) y = y * view(p.leaf(0));
    if (p.leaf(1).defined()) y = y + view(p.leaf(1));
    return {y, true};
  }
};

template <>
struct batched<torch::nn::DropoutImpl> {
  static constexpr bool is_batched = true;
  static stacked forward(torch::nn::DropoutImpl& m, const TensorDict<schema<>>&, const stacked& x, const batch_context& ctx) {
    const double prob = m.options.p();
    if (!m.is_training() || prob == 0) return x;
    switch (ctx.randomness) {
      case tensordict::randomness::error:
        throw value_error(
            "functional_vmap: Dropout in training mode draws random numbers, and randomness is \"error\". Pass "
            "randomness::different (a mask per set) or randomness::same (one mask for all sets), or call eval().");
      case tensordict::randomness::same:
        if (!x.mapped) return {at::dropout(x.value, prob, true), false};
        return {x.value * at::dropout(at::ones(x.value.sizes().slice(1), x.value.options()), prob, true), true};
      default:
        return {at::dropout(detail::expand_sets(x, ctx.sets), prob, true), true};
    }
  }
};

// Modules that take dims (Softmax(dim=1), Flatten(1, -1)): on a mapped value
// a dim counted from the front moves past the sets dim.
namespace detail {
inline std::int64_t past_sets(std::int64_t dim, bool mapped) { return mapped && dim >= 0 ? dim + 1 : dim; }
}  // namespace detail

template <class Impl>
  requires std::is_same_v<Impl, torch::nn::SoftmaxImpl> || std::is_same_v<Impl, torch::nn::LogSoftmaxImpl> ||
           std::is_same_v<Impl, torch::nn::FlattenImpl>
struct batched<Impl> {
  static constexpr bool is_batched = true;
  static stacked forward(Impl& m, const TensorDict<schema<>>&, const stacked& x, const batch_context&) {
    if constexpr (std::is_same_v<Impl, torch::nn::FlattenImpl>)
      return {x.value.flatten(detail::past_sets(m.options.start_dim(), x.mapped), detail::past_sets(m.options.end_dim(), x.mapped)),
              x.mapped};
    else if constexpr (std::is_same_v<Impl, torch::nn::SoftmaxImpl>)
      return {x.value.softmax(detail::past_sets(m.options.dim(), x.mapped)), x.mapped};
    else
      return {x.value.log_softmax(detail::past_sets(m.options.dim(), x.mapped)), x.mapped};
  }
};

// The other parameter-free modules act element-wise, the same way for every set.
template <class Impl>
  requires(schema_of<Impl>::leaf_count == 0 && !std::is_same_v<Impl, torch::nn::DropoutImpl> &&
           !std::is_same_v<Impl, torch::nn::SoftmaxImpl> && !std::is_same_v<Impl, torch::nn::LogSoftmaxImpl> &&
           !std::is_same_v<Impl, torch::nn::FlattenImpl> && !requires { typename Impl::is_sequential; })
struct batched<Impl> {
  static constexpr bool is_batched = true;
  static stacked forward(Impl& m, const TensorDict<schema<>>&, const stacked& x, const batch_context&) {
    return {m.forward(x.value), x.mapped};
  }
};

// Calls one module on a stacked value: its batched form when it has one (and
// supports its options), else vmap of its functional call.
template <class Impl, class S>
stacked call_stacked(Impl& m, const TensorDict<S>& p, const stacked& x, const batch_context& ctx) {
  if constexpr (has_batched_form<Impl>) {
    bool lowered = true;
    if constexpr (requires { batched<Impl>::supports(m); }) lowered = batched<Impl>::supports(m);
    if (lowered) return batched<Impl>::forward(m, p, x, ctx);
  }
  auto one_set = [&m](const TensorDict<S>& params, const at::Tensor& input) { return functional_call(m, params, input); };
  return {vmap(one_set, {0, x.mapped ? in_dim(0) : std::nullopt}, {.randomness = ctx.randomness})(p, x.value), true};
}

template <class... Holders>
struct batched<SequentialImpl<Holders...>> {
  static constexpr bool is_batched = true;
  static stacked forward(SequentialImpl<Holders...>& m, const TensorDict<schema_of<SequentialImpl<Holders...>>>& p,
                         const stacked& x, const batch_context& ctx) {
    return chain<0>(m, p, x, ctx);
  }

 private:
  template <std::size_t I>
  static stacked chain(SequentialImpl<Holders...>& m, const TensorDict<schema_of<SequentialImpl<Holders...>>>& p,
                       const stacked& x, const batch_context& ctx) {
    auto& child = *m.template child<I>();
    stacked out = call_stacked(child, detail::child_params<I>(p), x, ctx);
    if constexpr (I + 1 == sizeof...(Holders))
      return out;
    else
      return chain<I + 1>(m, p, out, ctx);
  }
};

// Whether every module of the type has a batched form (each is then used
// when its options allow: Conv2d with zero padding, BatchNorm in eval, ...).
template <class Impl>
constexpr bool fully_lowered() {
  if constexpr (requires { typename Impl::is_sequential; }) {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (fully_lowered<impl_of_t<std::remove_cvref_t<decltype(std::declval<Impl&>().template child<I>())>>>() && ...);
    }(std::make_index_sequence<Impl::size()>{});
  } else {
    return has_batched_form<Impl>;
  }
}

// ---- functional_vmap ----------------------------------------------------------------

namespace detail {
using ::tensordict::detail::is_tensor_v;

// Flattens params' batch dims into one sets dim.
template <class TD>
TD flatten_sets(const TD& params, std::int64_t sets) {
  const auto nb = static_cast<std::int64_t>(params.batch_dims());
  if (nb == 1) return params;
  return params.apply(
      [&](const at::Tensor& t) {
        std::vector<std::int64_t> shape{sets};
        shape.insert(shape.end(), t.sizes().begin() + nb, t.sizes().end());
        return t.reshape(shape);
      },
      {sets});
}

// Restores params' batch dims at the front of an output.
template <class Out>
Out unflatten_sets(const Out& out, c10::IntArrayRef batch) {
  if constexpr (std::is_same_v<Out, at::Tensor>) {
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
// What functional_vmap does once the inputs are known: params (in the
// module's own form), the inputs with the dims that map them, call_one(p,
// inputs...) for one set or under vmap, and lowered(p, stacked input, ctx)
// giving the batched form's result (std::nullopt when there is none).
template <class Params, class Inputs, std::size_t N, class CallOne, class Lowered>
auto run_functional_vmap(const Params& params, const Inputs& inputs, std::array<in_dim, N> dims, bool any_mapped,
                         const functional_vmap_options& options, CallOne& call_one, Lowered& lowered) {
  constexpr std::size_t n_inputs = std::tuple_size_v<Inputs>;
  static_assert(n_inputs == N);
  const c10::IntArrayRef batch = params.batch_size();
  if (batch.empty()) {
    if (any_mapped)
      throw value_error("functional_vmap: in_dims maps inputs, but params has no batch dim (batch_size=[]) to map over");
    return std::apply([&](const auto&... in) { return call_one(params, in...); }, inputs);
  }
  if (options.loop && options.randomness == tensordict::randomness::same)
    throw value_error("functional_vmap: loop=true cannot give every set the same randomness; use randomness \"different\"");

  std::int64_t sets = 1;
  for (auto b : batch) sets *= b;
  const auto nb = static_cast<std::int64_t>(batch.size());

  // Mapped inputs: check params' batch sizes at their dim, then flatten them into one dim.
  auto prepare = [&](const auto& in, const in_dim& d) {
    using T = std::remove_cvref_t<decltype(in)>;
    if constexpr (is_tensor_v<T>) {
      if (!d) return in;
      const std::int64_t dim = *d < 0 ? *d + in.dim() : *d;
      if (dim < 0 || dim + nb > in.dim() || in.sizes().slice(dim, nb) != batch)
        throw value_error("functional_vmap: the input mapped at dim " + std::to_string(*d) + " is " + describe(in) +
                          ", but it needs params.batch_size " + format_sizes(batch) + " there");
      std::vector<std::int64_t> shape(in.sizes().begin(), in.sizes().begin() + dim);
      shape.push_back(sets);
      shape.insert(shape.end(), in.sizes().begin() + dim + nb, in.sizes().end());
      return in.reshape(shape).movedim(dim, 0);
    } else {
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
        each.push_back(std::apply([&](const auto&... in) { return call_one(one, in...); }, picked));
      }
      if constexpr (std::is_same_v<Out, at::Tensor>)
        return at::stack(each);
      else
        static_assert(std::is_same_v<Out, at::Tensor>, "functional_vmap: loop=true stacks tensor outputs.");
    } else {
      if constexpr (n_inputs == 1 && std::is_same_v<Out, at::Tensor>) {
        if constexpr (is_tensor_v<std::tuple_element_t<0, decltype(chunk_inputs)>>) {
          const batch_context ctx{length, options.randomness};
          std::optional<stacked> out = lowered(p, stacked{std::get<0>(chunk_inputs), dims[0].has_value()}, ctx);
          if (out) return Out(expand_sets(*out, length));
        }
      }
      std::vector<in_dim> vmap_dims{0};
      vmap_dims.insert(vmap_dims.end(), dims.begin(), dims.end());
      auto mapped = vmap(call_one, vmap_dims, {.randomness = options.randomness});
      return std::apply([&](const auto&... in) { return mapped(p, in...); }, chunk_inputs);
    }
  };

  const std::int64_t chunk = options.chunk_size.value_or(sets);
  if (chunk <= 0) throw value_error("functional_vmap: chunk_size must be positive, got " + std::to_string(chunk));
  if (chunk >= sets) return unflatten_sets(run(0, sets), batch);
  return unflatten_sets(
      ::tensordict::detail::run_chunks(sets, chunk, options.randomness, ::tensordict::detail::draw_device(params), run),
      batch);
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
                ::tensordict::compile_error::report<compile_error::in_dims_names_no_kwarg<D::name, Kwargs>>();
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
  auto lowered = [&impl](const TensorDict<schema_of<Impl>>& p, const stacked& x,
                         const batch_context& ctx) -> std::optional<stacked> {
    if constexpr (std::is_same_v<decltype(Method), std::nullptr_t> && has_batched_form<Impl>) {
      return call_stacked(impl, p, x, ctx);
    } else {
      (void)impl;  // used by the lowered branch only
      return std::nullopt;
    }
  };
  return detail::run_functional_vmap(::tensordict::detail::as_module_params<Impl>(params), inputs, dims,
                                     std::tuple_size_v<decltype(in_dims.dims)> > 0, options, call_one, lowered);
}

}  // namespace nn
}  // namespace tensordict
