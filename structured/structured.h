// Structured output's entry point: a spec (JSON Schema, any JSON, regex, choice or GBNF grammar)
// compiled for one tokenizer's vocabulary into a CompiledGrammar (matcher.h), which a Matcher
// per request walks token by token.
//
//   std::shared_ptr<const Vocabulary> vocab = Vocabulary::FromTokenizer(tok, eos_ids).value();
//   GrammarSpec spec{GrammarSpec::Kind::kJsonSchema, R"({"type": "object", ...})"};
//   Result<std::shared_ptr<const CompiledGrammar>> g = Compile(spec, vocab);   // 400 if !ok
//   Matcher m(*g);
//
// A compiled grammar is immutable and thread-safe (its per-state mask cache fills under a lock):
// share it across requests, keyed by CacheKey(spec) and the vocabulary.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "structured/grammar.h"
#include "structured/matcher.h"
#include "structured/vocabulary.h"

namespace moeserve::structured {

struct GrammarSpec {
  enum class Kind {
    kJsonSchema,  // text: a JSON Schema (json_schema.h says what is enforced)
    kJsonObject,  // any JSON object (response_format json_object); text unused
    kRegex,       // text: a pattern the whole output matches (regex_parser.h)
    kChoice,      // choices: the output is exactly one of them
    kGrammar,     // text: GBNF (gbnf_parser.h)
    kToolCalls,   // text: tools and the model's call format (tool_calls_grammar.h)
  };
  Kind kind = Kind::kJsonSchema;
  std::string text;
  std::vector<std::string> choices;
};

// The spec as a Grammar (no vocabulary needed): InvalidArgument naming what is wrong or which
// limit was exceeded.
Result<Grammar> SpecToGrammar(const GrammarSpec& spec, const Limits& limits = {});

// The spec compiled for `vocabulary`.
Result<std::shared_ptr<const CompiledGrammar>> Compile(const GrammarSpec& spec,
                                                       std::shared_ptr<const Vocabulary> vocabulary,
                                                       const Limits& limits = {});
Result<std::shared_ptr<const CompiledGrammar>> CompileGrammar(
    const Grammar& grammar, std::shared_ptr<const Vocabulary> vocabulary,
    const Limits& limits = {});

// A key that is equal exactly when two specs are equal (kind and contents), for a compile cache.
std::string CacheKey(const GrammarSpec& spec);

}  // namespace moeserve::structured
