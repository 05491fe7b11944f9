#include "bench/serve_benchmark.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <limits>
#include <mutex>
#include <random>
#include <thread>

namespace moeserve::bench {
namespace {

// File descriptors kept free of request sockets (stdio, the result file, the tokenizer...).
constexpr int64_t kSpareFiles = 64;

std::string Clock2(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds);
  return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
                   : fmt::format("{:02}:{:02}", s / 60, s % 60);
}

}  // namespace

std::vector<double> ArrivalTimes(int64_t n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> t(n, 0.0);
  if (n == 0 || std::isinf(rate)) return t;
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gamma(burstiness, 1.0 / (rate * burstiness));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum += std::isinf(burstiness) ? 1.0 / rate : gamma(rng);
    t[i] = sum;
  }
  if (sum > 0) {
    const double scale = static_cast<double>(n) / rate / sum;
    for (double& x : t) x *= scale;
  }
  return t;
}

int64_t InFlightLimit(int64_t num_requests, std::optional<int64_t> max_concurrency) {
  if (max_concurrency) return std::max<int64_t>(1, std::min(*max_concurrency, num_requests));
  int64_t cap = kMaxThreads;
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    cap = std::min<int64_t>(cap, static_cast<int64_t>(files.rlim_cur) - kSpareFiles);
  }
  return std::max<int64_t>(1, std::min(cap, num_requests));
}

Status WaitForEndpoint(const ClientOptions& o, const SampleRequest& test, int64_t timeout_s) {
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(timeout_s);
  bool waiting = false;
  for (;;) {
    const Clock::time_point attempt = Clock::now();
    RequestOutput r =
        SendRequest(o, test.prompt, test.prompt_len, test.expected_output_len, attempt);
    if (r.success) return OkStatus();
    // Not up yet: nothing listens, or the server answers 503 while it loads.
    const bool retry = r.http_status == 0 || r.http_status == 503;
    if (!retry || Clock::now() + std::chrono::seconds(1) >= deadline) {
      return Unavailable("the initial test request failed: {}", r.error);
    }
    if (!waiting) {
      waiting = true;
      std::fprintf(stderr, "waiting up to %lld s for %s to answer (%s)\n",
                   static_cast<long long>(timeout_s), o.url().c_str(), r.error.c_str());
    }
    std::this_thread::sleep_until(attempt + std::chrono::seconds(1));
  }
}

ServeRunResult RunRequests(const ClientOptions& o, const std::vector<SampleRequest>& requests,
                           const std::vector<double>& arrivals, int64_t in_flight,
                           const ProgressFn& progress) {
  const int64_t n = static_cast<int64_t>(requests.size());
  ServeRunResult result;
  result.outputs.resize(n);
  // Arrived requests waiting for a slot, in arrival order; -1 closes the queue.
  std::mutex mu;
  std::condition_variable arrived;
  std::deque<int64_t> queue;
  int64_t done = 0;
  const Clock::time_point origin = Clock::now();

  const auto worker = [&] {
    for (;;) {
      int64_t i;
      {
        std::unique_lock<std::mutex> lock(mu);
        arrived.wait(lock, [&] { return !queue.empty(); });
        i = queue.front();
        if (i < 0) return;  // leave the sentinel for the other workers
        queue.pop_front();
      }
      const SampleRequest& r = requests[i];
      result.outputs[i] = SendRequest(o, r.prompt, r.prompt_len, r.expected_output_len, origin);
      std::lock_guard<std::mutex> lock(mu);
      ++done;
      if (progress) progress(done, n);
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(in_flight);
  for (int64_t w = 0; w < in_flight; ++w) threads.emplace_back(worker);
  for (int64_t i = 0; i < n; ++i) {
    std::this_thread::sleep_until(origin + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(arrivals[i])));
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(i);
    }
    arrived.notify_one();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    queue.push_back(-1);
  }
  arrived.notify_all();
  for (std::thread& t : threads) t.join();
  result.duration_s = std::chrono::duration<double>(Clock::now() - origin).count();
  return result;
}

ProgressBar::ProgressBar(bool enabled)
    : enabled_(enabled),
      tty_(isatty(STDERR_FILENO) != 0),
      start_(Clock::now()),
      last_print_(start_) {}

void ProgressBar::Update(int64_t done, int64_t total) {
  if (!enabled_) return;
  const Clock::time_point now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (!tty_ && done < total && now - last_print_ < std::chrono::seconds(10)) return;
  last_print_ = now;
  const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0;
  const double left = rate > 0 ? static_cast<double>(total - done) / rate : 0;
  const int64_t pct = total > 0 ? done * 100 / total : 100;
  std::string line;
  if (tty_) {
    constexpr int64_t kWidth = 40;
    const int64_t filled = total > 0 ? done * kWidth / total : kWidth;
    line = fmt::format("\r{:3}%|{}{}| {}/{} [{}<{}, {:.2f} req/s]", pct, std::string(filled, '#'),
                       std::string(kWidth - filled, ' '), done, total, Clock2(elapsed),
                       Clock2(left), rate);
    if (done == total) line += "\n";
  } else {
    line =
        fmt::format("{}/{} requests done ({}%), {} elapsed\n", done, total, pct, Clock2(elapsed));
  }
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace moeserve::bench
