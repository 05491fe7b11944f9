#include "bench/serve_metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

namespace moeserve::bench {
namespace {

using nlohmann::ordered_json;

constexpr int kRowWidth = 50;  // the summary's rules

// Python's "{:<40} {:<10}" row.
std::string Row(const std::string& label, const std::string& value) {
  return fmt::format("{:<40} {:<10}\n", label, value);
}
std::string Row(const std::string& label, double value) {
  return Row(label, fmt::format("{:.2f}", value));
}

// Python's "{s:{c}^{n}}": `title` centred in a rule of `c`, the odd pad on the right.
std::string Rule(const std::string& title, char c) {
  const int pad = std::max(0, kRowWidth - static_cast<int>(title.size()));
  return std::string(pad / 2, c) + title + std::string(pad - pad / 2, c) + "\n";
}

const MetricStats& StatsOf(const BenchmarkMetrics& m, const std::string& name) {
  if (name == "ttft") return m.ttft;
  if (name == "tpot") return m.tpot;
  if (name == "itl") return m.itl;
  return m.e2el;
}

struct MetricLabels {
  const char* key;
  const char* name;
  const char* header;
};
constexpr MetricLabels kMetrics[] = {
    {"ttft", "TTFT", "Time to First Token"},
    {"tpot", "TPOT", "Time per Output Token (excl. 1st token)"},
    {"itl", "ITL", "Inter-token Latency"},
    {"e2el", "E2EL", "End-to-end Latency"},
};

bool Selected(const RunInfo& run, const std::string& key) {
  return std::find(run.percentile_metrics.begin(), run.percentile_metrics.end(), key) !=
         run.percentile_metrics.end();
}

}  // namespace

Result<GoodputSlo> ParseGoodput(const std::string& text) {
  GoodputSlo slo;
  std::string spaced = text;
  std::replace(spaced.begin(), spaced.end(), ',', ' ');
  std::istringstream words(spaced);
  std::string pair;
  while (words >> pair) {
    const size_t colon = pair.find(':');
    const auto bad_format = [&] {
      return InvalidArgument(
          "--goodput: '{}' is not KEY:VALUE (a metric name ttft, tpot or e2el and a "
          "number of milliseconds)",
          pair);
    };
    if (colon == std::string::npos || pair.find(':', colon + 1) != std::string::npos) {
      return bad_format();
    }
    const std::string key = pair.substr(0, colon);
    const std::string value_text = pair.substr(colon + 1);
    size_t used = 0;
    double value = 0;
    try {
      value = std::stod(value_text, &used);
    } catch (const std::exception&) {
      return bad_format();
    }
    if (used != value_text.size() || !std::isfinite(value)) return bad_format();
    if (value < 0) {
      return InvalidArgument("--goodput: {} must be non-negative (got {})", key, value_text);
    }
    if (key == "ttft") {
      slo.ttft_ms = value;
    } else if (key == "tpot") {
      slo.tpot_ms = value;
    } else if (key == "e2el") {
      slo.e2el_ms = value;
    } else {
      return InvalidArgument("--goodput: unknown metric '{}' (expected ttft, tpot or e2el)", key);
    }
  }
  return slo;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

MetricStats ComputeStats(const std::vector<double>& seconds,
                         const std::vector<double>& percentiles) {
  MetricStats s;
  if (!seconds.empty()) {
    const double n = static_cast<double>(seconds.size());
    const double mean = std::accumulate(seconds.begin(), seconds.end(), 0.0) / n;
    double var = 0;
    for (double v : seconds) var += (v - mean) * (v - mean);
    s.mean_ms = mean * 1000;
    s.std_ms = std::sqrt(var / n) * 1000;
    s.median_ms = Percentile(seconds, 50) * 1000;
  }
  for (double p : percentiles) s.percentiles_ms.emplace_back(p, Percentile(seconds, p) * 1000);
  return s;
}

BenchmarkMetrics CalculateMetrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                  const std::vector<double>& percentiles, const GoodputSlo& goodput,
                                  const TokenCounter& count_tokens) {
  BenchmarkMetrics m;
  std::vector<double> ttfts, tpots, itls, e2els;
  int64_t good = 0;
  for (const RequestOutput& o : outputs) {
    if (!o.success) {
      m.output_lens.push_back(0);
      ++m.failed;
      continue;
    }
    int64_t output_len = o.output_tokens;
    if (output_len == 0 && count_tokens) output_len = count_tokens(o.generated_text);
    m.output_lens.push_back(output_len);
    m.total_input += o.prompt_len;
    // TPOT excludes the first token; with one token there is no TPOT (0 for goodput).
    double tpot = 0;
    if (output_len > 1) {
      tpot = (o.latency - o.ttft) / static_cast<double>(output_len - 1);
      tpots.push_back(tpot);
    }
    itls.insert(itls.end(), o.itl.begin(), o.itl.end());
    ttfts.push_back(o.ttft);
    e2els.push_back(o.latency);
    ++m.completed;
    if (!goodput.empty()) {
      const auto meets = [](const std::optional<double>& slo_ms, double seconds) {
        return !slo_ms || *slo_ms / 1000.0 >= seconds;
      };
      good += meets(goodput.ttft_ms, o.ttft) && meets(goodput.tpot_ms, tpot) &&
              meets(goodput.e2el_ms, o.latency);
    }
  }
  m.total_output = std::accumulate(m.output_lens.begin(), m.output_lens.end(), int64_t{0});
  const double total_input = static_cast<double>(m.total_input);
  const double total_output = static_cast<double>(m.total_output);
  m.request_throughput = static_cast<double>(m.completed) / duration_s;
  m.request_goodput = static_cast<double>(good) / duration_s;
  m.output_throughput = total_output / duration_s;
  m.total_token_throughput = (total_input + total_output) / duration_s;
  m.ttft = ComputeStats(ttfts, percentiles);
  m.tpot = ComputeStats(tpots, percentiles);
  m.itl = ComputeStats(itls, percentiles);
  m.e2el = ComputeStats(e2els, percentiles);

  // Busiest second: buckets of 1 s from the earliest send of a successful request. A chunk lands
  // at start + ttft + the ITLs so far; a request is in flight in every bucket from the one of its
  // send to the one of its last chunk, both included.
  double first = std::numeric_limits<double>::infinity();
  double last = -std::numeric_limits<double>::infinity();
  for (const RequestOutput& o : outputs) {
    if (!o.success) continue;
    first = std::min(first, o.start_time);
    last = std::max(last, o.start_time + o.latency);
  }
  if (m.completed > 0) {
    const size_t buckets = static_cast<size_t>(std::ceil(last - first)) + 1;
    std::vector<double> chunks(buckets, 0);
    std::vector<int64_t> in_flight(buckets, 0);
    const auto bucket_of = [&](double t) { return static_cast<int64_t>(t - first); };
    for (const RequestOutput& o : outputs) {
      if (!o.success) continue;
      double t = o.start_time + o.ttft;
      const auto count = [&](double when) {
        const int64_t b = bucket_of(when);
        if (b >= 0 && b < static_cast<int64_t>(buckets)) chunks[b] += 1;
      };
      count(t);
      for (double gap : o.itl) {
        t += gap;
        count(t);
      }
      const int64_t begin = bucket_of(o.start_time);
      const int64_t end =
          std::min(bucket_of(o.start_time + o.latency), static_cast<int64_t>(buckets) - 1);
      for (int64_t b = std::max<int64_t>(begin, 0); b <= end; ++b) ++in_flight[b];
    }
    m.max_output_tokens_per_s = *std::max_element(chunks.begin(), chunks.end());
    m.max_concurrent_requests = *std::max_element(in_flight.begin(), in_flight.end());
  }
  return m;
}

std::string PercentileName(double p) {
  if (p == std::floor(p) && std::abs(p) < 1e15) return fmt::format("{}", static_cast<int64_t>(p));
  return fmt::format("{}", p);
}

std::string FormatSummary(const RunInfo& run, const BenchmarkMetrics& m) {
  std::string s = Rule(" Serving Benchmark Result ", '=');
  s += Row("Successful requests:", std::to_string(m.completed));
  s += Row("Failed requests:", std::to_string(m.failed));
  if (run.max_concurrency) {
    s += Row("Maximum request concurrency:", std::to_string(*run.max_concurrency));
  }
  if (!std::isinf(run.request_rate)) s += Row("Request rate configured (RPS):", run.request_rate);
  s += Row("Benchmark duration (s):", run.duration_s);
  s += Row("Total input tokens:", std::to_string(m.total_input));
  s += Row("Total generated tokens:", std::to_string(m.total_output));
  s += Row("Request throughput (req/s):", m.request_throughput);
  if (!run.goodput.empty()) s += Row("Request goodput (req/s):", m.request_goodput);
  s += Row("Output token throughput (tok/s):", m.output_throughput);
  s += Row("Peak output token throughput (tok/s):", m.max_output_tokens_per_s);
  s += Row("Peak concurrent requests:", static_cast<double>(m.max_concurrent_requests));
  s += Row("Total Token throughput (tok/s):", m.total_token_throughput);
  for (const MetricLabels& metric : kMetrics) {
    if (!Selected(run, metric.key)) continue;
    const MetricStats& st = StatsOf(m, metric.key);
    s += Rule(metric.header, '-');
    s += Row(fmt::format("Mean {} (ms):", metric.name), st.mean_ms);
    s += Row(fmt::format("Median {} (ms):", metric.name), st.median_ms);
    for (const auto& [p, value] : st.percentiles_ms) {
      s += Row(fmt::format("P{} {} (ms):", PercentileName(p), metric.name), value);
    }
  }
  s += std::string(kRowWidth, '=') + "\n";
  return s;
}

std::string ResultJson(const RunInfo& run, const BenchmarkMetrics& m,
                       const std::vector<RequestOutput>& outputs, const std::string& date) {
  ordered_json j;
  j["date"] = date;
  j["endpoint_type"] = run.backend;
  j["backend"] = run.backend;
  j["label"] = nullptr;
  j["model_id"] = run.model_id;
  j["tokenizer_id"] = run.tokenizer_id;
  j["num_prompts"] = run.num_prompts;
  j["request_rate"] =
      std::isinf(run.request_rate) ? ordered_json("inf") : ordered_json(run.request_rate);
  j["burstiness"] = run.burstiness;
  j["max_concurrency"] =
      run.max_concurrency ? ordered_json(*run.max_concurrency) : ordered_json(nullptr);
  j["duration"] = run.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] =
      run.goodput.empty() ? ordered_json(nullptr) : ordered_json(m.request_goodput);
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  ordered_json input_lens = ordered_json::array(), ttfts = ordered_json::array(),
               itls = ordered_json::array(), texts = ordered_json::array(),
               errors = ordered_json::array();
  for (const RequestOutput& o : outputs) {
    input_lens.push_back(o.prompt_len);
    ttfts.push_back(o.ttft);
    itls.push_back(o.itl);
    texts.push_back(o.generated_text);
    errors.push_back(o.error);
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = m.output_lens;
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["generated_texts"] = std::move(texts);
  j["errors"] = std::move(errors);
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  for (const MetricLabels& metric : kMetrics) {
    if (!Selected(run, metric.key)) continue;
    const MetricStats& st = StatsOf(m, metric.key);
    const std::string key = metric.key;
    j["mean_" + key + "_ms"] = st.mean_ms;
    j["median_" + key + "_ms"] = st.median_ms;
    j["std_" + key + "_ms"] = st.std_ms;
    for (const auto& [p, value] : st.percentiles_ms) {
      j["p" + PercentileName(p) + "_" + key + "_ms"] = value;
    }
  }
  // Invalid UTF-8 in a generated text (a chunk boundary inside a character) becomes U+FFFD.
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

}  // namespace moeserve::bench
