// A model's weights in the kernels' layout, built once at load by walking the checkpoint
// (checkpoint_layout.h). Matrices are [out, in] in bf16 or f32 (the --weight-dtype); norms,
// gates and other vectors are f32 with every load-time transform already applied:
//   - (1 + w) RMSNorm weights have the 1 added (docs/spec/model.md §3.a);
//   - q/k/v projections are concatenated into one matrix, expert gate/up into one;
//   - Qwen3-Next's interleaved in_proj_qkvz / in_proj_ba rows are permuted into Qwen3.5's split
//     order [q | k | v | z] / [b | a], so one GDN code path serves both (docs/spec/model.md
// §3.c.1);
//   - the conv weight is transposed to [Kc][conv_dim]; A_log becomes -exp(A_log).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/checkpoint_layout.h"
#include "model/shard.h"
#include "model/weight_matrix.h"

namespace moeserve::model {

struct AttentionWeights {
  // [q_rows + 2 * kv_rows, H]: q_proj rows (per head [query; gate] when gated, docs/spec/model.md
  // §3.d), then k_proj, then v_proj.
  WeightMatrix qkv;
  std::vector<float> qkv_bias;  // [q_rows + 2 * kv_rows], empty without attention_bias
  OwnedTensor o_proj;           // [H, num_heads * head_dim]
  std::vector<float> o_bias;    // [H] or empty
  std::vector<float> q_norm;    // [head_dim] or empty (Llama)
  std::vector<float> k_norm;
};

struct GdnWeights {
  WeightMatrix in_proj_qkvz;  // [2 key_dim + 2 value_dim, H], rows [q | k | v | z]
  WeightMatrix in_proj_ba;    // [2 nv, H], rows [b | a]
  std::vector<float> conv;   // [Kc][conv_dim]: conv[j][c] = conv1d.weight[c, 0, j]
  std::vector<float> dt_bias;   // [nv]
  std::vector<float> neg_exp_a;  // [nv], -exp(A_log)
  std::vector<float> norm;      // [dv], plain weight of the gated RMSNorm
  OwnedTensor out_proj;         // [H, value_dim]
};

// Blocks of rows a SwiGLU block's gate_up has at most: gate and up, as a GGUF file stores them.
inline constexpr int64_t kMaxSwiGluBlocks = 2;

// One SwiGLU block: down(silu(gate x) * up x).
struct SwiGluWeights {
  WeightMatrix gate_up;  // [2 I, H], rows [gate | up]
  OwnedTensor down;      // [H, I]
  int64_t width() const { return gate_up.rows() / 2; }
};

struct MoeWeights {
  OwnedTensor router;                 // [E, H]
  std::vector<SwiGluWeights> experts;  // E; under --ep the ones another rank holds are empty
  SwiGluWeights shared;               // empty without a shared expert
  std::vector<float> shared_gate;     // [H]: sigmoid(x . shared_gate) scales the shared expert
};

struct DecoderLayerWeights {
  io::LayerType type = io::LayerType::kFullAttention;
  bool moe = false;
  std::vector<float> input_norm;           // [H]
  std::vector<float> post_attention_norm;  // [H]
  AttentionWeights attention;              // full-attention layers
  GdnWeights gdn;                          // linear-attention layers
  MoeWeights experts;                      // MoE layers
  SwiGluWeights mlp;                       // dense layers
};

struct MtpWeights {
  OwnedTensor fc;  // [H, 2H] over [norm(embedding) ; norm(hidden)]
  std::vector<float> pre_fc_norm_embedding, pre_fc_norm_hidden, norm;
  std::vector<DecoderLayerWeights> layers;  // full attention + MoE
};

struct ModelWeights {
  DType matrix_dtype = DType::kBF16;  // --weight-dtype: bf16, f32, or packed int8 / int4
  DType base_dtype = DType::kBF16;    // bf16 or f32: matrices a packed format does not hold
  // Every matrix in its checkpoint's own format (a GGUF file's default: GGML blocks, bf16 and f32
  // used in place; f16 widened to f32), rather than matrix_dtype / base_dtype.
  bool stored_formats = false;
  OwnedTensor embedding;  // [V, H] (vocab-parallel ranks: their rows, shard.h)
  std::vector<DecoderLayerWeights> layers;
  std::vector<float> final_norm;  // [H]
  OwnedTensor lm_head;            // [V, H]; empty when tied to the embedding
  MtpWeights mtp;                 // layers empty without an MTP head

  const Tensor& lm_head_matrix() const {
    return lm_head.view().rank() == 2 ? lm_head.view() : embedding.view();
  }
};

// The load's matrix format for reports: the --weight-dtype's name, or "as stored".
std::string WeightFormatName(const ModelWeights& weights);

// The dtype a matrix of `role` with `cols` columns is stored in for --weight-dtype `requested`
// (checkpoint precision `base`, bf16 or f32): `requested` for bf16 / f32; for the packed formats
// int8 / int4 every projection and expert, except the embedding and routers (kept in `base`)
// and lm_head (int8 under int4, w8a8 under w4a8); int4 falls back to `base` where
// cols % kQ4Group != 0, w4a8 where cols % kQ4A8Block != 0. `lm_head` (--lm-head-dtype), when
// set, is lm_head's dtype whatever `requested` is (with the same fallback to `base`).
DType MatrixDType(DType requested, DType base, TensorRole role, int64_t cols,
                  std::optional<DType> lm_head = std::nullopt);
// Bytes a weight of a [*, cols] matrix of `dtype` takes, scales included (int8: 1 + 4 / cols,
// int4: 0.5 + 2 / 32).
double BytesPerWeight(DType dtype, int64_t cols);

// Loads and transforms every tensor `config` implies from `checkpoint`, keeping the part rank
// shard.spec.rank holds (shard.h; the whole model for a single rank, at shard.local's sizes; an
// expert another rank holds under --ep is left empty). matrix_dtype: bf16, f32 or a packed
// format (MatrixDType); nullopt keeps a GGUF file's matrices as stored (stored_formats: the
// tensors the kernels read -- GGML blocks, bf16, f32 -- are views of the file's mapping wherever a
// rank holds whole rows of them, copied as stored where it holds a part of each row or rows in
// another order), and otherwise picks f32 when the checkpoint stores matrices in f32 or f16, else
// bf16. lm_head_dtype: as MatrixDType's lm_head. Errors name the missing, misshapen or
// unusable tensor, and a --tp split that would cut a block of a block format.
//
// It streams: every matrix is allocated once at its stored size and filled row block by row block
// straight from the mapped checkpoint over `pool`'s threads (inline without one), a row at a time
// through an f32 row per thread; the mappings of the checkpoint's pages are let go as their
// tensors are done (io/safetensors_pages.h). So what it holds beside the weights is a few rows
// per thread, and the bytes are the same whatever the threads.
Result<ModelWeights> LoadWeights(const io::ModelConfig& config, const ShardLayout& shard,
                                 const io::SafetensorsCheckpoint& checkpoint,
                                 std::optional<DType> matrix_dtype, ThreadPool* pool = nullptr,
                                 std::optional<DType> lm_head_dtype = std::nullopt);

// What LoadWeights would hold, without copying a matrix: views of the file where the load uses it
// in place, matrices allocated but never written (their pages untouched) where it copies, every
// vector read. For planning a load's bytes (model/weight_bytes.h: StoredWeightBytes).
Result<ModelWeights> LayOutWeights(const io::ModelConfig& config, const ShardLayout& shard,
                                   const io::SafetensorsCheckpoint& checkpoint,
                                   std::optional<DType> matrix_dtype,
                                   std::optional<DType> lm_head_dtype = std::nullopt);

}  // namespace moeserve::model
