#include "engine/model_runner.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>

#include "core/check.h"
#include "core/trace.h"
#include "engine/sampler.h"

namespace moeserve::engine {

ModelRunner::ModelRunner(model::ModelGroup& group, const RunnerConfig& config)
    : group_(group), config_(config) {
  const model::CausalLm& model = group.model();
  group.CreateCache(config.cache);
  const int64_t rows = config.max_num_seqs, tokens = config.max_num_batched_tokens;
  const int64_t K = config.spec.enabled() ? config.spec.num_speculative_tokens : 0;
  CHECK_GT(rows, 0);
  CHECK_GT(tokens, 0);
  CHECK_GT(config.max_blocks_per_request, 0);
  CHECK(config.spec.method != SpecMethod::kMtp || model.has_mtp()) << "the model has no MTP head";
  block_tables_.assign(rows * config.max_blocks_per_request, 0);
  row_num_blocks_.assign(rows, 0);
  row_of_.reserve(rows);
  for (int64_t row = rows - 1; row >= 0; --row) free_rows_.push_back(static_cast<int32_t>(row));
  input_ids_.resize(tokens);
  positions_.resize(tokens);
  seq_of_.resize(tokens);
  // A step has at most one sequence per token and per running request.
  const int64_t seqs = std::min(rows, tokens);
  query_start_.resize(seqs + 1);
  state_slots_.resize(seqs);
  seq_block_tables_.resize(seqs);
  logits_rows_.resize(tokens);  // prompt_logprobs may ask for every row
  logits_index_.resize(seqs);
  prompt_rows_.resize(seqs);
  sample_scratch_.resize(2 * model.config().vocab_size);
  // Sampled rows: one per request, or 1 + K with drafts.
  const int64_t sampled_rows = std::min(tokens, seqs * (1 + K));
  step_.token_start.resize(seqs + 1);
  step_.tokens.reserve(sampled_rows);
  step_.draft_start.resize(seqs + 1);
  step_.drafts.reserve(seqs * K);
  if (config.spec.enabled()) {
    verify_slot_ids_.resize(seqs * (1 + K));
    verify_slots_.resize(seqs);
    history_.reserve(config.max_model_len + K + 1);
    draft_budget_.resize(seqs);
  }
  if (config.spec.method == SpecMethod::kMtp) {
    const int64_t H = model.config().hidden_size;
    mtp_tokens_.resize(tokens);
    mtp_positions_.resize(tokens);
    mtp_seq_of_.resize(tokens);
    mtp_query_start_.resize(seqs + 1);
    mtp_block_tables_.resize(seqs);
    mtp_logits_rows_.resize(seqs);
    mtp_request_.resize(seqs);
    mtp_last_pos_.resize(seqs);
    mtp_hidden_in_.resize(tokens * H);
    mtp_drafts_.resize(seqs * K);
  }
  group_.Reserve(tokens, sampled_rows);
}

int32_t ModelRunner::AddRow(int64_t request_id) {
  CHECK(!free_rows_.empty()) << "more running requests than max_num_seqs";
  const int32_t row = free_rows_.back();
  free_rows_.pop_back();
  row_num_blocks_[row] = 0;
  row_of_.emplace(request_id, row);
  return row;
}

void ModelRunner::RemoveRow(int64_t request_id) {
  auto it = row_of_.find(request_id);
  if (it == row_of_.end()) return;
  // Keep free_rows_ sorted descending so the lowest hole is reused first.
  free_rows_.insert(
      std::lower_bound(free_rows_.begin(), free_rows_.end(), it->second, std::greater<>()),
      it->second);
  row_of_.erase(it);
}

const StepOutput& ModelRunner::Execute(const SchedulerOutput& out) {
  // Rows of requests that left the running set since the last step.
  for (int64_t id : out.finished_ids) RemoveRow(id);
  for (int64_t id : out.preempted_ids) RemoveRow(id);

  const int64_t num_seqs = static_cast<int64_t>(out.scheduled.size());
  const int64_t K = config_.spec.num_speculative_tokens;
  CHECK_LE(num_seqs, static_cast<int64_t>(logits_index_.size()));
  CHECK_LE(out.total_num_scheduled_tokens, config_.max_num_batched_tokens);
  int64_t num_tokens = 0, num_logits = 0;
  bool any_verify = false;
  query_start_[0] = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const ScheduledRequest& s = out.scheduled[i];
    const Request& r = *s.request;
    if (s.fresh) {
      // A new or resumed request starts from position 0 or from its cached prefix: a clean
      // row, and zero GDN state or the checkpoint at the prefix's end.
      RemoveRow(r.id);
      AddRow(r.id);
      if (r.state_slot >= 0) {
        if (r.restore_state_slot >= 0) {
          CHECK_GT(s.first_pos, 0);
          group_.CopySlot(r.restore_state_slot, r.state_slot);
        } else {
          CHECK_EQ(s.first_pos, 0) << "a GDN state resumes only from a checkpoint";
          group_.ResetSlot(r.state_slot);
        }
      }
    }
    const auto it = row_of_.find(r.id);
    CHECK(it != row_of_.end()) << "request " << r.id << " has no row";
    const int32_t row = it->second;

    // Block ids appended since the last step: only those are copied.
    int32_t* table = block_row(row);
    const int64_t held = static_cast<int64_t>(r.block_ids.size());
    CHECK_LE(held, config_.max_blocks_per_request);
    for (int64_t b = row_num_blocks_[row]; b < held; ++b) table[b] = r.block_ids[b];
    row_num_blocks_[row] = held;

    // The scheduled positions: the request's tokens, then its drafts.
    const int64_t num_draft = s.num_draft_tokens;
    CHECK_EQ(num_draft, static_cast<int64_t>(r.draft_token_ids.size()));
    for (int64_t p = s.first_pos; p < s.first_pos + s.num_new_tokens; ++p, ++num_tokens) {
      input_ids_[num_tokens] =
          p < r.num_tokens() ? r.token_at(p) : r.draft_token_ids[p - r.num_tokens()];
      positions_[num_tokens] = p;
      seq_of_[num_tokens] = static_cast<int32_t>(i);
    }
    query_start_[i + 1] = static_cast<int32_t>(num_tokens);
    seq_block_tables_[i] = table;
    state_slots_[i] = std::max(r.state_slot, 0);
    if (!verify_slots_.empty()) {
      verify_slots_[i] = nullptr;
      if (num_draft > 0 && r.state_slot >= 0) {
        // The state after the last token stays in place; after draft j it goes to extra slot j.
        int32_t* ids = &verify_slot_ids_[i * (1 + K)];
        ids[0] = r.state_slot;
        for (int64_t j = 0; j < num_draft; ++j) ids[1 + j] = r.spec_state_slots[j];
        verify_slots_[i] = ids;
        any_verify = true;
      }
    }
    // prompt_logprobs: the logits at prompt position p score prompt token p + 1.
    prompt_rows_[i] = {static_cast<int32_t>(num_logits), 0};
    if (r.params().prompt_logprobs.has_value()) {
      const int64_t end = std::min(s.first_pos + s.num_new_tokens, r.num_prompt_tokens() - 1);
      for (int64_t p = s.first_pos; p < end; ++p) {
        logits_rows_[num_logits++] = static_cast<int32_t>(query_start_[i] + (p - s.first_pos));
        ++prompt_rows_[i].second;
      }
    }
    // Only a chunk that reaches the request's last token yields tokens to sample: its last
    // token's row, and one per draft.
    if (s.first_pos + s.num_new_tokens - num_draft == r.num_tokens()) {
      logits_index_[i] = static_cast<int32_t>(num_logits);
      for (int64_t j = num_draft; j >= 0; --j) {
        logits_rows_[num_logits++] = static_cast<int32_t>(num_tokens - 1 - j);
      }
    } else {
      logits_index_[i] = -1;
    }
  }
  CHECK_EQ(num_tokens, out.total_num_scheduled_tokens);
  last_num_seqs_ = num_seqs;
  step_.tokens.clear();
  step_.drafts.clear();
  step_.token_start[0] = step_.draft_start[0] = 0;
  if (num_tokens == 0) return step_;

  const model::TokenBatch batch{num_tokens,
                                input_ids_.data(),
                                positions_.data(),
                                seq_of_.data(),
                                num_seqs,
                                query_start_.data(),
                                seq_block_tables_.data(),
                                state_slots_.data(),
                                any_verify ? verify_slots_.data() : nullptr};
  // A step whose every sampled row is plain greedy needs only argmaxes: vocab-parallel ranks
  // then exchange (max, index) pairs instead of gathering logits.
  argmax_only_ = config_.greedy_argmax;
  for (int64_t i = 0; i < num_seqs && argmax_only_; ++i) {
    const Request& r = *out.scheduled[i].request;
    argmax_only_ = prompt_rows_[i].second == 0 &&
                   (logits_index_[i] < 0 || r.sampler->plain_greedy());
  }
  {
    trace::Scope scope("forward", "tokens", num_tokens);
    group_.ForwardBatch(batch, logits_rows_.data(), num_logits,
                        argmax_only_ ? model::LogitsMode::kArgmax : model::LogitsMode::kFull);
  }
  {
    trace::Scope sample_scope("sample");
    for (int64_t i = 0; i < num_seqs; ++i) {
      const ScheduledRequest& s = out.scheduled[i];
      Request& r = *s.request;
      RecordPromptLogprobs(r, s.first_pos, prompt_rows_[i]);
      if (logits_index_[i] >= 0) {
        if (s.num_draft_tokens == 0) {
          step_.tokens.push_back(SampleRow(r, logits_index_[i]));
        } else {
          VerifyRows(s, logits_index_[i]);
        }
      }
      step_.token_start[i + 1] = static_cast<int32_t>(step_.tokens.size());
    }
  }
  trace::Scope propose_scope("propose");
  Propose(out);
  return step_;
}

int32_t ModelRunner::SampleRow(Request& r, int64_t logits_row) {
  const int64_t V = model().config().vocab_size;
  const float* logits = model().logits() + logits_row * V;
  // The greedy fast path: argmax of the raw logits, no copy, no softmax.
  if (r.sampler->plain_greedy()) {
    return argmax_only_ ? model().argmax()[logits_row] : GreedyToken(logits, V);
  }
  r.sampler->Sample(logits, r.output_token_ids, sample_scratch_.data(), &sampled_token_);
  r.sampler->Accept(sampled_token_.token);
  if (r.params().logprobs.has_value()) r.output_logprobs.push_back(sampled_token_);
  return sampled_token_.token;
}

void ModelRunner::VerifyRows(const ScheduledRequest& s, int64_t logits_row) {
  Request& r = *s.request;
  const int64_t V = model().config().vocab_size;
  const bool plain_greedy = r.sampler->plain_greedy();
  // Row j sees the outputs plus the drafts accepted before it, as decoding would have.
  if (!plain_greedy) history_.assign(r.output_token_ids.begin(), r.output_token_ids.end());
  int64_t accepted = 0;
  for (int64_t j = 0; j <= s.num_draft_tokens; ++j) {
    const float* logits = model().logits() + (logits_row + j) * V;
    int32_t token;
    bool keep_going = false;
    if (plain_greedy) {
      // Driven by the argmax alone: no probabilities materialized.
      token = argmax_only_ ? model().argmax()[logits_row + j] : GreedyToken(logits, V);
      keep_going = j < s.num_draft_tokens && token == r.draft_token_ids[j];
    } else {
      if (j < s.num_draft_tokens) {
        keep_going = r.sampler->Verify(logits, history_, r.draft_token_ids[j],
                                       sample_scratch_.data(), &sampled_token_);
      } else {
        r.sampler->Sample(logits, history_, sample_scratch_.data(), &sampled_token_);
      }
      token = sampled_token_.token;
      r.sampler->Accept(token);
      history_.push_back(token);
      if (r.params().logprobs.has_value()) r.output_logprobs.push_back(sampled_token_);
    }
    step_.tokens.push_back(token);
    if (!keep_going) break;
    ++accepted;
  }
  // GDN state: the state after the last accepted token is in its verify slot; it becomes the
  // request's (the slots trade places, nothing is copied).
  if (accepted > 0 && r.state_slot >= 0) std::swap(r.state_slot, r.spec_state_slots[accepted - 1]);
}

int64_t ModelRunner::DraftBudget(const ScheduledRequest& s, int64_t num_emitted) {
  Request& r = *s.request;
  if (num_emitted == 0) return 0;
  const SpecConfig& spec = config_.spec;
  const int64_t num_tokens = r.num_tokens() + num_emitted;
  const int64_t remaining = r.stop.max_tokens - (r.num_output_tokens() + num_emitted);
  // The next step emits at most drafts + 1 tokens and verifies positions up to
  // num_tokens - 1 + drafts, which must stay below max_model_len.
  const int64_t limit = std::max<int64_t>(
      0, std::min({spec.num_speculative_tokens, remaining - 1, config_.max_model_len - num_tokens}));
  if (spec.min_acceptance <= 0 || limit == 0) return limit;
  int64_t n = 0;
  for (double reach = 1; n < limit; ++n) {
    reach *= r.draft_acceptance[n];
    if (reach < spec.min_acceptance) break;
  }
  if (n > 0) {
    r.steps_without_drafts = 0;
  } else if (++r.steps_without_drafts >= SpecConfig::kProbeInterval) {
    r.steps_without_drafts = 0;
    n = 1;  // a probe: the model may have come to agree again
  }
  return n;
}

void ModelRunner::Propose(const SchedulerOutput& out) {
  const int64_t num_seqs = static_cast<int64_t>(out.scheduled.size());
  const SpecConfig& spec = config_.spec;
  // Drafting pauses while the batch is large enough to keep the cores busy by itself.
  const bool paused = !spec.enabled() ||
                      (spec.disable_batch_size > 0 && num_seqs > spec.disable_batch_size);
  if (paused) {
    for (int64_t i = 0; i < num_seqs; ++i) step_.draft_start[i + 1] = 0;
    return;
  }
  for (int64_t i = 0; i < num_seqs; ++i) {
    const std::span<const int32_t> emitted = step_.tokens_of(i);
    draft_budget_[i] = static_cast<int32_t>(
        DraftBudget(out.scheduled[i], static_cast<int64_t>(emitted.size())));
  }
  if (spec.method == SpecMethod::kMtp) {
    ProposeMtp(out);
    return;
  }
  for (int64_t i = 0; i < num_seqs; ++i) {
    if (draft_budget_[i] > 0) {
      // Prompt lookup over prompt + outputs + this step's tokens.
      const Request& r = *out.scheduled[i].request;
      const std::span<const int32_t> emitted = step_.tokens_of(i);
      history_.assign(r.prompt_token_ids.begin(), r.prompt_token_ids.end());
      history_.insert(history_.end(), r.output_token_ids.begin(), r.output_token_ids.end());
      history_.insert(history_.end(), emitted.begin(), emitted.end());
      const size_t start = step_.drafts.size();
      step_.drafts.resize(start + draft_budget_[i]);
      const int64_t n = NgramPropose(history_, spec.prompt_lookup_min, spec.prompt_lookup_max,
                                     draft_budget_[i], step_.drafts.data() + start);
      step_.drafts.resize(start + n);
    }
    step_.draft_start[i + 1] = static_cast<int32_t>(step_.drafts.size());
  }
}

void ModelRunner::ProposeMtp(const SchedulerOutput& out) {
  const int64_t num_seqs = static_cast<int64_t>(out.scheduled.size());
  const int64_t H = model().config().hidden_size;
  const int64_t K = config_.spec.num_speculative_tokens;
  // Drafts are the MTP head's greedy tokens: argmaxes from the forward, or (--no-greedy-argmax)
  // scans of its full logits rows.
  const model::LogitsMode draft_mode =
      config_.greedy_argmax ? model::LogitsMode::kArgmax : model::LogitsMode::kFull;
  const int64_t V = model().config().vocab_size;
  const auto draft_of = [&](int64_t row) {
    return config_.greedy_argmax ? model().mtp_argmax()[row]
                                 : GreedyToken(model().mtp_logits() + row * V, V);
  };
  // First pass: every position this step verified, so the MTP layer's KV cache sees the whole
  // history -- row (position t) pairs the target's hidden state at t with the token at t + 1.
  int64_t T = 0, num_drafting = 0;
  mtp_query_start_[0] = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const ScheduledRequest& s = out.scheduled[i];
    const Request& r = *s.request;
    const std::span<const int32_t> emitted = step_.tokens_of(i);
    const int64_t accepted = emitted.empty() ? 0 : static_cast<int64_t>(emitted.size()) - 1;
    const int64_t valid = s.num_new_tokens - s.num_draft_tokens + accepted;
    for (int64_t j = 0; j < valid; ++j, ++T) {
      const int64_t pos = s.first_pos + j;
      mtp_tokens_[T] = pos + 1 < r.num_tokens() ? r.token_at(pos + 1)
                                                : emitted[pos + 1 - r.num_tokens()];
      mtp_positions_[T] = pos;
      mtp_seq_of_[T] = static_cast<int32_t>(i);
      std::memcpy(&mtp_hidden_in_[T * H], model().hidden() + (query_start_[i] + j) * H,
                  H * sizeof(float));
    }
    mtp_query_start_[i + 1] = static_cast<int32_t>(T);
    mtp_block_tables_[i] = seq_block_tables_[i];
    if (draft_budget_[i] > 0) {
      mtp_request_[num_drafting] = static_cast<int32_t>(i);
      mtp_last_pos_[num_drafting] = s.first_pos + valid - 1;
      mtp_logits_rows_[num_drafting++] = static_cast<int32_t>(T - 1);
    }
  }
  const model::TokenBatch first{T,
                                mtp_tokens_.data(),
                                mtp_positions_.data(),
                                mtp_seq_of_.data(),
                                num_seqs,
                                mtp_query_start_.data(),
                                mtp_block_tables_.data(),
                                state_slots_.data()};
  group_.MtpForwardBatch(first, mtp_hidden_in_.data(), mtp_logits_rows_.data(), num_drafting,
                         draft_mode);
  for (int64_t d = 0; d < num_drafting; ++d) mtp_drafts_[d * K] = draft_of(d);

  // Chained steps 2 .. K: one row per request still drafting -- its last draft, at the next
  // position, with the MTP head's own output hidden state (vLLM's chaining).
  std::vector<int32_t>& prev_row = mtp_logits_rows_;  // row of each drafting request's hidden
  for (int64_t step = 1; step < K; ++step) {
    int64_t rows = 0;
    for (int64_t d = 0; d < num_drafting; ++d) {
      const int64_t i = mtp_request_[d];
      if (draft_budget_[i] <= step) continue;
      mtp_tokens_[rows] = mtp_drafts_[d * K + step - 1];
      mtp_positions_[rows] = mtp_last_pos_[d] + step;
      mtp_seq_of_[rows] = static_cast<int32_t>(rows);
      mtp_query_start_[rows + 1] = static_cast<int32_t>(rows + 1);
      mtp_block_tables_[rows] = seq_block_tables_[i];
      std::memcpy(&mtp_hidden_in_[rows * H], model().mtp_hidden() + prev_row[d] * H,
                  H * sizeof(float));
      prev_row[d] = static_cast<int32_t>(rows);  // its row in this pass
      ++rows;
    }
    if (rows == 0) break;
    const model::TokenBatch chained{rows,
                                    mtp_tokens_.data(),
                                    mtp_positions_.data(),
                                    mtp_seq_of_.data(),
                                    rows,
                                    mtp_query_start_.data(),
                                    mtp_block_tables_.data(),
                                    state_slots_.data()};
    // Logits of every row: rows are 0 .. rows - 1 in order, which mtp_seq_of_ happens to hold.
    group_.MtpForwardBatch(chained, mtp_hidden_in_.data(), mtp_seq_of_.data(), rows,
                           draft_mode);
    for (int64_t d = 0, row = 0; d < num_drafting; ++d) {
      if (draft_budget_[mtp_request_[d]] <= step) continue;
      mtp_drafts_[d * K + step] = draft_of(row);
      ++row;
    }
  }

  for (int64_t i = 0, d = 0; i < num_seqs; ++i) {
    if (d < num_drafting && mtp_request_[d] == i) {
      step_.drafts.insert(step_.drafts.end(), &mtp_drafts_[d * K],
                          &mtp_drafts_[d * K] + draft_budget_[i]);
      ++d;
    }
    step_.draft_start[i + 1] = static_cast<int32_t>(step_.drafts.size());
  }
}

void ModelRunner::RecordPromptLogprobs(Request& r, int64_t first_pos,
                                       std::pair<int32_t, int32_t> rows) {
  const int64_t V = model().config().vocab_size;
  float* logprobs = sample_scratch_.data();
  for (int32_t j = 0; j < rows.second; ++j) {
    const int64_t p = first_pos + j;
    // A request recomputed after preemption has its earlier entries already.
    if (static_cast<int64_t>(r.prompt_logprobs.size()) != p) continue;
    LogSoftmax(model().logits() + (rows.first + j) * V, V, logprobs);
    SampledToken entry;
    entry.token = r.prompt_token_ids[p + 1];
    GatherLogprobs(logprobs, V, *r.params().prompt_logprobs, r.prompt_token_ids[p + 1], &entry);
    r.prompt_logprobs.push_back(std::move(entry));
  }
}

const float* ModelRunner::logits_of(int64_t i, int64_t j) const {
  if (i < 0 || i >= last_num_seqs_ || logits_index_[i] < 0 || j < 0 ||
      j >= static_cast<int64_t>(step_.tokens_of(i).size())) {
    return nullptr;
  }
  return model().logits() + (logits_index_[i] + j) * model().config().vocab_size;
}

}  // namespace moeserve::engine
