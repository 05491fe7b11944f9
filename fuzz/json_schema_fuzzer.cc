// Compiles arbitrary bytes as a JSON Schema: a Status, or a grammar whose matcher keeps the mask's
// promise (structured_check.h) on a walk driven by the same bytes.
#include <cstdint>
#include <string_view>

#include "fuzz/structured_check.h"
#include "structured/structured.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moeserve::structured;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto g = Compile({GrammarSpec::Kind::kJsonSchema, std::string(text), {}},
                   moeserve::fuzz::SmallStructuredVocabulary());
  if (g.ok()) moeserve::fuzz::CheckMatcher(*g, text);
  return 0;
}
