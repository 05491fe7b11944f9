// Causal attention of new query tokens over a paged KV cache: one sequence's, or a flat token
// batch spanning many sequences.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace moeserve::kernels {

// One layer's KV cache: a pool of blocks, each holding block_size token positions.
// k and v: [num_blocks][num_kv_heads][block_size][head_dim] f32, so that one head's keys of a
// block are contiguous. Logical block b of a sequence is physical block block_table[b]; position
// p lives in slot p % block_size of logical block p / block_size. Limits of the kernels (their
// buffers live on the stack): block_size <= 256, head_dim <= 1024.
struct PagedKvCache {
  float* k;
  float* v;
  int64_t num_blocks;
  int64_t block_size;
  int64_t num_kv_heads;
  int64_t head_dim;
};

// Pointer to the key (or value) vector of `kv_head` at `position` of a sequence.
inline float* KvRow(float* base, const PagedKvCache& c, const int32_t* block_table,
                    int64_t position, int64_t kv_head) {
  const int64_t block = block_table[position / c.block_size];
  return base + ((block * c.num_kv_heads + kv_head) * c.block_size + position % c.block_size) *
                    c.head_dim;
}

// T query tokens at absolute positions first_pos .. first_pos + T - 1; query t attends to keys
// 0 .. first_pos + t, which must already be in the cache. q and out: [T][num_heads][head_dim].
// Query head h reads KV head h / (num_heads / num_kv_heads) (GQA). Scores are scaled by `scale`;
// softmax in f32 with online rescaling over key tiles of block_size at fixed absolute positions,
// so a query's result does not depend on T or first_pos of the call (batch invariance).
// Work is split over (token, head) pairs on the pool.
void PagedAttention(const float* q, int64_t T, int64_t first_pos, int64_t num_heads,
                    const PagedKvCache& cache, const int32_t* block_table, float scale,
                    float* out, ThreadPool& pool);

// The queries of a flat token batch spanning many sequences: query i sits at absolute position
// positions[i] of sequence seq_of[i], whose block table is block_tables[seq_of[i]], and attends
// to that sequence's keys 0 .. positions[i].
struct PagedQueries {
  int64_t num_tokens;
  const int64_t* positions;             // [num_tokens]
  const int32_t* seq_of;                // [num_tokens]
  const int32_t* const* block_tables;   // [number of sequences]
};

// PagedAttention over a flat token batch: q and out [num_tokens][num_heads][head_dim]. Each
// query's result is bit-for-bit what PagedAttention gives it alone (same tiles, same order).
// One join for the whole batch.
void PagedAttentionBatch(const float* q, const PagedQueries& queries, int64_t num_heads,
                         const PagedKvCache& cache, float scale, float* out, ThreadPool& pool);

}  // namespace moeserve::kernels
