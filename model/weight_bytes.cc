#include "model/weight_bytes.h"

#include <array>
#include <vector>

#include "core/tensor.h"

namespace moeserve::model {
namespace {

constexpr int64_t kF32 = sizeof(float);

// A planned matrix [rows, cols] of `role`, in the dtype MatrixDType gives it.
int64_t MatrixBytes(DType requested, DType base, TensorRole role, int64_t rows, int64_t cols) {
  const int64_t shape[] = {rows, cols};
  return static_cast<int64_t>(TensorBytes(MatrixDType(requested, base, role, cols), shape));
}

// What AllocateLayer and PlaceTensor (weights.cc) give one decoder layer of rank `shard`, into
// `kind` for every part when it is set (an MTP layer), else each part's own kind.
void PlanLayer(const ShardLayout& shard, DType requested, DType base, io::LayerType type, bool moe,
               const WeightKind* kind, WeightBytes& out) {
  const io::ModelConfig& c = shard.local;
  const int64_t H = c.hidden_size;
  const auto add = [&](WeightKind own, int64_t bytes) { out[kind ? *kind : own] += bytes; };
  const auto matrix = [&](WeightKind own, TensorRole role, int64_t rows, int64_t cols) {
    add(own, MatrixBytes(requested, base, role, rows, cols));
  };
  add(WeightKind::kNorms, 2 * H * kF32);  // input and post-attention norms
  if (type == io::LayerType::kFullAttention) {
    const int64_t q_rows = c.num_attention_heads * c.head_dim * (c.attn_output_gate ? 2 : 1);
    const int64_t kv_rows = c.num_key_value_heads * c.head_dim;
    matrix(WeightKind::kAttention, TensorRole::kQProj, q_rows + 2 * kv_rows, H);  // [q | k | v]
    matrix(WeightKind::kAttention, TensorRole::kOProj, H, c.num_attention_heads * c.head_dim);
    if (c.attention_bias) {
      add(WeightKind::kAttention, (q_rows + 2 * kv_rows) * kF32);
      if (shard.spec.rank == 0) add(WeightKind::kAttention, H * kF32);  // o_proj's, added once
    }
    if (c.qk_norm) add(WeightKind::kAttention, 2 * c.head_dim * kF32);
  } else {
    const int64_t nv = c.linear_num_value_heads;
    matrix(WeightKind::kGdn, TensorRole::kGdnInProjQkvz,
           2 * c.linear_key_dim() + 2 * c.linear_value_dim(), H);
    matrix(WeightKind::kGdn, TensorRole::kGdnInProjBa, 2 * nv, H);
    matrix(WeightKind::kGdn, TensorRole::kGdnOutProj, H, c.linear_value_dim());
    // conv [Kc][conv channels], dt_bias and -exp(A_log) [nv], the gated norm [dv].
    add(WeightKind::kGdn,
        (c.linear_conv_kernel_dim * c.linear_conv_dim() + 2 * nv + c.linear_value_head_dim) * kF32);
  }
  if (moe) {
    matrix(WeightKind::kExperts, TensorRole::kRouter, c.num_experts, H);
    const int64_t held = shard.experts.count, I = shard.moe.count;
    add(WeightKind::kExperts,
        held * (MatrixBytes(requested, base, TensorRole::kExpertGate, 2 * I, H) +
                MatrixBytes(requested, base, TensorRole::kExpertDown, H, I)));
    if (c.shared_expert_intermediate_size > 0) {
      const int64_t Is = shard.shared.count;
      matrix(WeightKind::kSharedExpert, TensorRole::kSharedExpertGate, 2 * Is, H);
      matrix(WeightKind::kSharedExpert, TensorRole::kSharedExpertDown, H, Is);
      add(WeightKind::kSharedExpert, H * kF32);  // shared_expert_gate [1, H]
    }
  } else {
    matrix(WeightKind::kMlp, TensorRole::kMlpGate, 2 * shard.mlp.count, H);
    matrix(WeightKind::kMlp, TensorRole::kMlpDown, H, shard.mlp.count);
  }
}

int64_t Bytes(const OwnedTensor& t) {
  return t.view().data() != nullptr ? static_cast<int64_t>(t.view().bytes()) : 0;
}
int64_t Bytes(const WeightMatrix& m) {
  int64_t bytes = 0;
  for (const WeightMatrix::Block& b : m.blocks()) bytes += Bytes(b.rows);
  return bytes;
}
int64_t Bytes(const std::vector<float>& v) { return static_cast<int64_t>(v.size()) * kF32; }

void CountLayer(const DecoderLayerWeights& l, const WeightKind* kind, WeightBytes& out) {
  const auto add = [&](WeightKind own, int64_t bytes) { out[kind ? *kind : own] += bytes; };
  add(WeightKind::kNorms, Bytes(l.input_norm) + Bytes(l.post_attention_norm));
  const AttentionWeights& a = l.attention;
  add(WeightKind::kAttention, Bytes(a.qkv) + Bytes(a.qkv_bias) + Bytes(a.o_proj) + Bytes(a.o_bias) +
                                  Bytes(a.q_norm) + Bytes(a.k_norm));
  const GdnWeights& g = l.gdn;
  add(WeightKind::kGdn, Bytes(g.in_proj_qkvz) + Bytes(g.in_proj_ba) + Bytes(g.conv) +
                            Bytes(g.dt_bias) + Bytes(g.neg_exp_a) + Bytes(g.norm) +
                            Bytes(g.out_proj));
  const MoeWeights& m = l.experts;
  add(WeightKind::kExperts, Bytes(m.router));
  for (const SwiGluWeights& e : m.experts) {
    add(WeightKind::kExperts, Bytes(e.gate_up) + Bytes(e.down));
  }
  add(WeightKind::kSharedExpert,
      Bytes(m.shared.gate_up) + Bytes(m.shared.down) + Bytes(m.shared_gate));
  add(WeightKind::kMlp, Bytes(l.mlp.gate_up) + Bytes(l.mlp.down));
}

}  // namespace

std::string_view WeightKindName(WeightKind kind) {
  switch (kind) {
    case WeightKind::kEmbedding:
      return "embedding";
    case WeightKind::kAttention:
      return "attention";
    case WeightKind::kGdn:
      return "gdn";
    case WeightKind::kExperts:
      return "experts";
    case WeightKind::kSharedExpert:
      return "shared expert";
    case WeightKind::kMlp:
      return "mlp";
    case WeightKind::kNorms:
      return "norms";
    case WeightKind::kLmHead:
      return "lm_head";
    case WeightKind::kMtp:
      return "mtp";
  }
  return "?";
}

int64_t WeightBytes::total() const {
  int64_t sum = 0;
  for (int64_t b : bytes) sum += b;
  return sum;
}

WeightBytes& WeightBytes::operator+=(const WeightBytes& other) {
  for (int i = 0; i < kNumWeightKinds; ++i) bytes[i] += other.bytes[i];
  return *this;
}

WeightBytes PlanWeightBytes(const io::ModelConfig& c, const ShardLayout& shard, DType requested,
                            DType base, std::optional<DType> lm_head) {
  WeightBytes out;
  const int64_t H = c.hidden_size;
  out[WeightKind::kEmbedding] =
      MatrixBytes(requested, base, TensorRole::kEmbedding, shard.vocab.count, H);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    PlanLayer(shard, requested, base, c.layer_types[i], c.IsMoeLayer(i), nullptr, out);
  }
  out[WeightKind::kNorms] += H * kF32;  // the final norm
  if (!c.tie_word_embeddings) {
    out[WeightKind::kLmHead] = static_cast<int64_t>(
        TensorBytes(MatrixDType(requested, base, TensorRole::kLmHead, H, lm_head),
                    std::array<int64_t, 2>{shard.vocab.count, H}));
  }
  if (c.num_mtp_layers > 0) {
    const WeightKind mtp = WeightKind::kMtp;
    out[mtp] += MatrixBytes(requested, base, TensorRole::kMtpFc, H, 2 * H) + 3 * H * kF32;
    for (int64_t i = 0; i < c.num_mtp_layers; ++i) {
      PlanLayer(shard, requested, base, io::LayerType::kFullAttention, c.num_experts > 0, &mtp,
                out);
    }
  }
  return out;
}

DType ConfigMatrixDType(const io::ModelConfig& config) {
  return config.torch_dtype == "float32" || config.torch_dtype == "float16" ? DType::kF32
                                                                            : DType::kBF16;
}

double LoadedBytesPerWeight(const CheckpointTensor& t, DType requested, DType base,
                            std::optional<DType> lm_head) {
  if (t.kind != TensorKind::kLinear && t.kind != TensorKind::kEmbedding) return sizeof(float);
  const int64_t cols = t.shape.back();
  return BytesPerWeight(MatrixDType(requested, base, t.role, cols, lm_head), cols);
}

Result<std::map<std::string, double>> StoredBytesPerWeight(
    const io::ModelConfig& config, const io::SafetensorsCheckpoint& checkpoint) {
  ASSIGN_OR_RETURN(std::vector<ResolvedTensor> tensors, ResolveCheckpoint(config, checkpoint));
  std::map<std::string, double> out;
  for (const ResolvedTensor& t : tensors) {
    out[t.spec.name] =
        static_cast<double>(t.stored->bytes.size()) / static_cast<double>(t.stored->numel());
  }
  return out;
}

Result<WeightBytes> StoredWeightBytes(const io::ModelConfig& config, const ShardLayout& shard,
                                      const io::SafetensorsCheckpoint& checkpoint) {
  ASSIGN_OR_RETURN(ModelWeights layout, LayOutWeights(config, shard, checkpoint, std::nullopt));
  return CountWeightBytes(layout);
}

WeightBytes CountWeightBytes(const ModelWeights& w) {
  WeightBytes out;
  out[WeightKind::kEmbedding] = Bytes(w.embedding);
  for (const DecoderLayerWeights& layer : w.layers) CountLayer(layer, nullptr, out);
  out[WeightKind::kNorms] += Bytes(w.final_norm);
  out[WeightKind::kLmHead] = Bytes(w.lm_head);
  const WeightKind mtp = WeightKind::kMtp;
  out[mtp] += Bytes(w.mtp.fc) + Bytes(w.mtp.pre_fc_norm_embedding) +
              Bytes(w.mtp.pre_fc_norm_hidden) + Bytes(w.mtp.norm);
  for (const DecoderLayerWeights& layer : w.mtp.layers) CountLayer(layer, &mtp, out);
  return out;
}

}  // namespace moeserve::model
