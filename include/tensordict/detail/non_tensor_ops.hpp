// What the verbs of both TensorDicts do to non-tensor entries (non_tensor.hpp):
// a NonTensorStack's values follow the batch dims by their positions, an
// int64 tensor the verb moves as it moves a leaf.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/TensorIndexing.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <c10/util/accumulate.h>

#include "../errors.hpp"
#include "../non_tensor.hpp"
#include "config.hpp"
#include "format.hpp"

namespace tensordict::detail {

// How a verb moves the batch dims (index, reshape, ...), applied to positions.
using rearrangement = std::function<at::Tensor(const at::Tensor&)>;

// values[p] for each position p of `positions` (int64, any device), row-major.
TENSORDICT_DECL std::vector<non_tensor_value> gathered(const std::vector<non_tensor_value>& values,
                                                      const at::Tensor& positions);

// One value left over an empty batch is a NonTensorData; otherwise a NonTensorStack.
TENSORDICT_DECL NonTensor stacked_or_one(std::vector<non_tensor_value> values, c10::IntArrayRef batch);

// Where a level's leaves are (the first set one's device, else the CPU): the
// device of the positions `carried` rearranges.
template <class Tensors>
at::Device leaves_device(const Tensors& leaves) {
  for (const at::Tensor& t : leaves)
    if (t.defined()) return t.device();
  return at::kCPU;
}

// The entry `v` at `path` of a level going from batch `from` to `to`: a
// NonTensorStack's values follow `rearrange` when given; without it the batch
// size must stay. (`device`: where the level's leaves are, which the verb's
// index tensors suit; only a rearrangement uses it.)
TENSORDICT_DECL NonTensor carried(const NonTensor& v, c10::IntArrayRef from, c10::IntArrayRef to,
                                  const rearrangement* rearrange, const std::string& path, const char* op,
                                  at::Device device = at::kCPU);

// Entries of several TensorDicts (one per TensorDict, over its level's batch
// size `batches[k]`) joined as their leaves are by join(parts) (stack, cat):
// NonTensorData of one value stay one (tensordict 0.4's stack); otherwise
// each value's position is joined, giving a NonTensorStack of batch size `batch`.
template <class Join>
NonTensor joined_non_tensor(const std::vector<NonTensor>& entries, const std::vector<c10::IntArrayRef>& batches,
                            c10::IntArrayRef batch, Join&& join) {
  const bool one_value = std::all_of(entries.begin(), entries.end(), [&](const NonTensor& e) {
    return !e.is_stack() && e.value() == entries.front().value();
  });
  if (one_value) return entries.front();
  std::vector<non_tensor_value> values;
  std::vector<at::Tensor> positions;
  for (std::size_t k = 0; k < entries.size(); ++k) {
    const std::int64_t start = static_cast<std::int64_t>(values.size());
    const auto mine = entries[k].per_element(c10::multiply_integers(batches[k]));
    values.insert(values.end(), mine.begin(), mine.end());
    positions.push_back(at::arange(start, static_cast<std::int64_t>(values.size()), at::kLong).view(batches[k]));
  }
  return NonTensor::stack(gathered(values, at::Tensor(join(positions))), batch.vec());
}

// `theirs` written into `mine` (over a level of batch size `level`) at the
// batch indices `batch` (all of it when empty), as update_at_ writes a leaf:
// the new entry, or nullopt when nothing changes. A NonTensorData given
// another value at some positions becomes a NonTensorStack. `where` starts
// errors. `files`: the file the TensorDict's leaves write through to (empty:
// none), whose folder would keep the old value, so a change is refused
// (value_error) before anything is written; Python tensordict refuses it too.
TENSORDICT_DECL std::optional<NonTensor> non_tensor_written_at(const NonTensor& mine, const NonTensor& theirs,
                                                               c10::IntArrayRef level,
                                                               c10::ArrayRef<at::indexing::TensorIndex> batch,
                                                               const std::string& where, const std::string& files = {});

}  // namespace tensordict::detail

#if TENSORDICT_DEFINITIONS
namespace tensordict::detail {

TENSORDICT_DECL std::vector<non_tensor_value> gathered(const std::vector<non_tensor_value>& values,
                                                      const at::Tensor& positions) {
  const at::Tensor flat = positions.to(at::kCPU).contiguous();
  const std::int64_t* p = flat.data_ptr<std::int64_t>();
  std::vector<non_tensor_value> out;
  out.reserve(static_cast<std::size_t>(flat.numel()));
  for (std::int64_t i = 0; i < flat.numel(); ++i) out.push_back(values[static_cast<std::size_t>(p[i])]);
  return out;
}

TENSORDICT_DECL NonTensor stacked_or_one(std::vector<non_tensor_value> values, c10::IntArrayRef batch) {
  if (batch.empty()) return NonTensor(std::move(values.front()));
  return NonTensor::stack(std::move(values), batch.vec());
}

TENSORDICT_DECL NonTensor carried(const NonTensor& v, c10::IntArrayRef from, c10::IntArrayRef to,
                                  const rearrangement* rearrange, const std::string& path, const char* op,
                                  at::Device device) {
  if (!v.is_stack()) return v;
  if (!rearrange) {
    if (from.equals(to)) return v;
    throw value_error(std::string(op) + ": " + path + " holds one value per batch element (" + v.repr() +
                      "), which cannot follow the batch size from " + format_sizes(from) + " to " + format_sizes(to) +
                      "; exclude it first (td.exclude({" + path + "}))");
  }
  const std::int64_t n = static_cast<std::int64_t>(v.values().size());
  const at::Tensor positions = (*rearrange)(at::arange(n, at::TensorOptions(at::kLong).device(device)).view(from));
  if (!positions.defined() || !positions.sizes().equals(to))
    throw shape_error(std::string(op) + ": the positions of " + path + "'s values came out " +
                      (positions.defined() ? describe(positions) : std::string("undefined")) + ", not of the shape " + format_sizes(to));
  return stacked_or_one(gathered(v.values(), positions), to);
}

TENSORDICT_DECL std::optional<NonTensor> non_tensor_written_at(const NonTensor& mine, const NonTensor& theirs,
                                                               c10::IntArrayRef level,
                                                               c10::ArrayRef<at::indexing::TensorIndex> batch,
                                                               const std::string& where, const std::string& files) {
  const std::int64_t n = c10::multiply_integers(level);
  at::Tensor positions;
  try {
    positions = at::arange(n, at::kLong).view(level);
    if (!batch.empty()) positions = positions.index(batch);  // libtorch refuses an empty index list
  } catch (const c10::Error& e) {
    throw index_error(where + "the index does not fit batch_size=" + format_sizes(level) + ": " + e.what_without_backtrace());
  }
  if (theirs.is_stack() && !positions.sizes().equals(theirs.shape()))
    throw shape_error(where + "cannot write " + theirs.repr() + " at the index, which selects " + format_sizes(positions.sizes()) +
                      " elements");
  if (positions.numel() == 0 || (!mine.is_stack() && !theirs.is_stack() && mine.value() == theirs.value())) return std::nullopt;
  if (!files.empty())
    throw value_error(where + "cannot write " + theirs.repr() + " over " + mine.repr() + ": this TensorDict's leaves write through to " +
                      std::filesystem::path(files).parent_path().string() +
                      " (load_memory::shared), whose meta.json would keep the old value. Write the tensors alone "
                      "(other.exclude(...) the key), or write into a copy (clone())");
  std::vector<non_tensor_value> values = mine.per_element(n);
  const std::vector<non_tensor_value> written = theirs.per_element(positions.numel());
  const at::Tensor flat = positions.contiguous();
  const std::int64_t* p = flat.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < flat.numel(); ++i) values[static_cast<std::size_t>(p[i])] = written[static_cast<std::size_t>(i)];
  const bool one_value = std::all_of(values.begin(), values.end(), [&](const non_tensor_value& v) { return v == values.front(); });
  if (one_value && !mine.is_stack()) return NonTensor(std::move(values.front()));
  return stacked_or_one(std::move(values), level);
}

}  // namespace tensordict::detail
#endif  // TENSORDICT_DEFINITIONS
