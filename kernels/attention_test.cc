// Paged causal attention: the SIMD kernel on every compiled target against the double-precision
// twin, its batch invariance (bit for bit), the dispatched entry point, and the twin against
// values worked by hand.

#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/ref/attention_ref.h"

// Target-independent helpers, compiled once although foreach_target.h re-includes this file.
#ifndef MOESERVE_KERNELS_ATTENTION_TEST_HELPERS_
#define MOESERVE_KERNELS_ATTENTION_TEST_HELPERS_
namespace moeserve::kernels::attn_test {

// One sequence's KV cache: positions [0, num_positions) hold N(0, 1) keys and values, spread
// over physical blocks in shuffled order with spare blocks between them. Everything else --
// spare blocks, slots past the last position -- is NaN, so a kernel that reads a key it must not
// see poisons its output.
class CacheFixture {
 public:
  CacheFixture(int64_t num_kv_heads, int64_t head_dim, int64_t block_size, int64_t num_positions,
               uint32_t seed) {
    const int64_t logical = (num_positions + block_size - 1) / block_size;
    cache_.num_blocks = logical + 3;
    cache_.block_size = block_size;
    cache_.num_kv_heads = num_kv_heads;
    cache_.head_dim = head_dim;
    const size_t floats = cache_.num_blocks * num_kv_heads * block_size * head_dim;
    k_.assign(floats, std::numeric_limits<float>::quiet_NaN());
    v_.assign(floats, std::numeric_limits<float>::quiet_NaN());
    cache_.k = k_.data();
    cache_.v = v_.data();

    std::mt19937 rng(seed);
    std::vector<int32_t> physical(cache_.num_blocks);
    std::iota(physical.begin(), physical.end(), 0);
    std::shuffle(physical.begin(), physical.end(), rng);
    table_.assign(physical.begin(), physical.begin() + logical);

    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t p = 0; p < num_positions; ++p) {
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        float* key = KvRow(cache_.k, cache_, table_.data(), p, h);
        float* value = KvRow(cache_.v, cache_, table_.data(), p, h);
        for (int64_t d = 0; d < head_dim; ++d) key[d] = normal(rng);
        for (int64_t d = 0; d < head_dim; ++d) value[d] = normal(rng);
      }
    }
  }

  const PagedKvCache& cache() const { return cache_; }
  PagedKvCache& mutable_cache() { return cache_; }
  const int32_t* table() const { return table_.data(); }

  // Largest |value| over the stored positions: outputs are convex combinations of values, so
  // this is their scale.
  double MaxAbsValue() const {
    double m = 0.0;
    for (float x : v_) {
      if (!std::isnan(x)) m = std::max(m, std::fabs(static_cast<double>(x)));
    }
    return m;
  }

 private:
  PagedKvCache cache_{};
  std::vector<float> k_, v_;
  std::vector<int32_t> table_;
};

inline std::vector<float> RandomQueries(int64_t T, int64_t num_heads, int64_t head_dim,
                                        uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(T * num_heads * head_dim);
  for (float& x : q) x = normal(rng);
  return q;
}

// max |got - want| over all entries, NaN counting as infinite.
inline double MaxAbsDiff(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double m = 0.0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(diff <= m)) m = std::isnan(diff) ? INFINITY : diff;
  }
  return m;
}

struct HeadConfig {
  int64_t num_heads, num_kv_heads;
};
inline constexpr HeadConfig kHeadConfigs[] = {{4, 2}, {16, 2}, {8, 8}, {2, 1}};
inline constexpr int64_t kHeadDims[] = {16, 64, 256};
inline constexpr int64_t kBlockSizes[] = {16, 4, 5};
inline constexpr int64_t kTokenCounts[] = {1, 3, 17};
inline constexpr int64_t kFirstPositions[] = {0, 1, 15, 16, 40};

}  // namespace moeserve::kernels::attn_test
#endif  // MOESERVE_KERNELS_ATTENTION_TEST_HELPERS_

// foreach_target.h re-includes this file once per target; the per-target tests below call that
// target's PagedAttentionImpl from attention-inl.h directly, not through the dispatcher.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/tests/test_util-inl.h"
#include "kernels/attention-inl.h"

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {
namespace {

using namespace attn_test;  // NOLINT(build/namespaces): test helpers only

HWY_NOINLINE void TestAttentionMatchesRef() {
  ThreadPool pool(2);
  uint32_t seed = 1;
  for (const HeadConfig& heads : kHeadConfigs) {
    for (int64_t hd : kHeadDims) {
      for (int64_t bs : kBlockSizes) {
        for (int64_t T : kTokenCounts) {
          for (int64_t first_pos : kFirstPositions) {
            const CacheFixture fx(heads.num_kv_heads, hd, bs, first_pos + T, ++seed);
            const std::vector<float> q = RandomQueries(T, heads.num_heads, hd, ++seed);
            const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
            std::vector<float> want(q.size()), got(q.size());
            ref::PagedAttention(q.data(), T, first_pos, heads.num_heads, fx.cache(), fx.table(),
                                scale, want.data());
            PagedAttentionImpl(q.data(), T, first_pos, heads.num_heads, fx.cache(), fx.table(),
                               scale, got.data(), pool);
            ASSERT_LE(MaxAbsDiff(got, want), 1e-5 * fx.MaxAbsValue())
                << hwy::TargetName(HWY_TARGET) << " heads=" << heads.num_heads << "/"
                << heads.num_kv_heads << " hd=" << hd << " bs=" << bs << " T=" << T
                << " first_pos=" << first_pos;
          }
        }
      }
    }
  }
}

HWY_NOINLINE void TestSharpSoftmaxMatchesRef() {
  // Scale 1 instead of 1/sqrt(hd): scores spread over tens, so the running maximum jumps between
  // tiles and most weights underflow. Score errors grow with their size, hence 1e-4.
  ThreadPool pool(2);
  for (int64_t hd : {16, 256}) {
    for (int64_t bs : {4, 16}) {
      const int64_t T = 17, first_pos = 40;
      const CacheFixture fx(2, hd, bs, first_pos + T, static_cast<uint32_t>(hd + bs));
      const std::vector<float> q = RandomQueries(T, 8, hd, static_cast<uint32_t>(hd * bs));
      std::vector<float> want(q.size()), got(q.size());
      ref::PagedAttention(q.data(), T, first_pos, 8, fx.cache(), fx.table(), 1.0f, want.data());
      PagedAttentionImpl(q.data(), T, first_pos, 8, fx.cache(), fx.table(), 1.0f, got.data(), pool);
      EXPECT_LE(MaxAbsDiff(got, want), 1e-4 * fx.MaxAbsValue())
          << hwy::TargetName(HWY_TARGET) << " hd=" << hd << " bs=" << bs;
    }
  }
}

HWY_NOINLINE void TestMonotoneScoresAcrossTiles() {
  // Keys along the query with score 3p (the maximum moves up in every tile, by more than f32's
  // exp range in total) and -3p (the first tile keeps the maximum).
  ThreadPool pool(2);
  const int64_t hd = 16, bs = 4, num_positions = 41;
  for (float sign : {1.0f, -1.0f}) {
    CacheFixture fx(1, hd, bs, num_positions, 7);
    for (int64_t p = 0; p < num_positions; ++p) {
      float* key = KvRow(fx.mutable_cache().k, fx.cache(), fx.table(), p, 0);
      for (int64_t d = 0; d < hd; ++d) key[d] = d == 0 ? sign * 3.0f * p : 0.01f * key[d];
    }
    std::vector<float> q(hd, 0.0f);
    q[0] = 1.0f;
    std::vector<float> want(hd), got(hd);
    for (int64_t pos : {0, 3, 4, 5, 22, 40}) {
      ref::PagedAttention(q.data(), 1, pos, 1, fx.cache(), fx.table(), 1.0f, want.data());
      PagedAttentionImpl(q.data(), 1, pos, 1, fx.cache(), fx.table(), 1.0f, got.data(), pool);
      EXPECT_LE(MaxAbsDiff(got, want), 1e-5 * fx.MaxAbsValue())
          << hwy::TargetName(HWY_TARGET) << " sign=" << sign << " pos=" << pos;
    }
  }
}

HWY_NOINLINE void TestBatchInvariance() {
  // A query's output must not depend on the call it is part of: token t of a T = 17 call equals,
  // bit for bit, the same query alone (T = 1 at first_pos + t), the same token in a call split
  // differently, and the same call on one thread.
  ThreadPool pool1(1), pool2(2);
  uint32_t seed = 5000;
  for (const HeadConfig& heads : {HeadConfig{16, 2}, HeadConfig{2, 1}}) {
    for (int64_t hd : {64, 256}) {
      for (int64_t bs : {16, 5}) {
        for (int64_t first_pos : {0, 15, 40}) {
          const int64_t T = 17, H = heads.num_heads;
          const CacheFixture fx(heads.num_kv_heads, hd, bs, first_pos + T, ++seed);
          const std::vector<float> q = RandomQueries(T, H, hd, ++seed);
          const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
          const size_t row = H * hd;  // floats of one token's q / out
          std::vector<float> batch(q.size()), single(row), split(q.size()), serial(q.size());
          PagedAttentionImpl(q.data(), T, first_pos, H, fx.cache(), fx.table(), scale, batch.data(),
                             pool2);
          PagedAttentionImpl(q.data(), T, first_pos, H, fx.cache(), fx.table(), scale,
                             serial.data(), pool1);
          // Split as 6 + 11 tokens.
          PagedAttentionImpl(q.data(), 6, first_pos, H, fx.cache(), fx.table(), scale, split.data(),
                             pool2);
          PagedAttentionImpl(q.data() + 6 * row, T - 6, first_pos + 6, H, fx.cache(), fx.table(),
                             scale, split.data() + 6 * row, pool2);
          const auto where = [&] {
            return ::testing::Message()
                   << hwy::TargetName(HWY_TARGET) << " heads=" << H << "/" << heads.num_kv_heads
                   << " hd=" << hd << " bs=" << bs << " first_pos=" << first_pos;
          };
          EXPECT_EQ(0, std::memcmp(batch.data(), serial.data(), q.size() * sizeof(float)))
              << where();
          EXPECT_EQ(0, std::memcmp(batch.data(), split.data(), q.size() * sizeof(float)))
              << where();
          for (int64_t t = 0; t < T; ++t) {
            PagedAttentionImpl(q.data() + t * row, 1, first_pos + t, H, fx.cache(), fx.table(),
                               scale, single.data(), pool2);
            EXPECT_EQ(0, std::memcmp(single.data(), batch.data() + t * row, row * sizeof(float)))
                << where() << " t=" << t;
          }
        }
      }
    }
  }
}

// A flat batch of three sequences sharing one cache (different block tables, interleaved
// phases: a prefill chunk, a single decode token, a chunk at the start) gives every query
// exactly the bits PagedAttentionImpl gives it alone.
void TestBatchOfSequencesMatchesSingle() {
  ThreadPool pool(2);
  uint32_t seed = 7000;
  for (const HeadConfig& heads : kHeadConfigs) {
    for (int64_t bs : {16, 5}) {
      const int64_t hd = 64, H = heads.num_heads, P = 6 * bs;  // whole blocks only
      const CacheFixture fx(heads.num_kv_heads, hd, bs, P, ++seed);
      const int64_t num_blocks = P / bs;
      // Sequence 0: the fixture's table; 1: reversed; 2: rotated by two blocks.
      std::vector<std::vector<int32_t>> tables(3, std::vector<int32_t>(fx.table(), fx.table() + num_blocks));
      std::reverse(tables[1].begin(), tables[1].end());
      std::rotate(tables[2].begin(), tables[2].begin() + 2, tables[2].end());
      const int32_t* table_ptrs[3] = {tables[0].data(), tables[1].data(), tables[2].data()};
      // (sequence, first position, token count) in batch order.
      const int64_t parts[][3] = {{0, P - 7, 7}, {1, P - 1, 1}, {2, 0, 3}, {1, 2 * bs - 1, 2}};
      std::vector<int64_t> positions;
      std::vector<int32_t> seq_of;
      for (const auto& part : parts) {
        for (int64_t t = 0; t < part[2]; ++t) {
          positions.push_back(part[1] + t);
          seq_of.push_back(static_cast<int32_t>(part[0]));
        }
      }
      const int64_t N = static_cast<int64_t>(positions.size());
      const std::vector<float> q = RandomQueries(N, H, hd, ++seed);
      const float scale = 1.0f / 8.0f;
      std::vector<float> batch(q.size()), single(H * hd);
      const PagedQueries queries{N, positions.data(), seq_of.data(), table_ptrs};
      PagedAttentionBatchImpl(q.data(), queries, H, fx.cache(), scale, batch.data(), pool);
      for (int64_t i = 0; i < N; ++i) {
        PagedAttentionImpl(q.data() + i * H * hd, 1, positions[i], H, fx.cache(),
                           table_ptrs[seq_of[i]], scale, single.data(), pool);
        EXPECT_EQ(0, std::memcmp(single.data(), batch.data() + i * H * hd, H * hd * sizeof(float)))
            << hwy::TargetName(HWY_TARGET) << " heads=" << H << " bs=" << bs << " query " << i;
      }
    }
  }
}

}  // namespace
}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

namespace moeserve::kernels {

HWY_BEFORE_TEST(PagedAttentionTargetTest);
HWY_EXPORT_AND_TEST_P(PagedAttentionTargetTest, TestAttentionMatchesRef);
HWY_EXPORT_AND_TEST_P(PagedAttentionTargetTest, TestSharpSoftmaxMatchesRef);
HWY_EXPORT_AND_TEST_P(PagedAttentionTargetTest, TestMonotoneScoresAcrossTiles);
HWY_EXPORT_AND_TEST_P(PagedAttentionTargetTest, TestBatchInvariance);
HWY_EXPORT_AND_TEST_P(PagedAttentionTargetTest, TestBatchOfSequencesMatchesSingle);

namespace {

using namespace attn_test;  // NOLINT(build/namespaces): test helpers only

TEST(PagedAttentionTest, DispatchedMatchesRef) {
  ThreadPool pool(2);
  const int64_t H = 16, Hkv = 2, hd = 256, bs = 16, T = 17, first_pos = 40;
  const CacheFixture fx(Hkv, hd, bs, first_pos + T, 1);
  const std::vector<float> q = RandomQueries(T, H, hd, 2);
  const float scale = 1.0f / 16.0f;
  std::vector<float> want(q.size()), got(q.size());
  ref::PagedAttention(q.data(), T, first_pos, H, fx.cache(), fx.table(), scale, want.data());
  PagedAttention(q.data(), T, first_pos, H, fx.cache(), fx.table(), scale, got.data(), pool);
  EXPECT_LE(MaxAbsDiff(got, want), 1e-5 * fx.MaxAbsValue());
}

TEST(PagedAttentionTest, OneJoinPerCall) {
  ThreadPool pool(2);
  const CacheFixture fx(2, 64, 16, 20, 3);
  const std::vector<float> q = RandomQueries(4, 8, 64, 4);
  std::vector<float> out(q.size());
  const uint64_t before = pool.barrier_count();
  PagedAttention(q.data(), 4, 16, 8, fx.cache(), fx.table(), 0.125f, out.data(), pool);
  EXPECT_EQ(pool.barrier_count(), before + 1);
}

TEST(RefPagedAttentionTest, ByHand) {
  // One head, hd = 2, block_size 1 (so the two positions sit in separate, swapped blocks).
  // k0 = (1, 0), k1 = (0, 0); v0 = (1, 2), v1 = (3, 4); q = (1, 0) for both tokens, scale 2.
  //   token 0 sees key 0 only: out = v0.
  //   token 1: scores (2, 0), weights (e^2, 1) / (e^2 + 1).
  float k[4] = {0.0f, 0.0f, 1.0f, 0.0f};  // physical block 0 holds position 1
  float v[4] = {3.0f, 4.0f, 1.0f, 2.0f};
  const PagedKvCache cache{k,
                           v,
                           /*num_blocks=*/2,
                           /*block_size=*/1,
                           /*num_kv_heads=*/1,
                           /*head_dim=*/2};
  const int32_t table[2] = {1, 0};
  const float q[4] = {1.0f, 0.0f, 1.0f, 0.0f};
  float out[4];
  ref::PagedAttention(q, 2, 0, 1, cache, table, 2.0f, out);
  EXPECT_FLOAT_EQ(out[0], 1.0f);
  EXPECT_FLOAT_EQ(out[1], 2.0f);
  const double w0 = std::exp(2.0) / (std::exp(2.0) + 1.0), w1 = 1.0 / (std::exp(2.0) + 1.0);
  EXPECT_FLOAT_EQ(out[2], static_cast<float>(w0 * 1.0 + w1 * 3.0));
  EXPECT_FLOAT_EQ(out[3], static_cast<float>(w0 * 2.0 + w1 * 4.0));

  // The SIMD kernel agrees on the same tiny case.
  ThreadPool pool(1);
  float got[4];
  PagedAttention(q, 2, 0, 1, cache, table, 2.0f, got, pool);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[i], out[i], 1e-6f) << i;
}

TEST(RefPagedAttentionTest, GqaMapsConsecutiveHeadsToOneKvHead) {
  // 4 query heads on 2 KV heads: heads 0, 1 read KV head 0 and heads 2, 3 read KV head 1. With
  // a single visible key the output is that key's value, which names the KV head.
  const CacheFixture fx(2, 4, 4, 1, 9);
  const std::vector<float> q = RandomQueries(1, 4, 4, 10);
  std::vector<float> out(q.size());
  ref::PagedAttention(q.data(), 1, 0, 4, fx.cache(), fx.table(), 0.5f, out.data());
  for (int64_t h = 0; h < 4; ++h) {
    const float* value = KvRow(fx.cache().v, fx.cache(), fx.table(), 0, h / 2);
    for (int64_t d = 0; d < 4; ++d) EXPECT_FLOAT_EQ(out[h * 4 + d], value[d]) << h << " " << d;
  }
}

}  // namespace
}  // namespace moeserve::kernels

#endif  // HWY_ONCE
