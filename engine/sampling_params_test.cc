#include "engine/sampling_params.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "core/test_paths.h"

namespace moeserve::engine {
namespace {

constexpr int64_t kVocab = 100;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Case {
  const char* what;
  std::function<void(SamplingParams&)> set;
  const char* error_prefix;  // nullptr: valid
};

// Every rule of Validate, with values just inside and just outside each range.
const std::vector<Case>& Cases() {
  static const auto* cases = new std::vector<Case>{
      {"defaults", [](SamplingParams&) {}, nullptr},
      {"n 0", [](SamplingParams& p) { p.n = 0; }, "n must be at least 1"},
      {"n 16385", [](SamplingParams& p) { p.n = 16385; }, "n must be at most 16384"},
      {"n 16384", [](SamplingParams& p) { p.n = 16384; }, nullptr},
      {"n 2 greedy",
       [](SamplingParams& p) {
         p.n = 2;
         p.temperature = 0;
       },
       "n must be 1 when using greedy sampling"},
      // vLLM raises (0, 0.01) to 0.01 before deciding greediness: this one samples.
      {"n 2 tiny temperature",
       [](SamplingParams& p) {
         p.n = 2;
         p.temperature = 1e-6;
       },
       nullptr},
      {"temperature NaN", [](SamplingParams& p) { p.temperature = kNaN; }, "temperature"},
      {"temperature inf", [](SamplingParams& p) { p.temperature = kInf; }, "temperature"},
      {"temperature -0.1", [](SamplingParams& p) { p.temperature = -0.1; }, "temperature"},
      {"temperature 2.01", [](SamplingParams& p) { p.temperature = 2.01; }, "temperature"},
      {"temperature 2", [](SamplingParams& p) { p.temperature = 2; }, nullptr},
      {"temperature 0", [](SamplingParams& p) { p.temperature = 0; }, nullptr},
      {"top_p 0", [](SamplingParams& p) { p.top_p = 0; }, "top_p"},
      {"top_p 1.01", [](SamplingParams& p) { p.top_p = 1.01; }, "top_p"},
      {"top_p NaN", [](SamplingParams& p) { p.top_p = kNaN; }, "top_p"},
      {"top_p 1e-9", [](SamplingParams& p) { p.top_p = 1e-9; }, nullptr},
      {"top_k -2", [](SamplingParams& p) { p.top_k = -2; }, "top_k"},
      {"top_k -1", [](SamplingParams& p) { p.top_k = -1; }, nullptr},
      {"top_k huge", [](SamplingParams& p) { p.top_k = 1 << 30; }, nullptr},
      {"min_p -0.01", [](SamplingParams& p) { p.min_p = -0.01; }, "min_p"},
      {"min_p 1.01", [](SamplingParams& p) { p.min_p = 1.01; }, "min_p"},
      {"min_p NaN", [](SamplingParams& p) { p.min_p = kNaN; }, "min_p"},
      {"min_p 1", [](SamplingParams& p) { p.min_p = 1; }, nullptr},
      {"presence -2.01", [](SamplingParams& p) { p.presence_penalty = -2.01; }, "presence_penalty"},
      {"presence 2.01", [](SamplingParams& p) { p.presence_penalty = 2.01; }, "presence_penalty"},
      {"presence NaN", [](SamplingParams& p) { p.presence_penalty = kNaN; }, "presence_penalty"},
      {"presence -2", [](SamplingParams& p) { p.presence_penalty = -2; }, nullptr},
      {"frequency -2.01", [](SamplingParams& p) { p.frequency_penalty = -2.01; },
       "frequency_penalty"},
      {"frequency 2.01", [](SamplingParams& p) { p.frequency_penalty = 2.01; },
       "frequency_penalty"},
      {"frequency NaN", [](SamplingParams& p) { p.frequency_penalty = kNaN; }, "frequency_penalty"},
      {"frequency 2", [](SamplingParams& p) { p.frequency_penalty = 2; }, nullptr},
      {"repetition 0", [](SamplingParams& p) { p.repetition_penalty = 0; }, "repetition_penalty"},
      {"repetition -1", [](SamplingParams& p) { p.repetition_penalty = -1; }, "repetition_penalty"},
      {"repetition inf", [](SamplingParams& p) { p.repetition_penalty = kInf; },
       "repetition_penalty"},
      {"repetition NaN", [](SamplingParams& p) { p.repetition_penalty = kNaN; },
       "repetition_penalty"},
      {"repetition 50", [](SamplingParams& p) { p.repetition_penalty = 50; }, nullptr},
      {"max_tokens 0", [](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens"},
      {"max_tokens 1", [](SamplingParams& p) { p.max_tokens = 1; }, nullptr},
      {"min_tokens -1", [](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens"},
      {"min_tokens > max_tokens",
       [](SamplingParams& p) {
         p.max_tokens = 5;
         p.min_tokens = 6;
       },
       "min_tokens"},
      {"min_tokens == max_tokens",
       [](SamplingParams& p) {
         p.max_tokens = 5;
         p.min_tokens = 5;
       },
       nullptr},
      {"logprobs -2", [](SamplingParams& p) { p.logprobs = -2; }, "logprobs"},
      {"logprobs -1", [](SamplingParams& p) { p.logprobs = -1; }, nullptr},
      {"logprobs 0", [](SamplingParams& p) { p.logprobs = 0; }, nullptr},
      {"prompt_logprobs -2", [](SamplingParams& p) { p.prompt_logprobs = -2; }, "prompt_logprobs"},
      {"prompt_logprobs -1", [](SamplingParams& p) { p.prompt_logprobs = -1; }, nullptr},
      {"stop empty string",
       [](SamplingParams& p) {
         p.stop = {"a", ""};
       },
       "stop"},
      {"stop strings",
       [](SamplingParams& p) {
         p.stop = {"a", "\n"};
       },
       nullptr},
      {"bad_words empty string", [](SamplingParams& p) { p.bad_words = {""}; }, "bad_words"},
      {"stop_token_ids vocab",
       [](SamplingParams& p) {
         p.stop_token_ids = {1, kVocab};
       },
       "stop_token_ids"},
      {"stop_token_ids -1", [](SamplingParams& p) { p.stop_token_ids = {-1}; }, "stop_token_ids"},
      {"stop_token_ids last",
       [](SamplingParams& p) {
         p.stop_token_ids = {0, kVocab - 1};
       },
       nullptr},
      {"logit_bias vocab",
       [](SamplingParams& p) {
         p.logit_bias = {{kVocab, 1.0f}};
       },
       "logit_bias"},
      {"logit_bias -1",
       [](SamplingParams& p) {
         p.logit_bias = {{-1, 1.0f}};
       },
       "logit_bias"},
      {"logit_bias NaN",
       [](SamplingParams& p) {
         p.logit_bias = {{3, std::nanf("")}};
       },
       "logit_bias"},
      {"logit_bias huge (clamped later)",
       [](SamplingParams& p) {
         p.logit_bias = {{3, 1e30f}};
       },
       nullptr},
      {"allowed_token_ids empty", [](SamplingParams& p) { p.allowed_token_ids.emplace(); },
       "allowed_token_ids"},
      {"allowed_token_ids vocab",
       [](SamplingParams& p) {
         p.allowed_token_ids = {{2, kVocab}};
       },
       "allowed_token_ids"},
      {"allowed_token_ids -1", [](SamplingParams& p) { p.allowed_token_ids = {{-1}}; },
       "allowed_token_ids"},
      {"allowed_token_ids ok",
       [](SamplingParams& p) {
         p.allowed_token_ids = {{0, kVocab - 1}};
       },
       nullptr},
      {"bad_words_token_ids vocab",
       [](SamplingParams& p) {
         p.bad_words_token_ids = {{1, kVocab}};
       },
       "bad_words"},
      {"seed -1", [](SamplingParams& p) { p.seed = -1; }, nullptr},
      {"seed min", [](SamplingParams& p) { p.seed = std::numeric_limits<int64_t>::min(); },
       nullptr},
      {"seed max", [](SamplingParams& p) { p.seed = std::numeric_limits<int64_t>::max(); },
       nullptr},
  };
  return *cases;
}

TEST(SamplingParamsTest, ValidateEveryRule) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.what);
    SamplingParams p;
    c.set(p);
    const Status s = p.Validate(kVocab);
    if (c.error_prefix == nullptr) {
      EXPECT_TRUE(s.ok()) << s.ToString();
      continue;
    }
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    // The message starts with the parameter's vLLM name.
    EXPECT_EQ(s.message().rfind(c.error_prefix, 0), 0u) << s.message();
  }
}

TEST(SamplingParamsTest, ValidateMessagesGiveTheValue) {
  SamplingParams p;
  p.temperature = 3;
  EXPECT_EQ(p.Validate(kVocab).message(), "temperature must be in [0, 2], got 3.");
  p = SamplingParams();
  p.stop_token_ids = {7, 250};
  EXPECT_NE(p.Validate(kVocab).message().find("250"), std::string::npos);
}

TEST(SamplingParamsTest, NormalizeSeed) {
  SamplingParams p;
  p.seed = -1;
  p.Normalize();
  EXPECT_FALSE(p.seed.has_value());
  p.seed = 42;
  p.Normalize();
  EXPECT_EQ(p.seed, 42);
}

TEST(SamplingParamsTest, NormalizeGreedyResetsFilters) {
  SamplingParams p;
  p.temperature = 0;
  p.top_p = 0.5;
  p.top_k = 7;
  p.min_p = 0.3;
  p.Normalize();
  EXPECT_TRUE(p.greedy());
  EXPECT_EQ(p.top_p, 1.0);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_EQ(p.min_p, 0.0);
}

TEST(SamplingParamsTest, NormalizeRaisesTinyTemperature) {
  SamplingParams p;
  p.temperature = 1e-6;  // below kSamplingEps, but raised first as in vLLM: not greedy
  p.top_p = 0.5;
  p.Normalize();
  EXPECT_EQ(p.temperature, 0.01);
  EXPECT_FALSE(p.greedy());
  EXPECT_EQ(p.top_p, 0.5);

  p.temperature = 0.005;
  p.Normalize();
  EXPECT_EQ(p.temperature, 0.01);
  p.temperature = 0.02;
  p.Normalize();
  EXPECT_EQ(p.temperature, 0.02);
}

TEST(SamplingParamsTest, NormalizeTopKMinusOne) {
  SamplingParams p;
  p.top_k = -1;
  p.Normalize();
  EXPECT_EQ(p.top_k, 0);
  p.top_k = 5;
  p.Normalize();
  EXPECT_EQ(p.top_k, 5);
}

TEST(SamplingParamsTest, NormalizeLogitBiasClampsAndKeepsLastPerToken) {
  SamplingParams p;
  p.logit_bias = {{3, 1000.0f}, {4, -1000.0f}, {5, 2.5f}, {3, 7.0f}};
  p.Normalize();
  const std::vector<std::pair<int32_t, float>> want = {{4, -100.0f}, {5, 2.5f}, {3, 7.0f}};
  EXPECT_EQ(p.logit_bias, want);
  p.logit_bias = {{1, std::numeric_limits<float>::infinity()}};
  p.Normalize();
  EXPECT_EQ(p.logit_bias[0].second, 100.0f);
}

TEST(SamplingParamsTest, NormalizeDeduplicatesStopTokenIdsAndBadWords) {
  SamplingParams p;
  p.stop_token_ids = {5, 3, 5, 9, 3};
  p.bad_words = {"x", "y", "x"};
  p.Normalize();
  EXPECT_EQ(p.stop_token_ids, (std::vector<int32_t>{5, 3, 9}));
  EXPECT_EQ(p.bad_words, (std::vector<std::string>{"x", "y"}));
}

TEST(SamplingParamsTest, NormalizeIsIdempotent) {
  SamplingParams p;
  p.temperature = 0.003;
  p.top_k = -1;
  p.seed = -1;
  p.logit_bias = {{1, 300.0f}, {1, -300.0f}};
  p.stop_token_ids = {2, 2};
  p.Normalize();
  SamplingParams q = p;
  q.Normalize();
  EXPECT_EQ(q.temperature, p.temperature);
  EXPECT_EQ(q.top_k, p.top_k);
  EXPECT_EQ(q.seed, p.seed);
  EXPECT_EQ(q.logit_bias, p.logit_bias);
  EXPECT_EQ(q.stop_token_ids, p.stop_token_ids);
  EXPECT_EQ(p.logit_bias, (std::vector<std::pair<int32_t, float>>{{1, -100.0f}}));
}

// ResolveBadWords on the tiny Qwen3-Next tokenizer (509 BPE tokens + 3 added). Its token ids, by
// Encode: "a" [97], " a" [257], "ax" [97 120], " ax" [257 120], "the" [116 104 101],
// " the" [260], "<|im_end|>" [511], " <|im_end|>" [32 511].
class BadWordsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto loaded = tokenizer::Tokenizer::LoadFromDir(MOESERVE_TESTDATA_DIR + "/tiny-qwen3next");
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    tokenizer_ = std::move(loaded).value().release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }

  std::vector<int32_t> Encode(const std::string& text) {
    auto ids = tokenizer_->Encode(text);
    EXPECT_TRUE(ids.ok());
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }

  Result<std::vector<std::vector<int32_t>>> Resolve(std::vector<std::string> words) {
    SamplingParams p;
    p.bad_words = std::move(words);
    p.bad_words_token_ids = {{1, 2, 3}};  // stale: must be replaced
    RETURN_IF_ERROR(ResolveBadWords(p, *tokenizer_));
    return p.bad_words_token_ids;
  }

  static tokenizer::Tokenizer* tokenizer_;
};
tokenizer::Tokenizer* BadWordsTest::tokenizer_ = nullptr;

using Seqs = std::vector<std::vector<int32_t>>;

TEST_F(BadWordsTest, GoldenEncodings) {
  // The premises of the tests below.
  EXPECT_EQ(Encode("a"), (std::vector<int32_t>{97}));
  EXPECT_EQ(Encode(" a"), (std::vector<int32_t>{257}));
  EXPECT_EQ(Encode("ax"), (std::vector<int32_t>{97, 120}));
  EXPECT_EQ(Encode(" ax"), (std::vector<int32_t>{257, 120}));
  EXPECT_EQ(Encode("the"), (std::vector<int32_t>{116, 104, 101}));
  EXPECT_EQ(Encode(" the"), (std::vector<int32_t>{260}));
  EXPECT_EQ(Encode("<|im_end|>"), (std::vector<int32_t>{511}));
}

TEST_F(BadWordsTest, PlainAndSpacedWhenTheSpaceMergesIntoTheFirstToken) {
  auto r = Resolve({"a"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, (Seqs{{97}, {257}}));
  r = Resolve({"ax"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (Seqs{{97, 120}, {257, 120}}));
}

TEST_F(BadWordsTest, SpacedFormOfAnotherLengthIsDropped) {
  // vLLM keeps the spaced form only when it has as many tokens as the plain one.
  auto r = Resolve({"the"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (Seqs{{116, 104, 101}}));
  r = Resolve({"<|im_end|>"});  // added tokens are matched in the text, as Hugging Face does
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (Seqs{{511}}));
}

TEST_F(BadWordsTest, LeadingWhitespaceIsStrippedAndRepeatsMerged) {
  auto r = Resolve({"  ax", "\tax", "a", "ax", "a"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (Seqs{{97, 120}, {257, 120}, {97}, {257}}));
}

TEST_F(BadWordsTest, AgreesWithEncodeOnManyWords) {
  // Every sequence is the encoding of the stripped word or of " " + it, the plain one is always
  // there, and the spaced one exactly when vLLM's rule keeps it.
  const std::vector<std::string> words = {"hello", "Hello world", "ea",   "ex",  "and",
                                          ",",     "The",         "in",   "e",   "ab",
                                          "a b",   "x1",          "über", "日本"};
  for (const std::string& w : words) {
    SCOPED_TRACE(w);
    auto r = Resolve({w});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const std::vector<int32_t> plain = Encode(w);
    const std::vector<int32_t> spaced = Encode(" " + w);
    Seqs want = {plain};
    if (spaced[0] != plain[0] && spaced.size() == plain.size()) want.push_back(spaced);
    EXPECT_EQ(*r, want);
  }
}

TEST_F(BadWordsTest, WhitespaceOnlyWordIsAnError) {
  auto r = Resolve({"ax", "   "});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("bad_words", 0), 0u) << r.status().message();
}

TEST_F(BadWordsTest, InvalidUtf8IsAnError) {
  auto r = Resolve({"a\xff"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("bad_words", 0), 0u) << r.status().message();
}

TEST_F(BadWordsTest, AtMost128Sequences) {
  std::vector<std::string> words;
  for (int i = 0; i < 64; ++i) words.push_back(fmt::format("a{}", i));  // [97, digits...]
  auto r = Resolve(words);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const size_t n = r->size();
  ASSERT_LE(n, 128u);
  // Pad with words of one sequence each until the limit, then one more.
  for (int i = 0; words.size() < 400; ++i) {
    words.push_back(fmt::format("the{}", i));
    r = Resolve(words);
    if (!r.ok()) break;
    ASSERT_LE(r->size(), 128u);
  }
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("bad_words", 0), 0u) << r.status().message();
  EXPECT_NE(r.status().message().find("128"), std::string::npos);
}

TEST_F(BadWordsTest, NoBadWordsLeavesNothing) {
  auto r = Resolve({});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->empty());
}

TEST_F(BadWordsTest, ResolvedIdsPassValidate) {
  SamplingParams p;
  p.bad_words = {"ax", "<|im_end|>"};
  ASSERT_TRUE(ResolveBadWords(p, *tokenizer_).ok());
  EXPECT_TRUE(p.Validate(512).ok());
  EXPECT_FALSE(p.Validate(500).ok());  // 511 is outside a 500-token model
}

}  // namespace
}  // namespace moeserve::engine
