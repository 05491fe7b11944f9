#include "tokenizer/tokenizer_files.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>

#include "core/check.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer_json.h"

namespace moeserve::tokenizer {
namespace {

// ordered_json keeps keys in insertion order, so the files read like the ones Hugging Face writes.
using Json = nlohmann::ordered_json;

std::vector<SpecialToken> SortedById(std::vector<SpecialToken> specials) {
  std::sort(specials.begin(), specials.end(),
            [](const SpecialToken& a, const SpecialToken& b) { return a.id < b.id; });
  return specials;
}

// Pretty-printed like transformers' save_pretrained (indent 2, UTF-8 kept raw), newline-ended.
std::string Dump(const Json& j) { return j.dump(2, ' ', /*ensure_ascii=*/false) + "\n"; }

}  // namespace

const char kChatMlTemplate[] =
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

std::string MakeTokenizerJson(const BpeVocab& vocab, const std::vector<SpecialToken>& specials) {
  const std::vector<SpecialToken> sorted = SortedById(specials);
  std::set<std::string> contents;
  for (size_t i = 0; i < sorted.size(); ++i) {
    // Added tokens live after the BPE vocabulary; overlapping ids would silently shadow tokens.
    CHECK_GE(sorted[i].id, static_cast<int>(vocab.tokens.size())) << sorted[i].content;
    CHECK(i == 0 || sorted[i].id != sorted[i - 1].id) << "duplicate special id " << sorted[i].id;
    CHECK(contents.insert(sorted[i].content).second) << "duplicate special " << sorted[i].content;
  }

  Json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  Json added = Json::array();
  for (const SpecialToken& s : sorted) {
    Json t;
    t["id"] = s.id;
    t["content"] = s.content;
    t["single_word"] = false;
    t["lstrip"] = false;
    t["rstrip"] = false;
    t["normalized"] = false;
    t["special"] = true;
    added.push_back(std::move(t));
  }
  j["added_tokens"] = std::move(added);
  j["normalizer"] = Json{{"type", "NFC"}};

  Json split;
  split["type"] = "Split";
  split["pattern"] = Json{{"Regex", std::string(kQwen2SplitPattern)}};
  split["behavior"] = "Isolated";
  split["invert"] = false;
  Json pre;
  pre["type"] = "Sequence";
  pre["pretokenizers"] = Json::array({std::move(split), ByteLevelStepJson()});
  j["pre_tokenizer"] = std::move(pre);
  j["post_processor"] = ByteLevelStepJson();
  j["decoder"] = ByteLevelStepJson();

  Json model = BpeModelJson(false);
  // ordered_json objects find keys by linear search, so inserting a 30k-token vocabulary key by
  // key would be quadratic in the vocabulary. Entries go straight into the underlying vector
  // instead, with uniqueness checked here.
  Json vocab_json = Json::object();
  Json::object_t::Container& entries = vocab_json.get_ref<Json::object_t&>();
  entries.reserve(vocab.tokens.size());
  std::unordered_set<std::string_view> seen;
  for (size_t id = 0; id < vocab.tokens.size(); ++id) {
    CHECK(seen.insert(vocab.tokens[id]).second) << "duplicate token " << vocab.tokens[id];
    entries.emplace_back(vocab.tokens[id], id);
  }
  model["vocab"] = std::move(vocab_json);
  // [left, right] pairs, the format tokenizers >= 0.20 writes: unlike the older "left right"
  // strings it stays unambiguous whatever characters the tokens hold.
  Json merges = Json::array();
  for (const auto& [left, right] : vocab.merges) merges.push_back(Json::array({left, right}));
  model["merges"] = std::move(merges);
  j["model"] = std::move(model);
  return Dump(j);
}

std::string MakeTokenizerConfigJson(const std::vector<SpecialToken>& specials,
                                    const std::string& chat_template, int model_max_length) {
  const std::vector<SpecialToken> sorted = SortedById(specials);
  auto has = [&](const std::string& content) {
    return std::any_of(sorted.begin(), sorted.end(),
                       [&](const SpecialToken& s) { return s.content == content; });
  };
  // The caller picks the specials; eos and pad below name these two.
  CHECK(has("<|im_end|>")) << "specials must include <|im_end|> (the eos token)";
  CHECK(has("<|endoftext|>")) << "specials must include <|endoftext|> (the pad token)";

  Json j;
  j["tokenizer_class"] = "Qwen2Tokenizer";
  j["bos_token"] = nullptr;
  j["eos_token"] = "<|im_end|>";
  j["pad_token"] = "<|endoftext|>";
  j["unk_token"] = nullptr;
  j["model_max_length"] = model_max_length;
  j["add_bos_token"] = false;
  j["add_prefix_space"] = false;
  // Older transformers default this to true, which would rewrite " ." as "." when decoding.
  j["clean_up_tokenization_spaces"] = false;
  j["errors"] = "replace";
  j["split_special_tokens"] = false;
  Json decoder = Json::object();
  for (const SpecialToken& s : sorted) {
    Json t;
    t["content"] = s.content;
    t["lstrip"] = false;
    t["normalized"] = false;
    t["rstrip"] = false;
    t["single_word"] = false;
    t["special"] = true;
    decoder[std::to_string(s.id)] = std::move(t);
  }
  j["added_tokens_decoder"] = std::move(decoder);
  j["chat_template"] = chat_template;
  return Dump(j);
}

}  // namespace moeserve::tokenizer
