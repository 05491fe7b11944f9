// What every layer of the hybrid MoE decoder shares: the layers are free functions over [T, H]
// activations of a flat batch of T new tokens from one or many sequences (row-major, f32;
// model/cache.h's TokenBatch), one file each -- gated_deltanet.h, attention.h, moe.h, mlp.h --
// composed by decoder_layer.h. Each reads like its paper / spec section; the kernels do the
// arithmetic. Under tensor / expert parallelism (shard.h) each rank's sub-layer output is its
// part of a sum over the ranks; DecoderLayer reduces it (ReduceAddNorm).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "core/thread_pool.h"
#include "io/model_config.h"
#include "kernels/matmul.h"
#include "model/weight_matrix.h"
#include "model/weight_warmer.h"
#include "parallel/communicator.h"

namespace moeserve::model {

// Debug tap: called with named intermediates (name, layer, data [rows, cols]) when set.
using ActivationTap = std::function<void(std::string_view name, int64_t layer, const float* data,
                                         int64_t rows, int64_t cols)>;

// (token, expert) rows of routed-expert work the MoE scratch holds at once (SparseMoe runs the
// experts in groups of up to this many rows).
constexpr int64_t kMoeGroupRows = 1024;

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
  // The bytes Reserve(config, max_tokens) allocates in an empty Scratch (the memory plan's).
  static int64_t ReserveBytes(const io::ModelConfig& config, int64_t max_tokens);
  // The bytes of the buffers Reserve plans, as they are now.
  int64_t bytes() const;
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
  // How matmuls against GGML block-format weights (a GGUF file's, in place) take their
  // activations (kernels/matmul.h); other formats' activations are as their dtype says.
  kernels::GgmlActivations ggml_activations = kernels::GgmlActivations::kInt8;

  bool tapped() const { return tap != nullptr && *tap; }
  void Tap(std::string_view name, const float* data, int64_t rows, int64_t cols) const {
    if (tapped()) (*tap)(name, layer, data, rows, cols);
  }
};

// ggml_activations for a matmul against W when W is in a GGML block format, else kF32 (what every
// other format takes).
kernels::GgmlActivations ActivationsFor(const Tensor& W, kernels::GgmlActivations ggml_activations);

// y[M, N] = x W^T on ctx's pool, with ctx's activations for GGML blocks (kernels::MatMul).
void MatMul(const LayerContext& ctx, const float* x, int64_t x_stride, int64_t M, const Tensor& W,
            float* y, int64_t y_stride);
// The same for a matrix of blocks of rows: each block's outputs into its columns of y, all in one
// join (kernels::MatMulGroup).
void MatMul(const LayerContext& ctx, const float* x, int64_t x_stride, int64_t M,
            const WeightMatrix& W, float* y, int64_t y_stride);
// Appends the jobs of x W^T for W's blocks to jobs from *num_jobs on (a CHECK fails when jobs has
// no room), for a MatMulGroup that runs them with other products.
void AddMatMulJobs(const LayerContext& ctx, const float* x, int64_t x_stride, int64_t M,
                   const WeightMatrix& W, float* y, int64_t y_stride,
                   std::span<kernels::MatMulJob> jobs, int64_t* num_jobs);

}  // namespace moeserve::model
