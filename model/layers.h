// The layers of the hybrid MoE decoder as free functions over [T, H] activations of a flat batch
// of T new tokens from one or many sequences (row-major, f32; model/cache.h's TokenBatch). Each
// reads like its paper / spec section; the kernels do the arithmetic. Under tensor / expert
// parallelism (shard.h) each rank's sub-layer output is its part of a sum over the ranks;
// DecoderLayer reduces it (ReduceAddNorm).
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
#include "model/weight_warmer.h"
#include "model/weights.h"
#include "parallel/communicator.h"

namespace moeserve::model {

// Debug tap: called with named intermediates (name, layer, data [rows, cols]) when set.
using ActivationTap = std::function<void(std::string_view name, int64_t layer, const float* data,
                                         int64_t rows, int64_t cols)>;

// Scratch memory of the layers, planned up front by Reserve for the largest token batch so that
// a forward call allocates nothing (docs/design.md principle 3); a larger batch grows it.
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
  // --ep's all-to-all: counts and offsets [4, ranks], the parts received, their sum.
  std::vector<int64_t> exchange_counts;
  std::vector<float> exchange_in, exchange_acc;
  std::vector<float> shared_gates, reduced_row;  // --ep: [T] shared-expert gates; [H]
  std::vector<float> rope_cos, rope_sin;

  void Reserve(const io::ModelConfig& config, int64_t max_tokens);
};

// The case study's optimizations of the forward that can be switched off (--no-...), to
// measure each; results are equal either way.
struct ForwardOptions {
  // After o_proj / out_proj / down_proj: the ranks' all-reduce, the residual add and the next
  // RMSNorm in one pass over each row as it is reduced (else three passes).
  bool fused_allreduce_norm = true;
  // The shared expert runs in the same joins as the first routed experts (and under --ep's
  // all-to-all, while the exchange is in flight), not after them.
  bool shared_expert_overlap = true;
  // --ep, steps of up to mc2_max_tokens tokens: the MoE's combine as an all-to-all to the
  // tokens' owners, then a gather of their rows (else one all-reduce of every rank's partial
  // sums: all-gather dispatch). mc2: that all-to-all pipelined (MC2), else blocking.
  int64_t mc2_max_tokens = 0;
  bool mc2 = true;
  // A GDN layer's decode tokens (one new token, not a verify run) take one fused task per
  // (sequence, key head): conv + SiLU of its channels, l2norms, gates, its value heads' delta-rule
  // steps and gated RMSNorms, while they sit in that core's cache -- instead of layer-wide passes
  // (conv, norms and gated norm on one thread, then the delta rule in parallel).
  bool fused_gdn_step = true;
  // Case study #12: with more than one rank, each collective's wait warms the weights read
  // after it (model/weight_warmer.h).
  bool warm_next_weights = true;
};

// What SparseMoe leaves in `out`: by default this rank's part of every row (the ranks' outputs
// sum to the layer's).
struct MoeResult {
  bool owned_rows = false;  // instead the finished rows of the tokens this rank owns (--ep)
  // --ep's all-gather path: each row, once summed, takes + shared_gates[t] * shared_out[t]
  // ([T] and [T, H]); null otherwise.
  const float* shared_out = nullptr;
  const float* shared_gates = nullptr;
};

// What every layer call needs besides its weights.
struct LayerContext {
  const io::ModelConfig& config;
  ThreadPool& pool;
  parallel::Communicator& comm;
  Scratch& scratch;
  const ActivationTap* tap = nullptr;  // may be null
  int64_t layer = 0;  // decoder layer index (MTP layer i: num_hidden_layers + i): cache and tap
  ForwardOptions options = {};
  bool expert_parallel = false;  // --ep: ranks hold whole experts (shard.h)
  // What this rank's collective waits warm (null: nothing; one rank has no waits).
  WeightWarmer* warmer = nullptr;

  bool tapped() const { return tap != nullptr && *tap; }
  void Tap(std::string_view name, const float* data, int64_t rows, int64_t cols) const {
    if (tapped()) (*tap)(name, layer, data, rows, cols);
  }
};

// y[t] = RMSNorm(x[t]) * w for T rows of n (w already holds the 1 of a (1 + w) norm).
void RmsNormRows(const float* x, int64_t T, int64_t n, const std::vector<float>& w, float eps,
                 float* y);

// Gated DeltaNet (docs/spec/model.md §3.c) over x [T, H] (already input-normed) of the batch's
// tokens; each sequence continues from its state slot in `cache` (layer ctx.layer): conv window and
// S, updated. Decode tokens take the recurrent step, prefill chunks the chunked form. out: [T, H],
// this rank's part (as for every sub-layer below: the ranks' outputs sum to the layer's).
void GatedDeltaNet(const LayerContext& ctx, const GdnWeights& w, const TokenBatch& batch,
                   const float* x, ModelCache& cache, float* out);

// Full attention (docs/spec/model.md §3.d; with the output gate when config.attn_output_gate, q/k
// norm when present, partial NeoX RoPE) over x [T, H]; writes the batch's K/V at their positions
// into `kv` through each sequence's block table, then attends. out: [T, H].
void Attention(const LayerContext& ctx, const AttentionWeights& w, const TokenBatch& batch,
               const float* x, const kernels::PagedKvCache& kv, float* out);

// Sparse MoE (docs/spec/model.md §3.e): f32 softmax router, top-k, renormalization, SwiGLU experts
// summed per token in ascending expert order, plus the shared expert x sigmoid(shared_expert_gate).
// out: [T, H], as the return value says (see ForwardOptions for --ep's paths; every path gives a
// token the same bits).
MoeResult SparseMoe(const LayerContext& ctx, const MoeWeights& w, const float* x, int64_t T,
                    float* out);

// Dense SwiGLU MLP: out = down(silu(gate x) * up x). out: [T, H].
void SwiGluMlp(const LayerContext& ctx, const SwiGluWeights& w, const float* x, int64_t T,
               float* out);

// x [T, H] += the sum over ranks of delta; normed = RmsNorm(x) * norm. Fused
// (ctx.options.fused_allreduce_norm, no tap set): each row is added and normed as the
// communicator reduces it (Communicator::AllReduceRows), delta's reduced values never written;
// else all-reduce, add, norm as three passes (and the tap sees delta as delta_name). The same
// bits either way.
// `how`: delta as SparseMoe left it (its owned rows are gathered instead of summed, its shared
// expert added after the sum).
void ReduceAddNorm(const LayerContext& ctx, float* delta, std::string_view delta_name, float* x,
                   const std::vector<float>& norm, int64_t T, float* normed,
                   const MoeResult& how = {});

// One pre-norm decoder layer over the residual stream x [T, H] (updated in place):
// x += mixer(norm(x)); x += ffn(norm(x)). On entry `normed` holds input_norm(x); the layer ends
// with next_normed = next_norm(x) -- the next layer's input norm, or the final norm -- computed
// with its last reduction (ReduceAddNorm). next_normed may be `normed`. The mixer's cache is
// layer ctx.layer of `cache`. `next` is what the forward reads after this layer: the next
// layer's weights, or (after the last) lm_head; either may be null (ctx.warmer warms them).
struct NextWeights {
  const DecoderLayerWeights* layer = nullptr;
  const Tensor* lm_head = nullptr;
};
void DecoderLayer(const LayerContext& ctx, const DecoderLayerWeights& w, const TokenBatch& batch,
                  float* x, float* normed, const std::vector<float>& next_norm, float* next_normed,
                  ModelCache& cache, NextWeights next = {});

}  // namespace moeserve::model
