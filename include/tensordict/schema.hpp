// Compile-time schemas: the key tree of a typed TensorDict.
//
//   using linear = tensordict::schema<tensordict::leaf<"weight">, tensordict::leaf<"bias">>;
//   using mlp    = tensordict::schema<tensordict::field<"0", linear>, tensordict::field<"2", linear>>;
//
//   using step = tensordict::schema<tensordict::leaf<"obs">, tensordict::non_tensor<"task">>;
//
// Leaves are numbered in declaration order (depth first); that order is the
// storage order of a TensorDict and its iteration order. Non-tensor fields
// (non_tensor.hpp: a string, a number) are numbered apart, in the same order:
// leaf_count counts tensors only, non_tensor_count the others. Every query here is a
// constant computed once per schema or per key path, over small arrays of
// string_views, never by instantiating one type per leaf per lookup: that is
// what keeps a 500-leaf schema cheap to compile. No libtorch header is
// included, so this header compiles with clang too.
#pragma once

// First: compiling this header alone (tests/meson.build) checks that one alone too.
#include "keys.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string_view>
#include <type_traits>
#include <utility>

namespace tensordict {

// The type of a field that holds one tensor.
struct tensor_leaf {};
// The type of a field that holds non-tensor data (Python's NonTensorData or
// NonTensorStack: a NonTensor of non_tensor.hpp).
struct non_tensor_leaf {};

template <key Name, class T>
struct field {
  static constexpr auto name = Name;
  using type = T;
};

template <class... Fields>
struct schema;

template <key Name>
using leaf = field<Name, tensor_leaf>;

template <key Name>
using non_tensor = field<Name, non_tensor_leaf>;

template <key Name, class... Fields>
using node = field<Name, schema<Fields...>>;

inline constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

namespace detail {

template <class T>
struct is_schema : std::false_type {};
template <class... F>
struct is_schema<schema<F...>> : std::true_type {};

// A field that ends a key path: a tensor or non-tensor data.
template <class T>
inline constexpr bool is_terminal = std::is_same_v<T, tensor_leaf> || std::is_same_v<T, non_tensor_leaf>;

template <class T>
struct is_field : std::false_type {};
template <key N, class T>
struct is_field<field<N, T>> : std::bool_constant<is_terminal<T> || is_schema<T>::value> {};

// How many fields of type Kind (tensor_leaf or non_tensor_leaf) T holds.
template <class T, class Kind>
inline constexpr std::size_t entries_in = T::template count<Kind>;
template <class Kind>
inline constexpr std::size_t entries_in<tensor_leaf, Kind> = std::is_same_v<Kind, tensor_leaf>;
template <class Kind>
inline constexpr std::size_t entries_in<non_tensor_leaf, Kind> = std::is_same_v<Kind, non_tensor_leaf>;

template <class T>
inline constexpr std::size_t leaves_in = entries_in<T, tensor_leaf>;

template <class T>
inline constexpr std::size_t nodes_in = 0;
template <class... F>
inline constexpr std::size_t nodes_in<schema<F...>> = schema<F...>::node_count;

template <class T>
inline constexpr std::size_t depth_of = 0;
template <class... F>
inline constexpr std::size_t depth_of<schema<F...>> = schema<F...>::depth;

// Pack indexing by overload resolution: one instantiation per pack, not per index.
template <std::size_t I, class T>
struct indexed {
  using type = T;
};
template <class Indices, class... Ts>
struct indexer;
template <std::size_t... I, class... Ts>
struct indexer<std::index_sequence<I...>, Ts...> : indexed<I, Ts>... {};
template <std::size_t I, class T>
indexed<I, T> select(indexed<I, T>);
template <std::size_t I, class... Ts>
using pack_at = typename decltype(detail::select<I>(indexer<std::index_sequence_for<Ts...>, Ts...>{}))::type;

template <std::size_t N>
constexpr std::array<std::size_t, N> exclusive_prefix_sum(std::array<std::size_t, N> v, std::size_t start) {
  std::array<std::size_t, N> out{};
  for (std::size_t i = 0; i < N; ++i) {
    out[i] = start;
    start += v[i];
  }
  return out;
}

constexpr std::size_t max_of(std::initializer_list<std::size_t> values) {
  std::size_t m = 0;
  for (std::size_t v : values) m = v > m ? v : m;
  return m;
}

template <std::size_t N>
constexpr std::size_t find_name(const std::array<std::string_view, N>& names, std::string_view name) {
  for (std::size_t i = 0; i < N; ++i)
    if (names[i] == name) return i;
  return npos;
}

template <std::size_t N>
constexpr std::size_t first_true_or_zero(const std::array<bool, N>& flags) {
  for (std::size_t i = 0; i < N; ++i)
    if (flags[i]) return i;
  return 0;
}

// Index of a name that appears twice, or npos. Sorting first keeps this
// O(n log n): a flattened 1000-leaf schema has 1000 names at one level.
template <std::size_t N>
constexpr std::size_t first_duplicate(const std::array<std::string_view, N>& names) {
  std::array<std::size_t, N> order{};
  for (std::size_t i = 0; i < N; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return names[a] < names[b]; });
  for (std::size_t i = 1; i < N; ++i)
    if (names[order[i]] == names[order[i - 1]]) return order[i] > order[i - 1] ? order[i] : order[i - 1];
  return npos;
}

// A leaf's key path relative to a schema, and the node that holds it.
template <std::size_t Depth>
struct leaf_entry {
  std::array<std::string_view, Depth> parts{};
  std::size_t depth = 0;
  std::size_t parent_node = 0;
};

}  // namespace detail

template <class T>
concept schema_type = detail::is_schema<T>::value;

// Errors that the compiler reports. Each names the offending key in its type,
// which g++ prints in the "required from" line above the message.
namespace compile_error {
template <class T>
inline constexpr bool always_false = false;

template <key... Keys>
struct available_keys {};

template <key Key, class Available>
struct unknown_key {
  static_assert(always_false<Available>,
                "tensordict: unknown key. The schema has no field with the key named in "
                "'unknown_key<...>' above; the keys at that level are listed after it in "
                "'available_keys<...>'. Check the spelling and the nesting of the key path.");
};

template <key Leaf, key NextKey>
struct key_path_continues_past_a_leaf {
  static_assert(always_false<available_keys<Leaf, NextKey>>,
                "tensordict: the key path goes on after a leaf. The first key named in "
                "'key_path_continues_past_a_leaf<...>' above holds a tensor (or non-tensor data), not a "
                "nested TensorDict, so it has no key named by the second. Shorten the key path.");
};

template <key FlatKey>
struct use_the_flattened_key {
  static_assert(always_false<available_keys<FlatKey>>,
                "tensordict: this TensorDict's keys are flattened, so a nested key path does "
                "not name a field. Use the single joined key named in 'use_the_flattened_key<...>' "
                "above (get<\"0.weight\">() rather than get<\"0\", \"weight\">()), or call "
                "unflatten_keys<\".\">() first.");
};

template <key Key>
struct duplicate_key {
  static_assert(always_false<available_keys<Key>>,
                "tensordict: a schema level names the key in 'duplicate_key<...>' above twice. "
                "Keys must be unique at each level.");
};

template <key Key>
struct key_is_both_a_leaf_and_a_prefix {
  static_assert(always_false<available_keys<Key>>,
                "tensordict: unflatten_keys cannot build a tree: the key named above is a leaf "
                "and also the prefix of other keys.");
  using type = field<Key, tensor_leaf>;  // lets the compiler go on without a second error
};

template <key Old, key New>
struct rename_onto_an_existing_key {
  static_assert(always_false<available_keys<Old, New>>,
                "tensordict: rename_key<old, new>() would give two fields the same key: the schema already has "
                "the second key named in 'rename_onto_an_existing_key<...>' above. exclude<...>() that field "
                "first, or choose another name.");
};

template <key Key>
struct leaf_against_a_sub_tree {
  static_assert(always_false<available_keys<Key>>,
                "tensordict: update(other): the key named in 'leaf_against_a_sub_tree<...>' above holds a tensor "
                "on one side and a sub-tree on the other (or non-tensor data against either), so other's schema is not a "
                "part of this one's.");
};

template <key Key>
struct key_given_twice {
  static_assert(always_false<available_keys<Key>>,
                "tensordict: the key named in 'key_given_twice<...>' above is given twice. Name each key once.");
};

template <class Error>
constexpr void report() {
  (void)sizeof(Error);
}
}  // namespace compile_error

template <class... Fields>
struct schema {
  static_assert((detail::is_field<Fields>::value && ...),
                "tensordict::schema<...> takes fields: leaf<\"name\">, non_tensor<\"name\">, node<\"name\", fields...> "
                "or field<\"name\", schema<...>>.");

  static constexpr std::size_t field_count = sizeof...(Fields);
  static constexpr std::array<std::string_view, field_count> names{Fields::name.view()...};
  template <class Kind>
  static constexpr std::size_t count = (std::size_t{0} + ... + detail::entries_in<typename Fields::type, Kind>);
  static constexpr std::size_t leaf_count = count<tensor_leaf>;
  static constexpr std::size_t non_tensor_count = count<non_tensor_leaf>;
  // This schema's own node, then its sub-schemas depth first.
  static constexpr std::size_t node_count = (std::size_t{1} + ... + detail::nodes_in<typename Fields::type>);
  static constexpr std::size_t depth =
      field_count == 0 ? 0 : 1 + detail::max_of({std::size_t{0}, detail::depth_of<typename Fields::type>...});
  static constexpr std::array<std::size_t, field_count> leaf_offsets =
      detail::exclusive_prefix_sum<field_count>({detail::leaves_in<typename Fields::type>...}, 0);
  static constexpr std::array<std::size_t, field_count> non_tensor_offsets =
      detail::exclusive_prefix_sum<field_count>({detail::entries_in<typename Fields::type, non_tensor_leaf>...}, 0);
  static constexpr std::array<std::size_t, field_count> node_offsets =
      detail::exclusive_prefix_sum<field_count>({detail::nodes_in<typename Fields::type>...}, 1);
  template <class Kind>
  static constexpr const std::array<std::size_t, field_count>& offsets() {
    if constexpr (std::is_same_v<Kind, tensor_leaf>) return leaf_offsets;
    else return non_tensor_offsets;
  }

  template <std::size_t I>
  using field_at = detail::pack_at<I, Fields...>;

  // Index of the field named `name` at this level, or npos.
  static constexpr std::size_t find(std::string_view name) { return detail::find_name(names, name); }

  using keys = compile_error::available_keys<Fields::name...>;
};

namespace detail {

// The keys at the level where the key path Path (a key_path_t) stops matching
// S: a typo in ("agent", "actoin") lists the keys under "agent", not the top level's.
template <class S, class Path>
struct keys_where_path_fails {
  using type = typename S::keys;
};
template <class... Fields, key K, key Next, key... Rest>
  requires(schema<Fields...>::find(K.view()) != npos)
struct keys_where_path_fails<schema<Fields...>, key_path_t<K, Next, Rest...>> {
  using child = typename schema<Fields...>::template field_at<schema<Fields...>::find(K.view())>::type;
  using type = typename std::conditional_t<is_schema<child>::value, keys_where_path_fails<child, key_path_t<Next, Rest...>>,
                                           keys_where_path_fails<schema<Fields...>, key_path_t<>>>::type;
};

// ---- key path resolution -------------------------------------------------

template <class S, key... Path>
struct resolve;

template <class S, std::size_t Index, key K, key... Rest>
struct resolve_in;

// The empty path names the schema itself.
template <class S>
struct resolve<S> {
  using type = S;
  using error = void;
  static constexpr std::size_t leaf_offset = 0;
  static constexpr std::size_t non_tensor_offset = 0;
  static constexpr std::size_t node_offset = 0;
  static constexpr std::size_t parent_node = 0;
};

template <class S, key K, key... Rest>
struct resolve<S, K, Rest...> : resolve_in<S, S::find(K), K, Rest...> {};

template <class Child, key Name, key... Rest>
struct resolve_child : resolve<Child, Rest...> {};

template <class Child, key Name, key Next, key... Rest>
  requires is_terminal<Child>
struct resolve_child<Child, Name, Next, Rest...> {
  using type = Child;
  using error = compile_error::key_path_continues_past_a_leaf<Name, Next>;
  static constexpr std::size_t leaf_offset = 0;
  static constexpr std::size_t non_tensor_offset = 0;
  static constexpr std::size_t node_offset = 0;
  static constexpr std::size_t parent_node = 0;
};

template <class S, std::size_t Index, key K, key... Rest>
struct resolve_in {
  using child = typename S::template field_at<Index>::type;
  using sub = resolve_child<child, K, Rest...>;
  using type = typename sub::type;
  using error = typename sub::error;
  static constexpr std::size_t leaf_offset = S::leaf_offsets[Index] + sub::leaf_offset;
  static constexpr std::size_t non_tensor_offset = S::non_tensor_offsets[Index] + sub::non_tensor_offset;
  static constexpr std::size_t node_offset = is_terminal<child> ? 0 : S::node_offsets[Index] + sub::node_offset;
  // The node that holds the target: what a lock on the way must be checked against.
  static constexpr std::size_t parent_node = sizeof...(Rest) == 0 ? 0 : S::node_offsets[Index] + sub::parent_node;
};

template <class S, key K, key... Rest>
struct resolve_in<S, npos, K, Rest...> {
  using type = tensor_leaf;
  using error = compile_error::unknown_key<K, typename S::keys>;
  static constexpr std::size_t leaf_offset = 0;
  static constexpr std::size_t non_tensor_offset = 0;
  static constexpr std::size_t node_offset = 0;
  static constexpr std::size_t parent_node = 0;
};

// The error to report for a key path, or void. A nested path on a flat schema
// that holds the joined key gets the more helpful message. Only paths that
// fail pay for the joined key.
template <class S, class Error, key... Path>
struct path_error_of {
  using type = Error;
};
template <class S, class Error, key First, key Second, key... Rest>
  requires(!std::is_void_v<Error>)
struct path_error_of<S, Error, First, Second, Rest...> {
  using type = std::conditional_t<S::find(joined_key<".", First, Second, Rest...>) == npos, Error,
                                  compile_error::use_the_flattened_key<joined_key<".", First, Second, Rest...>>>;
};

template <class S, key... Path>
using path_error = typename path_error_of<S, typename resolve<S, Path...>::error, Path...>::type;

// ---- leaf tables -----------------------------------------------------------

// The fields of type Kind (tensor_leaf: the leaves; non_tensor_leaf) of T, in order.
template <class T, std::size_t Depth, class Kind = tensor_leaf>
struct leaf_table_of {  // T is itself a field of one kind
  static constexpr std::array<leaf_entry<Depth>, std::is_same_v<T, Kind> ? 1 : 0> value{};
};

template <class... Fields, std::size_t Depth, class Kind>
struct leaf_table_of<schema<Fields...>, Depth, Kind> {
  using S = schema<Fields...>;
  static constexpr std::array<leaf_entry<Depth>, S::template count<Kind>> build() {
    std::array<leaf_entry<Depth>, S::template count<Kind>> out{};
    std::size_t field = 0;
    [[maybe_unused]] auto add = [&](std::string_view name, const auto& child_table, bool child_is_leaf) {
      std::size_t base = S::template offsets<Kind>()[field];
      for (std::size_t i = 0; i < child_table.size(); ++i) {
        leaf_entry<Depth> e = child_table[i];
        for (std::size_t d = e.depth; d > 0; --d) e.parts[d] = e.parts[d - 1];
        e.parts[0] = name;
        ++e.depth;
        e.parent_node = child_is_leaf ? 0 : S::node_offsets[field] + e.parent_node;
        out[base + i] = e;
      }
      ++field;
    };
    (add(Fields::name.view(), leaf_table_of<typename Fields::type, Depth, Kind>::value, is_terminal<typename Fields::type>), ...);
    return out;
  }
  static constexpr std::array<leaf_entry<Depth>, S::template count<Kind>> value = build();
};

// Parent of every node of a schema, in node order (the root's parent is npos).
template <class T>
struct node_parents_of;

template <class... Fields>
struct node_parents_of<schema<Fields...>> {
  using S = schema<Fields...>;
  static constexpr std::array<std::size_t, S::node_count> build() {
    std::array<std::size_t, S::node_count> out{};
    out[0] = npos;
    std::size_t field = 0;
    [[maybe_unused]] auto add = [&]<class Child>(std::type_identity<Child>) {
      if constexpr (is_schema<Child>::value) {
        std::size_t base = S::node_offsets[field];
        const auto& sub = node_parents_of<Child>::value;
        for (std::size_t i = 0; i < sub.size(); ++i) out[base + i] = i == 0 ? 0 : base + sub[i];
      }
      ++field;
    };
    (add(std::type_identity<typename Fields::type>{}), ...);
    return out;
  }
  static constexpr std::array<std::size_t, S::node_count> value = build();
};

// ---- field table -----------------------------------------------------------

// A field of a schema at any depth, as the printer compiled in the library reads it.
struct field_entry {
  enum kind_t : std::uint8_t { tensor, non_tensor, node };
  std::string_view name;
  kind_t kind = tensor;
  std::size_t index = 0;  // of the leaf, the non-tensor field or the node, counted over the whole schema
};
// Node k's own fields in a field table: entries [begin, begin + count).
struct level_span {
  std::size_t begin = 0, count = 0;
};

template <class T>
inline constexpr std::size_t fields_in = 0;
template <class... Fields>
inline constexpr std::size_t fields_in<schema<Fields...>> = (sizeof...(Fields) + ... + fields_in<typename Fields::type>);

// Every field of schema S, level by level (the root's first, then each sub-schema's, depth first),
// and where each node's fields are: what repr needs, without a function per level.
template <class S>
struct field_table_of;

template <class... Fields>
struct field_table_of<schema<Fields...>> {
  using S = schema<Fields...>;
  struct tables {
    std::array<field_entry, fields_in<S>> fields{};
    std::array<level_span, S::node_count> levels{};
  };
  static constexpr tables build() {
    tables out{};
    out.levels[0] = {0, S::field_count};
    std::size_t field = 0, next = S::field_count;
    [[maybe_unused]] auto add = [&]<class Child>(std::type_identity<Child>) {
      if constexpr (std::is_same_v<Child, tensor_leaf>) {
        out.fields[field] = {S::names[field], field_entry::tensor, S::leaf_offsets[field]};
      } else if constexpr (std::is_same_v<Child, non_tensor_leaf>) {
        out.fields[field] = {S::names[field], field_entry::non_tensor, S::non_tensor_offsets[field]};
      } else {
        const std::size_t node = S::node_offsets[field];
        out.fields[field] = {S::names[field], field_entry::node, node};
        const auto& sub = field_table_of<Child>::value;
        for (std::size_t i = 0; i < sub.fields.size(); ++i) {
          field_entry e = sub.fields[i];
          e.index += e.kind == field_entry::tensor       ? S::leaf_offsets[field]
                     : e.kind == field_entry::non_tensor ? S::non_tensor_offsets[field]
                                                         : node;
          out.fields[next + i] = e;
        }
        for (std::size_t k = 0; k < sub.levels.size(); ++k) out.levels[node + k] = {next + sub.levels[k].begin, sub.levels[k].count};
        next += sub.fields.size();
      }
      ++field;
    };
    (add(std::type_identity<typename Fields::type>{}), ...);
    return out;
  }
  static constexpr tables value = build();
};

// ---- flatten ---------------------------------------------------------------

template <class S, key Separator, std::size_t Leaf, class Kind>
constexpr std::size_t flat_key_length() {
  const auto& e = leaf_table_of<S, S::depth, Kind>::value[Leaf];
  std::size_t n = (e.depth - 1) * Separator.size();
  for (std::size_t d = 0; d < e.depth; ++d) n += e.parts[d].size();
  return n;
}

template <class S, key Separator, std::size_t Leaf, class Kind = tensor_leaf>
constexpr auto flat_key() {
  const auto& e = leaf_table_of<S, S::depth, Kind>::value[Leaf];
  key<flat_key_length<S, Separator, Leaf, Kind>()> out{};
  std::size_t pos = 0;
  for (std::size_t d = 0; d < e.depth; ++d) {
    if (d)
      for (char c : Separator.view()) out.chars[pos++] = c;
    for (char c : e.parts[d]) out.chars[pos++] = c;
  }
  out.chars[pos] = '\0';
  return out;
}

// The leaves, then the non-tensor fields.
template <class S, key Separator, class Leaves = std::make_index_sequence<S::leaf_count>,
          class NonTensors = std::make_index_sequence<S::non_tensor_count>>
struct flatten_impl;

template <class S, key Separator, std::size_t... Leaf, std::size_t... NonTensor>
struct flatten_impl<S, Separator, std::index_sequence<Leaf...>, std::index_sequence<NonTensor...>> {
  using type = schema<leaf<flat_key<S, Separator, Leaf>()>..., non_tensor<flat_key<S, Separator, NonTensor, non_tensor_leaf>()>...>;
};

// ---- unflatten ---------------------------------------------------------------
//
// The fields of a flat schema whose keys share the first `Pos` characters are
// grouped by the next part of their key (up to the separator), groups in order
// of first appearance; each group becomes a field of the same type (a tensor
// or non-tensor data) or a nested schema.

template <std::size_t M>
struct grouping {
  std::size_t count = 0;                  // number of groups
  std::array<std::size_t, M> start{};     // first slot of each group in `members`
  std::array<std::size_t, M> size{};      // members per group
  std::array<std::size_t, M> members{};   // field indices, grouped
  std::array<std::size_t, M> head_length{};
  std::array<bool, M> is_leaf{};          // the group is one key with nothing after the head
  std::size_t conflict = npos;            // a group that is both a leaf and a prefix
};

template <class Flat, key Separator, std::size_t Pos, std::size_t... Is>
constexpr grouping<sizeof...(Is)> group_by_head() {
  constexpr std::size_t M = sizeof...(Is);
  constexpr std::array<std::size_t, M> leaves{Is...};
  const auto& names = Flat::names;
  const std::string_view sep = Separator.view();
  std::array<std::string_view, M> heads{};
  std::array<bool, M> ends{};
  for (std::size_t m = 0; m < M; ++m) {
    std::string_view rest = names[leaves[m]].substr(Pos);
    std::size_t cut = rest.find(sep);
    ends[m] = cut == std::string_view::npos;
    heads[m] = ends[m] ? rest : rest.substr(0, cut);
  }
  grouping<M> g{};
  std::array<std::size_t, M> group_of{};
  for (std::size_t m = 0; m < M; ++m) {
    std::size_t found = npos;
    for (std::size_t k = 0; k < g.count; ++k)
      if (heads[g.members[g.start[k]]] == heads[m]) found = k;  // members[] holds m for now
    if (found == npos) {
      found = g.count++;
      g.start[found] = m;  // first member, temporarily
      g.members[m] = m;
    }
    group_of[m] = found;
  }
  // Lay the members out group by group, keeping their order.
  std::size_t slot = 0;
  for (std::size_t k = 0; k < g.count; ++k) {
    std::size_t first = g.start[k];
    g.start[k] = slot;
    g.head_length[k] = heads[first].size();
    bool any_end = false, any_more = false;
    for (std::size_t m = 0; m < M; ++m)
      if (group_of[m] == k) {
        g.members[slot++] = leaves[m];
        (ends[m] ? any_end : any_more) = true;
      }
    g.size[k] = slot - g.start[k];
    g.is_leaf[k] = any_end && !any_more && g.size[k] == 1;
    if (any_end && (any_more || g.size[k] > 1)) g.conflict = k;
  }
  return g;
}

template <class Flat, key Separator, std::size_t Pos, class Indices>
struct unflatten_level;

template <class Flat, key Separator, std::size_t Pos, std::size_t Group, class Grouping>
struct unflatten_group;

template <class Flat, key Separator, std::size_t Pos, std::size_t... Is>
struct unflatten_level<Flat, Separator, Pos, std::index_sequence<Is...>> {
  static constexpr auto groups = group_by_head<Flat, Separator, Pos, Is...>();

  template <std::size_t G>
  using group_field = typename unflatten_group<Flat, Separator, Pos, G, unflatten_level>::type;

  template <std::size_t... G>
  static auto build(std::index_sequence<G...>) -> schema<group_field<G>...>;

  using type = decltype(build(std::make_index_sequence<groups.count>{}));

  // For each terminal field of `type`, depth first, the index of the flat field it comes from.
  static constexpr std::array<std::size_t, sizeof...(Is)> order() {
    std::array<std::size_t, sizeof...(Is)> out{};
    std::size_t n = 0;
    [&]<std::size_t... G>(std::index_sequence<G...>) {
      auto append = [&](const auto& sub) {
        for (std::size_t v : sub) out[n++] = v;
      };
      (append(unflatten_group<Flat, Separator, Pos, G, unflatten_level>::order), ...);
    }(std::make_index_sequence<groups.count>{});
    return out;
  }
};

template <class Flat, key Separator, std::size_t Pos, std::size_t G, class Level>
struct unflatten_group {
  static constexpr auto& g = Level::groups;
  static constexpr std::size_t first = g.members[g.start[G]];
  static constexpr auto head = make_key<g.head_length[G]>(Flat::names[first].substr(Pos, g.head_length[G]));

  template <std::size_t... K>
  static auto sub_level(std::index_sequence<K...>)
      -> unflatten_level<Flat, Separator, Pos + g.head_length[G] + Separator.size(),
                         std::index_sequence<g.members[g.start[G] + K]...>>;
  using sub = decltype(sub_level(std::make_index_sequence<g.size[G]>{}));

  static constexpr bool conflict = g.conflict == G;
  static auto pick() {
    if constexpr (conflict)  // naming ::type instantiates the error, which reports it
      return std::type_identity<typename compile_error::key_is_both_a_leaf_and_a_prefix<head>::type>{};
    else if constexpr (g.is_leaf[G])
      return std::type_identity<field<head, typename Flat::template field_at<first>::type>>{};
    else
      return std::type_identity<field<head, typename sub::type>>{};
  }
  using type = typename decltype(pick())::type;

  static constexpr auto make_order() {
    if constexpr (g.is_leaf[G] || conflict)
      return std::array<std::size_t, 1>{first};
    else
      return sub::order();
  }
  static constexpr auto order = make_order();
};

}  // namespace detail

// ---- public compile-time queries -------------------------------------------

template <schema_type S>
inline constexpr std::size_t leaf_count_v = S::leaf_count;

// Index of the leaf at a key path, in storage order.
template <schema_type S, key... Path>
  requires(sizeof...(Path) > 0 && std::is_void_v<typename detail::resolve<S, Path...>::error> &&
           std::is_same_v<typename detail::resolve<S, Path...>::type, tensor_leaf>)
inline constexpr std::size_t leaf_index_v = detail::resolve<S, Path...>::leaf_offset;

// Index of the non-tensor field at a key path, in storage order.
template <schema_type S, key... Path>
  requires(sizeof...(Path) > 0 && std::is_void_v<typename detail::resolve<S, Path...>::error> &&
           std::is_same_v<typename detail::resolve<S, Path...>::type, non_tensor_leaf>)
inline constexpr std::size_t non_tensor_index_v = detail::resolve<S, Path...>::non_tensor_offset;

// The type at a key path: tensor_leaf, non_tensor_leaf or a sub-schema.
template <schema_type S, key... Path>
  requires std::is_void_v<typename detail::resolve<S, Path...>::error>
using type_at_t = typename detail::resolve<S, Path...>::type;

template <schema_type S, key... Path>
inline constexpr bool has_path_v = std::is_void_v<typename detail::resolve<S, Path...>::error>;

// Every leaf's key path, in storage order.
template <schema_type S>
inline constexpr const auto& leaf_paths_v = detail::leaf_table_of<S, S::depth>::value;

template <schema_type S>
constexpr key_path leaf_path(std::size_t leaf) {
  const auto& e = leaf_paths_v<S>[leaf];
  return key_path(e.parts.data(), e.depth);
}

// Every non-tensor field's key path, in storage order.
template <schema_type S>
inline constexpr const auto& non_tensor_paths_v = detail::leaf_table_of<S, S::depth, non_tensor_leaf>::value;

template <schema_type S>
constexpr key_path non_tensor_path(std::size_t i) {
  const auto& e = non_tensor_paths_v<S>[i];
  return key_path(e.parts.data(), e.depth);
}

// Every leaf and non-tensor field of S under its joined key ("0.weight"), leaves first.
template <schema_type S, key Separator = ".">
using flatten_t = typename detail::flatten_impl<S, Separator>::type;

template <schema_type S, key Separator = ".">
using unflatten_t =
    typename detail::unflatten_level<S, Separator, 0, std::make_index_sequence<S::field_count>>::type;

namespace detail {
// For each field of type Kind of unflatten_t<S, Separator>, the index of the one of S it comes from.
template <class S, key Separator, class Kind>
constexpr auto unflatten_order() {
  constexpr auto fields = unflatten_level<S, Separator, 0, std::make_index_sequence<S::field_count>>::order();
  std::array<std::size_t, S::template count<Kind>> out{};
  std::size_t n = 0;
  for (std::size_t f : fields)
    if (S::template offsets<Kind>()[f] != (f + 1 < S::field_count ? S::template offsets<Kind>()[f + 1] : S::template count<Kind>))
      out[n++] = S::template offsets<Kind>()[f];
  return out;
}
}  // namespace detail

// For each leaf of unflatten_t<S, Separator>, the index of the leaf of S it comes from.
template <schema_type S, key Separator = ".">
inline constexpr auto unflatten_order_v = detail::unflatten_order<S, Separator, tensor_leaf>();
// The same for the non-tensor fields.
template <schema_type S, key Separator = ".">
inline constexpr auto unflatten_non_tensor_order_v = detail::unflatten_order<S, Separator, non_tensor_leaf>();

// Two schemas are equal when they have the same keys, nested the same way, in the same order.
template <schema_type A, schema_type B>
inline constexpr bool schema_equal_v = std::is_same_v<A, B>;

// The index of a key that appears twice at one level of S (searched
// recursively), or npos.
template <class S>
struct duplicate_check;
template <class T>
  requires detail::is_terminal<T>
struct duplicate_check<T> {
  using error = void;
};
template <class... Fields>
struct duplicate_check<schema<Fields...>> {
  static constexpr std::size_t dup = detail::first_duplicate(schema<Fields...>::names);
  template <std::size_t I>
  static auto own_error() {
    if constexpr (I == npos)
      return std::type_identity<void>{};
    else
      return std::type_identity<compile_error::duplicate_key<detail::pack_at<I, Fields...>::name>>{};
  }
  using own = typename decltype(own_error<dup>())::type;
  // The first error of this level or of a child, without recursing over the
  // fields (a flat schema has hundreds at one level).
  static constexpr std::array<bool, sizeof...(Fields) + 1> failed{
      !std::is_void_v<own>, !std::is_void_v<typename duplicate_check<typename Fields::type>::error>...};
  static constexpr std::size_t first_failed = detail::first_true_or_zero(failed);
  using error = detail::pack_at<first_failed, own, typename duplicate_check<typename Fields::type>::error...>;
};

// ---- schema algebra: select, exclude, rename, sub-schemas -------------------
//
// Each result is a schema and a map from its leaves to the leaves of S, so a
// TensorDict of the result holds the same tensors. Every key is a top-level
// key of S; an unknown one is a compile error naming it and the keys there.

namespace detail {

template <key K>
struct key_constant {
  static constexpr auto value = K;
};

template <class S, std::size_t Field>
constexpr std::size_t field_leaf_count() {
  return (Field + 1 < S::field_count ? S::leaf_offsets[Field + 1] : S::leaf_count) - S::leaf_offsets[Field];
}

// The fields of S at `kept` (indices of S's fields, in the result's order),
// and for each leaf of the result the leaf of S it is.
template <class S, auto Kept, class Indices = std::make_index_sequence<Kept.size()>>
struct field_subset;
template <class S, auto Kept, std::size_t... I>
struct field_subset<S, Kept, std::index_sequence<I...>> {
  using type = schema<typename S::template field_at<Kept[I]>...>;
  static constexpr std::array<std::size_t, type::leaf_count> build() {
    std::array<std::size_t, type::leaf_count> out{};
    std::size_t n = 0;
    for (std::size_t k : Kept)
      for (std::size_t l = 0; l < (k + 1 < S::field_count ? S::leaf_offsets[k + 1] : S::leaf_count) - S::leaf_offsets[k]; ++l)
        out[n++] = S::leaf_offsets[k] + l;
    return out;
  }
  static constexpr std::array<std::size_t, type::leaf_count> leaves = build();
  static constexpr std::array<std::size_t, type::non_tensor_count> build_non_tensors() {
    std::array<std::size_t, type::non_tensor_count> out{};
    std::size_t n = 0;
    for (std::size_t k : Kept)
      for (std::size_t l = S::non_tensor_offsets[k];
           l < (k + 1 < S::field_count ? S::non_tensor_offsets[k + 1] : S::non_tensor_count); ++l)
        out[n++] = l;
    return out;
  }
  static constexpr std::array<std::size_t, type::non_tensor_count> non_tensors = build_non_tensors();
};

// The first key of Keys that S lacks or that appears twice, as the error to report, or void.
template <class S, key... Keys>
struct key_list_error {
  static constexpr std::array<std::string_view, sizeof...(Keys)> names{Keys.view()...};
  static constexpr std::array<bool, sizeof...(Keys) + 1> missing{false, (S::find(Keys) == npos)...};
  static constexpr std::size_t first_missing = first_true_or_zero(missing);
  static constexpr std::size_t duplicate = first_duplicate(names);
  static auto pick() {
    if constexpr (first_missing != 0)
      return std::type_identity<
          compile_error::unknown_key<pack_at<first_missing - 1, key_constant<Keys>...>::value, typename S::keys>>{};
    else if constexpr (duplicate != npos)
      return std::type_identity<compile_error::key_given_twice<pack_at<duplicate, key_constant<Keys>...>::value>>{};
    else
      return std::type_identity<void>{};
  }
  using type = typename decltype(pick())::type;
};

template <class S, key... Keys>
constexpr std::array<std::size_t, sizeof...(Keys)> selected_fields() {
  return {S::find(Keys)...};
}

template <class S, key... Keys>
constexpr auto excluded_fields() {
  constexpr std::array<std::size_t, sizeof...(Keys)> dropped{S::find(Keys)...};
  constexpr std::size_t n = [&] {
    std::size_t k = 0;
    for (std::size_t f = 0; f < S::field_count; ++f) k += std::find(dropped.begin(), dropped.end(), f) == dropped.end();
    return k;
  }();
  std::array<std::size_t, n> out{};
  std::size_t k = 0;
  for (std::size_t f = 0; f < S::field_count; ++f)
    if (std::find(dropped.begin(), dropped.end(), f) == dropped.end()) out[k++] = f;
  return out;
}

template <class S, key... Keys>
struct select_impl : field_subset<S, selected_fields<S, Keys...>()> {};
template <class S, key... Keys>
struct exclude_impl : field_subset<S, excluded_fields<S, Keys...>()> {};

template <class Field, key Old, key New>
struct renamed_field {
  using type = Field;
};
template <key Old, class T, key New>
struct renamed_field<field<Old, T>, Old, New> {
  using type = field<New, T>;
};
template <class S, key Old, key New>
struct rename_impl;
template <class... Fields, key Old, key New>
struct rename_impl<schema<Fields...>, Old, New> {
  using type = schema<typename renamed_field<Fields, Old, New>::type...>;
};

template <class S, key Old, key New>
struct rename_error {
  static auto pick() {
    if constexpr (S::find(Old) == npos)
      return std::type_identity<compile_error::unknown_key<Old, typename S::keys>>{};
    else if constexpr (S::find(New) != npos && !(Old == New))
      return std::type_identity<compile_error::rename_onto_an_existing_key<Old, New>>{};
    else
      return std::type_identity<void>{};
  }
  using type = typename decltype(pick())::type;
};

// Where each leaf of O sits among the leaves of T, when O's key tree is a part
// of T's; otherwise the error that names the first key that is not.
template <class O, class T>
struct embedding;

template <class Kind>
  requires is_terminal<Kind>
struct embedding<Kind, Kind> {
  using error = void;
  static constexpr std::array<std::size_t, leaves_in<Kind>> leaves{};  // {0} for a tensor
  static constexpr std::array<std::size_t, entries_in<Kind, non_tensor_leaf>> non_tensors{};
};

template <class F, class T>
struct embedded_field {
  static constexpr std::size_t index = T::find(F::name);
  static auto pick_sub() {
    if constexpr (index == npos) {
      return std::type_identity<void>{};
    } else {
      using mine = typename F::type;
      using theirs = typename T::template field_at<index>::type;
      if constexpr ((is_terminal<mine> || is_terminal<theirs>) && !std::is_same_v<mine, theirs>)
        return std::type_identity<void>{};
      else
        return std::type_identity<embedding<mine, theirs>>{};
    }
  }
  using sub = typename decltype(pick_sub())::type;  // void when this level fails
  static auto pick_error() {
    if constexpr (index == npos)
      return std::type_identity<compile_error::unknown_key<F::name, typename T::keys>>{};
    else if constexpr (std::is_void_v<sub>)
      return std::type_identity<compile_error::leaf_against_a_sub_tree<F::name>>{};
    else
      return std::type_identity<typename sub::error>{};
  }
  using error = typename decltype(pick_error())::type;
};

template <class... Fields, class T>
struct embedding<schema<Fields...>, T> {
  static constexpr std::array<bool, sizeof...(Fields) + 1> failed{
      false, !std::is_void_v<typename embedded_field<Fields, T>::error>...};
  static constexpr std::size_t first_failed = first_true_or_zero(failed);
  using error = pack_at<first_failed, void, typename embedded_field<Fields, T>::error...>;

  template <class Kind>
  static constexpr auto build() {
    std::array<std::size_t, schema<Fields...>::template count<Kind>> out{};
    if constexpr (std::is_void_v<error>) {
      std::size_t n = 0;
      [[maybe_unused]] auto add = [&]<class F>(std::type_identity<F>) {
        using sub = typename embedded_field<F, T>::sub;
        const std::size_t base = T::template offsets<Kind>()[embedded_field<F, T>::index];
        if constexpr (std::is_same_v<Kind, tensor_leaf>)
          for (std::size_t l : sub::leaves) out[n++] = base + l;
        else
          for (std::size_t l : sub::non_tensors) out[n++] = base + l;
      };
      (add(std::type_identity<Fields>{}), ...);
    }
    return out;
  }
  static constexpr auto leaves = build<tensor_leaf>();
  static constexpr auto non_tensors = build<non_tensor_leaf>();
};

}  // namespace detail

// The schema of the top-level fields Keys of S, in the order given.
template <schema_type S, key... Keys>
  requires std::is_void_v<typename detail::key_list_error<S, Keys...>::type>
using select_t = typename detail::select_impl<S, Keys...>::type;

// The schema of S without the top-level fields Keys.
template <schema_type S, key... Keys>
  requires std::is_void_v<typename detail::key_list_error<S, Keys...>::type>
using exclude_t = typename detail::exclude_impl<S, Keys...>::type;

// S with its top-level field Old named New.
template <schema_type S, key Old, key New>
  requires std::is_void_v<typename detail::rename_error<S, Old, New>::type>
using rename_t = typename detail::rename_impl<S, Old, New>::type;

// True when every key path of Part is in S, leaves against leaves: a
// TensorDict<Part> can update a TensorDict<S>.
template <schema_type Part, schema_type S>
inline constexpr bool is_sub_schema_v = std::is_void_v<typename detail::embedding<Part, S>::error>;

}  // namespace tensordict
