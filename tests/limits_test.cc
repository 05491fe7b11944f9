// Limits that protect the server (issue #16): a bounded waiting queue, and a non-streaming
// client that hangs up gets its request aborted. With --max-num-seqs 1
// and --max-waiting-requests 2, one request runs, two wait, and the next is refused at once with
// a 503 naming the limit; once they are gone requests are served again. Steps are slowed by a
// modelled link (--tp 2 --comm-sim) so that the running request lasts while the others arrive.
// (The loop learns which requests a step started when the step ends, so the bound can lag by
// one step's admissions: the test sends the waiting ones after the first has its first token.)
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/run_binary.h"
#include "tests/server_process.h"
#include "core/test_paths.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A streaming completion on a plain socket, left open once the response headers have arrived
// (the server has queued it by then) -- or, with first_token, once its first token has. Returns
// the socket, or -1.
int OpenStream(int port, int max_tokens, bool first_token = false) {
  const int fd = e2e::ConnectLoopback(port);
  if (fd < 0) return -1;
  const std::string body = json{{"prompt", "a b c"},
                                {"max_tokens", max_tokens},
                                {"ignore_eos", true},
                                {"stream", true}}
                               .dump();
  const std::string request = fmt::format(
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: {}\r\n\r\n{}",
      body.size(), body);
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return -1;
  }
  std::string received;
  char c;
  const std::string until = first_token ? "data: " : "\r\n\r\n";
  while (received.find(until) == std::string::npos && read(fd, &c, 1) == 1) received += c;
  if (received.find(" 200 ") == std::string::npos) {
    close(fd);
    return -1;
  }
  return fd;
}

// make-model's tiny Qwen3-Next in dir/model; its path, or "" when make-model failed.
std::string MakeTinyModel(const fs::path& dir) {
  fs::create_directories(dir);
  const std::string model = (dir / "model").string();
  const e2e::CommandResult made = e2e::RunMoeserve(
      fmt::format("make-model --arch qwen3_next --preset tiny --seed 3 --out {}", model),
      dir / "make.err");
  return made.exit_code == 0 ? model : "";
}

TEST(LimitsTest, WaitingQueueIsBoundedWith503) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("moeserve_limits_{}", getpid());
  const std::string model = MakeTinyModel(dir);
  ASSERT_FALSE(model.empty());
  e2e::ServerProcess server({"--model", model, "--max-model-len", "256", "--max-num-seqs", "1",
                             "--max-waiting-requests", "2", "--tp", "2", "--comm-sim", "500,1",
                             "--spec", "none"},  // steps of one token: the timing above holds
                            dir / "serve.err");
  ASSERT_TRUE(server.ok()) << server.log();

  // One runs (each step waits ~10 modelled collectives of 0.5 ms: 200 tokens take over a
  // second), two wait.
  const int running = OpenStream(server.port(), 200, /*first_token=*/true);
  ASSERT_GE(running, 0);
  const int waiting1 = OpenStream(server.port(), 200), waiting2 = OpenStream(server.port(), 200);
  ASSERT_GE(waiting1, 0);
  ASSERT_GE(waiting2, 0);

  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(60, 0);
  const json body = {{"prompt", "x"}, {"max_tokens", 2}};
  auto refused = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503) << refused->body;
  const json error = json::parse(refused->body)["error"];
  EXPECT_EQ(error["code"], 503);
  EXPECT_NE(error["message"].get<std::string>().find("--max-waiting-requests"), std::string::npos)
      << error;
  // A stream is refused the same way, before any byte of a stream.
  json streamed = body;
  streamed["stream"] = true;
  auto refused_stream = c.Post("/v1/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(refused_stream);
  EXPECT_EQ(refused_stream->status, 503) << refused_stream->body;

  // Clients gone: their requests are aborted, and the queue has room again.
  close(running);
  close(waiting1);
  close(waiting2);
  int status = 0;
  for (int i = 0; i < 100 && status != 200; ++i) {
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    status = r ? r->status : -1;
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(status, 200);

  // A non-streaming client that hangs up is noticed (within a poll) and its request aborted,
  // long before its 200 tokens would be done.
  const int fd = e2e::ConnectLoopback(server.port());
  ASSERT_GE(fd, 0);
  const std::string long_body =
      json{{"prompt", "a b c"}, {"max_tokens", 200}, {"ignore_eos", true}}.dump();
  const std::string request = fmt::format(
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: {}\r\n\r\n{}",
      long_body.size(), long_body);
  ASSERT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  close(fd);
  bool aborted = false;
  for (int i = 0; i < 50 && !aborted; ++i) {
    aborted = server.log().find("hung up before its answer") != std::string::npos;
    if (!aborted) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(aborted) << server.log();
  EXPECT_EQ(server.Stop(), 0) << server.log();
  fs::remove_all(dir);
}

// SIGTERM with --shutdown-timeout: new requests get a 503 at once, the one in flight finishes
// whole if it can within the timeout, else is aborted when it passes; either way exit 0.
TEST(LimitsTest, ShutdownTimeoutLetsRequestsInFlightFinish) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("moeserve_shutdown_{}", getpid());
  const std::string model = MakeTinyModel(dir);
  ASSERT_FALSE(model.empty());
  for (const auto& [timeout, max_tokens] : std::vector<std::pair<int, int>>{{30, 40}, {1, 240}}) {
    SCOPED_TRACE(fmt::format("--shutdown-timeout {}, max_tokens {}", timeout, max_tokens));
    e2e::ServerProcess server({"--model", model, "--max-model-len", "256", "--tp", "2",
                               "--comm-sim", "500,1", "--shutdown-timeout",
                               std::to_string(timeout)},
                              dir / "serve.err");
    ASSERT_TRUE(server.ok()) << server.log();
    json answer;
    int status = 0;
    std::chrono::steady_clock::time_point answered;
    std::thread client([&] {
      httplib::Client c("127.0.0.1", server.port());
      c.set_read_timeout(60, 0);
      auto r = c.Post("/v1/completions",
                      json{{"prompt", "a b"}, {"max_tokens", max_tokens}, {"ignore_eos", true}}
                          .dump(),
                      "application/json");
      status = r ? r->status : -1;
      answered = std::chrono::steady_clock::now();
      if (r && r->status == 200) answer = json::parse(r->body);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto start = std::chrono::steady_clock::now();
    server.Signal(SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    httplib::Client late("127.0.0.1", server.port());
    auto refused = late.Post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 1}}.dump(),
                             "application/json");
    if (refused) {  // (or the port is already closed)
      EXPECT_EQ(refused->status, 503) << refused->body;
    }
    client.join();
    EXPECT_EQ(server.Wait(), 0) << server.log();
    const double seconds = std::chrono::duration<double>(answered - start).count();
    ASSERT_EQ(status, 200);
    const json& choice = answer["choices"][0];
    if (timeout == 30) {  // far less work than the timeout: done whole
      EXPECT_EQ(choice["finish_reason"], "length");
      EXPECT_EQ(answer["usage"]["completion_tokens"], max_tokens);
    } else {  // several times the 1 s allowed: aborted at the timeout
      EXPECT_EQ(choice["finish_reason"], "abort");
      EXPECT_LT(answer["usage"]["completion_tokens"].get<int>(), max_tokens);
      EXPECT_LT(seconds, 2.5);
    }
  }
  fs::remove_all(dir);
}

TEST(LimitsTest, BadBoundsAreUsageErrors) {
  for (const std::string flag :
       {"--max-waiting-requests -1", "--shutdown-timeout -1", "--shutdown-timeout 99999999",
        "--mc2-max-tokens -5", "--tp 0", "--tp 99999", "--state-cache-memory -1",
        "--state-cache-memory 1e300", "--state-cache-memory nan", "--state-checkpoint-interval 100",
        "--state-checkpoint-interval -64", "--state-checkpoint-interval 99999999999999999999"}) {
    const e2e::CommandResult r =
        e2e::RunMoeserve("serve " + flag, fs::temp_directory_path() / "limits_usage.err");
    EXPECT_EQ(r.exit_code, 2) << flag;
    EXPECT_NE(r.err.find(flag.substr(0, flag.find(' '))), std::string::npos) << flag << ": " << r.err;
  }
  for (const std::string flag : {"--turns 0", "--turns 1001", "--turns -3"}) {
    const e2e::CommandResult r = e2e::RunMoeserve("bench latency " + flag,
                                                  fs::temp_directory_path() / "limits_usage.err");
    EXPECT_EQ(r.exit_code, 2) << flag;
    EXPECT_NE(r.err.find("--turns"), std::string::npos) << flag << ": " << r.err;
  }
  // SIMD targets, trace files and the ablation: each refusal names the flag and the value.
  const fs::path err_file = fs::temp_directory_path() / "limits_usage.err";
  for (const auto& [args, wanted] : std::vector<std::pair<std::string, std::string>>{
           {"generate --prompt hi --isa neon", "--isa: 'neon' is not a SIMD target of this build"},
           {"generate --prompt hi --weight-dtype int3",
            "--weight-dtype: 'int3' is not bf16, f32, int8, int4, w8a8 or w4a8"},
           {"generate --prompt hi --weight-dtype i8", "--weight-dtype: 'i8' is not"},
           {"generate --prompt hi --ggml-activations int4",
            "--ggml-activations: 'int4' is not int8 or f32"},
           {"generate --prompt hi --ggml-activations ''", "--ggml-activations: '' is not"},
           {"generate --prompt hi --isa avx2x", "--isa: 'avx2x'"},
           {"generate --prompt hi --trace /nonexistent-dir/t.json", "--trace: cannot write"},
           {"generate --prompt hi --trace /tmp", "--trace: cannot write '/tmp'"},
           {"bench latency --ablation --turns 2", "--ablation measures batches, not --turns"},
           {"bench latency --report /nonexistent-dir/r.html", "--report: cannot write"},
           {"bench latency --report /tmp", "--report: cannot write '/tmp'"},
           {"bench latency --json /nonexistent-dir/r.json", "--json: cannot write"},
           {"bench latency --report r.html --turns 2", "--report charts batches, not --turns"},
           {"bench latency --ablation --ablation-rounds 0", "--ablation-rounds must be in [1, 100]"}}) {
    const e2e::CommandResult r = e2e::RunMoeserve(args, err_file);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_NE(r.err.find(wanted), std::string::npos) << args << ": " << r.err;
  }
  for (const std::string value : {"bogus", "AVX9", "' '"}) {
    const e2e::CommandResult r =
        e2e::RunShell("MOESERVE_ISA=" + value + " " + MOESERVE_BINARY + " inspect", err_file);
    EXPECT_EQ(r.exit_code, 2) << value;
    EXPECT_NE(r.err.find("MOESERVE_ISA: '"), std::string::npos) << value << ": " << r.err;
  }
}

}  // namespace
}  // namespace moeserve
