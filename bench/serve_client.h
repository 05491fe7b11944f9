// One benchmark request against an OpenAI-compatible server, timed as vLLM's
// `async_request_openai_completions` / `async_request_openai_chat_completions` time it
// (vllm/benchmarks/lib/endpoint_request_func.py; docs/spec/serving.md §6). Every request streams
// (stream=true, stream_options.include_usage=true):
//
//   ttft     first SSE data chunk with non-empty `choices` (even empty text) - send
//   itl      one gap per later chunk with choices (per chunk: a chunk may hold several tokens)
//   latency  last chunk with choices - send; for chat the last data message of any kind, as vLLM
//   output   usage.completion_tokens of the final usage chunk
//
// A failure (refused connection, non-200 status, an error event in the stream, no chunk with
// choices) is recorded in RequestOutput::error; it never stops the run.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "bench/serve_metrics.h"
#include "core/status.h"

namespace moeserve::bench {

using Clock = std::chrono::steady_clock;

// http[s]://host[:port][/prefix].
struct BaseUrl {
  std::string scheme;  // "http" or "https"
  std::string host;
  int port = 80;
  std::string path_prefix;  // "" or "/prefix", no trailing '/'
  std::string text;         // as given, without a trailing '/'
};
Result<BaseUrl> ParseBaseUrl(const std::string& url);

struct ClientOptions {
  BaseUrl base;
  std::string endpoint = "/v1/completions";  // or /v1/chat/completions
  std::string model;                         // "model" of every request
  std::string api_key;                       // sent as "Authorization: Bearer"; "" for none
  bool ignore_eos = false;
  // A JSON object merged into every request body last (the sampling parameters, --extra-body).
  std::string extra_body = "{}";
  int connect_timeout_s = 10;
  int read_timeout_s = 6 * 3600;  // vLLM's aiohttp total timeout

  bool chat() const { return endpoint.find("chat/completions") != std::string::npos; }
  std::string url() const { return base.text + endpoint; }
};

// The body of one request: completions {"prompt"}, chat {"messages": [{"role": "user",
// "content": prompt}]} (a string content: not every server's chat template takes vLLM's list of
// content parts), with max_tokens (chat: max_completion_tokens), stream, stream_options,
// ignore_eos when set, then extra_body.
std::string RequestBody(const ClientOptions& o, const std::string& prompt, int64_t max_tokens);

// Turns the bytes of one SSE response body, as they arrive, into the request's timings.
class StreamRecorder {
 public:
  // start: the send time, in seconds from the run's origin.
  StreamRecorder(bool chat, double start);
  // `bytes` arrived at `now` (seconds from the same origin).
  void Feed(std::string_view bytes, double now);
  // The record once the body has ended.
  RequestOutput Finish() &&;

 private:
  void OnData(std::string_view data, double now);

  bool chat_;
  double start_;
  double last_ = 0;  // time of the latest chunk that counts for latency
  bool first_chunk_seen_ = false;
  std::string buffer_;
  RequestOutput out_;
};

// Sends one streaming request and records it. `origin` is the run's time zero.
RequestOutput SendRequest(const ClientOptions& o, const std::string& prompt, int64_t prompt_len,
                          int64_t max_tokens, Clock::time_point origin);

// GET {base}/v1/models: the first model's id (vLLM's default --model).
Result<std::string> FirstModelId(const ClientOptions& o);

}  // namespace moeserve::bench
