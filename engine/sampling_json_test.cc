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

}  // namespace
}  // namespace moeserve::engine
