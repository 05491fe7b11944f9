#include "tokenizer/jinja/py_string.h"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>
#include <utf8proc.h>

namespace moeserve::tokenizer::jinja {
namespace {

utf8proc_category_t Category(char32_t cp) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp));
}

// Python's "cased" characters: those with a case mapping or a cased letter category.
bool IsCased(char32_t cp) {
  const utf8proc_category_t c = Category(cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
         utf8proc_islower(static_cast<utf8proc_int32_t>(cp)) ||
         utf8proc_isupper(static_cast<utf8proc_int32_t>(cp));
}

char32_t ToLower(char32_t cp) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
}

// Unicode's unconditional SpecialCasing.txt mappings to more than one code point, as Python's
// str.upper() and str.title() apply them (utf8proc only has the one-to-one mappings). Generated
// from Python 3.11 (Unicode 14): every code point whose upper() or title() is longer than one.
struct SpecialCase {
  char32_t cp;
  const char* upper;
  const char* title;
};
constexpr SpecialCase kSpecialCases[] = {
    {0x00DF, "SS", "Ss"},
    {0x0149, "\u02BCN", "\u02BCN"},
    {0x01F0, "J\u030C", "J\u030C"},
    {0x0390, "\u0399\u0308\u0301", "\u0399\u0308\u0301"},
    {0x03B0, "\u03A5\u0308\u0301", "\u03A5\u0308\u0301"},
    {0x0587, "\u0535\u0552", "\u0535\u0582"},
    {0x1E96, "H\u0331", "H\u0331"},
    {0x1E97, "T\u0308", "T\u0308"},
    {0x1E98, "W\u030A", "W\u030A"},
    {0x1E99, "Y\u030A", "Y\u030A"},
    {0x1E9A, "A\u02BE", "A\u02BE"},
    {0x1F50, "\u03A5\u0313", "\u03A5\u0313"},
    {0x1F52, "\u03A5\u0313\u0300", "\u03A5\u0313\u0300"},
    {0x1F54, "\u03A5\u0313\u0301", "\u03A5\u0313\u0301"},
    {0x1F56, "\u03A5\u0313\u0342", "\u03A5\u0313\u0342"},
    {0x1F80, "\u1F08\u0399", "\u1F88"},
    {0x1F81, "\u1F09\u0399", "\u1F89"},
    {0x1F82, "\u1F0A\u0399", "\u1F8A"},
    {0x1F83, "\u1F0B\u0399", "\u1F8B"},
    {0x1F84, "\u1F0C\u0399", "\u1F8C"},
    {0x1F85, "\u1F0D\u0399", "\u1F8D"},
    {0x1F86, "\u1F0E\u0399", "\u1F8E"},
    {0x1F87, "\u1F0F\u0399", "\u1F8F"},
    {0x1F88, "\u1F08\u0399", "\u1F88"},
    {0x1F89, "\u1F09\u0399", "\u1F89"},
    {0x1F8A, "\u1F0A\u0399", "\u1F8A"},
    {0x1F8B, "\u1F0B\u0399", "\u1F8B"},
    {0x1F8C, "\u1F0C\u0399", "\u1F8C"},
    {0x1F8D, "\u1F0D\u0399", "\u1F8D"},
    {0x1F8E, "\u1F0E\u0399", "\u1F8E"},
    {0x1F8F, "\u1F0F\u0399", "\u1F8F"},
    {0x1F90, "\u1F28\u0399", "\u1F98"},
    {0x1F91, "\u1F29\u0399", "\u1F99"},
    {0x1F92, "\u1F2A\u0399", "\u1F9A"},
    {0x1F93, "\u1F2B\u0399", "\u1F9B"},
    {0x1F94, "\u1F2C\u0399", "\u1F9C"},
    {0x1F95, "\u1F2D\u0399", "\u1F9D"},
    {0x1F96, "\u1F2E\u0399", "\u1F9E"},
    {0x1F97, "\u1F2F\u0399", "\u1F9F"},
    {0x1F98, "\u1F28\u0399", "\u1F98"},
    {0x1F99, "\u1F29\u0399", "\u1F99"},
    {0x1F9A, "\u1F2A\u0399", "\u1F9A"},
    {0x1F9B, "\u1F2B\u0399", "\u1F9B"},
    {0x1F9C, "\u1F2C\u0399", "\u1F9C"},
    {0x1F9D, "\u1F2D\u0399", "\u1F9D"},
    {0x1F9E, "\u1F2E\u0399", "\u1F9E"},
    {0x1F9F, "\u1F2F\u0399", "\u1F9F"},
    {0x1FA0, "\u1F68\u0399", "\u1FA8"},
    {0x1FA1, "\u1F69\u0399", "\u1FA9"},
    {0x1FA2, "\u1F6A\u0399", "\u1FAA"},
    {0x1FA3, "\u1F6B\u0399", "\u1FAB"},
    {0x1FA4, "\u1F6C\u0399", "\u1FAC"},
    {0x1FA5, "\u1F6D\u0399", "\u1FAD"},
    {0x1FA6, "\u1F6E\u0399", "\u1FAE"},
    {0x1FA7, "\u1F6F\u0399", "\u1FAF"},
    {0x1FA8, "\u1F68\u0399", "\u1FA8"},
    {0x1FA9, "\u1F69\u0399", "\u1FA9"},
    {0x1FAA, "\u1F6A\u0399", "\u1FAA"},
    {0x1FAB, "\u1F6B\u0399", "\u1FAB"},
    {0x1FAC, "\u1F6C\u0399", "\u1FAC"},
    {0x1FAD, "\u1F6D\u0399", "\u1FAD"},
    {0x1FAE, "\u1F6E\u0399", "\u1FAE"},
    {0x1FAF, "\u1F6F\u0399", "\u1FAF"},
    {0x1FB2, "\u1FBA\u0399", "\u1FBA\u0345"},
    {0x1FB3, "\u0391\u0399", "\u1FBC"},
    {0x1FB4, "\u0386\u0399", "\u0386\u0345"},
    {0x1FB6, "\u0391\u0342", "\u0391\u0342"},
    {0x1FB7, "\u0391\u0342\u0399", "\u0391\u0342\u0345"},
    {0x1FBC, "\u0391\u0399", "\u1FBC"},
    {0x1FC2, "\u1FCA\u0399", "\u1FCA\u0345"},
    {0x1FC3, "\u0397\u0399", "\u1FCC"},
    {0x1FC4, "\u0389\u0399", "\u0389\u0345"},
    {0x1FC6, "\u0397\u0342", "\u0397\u0342"},
    {0x1FC7, "\u0397\u0342\u0399", "\u0397\u0342\u0345"},
    {0x1FCC, "\u0397\u0399", "\u1FCC"},
    {0x1FD2, "\u0399\u0308\u0300", "\u0399\u0308\u0300"},
    {0x1FD3, "\u0399\u0308\u0301", "\u0399\u0308\u0301"},
    {0x1FD6, "\u0399\u0342", "\u0399\u0342"},
    {0x1FD7, "\u0399\u0308\u0342", "\u0399\u0308\u0342"},
    {0x1FE2, "\u03A5\u0308\u0300", "\u03A5\u0308\u0300"},
    {0x1FE3, "\u03A5\u0308\u0301", "\u03A5\u0308\u0301"},
    {0x1FE4, "\u03A1\u0313", "\u03A1\u0313"},
    {0x1FE6, "\u03A5\u0342", "\u03A5\u0342"},
    {0x1FE7, "\u03A5\u0308\u0342", "\u03A5\u0308\u0342"},
    {0x1FF2, "\u1FFA\u0399", "\u1FFA\u0345"},
    {0x1FF3, "\u03A9\u0399", "\u1FFC"},
    {0x1FF4, "\u038F\u0399", "\u038F\u0345"},
    {0x1FF6, "\u03A9\u0342", "\u03A9\u0342"},
    {0x1FF7, "\u03A9\u0342\u0399", "\u03A9\u0342\u0345"},
    {0x1FFC, "\u03A9\u0399", "\u1FFC"},
    {0xFB00, "FF", "Ff"},
    {0xFB01, "FI", "Fi"},
    {0xFB02, "FL", "Fl"},
    {0xFB03, "FFI", "Ffi"},
    {0xFB04, "FFL", "Ffl"},
    {0xFB05, "ST", "St"},
    {0xFB06, "ST", "St"},
    {0xFB13, "\u0544\u0546", "\u0544\u0576"},
    {0xFB14, "\u0544\u0535", "\u0544\u0565"},
    {0xFB15, "\u0544\u053B", "\u0544\u056B"},
    {0xFB16, "\u054E\u0546", "\u054E\u0576"},
    {0xFB17, "\u0544\u053D", "\u0544\u056D"},
};

const SpecialCase* FindSpecialCase(char32_t cp) {
  const auto* it = std::lower_bound(std::begin(kSpecialCases), std::end(kSpecialCases), cp,
                                    [](const SpecialCase& s, char32_t c) { return s.cp < c; });
  return it != std::end(kSpecialCases) && it->cp == cp ? it : nullptr;
}

void AppendUpper(char32_t cp, std::string* out) {
  if (const SpecialCase* s = FindSpecialCase(cp)) {
    *out += s->upper;
    return;
  }
  AppendUtf8(static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp))), out);
}

void AppendTitle(char32_t cp, std::string* out) {
  if (const SpecialCase* s = FindSpecialCase(cp)) {
    *out += s->title;
    return;
  }
  AppendUtf8(static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(cp))), out);
}

// Python's _PyUnicode_IsCaseIgnorable: marks, format characters, modifier letters and symbols,
// and the word-internal punctuation of Word_Break MidLetter / MidNumLet / Single_Quote.
bool IsCaseIgnorable(char32_t cp) {
  switch (cp) {
    case '\'': case '.': case ':': case 0xB7: case 0x387: case 0x55F: case 0x5F4: case 0x2018:
    case 0x2019: case 0x2024: case 0x2027: case 0xFE13: case 0xFE52: case 0xFE55: case 0xFF07:
    case 0xFF0E: case 0xFF1A:
      return true;
    default:
      break;
  }
  const utf8proc_category_t c = Category(cp);
  return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_ME || c == UTF8PROC_CATEGORY_CF ||
         c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_SK;
}

// Lower-cases cps[i]: İ becomes "i̇" and Σ becomes final ς at the end of a word, as in Python.
void AppendLower(const std::vector<char32_t>& cps, size_t i, std::string* out) {
  const char32_t cp = cps[i];
  if (cp == 0x130) {
    *out += "i\u0307";
    return;
  }
  if (cp == 0x3A3) {
    size_t j = i;
    while (j > 0 && IsCaseIgnorable(cps[j - 1])) --j;
    bool final_sigma = j > 0 && IsCased(cps[j - 1]);
    if (final_sigma) {
      size_t k = i + 1;
      while (k < cps.size() && IsCaseIgnorable(cps[k])) ++k;
      final_sigma = k == cps.size() || !IsCased(cps[k]);
    }
    AppendUtf8(final_sigma ? 0x3C2 : 0x3C3, out);
    return;
  }
  AppendUtf8(ToLower(cp), out);
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

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
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
    case '\t': case '\n': case '\v': case '\f': case '\r': case 0x1C: case 0x1D: case 0x1E:
    case 0x1F: case ' ': case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool IsPyLineBreak(char32_t cp) {
  switch (cp) {
    case '\n': case '\r': case '\v': case '\f': case 0x1C: case 0x1D: case 0x1E: case 0x85:
    case 0x2028: case 0x2029:
      return true;
    default:
      return false;
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

int64_t PyFind(std::string_view s, std::string_view sub, int64_t start, int64_t end,
               bool reverse) {
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

std::string PyLower(std::string_view s) {
  const std::vector<char32_t> cps = ToCodePoints(s);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < cps.size(); ++i) AppendLower(cps, i, &out);
  return out;
}

std::string PyUpper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) AppendUpper(DecodeUtf8(s, &pos), &out);
  return out;
}

std::string PySwapCase(std::string_view s) {
  const std::vector<char32_t> cps = ToCodePoints(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    const auto c = static_cast<utf8proc_int32_t>(cps[i]);
    if (utf8proc_isupper(c)) {
      AppendLower(cps, i, &out);
    } else if (utf8proc_islower(c)) {
      AppendUpper(cps[i], &out);
    } else {
      AppendUtf8(cps[i], &out);
    }
  }
  return out;
}

std::string PyCapitalize(std::string_view s) {
  const std::vector<char32_t> cps = ToCodePoints(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0) {
      AppendTitle(cps[i], &out);
    } else {
      AppendLower(cps, i, &out);
    }
  }
  return out;
}

std::string PyTitle(std::string_view s) {
  const std::vector<char32_t> cps = ToCodePoints(s);
  std::string out;
  bool previous_is_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (previous_is_cased) {
      AppendLower(cps, i, &out);
    } else {
      AppendTitle(cps[i], &out);
    }
    previous_is_cased = IsCased(cps[i]);
  }
  return out;
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
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
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

}  // namespace moeserve::tokenizer::jinja
