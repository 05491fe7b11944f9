// The state a decoder keeps between forward calls: a paged KV cache for every full-attention
// layer (and the MTP layers), and recurrent-state slots for every Gated DeltaNet layer (conv
// window + f32 S). Layer code sees only views (kernels::PagedKvCache, raw state pointers) plus
// a sequence's block table and state slot, so the engine can hand out blocks and slots to many
// sequences without the layers knowing.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "io/model_config.h"
#include "kernels/attention.h"

namespace moeserve::model {

struct CacheSizes {
  int64_t num_blocks = 0;    // KV blocks per attention layer
  int64_t block_size = 16;   // token positions per block
  int64_t num_state_slots = 1;  // GDN state slots (one per running sequence)
};

class ModelCache {
 public:
  ModelCache(const io::ModelConfig& config, const CacheSizes& sizes);

  const CacheSizes& sizes() const { return sizes_; }
  // KV cache of decoder layer `layer` (full attention), or of MTP layer i at
  // layer = num_hidden_layers + i.
  const kernels::PagedKvCache& kv(int64_t layer) const;
  // GDN layer state of one slot: conv window [Kc-1][conv_dim] and S [nv][dk][dv].
  float* conv_state(int64_t layer, int32_t slot);
  float* recurrent_state(int64_t layer, int32_t slot);
  // Zeroes a slot's GDN state (a new sequence starts from zero state).
  void ResetSlot(int32_t slot);
  // Copies slot `from`'s GDN state (conv window and S of every GDN layer) over slot `to`'s: a
  // prefix-cache checkpoint taken, or a request resumed from one.
  void CopySlot(int32_t from, int32_t to);
  // Bytes held by the KV caches and by the GDN states.
  int64_t kv_bytes() const;
  int64_t state_bytes() const;

 private:
  struct LayerStorage {
    TensorStorage k, v;            // full attention
    TensorStorage conv, recurrent;  // GDN
    kernels::PagedKvCache kv{};
    int64_t conv_per_slot = 0, recurrent_per_slot = 0;
  };
  CacheSizes sizes_;
  std::vector<LayerStorage> layers_;
};

// The flat token batch of one forward call: the new tokens of num_seqs sequences, each
// sequence's tokens contiguous and at consecutive positions (a prefill chunk or a decode token),
// with where each sequence's caches are. Arrays are the caller's (the engine keeps them
// persistent across steps).
struct TokenBatch {
  int64_t num_tokens = 0;
  const int32_t* tokens = nullptr;     // [num_tokens]
  const int64_t* positions = nullptr;  // [num_tokens] absolute position of each token
  const int32_t* seq_of = nullptr;     // [num_tokens] sequence index of each token
  int64_t num_seqs = 0;
  const int32_t* query_start = nullptr;          // [num_seqs + 1]: tokens of s are [qs[s], qs[s+1])
  const int32_t* const* block_tables = nullptr;  // [num_seqs], each covering its positions
  const int32_t* state_slots = nullptr;          // [num_seqs] GDN state slot of each sequence
  // Speculative verification (may be null: none in this batch). For a sequence whose entry is
  // non-null, its tokens are a verify run [last token, drafts...]: GDN layers take them one
  // recurrent step at a time, exactly as decode does, and keep the state after token j in slot
  // verify_slots[s][j] (token 0 starts from state_slots[s]; verify_slots[s][0] may equal it), so
  // the state after any accepted prefix is there without a copy or a replay.
  const int32_t* const* verify_slots = nullptr;  // [num_seqs], entries null or [seq_len(s)]

  int64_t seq_begin(int64_t s) const { return query_start[s]; }
  int64_t seq_len(int64_t s) const { return query_start[s + 1] - query_start[s]; }
  const int32_t* verify_slots_of(int64_t s) const {
    return verify_slots != nullptr ? verify_slots[s] : nullptr;
  }
};

// The new tokens of one sequence in a forward call, and where its caches are.
struct SequenceInput {
  const int32_t* tokens = nullptr;
  int64_t num_tokens = 0;
  int64_t first_pos = 0;                // absolute position of tokens[0]
  const int32_t* block_table = nullptr;  // covers positions [0, first_pos + num_tokens)
  int32_t state_slot = 0;
};

}  // namespace moeserve::model
