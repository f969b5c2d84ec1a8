// Ensembles of MLPs (Linear-ReLU-Linear-ReLU-Linear), 8 small CNNs, 8 LSTMs
// and 8 two-layer transformer encoders: the members' own modules in a loop (their
// own backward and SGD in training), functional_call on slices of the stacked
// params, the generic vmap path, the lowered functional_vmap and hand-written
// batched code, for a forward and a training step (forward, backward, SGD),
// at 1 and 2 intra-op threads (one BLAS thread each). Prints a table and, per
// config, mode and threads, one line of ratios measured in this run, with the
// lowered path's GFLOP/s beside at::mm 512x512's on one core and on all, and
// the ATen ops one lowered call dispatches (forward; training step: forward,
// backward and SGD) with the microseconds per op that its time makes.
//   build/bench/bench_ensemble [seconds per variant] [most threads, default 2]
// SETS_PER_TASK=n in the environment sets functional_vmap's sets_per_task;
// ONLY=text runs the configs whose name contains text (ONLY=cnn).
// CPU_CACHE=0 runs every variant on libtorch's CPU allocator instead of the
// library's cache of freed blocks (tensordict::cache_cpu_allocations, the default here).
// AOTI_PACKAGES=dir (libtorch >= 2.6) adds, for the MLP configs' forward, an
// AOTInductor package of the vmapped functional_call run from C++: dir/a.pt2
// (b, c), written by `python3 bench/python/ensemble.py --aoti dir`.

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/version.h>
#include <tensordict/cpu_cache.hpp>
#include <tensordict/tensordict.hpp>

#include "blas_settings.hpp"

#if __has_include(<torch/csrc/inductor/aoti_package/model_package_loader.h>)
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#define BENCH_HAS_AOTI 1
#endif

namespace td = tensordict;
namespace tdn = tensordict::nn;
using torch::nn::Linear;
using torch::nn::ReLU;
using mlp = tdn::Sequential<Linear, ReLU, Linear, ReLU, Linear>;
using params_t = td::TensorDict<tdn::schema_of<mlp::Impl>>;

namespace {
struct config {
  const char* name;
  int members, in, hidden, out, batch;
};

// The lowered calls' options: SETS_PER_TASK=n sets sets_per_task.
tdn::functional_vmap_options vmap_options() {
  tdn::functional_vmap_options options;
  if (const char* n = std::getenv("SETS_PER_TASK")) options.sets_per_task = std::atoi(n);
  return options;
}

at::Tensor handwritten(const params_t& p, const at::Tensor& x) {
  const auto sets = p.batch_size()[0];
  auto layer = [&](const at::Tensor& w, const at::Tensor& b, const at::Tensor& h) {
    return at::baddbmm(b.unsqueeze(1), h, w.transpose(1, 2));
  };
  at::Tensor h = x.unsqueeze(0).expand({sets, x.size(0), x.size(1)});
  h = layer(p.get<"0", "weight">(), p.get<"0", "bias">(), h).relu();
  h = layer(p.get<"2", "weight">(), p.get<"2", "bias">(), h).relu();
  return layer(p.get<"4", "weight">(), p.get<"4", "bias">(), h);
}

template <class F>
double seconds_per_call(F&& f, double budget) {
  f();
  int calls = 0;
  auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < budget || calls < 3) {
    f();
    ++calls;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return elapsed / calls;
}

// at::mm of two 512x512 matrices: GFLOP/s of one core, and of every thread
// running its own at once (one BLAS thread each).
double mm_gflops(int threads, double budget) {
  std::vector<at::Tensor> a, b, c;
  for (int i = 0; i < threads; ++i) {
    a.push_back(at::randn({512, 512}));
    b.push_back(at::randn({512, 512}));
    c.push_back(at::empty({512, 512}));
  }
  const double t = seconds_per_call(
      [&] {
        at::parallel_for(0, threads, 1, [&](std::int64_t begin, std::int64_t end) {
          for (auto i = begin; i < end; ++i) at::mm_out(c[i], a[i], b[i]);
        });
      },
      budget);
  return threads * 2.0 * 512 * 512 * 512 / t / 1e9;
}

enum variant { loop, slices, vmapped, lowered, hand, aoti, n_variants };
const char* const variant_names[] = {"loop", "slices", "vmap", "lowered", "handwritten", "aoti"};

struct row {
  std::string config, mode;
  int threads;
  double flops;  // per call
  std::array<double, n_variants> seconds;
  std::int64_t lowered_ops = 0;  // per call
};

// The ATen ops one call of f dispatches on any thread, counting those an op calls
// itself as part of it (convolution's mkldnn_convolution); a backward's ops count.
std::atomic<std::int64_t> ops_seen{0};
thread_local int op_depth = 0;
std::int64_t ops_of(const std::function<void()>& f) {
  ops_seen = 0;
  const auto handle = at::addGlobalCallback(
      at::RecordFunctionCallback(
          [](const at::RecordFunction&) -> std::unique_ptr<at::ObserverContext> {
            if (op_depth++ == 0) ++ops_seen;
            return nullptr;
          },
          [](const at::RecordFunction&, at::ObserverContext*) { --op_depth; })
          .scopes({at::RecordScope::FUNCTION}));
  f();
  at::removeCallback(handle);
  return ops_seen;
}

// Times the variants (an empty one is not run) in rounds that interleave
// them, so that drift of the machine hits them alike; the median round counts.
std::array<double, n_variants> time_variants(std::array<std::function<void()>, n_variants> variants, double budget) {
  std::array<std::vector<double>, n_variants> rounds;
  for (int round = 0; round < 7; ++round)
    for (std::size_t v = 0; v < n_variants; ++v)
      if (variants[v]) rounds[v].push_back(seconds_per_call(variants[v], budget / 7));
  std::array<double, n_variants> median;
  for (std::size_t v = 0; v < n_variants; ++v) {
    auto& t = rounds[v];
    if (t.empty()) {
      median[v] = std::nan("");
      continue;
    }
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    median[v] = t[t.size() / 2];
  }
  return median;
}

// A forward (no grad) or a training step: MSE against target, backward, SGD on
// `trained` as torch.optim's does it (one foreach update, gradients then set
// to none as zero_grad() does since PyTorch 2.0, so the next backward's are
// taken, not added).
template <class Forward>
std::function<void()> step(Forward forward, bool train, const at::Tensor& target, std::vector<at::Tensor> trained) {
  return [forward, train, target, trained]() mutable {
    if (!train) {
      at::NoGradGuard no_grad;
      forward();
      return;
    }
    at::mse_loss(forward(), target).backward();
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> grads;
    grads.reserve(trained.size());
    for (auto& t : trained) grads.push_back(std::exchange(t.mutable_grad(), at::Tensor()));
    at::_foreach_add_(trained, grads, -1e-3);
  };
}

// The loop variant: each member's own forward, stacked.
at::Tensor own_forwards(auto& members, const at::Tensor& x) {
  std::vector<at::Tensor> outs;
  for (auto& m : members) outs.push_back(m->forward(x));
  return at::stack(outs);
}

std::vector<at::Tensor> parameters_of(auto& members) {
  std::vector<at::Tensor> out;
  for (auto& m : members)
    for (auto& t : m->parameters()) out.push_back(t);
  return out;
}

// Times a forward and a training step of each variant given (loop is the
// members' own modules; the others train the stacked tensors).
void time_config(const char* name, int threads, const std::array<double, 2>& flops, std::vector<at::Tensor> own,
                 std::vector<at::Tensor> stacked, const at::Tensor& target,
                 std::array<std::function<at::Tensor()>, n_variants> forwards, double budget, std::vector<row>& rows) {
  // With grad, as a training step calls them: without, libtorch 2.6's oneDNN LSTM runs an inference
  // kernel whose values differ from the training kernel's on CPUs with AVX-512 (README).
  const at::Tensor reference = forwards[lowered]().detach();
  for (std::size_t v = 0; v < n_variants; ++v) {
    if (!forwards[v]) continue;
    std::optional<at::NoGradGuard> no_grad;
    if (v == aoti) no_grad.emplace();  // a forward without autograd
    TORCH_CHECK(reference.allclose(forwards[v]().detach(), 1e-4, 1e-5), "bench/ensemble: ", name, ": lowered and ",
                variant_names[v], " disagree");
  }
  for (const bool train : {false, true}) {
    std::array<std::function<void()>, n_variants> steps;
    for (std::size_t v = 0; v < n_variants; ++v)
      if (forwards[v] && !(train && v == aoti))  // an AOTInductor package is a forward without autograd
        steps[v] = step(forwards[v], train, target, v == loop ? own : stacked);
    rows.push_back({name, train ? "train" : "fwd", threads, flops[train], time_variants(steps, budget), ops_of(steps[lowered])});
  }
}

// 8 LSTMs (in 32, hidden 128, 2 layers), sequence 50, batch 32; vmap is not
// run: libtorch's vmap has no batching rule for aten::lstm.
at::Tensor handwritten_lstm(const td::AnyTensorDict& p, const at::Tensor& x) {
  const auto sets = p.batch_size()[0];
  at::Tensor h_seq = x.unsqueeze(0).expand({sets, x.size(0), x.size(1), x.size(2)});  // [sets, T, B, in]
  for (const char* layer : {"0", "1"}) {
    auto get = [&](const char* name) { return p.get(std::string(name) + "_l" + layer); };
    const at::Tensor w_hh = get("weight_hh").transpose(1, 2).contiguous();
    const auto gates_x = at::baddbmm((get("bias_ih") + get("bias_hh")).unsqueeze(1),
                                     h_seq.reshape({sets, -1, h_seq.size(3)}), get("weight_ih").transpose(1, 2).contiguous())
                             .view({sets, x.size(0), x.size(1), -1})
                             .unbind(1);
    at::Tensor h = at::zeros({sets, x.size(1), w_hh.size(1)}), c = at::zeros_like(h);
    std::vector<at::Tensor> outs;
    for (std::int64_t t = 0; t < x.size(0); ++t) {
      auto g = at::baddbmm(gates_x[static_cast<std::size_t>(t)], h, w_hh).chunk(4, 2);
      c = g[1].sigmoid() * c + g[0].sigmoid() * g[2].tanh();
      h = g[3].sigmoid() * c.tanh();
      outs.push_back(h);
    }
    h_seq = at::stack(outs, 1);
  }
  return h_seq;
}

void lstm_ensemble(int threads, double budget, std::vector<row>& rows) {
  std::vector<torch::nn::LSTM> members;
  for (int i = 0; i < 8; ++i) members.emplace_back(torch::nn::LSTMOptions(32, 128).num_layers(2));
  const td::AnyTensorDict params = td::from_modules(members);
  const at::Tensor x = at::randn({50, 32, 32});
  // Per member and layer, per step: 2 * batch * 4 hidden * (in + hidden); training about 3x.
  const double fwd = 8.0 * 50 * 2 * 32 * 4 * 128 * ((32 + 128) + (128 + 128));
  time_config(
      "lstm:8x(32-128x2)/50x32", threads, {fwd, 3 * fwd}, parameters_of(members), params.values(),
      at::randn({8, 50, 32, 128}),
      {[&] {
         std::vector<at::Tensor> outs;
         for (auto& m : members) outs.push_back(std::get<0>(m->forward(x)));
         return at::stack(outs);
       },
       {}, {}, [&] { return std::get<0>(tdn::functional_vmap(members[0], params, tdn::args(x), {}, {}, vmap_options())); },
       [&] { return handwritten_lstm(params, x); }},
      budget, rows);
}

// 8 TransformerEncoders of 2 layers (d_model 64, 4 heads, feed-forward 2048,
// no dropout), sequence 32, batch 16: a run-time layout (their layers are a
// ModuleList), so their params are an AnyTensorDict. Not vmapped, nor hand-written.
void transformer_ensemble(int threads, double budget, std::vector<row>& rows) {
  using torch::nn::TransformerEncoder;
  auto layer = torch::nn::TransformerEncoderLayer(torch::nn::TransformerEncoderLayerOptions(64, 4).dropout(0.0));
  std::vector<TransformerEncoder> members;
  for (int i = 0; i < 8; ++i) members.emplace_back(torch::nn::TransformerEncoderOptions(layer, 2));
  const td::AnyTensorDict params = td::from_modules(members);
  const at::Tensor x = at::randn({32, 16, 64});
  // Per member and layer: projections 2*L*B*d*(3d + d), scores and mixing 2 * 2*B*L*L*d, feed-forward 2 * 2*L*B*d*2048.
  const double tokens = 32.0 * 16, d = 64;
  const double fwd = 8.0 * 2 * (2 * tokens * d * 4 * d + 4 * 16 * 32 * 32 * d + 4 * tokens * d * 2048);
  time_config("transformer:8x(64,4h,2l)/32x16", threads, {fwd, 3 * fwd}, parameters_of(members), params.values(),
              at::randn({8, 32, 16, 64}),
              {[&] { return own_forwards(members, x); },
               {}, {}, [&] { return tdn::functional_vmap(members[0], params, tdn::args(x), {}, {}, vmap_options()); }, {}},
              budget, rows);
}

// 8 CNNs, Conv2d(1, 16, 3)-ReLU-MaxPool2d(2)-Conv2d(16, 32, 3)-ReLU-AdaptiveAvgPool2d(1)-Flatten-Linear(32, 10),
// on 1x28x28 images, batch 64 (shared). Not vmapped, nor hand-written.
using cnn = tdn::Sequential<torch::nn::Conv2d, ReLU, torch::nn::MaxPool2d, torch::nn::Conv2d, ReLU, torch::nn::AdaptiveAvgPool2d,
                            torch::nn::Flatten, Linear>;
void cnn_ensemble(int threads, double budget, std::vector<row>& rows) {
  std::vector<cnn> members;
  for (int i = 0; i < 8; ++i)
    members.emplace_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3)), ReLU(), torch::nn::MaxPool2d(2),
                         torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3)), ReLU(), torch::nn::AdaptiveAvgPool2d(1),
                         torch::nn::Flatten(), Linear(32, 10));
  const auto params = td::from_modules(members);
  const at::Tensor x = at::randn({64, 1, 28, 28});
  // Per member: the convolutions' multiply-adds (26x26x16 outputs of 9 each, 11x11x32 of 144 each) and the Linear's;
  // training: their weights' gradients and the second convolution's and Linear's input gradients.
  const double conv1 = 2.0 * 26 * 26 * 16 * 9, conv2 = 2.0 * 11 * 11 * 32 * 144, fc = 2.0 * 32 * 10;
  const double fwd = 8.0 * 64 * (conv1 + conv2 + fc), train = 8.0 * 64 * (2 * conv1 + 3 * conv2 + 3 * fc);
  time_config("cnn:8x(conv16-pool-conv32-fc10)/64x28x28", threads, {fwd, train}, parameters_of(members), params.values(),
              at::randn({8, 64, 10}),
              {[&] { return own_forwards(members, x); },
               {}, {}, [&] { return tdn::functional_vmap(members[0], params, tdn::args(x), {}, {}, vmap_options()); }, {}},
              budget, rows);
}

// AOTI_PACKAGES' package for an MLP config (dir/a.pt2 for "a:..."), loaded once; an empty
// function where none is asked for or the libtorch has no AOTInductor loader.
std::function<at::Tensor()> aoti_forward([[maybe_unused]] const config& c, [[maybe_unused]] const params_t& p,
                                         [[maybe_unused]] const at::Tensor& x) {
  const char* dir = std::getenv("AOTI_PACKAGES");
  if (!dir) return {};
#ifdef BENCH_HAS_AOTI
  static std::map<std::string, std::shared_ptr<torch::inductor::AOTIModelPackageLoader>> loaded;
  const std::string path = std::string(dir) + "/" + std::string(c.name).substr(0, std::string(c.name).find(':')) + ".pt2";
  auto& loader = loaded[path];
  if (!loader) loader = std::make_shared<torch::inductor::AOTIModelPackageLoader>(path);
  // The package's inputs: the stacked params in named_parameters order, then the input.
  const std::vector<at::Tensor> inputs{p.get<"0", "weight">(), p.get<"0", "bias">(), p.get<"2", "weight">(),
                                       p.get<"2", "bias">(), p.get<"4", "weight">(), p.get<"4", "bias">(), x};
  return [loader, inputs]() mutable { return loader->run(inputs).at(0); };
#else
  std::fprintf(stderr, "AOTI_PACKAGES: libtorch %s has no AOTInductor package loader; not run\n", TORCH_VERSION);
  return {};
#endif
}

void mlp_ensemble(const config& c, int threads, double budget, std::vector<row>& rows) {
  std::vector<mlp> members;
  for (int i = 0; i < c.members; ++i)
    members.emplace_back(Linear(c.in, c.hidden), ReLU(), Linear(c.hidden, c.hidden), ReLU(), Linear(c.hidden, c.out));
  params_t params = td::from_modules(members);
  mlp& shape = members[0];
  const at::Tensor x = at::randn({c.batch, c.in});
  // Forward: 2 * batch * weights per member; training: the weights' and the inputs' gradients too, but not x's.
  const double weights = double(c.in) * c.hidden + double(c.hidden) * c.hidden + double(c.hidden) * c.out;
  const double fwd = 2.0 * c.batch * weights * c.members;
  const double train = 3 * fwd - 2.0 * c.batch * c.in * c.hidden * c.members;
  time_config(c.name, threads, {fwd, train}, parameters_of(members), params.values(),
              at::randn({c.members, c.batch, c.out}),
              {[&] { return own_forwards(members, x); },
               [&] {
                 std::vector<at::Tensor> outs;
                 for (int i = 0; i < c.members; ++i) outs.push_back(td::functional_call(shape, params[i], x));
                 return at::stack(outs);
               },
               [&] {
                 return td::vmap([&](const params_t& one, const at::Tensor& in) { return td::functional_call(shape, one, in); },
                                 {0, std::nullopt})(params, x);
               },
               [&] {
                 return tdn::functional_vmap(shape, params, tdn::args(x), {}, {}, vmap_options());
               },
               [&] { return handwritten(params, x); }, aoti_forward(c, params, x)},
              budget, rows);
}

std::string ratio(double r) {
  if (std::isnan(r)) return "n/a";
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", r);
  return text;
}
}  // namespace

int main(int argc, char** argv) {
  bench::run_again_with_bench_settings(argv);  // one BLAS thread, OpenBLAS kernels for this CPU, freed memory kept
  const double budget = argc > 1 ? std::atof(argv[1]) : 2.0;  // seconds per variant, config, mode and thread count
  const int most_threads = argc > 2 ? std::atoi(argv[2]) : 2;
  std::printf("libtorch %s, compiler %s\n", TORCH_VERSION, __VERSION__);
  std::printf("BLAS: %s, 1 BLAS thread per intra-op thread\n", bench::blas_in_use().c_str());
  const bool cpu_cache = !std::getenv("CPU_CACHE") || std::string(std::getenv("CPU_CACHE")) != "0";
  if (cpu_cache) tensordict::cache_cpu_allocations();  // every variant allocates through it
  std::printf("CPU allocator: %s\n", cpu_cache ? "tensordict::cache_cpu_allocations (CPU_CACHE=0: libtorch's)" : "libtorch's (CPU_CACHE=0)");

  // Kept first: OpenBLAS 0.3.29 (Debian 13) ran every later 256^3 sgemm at a third of its speed
  // (3.4 ms, not 1.0) in a process whose first GEMM was a small one.
  at::set_num_threads(1);
  const double peak_1t = mm_gflops(1, 1.0);
  at::set_num_threads(most_threads);
  const double peak_all = mm_gflops(most_threads, 1.0);
  std::printf("at::mm 512x512: %.1f GFLOP/s on 1 thread, %.1f on %d\n", peak_1t, peak_all, most_threads);

  const config configs[] = {
      {"a:16x(8-32-32-4)/32", 16, 8, 32, 4, 32},
      {"b:8x(64-256-256-16)/256", 8, 64, 256, 16, 256},
      {"c:128x(16-64-64-4)/64", 128, 16, 64, 4, 64},
  };
  std::vector<int> thread_counts{1};
  if (most_threads > 1) thread_counts.push_back(most_threads);
  std::vector<row> rows;
  const std::string only = std::getenv("ONLY") ? std::getenv("ONLY") : "";
  auto wanted = [&](const std::string& name) { return name.find(only) != std::string::npos; };
  for (int threads : thread_counts) {
    at::set_num_threads(threads);
    if (wanted("lstm")) lstm_ensemble(threads, budget, rows);
    if (wanted("transformer")) transformer_ensemble(threads, budget, rows);
    if (wanted("cnn")) cnn_ensemble(threads, budget, rows);
    for (const auto& c : configs)
      if (wanted(c.name)) mlp_ensemble(c, threads, budget, rows);
  }

  std::printf("%-30s %-5s %3s %10s %10s %10s %10s %10s %10s  (us per call)\n", "config", "mode", "thr", "loop", "slices",
              "vmap", "lowered", "handwritten", "aoti");
  std::map<std::pair<std::string, std::string>, double> lowered_1t;
  for (const auto& r : rows) {
    std::printf("%-30s %-5s %3d", r.config.c_str(), r.mode.c_str(), r.threads);
    for (double t : r.seconds) std::printf(" %10.1f", t * 1e6);
    std::printf("\n");
    if (r.threads == 1) lowered_1t[{r.config, r.mode}] = r.seconds[lowered];
  }
  std::map<std::pair<std::string, std::string>, double> lowered_most;
  for (const auto& r : rows)
    if (r.threads == most_threads) lowered_most[{r.config, r.mode}] = r.seconds[lowered];
  for (const auto& r : rows) {
    const auto& t = r.seconds;
    const auto key = std::make_pair(r.config, r.mode);
    std::printf(
        "ensemble %s %s threads=%d lowered/handwritten=%s loop/lowered=%s vmap/lowered=%s slices/lowered=%s "
        "aoti/lowered=%s speedup_%dt=%s gflops=%.1f peak_1t=%.1f peak_%dt=%.1f ops=%lld us_per_op=%.2f\n",
        r.config.c_str(), r.mode.c_str(), r.threads, ratio(t[lowered] / t[hand]).c_str(), ratio(t[loop] / t[lowered]).c_str(),
        ratio(t[vmapped] / t[lowered]).c_str(), ratio(t[slices] / t[lowered]).c_str(),
        ratio(t[aoti] / t[lowered]).c_str(), most_threads,
        ratio(lowered_1t[key] / lowered_most[key]).c_str(), r.flops / t[lowered] / 1e9, peak_1t, most_threads, peak_all,
        static_cast<long long>(r.lowered_ops), t[lowered] * 1e6 / static_cast<double>(std::max<std::int64_t>(1, r.lowered_ops)));
  }
  return 0;
}
