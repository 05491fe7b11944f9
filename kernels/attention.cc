// Paged causal attention (kernels/attention.h) through Highway dynamic dispatch.

// foreach_target.h re-includes this file once per SIMD target; the kernel body lives in
// attention-inl.h so that the test can reach each target's version too.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/attention-inl.h"

#if HWY_ONCE

#include <cstdint>

#include "core/thread_pool.h"
#include "kernels/attention.h"

namespace moeserve::kernels {

HWY_EXPORT(PagedAttentionImpl);

void PagedAttention(const float* q, int64_t T, int64_t first_pos, int64_t num_heads,
                    const PagedKvCache& cache, const int32_t* block_table, float scale, float* out,
                    ThreadPool& pool) {
  HWY_DYNAMIC_DISPATCH(PagedAttentionImpl)
  (q, T, first_pos, num_heads, cache, block_table, scale, out, pool);
}

HWY_EXPORT(PagedAttentionBatchImpl);

void PagedAttentionBatch(const float* q, const PagedQueries& queries, int64_t num_heads,
                         const PagedKvCache& cache, float scale, float* out, ThreadPool& pool) {
  HWY_DYNAMIC_DISPATCH(PagedAttentionBatchImpl)(q, queries, num_heads, cache, scale, out, pool);
}

}  // namespace moeserve::kernels

#endif  // HWY_ONCE
