// Request: one generation request as the scheduler and the cache manager see it -- its token
// history, how much of it the model has computed, and the cache it holds.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/sampler.h"
#include "engine/sampling_params.h"

namespace moeserve::engine {

enum class RequestStatus {
  kWaiting,    // queued, never scheduled
  kRunning,    // in the running set: holds KV blocks (and a GDN state slot)
  kPreempted,  // back in the waiting queue after preemption; holds nothing, recomputes
  kFinished,   // done (see finish_reason); holds nothing
};

// vLLM's finish reasons (docs/spec/serving.md §2.2): "stop" (EOS or a stop token), "length"
// (max_tokens or max_model_len), "abort".
enum class FinishReason { kNone, kStop, kLength, kAbort };

const char* FinishReasonName(FinishReason reason);  // "stop" | "length" | "abort" | "none"

// Drafts per verify step, at most (--spec mtp:K / ngram:K).
inline constexpr int64_t kMaxSpeculativeTokens = 4;

// Acceptance of speculative drafts, as vLLM counts it (docs/spec/serving.md §5, SpecDecodingStats).
struct SpecDecodeStats {
  int64_t num_drafts = 0;           // verify steps that carried at least one draft
  int64_t num_draft_tokens = 0;     // drafts verified
  int64_t num_accepted_tokens = 0;  // drafts accepted
  std::vector<int64_t> accepted_per_pos;  // [num_speculative_tokens]: accepted at draft index i

  // 1 + accepted / drafts: tokens per verify step, the bonus included (vLLM's mean acceptance
  // length); 0 with no drafts.
  double mean_acceptance_length() const {
    return num_drafts > 0 ? 1.0 + static_cast<double>(num_accepted_tokens) / num_drafts : 0.0;
  }
  double acceptance_rate() const {
    return num_draft_tokens > 0 ? static_cast<double>(num_accepted_tokens) / num_draft_tokens : 0;
  }
  // One verify step of num_draft_tokens drafts, `accepted` of them (the leading ones) accepted.
  void AddStep(int64_t num_draft_tokens, int64_t accepted);
};

// When a request stops: the part of its SamplingParams the scheduler checks after each token.
struct StopConditions {
  int64_t max_tokens = 16;               // >= 1
  int64_t min_tokens = 0;                // EOS and stop ids do not stop before this many outputs
  bool ignore_eos = false;
  std::vector<int32_t> eos_token_ids;    // from the model / tokenizer
  std::vector<int32_t> stop_token_ids;
};

struct Request {
  int64_t id = 0;            // unique, increasing in arrival order (FCFS)
  std::vector<int32_t> prompt_token_ids;
  std::vector<int32_t> output_token_ids;  // reserved to max_tokens at admission
  StopConditions stop;
  // The sampling parameters, validated and normalized, and the sampler's tables: one object per
  // API request, shared by its choices (its n and seed are the API request's; this choice's
  // generator was seeded by ChoiceSeed).
  std::shared_ptr<const PreparedParams> prepared;
  // Built at admission, kept across preemptions (penalty counts, generator); the model runner
  // samples with it.
  std::unique_ptr<RequestSampler> sampler;
  // Filled by the model runner when params.logprobs / params.prompt_logprobs ask for them: one
  // entry per output token, and one per prompt token after the first.
  std::vector<SampledToken> output_logprobs;
  std::vector<SampledToken> prompt_logprobs;

  RequestStatus status = RequestStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  // Tokens of prompt + output whose KV / state the model has computed (or that the prefix cache
  // supplied). Advanced by the scheduler when it schedules them.
  int64_t num_computed_tokens = 0;
  int64_t num_cached_tokens = 0;  // prompt tokens served by the prefix cache at first schedule
  int64_t num_preemptions = 0;
  bool skip_prefix_cache = false;  // prompt_logprobs need every prompt position computed

  // Cache held while running: KV block ids of the full-attention layers in logical order
  // (block b holds positions [b * block_size, (b + 1) * block_size)), reserved at admission to
  // the most a request can need; and the GDN state slot (-1: none).
  std::vector<int32_t> block_ids;
  int32_t state_slot = -1;
  // Speculative decoding on a hybrid model: the extra state slots a verify run writes the state
  // after each draft to. After a step that accepted a drafts, slot spec_state_slots[a - 1] holds
  // the state to go on from and trades places with state_slot (no copy).
  std::vector<int32_t> spec_state_slots;
  // Hybrid prefix caching (KvCacheManager): the GDN state checkpoint this request resumes from
  // and the model state slot holding it (-1: none). The runner copies it into state_slot before
  // the first step; the checkpoint is pinned until then.
  int32_t restore_checkpoint = -1;
  int32_t restore_state_slot = -1;
  // Its latest checkpoint past the prompt and that checkpoint's generation: when decoding reaches
  // the next aligned position, the newer one replaces it (only the end of an output is kept).
  int32_t output_checkpoint = -1;
  uint64_t output_checkpoint_generation = 0;
  // Where the cached chain its lookup found went on past the last checkpoint (aligned down; 0:
  // it did not): another request shares the prefix up to there, so a checkpoint is taken there.
  int64_t shared_prefix_junction = 0;

  // Speculative decoding: the drafts proposed after the last step, verified by the next one
  // (not part of the token history until accepted), and the acceptance counts so far.
  std::vector<int32_t> draft_token_ids;  // reserved to num_speculative_tokens
  SpecDecodeStats spec = {};
  // Adaptive drafting: per draft position, a running estimate of how often it is accepted when
  // the positions before it were (optimistic at first), and the steps since the request last
  // drafted (drafting stopped for lack of acceptance probes now and then).
  std::array<float, kMaxSpeculativeTokens> draft_acceptance = {1, 1, 1, 1};
  int32_t steps_without_drafts = 0;
  // Drafts sized by cost (DraftPolicy): whether the policy has seen the request (it then starts
  // from the acceptance seen across requests), and whether it stopped drafting for good.
  bool draft_policy_seen = false;
  bool drafts_stopped = false;

  int64_t num_prompt_tokens() const { return static_cast<int64_t>(prompt_token_ids.size()); }
  int64_t num_output_tokens() const { return static_cast<int64_t>(output_token_ids.size()); }
  int64_t num_tokens() const { return num_prompt_tokens() + num_output_tokens(); }
  // Token at position pos of prompt + output.
  int32_t token_at(int64_t pos) const {
    return pos < num_prompt_tokens() ? prompt_token_ids[pos]
                                     : output_token_ids[pos - num_prompt_tokens()];
  }
  bool finished() const { return status == RequestStatus::kFinished; }
  const SamplingParams& params() const { return prepared->params; }
};

}  // namespace moeserve::engine
