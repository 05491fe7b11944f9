// Jinja template lexer with the settings transformers uses for chat templates: trim_blocks and
// lstrip_blocks on, keep_trailing_newline off, the default {{ }} {% %} {# #} delimiters and
// whitespace control with `-` and `+`. It reproduces jinja2.lexer's whitespace rules exactly,
// because chat-template output must match byte for byte.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve::jinja {

enum class TokenType {
  kData,           // template text between tags, whitespace control already applied
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,    // value: the unescaped literal
  kInteger,   // int_value
  kFloat,     // float_value
  kOperator,  // value: "+", "//", "(", ...
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  std::string value;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

// Human-readable token description for error messages ("end of print statement", "'foo'").
std::string DescribeToken(const Token& token);

// Splits a template into tokens; the last token is kEof. Errors name the line and the problem
// (unterminated tag, comment or string, unexpected character, unbalanced brackets).
Result<std::vector<Token>> Tokenize(std::string_view source);

}  // namespace moeserve::jinja
