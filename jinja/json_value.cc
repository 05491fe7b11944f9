#include "jinja/json_value.h"

#include <nlohmann/json.hpp>

#include "core/json.h"

namespace moeserve::jinja {
namespace {

using Json = nlohmann::ordered_json;

Result<Value> Convert(const Json& j, int depth, std::string_view what) {
  if (depth > kMaxValueDepth) {
    return InvalidArgument("{}: JSON nested more than {} levels deep", what, kMaxValueDepth);
  }
  switch (j.type()) {
    case Json::value_t::null:
      return Value::None();
    case Json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case Json::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case Json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) {
        return InvalidArgument("{}: integer {} does not fit in 64 bits", what, u);
      }
      return Value::Int(static_cast<int64_t>(u));
    }
    case Json::value_t::number_float:
      return Value::Float(j.get<double>());
    case Json::value_t::string:
      return Value::String(j.get<std::string>());
    case Json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const Json& item : j) {
        ASSIGN_OR_RETURN(Value v, Convert(item, depth + 1, what));
        items.push_back(std::move(v));
      }
      return Value::MakeList(std::move(items));
    }
    case Json::value_t::object: {
      Dict dict;
      for (const auto& [key, item] : j.items()) {
        ASSIGN_OR_RETURN(Value v, Convert(item, depth + 1, what));
        dict.Set(Value::String(key), std::move(v));
      }
      return Value::MakeDict(std::move(dict));
    }
    default:
      return InvalidArgument("{}: unsupported JSON value", what);
  }
}

}  // namespace

Result<Value> ParseJsonValue(std::string_view json_text, std::string_view what) {
  ASSIGN_OR_RETURN(const Json j, ParseJson<Json>(json_text, what));
  return Convert(j, 0, what);
}

}  // namespace moeserve::jinja
