// The HTTP front as an attacker meets it, through the real server (HttpServer's routes, no
// engine unless a test needs one) on loopback sockets: pipelined requests answered in order;
// header bytes, header count and body size (chunked too) refused before they are buffered; the
// header and body deadlines; the key checked before the body is read; the Host and Origin
// checks; thousands of idle connections held without harm to a request; the connection cap.
#include "server/http_front.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "io/model_config.h"
#include "model/causal_lm.h"
#include "server/http_server.h"
#include "tests/server_process.h"
#include "core/test_paths.h"

namespace moeserve::server {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kModelDir = MOESERVE_DEFAULT_MODEL_DIR;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Reads what the server sends until it closes the connection or `timeout` passes.
std::string ReadUntilClosed(int fd, std::chrono::milliseconds timeout, bool* closed = nullptr) {
  std::string out;
  const Clock::time_point until = Clock::now() + timeout;
  if (closed) *closed = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left.count() <= 0) return out;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return out;
    char buf[65536];
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) {
      if (closed) *closed = true;
      return out;
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

// Sends as much of `bytes` as the server takes; returns how many it took before it closed.
size_t SendAll(int fd, std::string_view bytes, std::chrono::milliseconds timeout = 5000ms) {
  size_t sent = 0;
  const Clock::time_point until = Clock::now() + timeout;
  while (sent < bytes.size() && Clock::now() < until) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    if (p.revents & (POLLERR | POLLHUP)) break;
    const ssize_t n =
        send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  return sent;
}

int StatusOf(std::string_view response, size_t at = 0) {
  return response.size() > at + 12 ? std::atoi(std::string(response.substr(at + 9, 3)).c_str())
                                   : -1;
}

// Every status line's code, in order.
std::vector<int> Statuses(const std::string& responses) {
  std::vector<int> out;
  for (size_t at = responses.find("HTTP/1.1 "); at != std::string::npos;
       at = responses.find("HTTP/1.1 ", at + 1)) {
    out.push_back(StatusOf(responses, at));
  }
  return out;
}

std::string Get(const std::string& path, const std::string& extra = "") {
  return fmt::format("GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\n{}\r\n", path, extra);
}

std::string Post(const std::string& path, const std::string& body, const std::string& extra = "") {
  return fmt::format("POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\n{}Content-Length: {}\r\n\r\n{}", path,
                     extra, body.size(), body);
}

// Resident memory means little under a sanitizer (shadow memory, quarantine): its checks are off.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kCountsMemory = false;
#else
constexpr bool kCountsMemory = true;
#endif

int64_t ResidentKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
  }
  return -1;
}

// A server on a loopback port with the front's limits made small and short for the tests.
class HttpFrontTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<tokenizer::Tokenizer>> tok =
        tokenizer::Tokenizer::LoadFromDir(kModelDir);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tok_ = std::move(*tok);
    options_.port = 0;
    options_.served_model_name = "default";
    options_.vocab_size = 8192;
    options_.http.max_body_bytes = 1 << 20;
    options_.http.header_timeout = 600ms;
    options_.http.body_timeout = 600ms;
    options_.http.keep_alive_timeout = 30s;
  }
  void TearDown() override {
    if (server_ != nullptr) {
      if (loop_ != nullptr) loop_->Stop();
      server_->Stop();
      listener_.join();
    }
  }

  void Start() {
    server_ = std::make_unique<HttpServer>(options_, *tok_, std::nullopt);
    ASSERT_TRUE(server_->Bind().ok());
    listener_ = std::thread([this] { server_->Listen(); });
  }

  // The default model behind the server (for generation requests).
  void StartWithEngine() {
    Result<std::unique_ptr<model::CausalLm>> lm =
        model::CausalLm::Load(kModelDir, {.weight_dtype = std::nullopt, .threads = 1});
    ASSERT_TRUE(lm.ok()) << lm.status().ToString();
    lm_ = std::move(*lm);
    Result<std::unique_ptr<engine::Engine>> engine = engine::Engine::Create(
        *lm_, {.max_num_seqs = 4, .max_num_batched_tokens = 128, .max_model_len = 128});
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    loop_ = std::make_unique<EngineLoop>(std::move(*engine));
    Start();
    server_->SetEngine(loop_.get());
  }

  int Connect() const { return e2e::ConnectLoopback(server_->port()); }

  // One exchange on a fresh connection: sends `bytes`, reads until the server closes (or 5 s).
  std::string Exchange(const std::string& bytes) const {
    const int fd = Connect();
    if (fd < 0) return "<no connection>";
    SendAll(fd, bytes);
    std::string out = ReadUntilClosed(fd, 5000ms);
    close(fd);
    return out;
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<model::CausalLm> lm_;
  std::unique_ptr<EngineLoop> loop_;
  ServerOptions options_;
  std::unique_ptr<HttpServer> server_;
  std::thread listener_;
};

TEST_F(HttpFrontTest, PipelinedRequestsAreAnsweredInOrder) {
  Start();
  // Three GETs in one write, then a mix whose answers differ, the last closing.
  std::string r =
      Exchange(Get("/version") + Get("/version") + Get("/version", "Connection: close\r\n"));
  EXPECT_EQ(Statuses(r), (std::vector<int>{200, 200, 200})) << r;
  r = Exchange(Get("/version") + Post("/detokenize", R"({"tokens": [72, 101]})") + Get("/nope") +
               Post("/detokenize", R"({"tokens": "x"})", "Connection: close\r\n"));
  EXPECT_EQ(Statuses(r), (std::vector<int>{200, 200, 404, 400})) << r;
  EXPECT_LT(r.find("\"version\""), r.find("\"prompt\"")) << r;
}

TEST_F(HttpFrontTest, AnOverlongHeaderIsRefusedWithoutBeingBuffered) {
  Start();
  // A header line of 32 MiB without a newline: a 431 once the limit is passed, then the
  // connection closes. What the client sends after the limit is read and dropped (so that it
  // can read the answer), never kept.
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  const int64_t before = ResidentKiB();
  const std::string line = "GET / HTTP/1.1\r\nX-Long: " + std::string(32 << 20, 'a');
  SendAll(fd, line, 3000ms);
  bool closed = false;
  const std::string r = ReadUntilClosed(fd, 7000ms, &closed);
  close(fd);
  EXPECT_EQ(StatusOf(r), 431) << r.substr(0, 200);
  EXPECT_NE(r.find("larger than 16384 bytes"), std::string::npos) << r;
  EXPECT_TRUE(closed);
  // The client's 32 MiB string is 32 MiB of this process; the server adds almost nothing.
  if (kCountsMemory) {
    EXPECT_LT(ResidentKiB() - before, (32 << 10) + 8 * 1024) << "KiB";
  }
}

TEST_F(HttpFrontTest, TooManyHeaderFieldsAreRefused) {
  Start();
  std::string many;
  for (int i = 0; i < 101; ++i) many += fmt::format("X-{}: v\r\n", i);
  EXPECT_EQ(StatusOf(Exchange(Get("/version", many))), 431);
  std::string enough;
  for (int i = 0; i < 90; ++i) enough += fmt::format("X-{}: v\r\n", i);
  EXPECT_EQ(StatusOf(Exchange(Get("/version", enough + "Connection: close\r\n"))), 200);
}

TEST_F(HttpFrontTest, HeaderAndBodyDeadlinesCloseSlowSenders) {
  Start();
  // Slowloris: a header byte every 100 ms never completes it; the deadline is 0.6 s, after
  // which the connection is closed.
  int fd = Connect();
  ASSERT_GE(fd, 0);
  const std::string header = Get("/version");
  const Clock::time_point start = Clock::now();
  std::string r;
  for (size_t i = 0; i < header.size() - 2 && Seconds(Clock::now() - start) < 5; ++i) {
    if (send(fd, &header[i], 1, MSG_NOSIGNAL) != 1) break;
    r += ReadUntilClosed(fd, 100ms);
    if (!r.empty()) break;
  }
  bool closed = false;
  r += ReadUntilClosed(fd, 2000ms, &closed);
  close(fd);
  EXPECT_TRUE(closed);
  EXPECT_EQ(r, "");
  EXPECT_LT(Seconds(Clock::now() - start), 3.0);

  // A body that stops halfway: closed once the body deadline passes.
  fd = Connect();
  ASSERT_GE(fd, 0);
  const std::string partial =
      "POST /detokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"tokens\"";
  SendAll(fd, partial);
  const Clock::time_point sent = Clock::now();
  r = ReadUntilClosed(fd, 3000ms, &closed);
  close(fd);
  EXPECT_TRUE(closed);
  EXPECT_EQ(r, "");
  EXPECT_LT(Seconds(Clock::now() - sent), 2.0);
}

TEST_F(HttpFrontTest, TheBodyLimitHoldsForChunkedBodiesAndBeforeReading) {
  Start();
  // Content-Length past the limit: refused on the header alone.
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  SendAll(fd, "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 20971520\r\n\r\n");
  std::string r = ReadUntilClosed(fd, 2000ms);
  close(fd);
  EXPECT_EQ(StatusOf(r), 413) << r;

  // Chunked: the sum of the chunks counts. 2 MiB in 64 KiB chunks passes the 1 MiB limit.
  const auto chunked = [](size_t total, const std::string& body_start) {
    std::string out =
        "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
        "Connection: close\r\n\r\n";
    std::string body = body_start;
    body.resize(total - 1, ' ');
    body += '}';
    for (size_t at = 0; at < body.size(); at += 65536) {
      const std::string chunk = body.substr(at, 65536);
      out += fmt::format("{:x}\r\n{}\r\n", chunk.size(), chunk);
    }
    return out + "0\r\n\r\n";
  };
  r = Exchange(chunked(2 << 20, R"({"prompt": "a")"));
  EXPECT_EQ(StatusOf(r), 413) << r.substr(0, 300);
  // Under the limit, chunked is served.
  r = Exchange(chunked(1000, R"({"prompt": "a")"));
  EXPECT_EQ(StatusOf(r), 200) << r.substr(0, 300);
}

TEST_F(HttpFrontTest, TheKeyIsCheckedBeforeTheBodyAndItsSchemeIsCaseInsensitive) {
  options_.api_key = "sekrit";
  Start();
  // 24 MiB announced, no key: the 401 comes at once, with nothing of the body sent.
  int fd = Connect();
  ASSERT_GE(fd, 0);
  SendAll(fd,
          "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 25165824\r\n\r\n");
  const Clock::time_point start = Clock::now();
  std::string r = ReadUntilClosed(fd, 2000ms);
  close(fd);
  EXPECT_EQ(StatusOf(r), 401) << r;
  EXPECT_LT(Seconds(Clock::now() - start), 1.5);

  const auto models = [&](const std::string& auth) {
    return StatusOf(
        Exchange(Get("/v1/models", "Authorization: " + auth + "\r\nConnection: close\r\n")));
  };
  EXPECT_EQ(models("Bearer sekrit"), 200);
  EXPECT_EQ(models("bearer sekrit"), 200);  // RFC 7235: the scheme is case-insensitive
  EXPECT_EQ(models("BEARER   sekrit"), 200);
  EXPECT_EQ(models("Bearer sekri"), 401);
  EXPECT_EQ(models("Bearer sekrit2"), 401);
  EXPECT_EQ(models("Basic sekrit"), 401);
  EXPECT_EQ(models("Bearersekrit"), 401);
  EXPECT_NE(models(std::string("Bearer sekrit\x01", 14)), 200);
  EXPECT_NE(models(std::string("Bearer sekrit\0junk", 18)), 200);
  // With a key any Host is served (the key is the protection).
  EXPECT_EQ(StatusOf(Exchange("GET /v1/models HTTP/1.1\r\nHost: evil.example\r\nAuthorization: "
                              "Bearer sekrit\r\nConnection: close\r\n\r\n")),
            200);
}

TEST_F(HttpFrontTest, HostAndOriginMustBeThisServersWithoutAKey) {
  options_.allowed_origins = {"http://app.example:3000"};
  Start();
  const int port = server_->port();
  const auto get = [&](const std::string& host, const std::string& extra = "") {
    return Exchange(fmt::format("GET /version HTTP/1.1\r\nHost: {}\r\n{}Connection: close\r\n\r\n",
                                host, extra));
  };
  // DNS rebinding: a name of the attacker's that resolves to 127.0.0.1.
  EXPECT_EQ(StatusOf(get("evil.example")), 403);
  EXPECT_EQ(StatusOf(get(fmt::format("evil.example:{}", port))), 403);
  EXPECT_EQ(StatusOf(get("10.1.2.3")), 403);
  // A name --allowed-origins gives (the server reached as http://app.example:3000) is served.
  EXPECT_EQ(StatusOf(get("app.example:3000")), 200);
  for (const std::string host :
       {"127.0.0.1", "localhost", "LocalHost:8000", "[::1]:9", "x.localhost", "127.0.0.2"}) {
    EXPECT_EQ(StatusOf(get(host)), 200) << host;
  }
  // A text/plain POST from a page elsewhere (no preflight in a browser): refused.
  const std::string body = R"({"prompt": "hi", "max_tokens": 1})";
  std::string r = Exchange(fmt::format(
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nOrigin: http://evil.example\r\n"
      "Content-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
      port, body.size(), body));
  EXPECT_EQ(StatusOf(r), 403) << r;
  EXPECT_NE(r.find("--allowed-origins"), std::string::npos) << r;
  EXPECT_EQ(StatusOf(get("127.0.0.1", "Origin: null\r\n")), 403);
  // The server's own page, and an allowed origin (which may read the answer: CORS).
  const std::string self = fmt::format("127.0.0.1:{}", port);
  EXPECT_EQ(StatusOf(get(self, "Origin: http://" + self + "\r\n")), 200);
  r = get("127.0.0.1", "Origin: http://app.example:3000\r\n");
  EXPECT_EQ(StatusOf(r), 200) << r;
  EXPECT_NE(r.find("Access-Control-Allow-Origin: http://app.example:3000"), std::string::npos);
  r = Exchange(
      "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: "
      "http://app.example:3000\r\nAccess-Control-Request-Method: POST\r\nConnection: "
      "close\r\n\r\n");
  EXPECT_EQ(StatusOf(r), 204) << r;
  EXPECT_NE(r.find("Access-Control-Allow-Headers: Authorization, Content-Type"), std::string::npos);
}

TEST_F(HttpFrontTest, ThousandsOfIdleConnectionsLeaveARequestPrompt) {
  // Client and server sockets of this process: 2 per connection.
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, 12000);
  setrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_cur < 9000) GTEST_SKIP() << "only " << limit.rlim_cur << " open files allowed";
  options_.http.header_timeout = 30s;  // the stalled headers stay for the whole test
  StartWithEngine();
  constexpr int kIdle = 4096;
  const int64_t before = ResidentKiB();
  std::vector<int> idle;
  for (int i = 0; i < kIdle; ++i) {
    const int fd = Connect();
    ASSERT_GE(fd, 0) << "connection " << i;
    idle.push_back(fd);
    if (i % 2 == 0) SendAll(fd, "GET /ver");  // half of them start a request and stall
  }
  for (int i = 0; i < 200 && server_->num_connections() < kIdle; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_GE(server_->num_connections(), static_cast<size_t>(kIdle));
  const int64_t grown = ResidentKiB() - before;
  // A generation on a new connection is served at once.
  const Clock::time_point start = Clock::now();
  const std::string r = Exchange(Post(
      "/v1/completions", R"({"prompt": "And it came to pass", "max_tokens": 4, "temperature": 0})",
      "Connection: close\r\n"));
  const double seconds = Seconds(Clock::now() - start);
  EXPECT_EQ(StatusOf(r), 200) << r;
  EXPECT_LT(seconds, 2.0);
  // Memory per connection: its buffers only (no thread, no stack).
  if (kCountsMemory) {
    EXPECT_LT(grown, 64 * 1024) << "KiB for " << kIdle << " connections";
  }
  RecordProperty("idle_connections_rss_kib", std::to_string(grown));
  for (int fd : idle) close(fd);
}

TEST_F(HttpFrontTest, ConnectionsPastTheCapAreClosedAtOnce) {
  options_.http.max_connections = 8;
  Start();
  std::vector<int> held;
  for (int i = 0; i < 8; ++i) held.push_back(Connect());
  for (int i = 0; i < 200 && server_->num_connections() < 8; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(server_->num_connections(), 8u);
  bool closed = false;
  const int extra = Connect();
  ASSERT_GE(extra, 0);  // the kernel completes the handshake; the server closes it
  ReadUntilClosed(extra, 2000ms, &closed);
  EXPECT_TRUE(closed);
  close(extra);
  close(held[0]);
  held[0] = -1;
  for (int i = 0; i < 200 && server_->num_connections() >= 8; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(StatusOf(Exchange(Get("/version", "Connection: close\r\n"))), 200);
  for (int fd : held) {
    if (fd >= 0) close(fd);
  }
}

}  // namespace
}  // namespace moeserve::server
