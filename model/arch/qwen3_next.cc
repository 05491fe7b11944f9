#include "model/arch/qwen3_next.h"

namespace moeserve::model::qwen3_next {

// Interleaved layout (HF fix_query_key_value_ordering): nk groups of
// Wg = 2 dk + 2 r dv rows, r = nv / nk; group g holds [q_g (dk) | k_g (dk) | v of value heads
// g r .. g r + r - 1 (r dv) | z of the same heads (r dv)].
std::vector<int64_t> QkvzSourceRows(const io::ModelConfig& c) {
  const int64_t nk = c.linear_num_key_heads, dk = c.linear_key_head_dim;
  const int64_t dv = c.linear_value_head_dim, r = c.linear_num_value_heads / nk;
  const int64_t group = 2 * dk + 2 * r * dv;
  std::vector<int64_t> rows;
  rows.reserve(nk * group);
  for (int64_t g = 0; g < nk; ++g) {  // q_all: key head g
    for (int64_t d = 0; d < dk; ++d) rows.push_back(g * group + d);
  }
  for (int64_t g = 0; g < nk; ++g) {  // k_all
    for (int64_t d = 0; d < dk; ++d) rows.push_back(g * group + dk + d);
  }
  for (int64_t g = 0; g < nk; ++g) {  // v_all: value heads g r + j
    for (int64_t j = 0; j < r; ++j) {
      for (int64_t d = 0; d < dv; ++d) rows.push_back(g * group + 2 * dk + j * dv + d);
    }
  }
  for (int64_t g = 0; g < nk; ++g) {  // z_all
    for (int64_t j = 0; j < r; ++j) {
      for (int64_t d = 0; d < dv; ++d) rows.push_back(g * group + 2 * dk + r * dv + j * dv + d);
    }
  }
  return rows;
}

// in_proj_ba: nk groups of 2r rows [b of heads g r .. g r + r - 1 | a of the same heads].
std::vector<int64_t> BaSourceRows(const io::ModelConfig& c) {
  const int64_t nk = c.linear_num_key_heads, r = c.linear_num_value_heads / nk;
  std::vector<int64_t> rows;
  for (int64_t g = 0; g < nk; ++g) {  // b_all
    for (int64_t j = 0; j < r; ++j) rows.push_back(g * 2 * r + j);
  }
  for (int64_t g = 0; g < nk; ++g) {  // a_all
    for (int64_t j = 0; j < r; ++j) rows.push_back(g * 2 * r + r + j);
  }
  return rows;
}

}  // namespace moeserve::model::qwen3_next
