// The chat page served at GET / (issue #19): server/ui/chat.html, compiled into the binary, with
// what it needs to know of this server filled in -- the model's name, its sampling defaults,
// whether a key is required -- so that it needs no request of its own before the first chat.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/sampling_params.h"

namespace moeserve::server {

// What the page shows of this server; the HttpServer fills it from its ServerOptions.
struct ChatPageConfig {
  std::string model;          // the served model name
  int64_t max_model_len = 0;  // the engine's; 0 while the model loads
  bool api_key_required = false;
  engine::SamplingParams defaults;    // its temperature, top_p, top_k and seed are shown
  std::optional<int64_t> max_tokens;  // the cap on max_tokens; absent: up to the context
  std::string speculative;            // the engine's method ("mtp:1"; "": none)
};

// The page with its `__MOESERVE_CONFIG__` replaced by this JSON object:
//   {"model", "version", "max_model_len" (null while loading), "api_key_required",
//    "defaults": {"temperature", "top_p", "top_k", "max_tokens" (null: up to the context),
//                 "seed" (null: none)},
//    "speculative" (e.g. "mtp:1", or null)}
// '<', '>' and '&' are written as \u escapes, so no value (a model name with "</script>", say)
// can end the script element that holds the JSON.
std::string RenderChatPage(const ChatPageConfig& shown);

}  // namespace moeserve::server
