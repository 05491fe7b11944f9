// A Grammar compiled to a pushdown automaton over bytes: each rule becomes a deterministic
// automaton (DFA) whose edges read one byte or call a rule; calls push the state to return to.
//
//   state s of rule r:  Next(s, b)         the state after byte b in the same rule, or -1
//                       refs of s          (rule q, return state t): run q from its start, then t
//                       final              r may end here (pop the caller's return state)
//
// Bytes that every edge of the grammar treats alike share a class (a JSON grammar has a few
// dozen), so the table has a column per class, not per byte.
//
// Code points become their UTF-8 byte sequences, repetitions are unrolled, alternatives merged by
// the subset construction, so a rule's own bytes never branch; only calls and returns do. Left
// recursion (a rule reaching itself without reading a byte) is refused, as llama.cpp refuses it:
// the matcher's closure would never end.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "structured/grammar.h"

namespace moeserve::structured {

struct Automaton {
  struct State {
    int32_t rule = 0;
    bool final = false;
    bool has_bytes = false;  // some next[] entry is >= 0
    uint32_t ref_begin = 0;  // refs[ref_begin, ref_end)
    uint32_t ref_end = 0;
  };
  struct Call {
    int32_t rule = 0;
    int32_t ret = 0;  // state of the caller's rule to continue at
  };

  std::vector<State> states;
  std::array<uint8_t, 256> byte_class{};  // byte -> its class, 0..num_classes - 1
  int32_t num_classes = 1;
  std::vector<int32_t> next;  // [states.size() * num_classes]
  std::vector<Call> refs;
  std::vector<int32_t> rule_start;  // per rule: its start state
  std::vector<std::string> rule_names;
  int32_t root = 0;

  int32_t Next(int32_t state, uint8_t byte) const {
    return next[size_t(state) * num_classes + byte_class[byte]];
  }
  bool NeedsClosure(int32_t state) const {
    const State& s = states[state];
    return s.final || s.ref_begin != s.ref_end;
  }
};

// InvalidArgument naming the limit (max_nfa_states, max_dfa_states) or the left-recursive rule.
Result<Automaton> BuildAutomaton(const Grammar& grammar, const Limits& limits);

// The byte sequences of the UTF-8 encodings of code points lo..hi: each sequence is a list of
// byte ranges (one per byte position), together covering exactly lo..hi (surrogates excluded).
std::vector<std::vector<CodeRange>> Utf8ByteRanges(uint32_t lo, uint32_t hi);

}  // namespace moeserve::structured
