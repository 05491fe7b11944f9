#include "model/layer_context.h"

#include <algorithm>
#include <array>

#include "model/layer_util.h"

namespace moeserve::model {

namespace {

// Every buffer Scratch::Reserve plans, with the elements it needs for batches of up to
// max_tokens tokens: visit(buffer, elements). One list for Reserve, ReserveBytes and bytes().
template <typename S, typename Visit>
void PlanScratch(S& s, const io::ModelConfig& c, int64_t max_tokens, Visit&& visit) {
  const int64_t N = max_tokens, H = c.hidden_size;
  const int64_t q_stride = c.attn_output_gate ? 2 * c.head_dim : c.head_dim;
  const int64_t attn_cols =
      c.num_attention_heads * q_stride + 2 * c.num_key_value_heads * c.head_dim;
  const int64_t gdn_cols = c.linear_conv_dim() + c.linear_value_dim();
  const int64_t head_floats = c.num_attention_heads * c.head_dim;
  const int64_t k = c.num_experts_per_tok;
  visit(s.normed, N * H);
  visit(s.delta, N * H);
  visit(s.proj, N * std::max(attn_cols, gdn_cols));
  visit(s.gates, N * 2 * c.linear_num_value_heads);
  visit(s.core, N * c.linear_value_dim());
  visit(s.heads, N * head_floats);
  visit(s.gate, N * head_floats);
  visit(s.attn, N * head_floats);
  visit(s.router, N * c.num_experts);
  visit(s.topk_ids, N * k);
  visit(s.topk_weights, N * k);
  visit(s.expert_offsets, c.num_experts + 1);
  visit(s.expert_pairs, N * k);
  // A group of experts holds up to kMoeGroupRows rows, or one expert's (each token at most once).
  const int64_t group_rows = std::max(kMoeGroupRows, N);
  visit(s.expert_in, group_rows * H);
  visit(s.expert_out, group_rows * H);
  visit(s.expert_mid, std::max(group_rows * 2 * c.moe_intermediate_size,
                               N * 2 * c.intermediate_size));  // also the dense MLP's
  visit(s.moe_jobs, c.num_experts + 1);
  visit(s.shared_mid, N * 2 * c.shared_expert_intermediate_size);
  visit(s.shared_out, N * H);
  visit(s.rope_cos, c.rotary_dim / 2);
  visit(s.rope_sin, c.rotary_dim / 2);
}

}  // namespace

void Scratch::Reserve(const io::ModelConfig& c, int64_t max_tokens) {
  PlanScratch(*this, c, max_tokens, [](auto& buffer, int64_t n) { Grow(buffer, n); });
}

int64_t Scratch::ReserveBytes(const io::ModelConfig& c, int64_t max_tokens) {
  Scratch empty;
  int64_t bytes = 0;
  PlanScratch(empty, c, max_tokens, [&](auto& buffer, int64_t n) {
    bytes += n * static_cast<int64_t>(sizeof(buffer[0]));
  });
  return bytes;
}

int64_t Scratch::bytes() const {
  int64_t bytes = 0;
  // The planned buffers' sizes now (the elements PlanScratch computes are not needed).
  PlanScratch(*this, io::ModelConfig{}, 0, [&](const auto& buffer, int64_t) {
    bytes += static_cast<int64_t>(buffer.size() * sizeof(buffer[0]));
  });
  return bytes;
}

kernels::GgmlActivations ActivationsFor(const Tensor& W,
                                        kernels::GgmlActivations ggml_activations) {
  return IsGgmlBlockDType(W.dtype()) ? ggml_activations : kernels::GgmlActivations::kF32;
}

void MatMul(const LayerContext& ctx, const float* x, int64_t x_stride, int64_t M, const Tensor& W,
            float* y, int64_t y_stride) {
  kernels::MatMul(x, x_stride, M, W, y, y_stride, ctx.pool,
                  ActivationsFor(W, ctx.ggml_activations));
}

void MatMul(const LayerContext& ctx, const float* x, int64_t x_stride, int64_t M,
            const WeightMatrix& W, float* y, int64_t y_stride) {
  if (W.blocks().size() == 1) {
    MatMul(ctx, x, x_stride, M, W.whole(), y, y_stride);
    return;
  }
  // A fused matrix has a block per checkpoint tensor it joins: q, k, v at most.
  std::array<kernels::MatMulJob, 8> jobs;
  int64_t num_jobs = 0;
  AddMatMulJobs(ctx, x, x_stride, M, W, y, y_stride, jobs, &num_jobs);
  kernels::MatMulGroup(jobs.data(), num_jobs, ctx.pool);
}

void AddMatMulJobs(const LayerContext& ctx, const float* x, int64_t x_stride, int64_t M,
                   const WeightMatrix& W, float* y, int64_t y_stride,
                   std::span<kernels::MatMulJob> jobs, int64_t* num_jobs) {
  CHECK_LE(*num_jobs + static_cast<int64_t>(W.blocks().size()),
           static_cast<int64_t>(jobs.size()));
  for (const WeightMatrix::Block& b : W.blocks()) {
    const Tensor& w = b.rows.view();
    jobs[(*num_jobs)++] = {x, x_stride, M, &w, y + b.first_row, y_stride,
                           ActivationsFor(w, ctx.ggml_activations)};
  }
}

}  // namespace moeserve::model
