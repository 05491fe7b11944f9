#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace moeserve::server {
namespace {

// vLLM's bucket boundaries (vllm/v1/metrics/loggers.py).
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                          0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                          20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                         0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kLatencyBuckets = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                             5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                             60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

// Prometheus label values escape \, " and newline.
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string Num(double v) { return fmt::format("{}", v); }

void Header(std::string* out, const char* name, const char* type, const char* help) {
  *out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

}  // namespace

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  ++counts_[i];  // le is inclusive: v == bound falls in that bucket
  sum_ += v;
  ++count_;
}

void Histogram::Render(const std::string& name, const std::string& labels, std::string* out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    *out +=
        fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, Num(bounds_[i]), cumulative);
  }
  *out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, count_);
  *out += fmt::format("{}_sum{{{}}} {}\n", name, labels, Num(sum_));
  *out += fmt::format("{}_count{{{}}} {}\n", name, labels, count_);
}

Metrics::Metrics()
    : ttft_(kTtftBuckets), itl_(kItlBuckets), e2e_(kLatencyBuckets), queue_(kLatencyBuckets) {}

void Metrics::SetGauges(int64_t running, int64_t waiting, double kv_usage, int64_t prefix_queries,
                        int64_t prefix_hits) {
  std::lock_guard lock(mu_);
  running_ = running;
  waiting_ = waiting;
  kv_usage_ = kv_usage;
  prefix_queries_ = prefix_queries;
  prefix_hits_ = prefix_hits;
}

void Metrics::SetSpecStats(const engine::SpecDecodeStats& stats) {
  std::lock_guard lock(mu_);
  spec_.num_drafts = stats.num_drafts;
  spec_.num_draft_tokens = stats.num_draft_tokens;
  spec_.num_accepted_tokens = stats.num_accepted_tokens;
  spec_.accepted_per_pos.assign(stats.accepted_per_pos.begin(), stats.accepted_per_pos.end());
}

void Metrics::AddPreemptions(int64_t n) {
  std::lock_guard lock(mu_);
  preemptions_ += n;
}

void Metrics::ObserveQueueTime(double seconds) {
  std::lock_guard lock(mu_);
  queue_.Observe(seconds);
}

void Metrics::ObserveFirstToken(double ttft_seconds, int64_t prompt_tokens) {
  std::lock_guard lock(mu_);
  ttft_.Observe(ttft_seconds);
  prompt_tokens_ += prompt_tokens;
}

void Metrics::ObserveInterToken(double seconds) {
  std::lock_guard lock(mu_);
  itl_.Observe(seconds);
}

void Metrics::AddGenerationTokens(int64_t n) {
  std::lock_guard lock(mu_);
  generation_tokens_ += n;
}

void Metrics::ObserveFinished(engine::FinishReason reason, double e2e_seconds) {
  std::lock_guard lock(mu_);
  switch (reason) {
    case engine::FinishReason::kStop:
      ++success_stop_;
      break;
    case engine::FinishReason::kLength:
      ++success_length_;
      break;
    default:
      ++success_abort_;
      break;
  }
  e2e_.Observe(e2e_seconds);
}

std::string Metrics::Render(const std::string& model_name) const {
  const std::string labels = fmt::format("engine=\"0\",model_name=\"{}\"", Escape(model_name));
  std::string out;
  std::lock_guard lock(mu_);
  const auto sample = [&](const char* name, const std::string& value) {
    out += fmt::format("{}{{{}}} {}\n", name, labels, value);
  };
  Header(&out, "vllm:num_requests_running", "gauge",
         "Number of requests in model execution batches.");
  sample("vllm:num_requests_running", std::to_string(running_));
  Header(&out, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
  sample("vllm:num_requests_waiting", std::to_string(waiting_));
  Header(&out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.");
  sample("vllm:kv_cache_usage_perc", Num(kv_usage_));
  Header(&out, "vllm:num_preemptions_total", "counter",
         "Cumulative number of preemption from the engine.");
  sample("vllm:num_preemptions_total", std::to_string(preemptions_));
  Header(&out, "vllm:prefix_cache_queries_total", "counter",
         "Prefix cache queries, in terms of number of queried tokens.");
  sample("vllm:prefix_cache_queries_total", std::to_string(prefix_queries_));
  Header(&out, "vllm:prefix_cache_hits_total", "counter",
         "Prefix cache hits, in terms of number of cached tokens.");
  sample("vllm:prefix_cache_hits_total", std::to_string(prefix_hits_));
  Header(&out, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.");
  sample("vllm:prompt_tokens_total", std::to_string(prompt_tokens_));
  Header(&out, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.");
  sample("vllm:generation_tokens_total", std::to_string(generation_tokens_));
  Header(&out, "vllm:request_success_total", "counter",
         "Count of successfully processed requests.");
  for (const auto& [reason, n] : {std::pair<const char*, int64_t>{"stop", success_stop_},
                                  {"length", success_length_},
                                  {"abort", success_abort_}}) {
    out += fmt::format("vllm:request_success_total{{{},finished_reason=\"{}\"}} {}\n", labels,
                       reason, n);
  }
  if (!spec_.accepted_per_pos.empty()) {
    // vLLM's SpecDecodingProm counters.
    Header(&out, "vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.");
    sample("vllm:spec_decode_num_drafts_total", std::to_string(spec_.num_drafts));
    Header(&out, "vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.");
    sample("vllm:spec_decode_num_draft_tokens_total", std::to_string(spec_.num_draft_tokens));
    Header(&out, "vllm:spec_decode_num_accepted_tokens_total", "counter",
           "Number of accepted tokens.");
    sample("vllm:spec_decode_num_accepted_tokens_total", std::to_string(spec_.num_accepted_tokens));
    Header(&out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
           "Accepted tokens per draft position.");
    for (size_t pos = 0; pos < spec_.accepted_per_pos.size(); ++pos) {
      out += fmt::format("vllm:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n",
                         labels, pos, spec_.accepted_per_pos[pos]);
    }
  }
  Header(&out, "vllm:time_to_first_token_seconds", "histogram",
         "Histogram of time to first token in seconds.");
  ttft_.Render("vllm:time_to_first_token_seconds", labels, &out);
  Header(&out, "vllm:inter_token_latency_seconds", "histogram",
         "Histogram of inter-token latency in seconds.");
  itl_.Render("vllm:inter_token_latency_seconds", labels, &out);
  Header(&out, "vllm:e2e_request_latency_seconds", "histogram",
         "Histogram of e2e request latency in seconds.");
  e2e_.Render("vllm:e2e_request_latency_seconds", labels, &out);
  Header(&out, "vllm:request_queue_time_seconds", "histogram",
         "Histogram of time spent in WAITING phase for request.");
  queue_.Render("vllm:request_queue_time_seconds", labels, &out);
  return out;
}

}  // namespace moeserve::server
