// The matcher on fixed grammars (first byte: which), the rest of the bytes driving a walk with
// probes and rollbacks: AcceptToken succeeds exactly for the tokens the mask allows
// (structured_check.h).
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "fuzz/structured_check.h"
#include "structured/structured.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moeserve::structured;
  static const std::vector<std::shared_ptr<const CompiledGrammar>> grammars = [] {
    const std::vector<GrammarSpec> specs = {
        {GrammarSpec::Kind::kJsonObject, "", {}},
        {GrammarSpec::Kind::kJsonSchema,
         R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 3},
             "b": {"type": "array", "items": {"$ref": "#"}}, "c": {"enum": [1, "x", null]}},
             "required": ["a"], "additionalProperties": {"type": "integer", "minimum": -3}})",
         {}},
        {GrammarSpec::Kind::kRegex, R"((ab|é[0-9]{2,4}|\w+\.)*x?)", {}},
        {GrammarSpec::Kind::kGrammar,
         "root ::= item+\nitem ::= \"(\" item* \")\" | [a-z\\u00e9] | \"\\\"\" [^\"]* \"\\\"\"",
         {}},
        {GrammarSpec::Kind::kChoice, "", {"yes", "no", "y", "\xe6\x97\xa5\xe6\x9c\xac"}},
    };
    std::vector<std::shared_ptr<const CompiledGrammar>> out;
    for (const GrammarSpec& s : specs) {
      out.push_back(Compile(s, moeserve::fuzz::SmallStructuredVocabulary()).value());
    }
    return out;
  }();
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  moeserve::fuzz::CheckMatcher(grammars[data[0] % grammars.size()], text.substr(1));
  return 0;
}
