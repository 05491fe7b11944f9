#include "engine/spec_decode.h"

#include <fmt/format.h>

#include <algorithm>
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
    case SpecMethod::kNone: return "none";
    case SpecMethod::kMtp: return fmt::format("mtp:{}", spec.num_speculative_tokens);
    case SpecMethod::kNgram: return fmt::format("ngram:{}", spec.num_speculative_tokens);
  }
  return "none";
}

int64_t NgramPropose(std::span<const int32_t> tokens, int64_t prompt_lookup_min,
                     int64_t prompt_lookup_max, int64_t max_drafts, int32_t* drafts) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (max_drafts <= 0 || prompt_lookup_min < 1) return 0;
  // Longest n first; for each, the most recent earlier occurrence (start < len - n).
  for (int64_t n = std::min(prompt_lookup_max, len - 1); n >= prompt_lookup_min; --n) {
    const int32_t* suffix = tokens.data() + len - n;
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix, suffix + n, tokens.data() + start)) continue;
      const int64_t follow = start + n;  // < len: the match ends before the suffix does
      const int64_t count = std::min(max_drafts, len - follow);
      std::copy(tokens.data() + follow, tokens.data() + follow + count, drafts);
      return count;
    }
  }
  return 0;
}

}  // namespace moeserve::engine
