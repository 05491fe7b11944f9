#include "server/chat_page.h"

#include <nlohmann/json.hpp>
#include <string_view>

#include "core/check.h"

namespace moeserve::server {

// server/ui/chat.html, generated into the build folder by cmake/EmbedFile.cmake.
extern const char kChatHtml[];
extern const std::size_t kChatHtml_size;

namespace {

constexpr std::string_view kPlaceholder = "__MOESERVE_CONFIG__";

// JSON for inside <script>: nlohmann's dump with '<', '>' and '&' escaped (valid JSON still).
std::string ScriptSafeJson(const nlohmann::ordered_json& j) {
  const std::string text = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '<':
        out += "\\u003c";
        break;
      case '>':
        out += "\\u003e";
        break;
      case '&':
        out += "\\u0026";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

std::string RenderChatPage(const ChatPageConfig& shown) {
  using ordered_json = nlohmann::ordered_json;
  const engine::SamplingParams& d = shown.defaults;
  ordered_json config = {
      {"model", shown.model},
      {"version", MOESERVE_VERSION},
      {"max_model_len",
       shown.max_model_len > 0 ? ordered_json(shown.max_model_len) : ordered_json(nullptr)},
      {"api_key_required", shown.api_key_required},
      {"defaults",
       {{"temperature", d.temperature},
        {"top_p", d.top_p},
        {"top_k", d.top_k},
        {"max_tokens", shown.max_tokens ? ordered_json(*shown.max_tokens) : ordered_json(nullptr)},
        {"seed", d.seed ? ordered_json(*d.seed) : ordered_json(nullptr)}}},
      {"speculative",
       shown.speculative.empty() ? ordered_json(nullptr) : ordered_json(shown.speculative)}};
  std::string page(kChatHtml, kChatHtml_size);
  const size_t at = page.find(kPlaceholder);
  CHECK(at != std::string::npos) << "server/ui/chat.html lacks " << kPlaceholder;
  page.replace(at, kPlaceholder.size(), ScriptSafeJson(config));
  return page;
}

}  // namespace moeserve::server
