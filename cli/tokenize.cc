// moeserve tokenize / detokenize: text <-> token ids with a model folder's tokenizer (docs/cli.md),
// and chats rendered with its chat template. The folder needs only tokenizer.json (and
// tokenizer_config.json for the special tokens and the chat template); no weights are read.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/json.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_files.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {
namespace {

using nlohmann::ordered_json;
using tokenizer::ChatTemplate;
using tokenizer::Tokenizer;

std::string ModelDir(const std::string& model) { return model.empty() ? DefaultModelDir() : model; }

// One JSON line: UTF-8 kept raw, as the input lines are.
void PrintJsonLine(const ordered_json& j) { std::puts(j.dump(-1, ' ', false).c_str()); }

// ---- tokenize ----

constexpr char kTokenize[] = "tokenize";

struct TokenizeOptions {
  std::string model;
  std::string text;
  bool has_text = false;
  std::string texts_file;
  std::string chat_file;
  std::string chat_template;
  bool json = false;
};

// Runs fn(line number, parsed object) over the non-blank lines of a JSON-lines file; stops at the
// first failure, naming the file and line.
Status ForEachJsonLine(const std::string& path,
                       const std::function<Status(const ordered_json&)>& fn) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError("cannot open {}", path);
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Result<ordered_json> parsed =
        ParseJson<ordered_json>(line, fmt::format("{}:{}", path, number));
    if (!parsed.ok()) return parsed.status();
    const ordered_json& object = *parsed;
    if (!object.is_object()) return InvalidArgument("{}:{}: expected a JSON object", path, number);
    if (Status s = fn(object); !s.ok()) return s.WithContext(fmt::format("{}:{}", path, number));
  }
  if (in.bad()) return IoError("reading {} failed", path);
  return OkStatus();
}

// --texts-file: each line {"text": ...} gives a line {"ids": [...], "decoded": ...}.
Status TokenizeTextsFile(const Tokenizer& tok, const std::string& path) {
  return ForEachJsonLine(path, [&](const ordered_json& request) -> Status {
    const auto text = request.find("text");
    if (text == request.end() || !text->is_string()) {
      return InvalidArgument("expected a \"text\" string");
    }
    ASSIGN_OR_RETURN(const std::vector<int32_t> ids,
                     tok.Encode(text->get_ref<const std::string&>()));
    ordered_json out;
    out["ids"] = ids;
    out["decoded"] = tok.Decode(ids);
    PrintJsonLine(out);
    return OkStatus();
  });
}

// --chat-file: each line {"messages", "tools", "add_generation_prompt", "extra"} gives a line
// {"text": the rendered prompt, "ids": its tokens} (encoded without added special tokens, as
// transformers' apply_chat_template does: the template writes them).
Status TokenizeChatFile(const Tokenizer& tok, const ChatTemplate& chat, const std::string& path) {
  return ForEachJsonLine(path, [&](const ordered_json& request) -> Status {
    const auto messages = request.find("messages");
    if (messages == request.end() || !messages->is_array()) {
      return InvalidArgument("expected a \"messages\" array");
    }
    tokenizer::ChatTemplateInputs inputs;
    inputs.messages_json = messages->dump();
    if (const auto tools = request.find("tools"); tools != request.end()) {
      inputs.tools_json = tools->dump();
    }
    if (const auto add = request.find("add_generation_prompt"); add != request.end()) {
      if (!add->is_boolean()) return InvalidArgument("\"add_generation_prompt\" must be a boolean");
      inputs.add_generation_prompt = add->get<bool>();
    }
    if (const auto extra = request.find("extra"); extra != request.end() && !extra->is_null()) {
      if (!extra->is_object()) return InvalidArgument("\"extra\" must be an object");
      inputs.extra_json = extra->dump();
    }
    ASSIGN_OR_RETURN(const std::string text, chat.Render(inputs));
    ASSIGN_OR_RETURN(const std::vector<int32_t> ids, tok.Encode(text));
    ordered_json out;
    out["text"] = text;
    out["ids"] = ids;
    PrintJsonLine(out);
    return OkStatus();
  });
}

int Tokenize(const TokenizeOptions& o) {
  if (o.has_text + !o.texts_file.empty() + !o.chat_file.empty() != 1) {
    return UsageError(kTokenize,
                      InvalidArgument("give exactly one of --text, --texts-file and --chat-file"));
  }
  if (!o.chat_template.empty() && o.chat_file.empty()) {
    return UsageError(kTokenize, InvalidArgument("--chat-template goes with --chat-file"));
  }
  const std::string dir = ModelDir(o.model);
  // With the chat template when a chat file is to be rendered (one read of a GGUF file).
  ModelTokenizer text;
  if (o.chat_file.empty()) {
    Result<std::unique_ptr<Tokenizer>> loaded = LoadModelTokenizer(dir);
    if (!loaded.ok()) return RuntimeError(kTokenize, loaded.status());
    text.tokenizer = std::move(*loaded);
  } else {
    Result<ModelTokenizer> loaded = LoadModelTokenizerAndTemplate(dir, o.chat_template);
    if (!loaded.ok()) return RuntimeError(kTokenize, loaded.status());
    text = std::move(*loaded);
  }
  const std::unique_ptr<Tokenizer>& tok = text.tokenizer;
  if (!o.texts_file.empty()) {
    Status s = TokenizeTextsFile(*tok, o.texts_file);
    return s.ok() ? 0 : RuntimeError(kTokenize, s.WithContext("--texts-file"));
  }
  if (!o.chat_file.empty()) {
    Result<ChatTemplate> chat = RequiredChatTemplate(dir, std::move(text.chat_template));
    if (!chat.ok()) return RuntimeError(kTokenize, chat.status());
    Status s = TokenizeChatFile(*tok, *chat, o.chat_file);
    return s.ok() ? 0 : RuntimeError(kTokenize, s.WithContext("--chat-file"));
  }

  Result<std::vector<int32_t>> ids = tok->Encode(o.text);
  if (!ids.ok()) return UsageError(kTokenize, ids.status().WithContext("--text"));
  if (o.json) {
    ordered_json out;
    out["ids"] = *ids;
    std::puts(out.dump().c_str());
  } else {
    // Comma-separated, the form --ids and --token-ids take.
    fmt::print("{}\n", fmt::join(*ids, ","));
  }
  return 0;
}

// ---- detokenize ----

constexpr char kDetokenize[] = "detokenize";

struct DetokenizeOptions {
  std::string model;
  std::string ids;
  bool has_ids = false;
  bool no_special = false;
  bool json = false;
};

// "1,2,3" (spaces allowed too) into ids the tokenizer has.
Result<std::vector<int32_t>> ParseIds(const std::string& text, const Tokenizer& tok) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ',' || std::isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < text.size() && text[end] != ',' &&
           !std::isspace(static_cast<unsigned char>(text[end]))) {
      ++end;
    }
    const std::string word = text.substr(i, end - i);
    i = end;
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size()) return InvalidArgument("--ids: '{}' is not a token id", word);
    if (id < 0 || id >= tok.id_limit() || !tok.TokenBytes(static_cast<int32_t>(id))) {
      return InvalidArgument("--ids: {} is not a token id of this tokenizer (ids run from 0 to {})",
                             word, tok.id_limit() - 1);
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

int Detokenize(const DetokenizeOptions& o) {
  if (!o.has_ids) return UsageError(kDetokenize, InvalidArgument("--ids is required"));
  Result<std::unique_ptr<Tokenizer>> tok = LoadModelTokenizer(ModelDir(o.model));
  if (!tok.ok()) return RuntimeError(kDetokenize, tok.status());
  Result<std::vector<int32_t>> ids = ParseIds(o.ids, **tok);
  if (!ids.ok()) return UsageError(kDetokenize, ids.status());
  const std::string text = (*tok)->Decode(*ids, /*skip_special_tokens=*/o.no_special);
  if (o.json) {
    ordered_json out;
    out["text"] = text;
    PrintJsonLine(out);
  } else {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  }
  return 0;
}

}  // namespace

int RunTokenize(const std::vector<std::string>& args) {
  TokenizeOptions o;
  FlagSet flags("moeserve tokenize",
                "Text to token ids with a model folder's tokenizer (tokenizer files are enough).");
  flags.String("model", &o.model, "model or tokenizer folder (default: the default model)");
  flags.String("text", &o.text, "the text to tokenize");
  flags.String("texts-file", &o.texts_file,
               "JSON lines {\"text\": ...}; prints one {\"ids\", \"decoded\"} line per line");
  flags.String("chat-file", &o.chat_file,
               "JSON lines {\"messages\", \"tools\", \"add_generation_prompt\", \"extra\"}; "
               "prints one {\"text\", \"ids\"} line per line, rendered with the chat template");
  flags.String("chat-template", &o.chat_template,
               "render --chat-file with this Jinja template instead of tokenizer_config.json's");
  flags.Bool("json", &o.json, "print {\"ids\": [...]} instead of comma-separated ids");
  if (std::optional<int> exit_code = ParseFlags(flags, args, kTokenize)) return *exit_code;
  o.has_text = flags.WasSet("text");
  return Tokenize(o);
}

int RunDetokenize(const std::vector<std::string>& args) {
  DetokenizeOptions o;
  FlagSet flags("moeserve detokenize",
                "Token ids to text with a model folder's tokenizer (tokenizer files are enough).");
  flags.String("model", &o.model, "model or tokenizer folder (default: the default model)");
  flags.String("ids", &o.ids, "comma-separated token ids, e.g. 9707,11,1879");
  flags.Bool("no-special", &o.no_special, "leave out special tokens such as <|im_end|>");
  flags.Bool("json", &o.json, "print {\"text\": ...}");
  if (std::optional<int> exit_code = ParseFlags(flags, args, kDetokenize)) return *exit_code;
  o.has_ids = flags.WasSet("ids");
  return Detokenize(o);
}

}  // namespace moeserve::cli
