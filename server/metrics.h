// Prometheus metrics for GET /metrics (text exposition format 0.0.4), with vLLM's names
// (vllm/v1/metrics/loggers.py): the engine loop records, HTTP handler threads render.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "engine/request.h"

namespace moeserve::server {

// A Prometheus histogram: fixed upper bounds (+Inf implied), per-bucket counts, sum and count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void Observe(double v);
  // Appends the _bucket (cumulative), _sum and _count lines; `labels` has no braces.
  void Render(const std::string& name, const std::string& labels, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // non-cumulative; last is (bounds_.back(), +Inf)
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();

  // Engine loop side.
  void SetGauges(int64_t running, int64_t waiting, double kv_usage, int64_t prefix_queries,
                 int64_t prefix_hits);
  void AddPreemptions(int64_t n);
  // Speculative decoding's counters, the engine's totals (rendered only when drafting is on).
  void SetSpecStats(const engine::SpecDecodeStats& stats);
  void ObserveQueueTime(double seconds);
  // A request's first token: its prompt tokens are counted here.
  void ObserveFirstToken(double ttft_seconds, int64_t prompt_tokens);
  void ObserveInterToken(double seconds);
  void AddGenerationTokens(int64_t n);
  void ObserveFinished(engine::FinishReason reason, double e2e_seconds);

  // The exposition text; every sample labelled model_name=..., engine="0".
  std::string Render(const std::string& model_name) const;

 private:
  mutable std::mutex mu_;
  int64_t running_ = 0, waiting_ = 0;
  double kv_usage_ = 0;
  int64_t prefix_queries_ = 0, prefix_hits_ = 0;
  int64_t preemptions_ = 0;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  int64_t success_stop_ = 0, success_length_ = 0, success_abort_ = 0;
  Histogram ttft_, itl_, e2e_, queue_;
  engine::SpecDecodeStats spec_;
};

}  // namespace moeserve::server
