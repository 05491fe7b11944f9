// The pushdown automaton run over bytes, shared by the matcher and the per-state mask cache
// (private to structured/).
//
// A parser state is a set of threads (state, stack); a stack is a linked list of Frames in an
// arena (stack -1: empty). Reading a byte moves every thread along its state's byte edge, then
// closes the set: calls push the return state and start the called rule, final states pop. Sets
// are stored one after another in Arena::threads, so walking a trie and backing out of a subtree
// is truncating two vectors.
//
// Two meanings of the empty stack:
//   full mode   the real stack: popping it means the root rule is complete (the grammar can end);
//   local mode  an unknown caller (the mask cache of one state): popping it is an "exit", where
//               the result depends on the caller, checked later against the live stack.
#pragma once

#include <cstdint>
#include <vector>

#include "structured/automaton.h"
#include "structured/vocabulary.h"

namespace moeserve::structured::internal {

struct Frame {
  int32_t ret;     // the state to continue at when the called rule ends
  int32_t parent;  // the frame below, or -1
};

struct Thread {
  int32_t state;
  int32_t stack;  // top frame, or -1
};

// Bounds on an ambiguous grammar, whose parser sets can grow with the input (no real grammar
// comes near): threads in one set, and threads compared or added in one call of the matcher or
// one per-state mask walk (tens of milliseconds). Past either, Arena::overflowed is set and the
// work stops.
inline constexpr size_t kMaxThreadsPerSet = 1024;
inline constexpr size_t kMaxWorkPerCall = 4000000;

// Per depth of a trie walk: the set's range in Arena::threads and the frames it needs.
struct WalkLevel {
  size_t begin, end, frames;
};

struct Arena {
  std::vector<Frame> frames;
  std::vector<Thread> threads;
  std::vector<Thread> work;       // AddClosure's worklist
  std::vector<WalkLevel> levels;  // WalkTrie's, kept to save an allocation per walk
  size_t work_done = 0;           // threads compared and added since the caller reset it
  bool overflowed = false;        // a bound was hit: sets are incomplete
};

// Appends to arena.threads the closure of t (t and every thread reached without reading a byte),
// leaving out threads already in [set_begin, end). True when a final state popped the empty stack.
bool AddClosure(const Automaton& a, Arena& arena, size_t set_begin, Thread t);

// Appends the set reached from threads [from, to) by `byte` (closed). True when the empty
// stack was popped on the way.
bool Advance(const Automaton& a, Arena& arena, size_t from, size_t to, uint8_t byte);

// What a trie walk found.
struct WalkOutput {
  uint32_t* mask = nullptr;               // bits of the tokens that can be read (mask_words())
  std::vector<int32_t>* exits = nullptr;  // local mode: nodes with children where the stack popped
};

// Walks the nodes [first, last) of `trie` (a run of whole subtrees whose parent is at depth
// base_depth), starting from the set [set_begin, set_end) at base_depth, setting the bits of every
// token the grammar can read. local: the empty stack is an unknown caller (exits recorded).
// Leaves arena as it found it past set_end.
void WalkTrie(const Automaton& a, const Vocabulary::Trie& trie, Arena& arena, int32_t first,
              int32_t last, int base_depth, size_t set_begin, size_t set_end, bool local,
              WalkOutput out);

// The walk of a whole trie from one state with an unknown caller (local mode), what
// CompiledGrammar caches: a tight loop over one DFA state per depth while the path stays inside
// the state's rule without calls or returns, WalkTrie for the subtrees where it does not. False
// when a bound was hit (the output is incomplete).
bool WalkTrieFromState(const Automaton& a, const Vocabulary::Trie& trie, int32_t state,
                       WalkOutput out);

}  // namespace moeserve::structured::internal
