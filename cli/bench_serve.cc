// moeserve bench serve: a load generator against any OpenAI-compatible server, with the
// definitions, flags, printed summary and result JSON of `vllm bench serve` (docs/spec/serving.md
// §6; bench/ has the parts). The random dataset is made with the tokenizer of --tokenizer; requests
// stream over HTTP; nothing of the engine runs in this process.
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "bench/random_dataset.h"
#include "bench/serve_benchmark.h"
#include "bench/serve_client.h"
#include "bench/serve_metrics.h"
#include "cli/commands.h"
#include "core/json.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {
namespace {

using nlohmann::json;

constexpr char kCommand[] = "bench serve";
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Options {
  std::string base_url = "http://127.0.0.1:8000";
  std::string host = "127.0.0.1";
  int64_t port = 8000;
  std::string endpoint = "/v1/completions";
  std::string backend;
  std::string model;
  std::string served_model_name;
  std::string tokenizer;
  std::string dataset_name = "random";
  int64_t num_prompts = 1000;
  int64_t max_concurrency = 0;
  std::string request_rate = "inf";
  std::string burstiness = "1.0";
  bench::RandomDatasetOptions random;
  int64_t input_len = 0, output_len = 0;  // vLLM's generic spellings of the random-* lengths
  int64_t seed = 0;
  bool ignore_eos = false;
  double temperature = 0;
  double top_p = 1, min_p = 0, frequency_penalty = 0, presence_penalty = 0;
  double repetition_penalty = 1;
  int64_t top_k = -1;
  std::string extra_body;
  std::string goodput;
  std::string percentile_metrics = "ttft,tpot,itl";
  std::string metric_percentiles = "99";
  std::string result_json;
  std::string api_key;
  bool disable_tqdm = false;
  int64_t num_warmups = 0;
  int64_t ready_check_timeout_sec = 600;
};

// vLLM's --goodput takes several words ("--goodput ttft:100 tpot:50"); the flag parser one value.
// Joins the words after --goodput up to the next flag.
std::vector<std::string> JoinGoodputWords(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    out.push_back(args[i]);
    const bool separate = args[i] == "--goodput";
    if (!separate && args[i].rfind("--goodput=", 0) != 0) continue;
    if (separate && i + 1 < args.size()) out.push_back(args[++i]);
    while (i + 1 < args.size() && args[i + 1].rfind("-", 0) != 0) out.back() += " " + args[++i];
  }
  return out;
}

// "inf" or a positive number.
Result<double> ParseRate(const std::string& flag, const std::string& text) {
  if (text == "inf" || text == "Infinity") return kInf;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v > 0)) {
    return InvalidArgument("--{}: expected a positive number or inf (got '{}')", flag, text);
  }
  return v;
}

// Python's str() of a float: "inf", "1.0", "0.5".
std::string PyFloat(double v) {
  if (std::isinf(v)) return "inf";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) parts.push_back(part);
  return parts;
}

bool HasTokenizer(const std::string& dir) {
  std::error_code ec;
  return !dir.empty() && std::filesystem::is_regular_file(dir + "/tokenizer.json", ec);
}

std::string Now(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), format, &tm);
  return buf;
}

// Everything the flags say, checked; a usage error names the flag.
struct Plan {
  bench::ClientOptions client;
  double request_rate = kInf, burstiness = 1;
  std::optional<int64_t> max_concurrency;
  std::vector<std::string> percentile_metrics;
  std::vector<double> percentiles;
  bench::GoodputSlo goodput;
};

Result<Plan> MakePlan(Options& o, const FlagSet& flags) {
  Plan p;
  if (o.dataset_name != "random") {
    return InvalidArgument("--dataset-name: only 'random' is supported (got '{}')", o.dataset_name);
  }
  const bool chat_endpoint = o.endpoint.find("chat/completions") != std::string::npos;
  if (o.endpoint.empty() || o.endpoint[0] != '/' ||
      (!chat_endpoint && o.endpoint.find("completions") == std::string::npos)) {
    return InvalidArgument(
        "--endpoint: expected /v1/completions or /v1/chat/completions (got '{}')", o.endpoint);
  }
  if (!o.backend.empty()) {
    if (o.backend != "openai" && o.backend != "vllm" && o.backend != "openai-chat") {
      return InvalidArgument("--backend: expected openai, vllm or openai-chat (got '{}')",
                             o.backend);
    }
    if (o.backend == "openai-chat" && !flags.WasSet("endpoint")) {
      o.endpoint = "/v1/chat/completions";
    } else if ((o.backend == "openai-chat") != (o.endpoint.find("chat/") != std::string::npos)) {
      return InvalidArgument("--backend {} does not go with --endpoint {}", o.backend, o.endpoint);
    }
  }
  // --base-url wins over --host/--port, as vLLM's.
  std::string url = o.base_url;
  if (!flags.WasSet("base-url") && (flags.WasSet("host") || flags.WasSet("port"))) {
    if (o.port < 1 || o.port > 65535) return InvalidArgument("--port: {} is not a port", o.port);
    const bool v6 = o.host.find(':') != std::string::npos;
    url = fmt::format("http://{}{}{}:{}", v6 ? "[" : "", o.host, v6 ? "]" : "", o.port);
  }
  ASSIGN_OR_RETURN(p.client.base, bench::ParseBaseUrl(url));
  p.client.endpoint = o.endpoint;
  p.client.ignore_eos = o.ignore_eos;
  p.client.api_key = o.api_key;
  if (!flags.WasSet("api-key")) {
    const char* env = std::getenv("OPENAI_API_KEY");
    if (env != nullptr) p.client.api_key = env;
  }

  if (o.num_prompts < 1)
    return InvalidArgument("--num-prompts must be >= 1 (got {})", o.num_prompts);
  if (o.max_concurrency < 0) {
    return InvalidArgument("--max-concurrency must be >= 1, or 0 for unlimited (got {})",
                           o.max_concurrency);
  }
  if (o.max_concurrency > 0) p.max_concurrency = o.max_concurrency;
  ASSIGN_OR_RETURN(p.request_rate, ParseRate("request-rate", o.request_rate));
  ASSIGN_OR_RETURN(p.burstiness, ParseRate("burstiness", o.burstiness));
  if (o.num_warmups < 0) return InvalidArgument("--num-warmups must be >= 0");
  if (o.ready_check_timeout_sec < 0)
    return InvalidArgument("--ready-check-timeout-sec must be >= 0");

  if (flags.WasSet("input-len")) o.random.input_len = o.input_len;
  if (flags.WasSet("output-len")) o.random.output_len = o.output_len;
  o.random.seed = static_cast<uint64_t>(o.seed);
  RETURN_IF_ERROR(bench::OutputLengthRange(o.random).status());
  RETURN_IF_ERROR(bench::InputLengthRange(o.random, 0).status());

  ASSIGN_OR_RETURN(p.goodput, bench::ParseGoodput(o.goodput));
  for (const std::string& m : SplitCommas(o.percentile_metrics)) {
    if (m != "ttft" && m != "tpot" && m != "itl" && m != "e2el") {
      return InvalidArgument(
          "--percentile-metrics: unknown metric '{}' (allowed: ttft, tpot, "
          "itl, e2el)",
          m);
    }
    p.percentile_metrics.push_back(m);
  }
  for (const std::string& text : SplitCommas(o.metric_percentiles)) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !(v >= 0 && v <= 100)) {
      return InvalidArgument("--metric-percentiles: '{}' is not a percentile in [0, 100]", text);
    }
    p.percentiles.push_back(v);
  }

  // The sampling parameters: temperature always (greedy unless asked, as vLLM's bench), the
  // others only when given; --extra-body last.
  json extra = {{"temperature", o.temperature}};
  if (flags.WasSet("top-p")) extra["top_p"] = o.top_p;
  if (flags.WasSet("top-k")) extra["top_k"] = o.top_k;
  if (flags.WasSet("min-p")) extra["min_p"] = o.min_p;
  if (flags.WasSet("frequency-penalty")) extra["frequency_penalty"] = o.frequency_penalty;
  if (flags.WasSet("presence-penalty")) extra["presence_penalty"] = o.presence_penalty;
  if (flags.WasSet("repetition-penalty")) extra["repetition_penalty"] = o.repetition_penalty;
  if (!o.extra_body.empty()) {
    ASSIGN_OR_RETURN(const json body, ParseJson(o.extra_body, "--extra-body"));
    if (!body.is_object()) return InvalidArgument("--extra-body: not a JSON object");
    for (const auto& [key, value] : body.items()) extra[key] = value;
  }
  p.client.extra_body = extra.dump();
  return p;
}

int Run(Options& o, const FlagSet& flags) {
  Result<Plan> planned = MakePlan(o, flags);
  if (!planned.ok()) return UsageError(kCommand, planned.status());
  Plan& p = *planned;

  // The model: the name requests carry, and where the tokenizer is looked for by default.
  std::string model_id = o.model;
  if (model_id.empty()) {
    Result<std::string> first = bench::FirstModelId(p.client);
    if (!first.ok()) return RuntimeError(kCommand, first.status());
    model_id = *first;
  }
  p.client.model = o.served_model_name.empty() ? model_id : o.served_model_name;
  const std::string tokenizer_dir = !o.tokenizer.empty()     ? o.tokenizer
                                    : HasTokenizer(model_id) ? model_id
                                                             : DefaultModelDir();
  Result<std::unique_ptr<tokenizer::Tokenizer>> tok =
      tokenizer::Tokenizer::LoadFromDir(tokenizer_dir);
  if (!tok.ok()) {
    return RuntimeError(kCommand, tok.status().WithContext("--tokenizer " + tokenizer_dir));
  }
  Result<bench::RandomDataset> dataset = bench::SampleRandomDataset(**tok, o.num_prompts, o.random);
  if (!dataset.ok()) return InputOrRuntimeError(kCommand, dataset.status());
  if (dataset->token_mismatch != 0) {
    std::fprintf(stderr,
                 "warning: across all prompts there were %lld %s tokens than asked for after "
                 "decoding and re-encoding\n",
                 static_cast<long long>(std::llabs(dataset->token_mismatch)),
                 dataset->token_mismatch > 0 ? "more" : "fewer");
  }
  const std::vector<bench::SampleRequest>& requests = dataset->requests;

  std::printf("Starting initial single prompt test run...\n");
  std::fflush(stdout);
  if (o.ready_check_timeout_sec > 0) {
    if (Status s = bench::WaitForEndpoint(p.client, requests[0], o.ready_check_timeout_sec);
        !s.ok()) {
      return RuntimeError(kCommand, s);
    }
    std::printf("Initial test run completed.\n");
  } else {
    std::printf("Skipping endpoint ready check.\n");
  }
  const int64_t in_flight = bench::InFlightLimit(o.num_prompts, p.max_concurrency);
  if (o.num_warmups > 0) {
    std::printf("Warming up with %lld requests...\n", static_cast<long long>(o.num_warmups));
    std::fflush(stdout);
    const std::vector<bench::SampleRequest> warmups(o.num_warmups, requests[0]);
    bench::RunRequests(p.client, warmups, std::vector<double>(o.num_warmups, 0.0),
                       bench::InFlightLimit(o.num_warmups, p.max_concurrency), nullptr);
    std::printf("Warmup run completed.\n");
  }
  std::printf("Starting main benchmark run...\n");
  std::printf("Traffic request rate: %s\n", PyFloat(p.request_rate).c_str());
  std::printf("Burstiness factor: %s (%s)\n", PyFloat(p.burstiness).c_str(),
              p.burstiness == 1.0 ? "Poisson process" : "Gamma distribution");
  std::printf("Maximum request concurrency: %s\n",
              p.max_concurrency ? std::to_string(*p.max_concurrency).c_str() : "None");
  std::fflush(stdout);
  if (!p.max_concurrency && in_flight < o.num_prompts) {
    std::fprintf(stderr,
                 "note: at most %lld requests in flight (client threads); the others wait in the "
                 "client, and that wait is not in their TTFT\n",
                 static_cast<long long>(in_flight));
  }

  const std::vector<double> arrivals =
      bench::ArrivalTimes(o.num_prompts, p.request_rate, p.burstiness, o.random.seed);
  bench::ProgressBar bar(!o.disable_tqdm);
  const bench::ServeRunResult run =
      bench::RunRequests(p.client, requests, arrivals, in_flight,
                         [&](int64_t done, int64_t total) { bar.Update(done, total); });

  const tokenizer::Tokenizer& t = **tok;
  const bench::BenchmarkMetrics m = bench::CalculateMetrics(
      run.outputs, run.duration_s, p.percentiles, p.goodput, [&](const std::string& text) {
        Result<std::vector<int32_t>> ids = t.Encode(text);
        return ids.ok() ? static_cast<int64_t>(ids->size()) : int64_t{0};
      });
  for (const bench::RequestOutput& r : run.outputs) {
    if (r.success) continue;
    std::fprintf(stderr, "%lld of %lld requests failed; the first: %s\n",
                 static_cast<long long>(m.failed), static_cast<long long>(o.num_prompts),
                 r.error.c_str());
    break;
  }

  bench::RunInfo info;
  info.backend = p.client.chat() ? "openai-chat" : "openai";
  info.model_id = model_id;
  info.tokenizer_id = tokenizer_dir;
  info.num_prompts = o.num_prompts;
  info.request_rate = p.request_rate;
  info.burstiness = p.burstiness;
  info.max_concurrency = p.max_concurrency;
  info.duration_s = run.duration_s;
  info.percentile_metrics = p.percentile_metrics;
  info.percentiles = p.percentiles;
  info.goodput = p.goodput;
  std::fputs(bench::FormatSummary(info, m).c_str(), stdout);
  std::fflush(stdout);
  if (!o.result_json.empty()) {
    const std::string text = bench::ResultJson(info, m, run.outputs, Now("%Y%m%d-%H%M%S")) + "\n";
    if (Status s = WriteTextFile(o.result_json, text); !s.ok()) return RuntimeError(kCommand, s);
  }
  return 0;
}

}  // namespace

int RunBenchServe(const std::vector<std::string>& args) {
  Options o;
  FlagSet flags(
      "moeserve bench serve",
      "Load generator against an OpenAI-compatible server, with vLLM's `vllm bench serve`\n"
      "definitions: random prompts of controlled token lengths, streamed requests, TTFT, TPOT\n"
      "(excl. 1st token), ITL (per chunk), E2EL, throughputs and goodput; vLLM's summary on\n"
      "stdout and its result JSON keys. Without --max-concurrency at most 512 requests are in\n"
      "flight (one client thread each).");
  flags.String("base-url", &o.base_url, "server URL (http[s]://HOST[:PORT][/PATH])");
  flags.String("host", &o.host, "server host, when --base-url is not given");
  flags.Int("port", &o.port, "server port, when --base-url is not given");
  flags.String("endpoint", &o.endpoint, "API endpoint: /v1/completions or /v1/chat/completions");
  flags.String("backend", &o.backend,
               "openai or vllm (completions), openai-chat (chat); default: from --endpoint");
  flags.String("model", &o.model,
               "model name sent in requests (default: the first of GET /v1/models)");
  flags.String("served-model-name", &o.served_model_name,
               "name sent in requests when it differs from --model");
  flags.String("tokenizer", &o.tokenizer,
               "tokenizer folder for the random prompts (default: --model when it is a folder "
               "with tokenizer.json, else the default model)");
  flags.String("dataset-name", &o.dataset_name, "dataset: random (the only one)");
  flags.Int("num-prompts", &o.num_prompts, "number of requests");
  flags.Int("max-concurrency", &o.max_concurrency,
            "most requests in flight at once (0: unlimited)");
  flags.String("request-rate", &o.request_rate,
               "requests per second; inf sends all at once, else Poisson/gamma arrivals");
  flags.String("burstiness", &o.burstiness,
               "arrival burstiness: 1 Poisson, <1 burstier, >1 more uniform (gamma shape)");
  flags.Int("random-input-len", &o.random.input_len, "prompt tokens");
  flags.Int("random-output-len", &o.random.output_len, "max_tokens of each request");
  flags.Double("random-range-ratio", &o.random.range_ratio,
               "lengths uniform in [L(1-r), L(1+r)], r in [0, 1)");
  flags.Int("random-prefix-len", &o.random.prefix_len,
            "random tokens before every prompt (the same for all)");
  flags.Int("input-len", &o.input_len, "same as --random-input-len");
  flags.Int("output-len", &o.output_len, "same as --random-output-len");
  flags.Int("seed", &o.seed, "seed of the prompts and arrival times");
  flags.Bool("ignore-eos", &o.ignore_eos, "send ignore_eos: every request runs to max_tokens");
  flags.Double("temperature", &o.temperature, "sampling temperature (default greedy)");
  flags.Double("top-p", &o.top_p, "top_p, sent when given");
  flags.Int("top-k", &o.top_k, "top_k, sent when given");
  flags.Double("min-p", &o.min_p, "min_p, sent when given");
  flags.Double("frequency-penalty", &o.frequency_penalty, "sent when given");
  flags.Double("presence-penalty", &o.presence_penalty, "sent when given");
  flags.Double("repetition-penalty", &o.repetition_penalty, "sent when given");
  flags.String("extra-body", &o.extra_body, "a JSON object merged into every request body");
  flags.String("goodput", &o.goodput,
               "SLOs in ms for goodput: ttft:MS tpot:MS e2el:MS (a request is good when it "
               "meets all)");
  flags.String("percentile-metrics", &o.percentile_metrics,
               "metrics reported with percentiles: of ttft,tpot,itl,e2el");
  flags.String("metric-percentiles", &o.metric_percentiles, "percentiles, e.g. 25,50,99");
  flags.String("result-json", &o.result_json, "write vLLM's result JSON to this file");
  flags.String("api-key", &o.api_key, "sent as a Bearer token (default: $OPENAI_API_KEY)");
  flags.Bool("disable-tqdm", &o.disable_tqdm, "no progress bar");
  flags.Int("num-warmups", &o.num_warmups, "requests sent (and not measured) before the run");
  flags.Int("ready-check-timeout-sec", &o.ready_check_timeout_sec,
            "wait this long for the server to answer the test request; 0 skips it");
  if (std::optional<int> exit_code = ParseFlags(flags, JoinGoodputWords(args), kCommand)) {
    return *exit_code;
  }
  return Run(o, flags);
}

}  // namespace moeserve::cli
