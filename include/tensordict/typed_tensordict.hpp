// The typed TensorDict: a tree of tensors whose keys are a compile-time schema.
//
//   using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;
//   tensordict::TensorDict<linear> td({at::randn({4, 3}), at::zeros({4})});
//   at::Tensor w = td.get<"weight">();      // a typo is a compile error
//   std::cout << td;                        // TensorDict(batch_size=[], fields={bias: f32[4], weight: f32[4,3]})
//
// Leaves live in one array in schema order; a key path is turned into an
// index by the compiler, so get<...>() does no string work at run time. A
// sub-tree obtained with get<...>() is a view that shares the parent's leaves
// and locks; its batch size is its level's, which starts with the parent's
// and may add dims (as Python's nested TensorDicts). A leaf may be unset (an
// undefined tensor): it is then absent from keys(), items(), printing and
// every operation, as a missing key is in Python.
//
// Non-tensor fields (schema<..., non_tensor<"task">>: a string, a number;
// non_tensor.hpp) live apart from the leaves: get<"task">() gives the
// NonTensor, keys(), values() and the arithmetic see tensors only, and verbs
// that rearrange the batch dims rearrange a NonTensorStack's values with them,
// as AnyTensorDict does.
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "schema.hpp"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/TensorIndexing.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include "detail/config.hpp"
#include "detail/format.hpp"
#include "detail/non_tensor_ops.hpp"
#include "detail/tensordict_ops.hpp"
#include "errors.hpp"
#include "keys.hpp"
#include "non_tensor.hpp"

namespace tensordict {

template <schema_type S>
class TensorDict;
class AnyTensorDict;

namespace detail {

template <class S, class Join>
void join_non_tensors(c10::ArrayRef<TensorDict<S>> tds, TensorDict<S>& out, const char* op, Join&& join);

// What a TensorDict and the views into it share.
struct storage {
  std::vector<at::Tensor> leaves;
  std::vector<std::optional<NonTensor>> non_tensors;  // one per non_tensor<...> field of the root schema
  // One per node of the root schema (0: the root): a nested level's batch
  // size starts with its parent's and may add dims (Python allows it).
  std::vector<std::vector<std::int64_t>> batches;
  std::optional<at::Device> device;
  batch_names names;                      // empty: no dim is named
  std::vector<std::uint8_t> locked;       // one flag per node of the root schema
  const std::size_t* node_parents = nullptr;  // static table of the root schema
};

template <class S>
constexpr bool schema_is_valid() {
  using error = typename duplicate_check<S>::error;
  if constexpr (!std::is_void_v<error>) compile_error::report<error>();
  return true;
}

template <class T>
struct is_tensordict : std::false_type {};
template <class S>
struct is_tensordict<TensorDict<S>> : std::true_type {};

inline bool has_batch_prefix(const at::Tensor& t, c10::IntArrayRef batch) {
  if (t.dim() < static_cast<std::int64_t>(batch.size())) return false;
  return t.sizes().slice(0, batch.size()) == batch;
}

// A nested level's name in messages: its key path, where an entry lies below it.
inline std::string node_name(const std::optional<std::vector<std::string_view>>& path) {
  return path ? format_key_path(path->data(), path->size()) : "(an empty sub-schema)";
}

// t on `device` where the TensorDict has one (an undefined t stays so).
inline at::Tensor on_device(at::Tensor t, const std::optional<at::Device>& device) {
  if (t.defined() && device && t.device() != *device) t = t.to(*device);
  return t;
}

// A leaf about to be stored (an undefined one stays so): moved to `device`, its leading dims
// checked against `batch`, its level's batch size; errors name `path`, or `leaf` where path is empty.
// Not a template, so that every schema's set, update and apply call one copy of it.
TENSORDICT_DECL at::Tensor checked_leaf(at::Tensor t, const std::optional<at::Device>& device, c10::IntArrayRef batch, const char* op,
                                        key_path leaf, const std::string& path);
// A new TensorDict's storage: every node's batch size `batch_size`, no leaf or non-tensor entry set.
TENSORDICT_DECL std::shared_ptr<storage> make_storage(c10::IntArrayRef batch_size, std::optional<at::Device> device,
                                                      std::size_t leaf_count, std::size_t node_count, std::size_t non_tensor_count,
                                                      const std::size_t* node_parents);
// The node batch sizes of a TensorDict whose nodes had batch sizes `old` (node 0 first) once its own
// becomes `batch`, its nested levels following `rule`; shape_error (naming node_name(k)) where one
// would not start with its parent's.
TENSORDICT_DECL std::vector<std::vector<std::int64_t>> mapped_batches(c10::ArrayRef<std::vector<std::int64_t>> old,
                                                                      const std::size_t* node_parents, c10::IntArrayRef batch,
                                                                      nested_batch rule, const char* op,
                                                                      c10::function_ref<std::string(std::size_t)> node_name);
// TensorDict.get of a leaf that is not set.
[[noreturn]] TENSORDICT_DECL void throw_unset_leaf(key_path leaf);
// repr's fields of node `node` of a typed TensorDict whose entries start at leaf_base, non_tensor_base and
// node_base in `st`: keys sorted as Python sorts them, unset leaves and non-tensor fields left out, a nested
// level's batch size shown where it has dims of its own. `fields` and `levels`: its schema's field_table_of.
TENSORDICT_DECL void print_fields(std::string& out, const storage& st, std::size_t leaf_base, std::size_t non_tensor_base,
                                  std::size_t node_base, const field_entry* fields, const level_span* levels, std::size_t node,
                                  bool multiline);
// A schema's leaves or non-tensor fields, whatever its depth: entry i's key path and the node it lies in.
struct entry_table {
  std::size_t count;
  c10::function_ref<key_path(std::size_t)> path;
  c10::function_ref<std::size_t(std::size_t)> parent_node;
};
// The key path of node k (parents: every node's parent), read off a leaf below it, else a non-tensor
// field's; nullopt when no entry is below it (an empty sub-schema).
TENSORDICT_DECL std::optional<std::vector<std::string_view>> node_path_of(std::size_t k, const std::size_t* parents,
                                                                          entry_table leaves, entry_table non_tensors);
// S's leaves and non-tensor fields as entry tables (their functions are static: the tables outlive the call).
template <class S>
entry_table leaf_entries() {
  static constexpr auto path = [](std::size_t i) { return leaf_path<S>(i); };
  static constexpr auto parent = [](std::size_t i) { return leaf_paths_v<S>[i].parent_node; };
  return {S::leaf_count, path, parent};
}
template <class S>
entry_table non_tensor_entries() {
  static constexpr auto path = [](std::size_t i) { return non_tensor_path<S>(i); };
  static constexpr auto parent = [](std::size_t i) { return non_tensor_paths_v<S>[i].parent_node; };
  return {S::non_tensor_count, path, parent};
}
// The typed constructor's leaves (leaves[i] is leaf i of the table), each checked (checked_leaf) and stored in st.
TENSORDICT_DECL void store_checked_leaves(storage& st, at::Tensor* leaves, entry_table table, const char* op);
// stack's checks of `count` TensorDicts of one schema (its leaves and node_count nodes): at least
// one, `dim` in range (made non-negative), one batch size, leaf by leaf one shape (dtypes promote),
// each nested level one batch size. node_batch(k, node) and leaf(k, i) read TensorDict k. Returns
// the stack's batch size.
TENSORDICT_DECL std::vector<std::int64_t> checked_stack_batch(std::size_t count, std::int64_t& dim, entry_table leaves,
                                                              std::size_t node_count,
                                                              c10::function_ref<c10::IntArrayRef(std::size_t, std::size_t)> node_batch,
                                                              c10::function_ref<const at::Tensor&(std::size_t, std::size_t)> leaf,
                                                              c10::function_ref<std::string(std::size_t)> node_name);

}  // namespace detail

enum class print_style { one_line, multiline };

template <schema_type S>
class TensorDict : public detail::tensordict_ops<TensorDict<S>> {
  static_assert(detail::schema_is_valid<S>());
  using ops = detail::tensordict_ops<TensorDict<S>>;
  friend ops;

 public:
  using ops::operator==;
  using ops::operator!=;
  using schema_t = S;
  static constexpr std::size_t leaf_count = S::leaf_count;
  static constexpr std::size_t non_tensor_count = S::non_tensor_count;

  // Every leaf unset; give them with set<...>().
  explicit TensorDict(c10::IntArrayRef batch_size = {}, std::optional<at::Device> device = std::nullopt)
      : st_(make_storage(batch_size, device)) {}

  // Leaves in schema order (leaf_path<S>(i) names leaf i); undefined ones stay unset.
  TensorDict(std::array<at::Tensor, leaf_count> leaves, c10::IntArrayRef batch_size = {},
             std::optional<at::Device> device = std::nullopt)
      : st_(make_storage(batch_size, device)) {
    detail::store_checked_leaves(*st_, leaves.data(), detail::leaf_entries<S>(), "TensorDict");
  }

  // ---- structure ----------------------------------------------------------

  // This level's batch size: a nested level's starts with its parent's and may add dims.
  c10::IntArrayRef batch_size() const { return node_batch(0); }
  std::size_t batch_dims() const { return node_batch(0).size(); }
  const std::optional<at::Device>& device() const { return st_->device; }

  // Key paths of the set leaves, in schema order.
  std::vector<key_path> keys() const {
    std::vector<key_path> out;
    for_each_set_leaf([&](std::size_t i, const at::Tensor&) { out.push_back(leaf_path<S>(i)); });
    return out;
  }

  std::vector<at::Tensor> values() const {
    std::vector<at::Tensor> out;
    for_each_set_leaf([&](std::size_t, const at::Tensor& t) { out.push_back(t); });
    return out;
  }

  std::vector<std::pair<key_path, at::Tensor>> items() const {
    std::vector<std::pair<key_path, at::Tensor>> out;
    for_each_set_leaf([&](std::size_t i, const at::Tensor& t) { out.emplace_back(leaf_path<S>(i), t); });
    return out;
  }

  // Python's keys(include_nested, leaves_only) and items(...): the top-level
  // keys (sub-trees included) unless include_nested, sub-trees left out when
  // leaves_only; a sub-tree comes before its keys. Sub-trees in items() are
  // AnyTensorDicts over the same tensors (include tensordict/any_tensordict.hpp).
  template <class Any = AnyTensorDict>
  std::vector<any_key_path> keys(bool include_nested, bool leaves_only = false) const {
    return Any(*this).keys(include_nested, leaves_only);
  }
  template <class Any = AnyTensorDict>
  auto items(bool include_nested, bool leaves_only = false) const {
    return Any(*this).items(include_nested, leaves_only);
  }

  // The leaf at schema index i (leaf_index_v<S, ...>), possibly undefined.
  const at::Tensor& leaf(std::size_t i) const { return slot(i); }
  bool is_set(std::size_t i) const { return slot(i).defined(); }
  // The non-tensor field at index i (non_tensor_index_v<S, ...>), possibly unset.
  const std::optional<NonTensor>& non_tensor_at(std::size_t i) const { return non_tensor_slot(i); }

  // Key paths of the set non-tensor fields, in schema order (keys() has the leaves').
  std::vector<key_path> non_tensor_keys() const {
    std::vector<key_path> out;
    for (std::size_t i = 0; i < non_tensor_count; ++i)
      if (non_tensor_slot(i)) out.push_back(non_tensor_path<S>(i));
    return out;
  }

  // ---- get / set ----------------------------------------------------------

  // A leaf gives its tensor; a non-tensor field its NonTensor; a sub-tree a TensorDict view of it.
  template <key... Path>
  decltype(auto) get() const {
    static_assert(sizeof...(Path) > 0, "tensordict: get<...>() needs a key path, e.g. get<\"0\", \"weight\">().");
    using error = detail::path_error<S, Path...>;
    if constexpr (!std::is_void_v<error>) {
      compile_error::report<error>();
      return slot(0);
    } else {
      using r = detail::resolve<S, Path...>;
      if constexpr (std::is_same_v<typename r::type, tensor_leaf>) {
        const at::Tensor& t = slot(r::leaf_offset);
        if (!t.defined()) [[unlikely]]
          throw_unset(r::leaf_offset);
        return t;
      } else if constexpr (std::is_same_v<typename r::type, non_tensor_leaf>) {
        return non_tensor_entry(r::non_tensor_offset);
      } else {
        return TensorDict<typename r::type>(st_, leaf_base_ + r::leaf_offset, node_base_ + r::node_offset,
                                            non_tensor_base_ + r::non_tensor_offset);
      }
    }
  }

  // Python's td.get_non_tensor(key) at a non_tensor<...> field: the value of a
  // NonTensorData; value_error for a NonTensorStack (index the TensorDict
  // down to one element first, or read get<...>().values()).
  template <key... Path>
  const non_tensor_value& get_non_tensor() const {
    static_assert(sizeof...(Path) > 0, "tensordict: get_non_tensor<...>() needs a key path, e.g. get_non_tensor<\"task\">().");
    using error = detail::path_error<S, Path...>;
    if constexpr (!std::is_void_v<error>) {
      compile_error::report<error>();
      return non_tensor_slot(0)->value();
    } else {
      static_assert(std::is_same_v<typename detail::resolve<S, Path...>::type, non_tensor_leaf>,
                    "tensordict: get_non_tensor<...>() reads a non_tensor<...> field of the schema; this key path names a "
                    "tensor or a sub-tree. Use get<...>().");
      const NonTensor& v = non_tensor_entry(detail::resolve<S, Path...>::non_tensor_offset);
      if (v.is_stack())
        throw value_error("TensorDict.get_non_tensor(" + key_path_t<Path...>::describe() + "): it holds one value per batch element (" +
                          v.repr() + "); index the TensorDict down to one element, or read get<...>().values()");
      return v.value();
    }
  }

  // Replaces a leaf (a tensor whose leading dims are the batch size of the
  // level that holds it) or a sub-tree (a TensorDict of that sub-schema whose
  // batch size starts with that level's: it may add dims, as in Python).
  template <key... Path, class Value>
  TensorDict& set(Value&& value) {
    static_assert(sizeof...(Path) > 0, "tensordict: set<...>(value) needs a key path, e.g. set<\"0\", \"weight\">(t).");
    using error = detail::path_error<S, Path...>;
    if constexpr (!std::is_void_v<error>) {
      compile_error::report<error>();
      return *this;
    } else {
      using r = detail::resolve<S, Path...>;
      using V = std::remove_cvref_t<Value>;
      const std::string path = key_path_t<Path...>::describe();
      check_unlocked(r::parent_node, path);
      // Each static_assert's message is the only error: the write compiles only where the value fits.
      if constexpr (std::is_same_v<typename r::type, tensor_leaf>) {
        constexpr bool fits = std::is_convertible_v<Value, at::Tensor>;
        static_assert(fits, "tensordict: set<...>(value) at a leaf takes an at::Tensor.");
        if constexpr (fits)
          slot(r::leaf_offset) = checked_leaf(at::Tensor(std::forward<Value>(value)), r::leaf_offset, "TensorDict.set", path);
      } else if constexpr (std::is_same_v<typename r::type, non_tensor_leaf>) {
        constexpr bool fits = std::is_constructible_v<NonTensor, Value&&> && !std::is_convertible_v<Value, at::Tensor>;
        static_assert(fits,
                      "tensordict: set<...>(value) at a non_tensor<...> field takes its data: a std::string, std::int64_t, "
                      "double, bool, std::monostate or a NonTensor (NonTensor::stack(values, shape) for one value per element).");
        if constexpr (fits)
          non_tensor_slot(r::non_tensor_offset) =
              checked_non_tensor(NonTensor(std::forward<Value>(value)), r::non_tensor_offset, "TensorDict.set", path);
      } else {
        static_assert(std::is_same_v<V, TensorDict<typename r::type>>,
                      "tensordict: set<...>(value) at a sub-tree takes a TensorDict with that sub-tree's schema "
                      "(the type of get<...>() at the same key path).");
        if (!detail::starts_with(value.batch_size(), node_batch(r::parent_node)))
          throw shape_error("TensorDict.set(" + path + "): expected a TensorDict whose batch_size starts with " +
                            format_sizes(node_batch(r::parent_node)) + ", got batch_size=" +
                            format_sizes(value.batch_size()));
        std::array<at::Tensor, V::leaf_count> incoming;  // value's leaves start with its levels' batch sizes
        for (std::size_t i = 0; i < V::leaf_count; ++i) incoming[i] = on_device(value.leaf(i));
        for (std::size_t i = 0; i < V::leaf_count; ++i) slot(r::leaf_offset + i) = std::move(incoming[i]);
        for (std::size_t i = 0; i < V::non_tensor_count; ++i) non_tensor_slot(r::non_tensor_offset + i) = value.non_tensor_slot(i);
        for (std::size_t k = 0; k < V::schema_t::node_count; ++k) st_->batches[node_base_ + r::node_offset + k] = value.node_batch(k).vec();
      }
      return *this;
    }
  }

  // Writes value into the leaf in place (the leaf keeps its identity); also on
  // a locked TensorDict. value must broadcast to the leaf's shape.
  template <key... Path>
  TensorDict& set_(const at::Tensor& value) {
    static_assert(sizeof...(Path) > 0, "tensordict: set_<...>(value) needs a key path, e.g. set_<\"0\", \"weight\">(t).");
    using error = detail::path_error<S, Path...>;
    if constexpr (!std::is_void_v<error>) {
      compile_error::report<error>();
    } else {
      using r = detail::resolve<S, Path...>;
      static_assert(std::is_same_v<typename r::type, tensor_leaf>,
                    "tensordict: set_<...>(tensor) writes into a leaf; this key path names a sub-tree (use update_(other)) "
                    "or a non_tensor<...> field (use set<...>(value)).");
      const std::string path = key_path_t<Path...>::describe();
      at::Tensor& leaf = slot(r::leaf_offset);
      if (!leaf.defined()) throw key_error("TensorDict.set_(" + path + "): the leaf is not set, so there is nothing to write into; use set<...>()");
      detail::check_copy(leaf, value, "TensorDict.set_", path);
      leaf.copy_(value);
    }
    return *this;
  }

  // Python's td.set_at_(key, value, index): value written into the leaf at
  // `indices` along the batch dims (as td[key][index] = value), checked first
  // (tensordict_ops::index_put_ says how); also on a locked TensorDict.
  template <key... Path>
  TensorDict& set_at_(const at::Tensor& value, c10::ArrayRef<at::indexing::TensorIndex> indices) {
    static_assert(sizeof...(Path) > 0, "tensordict: set_at_<...>(value, index) needs a key path, e.g. set_at_<\"obs\">(t, {i}).");
    using error = detail::path_error<S, Path...>;
    if constexpr (!std::is_void_v<error>) {
      compile_error::report<error>();
    } else {
      using r = detail::resolve<S, Path...>;
      static_assert(std::is_same_v<typename r::type, tensor_leaf>,
                    "tensordict: set_at_<...>(tensor, index) writes into a leaf; this key path names a sub-tree (use "
                    "update_at_(other, index)) or a non_tensor<...> field.");
      if (!slot(r::leaf_offset).defined()) throw_unset(r::leaf_offset);
      std::vector<typename ops::pending_write> writes{{slot(r::leaf_offset), value}};
      this->write_at(writes, indices, "set_at_", [](std::size_t) { return path_of(r::leaf_offset); });
    }
    return *this;
  }
  template <key... Path>
  TensorDict& set_at_(const at::Tensor& value, std::initializer_list<at::indexing::TensorIndex> indices) {
    return set_at_<Path...>(value, c10::ArrayRef<at::indexing::TensorIndex>(indices.begin(), indices.size()));
  }
  // Python's td.update_at_(other, index): other's set leaves written into
  // this TensorDict's at `indices`. other's schema must be a part of this
  // one's (a compile error names the first key that is not), so a sub-schema
  // writes a part of each row; its leaves must be set here. Its non-tensor
  // fields are written at the same positions (a NonTensorData given another
  // value there becomes a NonTensorStack).
  template <schema_type P>
  TensorDict& update_at_(const TensorDict<P>& other, c10::ArrayRef<at::indexing::TensorIndex> indices) {
    return write_other_at(other, indices, "update_at_");
  }
  template <schema_type P>
  TensorDict& update_at_(const TensorDict<P>& other, std::initializer_list<at::indexing::TensorIndex> indices) {
    return update_at_(other, c10::ArrayRef<at::indexing::TensorIndex>(indices.begin(), indices.size()));
  }

  // ---- sub-schemas: select, exclude, rename_key, update ------------------------

  // The top-level fields Keys (in that order), over the same tensors.
  template <key... Keys>
  auto select() const {
    using error = typename detail::key_list_error<S, Keys...>::type;
    if constexpr (!std::is_void_v<error>) {
      compile_error::report<error>();
      return *this;
    } else {
      return remapped<detail::select_impl<S, Keys...>>();
    }
  }
  // Every top-level field but Keys, over the same tensors.
  template <key... Keys>
  auto exclude() const {
    using error = typename detail::key_list_error<S, Keys...>::type;
    if constexpr (!std::is_void_v<error>) {
      compile_error::report<error>();
      return *this;
    } else {
      return remapped<detail::exclude_impl<S, Keys...>>();
    }
  }
  // The same tensors, the top-level key Old named New (Python's rename_key_, as a new TensorDict).
  template <key Old, key New>
  auto rename_key() const {
    using error = typename detail::rename_error<S, Old, New>::type;
    if constexpr (!std::is_void_v<error>) {
      compile_error::report<error>();
      return *this;
    } else {
      TensorDict<typename detail::rename_impl<S, Old, New>::type> out(batch_size(), device());
      out.st_->names = stored_names_padded();
      out.st_->batches = node_batches();  // renaming keeps the order of leaves, non-tensor fields and nodes
      for (std::size_t i = 0; i < leaf_count; ++i) out.slot(i) = slot(i);
      for (std::size_t i = 0; i < non_tensor_count; ++i) out.non_tensor_slot(i) = non_tensor_slot(i);
      return out;
    }
  }

  // Replaces the leaves that `other` sets (its schema must be a part of this
  // one's: a compile error names the first key that is not). Every leaf is
  // checked before the first is replaced.
  template <schema_type P>
  TensorDict& update(const TensorDict<P>& other) {
    using error = typename detail::embedding<P, S>::error;
    if constexpr (!std::is_void_v<error>) {
      compile_error::report<error>();
    } else {
      constexpr auto& where = detail::embedding<P, S>::leaves;
      constexpr auto& where_non_tensor = detail::embedding<P, S>::non_tensors;
      std::array<at::Tensor, P::leaf_count> incoming;
      for (std::size_t i = 0; i < P::leaf_count; ++i) {
        if (!other.leaf(i).defined()) continue;
        check_unlocked(leaf_paths_v<S>[where[i]].parent_node, path_of(where[i]));
        incoming[i] = checked_leaf(other.leaf(i), where[i], "TensorDict.update");
      }
      std::array<std::optional<NonTensor>, P::non_tensor_count> incoming_non_tensors;
      for (std::size_t i = 0; i < P::non_tensor_count; ++i) {
        if (!other.non_tensor_slot(i)) continue;
        const std::string path = to_string(non_tensor_path<S>(where_non_tensor[i]));
        check_unlocked(non_tensor_paths_v<S>[where_non_tensor[i]].parent_node, path);
        incoming_non_tensors[i] = checked_non_tensor(*other.non_tensor_slot(i), where_non_tensor[i], "TensorDict.update", path);
      }
      for (std::size_t i = 0; i < P::leaf_count; ++i)
        if (incoming[i].defined()) slot(where[i]) = std::move(incoming[i]);
      for (std::size_t i = 0; i < P::non_tensor_count; ++i)
        if (incoming_non_tensors[i]) non_tensor_slot(where_non_tensor[i]) = std::move(incoming_non_tensors[i]);
    }
    return *this;
  }
  // As update, but writes other's values into this TensorDict's tensors (which
  // must be set, and take other's shapes by broadcasting); works when locked.
  template <schema_type P>
  TensorDict& update_(const TensorDict<P>& other) {
    using error = typename detail::embedding<P, S>::error;
    if constexpr (!std::is_void_v<error>) {
      compile_error::report<error>();
    } else {
      constexpr auto& where = detail::embedding<P, S>::leaves;
      for (std::size_t i = 0; i < P::leaf_count; ++i) {
        if (!other.leaf(i).defined()) continue;
        if (!slot(where[i]).defined())
          throw key_error("TensorDict.update_: the leaf " + path_of(where[i]) + " is not set here, so there is nothing to write into");
        detail::check_copy(slot(where[i]), other.leaf(i), "TensorDict.update_", path_of(where[i]));
      }
      auto entries = non_tensors_written_at(other, {}, "update_");
      for (std::size_t i = 0; i < P::leaf_count; ++i)
        if (other.leaf(i).defined()) slot(where[i]).copy_(other.leaf(i));
      for (auto& [i, v] : entries) non_tensor_slot(i) = std::move(v);
    }
    return *this;
  }

  // ---- whole-tree operations ------------------------------------------------

  // A new TensorDict with f(leaf) at every set leaf; f may return an undefined
  // tensor to unset it. The batch size and device stay unless others are given
  // (a leaf that f puts elsewhere is moved to the result's device).
  template <class F>
  TensorDict apply(F&& f) const {
    return apply(std::forward<F>(f), batch_size(), device());
  }
  template <class F>
  TensorDict apply(F&& f, c10::IntArrayRef new_batch_size) const {
    return apply(std::forward<F>(f), new_batch_size, device());
  }
  // A nested level with dims of its own keeps them after the new batch size.
  template <class F>
  TensorDict apply(F&& f, c10::IntArrayRef new_batch_size, std::optional<at::Device> new_device) const {
    return mapped(f, new_batch_size, new_device, detail::nested_batch::follow, "TensorDict.apply");
  }

  // f(leaf, the same leaf of each other TensorDict): Python's apply(fn, *others).
  // Every other must have this batch size and every leaf set here.
  template <class F, class... Others>
    requires(sizeof...(Others) > 0 && (std::is_same_v<Others, TensorDict> && ...))
  TensorDict apply(F&& f, const Others&... others) const {
    for (const TensorDict* o : {&others...}) {
      if (!o->batch_size().equals(batch_size()))
        throw shape_error("TensorDict.apply: batch_size=" + format_sizes(batch_size()) + " and batch_size=" +
                          format_sizes(o->batch_size()) + " differ");
      for_each_set_leaf([&](std::size_t i, const at::Tensor&) {
        if (!o->slot(i).defined()) throw key_error("TensorDict.apply: the leaf " + path_of(i) + " is not set in every TensorDict");
      });
    }
    TensorDict out(batch_size(), device());
    out.st_->names = stored_names_padded();
    out.st_->batches = node_batches();
    for_each_set_leaf([&](std::size_t i, const at::Tensor& t) {
      out.slot(i) = out.checked_leaf(f(t, others.slot(i)...), i, "TensorDict.apply");
    });
    for (std::size_t i = 0; i < non_tensor_count; ++i) out.non_tensor_slot(i) = non_tensor_slot(i);
    return out;
  }

  // f(key path, leaf) at every set leaf, as Python's named_apply (key paths as leaf_path<S> gives them).
  template <class F>
  TensorDict named_apply(F&& f) const {
    std::size_t i = 0;
    return apply([&](const at::Tensor& t) {
      while (!slot(i).defined()) ++i;
      return f(leaf_path<S>(i++), t);
    });
  }

  // apply_, clone, detach, zero_, to, comparisons with a scalar, all, any,
  // index, operator[], unbind and expand come from detail/tensordict_ops.hpp.

  // Element-wise comparisons, as a TensorDict of bool tensors.
  TensorDict operator==(const TensorDict& other) const { return compare(other, "==", [](auto& a, auto& b) { return a.eq(b); }); }
  TensorDict operator!=(const TensorDict& other) const { return compare(other, "!=", [](auto& a, auto& b) { return a.ne(b); }); }

  // ---- keys -------------------------------------------------------------------

  // The same tensors under joined keys: ("0", "weight") becomes "0.weight".
  template <key Separator = ".">
  TensorDict<flatten_t<S, Separator>> flatten_keys() const {
    TensorDict<flatten_t<S, Separator>> out(batch_size(), device());
    for (std::size_t i = 0; i < leaf_count; ++i) out.slot(i) = slot(i);
    for (std::size_t i = 0; i < non_tensor_count; ++i) out.non_tensor_slot(i) = non_tensor_slot(i);
    return out;
  }

  // The inverse of flatten_keys: "0.weight" becomes ("0", "weight").
  template <key Separator = ".">
  TensorDict<unflatten_t<S, Separator>> unflatten_keys() const {
    constexpr auto& order = unflatten_order_v<S, Separator>;
    constexpr auto& non_tensor_order = unflatten_non_tensor_order_v<S, Separator>;
    TensorDict<unflatten_t<S, Separator>> out(batch_size(), device());
    for (std::size_t i = 0; i < leaf_count; ++i) out.slot(i) = slot(order[i]);
    for (std::size_t i = 0; i < non_tensor_count; ++i) out.non_tensor_slot(i) = non_tensor_slot(non_tensor_order[i]);
    return out;
  }

  // ---- locking ----------------------------------------------------------------

  // A locked TensorDict refuses to replace leaves (set<...>()); writing into
  // its tensors in place still works. Locking propagates to sub-trees.
  TensorDict& lock_() {
    std::fill_n(st_->locked.begin() + node_base_, S::node_count, std::uint8_t{1});
    return *this;
  }
  TensorDict& unlock_() {
    for (std::size_t p = st_->node_parents[node_base_]; p != npos; p = st_->node_parents[p])
      if (st_->locked[p])
        throw lock_error("TensorDict.unlock_: this TensorDict is part of a locked TensorDict; unlock that one instead");
    std::fill_n(st_->locked.begin() + node_base_, S::node_count, std::uint8_t{0});
    return *this;
  }
  bool is_locked() const { return st_->locked[node_base_] != 0; }

  // ---- printing ---------------------------------------------------------------

  std::string repr(print_style style = print_style::one_line) const {
    std::string out = "TensorDict(batch_size=" + format_sizes(batch_size());
    if (device()) out += ", device=" + device()->str();
    out += ", fields={";
    constexpr const auto& table = detail::field_table_of<S>::value;
    detail::print_fields(out, *st_, leaf_base_, non_tensor_base_, node_base_, table.fields.data(), table.levels.data(), 0,
                         style == print_style::multiline);
    return out + "})";
  }

  friend std::ostream& operator<<(std::ostream& os, const TensorDict& td) { return os << td.repr(); }

 private:
  // A key as errors print it (tensordict_ops' messages).
  static std::string key_name(const key_path& k) { return to_string(k); }
  // update_at_ and index_put_ (`op` names the call in errors).
  template <schema_type P>
  TensorDict& write_other_at(const TensorDict<P>& other, c10::ArrayRef<at::indexing::TensorIndex> indices, const char* op) {
    using error = typename detail::embedding<P, S>::error;
    if constexpr (!std::is_void_v<error>) {
      compile_error::report<error>();
    } else {
      constexpr auto& where = detail::embedding<P, S>::leaves;
      std::vector<typename ops::pending_write> writes;
      writes.reserve(P::leaf_count);
      std::array<std::size_t, P::leaf_count> written{};  // the leaf here of each write
      for (std::size_t i = 0; i < P::leaf_count; ++i) {
        if (!other.leaf(i).defined()) continue;
        if (!slot(where[i]).defined())
          throw key_error(std::string("TensorDict.") + op + ": the leaf " + path_of(where[i]) +
                          " is not set here, so there is nothing to write into");
        written[writes.size()] = where[i];
        writes.push_back({slot(where[i]), other.leaf(i)});
      }
      auto entries = non_tensors_written_at(other, indices, op);
      this->write_at(writes, indices, op, [&](std::size_t k) { return path_of(written[k]); });
      for (auto& [i, v] : entries) non_tensor_slot(i) = std::move(v);  // cannot throw
    }
    return *this;
  }
  template <schema_type>
  friend class TensorDict;
  friend class AnyTensorDict;
  template <schema_type T>
  friend TensorDict<T> stack(c10::ArrayRef<TensorDict<T>>, std::int64_t);
  template <schema_type T>
  friend TensorDict<T> cat(c10::ArrayRef<TensorDict<T>>, std::int64_t);
  template <class T, class Join>
  friend void detail::join_non_tensors(c10::ArrayRef<TensorDict<T>>, TensorDict<T>&, const char*, Join&&);

  TensorDict(std::shared_ptr<detail::storage> st, std::size_t leaf_base, std::size_t node_base, std::size_t non_tensor_base)
      : st_(std::move(st)), leaf_base_(leaf_base), node_base_(node_base), non_tensor_base_(non_tensor_base) {}

  static std::shared_ptr<detail::storage> make_storage(c10::IntArrayRef batch_size, std::optional<at::Device> device) {
    return detail::make_storage(batch_size, device, S::leaf_count, S::node_count, S::non_tensor_count,
                                detail::node_parents_of<S>::value.data());
  }

  at::Tensor& slot(std::size_t i) const { return st_->leaves[leaf_base_ + i]; }
  std::optional<NonTensor>& non_tensor_slot(std::size_t i) const { return st_->non_tensors[non_tensor_base_ + i]; }
  const NonTensor& non_tensor_entry(std::size_t i) const {
    const std::optional<NonTensor>& v = non_tensor_slot(i);
    if (!v) [[unlikely]]
      throw key_error("TensorDict.get: the non-tensor field " + to_string(non_tensor_path<S>(i)) + " is not set");
    return *v;
  }
  batch_names& stored_names() const { return st_->names; }
  std::size_t named_dims() const { return st_->batches[0].size(); }
  // The names for a new root with this level's batch size (a nested level's own dims have none).
  batch_names stored_names_padded() const {
    return st_->names.empty() ? batch_names{} : detail::names_or_none(st_->names, batch_dims());
  }

  // The batch size of node k of S (0: this level).
  c10::IntArrayRef node_batch(std::size_t k) const { return st_->batches[node_base_ + k]; }
  std::vector<std::vector<std::int64_t>> node_batches() const {
    const auto first = st_->batches.begin() + static_cast<std::ptrdiff_t>(node_base_);
    return {first, first + static_cast<std::ptrdiff_t>(S::node_count)};
  }
  // The node batch sizes of a TensorDict of S with batch size `batch`, its nested levels' following `rule`.
  std::vector<std::vector<std::int64_t>> mapped_batches(c10::IntArrayRef batch, detail::nested_batch rule, const char* op) const {
    return detail::mapped_batches(c10::ArrayRef<std::vector<std::int64_t>>(st_->batches.data() + node_base_, S::node_count),
                                  detail::node_parents_of<S>::value.data(), batch, rule, op, &node_name);
  }
  // f(leaf) at every set leaf, into a TensorDict of batch size `batch` whose
  // nested levels follow `rule`. Non-tensor fields come along: a
  // NonTensorStack's values follow `rearrange` (how the verb moves the batch
  // dims) when given; without it its level's batch size must stay.
  // One body per schema whatever f is (f is called through a function_ref).
  TensorDict mapped(c10::function_ref<at::Tensor(const at::Tensor&)> f, c10::IntArrayRef batch, std::optional<at::Device> device,
                    detail::nested_batch rule, const char* op, const detail::rearrangement* rearrange = nullptr) const {
    TensorDict out(batch, device);
    if (batch.equals(batch_size())) out.st_->names = stored_names_padded();
    out.st_->batches = mapped_batches(batch, rule, op);
    for_each_set_leaf([&](std::size_t i, const at::Tensor& t) { out.slot(i) = out.checked_leaf(f(t), i, op); });
    if constexpr (non_tensor_count > 0) {
      const at::Device positions_device =
          device ? *device : detail::leaves_device(c10::ArrayRef<at::Tensor>(st_->leaves.data() + leaf_base_, leaf_count));
      for (std::size_t i = 0; i < non_tensor_count; ++i)
        if (const auto& v = non_tensor_slot(i)) {
          const std::size_t level = non_tensor_paths_v<S>[i].parent_node;
          out.non_tensor_slot(i) = detail::carried(*v, node_batch(level), out.node_batch(level), rearrange,
                                                   to_string(non_tensor_path<S>(i)), op, positions_device);
        }
    }
    return out;
  }
  // tensordict_ops' verbs that move the batch dims: f applies to leaves and to NonTensorStacks' positions.
  template <class F>
  TensorDict rearranged_entries(F& f, c10::IntArrayRef batch) const {
    if constexpr (non_tensor_count == 0) {
      return mapped(f, batch, device(), detail::nested_batch::follow, "TensorDict.apply");
    } else {
      const detail::rearrangement positions = [&](const at::Tensor& t) { return at::Tensor(f(t)); };
      return mapped(f, batch, device(), detail::nested_batch::follow, "TensorDict.apply", &positions);
    }
  }
  template <class F>
  TensorDict map_leaves(F&& f, c10::IntArrayRef batch, detail::nested_batch rule) const {
    return mapped(f, batch, device(), rule, "TensorDict.batch_size");
  }
  // Python's auto_batch_size_: each level from its leaves' shapes and its nested levels' batch sizes, the deepest first.
  TensorDict auto_batched(std::optional<std::size_t> batch_dims) const {
    constexpr auto& parents = detail::node_parents_of<S>::value;
    std::vector<std::vector<c10::IntArrayRef>> shapes(S::node_count);
    for_each_set_leaf([&](std::size_t i, const at::Tensor& t) { shapes[leaf_paths_v<S>[i].parent_node].push_back(t.sizes()); });
    std::vector<std::vector<std::int64_t>> batches(S::node_count);
    for (std::size_t k = S::node_count; k-- > 0;) {
      batches[k] = detail::common_batch(shapes[k], node_batch(k), batch_dims);
      if (k > 0) shapes[parents[k]].push_back(batches[k]);
    }
    TensorDict out(batches[0], device());
    if (out.batch_size().equals(batch_size())) out.st_->names = stored_names_padded();
    out.st_->batches = std::move(batches);
    for_each_set_leaf([&](std::size_t i, const at::Tensor& t) { out.slot(i) = t; });
    for (std::size_t i = 0; i < non_tensor_count; ++i)
      if (const auto& v = non_tensor_slot(i)) {
        const std::size_t level = non_tensor_paths_v<S>[i].parent_node;
        out.non_tensor_slot(i) = detail::carried(*v, node_batch(level), out.node_batch(level), nullptr,
                                                 to_string(non_tensor_path<S>(i)), "TensorDict.auto_batch_size_");
      }
    return out;
  }

  // The key path of node k of S (0: this level), read off a leaf below it;
  // nullopt when no leaf is below it (an empty sub-schema).
  static std::optional<std::vector<std::string_view>> node_path(std::size_t k) {
    return detail::node_path_of(k, detail::node_parents_of<S>::value.data(), detail::leaf_entries<S>(), detail::non_tensor_entries<S>());
  }
  static std::string node_name(std::size_t k) { return detail::node_name(node_path(k)); }


  // A TensorDict of Map::type whose leaf i is this one's leaf Map::leaves[i].
  template <class Map>
  TensorDict<typename Map::type> remapped() const {
    using T = typename Map::type;
    TensorDict<T> out(batch_size(), device());
    out.st_->names = stored_names_padded();
    for (std::size_t i = 0; i < T::leaf_count; ++i) out.slot(i) = slot(Map::leaves[i]);
    for (std::size_t i = 0; i < T::non_tensor_count; ++i) out.non_tensor_slot(i) = non_tensor_slot(Map::non_tensors[i]);
    // Each nested field keeps its levels' batch sizes (a field's nodes are contiguous in both schemas).
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            using child = typename T::template field_at<I>::type;
            if constexpr (detail::is_schema<child>::value) {
              constexpr std::size_t from = S::node_offsets[S::find(T::names[I])];
              for (std::size_t k = 0; k < child::node_count; ++k)
                out.st_->batches[T::node_offsets[I] + k] = node_batch(from + k).vec();
            }
          }(),
          ...);
    }(std::make_index_sequence<T::field_count>{});
    return out;
  }

  template <class F>
  void for_each_set_leaf(F&& f) const {
    for (std::size_t i = 0; i < leaf_count; ++i) {
      const at::Tensor& t = slot(i);
      if (t.defined()) f(i, t);
    }
  }

  static std::string path_of(std::size_t leaf) { return to_string(leaf_path<S>(leaf)); }

  // Out of line, once per schema rather than once per key path.
  [[noreturn]] static void throw_unset(std::size_t leaf) { detail::throw_unset_leaf(leaf_path<S>(leaf)); }

  at::Tensor on_device(at::Tensor t) const { return detail::on_device(std::move(t), device()); }
  // A leaf about to be stored at index i: on this TensorDict's device, with its level's batch dims in front.
  at::Tensor checked_leaf(at::Tensor t, std::size_t i, const char* op, const std::string& path = {}) const {
    return detail::checked_leaf(std::move(t), device(), node_batch(leaf_paths_v<S>[i].parent_node), op, leaf_path<S>(i), path);
  }

  // A NonTensorStack about to be stored at non-tensor index i has its level's batch size as its shape.
  NonTensor checked_non_tensor(NonTensor v, std::size_t i, const char* op, const std::string& path) const {
    const c10::IntArrayRef batch = node_batch(non_tensor_paths_v<S>[i].parent_node);
    if (v.is_stack() && !batch.equals(v.shape()))
      throw shape_error(std::string(op) + "(" + path + "): " + v.repr() + " has one value per element of " +
                        format_sizes(v.shape()) + ", but the level that holds it has batch_size=" + format_sizes(batch));
    return v;
  }

  // For update_at_ and update_: each of other's set non-tensor fields written
  // at `indices` into the one here, as (index here, new entry) to put in
  // place once every write is checked.
  template <schema_type P>
  std::vector<std::pair<std::size_t, NonTensor>> non_tensors_written_at(const TensorDict<P>& other,
                                                                        c10::ArrayRef<at::indexing::TensorIndex> indices,
                                                                        const char* op) const {
    std::vector<std::pair<std::size_t, NonTensor>> out;
    if constexpr (P::non_tensor_count > 0) {
      constexpr auto& where = detail::embedding<P, S>::non_tensors;
      const auto batch = detail::batch_indices(indices, batch_dims());
      const std::string files = detail::written_through_file(values());
      for (std::size_t i = 0; i < P::non_tensor_count; ++i) {
        if (!other.non_tensor_slot(i)) continue;
        const std::string path = to_string(non_tensor_path<S>(where[i]));
        const std::string at = std::string("TensorDict.") + op + "(" + path + "): ";
        const std::optional<NonTensor>& mine = non_tensor_slot(where[i]);
        if (!mine) throw key_error(at + "the non-tensor field is not set here, so there is nothing to write into");
        if (auto written = detail::non_tensor_written_at(*mine, *other.non_tensor_slot(i),
                                                         node_batch(non_tensor_paths_v<S>[where[i]].parent_node), batch, at, files))
          out.emplace_back(where[i], std::move(*written));
      }
    }
    return out;
  }

  void check_unlocked(std::size_t parent_node, const std::string& path) const {
    if (st_->locked[node_base_ + parent_node])
      throw lock_error("TensorDict.set(" + path +
                       "): the TensorDict is locked, so its leaves cannot be replaced. Write into the tensor in place "
                       "(get<...>().copy_(value)) or call unlock_() first.");
  }

  template <class F>
  TensorDict compare(const TensorDict& other, const char* op, F&& f) const {
    TensorDict out(batch_size(), device());
    out.st_->batches = node_batches();
    for (std::size_t i = 0; i < leaf_count; ++i) {
      const at::Tensor& a = slot(i);
      const at::Tensor& b = other.slot(i);
      if (a.defined() != b.defined())
        throw key_error(std::string("TensorDict ") + op + ": the leaf " + path_of(i) + " is set on one side only");
      if (a.defined()) out.slot(i) = f(a, b);
    }
    for (std::size_t i = 0; i < non_tensor_count; ++i) out.non_tensor_slot(i) = non_tensor_slot(i);
    return out;
  }

  std::shared_ptr<detail::storage> st_;
  std::size_t leaf_base_ = 0;
  std::size_t node_base_ = 0;
  std::size_t non_tensor_base_ = 0;
};

// Stacks TensorDicts of one schema along a new batch dim (0 by default).
// Every input must have the same batch size and, leaf by leaf, the same shape.
template <schema_type S>
TensorDict<S> stack(c10::ArrayRef<TensorDict<S>> tds, std::int64_t dim = 0) {
  // The checks are schema-free, compiled once in the library; what is left here is the schema's loops.
  const std::vector<std::int64_t> batch = detail::checked_stack_batch(
      tds.size(), dim, detail::leaf_entries<S>(), S::node_count,
      [&](std::size_t k, std::size_t node) { return tds[k].node_batch(node); },
      [&](std::size_t k, std::size_t i) -> const at::Tensor& { return tds[k].leaf(i); },
      [](std::size_t node) { return TensorDict<S>::node_name(node); });
  const TensorDict<S>& first = tds[0];
  TensorDict<S> out(batch, first.device());
  for (std::size_t node = 1; node < S::node_count; ++node) {  // nested levels with dims of their own keep them
    out.st_->batches[node] = first.node_batch(node).vec();
    out.st_->batches[node].insert(out.st_->batches[node].begin() + dim, static_cast<std::int64_t>(tds.size()));
  }
  std::vector<at::Tensor> parts(tds.size());
  for (std::size_t i = 0; i < S::leaf_count; ++i) {
    if (!first.leaf(i).defined()) continue;
    for (std::size_t k = 0; k < tds.size(); ++k) parts[k] = tds[k].leaf(i);
    out.slot(i) = at::stack(parts, dim);
  }
  detail::join_non_tensors(tds, out, "tensordict::stack", [&](const std::vector<at::Tensor>& positions) { return at::stack(positions, dim); });
  return out;
}

namespace detail {

// The batch size of cat(tds, dim): every batch dim but `dim` equal. Resolves a negative dim.
template <class TDs>
std::vector<std::int64_t> cat_batch_size(const TDs& tds, std::int64_t& dim) {
  if (tds.size() == 0) throw shape_error("tensordict::cat: needs at least one TensorDict");
  const auto nb = static_cast<std::int64_t>(tds[0].batch_dims());
  if (dim < -nb || dim >= nb)
    throw index_error("tensordict::cat: dim " + std::to_string(dim) + " is out of range for batch_size=" +
                      format_sizes(tds[0].batch_size()));
  if (dim < 0) dim += nb;
  std::vector<std::int64_t> batch(tds[0].batch_size().begin(), tds[0].batch_size().end());
  batch[dim] = 0;
  for (std::size_t k = 0; k < tds.size(); ++k) {
    auto b = tds[k].batch_size();
    bool same_rest = b.size() == batch.size();
    for (std::size_t d = 0; same_rest && d < b.size(); ++d) same_rest = d == static_cast<std::size_t>(dim) || b[d] == batch[d];
    if (!same_rest)
      throw shape_error("tensordict::cat: TensorDict 0 has batch_size=" + format_sizes(tds[0].batch_size()) +
                        " but TensorDict " + std::to_string(k) + " has batch_size=" + format_sizes(b));
    batch[dim] += b[dim];
  }
  return batch;
}

// The non-tensor fields of tds joined into out (stack, cat) as their positions by join(positions);
// a field set in one must be set in all.
template <class S, class Join>
void join_non_tensors(c10::ArrayRef<TensorDict<S>> tds, TensorDict<S>& out, const char* op, Join&& join) {
  for (std::size_t i = 0; i < S::non_tensor_count; ++i) {
    const std::size_t level = non_tensor_paths_v<S>[i].parent_node;
    std::vector<NonTensor> entries;
    std::vector<c10::IntArrayRef> batches;
    for (std::size_t k = 0; k < tds.size(); ++k) {
      const std::optional<NonTensor>& v = tds[k].non_tensor_slot(i);
      if (v.has_value() != tds[0].non_tensor_slot(i).has_value())
        throw key_error(std::string(op) + ": the non-tensor field " + to_string(non_tensor_path<S>(i)) + " is set in TensorDict " +
                        std::to_string(v ? k : 0) + " but not in TensorDict " + std::to_string(v ? 0 : k));
      if (!v) continue;
      entries.push_back(*v);
      batches.push_back(tds[k].node_batch(level));
    }
    if (!entries.empty()) out.non_tensor_slot(i) = joined_non_tensor(entries, batches, out.node_batch(level), join);
  }
}

// One leaf's parts, concatenated along batch dim `dim` (only that dim may differ).
inline at::Tensor cat_leaf(const std::vector<at::Tensor>& parts, std::int64_t dim, const std::string& path) {
  for (std::size_t k = 1; k < parts.size(); ++k) {
    bool fits = parts[k].dim() == parts[0].dim();  // dtypes promote, as torch.cat
    for (std::int64_t d = 0; fits && d < parts[0].dim(); ++d) fits = d == dim || parts[k].size(d) == parts[0].size(d);
    if (!fits)
      throw shape_error("tensordict::cat: the leaf " + path + " is " + describe(parts[0]) + " in TensorDict 0 but " +
                        describe(parts[k]) + " in TensorDict " + std::to_string(k) + "; only batch dim " + std::to_string(dim) +
                        " may differ");
  }
  return at::cat(parts, dim);
}

}  // namespace detail

// Concatenates TensorDicts of one schema along an existing batch dim; leaves set in one must be set in all.
template <schema_type S>
TensorDict<S> cat(c10::ArrayRef<TensorDict<S>> tds, std::int64_t dim = 0) {
  const std::vector<std::int64_t> batch = detail::cat_batch_size(tds, dim);
  TensorDict<S> out(batch, tds[0].device());
  for (std::size_t node = 1; node < S::node_count; ++node) {  // nested levels with dims of their own keep them
    struct level {
      c10::IntArrayRef sizes;
      c10::IntArrayRef batch_size() const { return sizes; }
      std::size_t batch_dims() const { return sizes.size(); }
    };
    std::vector<level> levels;
    for (const auto& td : tds) levels.push_back({td.node_batch(node)});
    std::int64_t d = dim;
    out.st_->batches[node] = detail::cat_batch_size(levels, d);
  }
  std::vector<at::Tensor> parts(tds.size());
  for (std::size_t i = 0; i < S::leaf_count; ++i) {
    for (std::size_t k = 0; k < tds.size(); ++k) {
      parts[k] = tds[k].leaf(i);
      if (parts[k].defined() != parts[0].defined())
        throw key_error("tensordict::cat: the leaf " + to_string(leaf_path<S>(i)) + " is set in TensorDict " +
                        std::to_string(parts[0].defined() ? 0 : k) + " but not in TensorDict " + std::to_string(parts[0].defined() ? k : 0));
    }
    if (parts[0].defined()) out.slot(i) = detail::cat_leaf(parts, dim, to_string(leaf_path<S>(i)));
  }
  detail::join_non_tensors(tds, out, "tensordict::cat", [&](const std::vector<at::Tensor>& positions) { return at::cat(positions, dim); });
  return out;
}
template <schema_type S>
TensorDict<S> cat(std::initializer_list<TensorDict<S>> tds, std::int64_t dim = 0) {
  return cat(c10::ArrayRef<TensorDict<S>>(tds.begin(), tds.size()), dim);
}
template <schema_type S>
TensorDict<S> cat(const std::vector<TensorDict<S>>& tds, std::int64_t dim = 0) {
  return cat(c10::ArrayRef<TensorDict<S>>(tds), dim);
}

template <schema_type S>
TensorDict<S> stack(std::initializer_list<TensorDict<S>> tds, std::int64_t dim = 0) {
  return stack(c10::ArrayRef<TensorDict<S>>(tds.begin(), tds.size()), dim);
}

template <schema_type S>
TensorDict<S> stack(const std::vector<TensorDict<S>>& tds, std::int64_t dim = 0) {
  return stack(c10::ArrayRef<TensorDict<S>>(tds), dim);
}

namespace compile_error {
template <class First, class Other>
struct stack_of_different_schemas {
  static_assert(always_false<Other>,
                "tensordict::stack: every TensorDict must have the same schema (the two schemas are named above in "
                "'stack_of_different_schemas<...>'). Build them from the same module type or schema.");
};
}  // namespace compile_error

namespace detail {
template <class First, class... Rest>
struct first_mismatch {
  using type = void;
};
template <class First, class Next, class... Rest>
struct first_mismatch<First, Next, Rest...>
    : std::conditional_t<std::is_same_v<First, Next>, first_mismatch<First, Rest...>, std::type_identity<Next>> {};
}  // namespace detail

// A value for the key path Path, as make<S>(...) takes it: kv<"b", "c">(tensor).
template <class V, key... Path>
struct keyed {
  V value;
};
template <key... Path, class V>
keyed<std::decay_t<V>, Path...> kv(V&& value) {
  static_assert(sizeof...(Path) > 0, "tensordict: kv<...>(value) needs a key path, e.g. kv<\"0\", \"weight\">(t).");
  return {std::forward<V>(value)};
}

namespace detail {
template <class T>
struct keyed_path;
template <class V, key... Path>
struct keyed_path<keyed<V, Path...>> {
  static constexpr auto joined = joined_key<".", Path...>;
  static constexpr std::string_view view() { return joined.view(); }
  template <class S>
  static void assign(TensorDict<S>& td, keyed<V, Path...>&& kv) {
    td.template set<Path...>(std::move(kv.value));
  }
};
template <class T>
concept keyed_value = requires { keyed_path<std::remove_cvref_t<T>>::joined; };

template <class... Keyed>
constexpr std::size_t first_repeated_key() {
  constexpr std::array<std::string_view, sizeof...(Keyed)> paths{keyed_path<std::remove_cvref_t<Keyed>>::view()...};
  return first_duplicate(paths);
}
}  // namespace detail

// Python's TensorDict({"a": t, "b": {"c": u}}, batch_size=[4]):
//   auto td = make<S>({4}, kv<"a">(t), kv<"b", "c">(u));
// in any order; leaves not given stay unset; a key path given twice is a compile error.
template <schema_type S, class... Keyed>
  requires(detail::keyed_value<Keyed> && ...)
TensorDict<S> make(c10::IntArrayRef batch_size, Keyed&&... values) {
  constexpr std::size_t repeated = detail::first_repeated_key<Keyed...>();
  if constexpr (repeated != npos) {
    compile_error::report<compile_error::key_given_twice<
        detail::keyed_path<std::remove_cvref_t<detail::pack_at<repeated, Keyed...>>>::joined>>();
    return TensorDict<S>(batch_size);
  } else {
    TensorDict<S> out(batch_size);
    (detail::keyed_path<std::remove_cvref_t<Keyed>>::assign(out, std::remove_cvref_t<Keyed>(std::forward<Keyed>(values))), ...);
    return out;
  }
}
template <schema_type S, class... Keyed>
  requires(detail::keyed_value<Keyed> && ...)
TensorDict<S> make(Keyed&&... values) {
  return make<S>(c10::IntArrayRef{}, std::forward<Keyed>(values)...);
}

// stack(a, b, c): the variadic form, whose schemas the compiler checks.
template <class First, class... Rest>
  requires(detail::is_tensordict<First>::value && sizeof...(Rest) > 0)
First stack(const First& first, const Rest&... rest) {
  using mismatch = typename detail::first_mismatch<First, Rest...>::type;
  if constexpr (!std::is_void_v<mismatch>) {
    if constexpr (detail::is_tensordict<mismatch>::value)
      compile_error::report<compile_error::stack_of_different_schemas<typename First::schema_t, typename mismatch::schema_t>>();
    else
      static_assert(detail::is_tensordict<mismatch>::value, "tensordict::stack(a, b, ...) takes TensorDicts only.");
    return first;
  } else {
    return stack(std::initializer_list<First>{first, rest...}, 0);
  }
}

}  // namespace tensordict

#if TENSORDICT_DEFINITIONS
namespace tensordict::detail {
TENSORDICT_DECL void print_fields(std::string& out, const storage& st, std::size_t leaf_base, std::size_t non_tensor_base,
                                  std::size_t node_base, const field_entry* fields, const level_span* levels, std::size_t node,
                                  bool multiline) {
  const level_span level = levels[node];
  std::vector<const field_entry*> order(level.count);
  for (std::size_t i = 0; i < level.count; ++i) order[i] = &fields[level.begin + i];
  std::sort(order.begin(), order.end(), [](const field_entry* a, const field_entry* b) { return a->name < b->name; });
  bool first = true;
  for (const field_entry* f : order) {
    std::string field;
    if (f->kind == field_entry::tensor) {
      const at::Tensor& leaf = st.leaves[leaf_base + f->index];
      if (!leaf.defined()) continue;
      field = describe(leaf);
    } else if (f->kind == field_entry::non_tensor) {
      const std::optional<NonTensor>& value = st.non_tensors[non_tensor_base + f->index];
      if (!value) continue;
      field = value->repr();
    } else {
      std::string inner;
      print_fields(inner, st, leaf_base, non_tensor_base, node_base, fields, levels, f->index, false);
      field = '{';
      // A level with dims of its own beyond its parent's shows its batch size.
      const std::vector<std::int64_t>& batch = st.batches[node_base + f->index];
      if (batch != st.batches[node_base + node]) field += "batch_size=" + format_sizes(batch) + (inner.empty() ? "" : ", ");
      field += inner;
      field += '}';
    }
    if (!first) out += multiline ? "," : ", ";
    if (multiline) out += "\n    ";
    out += f->name;
    out += ": ";
    out += field;
    first = false;
  }
}

TENSORDICT_DECL void throw_unset_leaf(key_path leaf) {
  throw key_error("TensorDict.get: the leaf " + to_string(leaf) + " is not set");
}

TENSORDICT_DECL void store_checked_leaves(storage& st, at::Tensor* leaves, entry_table table, const char* op) {
  for (std::size_t i = 0; i < table.count; ++i)
    st.leaves[i] = checked_leaf(std::move(leaves[i]), st.device, st.batches[table.parent_node(i)], op, table.path(i), {});
}

TENSORDICT_DECL std::optional<std::vector<std::string_view>> node_path_of(std::size_t k, const std::size_t* parents,
                                                                          entry_table leaves, entry_table non_tensors) {
  std::size_t depth = 0;
  for (std::size_t p = k; p != 0; p = parents[p]) ++depth;
  // The first few parts of any entry's path under level k: a leaf's, else a non-tensor field's.
  std::optional<std::vector<std::string_view>> found;
  auto search = [&](const entry_table& entries) {
    for (std::size_t i = 0; i < entries.count; ++i)
      for (std::size_t p = entries.parent_node(i); !found; p = parents[p]) {
        if (p == k) {
          const key_path path = entries.path(i);
          found.emplace(path.begin(), path.begin() + static_cast<std::ptrdiff_t>(depth));
        }
        if (p == 0) break;
      }
  };
  search(leaves);
  if (!found) search(non_tensors);
  return found;
}

TENSORDICT_DECL std::vector<std::int64_t> checked_stack_batch(std::size_t count, std::int64_t& dim, entry_table leaves,
                                                              std::size_t node_count,
                                                              c10::function_ref<c10::IntArrayRef(std::size_t, std::size_t)> node_batch,
                                                              c10::function_ref<const at::Tensor&(std::size_t, std::size_t)> leaf,
                                                              c10::function_ref<std::string(std::size_t)> node_name) {
  if (count == 0) throw shape_error("tensordict::stack: needs at least one TensorDict");
  const c10::IntArrayRef first = node_batch(0, 0);
  const auto nb = static_cast<std::int64_t>(first.size());
  if (dim < -(nb + 1) || dim > nb)
    throw index_error("tensordict::stack: dim " + std::to_string(dim) + " is out of range for batch_size=" + format_sizes(first));
  if (dim < 0) dim += nb + 1;
  for (std::size_t k = 1; k < count; ++k)
    if (node_batch(k, 0) != first)
      throw shape_error("tensordict::stack: TensorDict 0 has batch_size=" + format_sizes(first) + " but TensorDict " +
                        std::to_string(k) + " has batch_size=" + format_sizes(node_batch(k, 0)));
  for (std::size_t i = 0; i < leaves.count; ++i)
    for (std::size_t k = 1; k < count; ++k) {
      const at::Tensor& a = leaf(0, i);
      const at::Tensor& b = leaf(k, i);
      if (a.defined() != b.defined() || (a.defined() && a.sizes() != b.sizes()))  // dtypes promote, as torch.stack
        throw shape_error("tensordict::stack: the leaf " + to_string(leaves.path(i)) + " is " + describe(a) +
                          " in TensorDict 0 but " + describe(b) + " in TensorDict " + std::to_string(k));
    }
  for (std::size_t node = 1; node < node_count; ++node)  // nested levels with dims of their own keep them
    for (std::size_t k = 1; k < count; ++k)
      if (!node_batch(k, node).equals(node_batch(0, node)))
        throw shape_error("tensordict::stack: the TensorDict " + node_name(node) + " has batch_size=" +
                          format_sizes(node_batch(0, node)) + " in TensorDict 0 but " + format_sizes(node_batch(k, node)) +
                          " in TensorDict " + std::to_string(k));
  std::vector<std::int64_t> batch(first.begin(), first.end());
  batch.insert(batch.begin() + dim, static_cast<std::int64_t>(count));
  return batch;
}

TENSORDICT_DECL at::Tensor checked_leaf(at::Tensor t, const std::optional<at::Device>& device, c10::IntArrayRef batch, const char* op,
                                        key_path leaf, const std::string& path) {
  if (!t.defined()) return t;
  t = on_device(std::move(t), device);
  if (!has_batch_prefix(t, batch))
    throw shape_error(std::string(op) + ": the leaf " + (path.empty() ? to_string(leaf) : path) + " is " + describe(t) +
                      ", but its leading dims must be the batch size " + format_sizes(batch));
  return t;
}

TENSORDICT_DECL std::shared_ptr<storage> make_storage(c10::IntArrayRef batch_size, std::optional<at::Device> device,
                                                      std::size_t leaf_count, std::size_t node_count, std::size_t non_tensor_count,
                                                      const std::size_t* node_parents) {
  auto st = std::make_shared<storage>();
  st->leaves.resize(leaf_count);
  st->batches.assign(node_count, std::vector<std::int64_t>(batch_size.begin(), batch_size.end()));
  st->device = device;
  st->locked.assign(node_count, 0);
  st->non_tensors.resize(non_tensor_count);
  st->node_parents = node_parents;
  return st;
}

TENSORDICT_DECL std::vector<std::vector<std::int64_t>> mapped_batches(c10::ArrayRef<std::vector<std::int64_t>> old,
                                                                      const std::size_t* parents, c10::IntArrayRef batch,
                                                                      nested_batch rule, const char* op,
                                                                      c10::function_ref<std::string(std::size_t)> node_name) {
  std::vector<std::vector<std::int64_t>> out(old.size());
  out[0] = batch.vec();
  for (std::size_t k = 1; k < old.size(); ++k) {
    out[k] = nested_batch_size(rule, old[k], old[parents[k]], out[parents[k]]);
    if (!starts_with(out[k], out[parents[k]]))
      throw shape_error(std::string(op) + ": the nested TensorDict " + node_name(k) + " has batch_size=" + format_sizes(old[k]) +
                        ", which does not start with " + format_sizes(out[parents[k]]));
  }
  return out;
}
}  // namespace tensordict::detail
#endif  // TENSORDICT_DEFINITIONS
