#include "engine/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <vector>

namespace moeserve::engine {

// Reaches into the manager to forge hash collisions and to audit the hash table.
class KvCacheManagerTestPeer {
 public:
  static uint64_t Hash(const KvCacheManager& m, int32_t block) { return m.blocks_[block].hash; }

  // Re-files a cached block under another hash, as if its tokens had hashed to that value.
  static void ForgeHash(KvCacheManager& m, int32_t block, uint64_t hash) {
    m.EraseFromTable(block);
    m.blocks_[block].hash = hash;
    m.InsertIntoTable(block);
  }

  // Every entry is a cached block reachable from its home slot (no empty slot on the way), and
  // every cached block has exactly one entry.
  static bool TableIsConsistent(const KvCacheManager& m) {
    int64_t entries = 0;
    for (size_t slot = 0; slot < m.table_.size(); ++slot) {
      const int32_t id = m.table_[slot];
      if (id < 0) continue;
      ++entries;
      if (m.blocks_[id].state != KvCacheManager::BlockState::kCached) return false;
      for (size_t s = m.HomeSlot(m.blocks_[id].hash); s != slot; s = (s + 1) & m.table_mask_) {
        if (m.table_[s] < 0) return false;
      }
    }
    const int64_t cached = std::count_if(m.blocks_.begin(), m.blocks_.end(), [](const auto& b) {
      return b.state == KvCacheManager::BlockState::kCached;
    });
    return entries == cached && entries == m.num_cached_blocks();
  }
};

namespace {

constexpr int64_t kBlockSize = 16;

// n consecutive token ids starting at first: distinct ids make distinct blocks.
std::vector<int32_t> Seq(int32_t first, int64_t n) {
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = first + static_cast<int32_t>(i);
  return tokens;
}

std::vector<int32_t> Concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> all;
  for (const auto& part : parts) all.insert(all.end(), part.begin(), part.end());
  return all;
}

KvCacheConfig Config(int64_t num_blocks, bool prefix_caching, int64_t block_size = kBlockSize) {
  return KvCacheConfig{.num_blocks = num_blocks,
                       .block_size = block_size,
                       .num_state_slots = 0,
                       .max_blocks_per_request = num_blocks,
                       .enable_prefix_caching = prefix_caching};
}

class KvCacheManagerTest : public ::testing::Test {
 protected:
  KvCacheManager& Make(const KvCacheConfig& config) {
    cache_ = std::make_unique<KvCacheManager>(config);
    return *cache_;
  }

  Request& NewRequest(std::vector<int32_t> prompt) {
    auto r = std::make_unique<Request>();
    r->id = static_cast<int64_t>(requests_.size());
    r->prompt_token_ids = std::move(prompt);
    cache_->ReserveFor(*r);
    requests_.push_back(std::move(r));
    return *requests_.back();
  }

  // What the scheduler and the runner do for a whole prompt in one step: take the cached
  // prefix, allocate the rest, compute it, publish the full blocks. Returns the hit tokens.
  int64_t Prefill(Request& r) {
    const int64_t hit_tokens = cache_->TakeCachedPrefix(r);
    r.num_computed_tokens = hit_tokens;
    EXPECT_TRUE(cache_->Allocate(r, r.num_tokens() - hit_tokens));
    r.num_computed_tokens = r.num_tokens();
    cache_->CacheFullBlocks(r);
    return hit_tokens;
  }

  // One decode step: the sampled token is appended, then computed in the next step.
  void Decode(Request& r, int32_t token) {
    r.output_token_ids.push_back(token);
    ASSERT_TRUE(cache_->Allocate(r, 1));
    r.num_computed_tokens += 1;
    cache_->CacheFullBlocks(r);
  }

  // Every test must give back everything it took.
  void TearDown() override {
    if (!cache_) return;
    EXPECT_EQ(cache_->num_used_blocks(), 0) << "blocks leaked";
    EXPECT_EQ(cache_->num_free_blocks(), cache_->config().num_blocks);
    EXPECT_EQ(cache_->num_used_state_slots(), 0) << "state slots leaked";
    EXPECT_TRUE(KvCacheManagerTestPeer::TableIsConsistent(*cache_));
  }

  std::unique_ptr<KvCacheManager> cache_;
  std::vector<std::unique_ptr<Request>> requests_;
};

TEST_F(KvCacheManagerTest, AllocatesBlocksForComputedPlusNewTokens) {
  KvCacheManager& cache = Make(Config(10, false));
  Request& r = NewRequest(Seq(0, 40));

  ASSERT_TRUE(cache.Allocate(r, 20));  // positions [0, 20): 2 blocks
  EXPECT_EQ(r.block_ids, (std::vector<int32_t>{0, 1}));
  r.num_computed_tokens = 20;
  ASSERT_TRUE(cache.Allocate(r, 12));  // [20, 32) still fits the 2 blocks
  EXPECT_EQ(r.block_ids.size(), 2u);
  ASSERT_TRUE(cache.Allocate(r, 20));  // [20, 40): a third block
  EXPECT_EQ(r.block_ids, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(cache.num_used_blocks(), 3);
  EXPECT_EQ(cache.num_free_blocks(), 7);
  EXPECT_DOUBLE_EQ(cache.usage(), 0.3);

  const size_t capacity = r.block_ids.capacity();
  cache.Free(r);
  EXPECT_TRUE(r.block_ids.empty());
  EXPECT_EQ(r.block_ids.capacity(), capacity);  // admission's reservation survives
  EXPECT_EQ(r.block_ids.capacity(), 10u);
  EXPECT_EQ(cache.usage(), 0.0);
}

TEST_F(KvCacheManagerTest, AllocateIsAllOrNothing) {
  KvCacheManager& cache = Make(Config(4, false));
  Request& a = NewRequest(Seq(0, 48));
  Request& b = NewRequest(Seq(100, 32));
  ASSERT_TRUE(cache.Allocate(a, 48));
  EXPECT_FALSE(cache.Allocate(b, 32));  // needs 2, 1 free
  EXPECT_TRUE(b.block_ids.empty());
  EXPECT_EQ(cache.num_free_blocks(), 1);
  EXPECT_TRUE(cache.Allocate(b, 16));
  cache.Free(a);
  cache.Free(b);
}

TEST_F(KvCacheManagerTest, StateSlotsAreHandedOutAndReturned) {
  KvCacheConfig config = Config(8, false);
  config.num_state_slots = 2;
  KvCacheManager& cache = Make(config);
  Request& a = NewRequest(Seq(0, 4));
  Request& b = NewRequest(Seq(10, 4));
  Request& c = NewRequest(Seq(20, 4));

  ASSERT_TRUE(cache.Allocate(a, 4));
  ASSERT_TRUE(cache.Allocate(b, 4));
  EXPECT_EQ(a.state_slot, 0);
  EXPECT_EQ(b.state_slot, 1);
  EXPECT_EQ(cache.num_used_state_slots(), 2);

  // No slot left: c gets nothing, not even blocks.
  EXPECT_FALSE(cache.Allocate(c, 4));
  EXPECT_EQ(c.state_slot, -1);
  EXPECT_TRUE(c.block_ids.empty());
  EXPECT_EQ(cache.num_used_blocks(), 2);

  // A request keeps its slot as it grows.
  a.num_computed_tokens = 4;
  ASSERT_TRUE(cache.Allocate(a, 20));
  EXPECT_EQ(a.state_slot, 0);
  EXPECT_EQ(cache.num_used_state_slots(), 2);

  cache.Free(a);
  EXPECT_EQ(a.state_slot, -1);
  EXPECT_EQ(cache.num_used_state_slots(), 1);
  ASSERT_TRUE(cache.Allocate(c, 4));
  EXPECT_EQ(c.state_slot, 0);
  cache.Free(b);
  cache.Free(c);
}

TEST_F(KvCacheManagerTest, FreeReturnsBlocksInReverseSoTailsAreReusedFirst) {
  KvCacheManager& cache = Make(Config(4, false));
  Request& a = NewRequest(Seq(0, 48));
  ASSERT_TRUE(cache.Allocate(a, 48));  // blocks 0, 1, 2; block 3 stays free
  cache.Free(a);                       // free queue: 3, then a's blocks tail first: 2, 1, 0
  Request& b = NewRequest(Seq(100, 64));
  ASSERT_TRUE(cache.Allocate(b, 64));
  EXPECT_EQ(b.block_ids, (std::vector<int32_t>{3, 2, 1, 0}));
  cache.Free(b);
}

TEST_F(KvCacheManagerTest, PrefixCachingOffTakesNothing) {
  KvCacheManager& cache = Make(Config(8, false));
  Request& a = NewRequest(Seq(0, 40));
  EXPECT_EQ(Prefill(a), 0);
  Request& b = NewRequest(Seq(0, 40));
  EXPECT_EQ(Prefill(b), 0);
  EXPECT_EQ(cache.num_cached_blocks(), 0);
  EXPECT_EQ(cache.prefix_cache_queries(), 0);
  cache.Free(a);
  cache.Free(b);
}

TEST_F(KvCacheManagerTest, SecondRequestSharesACachedThreeBlockPrefix) {
  KvCacheManager& cache = Make(Config(16, true));
  const std::vector<int32_t> prompt = Seq(1000, 3 * kBlockSize + 5);
  Request& a = NewRequest(prompt);
  EXPECT_EQ(Prefill(a), 0);
  EXPECT_EQ(cache.num_cached_blocks(), 3);  // the partial 4th block is not cached

  Request& b = NewRequest(prompt);
  EXPECT_EQ(Prefill(b), 3 * kBlockSize);
  ASSERT_EQ(b.block_ids.size(), 4u);
  EXPECT_TRUE(std::equal(b.block_ids.begin(), b.block_ids.begin() + 3, a.block_ids.begin()));
  EXPECT_NE(b.block_ids[3], a.block_ids[3]);
  // Shared blocks count once.
  EXPECT_EQ(cache.num_used_blocks(), 5);
  EXPECT_EQ(cache.prefix_cache_queries(), 2 * static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(cache.prefix_cache_hits(), 3 * kBlockSize);

  // Ref-counted: a's exit leaves the shared blocks in use by b.
  cache.Free(a);
  EXPECT_EQ(cache.num_used_blocks(), 4);
  cache.Free(b);
  EXPECT_EQ(cache.num_cached_blocks(), 3);  // free, still cached
}

TEST_F(KvCacheManagerTest, LastTokenIsAlwaysRecomputed) {
  KvCacheManager& cache = Make(Config(16, true));
  const std::vector<int32_t> prompt = Seq(1000, 3 * kBlockSize);  // exactly 3 full blocks
  Request& a = NewRequest(prompt);
  Prefill(a);
  EXPECT_EQ(cache.num_cached_blocks(), 3);

  // At most 47 tokens may come from the cache: the third block is recomputed whole.
  Request& b = NewRequest(prompt);
  EXPECT_EQ(Prefill(b), 2 * kBlockSize);
  EXPECT_EQ(b.block_ids.size(), 3u);
  EXPECT_NE(b.block_ids[2], a.block_ids[2]);
  cache.Free(a);
  cache.Free(b);
}

TEST_F(KvCacheManagerTest, FreedCachedBlocksAreReusedByALaterIdenticalPrefix) {
  KvCacheManager& cache = Make(Config(8, true));
  const std::vector<int32_t> prompt = Seq(7, 2 * kBlockSize + 1);
  Request& a = NewRequest(prompt);
  Prefill(a);
  const std::vector<int32_t> a_blocks = a.block_ids;
  cache.Free(a);
  EXPECT_EQ(cache.num_used_blocks(), 0);

  Request& b = NewRequest(prompt);
  EXPECT_EQ(Prefill(b), 2 * kBlockSize);
  EXPECT_EQ(b.block_ids[0], a_blocks[0]);
  EXPECT_EQ(b.block_ids[1], a_blocks[1]);
  EXPECT_EQ(cache.num_used_blocks(), 3);
  cache.Free(b);
}

TEST_F(KvCacheManagerTest, EvictsLeastRecentlyFreedBlocksTailFirst) {
  KvCacheManager& cache = Make(Config(6, true, /*block_size=*/4));
  const std::vector<int32_t> prompt_a = Seq(100, 9);  // 2 full blocks + 1 token
  const std::vector<int32_t> prompt_b = Seq(200, 9);
  Request& a = NewRequest(prompt_a);
  Request& b = NewRequest(prompt_b);
  Prefill(a);     // blocks 0, 1, 2
  Prefill(b);     // blocks 3, 4, 5
  cache.Free(a);  // free queue: 2 1 0
  cache.Free(b);  // free queue: 2 1 0 5 4 3
  EXPECT_EQ(cache.num_cached_blocks(), 4);

  // A fresh request takes the head of the queue: a's blocks, its tail first.
  Request& c = NewRequest(Seq(300, 8));
  ASSERT_TRUE(cache.Allocate(c, 8));
  EXPECT_EQ(c.block_ids, (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(cache.num_cached_blocks(), 3);  // a's second block was evicted when handed out

  // a's first block survived, its second did not; b is intact. (Lookups only: allocating
  // would evict more.)
  Request& a2 = NewRequest(prompt_a);
  EXPECT_EQ(cache.TakeCachedPrefix(a2), 4);
  EXPECT_EQ(a2.block_ids, (std::vector<int32_t>{0}));
  Request& b2 = NewRequest(prompt_b);
  EXPECT_EQ(cache.TakeCachedPrefix(b2), 8);
  EXPECT_EQ(b2.block_ids, (std::vector<int32_t>{3, 4}));
  cache.Free(a2);
  cache.Free(b2);
  cache.Free(c);
}

TEST_F(KvCacheManagerTest, AHitTakesAFreeBlockOffTheQueue) {
  KvCacheManager& cache = Make(Config(4, true, /*block_size=*/4));
  const std::vector<int32_t> prompt = Seq(100, 5);
  Request& a = NewRequest(prompt);
  Prefill(a);  // blocks 0 (cached), 1
  cache.Free(a);

  Request& b = NewRequest(prompt);
  EXPECT_EQ(Prefill(b), 4);
  EXPECT_EQ(b.block_ids[0], 0);
  // Block 0 is in use now: a request taking every other block cannot evict it.
  Request& c = NewRequest(Seq(500, 8));
  ASSERT_TRUE(cache.Allocate(c, 8));
  EXPECT_EQ(cache.num_free_blocks(), 0);
  EXPECT_FALSE(std::count(c.block_ids.begin(), c.block_ids.end(), 0));
  EXPECT_EQ(cache.num_cached_blocks(), 1);
  cache.Free(b);
  cache.Free(c);
}

TEST_F(KvCacheManagerTest, HashesAreChainedThroughThePrefix) {
  KvCacheManager& cache = Make(Config(32, true));
  const std::vector<int32_t> x = Seq(100, kBlockSize);
  const std::vector<int32_t> y = Seq(200, kBlockSize);
  const std::vector<int32_t> z = Seq(300, kBlockSize);
  const std::vector<int32_t> w = Seq(400, kBlockSize);
  const std::vector<int32_t> tail = {1};
  Request& a = NewRequest(Concat({x, y, z, tail}));
  Prefill(a);

  // The same blocks after a different first block are different blocks.
  Request& b = NewRequest(Concat({w, y, z, tail}));
  EXPECT_EQ(Prefill(b), 0);
  // A shared first block hits; the same third block after a different second one does not.
  Request& c = NewRequest(Concat({x, w, z, tail}));
  EXPECT_EQ(Prefill(c), kBlockSize);
  cache.Free(a);
  cache.Free(b);
  cache.Free(c);
}

TEST_F(KvCacheManagerTest, DifferentTokensNeverHit) {
  KvCacheManager& cache = Make(Config(32, true));
  std::vector<int32_t> prompt = Seq(100, 2 * kBlockSize + 1);
  Request& a = NewRequest(prompt);
  Prefill(a);
  // One token changed in the first block, then in the second.
  prompt[kBlockSize - 1] += 1000;
  Request& b = NewRequest(prompt);
  EXPECT_EQ(Prefill(b), 0);
  prompt[kBlockSize - 1] -= 1000;
  prompt[kBlockSize] += 1000;
  Request& c = NewRequest(prompt);
  EXPECT_EQ(Prefill(c), kBlockSize);
  cache.Free(a);
  cache.Free(b);
  cache.Free(c);
}

TEST_F(KvCacheManagerTest, AHashCollisionNeverReturnsAnotherBlock) {
  // Learn the hash block y gets, from a second manager (hashes do not depend on the pool).
  const std::vector<int32_t> x = Concat({Seq(100, kBlockSize), {1}});
  const std::vector<int32_t> y = Concat({Seq(900, kBlockSize), {1}});
  KvCacheManager probe(Config(4, true));
  Request py;
  py.prompt_token_ids = y;
  ASSERT_TRUE(probe.Allocate(py, static_cast<int64_t>(y.size())));
  py.num_computed_tokens = py.num_tokens();
  probe.CacheFullBlocks(py);
  const uint64_t y_hash = KvCacheManagerTestPeer::Hash(probe, py.block_ids[0]);
  probe.Free(py);

  // Cache x's block, then file it under y's hash: a lookup of y lands on it and must see that
  // the tokens differ.
  KvCacheManager& cache = Make(Config(8, true));
  Request& a = NewRequest(x);
  Prefill(a);
  ASSERT_EQ(cache.num_cached_blocks(), 1);
  KvCacheManagerTestPeer::ForgeHash(cache, a.block_ids[0], y_hash);
  ASSERT_TRUE(KvCacheManagerTestPeer::TableIsConsistent(cache));

  Request& b = NewRequest(y);
  EXPECT_EQ(Prefill(b), 0);
  EXPECT_NE(b.block_ids[0], a.block_ids[0]);
  // y's own block is cached beside the forged entry (same hash, told apart by the tokens).
  EXPECT_EQ(cache.num_cached_blocks(), 2);
  Request& c = NewRequest(y);
  EXPECT_EQ(Prefill(c), kBlockSize);
  EXPECT_EQ(c.block_ids[0], b.block_ids[0]);
  cache.Free(a);
  cache.Free(b);
  cache.Free(c);
}

TEST_F(KvCacheManagerTest, AChainHashCollisionNeverReturnsABlockFromAnotherPrefix) {
  const std::vector<int32_t> x = Seq(100, kBlockSize);
  const std::vector<int32_t> w = Seq(200, kBlockSize);
  const std::vector<int32_t> z = Seq(300, kBlockSize);
  // The hash a lookup of [w, z] computes for its second block.
  KvCacheManager probe(Config(4, true));
  Request pwz;
  pwz.prompt_token_ids = Concat({w, z, {1}});
  ASSERT_TRUE(probe.Allocate(pwz, pwz.num_tokens()));
  pwz.num_computed_tokens = pwz.num_tokens();
  probe.CacheFullBlocks(pwz);
  const uint64_t wz_hash = KvCacheManagerTestPeer::Hash(probe, pwz.block_ids[1]);
  probe.Free(pwz);

  // z cached after x, then filed under the hash of z after w: same tokens, same hash, but its
  // KV was computed after another prefix.
  KvCacheManager& cache = Make(Config(8, true));
  Request& a = NewRequest(Concat({x, z, {1}}));
  Prefill(a);
  Request& b = NewRequest(Concat({w, {1}}));
  Prefill(b);
  KvCacheManagerTestPeer::ForgeHash(cache, a.block_ids[1], wz_hash);

  Request& c = NewRequest(Concat({w, z, {1}}));
  EXPECT_EQ(Prefill(c), kBlockSize);  // w only
  EXPECT_EQ(c.block_ids[0], b.block_ids[0]);
  EXPECT_NE(c.block_ids[1], a.block_ids[1]);
  cache.Free(a);
  cache.Free(b);
  cache.Free(c);
}

TEST_F(KvCacheManagerTest, DuplicateBlocksKeepTheFirstAndChainThroughIt) {
  KvCacheManager& cache = Make(Config(16, true, /*block_size=*/4));
  const std::vector<int32_t> prompt = Seq(100, 9);  // 2 full blocks + 1 token
  // The same prompt prefilled concurrently: both miss, both compute.
  Request& a = NewRequest(prompt);
  Request& b = NewRequest(prompt);
  ASSERT_TRUE(cache.Allocate(a, 9));
  ASSERT_TRUE(cache.Allocate(b, 9));
  a.num_computed_tokens = b.num_computed_tokens = 9;
  cache.CacheFullBlocks(a);
  cache.CacheFullBlocks(b);
  EXPECT_EQ(cache.num_cached_blocks(), 2);  // a's copies; b's stay uncached

  // b decodes until its third block is full; that block continues the cached prefix.
  for (int32_t token : {1, 2, 3}) Decode(b, token);
  EXPECT_EQ(cache.num_cached_blocks(), 3);

  Request& c = NewRequest(Concat({prompt, {1, 2, 3}, {4}}));
  EXPECT_EQ(Prefill(c), 12);
  EXPECT_EQ(c.block_ids[0], a.block_ids[0]);
  EXPECT_EQ(c.block_ids[1], a.block_ids[1]);
  EXPECT_EQ(c.block_ids[2], b.block_ids[2]);
  cache.Free(a);
  cache.Free(b);
  cache.Free(c);
}

// A child refers to its parent by block id and generation: once the parent's block is recycled
// for other tokens, the child is unreachable even through a hash collision.
TEST_F(KvCacheManagerTest, ARecycledParentBlockNeverAdoptsItsOldChildren) {
  constexpr int64_t kSmall = 4;
  const std::vector<int32_t> prompt = Seq(100, 2 * kSmall + 1);  // x y t
  const std::vector<int32_t> other = Seq(500, 2 * kSmall + 1);   // x' y' t'
  const std::vector<int32_t> outputs = {1, 2, 3};
  // The hash a lookup of [x' y' (t 1 2 3)] computes for its third block.
  KvCacheManager probe(Config(4, true, kSmall));
  Request p;
  p.prompt_token_ids =
      Concat({std::vector<int32_t>(other.begin(), other.end() - 1), {prompt.back()}, outputs, {9}});
  ASSERT_TRUE(probe.Allocate(p, p.num_tokens()));
  p.num_computed_tokens = p.num_tokens();
  probe.CacheFullBlocks(p);
  const uint64_t forged_hash = KvCacheManagerTestPeer::Hash(probe, p.block_ids[2]);
  probe.Free(p);

  KvCacheManager& cache = Make(Config(6, true, kSmall));
  // a and b prefill the same prompt concurrently: a's blocks 0 (x) and 1 (y) are cached; b
  // decodes and publishes its third block c = (t 1 2 3) as the child of block 1.
  Request& a = NewRequest(prompt);
  Request& b = NewRequest(prompt);
  ASSERT_TRUE(cache.Allocate(a, a.num_tokens()));
  ASSERT_TRUE(cache.Allocate(b, b.num_tokens()));
  a.num_computed_tokens = b.num_computed_tokens = a.num_tokens();
  cache.CacheFullBlocks(a);
  cache.CacheFullBlocks(b);
  for (const int32_t token : outputs) Decode(b, token);
  ASSERT_EQ(cache.num_cached_blocks(), 3);
  const int32_t child = b.block_ids[2];

  // a leaves; its blocks are recycled for x' y', block 1 now holding y'.
  cache.Free(a);
  Request& recycled = NewRequest(other);
  Prefill(recycled);
  ASSERT_EQ(recycled.block_ids[1], 1);

  // A lookup of [x' y' (t 1 2 3)] reaches block 1 and, through the forged hash, the old child
  // with exactly its tokens: the generation tells them apart.
  KvCacheManagerTestPeer::ForgeHash(cache, child, forged_hash);
  Request& c = NewRequest(p.prompt_token_ids);
  EXPECT_EQ(cache.TakeCachedPrefix(c), 2 * kSmall);
  cache.Free(b);
  cache.Free(recycled);
  cache.Free(c);
}

TEST_F(KvCacheManagerTest, OutputTokensFillCachedBlocks) {
  KvCacheManager& cache = Make(Config(8, true, /*block_size=*/4));
  Request& a = NewRequest(Seq(100, 6));
  Prefill(a);
  EXPECT_EQ(cache.num_cached_blocks(), 1);
  Decode(a, 7);  // position 6 computed: [4, 8) not full yet (the sampled token is not computed)
  EXPECT_EQ(cache.num_cached_blocks(), 1);
  Decode(a, 8);  // position 7 computed: block 1 full
  EXPECT_EQ(cache.num_cached_blocks(), 2);

  Request& b = NewRequest(Concat({Seq(100, 6), {7, 8}, {9}}));
  EXPECT_EQ(Prefill(b), 8);
  cache.Free(a);
  cache.Free(b);
}

TEST_F(KvCacheManagerTest, ResetForgetsEveryPrefix) {
  KvCacheManager& cache = Make(Config(8, true, /*block_size=*/4));
  const std::vector<int32_t> prompt = Seq(100, 9);
  Request& a = NewRequest(prompt);
  Prefill(a);
  Request& gone = NewRequest(Seq(500, 5));
  Prefill(gone);
  cache.Free(gone);
  EXPECT_EQ(cache.num_cached_blocks(), 3);

  cache.ResetPrefixCache();
  EXPECT_EQ(cache.num_cached_blocks(), 0);
  Request& b = NewRequest(prompt);
  EXPECT_EQ(Prefill(b), 0);
  // b published the prefix again (a's blocks are in use, but uncached since the reset).
  EXPECT_EQ(cache.num_cached_blocks(), 2);
  cache.Free(a);
  cache.Free(b);
}

// Random traffic over a small pool with heavily shared prefixes. Every hit must hold exactly the
// tokens (whole prefix included) the request asked for, and the hash table must stay consistent
// through thousands of insertions and backward-shift deletions.
TEST_F(KvCacheManagerTest, RandomTrafficOnlyEverHitsIdenticalPrefixes) {
  constexpr int64_t kSmallBlock = 2;
  KvCacheManager& cache = Make(Config(24, true, kSmallBlock));
  std::mt19937 rng(1234);
  // What each block holds: the request's tokens from position 0 to the block's end.
  std::map<int32_t, std::vector<int32_t>> content;
  std::vector<Request*> live;
  int64_t hits = 0;

  for (int iter = 0; iter < 4000; ++iter) {
    if (!live.empty() && (live.size() >= 4 || rng() % 2 == 0)) {
      const size_t victim = rng() % live.size();
      cache.Free(*live[victim]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
      continue;
    }
    // 1-4 blocks plus a partial one, over a 2-token vocabulary: prefixes collide constantly.
    std::vector<int32_t> prompt(kSmallBlock * (1 + rng() % 4) + 1);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 2);
    Request& r = NewRequest(prompt);
    const int64_t hit_tokens = cache.TakeCachedPrefix(r);
    hits += hit_tokens;
    r.num_computed_tokens = hit_tokens;
    if (!cache.Allocate(r, r.num_tokens() - hit_tokens)) {
      cache.Free(r);
      continue;
    }
    for (size_t b = 0; b < r.block_ids.size(); ++b) {
      const auto end = std::min(prompt.begin() + static_cast<std::ptrdiff_t>((b + 1) * kSmallBlock),
                                prompt.end());
      std::vector<int32_t> expected(prompt.begin(), end);
      if (static_cast<int64_t>(b * kSmallBlock) < hit_tokens) {
        ASSERT_EQ(content[r.block_ids[b]], expected) << "wrong KV served at iteration " << iter;
      } else {
        content[r.block_ids[b]] = std::move(expected);
      }
    }
    r.num_computed_tokens = r.num_tokens();
    cache.CacheFullBlocks(r);
    live.push_back(&r);
    ASSERT_TRUE(KvCacheManagerTestPeer::TableIsConsistent(cache)) << "iteration " << iter;
  }
  for (Request* r : live) cache.Free(*r);
  EXPECT_GT(hits, 0);
  EXPECT_EQ(cache.prefix_cache_hits(), hits);
}

}  // namespace
}  // namespace moeserve::engine

// ---- hybrid models: GDN state checkpoints ----------------------------------------------------

namespace moeserve::engine {
namespace {

KvCacheConfig HybridConfig(int64_t num_blocks, int64_t num_checkpoints, int64_t interval = 0,
                           bool keys_next_token = false) {
  return KvCacheConfig{.num_blocks = num_blocks,
                       .block_size = kBlockSize,
                       .num_state_slots = 4,
                       .max_blocks_per_request = num_blocks,
                       .enable_prefix_caching = true,
                       .num_checkpoints = num_checkpoints,
                       .checkpoint_alignment = 64,
                       .checkpoint_interval = interval,
                       .checkpoint_keys_next_token = keys_next_token,
                       .max_num_seqs = 4};
}

class CheckpointTest : public KvCacheManagerTest {
 protected:
  // A prompt prefilled in chunks ending where the manager says, with a checkpoint chance after
  // each (as the scheduler does); returns the tokens the cache supplied.
  int64_t ChunkedPrefill(Request& r) {
    const int64_t hit = cache_->TakeCachedPrefix(r);
    r.num_computed_tokens = hit;
    while (r.num_computed_tokens < r.num_tokens()) {
      const int64_t end =
          cache_->CheckpointChunkEnd(r, r.num_computed_tokens, r.num_tokens());
      EXPECT_TRUE(cache_->Allocate(r, end - r.num_computed_tokens));
      r.num_computed_tokens = end;
      cache_->CacheFullBlocks(r);
      cache_->MaybeCheckpoint(r, end);
    }
    cache_->ReleaseRestore(r);
    return hit;
  }

  std::vector<StateCopy> TakeCopies() {
    std::vector<StateCopy> copies = cache_->pending_copies();
    cache_->ClearPendingCopies();
    return copies;
  }
};

TEST_F(CheckpointTest, PrefillStopsAtTheJunctionAndIntervalsAndCheckpointsThere) {
  KvCacheManager& cache = Make(HybridConfig(64, 8, /*interval=*/128));
  Request& a = NewRequest(Seq(0, 300));
  EXPECT_EQ(cache.CheckpointChunkEnd(a, 0, 300), 128);    // interval
  EXPECT_EQ(cache.CheckpointChunkEnd(a, 128, 300), 256);  // interval and junction (floor 300)
  EXPECT_EQ(cache.CheckpointChunkEnd(a, 256, 300), 300);
  EXPECT_EQ(ChunkedPrefill(a), 0);
  const std::vector<StateCopy> copies = TakeCopies();
  ASSERT_EQ(copies.size(), 2u);  // at 128 and 256, from a's slot into checkpoint slots
  EXPECT_EQ(copies[0].from, a.state_slot);
  EXPECT_GE(copies[0].to, 4);
  EXPECT_EQ(cache.num_checkpoints(), 2);

  // The same prompt again resumes at 256; one diverging at 200 resumes at 128.
  Request& same = NewRequest(Seq(0, 300));
  EXPECT_EQ(ChunkedPrefill(same), 256);
  Request& shorter = NewRequest(Concat({Seq(0, 200), Seq(1000, 50)}));
  EXPECT_EQ(cache.TakeCachedPrefix(shorter), 128);
  EXPECT_EQ(shorter.restore_state_slot, copies[0].to);
  EXPECT_EQ(cache.num_pinned_checkpoints(), 1);
  cache.Free(shorter);
  EXPECT_EQ(cache.num_pinned_checkpoints(), 0);
  for (Request* r : {&a, &same}) cache.Free(*r);
}

// A second request sharing 100 tokens with the first finds their blocks but no checkpoint on
// them (the first one's junction is past the divergence): it takes one at 64, where the shared
// part ends, and a third sharer resumes there.
TEST_F(CheckpointTest, ASecondSharerCheckpointsWhereThePrefixDiverges) {
  KvCacheManager& cache = Make(HybridConfig(64, 8));
  Request& a = NewRequest(Concat({Seq(0, 100), Seq(1000, 50)}));
  EXPECT_EQ(ChunkedPrefill(a), 0);  // checkpoint at 128 (its own junction)
  Request& b = NewRequest(Concat({Seq(0, 100), Seq(2000, 30)}));
  EXPECT_EQ(cache.TakeCachedPrefix(b), 0);
  EXPECT_EQ(b.shared_prefix_junction, 64);  // 96 tokens of cached blocks, aligned down
  EXPECT_EQ(cache.CheckpointChunkEnd(b, 0, 130), 64);
  cache.Free(b);
  EXPECT_EQ(ChunkedPrefill(b), 0);
  Request& c = NewRequest(Concat({Seq(0, 100), Seq(3000, 20)}));
  EXPECT_EQ(ChunkedPrefill(c), 64);
  TakeCopies();
  for (Request* r : {&a, &b, &c}) cache.Free(*r);
}

TEST_F(CheckpointTest, OutputEndReplacesTheRequestsEarlierOutputCheckpoint) {
  KvCacheManager& cache = Make(HybridConfig(64, 3));
  Request& r = NewRequest(Seq(0, 70));
  ChunkedPrefill(r);  // junction at 64
  int32_t token = 5000;
  while (r.num_computed_tokens < 260) {
    Decode(r, token++);
    cache.MaybeCheckpoint(r, r.num_computed_tokens);
  }
  // 64 (prompt), then 128, 192, 256 while decoding: three slots, so the earlier output ones
  // went first, never the prompt's.
  EXPECT_EQ(cache.num_checkpoints(), 3);
  Request& follow = NewRequest(Concat({Seq(0, 70), Seq(5000, 190), Seq(9000, 10)}));
  EXPECT_EQ(cache.TakeCachedPrefix(follow), 256);
  cache.Free(follow);
  Request& other = NewRequest(Concat({Seq(0, 70), Seq(7000, 10)}));
  EXPECT_EQ(cache.TakeCachedPrefix(other), 64);
  cache.Free(other);
  cache.Free(r);
}

TEST_F(CheckpointTest, MtpCheckpointsMatchOnlyTheSameNextToken) {
  KvCacheManager& cache = Make(HybridConfig(64, 4, 0, /*keys_next_token=*/true));
  Request& a = NewRequest(Seq(0, 100));  // junction 64, next token 64
  ChunkedPrefill(a);
  Request& same_next = NewRequest(Concat({Seq(0, 65), Seq(3000, 5)}));
  EXPECT_EQ(cache.TakeCachedPrefix(same_next), 64);
  cache.Free(same_next);
  Request& other_next = NewRequest(Concat({Seq(0, 64), Seq(3000, 5)}));
  EXPECT_EQ(cache.TakeCachedPrefix(other_next), 0);
  cache.Free(other_next);
  cache.Free(a);
}

TEST_F(CheckpointTest, PinnedCheckpointsSurviveAndEvictedBlocksDropTheirs) {
  KvCacheManager& cache = Make(HybridConfig(16, 1));
  Request& a = NewRequest(Seq(0, 70));
  ChunkedPrefill(a);
  EXPECT_EQ(TakeCopies().size(), 1u);
  cache.Free(a);
  ASSERT_EQ(cache.num_checkpoints(), 1);
  Request& b = NewRequest(Concat({Seq(0, 64), Seq(500, 10)}));
  ASSERT_EQ(cache.TakeCachedPrefix(b), 64);  // pins the only checkpoint
  // Another prompt wants a checkpoint: the only one is pinned, so none is taken.
  Request& c = NewRequest(Seq(2000, 70));
  ChunkedPrefill(c);
  EXPECT_TRUE(TakeCopies().empty());
  EXPECT_EQ(cache.num_pinned_checkpoints(), 1);
  cache.Free(b);
  cache.Free(c);
  // Filling the pool evicts the blocks, and the checkpoint with its block.
  Request& big = NewRequest(Seq(4000, 16 * 16 - 1));
  ASSERT_TRUE(cache.Allocate(big, big.num_tokens()));
  EXPECT_EQ(cache.num_checkpoints(), 0);
  cache.Free(big);
  Request& again = NewRequest(Seq(0, 70));
  EXPECT_EQ(cache.TakeCachedPrefix(again), 0);
  cache.Free(again);
  cache.ResetPrefixCache();
}

}  // namespace
}  // namespace moeserve::engine
