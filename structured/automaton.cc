#include "structured/automaton.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <utility>

namespace moeserve::structured {

std::vector<std::vector<CodeRange>> Utf8ByteRanges(uint32_t lo, uint32_t hi) {
  std::vector<std::vector<CodeRange>> out;
  // Split at the encoding-length boundaries and around the surrogates, then at the 6-bit
  // boundaries until each piece shares its leading bytes' prefix (RE2's and utf8-ranges'
  // construction).
  std::vector<CodeRange> work;
  // NormalizeRanges keeps U+D7FF and U+E000 adjacent (one range over the gap): cut it here.
  for (const CodeRange& r : NormalizeRanges({{lo, hi}})) {
    if (r.lo < 0xD800 && r.hi > 0xDFFF) {
      work.push_back({r.lo, 0xD7FF});
      work.push_back({0xE000, r.hi});
    } else {
      work.push_back(r);
    }
  }
  const uint32_t kLenMax[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  while (!work.empty()) {
    CodeRange r = work.back();
    work.pop_back();
    bool split = false;
    for (uint32_t m : kLenMax) {
      if (r.lo <= m && r.hi > m) {
        work.push_back({r.lo, m});
        work.push_back({m + 1, r.hi});
        split = true;
        break;
      }
    }
    if (split) continue;
    const int len = r.hi <= 0x7F ? 1 : r.hi <= 0x7FF ? 2 : r.hi <= 0xFFFF ? 3 : 4;
    for (int i = 1; i < len && !split; ++i) {
      const uint32_t m = (1u << (6 * i)) - 1;
      if ((r.lo & ~m) != (r.hi & ~m)) {
        if ((r.lo & m) != 0) {
          work.push_back({r.lo, r.lo | m});
          work.push_back({(r.lo | m) + 1, r.hi});
          split = true;
        } else if ((r.hi & m) != m) {
          work.push_back({r.lo, (r.hi & ~m) - 1});
          work.push_back({r.hi & ~m, r.hi});
          split = true;
        }
      }
    }
    if (split) continue;
    const std::string a = EncodeUtf8(r.lo), b = EncodeUtf8(r.hi);
    std::vector<CodeRange> seq;
    for (size_t i = 0; i < a.size(); ++i) {
      seq.push_back({static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i])});
    }
    out.push_back(std::move(seq));
  }
  return out;
}

namespace {

struct NfaState {
  std::vector<int32_t> eps;
  struct ByteEdge {
    uint8_t lo, hi;
    int32_t to;
  };
  std::vector<ByteEdge> bytes;
  std::vector<Automaton::Call> calls;  // (rule, to): `to` is an NFA state here
};

struct Fragment {
  int32_t start, accept;
};

class NfaBuilder {
 public:
  NfaBuilder(std::vector<NfaState>& nfa, const Limits& limits) : nfa_(nfa), limits_(limits) {}

  Result<Fragment> Build(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kEmpty: {
        ASSIGN_OR_RETURN(int32_t s, New());
        return Fragment{s, s};
      }
      case Expr::Kind::kBytes: {
        ASSIGN_OR_RETURN(int32_t s, New());
        int32_t cur = s;
        for (char c : e.bytes) {
          ASSIGN_OR_RETURN(int32_t t, New());
          const uint8_t b = static_cast<uint8_t>(c);
          nfa_[cur].bytes.push_back({b, b, t});
          cur = t;
        }
        return Fragment{s, cur};
      }
      case Expr::Kind::kByteSet: {
        ASSIGN_OR_RETURN(int32_t s, New());
        ASSIGN_OR_RETURN(int32_t t, New());
        for (const CodeRange& r : e.ranges) {
          nfa_[s].bytes.push_back({static_cast<uint8_t>(r.lo), static_cast<uint8_t>(r.hi), t});
        }
        return Fragment{s, t};
      }
      case Expr::Kind::kChars: {
        ASSIGN_OR_RETURN(int32_t s, New());
        ASSIGN_OR_RETURN(int32_t t, New());
        for (const CodeRange& r : e.ranges) {
          // A repetition repeats its character classes: their encodings are made once.
          auto [it, fresh] = utf8_.try_emplace({r.lo, r.hi});
          if (fresh) it->second = Utf8ByteRanges(r.lo, r.hi);
          for (const std::vector<CodeRange>& seq : it->second) {
            int32_t cur = s;
            for (size_t i = 0; i < seq.size(); ++i) {
              int32_t to = t;
              if (i + 1 < seq.size()) {
                ASSIGN_OR_RETURN(to, New());
              }
              nfa_[cur].bytes.push_back(
                  {static_cast<uint8_t>(seq[i].lo), static_cast<uint8_t>(seq[i].hi), to});
              cur = to;
            }
          }
        }
        return Fragment{s, t};
      }
      case Expr::Kind::kRule: {
        ASSIGN_OR_RETURN(int32_t s, New());
        ASSIGN_OR_RETURN(int32_t t, New());
        nfa_[s].calls.push_back({e.rule, t});
        return Fragment{s, t};
      }
      case Expr::Kind::kSeq: {
        ASSIGN_OR_RETURN(Fragment f, Build(e.children[0]));
        for (size_t i = 1; i < e.children.size(); ++i) {
          ASSIGN_OR_RETURN(Fragment g, Build(e.children[i]));
          nfa_[f.accept].eps.push_back(g.start);
          f.accept = g.accept;
        }
        return f;
      }
      case Expr::Kind::kAlt: {
        ASSIGN_OR_RETURN(int32_t s, New());
        ASSIGN_OR_RETURN(int32_t t, New());
        for (const Expr& c : e.children) {
          ASSIGN_OR_RETURN(Fragment g, Build(c));
          nfa_[s].eps.push_back(g.start);
          nfa_[g.accept].eps.push_back(t);
        }
        return Fragment{s, t};
      }
      case Expr::Kind::kRepeat: {
        ASSIGN_OR_RETURN(int32_t s, New());
        int32_t cur = s;
        for (int i = 0; i < e.min; ++i) {
          ASSIGN_OR_RETURN(Fragment g, Build(e.children[0]));
          nfa_[cur].eps.push_back(g.start);
          cur = g.accept;
        }
        ASSIGN_OR_RETURN(int32_t end, New());
        if (e.max == Expr::kUnbounded) {
          ASSIGN_OR_RETURN(Fragment g, Build(e.children[0]));
          nfa_[cur].eps.push_back(g.start);
          nfa_[g.accept].eps.push_back(cur);
          nfa_[cur].eps.push_back(end);
        } else {
          for (int i = e.min; i < e.max; ++i) {
            ASSIGN_OR_RETURN(Fragment g, Build(e.children[0]));
            nfa_[cur].eps.push_back(end);
            nfa_[cur].eps.push_back(g.start);
            cur = g.accept;
          }
          nfa_[cur].eps.push_back(end);
        }
        return Fragment{s, end};
      }
    }
    return Internal("unknown Expr kind");
  }

 private:
  Result<int32_t> New() {
    if (nfa_.size() >= limits_.max_nfa_states) {
      return InvalidArgument("grammar too large: more than {} automaton states (max_nfa_states)",
                             limits_.max_nfa_states);
    }
    nfa_.emplace_back();
    return static_cast<int32_t>(nfa_.size() - 1);
  }

  std::vector<NfaState>& nfa_;
  const Limits& limits_;
  std::map<std::pair<uint32_t, uint32_t>, std::vector<std::vector<CodeRange>>> utf8_;
};

// The subset construction of one rule's NFA into Automaton states.
class Determinizer {
 public:
  Determinizer(const std::vector<NfaState>& nfa, Automaton& a, const Limits& limits)
      : nfa_(nfa), a_(a), limits_(limits), mark_(nfa.size(), 0) {}

  Result<int32_t> Rule(int32_t rule, Fragment f) {
    sets_.clear();
    index_.clear();
    accept_ = f.accept;
    rule_ = rule;
    first_id_ = static_cast<int32_t>(a_.states.size());
    seeds_.assign(1, f.start);
    ASSIGN_OR_RETURN(int32_t start, Intern(Closure(seeds_)));
    // sets_ grows while we walk it.
    for (size_t i = 0; i < sets_.size(); ++i) RETURN_IF_ERROR(Expand(i));
    return start;
  }

 private:
  struct SetHash {
    size_t operator()(const std::vector<int32_t>& v) const {
      uint64_t h = v.size();
      for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 0x100000001B3ull;
      return static_cast<size_t>(h ^ (h >> 29));
    }
  };

  // The epsilon closure of `seeds` (consumed), sorted; valid until the next call.
  const std::vector<int32_t>& Closure(std::vector<int32_t>& seeds) {
    ++stamp_;
    std::vector<int32_t>& out = closure_;
    out.clear();
    while (!seeds.empty()) {
      int32_t s = seeds.back();
      seeds.pop_back();
      if (mark_[s] == stamp_) continue;
      mark_[s] = stamp_;
      out.push_back(s);
      for (int32_t t : nfa_[s].eps) {
        if (mark_[t] != stamp_) seeds.push_back(t);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  Result<int32_t> Intern(const std::vector<int32_t>& set) {
    auto it = index_.find(set);
    if (it != index_.end()) return it->second;
    work_ += set.size();
    if (work_ > limits_.max_dfa_work) {
      return InvalidArgument(
          "grammar too complex: its deterministic automaton's states hold more than {} NFA "
          "states in all (max_dfa_work)",
          limits_.max_dfa_work);
    }
    if (a_.states.size() >= limits_.max_dfa_states) {
      return InvalidArgument(
          "grammar too complex: more than {} deterministic automaton states (max_dfa_states)",
          limits_.max_dfa_states);
    }
    const int32_t id = static_cast<int32_t>(a_.states.size());
    Automaton::State st;
    st.rule = rule_;
    st.final = std::binary_search(set.begin(), set.end(), accept_);
    a_.states.push_back(st);
    a_.next.resize(a_.next.size() + a_.num_classes, -1);
    sets_.push_back(&index_.emplace(set, id).first->first);
    return id;
  }

  Status Expand(size_t i) {
    const int32_t id = first_id_ + static_cast<int32_t>(i);
    const std::vector<int32_t>& set = *sets_[i];
    // Bytes: cut 0..255 where any edge starts or ends; each piece has one target set.
    bool cut[257] = {};
    cut[0] = cut[256] = true;
    for (int32_t s : set) {
      for (const NfaState::ByteEdge& e : nfa_[s].bytes) cut[e.lo] = cut[e.hi + 1] = true;
    }
    seen_.clear();  // targets before closure -> state
    for (int b = 0; b < 256;) {
      int end = b + 1;
      while (!cut[end]) ++end;
      targets_.clear();
      for (int32_t s : set) {
        for (const NfaState::ByteEdge& e : nfa_[s].bytes) {
          if (e.lo <= b && b <= e.hi) targets_.push_back(e.to);
        }
      }
      if (!targets_.empty()) {
        std::sort(targets_.begin(), targets_.end());
        targets_.erase(std::unique(targets_.begin(), targets_.end()), targets_.end());
        int32_t to = -1;
        for (const auto& [t, state] : seen_) {
          if (t == targets_) to = state;
        }
        if (to < 0) {
          seeds_ = targets_;
          ASSIGN_OR_RETURN(to, Intern(Closure(seeds_)));
          seen_.emplace_back(targets_, to);
        }
        // [b, end) is a run of whole classes (the grammar's cuts include this state's).
        const auto row = a_.next.begin() + size_t(id) * a_.num_classes;
        std::fill(row + a_.byte_class[b], row + a_.byte_class[end - 1] + 1, to);
        a_.states[id].has_bytes = true;
      }
      b = end;
    }
    // Calls: one edge per rule, its return targets merged.
    std::map<int32_t, std::vector<int32_t>> calls;
    for (int32_t s : set) {
      for (const Automaton::Call& c : nfa_[s].calls) calls[c.rule].push_back(c.ret);
    }
    a_.states[id].ref_begin = static_cast<uint32_t>(a_.refs.size());
    std::vector<Automaton::Call> out;
    for (auto& [rule, targets] : calls) {
      ASSIGN_OR_RETURN(int32_t to, Intern(Closure(targets)));
      out.push_back({rule, to});
    }
    a_.refs.insert(a_.refs.end(), out.begin(), out.end());
    a_.states[id].ref_end = static_cast<uint32_t>(a_.refs.size());
    return OkStatus();
  }

  const std::vector<NfaState>& nfa_;
  Automaton& a_;
  const Limits& limits_;
  std::vector<uint32_t> mark_;
  uint32_t stamp_ = 0;
  size_t work_ = 0;
  int32_t accept_ = 0;
  int32_t rule_ = 0;
  int32_t first_id_ = 0;  // the automaton state of sets_[0]
  std::unordered_map<std::vector<int32_t>, int32_t, SetHash> index_;
  // NFA state sets of this rule (index_'s keys), by state - first_id_.
  std::vector<const std::vector<int32_t>*> sets_;
  // Buffers.
  std::vector<std::pair<std::vector<int32_t>, int32_t>> seen_;
  std::vector<int32_t> targets_, seeds_, closure_;
};

// The states of `rule` reached from its start through calls of nullable rules only (no byte
// read): the calls met on the way are the rules it can call first (left calls).
std::vector<int32_t> EpsilonReach(const Automaton& a, int32_t rule,
                                  const std::vector<char>& nullable) {
  std::vector<int32_t> seen = {a.rule_start[rule]}, work = seen;
  while (!work.empty()) {
    int32_t s = work.back();
    work.pop_back();
    for (uint32_t i = a.states[s].ref_begin; i < a.states[s].ref_end; ++i) {
      const Automaton::Call& c = a.refs[i];
      if (nullable[c.rule] && std::find(seen.begin(), seen.end(), c.ret) == seen.end()) {
        seen.push_back(c.ret);
        work.push_back(c.ret);
      }
    }
  }
  return seen;
}

Status CheckLeftRecursion(const Automaton& a) {
  const size_t n = a.rule_start.size();
  std::vector<char> nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (int32_t s : EpsilonReach(a, static_cast<int32_t>(r), nullable)) {
        if (a.states[s].final) {
          nullable[r] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  std::vector<std::vector<int32_t>> first_calls(n);
  for (size_t r = 0; r < n; ++r) {
    for (int32_t s : EpsilonReach(a, static_cast<int32_t>(r), nullable)) {
      for (uint32_t i = a.states[s].ref_begin; i < a.states[s].ref_end; ++i) {
        first_calls[r].push_back(a.refs[i].rule);
      }
    }
  }
  // A cycle in the first-call graph (iterative DFS, colours 0 new, 1 on the path, 2 done).
  std::vector<char> colour(n, 0);
  for (size_t root = 0; root < n; ++root) {
    if (colour[root]) continue;
    std::vector<std::pair<int32_t, size_t>> path = {{static_cast<int32_t>(root), 0}};
    colour[root] = 1;
    while (!path.empty()) {
      auto& [r, i] = path.back();
      if (i == first_calls[r].size()) {
        colour[r] = 2;
        path.pop_back();
        continue;
      }
      const int32_t q = first_calls[r][i++];
      if (colour[q] == 1) {
        return InvalidArgument(
            "left recursion: rule '{}' can reach itself without reading any input",
            a.rule_names[q]);
      }
      if (colour[q] == 0) {
        colour[q] = 1;
        path.push_back({q, 0});
      }
    }
  }
  return OkStatus();
}

}  // namespace

Result<Automaton> BuildAutomaton(const Grammar& grammar, const Limits& limits) {
  RETURN_IF_ERROR(CheckGrammar(grammar, limits));
  std::vector<NfaState> nfa;
  NfaBuilder builder(nfa, limits);
  std::vector<Fragment> fragments;
  for (const Expr& body : grammar.bodies) {
    ASSIGN_OR_RETURN(Fragment f, builder.Build(body));
    fragments.push_back(f);
  }
  Automaton a;
  a.rule_names = grammar.names;
  a.root = grammar.root;
  // Byte classes: the runs of bytes between the cuts of every edge.
  bool cut[257] = {};
  for (const NfaState& n : nfa) {
    for (const NfaState::ByteEdge& e : n.bytes) cut[e.lo] = cut[e.hi + 1] = true;
  }
  int32_t cls = -1;
  for (int b = 0; b < 256; ++b) {
    if (b == 0 || cut[b]) ++cls;
    a.byte_class[b] = static_cast<uint8_t>(cls);
  }
  a.num_classes = cls + 1;
  Determinizer det(nfa, a, limits);
  for (size_t r = 0; r < fragments.size(); ++r) {
    ASSIGN_OR_RETURN(int32_t start, det.Rule(static_cast<int32_t>(r), fragments[r]));
    a.rule_start.push_back(start);
  }
  RETURN_IF_ERROR(CheckLeftRecursion(a));
  return a;
}

}  // namespace moeserve::structured
