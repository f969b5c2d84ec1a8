// Loading a large state dict, measured in one run: today's way (the whole file
// read into memory, then every storage copied out: load_from_string), the
// mapped torch.save load, load_safetensors and load_memmap. Each load runs in
// a child process of its own (this program again), so that its peak RSS is
// its own. Printed: time until load returns, until the first tensor's first
// element is read, and after touching every tensor (a sum over each), and the
// peak RSS the load added over the process's baseline, as ratios against
// today's load and against the file's size.
//   build/bench/bench_files [MiB, default 1024] [folder, default the temp folder]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <torch/version.h>
#include <tensordict/files/torch_save.hpp>
#include <tensordict/files/memmap.hpp>
#include <tensordict/files/safetensors.hpp>

namespace td = tensordict;
namespace fs = std::filesystem;

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Resident set size now, from /proc/self/statm, in bytes.
double rss_now() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

double peak_rss() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

// The child: loads one way, prints "return first all added_rss".
int measure(const std::string& how, const std::string& path) {
  at::set_num_threads(1);
  (void)at::zeros({1}).sum();  // libtorch's lazy initialisation, outside the measurement
  const double baseline = rss_now();
  const auto start = std::chrono::steady_clock::now();
  td::AnyTensorDict loaded;
  if (how == "today")
    loaded = td::load_from_string(td::detail::read_file(path, "bench"));
  else if (how == "mapped")
    loaded = td::load(path, {.memory = td::load_memory::mapped});
  else if (how == "owned")
    loaded = td::load(path, {.memory = td::load_memory::owned});
  else if (how == "safetensors")
    loaded = td::load_safetensors(path, {.memory = td::load_memory::mapped});
  else if (how == "memmap")
    loaded = td::load_memmap(path);
  const double returned = seconds_since(start);
  volatile float first = loaded.values().front().data_ptr<float>()[0];
  (void)first;
  const double first_use = seconds_since(start);
  double total = 0;
  for (const auto& t : loaded.values()) total += t.sum().item<double>();
  const double all = seconds_since(start);
  std::printf("%.9f %.9f %.9f %.0f %g\n", returned, first_use, all, peak_rss() - baseline, total);
  return 0;
}

struct result {
  double returned, first_use, all, added_rss;
};

result run_child(const char* self, const std::string& how, const std::string& path) {
  const std::string command = std::string(self) + " --measure " + how + " '" + path + "'";
  FILE* pipe = popen(command.c_str(), "r");
  result r{};
  double total = 0;
  if (!pipe || std::fscanf(pipe, "%lf %lf %lf %lf %lf", &r.returned, &r.first_use, &r.all, &r.added_rss, &total) != 5) {
    std::fprintf(stderr, "the child for %s failed\n", how.c_str());
    std::exit(1);
  }
  pclose(pipe);
  return r;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--measure") return measure(argv[2], argv[3]);
  const long mib = argc > 1 ? std::atol(argv[1]) : 1024;
  const fs::path folder = fs::path(argc > 2 ? argv[2] : fs::temp_directory_path().string()) / ("tensordict_bench_files_" + std::to_string(getpid()));
  std::printf("libtorch %s, compiler %s\n", TORCH_VERSION, __VERSION__);
  fs::create_directories(folder);

  // A state dict of 16 MiB float32 matrices (the size of a 2048x2048 layer).
  td::AnyTensorDict state;
  const long layers = std::max(1L, mib / 16);
  for (long k = 0; k < layers; ++k) state.set({"layers." + std::to_string(k) + ".weight"}, at::randn({2048, 2048}));
  const std::string pt = (folder / "state.pt").string(), st = (folder / "state.safetensors").string(),
                    mm = (folder / "state.memmap").string();
  td::save(state, pt);
  td::save_safetensors(state, st);
  td::save_memmap(state, mm);
  state = td::AnyTensorDict();
  const double file_bytes = static_cast<double>(fs::file_size(pt));
  std::printf("state dict: %ld tensors, %.0f MiB (torch.save file), files written in %s\n", layers, file_bytes / (1 << 20),
              folder.c_str());

  // Warm the page cache the same for every way (each file read once before).
  for (const auto& [how, path] : std::vector<std::pair<std::string, std::string>>{{"today", pt}, {"safetensors", st}, {"memmap", mm}})
    (void)run_child(argv[0], how, path);
  const result today = run_child(argv[0], "today", pt);
  std::printf("%-12s return %8.4f s  first use %8.4f s  all touched %8.4f s  added peak RSS %6.0f MiB = %.2fx the file\n", "today",
              today.returned, today.first_use, today.all, today.added_rss / (1 << 20), today.added_rss / file_bytes);
  for (const auto& [how, path] : std::vector<std::pair<std::string, std::string>>{
           {"owned", pt}, {"mapped", pt}, {"safetensors", st}, {"memmap", mm}}) {
    const result r = run_child(argv[0], how, path);
    std::printf("%-12s return %8.4f s  first use %8.4f s  all touched %8.4f s  added peak RSS %6.0f MiB = %.2fx the file"
                "  | today/this: return %.0fx, first use %.0fx, all touched %.2fx, peak RSS %.2fx\n",
                how.c_str(), r.returned, r.first_use, r.all, r.added_rss / (1 << 20), r.added_rss / file_bytes,
                today.returned / r.returned, today.first_use / r.first_use, today.all / r.all, today.added_rss / r.added_rss);
  }
  fs::remove_all(folder);
  return 0;
}
