// KvCacheManager: hands out the engine's cache memory to requests -- KV blocks of the
// full-attention layers (one block id covers the same positions in every attention layer) and
// recurrent-state slots of the GDN layers -- and, for attention-only models, caches full blocks
// by prefix for reuse (vLLM's BlockPool + KVCacheManager, docs/spec/serving.md §2.3).
//
// Prefix caching: a full block's identity is a chained hash of (parent block's hash, its
// block_size token ids); a lookup walks a waiting request's prompt block by block and stops at
// the first miss. Cached blocks are ref-counted and shared; a freed block keeps its hash and
// sits in an LRU free queue, evicted only when the pool hands it out again.
//
// Hybrid (GDN) models: a GDN layer's state after position p summarizes the whole prefix, and KV
// blocks cannot rebuild it, so a prefix is reusable only up to a position where a copy of that
// state -- a checkpoint -- was kept. Checkpoints live in model state slots of their own (after
// the running requests' slots), each attached to the cached block that ends at its position;
// positions are multiples of the checkpoint alignment (the GDN chunk, 64, and the block size),
// so a resumed prefill runs exactly the chunks an uncached one runs. They are taken at the end
// of a prompt (floor-aligned: where a follow-up turn or another request with the same system
// prompt diverges), where a lookup found the cached chain going on past its last checkpoint
// (another request shares the prefix and diverged there: the next sharer resumes at this
// junction), every checkpoint_interval tokens of a prompt, and at the end of an output
// (the latest aligned position reached while decoding). A lookup takes the longest chain of
// cached blocks that ends at a checkpoint. Checkpoints are evicted LRU in their own budget, and
// with the block they are attached to; one being restored from is pinned.
//
// No heap allocation after construction: every table is sized up front, and a request's
// block_ids is reserved at admission (ReserveFor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/request.h"

namespace moeserve::engine {

struct KvCacheConfig {
  int64_t num_blocks = 0;              // KV blocks in the pool (>= 1)
  int64_t block_size = 16;             // token positions per block
  int64_t num_state_slots = 0;         // GDN state slots; 0 for models without GDN layers
  // Speculative decoding on a hybrid model: a request that drafts also holds this many extra
  // state slots, where a verify run keeps the state after each draft (model/cache.h,
  // verify_slots). They come from the last num_spec_state_slots of num_state_slots, K at a time:
  // enough for the requests that draft at once (drafting pauses above --spec-disable-batch-size),
  // so a request finding fewer than K free runs without drafts until a set frees.
  int64_t spec_state_slots_per_request = 0;
  int64_t num_spec_state_slots = 0;
  int64_t max_blocks_per_request = 0;  // cdiv(max_model_len, block_size)
  bool enable_prefix_caching = false;
  // Hybrid models: GDN state checkpoints (0: none, so no prefix hits). Checkpoint c lives in
  // model state slot num_state_slots + c.
  int64_t num_checkpoints = 0;
  int64_t checkpoint_alignment = 64;  // a multiple of block_size and of the GDN chunk
  int64_t checkpoint_interval = 0;  // also every this many prompt tokens (0: none)
  // MTP speculative decoding: the MTP layer's KV at p - 1 pairs the hidden state at p - 1 with
  // the token at p, so a checkpoint at p also matches only requests with the same token at p.
  bool checkpoint_keys_next_token = false;
  int64_t max_num_seqs = 1;  // bounds the checkpoint copies of one step
};

// A GDN state copy the engine makes on every rank after a step: a checkpoint taken.
struct StateCopy {
  int32_t from = 0;  // model state slots
  int32_t to = 0;
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }

  // Reserves r.block_ids for the most blocks a request can hold (allocation happens here, at
  // admission, not in steps).
  void ReserveFor(Request& r) const;

  // For a request about to be scheduled with r.num_computed_tokens == 0 and no blocks: takes
  // the longest run of its leading full blocks found in the prefix cache (at most
  // num_tokens - 1 tokens, so the last prompt token is always computed), appends them to
  // r.block_ids, and returns the number of tokens they cover (a multiple of block_size; 0 when
  // prefix caching is off or the request skips it). Counts queries and hits in the statistics.
  int64_t TakeCachedPrefix(Request& r);

  // Ensures r holds blocks for positions [0, r.num_computed_tokens + num_new_tokens), and its
  // state slot when the model has GDN layers. Returns false, taking nothing, when the pool cannot
  // supply them (the caller preempts or waits). Also hands r a set of
  // spec_state_slots_per_request draft slots when it has none and a set is free (optional).
  bool Allocate(Request& r, int64_t num_new_tokens);

  // Publishes r's blocks that are full and computed -- positions < num_computed_tokens -- in the
  // prefix cache (no-op when prefix caching is off). Called after each step.
  void CacheFullBlocks(const Request& r);

  // Releases r's blocks (in reverse order, so tails are evicted first), state slots and the
  // pin on the checkpoint it resumed from.
  void Free(Request& r);

  // Hybrid models, after the step that copied r's checkpoint into its state slot: unpins it.
  void ReleaseRestore(Request& r);
  // Hybrid models, after a step (and CacheFullBlocks): r's state slot holds the state after
  // `state_pos` tokens. When that position is one a checkpoint is kept at and the block ending
  // there is cached without one, takes a checkpoint slot (evicting the least recently used) and
  // queues the copy. Returns whether it did. `slot`: the state slot holding that state when it is
  // not r's own (a verify step's state after an accepted draft, in one of r.spec_state_slots).
  bool MaybeCheckpoint(Request& r, int64_t state_pos);
  bool MaybeCheckpoint(Request& r, int64_t state_pos, int32_t slot);
  // The copies queued since the last call, in order; the engine runs them before the next step.
  const std::vector<StateCopy>& pending_copies() const { return pending_copies_; }
  void ClearPendingCopies() { pending_copies_.clear(); }
  // Where a prefill chunk starting at `first_pos` must stop so that a checkpoint position inside
  // it is a chunk end (the state exists only at chunk ends): the first such position after
  // first_pos and before `end`, or `end`.
  int64_t CheckpointChunkEnd(const Request& r, int64_t first_pos, int64_t end) const;

  // Forgets every cached prefix (blocks not in use become plain free blocks).
  void ResetPrefixCache();

  int64_t num_free_blocks() const;   // free to hand out, including cached-but-unused blocks
  int64_t num_used_blocks() const;   // held by at least one request
  double usage() const;              // num_used_blocks / num_blocks, in [0, 1]
  int64_t num_used_state_slots() const;
  int64_t num_cached_blocks() const; // blocks with a prefix hash (used or free)
  int64_t prefix_cache_queries() const;  // tokens looked up (vLLM's vllm:prefix_cache_queries)
  int64_t prefix_cache_hits() const;     // tokens found
  int64_t num_checkpoints() const;        // checkpoints held (attached to a block)
  int64_t num_pinned_checkpoints() const; // of those, being restored from

 private:
  friend class KvCacheManagerTestPeer;  // kv_cache_manager_test.cc forges hash collisions

  // Where a block stands in the prefix cache.
  enum class BlockState : uint8_t {
    kUncached,  // not (yet) published: partial, uncomputed, or published and then reset
    kCached,    // in the hash table: findable by its chain hash
    kAlias,     // published but not in the table: an identical block (same prefix and tokens)
                // was cached first (same_as names it), or its prefix is no longer cached
  };
  // A cached block as a prefix identity. The generation changes whenever the block leaves the
  // prefix cache, so a stale reference to a recycled block id can never match.
  struct BlockRef {
    int32_t id = kRootId;
    uint64_t generation = 0;
    bool operator==(const BlockRef&) const = default;
  };
  static constexpr int32_t kRootId = -1;    // the empty prefix (parent of a request's block 0)
  static constexpr int32_t kBrokenId = -2;  // a prefix no cached block stands for any more

  struct Block {
    int32_t checkpoint = -1;  // the checkpoint at this block's end position (kCached only)
    int32_t ref_count = 0;
    int32_t prev_free = -1;  // free-queue links, meaningful while ref_count == 0
    int32_t next_free = -1;
    BlockState state = BlockState::kUncached;
    uint64_t generation = 0;
    uint64_t hash = 0;  // chain hash of the prefix ending with this block (kCached, kAlias)
    BlockRef parent;    // kCached: the prefix this block continues
    BlockRef same_as;   // kAlias: the cached block standing for the same prefix, or kBrokenId
  };

  // A GDN state checkpoint: in use while attached to a block. Unpinned ones in use are on an
  // LRU list (head = evicted first); the generation changes whenever it is dropped.
  struct Checkpoint {
    int32_t block = -1;       // -1: free (or detached while pinned, freed when unpinned)
    int32_t pins = 0;
    int32_t next_token = -1;  // checkpoint_keys_next_token: the token at its position
    int32_t prev_lru = -1, next_lru = -1;
    bool in_lru = false;
    uint64_t generation = 0;
  };
  int32_t CheckpointSlot(int32_t c) const {
    return static_cast<int32_t>(config_.num_state_slots + c);
  }
  void LruPushTail(int32_t c);
  void LruPushHead(int32_t c);
  void LruRemove(int32_t c);
  // A checkpoint to write: a free one, else the least recently used (dropped); -1 if all are
  // pinned.
  int32_t AcquireCheckpoint();
  // Detaches a checkpoint from its block and frees it (a pinned one is freed when unpinned).
  void DropCheckpoint(int32_t c);
  bool IsCheckpointPosition(const Request& r, int64_t pos) const;

  // Free queue: a doubly linked list threaded through blocks_, head = next to hand out.
  void PushFreeTail(int32_t id);
  int32_t PopFreeHead();
  void RemoveFromFreeQueue(int32_t id);
  // Adds a reference to a block (a prefix-cache hit), taking it off the free queue if free.
  void Touch(int32_t id);
  // Hands out the free queue's head with ref_count 1, evicting its cached prefix if any.
  int32_t TakeFreeBlock();
  // Drops a block's prefix-cache identity; references to it (children, aliases) go stale.
  void Uncache(int32_t id);

  // The prefix identity block `id` stands for (kCached or kAlias blocks only).
  BlockRef IdentityOf(int32_t id) const;
  bool IsLive(const BlockRef& ref) const;
  // Chain hash of block `block_index` of r following a prefix whose hash is parent_hash.
  uint64_t HashBlock(uint64_t parent_hash, const Request& r, int64_t block_index) const;
  // The cached block holding r's block `block_index` after prefix `parent`, or -1.
  int32_t FindCached(uint64_t hash, const BlockRef& parent, const Request& r,
                     int64_t block_index) const;
  void InsertIntoTable(int32_t id);
  void EraseFromTable(int32_t id);
  size_t HomeSlot(uint64_t hash) const { return static_cast<size_t>(hash) & table_mask_; }

  KvCacheConfig config_;
  std::vector<Block> blocks_;  // [num_blocks]
  int32_t free_head_ = -1;
  int32_t free_tail_ = -1;
  int64_t num_free_blocks_ = 0;
  // Prefix cache: the token ids of every cached block ([num_blocks, block_size], compared on
  // lookup so a hash collision never returns another prefix's KV) and an open-addressing hash
  // table of cached block ids (linear probing, backward-shift deletion, -1 = empty slot).
  std::vector<int32_t> cached_tokens_;
  std::vector<int32_t> table_;
  size_t table_mask_ = 0;
  int64_t num_cached_blocks_ = 0;
  std::vector<int32_t> free_state_slots_;  // stack; the next slot handed out is at the back
  std::vector<int32_t> free_spec_slots_;   // likewise, the drafts' slots
  int64_t prefix_cache_queries_ = 0;
  int64_t prefix_cache_hits_ = 0;
  // Checkpoints: [num_checkpoints], free ones on a stack, unpinned ones in use on an LRU list.
  std::vector<Checkpoint> checkpoints_;
  std::vector<int32_t> free_checkpoints_;
  int32_t lru_head_ = -1, lru_tail_ = -1;
  int64_t num_attached_checkpoints_ = 0;
  int64_t num_pinned_checkpoints_ = 0;
  std::vector<StateCopy> pending_copies_;  // reserved to max_num_seqs
};

}  // namespace moeserve::engine
