#include "model/shard.h"

#include <string_view>

namespace moeserve::model {
namespace {

// Heads split across `tp` ranks, or replicated when fewer than the ranks (each rank keeps the
// head r * n / tp); `what` names the count in errors.
Result<Range> SplitOrReplicate(int64_t n, int tp, int rank, std::string_view what) {
  if (n % tp == 0) return Range{rank * (n / tp), n / tp};
  if (tp % n == 0) return Range{rank * n / tp, 1};
  return InvalidArgument(
      "--tp {} and {} ({}): neither divides the other (heads are split when --tp divides their "
      "number, replicated when their number divides --tp)",
      tp, what, n);
}

Result<Range> Split(int64_t n, int tp, int rank, std::string_view what) {
  if (n % tp != 0) return InvalidArgument("--tp {} does not divide {} ({})", tp, what, n);
  return Range{rank * (n / tp), n / tp};
}

// The key heads that value heads `v` read when value head p reads key head p % nk (a qwen35moe
// GGUF file's tiled order): all nk when v spans whole rounds of nk, else the v.count heads from
// v.begin % nk. Either way the rank's own heads are tiled again (local value head i reads local
// key head i % local nk), so its slices stay contiguous ranges.
Result<Range> TiledKeyHeads(int64_t nk, Range v) {
  if (v.begin % nk == 0 && v.count % nk == 0) return Range{0, nk};
  if (nk % v.count == 0) return Range{v.begin % nk, v.count};
  return InvalidArgument(
      "--tp: each rank's {} linear value heads neither cover whole rounds of the {} key heads nor "
      "divide them (a tiled-order GGUF file's value head p reads key head p % {})",
      v.count, nk, nk);
}

}  // namespace

Result<ShardLayout> MakeShardLayout(const io::ModelConfig& g, const ShardSpec& spec) {
  const int tp = spec.size;
  if (tp < 1) return InvalidArgument("--tp must be at least 1 (got {})", tp);
  if (spec.rank < 0 || spec.rank >= tp) {
    return InvalidArgument("rank {} is outside a group of {}", spec.rank, tp);
  }
  if (spec.expert_parallel && g.num_experts == 0) {
    return InvalidArgument("--ep: the model has no routed experts");
  }
  const int r = spec.rank;
  ShardLayout s;
  s.spec = spec;
  s.local = g;
  io::ModelConfig& c = s.local;

  const bool any_attention = g.num_layers_of(io::LayerType::kFullAttention) > 0 ||
                             g.num_mtp_layers > 0;
  if (any_attention) {
    ASSIGN_OR_RETURN(s.q_heads, Split(g.num_attention_heads, tp, r, "num_attention_heads"));
    ASSIGN_OR_RETURN(s.kv_heads,
                     SplitOrReplicate(g.num_key_value_heads, tp, r, "num_key_value_heads"));
    c.num_attention_heads = s.q_heads.count;
    c.num_key_value_heads = s.kv_heads.count;
  }
  if (g.num_layers_of(io::LayerType::kLinearAttention) > 0) {
    ASSIGN_OR_RETURN(s.gdn_value_heads,
                     Split(g.linear_num_value_heads, tp, r, "linear_num_value_heads"));
    if (g.gguf.gdn_v_heads_tiled) {
      ASSIGN_OR_RETURN(s.gdn_key_heads, TiledKeyHeads(g.linear_num_key_heads, s.gdn_value_heads));
    } else {
      ASSIGN_OR_RETURN(s.gdn_key_heads,
                       SplitOrReplicate(g.linear_num_key_heads, tp, r, "linear_num_key_heads"));
    }
    c.linear_num_value_heads = s.gdn_value_heads.count;
    c.linear_num_key_heads = s.gdn_key_heads.count;
  }
  bool any_dense = false, any_moe = false;
  for (int64_t i = 0; i < g.num_hidden_layers; ++i) (g.IsMoeLayer(i) ? any_moe : any_dense) = true;
  if (g.num_mtp_layers > 0) (g.num_experts > 0 ? any_moe : any_dense) = true;
  if (any_dense) {
    ASSIGN_OR_RETURN(s.mlp, Split(g.intermediate_size, tp, r, "intermediate_size"));
    c.intermediate_size = s.mlp.count;
  }
  s.experts = Range{0, g.num_experts};
  if (any_moe) {
    if (spec.expert_parallel) {
      if (g.num_experts % tp != 0) {
        return InvalidArgument("--tp {} with --ep does not divide num_experts ({})", tp,
                               g.num_experts);
      }
      s.experts = Range{r * (g.num_experts / tp), g.num_experts / tp};
      s.moe = Range{0, g.moe_intermediate_size};
    } else {
      ASSIGN_OR_RETURN(s.moe, Split(g.moe_intermediate_size, tp, r, "moe_intermediate_size"));
    }
    c.moe_intermediate_size = s.moe.count;
    // The shared expert: split by width under plain TP; whole on every rank under --ep, where
    // every rank runs it for every token (model/moe.cc).
    s.shared = Range{0, g.shared_expert_intermediate_size};
    if (g.shared_expert_intermediate_size > 0 && !spec.expert_parallel) {
      ASSIGN_OR_RETURN(s.shared, Split(g.shared_expert_intermediate_size, tp, r,
                                       "shared_expert_intermediate_size"));
    }
    c.shared_expert_intermediate_size = s.shared.count;
  }
  s.vocab_stride = (g.vocab_size + tp - 1) / tp;
  const int64_t v0 = std::min<int64_t>(g.vocab_size, r * s.vocab_stride);
  s.vocab = Range{v0, std::min<int64_t>(g.vocab_size, v0 + s.vocab_stride) - v0};
  return s;
}

}  // namespace moeserve::model
