#include "structured/pda_walk.h"

#include <algorithm>

namespace moeserve::structured::internal {

namespace {

bool SameStack(const std::vector<Frame>& frames, int32_t x, int32_t y) {
  while (x != y) {
    if (x < 0 || y < 0 || frames[x].ret != frames[y].ret) return false;
    x = frames[x].parent;
    y = frames[y].parent;
  }
  return true;
}

bool Contains(Arena& arena, size_t begin, Thread t) {
  arena.work_done += arena.threads.size() - begin + 1;
  for (size_t i = begin; i < arena.threads.size(); ++i) {
    const Thread& u = arena.threads[i];
    if (u.state == t.state && SameStack(arena.frames, u.stack, t.stack)) return true;
  }
  return false;
}

}  // namespace

bool AddClosure(const Automaton& a, Arena& arena, size_t set_begin, Thread t) {
  if (arena.overflowed) return false;
  if (arena.work_done > kMaxWorkPerCall) {
    arena.overflowed = true;
    return false;
  }
  if (!a.NeedsClosure(t.state)) {
    // The common case: a state that only reads bytes.
    if (Contains(arena, set_begin, t)) return false;
    if (arena.threads.size() - set_begin >= kMaxThreadsPerSet) {
      arena.overflowed = true;
      return false;
    }
    arena.threads.push_back(t);
    return false;
  }
  bool popped = false;
  std::vector<Thread>& work = arena.work;
  work.clear();
  work.push_back(t);
  while (!work.empty()) {
    const Thread u = work.back();
    work.pop_back();
    if (Contains(arena, set_begin, u)) continue;
    if (arena.work_done > kMaxWorkPerCall) {
      arena.overflowed = true;
      return popped;
    }
    if (arena.threads.size() - set_begin >= kMaxThreadsPerSet) {
      arena.overflowed = true;
      return popped;
    }
    arena.threads.push_back(u);
    const Automaton::State& s = a.states[u.state];
    for (uint32_t i = s.ref_begin; i < s.ref_end; ++i) {
      const Automaton::Call& c = a.refs[i];
      arena.frames.push_back({c.ret, u.stack});
      work.push_back({a.rule_start[c.rule], static_cast<int32_t>(arena.frames.size() - 1)});
    }
    if (s.final) {
      if (u.stack < 0) {
        popped = true;
      } else {
        const Frame f = arena.frames[u.stack];
        work.push_back({f.ret, f.parent});
      }
    }
  }
  return popped;
}

bool Advance(const Automaton& a, Arena& arena, size_t from, size_t to, uint8_t byte) {
  const size_t begin = arena.threads.size();
  bool popped = false;
  for (size_t i = from; i < to; ++i) {
    const Thread t = arena.threads[i];
    if (!a.states[t.state].has_bytes) continue;
    const int32_t next = a.Next(t.state, byte);
    if (next < 0) continue;
    popped |= AddClosure(a, arena, begin, {next, t.stack});
  }
  return popped;
}

void WalkTrie(const Automaton& a, const Vocabulary::Trie& trie, Arena& arena, int32_t first,
              int32_t last, int base_depth, size_t set_begin, size_t set_end, bool local,
              WalkOutput out) {
  const std::vector<Vocabulary::Node>& nodes = trie.nodes;
  const size_t threads_mark = arena.threads.size(), frames_mark = arena.frames.size();
  // Per depth (relative to base_depth).
  std::vector<WalkLevel>& levels = arena.levels;
  levels.resize(static_cast<size_t>(std::max(trie.max_depth - base_depth, 0) + 2));
  levels[0] = {set_begin, set_end, frames_mark};
  uint32_t* mask = out.mask;
  int32_t i = first;
  while (i < last && !arena.overflowed) {
    const Vocabulary::Node& n = nodes[i];
    const WalkLevel& parent = levels[n.depth - base_depth - 1];
    arena.threads.resize(std::max(parent.end, threads_mark));
    arena.frames.resize(parent.frames);
    const size_t begin = arena.threads.size();
    bool popped = false;
    if (parent.end - parent.begin == 1) {
      // One thread (inside a string, a number, a literal): no set to merge into.
      const Thread t = arena.threads[parent.begin];
      const int32_t next = a.states[t.state].has_bytes ? a.Next(t.state, n.byte) : -1;
      if (next >= 0) {
        if (a.NeedsClosure(next)) {
          popped = AddClosure(a, arena, begin, {next, t.stack});
        } else {
          arena.threads.push_back({next, t.stack});
        }
      }
    } else {
      popped = Advance(a, arena, parent.begin, parent.end, n.byte);
    }
    const bool alive = arena.threads.size() > begin;
    if (alive || popped) {
      for (int32_t id : trie.tokens_at(n)) mask[id >> 5] |= 1u << (id & 31);
    }
    if (popped && local && n.end > i + 1) out.exits->push_back(i);
    if (!alive) {
      i = n.end;
      continue;
    }
    levels[n.depth - base_depth] = {begin, arena.threads.size(), arena.frames.size()};
    ++i;
  }
  arena.threads.resize(threads_mark);
  arena.frames.resize(frames_mark);
}

bool WalkTrieFromState(const Automaton& a, const Vocabulary::Trie& trie, int32_t state,
                       WalkOutput out) {
  const std::vector<Vocabulary::Node>& nodes = trie.nodes;
  uint32_t* mask = out.mask;
  std::vector<int32_t> at_depth(static_cast<size_t>(trie.max_depth) + 1);
  at_depth[0] = state;
  Arena arena;
  const int32_t last = static_cast<int32_t>(nodes.size());
  int32_t i = 1;
  while (i < last) {
    const Vocabulary::Node& n = nodes[i];
    const int32_t from = at_depth[n.depth - 1];
    const int32_t next = a.states[from].has_bytes ? a.Next(from, n.byte) : -1;
    if (next < 0) {
      i = n.end;
      continue;
    }
    if (a.NeedsClosure(next)) {
      // A call or a return: the general walk over this subtree, from the parent's state.
      arena.threads.assign(1, {from, -1});
      arena.frames.clear();
      WalkTrie(a, trie, arena, i, n.end, n.depth - 1, 0, 1, /*local=*/true, out);
      if (arena.overflowed) return false;
      i = n.end;
      continue;
    }
    for (int32_t id : trie.tokens_at(n)) mask[id >> 5] |= 1u << (id & 31);
    at_depth[n.depth] = next;
    ++i;
  }
  return true;
}

}  // namespace moeserve::structured::internal
