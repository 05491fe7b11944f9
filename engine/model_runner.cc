#include "engine/model_runner.h"

#include <algorithm>
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

StepOutput& ModelRunner::Execute(const SchedulerOutput& out) {
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

  batch_ = model::TokenBatch{num_tokens,
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
    argmax_only_ =
        prompt_rows_[i].second == 0 && (logits_index_[i] < 0 || r.sampler->plain_greedy());
  }
  {
    trace::Scope scope("forward", "tokens", num_tokens);
    group_.ForwardBatch(batch_, logits_rows_.data(), num_logits,
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
      step_.draft_start[i + 1] = 0;  // the DraftProposer's, if any
    }
  }
  return step_;
}

const float* ModelRunner::RunMtpHead(const model::TokenBatch& batch, const float* hidden,
                                     const int32_t* logits_rows, int64_t num_logits,
                                     int32_t* drafts) {
  // Drafts are the MTP head's greedy tokens: argmaxes from the forward, or (--no-greedy-argmax)
  // scans of its full logits rows.
  group_.MtpForwardBatch(
      batch, hidden, logits_rows, num_logits,
      config_.greedy_argmax ? model::LogitsMode::kArgmax : model::LogitsMode::kFull);
  const int64_t V = model().config().vocab_size;
  for (int64_t row = 0; row < num_logits; ++row) {
    drafts[row] = config_.greedy_argmax ? model().mtp_argmax()[row]
                                        : GreedyToken(model().mtp_logits() + row * V, V);
  }
  return model().mtp_hidden();
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
