// The bytes of a model's weights as LoadWeights holds them (weights.h), by kind: planned from
// config.json alone -- what the memory plan (engine/memory_plan.h) counts before a load -- and
// counted in loaded weights, which check the plan. The plan takes each matrix's dtype from
// MatrixDType, the loader's own rule, and its bytes from TensorBytes, the allocator's.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <optional>
#include <string_view>

#include "core/dtype.h"
#include "core/status.h"
#include "io/model_config.h"
#include "model/checkpoint_layout.h"
#include "model/shard.h"
#include "model/weights.h"

namespace moeserve::model {

enum class WeightKind {
  kEmbedding,     // embed_tokens
  kAttention,     // q/k/v/o projections, their biases, q/k norms
  kGdn,           // Gated DeltaNet: projections, conv, decay and gate parameters, gated norm
  kExperts,       // routers and routed experts
  kSharedExpert,  // shared experts and their gates
  kMlp,           // dense MLPs
  kNorms,         // the decoder layers' input / post-attention norms and the final norm
  kLmHead,        // lm_head (none when tied to the embedding)
  kMtp,           // the MTP head: its fc, norms and layers
};
inline constexpr int kNumWeightKinds = 9;
// "embedding", "attention", "gdn", "experts", "shared expert", "mlp", "norms", "lm_head", "mtp".
std::string_view WeightKindName(WeightKind kind);

struct WeightBytes {
  std::array<int64_t, kNumWeightKinds> bytes{};

  int64_t& operator[](WeightKind kind) { return bytes[static_cast<int>(kind)]; }
  int64_t operator[](WeightKind kind) const { return bytes[static_cast<int>(kind)]; }
  int64_t total() const;
  WeightBytes& operator+=(const WeightBytes& other);
};

// The bytes LoadWeights allocates on rank shard.spec.rank for `config` (the global config) with
// matrices of `requested` (bf16, f32 or a packed format) over a checkpoint whose matrices are
// `base` (bf16 or f32: what a packed format keeps in the checkpoint's precision) and lm_head as
// MatrixDType's `lm_head` (--lm-head-dtype) says.
WeightBytes PlanWeightBytes(const io::ModelConfig& config, const ShardLayout& shard,
                            DType requested, DType base,
                            std::optional<DType> lm_head = std::nullopt);

// The base precision a load picks, from config.json: f32 when torch_dtype says float32 or
// float16, else bf16 -- what LoadWeights picks from the stored dtypes when torch_dtype is true
// to them.
DType ConfigMatrixDType(const io::ModelConfig& config);

// Bytes per element of checkpoint tensor t as a load of `requested` over `base` holds it (the
// matrices as MatrixDType picks, packed ones with their scales; vectors f32), lm_head as `lm_head`
// says: ComputeModelStats's bytes per decoded token of the run a plan or a load describes.
double LoadedBytesPerWeight(const CheckpointTensor& t, DType requested, DType base,
                            std::optional<DType> lm_head = std::nullopt);

// Bytes per element of each tensor of `checkpoint` the walk reads, as stored (by the walk's
// name; a GGUF file's blocks hold their scales): the bytes per token of a checkpoint, and of a
// load that keeps its formats (ModelWeights::stored_formats).
Result<std::map<std::string, double>> StoredBytesPerWeight(
    const io::ModelConfig& config, const io::SafetensorsCheckpoint& checkpoint);

// The bytes a load of rank `shard` that keeps `checkpoint`'s formats (a GGUF file's default:
// weights.h) holds, its views of the file's pages included (they take memory as page cache):
// counted in its layout (LayOutWeights), which copies nothing.
Result<WeightBytes> StoredWeightBytes(const io::ModelConfig& config, const ShardLayout& shard,
                                      const io::SafetensorsCheckpoint& checkpoint);

// The bytes `weights` holds: every matrix's storage and every vector's floats.
WeightBytes CountWeightBytes(const ModelWeights& weights);

}  // namespace moeserve::model
