// Tests for bpe_trainer.h and tokenizer_files.h (the files tokenizer.json is written from).
#include "tokenizer/bpe_trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_files.h"
#include "core/test_paths.h"

namespace moeserve::tokenizer {
namespace {

using Merges = std::vector<std::pair<std::string, std::string>>;

// A deterministic pseudo-random generator, so corpora are the same on every platform.
class Lcg {
 public:
  explicit Lcg(uint64_t seed) : state_(seed) {}
  uint32_t Next(uint32_t bound) {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state_ >> 33) % bound;
  }

 private:
  uint64_t state_;
};

// `count` lowercase words of 1..8 letters from a small alphabet, skewed so that some pairs are
// much more frequent than others, separated by single spaces.
std::string RandomWords(int count, uint64_t seed) {
  Lcg rng(seed);
  const std::string letters = "eeeettaaoinshrdlucmwfgypbvkjxqz";
  std::string text;
  for (int w = 0; w < count; ++w) {
    if (w > 0) text.push_back(' ');
    const uint32_t len = 1 + rng.Next(8);
    for (uint32_t k = 0; k < len; ++k) text.push_back(letters[rng.Next(letters.size())]);
  }
  return text;
}

// `count` words drawn from a lexicon of `lexicon_size` random words with a Zipf-like law, like
// natural text: frequent words and long repeated substrings give BPE many merges to learn.
std::string LexiconText(int count, int lexicon_size, uint64_t seed) {
  Lcg rng(seed);
  const std::string letters = "eeeettaaoinshrdlucmwfgypbvkjxqz";
  std::vector<std::string> lexicon(lexicon_size);
  for (std::string& word : lexicon) {
    const uint32_t len = 2 + rng.Next(9);
    for (uint32_t k = 0; k < len; ++k) word.push_back(letters[rng.Next(letters.size())]);
  }
  std::string text;
  for (int w = 0; w < count; ++w) {
    // The minimum of two uniform draws favours the first words of the lexicon.
    const uint32_t index = std::min(rng.Next(lexicon_size), rng.Next(lexicon_size));
    text += (w % 12 == 11) ? ".\n" : (w > 0 ? " " : "");
    text += lexicon[index];
  }
  return text;
}

// Mixed text touching every branch of the pre-tokenizer: contractions, punctuation, digits,
// newlines, runs of spaces, tabs, non-ASCII.
std::string MixedText(int repeats) {
  const std::string paragraph =
      "The quick brown fox doesn't jump over 1234 lazy dogs; it's 5.5 km away!\n"
      "  Indented line, with \"quotes\" and (parentheses)...\n\n"
      "\tTabbed: caf\xC3\xA9 na\xC3\xAFve \xE4\xB8\xAD\xE6\x96\x87 text -- more text?  Yes.\r\n"
      "We'll see: they've said I'm here, you'd know, we're done.   \n";
  std::string text;
  for (int i = 0; i < repeats; ++i) text += paragraph;
  return text;
}

// The obvious trainer the real one must agree with, for text made of lowercase words separated
// by single spaces (whose pre-tokenization is just "word", " word", " word", ...): recount every
// pair of every word for each merge.
Merges NaiveTrain(const std::string& text, size_t max_merges) {
  std::map<std::string, int64_t> word_counts;
  std::istringstream in(text);
  std::string word;
  bool first = true;
  for (; in >> word; first = false) ++word_counts[first ? word : " " + word];
  std::vector<std::pair<std::vector<std::string>, int64_t>> words;
  for (const auto& [w, count] : word_counts) {
    std::vector<std::string> symbols;
    for (const char c : w) symbols.push_back(BytesToByteLevel(std::string(1, c)));
    words.emplace_back(std::move(symbols), count);
  }
  Merges merges;
  while (merges.size() < max_merges) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (const auto& [symbols, count] : words) {
      for (size_t k = 0; k + 1 < symbols.size(); ++k) pairs[{symbols[k], symbols[k + 1]}] += count;
    }
    // std::map iterates pairs in lexicographic order, so the first best one wins ties.
    const std::pair<std::string, std::string>* best = nullptr;
    int64_t best_count = 0;
    for (const auto& [pair, count] : pairs) {
      if (count > best_count) {
        best = &pair;
        best_count = count;
      }
    }
    if (best == nullptr || best_count < 2) break;
    const auto [left, right] = *best;
    merges.emplace_back(left, right);
    for (auto& [symbols, count] : words) {
      std::vector<std::string> merged;
      for (size_t k = 0; k < symbols.size(); ++k) {
        if (k + 1 < symbols.size() && symbols[k] == left && symbols[k + 1] == right) {
          merged.push_back(left + right);
          ++k;
        } else {
          merged.push_back(symbols[k]);
        }
      }
      symbols = std::move(merged);
    }
  }
  return merges;
}

// The structural invariants of bpe_trainer.h.
void ExpectWellFormed(const BpeVocab& vocab) {
  ASSERT_GE(vocab.tokens.size(), 256u);
  ASSERT_EQ(vocab.tokens.size(), 256 + vocab.merges.size());
  std::map<std::string, size_t> ids;
  for (size_t id = 0; id < vocab.tokens.size(); ++id) {
    EXPECT_TRUE(ids.emplace(vocab.tokens[id], id).second) << "duplicate " << vocab.tokens[id];
    EXPECT_TRUE(ByteLevelToBytes(vocab.tokens[id]).has_value()) << vocab.tokens[id];
  }
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(vocab.tokens[b], BytesToByteLevel(std::string(1, static_cast<char>(b))));
  }
  for (size_t i = 0; i < vocab.merges.size(); ++i) {
    const auto& [left, right] = vocab.merges[i];
    const size_t new_id = 256 + i;
    ASSERT_TRUE(ids.contains(left)) << left;
    ASSERT_TRUE(ids.contains(right)) << right;
    EXPECT_LT(ids[left], new_id);
    EXPECT_LT(ids[right], new_id);
    EXPECT_EQ(left + right, vocab.tokens[new_id]);
  }
}

std::string Bytes(const std::string& token) { return ByteLevelToBytes(token).value(); }

TEST(BpeTrainerTest, ExactMergesOnATinyText) {
  // Words: "ab", " ab", " cd", " cd". (a,b), (c,d) and (Ġ,c) are seen twice, ties going to the
  // smallest pair ("Ġ" is U+0120, after ASCII); then (Ġ,cd) twice; (Ġ,ab) once, so it stops.
  const BpeVocab vocab = TrainByteLevelBpe("ab ab cd cd", 1000);
  ExpectWellFormed(vocab);
  const Merges expected = {{"a", "b"}, {"c", "d"}, {"\u0120", "cd"}};
  EXPECT_EQ(vocab.merges, expected);
  EXPECT_EQ(vocab.tokens.back(), "\u0120cd");
}

TEST(BpeTrainerTest, StopsWhenNoPairIsSeenTwice) {
  EXPECT_TRUE(TrainByteLevelBpe("", 1000).merges.empty());
  EXPECT_TRUE(TrainByteLevelBpe("abcdefg", 1000).merges.empty());
  const BpeVocab vocab = TrainByteLevelBpe("ab ab", 1000);
  EXPECT_EQ(vocab.merges, (Merges{{"a", "b"}}));
  EXPECT_EQ(vocab.tokens.size(), 257u);
}

TEST(BpeTrainerTest, RespectsMaxVocab) {
  const std::string text = RandomWords(2000, 7);
  EXPECT_TRUE(TrainByteLevelBpe(text, 256).merges.empty());
  for (const size_t max_vocab : {257u, 300u, 500u}) {
    const BpeVocab vocab = TrainByteLevelBpe(text, max_vocab);
    ExpectWellFormed(vocab);
    EXPECT_EQ(vocab.tokens.size(), max_vocab);
  }
  // A smaller budget yields a prefix of a larger one.
  const BpeVocab small = TrainByteLevelBpe(text, 300);
  const BpeVocab large = TrainByteLevelBpe(text, 500);
  EXPECT_TRUE(std::equal(small.merges.begin(), small.merges.end(), large.merges.begin()));
}

TEST(BpeTrainerTest, MaxVocabBelow256Dies) { EXPECT_DEATH(TrainByteLevelBpe("ab ab", 255), "256"); }

TEST(BpeTrainerTest, IsDeterministic) {
  const std::string text = MixedText(20) + RandomWords(3000, 11);
  const BpeVocab a = TrainByteLevelBpe(text, 2000);
  const BpeVocab b = TrainByteLevelBpe(text, 2000);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.merges, b.merges);
  ExpectWellFormed(a);
}

TEST(BpeTrainerTest, MatchesTheNaiveAlgorithm) {
  for (const uint64_t seed : {1u, 2u, 3u}) {
    const std::string text = RandomWords(1000, seed);
    const BpeVocab vocab = TrainByteLevelBpe(text, 256 + 3000);
    EXPECT_EQ(vocab.merges, NaiveTrain(text, 3000)) << "seed " << seed;
    EXPECT_GT(vocab.merges.size(), 400u);  // all pairs seen twice, not the budget, ended it
  }
}

TEST(BpeTrainerTest, NoMergeCrossesAWordBoundary) {
  // Only letters and single spaces: every word is "letters" or " letters", so a space may only
  // ever start a token.
  const BpeVocab vocab = TrainByteLevelBpe(RandomWords(5000, 5) + " ab ab ab cd cd", 100000);
  ExpectWellFormed(vocab);
  EXPECT_GT(vocab.merges.size(), 1000u);
  for (const std::string& token : vocab.tokens) {
    EXPECT_EQ(Bytes(token).find(' ', 1), std::string::npos) << token;
  }
}

TEST(BpeTrainerTest, SplitsLikeTheQwenPreTokenizer) {
  const BpeVocab vocab = TrainByteLevelBpe(MixedText(50) + "12 12 12 345 345 345", 100000);
  ExpectWellFormed(vocab);
  std::set<std::string> tokens;
  for (const std::string& token : vocab.tokens) tokens.insert(Bytes(token));

  for (const std::string& token : tokens) {
    int digits = 0;
    for (const char c : token) digits += (c >= '0' && c <= '9');
    EXPECT_LE(digits, 1) << "digits are split singly: " << token;
    // Contractions are words of their own, so "n'" (don't) or "e'" (we're) never merge.
    EXPECT_EQ(token.find("n'"), std::string::npos) << token;
    EXPECT_EQ(token.find("e'"), std::string::npos) << token;
    // A letter run never swallows the space after it (whitespace-only runs like "   \n" may hold
    // several).
    const bool has_letter = std::any_of(token.begin(), token.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    });
    EXPECT_FALSE(has_letter && token.back() == ' ') << token;
  }
  EXPECT_TRUE(tokens.contains("'t"));
  EXPECT_TRUE(tokens.contains("'ll"));
  EXPECT_TRUE(tokens.contains(" quick"));
  EXPECT_TRUE(tokens.contains(")...\n\n"));  // punctuation runs take the newlines after them
  EXPECT_TRUE(tokens.contains(" --"));       // and an optional leading space
  EXPECT_TRUE(tokens.contains(" ("));        // even before a letter
  EXPECT_TRUE(tokens.contains(".\r\n"));
  EXPECT_TRUE(tokens.contains("\tTabbed"));     // one non-letter may lead a letter run
  EXPECT_TRUE(tokens.contains("   \n"));        // whitespace up to the last newline
  EXPECT_TRUE(tokens.contains("caf\xC3\xA9"));  // bytes >= 0x80 count as letters
}

TEST(BpeTrainerTest, SpaceRunsLeaveTheirLastSpaceToTheNextWord) {
  // "a  b": \s+(?!\S) takes one space, " b" the other; "a   b": "  " then " b".
  std::string two;
  std::string three;
  for (int i = 0; i < 10; ++i) {
    two += "a  b  ";
    three += "a   b   ";
  }
  const auto has_double_space = [](const BpeVocab& vocab) {
    for (const std::string& token : vocab.tokens) {
      if (token == "\u0120\u0120") return true;
    }
    return false;
  };
  EXPECT_FALSE(has_double_space(TrainByteLevelBpe(two, 1000)));
  EXPECT_TRUE(has_double_space(TrainByteLevelBpe(three, 1000)));
}

// Tests assert behaviour, not speed: the training time is only recorded.
TEST(BpeTrainerTest, TrainsAHundredKilobytes) {
  const std::string text = MixedText(20) + LexiconText(14000, 4000, 9);
  ASSERT_GT(text.size(), 100000u);
  const auto start = std::chrono::steady_clock::now();
  const BpeVocab vocab = TrainByteLevelBpe(text, 256 + 8000);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ExpectWellFormed(vocab);
  EXPECT_EQ(vocab.merges.size(), 8000u);
  RecordProperty("train_seconds", std::to_string(seconds));
}

// ---- tokenizer_files.h -------------------------------------------------------------------------

using Json = nlohmann::ordered_json;

const std::vector<SpecialToken> kSpecials = {
    {"<|endoftext|>", 0}, {"<|im_start|>", 0}, {"<|im_end|>", 0}};

std::vector<SpecialToken> SpecialsAfter(const BpeVocab& vocab) {
  std::vector<SpecialToken> specials = kSpecials;
  for (size_t i = 0; i < specials.size(); ++i)
    specials[i].id = static_cast<int>(vocab.tokens.size() + i);
  return specials;
}

std::vector<std::string> Keys(const Json& object) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.push_back(key);
  return keys;
}

std::optional<Json> ReadReference(const std::string& file) {
  std::ifstream in(std::string(MOESERVE_TESTDATA_DIR) + "/tiny-qwen3next/" + file);
  if (!in) return std::nullopt;
  return Json::parse(in);
}

TEST(TokenizerFilesTest, TokenizerJsonHasTheHuggingFaceLayout) {
  const BpeVocab vocab = TrainByteLevelBpe(MixedText(20), 350);
  const std::string text = MakeTokenizerJson(vocab, SpecialsAfter(vocab));
  const Json j = Json::parse(text);

  EXPECT_EQ(Keys(j), (std::vector<std::string>{"version", "truncation", "padding", "added_tokens",
                                               "normalizer", "pre_tokenizer", "post_processor",
                                               "decoder", "model"}));
  EXPECT_EQ(j["version"], "1.0");
  EXPECT_TRUE(j["truncation"].is_null());
  EXPECT_TRUE(j["padding"].is_null());

  ASSERT_EQ(j["added_tokens"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const Json& t = j["added_tokens"][i];
    EXPECT_EQ(Keys(t), (std::vector<std::string>{"id", "content", "single_word", "lstrip", "rstrip",
                                                 "normalized", "special"}));
    EXPECT_EQ(t["id"], vocab.tokens.size() + i);
    EXPECT_EQ(t["content"], kSpecials[i].content);
    EXPECT_EQ(t["special"], true);
    EXPECT_EQ(t["normalized"], false);
  }

  const Json& model = j["model"];
  EXPECT_EQ(Keys(model),
            (std::vector<std::string>{"type", "dropout", "unk_token", "continuing_subword_prefix",
                                      "end_of_word_suffix", "fuse_unk", "byte_fallback",
                                      "ignore_merges", "vocab", "merges"}));
  ASSERT_EQ(model["vocab"].size(), vocab.tokens.size());
  size_t id = 0;
  for (const auto& [token, value] : model["vocab"].items()) {  // in id order
    EXPECT_EQ(token, vocab.tokens[id]);
    EXPECT_EQ(value, id);
    ++id;
  }
  ASSERT_EQ(model["merges"].size(), vocab.merges.size());
  ASSERT_EQ(vocab.merges.size(), 350u - 256u);
  for (size_t i = 0; i < vocab.merges.size(); ++i) {
    EXPECT_EQ(model["merges"][i], Json::array({vocab.merges[i].first, vocab.merges[i].second}));
  }
  // Non-ASCII stays raw (ensure_ascii off), pretty-printed with 2 spaces.
  EXPECT_NE(text.find("\n      \"\u0120\": 32,\n"), std::string::npos);
  EXPECT_EQ(text.find("\\u0120"), std::string::npos);
  EXPECT_EQ(text.rfind("{\n  \"version\": \"1.0\",\n", 0), 0u);
}

TEST(TokenizerFilesTest, TokenizerJsonMatchesTheQwenReference) {
  const std::optional<Json> reference = ReadReference("tokenizer.json");
  ASSERT_TRUE(reference) << "no " << MOESERVE_TESTDATA_DIR << "/tiny-qwen3next";
  const BpeVocab vocab = TrainByteLevelBpe(MixedText(5), 400);
  const Json j = Json::parse(MakeTokenizerJson(vocab, SpecialsAfter(vocab)));
  EXPECT_EQ(Keys(j), Keys(*reference));
  for (const char* key : {"version", "truncation", "padding", "normalizer", "pre_tokenizer",
                          "post_processor", "decoder"}) {
    EXPECT_EQ(j[key], (*reference)[key]) << key;
  }
  Json model = j["model"];
  Json reference_model = (*reference)["model"];
  EXPECT_EQ(Keys(model), Keys(reference_model));
  for (Json* m : {&model, &reference_model}) {
    m->erase("vocab");
    m->erase("merges");
  }
  EXPECT_EQ(model, reference_model);
  for (size_t i = 0; i < 3; ++i) {  // the reference's added tokens differ only in their ids
    Json token = j["added_tokens"][i];
    Json reference_token = (*reference)["added_tokens"][i];
    token.erase("id");
    reference_token.erase("id");
    EXPECT_EQ(token, reference_token);
  }
}

TEST(TokenizerFilesTest, SpecialsAreListedInIdOrder) {
  const BpeVocab vocab = TrainByteLevelBpe("ab ab", 1000);
  const Json j = Json::parse(
      MakeTokenizerJson(vocab, {{"<|im_end|>", 259}, {"<|endoftext|>", 257}, {"<|x|>", 258}}));
  ASSERT_EQ(j["added_tokens"].size(), 3u);
  EXPECT_EQ(j["added_tokens"][0]["content"], "<|endoftext|>");
  EXPECT_EQ(j["added_tokens"][1]["content"], "<|x|>");
  EXPECT_EQ(j["added_tokens"][2]["id"], 259);
}

TEST(TokenizerFilesTest, WritesALargeVocabularyQuickly) {
  // Only the writer is under test here, so the tokens need not come from training.
  BpeVocab vocab;
  for (int b = 0; b < 256; ++b)
    vocab.tokens.push_back(BytesToByteLevel(std::string(1, static_cast<char>(b))));
  for (int i = 0; vocab.tokens.size() < 32000; ++i) {
    const std::string number = std::to_string(i);
    vocab.merges.emplace_back("t", number);
    vocab.tokens.push_back(vocab.merges.back().first + number);
  }
  const std::string text = MakeTokenizerJson(vocab, SpecialsAfter(vocab));
  // nlohmann::json (sorted keys) parses this size quickly; ordered_json would not.
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["model"]["vocab"].size(), 32000u);
  EXPECT_EQ(j["model"]["vocab"]["t31743"], 31999);
  EXPECT_EQ(j["model"]["merges"].size(), 32000u - 256u);
}

TEST(TokenizerFilesTest, TokenizerConfigJson) {
  const std::vector<SpecialToken> specials = {
      {"<|endoftext|>", 1000}, {"<|im_start|>", 1001}, {"<|im_end|>", 1002}};
  const std::string text = MakeTokenizerConfigJson(specials, kChatMlTemplate, 4096);
  const Json j = Json::parse(text);
  EXPECT_EQ(j["tokenizer_class"], "Qwen2Tokenizer");
  EXPECT_TRUE(j["bos_token"].is_null());
  EXPECT_EQ(j["eos_token"], "<|im_end|>");
  EXPECT_EQ(j["pad_token"], "<|endoftext|>");
  EXPECT_EQ(j["add_bos_token"], false);
  EXPECT_EQ(j["model_max_length"], 4096);
  EXPECT_EQ(j["chat_template"], kChatMlTemplate);
  EXPECT_EQ(Keys(j).back(), "chat_template");

  const Json& decoder = j["added_tokens_decoder"];
  EXPECT_EQ(Keys(decoder), (std::vector<std::string>{"1000", "1001", "1002"}));
  EXPECT_EQ(decoder["1002"],
            Json::parse(R"({"content": "<|im_end|>", "lstrip": false, "normalized": false,
                            "rstrip": false, "single_word": false, "special": true})"));
  EXPECT_EQ(Keys(decoder["1000"]), (std::vector<std::string>{"content", "lstrip", "normalized",
                                                             "rstrip", "single_word", "special"}));
  EXPECT_EQ(text.rfind("{\n  \"tokenizer_class\": \"Qwen2Tokenizer\",\n", 0), 0u);
}

TEST(TokenizerFilesTest, ChatMlTemplateIsQwens) {
  EXPECT_EQ(std::string(kChatMlTemplate),
            "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
            "{{ message['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}");
  const std::optional<Json> reference = ReadReference("tokenizer_config.json");
  ASSERT_TRUE(reference) << "no " << MOESERVE_TESTDATA_DIR << "/tiny-qwen3next";
  EXPECT_EQ((*reference)["chat_template"], kChatMlTemplate);
}

TEST(TokenizerFilesTest, ConfigNeedsImEndAndEndOfText) {
  EXPECT_DEATH(MakeTokenizerConfigJson({{"<|endoftext|>", 300}}, kChatMlTemplate, 128), "im_end");
  EXPECT_DEATH(MakeTokenizerConfigJson({{"<|im_end|>", 300}}, kChatMlTemplate, 128), "endoftext");
}

}  // namespace
}  // namespace moeserve::tokenizer
