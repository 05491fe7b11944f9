// vLLM's serving-benchmark metrics (`calculate_metrics` of vllm/benchmarks/serve.py; docs/spec/
// serving.md §6) over the per-request records of a run, its printed summary and its result JSON.
//
//   TTFT   send -> first SSE chunk with choices                     (per request)
//   TPOT   (E2EL - TTFT) / (output_len - 1), only output_len > 1    (per request)
//   ITL    gaps between consecutive content chunks                  (per chunk, all requests)
//   E2EL   send -> last content chunk                               (per request)
//
// Each is reported as mean, median, population std and numpy "linear" percentiles, in ms; an
// empty list reports 0 (numpy of `[] or 0`). Failed requests count in `failed` only.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace moeserve::bench {

// What one streamed request gave (vLLM's RequestFuncOutput). Times in seconds.
struct RequestOutput {
  bool success = false;
  std::string error;           // why it failed ("" on success)
  int http_status = 0;         // of the response; 0 when none came (no connection)
  std::string generated_text;  // the streamed text, concatenated
  int64_t prompt_len = 0;      // input tokens, as the dataset made them
  int64_t output_tokens = 0;   // usage.completion_tokens (0: the server sent no usage)
  double start_time = 0;       // send time, from any fixed origin shared by the run
  double ttft = 0;
  double latency = 0;       // E2EL
  std::vector<double> itl;  // one gap per content chunk after the first
};

// --goodput: service level objectives in ms; a request is good when it meets every one given
// (value <= SLO). TPOT counts as 0 for requests with one output token (DistServe's definition).
struct GoodputSlo {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool empty() const { return !ttft_ms && !tpot_ms && !e2el_ms; }
};

// "ttft:100 tpot:50" (space- or comma-separated KEY:MS pairs; keys ttft, tpot, e2el; values
// >= 0). An empty text gives no SLO.
Result<GoodputSlo> ParseGoodput(const std::string& text);

// numpy.percentile(values, p) with its default "linear" method: the value at rank
// p/100 * (n - 1) of the sorted values, interpolated between neighbours. 0 for no values.
double Percentile(std::vector<double> values, double p);

struct MetricStats {
  double mean_ms = 0, median_ms = 0, std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value)
};

// mean, median, std (ddof 0) and the given percentiles of `seconds`, in ms.
MetricStats ComputeStats(const std::vector<double>& seconds,
                         const std::vector<double>& percentiles);

struct BenchmarkMetrics {
  int64_t completed = 0, failed = 0;
  int64_t total_input = 0, total_output = 0;
  double request_throughput = 0, request_goodput = 0;
  double output_throughput = 0, total_token_throughput = 0;
  MetricStats ttft, tpot, itl, e2el;
  // The busiest 1-second bucket (from the earliest send): content chunks received in it (a chunk
  // is a token unless the server batches several, e.g. speculative decoding), and the most
  // requests in flight in any bucket.
  double max_output_tokens_per_s = 0;
  int64_t max_concurrent_requests = 0;
  // Per request (in order; 0 for failed ones): usage.completion_tokens, or the generated text
  // re-tokenized when the server sent no usage.
  std::vector<int64_t> output_lens;
};

// Counts the tokens of a generated text (only used for requests without usage).
using TokenCounter = std::function<int64_t(const std::string&)>;

// vLLM's calculate_metrics. duration_s: first send to last response of the whole run.
BenchmarkMetrics CalculateMetrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                  const std::vector<double>& percentiles, const GoodputSlo& goodput,
                                  const TokenCounter& count_tokens = nullptr);

// The run's settings, as the summary and the result JSON state them.
struct RunInfo {
  std::string backend;  // "openai" (completions) or "openai-chat"
  std::string model_id;
  std::string tokenizer_id;
  int64_t num_prompts = 0;
  double request_rate = 0;  // +inf: all at once
  double burstiness = 1;
  std::optional<int64_t> max_concurrency;
  double duration_s = 0;
  std::vector<std::string> percentile_metrics;  // of "ttft", "tpot", "itl", "e2el"
  std::vector<double> percentiles;
  GoodputSlo goodput;
};

// The "{p}" of a p{p}_ttft_ms key and a "P{p} TTFT (ms)" row: 99 -> "99", 99.9 -> "99.9".
std::string PercentileName(double p);

// vLLM's printed summary, from "==== Serving Benchmark Result ====" to the closing rule.
std::string FormatSummary(const RunInfo& run, const BenchmarkMetrics& m);

// vLLM's result JSON (the keys of `vllm bench serve --save-result --save-detailed`): setup
// (date, backend, model_id, ...), totals and throughputs, the per-request lists (input_lens,
// output_lens, ttfts, itls in seconds, generated_texts, errors), and mean_/median_/std_/p{p}_
// <metric>_ms for each of run.percentile_metrics.
std::string ResultJson(const RunInfo& run, const BenchmarkMetrics& m,
                       const std::vector<RequestOutput>& outputs, const std::string& date);

}  // namespace moeserve::bench
