// Scalar twin of kernels/attention.h: plain softmax over all visible keys, double accumulation.
#pragma once

#include <cstdint>

#include "kernels/attention.h"

namespace moeserve::kernels::ref {

void PagedAttention(const float* q, int64_t T, int64_t first_pos, int64_t num_heads,
                    const PagedKvCache& cache, const int32_t* block_table, float scale,
                    float* out);

}  // namespace moeserve::kernels::ref
