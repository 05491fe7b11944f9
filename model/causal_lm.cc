#include "model/causal_lm.h"

#include <thread>

#include "kernels/matmul.h"
#include "kernels/norms.h"

namespace moeserve::model {

Result<std::unique_ptr<CausalLm>> CausalLm::Load(const std::string& dir,
                                                 const LoadOptions& options) {
  ASSIGN_OR_RETURN(io::ModelConfig config, io::LoadModelConfig(dir));
  ASSIGN_OR_RETURN(io::SafetensorsCheckpoint checkpoint, io::SafetensorsCheckpoint::Open(dir));
  ASSIGN_OR_RETURN(ModelWeights weights, LoadWeights(config, checkpoint, options.weight_dtype));
  const size_t threads =
      options.threads > 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  return std::make_unique<CausalLm>(std::move(config), std::move(weights), threads);
}

CausalLm::CausalLm(io::ModelConfig config, ModelWeights weights, size_t threads)
    : config_(std::move(config)), weights_(std::move(weights)), pool_(threads) {}

LayerContext CausalLm::Context(int64_t layer) {
  return LayerContext{config_, pool_, comm_, scratch_, tap_ ? &tap_ : nullptr, layer};
}

void CausalLm::EmbedRows(const int32_t* tokens, int64_t T, float* out) const {
  const Tensor& table = weights_.embedding.view();
  const int64_t H = config_.hidden_size;
  const size_t row_bytes = H * DTypeSize(table.dtype());
  for (int64_t t = 0; t < T; ++t) {
    CHECK(tokens[t] >= 0 && tokens[t] < config_.vocab_size) << "token id " << tokens[t];
    ConvertToF32(table.dtype(), static_cast<const std::byte*>(table.data()) + tokens[t] * row_bytes,
                 out + t * H, H);
  }
}

void CausalLm::Logits(const float* x, int64_t rows, std::vector<float>* logits) {
  const int64_t V = config_.vocab_size, H = config_.hidden_size;
  logits->resize(rows * V);
  kernels::MatMul(x, H, rows, weights_.lm_head_matrix(), logits->data(), V, pool_);
  // Vocab-parallel ranks will gather their shards here.
}

void CausalLm::Forward(const SequenceInput& seq, ModelCache& cache, bool all_logits,
                       std::vector<float>* hidden, std::vector<float>* logits) {
  const int64_t T = seq.num_tokens, H = config_.hidden_size;
  CHECK_GT(T, 0);
  x_.resize(T * H);
  EmbedRows(seq.tokens, T, x_.data());
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const DecoderLayerWeights& w = weights_.layers[i];
    const bool gdn = w.type == io::LayerType::kLinearAttention;
    DecoderLayer(Context(i), w, x_.data(), T, seq.first_pos, gdn ? nullptr : &cache.kv(i),
                 seq.block_table, gdn ? cache.conv_state(i, seq.state_slot) : nullptr,
                 gdn ? cache.recurrent_state(i, seq.state_slot) : nullptr);
  }
  hidden_.resize(T * H);
  RmsNormRows(x_.data(), T, H, weights_.final_norm, static_cast<float>(config_.rms_norm_eps),
              hidden_.data());
  Context(config_.num_hidden_layers).Tap("final_norm", hidden_.data(), T, H);
  if (hidden != nullptr) *hidden = hidden_;
  if (logits != nullptr) {
    const int64_t first_row = all_logits ? 0 : T - 1;
    Logits(hidden_.data() + first_row * H, T - first_row, logits);
  }
}

void CausalLm::MtpForward(const float* hidden, const int32_t* next_tokens, int64_t T,
                          int64_t first_pos, const int32_t* block_table, ModelCache& cache,
                          std::vector<float>* mtp_hidden, std::vector<float>* logits) {
  CHECK(has_mtp()) << "the model has no MTP head";
  const MtpWeights& mtp = weights_.mtp;
  const int64_t H = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  // u = fc([norm(embedding of the next token) ; norm(hidden)]), the embedding half first.
  mtp_in_.resize(T * 2 * H);
  std::vector<float>& embedded = scratch_.normed;
  embedded.resize(T * H);
  EmbedRows(next_tokens, T, embedded.data());
  for (int64_t t = 0; t < T; ++t) {
    kernels::RmsNorm(embedded.data() + t * H, mtp.pre_fc_norm_embedding.data(), eps,
                     mtp_in_.data() + t * 2 * H, H);
    kernels::RmsNorm(hidden + t * H, mtp.pre_fc_norm_hidden.data(), eps,
                     mtp_in_.data() + t * 2 * H + H, H);
  }
  x_.resize(T * H);
  kernels::MatMul(mtp_in_.data(), 2 * H, T, mtp.fc.view(), x_.data(), H, pool_);
  // One MTP layer per draft step in vLLM (spec_step_idx % num_mtp_layers); the first pass and the
  // chained steps of the released models use layer 0.
  DecoderLayer(Context(config_.num_hidden_layers), mtp.layers[0], x_.data(), T, first_pos,
               &cache.kv(config_.num_hidden_layers), block_table, nullptr, nullptr);
  hidden_.resize(T * H);
  RmsNormRows(x_.data(), T, H, mtp.norm, eps, hidden_.data());
  if (mtp_hidden != nullptr) *mtp_hidden = hidden_;
  if (logits != nullptr) Logits(hidden_.data(), T, logits);
}

}  // namespace moeserve::model
