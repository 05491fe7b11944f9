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

TEST(RawJsonMemberTest, FindsTheValueAsWritten) {
  const std::string text =
      R"( {"a": 1, "s": {"z": [1, {"}": "]"}], "b": "x\"y", "a": null},
           "r": {"json_schema": {"schema": {"zeta": 1, "alpha": {}}}}} )";
  EXPECT_EQ(RawJsonMember(text, {"a"}), "1");
  EXPECT_EQ(RawJsonMember(text, {"s", "z"}), R"([1, {"}": "]"}])");
  EXPECT_EQ(RawJsonMember(text, {"s", "b"}), R"("x\"y")");
  EXPECT_EQ(RawJsonMember(text, {"s", "a"}), "null");
  EXPECT_EQ(RawJsonMember(text, {"r", "json_schema", "schema"}), R"({"zeta": 1, "alpha": {}})");
  EXPECT_EQ(RawJsonMember(text, {"missing"}), std::nullopt);
  EXPECT_EQ(RawJsonMember(text, {"a", "b"}), std::nullopt);  // 1 is not an object
  // The last of a key given twice, and a key in an escaped spelling.
  EXPECT_EQ(RawJsonMember(R"({"k": 1, "k": [2]})", {"k"}), "[2]");
  EXPECT_EQ(RawJsonMember(R"({"g\u0075ided_json": {"b": 1, "a": 2}})", {"guided_json"}),
            R"({"b": 1, "a": 2})");
  // What nlohmann::json parses the same.
  const nlohmann::json parsed = nlohmann::json::parse(text);
  EXPECT_EQ(nlohmann::json::parse(*RawJsonMember(text, {"s"})), parsed["s"]);
}

}  // namespace
}  // namespace moeserve
