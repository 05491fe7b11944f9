#include "model/checkpoint_layout.h"

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace moeserve::model {
namespace {

// SwiGlu() derives the up and down roles from the gate role.
static_assert(static_cast<int>(TensorRole::kExpertDown) == static_cast<int>(TensorRole::kExpertGate) + 2);
static_assert(static_cast<int>(TensorRole::kSharedExpertDown) ==
              static_cast<int>(TensorRole::kSharedExpertGate) + 2);
static_assert(static_cast<int>(TensorRole::kMlpDown) == static_cast<int>(TensorRole::kMlpGate) + 2);

using io::Architecture;
using io::LayerType;
using io::ModelConfig;

// Emits the tensors of one model; `prefix` is where the current block's names start.
class Walker {
 public:
  Walker(const ModelConfig& c, const std::function<void(const CheckpointTensor&)>& visit)
      : c_(c), visit_(visit) {}

  void Emit(const std::string& name, std::vector<int64_t> shape, TensorKind kind, TensorRole role,
            TensorUse use = TensorUse::kEveryToken, int64_t experts_in_tensor = 0) {
    visit_(CheckpointTensor{name, std::move(shape), kind, mtp_ ? TensorUse::kMtp : use, role,
                            layer_, expert_, experts_in_tensor, mtp_});
  }

  TensorKind NormKind() const {
    // A GGUF file stores a (1 + w) norm with the 1 added: plain, as far as the load is concerned.
    return c_.one_centered_norm && !c_.gguf.norms_with_one ? TensorKind::kNormOneCentered
                                                            : TensorKind::kNormPlain;
  }

  // One decoder layer: norms, attention or GDN, MLP or MoE. p ends with '.'.
  void DecoderLayer(const std::string& p, LayerType type, bool moe) {
    const int64_t H = c_.hidden_size;
    Emit(p + "input_layernorm.weight", {H}, NormKind(), TensorRole::kInputNorm);
    if (type == LayerType::kLinearAttention) {
      GatedDeltaNet(p + "linear_attn.");
    } else {
      Attention(p + "self_attn.");
    }
    Emit(p + "post_attention_layernorm.weight", {H}, NormKind(), TensorRole::kPostAttentionNorm);
    if (moe) {
      Moe(p + "mlp.");
    } else {
      SwiGlu(p + "mlp.", c_.intermediate_size, TensorUse::kEveryToken, TensorRole::kMlpGate);
    }
  }

  void Attention(const std::string& p) {
    const int64_t H = c_.hidden_size, hd = c_.head_dim;
    const int64_t q_rows = c_.num_attention_heads * hd * (c_.attn_output_gate ? 2 : 1);
    const int64_t kv_rows = c_.num_key_value_heads * hd;
    const int64_t o_cols = c_.num_attention_heads * hd;
    Emit(p + "q_proj.weight", {q_rows, H}, TensorKind::kLinear, TensorRole::kQProj);
    Emit(p + "k_proj.weight", {kv_rows, H}, TensorKind::kLinear, TensorRole::kKProj);
    Emit(p + "v_proj.weight", {kv_rows, H}, TensorKind::kLinear, TensorRole::kVProj);
    Emit(p + "o_proj.weight", {H, o_cols}, TensorKind::kLinear, TensorRole::kOProj);
    if (c_.attention_bias) {
      Emit(p + "q_proj.bias", {q_rows}, TensorKind::kBias, TensorRole::kQBias);
      Emit(p + "k_proj.bias", {kv_rows}, TensorKind::kBias, TensorRole::kKBias);
      Emit(p + "v_proj.bias", {kv_rows}, TensorKind::kBias, TensorRole::kVBias);
      Emit(p + "o_proj.bias", {H}, TensorKind::kBias, TensorRole::kOBias);
    }
    if (c_.qk_norm) {
      // Per-head norms over head_dim; (1 + w) in the hybrid models, plain w in Qwen3.
      Emit(p + "q_norm.weight", {hd}, NormKind(), TensorRole::kQNorm);
      Emit(p + "k_norm.weight", {hd}, NormKind(), TensorRole::kKNorm);
    }
  }

  // docs/spec/model.md §2.1 / §2.3: Qwen3-Next stores in_proj_qkvz / in_proj_ba interleaved per
  // key-head group; Qwen3.5 stores the four projections split.
  void GatedDeltaNet(const std::string& p) {
    const int64_t H = c_.hidden_size, nv = c_.linear_num_value_heads;
    const int64_t key_dim = c_.linear_key_dim(), value_dim = c_.linear_value_dim();
    if (c_.architecture == Architecture::kQwen3Next) {
      if (c_.gguf.gdn_qkv_z_split) {  // a GGUF file's attn_qkv and attn_gate
        Emit(p + "in_proj_qkv.weight", {2 * key_dim + value_dim, H}, TensorKind::kLinear,
             TensorRole::kGdnInProjQkv);
        Emit(p + "in_proj_z.weight", {value_dim, H}, TensorKind::kLinear,
             TensorRole::kGdnInProjZ);
      } else {
        Emit(p + "in_proj_qkvz.weight", {2 * key_dim + 2 * value_dim, H}, TensorKind::kLinear,
             TensorRole::kGdnInProjQkvz);
      }
      Emit(p + "in_proj_ba.weight", {2 * nv, H}, TensorKind::kLinear, TensorRole::kGdnInProjBa);
    } else {
      Emit(p + "in_proj_qkv.weight", {2 * key_dim + value_dim, H}, TensorKind::kLinear,
           TensorRole::kGdnInProjQkv);
      Emit(p + "in_proj_z.weight", {value_dim, H}, TensorKind::kLinear, TensorRole::kGdnInProjZ);
      Emit(p + "in_proj_b.weight", {nv, H}, TensorKind::kLinear, TensorRole::kGdnInProjB);
      Emit(p + "in_proj_a.weight", {nv, H}, TensorKind::kLinear, TensorRole::kGdnInProjA);
    }
    Emit(p + "conv1d.weight", {c_.linear_conv_dim(), 1, c_.linear_conv_kernel_dim},
         TensorKind::kConvWeight, TensorRole::kGdnConv);
    Emit(p + "dt_bias", {nv}, TensorKind::kDtBias, TensorRole::kGdnDtBias);
    Emit(p + "A_log", {nv}, TensorKind::kALog, TensorRole::kGdnALog);
    Emit(p + "norm.weight", {c_.linear_value_head_dim}, TensorKind::kNormPlain, TensorRole::kGdnNorm);
    Emit(p + "out_proj.weight", {H, value_dim}, TensorKind::kLinear, TensorRole::kGdnOutProj);
  }

  // gate_proj, up_proj, down_proj; `gate_role` is the gate's role, up and down follow it in
  // TensorRole's order (kExpertGate, kExpertUp, kExpertDown / kSharedExpert... / kMlp...).
  void SwiGlu(const std::string& p, int64_t width, TensorUse use, TensorRole gate_role,
              int64_t experts = 0) {
    const int64_t H = c_.hidden_size;
    const auto role = [gate_role](int offset) {
      return static_cast<TensorRole>(static_cast<int>(gate_role) + offset);
    };
    Emit(p + "gate_proj.weight", {width, H}, TensorKind::kLinear, role(0), use, experts);
    Emit(p + "up_proj.weight", {width, H}, TensorKind::kLinear, role(1), use, experts);
    Emit(p + "down_proj.weight", {H, width}, TensorKind::kLinear, role(2), use, experts);
  }

  void Moe(const std::string& p) {
    const int64_t H = c_.hidden_size, E = c_.num_experts, I = c_.moe_intermediate_size;
    Emit(p + "gate.weight", {E, H}, TensorKind::kLinear, TensorRole::kRouter);
    if (c_.architecture == Architecture::kQwen3_5Moe && !c_.gguf.experts_split) {
      // Fused: gate_up_proj rows [0, I) = gate, [I, 2I) = up (docs/spec/model.md §2.3). A GGUF
      // file's ffn_{gate,up,down}_exps are walked per expert below (gguf.experts_split).
      Emit(p + "experts.gate_up_proj", {E, 2 * I, H}, TensorKind::kLinear,
           TensorRole::kExpertsGateUp, TensorUse::kRoutedExperts, E);
      Emit(p + "experts.down_proj", {E, H, I}, TensorKind::kLinear, TensorRole::kExpertsDown,
           TensorUse::kRoutedExperts, E);
    } else {
      for (int64_t e = 0; e < E; ++e) {
        expert_ = e;
        SwiGlu(fmt::format("{}experts.{}.", p, e), I, TensorUse::kRoutedExperts,
               TensorRole::kExpertGate, 1);
      }
      expert_ = -1;
    }
    if (c_.shared_expert_intermediate_size > 0) {
      SwiGlu(p + "shared_expert.", c_.shared_expert_intermediate_size, TensorUse::kEveryToken,
             TensorRole::kSharedExpertGate);
      Emit(p + "shared_expert_gate.weight", {1, H}, TensorKind::kLinear,
           TensorRole::kSharedExpertGateScalar);
    }
  }

  void Model() {
    const int64_t H = c_.hidden_size, V = c_.vocab_size;
    const std::string p = DecoderPrefix(c_);
    Emit(p + "embed_tokens.weight", {V, H}, TensorKind::kEmbedding, TensorRole::kEmbedding,
         TensorUse::kEmbeddingRow);
    for (int64_t i = 0; i < c_.num_hidden_layers; ++i) {
      layer_ = i;
      DecoderLayer(fmt::format("{}layers.{}.", p, i), c_.layer_types[i], c_.IsMoeLayer(i));
    }
    layer_ = -1;
    Emit(p + "norm.weight", {H}, NormKind(), TensorRole::kFinalNorm);
    if (!c_.tie_word_embeddings) {
      Emit("lm_head.weight", {V, H}, TensorKind::kLinear, TensorRole::kLmHead);
    }

    // MTP head (docs/spec/model.md §2.2): fc over [norm(embedding); norm(hidden)], full-attention
    // MoE layers, final norm; embedding and lm_head are the main model's.
    if (c_.num_mtp_layers == 0) return;
    mtp_ = true;
    Emit("mtp.fc.weight", {H, 2 * H}, TensorKind::kLinear, TensorRole::kMtpFc);
    Emit("mtp.pre_fc_norm_embedding.weight", {H}, NormKind(), TensorRole::kMtpPreFcNormEmbedding);
    Emit("mtp.pre_fc_norm_hidden.weight", {H}, NormKind(), TensorRole::kMtpPreFcNormHidden);
    for (int64_t i = 0; i < c_.num_mtp_layers; ++i) {
      layer_ = i;
      DecoderLayer(fmt::format("mtp.layers.{}.", i), LayerType::kFullAttention,
                   c_.num_experts > 0);
    }
    layer_ = -1;
    Emit("mtp.norm.weight", {H}, NormKind(), TensorRole::kMtpNorm);
    mtp_ = false;
  }

 private:
  const ModelConfig& c_;
  const std::function<void(const CheckpointTensor&)>& visit_;
  int64_t layer_ = -1;
  int64_t expert_ = -1;
  bool mtp_ = false;
};

constexpr char kModelPrefix[] = "model.";
constexpr char kLanguageModelPrefix[] = "model.language_model.";

}  // namespace

std::string DecoderPrefix(const ModelConfig& config) {
  return config.architecture_name == "Qwen3_5MoeForConditionalGeneration" ? kLanguageModelPrefix
                                                                           : kModelPrefix;
}

void ForEachCheckpointTensor(const ModelConfig& config,
                             const std::function<void(const CheckpointTensor&)>& visit) {
  Walker(config, visit).Model();
}

Result<std::vector<ResolvedTensor>> ResolveCheckpoint(const ModelConfig& config,
                                                      const io::SafetensorsCheckpoint& checkpoint) {
  std::vector<ResolvedTensor> resolved;
  Status status;
  ForEachCheckpointTensor(config, [&](const CheckpointTensor& spec) {
    if (!status.ok()) return;
    const io::SafetensorsTensor* stored = checkpoint.Find(spec.name);
    if (stored == nullptr && config.architecture == Architecture::kQwen3_5Moe) {
      // Text-only re-exports of Qwen3.5 drop "language_model." (docs/spec/model.md §2.3), and the
      // reverse.
      const std::string& n = spec.name;
      std::string other;
      if (n.starts_with(kLanguageModelPrefix)) {
        other = kModelPrefix + n.substr(sizeof(kLanguageModelPrefix) - 1);
      } else if (n.starts_with(kModelPrefix)) {
        other = kLanguageModelPrefix + n.substr(sizeof(kModelPrefix) - 1);
      }
      if (!other.empty()) stored = checkpoint.Find(other);
    }
    if (stored == nullptr) {
      status = NotFound("the checkpoint has no tensor '{}' (shape [{}]), which {} needs",
                        spec.name, fmt::join(spec.shape, ", "), config.architecture_name);
      return;
    }
    if (stored->shape != spec.shape) {
      status = InvalidArgument("tensor '{}' in {} has shape [{}], but config.json implies [{}]",
                               spec.name, stored->file, fmt::join(stored->shape, ", "),
                               fmt::join(spec.shape, ", "));
      return;
    }
    resolved.push_back(ResolvedTensor{spec, stored});
  });
  if (!status.ok()) return status;
  return resolved;
}

ModelStats ComputeModelStats(const ModelConfig& config,
                             const std::function<double(const CheckpointTensor&)>& element_size) {
  ModelStats s;
  int64_t routed_params = 0, routed_bytes = 0;
  ForEachCheckpointTensor(config, [&](const CheckpointTensor& t) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    const int64_t bytes = std::llround(static_cast<double>(numel) * element_size(t));
    switch (t.use) {
      case TensorUse::kMtp:
        s.params_mtp += numel;
        return;
      case TensorUse::kEveryToken:
        s.params_total += numel;
        s.params_active += numel;
        s.bytes_per_token += bytes;
        return;
      case TensorUse::kEmbeddingRow:
        // One row per token, unless the table is also the lm_head, which reads all of it.
        s.params_total += numel;
        s.params_active += numel;
        s.bytes_per_token += config.tie_word_embeddings ? bytes : bytes / t.shape[0];
        return;
      case TensorUse::kRoutedExperts:
        s.params_total += numel;
        routed_params += numel;
        routed_bytes += bytes;
        return;
    }
  });
  // Every MoE layer holds num_experts equal experts; a token reads top-k of them. Summed over
  // all layers first so that the division is exact.
  if (config.num_experts > 0) {
    s.params_active += routed_params / config.num_experts * config.num_experts_per_tok;
    s.bytes_per_token += routed_bytes / config.num_experts * config.num_experts_per_tok;
  }
  return s;
}

}  // namespace moeserve::model
