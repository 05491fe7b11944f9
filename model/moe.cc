#include "model/moe.h"

#include <algorithm>
#include <cstring>
#include <span>

#include "core/trace.h"
#include "kernels/activations.h"
#include "kernels/matmul.h"
#include "model/layer_util.h"

namespace moeserve::model {
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
  MatMul(ctx, s.shared_mid.data() + rows.begin * 2 * Is, 2 * Is, rows.count(), w.shared.down,
         s.shared_out.data() + rows.begin * H, H);
}

// The shared expert over rows on its own (not joined with routed experts).
void SharedExpert(const LayerContext& ctx, const MoeWeights& w, const float* x, SharedRows rows) {
  if (rows.count() <= 0) return;
  trace::Scope scope("shared_expert");
  Scratch& s = ctx.scratch;
  const int64_t H = ctx.config.hidden_size, Is = ctx.config.shared_expert_intermediate_size;
  MatMul(ctx, x + rows.begin * H, H, rows.count(), w.shared.gate_up,
         s.shared_mid.data() + rows.begin * 2 * Is, 2 * Is);
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
  auto held = [&](int32_t e) { return w.experts[e].gate_up.held(); };
  for (int64_t p = 0; p < T * k; ++p) offsets[ids[p] + 1] += held(ids[p]) ? 1 : 0;
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  for (int64_t p = 0; p < T * k; ++p) {
    if (held(ids[p])) sorted[offsets[ids[p]]++] = static_cast<int32_t>(p);
  }
  for (int64_t e = E; e > 0; --e) offsets[e] = offsets[e - 1];  // back to starts
  offsets[0] = 0;
  // The trace names how many experts the step read (a verify step of 1 + K tokens reads the
  // union of their choices: scripts/trace_summary.py --experts).
  int64_t experts_read = 0;
  for (int64_t e = 0; trace::enabled() && e < E; ++e) experts_read += offsets[e + 1] > offsets[e];
  trace::Scope scope(shared.count() > 0 ? "experts_and_shared" : "routed_experts", "experts",
                     experts_read);

  // The experts run in groups of up to kMoeGroupRows (token, expert) rows (a single expert with
  // more rows is a group of its own), each group with one join per projection for all of its
  // experts (MatMulGroup) instead of one per expert.
  const int64_t I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  // Jobs: per expert and for the shared one, gate_up's blocks (one, or a file's gate and up:
  // kMaxSwiGluBlocks) or its down.
  const std::span<kernels::MatMulJob> jobs(Grow(s.moe_jobs, kMaxSwiGluBlocks * (E + 1)),
                                           static_cast<size_t>(kMaxSwiGluBlocks * (E + 1)));
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
        AddMatMulJobs(ctx, in + row * H, H, n, w.experts[e].gate_up, mid + row * 2 * I, 2 * I,
                      jobs, &num_jobs);
      }
    }
    if (with_shared) {
      AddMatMulJobs(ctx, x + shared.begin * H, H, shared.count(), w.shared.gate_up,
                    s.shared_mid.data() + shared.begin * 2 * Is, 2 * Is, jobs, &num_jobs);
    }
    kernels::MatMulGroup(jobs.data(), num_jobs, ctx.pool);
    for (int64_t i = 0; i < rows; ++i) {
      kernels::SwiGlu(mid + i * 2 * I, mid + i * 2 * I + I, mid + i * 2 * I, I);
    }
    num_jobs = 0;
    for (int64_t e = e0; e < e1; ++e) {
      const int64_t n = offsets[e + 1] - offsets[e], row = offsets[e] - base;
      if (n > 0) {
        const Tensor& down = w.experts[e].down.view();
        jobs[num_jobs++] = {mid + row * 2 * I, 2 * I, n, &down, y + row * H, H,
                            ActivationsFor(down, ctx.ggml_activations)};
      }
    }
    if (with_shared) {
      for (int64_t t = shared.begin; t < shared.end; ++t) {
        float* m = s.shared_mid.data() + t * 2 * Is;
        kernels::SwiGlu(m, m + Is, m, Is);
      }
      const Tensor& down = w.shared.down.view();
      jobs[num_jobs++] = {s.shared_mid.data() + shared.begin * 2 * Is, 2 * Is, shared.count(),
                          &down, s.shared_out.data() + shared.begin * H, H,
                          ActivationsFor(down, ctx.ggml_activations)};
    }
    kernels::MatMulGroup(jobs.data(), num_jobs, ctx.pool);
    // Pairs in expert order, so each token adds its experts in ascending id.
    for (int64_t p = base; p < offsets[e1]; ++p) {
      kernels::Axpy(weights[sorted[p]], y + (p - base) * H, out + (sorted[p] / k) * H, H);
    }
    e0 = e1;
  }
}

bool HasSharedExpert(const MoeWeights& w) { return w.shared.gate_up.held(); }

// The router: f32 softmax over all experts, top-k, renormalized over the k. Leaves the
// probabilities [T, E] in scratch.router, each token's experts and weights [T, k] in
// scratch.topk_ids / topk_weights.
void Route(const LayerContext& ctx, const MoeWeights& w, const float* x, int64_t T) {
  trace::Scope scope("router");
  const io::ModelConfig& c = ctx.config;
  Scratch& s = ctx.scratch;
  const int64_t H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;
  float* probs = Grow(s.router, T * E);
  MatMul(ctx, x, H, T, w.router, probs, E);
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
}

// --ep's all-to-all combine (MC2 when ctx.options.mc2): each rank's part of the tokens owner o
// owns goes to o (a reduce-scatter by rows), where it is summed in rank order and the shared
// expert (rows `all`, gates [T]) added; the caller then gathers the owners' rows. MC2 posts the
// exchange and, while it is in flight, runs the shared expert and adds each peer's part as it
// arrives; without MC2 the exchange blocks after all the compute.
MoeResult CombineAtOwners(const LayerContext& ctx, const MoeWeights& w, const float* x, int64_t T,
                          const int32_t* ids, const float* weights, SharedRows all,
                          const float* gates, float* out) {
  Scratch& s = ctx.scratch;
  const int64_t H = ctx.config.hidden_size;
  const int p = ctx.comm.size(), me = ctx.comm.rank();
  RoutedExperts(ctx, w, x, T, ids, weights, SharedRows{}, out);
  const bool hide = ctx.options.mc2 && ctx.options.shared_expert_overlap;
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
    if (HasSharedExpert(w)) kernels::Axpy(gates[t], s.shared_out.data() + t * H, row, H);
  }
  return {.owned_rows = true};
}

}  // namespace

MoeResult SparseMoe(const LayerContext& ctx, const MoeWeights& w, const float* x, int64_t T,
                    float* out) {
  const io::ModelConfig& c = ctx.config;
  Scratch& s = ctx.scratch;
  const int64_t H = c.hidden_size;
  Route(ctx, w, x, T);
  ctx.Tap("router_probs", s.router.data(), T, c.num_experts);
  const int32_t* ids = s.topk_ids.data();
  const float* weights = s.topk_weights.data();
  Grow(s.shared_mid, T * 2 * c.shared_expert_intermediate_size);
  Grow(s.shared_out, T * H);

  const bool has_shared = HasSharedExpert(w);
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
  const SharedRows all{0, has_shared ? T : 0};
  float* gates = Grow(s.shared_gates, T);
  for (int64_t t = 0; t < all.count(); ++t) gates[t] = SharedGate(w, x + t * H, H);
  if (T <= ctx.options.mc2_max_tokens) {
    return CombineAtOwners(ctx, w, x, T, ids, weights, all, gates, out);
  }
  // All-gather dispatch: this rank's partial sums of every token, reduced by the caller, who
  // then adds the shared expert.
  RoutedExperts(ctx, w, x, T, ids, weights, overlap ? all : SharedRows{}, out);
  if (!overlap) SharedExpert(ctx, w, x, all);
  return {.owned_rows = false,
          .shared_out = has_shared ? s.shared_out.data() : nullptr,
          .shared_gates = gates};
}

}  // namespace moeserve::model
