#include "cli/prompts_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/json.h"
#include "engine/sampling_json.h"

namespace moeserve::cli {
namespace {

using engine::ApplySamplingKey;
using engine::SamplingKeys;
using nlohmann::json;

// The "token_ids" of a line: a non-empty array of ids in [0, vocab_size).
Result<std::vector<int32_t>> PromptTokenIds(const json& v, int64_t vocab_size) {
  if (!v.is_array()) return InvalidArgument("\"token_ids\" must be an array of token ids");
  if (v.empty()) return InvalidArgument("\"token_ids\" is empty");
  std::vector<int32_t> ids;
  for (const json& id : v) {
    if (!id.is_number_integer()) {
      return InvalidArgument("\"token_ids\": {} is not an integer", id.dump());
    }
    const int64_t value = id.get<int64_t>();
    if (value < 0 || value >= vocab_size) {
      return InvalidArgument("\"token_ids\": {} is outside the vocabulary [0, {})", value,
                             vocab_size);
    }
    ids.push_back(static_cast<int32_t>(value));
  }
  return ids;
}

// One --prompts-file line: {"prompt": TEXT} or {"token_ids": [...]} plus any of vLLM's sampling
// parameters. A null value means "not given". `spec.params` holds the defaults on entry.
Status ParseRequestLine(const json& line, std::string_view line_text, const ParseContext& ctx,
                        RequestSpec& spec) {
  if (!line.is_object()) return InvalidArgument("expected a JSON object");
  RETURN_IF_ERROR(engine::CheckOneStructuredOutput(line));
  std::optional<std::string> text;
  std::optional<std::vector<int32_t>> ids;
  for (const auto& [key, value] : line.items()) {
    bool sampling_key = false;
    RETURN_IF_ERROR(ApplySamplingKey(key, value, spec.params, &sampling_key));
    if (sampling_key) continue;
    if (key != "prompt" && key != "token_ids") {
      return InvalidArgument(
          "unknown key \"{}\" (a line has \"prompt\" or \"token_ids\" and vLLM's sampling "
          "parameters: {})",
          key, fmt::join(SamplingKeys(), ", "));
    }
    if (value.is_null()) continue;
    if (key == "token_ids") {
      ASSIGN_OR_RETURN(ids, PromptTokenIds(value, ctx.vocab_size));
    } else if (value.is_string()) {
      text = value.get<std::string>();
    } else {
      return InvalidArgument("\"prompt\" must be a string");
    }
  }
  engine::KeepSchemaOrder(line_text, spec.params);
  if (text.has_value() == ids.has_value()) {
    return InvalidArgument("give exactly one of \"prompt\" and \"token_ids\"");
  }
  RETURN_IF_ERROR(PrepareParams(ctx, spec));
  if (!text) {
    spec.prompt = std::move(*ids);
    return OkStatus();
  }
  Result<std::vector<int32_t>> encoded = EncodePrompt(ctx, *text);
  if (!encoded.ok()) return encoded.status().WithContext("\"prompt\"");
  spec.prompt = std::move(*encoded);
  return OkStatus();
}

}  // namespace

Status PrepareParams(const ParseContext& ctx, RequestSpec& spec) {
  engine::SamplingParams& p = spec.params;
  const char* needs = !p.stop.empty()                    ? "stop"
                      : !p.bad_words.empty()             ? "bad_words"
                      : p.structured_outputs.has_value() ? "structured output"
                                                         : nullptr;
  if (needs != nullptr) {
    // As for a text prompt, a folder without a (readable) tokenizer is a runtime failure.
    if (ctx.tok == nullptr) {
      return NotFound("{} needs the model's tokenizer: {}", needs, ctx.tok_status.message());
    }
    RETURN_IF_ERROR(engine::ResolveBadWords(p, *ctx.tok));
  }
  spec.grammar = nullptr;
  if (p.structured_outputs.has_value()) {
    if (ctx.grammars == nullptr) return NotFound("structured output needs the model's tokenizer");
    Result<std::shared_ptr<const structured::CompiledGrammar>> compiled =
        ctx.grammars->Get(*p.structured_outputs);
    if (!compiled.ok()) return compiled.status().WithContext("structured_outputs");
    spec.grammar = std::move(*compiled);
  }
  return p.Validate(ctx.vocab_size);
}

Result<std::vector<int32_t>> EncodePrompt(const ParseContext& ctx, const std::string& text) {
  // A folder without a (readable) tokenizer is a runtime failure, whatever the loader said.
  if (ctx.tok == nullptr) {
    return NotFound("a text prompt needs the model's tokenizer: {}", ctx.tok_status.message());
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, ctx.tok->Encode(text));
  if (ids.empty()) return InvalidArgument("the prompt is empty");
  for (int32_t id : ids) {
    // The folder's tokenizer and weights disagree: not the user's input.
    if (id >= ctx.vocab_size) {
      return OutOfRange("the tokenizer gives id {}, outside the model's vocabulary of {}", id,
                        ctx.vocab_size);
    }
  }
  return ids;
}

Result<std::vector<RequestSpec>> ParsePromptsText(std::string_view text, const std::string& path,
                                                  const ParseContext& ctx,
                                                  const engine::SamplingParams& defaults) {
  std::vector<RequestSpec> specs;
  int64_t number = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    RequestSpec spec{number - 1, fmt::format("{}:{}", path, number), {}, defaults, nullptr};
    Result<json> parsed = ParseJson(line, "the line");
    Status s = parsed.ok() ? ParseRequestLine(*parsed, line, ctx, spec) : parsed.status();
    if (!s.ok()) return s.WithContext(spec.origin);
    specs.push_back(std::move(spec));
  }
  if (specs.empty()) return InvalidArgument("--prompts-file: {} has no requests", path);
  return specs;
}

Result<std::vector<RequestSpec>> ReadPromptsFile(const std::string& path, const ParseContext& ctx,
                                                 const engine::SamplingParams& defaults) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError("--prompts-file: cannot open {}", path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return IoError("reading {} failed", path);
  return ParsePromptsText(text.str(), path, ctx, defaults);
}

}  // namespace moeserve::cli
