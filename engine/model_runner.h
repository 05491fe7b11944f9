// ModelRunner: the worker side of a step. It owns the model's cache memory (KV blocks, GDN state
// slots) and the persistent input batch -- one row per running request, kept across steps, with
// its block-table row -- and turns a SchedulerOutput into one forward over the flat token batch
// plus sampling of the rows that end their request's tokens (each request's RequestSampler; a
// plain greedy request takes argmax directly) and, when asked, logprobs.
//
// Speculative decoding (docs/spec/serving.md §4-5): a request's verify run [last token, drafts...]
// goes through the same forward (GDN layers step token by token into per-draft state slots);
// its rows are verified in order -- accepted while the target agrees, then the recovered or
// bonus token -- and the state slot after the last accepted token becomes the request's. The
// next step's drafts are the engine's DraftProposer's (engine/spec_decode/); for the MTP
// drafter the runner runs the MTP head's forward (MtpHead), since it owns the model, its cache
// and the step's hidden states.
//
// Per step only what changed is written: the scheduled tokens' ids, positions and sequence
// index, query_start, the block ids appended since the last step, and the logits rows
// (docs/spec/serving.md §1.2-1.3). Every buffer is sized at construction for the largest step
// (max_num_seqs rows, max_num_batched_tokens tokens), so a steady decode step allocates nothing.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/scheduler.h"
#include "engine/spec_decode/mtp_proposer.h"
#include "engine/spec_decode/spec_config.h"
#include "model/cache.h"
#include "model/causal_lm.h"
#include "model/model_group.h"

namespace moeserve::engine {

struct RunnerConfig {
  model::CacheSizes cache;  // KV blocks, block size, GDN state slots
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_blocks_per_request = 0;  // block-table row width
  int64_t max_model_len = 0;
  SpecConfig spec = {};
  bool greedy_argmax = true;  // EngineConfig::greedy_argmax
};

class ModelRunner final : public MtpHead {
 public:
  // The runner drives `group` (one rank, or rank 0 of a --tp group) and makes its caches.
  ModelRunner(model::ModelGroup& group, const RunnerConfig& config);

  // Runs the step `out` describes (it must come from the Scheduler sharing this runner's cache
  // sizes): the tokens each request emits (none when its chunk stops short of its last token),
  // with no drafts yet -- the engine's DraftProposer appends those. Valid until the next call.
  // Logprobs asked for are appended to the requests (output_logprobs for emitted tokens,
  // prompt_logprobs for the prompt positions this step computed); a verify run's state slots
  // are rolled to its last accepted token.
  StepOutput& Execute(const SchedulerOutput& out);

  // MtpHead, for the MTP drafter: the last Execute's forward, and the MTP head's.
  const model::TokenBatch& target_batch() const override { return batch_; }
  const float* target_hidden() const override { return model().hidden(); }
  const float* RunMtpHead(const model::TokenBatch& batch, const float* hidden,
                          const int32_t* logits_rows, int64_t num_logits, int32_t* drafts) override;

  // The logits [vocab] the last Execute sampled out.scheduled[i]'s j-th emitted token from
  // (j = 0: its first sampled row), or null if there is none (for tests).
  const float* logits_of(int64_t i, int64_t j = 0) const;

  model::ModelCache& cache() { return group_.cache(); }
  const model::ModelCache& cache() const { return group_.cache(); }
  int64_t num_rows_in_use() const { return static_cast<int64_t>(row_of_.size()); }

 private:
  // Persistent rows: takes the lowest free row for a request (vLLM fills the smallest hole).
  int32_t AddRow(int64_t request_id);
  void RemoveRow(int64_t request_id);
  int32_t* block_row(int32_t row) { return &block_tables_[row * config_.max_blocks_per_request]; }
  // Samples request r's next token from logits row `logits_row` (and records its logprobs).
  int32_t SampleRow(Request& r, int64_t logits_row);
  // Verifies s's drafts on logits rows logits_row .. + num_draft_tokens, appending the tokens
  // it emits to step_.tokens; rolls its state slot to the last accepted position.
  void VerifyRows(const ScheduledRequest& s, int64_t logits_row);
  // Appends r's prompt logprobs for the `rows.second` logits rows from rows.first, which score
  // prompt tokens first_pos + 1 ...
  void RecordPromptLogprobs(Request& r, int64_t first_pos, std::pair<int32_t, int32_t> rows);

  // Rank 0's model: its outputs after a group call.
  const model::CausalLm& model() const { return group_.model(); }

  model::ModelGroup& group_;
  RunnerConfig config_;

  // Persistent across steps, indexed by row.
  std::vector<int32_t> block_tables_;            // [max_num_seqs][max_blocks_per_request]
  std::vector<int64_t> row_num_blocks_;          // block ids already copied into the row
  std::unordered_map<int64_t, int32_t> row_of_;  // request id -> row
  std::vector<int32_t> free_rows_;               // kept sorted descending: back() is the lowest

  // This step's flat batch, sized for the largest step.
  std::vector<int32_t> input_ids_, seq_of_, query_start_, state_slots_, logits_rows_;
  std::vector<int64_t> positions_;
  std::vector<const int32_t*> seq_block_tables_;
  model::TokenBatch batch_;            // over the arrays above
  std::vector<int32_t> logits_index_;  // per scheduled request: its first sampled logits row
  std::vector<std::pair<int32_t, int32_t>> prompt_rows_;  // (first logits row, count) per request
  std::vector<float> sample_scratch_;                     // [2, vocab]
  bool argmax_only_ = false;  // this step's forward gave argmaxes only (every row plain greedy)
  SampledToken sampled_token_;
  int64_t last_num_seqs_ = 0;

  // Speculative decoding. verify_slots_[i] points at verify_slot_ids_[i * (K + 1)] for a request
  // verifying drafts on a hybrid model, else null.
  std::vector<int32_t> verify_slot_ids_;
  std::vector<const int32_t*> verify_slots_;
  std::vector<int32_t> history_;  // a request's outputs (+ accepted drafts)
  StepOutput step_;
};

}  // namespace moeserve::engine
