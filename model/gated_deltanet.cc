#include "model/gated_deltanet.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "core/trace.h"
#include "kernels/activations.h"
#include "kernels/causal_conv1d.h"
#include "kernels/gated_delta_rule.h"
#include "kernels/matmul.h"
#include "kernels/norms.h"
#include "model/layer_util.h"

namespace moeserve::model {
namespace {

constexpr float kL2NormEps = 1e-6f;  // FLA / HF l2norm: x * rsqrt(sum(x^2) + 1e-6)

// torch.nn.functional.softplus with its default threshold of 20.
float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace

void GatedDeltaNet(const LayerContext& ctx, const GdnWeights& w, const TokenBatch& batch,
                   const float* x, ModelCache& cache, float* out) {
  const io::ModelConfig& c = ctx.config;
  Scratch& s = ctx.scratch;
  const int64_t T = batch.num_tokens;
  const int64_t H = c.hidden_size, nk = c.linear_num_key_heads, nv = c.linear_num_value_heads;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim, r = nv / nk;
  const int64_t key_dim = nk * dk, value_dim = nv * dv, conv_dim = 2 * key_dim + value_dim;
  const int64_t cols = conv_dim + value_dim;  // a projected row: [q | k | v | z]
  const float eps = static_cast<float>(c.rms_norm_eps);
  // Value head h reads key head h / r (Hugging Face's grouped order) or h % nk (a qwen35moe
  // GGUF file's tiled order, ModelConfig::gguf.gdn_v_heads_tiled); value head j of key head g
  // is value_head(g, j).
  const bool tiled = c.gguf.gdn_v_heads_tiled;
  const auto key_head = [&](int64_t h) { return tiled ? h % nk : h / r; };
  const auto value_head = [&](int64_t g, int64_t j) { return tiled ? j * nk + g : g * r + j; };

  // Projections: [T, q | k | v | z] and [T, b | a].
  float* proj = Grow(s.proj, T * cols);
  float* gates = Grow(s.gates, T * 2 * nv);
  {
    trace::Scope scope("gdn_in_proj");
    MatMul(ctx, x, H, T, w.in_proj_qkvz, proj, cols);
    MatMul(ctx, x, H, T, w.in_proj_ba, gates, 2 * nv);
  }

  // Per token: causal conv + SiLU over [q | k | v] (in place, through its sequence's conv
  // window), l2norm of q (scaled by 1/sqrt(dk)) and k per key head, beta = sigmoid(b),
  // g = -exp(A_log) softplus(a + dt_bias).
  std::optional<trace::Scope> scope;
  scope.emplace("gdn_conv_norm");
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  const int64_t conv_floats = (c.linear_conv_kernel_dim - 1) * conv_dim;
  // Case study #5: sequences whose only new token is a decode token take the fused step below
  // (the same kernel calls per channel and head, so the same bits) and skip these passes.
  const auto fused = [&](int64_t seq) {
    return ctx.options.fused_gdn_step && batch.seq_len(seq) == 1 &&
           batch.verify_slots_of(seq) == nullptr;
  };
  // Beta and g of value head h from a token's raw [b | a] row, in place.
  const auto prepare_gates = [&](float* b, int64_t h) {
    b[h] = Sigmoid(b[h]);                                             // beta
    b[nv + h] = w.neg_exp_a[h] * Softplus(b[nv + h] + w.dt_bias[h]);  // g (log decay)
  };
  for (int64_t seq = 0; seq < batch.num_seqs; ++seq) {
    if (fused(seq)) continue;
    float* conv_state = cache.conv_state(ctx.layer, batch.state_slots[seq]);
    const int32_t* verify_slots = batch.verify_slots_of(seq);
    for (int64_t t = batch.seq_begin(seq); t < batch.seq_begin(seq + 1); ++t) {
      if (verify_slots != nullptr) {
        // A verify run keeps the window after each token in a slot of its own.
        float* next = cache.conv_state(ctx.layer, verify_slots[t - batch.seq_begin(seq)]);
        if (next != conv_state) std::memcpy(next, conv_state, conv_floats * sizeof(float));
        conv_state = next;
      }
      float* row = proj + t * cols;
      kernels::CausalConv1dSiluStep(row, conv_state, w.conv.data(), conv_dim,
                                    c.linear_conv_kernel_dim, row);
    }
  }
  for (int64_t seq = 0; seq < batch.num_seqs; ++seq) {
    if (fused(seq)) continue;
    for (int64_t t = batch.seq_begin(seq); t < batch.seq_begin(seq + 1); ++t) {
      float* row = proj + t * cols;
      for (int64_t g = 0; g < nk; ++g) {
        kernels::L2Normalize(row + g * dk, kL2NormEps, q_scale, dk);
        kernels::L2Normalize(row + key_dim + g * dk, kL2NormEps, 1.0f, dk);
      }
      for (int64_t h = 0; h < nv; ++h) prepare_gates(gates + t * 2 * nv, h);
    }
  }

  // The fused decode step of key head g of sequence seq (one token at t): its q, k channels and
  // its r value heads' v channels through the conv, q and k l2-normed, then per value head the
  // gates, the delta-rule step on its state and the gated RMSNorm with SiLU(z). (The conv of a
  // channel range gives those channels the whole step's bits, however the ranges fall.)
  float* core = Grow(s.core, T * value_dim);
  const auto fused_step = [&](int64_t seq, int64_t g) {
    const int64_t t = batch.seq_begin(seq);
    const int32_t slot = batch.state_slots[seq];
    float* row = proj + t * cols;
    float* conv_state = cache.conv_state(ctx.layer, slot);
    const int64_t Kc = c.linear_conv_kernel_dim;
    for (const int64_t begin : {g * dk, key_dim + g * dk}) {
      kernels::CausalConv1dSiluStepRange(row, conv_state, w.conv.data(), conv_dim, Kc, begin,
                                         begin + dk, row);
    }
    if (tiled) {  // the r value heads apart: one conv call each
      for (int64_t j = 0; j < r; ++j) {
        const int64_t v0 = 2 * key_dim + value_head(g, j) * dv;
        kernels::CausalConv1dSiluStepRange(row, conv_state, w.conv.data(), conv_dim, Kc, v0,
                                           v0 + dv, row);
      }
    } else {  // the r value heads side by side
      kernels::CausalConv1dSiluStepRange(row, conv_state, w.conv.data(), conv_dim, Kc,
                                         2 * key_dim + g * r * dv,
                                         2 * key_dim + (g + 1) * r * dv, row);
    }
    kernels::L2Normalize(row + g * dk, kL2NormEps, q_scale, dk);
    kernels::L2Normalize(row + key_dim + g * dk, kL2NormEps, 1.0f, dk);
    float* gate_row = gates + t * 2 * nv;
    for (int64_t j = 0; j < r; ++j) {
      const int64_t h = value_head(g, j);
      prepare_gates(gate_row, h);
      float* o = core + t * value_dim + h * dv;
      kernels::GatedDeltaRuleStep(cache.recurrent_state(ctx.layer, slot) + h * dk * dv,
                                  row + g * dk, row + key_dim + g * dk, row + 2 * key_dim + h * dv,
                                  gate_row[nv + h], gate_row[h], dk, dv, o);
      kernels::RmsNormGated(o, row + conv_dim + h * dv, w.norm.data(), eps, o, dv);
    }
  };

  // The delta rule per (sequence, value head) (value head h reads key head key_head(h)): one
  // recurrent step for a single token, else the chunked form over chunks aligned to absolute
  // multiples of 64, so the arithmetic does not depend on how a prompt is split across steps.
  scope.emplace("gdn_delta_rule");
  ctx.pool.ParallelFor(batch.num_seqs * nv, [&](size_t task, size_t) {
    const int64_t seq = static_cast<int64_t>(task) / nv, h = static_cast<int64_t>(task) % nv;
    if (fused(seq)) {
      // One task per key head (its first value head's); the others idle.
      if (h == value_head(key_head(h), 0)) fused_step(seq, key_head(h));
      return;
    }
    const int64_t begin = batch.seq_begin(seq), len_seq = batch.seq_len(seq);
    const int64_t first_pos = batch.positions[begin];
    float* Sh = cache.recurrent_state(ctx.layer, batch.state_slots[seq]) + h * dk * dv;
    const float* q = proj + begin * cols + key_head(h) * dk;
    const float* k = proj + begin * cols + key_dim + key_head(h) * dk;
    const float* v = proj + begin * cols + 2 * key_dim + h * dv;
    const float* gate_rows = gates + begin * 2 * nv;
    float* o = core + begin * value_dim + h * dv;
    if (const int32_t* verify_slots = batch.verify_slots_of(seq); verify_slots != nullptr) {
      // A verify run: decode's recurrent step token by token (so accepted positions match
      // decoding bit for bit), the state after token t written to its own slot. The copy is the
      // head's [dk, dv] state, just written and still in cache.
      for (int64_t t = 0; t < len_seq; ++t) {
        float* next = cache.recurrent_state(ctx.layer, verify_slots[t]) + h * dk * dv;
        if (next != Sh) std::memcpy(next, Sh, dk * dv * sizeof(float));
        Sh = next;
        const float* gate_row = gate_rows + t * 2 * nv;
        kernels::GatedDeltaRuleStep(Sh, q + t * cols, k + t * cols, v + t * cols, gate_row[nv + h],
                                    gate_row[h], dk, dv, o + t * value_dim);
      }
      return;
    }
    float g[kernels::kGdnChunkSize], beta[kernels::kGdnChunkSize];
    for (int64_t t0 = 0; t0 < len_seq;) {
      const int64_t len = std::min(
          len_seq - t0, kernels::kGdnChunkSize - (first_pos + t0) % kernels::kGdnChunkSize);
      for (int64_t i = 0; i < len; ++i) {
        beta[i] = gate_rows[(t0 + i) * 2 * nv + h];
        g[i] = gate_rows[(t0 + i) * 2 * nv + nv + h];
      }
      if (len == 1) {
        kernels::GatedDeltaRuleStep(Sh, q + t0 * cols, k + t0 * cols, v + t0 * cols, g[0],
                                    beta[0], dk, dv, o + t0 * value_dim);
      } else {
        kernels::GatedDeltaRuleChunk(Sh, q + t0 * cols, k + t0 * cols, cols, v + t0 * cols, cols,
                                     g, beta, len, dk, dv, o + t0 * value_dim, value_dim);
      }
      t0 += len;
    }
  });

  // Gated RMSNorm per (token, value head) with SiLU(z), then out_proj.
  scope.emplace("gdn_gated_norm_out_proj");
  for (int64_t seq = 0; seq < batch.num_seqs; ++seq) {
    if (fused(seq)) continue;
    for (int64_t t = batch.seq_begin(seq); t < batch.seq_begin(seq + 1); ++t) {
      for (int64_t h = 0; h < nv; ++h) {
        float* o = core + t * value_dim + h * dv;
        const float* z = proj + t * cols + conv_dim + h * dv;
        kernels::RmsNormGated(o, z, w.norm.data(), eps, o, dv);
      }
    }
  }
  ctx.Tap("gdn_core", core, T, value_dim);
  MatMul(ctx, core, value_dim, T, w.out_proj, out, H);
}

}  // namespace moeserve::model
