// Speculative decoding (docs/spec/serving.md §4-5): which drafter proposes tokens, how many, and
// when it pauses -- the --spec flags. The drafters are DraftProposer's implementations
// (draft_proposer.h); verification and state rollback are the model runner's.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "engine/request.h"

namespace moeserve::engine {

enum class SpecMethod {
  kNone,
  kMtp,    // the model's MTP head, chained K times (vLLM's "mtp")
  kNgram,  // prompt lookup in the request's own tokens (vLLM's "ngram")
  kAuto,   // the flag's default: mtp:auto on a model with an MTP head, else none (ResolveSpec)
};

struct SpecConfig {
  SpecMethod method = SpecMethod::kNone;
  int64_t num_speculative_tokens = 0;  // K: drafts per step, 1 .. kMaxSpeculativeTokens
  // "mtp:auto" / "ngram:auto": each step's drafts, 0 .. K (= kMaxSpeculativeTokens), chosen by
  // expected tokens per second (DraftPolicy, draft_policy.h) instead of the fixed K and the
  // min_acceptance cut.
  bool sized_by_cost = false;
  // ngram: the longest suffix of 1 .. max tokens found earlier wins, if at least min long
  // (vLLM's prompt_lookup_min / prompt_lookup_max).
  int64_t prompt_lookup_min = 2;
  int64_t prompt_lookup_max = 5;
  // No drafts while more requests than this run in a step: verifying 1 + K tokens each costs
  // more than it saves once the batch alone keeps the cores busy (the default is where a batch's
  // GEMMs turned compute-bound on 2 cores: docs/performance.md, "Speculative decoding"). 0: never.
  int64_t disable_batch_size = 4;
  // Adaptive drafting: a request drafts position i only while its estimated chance of getting
  // that far (the product of its positions' running acceptance rates) is at least this, since a
  // draft that is rarely accepted costs a verify position (and an MTP pass) for little. A
  // request that stopped drafting tries one draft every kProbeInterval steps. 0: always K.
  double min_acceptance = 0.3;
  static constexpr int32_t kProbeInterval = 8;
  static constexpr float kAcceptanceSmoothing = 0.25f;  // weight of the newest verify step

  bool enabled() const { return method != SpecMethod::kNone && method != SpecMethod::kAuto; }
  // Positions beyond a request's last verified token the drafter writes KV at: the MTP chain's
  // steps 2 .. K run one position further each.
  int64_t lookahead() const { return method == SpecMethod::kMtp ? num_speculative_tokens - 1 : 0; }
};

// "mtp:K" | "ngram:K" (K in 1 .. 4) | "mtp:auto" | "ngram:auto" | "auto" | "none" -> method, K
// and sized_by_cost; other fields keep their defaults.
Result<SpecConfig> ParseSpecFlag(std::string_view text);
// "auto" made concrete for a model: mtp:auto when it has MTP layers, else none. Others as given.
SpecConfig ResolveSpec(const SpecConfig& spec, bool model_has_mtp);
// "mtp:3", "ngram:auto", "none", "auto".
std::string SpecName(const SpecConfig& spec);

}  // namespace moeserve::engine
