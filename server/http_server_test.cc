// The HTTP server in this process over a real engine on the default model, with clients on
// threads (plain loopback sockets): non-streaming and streaming greedy requests get the answer
// they get alone, clients that hang up mid-stream are aborted, malformed bodies get 400s,
// /metrics and /health are read meanwhile, and the server ends idle and stops cleanly. Run under
// ThreadSanitizer in CI: the handlers' threads, the engine loop, the jobs and the metrics.
#include "server/http_server.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "io/model_config.h"
#include "model/causal_lm.h"
#include "tests/server_process.h"
#include "core/test_paths.h"

namespace moeserve::server {
namespace {

const std::string kModelDir = MOESERVE_DEFAULT_MODEL_DIR;

// Sends one request on its own connection (Connection: close) and reads the answer: up to the
// server's close, or, with `hang_up_after` > 0, until that many bytes of it arrived.
std::string Exchange(int port, const std::string& method, const std::string& path,
                     const std::string& body, size_t hang_up_after = 0) {
  const int fd = e2e::ConnectLoopback(port);
  if (fd < 0) return "";
  const std::string request = fmt::format(
      "{} {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
      "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
      method, path, body.size(), body);
  std::string received;
  if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
    char buf[4096];
    ssize_t n;
    while ((hang_up_after == 0 || received.size() < hang_up_after) &&
           (n = read(fd, buf, sizeof(buf))) > 0) {
      received.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return received;
}

int StatusOf(const std::string& response) {
  return response.size() > 12 ? std::atoi(response.c_str() + 9) : -1;
}

// The generated text: a JSON body's choices[0].text, or the concatenated text of a stream's
// SSE chunks.
std::string TextOf(const std::string& response) {
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos) return "<no body>";
  if (response.find("text/event-stream") == std::string::npos) {
    auto j = nlohmann::json::parse(response.substr(body + 4), nullptr, false);
    return j.is_discarded() ? "<bad json>" : j["choices"][0]["text"].get<std::string>();
  }
  std::string text;
  for (size_t at = response.find("data: {", body); at != std::string::npos;
       at = response.find("data: {", at + 1)) {
    const size_t end = response.find('\n', at);
    auto j = nlohmann::json::parse(response.substr(at + 6, end - at - 6), nullptr, false);
    if (j.is_discarded()) return "<bad chunk>";
    if (!j["choices"].empty()) text += j["choices"][0]["text"].get<std::string>();
  }
  if (response.find("data: [DONE]") == std::string::npos) return "<unfinished stream>";
  return text;
}

std::string Completion(int i, bool stream) {
  return fmt::format(
      R"({{"prompt": [{}, {}, {}, {}], "max_tokens": 12, "temperature": 0, "ignore_eos": true,)"
      R"( "stream": {}}})",
      10 + i, 200 + 7 * i, 31 * i + 5, 99, stream);
}

TEST(HttpServerThreadsTest, ConcurrentClientsGetWhatTheyGetAlone) {
  Result<io::ModelConfig> config = io::LoadModelConfig(kModelDir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  Result<std::unique_ptr<tokenizer::Tokenizer>> tok = tokenizer::Tokenizer::LoadFromDir(kModelDir);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  Result<std::unique_ptr<model::CausalLm>> lm =
      model::CausalLm::Load(kModelDir, {.weight_dtype = std::nullopt, .threads = 1});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  Result<std::unique_ptr<engine::Engine>> engine = engine::Engine::Create(
      **lm, {.max_num_seqs = 4, .max_num_batched_tokens = 128, .max_model_len = 128});
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EngineLoop loop(std::move(*engine));

  ServerOptions options;
  options.port = e2e::FreePort();
  options.served_model_name = "default";
  options.vocab_size = config->vocab_size;
  HttpServer http(options, **tok, std::nullopt);
  ASSERT_TRUE(http.Bind().ok());
  std::thread listener([&] { http.Listen(); });
  http.SetEngine(&loop);
  const int port = options.port;

  constexpr int kClients = 6;
  std::vector<std::string> alone(kClients);
  for (int i = 0; i < kClients; ++i) {
    const std::string r = Exchange(port, "POST", "/v1/completions", Completion(i, false));
    ASSERT_EQ(StatusOf(r), 200) << r;
    alone[i] = TextOf(r);
    ASSERT_FALSE(alone[i].empty());
  }

  std::atomic<int> mismatches{0}, wrong_status{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      for (int round = 0; round < 3; ++round) {
        const bool stream = (i + round) % 2 == 1;
        if (i == 0 && round == 1) {  // a client gone mid-stream
          Exchange(port, "POST", "/v1/completions", Completion(i, true), 200);
          continue;
        }
        if (i == 1 && round == 2) {  // malformed bodies among the others
          for (const char* bad : {"{\"prompt\": [1, 2", "[1]", "{\"prompt\": \"x\", \"n\": 0}"}) {
            if (StatusOf(Exchange(port, "POST", "/v1/completions", bad)) != 400) ++wrong_status;
          }
          if (StatusOf(Exchange(port, "GET", "/metrics", "")) != 200) ++wrong_status;
          if (StatusOf(Exchange(port, "GET", "/health", "")) != 200) ++wrong_status;
          continue;
        }
        const std::string r = Exchange(port, "POST", "/v1/completions", Completion(i, stream));
        if (StatusOf(r) != 200) {
          ++wrong_status;
        } else if (TextOf(r) != alone[i]) {
          ++mismatches;
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(wrong_status.load(), 0);
  // The hung-up stream is aborted: the engine ends idle.
  EXPECT_TRUE(loop.WaitUntilIdle(std::chrono::seconds(60)));

  // The same routes without a socket (the HTTP fuzz target's way in): the same answers, and
  // requests one after another on one connection each answered.
  const auto raw = [](const std::string& method, const std::string& path,
                      const std::string& body) {
    return fmt::format("{} {} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n{}", method,
                       path, body.size(), body);
  };
  for (bool stream : {false, true}) {
    const std::string r = http.ServeBytes(raw("POST", "/v1/completions", Completion(2, stream)));
    EXPECT_EQ(StatusOf(r), 200) << r;
    EXPECT_EQ(TextOf(r), alone[2]) << r;
  }
  const std::string two = http.ServeBytes(raw("GET", "/health", "") + raw("POST", "/tokenize", R"({"prompt": "hi"})"));
  EXPECT_EQ(StatusOf(two), 200) << two;
  EXPECT_NE(two.find("HTTP/1.1 200", 10), std::string::npos) << two;
  EXPECT_NE(two.find("\"tokens\""), std::string::npos) << two;
  EXPECT_EQ(StatusOf(http.ServeBytes(raw("POST", "/v1/completions", "{\"prompt\": 5}"))), 400);

  loop.Stop();
  http.Stop();
  listener.join();
  EXPECT_TRUE(loop.healthy());
}

// A port in use is refused (httplib's default SO_REUSEPORT would let a second server share it
// and take half its connections).
TEST(HttpServerBindTest, APortInUseIsRefused) {
  Result<std::unique_ptr<tokenizer::Tokenizer>> tok = tokenizer::Tokenizer::LoadFromDir(kModelDir);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  ServerOptions options;
  options.port = 0;
  HttpServer first(options, **tok, std::nullopt);
  ASSERT_TRUE(first.Bind().ok());
  options.port = first.port();
  ASSERT_GT(options.port, 0);
  HttpServer second(options, **tok, std::nullopt);
  const Status s = second.Bind();
  EXPECT_FALSE(s.ok()) << "a second server bound port " << options.port;
  EXPECT_NE(s.message().find(std::to_string(options.port)), std::string::npos) << s.message();
}

// GET /: the chat page, with this server's facts in its config script -- served while the model
// loads too; the values are escaped so none can close the script; --no-ui makes / a 404.
TEST(HttpServerChatPageTest, ServesThePageWithItsConfigAndNoUiRemovesIt) {
  Result<std::unique_ptr<tokenizer::Tokenizer>> tok = tokenizer::Tokenizer::LoadFromDir(kModelDir);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const auto get = [](HttpServer& http, const std::string& path) {
    return http.ServeBytes(fmt::format("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", path));
  };
  ServerOptions options;
  options.served_model_name = "m</script><script>alert(1)</script>";
  options.api_key = "k";
  options.default_params.temperature = 0.7;
  options.max_tokens_cap = 99;
  options.speculative = "mtp:1";
  {
    HttpServer http(options, **tok, std::nullopt);
    const std::string r = get(http, "/");
    ASSERT_EQ(StatusOf(r), 200) << r.substr(0, 300);
    EXPECT_NE(r.find("Content-Type: text/html; charset=utf-8"), std::string::npos);
    EXPECT_NE(r.find("Content-Security-Policy: default-src 'none'"), std::string::npos);
    EXPECT_EQ(r.find("__MOESERVE_CONFIG__"), std::string::npos);
    EXPECT_EQ(r.find("alert(1)</script>"), std::string::npos) << "a value closed the script";
    // The config as the page reads it: the text of <script id="moeserve-config">.
    const std::string open = "<script id=\"moeserve-config\" type=\"application/json\">";
    const size_t begin = r.find(open);
    ASSERT_NE(begin, std::string::npos);
    const size_t end = r.find("</script>", begin);
    ASSERT_NE(end, std::string::npos);
    const nlohmann::json config = nlohmann::json::parse(
        r.substr(begin + open.size(), end - begin - open.size()), nullptr, false);
    ASSERT_TRUE(config.is_object()) << r.substr(begin, end - begin);
    EXPECT_EQ(config["model"], options.served_model_name);
    EXPECT_EQ(config["api_key_required"], true);
    EXPECT_EQ(config["defaults"]["temperature"], 0.7);
    EXPECT_EQ(config["defaults"]["max_tokens"], 99);
    EXPECT_TRUE(config["defaults"]["seed"].is_null());
    EXPECT_TRUE(config["max_model_len"].is_null()) << "no engine yet";
    EXPECT_EQ(config["speculative"], "mtp:1");
    // No key needed for the page itself; the API still wants it.
    EXPECT_EQ(StatusOf(get(http, "/v1/models")), 401);
  }
  options.ui = false;
  HttpServer http(options, **tok, std::nullopt);
  EXPECT_EQ(StatusOf(get(http, "/")), 404);
  EXPECT_EQ(StatusOf(get(http, "/health")), 503);
}

}  // namespace
}  // namespace moeserve::server
