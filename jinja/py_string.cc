#include "jinja/py_string.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>

namespace moeserve::jinja {
namespace {

utf8proc_category_t Category(char32_t cp) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp));
}

template <typename Pred>
bool AllCodePoints(std::string_view s, Pred pred) {
  if (s.empty()) return false;
  size_t pos = 0;
  while (pos < s.size()) {
    if (!pred(DecodeUtf8(s, &pos))) return false;
  }
  return true;
}

bool IsAlphaCp(char32_t cp) {
  const utf8proc_category_t c = Category(cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
         c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_LO;
}

bool IsNumericCp(char32_t cp) {
  const utf8proc_category_t c = Category(cp);
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

// Python's str.isprintable() for one code point: everything except the "Other" and "Separator"
// categories, with the ASCII space allowed.
bool IsPrintable(char32_t cp) {
  if (cp == ' ') return true;
  switch (Category(cp)) {
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
      return false;
    default:
      return true;
  }
}

// Python's str.splitlines() line boundaries.
bool IsPyLineBreak(char32_t cp) {
  switch (cp) {
    case '\n':
    case '\r':
    case '\v':
    case '\f':
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x85:
    case 0x2028:
    case 0x2029:
      return true;
    default:
      return false;
  }
}

// Finds `sub` in s[begin, end) (byte offsets), searching forward or backward.
size_t FindBytes(std::string_view s, std::string_view sub, size_t begin, size_t end, bool reverse) {
  if (end < begin || end - begin < sub.size()) return std::string_view::npos;
  const std::string_view window = s.substr(begin, end - begin);
  const size_t at = reverse ? window.rfind(sub) : window.find(sub);
  return at == std::string_view::npos ? at : at + begin;
}

// Python's clamping of the optional start/end arguments of find/count/startswith.
void ClampRange(int64_t length, int64_t* start, int64_t* end) {
  if (*end > length) *end = length;
  if (*end < 0) *end = std::max<int64_t>(0, *end + length);
  if (*start < 0) *start = std::max<int64_t>(0, *start + length);
}

}  // namespace

char32_t DecodeUtf8(std::string_view s, size_t* pos) {
  const auto b0 = static_cast<unsigned char>(s[*pos]);
  int len = 0;
  char32_t cp = 0;
  if (b0 < 0x80) {
    ++*pos;
    return b0;
  } else if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4;
    cp = b0 & 0x07;
  } else {
    ++*pos;
    return b0;
  }
  if (*pos + len > s.size()) {
    ++*pos;
    return b0;
  }
  for (int i = 1; i < len; ++i) {
    const auto b = static_cast<unsigned char>(s[*pos + i]);
    if ((b & 0xC0) != 0x80) {
      ++*pos;
      return b0;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  *pos += len;
  return cp;
}

std::vector<char32_t> ToCodePoints(std::string_view s) {
  std::vector<char32_t> cps;
  cps.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) cps.push_back(DecodeUtf8(s, &pos));
  return cps;
}

std::string FromCodePoints(const std::vector<char32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) AppendUtf8(cps[i], &out);
  return out;
}

int64_t CodePointCount(std::string_view s) {
  int64_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

size_t ByteOffsetOfCodePoint(std::string_view s, int64_t index) {
  size_t pos = 0;
  for (int64_t i = 0; i < index && pos < s.size(); ++i) DecodeUtf8(s, &pos);
  return pos;
}

bool IsPySpace(char32_t cp) {
  switch (cp) {
    case '\t':
    case '\n':
    case '\v':
    case '\f':
    case '\r':
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x1F:
    case ' ':
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right) {
  const std::vector<char32_t> cps = ToCodePoints(s);
  std::vector<char32_t> set;
  if (chars) set = ToCodePoints(*chars);
  auto strip = [&](char32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : IsPySpace(cp);
  };
  size_t begin = 0, end = cps.size();
  if (left) {
    while (begin < end && strip(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(cps[end - 1])) --end;
  }
  return FromCodePoints(cps, begin, end);
}

std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sep) {
    if (!from_right) {
      size_t start = 0;
      while (maxsplit-- > 0) {
        const size_t at = s.find(*sep, start);
        if (at == std::string_view::npos) break;
        parts.emplace_back(s.substr(start, at - start));
        start = at + sep->size();
      }
      parts.emplace_back(s.substr(start));
    } else {
      size_t end = s.size();
      while (maxsplit-- > 0 && end >= sep->size()) {
        const size_t at = s.substr(0, end).rfind(*sep);
        if (at == std::string_view::npos) break;
        parts.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
        end = at;
      }
      parts.emplace_back(s.substr(0, end));
      std::reverse(parts.begin(), parts.end());
    }
    return parts;
  }
  // Whitespace splitting: runs of whitespace separate, leading/trailing runs vanish, and once
  // maxsplit is reached the remainder (with its inner whitespace) is one piece.
  const std::vector<char32_t> cps = ToCodePoints(s);
  if (!from_right) {
    size_t i = 0;
    while (true) {
      while (i < cps.size() && IsPySpace(cps[i])) ++i;
      if (i == cps.size()) break;
      if (maxsplit == 0) {  // the remainder keeps its inner and trailing whitespace
        parts.push_back(FromCodePoints(cps, i, cps.size()));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !IsPySpace(cps[j])) ++j;
      parts.push_back(FromCodePoints(cps, i, j));
      --maxsplit;
      i = j;
    }
  } else {
    size_t i = cps.size();
    while (true) {
      while (i > 0 && IsPySpace(cps[i - 1])) --i;
      if (i == 0) break;
      if (maxsplit == 0) {  // the remainder keeps its inner and leading whitespace
        parts.push_back(FromCodePoints(cps, 0, i));
        break;
      }
      size_t j = i;
      while (j > 0 && !IsPySpace(cps[j - 1])) --j;
      parts.push_back(FromCodePoints(cps, j, i));
      --maxsplit;
      i = j;
    }
    std::reverse(parts.begin(), parts.end());
  }
  return parts;
}

std::vector<std::string> PySplitLines(std::string_view s, bool keepends) {
  std::vector<std::string> lines;
  const std::vector<char32_t> cps = ToCodePoints(s);
  size_t start = 0, i = 0;
  while (i < cps.size()) {
    if (!IsPyLineBreak(cps[i])) {
      ++i;
      continue;
    }
    size_t eol = i + 1;
    if (cps[i] == '\r' && eol < cps.size() && cps[eol] == '\n') ++eol;
    lines.push_back(FromCodePoints(cps, start, keepends ? eol : i));
    start = i = eol;
  }
  if (start < cps.size()) lines.push_back(FromCodePoints(cps, start, cps.size()));
  return lines;
}

std::string PyReplace(std::string_view s, std::string_view old_sub, std::string_view new_sub,
                      int64_t count) {
  if (count < 0) count = INT64_MAX;
  std::string out;
  if (old_sub.empty()) {
    // Python inserts `new` before every code point and at the end, up to `count` times.
    size_t pos = 0;
    while (pos < s.size()) {
      if (count > 0) {
        out.append(new_sub);
        --count;
      }
      const size_t start = pos;
      DecodeUtf8(s, &pos);
      out.append(s.substr(start, pos - start));
    }
    if (count > 0) out.append(new_sub);
    return out;
  }
  size_t start = 0;
  while (count-- > 0) {
    const size_t at = s.find(old_sub, start);
    if (at == std::string_view::npos) break;
    out.append(s.substr(start, at - start));
    out.append(new_sub);
    start = at + old_sub.size();
  }
  out.append(s.substr(start));
  return out;
}

int64_t PyFind(std::string_view s, std::string_view sub, int64_t start, int64_t end, bool reverse) {
  const int64_t length = CodePointCount(s);
  ClampRange(length, &start, &end);
  if (start > length || end - start < 0) return -1;
  const size_t b = ByteOffsetOfCodePoint(s, start);
  const size_t e = ByteOffsetOfCodePoint(s, end);
  const size_t at = FindBytes(s, sub, b, e, reverse);
  if (at == std::string_view::npos) return -1;
  return CodePointCount(s.substr(0, at));
}

int64_t PyCount(std::string_view s, std::string_view sub, int64_t start, int64_t end) {
  const int64_t length = CodePointCount(s);
  ClampRange(length, &start, &end);
  if (start > length || end - start < 0) return 0;
  if (sub.empty()) return end - start + 1;
  size_t b = ByteOffsetOfCodePoint(s, start);
  const size_t e = ByteOffsetOfCodePoint(s, end);
  int64_t n = 0;
  while (true) {
    const size_t at = FindBytes(s, sub, b, e, false);
    if (at == std::string_view::npos) break;
    ++n;
    b = at + sub.size();
  }
  return n;
}

bool PyIsAlpha(std::string_view s) { return AllCodePoints(s, IsAlphaCp); }
bool PyIsAlnum(std::string_view s) {
  return AllCodePoints(s, [](char32_t cp) { return IsAlphaCp(cp) || IsNumericCp(cp); });
}
bool PyIsDigit(std::string_view s) {
  return AllCodePoints(s, [](char32_t cp) { return Category(cp) == UTF8PROC_CATEGORY_ND; });
}
bool PyIsSpace(std::string_view s) { return AllCodePoints(s, IsPySpace); }

bool PyIsLower(std::string_view s) {
  bool cased = false;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = DecodeUtf8(s, &pos);
    if (utf8proc_isupper(static_cast<utf8proc_int32_t>(cp)) || Category(cp) == UTF8PROC_CATEGORY_LT)
      return false;
    if (utf8proc_islower(static_cast<utf8proc_int32_t>(cp))) cased = true;
  }
  return cased;
}

bool PyIsUpper(std::string_view s) {
  bool cased = false;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = DecodeUtf8(s, &pos);
    if (utf8proc_islower(static_cast<utf8proc_int32_t>(cp)) || Category(cp) == UTF8PROC_CATEGORY_LT)
      return false;
    if (utf8proc_isupper(static_cast<utf8proc_int32_t>(cp))) cased = true;
  }
  return cased;
}

std::string PyStrRepr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = DecodeUtf8(s, &pos);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += fmt::format("\\x{:02x}", static_cast<uint32_t>(cp));
    } else if (cp < 0x80 || IsPrintable(cp)) {
      AppendUtf8(cp, &out);
    } else if (cp < 0x100) {
      out += fmt::format("\\x{:02x}", static_cast<uint32_t>(cp));
    } else if (cp < 0x10000) {
      out += fmt::format("\\u{:04x}", static_cast<uint32_t>(cp));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<uint32_t>(cp));
    }
  }
  out.push_back(quote);
  return out;
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::optional<double> PyParseFloat(std::string_view text) {
  const std::string s = PyStrip(text, std::nullopt, true, true);
  std::string clean;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) clean.push_back(s[i++]);
  const std::string rest = PyLower(s.substr(i));
  if (rest == "inf" || rest == "infinity" || rest == "nan") {
    return std::strtod((clean + rest).c_str(), nullptr);
  }
  bool digits = false, prev_digit = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c >= '0' && c <= '9') {
      digits = true;
      prev_digit = true;
      clean.push_back(c);
    } else if (c == '_' && prev_digit && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '9') {
      prev_digit = false;
    } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
      prev_digit = false;
      clean.push_back(c);
    } else {
      return std::nullopt;
    }
  }
  if (!digits) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return d;
}

std::optional<int64_t> PyParseInt(std::string_view text, int64_t base) {
  std::string s = PyStrip(text, std::nullopt, true, true);
  bool negative = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i + 1 < s.size() && s[i] == '0') {
    const char p = static_cast<char>(s[i + 1] | 0x20);
    const int64_t prefix_base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefix_base != 0 && (base == 0 || base == prefix_base)) {
      base = prefix_base;
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (base == 0) base = 10;
  if (i >= s.size()) return std::nullopt;
  unsigned __int128 value = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_' && prev_digit && i + 1 < s.size()) {
      prev_digit = false;
      continue;
    }
    int d = -1;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'z')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'Z')
      d = c - 'A' + 10;
    if (d < 0 || d >= base) return std::nullopt;
    value = value * static_cast<unsigned>(base) + static_cast<unsigned>(d);
    if (value > static_cast<unsigned __int128>(INT64_MAX) + 1) return std::nullopt;
    prev_digit = true;
  }
  if (!prev_digit) return std::nullopt;
  if (!negative && value > static_cast<unsigned __int128>(INT64_MAX)) return std::nullopt;
  return negative ? static_cast<int64_t>(0 - static_cast<uint64_t>(value))
                  : static_cast<int64_t>(value);
}

int64_t AdjustSlice(int64_t length, std::optional<int64_t> start, std::optional<int64_t> stop,
                    int64_t step, int64_t* start_out, int64_t* stop_out) {
  int64_t b, e;
  if (step > 0) {
    b = start.value_or(0);
    e = stop.value_or(length);
  } else {
    b = start.value_or(length - 1);
    e = stop.value_or(-length - 1);  // one before index 0 once adjusted
  }
  auto adjust = [&](int64_t* v) {
    if (*v < 0) {
      *v += length;
      if (*v < 0) *v = step < 0 ? -1 : 0;
    } else if (*v >= length) {
      *v = step < 0 ? length - 1 : length;
    }
  };
  adjust(&b);
  adjust(&e);
  *start_out = b;
  *stop_out = e;
  if (step < 0) {
    if (e < b) return (b - e - 1) / (-step) + 1;
  } else if (b < e) {
    return (e - b - 1) / step + 1;
  }
  return 0;
}

}  // namespace moeserve::jinja
