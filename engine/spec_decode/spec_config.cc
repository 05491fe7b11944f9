#include "engine/spec_decode/spec_config.h"

#include <fmt/format.h>

#include <charconv>
#include <string>

namespace moeserve::engine {

Result<SpecConfig> ParseSpecFlag(std::string_view text) {
  SpecConfig spec;
  if (text.empty() || text == "none") return spec;
  const size_t colon = text.find(':');
  const std::string_view method = text.substr(0, colon);
  if (method == "mtp") {
    spec.method = SpecMethod::kMtp;
  } else if (method == "ngram") {
    spec.method = SpecMethod::kNgram;
  } else {
    return InvalidArgument("--spec: unknown method \"{}\" (expected mtp:K or ngram:K)", method);
  }
  const std::string_view k = colon == std::string_view::npos ? "" : text.substr(colon + 1);
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), value);
  if (k.empty() || ec != std::errc() || end != k.data() + k.size() || value < 1 ||
      value > kMaxSpeculativeTokens) {
    return InvalidArgument("--spec: \"{}\" needs a number of draft tokens K in [1, {}], as {}:3",
                           text, kMaxSpeculativeTokens, method);
  }
  spec.num_speculative_tokens = value;
  return spec;
}

std::string SpecName(const SpecConfig& spec) {
  switch (spec.method) {
    case SpecMethod::kNone:
      return "none";
    case SpecMethod::kMtp:
      return fmt::format("mtp:{}", spec.num_speculative_tokens);
    case SpecMethod::kNgram:
      return fmt::format("ngram:{}", spec.num_speculative_tokens);
  }
  return "none";
}

}  // namespace moeserve::engine
