// The verbs that the typed TensorDict and AnyTensorDict share, written once
// over what each provides: apply(f[, batch_size[, device]]), values() (the
// leaves themselves, in order) and batch_size().
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include <ATen/TensorIndexing.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>

#include "../errors.hpp"
#include "format.hpp"

namespace tensordict::detail {

// Indices that apply to the batch dims only: an Ellipsis stands for the batch
// dims that the other indices leave, never for a leaf's own dims.
inline std::vector<at::indexing::TensorIndex> batch_indices(c10::ArrayRef<at::indexing::TensorIndex> indices,
                                                             std::size_t batch_dims) {
  std::size_t consumed = 0;
  bool has_ellipsis = false;
  for (const auto& i : indices) {
    if (i.is_integer() || i.is_slice()) consumed += 1;
    else if (i.is_tensor()) consumed += i.tensor().scalar_type() == at::kBool ? i.tensor().dim() : 1;
    else if (i.is_ellipsis()) has_ellipsis = true;
  }
  if (consumed > batch_dims)
    throw index_error("TensorDict index: " + std::to_string(consumed) + " indices for " + std::to_string(batch_dims) +
                      " batch dims; a TensorDict is indexed along its batch dims only");
  std::vector<at::indexing::TensorIndex> out;
  for (const auto& i : indices) {
    if (i.is_ellipsis()) {
      for (std::size_t k = consumed; k < batch_dims; ++k) out.emplace_back(at::indexing::Slice());
    } else {
      out.push_back(i);
    }
  }
  if (!has_ellipsis)
    for (std::size_t k = consumed; k < batch_dims; ++k) out.emplace_back(at::indexing::Slice());
  return out;
}

template <class Derived>
class tensordict_ops {
 public:
  // Calls f on every leaf; if f returns a tensor, its values are written into
  // the leaf (the leaf keeps its identity). Every result is computed before
  // the first is written, so an f that throws changes nothing (unless f
  // itself wrote in place).
  template <class F>
  Derived& apply_(F&& f) {
    const std::vector<at::Tensor> stored = self().values();
    if constexpr (std::is_void_v<std::invoke_result_t<F&, at::Tensor&>>) {
      for (at::Tensor leaf : stored) f(leaf);
    } else {
      std::vector<at::Tensor> results;
      results.reserve(stored.size());
      for (at::Tensor leaf : stored) results.push_back(f(leaf));  // f gets a handle it may rebind
      for (std::size_t i = 0; i < stored.size(); ++i)
        if (results[i].defined() && !results[i].is_same(stored[i])) stored[i].copy_(results[i]);
    }
    return static_cast<Derived&>(*this);
  }

  Derived clone() const {
    return self().apply([](const at::Tensor& t) { return t.clone(); });
  }
  Derived detach() const {
    return self().apply([](const at::Tensor& t) { return t.detach(); });
  }
  Derived& zero_() {
    return apply_([](at::Tensor& t) { t.zero_(); });
  }
  Derived to(at::ScalarType dtype) const {
    return self().apply([&](const at::Tensor& t) { return t.to(dtype); });
  }
  // The result is built on `device`, so its leaves are never moved back to the old one.
  Derived to(at::Device device) const {
    return self().apply([&](const at::Tensor& t) { return t.to(device); }, self().batch_size(), device);
  }

  // Element-wise comparisons with a scalar, as a TensorDict of bool tensors.
  Derived operator==(const at::Scalar& value) const {
    return self().apply([&](const at::Tensor& t) { return t.eq(value); });
  }
  Derived operator!=(const at::Scalar& value) const {
    return self().apply([&](const at::Tensor& t) { return t.ne(value); });
  }

  // True when every element of every leaf is true (or non-zero).
  bool all() const {
    for (const at::Tensor& t : self().values())
      if (!t.all().template item<bool>()) return false;
    return true;
  }
  bool any() const {
    for (const at::Tensor& t : self().values())
      if (t.any().template item<bool>()) return true;
    return false;
  }

  // Indexing along the batch dims; leaves of the result are views where
  // libtorch gives views (integers, slices).
  Derived index(c10::ArrayRef<at::indexing::TensorIndex> indices) const {
    auto batch = batch_indices(indices, self().batch_size().size());
    // The result's batch size is what the same index does to a tensor of the
    // batch shape, on the device of the index tensors (a CUDA mask cannot index a CPU tensor).
    at::Device probe_device = at::kCPU;
    for (const auto& i : batch)
      if (i.is_tensor()) probe_device = i.tensor().device();
    auto probe = at::zeros({}, at::TensorOptions(at::kByte).device(probe_device)).expand(self().batch_size()).index(batch);
    return self().apply([&](const at::Tensor& t) { return t.index(batch); }, probe.sizes());
  }
  Derived index(std::initializer_list<at::indexing::TensorIndex> indices) const {
    return index(c10::ArrayRef<at::indexing::TensorIndex>(indices.begin(), indices.size()));
  }
  Derived operator[](std::int64_t i) const { return index({at::indexing::TensorIndex(i)}); }

  std::vector<Derived> unbind(std::int64_t dim = 0) const {
    dim = batch_dim(dim, "unbind");
    std::vector<std::int64_t> rest(self().batch_size().begin(), self().batch_size().end());
    const std::int64_t n = rest[dim];
    rest.erase(rest.begin() + dim);
    std::vector<Derived> out;
    out.reserve(n);
    for (std::int64_t k = 0; k < n; ++k) out.push_back(self().apply([&](const at::Tensor& t) { return t.select(dim, k); }, rest));
    return out;
  }

  // Broadcasts the batch dims to `shape`, as at::Tensor::expand does: new
  // dims go in front, -1 keeps a size. expand(4) on batch_size [] gives [4].
  Derived expand(c10::IntArrayRef shape) const {
    const c10::IntArrayRef batch = self().batch_size();
    const std::size_t nb = batch.size();
    if (shape.size() < nb)
      throw shape_error("TensorDict.expand: the shape " + format_sizes(shape) + " has fewer dims than batch_size=" +
                        format_sizes(batch));
    std::vector<std::int64_t> target(shape.begin(), shape.end());
    const std::size_t lead = shape.size() - nb;
    for (std::size_t d = 0; d < nb; ++d) {
      if (target[lead + d] == -1) target[lead + d] = batch[d];
      if (target[lead + d] != batch[d] && batch[d] != 1)
        throw shape_error("TensorDict.expand: cannot expand batch_size=" + format_sizes(batch) + " to " + format_sizes(shape));
    }
    return self().apply(
        [&](const at::Tensor& t) {
          std::vector<std::int64_t> full = target;
          full.insert(full.end(), t.sizes().begin() + nb, t.sizes().end());
          return t.expand(full);
        },
        target);
  }

 protected:
  std::int64_t batch_dim(std::int64_t dim, const char* op) const {
    const auto nb = static_cast<std::int64_t>(self().batch_size().size());
    if (dim < -nb || dim >= nb)
      throw index_error(std::string("TensorDict.") + op + ": dim " + std::to_string(dim) +
                        " is out of range for batch_size=" + format_sizes(self().batch_size()));
    return dim < 0 ? dim + nb : dim;
  }

 private:
  const Derived& self() const { return static_cast<const Derived&>(*this); }
};

}  // namespace tensordict::detail
