#include "engine/spec_decode/mtp_proposer.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace moeserve::engine {

MtpProposer::MtpProposer(const SpecConfig& spec, const ProposerLimits& limits, int64_t hidden_size,
                         MtpHead& head)
    : DraftProposer(spec, limits), head_(head), hidden_size_(hidden_size) {
  CHECK(spec.method == SpecMethod::kMtp);
  const int64_t tokens = limits.max_num_batched_tokens, seqs = max_seqs();
  const int64_t K = spec.num_speculative_tokens;
  tokens_.resize(tokens);
  positions_.resize(tokens);
  seq_of_.resize(tokens);
  query_start_.resize(seqs + 1);
  block_tables_.resize(seqs);
  logits_rows_.resize(seqs);
  request_.resize(seqs);
  last_pos_.resize(seqs);
  hidden_in_.resize(tokens * hidden_size);
  pass_drafts_.resize(seqs);
  drafts_.resize(seqs * K);
}

void MtpProposer::ProposeWithin(const SchedulerOutput& out, std::span<const int32_t> budget,
                                StepOutput& step) {
  const int64_t num_seqs = static_cast<int64_t>(out.scheduled.size());
  const int64_t H = hidden_size_;
  const int64_t K = spec().num_speculative_tokens;
  const model::TokenBatch& target = head_.target_batch();
  const float* target_hidden = head_.target_hidden();
  // First pass: every position this step verified, so the MTP layer's KV cache sees the whole
  // history -- row (position t) pairs the target's hidden state at t with the token at t + 1.
  int64_t T = 0, num_drafting = 0;
  query_start_[0] = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const ScheduledRequest& s = out.scheduled[i];
    const Request& r = *s.request;
    const std::span<const int32_t> emitted = step.tokens_of(i);
    const int64_t accepted = emitted.empty() ? 0 : static_cast<int64_t>(emitted.size()) - 1;
    // A request that stopped drafting for good (DraftPolicy) needs no MTP KV cache any more.
    const int64_t valid = r.drafts_stopped ? 0 : s.num_new_tokens - s.num_draft_tokens + accepted;
    for (int64_t j = 0; j < valid; ++j, ++T) {
      const int64_t pos = s.first_pos + j;
      tokens_[T] =
          pos + 1 < r.num_tokens() ? r.token_at(pos + 1) : emitted[pos + 1 - r.num_tokens()];
      positions_[T] = pos;
      seq_of_[T] = static_cast<int32_t>(i);
      std::memcpy(&hidden_in_[T * H], target_hidden + (target.query_start[i] + j) * H,
                  H * sizeof(float));
    }
    query_start_[i + 1] = static_cast<int32_t>(T);
    block_tables_[i] = target.block_tables[i];
    if (budget[i] > 0) {
      request_[num_drafting] = static_cast<int32_t>(i);
      last_pos_[num_drafting] = s.first_pos + valid - 1;
      logits_rows_[num_drafting++] = static_cast<int32_t>(T - 1);
    }
  }
  const model::TokenBatch first{
      T,        tokens_.data(),      positions_.data(),    seq_of_.data(),
      num_seqs, query_start_.data(), block_tables_.data(), target.state_slots};
  if (T == 0) return;  // every request stopped drafting: no drafts (the runner's draft_start)
  const float* head_hidden = head_.RunMtpHead(first, hidden_in_.data(), logits_rows_.data(),
                                              num_drafting, pass_drafts_.data());
  for (int64_t d = 0; d < num_drafting; ++d) drafts_[d * K] = pass_drafts_[d];

  // Chained steps 2 .. K: one row per request still drafting -- its last draft, at the next
  // position, with the MTP head's own output hidden state (vLLM's chaining).
  std::vector<int32_t>& prev_row = logits_rows_;  // row of each drafting request's hidden
  for (int64_t pass = 1; pass < K; ++pass) {
    int64_t rows = 0;
    for (int64_t d = 0; d < num_drafting; ++d) {
      const int64_t i = request_[d];
      if (budget[i] <= pass) continue;
      tokens_[rows] = drafts_[d * K + pass - 1];
      positions_[rows] = last_pos_[d] + pass;
      seq_of_[rows] = static_cast<int32_t>(rows);
      query_start_[rows + 1] = static_cast<int32_t>(rows + 1);
      block_tables_[rows] = target.block_tables[i];
      std::memcpy(&hidden_in_[rows * H], head_hidden + prev_row[d] * H, H * sizeof(float));
      prev_row[d] = static_cast<int32_t>(rows);  // its row in this pass
      ++rows;
    }
    if (rows == 0) break;
    const model::TokenBatch chained{
        rows, tokens_.data(),      positions_.data(),    seq_of_.data(),
        rows, query_start_.data(), block_tables_.data(), target.state_slots};
    // Logits of every row: rows are 0 .. rows - 1 in order, which seq_of_ happens to hold.
    head_hidden =
        head_.RunMtpHead(chained, hidden_in_.data(), seq_of_.data(), rows, pass_drafts_.data());
    for (int64_t d = 0, row = 0; d < num_drafting; ++d) {
      if (budget[request_[d]] <= pass) continue;
      drafts_[d * K + pass] = pass_drafts_[row];
      ++row;
    }
  }

  for (int64_t i = 0, d = 0; i < num_seqs; ++i) {
    if (d < num_drafting && request_[d] == i) {
      step.drafts.insert(step.drafts.end(), &drafts_[d * K], &drafts_[d * K] + budget[i]);
      ++d;
    }
    step.draft_start[i + 1] = static_cast<int32_t>(step.drafts.size());
  }
}

}  // namespace moeserve::engine
