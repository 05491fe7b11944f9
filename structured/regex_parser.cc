#include "structured/regex_parser.h"

#include <string>
#include <utility>
#include <vector>

namespace moeserve::structured {

namespace {

const std::vector<CodeRange> kDigit = {{'0', '9'}};
const std::vector<CodeRange> kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const std::vector<CodeRange> kSpace = {{'\t', '\r'}, {' ', ' '}};
// What Python's \s also matches in ASCII (str.isspace): \x1c..\x1f.
const std::vector<CodeRange> kPythonSpace = {{'\t', '\r'}, {0x1c, ' '}};
const std::vector<CodeRange> kAscii = {{0, 0x7F}};

class RegexParser {
 public:
  RegexParser(std::string_view p, const Limits& limits) : p_(p), limits_(limits) {}

  Result<Expr> Parse() {
    if (p_.size() > limits_.max_spec_bytes) {
      return InvalidArgument("regex of {} bytes: more than {} (max_spec_bytes)", p_.size(),
                             limits_.max_spec_bytes);
    }
    if (!p_.empty() && p_[0] == '^') ++pos_;
    ASSIGN_OR_RETURN(Expr e, ParseAlternatives(0));
    if (pos_ < p_.size()) {
      return Error(p_[pos_] == ')' ? "unbalanced ')'" : "unexpected character");
    }
    Grammar g;  // only to count nodes against the limit
    g.AddRule("regex");
    g.bodies[0] = e;
    g.root = 0;
    RETURN_IF_ERROR(CheckGrammar(g, limits_));
    return e;
  }

 private:
  Status Error(std::string_view what) const {
    return InvalidArgument("regex: {} at offset {}", what, pos_);
  }

  bool AtEnd() const { return pos_ >= p_.size(); }

  Result<Expr> ParseAlternatives(int depth) {
    if (depth > limits_.max_nesting) {
      return Error(fmt::format("groups nested deeper than {} (max_nesting)", limits_.max_nesting));
    }
    std::vector<Expr> alts;
    ASSIGN_OR_RETURN(Expr first, ParseSequence(depth));
    alts.push_back(std::move(first));
    while (!AtEnd() && p_[pos_] == '|') {
      ++pos_;
      ASSIGN_OR_RETURN(Expr next, ParseSequence(depth));
      alts.push_back(std::move(next));
    }
    return Alt(std::move(alts));
  }

  Result<Expr> ParseSequence(int depth) {
    std::vector<Expr> items;
    while (!AtEnd() && p_[pos_] != '|' && p_[pos_] != ')') {
      if (p_[pos_] == '$' && pos_ + 1 == p_.size()) {
        ++pos_;
        break;
      }
      ASSIGN_OR_RETURN(Expr atom, ParseAtom(depth));
      ASSIGN_OR_RETURN(Expr item, ParseQuantifiers(std::move(atom)));
      items.push_back(std::move(item));
    }
    return Seq(std::move(items));
  }

  Result<Expr> ParseQuantifiers(Expr atom) {
    while (!AtEnd()) {
      const char c = p_[pos_];
      int min = 0, max = 0;
      if (c == '*') {
        min = 0, max = Expr::kUnbounded, ++pos_;
      } else if (c == '+') {
        min = 1, max = Expr::kUnbounded, ++pos_;
      } else if (c == '?') {
        min = 0, max = 1, ++pos_;
      } else if (c == '{') {
        const size_t save = pos_;
        ASSIGN_OR_RETURN(bool ok, ParseBraces(&min, &max));
        if (!ok) {
          pos_ = save;  // not a quantifier: '{' is a literal (Python's reading)
          break;
        }
      } else {
        break;
      }
      // Lazy or possessive: the same language.
      if (!AtEnd() && (p_[pos_] == '?' || p_[pos_] == '+')) ++pos_;
      atom = Repeat(std::move(atom), min, max);
    }
    return atom;
  }

  // "{m}", "{m,}", "{m,n}", "{,n}"; false when the text is not a quantifier.
  Result<bool> ParseBraces(int* min, int* max) {
    ++pos_;
    auto number = [&](bool* found) -> Result<int> {
      int64_t v = 0;
      *found = false;
      while (!AtEnd() && p_[pos_] >= '0' && p_[pos_] <= '9') {
        v = v * 10 + (p_[pos_++] - '0');
        *found = true;
        if (v > limits_.max_repeat) {
          return Error(fmt::format("repetition count above {} (max_repeat)", limits_.max_repeat));
        }
      }
      return static_cast<int>(v);
    };
    bool has_min, has_max = false;
    ASSIGN_OR_RETURN(*min, number(&has_min));
    *max = *min;
    if (!AtEnd() && p_[pos_] == ',') {
      ++pos_;
      ASSIGN_OR_RETURN(int n, number(&has_max));
      *max = has_max ? n : Expr::kUnbounded;
      if (!has_min) *min = 0;
      if (!has_min && !has_max) return false;
    } else if (!has_min) {
      return false;
    }
    if (AtEnd() || p_[pos_] != '}') return false;
    ++pos_;
    if (*max != Expr::kUnbounded && *max < *min) return Error("{m,n} with n < m");
    return true;
  }

  Result<Expr> ParseAtom(int depth) {
    const char c = p_[pos_];
    if (c == '(') {
      ++pos_;
      if (!AtEnd() && p_[pos_] == '?') {
        ++pos_;
        if (!AtEnd() && p_[pos_] == ':') {
          ++pos_;
        } else if (!AtEnd() && (p_[pos_] == 'P' || p_[pos_] == '<') && p_.substr(pos_, 2) != "<=" &&
                   p_.substr(pos_, 2) != "<!") {
          if (p_[pos_] == 'P') ++pos_;
          if (AtEnd() || p_[pos_] != '<') return Error("unsupported group (?P...)");
          while (!AtEnd() && p_[pos_] != '>') ++pos_;
          if (AtEnd()) return Error("unterminated group name");
          ++pos_;
        } else {
          return Error("lookaround, inline flags and conditionals are not supported");
        }
      }
      ASSIGN_OR_RETURN(Expr e, ParseAlternatives(depth + 1));
      if (AtEnd() || p_[pos_] != ')') return Error("missing ')'");
      ++pos_;
      return e;
    }
    if (c == '[') return ParseClass();
    if (c == '.') {
      ++pos_;
      return Chars(ComplementRanges({{'\n', '\n'}}));
    }
    if (c == '^' || c == '$') return Error("anchor inside the pattern is not supported");
    if (c == '*' || c == '+' || c == '?') return Error("nothing to repeat");
    if (c == '\\') {
      std::vector<CodeRange> ranges;
      bool shorthand = false;
      RETURN_IF_ERROR(ParseEscape(&ranges, &shorthand, /*in_class=*/false));
      return Chars(std::move(ranges));
    }
    const int64_t cp = DecodeUtf8(p_, &pos_);
    if (cp < 0) return Error("not valid UTF-8");
    return Char(static_cast<uint32_t>(cp));
  }

  // After the escape's backslash is at pos_: appends its code points to ranges.
  Status ParseEscape(std::vector<CodeRange>* ranges, bool* shorthand, bool in_class) {
    ++pos_;  // '\'
    if (AtEnd()) return Error("pattern ends with '\\'");
    const char e = p_[pos_++];
    auto add = [&](const std::vector<CodeRange>& r) {
      ranges->insert(ranges->end(), r.begin(), r.end());
    };
    switch (e) {
      case 'd':
        *shorthand = true;
        add(kDigit);
        return OkStatus();
      case 'w':
        *shorthand = true;
        add(kWord);
        return OkStatus();
      case 's':
        *shorthand = true;
        add(kSpace);
        return OkStatus();
      case 'D':
        *shorthand = true;
        add(IntersectRanges(ComplementRanges(kDigit), kAscii));
        return OkStatus();
      case 'W':
        *shorthand = true;
        add(IntersectRanges(ComplementRanges(kWord), kAscii));
        return OkStatus();
      case 'S':
        *shorthand = true;
        add(IntersectRanges(ComplementRanges(kPythonSpace), kAscii));
        return OkStatus();
      case 'n':
        add({{'\n', '\n'}});
        return OkStatus();
      case 't':
        add({{'\t', '\t'}});
        return OkStatus();
      case 'r':
        add({{'\r', '\r'}});
        return OkStatus();
      case 'f':
        add({{'\f', '\f'}});
        return OkStatus();
      case 'v':
        add({{'\v', '\v'}});
        return OkStatus();
      case '0':
        add({{0, 0}});
        return OkStatus();
      case 'x':
      case 'u':
      case 'U': {
        const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t v = 0;
        for (int i = 0; i < digits; ++i) {
          if (AtEnd()) return Error("unterminated hex escape");
          const char c = p_[pos_++];
          const int d = c >= '0' && c <= '9'   ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
          if (d < 0) return Error("expected a hex digit");
          v = v * 16 + d;
        }
        if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) {
          return Error("escape is not a Unicode scalar value");
        }
        add({{v, v}});
        return OkStatus();
      }
      case 'b':
        if (in_class) {
          add({{'\b', '\b'}});
          return OkStatus();
        }
        return Error("word boundaries (\\b) are not supported");
      default:
        if ((e >= '1' && e <= '9') || e == 'k') return Error("backreferences are not supported");
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) {
          return Error(fmt::format("escape '\\{}' is not supported", e));
        }
        // Escaped punctuation or a non-ASCII character: itself.
        --pos_;
        const int64_t cp = DecodeUtf8(p_, &pos_);
        if (cp < 0) return Error("not valid UTF-8");
        add({{static_cast<uint32_t>(cp), static_cast<uint32_t>(cp)}});
        return OkStatus();
    }
  }

  Result<Expr> ParseClass() {
    ++pos_;  // '['
    bool negated = false, shorthand = false;
    if (!AtEnd() && p_[pos_] == '^') {
      negated = true;
      ++pos_;
    }
    std::vector<CodeRange> ranges;
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("unterminated character class");
      if (p_[pos_] == ']' && !first) break;
      first = false;
      // One member: a character (maybe the start of a range) or a shorthand.
      auto member = [&](std::vector<CodeRange>* out, bool* is_set) -> Status {
        if (p_[pos_] == '\\') {
          bool sh = false;
          RETURN_IF_ERROR(ParseEscape(out, &sh, /*in_class=*/true));
          *is_set = sh;
          shorthand |= sh;
          return OkStatus();
        }
        if (p_[pos_] == '[' && pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') {
          return Error("POSIX classes ([:alpha:]) are not supported");
        }
        const int64_t cp = DecodeUtf8(p_, &pos_);
        if (cp < 0) return Error("not valid UTF-8");
        out->push_back({static_cast<uint32_t>(cp), static_cast<uint32_t>(cp)});
        *is_set = false;
        return OkStatus();
      };
      std::vector<CodeRange> lo;
      bool lo_set = false;
      RETURN_IF_ERROR(member(&lo, &lo_set));
      if (!lo_set && pos_ + 1 < p_.size() && p_[pos_] == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        std::vector<CodeRange> hi;
        bool hi_set = false;
        RETURN_IF_ERROR(member(&hi, &hi_set));
        if (hi_set) return Error("a class range cannot end in a shorthand");
        if (hi[0].lo < lo[0].lo) return Error("class range out of order");
        ranges.push_back({lo[0].lo, hi[0].lo});
      } else {
        ranges.insert(ranges.end(), lo.begin(), lo.end());
      }
    }
    ++pos_;  // ']'
    if (negated) {
      ranges = ComplementRanges(ranges);
      if (shorthand) ranges = IntersectRanges(ranges, kAscii);
    }
    return Chars(std::move(ranges));
  }

  std::string_view p_;
  const Limits& limits_;
  size_t pos_ = 0;
};

}  // namespace

Result<Expr> ParseRegex(std::string_view pattern, const Limits& limits) {
  return RegexParser(pattern, limits).Parse();
}

Result<Grammar> RegexGrammar(std::string_view pattern, const Limits& limits) {
  ASSIGN_OR_RETURN(Expr e, ParseRegex(pattern, limits));
  Grammar g;
  g.root = g.AddRule("root");
  g.bodies[0] = std::move(e);
  return g;
}

}  // namespace moeserve::structured
