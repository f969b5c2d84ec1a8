// The runtime-erased TensorDict: keys are strings known at run time.
//
//   tensordict::AnyTensorDict td({4});                     // batch_size [4]
//   td.set("0", "weight", at::randn({4, 8, 3}));          // creates the sub-tree "0"
//   at::Tensor w = td.get("0", "weight");                  // a typo throws key_error, naming the keys there
//   std::cout << td;   // TensorDict(batch_size=[4], fields={0: {weight: f32[4,8,3]}})
//
// The same verbs as the typed TensorDict<S>, checked at run time, for models
// whose structure is not a type (a torch::nn::Sequential built from a config
// file). A typed TensorDict converts to an AnyTensorDict implicitly and
// without copies; to_typed<S>() converts back, checking the keys (and with a
// reference TensorDict, the shapes and dtypes) and listing every difference in
// one error.
//
// Beside its tensors it may hold non-tensor data (set_non_tensor: strings,
// numbers; non_tensor.hpp), which no tensor verb sees.
//
// Keys keep their insertion order (keys(), iteration); printing sorts them,
// as Python does. A sub-tree obtained with get_tensordict(...) is a view: it
// shares its parent's leaves and locks; its batch size is its level's, which
// starts with the parent's and may add dims (as in Python). A call that
// throws leaves the TensorDict as it was.
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "typed_tensordict.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/TensorIndexing.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include "detail/config.hpp"
#include "detail/format.hpp"
#include "detail/non_tensor_ops.hpp"
#include "detail/tensordict_ops.hpp"
#include "errors.hpp"
#include "non_tensor.hpp"

namespace tensordict {

class AnyTensorDict;

// Python's spelling, as the typed API prints paths: "weight" or ("0", "weight").
inline std::string to_string(c10::ArrayRef<std::string> path) {
  std::vector<std::string_view> parts(path.begin(), path.end());
  return format_key_path(parts.data(), parts.size());
}

// The keys of a path joined: ("0", "weight") with "." is "0.weight".
inline std::string join(c10::ArrayRef<std::string> path, std::string_view separator) {
  std::string out;
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (i) out += separator;
    out += path[i];
  }
  return out;
}

namespace detail {

// "bias", "weight": names as error messages list them.
inline std::string quoted_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "\"" : ", \"") + n + '"';
  return out;
}

// A level of the tree. Parents own their children; a child knows its parent
// weakly, so a sub-view (get_tensordict) that outlives the tree above it
// finds no parent rather than a freed one. Nodes live in shared_ptrs only.
// Each level has its batch size, which starts with its parent's (Python lets
// a nested TensorDict add dims of its own); it never changes once the node
// holds entries: verbs build new nodes.
struct any_node : std::enable_shared_from_this<any_node> {
  std::vector<std::int64_t> batch;
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;                  // undefined where the entry is a sub-tree
  std::vector<std::shared_ptr<any_node>> children;  // null where the entry is a leaf
  bool locked = false;
  std::weak_ptr<any_node> parent;
  // Entries that are not tensors (non_tensor.hpp), apart so that no tensor
  // verb meets them; a name is in `names` or here, never both.
  std::vector<std::string> non_tensor_names;
  std::vector<NonTensor> non_tensors;

  // name -> position, for levels with many keys (a flat state dict of
  // thousands); kept in step by add_leaf/add_child/erase_at.
  std::unordered_map<std::string, std::size_t> positions;

  std::size_t find(std::string_view name) const {
    if (names.size() <= 8) {
      for (std::size_t i = 0; i < names.size(); ++i)
        if (names[i] == name) return i;
      return npos;
    }
    const auto it = positions.find(std::string(name));
    return it == positions.end() ? npos : it->second;
  }
  std::size_t size() const { return names.size(); }
  bool is_leaf(std::size_t i) const { return !children[i]; }
  std::size_t find_non_tensor(std::string_view name) const {
    for (std::size_t i = 0; i < non_tensor_names.size(); ++i)
      if (non_tensor_names[i] == name) return i;
    return npos;
  }
  // Sets a non-tensor entry, replacing whatever entry `name` was.
  TENSORDICT_DECL void put_non_tensor(std::string_view name, NonTensor value);
  void erase_non_tensor(std::size_t i) {
    non_tensor_names.erase(non_tensor_names.begin() + static_cast<std::ptrdiff_t>(i));
    non_tensors.erase(non_tensors.begin() + static_cast<std::ptrdiff_t>(i));
  }

  // The three vectors change together, here only. A leaf has a tensor and no
  // child; a sub-tree a child (whose parent becomes this node) and no tensor.
  void add_leaf(std::string name, at::Tensor tensor) {
    positions.emplace(name, names.size());
    names.push_back(std::move(name));
    tensors.push_back(std::move(tensor));
    children.emplace_back();
  }
  // A new child (child null) has this level's batch size.
  TENSORDICT_DECL any_node& add_child(std::string name, std::shared_ptr<any_node> child = nullptr);
  TENSORDICT_DECL void erase_at(std::size_t i);
  // Replaces entry `name` (or adds it) with a leaf or a sub-tree.
  TENSORDICT_DECL void put(std::string_view name, at::Tensor tensor, std::shared_ptr<any_node> child);

  // The keys of this level, sorted, for error messages: "bias", "weight".
  TENSORDICT_DECL std::string listing() const;
};

}  // namespace detail

// How AnyTensorDict::to_typed<S>() treats leaves of S that the TensorDict lacks.
struct to_typed_options {
  bool allow_missing = false;  // true: they stay unset in the typed form
  bool ignore_extra = false;   // true: keys the schema lacks are left out (else each is an error)
};

namespace detail {

// A schema's key paths as the conversions between the typed and run-time forms read them
// (AnyTensorDict::table_of<S>()): their work is not a template.
struct schema_table {
  std::vector<key_path> leaves, non_tensors;
  std::vector<std::optional<std::vector<std::string_view>>> node_paths;  // per node (0: the schema's own level); none: no entry below it
  std::vector<std::size_t> parents;
};
// A typed TensorDict's contents, for the same (AnyTensorDict::contents_of).
struct typed_contents {
  std::vector<at::Tensor> leaves;
  std::vector<const std::optional<NonTensor>*> non_tensors;
  std::vector<c10::IntArrayRef> node_batches;
  c10::IntArrayRef batch_size;
  batch_names names;
  bool locked = false;
};

// The table of a schema's leaves, non-tensor fields and node_count nodes (parents: every node's
// parent), as AnyTensorDict::table_of<S> builds it once per schema.
TENSORDICT_DECL schema_table make_schema_table(entry_table leaves, entry_table non_tensors, std::size_t node_count,
                                               const std::size_t* parents);
// A typed TensorDict's contents: the entries [leaf_base, + leaf_count) of its storage, and so on.
TENSORDICT_DECL typed_contents contents_of_storage(const storage& st, std::size_t leaf_base, std::size_t leaf_count,
                                                   std::size_t non_tensor_base, std::size_t non_tensor_count,
                                                   std::size_t node_base, std::size_t node_count, batch_names names,
                                                   bool locked);

struct any_root {
  std::size_t batch_dims = 0;  // of the root level, whose dims alone carry names
  std::optional<at::Device> device;
  batch_names names = {};  // empty: no dim is named
};

template <>
struct is_tensordict<AnyTensorDict> : std::true_type {};

// set("0", "weight", value): every argument but the last is a string key.
template <class... Args>
constexpr bool keys_then_value = [] {
  constexpr bool is_key[] = {std::is_convertible_v<const Args&, std::string_view>...};
  for (std::size_t i = 0; i + 1 < sizeof...(Args); ++i)
    if (!is_key[i]) return false;
  return true;
}();

}  // namespace detail

class AnyTensorDict : public detail::tensordict_ops<AnyTensorDict> {
  using ops = detail::tensordict_ops<AnyTensorDict>;
  friend ops;

 public:
  using ops::operator==;
  using ops::operator!=;
  TENSORDICT_DECL explicit AnyTensorDict(c10::IntArrayRef batch_size = {}, std::optional<at::Device> device = std::nullopt);
  explicit AnyTensorDict(std::initializer_list<std::int64_t> batch_size, std::optional<at::Device> device = std::nullopt)
      : AnyTensorDict(c10::IntArrayRef(batch_size.begin(), batch_size.size()), device) {}

  // Python's TensorDict({"a": t, ("b", "c"): u}, batch_size=[4]):
  //   AnyTensorDict({{"a", t}, {{"b", "c"}, u}}, {4})
  // sub-trees are created on the way; a key path given twice throws key_error.
  struct entry {
    any_key_path path;
    at::Tensor value;
    template <class Key>
      requires std::is_convertible_v<const Key&, std::string_view>
    entry(const Key& key, at::Tensor v) : path{std::string(std::string_view(key))}, value(std::move(v)) {}
    entry(any_key_path p, at::Tensor v) : path(std::move(p)), value(std::move(v)) {}
  };
  AnyTensorDict(std::initializer_list<entry> entries, c10::IntArrayRef batch_size = {},
                std::optional<at::Device> device = std::nullopt)
      : AnyTensorDict(batch_size, device) {
    for (const entry& e : entries) {
      if (e.path.empty()) throw key_error("AnyTensorDict: an entry has an empty key path");
      if (!e.value.defined()) throw value_error("AnyTensorDict: the tensor for " + to_string(e.path) + " is undefined");
      insert_leaf(e.path, checked_leaf(e.value, e.path, "AnyTensorDict"));
    }
  }

  // Every set leaf of a typed TensorDict, under the same key paths, the same tensors.
  template <schema_type S>
  AnyTensorDict(const TensorDict<S>& typed) : AnyTensorDict(typed.batch_size(), typed.device()) {
    take_typed(table_of<S>(), contents_of(typed));
  }

  // ---- structure --------------------------------------------------------------

  // This level's batch size: a nested level's starts with its parent's and may add dims.
  c10::IntArrayRef batch_size() const { return node_->batch; }
  std::size_t batch_dims() const { return node_->batch.size(); }
  const std::optional<at::Device>& device() const { return root_->device; }

  // The keys of this level, in insertion order.
  const std::vector<std::string>& level_keys() const { return node_->names; }
  bool empty() const { return node_->names.empty() && node_->non_tensor_names.empty(); }

  // Key paths of every leaf, depth first, in insertion order.
  TENSORDICT_DECL std::vector<any_key_path> keys() const;
  TENSORDICT_DECL std::vector<at::Tensor> values() const;
  TENSORDICT_DECL std::vector<std::pair<any_key_path, at::Tensor>> items() const;
  // Python's keys(include_nested, leaves_only) and items(...): the keys of this
  // level (sub-trees included) unless include_nested, sub-trees left out when
  // leaves_only; a sub-tree comes before its keys.
  using item = std::variant<at::Tensor, AnyTensorDict>;
  TENSORDICT_DECL std::vector<any_key_path> keys(bool include_nested, bool leaves_only = false) const;
  TENSORDICT_DECL std::vector<std::pair<any_key_path, item>> items(bool include_nested, bool leaves_only = false) const;

  TENSORDICT_DECL std::size_t leaf_count() const;

  // Calls f(path, tensor) for every leaf, depth first, in insertion order.
  template <class F>
  void for_each_leaf(F&& f) const {
    any_key_path path;
    visit(*node_, path, f);
  }

  // ---- get / set ----------------------------------------------------------------

  // A tensor, a sub-tree or a non-tensor entry at path.
  TENSORDICT_DECL bool contains(c10::ArrayRef<std::string> path) const;
  TENSORDICT_DECL bool is_leaf(c10::ArrayRef<std::string> path) const;

  // The tensor at a leaf; key_error for a missing key or a sub-tree.
  TENSORDICT_DECL const at::Tensor& get(c10::ArrayRef<std::string> path) const;

  // A view of a sub-tree; key_error for a missing key or a leaf.
  TENSORDICT_DECL AnyTensorDict get_tensordict(c10::ArrayRef<std::string> path) const;

  // Sets a leaf, creating the sub-trees on the way (as Python's set with a
  // tuple key). The tensor's leading dims must be the batch size.
  TENSORDICT_DECL AnyTensorDict& set(c10::ArrayRef<std::string> path, at::Tensor value);

  // Sets a sub-tree: a new node holding the same tensors as `value`, whose
  // batch size must start with that of the level that holds it (it may add
  // dims of its own, as in Python: a [4, 3, 2] TensorDict under a [4, 3] one).
  TENSORDICT_DECL AnyTensorDict& set(c10::ArrayRef<std::string> path, const AnyTensorDict& value);

  // Writes value into the leaf at path in place (it keeps its identity); also
  // on a locked TensorDict. value must broadcast to the leaf's shape.
  TENSORDICT_DECL AnyTensorDict& set_(c10::ArrayRef<std::string> path, const at::Tensor& value);

  // Python's td.set_at_(key, value, index): value written into the leaf at
  // `indices` along the batch dims (as td[key][index] = value), checked first
  // (tensordict_ops::index_put_ says how); also on a locked TensorDict.
  AnyTensorDict& set_at_(c10::ArrayRef<std::string> path, const at::Tensor& value, c10::ArrayRef<at::indexing::TensorIndex> indices) {
    std::vector<pending_write> writes{{get(path), value}};
    return write_at(writes, indices, "set_at_", [&](std::size_t) { return to_string(path); });
  }
  AnyTensorDict& set_at_(c10::ArrayRef<std::string> path, const at::Tensor& value, std::initializer_list<at::indexing::TensorIndex> indices) {
    return set_at_(path, value, c10::ArrayRef<at::indexing::TensorIndex>(indices.begin(), indices.size()));
  }
  // Python's td.update_at_(other, index): every leaf of other written into the
  // leaf at its key path here (which must exist), at `indices`; other may hold
  // a part of this TensorDict's keys. All checked before the first write.
  // Other's non-tensor entries are written into those here at the same
  // positions (a NonTensorData given another value there becomes a NonTensorStack).
  AnyTensorDict& update_at_(const AnyTensorDict& other, c10::ArrayRef<at::indexing::TensorIndex> indices) {
    return write_other_at(other, indices, "update_at_");
  }
  AnyTensorDict& update_at_(const AnyTensorDict& other, std::initializer_list<at::indexing::TensorIndex> indices) {
    return update_at_(other, c10::ArrayRef<at::indexing::TensorIndex>(indices.begin(), indices.size()));
  }

  // ---- sub-trees: select, exclude, rename_key_, update ----------------------------

  // A new TensorDict of the given keys (paths may be nested), over the same
  // tensors; a missing key throws key_error unless strict is false.
  TENSORDICT_DECL AnyTensorDict select(const std::vector<any_key_path>& paths, bool strict = true) const;
  // A new TensorDict without the given keys, over the same tensors; missing keys are ignored, as in Python.
  TENSORDICT_DECL AnyTensorDict exclude(const std::vector<any_key_path>& paths) const;
  // Moves the entry at `from` (a leaf or a sub-tree) to `to`, creating sub-trees
  // on the way. An existing `to` is replaced unless safe is true (then key_error).
  TENSORDICT_DECL AnyTensorDict& rename_key_(c10::ArrayRef<std::string> from, c10::ArrayRef<std::string> to, bool safe = false);

  // Sets every leaf of other at its key path (creating sub-trees), as Python's
  // update. Every leaf is checked before the first is set.
  // Sub-trees it creates take other's batch sizes.
  TENSORDICT_DECL AnyTensorDict& update(const AnyTensorDict& other);
  // Writes other's leaves into this TensorDict's tensors in place (every key
  // of other must be a leaf here); works when locked. Checked before writing.
  // Other's non-tensor entries replace the values of those here (which must exist).
  TENSORDICT_DECL AnyTensorDict& update_(const AnyTensorDict& other);

  // Removes a key (a leaf or a whole sub-tree), as Python's del_.
  TENSORDICT_DECL AnyTensorDict& erase(c10::ArrayRef<std::string> path);

  // The variadic spellings: get("0", "weight"), set("0", "weight", t).
  template <class... Keys>
    requires(sizeof...(Keys) > 0 && (std::is_convertible_v<const Keys&, std::string_view> && ...))
  const at::Tensor& get(const Keys&... keys) const {
    return get(path_of(keys...));
  }
  template <class... Keys>
    requires(sizeof...(Keys) > 0 && (std::is_convertible_v<const Keys&, std::string_view> && ...))
  AnyTensorDict get_tensordict(const Keys&... keys) const {
    return get_tensordict(path_of(keys...));
  }
  template <class... Args>
    requires(sizeof...(Args) > 1 && detail::keys_then_value<Args...>)
  AnyTensorDict& set(const Args&... args) {
    return set_variadic(std::index_sequence_for<Args...>{}, args...);
  }
  template <class... Keys>
    requires(sizeof...(Keys) > 0 && (std::is_convertible_v<const Keys&, std::string_view> && ...))
  bool contains(const Keys&... keys) const {
    return contains(path_of(keys...));
  }
  template <class... Keys>
    requires(sizeof...(Keys) > 0 && (std::is_convertible_v<const Keys&, std::string_view> && ...))
  AnyTensorDict& erase(const Keys&... keys) {
    return erase(path_of(keys...));
  }

  // ---- non-tensor data (non_tensor.hpp) ---------------------------------------------

  // Python's td.set_non_tensor(key, value): a NonTensorData ("reach-target",
  // 7), or a NonTensorStack whose shape is the batch size of the level that
  // holds it. Sub-trees are created on the way; an entry at path (of any
  // kind) is replaced. lock_error on a locked TensorDict.
  TENSORDICT_DECL AnyTensorDict& set_non_tensor(c10::ArrayRef<std::string> path, NonTensor value);

  // Python's td.get_non_tensor(key): the value of a NonTensorData, as T (one
  // of non_tensor_value's alternatives: std::string, std::int64_t, double,
  // bool, std::monostate; or non_tensor_value itself). dtype_error when it
  // holds another kind; value_error for a NonTensorStack (index the
  // TensorDict down to one element first, or read non_tensor(path).values()).
  template <class T = non_tensor_value>
  T get_non_tensor(c10::ArrayRef<std::string> path) const {
    static_assert(is_non_tensor_alternative<T>,
                  "get_non_tensor<T>: T must be std::string, std::int64_t, double, bool, std::monostate or non_tensor_value");
    const NonTensor& entry = non_tensor(path);
    if (entry.is_stack())
      throw value_error("AnyTensorDict.get_non_tensor(" + to_string(path) + "): it holds one value per batch element (" +
                        entry.repr() + "); index the TensorDict down to one element, or read non_tensor(path).values()");
    if constexpr (std::is_same_v<T, non_tensor_value>) {
      return entry.value();
    } else {
      if (const T* v = std::get_if<T>(&entry.value())) return *v;
      throw dtype_error("AnyTensorDict.get_non_tensor(" + to_string(path) + "): asked for " +
                        kind_name(non_tensor_value(T{})) + ", but it holds " + kind_name(entry.value()) + " " + tensordict::repr(entry.value()));
    }
  }
  // The entry itself (NonTensorData or NonTensorStack); key_error when path holds none.
  TENSORDICT_DECL const NonTensor& non_tensor(c10::ArrayRef<std::string> path) const;
  bool is_non_tensor(c10::ArrayRef<std::string> path) const { return locate_non_tensor(path).node != nullptr; }

  // Key paths of the non-tensor entries, depth first (those of sub-trees too unless include_nested is false).
  TENSORDICT_DECL std::vector<any_key_path> non_tensor_keys(bool include_nested = true) const;

  template <class T = non_tensor_value, class... Keys>
    requires(sizeof...(Keys) > 0 && (std::is_convertible_v<const Keys&, std::string_view> && ...))
  T get_non_tensor(const Keys&... keys) const {
    return get_non_tensor<T>(path_of(keys...));
  }

  // ---- whole-tree operations ------------------------------------------------------

  // A new TensorDict with f(leaf) at every leaf; a leaf for which f returns
  // an undefined tensor is left out. The batch size and device stay unless
  // others are given (a leaf that f puts elsewhere is moved to the result's device).
  template <class F>
  AnyTensorDict apply(F&& f) const {
    return apply(std::forward<F>(f), batch_size(), device());
  }
  template <class F>
  AnyTensorDict apply(F&& f, c10::IntArrayRef new_batch_size) const {
    return apply(std::forward<F>(f), new_batch_size, device());
  }
  // A nested TensorDict with dims of its own keeps them after the new batch
  // size (Python's: its leaves keep their shapes after the batch dims).
  template <class F>
  AnyTensorDict apply(F&& f, c10::IntArrayRef new_batch_size, std::optional<at::Device> new_device) const {
    return mapped([&](const any_key_path&, const at::Tensor& t) { return f(t); }, new_batch_size, new_device,
                  detail::nested_batch::follow, "TensorDict.apply");
  }

  // f(leaf, the leaf at the same key path of each other TensorDict), as
  // Python's apply(fn, *others): every other needs this batch size and every key.
  template <class F, class... Others>
    requires(sizeof...(Others) > 0 && (std::is_same_v<Others, AnyTensorDict> && ...))
  AnyTensorDict apply(F&& f, const Others&... others) const {
    for (const AnyTensorDict* o : {&others...})
      if (!o->batch_size().equals(batch_size()))
        throw shape_error("TensorDict.apply: batch_size=" + format_sizes(batch_size()) + " and batch_size=" +
                          format_sizes(o->batch_size()) + " differ");
    return mapped(
        [&](const any_key_path& path, const at::Tensor& t) {
          auto other_leaf = [&](const AnyTensorDict& o) -> const at::Tensor& {
            auto at = o.locate(path);
            if (!at.node || !at.node->is_leaf(at.index))
              throw key_error("TensorDict.apply: the leaf " + to_string(path) + " is not in every TensorDict");
            return at.node->tensors[at.index];
          };
          return f(t, other_leaf(others)...);
        },
        batch_size(), device(), detail::nested_batch::follow, "TensorDict.apply");
  }

  // f(key path, leaf) at every leaf, as Python's named_apply; f may return an undefined tensor to leave a leaf out.
  template <class F>
  AnyTensorDict named_apply(F&& f) const {
    return mapped(f, batch_size(), device(), detail::nested_batch::follow, "TensorDict.named_apply");
  }

  // apply_, clone, detach, zero_, to, comparisons with a scalar, all, any,
  // index, operator[], unbind and expand come from detail/tensordict_ops.hpp.

  // Element-wise comparisons; both sides must have the same keys.
  AnyTensorDict operator==(const AnyTensorDict& other) const {
    return compare(other, "==", [](const at::Tensor& a, const at::Tensor& b) { return a.eq(b); });
  }
  AnyTensorDict operator!=(const AnyTensorDict& other) const {
    return compare(other, "!=", [](const at::Tensor& a, const at::Tensor& b) { return a.ne(b); });
  }
  // ---- keys ---------------------------------------------------------------------------

  // The same tensors under joined keys: ("0", "weight") becomes "0.weight".
  TENSORDICT_DECL AnyTensorDict flatten_keys(std::string_view separator = ".") const;

  // The inverse: "0.weight" becomes ("0", "weight"). Keys of sub-trees are
  // split too. A key that is both a leaf and a prefix throws key_error.
  TENSORDICT_DECL AnyTensorDict unflatten_keys(std::string_view separator = ".") const;

  // ---- locking --------------------------------------------------------------------------

  // A locked TensorDict refuses set and erase; in-place writes into its
  // tensors still work. Locking propagates to sub-trees.
  AnyTensorDict& lock_() {
    set_locked(*node_, true);
    return *this;
  }
  TENSORDICT_DECL AnyTensorDict& unlock_();
  bool is_locked() const { return node_->locked; }

  // ---- conversions -------------------------------------------------------------------------

  // The typed form, holding the same tensors. Every key must be a leaf of S,
  // every leaf of S must be there (unless {.allow_missing = true}: missing
  // leaves stay unset), and every leaf's leading dims must be the batch size.
  // One key_error lists every difference.
  template <schema_type S>
  TensorDict<S> to_typed(to_typed_options options = {}) const {
    return typed_from<S>(nullptr, options);
  }

  // As to_typed<S>(), and the keys, shapes and dtypes must be those of
  // `like` (e.g. from_module(net)): a leaf unset in `like` must be absent
  // ({.ignore_extra = true}: keys S lacks are left out).
  template <schema_type S>
  TensorDict<S> to_typed(const TensorDict<S>& like, to_typed_options options = {}) const {
    options.allow_missing = false;  // `like` says which leaves are set
    return typed_from<S>(&like, options);
  }

  // ---- printing -----------------------------------------------------------------------------

  TENSORDICT_DECL std::string repr(print_style style = print_style::one_line) const;
  friend std::ostream& operator<<(std::ostream& os, const AnyTensorDict& td) { return os << td.repr(); }

  // Whether two handles view the same node (not a comparison of values).
  bool is_same(const AnyTensorDict& other) const { return node_ == other.node_; }

 private:
  // A key as errors print it (tensordict_ops' messages).
  static std::string key_name(const any_key_path& k) { return to_string(k); }
  // update_at_ and index_put_ (`op` names the call in errors).
  TENSORDICT_DECL AnyTensorDict& write_other_at(const AnyTensorDict& other, c10::ArrayRef<at::indexing::TensorIndex> indices, const char* op);
  friend AnyTensorDict stack(c10::ArrayRef<AnyTensorDict>, std::int64_t);
  friend AnyTensorDict cat(c10::ArrayRef<AnyTensorDict>, std::int64_t);

  batch_names& stored_names() const { return root_->names; }
  std::size_t named_dims() const { return root_->batch_dims; }
  // The names for a new root with this level's batch size (a nested level's own dims have none).
  TENSORDICT_DECL batch_names stored_names_padded() const;

  struct location {
    detail::any_node* node = nullptr;  // the node that holds the last key
    std::size_t index = npos;
  };

  AnyTensorDict(std::shared_ptr<detail::any_root> root, std::shared_ptr<detail::any_node> node)
      : root_(std::move(root)), node_(std::move(node)) {}

  // Each key of path split at separator: ("a.b", "c") with "." is ("a", "b", "c").
  TENSORDICT_DECL static any_key_path split_keys(const any_key_path& path, std::string_view separator);

  template <class... Keys>
  static any_key_path path_of(const Keys&... keys) {
    return any_key_path{std::string(std::string_view(keys))...};
  }

  template <std::size_t... I, class... Args>
  AnyTensorDict& set_variadic(std::index_sequence<I...>, const Args&... args) {
    constexpr std::size_t n = sizeof...(Args) - 1;
    const auto all = std::forward_as_tuple(args...);
    const auto& value = std::get<n>(all);
    any_key_path path;
    (
        [&](const auto& part) {
          if constexpr (I < n) path.emplace_back(std::string_view(part));
        }(std::get<I>(all)),
        ...);
    using V = std::remove_cvref_t<decltype(value)>;
    if constexpr (std::is_convertible_v<const V&, at::Tensor>)
      return set(path, at::Tensor(value));
    else
      return set(path, AnyTensorDict(value));
  }

  TENSORDICT_DECL location locate(c10::ArrayRef<std::string> path) const;

  // For update_at_: each of other's non-tensor entries written at `indices`
  // into the entry here, as new entries to put in place once every write checked.
  TENSORDICT_DECL std::vector<std::pair<NonTensor*, NonTensor>> non_tensors_written_at(const AnyTensorDict& other, c10::ArrayRef<at::indexing::TensorIndex> indices, const char* op);

  // The node and position of a non-tensor entry at path, or none.
  TENSORDICT_DECL location locate_non_tensor(c10::ArrayRef<std::string> path) const;

  // As locate, but throws key_error naming the key and the keys available there.
  TENSORDICT_DECL location resolve(c10::ArrayRef<std::string> path, const char* op) const;

  // The batch size of the level that holds path.back(), or would once set
  // creates the missing sub-trees (they take the deepest existing one's).
  TENSORDICT_DECL c10::IntArrayRef batch_at(c10::ArrayRef<std::string> path) const;
  // As batch_at, where the sub-trees to create take the batch sizes of `like`'s sub-trees at the same keys.
  TENSORDICT_DECL c10::IntArrayRef batch_at(c10::ArrayRef<std::string> path, const AnyTensorDict& like) const;

  // The node that will hold path.back(), its sub-trees created when missing
  // (with the batch sizes of `like`'s sub-trees at the same keys, if given).
  // Nothing is created unless the whole call can succeed.
  TENSORDICT_DECL detail::any_node& parent_for_write(c10::ArrayRef<std::string> path, const char* op, const AnyTensorDict* like = nullptr);

  // path[k], which path goes on after, is not a non-tensor entry of node.
  TENSORDICT_DECL static void check_not_non_tensor(const detail::any_node& node, c10::ArrayRef<std::string> path, std::size_t k, const char* op);

  // The node that would hold path.back() is not locked (nodes still to be created are not).
  TENSORDICT_DECL void check_writable_path(c10::ArrayRef<std::string> path, const char* op) const;

  // Calls f(path, node, index) for the entries keys(include_nested, leaves_only) lists.
  template <class F>
  void walk(bool include_nested, bool leaves_only, F&& f) const {
    any_key_path path;
    auto level = [&](auto& self, const detail::any_node& node) -> void {
      for (std::size_t i = 0; i < node.size(); ++i) {
        path.push_back(node.names[i]);
        if (node.is_leaf(i) || !leaves_only) f(std::as_const(path), node, i);
        if (!node.is_leaf(i) && include_nested) self(self, *node.children[i]);
        path.pop_back();
      }
    };
    level(level, *node_);
  }

  // Puts a copy of entry `index` of `from` (a leaf, or a sub-tree with the same tensors) at path.
  TENSORDICT_DECL void put_entry(c10::ArrayRef<std::string> path, const detail::any_node& from, std::size_t index, const char* op, const AnyTensorDict* like);

  TENSORDICT_DECL static void check_unlocked(const detail::any_node& node, c10::ArrayRef<std::string> path, const char* op);

  // Inserts a leaf during construction (no lock or batch checks: the caller made them).
  TENSORDICT_DECL void insert_leaf(const any_key_path& path, const at::Tensor& t);

  // A leaf about to be set at path: on this TensorDict's device, starting with
  // the batch size of the level that will hold it (see batch_at).
  TENSORDICT_DECL at::Tensor checked_leaf(at::Tensor t, c10::ArrayRef<std::string> path, const char* op, const AnyTensorDict* like = nullptr) const;

  template <class F>
  static void visit(const detail::any_node& node, any_key_path& path, F& f) {
    for (std::size_t i = 0; i < node.size(); ++i) {
      path.push_back(node.names[i]);
      if (node.is_leaf(i))
        f(std::as_const(path), node.tensors[i]);
      else
        visit(*node.children[i], path, f);
      path.pop_back();
    }
  }

  // The same structure in new nodes (unlocked, without a parent), holding the same tensors.
  TENSORDICT_DECL static std::shared_ptr<detail::any_node> copy_node(const detail::any_node& from);

  TENSORDICT_DECL static void relocate(detail::any_node& node, at::Device device);

  TENSORDICT_DECL static void set_locked(detail::any_node& node, bool locked);

  // f(path, leaf) at every leaf, into a new TensorDict of batch size `batch`
  // whose nested levels' batch sizes follow `rule`; a leaf for which f
  // returns an undefined tensor is left out, sub-trees that end empty stay
  // (as in Python). Leaves are moved to `device` and checked against their level.
  // rearrange: how the verb moves the batch dims (index, reshape, ...), which
  // NonTensorStacks follow (non_tensor.hpp); without it they must keep their shape.
  using rearrangement = detail::rearrangement;
  template <class F>
  AnyTensorDict mapped(F&& f, c10::IntArrayRef batch, std::optional<at::Device> device, detail::nested_batch rule,
                       const char* op, const rearrangement* rearrange = nullptr) const {
    AnyTensorDict out(batch, device);
    if (batch.equals(batch_size())) out.root_->names = stored_names_padded();
    any_key_path path;
    out.node_ = map_level(*node_, batch, f, path, device, rule, op, rearrange);
    return out;
  }
  // tensordict_ops' verbs that move the batch dims: f applies to leaves and to NonTensorStacks' positions.
  template <class F>
  AnyTensorDict rearranged_entries(F& f, c10::IntArrayRef batch) const {
    const rearrangement positions = [&](const at::Tensor& t) { return at::Tensor(f(t)); };
    return mapped([&](const any_key_path&, const at::Tensor& t) { return f(t); }, batch, device(), detail::nested_batch::follow,
                  "TensorDict.apply", &positions);
  }
  template <class F>
  AnyTensorDict map_leaves(F&& f, c10::IntArrayRef batch, detail::nested_batch rule) const {
    return mapped([&](const any_key_path&, const at::Tensor& t) { return f(t); }, batch, device(), rule, "TensorDict.batch_size");
  }
  template <class F>
  static std::shared_ptr<detail::any_node> map_level(const detail::any_node& from, c10::IntArrayRef batch, F& f, any_key_path& path,
                                                     const std::optional<at::Device>& device, detail::nested_batch rule,
                                                     const char* op, const rearrangement* rearrange) {
    auto node = std::make_shared<detail::any_node>();
    node->batch.assign(batch.begin(), batch.end());
    for (std::size_t i = 0; i < from.size(); ++i) {
      path.push_back(from.names[i]);
      if (from.children[i]) {
        const auto& child = *from.children[i];
        const auto child_batch = detail::nested_batch_size(rule, child.batch, from.batch, batch);
        if (!detail::starts_with(child_batch, batch))
          throw shape_error(std::string(op) + ": the nested TensorDict " + to_string(path) + " has batch_size=" +
                            format_sizes(child.batch) + ", which does not start with " + format_sizes(batch));
        node->add_child(from.names[i], map_level(child, child_batch, f, path, device, rule, op, rearrange));
      } else if (at::Tensor r = f(std::as_const(path), from.tensors[i]); r.defined()) {
        if (device && r.device() != *device) r = r.to(*device);
        if (!detail::has_batch_prefix(r, batch))
          throw shape_error(std::string(op) + ": the leaf " + to_string(path) + " is " + describe(r) +
                            ", but its leading dims must be the batch size " + format_sizes(batch));
        node->add_leaf(from.names[i], std::move(r));
      }
      path.pop_back();
    }
    const at::Device leaves_device = detail::leaves_device(from.tensors);
    for (std::size_t i = 0; i < from.non_tensors.size(); ++i) {
      path.push_back(from.non_tensor_names[i]);
      node->non_tensor_names.push_back(from.non_tensor_names[i]);
      node->non_tensors.push_back(detail::carried(from.non_tensors[i], from.batch, batch, rearrange, to_string(path), op, leaves_device));
      path.pop_back();
    }
    return node;
  }

  // Python's auto_batch_size_: nested levels first, then this one from its leaves' shapes and its levels' batch sizes.
  TENSORDICT_DECL AnyTensorDict auto_batched(std::optional<std::size_t> batch_dims) const;
  TENSORDICT_DECL static std::shared_ptr<detail::any_node> auto_level(const detail::any_node& from, std::optional<std::size_t> batch_dims);

  template <class F>
  AnyTensorDict compare(const AnyTensorDict& other, const char* op, F&& f) const {
    AnyTensorDict out = mapped(
        [&](const any_key_path& path, const at::Tensor& a) {
          auto at = other.locate(path);
          if (!at.node || !at.node->is_leaf(at.index))
            throw key_error(std::string("TensorDict ") + op + ": the leaf " + to_string(path) + " is set on one side only");
          return f(a, at.node->tensors[at.index]);
        },
        batch_size(), device(), detail::nested_batch::follow, op);
    out.root_->names.clear();
    if (other.leaf_count() != out.leaf_count())
      other.for_each_leaf([&](const any_key_path& path, const at::Tensor&) {
        if (!locate(path).node)
          throw key_error(std::string("TensorDict ") + op + ": the leaf " + to_string(path) + " is set on one side only");
      });
    return out;
  }

  // The schema's paths, built once per schema for the conversions' untyped parts.
  template <schema_type S>
  static const detail::schema_table& table_of() {
    static const detail::schema_table table =
        detail::make_schema_table(detail::leaf_entries<S>(), detail::non_tensor_entries<S>(), S::node_count,
                                  detail::node_parents_of<S>::value.data());
    return table;
  }
  template <schema_type S>
  static detail::typed_contents contents_of(const TensorDict<S>& td) {
    return detail::contents_of_storage(*td.st_, td.leaf_base_, S::leaf_count, td.non_tensor_base_, S::non_tensor_count,
                                       td.node_base_, S::node_count, td.names(), td.is_locked());
  }
  // The typed constructor's work: every set leaf and non-tensor entry, nested levels' batch sizes, names, the lock.
  TENSORDICT_DECL void take_typed(const detail::schema_table& table, const detail::typed_contents& typed);

  // to_typed's work: the leaves, non-tensor entries and nested batch sizes of a TensorDict of the
  // schema `table` describes (key_error listing every difference); like: the reference, or null.
  struct typed_parts {
    std::vector<at::Tensor> leaves;
    std::vector<std::optional<NonTensor>> non_tensors;
    std::vector<std::vector<std::int64_t>> batches;
  };
  TENSORDICT_DECL typed_parts typed_parts_of(const detail::schema_table& table, const detail::typed_contents* like,
                                             to_typed_options options) const;

  // The storage of to_typed's result: `parts` in a new storage of this batch size and device, every
  // leaf checked as the typed constructor checks it (against the root's batch size), then the nested
  // levels' batch sizes and the non-tensor entries.
  TENSORDICT_DECL std::shared_ptr<detail::storage> typed_storage(typed_parts parts, detail::entry_table leaves,
                                                                 std::size_t node_count, std::size_t non_tensor_count,
                                                                 const std::size_t* parents) const;

  template <schema_type S>
  TensorDict<S> typed_from(const TensorDict<S>* like, to_typed_options options) const {
    std::optional<detail::typed_contents> reference;
    if (like) reference = contents_of(*like);
    TensorDict<S> out(typed_storage(typed_parts_of(table_of<S>(), reference ? &*reference : nullptr, options),
                                    detail::leaf_entries<S>(), S::node_count, S::non_tensor_count,
                                    detail::node_parents_of<S>::value.data()),
                      0, 0, 0);
    if (is_locked()) out.lock_();
    return out;
  }

  TENSORDICT_DECL bool contains_path(key_path lp) const;

  TENSORDICT_DECL static void print_level(std::string& out, const detail::any_node& node, bool multiline);

  std::shared_ptr<detail::any_root> root_;
  std::shared_ptr<detail::any_node> node_;
};

namespace detail {
// A flat dict of dotted keys ("0.weight", a state_dict()) as a tree; anything else as it is.
TENSORDICT_DECL AnyTensorDict unflatten_if_flat(const AnyTensorDict& td);

// The leaves of several TensorDicts with the same keys, joined by join(path,
// parts), level by level: batch_of(the TensorDicts' views of a level, its
// path) gives the joined level's batch size (nested levels keep dims of their own).
template <class BatchOf, class Join>
AnyTensorDict join_tensordicts(c10::ArrayRef<AnyTensorDict> tds, const char* op, BatchOf&& batch_of, Join&& join) {
  std::vector<at::Tensor> parts(tds.size());
  any_key_path path;
  auto level = [&](auto& self, const std::vector<AnyTensorDict>& views, AnyTensorDict& out) -> void {
    const AnyTensorDict& first = views[0];
    for (const std::string& name : first.level_keys()) {
      path.push_back(name);
      const bool leaf = first.is_leaf({name});
      for (std::size_t k = 1; k < views.size(); ++k)
        if (!views[k].contains({name}) || views[k].is_leaf({name}) != leaf)
          throw key_error(std::string(op) + ": the " + (leaf ? "leaf " : "TensorDict ") + to_string(path) +
                          " is in TensorDict 0 but not in TensorDict " + std::to_string(k));
      if (leaf) {
        for (std::size_t k = 0; k < views.size(); ++k) parts[k] = views[k].get({name});  // at::cat and at::stack promote dtypes
        out.set({name}, join(path, parts));
      } else {
        std::vector<AnyTensorDict> children;
        for (const AnyTensorDict& v : views) children.push_back(v.get_tensordict({name}));
        AnyTensorDict child(batch_of(children, path), first.device());
        self(self, children, child);
        out.set({name}, child);
      }
      path.pop_back();
    }
    const std::vector<any_key_path> non_tensors = first.non_tensor_keys(false);
    for (const any_key_path& name : non_tensors) {
      path.push_back(name.front());
      std::vector<NonTensor> entries;
      for (std::size_t k = 0; k < views.size(); ++k) {
        if (!views[k].is_non_tensor(name))
          throw key_error(std::string(op) + ": the non-tensor entry " + to_string(path) + " is in TensorDict 0 but not in TensorDict " +
                          std::to_string(k));
        entries.push_back(views[k].non_tensor(name));
      }
      std::vector<c10::IntArrayRef> batches;
      for (const AnyTensorDict& v : views) batches.push_back(v.batch_size());
      out.set_non_tensor(name, detail::joined_non_tensor(entries, batches, out.batch_size(),
                                                         [&](const std::vector<at::Tensor>& positions) { return join(path, positions); }));
      path.pop_back();
    }
    for (std::size_t k = 1; k < views.size(); ++k)  // every key of TensorDict 0 is there: an extra one?
      if (views[k].non_tensor_keys(false).size() != non_tensors.size())
        throw key_error(std::string(op) + ": " + (path.empty() ? std::string("TensorDict ") : "under " + to_string(path) + ", TensorDict ") +
                        std::to_string(k) + " has " + std::to_string(views[k].non_tensor_keys(false).size()) +
                        " non-tensor entries but TensorDict 0 has " + std::to_string(non_tensors.size()));
    for (std::size_t k = 1; k < views.size(); ++k)
      if (views[k].level_keys().size() != first.level_keys().size())
        throw key_error(std::string(op) + ": " + (path.empty() ? std::string("TensorDict ") : "under " + to_string(path) + ", TensorDict ") +
                        std::to_string(k) + " has " + std::to_string(views[k].level_keys().size()) + " keys but TensorDict 0 has " +
                        std::to_string(first.level_keys().size()));
  };
  std::vector<AnyTensorDict> roots(tds.begin(), tds.end());
  AnyTensorDict out(batch_of(roots, path), tds[0].device());
  level(level, roots, out);
  return out;
}
}  // namespace detail

// Stacks TensorDicts with the same keys along a new batch dim.
TENSORDICT_DECL AnyTensorDict stack(c10::ArrayRef<AnyTensorDict> tds, std::int64_t dim = 0);
inline AnyTensorDict stack(std::initializer_list<AnyTensorDict> tds, std::int64_t dim = 0) {
  return stack(c10::ArrayRef<AnyTensorDict>(tds.begin(), tds.size()), dim);
}

// Concatenates TensorDicts with the same keys along an existing batch dim.
TENSORDICT_DECL AnyTensorDict cat(c10::ArrayRef<AnyTensorDict> tds, std::int64_t dim = 0);
inline AnyTensorDict cat(std::initializer_list<AnyTensorDict> tds, std::int64_t dim = 0) {
  return cat(c10::ArrayRef<AnyTensorDict>(tds.begin(), tds.size()), dim);
}

}  // namespace tensordict

#if TENSORDICT_DEFINITIONS
namespace tensordict {
TENSORDICT_DECL AnyTensorDict::AnyTensorDict(c10::IntArrayRef batch_size, std::optional<at::Device> device)
    : root_(std::make_shared<detail::any_root>(detail::any_root{batch_size.size(), device, {}})),
      node_(std::make_shared<detail::any_node>()) {
  node_->batch.assign(batch_size.begin(), batch_size.end());
}

TENSORDICT_DECL detail::schema_table detail::make_schema_table(
    entry_table leaves, entry_table non_tensors, std::size_t node_count, const std::size_t* parents) {
  schema_table t;
  for (std::size_t i = 0; i < leaves.count; ++i) t.leaves.push_back(leaves.path(i));
  for (std::size_t i = 0; i < non_tensors.count; ++i) t.non_tensors.push_back(non_tensors.path(i));
  for (std::size_t k = 0; k < node_count; ++k) t.node_paths.push_back(node_path_of(k, parents, leaves, non_tensors));
  t.parents.assign(parents, parents + node_count);
  return t;
}

TENSORDICT_DECL std::shared_ptr<detail::storage> AnyTensorDict::typed_storage(typed_parts parts, detail::entry_table leaves,
                                                                              std::size_t node_count, std::size_t non_tensor_count,
                                                                              const std::size_t* parents) const {
  auto st = detail::make_storage(batch_size(), device(), leaves.count, node_count, non_tensor_count, parents);
  detail::store_checked_leaves(*st, parts.leaves.data(), leaves, "TensorDict");
  st->batches = std::move(parts.batches);
  std::move(parts.non_tensors.begin(), parts.non_tensors.end(), st->non_tensors.begin());
  return st;
}

TENSORDICT_DECL detail::typed_contents detail::contents_of_storage(const storage& st, std::size_t leaf_base, std::size_t leaf_count,
                                                                   std::size_t non_tensor_base, std::size_t non_tensor_count,
                                                                   std::size_t node_base, std::size_t node_count, batch_names names,
                                                                   bool locked) {
  typed_contents c{{}, {}, {}, st.batches[node_base], std::move(names), locked};
  c.leaves.assign(st.leaves.begin() + static_cast<std::ptrdiff_t>(leaf_base),
                  st.leaves.begin() + static_cast<std::ptrdiff_t>(leaf_base + leaf_count));
  for (std::size_t i = 0; i < non_tensor_count; ++i) c.non_tensors.push_back(&st.non_tensors[non_tensor_base + i]);
  for (std::size_t k = 0; k < node_count; ++k) c.node_batches.push_back(st.batches[node_base + k]);
  return c;
}

TENSORDICT_DECL void detail::any_node::put_non_tensor(std::string_view name, NonTensor value) {
  if (const std::size_t i = find(name); i != npos) erase_at(i);
  if (const std::size_t i = find_non_tensor(name); i != npos) {
    non_tensors[i] = std::move(value);
    return;
  }
  non_tensor_names.emplace_back(name);
  non_tensors.push_back(std::move(value));
}

TENSORDICT_DECL detail::any_node& detail::any_node::add_child(std::string name, std::shared_ptr<any_node> child) {
  if (!child) {
    child = std::make_shared<any_node>();
    child->batch = batch;
  }
  child->parent = weak_from_this();
  positions.emplace(name, names.size());
  names.push_back(std::move(name));
  tensors.emplace_back();
  children.push_back(std::move(child));
  return *children.back();
}

TENSORDICT_DECL void detail::any_node::erase_at(std::size_t i) {
  if (children[i]) children[i]->parent.reset();  // a view of the sub-tree lives on, detached
  names.erase(names.begin() + static_cast<std::ptrdiff_t>(i));
  tensors.erase(tensors.begin() + static_cast<std::ptrdiff_t>(i));
  children.erase(children.begin() + static_cast<std::ptrdiff_t>(i));
  positions.clear();
  for (std::size_t k = 0; k < names.size(); ++k) positions.emplace(names[k], k);
}

TENSORDICT_DECL void detail::any_node::put(std::string_view name, at::Tensor tensor, std::shared_ptr<detail::any_node> child) {
  if (const std::size_t k = find_non_tensor(name); k != npos) erase_non_tensor(k);
  const std::size_t i = find(name);
  if (i == npos) {
    if (child) add_child(std::string(name), std::move(child));
    else add_leaf(std::string(name), std::move(tensor));
    return;
  }
  if (children[i]) children[i]->parent.reset();  // a view of the old sub-tree lives on, detached
  if (child) child->parent = weak_from_this();
  tensors[i] = std::move(tensor);
  children[i] = std::move(child);
}

TENSORDICT_DECL std::string detail::any_node::listing() const {
  if (names.empty() && non_tensor_names.empty()) return "none (it is empty)";
  std::vector<std::string> sorted = names;
  sorted.insert(sorted.end(), non_tensor_names.begin(), non_tensor_names.end());
  std::sort(sorted.begin(), sorted.end());
  return quoted_names(sorted);
}

TENSORDICT_DECL std::vector<any_key_path> AnyTensorDict::keys() const {
  std::vector<any_key_path> out;
  for_each_leaf([&](const any_key_path& p, const at::Tensor&) { out.push_back(p); });
  return out;
}

TENSORDICT_DECL std::vector<at::Tensor> AnyTensorDict::values() const {
  std::vector<at::Tensor> out;
  for_each_leaf([&](const any_key_path&, const at::Tensor& t) { out.push_back(t); });
  return out;
}

TENSORDICT_DECL std::vector<std::pair<any_key_path, at::Tensor>> AnyTensorDict::items() const {
  std::vector<std::pair<any_key_path, at::Tensor>> out;
  for_each_leaf([&](const any_key_path& p, const at::Tensor& t) { out.emplace_back(p, t); });
  return out;
}

TENSORDICT_DECL std::vector<any_key_path> AnyTensorDict::keys(bool include_nested, bool leaves_only) const {
  std::vector<any_key_path> out;
  walk(include_nested, leaves_only, [&](const any_key_path& p, const detail::any_node&, std::size_t) { out.push_back(p); });
  return out;
}

TENSORDICT_DECL std::vector<std::pair<any_key_path, AnyTensorDict::item>> AnyTensorDict::items(bool include_nested, bool leaves_only) const {
  std::vector<std::pair<any_key_path, item>> out;
  walk(include_nested, leaves_only, [&](const any_key_path& p, const detail::any_node& node, std::size_t i) {
    if (node.is_leaf(i)) out.emplace_back(p, item(std::in_place_index<0>, node.tensors[i]));
    else out.emplace_back(p, item(std::in_place_index<1>, AnyTensorDict(root_, node.children[i])));
  });
  return out;
}

TENSORDICT_DECL std::size_t AnyTensorDict::leaf_count() const {
  std::size_t n = 0;
  for_each_leaf([&](const any_key_path&, const at::Tensor&) { ++n; });
  return n;
}

TENSORDICT_DECL bool AnyTensorDict::contains(c10::ArrayRef<std::string> path) const {
  return locate(path).node != nullptr || locate_non_tensor(path).node != nullptr;
}

TENSORDICT_DECL bool AnyTensorDict::is_leaf(c10::ArrayRef<std::string> path) const {
  auto at = locate(path);
  return at.node && at.node->is_leaf(at.index);
}

TENSORDICT_DECL const at::Tensor& AnyTensorDict::get(c10::ArrayRef<std::string> path) const {
  auto at = resolve(path, "AnyTensorDict.get");
  if (!at.node->is_leaf(at.index))
    throw key_error("AnyTensorDict.get(" + to_string(path) + "): this key holds a sub-tree (keys " +
                    at.node->children[at.index]->listing() + "), not a tensor; use get_tensordict(...) for it");
  return at.node->tensors[at.index];
}

TENSORDICT_DECL AnyTensorDict AnyTensorDict::get_tensordict(c10::ArrayRef<std::string> path) const {
  if (path.empty()) return *this;
  auto at = resolve(path, "AnyTensorDict.get_tensordict");
  if (at.node->is_leaf(at.index))
    throw key_error("AnyTensorDict.get_tensordict(" + to_string(path) + "): this key holds a tensor (" +
                    describe(at.node->tensors[at.index]) + "), not a sub-tree; use get(...) for it");
  return AnyTensorDict(root_, at.node->children[at.index]);
}

TENSORDICT_DECL AnyTensorDict& AnyTensorDict::set(c10::ArrayRef<std::string> path, at::Tensor value) {
  if (path.empty()) throw key_error("AnyTensorDict.set: needs a key path of at least one key");
  if (!value.defined()) throw value_error("AnyTensorDict.set(" + to_string(path) + "): the tensor is undefined");
  value = checked_leaf(std::move(value), path, "AnyTensorDict.set");
  parent_for_write(path, "AnyTensorDict.set").put(path.back(), std::move(value), nullptr);
  return *this;
}

TENSORDICT_DECL AnyTensorDict& AnyTensorDict::set(c10::ArrayRef<std::string> path, const AnyTensorDict& value) {
  if (path.empty()) throw key_error("AnyTensorDict.set: needs a key path of at least one key");
  if (const auto parent = batch_at(path); !detail::starts_with(value.batch_size(), parent))
    throw shape_error("AnyTensorDict.set(" + to_string(path) + "): expected a TensorDict whose batch_size starts with " +
                      format_sizes(parent) + ", got batch_size=" + format_sizes(value.batch_size()));
  auto copy = copy_node(*value.node_);
  if (device()) relocate(*copy, *device());
  parent_for_write(path, "AnyTensorDict.set").put(path.back(), at::Tensor(), std::move(copy));
  return *this;
}

TENSORDICT_DECL AnyTensorDict& AnyTensorDict::set_(c10::ArrayRef<std::string> path, const at::Tensor& value) {
  const at::Tensor& leaf = get(path);
  detail::check_copy(leaf, value, "AnyTensorDict.set_", to_string(path));
  at::Tensor(leaf).copy_(value);
  return *this;
}

TENSORDICT_DECL AnyTensorDict AnyTensorDict::select(const std::vector<any_key_path>& paths, bool strict) const {
  AnyTensorDict out(batch_size(), device());
  out.root_->names = stored_names_padded();
  for (const auto& path : paths) {
    if (!strict && !contains(path)) continue;
    if (auto nt = locate_non_tensor(path); nt.node) {
      detail::any_node& target = out.parent_for_write(path, "AnyTensorDict.select", this);
      if (target.find(path.back()) != npos || target.find_non_tensor(path.back()) != npos)
        throw key_error("AnyTensorDict.select: the key " + to_string(path) + " is given twice");
      target.put_non_tensor(path.back(), nt.node->non_tensors[nt.index]);
      continue;
    }
    auto at = resolve(path, "AnyTensorDict.select");
    out.put_entry(path, *at.node, at.index, "AnyTensorDict.select", this);
  }
  return out;
}

TENSORDICT_DECL AnyTensorDict AnyTensorDict::exclude(const std::vector<any_key_path>& paths) const {
  AnyTensorDict out(batch_size(), device());
  out.root_->names = stored_names_padded();
  out.node_ = copy_node(*node_);
  for (const auto& path : paths)
    if (out.contains(path)) out.erase(path);
  return out;
}

TENSORDICT_DECL AnyTensorDict& AnyTensorDict::rename_key_(c10::ArrayRef<std::string> from, c10::ArrayRef<std::string> to, bool safe) {
  const std::string where = "AnyTensorDict.rename_key_(" + to_string(from) + ", " + to_string(to) + "): ";
  const location nt = locate_non_tensor(from);
  const location at = nt.node ? nt : resolve(from, "AnyTensorDict.rename_key_");
  check_unlocked(*at.node, from, "AnyTensorDict.rename_key_");
  if (from.equals(to)) return *this;
  if (!nt.node && to.size() > from.size() && to.slice(0, from.size()).equals(from))
    throw key_error(where + "the new key is inside the old one");
  if (safe && contains(to)) throw key_error(where + "the new key exists (safe=true)");
  const auto there = batch_at(to);
  if (nt.node) {
    NonTensor moved = nt.node->non_tensors[nt.index];
    if (moved.is_stack() && !there.equals(moved.shape()))
      throw shape_error(where + moved.repr() + " does not have the batch size " + format_sizes(there) + " of the level that would hold it");
    detail::any_node& target = parent_for_write(to, "AnyTensorDict.rename_key_");  // the last call that may throw
    nt.node->erase_non_tensor(nt.index);
    target.put_non_tensor(to.back(), std::move(moved));
    return *this;
  }
  at::Tensor tensor = at.node->tensors[at.index];
  std::shared_ptr<detail::any_node> child = at.node->children[at.index];
  const auto moved = child ? c10::IntArrayRef(child->batch) : tensor.sizes();
  if (!detail::starts_with(moved, there))
    throw shape_error(where + (child ? "the TensorDict's batch_size=" + format_sizes(moved) : "the leaf " + describe(tensor)) +
                      " does not start with the batch size " + format_sizes(there) + " of the level that would hold it");
  detail::any_node& target = parent_for_write(to, "AnyTensorDict.rename_key_");  // the last call that may throw
  at.node->erase_at(at.index);
  target.put(to.back(), std::move(tensor), std::move(child));
  return *this;
}

TENSORDICT_DECL AnyTensorDict& AnyTensorDict::update(const AnyTensorDict& other) {
  std::vector<std::pair<any_key_path, at::Tensor>> incoming;
  other.for_each_leaf([&](const any_key_path& path, const at::Tensor& t) {
    auto at = locate(path);
    if (at.node && !at.node->is_leaf(at.index))
      throw key_error("AnyTensorDict.update: " + to_string(path) + " is a sub-tree here and a tensor in other");
    check_writable_path(path, "AnyTensorDict.update");
    incoming.emplace_back(path, checked_leaf(t, path, "AnyTensorDict.update", &other));
  });
  std::vector<std::pair<any_key_path, NonTensor>> non_tensors;
  for (const any_key_path& path : other.non_tensor_keys()) {
    check_writable_path(path, "AnyTensorDict.update");
    const NonTensor& v = other.non_tensor(path);
    if (v.is_stack() && !batch_at(path, other).equals(v.shape()))
      throw shape_error("AnyTensorDict.update: " + to_string(path) + " is " + v.repr() + ", but the level here has batch_size=" +
                        format_sizes(batch_at(path, other)));
    non_tensors.emplace_back(path, v);
  }
  for (auto& [path, t] : incoming)
    parent_for_write(path, "AnyTensorDict.update", &other).put(path.back(), std::move(t), nullptr);
  for (auto& [path, v] : non_tensors) parent_for_write(path, "AnyTensorDict.update", &other).put_non_tensor(path.back(), std::move(v));
  return *this;
}

TENSORDICT_DECL AnyTensorDict& AnyTensorDict::update_(const AnyTensorDict& other) {
  std::vector<std::pair<NonTensor*, NonTensor>> non_tensor_writes = non_tensors_written_at(other, {}, "update_");
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
  other.for_each_leaf([&](const any_key_path& path, const at::Tensor& t) {
    auto at = resolve(path, "AnyTensorDict.update_");
    if (!at.node->is_leaf(at.index))
      throw key_error("AnyTensorDict.update_: " + to_string(path) + " is a sub-tree here and a tensor in other");
    detail::check_copy(at.node->tensors[at.index], t, "AnyTensorDict.update_", to_string(path));
    pairs.emplace_back(at.node->tensors[at.index], t);
  });
  for (auto& [mine, theirs] : pairs) mine.copy_(theirs);
  for (auto& [entry, value] : non_tensor_writes) *entry = std::move(value);  // cannot throw
  return *this;
}

TENSORDICT_DECL AnyTensorDict& AnyTensorDict::erase(c10::ArrayRef<std::string> path) {
  if (auto nt = locate_non_tensor(path); nt.node) {
    check_unlocked(*nt.node, path, "AnyTensorDict.erase");
    nt.node->erase_non_tensor(nt.index);
    return *this;
  }
  auto at = resolve(path, "AnyTensorDict.erase");
  check_unlocked(*at.node, path, "AnyTensorDict.erase");
  at.node->erase_at(at.index);
  return *this;
}

TENSORDICT_DECL AnyTensorDict& AnyTensorDict::set_non_tensor(c10::ArrayRef<std::string> path, NonTensor value) {
  if (path.empty()) throw key_error("AnyTensorDict.set_non_tensor: needs a key path of at least one key");
  if (value.is_stack() && !batch_at(path).equals(value.shape()))
    throw shape_error("AnyTensorDict.set_non_tensor(" + to_string(path) + "): a NonTensorStack of shape " +
                      format_sizes(value.shape()) + " where the batch size is " + format_sizes(batch_at(path)));
  parent_for_write(path, "AnyTensorDict.set_non_tensor").put_non_tensor(path.back(), std::move(value));
  return *this;
}

TENSORDICT_DECL const NonTensor& AnyTensorDict::non_tensor(c10::ArrayRef<std::string> path) const {
  auto at = locate_non_tensor(path);
  if (!at.node) {
    if (locate(path).node)
      throw key_error("AnyTensorDict.non_tensor(" + to_string(path) + "): it holds a " +
                      (is_leaf(path) ? "tensor (" + describe(get(path)) + ")" : std::string("sub-tree")) +
                      ", not non-tensor data; use get(...) for it");
    (void)resolve(path, "AnyTensorDict.non_tensor");  // throws, naming the keys there
  }
  return at.node->non_tensors[at.index];
}

TENSORDICT_DECL std::vector<any_key_path> AnyTensorDict::non_tensor_keys(bool include_nested) const {
  std::vector<any_key_path> out;
  any_key_path path;
  auto level = [&](auto& self, const detail::any_node& node) -> void {
    for (const std::string& name : node.non_tensor_names) {
      path.push_back(name);
      out.push_back(path);
      path.pop_back();
    }
    if (!include_nested) return;
    for (std::size_t i = 0; i < node.size(); ++i)
      if (!node.is_leaf(i)) {
        path.push_back(node.names[i]);
        self(self, *node.children[i]);
        path.pop_back();
      }
  };
  level(level, *node_);
  return out;
}

TENSORDICT_DECL AnyTensorDict AnyTensorDict::flatten_keys(std::string_view separator) const {
  AnyTensorDict out(batch_size(), device());
  for_each_leaf([&](const any_key_path& path, const at::Tensor& t) {
    const std::string joined = join(path, separator);
    if (out.node_->find(joined) != npos)
      throw key_error("AnyTensorDict.flatten_keys: two leaves flatten to \"" + joined + "\"");
    out.insert_leaf({joined}, t);
  });
  for (const any_key_path& path : non_tensor_keys()) {
    const std::string joined = join(path, separator);
    if (out.contains({joined})) throw key_error("AnyTensorDict.flatten_keys: two entries flatten to \"" + joined + "\"");
    out.set_non_tensor({joined}, non_tensor(path));
  }
  return out;
}

TENSORDICT_DECL AnyTensorDict AnyTensorDict::unflatten_keys(std::string_view separator) const {
  if (separator.empty()) throw value_error("AnyTensorDict.unflatten_keys: the separator is empty");
  AnyTensorDict out(batch_size(), device());
  for_each_leaf([&](const any_key_path& path, const at::Tensor& t) {
    out.insert_leaf(split_keys(path, separator), t);
  });
  for (const any_key_path& path : non_tensor_keys()) {
    const any_key_path split = split_keys(path, separator);
    if (out.contains(split)) throw key_error("AnyTensorDict.unflatten_keys: the key " + to_string(split) + " is given twice");
    out.set_non_tensor(split, non_tensor(path));
  }
  return out;
}

TENSORDICT_DECL AnyTensorDict& AnyTensorDict::unlock_() {
  for (auto p = node_->parent.lock(); p; p = p->parent.lock())
    if (p->locked)
      throw lock_error("TensorDict.unlock_: this TensorDict is part of a locked TensorDict; unlock that one instead");
  set_locked(*node_, false);
  return *this;
}

TENSORDICT_DECL std::string AnyTensorDict::repr(print_style style) const {
  std::string out = "TensorDict(batch_size=" + format_sizes(batch_size());
  if (device()) out += ", device=" + device()->str();
  out += ", fields={";
  print_level(out, *node_, style == print_style::multiline);
  return out + "})";
}

TENSORDICT_DECL AnyTensorDict& AnyTensorDict::write_other_at(const AnyTensorDict& other, c10::ArrayRef<at::indexing::TensorIndex> indices, const char* op) {
  std::vector<std::pair<NonTensor*, NonTensor>> non_tensor_writes = non_tensors_written_at(other, indices, op);
  const std::string call = std::string("AnyTensorDict.") + op;
  std::vector<pending_write> writes;
  writes.reserve(other.leaf_count());
  other.for_each_leaf([&](const any_key_path& path, const at::Tensor& t) {
    auto at = resolve(path, call.c_str());
    if (!at.node->is_leaf(at.index))
      throw key_error(call + ": " + to_string(path) + " is a sub-tree here and a tensor in other");
    writes.push_back({at.node->tensors[at.index], t});
  });
  write_at(writes, indices, op, [&](std::size_t k) {  // other's k-th leaf
    std::string name;
    std::size_t n = 0;
    other.for_each_leaf([&](const any_key_path& path, const at::Tensor&) {
      if (n++ == k) name = to_string(path);
    });
    return name;
  });
  for (auto& [entry, value] : non_tensor_writes) *entry = std::move(value);  // cannot throw
  return *this;
}

TENSORDICT_DECL batch_names AnyTensorDict::stored_names_padded() const {
  return root_->names.empty() ? batch_names{} : detail::names_or_none(root_->names, batch_dims());
}

TENSORDICT_DECL any_key_path AnyTensorDict::split_keys(const any_key_path& path, std::string_view separator) {
  any_key_path split;
  for (const auto& part : path) {
    std::size_t start = 0;
    for (std::size_t pos; (pos = part.find(separator, start)) != std::string::npos; start = pos + separator.size())
      split.push_back(part.substr(start, pos - start));
    split.push_back(part.substr(start));
  }
  return split;
}

TENSORDICT_DECL AnyTensorDict::location AnyTensorDict::locate(c10::ArrayRef<std::string> path) const {
  detail::any_node* node = node_.get();
  for (std::size_t k = 0; k < path.size(); ++k) {
    const std::size_t i = node->find(path[k]);
    if (i == npos) return {};
    if (k + 1 == path.size()) return {node, i};
    if (node->is_leaf(i)) return {};
    node = node->children[i].get();
  }
  return {};
}

TENSORDICT_DECL std::vector<std::pair<NonTensor*, NonTensor>> AnyTensorDict::non_tensors_written_at(const AnyTensorDict& other, c10::ArrayRef<at::indexing::TensorIndex> indices, const char* op) {
  std::vector<std::pair<NonTensor*, NonTensor>> out;
  const std::vector<any_key_path> paths = other.non_tensor_keys();
  if (paths.empty()) return out;
  const auto batch = detail::batch_indices(indices, batch_dims());
  const std::string files = detail::written_through_file(values());
  for (const any_key_path& path : paths) {
    const std::string where = std::string("TensorDict.") + op + "(" + to_string(path) + "): ";
    auto at = locate_non_tensor(path);
    if (!at.node) throw key_error(where + "other holds non-tensor data there, this TensorDict " + (contains(path) ? "a tensor or a sub-tree" : "nothing"));
    NonTensor& mine = at.node->non_tensors[at.index];
    if (auto written = detail::non_tensor_written_at(mine, other.non_tensor(path), at.node->batch, batch, where, files))
      out.emplace_back(&mine, std::move(*written));
  }
  return out;
}

TENSORDICT_DECL AnyTensorDict::location AnyTensorDict::locate_non_tensor(c10::ArrayRef<std::string> path) const {
  if (path.empty()) return {};
  const location parent = path.size() == 1 ? location{} : locate(path.slice(0, path.size() - 1));
  if (path.size() > 1 && (!parent.node || parent.node->is_leaf(parent.index))) return {};
  detail::any_node* node = path.size() == 1 ? node_.get() : parent.node->children[parent.index].get();
  const std::size_t i = node->find_non_tensor(path.back());
  return i == npos ? location{} : location{node, i};
}

TENSORDICT_DECL AnyTensorDict::location AnyTensorDict::resolve(c10::ArrayRef<std::string> path, const char* op) const {
  if (path.empty()) throw key_error(std::string(op) + ": needs a key path of at least one key");
  detail::any_node* node = node_.get();
  for (std::size_t k = 0;; ++k) {
    const std::size_t i = node->find(path[k]);
    if (i == npos) {
      if (const std::size_t j = node->find_non_tensor(path[k]); j != npos)
        throw key_error(std::string(op) + "(" + to_string(path) + "): " + to_string(path.slice(0, k + 1)) +
                        " holds non-tensor data (" + node->non_tensors[j].repr() +
                        "), not a tensor or a sub-tree; read it with get_non_tensor(...) or non_tensor(...)");
      std::string where = k == 0 ? "at the top level" : "under " + to_string(path.slice(0, k));
      throw key_error(std::string(op) + "(" + to_string(path) + "): no key \"" + path[k] + "\" " + where +
                      "; the keys there are " + node->listing());
    }
    if (k + 1 == path.size()) return {node, i};
    if (node->is_leaf(i))
      throw key_error(std::string(op) + "(" + to_string(path) + "): the key path goes on after the leaf " +
                      to_string(path.slice(0, k + 1)) + " (" + describe(node->tensors[i]) + ")");
    node = node->children[i].get();
  }
}

TENSORDICT_DECL c10::IntArrayRef AnyTensorDict::batch_at(c10::ArrayRef<std::string> path) const {
  const detail::any_node* node = node_.get();
  for (std::size_t k = 0; k + 1 < path.size(); ++k) {
    const std::size_t i = node->find(path[k]);
    if (i == npos || node->is_leaf(i)) break;
    node = node->children[i].get();
  }
  return node->batch;
}

TENSORDICT_DECL c10::IntArrayRef AnyTensorDict::batch_at(c10::ArrayRef<std::string> path, const AnyTensorDict& like) const {
  const detail::any_node* node = node_.get();
  const detail::any_node* theirs = like.node_.get();
  bool mine = true;
  for (std::size_t k = 0; k + 1 < path.size(); ++k) {
    const std::size_t j = theirs->find(path[k]);
    if (j == npos || theirs->is_leaf(j)) break;
    theirs = theirs->children[j].get();
    const std::size_t i = mine ? node->find(path[k]) : npos;
    if (i == npos || node->is_leaf(i)) {
      if (!detail::starts_with(theirs->batch, node->batch))
        throw shape_error("AnyTensorDict.update: the TensorDict " + to_string(path.slice(0, k + 1)) + " has batch_size=" +
                          format_sizes(theirs->batch) + ", which does not start with " + format_sizes(node->batch));
      mine = false;
      node = theirs;
    } else {
      node = node->children[i].get();
    }
  }
  return node->batch;
}

TENSORDICT_DECL detail::any_node& AnyTensorDict::parent_for_write(c10::ArrayRef<std::string> path, const char* op, const AnyTensorDict* like) {
  detail::any_node* node = node_.get();
  std::size_t k = 0;
  for (; k + 1 < path.size(); ++k) {
    const std::size_t i = node->find(path[k]);
    if (i == npos) {
      check_not_non_tensor(*node, path, k, op);
      break;
    }
    if (node->is_leaf(i))
      throw key_error(std::string(op) + "(" + to_string(path) + "): " + to_string(path.slice(0, k + 1)) +
                      " holds a tensor (" + describe(node->tensors[i]) + "), so it cannot hold the key \"" +
                      path[k + 1] + "\"");
    node = node->children[i].get();
  }
  check_unlocked(*node, path, op);
  for (; k + 1 < path.size(); ++k) {
    node = &node->add_child(path[k]);
    if (!like) continue;
    auto theirs = like->locate(path.slice(0, k + 1));
    if (theirs.node && !theirs.node->is_leaf(theirs.index)) node->batch = theirs.node->children[theirs.index]->batch;
  }
  return *node;
}

TENSORDICT_DECL void AnyTensorDict::check_not_non_tensor(const detail::any_node& node, c10::ArrayRef<std::string> path, std::size_t k, const char* op) {
  if (const std::size_t j = node.find_non_tensor(path[k]); j != npos)
    throw key_error(std::string(op) + "(" + to_string(path) + "): " + to_string(path.slice(0, k + 1)) + " holds non-tensor data (" +
                    node.non_tensors[j].repr() + "), so it cannot hold the key \"" + path[k + 1] + "\"");
}

TENSORDICT_DECL void AnyTensorDict::check_writable_path(c10::ArrayRef<std::string> path, const char* op) const {
  const detail::any_node* node = node_.get();
  for (std::size_t k = 0; k + 1 < path.size(); ++k) {
    const std::size_t i = node->find(path[k]);
    if (i == npos) {
      check_not_non_tensor(*node, path, k, op);
      break;
    }
    if (node->is_leaf(i))
      throw key_error(std::string(op) + "(" + to_string(path) + "): " + to_string(path.slice(0, k + 1)) + " holds a tensor");
    node = node->children[i].get();
  }
  check_unlocked(*node, path, op);
}

TENSORDICT_DECL void AnyTensorDict::put_entry(c10::ArrayRef<std::string> path, const detail::any_node& from, std::size_t index, const char* op, const AnyTensorDict* like) {
  detail::any_node& target = parent_for_write(path, op, like);
  if (target.find(path.back()) != npos || target.find_non_tensor(path.back()) != npos)
    throw key_error(std::string(op) + ": the key " + to_string(path) + " is given twice");
  if (from.is_leaf(index)) target.add_leaf(path.back(), from.tensors[index]);
  else target.add_child(path.back(), copy_node(*from.children[index]));
}

TENSORDICT_DECL void AnyTensorDict::check_unlocked(const detail::any_node& node, c10::ArrayRef<std::string> path, const char* op) {
  if (node.locked)
    throw lock_error(std::string(op) + "(" + to_string(path) +
                     "): the TensorDict is locked, so its keys cannot be replaced or removed. Write into the tensor "
                     "in place (get(...).copy_(value)) or call unlock_() first.");
}

TENSORDICT_DECL void AnyTensorDict::insert_leaf(const any_key_path& path, const at::Tensor& t) {
  detail::any_node* node = node_.get();
  for (std::size_t k = 0; k + 1 < path.size(); ++k) {
    const std::size_t i = node->find(path[k]);
    if (i == npos) {
      check_not_non_tensor(*node, path, k, "AnyTensorDict");
      node = &node->add_child(path[k]);
      continue;
    }
    if (node->is_leaf(i))
      throw key_error("AnyTensorDict: " + to_string(path) + " needs " + to_string(c10::ArrayRef<std::string>(path).slice(0, k + 1)) +
                      " to be a sub-tree, but it is a leaf");
    node = node->children[i].get();
  }
  if (node->find(path.back()) != npos || node->find_non_tensor(path.back()) != npos)
    throw key_error("AnyTensorDict: the key " + to_string(path) + " is given twice");
  node->add_leaf(path.back(), t);
}

TENSORDICT_DECL at::Tensor AnyTensorDict::checked_leaf(at::Tensor t, c10::ArrayRef<std::string> path, const char* op, const AnyTensorDict* like) const {
  return detail::checked_leaf(std::move(t), device(), like ? batch_at(path, *like) : batch_at(path), op, {}, to_string(path));
}

TENSORDICT_DECL std::shared_ptr<detail::any_node> AnyTensorDict::copy_node(const detail::any_node& from) {
  auto out = std::make_shared<detail::any_node>();
  out->batch = from.batch;
  for (std::size_t i = 0; i < from.size(); ++i) {
    if (from.children[i]) out->add_child(from.names[i], copy_node(*from.children[i]));
    else out->add_leaf(from.names[i], from.tensors[i]);
  }
  out->non_tensor_names = from.non_tensor_names;
  out->non_tensors = from.non_tensors;
  return out;
}

TENSORDICT_DECL void AnyTensorDict::relocate(detail::any_node& node, at::Device device) {
  for (std::size_t i = 0; i < node.size(); ++i) {
    if (node.children[i])
      relocate(*node.children[i], device);
    else if (node.tensors[i].device() != device)
      node.tensors[i] = node.tensors[i].to(device);
  }
}

TENSORDICT_DECL void AnyTensorDict::set_locked(detail::any_node& node, bool locked) {
  node.locked = locked;
  for (auto& c : node.children)
    if (c) set_locked(*c, locked);
}

TENSORDICT_DECL AnyTensorDict AnyTensorDict::auto_batched(std::optional<std::size_t> batch_dims) const {
  AnyTensorDict out(batch_size(), device());
  out.node_ = auto_level(*node_, batch_dims);
  if (out.batch_size().equals(batch_size())) out.root_->names = stored_names_padded();
  out.root_->batch_dims = out.batch_dims();
  return out;
}

TENSORDICT_DECL std::shared_ptr<detail::any_node> AnyTensorDict::auto_level(const detail::any_node& from, std::optional<std::size_t> batch_dims) {
  auto node = std::make_shared<detail::any_node>();
  std::vector<c10::IntArrayRef> shapes;
  for (std::size_t i = 0; i < from.size(); ++i) {
    if (from.children[i]) {
      node->add_child(from.names[i], auto_level(*from.children[i], batch_dims));
      shapes.push_back(node->children.back()->batch);
    } else {
      node->add_leaf(from.names[i], from.tensors[i]);
      shapes.push_back(from.tensors[i].sizes());
    }
  }
  for (const NonTensor& v : from.non_tensors)
    if (v.is_stack()) shapes.push_back(v.shape());
  node->batch = detail::common_batch(shapes, from.batch, batch_dims);
  for (std::size_t i = 0; i < from.non_tensors.size(); ++i) {
    const NonTensor& v = from.non_tensors[i];
    if (v.is_stack() && !c10::IntArrayRef(node->batch).equals(v.shape()))
      throw value_error("TensorDict.auto_batch_size_: " + from.non_tensor_names[i] + " holds one value per element of " +
                        format_sizes(v.shape()) + ", but the batch size would become " + format_sizes(node->batch));
    node->non_tensor_names.push_back(from.non_tensor_names[i]);
    node->non_tensors.push_back(v);
  }
  return node;
}

TENSORDICT_DECL void AnyTensorDict::take_typed(const detail::schema_table& table, const detail::typed_contents& typed) {
  for (std::size_t i = 0; i < table.leaves.size(); ++i)
    if (typed.leaves[i].defined()) insert_leaf(any_key_path(table.leaves[i].begin(), table.leaves[i].end()), typed.leaves[i]);
  for (std::size_t i = 0; i < table.non_tensors.size(); ++i)
    if (const auto& v = *typed.non_tensors[i]) {
      const any_key_path path(table.non_tensors[i].begin(), table.non_tensors[i].end());
      parent_for_write(path, "AnyTensorDict").put_non_tensor(path.back(), *v);
    }
  // Nested levels keep dims of their own (a level without a set leaf or non-tensor entry is not kept).
  for (std::size_t k = 1; k < table.node_paths.size(); ++k)  // parents first
    if (const auto& path = table.node_paths[k]) {
      auto at = locate(any_key_path(path->begin(), path->end()));
      if (at.node && !at.node->is_leaf(at.index)) at.node->children[at.index]->batch = typed.node_batches[k].vec();
    }
  root_->names = detail::checked_names(typed.names, typed.batch_size, "names");
  if (typed.locked) lock_();
}

TENSORDICT_DECL AnyTensorDict::typed_parts AnyTensorDict::typed_parts_of(const detail::schema_table& table,
                                                                         const detail::typed_contents* like,
                                                                         to_typed_options options) const {
  std::string problems;
  auto problem = [&](std::string text) { problems += "\n  " + text; };
  // The index of `path` among the key paths `paths`, or npos.
  auto index_in = [](const std::vector<key_path>& paths, const any_key_path& path) {
    for (std::size_t i = 0; i < paths.size(); ++i) {
      const key_path& p = paths[i];
      if (p.size() == path.size() && std::equal(p.begin(), p.end(), path.begin())) return i;
    }
    return npos;
  };
  const std::size_t leaf_count = table.leaves.size(), non_tensor_count = table.non_tensors.size(), node_count = table.node_paths.size();
  typed_parts out{std::vector<at::Tensor>(leaf_count), std::vector<std::optional<NonTensor>>(non_tensor_count), {}};
  for_each_leaf([&](const any_key_path& path, const at::Tensor& t) {
    const std::size_t found = index_in(table.leaves, path);
    if (found == npos) {
      if (!options.ignore_extra) problem(to_string(path) + ": not a leaf of the schema (" + describe(t) + ")");
      return;
    }
    if (like) {
      const at::Tensor& expected = like->leaves[found];
      if (!expected.defined()) return problem(to_string(path) + ": unset in the reference, but given " + describe(t));
      if (expected.sizes() != t.sizes() || expected.scalar_type() != t.scalar_type())
        return problem(to_string(path) + ": expected " + describe(expected) + ", got " + describe(t));
    } else if (!detail::has_batch_prefix(t, batch_size())) {
      return problem(to_string(path) + ": " + describe(t) + " does not start with the batch size " + format_sizes(batch_size()));
    }
    out.leaves[found] = t;
  });
  for (const any_key_path& path : non_tensor_keys()) {
    const NonTensor& v = non_tensor(path);
    const std::size_t found = index_in(table.non_tensors, path);
    if (found == npos) {
      if (!options.ignore_extra)
        problem(to_string(path) + ": non-tensor data (" + v.repr() + "), which the schema has no non_tensor<...> field for");
    } else if (like && !*like->non_tensors[found])
      problem(to_string(path) + ": unset in the reference, but given " + v.repr());
    else
      out.non_tensors[found] = v;
  }
  // The batch size of each nested level of the schema: the level here, or its parent's where there is none.
  out.batches.assign(node_count, batch_size().vec());
  for (std::size_t k = 1; k < node_count; ++k) {  // parents first
    const auto& path = table.node_paths[k];
    auto at = path ? locate(any_key_path(path->begin(), path->end())) : location{};
    out.batches[k] = at.node && !at.node->is_leaf(at.index) ? at.node->children[at.index]->batch : out.batches[table.parents[k]];
    if (like && !like->node_batches[k].equals(out.batches[k]))
      problem(detail::node_name(path) + ": batch_size: expected " + format_sizes(like->node_batches[k]) + ", got " +
              format_sizes(out.batches[k]));
  }
  if (like) {
    if (like->batch_size != batch_size())
      problem("batch_size: expected " + format_sizes(like->batch_size) + ", got " + format_sizes(batch_size()));
    for (std::size_t i = 0; i < leaf_count; ++i)
      if (like->leaves[i].defined() && !out.leaves[i].defined() && !contains_path(table.leaves[i]))
        problem(to_string(table.leaves[i]) + ": missing (expected " + describe(like->leaves[i]) + ")");
    for (std::size_t i = 0; i < non_tensor_count; ++i)
      if (*like->non_tensors[i] && !out.non_tensors[i] && !contains_path(table.non_tensors[i]))
        problem(to_string(table.non_tensors[i]) + ": missing (expected " + (*like->non_tensors[i])->repr() + ")");
  } else if (!options.allow_missing) {
    for (std::size_t i = 0; i < leaf_count; ++i)
      if (!out.leaves[i].defined() && !contains_path(table.leaves[i]))
        problem(to_string(table.leaves[i]) + ": missing (to_typed<S>({.allow_missing = true}) leaves it unset)");
    for (std::size_t i = 0; i < non_tensor_count; ++i)
      if (!out.non_tensors[i] && !contains_path(table.non_tensors[i]))
        problem(to_string(table.non_tensors[i]) + ": missing (to_typed<S>({.allow_missing = true}) leaves it unset)");
  }
  if (!problems.empty()) throw key_error("AnyTensorDict.to_typed: the TensorDict does not match the schema:" + problems);
  return out;
}

TENSORDICT_DECL bool AnyTensorDict::contains_path(key_path lp) const {
  return contains(any_key_path(lp.begin(), lp.end()));
}

TENSORDICT_DECL void AnyTensorDict::print_level(std::string& out, const detail::any_node& node, bool multiline) {
  // Positions past node.size() are the non-tensor entries.
  std::vector<std::size_t> order(node.size() + node.non_tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto name = [&](std::size_t i) -> const std::string& {
    return i < node.size() ? node.names[i] : node.non_tensor_names[i - node.size()];
  };
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return name(a) < name(b); });
  bool first = true;
  for (std::size_t i : order) {
    if (!first) out += multiline ? "," : ", ";
    if (multiline) out += "\n    ";
    out += name(i);
    out += ": ";
    if (i >= node.size()) {
      out += node.non_tensors[i - node.size()].repr();
    } else if (node.children[i]) {
      out += '{';
      // A level with dims of its own beyond its parent's shows its batch size.
      if (node.children[i]->batch != node.batch) out += "batch_size=" + format_sizes(node.children[i]->batch) + (node.children[i]->size() + node.children[i]->non_tensors.size() ? ", " : "");
      print_level(out, *node.children[i], false);
      out += '}';
    } else {
      out += describe(node.tensors[i]);
    }
    first = false;
  }
}

TENSORDICT_DECL AnyTensorDict detail::unflatten_if_flat(const AnyTensorDict& td) {
  bool flat = !td.empty();
  bool dotted = false;
  for (const auto& name : td.level_keys()) {
    flat = flat && td.is_leaf({name});
    dotted = dotted || name.find('.') != std::string::npos;
  }
  return flat && dotted ? td.unflatten_keys(".") : td;
}

TENSORDICT_DECL AnyTensorDict stack(c10::ArrayRef<AnyTensorDict> tds, std::int64_t dim) {
  if (tds.empty()) throw shape_error("tensordict::stack: needs at least one TensorDict");
  const auto nb = static_cast<std::int64_t>(tds[0].batch_dims());
  if (dim < -(nb + 1) || dim > nb)
    throw index_error("tensordict::stack: dim " + std::to_string(dim) + " is out of range for batch_size=" +
                      format_sizes(tds[0].batch_size()));
  if (dim < 0) dim += nb + 1;
  auto batch_of = [&](const std::vector<AnyTensorDict>& views, const any_key_path& path) {
    for (std::size_t k = 1; k < views.size(); ++k)
      if (views[k].batch_size() != views[0].batch_size())
        throw shape_error("tensordict::stack: " + (path.empty() ? std::string() : "the TensorDict " + to_string(path) + " of ") +
                          "TensorDict 0 has batch_size=" + format_sizes(views[0].batch_size()) + " but TensorDict " +
                          std::to_string(k) + " has batch_size=" + format_sizes(views[k].batch_size()));
    std::vector<std::int64_t> batch = views[0].batch_size().vec();
    batch.insert(batch.begin() + dim, static_cast<std::int64_t>(views.size()));
    return batch;
  };
  return detail::join_tensordicts(tds, "tensordict::stack", batch_of,
                                  [&](const any_key_path& path, const std::vector<at::Tensor>& parts) {
                                    for (std::size_t k = 1; k < parts.size(); ++k)
                                      if (parts[k].sizes() != parts[0].sizes())
                                        throw shape_error("tensordict::stack: the leaf " + to_string(path) + " is " +
                                                          describe(parts[0]) + " in TensorDict 0 but " +
                                                          describe(parts[k]) + " in TensorDict " + std::to_string(k));
                                    return at::stack(parts, dim);
                                  });
}

TENSORDICT_DECL AnyTensorDict cat(c10::ArrayRef<AnyTensorDict> tds, std::int64_t dim) {
  detail::cat_batch_size(tds, dim);  // checks the batch sizes and resolves a negative dim
  auto batch_of = [&](const std::vector<AnyTensorDict>& views, const any_key_path&) {
    std::int64_t d = dim;
    return detail::cat_batch_size(views, d);
  };
  return detail::join_tensordicts(tds, "tensordict::cat", batch_of,
                                  [&](const any_key_path& path, const std::vector<at::Tensor>& parts) {
                                    return detail::cat_leaf(parts, dim, to_string(path));
                                  });
}
}  // namespace tensordict
#endif  // TENSORDICT_DEFINITIONS
