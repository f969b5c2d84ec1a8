// Values that are not tensors, beside the tensors of a TensorDict: Python
// tensordict's NonTensorData (one value for the whole batch: a task name, an
// episode number) and NonTensorStack (one value per batch element).
//
//   td.set_non_tensor({"task"}, "reach-target");                 // NonTensorData
//   std::string task = td.get_non_tensor<std::string>({"task"});
//   td.set_non_tensor({"name"}, tensordict::NonTensor::stack({"a", "b", "c"}, {3}));  // NonTensorStack
//   td[1].get_non_tensor<std::string>({"name"});                   // "b"
//
// A value is one of Python's None, bool, int, float or str, which is what a
// memmap directory's meta.json holds (lists and dicts are not read). Such
// entries are never leaves: keys(), values(), items(), apply and the
// arithmetic see tensors only. Verbs that rearrange the batch dims (index,
// unbind, reshape, permute, expand, split, stack, cat) rearrange a
// NonTensorStack's values with them; a NonTensorData keeps its value.
// Stacking NonTensorData whose values are all equal gives one NonTensorData,
// other values give a NonTensorStack (tensordict 0.4's rule). Verbs that
// change the batch size otherwise (reductions, set_batch_size, pad) keep a
// NonTensorData and refuse a NonTensorStack (value_error naming its key).
//
// This header needs only the standard library (the file readers use it).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "detail/config.hpp"
#include "errors.hpp"

namespace tensordict {

// Python's None, bool, int, float, str.
using non_tensor_value = std::variant<std::monostate, bool, std::int64_t, double, std::string>;

// As Python's repr: None, True, 7, 0.5, 'reach-target'.
TENSORDICT_DECL std::string repr(const non_tensor_value& v);

// The name of a value's kind, as errors print it: "str", "int".
inline const char* kind_name(const non_tensor_value& v) {
  constexpr const char* names[] = {"None", "bool", "int", "float", "str"};
  return names[v.index()];
}

template <class T>
inline constexpr bool is_non_tensor_alternative =
    std::is_same_v<T, std::monostate> || std::is_same_v<T, bool> || std::is_same_v<T, std::int64_t> ||
    std::is_same_v<T, double> || std::is_same_v<T, std::string> || std::is_same_v<T, non_tensor_value>;

// One non-tensor entry: NonTensorData (is_stack() false, one value) or a
// NonTensorStack (one value per element of shape(), row-major).
class NonTensor {
 public:
  // NonTensorData: anything a non_tensor_value holds ("reach-target", 7, 0.5, true, std::monostate{}).
  template <class T>
    requires(!std::is_same_v<std::remove_cvref_t<T>, NonTensor> && std::is_constructible_v<non_tensor_value, T &&>)
  NonTensor(T&& value) : values_{non_tensor_value(std::forward<T>(value))} {}

  // NonTensorStack: `values` row-major over `shape` (at least one dim), as
  // Python's NonTensorStack.tolist() flattened.
  TENSORDICT_DECL static NonTensor stack(std::vector<non_tensor_value> values, std::vector<std::int64_t> shape);
  static NonTensor stack(std::initializer_list<non_tensor_value> values, std::vector<std::int64_t> shape) {
    return stack(std::vector<non_tensor_value>(values), std::move(shape));
  }

  bool is_stack() const { return stacked_; }
  // A NonTensorData's value; a NonTensorStack throws value_error.
  const non_tensor_value& value() const {
    if (stacked_)
      throw value_error("NonTensor::value: this is a NonTensorStack of shape " + sizes(shape_) +
                        " (one value per batch element); read values() or index the TensorDict first");
    return values_.front();
  }
  // A NonTensorStack's values, row-major over shape(); a NonTensorData's one value.
  const std::vector<non_tensor_value>& values() const { return values_; }
  // A NonTensorStack's shape (the batch size of the level that holds it); empty for NonTensorData.
  const std::vector<std::int64_t>& shape() const { return shape_; }

  // One value per element of a batch of `count` elements, row-major.
  std::vector<non_tensor_value> per_element(std::int64_t count) const {
    if (stacked_) return values_;
    return std::vector<non_tensor_value>(static_cast<std::size_t>(count), values_.front());
  }

  friend bool operator==(const NonTensor& a, const NonTensor& b) {
    return a.stacked_ == b.stacked_ && a.shape_ == b.shape_ && a.values_ == b.values_;
  }

  // NonTensorData('reach-target'), NonTensorStack(shape=[3, 2], ['alpha', 'alpha', 'beta', ...]).
  TENSORDICT_DECL std::string repr() const;

 private:
  static std::string sizes(const std::vector<std::int64_t>& s) {
    std::string out = "[";
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (i) out += ',';
      out += std::to_string(s[i]);
    }
    return out + "]";
  }

  std::vector<non_tensor_value> values_;
  std::vector<std::int64_t> shape_;
  bool stacked_ = false;
};

}  // namespace tensordict

#if TENSORDICT_DEFINITIONS
namespace tensordict {
TENSORDICT_DECL std::string repr(const non_tensor_value& v) {
  struct {
    std::string operator()(std::monostate) const { return "None"; }
    std::string operator()(bool b) const { return b ? "True" : "False"; }
    std::string operator()(std::int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const {
      if (std::isnan(d)) return "nan";
      if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
      std::string s = std::to_string(d);
      s.erase(s.find_last_not_of('0') + 1);
      if (s.back() == '.') s += '0';
      return s;
    }
    std::string operator()(const std::string& s) const { return "'" + s + "'"; }
  } show;
  return std::visit(show, v);
}

TENSORDICT_DECL NonTensor NonTensor::stack(std::vector<non_tensor_value> values, std::vector<std::int64_t> shape) {
  const std::int64_t n = std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
  if (shape.empty()) throw shape_error("NonTensor::stack: a NonTensorStack needs at least one dim (one value is a NonTensorData)");
  if (n < 0 || static_cast<std::uint64_t>(n) != values.size())
    throw shape_error("NonTensor::stack: " + std::to_string(values.size()) + " values for the shape " + sizes(shape) + " (" +
                      std::to_string(n) + " elements)");
  NonTensor out{std::monostate{}};
  out.values_ = std::move(values);
  out.shape_ = std::move(shape);
  out.stacked_ = true;
  return out;
}

TENSORDICT_DECL std::string NonTensor::repr() const {
  if (!stacked_) return "NonTensorData(" + tensordict::repr(values_.front()) + ")";
  std::string out = "NonTensorStack(shape=" + sizes(shape_) + ", [";
  for (std::size_t i = 0; i < values_.size() && i < 4; ++i) {
    if (i) out += ", ";
    out += tensordict::repr(values_[i]);
  }
  return out + (values_.size() > 4 ? ", ...])" : "])");
}
}  // namespace tensordict
#endif  // TENSORDICT_DEFINITIONS
