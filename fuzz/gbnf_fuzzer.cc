// Parses arbitrary bytes as a GBNF grammar (and, with a first byte '~', as a regex): a Status, or
// a grammar whose matcher keeps the mask's promise (structured_check.h) on a walk driven by the
// same bytes.
#include <cstdint>
#include <string_view>

#include "fuzz/structured_check.h"
#include "structured/structured.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moeserve::structured;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  GrammarSpec spec{GrammarSpec::Kind::kGrammar, std::string(text), {}};
  if (!text.empty() && text[0] == '~')
    spec = {GrammarSpec::Kind::kRegex, std::string(text.substr(1)), {}};
  auto g = Compile(spec, moeserve::fuzz::SmallStructuredVocabulary());
  if (g.ok()) moeserve::fuzz::CheckMatcher(*g, text);
  return 0;
}
