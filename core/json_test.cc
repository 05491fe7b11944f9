#include "core/json.h"

#include <gtest/gtest.h>

#include <string>

namespace moeserve {
namespace {

std::string Nested(int depth, char open, char close) {
  return std::string(depth, open) + std::string(depth, close);
}

TEST(JsonNestingDepthTest, CountsArraysAndObjects) {
  EXPECT_EQ(JsonNestingDepth("1"), 0);
  EXPECT_EQ(JsonNestingDepth("[]"), 1);
  EXPECT_EQ(JsonNestingDepth(R"({"a": [1, {"b": [[]]}], "c": {}})"), 5);
  EXPECT_EQ(JsonNestingDepth(Nested(200000, '[', ']')), 200000);
}

TEST(JsonNestingDepthTest, IgnoresBracketsInStrings) {
  EXPECT_EQ(JsonNestingDepth(R"(["[[[[{{{{", "\"[[[["])"), 1);
  EXPECT_EQ(JsonNestingDepth(R"(["\\", [[]]])"), 3);  // an escaped backslash ends no string
}

TEST(JsonNestingDepthTest, UnbalancedClosersCannotHideDepth) {
  EXPECT_EQ(JsonNestingDepth("]]]]]]" + std::string(10, '[')), 10);
}

TEST(ParseJsonTest, ParsesWithinTheLimit) {
  Result<nlohmann::json> j = ParseJson(Nested(kMaxJsonDepth, '[', ']'), "body");
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  Result<nlohmann::ordered_json> o = ParseJson<nlohmann::ordered_json>(R"({"b": 1, "a": 2})", "x");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->dump(), R"({"b":1,"a":2})");  // order kept
}

TEST(ParseJsonTest, RefusesDeepNestingNamingIt) {
  Result<nlohmann::json> j = ParseJson(Nested(kMaxJsonDepth + 1, '[', ']'), "the request body");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(j.status().message(), "the request body: nests deeper than 128 levels (found 129)");
  // 200,000 levels of objects and arrays mixed, as an attacker sends them.
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += R"({"a":[)";
  EXPECT_FALSE(ParseJson(deep, "x").ok());
}

TEST(ParseJsonTest, InvalidJsonNamesWhat) {
  Result<nlohmann::json> j = ParseJson("{\"a\": ", "config.json");
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("config.json: not valid JSON: "), std::string::npos)
      << j.status().message();
  // No name: the caller adds its context.
  EXPECT_EQ(ParseJson("[", "").status().message().rfind("not valid JSON: ", 0), 0u);
  EXPECT_FALSE(ParseJson("", "x").ok());
  EXPECT_FALSE(ParseJson("[1] trailing", "x").ok());
}

}  // namespace
}  // namespace moeserve
