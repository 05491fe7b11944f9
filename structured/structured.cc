#include "structured/structured.h"

#include <utility>

#include "structured/automaton.h"
#include "structured/gbnf_parser.h"
#include "structured/json_schema.h"
#include "structured/regex_parser.h"
#include "structured/tool_calls_grammar.h"

namespace moeserve::structured {

namespace {

Result<Grammar> ChoiceGrammar(const std::vector<std::string>& choices, const Limits& limits) {
  if (choices.empty()) return InvalidArgument("choice: the list is empty");
  if (choices.size() > limits.max_enum_values) {
    return InvalidArgument("choice: {} entries, more than {} (max_enum_values)", choices.size(),
                           limits.max_enum_values);
  }
  size_t bytes = 0;
  std::vector<Expr> alts;
  for (const std::string& c : choices) {
    bytes += c.size();
    alts.push_back(Lit(c));
  }
  if (bytes > limits.max_spec_bytes) {
    return InvalidArgument("choice: {} bytes in all, more than {} (max_spec_bytes)", bytes,
                           limits.max_spec_bytes);
  }
  Grammar g;
  g.root = g.AddRule("root");
  g.bodies[0] = Alt(std::move(alts));
  return g;
}

}  // namespace

Result<Grammar> SpecToGrammar(const GrammarSpec& spec, const Limits& limits) {
  switch (spec.kind) {
    case GrammarSpec::Kind::kJsonSchema:
      return JsonSchemaGrammar(spec.text, limits);
    case GrammarSpec::Kind::kJsonObject:
      return JsonObjectGrammar();
    case GrammarSpec::Kind::kRegex:
      return RegexGrammar(spec.text, limits);
    case GrammarSpec::Kind::kChoice:
      return ChoiceGrammar(spec.choices, limits);
    case GrammarSpec::Kind::kGrammar:
      return ParseGbnf(spec.text, limits);
    case GrammarSpec::Kind::kToolCalls:
      return ToolCallsGrammar(spec.text, limits);
  }
  return Internal("unknown spec kind");
}

Result<std::shared_ptr<const CompiledGrammar>> CompileGrammar(
    const Grammar& grammar, std::shared_ptr<const Vocabulary> vocabulary, const Limits& limits) {
  ASSIGN_OR_RETURN(Automaton a, BuildAutomaton(grammar, limits));
  return std::make_shared<const CompiledGrammar>(std::move(a), std::move(vocabulary));
}

Result<std::shared_ptr<const CompiledGrammar>> Compile(const GrammarSpec& spec,
                                                       std::shared_ptr<const Vocabulary> vocabulary,
                                                       const Limits& limits) {
  ASSIGN_OR_RETURN(Grammar g, SpecToGrammar(spec, limits));
  return CompileGrammar(g, std::move(vocabulary), limits);
}

std::string CacheKey(const GrammarSpec& spec) {
  // Length-prefixed fields: no two different specs give the same key.
  std::string key = std::to_string(static_cast<int>(spec.kind)) + ":" +
                    std::to_string(spec.text.size()) + ":" + spec.text;
  for (const std::string& c : spec.choices) key += std::to_string(c.size()) + ":" + c;
  return key;
}

}  // namespace moeserve::structured
