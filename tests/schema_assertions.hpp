// Compile-time facts about keys and schemas, checked by g++ (test_schema.cpp)
// and by clang (clang_schema_check.cpp). Includes no libtorch header.
#pragma once

#include <array>
#include <type_traits>

#include <boost/hana/string.hpp>

#include <tensordict/keys.hpp>
#include <tensordict/schema.hpp>

namespace schema_assertions {
using namespace tensordict;

using linear = schema<leaf<"weight">, leaf<"bias">>;
using mlp = schema<field<"0", linear>, field<"2", linear>>;
using deep = schema<field<"0", linear>, field<"2", linear>, leaf<"scale">, node<"deep", node<"er", leaf<"x">>>>;

// keys
static_assert(key("weight").size() == 6);
static_assert(key("weight").view() == "weight");
static_assert(key("a") == key("a") && !(key("a") == key("ab")));
static_assert(joined_key<".", "0", "weight"> == key("0.weight"));
static_assert(joined_key<"/", "a", "b", "c"> == key("a/b/c"));
static_assert(joined_key<"::", "only"> == key("only"));
static_assert(std::is_same_v<decltype(to_hana_string<"ab">()), boost::hana::string<'a', 'b'>>);
static_assert(from_hana_string(boost::hana::string<'w', 'x'>{}) == key("wx"));
static_assert(from_hana_string(to_hana_string<"round trip">()) == key("round trip"));
static_assert(key_path_t<"0", "weight">::size() == 2 && key_path_t<"0", "weight">::parts[1] == "weight");

// counts
static_assert(leaf_count_v<linear> == 2 && leaf_count_v<mlp> == 4 && leaf_count_v<deep> == 6);
static_assert(leaf_count_v<schema<>> == 0);
static_assert(mlp::node_count == 3 && deep::node_count == 5);
static_assert(mlp::depth == 2 && deep::depth == 3 && linear::depth == 1);

// keys of a level, index of a key path (storage order is declaration order)
static_assert(mlp::names == std::array<std::string_view, 2>{"0", "2"});
static_assert(linear::find("bias") == 1 && linear::find("nope") == npos);
static_assert(leaf_index_v<mlp, "0", "weight"> == 0);
static_assert(leaf_index_v<mlp, "0", "bias"> == 1);
static_assert(leaf_index_v<mlp, "2", "weight"> == 2);
static_assert(leaf_index_v<deep, "scale"> == 4);
static_assert(leaf_index_v<deep, "deep", "er", "x"> == 5);
static_assert(std::is_same_v<type_at_t<mlp, "2">, linear>);
static_assert(std::is_same_v<type_at_t<mlp, "2", "bias">, tensor_leaf>);
static_assert(has_path_v<mlp, "0", "bias"> && !has_path_v<mlp, "1"> && !has_path_v<mlp, "0", "bias", "x">);
static_assert(leaf_paths_v<deep>[5].depth == 3 && leaf_paths_v<deep>[5].parts[1] == "er");
static_assert(leaf_path<mlp>(3)[0] == "2" && leaf_path<mlp>(3)[1] == "bias");

// flatten / unflatten
using flat_mlp = schema<leaf<"0.weight">, leaf<"0.bias">, leaf<"2.weight">, leaf<"2.bias">>;
static_assert(std::is_same_v<flatten_t<mlp>, flat_mlp>);
static_assert(std::is_same_v<flatten_t<deep, "/">,
                             schema<leaf<"0/weight">, leaf<"0/bias">, leaf<"2/weight">, leaf<"2/bias">, leaf<"scale">,
                                    leaf<"deep/er/x">>>);
static_assert(std::is_same_v<unflatten_t<flat_mlp>, mlp>);
static_assert(std::is_same_v<unflatten_t<flatten_t<deep, "::">, "::">, deep>);
static_assert(std::is_same_v<flatten_t<linear>, linear>);
static_assert(std::is_same_v<unflatten_t<linear>, linear>);
// Leaves of one prefix are gathered where the prefix first appears.
using interleaved = schema<leaf<"a.x">, leaf<"b">, leaf<"a.y">>;
static_assert(std::is_same_v<unflatten_t<interleaved>, schema<node<"a", leaf<"x">, leaf<"y">>, leaf<"b">>>);
static_assert(unflatten_order_v<interleaved> == std::array<std::size_t, 3>{0, 2, 1});

// equality
static_assert(schema_equal_v<mlp, schema<node<"0", leaf<"weight">, leaf<"bias">>, node<"2", leaf<"weight">, leaf<"bias">>>>);
static_assert(!schema_equal_v<mlp, schema<node<"0", leaf<"bias">, leaf<"weight">>, node<"2", leaf<"weight">, leaf<"bias">>>>);
static_assert(!schema_equal_v<mlp, flat_mlp>);

// select, exclude, rename, sub-schemas (leaf maps point into the source's leaves)
static_assert(std::is_same_v<select_t<deep, "scale", "0">, schema<leaf<"scale">, field<"0", linear>>>);
static_assert(tensordict::detail::select_impl<deep, "scale", "0">::leaves == std::array<std::size_t, 3>{4, 0, 1});
static_assert(std::is_same_v<exclude_t<deep, "0", "deep">, schema<field<"2", linear>, leaf<"scale">>>);
static_assert(tensordict::detail::exclude_impl<deep, "0", "deep">::leaves == std::array<std::size_t, 3>{2, 3, 4});
static_assert(std::is_same_v<exclude_t<linear>, linear>);
static_assert(std::is_same_v<rename_t<mlp, "2", "1">, schema<field<"0", linear>, field<"1", linear>>>);
static_assert(std::is_same_v<rename_t<mlp, "2", "2">, mlp>);
static_assert(is_sub_schema_v<schema<node<"deep", node<"er", leaf<"x">>>, leaf<"scale">>, deep>);
static_assert(tensordict::detail::embedding<schema<node<"deep", node<"er", leaf<"x">>>, node<"2", leaf<"bias">>>, deep>::leaves ==
              std::array<std::size_t, 2>{5, 3});
static_assert(is_sub_schema_v<schema<>, deep> && is_sub_schema_v<deep, deep>);
static_assert(!is_sub_schema_v<schema<leaf<"deep">>, deep>);
static_assert(!is_sub_schema_v<schema<node<"0", leaf<"scale">>>, deep>);
// non-tensor fields: numbered apart from the leaves, carried by flatten, unflatten, select and update
using step = schema<leaf<"obs">, non_tensor<"task">, node<"next", leaf<"obs">, non_tensor<"name">>, leaf<"reward">>;
static_assert(step::leaf_count == 3 && step::non_tensor_count == 2 && step::node_count == 2);
static_assert(non_tensor_index_v<step, "next", "name"> == 1 && leaf_index_v<step, "reward"> == 2);
static_assert(std::is_same_v<type_at_t<step, "task">, non_tensor_leaf> && !has_path_v<step, "task", "x">);
static_assert(non_tensor_path<step>(1).size() == 2 && non_tensor_path<step>(1)[1] == "name");
using flat_step = flatten_t<step>;
static_assert(std::is_same_v<flat_step, schema<leaf<"obs">, leaf<"next.obs">, leaf<"reward">, non_tensor<"task">, non_tensor<"next.name">>>);
static_assert(std::is_same_v<unflatten_t<flat_step>,
                             schema<leaf<"obs">, node<"next", leaf<"obs">, non_tensor<"name">>, leaf<"reward">, non_tensor<"task">>>);
static_assert(unflatten_order_v<flat_step> == std::array<std::size_t, 3>{0, 1, 2});
static_assert(unflatten_non_tensor_order_v<flat_step> == std::array<std::size_t, 2>{1, 0});
static_assert(is_sub_schema_v<schema<non_tensor<"task">>, step> && !is_sub_schema_v<schema<leaf<"task">>, step>);
static_assert(!is_sub_schema_v<schema<non_tensor<"obs">>, step> && !is_sub_schema_v<schema<non_tensor<"next">>, step>);
static_assert(tensordict::detail::embedding<schema<node<"next", non_tensor<"name">>, non_tensor<"task">>, step>::non_tensors ==
              std::array<std::size_t, 2>{1, 0});
static_assert(tensordict::detail::select_impl<step, "next", "task">::non_tensors == std::array<std::size_t, 2>{1, 0});
}  // namespace schema_assertions
