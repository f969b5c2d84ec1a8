// Ensembles of MLPs (Linear-ReLU-Linear-ReLU-Linear): a per-member loop, the
// generic vmap path, the lowered functional_vmap and hand-written baddbmm
// code, for a forward and for a training step (forward, backward, SGD), all
// on the same stacked parameters. One BLAS thread. Prints a table and, per
// config and mode, one line of ratios measured in this run.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/randn.h>
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
}  // namespace

int main(int argc, char** argv) {
  // OpenBLAS reads its thread count when it loads: run again with it set.
  if (const char* n = std::getenv("OPENBLAS_NUM_THREADS"); !n || std::strcmp(n, "1") != 0) {
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
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
      // Rounds that interleave the variants, so that drift of the machine hits them alike; the median round counts.
      std::vector<std::function<void()>> variants{step(loop), step(generic), step(lowered), step(hand)};
      std::vector<std::vector<double>> rounds(variants.size());
      for (int round = 0; round < 7; ++round)
        for (std::size_t v = 0; v < variants.size(); ++v) rounds[v].push_back(seconds_per_call(variants[v], budget / 7));
      auto median = [](std::vector<double> t) {
        std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
        return t[t.size() / 2];
      };
      const double t_loop = median(rounds[0]), t_vmap = median(rounds[1]), t_low = median(rounds[2]),
                   t_hand = median(rounds[3]);
      std::printf("%-26s %-5s %10.1f %10.1f %10.1f %10.1f\n", c.name, mode, t_loop * 1e6, t_vmap * 1e6, t_low * 1e6,
                  t_hand * 1e6);
      char line[256];
      std::snprintf(line, sizeof line, "ensemble %s %s lowered/handwritten=%.2f loop/lowered=%.2f vmap/lowered=%.2f", c.name,
                    mode, t_low / t_hand, t_loop / t_low, t_vmap / t_low);
      lines.emplace_back(line);
    }
  }
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  return 0;
}
