// The engine over real models: the hybrid golden model (testdata/tiny-qwen3next) and an
// attention-only Qwen3-MoE made by `moeserve make-model`. Batch invariance (bit for bit), paged
// results against the single-sequence forward, chunked prefill, preemption and recompute, prefix
// caching, abort, and zero heap allocations per steady decode step.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include <fmt/format.h>

#include "core/check.h"
#include "core/heap_counter.h"
#include "engine/engine_test_util.h"
#include "core/test_paths.h"

namespace moeserve::engine {
namespace {

namespace fs = std::filesystem;

using namespace test_util;

// Eight prompts of different lengths: short ones decode while long ones still prefill.
std::vector<std::vector<int32_t>> EightPrompts(int64_t vocab) {
  const int64_t lengths[] = {150, 7, 64, 1, 93, 130, 16, 40};
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(RandomPrompt(lengths[i], 100 + i, vocab));
  return prompts;
}

TEST(EngineTest, SingleRequestMatchesTheSingleSequenceForward) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  const int64_t V = lm->config().vocab_size;
  const std::vector<int32_t> prompt = RandomPrompt(150, 7, V);
  const EngineConfig config{.max_num_seqs = 4, .max_num_batched_tokens = 256, .max_model_len = 256};
  const Trace engine = RunAlone(*lm, config, prompt, 12);

  // The model issue's path: one Forward over the prompt, then one per token.
  model::ModelCache cache(lm->config(), model::CacheSizes{16, 16, 1});
  std::vector<int32_t> table(16);
  for (int i = 0; i < 16; ++i) table[i] = 15 - i;
  std::vector<float> logits;
  lm->Forward({prompt.data(), 150, 0, table.data(), 0}, cache, false, nullptr, &logits);
  for (size_t s = 0; s < engine.tokens.size(); ++s) {
    EXPECT_LE(MaxRelError(engine.logits[s], logits), 1e-6) << "output " << s;
    const int32_t next = engine.tokens[s];
    EXPECT_EQ(next, std::max_element(logits.begin(), logits.end()) - logits.begin());
    lm->Forward({&next, 1, 150 + static_cast<int64_t>(s), table.data(), 0}, cache, false, nullptr,
                &logits);
  }
}

TEST(EngineTest, BatchedLogitsAreBitIdenticalToAlone) {
  // As stored, and w8a8 / w4a8 (whose matmuls quantize each token's activations on their own).
  for (std::optional<DType> weights :
       {std::optional<DType>(), std::optional(DType::kQ8A8), std::optional(DType::kQ4A8)}) {
    SCOPED_TRACE(weights ? std::string(DTypeName(*weights)) : "as stored");
    auto lm = LoadModel(kHybridDir, weights);
    ASSERT_TRUE(lm);
    const auto prompts = EightPrompts(lm->config().vocab_size);
    const EngineConfig config{
        .max_num_seqs = 8, .max_num_batched_tokens = 512, .max_model_len = 256};
    std::vector<Trace> alone;
    for (const auto& p : prompts) alone.push_back(RunAlone(*lm, config, p, 10));

    // All at once, and arriving one every 3 steps (new prefills join running decodes).
    for (int64_t stagger : {0, 3}) {
      auto engine = Engine::Create(*lm, config);
      ASSERT_TRUE(engine.ok());
      const std::vector<Trace> batched = RunAll(**engine, prompts, 10, stagger);
      for (size_t i = 0; i < prompts.size(); ++i) {
        ExpectBitIdentical(batched[i], alone[i], fmt::format("stagger {} request {}", stagger, i));
      }
    }
  }
}

TEST(EngineTest, ChunkedPrefillUnderATightBudgetIsBitIdentical) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  const auto prompts = EightPrompts(lm->config().vocab_size);
  const EngineConfig roomy{.max_num_seqs = 8, .max_num_batched_tokens = 512, .max_model_len = 256};
  // 64 tokens a step: prompts are chunked at multiples of 64 and share steps with decodes.
  const EngineConfig tight{.max_num_seqs = 8, .max_num_batched_tokens = 64, .max_model_len = 256};
  auto engine = Engine::Create(*lm, tight);
  ASSERT_TRUE(engine.ok());
  const std::vector<Trace> batched = RunAll(**engine, prompts, 8);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ExpectBitIdentical(batched[i], RunAlone(*lm, roomy, prompts[i], 8), fmt::format("request {}", i));
  }
}

// A 600-token prompt in one step routes 1200 (token, expert) pairs, more than the MoE scratch
// holds at once, so its experts run in several groups; 64-token chunks run them in one.
TEST(EngineTest, LongPrefillInOneStepEqualsSmallChunks) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  const std::vector<int32_t> prompt = RandomPrompt(600, 9, lm->config().vocab_size);
  const Trace whole = RunAlone(
      *lm, {.max_num_seqs = 1, .max_num_batched_tokens = 1024, .max_model_len = 640}, prompt, 3);
  const Trace chunked = RunAlone(
      *lm, {.max_num_seqs = 1, .max_num_batched_tokens = 64, .max_model_len = 640}, prompt, 3);
  ExpectBitIdentical(whole, chunked, "600-token prompt");
}

TEST(EngineTest, PreemptionRecomputesAndKeepsTheOutput) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  const int64_t V = lm->config().vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(RandomPrompt(40 + 9 * i, 300 + i, V));
  const EngineConfig roomy{.max_num_seqs = 8, .max_num_batched_tokens = 512, .max_model_len = 128};
  // 8 blocks of 16 positions hold one full-length request but not six 60-token ones.
  EngineConfig small = roomy;
  small.kv_cache_memory_gib = 8.5 * BlockGiB(*lm, roomy);
  auto engine = Engine::Create(*lm, small);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  ASSERT_EQ((*engine)->layout().num_blocks, 8);

  int64_t preemptions = 0;
  const std::vector<Trace> traces = RunAll(**engine, prompts, 20, 0, &preemptions);
  EXPECT_GT(preemptions, 0) << "the test did not exercise preemption";
  // A resumed request recomputes its outputs as a prefill (chunked delta rule instead of the
  // recurrent steps), so its later logits match to rounding, not bit for bit.
  double worst = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Trace alone = RunAlone(*lm, roomy, prompts[i], 20);
    EXPECT_EQ(traces[i].tokens, alone.tokens) << "request " << i;
    for (size_t s = 0; s < alone.logits.size() && s < traces[i].logits.size(); ++s) {
      worst = std::max(worst, MaxRelError(traces[i].logits[s], alone.logits[s]));
    }
  }
  EXPECT_LE(worst, 1e-6);
  std::printf("preemptions: %lld, worst logits error after recompute: %.3g\n",
              static_cast<long long>(preemptions), worst);
}

TEST(EngineTest, AbortFreesEverything) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  const auto prompts = EightPrompts(lm->config().vocab_size);
  auto engine = Engine::Create(*lm, {.max_num_seqs = 4, .max_num_batched_tokens = 128,
                                     .max_model_len = 256});
  ASSERT_TRUE(engine.ok());
  std::vector<int64_t> ids;
  for (const auto& p : prompts) ids.push_back(*(*engine)->AddRequest(p, Greedy(50)));
  for (int s = 0; s < 4; ++s) (*engine)->Step();
  EXPECT_GT((*engine)->cache_manager().num_used_blocks(), 0);
  for (int64_t id : ids) EXPECT_TRUE((*engine)->Abort(id));
  EXPECT_FALSE((*engine)->Abort(ids[0]));
  EXPECT_FALSE((*engine)->HasUnfinished());
  EXPECT_EQ((*engine)->cache_manager().num_used_blocks(), 0);
  EXPECT_EQ((*engine)->cache_manager().num_used_state_slots(), 0);
  (*engine)->Step();  // the runner drops the aborted rows
  EXPECT_EQ((*engine)->runner().num_rows_in_use(), 0);
  for (int64_t id : ids) {
    EXPECT_EQ((*engine)->Find(id)->finish_reason, FinishReason::kAbort);
    (*engine)->Release(id);
  }
}

TEST(EngineTest, SteadyDecodeStepsAllocateNothing) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  const auto prompts = EightPrompts(lm->config().vocab_size);
  auto engine = Engine::Create(*lm, {.max_num_seqs = 8, .max_num_batched_tokens = 512,
                                     .max_model_len = 256});
  ASSERT_TRUE(engine.ok());
  const int64_t at_start = HeapAllocations();
  for (const auto& p : prompts) ASSERT_TRUE((*engine)->AddRequest(p, Greedy(60)).ok());
  ASSERT_GT(HeapAllocations(), at_start) << "the counting operator new is not in use";
  // Prefill, then a few decode steps to warm every path (thread-local kernel scratch).
  do {
    (*engine)->Step();
  } while ((*engine)->last_schedule().total_num_scheduled_tokens != 8);
  for (int s = 0; s < 3; ++s) (*engine)->Step();
  // 40 decode steps cross block boundaries (new block ids) for every request.
  const int64_t before = HeapAllocations();
  TraceHeapAllocations(true);
  for (int s = 0; s < 40; ++s) (*engine)->Step();
  TraceHeapAllocations(false);
  const int64_t allocations = HeapAllocations() - before;
  EXPECT_EQ((*engine)->last_schedule().total_num_scheduled_tokens, 8);
  EXPECT_EQ(allocations, 0) << "heap allocations in 40 steady decode steps";
}

TEST(EngineTest, PrefixCachingComputesOnlyTheSuffixWithIdenticalLogits) {
  auto lm = LoadModel(Qwen3MoeDir());
  ASSERT_TRUE(lm);
  const int64_t V = lm->config().vocab_size;
  const std::vector<int32_t> first = RandomPrompt(70, 21, V);
  std::vector<int32_t> second(first.begin(), first.begin() + 53);  // 3 full blocks + 5
  for (int32_t t : RandomPrompt(9, 22, V)) second.push_back(t);

  const EngineConfig cached{.max_num_seqs = 4, .max_num_batched_tokens = 256, .max_model_len = 128};
  EngineConfig uncached = cached;
  uncached.enable_prefix_caching = false;
  auto engine = Engine::Create(*lm, cached);
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->layout().prefix_caching);
  RunAll(**engine, {first}, 4);
  const int64_t id = *(*engine)->AddRequest(second, Greedy(4));
  (*engine)->Step();
  const SchedulerOutput& out = (*engine)->last_schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].first_pos, 48);  // three cached blocks
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 62 - 48);
  EXPECT_EQ((*engine)->Find(id)->num_cached_tokens, 48);
  const float* logits = (*engine)->runner().logits_of(0);
  ASSERT_NE(logits, nullptr);
  const std::vector<float> got(logits, logits + V);
  while ((*engine)->HasUnfinished()) (*engine)->Step();
  const std::vector<int32_t> tokens = (*engine)->Find(id)->output_token_ids;
  (*engine)->Release(id);

  const Trace want = RunAlone(*lm, uncached, second, 4);
  EXPECT_EQ(0, std::memcmp(got.data(), want.logits[0].data(), V * sizeof(float)));
  EXPECT_EQ(tokens, want.tokens);
}

TEST(EngineTest, AttentionOnlyModelIsBatchInvariantToo) {
  auto lm = LoadModel(Qwen3MoeDir());
  ASSERT_TRUE(lm);
  const auto prompts = EightPrompts(lm->config().vocab_size);
  const EngineConfig config{.max_num_seqs = 8, .max_num_batched_tokens = 100, .max_model_len = 256,
                            .enable_prefix_caching = false};
  auto engine = Engine::Create(*lm, config);
  ASSERT_TRUE(engine.ok());
  const std::vector<Trace> batched = RunAll(**engine, prompts, 6);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ExpectBitIdentical(batched[i], RunAlone(*lm, config, prompts[i], 6), fmt::format("request {}", i));
  }
}

// Per-request generators: a seeded sampled request gives the same tokens alone and among seven
// others (greedy and sampled, different lengths and phases).
TEST(EngineTest, SeededSamplingIsBatchInvariant) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  const auto prompts = EightPrompts(lm->config().vocab_size);
  const EngineConfig config{.max_num_seqs = 8, .max_num_batched_tokens = 128, .max_model_len = 256};
  auto params_of = [](size_t i) {
    SamplingParams p;
    p.temperature = i % 3 == 0 ? 0.0 : 0.8;
    p.top_p = 0.9;
    p.top_k = i % 2 == 0 ? 20 : 0;
    p.seed = 1000 + static_cast<int64_t>(i);
    p.repetition_penalty = i == 5 ? 1.3 : 1.0;
    p.max_tokens = 12;
    p.ignore_eos = true;
    return p;
  };
  auto run = [&](const std::vector<size_t>& which) {
    auto engine = Engine::Create(*lm, config);
    EXPECT_TRUE(engine.ok());
    std::map<int64_t, size_t> index_of;
    for (size_t i : which) index_of[*(*engine)->AddRequest(prompts[i], params_of(i))] = i;
    while ((*engine)->HasUnfinished()) (*engine)->Step();
    std::map<size_t, std::vector<int32_t>> out;
    for (const auto& [id, i] : index_of) out[i] = (*engine)->Find(id)->output_token_ids;
    return out;
  };
  const auto together = run({0, 1, 2, 3, 4, 5, 6, 7});
  std::set<std::vector<int32_t>> distinct;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(together.at(i), run({i}).at(i)) << "request " << i;
    distinct.insert(together.at(i));
  }
  EXPECT_EQ(distinct.size(), prompts.size());
}

// Logprobs are log_softmax of the logits the token was sampled from; prompt logprobs those of
// the single-sequence forward at every prompt position.
TEST(EngineTest, LogprobsAreLogSoftmaxOfTheLogits) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  const int64_t V = lm->config().vocab_size;
  const std::vector<int32_t> prompt = RandomPrompt(70, 31, V);
  auto engine = Engine::Create(*lm, {.max_num_seqs = 2, .max_num_batched_tokens = 64,
                                     .max_model_len = 128});
  ASSERT_TRUE(engine.ok());
  SamplingParams p = Greedy(5);
  p.logprobs = 3;
  p.prompt_logprobs = 2;
  const int64_t id = *(*engine)->AddRequest(prompt, p);
  std::vector<std::vector<float>> logits;
  while ((*engine)->HasUnfinished()) {
    (*engine)->Step();
    if (const float* row = (*engine)->runner().logits_of(0)) logits.emplace_back(row, row + V);
  }
  const Request& r = *(*engine)->Find(id);
  auto log_softmax = [&](const float* x, int32_t token) {
    double m = *std::max_element(x, x + V), sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(x[i]) - m);
    return static_cast<double>(x[token]) - m - std::log(sum);
  };
  ASSERT_EQ(r.output_logprobs.size(), 5u);
  for (size_t s = 0; s < 5; ++s) {
    const SampledToken& t = r.output_logprobs[s];
    EXPECT_EQ(t.token, r.output_token_ids[s]);
    EXPECT_EQ(t.sampled.rank, 1);  // greedy
    EXPECT_NEAR(t.sampled.logprob, log_softmax(logits[s].data(), t.token), 1e-5);
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_EQ(t.top[0].token, t.token);
    EXPECT_GE(t.top[0].logprob, t.top[1].logprob);
    EXPECT_GE(t.top[1].logprob, t.top[2].logprob);
  }
  // Prompt positions: 69 entries (none for the first token), chunked over two steps.
  model::ModelCache cache(lm->config(), model::CacheSizes{8, 16, 1});
  std::vector<int32_t> table = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<float> all;
  lm->Forward({prompt.data(), 70, 0, table.data(), 0}, cache, true, nullptr, &all);
  ASSERT_EQ(r.prompt_logprobs.size(), 69u);
  for (size_t j = 0; j < 69; ++j) {
    const SampledToken& t = r.prompt_logprobs[j];
    EXPECT_EQ(t.sampled.token, prompt[j + 1]);
    EXPECT_NEAR(t.sampled.logprob, log_softmax(&all[j * V], prompt[j + 1]), 1e-4) << j;
    EXPECT_EQ(t.top.size(), 2u);
  }
}

TEST(EngineTest, AStopStringEndsTheRequestAsStop) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  auto engine = Engine::Create(*lm, {.max_num_seqs = 2, .max_model_len = 64});
  ASSERT_TRUE(engine.ok());
  const int64_t id = *(*engine)->AddRequest(RandomPrompt(10, 3, 500), Greedy(20));
  (*engine)->Step();
  EXPECT_TRUE((*engine)->Abort(id, FinishReason::kStop));
  EXPECT_EQ((*engine)->Find(id)->finish_reason, FinishReason::kStop);
  EXPECT_EQ((*engine)->cache_manager().num_used_blocks(), 0);
}

TEST(EngineTest, RejectsBadConfigsAndRequests) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  auto message = [&](const EngineConfig& c) {
    Result<std::unique_ptr<Engine>> e = Engine::Create(*lm, c);
    return e.ok() ? std::string("ok") : e.status().message();
  };
  EXPECT_NE(message({.max_num_seqs = 0}).find("--max-num-seqs"), std::string::npos);
  EXPECT_NE(message({.max_num_batched_tokens = 32}).find("--max-num-batched-tokens"),
            std::string::npos);
  EXPECT_NE(message({.max_model_len = 1 << 20}).find("--max-model-len"), std::string::npos);
  EXPECT_NE(message({.max_model_len = 4096, .kv_cache_memory_gib = 1e-4}).find("--kv-cache-memory"),
            std::string::npos);

  auto engine = Engine::Create(*lm, {.max_num_seqs = 2, .max_model_len = 64});
  ASSERT_TRUE(engine.ok());
  Result<int64_t> too_long = (*engine)->AddRequest(RandomPrompt(65, 1, 500), Greedy(4));
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("65"), std::string::npos);
  EXPECT_NE(too_long.status().message().find("64"), std::string::npos);
  EXPECT_FALSE((*engine)->AddRequest({}, Greedy(4)).ok());
  EXPECT_FALSE((*engine)->AddRequest({1, 2, 512}, Greedy(4)).ok());
  EXPECT_FALSE((*engine)->AddRequest({1, 2}, Greedy(0)).ok());
  SamplingParams hot = Greedy(4);
  hot.temperature = 2.5;
  Result<int64_t> bad = (*engine)->AddRequest({1, 2}, hot);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("temperature"), std::string::npos);
  SamplingParams many = Greedy(4);
  many.temperature = 1.0;
  many.n = 2;
  EXPECT_FALSE((*engine)->AddRequest({1, 2}, many).ok());
  EXPECT_EQ((*engine)->cache_manager().num_used_blocks(), 0);
}

TEST(EngineTest, MaxModelLenCapsGeneration) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  auto engine = Engine::Create(*lm, {.max_num_seqs = 2, .max_model_len = 64});
  ASSERT_TRUE(engine.ok());
  const int64_t id = *(*engine)->AddRequest(RandomPrompt(60, 3, 500), Greedy(100));
  while ((*engine)->HasUnfinished()) (*engine)->Step();
  EXPECT_EQ((*engine)->Find(id)->num_output_tokens(), 4);
  EXPECT_EQ((*engine)->Find(id)->finish_reason, FinishReason::kLength);
}

// ---- speculative decoding --------------------------------------------------------------------

// Under AddressSanitizer (kSanitized) the speculative matrix below runs one K and auto: that pass
// looks for memory errors on every path, which one K already takes; the Release pass runs all of it.

// Prompts a prompt-lookup drafter finds matches in: a random phrase repeated, then a tail.
std::vector<std::vector<int32_t>> RepetitivePrompts(int64_t vocab) {
  std::vector<std::vector<int32_t>> prompts;
  const int64_t lengths[] = {150, 9, 70, 3, 100, 33, 16, 64};
  for (int i = 0; i < 8; ++i) {
    const std::vector<int32_t> phrase = RandomPrompt(3 + i % 4, 500 + i, vocab);
    std::vector<int32_t> p;
    while (static_cast<int64_t>(p.size()) < lengths[i]) p.push_back(phrase[p.size() % phrase.size()]);
    prompts.push_back(p);
  }
  return prompts;
}

struct SpecCase {
  const char* name;
  std::string model;
  std::string spec;
};

// Greedy output with drafts equals greedy output without, token for token, and every emitted
// token's logits are bit-identical to decoding without speculation (docs/design.md principle 2):
// for K = 1..4 and auto, a request alone, eight at once, eight arriving one every 3 steps (also with
// drafting paused above 3, so fewer draft slot sets than requests), and a 64-token budget that
// chunks prompts and trims drafts. Returns the drafts accepted and verified.
std::pair<int64_t, int64_t> ExpectSpecEqualsPlain(const SpecCase& c) {
  auto lm = LoadModel(c.model);
  EXPECT_TRUE(lm);
  if (!lm) return {0, 0};
  const auto prompts = RepetitivePrompts(lm->config().vocab_size);
  const EngineConfig plain{.max_num_seqs = 8, .max_num_batched_tokens = 512, .max_model_len = 256};
  const int64_t max_tokens = 24;
  std::vector<Trace> alone;
  for (const auto& p : prompts) alone.push_back(RunAlone(*lm, plain, p, max_tokens));
  int64_t accepted = 0, drafted = 0;
  // "auto": drafts sized by measured cost, so any mix of 0 .. 4 per request and step.
  const std::vector<std::string> ks =
      kSanitized ? std::vector<std::string>{"2", "auto"}
                 : std::vector<std::string>{"1", "2", "3", "4", "auto"};
  for (const std::string& k : ks) {
    Result<SpecConfig> spec = ParseSpecFlag(fmt::format("{}:{}", c.spec, k));
    CHECK(spec.ok());
    EngineConfig roomy = plain;
    roomy.spec = *spec;
    roomy.spec.disable_batch_size = 0;  // draft in batches of eight too
    EngineConfig tight = roomy;
    tight.max_num_batched_tokens = 64;
    // Drafting paused above 3 requests: 3 sets of draft state slots for 8 requests, so some
    // draft-eligible requests hold none and draft nothing until a set frees.
    EngineConfig few_sets = roomy;
    few_sets.spec.disable_batch_size = 3;
    for (size_t i = 0; i < prompts.size(); i += 3) {
      ExpectBitIdentical(RunAlone(*lm, roomy, prompts[i], max_tokens), alone[i],
                         fmt::format("{} K={} alone request {}", c.name, k, i));
    }
    for (const auto& [config, stagger] :
         {std::pair{roomy, int64_t{0}}, std::pair{roomy, int64_t{3}}, std::pair{tight, int64_t{0}},
          std::pair{few_sets, int64_t{3}}}) {
      auto engine = Engine::Create(*lm, config);
      CHECK(engine.ok()) << engine.status().ToString();
      const std::vector<Trace> batched = RunAll(**engine, prompts, max_tokens, stagger);
      for (size_t i = 0; i < prompts.size(); ++i) {
        ExpectBitIdentical(batched[i], alone[i],
                           fmt::format("{} K={} budget {} stagger {} request {}", c.name, k,
                                       config.max_num_batched_tokens, stagger, i));
      }
      accepted += (*engine)->spec_stats().num_accepted_tokens;
      drafted += (*engine)->spec_stats().num_draft_tokens;
    }
  }
  std::printf("%s: %lld of %lld drafts accepted\n", c.name, static_cast<long long>(accepted),
              static_cast<long long>(drafted));
  return {accepted, drafted};
}

// Random weights rarely continue their prompt: drafts are verified and (mostly) rejected, which
// must drop the rejected positions' state and KV.
TEST(EngineSpecTest, NgramGreedyIsBitIdenticalOnTheGoldenModel) {
  const auto [accepted, drafted] = ExpectSpecEqualsPlain({"ngram golden", kHybridDir, "ngram"});
  EXPECT_GT(drafted, 0) << "no draft was proposed: the test lost its point";
}

TEST(EngineSpecTest, MtpGreedyIsBitIdenticalOnTheGoldenModel) {
  const auto [accepted, drafted] = ExpectSpecEqualsPlain({"mtp golden", kHybridDir, "mtp"});
  EXPECT_GT(drafted, 0) << "no draft was proposed: the test lost its point";
}

TEST(EngineSpecTest, MtpGreedyIsBitIdenticalOnARandomMtpModel) {
  const auto [accepted, drafted] = ExpectSpecEqualsPlain({"mtp random", HybridMtpDir(), "mtp"});
  EXPECT_GT(drafted, 0) << "no draft was proposed: the test lost its point";
}

// The trained model's MTP head agrees often: both outcomes, accepted runs (several tokens a
// step, state slots traded) and rejections, on a hybrid model.
TEST(EngineSpecTest, MtpGreedyIsBitIdenticalOnTheDefaultModel) {
  const auto [accepted, drafted] =
      ExpectSpecEqualsPlain({"mtp default model", MOESERVE_DEFAULT_MODEL_DIR, "mtp"});
  EXPECT_GT(accepted, 0) << "no draft was ever accepted: the test lost its point";
  EXPECT_LT(accepted, drafted) << "no draft was ever rejected: the test lost its point";
}

TEST(EngineSpecTest, NgramOnAnAttentionOnlyModelWithPrefixCaching) {
  const auto [accepted, drafted] =
      ExpectSpecEqualsPlain({"ngram qwen3-moe", Qwen3MoeDir(), "ngram"});
  EXPECT_GT(accepted, 0) << "no draft was ever accepted: the test lost its point";
  EXPECT_LT(accepted, drafted) << "no draft was ever rejected: the test lost its point";
}

TEST(EngineSpecTest, PreemptionInTheMiddleKeepsTheTokens) {
  auto lm = LoadModel(HybridMtpDir());
  ASSERT_TRUE(lm);
  const int64_t V = lm->config().vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(RandomPrompt(40 + 9 * i, 300 + i, V));
  EngineConfig roomy{.max_num_seqs = 8, .max_num_batched_tokens = 512, .max_model_len = 128};
  EngineConfig small = roomy;
  small.spec = *ParseSpecFlag("mtp:3");
  small.spec.disable_batch_size = 0;
  small.kv_cache_memory_gib = 8.5 * BlockGiB(*lm, roomy);  // preempts, as the test above
  auto engine = Engine::Create(*lm, small);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  int64_t preemptions = 0;
  const std::vector<Trace> traces = RunAll(**engine, prompts, 20, 0, &preemptions);
  EXPECT_GT(preemptions, 0) << "the test did not exercise preemption";
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(traces[i].tokens, RunAlone(*lm, roomy, prompts[i], 20).tokens) << "request " << i;
  }
}

// Verify steps of 1 + K tokens, MTP draft passes and the state-slot trades allocate nothing,
// for greedy requests and sampled ones with penalties. (Logprobs allocate their top-N lists, with
// or without drafts.)
TEST(EngineSpecTest, SpeculativeStepsAllocateNothing) {
  auto lm = LoadModel(MOESERVE_DEFAULT_MODEL_DIR);
  ASSERT_TRUE(lm);
  const auto prompts = RepetitivePrompts(lm->config().vocab_size);
  for (const char* spec : {"mtp:3", "ngram:3"}) {
    SCOPED_TRACE(spec);
    EngineConfig config{.max_num_seqs = 8, .max_num_batched_tokens = 512, .max_model_len = 512};
    config.spec = *ParseSpecFlag(spec);
    config.spec.min_acceptance = 0;  // always K drafts: every path runs every step
    config.spec.disable_batch_size = 0;
    auto engine = Engine::Create(*lm, config);
    ASSERT_TRUE(engine.ok());
    for (size_t i = 0; i < prompts.size(); ++i) {
      SamplingParams params = Greedy(200);
      if (i % 2 == 1) {
        params.temperature = 0.8;
        params.seed = static_cast<int64_t>(i);
        params.repetition_penalty = 1.1;
      }
      ASSERT_TRUE((*engine)->AddRequest(prompts[i], params).ok());
    }
    for (int s = 0; s < 8; ++s) (*engine)->Step();  // prefills, then warm every path
    const int64_t before = HeapAllocations();
    TraceHeapAllocations(true);
    const int steps = kSanitized ? 10 : 30;
    for (int s = 0; s < steps; ++s) (*engine)->Step();
    TraceHeapAllocations(false);
    EXPECT_EQ(HeapAllocations() - before, 0) << "heap allocations in speculative steps";
    EXPECT_GT((*engine)->spec_stats().num_drafts, 0);
    EXPECT_EQ((*engine)->num_running(), 8);
  }
}

TEST(EngineSpecTest, MtpNeedsAnMtpLayer) {
  auto lm = LoadModel(Qwen3MoeDir());
  ASSERT_TRUE(lm);
  EngineConfig config{.max_num_seqs = 2, .max_num_batched_tokens = 256, .max_model_len = 256};
  config.spec = *ParseSpecFlag("mtp:2");
  Result<std::unique_ptr<Engine>> engine = Engine::Create(*lm, config);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("no MTP layer"), std::string::npos)
      << engine.status().message();
}

// ---- tensor and expert parallel ranks -------------------------------------------------------

// Greedy that still materializes every sampled row's logits (logprobs asked for), so vocab-
// parallel ranks gather them and the trace can compare them.
// --tp 2, --tp 2 --ep and --tp 4 --ep (KV and GDN key heads replicated) through the whole engine:
// eight requests of different lengths arriving one every 3 steps give the tokens of one rank,
// their logits within 1e-5 relative; at each layout a request's logits are bit-identical alone
// and in the batch; plain greedy rows (argmax pairs exchanged, no logits gathered) give the same
// tokens. With --mc2-max-tokens 16 steps switch between the MoE's all-to-all (MC2) and its
// all-gather by their token count, and still no bit moves.
TEST(EngineParallelTest, RanksMatchOneRankAndAreBatchInvariant) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  const auto prompts = EightPrompts(lm->config().vocab_size);
  const EngineConfig config{.max_num_seqs = 8, .max_num_batched_tokens = 128, .max_model_len = 256};
  auto one = Engine::Create(*lm, config);
  ASSERT_TRUE(one.ok());
  const std::vector<Trace> want = RunAll(**one, prompts, 8, 3, nullptr, GreedyWithLogits(8));
  struct Layout {
    int tp;
    bool ep;
    int64_t mc2_max_tokens;
  };
  // Under ASan one layout covers the paths (plain TP's are the MoE's all-gather ones).
  const std::vector<Layout> layouts =
      kSanitized ? std::vector<Layout>{{2, true, 16}}
                 : std::vector<Layout>{{2, false, 0}, {2, true, 0}, {4, true, 0}, {2, true, 16}};
  for (const Layout& l : layouts) {
    const int tp = l.tp;
    const std::string layout =
        fmt::format("--tp {}{} --mc2-max-tokens {}", tp, l.ep ? " --ep" : "", l.mc2_max_tokens);
    auto group = LoadRanks(kHybridDir, tp, l.ep, l.mc2_max_tokens);
    ASSERT_TRUE(group);
    auto engine = Engine::Create(*group, config);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    const std::vector<Trace> got = RunAll(**engine, prompts, 8, 3, nullptr, GreedyWithLogits(8));
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(got[i].tokens, want[i].tokens) << layout << " request " << i;
      for (size_t s = 0; s < want[i].logits.size(); ++s) {
        EXPECT_LE(MaxRelError(got[i].logits[s], want[i].logits[s]), 1e-5)
            << layout << " request " << i << " output " << s;
      }
    }
    for (size_t i : {0, 3, 5}) {
      auto alone = Engine::Create(*group, config);
      ASSERT_TRUE(alone.ok());
      ExpectBitIdentical(RunAll(**alone, {prompts[i]}, 8, 0, nullptr, GreedyWithLogits(8))[0],
                         got[i], fmt::format("{} request {} alone", layout, i));
    }
    auto plain = Engine::Create(*group, config);
    ASSERT_TRUE(plain.ok());
    const std::vector<Trace> argmax_only = RunAll(**plain, prompts, 8, 3);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(argmax_only[i].tokens, want[i].tokens) << layout << " plain greedy request " << i;
    }
  }
}

// Speculative decoding over ranks: the MTP head sharded like the layers, drafts from exchanged
// argmaxes, verify runs' GDN states per rank: the same greedy tokens as one rank without drafts.
TEST(EngineParallelTest, MtpSpeculationOverRanksKeepsTheTokens) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  const auto prompts = EightPrompts(lm->config().vocab_size);
  const EngineConfig plain{.max_num_seqs = 8, .max_num_batched_tokens = 128, .max_model_len = 256};
  auto one = Engine::Create(*lm, plain);
  ASSERT_TRUE(one.ok());
  const std::vector<Trace> want = RunAll(**one, prompts, 12, 2, nullptr, GreedyWithLogits(12));
  EngineConfig spec = plain;
  spec.spec = *ParseSpecFlag("mtp:2");
  spec.spec.min_acceptance = 0;  // draft every step, whatever the acceptance
  auto group = LoadRanks(kHybridDir, 2, true, 16);
  ASSERT_TRUE(group);
  auto engine = Engine::Create(*group, spec);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const std::vector<Trace> got = RunAll(**engine, prompts, 12, 2, nullptr, GreedyWithLogits(12));
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  }
  EXPECT_GT((*engine)->spec_stats().num_drafts, 0);
}

}  // namespace
}  // namespace moeserve::engine
