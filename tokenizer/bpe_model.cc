#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "tokenizer/byte_level.h"

namespace moeserve::tokenizer {
namespace {

// Words this long or longer are not cached (Hugging Face's limit too): they are rare, and a few
// of them would take the memory of thousands of ordinary words.
constexpr size_t kMaxCachedWordBytes = 256;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

struct BpeModel::TokenIndex {
  StringMap map;
};

// (left id, right id) -> (rank, merged id), open addressing: the lookup of the merge loop, probed
// once per adjacent pair, so it is kept flat rather than a node-based map.
struct BpeModel::MergeTable {
  struct Slot {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // no pair of non-negative ids has this key

  explicit MergeTable(size_t n) {
    size_t capacity = 16;
    while (capacity < 2 * n) capacity *= 2;
    slots.resize(capacity);
    mask = capacity - 1;
  }
  static size_t Hash(uint64_t key) {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 17);
  }

  // A later merge of the same pair replaces the earlier one (Hugging Face collects the merges into
  // a hash map, where the last insertion wins).
  void Put(uint64_t key, uint32_t rank, int32_t merged) {
    for (size_t i = Hash(key) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == kEmpty || slots[i].key == key) {
        slots[i] = {key, rank, merged};
        return;
      }
    }
  }
  const Slot* Find(uint64_t key) const {
    for (size_t i = Hash(key) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == key) return &slots[i];
      if (slots[i].key == kEmpty) return nullptr;
    }
  }

  std::vector<Slot> slots;
  size_t mask = 0;
};

// Sharded so that concurrent encodes rarely wait on each other; a full shard is emptied, which
// bounds memory without bookkeeping on the hit path.
struct BpeModel::Cache {
  static constexpr size_t kShards = 16;
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
  };
  explicit Cache(size_t capacity) : shard_capacity(std::max<size_t>(1, capacity / kShards)) {}
  Shard& For(std::string_view word) { return shards[(StringHash{}(word) >> 7) % kShards]; }

  Shard shards[kShards];
  size_t shard_capacity;
};

BpeModel::BpeModel() = default;
BpeModel::~BpeModel() = default;

Result<std::unique_ptr<BpeModel>> BpeModel::Create(BpeConfig config) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  m->token_to_id_ = std::make_unique<TokenIndex>();
  StringMap& index = m->token_to_id_->map;
  index.reserve(config.vocab.size());
  int32_t max_id = -1;
  for (const auto& [token, id] : config.vocab) {
    if (id < 0) return InvalidArgument("model.vocab: token '{}' has negative id {}", token, id);
    max_id = std::max(max_id, id);
  }
  m->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  m->has_id_.resize(static_cast<size_t>(max_id + 1));
  for (auto& [token, id] : config.vocab) {
    if (m->has_id_[id]) {
      return InvalidArgument("model.vocab: id {} is given to both '{}' and '{}'", id,
                             m->id_to_token_[id], token);
    }
    if (!index.emplace(token, id).second) {
      return InvalidArgument("model.vocab: token '{}' appears twice", token);
    }
    m->has_id_[id] = true;
    m->id_to_token_[id] = std::move(token);
  }
  m->size_ = index.size();

  m->merges_ = std::make_unique<MergeTable>(config.merges.size());
  std::string merged;
  for (size_t rank = 0; rank < config.merges.size(); ++rank) {
    const auto& [left, right] = config.merges[rank];
    const auto l = index.find(left);
    const auto r = index.find(right);
    if (l == index.end() || r == index.end()) {
      return InvalidArgument("model.merges[{}] ('{}', '{}'): token '{}' is not in the vocabulary",
                             rank, left, right, l == index.end() ? left : right);
    }
    merged.assign(left).append(right);
    const auto result = index.find(merged);
    if (result == index.end()) {
      return InvalidArgument(
          "model.merges[{}] ('{}', '{}'): the merged token '{}' is not in the vocabulary", rank,
          left, right, merged);
    }
    m->merges_->Put(PairKey(l->second, r->second), static_cast<uint32_t>(rank), result->second);
  }

  for (int b = 0; b < 256; ++b) {
    const auto it = index.find(BytesToByteLevel(std::string(1, static_cast<char>(b))));
    m->byte_ids_[b] = it == index.end() ? -1 : it->second;
  }
  if (config.unk_token.has_value()) {
    const auto it = index.find(*config.unk_token);
    if (it == index.end()) {
      return InvalidArgument("model.unk_token '{}' is not in the vocabulary", *config.unk_token);
    }
    m->unk_id_ = it->second;
  }
  m->fuse_unk_ = config.fuse_unk;
  m->ignore_merges_ = config.ignore_merges;
  if (config.cache_capacity > 0) m->cache_ = std::make_unique<Cache>(config.cache_capacity);
  return m;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  const auto it = token_to_id_->map.find(token);
  if (it == token_to_id_->map.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string_view> BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= id_limit() || !has_id_[id]) return std::nullopt;
  return std::string_view(id_to_token_[id]);
}

void BpeModel::ClearCache() const {
  if (!cache_) return;
  for (Cache::Shard& shard : cache_->shards) {
    std::lock_guard<std::mutex> lock(shard.mu);
    shard.words.clear();
  }
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto it = token_to_id_->map.find(BytesToByteLevel(word));
        it != token_to_id_->map.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = cache_ && word.size() < kMaxCachedWordBytes;
  Cache::Shard* shard = nullptr;
  if (cacheable) {
    shard = &cache_->For(word);
    std::lock_guard<std::mutex> lock(shard->mu);
    if (const auto it = shard->words.find(word); it != shard->words.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids->size();
  Merge(word, ids);
  if (cacheable) {
    std::vector<int32_t> value(ids->begin() + static_cast<std::ptrdiff_t>(first), ids->end());
    std::lock_guard<std::mutex> lock(shard->mu);
    if (shard->words.size() >= cache_->shard_capacity) shard->words.clear();
    shard->words.emplace(std::string(word), std::move(value));
  }
}

void BpeModel::Merge(std::string_view word, std::vector<int32_t>* ids) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t merged;
  };
  // Min-heap on (rank, position): the lowest rank first, the leftmost among equal ranks.
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  // Per-thread scratch: the merge loop runs for every uncached word and should not allocate.
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  symbols.clear();
  heap.clear();

  auto add = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, true});
  };
  // Bytes outside the vocabulary: dropped, or unk (one per byte, or one per run when fused).
  bool pending_unk = false;
  for (const char c : word) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id >= 0) {
      if (pending_unk) add(*unk_id_);
      pending_unk = false;
      add(id);
    } else if (unk_id_.has_value()) {
      if (pending_unk && !fuse_unk_) add(*unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) add(*unk_id_);
  if (symbols.empty()) return;

  auto push_pair = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    if (const MergeTable::Slot* m = merges_->Find(PairKey(symbols[pos].id, symbols[next].id))) {
      heap.push_back({m->rank, pos, m->merged});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) push_pair(pos);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // A stale entry: one of the two symbols has been merged with something else since.
    const MergeTable::Slot* m = merges_->Find(PairKey(left.id, right.id));
    if (m == nullptr || m->merged != top.merged) continue;
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (int32_t pos = 0; pos >= 0; pos = symbols[pos].next) ids->push_back(symbols[pos].id);
  // One huge word (a megabyte without a space) should not pin its scratch for the thread's life.
  constexpr size_t kKeptScratch = size_t{1} << 16;
  if (symbols.capacity() > kKeptScratch) std::vector<Symbol>().swap(symbols);
  if (heap.capacity() > kKeptScratch) std::vector<Candidate>().swap(heap);
}

}  // namespace moeserve::tokenizer
