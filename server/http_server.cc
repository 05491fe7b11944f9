#include "server/http_server.h"

#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "core/json.h"
#include "core/log.h"
#include "server/api_error.h"
#include "server/chat_page.h"
#include "server/generation_job.h"
#include "server/openai_json.h"
#include "server/request_check.h"
#include "server/tokenize_api.h"

namespace moeserve::server {
namespace {

using namespace std::chrono_literals;

// Handler threads: enough that a slow request's preparation (a long prompt to encode, a chat
// template to render) leaves others room; the engine has the cores.
constexpr size_t kHandlerThreads = 4;

// Longest piece of a client's header echoed in an error message.
constexpr size_t kMaxEcho = 200;

HttpResponse ErrorResponse(const ApiError& e) {
  return {.status = e.status, .content_type = "application/json", .headers = {}, .body = e.Body()};
}

HttpResponse JsonResponse(const ordered_json& body) {
  return {.status = 200, .content_type = "application/json", .headers = {}, .body = Dump(body)};
}

std::string Echo(std::string_view s) {
  return s.size() <= kMaxEcho ? std::string(s) : std::string(s.substr(0, kMaxEcho)) + "...";
}

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// The host of a Host header value or of an origin's authority: "[::1]:8000" -> "::1",
// "Example.com:80" -> "example.com".
std::string HostName(std::string_view authority) {
  if (!authority.empty() && authority.front() == '[') {
    const size_t end = authority.find(']');
    return Lower(authority.substr(1, end == std::string_view::npos ? end : end - 1));
  }
  const size_t colon = authority.find(':');
  return Lower(authority.substr(0, colon));
}

bool IsIpv4(std::string_view host) {
  int parts = 0;
  for (size_t i = 0; i <= host.size();) {
    size_t j = i;
    while (j < host.size() && std::isdigit(static_cast<unsigned char>(host[j]))) ++j;
    if (j == i || j - i > 3) return false;
    ++parts;
    if (j == host.size()) break;
    if (host[j] != '.') return false;
    i = j + 1;
  }
  return parts == 4;
}

bool IsIpLiteral(std::string_view host) {
  return IsIpv4(host) || host.find(':') != std::string_view::npos;
}

// Names a browser only ever resolves to this machine (RFC 6761: *.localhost too).
bool IsLoopbackName(std::string_view host) {
  return host == "localhost" || host.ends_with(".localhost") || host == "::1" ||
         (IsIpv4(host) && host.starts_with("127."));
}

// "Bearer KEY" with the scheme in any case (RFC 7235) and the key compared in constant time; a
// key with control bytes never matches.
bool BearerMatches(std::string_view header, std::string_view key) {
  constexpr std::string_view kScheme = "bearer";
  if (header.size() <= kScheme.size() || Lower(header.substr(0, kScheme.size())) != kScheme) {
    return false;
  }
  std::string_view given = header.substr(kScheme.size());
  if (given.front() != ' ' && given.front() != '\t') return false;
  while (!given.empty() && (given.front() == ' ' || given.front() == '\t')) given.remove_prefix(1);
  while (!given.empty() && (given.back() == ' ' || given.back() == '\t')) given.remove_suffix(1);
  for (unsigned char c : given) {
    if (c < 0x20 || c == 0x7f) return false;
  }
  if (given.size() != key.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ key[i]);
  return diff == 0;
}

// A generation in flight as the HTTP front polls it: SSE events, or the whole answer at the end.
class GenerationSource final : public ResponseSource {
 public:
  explicit GenerationSource(std::shared_ptr<GenerationJob> job) : job_(std::move(job)) {}

  bool streaming() const override { return job_->request.stream; }

  Progress Poll() override {
    Progress p;
    if (streaming()) {
      p.events = job_->NextEvents(0ms);
      p.done = job_->stream_done;
      return p;
    }
    std::vector<Delta> deltas;
    if (Status s = job_->Pull(0ms, &deltas); !s.ok()) {
      p.response = ErrorResponse(ToApiError(s));
    } else if (job_->finished()) {
      p.response = JsonResponse(job_->Response());
    }
    return p;
  }

  void Abort() override {
    if (job_->finished()) return;
    LogInfo(
        "server: {}: the client hung up before its answer was complete (client gone): "
        "aborting",
        job_->id);
    job_->loop->Abort(job_->channel);
  }

 private:
  std::shared_ptr<GenerationJob> job_;
};

}  // namespace

struct HttpServer::Impl final : HttpRouter {
  ServerOptions options;
  const tokenizer::Tokenizer& tok;
  std::optional<tokenizer::ChatTemplate> chat_template;
  std::atomic<EngineLoop*> loop{nullptr};
  // Structured output's compiled grammars, made with the engine (they end at its EOS ids).
  std::unique_ptr<structured::GrammarCache> grammars;
  const int64_t created = std::time(nullptr);
  HttpFront front;

  Impl(ServerOptions o, const tokenizer::Tokenizer& t, std::optional<tokenizer::ChatTemplate> c)
      : options(std::move(o)),
        tok(t),
        chat_template(std::move(c)),
        front(options.http, *this, kHandlerThreads) {}

  int64_t max_model_len() const {
    EngineLoop* l = loop.load();
    return l != nullptr ? l->layout().max_model_len : 0;
  }

  // What the request checks need, as of now (max_model_len is the engine's).
  RequestContext Context() const {
    const EngineLoop* l = loop.load();
    return {.tok = tok,
            .chat_template = chat_template ? &*chat_template : nullptr,
            .served_model_name = options.served_model_name,
            .vocab_size = options.vocab_size,
            .max_model_len = max_model_len(),
            .default_params = options.default_params,
            .extra_eos_ids = options.extra_eos_ids,
            .max_tokens_cap = options.max_tokens_cap,
            .limits = options.request_limits,
            .kv_cache_tokens = l != nullptr ? l->layout().num_blocks * l->layout().block_size : 0};
  }

  // ---- Checks on the header ----

  // Without an API key, a page the user visits must not reach this server by a name of its
  // own (DNS rebinding): the Host must be a loopback name or the address bound. Bound to every
  // address (0.0.0.0, ::), any IP literal is this machine's; a DNS name still is not.
  // A name the user lets in by --allowed-origins (the server reached as http://name:port, or "*")
  // is served too.
  bool HostAllowed(std::string_view host_header) const {
    const std::string host = HostName(host_header);
    if (IsLoopbackName(host) || host == Lower(options.host)) return true;
    const bool any_address = options.host == "0.0.0.0" || options.host == "::";
    if (any_address && IsIpLiteral(host)) return true;
    for (const std::string& allowed : options.allowed_origins) {
      const size_t scheme = allowed.find("://");
      if (allowed == "*" ||
          (scheme != std::string::npos && HostName(allowed.substr(scheme + 3)) == host)) {
        return true;
      }
    }
    return false;
  }

  // The server's own origin (the Origin names the Host the request was sent to), or one of
  // --allowed-origins.
  bool OriginAllowed(std::string_view origin, std::optional<std::string_view> host) const {
    for (const std::string& allowed : options.allowed_origins) {
      if (allowed == "*" || Lower(allowed) == Lower(origin)) return true;
    }
    constexpr std::string_view kHttp = "http://";
    return host && origin.size() > kHttp.size() && Lower(origin.substr(0, kHttp.size())) == kHttp &&
           Lower(origin.substr(kHttp.size())) == Lower(*host);
  }

  std::optional<HttpResponse> CheckHeader(const HttpRequest& req) override {
    const std::optional<std::string_view> host = req.Header("Host");
    if (options.api_key.empty() && host && !HostAllowed(*host)) {
      return ErrorResponse({403,
                            fmt::format("Host \"{}\" is not this server's (it serves {} and "
                                        "loopback names; --allowed-origins http://NAME:PORT "
                                        "adds a name; with --api-key any Host is served)",
                                        Echo(*host), options.host),
                            ""});
    }
    if (const std::optional<std::string_view> origin = req.Header("Origin");
        origin && !OriginAllowed(*origin, host)) {
      return ErrorResponse(
          {403,
           fmt::format("cross-origin request from \"{}\" refused (--allowed-origins)",
                       Echo(*origin)),
           ""});
    }
    // vLLM's --api-key: every /v1 route needs "Authorization: Bearer <key>".
    if (!options.api_key.empty() && req.path.starts_with("/v1") && req.method != "OPTIONS") {
      const std::optional<std::string_view> auth = req.Header("Authorization");
      if (!auth || !BearerMatches(*auth, options.api_key)) {
        return HttpResponse{.status = 401,
                            .content_type = "application/json",
                            .headers = {},
                            .body = R"({"error":"Unauthorized"})"};
      }
    }
    return std::nullopt;
  }

  // ---- Routes ----

  bool Inline(const HttpRequest& req) const override {
    return req.method == "GET" || req.method == "OPTIONS";
  }

  HttpResponse Error(int status, std::string message) const override {
    return ErrorResponse({status, std::move(message), ""});
  }

  // A burst of large requests leaves freed memory in glibc's arenas, which keeps it from the
  // system: hand it back once nothing is in flight.
  void Idle() override { malloc_trim(0); }

  RouteResult Handle(const HttpRequest& req, std::function<void()> wake) override {
    RouteResult r;
    try {
      r = Route(req, std::move(wake));
    } catch (const std::exception& e) {
      r = {ErrorResponse({500, e.what(), ""}), nullptr};
    }
    // A page of another origin that --allowed-origins lets in may read the answer (CORS).
    if (const std::optional<std::string_view> origin = req.Header("Origin")) {
      r.response.headers.emplace_back("Access-Control-Allow-Origin", std::string(*origin));
      r.response.headers.emplace_back("Vary", "Origin");
    }
    return r;
  }

  RouteResult Route(const HttpRequest& req, std::function<void()> wake) {
    const std::string& path = req.path;
    const bool get = req.method == "GET";
    const bool post = req.method == "POST";
    if (req.method == "OPTIONS") return {Preflight(), nullptr};
    if (path == "/v1/completions" && post)
      return HandleGeneration(req, Endpoint::kCompletions, wake);
    if (path == "/v1/chat/completions" && post) return HandleGeneration(req, Endpoint::kChat, wake);
    if (path == "/tokenize" && post) {
      return {HandleTokenizer(req,
                              [&req](const RequestContext& ctx, const json& body) {
                                return TokenizeResponse(ctx, body, req.body);
                              }),
              nullptr};
    }
    if (path == "/detokenize" && post) return {HandleTokenizer(req, DetokenizeResponse), nullptr};
    if (path == "/v1/models" && get) return {Models(), nullptr};
    if (path == "/health" && get) {
      EngineLoop* l = loop.load();
      HttpResponse health;
      health.status = l != nullptr && l->healthy() ? 200 : 503;
      return {health, nullptr};
    }
    // vLLM's Prometheus endpoint: outside /v1, so no API key.
    if (path == "/metrics" && get) {
      EngineLoop* l = loop.load();
      return {{.status = 200,
               .content_type = "text/plain; version=0.0.4; charset=utf-8",
               .headers = {},
               .body = l != nullptr ? l->metrics().Render(options.served_model_name) : ""},
              nullptr};
    }
    if (path == "/version" && get) return {JsonResponse({{"version", MOESERVE_VERSION}}), nullptr};
    if (path == "/" && get && options.ui) return {ChatPage(), nullptr};
    const bool known = path == "/v1/completions" || path == "/v1/chat/completions" ||
                       path == "/tokenize" || path == "/detokenize" || path == "/v1/models" ||
                       path == "/health" || path == "/metrics" || path == "/version" ||
                       (path == "/" && options.ui);
    if (known) return {ErrorResponse({405, "method not allowed", ""}), nullptr};
    return {ErrorResponse({404, "no such route", ""}), nullptr};
  }

  // A browser's CORS preflight: origins CheckHeader let through may send JSON with a key.
  static HttpResponse Preflight() {
    return {.status = 204,
            .content_type = "",
            .headers = {{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                        {"Access-Control-Allow-Headers", "Authorization, Content-Type"},
                        {"Access-Control-Max-Age", "600"}},
            .body = ""};
  }

  HttpResponse Models() const {
    ordered_json model = {{"id", options.served_model_name},
                          {"object", "model"},
                          {"created", created},
                          {"owned_by", "vllm"},
                          {"root", options.model_root},
                          {"parent", nullptr},
                          {"max_model_len", max_model_len()},
                          {"permission", ordered_json::array()}};
    return JsonResponse({{"object", "list"}, {"data", ordered_json::array({model})}});
  }

  // The chat page (server/ui/chat.html): outside /v1, so no key -- the page asks for it. Its
  // policy lets it run its own inline script and talk to this server only.
  HttpResponse ChatPage() const {
    return {.status = 200,
            .content_type = "text/html; charset=utf-8",
            .headers = {{"Content-Security-Policy",
                         "default-src 'none'; script-src 'unsafe-inline'; style-src "
                         "'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
                         "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
                        {"X-Content-Type-Options", "nosniff"},
                        {"Cache-Control", "no-store"}},
            .body = RenderChatPage({.model = options.served_model_name,
                                    .max_model_len = max_model_len(),
                                    .api_key_required = !options.api_key.empty(),
                                    .defaults = options.default_params,
                                    .max_tokens = options.max_tokens_cap,
                                    .speculative = options.speculative})};
  }

  RouteResult HandleGeneration(const HttpRequest& req, Endpoint endpoint,
                               std::function<void()> wake) {
    Result<json> body = ParseRequestBody(req.body);
    if (!body.ok()) return {ErrorResponse({400, body.status().message(), ""}), nullptr};
    // The engine's max_model_len is needed for the checks: wait for it.
    EngineLoop* l = loop.load();
    if (l == nullptr || !l->healthy()) {
      return {ErrorResponse(
                  {503, l == nullptr ? "the model is still loading" : "the engine failed", ""}),
              nullptr};
    }
    CheckedRequest checked;
    if (std::optional<ApiError> e =
            CheckGenerationRequest(Context(), *body, endpoint, &checked, req.body)) {
      return {ErrorResponse(*e), nullptr};
    }
    auto job = std::make_shared<GenerationJob>();
    job->endpoint = endpoint;
    job->id = NewRequestId(endpoint);
    job->created = std::time(nullptr);
    job->model = options.served_model_name;
    job->loop = l;
    job->tok = &tok;
    job->grammars = grammars.get();
    job->reasoning_format = options.reasoning_parser;
    job->tool_call_format = options.tool_call_parser;
    std::vector<ChoiceInput> inputs = job->Start(std::move(checked));
    job->channel = l->Submit(std::move(inputs), options.max_waiting_requests, std::move(wake));
    if (Status refused = job->channel->error(); !refused.ok()) {  // before any byte is sent
      return {ErrorResponse(ToApiError(refused)), nullptr};
    }
    HttpResponse head;
    if (job->request.stream) {
      head = {.status = 200,
              .content_type = "text/event-stream",
              .headers = {{"Cache-Control", "no-cache"}},
              .body = ""};
    }
    return {std::move(head), std::make_shared<GenerationSource>(std::move(job))};
  }

  // /tokenize and /detokenize (tokenize_api.h).
  template <class Answer>  // Result<ordered_json>(const RequestContext&, const json&)
  HttpResponse HandleTokenizer(const HttpRequest& req, Answer answer) {
    Result<json> body = ParseRequestBody(req.body);
    if (!body.ok()) return ErrorResponse({400, body.status().message(), ""});
    Result<ordered_json> out = answer(Context(), *body);
    if (!out.ok()) return ErrorResponse(ToApiError(out.status()));
    return JsonResponse(*out);
  }
};

HttpServer::HttpServer(ServerOptions options, const tokenizer::Tokenizer& tok,
                       std::optional<tokenizer::ChatTemplate> chat_template)
    : impl_(std::make_unique<Impl>(std::move(options), tok, std::move(chat_template))) {}

HttpServer::~HttpServer() = default;

Status HttpServer::Bind() {
  ServerOptions& o = impl_->options;
  RETURN_IF_ERROR(impl_->front.Bind(o.host, o.port));
  o.port = impl_->front.port();
  return OkStatus();
}

int HttpServer::port() const { return impl_->options.port; }

void HttpServer::Listen() { impl_->front.Run(); }

void HttpServer::SetEngine(EngineLoop* loop) {
  // A grammar may end where the model does: its EOS ids and generation_config's.
  std::vector<int32_t> eos_ids(impl_->options.extra_eos_ids);
  for (int64_t id : loop->engine().model().config().eos_token_ids) {
    eos_ids.push_back(static_cast<int32_t>(id));
  }
  std::sort(eos_ids.begin(), eos_ids.end());
  eos_ids.erase(std::unique(eos_ids.begin(), eos_ids.end()), eos_ids.end());
  impl_->grammars = std::make_unique<structured::GrammarCache>(impl_->tok, std::move(eos_ids));
  impl_->loop.store(loop);  // after the cache: a handler that sees the loop sees the cache
}

void HttpServer::Stop() { impl_->front.Stop(); }

std::string HttpServer::ServeBytes(std::string_view bytes) {
  return impl_->front.ServeBytes(bytes);
}

size_t HttpServer::num_connections() const { return impl_->front.num_connections(); }

}  // namespace moeserve::server
