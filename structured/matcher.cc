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
      text_step_(new std::atomic<int32_t>[automaton_.states.size()]),
      cache_(automaton_.states.size()) {
  for (size_t s = 0; s < automaton_.states.size(); ++s) text_step_[s] = kTextUnknown;
}

int32_t CompiledGrammar::TextStep(int32_t state) const {
  int32_t known = text_step_[state].load(std::memory_order_relaxed);
  if (known != kTextUnknown) return known;
  // The product of the UTF-8 automaton of one text character with the grammar's, from `state`:
  // every path must stay alive, through states that only read bytes, and end in one state.
  enum Utf8 : int8_t { kStart, kNeed1, kNeed2, kNeed3, kAfterE0, kAfterED, kAfterF0, kAfterF4 };
  struct Range {
    uint8_t lo, hi;
    int8_t next;  // -1: the character is complete
  };
  static const std::vector<Range> kEdges[] = {
      /*kStart*/ {{0x20, 0x21, -1},
                  {0x23, 0x5B, -1},
                  {0x5D, 0x7F, -1},
                  {0xC2, 0xDF, kNeed1},
                  {0xE0, 0xE0, kAfterE0},
                  {0xE1, 0xEC, kNeed2},
                  {0xED, 0xED, kAfterED},
                  {0xEE, 0xEF, kNeed2},
                  {0xF0, 0xF0, kAfterF0},
                  {0xF1, 0xF3, kNeed3},
                  {0xF4, 0xF4, kAfterF4}},
      /*kNeed1*/ {{0x80, 0xBF, -1}},
      /*kNeed2*/ {{0x80, 0xBF, kNeed1}},
      /*kNeed3*/ {{0x80, 0xBF, kNeed2}},
      /*kAfterE0*/ {{0xA0, 0xBF, kNeed1}},
      /*kAfterED*/ {{0x80, 0x9F, kNeed1}},
      /*kAfterF0*/ {{0x90, 0xBF, kNeed2}},
      /*kAfterF4*/ {{0x80, 0x8F, kNeed2}},
  };
  const Automaton& a = automaton_;
  int32_t result = kTextUnknown;  // the one end state seen so far
  bool died = false, lived = false;
  std::vector<std::pair<int8_t, int32_t>> work = {{kStart, state}}, seen = work;
  while (!work.empty() && result != kTextMixed) {
    const auto [u, g] = work.back();
    work.pop_back();
    for (const Range& r : kEdges[u]) {
      for (int b = r.lo; b <= r.hi && result != kTextMixed; ++b) {
        const int32_t next = a.states[g].has_bytes ? a.Next(g, static_cast<uint8_t>(b)) : -1;
        if (next < 0 || a.NeedsClosure(next)) {
          // Dying at a first byte is fine if every first byte dies (kTextNone); a call or a
          // return inside the character is not alike for all.
          if (next < 0 && u == kStart) {
            died = true;
          } else {
            result = kTextMixed;
          }
          continue;
        }
        if (r.next < 0) {
          lived = true;
          if (result == kTextUnknown) result = next;
          if (result != next) result = kTextMixed;
        } else if (std::find(seen.begin(), seen.end(), std::pair{r.next, next}) == seen.end()) {
          if (u == kStart) lived = true;
          seen.emplace_back(r.next, next);
          work.emplace_back(r.next, next);
        }
      }
    }
  }
  if (result != kTextMixed) {
    if (died && lived) result = kTextMixed;
    if (!lived) result = kTextNone;
  }
  text_step_[state].store(result, std::memory_order_relaxed);
  return result;
}

int CompiledGrammar::TextCharsAllowed(int32_t state) const {
  int32_t s = state;
  for (int n = 0; n < Vocabulary::kMaxTextChars; ++n) {
    const int32_t next = TextStep(s);
    if (next == kTextMixed) return -1;
    if (next == kTextNone) return n;
    s = next;
  }
  return Vocabulary::kMaxTextChars;
}

CompiledGrammar::StateMask CompiledGrammar::MaskByFullWalk(int32_t state) const {
  const Vocabulary& v = *vocabulary_;
  StateMask m;
  m.bits.assign(v.mask_words(), 0);
  m.overflowed =
      !internal::WalkTrieFromState(automaton_, v.trie(), state, {m.bits.data(), &m.exits});
  return m;
}

std::shared_ptr<const CompiledGrammar::StateMask> CompiledGrammar::MaskOf(int32_t state) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cache_[state]) return cache_[state];
  }
  // Computed outside the lock: two threads may both compute it; the first one stored wins.
  const Vocabulary& v = *vocabulary_;
  auto m = std::make_shared<StateMask>();
  std::vector<uint32_t> bits(v.mask_words(), 0);
  const int text_chars = TextCharsAllowed(state);
  if (text_chars >= 0) {
    // Every text token of up to text_chars characters, no text token longer (or none of them
    // without a text state), then the walk of the rest.
    const std::span<const uint32_t> text = v.text_up_to(text_chars);
    std::copy(text.begin(), text.end(), bits.begin());
    m->rest_trie = true;
  }
  m->overflowed = !internal::WalkTrieFromState(automaton_, m->rest_trie ? v.rest_trie() : v.trie(),
                                               state, {bits.data(), &m->exits});
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
                        a.next.size() * sizeof(int32_t) + a.refs.size() * sizeof(Automaton::Call) +
                        a.states.size() * sizeof(int32_t);  // text_step_
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
        const Vocabulary::Trie& trie = m.rest_trie ? v.rest_trie() : v.trie();
        const Vocabulary::Node& n = trie.nodes[node];
        WalkTrie(a, trie, arena_, node + 1, n.end, n.depth, set_begin, set_end, /*local=*/false,
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
