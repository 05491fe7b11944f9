// Tensor and expert parallel ranks (shard.h) against one rank: the same forward split over 2 or
// 4 ranks -- threads of this process over the local communicator -- gives logits equal to one
// rank's within 1e-5 relative, the same greedy tokens, and the same MTP drafts, on the golden
// tiny Qwen3-Next and on make-model's Qwen3.5-MoE (its folder and its qwen35moe GGUF file, whose
// value heads are tiled), Qwen3-MoE and dense Qwen3.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "io/gguf_writer.h"
#include "model/causal_lm.h"
#include "model/gguf_export.h"
#include "model/model_files.h"
#include "model/shard.h"
#include "parallel/local_communicator.h"
#include "model/testing.h"
#include "core/test_paths.h"

namespace moeserve::model {
namespace {

using testing::Argmax;
using testing::RowRelError;

namespace fs = std::filesystem;

const std::string kTinyDir = MOESERVE_TESTDATA_DIR + "/tiny-qwen3next";

const std::string& ModelDir(const std::string& arch) {
  return testing::MadeModel("tp_" + arch, fmt::format("--arch {} --preset tiny --seed 11", arch));
}

// What one run records on rank 0: the prompt's logits [T, V], then per decode step the logits
// (even steps, LogitsMode::kFull) or the argmax (odd steps, kArgmax), and the MTP head's draft
// logits over the prompt when the model has one.
struct RankRun {
  std::vector<float> prompt_logits;
  std::vector<std::vector<float>> step_logits;
  std::vector<int32_t> step_argmax;
  std::vector<float> mtp_logits;
  uint64_t warmed_bytes = 0;  // weights the rank prefetched while it waited (case study #12)
};

constexpr int64_t kPromptLen = 70;  // crosses a 64-token GDN chunk boundary
constexpr int64_t kSteps = 8;

std::vector<int32_t> Prompt(int64_t vocab) {
  std::mt19937 rng(21);
  std::vector<int32_t> p(kPromptLen);
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % vocab);
  return p;
}

// The forward one rank runs; `feed` are the decode tokens (teacher-forced, so every layout sees
// the same sequence).
RankRun RunRank(CausalLm& lm, const std::vector<int32_t>& prompt, const std::vector<int32_t>& feed) {
  const int64_t V = lm.config().vocab_size;
  ModelCache cache(lm.shard().local, CacheSizes{16, 16, 1});
  cache.ResetSlot(0);
  std::vector<int32_t> table(16);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(3));
  lm.Reserve(kPromptLen, kPromptLen);
  RankRun run;
  std::vector<float> hidden;
  lm.Forward(SequenceInput{prompt.data(), kPromptLen, 0, table.data(), 0}, cache, true, &hidden,
             &run.prompt_logits);
  if (lm.has_mtp()) {
    // Row t pairs hidden[t] with the next token prompt[t + 1] (the last with feed[0]).
    std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
    next.push_back(feed[0]);
    lm.MtpForward(hidden.data(), next.data(), kPromptLen, 0, table.data(), cache, nullptr,
                  &run.mtp_logits);
  }
  std::vector<int64_t> positions(1);
  std::vector<int32_t> seq_of(1, 0), query_start{0, 1}, slots{0};
  const int32_t* tables[] = {table.data()};
  const int32_t row = 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    positions[0] = kPromptLen + step;
    TokenBatch batch{1, &feed[step], positions.data(), seq_of.data(), 1, query_start.data(),
                     tables, slots.data()};
    const LogitsMode mode = step % 2 == 0 ? LogitsMode::kFull : LogitsMode::kArgmax;
    lm.ForwardBatch(batch, cache, &row, 1, mode);
    if (mode == LogitsMode::kFull) {
      run.step_logits.emplace_back(lm.logits(), lm.logits() + V);
    } else {
      run.step_argmax.push_back(lm.argmax()[0]);
    }
  }
  return run;
}

// One rank's greedy continuation of the prompt (kSteps tokens), through Forward.
std::vector<int32_t> GreedyFeed(CausalLm& lm, const std::vector<int32_t>& prompt) {
  const int64_t V = lm.config().vocab_size;
  ModelCache cache(lm.shard().local, CacheSizes{16, 16, 1});
  cache.ResetSlot(0);
  std::vector<int32_t> table(16);
  std::iota(table.begin(), table.end(), 0);
  std::vector<float> logits;
  lm.Forward(SequenceInput{prompt.data(), kPromptLen, 0, table.data(), 0}, cache, false, nullptr,
             &logits);
  std::vector<int32_t> feed{Argmax(logits.data(), V)};
  while (static_cast<int64_t>(feed.size()) < kSteps) {
    const int64_t pos = kPromptLen + static_cast<int64_t>(feed.size()) - 1;
    lm.Forward(SequenceInput{&feed.back(), 1, pos, table.data(), 0}, cache, false, nullptr,
               &logits);
    feed.push_back(Argmax(logits.data(), V));
  }
  return feed;
}

// Runs `tp` ranks as threads over a local group; returns rank 0's run (every rank must agree).
RankRun RunLayout(const std::string& dir, int tp, bool ep, const std::vector<int32_t>& prompt,
              const std::vector<int32_t>& feed, ForwardOptions forward = {}) {
  parallel::LocalGroup group(tp);
  std::vector<RankRun> runs(tp);
  std::vector<std::string> errors(tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      LoadOptions options;
      options.threads = 1;
      options.shard = ShardSpec{r, tp, ep};
      options.comm = &group.rank(r);
      options.forward = forward;
      Result<std::unique_ptr<CausalLm>> lm = CausalLm::Load(dir, options);
      if (!lm.ok()) {
        errors[r] = lm.status().ToString();
        return;  // every rank fails the same way: none enters a collective
      }
      runs[r] = RunRank(**lm, prompt, feed);
      runs[r].warmed_bytes = (*lm)->warmed_bytes();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < tp; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (int r = 1; r < tp; ++r) {
    EXPECT_EQ(runs[r].prompt_logits, runs[0].prompt_logits) << "rank " << r << " disagrees";
    EXPECT_EQ(runs[r].step_argmax, runs[0].step_argmax);
  }
  return runs[0];
}

struct Layout {
  int tp;
  bool ep;
};

void ExpectLayoutsMatchOneRank(const std::string& dir, const std::vector<Layout>& layouts) {
  Result<std::unique_ptr<CausalLm>> one = CausalLm::Load(dir, {.weight_dtype = std::nullopt, .threads = 2});
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  const int64_t V = (*one)->config().vocab_size;
  const std::vector<int32_t> prompt = Prompt(V);
  const std::vector<int32_t> feed = GreedyFeed(**one, prompt);
  const RankRun ref = RunRank(**one, prompt, feed);
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(fmt::format("--tp {}{}", layout.tp, layout.ep ? " --ep" : ""));
    const RankRun run = RunLayout(dir, layout.tp, layout.ep, prompt, feed);
    ASSERT_EQ(run.prompt_logits.size(), ref.prompt_logits.size());
    for (int64_t t = 0; t < kPromptLen; ++t) {
      EXPECT_LE(RowRelError(&run.prompt_logits[t * V], &ref.prompt_logits[t * V], V), 1e-5)
          << "prompt row " << t;
      EXPECT_EQ(Argmax(&run.prompt_logits[t * V], V), Argmax(&ref.prompt_logits[t * V], V));
    }
    ASSERT_EQ(run.step_logits.size(), ref.step_logits.size());
    for (size_t s = 0; s < ref.step_logits.size(); ++s) {
      EXPECT_LE(RowRelError(run.step_logits[s].data(), ref.step_logits[s].data(), V), 1e-5);
      EXPECT_EQ(Argmax(run.step_logits[s].data(), V), feed[2 * s + 1]) << "step " << 2 * s;
    }
    EXPECT_EQ(run.step_argmax, ref.step_argmax);
    for (size_t j = 0; 2 * j + 2 < feed.size(); ++j) EXPECT_EQ(ref.step_argmax[j], feed[2 * j + 2]);
    ASSERT_EQ(run.mtp_logits.size(), ref.mtp_logits.size());
    for (int64_t t = 0; t * V < static_cast<int64_t>(ref.mtp_logits.size()); ++t) {
      EXPECT_LE(RowRelError(&run.mtp_logits[t * V], &ref.mtp_logits[t * V], V), 1e-5)
          << "MTP row " << t;
      EXPECT_EQ(Argmax(&run.mtp_logits[t * V], V), Argmax(&ref.mtp_logits[t * V], V));
    }
  }
}

// Under AddressSanitizer (a Debug build, many times slower) fewer layouts: that pass looks for
// memory errors, which --tp 4 --ep (replicated heads, whole experts) and --tp 2 (widths split)
// reach.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

const std::vector<Layout> kLayouts =
    kSanitized ? std::vector<Layout>{{2, false}, {4, true}}
               : std::vector<Layout>{{2, false}, {2, true}, {4, false}, {4, true}};

TEST(TensorParallelTest, GoldenQwen3NextMatchesOneRank) {
  ExpectLayoutsMatchOneRank(kTinyDir, kLayouts);
}
TEST(TensorParallelTest, Qwen3_5MoeMatchesOneRank) {
  ExpectLayoutsMatchOneRank(ModelDir("qwen3_5_moe"), kLayouts);
}
// The qwen35moe GGUF file of the Qwen3.5-MoE folder (2 key, 4 value heads, in llama.cpp's tiled
// order): --tp 2 keeps both key heads per rank, --tp 4 one key head and its value heads p with
// p % 2 == that head (ShardLayout's TiledKeyHeads).
TEST(TensorParallelTest, Qwen3_5MoeGgufWithTiledValueHeadsMatchesOneRank) {
  const std::string& dir = ModelDir("qwen3_5_moe");
  Result<ModelFiles> files = OpenModelFiles(dir);
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  io::GgufWriter writer;
  ASSERT_TRUE(AddGgufModel(files->config, files->checkpoint, DType::kBF16, writer).ok());
  const std::string gguf = dir + "/tp.gguf";
  ASSERT_TRUE(writer.Write(gguf).ok());
  ExpectLayoutsMatchOneRank(gguf, kLayouts);
}
TEST(TensorParallelTest, Qwen3MoeMatchesOneRank) {
  ExpectLayoutsMatchOneRank(ModelDir("qwen3_moe"), kLayouts);
}
TEST(TensorParallelTest, DenseQwen3MatchesOneRank) {
  ExpectLayoutsMatchOneRank(ModelDir("qwen3"), {{2, false}, {4, false}});
}

// The fused all-reduce + residual add + RMSNorm gives the bits of the three separate passes, on
// one rank and on several.
TEST(TensorParallelTest, FusedAllReduceNormEqualsUnfused) {
  Result<std::unique_ptr<CausalLm>> one = CausalLm::Load(kTinyDir, {.weight_dtype = std::nullopt, .threads = 2});
  ASSERT_TRUE(one.ok());
  const std::vector<int32_t> prompt = Prompt((*one)->config().vocab_size);
  const std::vector<int32_t> feed = GreedyFeed(**one, prompt);
  for (const auto& [tp, ep] : kSanitized ? std::vector<std::pair<int, bool>>{{2, false}}
                                         : std::vector<std::pair<int, bool>>{{1, false}, {2, false}, {4, true}}) {
    const RankRun fused = RunLayout(kTinyDir, tp, ep, prompt, feed);
    const RankRun unfused =
        RunLayout(kTinyDir, tp, ep, prompt, feed, ForwardOptions{.fused_allreduce_norm = false});
    EXPECT_EQ(fused.prompt_logits, unfused.prompt_logits) << "--tp " << tp;
    EXPECT_EQ(fused.step_logits, unfused.step_logits) << "--tp " << tp;
    EXPECT_EQ(fused.step_argmax, unfused.step_argmax) << "--tp " << tp;
    EXPECT_EQ(fused.mtp_logits, unfused.mtp_logits) << "--tp " << tp;
  }
}

// The fused GDN decode step (one task per key head: conv, norms, gates, delta rule, gated norm)
// gives the bits of the layer-wide passes, on one rank and with the GDN heads split over ranks;
// prompts (chunked form) do not take it, and their logits are unchanged too.
TEST(TensorParallelTest, FusedGdnStepEqualsUnfused) {
  for (const std::string& dir :
       kSanitized ? std::vector<std::string>{kTinyDir}
                  : std::vector<std::string>{kTinyDir, ModelDir("qwen3_5_moe")}) {
    Result<std::unique_ptr<CausalLm>> one =
        CausalLm::Load(dir, {.weight_dtype = std::nullopt, .threads = 2});
    ASSERT_TRUE(one.ok());
    const std::vector<int32_t> prompt = Prompt((*one)->config().vocab_size);
    const std::vector<int32_t> feed = GreedyFeed(**one, prompt);
    for (int tp : kSanitized ? std::vector<int>{2} : std::vector<int>{1, 2}) {
      const RankRun fused = RunLayout(dir, tp, false, prompt, feed);
      const RankRun unfused =
          RunLayout(dir, tp, false, prompt, feed, ForwardOptions{.fused_gdn_step = false});
      EXPECT_EQ(fused.prompt_logits, unfused.prompt_logits) << dir << " --tp " << tp;
      ASSERT_EQ(fused.step_logits.size(), static_cast<size_t>(kSteps / 2));
      EXPECT_EQ(fused.step_logits, unfused.step_logits) << dir << " --tp " << tp;
      EXPECT_EQ(fused.step_argmax, unfused.step_argmax) << dir << " --tp " << tp;
      EXPECT_EQ(fused.mtp_logits, unfused.mtp_logits) << dir << " --tp " << tp;
    }
  }
}

// Case study #12: ranks waiting in their collectives prefetch the weights they read next
// (model/weight_warmer.h). They do prefetch -- here the waits are a rank arriving at a barrier
// before the other -- and nothing else changes, bit for bit.
TEST(TensorParallelTest, WeightPrefetchWhileWaitingChangesNothing) {
  Result<std::unique_ptr<CausalLm>> one =
      CausalLm::Load(kTinyDir, {.weight_dtype = std::nullopt, .threads = 2});
  ASSERT_TRUE(one.ok());
  const std::vector<int32_t> prompt = Prompt((*one)->config().vocab_size);
  const std::vector<int32_t> feed = GreedyFeed(**one, prompt);
  for (const auto& [tp, ep] : std::vector<std::pair<int, bool>>{{2, false}, {2, true}}) {
    const RankRun warm = RunLayout(kTinyDir, tp, ep, prompt, feed);
    const RankRun cold =
        RunLayout(kTinyDir, tp, ep, prompt, feed, ForwardOptions{.warm_next_weights = false});
    EXPECT_GT(warm.warmed_bytes, 0u) << "--tp " << tp << (ep ? " --ep" : "");
    EXPECT_EQ(cold.warmed_bytes, 0u);
    EXPECT_EQ(warm.prompt_logits, cold.prompt_logits);
    EXPECT_EQ(warm.step_logits, cold.step_logits);
    EXPECT_EQ(warm.step_argmax, cold.step_argmax);
    EXPECT_EQ(warm.mtp_logits, cold.mtp_logits);
  }
  // One rank never waits, so never prefetches.
  EXPECT_EQ(RunLayout(kTinyDir, 1, false, prompt, feed).warmed_bytes, 0u);
}

// --ep's paths -- all-gather dispatch, all-to-all combine blocking or pipelined (MC2), the shared
// expert joined or apart -- give every token the same bits, so a step may pick any of them.
TEST(TensorParallelTest, ExpertParallelPathsAreBitIdentical) {
  for (const std::string& dir :
       kSanitized ? std::vector<std::string>{kTinyDir}
                  : std::vector<std::string>{kTinyDir, ModelDir("qwen3_moe")}) {
    Result<std::unique_ptr<CausalLm>> one = CausalLm::Load(dir, {.weight_dtype = std::nullopt, .threads = 2});
    ASSERT_TRUE(one.ok());
    const std::vector<int32_t> prompt = Prompt((*one)->config().vocab_size);
    const std::vector<int32_t> feed = GreedyFeed(**one, prompt);
    for (int tp : kSanitized ? std::vector<int>{4} : std::vector<int>{2, 4}) {
      const RankRun allgather = RunLayout(dir, tp, true, prompt, feed);
      const int64_t always = 1 << 20;
      const std::vector<ForwardOptions> variants = {
          {.mc2_max_tokens = always, .mc2 = true},
          {.mc2_max_tokens = always, .mc2 = false},
          {.shared_expert_overlap = false, .mc2_max_tokens = always, .mc2 = true},
          {.shared_expert_overlap = false},
          {.fused_allreduce_norm = false, .mc2_max_tokens = always}};
      for (size_t v = 0; v < variants.size(); ++v) {
        const RankRun run = RunLayout(dir, tp, true, prompt, feed, variants[v]);
        EXPECT_EQ(run.prompt_logits, allgather.prompt_logits) << dir << " --tp " << tp << " variant " << v;
        EXPECT_EQ(run.step_logits, allgather.step_logits) << dir << " --tp " << tp << " variant " << v;
        EXPECT_EQ(run.step_argmax, allgather.step_argmax) << dir << " --tp " << tp << " variant " << v;
        EXPECT_EQ(run.mtp_logits, allgather.mtp_logits) << dir << " --tp " << tp << " variant " << v;
      }
    }
  }
}

TEST(ShardLayoutTest, SplitsAndReplicatesHeads) {
  Result<io::ModelConfig> c = io::LoadModelConfig(kTinyDir);  // 4 q / 2 kv, GDN 2 k / 4 v, 8 experts
  ASSERT_TRUE(c.ok());
  Result<ShardLayout> s = MakeShardLayout(*c, {3, 4, true});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->q_heads.begin, 3);
  EXPECT_EQ(s->kv_heads.begin, 1);  // replicated: ranks 2 and 3 keep KV head 1
  EXPECT_EQ(s->local.num_key_value_heads, 1);
  EXPECT_EQ(s->gdn_key_heads.begin, 1);
  EXPECT_EQ(s->gdn_value_heads.begin, 3);
  EXPECT_EQ(s->experts.begin, 6);
  EXPECT_EQ(s->experts.count, 2);
  EXPECT_EQ(s->local.moe_intermediate_size, 128);  // whole experts under --ep
  EXPECT_EQ(s->local.shared_expert_intermediate_size, 128);  // whole under --ep too
  EXPECT_EQ(s->vocab.begin, 384);
  EXPECT_EQ(s->vocab.count, 128);
}

// A tiled-order file's value heads p read key head p % nk: a rank's contiguous value heads read
// all key heads (whole rounds of them) or a contiguous run of them, never grouped's.
TEST(ShardLayoutTest, TiledValueHeadsKeepTheKeyHeadsTheyRead) {
  Result<io::ModelConfig> c = io::LoadModelConfig(kTinyDir);  // GDN 2 k / 4 v
  ASSERT_TRUE(c.ok());
  c->gguf.gdn_v_heads_tiled = true;
  for (int rank = 0; rank < 4; ++rank) {  // value head r reads key head r % 2
    Result<ShardLayout> s = MakeShardLayout(*c, {rank, 4, false});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->gdn_value_heads.begin, rank);
    EXPECT_EQ(s->gdn_key_heads.begin, rank % 2);
    EXPECT_EQ(s->gdn_key_heads.count, 1);
  }
  Result<ShardLayout> two = MakeShardLayout(*c, {1, 2, false});  // value heads 2, 3: keys 0, 1
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->gdn_key_heads.begin, 0);
  EXPECT_EQ(two->gdn_key_heads.count, 2);
  EXPECT_EQ(two->local.linear_num_key_heads, 2);
  // 4 key heads, 12 value heads over 2 ranks: 6 each, neither whole rounds of 4 nor a divisor.
  c->linear_num_key_heads = 4;
  c->linear_num_value_heads = 12;
  Result<ShardLayout> uneven = MakeShardLayout(*c, {0, 2, false});
  ASSERT_FALSE(uneven.ok());
  EXPECT_NE(uneven.status().message().find("6 linear value heads neither cover whole rounds of "
                                           "the 4 key heads"),
            std::string::npos)
      << uneven.status().message();
}

TEST(ShardLayoutTest, RefusesSplitsThatDoNotDivide) {
  Result<io::ModelConfig> c = io::LoadModelConfig(kTinyDir);
  ASSERT_TRUE(c.ok());
  Result<ShardLayout> three = MakeShardLayout(*c, {0, 3, false});
  ASSERT_FALSE(three.ok());
  EXPECT_EQ(three.status().message(), "--tp 3 does not divide num_attention_heads (4)");
  c->num_experts = 6;
  c->num_experts_per_tok = 2;
  Result<ShardLayout> ep = MakeShardLayout(*c, {0, 4, true});
  ASSERT_FALSE(ep.ok());
  EXPECT_EQ(ep.status().message(), "--tp 4 with --ep does not divide num_experts (6)");
  c->num_attention_heads = 8;
  c->num_key_value_heads = 3;
  Result<ShardLayout> kv = MakeShardLayout(*c, {0, 2, false});
  ASSERT_FALSE(kv.ok());
  EXPECT_NE(kv.status().message().find("--tp 2 and num_key_value_heads (3)"), std::string::npos)
      << kv.status().message();
}

TEST(ShardLayoutTest, UnevenVocabularyIsPadded) {
  Result<io::ModelConfig> c = io::LoadModelConfig(kTinyDir);
  ASSERT_TRUE(c.ok());
  c->vocab_size = 510;
  Result<ShardLayout> last = MakeShardLayout(*c, {3, 4, false});
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->vocab_stride, 128);
  EXPECT_EQ(last->vocab.begin, 384);
  EXPECT_EQ(last->vocab.count, 126);
}

}  // namespace
}  // namespace moeserve::model
