#include "model/decoder_layer.h"

#include <cstring>
#include <optional>

#include "core/trace.h"
#include "kernels/activations.h"
#include "kernels/norms.h"
#include "model/attention.h"
#include "model/gated_deltanet.h"
#include "model/layer_util.h"
#include "model/mlp.h"

namespace moeserve::model {

void RmsNormRows(const float* x, int64_t T, int64_t n, const std::vector<float>& w, float eps,
                 float* y) {
  for (int64_t t = 0; t < T; ++t) kernels::RmsNorm(x + t * n, w.data(), eps, y + t * n, n);
}

void ReduceAddNorm(const LayerContext& ctx, float* delta, std::string_view delta_name, float* x,
                   const std::vector<float>& norm, int64_t T, float* normed, const MoeResult& how) {
  const int64_t H = ctx.config.hidden_size;
  const float eps = static_cast<float>(ctx.config.rms_norm_eps);
  const bool owned_rows = how.owned_rows;
  if (ctx.options.fused_allreduce_norm && !ctx.tapped()) {
    float* with_shared = how.shared_out != nullptr ? Grow(ctx.scratch.reduced_row, H) : nullptr;
    auto add_and_norm = [&](int64_t t, const float* reduced) {
      if (with_shared != nullptr) {  // --ep: the shared expert after the ranks' sum
        std::memcpy(with_shared, reduced, H * sizeof(float));
        kernels::Axpy(how.shared_gates[t], how.shared_out + t * H, with_shared, H);
        reduced = with_shared;
      }
      kernels::Axpy(1.0f, reduced, x + t * H, H);
      kernels::RmsNorm(x + t * H, norm.data(), eps, normed + t * H, H);
    };
    if (owned_rows) {
      ctx.comm.AllGatherRows(delta, T, H, add_and_norm);
    } else {
      ctx.comm.AllReduceRows(delta, T, H, add_and_norm);
    }
    return;
  }
  if (owned_rows) {
    auto keep = [&](int64_t t, const float* row) {
      if (row != delta + t * H) std::memcpy(delta + t * H, row, H * sizeof(float));
    };
    ctx.comm.AllGatherRows(delta, T, H, keep);
  } else {
    ctx.comm.AllReduceSum(delta, T * H);
    for (int64_t t = 0; how.shared_out != nullptr && t < T; ++t) {
      kernels::Axpy(how.shared_gates[t], how.shared_out + t * H, delta + t * H, H);
    }
  }
  ctx.Tap(delta_name, delta, T, H);
  kernels::Axpy(1.0f, delta, x, T * H);
  RmsNormRows(x, T, H, norm, eps, normed);
}

namespace {

// While alive, ctx's collectives warm what Add names (ctx.warmer; nothing when it is null).
class WarmWhileWaiting {
 public:
  explicit WarmWhileWaiting(const LayerContext& ctx) : ctx_(ctx) {
    if (ctx_.warmer == nullptr) return;
    ctx_.warmer->Clear();
    ctx_.comm.set_idle_work(ctx_.warmer);
  }
  ~WarmWhileWaiting() {
    if (ctx_.warmer != nullptr) ctx_.comm.set_idle_work(nullptr);
  }
  WarmWhileWaiting(const WarmWhileWaiting&) = delete;
  WarmWhileWaiting& operator=(const WarmWhileWaiting&) = delete;

  void Add(const Tensor& W) {
    if (ctx_.warmer != nullptr) ctx_.warmer->Add(W, ctx_.pool.num_threads());
  }
  void Add(const WeightMatrix& W) {
    for (const WeightMatrix::Block& b : W.blocks()) Add(b.rows.view());
  }
  // What a layer's first matmuls read: its mixer's input projections.
  void AddMixer(const DecoderLayerWeights& w) {
    if (w.type == io::LayerType::kLinearAttention) {
      Add(w.gdn.in_proj_qkvz);
      Add(w.gdn.in_proj_ba);
    } else {
      Add(w.attention.qkv);
    }
  }
  // What the feed-forward half reads first: router and shared expert, or the MLP's gate_up.
  void AddFfn(const DecoderLayerWeights& w) {
    if (w.moe) {
      Add(w.experts.router.view());
      Add(w.experts.shared.gate_up);
    } else {
      Add(w.mlp.gate_up);
    }
  }

 private:
  const LayerContext& ctx_;
};

}  // namespace

void DecoderLayer(const LayerContext& ctx, const DecoderLayerWeights& w, const TokenBatch& batch,
                  float* x, float* normed, const std::vector<float>& next_norm, float* next_normed,
                  ModelCache& cache, NextWeights next) {
  const int64_t T = batch.num_tokens, H = ctx.config.hidden_size;
  float* delta = Grow(ctx.scratch.delta, T * H);

  ctx.Tap("input_norm", normed, T, H);
  std::optional<WarmWhileWaiting> warm;
  warm.emplace(ctx);
  warm->AddFfn(w);
  const bool gdn = w.type == io::LayerType::kLinearAttention;
  if (gdn) {
    trace::Scope scope("gated_deltanet", "layer", ctx.layer);
    GatedDeltaNet(ctx, w.gdn, batch, normed, cache, delta);
  } else {
    trace::Scope scope("attention", "layer", ctx.layer);
    Attention(ctx, w.attention, batch, normed, cache.kv(ctx.layer), delta);
  }
  {
    trace::Scope scope("reduce_add_norm", "layer", ctx.layer);
    ReduceAddNorm(ctx, delta, gdn ? "gdn_out" : "attn_out", x, w.post_attention_norm, T, normed);
  }

  ctx.Tap("post_attention_norm", normed, T, H);
  warm.emplace(ctx);
  if (next.layer != nullptr) warm->AddMixer(*next.layer);
  if (next.lm_head != nullptr) warm->Add(*next.lm_head);
  MoeResult ffn;
  if (w.moe) {
    trace::Scope scope("moe", "layer", ctx.layer);
    ffn = SparseMoe(ctx, w.experts, normed, T, delta);
  } else {
    trace::Scope scope("mlp", "layer", ctx.layer);
    SwiGluMlp(ctx, w.mlp, normed, T, delta);
  }
  trace::Scope scope("reduce_add_norm", "layer", ctx.layer);
  ReduceAddNorm(ctx, delta, w.moe ? "moe_out" : "mlp_out", x, next_norm, T, next_normed, ffn);
  ctx.Tap("layer_out", x, T, H);
}

}  // namespace moeserve::model
