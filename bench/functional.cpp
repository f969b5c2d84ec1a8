// Costs of the functional calls, measured in one run: to_module enter+exit on
// a 3-layer MLP, a 50-layer one nested in blocks and a flat 50-layer one
// (Linear(32, 32) and ReLU, typed and as a torch::nn::Sequential),
// from_module and flatten_keys on them, from_modules of 16 MLPs, and
// functional_call against calling the module directly. Absolute times on a
// shared machine are noise; the ratio is what to read.
#include <chrono>
#include <cstdio>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ops/randn.h>
#include <torch/version.h>
#include <tensordict/tensordict.hpp>

namespace td = tensordict;
using torch::nn::Linear;
using torch::nn::ReLU;

namespace {
template <class T>
inline void keep(const T& value) {
  asm volatile("" : : "r,m"(value) : "memory");
}

template <class F>
double ns_per_call(F&& f, long calls) {
  for (long i = 0; i < calls / 10; ++i) f();  // warm up
  auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < calls; ++i) f();
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / calls;
}

using mlp3 = td::nn::Sequential<Linear, ReLU, Linear, ReLU, Linear>;
using block = td::nn::Sequential<Linear, Linear, Linear, Linear, Linear>;
using mlp50 = td::nn::Sequential<block, block, block, block, block, block, block, block, block, block>;

block make_block() { return block(Linear(8, 8), Linear(8, 8), Linear(8, 8), Linear(8, 8), Linear(8, 8)); }

// 50 x (Linear(32, 32), ReLU) as one flat Sequential of 100 children.
template <std::size_t I>
using layer_at = std::conditional_t<I % 2 == 0, Linear, ReLU>;
template <std::size_t... I>
auto make_flat(std::index_sequence<I...>) {
  auto make = [](auto index) {
    if constexpr (decltype(index)::value % 2 == 0)
      return Linear(32, 32);
    else
      return ReLU();
  };
  return td::nn::Sequential<layer_at<I>...>(make(std::integral_constant<std::size_t, I>{})...);
}
using flat50 = decltype(make_flat(std::make_index_sequence<100>{}));
}  // namespace

int main() {
  std::printf("libtorch %s, compiler %s\n", TORCH_VERSION, __VERSION__);
  at::set_num_threads(1);
  mlp3 small(Linear(8, 32), ReLU(), Linear(32, 32), ReLU(), Linear(32, 4));
  mlp50 large(make_block(), make_block(), make_block(), make_block(), make_block(), make_block(), make_block(),
              make_block(), make_block(), make_block());
  // The module's own tensors (which require grad), so that every variant builds the same autograd graph.
  auto small_params = td::from_module(small);
  auto large_params = td::from_module(large).detach().clone();
  auto x = at::randn({4, 8});

  const double swap3 = ns_per_call([&] { auto swap = td::to_module(small_params, small); }, 200000);
  const double swap50 = ns_per_call([&] { auto swap = td::to_module(large_params, large); }, 20000);
  const double from3 = ns_per_call([&] { keep(td::from_module(small)); }, 20000);
  const double flat3 = ns_per_call([&] { keep(small_params.flatten_keys<".">()); }, 200000);
  const double direct = ns_per_call([&] { keep(small->forward(x)); }, 50000);
  const double functional = ns_per_call([&] { keep(td::functional_call(small, small_params, x)); }, 50000);
  const double swapped = ns_per_call(
      [&] {
        auto swap = td::to_module(small_params, small);
        keep(small->forward(x));
      },
      50000);

  flat50 flat = make_flat(std::make_index_sequence<100>{});
  const auto flat_params = td::from_module(flat).detach().clone();
  torch::nn::Sequential dynamic;
  for (int i = 0; i < 50; ++i) {
    dynamic->push_back(Linear(32, 32));
    dynamic->push_back(ReLU());
  }
  const auto dynamic_params = td::from_module(dynamic).detach().clone();
  const double swap_flat = ns_per_call([&] { auto swap = td::to_module(flat_params, flat); }, 20000);
  const double from_flat = ns_per_call([&] { keep(td::from_module(flat)); }, 20000);
  const double keys_flat = ns_per_call([&] { keep(flat_params.flatten_keys<".">()); }, 20000);
  const double swap_dynamic = ns_per_call([&] { auto swap = td::to_module(dynamic_params, dynamic); }, 5000);
  const double from_dynamic = ns_per_call([&] { keep(td::from_module(dynamic)); }, 5000);
  const double keys_dynamic = ns_per_call([&] { keep(dynamic_params.flatten_keys(".")); }, 5000);
  std::vector<mlp3> members;
  for (int i = 0; i < 16; ++i) members.emplace_back(Linear(8, 32), ReLU(), Linear(32, 32), ReLU(), Linear(32, 4));
  const double stack16 = ns_per_call([&] { keep(td::from_modules(members)); }, 5000);

  std::printf("to_module enter+exit, 3-layer MLP (6 leaves):   %8.0f ns\n", swap3);
  std::printf("to_module enter+exit, 50-layer MLP (100 leaves): %8.0f ns\n", swap50);
  std::printf("from_module, 3-layer MLP:                        %8.0f ns\n", from3);
  std::printf("flatten_keys, 3-layer MLP:                       %8.0f ns\n", flat3);
  std::printf("flat 50 x (Linear(32, 32), ReLU), typed:         to_module %8.0f ns, from_module %8.0f ns, flatten_keys %8.0f ns\n",
              swap_flat, from_flat, keys_flat);
  std::printf("same, torch::nn::Sequential:                     to_module %8.0f ns, from_module %8.0f ns, flatten_keys %8.0f ns\n",
              swap_dynamic, from_dynamic, keys_dynamic);
  std::printf("from_modules of 16 3-layer MLPs:                 %8.0f ns\n", stack16);
  std::printf("forward, 3-layer MLP, batch 4:                   %8.0f ns\n", direct);
  std::printf("functional_call, same:                           %8.0f ns\n", functional);
  std::printf("to_module + forward, same:                       %8.0f ns\n", swapped);
  std::printf("functional functional_call/forward=%.2f swap+forward/forward=%.2f\n", functional / direct, swapped / direct);
  return 0;
}
