#include "jinja/lexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "jinja/py_string.h"

namespace moeserve::jinja {
namespace {

Status SyntaxError(int line, std::string_view message) {
  return InvalidArgument("template syntax error at line {}: {}", line, message);
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// Python's regex \s over the code point at `pos`; returns its byte length, 0 if not whitespace.
size_t WhitespaceAt(std::string_view s, size_t pos) {
  if (pos >= s.size()) return 0;
  size_t end = pos;
  return IsPySpace(DecodeUtf8(s, &end)) ? end - pos : 0;
}

size_t SkipWhitespace(std::string_view s, size_t pos) {
  while (size_t n = WhitespaceAt(s, pos)) pos += n;
  return pos;
}

bool AllWhitespace(std::string_view s) { return SkipWhitespace(s, 0) == s.size(); }

// Python str.rstrip() (Unicode whitespace).
std::string_view RStrip(std::string_view s) {
  size_t keep = 0, pos = 0;
  while (pos < s.size()) {
    const char32_t cp = DecodeUtf8(s, &pos);
    if (!IsPySpace(cp)) keep = pos;
  }
  return s.substr(0, keep);
}

int CountNewlines(std::string_view s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

// `(\d+_)*\d+` starting at pos: digits with single underscores between them. Returns the end, or
// npos when there is no digit at pos.
size_t ScanDigits(std::string_view s, size_t pos) {
  if (pos >= s.size() || !IsDigit(s[pos])) return std::string_view::npos;
  while (true) {
    while (pos < s.size() && IsDigit(s[pos])) ++pos;
    if (pos + 1 < s.size() && s[pos] == '_' && IsDigit(s[pos + 1])) {
      ++pos;
      continue;
    }
    return pos;
  }
}

// jinja2.lexer.float_re at pos; returns the end or npos.
size_t ScanFloat(std::string_view s, size_t pos) {
  if (pos > 0 && s[pos - 1] == '.') return std::string_view::npos;
  const size_t int_end = ScanDigits(s, pos);
  if (int_end == std::string_view::npos) return int_end;
  size_t frac_end = std::string_view::npos;
  if (int_end < s.size() && s[int_end] == '.') frac_end = ScanDigits(s, int_end + 1);
  auto exponent = [&](size_t p) -> size_t {
    if (p >= s.size() || (s[p] != 'e' && s[p] != 'E')) return std::string_view::npos;
    ++p;
    if (p < s.size() && (s[p] == '+' || s[p] == '-')) ++p;
    return ScanDigits(s, p);
  };
  if (frac_end != std::string_view::npos) {
    const size_t e = exponent(frac_end);
    if (e != std::string_view::npos) return e;
  }
  const size_t e = exponent(int_end);
  if (e != std::string_view::npos) return e;
  return frac_end;
}

bool IsHex(char c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool IsOct(char c) { return c >= '0' && c <= '7'; }
bool IsBin(char c) { return c == '0' || c == '1'; }

// jinja2.lexer.integer_re at pos: sets *base and returns the end, or npos.
size_t ScanInteger(std::string_view s, size_t pos, int* base) {
  if (pos >= s.size() || !IsDigit(s[pos])) return std::string_view::npos;
  if (s[pos] == '0' && pos + 1 < s.size()) {
    const char p = static_cast<char>(s[pos + 1] | 0x20);
    bool (*pred)(char) = p == 'x' ? IsHex : p == 'o' ? IsOct : p == 'b' ? IsBin : nullptr;
    if (pred != nullptr) {
      // (_?[digit])+
      size_t q = pos + 2;
      bool any = false;
      while (true) {
        if (q < s.size() && pred(s[q])) {
          ++q;
          any = true;
        } else if (q + 1 < s.size() && s[q] == '_' && pred(s[q + 1])) {
          q += 2;
          any = true;
        } else {
          break;
        }
      }
      if (any) {
        *base = p == 'x' ? 16 : p == 'o' ? 8 : 2;
        return q;
      }
    }
  }
  *base = 10;
  if (s[pos] == '0') {  // 0(_?0)*
    size_t q = pos + 1;
    while (true) {
      if (q < s.size() && s[q] == '0') {
        ++q;
      } else if (q + 1 < s.size() && s[q] == '_' && s[q + 1] == '0') {
        q += 2;
      } else {
        return q;
      }
    }
  }
  size_t q = pos + 1;  // [1-9](_?\d)*
  while (true) {
    if (q < s.size() && IsDigit(s[q])) {
      ++q;
    } else if (q + 1 < s.size() && s[q] == '_' && IsDigit(s[q + 1])) {
      q += 2;
    } else {
      return q;
    }
  }
}

int HexValue(char c) {
  if (IsDigit(c)) return c - '0';
  return (c | 0x20) - 'a' + 10;
}

// Python's "unicode-escape" decoding of a string literal body, as jinja2 applies it.
Result<std::string> Unescape(std::string_view body, int line) {
  std::string out;
  out.reserve(body.size());
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c != '\\' || i + 1 == body.size()) {
      out.push_back(c);
      continue;
    }
    const char e = body[++i];
    switch (e) {
      case '\n':
        break;  // line continuation
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        char32_t cp = 0;
        for (size_t d = 1; d <= digits; ++d) {
          if (i + d >= body.size() || !IsHex(body[i + d])) {
            return SyntaxError(line, fmt::format("truncated \\{}{} escape in string literal", e,
                                                 std::string(digits, 'X')));
          }
          cp = cp * 16 + static_cast<char32_t>(HexValue(body[i + d]));
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
          return SyntaxError(line, "string literal escape is not a valid Unicode scalar value");
        }
        AppendUtf8(cp, &out);
        i += digits;
        break;
      }
      case 'N':
        return SyntaxError(line, "\\N{...} escapes in string literals are not supported");
      default:
        if (IsOct(e)) {
          char32_t cp = static_cast<char32_t>(e - '0');
          for (int d = 0; d < 2 && i + 1 < body.size() && IsOct(body[i + 1]); ++d) {
            cp = cp * 8 + static_cast<char32_t>(body[++i] - '0');
          }
          AppendUtf8(cp, &out);
        } else {
          // Unknown escapes stay as written, backslash included (Python does the same).
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

// Replaces \r\n and \r with \n and drops one trailing newline (keep_trailing_newline=False).
std::string NormalizeNewlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

constexpr std::string_view kOperators2[] = {"//", "**", "==", "!=", ">=", "<="};
constexpr std::string_view kOperators1 = "+-/*%~[](){}=.:|,;<>";

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  Result<std::vector<Token>> Run() {
    while (pos_ < src_.size()) {
      const size_t start = FindTagStart(pos_);
      if (start == std::string::npos) {
        EmitData(std::string_view(src_).substr(pos_));
        pos_ = src_.size();
        break;
      }
      const char kind = src_[start + 1];
      char sign = 0;
      if (start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+')) {
        sign = src_[start + 2];
      }
      std::string_view text = std::string_view(src_).substr(pos_, start - pos_);
      const int text_newlines = CountNewlines(text);
      if (sign == '-') {
        text = RStrip(text);
      } else if (sign != '+' && kind != '{') {
        text = LStripBlock(text);
      }
      EmitData(text);
      line_ += text_newlines;
      pos_ = start + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        RETURN_IF_ERROR(LexComment());
      } else if (kind == '%' && LexRawBegin()) {
        RETURN_IF_ERROR(LexRaw());
      } else {
        RETURN_IF_ERROR(LexTag(kind == '{'));
      }
    }
    Token eof;
    eof.type = TokenType::kEof;
    eof.line = line_;
    tokens_.push_back(std::move(eof));
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return std::string::npos;
  }

  // lstrip_blocks: whitespace between the start of a line and a block or comment tag goes.
  std::string_view LStripBlock(std::string_view text) const {
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
    if ((l_pos > 0 || line_starting_) && l_pos < text.size() && AllWhitespace(text.substr(l_pos))) {
      return text.substr(0, l_pos);
    }
    return text;
  }

  void EmitData(std::string_view text) {
    if (text.empty()) return;
    Token t;
    t.type = TokenType::kData;
    t.value = std::string(text);
    t.line = line_;
    tokens_.push_back(std::move(t));
  }

  void Emit(TokenType type, std::string value = {}) {
    Token t;
    t.type = type;
    t.value = std::move(value);
    t.line = line_;
    tokens_.push_back(std::move(t));
  }

  // Consumes whitespace after a `-` closing marker, or one newline after a plain one
  // (trim_blocks), and records whether the tag ended a line.
  void FinishTag(bool strip_after, bool trim_newline) {
    const size_t before = pos_;
    if (strip_after) {
      pos_ = SkipWhitespace(src_, pos_);
    } else if (trim_newline && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    const std::string_view consumed = std::string_view(src_).substr(before, pos_ - before);
    line_ += CountNewlines(consumed);
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
  }

  Status LexComment() {
    const int open_line = line_;
    for (size_t i = pos_; i + 1 < src_.size(); ++i) {
      if (src_[i] == '+' && src_.compare(i + 1, 2, "#}") == 0) {
        line_ += CountNewlines(std::string_view(src_).substr(pos_, i - pos_));
        pos_ = i + 3;
        FinishTag(false, false);
        return OkStatus();
      }
      if (src_[i] == '-' && src_.compare(i + 1, 2, "#}") == 0) {
        line_ += CountNewlines(std::string_view(src_).substr(pos_, i - pos_));
        pos_ = i + 3;
        FinishTag(true, false);
        return OkStatus();
      }
      if (src_[i] == '#' && src_[i + 1] == '}') {
        line_ += CountNewlines(std::string_view(src_).substr(pos_, i - pos_));
        pos_ = i + 2;
        FinishTag(false, true);
        return OkStatus();
      }
    }
    return SyntaxError(open_line, "missing end of comment tag: '{#' is never closed with '#}'");
  }

  // Consumes `raw -?%}` when the tag just opened (pos_ is after `{%` and its sign) is a raw block.
  bool LexRawBegin() {
    size_t p = SkipWhitespace(src_, pos_);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p = SkipWhitespace(src_, p + 3);
    if (src_.compare(p, 3, "-%}") == 0) {
      pos_ = p + 3;
      FinishTag(true, false);
      return true;
    }
    if (src_.compare(p, 2, "%}") == 0) {
      // The opening raw tag takes no trim_blocks newline (jinja2's raw_begin rule has none).
      pos_ = p + 2;
      FinishTag(false, false);
      return true;
    }
    return false;
  }

  Status LexRaw() {
    const int open_line = line_;
    for (size_t i = src_.find("{%", pos_); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t p = i + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      p = SkipWhitespace(src_, p);
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p = SkipWhitespace(src_, p + 6);
      bool strip_after = false, trim = false;
      if (src_.compare(p, 3, "+%}") == 0) {
        p += 3;
      } else if (src_.compare(p, 3, "-%}") == 0) {
        p += 3;
        strip_after = true;
      } else if (src_.compare(p, 2, "%}") == 0) {
        p += 2;
        trim = true;
      } else {
        continue;
      }
      std::string_view text = std::string_view(src_).substr(pos_, i - pos_);
      const int newlines = CountNewlines(text);
      if (sign == '-') {
        text = RStrip(text);
      } else if (sign != '+') {
        text = LStripBlock(text);
      }
      EmitData(text);
      line_ += newlines;
      line_ += CountNewlines(std::string_view(src_).substr(i, p - i));
      pos_ = p;
      FinishTag(strip_after, trim);
      return OkStatus();
    }
    return SyntaxError(open_line,
                       "missing end of raw directive: '{% raw %}' has no '{% endraw %}'");
  }

  // The inside of {{ ... }} or {% ... %}: expression tokens up to the closing delimiter.
  Status LexTag(bool variable) {
    const int open_line = line_;
    Emit(variable ? TokenType::kVariableBegin : TokenType::kBlockBegin);
    std::vector<char> brackets;  // expected closers, innermost last
    while (true) {
      if (pos_ >= src_.size()) {
        return SyntaxError(open_line, fmt::format("unexpected end of template: '{}' is never "
                                                  "closed with '{}'",
                                                  variable ? "{{" : "{%", variable ? "}}" : "%}"));
      }
      if (brackets.empty()) {
        if (variable) {
          if (src_.compare(pos_, 3, "-}}") == 0) {
            pos_ += 3;
            Emit(TokenType::kVariableEnd);
            FinishTag(true, false);
            return OkStatus();
          }
          if (src_.compare(pos_, 2, "}}") == 0) {
            pos_ += 2;
            Emit(TokenType::kVariableEnd);
            FinishTag(false, false);
            return OkStatus();
          }
        } else {
          const bool plus = src_.compare(pos_, 3, "+%}") == 0;
          const bool minus = src_.compare(pos_, 3, "-%}") == 0;
          if (plus || minus || src_.compare(pos_, 2, "%}") == 0) {
            pos_ += plus || minus ? 3 : 2;
            Emit(TokenType::kBlockEnd);
            FinishTag(minus, !plus && !minus);
            return OkStatus();
          }
        }
      }
      if (size_t ws = WhitespaceAt(src_, pos_)) {
        const size_t end = SkipWhitespace(src_, pos_ + ws);
        line_ += CountNewlines(std::string_view(src_).substr(pos_, end - pos_));
        pos_ = end;
        continue;
      }
      RETURN_IF_ERROR(LexExpressionToken(&brackets));
    }
  }

  Status LexExpressionToken(std::vector<char>* brackets) {
    const std::string_view s = src_;
    if (size_t end = ScanFloat(s, pos_); end != std::string_view::npos) {
      std::string text;
      for (char c : s.substr(pos_, end - pos_)) {
        if (c != '_') text.push_back(c);
      }
      Token t;
      t.type = TokenType::kFloat;
      t.float_value = std::strtod(text.c_str(), nullptr);
      t.value = std::string(s.substr(pos_, end - pos_));
      t.line = line_;
      tokens_.push_back(std::move(t));
      pos_ = end;
      return OkStatus();
    }
    int base = 10;
    if (size_t end = ScanInteger(s, pos_, &base); end != std::string_view::npos) {
      std::string text;
      for (char c : s.substr(pos_ + (base == 10 ? 0 : 2), end - pos_ - (base == 10 ? 0 : 2))) {
        if (c != '_') text.push_back(c);
      }
      errno = 0;
      const unsigned long long v = std::strtoull(text.c_str(), nullptr, base);
      if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX)) {
        return SyntaxError(line_, fmt::format("integer literal {} does not fit in 64 bits",
                                              s.substr(pos_, end - pos_)));
      }
      Token t;
      t.type = TokenType::kInteger;
      t.int_value = static_cast<int64_t>(v);
      t.value = std::string(s.substr(pos_, end - pos_));
      t.line = line_;
      tokens_.push_back(std::move(t));
      pos_ = end;
      return OkStatus();
    }
    if (IsNameStart(s[pos_])) {
      size_t end = pos_ + 1;
      while (end < s.size() && IsNameChar(s[end])) ++end;
      Emit(TokenType::kName, std::string(s.substr(pos_, end - pos_)));
      pos_ = end;
      return OkStatus();
    }
    if (s[pos_] == '\'' || s[pos_] == '"') {
      const char quote = s[pos_];
      size_t i = pos_ + 1;
      while (i < s.size() && s[i] != quote) i += s[i] == '\\' ? 2 : 1;
      if (i >= s.size()) {
        return SyntaxError(line_, fmt::format("unterminated string literal starting with {}",
                                              quote == '"' ? "'\"'" : "\"'\""));
      }
      const std::string_view body = s.substr(pos_ + 1, i - pos_ - 1);
      ASSIGN_OR_RETURN(std::string value, Unescape(body, line_));
      Emit(TokenType::kString, std::move(value));
      line_ += CountNewlines(body);
      pos_ = i + 1;
      return OkStatus();
    }
    for (std::string_view op : kOperators2) {
      if (s.compare(pos_, 2, op) == 0) {
        Emit(TokenType::kOperator, std::string(op));
        pos_ += 2;
        return OkStatus();
      }
    }
    const char c = s[pos_];
    if (kOperators1.find(c) == std::string_view::npos) {
      size_t end = pos_;
      const char32_t cp = DecodeUtf8(s, &end);
      std::string shown;
      AppendUtf8(cp, &shown);
      return SyntaxError(line_, fmt::format("unexpected character '{}'", shown));
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets->push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets->empty()) return SyntaxError(line_, fmt::format("unexpected '{}'", c));
      const char expected = brackets->back();
      brackets->pop_back();
      if (expected != c) {
        return SyntaxError(line_, fmt::format("unexpected '{}', expected '{}'", c, expected));
      }
    }
    Emit(TokenType::kOperator, std::string(1, c));
    ++pos_;
    return OkStatus();
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::string DescribeToken(const Token& token) {
  switch (token.type) {
    case TokenType::kData:
      return "template data";
    case TokenType::kVariableBegin:
      return "begin of print statement '{{'";
    case TokenType::kVariableEnd:
      return "end of print statement '}}'";
    case TokenType::kBlockBegin:
      return "begin of statement block '{%'";
    case TokenType::kBlockEnd:
      return "end of statement block '%}'";
    case TokenType::kName:
      return "'" + token.value + "'";
    case TokenType::kString:
      return "string literal";
    case TokenType::kInteger:
    case TokenType::kFloat:
      return "number " + token.value;
    case TokenType::kOperator:
      return "'" + token.value + "'";
    case TokenType::kEof:
      return "end of template";
  }
  return "token";
}

Result<std::vector<Token>> Tokenize(std::string_view source) {
  return Lexer(NormalizeNewlines(source)).Run();
}

}  // namespace moeserve::jinja
