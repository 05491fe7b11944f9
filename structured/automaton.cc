#include "structured/automaton.h"

#include <algorithm>
#include <map>
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
          for (const std::vector<CodeRange>& seq : Utf8ByteRanges(r.lo, r.hi)) {
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
    ASSIGN_OR_RETURN(int32_t start, Intern(Closure({f.start})));
    // sets_ grows while we walk it.
    for (size_t i = 0; i < sets_.size(); ++i) RETURN_IF_ERROR(Expand(i));
    return start;
  }

 private:
  std::vector<int32_t> Closure(std::vector<int32_t> seeds) {
    ++stamp_;
    std::vector<int32_t> out;
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

  Result<int32_t> Intern(std::vector<int32_t> set) {
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
    a_.next.resize(a_.next.size() + 256, -1);
    index_.emplace(set, id);
    sets_.push_back({std::move(set), id});
    return id;
  }

  Status Expand(size_t i) {
    const int32_t id = sets_[i].second;
    std::vector<int32_t> set = sets_[i].first;  // a copy: Intern grows sets_
    // Bytes: cut 0..255 where any edge starts or ends; each piece has one target set.
    std::vector<int> cuts = {0, 256};
    for (int32_t s : set) {
      for (const NfaState::ByteEdge& e : nfa_[s].bytes) {
        cuts.push_back(e.lo);
        cuts.push_back(e.hi + 1);
      }
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::map<std::vector<int32_t>, int32_t> seen;  // targets before closure -> state
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const int b = cuts[c];
      std::vector<int32_t> targets;
      for (int32_t s : set) {
        for (const NfaState::ByteEdge& e : nfa_[s].bytes) {
          if (e.lo <= b && b <= e.hi) targets.push_back(e.to);
        }
      }
      if (targets.empty()) continue;
      std::sort(targets.begin(), targets.end());
      targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
      int32_t to;
      if (auto it = seen.find(targets); it != seen.end()) {
        to = it->second;
      } else {
        ASSIGN_OR_RETURN(to, Intern(Closure(targets)));
        seen.emplace(std::move(targets), to);
      }
      for (int x = b; x < cuts[c + 1]; ++x) a_.next[size_t(id) * 256 + x] = to;
      a_.states[id].has_bytes = true;
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
  std::map<std::vector<int32_t>, int32_t> index_;
  std::vector<std::pair<std::vector<int32_t>, int32_t>> sets_;
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
  Determinizer det(nfa, a, limits);
  for (size_t r = 0; r < fragments.size(); ++r) {
    ASSIGN_OR_RETURN(int32_t start, det.Rule(static_cast<int32_t>(r), fragments[r]));
    a.rule_start.push_back(start);
  }
  RETURN_IF_ERROR(CheckLeftRecursion(a));
  return a;
}

}  // namespace moeserve::structured
