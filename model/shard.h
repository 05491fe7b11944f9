// How one rank of a tensor / expert parallel group holds its part of the model (--tp N, --ep).
//
// Split along heads and widths so that each rank's layers are the single-rank layers at smaller
// sizes, followed by one all-reduce of their [T, H] output (Megatron's column- then row-parallel
// pairs):
//   - full attention: query heads split; KV heads split when --tp divides them, else replicated
//     when their number divides --tp (each rank keeps the one KV head its query heads read, as
//     vLLM does); o_proj split by its input columns;
//   - Gated DeltaNet: value heads split; key heads split like KV heads (split or replicated),
//     the conv channels and the delta-rule state following their heads; out_proj by columns;
//   - MoE: the router replicated; routed experts either each split by intermediate width (plain
//     TP) or held whole by one rank (--ep: contiguous blocks of num_experts / tp); the shared
//     expert split by width under plain TP, whole on every rank under --ep (each runs it for
//     the tokens it owns); dense MLPs split by intermediate width;
//   - embedding and lm_head vocab-parallel: rank r holds rows [r Vp, min(V, (r + 1) Vp)),
//     Vp = ceil(V / tp); embedding rows outside are zero before an all-reduce, logits are
//     gathered (or only (max, index) pairs exchanged for greedy rows);
//   - norms, the MTP head's fc and everything per token of width H replicated.
// Each rank's `local` config carries the divided head counts and widths, so layer code, caches
// and scratch plans read their sizes from it unchanged; vocab_size and num_experts stay global.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "io/model_config.h"

namespace moeserve::model {

struct ShardSpec {
  int rank = 0;
  int size = 1;                  // --tp
  bool expert_parallel = false;  // --ep: experts split whole across the ranks
};

// A contiguous range of heads (or rows, experts, vocabulary entries) of the global model.
struct Range {
  int64_t begin = 0;
  int64_t count = 0;
  int64_t end() const { return begin + count; }
  bool contains(int64_t i) const { return i >= begin && i < end(); }
};

struct ShardLayout {
  ShardSpec spec;
  io::ModelConfig local;  // this rank's sizes (see above)
  Range q_heads, kv_heads;                  // full attention
  Range gdn_key_heads, gdn_value_heads;     // Gated DeltaNet
  Range mlp, moe, shared;                   // intermediate columns of dense / expert / shared
  Range experts;                            // routed experts held (all of them without --ep)
  Range vocab;                              // embedding / lm_head rows held
  int64_t vocab_stride = 0;                 // Vp: every rank's logits shard padded to it

  bool single() const { return spec.size == 1; }
  bool holds_expert(int64_t e) const { return experts.contains(e); }
};

// The layout of rank spec.rank. A split that does not work is an InvalidArgument naming both
// numbers ("--tp 3 does not divide num_attention_heads (4)").
Result<ShardLayout> MakeShardLayout(const io::ModelConfig& global, const ShardSpec& spec);

}  // namespace moeserve::model
