// The load of `bench serve`: vLLM's arrival process (`get_request` of vllm/benchmarks/serve.py)
// and its concurrency cap, driving one thread per in-flight request.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "bench/random_dataset.h"
#include "bench/serve_client.h"
#include "bench/serve_metrics.h"
#include "core/status.h"

namespace moeserve::bench {

// Send times of n requests, in seconds from the start: all 0 for an infinite rate; else gaps
// drawn from Gamma(shape = burstiness, scale = 1 / (rate * burstiness)) -- exponential for
// burstiness 1, a Poisson process -- accumulated, then scaled so that the last is exactly
// n / rate (vLLM's normalisation, which keeps the throughput of different seeds comparable).
// An infinite burstiness gives constant gaps 1 / rate. std::mt19937_64 seeded with `seed`.
std::vector<double> ArrivalTimes(int64_t n, double rate, double burstiness, uint64_t seed);

// How many requests may be in flight: --max-concurrency when given, else every request up to
// kMaxThreads, less when the open-file limit (one socket each) is lower. Past the cap requests
// wait in the client and that wait is not in their TTFT.
constexpr int64_t kMaxThreads = 512;
int64_t InFlightLimit(int64_t num_requests, std::optional<int64_t> max_concurrency);

// Sends `test` until it succeeds: a refused connection or HTTP 503 (still loading) is retried
// every second for up to timeout_s; any other failure, or the timeout, is an Unavailable status
// naming the URL and what the server said.
Status WaitForEndpoint(const ClientOptions& o, const SampleRequest& test, int64_t timeout_s);

struct ServeRunResult {
  std::vector<RequestOutput> outputs;  // in request order; start times from the run's start
  double duration_s = 0;               // the run's start to the last request's end
};

// Called after each request ends, from the thread that ran it, one call at a time.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

// Sends `requests[i]` at arrivals[i] (at most `in_flight` at once; a request that arrives while
// all slots are busy waits for one, and its send time is when it gets it).
ServeRunResult RunRequests(const ClientOptions& o, const std::vector<SampleRequest>& requests,
                           const std::vector<double>& arrivals, int64_t in_flight,
                           const ProgressFn& progress);

// A tqdm-like progress line on stderr: redrawn in place on a terminal, else a line at most
// every 10 s.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled);
  void Update(int64_t done, int64_t total);

 private:
  bool enabled_, tty_;
  Clock::time_point start_, last_print_;
};

}  // namespace moeserve::bench
