// Parser from tokens to the syntax tree, following jinja2.parser's grammar and precedence (which
// is Python's, except that `**` is left-associative and filters bind tighter than unary minus's
// operand).
#pragma once

#include <vector>

#include "core/status.h"
#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace moeserve::jinja {

// Errors name the line and the construct: unknown tags, filters and tests, unclosed blocks (with
// the tag that opened them), misplaced end tags, malformed expressions, constructs this
// interpreter does not support (include, extends, recursive loops, ...).
Result<Body> ParseTemplate(std::vector<Token> tokens);

}  // namespace moeserve::jinja
