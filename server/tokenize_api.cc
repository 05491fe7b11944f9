#include "server/tokenize_api.h"

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moeserve::server {
namespace {

// A value of the request quoted in an error, cut to this many bytes.
constexpr size_t kMaxQuotedBytes = 64;

std::string Quoted(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > kMaxQuotedBytes) text = text.substr(0, kMaxQuotedBytes) + "...";
  return text;
}

}  // namespace

Result<ordered_json> TokenizeResponse(const RequestContext& ctx, const json& b,
                                      std::string_view body_text) {
  if (!b.is_object()) return InvalidArgument("the request body must be a JSON object");
  if (const auto model = b.find("model"); model != b.end() && !model->is_null()) {
    if (!model->is_string()) return InvalidArgument("\"model\" must be a string");
    RETURN_IF_ERROR(CheckModel(ctx, model->get<std::string>()));
  }
  const bool chat = b.contains("messages");
  bool add_special_tokens = !chat;
  bool return_token_strs = false;
  bool add_generation_prompt = true;
  for (const auto& [key, flag] :
       {std::pair<const char*, bool*>{"add_special_tokens", &add_special_tokens},
        {"return_token_strs", &return_token_strs},
        {"add_generation_prompt", &add_generation_prompt}}) {
    const auto value = b.find(key);
    if (value == b.end() || value->is_null()) continue;
    if (!value->is_boolean()) return InvalidArgument("\"{}\" must be true or false", key);
    *flag = value->get<bool>();
  }
  std::string text;
  if (chat) {
    ASSIGN_OR_RETURN(const GenerationRequest r,
                     ParseGenerationRequest(b, Endpoint::kChat, ctx.default_params, body_text));
    ASSIGN_OR_RETURN(text, RenderChat(ctx, {r.messages_json, r.tools_json, add_generation_prompt,
                                            r.chat_template_kwargs_json}));
    RETURN_IF_ERROR(CheckTextLength(ctx, text, "messages"));
  } else {
    const auto prompt = b.find("prompt");
    if (prompt == b.end() || !prompt->is_string()) {
      return InvalidArgument("\"prompt\" must be a string");
    }
    RETURN_IF_ERROR(CheckTextLength(ctx, prompt->get_ref<const std::string&>(), "prompt"));
    text = prompt->get<std::string>();
  }
  Result<std::vector<int32_t>> ids = ctx.tok.Encode(text, add_special_tokens);
  if (!ids.ok()) return InvalidArgument("prompt: {}", ids.status().message());
  ordered_json out = {
      {"count", ids->size()}, {"max_model_len", ctx.max_model_len}, {"tokens", *ids}};
  if (return_token_strs) {
    ordered_json strs = ordered_json::array();
    for (int32_t id : *ids) strs.push_back(std::string(ctx.tok.IdToToken(id).value_or("")));
    out["token_strs"] = std::move(strs);
  }
  return out;
}

Result<ordered_json> DetokenizeResponse(const RequestContext& ctx, const json& b) {
  if (!b.is_object()) return InvalidArgument("the request body must be a JSON object");
  const auto tokens = b.find("tokens");
  if (tokens == b.end() || !tokens->is_array()) {
    return InvalidArgument("\"tokens\" must be a list of token ids");
  }
  std::vector<int32_t> ids;
  ids.reserve(tokens->size());
  for (const json& id : *tokens) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= ctx.tok.id_limit()) {
      return InvalidArgument("\"tokens\": {} is not a token id", Quoted(id));
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return ordered_json{{"prompt", ctx.tok.Decode(ids)}};
}

}  // namespace moeserve::server
