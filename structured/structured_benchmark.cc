// Structured output's speed on the real Qwen3 vocabulary (151,669 ids), one thread:
//   compile   spec text -> Grammar -> automaton (what a request waits for before its first token)
//   mask      FillNextTokenBitmask per decoding step, over random walks through each grammar:
//             cold (a fresh compiled grammar: its per-state masks are computed on first use) and
//             warm (the same compiled grammar again: what every later request with that spec sees)
// Prints per schema and overall mean / p50 / p99. A program, not a test.
//
//   structured_benchmark [SCHEMAS.jsonl] [walks per schema]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "structured/automaton.h"
#include "structured/structured.h"
#include "tokenizer/tokenizer.h"
#include "core/test_paths.h"

namespace {

using namespace moeserve;
using namespace moeserve::structured;
using Clock = std::chrono::steady_clock;

// A grammar's text on one line, for the table.
std::string OneLine(std::string s) {
  for (char& c : s) c = c == '\n' ? ';' : c;
  return s.substr(0, 48);
}

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct Stats {
  std::vector<double> v;
  void Add(double x) { v.push_back(x); }
  double Mean() const {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / v.size();
  }
  double Pct(double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
  }
  void Append(const Stats& o) { v.insert(v.end(), o.v.begin(), o.v.end()); }
};

// One random walk of at most `cap` steps, timing each mask.
void Walk(const std::shared_ptr<const CompiledGrammar>& g, uint32_t seed, int budget, int cap,
          Stats& mask_us) {
  const Vocabulary& v = g->vocabulary();
  Matcher m(g);
  std::mt19937 rng(seed);
  std::vector<uint32_t> mask(v.mask_words());
  std::vector<int32_t> allowed;
  for (int step = 0; step < cap; ++step) {
    const auto t0 = Clock::now();
    m.FillNextTokenBitmask(mask);
    mask_us.Add(Micros(Clock::now() - t0));
    allowed.clear();
    for (size_t w = 0; w < mask.size(); ++w) {
      for (uint32_t x = mask[w]; x; x &= x - 1) allowed.push_back(w * 32 + __builtin_ctz(x));
    }
    if (allowed.empty()) return;
    int32_t pick = allowed[rng() % allowed.size()];
    if (step >= budget) {
      if (m.CanEnd()) return;
      std::vector<int32_t> closing;
      for (int32_t id : allowed) {
        const std::string& b = v.bytes(id);
        if (b.size() == 1 && std::string_view("\"]},").find(b[0]) != std::string::npos) {
          closing.push_back(id);
        }
      }
      if (!closing.empty()) pick = closing[rng() % closing.size()];
    }
    if (v.is_eos(pick) || !m.AcceptToken(pick)) return;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string schemas_path =
      argc > 1 ? argv[1] : std::string(MOESERVE_SOURCE_DIR) + "/structured/testdata/schemas.jsonl";
  const int walks = argc > 2 ? std::atoi(argv[2]) : 4;
  auto tok =
      tokenizer::Tokenizer::LoadFromDir(std::string(MOESERVE_TESTDATA_DIR) + "/qwen3-tokenizer");
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  auto vocab = Vocabulary::FromTokenizer(
      **tok, {*(*tok)->TokenToId("<|im_end|>"), *(*tok)->TokenToId("<|endoftext|>")});
  if (!vocab.ok()) return 1;
  const Vocabulary& v = **vocab;
  std::printf(
      "vocabulary: %d ids, trie of %zu nodes; %zu text tokens, the rest's trie %zu nodes\n\n",
      v.size(), v.trie().nodes.size(), v.trie().token_ids.size() - v.rest_trie().token_ids.size(),
      v.rest_trie().nodes.size());
  std::printf("%-20s %8s %7s %8s %9s %9s %9s %9s %9s\n", "schema", "compile", "states", "steps",
              "cold mean", "warm mean", "warm p50", "warm p99", "cold max");
  std::ifstream in(schemas_path);
  std::string line;
  Stats compile_all, grammar_all, cold_all, warm_all;
  int refused = 0;
  while (std::getline(in, line)) {
    const nlohmann::json c = nlohmann::json::parse(line);
    const GrammarSpec spec{GrammarSpec::Kind::kJsonSchema, c["schema"].dump(), {}};
    // Compile: mean of several runs; its first part, spec to grammar, timed on its own too.
    const int reps = 20;
    Result<std::shared_ptr<const CompiledGrammar>> g = Status();
    auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) g = Compile(spec, *vocab);
    const double compile_us = Micros(Clock::now() - t0) / reps;
    t0 = Clock::now();
    for (int r = 0; r < reps; ++r) (void)SpecToGrammar(spec);
    grammar_all.Add(Micros(Clock::now() - t0) / reps);
    const std::string name = c["name"].get<std::string>();
    if (!g.ok()) {
      std::printf("%-20s refused: %s\n", name.c_str(), g.status().message().c_str());
      ++refused;
      continue;
    }
    compile_all.Add(compile_us);
    Stats cold, warm;
    for (int w = 0; w < walks; ++w) Walk(*g, 1000 + w, 10 + 10 * w, 300, cold);
    for (int w = 0; w < walks; ++w) Walk(*g, 1000 + w, 10 + 10 * w, 300, warm);
    std::printf("%-20s %6.0fus %7zu %8zu %7.1fus %7.1fus %7.1fus %7.1fus %7.0fus\n", name.c_str(),
                compile_us, (*g)->automaton().states.size(), warm.v.size(), cold.Mean(),
                warm.Mean(), warm.Pct(0.5), warm.Pct(0.99), cold.Pct(1.0));
    cold_all.Append(cold);
    warm_all.Append(warm);
  }
  std::printf(
      "\nall: %zu schemas (%d refused), compile mean %.0f us (spec to grammar %.0f us), p50 %.0f "
      "us, max %.0f us\n",
      compile_all.v.size(), refused, compile_all.Mean(), grammar_all.Mean(), compile_all.Pct(0.5),
      compile_all.Pct(1.0));
  std::printf("mask per token, cold (first request): mean %.1f us, p50 %.1f us, p99 %.1f us\n",
              cold_all.Mean(), cold_all.Pct(0.5), cold_all.Pct(0.99));
  std::printf(
      "mask per token, warm (later requests): mean %.1f us, p50 %.1f us, p99 %.1f us "
      "(%zu steps)\n",
      warm_all.Mean(), warm_all.Pct(0.5), warm_all.Pct(0.99), warm_all.v.size());
  // What a hostile spec costs before it is refused (or compiled): the worst cases of the limits.
  std::printf("\nhostile specs (compile wall time, result):\n");
  std::string nested_json = "{}";
  for (int i = 0; i < 60; ++i) nested_json = R"({"type": "array", "items": )" + nested_json + "}";
  const std::vector<std::pair<const char*, GrammarSpec>> hostile = {
      {"DFA blow-up (a|b)*a(a|b){13}", {GrammarSpec::Kind::kRegex, "(a|b)*a(a|b){13}", {}}},
      {"DFA blow-up (a|b)*a(a|b){20}", {GrammarSpec::Kind::kRegex, "(a|b)*a(a|b){20}", {}}},
      {"repeat nesting ((a{50}){50}){50}", {GrammarSpec::Kind::kRegex, "((a{50}){50}){50}", {}}},
      {"alternatives a{1}|a{2}|...|a{300}",
       {GrammarSpec::Kind::kRegex,
        [] {
          std::string r;
          for (int i = 1; i <= 300; ++i)
            r += (i > 1 ? "|" : "") + std::string("a{") + std::to_string(i) + "}";
          return r;
        }(),
        {}}},
      {".{0,4000}", {GrammarSpec::Kind::kRegex, ".{0,4000}", {}}},
      {"(a?){2000}a{2000}", {GrammarSpec::Kind::kRegex, "(a?){2000}a{2000}", {}}},
      {"(.*a){30}", {GrammarSpec::Kind::kRegex, "(.*a){30}", {}}},
      {"(.{0,60}){60}", {GrammarSpec::Kind::kRegex, "(.{0,60}){60}", {}}},
      {"string maxLength 4000",
       {GrammarSpec::Kind::kJsonSchema, R"({"type": "string", "maxLength": 4000})", {}}},
      {"array 60 deep", {GrammarSpec::Kind::kJsonSchema, nested_json, {}}},
      {"enum of 4096",
       {GrammarSpec::Kind::kJsonSchema,
        [] {
          std::string e = R"({"enum": [)";
          for (int i = 0; i < 4096; ++i)
            e += (i ? "," : "") + std::string("\"value number ") + std::to_string(i) + "\"";
          return e + "]}";
        }(),
        {}}},
  };
  for (const auto& [name, spec] : hostile) {
    const auto t0 = Clock::now();
    auto g = Compile(spec, *vocab);
    const double ms = Micros(Clock::now() - t0) / 1000;
    std::printf("  %-36s %8.1f ms  %s\n", name, ms,
                g.ok() ? fmt::format("{} states", (*g)->automaton().states.size()).c_str()
                       : g.status().message().c_str());
  }
  // Ambiguous grammars: the parser's sets grow with the input (bounded by kMaxThreadsPerSet).
  std::printf("\nambiguous grammars (mask time over a walk of 40 tokens):\n");
  for (const char* gbnf : {"root ::= a\na ::= \"x\" a | \"x\" a a | \"\"",
                           "root ::= (b | b b)*\nb ::= [a-z]+ | [a-z]* [a-z]"}) {
    auto g = Compile({GrammarSpec::Kind::kGrammar, gbnf, {}}, *vocab);
    if (!g.ok()) {
      std::printf("  refused: %s\n", g.status().message().c_str());
      continue;
    }
    Stats s;
    Walk(*g, 1, 40, 40, s);
    std::printf("  %-48s mean %9.1f us, max %9.1f us over %zu steps\n", OneLine(gbnf).c_str(),
                s.Mean(), s.Pct(1.0), s.v.size());
  }
  return 0;
}
