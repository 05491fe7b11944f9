#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {
namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;

// Code points that a normalization form leaves alone and that cannot interact with a neighbour:
// canonical combining class 0, no decomposition that the form applies, and never the second half
// of a canonical composition (which could fuse it with the character before it). A string made
// only of these is in that form. Also the set of "seconds", which NFC needs below.
class InertTable {
 public:
  InertTable() : canonical_(Words()), any_(Words()), second_(Words()) {
    // Seconds: the last code point of every canonical decomposition into several code points
    // (the second half of each primary composite, which may itself decompose further at the front).
    // Singletons compose with nothing.
    for (char32_t cp = 0x80; cp <= kMaxCodePoint; ++cp) {
      const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
      const bool hangul = cp >= 0xAC00 && cp <= 0xD7A3;
      if ((p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0) && !hangul) continue;
      utf8proc_int32_t buf[16];
      int last_boundclass = 0;
      const utf8proc_ssize_t n = utf8proc_decompose_char(static_cast<utf8proc_int32_t>(cp), buf, 16,
                                                         UTF8PROC_DECOMPOSE, &last_boundclass);
      if (n >= 2 && n <= 16) Set(second_, static_cast<char32_t>(buf[n - 1]));
    }
    for (char32_t cp = 0; cp <= kMaxCodePoint; ++cp) {
      const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
      // Conjoining jamo compose algorithmically with their neighbours.
      const bool jamo = (cp >= 0x1100 && cp <= 0x11FF) || (cp >= 0xA960 && cp <= 0xA97F) ||
                        (cp >= 0xD7B0 && cp <= 0xD7FF);
      if (p->combining_class != 0 || jamo || Get(second_, cp)) continue;
      if (p->decomp_seqindex == UINT16_MAX) {
        Set(any_, cp);
        Set(canonical_, cp);
      } else if (p->decomp_type != 0) {
        Set(canonical_, cp);  // a compatibility decomposition: only NFKC and NFKD apply it
      }
    }
  }

  // Left alone by NFC and NFD.
  bool canonical_inert(char32_t cp) const { return Get(canonical_, cp); }
  // Left alone by every form.
  bool inert(char32_t cp) const { return Get(any_, cp); }
  bool second(char32_t cp) const { return Get(second_, cp); }

 private:
  static std::vector<uint64_t> Words() { return std::vector<uint64_t>(kMaxCodePoint / 64 + 1); }
  static void Set(std::vector<uint64_t>& bits, char32_t cp) {
    bits[cp >> 6] |= uint64_t{1} << (cp & 63);
  }
  static bool Get(const std::vector<uint64_t>& bits, char32_t cp) {
    return (bits[cp >> 6] >> (cp & 63)) & 1;
  }

  std::vector<uint64_t> canonical_;
  std::vector<uint64_t> any_;
  std::vector<uint64_t> second_;
};

const InertTable& Inert() {
  static const InertTable table;  // built once (a few ms), on the first non-ASCII text
  return table;
}

utf8proc_option_t Options(NormalizationForm form) {
  switch (form) {
    case NormalizationForm::kNfc:
      return static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    case NormalizationForm::kNfd:
      return static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    case NormalizationForm::kNfkc:
      return static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    case NormalizationForm::kNfkd:
      return static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  }
  return UTF8PROC_STABLE;
}

}  // namespace

const char* NormalizationFormName(NormalizationForm form) {
  switch (form) {
    case NormalizationForm::kNfc:
      return "NFC";
    case NormalizationForm::kNfd:
      return "NFD";
    case NormalizationForm::kNfkc:
      return "NFKC";
    case NormalizationForm::kNfkd:
      return "NFKD";
  }
  return "?";
}

bool IsQuickNormalized(std::string_view text, NormalizationForm form) {
  size_t i = 0;
  while (i < text.size() && static_cast<uint8_t>(text[i]) < 0x80) ++i;
  if (i == text.size()) return true;
  const InertTable& table = Inert();
  const bool compatibility = form == NormalizationForm::kNfkc || form == NormalizationForm::kNfkd;
  const bool decompose = form == NormalizationForm::kNfd || form == NormalizationForm::kNfkd;
  while (i < text.size()) {
    const char32_t cp = NextCodePoint(text, &i);
    if (cp < 0x80) continue;
    // Hangul syllables decompose algorithmically (utf8proc lists no decomposition for them).
    if (decompose && cp >= 0xAC00 && cp <= 0xD7A3) return false;
    if (compatibility ? table.inert(cp) : table.canonical_inert(cp)) continue;
    // Below U+0300 every character is its own NFC (the precomposed Latin letters included) and has
    // combining class 0; it only matters whether it could fuse with the character before it.
    if (form == NormalizationForm::kNfc && cp < 0x300 && !table.second(cp)) continue;
    return false;
  }
  return true;
}

Result<std::string_view> Normalizer::Normalize(std::string_view text, std::string* scratch) const {
  std::string_view current = text;
  for (NormalizationForm form : steps_) {
    if (IsQuickNormalized(current, form)) continue;
    utf8proc_uint8_t* mapped = nullptr;
    // An explicit length (not NULLTERM), so NUL characters in the text are kept.
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(current.data()),
                     static_cast<utf8proc_ssize_t>(current.size()), &mapped, Options(form));
    if (n < 0) {
      return InvalidArgument("{} normalization failed: {}", NormalizationFormName(form),
                             utf8proc_errmsg(n));
    }
    std::string result(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
    std::free(mapped);
    *scratch = std::move(result);
    current = *scratch;
  }
  return current;
}

}  // namespace moeserve::tokenizer
