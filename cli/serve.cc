// moeserve serve: the OpenAI-compatible HTTP server (docs/cli.md, docs/spec/serving.md §7). The
// port is bound and /health answers (503) before the weights load, as vLLM's does; then the engine
// loop starts and /health turns 200. SIGINT / SIGTERM stop accepting (503), give what is in flight
// --shutdown-timeout seconds to finish, abort the rest and exit 0.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string_view>
#include <thread>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/model_files.h"
#include "cli/model_flags.h"
#include "cli/request_limit_flags.h"
#include "core/log.h"
#include "io/model_config.h"
#include "model/model_files.h"
#include "server/engine_loop.h"
#include "server/http_server.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {
namespace {

constexpr char kCommand[] = "serve";

struct Options {
  ModelFlags model;
  EngineFlags engine;
  RequestLimitFlags limits;
  std::string host = "127.0.0.1";
  int64_t port = 8000;
  std::string api_key;
  std::string served_model_name;
  std::string chat_template;
  int64_t max_body_mib = 16;
  std::string allowed_origins;
  int64_t max_connections = 8192;
  int64_t max_waiting_requests = 0;
  int64_t shutdown_timeout = 0;
  bool no_ui = false;
  std::string tool_call_parser = "auto";
  std::string reasoning_parser = "auto";
  bool enable_auto_tool_choice = false;
};

// --tool-call-parser and --reasoning-parser: vLLM's names, or `auto` -- what the chat template
// asks for (ChooseParsers), logged.
Status ResolveChatParsers(const Options& o, const std::optional<tokenizer::ChatTemplate>& chat,
                          server::ServerOptions* options) {
  const server::ParserChoice from_template =
      server::ChooseParsers(chat ? std::string_view(chat->source()) : std::string_view());
  if (o.tool_call_parser == "auto") {
    options->tool_call_parser = from_template.tool_calls;
  } else {
    Result<server::ToolCallFormat> f = server::ParseToolCallFormat(o.tool_call_parser);
    if (!f.ok()) return f.status().WithContext("--tool-call-parser");
    options->tool_call_parser = *f;
  }
  if (o.reasoning_parser == "auto") {
    options->reasoning_parser = from_template.reasoning;
  } else {
    Result<server::ReasoningFormat> f = server::ParseReasoningFormat(o.reasoning_parser);
    if (!f.ok()) return f.status().WithContext("--reasoning-parser");
    options->reasoning_parser = *f;
  }
  LogInfo("serve: tool calls read as {}{}, reasoning as {}{}",
          server::ToolCallFormatName(options->tool_call_parser),
          o.tool_call_parser == "auto" ? " (auto, from the chat template)" : "",
          server::ReasoningFormatName(options->reasoning_parser),
          o.reasoning_parser == "auto" ? " (auto, from the chat template)" : "");
  return OkStatus();
}

int Run(const Options& o) {
  for (Status s : {o.model.Validate(), o.engine.Validate(), o.limits.Validate()}) {
    if (!s.ok()) return UsageError(kCommand, s);
  }
  if (o.port < 0 || o.port > 65535) {
    return UsageError(kCommand, InvalidArgument("--port: must be in [0, 65535]"));
  }
  if (o.max_body_mib < 1 || o.max_body_mib > 4096) {
    return UsageError(kCommand, InvalidArgument("--max-body-mib: must be in [1, 4096]"));
  }
  if (o.max_connections < 1 || o.max_connections > 1'000'000) {
    return UsageError(kCommand, InvalidArgument("--max-connections: must be in [1, 1000000]"));
  }
  for (unsigned char c : o.api_key) {
    if (c < 0x21 || c == 0x7f) {
      return UsageError(kCommand,
                        InvalidArgument("--api-key: spaces and control bytes are not allowed"));
    }
  }
  if (o.shutdown_timeout < 0 || o.shutdown_timeout > 86400) {
    return UsageError(kCommand, InvalidArgument("--shutdown-timeout: must be in [0, 86400] s"));
  }
  if (o.max_waiting_requests < 0) {
    return UsageError(kCommand, InvalidArgument("--max-waiting-requests: must not be negative"));
  }
  // Under mpirun every process loads its rank first: only rank 0 serves HTTP, the others follow
  // the steps it broadcasts.
  // mpirun forwards SIGTERM / SIGINT to every rank: the others outlast them, stopped by rank 0
  // once it has shut down. A local run loads once the port is bound.
  if (std::optional<int> refused =
          CheckMemoryPlan(o.model, o.engine, o.engine.ToConfig(), kCommand)) {
    return *refused;
  }
  std::unique_ptr<model::ModelGroup> mpi_group;
  if (o.model.mpi()) {
    LoadedModel loaded = LoadOrFollow(o.model, kCommand, FollowerSignals::kBlock);
    if (loaded.group == nullptr) return loaded.exit_code;
    mpi_group = std::move(loaded.group);
  } else if (Status s = o.model.CheckParallel(); !s.ok()) {
    return UsageError(kCommand, s);
  }
  Result<std::string> dir = o.model.Dir();
  if (!dir.ok()) return RuntimeError(kCommand, dir.status());
  Result<io::ModelConfig> config = model::LoadModelConfigAt(*dir);
  if (!config.ok()) return RuntimeError(kCommand, config.status());
  Result<ModelTokenizer> text = LoadModelTokenizerAndTemplate(*dir, o.chat_template);
  if (!text.ok()) return RuntimeError(kCommand, text.status());
  Result<std::unique_ptr<tokenizer::Tokenizer>> tok = std::move(text->tokenizer);
  Result<std::optional<tokenizer::ChatTemplate>> chat = std::move(text->chat_template);
  if (!chat.ok() && !o.chat_template.empty()) return UsageError(kCommand, chat.status());
  if (!chat.ok()) {
    // A broken template of the folder's own: serve the rest, refuse chat requests.
    LogWarning("serve: no chat template ({}): /v1/chat/completions is refused",
               chat.status().message());
    chat = std::optional<tokenizer::ChatTemplate>();
  }
  // vLLM's --generation-config auto: the folder's sampling defaults, under each request's keys.
  Result<GenerationConfig> generation_config = LoadGenerationConfig(*dir);
  if (!generation_config.ok()) return RuntimeError(kCommand, generation_config.status());

  // glibc gives each thread that allocates under contention an arena of its own (up to 8 per
  // core), and memory freed in one is not returned while any of it is in use: the handlers' and
  // the engine's threads share a few, so a hostile burst does not leave memory stranded in
  // dozens (docs/reliability.md).
  mallopt(M_ARENA_MAX, 4);

  // The signals are taken by sigwait below: blocked here, before any thread starts, so that
  // every thread inherits the mask. SIGPIPE is ignored: a client gone is a failed write.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  server::ServerOptions options;
  options.host = o.host;
  options.port = static_cast<int>(o.port);
  options.api_key = o.api_key;
  // vLLM's default name is the --model argument as given.
  options.served_model_name = o.served_model_name.empty() ? *dir : o.served_model_name;
  options.model_root = *dir;
  options.vocab_size = config->vocab_size;
  options.http.max_body_bytes = static_cast<size_t>(o.max_body_mib) << 20;
  options.http.max_connections = static_cast<size_t>(o.max_connections);
  for (std::string_view rest = o.allowed_origins; !rest.empty();) {
    const size_t comma = rest.find(',');
    std::string_view origin = rest.substr(0, comma);
    while (!origin.empty() && origin.front() == ' ') origin.remove_prefix(1);
    while (!origin.empty() && origin.back() == ' ') origin.remove_suffix(1);
    while (origin.ends_with('/')) origin.remove_suffix(1);
    if (!origin.empty()) options.allowed_origins.emplace_back(origin);
    rest = comma == std::string_view::npos ? "" : rest.substr(comma + 1);
  }
  options.max_waiting_requests = o.max_waiting_requests;
  options.request_limits = o.limits.ToLimits();
  options.ui = !o.no_ui;
  if (const engine::SpecConfig spec =
          engine::ResolveSpec(o.engine.ToConfig().spec, config->num_mtp_layers > 0);
      spec.enabled()) {
    options.speculative = engine::SpecName(spec);
  }
  const std::vector<std::string> from_file = generation_config->ApplyTo(&options.default_params);
  options.extra_eos_ids = generation_config->ExtraEosIds(config->eos_token_ids);
  if (generation_config->max_new_tokens.value_or(0) > 0) {
    options.max_tokens_cap = generation_config->max_new_tokens;
  }
  if (!from_file.empty()) {
    LogInfo("serve: sampling defaults from generation_config.json: {}", fmt::join(from_file, ", "));
  }
  if (Status s = ResolveChatParsers(o, *chat, &options); !s.ok()) return UsageError(kCommand, s);
  server::HttpServer http(options, **tok, std::move(*chat));
  if (Status s = http.Bind(); !s.ok()) return RuntimeError(kCommand, s);
  std::thread listener([&] { http.Listen(); });
  LogInfo("serve: listening on http://{}:{} (model \"{}\"{}), loading the model", o.host,
          http.port(), options.served_model_name, options.ui ? ", chat page at /" : "");

  // From here on a failure must stop the listener before returning.
  const auto fail = [&](int code) {
    http.Stop();
    listener.join();
    return code;
  };
  Result<std::unique_ptr<model::ModelGroup>> loaded = std::move(mpi_group);
  if (*loaded == nullptr) loaded = o.model.LoadGroup();
  if (!loaded.ok()) return fail(RuntimeError(kCommand, loaded.status()));
  Result<std::unique_ptr<engine::Engine>> engine = CreateEngine(**loaded, o.engine.ToConfig());
  if (!engine.ok()) return fail(UsageError(kCommand, engine.status()));
  server::EngineLoop loop(std::move(*engine));
  http.SetEngine(&loop);
  LogInfo("serve: ready");

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  LogInfo("serve: signal {}: shutting down", signal_number);
  if (o.shutdown_timeout > 0) {
    // New requests get a 503; those in flight have --shutdown-timeout seconds to finish.
    loop.StopAccepting();
    LogInfo("serve: waiting up to {} s for the requests in flight", o.shutdown_timeout);
    if (!loop.WaitUntilIdle(std::chrono::seconds(o.shutdown_timeout))) {
      LogInfo("serve: --shutdown-timeout passed: aborting what is left");
    }
  }
  // The loop first: it ends every request in flight, so their handlers return and the HTTP
  // server's stop can join them.
  loop.Stop();
  return fail(0);
}

}  // namespace

int RunServe(const std::vector<std::string>& args) {
  Options o;
  FlagSet flags("moeserve serve",
                "OpenAI-compatible HTTP server (vLLM's API): /v1/completions,\n"
                "/v1/chat/completions, /v1/models, /health, /version, /tokenize, /detokenize,\n"
                "/metrics, and a chat page at / (open http://HOST:PORT/ in a browser).");
  o.model.Register(flags);
  o.engine.Register(flags);
  o.limits.Register(flags);
  flags.String("host", &o.host, "address to listen on");
  flags.Int("port", &o.port, "port to listen on");
  flags.String("api-key", &o.api_key,
               "require \"Authorization: Bearer KEY\" on /v1 routes (\"\": no key)");
  flags.String("served-model-name", &o.served_model_name,
               "the model name of requests and /v1/models (default: the --model path)");
  flags.String("chat-template", &o.chat_template,
               "a Jinja chat template file instead of tokenizer_config.json's");
  flags.Int("max-body-mib", &o.max_body_mib,
            "larger request bodies are refused (413), chunked or not, before they are read");
  flags.String("allowed-origins", &o.allowed_origins,
               "comma-separated web origins (http://host:port, or *) whose pages may call the "
               "API besides the server's own chat page (other cross-origin requests get a 403); "
               "without --api-key their host names are also served as Host, besides loopback "
               "names and --host");
  flags.Int("max-connections", &o.max_connections,
            "connections held at once; more are closed as soon as they are accepted");
  flags.Int("shutdown-timeout", &o.shutdown_timeout,
            "on SIGTERM / SIGINT, seconds the requests in flight have to finish (new ones get "
            "503) before the rest are aborted (0: abort at once)");
  flags.Int("max-waiting-requests", &o.max_waiting_requests,
            "past this many waiting requests (each choice of n counts) new ones get a 503 "
            "(0: no bound)");
  flags.Bool("no-ui", &o.no_ui, "no chat page at / (a 404 there, like any unknown route)");
  flags.String("tool-call-parser", &o.tool_call_parser,
               "how chat answers' tool calls are read into tool_calls: hermes (Qwen3, "
               "Qwen3-Next), qwen3_xml or qwen3_coder (Qwen3.5, Qwen3-Coder), none, or auto: "
               "what the chat template writes");
  flags.String("reasoning-parser", &o.reasoning_parser,
               "how chat answers' thinking is split into reasoning: qwen3, deepseek_r1, none, or "
               "auto: what the chat template writes");
  flags.Bool("enable-auto-tool-choice", &o.enable_auto_tool_choice,
             "accepted for vLLM's command lines: tool_choice auto is on whenever a tool-call "
             "parser is");
  if (std::optional<int> exit_code = ParseFlags(flags, args, kCommand)) return *exit_code;
  return Run(o);
}

}  // namespace moeserve::cli
