#include "engine/model_runner.h"

#include <algorithm>
#include <functional>

#include "core/check.h"
#include "engine/sampler.h"

namespace moeserve::engine {

ModelRunner::ModelRunner(model::CausalLm& model, const RunnerConfig& config)
    : model_(model), config_(config), cache_(model.config(), config.cache) {
  const int64_t rows = config.max_num_seqs, tokens = config.max_num_batched_tokens;
  CHECK_GT(rows, 0);
  CHECK_GT(tokens, 0);
  CHECK_GT(config.max_blocks_per_request, 0);
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
  sampled_.resize(seqs);
  logits_index_.resize(seqs);
  prompt_rows_.resize(seqs);
  sample_scratch_.resize(2 * model.config().vocab_size);
  model_.Reserve(tokens, seqs);
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

const int32_t* ModelRunner::Execute(const SchedulerOutput& out) {
  // Rows of requests that left the running set since the last step.
  for (int64_t id : out.finished_ids) RemoveRow(id);
  for (int64_t id : out.preempted_ids) RemoveRow(id);

  const int64_t num_seqs = static_cast<int64_t>(out.scheduled.size());
  CHECK_LE(num_seqs, static_cast<int64_t>(sampled_.size()));
  CHECK_LE(out.total_num_scheduled_tokens, config_.max_num_batched_tokens);
  int64_t num_tokens = 0, num_logits = 0;
  query_start_[0] = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const ScheduledRequest& s = out.scheduled[i];
    const Request& r = *s.request;
    if (s.fresh) {
      // A new or resumed request starts from position 0 (no prefix caching for GDN state) or
      // from its cached prefix: a clean row, and zero GDN state.
      RemoveRow(r.id);
      AddRow(r.id);
      if (r.state_slot >= 0) {
        CHECK_EQ(s.first_pos, 0) << "a GDN state cannot resume from a cached prefix";
        cache_.ResetSlot(r.state_slot);
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

    for (int64_t p = s.first_pos; p < s.first_pos + s.num_new_tokens; ++p, ++num_tokens) {
      input_ids_[num_tokens] = r.token_at(p);
      positions_[num_tokens] = p;
      seq_of_[num_tokens] = static_cast<int32_t>(i);
    }
    query_start_[i + 1] = static_cast<int32_t>(num_tokens);
    seq_block_tables_[i] = table;
    state_slots_[i] = std::max(r.state_slot, 0);
    // prompt_logprobs: the logits at prompt position p score prompt token p + 1.
    prompt_rows_[i] = {static_cast<int32_t>(num_logits), 0};
    if (r.params.prompt_logprobs.has_value()) {
      const int64_t end = std::min(s.first_pos + s.num_new_tokens, r.num_prompt_tokens() - 1);
      for (int64_t p = s.first_pos; p < end; ++p) {
        logits_rows_[num_logits++] = static_cast<int32_t>(query_start_[i] + (p - s.first_pos));
        ++prompt_rows_[i].second;
      }
    }
    // Only a chunk that reaches the request's last token yields a token to sample.
    if (s.first_pos + s.num_new_tokens == r.num_tokens()) {
      logits_rows_[num_logits] = static_cast<int32_t>(num_tokens - 1);
      logits_index_[i] = static_cast<int32_t>(num_logits++);
    } else {
      logits_index_[i] = -1;
    }
  }
  CHECK_EQ(num_tokens, out.total_num_scheduled_tokens);
  last_num_seqs_ = num_seqs;
  if (num_tokens == 0) return sampled_.data();

  const model::TokenBatch batch{num_tokens,   input_ids_.data(),   positions_.data(),
                                seq_of_.data(), num_seqs,          query_start_.data(),
                                seq_block_tables_.data(), state_slots_.data()};
  model_.ForwardBatch(batch, cache_, logits_rows_.data(), num_logits);

  for (int64_t i = 0; i < num_seqs; ++i) {
    Request& r = *out.scheduled[i].request;
    RecordPromptLogprobs(r, out.scheduled[i].first_pos, prompt_rows_[i]);
    sampled_[i] = logits_index_[i] < 0 ? -1 : SampleRow(r, logits_index_[i]);
  }
  return sampled_.data();
}

int32_t ModelRunner::SampleRow(Request& r, int64_t logits_row) {
  const int64_t V = model_.config().vocab_size;
  const float* logits = model_.logits() + logits_row * V;
  // The greedy fast path: argmax of the raw logits, no copy, no softmax.
  if (r.sampler->plain_greedy()) return GreedyToken(logits, V);
  r.sampler->Sample(logits, r.output_token_ids, sample_scratch_.data(), &sampled_token_);
  r.sampler->Accept(sampled_token_.token);
  if (r.params.logprobs.has_value()) r.output_logprobs.push_back(sampled_token_);
  return sampled_token_.token;
}

void ModelRunner::RecordPromptLogprobs(Request& r, int64_t first_pos,
                                       std::pair<int32_t, int32_t> rows) {
  const int64_t V = model_.config().vocab_size;
  float* logprobs = sample_scratch_.data();
  for (int32_t j = 0; j < rows.second; ++j) {
    const int64_t p = first_pos + j;
    // A request recomputed after preemption has its earlier entries already.
    if (static_cast<int64_t>(r.prompt_logprobs.size()) != p) continue;
    LogSoftmax(model_.logits() + (rows.first + j) * V, V, logprobs);
    SampledToken entry;
    entry.token = r.prompt_token_ids[p + 1];
    GatherLogprobs(logprobs, V, *r.params.prompt_logprobs, r.prompt_token_ids[p + 1], &entry);
    r.prompt_logprobs.push_back(std::move(entry));
  }
}

const float* ModelRunner::logits_of(int64_t i) const {
  if (i < 0 || i >= last_num_seqs_ || logits_index_[i] < 0) {
    return nullptr;
  }
  return model_.logits() + logits_index_[i] * model_.config().vocab_size;
}

}  // namespace moeserve::engine
