// serve's bounds on what one request may cost (server::RequestLimits, issue #31): each a flag
// with vLLM's name where vLLM has one, and a default a vLLM client does not reach.
#pragma once

#include <cstdint>

#include "cli/flags.h"
#include "core/status.h"
#include "server/request_check.h"

namespace moeserve::cli {

struct RequestLimitFlags {
  int64_t max_logprobs = server::RequestLimits{}.max_logprobs;
  int64_t max_choices_per_request = server::RequestLimits{}.max_choices;
  int64_t max_stop_bytes = server::RequestLimits{}.max_stop_bytes;
  int64_t max_response_mib = server::RequestLimits{}.max_response_bytes >> 20;

  void Register(FlagSet& flags);
  // Each value on its own: a usage error naming the flag.
  Status Validate() const;
  server::RequestLimits ToLimits() const;
};

}  // namespace moeserve::cli
