#include "tokenizer/tokenizer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <utf8proc.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer_test_data.h"
#include "tokenizer/utf8.h"
#include "core/test_paths.h"

namespace moeserve::tokenizer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::ChatCases;
using testing::EncodeCases;
using testing::Qwen3;

// ---- the real Qwen3 tokenizer against Hugging Face's goldens ----

TEST(Qwen3TokenizerTest, EveryEncodeCaseMatchesTheGoldens) {
  const std::vector<testing::EncodeCase> cases = EncodeCases();
  ASSERT_EQ(cases.size(), 130u);
  for (const testing::EncodeCase& c : cases) {
    SCOPED_TRACE(c.id);
    Result<std::vector<int32_t>> ids = Qwen3().Encode(c.text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(*ids, c.ids);
    EXPECT_EQ(Qwen3().Decode(c.ids), c.decoded);
  }
}

TEST(Qwen3TokenizerTest, EveryRenderedChatEncodesToTheGoldenIds) {
  const std::vector<testing::ChatCase> cases = ChatCases();
  ASSERT_EQ(cases.size(), 18u);
  for (const testing::ChatCase& c : cases) {
    SCOPED_TRACE(c.id);
    Result<std::vector<int32_t>> ids = Qwen3().Encode(c.rendered);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(*ids, c.ids);
    EXPECT_EQ(Qwen3().Decode(c.ids), c.rendered);
  }
}

TEST(Qwen3TokenizerTest, CachedAndUncachedEncodesAgree) {
  Result<std::unique_ptr<Tokenizer>> uncached =
      Tokenizer::LoadFromDir(testing::kQwen3Dir, {.word_cache_capacity = 0});
  ASSERT_TRUE(uncached.ok()) << uncached.status().ToString();
  for (const testing::EncodeCase& c : EncodeCases()) {
    SCOPED_TRACE(c.id);
    EXPECT_EQ(*(*uncached)->Encode(c.text), c.ids);
    // A second pass through the cached tokenizer hits the cache for every word.
    EXPECT_EQ(*Qwen3().Encode(c.text), c.ids);
    EXPECT_EQ(*Qwen3().Encode(c.text), c.ids);
  }
}

TEST(Qwen3TokenizerTest, ConcurrentEncodesAgree) {
  const std::vector<testing::EncodeCase> cases = EncodeCases();
  Qwen3().ClearWordCache();
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (const testing::EncodeCase& c : cases) {
          Result<std::vector<int32_t>> ids = Qwen3().Encode(c.text);
          if (!ids.ok() || *ids != c.ids) ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST(Qwen3TokenizerTest, SpecialTokensFromTheConfig) {
  const Tokenizer& t = Qwen3();
  EXPECT_EQ(t.vocab_size(), 151669u);
  EXPECT_EQ(t.id_limit(), 151669);
  EXPECT_EQ(t.added_tokens().size(), 26u);
  ASSERT_TRUE(t.eos_token().has_value());
  EXPECT_EQ(t.eos_token()->content, "<|im_end|>");
  EXPECT_EQ(t.eos_token()->id, 151645);
  ASSERT_TRUE(t.pad_token().has_value());
  EXPECT_EQ(t.pad_token()->id, 151643);
  EXPECT_FALSE(t.bos_token().has_value());
  EXPECT_FALSE(t.unk_token().has_value());
  EXPECT_EQ(t.additional_special_tokens().size(), 13u);
  EXPECT_TRUE(t.IsSpecial(151645));
  EXPECT_FALSE(t.IsSpecial(151657));  // <tool_call> is an added token, not a special one
  EXPECT_FALSE(t.IsSpecial(9707));
  EXPECT_EQ(t.TokenToId("<think>"), std::optional<int32_t>(151667));
  EXPECT_EQ(t.TokenToId("Hello"), std::optional<int32_t>(9707));
  EXPECT_EQ(t.IdToToken(151643), std::optional<std::string_view>("<|endoftext|>"));
  EXPECT_EQ(t.IdToToken(21927), std::optional<std::string_view>("ĠHello"));
  EXPECT_EQ(t.TokenBytes(21927), std::optional<std::string_view>(" Hello"));
  EXPECT_EQ(t.TokenBytes(151669), std::nullopt);
  EXPECT_EQ(t.TokenBytes(-1), std::nullopt);
}

TEST(Qwen3TokenizerTest, DecodeSkipsSpecialTokensOnlyWhenAsked) {
  const std::vector<int32_t> ids =
      *Qwen3().Encode("<|im_start|>user\n<think>Hi</think><|im_end|>\n");
  EXPECT_EQ(Qwen3().Decode(ids), "<|im_start|>user\n<think>Hi</think><|im_end|>\n");
  // <think> is an added token but not special: it stays.
  EXPECT_EQ(Qwen3().Decode(ids, /*skip_special_tokens=*/true), "user\n<think>Hi</think>\n");
}

TEST(Qwen3TokenizerTest, DecodeSkipsUnknownIds) {
  EXPECT_EQ(Qwen3().Decode(std::vector<int32_t>{9707, -5, 999999, 1879}), "Hello world");
  EXPECT_EQ(Qwen3().Decode(std::vector<int32_t>{}), "");
}

TEST(Qwen3TokenizerTest, EncodeRejectsInvalidUtf8) {
  for (const std::string_view bad : {"\xFF", "ab\xC3", "\xED\xA0\x80", "\xC0\xAF", "ok\x80"}) {
    Result<std::vector<int32_t>> ids = Qwen3().Encode(bad);
    ASSERT_FALSE(ids.ok());
    EXPECT_NE(ids.status().message().find("not valid UTF-8"), std::string::npos);
  }
}

// The id of the token that is byte b alone.
int32_t ByteId(const Tokenizer& t, uint8_t b) {
  return *t.TokenToId(BytesToByteLevel(std::string(1, static_cast<char>(b))));
}

std::string DecodeBytes(const Tokenizer& t, std::string_view bytes) {
  std::vector<int32_t> ids;
  for (const char c : bytes) ids.push_back(ByteId(t, static_cast<uint8_t>(c)));
  return t.Decode(ids);
}

TEST(Qwen3TokenizerTest, IllFormedBytesDecodeLikeFromUtf8Lossy) {
  const Tokenizer& t = Qwen3();
  const std::string r(kReplacementChar);
  // Expected values follow Rust's String::from_utf8_lossy: one U+FFFD per maximal ill-formed
  // subsequence.
  EXPECT_EQ(DecodeBytes(t, "\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(DecodeBytes(t, "\xF0\x9F\x98"), r);  // truncated at the end
  EXPECT_EQ(DecodeBytes(t,
                        "\xE2\x82"
                        "A"),
            r + "A");                                            // truncated by another character
  EXPECT_EQ(DecodeBytes(t, "\x80\x80"), r + r);                  // lone continuation bytes
  EXPECT_EQ(DecodeBytes(t, "\xED\xA0\x80"), r + r + r);          // a surrogate
  EXPECT_EQ(DecodeBytes(t, "\xC0\xAF"), r + r);                  // overlong
  EXPECT_EQ(DecodeBytes(t, "\xF4\x90\x80\x80"), r + r + r + r);  // past U+10FFFF
  EXPECT_EQ(DecodeBytes(t,
                        "a\xFF"
                        "b"),
            "a" + r + "b");
}

// ---- UTF-8 helpers ----

TEST(Utf8Test, StreamingLossyDecodeEqualsWholeDecodeAtEverySplit) {
  const std::string bytes =
      "a\xF0\x9F\x98\x80\xE2\x82\xAC\xE2\x82"
      "b\xED\xA0\x80\xC3\xA9\xF0\x9F\x98";
  std::string whole;
  AppendUtf8Lossy(bytes, true, &whole);
  for (size_t split = 0; split <= bytes.size(); ++split) {
    std::string text;
    std::string rest(bytes.substr(0, split));
    rest.erase(0, AppendUtf8Lossy(rest, false, &text));
    EXPECT_LE(rest.size(), 3u);
    EXPECT_EQ(FindInvalidUtf8(text), std::string::npos);
    rest += bytes.substr(split);
    AppendUtf8Lossy(rest, true, &text);
    EXPECT_EQ(text, whole) << split;
  }
}

TEST(Utf8Test, WhiteSpaceAndWordCharacters) {
  for (const char32_t cp : {U' ', U'\t', U'\n', U'\r', U'\x0B', U'\x0C', U'\x85', U'\xA0',
                            U'\u2000', U'\u2028', U'\u3000'}) {
    EXPECT_TRUE(IsUnicodeWhiteSpace(cp)) << static_cast<uint32_t>(cp);
  }
  for (const char32_t cp : {U'a', U'\u200B', U'\uFEFF', U'\x1C'}) {
    EXPECT_FALSE(IsUnicodeWhiteSpace(cp)) << static_cast<uint32_t>(cp);
  }
  for (const char32_t cp : {U'a', U'Z', U'0', U'_', U'\u00E9', U'\u4E2D', U'\u0330', U'\u0663',
                            U'\u2160', U'\u24B6', U'\u200D'}) {
    EXPECT_TRUE(IsWordChar(cp)) << static_cast<uint32_t>(cp);
  }
  for (const char32_t cp : {U'-', U' ', U',', U'\u00B2', U'\U0001F600'}) {
    EXPECT_FALSE(IsWordChar(cp)) << static_cast<uint32_t>(cp);
  }
}

// ---- normalizer ----

// Each form on texts that tell the forms apart (composition, canonical order, singletons,
// composition exclusions, Hangul, compatibility mappings). The expected strings were generated
// once by Python 3.11's unicodedata (Unicode 14.0) -- unicodedata.normalize(form, text) -- and
// pasted as literals; every character here is older than Unicode 3.0, so utf8proc's newer tables
// agree.
TEST(NormalizerTest, EachFormMatchesPythonsUnicodedata) {
  struct Case {
    std::string_view text;
    std::string_view nfc;
    std::string_view nfd;
    std::string_view nfkc;
    std::string_view nfkd;
  };
  const Case cases[] = {
      // e + combining acute
      {"e\xCC\x81", "\xC3\xA9", "e\xCC\x81", "\xC3\xA9", "e\xCC\x81"},
      // Precomposed e acute
      {"\xC3\xA9", "\xC3\xA9", "e\xCC\x81", "\xC3\xA9", "e\xCC\x81"},
      // Marks out of canonical order
      {"a\xCC\x81\xCC\xA8", "\xC4\x85\xCC\x81", "a\xCC\xA8\xCC\x81", "\xC4\x85\xCC\x81",
       "a\xCC\xA8\xCC\x81"},
      // ANGSTROM SIGN, a singleton
      {"\xE2\x84\xAB", "\xC3\x85", "A\xCC\x8A", "\xC3\x85", "A\xCC\x8A"},
      // DEVANAGARI QA, excluded from composition
      {"\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC", "\xE0\xA4\x95\xE0\xA4\xBC",
       "\xE0\xA4\x95\xE0\xA4\xBC", "\xE0\xA4\x95\xE0\xA4\xBC"},
      // Long s with dot above + dot below (UAX #15's example)
      {"\xE1\xBA\x9B\xCC\xA3", "\xE1\xBA\x9B\xCC\xA3", "\xC5\xBF\xCC\xA3\xCC\x87", "\xE1\xB9\xA9",
       "s\xCC\xA3\xCC\x87"},
      // Hangul syllable
      {"\xED\x95\x9C", "\xED\x95\x9C", "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB", "\xED\x95\x9C",
       "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB"},
      // Its conjoining jamo
      {"\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB", "\xED\x95\x9C",
       "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB", "\xED\x95\x9C",
       "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB"},
      // LATIN SMALL LIGATURE FI
      {"\xEF\xAC\x81", "\xEF\xAC\x81", "\xEF\xAC\x81", "fi", "fi"},
      // Superscript two
      {"x\xC2\xB2", "x\xC2\xB2", "x\xC2\xB2", "x2", "x2"},
      // Circled one, fullwidth A
      {"\xE2\x91\xA0\xEF\xBC\xA1", "\xE2\x91\xA0\xEF\xBC\xA1", "\xE2\x91\xA0\xEF\xBC\xA1", "1A",
       "1A"},
  };
  for (const Case& c : cases) {
    for (const auto& [form, expected] :
         {std::pair{NormalizationForm::kNfc, c.nfc}, std::pair{NormalizationForm::kNfd, c.nfd},
          std::pair{NormalizationForm::kNfkc, c.nfkc},
          std::pair{NormalizationForm::kNfkd, c.nfkd}}) {
      std::string scratch;
      const Result<std::string_view> normalized = Normalizer({form}).Normalize(c.text, &scratch);
      ASSERT_TRUE(normalized.ok()) << normalized.status().ToString();
      EXPECT_EQ(*normalized, expected) << NormalizationFormName(form) << " of " << c.text;
    }
  }
}

// utf8proc's own definition of each form (utf8proc_NFC and friends), the oracle of the quick check
// below. `text` holds no NUL (the functions read a NUL-terminated string).
std::string Utf8procNormalized(const std::string& text, NormalizationForm form) {
  utf8proc_uint8_t* (*normalize)(const utf8proc_uint8_t*) = nullptr;
  switch (form) {
    case NormalizationForm::kNfc:
      normalize = utf8proc_NFC;
      break;
    case NormalizationForm::kNfd:
      normalize = utf8proc_NFD;
      break;
    case NormalizationForm::kNfkc:
      normalize = utf8proc_NFKC;
      break;
    case NormalizationForm::kNfkd:
      normalize = utf8proc_NFKD;
      break;
  }
  utf8proc_uint8_t* out = normalize(reinterpret_cast<const utf8proc_uint8_t*>(text.c_str()));
  EXPECT_NE(out, nullptr);
  std::string result = out == nullptr ? "" : reinterpret_cast<const char*>(out);
  std::free(out);
  return result;
}

// The quick check may say "maybe" wrongly but never "normalized" wrongly: checked for every code
// point of planes 0-3 and 14 (the others are unassigned or private use), alone and after
// characters it could compose with (a Latin letter, a leading jamo, an Oriya vowel sign).
TEST(NormalizerTest, QuickCheckNeverPassesTextNormalizationWouldChange) {
  int wrong = 0;
  int passed = 0;
  for (char32_t cp = 1; cp <= 0xE0FFF; ++cp) {
    if (cp == 0x40000) cp = 0xE0000;
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string one;
    AppendUtf8(cp, &one);
    for (const std::string& text : {one, "a" + one, "\xE1\x84\x80" + one, "\xE0\xAD\x87" + one}) {
      for (const NormalizationForm form : {NormalizationForm::kNfc, NormalizationForm::kNfd,
                                           NormalizationForm::kNfkc, NormalizationForm::kNfkd}) {
        if (!IsQuickNormalized(text, form)) continue;
        ++passed;
        if (Utf8procNormalized(text, form) != text) {
          ++wrong;
          ADD_FAILURE() << NormalizationFormName(form) << " U+" << std::hex
                        << static_cast<uint32_t>(cp);
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(passed, 1000000);
}

TEST(NormalizerTest, QuickCheckPassesCommonText) {
  for (const char* text : {"plain ascii", "café naïve Ångström", "你好，世界", "😀👍🏽",
                           "\xC3\xA9", "Dvořák Łódź"}) {
    EXPECT_TRUE(IsQuickNormalized(text, NormalizationForm::kNfc)) << text;
  }
  EXPECT_FALSE(IsQuickNormalized("e\xCC\x81", NormalizationForm::kNfc));
  EXPECT_FALSE(IsQuickNormalized("\xEF\xAC\x81", NormalizationForm::kNfkc));  // ﬁ
  EXPECT_FALSE(IsQuickNormalized("\xC3\xA9", NormalizationForm::kNfd));
}

TEST(NormalizerTest, FormsAndSequences) {
  std::string scratch;
  const Normalizer nfc({NormalizationForm::kNfc});
  EXPECT_EQ(*nfc.Normalize("cafe\xCC\x81", &scratch), "caf\xC3\xA9");
  EXPECT_EQ(*nfc.Normalize(std::string_view("a\0b", 3), &scratch), std::string_view("a\0b", 3));
  const Normalizer nfd({NormalizationForm::kNfd});
  EXPECT_EQ(*nfd.Normalize("caf\xC3\xA9", &scratch), "cafe\xCC\x81");
  const Normalizer nfkc({NormalizationForm::kNfkc});
  EXPECT_EQ(*nfkc.Normalize("\xEF\xAC\x81", &scratch), "fi");
  const Normalizer both({NormalizationForm::kNfd, NormalizationForm::kNfc});
  EXPECT_EQ(*both.Normalize("cafe\xCC\x81", &scratch), "caf\xC3\xA9");
  const std::string text = "unchanged";
  EXPECT_EQ(nfc.Normalize(text, &scratch)->data(), text.data());  // no copy when normalized
}

// ---- pre-tokenizer regexes ----

std::vector<std::string> Matches(const Regex& re, std::string_view text) {
  std::vector<std::string> out;
  EXPECT_TRUE(re.ForEachMatch(text, [&](size_t s, size_t e) {
                  out.emplace_back(text.substr(s, e - s));
                }).ok());
  return out;
}

TEST(RegexTest, OnigurumaClassesAreRewritten) {
  EXPECT_EQ(OnigurumaToPcre2(R"(\s+)"), R"([\t-\r\x{85}\p{Z}]+)");
  EXPECT_EQ(OnigurumaToPcre2(R"([^\s\p{L}])"), R"([^\t-\r\x{85}\p{Z}\p{L}])");
  EXPECT_EQ(OnigurumaToPcre2(R"(\S|\w|\W)"),
            R"([^\t-\r\x{85}\p{Z}]|[\p{L}\p{M}\p{Nd}\p{Pc}]|[^\p{L}\p{M}\p{Nd}\p{Pc}])");
  EXPECT_EQ(OnigurumaToPcre2(R"(\\s[]s]\s)"), R"(\\s[]s][\t-\r\x{85}\p{Z}])");
  EXPECT_EQ(OnigurumaToPcre2(R"([[:alpha:]\s])"), R"([[:alpha:]\t-\r\x{85}\p{Z}])");
}

TEST(RegexTest, NextLineIsWhiteSpaceAsInOniguruma) {
  Result<Regex> re = Regex::Compile(R"(\s+|\S+)", false);
  ASSERT_TRUE(re.ok()) << re.status().ToString();
  EXPECT_EQ(Matches(*re, "a\xC2\x85 b"), (std::vector<std::string>{"a", "\xC2\x85 ", "b"}));
}

TEST(RegexTest, EmptyMatchesAreSkippedOneCharacterAtATime) {
  Result<Regex> re = Regex::Compile("x*", false);
  ASSERT_TRUE(re.ok());
  EXPECT_EQ(Matches(*re, "\xC3\xA9xx\xC3\xA9x"), (std::vector<std::string>{"xx", "x"}));
}

TEST(RegexTest, Gpt2Pattern) {
  Result<Regex> re = Regex::Compile(kGpt2SplitPattern, false);
  ASSERT_TRUE(re.ok());
  EXPECT_EQ(Matches(*re, "Hello world's  test 123!!\n"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " test", " 123", "!!", "\n"}));
}

TEST(RegexTest, InvalidRegexNamesThePattern) {
  Result<Regex> re = Regex::Compile("(abc", false);
  ASSERT_FALSE(re.ok());
  EXPECT_NE(re.status().message().find("invalid regex '(abc'"), std::string::npos);
  EXPECT_NE(re.status().message().find("missing closing parenthesis"), std::string::npos)
      << re.status().message();
}

// ---- small synthetic tokenizers for the features Qwen3 does not use ----

constexpr char kQwenPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|)"
    R"(\s*[\r\n]+|\s+(?!\S)|\s+)";

json ByteLevelStep(bool add_prefix_space, bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", add_prefix_space},
          {"trim_offsets", false},
          {"use_regex", use_regex}};
}

// A byte-level BPE tokenizer.json: the 256 byte tokens (ids 0..255, in byte order), then one token
// per merge (merges given in the byte-level alphabet), Qwen's pre-tokenizer, no added tokens.
json SmallTokenizer(const std::vector<std::pair<std::string, std::string>>& merges = {}) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[BytesToByteLevel(std::string(1, static_cast<char>(b)))] = b;
  json merge_list = json::array();
  for (const auto& [left, right] : merges) {
    if (!vocab.contains(left + right)) vocab[left + right] = static_cast<int>(vocab.size());
    merge_list.push_back(left + " " + right);
  }
  json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = json::array();
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"Regex", kQwenPattern}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          ByteLevelStep(false, false)}}};
  j["post_processor"] = ByteLevelStep(false, false);
  j["decoder"] = ByteLevelStep(false, false);
  j["model"] = {{"type", "BPE"},     {"dropout", nullptr},     {"unk_token", nullptr},
                {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                {"vocab", vocab},    {"merges", merge_list}};
  return j;
}

json Added(int id, const std::string& content, bool special = true) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

std::unique_ptr<Tokenizer> Load(const json& j, const std::string& config = "") {
  Result<std::unique_ptr<Tokenizer>> t = Tokenizer::FromJson(j.dump(), config);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<int32_t> Ids(const Tokenizer& t, std::string_view text) {
  Result<std::vector<int32_t>> ids = t.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

std::vector<int32_t> Concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

TEST(SmallTokenizerTest, MergesApplyLowestRankFirstAndLeftmostOnTies) {
  // ranks: (b,c) 0, (a,b) 1, (a,a) 2; "abc" -> a + bc; "aaa" -> aa + a (leftmost first).
  std::unique_ptr<Tokenizer> t = Load(SmallTokenizer({{"b", "c"}, {"a", "b"}, {"a", "a"}}));
  ASSERT_NE(t, nullptr);
  const int32_t bc = *t->TokenToId("bc");
  const int32_t aa = *t->TokenToId("aa");
  EXPECT_EQ(Ids(*t, "abc"), (std::vector<int32_t>{'a', bc}));
  EXPECT_EQ(Ids(*t, "aaa"), (std::vector<int32_t>{aa, 'a'}));
  EXPECT_EQ(Ids(*t, "aaaa"), (std::vector<int32_t>{aa, aa}));
  EXPECT_EQ(t->Decode(Ids(*t, "abc aaa")), "abc aaa");
}

TEST(SmallTokenizerTest, MergesAsPairsEqualMergesAsStrings) {
  json pairs = SmallTokenizer({{"a", "b"}, {"ab", "c"}});
  pairs["model"]["merges"] = json::array({json::array({"a", "b"}), json::array({"ab", "c"})});
  std::unique_ptr<Tokenizer> t = Load(pairs);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "abc"), (std::vector<int32_t>{*t->TokenToId("abc")}));
}

TEST(SmallTokenizerTest, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  json j = SmallTokenizer();
  j["model"]["vocab"]["xyz"] = 256;  // reachable by no merge
  std::unique_ptr<Tokenizer> plain = Load(j);
  j["model"]["ignore_merges"] = true;
  std::unique_ptr<Tokenizer> ignoring = Load(j);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(ignoring, nullptr);
  EXPECT_EQ(Ids(*plain, "xyz"), (std::vector<int32_t>{'x', 'y', 'z'}));
  EXPECT_EQ(Ids(*ignoring, "xyz"), (std::vector<int32_t>{256}));
}

TEST(SmallTokenizerTest, MissingByteTokensAreDroppedOrBecomeUnk) {
  json j = SmallTokenizer();
  j["model"]["vocab"].erase("q");
  j["model"]["vocab"].erase("r");
  std::unique_ptr<Tokenizer> dropping = Load(j);
  ASSERT_NE(dropping, nullptr);
  EXPECT_EQ(Ids(*dropping, "aqrb"), (std::vector<int32_t>{'a', 'b'}));
  j["model"]["vocab"]["<unk>"] = 300;
  j["model"]["unk_token"] = "<unk>";
  std::unique_ptr<Tokenizer> unk = Load(j);
  ASSERT_NE(unk, nullptr);
  EXPECT_EQ(Ids(*unk, "aqrb"), (std::vector<int32_t>{'a', 300, 300, 'b'}));
  j["model"]["fuse_unk"] = true;
  std::unique_ptr<Tokenizer> fused = Load(j);
  ASSERT_NE(fused, nullptr);
  EXPECT_EQ(Ids(*fused, "aqrb"), (std::vector<int32_t>{'a', 300, 'b'}));
}

TEST(SmallTokenizerTest, Gpt2StyleByteLevelWithPrefixSpace) {
  json j = SmallTokenizer({{"o", "Ġ"}, {"Ġ", "w"}});
  j["pre_tokenizer"] = ByteLevelStep(/*add_prefix_space=*/true, /*use_regex=*/true);
  j["normalizer"] = nullptr;
  std::unique_ptr<Tokenizer> t = Load(j);
  ASSERT_NE(t, nullptr);
  const int32_t space_w = *t->TokenToId("Ġw");
  // " Hello" and " world" are words of their own, so "oĠ" (across them) never merges.
  EXPECT_EQ(Ids(*t, "Hello world"),
            (std::vector<int32_t>{' ', 'H', 'e', 'l', 'l', 'o', space_w, 'o', 'r', 'l', 'd'}));
  EXPECT_EQ(t->Decode(Ids(*t, "Hello world")), " Hello world");
}

TEST(SmallTokenizerTest, PrefixSpaceGoesBeforeEveryPieceAfterAnAddedToken) {
  json j = SmallTokenizer();
  j["pre_tokenizer"] = ByteLevelStep(true, true);
  j["added_tokens"].push_back(Added(256, "<s>"));
  std::unique_ptr<Tokenizer> t = Load(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "a<s>b"), (std::vector<int32_t>{' ', 'a', 256, ' ', 'b'}));
}

TEST(SmallTokenizerTest, SplitBehaviorsAndStringPatterns) {
  json j = SmallTokenizer({{"a", "b"}});
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"String", "-"}}},
                           {"behavior", "Removed"},
                           {"invert", false}},
                          ByteLevelStep(false, false)}}};
  std::unique_ptr<Tokenizer> removed = Load(j);
  ASSERT_NE(removed, nullptr);
  const int32_t ab = *removed->TokenToId("ab");
  EXPECT_EQ(Ids(*removed, "ab-ab--a"), (std::vector<int32_t>{ab, ab, 'a'}));
  // Inverted and removed: only the matches stay.
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "a+"}};
  j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true;
  std::unique_ptr<Tokenizer> inverted = Load(j);
  ASSERT_NE(inverted, nullptr);
  EXPECT_EQ(Ids(*inverted, "xaayab"), (std::vector<int32_t>{'a', 'a', 'a'}));
}

TEST(SmallTokenizerTest, TemplateProcessingAddsSpecialTokensOnRequest) {
  json j = SmallTokenizer();
  j["added_tokens"].push_back(Added(256, "<bos>"));
  j["added_tokens"].push_back(Added(257, "<eos>"));
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {ByteLevelStep(false, false),
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
           {{"SpecialToken", {{"id", "<eos>"}, {"type_id", 0}}}}}},
         {"pair", json::array()},
         {"special_tokens",
          {{"<bos>", {{"id", "<bos>"}, {"ids", {256}}, {"tokens", {"<bos>"}}}},
           {"<eos>", {{"id", "<eos>"}, {"ids", {257}}, {"tokens", {"<eos>"}}}}}}}}}};
  std::unique_ptr<Tokenizer> t = Load(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "hi"), (std::vector<int32_t>{'h', 'i'}));
  EXPECT_EQ(*t->Encode("hi", /*add_special_tokens=*/true),
            (std::vector<int32_t>{256, 'h', 'i', 257}));
}

// Hugging Face's own AddedVocabulary test scenarios (added_vocabulary.rs), without its lowercase
// normalizer.
TEST(SmallTokenizerTest, AddedTokenStripAndSingleWordOptions) {
  const json base = SmallTokenizer();
  std::unique_ptr<Tokenizer> plain = Load(base);
  json j = base;
  json mask = Added(256, "<mask>", false);
  mask["lstrip"] = true;
  mask["rstrip"] = true;
  mask["single_word"] = true;
  j["added_tokens"].push_back(mask);
  std::unique_ptr<Tokenizer> t = Load(j);
  ASSERT_NE(t, nullptr);
  ASSERT_NE(plain, nullptr);
  // "Hi", " <mask> ", "there", "\t<mask>\t", "<mask>\u2000": the tab after the second mask is
  // already taken, so the third one strips nothing on its left.
  EXPECT_EQ(Ids(*t, "Hi <mask> there\t<mask>\t<mask>\xE2\x80\x80"),
            Concat({Ids(*plain, "Hi"), {256}, Ids(*plain, "there"), {256, 256}}));

  json k = base;
  json single = Added(256, "<mask>", false);
  single["single_word"] = true;
  k["added_tokens"].push_back(single);
  std::unique_ptr<Tokenizer> s = Load(k);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(
      Ids(*s, "<mask> My name <mask> A<mask> <mask>ony <mask>"),
      Concat({{256}, Ids(*plain, " My name "), {256}, Ids(*plain, " A<mask> <mask>ony "), {256}}));
  // Punctuation is not a word character; a combining mark is.
  EXPECT_EQ(Ids(*s, "<mask>, <mask>- \xCC\xB0<mask>"),
            Concat({{256}, Ids(*plain, ", "), {256}, Ids(*plain, "- \xCC\xB0<mask>")}));
}

TEST(SmallTokenizerTest, AddedTokensMatchLeftmostLongest) {
  json j = SmallTokenizer();
  j["added_tokens"].push_back(Added(256, "<a>"));
  j["added_tokens"].push_back(Added(257, "<a><b>"));
  j["added_tokens"].push_back(Added(258, "b><"));
  std::unique_ptr<Tokenizer> t = Load(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "<a><b>"), (std::vector<int32_t>{257}));
  EXPECT_EQ(Ids(*t, "<a><c"), (std::vector<int32_t>{256, '<', 'c'}));
  EXPECT_EQ(Ids(*t, "x<a><b><"), (std::vector<int32_t>{'x', 257, '<'}));
}

TEST(SmallTokenizerTest, NormalizedAddedTokensMatchTheNormalizedText) {
  json j = SmallTokenizer();
  json token = Added(256, "cafe\xCC\x81", false);  // decomposed; NFC makes it "café"
  token["normalized"] = true;
  j["added_tokens"].push_back(token);
  std::unique_ptr<Tokenizer> t = Load(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "caf\xC3\xA9"), (std::vector<int32_t>{256}));
  EXPECT_EQ(Ids(*t, "cafe\xCC\x81!"), (std::vector<int32_t>{256, '!'}));
  // The same token matched in the raw text only: the decomposed spelling alone.
  token["normalized"] = false;
  j["added_tokens"][0] = token;
  std::unique_ptr<Tokenizer> raw = Load(j);
  ASSERT_NE(raw, nullptr);
  EXPECT_EQ(Ids(*raw, "cafe\xCC\x81"), (std::vector<int32_t>{256}));
  EXPECT_NE(Ids(*raw, "caf\xC3\xA9"), (std::vector<int32_t>{256}));
}

TEST(SmallTokenizerTest, AddedTokenDecodingKeepsTextOutsideTheAlphabet) {
  json j = SmallTokenizer();
  j["added_tokens"].push_back(Added(256, "two words", false));
  std::unique_ptr<Tokenizer> t = Load(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "two words"), (std::vector<int32_t>{256}));
  EXPECT_EQ(t->Decode(std::vector<int32_t>{256}), "two words");
}

TEST(SmallTokenizerTest, TokenizerConfigAddsTokensAndNamesSpecials) {
  json j = SmallTokenizer();
  j["added_tokens"].push_back(Added(256, "<|end|>"));
  const json config = {
      {"eos_token", {{"content", "<|end|>"}, {"__type", "AddedToken"}}},
      {"bos_token", "<|begin|>"},
      {"pad_token", nullptr},
      {"added_tokens_decoder",
       {{"256", {{"content", "<|end|>"}, {"special", true}}},
        {"257", {{"content", "<|begin|>"}, {"special", true}, {"normalized", false}}}}}};
  std::unique_ptr<Tokenizer> t = Load(j, config.dump());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->eos_token()->id, 256);
  EXPECT_EQ(t->bos_token()->id, 257);
  EXPECT_FALSE(t->pad_token().has_value());
  EXPECT_EQ(Ids(*t, "<|begin|>x<|end|>"), (std::vector<int32_t>{257, 'x', 256}));
  EXPECT_EQ(t->vocab_size(), 258u);
  EXPECT_EQ(t->Decode(std::vector<int32_t>{257, 'x', 256}, true), "x");
}

// Hugging Face decides added token ids itself (and only warns about the declared ones): a known
// content keeps its id, a vocabulary token gets its vocabulary id, a new one the next free id.
TEST(SmallTokenizerTest, AddedTokenIdsAreAssignedAsHuggingFaceDoes) {
  json j = SmallTokenizer();
  j["added_tokens"].push_back(Added(97, "<x>"));      // 97 is 'a': <x> gets 256
  j["added_tokens"].push_back(Added(5000, "<y>"));    // gets 257
  j["added_tokens"].push_back(Added(300, "b"));       // a vocabulary token: keeps 98
  json again = Added(256, "<x>", /*special=*/false);  // the same content again: new flags only
  again["lstrip"] = true;
  j["added_tokens"].push_back(again);
  std::unique_ptr<Tokenizer> t = Load(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->TokenToId("<x>"), std::optional<int32_t>(256));
  EXPECT_EQ(t->TokenToId("<y>"), std::optional<int32_t>(257));
  EXPECT_EQ(t->TokenToId("b"), std::optional<int32_t>('b'));
  EXPECT_EQ(t->added_tokens().size(), 3u);
  EXPECT_EQ(t->id_limit(), 258);
  EXPECT_EQ(Ids(*t, "a <x>"), (std::vector<int32_t>{'a', 256}));  // lstrip took the space
  EXPECT_TRUE(t->IsSpecial(256));                                 // once special, always special
  EXPECT_EQ(Ids(*t, "abc"), (std::vector<int32_t>{'a', 'b', 'c'}));
}

// ---- malformed files ----

struct BadCase {
  const char* name;
  std::function<void(json&)> mutate;
  const char* message;  // a part of the expected error message
};

TEST(MalformedTokenizerTest, EveryProblemIsNamed) {
  const std::vector<BadCase> cases = {
      {"model type", [](json& j) { j["model"]["type"] = "WordPiece"; },
       "model type 'WordPiece' is not supported"},
      {"no model", [](json& j) { j.erase("model"); }, "missing \"model\""},
      {"no vocab", [](json& j) { j["model"].erase("vocab"); }, "model: missing \"vocab\""},
      {"vocab id", [](json& j) { j["model"]["vocab"]["a"] = "x"; },
       "model.vocab[\"a\"]: expected an integer id"},
      {"duplicate id", [](json& j) { j["model"]["vocab"]["zz"] = 5; }, "id 5 is given to both"},
      {"merge token", [](json& j) { j["model"]["merges"].push_back("a qq"); },
       "token 'qq' is not in the vocabulary"},
      {"merge result", [](json& j) { j["model"]["merges"].push_back("x y"); },
       "the merged token 'xy' is not in the vocabulary"},
      {"merge form", [](json& j) { j["model"]["merges"].push_back("ab"); },
       "model.merges[1]: \"ab\" is not two tokens"},
      {"merge pair", [](json& j) { j["model"]["merges"].push_back(json::array({"a"})); },
       "model.merges[1]: expected"},
      {"byte fallback", [](json& j) { j["model"]["byte_fallback"] = true; },
       "byte_fallback true is not supported"},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout 0.1"},
      {"prefix", [](json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       "continuing_subword_prefix '##'"},
      {"unk", [](json& j) { j["model"]["unk_token"] = "<unk>"; },
       "unk_token '<unk>' is not in the vocabulary"},
      {"normalizer",
       [](json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer type 'Lowercase' is not supported"},
      {"nested normalizer",
       [](json& j) {
         j["normalizer"] = {{"type", "Sequence"},
                            {"normalizers", {{{"type", "NFC"}}, {{"type", "Strip"}}}}};
       },
       "normalizer.normalizers[1]: normalizer type 'Strip'"},
      {"pre-tokenizer",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "pre-tokenizer type 'Whitespace' is not supported"},
      {"no byte level", [](json& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); },
       "no ByteLevel step"},
      {"null pre-tokenizer", [](json& j) { j["pre_tokenizer"] = nullptr; },
       "pre_tokenizer null is not supported"},
      {"regex",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "([a-z"; },
       "pre_tokenizer.pretokenizers[0].pattern: invalid regex '([a-z'"},
      {"behavior",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Contiguous"; },
       "Split behavior 'Contiguous' is not supported"},
      {"split after byte level",
       [](json& j) {
         j["pre_tokenizer"]["pretokenizers"].push_back(j["pre_tokenizer"]["pretokenizers"][0]);
       },
       "a Split after the ByteLevel pre-tokenizer"},
      {"decoder",
       [](json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder type 'WordPiece' is not supported"},
      {"null decoder", [](json& j) { j["decoder"] = nullptr; }, "decoder null is not supported"},
      {"post-processor",
       [](json& j) {
         j["post_processor"] = {{"type", "BertProcessing"}};
       },
       "post-processor type 'BertProcessing' is not supported"},
      {"added no id",
       [](json& j) {
         j["added_tokens"].push_back({{"content", "<x>"}});
       },
       "added_tokens[0]: missing \"id\""},
      {"added flag",
       [](json& j) {
         j["added_tokens"].push_back(json{{"id", 300}, {"content", "<x>"}, {"lstrip", "yes"}});
       },
       "added_tokens[0].lstrip: expected a boolean, found string"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    json j = SmallTokenizer({{"a", "b"}});
    c.mutate(j);
    Result<std::unique_ptr<Tokenizer>> t = Tokenizer::FromJson(j.dump());
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find(c.message), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().rfind("tokenizer.json: ", 0), 0u) << t.status().message();
  }
}

TEST(MalformedTokenizerTest, BadJsonAndBadConfigs) {
  Result<std::unique_ptr<Tokenizer>> t = Tokenizer::FromJson("{\"model\": ");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("tokenizer.json: not valid JSON"), std::string::npos)
      << t.status().message();
  t = Tokenizer::FromJson("[1, 2]");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("expected an object, found array"), std::string::npos);

  const std::string good = SmallTokenizer().dump();
  const std::pair<std::string, std::string> configs[] = {
      {"{", "tokenizer_config.json: not valid JSON"},
      {R"({"eos_token": "<|nope|>"})", "tokenizer_config.json: eos_token: '<|nope|>' is not in"},
      {R"({"eos_token": 5})", "tokenizer_config.json: eos_token: expected a string or an object"},
      {R"({"added_tokens_decoder": {"x": {"content": "<y>"}}})",
       "added_tokens_decoder[\"x\"]: the key is not a token id"},
  };
  for (const auto& [config, message] : configs) {
    SCOPED_TRACE(config);
    t = Tokenizer::FromJson(good, config);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find(message), std::string::npos) << t.status().message();
  }
}

TEST(MalformedTokenizerTest, MissingFolder) {
  Result<std::unique_ptr<Tokenizer>> t = Tokenizer::LoadFromDir("/nonexistent/model");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "/nonexistent/model/tokenizer.json: no such file");
}

// ---- the tokenizers of the project's own model folders ----

void ExpectRoundTrips(const Tokenizer& t) {
  for (const char* text :
       {"Hello, world!", "The quick brown fox jumps over the lazy dog.",
        "def f(x):\n    return x * 2\n", "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 😀",
        "  spaces\t\ttabs\n\nnewlines  ", "<|im_start|>user\nhi<|im_end|>\n"}) {
    SCOPED_TRACE(text);
    Result<std::vector<int32_t>> ids = t.Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(t.Decode(*ids), text);
    for (const int32_t id : *ids) EXPECT_TRUE(t.TokenBytes(id).has_value());
  }
  Result<std::vector<int32_t>> chat = t.Encode("<|im_start|>assistant\nok<|im_end|>");
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->front(), *t.TokenToId("<|im_start|>"));
  EXPECT_EQ(chat->back(), *t.TokenToId("<|im_end|>"));
  ASSERT_TRUE(t.eos_token().has_value());
  EXPECT_EQ(t.eos_token()->id, chat->back());
}

TEST(ModelFolderTokenizerTest, TinyQwen3Next) {
  Result<std::unique_ptr<Tokenizer>> t =
      Tokenizer::LoadFromDir(std::string(MOESERVE_TESTDATA_DIR) + "/tiny-qwen3next");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->id_limit(), 512);
  EXPECT_EQ((*t)->eos_token()->id, 511);
  ExpectRoundTrips(**t);
}

TEST(ModelFolderTokenizerTest, MakeModelOutput) {
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("moeserve_tokenizer_test_{}", getpid());
  const std::string command =
      fmt::format("{} make-model --arch qwen3 --preset tiny --out {} >/dev/null", MOESERVE_BINARY,
                  dir.string());
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  Result<std::unique_ptr<Tokenizer>> t = Tokenizer::LoadFromDir(dir.string());
  fs::remove_all(dir);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ExpectRoundTrips(**t);
  EXPECT_EQ((*t)->pad_token()->content, "<|endoftext|>");
}

}  // namespace
}  // namespace moeserve::tokenizer
