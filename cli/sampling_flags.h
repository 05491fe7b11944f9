// The sampling flags generate and chat share: vLLM's SamplingParams by their names, with dashes.
#pragma once

#include "cli/flags.h"
#include "engine/sampling_params.h"

namespace moeserve::cli {

// --min-tokens, --top-p, --top-k, --min-p and the three penalties, writing into `p` (whose values
// are the defaults). Each command adds its own --temperature, --seed, --stop, --max-tokens.
void RegisterSamplingFlags(FlagSet& flags, engine::SamplingParams& p);

}  // namespace moeserve::cli
