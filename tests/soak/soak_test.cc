// Soak: `moeserve serve` on the default model under MOESERVE_SOAK_CLIENTS concurrent clients
// (default 64) for MOESERVE_SOAK_SECONDS (default 60; tests/soak/run.sh runs 10 minutes). Each
// client loops over a random mix: greedy requests whose text must equal the solo answer taken
// before the load (streamed or not), sampled ones with random parameters and n up to 3, clients
// that disconnect at a random moment (streaming or not), and malformed requests that must get a
// 4xx. Afterwards: no valid request failed or hung; the server is idle again (nothing running or
// waiting, KV usage 0, as many open descriptors as before the load); its resident memory grew
// less than 10 % after warm-up; /metrics counts what the clients saw.
//
// Plain sockets with "Connection: close" (httplib's client drops connections now and then with
// many threads; see server_test).
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/run_binary.h"
#include "tests/server_process.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoll(v) : fallback;
}

struct HttpResult {
  int status = -1;  // -1: no answer (connection failed or timed out)
  std::string body;
};

// One request on a fresh connection. hang_up_after_ms >= 0: close the socket after that long
// without reading the answer (a client gone).
HttpResult Http(int port, const std::string& method, const std::string& path,
                const std::string& body, int hang_up_after_ms = -1) {
  HttpResult result;
  const int fd = e2e::ConnectLoopback(port);
  if (fd < 0) return result;
  timeval timeout{120, 0};  // a hung request fails the test instead of hanging it
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const std::string request = fmt::format(
      "{} {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
      "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
      method, path, body.size(), body);
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return result;
  }
  if (hang_up_after_ms >= 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(hang_up_after_ms));
    close(fd);
    result.status = 0;
    return result;
  }
  std::string raw;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) raw.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t head_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || head_end == std::string::npos) return result;
  result.status = std::atoi(raw.c_str() + 9);
  result.body = raw.substr(head_end + 4);
  return result;
}

// The texts and finish reasons of an answer, streamed (SSE over chunks) or not, by choice index.
struct Answer {
  bool ok = false;
  std::map<int, std::string> text;
  std::map<int, std::string> finish;
  int64_t completion_tokens = -1;
};

Answer Parse(const HttpResult& r, bool stream) {
  Answer a;
  if (r.status != 200) return a;
  try {
    if (!stream) {
      const json j = json::parse(r.body);
      for (const json& c : j["choices"]) {
        a.text[c["index"].get<int>()] = c["text"].get<std::string>();
        a.finish[c["index"].get<int>()] = c["finish_reason"].get<std::string>();
      }
      a.completion_tokens = j["usage"]["completion_tokens"].get<int64_t>();
      a.ok = true;
      return a;
    }
    size_t pos = 0;
    bool done = false;
    while ((pos = r.body.find("data: ", pos)) != std::string::npos) {
      const size_t end = r.body.find("\n\n", pos);
      const std::string data = r.body.substr(pos + 6, end - pos - 6);
      pos = end;
      if (data == "[DONE]") {
        done = true;
        break;
      }
      const json j = json::parse(data);
      if (j.contains("error")) return a;
      for (const json& c : j["choices"]) {
        const int i = c["index"].get<int>();
        a.text[i] += c["text"].get<std::string>();
        if (!c["finish_reason"].is_null()) a.finish[i] = c["finish_reason"].get<std::string>();
      }
    }
    a.ok = done;
  } catch (const std::exception&) {
    a.ok = false;
  }
  return a;
}

int64_t ResidentKb(pid_t pid) {
  const std::string status = e2e::ReadFile(fmt::format("/proc/{}/status", pid));
  const size_t at = status.find("VmRSS:");
  return at == std::string::npos ? -1 : std::atoll(status.c_str() + at + 6);
}

int64_t OpenFds(pid_t pid) {
  int64_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(fmt::format("/proc/{}/fd", pid))) {
    ++n;
  }
  return n;
}

// A sample of /metrics: name -> value, or name{finished_reason="..."} -> value (the other labels
// dropped).
std::map<std::string, double> Metrics(int port) {
  std::map<std::string, double> out;
  const HttpResult r = Http(port, "GET", "/metrics", "");
  size_t pos = 0;
  while (pos < r.body.size()) {
    const size_t end = std::min(r.body.find('\n', pos), r.body.size());
    const std::string line = r.body.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    const std::string series = line.substr(0, space);
    std::string key = series.substr(0, series.find('{'));
    const size_t reason = series.find("finished_reason=\"");
    if (reason != std::string::npos) {
      const size_t value_end = series.find('"', reason + 17);  // its closing quote
      key.append("{").append(series, reason, value_end + 1 - reason).append("}");
    }
    out[key] = std::atof(line.c_str() + space + 1);
  }
  return out;
}

const std::vector<std::string> kGreedyPrompts = {
    "And it came to pass", "The king said unto", "In the beginning", "Once upon a time",
    "The capital of France is", "He went up into the mountain", "Call me Ishmael.", "A B C D"};

// What the clients saw, summed.
struct Tally {
  std::atomic<int64_t> greedy{0}, sampled{0}, disconnects{0}, malformed{0};
  std::atomic<int64_t> finished_choices{0};  // choices seen ending with stop / length
  std::atomic<int64_t> disconnected_choices{0};
  std::atomic<int64_t> failures{0};
  std::mutex mu;
  std::vector<std::string> failure_notes;
  void Fail(const std::string& note) {
    ++failures;
    std::lock_guard lock(mu);
    if (failure_notes.size() < 20) failure_notes.push_back(note);
  }
};

// Under AddressSanitizer the server is a Debug build, many times slower, and its freed memory sits
// in quarantine (resident memory grows by design): a shorter run, without the memory check (LSan
// checks leaks at exit).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

TEST(SoakTest, ServerStaysCorrectAndFlatUnderLoad) {
  const int64_t seconds = EnvInt("MOESERVE_SOAK_SECONDS", kSanitized ? 30 : 60);
  const int64_t clients = EnvInt("MOESERVE_SOAK_CLIENTS", 64);
  const fs::path dir = fs::temp_directory_path() / fmt::format("moeserve_soak_{}", getpid());
  fs::create_directories(dir);
  e2e::ServerProcess server({"--max-model-len", "512", "--max-num-seqs", "32"}, dir / "serve.err");
  ASSERT_TRUE(server.ok()) << server.log();
  const int port = server.port();
  const pid_t pid = server.pid();

  // Solo answers of the greedy prompts, before any load.
  std::vector<std::string> solo;
  for (const std::string& p : kGreedyPrompts) {
    const json body = {{"prompt", p}, {"max_tokens", 24}, {"temperature", 0}};
    const Answer a = Parse(Http(port, "POST", "/v1/completions", body.dump()), false);
    ASSERT_TRUE(a.ok) << p;
    solo.push_back(a.text.at(0));
  }
  // Descriptors at rest (the solo answers' connections closed: let the server finish closing).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int64_t idle_fds = OpenFds(pid);

  Tally tally;
  std::atomic<int64_t> rss_after_warmup{-1};
  const Clock::time_point start = Clock::now(), stop = start + std::chrono::seconds(seconds);
  std::vector<std::thread> threads;
  for (int64_t c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937 rng(static_cast<uint32_t>(1000 + c));
      auto uniform = [&](double lo, double hi) {
        return std::uniform_real_distribution<double>(lo, hi)(rng);
      };
      while (Clock::now() < stop) {
        const int kind = static_cast<int>(rng() % 100);
        const bool stream = rng() % 2 == 0;
        if (kind < 40) {  // greedy: must be the solo answer
          const size_t i = rng() % kGreedyPrompts.size();
          json body = {{"prompt", kGreedyPrompts[i]}, {"max_tokens", 24}, {"temperature", 0},
                       {"stream", stream}};
          const Answer a = Parse(Http(port, "POST", "/v1/completions", body.dump()), stream);
          ++tally.greedy;
          if (!a.ok || a.text.count(0) == 0) {
            tally.Fail(fmt::format("greedy {} failed", i));
          } else if (a.text.at(0) != solo[i]) {
            tally.Fail(fmt::format("greedy {}: '{}' != solo '{}'", i, a.text.at(0), solo[i]));
          } else {
            tally.finished_choices += 1;
          }
        } else if (kind < 65) {  // sampled, random parameters, n up to 3
          const int n = 1 + static_cast<int>(rng() % 3);
          json body = {{"prompt", kGreedyPrompts[rng() % kGreedyPrompts.size()]},
                       {"max_tokens", 1 + static_cast<int>(rng() % 48)},
                       {"temperature", uniform(0.2, 1.5)},
                       {"top_p", uniform(0.3, 1.0)},
                       {"top_k", static_cast<int>(rng() % 50)},
                       {"n", n},
                       {"stream", stream}};
          if (rng() % 2 == 0) body["seed"] = static_cast<int>(rng() % 1000);
          if (rng() % 4 == 0) body["presence_penalty"] = uniform(-1.0, 1.0);
          const Answer a = Parse(Http(port, "POST", "/v1/completions", body.dump()), stream);
          ++tally.sampled;
          if (!a.ok || static_cast<int>(a.finish.size()) != n) {
            tally.Fail(fmt::format("sampled request failed: {}", body.dump()));
          } else {
            tally.finished_choices += n;
          }
        } else if (kind < 85) {  // a client gone at a random moment
          const int n = 1 + static_cast<int>(rng() % 2);
          const json body = {{"prompt", kGreedyPrompts[rng() % kGreedyPrompts.size()]},
                             {"max_tokens", 200}, {"ignore_eos", true}, {"temperature", 0.7},
                             {"n", n}, {"stream", stream}};
          const HttpResult r =
              Http(port, "POST", "/v1/completions", body.dump(), static_cast<int>(rng() % 60));
          ++tally.disconnects;
          if (r.status == 0) {
            tally.disconnected_choices += n;
          } else {
            tally.Fail("a hang-up's request could not be sent");
          }
        } else {  // malformed: a 4xx, never a 5xx or a dropped connection
          static const std::vector<std::string> bad = {
              "{", "[1,2]", "{\"prompt\": 5}", "{\"prompt\": \"x\", \"max_tokens\": -3}",
              "{\"prompt\": \"x\", \"n\": 100000}", "{\"prompt\": \"x\", \"temperature\": \"hot\"}",
              std::string(300, '[') + std::string(300, ']'), "{\"prompt\": [999999999]}",
              "{\"prompt\": \"x\", \"max_tokens\": 100000}", "{\"prompt\": \"\\ud800\"}",
              "{\"messages\": 3}"};
          const std::string& body = bad[rng() % bad.size()];
          const std::string path = rng() % 2 ? "/v1/completions" : "/v1/chat/completions";
          const HttpResult r = Http(port, "POST", path, body);
          ++tally.malformed;
          if (r.status < 400 || r.status >= 500) {
            tally.Fail(fmt::format("malformed {} to {} got {}: {}", body.substr(0, 40), path,
                                   r.status, r.body.substr(0, 200)));
          }
        }
        if (c == 0 && rss_after_warmup < 0 && Clock::now() - start > std::chrono::seconds(seconds / 4)) {
          rss_after_warmup = ResidentKb(pid);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const int64_t rss_end_of_load = ResidentKb(pid);

  // Idle again: nothing running or waiting, no KV in use, the connections closed, and the
  // requests counted (a hang-up's connection may still wait in the kernel's accept queue when the
  // rest looks idle). A client that closes right after sending may be gone before the server
  // reads its request (httplib then never routes it: about 1 in 60 of those closing at once),
  // so hang-ups are counted as at most what they sent and, on a release build, at least 95 % of
  // it (a sanitized server reads requests late: more of them are gone first).
  const double seen = static_cast<double>(tally.finished_choices + kGreedyPrompts.size());
  const double hung_up = static_cast<double>(tally.disconnected_choices.load());
  const double expected_ends = seen + (kSanitized ? 0.0 : 0.95) * hung_up;
  auto ends = [](std::map<std::string, double>& m) {
    return m["vllm:request_success_total{finished_reason=\"stop\"}"] +
           m["vllm:request_success_total{finished_reason=\"length\"}"] +
           m["vllm:request_success_total{finished_reason=\"abort\"}"];
  };
  std::map<std::string, double> m;
  bool idle = false;
  for (int i = 0; i < 300 && !idle; ++i) {
    m = Metrics(port);
    idle = m.count("vllm:num_requests_running") && m.count("vllm:kv_cache_usage_perc") &&
           m["vllm:num_requests_running"] == 0 && m["vllm:num_requests_waiting"] == 0 &&
           m["vllm:kv_cache_usage_perc"] == 0 && OpenFds(pid) <= idle_fds &&
           ends(m) >= expected_ends;
    if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(idle) << "running " << m["vllm:num_requests_running"] << ", waiting "
                    << m["vllm:num_requests_waiting"] << ", KV " << m["vllm:kv_cache_usage_perc"]
                    << ", fds " << OpenFds(pid) << " (idle " << idle_fds << ")";

  EXPECT_EQ(tally.failures.load(), 0) << fmt::format("{}", fmt::join(tally.failure_notes, "\n"));
  EXPECT_GT(tally.greedy.load(), 0);
  EXPECT_GT(tally.sampled.load(), 0);
  EXPECT_GT(tally.disconnects.load(), 0);
  EXPECT_GT(tally.malformed.load(), 0);

  // Memory: flat after warm-up.
  ASSERT_GT(rss_after_warmup.load(), 0);
  if (!kSanitized) {
    EXPECT_LT(static_cast<double>(rss_end_of_load), 1.10 * static_cast<double>(rss_after_warmup))
        << "resident memory grew from " << rss_after_warmup << " kB to " << rss_end_of_load
        << " kB";
  }

  // /metrics against the clients: every choice a client saw finish was counted as stop or
  // length; every choice of a client gone ended as an abort or, had it finished before the
  // hang-up was noticed, as stop / length too. (The solo answers count 8 more.)
  const double finished = m["vllm:request_success_total{finished_reason=\"stop\"}"] +
                          m["vllm:request_success_total{finished_reason=\"length\"}"];
  const double aborted = m["vllm:request_success_total{finished_reason=\"abort\"}"];
  const std::string counts = fmt::format("finished {}, aborted {}, clients saw {} finish and {} hang up",
                                         finished, aborted, seen, hung_up);
  EXPECT_GE(finished, seen) << counts;
  EXPECT_LE(finished + aborted, seen + hung_up) << counts;
  EXPECT_GE(finished + aborted, expected_ends) << counts;

  std::printf(
      "soak: %lld s, %lld clients: %lld greedy, %lld sampled, %lld disconnects, %lld malformed; "
      "RSS %lld -> %lld kB\n",
      static_cast<long long>(seconds), static_cast<long long>(clients),
      static_cast<long long>(tally.greedy), static_cast<long long>(tally.sampled),
      static_cast<long long>(tally.disconnects), static_cast<long long>(tally.malformed),
      static_cast<long long>(rss_after_warmup.load()), static_cast<long long>(rss_end_of_load));
  EXPECT_EQ(server.Stop(), 0) << server.log();
  if (!HasFailure()) fs::remove_all(dir);  // else kept: the server's log
}

}  // namespace
}  // namespace moeserve
