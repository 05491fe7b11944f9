#include "model/attention.h"

#include <cmath>
#include <cstring>

#include "kernels/activations.h"
#include "kernels/matmul.h"
#include "kernels/norms.h"
#include "kernels/rope.h"
#include "model/layer_util.h"

namespace moeserve::model {
namespace {

void AddBias(float* rows, int64_t T, const std::vector<float>& bias) {
  if (bias.empty()) return;
  const int64_t n = static_cast<int64_t>(bias.size());
  for (int64_t t = 0; t < T; ++t) kernels::Axpy(1.0f, bias.data(), rows + t * n, n);
}

}  // namespace

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
  MatMul(ctx, x, H, T, w.qkv, proj, cols);
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
  MatMul(ctx, attn, nh * hd, T, w.o_proj, out, H);
  AddBias(out, T, w.o_bias);
}

}  // namespace moeserve::model
