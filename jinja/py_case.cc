// Python's case mappings for str.upper/lower/title/capitalize/swapcase: utf8proc's one-to-one
// mappings plus Unicode's SpecialCasing (ß -> SS, İ -> i̇, final sigma), which Python applies and
// utf8proc does not.
#include <utf8proc.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/py_string.h"

namespace moeserve::jinja {
namespace {

utf8proc_category_t Category(char32_t cp) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp));
}

// Python's "cased" characters: cased letters and those with Other_Lowercase/Other_Uppercase.
bool PyIsCased(char32_t cp) {
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
    case '\'':
    case '.':
    case ':':
    case 0xB7:
    case 0x387:
    case 0x55F:
    case 0x5F4:
    case 0x2018:
    case 0x2019:
    case 0x2024:
    case 0x2027:
    case 0xFE13:
    case 0xFE52:
    case 0xFE55:
    case 0xFF07:
    case 0xFF0E:
    case 0xFF1A:
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
    bool final_sigma = j > 0 && PyIsCased(cps[j - 1]);
    if (final_sigma) {
      size_t k = i + 1;
      while (k < cps.size() && IsCaseIgnorable(cps[k])) ++k;
      final_sigma = k == cps.size() || !PyIsCased(cps[k]);
    }
    AppendUtf8(final_sigma ? 0x3C2 : 0x3C3, out);
    return;
  }
  AppendUtf8(ToLower(cp), out);
}

}  // namespace

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
    previous_is_cased = PyIsCased(cps[i]);
  }
  return out;
}
}  // namespace moeserve::jinja
