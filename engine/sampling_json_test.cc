// The JSON codec of SamplingParams: each key sets its field, null keeps the caller's default,
// types are checked (ranges are Validate's), unknown keys are left to the caller.
#include "engine/sampling_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace moeserve::engine {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

// Applies one key to `p`; the key must be a sampling key.
Status Apply(std::string_view key, const json& value, SamplingParams& p) {
  bool known = false;
  Status status = ApplySamplingKey(key, value, p, &known);
  EXPECT_TRUE(known) << key;
  return status;
}

TEST(SamplingJsonTest, EachKeySetsItsField) {
  SamplingParams p;
  ASSERT_TRUE(Apply("n", 2, p).ok());
  ASSERT_TRUE(Apply("temperature", 0.5, p).ok());
  ASSERT_TRUE(Apply("top_p", 1, p).ok());  // a number field takes an integer too
  ASSERT_TRUE(Apply("top_k", 40, p).ok());
  ASSERT_TRUE(Apply("max_tokens", 7, p).ok());
  ASSERT_TRUE(Apply("ignore_eos", true, p).ok());
  ASSERT_TRUE(Apply("stop_token_ids", json::array({3, 5}), p).ok());
  ASSERT_TRUE(Apply("logit_bias", json{{"12", 2.5}, {"7", -1}}, p).ok());
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(p.temperature, 0.5);
  EXPECT_EQ(p.top_p, 1.0);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_THAT(p.stop_token_ids, ElementsAre(3, 5));
  // nlohmann's json object keeps its keys sorted: "12" before "7".
  EXPECT_THAT(p.logit_bias, ElementsAre(Pair(12, 2.5f), Pair(7, -1.0f)));
}

TEST(SamplingJsonTest, NullKeepsTheDefault) {
  SamplingParams p;
  p.temperature = 0.3;
  ASSERT_TRUE(Apply("temperature", nullptr, p).ok());
  EXPECT_EQ(p.temperature, 0.3);
}

TEST(SamplingJsonTest, SeedMinusOneIsNone) {
  SamplingParams p;
  ASSERT_TRUE(Apply("seed", 9, p).ok());
  EXPECT_EQ(p.seed, 9);
  ASSERT_TRUE(Apply("seed", -1, p).ok());
  EXPECT_FALSE(p.seed.has_value());
}

TEST(SamplingJsonTest, StopIsAStringOrAList) {
  SamplingParams p;
  ASSERT_TRUE(Apply("stop", "END", p).ok());
  EXPECT_THAT(p.stop, ElementsAre("END"));
  ASSERT_TRUE(Apply("stop", json::array({"a", "b"}), p).ok());
  EXPECT_THAT(p.stop, ElementsAre("a", "b"));
}

TEST(SamplingJsonTest, WrongTypesNameTheKey) {
  const std::vector<std::pair<std::pair<const char*, json>, const char*>> cases = {
      {{"top_k", 2.0}, "\"top_k\" must be an integer"},
      {{"temperature", "hot"}, "\"temperature\" must be a number"},
      {{"ignore_eos", 1}, "\"ignore_eos\" must be true or false"},
      {{"stop", 3}, "\"stop\" must be a string or a list of strings"},
      {{"stop", json::array({"a", 1})}, "\"stop\": 1 is not a string"},
      {{"stop_token_ids", json::array({1.5})}, "\"stop_token_ids\": 1.5 is not an integer"},
      {{"stop_token_ids", json::array({int64_t{1} << 40})}, "is not a token id"},
      {{"logit_bias", json::array()}, "\"logit_bias\" must be an object"},
      {{"logit_bias", json{{"x", 1}}}, "\"logit_bias\": key \"x\" is not a token id"},
      {{"logit_bias", json{{"3", "up"}}}, "the bias of token 3 must be a number"},
      {{"max_tokens", json(uint64_t{1} << 63)}, "\"max_tokens\": 9223372036854775808 is too large"},
  };
  for (const auto& [input, message] : cases) {
    SamplingParams p;
    const Status status = Apply(input.first, input.second, p);
    EXPECT_FALSE(status.ok()) << input.first << " = " << input.second.dump();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr(message));
  }
}

TEST(SamplingJsonTest, UnknownKeyIsLeftToTheCaller) {
  SamplingParams p;
  p.temperature = 0.3;
  bool known = true;
  ASSERT_TRUE(ApplySamplingKey("messages", "not a number", p, &known).ok());
  EXPECT_FALSE(known);
  EXPECT_EQ(p.temperature, 0.3);
}

TEST(SamplingJsonTest, SamplingKeysListsEveryKeyOnce) {
  const std::span<const std::string_view> keys = SamplingKeys();
  EXPECT_EQ(keys.front(), "n");
  for (std::string_view key : keys) {
    EXPECT_EQ(std::count(keys.begin(), keys.end(), key), 1) << key;
    SamplingParams p;
    bool known = false;
    ASSERT_TRUE(ApplySamplingKey(key, nullptr, p, &known).ok());
    EXPECT_TRUE(known) << key;
  }
}

// ---- Structured output ----

using Kind = structured::GrammarSpec::Kind;

TEST(SamplingJsonTest, EveryStructuredKeySetsTheSpec) {
  const json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  struct Case {
    std::string_view key;
    json value;
    Kind kind;
    std::string text;
    std::vector<std::string> choices;
  };
  const Case cases[] = {
      {"guided_json", schema, Kind::kJsonSchema, schema.dump(), {}},
      {"guided_json", schema.dump(), Kind::kJsonSchema, schema.dump(), {}},
      {"guided_regex", "[a-z]+", Kind::kRegex, "[a-z]+", {}},
      {"guided_choice", json::array({"yes", "no"}), Kind::kChoice, "", {"yes", "no"}},
      {"guided_grammar", "root ::= \"a\"", Kind::kGrammar, "root ::= \"a\"", {}},
      {"structured_outputs", {{"json", schema}}, Kind::kJsonSchema, schema.dump(), {}},
      {"structured_outputs", {{"regex", "x+"}, {"backend", "auto"}}, Kind::kRegex, "x+", {}},
      {"structured_outputs", {{"choice", {"a"}}}, Kind::kChoice, "", {"a"}},
      {"structured_outputs", {{"grammar", "root ::= [0-9]"}}, Kind::kGrammar, "root ::= [0-9]", {}},
      {"structured_outputs", {{"json_object", true}}, Kind::kJsonObject, "", {}},
      {"response_format", {{"type", "json_object"}}, Kind::kJsonObject, "", {}},
      {"response_format",
       {{"type", "json_schema"},
        {"json_schema", {{"name", "n"}, {"schema", schema}, {"strict", true}}}},
       Kind::kJsonSchema,
       schema.dump(),
       {}},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    ASSERT_TRUE(Apply(c.key, c.value, p).ok()) << c.key << " " << c.value.dump();
    ASSERT_TRUE(p.structured_outputs.has_value()) << c.key;
    EXPECT_EQ(p.structured_outputs->kind, c.kind) << c.key << " " << c.value.dump();
    EXPECT_EQ(p.structured_outputs->text, c.text) << c.key;
    EXPECT_EQ(p.structured_outputs->choices, c.choices) << c.key;
  }
  // Plain text asks for nothing, and takes back a default.
  SamplingParams p;
  p.structured_outputs = structured::GrammarSpec{Kind::kRegex, "a", {}};
  ASSERT_TRUE(Apply("response_format", {{"type", "text"}}, p).ok());
  EXPECT_FALSE(p.structured_outputs.has_value());
}

TEST(SamplingJsonTest, BadStructuredOutputNamesTheProblem) {
  const std::pair<std::string_view, json> cases[][1] = {
      {{"guided_json", 3}},
      {{"guided_regex", json::array()}},
      {{"guided_choice", json::array()}},
      {{"guided_choice", json::array({1})}},
      {{"guided_grammar", true}},
      {{"structured_outputs", "json"}},
      {{"structured_outputs", json::object()}},
      {{"structured_outputs", {{"regex", "a"}, {"choice", {"a"}}}}},
      {{"structured_outputs", {{"structural_tag", "{}"}}}},
      {{"structured_outputs", {{"whitespace_pattern", " *"}, {"regex", "a"}}}},
      {{"response_format", "json"}},
      {{"response_format", {{"type", "json_schema"}}}},
      {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}},
      {{"response_format", {{"type", "structural_tag"}}}},
  };
  for (const auto& [c] : cases) {
    SamplingParams p;
    const Status s = Apply(c.first, c.second, p);
    EXPECT_FALSE(s.ok()) << c.first << " " << c.second.dump();
    EXPECT_THAT(s.message(), HasSubstr(std::string(c.first))) << s.message();
  }
}

TEST(SamplingJsonTest, OneStructuredOutputPerRequest) {
  EXPECT_TRUE(CheckOneStructuredOutput({{"guided_regex", "a"}, {"prompt", "x"}}).ok());
  EXPECT_TRUE(CheckOneStructuredOutput({{"guided_regex", "a"},
                                        {"response_format", {{"type", "text"}}},
                                        {"guided_json", nullptr}})
                  .ok());
  const Status both = CheckOneStructuredOutput(
      {{"guided_regex", "a"}, {"response_format", {{"type", "json_object"}}}});
  ASSERT_FALSE(both.ok());
  EXPECT_THAT(both.message(), HasSubstr("guided_regex"));
  EXPECT_THAT(both.message(), HasSubstr("response_format"));
}

}  // namespace
}  // namespace moeserve::engine
