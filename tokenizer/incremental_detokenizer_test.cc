#include "tokenizer/incremental_detokenizer.h"

#include <gtest/gtest.h>

#include <random>

#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_test_data.h"
#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {
namespace {

using testing::Qwen3;

// Every id sequence of the goldens: the encode cases and the rendered chats.
std::vector<std::pair<std::string, std::vector<int32_t>>> AllIdSequences() {
  std::vector<std::pair<std::string, std::vector<int32_t>>> all;
  for (const testing::EncodeCase& c : testing::EncodeCases()) all.emplace_back(c.id, c.ids);
  for (const testing::ChatCase& c : testing::ChatCases()) all.emplace_back(c.id, c.ids);
  return all;
}

DetokenizerOptions Options(bool skip_special_tokens, std::vector<std::string> stop = {},
                           bool include_stop_str_in_output = false) {
  DetokenizerOptions options;
  options.skip_special_tokens = skip_special_tokens;
  options.stop = std::make_shared<const std::vector<std::string>>(std::move(stop));
  options.include_stop_str_in_output = include_stop_str_in_output;
  return options;
}

std::vector<int32_t> Encode(std::string_view text) {
  Result<std::vector<int32_t>> ids = Qwen3().Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

// Feeding one id at a time puts a split point between every two tokens.
TEST(IncrementalDetokenizerTest, OneIdAtATimeEqualsTheFullDecode) {
  const auto sequences = AllIdSequences();
  ASSERT_EQ(sequences.size(), 148u);
  for (const bool skip : {false, true}) {
    for (const auto& [name, ids] : sequences) {
      SCOPED_TRACE(name + (skip ? " (skip special)" : ""));
      IncrementalDetokenizer detok(Qwen3(), Options(skip));
      std::string text;
      for (const int32_t id : ids) {
        const std::string piece = detok.Add(id);
        // Only complete characters come out.
        EXPECT_EQ(FindInvalidUtf8(piece), std::string::npos);
        text += piece;
      }
      text += detok.Flush();
      EXPECT_EQ(text, Qwen3().Decode(ids, skip));
      EXPECT_FALSE(detok.stopped());
    }
  }
}

TEST(IncrementalDetokenizerTest, RandomChunksEqualTheFullDecode) {
  std::mt19937 rng(7);
  for (const auto& [name, ids] : AllIdSequences()) {
    SCOPED_TRACE(name);
    IncrementalDetokenizer detok(Qwen3(), Options(false));
    std::string text;
    size_t i = 0;
    while (i < ids.size()) {
      const size_t n = std::min<size_t>(ids.size() - i, rng() % 5);
      text += detok.Add(std::span<const int32_t>(ids.data() + i, n));
      i += n;
    }
    text += detok.Flush();
    EXPECT_EQ(text, Qwen3().Decode(ids));
  }
}

// The id of the token that is byte b alone.
int32_t ByteId(uint8_t b) {
  return *Qwen3().TokenToId(BytesToByteLevel(std::string(1, static_cast<char>(b))));
}

TEST(IncrementalDetokenizerTest, HoldsBackCharactersSplitAcrossTokens) {
  IncrementalDetokenizer detok(Qwen3(), Options(false));
  // 😀 = F0 9F 98 80, fed byte token by byte token.
  EXPECT_EQ(detok.Add(ByteId(0xF0)), "");
  EXPECT_EQ(detok.Add(ByteId(0x9F)), "");
  EXPECT_EQ(detok.Add(ByteId(0x98)), "");
  EXPECT_EQ(detok.Add(ByteId(0x80)), "\xF0\x9F\x98\x80");
  // An invalid byte is final at once.
  EXPECT_EQ(detok.Add(ByteId(0xFF)), kReplacementChar);
  // A partial character cut off by a complete one: one U+FFFD, then the character.
  EXPECT_EQ(detok.Add(ByteId(0xE2)), "");
  EXPECT_EQ(detok.Add(ByteId('a')), std::string(kReplacementChar) + "a");
  // A dangling partial character at the end becomes U+FFFD, as in the full decode.
  EXPECT_EQ(detok.Add(ByteId(0xE2)), "");
  EXPECT_EQ(detok.Add(ByteId(0x82)), "");
  EXPECT_EQ(detok.Flush(), kReplacementChar);
  EXPECT_EQ(Qwen3().Decode(std::vector<int32_t>{ByteId(0xE2), ByteId(0x82)}), kReplacementChar);
  // Flush ends the stream.
  EXPECT_EQ(detok.Add(ByteId('b')), "");
  EXPECT_EQ(detok.Flush(), "");
}

TEST(IncrementalDetokenizerTest, SkippedSpecialTokensDoNotSplitCharacters) {
  // With skip_special_tokens the bytes on both sides of a special token join, as in Decode.
  const std::vector<int32_t> ids = {ByteId(0xE4), ByteId(0xB8), *Qwen3().TokenToId("<|im_end|>"),
                                    ByteId(0xAD)};
  for (const bool skip : {false, true}) {
    IncrementalDetokenizer detok(Qwen3(), Options(skip));
    std::string text = detok.Add(ids);
    text += detok.Flush();
    EXPECT_EQ(text, Qwen3().Decode(ids, skip));
  }
  EXPECT_EQ(Qwen3().Decode(ids, true), "\xE4\xB8\xAD");  // 中
}

// Runs ids through a detokenizer one at a time; returns every piece.
std::vector<std::string> Stream(IncrementalDetokenizer& detok, const std::vector<int32_t>& ids) {
  std::vector<std::string> pieces;
  for (const int32_t id : ids) pieces.push_back(detok.Add(id));
  pieces.push_back(detok.Flush());
  return pieces;
}

std::string Join(const std::vector<std::string>& pieces) {
  std::string all;
  for (const std::string& p : pieces) all += p;
  return all;
}

TEST(IncrementalDetokenizerTest, StopStringSpanningTokens) {
  const std::vector<int32_t> ids = Encode("Hello world, this is a test. More text.");
  ASSERT_GT(ids.size(), 8u);
  for (const bool include : {false, true}) {
    SCOPED_TRACE(include);
    IncrementalDetokenizer detok(Qwen3(), Options(false, {"is a test"}, include));
    const std::string text = Join(Stream(detok, ids));
    EXPECT_EQ(text, include ? "Hello world, this is a test" : "Hello world, this ");
    EXPECT_TRUE(detok.stopped());
    EXPECT_EQ(detok.stop_index(), 0);
  }
}

// The stop token that ends generation adds no text unless include_stop_str_in_output (vLLM).
TEST(IncrementalDetokenizerTest, StopTokenTextLeftOut) {
  const std::vector<int32_t> ids = Encode("Hello world, this");
  ASSERT_GE(ids.size(), 3u);
  const std::vector<int32_t> all_but_last(ids.begin(), ids.end() - 1);
  for (const bool include : {false, true}) {
    SCOPED_TRACE(include);
    IncrementalDetokenizer detok(Qwen3(), Options(false, {}, include));
    std::string text;
    for (size_t i = 0; i < ids.size(); ++i) text += detok.Add(ids[i], i + 1 == ids.size());
    text += detok.Flush();
    EXPECT_EQ(text, include ? Qwen3().Decode(ids) : Qwen3().Decode(all_but_last));
  }
}

// vLLM's min_tokens: a stop string ending within the first min_tokens ids' text does not count;
// one that starts there and ends later does.
TEST(IncrementalDetokenizerTest, NoStopWithinMinTokens) {
  const std::string text = "Hello world, hello world again";
  const std::vector<int32_t> ids = Encode(text);
  size_t first_world_ids = 0;  // ids up to and including the first " world"
  while (Qwen3().Decode(std::span(ids.data(), first_world_ids)).find("world") == std::string::npos)
    ++first_world_ids;
  const auto run = [&](std::vector<std::string> stop, int64_t min_tokens) {
    DetokenizerOptions options = Options(false, std::move(stop));
    options.min_tokens = min_tokens;
    IncrementalDetokenizer detok(Qwen3(), options);
    std::string out;
    for (const int32_t id : ids) out += detok.Add(id);
    return out + detok.Flush();
  };
  EXPECT_EQ(run({"world"}, 0), "Hello ");
  EXPECT_EQ(run({"world"}, static_cast<int64_t>(first_world_ids - 1)), "Hello ");
  EXPECT_EQ(run({"world"}, static_cast<int64_t>(first_world_ids)), "Hello world, hello ");
  EXPECT_EQ(run({"world"}, static_cast<int64_t>(ids.size())), text);
  // "world, h" starts inside the min_tokens text and ends after it.
  EXPECT_EQ(run({"world, h"}, static_cast<int64_t>(first_world_ids)), "Hello ");
}

TEST(IncrementalDetokenizerTest, TextThatMayStartAStopStringIsHeldBack) {
  // Tokens: "Hello", " world", "," ...
  IncrementalDetokenizer detok(Qwen3(), Options(false, {"world!"}));
  EXPECT_EQ(detok.Add(*Qwen3().TokenToId("Hello")), "Hello");
  EXPECT_EQ(detok.Add(*Qwen3().TokenToId("Ġwor")), " ");  // "wor" could become "world!"
  EXPECT_EQ(detok.Add(*Qwen3().TokenToId("ld")), "");     // "world" still could
  EXPECT_EQ(detok.Add(*Qwen3().TokenToId(",")), "world,");
  EXPECT_EQ(detok.Add(*Qwen3().TokenToId("Ġwor")), " ");
  EXPECT_EQ(detok.Flush(), "wor");  // the stream ended before any stop string completed
  EXPECT_FALSE(detok.stopped());
}

TEST(IncrementalDetokenizerTest, EarliestCompletingStopStringWins) {
  // Several stop strings complete in the same text: the one that ends first wins.
  const std::vector<int32_t> ids = Encode("xx abcdef");
  IncrementalDetokenizer detok(Qwen3(), Options(false, {"bcdef", "cd", "abc"}));
  EXPECT_EQ(Join(Stream(detok, ids)), "xx ");
  EXPECT_EQ(detok.stop_index(), 2);  // "abc" ends before "cd" and "bcdef" do
  IncrementalDetokenizer same_end(Qwen3(), Options(false, {"def", "bcdef"}));
  Join(Stream(same_end, ids));
  EXPECT_EQ(same_end.stop_index(), 1);  // both end at 'f': the longer one
}

TEST(IncrementalDetokenizerTest, StopAtTheStartAndOnSpecialTokens) {
  IncrementalDetokenizer at_start(Qwen3(), Options(false, {"Hello"}, true));
  EXPECT_EQ(Join(Stream(at_start, Encode("Hello there"))), "Hello");
  // A stop string can be the text of a special token (when it is not skipped).
  const std::vector<int32_t> ids = Encode("answer<|im_end|>ignored");
  IncrementalDetokenizer special(Qwen3(), Options(false, {"<|im_end|>"}));
  EXPECT_EQ(Join(Stream(special, ids)), "answer");
  IncrementalDetokenizer skipping(Qwen3(), Options(true, {"<|im_end|>"}));
  EXPECT_EQ(Join(Stream(skipping, ids)), "answerignored");
  EXPECT_FALSE(skipping.stopped());
}

TEST(IncrementalDetokenizerTest, NothingAfterTheStop) {
  IncrementalDetokenizer detok(Qwen3(), Options(false, {"."}));
  const std::vector<std::string> pieces = Stream(detok, Encode("One. Two. Three."));
  EXPECT_EQ(Join(pieces), "One");
  EXPECT_EQ(pieces.back(), "");
  EXPECT_EQ(detok.Add(*Qwen3().TokenToId("Hello")), "");
}

TEST(IncrementalDetokenizerTest, StopStringsOverEveryGoldenAtEverySplit) {
  // The streamed text with a stop string equals the full decode cut at its first completion.
  for (const auto& [name, ids] : AllIdSequences()) {
    const std::string full = Qwen3().Decode(ids);
    if (full.size() < 6) continue;
    const std::string stop = full.substr(full.size() / 2, 3);
    if (FindInvalidUtf8(stop) != std::string::npos) continue;
    SCOPED_TRACE(name);
    IncrementalDetokenizer detok(Qwen3(), Options(false, {stop}));
    const std::string text = Join(Stream(detok, ids));
    EXPECT_TRUE(detok.stopped());
    EXPECT_EQ(text, full.substr(0, full.find(stop)));
  }
}

}  // namespace
}  // namespace moeserve::tokenizer
