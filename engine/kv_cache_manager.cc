#include "engine/kv_cache_manager.h"

#include <algorithm>
#include <bit>

#include "core/check.h"

namespace moeserve::engine {
namespace {

// Hash of the empty prefix: the parent hash of every request's block 0. Fixed (vLLM draws
// NONE_HASH at random): matches are verified token by token, so the seed need not be secret.
constexpr uint64_t kRootHash = 0x6a09e667f3bcc908ULL;  // fractional bits of sqrt(2)
constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ULL;

// splitmix64's finalizer: a bijection of 64-bit words with full avalanche.
uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

KvCacheManager::KvCacheManager(const KvCacheConfig& config) : config_(config) {
  CHECK_GE(config.num_blocks, 1);
  CHECK_LE(config.num_blocks, int64_t{INT32_MAX});
  CHECK_GE(config.block_size, 1);
  CHECK_GE(config.num_state_slots, 0);
  CHECK_GE(config.max_blocks_per_request, 1);

  // Every block starts free, handed out in id order.
  blocks_.resize(config.num_blocks);
  for (int32_t id = 0; id < config.num_blocks; ++id) PushFreeTail(id);

  // Slot 0 is handed out first; the last num_spec_state_slots are the drafts'.
  CHECK(config.num_spec_state_slots >= 0 && config.num_spec_state_slots <= config.num_state_slots);
  const int64_t main_slots = config.num_state_slots - config.num_spec_state_slots;
  free_state_slots_.reserve(config.num_state_slots);
  free_spec_slots_.reserve(config.num_spec_state_slots);
  for (int64_t slot = config.num_state_slots - 1; slot >= 0; --slot) {
    (slot < main_slots ? free_state_slots_ : free_spec_slots_)
        .push_back(static_cast<int32_t>(slot));
  }

  CHECK_GE(config.num_checkpoints, 0);
  if (config.num_checkpoints > 0) {
    CHECK(config.enable_prefix_caching && config.num_state_slots > 0);
    CHECK_GT(config.checkpoint_alignment, 0);
    CHECK_EQ(config.checkpoint_alignment % config.block_size, 0);
    CHECK_EQ(config.checkpoint_interval % config.checkpoint_alignment, 0);
    checkpoints_.resize(config.num_checkpoints);
    free_checkpoints_.reserve(config.num_checkpoints);
    for (int64_t c = config.num_checkpoints - 1; c >= 0; --c) {
      free_checkpoints_.push_back(static_cast<int32_t>(c));
    }
    pending_copies_.reserve(config.max_num_seqs);
  }

  if (config.enable_prefix_caching) {
    cached_tokens_.resize(config.num_blocks * config.block_size);
    // At most num_blocks entries, so the load factor stays <= 1/2 and probes stay short (and
    // always end at an empty slot).
    const size_t capacity = std::bit_ceil(static_cast<size_t>(2 * config.num_blocks));
    table_.assign(capacity, -1);
    table_mask_ = capacity - 1;
  }
}

void KvCacheManager::ReserveFor(Request& r) const {
  r.block_ids.reserve(config_.max_blocks_per_request);
  r.spec_state_slots.reserve(config_.spec_state_slots_per_request);
}

// ---- free queue -------------------------------------------------------------------------------

void KvCacheManager::PushFreeTail(int32_t id) {
  Block& b = blocks_[id];
  b.prev_free = free_tail_;
  b.next_free = -1;
  if (free_tail_ >= 0) {
    blocks_[free_tail_].next_free = id;
  } else {
    free_head_ = id;
  }
  free_tail_ = id;
  ++num_free_blocks_;
}

void KvCacheManager::RemoveFromFreeQueue(int32_t id) {
  Block& b = blocks_[id];
  if (b.prev_free >= 0) {
    blocks_[b.prev_free].next_free = b.next_free;
  } else {
    free_head_ = b.next_free;
  }
  if (b.next_free >= 0) {
    blocks_[b.next_free].prev_free = b.prev_free;
  } else {
    free_tail_ = b.prev_free;
  }
  b.prev_free = b.next_free = -1;
  --num_free_blocks_;
}

int32_t KvCacheManager::PopFreeHead() {
  const int32_t id = free_head_;
  CHECK_GE(id, 0) << "free queue is empty";
  RemoveFromFreeQueue(id);
  return id;
}

void KvCacheManager::Touch(int32_t id) {
  if (blocks_[id].ref_count == 0) RemoveFromFreeQueue(id);
  ++blocks_[id].ref_count;
}

int32_t KvCacheManager::TakeFreeBlock() {
  const int32_t id = PopFreeHead();
  Uncache(id);  // the lazy eviction: a free block keeps its prefix until handed out again
  blocks_[id].ref_count = 1;
  return id;
}

// ---- allocation -------------------------------------------------------------------------------

bool KvCacheManager::Allocate(Request& r, int64_t num_new_tokens) {
  CHECK_GE(num_new_tokens, 0);
  const int64_t blocks_needed = CeilDiv(r.num_computed_tokens + num_new_tokens, config_.block_size);
  CHECK_LE(blocks_needed, config_.max_blocks_per_request)
      << "request " << r.id << " would outgrow max_blocks_per_request";
  const int64_t new_blocks =
      std::max<int64_t>(0, blocks_needed - static_cast<int64_t>(r.block_ids.size()));
  const bool needs_state_slot = config_.num_state_slots > 0 && r.state_slot < 0;

  // All or nothing: check everything before taking anything.
  if (new_blocks > num_free_blocks_) return false;
  if (needs_state_slot && free_state_slots_.empty()) return false;

  for (int64_t i = 0; i < new_blocks; ++i) r.block_ids.push_back(TakeFreeBlock());
  if (needs_state_slot) {
    r.state_slot = free_state_slots_.back();
    free_state_slots_.pop_back();
  }
  // Draft slots: a whole set or none (then no drafts: DraftProposer's limit).
  const int64_t K = config_.spec_state_slots_per_request;
  if (r.state_slot >= 0 && K > 0 && r.spec_state_slots.empty() &&
      static_cast<int64_t>(free_spec_slots_.size()) >= K) {
    for (int64_t i = 0; i < K; ++i) {
      r.spec_state_slots.push_back(free_spec_slots_.back());
      free_spec_slots_.pop_back();
    }
  }
  return true;
}

void KvCacheManager::Free(Request& r) {
  // Reverse order: the request's last blocks join the free queue first, so they are evicted
  // before its first ones -- a prefix stays findable longer than its continuations.
  for (auto it = r.block_ids.rbegin(); it != r.block_ids.rend(); ++it) {
    Block& b = blocks_[*it];
    CHECK_GT(b.ref_count, 0) << "block " << *it << " freed twice";
    if (--b.ref_count == 0) PushFreeTail(*it);
  }
  r.block_ids.clear();  // keeps the capacity reserved at admission

  if (r.state_slot >= 0) {
    // Slots are alike: a verify step may have traded the request's slot with a draft's, so the
    // pools keep their sizes, not their ids.
    for (auto it = r.spec_state_slots.rbegin(); it != r.spec_state_slots.rend(); ++it) {
      free_spec_slots_.push_back(*it);
    }
    r.spec_state_slots.clear();
    CHECK_LE(static_cast<int64_t>(free_state_slots_.size()),
             config_.num_state_slots - config_.num_spec_state_slots - 1)
        << "state slot " << r.state_slot << " freed twice";
    free_state_slots_.push_back(r.state_slot);
    r.state_slot = -1;
  }
  ReleaseRestore(r);
}

// ---- prefix cache -----------------------------------------------------------------------------

KvCacheManager::BlockRef KvCacheManager::IdentityOf(int32_t id) const {
  const Block& b = blocks_[id];
  DCHECK(b.state != BlockState::kUncached);
  if (b.state == BlockState::kCached) return BlockRef{id, b.generation};
  return b.same_as;
}

bool KvCacheManager::IsLive(const BlockRef& ref) const {
  if (ref.id == kRootId) return true;
  if (ref.id == kBrokenId) return false;
  const Block& b = blocks_[ref.id];
  return b.state == BlockState::kCached && b.generation == ref.generation;
}

uint64_t KvCacheManager::HashBlock(uint64_t parent_hash, const Request& r,
                                   int64_t block_index) const {
  // Absorb one token per round. Each round is a bijection of the state, so two blocks that
  // differ in a single token always hash differently.
  uint64_t h = parent_hash;
  const int64_t first = block_index * config_.block_size;
  for (int64_t pos = first; pos < first + config_.block_size; ++pos) {
    h = Mix64(h + kGoldenGamma + static_cast<uint32_t>(r.token_at(pos)));
  }
  return h;
}

int32_t KvCacheManager::FindCached(uint64_t hash, const BlockRef& parent, const Request& r,
                                   int64_t block_index) const {
  const int64_t first = block_index * config_.block_size;
  for (size_t slot = HomeSlot(hash); table_[slot] >= 0; slot = (slot + 1) & table_mask_) {
    const int32_t id = table_[slot];
    const Block& b = blocks_[id];
    if (b.hash != hash || !(b.parent == parent)) continue;
    // The hash only narrows the search; the prefix identity and the tokens decide.
    const int32_t* tokens = &cached_tokens_[id * config_.block_size];
    bool same_tokens = true;
    for (int64_t i = 0; i < config_.block_size && same_tokens; ++i) {
      same_tokens = tokens[i] == r.token_at(first + i);
    }
    if (same_tokens) return id;
  }
  return -1;
}

void KvCacheManager::InsertIntoTable(int32_t id) {
  size_t slot = HomeSlot(blocks_[id].hash);
  while (table_[slot] >= 0) slot = (slot + 1) & table_mask_;
  table_[slot] = id;
}

void KvCacheManager::EraseFromTable(int32_t id) {
  size_t hole = HomeSlot(blocks_[id].hash);
  while (table_[hole] != id) {
    CHECK_GE(table_[hole], 0) << "block " << id << " is not in the prefix table";
    hole = (hole + 1) & table_mask_;
  }
  // Backward-shift deletion: pull later entries of the probe run into the hole when the hole
  // lies on their probe path (between their home slot and where they sit), so every remaining
  // entry stays reachable from its home without tombstones.
  for (size_t slot = (hole + 1) & table_mask_; table_[slot] >= 0; slot = (slot + 1) & table_mask_) {
    const size_t home = HomeSlot(blocks_[table_[slot]].hash);
    const size_t home_to_slot = (slot - home) & table_mask_;
    const size_t hole_to_slot = (slot - hole) & table_mask_;
    if (home_to_slot >= hole_to_slot) {
      table_[hole] = table_[slot];
      hole = slot;
    }
  }
  table_[hole] = -1;
}

void KvCacheManager::Uncache(int32_t id) {
  Block& b = blocks_[id];
  if (b.state == BlockState::kCached) {
    EraseFromTable(id);
    --num_cached_blocks_;
    ++b.generation;  // children and aliases referring to this block go stale
  }
  b.state = BlockState::kUncached;
  if (b.checkpoint >= 0) DropCheckpoint(b.checkpoint);  // its prefix is gone
}

int64_t KvCacheManager::TakeCachedPrefix(Request& r) {
  CHECK(r.block_ids.empty() && r.num_computed_tokens == 0)
      << "request " << r.id << " already holds cache";
  if (!config_.enable_prefix_caching || r.skip_prefix_cache) return 0;
  const bool hybrid = config_.num_state_slots > 0;

  // The last token is always computed (its logits are needed), so at most num_tokens - 1
  // tokens may come from the cache; a block the cap cuts is recomputed whole.
  const int64_t max_hit_blocks = (r.num_tokens() - 1) / config_.block_size;
  BlockRef parent;
  uint64_t parent_hash = kRootHash;
  int64_t usable_blocks = 0;  // the longest run of the chain usable as it stands
  for (int64_t b = 0; b < max_hit_blocks; ++b) {
    const uint64_t hash = HashBlock(parent_hash, r, b);
    const int32_t id = FindCached(hash, parent, r, b);
    if (id < 0) break;
    r.block_ids.push_back(id);  // reserved at admission: no allocation
    parent = BlockRef{id, blocks_[id].generation};
    parent_hash = hash;
    if (!hybrid) {
      usable_blocks = b + 1;
    } else if (const int32_t c = blocks_[id].checkpoint; c >= 0) {
      // A GDN model resumes only where a checkpoint holds its state.
      const int64_t pos = (b + 1) * config_.block_size;  // <= num_tokens - 1
      if (!config_.checkpoint_keys_next_token || checkpoints_[c].next_token == r.token_at(pos)) {
        usable_blocks = b + 1;
      }
    }
  }
  if (hybrid) {
    // The cached chain went on past the last checkpoint on it: another request shares this
    // prefix and diverged there. A checkpoint at that junction lets the next sharer resume.
    const int64_t chain = static_cast<int64_t>(r.block_ids.size()) * config_.block_size;
    const int64_t junction = chain / config_.checkpoint_alignment * config_.checkpoint_alignment;
    r.shared_prefix_junction = junction > usable_blocks * config_.block_size ? junction : 0;
  }
  r.block_ids.resize(usable_blocks);
  for (int32_t id : r.block_ids) Touch(id);
  if (hybrid && usable_blocks > 0) {
    const int32_t c = blocks_[r.block_ids.back()].checkpoint;
    if (checkpoints_[c].pins++ == 0) {
      LruRemove(c);
      ++num_pinned_checkpoints_;
    }
    r.restore_checkpoint = c;
    r.restore_state_slot = CheckpointSlot(c);
  }
  const int64_t hit_tokens = usable_blocks * config_.block_size;
  prefix_cache_queries_ += r.num_tokens();
  prefix_cache_hits_ += hit_tokens;
  return hit_tokens;
}

// ---- GDN state checkpoints --------------------------------------------------------------------

void KvCacheManager::LruPushTail(int32_t c) {
  Checkpoint& k = checkpoints_[c];
  k.prev_lru = lru_tail_;
  k.next_lru = -1;
  (lru_tail_ >= 0 ? checkpoints_[lru_tail_].next_lru : lru_head_) = c;
  lru_tail_ = c;
  k.in_lru = true;
}

void KvCacheManager::LruPushHead(int32_t c) {
  Checkpoint& k = checkpoints_[c];
  k.prev_lru = -1;
  k.next_lru = lru_head_;
  (lru_head_ >= 0 ? checkpoints_[lru_head_].prev_lru : lru_tail_) = c;
  lru_head_ = c;
  k.in_lru = true;
}

void KvCacheManager::LruRemove(int32_t c) {
  Checkpoint& k = checkpoints_[c];
  if (!k.in_lru) return;
  (k.prev_lru >= 0 ? checkpoints_[k.prev_lru].next_lru : lru_head_) = k.next_lru;
  (k.next_lru >= 0 ? checkpoints_[k.next_lru].prev_lru : lru_tail_) = k.prev_lru;
  k.prev_lru = k.next_lru = -1;
  k.in_lru = false;
}

void KvCacheManager::DropCheckpoint(int32_t c) {
  Checkpoint& k = checkpoints_[c];
  if (k.block >= 0) {
    blocks_[k.block].checkpoint = -1;
    k.block = -1;
    ++k.generation;
    --num_attached_checkpoints_;
  }
  if (k.pins > 0) return;  // freed by the last ReleaseRestore
  LruRemove(c);
  free_checkpoints_.push_back(c);
}

int32_t KvCacheManager::AcquireCheckpoint() {
  if (free_checkpoints_.empty()) {
    if (lru_head_ < 0) return -1;  // every checkpoint is being restored from
    DropCheckpoint(lru_head_);
  }
  const int32_t c = free_checkpoints_.back();
  free_checkpoints_.pop_back();
  return c;
}

void KvCacheManager::ReleaseRestore(Request& r) {
  const int32_t c = r.restore_checkpoint;
  if (c < 0) return;
  r.restore_checkpoint = r.restore_state_slot = -1;
  Checkpoint& k = checkpoints_[c];
  CHECK_GT(k.pins, 0) << "checkpoint " << c << " unpinned twice";
  if (--k.pins > 0) return;
  --num_pinned_checkpoints_;
  if (k.block >= 0) {
    LruPushTail(c);  // used just now
  } else {
    free_checkpoints_.push_back(c);  // its block left the cache while it was pinned
  }
}

bool KvCacheManager::IsCheckpointPosition(const Request& r, int64_t pos) const {
  if (pos <= 0 || pos % config_.checkpoint_alignment != 0) return false;
  const int64_t prompt = r.num_prompt_tokens();
  const int64_t interval = config_.checkpoint_interval;
  return pos == prompt / config_.checkpoint_alignment * config_.checkpoint_alignment ||
         pos == r.shared_prefix_junction || (interval > 0 && pos % interval == 0 && pos < prompt) ||
         pos > prompt;
}

int64_t KvCacheManager::CheckpointChunkEnd(const Request& r, int64_t first_pos, int64_t end) const {
  if (config_.num_checkpoints == 0 || r.skip_prefix_cache) return end;
  const int64_t align = config_.checkpoint_alignment;
  for (const int64_t junction : {r.num_prompt_tokens() / align * align, r.shared_prefix_junction}) {
    if (junction > first_pos && junction < end) end = junction;
  }
  if (config_.checkpoint_interval > 0) {
    end =
        std::min(end, (first_pos / config_.checkpoint_interval + 1) * config_.checkpoint_interval);
  }
  return end;
}

bool KvCacheManager::MaybeCheckpoint(Request& r, int64_t state_pos) {
  return MaybeCheckpoint(r, state_pos, r.state_slot);
}

bool KvCacheManager::MaybeCheckpoint(Request& r, int64_t state_pos, int32_t slot) {
  if (config_.num_checkpoints == 0 || slot < 0 || r.skip_prefix_cache ||
      !IsCheckpointPosition(r, state_pos)) {
    return false;
  }
  const int64_t b = state_pos / config_.block_size - 1;
  if (b >= static_cast<int64_t>(r.block_ids.size())) return false;
  // The block that stands for this prefix in the cache: r's own, or the identical one cached
  // first.
  int32_t id = r.block_ids[b];
  if (blocks_[id].state == BlockState::kAlias) {
    if (!IsLive(blocks_[id].same_as)) return false;
    id = blocks_[id].same_as.id;
  }
  if (blocks_[id].state != BlockState::kCached || blocks_[id].checkpoint >= 0) return false;
  int32_t next_token = -1;
  if (config_.checkpoint_keys_next_token) {
    if (state_pos >= r.num_tokens()) return false;
    next_token = r.token_at(state_pos);
  }
  const int32_t c = AcquireCheckpoint();
  if (c < 0) return false;
  Checkpoint& k = checkpoints_[c];
  k.block = id;
  k.next_token = next_token;
  blocks_[id].checkpoint = c;
  ++num_attached_checkpoints_;
  LruPushTail(c);
  pending_copies_.push_back({slot, CheckpointSlot(c)});
  if (state_pos > r.num_prompt_tokens()) {
    // Decoding moved on: the request's previous output checkpoint goes first when room is short.
    const int32_t prev = r.output_checkpoint;
    if (prev >= 0 && checkpoints_[prev].generation == r.output_checkpoint_generation &&
        checkpoints_[prev].block >= 0 && checkpoints_[prev].in_lru) {
      LruRemove(prev);
      LruPushHead(prev);
    }
    r.output_checkpoint = c;
    r.output_checkpoint_generation = k.generation;
  }
  return true;
}

void KvCacheManager::CacheFullBlocks(const Request& r) {
  if (!config_.enable_prefix_caching) return;
  const int64_t num_full = std::min(r.num_computed_tokens / config_.block_size,
                                    static_cast<int64_t>(r.block_ids.size()));
  // A request's published blocks are always a prefix of its block list (prefix hits first,
  // then blocks published in order), so walk back from the last full block to the first one
  // not published yet; in a steady decode step that is at most one block.
  int64_t first = num_full;
  while (first > 0 && blocks_[r.block_ids[first - 1]].state == BlockState::kUncached) --first;

  for (int64_t b = first; b < num_full; ++b) {
    const int32_t id = r.block_ids[b];
    BlockRef parent;
    uint64_t parent_hash = kRootHash;
    if (b > 0) {
      const int32_t prev = r.block_ids[b - 1];
      parent = IdentityOf(prev);
      parent_hash = blocks_[prev].hash;
    }
    Block& block = blocks_[id];
    block.hash = HashBlock(parent_hash, r, b);
    if (!IsLive(parent)) {
      // The prefix's cached block was evicted: nothing could ever reach this block.
      block.state = BlockState::kAlias;
      block.same_as = BlockRef{kBrokenId, 0};
      continue;
    }
    const int32_t existing = FindCached(block.hash, parent, r, b);
    if (existing >= 0) {
      // An identical block was published first (e.g. the same prompt prefilled concurrently):
      // keep it, and let it stand for this one as the parent of our next blocks.
      block.state = BlockState::kAlias;
      block.same_as = BlockRef{existing, blocks_[existing].generation};
      continue;
    }
    block.state = BlockState::kCached;
    block.parent = parent;
    const int64_t first_pos = b * config_.block_size;
    int32_t* tokens = &cached_tokens_[id * config_.block_size];
    for (int64_t i = 0; i < config_.block_size; ++i) tokens[i] = r.token_at(first_pos + i);
    InsertIntoTable(id);
    ++num_cached_blocks_;
  }
}

void KvCacheManager::ResetPrefixCache() {
  std::fill(table_.begin(), table_.end(), -1);
  for (Block& b : blocks_) {
    if (b.state == BlockState::kCached) ++b.generation;
    b.state = BlockState::kUncached;  // blocks in use are published again by CacheFullBlocks
    if (b.checkpoint >= 0) DropCheckpoint(b.checkpoint);
  }
  num_cached_blocks_ = 0;
}

// ---- statistics -------------------------------------------------------------------------------

int64_t KvCacheManager::num_free_blocks() const { return num_free_blocks_; }
int64_t KvCacheManager::num_used_blocks() const { return config_.num_blocks - num_free_blocks_; }
double KvCacheManager::usage() const {
  return static_cast<double>(num_used_blocks()) / static_cast<double>(config_.num_blocks);
}
int64_t KvCacheManager::num_used_state_slots() const {
  return config_.num_state_slots - static_cast<int64_t>(free_state_slots_.size()) -
         static_cast<int64_t>(free_spec_slots_.size());
}
int64_t KvCacheManager::num_cached_blocks() const { return num_cached_blocks_; }
int64_t KvCacheManager::prefix_cache_queries() const { return prefix_cache_queries_; }
int64_t KvCacheManager::prefix_cache_hits() const { return prefix_cache_hits_; }
int64_t KvCacheManager::num_checkpoints() const { return num_attached_checkpoints_; }
int64_t KvCacheManager::num_pinned_checkpoints() const { return num_pinned_checkpoints_; }

}  // namespace moeserve::engine
