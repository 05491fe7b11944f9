#include "structured/gbnf_parser.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace moeserve::structured {

namespace {

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

class GbnfParser {
 public:
  GbnfParser(std::string_view text, const Limits& limits) : text_(text), limits_(limits) {}

  Result<Grammar> Parse() {
    if (text_.size() > limits_.max_spec_bytes) {
      return InvalidArgument("grammar of {} bytes: more than {} (max_spec_bytes)", text_.size(),
                             limits_.max_spec_bytes);
    }
    SkipSpace(true);
    while (pos_ < text_.size()) {
      const size_t name_pos = pos_;
      std::string name = ParseName();
      if (name.empty()) return Error("expected a rule name");
      SkipSpace(false);
      if (text_.substr(pos_, 3) != "::=") return Error("expected '::=' after the rule name");
      pos_ += 3;
      SkipSpace(true);
      const int rule = RuleIndex(name);
      if (defined_.count(rule)) {
        pos_ = name_pos;
        return Error(fmt::format("rule '{}' defined twice", name));
      }
      defined_[rule] = true;
      ASSIGN_OR_RETURN(Expr body, ParseAlternatives(0));
      grammar_.bodies[rule] = std::move(body);
      // A rule ends at a newline (or the end).
      if (pos_ < text_.size() && text_[pos_] != '\n' && text_[pos_] != '\r') {
        return Error("expected the end of the line after the rule");
      }
      SkipSpace(true);
    }
    for (size_t r = 0; r < grammar_.names.size(); ++r) {
      if (!defined_.count(static_cast<int>(r))) {
        return InvalidArgument("grammar: rule '{}' is used but not defined", grammar_.names[r]);
      }
    }
    grammar_.root = grammar_.Find("root");
    if (grammar_.root < 0) return InvalidArgument("grammar: no rule named 'root'");
    RETURN_IF_ERROR(CheckGrammar(grammar_, limits_));
    return std::move(grammar_);
  }

 private:
  Status Error(std::string_view what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return InvalidArgument("grammar: line {}, column {}: {}", line, col, what);
  }

  // Spaces, tabs and comments; newlines too when newline_ok.
  void SkipSpace(bool newline_ok) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string ParseName() {
    const size_t start = pos_;
    while (pos_ < text_.size() && IsNameChar(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  int RuleIndex(const std::string& name) {
    auto it = index_.find(name);
    if (it != index_.end()) return it->second;
    const int r = grammar_.AddRule(name);
    index_.emplace(name, r);
    return r;
  }

  Result<Expr> ParseAlternatives(int depth) {
    if (depth > limits_.max_nesting) {
      return Error(
          fmt::format("parentheses nested deeper than {} (max_nesting)", limits_.max_nesting));
    }
    std::vector<Expr> alts;
    ASSIGN_OR_RETURN(Expr first, ParseSequence(depth));
    alts.push_back(std::move(first));
    while (pos_ < text_.size() && text_[pos_] == '|') {
      ++pos_;
      SkipSpace(true);
      ASSIGN_OR_RETURN(Expr next, ParseSequence(depth));
      alts.push_back(std::move(next));
    }
    return Alt(std::move(alts));
  }

  // Items up to '|', ')' or (outside parentheses) the end of the line.
  Result<Expr> ParseSequence(int depth) {
    const bool nested = depth > 0;
    std::vector<Expr> items;
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '|' || c == ')' || c == '\n' || c == '\r') break;
      Expr item;
      if (c == '"') {
        ASSIGN_OR_RETURN(item, ParseLiteral());
      } else if (c == '[') {
        ASSIGN_OR_RETURN(item, ParseClass());
      } else if (c == '.') {
        ++pos_;
        item = Chars({{0, kMaxCodePoint}});
      } else if (c == '(') {
        ++pos_;
        SkipSpace(true);
        ASSIGN_OR_RETURN(item, ParseAlternatives(depth + 1));
        if (pos_ >= text_.size() || text_[pos_] != ')') return Error("expected ')'");
        ++pos_;
      } else if (IsNameChar(c)) {
        const size_t name_pos = pos_;
        std::string name = ParseName();
        SkipSpace(false);
        if (text_.substr(pos_, 3) == "::=") {
          // The next rule starts: this name was its head (a body ending before a newline would
          // not reach here).
          pos_ = name_pos;
          return Error("expected the end of the line before the next rule");
        }
        item = Ref(RuleIndex(name));
      } else if (c == '<' || c == '!') {
        return Error("token references (<...>, !<...>) are not supported");
      } else {
        return Error(fmt::format("unexpected character '{}'", c));
      }
      SkipSpace(nested);
      // Postfix operators.
      while (pos_ < text_.size()) {
        const char op = text_[pos_];
        if (op == '*' || op == '+' || op == '?') {
          ++pos_;
          item = op == '*'   ? Star(std::move(item))
                 : op == '+' ? Plus(std::move(item))
                             : Opt(std::move(item));
        } else if (op == '{') {
          ++pos_;
          ASSIGN_OR_RETURN(auto bounds, ParseBounds());
          item = Repeat(std::move(item), bounds.first, bounds.second);
        } else {
          break;
        }
        SkipSpace(nested);
      }
      items.push_back(std::move(item));
    }
    return Seq(std::move(items));
  }

  // After '{': "m}", "m,}", "m,n}", ",n}".
  Result<std::pair<int, int>> ParseBounds() {
    SkipSpace(false);
    int min = 0, max = Expr::kUnbounded;
    bool has_min = false;
    ASSIGN_OR_RETURN(int m, ParseInt(&has_min));
    min = has_min ? m : 0;
    SkipSpace(false);
    if (pos_ < text_.size() && text_[pos_] == ',') {
      ++pos_;
      SkipSpace(false);
      bool has_max = false;
      ASSIGN_OR_RETURN(int n, ParseInt(&has_max));
      if (has_max) max = n;
    } else {
      if (!has_min) return Error("expected a number in {m,n}");
      max = min;
    }
    SkipSpace(false);
    if (pos_ >= text_.size() || text_[pos_] != '}') return Error("expected '}' after {m,n}");
    ++pos_;
    if (max != Expr::kUnbounded && max < min) return Error("{m,n} with n < m");
    return std::make_pair(min, max);
  }

  Result<int> ParseInt(bool* found) {
    int64_t v = 0;
    *found = false;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      v = v * 10 + (text_[pos_] - '0');
      if (v > limits_.max_repeat) {
        return Error(fmt::format("repetition count above {} (max_repeat)", limits_.max_repeat));
      }
      *found = true;
      ++pos_;
    }
    return static_cast<int>(v);
  }

  // One character of a literal or class at pos_ (escapes decoded).
  Result<uint32_t> ParseChar() {
    if (pos_ >= text_.size()) return Error("unexpected end of the grammar");
    if (text_[pos_] == '\\') {
      if (pos_ + 1 >= text_.size()) return Error("unexpected end after '\\'");
      const char e = text_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case 'n':
          return uint32_t{'\n'};
        case 'r':
          return uint32_t{'\r'};
        case 't':
          return uint32_t{'\t'};
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
        case '.':
          return static_cast<uint32_t>(static_cast<uint8_t>(e));
        case 'x':
          return ParseHex(2);
        case 'u':
          return ParseHex(4);
        case 'U':
          return ParseHex(8);
        default:
          pos_ -= 2;
          return Error(fmt::format("unknown escape '\\{}'", e));
      }
    }
    const int64_t cp = DecodeUtf8(text_, &pos_);
    if (cp < 0) return Error("not valid UTF-8");
    return static_cast<uint32_t>(cp);
  }

  Result<uint32_t> ParseHex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= text_.size()) return Error("unexpected end in a hex escape");
      const char c = text_[pos_];
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0) return Error("expected a hex digit");
      v = v * 16 + d;
      ++pos_;
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) {
      return Error(fmt::format("escape U+{:X} is not a Unicode scalar value", v));
    }
    return v;
  }

  Result<Expr> ParseLiteral() {
    ++pos_;  // '"'
    std::string bytes;
    while (true) {
      if (pos_ >= text_.size() || text_[pos_] == '\n') return Error("unterminated string literal");
      if (text_[pos_] == '"') break;
      ASSIGN_OR_RETURN(uint32_t cp, ParseChar());
      bytes += EncodeUtf8(cp);
    }
    ++pos_;
    return Lit(std::move(bytes));
  }

  Result<Expr> ParseClass() {
    ++pos_;  // '['
    bool negated = false;
    if (pos_ < text_.size() && text_[pos_] == '^') {
      negated = true;
      ++pos_;
    }
    std::vector<CodeRange> ranges;
    while (true) {
      if (pos_ >= text_.size() || text_[pos_] == '\n') return Error("unterminated character class");
      if (text_[pos_] == ']') break;
      ASSIGN_OR_RETURN(uint32_t lo, ParseChar());
      uint32_t hi = lo;
      if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
        ++pos_;
        ASSIGN_OR_RETURN(hi, ParseChar());
        if (hi < lo) return Error("character range out of order");
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;
    if (negated) ranges = ComplementRanges(ranges);
    return Chars(std::move(ranges));
  }

  std::string_view text_;
  const Limits& limits_;
  size_t pos_ = 0;
  Grammar grammar_;
  std::map<std::string, int> index_;
  std::map<int, bool> defined_;
};

}  // namespace

Result<Grammar> ParseGbnf(std::string_view text, const Limits& limits) {
  return GbnfParser(text, limits).Parse();
}

}  // namespace moeserve::structured
