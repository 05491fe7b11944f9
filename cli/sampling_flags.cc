#include "cli/sampling_flags.h"

namespace moeserve::cli {

void RegisterSamplingFlags(FlagSet& flags, engine::SamplingParams& p) {
  flags.Int("min-tokens", &p.min_tokens, "tokens before EOS, a stop id or a stop string may end");
  flags.Double("top-p", &p.top_p, "sample from the smallest set of tokens this likely, (0, 1]");
  flags.Int("top-k", &p.top_k, "sample from the k most likely tokens (0 or -1: all)");
  flags.Double("min-p", &p.min_p, "drop tokens below min-p times the top probability");
  flags.Double("presence-penalty", &p.presence_penalty,
               "subtracted from the logits of tokens already generated, [-2, 2]");
  flags.Double("frequency-penalty", &p.frequency_penalty,
               "times each generated token's count, subtracted from its logit, [-2, 2]");
  flags.Double("repetition-penalty", &p.repetition_penalty,
               "divides the positive logits of prompt and generated tokens and multiplies the "
               "negative ones (> 1 discourages repeats)");
}

}  // namespace moeserve::cli
