// Prefix caching for hybrid models (GDN state checkpoints, KvCacheManager) through the whole
// engine on the golden tiny Qwen3-Next: a request resumed from a checkpoint computes only what
// follows it and gives logits bit-identical to the same request computed from scratch; a
// follow-up turn computes only its new tokens (plus < 64); a tiny checkpoint budget evicts
// without changing results; preemption, aborts, concurrent sharers and MTP drafting keep the
// tokens; the pool returns to idle.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "core/test_paths.h"

namespace moeserve::engine {
namespace {

using namespace test_util;

constexpr int64_t kAlign = 64;

EngineConfig Cached(int64_t budget) {
  return {.max_num_seqs = 4, .max_num_batched_tokens = budget, .max_model_len = 1024,
          .state_checkpoint_interval = 64};
}

EngineConfig Uncached(int64_t budget) {
  EngineConfig c = Cached(budget);
  c.enable_prefix_caching = false;
  return c;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Nothing held once every request ended: blocks, state slots, pins.
void ExpectIdle(const Engine& engine) {
  const KvCacheManager& m = engine.cache_manager();
  EXPECT_EQ(m.num_used_blocks(), 0);
  EXPECT_EQ(m.num_used_state_slots(), 0);
  EXPECT_EQ(m.num_pinned_checkpoints(), 0);
  EXPECT_LE(m.num_checkpoints(), engine.layout().num_checkpoints);
}

TEST(HybridPrefixCacheTest, LayoutReportsCheckpoints) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  auto engine = Engine::Create(*lm, Cached(256));
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const EngineLayout& l = (*engine)->layout();
  EXPECT_TRUE(l.prefix_caching);
  EXPECT_GT(l.num_checkpoints, 0);
  EXPECT_GT(l.state_slot_bytes, 0);
  EXPECT_EQ(l.checkpoint_alignment, kAlign);
  EngineConfig off = Cached(256);
  off.enable_prefix_caching = false;
  EXPECT_EQ((*Engine::Create(*lm, off))->layout().num_checkpoints, 0);
  EngineConfig bad = Cached(256);
  bad.state_checkpoint_interval = 100;
  EXPECT_FALSE(Engine::Create(*lm, bad).ok());
  bad = Cached(256);
  bad.state_cache_memory_gib = -1;
  EXPECT_FALSE(Engine::Create(*lm, bad).ok());
}

// Request B shares `shared` tokens with an earlier request A: B starts after the last checkpoint
// inside the shared part and its every logit equals a from-scratch run's, bit for bit.
TEST(HybridPrefixCacheTest, ResumedRequestIsBitIdenticalToScratch) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  const int64_t V = lm->config().vocab_size;
  for (int64_t shared : {64, 100, 640}) {
    for (int64_t budget : {128, 2048}) {  // chunked and unchunked prefill
      SCOPED_TRACE(fmt::format("shared {} budget {}", shared, budget));
      const std::vector<int32_t> common = RandomPrompt(shared, 7 + shared, V);
      const std::vector<int32_t> a = Concat(common, RandomPrompt(30, 1, V));
      const std::vector<int32_t> b = Concat(common, RandomPrompt(21, 2, V));
      auto engine = Engine::Create(*lm, Cached(budget));
      ASSERT_TRUE(engine.ok()) << engine.status().ToString();
      RunAll(**engine, {a}, 3);
      const int64_t hits_before = (*engine)->cache_manager().prefix_cache_hits();
      const int64_t id = *(*engine)->AddRequest(b, Greedy(6));
      (*engine)->Step();
      const int64_t resume = shared / kAlign * kAlign;
      EXPECT_EQ((*engine)->last_schedule().scheduled[0].first_pos, resume);
      EXPECT_EQ((*engine)->Find(id)->num_cached_tokens, resume);
      EXPECT_EQ((*engine)->cache_manager().prefix_cache_hits() - hits_before, resume);
      while ((*engine)->HasUnfinished()) (*engine)->Step();
      (*engine)->Release(id);
      ExpectIdle(**engine);
      // The whole of B again, traced, against a from-scratch run.
      const Trace got = RunAll(**engine, {b}, 6)[0];
      ExpectBitIdentical(got, RunAlone(*lm, Uncached(budget), b, 6), "resumed vs scratch");
      ExpectIdle(**engine);
    }
  }
}

// A conversation: turn k + 1 is turn k's prompt and output plus new tokens; it resumes from the
// checkpoint at the end of turn k's output and computes only the rest (< 64 more than its new
// tokens, as the last output token of turn k was never computed).
TEST(HybridPrefixCacheTest, FollowUpTurnComputesOnlyItsNewTokens) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  const int64_t V = lm->config().vocab_size;
  EngineConfig config = Cached(256);
  config.state_checkpoint_interval = 0;  // only prompt and output ends
  auto engine = Engine::Create(*lm, config);
  ASSERT_TRUE(engine.ok());
  std::vector<int32_t> conversation = RandomPrompt(90, 40, V);
  for (int turn = 0; turn < 4; ++turn) {
    SCOPED_TRACE(fmt::format("turn {}", turn));
    const int64_t id = *(*engine)->AddRequest(conversation, Greedy(50 + 7 * turn));
    (*engine)->Step();
    const int64_t computed = static_cast<int64_t>(conversation.size()) -
                             (*engine)->last_schedule().scheduled[0].first_pos;
    if (turn > 0) {
      EXPECT_GT((*engine)->Find(id)->num_cached_tokens, 0);
      EXPECT_LE(computed, 30 + 64) << "only the new 30 tokens, plus < 64, should be computed";
    }
    while ((*engine)->HasUnfinished()) (*engine)->Step();
    const std::vector<int32_t> out = (*engine)->Find(id)->output_token_ids;
    (*engine)->Release(id);
    conversation = Concat(Concat(conversation, out), RandomPrompt(30, 50 + turn, V));
  }
  ExpectIdle(**engine);
}

// A checkpoint budget of two: checkpoints are evicted and dropped, results do not change, hits
// fall, nothing leaks.
TEST(HybridPrefixCacheTest, TinyStateCacheEvictsAndKeepsResults) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  const int64_t V = lm->config().vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(Concat(RandomPrompt(130, 60 + i % 3, V), RandomPrompt(20 + i, 70 + i, V)));
  }
  const std::vector<Trace> want = [&] {
    auto engine = Engine::Create(*lm, Uncached(256));
    return RunAll(**engine, prompts, 5, /*stagger=*/3);
  }();
  int64_t hits[2] = {0, 0};
  for (int tiny = 0; tiny < 2; ++tiny) {
    EngineConfig config = Cached(256);
    auto probe = Engine::Create(*lm, config);
    if (tiny) {
      config.state_cache_memory_gib =
          2.5 * (*probe)->layout().state_slot_bytes / (1024.0 * 1024.0 * 1024.0);
    }
    auto engine = Engine::Create(*lm, config);
    ASSERT_TRUE(engine.ok());
    if (tiny) {
      EXPECT_EQ((*engine)->layout().num_checkpoints, 2);
    }
    const std::vector<Trace> got = RunAll(**engine, prompts, 5, /*stagger=*/3);
    for (size_t i = 0; i < prompts.size(); ++i) {
      ExpectBitIdentical(got[i], want[i], fmt::format("tiny {} request {}", tiny, i));
    }
    hits[tiny] = (*engine)->cache_manager().prefix_cache_hits();
    ExpectIdle(**engine);
  }
  EXPECT_GT(hits[0], 0);
  EXPECT_LT(hits[1], hits[0]) << "two checkpoints should hit less than many";
}

// Requests sharing a prefix, added together and staggered, under a KV pool small enough to
// preempt, one aborted midway: every other request's tokens and logits equal the uncached run's.
TEST(HybridPrefixCacheTest, PreemptionAbortAndSharersMatchUncached) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  const int64_t V = lm->config().vocab_size;
  const std::vector<int32_t> system = RandomPrompt(140, 80, V);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(Concat(system, RandomPrompt(5 + 11 * i, 90 + i, V)));
  EngineConfig roomy = Cached(256);
  roomy.max_model_len = 256;
  EngineConfig small = roomy;
  small.kv_cache_memory_gib = 40.5 * BlockGiB(*lm, roomy);
  for (const char* spec : {"none", "mtp:2"}) {
    SCOPED_TRACE(spec);
    EngineConfig uncached = roomy;
    uncached.enable_prefix_caching = false;
    small.spec = *ParseSpecFlag(spec);
    small.spec.disable_batch_size = 0;
    auto engine = Engine::Create(*lm, small);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    // Abort request 2 after a few steps, then run the rest to the end.
    std::vector<int64_t> ids;
    for (const auto& p : prompts) ids.push_back(*(*engine)->AddRequest(p, Greedy(24)));
    int64_t preemptions = 0;
    for (int step = 0; (*engine)->HasUnfinished(); ++step) {
      if (step == 4) (*engine)->Abort(ids[2]);
      (*engine)->Step();
      preemptions += static_cast<int64_t>((*engine)->last_schedule().preempted_ids.size());
    }
    EXPECT_GT(preemptions, 0) << "the test did not exercise preemption";
    EXPECT_GT((*engine)->cache_manager().prefix_cache_hits(), 0);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Request* r = (*engine)->Find(ids[i]);
      if (i != 2) {
        EXPECT_EQ(r->output_token_ids, RunAlone(*lm, uncached, prompts[i], 24).tokens)
            << "request " << i;
      }
      (*engine)->Release(ids[i]);
    }
    ExpectIdle(**engine);
  }
}

// Speculative decoding: a verify step whose accepted drafts run past a checkpoint position leaves
// the state there in a draft's slot; it is checkpointed from that slot, so the next turn resumes
// there (not from an older checkpoint). The default model has a trained MTP head
// (most drafts accepted); over six conversations (three under the sanitizers) some cross position
// 64 inside an accepted run (without the slot copy, five of the six resume from nothing).
TEST(HybridPrefixCacheTest, AcceptedDraftsPastACheckpointPositionAreCheckpointed) {
  auto lm = LoadModel(MOESERVE_DEFAULT_MODEL_DIR);
  ASSERT_TRUE(lm);
  const int64_t V = lm->config().vocab_size;
  EngineConfig cached = Cached(256);
  cached.spec = *ParseSpecFlag("mtp:3");
  cached.spec.min_acceptance = 0;
  // Checkpoints every 512 prompt tokens (the default): a chunk, and so a verify step, is not cut
  // at 64 (Cached's interval would cut it there and never cross).
  cached.state_checkpoint_interval = 512;
  EngineConfig uncached = cached;
  uncached.enable_prefix_caching = false;
  for (uint32_t seed = 0; seed < (kSanitized ? 3 : 6); ++seed) {
    SCOPED_TRACE(seed);
    auto engine = Engine::Create(*lm, cached);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    const std::vector<int32_t> prompt = RandomPrompt(20, 300 + seed, V);
    const Trace first = RunAll(**engine, {prompt}, 70)[0];  // the output ends past position 64
    const std::vector<int32_t> next =
        Concat(Concat(prompt, first.tokens), RandomPrompt(9, 400 + seed, V));
    const int64_t before = (*engine)->cache_manager().prefix_cache_hits();
    const Trace got = RunAll(**engine, {next}, 6, 0, nullptr, GreedyWithLogits(6))[0];
    EXPECT_EQ((*engine)->cache_manager().prefix_cache_hits() - before, kAlign);
    // The checkpoint holds the state decoding reached token by token, which a prefill from
    // scratch computes chunk-wise: the same tokens, logits within float rounding.
    auto fresh = Engine::Create(*lm, uncached);
    ASSERT_TRUE(fresh.ok());
    const Trace want = RunAll(**fresh, {next}, 6, 0, nullptr, GreedyWithLogits(6))[0];
    ASSERT_EQ(got.tokens, want.tokens);
    for (size_t s = 0; s < want.logits.size(); ++s) {
      EXPECT_LE(MaxRelError(got.logits[s], want.logits[s]), 1e-4) << "output " << s;
    }
  }
}

// Over --tp 2 and --tp 2 --ep local ranks: the checkpoint copies run on every rank's shard of the
// state, and a resumed request gives one rank's scratch tokens and logits (<= 1e-5).
TEST(HybridPrefixCacheTest, ResumesOverRanks) {
  auto lm = LoadModel(kHybridDir);
  ASSERT_TRUE(lm);
  const int64_t V = lm->config().vocab_size;
  const std::vector<int32_t> common = RandomPrompt(200, 9, V);
  const std::vector<int32_t> a = Concat(common, RandomPrompt(30, 1, V));
  const std::vector<int32_t> b = Concat(common, RandomPrompt(21, 2, V));
  auto one = Engine::Create(*lm, Uncached(256));
  ASSERT_TRUE(one.ok());
  const Trace want = RunAll(**one, {b}, 6, 0, nullptr, GreedyWithLogits(6))[0];
  for (bool ep : {false, true}) {
    SCOPED_TRACE(ep ? "--tp 2 --ep" : "--tp 2");
    auto group = LoadRanks(kHybridDir, 2, ep);
    ASSERT_TRUE(group);
    auto engine = Engine::Create(*group, Cached(256));
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    RunAll(**engine, {a}, 3);
    const Trace got = RunAll(**engine, {b}, 6, 0, nullptr, GreedyWithLogits(6))[0];
    EXPECT_EQ((*engine)->cache_manager().prefix_cache_hits(), 192);
    ASSERT_EQ(got.tokens, want.tokens);
    for (size_t s = 0; s < want.logits.size(); ++s) {
      EXPECT_LE(MaxRelError(got.logits[s], want.logits[s]), 1e-5) << "output " << s;
    }
    ExpectIdle(**engine);
  }
}

}  // namespace
}  // namespace moeserve::engine
