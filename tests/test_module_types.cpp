// Every torch::nn module type: the list of the installed libtorch's module
// classes is covered (supported or listed with a reason), and the types
// without tensors, the losses and AdaptiveLogSoftmaxWithLoss compute through
// functional_call and functional_vmap as their own forwards do.
#include "catch_torch.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/_make_dual.h>
#include <ATen/ops/_unpack_dual.h>
#include <ATen/ops/max_pool2d_with_indices.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/stack.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/forward_grad.h>
#include <torch/csrc/autograd/function.h>
#include <torch/nn/modules/adaptive.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/container/sequential.h>

#include <tensordict/detail/core_cache.hpp>
#include <tensordict/nn/adapters/builtin.hpp>  // every family: the suite uses them all
#include <tensordict/nn/functional_vmap.hpp>
#include <tensordict/nn/module_registry.hpp>

using namespace tensordict;
namespace tdn = tensordict::nn;
using test::Contains;

namespace {

// The concrete module classes ("torch::nn::XImpl") that the headers under
// `dir` define: class templates (AvgPoolImpl<D, Derived>) and doc comments left out.
std::set<std::string> module_classes_in(const std::filesystem::path& dir) {
  const std::regex definition(R"(^\s*(class|struct)\s+(TORCH_API\s+)?(\w+Impl)\b[^;]*$)");
  std::set<std::string> out;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.path().extension() != ".h") continue;
    std::ifstream in(entry.path());
    std::string line, previous;
    while (std::getline(in, line)) {
      std::smatch m;
      const bool comment = line.find("//") != std::string::npos && line.find("//") < line.find_first_not_of(" \t") + 1;
      if (!comment && std::regex_search(line, m, definition) && previous.find("template") == std::string::npos)
        out.insert("torch::nn::" + m[3].str());
      if (line.find("NOLINT") == std::string::npos && !line.empty()) previous = line;
    }
  }
  return out;
}

std::filesystem::path torch_module_headers() {
  if (const char* dir = std::getenv("TENSORDICT_TORCH_MODULES")) return dir;
  return "/usr/include/torch/csrc/api/include/torch/nn/modules";
}

template <class Holder>
std::vector<Holder> three(Holder m) {
  return {m, m, m};  // a module without tensors: the sets differ only in their inputs
}

// What check_type compares, computed by the typed calls of run_type: the
// comparisons are not templates, so the Catch2 assertions are compiled once,
// not once per module type (this file compiled in 159 s at -O0 with them in
// the template).
struct type_results {
  at::Tensor own, own_grad, call, call_grad;
  bool lowered = false, dynamic_lowered = false;
  at::Tensor shared, mapped, mapped_grad;
  std::vector<at::Tensor> each, each_grad;  // each set's own forward of its input, and its gradient
  at::Tensor dynamic_call;
};

template <class Holder>
type_results run_type(Holder m, const at::Tensor& x) {
  type_results r;
  const auto params = from_module(m);
  const at::Tensor a = x.clone().requires_grad_(), b = x.clone().requires_grad_();
  r.own = m->forward(a);
  r.call = functional_call(m, params, b);
  r.own.pow(2).sum().backward();
  r.call.pow(2).sum().backward();
  r.own_grad = a.grad();
  r.call_grad = b.grad();

  r.lowered = static_cast<bool>(tdn::lowering_of(m));
  auto members = three(m);
  const auto stacked = from_modules(members);
  r.shared = tdn::functional_vmap(m, stacked, tdn::args(x));
  const at::Tensor per_set = at::stack({x, x * 0.5 + 0.1, x.flip(-1)}).requires_grad_();
  r.mapped = tdn::functional_vmap(m, stacked, {}, tdn::kwargs(tdn::kw<"input">(per_set)),
                                  tdn::in_dims(tdn::in_dim_of<"input">(0)));
  r.mapped.pow(2).sum().backward();
  r.mapped_grad = per_set.grad();
  for (int i = 0; i < 3; ++i) {
    const at::Tensor xi = per_set[i].detach().requires_grad_();
    r.each.push_back(m->forward(xi));
    r.each.back().pow(2).sum().backward();
    r.each_grad.push_back(xi.grad());
  }

  torch::nn::Sequential dynamic;
  dynamic->push_back(m);
  r.dynamic_call = functional_call(dynamic, from_module(dynamic), x);
  r.dynamic_lowered = static_cast<bool>(tdn::lowering_of(dynamic));
  return r;
}

void compare_type(const std::string& type, const at::Tensor& x, bool lowers, const std::function<type_results()>& run) {
  INFO(type << " on " << x.sizes());
  const type_results r = run();
  REQUIRE(r.call.allclose(r.own, 1e-5, 1e-6));
  CHECK(r.call_grad.allclose(r.own_grad, 1e-5, 1e-6));
  CHECK(r.lowered == lowers);
  REQUIRE(r.shared.size(0) == 3);
  for (int i = 0; i < 3; ++i) CHECK(r.shared[i].allclose(r.own, 1e-5, 1e-6));
  for (int i = 0; i < 3; ++i) {
    CHECK(r.mapped[i].allclose(r.each[i], 1e-5, 1e-6));
    CHECK(r.mapped_grad[i].allclose(r.each_grad[i], 1e-4, 1e-5));
  }
  CHECK(r.dynamic_call.allclose(r.own, 1e-5, 1e-6));
  CHECK(r.dynamic_lowered == lowers);
}

// functional_call equals the module's forward (values and the gradient to
// the input); functional_vmap equals each set's forward, the input shared
// and per set (and its gradient); lowered where `lowers`; a run-time
// Sequential holding the module computes and lowers alike.
template <class Holder>
void check_type(Holder m, const at::Tensor& x, bool lowers = true) {
  compare_type(c10::demangle(typeid(*m).name()), x, lowers, [&] { return run_type(m, x); });
}

}  // namespace

TEST_CASE("every module class of the installed libtorch is supported or listed with a reason", "[module_types]") {
  const auto dir = torch_module_headers();
  INFO("headers: " << dir.string() << " (TENSORDICT_TORCH_MODULES)");
  REQUIRE(std::filesystem::is_directory(dir));
  const auto found = module_classes_in(dir);
  CHECK(found.size() > 100);  // 1.13: 121, 2.6: 124
  CHECK(found.count("torch::nn::LinearImpl") == 1);
  CHECK(found.count("torch::nn::AvgPoolImpl") == 0);  // a class template
  const auto supported = tdn::supported_module_types();
  const std::set<std::string> known(supported.begin(), supported.end());
  for (const auto& type : found) {
    INFO(type << ": neither supported (a family's list in include/tensordict/nn/adapters/) nor in "
                 "nn::unsupported_module_types with a reason");
    bool listed = known.count(type) > 0;
    for (const auto& u : tdn::unsupported_module_types)
      if (u.type == type) {
        listed = true;
        CHECK(!u.reason.empty());
      }
    CHECK(listed);
  }
  // Every supported name is a real class of this libtorch (no stale entry), but the library's own modules.
  for (const auto& type : supported)
    if (type.rfind("torch::nn::", 0) == 0) CHECK(found.count(type) == 1);
}

TEST_CASE("element-wise activations: functional form, lowered, run-time", "[module_types]") {
  namespace N = torch::nn;
  const at::Tensor x = at::randn({4, 5});
  check_type(N::ReLU(), x);
  check_type(N::ReLU6(), x * 4);
  check_type(N::LeakyReLU(N::LeakyReLUOptions().negative_slope(0.2)), x);
  check_type(N::ELU(), x);
  check_type(N::SELU(), x);
  check_type(N::CELU(N::CELUOptions().alpha(0.5)), x);
  check_type(N::GELU(), x);
  check_type(N::SiLU(), x);
  check_type(N::Mish(), x);
  check_type(N::Sigmoid(), x);
  check_type(N::LogSigmoid(), x);
  check_type(N::Tanh(), x);
  check_type(N::Softplus(N::SoftplusOptions().beta(2)), x);
  check_type(N::Softsign(), x);
  check_type(N::Softshrink(0.3), x);
  check_type(N::Hardshrink(0.3), x);
  check_type(N::Tanhshrink(), x);
  check_type(N::Hardtanh(N::HardtanhOptions().min_val(-0.5).max_val(0.5)), x);
  check_type(N::Threshold(0.1, 20), x);
  check_type(N::Identity(), x);
  N::RReLU rrelu;
  rrelu->eval();  // a fixed slope
  check_type(rrelu, x);
}

TEST_CASE("modules that take dims: Softmax and kin, GLU, Flatten, Unflatten", "[module_types]") {
  namespace N = torch::nn;
  check_type(N::Softmax(1), at::randn({4, 5}));
  check_type(N::LogSoftmax(-1), at::randn({4, 5}));
  check_type(N::Softmin(1), at::randn({4, 5}));
  check_type(N::Softmax2d(), at::randn({2, 3, 4, 4}));
  check_type(N::Softmax2d(), at::randn({3, 4, 4}));  // unbatched
  check_type(N::GLU(), at::randn({4, 6}));
  check_type(N::GLU(N::GLUOptions(0)), at::randn({4, 6}));
  check_type(N::Flatten(), at::randn({2, 3, 4}));
  check_type(N::Unflatten(N::UnflattenOptions(1, {2, 3})), at::randn({4, 6}));
}

TEST_CASE("pooling, padding, resampling and local response norms fold the sets into the batch", "[module_types]") {
  namespace N = torch::nn;
  check_type(N::MaxPool1d(2), at::randn({2, 3, 8}));
  check_type(N::MaxPool2d(N::MaxPool2dOptions(3).stride(2).padding(1)), at::randn({2, 3, 7, 7}));
  check_type(N::MaxPool2d(2), at::randn({3, 6, 6}));  // unbatched: the sets fold into the channels
  check_type(N::MaxPool3d(2), at::randn({2, 2, 4, 4, 4}));
  check_type(N::AvgPool1d(3), at::randn({2, 3, 9}));
  check_type(N::AvgPool2d(N::AvgPool2dOptions(2).ceil_mode(true)), at::randn({2, 3, 5, 5}));
  check_type(N::AvgPool3d(2), at::randn({1, 2, 4, 4, 4}));
  check_type(N::AdaptiveMaxPool1d(3), at::randn({2, 3, 8}));
  check_type(N::AdaptiveMaxPool2d(N::AdaptiveMaxPool2dOptions({2, 3})), at::randn({2, 3, 7, 6}));
  check_type(N::AdaptiveMaxPool3d(2), at::randn({2, 2, 4, 5, 4}));
  check_type(N::AdaptiveAvgPool1d(3), at::randn({2, 3, 8}));
  check_type(N::AdaptiveAvgPool2d(1), at::randn({2, 3, 7, 6}));
  check_type(N::AdaptiveAvgPool1d(1), at::randn({3, 8}));  // unbatched
  check_type(N::AdaptiveAvgPool3d(1), at::randn({2, 2, 3, 4, 5}));
  check_type(N::AdaptiveAvgPool2d(N::AdaptiveAvgPool2dOptions({1, c10::nullopt})), at::randn({2, 3, 7, 6}));
  {
    // An input libtorch's own forward refuses (1-d samples for a 2-d pooling) is refused lowered too, not summed.
    N::AdaptiveAvgPool2d global(1);
    auto members = three(global);
    CHECK_THROWS(tdn::functional_vmap(global, from_modules(members), tdn::args(at::randn({4, 5}))));
  }
  check_type(N::AdaptiveAvgPool3d(2), at::randn({2, 4, 5, 4}));
  check_type(N::LPPool1d(2, 2), at::randn({2, 3, 8}));
  check_type(N::LPPool2d(N::LPPool2dOptions(1.5, 2)), at::randn({2, 3, 6, 6}).abs() + 0.1);
#if TENSORDICT_HAS_TORCH_2_2_MODULES
  check_type(N::LPPool3d(2, 2), at::randn({2, 2, 4, 4, 4}));
#endif
  check_type(N::ReflectionPad1d(2), at::randn({2, 3, 5}));
  check_type(N::ReflectionPad2d(N::ReflectionPad2dOptions({1, 2, 0, 1})), at::randn({2, 3, 4, 4}));
  check_type(N::ReflectionPad3d(1), at::randn({1, 2, 3, 3, 3}));
  check_type(N::ReplicationPad1d(2), at::randn({2, 3, 5}));
  check_type(N::ReplicationPad2d(1), at::randn({3, 4, 4}));
  check_type(N::ReplicationPad3d(1), at::randn({1, 2, 3, 3, 3}));
  check_type(N::ZeroPad2d(N::ZeroPad2dOptions({1, 0, 2, 1})), at::randn({2, 3, 4, 4}));
#if TENSORDICT_HAS_TORCH_2_2_MODULES
  check_type(N::ZeroPad1d(2), at::randn({2, 3, 5}));
  check_type(N::ZeroPad3d(1), at::randn({1, 2, 3, 3, 3}));
#endif
  check_type(N::ConstantPad1d(N::ConstantPad1dOptions(2, 0.5)), at::randn({2, 3, 5}));
  check_type(N::ConstantPad2d(N::ConstantPad2dOptions(1, -1)), at::randn({2, 3, 4, 4}));
  check_type(N::ConstantPad3d(N::ConstantPad3dOptions(1, 2)), at::randn({1, 2, 3, 3, 3}));
  check_type(N::Upsample(N::UpsampleOptions().scale_factor(std::vector<double>{2, 2})), at::randn({2, 3, 4, 4}));
  check_type(N::Upsample(N::UpsampleOptions().size(std::vector<std::int64_t>{7}).mode(torch::kLinear).align_corners(false)),
             at::randn({2, 3, 4}));
  check_type(N::PixelShuffle(2), at::randn({2, 8, 3, 3}));
  check_type(N::PixelShuffle(2), at::randn({8, 3, 3}));
  check_type(N::PixelUnshuffle(2), at::randn({2, 2, 4, 4}));
  check_type(N::Fold(N::FoldOptions({4, 5}, {2, 2})), at::randn({2, 12, 12}));
  check_type(N::Fold(N::FoldOptions({4, 5}, {2, 2})), at::randn({12, 12}));  // unbatched
  check_type(N::Unfold(N::UnfoldOptions({2, 3})), at::randn({2, 3, 4, 5}));
  check_type(N::LocalResponseNorm(2), at::randn({2, 4, 5, 5}));
  check_type(N::CrossMapLRN2d(3), at::randn({2, 4, 5, 5}));
}

// MaxPool2d lowered on contiguous memory is the library's kernel (a gather by its window indices under autograd):
// each set's values, gradients and double backward are exactly its own max_pool2d's, with ties (the first max of a
// window in row-major order), NaNs (the last NaN), padding, dilation and ceil_mode; other memory goes to libtorch.
namespace {
// Whether a node of y's autograd graph has `name` in its name.
bool graph_has(const at::Tensor& y, const std::string& name) {
  std::vector<torch::autograd::Node*> todo{y.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (!node || !seen.insert(node).second) continue;
    if (node->name().find(name) != std::string::npos) return true;
    for (const auto& edge : node->next_edges()) todo.push_back(edge.function.get());
  }
  return false;
}
}  // namespace

TEST_CASE("MaxPool2d's lowered kernel takes the same maxima and indices as libtorch's max_pool2d", "[module_types]") {
  namespace N = torch::nn;
  const auto same = [](const at::Tensor& a, const at::Tensor& b) {
    return a.sizes() == b.sizes() && a.dtype() == b.dtype() && a.allclose(b, 0, 0, /*equal_nan=*/true);
  };
  const auto check = [&](N::MaxPool2d pool, const at::Tensor& per_set, const char* backward) {
    INFO(pool->options.kernel_size() << " stride " << pool->options.stride() << " padding " << pool->options.padding()
                                     << " dilation " << pool->options.dilation() << " ceil " << pool->options.ceil_mode()
                                     << " on " << per_set.sizes() << " " << per_set.dtype());
    auto members = three(pool);
    const at::Tensor x = per_set.clone().requires_grad_();
    const at::Tensor y = tdn::functional_vmap(pool, from_modules(members), {}, tdn::kwargs(tdn::kw<"input">(x)),
                                              tdn::in_dims(tdn::in_dim_of<"input">(0)));
    CHECK(graph_has(y, backward));
    // The gradient of the input, taken with create_graph, and that gradient's own gradient to the upstream one.
    const at::Tensor upstream = at::randn(y.sizes(), y.options()).requires_grad_();
    const at::Tensor dx = torch::autograd::grad({y}, {x}, {upstream}, true, true)[0];
    const at::Tensor w = at::randn(dx.sizes(), dx.options());
    (dx * w).sum().backward();
    {
      at::NoGradGuard no_grad;
      CHECK(same(tdn::functional_vmap(pool, from_modules(members), {}, tdn::kwargs(tdn::kw<"input">(per_set)),
                                      tdn::in_dims(tdn::in_dim_of<"input">(0))),
                 y.detach()));
    }
    for (int i = 0; i < 3; ++i) {
      const at::Tensor xi = per_set[i].detach().requires_grad_();
      const at::Tensor yi = pool->forward(xi);
      const at::Tensor ui = upstream[i].detach().requires_grad_();
      const at::Tensor dxi = torch::autograd::grad({yi}, {xi}, {ui}, true, true)[0];
      (dxi * w[i]).sum().backward();
      CHECK(same(y[i].detach(), yi.detach()));
      CHECK(same(dx[i].detach(), dxi.detach()));
      CHECK(same(upstream.grad()[i], ui.grad()));
    }
  };
  const at::Tensor ties = at::randint(0, 3, {3, 2, 3, 7, 9}).to(at::kFloat);  // many equal maxima per window
  check(N::MaxPool2d(2), ties, "Gather");
  check(N::MaxPool2d(2), ties.select(1, 0), "Gather");  // unbatched [C, H, W] per set
  check(N::MaxPool2d(N::MaxPool2dOptions({3, 2}).stride({2, 1}).padding({1, 0}).dilation({1, 2}).ceil_mode(true)),
        ties, "Gather");
  check(N::MaxPool2d(N::MaxPool2dOptions(3).stride(2).padding(1).ceil_mode(true)), at::randn({3, 2, 2, 8, 8}), "Gather");
  check(N::MaxPool2d(N::MaxPool2dOptions(2).dilation(2)), at::randn({3, 1, 2, 9, 6}, at::kDouble), "Gather");
  at::Tensor nans = at::randn({3, 2, 2, 6, 6});
  nans.index_put_({0, 0, 0, 0, 0}, NAN);
  nans.index_put_({1, 1, 1, 2, 3}, NAN);
  nans.index_put_({1, 1, 1, 3, 3}, NAN);  // two NaNs in one window: the last one's index
  nans.index_put_({2, 0, 1, 4, 5}, -INFINITY);
  nans.index_put_({2, 1, 0, 0, 0}, INFINITY);
  check(N::MaxPool2d(2), nans, "Gather");
  // +-0.0 tie in a window (the first max: -0.0 where it comes first), and a window of -inf alone.
  at::Tensor zeros = at::full({3, 1, 2, 4, 4}, -1.0f);
  zeros.index_put_({0, 0, 0, 0, 0}, -0.0f);
  zeros.index_put_({0, 0, 0, 0, 1}, 0.0f);
  zeros.index_put_({1, 0, 1, 2, 2}, 0.0f);
  zeros.index_put_({1, 0, 1, 3, 3}, -0.0f);
  zeros.index({2, 0, 0, at::indexing::Slice(0, 2), at::indexing::Slice(0, 2)}).fill_(-INFINITY);
  check(N::MaxPool2d(2), zeros, "Gather");
  // Channels-last images (the lowered convolutions' output on libtorch 1.x): libtorch's own kernel.
  const at::Tensor channels_last = at::randn({3, 2, 4, 6, 6}).flatten(0, 1).contiguous(at::MemoryFormat::ChannelsLast);
  check(N::MaxPool2d(2), channels_last.unflatten(0, {3, 2}), "MaxPool2DWithIndices");
  // A dual tensor (forward-mode AD) keeps libtorch's max_pool2d, which carries its tangent.
  const std::uint64_t level = torch::autograd::ForwardADLevel::get_next_idx();
  const at::Tensor primal = at::randn({3, 2, 2, 6, 6}), tangent = at::randn({3, 2, 2, 6, 6});
  at::Tensor y_tangent;
  N::MaxPool2d pool(2);
  auto pools = three(pool);
  {
    at::NoGradGuard no_grad;
    const at::Tensor dual_out = tdn::functional_vmap(pool, from_modules(pools), {},
                                                     tdn::kwargs(tdn::kw<"input">(at::_make_dual(primal, tangent, level))),
                                                     tdn::in_dims(tdn::in_dim_of<"input">(0)));
    y_tangent = std::get<1>(at::_unpack_dual(dual_out, static_cast<std::int64_t>(level)));
  }
  torch::autograd::ForwardADLevel::release_idx(level);
  REQUIRE(y_tangent.defined());
  for (std::int64_t i = 0; i < 3; ++i) {
    const at::Tensor indices = std::get<1>(at::max_pool2d_with_indices(primal[i], {2, 2}));
    CHECK(y_tangent[i].equal(tangent[i].flatten(-2).gather(-1, indices.flatten(-2)).view_as(indices)));
  }
  // An input libtorch refuses is refused lowered too, with its message.
  N::MaxPool2d too_big(N::MaxPool2dOptions(5));
  auto members = three(too_big);
  CHECK_THROWS(tdn::functional_vmap(too_big, from_modules(members), tdn::args(at::randn({2, 3, 4, 4}))));
}

TEST_CASE("dropouts and RReLU in eval are their forwards; torch::nn::Functional goes through vmap", "[module_types]") {
  namespace N = torch::nn;
  const at::Tensor x = at::randn({2, 3, 4, 4});
  auto eval = [](auto m) {
    m->eval();
    return m;
  };
  check_type(eval(N::Dropout(0.5)), x);
  check_type(eval(N::Dropout2d(0.5)), x);
  check_type(eval(N::Dropout3d(0.5)), x);
  check_type(eval(N::AlphaDropout(0.5)), x);
  check_type(eval(N::FeatureAlphaDropout(0.5)), x);
  check_type(N::Functional(static_cast<at::Tensor (*)(const at::Tensor&)>(at::tanh)), x, false);
  const auto why = tdn::lowering_of(N::Functional(static_cast<at::Tensor (*)(const at::Tensor&)>(at::tanh)));
  CHECK_THAT(why.reason, Contains("FunctionalImpl has no batched form"));
}

TEST_CASE("modules that draw random numbers follow functional_vmap's randomness", "[module_types]") {
  namespace N = torch::nn;
  // 4 x 8 channels: two sets draw the same channel masks with chance 2^-32. Positive: RReLU's slopes show only on negatives.
  const at::Tensor x = at::randn({4, 8, 8, 8}).abs() + 0.5;
  auto check_randomness = [&](auto m, const at::Tensor& input) {
    INFO(c10::demangle(typeid(*m).name()));
    auto members = three(m);
    const auto params = from_modules(members);
    CHECK_THROWS_AS(tdn::functional_vmap(m, params, tdn::args(input)), value_error);
    CHECK_THROWS_WITH(tdn::functional_vmap(m, params, tdn::args(input)), Contains("randomness is \"error\""));
    for (bool mapped : {false, true}) {
      const at::Tensor per_set = at::stack({input, input, input});
      auto run = [&](randomness r) {
        return mapped ? tdn::functional_vmap(m, params, {}, tdn::kwargs(tdn::kw<"input">(per_set)),
                                             tdn::in_dims(tdn::in_dim_of<"input">(0)), {.randomness = r})
                      : tdn::functional_vmap(m, params, tdn::args(input), {}, {}, {.randomness = r});
      };
      const at::Tensor same = run(randomness::same), different = run(randomness::different);
      REQUIRE(same.sizes() == different.sizes());
      CHECK(same[0].equal(same[1]));
      CHECK(same[1].equal(same[2]));
      CHECK_FALSE(different[0].equal(different[1]));
      CHECK(same[0].sizes() == m->forward(input).sizes());
    }
  };
  check_randomness(N::Dropout(0.5), x);
  check_randomness(N::Dropout2d(0.5), x);
  check_randomness(N::Dropout2d(0.5), at::ones({32, 8, 8}));  // unbatched: a mask per channel (32: two sets alike by chance 2^-32)
  check_randomness(N::Dropout3d(0.5), x.unsqueeze(2));
  check_randomness(N::AlphaDropout(0.5), x);
  check_randomness(N::FeatureAlphaDropout(0.5), x);
  check_randomness(N::RReLU(), -x);
  check_randomness(N::FractionalMaxPool2d(N::FractionalMaxPool2dOptions(2).output_size(5)), at::randn({4, 3, 9, 9}));
  check_randomness(N::FractionalMaxPool2d(N::FractionalMaxPool2dOptions(2).output_ratio(0.5)), at::randn({16, 9, 9}));
  check_randomness(N::FractionalMaxPool3d(N::FractionalMaxPool3dOptions(2).output_size(4)), at::randn({2, 8, 9, 9, 9}));

  // A feature dropout's mask covers whole channels, shared or per set; alpha dropout keeps the mean near 0.
  N::Dropout2d channels(0.5);
  auto members = three(channels);
  const at::Tensor y = tdn::functional_vmap(channels, from_modules(members), tdn::args(at::ones({4, 3, 8, 8})), {}, {},
                                            {.randomness = randomness::same});
  const at::Tensor per_channel = y.amax({-2, -1}), per_channel_min = y.amin({-2, -1});
  CHECK(per_channel.equal(per_channel_min));
  N::AlphaDropout alpha(0.3);
  auto alphas = three(alpha);
  const at::Tensor z = tdn::functional_vmap(alpha, from_modules(alphas), tdn::args(at::randn({200, 200})), {}, {},
                                            {.randomness = randomness::same});
  CHECK(std::abs(z.mean().item<double>()) < 0.05);
  CHECK(std::abs(z.std().item<double>() - 1) < 0.05);

  // Given pooling regions (a buffer): no draw; each set pools with its own, as its module does.
  const at::Tensor input = at::randn({2, 3, 9, 9});
  auto fixed = [] {
    return N::FractionalMaxPool2d(N::FractionalMaxPool2dOptions(2).output_size(4)._random_samples(at::rand({2, 3, 2})));
  };
  std::vector<N::FractionalMaxPool2d> fixed_members{fixed(), fixed(), fixed()};
  STATIC_REQUIRE(std::is_same_v<tdn::schema_of<N::FractionalMaxPool2dImpl>, schema<leaf<"_random_samples">>>);
  const auto regions = from_modules(fixed_members);
  CHECK(functional_call(fixed_members[1], from_module(fixed_members[1]), input).equal(fixed_members[1]->forward(input)));
  CHECK(functional_call(fixed_members[0], from_module(fixed_members[1]), input).equal(fixed_members[1]->forward(input)));
  const at::Tensor pooled = tdn::functional_vmap(fixed_members[0], regions, tdn::args(input));
  const at::Tensor pooled_mapped = tdn::functional_vmap(fixed_members[0], regions, {},
                                                        tdn::kwargs(tdn::kw<"input">(at::stack({input, -input, input}))),
                                                        tdn::in_dims(tdn::in_dim_of<"input">(0)));
  for (int i = 0; i < 3; ++i) CHECK(pooled[i].equal(fixed_members[i]->forward(input)));
  CHECK(pooled_mapped[1].equal(fixed_members[1]->forward(-input)));
  N::FractionalMaxPool2d unbatched(N::FractionalMaxPool2dOptions(2).output_size(4)._random_samples(at::rand({1, 3, 2})));
  std::vector<N::FractionalMaxPool2d> unbatched_members{unbatched, unbatched};
  CHECK(tdn::functional_vmap(unbatched, from_modules(unbatched_members), tdn::args(input[0]))[1].equal(unbatched->forward(input[0])));
}

TEST_CASE("MaxUnpool, CosineSimilarity and PairwiseDistance: two inputs, each shared or per set", "[module_types]") {
  namespace N = torch::nn;
  N::MaxPool2d pool(N::MaxPool2dOptions(2));
  const at::Tensor image = at::randn({3, 2, 3, 6, 6});  // per set
  std::vector<at::Tensor> pooled, indices;
  for (int i = 0; i < 3; ++i) {
    auto [p, idx] = pool->forward_with_indices(image[i]);
    pooled.push_back(p);
    indices.push_back(idx);
  }
  N::MaxUnpool2d unpool(N::MaxUnpool2dOptions(2));
  auto unpools = three(unpool);
  const auto params = from_modules(unpools);
  const at::Tensor both = tdn::functional_vmap(
      unpool, params, {}, tdn::kwargs(tdn::kw<"input">(at::stack(pooled)), tdn::kw<"indices">(at::stack(indices))),
      tdn::in_dims(tdn::in_dim_of<"input">(0), tdn::in_dim_of<"indices">(0)));
  const at::Tensor shared_indices =
      tdn::functional_vmap(unpool, params, {}, tdn::kwargs(tdn::kw<"input">(at::stack(pooled)), tdn::kw<"indices">(indices[0])),
                           tdn::in_dims(tdn::in_dim_of<"input">(0)));
  for (int i = 0; i < 3; ++i) {
    CHECK(both[i].equal(unpool->forward(pooled[i], indices[i])));
    CHECK(shared_indices[i].equal(unpool->forward(pooled[i], indices[0])));
  }
  CHECK(functional_call(unpool, from_module(unpool), pooled[0], indices[0]).equal(unpool->forward(pooled[0], indices[0])));

  for (auto dims : {std::vector<std::int64_t>{5, 4}, std::vector<std::int64_t>{4}}) {
    const at::Tensor a = at::randn(dims), b_per_set = at::randn({3, 4});
    N::CosineSimilarity cosine(N::CosineSimilarityOptions().dim(-1));
    N::PairwiseDistance distance(N::PairwiseDistanceOptions().p(3).keepdim(true));
    auto cosines = three(cosine);
    auto distances = three(distance);
    const auto inputs = tdn::kwargs(tdn::kw<"input1">(a), tdn::kw<"input2">(b_per_set));
    const auto dims_ = tdn::in_dims(tdn::in_dim_of<"input2">(0));
    const at::Tensor c = tdn::functional_vmap(cosine, from_modules(cosines), {}, inputs, dims_);
    const at::Tensor d = tdn::functional_vmap(distance, from_modules(distances), {}, inputs, dims_);
    for (int i = 0; i < 3; ++i) {
      CHECK(c[i].allclose(cosine->forward(a, b_per_set[i]), 1e-5, 1e-6));
      CHECK(d[i].allclose(distance->forward(a, b_per_set[i]), 1e-5, 1e-6));
    }
  }
  N::CosineSimilarity by_rows(N::CosineSimilarityOptions().dim(0));
  const at::Tensor u = at::randn({3, 4, 5}), v = at::randn({4, 5});
  auto rows = three(by_rows);
  const at::Tensor r = tdn::functional_vmap(by_rows, from_modules(rows), {}, tdn::kwargs(tdn::kw<"input1">(u), tdn::kw<"input2">(v)),
                                            tdn::in_dims(tdn::in_dim_of<"input1">(0)));
  for (int i = 0; i < 3; ++i) CHECK(r[i].allclose(by_rows->forward(u[i], v), 1e-5, 1e-6));
}

TEST_CASE("losses: the functional form uses the TensorDict's class weights", "[module_types]") {
  namespace N = torch::nn;
  const at::Tensor logits = at::randn({6, 4}), classes = at::randint(0, 4, {6}), weight = at::rand({4}) + 0.5;
  const at::Tensor probs = at::rand({6, 4}) * 0.9 + 0.05, labels = at::randint(0, 2, {6, 4}).to(at::kFloat);
  N::CrossEntropyLoss ce(N::CrossEntropyLossOptions().weight(weight).label_smoothing(0.1));
  N::CrossEntropyLoss plain_ce;
  STATIC_REQUIRE(std::is_same_v<tdn::schema_of<N::CrossEntropyLossImpl>, schema<leaf<"weight">>>);
  CHECK(functional_call(ce, from_module(ce), logits, classes).allclose(ce->forward(logits, classes)));
  CHECK(functional_call(plain_ce, from_module(plain_ce), logits, classes).allclose(plain_ce->forward(logits, classes)));
  // Another weight in the TensorDict: the loss of a module made with it.
  const at::Tensor other = at::rand({4}) + 0.5;
  auto swapped = from_module(ce).apply([&](const at::Tensor&) { return other; });
  N::CrossEntropyLoss with_other(N::CrossEntropyLossOptions().weight(other).label_smoothing(0.1));
  CHECK(functional_call(ce, swapped, logits, classes).allclose(with_other->forward(logits, classes)));
  {
    auto guard = to_module(swapped, ce);
    CHECK(ce->forward(logits, classes).allclose(with_other->forward(logits, classes)));
  }
  N::NLLLoss nll(N::NLLLossOptions().weight(weight));
  CHECK(functional_call(nll, from_module(nll), logits.log_softmax(1), classes).allclose(nll->forward(logits.log_softmax(1), classes)));
  N::BCELoss bce(N::BCELossOptions().weight(weight));
  const auto bce_params = from_module(bce);
  CHECK(bce_params.get<"weight">().is_same(bce->options.weight()));
  CHECK(functional_call(bce, bce_params, probs, labels).allclose(bce->forward(probs, labels)));
  N::BCELoss with_other_bce(N::BCELossOptions().weight(other));
  {
    auto guard = to_module(bce_params.apply([&](const at::Tensor&) { return other; }), bce);
    CHECK(bce->forward(probs, labels).allclose(with_other_bce->forward(probs, labels)));
    CHECK(bce->named_buffers()["weight"].is_same(bce->options.weight()));
  }
  CHECK(bce->options.weight().is_same(bce_params.get<"weight">()));
  N::BCEWithLogitsLoss bcel(N::BCEWithLogitsLossOptions().weight(weight).pos_weight(weight * 2));
  CHECK(functional_call(bcel, from_module(bcel), logits, labels).allclose(bcel->forward(logits, labels)));
  N::MultiMarginLoss margin(N::MultiMarginLossOptions().weight(weight).p(2));
  CHECK(functional_call(margin, from_module(margin), logits, classes).allclose(margin->forward(logits, classes)));
  N::MultiLabelSoftMarginLoss soft(N::MultiLabelSoftMarginLossOptions().weight(weight));
  CHECK(functional_call(soft, from_module(soft), logits, labels).allclose(soft->forward(logits, labels)));

  // The losses without tensors: their forward, and vmap over a loss per set.
  const at::Tensor a = at::randn({6, 4}).requires_grad_(), b = at::randn({6, 4});
  auto same = [](const at::Tensor& x, const at::Tensor& y) { return x.allclose(y, 1e-5, 1e-6); };
  N::L1Loss l1;
  N::MSELoss mse(N::MSELossOptions().reduction(torch::kSum));
  N::SmoothL1Loss smooth;
  N::HuberLoss huber(N::HuberLossOptions().delta(0.5));
  N::SoftMarginLoss soft_margin;
  N::KLDivLoss kl(N::KLDivLossOptions().reduction(torch::kBatchMean));
  N::PoissonNLLLoss poisson;
  N::HingeEmbeddingLoss hinge;
  N::MultiLabelMarginLoss multilabel_margin;
  CHECK(same(functional_call(l1, from_module(l1), a, b), l1->forward(a, b)));
  CHECK(same(functional_call(mse, from_module(mse), a, b), mse->forward(a, b)));
  CHECK(same(functional_call(smooth, from_module(smooth), a, b), smooth->forward(a, b)));
  CHECK(same(functional_call(huber, from_module(huber), a, b), huber->forward(a, b)));
  CHECK(same(functional_call(soft_margin, from_module(soft_margin), a, b.sign()), soft_margin->forward(a, b.sign())));
  CHECK(same(functional_call(kl, from_module(kl), a.log_softmax(1), b.softmax(1)), kl->forward(a.log_softmax(1), b.softmax(1))));
  CHECK(same(functional_call(poisson, from_module(poisson), a, b.abs()), poisson->forward(a, b.abs())));
  CHECK(same(functional_call(hinge, from_module(hinge), a, b.sign()), hinge->forward(a, b.sign())));
  const at::Tensor targets = at::randint(-1, 4, {6, 4});
  CHECK(same(functional_call(multilabel_margin, from_module(multilabel_margin), a, targets), multilabel_margin->forward(a, targets)));
  N::CosineEmbeddingLoss cosine;
  N::MarginRankingLoss ranking;
  N::TripletMarginLoss triplet;
  N::TripletMarginWithDistanceLoss triplet_distance;
  const at::Tensor sign = at::randint(0, 2, {6}).to(at::kFloat) * 2 - 1;
  CHECK(same(functional_call(cosine, from_module(cosine), a, b, sign), cosine->forward(a, b, sign)));
  CHECK(same(functional_call(ranking, from_module(ranking), a.select(1, 0), b.select(1, 0), sign),
             ranking->forward(a.select(1, 0), b.select(1, 0), sign)));
  CHECK(same(functional_call(triplet, from_module(triplet), a, b, -b), triplet->forward(a, b, -b)));
  CHECK(same(functional_call(triplet_distance, from_module(triplet_distance), a, b, -b), triplet_distance->forward(a, b, -b)));
  N::CTCLoss ctc;
  const at::Tensor log_probs = at::randn({10, 2, 5}).log_softmax(2), ctc_targets = at::randint(1, 5, {2, 4});
  const at::Tensor input_lengths = at::full({2}, 10, at::kLong), target_lengths = at::full({2}, 4, at::kLong);
  CHECK(same(functional_call(ctc, from_module(ctc), log_probs, ctc_targets, input_lengths, target_lengths),
             ctc->forward(log_probs, ctc_targets, input_lengths, target_lengths)));

  // A loss per set through vmap: each set's loss of its own input.
  auto losses = three(mse);
  const at::Tensor per_set = at::randn({3, 6, 4});
  const at::Tensor y = tdn::functional_vmap(mse, from_modules(losses), {}, tdn::kwargs(tdn::kw<"input">(per_set), tdn::kw<"target">(b)),
                                            tdn::in_dims(tdn::in_dim_of<"input">(0)));
  REQUIRE(y.sizes() == c10::IntArrayRef({3}));
  for (int i = 0; i < 3; ++i) CHECK(same(y[i], mse->forward(per_set[i], b)));
}

TEST_CASE("AdaptiveLogSoftmaxWithLoss: run-time layout, functional form equals its forward with gradients", "[module_types]") {
  namespace N = torch::nn;
  N::AdaptiveLogSoftmaxWithLoss als(N::AdaptiveLogSoftmaxWithLossOptions(16, 10, {4, 8}).div_value(2).head_bias(true));
  const AnyTensorDict params = from_module(als);
  CHECK(params.contains("head", "weight"));
  CHECK(params.contains("head", "bias"));
  CHECK(params.contains("tail", "1", "1", "weight"));
  const at::Tensor input = at::randn({12, 16}), target = at::randint(0, 10, {12});
  const auto own = als->forward(input, target);
  const auto call = functional_call(als, params, input, target);
  CHECK(call.output.allclose(own.output, 1e-5, 1e-6));
  CHECK(std::abs(call.loss - own.loss) < 1e-5);
  const auto one = functional_call(als, params, input[0], target[0]);  // unbatched
  CHECK(one.output.allclose(own.output[0], 1e-5, 1e-6));
  // With other tensors, as the module with those swapped in; gradients reach them.
  const AnyTensorDict other = params.apply([](const at::Tensor& t) { return (t * 1.5).detach().requires_grad_(); });
  const auto moved = functional_call(als, other, input, target);
  {
    auto guard = to_module(other, als);
    CHECK(moved.output.allclose(als->forward(input, target).output, 1e-5, 1e-6));
  }
  moved.output.sum().backward();
  CHECK(other.get("head", "weight").grad().defined());
  CHECK(other.get("tail", "0", "0", "weight").grad().defined());
  CHECK_THROWS_WITH(functional_call(als, params, input, at::full({12}, 10, at::kLong)), Contains("target values should be in [0, 9]"));
}
