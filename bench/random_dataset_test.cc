// The random dataset on the tiny Qwen3-Next tokenizer of the shared test data: prompts re-encode to
// exactly the lengths drawn, lengths stay in vLLM's ranges, no special or added token appears,
// and a seed gives the same prompts every time.
#include "bench/random_dataset.h"
#include "core/test_paths.h"

#include <gtest/gtest.h>

#include <set>

namespace moeserve::bench {
namespace {

using tokenizer::Tokenizer;

const Tokenizer& Tok() {
  static const Tokenizer* tok = [] {
    Result<std::unique_ptr<Tokenizer>> t =
        Tokenizer::LoadFromDir(std::string(MOESERVE_TESTDATA_DIR) + "/tiny-qwen3next");
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? t->release() : nullptr;
  }();
  return *tok;
}

std::vector<int32_t> Ids(const std::string& text) {
  Result<std::vector<int32_t>> ids = Tok().Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

RandomDataset Sample(int64_t n, const RandomDatasetOptions& o) {
  Result<RandomDataset> d = SampleRandomDataset(Tok(), n, o);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? std::move(*d) : RandomDataset{};
}

TEST(RandomDatasetTest, LengthRangesAreVllms) {
  RandomDatasetOptions o;
  o.input_len = 100;
  o.output_len = 10;
  o.range_ratio = 0.25;
  Result<LengthRange> in = InputLengthRange(o, 0);
  ASSERT_TRUE(in.ok());
  EXPECT_EQ(in->low, 75);
  EXPECT_EQ(in->high, 125);
  // The ids the tokenizer adds (a BOS) come off the input length first.
  in = InputLengthRange(o, 1);
  EXPECT_EQ(in->low, 74);    // floor(99 * 0.75)
  EXPECT_EQ(in->high, 124);  // ceil(99 * 1.25)
  Result<LengthRange> out = OutputLengthRange(o);
  EXPECT_EQ(out->low, 7);    // floor(7.5)
  EXPECT_EQ(out->high, 13);  // ceil(12.5)
  o.output_len = 1;
  o.range_ratio = 0.9;
  out = OutputLengthRange(o);
  EXPECT_EQ(out->low, 1);  // never 0
  EXPECT_EQ(out->high, 2);

  o.range_ratio = 1.0;
  EXPECT_FALSE(InputLengthRange(o, 0).ok());
  o.range_ratio = 0;
  o.input_len = 1;
  EXPECT_FALSE(InputLengthRange(o, 1).ok());  // nothing left for the prompt
  o.prefix_len = 2;
  EXPECT_TRUE(InputLengthRange(o, 1).ok());  // the prefix alone is a prompt
  o.output_len = 0;
  EXPECT_FALSE(OutputLengthRange(o).ok());
}

TEST(RandomDatasetTest, ExactLengthsWithoutRangeRatio) {
  RandomDatasetOptions o;
  o.input_len = 64;
  o.output_len = 16;
  const RandomDataset d = Sample(20, o);
  ASSERT_EQ(d.requests.size(), 20u);
  EXPECT_EQ(d.token_mismatch, 0);
  for (const SampleRequest& r : d.requests) {
    EXPECT_EQ(r.prompt_len, 64);
    EXPECT_EQ(r.expected_output_len, 16);
    EXPECT_EQ(static_cast<int64_t>(Ids(r.prompt).size()), r.prompt_len);
  }
  // Request i starts at a random offset (+ i) into the allowed ids: the prompts differ, but for
  // the odd collision of two offsets in this small vocabulary.
  std::set<std::string> prompts;
  for (const SampleRequest& r : d.requests) prompts.insert(r.prompt);
  EXPECT_GE(prompts.size(), d.requests.size() - 3);
}

TEST(RandomDatasetTest, LengthsStayInTheRangeAndPromptsReencodeToThem) {
  RandomDatasetOptions o;
  o.input_len = 40;
  o.output_len = 10;
  o.range_ratio = 0.5;
  o.prefix_len = 7;
  o.seed = 11;
  const RandomDataset d = Sample(200, o);
  std::set<int64_t> outputs;
  for (const SampleRequest& r : d.requests) {
    EXPECT_GE(r.prompt_len, 7 + 20);
    EXPECT_LE(r.prompt_len, 7 + 60);
    EXPECT_GE(r.expected_output_len, 5);
    EXPECT_LE(r.expected_output_len, 15);
    outputs.insert(r.expected_output_len);
    EXPECT_EQ(static_cast<int64_t>(Ids(r.prompt).size()), r.prompt_len);
  }
  EXPECT_EQ(outputs.size(), 11u);  // 200 draws hit every length of [5, 15]
  // One prefix for every prompt.
  const std::vector<int32_t> first = Ids(d.requests[0].prompt);
  const std::vector<int32_t> second = Ids(d.requests[1].prompt);
  EXPECT_TRUE(std::equal(first.begin(), first.begin() + 5, second.begin()));
}

TEST(RandomDatasetTest, NoSpecialOrAddedTokens) {
  const std::vector<int32_t> allowed = AllowedTokenIds(Tok());
  // The tiny tokenizer: 509 BPE tokens (128 of them the bytes 0x80-0xff, parts of characters),
  // then <|endoftext|> <|im_start|> <|im_end|>.
  EXPECT_EQ(allowed.size(), 509u - 128u);
  EXPECT_TRUE(std::is_sorted(allowed.begin(), allowed.end()));
  RandomDatasetOptions o;
  o.input_len = 300;
  o.output_len = 4;
  o.range_ratio = 0.3;
  for (const SampleRequest& r : Sample(30, o).requests) {
    for (int32_t id : Ids(r.prompt)) {
      EXPECT_LT(id, 509);
      EXPECT_FALSE(Tok().IsSpecial(id));
    }
    EXPECT_EQ(r.prompt.find("<|"), std::string::npos);
  }
}

TEST(RandomDatasetTest, DeterministicPerSeed) {
  RandomDatasetOptions o;
  o.input_len = 32;
  o.output_len = 8;
  o.range_ratio = 0.5;
  o.prefix_len = 3;
  o.seed = 5;
  const RandomDataset a = Sample(10, o);
  const RandomDataset b = Sample(10, o);
  o.seed = 6;
  const RandomDataset c = Sample(10, o);
  bool all_same_as_c = true;
  for (size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].prompt, b.requests[i].prompt);
    EXPECT_EQ(a.requests[i].prompt_len, b.requests[i].prompt_len);
    EXPECT_EQ(a.requests[i].expected_output_len, b.requests[i].expected_output_len);
    all_same_as_c = all_same_as_c && a.requests[i].prompt == c.requests[i].prompt;
  }
  EXPECT_FALSE(all_same_as_c);
}

}  // namespace
}  // namespace moeserve::bench
