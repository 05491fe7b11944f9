// Tokenizer throughput on the real Qwen3 tokenizer (testdata/qwen3-tokenizer), one
// thread, in bytes of text per second:
//
//   BM_Encode/<corpus>            the word cache warm (a server's steady state)
//   BM_EncodeColdCache/<corpus>   the cache emptied before every pass (text first seen)
//   BM_EncodeNoCache/<corpus>     no cache at all: every word through BPE
//   BM_Decode, BM_IncrementalDetokenize   ids back to text (bytes of text produced per second)
//   BM_Load                       reading tokenizer.json + tokenizer_config.json
//
// Corpora: "english" (this repository's docs/), "code" (its core/ sources), "chinese" (the
// golden texts holding CJK), "goldens" (the encode and
// chat golden texts: many scripts, emoji, special tokens) and "mixed" (all of them).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "core/test_paths.h"

namespace moeserve::tokenizer {
namespace {

namespace fs = std::filesystem;

const std::string kQwen3 = std::string(MOESERVE_TESTDATA_DIR) + "/qwen3-tokenizer";

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "tokenizer_benchmark: %s\n", message.c_str());
  std::exit(1);
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Die("cannot read " + path.string());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> FilesIn(const fs::path& dir, const std::vector<std::string>& extensions) {
  std::vector<fs::path> paths;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    for (const std::string& ext : extensions) {
      if (e.path().extension() == ext) paths.push_back(e.path());
    }
  }
  std::sort(paths.begin(), paths.end());
  std::vector<std::string> texts;
  for (const fs::path& p : paths) texts.push_back(ReadFile(p));
  return texts;
}

using Corpus = std::vector<std::string>;  // documents, each encoded with one call

const std::map<std::string, Corpus>& Corpora() {
  static const std::map<std::string, Corpus> corpora = [] {
    std::map<std::string, Corpus> c;
    c["english"] = FilesIn(fs::path(MOESERVE_SOURCE_DIR) / "docs", {".md"});
    c["code"] = FilesIn(fs::path(MOESERVE_SOURCE_DIR) / "core", {".h", ".cc"});
    for (const char* file : {"encode_cases.jsonl", "chat_cases.jsonl"}) {
      std::istringstream lines(ReadFile(kQwen3 + "/" + file));
      std::string line;
      while (std::getline(lines, line)) {
        const nlohmann::json j = nlohmann::json::parse(line);
        std::string text = j.contains("text") ? j["text"].get<std::string>()
                                              : j["rendered"].get<std::string>();
        // "chinese": the goldens holding CJK ideographs (UTF-8 lead bytes E4..E9).
        if (text.find_first_of("\xE4\xE5\xE6\xE7\xE8\xE9") != std::string::npos) {
          c["chinese"].push_back(text);
        }
        c["goldens"].push_back(std::move(text));
      }
    }
    for (const char* name : {"english", "code", "chinese", "goldens"}) {
      for (const std::string& t : c[name]) c["mixed"].push_back(t);
    }
    return c;
  }();
  return corpora;
}

const char* const kCorpusNames[] = {"mixed", "english", "code", "chinese", "goldens"};

size_t Bytes(const Corpus& corpus) {
  size_t n = 0;
  for (const std::string& t : corpus) n += t.size();
  return n;
}

std::unique_ptr<Tokenizer> Load(size_t cache_capacity) {
  Result<std::unique_ptr<Tokenizer>> t =
      Tokenizer::LoadFromDir(kQwen3, {.word_cache_capacity = cache_capacity});
  if (!t.ok()) Die(t.status().ToString());
  return std::move(*t);
}

const Tokenizer& Cached() {
  static const std::unique_ptr<Tokenizer> t = Load(TokenizerOptions().word_cache_capacity);
  return *t;
}

const Tokenizer& Uncached() {
  static const std::unique_ptr<Tokenizer> t = Load(0);
  return *t;
}

size_t EncodeAll(const Tokenizer& t, const Corpus& corpus) {
  size_t tokens = 0;
  for (const std::string& text : corpus) {
    Result<std::vector<int32_t>> ids = t.Encode(text);
    if (!ids.ok()) Die(ids.status().ToString());
    tokens += ids->size();
    benchmark::DoNotOptimize(ids->data());
  }
  return tokens;
}

void Report(benchmark::State& state, size_t bytes, size_t tokens) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(state.iterations() * tokens),
                                                  benchmark::Counter::kIsRate);
  state.counters["bytes/token"] = static_cast<double>(bytes) / static_cast<double>(tokens);
}

void BM_Encode(benchmark::State& state) {
  const Corpus& corpus = Corpora().at(kCorpusNames[state.range(0)]);
  state.SetLabel(kCorpusNames[state.range(0)]);
  EncodeAll(Cached(), corpus);  // warm the cache
  size_t tokens = 0;
  for (auto _ : state) tokens = EncodeAll(Cached(), corpus);
  Report(state, Bytes(corpus), tokens);
}

void BM_EncodeColdCache(benchmark::State& state) {
  const Corpus& corpus = Corpora().at(kCorpusNames[state.range(0)]);
  state.SetLabel(kCorpusNames[state.range(0)]);
  size_t tokens = 0;
  for (auto _ : state) {
    Cached().ClearWordCache();
    tokens = EncodeAll(Cached(), corpus);
  }
  Report(state, Bytes(corpus), tokens);
}

void BM_EncodeNoCache(benchmark::State& state) {
  const Corpus& corpus = Corpora().at(kCorpusNames[state.range(0)]);
  state.SetLabel(kCorpusNames[state.range(0)]);
  size_t tokens = 0;
  for (auto _ : state) tokens = EncodeAll(Uncached(), corpus);
  Report(state, Bytes(corpus), tokens);
}

std::vector<std::vector<int32_t>> MixedIds() {
  std::vector<std::vector<int32_t>> all;
  for (const std::string& text : Corpora().at("mixed")) all.push_back(*Cached().Encode(text));
  return all;
}

void BM_Decode(benchmark::State& state) {
  const std::vector<std::vector<int32_t>> all = MixedIds();
  size_t bytes = 0;
  size_t tokens = 0;
  for (auto _ : state) {
    bytes = tokens = 0;
    for (const std::vector<int32_t>& ids : all) {
      const std::string text = Cached().Decode(ids);
      bytes += text.size();
      tokens += ids.size();
      benchmark::DoNotOptimize(text.data());
    }
  }
  state.SetLabel("mixed");
  Report(state, bytes, tokens);
}

void BM_IncrementalDetokenize(benchmark::State& state) {
  const std::vector<std::vector<int32_t>> all = MixedIds();
  DetokenizerOptions options;
  // Two stop strings, as a server request might set.
  options.stop = std::make_shared<const std::vector<std::string>>(
      std::vector<std::string>{"<|im_end|>", "\n\n\n\n"});
  size_t bytes = 0;
  size_t tokens = 0;
  for (auto _ : state) {
    bytes = tokens = 0;
    for (const std::vector<int32_t>& ids : all) {
      IncrementalDetokenizer detok(Cached(), options);
      for (const int32_t id : ids) bytes += detok.Add(id).size();
      bytes += detok.Flush().size();
      tokens += ids.size();
    }
  }
  state.SetLabel("mixed, 2 stop strings");
  Report(state, bytes, tokens);
}

void BM_Load(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(Load(0).get());
  state.SetLabel("Qwen3, 151k tokens");
}

void CorpusArgs(benchmark::internal::Benchmark* b) {
  for (int i = 0; i < static_cast<int>(std::size(kCorpusNames)); ++i) b->Arg(i);
  b->ArgName("corpus");
}

BENCHMARK(BM_Encode)->Apply(CorpusArgs)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeColdCache)->Apply(CorpusArgs)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeNoCache)->Apply(CorpusArgs)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_IncrementalDetokenize)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Load)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace moeserve::tokenizer

BENCHMARK_MAIN();
