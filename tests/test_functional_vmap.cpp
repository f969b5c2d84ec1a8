#include "catch_torch.hpp"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <typeinfo>

#include <ATen/TensorOperators.h>
#include <ATen/ops/_make_dual.h>
#include <ATen/ops/_unpack_dual.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/threshold_backward.h>

#include <tensordict/detail/core_cache.hpp>
#include <tensordict/nn/adapters/builtin.hpp>  // every family: the suite uses them all
#include <tensordict/detail/kernels/batched_gemm.hpp>
#include <tensordict/nn/functional_vmap.hpp>

#include <torch/csrc/autograd/forward_grad.h>

#include <c10/core/CPUAllocator.h>
#ifdef _OPENMP
#include <omp.h>
#endif

using namespace tensordict;
namespace tdn = tensordict::nn;
using test::Contains;

struct EncoderImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  EncoderImpl() { fc = register_module("fc", torch::nn::Linear(3, 2)); }
  at::Tensor forward(const at::Tensor& x) { return fc->forward(x); }
  at::Tensor encode(const at::Tensor& x) { return fc->forward(x).tanh(); }
};
TENSORDICT_MODULE(EncoderImpl, fc);
TORCH_MODULE(Encoder);

namespace {
template <class Module>
std::vector<Module> copies(int n, auto make) {
  std::vector<Module> out;
  for (int i = 0; i < n; ++i) out.push_back(make());
  return out;
}

// A copy of typed or run-time params, each tensor a new leaf.
template <class Params>
Params trainable(const Params& td) {
  return td.apply([](const at::Tensor& t) { return t.detach().clone().requires_grad_(t.requires_grad()); });
}

template <class Params>
std::vector<at::Tensor> grads(const Params& td) {
  std::vector<at::Tensor> out;
  for (const auto& t : td.values())
    if (t.requires_grad()) out.push_back(t.grad());
  return out;
}

// A batch of a [2, batch, 8] input whose hidden part per set in a feed-forward
// block of 64 outgrows half a core's cache (so that the block runs a set at a time).
std::int64_t wide_feed_forward_batch() {
  return tensordict::detail::core_cache_bytes() / static_cast<std::int64_t>(2 * 64 * sizeof(float)) / 2 + 1;
}

// What check_three_paths compares, computed by the typed calls of
// run_three_paths: the comparisons are not templates, so the Catch2
// assertions are compiled once, not once per module type.
struct three_paths {
  at::Tensor lowered, generic, looped;
  std::vector<at::Tensor> own;  // each member's own forward
  bool differentiable = false;
  std::vector<at::Tensor> lowered_grads, vmap_grads, loop_grads;
};

template <class Module>
three_paths run_three_paths(std::vector<Module>& modules, const at::Tensor& x, bool mapped_input, bool with_vmap) {
  three_paths r;
  auto stacked = from_modules(modules);
  auto lowered_params = trainable(stacked), vmap_params = trainable(stacked), loop_params = trainable(stacked);
  auto& m = modules[0];
  if (mapped_input) {
    auto kw = tdn::kwargs(tdn::kw<"input">(x));
    auto dims = tdn::in_dims(tdn::in_dim_of<"input">(0));
    r.lowered = tdn::functional_vmap(m, lowered_params, {}, kw, dims);
    r.looped = tdn::functional_vmap(m, loop_params, {}, kw, dims, {.loop = true});
    if (with_vmap)
      r.generic = vmap([&](const auto& p, const at::Tensor& in) { return functional_call(m, p, in); })(vmap_params, x);
  } else {
    r.lowered = tdn::functional_vmap(m, lowered_params, tdn::args(x));
    r.looped = tdn::functional_vmap(m, loop_params, tdn::args(x), {}, {}, {.loop = true});
    if (with_vmap)
      r.generic = vmap([&](const auto& p, const at::Tensor& in) { return functional_call(m, p, in); }, {0, std::nullopt})(
          vmap_params, x);
  }
  if (!with_vmap) r.generic = r.looped;
  for (std::size_t i = 0; i < modules.size(); ++i) r.own.push_back(modules[i]->forward(mapped_input ? x[i] : x));
  r.differentiable = r.lowered.is_floating_point() && r.lowered.requires_grad();
  if (!r.differentiable) return r;
  r.lowered.pow(2).sum().backward();
  r.looped.pow(2).sum().backward();
  if (with_vmap) r.generic.pow(2).sum().backward();
  r.lowered_grads = grads(lowered_params);
  r.vmap_grads = grads(with_vmap ? vmap_params : loop_params);
  r.loop_grads = grads(loop_params);
  return r;
}

void compare_three_paths(const std::string& type, bool mapped_input, const three_paths& r) {
  for (std::size_t i = 0; i < r.own.size(); ++i) CHECK(r.lowered[i].allclose(r.own[i], 1e-4, 1e-5));
  CHECK(r.lowered.allclose(r.generic, 1e-4, 1e-5));
  CHECK(r.lowered.allclose(r.looped, 1e-4, 1e-5));
  if (!r.differentiable) return;
  const auto &gl = r.lowered_grads, &gv = r.vmap_grads, &gp = r.loop_grads;
  REQUIRE(gl.size() == gv.size());
  for (std::size_t i = 0; i < gl.size(); ++i) {
    // Float sums in another order: the absolute error grows with the gradient's size (a transformer layer's bias
    // gradient reached 3001 here, its elements differing by up to 0.004 between the paths).
    const double largest = gp[i].abs().max().item().toDouble(), atol = 1e-5 * std::max(1.0, largest);
    INFO(type << " mapped " << mapped_input << " leaf " << i << " " << gl[i].sizes() << " largest " << largest
              << ", lowered - loop " << (gl[i] - gp[i]).abs().max().item().toDouble() << ", lowered - vmap "
              << (gl[i] - gv[i]).abs().max().item().toDouble());
    CHECK(gl[i].allclose(gv[i], 1e-4, atol));
    CHECK(gl[i].allclose(gp[i], 1e-4, atol));
  }
}

// The lowered path, vmap of the functional call, and the loop agree in values
// and gradients (without vmap where libtorch cannot vmap the module's forward:
// 1.13's multi_head_attention_forward calls at::equal, which has no batching rule).
template <class Module>
void check_three_paths(std::vector<Module>& modules, const at::Tensor& x, bool mapped_input, bool with_vmap = true) {
  compare_three_paths(typeid(Module).name(), mapped_input, run_three_paths(modules, x, mapped_input, with_vmap));
}
}  // namespace

TEST_CASE("the reference's functional_vmap examples", "[functional_vmap]") {
  auto nets = copies<torch::nn::Linear>(4, [] { return torch::nn::Linear(3, 1); });
  auto params = from_modules(nets);
  auto x = at::randn({10, 3});
  CHECK(tdn::functional_vmap(nets[0], params, tdn::args(x)).sizes() == c10::IntArrayRef({4, 10, 1}));
  auto x_per_set = at::randn({4, 10, 3});
  auto y = tdn::functional_vmap(nets[0], params, {}, tdn::kwargs(tdn::kw<"input">(x_per_set)),
                                tdn::in_dims(tdn::in_dim_of<"input">(0)));
  CHECK(y.sizes() == c10::IntArrayRef({4, 10, 1}));
  for (int i = 0; i < 4; ++i) CHECK(y[i].allclose(nets[i]->forward(x_per_set[i]), 1e-4, 1e-6));
}

TEST_CASE("lowered, vmap and loop paths agree for every batched module type", "[functional_vmap]") {
  using torch::nn::Linear;
  auto linears = copies<Linear>(3, [] { return Linear(5, 4); });
  check_three_paths(linears, at::randn({6, 5}), false);
  check_three_paths(linears, at::randn({3, 2, 6, 5}), true);
  auto no_bias = copies<Linear>(2, [] { return Linear(torch::nn::LinearOptions(5, 4).bias(false)); });
  check_three_paths(no_bias, at::randn({6, 5}), false);

  auto convs = copies<torch::nn::Conv2d>(3, [] { return torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 4, 3).padding(1).groups(2)); });
  check_three_paths(convs, at::randn({2, 2, 7, 7}), false);
  check_three_paths(convs, at::randn({3, 2, 2, 7, 7}), true);

  auto convs1d = copies<torch::nn::Conv1d>(2, [] { return torch::nn::Conv1d(torch::nn::Conv1dOptions(2, 3, 3).stride(2)); });
  check_three_paths(convs1d, at::randn({4, 2, 9}), false);
  check_three_paths(convs1d, at::randn({2, 2, 9}), true);  // unbatched, one per set
  auto convs3d = copies<torch::nn::Conv3d>(2, [] { return torch::nn::Conv3d(torch::nn::Conv3dOptions(2, 2, 2).bias(false)); });
  check_three_paths(convs3d, at::randn({2, 2, 3, 4, 4}), false);

  auto group_norms = copies<torch::nn::GroupNorm>(3, [] {
    torch::nn::GroupNorm n(torch::nn::GroupNormOptions(2, 4));
    n->weight.data().normal_();
    n->bias.data().normal_();
    return n;
  });
  check_three_paths(group_norms, at::randn({5, 4, 3}), false);
  check_three_paths(group_norms, at::randn({3, 5, 4, 3}), true);
  auto instance_norms = copies<torch::nn::InstanceNorm1d>(2, [] {
    torch::nn::InstanceNorm1d n(torch::nn::InstanceNorm1dOptions(3).affine(true));
    n->weight.data().normal_();
    return n;
  });
  check_three_paths(instance_norms, at::randn({4, 3, 6}), false);
  check_three_paths(instance_norms, at::randn({3, 6}), false);  // unbatched
  auto tracked_norms = copies<torch::nn::InstanceNorm2d>(2, [] {
    torch::nn::InstanceNorm2d n(torch::nn::InstanceNorm2dOptions(3).track_running_stats(true));
    n->running_mean.normal_();
    n->eval();
    return n;
  });
  check_three_paths(tracked_norms, at::randn({2, 3, 4, 4}), false);

  auto prelus = copies<torch::nn::PReLU>(3, [] {
    torch::nn::PReLU a(torch::nn::PReLUOptions().num_parameters(4));
    a->weight.data().uniform_(0, 1);
    return a;
  });
  check_three_paths(prelus, at::randn({5, 4, 2}), false);
  check_three_paths(prelus, at::randn({3, 5, 4}), true);

  auto norms = copies<torch::nn::LayerNorm>(3, [] {
    torch::nn::LayerNorm n(torch::nn::LayerNormOptions({4}));
    n->weight.data().normal_();
    n->bias.data().normal_();
    return n;
  });
  check_three_paths(norms, at::randn({5, 4}), false);
  check_three_paths(norms, at::randn({3, 5, 4}), true);

  auto embeddings = copies<torch::nn::Embedding>(3, [] { return torch::nn::Embedding(10, 4); });
  check_three_paths(embeddings, at::randint(0, 10, {2, 5}), false);
  check_three_paths(embeddings, at::randint(0, 10, {3, 2, 5}), true);
  auto rnn_cells = copies<torch::nn::RNNCell>(3, [] { return torch::nn::RNNCell(torch::nn::RNNCellOptions(4, 5).nonlinearity(torch::kReLU)); });
  check_three_paths(rnn_cells, at::randn({2, 4}), false);
  check_three_paths(rnn_cells, at::randn({3, 2, 4}), true);
  auto gru_cells = copies<torch::nn::GRUCell>(2, [] { return torch::nn::GRUCell(torch::nn::GRUCellOptions(4, 5).bias(false)); });
  check_three_paths(gru_cells, at::randn({6, 4}), false);

  auto bags = copies<torch::nn::EmbeddingBag>(3, [] { return torch::nn::EmbeddingBag(torch::nn::EmbeddingBagOptions(10, 4)); });
  check_three_paths(bags, at::randint(0, 10, {2, 5}), false, false);
  check_three_paths(bags, at::randint(0, 10, {3, 2, 5}), true, false);

  auto transposed = copies<torch::nn::ConvTranspose2d>(3, [] {
    return torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(4, 6, 3).stride(2).output_padding(1).groups(2));
  });
  check_three_paths(transposed, at::randn({2, 4, 5, 5}), false);
  check_three_paths(transposed, at::randn({3, 2, 4, 5, 5}), true);
  auto transposed1d = copies<torch::nn::ConvTranspose1d>(2, [] {
    return torch::nn::ConvTranspose1d(torch::nn::ConvTranspose1dOptions(2, 3, 3).bias(false).dilation(2));
  });
  check_three_paths(transposed1d, at::randn({2, 6}), false);  // unbatched
  auto transposed3d = copies<torch::nn::ConvTranspose3d>(2, [] { return torch::nn::ConvTranspose3d(torch::nn::ConvTranspose3dOptions(1, 2, 2)); });
  check_three_paths(transposed3d, at::randn({1, 1, 3, 3, 3}), false);

  auto bns = copies<torch::nn::BatchNorm1d>(3, [] {
    torch::nn::BatchNorm1d bn(4);
    bn->running_mean.normal_();
    bn->running_var.uniform_(0.5, 2);
    bn->weight.data().normal_();
    bn->eval();
    return bn;
  });
  check_three_paths(bns, at::randn({6, 4}), false);

  using mlp = tdn::Sequential<Linear, torch::nn::ReLU, Linear, torch::nn::Tanh, Linear>;
  STATIC_REQUIRE(tdn::fully_lowered<mlp::Impl>());
  auto mlps = copies<mlp>(4, [] { return mlp(Linear(3, 8), torch::nn::ReLU(), Linear(8, 8), torch::nn::Tanh(), Linear(8, 2)); });
  check_three_paths(mlps, at::randn({7, 3}), false);
  check_three_paths(mlps, at::randn({4, 7, 3}), true);

  // A small CNN, typed: every child lowers (the pooling folds the sets into the batch).
  using cnn = tdn::Sequential<torch::nn::Conv2d, torch::nn::ReLU, torch::nn::MaxPool2d, torch::nn::Conv2d, torch::nn::ReLU,
                              torch::nn::AdaptiveAvgPool2d, torch::nn::Flatten, Linear>;
  STATIC_REQUIRE(tdn::fully_lowered<cnn::Impl>());
  auto cnns = copies<cnn>(3, [] {
    return cnn(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)), torch::nn::ReLU(), torch::nn::MaxPool2d(2),
               torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 6, 3).padding(1)), torch::nn::ReLU(), torch::nn::AdaptiveAvgPool2d(2),
               torch::nn::Flatten(), Linear(24, 5));
  });
  CHECK(tdn::lowering_of(cnns[0]));
  {
    // On libtorch 2.6 on an Intel Cooperlake machine the first convolution's weight gradients of the loop differed
    // from the lowered path's and vmap's (which agreed) by up to 0.07 for some inputs; on an AMD EPYC (AVX2) all three
    // equal a float64 reference (README, the CNN bench), so oneDNN's kernels for that CPU are suspect: values only there.
    std::optional<at::NoGradGuard> values_only;
    if (tensordict::detail::compat::torch_major >= 2) values_only.emplace();
    check_three_paths(cnns, at::randn({4, 1, 10, 10}), false);
    check_three_paths(cnns, at::randn({3, 4, 1, 10, 10}), true);
    // Global average pooling (a sum and a division over the pooled dims) after a convolution's output, run-time.
    auto global = copies<torch::nn::Sequential>(3, [] {
      return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 4, 3)), torch::nn::ReLU(),
                                   torch::nn::AdaptiveAvgPool2d(1), torch::nn::Flatten(), Linear(4, 3));
    });
    CHECK(tdn::lowering_of(global[0]));
    check_three_paths(global, at::randn({5, 2, 6, 7}), false);
    check_three_paths(global, at::randn({3, 5, 2, 6, 7}), true);
  }

  using torch::nn::TransformerEncoderLayer;
  using torch::nn::TransformerEncoderLayerOptions;
  auto layers = copies<TransformerEncoderLayer>(3, [] {
    return TransformerEncoderLayer(TransformerEncoderLayerOptions(8, 2).dim_feedforward(16).dropout(0.0));
  });
  check_three_paths(layers, at::randn({5, 2, 8}), false, false);
  check_three_paths(layers, at::randn({3, 5, 2, 8}), true, false);
  auto gelu_layers = copies<TransformerEncoderLayer>(2, [] {
    TransformerEncoderLayer layer(TransformerEncoderLayerOptions(8, 4).dim_feedforward(12).activation(torch::kGELU));
    layer->eval();
    return layer;
  });
  check_three_paths(gelu_layers, at::randn({4, 3, 8}), false, false);
  // A feed-forward block whose hidden part per set outgrows half a core's cache runs a set at a time.
  auto wide_layers = copies<TransformerEncoderLayer>(3, [] {
    return TransformerEncoderLayer(TransformerEncoderLayerOptions(8, 2).dim_feedforward(64).dropout(0.0));
  });
  const std::int64_t batch = wide_feed_forward_batch();  // 2 x batch rows
  REQUIRE(2 * batch * 64 * static_cast<std::int64_t>(sizeof(float)) > tensordict::detail::core_cache_bytes() / 2);
  check_three_paths(wide_layers, at::randn({2, batch, 8}), false, false);
  check_three_paths(wide_layers, at::randn({3, 2, batch, 8}), true, false);

  // A user module has no batched form: it goes through vmap with its tensors swapped.
  STATIC_REQUIRE(!tdn::fully_lowered<EncoderImpl>());
  auto encoders = copies<Encoder>(3, [] { return Encoder(); });
  check_three_paths(encoders, at::randn({4, 3}), false);
}

TEST_CASE("Linear runs on the library's own batched GEMM (AVX2), large layers on BLAS: odd shapes, strides, gradients, create_graph",
          "[functional_vmap]") {
  using torch::nn::Linear;
  // 13 -> 19 over 7 rows: partial row and column tiles, an 8x8-block transpose with leftovers.
  auto odd = copies<Linear>(5, [] { return Linear(13, 19); });
  check_three_paths(odd, at::randn({7, 13}), false);
  check_three_paths(odd, at::randn({5, 7, 13}), true);
  check_three_paths(odd, at::randn({2, 7, 13}), false);
  check_three_paths(odd, at::randn({5, 2, 3, 13}), true);
  check_three_paths(odd, at::randn({13}), false);
  auto no_bias = copies<Linear>(3, [] { return Linear(torch::nn::LinearOptions(17, 9).bias(false)); });
  check_three_paths(no_bias, at::randn({11, 17}), false);
  check_three_paths(no_bias, at::randn({3, 11, 17}), true);

  // 1-4 outputs (a critic's value): dot products along k, with k % 8 and the rows % tile left over.
  for (const std::int64_t out : {1, 2, 3, 4}) {
    auto narrow = copies<Linear>(3, [&] { return Linear(13, out); });
    check_three_paths(narrow, at::randn({7, 13}), false);
    check_three_paths(narrow, at::randn({3, 25, 13}), true);
    check_three_paths(narrow, at::randn({16, 13}).t().contiguous().t(), false);  // k strided: the tiles
  }
  using relu_head = tdn::Sequential<Linear, torch::nn::ReLU>;
  auto heads = copies<relu_head>(3, [] { return relu_head(Linear(16, 3), torch::nn::ReLU()); });
  check_three_paths(heads, at::randn({9, 16}), false);

  // A layer beyond the kernel's sizes (40 rows x 96 x 96 per set) takes one BLAS call per set in the
  // same node as the kernel's layers around it; so does one without bias.
  using mixed = tdn::Sequential<Linear, torch::nn::ReLU, Linear, torch::nn::ReLU, Linear>;
  auto mixed_nets = copies<mixed>(3, [] {
    return mixed(Linear(8, 96), torch::nn::ReLU(), Linear(96, 96), torch::nn::ReLU(), Linear(96, 3));
  });
  check_three_paths(mixed_nets, at::randn({40, 8}), false);
  check_three_paths(mixed_nets, at::randn({3, 40, 8}), true);
  auto wide_no_bias = copies<Linear>(3, [] { return Linear(torch::nn::LinearOptions(96, 96).bias(false)); });
  check_three_paths(wide_no_bias, at::randn({3, 40, 96}), true);
  if (tensordict::detail::avx2_fma_supported()) {
    const at::Tensor wide = tdn::functional_vmap(mixed_nets[0], trainable(from_modules(mixed_nets)), tdn::args(at::randn({40, 8})));
    CHECK_THAT(std::string(wide.grad_fn()->name()), Contains("linear_run"));
  }

  auto params = trainable(from_modules(odd));
  const auto y = tdn::functional_vmap(odd[0], params, tdn::args(at::randn({7, 13})));
  if (tensordict::detail::avx2_fma_supported()) {
    // Its autograd node is in the graph, behind the views of the output.
    std::string names;
    for (auto node = y.grad_fn(); node; node = node->next_edges().empty() ? nullptr : node->next_edges()[0].function)
      names += node->name() + " ";
    CHECK_THAT(names, Contains("linear_run"));
  }

  // Weights stored transposed and a transposed input: read through their strides.
  auto strided = params.apply([](const at::Tensor& t) {
    return t.dim() == 3 ? t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() : t.detach().clone().requires_grad_();
  });
  const at::Tensor x = at::randn({13, 7}).t().requires_grad_();
  const at::Tensor lowered = tdn::functional_vmap(odd[0], strided, tdn::args(x));
  const at::Tensor looped = tdn::functional_vmap(odd[0], params, tdn::args(x), {}, {}, {.loop = true});
  CHECK(lowered.allclose(looped, 1e-4, 1e-5));
  // Gradients of gradients (create_graph) take libtorch's ops in the backward, and equal the loop's.
  const auto second_order = [&](const at::Tensor& out, const auto& p) {
    const auto first = torch::autograd::grad({out.pow(2).sum()}, {p.template get<"weight">(), x}, {}, true, true);
    return torch::autograd::grad({first[0].pow(2).sum() + first[1].pow(2).sum()}, {p.template get<"weight">(), p.template get<"bias">(), x});
  };
  const auto from_lowered = second_order(lowered, strided), from_loop = second_order(looped, params);
  for (std::size_t i = 0; i < 3; ++i) CHECK(from_lowered[i].allclose(from_loop[i], 1e-3, 1e-3));

  // A dual tensor (forward-mode AD) keeps libtorch's ops, which carry its tangent.
  const std::uint64_t level = torch::autograd::ForwardADLevel::get_next_idx();
  const at::Tensor primal = at::randn({7, 13}), tangent = at::randn({7, 13});
  at::Tensor y_tangent;
  {
    at::NoGradGuard no_grad;
    const at::Tensor dual_out = tdn::functional_vmap(odd[0], from_modules(odd), tdn::args(at::_make_dual(primal, tangent, level)));
    y_tangent = std::get<1>(at::_unpack_dual(dual_out, static_cast<std::int64_t>(level)));
  }
  torch::autograd::ForwardADLevel::release_idx(level);
  REQUIRE(y_tangent.defined());
  for (std::size_t i = 0; i < odd.size(); ++i)
    CHECK(y_tangent[static_cast<std::int64_t>(i)].allclose(at::matmul(tangent, odd[i]->weight.t()), 1e-4, 1e-5));
}

// Outside functional_vmap a typed Sequential of Linears and ReLUs (an actor, a critic, a target network) is a
// Linear run of one set: one autograd node, the same values and gradients as its modules one by one.
TEST_CASE("A typed Sequential of Linears and ReLUs runs as one node outside functional_vmap, as its modules compute",
          "[functional_vmap]") {
  using torch::nn::Linear;
  using torch::nn::ReLU;
  using mlp = tdn::Sequential<Linear, ReLU, Linear, ReLU, Linear>;
  const auto by_modules = [](mlp& net, const at::Tensor& x) {
    at::Tensor h = x;
    h = net->child<0>()->forward(h).relu();
    h = net->child<2>()->forward(h).relu();
    return net->child<4>()->forward(h);
  };
  struct shape_case {
    const char* name;
    std::int64_t in, hidden, out;
    std::vector<std::int64_t> x;
  };
  // 256 rows x 64 x 64: the middle layer on BLAS (sgemm per set), the others on the kernels; odd sizes;
  // a single vector and leading dims.
  const shape_case cases[] = {{"SAC actor, batch 256", 3, 64, 2, {256, 3}},
                              {"odd sizes", 13, 19, 5, {7, 13}},
                              {"one vector", 13, 19, 1, {13}},
                              {"leading dims", 6, 8, 3, {2, 5, 6}}};
  for (const auto& c : cases) {
    INFO(c.name);
    at::manual_seed(4);
    mlp net(Linear(c.in, c.hidden), ReLU(), Linear(c.hidden, c.hidden), ReLU(), Linear(c.hidden, c.out));
    const at::Tensor x = at::randn(c.x).requires_grad_();
    const at::Tensor y = net->forward(x), reference = by_modules(net, x);
    CHECK(y.sizes() == reference.sizes());
    CHECK(y.allclose(reference, 1e-5, 1e-5));
    if (tensordict::detail::avx2_fma_supported()) {
      std::string names;  // the node, behind the view that gives the output its leading dims
      for (auto node = y.grad_fn(); node; node = node->next_edges().empty() ? nullptr : node->next_edges()[0].function)
        names += node->name() + " ";
      CHECK_THAT(names, Contains("linear_run"));
    }
    const at::Tensor g = at::randn(y.sizes());
    std::vector<at::Tensor> wrt{x};
    for (const auto& p : net->parameters()) wrt.push_back(p);
    const auto ours = torch::autograd::grad({y}, wrt, {g}, true), theirs = torch::autograd::grad({reference}, wrt, {g}, true);
    for (std::size_t i = 0; i < wrt.size(); ++i) {
      INFO("gradient " << i);
      CHECK(ours[i].sizes() == wrt[i].sizes());
      CHECK(ours[i].allclose(theirs[i], 1e-4, 1e-5));
    }
    // Gradients of gradients (create_graph) through libtorch's ops.
    const auto second = [&](const at::Tensor& out) {
      const auto first = torch::autograd::grad({out.pow(2).sum()}, {net->child<0>()->weight, x}, {}, true, true);
      return torch::autograd::grad({first[0].pow(2).sum() + first[1].pow(2).sum()}, {net->child<2>()->weight, x}, {}, true);
    };
    const auto second_ours = second(y), second_theirs = second(reference);
    for (std::size_t i = 0; i < 2; ++i) CHECK(second_ours[i].allclose(second_theirs[i], 1e-3, 1e-4));
    // Without gradients: no graph.
    at::NoGradGuard no_grad;
    const at::Tensor plain = net->forward(x);
    CHECK_FALSE(plain.requires_grad());
    CHECK(plain.allclose(reference, 1e-5, 1e-5));
  }

  at::manual_seed(5);
  mlp net(Linear(4, 8), ReLU(), Linear(8, 8), ReLU(), Linear(8, 1));
  // functional_call with parameters of its own (a target network): the gradients go to those, not the module's.
  auto params = from_module(net).apply([](const at::Tensor& t) { return (t.detach() * 0.5).requires_grad_(); });
  const at::Tensor x = at::randn({9, 4});
  const at::Tensor y = functional_call(net, params, x);
  if (tensordict::detail::avx2_fma_supported()) CHECK_THAT(std::string(y.grad_fn()->name()), Contains("linear_run"));
  at::Tensor h = at::linear(x, params.get<"0", "weight">(), params.get<"0", "bias">()).relu();
  h = at::linear(h, params.get<"2", "weight">(), params.get<"2", "bias">()).relu();
  const at::Tensor reference = at::linear(h, params.get<"4", "weight">(), params.get<"4", "bias">());
  CHECK(y.allclose(reference, 1e-5, 1e-5));
  y.sum().backward();
  CHECK(params.get<"2", "weight">().grad().defined());
  CHECK_FALSE(net->child<2>()->weight.grad().defined());

  // NaN and infinities in the input reach the output as the modules' own (values compared where finite, NaN where NaN).
  const at::Tensor special = at::randn({6, 4});
  special[1][2] = NAN;
  special[3][0] = INFINITY;
  at::NoGradGuard no_grad;
  const at::Tensor ours = net->forward(special), theirs = by_modules(net, special);
  CHECK(ours.isnan().equal(theirs.isnan()));
  CHECK(ours.allclose(theirs, 1e-5, 1e-5, /*equal_nan=*/true));

  // What a chain does not take runs module by module: float64, a bias-free Linear, a ReLU after a ReLU.
  mlp wide(Linear(4, 8), ReLU(), Linear(8, 8), ReLU(), Linear(8, 1));
  wide->to(at::kDouble);
  CHECK(wide->forward(at::randn({3, 4}, at::kDouble)).scalar_type() == at::kDouble);
  tdn::Sequential<Linear, ReLU, ReLU, Linear> doubled(Linear(4, 5), ReLU(), ReLU(), Linear(5, 2));
  const at::Tensor input = at::randn({3, 4});
  CHECK(doubled->forward(input).allclose(at::linear(at::linear(input, doubled->child<0>()->weight, doubled->child<0>()->bias).relu(),
                                                    doubled->child<3>()->weight, doubled->child<3>()->bias),
                                         1e-5, 1e-5));
  tdn::Sequential<Linear, ReLU, Linear> no_bias(Linear(torch::nn::LinearOptions(4, 5).bias(false)), ReLU(), Linear(5, 2));
  CHECK(no_bias->forward(input).allclose(
      at::linear(at::linear(input, no_bias->child<0>()->weight).relu(), no_bias->child<2>()->weight, no_bias->child<2>()->bias), 1e-5, 1e-5));
}

namespace {
// Bit for bit, NaN equal to NaN (any payload) and -0.0 apart from 0.0.
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (!a.sizes().equals(b.sizes())) return false;
  const at::Tensor both_nan = a.isnan() & b.isnan();
  return (both_nan | (a == b)).all().item<bool>() && ((a.signbit() == b.signbit()) | both_nan).all().item<bool>();
}
}  // namespace

// The hand-written kernels' ReLU and its backward are libtorch's relu and threshold_backward: relu(NaN) is NaN
// and relu(-0.0) is -0.0, and a NaN output passes its gradient on (they made NaN 0, in values and gradients).
TEST_CASE("Linear runs keep NaN, +-inf and -0.0 as libtorch's relu does, in values and gradients", "[functional_vmap]") {
  namespace gemm = tensordict::detail::batched_gemm;
  if (!tensordict::detail::avx2_fma_supported()) {
    WARN("no AVX2 + FMA: the kernels do not run");
    return;
  }
  const std::vector<float> specials{NAN, INFINITY, -INFINITY, -0.0f, 0.0f, 2.5f, -3.0f, 1e-30f, -1e-30f};
  // The pre-activation of out columns is w (x = 1, k = 1) plus the bias -0.0: -0.0 survives the tiles' FMA.
  for (const std::int64_t out : {1, 4, 9, 19}) {  // the dot products (<= 4 outputs) and the 6x16 tiles
    INFO("outputs " << out);
    at::Tensor w = at::empty({2, out, 1});
    for (std::int64_t j = 0; j < out; ++j) w.select(1, j).fill_(specials[static_cast<std::size_t>(j) % specials.size()]);
    const at::Tensor x = at::ones({2, 7, 1}), bias = at::full({2, out}, -0.0f);
    at::Tensor pre = at::empty({2, 7, out}), post = at::empty({2, 7, out});
    gemm::multiply(gemm::view(x), gemm::transposed(w), bias, false, 1, pre);
    gemm::multiply(gemm::view(x), gemm::transposed(w), bias, true, 1, post);
    CHECK(same_bits(post, at::relu(pre)));
    // The backward from the ReLU's output: where it is NaN the gradient passes, at -0.0 and below 0 it stops.
    const at::Tensor g = at::randn({2, 7, out});
    at::Tensor masked = at::empty({2, 7, out});
    gemm::relu_backward(g, post, masked);
    CHECK(same_bits(masked, at::threshold_backward(g, post, 0)));
  }

  // End to end: 16 MLPs 8-32-32-4 (and -19) with a NaN, +inf and -inf in input rows, against each member's own
  // forward and backward.
  using torch::nn::Linear;
  using torch::nn::ReLU;
  using mlp = tdn::Sequential<Linear, ReLU, Linear, ReLU, Linear>;
  for (const std::int64_t out : {4, 19}) {
    INFO("outputs " << out);
    auto nets = copies<mlp>(16, [&] { return mlp(Linear(8, 32), ReLU(), Linear(32, 32), ReLU(), Linear(32, out)); });
    at::Tensor x = at::randn({16, 32, 8});
    x.select(0, 0).select(0, 3).select(0, 2).fill_(NAN);
    x.select(0, 1).select(0, 5).fill_(INFINITY);
    x.select(0, 2).select(0, 7).fill_(-INFINITY);
    x.requires_grad_();
    auto params = trainable(from_modules(nets));
    const at::Tensor y = tdn::functional_vmap(nets[0], params, {}, tdn::kwargs(tdn::kw<"input">(x)),
                                              tdn::in_dims(tdn::in_dim_of<"input">(0)));
    std::string nodes;
    for (auto node = y.grad_fn(); node; node = node->next_edges().empty() ? nullptr : node->next_edges()[0].function)
      nodes += node->name() + " ";
    CHECK_THAT(nodes, Contains("linear_run"));
    const at::Tensor g = at::randn(y.sizes());
    y.backward(g);
    for (std::int64_t i = 0; i < 3; ++i) {
      INFO("member " << i);
      const at::Tensor xi = x.detach()[i].clone().requires_grad_();
      const at::Tensor own = nets[static_cast<std::size_t>(i)]->forward(xi);
      own.backward(g[i]);
      CHECK(own.isnan().any().item<bool>());
      CHECK(y[i].detach().allclose(own, 1e-4, 1e-5, /*equal_nan=*/true));
      CHECK(x.grad()[i].allclose(xi.grad(), 1e-4, 1e-5, /*equal_nan=*/true));
    }
  }

  // The fused LSTM step (libtorch 1.13's lowered LSTM) keeps NaN and saturates at +-inf as libtorch's sigmoid and tanh.
  auto lstms = copies<torch::nn::LSTM>(3, [] { return torch::nn::LSTM(torch::nn::LSTMOptions(4, 8)); });
  at::Tensor seq = at::randn({5, 2, 4});
  seq.select(0, 1).select(0, 0).select(0, 2).fill_(NAN);
  seq.select(0, 2).select(0, 1).fill_(INFINITY);
  seq.select(0, 3).select(0, 1).select(0, 3).fill_(-INFINITY);
  seq.select(0, 4).select(0, 0).select(0, 1).fill_(-0.0f);
  const auto [lowered, state] = tdn::functional_vmap(lstms[0], from_modules(lstms), tdn::args(seq));
  for (std::size_t i = 0; i < lstms.size(); ++i) {
    INFO("LSTM " << i);
    const auto [own, own_state] = lstms[i]->forward(seq);
    CHECK(own.isnan().any().item<bool>());
    CHECK(lowered[static_cast<std::int64_t>(i)].allclose(own, 1e-4, 1e-5, /*equal_nan=*/true));
    CHECK(std::get<1>(state)[static_cast<std::int64_t>(i)].allclose(std::get<1>(own_state), 1e-4, 1e-5, /*equal_nan=*/true));
  }
}

// Empty products are libtorch's (a Linear with 0 outputs crashed the 4-column kernel): torch's empty outputs and
// defined gradients, with 0 outputs, 0 rows, 0 inputs or 0 sets.
TEST_CASE("Linear runs with an empty dim: 0 outputs, rows, inputs or sets", "[functional_vmap]") {
  using torch::nn::Linear;
  using torch::nn::ReLU;
  using mlp = tdn::Sequential<Linear, ReLU, Linear>;
  struct shape {
    std::int64_t in, out, rows, sets;
  };
  for (const shape c : {shape{3, 0, 5, 4}, shape{3, 2, 0, 4}, shape{0, 2, 5, 4}, shape{3, 2, 5, 0}}) {
    INFO("in " << c.in << " out " << c.out << " rows " << c.rows << " sets " << c.sets);
    // (libtorch cannot initialise a Linear of 0 inputs: its params are given 0 columns instead.)
    auto nets = copies<mlp>(4, [&] { return mlp(Linear(std::max<std::int64_t>(c.in, 1), 4), ReLU(), Linear(4, c.out)); });
    auto params = trainable(from_modules(nets));
    if (c.in == 0) params.set<"0", "weight">(at::randn({4, 4, 0}).requires_grad_());
    if (c.sets == 0) params = params.index({at::indexing::Slice(0, 0)});
    const at::Tensor x = at::randn({c.sets, c.rows, c.in}).requires_grad_();
    const at::Tensor y = tdn::functional_vmap(nets[0], params, {}, tdn::kwargs(tdn::kw<"input">(x)),
                                              tdn::in_dims(tdn::in_dim_of<"input">(0)));
    CHECK(y.sizes().vec() == std::vector<std::int64_t>{c.sets, c.rows, c.out});
    y.sum().backward();
    REQUIRE(x.grad().defined());
    CHECK(x.grad().sizes() == x.sizes());
    if (c.sets > 0 && c.in > 0)
      for (std::size_t i = 0; i < nets.size(); ++i) CHECK(y[static_cast<std::int64_t>(i)].allclose(nets[i]->forward(x.detach()[static_cast<std::int64_t>(i)])));
    if (c.in == 0)  // no inputs: each set's first layer is its bias
      CHECK(y.allclose(at::baddbmm(params.get<"2", "bias">().unsqueeze(1), params.get<"0", "bias">().unsqueeze(1).relu().expand({4, c.rows, 4}),
                                   params.get<"2", "weight">().transpose(1, 2))));
    const at::Tensor shared = tdn::functional_vmap(nets[0], params, tdn::args(at::randn({c.rows, c.in})));
    CHECK(shared.sizes().vec() == std::vector<std::int64_t>{c.sets, c.rows, c.out});
  }
}

// In a typed Sequential a ReLU before a max pooling runs after it: the same values (NaNs, windows of no positive
// value) and the same gradients as each member's own forward.
TEST_CASE("a ReLU before a max pooling runs after it, with the members' values and gradients", "[functional_vmap]") {
  using relu_pool = tdn::Sequential<torch::nn::ReLU, torch::nn::MaxPool2d>;
  const auto same = [](const at::Tensor& a, const at::Tensor& b) {
    return a.sizes() == b.sizes() && a.allclose(b, 0, 0, /*equal_nan=*/true);
  };
  at::Tensor per_set = at::randint(-3, 3, {3, 2, 2, 7, 7}).to(at::kFloat);  // ties, zeros, all-negative windows
  per_set.index_put_({1, 0, 1, 2, 2}, NAN);
  for (auto options : {torch::nn::MaxPool2dOptions(2), torch::nn::MaxPool2dOptions(3).stride(2).padding(1).ceil_mode(true)}) {
    auto members = copies<relu_pool>(3, [&] { return relu_pool(torch::nn::ReLU(), torch::nn::MaxPool2d(options)); });
    const at::Tensor x = per_set.clone().requires_grad_();
    const at::Tensor y = tdn::functional_vmap(members[0], from_modules(members), {}, tdn::kwargs(tdn::kw<"input">(x)),
                                              tdn::in_dims(tdn::in_dim_of<"input">(0)));
    REQUIRE(y.grad_fn());
    CHECK(std::string(y.grad_fn()->name()).find("Relu") != std::string::npos);  // the ReLU last
    const at::Tensor upstream = at::randn(y.sizes());
    y.backward(upstream);
    for (int i = 0; i < 3; ++i) {
      const at::Tensor xi = per_set[i].clone().requires_grad_();
      const at::Tensor yi = members[static_cast<std::size_t>(i)]->forward(xi);
      yi.backward(upstream[i]);
      CHECK(same(y[i].detach(), yi.detach()));
      CHECK(same(x.grad()[i], xi.grad()));
    }
  }
}

TEST_CASE("TransformerDecoderLayer: lowered (target and memory, each shared or per set) equals the loop and its forwards",
          "[functional_vmap]") {
  using torch::nn::TransformerDecoderLayer;
  using torch::nn::TransformerDecoderLayerOptions;
  auto layers = copies<TransformerDecoderLayer>(3, [] {
    return TransformerDecoderLayer(TransformerDecoderLayerOptions(8, 2).dim_feedforward(16).dropout(0.0));
  });
  auto stacked = from_modules(layers);
  auto lowered_params = trainable(stacked), loop_params = trainable(stacked);
  auto tgt = at::randn({4, 2, 8}), memory = at::randn({3, 5, 2, 8});  // memory per set
  auto kw = tdn::kwargs(tdn::kw<"memory">(memory));
  auto dims = tdn::in_dims(tdn::in_dim_of<"memory">(0));
  at::Tensor lowered = tdn::functional_vmap(layers[0], lowered_params, tdn::args(tgt), kw, dims);
  at::Tensor looped = tdn::functional_vmap(layers[0], loop_params, tdn::args(tgt), kw, dims, {.loop = true});
  REQUIRE(lowered.sizes() == c10::IntArrayRef{3, 4, 2, 8});
  for (std::size_t i = 0; i < layers.size(); ++i)
    CHECK(lowered[static_cast<std::int64_t>(i)].allclose(layers[i]->forward(tgt, memory[static_cast<std::int64_t>(i)]), 1e-4, 1e-5));
  CHECK(lowered.allclose(looped, 1e-4, 1e-5));
  lowered.pow(2).sum().backward();
  looped.pow(2).sum().backward();
  auto gl = grads(lowered_params), gp = grads(loop_params);
  REQUIRE(gl.size() == gp.size());
  for (std::size_t i = 0; i < gl.size(); ++i) CHECK(gl[i].allclose(gp[i], 1e-4, 1e-5));
  // The batched form itself, with both inputs shared.
  auto shared_memory = at::randn({5, 2, 8});
  at::Tensor direct = tdn::batched<torch::nn::TransformerDecoderLayerImpl>::forward(
      *layers[0], stacked, std::make_tuple(tgt, shared_memory), std::array<bool, 2>{false, false}, {.sets = 3});
  CHECK(direct[2].allclose(layers[2]->forward(tgt, shared_memory), 1e-4, 1e-5));
}

TEST_CASE("LSTMCell and GRUCell with a state: lowered equals their forwards and the loop, gradients", "[functional_vmap]") {
  auto cells = copies<torch::nn::LSTMCell>(3, [] { return torch::nn::LSTMCell(4, 5); });
  auto stacked = from_modules(cells);
  auto lowered_params = trainable(stacked), loop_params = trainable(stacked);
  auto x = at::randn({3, 2, 4});  // per set
  auto h = at::randn({2, 5}), c = at::randn({2, 5});
  auto kw = tdn::kwargs(tdn::kw<"input">(x), tdn::kw<"hx">(std::make_tuple(h, c)));
  auto dims = tdn::in_dims(tdn::in_dim_of<"input">(0));
  auto [h1, c1] = tdn::functional_vmap(cells[0], lowered_params, {}, kw, dims);
  auto [lh, lc] = tdn::functional_vmap(cells[0], loop_params, {}, kw, dims, {.loop = true});
  for (std::int64_t i = 0; i < 3; ++i) {
    auto [eh, ec] = cells[static_cast<std::size_t>(i)]->forward(x[i], std::make_tuple(h, c));
    CHECK(h1[i].allclose(eh, 1e-5, 1e-6));
    CHECK(c1[i].allclose(ec, 1e-5, 1e-6));
  }
  CHECK(h1.allclose(lh, 1e-5, 1e-6));
  (h1.pow(2).sum() + c1.sum()).backward();
  (lh.pow(2).sum() + lc.sum()).backward();
  auto gl = grads(lowered_params), gp = grads(loop_params);
  for (std::size_t i = 0; i < gl.size(); ++i) CHECK(gl[i].allclose(gp[i], 1e-4, 1e-5));
  auto [zero_h, zero_c] = tdn::functional_vmap(cells[0], stacked, tdn::args(at::randn({4})));  // unbatched, zero state
  CHECK(zero_c.sizes() == c10::IntArrayRef{3, 5});
  auto mapped_state = tdn::kwargs(tdn::kw<"input">(x[0]), tdn::kw<"hx">(std::make_tuple(h.expand({3, 2, 5}), c.expand({3, 2, 5}))));
  CHECK_THROWS_WITH(tdn::functional_vmap(cells[0], stacked, {}, mapped_state, tdn::in_dims(tdn::in_dim_of<"hx">(0))),
                    Contains("in_dims maps an input that is not a tensor"));

  auto grus = copies<torch::nn::GRUCell>(2, [] { return torch::nn::GRUCell(3, 4); });
  auto gx = at::randn({2, 5, 3}), gh = at::randn({5, 4});  // input per set, state shared
  at::Tensor y = tdn::functional_vmap(grus[0], from_modules(grus), {}, tdn::kwargs(tdn::kw<"input">(gx), tdn::kw<"hx">(gh)),
                                      tdn::in_dims(tdn::in_dim_of<"input">(0)));
  CHECK(y[1].allclose(grus[1]->forward(gx[1], gh), 1e-5, 1e-6));
}

TEST_CASE("EmbeddingBag: lowered with offsets and per-sample weights (shared or per set) equals its forwards and the loop",
          "[functional_vmap]") {
  for (bool last : {false, true}) {
    auto bags = copies<torch::nn::EmbeddingBag>(3, [&] {
      return torch::nn::EmbeddingBag(torch::nn::EmbeddingBagOptions(10, 4).mode(torch::kSum).include_last_offset(last));
    });
    auto stacked = from_modules(bags);
    auto lowered_params = trainable(stacked), loop_params = trainable(stacked);
    auto indices = at::randint(0, 10, {3, 7});  // per set
    auto offsets = last ? at::tensor(std::vector<std::int64_t>{0, 3, 3, 7}) : at::tensor(std::vector<std::int64_t>{0, 3, 3});
    auto per_sample = at::randn({7});
    auto kw = tdn::kwargs(tdn::kw<"input">(indices), tdn::kw<"offsets">(offsets), tdn::kw<"per_sample_weights">(per_sample));
    auto dims = tdn::in_dims(tdn::in_dim_of<"input">(0));
    at::Tensor lowered = tdn::functional_vmap(bags[0], lowered_params, {}, kw, dims);
    at::Tensor looped = tdn::functional_vmap(bags[0], loop_params, {}, kw, dims, {.loop = true});
    REQUIRE(lowered.sizes() == c10::IntArrayRef{3, 3, 4});
    for (std::int64_t i = 0; i < 3; ++i)
      CHECK(lowered[i].allclose(bags[static_cast<std::size_t>(i)]->forward(indices[i], offsets, per_sample), 1e-5, 1e-6));
    CHECK(lowered.allclose(looped, 1e-5, 1e-6));
    lowered.pow(2).sum().backward();
    looped.pow(2).sum().backward();
    CHECK(lowered_params.get<"weight">().grad().allclose(loop_params.get<"weight">().grad(), 1e-5, 1e-6));
  }
  auto means = copies<torch::nn::EmbeddingBag>(2, [] { return torch::nn::EmbeddingBag(torch::nn::EmbeddingBagOptions(6, 2)); });
  auto offsets_per_set = at::tensor(std::vector<std::int64_t>{0, 1, 0, 4}).view({2, 2});
  auto indices = at::randint(0, 6, {5});
  at::Tensor y = tdn::functional_vmap(means[0], from_modules(means), tdn::args(indices), tdn::kwargs(tdn::kw<"offsets">(offsets_per_set)),
                                      tdn::in_dims(tdn::in_dim_of<"offsets">(0)));
  CHECK(y[1].allclose(means[1]->forward(indices, offsets_per_set[1]), 1e-5, 1e-6));
}

TEST_CASE("without autograd a ReLU overwrites the batched Linear's output, never the caller's tensors", "[functional_vmap]") {
  using torch::nn::Linear;
  using torch::nn::ReLU;
  using mlp = tdn::Sequential<Linear, ReLU, Linear, ReLU>;
  auto mlps = copies<mlp>(3, [] { return mlp(Linear(4, 6), ReLU(), Linear(6, 5), ReLU()); });
  const auto params = from_modules(mlps);
  const at::Tensor shared = at::randn({7, 4}), per_set = at::randn({3, 7, 4});
  const at::Tensor shared_before = shared.clone(), per_set_before = per_set.clone();
  const std::vector<at::Tensor> params_before = params.apply([](const at::Tensor& t) { return t.detach().clone(); }).values();
  at::NoGradGuard no_grad;
  const at::Tensor out = tdn::functional_vmap(mlps[0], params, tdn::args(shared));
  const at::Tensor mapped = tdn::functional_vmap(mlps[0], params, {}, tdn::kwargs(tdn::kw<"input">(per_set)),
                                                 tdn::in_dims(tdn::in_dim_of<"input">(0)));
  for (std::size_t i = 0; i < mlps.size(); ++i) {
    CHECK(out[i].allclose(mlps[i]->forward(shared), 1e-5, 1e-6));
    CHECK(mapped[i].allclose(mlps[i]->forward(per_set[i]), 1e-5, 1e-6));
  }
  CHECK(out.min().item<float>() >= 0);
  CHECK(shared.equal(shared_before));
  CHECK(per_set.equal(per_set_before));
  const std::vector<at::Tensor> params_after = params.values();
  for (std::size_t k = 0; k < params_after.size(); ++k) CHECK(params_after[k].equal(params_before[k]));

  // A ReLU first meets the caller's input: it must not overwrite it.
  using relu_first = tdn::Sequential<ReLU, Linear>;
  auto firsts = copies<relu_first>(2, [] { return relu_first(ReLU(), Linear(4, 3)); });
  const at::Tensor first_out = tdn::functional_vmap(firsts[0], from_modules(firsts), tdn::args(shared));
  CHECK(shared.equal(shared_before));
  for (std::size_t i = 0; i < firsts.size(); ++i) CHECK(first_out[i].allclose(firsts[i]->forward(shared), 1e-5, 1e-6));

  // A transformer layer's feed-forward block, in one group and a set at a time.
  using torch::nn::TransformerEncoderLayer;
  using torch::nn::TransformerEncoderLayerOptions;
  const std::int64_t batch = wide_feed_forward_batch();
  for (const std::int64_t n : {std::int64_t{3}, batch}) {
    auto layers = copies<TransformerEncoderLayer>(2, [] {
      return TransformerEncoderLayer(TransformerEncoderLayerOptions(8, 2).dim_feedforward(64).dropout(0.0));
    });
    const at::Tensor src = at::randn({2, n, 8}), src_before = src.clone();
    const at::Tensor y = tdn::functional_vmap(layers[0], from_modules(layers), tdn::args(src));
    CHECK(src.equal(src_before));
    for (std::size_t i = 0; i < layers.size(); ++i) CHECK(y[i].allclose(layers[i]->forward(src), 1e-4, 1e-5));
  }
}

TEST_CASE("several batch dims are flattened and restored", "[functional_vmap]") {
  auto nets = copies<torch::nn::Linear>(6, [] { return torch::nn::Linear(3, 2); });
  auto flat = from_modules(nets);
  auto grid = flat.apply([](const at::Tensor& t) {
    std::vector<std::int64_t> shape{2, 3};
    shape.insert(shape.end(), t.sizes().begin() + 1, t.sizes().end());
    return t.reshape(shape);
  }, {2, 3});
  auto x = at::randn({5, 3});
  auto y = tdn::functional_vmap(nets[0], grid, tdn::args(x));
  CHECK(y.sizes() == c10::IntArrayRef({2, 3, 5, 2}));
  CHECK(y[1][2].allclose(nets[5]->forward(x), 1e-4, 1e-6));

  auto per_set = at::randn({5, 2, 3, 3});  // the sets at dims 1 and 2
  auto z = tdn::functional_vmap(nets[0], grid, {}, tdn::kwargs(tdn::kw<"input">(per_set)),
                                tdn::in_dims(tdn::in_dim_of<"input">(1)));
  CHECK(z.sizes() == c10::IntArrayRef({2, 3, 5, 2}));
  CHECK(z[1][0].allclose(nets[3]->forward(per_set.select(1, 1).select(1, 0)), 1e-4, 1e-6));
}

TEST_CASE("an empty batch size calls the module once", "[functional_vmap]") {
  torch::nn::Linear net(3, 2);
  auto params = from_module(net);
  auto x = at::randn({4, 3});
  CHECK(tdn::functional_vmap(net, params, tdn::args(x)).allclose(net->forward(x), 1e-4, 1e-6));
  CHECK_THROWS_AS(tdn::functional_vmap(net, params, {}, tdn::kwargs(tdn::kw<"input">(x)), tdn::in_dims(tdn::in_dim_of<"input">(0))),
                  value_error);
}

TEST_CASE("functional_vmap's documented errors", "[functional_vmap]") {
  auto nets = copies<torch::nn::Linear>(4, [] { return torch::nn::Linear(3, 1); });
  auto params = from_modules(nets);
  auto wrong = at::randn({3, 10, 3});
  CHECK_THROWS_WITH(tdn::functional_vmap(nets[0], params, {}, tdn::kwargs(tdn::kw<"input">(wrong)),
                                         tdn::in_dims(tdn::in_dim_of<"input">(0))),
                    Contains("f32[3,10,3]") && Contains("[4]") && Contains("dim 0"));
  CHECK_THROWS_AS(tdn::functional_vmap(nets[0], params, tdn::args(at::randn({2, 3})), {}, {},
                                       {.randomness = randomness::same, .loop = true}),
                  value_error);
  // A Linear's input needs its features dim in every set, as its own forward does.
  const auto shared_scalar = [&] { return tdn::functional_vmap(nets[0], params, tdn::args(at::randn({}))); };
  CHECK_THROWS_AS(shared_scalar(), shape_error);
  CHECK_THROWS_WITH(shared_scalar(), Contains("f32[]") && Contains("shared by the sets"));
  const auto mapped_scalars = [&] {
    return tdn::functional_vmap(nets[0], params, {}, tdn::kwargs(tdn::kw<"input">(at::randn({4}))),
                                tdn::in_dims(tdn::in_dim_of<"input">(0)));
  };
  CHECK_THROWS_AS(mapped_scalars(), shape_error);
  CHECK_THROWS_WITH(mapped_scalars(), Contains("f32[4] mapped over the sets"));
  CHECK_THROWS_AS(nets[0]->forward(at::randn({})), c10::Error);
}

TEST_CASE("dropout follows the randomness mode", "[functional_vmap]") {
  using net_t = tdn::Sequential<torch::nn::Linear, torch::nn::Dropout>;
  auto nets = copies<net_t>(3, [] { return net_t(torch::nn::Linear(4, 50), torch::nn::Dropout(0.5)); });
  auto params = from_modules(nets);
  auto x = at::randn({2, 4});
  CHECK_THROWS_WITH(tdn::functional_vmap(nets[0], params, tdn::args(x)),
                    Contains("randomness") && Contains("different") && Contains("eval()"));
  auto ones = params.apply([](const at::Tensor& t) { return at::ones_like(t); });
  auto different = tdn::functional_vmap(nets[0], ones, tdn::args(x), {}, {}, {.randomness = randomness::different});
  CHECK(!(different[0] == 0).equal(different[1] == 0));
  auto same = tdn::functional_vmap(nets[0], ones, tdn::args(x), {}, {}, {.randomness = randomness::same});
  CHECK((same[0] == 0).equal(same[2] == 0));
  auto looped = tdn::functional_vmap(nets[0], ones, tdn::args(x), {}, {}, {.loop = true});  // loop draws per set
  CHECK(!(looped[0] == 0).equal(looped[1] == 0));
  nets[0]->eval();
  auto evaluated = tdn::functional_vmap(nets[0], ones, tdn::args(x));
  CHECK(evaluated[0].allclose(evaluated[1], 1e-4, 1e-6));
}

TEST_CASE("method calls another member function", "[functional_vmap]") {
  auto encoders = copies<Encoder>(3, [] { return Encoder(); });
  auto params = from_modules(encoders);
  auto x = at::randn({4, 3});
  auto y = tdn::functional_vmap<&EncoderImpl::encode>(encoders[0], params, tdn::args(x));
  for (int i = 0; i < 3; ++i) CHECK(y[i].allclose(encoders[i]->encode(x), 1e-4, 1e-6));
  auto looped = tdn::functional_vmap<&EncoderImpl::encode>(encoders[0], params, tdn::args(x), {}, {}, {.loop = true});
  CHECK(looped.allclose(y, 1e-4, 1e-6));
}

TEST_CASE("chunk_size computes the same sets in pieces", "[functional_vmap]") {
  using mlp = tdn::Sequential<torch::nn::Linear, torch::nn::ReLU, torch::nn::Linear>;
  auto nets = copies<mlp>(5, [] { return mlp(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2)); });
  auto params = from_modules(nets);
  auto x = at::randn({6, 3});
  auto whole = tdn::functional_vmap(nets[0], params, tdn::args(x));
  for (std::int64_t chunk : {1, 2, 5, 9})
    CHECK(tdn::functional_vmap(nets[0], params, tdn::args(x), {}, {}, {.chunk_size = chunk}).allclose(whole, 1e-4, 1e-6));
  auto encoders = copies<Encoder>(5, [] { return Encoder(); });
  auto eparams = from_modules(encoders);
  CHECK(tdn::functional_vmap(encoders[0], eparams, tdn::args(x), {}, {}, {.chunk_size = 2})
            .allclose(tdn::functional_vmap(encoders[0], eparams, tdn::args(x)), 1e-4, 1e-6));
}

namespace {
// Sets the intra-op threads for a scope.
struct intra_op_threads {
  int before = at::get_num_threads();
  explicit intra_op_threads(int n) { at::set_num_threads(n); }
  ~intra_op_threads() { at::set_num_threads(before); }
};

// Whether the graph behind t, a few nodes deep, has a node of this name.
bool graph_has(const at::Tensor& t, const std::string& name) {
  std::function<bool(const std::shared_ptr<torch::autograd::Node>&, int)> search = [&](const auto& node, int depth) {
    if (!node || depth > 6) return false;
    if (node->name().find(name) != std::string::npos) return true;
    for (const auto& edge : node->next_edges())
      if (search(edge.function, depth + 1)) return true;
    return false;
  };
  return search(t.grad_fn(), 0);
}

// Output and gradients (of params' leaves and of x) of one call.
template <class Params, class Call>
std::pair<at::Tensor, std::vector<at::Tensor>> value_and_grads(const Params& stacked, const at::Tensor& x, Call call) {
  auto p = stacked.apply([](const at::Tensor& t) { return t.detach().clone().requires_grad_(); });
  auto input = x.detach().clone().requires_grad_();
  at::Tensor out = call(p, input);
  out.pow(2).sum().backward();
  std::vector<at::Tensor> g{input.grad()};
  for (const auto& t : p.values()) g.push_back(t.grad());
  return {out.detach(), g};
}

// The parallel tasks give what one task gives: every sets_per_task, and the default with 2 threads.
// Without grad, each also equals the call with grad, except where libtorch's own forward differs
// between the two (inference_is_training false: libtorch 2.6's oneDNN LSTM has an inference
// kernel of its own, whose values on AVX-512 CPUs differ from the training kernel's by up to
// ~0.08); there, without grad is compared with one task without grad.
template <class Params, class Call>
void check_tasks_equal_one_task(const Params& stacked, const at::Tensor& x, Call call, bool runs_tasks = true,
                                bool inference_is_training = true) {
  const std::int64_t sets = stacked.batch_size()[0];
  intra_op_threads two(2);
  // Bit-identical on libtorch 1.13; 2.6 picks its GEMM and convolution kernels by the
  // batch size, so a task of fewer sets may round differently in the last bits.
  auto same = [](const at::Tensor& a, const at::Tensor& b) {
    INFO("largest difference " << (a - b).abs().max().item<double>());
    CHECK(a.allclose(b, 1e-5, 1e-6));
  };
  auto [serial, serial_grads] = value_and_grads(stacked, x, [&](const auto& p, const auto& in) {
    return call(p, in, tdn::functional_vmap_options{.sets_per_task = sets});
  });
  const at::Tensor serial_inference = [&] {
    at::NoGradGuard no_grad;
    return call(stacked, x, tdn::functional_vmap_options{.sets_per_task = sets});
  }();
  if (inference_is_training) same(serial_inference, serial);
  for (std::optional<std::int64_t> per_task : {std::optional<std::int64_t>(1), std::optional<std::int64_t>(3), std::optional<std::int64_t>()}) {
    INFO("sets_per_task " << (per_task ? std::to_string(*per_task) : "default"));
    auto [parallel, parallel_grads] = value_and_grads(stacked, x, [&](const auto& p, const auto& in) {
      at::Tensor out = call(p, in, tdn::functional_vmap_options{.sets_per_task = per_task});
      if (per_task) CHECK(graph_has(out, "set_tasks_backward") == runs_tasks);  // by default these small calls run one task
      return out;
    });
    same(parallel, serial);
    REQUIRE(parallel_grads.size() == serial_grads.size());
    for (std::size_t i = 0; i < serial_grads.size(); ++i) {
      INFO("gradient " << i << " (0: the input's, then params' leaves in order) of " << serial_grads.size());
      same(parallel_grads[i], serial_grads[i]);
    }
    at::NoGradGuard no_grad;
    same(call(stacked, x, tdn::functional_vmap_options{.sets_per_task = per_task}), serial_inference);
  }
}
}  // namespace

TEST_CASE("sets in parallel tasks equal one task: values and gradients, typed and run-time models", "[functional_vmap]") {
  using torch::nn::Linear;
  using torch::nn::ReLU;
  using mlp = tdn::Sequential<Linear, ReLU, Linear, ReLU, Linear>;
  auto nets = copies<mlp>(7, [] { return mlp(Linear(5, 16), ReLU(), Linear(16, 16), ReLU(), Linear(16, 3)); });
  const auto params = from_modules(nets);
  // Shared input (its gradient summed over the tasks) and an input per set.
  check_tasks_equal_one_task(params, at::randn({9, 5}), [&](const auto& p, const at::Tensor& x, auto options) {
    return tdn::functional_vmap(nets[0], p, tdn::args(x), {}, {}, options);
  });
  check_tasks_equal_one_task(params, at::randn({7, 9, 5}), [&](const auto& p, const at::Tensor& x, auto options) {
    return tdn::functional_vmap(nets[0], p, {}, tdn::kwargs(tdn::kw<"input">(x)), tdn::in_dims(tdn::in_dim_of<"input">(0)),
                                options);
  });

  std::vector<torch::nn::Sequential> dynamic;
  for (int i = 0; i < 5; ++i)
    dynamic.emplace_back(torch::nn::Conv1d(torch::nn::Conv1dOptions(2, 4, 3)), torch::nn::Tanh(), torch::nn::Flatten(),
                         Linear(4 * 6, 2));
  const AnyTensorDict dynamic_params = from_modules(dynamic);
  // Convolutions run one task (oneDNN's are not safe to run at once: nn/functional_vmap.hpp).
  check_tasks_equal_one_task(
      dynamic_params, at::randn({3, 2, 8}),
      [&](const auto& p, const at::Tensor& x, auto options) {
        return tdn::functional_vmap(dynamic[0], p, tdn::args(x), {}, {}, options);
      },
      false);
  std::vector<torch::nn::Sequential> dense;
  for (int i = 0; i < 5; ++i) dense.emplace_back(Linear(6, 8), torch::nn::Tanh(), torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})), Linear(8, 2));
  check_tasks_equal_one_task(AnyTensorDict(from_modules(dense)), at::randn({3, 6}), [&](const auto& p, const at::Tensor& x, auto options) {
    return tdn::functional_vmap(dense[0], p, tdn::args(x), {}, {}, options);
  });

  // Outputs that are tuples (an LSTM's output and state), each joined over the tasks; where
  // libtorch has a fused kernel (2.6's oneDNN) each task runs its sets through it in turn.
  std::vector<torch::nn::LSTM> lstms;
  for (int i = 0; i < 5; ++i) lstms.emplace_back(torch::nn::LSTMOptions(3, 4).num_layers(2));
  check_tasks_equal_one_task(
      AnyTensorDict(from_modules(lstms)), at::randn({6, 2, 3}),
      [&](const auto& p, const at::Tensor& x, auto options) {
        auto [y, state] = tdn::functional_vmap(lstms[0], p, tdn::args(x), {}, {}, options);
        return at::cat({y.flatten(1), std::get<0>(state).flatten(1), std::get<1>(state).flatten(1)}, 1);
      },
      true, /*inference_is_training=*/false);

  auto layer = torch::nn::TransformerEncoderLayer(torch::nn::TransformerEncoderLayerOptions(8, 2).dim_feedforward(16).dropout(0.0));
  std::vector<torch::nn::TransformerEncoder> encoders;
  for (int i = 0; i < 4; ++i) encoders.emplace_back(torch::nn::TransformerEncoderOptions(layer, 2));
  check_tasks_equal_one_task(AnyTensorDict(from_modules(encoders)), at::randn({5, 3, 8}),
                             [&](const auto& p, const at::Tensor& x, auto options) {
                               return tdn::functional_vmap(encoders[0], p, tdn::args(x), {}, {}, options);
                             });
}

TEST_CASE("sets in parallel tasks: how many sets a task runs by default", "[functional_vmap]") {
  using tensordict::detail::sets_per_task;
  const std::int64_t cache = tensordict::detail::core_cache_bytes();
  // Too little work to split (16 small MLPs): one task.
  CHECK(sets_per_task(16, 30'000, 90e3, 2) == 16);
  // Enough work: at most two tasks per thread, evenly shared.
  CHECK(sets_per_task(128, 70'000, 0.7e6, 2) == 32);
  CHECK(sets_per_task(8, cache * 4, 44e6, 2) == 2);
  // As many as fit in the cache, and at least one task per thread.
  CHECK(sets_per_task(8, cache / 4, 44e6, 2) == 4);
  CHECK(sets_per_task(64, cache / 8, 50e6, 4) == 8);
  CHECK(sets_per_task(3, cache * 4, 44e6, 2) == 1);
}

TEST_CASE("sets in parallel tasks: the errors", "[functional_vmap]") {
  intra_op_threads two(2);
  auto nets = copies<torch::nn::Linear>(4, [] { return torch::nn::Linear(3, 2); });
  auto params = from_modules(nets).apply([](const at::Tensor& t) { return t.detach().requires_grad_(); });
  auto x = at::randn({5, 3});
  CHECK_THROWS_WITH(tdn::functional_vmap(nets[0], params, tdn::args(x), {}, {}, {.sets_per_task = 0}),
                    Contains("sets_per_task must be positive, got 0"));
  auto y = tdn::functional_vmap(nets[0], params, tdn::args(x), {}, {}, {.sets_per_task = 2});
  // Other randomness than "error" runs one task (parallel draws would not follow the seed).
  auto z = tdn::functional_vmap(nets[0], params, tdn::args(x), {}, {}, {.randomness = randomness::different, .sets_per_task = 2});
  CHECK(graph_has(y, "set_tasks_backward"));
  CHECK_FALSE(graph_has(z, "set_tasks_backward"));
}

TEST_CASE("a chain of Linears spreads its sets over the threads inside its one node: as on one thread", "[functional_vmap]") {
  using torch::nn::Linear;
  using torch::nn::ReLU;
  // 24 MLPs (20 MFLOP a call: worth two threads) on the library's kernel; 4 sets with a layer on BLAS.
  using mlp = tdn::Sequential<Linear, ReLU, Linear, ReLU, Linear>;
  auto nets = copies<mlp>(24, [] { return mlp(Linear(32, 64), ReLU(), Linear(64, 64), ReLU(), Linear(64, 4)); });
  using wide = tdn::Sequential<Linear, ReLU, Linear>;
  auto wides = copies<wide>(4, [] { return wide(Linear(8, 160), ReLU(), Linear(160, 160)); });
  const auto compare = [](auto& models, const at::Tensor& x) {
    const auto params = from_modules(models);
    auto run = [&](int threads) {
      intra_op_threads n(threads);
      return value_and_grads(params, x, [&](const auto& p, const at::Tensor& in) {
        at::Tensor out = tdn::functional_vmap(models[0], p, tdn::args(in));
        CHECK_FALSE(graph_has(out, "set_tasks_backward"));
        return out;
      });
    };
    const auto [one, one_grads] = run(1);
    const auto [two, two_grads] = run(2);
    CHECK(two.allclose(one, 1e-6, 1e-7));
    REQUIRE(two_grads.size() == one_grads.size());
    for (std::size_t i = 0; i < one_grads.size(); ++i) CHECK(two_grads[i].allclose(one_grads[i], 1e-6, 1e-6));
  };
  compare(nets, at::randn({64, 32}));
  compare(wides, at::randn({64, 8}));
}

namespace {
// Stacked MLPs called with their sets in tasks of `per_task` (one task where it is the number of sets).
// float64: a task of 2 sets and one of 6 run libtorch's bmm over another batch,
// which may sum in another order (libtorch 2.6), and the second-order terms
// cancel: in float32 a 1e-5 check failed for one seed in CI (the last bias).
struct tasks_case {
  using mlp = tdn::Sequential<torch::nn::Linear, torch::nn::Tanh, torch::nn::Linear>;
  using params_type = decltype(from_modules(std::declval<std::vector<mlp>&>()));
  std::vector<mlp> nets = copies<mlp>(6, [] {
    mlp net(torch::nn::Linear(3, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
    net->to(at::kDouble);
    return net;
  });
  params_type params = trainable(from_modules(nets));
  at::Tensor input = at::randn({5, 3}, at::kDouble).requires_grad_();

  // The same modules and values in leaves of its own.
  tasks_case twin() const {
    tasks_case c = *this;
    c.params = trainable(params);
    c.input = input.detach().clone().requires_grad_();
    return c;
  }
  at::Tensor call(std::int64_t per_task) const {
    return tdn::functional_vmap(nets[0], params, tdn::args(input), {}, {}, {.sets_per_task = per_task});
  }
  std::vector<at::Tensor> gradients() const {
    std::vector<at::Tensor> out{input.grad()};
    for (const auto& t : params.values()) out.push_back(t.grad());
    return out;
  }
};

void check_same(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& expected) {
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("gradient " << i << " of " << got.size());
    REQUIRE(got[i].defined() == expected[i].defined());
    if (got[i].defined()) CHECK(got[i].allclose(expected[i], 1e-5, 1e-6));
  }
}

// Counts the bytes of libtorch's CPU allocations alive while it is installed.
struct counting_cpu_allocator : c10::Allocator {
  c10::Allocator* base = c10::GetCPUAllocator();
  static inline std::atomic<std::int64_t> live{0};
  struct block {
    c10::DataPtr inner;
    std::int64_t bytes;
  };
  static void release(void* ctx) {
    auto* b = static_cast<block*>(ctx);
    live -= b->bytes;
    delete b;
  }
  // allocate is const in libtorch 1.13 and not in 2.x: both, and no `override`, so that either overrides.
  c10::DataPtr allocate(std::size_t n) const {
    auto* b = new block{base->allocate(n), static_cast<std::int64_t>(n)};
    live += b->bytes;
    void* data = b->inner.get();
    return {data, b, &release, b->inner.device()};
  }
  c10::DataPtr allocate(std::size_t n) { return std::as_const(*this).allocate(n); }
  c10::DeleterFnPtr raw_deleter() const { return nullptr; }
  // libtorch 2.x asks for it (pure virtual there); 1.13 has no such member.
  void copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }
  counting_cpu_allocator() { c10::SetCPUAllocator(this, 100); }
  ~counting_cpu_allocator() { c10::SetCPUAllocator(base, 100); }
};
}  // namespace

TEST_CASE("sets in parallel tasks: tensors inside a state input take their gradient", "[functional_vmap]") {
  intra_op_threads two(2);
  auto cells = copies<torch::nn::LSTMCell>(6, [] { return torch::nn::LSTMCell(3, 4); });
  torch::nn::Linear encoder(2, 4);
  const auto stacked = from_modules(cells);
  const at::Tensor z = at::randn({5, 2}), x = at::randn({5, 3}), c0 = at::randn({5, 4});
  auto run = [&](std::int64_t per_task) {
    encoder->zero_grad();
    auto p = trainable(stacked);
    auto c = c0.detach().clone().requires_grad_();
    at::Tensor h0 = encoder->forward(z);  // not a leaf: its gradient reaches the encoder
    auto [h1, c1] = tdn::functional_vmap(cells[0], p, tdn::args(x, std::make_tuple(h0, c)), {}, {}, {.sets_per_task = per_task});
    CHECK(graph_has(h1, "set_tasks_backward") == (per_task < 6));
    (h1.pow(2).mean() + c1.sum()).backward();
    std::vector<at::Tensor> out{encoder->weight.grad().clone(), encoder->bias.grad().clone(), c.grad()};
    for (const auto& g : grads(p)) out.push_back(g);
    return out;
  };
  const auto one_task = run(6);
  CHECK(one_task[0].abs().sum().item<double>() > 0);
  for (std::int64_t per_task : {1, 2, 4}) {
    INFO("sets_per_task " << per_task);
    check_same(run(per_task), one_task);
  }
}

TEST_CASE("sets in parallel tasks inside tensordict::vmap run as one task, with gradients", "[functional_vmap]") {
  intra_op_threads two(2);
  auto nets = copies<torch::nn::Linear>(4, [] { return torch::nn::Linear(3, 2); });
  const auto stacked = from_modules(nets);
  const at::Tensor xs = at::randn({3, 5, 3});
  auto run = [&](std::int64_t per_task) {
    auto p = trainable(stacked);
    at::Tensor y = vmap([&](const at::Tensor& x) {
      return tdn::functional_vmap(nets[0], p, tdn::args(x), {}, {}, {.sets_per_task = per_task});
    })(xs);
    REQUIRE(y.requires_grad());
    y.pow(2).sum().backward();
    return std::make_pair(y.detach(), grads(p));
  };
  auto [one_y, one_grads] = run(4);
  auto [y, g] = run(2);
  CHECK(y.allclose(one_y, 1e-5, 1e-6));
  check_same(g, one_grads);
}

TEST_CASE("sets in parallel tasks: retain_graph, create_graph and a second backward as one task", "[functional_vmap]") {
  intra_op_threads two(2);
  for (std::int64_t per_task : {6, 2}) {
    INFO("sets_per_task " << per_task);
    const tasks_case one;
    const tasks_case tasks = one.twin();
    // retain_graph: two backwards accumulate twice the gradient.
    at::Tensor y1 = one.call(6), y2 = tasks.call(per_task);
    CHECK(graph_has(y2, "set_tasks_backward") == (per_task < 6));
    y1.sum().backward({}, true);
    y1.sum().backward();
    y2.sum().backward({}, true);
    y2.sum().backward();
    check_same(tasks.gradients(), one.gradients());
    // Without it, a second backward fails either way.
    at::Tensor y3 = tasks.call(per_task);
    y3.sum().backward();
    CHECK_THROWS_WITH(y3.sum().backward(), Contains("backward through the graph a second time"));
  }
  // create_graph: the gradients' own gradients equal one task's.
  auto second_order = [](const tasks_case& c, std::int64_t per_task) {
    at::Tensor y = c.call(per_task);
    const auto g = torch::autograd::grad({y.pow(2).sum()}, {c.params.get<"0", "weight">(), c.input}, {}, true, true);
    REQUIRE(g[0].requires_grad());
    (g[0].pow(2).sum() + g[1].pow(2).sum()).backward();
    return c.gradients();
  };
  const tasks_case one;
  check_same(second_order(one.twin(), 2), second_order(one, 6));
}

TEST_CASE("sets in parallel tasks keep one copy of the outputs", "[functional_vmap]") {
  intra_op_threads two(2);
  auto nets = copies<torch::nn::Linear>(8, [] { return torch::nn::Linear(64, 1024); });
  auto params = from_modules(nets).apply([](const at::Tensor& t) { return t.detach().requires_grad_(); });
  const at::Tensor x = at::randn({256, 64});
  const std::int64_t output_bytes = 8 * 256 * 1024 * 4;  // 8 MiB
  auto live_after_forward = [&](std::int64_t per_task) {
    counting_cpu_allocator counting;
    const std::int64_t before = counting_cpu_allocator::live;
    at::Tensor y = tdn::functional_vmap(nets[0], params, tdn::args(x), {}, {}, {.sets_per_task = per_task});
    REQUIRE(y.requires_grad());
    return counting_cpu_allocator::live - before;
  };
  const std::int64_t one = live_after_forward(8), tasks = live_after_forward(2);
  INFO("one task " << one << " bytes, tasks " << tasks << " bytes, the output " << output_bytes);
  CHECK(one >= output_bytes);
  CHECK(tasks < one + output_bytes / 4);
}

#ifdef _OPENMP
TEST_CASE("sets in parallel tasks inside the caller's OpenMP region leave its thread settings", "[functional_vmap]") {
  intra_op_threads two(2);
  auto nets = copies<torch::nn::Linear>(4, [] { return torch::nn::Linear(3, 2); });
  const auto params = from_modules(nets);
  const at::Tensor x = at::randn({5, 3});
  std::vector<int> omp_before(2, -1), omp_after(2, -1), at_before(2, -1), at_after(2, -1);
  std::vector<at::Tensor> out(2);
#pragma omp parallel num_threads(2)
  {
    const int i = omp_get_thread_num();
    omp_before[i] = omp_get_max_threads();
    at_before[i] = at::get_num_threads();
    out[i] = tdn::functional_vmap(nets[0], params, tdn::args(x), {}, {}, {.sets_per_task = 2});
    omp_after[i] = omp_get_max_threads();
    at_after[i] = at::get_num_threads();
  }
  const at::Tensor expected = tdn::functional_vmap(nets[0], params, tdn::args(x), {}, {}, {.sets_per_task = 4});
  for (int i = 0; i < 2; ++i) {
    INFO("thread " << i);
    CHECK(omp_after[i] == omp_before[i]);
    CHECK(at_after[i] == at_before[i]);
    if (out[i].defined()) CHECK(out[i].allclose(expected, 1e-5, 1e-6));
  }
}
#endif

TEST_CASE("lowering_of: whether a module lowers, and which child does not and why", "[functional_vmap]") {
  using torch::nn::Linear;
  using torch::nn::ReLU;
  using mlp = tdn::Sequential<Linear, ReLU, Linear>;
  mlp typed(Linear(3, 4), ReLU(), Linear(4, 2));
  CHECK(tdn::lowering_of(typed));
  CHECK(tdn::lowering_of(typed->child<0>()));
  auto encoder = Encoder();  // a user's module without a batched form
  const auto mine = tdn::lowering_of(encoder);
  CHECK_FALSE(mine);
  CHECK(mine.path.empty());
  CHECK_THAT(mine.reason, Contains("EncoderImpl has no batched form"));

  torch::nn::Sequential dynamic(Linear(3, 4), ReLU(), Linear(4, 2));
  CHECK(tdn::lowering_of(dynamic));
  torch::nn::Sequential with_user(Linear(3, 3), Encoder());
  const auto inner = tdn::lowering_of(with_user);
  CHECK_FALSE(inner);
  CHECK(inner.path == "1");
  CHECK_THAT(inner.reason, Contains("EncoderImpl"));
  // Options a batched form does not take: BatchNorm in training mode.
  torch::nn::Sequential training(Linear(3, 3), torch::nn::BatchNorm1d(3));
  training->train();
  const auto bn = tdn::lowering_of(training);
  CHECK_FALSE(bn);
  CHECK(bn.path == "1");
  CHECK_THAT(bn.reason, Contains("does not support its options"));
  training->eval();
  CHECK(tdn::lowering_of(training));

  // Batched forms of a tuple of inputs (a state, a second input) lower a module called by itself.
  torch::nn::LSTM lstm(torch::nn::LSTMOptions(3, 4).num_layers(2).dropout(0.5));
  lstm->eval();
  CHECK(tdn::lowering_of(lstm));
  STATIC_REQUIRE(tdn::fully_lowered<torch::nn::LSTMImpl>());
  STATIC_REQUIRE(tdn::fully_lowered<torch::nn::LSTMCellImpl>());
  STATIC_REQUIRE(!tdn::fully_lowered<torch::nn::LSTMCellImpl, true>());  // its (h, c) is no Sequential's chained tensor
  CHECK(tdn::lowering_of(torch::nn::LSTMCell(3, 4)));
  CHECK(tdn::lowering_of(torch::nn::GRU(torch::nn::GRUOptions(3, 4))));
  lstm->train();  // dropout between layers draws per set
  const auto dropout = tdn::lowering_of(lstm);
  CHECK_FALSE(dropout);
  CHECK_THAT(dropout.reason, Contains("LSTMImpl's batched form does not support its options"));
}
