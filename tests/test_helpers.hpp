// Small helpers that the test files share.
#pragma once

#include <sstream>
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

}  // namespace test
