// Small helpers that the test files share.
#pragma once

#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

#include <ATen/core/Tensor.h>

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

}  // namespace test
