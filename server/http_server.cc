#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>
#include <vector>

#include "core/json.h"
#include "core/log.h"
#include "server/api_error.h"
#include "server/chat_page.h"
#include "server/generation_job.h"
#include "server/openai_json.h"
#include "server/peer_watch.h"
#include "server/request_check.h"

namespace moeserve::server {
namespace {

using namespace std::chrono_literals;

// How long a handler waits for tokens before it looks at its connection again.
constexpr auto kPollInterval = 50ms;

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(e.Body(), "application/json");
}

void SendJson(httplib::Response& res, const ordered_json& body) {
  res.status = 200;
  res.set_content(Dump(body), "application/json");
}

// httplib's own pool has a fixed number of threads, and a connection holds its thread for as long
// as it lives (a stream for its whole generation, an idle keep-alive until its timeout): with more
// clients than threads the rest would wait for a thread. Here each connection gets a thread of
// its own, as an asyncio server gives each request a task; past kMaxThreads connections wait.
class ThreadPerConnection final : public httplib::TaskQueue {
 public:
  static constexpr size_t kMaxThreads = 1024;

  void enqueue(std::function<void()> fn) override {
    std::lock_guard lock(mu_);
    if (running_ == kMaxThreads) {
      waiting_.push_back(std::move(fn));
      return;
    }
    ++running_;
    std::thread([this, first = std::move(fn)]() mutable {
      std::function<void()> fn = std::move(first);
      for (;;) {
        fn();
        fn = nullptr;
        std::lock_guard lock(mu_);
        if (waiting_.empty()) {
          if (--running_ == 0) idle_.notify_all();
          return;  // nothing of *this is touched after the unlock
        }
        fn = std::move(waiting_.front());
        waiting_.pop_front();
      }
    }).detach();
  }

  // Waits for every connection's thread to end (httplib stops them from reading first).
  void shutdown() override {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] { return running_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable idle_;
  size_t running_ = 0;
  std::deque<std::function<void()>> waiting_;
};

// httplib's server with its per-connection request processing reachable: ServeBytes hands it a
// connection held in memory.
class RoutingServer final : public httplib::Server {
 public:
  using httplib::Server::process_request;
};

// One connection's bytes in memory: reads come from `in`, writes go to *out.
class MemoryStream final : public httplib::Stream {
 public:
  MemoryStream(std::string_view in, std::string* out) : in_(in), out_(out) {}

  bool is_readable() const override { return position_ < in_.size(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    size = std::min(size, in_.size() - position_);
    std::copy_n(in_.data() + position_, size, ptr);
    position_ += size;
    return static_cast<ssize_t>(size);
  }
  ssize_t write(const char* ptr, size_t size) override {
    out_->append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 0;  // no TCP connection: the hang-up check finds none and never aborts
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 0;
  }
  socket_t socket() const override { return INVALID_SOCKET; }

 private:
  std::string_view in_;
  size_t position_ = 0;
  std::string* out_;
};

}  // namespace

struct HttpServer::Impl {
  ServerOptions options;
  const tokenizer::Tokenizer& tok;
  std::optional<tokenizer::ChatTemplate> chat_template;
  RoutingServer http;
  std::atomic<EngineLoop*> loop{nullptr};
  const int64_t created = std::time(nullptr);

  Impl(ServerOptions o, const tokenizer::Tokenizer& t, std::optional<tokenizer::ChatTemplate> c)
      : options(std::move(o)), tok(t), chat_template(std::move(c)) {}

  int64_t max_model_len() const {
    EngineLoop* l = loop.load();
    return l != nullptr ? l->layout().max_model_len : 0;
  }

  // The engine loop when it can take requests; otherwise answers 503 and returns null.
  EngineLoop* ReadyLoop(httplib::Response& res) {
    EngineLoop* l = loop.load();
    if (l == nullptr || !l->healthy()) {
      SendError(res, {503, l == nullptr ? "the model is still loading" : "the engine failed", ""});
      return nullptr;
    }
    return l;
  }

  // vLLM's --api-key: every /v1 route needs "Authorization: Bearer <key>".
  bool Authorized(const httplib::Request& req, httplib::Response& res) const {
    if (options.api_key.empty()) return true;
    if (req.get_header_value("Authorization") == "Bearer " + options.api_key) return true;
    res.status = 401;
    res.set_content(R"({"error":"Unauthorized"})", "application/json");
    return false;
  }

  // What the request checks need, as of now (max_model_len is the engine's).
  RequestContext Context() const {
    return {.tok = tok,
            .chat_template = chat_template ? &*chat_template : nullptr,
            .served_model_name = options.served_model_name,
            .vocab_size = options.vocab_size,
            .max_model_len = max_model_len(),
            .default_params = options.default_params,
            .extra_eos_ids = options.extra_eos_ids,
            .max_tokens_cap = options.max_tokens_cap};
  }

  // The body as a JSON object, or a 400 sent.
  std::optional<json> Body(const httplib::Request& req, httplib::Response& res) const {
    Result<json> body = ParseRequestBody(req.body);
    if (!body.ok()) {
      SendError(res, {400, body.status().message(), ""});
      return std::nullopt;
    }
    return std::move(*body);
  }

  void HandleGeneration(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
    if (!Authorized(req, res)) return;
    std::optional<json> body = Body(req, res);
    if (!body) return;
    // The engine's max_model_len is needed for the checks: wait for it.
    EngineLoop* l = ReadyLoop(res);
    if (l == nullptr) return;
    CheckedRequest checked;
    if (std::optional<ApiError> e = CheckGenerationRequest(Context(), *body, endpoint, &checked)) {
      SendError(res, *e);
      return;
    }
    GenerationRequest& r = checked.request;
    std::vector<std::vector<int32_t>>& prompts = checked.prompts;
    auto job = std::make_shared<GenerationJob>();
    job->endpoint = endpoint;
    job->id = NewRequestId(endpoint);
    job->created = std::time(nullptr);
    job->model = options.served_model_name;
    job->loop = l;
    job->tok = &tok;
    // n choices per prompt, in vLLM's order: choice p * n + j.
    const std::vector<engine::SamplingParams> fanned = engine::FanOut(r.params);
    std::vector<ChoiceInput> inputs;
    for (size_t p = 0; p < prompts.size(); ++p) {
      for (const engine::SamplingParams& params : fanned) {
        job->choices.emplace_back(tok, params, p);
        inputs.push_back({prompts[p], params});
      }
    }
    job->request = std::move(r);
    job->prompts = std::move(prompts);
    job->prompt_texts = std::move(checked.prompt_texts);
    job->channel = l->Submit(std::move(inputs), options.max_waiting_requests);
    if (Status refused = job->channel->error(); !refused.ok()) {  // before any byte is sent
      SendError(res, ToApiError(refused));
      return;
    }

    if (!job->request.stream) {
      // httplib finds a closed connection only when it writes, which a non-streaming answer
      // does once, at the end: the kernel's TCP table tells a client that hung up meanwhile.
      std::vector<Delta> deltas;
      while (!job->finished()) {
        if (Status s = job->Pull(kPollInterval * 4, &deltas); !s.ok()) {
          SendError(res, ToApiError(s));
          return;
        }
        if (!job->finished() && PeerHungUp(req.local_port, req.remote_addr, req.remote_port)) {
          LogInfo("server: {}: the client hung up before its answer (client gone): aborting",
                  job->id);
          job->loop->Abort(job->channel);
          return;
        }
      }
      SendJson(res, job->Response());
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [job](size_t, httplib::DataSink& sink) {
          if (job->stream_done) {
            sink.done();
            return true;
          }
          const std::string events = job->NextEvents(kPollInterval);
          // A failed write or a closed socket is a client gone: false ends the response, and
          // the releaser aborts the request.
          if (!events.empty() && !sink.write(events.data(), events.size())) return false;
          if (job->stream_done) sink.done();
          return sink.is_writable();
        },
        [job](bool success) {
          if (!success || !job->finished()) {
            LogInfo("server: {} ended before it finished (client gone or shutdown): aborting",
                    job->id);
            job->loop->Abort(job->channel);
          }
        });
  }

  void HandleTokenize(const httplib::Request& req, httplib::Response& res) {
    std::optional<json> body = Body(req, res);
    if (!body) return;
    const json& b = *body;
    const auto fail = [&](const Status& s) { SendError(res, ToApiError(s)); };
    if (b.contains("model") && !b["model"].is_null()) {
      if (!b["model"].is_string()) return fail(InvalidArgument("\"model\" must be a string"));
      if (Status s = CheckModel(Context(), b["model"].get<std::string>()); !s.ok()) return fail(s);
    }
    const bool chat = b.contains("messages");
    bool add_special_tokens = !chat;
    bool return_token_strs = false;
    bool add_generation_prompt = true;
    for (const auto& [key, flag] :
         {std::pair<const char*, bool*>{"add_special_tokens", &add_special_tokens},
          {"return_token_strs", &return_token_strs},
          {"add_generation_prompt", &add_generation_prompt}}) {
      if (!b.contains(key) || b[key].is_null()) continue;
      if (!b[key].is_boolean()) return fail(InvalidArgument("\"{}\" must be true or false", key));
      *flag = b[key].get<bool>();
    }
    std::string text;
    if (chat) {
      if (!b["messages"].is_array()) {
        return fail(InvalidArgument("\"messages\" must be a list of messages"));
      }
      const std::string tools = b.contains("tools") ? b["tools"].dump() : "null";
      Result<std::string> rendered =
          RenderChat(Context(), {b["messages"].dump(), tools, add_generation_prompt, "{}"});
      if (!rendered.ok()) return fail(rendered.status());
      text = std::move(*rendered);
    } else {
      if (!b.contains("prompt") || !b["prompt"].is_string()) {
        return fail(InvalidArgument("\"prompt\" must be a string"));
      }
      text = b["prompt"].get<std::string>();
    }
    Result<std::vector<int32_t>> ids = tok.Encode(text, add_special_tokens);
    if (!ids.ok()) return fail(InvalidArgument("prompt: {}", ids.status().message()));
    ordered_json out = {
        {"count", ids->size()}, {"max_model_len", max_model_len()}, {"tokens", *ids}};
    if (return_token_strs) {
      ordered_json strs = ordered_json::array();
      for (int32_t id : *ids) strs.push_back(std::string(tok.IdToToken(id).value_or("")));
      out["token_strs"] = std::move(strs);
    }
    SendJson(res, out);
  }

  void HandleDetokenize(const httplib::Request& req, httplib::Response& res) {
    std::optional<json> body = Body(req, res);
    if (!body) return;
    const json& b = *body;
    if (!b.contains("tokens") || !b["tokens"].is_array()) {
      SendError(res, {400, "\"tokens\" must be a list of token ids", "tokens"});
      return;
    }
    std::vector<int32_t> ids;
    for (const json& id : b["tokens"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= tok.id_limit()) {
        SendError(res, {400, fmt::format("\"tokens\": {} is not a token id", id.dump()), "tokens"});
        return;
      }
      ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    SendJson(res, {{"prompt", tok.Decode(ids)}});
  }

  void Routes() {
    http.new_task_queue = [] { return new ThreadPerConnection; };
    // A stream writes a small SSE event per token: with Nagle's algorithm on, each write after
    // the first waits for the client's (delayed) ACK of the last, up to 40 ms on Linux, so tokens
    // would arrive in uneven bursts. uvicorn (vLLM's server) sets TCP_NODELAY too.
    http.set_tcp_nodelay(true);
    // httplib's default sets SO_REUSEPORT, with which a second server on a port in use binds too
    // and the kernel splits the connections between them: a moeserve started twice would
    // answer half the requests from the other process. SO_REUSEADDR alone still allows a quick
    // restart past TIME_WAIT but refuses a port someone listens on.
    http.set_socket_options([](socket_t sock) {
      const int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    http.set_payload_max_length(options.max_body_bytes);
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      HandleGeneration(req, res, Endpoint::kCompletions);
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      HandleGeneration(req, res, Endpoint::kChat);
    });
    http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      if (!Authorized(req, res)) return;
      ordered_json model = {{"id", options.served_model_name},
                            {"object", "model"},
                            {"created", created},
                            {"owned_by", "vllm"},
                            {"root", options.model_root},
                            {"parent", nullptr},
                            {"max_model_len", max_model_len()},
                            {"permission", ordered_json::array()}};
      SendJson(res, {{"object", "list"}, {"data", ordered_json::array({model})}});
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      EngineLoop* l = loop.load();
      res.status = l != nullptr && l->healthy() ? 200 : 503;
    });
    // vLLM's Prometheus endpoint: outside /v1, so no API key.
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      EngineLoop* l = loop.load();
      res.status = 200;
      res.set_content(l != nullptr ? l->metrics().Render(options.served_model_name) : "",
                      "text/plain; version=0.0.4; charset=utf-8");
    });
    // The chat page (server/ui/chat.html): outside /v1, so no key -- the page asks for it. Its
    // policy lets it run its own inline script and talk to this server only.
    if (options.ui) {
      http.Get("/", [this](const httplib::Request&, httplib::Response& res) {
        res.status = 200;
        res.set_header("Content-Security-Policy",
                       "default-src 'none'; script-src 'unsafe-inline'; style-src "
                       "'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
                       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
        res.set_header("X-Content-Type-Options", "nosniff");
        res.set_header("Cache-Control", "no-store");
        res.set_content(RenderChatPage(options, max_model_len()), "text/html; charset=utf-8");
      });
    }
    http.Get("/version", [](const httplib::Request&, httplib::Response& res) {
      SendJson(res, {{"version", MOESERVE_VERSION}});
    });
    http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
      HandleTokenize(req, res);
    });
    http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
      HandleDetokenize(req, res);
    });
    // httplib's own errors (404 no route, 413 body too large, ...) get vLLM's error body; the
    // handlers' errors already have one.
    http.set_error_handler(
        httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
          if (!res.body.empty() || res.status == 503)
            return httplib::Server::HandlerResponse::Unhandled;
          std::string message = res.status == 413   ? "the request body is too large"
                                : res.status == 404 ? "no such route"
                                                    : ErrorType(res.status);
          SendErrorKeepStatus(res, message);
          return httplib::Server::HandlerResponse::Handled;
        }));
    http.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr e) {
          std::string message = "internal error";
          try {
            std::rethrow_exception(e);
          } catch (const std::exception& ex) {
            message = ex.what();
          } catch (...) {
          }
          SendError(res, {500, message, ""});
        });
  }

  static void SendErrorKeepStatus(httplib::Response& res, const std::string& message) {
    const int status = res.status;
    SendError(res, {status, message, ""});
  }
};

HttpServer::HttpServer(ServerOptions options, const tokenizer::Tokenizer& tok,
                       std::optional<tokenizer::ChatTemplate> chat_template)
    : impl_(std::make_unique<Impl>(std::move(options), tok, std::move(chat_template))) {
  impl_->Routes();
}

HttpServer::~HttpServer() = default;

Status HttpServer::Bind() {
  ServerOptions& o = impl_->options;
  if (o.port == 0) {  // the kernel's pick
    const int port = impl_->http.bind_to_any_port(o.host);
    if (port > 0) {
      o.port = port;
      return OkStatus();
    }
  } else if (impl_->http.bind_to_port(o.host, o.port)) {
    return OkStatus();
  }
  return IoError("cannot listen on {}:{} (in use, or not an address of this machine)", o.host,
                 o.port);
}

int HttpServer::port() const { return impl_->options.port; }

void HttpServer::Listen() { impl_->http.listen_after_bind(); }

void HttpServer::SetEngine(EngineLoop* loop) { impl_->loop.store(loop); }

void HttpServer::Stop() { impl_->http.stop(); }

std::string HttpServer::ServeBytes(std::string_view bytes) {
  std::string out;
  MemoryStream stream(bytes, &out);
  // Requests one after another as on a keep-alive connection, up to httplib's own bound.
  bool closed = false;
  for (int count = CPPHTTPLIB_KEEPALIVE_MAX_COUNT; count > 0 && !closed && stream.is_readable();
       --count) {
    if (!impl_->http.process_request(stream, count == 1, closed, [](httplib::Request&) {})) break;
  }
  return out;
}

}  // namespace moeserve::server
