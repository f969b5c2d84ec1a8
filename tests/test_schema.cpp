#include <sstream>

#include "catch_torch.hpp"

#include "schema_assertions.hpp"

using namespace tensordict;
using schema_assertions::deep;
using schema_assertions::mlp;

TEST_CASE("key paths print as Python spells them", "[schema]") {
  std::ostringstream os;
  os << leaf_path<deep>(5);
  CHECK(os.str() == R"(("deep", "er", "x"))");
  CHECK(to_string(leaf_path<deep>(4)) == R"("scale")");
  CHECK(leaf_path<deep>(5).join(".") == "deep.er.x");
  CHECK(key_path_t<"0", "weight">::describe() == R"(("0", "weight"))");
}

TEST_CASE("leaf paths list every leaf in declaration order", "[schema]") {
  std::vector<std::string> joined;
  for (std::size_t i = 0; i < leaf_count_v<mlp>; ++i) joined.push_back(leaf_path<mlp>(i).join("."));
  CHECK(joined == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  CHECK(leaf_path<mlp>(1) == leaf_path<schema<node<"0", leaf<"weight">, leaf<"bias">>>>(1));
  CHECK(!(leaf_path<mlp>(0) == leaf_path<mlp>(1)));
}

TEST_CASE("node tables give every node its parent", "[schema]") {
  const auto& parents = tensordict::detail::node_parents_of<deep>::value;
  // root, "0", "2", "deep", ("deep", "er")
  CHECK(parents[0] == npos);
  CHECK(parents[1] == 0);
  CHECK(parents[2] == 0);
  CHECK(parents[3] == 0);
  CHECK(parents[4] == 3);
  CHECK(leaf_paths_v<deep>[5].parent_node == 4);
}
