// structured/: parsers, automaton and matcher. The property tests walk the real Qwen3 vocabulary
// at random through each grammar's masks (every step picks an allowed token) and check every
// output with independent validators (Python's jsonschema and re, testdata/validate.py); at every
// step, tokens the mask allows are accepted and tokens it refuses are refused.
#include "structured/structured.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "structured/automaton.h"
#include "structured/gbnf_parser.h"
#include "structured/grammar_cache.h"
#include "structured/json_schema.h"
#include "structured/regex_parser.h"
#include "tokenizer/tokenizer.h"
#include "core/test_paths.h"

namespace moeserve::structured {
namespace {

const std::string kDataDir = std::string(MOESERVE_SOURCE_DIR) + "/structured/testdata";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The Qwen3 vocabulary (151,643 BPE tokens and the added ones), <|im_end|> and <|endoftext|>
// ending, loaded once.
std::shared_ptr<const Vocabulary> Qwen3Vocabulary() {
  static std::shared_ptr<const Vocabulary> vocab = [] {
    auto tok =
        tokenizer::Tokenizer::LoadFromDir(std::string(MOESERVE_TESTDATA_DIR) + "/qwen3-tokenizer");
    EXPECT_TRUE(tok.ok()) << tok.status().ToString();
    std::vector<int32_t> eos = {*(*tok)->TokenToId("<|im_end|>"),
                                *(*tok)->TokenToId("<|endoftext|>")};
    auto v = Vocabulary::FromTokenizer(**tok, eos);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return *v;
  }();
  return vocab;
}

// A tiny vocabulary over a few strings (ids in order), EOS last.
std::shared_ptr<const Vocabulary> SmallVocabulary(std::vector<std::string> tokens) {
  tokens.push_back("");
  const int32_t eos = static_cast<int32_t>(tokens.size() - 1);
  return Vocabulary::Create(std::move(tokens), {eos}).value();
}

std::shared_ptr<const CompiledGrammar> MustCompile(const GrammarSpec& spec,
                                                   std::shared_ptr<const Vocabulary> v) {
  auto g = Compile(spec, std::move(v));
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : nullptr;
}

bool Accepts(const GrammarSpec& spec, std::string_view text) {
  auto g = MustCompile(spec, SmallVocabulary({}));
  Matcher m(g);
  return (text.empty() || m.AcceptBytes(text)) && m.CanEnd();
}

GrammarSpec Gbnf(std::string text) { return {GrammarSpec::Kind::kGrammar, std::move(text), {}}; }
GrammarSpec Regex(std::string text) { return {GrammarSpec::Kind::kRegex, std::move(text), {}}; }
GrammarSpec Schema(std::string text) {
  return {GrammarSpec::Kind::kJsonSchema, std::move(text), {}};
}

std::optional<std::string> RandomWalk(const std::shared_ptr<const CompiledGrammar>& g,
                                      uint32_t seed, int budget, int cap);

// ---- grammar pieces ----

TEST(Utf8ByteRangesTest, CoverExactlyTheRange) {
  // Every code point of a few ranges is matched by exactly one sequence, and nothing else is.
  for (auto [lo, hi] : std::vector<std::pair<uint32_t, uint32_t>>{
           {0, 0x10FFFF}, {0x41, 0x5A}, {0x7F, 0x800}, {0xD000, 0xE100}, {0xFFFF, 0x10000}}) {
    const auto seqs = Utf8ByteRanges(lo, hi);
    for (uint32_t cp = lo; cp <= hi; cp += (hi - lo) / 5000 + 1) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      const std::string s = EncodeUtf8(cp);
      int matches = 0;
      for (const auto& seq : seqs) {
        bool ok = seq.size() == s.size();
        for (size_t i = 0; ok && i < s.size(); ++i) {
          ok = uint8_t(s[i]) >= seq[i].lo && uint8_t(s[i]) <= seq[i].hi;
        }
        matches += ok;
      }
      EXPECT_EQ(matches, 1) << std::hex << cp;
    }
    // A surrogate's three bytes (ED A0..BF 80..BF) are not UTF-8: no sequence may match them.
    for (uint32_t cp = std::max<uint32_t>(lo, 0xD800); cp <= std::min<uint32_t>(hi, 0xDFFF);
         cp += 0x3F) {
      const uint8_t s[3] = {0xED, uint8_t(0x80 | ((cp >> 6) & 0x3F)), uint8_t(0x80 | (cp & 0x3F))};
      for (const auto& seq : seqs) {
        bool ok = seq.size() == 3;
        for (size_t i = 0; ok && i < 3; ++i) ok = s[i] >= seq[i].lo && s[i] <= seq[i].hi;
        EXPECT_FALSE(ok) << "surrogate " << std::hex << cp;
      }
    }
  }
}

TEST(GbnfTest, ParsesLlamaCppSyntax) {
  const std::string arithmetic = R"g(# comment
root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
)g";
  EXPECT_TRUE(Accepts(Gbnf(arithmetic), "a+b=c\n"));
  EXPECT_TRUE(Accepts(Gbnf(arithmetic), "(x1 *2)/y = 7\n1=1\n"));
  EXPECT_FALSE(Accepts(Gbnf(arithmetic), "a+=c\n"));
  EXPECT_FALSE(Accepts(Gbnf(arithmetic), "a=b"));  // the newline is required

  const std::string misc = R"g(
root ::= "x"{2,3} [^a-c\x00-\x1f] "é"? . alt{1} "\u00e9\"" [\]\-] "\\"
alt  ::= ( "p" |
           "q" ) # comment inside
)g";
  EXPECT_TRUE(Accepts(Gbnf(misc), "xxd日p\u00e9\"]\\"));
  EXPECT_TRUE(Accepts(Gbnf(misc), "xxxZéZq\u00e9\"-\\"));
  EXPECT_FALSE(Accepts(Gbnf(misc), "xxbZp\u00e9\"]\\"));
  EXPECT_FALSE(Accepts(Gbnf(misc), "xxxxZZp\u00e9\"]\\"));
}

TEST(GbnfTest, TheRepositoryGrammarsCompile) {
  for (const char* name : {"json.gbnf", "list.gbnf", "arithmetic.gbnf"}) {
    SCOPED_TRACE(name);
    Result<Grammar> g = ParseGbnf(ReadFile(kDataDir + "/" + name));
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_TRUE(BuildAutomaton(*g, {}).ok());
  }
  EXPECT_TRUE(Accepts(Gbnf(ReadFile(kDataDir + "/json.gbnf")),
                      R"({"a": [1, 2.5e3, true, null, "x\"y"], "b": {}})"));
}

// MOESERVE_GBNF_DIR=DIR (e.g. llama.cpp's grammars/): every DIR/*.gbnf parses and compiles, and
// random walks through it keep the mask's promise (skipped without it).
TEST(GbnfTest, EveryGrammarOfAFolderCompiles) {
  const char* dir = std::getenv("MOESERVE_GBNF_DIR");
  if (dir == nullptr) GTEST_SKIP() << "MOESERVE_GBNF_DIR not set";
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".gbnf") continue;
    SCOPED_TRACE(entry.path().string());
    ++count;
    auto g = Compile(Gbnf(ReadFile(entry.path())), Qwen3Vocabulary());
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    for (uint32_t seed = 0; seed < 3; ++seed) RandomWalk(*g, seed, 30, 60);
  }
  EXPECT_GT(count, 0);
}

TEST(GbnfTest, BadGrammarsGetErrorsNamingTheProblem) {
  struct Case {
    std::string text, expected;
  };
  const std::vector<Case> cases = {
      {"root ::= foo", "'foo' is used but not defined"},
      {"a ::= \"x\"", "no rule named 'root'"},
      {"root ::= \"x\"\nroot ::= \"y\"", "defined twice"},
      {"root ::= \"x", "unterminated string"},
      {"root ::= [a-", "unterminated character class"},
      {"root ::= (\"x\"", "expected ')'"},
      {"root ::= \"x\"{5,2}", "n < m"},
      {"root ::= \"x\"{99999}", "max_repeat"},
      {"root ::= root \"x\"", "left recursion: rule 'root'"},
      {"root ::= a\na ::= b? a \"x\"\nb ::= \"y\"", "left recursion: rule 'a'"},
      {"root ::= \"\\q\"", "unknown escape"},
      {"root ::= <[1234]>", "token references"},
      {"root ::= \"\\xff\xff\"", "not valid UTF-8"},
      {std::string(100, '(') + std::string(100, ')'), "expected a rule name"},
      {"root ::= " + std::string(100, '(') + "\"x\"" + std::string(100, ')'), "max_nesting"},
      {"root ::= (((\"x\"{100}){100}){100})", "max_nfa_states"},
      {"root ::= [ab]* \"a\" [ab]{14}", "max_dfa_states"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    Result<Grammar> g = ParseGbnf(c.text);
    Status s = g.ok() ? BuildAutomaton(*g, {}).status() : g.status();
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << s.message();
  }
  Limits small;
  small.max_spec_bytes = 100;
  EXPECT_NE(ParseGbnf(std::string(200, ' '), small).status().message().find("max_spec_bytes"),
            std::string::npos);
}

TEST(RegexTest, MatchesWhatPythonMatches) {
  EXPECT_TRUE(Accepts(Regex("^[a-z]+@[a-z]+\\.(com|org)$"), "ab@cd.org"));
  EXPECT_FALSE(Accepts(Regex("[a-z]+@[a-z]+\\.(com|org)"), "ab@cd.net"));
  EXPECT_TRUE(Accepts(Regex("\\d{2,3}x{,2}"), "123xx"));
  EXPECT_FALSE(Accepts(Regex("\\d{2,3}"), "1234"));
  EXPECT_TRUE(Accepts(Regex("a{"), "a{"));  // not a quantifier: literal
  EXPECT_TRUE(Accepts(Regex("[^\\d]+"), "ab"));
  EXPECT_FALSE(Accepts(Regex("[^\\d]+"), "a\u0663"));  // Arabic-Indic 3: Python's \d has it
  EXPECT_TRUE(Accepts(Regex(".+"), "日本"));
  EXPECT_FALSE(Accepts(Regex(".+"), "a\nb"));
  EXPECT_TRUE(Accepts(Regex("(?:ab)+?c*+"), "ababcc"));
  for (const char* bad : {"(?=x)", "(a)\\1", "a\\bc", "(?i)a", "a^b", "*a", "(a", "a)", "[a",
                          "a{3,2}", "\\p{L}", "[[:alpha:]]"}) {
    EXPECT_FALSE(RegexGrammar(bad).ok()) << bad;
  }
  EXPECT_NE(RegexGrammar("(((((((((((a)))))))))))", Limits{.max_nesting = 5})
                .status()
                .message()
                .find("max_nesting"),
            std::string::npos);
}

TEST(JsonSchemaTest, AcceptsValidAndRefusesInvalidText) {
  const std::string person = R"({"type": "object", "properties": {"name": {"type": "string"},
      "age": {"type": "integer", "minimum": 0, "maximum": 150}}, "required": ["name"]})";
  EXPECT_TRUE(Accepts(Schema(person), R"({"name": "Ann", "age": 150})"));
  EXPECT_TRUE(Accepts(Schema(person), R"({"name":"A\"n\u00e9"})"));
  EXPECT_FALSE(Accepts(Schema(person), R"({"name": "Ann", "age": 151})"));
  EXPECT_FALSE(Accepts(Schema(person), R"({"age": 1})"));
  EXPECT_FALSE(Accepts(Schema(person), R"({"name": "Ann",  "age": 1})"));  // two spaces
  EXPECT_FALSE(Accepts(Schema(person), R"({"name": "Ann", "x": 1})"));     // strict by default
  const std::string open = R"({"type": "object", "properties": {"a": {"type": "integer"}},
      "additionalProperties": {"type": "string"}})";
  EXPECT_TRUE(Accepts(Schema(open), R"({"a": 1, "ab": "x", "b": "y"})"));
  EXPECT_FALSE(Accepts(Schema(open), R"({"a": 1, "a": "x"})"));  // a named key is not extra
  // Fractions only where every value they can take is inside: -1.25 is not written (-1.x could
  // pass -1.5), -0.25 and 1.75 are.
  for (const char* x : {"-0.25", "1.75", "-1", "0"}) {
    EXPECT_TRUE(Accepts(Schema(R"({"type": "number", "minimum": -1.5, "exclusiveMaximum": 2})"), x))
        << x;
  }
  EXPECT_FALSE(
      Accepts(Schema(R"({"type": "number", "minimum": -1.5, "exclusiveMaximum": 2})"), "2"));
  EXPECT_TRUE(Accepts(Schema(R"({"type": "integer", "minimum": -20, "maximum": 1234})"), "1099"));
  EXPECT_FALSE(Accepts(Schema(R"({"type": "integer", "minimum": -20, "maximum": 1234})"), "-21"));
  EXPECT_FALSE(Accepts(Schema(R"({"type": "integer", "minimum": -20, "maximum": 1234})"), "01"));
  // Exponents of at most two digits: every number is a finite double.
  for (const char* x : {"1e5", "-2.5E-12", "7e+99"}) {
    EXPECT_TRUE(Accepts(Schema(R"({"type": "number"})"), x)) << x;
  }
  EXPECT_FALSE(Accepts(Schema(R"({"type": "number"})"), "74E757866871"));
  EXPECT_FALSE(Accepts(Schema("{}"), "1e400"));
  EXPECT_TRUE(Accepts(Schema(R"({"type": "string", "format": "date"})"), R"("2024-02-28")"));
  EXPECT_FALSE(Accepts(Schema(R"({"type": "string", "format": "date"})"), R"("2024-02-30")"));
  // enum and const may name their type (as tools' schemas do); values of another type drop out.
  const std::string typed_enum = R"({"type": "string", "enum": ["a", 1, "b"]})";
  EXPECT_TRUE(Accepts(Schema(typed_enum), R"("b")"));
  EXPECT_FALSE(Accepts(Schema(typed_enum), "1"));
  EXPECT_TRUE(Accepts(Schema(R"({"type": ["integer", "null"], "enum": [2.0, null, "x"]})"), "2.0"));
  EXPECT_TRUE(Accepts(Schema(R"({"type": "integer", "const": 3})"), "3"));
  EXPECT_FALSE(
      SpecToGrammar({GrammarSpec::Kind::kJsonSchema, R"({"type": "string", "enum": [1]})", {}})
          .ok());
}

// Tool calls in the model's own formats: a call of a named tool, its arguments under its schema.
TEST(ToolCallsGrammarTest, HermesAndXmlCallsFollowTheTools) {
  const std::string tools = R"([
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"unit": {"type": "string", "enum": ["c", "f"]}, "n": {"type": "integer"},
                     "note": {"type": "string"}}, "required": ["unit"]}}},
    {"type": "function", "function": {"name": "g"}}])";
  auto spec = [&](const char* format, bool parallel, const char* only) {
    return GrammarSpec{GrammarSpec::Kind::kToolCalls,
                       fmt::format(R"({{"format": "{}", "parallel": {}, "only": {}, "tools": {}}})",
                                   format, parallel, only, tools),
                       {}};
  };
  const std::string hermes_f =
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"unit\": \"c\", \"n\": 3}}\n</tool_call>";
  const std::string hermes_g = "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(Accepts(spec("hermes", false, "null"), hermes_f));
  EXPECT_TRUE(Accepts(spec("hermes", true, "null"), hermes_f + "\n" + hermes_g));
  EXPECT_FALSE(Accepts(spec("hermes", false, "null"), hermes_f + "\n" + hermes_g));
  EXPECT_FALSE(Accepts(spec("hermes", false, R"("g")"), hermes_f));
  EXPECT_FALSE(Accepts(spec("hermes", false, "null"),
                       "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": 3}}\n</tool_call>"));
  const std::string xml_f =
      "<tool_call>\n<function=f>\n<parameter=unit>\nc\n</parameter>\n<parameter=note>\nany "
      "text, <b> too\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(Accepts(spec("qwen3_xml", false, "null"), xml_f));
  EXPECT_FALSE(Accepts(spec("qwen3_xml", false, "null"),
                       "<tool_call>\n<function=f>\n<parameter=unit>\nkelvin\n</parameter>\n"
                       "</function>\n</tool_call>"));
  EXPECT_TRUE(Accepts(spec("qwen3_xml", false, "null"),
                      "<tool_call>\n<function=g>\n</function>\n</tool_call>"));
  // Opened by the model's <tool_call> (tool_choice auto): one call without the tag; a "strict"
  // tool's arguments follow its schema, another's are any object.
  const std::string strict_tools = R"([
    {"type": "function", "function": {"name": "s", "strict": true, "parameters": {"type": "object",
      "properties": {"n": {"type": "integer"}}, "required": ["n"]}}},
    {"type": "function", "function": {"name": "g"}}])";
  const GrammarSpec opened{GrammarSpec::Kind::kToolCalls,
                           R"({"format": "hermes", "opened": true, "tools": )" + strict_tools + "}",
                           {}};
  EXPECT_TRUE(Accepts(opened, "\n{\"name\": \"s\", \"arguments\": {\"n\": 2}}\n</tool_call>"));
  EXPECT_FALSE(Accepts(opened, "\n{\"name\": \"s\", \"arguments\": {\"m\": 2}}\n</tool_call>"));
  EXPECT_TRUE(Accepts(opened, "\n{\"name\": \"g\", \"arguments\": {\"m\": [2]}}\n</tool_call>"));
  EXPECT_FALSE(Accepts(opened, "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>"));
  const GrammarSpec opened_xml{
      GrammarSpec::Kind::kToolCalls,
      R"({"format": "qwen3_xml", "opened": true, "tools": )" + strict_tools + "}",
      {}};
  EXPECT_TRUE(Accepts(opened_xml,
                      "\n<function=g>\n<parameter=any>\nx\n</parameter>\n"
                      "</function>\n</tool_call>"));
  EXPECT_FALSE(Accepts(opened_xml,
                       "\n<function=s>\n<parameter=n>\nx\n</parameter>\n"
                       "</function>\n</tool_call>"));
  EXPECT_FALSE(SpecToGrammar(spec("yaml", false, "null")).ok());
  EXPECT_FALSE(SpecToGrammar(spec("hermes", false, R"("h")")).ok());
}

// Integer bounds as digit automata: random ranges (small, huge, one-sided), each numeral near and
// between the bounds accepted exactly when it lies inside.
TEST(JsonSchemaTest, IntegerRangesAreExact) {
  std::mt19937_64 rng(7);
  auto random_bound = [&]() -> int64_t {
    const int64_t scale[] = {10, 1000, 1000000, 1000000000000000};
    const int64_t s = scale[rng() % 4];
    return static_cast<int64_t>(rng() % (2 * s + 1)) - s;
  };
  for (int r = 0; r < 40; ++r) {
    int64_t lo = random_bound(), hi = random_bound();
    if (lo > hi) std::swap(lo, hi);
    const int kind = r % 3;  // 0: both bounds, 1: minimum only, 2: maximum only
    std::string schema = R"({"type": "integer")";
    if (kind != 2) schema += fmt::format(R"(, "minimum": {})", lo);
    if (kind != 1) schema += fmt::format(R"(, "maximum": {})", hi);
    schema += "}";
    SCOPED_TRACE(schema);
    auto g = MustCompile(Schema(schema), SmallVocabulary({}));
    std::vector<int64_t> probes = {lo - 1, lo, lo + 1, hi - 1, hi,
                                   hi + 1, 0,  -1,     1,      (lo / 2 + hi / 2)};
    for (int k = 0; k < 10; ++k) probes.push_back(random_bound());
    for (int64_t n : probes) {
      const bool inside = (kind == 2 || n >= lo) && (kind == 1 || n <= hi);
      Matcher m(g);
      const bool accepted = m.AcceptBytes(std::to_string(n)) && m.CanEnd();
      EXPECT_EQ(accepted, inside) << n;
    }
  }
}

// Number bounds (fractional, exclusive, one-sided): every numeral accepted lies inside, and every
// integer inside is accepted (fractions are written from a subset, json_schema.h).
TEST(JsonSchemaTest, NumberBoundsAreSound) {
  std::mt19937 rng(11);
  auto bound = [&] { return static_cast<double>(static_cast<int>(rng() % 4001) - 2000) / 100; };
  int accepted_count = 0, fractions_accepted = 0;
  for (int r = 0; r < 40; ++r) {
    double lo = bound(), hi = bound();
    if (lo > hi) std::swap(lo, hi);
    const bool lo_strict = rng() % 2, hi_strict = rng() % 2;
    const int kind = r % 3;  // 0: both bounds, 1: lower only, 2: upper only
    std::string schema = R"({"type": "number")";
    if (kind != 2)
      schema += fmt::format(R"(, "{}": {})", lo_strict ? "exclusiveMinimum" : "minimum", lo);
    if (kind != 1)
      schema += fmt::format(R"(, "{}": {})", hi_strict ? "exclusiveMaximum" : "maximum", hi);
    schema += "}";
    SCOPED_TRACE(schema);
    auto inside = [&](double x) {
      return (kind == 2 || (lo_strict ? x > lo : x >= lo)) &&
             (kind == 1 || (hi_strict ? x < hi : x <= hi));
    };
    auto g = Compile(Schema(schema), SmallVocabulary({}));
    if (!g.ok()) {  // only when no number lies inside
      EXPECT_NE(g.status().message().find("no number lies within"), std::string::npos);
      continue;
    }
    for (int k = 0; k < 60; ++k) {
      const int whole = static_cast<int>(rng() % 45) - 22;
      const std::string text =
          k % 2 ? std::to_string(whole) : fmt::format("{}.{}", whole, rng() % 100);
      const double x = std::stod(text);
      Matcher m(*g);
      const bool accepted = m.AcceptBytes(text) && m.CanEnd();
      if (accepted) {
        EXPECT_TRUE(inside(x)) << text;
      }
      accepted_count += accepted;
      fractions_accepted += accepted && k % 2 == 0;
      if (k % 2 && inside(x)) {
        EXPECT_TRUE(accepted) << text;
      }
    }
  }
  // The probes reach inside the bounds, fractions too.
  EXPECT_GT(accepted_count, 300);
  EXPECT_GT(fractions_accepted, 100);
}

TEST(JsonSchemaTest, HostileAndUnsupportedSchemasGetErrorsNamingTheKeyword) {
  struct Case {
    std::string schema, expected;
  };
  std::string deep = "{}";
  for (int i = 0; i < 100; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  std::string refs = R"({"$defs": {)";
  for (int i = 0; i < 100; ++i) {
    refs += fmt::format(R"("d{}": {{"$ref": "#/$defs/d{}"}},)", i, i + 1);
  }
  refs += R"("d100": {"type": "integer"}}, "$ref": "#/$defs/d0"})";
  const std::vector<Case> cases = {
      {R"({"type": "string", "minLength": 2, "foo": 1})", "keyword 'foo' is not supported"},
      {R"({"type": "array", "uniqueItems": true})", "keyword 'uniqueItems' is not supported"},
      {R"({"type": "object", "patternProperties": {}})", "'patternProperties' is not supported"},
      {R"({"type": "number", "multipleOf": 2})", "'multipleOf' is not supported"},
      {R"({"not": {}})", "'not' is not supported"},
      {R"({"type": "string", "format": "ipv6"})", "format 'ipv6' is not supported"},
      {R"({"type": "integer", "minLength": 3})", "'minLength' does not apply to type integer"},
      {R"({"$ref": "http://x/y"})", "only references inside the schema"},
      {R"({"$ref": "#/nowhere"})", "names nothing"},
      {R"({"type": "object", "required": ["x"]})", "required property 'x' is not in properties"},
      {R"({"type": "integer", "minimum": 5, "maximum": 4})", "no number lies within"},
      {R"({"type": "string", "maxLength": 100000})", "max_repeat"},
      {R"({"type": "string", "pattern": "(a)\\1"})", "backreferences"},
      {R"({"type": "integer", "maximum": 1e300})", "beyond"},
      {R"({"type": "integer", "minimum": 100000000000000001})", "beyond"},
      {R"({"enum": []})", "non-empty"},
      {"{\"type\": ", "not valid JSON"},
      {deep, "nests deeper than 64"},
      {refs, "max_ref_depth"},
      {R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})", "left recursion"},
      {R"({"type": "array", "items": {"type": "string", "maxLength": 4000}, "minItems": 3000})",
       "max_"},
      {"false", "matches nothing"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.schema);
    Result<Grammar> g = JsonSchemaGrammar(c.schema);
    Status s = g.ok() ? BuildAutomaton(*g, {}).status() : g.status();
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << s.message();
  }
}

// ---- the matcher on the real vocabulary ----

// Allowed token ids of a mask.
std::vector<int32_t> AllowedTokens(std::span<const uint32_t> mask, int32_t n) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < n; ++id) {
    if (mask[id >> 5] >> (id & 31) & 1) ids.push_back(id);
  }
  return ids;
}

// One random walk: each step a random allowed token (after `budget` steps, tokens that close
// things — quotes, brackets, commas — are preferred, so the walk ends); checks that random
// refused tokens are refused and allowed ones accepted. The output text, or nullopt if the cap
// was hit.
std::optional<std::string> RandomWalk(const std::shared_ptr<const CompiledGrammar>& g,
                                      uint32_t seed, int budget, int cap) {
  const Vocabulary& v = g->vocabulary();
  Matcher m(g);
  std::mt19937 rng(seed);
  std::vector<uint32_t> mask(v.mask_words());
  std::string out;
  for (int step = 0; step < cap; ++step) {
    m.FillNextTokenBitmask(mask);
    EXPECT_FALSE(m.overflowed()) << "after " << out;
    const std::vector<int32_t> allowed = AllowedTokens(mask, v.size());
    EXPECT_FALSE(allowed.empty()) << "dead end after " << out;
    if (allowed.empty()) return std::nullopt;
    // The mask's promise, on a sample: allowed tokens are accepted, others refused.
    for (int k = 0; k < 8; ++k) {
      const int32_t id = static_cast<int32_t>(rng() % v.size());
      const bool bit = mask[id >> 5] >> (id & 31) & 1;
      EXPECT_EQ(m.AcceptToken(id), bit) << "token " << id << " after " << out;
      if (bit) {
        EXPECT_TRUE(m.Rollback(1));
      }
      const int32_t a = allowed[rng() % allowed.size()];
      EXPECT_TRUE(m.AcceptToken(a)) << "allowed token " << a << " after " << out;
      EXPECT_TRUE(m.Rollback(1));
    }
    int32_t pick = allowed[rng() % allowed.size()];
    if (step >= budget) {
      // Towards the end: EOS, else a closing quote or bracket (not a comma: in arrays of
      // recursive items it would grow the tree), else the shortest token of a
      // random first byte (so a rare separator such as '@' comes soon).
      std::vector<int32_t> closing, shortest(256, -1), firsts;
      for (int32_t id : allowed) {
        const std::string& b = v.bytes(id);
        if (b.empty()) continue;
        if (b.size() == 1 && std::string_view("\"]}").find(b[0]) != std::string::npos) {
          closing.push_back(id);
        }
        int32_t& s = shortest[uint8_t(b[0])];
        if (s < 0) firsts.push_back(uint8_t(b[0]));
        if (s < 0 || v.bytes(s).size() > b.size()) s = id;
      }
      if (m.CanEnd()) {
        pick = v.eos_ids()[0];
      } else if (!closing.empty()) {
        pick = closing[rng() % closing.size()];
      } else if (!firsts.empty()) {
        pick = shortest[firsts[rng() % firsts.size()]];
      }
    }
    EXPECT_TRUE(m.AcceptToken(pick));
    if (step % 5 == 4 && !v.is_eos(pick)) {
      // Rollback restores the state exactly: the same mask, the same token accepted again.
      std::vector<uint32_t> again(v.mask_words());
      EXPECT_TRUE(m.Rollback(1));
      m.FillNextTokenBitmask(again);
      EXPECT_EQ(again, mask) << "after rolling back " << pick;
      EXPECT_TRUE(m.AcceptToken(pick));
    }
    if (v.is_eos(pick)) {
      EXPECT_TRUE(m.IsFinished());
      return out;
    }
    out += v.bytes(pick);
  }
  return std::nullopt;
}

// Runs validate.py over the cases; EXPECTs it to pass.
void Validate(const std::vector<nlohmann::json>& cases) {
  const std::string path = ::testing::TempDir() + "/structured_outputs.jsonl";
  {
    std::ofstream f(path);
    for (const nlohmann::json& c : cases)
      f << c.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  const std::string cmd = "/usr/bin/python3 " + kDataDir + "/validate.py " + path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string report;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) report.append(buf, n);
  const int rc = pclose(p);
  EXPECT_EQ(rc, 0) << report;
  std::printf("%s", report.c_str());
}

// The validator itself refuses wrong outputs (so the walks' checks can fail).
TEST(ValidatorTest, RefusesWrongOutputs) {
  const std::string path = ::testing::TempDir() + "/structured_wrong.jsonl";
  for (
      const char* line :
      {R"({"kind": "json", "schema": {"type": "integer"}, "output": "1.5"})",
       R"({"kind": "json", "schema": {"type": "string", "format": "time"}, "output": "\"25:00:00Z\""})",
       R"({"kind": "json", "schema": {"type": "object", "additionalProperties": false}, "output": "{\"a\": 1}"})",
       R"({"kind": "regex", "pattern": "a+", "output": "ab"})"}) {
    std::ofstream(path) << line << "\n";
    const std::string cmd =
        "/usr/bin/python3 " + kDataDir + "/validate.py " + path + " > /dev/null";
    EXPECT_NE(std::system(cmd.c_str()), 0) << line;
  }
}

TEST(MatcherPropertyTest, RandomWalksThroughSchemasValidate) {
  std::vector<nlohmann::json> cases;
  std::istringstream lines(ReadFile(kDataDir + "/schemas.jsonl"));
  std::string line;
  while (std::getline(lines, line)) {
    const nlohmann::json c = nlohmann::json::parse(line);
    SCOPED_TRACE(c["name"].get<std::string>());
    auto g = MustCompile(Schema(c["schema"].dump()), Qwen3Vocabulary());
    ASSERT_NE(g, nullptr);
    for (uint32_t seed = 0; seed < 4; ++seed) {
      std::optional<std::string> out = RandomWalk(g, seed * 7919 + 1, 12 + seed * 8, 2000);
      ASSERT_TRUE(out.has_value()) << "walk did not end, seed " << seed;
      cases.push_back(
          {{"kind", "json"}, {"name", c["name"]}, {"schema", c["schema"]}, {"output", *out}});
    }
  }
  Validate(cases);
}

TEST(MatcherPropertyTest, RandomWalksThroughRegexesMatch) {
  std::vector<nlohmann::json> cases;
  std::istringstream lines(ReadFile(kDataDir + "/regexes.txt"));
  std::string pattern;
  while (std::getline(lines, pattern)) {
    SCOPED_TRACE(pattern);
    auto g = MustCompile(Regex(pattern), Qwen3Vocabulary());
    ASSERT_NE(g, nullptr);
    for (uint32_t seed = 0; seed < 8; ++seed) {
      std::optional<std::string> out = RandomWalk(g, seed + 100, 4 + seed, 300);
      ASSERT_TRUE(out.has_value());
      cases.push_back({{"kind", "regex"}, {"pattern", pattern}, {"output", *out}});
    }
  }
  Validate(cases);
}

// The whole mask against AcceptToken of every token, at the first steps of a few walks: the
// cached per-state masks and the walks after returns give exactly what reading each token gives.
TEST(MatcherPropertyTest, MaskEqualsAcceptTokenOverTheWholeVocabulary) {
  const std::vector<GrammarSpec> specs = {
      Schema(R"({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type":
          "array", "items": {"type": "integer"}}}, "required": ["a"]})"),
      Schema(R"({"type": "object", "properties": {"k": {"type": "string", "maxLength": 4}},
          "additionalProperties": {"anyOf": [{"$ref": "#"}, {"type": "number"}]}})"),
      Regex("(ab|[0-9]+\\.)+x?"),
      Gbnf(ReadFile(kDataDir + "/json.gbnf")),
  };
  for (const GrammarSpec& spec : specs) {
    SCOPED_TRACE(spec.text);
    auto g = MustCompile(spec, Qwen3Vocabulary());
    const Vocabulary& v = g->vocabulary();
    Matcher m(g);
    std::mt19937 rng(5);
    std::vector<uint32_t> mask(v.mask_words());
    for (int step = 0; step < 24; ++step) {
      m.FillNextTokenBitmask(mask);
      int mismatches = 0;
      for (int32_t id = 0; id < v.size(); ++id) {
        const bool bit = mask[id >> 5] >> (id & 31) & 1;
        const bool ok = m.AcceptToken(id);
        if (ok) m.Rollback(1);
        if (ok != bit && ++mismatches < 5) {
          ADD_FAILURE() << "step " << step << " token " << id << " '" << v.bytes(id) << "' mask "
                        << bit << " accept " << ok;
        }
      }
      const std::vector<int32_t> allowed = AllowedTokens(mask, v.size());
      ASSERT_FALSE(allowed.empty());
      int32_t pick;
      do pick = allowed[rng() % allowed.size()];
      while (v.is_eos(pick) && allowed.size() > v.eos_ids().size());
      if (v.is_eos(pick)) break;
      ASSERT_TRUE(m.AcceptToken(pick));
    }
  }
}

// Text tokens: whole UTF-8 characters of a JSON string's body, counted; everything else (and
// text longer than kMaxTextChars characters) stays in the rest trie.
TEST(VocabularyTest, TextTokensAreCountedAndTheRestKeptInTheirTrie) {
  const std::string long_text(Vocabulary::kMaxTextChars + 1, '-');
  // Text, of 1, 5, 1, 3, 2 and 1 characters:
  std::vector<std::string> tokens = {
      "a", " word", "\x7f", "\xc3\xa9t\xc3\xa9", "\xe4\xb8\xad\xe6\x96\x87", "\xf0\x9f\x98\x80"};
  // Not text: a quote, a backslash, a control, partial characters, a surrogate, an overlong
  // form, past U+10FFFF, too long.
  for (std::string t :
       {"\"", "a\\b", "\n", "\xc3", "\xa9", "\xed\xa0\x80", "\xc0\x80", "\xf4\x90\x80\x80"}) {
    tokens.push_back(t);
  }
  tokens.push_back(long_text);
  const std::vector<int> chars = {1, 5, 1, 3, 2, 1};
  auto v = SmallVocabulary(tokens);
  for (int n = 0; n <= Vocabulary::kMaxTextChars; ++n) {
    const std::vector<int32_t> in = AllowedTokens(v->text_up_to(n), v->size());
    std::vector<int32_t> want;
    for (size_t id = 0; id < chars.size(); ++id) {
      if (chars[id] <= n) want.push_back(static_cast<int32_t>(id));
    }
    EXPECT_EQ(in, want) << n;
  }
  std::vector<int32_t> rest(v->rest_trie().token_ids);
  std::sort(rest.begin(), rest.end());
  std::vector<int32_t> want_rest;
  for (size_t id = chars.size(); id < tokens.size(); ++id) want_rest.push_back(int32_t(id));
  EXPECT_EQ(rest, want_rest);
  EXPECT_EQ(v->trie().token_ids.size(), tokens.size());
}

// The mask of each state through the text tokens' shortcut equals the walk of the whole trie
// (its scalar twin): the same tokens, the same return points (as byte prefixes).
TEST(MatcherPropertyTest, TextShortcutEqualsTheWholeTrieWalk) {
  const std::vector<GrammarSpec> specs = {
      Schema(R"({"type": "object", "properties": {"s": {"type": "string", "maxLength": 40},
          "t": {"type": "string", "minLength": 3}, "u": {"type": "string", "format": "uri"}},
          "additionalProperties": {"type": "string", "pattern": "[^x]{0,5}"}})"),
      Schema(R"({"type": "array", "items": {"anyOf": [{"type": "string", "maxLength": 3},
          {"type": "integer"}]}})"),
      Regex("\"(.{0,6}|[a-z]+)\""),
      Gbnf(ReadFile(kDataDir + "/json.gbnf")),
  };
  auto prefix = [](const Vocabulary& v, const Vocabulary::Trie& trie, int32_t node) {
    const Vocabulary::Node& n = trie.nodes[node];
    for (int32_t i = node; i < n.end; ++i) {
      if (trie.nodes[i].token_end > trie.nodes[i].token_begin) {
        return v.bytes(trie.token_ids[trie.nodes[i].token_begin]).substr(0, n.depth);
      }
    }
    return std::string("?");
  };
  int shortcuts = 0;
  for (const GrammarSpec& spec : specs) {
    SCOPED_TRACE(spec.text);
    auto g = MustCompile(spec, Qwen3Vocabulary());
    const Vocabulary& v = g->vocabulary();
    const Automaton& a = g->automaton();
    const int32_t stride = std::max<int32_t>(1, static_cast<int32_t>(a.states.size()) / 40);
    for (int32_t s = 0; s < static_cast<int32_t>(a.states.size()); s += stride) {
      if (!a.states[s].has_bytes) continue;
      const auto fast = g->MaskOf(s);
      const CompiledGrammar::StateMask full = g->MaskByFullWalk(s);
      std::vector<uint32_t> bits = fast->bits;
      if (bits.empty()) {
        bits.assign(v.mask_words(), 0);
        for (int32_t id : fast->tokens) bits[id >> 5] |= 1u << (id & 31);
      }
      EXPECT_EQ(AllowedTokens(bits, v.size()), AllowedTokens(full.bits, v.size())) << s;
      std::set<std::string> fast_exits, full_exits;
      for (int32_t n : fast->exits) {
        fast_exits.insert(prefix(v, fast->rest_trie ? v.rest_trie() : v.trie(), n));
      }
      for (int32_t n : full.exits) full_exits.insert(prefix(v, v.trie(), n));
      EXPECT_EQ(fast_exits, full_exits) << s;
      shortcuts += fast->rest_trie;
    }
  }
  EXPECT_GT(shortcuts, 20);  // the shortcut was taken
}

// One compiled grammar shared by matchers on several threads (its mask cache filling from all of
// them) gives each walk what it gives alone.
TEST(MatcherTest, ACompiledGrammarIsSharedAcrossThreads) {
  const GrammarSpec spec = Schema(R"({"type": "object", "properties": {"s": {"type": "string",
      "maxLength": 6}, "n": {"type": "array", "items": {"type": "number"}}},
      "required": ["s", "n"]})");
  std::vector<std::string> alone;
  for (uint32_t seed = 0; seed < 4; ++seed) {
    alone.push_back(RandomWalk(MustCompile(spec, Qwen3Vocabulary()), seed, 10, 300).value_or("-"));
  }
  auto shared = MustCompile(spec, Qwen3Vocabulary());
  std::vector<std::string> together(4);
  std::vector<std::thread> threads;
  for (uint32_t seed = 0; seed < 4; ++seed) {
    threads.emplace_back(
        [&, seed] { together[seed] = RandomWalk(shared, seed, 10, 300).value_or("-"); });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(together, alone);
}

// A grammar whose parser sets grow with the input (x^n parses in Catalan-many ways) hits the
// bounds within a few tokens: the matcher then refuses everything, promptly.
TEST(MatcherTest, AnAmbiguousGrammarOverflowsAndRefusesEverything) {
  auto g = MustCompile(Gbnf("root ::= a\na ::= \"x\" a | \"x\" a a | \"\""),
                       SmallVocabulary({"x", "xx", "xxxxxxxx"}));
  Matcher m(g);
  std::vector<uint32_t> mask(1);
  int steps = 0;
  while (!m.overflowed() && steps < 200) {
    m.FillNextTokenBitmask(mask);
    if (m.overflowed()) break;
    ASSERT_TRUE(m.AcceptToken(2));
    ++steps;
  }
  EXPECT_TRUE(m.overflowed()) << steps << " steps";
  m.FillNextTokenBitmask(mask);
  EXPECT_EQ(mask[0], 0u);
  for (int32_t id = 0; id < 4; ++id) EXPECT_FALSE(m.AcceptToken(id));
}

TEST(MatcherTest, RollbackRestoresTheState) {
  auto g = MustCompile(Schema(R"({"type": "array", "items": {"type": "integer"}})"),
                       SmallVocabulary({"[", "1", ",", " ", "]", "2", "[1,"}));
  Matcher m(g);
  const int32_t eos = 7;
  std::vector<uint32_t> mask(1), before(1);
  EXPECT_FALSE(m.AcceptToken(1));
  EXPECT_TRUE(m.AcceptToken(6));  // "[1,"
  m.FillNextTokenBitmask(before);
  {
    // A copy goes its own way (n > 1 choices from one prefix).
    Matcher fork = m;
    EXPECT_TRUE(fork.AcceptToken(1));
    EXPECT_TRUE(fork.AcceptToken(4));
    EXPECT_TRUE(fork.CanEnd());
    EXPECT_FALSE(m.CanEnd());
    m.FillNextTokenBitmask(mask);
    EXPECT_EQ(mask, before);
  }
  EXPECT_TRUE(m.AcceptToken(3));  // " "
  EXPECT_TRUE(m.AcceptToken(5));
  EXPECT_TRUE(m.AcceptToken(4));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_TRUE(m.AcceptToken(eos));
  EXPECT_TRUE(m.IsFinished());
  EXPECT_FALSE(m.Rollback(6));
  EXPECT_TRUE(m.Rollback(4));
  EXPECT_FALSE(m.IsFinished());
  m.FillNextTokenBitmask(mask);
  EXPECT_EQ(mask, before);
  EXPECT_EQ(m.num_tokens(), 1);
  EXPECT_FALSE(m.CanEnd());
  EXPECT_FALSE(m.AcceptToken(eos));
}

TEST(MatcherTest, ChoiceAndJsonObject) {
  auto v = Qwen3Vocabulary();
  GrammarSpec choice{GrammarSpec::Kind::kChoice, "", {"yes", "no", "not sure"}};
  for (uint32_t seed = 0; seed < 10; ++seed) {
    auto out = RandomWalk(MustCompile(choice, v), seed, 100, 50);
    ASSERT_TRUE(out.has_value());
    EXPECT_TRUE(*out == "yes" || *out == "no" || *out == "not sure") << *out;
  }
  auto obj = MustCompile({GrammarSpec::Kind::kJsonObject, "", {}}, v);
  for (uint32_t seed = 0; seed < 5; ++seed) {
    auto out = RandomWalk(obj, seed, 20, 400);
    ASSERT_TRUE(out.has_value());
    auto parsed = nlohmann::json::parse(*out, nullptr, false);
    EXPECT_TRUE(parsed.is_object()) << *out;
  }
  EXPECT_NE(CacheKey(choice), CacheKey({GrammarSpec::Kind::kChoice, "", {"yes", "nonot sure"}}));
}

// The cache compiles each spec once however many threads ask for it at once, keeps at most its
// capacity, and does not keep a spec that fails.
TEST(MatcherTest, GrammarCacheSharesCompilesAcrossThreads) {
  auto tok =
      tokenizer::Tokenizer::LoadFromDir(std::string(MOESERVE_TESTDATA_DIR) + "/qwen3-tokenizer");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  GrammarCache cache(**tok, {*(*tok)->TokenToId("<|im_end|>")},
                     {.capacity = 3, .max_bytes = size_t{512} << 20, .limits = {}});
  const GrammarSpec regex{GrammarSpec::Kind::kRegex, "[0-9]{1,3}", {}};
  std::vector<std::shared_ptr<const CompiledGrammar>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto g = cache.Get(regex);
      ASSERT_TRUE(g.ok());
      got[t] = *g;
      Matcher m(got[t]);
      EXPECT_TRUE(m.AcceptBytes("42"));
      EXPECT_TRUE(m.CanEnd());
    });
  }
  for (std::thread& t : threads) t.join();
  // Threads that raced compiled it more than once at most, and all share the kept one now.
  EXPECT_LE(cache.compiles(), 4);
  auto again = cache.Get(regex);
  ASSERT_TRUE(again.ok());
  const int64_t compiles = cache.compiles();
  EXPECT_EQ(*cache.Get(regex), *again);
  EXPECT_EQ(cache.compiles(), compiles);

  EXPECT_FALSE(cache.Get({GrammarSpec::Kind::kRegex, "(a", {}}).ok());
  EXPECT_EQ(cache.size(), 1u);
  for (const char* r : {"a", "b", "c", "d"})
    ASSERT_TRUE(cache.Get({GrammarSpec::Kind::kRegex, r, {}}).ok());
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_GT((*again)->memory_bytes(), 0u);
}

}  // namespace
}  // namespace moeserve::structured
