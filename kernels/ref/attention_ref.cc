#include "kernels/ref/attention_ref.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/check.h"

namespace moeserve::kernels::ref {

void PagedAttention(const float* q, int64_t T, int64_t first_pos, int64_t num_heads,
                    const PagedKvCache& cache, const int32_t* block_table, float scale,
                    float* out) {
  CHECK_GE(first_pos, 0);
  CHECK_GT(cache.num_kv_heads, 0);
  CHECK_EQ(num_heads % cache.num_kv_heads, 0);
  const int64_t hd = cache.head_dim;
  const int64_t group = num_heads / cache.num_kv_heads;
  std::vector<double> scores;
  std::vector<double> acc(hd);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t num_keys = first_pos + t + 1;  // causal: keys 0 .. first_pos + t
    scores.resize(num_keys);
    for (int64_t h = 0; h < num_heads; ++h) {
      const float* qh = q + (t * num_heads + h) * hd;
      const int64_t kv_head = h / group;
      // One plain softmax over every visible key, all in double.
      double max_score = -INFINITY;
      for (int64_t p = 0; p < num_keys; ++p) {
        const float* key = KvRow(cache.k, cache, block_table, p, kv_head);
        double dot = 0.0;
        for (int64_t d = 0; d < hd; ++d) dot += static_cast<double>(qh[d]) * key[d];
        scores[p] = dot * scale;
        max_score = std::max(max_score, scores[p]);
      }
      double denom = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t p = 0; p < num_keys; ++p) {
        const double w = std::exp(scores[p] - max_score);
        denom += w;
        const float* value = KvRow(cache.v, cache, block_table, p, kv_head);
        for (int64_t d = 0; d < hd; ++d) acc[d] += w * value[d];
      }
      float* o = out + (t * num_heads + h) * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = static_cast<float>(acc[d] / denom);
    }
  }
}

}  // namespace moeserve::kernels::ref
