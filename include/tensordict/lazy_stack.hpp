// Python's LazyStackedTensorDict: a stack of TensorDicts whose leaves may
// differ in shape (observations of different lengths, per-agent specs). It
// keeps the TensorDicts themselves; indexing along the stack dim gives them
// back without copies, and a leaf is stacked only when asked for.
//
//   auto lazy = tensordict::lazy_stack(std::vector{a, b, c});  // batch_size [3, ...]
//   lazy[1].is_same(b);                    // the original, not a copy
//   at::Tensor obs = lazy.get("obs");      // stacked now: shapes must agree...
//   at::Tensor padded = lazy.get_padded("obs", 0);   // ...or be padded to the largest
//
// Works over typed TensorDicts (get<"obs">()) and AnyTensorDicts (get("obs")).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/stack.h>

#include "any_tensordict.hpp"
#include "errors.hpp"
#include "typed_tensordict.hpp"

namespace tensordict {

template <class TD>
  requires detail::is_tensordict<TD>::value
class LazyStackedTensorDict {
 public:
  // Every TensorDict must have the same batch size; stack_dim is a dim of the result's batch.
  explicit LazyStackedTensorDict(std::vector<TD> tds, std::int64_t stack_dim = 0) : tds_(std::move(tds)) {
    if (tds_.empty()) throw shape_error("tensordict::lazy_stack: needs at least one TensorDict");
    const auto nb = static_cast<std::int64_t>(tds_[0].batch_dims());
    if (stack_dim < -(nb + 1) || stack_dim > nb)
      throw index_error("tensordict::lazy_stack: dim " + std::to_string(stack_dim) + " is out of range for batch_size=" +
                        format_sizes(tds_[0].batch_size()));
    stack_dim_ = stack_dim < 0 ? stack_dim + nb + 1 : stack_dim;
    for (std::size_t k = 1; k < tds_.size(); ++k)
      if (!tds_[k].batch_size().equals(tds_[0].batch_size()))
        throw shape_error("tensordict::lazy_stack: TensorDict 0 has batch_size=" + format_sizes(tds_[0].batch_size()) +
                          " but TensorDict " + std::to_string(k) + " has batch_size=" + format_sizes(tds_[k].batch_size()));
    batch_ = tds_[0].batch_size().vec();
    batch_.insert(batch_.begin() + stack_dim_, static_cast<std::int64_t>(tds_.size()));
  }

  c10::IntArrayRef batch_size() const { return batch_; }
  std::int64_t stack_dim() const { return stack_dim_; }
  std::size_t size() const { return tds_.size(); }
  const std::vector<TD>& tensordicts() const { return tds_; }

  // The i-th TensorDict along the stack dim: the original, not a copy.
  const TD& operator[](std::int64_t i) const {
    const auto n = static_cast<std::int64_t>(tds_.size());
    if (i < -n || i >= n)
      throw index_error("LazyStackedTensorDict: index " + std::to_string(i) + " is out of range for " + std::to_string(n) +
                        " TensorDicts");
    return tds_[static_cast<std::size_t>(i < 0 ? i + n : i)];
  }
  // Unbound along the stack dim: the originals.
  std::vector<TD> unbind() const { return tds_; }

  // The key paths every TensorDict has as leaves, in the first one's order (Python's keys of a lazy stack).
  std::vector<any_key_path> keys() const {
    std::vector<any_key_path> out;
    for (const auto& path : AnyTensorDict(tds_[0]).keys()) {
      bool everywhere = true;
      for (std::size_t k = 1; k < tds_.size() && everywhere; ++k) everywhere = any(k).contains(path) && any(k).is_leaf(path);
      if (everywhere) out.push_back(path);
    }
    return out;
  }

  // A leaf stacked along the stack dim; shape_error names the leaf and the
  // shapes when they differ (get_padded pads them instead).
  at::Tensor get(c10::ArrayRef<std::string> path) const { return stacked(path, std::nullopt); }
  template <class... Keys>
    requires(sizeof...(Keys) > 0 && (std::is_convertible_v<const Keys&, std::string_view> && ...))
  at::Tensor get(const Keys&... keys) const {
    return get(any_key_path{std::string(std::string_view(keys))...});
  }
  // The typed spelling: get<"obs">(), checked by the compiler.
  template <key... Path>
    requires(sizeof...(Path) > 0 && !std::is_same_v<TD, AnyTensorDict>)
  at::Tensor get() const {
    std::vector<at::Tensor> parts;
    for (const TD& td : tds_) parts.push_back(td.template get<Path...>());
    return stack_parts(parts, key_path_t<Path...>::describe(), std::nullopt);
  }

  // Each TensorDict's leaf padded with `value` at the end of every dim to the
  // largest shape, then stacked (Python's get with as_padded_tensor).
  at::Tensor get_padded(c10::ArrayRef<std::string> path, const at::Scalar& value = 0) const { return stacked(path, value); }

  // One TensorDict: every leaf stacked (Python's contiguous() / to_tensordict()).
  TD contiguous() const { return stack(tds_, stack_dim_); }

  // f applied to each TensorDict, stacked lazily again (Python's apply on a lazy stack).
  template <class F>
  LazyStackedTensorDict apply(F&& f) const {
    std::vector<TD> out;
    for (const TD& td : tds_) out.push_back(td.apply(f));
    return LazyStackedTensorDict(std::move(out), stack_dim_);
  }
  LazyStackedTensorDict to(at::Device device) const {
    std::vector<TD> out;
    for (const TD& td : tds_) out.push_back(td.to(device));
    return LazyStackedTensorDict(std::move(out), stack_dim_);
  }

  // LazyStackedTensorDict(batch_size=[3], stack_dim=0, fields={obs: f32[3,-1]}): a dim that differs prints as -1.
  std::string repr() const {
    std::string out = "LazyStackedTensorDict(batch_size=" + format_sizes(batch_) + ", stack_dim=" + std::to_string(stack_dim_) +
                      ", fields={";
    auto paths = keys();
    std::sort(paths.begin(), paths.end());
    for (std::size_t p = 0; p < paths.size(); ++p) {
      std::vector<at::Tensor> parts = leaves(paths[p]);
      std::vector<std::int64_t> shape = parts[0].sizes().vec();
      for (const at::Tensor& t : parts)
        for (std::size_t d = 0; d < shape.size(); ++d)
          if (t.dim() != parts[0].dim() || t.size(static_cast<std::int64_t>(d)) != shape[d]) shape[d] = -1;
      shape.insert(shape.begin() + stack_dim_, static_cast<std::int64_t>(tds_.size()));
      out += (p ? ", " : "") + join(paths[p], ".") + ": " + describe(parts[0]).substr(0, describe(parts[0]).find('[')) +
             format_sizes(shape);
    }
    return out + "})";
  }
  friend std::ostream& operator<<(std::ostream& os, const LazyStackedTensorDict& lazy) { return os << lazy.repr(); }

 private:
  AnyTensorDict any(std::size_t k) const { return AnyTensorDict(tds_[k]); }

  std::vector<at::Tensor> leaves(c10::ArrayRef<std::string> path) const {
    std::vector<at::Tensor> parts;
    for (std::size_t k = 0; k < tds_.size(); ++k) {
      if constexpr (std::is_same_v<TD, AnyTensorDict>) {
        if (!tds_[k].contains(path))
          throw key_error("LazyStackedTensorDict.get(" + to_string(path) + "): TensorDict " + std::to_string(k) + " has no such key");
        parts.push_back(tds_[k].get(path));
      } else {
        const AnyTensorDict a = any(k);
        if (!a.contains(path))
          throw key_error("LazyStackedTensorDict.get(" + to_string(path) + "): TensorDict " + std::to_string(k) + " has no such key");
        parts.push_back(a.get(path));
      }
    }
    return parts;
  }

  at::Tensor stacked(c10::ArrayRef<std::string> path, const std::optional<at::Scalar>& pad_value) const {
    return stack_parts(leaves(path), to_string(path), pad_value);
  }

  at::Tensor stack_parts(std::vector<at::Tensor> parts, const std::string& path, const std::optional<at::Scalar>& pad_value) const {
    for (std::size_t k = 1; k < parts.size(); ++k)
      if (parts[k].dim() != parts[0].dim() || parts[k].scalar_type() != parts[0].scalar_type())
        throw shape_error("LazyStackedTensorDict.get(" + path + "): the leaf is " + describe(parts[0]) + " in TensorDict 0 but " +
                          describe(parts[k]) + " in TensorDict " + std::to_string(k) + "; only sizes may differ");
    std::vector<std::int64_t> largest = parts[0].sizes().vec();
    for (const at::Tensor& t : parts)
      for (std::size_t d = 0; d < largest.size(); ++d) largest[d] = std::max(largest[d], t.size(static_cast<std::int64_t>(d)));
    if (!pad_value)
      for (std::size_t k = 1; k < parts.size(); ++k)
        if (!parts[k].sizes().equals(parts[0].sizes()))
          throw shape_error("LazyStackedTensorDict.get(" + path + "): the leaf is " + describe(parts[0]) + " in TensorDict 0 but " +
                            describe(parts[k]) + " in TensorDict " + std::to_string(k) +
                            ", so it cannot be stacked; use get_padded(...) or index the TensorDicts");
    for (std::size_t k = 0; k < parts.size(); ++k) {
      if (parts[k].sizes().equals(largest)) continue;
      std::vector<std::int64_t> pads;
      for (auto d = parts[k].dim() - 1; d >= 0; --d) {
        pads.push_back(0);
        pads.push_back(largest[static_cast<std::size_t>(d)] - parts[k].size(d));
      }
      parts[k] = at::constant_pad_nd(parts[k], pads, *pad_value);
    }
    return at::stack(parts, stack_dim_);
  }

  std::vector<TD> tds_;
  std::int64_t stack_dim_ = 0;
  std::vector<std::int64_t> batch_;
};

// Python's lazy_stack / LazyStackedTensorDict(*tds, stack_dim=dim).
template <class TD>
  requires detail::is_tensordict<TD>::value
LazyStackedTensorDict<TD> lazy_stack(std::vector<TD> tds, std::int64_t dim = 0) {
  return LazyStackedTensorDict<TD>(std::move(tds), dim);
}

}  // namespace tensordict
