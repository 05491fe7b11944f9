#include "tokenizer/gguf_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/json.h"
#include "core/log.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {
namespace {

using io::GgufType;
using io::GgufValue;
// ordered_json keeps the synthesized files in the order Hugging Face writes them.
using Json = nlohmann::ordered_json;

constexpr char kModelKey[] = "tokenizer.ggml.model";
constexpr char kPreKey[] = "tokenizer.ggml.pre";
constexpr char kTokensKey[] = "tokenizer.ggml.tokens";
constexpr char kTokenTypeKey[] = "tokenizer.ggml.token_type";
constexpr char kMergesKey[] = "tokenizer.ggml.merges";
constexpr char kAddBosKey[] = "tokenizer.ggml.add_bos_token";
constexpr char kAddEosKey[] = "tokenizer.ggml.add_eos_token";
constexpr char kChatTemplateKey[] = "tokenizer.chat_template";

// Names (model, pre) are short; this bounds what an error message quotes.
constexpr size_t kMaxNameBytes = 256;

// gguf-py's TokenType (constants.py).
enum TokenType : int64_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// What a tokenizer.ggml.pre name stands for: the components of the family's tokenizer.json.
struct PreTokenizerSpec {
  std::string_view name;
  const char* split_pattern;
  bool nfc;              // normalizer NFC (else none)
  bool ignore_merges;    // model.ignore_merges
  bool default_add_bos;  // add_bos_token when the file does not say (llama.cpp's default)
};

constexpr PreTokenizerSpec kPreTokenizers[] = {
    {"qwen2", kQwen2SplitPattern, true, false, false},
    {"qwen35", kQwen35SplitPattern, true, false, false},
    {"llama-bpe", kLlama3SplitPattern, false, true, true},
    // Other names llama.cpp accepts for Llama 3's pre-tokenizer (llama-vocab.cpp).
    {"llama3", kLlama3SplitPattern, false, true, true},
    {"llama-v3", kLlama3SplitPattern, false, true, true},
};
constexpr char kPreTokenizerNames[] = "qwen2, qwen35, llama-bpe";

// The named special tokens: the GGUF key, the tokenizer_config.json field it becomes ("" for
// those that only stop generation), and whether it is needed (an id naming a padding entry is
// then an error; the others are dropped with a warning).
struct NamedId {
  const char* key;
  const char* config_field;
  bool needed;
};
constexpr NamedId kBos = {"tokenizer.ggml.bos_token_id", "bos_token", true};
constexpr NamedId kEos = {"tokenizer.ggml.eos_token_id", "eos_token", true};
constexpr NamedId kEot = {"tokenizer.ggml.eot_token_id", "", true};
constexpr NamedId kEom = {"tokenizer.ggml.eom_token_id", "", true};
constexpr NamedId kOtherIds[] = {
    {"tokenizer.ggml.padding_token_id", "pad_token", false},
    {"tokenizer.ggml.unknown_token_id", "unk_token", false},
    {"tokenizer.ggml.seperator_token_id", "sep_token", false},
    {"tokenizer.ggml.mask_token_id", "mask_token", false},
};

const char* TypeName(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
      return "uint8";
    case GgufType::kInt8:
      return "int8";
    case GgufType::kUint16:
      return "uint16";
    case GgufType::kInt16:
      return "int16";
    case GgufType::kUint32:
      return "uint32";
    case GgufType::kInt32:
      return "int32";
    case GgufType::kFloat32:
      return "float32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kUint64:
      return "uint64";
    case GgufType::kInt64:
      return "int64";
    case GgufType::kFloat64:
      return "float64";
  }
  return "unknown type";
}

// "a uint32", "an int32", "an array of string".
std::string Describe(const GgufValue& v) {
  if (v.type == GgufType::kArray) return fmt::format("an array of {}", TypeName(v.element_type));
  const char* name = TypeName(v.type);
  return fmt::format("{} {}", name[0] == 'i' || (name[0] == 'u' && name[1] == 'n') ? "an" : "a",
                     name);
}

bool IsStringType(GgufType type) { return type == GgufType::kString; }

bool IsIntegerType(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kUint16:
    case GgufType::kInt16:
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kUint64:
    case GgufType::kInt64:
      return true;
    default:
      return false;
  }
}

// A JSON integer as int64; nullopt for anything else (or an unsigned value past int64).
std::optional<int64_t> AsInt(const nlohmann::json& j) {
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (j.is_number_integer()) return j.get<int64_t>();
  return std::nullopt;
}

// `s` for an error message: JSON-quoted, cut after 64 bytes; file bytes that are not UTF-8 are
// not echoed.
std::string Quote(std::string_view s) {
  std::string_view shown = s.substr(0, 64);
  while (shown.size() < s.size() && !shown.empty() &&
         (static_cast<uint8_t>(s[shown.size()]) & 0xC0) == 0x80) {
    shown.remove_suffix(1);  // do not cut a character
  }
  if (FindInvalidUtf8(shown) != std::string_view::npos) {
    return fmt::format("({} bytes, not UTF-8)", s.size());
  }
  std::string quoted = nlohmann::json(std::string(shown)).dump();
  if (shown.size() < s.size()) quoted += fmt::format("... ({} bytes)", s.size());
  return quoted;
}

const GgufValue* Find(const GgufMetadata& m, std::string_view key) {
  const auto it = m.find(key);
  return it == m.end() ? nullptr : &it->second;
}

// A string value of at most max_bytes bytes of UTF-8 (the synthesized files are JSON); nullptr
// when the key is absent.
Result<const std::string*> GetString(const GgufMetadata& m, const char* key, size_t max_bytes) {
  const GgufValue* v = Find(m, key);
  if (v == nullptr) return static_cast<const std::string*>(nullptr);
  if (v->type != GgufType::kString || !v->value.is_string()) {
    return InvalidArgument("{}: expected a string, found {}", key, Describe(*v));
  }
  const std::string& s = v->value.get_ref<const std::string&>();
  if (s.size() > max_bytes) {
    return InvalidArgument("{}: {} bytes, more than the {} allowed", key, s.size(), max_bytes);
  }
  if (const size_t bad = FindInvalidUtf8(s); bad != std::string::npos) {
    return InvalidArgument("{}: not valid UTF-8 (at byte {})", key, bad);
  }
  return &s;
}

// An array whose elements are of a type `element_ok` accepts, at most max_size long.
Result<const nlohmann::json*> GetArray(const GgufMetadata& m, const char* key,
                                       bool (*element_ok)(GgufType), const char* expected,
                                       size_t max_size) {
  const GgufValue* v = Find(m, key);
  if (v == nullptr) return NotFound("{}: missing", key);
  if (v->type != GgufType::kArray || !element_ok(v->element_type) || !v->value.is_array()) {
    return InvalidArgument("{}: expected {}, found {}", key, expected, Describe(*v));
  }
  if (v->value.size() > max_size) {
    return InvalidArgument("{}: {} entries, more than the {} allowed", key, v->value.size(),
                           max_size);
  }
  return &v->value;
}

Result<std::optional<bool>> GetBool(const GgufMetadata& m, const char* key) {
  const GgufValue* v = Find(m, key);
  if (v == nullptr) return std::optional<bool>();
  if (v->type != GgufType::kBool || !v->value.is_boolean()) {
    return InvalidArgument("{}: expected a bool, found {}", key, Describe(*v));
  }
  return std::optional<bool>(v->value.get<bool>());
}

// The vocabulary as the file lists it, checked.
struct Vocab {
  const PreTokenizerSpec* pre = nullptr;
  std::vector<std::string_view> tokens;  // by id
  std::vector<TokenType> types;          // by id
  std::vector<std::pair<std::string_view, std::string_view>> merges;
  std::vector<bool> merged_from;  // by id: a merge names the token (as a part or its result)
  bool add_bos = false;
  bool add_eos = false;
  // The named ids that are kept (-1: none), in NamedId order: bos, eos, eot, eom, then kOtherIds.
  std::vector<std::pair<NamedId, int32_t>> ids;
  const std::string* chat_template = nullptr;

  int32_t Id(const NamedId& named) const {
    for (const auto& [n, id] : ids) {
      if (std::strcmp(n.key, named.key) == 0) return id;
    }
    return -1;
  }
};

Status ReadTokens(const GgufMetadata& m, Vocab* vocab,
                  std::unordered_map<std::string_view, int32_t>* index) {
  ASSIGN_OR_RETURN(const nlohmann::json* tokens,
                   GetArray(m, kTokensKey, IsStringType, "an array of strings", kMaxGgufTokens));
  if (tokens->empty()) return InvalidArgument("{}: empty", kTokensKey);
  ASSIGN_OR_RETURN(const nlohmann::json* types, GetArray(m, kTokenTypeKey, IsIntegerType,
                                                         "an array of integers", kMaxGgufTokens));
  if (types->size() != tokens->size()) {
    return InvalidArgument("{} has {} entries but {} has {}", kTokenTypeKey, types->size(),
                           kTokensKey, tokens->size());
  }
  const size_t n = tokens->size();
  vocab->tokens.reserve(n);
  vocab->types.reserve(n);
  index->reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const nlohmann::json& token = (*tokens)[i];
    const std::optional<int64_t> type = AsInt((*types)[i]);
    if (!token.is_string()) return InvalidArgument("{}[{}]: not a string", kTokensKey, i);
    if (!type.has_value() || *type < kNormal || *type > kByte) {
      return InvalidArgument(
          "{}[{}]: {} is not a token type (1 normal, 2 unknown, 3 control, 4 user-defined, "
          "5 unused, 6 byte)",
          kTokenTypeKey, i, (*types)[i].dump());
    }
    if (*type == kUnknown || *type == kByte) {
      return Unimplemented("{}[{}]: type {} ({}) does not occur in a byte-level BPE vocabulary",
                           kTokenTypeKey, i, *type, *type == kUnknown ? "unknown" : "byte");
    }
    const std::string& text = token.get_ref<const std::string&>();
    vocab->tokens.push_back(text);
    vocab->types.push_back(static_cast<TokenType>(*type));
    if (*type == kUnused) continue;  // a padding entry: no token has this id
    if (text.empty()) return InvalidArgument("{}[{}]: an empty token", kTokensKey, i);
    if (text.size() > kMaxGgufTokenBytes) {
      return InvalidArgument("{}[{}]: {} bytes, more than the {} allowed", kTokensKey, i,
                             text.size(), kMaxGgufTokenBytes);
    }
    if (const size_t bad = FindInvalidUtf8(text); bad != std::string::npos) {
      return InvalidArgument("{}[{}]: not valid UTF-8 (at byte {})", kTokensKey, i, bad);
    }
    const auto [it, inserted] = index->emplace(text, static_cast<int32_t>(i));
    if (!inserted) {
      return InvalidArgument("{}[{}]: {} is also {}[{}]", kTokensKey, i, Quote(text), kTokensKey,
                             it->second);
    }
  }
  return OkStatus();
}

Status ReadMerges(const GgufMetadata& m, const std::unordered_map<std::string_view, int32_t>& index,
                  Vocab* vocab) {
  ASSIGN_OR_RETURN(const nlohmann::json* merges,
                   GetArray(m, kMergesKey, IsStringType, "an array of strings", kMaxGgufMerges));
  vocab->merges.reserve(merges->size());
  vocab->merged_from.assign(vocab->tokens.size(), false);
  std::string merged;
  for (size_t i = 0; i < merges->size(); ++i) {
    const nlohmann::json& entry = (*merges)[i];
    if (!entry.is_string()) return InvalidArgument("{}[{}]: not a string", kMergesKey, i);
    const std::string& text = entry.get_ref<const std::string&>();
    if (text.size() > 2 * kMaxGgufTokenBytes + 1) {
      return InvalidArgument("{}[{}]: {} bytes, longer than two tokens can be", kMergesKey, i,
                             text.size());
    }
    // "left right": split at the first space after the first byte (as llama.cpp splits them).
    const size_t space = text.find(' ', 1);
    if (space == std::string::npos || space + 1 == text.size()) {
      return InvalidArgument("{}[{}]: {} is not two tokens separated by a space", kMergesKey, i,
                             Quote(text));
    }
    const std::string_view left = std::string_view(text).substr(0, space);
    const std::string_view right = std::string_view(text).substr(space + 1);
    merged.assign(left).append(right);
    for (const std::string_view part : {left, right, std::string_view(merged)}) {
      const auto it = index.find(part);
      if (it == index.end()) {
        return InvalidArgument("{}[{}]: {}: {} is not a token of {}", kMergesKey, i, Quote(text),
                               Quote(part), kTokensKey);
      }
      vocab->merged_from[it->second] = true;
    }
    vocab->merges.emplace_back(left, right);
  }
  return OkStatus();
}

// The named ids: in range, and not padding entries.
Status ReadIds(const GgufMetadata& m, Vocab* vocab) {
  std::vector<NamedId> all = {kBos, kEos, kEot, kEom};
  all.insert(all.end(), std::begin(kOtherIds), std::end(kOtherIds));
  for (const NamedId& named : all) {
    const GgufValue* v = Find(m, named.key);
    int32_t id = -1;
    if (v != nullptr) {
      if (!IsIntegerType(v->type) || !v->value.is_number_integer()) {
        return InvalidArgument("{}: expected an integer, found {}", named.key, Describe(*v));
      }
      const std::optional<int64_t> value = AsInt(v->value);
      if (!value.has_value() || *value < 0 ||
          *value >= static_cast<int64_t>(vocab->tokens.size())) {
        return InvalidArgument("{}: id {} is out of range ({} has {} tokens)", named.key,
                               v->value.dump(), kTokensKey, vocab->tokens.size());
      }
      id = static_cast<int32_t>(*value);
      if (vocab->types[id] == kUnused) {
        if (named.needed) {
          return InvalidArgument("{}: id {} is an unused padding entry of {}", named.key, id,
                                 kTokensKey);
        }
        LogWarning("{}: id {} is an unused padding entry of {}: ignored", named.key, id,
                   kTokensKey);
        id = -1;
      }
    }
    vocab->ids.emplace_back(named, id);
  }
  return OkStatus();
}

Result<Vocab> ReadVocab(const GgufMetadata& m) {
  Vocab vocab;
  ASSIGN_OR_RETURN(const std::string* model, GetString(m, kModelKey, kMaxNameBytes));
  if (model == nullptr) return NotFound("{}: missing (the file holds no tokenizer)", kModelKey);
  if (*model != "gpt2") {
    return Unimplemented("{} {} is not implemented (only gpt2: byte-level BPE)", kModelKey,
                         Quote(*model));
  }
  ASSIGN_OR_RETURN(const std::string* pre, GetString(m, kPreKey, kMaxNameBytes));
  if (pre == nullptr) return NotFound("{}: missing ({})", kPreKey, kPreTokenizerNames);
  for (const PreTokenizerSpec& spec : kPreTokenizers) {
    if (*pre == spec.name) vocab.pre = &spec;
  }
  if (vocab.pre == nullptr) {
    return Unimplemented("{} {} is not implemented ({})", kPreKey, Quote(*pre), kPreTokenizerNames);
  }
  std::unordered_map<std::string_view, int32_t> index;  // token -> id, without padding entries
  RETURN_IF_ERROR(ReadTokens(m, &vocab, &index));
  RETURN_IF_ERROR(ReadMerges(m, index, &vocab));
  RETURN_IF_ERROR(ReadIds(m, &vocab));

  ASSIGN_OR_RETURN(const std::optional<bool> add_bos, GetBool(m, kAddBosKey));
  ASSIGN_OR_RETURN(const std::optional<bool> add_eos, GetBool(m, kAddEosKey));
  vocab.add_bos = add_bos.value_or(vocab.pre->default_add_bos);
  vocab.add_eos = add_eos.value_or(false);
  if (vocab.add_bos && vocab.Id(kBos) < 0) {
    if (add_bos.has_value()) {
      return InvalidArgument("{} is true but there is no {}", kAddBosKey, kBos.key);
    }
    return InvalidArgument("{} {} adds a BOS token unless {} says otherwise, but there is no {}",
                           kPreKey, Quote(*pre), kAddBosKey, kBos.key);
  }
  if (vocab.add_eos && vocab.Id(kEos) < 0) {
    return InvalidArgument("{} is true but there is no {}", kAddEosKey, kEos.key);
  }
  ASSIGN_OR_RETURN(vocab.chat_template, GetString(m, kChatTemplateKey, kMaxGgufChatTemplateBytes));
  return vocab;
}

// Which tokens go into the BPE model's vocabulary (model.vocab); the added tokens (control and
// user-defined) are listed in added_tokens as well. Hugging Face numbers the added tokens that
// are not in the model's vocabulary itself, from the size of that vocabulary up, in order, so
// the file's ids come back only when those are exactly the ones at its end. That is how the
// converter's files are laid out (the ids it writes are Hugging Face's): the model's vocabulary
// holds the normal tokens and the added tokens among them or that a merge needs. A file laid out
// otherwise gets every added token into the model's vocabulary too, which keeps every id.
std::vector<bool> InModelVocab(const Vocab& vocab) {
  const size_t n = vocab.tokens.size();
  std::vector<bool> in_model(n, false);
  size_t last_normal = 0;
  for (size_t i = 0; i < n; ++i) {
    if (vocab.types[i] == kNormal) {
      in_model[i] = true;
      last_normal = i;
    }
  }
  size_t model_size = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool added = vocab.types[i] == kControl || vocab.types[i] == kUserDefined;
    if (added && (vocab.merged_from[i] || i < last_normal)) in_model[i] = true;
    if (in_model[i]) ++model_size;
  }
  size_t next = model_size;
  bool numbered_alike = true;
  for (size_t i = 0; i < n; ++i) {
    if (vocab.types[i] == kUnused || in_model[i]) continue;
    if (i != next++) numbered_alike = false;
  }
  if (!numbered_alike) {
    for (size_t i = 0; i < n; ++i) in_model[i] = vocab.types[i] != kUnused;
  }
  return in_model;
}

Json PostProcessor(const Vocab& vocab) {
  if (!vocab.add_bos && !vocab.add_eos) return ByteLevelStepJson();
  Json single = Json::array();
  Json special_tokens = Json::object();
  const auto add = [&](int32_t id) {
    const std::string content(vocab.tokens[id]);
    single.push_back(Json{{"SpecialToken", Json{{"id", content}, {"type_id", 0}}}});
    special_tokens[content] =
        Json{{"id", content}, {"ids", Json::array({id})}, {"tokens", Json::array({content})}};
  };
  if (vocab.add_bos) add(vocab.Id(kBos));
  single.push_back(Json{{"Sequence", Json{{"id", "A"}, {"type_id", 0}}}});
  if (vocab.add_eos) add(vocab.Id(kEos));
  Json j;
  j["type"] = "TemplateProcessing";
  j["single"] = std::move(single);
  j["special_tokens"] = std::move(special_tokens);
  return j;
}

std::string TokenizerJson(const Vocab& vocab) {
  const std::vector<bool> in_model = InModelVocab(vocab);
  Json root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  Json added = Json::array();
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    if (vocab.types[i] != kControl && vocab.types[i] != kUserDefined) continue;
    Json t;
    t["id"] = i;
    t["content"] = vocab.tokens[i];
    t["single_word"] = false;
    t["lstrip"] = false;
    t["rstrip"] = false;
    t["normalized"] = false;
    t["special"] = vocab.types[i] == kControl;
    added.push_back(std::move(t));
  }
  root["added_tokens"] = std::move(added);
  root["normalizer"] = vocab.pre->nfc ? Json{{"type", "NFC"}} : Json(nullptr);

  Json split;
  split["type"] = "Split";
  split["pattern"] = Json{{"Regex", vocab.pre->split_pattern}};
  split["behavior"] = "Isolated";
  split["invert"] = false;
  Json pre;
  pre["type"] = "Sequence";
  pre["pretokenizers"] = Json::array({std::move(split), ByteLevelStepJson()});
  root["pre_tokenizer"] = std::move(pre);
  root["post_processor"] = PostProcessor(vocab);
  root["decoder"] = ByteLevelStepJson();

  Json model = BpeModelJson(vocab.pre->ignore_merges);
  // Entries go straight into the object's vector: ordered_json finds keys by linear search, so
  // inserting key by key would be quadratic. The tokens are distinct (ReadTokens checked).
  Json vocab_json = Json::object();
  Json::object_t::Container& entries = vocab_json.get_ref<Json::object_t&>();
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    if (in_model[i]) entries.emplace_back(std::string(vocab.tokens[i]), i);
  }
  model["vocab"] = std::move(vocab_json);
  Json merges = Json::array();
  merges.get_ref<Json::array_t&>().reserve(vocab.merges.size());
  for (const auto& [left, right] : vocab.merges) merges.push_back(Json::array({left, right}));
  model["merges"] = std::move(merges);
  root["model"] = std::move(model);
  return root.dump();
}

std::string TokenizerConfigJson(const Vocab& vocab) {
  Json config;
  config["add_bos_token"] = vocab.add_bos;
  config["add_eos_token"] = vocab.add_eos;
  for (const auto& [named, id] : vocab.ids) {
    if (id < 0 || *named.config_field == '\0') continue;
    // A bos_token the file names without adding it is config.json's (see the header).
    if (std::strcmp(named.key, kBos.key) == 0 && !vocab.add_bos) continue;
    config[named.config_field] = vocab.tokens[id];
  }
  if (vocab.chat_template != nullptr) config["chat_template"] = *vocab.chat_template;
  return config.dump();
}

// Each token of the file has its id in the built tokenizer (a check of the numbering above).
Status CheckIds(const Vocab& vocab, const Tokenizer& tokenizer) {
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    if (vocab.types[i] == kUnused) continue;
    const auto id = static_cast<int32_t>(i);
    if (tokenizer.IdToToken(id) != vocab.tokens[i] || tokenizer.TokenToId(vocab.tokens[i]) != id) {
      return InvalidArgument("{}[{}]: {} does not keep its id in the tokenizer built from it",
                             kTokensKey, i, Quote(vocab.tokens[i]));
    }
  }
  return OkStatus();
}

GgufTokenizerFiles Synthesize(const Vocab& vocab) {
  GgufTokenizerFiles files;
  files.tokenizer_json = TokenizerJson(vocab);
  files.tokenizer_config_json = TokenizerConfigJson(vocab);
  for (const NamedId& named : {kEos, kEot, kEom}) {
    const int32_t id = vocab.Id(named);
    if (id < 0) continue;
    if (std::find(files.eos_token_ids.begin(), files.eos_token_ids.end(), id) ==
        files.eos_token_ids.end()) {
      files.eos_token_ids.push_back(id);
    }
  }
  files.bos_token_id = vocab.Id(kBos);
  return files;
}

}  // namespace

Result<GgufTokenizerFiles> GgufTokenizerFilesFromMetadata(const GgufMetadata& metadata) {
  // Every value is checked before use; the catch is a backstop, since no exception may leave
  // this module.
  try {
    ASSIGN_OR_RETURN(const Vocab vocab, ReadVocab(metadata));
    return Synthesize(vocab);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("tokenizer metadata: unexpected structure: {}", e.what());
  }
}

Result<ChatTemplate> GgufTokenizer::WithChatTemplate(std::string source) const {
  ASSIGN_OR_RETURN(Json config,
                   ParseJson<Json>(files.tokenizer_config_json, "the synthesized config"));
  config["chat_template"] = std::move(source);
  return ChatTemplate::FromTokenizerConfig(config.dump());
}

Result<GgufTokenizer> LoadGgufTokenizer(const io::GgufFile& file, const TokenizerOptions& options) {
  GgufTokenizer out;
  try {
    Result<Vocab> vocab = ReadVocab(file.metadata());
    if (!vocab.ok()) return vocab.status().WithContext(file.path());
    out.files = Synthesize(*vocab);
    Result<std::unique_ptr<Tokenizer>> tokenizer =
        Tokenizer::FromJson(out.files.tokenizer_json, out.files.tokenizer_config_json, options);
    if (!tokenizer.ok()) {
      return tokenizer.status().WithContext(file.path() + ": the tokenizer of its metadata");
    }
    if (Status s = CheckIds(*vocab, **tokenizer); !s.ok()) return s.WithContext(file.path());
    out.tokenizer = std::move(*tokenizer);
    out.eos_token_ids = out.files.eos_token_ids;
    out.bos_token_id = out.files.bos_token_id;
    if (vocab->chat_template != nullptr) {
      Result<ChatTemplate> chat =
          ChatTemplate::FromTokenizerConfig(out.files.tokenizer_config_json);
      if (chat.ok()) {
        out.chat_template = std::move(*chat);
      } else {
        out.chat_template_status = chat.status().WithContext(file.path() + ": " + kChatTemplateKey);
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("{}: tokenizer metadata: unexpected structure: {}", file.path(),
                           e.what());
  }
  return out;
}

bool LooksSpecialToConverter(const std::string& t) {
  const auto wrapped = [&](std::string_view open, std::string_view close) {
    return t.size() >= open.size() + close.size() && t.starts_with(open) && t.ends_with(close);
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wrapped("<|", "|>") ||
         wrapped("<\uFF5C", "\uFF5C>") || wrapped("<unused", ">");
}

void AddGgufTokenizer(io::GgufWriter* w, const nlohmann::json& tok, const nlohmann::json& config, int vocab_size,
                      int config_bos_id, const std::string& pre) {
  std::map<int, std::string> by_id;
  for (const auto& [token, id] : tok["model"]["vocab"].items()) by_id[id.get<int>()] = token;
  std::map<int, bool> added;  // id -> special
  for (const nlohmann::json& t : tok["added_tokens"]) {
    by_id[t["id"].get<int>()] = t["content"].get<std::string>();
    added[t["id"].get<int>()] = t["special"].get<bool>();
  }
  nlohmann::json tokens = nlohmann::json::array();
  nlohmann::json types = nlohmann::json::array();
  for (int i = 0; i < vocab_size; ++i) {
    const auto it = by_id.find(i);
    if (it == by_id.end()) {
      tokens.push_back(fmt::format("[PAD{}]", i));
      types.push_back(5);  // UNUSED
    } else if (added.count(i) > 0) {
      // (The converter also writes non-normalized added tokens as decode(encode(token)): the
      // same text for these.)
      tokens.push_back(it->second);
      types.push_back(added[i] || LooksSpecialToConverter(it->second) ? 3 : 4);  // CONTROL, USER_DEFINED
    } else {
      tokens.push_back(it->second);
      types.push_back(1);  // NORMAL
    }
  }
  nlohmann::json merges = nlohmann::json::array();
  for (const nlohmann::json& m : tok["model"]["merges"]) {
    merges.push_back(m.is_string() ? m.get<std::string>()
                                   : m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  w->SetString("tokenizer.ggml.model", "gpt2");
  w->SetString("tokenizer.ggml.pre", pre);
  w->SetArray("tokenizer.ggml.tokens", io::GgufType::kString, std::move(tokens));
  w->SetArray("tokenizer.ggml.token_type", io::GgufType::kInt32, std::move(types));
  w->SetArray("tokenizer.ggml.merges", io::GgufType::kString, std::move(merges));
  // tokenizer_config.json's special tokens first (by their added token's id), then config.json's
  // ids for the ones still unset.
  const auto added_id = [&](const std::string& content) -> std::optional<int> {
    for (const nlohmann::json& t : tok["added_tokens"]) {
      if (t["content"] == content) return t["id"].get<int>();
    }
    return std::nullopt;
  };
  std::map<std::string, int> ids;
  for (const char* typ : {"bos", "eos", "unk", "sep", "pad"}) {
    const std::string field = std::string(typ) + "_token";
    if (!config.contains(field) || !config[field].is_string()) continue;
    if (std::optional<int> id = added_id(config[field].get<std::string>())) ids[typ] = *id;
  }
  if (ids.count("bos") == 0) ids["bos"] = config_bos_id;
  const std::map<std::string, std::string> keys = {{"bos", "bos_token_id"},
                                                   {"eos", "eos_token_id"},
                                                   {"unk", "unknown_token_id"},
                                                   {"sep", "seperator_token_id"},
                                                   {"pad", "padding_token_id"}};
  for (const auto& [typ, id] : ids) {
    w->SetU32("tokenizer.ggml." + keys.at(typ), static_cast<uint32_t>(id));
  }
  if (config.contains("add_bos_token")) {
    w->SetBool("tokenizer.ggml.add_bos_token", config["add_bos_token"].get<bool>());
  }
  if (config.contains("chat_template")) {
    w->SetString("tokenizer.chat_template", config["chat_template"].get<std::string>());
  }
}


}  // namespace moeserve::tokenizer
