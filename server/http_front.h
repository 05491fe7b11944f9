// The HTTP/1.1 front of the server: connections, parsing, limits and deadlines, on Boost.Beast
// over Asio (docs/reliability.md says why). One I/O thread runs every socket; route handlers run
// on a small pool of worker threads, so no connection holds a thread: idle, streaming and
// waiting connections cost their buffers only. Knows nothing of OpenAI or the engine: the routes
// are an HttpRouter's (http_server.cc).
//
// A request is read in two steps. The header section (bounded in bytes, count and time) goes to
// the router's CheckHeader first -- host, origin, key -- and only then is the body read (bounded
// in bytes, chunked or not, and in time), so a refused request costs its header only. Requests
// pipelined on one connection are answered in order. While a handler or a generation runs, the
// connection keeps reading: a client that hangs up is seen at once and its answer aborted.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace moeserve::server {

struct HttpLimits {
  size_t max_header_bytes = 16 << 10;  // request line and header fields
  size_t max_header_count = 100;
  size_t max_body_bytes = 16 << 20;  // Content-Length or the sum of a chunked body's chunks
  // The whole header section must arrive within header_timeout of its first byte, and the whole
  // body within body_timeout of the header's end (a slow sender cannot hold a connection).
  std::chrono::milliseconds header_timeout{10'000};
  std::chrono::milliseconds body_timeout{60'000};
  // A connection with no request in flight is closed after this long (uvicorn's default, 5 s).
  std::chrono::milliseconds keep_alive_timeout{5'000};
  // Connections past this many are closed as soon as they are accepted.
  size_t max_connections = 8192;
  // Request bodies being read or handled at once, over every connection (each reserves its
  // Content-Length, a chunked one max_body_bytes): past this a request gets a 503.
  size_t max_pending_body_bytes = 256 << 20;
};

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;  // empty in CheckHeader

  // The first header of that name (case-insensitive), if any.
  std::optional<std::string_view> Header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

// An answer the engine produces over time. Poll is called after each wake-up, on one thread at a
// time; Abort once, when the client has gone.
class ResponseSource {
 public:
  virtual ~ResponseSource() = default;

  struct Progress {
    std::string events;  // streaming: bytes of the body to send now
    bool done = false;   // streaming: the body is complete
    // Not streaming: the whole response, once it is ready.
    std::optional<HttpResponse> response;
  };
  // Streaming answers are one chunked response whose head is the route's HttpResponse.
  virtual bool streaming() const = 0;
  virtual Progress Poll() = 0;
  virtual void Abort() = 0;
};

// What a route answers: a response, or (with `source`) a response head whose body comes later.
struct RouteResult {
  HttpResponse response;
  std::shared_ptr<ResponseSource> source;
};

class HttpRouter {
 public:
  virtual ~HttpRouter() = default;
  // Checks a request's header before its body is read: a response to send instead (the
  // connection then closes), or nothing.
  virtual std::optional<HttpResponse> CheckHeader(const HttpRequest& request) = 0;
  // Whether the route is cheap enough to answer on the I/O thread (health, metrics, pages).
  virtual bool Inline(const HttpRequest& request) const = 0;
  // Answers a request. `wake` schedules the source's next Poll: a source calls it when it has
  // news (from any thread; it never blocks).
  virtual RouteResult Handle(const HttpRequest& request, std::function<void()> wake) = 0;
  // The body of an error the front itself answers (413, 431, 503, ...).
  virtual HttpResponse Error(int status, std::string message) const = 0;
  // Called on a worker thread when the last request in flight has been answered.
  virtual void Idle() {}
};

class HttpFront {
 public:
  // `router` must outlive the front. `workers`: threads that run the routes' handlers.
  HttpFront(HttpLimits limits, HttpRouter& router, size_t workers);
  ~HttpFront();

  // Binds host:port (port 0: one the kernel picks); an IoError naming them when taken.
  Status Bind(const std::string& host, int port);
  int port() const;
  // Serves until Stop(); call on its own thread.
  void Run();
  // Stops accepting, gives answers in flight a second to be written, closes every connection
  // and waits for the handlers queued.
  void Stop();

  // Serves the bytes of one connection (one request or several) through the same code over a
  // socket pair, and returns what the server wrote back: the HTTP fuzz target's way in. The
  // end of the bytes is not a hang-up: every request in them is answered.
  std::string ServeBytes(std::string_view bytes);

  // Connections open now (for tests).
  size_t num_connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::server
