// Per-target body of paged causal attention (kernels/attention.h), for inclusion from
// foreach_target translation units: kernels/attention.cc dispatches to it, and
// kernels/attention_test.cc calls it on every compiled target.
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"
#include "hwy/highway.h"
#include "kernels/attention.h"
// After highway.h: math-inl.h has its own per-target toggle guard.
#include "hwy/contrib/math/math-inl.h"

#if defined(MOESERVE_KERNELS_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_ATTENTION_INL_H_
#undef MOESERVE_KERNELS_ATTENTION_INL_H_
#else
#define MOESERVE_KERNELS_ATTENTION_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {

// Helpers live in their own namespace: other kernels' -inl.h files share HWY_NAMESPACE, and
// inline functions of the same name there would silently merge at link time.
namespace attn {

namespace hn = hwy::HWY_NAMESPACE;

// sum_i a[i] * b[i] in f32: four vector accumulators, then one, then a scalar tail. The order
// depends only on n and the target.
template <class D>
HWY_INLINE float Dot(D d, const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, size_t n) {
  const size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d);
  auto s1 = hn::Zero(d);
  auto s2 = hn::Zero(d);
  auto s3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(d, a + i + N), hn::LoadU(d, b + i + N), s1);
    s2 = hn::MulAdd(hn::LoadU(d, a + i + 2 * N), hn::LoadU(d, b + i + 2 * N), s2);
    s3 = hn::MulAdd(hn::LoadU(d, a + i + 3 * N), hn::LoadU(d, b + i + 3 * N), s3);
  }
  for (; i + N <= n; i += N) s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
  float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// acc[c .. c + kVecs * N) = corr * acc + sum_{j < n} p[j] * values[j * hd + c ..]: the running
// numerator of the online softmax, rescaled to the new maximum and extended by one tile.
// corr == 0 (first tile, or a jump in the maximum past f32's range) does not read acc.
// kVecs columns at once give kVecs independent FMA chains along j.
template <size_t kVecs, class D>
HWY_INLINE void AccumulateTile(D d, const float* HWY_RESTRICT p, size_t n,
                               const float* HWY_RESTRICT values, size_t hd, float corr,
                               float* HWY_RESTRICT acc) {
  using V = hn::Vec<D>;
  const size_t N = hn::Lanes(d);
  V a[kVecs];
  for (size_t u = 0; u < kVecs; ++u) {
    a[u] = corr == 0.0f ? hn::Zero(d) : hn::Mul(hn::Set(d, corr), hn::LoadU(d, acc + u * N));
  }
  for (size_t j = 0; j < n; ++j) {
    const V pj = hn::Set(d, p[j]);
    const float* HWY_RESTRICT row = values + j * hd;
    for (size_t u = 0; u < kVecs; ++u) a[u] = hn::MulAdd(pj, hn::LoadU(d, row + u * N), a[u]);
  }
  for (size_t u = 0; u < kVecs; ++u) hn::StoreU(a[u], d, acc + u * N);
}

template <class D>
HWY_INLINE void AccumulateValues(D d, const float* HWY_RESTRICT p, size_t n,
                                 const float* HWY_RESTRICT values, size_t hd, float corr,
                                 float* HWY_RESTRICT acc) {
  const size_t N = hn::Lanes(d);
  size_t c = 0;
  for (; c + 4 * N <= hd; c += 4 * N) AccumulateTile<4>(d, p, n, values + c, hd, corr, acc + c);
  for (; c + N <= hd; c += N) AccumulateTile<1>(d, p, n, values + c, hd, corr, acc + c);
  for (; c < hd; ++c) {
    float a = corr == 0.0f ? 0.0f : corr * acc[c];
    for (size_t j = 0; j < n; ++j) a += p[j] * values[j * hd + c];
    acc[c] = a;
  }
}

// Stack buffers of AttendOne (no heap use on the decode path, on any thread): one tile's
// scores, padded to whole vectors, and the output accumulator [hd].
inline constexpr size_t kMaxBlockSize = 256;
inline constexpr size_t kMaxHeadDim = 1024;

// One (token, head): query qh [hd] against keys 0 .. num_keys-1 of `kv_head`, into out [hd].
// Tiles are the cache blocks (keys [b * block_size, (b + 1) * block_size), the last one cut at
// num_keys), so the sequence of operations depends only on the query's position and the cache
// contents -- not on T, first_pos or the thread -- and the result is bit-for-bit the same in
// any call.
template <class D>
HWY_INLINE void AttendOne(D d, const float* HWY_RESTRICT qh, const PagedKvCache& cache,
                          const int32_t* block_table, size_t kv_head, size_t num_keys, float scale,
                          float* HWY_RESTRICT out) {
  using V = hn::Vec<D>;
  const size_t N = hn::Lanes(d);
  const size_t hd = static_cast<size_t>(cache.head_dim);
  const size_t bs = static_cast<size_t>(cache.block_size);
  const size_t num_kv_heads = static_cast<size_t>(cache.num_kv_heads);

  HWY_ALIGN float scores[kMaxBlockSize + HWY_MAX_BYTES / sizeof(float)];
  HWY_ALIGN float accumulator[kMaxHeadDim];
  float* HWY_RESTRICT s = scores;
  float* HWY_RESTRICT acc = accumulator;

  float m = -std::numeric_limits<float>::infinity();  // running max of the scores
  float l = 0.0f;                                     // running sum of exp(score - m)
  for (size_t b = 0; b * bs < num_keys; ++b) {
    const size_t n = std::min(bs, num_keys - b * bs);
    // This head's keys (and values) of the block: n contiguous rows of hd.
    const size_t offset = (static_cast<size_t>(block_table[b]) * num_kv_heads + kv_head) * bs * hd;
    const float* HWY_RESTRICT keys = cache.k + offset;
    const float* HWY_RESTRICT values = cache.v + offset;

    float tile_max = -std::numeric_limits<float>::infinity();
    for (size_t j = 0; j < n; ++j) {
      s[j] = Dot(d, qh, keys + j * hd, hd) * scale;
      tile_max = std::max(tile_max, s[j]);
    }
    const float m_new = std::max(m, tile_max);
    // exp(-inf) = 0 on the first tile.
    const float corr = std::exp(m - m_new);

    // p = exp(s - m_new) a vector at a time; lanes past n hold m_new (finite input for Exp) and
    // are zeroed before they reach the sum.
    const size_t n_padded = (n + N - 1) / N * N;
    std::fill(s + n, s + n_padded, m_new);
    const V vm = hn::Set(d, m_new);
    V vsum = hn::Zero(d);
    for (size_t c = 0; c < n_padded; c += N) {
      const V p =
          hn::IfThenElseZero(hn::FirstN(d, n - c), hn::Exp(d, hn::Sub(hn::LoadU(d, s + c), vm)));
      hn::StoreU(p, d, s + c);
      vsum = hn::Add(vsum, p);
    }
    l = l * corr + hn::GetLane(hn::SumOfLanes(d, vsum));
    AccumulateValues(d, s, n, values, hd, corr, acc);
    m = m_new;
  }

  // The diagonal key is always visible, so l >= 1.
  const float inv_l = 1.0f / l;
  for (size_t c = 0; c < hd; ++c) out[c] = acc[c] * inv_l;
}

}  // namespace attn

// Inline (not static) so that the copy in each including translation unit is the same entity;
// HWY_EXPORT takes its address, which forces an out-of-line definition per target.
inline void PagedAttentionImpl(const float* q, int64_t T, int64_t first_pos, int64_t num_heads,
                               const PagedKvCache& cache, const int32_t* block_table, float scale,
                               float* out, ThreadPool& pool) {
  namespace hn = hwy::HWY_NAMESPACE;
  CHECK_GE(first_pos, 0);
  CHECK(cache.block_size > 0 && cache.block_size <= static_cast<int64_t>(attn::kMaxBlockSize));
  CHECK(cache.head_dim > 0 && cache.head_dim <= static_cast<int64_t>(attn::kMaxHeadDim));
  CHECK_GT(cache.num_kv_heads, 0);
  CHECK_EQ(num_heads % cache.num_kv_heads, 0);
  if (T <= 0 || num_heads <= 0) return;
  const size_t heads = static_cast<size_t>(num_heads);
  const size_t group = heads / static_cast<size_t>(cache.num_kv_heads);
  const size_t hd = static_cast<size_t>(cache.head_dim);
  const size_t pos0 = static_cast<size_t>(first_pos);
  // Task = t * num_heads + h, which is also the row of q and out: [T][num_heads][hd].
  pool.ParallelFor(static_cast<size_t>(T) * heads, [&](size_t task, size_t /*thread*/) {
    const hn::ScalableTag<float> d;
    const size_t t = task / heads;
    const size_t h = task % heads;
    attn::AttendOne(d, q + task * hd, cache, block_table, h / group, pos0 + t + 1, scale,
                    out + task * hd);
  });
}

inline void PagedAttentionBatchImpl(const float* q, const PagedQueries& queries,
                                    int64_t num_heads, const PagedKvCache& cache, float scale,
                                    float* out, ThreadPool& pool) {
  namespace hn = hwy::HWY_NAMESPACE;
  CHECK(cache.block_size > 0 && cache.block_size <= static_cast<int64_t>(attn::kMaxBlockSize));
  CHECK(cache.head_dim > 0 && cache.head_dim <= static_cast<int64_t>(attn::kMaxHeadDim));
  CHECK_GT(cache.num_kv_heads, 0);
  CHECK_EQ(num_heads % cache.num_kv_heads, 0);
  if (queries.num_tokens <= 0 || num_heads <= 0) return;
  const size_t heads = static_cast<size_t>(num_heads);
  const size_t group = heads / static_cast<size_t>(cache.num_kv_heads);
  const size_t hd = static_cast<size_t>(cache.head_dim);
  // Task = i * num_heads + h, the row of q and out, as in PagedAttentionImpl.
  pool.ParallelFor(static_cast<size_t>(queries.num_tokens) * heads, [&](size_t task, size_t) {
    const hn::ScalableTag<float> d;
    const size_t i = task / heads;
    const size_t h = task % heads;
    const int32_t* table = queries.block_tables[queries.seq_of[i]];
    attn::AttendOne(d, q + task * hd, cache, table, h / group,
                    static_cast<size_t>(queries.positions[i]) + 1, scale, out + task * hd);
  });
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MOESERVE_KERNELS_ATTENTION_INL_H_
