// tokenizer/gguf_tokenizer against the folder path: the real Qwen3 tokenizer written into a GGUF
// file as llama.cpp's converter writes it (the vocabulary with the added tokens in id order, the
// token types, the merges as "left right", the special ids, the template, padded to the model's
// vocabulary size with "[PAD<id>]" entries) must come back as the same tokenizer and template as
// tokenizer.json and tokenizer_config.json give. Then the other pre-tokenizers, the layouts of
// ids, and hostile metadata, each refused with an error naming its key.
//
// MOESERVE_GGUF_QWEN3=FILE also compares a GGUF file made elsewhere (by llama.cpp's converter)
// from a Qwen3 model with the folder's tokenizer; without it that test is skipped.
#include "tokenizer/gguf_tokenizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer_test_data.h"
#include "core/test_paths.h"

namespace moeserve::tokenizer {
namespace {

namespace fs = std::filesystem;
using io::GgufFile;
using io::GgufType;
using io::GgufWriter;
using nlohmann::json;
using ::testing::HasSubstr;
using testing::kQwen3Dir;
using testing::Qwen3;
using testing::ReadFileOrDie;

const std::string kTemplatesDir = std::string(MOESERVE_TESTDATA_DIR) + "/chat-templates";

// Qwen3's config.json: the vocabulary size of the model (past the tokenizer's 151,669 ids) and
// the bos_token_id the converter writes when tokenizer_config.json names no bos_token.
constexpr int kQwen3VocabSize = 151936;
constexpr int kQwen3ConfigBosId = 151643;

std::string TempPath(const std::string& name) {
  return (fs::temp_directory_path() / fmt::format("moeserve_gguf_tok_{}_{}", getpid(), name))
      .string();
}

const json& Qwen3TokenizerJson() {
  static const json* j = new json(json::parse(ReadFileOrDie(kQwen3Dir + "/tokenizer.json")));
  return *j;
}
const json& Qwen3ConfigJson() {
  static const json* j = new json(json::parse(ReadFileOrDie(kQwen3Dir + "/tokenizer_config.json")));
  return *j;
}

Result<GgufTokenizer> WriteAndLoad(const GgufWriter& w, const std::string& name) {
  const std::string path = TempPath(name);
  if (Status s = w.Write(path); !s.ok()) return s;
  Result<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  fs::remove(path);
  if (!file.ok()) return file.status();
  return LoadGgufTokenizer(**file);
}

// The real Qwen3 tokenizer through a converter-made GGUF file, with `chat_template`.
Result<GgufTokenizer> Qwen3ThroughGguf(const std::string& chat_template, const std::string& name) {
  json config = Qwen3ConfigJson();
  config["chat_template"] = chat_template;
  GgufWriter w;
  w.SetString("general.architecture", "qwen3moe");
  AddGgufTokenizer(&w, Qwen3TokenizerJson(), config, kQwen3VocabSize, kQwen3ConfigBosId, "qwen2");
  return WriteAndLoad(w, name);
}

// With the Qwen3 template, built once per test binary.
const GgufTokenizer& Qwen3Gguf() {
  static const GgufTokenizer* loaded = [] {
    Result<GgufTokenizer> r =
        Qwen3ThroughGguf(Qwen3ConfigJson()["chat_template"].get<std::string>(), "qwen3");
    if (!r.ok()) {
      ADD_FAILURE() << r.status().ToString();
      std::abort();
    }
    return new GgufTokenizer(std::move(*r));
  }();
  return *loaded;
}

// The ids that differ in IsSpecial: added tokens that are not special but look it.
std::set<int32_t> LookSpecialOnly(const Tokenizer& hf) {
  std::set<int32_t> ids;
  for (const AddedToken& t : hf.added_tokens()) {
    if (!t.special && LooksSpecialToConverter(t.content)) ids.insert(t.id);
  }
  return ids;
}

std::vector<std::string> Corpus() {
  std::vector<std::string> texts;
  for (const testing::EncodeCase& c : testing::EncodeCases()) texts.push_back(c.text);
  for (const testing::ChatCase& c : testing::ChatCases()) texts.push_back(c.rendered);
  for (const char* extra : {
           "Hello, world! It's a test: don't, won't, I'm, we'll, they'd.",
           "我想在apple工作1314151天～ 日本語のテキスト 한국어 텍스트 繁體中文",
           "🦙🦙 👨\u200d👩\u200d👧\u200d👦 🏳️\u200d🌈 ✅ 😶\u200d🌫️",
           "   leading\t\ttabs\n\n\n   \n \r\n trailing   ",
           "3 33 333 3333 33333 3.3 3..3 3...3 1e10 -42 0x1F ١٢٣ ½",
           "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><think>\nx\n</think>\n\n",
           "<tool_call>\n{\"name\": \"f\"}\n</tool_call><tool_response>ok</tool_response>",
           "<|fim_prefix|>def f():<|fim_suffix|>\n    return 1<|fim_middle|><|repo_name|>r",
           "cafe\u0301 naïve e\u0301\u0301 ﬁ Ａ Å",
           "a<|im_end|b <|im_end|><<|im_end|>>",
       }) {
    texts.emplace_back(extra);
  }
  return texts;
}

// Everything the tokenizer API gives, equal, but IsSpecial on `special_only_in_gguf`.
void ExpectSameTokenizer(const Tokenizer& gguf, const Tokenizer& hf,
                         const std::set<int32_t>& special_only_in_gguf) {
  EXPECT_EQ(gguf.vocab_size(), hf.vocab_size());
  ASSERT_EQ(gguf.id_limit(), hf.id_limit());
  EXPECT_EQ(gguf.max_bytes_per_token(), hf.max_bytes_per_token());
  for (int32_t id = -2; id < hf.id_limit() + 300; ++id) {
    ASSERT_EQ(gguf.IdToToken(id), hf.IdToToken(id)) << id;
    ASSERT_EQ(gguf.TokenBytes(id), hf.TokenBytes(id)) << id;
    const bool looks = special_only_in_gguf.count(id) > 0;
    ASSERT_EQ(gguf.IsSpecial(id), hf.IsSpecial(id) || looks) << id;
    if (looks) {
      EXPECT_FALSE(hf.IsSpecial(id)) << id;
    }
  }
  std::set<std::pair<int32_t, std::string>> gguf_added, hf_added;
  for (const AddedToken& t : gguf.added_tokens()) gguf_added.emplace(t.id, t.content);
  for (const AddedToken& t : hf.added_tokens()) hf_added.emplace(t.id, t.content);
  EXPECT_EQ(gguf_added, hf_added);
  const auto same_named = [](const std::optional<NamedToken>& a, const std::optional<NamedToken>& b,
                             const char* what) {
    ASSERT_EQ(a.has_value(), b.has_value()) << what;
    if (a) {
      EXPECT_EQ(a->id, b->id) << what;
      EXPECT_EQ(a->content, b->content) << what;
    }
  };
  same_named(gguf.bos_token(), hf.bos_token(), "bos");
  same_named(gguf.eos_token(), hf.eos_token(), "eos");
  same_named(gguf.pad_token(), hf.pad_token(), "pad");
  same_named(gguf.unk_token(), hf.unk_token(), "unk");

  for (const std::string& text : Corpus()) {
    SCOPED_TRACE(text);
    for (bool add_special : {false, true}) {
      Result<std::vector<int32_t>> a = gguf.Encode(text, add_special);
      Result<std::vector<int32_t>> b = hf.Encode(text, add_special);
      ASSERT_EQ(a.ok(), b.ok());
      if (!a.ok()) continue;
      ASSERT_EQ(*a, *b);
      EXPECT_EQ(gguf.Decode(*a), hf.Decode(*b));
      // Skipping special tokens drops the look-special ones too: as Hugging Face does when they
      // are gone.
      std::vector<int32_t> without;
      for (int32_t id : *b) {
        if (special_only_in_gguf.count(id) == 0) without.push_back(id);
      }
      EXPECT_EQ(gguf.Decode(*a, true), hf.Decode(without, true));
    }
  }
  const std::string bad = "ok \xff\xfe";
  EXPECT_EQ(gguf.Encode(bad).status().message(), hf.Encode(bad).status().message());
}

// Chat cases keep their keys' order (a tool's JSON is rendered in it).
std::vector<nlohmann::ordered_json> ReadCases(const std::string& path) {
  std::vector<nlohmann::ordered_json> cases;
  std::istringstream in(ReadFileOrDie(path));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) cases.push_back(nlohmann::ordered_json::parse(line));
  }
  return cases;
}

ChatTemplateInputs InputsOf(const nlohmann::ordered_json& c) {
  ChatTemplateInputs inputs;
  inputs.messages_json = c["messages"].dump();
  inputs.tools_json = c["tools"].dump();
  inputs.add_generation_prompt = c["add_generation_prompt"].get<bool>();
  inputs.extra_json = c["extra"].dump();
  return inputs;
}

// Every case renders alike with both templates (the same text, or the same error), and, with
// goldens, as the case's "rendered".
void ExpectSameRenders(const ChatTemplate& gguf, const ChatTemplate& hf,
                       const std::string& cases_path, bool goldens = true) {
  const std::vector<nlohmann::ordered_json> cases = ReadCases(cases_path);
  ASSERT_FALSE(cases.empty());
  for (const nlohmann::ordered_json& c : cases) {
    SCOPED_TRACE(c["id"].get<std::string>());
    Result<std::string> a = gguf.Render(InputsOf(c));
    Result<std::string> b = hf.Render(InputsOf(c));
    ASSERT_EQ(a.ok(), b.ok()) << a.status().ToString() << " / " << b.status().ToString();
    if (!a.ok()) {
      EXPECT_EQ(a.status().message(), b.status().message());
      continue;
    }
    EXPECT_EQ(*a, *b);
    if (goldens) {
      EXPECT_EQ(*a, c["rendered"].get<std::string>());
    }
  }
}

// ---- the real Qwen3 tokenizer ----

TEST(GgufTokenizerTest, Qwen3ThroughTheConverterLayoutIsTheFoldersTokenizer) {
  const GgufTokenizer& g = Qwen3Gguf();
  ExpectSameTokenizer(*g.tokenizer, Qwen3(), LookSpecialOnly(Qwen3()));
  // The ids that differ are exactly the six <|fim_...|>, <|repo_name|>, <|file_sep|>.
  EXPECT_EQ(LookSpecialOnly(Qwen3()),
            (std::set<int32_t>{151659, 151660, 151661, 151662, 151663, 151664}));
  EXPECT_EQ(g.tokenizer->vocab_size(), 151669u);
  EXPECT_FALSE(g.tokenizer->bos_token().has_value());  // tokenizer_config.json names none
  EXPECT_EQ(g.bos_token_id, kQwen3ConfigBosId);        // config.json's, for the engine
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{151645}));
  EXPECT_EQ(g.tokenizer->eos_token()->content, "<|im_end|>");
  EXPECT_EQ(g.tokenizer->pad_token()->content, "<|endoftext|>");
  EXPECT_TRUE(g.tokenizer->additional_special_tokens().empty());  // not in a GGUF file
}

TEST(GgufTokenizerTest, Qwen3FilesHoldTheFoldersComponentsVocabularyAndMerges) {
  const json built = json::parse(Qwen3Gguf().files.tokenizer_json);
  const json& real = Qwen3TokenizerJson();
  for (const char* part : {"normalizer", "pre_tokenizer", "post_processor", "decoder"}) {
    EXPECT_EQ(built[part], real[part]) << part;
  }
  EXPECT_EQ(built["model"]["vocab"], real["model"]["vocab"]);
  EXPECT_EQ(built["model"]["merges"], real["model"]["merges"]);
  EXPECT_EQ(built["model"]["ignore_merges"], real["model"]["ignore_merges"]);
  ASSERT_EQ(built["added_tokens"].size(), real["added_tokens"].size());
  for (size_t i = 0; i < real["added_tokens"].size(); ++i) {
    json expected = real["added_tokens"][i];
    if (LooksSpecialToConverter(expected["content"].get<std::string>())) expected["special"] = true;
    EXPECT_EQ(built["added_tokens"][i], expected);
  }
}

TEST(GgufTokenizerTest, Qwen3TemplateRendersAsTheFoldersOne) {
  const GgufTokenizer& g = Qwen3Gguf();
  ASSERT_TRUE(g.chat_template_status.ok()) << g.chat_template_status.ToString();
  ASSERT_TRUE(g.chat_template.has_value());
  Result<ChatTemplate> hf =
      ChatTemplate::FromTokenizerConfig(ReadFileOrDie(kQwen3Dir + "/tokenizer_config.json"));
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  EXPECT_EQ(g.chat_template->source(), hf->source());
  ExpectSameRenders(*g.chat_template, *hf, kQwen3Dir + "/chat_cases.jsonl");

  // --chat-template FILE: another template with the file's special tokens.
  for (const std::string& file :
       {kQwen3Dir + "/chat_template_qwen3_next_thinking.jinja",
        kTemplatesDir + "/qwen3-coder.jinja", kTemplatesDir + "/qwen3.5.jinja"}) {
    SCOPED_TRACE(file);
    Result<ChatTemplate> a = g.WithChatTemplate(ReadFileOrDie(file));
    Result<ChatTemplate> b = hf->WithTemplate(ReadFileOrDie(file));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ExpectSameRenders(*a, *b, kQwen3Dir + "/chat_cases.jsonl", /*goldens=*/false);
  }
  Result<ChatTemplate> next =
      g.WithChatTemplate(ReadFileOrDie(kQwen3Dir + "/chat_template_qwen3_next_thinking.jinja"));
  Result<ChatTemplate> next_hf =
      hf->WithTemplate(ReadFileOrDie(kQwen3Dir + "/chat_template_qwen3_next_thinking.jinja"));
  ExpectSameRenders(*next, *next_hf, kQwen3Dir + "/chat_cases_qwen3_next_thinking.jsonl");
}

TEST(GgufTokenizerTest, Qwen35TemplateFromTheFileRendersItsGoldens) {
  const std::string source = ReadFileOrDie(kTemplatesDir + "/qwen3.5.jinja");
  Result<GgufTokenizer> g = Qwen3ThroughGguf(source, "qwen35tmpl");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_TRUE(g->chat_template.has_value()) << g->chat_template_status.ToString();
  json config = Qwen3ConfigJson();
  config["chat_template"] = source;
  Result<ChatTemplate> hf = ChatTemplate::FromTokenizerConfig(config.dump());
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  ExpectSameRenders(*g->chat_template, *hf, kTemplatesDir + "/qwen3.5_cases.jsonl");
}

// A GGUF file made by llama.cpp's converter from a Qwen3 model (by hand: the project never needs
// llama.cpp). MOESERVE_GGUF_QWEN3=/path/to/model.gguf.
TEST(GgufTokenizerTest, RealConverterFileIsTheFoldersTokenizer) {
  const char* path = std::getenv("MOESERVE_GGUF_QWEN3");
  if (path == nullptr || *path == '\0') GTEST_SKIP() << "MOESERVE_GGUF_QWEN3 is not set";
  Result<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Result<GgufTokenizer> g = LoadGgufTokenizer(**file);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const io::GgufValue* tokens = (*file)->FindValue("tokenizer.ggml.tokens");
  std::cout << fmt::format("{}: tokenizer.ggml.pre {}, {} tokens, eos {}, bos {}, template {}\n",
                           path, (*file)->FindValue("tokenizer.ggml.pre")->value.dump(),
                           tokens->value.size(), fmt::join(g->eos_token_ids, ","), g->bos_token_id,
                           g->chat_template ? "yes" : g->chat_template_status.ToString());
  ExpectSameTokenizer(*g->tokenizer, Qwen3(), LookSpecialOnly(Qwen3()));
  EXPECT_EQ(g->bos_token_id, kQwen3ConfigBosId);
  EXPECT_EQ(g->eos_token_ids, (std::vector<int64_t>{151645}));
  ASSERT_TRUE(g->chat_template.has_value()) << g->chat_template_status.ToString();
  Result<ChatTemplate> hf =
      ChatTemplate::FromTokenizerConfig(ReadFileOrDie(kQwen3Dir + "/tokenizer_config.json"));
  ASSERT_TRUE(hf.ok());
  if (g->chat_template->source() != hf->source()) {
    std::cout << "the file's template differs from testdata's; rendering both with the "
                 "file's\n";
    hf = hf->WithTemplate(g->chat_template->source());
    ASSERT_TRUE(hf.ok()) << hf.status().ToString();
    ExpectSameRenders(*g->chat_template, *hf, kQwen3Dir + "/chat_cases.jsonl", false);
  } else {
    ExpectSameRenders(*g->chat_template, *hf, kQwen3Dir + "/chat_cases.jsonl");
  }
}

// ---- a small vocabulary: the other pre-tokenizers, the layouts of ids, hostile metadata ----

// The 256 byte-level tokens, then extra normal tokens, merges and added tokens; the metadata of
// a valid file that each test changes.
struct SmallVocab {
  std::vector<std::string> tokens;
  std::vector<int> types;
  std::vector<std::string> merges;

  SmallVocab() {
    for (int b = 0; b < 256; ++b) {
      tokens.push_back(BytesToByteLevel(std::string(1, static_cast<char>(b))));
      types.push_back(1);
    }
    for (const char* m : {"1 2", "12 3", "4 5", "3 4", "h i"}) {
      merges.emplace_back(m);
      std::string merged(m);
      merged.erase(merged.find(' '), 1);
      tokens.push_back(merged);
      types.push_back(1);
    }
  }
  int32_t Add(const std::string& token, int type) {
    tokens.push_back(token);
    types.push_back(type);
    return static_cast<int32_t>(tokens.size() - 1);
  }
  // Ids: 261 <|endoftext|> (control), 262 <tool> (user-defined), 263 <|im_end|> (control).
  static SmallVocab WithAdded() {
    SmallVocab v;
    v.Add("<|endoftext|>", 3);
    v.Add("<tool>", 4);
    v.Add("<|im_end|>", 3);
    return v;
  }

  void SetAll(GgufWriter* w, const std::string& pre = "qwen2", bool add_bos_key = true,
              bool bos_key = true) const {
    w->SetString("tokenizer.ggml.model", "gpt2");
    w->SetString("tokenizer.ggml.pre", pre);
    w->SetArray("tokenizer.ggml.tokens", GgufType::kString, tokens);
    w->SetArray("tokenizer.ggml.token_type", GgufType::kInt32, types);
    w->SetArray("tokenizer.ggml.merges", GgufType::kString, merges);
    w->SetU32("tokenizer.ggml.eos_token_id", 263);
    if (bos_key) w->SetU32("tokenizer.ggml.bos_token_id", 261);
    w->SetU32("tokenizer.ggml.padding_token_id", 261);
    if (add_bos_key) w->SetBool("tokenizer.ggml.add_bos_token", false);
    w->SetString("tokenizer.chat_template",
                 "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}");
  }
};

Result<GgufTokenizer> LoadSmall(const SmallVocab& v, const std::string& pre,
                                const std::function<void(GgufWriter*)>& change = {}) {
  GgufWriter w;
  v.SetAll(&w, pre);
  if (change) change(&w);
  return WriteAndLoad(w, "small");
}

std::vector<int32_t> Ids(const Tokenizer& t, const std::string& text, bool add_special = false) {
  Result<std::vector<int32_t>> ids = t.Encode(text, add_special);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(GgufTokenizerTest, SmallVocabularyLoadsWithItsIds) {
  Result<GgufTokenizer> g = LoadSmall(SmallVocab::WithAdded(), "qwen2");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Tokenizer& t = *g->tokenizer;
  EXPECT_EQ(t.TokenToId("<|im_end|>"), 263);
  EXPECT_EQ(t.TokenToId("<tool>"), 262);
  EXPECT_TRUE(t.IsSpecial(263));
  EXPECT_FALSE(t.IsSpecial(262));
  EXPECT_EQ(Ids(t, "hi<tool>!<|im_end|>"), (std::vector<int32_t>{260, 262, 33, 263}));
  EXPECT_EQ(t.Decode(Ids(t, "hi<tool>!<|im_end|>"), true), "hi<tool>!");
  EXPECT_EQ(g->eos_token_ids, (std::vector<int64_t>{263}));
  EXPECT_EQ(g->bos_token_id, 261);
  EXPECT_FALSE(t.bos_token().has_value());  // not added: config.json's (see the header)
  EXPECT_EQ(t.pad_token()->id, 261);
  ASSERT_TRUE(g->chat_template.has_value());
  EXPECT_EQ(*g->chat_template->Render({.messages_json = R"([{"role":"user","content":"a"}])"}),
            "a<|im_end|>");
}

TEST(GgufTokenizerTest, PreTokenizersSplitAsTheirFamilies) {
  SmallVocab v = SmallVocab::WithAdded();
  // Qwen2: digits one by one, no BOS.
  Result<GgufTokenizer> qwen = LoadSmall(v, "qwen2");
  ASSERT_TRUE(qwen.ok()) << qwen.status().ToString();
  EXPECT_EQ(Ids(*qwen->tokenizer, "12345", true), (std::vector<int32_t>{49, 50, 51, 52, 53}));
  // Llama 3: digits in runs of three, no normalizer, ignore_merges, and BOS added when the file
  // does not say otherwise.
  for (const char* name : {"llama-bpe", "llama3", "llama-v3"}) {
    SCOPED_TRACE(name);
    GgufWriter w;
    v.SetAll(&w, name, /*add_bos_key=*/false);
    Result<GgufTokenizer> llama = WriteAndLoad(w, "llama");
    ASSERT_TRUE(llama.ok()) << llama.status().ToString();
    EXPECT_EQ(Ids(*llama->tokenizer, "12345", true), (std::vector<int32_t>{261, 257, 258}));
    EXPECT_EQ(Ids(*llama->tokenizer, "12345"), (std::vector<int32_t>{257, 258}));
    EXPECT_EQ(llama->tokenizer->bos_token()->id, 261);
    const json files = json::parse(llama->files.tokenizer_json);
    EXPECT_TRUE(files["normalizer"].is_null());
    EXPECT_EQ(files["model"]["ignore_merges"], true);
    EXPECT_EQ(files["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"],
              std::string(kLlama3SplitPattern));
  }
  // Without a bos id, the BOS llama-bpe implies is an error.
  {
    GgufWriter w;
    v.SetAll(&w, "llama-bpe", /*add_bos_key=*/false, /*bos_key=*/false);
    Result<GgufTokenizer> llama = WriteAndLoad(w, "llama_no_bos");
    ASSERT_FALSE(llama.ok());
    EXPECT_THAT(llama.status().message(),
                HasSubstr("tokenizer.ggml.pre \"llama-bpe\" adds a BOS token unless "
                          "tokenizer.ggml.add_bos_token says otherwise, but there is no "
                          "tokenizer.ggml.bos_token_id"));
  }
  // Qwen3.5: a letter run takes the combining marks after it, where Qwen2 starts a new word at
  // the mark; a merge of "x" and the mark's first byte shows which.
  const std::string mark_byte = BytesToByteLevel("\xCC");  // U+0301 is CC 81
  v.merges.push_back("x " + mark_byte);
  const int32_t x_mark = v.Add("x" + mark_byte, 1);
  Result<GgufTokenizer> qwen35 = LoadSmall(v, "qwen35");
  ASSERT_TRUE(qwen35.ok()) << qwen35.status().ToString();
  EXPECT_EQ(Ids(*qwen35->tokenizer, "x\u0301y"), (std::vector<int32_t>{x_mark, 0x81, 'y'}));
  Result<GgufTokenizer> qwen2 = LoadSmall(v, "qwen2");
  ASSERT_TRUE(qwen2.ok()) << qwen2.status().ToString();
  EXPECT_EQ(Ids(*qwen2->tokenizer, "x\u0301y"), (std::vector<int32_t>{'x', 0xCC, 0x81, 'y'}));
  const json files = json::parse(qwen35->files.tokenizer_json);
  EXPECT_EQ(files["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"],
            std::string(kQwen35SplitPattern));
  EXPECT_EQ(files["normalizer"]["type"], "NFC");
  // add_eos_token puts EOS after the text.
  Result<GgufTokenizer> eos = LoadSmall(SmallVocab::WithAdded(), "qwen2", [](GgufWriter* w) {
    w->SetBool("tokenizer.ggml.add_eos_token", true);
  });
  ASSERT_TRUE(eos.ok()) << eos.status().ToString();
  EXPECT_EQ(Ids(*eos->tokenizer, "hi", true), (std::vector<int32_t>{260, 263}));
}

TEST(GgufTokenizerTest, IdsAreKeptWhateverTheLayout) {
  // Added tokens first, then the vocabulary (they sit among the vocabulary's ids).
  {
    SmallVocab v;
    SmallVocab first;
    first.tokens = {"<|endoftext|>", "<x>"};
    first.types = {3, 4};
    first.tokens.insert(first.tokens.end(), v.tokens.begin(), v.tokens.end());
    first.types.insert(first.types.end(), v.types.begin(), v.types.end());
    first.merges = v.merges;
    GgufWriter w;
    first.SetAll(&w);
    w.SetU32("tokenizer.ggml.eos_token_id", 0);
    w.SetU32("tokenizer.ggml.bos_token_id", 0);
    w.SetU32("tokenizer.ggml.padding_token_id", 1);
    Result<GgufTokenizer> g = WriteAndLoad(w, "first");
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(Ids(*g->tokenizer, "<x>hi<|endoftext|>"), (std::vector<int32_t>{1, 262, 0}));
    EXPECT_EQ(g->tokenizer->eos_token()->content, "<|endoftext|>");
  }
  // A padding entry between the vocabulary and the added tokens, and padding at the end.
  {
    SmallVocab v;
    v.Add("[PAD261]", 5);
    v.Add("<|endoftext|>", 3);
    v.Add("<tool>", 4);
    v.Add("<|im_end|>", 3);
    v.Add("[PAD265]", 5);
    GgufWriter w;
    v.SetAll(&w);
    w.SetU32("tokenizer.ggml.eos_token_id", 264);
    w.SetU32("tokenizer.ggml.bos_token_id", 262);
    w.SetU32("tokenizer.ggml.padding_token_id", 262);
    Result<GgufTokenizer> g = WriteAndLoad(w, "gap");
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(Ids(*g->tokenizer, "<tool><|im_end|>"), (std::vector<int32_t>{263, 264}));
    EXPECT_EQ(g->tokenizer->TokenBytes(261), std::nullopt);
    EXPECT_EQ(g->tokenizer->id_limit(), 265);
  }
  // An added token that a merge makes stays a vocabulary token too.
  {
    SmallVocab v;
    v.Add("<a>", 4);
    v.merges.push_back("< a");
    v.tokens.push_back("<a");
    v.types.push_back(1);
    v.merges.push_back("<a >");
    v.Add("<|im_end|>", 3);
    GgufWriter w;
    v.SetAll(&w);
    w.SetU32("tokenizer.ggml.eos_token_id", 263);
    w.SetU32("tokenizer.ggml.bos_token_id", 263);
    w.SetU32("tokenizer.ggml.padding_token_id", 263);
    Result<GgufTokenizer> g = WriteAndLoad(w, "merged");
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(Ids(*g->tokenizer, "x<a>"), (std::vector<int32_t>{120, 261}));
  }
}

// ---- hostile metadata ----

struct Hostile {
  std::string name;
  std::function<void(GgufWriter*)> change;
  std::string key;      // the error names it
  std::string message;  // ... and says this
};

TEST(GgufTokenizerTest, HostileMetadataIsAnErrorNamingTheKey) {
  const SmallVocab v = SmallVocab::WithAdded();
  const auto strings = [](std::vector<std::string> s) { return json(s); };
  std::vector<std::string> long_tokens = v.tokens;
  long_tokens[100] = std::string(kMaxGgufTokenBytes + 1, 'a');
  std::vector<std::string> bad_utf8 = v.tokens;
  bad_utf8[261] = "<|\xff|>";
  std::vector<std::string> empty_token = v.tokens;
  empty_token[262] = "";
  std::vector<std::string> duplicate = v.tokens;
  duplicate[262] = "<|endoftext|>";
  std::vector<int> short_types(v.types.begin(), v.types.end() - 1);
  std::vector<int> type_9 = v.types;
  type_9[5] = 9;
  std::vector<int> type_byte = v.types;
  type_byte[5] = 6;
  std::vector<int> type_negative = v.types;
  type_negative[5] = -1;

  const std::vector<Hostile> cases = {
      {"model a number",
       [](GgufWriter* w) {
         w->Set("tokenizer.ggml.model", {GgufType::kUint32, GgufType::kUint8, 1});
       },
       "tokenizer.ggml.model", "expected a string, found a uint32"},
      {"model an int8",
       [](GgufWriter* w) {
         w->Set("tokenizer.ggml.model", {GgufType::kInt8, GgufType::kUint8, 2});
       },
       "tokenizer.ggml.model", "expected a string, found an int8"},
      {"model llama", [](GgufWriter* w) { w->SetString("tokenizer.ggml.model", "llama"); },
       "tokenizer.ggml.model", "\"llama\" is not implemented (only gpt2"},
      {"model not UTF-8", [](GgufWriter* w) { w->SetString("tokenizer.ggml.model", "g\xffpt2"); },
       "tokenizer.ggml.model", "not valid UTF-8"},
      {"pre falcon", [](GgufWriter* w) { w->SetString("tokenizer.ggml.pre", "falcon"); },
       "tokenizer.ggml.pre", "\"falcon\" is not implemented (qwen2, qwen35, llama-bpe)"},
      {"pre an array",
       [](GgufWriter* w) { w->SetArray("tokenizer.ggml.pre", GgufType::kString, {"qwen2"}); },
       "tokenizer.ggml.pre", "expected a string, found an array of string"},
      {"pre too long",
       [](GgufWriter* w) { w->SetString("tokenizer.ggml.pre", std::string(300, 'q')); },
       "tokenizer.ggml.pre", "300 bytes, more than the 256 allowed"},
      {"tokens of integers",
       [](GgufWriter* w) {
         w->SetArray("tokenizer.ggml.tokens", GgufType::kUint32, {1, 2});
       },
       "tokenizer.ggml.tokens", "expected an array of strings, found an array of uint32"},
      {"tokens a string", [](GgufWriter* w) { w->SetString("tokenizer.ggml.tokens", "a"); },
       "tokenizer.ggml.tokens", "expected an array of strings, found a string"},
      {"tokens empty",
       [](GgufWriter* w) {
         w->SetArray("tokenizer.ggml.tokens", GgufType::kString, json::array());
       },
       "tokenizer.ggml.tokens", "empty"},
      {"token too long",
       [&](GgufWriter* w) {
         w->SetArray("tokenizer.ggml.tokens", GgufType::kString, strings(long_tokens));
       },
       "tokenizer.ggml.tokens[100]", "2049 bytes, more than the 2048 allowed"},
      {"token not UTF-8",
       [&](GgufWriter* w) {
         w->SetArray("tokenizer.ggml.tokens", GgufType::kString, strings(bad_utf8));
       },
       "tokenizer.ggml.tokens[261]", "not valid UTF-8"},
      {"token empty",
       [&](GgufWriter* w) {
         w->SetArray("tokenizer.ggml.tokens", GgufType::kString, strings(empty_token));
       },
       "tokenizer.ggml.tokens[262]", "an empty token"},
      {"token twice",
       [&](GgufWriter* w) {
         w->SetArray("tokenizer.ggml.tokens", GgufType::kString, strings(duplicate));
       },
       "tokenizer.ggml.tokens[262]", "\"<|endoftext|>\" is also tokenizer.ggml.tokens[261]"},
      {"types shorter",
       [&](GgufWriter* w) {
         w->SetArray("tokenizer.ggml.token_type", GgufType::kInt32, short_types);
       },
       "tokenizer.ggml.token_type", "has 263 entries but tokenizer.ggml.tokens has 264"},
      {"types of strings",
       [](GgufWriter* w) { w->SetArray("tokenizer.ggml.token_type", GgufType::kString, {"1"}); },
       "tokenizer.ggml.token_type", "expected an array of integers, found an array of string"},
      {"types a bool", [](GgufWriter* w) { w->SetBool("tokenizer.ggml.token_type", true); },
       "tokenizer.ggml.token_type", "expected an array of integers, found a bool"},
      {"type 9",
       [&](GgufWriter* w) { w->SetArray("tokenizer.ggml.token_type", GgufType::kInt32, type_9); },
       "tokenizer.ggml.token_type[5]", "9 is not a token type"},
      {"type -1",
       [&](GgufWriter* w) {
         w->SetArray("tokenizer.ggml.token_type", GgufType::kInt32, type_negative);
       },
       "tokenizer.ggml.token_type[5]", "-1 is not a token type"},
      {"type byte",
       [&](GgufWriter* w) {
         w->SetArray("tokenizer.ggml.token_type", GgufType::kInt32, type_byte);
       },
       "tokenizer.ggml.token_type[5]",
       "type 6 (byte) does not occur in a byte-level BPE vocabulary"},
      {"merges of integers",
       [](GgufWriter* w) { w->SetArray("tokenizer.ggml.merges", GgufType::kInt32, {1}); },
       "tokenizer.ggml.merges", "expected an array of strings, found an array of int32"},
      {"merge without space",
       [&](GgufWriter* w) {
         w->SetArray("tokenizer.ggml.merges", GgufType::kString, {"1 2", "12"});
       },
       "tokenizer.ggml.merges[1]", "\"12\" is not two tokens separated by a space"},
      {"merge ends in space",
       [&](GgufWriter* w) { w->SetArray("tokenizer.ggml.merges", GgufType::kString, {"12 "}); },
       "tokenizer.ggml.merges[0]", "is not two tokens separated by a space"},
      {"merge of an unknown token",
       [&](GgufWriter* w) {
         w->SetArray("tokenizer.ggml.merges", GgufType::kString, {"1 2", "xyz 1"});
       },
       "tokenizer.ggml.merges[1]", "\"xyz\" is not a token of tokenizer.ggml.tokens"},
      {"merge result unknown",
       [&](GgufWriter* w) { w->SetArray("tokenizer.ggml.merges", GgufType::kString, {"a b"}); },
       "tokenizer.ggml.merges[0]", "\"ab\" is not a token of tokenizer.ggml.tokens"},
      {"merges too long",
       [&](GgufWriter* w) {
         w->SetArray("tokenizer.ggml.merges", GgufType::kString,
                     {std::string(2 * kMaxGgufTokenBytes + 2, 'a')});
       },
       "tokenizer.ggml.merges[0]", "longer than two tokens can be"},
      {"eos out of range", [](GgufWriter* w) { w->SetU32("tokenizer.ggml.eos_token_id", 264); },
       "tokenizer.ggml.eos_token_id",
       "id 264 is out of range (tokenizer.ggml.tokens has 264 tokens)"},
      {"eos negative",
       [](GgufWriter* w) {
         w->Set("tokenizer.ggml.eos_token_id", {GgufType::kInt32, GgufType::kUint8, -1});
       },
       "tokenizer.ggml.eos_token_id", "id -1 is out of range"},
      {"eos huge",
       [](GgufWriter* w) {
         w->Set("tokenizer.ggml.eos_token_id", {GgufType::kUint64, GgufType::kUint8, ~uint64_t{0}});
       },
       "tokenizer.ggml.eos_token_id", "id 18446744073709551615 is out of range"},
      {"eos a string", [](GgufWriter* w) { w->SetString("tokenizer.ggml.eos_token_id", "263"); },
       "tokenizer.ggml.eos_token_id", "expected an integer, found a string"},
      {"eos a float", [](GgufWriter* w) { w->SetF32("tokenizer.ggml.eos_token_id", 263); },
       "tokenizer.ggml.eos_token_id", "expected an integer, found a float32"},
      {"pad out of range",
       [](GgufWriter* w) { w->SetU32("tokenizer.ggml.padding_token_id", 1000000); },
       "tokenizer.ggml.padding_token_id", "out of range"},
      {"eot out of range", [](GgufWriter* w) { w->SetU32("tokenizer.ggml.eot_token_id", 999); },
       "tokenizer.ggml.eot_token_id", "out of range"},
      {"add_bos a number", [](GgufWriter* w) { w->SetU32("tokenizer.ggml.add_bos_token", 1); },
       "tokenizer.ggml.add_bos_token", "expected a bool, found a uint32"},
      {"add_eos a string",
       [](GgufWriter* w) { w->SetString("tokenizer.ggml.add_eos_token", "true"); },
       "tokenizer.ggml.add_eos_token", "expected a bool, found a string"},
      {"template an array",
       [](GgufWriter* w) { w->SetArray("tokenizer.chat_template", GgufType::kString, {"x"}); },
       "tokenizer.chat_template", "expected a string, found an array of string"},
      {"template too large",
       [](GgufWriter* w) {
         w->SetString("tokenizer.chat_template", std::string(kMaxGgufChatTemplateBytes + 1, ' '));
       },
       "tokenizer.chat_template", "1048577 bytes, more than the 1048576 allowed"},
      {"template not UTF-8",
       [](GgufWriter* w) { w->SetString("tokenizer.chat_template", "{{ '\xc3' }}"); },
       "tokenizer.chat_template", "not valid UTF-8 (at byte 4)"},
  };
  for (const Hostile& c : cases) {
    SCOPED_TRACE(c.name);
    Result<GgufTokenizer> g = LoadSmall(v, "qwen2", c.change);
    ASSERT_FALSE(g.ok());
    EXPECT_THAT(g.status().message(), HasSubstr(c.key)) << g.status().ToString();
    EXPECT_THAT(g.status().message(), HasSubstr(c.message)) << g.status().ToString();
  }
}

TEST(GgufTokenizerTest, MissingKeysAreErrorsNamingThem) {
  const SmallVocab v = SmallVocab::WithAdded();
  const auto without = [&](const std::string& key) {
    GgufWriter full;
    v.SetAll(&full);
    const std::string path = TempPath("full");
    EXPECT_TRUE(full.Write(path).ok());
    Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
    fs::remove(path);
    EXPECT_TRUE(f.ok());
    GgufWriter w;
    for (const auto& [k, value] : (*f)->metadata()) {
      if (k != key) w.Set(k, value);
    }
    return WriteAndLoad(w, "without");
  };
  for (const std::string key :
       {"tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type", "tokenizer.ggml.merges"}) {
    SCOPED_TRACE(key);
    Result<GgufTokenizer> g = without(key);
    ASSERT_FALSE(g.ok());
    EXPECT_THAT(g.status().message(), HasSubstr(key + ": missing"));
  }
  // Optional keys: no eos (no stop ids), no template, no bos.
  Result<GgufTokenizer> no_eos = without("tokenizer.ggml.eos_token_id");
  ASSERT_TRUE(no_eos.ok()) << no_eos.status().ToString();
  EXPECT_TRUE(no_eos->eos_token_ids.empty());
  Result<GgufTokenizer> no_template = without("tokenizer.chat_template");
  ASSERT_TRUE(no_template.ok()) << no_template.status().ToString();
  EXPECT_FALSE(no_template->chat_template.has_value());
  EXPECT_TRUE(no_template->chat_template_status.ok());
  Result<ChatTemplate> given = no_template->WithChatTemplate("{{ eos_token }}");
  ASSERT_TRUE(given.ok()) << given.status().ToString();
  EXPECT_EQ(*given->Render({.messages_json = "[]"}), "<|im_end|>");
  Result<GgufTokenizer> no_bos = without("tokenizer.ggml.bos_token_id");
  ASSERT_TRUE(no_bos.ok()) << no_bos.status().ToString();
  EXPECT_EQ(no_bos->bos_token_id, -1);
}

TEST(GgufTokenizerTest, IdsNamingPaddingEntries) {
  SmallVocab v = SmallVocab::WithAdded();
  v.Add("[PAD264]", 5);
  // eos (and bos, eot, eom) must be a token; a pad naming a padding entry is dropped.
  Result<GgufTokenizer> eos =
      LoadSmall(v, "qwen2", [](GgufWriter* w) { w->SetU32("tokenizer.ggml.eos_token_id", 264); });
  ASSERT_FALSE(eos.ok());
  EXPECT_THAT(eos.status().message(),
              HasSubstr("tokenizer.ggml.eos_token_id: id 264 is an unused padding entry"));
  Result<GgufTokenizer> pad = LoadSmall(
      v, "qwen2", [](GgufWriter* w) { w->SetU32("tokenizer.ggml.padding_token_id", 264); });
  ASSERT_TRUE(pad.ok()) << pad.status().ToString();
  EXPECT_FALSE(pad->tokenizer->pad_token().has_value());
  // add_bos_token without a bos id (llama-bpe implies add_bos_token).
  Result<GgufTokenizer> bos = LoadSmall(v, "qwen2", [](GgufWriter* w) {
    w->SetBool("tokenizer.ggml.add_bos_token", true);
    w->SetU32("tokenizer.ggml.bos_token_id", 264);
  });
  ASSERT_FALSE(bos.ok());
  EXPECT_THAT(bos.status().message(),
              HasSubstr("tokenizer.ggml.bos_token_id: id 264 is an unused padding entry"));
  GgufWriter w;
  v.SetAll(&w, "qwen2", /*add_bos_key=*/false, /*bos_key=*/false);
  w.SetBool("tokenizer.ggml.add_bos_token", true);
  Result<GgufTokenizer> no_bos = WriteAndLoad(w, "no_bos");
  ASSERT_FALSE(no_bos.ok());
  EXPECT_THAT(no_bos.status().message(),
              HasSubstr("tokenizer.ggml.add_bos_token is true but there is no "
                        "tokenizer.ggml.bos_token_id"));
}

TEST(GgufTokenizerTest, ABrokenTemplateLeavesTheTokenizer) {
  Result<GgufTokenizer> g = LoadSmall(SmallVocab::WithAdded(), "qwen2", [](GgufWriter* w) {
    w->SetString("tokenizer.chat_template", "{% for m in messages %}");
  });
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_NE(g->tokenizer, nullptr);
  EXPECT_FALSE(g->chat_template.has_value());
  EXPECT_FALSE(g->chat_template_status.ok());
  EXPECT_THAT(g->chat_template_status.message(), HasSubstr("tokenizer.chat_template"));
}

TEST(GgufTokenizerTest, FilesFromMetadataNeedNoFile) {
  GgufWriter w;
  SmallVocab::WithAdded().SetAll(&w);
  const std::string path = TempPath("meta");
  ASSERT_TRUE(w.Write(path).ok());
  Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  fs::remove(path);
  ASSERT_TRUE(f.ok());
  Result<GgufTokenizerFiles> files = GgufTokenizerFilesFromMetadata((*f)->metadata());
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  Result<std::unique_ptr<Tokenizer>> t =
      Tokenizer::FromJson(files->tokenizer_json, files->tokenizer_config_json);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->TokenToId("<|im_end|>"), 263);
  EXPECT_FALSE(GgufTokenizerFilesFromMetadata({}).ok());
}

}  // namespace
}  // namespace moeserve::tokenizer
