#include "engine/spec_decode/spec_config.h"

#include <fmt/format.h>

#include <charconv>
#include <string>

namespace moeserve::engine {

Result<SpecConfig> ParseSpecFlag(std::string_view text) {
  SpecConfig spec;
  if (text.empty() || text == "none") return spec;
  if (text == "auto") {
    spec.method = SpecMethod::kAuto;
    return spec;
  }
  const size_t colon = text.find(':');
  const std::string_view method = text.substr(0, colon);
  if (method == "mtp") {
    spec.method = SpecMethod::kMtp;
  } else if (method == "ngram") {
    spec.method = SpecMethod::kNgram;
  } else {
    return InvalidArgument(
        "--spec: unknown method \"{}\" (expected mtp:K, ngram:K, mtp:auto, ngram:auto, auto or "
        "none)",
        method);
  }
  const std::string_view k = colon == std::string_view::npos ? "" : text.substr(colon + 1);
  if (k == "auto") {
    spec.num_speculative_tokens = kMaxSpeculativeTokens;
    spec.sized_by_cost = true;
    return spec;
  }
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), value);
  if (k.empty() || ec != std::errc() || end != k.data() + k.size() || value < 1 ||
      value > kMaxSpeculativeTokens) {
    return InvalidArgument(
        "--spec: \"{}\" needs a number of draft tokens K in [1, {}] or auto, as {}:3 or {}:auto",
        text, kMaxSpeculativeTokens, method, method);
  }
  spec.num_speculative_tokens = value;
  return spec;
}

SpecConfig ResolveSpec(const SpecConfig& spec, bool model_has_mtp) {
  if (spec.method != SpecMethod::kAuto) return spec;
  SpecConfig resolved = spec;
  resolved.method = model_has_mtp ? SpecMethod::kMtp : SpecMethod::kNone;
  resolved.num_speculative_tokens = model_has_mtp ? kMaxSpeculativeTokens : 0;
  resolved.sized_by_cost = model_has_mtp;
  return resolved;
}

std::string SpecName(const SpecConfig& spec) {
  const std::string k =
      spec.sized_by_cost ? std::string("auto") : std::to_string(spec.num_speculative_tokens);
  switch (spec.method) {
    case SpecMethod::kNone:
      return "none";
    case SpecMethod::kAuto:
      return "auto";
    case SpecMethod::kMtp:
      return "mtp:" + k;
    case SpecMethod::kNgram:
      return "ngram:" + k;
  }
  return "none";
}

}  // namespace moeserve::engine
