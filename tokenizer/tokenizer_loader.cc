// Tokenizer::FromJson and LoadFromDir: tokenizer.json and tokenizer_config.json into a
// Tokenizer::Impl. Every unsupported or malformed part is an error naming its place in the file.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>

#include "core/json.h"
#include "core/log.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace moeserve::tokenizer {
namespace {

using Json = nlohmann::json;

Status WrongType(const std::string& where, const char* expected, const Json& got) {
  return InvalidArgument("{}: expected {}, found {}", where, expected, got.type_name());
}

// The member `key` of object `j`, or nullptr when it is absent or null.
const Json* Member(const Json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

Result<bool> GetBool(const Json& j, const char* key, bool fallback, const std::string& where) {
  const Json* v = Member(j, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return WrongType(where + "." + key, "a boolean", *v);
  return v->get<bool>();
}

Result<std::string> GetString(const Json& j, const char* key, const std::string& where) {
  const Json* v = Member(j, key);
  if (v == nullptr) return InvalidArgument("{}: missing \"{}\"", where, key);
  if (!v->is_string()) return WrongType(where + "." + key, "a string", *v);
  return v->get<std::string>();
}

Result<int32_t> GetId(const Json& v, const std::string& where) {
  if (!v.is_number_integer()) return WrongType(where, "an integer id", v);
  const int64_t id = v.get<int64_t>();
  if (id < 0 || id > INT32_MAX) return InvalidArgument("{}: id {} is out of range", where, id);
  return static_cast<int32_t>(id);
}

// The "type" of a component object.
Result<std::string> TypeOf(const Json& j, const std::string& where) {
  if (!j.is_object()) return WrongType(where, "an object", j);
  return GetString(j, "type", where);
}

Result<Json> ParseJson(std::string_view text) { return moeserve::ParseJson<Json>(text, ""); }

// ---- model ----

Status ParseMerge(const Json& merge, size_t rank, std::pair<std::string, std::string>* out) {
  const std::string where = fmt::format("model.merges[{}]", rank);
  if (merge.is_string()) {
    // "left right": split at the first space (byte-level tokens never hold a space).
    const std::string& s = merge.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    if (space == std::string::npos) {
      return InvalidArgument("{}: \"{}\" is not two tokens separated by a space", where, s);
    }
    *out = {s.substr(0, space), s.substr(space + 1)};
    return OkStatus();
  }
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    *out = {merge[0].get<std::string>(), merge[1].get<std::string>()};
    return OkStatus();
  }
  return InvalidArgument("{}: expected \"left right\" or [\"left\", \"right\"], found {}", where,
                         merge.dump());
}

Result<BpeConfig> ParseModel(const Json& root, const TokenizerOptions& options) {
  const Json* model = Member(root, "model");
  if (model == nullptr) return InvalidArgument("missing \"model\"");
  if (!model->is_object()) return WrongType("model", "an object", *model);
  // Files from before the "type" field always held a BPE model when they have merges.
  if (const Json* type = Member(*model, "type"); type != nullptr) {
    if (!type->is_string()) return WrongType("model.type", "a string", *type);
    if (type->get<std::string>() != "BPE") {
      return Unimplemented("model type '{}' is not supported (only BPE)", type->get<std::string>());
    }
  } else if (Member(*model, "merges") == nullptr) {
    return InvalidArgument("model: missing \"type\"");
  }

  if (const Json* dropout = Member(*model, "dropout"); dropout != nullptr) {
    if (!dropout->is_number()) return WrongType("model.dropout", "a number", *dropout);
    if (dropout->get<double>() != 0.0) {
      return Unimplemented("model.dropout {} is not supported (BPE dropout is for training)",
                           dropout->get<double>());
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const Json* v = Member(*model, key); v != nullptr) {
      if (!v->is_string()) return WrongType(std::string("model.") + key, "a string", *v);
      if (!v->get<std::string>().empty()) {
        return Unimplemented("model.{} '{}' is not supported (byte-level BPE has none)", key,
                             v->get<std::string>());
      }
    }
  }
  BpeConfig config;
  ASSIGN_OR_RETURN(const bool byte_fallback, GetBool(*model, "byte_fallback", false, "model"));
  if (byte_fallback) {
    return Unimplemented("model.byte_fallback true is not supported (byte-level BPE needs none)");
  }
  ASSIGN_OR_RETURN(config.fuse_unk, GetBool(*model, "fuse_unk", false, "model"));
  ASSIGN_OR_RETURN(config.ignore_merges, GetBool(*model, "ignore_merges", false, "model"));
  if (const Json* unk = Member(*model, "unk_token"); unk != nullptr) {
    if (!unk->is_string()) return WrongType("model.unk_token", "a string", *unk);
    config.unk_token = unk->get<std::string>();
  }

  const Json* vocab = Member(*model, "vocab");
  if (vocab == nullptr) return InvalidArgument("model: missing \"vocab\"");
  if (!vocab->is_object()) return WrongType("model.vocab", "an object", *vocab);
  config.vocab.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    ASSIGN_OR_RETURN(const int32_t value, GetId(id, fmt::format("model.vocab[\"{}\"]", token)));
    config.vocab.emplace_back(token, value);
  }

  const Json* merges = Member(*model, "merges");
  if (merges == nullptr) return InvalidArgument("model: missing \"merges\"");
  if (!merges->is_array()) return WrongType("model.merges", "an array", *merges);
  config.merges.resize(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    RETURN_IF_ERROR(ParseMerge((*merges)[i], i, &config.merges[i]));
  }
  config.cache_capacity = options.word_cache_capacity;
  return config;
}

// ---- normalizer ----

Status ParseNormalizer(const Json& j, const std::string& where,
                       std::vector<NormalizationForm>* steps) {
  ASSIGN_OR_RETURN(const std::string type, TypeOf(j, where));
  if (type == "Sequence") {
    const Json* list = Member(j, "normalizers");
    if (list == nullptr || !list->is_array()) {
      return InvalidArgument("{}: a Sequence needs a \"normalizers\" array", where);
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(
          ParseNormalizer((*list)[i], fmt::format("{}.normalizers[{}]", where, i), steps));
    }
    return OkStatus();
  }
  for (NormalizationForm form : {NormalizationForm::kNfc, NormalizationForm::kNfd,
                                 NormalizationForm::kNfkc, NormalizationForm::kNfkd}) {
    if (type == NormalizationFormName(form)) {
      steps->push_back(form);
      return OkStatus();
    }
  }
  return Unimplemented("{}: normalizer type '{}' is not supported (NFC, NFD, NFKC, NFKD, Sequence)",
                       where, type);
}

// ---- pre-tokenizer ----

struct PreTokenizerParts {
  std::vector<SplitStep> splits;
  std::optional<ByteLevelStep> byte_level;
};

Status ParseSplit(const Json& j, const std::string& where, PreTokenizerParts* parts) {
  const Json* pattern = Member(j, "pattern");
  if (pattern == nullptr || !pattern->is_object() || pattern->size() != 1) {
    return InvalidArgument(
        "{}: a Split needs \"pattern\": {{\"Regex\": ...}} or {{\"String\": ...}}", where);
  }
  const bool literal = pattern->contains("String");
  const Json& text = literal ? (*pattern)["String"] : pattern->value("Regex", Json());
  if (!text.is_string()) {
    return InvalidArgument("{}.pattern: expected a \"Regex\" or \"String\" string", where);
  }
  Result<Regex> regex = Regex::Compile(text.get<std::string>(), literal);
  if (!regex.ok()) return regex.status().WithContext(where + ".pattern");
  SplitStep step{*std::move(regex)};
  ASSIGN_OR_RETURN(const std::string behavior, GetString(j, "behavior", where));
  if (behavior == "Isolated") {
    step.behavior = SplitBehavior::kIsolated;
  } else if (behavior == "Removed") {
    step.behavior = SplitBehavior::kRemoved;
  } else {
    return Unimplemented("{}: Split behavior '{}' is not supported (Isolated, Removed)", where,
                         behavior);
  }
  ASSIGN_OR_RETURN(step.invert, GetBool(j, "invert", false, where));
  parts->splits.push_back(std::move(step));
  return OkStatus();
}

Status ParsePreTokenizer(const Json& j, const std::string& where, PreTokenizerParts* parts) {
  ASSIGN_OR_RETURN(const std::string type, TypeOf(j, where));
  if (type == "Sequence") {
    const Json* list = Member(j, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return InvalidArgument("{}: a Sequence needs a \"pretokenizers\" array", where);
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(
          ParsePreTokenizer((*list)[i], fmt::format("{}.pretokenizers[{}]", where, i), parts));
    }
    return OkStatus();
  }
  // After ByteLevel the text is in the byte-level alphabet, where patterns would no longer mean
  // what they say; no published tokenizer splits there.
  if (parts->byte_level.has_value()) {
    return Unimplemented("{}: a {} after the ByteLevel pre-tokenizer is not supported", where,
                         type);
  }
  if (type == "Split") return ParseSplit(j, where, parts);
  if (type == "ByteLevel") {
    ByteLevelStep step;
    // Hugging Face's defaults for absent fields: both true.
    ASSIGN_OR_RETURN(step.add_prefix_space, GetBool(j, "add_prefix_space", true, where));
    ASSIGN_OR_RETURN(step.use_regex, GetBool(j, "use_regex", true, where));
    parts->byte_level = step;
    return OkStatus();
  }
  return Unimplemented("{}: pre-tokenizer type '{}' is not supported (Split, ByteLevel, Sequence)",
                       where, type);
}

Result<std::unique_ptr<PreTokenizer>> BuildPreTokenizer(const Json& root) {
  const Json* j = Member(root, "pre_tokenizer");
  if (j == nullptr) {
    return Unimplemented("pre_tokenizer null is not supported (byte-level BPE needs ByteLevel)");
  }
  PreTokenizerParts parts;
  RETURN_IF_ERROR(ParsePreTokenizer(*j, "pre_tokenizer", &parts));
  if (!parts.byte_level.has_value()) {
    return Unimplemented("pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)");
  }
  std::optional<Regex> gpt2;
  if (parts.byte_level->use_regex) {
    ASSIGN_OR_RETURN(gpt2, Regex::Compile(kGpt2SplitPattern, false));
  }
  return std::make_unique<PreTokenizer>(std::move(parts.splits), *parts.byte_level,
                                        std::move(gpt2));
}

// ---- post-processor and decoder ----

Status ParseTemplate(const Json& j, const std::string& where, Tokenizer::Impl* impl,
                     bool* seen_template) {
  if (*seen_template) return Unimplemented("{}: a second TemplateProcessing", where);
  *seen_template = true;
  const Json* single = Member(j, "single");
  if (single == nullptr || !single->is_array()) {
    return InvalidArgument("{}: TemplateProcessing needs a \"single\" array", where);
  }
  const Json* specials = Member(j, "special_tokens");
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& item = (*single)[i];
    const std::string at = fmt::format("{}.single[{}]", where, i);
    if (item.is_object() && item.contains("Sequence")) {
      const Json& seq = item["Sequence"];
      if (!seq.is_object() || seq.value("id", "") != "A") {
        return InvalidArgument("{}: a single-sequence template can only hold sequence A", at);
      }
      if (seen_sequence) return InvalidArgument("{}: sequence A appears twice", at);
      seen_sequence = true;
      continue;
    }
    if (!item.is_object() || !item.contains("SpecialToken") || !item["SpecialToken"].is_object() ||
        !item["SpecialToken"].value("id", Json()).is_string()) {
      return InvalidArgument(
          "{}: expected {{\"SpecialToken\": {{\"id\": ...}}}} or "
          "{{\"Sequence\": {{\"id\": \"A\"}}}}",
          at);
    }
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    const Json* entry = specials != nullptr ? Member(*specials, name.c_str()) : nullptr;
    const Json* ids = entry != nullptr && entry->is_object() ? Member(*entry, "ids") : nullptr;
    if (ids == nullptr || !ids->is_array()) {
      return InvalidArgument("{}: special token '{}' has no \"ids\" in special_tokens", at, name);
    }
    for (const Json& id : *ids) {
      ASSIGN_OR_RETURN(const int32_t value, GetId(id, at));
      (seen_sequence ? impl->template_suffix : impl->template_prefix).push_back(value);
    }
  }
  if (!seen_sequence) return InvalidArgument("{}: the single template lacks sequence A", where);
  return OkStatus();
}

Status ParsePostProcessor(const Json& j, const std::string& where, Tokenizer::Impl* impl,
                          bool* seen_template) {
  ASSIGN_OR_RETURN(const std::string type, TypeOf(j, where));
  if (type == "ByteLevel") return OkStatus();  // it only adjusts offsets
  if (type == "TemplateProcessing") return ParseTemplate(j, where, impl, seen_template);
  if (type == "Sequence") {
    const Json* list = Member(j, "processors");
    if (list == nullptr || !list->is_array()) {
      return InvalidArgument("{}: a Sequence needs a \"processors\" array", where);
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(ParsePostProcessor((*list)[i], fmt::format("{}.processors[{}]", where, i),
                                         impl, seen_template));
    }
    return OkStatus();
  }
  return Unimplemented(
      "{}: post-processor type '{}' is not supported (ByteLevel, TemplateProcessing, Sequence)",
      where, type);
}

Status CheckDecoder(const Json& root) {
  const Json* j = Member(root, "decoder");
  if (j == nullptr) {
    return Unimplemented("decoder null is not supported (byte-level BPE needs ByteLevel)");
  }
  ASSIGN_OR_RETURN(const std::string type, TypeOf(*j, "decoder"));
  if (type != "ByteLevel") {
    return Unimplemented("decoder type '{}' is not supported (only ByteLevel)", type);
  }
  return OkStatus();
}

// ---- added tokens ----

Result<AddedToken> ParseAddedToken(const Json& j, const std::string& where) {
  if (!j.is_object()) return WrongType(where, "an object", j);
  AddedToken t;
  ASSIGN_OR_RETURN(t.content, GetString(j, "content", where));
  ASSIGN_OR_RETURN(t.special, GetBool(j, "special", false, where));
  ASSIGN_OR_RETURN(t.single_word, GetBool(j, "single_word", false, where));
  ASSIGN_OR_RETURN(t.lstrip, GetBool(j, "lstrip", false, where));
  ASSIGN_OR_RETURN(t.rstrip, GetBool(j, "rstrip", false, where));
  // Hugging Face's default: special tokens match the raw text, the others the normalized text.
  ASSIGN_OR_RETURN(t.normalized, GetBool(j, "normalized", !t.special, where));
  return t;
}

// Collects added tokens as Hugging Face's AddedVocabulary::add_tokens does, which decides ids
// itself and only warns when the file declared another: an added token already known keeps its id
// (and takes the new flags: tokenizer_config.json repeating tokenizer.json's, transformers lets the
// later win; once special it stays special), one that is a vocabulary token gets the vocabulary's
// id, and a new one gets one past the largest added id, or the vocabulary size while every added
// id is below it. Consistent files declare exactly these ids.
class AddedTokenCollector {
 public:
  AddedTokenCollector(const BpeModel& model, Tokenizer::Impl* impl) : model_(model), impl_(impl) {}

  void Add(AddedToken token, const std::string& where) {
    const int32_t declared = token.id;
    if (const auto it = index_.find(token.content); it != index_.end()) {
      AddedToken& existing = impl_->added[it->second];
      token.id = existing.id;
      token.special = token.special || existing.special;
      existing = token;
    } else {
      if (const std::optional<int32_t> vocab_id = model_.TokenToId(token.content)) {
        token.id = *vocab_id;
      } else {
        const auto vocab_size = static_cast<int32_t>(model_.size());
        token.id = !max_id_.has_value()                          ? vocab_size
                   : (*max_id_ >= vocab_size || vocab_size == 0) ? *max_id_ + 1
                                                                 : vocab_size;
      }
      max_id_ = std::max(max_id_.value_or(token.id), token.id);
      index_.emplace(token.content, impl_->added.size());
      impl_->added.push_back(token);
    }
    if (token.id != declared) {
      LogWarning(
          "{}: added token '{}' is declared with id {} but gets id {} (as Hugging Face "
          "assigns ids)",
          where, token.content, declared, token.id);
    }
  }

  // The id of the added token with this content.
  std::optional<int32_t> IdOf(const std::string& content) const {
    const auto it = index_.find(content);
    if (it == index_.end()) return std::nullopt;
    return impl_->added[it->second].id;
  }

 private:
  const BpeModel& model_;
  Tokenizer::Impl* impl_;
  std::unordered_map<std::string, size_t> index_;  // content -> index into impl_->added
  std::optional<int32_t> max_id_;
};

Status ParseAddedTokens(const Json& root, AddedTokenCollector* collector) {
  const Json* list = Member(root, "added_tokens");
  if (list == nullptr) return OkStatus();
  if (!list->is_array()) return WrongType("added_tokens", "an array", *list);
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string where = fmt::format("added_tokens[{}]", i);
    ASSIGN_OR_RETURN(AddedToken token, ParseAddedToken((*list)[i], where));
    const Json* id = Member((*list)[i], "id");
    if (id == nullptr) return InvalidArgument("{}: missing \"id\"", where);
    ASSIGN_OR_RETURN(token.id, GetId(*id, where + ".id"));
    if (token.content.empty()) continue;  // Hugging Face ignores empty added tokens
    collector->Add(std::move(token), "tokenizer.json: " + where);
  }
  return OkStatus();
}

// ---- tokenizer_config.json ----

// A special token entry: "<|im_end|>", {"content": "<|im_end|>", ...}, or null.
Result<std::optional<std::string>> TokenName(const Json* v, const std::string& where) {
  if (v == nullptr) return std::optional<std::string>();
  if (v->is_string()) return std::optional<std::string>(v->get<std::string>());
  if (v->is_object()) {
    ASSIGN_OR_RETURN(std::string content, GetString(*v, "content", where));
    return std::optional<std::string>(std::move(content));
  }
  return WrongType(where, "a string or an object with \"content\"", *v);
}

Status ParseConfig(const Json& config, const BpeModel& model, AddedTokenCollector* collector,
                   Tokenizer::Impl* impl) {
  if (!config.is_object()) return WrongType("the top level", "an object", config);
  if (const Json* decoder = Member(config, "added_tokens_decoder"); decoder != nullptr) {
    if (!decoder->is_object()) return WrongType("added_tokens_decoder", "an object", *decoder);
    // transformers adds them in id order (the JSON object's own order is by key string).
    std::vector<std::pair<int32_t, AddedToken>> entries;
    for (const auto& [key, value] : decoder->items()) {
      const std::string where = fmt::format("added_tokens_decoder[\"{}\"]", key);
      ASSIGN_OR_RETURN(AddedToken token, ParseAddedToken(value, where));
      size_t used = 0;
      int64_t id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != key.size() || key.empty() || id < 0 || id > INT32_MAX) {
        return InvalidArgument("{}: the key is not a token id", where);
      }
      token.id = static_cast<int32_t>(id);
      entries.emplace_back(token.id, std::move(token));
    }
    std::stable_sort(entries.begin(), entries.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [id, token] : entries) {
      if (token.content.empty()) continue;
      collector->Add(std::move(token),
                     fmt::format("tokenizer_config.json: added_tokens_decoder[\"{}\"]", id));
    }
  }
  const auto resolve = [&](const std::string& name, const std::string& where) -> Result<int32_t> {
    if (const std::optional<int32_t> id = collector->IdOf(name)) return *id;
    if (const std::optional<int32_t> id = model.TokenToId(name)) return *id;
    return InvalidArgument("{}: '{}' is not in the vocabulary", where, name);
  };
  const std::pair<const char*, std::optional<NamedToken>*> named[] = {{"bos_token", &impl->bos},
                                                                      {"eos_token", &impl->eos},
                                                                      {"pad_token", &impl->pad},
                                                                      {"unk_token", &impl->unk}};
  for (const auto& [key, out] : named) {
    ASSIGN_OR_RETURN(const std::optional<std::string> name, TokenName(Member(config, key), key));
    if (!name.has_value()) continue;
    ASSIGN_OR_RETURN(const int32_t id, resolve(*name, key));
    *out = NamedToken{*name, id};
  }
  if (const Json* list = Member(config, "additional_special_tokens"); list != nullptr) {
    if (!list->is_array()) return WrongType("additional_special_tokens", "an array", *list);
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string where = fmt::format("additional_special_tokens[{}]", i);
      ASSIGN_OR_RETURN(const std::optional<std::string> name, TokenName(&(*list)[i], where));
      if (name.has_value()) impl->additional_special_tokens.push_back(*name);
    }
  }
  return OkStatus();
}

// ---- tables ----

Status Finish(Tokenizer::Impl* impl) {
  const BpeModel& model = *impl->model;
  int32_t limit = model.id_limit();
  size_t outside_vocab = 0;
  for (const AddedToken& t : impl->added) {
    limit = std::max(limit, t.id + 1);
    if (!model.TokenToId(t.content).has_value()) ++outside_vocab;
  }
  impl->vocab_size = model.size() + outside_vocab;
  impl->added_index.assign(static_cast<size_t>(limit), -1);
  for (size_t i = 0; i < impl->added.size(); ++i) {
    impl->added_index[impl->added[i].id] = static_cast<int32_t>(i);
    impl->added_ids[impl->added[i].content] = impl->added[i].id;
  }
  for (const int32_t id : impl->template_prefix) {
    if (id >= limit) return InvalidArgument("post_processor: template id {} is not a token", id);
  }
  for (const int32_t id : impl->template_suffix) {
    if (id >= limit) return InvalidArgument("post_processor: template id {} is not a token", id);
  }

  // The text Hugging Face gives for an added token's id: normalized tokens come out normalized.
  std::unordered_set<std::string> special_contents;
  impl->added_text.clear();
  for (const AddedToken& t : impl->added) {
    if (t.special) special_contents.insert(t.content);
    std::string scratch;
    std::string_view text = t.content;
    if (t.normalized) {
      ASSIGN_OR_RETURN(text, impl->normalizer.Normalize(t.content, &scratch));
    }
    impl->added_text.emplace_back(text);
  }

  // What each id decodes to: the ByteLevel decoder turns a token's characters back into bytes
  // when all of them are in the byte-level alphabet, and keeps the token's own UTF-8 otherwise
  // (added tokens such as "<|im_end|>" take the first path and come out unchanged).
  impl->id_flags.assign(static_cast<size_t>(limit), 0);
  impl->decode_offsets.assign(static_cast<size_t>(limit) + 1, 0);
  for (int32_t id = 0; id < limit; ++id) {
    std::optional<std::string_view> token;
    uint8_t flags = Tokenizer::Impl::kIdPresent;
    if (impl->added_index[id] >= 0) {
      token = impl->added_text[impl->added_index[id]];
      // Hugging Face skips a token when its text is the content of a special token.
      if (special_contents.count(std::string(*token)) > 0) flags |= Tokenizer::Impl::kIdSpecial;
    } else {
      token = model.IdToToken(id);
    }
    if (token.has_value()) {
      impl->id_flags[id] = flags;
      if (std::optional<std::string> bytes = ByteLevelToBytes(*token)) {
        impl->decode_bytes += *bytes;
      } else {
        impl->decode_bytes += *token;
      }
    }
    impl->decode_offsets[id + 1] = static_cast<uint32_t>(impl->decode_bytes.size());
  }

  std::vector<const AddedToken*> raw;
  std::vector<const AddedToken*> normalized;
  std::vector<std::string> raw_patterns;
  std::vector<std::string> normalized_patterns;
  for (const AddedToken& t : impl->added) {
    if (!t.normalized) {
      raw.push_back(&t);
      raw_patterns.push_back(t.content);
      continue;
    }
    // Normalized tokens are looked for in normalized text, so by their normalized content.
    std::string scratch;
    ASSIGN_OR_RETURN(const std::string_view pattern,
                     impl->normalizer.Normalize(t.content, &scratch));
    normalized.push_back(&t);
    normalized_patterns.emplace_back(pattern);
  }
  impl->raw_matcher = AddedTokenMatcher(std::move(raw), raw_patterns);
  impl->normalized_matcher = AddedTokenMatcher(std::move(normalized), normalized_patterns);
  return OkStatus();
}

Result<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!std::filesystem::exists(path)) return NotFound("{}: no such file", path.string());
    return IoError("{}: cannot open", path.string());
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return IoError("{}: read failed", path.string());
  return std::move(buffer).str();
}

// Parses tokenizer.json's components (all but the added tokens) into impl.
Status ParseComponents(const Json& root, const TokenizerOptions& options, Tokenizer::Impl* impl) {
  if (!root.is_object()) return WrongType("the top level", "an object", root);
  ASSIGN_OR_RETURN(BpeConfig bpe, ParseModel(root, options));
  ASSIGN_OR_RETURN(impl->model, BpeModel::Create(std::move(bpe)));
  std::vector<NormalizationForm> forms;
  if (const Json* normalizer = Member(root, "normalizer"); normalizer != nullptr) {
    RETURN_IF_ERROR(ParseNormalizer(*normalizer, "normalizer", &forms));
  }
  impl->normalizer = Normalizer(std::move(forms));
  ASSIGN_OR_RETURN(impl->pre_tokenizer, BuildPreTokenizer(root));
  if (const Json* post = Member(root, "post_processor"); post != nullptr) {
    bool seen_template = false;
    RETURN_IF_ERROR(ParsePostProcessor(*post, "post_processor", impl, &seen_template));
  }
  return CheckDecoder(root);
}

Result<std::unique_ptr<Tokenizer::Impl>> BuildImpl(std::string_view tokenizer_json,
                                                   std::string_view config_json,
                                                   const TokenizerOptions& options) {
  auto impl = std::make_unique<Tokenizer::Impl>();
  // The accessors above check types before reading; the catch is a backstop, since no exception
  // may leave this module.
  try {
    Result<Json> root = ParseJson(tokenizer_json);
    Status s = root.ok() ? ParseComponents(*root, options, impl.get()) : root.status();
    if (!s.ok()) return s.WithContext("tokenizer.json");
    AddedTokenCollector collector(*impl->model, impl.get());
    if (s = ParseAddedTokens(*root, &collector); !s.ok()) return s.WithContext("tokenizer.json");
    if (!config_json.empty()) {
      Result<Json> config = ParseJson(config_json);
      s = config.ok() ? ParseConfig(*config, *impl->model, &collector, impl.get())
                      : config.status();
      if (!s.ok()) return s.WithContext("tokenizer_config.json");
    }
  } catch (const Json::exception& e) {
    return InvalidArgument("unexpected JSON structure: {}", e.what());
  }
  if (Status s = Finish(impl.get()); !s.ok()) return s.WithContext("tokenizer.json");
  return impl;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view tokenizer_json,
                                                       std::string_view tokenizer_config_json,
                                                       const TokenizerOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl,
                   BuildImpl(tokenizer_json, tokenizer_config_json, options));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::LoadFromDir(const std::string& dir,
                                                          const TokenizerOptions& options) {
  const std::filesystem::path folder(dir);
  ASSIGN_OR_RETURN(const std::string tokenizer_json, ReadFile(folder / "tokenizer.json"));
  std::string config_json;
  if (std::filesystem::exists(folder / "tokenizer_config.json")) {
    ASSIGN_OR_RETURN(config_json, ReadFile(folder / "tokenizer_config.json"));
  }
  Result<std::unique_ptr<Tokenizer>> tokenizer = FromJson(tokenizer_json, config_json, options);
  if (!tokenizer.ok()) return tokenizer.status().WithContext(dir);
  return tokenizer;
}

}  // namespace moeserve::tokenizer
