// Python str semantics over UTF-8 bytes. Jinja templates index, slice, strip, split and case-map
// strings as Python does, by code point and with Python's notion of whitespace; these helpers give
// the interpreter exactly that without a general Unicode string type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/utf8.h"

namespace moeserve::jinja {

// Decodes one code point at s[*pos] and advances *pos. Invalid bytes decode as themselves (one
// byte each) so that no input makes the interpreter fail; chat inputs come from parsed JSON and
// are valid UTF-8 anyway.
char32_t DecodeUtf8(std::string_view s, size_t* pos);
using ::moeserve::AppendUtf8;  // core/utf8.h

std::vector<char32_t> ToCodePoints(std::string_view s);
std::string FromCodePoints(const std::vector<char32_t>& cps, size_t begin, size_t end);
// Number of code points (Python len()).
int64_t CodePointCount(std::string_view s);
// Byte offset of code point index `index` (0 <= index <= count).
size_t ByteOffsetOfCodePoint(std::string_view s, int64_t index);

// str.isspace() for one code point: Unicode White_Space plus the ASCII separators \x1c-\x1f.
bool IsPySpace(char32_t cp);

// str.strip / lstrip / rstrip. `chars` absent strips whitespace; present strips any of its code
// points.
std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right);
// str.split(sep, maxsplit) and str.rsplit. An absent sep splits on runs of whitespace and drops
// empty pieces. sep must not be empty (checked by the caller: Python raises ValueError).
std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit, bool from_right);
// str.splitlines(keepends).
std::vector<std::string> PySplitLines(std::string_view s, bool keepends);
// str.replace(old, new, count); count < 0 replaces all. An empty `old` inserts `new` between code
// points, as Python does.
std::string PyReplace(std::string_view s, std::string_view old_sub, std::string_view new_sub,
                      int64_t count);
// str.find / rfind / count over code point indices, with Python's start/end clamping.
int64_t PyFind(std::string_view s, std::string_view sub, int64_t start, int64_t end, bool reverse);
int64_t PyCount(std::string_view s, std::string_view sub, int64_t start, int64_t end);

// Case mapping as Python's str does it (py_case.cc): utf8proc's simple mappings plus the
// SpecialCasing expansions and final sigma.
std::string PyLower(std::string_view s);
std::string PyUpper(std::string_view s);
std::string PySwapCase(std::string_view s);
// str.capitalize(): first code point title-cased, the rest lower-cased.
std::string PyCapitalize(std::string_view s);
// str.title(): a cased letter after an uncased character is title-cased, other cased letters
// lower-cased.
std::string PyTitle(std::string_view s);

// Character class predicates over a whole string (false for the empty string), as Python's.
bool PyIsAlpha(std::string_view s);
bool PyIsAlnum(std::string_view s);
bool PyIsDigit(std::string_view s);
bool PyIsSpace(std::string_view s);
bool PyIsLower(std::string_view s);
bool PyIsUpper(std::string_view s);

// Python repr() of a str: quotes chosen as Python chooses them, escapes for non-printables.
std::string PyStrRepr(std::string_view s);

// HTML escaping of markupsafe.escape: & < > " ' become entities.
std::string HtmlEscape(std::string_view s);

// Python float(str): optional whitespace and sign, decimal digits with single underscores, an
// optional exponent, or inf/infinity/nan. nullopt where Python raises ValueError.
std::optional<double> PyParseFloat(std::string_view text);
// Python int(str, base): whitespace, sign, digits with single underscores, a 0x/0o/0b prefix
// matching the base (any for base 0). nullopt where Python raises ValueError or the value does
// not fit in 64 bits.
std::optional<int64_t> PyParseInt(std::string_view text, int64_t base);

// Python slice index normalisation (PySlice_AdjustIndices): fills start/stop for a sequence of
// `length` items and returns the number of selected items. `step` must not be zero.
int64_t AdjustSlice(int64_t length, std::optional<int64_t> start, std::optional<int64_t> stop,
                    int64_t step, int64_t* start_out, int64_t* stop_out);

}  // namespace moeserve::jinja
