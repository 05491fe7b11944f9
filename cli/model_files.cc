#include "cli/model_files.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/json.h"
#include "io/gguf.h"
#include "model/model_files.h"
#include "tokenizer/gguf_tokenizer.h"

namespace moeserve::cli {

using nlohmann::json;

Result<std::string> ReadTextFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError("cannot open {}", path);
  if (max_bytes == std::numeric_limits<size_t>::max()) {
    std::ostringstream text;
    text << in.rdbuf();
    if (in.bad()) return IoError("reading {} failed", path);
    return std::move(text).str();
  }
  std::string text;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof(buffer)) || in.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
    if (text.size() > max_bytes) {
      return InvalidArgument("{} holds more than {} bytes", path, max_bytes);
    }
  }
  if (in.bad()) return IoError("reading {} failed", path);
  return text;
}

namespace {

Result<tokenizer::GgufTokenizer> OpenGgufTokenizer(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<io::GgufFile> file, io::GgufFile::Open(path));
  return tokenizer::LoadGgufTokenizer(*file);
}

// LoadChatTemplate for a GGUF file read as `g`: tokenizer.chat_template, or `file` with its special
// tokens.
Result<std::optional<tokenizer::ChatTemplate>> GgufChatTemplate(tokenizer::GgufTokenizer& g,
                                                                const std::string& file) {
  if (file.empty()) {
    if (!g.chat_template_status.ok()) return g.chat_template_status;
    return std::move(g.chat_template);
  }
  Result<std::string> source = ReadTextFile(file);
  if (!source.ok()) return source.status().WithContext("--chat-template");
  Result<tokenizer::ChatTemplate> chat = g.WithChatTemplate(*source);
  if (!chat.ok()) return chat.status().WithContext("--chat-template " + file);
  return std::optional<tokenizer::ChatTemplate>(std::move(*chat));
}

}  // namespace

Result<std::unique_ptr<tokenizer::Tokenizer>> LoadModelTokenizer(const std::string& path) {
  if (!model::IsGgufModel(path)) return tokenizer::Tokenizer::LoadFromDir(path);
  ASSIGN_OR_RETURN(tokenizer::GgufTokenizer g, OpenGgufTokenizer(path));
  return std::move(g.tokenizer);
}

Result<std::optional<tokenizer::ChatTemplate>> LoadChatTemplate(const std::string& dir,
                                                                const std::string& file) {
  if (model::IsGgufModel(dir)) {
    ASSIGN_OR_RETURN(tokenizer::GgufTokenizer g, OpenGgufTokenizer(dir));
    return GgufChatTemplate(g, file);
  }
  std::optional<tokenizer::ChatTemplate> from_config;
  const std::string config_path = dir + "/tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    ASSIGN_OR_RETURN(const std::string config, ReadTextFile(config_path));
    Result<tokenizer::ChatTemplate> parsed = tokenizer::ChatTemplate::FromTokenizerConfig(config);
    // With --chat-template only the config's special tokens are used: its own template may be
    // broken or missing then.
    if (parsed.ok()) {
      from_config = std::move(*parsed);
    } else if (file.empty()) {
      return parsed.status().WithContext(config_path);
    }
  }
  if (file.empty()) return from_config;
  Result<std::string> source = ReadTextFile(file);
  if (!source.ok()) return source.status().WithContext("--chat-template");
  Result<tokenizer::ChatTemplate> chat =
      from_config ? from_config->WithTemplate(*source) : tokenizer::ChatTemplate::Parse(*source);
  if (!chat.ok()) return chat.status().WithContext("--chat-template " + file);
  return std::optional<tokenizer::ChatTemplate>(std::move(*chat));
}

Result<ModelTokenizer> LoadModelTokenizerAndTemplate(const std::string& dir,
                                                     const std::string& file) {
  ModelTokenizer out;
  if (model::IsGgufModel(dir)) {
    ASSIGN_OR_RETURN(tokenizer::GgufTokenizer g, OpenGgufTokenizer(dir));
    out.chat_template = GgufChatTemplate(g, file);
    out.tokenizer = std::move(g.tokenizer);
    return out;
  }
  ASSIGN_OR_RETURN(out.tokenizer, tokenizer::Tokenizer::LoadFromDir(dir));
  out.chat_template = LoadChatTemplate(dir, file);
  return out;
}

Result<tokenizer::ChatTemplate> RequireChatTemplate(const std::string& dir,
                                                    const std::string& file) {
  return RequiredChatTemplate(dir, LoadChatTemplate(dir, file));
}

Result<tokenizer::ChatTemplate> RequiredChatTemplate(
    const std::string& dir, Result<std::optional<tokenizer::ChatTemplate>> loaded) {
  ASSIGN_OR_RETURN(std::optional<tokenizer::ChatTemplate> chat, std::move(loaded));
  if (!chat) {
    return NotFound("{} has no {} with a chat template (--chat-template FILE gives one)", dir,
                    model::IsGgufModel(dir) ? "tokenizer.chat_template" : "tokenizer_config.json");
  }
  return *std::move(chat);
}

std::vector<std::string> GenerationConfig::ApplyTo(engine::SamplingParams* p,
                                                   const std::vector<std::string>& keep) const {
  std::vector<std::string> applied;
  const auto take = [&](const char* key, const auto& value, auto* out) {
    if (!value || std::count(keep.begin(), keep.end(), key)) return;
    *out = *value;
    applied.push_back(fmt::format("{}={}", key, *value));
  };
  take("temperature", temperature, &p->temperature);
  take("top_p", top_p, &p->top_p);
  take("top_k", top_k, &p->top_k);
  take("min_p", min_p, &p->min_p);
  take("repetition_penalty", repetition_penalty, &p->repetition_penalty);
  return applied;
}

std::vector<int32_t> GenerationConfig::ExtraEosIds(std::span<const int64_t> model_eos_ids) const {
  std::vector<int32_t> extra;
  for (int32_t id : eos_token_ids) {
    if (std::count(model_eos_ids.begin(), model_eos_ids.end(), id) == 0) extra.push_back(id);
  }
  return extra;
}

Result<GenerationConfig> LoadGenerationConfig(const std::string& dir) {
  GenerationConfig g;
  const std::string path = dir + "/generation_config.json";
  if (!std::filesystem::exists(path)) return g;
  ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
  ASSIGN_OR_RETURN(const json j, ParseJson(text, path));
  if (!j.is_object()) return InvalidArgument("{}: not a JSON object", path);
  const auto number = [&](const char* key, std::optional<double>* out) -> Status {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return OkStatus();
    if (!it->is_number()) return InvalidArgument("{}: \"{}\" is not a number", path, key);
    *out = it->get<double>();
    return OkStatus();
  };
  const auto integer = [&](const char* key, std::optional<int64_t>* out) -> Status {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return OkStatus();
    if (!it->is_number_integer()) return InvalidArgument("{}: \"{}\" is not an integer", path, key);
    *out = it->get<int64_t>();
    return OkStatus();
  };
  RETURN_IF_ERROR(number("temperature", &g.temperature));
  RETURN_IF_ERROR(number("top_p", &g.top_p));
  RETURN_IF_ERROR(number("min_p", &g.min_p));
  RETURN_IF_ERROR(number("repetition_penalty", &g.repetition_penalty));
  RETURN_IF_ERROR(integer("top_k", &g.top_k));
  RETURN_IF_ERROR(integer("max_new_tokens", &g.max_new_tokens));
  if (const auto eos = j.find("eos_token_id"); eos != j.end() && !eos->is_null()) {
    const json ids = eos->is_array() ? *eos : json::array({*eos});
    for (const json& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return InvalidArgument("{}: \"eos_token_id\" must be token ids", path);
      }
      g.eos_token_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  return g;
}

}  // namespace moeserve::cli
