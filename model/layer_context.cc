#include "model/layer_context.h"

#include <algorithm>

#include "model/layer_util.h"

namespace moeserve::model {

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
