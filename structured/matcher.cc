#include "structured/matcher.h"

#include <algorithm>

namespace moeserve::structured {

using internal::AddClosure;
using internal::Advance;
using internal::Arena;
using internal::Thread;
using internal::WalkTrie;

CompiledGrammar::CompiledGrammar(Automaton automaton, std::shared_ptr<const Vocabulary> vocabulary)
    : automaton_(std::move(automaton)),
      vocabulary_(std::move(vocabulary)),
      cache_(automaton_.states.size()) {}

std::shared_ptr<const CompiledGrammar::StateMask> CompiledGrammar::MaskOf(int32_t state) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cache_[state]) return cache_[state];
  }
  // Computed outside the lock: two threads may both compute it; the first one stored wins.
  const Vocabulary& v = *vocabulary_;
  auto m = std::make_shared<StateMask>();
  std::vector<uint32_t> bits(v.mask_words(), 0);
  m->overflowed = !internal::WalkTrieFromState(automaton_, v, state, {bits.data(), &m->exits});
  size_t count = 0;
  for (uint32_t w : bits) count += __builtin_popcount(w);
  if (count * 32 > static_cast<size_t>(v.size())) {
    m->bits = std::move(bits);
  } else {
    for (size_t w = 0; w < bits.size(); ++w) {
      for (uint32_t x = bits[w]; x; x &= x - 1) {
        m->tokens.push_back(static_cast<int32_t>(w * 32 + __builtin_ctz(x)));
      }
    }
  }
  const size_t bytes = sizeof(StateMask) + m->bits.size() * sizeof(uint32_t) +
                       (m->tokens.size() + m->exits.size()) * sizeof(int32_t);
  std::lock_guard<std::mutex> lock(mu_);
  if (cache_[state]) return cache_[state];
  if (cache_bytes_ + bytes > kMaxMaskCacheBytes) return m;
  cache_bytes_ += bytes;
  cache_[state] = std::move(m);
  return cache_[state];
}

size_t CompiledGrammar::memory_bytes() const {
  const Automaton& a = automaton_;
  const size_t tables = a.states.size() * sizeof(Automaton::State) +
                        a.next.size() * sizeof(int32_t) + a.refs.size() * sizeof(Automaton::Call);
  std::lock_guard<std::mutex> lock(mu_);
  return tables + cache_bytes_;
}

size_t CompiledGrammar::cached_states() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& m : cache_) n += m != nullptr;
  return n;
}

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar) : grammar_(std::move(grammar)) {
  const Automaton& a = grammar_->automaton();
  const bool can_end = AddClosure(a, arena_, 0, {a.rule_start[a.root], -1});
  steps_.push_back({0, arena_.threads.size(), arena_.frames.size(), can_end, false});
}

bool Matcher::CanEnd() const { return steps_.back().can_end; }
bool Matcher::IsFinished() const { return steps_.back().finished; }

void Matcher::FillNextTokenBitmask(std::span<uint32_t> mask) {
  const Vocabulary& v = grammar_->vocabulary();
  const Automaton& a = grammar_->automaton();
  std::fill(mask.begin(), mask.end(), 0u);
  if (mask.size() < v.mask_words()) return;  // too short for the vocabulary: nothing allowed
  if (arena_.overflowed) return;
  arena_.work_done = 0;
  const Step step = steps_.back();
  auto set_eos = [&] {
    for (int32_t id : v.eos_ids()) mask[id >> 5] |= 1u << (id & 31);
  };
  if (step.finished) {
    set_eos();
    return;
  }
  uint32_t* bits = mask.data();
  seen_states_.clear();
  for (size_t i = step.begin; i < step.end; ++i) {
    const Thread t = arena_.threads[i];
    if (!a.states[t.state].has_bytes) continue;
    const std::shared_ptr<const CompiledGrammar::StateMask> cached = grammar_->MaskOf(t.state);
    const CompiledGrammar::StateMask& m = *cached;
    if (m.overflowed) arena_.overflowed = true;
    if (std::find(seen_states_.begin(), seen_states_.end(), t.state) == seen_states_.end()) {
      seen_states_.push_back(t.state);
      if (!m.bits.empty()) {
        for (size_t w = 0; w < m.bits.size(); ++w) bits[w] |= m.bits[w];
      } else {
        for (int32_t id : m.tokens) bits[id >> 5] |= 1u << (id & 31);
      }
    }
    if (t.stack < 0 || m.exits.empty()) continue;
    // The rule of t returned inside some tokens: continue them with the caller's frames.
    const size_t set_begin = arena_.threads.size();
    const internal::Frame f = arena_.frames[t.stack];
    AddClosure(a, arena_, set_begin, {f.ret, f.parent});
    const size_t set_end = arena_.threads.size();
    if (set_end > set_begin) {
      for (int32_t node : m.exits) {
        const Vocabulary::Node& n = v.nodes()[node];
        WalkTrie(a, v, arena_, node + 1, n.end, n.depth, set_begin, set_end, /*local=*/false,
                 {bits, nullptr});
      }
    }
    arena_.threads.resize(step.end);
    arena_.frames.resize(step.frames);
  }
  if (arena_.overflowed) {
    std::fill(mask.begin(), mask.end(), 0u);
    return;
  }
  if (step.can_end) set_eos();
}

bool Matcher::AcceptBytes(std::string_view bytes) {
  const Step step = steps_.back();
  if (step.finished || bytes.empty() || arena_.overflowed) return false;
  arena_.work_done = 0;
  const Automaton& a = grammar_->automaton();
  size_t from = step.begin, to = step.end;
  bool popped = false;
  for (size_t k = 0; k < bytes.size(); ++k) {
    const size_t begin = arena_.threads.size();
    popped = Advance(a, arena_, from, to, static_cast<uint8_t>(bytes[k]));
    from = begin;
    to = arena_.threads.size();
    if (arena_.overflowed) return false;
    // An empty set is the end only when the root rule completed with the last byte.
    if (from == to && !(popped && k + 1 == bytes.size())) {
      arena_.threads.resize(step.end);
      arena_.frames.resize(step.frames);
      return false;
    }
  }
  // The new set goes right after the previous one; the frames of the sets in between stay (the
  // new set's stacks may use them) until a rollback past this step.
  std::copy(arena_.threads.begin() + from, arena_.threads.begin() + to,
            arena_.threads.begin() + step.end);
  arena_.threads.resize(step.end + (to - from));
  steps_.push_back({step.end, arena_.threads.size(), arena_.frames.size(), popped, false});
  return true;
}

bool Matcher::AcceptToken(int32_t id) {
  const Vocabulary& v = grammar_->vocabulary();
  if (id < 0 || id >= v.size()) return false;
  if (v.is_eos(id)) {
    Step step = steps_.back();
    if (!step.can_end || arena_.overflowed) return false;
    // EOS reads nothing: the same set, now finished.
    step.finished = true;
    steps_.push_back(step);
    return true;
  }
  const std::string& bytes = v.bytes(id);
  if (bytes.size() > Vocabulary::kMaxTokenBytes) return false;
  return AcceptBytes(bytes);
}

bool Matcher::Rollback(int n) {
  if (n < 0 || n > num_tokens()) return false;
  steps_.resize(steps_.size() - n);
  const Step& step = steps_.back();
  arena_.threads.resize(step.end);
  arena_.frames.resize(step.frames);
  return true;
}

}  // namespace moeserve::structured
