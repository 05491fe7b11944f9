// The one walk over a model's checkpoint tensors: every tensor an architecture stores, with its
// Hugging Face name, shape and role. make-model writes what it lists, inspect counts and
// validates it, and the loader, sharding and quantization walk the same list, so the four can
// never disagree about what a checkpoint holds (gemma.cpp's ForEachTensor idea).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "io/model_config.h"
#include "io/safetensors.h"

namespace moeserve::model {

// What a tensor is, as far as initialization and repacking care.
enum class TensorKind {
  kEmbedding,        // [vocab, H]
  kLinear,           // [out, in], or [E, out, in] for fused experts; y = x W^T
  kBias,             // [out]
  kNormOneCentered,  // stored w of a (1 + w) RMSNorm: offsets around 0 (hybrid models)
  kNormPlain,        // stored w of a plain RMSNorm: values around 1
  kConvWeight,       // [conv_dim, 1, Kc] depthwise causal conv of a GDN layer
  kALog,             // [nv] GDN: log of the decay rate A
  kDtBias,           // [nv] GDN: bias inside softplus of the decay gate
};

// How much of a tensor one decoded token reads.
enum class TensorUse {
  kEveryToken,     // all of it: projections, norms, router, shared expert, lm_head
  kEmbeddingRow,   // one row
  kRoutedExperts,  // experts_in_tensor routed experts, of which top-k of num_experts are read
  kMtp,            // read only by the MTP draft head during speculative decoding
};

// Which weight a tensor is, so the loader can switch on it instead of parsing names.
enum class TensorRole {
  kEmbedding, kFinalNorm, kLmHead,
  kInputNorm, kPostAttentionNorm,
  // Full attention.
  kQProj, kKProj, kVProj, kOProj, kQBias, kKBias, kVBias, kOBias, kQNorm, kKNorm,
  // Gated DeltaNet: Qwen3-Next's interleaved projections, or Qwen3.5's split ones.
  kGdnInProjQkvz, kGdnInProjBa, kGdnInProjQkv, kGdnInProjZ, kGdnInProjB, kGdnInProjA,
  kGdnConv, kGdnDtBias, kGdnALog, kGdnNorm, kGdnOutProj,
  // MoE: router, routed experts (per expert, or fused over experts), shared expert.
  kRouter, kExpertGate, kExpertUp, kExpertDown, kExpertsGateUp, kExpertsDown,
  kSharedExpertGate, kSharedExpertUp, kSharedExpertDown, kSharedExpertGateScalar,
  // Dense MLP.
  kMlpGate, kMlpUp, kMlpDown,
  // MTP head (its decoder layers reuse the roles above with mtp = true).
  kMtpFc, kMtpPreFcNormEmbedding, kMtpPreFcNormHidden, kMtpNorm,
};

struct CheckpointTensor {
  std::string name;  // Hugging Face name, e.g. "model.layers.0.linear_attn.in_proj_qkvz.weight"
  std::vector<int64_t> shape;
  TensorKind kind;
  TensorUse use;
  TensorRole role;
  int64_t layer;              // decoder (or MTP) layer index; -1 for model-level tensors
  int64_t expert;             // per-expert tensors: the expert; -1 otherwise
  int64_t experts_in_tensor;  // routed expert tensors: 1 (per-expert) or num_experts (fused)
  bool mtp;                   // part of the MTP head
};

// Prefix of the decoder's tensors: "model.language_model." for
// Qwen3_5MoeForConditionalGeneration, "model." otherwise.
std::string DecoderPrefix(const io::ModelConfig& config);

// Calls visit for every tensor of the checkpoint `config` describes, main model first (embedding,
// layers in order, final norm, lm_head unless tied), then the MTP head's tensors.
void ForEachCheckpointTensor(const io::ModelConfig& config,
                             const std::function<void(const CheckpointTensor&)>& visit);

// A listed tensor and where it is in an opened checkpoint.
struct ResolvedTensor {
  CheckpointTensor spec;
  const io::SafetensorsTensor* stored;
};

// Finds every listed tensor in `checkpoint` and checks its shape. Qwen3.5 tensors are also found
// under the other decoder prefix ("model." <-> "model.language_model."), as text-only re-exports
// use. Tensors the checkpoint holds but the model does not use (a vision tower) are ignored.
// Errors name the missing or misshapen tensor.
Result<std::vector<ResolvedTensor>> ResolveCheckpoint(const io::ModelConfig& config,
                                                      const io::SafetensorsCheckpoint& checkpoint);

// Parameter and byte counts of a model (what `moeserve inspect` prints).
struct ModelStats {
  int64_t params_total = 0;   // main model: what Hugging Face loads (MTP head excluded)
  int64_t params_mtp = 0;     // the MTP head's own tensors
  int64_t params_active = 0;  // per token: params_total minus the routed experts not chosen
                              // (top-k of num_experts), embedding and lm_head counted whole, as
                              // Qwen's "A3B" counts
  int64_t bytes_per_token = 0;  // weight bytes one decoded token reads: one embedding row, every
                                // projection and norm, router, shared expert, top-k routed
                                // experts, lm_head (the whole embedding table when tied);
                                // the MTP head excluded
};

// element_size(tensor) = bytes per element as stored (fractional for packed formats, whose
// scales add to their bytes).
ModelStats ComputeModelStats(const io::ModelConfig& config,
                             const std::function<double(const CheckpointTensor&)>& element_size);

}  // namespace moeserve::model
