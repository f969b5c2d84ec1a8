// The sum and min trees of a prioritized sampler (TorchRL's SumSegmentTree and
// MinSegmentTree): one value per row, their sum or min over any range of rows
// and the row where a running sum first passes a mass, each in O(log n).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace tensordict::data::detail {

// Leaves at [capacity, 2 * capacity) of a complete binary tree whose inner node k combines 2k and 2k+1.
template <class Combine>
class segment_tree {
 public:
  segment_tree(std::int64_t size, double neutral) : neutral_(neutral) {
    while (capacity_ < size) capacity_ *= 2;
    size_ = size;
    nodes_.assign(static_cast<std::size_t>(2 * capacity_), neutral);
  }
  std::int64_t size() const { return size_; }
  double operator[](std::int64_t row) const { return nodes_[static_cast<std::size_t>(capacity_ + row)]; }
  void set(std::int64_t row, double value) {
    std::size_t k = static_cast<std::size_t>(capacity_ + row);
    nodes_[k] = value;
    for (k /= 2; k >= 1; k /= 2) nodes_[k] = Combine{}(nodes_[2 * k], nodes_[2 * k + 1]);
  }
  // Over the rows [begin, end).
  double query(std::int64_t begin, std::int64_t end) const {
    double left = neutral_, right = neutral_;
    for (std::size_t l = static_cast<std::size_t>(begin + capacity_), r = static_cast<std::size_t>(end + capacity_); l < r;
         l /= 2, r /= 2) {
      if (l & 1) left = Combine{}(left, nodes_[l++]);
      if (r & 1) right = Combine{}(nodes_[--r], right);
    }
    return Combine{}(left, right);
  }
  // Sum trees: the first row whose running sum (its own value included) exceeds `mass`;
  // the last row where none does.
  std::int64_t scan(double mass) const {
    std::size_t k = 1;
    while (k < static_cast<std::size_t>(capacity_)) {
      if (nodes_[2 * k] > mass) {
        k = 2 * k;
      } else {
        mass -= nodes_[2 * k];
        k = 2 * k + 1;
      }
    }
    return std::min(static_cast<std::int64_t>(k) - capacity_, size_ - 1);
  }

 private:
  double neutral_;
  std::int64_t capacity_ = 1;
  std::int64_t size_ = 0;
  std::vector<double> nodes_;
};

struct min_of {
  double operator()(double a, double b) const { return std::min(a, b); }
};

using sum_tree = segment_tree<std::plus<double>>;
using min_tree = segment_tree<min_of>;

inline sum_tree make_sum_tree(std::int64_t size) { return sum_tree(size, 0.0); }
inline min_tree make_min_tree(std::int64_t size) { return min_tree(size, std::numeric_limits<double>::infinity()); }

}  // namespace tensordict::data::detail
