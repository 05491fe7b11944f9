// The OpenAI-compatible HTTP server (docs/spec/serving.md §7): routes, the browser-origin and
// API-key checks, request checks, and the generation handlers that feed the EngineLoop and stream
// its tokens back. Connections, parsing and limits are the HttpFront's (http_front.h); handlers run
// on its worker threads and meet the engine only through EngineLoop.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"
#include "engine/sampling_params.h"
#include "server/engine_loop.h"
#include "server/http_front.h"
#include "server/output_parser.h"
#include "server/request_check.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;            // "": no authentication
  std::string served_model_name;  // the name requests must use (and /v1/models lists)
  std::string model_root;         // /v1/models' "root": the model folder
  int64_t vocab_size = 0;         // the model's (prompt ids must lie below it)
  // The HTTP front's bounds: header and body bytes, deadlines, connections.
  HttpLimits http;
  // --allowed-origins: the web origins ("http://host:port", or "*": any) whose pages may call
  // the API besides the server's own; any other Origin is refused (403). Without --api-key the
  // Host must also name this server: the bound address or a loopback name (DNS rebinding).
  std::vector<std::string> allowed_origins;
  // --max-waiting-requests: past this many waiting engine requests a new one is refused with a
  // 503 (0: no bound).
  int64_t max_waiting_requests = 0;
  // Sampling defaults under each request's keys (generation_config.json's, as vLLM's
  // --generation-config auto), and stop ids joining every request's unless ignore_eos.
  engine::SamplingParams default_params;
  std::vector<int32_t> extra_eos_ids;
  // generation_config.json's max_new_tokens: caps every request's max_tokens (vLLM's
  // get_max_tokens takes the least of the request's, the context's room and this).
  std::optional<int64_t> max_tokens_cap;
  // Each request's cost bounds (request_check.h).
  RequestLimits request_limits;
  // The chat page at GET / (--no-ui: false, and / is a 404 like any unknown route).
  bool ui = true;
  // The speculative method the engine runs ("mtp:1"; "": none), for the page to show.
  std::string speculative;
  // How chat answers are read (--reasoning-parser, --tool-call-parser; `auto` resolved from the
  // chat template by the caller): reasoning split off into `reasoning`, tool calls into
  // `tool_calls`.
  ReasoningFormat reasoning_parser = ReasoningFormat::kNone;
  ToolCallFormat tool_call_parser = ToolCallFormat::kNone;
};

class HttpServer {
 public:
  // `tok` must outlive the server; `chat_template` absent: chat requests are refused (400).
  HttpServer(ServerOptions options, const tokenizer::Tokenizer& tok,
             std::optional<tokenizer::ChatTemplate> chat_template);
  ~HttpServer();

  // Binds host:port (an IoError naming them when taken; port 0: a free port the kernel picks).
  Status Bind();
  // The port bound (after Bind; the one picked for port 0).
  int port() const;
  // Serves until Stop(); call on its own thread. Until SetEngine, /health answers 503 and
  // generation requests 503.
  void Listen();
  // The engine is ready: from now on requests go to `loop` (which must outlive the server).
  void SetEngine(EngineLoop* loop);
  // Stops accepting and closes every connection (stop the loop first: the answers in flight
  // then end and go out).
  void Stop();

  // Serves the raw bytes of one connection (one request or several, keep-alive) over a socket
  // pair, through the same parsing, routing and handlers, and returns the bytes the server
  // writes back. The HTTP fuzz target's way in; Bind and Listen are not needed.
  std::string ServeBytes(std::string_view bytes);

  // Connections open now.
  size_t num_connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::server
