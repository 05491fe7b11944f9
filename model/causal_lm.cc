#include "model/causal_lm.h"

#include <cmath>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "core/trace.h"
#include "kernels/ggml_blocks.h"
#include "kernels/gated_delta_rule.h"
#include "kernels/matmul.h"
#include "kernels/norms.h"
#include "model/decoder_layer.h"
#include "model/model_files.h"

namespace moeserve::model {

int64_t GdnChunkAlignment() { return kernels::kGdnChunkSize; }

int64_t PrefillAlignment(const io::ModelConfig& config) {
  return config.is_hybrid() ? GdnChunkAlignment() : 1;
}

Result<std::unique_ptr<CausalLm>> CausalLm::Load(const std::string& dir,
                                                 const LoadOptions& options) {
  ASSIGN_OR_RETURN(ModelFiles files, OpenModelFiles(dir));
  io::ModelConfig& config = files.config;
  const io::SafetensorsCheckpoint& checkpoint = files.checkpoint;
  ASSIGN_OR_RETURN(ShardLayout shard, MakeShardLayout(config, options.shard));
  const size_t threads =
      options.threads > 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  Result<ModelWeights> weights = [&] {
    ThreadPool load_pool(threads, fmt::format("rank {} load", shard.spec.rank), shard.spec.rank);
    return LoadWeights(config, shard, checkpoint, options.weight_dtype, &load_pool,
                       options.lm_head_dtype);
  }();
  if (!weights.ok()) return weights.status();
  auto lm = std::make_unique<CausalLm>(std::move(config), std::move(shard), std::move(*weights),
                                       threads, options.comm, options.forward);
  lm->set_ggml_activations(options.ggml_activations);
  return lm;
}

CausalLm::CausalLm(io::ModelConfig config, ShardLayout shard, ModelWeights weights,
                   size_t threads, parallel::Communicator* comm, ForwardOptions forward)
    : config_(std::move(config)), shard_(std::move(shard)), weights_(std::move(weights)),
      pool_(threads, fmt::format("rank {}", comm != nullptr ? comm->rank() : 0),
            comm != nullptr ? comm->rank() : 0),
      comm_(comm != nullptr ? comm : &single_rank_), forward_(forward) {
  CHECK_EQ(comm_->size(), shard_.spec.size) << "communicator and shard disagree on the ranks";
  CHECK_EQ(comm_->rank(), shard_.spec.rank);
}

LayerContext CausalLm::Context(int64_t layer) {
  return LayerContext{shard_.local,
                      pool_,
                      *comm_,
                      scratch_,
                      tap_ ? &tap_ : nullptr,
                      layer,
                      forward_,
                      shard_.spec.expert_parallel && comm_->size() > 1,
                      forward_.warm_next_weights && comm_->size() > 1 ? &warmer_ : nullptr,
                      ggml_activations_};
}

void CausalLm::EmbedRows(const int32_t* tokens, int64_t T, float* out) {
  const Tensor& table = weights_.embedding.view();
  const int64_t H = config_.hidden_size;
  const size_t row_bytes = StoredRowBytes(table.dtype(), H);
  for (int64_t t = 0; t < T; ++t) {
    CHECK(tokens[t] >= 0 && tokens[t] < config_.vocab_size) << "token id " << tokens[t];
    if (!shard_.vocab.contains(tokens[t])) {  // another rank's row
      std::memset(out + t * H, 0, H * sizeof(float));
      continue;
    }
    const std::byte* row =
        static_cast<const std::byte*>(table.data()) + (tokens[t] - shard_.vocab.begin) * row_bytes;
    if (IsGgmlBlockDType(table.dtype())) {  // a GGUF file's, in place
      kernels::DequantizeGgmlRow(table.dtype(), row, out + t * H, H);
    } else {
      ConvertToF32(table.dtype(), row, out + t * H, H);
    }
  }
  if (comm_->size() > 1) comm_->AllReduceSum(out, T * H);
}

namespace {

template <typename T>
T* Grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

struct VocabArgmax {
  float value;
  int64_t index;  // -1: no candidate
};

// The first index of the maximum of v[0, n), as `best = 0; if (v[i] > v[best]) best = i` finds
// it when first_may_be_nan (the scan that starts the row); a later part of a row skips NaNs,
// which such a scan never moves to.
VocabArgmax FirstArgmax(const float* v, int64_t n, bool first_may_be_nan) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (best < 0) {
      if (first_may_be_nan || !std::isnan(v[i])) best = i;
    } else if (v[i] > v[best]) {
      best = i;
    }
  }
  return {best < 0 ? 0.0f : v[best], best};
}

// The one-sequence batch of SequenceInput-style calls.
struct OneSequence {
  std::vector<int64_t> positions;
  std::vector<int32_t> seq_of;
  int32_t query_start[2];
  const int32_t* block_table;
  int32_t slot;
  TokenBatch batch;

  OneSequence(const int32_t* tokens, int64_t T, int64_t first_pos, const int32_t* table,
              int32_t state_slot)
      : positions(T), seq_of(T, 0), query_start{0, static_cast<int32_t>(T)}, block_table(table),
        slot(state_slot) {
    for (int64_t t = 0; t < T; ++t) positions[t] = first_pos + t;
    batch = TokenBatch{T, tokens, positions.data(), seq_of.data(), 1, query_start, &block_table,
                       &slot};
  }
};

}  // namespace

void CausalLm::Logits(const float* x, const int32_t* rows, int64_t num_rows, LogitsMode mode,
                      std::vector<float>& out, std::vector<int32_t>& argmax) {
  const int64_t V = config_.vocab_size, H = config_.hidden_size;
  float* in = Grow(logits_in_, num_rows * H);
  for (int64_t i = 0; i < num_rows; ++i) {
    std::memcpy(in + i * H, x + static_cast<int64_t>(rows[i]) * H, H * sizeof(float));
  }
  int32_t* best = mode == LogitsMode::kArgmax ? Grow(argmax, num_rows) : nullptr;
  if (comm_->size() == 1) {
    float* logits = Grow(out, num_rows * V);
    kernels::MatMul(in, H, num_rows, weights_.lm_head_matrix(), logits, V, pool_,
                    ActivationsFor(weights_.lm_head_matrix(), ggml_activations_));
    for (int64_t i = 0; best != nullptr && i < num_rows; ++i) {
      best[i] = FirstArgmax(logits + i * V, V, /*first_may_be_nan=*/true).index;
    }
    return;
  }
  // Vocab-parallel: this rank's columns [vocab.begin, vocab.end) into rows padded to Vp.
  const int64_t Vp = shard_.vocab_stride, ranks = comm_->size();
  float* local = Grow(local_logits_, num_rows * Vp);
  kernels::MatMul(in, H, num_rows, weights_.lm_head_matrix(), local, Vp, pool_,
                  ActivationsFor(weights_.lm_head_matrix(), ggml_activations_));
  if (mode == LogitsMode::kFull) {
    float* gathered = Grow(gathered_, ranks * num_rows * Vp);
    comm_->AllGather(local, num_rows * Vp, gathered);
    float* logits = Grow(out, num_rows * V);
    for (int64_t r = 0; r < ranks; ++r) {
      const int64_t begin = std::min(V, r * Vp), count = std::min(V, begin + Vp) - begin;
      for (int64_t i = 0; i < num_rows; ++i) {
        std::memcpy(logits + i * V + begin, gathered + (r * num_rows + i) * Vp,
                    count * sizeof(float));
      }
    }
    return;
  }
  // Greedy rows: each rank's (max, index) pairs, merged in rank order exactly as one scan of
  // the whole row (first index of the maximum) would.
  float* pairs = Grow(local_logits_, num_rows * Vp + 2 * num_rows) + num_rows * Vp;
  for (int64_t i = 0; i < num_rows; ++i) {
    const VocabArgmax a =
        FirstArgmax(local + i * Vp, shard_.vocab.count, /*first_may_be_nan=*/comm_->rank() == 0);
    pairs[2 * i] = a.value;
    pairs[2 * i + 1] = a.index < 0 ? -1.0f : static_cast<float>(shard_.vocab.begin + a.index);
  }
  float* all = Grow(gathered_, ranks * 2 * num_rows);
  comm_->AllGather(pairs, 2 * num_rows, all);
  for (int64_t i = 0; i < num_rows; ++i) {
    float value = all[2 * i];
    int32_t index = static_cast<int32_t>(all[2 * i + 1]);
    for (int64_t r = 1; r < ranks; ++r) {
      const float* p = all + (r * num_rows + i) * 2;
      if (p[1] >= 0.0f && p[0] > value) {
        value = p[0];
        index = static_cast<int32_t>(p[1]);
      }
    }
    best[i] = index;
  }
}

void CausalLm::Reserve(int64_t max_tokens, int64_t max_logits_rows) {
  const int64_t H = config_.hidden_size;
  scratch_.Reserve(config_, max_tokens);
  Grow(x_, max_tokens * H);
  Grow(hidden_, max_tokens * H);
  if (has_mtp()) {
    Grow(mtp_in_, max_tokens * 2 * H);
    Grow(mtp_out_, max_tokens * H);
    Grow(mtp_logits_, max_logits_rows * config_.vocab_size);
  }
  Grow(logits_in_, max_logits_rows * H);
  Grow(logits_, max_logits_rows * config_.vocab_size);
  Grow(argmax_, max_logits_rows);
  Grow(mtp_argmax_, max_logits_rows);
  if (comm_->size() > 1) {
    const int64_t padded = max_logits_rows * shard_.vocab_stride;
    Grow(local_logits_, padded + 2 * max_logits_rows);
    Grow(gathered_, comm_->size() * std::max(padded, 2 * max_logits_rows));
  }
}

int64_t CausalLm::ReserveBytes(const io::ModelConfig& config, const ShardLayout& shard,
                               int64_t max_tokens, int64_t max_logits_rows) {
  // As Reserve: elements of f32 and i32 buffers.
  const int64_t H = config.hidden_size, V = config.vocab_size, rows = max_logits_rows;
  int64_t floats = 2 * max_tokens * H + rows * H + rows * V;  // x, hidden, logits_in, logits
  int64_t ints = 2 * rows;                                    // argmax, mtp_argmax
  if (config.num_mtp_layers > 0) floats += 3 * max_tokens * H + rows * V;
  const int64_t ranks = shard.spec.size;
  if (ranks > 1) {
    const int64_t padded = rows * shard.vocab_stride;
    floats += padded + 2 * rows + ranks * std::max(padded, 2 * rows);
  }
  return Scratch::ReserveBytes(config, max_tokens) + floats * static_cast<int64_t>(sizeof(float)) +
         ints * static_cast<int64_t>(sizeof(int32_t));
}

int64_t CausalLm::reserved_bytes() const {
  int64_t floats = 0;
  for (const std::vector<float>* v : {&x_, &hidden_, &mtp_in_, &mtp_out_, &logits_in_, &logits_,
                                      &mtp_logits_, &local_logits_, &gathered_}) {
    floats += static_cast<int64_t>(v->size());
  }
  const int64_t ints = static_cast<int64_t>(argmax_.size() + mtp_argmax_.size());
  return scratch_.bytes() + floats * static_cast<int64_t>(sizeof(float)) +
         ints * static_cast<int64_t>(sizeof(int32_t));
}

void CausalLm::ForwardBatch(const TokenBatch& batch, ModelCache& cache, const int32_t* logits_rows,
                            int64_t num_logits, LogitsMode mode) {
  const int64_t T = batch.num_tokens, H = config_.hidden_size;
  CHECK_GT(T, 0);
  float* x = Grow(x_, T * H);
  {
    trace::Scope scope("embed");
    EmbedRows(batch.tokens, T, x);
  }
  // Each layer ends with the next one's input norm (the last with the final norm, into hidden).
  float* normed = Grow(scratch_.normed, T * H);
  float* hidden = Grow(hidden_, T * H);
  const int64_t L = config_.num_hidden_layers;
  RmsNormRows(x, T, H, weights_.layers[0].input_norm, static_cast<float>(config_.rms_norm_eps),
              normed);
  for (int64_t i = 0; i < L; ++i) {
    const bool last = i + 1 == L;
    const NextWeights next = last ? NextWeights{.lm_head = &weights_.lm_head_matrix()}
                                  : NextWeights{.layer = &weights_.layers[i + 1]};
    DecoderLayer(Context(i), weights_.layers[i], batch, x, normed,
                 last ? weights_.final_norm : weights_.layers[i + 1].input_norm,
                 last ? hidden : normed, cache, next);
  }
  Context(L).Tap("final_norm", hidden, T, H);
  trace::Scope scope("lm_head", "rows", num_logits);
  if (num_logits > 0) Logits(hidden, logits_rows, num_logits, mode, logits_, argmax_);
}

void CausalLm::Forward(const SequenceInput& seq, ModelCache& cache, bool all_logits,
                       std::vector<float>* hidden, std::vector<float>* logits) {
  const int64_t T = seq.num_tokens, H = config_.hidden_size, V = config_.vocab_size;
  CHECK_GT(T, 0);
  const OneSequence one(seq.tokens, T, seq.first_pos, seq.block_table, seq.state_slot);
  std::vector<int32_t> rows;
  for (int64_t t = all_logits ? 0 : T - 1; t < T; ++t) rows.push_back(static_cast<int32_t>(t));
  const int64_t num_logits = logits != nullptr ? static_cast<int64_t>(rows.size()) : 0;
  ForwardBatch(one.batch, cache, rows.data(), num_logits);
  if (hidden != nullptr) hidden->assign(hidden_.begin(), hidden_.begin() + T * H);
  if (logits != nullptr) logits->assign(logits_.begin(), logits_.begin() + num_logits * V);
}

void CausalLm::MtpForwardBatch(const TokenBatch& batch, const float* hidden, ModelCache& cache,
                               const int32_t* logits_rows, int64_t num_logits, LogitsMode mode) {
  CHECK(has_mtp()) << "the model has no MTP head";
  trace::Scope scope("mtp", "tokens", batch.num_tokens);
  const MtpWeights& mtp = weights_.mtp;
  const int64_t T = batch.num_tokens, H = config_.hidden_size;
  CHECK_GT(T, 0);
  const float eps = static_cast<float>(config_.rms_norm_eps);
  // u = fc([norm(embedding of the next token) ; norm(hidden)]), the embedding half first.
  float* u = Grow(mtp_in_, T * 2 * H);
  float* embedded = Grow(scratch_.normed, T * H);
  EmbedRows(batch.tokens, T, embedded);
  for (int64_t t = 0; t < T; ++t) {
    kernels::RmsNorm(embedded + t * H, mtp.pre_fc_norm_embedding.data(), eps, u + t * 2 * H, H);
    kernels::RmsNorm(hidden + t * H, mtp.pre_fc_norm_hidden.data(), eps, u + t * 2 * H + H, H);
  }
  float* x = Grow(x_, T * H);
  kernels::MatMul(u, 2 * H, T, mtp.fc.view(), x, H, pool_,
                  ActivationsFor(mtp.fc.view(), ggml_activations_));
  // One MTP layer per draft step in vLLM (spec_step_idx % num_mtp_layers); the first pass and the
  // chained steps of the released models use layer 0, whose KV cache is cache layer
  // num_hidden_layers. It ends with mtp.norm, into mtp_out_.
  float* normed = Grow(scratch_.normed, T * H);
  float* out = Grow(mtp_out_, T * H);
  RmsNormRows(x, T, H, mtp.layers[0].input_norm, eps, normed);
  DecoderLayer(Context(config_.num_hidden_layers), mtp.layers[0], batch, x, normed, mtp.norm, out,
               cache);
  if (num_logits > 0) Logits(out, logits_rows, num_logits, mode, mtp_logits_, mtp_argmax_);
}

void CausalLm::MtpForward(const float* hidden, const int32_t* next_tokens, int64_t T,
                          int64_t first_pos, const int32_t* block_table, ModelCache& cache,
                          std::vector<float>* mtp_hidden, std::vector<float>* logits) {
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  const OneSequence one(next_tokens, T, first_pos, block_table, 0);
  std::vector<int32_t> rows(T);
  for (int64_t t = 0; t < T; ++t) rows[t] = static_cast<int32_t>(t);
  MtpForwardBatch(one.batch, hidden, cache, rows.data(), logits != nullptr ? T : 0);
  if (mtp_hidden != nullptr) mtp_hidden->assign(mtp_out_.begin(), mtp_out_.begin() + T * H);
  if (logits != nullptr) logits->assign(mtp_logits_.begin(), mtp_logits_.begin() + T * V);
}

}  // namespace moeserve::model
