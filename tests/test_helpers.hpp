// Small helpers that the test files share.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>

#include <tensordict/detail/format.hpp>
// Every module family (in the default build a TU includes the families it uses): the suite uses them all.
#include <tensordict/nn/adapters/builtin.hpp>

#include "catch_torch.hpp"

namespace test {

// The TensorImpl behind a tensor: equal for the same tensor (identity), not for equal values.
inline const c10::TensorImpl* impl(const at::Tensor& t) { return t.unsafeGetTensorImpl(); }

// What operator<< prints.
template <class T>
std::string printed(const T& value) {
  std::ostringstream os;
  os << value;
  return os.str();
}

// A file of tests/data. The folder comes from the environment (meson test
// sets it), not from a compile definition: an absolute path in the compile
// command would keep ccache from reusing objects built in another checkout.
inline std::string test_data(const std::string& name) {
  const char* dir = std::getenv("TENSORDICT_TEST_DATA");
  if (!dir) throw std::runtime_error("TENSORDICT_TEST_DATA is not set: run the tests with meson test, or set it to tests/data");
  return std::string(dir) + "/" + name;
}

// A path in the temporary folder, unique to this process.
inline std::string temporary(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("tensordict_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

// A folder removed with its contents at the end of the test.
struct temporary_dir {
  std::filesystem::path path;
  explicit temporary_dir(const std::string& name) : path(temporary(name)) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~temporary_dir() { std::filesystem::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// The names in a folder that a save would leave behind (its temporaries).
inline std::vector<std::string> debris(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().find(".tensordict-") != std::string::npos) out.push_back(e.path().filename().string());
  return out;
}

// A folder of the tensordict 0.4 tensordict.nn fixtures (tests/data/tensordict-v0.4-nn), with a trailing '/'.
inline std::string nn_fixture(const std::string& name) { return test_data("tensordict-v0.4-nn/" + name + "/"); }

// Python's value within 1e-6 relative (issue 28's tolerance), with the same shape and dtype.
inline bool near_python(const at::Tensor& ours, const at::Tensor& python) {
  INFO("ours " << tensordict::describe(ours) << ", Python's " << tensordict::describe(python));
  return ours.sizes() == python.sizes() && ours.scalar_type() == python.scalar_type() &&
         at::allclose(ours, python, 1e-6, 1e-7);
}

}  // namespace test
