// Errors as vLLM's OpenAI server sends them (docs/spec/serving.md §7): status code plus the body
// {"error": {"message", "type", "param", "code"}}. Inside the server everything is a Status;
// this is the one place that maps it to HTTP.
#pragma once

#include <string>

#include "core/status.h"

namespace moeserve::server {

struct ApiError {
  int status = 500;
  std::string message;
  std::string param;  // the request field at fault; "" for none (null in JSON)

  std::string Body() const;  // the JSON body
};

// vLLM's mapping: bad input (InvalidArgument, OutOfRange) -> 400 with the parameter the message
// names; NotFound -> 404 (the only NotFound a request can cause is an unknown model); the rest
// -> 500, except Unavailable -> 503: the engine loop refuses work with it once it is stopping
// or dead.
ApiError ToApiError(const Status& status);

// The reason phrase vLLM uses as "type" (400 -> "BadRequestError", ...).
const char* ErrorType(int status);

// A message's parameter, as SamplingParams::Validate ("temperature must be ...") and the JSON
// readers ("\"top_k\" must be an integer") write them: the leading word, quoted or not, when it
// looks like a field name; "" otherwise.
std::string ParamOf(const std::string& message);

}  // namespace moeserve::server
