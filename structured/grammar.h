// The one grammar form every structured-output spec compiles to: a context-free grammar whose
// rules are regular expressions over bytes, Unicode code-point sets and references to rules.
//
//   GBNF text ----(gbnf_parser)---.
//   regex ---------(regex_parser)--+--> Grammar (this file) --(automaton)--> Automaton
//   JSON Schema ---(json_schema)---'                                         (a DFA per rule)
//
// A Grammar is a plain value: a list of named rules, each one Expr tree, and the root rule. Code
// points are UTF-8 encoded when the automaton is built, so every matcher step is one byte (tokens
// split UTF-8 characters). Every producer of a Grammar checks its input against Limits and
// names the limit it hit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve::structured {

// What one spec may make us allocate or compute. Every limit hit is an InvalidArgument naming
// the limit (the server's 400).
struct Limits {
  size_t max_spec_bytes = 256 * 1024;  // a GBNF, regex, choice list or schema text
  int max_nesting = 64;                // parentheses in GBNF and regex, schema levels
  int max_repeat = 4096;               // m and n of {m,n}; minItems, maxLength, ...
  size_t max_expr_nodes = 200000;      // Expr nodes of the whole grammar, repetitions unrolled
  size_t max_rules = 4096;             // rules of the grammar
  size_t max_nfa_states = 200000;      // Thompson automaton states, all rules (~100 B each)
  size_t max_dfa_states = 20000;       // deterministic states, all rules (1 KiB each)
  size_t max_dfa_work = 1000000;       // NFA states summed over the deterministic states' sets
  int max_ref_depth = 64;              // $ref chains resolved one into another
  size_t max_enum_values = 4096;       // enum and choice entries
};

// Code points lo..hi, both included.
struct CodeRange {
  uint32_t lo = 0;
  uint32_t hi = 0;
  bool operator==(const CodeRange&) const = default;
};

// Largest code point; surrogates (U+D800..U+DFFF) are never produced.
inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

struct Expr {
  enum class Kind {
    kEmpty,    // matches ""
    kBytes,    // the literal bytes `bytes`
    kChars,    // one code point in `ranges` (UTF-8 encoded)
    kByteSet,  // one byte in `ranges` (each 0..255): raw bytes, for grammars over bytes
    kRule,     // the rule `rule`
    kSeq,      // children one after the other
    kAlt,      // one of children
    kRepeat,   // children[0] between min and max times (max = kUnbounded: no upper bound)
  };
  static constexpr int kUnbounded = -1;

  Kind kind = Kind::kEmpty;
  std::string bytes;
  std::vector<CodeRange> ranges;  // sorted, disjoint, not adjacent
  int rule = -1;
  std::vector<Expr> children;
  int min = 0;
  int max = kUnbounded;
};

// Builders.
Expr Empty();
Expr Lit(std::string bytes);
Expr Chars(std::vector<CodeRange> ranges);  // normalizes (sorts, merges) the ranges
Expr Char(uint32_t cp);
Expr ByteSet(std::vector<CodeRange> ranges);
Expr Ref(int rule);
Expr Seq(std::vector<Expr> children);
Expr Alt(std::vector<Expr> children);
Expr Repeat(Expr e, int min, int max);
inline Expr Opt(Expr e) { return Repeat(std::move(e), 0, 1); }
inline Expr Star(Expr e) { return Repeat(std::move(e), 0, Expr::kUnbounded); }
inline Expr Plus(Expr e) { return Repeat(std::move(e), 1, Expr::kUnbounded); }

// Sorted, merged ranges; ranges past kMaxCodePoint are cut; surrogates are removed.
std::vector<CodeRange> NormalizeRanges(std::vector<CodeRange> ranges);
// Every code point (surrogates excluded) not in `ranges` (normalized).
std::vector<CodeRange> ComplementRanges(const std::vector<CodeRange>& ranges);
std::vector<CodeRange> IntersectRanges(const std::vector<CodeRange>& a,
                                       const std::vector<CodeRange>& b);
// UTF-8 of one code point.
std::string EncodeUtf8(uint32_t cp);
// The code point at text[*i] (advancing *i past it), or -1 (and *i unchanged) for ill-formed UTF-8.
int64_t DecodeUtf8(std::string_view text, size_t* i);

struct Grammar {
  std::vector<std::string> names;  // per rule, for errors
  std::vector<Expr> bodies;        // per rule
  int root = -1;

  // A new rule named `name` with an empty body; its index.
  int AddRule(std::string name);
  // The rule named `name`, or -1.
  int Find(const std::string& name) const;
};

// Nodes of an Expr tree (repetitions counted once).
size_t CountNodes(const Expr& e);
// OK, or an InvalidArgument naming the limit: too many rules or nodes, a repetition count past
// max_repeat, a rule index out of range, no root.
Status CheckGrammar(const Grammar& g, const Limits& limits);

}  // namespace moeserve::structured
