// Typed nested get<...>() against a std::unordered_map<std::string, at::Tensor>
// lookup of the same leaves, over a 50-layer MLP's parameter tree. Prints the
// ratio measured in this one run; absolute times on a shared machine are noise.
#include <chrono>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <utility>

#include <ATen/ops/zeros.h>
#include <tensordict/tensordict.hpp>

namespace td = tensordict;

namespace {
using linear = td::schema<td::leaf<"weight">, td::leaf<"bias">>;

template <class T>
inline void keep(const T& value) {
  asm volatile("" : : "r,m"(value) : "memory");
}

template <class F>
double seconds_per_call(F&& f, long calls) {
  auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < calls; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
}
}  // namespace

// 50 layers "0".."49", each {weight, bias}: 100 leaves. The benchmark reads 8 of them, spread out.
#define LAYER(n) td::field<#n, linear>
using mlp50 = td::schema<LAYER(0), LAYER(1), LAYER(2), LAYER(3), LAYER(4), LAYER(5), LAYER(6), LAYER(7), LAYER(8), LAYER(9),
                         LAYER(10), LAYER(11), LAYER(12), LAYER(13), LAYER(14), LAYER(15), LAYER(16), LAYER(17), LAYER(18),
                         LAYER(19), LAYER(20), LAYER(21), LAYER(22), LAYER(23), LAYER(24), LAYER(25), LAYER(26), LAYER(27),
                         LAYER(28), LAYER(29), LAYER(30), LAYER(31), LAYER(32), LAYER(33), LAYER(34), LAYER(35), LAYER(36),
                         LAYER(37), LAYER(38), LAYER(39), LAYER(40), LAYER(41), LAYER(42), LAYER(43), LAYER(44), LAYER(45),
                         LAYER(46), LAYER(47), LAYER(48), LAYER(49)>;
#undef LAYER

int main() {
  // The same tensors in both containers; the map is keyed by state-dict names.
  std::array<at::Tensor, mlp50::leaf_count> leaves;
  std::unordered_map<std::string, at::Tensor> flat;
  for (std::size_t i = 0; i < mlp50::leaf_count; ++i) {
    leaves[i] = at::zeros({2});
    flat.emplace(td::leaf_path<mlp50>(i).join("."), leaves[i]);
  }
  td::TensorDict<mlp50> params(leaves);

  const std::string keys[8] = {"0.weight", "7.bias", "13.weight", "21.bias", "28.weight", "35.bias", "42.weight", "49.bias"};
  auto typed = [&] {
    keep(params.get<"0", "weight">());
    keep(params.get<"7", "bias">());
    keep(params.get<"13", "weight">());
    keep(params.get<"21", "bias">());
    keep(params.get<"28", "weight">());
    keep(params.get<"35", "bias">());
    keep(params.get<"42", "weight">());
    keep(params.get<"49", "bias">());
  };
  auto mapped = [&] {
    for (const auto& k : keys) keep(flat.find(k)->second);
  };
  const long calls = 2'000'000;
  seconds_per_call(typed, calls / 10);  // warm up
  seconds_per_call(mapped, calls / 10);
  const double t_typed = seconds_per_call(typed, calls) / 8;
  const double t_map = seconds_per_call(mapped, calls) / 8;
  std::printf("get: typed %.2f ns/lookup, unordered_map<std::string> %.2f ns/lookup\n", t_typed * 1e9, t_map * 1e9);
  std::printf("get map/typed=%.1f\n", t_map / t_typed);
  return 0;
}
