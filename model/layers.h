// The layers of the hybrid MoE decoder as free functions over [T, H] activations of a flat batch
// of T new tokens from one or many sequences (row-major, f32; model/cache.h's TokenBatch). Each reads like its paper / spec section; the
// kernels do the arithmetic, the Communicator marks where tensor / expert parallel ranks will
// reduce.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "core/thread_pool.h"
#include "io/model_config.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "model/cache.h"
#include "model/weights.h"
#include "parallel/communicator.h"

namespace moeserve::model {

// Debug tap: called with named intermediates (name, layer, data [rows, cols]) when set.
using ActivationTap = std::function<void(std::string_view name, int64_t layer, const float* data,
                                         int64_t rows, int64_t cols)>;

// Scratch memory of the layers, planned up front by Reserve for the largest token batch so that
// a forward call allocates nothing (DESIGN.md principle 3); a larger batch grows it.
struct Scratch {
  std::vector<float> normed, delta;  // decoder layer: norm(x), sub-layer output
  std::vector<float> proj, gates, core, heads, gate, attn;
  std::vector<float> router, expert_in, expert_mid, expert_out, shared_mid, shared_out;
  std::vector<int32_t> topk_ids;
  std::vector<float> topk_weights;
  // The batch's (token, choice) pairs grouped by expert: pairs of expert e are
  // expert_pairs[expert_offsets[e] .. expert_offsets[e + 1]), in token order.
  std::vector<int32_t> expert_offsets, expert_pairs;
  std::vector<kernels::MatMulJob> moe_jobs;
  std::vector<float> rope_cos, rope_sin;

  void Reserve(const io::ModelConfig& config, int64_t max_tokens);
};

// What every layer call needs besides its weights.
struct LayerContext {
  const io::ModelConfig& config;
  ThreadPool& pool;
  parallel::Communicator& comm;
  Scratch& scratch;
  const ActivationTap* tap = nullptr;  // may be null
  int64_t layer = 0;  // decoder layer index (MTP layer i: num_hidden_layers + i): cache and tap

  void Tap(std::string_view name, const float* data, int64_t rows, int64_t cols) const {
    if (tap != nullptr && *tap) (*tap)(name, layer, data, rows, cols);
  }
};

// y[t] = RMSNorm(x[t]) * w for T rows of n (w already holds the 1 of a (1 + w) norm).
void RmsNormRows(const float* x, int64_t T, int64_t n, const std::vector<float>& w, float eps,
                 float* y);

// Gated DeltaNet (spec §3.c) over x [T, H] (already input-normed) of the batch's tokens; each
// sequence continues from its state slot in `cache` (layer ctx.layer): conv window and S,
// updated. Decode tokens take the recurrent step, prefill chunks the chunked form. out: [T, H].
void GatedDeltaNet(const LayerContext& ctx, const GdnWeights& w, const TokenBatch& batch,
                   const float* x, ModelCache& cache, float* out);

// Full attention (spec §3.d; with the output gate when config.attn_output_gate, q/k norm when
// present, partial NeoX RoPE) over x [T, H]; writes the batch's K/V at their positions into
// `kv` through each sequence's block table, then attends. out: [T, H].
void Attention(const LayerContext& ctx, const AttentionWeights& w, const TokenBatch& batch,
               const float* x, const kernels::PagedKvCache& kv, float* out);

// Sparse MoE (spec §3.e): f32 softmax router, top-k, renormalization, SwiGLU experts summed per
// token in ascending expert order, plus the shared expert x sigmoid(shared_expert_gate).
// out: [T, H].
void SparseMoe(const LayerContext& ctx, const MoeWeights& w, const float* x, int64_t T,
               float* out);

// Dense SwiGLU MLP: out = down(silu(gate x) * up x). out: [T, H].
void SwiGluMlp(const LayerContext& ctx, const SwiGluWeights& w, const float* x, int64_t T,
               float* out);

// One pre-norm decoder layer over the residual stream x [T, H] (updated in place):
// x += mixer(norm(x)); x += ffn(norm(x)). The mixer's cache is layer ctx.layer of `cache`.
void DecoderLayer(const LayerContext& ctx, const DecoderLayerWeights& w, const TokenBatch& batch,
                  float* x, ModelCache& cache);

}  // namespace moeserve::model
