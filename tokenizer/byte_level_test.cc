#include "tokenizer/byte_level.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace moeserve::tokenizer {
namespace {

bool IsGpt2Printable(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

std::string AllBytes() {
  std::string bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<char>(b));
  return bytes;
}

TEST(ByteLevelTest, EveryByteRoundTrips) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = ByteToCodePoint(static_cast<uint8_t>(b));
    EXPECT_TRUE(seen.insert(cp).second) << "code point used twice: " << static_cast<uint32_t>(cp);
    EXPECT_EQ(CodePointToByte(cp), std::optional<uint8_t>(b));
  }
  const std::string bytes = AllBytes();
  EXPECT_EQ(ByteLevelToBytes(BytesToByteLevel(bytes)), bytes);
}

TEST(ByteLevelTest, PrintableBytesMapToThemselves) {
  int printable = 0;
  for (int b = 0; b < 256; ++b) {
    if (!IsGpt2Printable(b)) continue;
    ++printable;
    EXPECT_EQ(ByteToCodePoint(static_cast<uint8_t>(b)), static_cast<char32_t>(b)) << b;
  }
  EXPECT_EQ(printable, 188);
}

TEST(ByteLevelTest, OtherBytesMapToU0100OnwardsInByteOrder) {
  char32_t expected = 0x100;
  for (int b = 0; b < 256; ++b) {
    if (IsGpt2Printable(b)) continue;
    EXPECT_EQ(ByteToCodePoint(static_cast<uint8_t>(b)), expected) << b;
    ++expected;
  }
  EXPECT_EQ(expected, 0x100 + 68u);
  // The well-known ones: space is 'Ġ', newline 'Ċ', tab 'ĉ'.
  EXPECT_EQ(ByteToCodePoint(' '), U'\u0120');
  EXPECT_EQ(ByteToCodePoint('\n'), U'\u010A');
  EXPECT_EQ(ByteToCodePoint('\t'), U'\u0109');
}

TEST(ByteLevelTest, CodePointsOutsideTheAlphabetHaveNoByte) {
  for (const char32_t cp : {U' ', U'\n', U'\x7F', U'\xA0', U'\xAD', U'\u0144', U'\u4E2D'}) {
    EXPECT_EQ(CodePointToByte(cp), std::nullopt) << static_cast<uint32_t>(cp);
  }
  EXPECT_EQ(CodePointToByte(0x143), std::optional<uint8_t>(0xAD));  // the last one
}

TEST(ByteLevelTest, EncodesToUtf8) {
  EXPECT_EQ(BytesToByteLevel(""), "");
  EXPECT_EQ(BytesToByteLevel(" hello\n"), "\u0120hello\u010A");
  // A multi-byte UTF-8 character becomes one alphabet character per byte: "é" is C3 A9.
  EXPECT_EQ(BytesToByteLevel("\xC3\xA9"), "\u00C3\u00A9");
  EXPECT_EQ(ByteLevelToBytes("\u00C3\u00A9"), "\xC3\xA9");
  EXPECT_EQ(ByteLevelToBytes(""), "");
}

TEST(ByteLevelTest, RejectsCodePointsOutsideTheAlphabet) {
  EXPECT_EQ(ByteLevelToBytes("a b"), std::nullopt);               // a raw space
  EXPECT_EQ(ByteLevelToBytes("\u4E2D"), std::nullopt);            // 中
  EXPECT_EQ(ByteLevelToBytes("ok\u0144"), std::nullopt);          // just past the alphabet
  EXPECT_EQ(ByteLevelToBytes("\xF0\x9F\x98\x80"), std::nullopt);  // U+1F600
}

TEST(ByteLevelTest, RejectsInvalidUtf8) {
  const char* const invalid[] = {
      "\x80",              // stray continuation byte
      "\xC4",              // truncated 2-byte sequence
      "a\xC4",             // truncated at the end
      "\xC4\x41",          // continuation byte missing
      "\xC0\xA1",          // overlong '!' (which is in the alphabet)
      "\xC1\xBF",          // overlong U+007F
      "\xE0\x84\x80",      // overlong U+0100 (which is in the alphabet)
      "\xF0\x80\x80\xA1",  // overlong '!' in 4 bytes
      "\xED\xA0\x80",      // surrogate U+D800
      "\xED\xBF\xBF",      // surrogate U+DFFF
      "\xF4\x90\x80\x80",  // U+110000
      "\xF5\x80\x80\x80",  // lead byte beyond U+10FFFF
      "\xFF",              // never valid
      "\xE4\xB8",          // truncated 3-byte sequence
  };
  for (const char* text : invalid) {
    EXPECT_EQ(ByteLevelToBytes(text), std::nullopt) << ::testing::PrintToString(text);
  }
}

}  // namespace
}  // namespace moeserve::tokenizer
