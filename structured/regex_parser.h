// Regular expressions (the subset of Python's `re` and ECMAScript that vLLM's users write) as a
// Grammar expression: an automaton, never backtracking; the whole output must match (as
// re.fullmatch; `^` at the start and `$` at the end are allowed and change nothing).
//
//   literals and escapes  a \. \\ \n \t \r \f \v \0 \xHH \uHHHH \UHHHHHHHH
//   classes               [abc] [^a-z] [\d_-] . \d \D \w \W \s \S
//   groups                (...) (?:...) (?P<name>...) (?<name>...)
//   quantifiers           * + ? {m} {m,} {m,n} {,n}, lazy (*?) and possessive (*+) alike
//   alternation           a|b
//
// Refused with an error naming them: backreferences, lookaround, inline flags, \b \B, anchors
// inside the pattern. Shorthands produce ASCII: \d is [0-9], \w [A-Za-z0-9_], \s [ \t\n\r\f\v];
// their negations and a negated class holding a shorthand are cut to ASCII, so every output also
// matches Python's Unicode-aware reading of the same pattern.
#pragma once

#include <string_view>

#include "core/status.h"
#include "structured/grammar.h"

namespace moeserve::structured {

// The pattern as one expression over code points (no rule references).
Result<Expr> ParseRegex(std::string_view pattern, const Limits& limits = {});

// A grammar whose root rule is the pattern.
Result<Grammar> RegexGrammar(std::string_view pattern, const Limits& limits = {});

}  // namespace moeserve::structured
