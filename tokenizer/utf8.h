// UTF-8 helpers for the tokenizer: validation, code point iteration, and the lossy decoding Hugging
// Face's decoders end with (Rust's String::from_utf8_lossy), including a streaming form.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "core/utf8.h"

namespace moeserve::tokenizer {

// The replacement character U+FFFD, UTF-8 encoded.
inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

// Byte offset of the first byte that does not start a well-formed UTF-8 sequence (overlong forms,
// surrogates and code points past U+10FFFF are ill-formed), or npos when `s` is valid UTF-8.
size_t FindInvalidUtf8(std::string_view s);

// Decodes the code point starting at s[*i] and advances *i past it. `s` must be valid UTF-8.
char32_t NextCodePoint(std::string_view s, size_t* i);
// The code point that ends at s[end - 1] (valid UTF-8); *start receives its first byte's offset.
char32_t PreviousCodePoint(std::string_view s, size_t end, size_t* start);

using ::moeserve::AppendUtf8;  // core/utf8.h

// Appends `bytes` to *out as text, each maximal ill-formed subsequence replaced by one U+FFFD
// (the Unicode "substitution of maximal subparts" practice that from_utf8_lossy follows).
// With final = false a trailing sequence that is incomplete but could still become valid is left
// unconsumed, so that decoding a byte stream piece by piece gives the same text as decoding it
// whole. Returns the number of bytes consumed.
size_t AppendUtf8Lossy(std::string_view bytes, bool final, std::string* out);

// Unicode White_Space (what Rust's char::is_whitespace and regex \s match).
bool IsUnicodeWhiteSpace(char32_t cp);
// Rust regex's Unicode \w: Alphabetic, marks, decimal digits, connector punctuation and the
// joiners. Alphabetic is taken as the letters, letter numbers and the Other_Alphabetic symbols
// (circled and squared Latin letters); its other members are marks, which \w includes anyway.
bool IsWordChar(char32_t cp);

}  // namespace moeserve::tokenizer
