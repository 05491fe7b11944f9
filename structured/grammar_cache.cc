#include "structured/grammar_cache.h"

#include <algorithm>

namespace moeserve::structured {

GrammarCache::GrammarCache(const tokenizer::Tokenizer& tok, std::vector<int32_t> eos_ids,
                           Options options)
    : tok_(tok), eos_ids_(std::move(eos_ids)), options_(options) {}

Result<std::shared_ptr<const Vocabulary>> GrammarCache::vocabulary() {
  std::call_once(vocabulary_once_,
                 [this] { vocabulary_ = Vocabulary::FromTokenizer(tok_, eos_ids_); });
  return vocabulary_;
}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCache::Get(const GrammarSpec& spec) {
  std::string key = CacheKey(spec);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = by_key_.find(key); it != by_key_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const Vocabulary> vocab, vocabulary());
  ASSIGN_OR_RETURN(std::shared_ptr<const CompiledGrammar> grammar,
                   Compile(spec, std::move(vocab), options_.limits));
  std::lock_guard<std::mutex> lock(mu_);
  ++compiles_;
  if (auto it = by_key_.find(key); it != by_key_.end()) {  // another thread compiled it too
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }
  lru_.emplace_front(key, grammar);
  by_key_.emplace(std::move(key), lru_.begin());
  EvictLocked();
  return grammar;
}

void GrammarCache::EvictLocked() {
  // Mask caches grow as requests use a grammar, so the sum is taken afresh each time.
  size_t bytes = 0;
  for (const Entry& e : lru_) bytes += e.second->memory_bytes();
  while (lru_.size() > 1 && (lru_.size() > options_.capacity || bytes > options_.max_bytes)) {
    bytes -= std::min(bytes, lru_.back().second->memory_bytes());
    by_key_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

int64_t GrammarCache::compiles() const {
  std::lock_guard<std::mutex> lock(mu_);
  return compiles_;
}

}  // namespace moeserve::structured
