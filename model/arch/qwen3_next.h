// What is particular to Qwen3-Next among the hybrid models: its fused GDN input projections are
// interleaved per key-head group (docs/spec/model.md §3.c.1). Qwen3.5-MoE stores them split;
// moeserve loads both into the split order and runs one code path.
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"

namespace moeserve::model::qwen3_next {

// For each row of the split layout [q_all | k_all | v_all | z_all] (2 key_dim + 2 value_dim
// rows), the row of the interleaved in_proj_qkvz it comes from.
std::vector<int64_t> QkvzSourceRows(const io::ModelConfig& config);
// The same for [b_all | a_all] (2 nv rows) from the interleaved in_proj_ba.
std::vector<int64_t> BaSourceRows(const io::ModelConfig& config);

}  // namespace moeserve::model::qwen3_next
