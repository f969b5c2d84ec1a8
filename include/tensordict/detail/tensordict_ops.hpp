// The verbs that the typed TensorDict and AnyTensorDict share, written once
// over what each provides: apply(f[, batch_size[, device]]), values() (the
// leaves themselves, in order), batch_size(), compare(other, op, f) (the
// leaves of two TensorDicts with the same keys, paired) and stored_names()
// (the batch dim names its storage keeps).
//
// Shape verbs act on the batch dims only; each leaf's own dims follow
// unchanged (Python tensordict's semantics), and a leaf is a view wherever
// libtorch gives one for the same call on a tensor.
#pragma once

#include <algorithm>
#include <cstring>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/TensorIndexing.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/FunctionRef.h>
#include <c10/util/SmallVector.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/result_type.h>
#include <ATen/ops/rsub.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/ScalarType.h>

#include "../errors.hpp"
#include "compat.hpp"
#include "config.hpp"
#include "format.hpp"
#include "../files/detail/shared_mappings.hpp"

namespace tensordict {
// The names of the batch dims (Python's td.names): std::nullopt for a dim without one.
using batch_names = std::vector<std::optional<std::string>>;
}  // namespace tensordict

namespace tensordict::detail {

TENSORDICT_DECL std::string format_names(const batch_names& names);

// `names` for a TensorDict of batch size `batch`: one per dim, each at most once.
TENSORDICT_DECL batch_names checked_names(const batch_names& names, c10::IntArrayRef batch, const char* op);
// The stored names, one per batch dim: a nested level's own dims (beyond the root's) have none.
inline batch_names names_or_none(const batch_names& stored, std::size_t batch_dims) {
  batch_names out = stored;
  out.resize(batch_dims);
  return out;
}

// How a verb on the batch dims sets the batch size of a nested TensorDict,
// which Python lets add dims of its own after its parent's ({"sub": TD of
// [4, 3, 2]} under [4, 3]).
enum class nested_batch {
  follow,  // the parent's new batch size, then the dims this level adds (index, reshape, stack, ...)
  parent,  // the parent's new batch size (reductions of every leaf to a scalar)
  setter,  // Python's batch_size setter: kept unless shorter than the parent's new one, which it then takes
};
TENSORDICT_DECL std::vector<std::int64_t> nested_batch_size(nested_batch rule, c10::IntArrayRef old_node, c10::IntArrayRef old_parent, c10::IntArrayRef new_parent);
// The longest leading sizes that every shape shares, at most max_dims long;
// `fallback` (so limited) when there is no shape.
TENSORDICT_DECL std::vector<std::int64_t> common_batch(const std::vector<c10::IntArrayRef>& shapes, c10::IntArrayRef fallback, std::optional<std::size_t> max_dims);
inline bool starts_with(c10::IntArrayRef sizes, c10::IntArrayRef prefix) {
  return sizes.size() >= prefix.size() && sizes.slice(0, prefix.size()) == prefix;
}
// Python's refine_names: unnamed dims take the new name, named ones must keep theirs.
TENSORDICT_DECL batch_names refined_names(const batch_names& stored, const batch_names& names, c10::IntArrayRef batch, const char* op);

// value can be copied into leaf in place: it broadcasts to the leaf's shape.
TENSORDICT_DECL void check_copy(const at::Tensor& leaf, const at::Tensor& value, const char* op, const std::string& path);

// Indices that apply to the batch dims only: an Ellipsis stands for the batch
// dims that the other indices leave, never for a leaf's own dims.
TENSORDICT_DECL std::vector<at::indexing::TensorIndex> batch_indices(c10::ArrayRef<at::indexing::TensorIndex> indices, std::size_t batch_dims);

// The file that one of `leaves` writes through to (a memmap buffer loaded with load_memory::shared), or empty.
TENSORDICT_DECL std::string written_through_file(const std::vector<at::Tensor>& leaves);

// A pairwise verb (td + other, lerp_, ...) on TensorDicts of different batch sizes.
[[noreturn]] TENSORDICT_DECL void throw_batch_sizes_differ(c10::IntArrayRef mine, c10::IntArrayRef theirs, const char* op);

// lerp's operands, leaf by leaf (`theirs`: end's leaves in the order of
// `mine`): end's leaf and a tensor weight of the leaf's dtype, each
// broadcasting to the leaf without growing it; name_of(i) names leaf i.
TENSORDICT_DECL void check_lerp_leaves(const std::vector<at::Tensor>& mine, const std::vector<at::Tensor>& theirs,
                                       const at::Tensor* weight, const char* op,
                                       c10::function_ref<std::string(std::size_t)> name_of);

// consolidate()'s layout for these leaves (values() order): where each starts
// in the buffer, and (last) the buffer's size.
TENSORDICT_DECL std::vector<std::int64_t> consolidated_offsets(const std::vector<at::Tensor>& leaves);
// The one buffer that every leaf views in that layout, or an undefined tensor
// where they are not so laid out (or there is none).
TENSORDICT_DECL at::Tensor consolidated_storage_of(const std::vector<at::Tensor>& leaves);
// consolidated_storage_of where moving that buffer moves every leaf: undefined
// where a leaf requires grad while autograd records.
TENSORDICT_DECL at::Tensor one_buffer_of(const std::vector<at::Tensor>& leaves);
// Each leaf's view of `storage` in that layout.
TENSORDICT_DECL std::vector<at::Tensor> views_of(const at::Tensor& storage, const std::vector<at::Tensor>& leaves);

// expand's batch size: `shape`, where -1 keeps a dim of `batch`, checked as at::Tensor::expand checks it (new dims in front).
TENSORDICT_DECL std::vector<std::int64_t> expanded_batch(c10::IntArrayRef batch, c10::IntArrayRef shape);
// A leaf whose first batch_dims dims are a batch, expanded to the batch size `target`.
TENSORDICT_DECL at::Tensor expanded_leaf(const at::Tensor& leaf, c10::IntArrayRef target, std::size_t batch_dims);

// The batch size of index(batch) on a TensorDict of batch size `batch_size`: what the same index
// does to a tensor of the batch shape, on the device of the index tensors (a CUDA mask cannot index a
// CPU tensor). Checks the indices against the batch size.
TENSORDICT_DECL std::vector<std::int64_t> indexed_batch(c10::IntArrayRef batch_size, c10::ArrayRef<at::indexing::TensorIndex> batch,
                                                        const char* op);

// Indices that select rows of the first batch dim only (the others whole):
// one row, a range of rows, or a list of rows (a 1-D int64 CPU tensor),
// which indexed writes copy row by row without libtorch's indexing.
enum class row_index { other, single, range, list };
struct leading_rows_t {
  row_index kind = row_index::other;
  std::int64_t start = 0, count = 0;  // single: start; range: [start, start + count)
  const std::int64_t* list = nullptr;  // list: count rows, each possibly negative
};
TENSORDICT_DECL leading_rows_t leading_rows(c10::IntArrayRef batch_size, c10::ArrayRef<at::indexing::TensorIndex> batch);
// Writes value's rows into the leaf by memcpy, where that is all the write
// does: a dense CPU leaf, a value of its dtype and of the exact target shape,
// and no autograd to record. Returns false (nothing written) otherwise.
TENSORDICT_DECL bool copy_rows(const at::Tensor& leaf, const at::Tensor& value, const leading_rows_t& rows, c10::IntArrayRef target);

// One leaf's part of an indexed write (set_at_, update_at_, index_put_).
struct pending_write {
  at::Tensor leaf;
  at::Tensor value;
};
// Checks every write, then makes them all: writes[k].value into writes[k].leaf at `indices` along
// the batch dims of a TensorDict of batch size `batch_size`. name_of(k) names write k's key path
// in errors (built only for one). Not a template: every TensorDict type's writes share it.
TENSORDICT_DECL void write_at(c10::IntArrayRef batch_size, std::vector<pending_write>& writes,
                              c10::ArrayRef<at::indexing::TensorIndex> indices, const char* op,
                              c10::function_ref<std::string(std::size_t)> name_of);

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

  // Python's td.batch_size = batch: the same leaves under a new batch size,
  // each of which must start with it (shape_error naming the leaf otherwise;
  // this TensorDict is then unchanged). Batch dim names are dropped where the
  // batch size changes. Other handles of this TensorDict keep their batch size.
  // A nested TensorDict keeps its batch size unless it is shorter than the new one, which it then takes (as in Python).
  Derived& set_batch_size(c10::IntArrayRef batch) {
    Derived resized = self().map_leaves([](const at::Tensor& t) { return t; }, batch, nested_batch::setter);
    static_cast<Derived&>(*this) = std::move(resized);
    return static_cast<Derived&>(*this);
  }

  // Python's td.auto_batch_size_(batch_dims): each level's batch size becomes
  // the longest leading shape that its leaves and nested batch sizes share
  // (nested levels first), at most batch_dims long; an empty level keeps its own.
  Derived& auto_batch_size_(std::optional<std::size_t> batch_dims = std::nullopt) {
    Derived resized = self().auto_batched(batch_dims);
    static_cast<Derived&>(*this) = std::move(resized);
    return static_cast<Derived&>(*this);
  }

  // A consolidated TensorDict's copy is consolidated too: one buffer copied
  // (unless autograd records a leaf's copy, which the buffer would not carry).
  Derived clone() const {
    if (const at::Tensor storage = one_buffer(); storage.defined()) return over_storage(storage.clone());
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
    if (const at::Tensor storage = one_buffer(); storage.defined() && storage.device() != device)
      return over_storage(storage.to(device), device);  // one buffer moved
    return self().apply([&](const at::Tensor& t) { return t.to(device); }, self().batch_size(), device);
  }

  // ---- consolidation: every leaf in one buffer ------------------------------------

  // Python's td.consolidate(): a copy whose leaves are views into one
  // storage, a 1-D uint8 tensor on the leaves' device (consolidated_storage()),
  // so that clone(), to(device) and a c10d send or broadcast of that tensor
  // move one buffer. The layout: the leaves in values() order (schema order,
  // or insertion order depth first), each contiguous, starting at a multiple
  // of 8 bytes (16 for 16-byte elements), the storage ending with the last.
  // Values are copied, not autograd history. The result is locked, as in Python.
  Derived consolidate() const {
    const std::vector<at::Tensor> leaves = self().values();
    for (const at::Tensor& t : leaves)
      if (t.device() != leaves.front().device())
        throw value_error("TensorDict.consolidate: the leaves are on " + leaves.front().device().str() + " and " + t.device().str() +
                          "; one buffer needs one device (move the TensorDict with to(device) first)");
    const std::vector<std::int64_t> offsets = consolidated_offsets(leaves);
    const at::Device device = leaves.empty() ? self().device().value_or(at::Device(at::kCPU)) : leaves.front().device();
    at::Tensor storage = at::empty({offsets.back()}, at::TensorOptions(at::kByte).device(device));
    Derived out = over_storage(storage);
    at::NoGradGuard no_grad;
    const std::vector<at::Tensor> views = out.values();
    for (std::size_t k = 0; k < leaves.size(); ++k) at::Tensor(views[k]).copy_(leaves[k]);
    out.lock_();
    return out;
  }
  // The one buffer that every leaf views in consolidate()'s layout, or an
  // undefined tensor where the leaves are not so laid out (nor any leaf set).
  at::Tensor consolidated_storage() const { return consolidated_storage_of(self().values()); }
  bool is_consolidated() const { return consolidated_storage().defined(); }
  // Python's from_consolidated for a buffer that arrived (broadcast, received,
  // moved): a TensorDict with this one's keys, shapes and dtypes whose leaves
  // view `storage`, a 1-D uint8 tensor in consolidate()'s layout for them
  // (value_error otherwise). The buffer is shared, not copied.
  Derived from_consolidated(const at::Tensor& storage) const {
    const std::int64_t size = consolidated_offsets(self().values()).back();
    if (!storage.defined() || storage.scalar_type() != at::kByte || storage.dim() != 1 || storage.size(0) != size ||
        !storage.is_contiguous())
      throw value_error("TensorDict.from_consolidated: expected the buffer u8[" + std::to_string(size) +
                        "] that consolidate() lays out for these leaves, got " + (storage.defined() ? describe(storage) : std::string("none")));
    return over_storage(storage, storage.device());
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
    const auto indexed = indexed_batch(batch, "index");
    return rearranged([&](const at::Tensor& t) { return t.index(batch); }, indexed);
  }
  Derived index(std::initializer_list<at::indexing::TensorIndex> indices) const {
    return index(c10::ArrayRef<at::indexing::TensorIndex>(indices.begin(), indices.size()));
  }
  Derived operator[](std::int64_t i) const { return index({at::indexing::TensorIndex(i)}); }

  // Python's td[indices] = other: other's leaves written into this
  // TensorDict's at `indices` along the batch dims (integers, slices, index
  // tensors, boolean masks, an Ellipsis). other has the same keys; its leading
  // dims are those of index(indices), or broadcast to them. Every key, shape,
  // dtype (one that the leaf's cannot hold without changing kind, as an in-place
  // op refuses: at::canCast) and index is checked before the first byte is
  // written, so a failed write leaves this TensorDict as it was. The leaves
  // keep their storage, so this works on a locked TensorDict (and writes
  // through to a file a memmap leaf maps shared). update_at_ writes a part.
  Derived& index_put_(c10::ArrayRef<at::indexing::TensorIndex> indices, const Derived& other) {
    // The same number of leaves, and update_at_ finds each of other's here: the same keys.
    if (self().values().size() != other.values().size())
      (void)self().compare(other, "index_put_", [](const at::Tensor& mine, const at::Tensor&) { return mine; });
    return static_cast<Derived&>(*this).write_other_at(other, indices, "index_put_");
  }
  Derived& index_put_(std::initializer_list<at::indexing::TensorIndex> indices, const Derived& other) {
    return index_put_(c10::ArrayRef<at::indexing::TensorIndex>(indices.begin(), indices.size()), other);
  }

  std::vector<Derived> unbind(std::int64_t dim = 0) const {
    dim = batch_dim(dim, "unbind");
    std::vector<std::int64_t> rest(self().batch_size().begin(), self().batch_size().end());
    const std::int64_t n = rest[dim];
    rest.erase(rest.begin() + dim);
    std::vector<Derived> out;
    out.reserve(n);
    for (std::int64_t k = 0; k < n; ++k) out.push_back(rearranged([&](const at::Tensor& t) { return t.select(dim, k); }, rest));
    return out;
  }

  // Broadcasts the batch dims to `shape`, as at::Tensor::expand does: new
  // dims go in front, -1 keeps a size. expand(4) on batch_size [] gives [4].
  Derived expand(c10::IntArrayRef shape) const {
    const std::size_t nb = self().batch_size().size();
    const std::vector<std::int64_t> target = expanded_batch(self().batch_size(), shape);
    return rearranged([&](const at::Tensor& t) { return expanded_leaf(t, target, nb); }, target);
  }


  // ---- the batch shape ---------------------------------------------------------------

  // The batch size, as Python's td.shape; ndim() its length, numel() its product.
  c10::IntArrayRef shape() const { return self().batch_size(); }
  std::int64_t ndim() const { return static_cast<std::int64_t>(self().batch_size().size()); }
  std::int64_t numel() const {
    const auto b = self().batch_size();
    return std::accumulate(b.begin(), b.end(), std::int64_t{1}, std::multiplies<>());
  }
  // True when no leaf is set (empty sub-TensorDicts hold none), as Python's is_empty().
  bool is_empty() const { return self().values().empty(); }

  // The batch dims reshaped (one size may be -1); leaves are views where libtorch's reshape gives one.
  Derived reshape(c10::IntArrayRef shape) const {
    const auto target = resolved_shape(shape, "reshape");
    return with_batch(target, [&](const at::Tensor& t, c10::IntArrayRef leaf) { return t.reshape(joined(target, leaf)); });
  }
  // As reshape, and every leaf must be viewable (else libtorch's error names the leaf's shape).
  Derived view(c10::IntArrayRef shape) const {
    const auto target = resolved_shape(shape, "view");
    return with_batch(target, [&](const at::Tensor& t, c10::IntArrayRef leaf) { return t.view(joined(target, leaf)); });
  }
  // Batch dims start..end (inclusive) as one.
  Derived flatten(std::int64_t start = 0, std::int64_t end = -1) const {
    const auto b = self().batch_size();
    if (b.empty()) return self().apply([](const at::Tensor& t) { return t; });
    start = batch_dim(start, "flatten");
    end = batch_dim(end, "flatten");
    if (start > end) throw index_error("TensorDict.flatten: start " + std::to_string(start) + " is after end " + std::to_string(end));
    std::vector<std::int64_t> target(b.begin(), b.begin() + start);
    target.push_back(std::accumulate(b.begin() + start, b.begin() + end + 1, std::int64_t{1}, std::multiplies<>()));
    target.insert(target.end(), b.begin() + end + 1, b.end());
    return reshape(target);
  }
  // Batch dim `dim` as `sizes` (one may be -1).
  Derived unflatten(std::int64_t dim, c10::IntArrayRef sizes) const {
    dim = batch_dim(dim, "unflatten");
    const auto b = self().batch_size();
    std::vector<std::int64_t> target(b.begin(), b.begin() + dim);
    target.insert(target.end(), sizes.begin(), sizes.end());
    target.insert(target.end(), b.begin() + dim + 1, b.end());
    const auto known = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{1},
                                       [](std::int64_t a, std::int64_t s) { return s == -1 ? a : a * s; });
    const bool inferred = std::count(sizes.begin(), sizes.end(), -1) == 1;
    if ((inferred && (known == 0 || b[dim] % known != 0)) || (!inferred && known != b[dim]))
      throw shape_error("TensorDict.unflatten: batch dim " + std::to_string(dim) + " of size " + std::to_string(b[dim]) +
                        " cannot be " + format_sizes(sizes));
    return reshape(target);
  }
  // Every batch dim of size 1 removed; with a dim, that one if its size is 1 (as at::Tensor::squeeze).
  Derived squeeze() const {
    const auto b = self().batch_size();
    std::vector<std::int64_t> keep;
    for (std::size_t d = 0; d < b.size(); ++d)
      if (b[d] != 1) keep.push_back(b[d]);
    return reshape(keep);
  }
  Derived squeeze(std::int64_t dim) const {
    dim = batch_dim(dim, "squeeze");
    if (self().batch_size()[dim] != 1) return self().apply([](const at::Tensor& t) { return t; });
    std::vector<std::int64_t> target = self().batch_size().vec();
    target.erase(target.begin() + dim);
    return with_names(with_batch(target, [&](const at::Tensor& t, c10::IntArrayRef) { return t.squeeze(dim); }),
                      [&](batch_names names) {
                        names.erase(names.begin() + dim);
                        return names;
                      });
  }
  // A new batch dim of size 1 at dim (0..ndim, or negative from the end of the batch dims).
  Derived unsqueeze(std::int64_t dim) const {
    const std::int64_t nb = ndim();
    if (dim < -(nb + 1) || dim > nb)
      throw index_error("TensorDict.unsqueeze: dim " + std::to_string(dim) + " is out of range for batch_size=" +
                        format_sizes(self().batch_size()));
    if (dim < 0) dim += nb + 1;
    std::vector<std::int64_t> target = self().batch_size().vec();
    target.insert(target.begin() + dim, 1);
    return with_names(with_batch(target, [&](const at::Tensor& t, c10::IntArrayRef) { return t.unsqueeze(dim); }),
                      [&](batch_names names) {
                        names.insert(names.begin() + dim, std::nullopt);
                        return names;
                      });
  }
  // The batch dims in the order `dims` (a permutation of 0..ndim-1).
  Derived permute(c10::IntArrayRef dims) const {
    const std::int64_t nb = ndim();
    std::vector<std::int64_t> order;
    std::vector<bool> seen(static_cast<std::size_t>(nb));
    for (auto d : dims) {
      const auto k = d < 0 ? d + nb : d;
      if (dims.size() != static_cast<std::size_t>(nb) || k < 0 || k >= nb || seen[k])
        throw index_error("TensorDict.permute: " + format_sizes(dims) + " is not a permutation of the " + std::to_string(nb) +
                          " batch dims of batch_size=" + format_sizes(self().batch_size()));
      seen[k] = true;
      order.push_back(k);
    }
    std::vector<std::int64_t> target;
    for (auto k : order) target.push_back(self().batch_size()[k]);
    return with_names(with_batch(target, [&](const at::Tensor& t, c10::IntArrayRef) {
      std::vector<std::int64_t> all = order;
      for (std::int64_t d = nb; d < t.dim(); ++d) all.push_back(d);
      return t.permute(all);
    }), [&](const batch_names& old) {
      batch_names out;
      for (auto k : order) out.push_back(old[k]);
      return out;
    });
  }
  Derived transpose(std::int64_t dim0, std::int64_t dim1) const {
    dim0 = batch_dim(dim0, "transpose");
    dim1 = batch_dim(dim1, "transpose");
    std::vector<std::int64_t> target = self().batch_size().vec();
    std::swap(target[dim0], target[dim1]);
    return with_names(with_batch(target, [&](const at::Tensor& t, c10::IntArrayRef) { return t.transpose(dim0, dim1); }),
                      [&](batch_names names) {
                        std::swap(names[dim0], names[dim1]);
                        return names;
                      });
  }

  // Pieces along a batch dim, views: of `size` each (the last may be smaller),
  // or of the given sizes (which must add up to the dim's size).
  std::vector<Derived> split(std::int64_t size, std::int64_t dim = 0) const {
    dim = batch_dim(dim, "split");
    if (size <= 0) throw value_error("TensorDict.split: the size " + std::to_string(size) + " is not positive");
    const std::int64_t n = self().batch_size()[dim];
    std::vector<std::int64_t> sizes;
    for (std::int64_t start = 0; start < n; start += size) sizes.push_back(std::min(size, n - start));
    return pieces(sizes, dim);
  }
  std::vector<Derived> split(c10::IntArrayRef sizes, std::int64_t dim = 0) const {
    dim = batch_dim(dim, "split");
    const std::int64_t total = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
    if (total != self().batch_size()[dim] || std::any_of(sizes.begin(), sizes.end(), [](auto s) { return s < 0; }))
      throw shape_error("TensorDict.split: the sizes " + format_sizes(sizes) + " do not add up to batch dim " + std::to_string(dim) +
                        " of batch_size=" + format_sizes(self().batch_size()));
    return pieces(std::vector<std::int64_t>(sizes.begin(), sizes.end()), dim);
  }
  // At most n pieces of equal size (the last may be smaller), as at::Tensor::chunk.
  std::vector<Derived> chunk(std::int64_t n, std::int64_t dim = 0) const {
    if (n <= 0) throw value_error("TensorDict.chunk: the number of chunks " + std::to_string(n) + " is not positive");
    const std::int64_t size = self().batch_size()[batch_dim(dim, "chunk")];
    return split(std::max<std::int64_t>(1, (size + n - 1) / n), dim);
  }

  // ---- batch dim names ----------------------------------------------------------------

  // Python's td.names: one name per batch dim, std::nullopt where a dim has
  // none. Verbs that keep the batch shape keep the names; permute, transpose,
  // squeeze and unsqueeze move them with their dims; other shape changes drop them.
  batch_names names() const { return names_or_none(self().stored_names(), self().batch_size().size()); }
  // Names the batch dims in place (Python's refine_names): a dim already named keeps its name.
  Derived& refine_names(const batch_names& names) {
    check_nameable("refine_names");
    self().stored_names() = refined_names(self().stored_names(), names, self().batch_size(), "refine_names");
    return static_cast<Derived&>(*this);
  }
  // The same tensors with the batch dims named `names` (Python's rename(*names)); rename_ in place.
  Derived rename(const batch_names& names) const {
    Derived out = self().apply([](const at::Tensor& t) { return t; });
    out.stored_names() = checked_names(names, self().batch_size(), "rename");
    return out;
  }
  Derived& rename_(const batch_names& names) {
    check_nameable("rename_");
    self().stored_names() = checked_names(names, self().batch_size(), "rename_");
    return static_cast<Derived&>(*this);
  }

  // ---- element-wise ----------------------------------------------------------------

  // Writes value where mask (batch-shaped, or its leading dims) is true, in every leaf.
  Derived& masked_fill_(const at::Tensor& mask, const at::Scalar& value) {
    check_batch_tensor(mask, "masked_fill_");
    return apply_([&](at::Tensor& t) { t.masked_fill_(right_aligned(mask, t), value); });
  }
  Derived masked_fill(const at::Tensor& mask, const at::Scalar& value) const {
    check_batch_tensor(mask, "masked_fill");
    return self().apply([&](const at::Tensor& t) { return t.masked_fill(right_aligned(mask, t), value); });
  }
  // Leaves of this where cond (batch-shaped) is true, else of other (the same keys) or the scalar;
  // each leaf's dtype is torch's promotion of the two (an int64 leaf and 0.5 give float32).
  Derived where(const at::Tensor& cond, const Derived& other) const {
    check_batch_tensor(cond, "where");
    return self().compare(other, "where", [&](const at::Tensor& a, const at::Tensor& b) {
      const at::ScalarType type = at::result_type(a, b);
      return a.to(type).where(right_aligned(cond, a), b.to(type));
    });
  }
  Derived where(const at::Tensor& cond, const at::Scalar& other) const {
    check_batch_tensor(cond, "where");
    return self().apply([&](const at::Tensor& t) {
      const at::ScalarType type = at::result_type(t, other);
      return t.to(type).where(right_aligned(cond, t), at::scalar_tensor(other, t.options().dtype(type)));
    });
  }

  // Leaf-wise arithmetic with a TensorDict of the same keys and batch size, or a scalar.
  Derived operator+(const Derived& o) const { return paired(o, "+", [](auto& a, auto& b) { return a.add(b); }); }
  Derived operator-(const Derived& o) const { return paired(o, "-", [](auto& a, auto& b) { return a.sub(b); }); }
  Derived operator*(const Derived& o) const { return paired(o, "*", [](auto& a, auto& b) { return a.mul(b); }); }
  Derived operator/(const Derived& o) const { return paired(o, "/", [](auto& a, auto& b) { return a.div(b); }); }
  Derived operator+(const at::Scalar& s) const { return self().apply([&](const at::Tensor& t) { return t.add(s); }); }
  Derived operator-(const at::Scalar& s) const { return self().apply([&](const at::Tensor& t) { return t.sub(s); }); }
  Derived operator*(const at::Scalar& s) const { return self().apply([&](const at::Tensor& t) { return t.mul(s); }); }
  Derived operator/(const at::Scalar& s) const { return self().apply([&](const at::Tensor& t) { return t.div(s); }); }
  friend Derived operator+(const at::Scalar& s, const Derived& td) { return td + s; }
  friend Derived operator*(const at::Scalar& s, const Derived& td) { return td * s; }
  friend Derived operator-(const at::Scalar& s, const Derived& td) {
    return td.apply([&](const at::Tensor& t) { return at::rsub(t, s); });  // promotes as s - t does in Python
  }
  Derived operator-() const { return neg(); }

  // In place: every pair is checked (keys, batch size) before the first leaf is written.
  Derived& add_(const Derived& o) { return paired_(o, "add_", [](at::Tensor& a, const at::Tensor& b) { a.add_(b); }); }
  Derived& sub_(const Derived& o) { return paired_(o, "sub_", [](at::Tensor& a, const at::Tensor& b) { a.sub_(b); }); }
  Derived& mul_(const Derived& o) { return paired_(o, "mul_", [](at::Tensor& a, const at::Tensor& b) { a.mul_(b); }); }
  Derived& div_(const Derived& o) { return paired_(o, "div_", [](at::Tensor& a, const at::Tensor& b) { a.div_(b); }); }
  Derived& add_(const at::Scalar& s) { return apply_([&](at::Tensor& t) { t.add_(s); }); }
  Derived& sub_(const at::Scalar& s) { return apply_([&](at::Tensor& t) { t.sub_(s); }); }
  Derived& mul_(const at::Scalar& s) { return apply_([&](at::Tensor& t) { t.mul_(s); }); }
  Derived& div_(const at::Scalar& s) { return apply_([&](at::Tensor& t) { t.div_(s); }); }

  // Python's td.lerp_(end, weight): each leaf moved towards end's leaf at its key by weight, leaf +
  // weight * (end - leaf) (a soft target update: target.lerp_(online, 1 - tau)). weight is a scalar
  // or a tensor that broadcasts to every leaf; leaf, end and a tensor weight share a dtype, as torch.lerp
  // needs. Keys, batch sizes, dtypes and shapes are checked before the first leaf is written.
  Derived& lerp_(const Derived& end, const at::Scalar& weight) {
    return lerped_(end, nullptr, [&](at::Tensor& a, const at::Tensor& b) { a.lerp_(b, weight); });
  }
  Derived& lerp_(const Derived& end, const at::Tensor& weight) {
    return lerped_(end, &weight, [&](at::Tensor& a, const at::Tensor& b) { a.lerp_(b, weight); });
  }
  Derived lerp(const Derived& end, const at::Scalar& weight) const {
    return lerped(end, nullptr, [&](const at::Tensor& a, const at::Tensor& b) { return a.lerp(b, weight); });
  }
  Derived lerp(const Derived& end, const at::Tensor& weight) const {
    return lerped(end, &weight, [&](const at::Tensor& a, const at::Tensor& b) { return a.lerp(b, weight); });
  }

  Derived abs() const { return self().apply([](const at::Tensor& t) { return t.abs(); }); }
  Derived neg() const { return self().apply([](const at::Tensor& t) { return t.neg(); }); }
  Derived exp() const { return self().apply([](const at::Tensor& t) { return t.exp(); }); }
  Derived log() const { return self().apply([](const at::Tensor& t) { return t.log(); }); }
  Derived sqrt() const { return self().apply([](const at::Tensor& t) { return t.sqrt(); }); }
  Derived clamp(const std::optional<at::Scalar>& min, const std::optional<at::Scalar>& max = std::nullopt) const {
    c10::optional<at::Scalar> low, high;  // c10::optional is not std::optional in libtorch 1.13
    if (min) low = *min;
    if (max) high = *max;
    return self().apply([&](const at::Tensor& t) { return t.clamp(low, high); });
  }

  // The 2-norm of each leaf (all its elements), as a TensorDict with batch_size [] (Python's td.norm()).
  Derived norm() const {
    return self().map_leaves([](const at::Tensor& t) { return t.norm(); }, std::vector<std::int64_t>{}, nested_batch::parent);
  }

  // Reductions as Python's: without a dim, every leaf to a scalar (batch_size
  // []); over one batch dim, or a list of them (all batch dims: the batch
  // reduced, each leaf keeping its own dims), with keepdim.
  Derived sum() const {
    return self().map_leaves([](const at::Tensor& t) { return t.sum(); }, std::vector<std::int64_t>{}, nested_batch::parent);
  }
  Derived sum(std::int64_t dim, bool keepdim = false) const {
    return reduced(dim, keepdim, "sum", [](const at::Tensor& t, std::int64_t d, bool k) { return t.sum(d, k); });
  }
  Derived sum(c10::IntArrayRef dims, bool keepdim = false) const {
    return reduced(dims, keepdim, "sum", [](const at::Tensor& t, std::int64_t d, bool k) { return t.sum(d, k); });
  }
  Derived mean() const {
    return self().map_leaves([](const at::Tensor& t) { return t.mean(); }, std::vector<std::int64_t>{}, nested_batch::parent);
  }
  Derived mean(std::int64_t dim, bool keepdim = false) const {
    return reduced(dim, keepdim, "mean", [](const at::Tensor& t, std::int64_t d, bool k) { return t.mean(d, k); });
  }
  Derived mean(c10::IntArrayRef dims, bool keepdim = false) const {
    return reduced(dims, keepdim, "mean", [](const at::Tensor& t, std::int64_t d, bool k) { return t.mean(d, k); });
  }
  Derived max() const {
    return self().map_leaves([](const at::Tensor& t) { return t.max(); }, std::vector<std::int64_t>{}, nested_batch::parent);
  }
  Derived max(std::int64_t dim, bool keepdim = false) const {
    return reduced(dim, keepdim, "max", [](const at::Tensor& t, std::int64_t d, bool k) { return t.amax(d, k); });
  }
  Derived max(c10::IntArrayRef dims, bool keepdim = false) const {
    return reduced(dims, keepdim, "max", [](const at::Tensor& t, std::int64_t d, bool k) { return t.amax(d, k); });
  }
  Derived min() const {
    return self().map_leaves([](const at::Tensor& t) { return t.min(); }, std::vector<std::int64_t>{}, nested_batch::parent);
  }
  Derived min(std::int64_t dim, bool keepdim = false) const {
    return reduced(dim, keepdim, "min", [](const at::Tensor& t, std::int64_t d, bool k) { return t.amin(d, k); });
  }
  Derived min(c10::IntArrayRef dims, bool keepdim = false) const {
    return reduced(dims, keepdim, "min", [](const at::Tensor& t, std::int64_t d, bool k) { return t.amin(d, k); });
  }

 protected:
  // The batch size of index(batch) (detail::indexed_batch).
  std::vector<std::int64_t> indexed_batch(c10::ArrayRef<at::indexing::TensorIndex> batch, const char* op) const {
    return detail::indexed_batch(self().batch_size(), batch, op);
  }

  // The consolidated buffer where moving it moves every leaf: none requires grad while autograd records.
  at::Tensor one_buffer() const { return one_buffer_of(self().values()); }
  // This TensorDict's structure with each leaf a view of `storage` (consolidate()'s layout).
  Derived over_storage(const at::Tensor& storage, std::optional<at::Device> device = std::nullopt) const {
    const std::vector<at::Tensor> views = views_of(storage, self().values());
    std::size_t k = 0;
    const auto view = [&](const at::Tensor&) { return views[k++]; };
    return device ? self().apply(view, self().batch_size(), device) : self().apply(view);
  }

  using pending_write = detail::pending_write;
  // Checks every write, then makes them all (detail::write_at); name_of(k) names write k's key path in errors.
  template <class NameOf>
  Derived& write_at(std::vector<pending_write>& writes, c10::ArrayRef<at::indexing::TensorIndex> indices, const char* op,
                    const NameOf& name_of) {
    detail::write_at(self().batch_size(), writes, indices, op, name_of);
    return static_cast<Derived&>(*this);
  }

  // Names live with the root's batch dims; a nested view with dims of its own cannot name them in place.
  void check_nameable(const char* op) const {
    if (self().named_dims() != self().batch_size().size())
      throw value_error(std::string("TensorDict.") + op + ": this nested TensorDict has batch_size=" +
                        format_sizes(self().batch_size()) + ", longer than the root's " + std::to_string(self().named_dims()) +
                        " batch dims, which alone carry names; name a copy (rename(...)) or the root");
  }
  std::int64_t batch_dim(std::int64_t dim, const char* op) const {
    const auto nb = static_cast<std::int64_t>(self().batch_size().size());
    if (dim < -nb || dim >= nb)
      throw index_error(std::string("TensorDict.") + op + ": dim " + std::to_string(dim) +
                        " is out of range for batch_size=" + format_sizes(self().batch_size()));
    return dim < 0 ? dim + nb : dim;
  }


  // The batch shape `shape` with one -1 resolved, checked against numel().
  std::vector<std::int64_t> resolved_shape(c10::IntArrayRef shape, const char* op) const {
    std::vector<std::int64_t> out(shape.begin(), shape.end());
    std::int64_t known = 1, inferred = -1;
    for (std::size_t d = 0; d < out.size(); ++d) {
      if (out[d] == -1 && inferred < 0) inferred = static_cast<std::int64_t>(d);
      else if (out[d] < 0) throw shape_error(std::string("TensorDict.") + op + ": the shape " + format_sizes(shape) + " is invalid");
      else known *= out[d];
    }
    const std::int64_t n = numel();
    if (inferred >= 0) {
      if (known == 0 || n % known != 0)
        throw shape_error(std::string("TensorDict.") + op + ": batch_size=" + format_sizes(self().batch_size()) + " cannot be " +
                          format_sizes(shape));
      out[inferred] = n / known;
    } else if (known != n) {
      throw shape_error(std::string("TensorDict.") + op + ": batch_size=" + format_sizes(self().batch_size()) + " (" +
                        std::to_string(n) + " elements) cannot be " + format_sizes(shape));
    }
    return out;
  }
  static std::vector<std::int64_t> joined(c10::IntArrayRef batch, c10::IntArrayRef leaf) {
    std::vector<std::int64_t> out(batch.begin(), batch.end());
    out.insert(out.end(), leaf.begin(), leaf.end());
    return out;
  }
  // `out` (a new TensorDict) with this one's batch dim names as `move` places them.
  template <class Move>
  Derived with_names(Derived out, Move&& move) const {
    const batch_names mine = self().names();
    if (std::any_of(mine.begin(), mine.end(), [](const auto& n) { return n.has_value(); })) out.rename_(move(mine));
    return out;
  }
  // f moves the batch dims (index, select, reshape, expand...): applied to
  // every leaf, and where the TensorDict has non-tensor entries
  // (AnyTensorDict's), to the positions of a NonTensorStack's values.
  template <class F>
  Derived rearranged(F&& f, c10::IntArrayRef batch) const {
    if constexpr (requires { self().rearranged_entries(f, batch); }) return self().rearranged_entries(f, batch);
    else return self().apply(std::forward<F>(f), batch);
  }
  // f(leaf, the leaf's own dims) for every leaf, into a TensorDict of batch size `batch`.
  template <class F>
  Derived with_batch(c10::IntArrayRef batch, F&& f) const {
    const auto nb = self().batch_size().size();
    return rearranged([&](const at::Tensor& t) { return f(t, t.sizes().slice(nb)); }, batch);
  }
  std::vector<Derived> pieces(const std::vector<std::int64_t>& sizes, std::int64_t dim) const {
    std::vector<Derived> out;
    std::int64_t start = 0;
    for (auto size : sizes) {
      std::vector<std::int64_t> batch = self().batch_size().vec();
      batch[dim] = size;
      out.push_back(rearranged([&](const at::Tensor& t) { return t.narrow(dim, start, size); }, batch));
      start += size;
    }
    return out;
  }
  // A mask or condition over the batch dims (all, or the leading ones).
  void check_batch_tensor(const at::Tensor& mask, const char* op) const {
    const auto b = self().batch_size();
    if (mask.dim() > static_cast<std::int64_t>(b.size()) || !std::equal(mask.sizes().begin(), mask.sizes().end(), b.begin()))
      throw shape_error(std::string("TensorDict.") + op + ": the mask's shape " + format_sizes(mask.sizes()) +
                        " is not batch_size=" + format_sizes(b) + " (or its leading dims)");
  }
  // The mask with trailing dims of size 1, so that it broadcasts over the leaf's own dims.
  static at::Tensor right_aligned(const at::Tensor& mask, const at::Tensor& leaf) {
    std::vector<std::int64_t> shape = mask.sizes().vec();
    shape.resize(static_cast<std::size_t>(std::max<std::int64_t>(leaf.dim(), mask.dim())), 1);
    return mask.reshape(shape);
  }
  void check_same_batch(const Derived& o, const char* op) const {
    if (!self().batch_size().equals(o.batch_size())) detail::throw_batch_sizes_differ(self().batch_size(), o.batch_size(), op);
  }
  // This side's leaves and end's (in this side's order), after lerp's checks: batch size, keys,
  // and leaf by leaf, end's leaf and a tensor weight of the leaf's dtype, each broadcasting to the leaf.
  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> lerp_leaves(const Derived& end, const at::Tensor* weight,
                                                                          const char* op) const {
    check_same_batch(end, op);
    std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> leaves{
        self().values(), self().compare(end, op, [](const at::Tensor&, const at::Tensor& b) { return b; }).values()};
    // The keys only name a leaf in an error message: listed only then.
    detail::check_lerp_leaves(leaves.first, leaves.second, weight, op,
                              [&](std::size_t i) { return Derived::key_name(self().keys()[i]); });
    return leaves;
  }
  // lerp_'s writes: f(leaf, end's leaf) for each, after every check.
  template <class F>
  Derived& lerped_(const Derived& end, const at::Tensor* weight, F&& f) {
    auto [mine, theirs] = lerp_leaves(end, weight, "lerp_");
    for (std::size_t i = 0; i < mine.size(); ++i) f(mine[i], theirs[i]);
    return static_cast<Derived&>(*this);
  }
  // lerp's result: f(leaf, end's leaf) for each, in apply's order (values()'s), after every check.
  template <class F>
  Derived lerped(const Derived& end, const at::Tensor* weight, F&& f) const {
    const std::vector<at::Tensor> theirs = lerp_leaves(end, weight, "lerp").second;
    std::size_t k = 0;
    return self().apply([&](const at::Tensor& a) { return f(a, theirs[k++]); });
  }
  template <class F>
  Derived paired(const Derived& o, const char* op, F&& f) const {
    check_same_batch(o, op);
    return self().compare(o, op, f);
  }
  template <class F>
  Derived& paired_(const Derived& o, const char* op, F&& f) {
    check_same_batch(o, op);
    // The other side's leaves in this side's order; a missing key throws before any write.
    const Derived others = self().compare(o, op, [](const at::Tensor&, const at::Tensor& b) { return b; });
    std::vector<at::Tensor> mine = self().values(), theirs = others.values();
    for (std::size_t i = 0; i < mine.size(); ++i) f(mine[i], theirs[i]);
    return static_cast<Derived&>(*this);
  }
  // The batch dims reduced one by one, the last first, so that each index still names its dim.
  // f(leaf, d, keepdim) over the batch dims `dims` (each once), the last first.
  template <class F>
  Derived reduced(c10::IntArrayRef dims, bool keepdim, const char* op, F&& f) const {
    std::vector<std::int64_t> ds;
    for (auto d : dims) ds.push_back(batch_dim(d, op));
    std::sort(ds.begin(), ds.end(), std::greater<>());
    if (std::adjacent_find(ds.begin(), ds.end()) != ds.end())
      throw index_error(std::string("TensorDict.") + op + ": the dims " + format_sizes(dims) + " name one dim twice");
    std::vector<std::int64_t> target = self().batch_size().vec();
    for (auto d : ds) {
      if (keepdim) target[d] = 1;
      else target.erase(target.begin() + d);
    }
    return self().apply(
        [&](const at::Tensor& t) {
          at::Tensor r = t;
          for (auto d : ds) r = f(r, d, keepdim);
          return r;
        },
        target);
  }
  template <class F>
  Derived reduced(std::int64_t dim, bool keepdim, const char* op, F&& f) const {
    return reduced(c10::IntArrayRef(dim), keepdim, op, std::forward<F>(f));
  }

 private:
  const Derived& self() const { return static_cast<const Derived&>(*this); }
};

}  // namespace tensordict::detail

namespace tensordict {

// Pads the batch dims with `value`: pads holds (before, after) pairs from the
// first batch dim on, as Python's tensordict.pad(td, pad_size, value).
template <class TD>
  requires std::is_base_of_v<detail::tensordict_ops<TD>, TD>
TD pad(const TD& td, c10::IntArrayRef pads, const at::Scalar& value = 0) {
  const auto b = td.batch_size();
  if (pads.size() % 2 != 0 || pads.size() / 2 > b.size())
    throw shape_error("tensordict::pad: " + format_sizes(pads) + " is not (before, after) pairs for at most the " +
                      std::to_string(b.size()) + " batch dims of batch_size=" + format_sizes(b));
  std::vector<std::int64_t> target = b.vec();
  for (std::size_t d = 0; d < pads.size() / 2; ++d) {
    target[d] += pads[2 * d] + pads[2 * d + 1];
    if (target[d] < 0) throw shape_error("tensordict::pad: " + format_sizes(pads) + " leaves batch dim " + std::to_string(d) + " negative");
  }
  return td.apply(
      [&](const at::Tensor& t) {
        // constant_pad_nd's pairs start at the last dim.
        std::vector<std::int64_t> reversed(2 * static_cast<std::size_t>(t.dim()), 0);
        for (std::size_t d = 0; d < pads.size() / 2; ++d) {
          const std::size_t from_end = static_cast<std::size_t>(t.dim()) - 1 - d;
          reversed[2 * from_end] = pads[2 * d];
          reversed[2 * from_end + 1] = pads[2 * d + 1];
        }
        return at::constant_pad_nd(t, reversed, value);
      },
      target);
}

}  // namespace tensordict

#if TENSORDICT_DEFINITIONS
namespace tensordict::detail {
TENSORDICT_DECL std::string format_names(const batch_names& names) {
  std::string out = "[";
  for (std::size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + (names[i] ? '"' + *names[i] + '"' : std::string("None"));
  return out + "]";
}

TENSORDICT_DECL batch_names checked_names(const batch_names& names, c10::IntArrayRef batch, const char* op) {
  if (names.size() != batch.size())
    throw value_error(std::string("TensorDict.") + op + ": " + std::to_string(names.size()) + " names " + format_names(names) +
                      " for the " + std::to_string(batch.size()) + " batch dims of batch_size=" + format_sizes(batch));
  for (std::size_t i = 0; i < names.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (names[i] && names[j] == names[i])
        throw value_error(std::string("TensorDict.") + op + ": the name \"" + *names[i] + "\" is given to two batch dims " + format_names(names));
  if (std::none_of(names.begin(), names.end(), [](const auto& n) { return n.has_value(); })) return {};
  return names;
}

TENSORDICT_DECL std::vector<std::int64_t> nested_batch_size(nested_batch rule, c10::IntArrayRef old_node, c10::IntArrayRef old_parent, c10::IntArrayRef new_parent) {
  std::vector<std::int64_t> out(new_parent.begin(), new_parent.end());
  if (rule == nested_batch::follow && old_node.size() > old_parent.size())
    out.insert(out.end(), old_node.begin() + static_cast<std::ptrdiff_t>(old_parent.size()), old_node.end());
  if (rule == nested_batch::setter && old_node.size() >= new_parent.size()) out.assign(old_node.begin(), old_node.end());
  return out;
}

TENSORDICT_DECL std::vector<std::int64_t> common_batch(const std::vector<c10::IntArrayRef>& shapes, c10::IntArrayRef fallback, std::optional<std::size_t> max_dims) {
  std::vector<std::int64_t> out = shapes.empty() ? fallback.vec() : shapes[0].vec();
  for (const auto& s : shapes) {
    std::size_t n = 0;
    while (n < out.size() && n < s.size() && out[n] == s[n]) ++n;
    out.resize(n);
  }
  if (max_dims && out.size() > *max_dims) out.resize(*max_dims);
  return out;
}

TENSORDICT_DECL batch_names refined_names(const batch_names& stored, const batch_names& names, c10::IntArrayRef batch, const char* op) {
  batch_names out = checked_names(names, batch, op);
  const batch_names old = names_or_none(stored, batch.size());
  for (std::size_t i = 0; i < old.size() && !out.empty(); ++i)
    if (old[i] && out[i] != old[i])
      throw value_error(std::string("TensorDict.") + op + ": batch dim " + std::to_string(i) + " is named \"" + *old[i] +
                        "\" and cannot be renamed " + format_names(names) + "; use rename(...)");
  return out.empty() ? stored : out;
}

TENSORDICT_DECL void check_copy(const at::Tensor& leaf, const at::Tensor& value, const char* op, const std::string& path) {
  bool fits = value.dim() <= leaf.dim();
  for (std::int64_t d = 1; fits && d <= value.dim(); ++d) {
    const auto v = value.size(value.dim() - d);
    fits = v == 1 || v == leaf.size(leaf.dim() - d);
  }
  if (!fits)
    throw shape_error(std::string(op) + "(" + path + "): cannot write " + describe(value) + " into the leaf, which is " +
                      describe(leaf) + " (the value must broadcast to the leaf's shape)");
}

TENSORDICT_DECL std::vector<at::indexing::TensorIndex> batch_indices(c10::ArrayRef<at::indexing::TensorIndex> indices, std::size_t batch_dims) {
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

TENSORDICT_DECL std::string written_through_file(const std::vector<at::Tensor>& leaves) {
  for (const at::Tensor& t : leaves)
    if (t.defined() && t.has_storage() && t.is_cpu() && t.numel() > 0)
      if (std::string file = shared_file_at(t.data_ptr()); !file.empty()) return file;
  return {};
}

// Whether t broadcasts to `shape` without growing it (the rule of an in-place op's other operand).
inline bool broadcasts_to(const at::Tensor& t, c10::IntArrayRef shape) {
  const auto dims = static_cast<std::int64_t>(shape.size());
  bool fits = t.dim() <= dims;
  for (std::int64_t d = 1; fits && d <= t.dim(); ++d) fits = t.size(-d) == 1 || t.size(-d) == shape[dims - d];
  return fits;
}

TENSORDICT_DECL void throw_batch_sizes_differ(c10::IntArrayRef mine, c10::IntArrayRef theirs, const char* op) {
  throw shape_error(std::string("TensorDict ") + op + ": batch_size=" + format_sizes(mine) + " and batch_size=" +
                    format_sizes(theirs) + " differ");
}

TENSORDICT_DECL void check_lerp_leaves(const std::vector<at::Tensor>& mine, const std::vector<at::Tensor>& theirs,
                                       const at::Tensor* weight, const char* op,
                                       c10::function_ref<std::string(std::size_t)> name_of) {
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const auto where = [&] { return std::string("TensorDict.") + op + "(" + name_of(i) + "): "; };
    if (theirs[i].scalar_type() != mine[i].scalar_type())
      throw dtype_error(where() + "the leaf is " + describe(mine[i]) + " and end's " + describe(theirs[i]) +
                        "; lerp needs one dtype (convert end with .to(...))");
    if (!broadcasts_to(theirs[i], mine[i].sizes()))
      throw shape_error(where() + "end's " + describe(theirs[i]) + " does not broadcast to the leaf " + describe(mine[i]));
    if (!weight) continue;
    if (weight->scalar_type() != mine[i].scalar_type())
      throw dtype_error(where() + "the weight is " + describe(*weight) + " and the leaf " + describe(mine[i]) +
                        "; lerp needs one dtype (a scalar weight takes any)");
    if (!broadcasts_to(*weight, mine[i].sizes()))
      throw shape_error(where() + "the weight " + describe(*weight) + " does not broadcast to the leaf " + describe(mine[i]));
  }
}

TENSORDICT_DECL std::vector<std::int64_t> consolidated_offsets(const std::vector<at::Tensor>& leaves) {
  std::vector<std::int64_t> out;
  std::int64_t end = 0;
  for (const at::Tensor& t : leaves) {
    const std::int64_t align = std::max<std::int64_t>(8, static_cast<std::int64_t>(t.element_size()));
    end = (end + align - 1) / align * align;
    out.push_back(end);
    end += t.numel() * static_cast<std::int64_t>(t.element_size());
  }
  out.push_back(end);
  return out;
}

TENSORDICT_DECL at::Tensor consolidated_storage_of(const std::vector<at::Tensor>& leaves) {
  if (leaves.empty() || !leaves.front().has_storage()) return {};
  const std::vector<std::int64_t> offsets = consolidated_offsets(leaves);
  const c10::Storage& storage = leaves.front().storage();
  if (static_cast<std::int64_t>(storage.nbytes()) != offsets.back()) return {};
  for (std::size_t k = 0; k < leaves.size(); ++k) {
    const at::Tensor& t = leaves[k];
    if (!t.has_storage() || !t.storage().is_alias_of(storage) || !t.is_contiguous() ||
        t.storage_offset() * static_cast<std::int64_t>(t.element_size()) != offsets[k])
      return {};
  }
  return at::empty({0}, at::TensorOptions(at::kByte).device(storage.device())).set_(storage, 0, {offsets.back()}, {1});
}

TENSORDICT_DECL at::Tensor one_buffer_of(const std::vector<at::Tensor>& leaves) {
  if (at::GradMode::is_enabled())
    for (const at::Tensor& t : leaves)
      if (t.requires_grad()) return {};
  return consolidated_storage_of(leaves);
}

TENSORDICT_DECL std::vector<at::Tensor> views_of(const at::Tensor& storage, const std::vector<at::Tensor>& leaves) {
  const std::vector<std::int64_t> offsets = consolidated_offsets(leaves);
  std::vector<at::Tensor> out;
  out.reserve(leaves.size());
  for (std::size_t k = 0; k < leaves.size(); ++k) {
    const at::Tensor& t = leaves[k];
    const std::int64_t bytes = t.numel() * static_cast<std::int64_t>(t.element_size());
    out.push_back(storage.narrow(0, offsets[k], bytes).view(t.scalar_type()).view(t.sizes()));
  }
  return out;
}

TENSORDICT_DECL std::vector<std::int64_t> expanded_batch(c10::IntArrayRef batch, c10::IntArrayRef shape) {
  const std::size_t nb = batch.size();
  if (shape.size() < nb)
    throw shape_error("TensorDict.expand: the shape " + format_sizes(shape) + " has fewer dims than batch_size=" + format_sizes(batch));
  std::vector<std::int64_t> target(shape.begin(), shape.end());
  const std::size_t lead = shape.size() - nb;
  for (std::size_t d = 0; d < nb; ++d) {
    if (target[lead + d] == -1) target[lead + d] = batch[d];
    if (target[lead + d] != batch[d] && batch[d] != 1)
      throw shape_error("TensorDict.expand: cannot expand batch_size=" + format_sizes(batch) + " to " + format_sizes(shape));
  }
  return target;
}

TENSORDICT_DECL at::Tensor expanded_leaf(const at::Tensor& leaf, c10::IntArrayRef target, std::size_t batch_dims) {
  std::vector<std::int64_t> full(target.begin(), target.end());
  full.insert(full.end(), leaf.sizes().begin() + static_cast<std::ptrdiff_t>(batch_dims), leaf.sizes().end());
  return leaf.expand(full);
}

TENSORDICT_DECL std::vector<std::int64_t> indexed_batch(c10::IntArrayRef b, c10::ArrayRef<at::indexing::TensorIndex> batch,
                                                        const char* op) {
  if (const auto rows = leading_rows(b, batch); rows.kind != row_index::other) {
    std::vector<std::int64_t> out;
    if (rows.kind != row_index::single) out.push_back(rows.count);
    out.insert(out.end(), b.begin() + 1, b.end());
    if (rows.kind == row_index::single && (rows.start < 0 || rows.start >= b[0]))  // named as given: -9, not its normalised -1
      throw index_error(std::string("TensorDict.") + op + ": the index does not fit batch_size=" + format_sizes(b) + ": index " +
                        std::to_string(compat::as_int(batch[0].integer())) + " is out of bounds for batch dim 0 of size " +
                        std::to_string(b[0]));
    if (rows.kind == row_index::list)
      for (std::int64_t k = 0; k < rows.count; ++k)
        if (rows.list[k] < -b[0] || rows.list[k] >= b[0])
          throw index_error(std::string("TensorDict.") + op + ": the index does not fit batch_size=" + format_sizes(b) +
                            ": index " + std::to_string(rows.list[k]) + " is out of bounds for batch dim 0 of size " +
                            std::to_string(b[0]));
    return out;
  }
  at::Device probe_device = at::kCPU;
  for (const auto& i : batch)
    if (i.is_tensor()) probe_device = i.tensor().device();
  try {
    return at::zeros({}, at::TensorOptions(at::kByte).device(probe_device)).expand(b).index(batch).sizes().vec();
  } catch (const c10::Error& e) {
    throw index_error(std::string("TensorDict.") + op + ": the index does not fit batch_size=" + format_sizes(b) + ": " +
                      e.what_without_backtrace());
  }
}

TENSORDICT_DECL leading_rows_t leading_rows(c10::IntArrayRef b, c10::ArrayRef<at::indexing::TensorIndex> batch) {
  leading_rows_t out;
  if (b.empty() || batch.size() != b.size()) return out;
  for (std::size_t d = 1; d < batch.size(); ++d) {
    if (!batch[d].is_slice()) return out;
    const auto& s = batch[d].slice();
    if (compat::as_int(s.start()) != 0 || compat::as_int(s.step()) != 1 || compat::as_int(s.stop()) < b[d]) return out;
  }
  const auto& first = batch[0];
  if (first.is_integer()) {
    out.kind = row_index::single;
    const std::int64_t i = compat::as_int(first.integer());
    out.start = i < 0 ? i + b[0] : i;
  } else if (first.is_slice()) {
    const auto& s = first.slice();
    if (compat::as_int(s.step()) != 1) return out;
    auto bound = [&](std::int64_t v) { return std::clamp<std::int64_t>(v < 0 ? v + b[0] : v, 0, b[0]); };
    out.kind = row_index::range;
    out.start = bound(compat::as_int(s.start()));
    out.count = std::max<std::int64_t>(bound(compat::as_int(s.stop())) - out.start, 0);
  } else if (first.is_tensor()) {
    const at::Tensor& t = first.tensor();
    if (t.scalar_type() != at::kLong || t.dim() != 1 || !t.is_cpu() || !t.is_contiguous()) return out;
    out.kind = row_index::list;
    out.count = t.size(0);
    out.list = t.data_ptr<std::int64_t>();
  }
  return out;
}

TENSORDICT_DECL bool copy_rows(const at::Tensor& leaf, const at::Tensor& value, const leading_rows_t& rows, c10::IntArrayRef target) {
  if (rows.kind == row_index::other || !leaf.is_cpu() || leaf.layout() != at::kStrided || !leaf.is_contiguous() ||
      leaf.is_inference() || !value.is_cpu() || value.layout() != at::kStrided || !value.is_contiguous() ||
      value.scalar_type() != leaf.scalar_type() || value.sizes() != target ||
      (at::GradMode::is_enabled() && (leaf.requires_grad() || value.requires_grad())))
    return false;
  const std::int64_t row = leaf.size(0) == 0 ? 0 : static_cast<std::int64_t>(leaf.nbytes()) / leaf.size(0);
  char* to = static_cast<char*>(leaf.data_ptr());
  const char* from = static_cast<const char*>(value.data_ptr());
  if (rows.kind == row_index::list) {
    const auto at = [&](std::int64_t k) { return rows.list[k] < 0 ? rows.list[k] + leaf.size(0) : rows.list[k]; };
    for (std::int64_t k = 0, run = 1; k < rows.count; k += run) {  // runs of consecutive rows in one memcpy
      for (run = 1; k + run < rows.count && at(k + run) == at(k) + run;) ++run;
      std::memcpy(to + at(k) * row, from + k * row, static_cast<std::size_t>(run * row));
    }
  } else if (value.nbytes() > 0) {
    std::memcpy(to + rows.start * row, from, value.nbytes());
  }
  leaf.unsafeGetTensorImpl()->bump_version();  // as an in-place op: autograd sees the leaf changed
  return true;
}

TENSORDICT_DECL void write_at(c10::IntArrayRef batch_size, std::vector<pending_write>& writes,
                              c10::ArrayRef<at::indexing::TensorIndex> indices, const char* op,
                              c10::function_ref<std::string(std::size_t)> name_of) {
  const std::size_t nb = batch_size.size();
  const auto batch = batch_indices(indices, nb);
  const std::vector<std::int64_t> indexed = indexed_batch(batch_size, batch, op);
  std::vector<c10::SmallVector<std::int64_t, 6>> targets(writes.size());
  for (std::size_t k = 0; k < writes.size(); ++k) {
    pending_write& w = writes[k];
    const auto where = [&] { return std::string("TensorDict.") + op + "(" + name_of(k) + "): "; };
    auto& target = targets[k];
    target.append(indexed.begin(), indexed.end());
    target.append(w.leaf.sizes().begin() + static_cast<std::ptrdiff_t>(nb), w.leaf.sizes().end());
    // Leading dims of size 1 beyond the target's go, as for t[i] = value in torch.
    while (w.value.dim() > static_cast<std::int64_t>(target.size()) && w.value.size(0) == 1) w.value = w.value.squeeze(0);
    bool fits = w.value.dim() <= static_cast<std::int64_t>(target.size());
    for (std::int64_t d = 1; fits && d <= w.value.dim(); ++d) {
      const auto v = w.value.size(w.value.dim() - d);
      fits = v == 1 || v == target[target.size() - static_cast<std::size_t>(d)];
    }
    if (!fits)
      throw shape_error(where() + "cannot write " + describe(w.value) + " at the index, where the leaf " + describe(w.leaf) +
                        " has shape " + format_sizes(target) + " (the value must broadcast to it)");
    if (!c10::canCast(w.value.scalar_type(), w.leaf.scalar_type()))
      throw dtype_error(where() + "cannot write " + describe(w.value) + " into the leaf " + describe(w.leaf) +
                        " (a cast that changes the kind of number); convert the value first with .to(...)");
    if (w.leaf.requires_grad() && w.leaf.is_leaf() && at::GradMode::is_enabled())
      throw value_error(where() + "the leaf " + describe(w.leaf) +
                        " requires grad and is a leaf of the autograd graph, which cannot be written in place; "
                        "write under at::NoGradGuard");
  }
  for (pending_write& w : writes) {
    // A value over the leaf's own memory is read whole before it is overwritten.
    if (w.value.device() != w.leaf.device() || w.value.scalar_type() != w.leaf.scalar_type())
      w.value = w.value.to(w.leaf.device(), w.leaf.scalar_type());
    else if (w.value.is_alias_of(w.leaf))
      w.value = w.value.clone();
  }
  const leading_rows_t rows = leading_rows(batch_size, batch);
  for (std::size_t k = 0; k < writes.size(); ++k)
    if (!copy_rows(writes[k].leaf, writes[k].value, rows, targets[k])) writes[k].leaf.index_put_(batch, writes[k].value);
}
}  // namespace tensordict::detail
#endif  // TENSORDICT_DEFINITIONS
