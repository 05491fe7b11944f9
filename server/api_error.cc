#include "server/api_error.h"

#include <cctype>
#include <nlohmann/json.hpp>

namespace moeserve::server {

const char* ErrorType(int status) {
  switch (status) {
    case 400:
      return "BadRequestError";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "NotFoundError";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Request Entity Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 501:
      return "NotImplementedError";
    case 503:
      return "Service Unavailable";
    default:
      return status >= 500 ? "InternalServerError" : "BadRequestError";
  }
}

std::string ParamOf(const std::string& message) {
  size_t begin = 0;
  if (!message.empty() && message[0] == '"') begin = 1;
  size_t end = begin;
  while (end < message.size() &&
         (std::islower(static_cast<unsigned char>(message[end])) || message[end] == '_')) {
    ++end;
  }
  if (end == begin) return "";
  if (begin == 1 && (end >= message.size() || message[end] != '"')) return "";
  if (begin == 0 && end < message.size() && message[end] != ' ' && message[end] != ':') return "";
  return message.substr(begin, end - begin);
}

ApiError ToApiError(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return {400, status.message(), ParamOf(status.message())};
    case StatusCode::kNotFound:
      return {404, status.message(), "model"};
    case StatusCode::kUnavailable:
      return {503, status.message(), ""};
    default:
      return {500, status.message(), ""};
  }
}

std::string ApiError::Body() const {
  nlohmann::ordered_json body;
  body["error"] = {
      {"message", message},
      {"type", ErrorType(status)},
      {"param", param.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(param)},
      {"code", status}};
  return body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace moeserve::server
