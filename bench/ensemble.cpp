// Ensembles of MLPs (Linear-ReLU-Linear-ReLU-Linear): a per-member loop, the
// generic vmap path, the lowered functional_vmap and hand-written baddbmm
// code, for a forward and for a training step (forward, backward, SGD), all
// on the same stacked parameters. Then 8 LSTMs and 8 two-layer transformer
// encoders: the loop is the members' own modules there. One BLAS thread.
// Prints a table and, per config and mode, one line of ratios measured in
// this run.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/version.h>
#include <tensordict/tensordict.hpp>

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

// Which BLAS library this process loaded (libblas.so.3 is an alternative).
std::string blas_in_use() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("blas") != std::string::npos) return line.substr(line.find('/'));
  return "unknown";
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
// Times the variants {loop, vmap, lowered, handwritten} (an empty one is not
// run) in rounds that interleave them, so that drift of the machine hits them
// alike; the median round counts. Prints the row, returns the ratios line.
std::string time_variants(const char* name, const char* mode, std::vector<std::function<void()>> variants, double budget) {
  std::vector<std::vector<double>> rounds(variants.size());
  for (int round = 0; round < 7; ++round)
    for (std::size_t v = 0; v < variants.size(); ++v)
      if (variants[v]) rounds[v].push_back(seconds_per_call(variants[v], budget / 7));
  auto median = [](std::vector<double> t) {
    if (t.empty()) return std::nan("");
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    return t[t.size() / 2];
  };
  const double t_loop = median(rounds[0]), t_vmap = median(rounds[1]), t_low = median(rounds[2]), t_hand = median(rounds[3]);
  std::printf("%-26s %-5s %10.1f %10.1f %10.1f %10.1f\n", name, mode, t_loop * 1e6, t_vmap * 1e6, t_low * 1e6, t_hand * 1e6);
  auto ratio = [](double r) { return std::isnan(r) ? std::string("n/a") : std::to_string(r).substr(0, std::to_string(r).find('.') + 3); };
  return std::string("ensemble ") + name + " " + mode + " lowered/handwritten=" + ratio(t_low / t_hand) +
         " loop/lowered=" + ratio(t_loop / t_low) + " vmap/lowered=" + ratio(t_vmap / t_low);
}

// 8 LSTMs (in 32, hidden 128, 2 layers), sequence 50, batch 32. The loop is
// the members' own forwards (and, in training, their own backward and SGD);
// vmap is not run: libtorch's vmap has no batching rule for aten::lstm.
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

// Times a forward and a training step (MSE against target, SGD) of: the
// members' own modules (loop; their own backward and SGD), the lowered
// functional_vmap and a hand-written batched version (skipped when empty),
// the last two on the stacked tensors.
template <class Members, class Loop, class Lowered, class Hand>
void own_modules_ensemble(const char* name, Members& members, std::vector<at::Tensor> stacked, const at::Tensor& target,
                          Loop loop, Lowered lowered, Hand hand, double budget, std::vector<std::string>& lines) {
  {
    at::NoGradGuard no_grad;
    const at::Tensor reference = lowered();
    TORCH_CHECK(reference.allclose(loop(), 1e-4, 1e-5), "bench/ensemble: ", name, ": lowered and loop disagree");
    if constexpr (!std::is_same_v<Hand, std::nullptr_t>)
      TORCH_CHECK(reference.allclose(hand(), 1e-4, 1e-5), "bench/ensemble: ", name, ": lowered and handwritten disagree");
  }
  std::vector<at::Tensor> own;
  for (auto& m : members)
    for (auto& t : m->parameters()) own.push_back(t);
  for (const char* mode : {"fwd", "train"}) {
    const bool train = std::strcmp(mode, "train") == 0;
    auto step = [&](auto forward, std::vector<at::Tensor>& trained) -> std::function<void()> {
      return [&, forward, train] {
        if (!train) {
          at::NoGradGuard no_grad;
          forward();
          return;
        }
        (forward() - target).pow(2).mean().backward();
        at::NoGradGuard no_grad;
        for (auto& t : trained) {
          t.sub_(t.grad(), 1e-3);
          t.mutable_grad().zero_();
        }
      };
    };
    std::function<void()> hand_step;
    if constexpr (!std::is_same_v<Hand, std::nullptr_t>) hand_step = step(hand, stacked);
    lines.push_back(time_variants(name, mode, {step(loop, own), {}, step(lowered, stacked), hand_step}, budget));
  }
}

void lstm_ensemble(double budget, std::vector<std::string>& lines) {
  std::vector<torch::nn::LSTM> members;
  for (int i = 0; i < 8; ++i) members.emplace_back(torch::nn::LSTMOptions(32, 128).num_layers(2));
  const td::AnyTensorDict params = td::from_modules(members);
  const at::Tensor x = at::randn({50, 32, 32});
  auto loop = [&] {
    std::vector<at::Tensor> outs;
    for (auto& m : members) outs.push_back(std::get<0>(m->forward(x)));
    return at::stack(outs);
  };
  auto lowered = [&] { return std::get<0>(tdn::functional_vmap(members[0], params, tdn::args(x))); };
  auto hand = [&] { return handwritten_lstm(params, x); };
  own_modules_ensemble("lstm:8x(32-128x2)/50x32", members, params.values(), at::randn({8, 50, 32, 128}), loop, lowered,
                       hand, budget, lines);
}

// 8 TransformerEncoders of 2 layers (d_model 64, 4 heads, feed-forward 2048,
// no dropout), sequence 32, batch 16: a run-time layout (their layers are a
// ModuleList), so their params are an AnyTensorDict. Not vmapped, nor hand-written.
void transformer_ensemble(double budget, std::vector<std::string>& lines) {
  using torch::nn::TransformerEncoder;
  auto layer = torch::nn::TransformerEncoderLayer(torch::nn::TransformerEncoderLayerOptions(64, 4).dropout(0.0));
  std::vector<TransformerEncoder> members;
  for (int i = 0; i < 8; ++i) members.emplace_back(torch::nn::TransformerEncoderOptions(layer, 2));
  const td::AnyTensorDict params = td::from_modules(members);
  const at::Tensor x = at::randn({32, 16, 64});
  auto loop = [&] {
    std::vector<at::Tensor> outs;
    for (auto& m : members) outs.push_back(m->forward(x));
    return at::stack(outs);
  };
  auto lowered = [&] { return tdn::functional_vmap(members[0], params, tdn::args(x)); };
  own_modules_ensemble("transformer:8x(64,4h,2l)/32x16", members, params.values(), at::randn({8, 32, 16, 64}), loop,
                       lowered, nullptr, budget, lines);
}
}  // namespace

int main(int argc, char** argv) {
  // OpenBLAS reads its thread count when it loads, glibc its malloc settings:
  // run again with them set. glibc gives blocks over 32 MiB (a stacked
  // [8, 512, 2048] activation) back to the OS on free, and here the page
  // faults of taking them again cost more than the GEMM that fills them
  // (measured: a bmm of that size 110 ms, 12 ms with the memory kept), so the
  // bench keeps freed memory, as a long-running training process would.
  if (const char* n = std::getenv("OPENBLAS_NUM_THREADS"); !n || std::strcmp(n, "1") != 0) {
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296", 1);
    execv("/proc/self/exe", argv);
  }
  (void)argc;
  at::set_num_threads(1);
  const double budget = argc > 1 ? std::atof(argv[1]) : 2.0;  // seconds per variant, config and mode
  std::printf("libtorch %s, compiler %s\n", TORCH_VERSION, __VERSION__);
  std::printf("BLAS: %s, 1 thread\n", blas_in_use().c_str());

  const config configs[] = {
      {"a:16x(8-32-32-4)/32", 16, 8, 32, 4, 32},
      {"b:8x(64-256-256-16)/256", 8, 64, 256, 16, 256},
      {"c:128x(16-64-64-4)/64", 128, 16, 64, 4, 64},
  };
  std::printf("%-26s %-5s %10s %10s %10s %10s  (us per call)\n", "config", "mode", "loop", "vmap", "lowered", "handwritten");
  std::vector<std::string> lines;
  lstm_ensemble(budget, lines);
  transformer_ensemble(budget, lines);
  for (const auto& c : configs) {
    std::vector<mlp> members;
    for (int i = 0; i < c.members; ++i)
      members.emplace_back(Linear(c.in, c.hidden), ReLU(), Linear(c.hidden, c.hidden), ReLU(), Linear(c.hidden, c.out));
    params_t params = td::from_modules(members);
    mlp& shape = members[0];
    at::Tensor x = at::randn({c.batch, c.in});
    at::Tensor target = at::randn({c.members, c.batch, c.out});

    auto loop = [&](const params_t& p) {
      std::vector<at::Tensor> outs;
      for (int i = 0; i < c.members; ++i) outs.push_back(td::functional_call(shape, p[i], x));
      return at::stack(outs);
    };
    auto generic = [&](const params_t& p) {
      return td::vmap([&](const params_t& one, const at::Tensor& in) { return td::functional_call(shape, one, in); },
                      {0, std::nullopt})(p, x);
    };
    auto lowered = [&](const params_t& p) { return tdn::functional_vmap(shape, p, tdn::args(x)); };
    auto hand = [&](const params_t& p) { return handwritten(p, x); };

    // The four agree before anything is timed.
    auto reference = hand(params);
    TORCH_CHECK(loop(params).allclose(reference, 1e-4, 1e-5) && generic(params).allclose(reference, 1e-4, 1e-5) &&
                    lowered(params).allclose(reference, 1e-4, 1e-5),
                "bench/ensemble: the variants disagree");

    for (const char* mode : {"fwd", "train"}) {
      const bool train = std::strcmp(mode, "train") == 0;
      auto step = [&](auto&& forward) {
        return [&, forward] {
          if (!train) {
            at::NoGradGuard no_grad;
            forward(params);
            return;
          }
          at::Tensor loss = (forward(params) - target).pow(2).mean();
          loss.backward();
          at::NoGradGuard no_grad;
          params.apply_([](at::Tensor& t) {
            t.sub_(t.grad(), 1e-3);
            t.mutable_grad().zero_();
          });
        };
      };
      lines.push_back(time_variants(c.name, mode, {step(loop), step(generic), step(lowered), step(hand)}, budget));
    }
  }
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  return 0;
}
