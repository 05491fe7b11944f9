// The MTP drafter (vLLM's "mtp", docs/spec/serving.md §4): the model's MTP head over every position
// the step verified, so its KV cache sees the whole history, then K - 1 chained steps, each
// feeding the head its own last draft and output hidden state (vLLM's chaining).
//
// The head's forward runs where the model, its cache and the step's target forward live -- the
// model runner, through the MtpHead interface; this file builds the batches and keeps the
// drafts.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/spec_decode/draft_proposer.h"
#include "model/cache.h"

namespace moeserve::engine {

// The model runner's side of MTP drafting.
class MtpHead {
 public:
  virtual ~MtpHead() = default;

  // The step's target forward: its batch (query_start, block tables, state slots per sequence)
  // and its final-normed hidden states [num_tokens, H].
  virtual const model::TokenBatch& target_batch() const = 0;
  virtual const float* target_hidden() const = 0;
  // Runs the MTP head over `batch` on every rank -- row t pairs hidden[t] [H] with
  // batch.tokens[t] at batch.positions[t] -- and writes the head's greedy token after each of
  // rows logits_rows[0 .. num_logits) to drafts[0 .. num_logits). Returns the head's normed
  // outputs [num_tokens, H] (the hidden input of the next chained step), valid until the next
  // call.
  virtual const float* RunMtpHead(const model::TokenBatch& batch, const float* hidden,
                                  const int32_t* logits_rows, int64_t num_logits,
                                  int32_t* drafts) = 0;
};

class MtpProposer final : public DraftProposer {
 public:
  // head (the model runner) must outlive the proposer; hidden_size is the model's H.
  MtpProposer(const SpecConfig& spec, const ProposerLimits& limits, int64_t hidden_size,
              MtpHead& head);

 private:
  void ProposeWithin(const SchedulerOutput& out, std::span<const int32_t> budget,
                     StepOutput& step) override;

  MtpHead& head_;
  int64_t hidden_size_ = 0;
  // The head's batches: rows of the first pass (every verified position) and of the chained
  // steps (one row per drafting request).
  std::vector<int32_t> tokens_, seq_of_, query_start_, logits_rows_;
  std::vector<int64_t> positions_;
  std::vector<const int32_t*> block_tables_;
  std::vector<int32_t> request_;      // [seqs] scheduled index of each drafting row
  std::vector<int64_t> last_pos_;     // [seqs] position of its last row
  std::vector<float> hidden_in_;      // [tokens, H]
  std::vector<int32_t> pass_drafts_;  // [seqs] one pass's drafts, row by row
  std::vector<int32_t> drafts_;       // [seqs, K]
};

}  // namespace moeserve::engine
