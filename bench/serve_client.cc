#include "bench/serve_client.h"

#include <httplib.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/json.h"

namespace moeserve::bench {
namespace {

using nlohmann::json;

constexpr size_t kMaxErrorBody = 500;  // of an error response, kept in the record

double SecondsSince(Clock::time_point origin) {
  return std::chrono::duration<double>(Clock::now() - origin).count();
}

httplib::Client MakeClient(const ClientOptions& o) {
  const bool v6 = o.base.host.find(':') != std::string::npos;
  httplib::Client c(fmt::format("{}://{}{}{}:{}", o.base.scheme, v6 ? "[" : "", o.base.host,
                                v6 ? "]" : "", o.base.port));
  c.set_connection_timeout(o.connect_timeout_s, 0);
  c.set_read_timeout(o.read_timeout_s, 0);
  c.set_write_timeout(o.connect_timeout_s, 0);
  // One connection per request, as vLLM's connector (force_close=True).
  c.set_keep_alive(false);
  // The request goes out as two writes (headers, body): with Nagle's algorithm the body waits
  // for the server's delayed ACK of the headers, up to 40 ms of every TTFT. aiohttp (vLLM's
  // benchmark client) sets TCP_NODELAY too.
  c.set_tcp_nodelay(true);
  return c;
}

httplib::Headers AuthHeaders(const ClientOptions& o) {
  httplib::Headers h;
  if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
  return h;
}

// What went wrong below HTTP, in words (httplib's names are terse: "Connection").
std::string ErrorText(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
      return "could not connect (nothing listening?)";
    case httplib::Error::ConnectionTimeout:
      return "connection timed out";
    case httplib::Error::Read:
      return "the connection broke while reading the response";
    case httplib::Error::Write:
      return "the connection broke while sending the request";
    default:
      return httplib::to_string(e);
  }
}

std::string Shorten(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), '\n'), s.end());
  if (s.size() > kMaxErrorBody) s = s.substr(0, kMaxErrorBody) + "...";
  return s;
}

}  // namespace

Result<BaseUrl> ParseBaseUrl(const std::string& url) {
  BaseUrl b;
  std::string rest;
  if (url.rfind("http://", 0) == 0) {
    b.scheme = "http";
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    b.scheme = "https";
    b.port = 443;
    rest = url.substr(8);
  } else {
    return InvalidArgument("--base-url {}: expected http[s]://HOST[:PORT][/PATH]", url);
  }
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  if (slash != std::string::npos) b.path_prefix = rest.substr(slash);
  while (!b.path_prefix.empty() && b.path_prefix.back() == '/') b.path_prefix.pop_back();
  // [v6]:port, host:port or host.
  std::string port_text;
  if (!authority.empty() && authority[0] == '[') {
    const size_t close = authority.find(']');
    if (close == std::string::npos) return InvalidArgument("--base-url {}: unclosed '['", url);
    b.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return InvalidArgument("--base-url {}: bad port", url);
      port_text = authority.substr(close + 2);
    }
  } else {
    const size_t colon = authority.rfind(':');
    b.host = authority.substr(0, colon);
    if (colon != std::string::npos) port_text = authority.substr(colon + 1);
  }
  if (b.host.empty()) return InvalidArgument("--base-url {}: no host", url);
  if (!port_text.empty()) {
    if (port_text.size() > 5 || !std::all_of(port_text.begin(), port_text.end(),
                                             [](char c) { return c >= '0' && c <= '9'; })) {
      return InvalidArgument("--base-url {}: bad port '{}'", url, port_text);
    }
    b.port = std::stoi(port_text);
    if (b.port < 1 || b.port > 65535) {
      return InvalidArgument("--base-url {}: bad port '{}'", url, port_text);
    }
  }
  b.text = url;
  while (!b.text.empty() && b.text.back() == '/') b.text.pop_back();
  return b;
}

std::string RequestBody(const ClientOptions& o, const std::string& prompt, int64_t max_tokens) {
  json body;
  body["model"] = o.model;
  if (o.chat()) {
    body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
    body["max_completion_tokens"] = max_tokens;
  } else {
    body["prompt"] = prompt;
    body["max_tokens"] = max_tokens;
  }
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (o.ignore_eos) body["ignore_eos"] = true;
  // Checked by the command line (cli/bench_serve.cc); what does not parse adds nothing.
  const Result<json> extra = ParseJson(o.extra_body, "--extra-body");
  if (extra.ok() && extra->is_object()) {
    for (const auto& [key, value] : extra->items()) body[key] = value;
  }
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

StreamRecorder::StreamRecorder(bool chat, double start) : chat_(chat), start_(start), last_(start) {
  out_.start_time = start;
}

void StreamRecorder::Feed(std::string_view bytes, double now) {
  buffer_.append(bytes);
  // Events end at a blank line; "\r\n" line ends are allowed by SSE.
  size_t begin = 0;
  for (;;) {
    size_t end = buffer_.find("\n\n", begin);
    size_t sep = 2;
    const size_t crlf = buffer_.find("\r\n\r\n", begin);
    if (crlf != std::string::npos && (end == std::string::npos || crlf < end)) {
      end = crlf;
      sep = 4;
    }
    if (end == std::string::npos) break;
    std::string_view event(buffer_.data() + begin, end - begin);
    // The data lines of the event, joined by '\n' (comments and other fields dropped).
    std::string data;
    bool has_data = false;
    while (!event.empty()) {
      const size_t nl = event.find('\n');
      std::string_view line = event.substr(0, nl);
      event = nl == std::string_view::npos ? std::string_view() : event.substr(nl + 1);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.rfind("data:", 0) != 0) continue;
      line.remove_prefix(5);
      if (!line.empty() && line[0] == ' ') line.remove_prefix(1);
      if (has_data) data += '\n';
      data.append(line);
      has_data = true;
    }
    if (has_data) OnData(data, now);
    begin = end + sep;
  }
  buffer_.erase(0, begin);
}

void StreamRecorder::OnData(std::string_view data, double now) {
  if (data == "[DONE]") return;
  // A server's chunk is input like any other: a nested one must not crash the benchmark.
  const Result<json> parsed = ParseJson(data, "a stream chunk");
  const json chunk = parsed.ok() ? *parsed : json();
  if (!chunk.is_object()) {
    if (out_.error.empty()) out_.error = "malformed stream chunk: " + Shorten(std::string(data));
    return;
  }
  // An error event: {"error": {...}} (OpenAI, vLLM) or {"object": "error", ...} (older vLLM).
  if (chunk.contains("error") || chunk.value("object", json()) == "error") {
    const json& e = chunk.contains("error") ? chunk["error"] : chunk;
    out_.error = "error in stream: " +
                 Shorten(e.is_object() && e.contains("message") && e["message"].is_string()
                             ? e["message"].get<std::string>()
                             : e.dump());
    return;
  }
  const auto choices = chunk.find("choices");
  if (choices != chunk.end() && choices->is_array() && !choices->empty()) {
    if (!first_chunk_seen_) {
      first_chunk_seen_ = true;
      out_.ttft = now - start_;
    } else {
      out_.itl.push_back(now - last_);
    }
    last_ = now;
    const json& c = (*choices)[0];
    const json* text = nullptr;
    if (chat_) {
      if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content")) {
        text = &c["delta"]["content"];
      }
    } else if (c.contains("text")) {
      text = &c["text"];
    }
    if (text != nullptr && text->is_string()) out_.generated_text += text->get<std::string>();
  } else {
    const auto usage = chunk.find("usage");
    if (usage != chunk.end() && usage->is_object() && usage->contains("completion_tokens") &&
        (*usage)["completion_tokens"].is_number_integer()) {
      out_.output_tokens = (*usage)["completion_tokens"].get<int64_t>();
    }
    // vLLM's chat client moves the end time at every data message, the usage one included.
    if (chat_ && first_chunk_seen_) last_ = now;
  }
}

RequestOutput StreamRecorder::Finish() && {
  out_.latency = last_ - start_;
  if (out_.error.empty() && !first_chunk_seen_) {
    out_.error = "the stream ended without a chunk with choices (no TTFT)";
  }
  out_.success = out_.error.empty();
  return std::move(out_);
}

RequestOutput SendRequest(const ClientOptions& o, const std::string& prompt, int64_t prompt_len,
                          int64_t max_tokens, Clock::time_point origin) {
  httplib::Client client = MakeClient(o);
  httplib::Request req;
  req.method = "POST";
  req.path = o.base.path_prefix + o.endpoint;
  req.headers = AuthHeaders(o);
  req.set_header("Content-Type", "application/json");
  req.body = RequestBody(o, prompt, max_tokens);

  int status = -1;
  std::string error_body;
  const double start = SecondsSince(origin);
  StreamRecorder recorder(o.chat(), start);
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status == 200) {
      recorder.Feed(std::string_view(data, n), SecondsSince(origin));
    } else if (error_body.size() < kMaxErrorBody) {
      error_body.append(data, n);
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client.send(req, res, error);
  RequestOutput out = std::move(recorder).Finish();
  out.prompt_len = prompt_len;
  out.http_status = sent ? res.status : 0;
  if (!sent || error != httplib::Error::Success) {
    out.success = false;
    out.error = fmt::format("{} {}: {}", req.method, o.url(), ErrorText(error));
  } else if (res.status != 200) {
    out.success = false;
    if (error_body.empty()) error_body = res.body;
    out.error = fmt::format("HTTP {} from {}: {}", res.status, o.url(), Shorten(error_body));
  }
  return out;
}

Result<std::string> FirstModelId(const ClientOptions& o) {
  httplib::Client client = MakeClient(o);
  const std::string url = o.base.text + "/v1/models";
  auto r = client.Get((o.base.path_prefix + "/v1/models").c_str(), AuthHeaders(o));
  if (!r) return Unavailable("cannot reach {}: {}", url, ErrorText(r.error()));
  if (r->status != 200) {
    return Unavailable("GET {} answered HTTP {}: {}", url, r->status, Shorten(r->body));
  }
  const Result<json> parsed = ParseJson(r->body, "the model list");
  const json j = parsed.ok() ? *parsed : json();
  if (!j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].is_object() || !j["data"][0].contains("id") ||
      !j["data"][0]["id"].is_string()) {
    return Unavailable("GET {} did not list a model; pass --model", url);
  }
  return j["data"][0]["id"].get<std::string>();
}

}  // namespace moeserve::bench
