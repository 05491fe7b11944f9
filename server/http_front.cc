#include "server/http_front.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
// Beast's string_view as std::string_view (its own default in 1.74 is boost::string_view).
#define BOOST_BEAST_USE_STD_STRING_VIEW
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>

#include "core/log.h"

namespace moeserve::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using error_code = boost::system::error_code;
using LocalStream = beast::basic_stream<net::local::stream_protocol>;

// While a request is handled the connection reads ahead (to see a hang-up); it stops once this
// many pipelined bytes wait in its buffer.
constexpr size_t kMaxReadAhead = 64 << 10;
constexpr size_t kReadChunk = 4096;
// Before closing a connection the server reads and drops what the client still sends (as
// nginx's lingering close): a close with unread bytes resets the connection, and a client still
// sending a refused body would lose the answer (a 413, a 401) before it reads it. Bounded in
// bytes and time, and nothing is kept.
constexpr size_t kMaxLingerBytes = 64 << 20;
constexpr auto kLingerTime = std::chrono::seconds(5);
constexpr auto kLingerIdle = std::chrono::seconds(1);

bool IEquals(std::string_view a, std::string_view b) { return beast::iequals(a, b); }

// A read that ended because the connection did: the client closed or reset it, or stopped in
// the middle of a message, or a deadline passed (the stream has closed the socket then, so no
// 408 can be sent). Nothing is answered.
bool ConnectionEnded(error_code ec) {
  return ec == beast::error::timeout || ec == http::error::end_of_stream ||
         ec == http::error::partial_message || ec == net::error::eof ||
         ec == net::error::operation_aborted || ec == net::error::connection_reset;
}

// State the front shares with its connections.
struct Shared {
  HttpLimits limits;
  HttpRouter& router;
  net::thread_pool work;
  std::atomic<size_t> connections{0};
  std::atomic<size_t> busy{0};  // connections with a request in flight
  std::atomic<size_t> pending_body_bytes{0};

  Shared(HttpLimits l, HttpRouter& r, size_t workers) : limits(l), router(r), work(workers) {}
};

// One connection: reads requests one after another, hands each to the router, writes the
// answers in order. Socket work runs on the stream's executor (the I/O thread); a request's
// handler and its source's polls run on a strand of the worker pool.
template <class Stream>
class Connection : public std::enable_shared_from_this<Connection<Stream>> {
 public:
  // `lifetime` is released after every member, the stream's timers included: whoever watches
  // it knows when the connection no longer touches its io_context.
  Connection(Stream stream, Shared& shared, bool eof_is_hangup,
             std::shared_ptr<const void> lifetime = nullptr)
      : lifetime_(std::move(lifetime)),
        stream_(std::move(stream)),
        s_(shared),
        eof_is_hangup_(eof_is_hangup),
        work_(net::make_strand(shared.work)) {
    ++s_.connections;
  }
  ~Connection() {
    if (reserved_ > 0) s_.pending_body_bytes -= reserved_;
    --s_.connections;
  }

  void Start() { ReadRequest(); }

  // Closes the socket from any thread (Stop).
  void CloseSoon() {
    net::post(stream_.get_executor(), [self = this->shared_from_this()] { self->Close(); });
  }

 private:
  using Self = Connection<Stream>;
  enum class Kind { kWhole, kHead, kChunk, kLast };
  struct Outgoing {
    Kind kind;
    std::shared_ptr<http::response<http::string_body>> whole;  // kWhole
    std::shared_ptr<http::response<http::empty_body>> head;    // kHead
    std::shared_ptr<http::response_serializer<http::empty_body>> head_writer;
    std::shared_ptr<std::string> data;  // kChunk
  };

  // ---- Reading ----

  // Waits (up to the keep-alive timeout) for a request's first bytes, then reads its header.
  void ReadRequest() {
    if (closed_) return;
    if (buffer_.size() > 0) return ReadHeader();
    if (saw_eof_) return Close();
    stream_.expires_after(s_.limits.keep_alive_timeout);
    stream_.async_read_some(buffer_.prepare(kReadChunk),
                            [self = this->shared_from_this()](error_code ec, size_t n) {
                              self->buffer_.commit(n);
                              if (ec) return self->Close();
                              self->ReadHeader();
                            });
  }

  void ReadHeader() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(s_.limits.max_header_bytes));
    // The real limit is set once the header has passed the router's checks (boost::none would
    // fail every Content-Length in Boost 1.74's comparison).
    parser_->body_limit(std::numeric_limits<uint64_t>::max());
    stream_.expires_after(s_.limits.header_timeout);
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(error_code ec) {
    if (ec == http::error::header_limit) {
      return Refuse(431, fmt::format("the request header is larger than {} bytes",
                                     s_.limits.max_header_bytes));
    }
    if (ConnectionEnded(ec)) return Close();
    if (ec) return Refuse(400, fmt::format("malformed request: {}", ec.message()));
    const auto& req = parser_->get();
    request_ = HttpRequest{};
    size_t count = 0;
    for (const auto& field : req) {
      if (++count > s_.limits.max_header_count) {
        return Refuse(431, fmt::format("the request has more than {} header fields",
                                       s_.limits.max_header_count));
      }
      request_.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    request_.method = std::string(req.method_string());
    const std::string_view target = req.target();
    request_.path = std::string(target.substr(0, target.find('?')));
    keep_alive_ = req.keep_alive();
    if (std::optional<HttpResponse> refused = s_.router.CheckHeader(request_)) {
      return Send(std::move(*refused), /*then_close=*/true);
    }
    const boost::optional<uint64_t> length = parser_->content_length();
    if (length && *length > s_.limits.max_body_bytes) return RefuseBody();
    const size_t reserve = length ? *length : (parser_->chunked() ? s_.limits.max_body_bytes : 0);
    if (s_.pending_body_bytes.fetch_add(reserve) + reserve > s_.limits.max_pending_body_bytes) {
      s_.pending_body_bytes -= reserve;
      return Refuse(503, "the server is reading too many request bodies; retry later");
    }
    reserved_ = reserve;
    parser_->body_limit(s_.limits.max_body_bytes);
    if (const auto expect = req.find(http::field::expect);
        expect != req.end() && IEquals(expect->value(), "100-continue")) {
      auto cont = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
      stream_.expires_after(s_.limits.body_timeout);
      return http::async_write(stream_, *cont,
                               [self = this->shared_from_this(), cont](error_code ec, size_t) {
                                 if (ec) return self->Close();
                                 self->ReadBody();
                               });
    }
    ReadBody();
  }

  void ReadBody() {
    stream_.expires_after(s_.limits.body_timeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](error_code ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(error_code ec) {
    if (ec == http::error::body_limit) return RefuseBody();
    if (ConnectionEnded(ec)) return Close();
    if (ec) return Refuse(400, fmt::format("malformed request body: {}", ec.message()));
    request_.body = std::move(parser_->get().body());
    parser_.reset();
    if (buffer_.size() == 0) buffer_.shrink_to_fit();
    Dispatch();
  }

  // ---- Handling ----

  void Dispatch() {
    ++s_.busy;
    in_flight_ = true;
    stream_.expires_never();
    if (s_.router.Inline(request_)) {
      RouteResult r = s_.router.Handle(request_, {});
      ReleaseBody();
      return Send(std::move(r.response), !keep_alive_);
    }
    ReadAhead();
    std::weak_ptr<Self> weak = this->shared_from_this();
    net::post(work_, [self = this->shared_from_this(), weak, request = std::move(request_)] {
      RouteResult r = self->s_.router.Handle(request, [weak] {
        if (std::shared_ptr<Self> c = weak.lock()) c->Wake();
      });
      self->ReleaseBody();
      self->source_ = r.source;  // the strand's, from here on
      if (r.source != nullptr) {
        self->holder_ = self;  // nothing else may hold the connection while the answer comes
        if (r.source->streaming()) {
          net::post(self->stream_.get_executor(),
                    [self, head = std::move(r.response)]() mutable { self->SendHead(head); });
        }
        self->Poll();  // news that came before the wake-up could reach it
        return;
      }
      net::post(self->stream_.get_executor(), [self, response = std::move(r.response)]() mutable {
        self->Send(std::move(response), !self->keep_alive_);
      });
    });
  }

  void ReleaseBody() {
    s_.pending_body_bytes -= reserved_;
    reserved_ = 0;
  }

  void Wake() {
    if (polls_pending_.exchange(true)) return;
    net::post(work_, [self = this->shared_from_this()] {
      self->polls_pending_ = false;
      self->Poll();
    });
  }

  // On the strand: what the source has now goes to the I/O thread to be written.
  void Poll() {
    if (source_ == nullptr) return;
    ResponseSource::Progress p = source_->Poll();
    const bool streaming = source_->streaming();
    if (streaming && (!p.events.empty() || p.done)) {
      net::post(stream_.get_executor(),
                [self = this->shared_from_this(), events = std::move(p.events), done = p.done] {
                  if (!events.empty())
                    self->Queue({Kind::kChunk, {}, {}, {}, std::make_shared<std::string>(events)});
                  if (done) self->Queue({Kind::kLast, {}, {}, {}, {}});
                });
    }
    if (!streaming && p.response) {
      net::post(stream_.get_executor(),
                [self = this->shared_from_this(), response = std::move(*p.response)]() mutable {
                  self->Send(std::move(response), !self->keep_alive_);
                });
    }
    if (p.done || p.response) {
      source_.reset();
      holder_.reset();  // the writes posted above hold the connection now
    }
  }

  // The request in flight is over (answered, or its connection closed). The last one over
  // tells the router the server is idle.
  void EndRequest() {
    if (!in_flight_) return;
    in_flight_ = false;
    if (--s_.busy == 0) net::post(s_.work, [&router = s_.router] { router.Idle(); });
  }

  // ---- Writing (I/O thread) ----

  static void SetHead(http::response_header<>& h, const HttpResponse& r) {
    if (!r.content_type.empty()) h.set(http::field::content_type, r.content_type);
    for (const auto& [name, value] : r.headers) h.insert(name, value);
  }

  void Send(HttpResponse r, bool then_close) {
    if (closed_) return;
    auto whole = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(r.status), 11);
    SetHead(whole->base(), r);
    whole->body() = std::move(r.body);
    close_after_ |= then_close;
    whole->keep_alive(!close_after_);
    whole->prepare_payload();
    Queue({Kind::kWhole, whole, {}, {}, {}});
  }

  void SendHead(const HttpResponse& r) {
    if (closed_) return;
    auto head =
        std::make_shared<http::response<http::empty_body>>(static_cast<http::status>(r.status), 11);
    SetHead(head->base(), r);
    head->keep_alive(keep_alive_);
    head->chunked(true);
    auto writer = std::make_shared<http::response_serializer<http::empty_body>>(*head);
    Queue({Kind::kHead, {}, head, writer, {}});
  }

  // A refusal of the front's own: its error body, and the connection closes (its body unread).
  void Refuse(int status, std::string message) {
    if (!in_flight_) {
      ++s_.busy;
      in_flight_ = true;
    }
    Send(s_.router.Error(status, std::move(message)), /*then_close=*/true);
  }

  // A body past the limit: announced in Content-Length, or a chunked one that grew past it.
  void RefuseBody() {
    Refuse(413, fmt::format("the request body is larger than {} bytes (--max-body-mib)",
                            s_.limits.max_body_bytes));
  }

  void Queue(Outgoing item) {
    if (closed_) return;
    out_.push_back(std::move(item));
    if (!writing_) WriteNext();
  }

  void WriteNext() {
    if (out_.empty() || closed_) {
      writing_ = false;
      return;
    }
    writing_ = true;
    auto done = [self = this->shared_from_this()](error_code ec, size_t) { self->OnWritten(ec); };
    Outgoing& item = out_.front();
    switch (item.kind) {
      case Kind::kWhole:
        return http::async_write(stream_, *item.whole, done);
      case Kind::kHead:
        return http::async_write_header(stream_, *item.head_writer, done);
      case Kind::kChunk:
        return net::async_write(stream_, http::make_chunk(net::buffer(*item.data)), done);
      case Kind::kLast:
        return net::async_write(stream_, http::make_chunk_last(), done);
    }
  }

  void OnWritten(error_code ec) {
    writing_ = false;
    if (closed_) {
      out_.clear();  // what the finished write used is no longer in use
      return;
    }
    if (ec) return ClientGone();
    const Kind kind = out_.front().kind;
    out_.pop_front();
    if (kind == Kind::kWhole || kind == Kind::kLast) AnswerDone();
    WriteNext();
  }

  // The answer in flight is written: the next request, or the end.
  void AnswerDone() {
    EndRequest();
    after_read_ahead_ = close_after_ || !keep_alive_ ? After::kLinger : After::kNextRequest;
    if (reading_ahead_) {
      stream_.cancel();  // the read-ahead's handler goes on
      return;
    }
    GoOn();
  }

  void GoOn() {
    const After next = after_read_ahead_;
    after_read_ahead_ = After::kNothing;
    if (next == After::kLinger) return Shutdown();
    if (next == After::kNextRequest) return ReadRequest();
  }

  // While an answer is in the making, reads what else the client sends: a hang-up (EOF, a
  // reset) aborts the answer; pipelined requests wait in the buffer, up to kMaxReadAhead.
  void ReadAhead() {
    if (closed_ || saw_eof_ || buffer_.size() >= kMaxReadAhead) return;
    reading_ahead_ = true;
    stream_.async_read_some(buffer_.prepare(kReadChunk),
                            [self = this->shared_from_this()](error_code ec, size_t n) {
                              self->buffer_.commit(n);
                              self->OnReadAhead(ec);
                            });
  }

  void OnReadAhead(error_code ec) {
    reading_ahead_ = false;
    if (ec && ec != net::error::operation_aborted) {
      saw_eof_ = true;
      if (after_read_ahead_ == After::kNothing && (eof_is_hangup_ || ec != net::error::eof)) {
        return ClientGone();
      }
    }
    if (after_read_ahead_ != After::kNothing) return GoOn();
    if (!ec) ReadAhead();
  }

  // The client went away mid-answer: its source is aborted, the socket closed.
  void ClientGone() {
    net::post(work_, [self = this->shared_from_this()] {
      if (self->source_ == nullptr) return;
      self->source_->Abort();
      self->source_.reset();
      self->holder_.reset();
    });
    Close();
  }

  // Ends the connection after the last answer: the peer sees a clean end of stream once it has
  // read everything (Linger).
  void Shutdown() {
    if (closed_) return;
    error_code ignored;
    stream_.socket().shutdown(net::socket_base::shutdown_send, ignored);
    Linger(0, std::chrono::steady_clock::now() + kLingerTime);
  }

  void Linger(size_t drained, std::chrono::steady_clock::time_point until) {
    const auto left = until - std::chrono::steady_clock::now();
    if (closed_ || drained > kMaxLingerBytes || left <= left.zero()) return Close();
    buffer_.consume(buffer_.size());
    stream_.expires_after(std::min<std::chrono::steady_clock::duration>(left, kLingerIdle));
    stream_.async_read_some(buffer_.prepare(16 << 10), [self = this->shared_from_this(), drained,
                                                        until](error_code ec, size_t n) {
      if (ec) return self->Close();
      self->Linger(drained + n, until);
    });
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    EndRequest();
    if (!writing_) out_.clear();  // else the write in flight still reads its item
    error_code ignored;
    stream_.socket().close(ignored);
  }

  std::shared_ptr<const void> lifetime_;  // first, so destroyed last
  Stream stream_;
  Shared& s_;
  const bool eof_is_hangup_;
  net::strand<net::thread_pool::executor_type> work_;

  // I/O thread.
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  HttpRequest request_;
  size_t reserved_ = 0;  // this request's share of pending_body_bytes
  bool keep_alive_ = true;
  bool in_flight_ = false;
  bool close_after_ = false;
  bool closed_ = false;
  bool saw_eof_ = false;
  bool reading_ahead_ = false;
  enum class After { kNothing, kNextRequest, kLinger };
  After after_read_ahead_ = After::kNothing;  // set once the answer is written
  bool writing_ = false;
  std::deque<Outgoing> out_;

  // The strand.
  std::shared_ptr<ResponseSource> source_;
  std::shared_ptr<Self> holder_;  // the connection itself while source_ is set
  std::atomic<bool> polls_pending_{false};
};

// Lets a process hold as many sockets as connections allowed (Debian's soft limit is 1024).
void RaiseOpenFileLimit(size_t wanted) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= wanted) return;
  limit.rlim_cur = std::min<rlim_t>(wanted, limit.rlim_max);
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur < wanted) {
    LogWarning("server: at most {} open files: fewer connections than {} can be held",
               limit.rlim_cur, wanted);
  }
}

}  // namespace

std::optional<std::string_view> HttpRequest::Header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (IEquals(n, name)) return std::string_view(v);
  }
  return std::nullopt;
}

struct HttpFront::Impl {
  Shared shared;
  net::io_context io{1};
  net::ip::tcp::acceptor acceptor{io};
  int port = 0;
  // Every TCP connection, to close them at Stop.
  std::mutex mu;
  std::vector<std::weak_ptr<Connection<beast::tcp_stream>>> connections;

  Impl(HttpLimits limits, HttpRouter& router, size_t workers) : shared(limits, router, workers) {}

  void Accept() {
    acceptor.async_accept(net::make_strand(io), [this](error_code ec, net::ip::tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      if (!ec) {
        if (shared.connections.load() >= shared.limits.max_connections) {
          error_code ignored;
          socket.close(ignored);  // over the bound: refused at once
        } else {
          // Small writes (an SSE event per token) go out at once, not after the last one's ACK.
          socket.set_option(net::ip::tcp::no_delay(true), ec);
          auto c = std::make_shared<Connection<beast::tcp_stream>>(
              beast::tcp_stream(std::move(socket)), shared, /*eof_is_hangup=*/true);
          {
            std::lock_guard lock(mu);
            std::erase_if(connections, [](const auto& w) { return w.expired(); });
            connections.push_back(c);
          }
          c->Start();
        }
      } else if (ec == net::error::no_descriptors) {
        // Out of file descriptors: wait a moment rather than spin.
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      Accept();
    });
  }
};

HttpFront::HttpFront(HttpLimits limits, HttpRouter& router, size_t workers)
    : impl_(std::make_unique<Impl>(limits, router, workers)) {}

HttpFront::~HttpFront() { Stop(); }

Status HttpFront::Bind(const std::string& host, int port) {
  error_code ec;
  const net::ip::address address = net::ip::make_address(host, ec);
  if (ec) return InvalidArgument("--host {}: not an IP address", host);
  const net::ip::tcp::endpoint endpoint(address, static_cast<uint16_t>(port));
  net::ip::tcp::acceptor& a = impl_->acceptor;
  a.open(endpoint.protocol(), ec);
  // SO_REUSEADDR alone: a quick restart past TIME_WAIT, but a port someone listens on is
  // refused (SO_REUSEPORT would split the connections between two servers).
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    a.close(ec);
    return IoError("cannot listen on {}:{} (in use, or not an address of this machine)", host,
                   port);
  }
  impl_->port = a.local_endpoint().port();
  RaiseOpenFileLimit(impl_->shared.limits.max_connections + 256);
  return OkStatus();
}

int HttpFront::port() const { return impl_->port; }

void HttpFront::Run() {
  impl_->Accept();
  auto guard = net::make_work_guard(impl_->io);
  impl_->io.run();
}

void HttpFront::Stop() {
  Impl& i = *impl_;
  if (i.io.stopped()) return;
  net::post(i.io, [&i] {
    error_code ignored;
    i.acceptor.close(ignored);
  });
  // Answers in flight (the engine loop has ended their requests) get a moment to go out.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (i.shared.busy.load() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    std::lock_guard lock(i.mu);
    for (const auto& w : i.connections) {
      if (auto c = w.lock()) c->CloseSoon();
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  i.io.stop();
  // Handlers still queued finish now, while what they use (the engine loop) is still there.
  i.shared.work.join();
}

size_t HttpFront::num_connections() const { return impl_->shared.connections.load(); }

std::string HttpFront::ServeBytes(std::string_view bytes) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return "";
  net::io_context io{1};
  auto guard = net::make_work_guard(io);
  net::local::stream_protocol::socket server_side(io);
  server_side.assign(net::local::stream_protocol(), fds[0]);
  // The last holder of the connection may be another thread (the engine loop's wake-up): the
  // io_context must outlive its destructor, not only its last reference.
  auto lifetime = std::make_shared<int>(0);
  const std::weak_ptr<int> alive = lifetime;
  std::make_shared<Connection<LocalStream>>(LocalStream(std::move(server_side)), impl_->shared,
                                            /*eof_is_hangup=*/false, std::move(lifetime))
      ->Start();
  std::thread runner([&io] { io.run(); });
  std::thread writer([&bytes, fd = fds[1]] {
    size_t at = 0;
    while (at < bytes.size()) {
      const ssize_t n = send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (n <= 0) break;
      at += static_cast<size_t>(n);
    }
    shutdown(fd, SHUT_WR);
  });
  std::string out;
  char buf[16384];
  for (ssize_t n; (n = read(fds[1], buf, sizeof(buf))) > 0;)
    out.append(buf, static_cast<size_t>(n));
  writer.join();
  close(fds[1]);
  // Handlers that hold the connection finish on this io_context: it runs until they have.
  while (!alive.expired()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  guard.reset();
  runner.join();
  return out;
}

}  // namespace moeserve::server
