#include "cli/request_limit_flags.h"

namespace moeserve::cli {
namespace {

// Larger bounds bound nothing a machine could serve.
constexpr int64_t kMaxChoices = 16384;  // vLLM's VLLM_MAX_N_SEQUENCES
constexpr int64_t kMaxStopBytes = int64_t{1} << 30;
constexpr int64_t kMaxResponseMib = int64_t{1} << 20;

}  // namespace

void RequestLimitFlags::Register(FlagSet& flags) {
  flags.Int("max-logprobs", &max_logprobs,
            "logprobs, top_logprobs and prompt_logprobs of a request at most this many (-1: the "
            "whole vocabulary, and only then may a request ask for -1), as vLLM's");
  flags.Int("max-choices-per-request", &max_choices_per_request,
            "choices of one request at most this many (prompts x n)");
  flags.Int("max-stop-bytes", &max_stop_bytes,
            "the stop strings of one request at most this many bytes, summed");
  flags.Int("max-response-mib", &max_response_mib,
            "a request whose answer could take more MiB (n x max_tokens x logprobs, prompt "
            "logprobs x prompt length) is refused");
}

Status RequestLimitFlags::Validate() const {
  if (max_logprobs < -1) return InvalidArgument("--max-logprobs: must be -1 or >= 0");
  if (max_choices_per_request < 1 || max_choices_per_request > kMaxChoices) {
    return InvalidArgument("--max-choices-per-request: must be in [1, {}]", kMaxChoices);
  }
  if (max_stop_bytes < 0 || max_stop_bytes > kMaxStopBytes) {
    return InvalidArgument("--max-stop-bytes: must be in [0, {}]", kMaxStopBytes);
  }
  if (max_response_mib < 1 || max_response_mib > kMaxResponseMib) {
    return InvalidArgument("--max-response-mib: must be in [1, {}]", kMaxResponseMib);
  }
  return OkStatus();
}

server::RequestLimits RequestLimitFlags::ToLimits() const {
  return {.max_logprobs = max_logprobs,
          .max_choices = max_choices_per_request,
          .max_stop_bytes = max_stop_bytes,
          .max_response_bytes = max_response_mib << 20};
}

}  // namespace moeserve::cli
