#include "model/layers.h"

#include <cmath>
#include <cstring>
#include <optional>

#include "core/trace.h"
#include "kernels/activations.h"
#include "kernels/causal_conv1d.h"
#include "kernels/gated_delta_rule.h"
#include "kernels/matmul.h"
#include "kernels/norms.h"
#include "kernels/rope.h"

namespace moeserve::model {
namespace {

constexpr float kL2NormEps = 1e-6f;  // FLA / HF l2norm: x * rsqrt(sum(x^2) + 1e-6)

// (token, expert) rows of routed-expert work the MoE scratch holds at once (see SparseMoe).
constexpr int64_t kMoeGroupRows = 1024;

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// torch.nn.functional.softplus with its default threshold of 20.
float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

template <typename T>
T* Grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

void AddBias(float* rows, int64_t T, const std::vector<float>& bias) {
  if (bias.empty()) return;
  const int64_t n = static_cast<int64_t>(bias.size());
  for (int64_t t = 0; t < T; ++t) kernels::Axpy(1.0f, bias.data(), rows + t * n, n);
}

// out [n, H] = down(silu(gate x) * up x) for n rows of x (row stride x_stride); `mid` is scratch
// of [n, 2 I].
void SwiGluRows(const LayerContext& ctx, const SwiGluWeights& w, const float* x, int64_t x_stride,
                int64_t n, std::vector<float>& mid, float* out) {
  const int64_t I = w.width(), H = ctx.config.hidden_size;
  float* m = Grow(mid, n * 2 * I);
  kernels::MatMul(x, x_stride, n, w.gate_up.view(), m, 2 * I, ctx.pool);  // [n, gate | up]
  for (int64_t i = 0; i < n; ++i) kernels::SwiGlu(m + i * 2 * I, m + i * 2 * I + I, m + i * 2 * I, I);
  kernels::MatMul(m, 2 * I, n, w.down.view(), out, H, ctx.pool);
}

}  // namespace

void RmsNormRows(const float* x, int64_t T, int64_t n, const std::vector<float>& w, float eps,
                 float* y) {
  for (int64_t t = 0; t < T; ++t) kernels::RmsNorm(x + t * n, w.data(), eps, y + t * n, n);
}

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

  // Projections: [T, q | k | v | z] and [T, b | a].
  float* proj = Grow(s.proj, T * cols);
  float* gates = Grow(s.gates, T * 2 * nv);
  {
    trace::Scope scope("gdn_in_proj");
    kernels::MatMul(x, H, T, w.in_proj_qkvz.view(), proj, cols, ctx.pool);
    kernels::MatMul(x, H, T, w.in_proj_ba.view(), gates, 2 * nv, ctx.pool);
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
  // gates, the delta-rule step on its state and the gated RMSNorm with SiLU(z).
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
    kernels::CausalConv1dSiluStepRange(row, conv_state, w.conv.data(), conv_dim, Kc,
                                       2 * key_dim + g * r * dv, 2 * key_dim + (g + 1) * r * dv,
                                       row);
    kernels::L2Normalize(row + g * dk, kL2NormEps, q_scale, dk);
    kernels::L2Normalize(row + key_dim + g * dk, kL2NormEps, 1.0f, dk);
    float* gate_row = gates + t * 2 * nv;
    for (int64_t h = g * r; h < (g + 1) * r; ++h) {
      prepare_gates(gate_row, h);
      float* o = core + t * value_dim + h * dv;
      kernels::GatedDeltaRuleStep(cache.recurrent_state(ctx.layer, slot) + h * dk * dv,
                                  row + g * dk, row + key_dim + g * dk, row + 2 * key_dim + h * dv,
                                  gate_row[nv + h], gate_row[h], dk, dv, o);
      kernels::RmsNormGated(o, row + conv_dim + h * dv, w.norm.data(), eps, o, dv);
    }
  };

  // The delta rule per (sequence, value head) (value head h reads key head h / r): one
  // recurrent step for a single token, else the chunked form over chunks aligned to absolute
  // multiples of 64, so the arithmetic does not depend on how a prompt is split across steps.
  scope.emplace("gdn_delta_rule");
  ctx.pool.ParallelFor(batch.num_seqs * nv, [&](size_t task, size_t) {
    const int64_t seq = static_cast<int64_t>(task) / nv, h = static_cast<int64_t>(task) % nv;
    if (fused(seq)) {
      if (h % r == 0) fused_step(seq, h / r);  // one task per key head; the others idle
      return;
    }
    const int64_t begin = batch.seq_begin(seq), len_seq = batch.seq_len(seq);
    const int64_t first_pos = batch.positions[begin];
    float* Sh = cache.recurrent_state(ctx.layer, batch.state_slots[seq]) + h * dk * dv;
    const float* q = proj + begin * cols + (h / r) * dk;
    const float* k = proj + begin * cols + key_dim + (h / r) * dk;
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
  kernels::MatMul(core, value_dim, T, w.out_proj.view(), out, H, ctx.pool);
}

void Attention(const LayerContext& ctx, const AttentionWeights& w, const TokenBatch& batch,
               const float* x, const kernels::PagedKvCache& kv, float* out) {
  const io::ModelConfig& c = ctx.config;
  Scratch& s = ctx.scratch;
  const int64_t T = batch.num_tokens;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t hd = c.head_dim, rot = c.rotary_dim;
  const bool gated = c.attn_output_gate;
  const int64_t q_stride = gated ? 2 * hd : hd;  // per head: [query | gate] when gated
  const int64_t q_rows = nh * q_stride, kv_rows = nkv * hd, cols = q_rows + 2 * kv_rows;
  const float eps = static_cast<float>(c.rms_norm_eps);

  float* proj = Grow(s.proj, T * cols);
  kernels::MatMul(x, H, T, w.qkv.view(), proj, cols, ctx.pool);
  AddBias(proj, T, w.qkv_bias);

  float* q = Grow(s.heads, T * nh * hd);
  float* gate = gated ? Grow(s.gate, T * nh * hd) : nullptr;
  float* cos = Grow(s.rope_cos, rot / 2);
  float* sin = Grow(s.rope_sin, rot / 2);
  for (int64_t t = 0; t < T; ++t) {
    float* row = proj + t * cols;
    float* qt = q + t * nh * hd;
    for (int64_t h = 0; h < nh; ++h) {
      std::memcpy(qt + h * hd, row + h * q_stride, hd * sizeof(float));
      if (gated) std::memcpy(gate + (t * nh + h) * hd, row + h * q_stride + hd, hd * sizeof(float));
      if (!w.q_norm.empty()) kernels::RmsNorm(qt + h * hd, w.q_norm.data(), eps, qt + h * hd, hd);
    }
    float* k = row + q_rows;
    const float* v = k + kv_rows;
    if (!w.k_norm.empty()) {
      for (int64_t h = 0; h < nkv; ++h) kernels::RmsNorm(k + h * hd, w.k_norm.data(), eps, k + h * hd, hd);
    }
    const int64_t pos = batch.positions[t];
    kernels::RopeCosSin(pos, c.rope_theta, rot, cos, sin);
    kernels::ApplyRope(qt, nh, hd, rot, cos, sin);
    kernels::ApplyRope(k, nkv, hd, rot, cos, sin);
    const int32_t* block_table = batch.block_tables[batch.seq_of[t]];
    for (int64_t h = 0; h < nkv; ++h) {
      std::memcpy(kernels::KvRow(kv.k, kv, block_table, pos, h), k + h * hd, hd * sizeof(float));
      std::memcpy(kernels::KvRow(kv.v, kv, block_table, pos, h), v + h * hd, hd * sizeof(float));
    }
  }

  float* attn = Grow(s.attn, T * nh * hd);
  const kernels::PagedQueries queries{T, batch.positions, batch.seq_of, batch.block_tables};
  kernels::PagedAttentionBatch(q, queries, nh, kv, 1.0f / std::sqrt(static_cast<float>(hd)), attn,
                               ctx.pool);
  if (gated) kernels::MulSigmoid(attn, gate, T * nh * hd);
  kernels::MatMul(attn, nh * hd, T, w.o_proj.view(), out, H, ctx.pool);
  AddBias(out, T, w.o_bias);
}

namespace {

// Rows [begin, end) of T split over the ranks: the tokens rank r owns in an expert-parallel MoE
// (as the communicator's AllGatherRows cuts them).
int64_t OwnedBegin(int64_t T, const LayerContext& ctx, int rank) {
  return T * rank / ctx.comm.size();
}

// The shared expert's rows [begin, end) of x: its [gate | up] product is a job for a group of
// matmuls (with routed experts, or alone), SwiGLU and down_proj into shared_out rows.
struct SharedRows {
  int64_t begin = 0, end = 0;
  int64_t count() const { return end - begin; }
};

void SharedExpertDown(const LayerContext& ctx, const MoeWeights& w, SharedRows rows) {
  Scratch& s = ctx.scratch;
  const int64_t H = ctx.config.hidden_size, Is = ctx.config.shared_expert_intermediate_size;
  for (int64_t t = rows.begin; t < rows.end; ++t) {
    float* m = s.shared_mid.data() + t * 2 * Is;
    kernels::SwiGlu(m, m + Is, m, Is);
  }
  kernels::MatMul(s.shared_mid.data() + rows.begin * 2 * Is, 2 * Is, rows.count(),
                  w.shared.down.view(), s.shared_out.data() + rows.begin * H, H, ctx.pool);
}

// The shared expert over rows on its own (not joined with routed experts).
void SharedExpert(const LayerContext& ctx, const MoeWeights& w, const float* x, SharedRows rows) {
  if (rows.count() <= 0) return;
  trace::Scope scope("shared_expert");
  Scratch& s = ctx.scratch;
  const int64_t H = ctx.config.hidden_size, Is = ctx.config.shared_expert_intermediate_size;
  kernels::MatMul(x + rows.begin * H, H, rows.count(), w.shared.gate_up.view(),
                  s.shared_mid.data() + rows.begin * 2 * Is, 2 * Is, ctx.pool);
  SharedExpertDown(ctx, w, rows);
}

// sigmoid(x_row . shared_expert_gate): how much of the shared expert a token takes.
float SharedGate(const MoeWeights& w, const float* x_row, int64_t H) {
  float dot = 0.0f;
  for (int64_t i = 0; i < H; ++i) dot += x_row[i] * w.shared_gate[i];
  return Sigmoid(dot);
}

// The routed experts this rank holds over the tokens routed to them (ids / weights: [T, k]):
// out [T, H] = sum of w_e expert_e(x[t]), each token's experts added in ascending id. The shared
// expert's rows `shared` (may be empty) run joined with the first group of experts.
void RoutedExperts(const LayerContext& ctx, const MoeWeights& w, const float* x, int64_t T,
                   const int32_t* ids, const float* weights, SharedRows shared, float* out) {
  trace::Scope scope(shared.count() > 0 ? "experts_and_shared" : "routed_experts");
  const io::ModelConfig& c = ctx.config;
  Scratch& s = ctx.scratch;
  const int64_t H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;
  // Group the batch's (token, choice) pairs by expert (a counting sort), so each expert's weights
  // are read once per step for all tokens routed to it; experts run in ascending id, so every
  // token sums its experts in that order, whatever else is in the batch.
  int32_t* offsets = Grow(s.expert_offsets, E + 1);
  int32_t* sorted = Grow(s.expert_pairs, T * k);
  std::fill(offsets, offsets + E + 1, 0);
  // Under --ep a rank computes only the experts it holds; the others' come from their ranks.
  auto held = [&](int32_t e) { return w.experts[e].gate_up.view().rank() == 2; };
  for (int64_t p = 0; p < T * k; ++p) offsets[ids[p] + 1] += held(ids[p]) ? 1 : 0;
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  for (int64_t p = 0; p < T * k; ++p) {
    if (held(ids[p])) sorted[offsets[ids[p]]++] = static_cast<int32_t>(p);
  }
  for (int64_t e = E; e > 0; --e) offsets[e] = offsets[e - 1];  // back to starts
  offsets[0] = 0;

  // The experts run in groups of up to kMoeGroupRows (token, expert) rows (a single expert with
  // more rows is a group of its own), each group with one join per projection for all of its
  // experts (MatMulGroup) instead of one per expert.
  const int64_t I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  kernels::MatMulJob* jobs = Grow(s.moe_jobs, E + 1);
  std::memset(out, 0, T * H * sizeof(float));
  for (int64_t e0 = 0; e0 < E;) {
    int64_t e1 = e0 + 1;
    while (e1 < E && offsets[e1 + 1] - offsets[e0] <= kMoeGroupRows) ++e1;
    const int64_t base = offsets[e0], rows = offsets[e1] - base;
    float* in = Grow(s.expert_in, rows * H);
    float* mid = Grow(s.expert_mid, rows * 2 * I);
    float* y = Grow(s.expert_out, rows * H);
    for (int64_t p = base; p < offsets[e1]; ++p) {
      std::memcpy(in + (p - base) * H, x + (sorted[p] / k) * H, H * sizeof(float));
    }
    const bool with_shared = shared.count() > 0 && e0 == 0;
    int64_t num_jobs = 0;
    for (int64_t e = e0; e < e1; ++e) {
      const int64_t n = offsets[e + 1] - offsets[e], row = offsets[e] - base;
      if (n > 0) {
        jobs[num_jobs++] = {in + row * H, H, n, &w.experts[e].gate_up.view(), mid + row * 2 * I,
                            2 * I};
      }
    }
    if (with_shared) {
      jobs[num_jobs++] = {x + shared.begin * H, H, shared.count(), &w.shared.gate_up.view(),
                          s.shared_mid.data() + shared.begin * 2 * Is, 2 * Is};
    }
    kernels::MatMulGroup(jobs, num_jobs, ctx.pool);
    for (int64_t i = 0; i < rows; ++i) {
      kernels::SwiGlu(mid + i * 2 * I, mid + i * 2 * I + I, mid + i * 2 * I, I);
    }
    num_jobs = 0;
    for (int64_t e = e0; e < e1; ++e) {
      const int64_t n = offsets[e + 1] - offsets[e], row = offsets[e] - base;
      if (n > 0) {
        jobs[num_jobs++] = {mid + row * 2 * I, 2 * I, n, &w.experts[e].down.view(), y + row * H, H};
      }
    }
    if (with_shared) {
      for (int64_t t = shared.begin; t < shared.end; ++t) {
        float* m = s.shared_mid.data() + t * 2 * Is;
        kernels::SwiGlu(m, m + Is, m, Is);
      }
      jobs[num_jobs++] = {s.shared_mid.data() + shared.begin * 2 * Is, 2 * Is, shared.count(),
                          &w.shared.down.view(), s.shared_out.data() + shared.begin * H, H};
    }
    kernels::MatMulGroup(jobs, num_jobs, ctx.pool);
    // Pairs in expert order, so each token adds its experts in ascending id.
    for (int64_t p = base; p < offsets[e1]; ++p) {
      kernels::Axpy(weights[sorted[p]], y + (p - base) * H, out + (sorted[p] / k) * H, H);
    }
    e0 = e1;
  }
}

}  // namespace

MoeResult SparseMoe(const LayerContext& ctx, const MoeWeights& w, const float* x, int64_t T,
                    float* out) {
  const io::ModelConfig& c = ctx.config;
  Scratch& s = ctx.scratch;
  const int64_t H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;

  // Router: f32 softmax over all experts, top-k, renormalized over the k.
  std::optional<trace::Scope> router_scope;
  router_scope.emplace("router");
  float* probs = Grow(s.router, T * E);
  kernels::MatMul(x, H, T, w.router.view(), probs, E, ctx.pool);
  int32_t* ids = Grow(s.topk_ids, T * k);
  float* weights = Grow(s.topk_weights, T * k);
  for (int64_t t = 0; t < T; ++t) {
    kernels::Softmax(probs + t * E, E);
    kernels::TopK(probs + t * E, E, k, ids + t * k, weights + t * k);
    if (c.norm_topk_prob) {
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) sum += weights[t * k + j];
      for (int64_t j = 0; j < k; ++j) weights[t * k + j] /= sum;
    }
  }
  router_scope.reset();
  ctx.Tap("router_probs", probs, T, E);
  Grow(s.shared_mid, T * 2 * c.shared_expert_intermediate_size);
  Grow(s.shared_out, T * H);

  const bool has_shared = w.shared.gate_up.view().rank() == 2;
  const bool overlap = ctx.options.shared_expert_overlap;
  if (!ctx.expert_parallel) {
    // One rank, or plain TP: every rank its slice of every expert's (and the shared expert's)
    // width, over all tokens; the shared expert joined with the first group of experts.
    const SharedRows shared{0, has_shared ? T : 0};
    RoutedExperts(ctx, w, x, T, ids, weights, overlap ? shared : SharedRows{}, out);
    if (!overlap) SharedExpert(ctx, w, x, shared);
    for (int64_t t = 0; t < shared.count(); ++t) {  // after the routed ones
      kernels::Axpy(SharedGate(w, x + t * H, H), s.shared_out.data() + t * H, out + t * H, H);
    }
    return {};
  }

  // --ep: every rank holds whole experts and the whole shared expert, and owns the tokens
  // [begin, end). The hidden states are on every rank after the attention's reduction, so routed
  // tokens need no dispatch: each rank routes them all and runs its experts on theirs. A token's
  // output is the sum over ranks (rank order) of their experts' parts, then + its shared expert
  // (which every rank runs for every token: so where a token sits in the batch, and so which rank
  // owns it and which path a step takes, changes none of its bits).
  const int p = ctx.comm.size(), me = ctx.comm.rank();
  const SharedRows all{0, has_shared ? T : 0};
  float* gates = Grow(s.shared_gates, T);
  for (int64_t t = 0; t < all.count(); ++t) gates[t] = SharedGate(w, x + t * H, H);
  const MoeResult shared_after{.owned_rows = false,
                               .shared_out = has_shared ? s.shared_out.data() : nullptr,
                               .shared_gates = gates};
  if (T > ctx.options.mc2_max_tokens) {
    // All-gather dispatch: this rank's partial sums of every token, reduced by the caller, who
    // then adds the shared expert.
    RoutedExperts(ctx, w, x, T, ids, weights, overlap ? all : SharedRows{}, out);
    if (!overlap) SharedExpert(ctx, w, x, all);
    return shared_after;
  }

  // All-to-all combine (MC2 when ctx.options.mc2): each rank's part of the tokens owner o owns
  // goes to o (a reduce-scatter by rows), where it is summed in rank order and the shared expert
  // added; the caller then gathers the owners' rows. MC2 posts the exchange and, while it is in
  // flight, runs the shared expert and adds each peer's part as it arrives; without MC2 the
  // exchange blocks after all the compute.
  RoutedExperts(ctx, w, x, T, ids, weights, SharedRows{}, out);
  const bool hide = ctx.options.mc2 && overlap;
  if (!hide) SharedExpert(ctx, w, x, all);
  const SharedRows own{OwnedBegin(T, ctx, me), OwnedBegin(T, ctx, me + 1)};
  int64_t* counts = Grow(s.exchange_counts, 4 * p);
  int64_t *send_counts = counts, *send_offsets = counts + p, *recv_counts = counts + 2 * p,
          *recv_offsets = counts + 3 * p;
  for (int o = 0; o < p; ++o) {
    const int64_t begin = OwnedBegin(T, ctx, o), end = OwnedBegin(T, ctx, o + 1);
    send_counts[o] = (end - begin) * H;
    send_offsets[o] = begin * H;
    recv_counts[o] = own.count() * H;
    recv_offsets[o] = o * own.count() * H;
  }
  float* parts = Grow(s.exchange_in, p * own.count() * H);
  const std::span<const int64_t> sc(send_counts, p), so(send_offsets, p), rc(recv_counts, p),
      ro(recv_offsets, p);
  if (ctx.options.mc2) {
    ctx.comm.StartAllToAllV(out, sc, so, parts, rc, ro);
  } else {
    ctx.comm.AllToAllV(out, sc, so, parts, rc, ro);
  }
  if (hide) SharedExpert(ctx, w, x, all);
  float* acc = Grow(s.exchange_acc, own.count() * H);
  for (int src = 0; src < p; ++src) {
    if (ctx.options.mc2) ctx.comm.WaitFrom(src);
    const float* part = parts + src * own.count() * H;
    if (src == 0) {
      std::memcpy(acc, part, own.count() * H * sizeof(float));
    } else {
      for (int64_t i = 0; i < own.count() * H; ++i) acc[i] += part[i];
    }
  }
  if (ctx.options.mc2) ctx.comm.FinishAllToAllV();
  for (int64_t t = own.begin; t < own.end; ++t) {
    float* row = out + t * H;
    std::memcpy(row, acc + (t - own.begin) * H, H * sizeof(float));
    if (has_shared) kernels::Axpy(gates[t], s.shared_out.data() + t * H, row, H);
  }
  return {.owned_rows = true};
}

void SwiGluMlp(const LayerContext& ctx, const SwiGluWeights& w, const float* x, int64_t T,
               float* out) {
  SwiGluRows(ctx, w, x, ctx.config.hidden_size, T, ctx.scratch.expert_mid, out);
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
  // What a layer's first matmuls read: its mixer's input projections.
  void AddMixer(const DecoderLayerWeights& w) {
    if (w.type == io::LayerType::kLinearAttention) {
      Add(w.gdn.in_proj_qkvz.view());
      Add(w.gdn.in_proj_ba.view());
    } else {
      Add(w.attention.qkv.view());
    }
  }
  // What the feed-forward half reads first: router and shared expert, or the MLP's gate_up.
  void AddFfn(const DecoderLayerWeights& w) {
    if (w.moe) {
      Add(w.experts.router.view());
      Add(w.experts.shared.gate_up.view());
    } else {
      Add(w.mlp.gate_up.view());
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

void Scratch::Reserve(const io::ModelConfig& c, int64_t max_tokens) {
  const int64_t N = max_tokens, H = c.hidden_size;
  const int64_t q_stride = c.attn_output_gate ? 2 * c.head_dim : c.head_dim;
  const int64_t attn_cols =
      c.num_attention_heads * q_stride + 2 * c.num_key_value_heads * c.head_dim;
  const int64_t gdn_cols = c.linear_conv_dim() + c.linear_value_dim();
  const int64_t head_floats = c.num_attention_heads * c.head_dim;
  const int64_t k = c.num_experts_per_tok;
  Grow(normed, N * H);
  Grow(delta, N * H);
  Grow(proj, N * std::max(attn_cols, gdn_cols));
  Grow(gates, N * 2 * c.linear_num_value_heads);
  Grow(core, N * c.linear_value_dim());
  Grow(heads, N * head_floats);
  Grow(gate, N * head_floats);
  Grow(attn, N * head_floats);
  Grow(router, N * c.num_experts);
  Grow(topk_ids, N * k);
  Grow(topk_weights, N * k);
  Grow(expert_offsets, c.num_experts + 1);
  Grow(expert_pairs, N * k);
  // A group of experts holds up to kMoeGroupRows rows, or one expert's (each token at most once).
  const int64_t group_rows = std::max(kMoeGroupRows, N);
  Grow(expert_in, group_rows * H);
  Grow(expert_out, group_rows * H);
  Grow(expert_mid, std::max(group_rows * 2 * c.moe_intermediate_size,
                            N * 2 * c.intermediate_size));  // also the dense MLP's
  Grow(moe_jobs, c.num_experts + 1);
  Grow(shared_mid, N * 2 * c.shared_expert_intermediate_size);
  Grow(shared_out, N * H);
  Grow(rope_cos, c.rotary_dim / 2);
  Grow(rope_sin, c.rotary_dim / 2);
}

}  // namespace moeserve::model
