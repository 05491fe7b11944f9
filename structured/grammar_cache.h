// GrammarCache: compiled grammars of one tokenizer, shared across requests and keyed by their
// spec (CacheKey), so a schema that many requests send compiles once. Thread-safe: a request
// compiles on its caller's thread (a server's handler, never the engine's), outside the lock, so
// it waits for its own compile only. The vocabulary is built on first use (a trie over the
// tokenizer, once).
//
// Bounded: at most `capacity` grammars and `max_bytes` of their mask caches are kept, the least
// recently used dropped first (a request that holds one keeps it alive until it ends). A spec
// that fails to compile is not kept.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"
#include "structured/structured.h"

namespace moeserve::tokenizer {
class Tokenizer;
}

namespace moeserve::structured {

class GrammarCache {
 public:
  struct Options {
    size_t capacity = 64;
    size_t max_bytes = size_t{512} << 20;
    Limits limits;
  };
  // tok must outlive the cache. eos_ids: the model's end-of-sequence ids, allowed where a
  // grammar can end.
  GrammarCache(const tokenizer::Tokenizer& tok, std::vector<int32_t> eos_ids, Options options);
  GrammarCache(const tokenizer::Tokenizer& tok, std::vector<int32_t> eos_ids)
      : GrammarCache(tok, std::move(eos_ids), Options{}) {}

  // The spec compiled, from the cache or now. InvalidArgument (a 400) naming what is wrong.
  Result<std::shared_ptr<const CompiledGrammar>> Get(const GrammarSpec& spec);

  size_t size() const;
  int64_t compiles() const;  // specs compiled so far (misses), for tests

 private:
  Result<std::shared_ptr<const Vocabulary>> vocabulary();
  void EvictLocked();

  const tokenizer::Tokenizer& tok_;
  const std::vector<int32_t> eos_ids_;
  const Options options_;

  std::once_flag vocabulary_once_;
  Result<std::shared_ptr<const Vocabulary>> vocabulary_ = Internal("not built");

  mutable std::mutex mu_;
  using Entry = std::pair<std::string, std::shared_ptr<const CompiledGrammar>>;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_key_;
  int64_t compiles_ = 0;
};

}  // namespace moeserve::structured
