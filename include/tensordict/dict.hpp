// Python's td.to_dict() and TensorDict.from_dict(), both ways, and the
// state-dict shape that libtorch code takes.
//
//   std::map<std::string, at::Tensor> flat = tensordict::to_dict(td);      // {"0.bias": ..., "0.weight": ...}
//   torch::OrderedDict<std::string, at::Tensor> sd = tensordict::to_state_dict(td);  // in key order
//   tensordict::nested_dict tree = tensordict::to_nested_dict(td);         // tree.dicts["0"].tensors["weight"]
//   auto any = tensordict::from_dict(flat);          // keys split at ".", batch size inferred as Python does
//   auto typed = tensordict::from_dict<mlp>(flat);   // checked against the schema
//
// Every conversion keeps the tensors themselves (no copies). A typed
// TensorDict converts to the run-time one without copies, so each to_...
// takes both.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <c10/util/Exception.h>  // torch/ordered_dict.h uses TORCH_CHECK without including it
#include <torch/ordered_dict.h>

#include "any_tensordict.hpp"
#include "errors.hpp"
#include "typed_tensordict.hpp"

namespace tensordict {

// Python's nested dict of tensors: the tensors of a level and its sub-dicts, by key.
struct nested_dict {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, nested_dict> dicts;
};

// Every leaf under its key path joined with `separator`, sorted by key.
inline std::map<std::string, at::Tensor> to_dict(const AnyTensorDict& td, std::string_view separator = ".") {
  std::map<std::string, at::Tensor> out;
  td.for_each_leaf([&](const any_key_path& path, const at::Tensor& t) {
    if (!out.emplace(join(path, separator), t).second)
      throw key_error("tensordict::to_dict: two leaves join to \"" + join(path, separator) + "\"");
  });
  return out;
}

// As to_dict, in the TensorDict's key order: the shape of Module::named_parameters() and of a state dict.
inline torch::OrderedDict<std::string, at::Tensor> to_state_dict(const AnyTensorDict& td, std::string_view separator = ".") {
  torch::OrderedDict<std::string, at::Tensor> out;
  td.for_each_leaf([&](const any_key_path& path, const at::Tensor& t) {
    const std::string key = join(path, separator);
    if (out.contains(key)) throw key_error("tensordict::to_state_dict: two leaves join to \"" + key + "\"");
    out.insert(key, t);
  });
  return out;
}

inline nested_dict to_nested_dict(const AnyTensorDict& td) {
  nested_dict out;
  for (const auto& [path, value] : td.items(false)) {
    if (const at::Tensor* t = std::get_if<at::Tensor>(&value)) out.tensors.emplace(path.back(), *t);
    else out.dicts.emplace(path.back(), to_nested_dict(std::get<AnyTensorDict>(value)));
  }
  return out;
}

namespace detail {

// A TensorDict of the leaves in `leaves` (batch size [] for now), keys split at `separator`.
template <class Leaves>
AnyTensorDict from_flat(const Leaves& leaves, std::string_view separator, const char* op) {
  AnyTensorDict flat;
  for (const auto& [key, tensor] : leaves) {
    if (!tensor.defined()) throw value_error(std::string(op) + ": the tensor for \"" + key + "\" is undefined");
    if (flat.contains(key)) throw key_error(std::string(op) + ": the key \"" + key + "\" is given twice");
    flat.set(any_key_path{key}, tensor);
  }
  return separator.empty() ? flat : flat.unflatten_keys(separator);
}

inline void add_nested(AnyTensorDict& out, const nested_dict& from, any_key_path& path) {
  for (const auto& [key, tensor] : from.tensors) {
    path.push_back(key);
    out.set(path, tensor);
    path.pop_back();
  }
  for (const auto& [key, sub] : from.dicts) {
    path.push_back(key);
    if (from.tensors.count(key)) throw key_error("tensordict::from_dict: the key " + to_string(path) + " is both a tensor and a dict");
    if (sub.tensors.empty() && sub.dicts.empty())
      out.set(path, AnyTensorDict());  // an empty sub-TensorDict stays, as in Python
    else
      add_nested(out, sub, path);
    path.pop_back();
  }
}

// `td` with batch size `batch` (every leaf checked), or Python's inferred one.
inline AnyTensorDict with_batch_size(AnyTensorDict td, const std::optional<std::vector<std::int64_t>>& batch) {
  return batch ? td.set_batch_size(*batch) : td.auto_batch_size_();
}

inline std::optional<std::vector<std::int64_t>> batch_arg(std::optional<c10::IntArrayRef> batch) {
  if (!batch) return std::nullopt;
  return batch->vec();
}

}  // namespace detail

// Python's TensorDict.from_dict: keys are split at `separator` ("" keeps
// them whole). Without a batch size, it is the longest leading shape all
// leaves share, as in Python; with one, every leaf must start with it.
inline AnyTensorDict from_dict(const std::map<std::string, at::Tensor>& dict, std::optional<c10::IntArrayRef> batch_size = std::nullopt,
                               std::string_view separator = ".") {
  return detail::with_batch_size(detail::from_flat(dict, separator, "tensordict::from_dict"), detail::batch_arg(batch_size));
}
inline AnyTensorDict from_dict(const torch::OrderedDict<std::string, at::Tensor>& dict,
                               std::optional<c10::IntArrayRef> batch_size = std::nullopt, std::string_view separator = ".") {
  std::vector<std::pair<std::string, at::Tensor>> leaves;
  for (const auto& item : dict) leaves.emplace_back(item.key(), item.value());
  return detail::with_batch_size(detail::from_flat(leaves, separator, "tensordict::from_dict"), detail::batch_arg(batch_size));
}
inline AnyTensorDict from_dict(const nested_dict& dict, std::optional<c10::IntArrayRef> batch_size = std::nullopt) {
  AnyTensorDict out;
  any_key_path path;
  detail::add_nested(out, dict, path);
  return detail::with_batch_size(out, detail::batch_arg(batch_size));
}

// The typed forms: the keys must be those of S (AnyTensorDict::to_typed<S> lists every difference).
template <schema_type S, class Dict>
  requires requires(const Dict& d) { from_dict(d); }
TensorDict<S> from_dict(const Dict& dict, std::optional<c10::IntArrayRef> batch_size = std::nullopt) {
  return from_dict(dict, batch_size).template to_typed<S>();
}

}  // namespace tensordict
