// GBNF, llama.cpp's grammar syntax (which xgrammar's EBNF shares), parsed into a Grammar.
//
//   root  ::= item ("," ws item)*      # a rule; the grammar starts at `root`
//   item  ::= [a-z]+ | "\"" [^"\n]* "\"" | "x"{2,4} | .?
//
// Rules `name ::= body` (names: letters, digits, '-', '_'); a body runs to the end of its line
// unless inside parentheses or after '|' or '::='; alternation `|`, grouping `( )`, postfix
// `*` `+` `?` `{m}` `{m,}` `{m,n}` `{,n}`; literals "..." and classes [...] / [^...] with
// escapes \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH; `.` any character; `#` comments.
// Characters are Unicode code points, matched as their UTF-8 bytes. Errors name the line and
// column, an undefined or redefined rule, or the limit exceeded.
#pragma once

#include <string_view>

#include "core/status.h"
#include "structured/grammar.h"

namespace moeserve::structured {

Result<Grammar> ParseGbnf(std::string_view text, const Limits& limits = {});

}  // namespace moeserve::structured
