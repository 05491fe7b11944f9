// The layers of the hybrid MoE decoder as free functions over [T, H] activations of one
// sequence's T new tokens (row-major, f32). Each reads like its paper / spec section; the
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
#include "model/weights.h"
#include "parallel/communicator.h"

namespace moeserve::model {

// Debug tap: called with named intermediates (name, layer, data [rows, cols]) when set.
using ActivationTap = std::function<void(std::string_view name, int64_t layer, const float* data,
                                         int64_t rows, int64_t cols)>;

// Reusable scratch memory of the layers: grows to the largest call, then allocates nothing.
struct Scratch {
  std::vector<float> normed, delta;  // decoder layer: norm(x), sub-layer output
  std::vector<float> proj, gates, core, heads, gate, attn;
  std::vector<float> router, expert_in, expert_mid, expert_out, shared_mid, shared_out;
  std::vector<int32_t> topk_ids;
  std::vector<float> topk_weights;
  std::vector<std::vector<int32_t>> expert_tokens;
  std::vector<float> rope_cos, rope_sin;
};

// What every layer call needs besides its weights.
struct LayerContext {
  const io::ModelConfig& config;
  ThreadPool& pool;
  parallel::Communicator& comm;
  Scratch& scratch;
  const ActivationTap* tap = nullptr;  // may be null
  int64_t layer = 0;                   // for the tap

  void Tap(std::string_view name, const float* data, int64_t rows, int64_t cols) const {
    if (tap != nullptr && *tap) (*tap)(name, layer, data, rows, cols);
  }
};

// y[t] = RMSNorm(x[t]) * w for T rows of n (w already holds the 1 of a (1 + w) norm).
void RmsNormRows(const float* x, int64_t T, int64_t n, const std::vector<float>& w, float eps,
                 float* y);

// Gated DeltaNet (spec §3.c) over x [T, H] (already input-normed) for tokens at positions
// first_pos .., continuing from conv_state [Kc-1][conv_dim] and S [nv][dk][dv] (updated).
// out: [T, H].
void GatedDeltaNet(const LayerContext& ctx, const GdnWeights& w, const float* x, int64_t T,
                   int64_t first_pos, float* conv_state, float* S, float* out);

// Full attention (spec §3.d; with the output gate when config.attn_output_gate, q/k norm when
// present, partial NeoX RoPE) over x [T, H]; appends this call's K/V at positions
// first_pos .. first_pos + T - 1 to `cache` through `block_table`. out: [T, H].
void Attention(const LayerContext& ctx, const AttentionWeights& w, const float* x, int64_t T,
               int64_t first_pos, const kernels::PagedKvCache& cache, const int32_t* block_table,
               float* out);

// Sparse MoE (spec §3.e): f32 softmax router, top-k, renormalization, SwiGLU experts summed per
// token in ascending expert order, plus the shared expert x sigmoid(shared_expert_gate).
// out: [T, H].
void SparseMoe(const LayerContext& ctx, const MoeWeights& w, const float* x, int64_t T,
               float* out);

// Dense SwiGLU MLP: out = down(silu(gate x) * up x). out: [T, H].
void SwiGluMlp(const LayerContext& ctx, const SwiGluWeights& w, const float* x, int64_t T,
               float* out);

// One pre-norm decoder layer over the residual stream x [T, H] (updated in place):
// x += mixer(norm(x)); x += ffn(norm(x)). kv / block_table for attention layers, conv_state / S
// for GDN layers.
void DecoderLayer(const LayerContext& ctx, const DecoderLayerWeights& w, float* x, int64_t T,
                  int64_t first_pos, const kernels::PagedKvCache* kv, const int32_t* block_table,
                  float* conv_state, float* S);

}  // namespace moeserve::model
