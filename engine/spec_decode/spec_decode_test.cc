// Speculative decoding without a model: the --spec flag, prompt lookup, and the scheduler's side
// of verification (drafts scheduled after the last token, trimmed by the budget, rejected
// positions handed back, a stop inside an accepted run, lookahead blocks, extra state slots).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine/kv_cache_manager.h"
#include "engine/scheduler.h"
#include "engine/spec_decode/ngram_proposer.h"
#include "engine/spec_decode/spec_config.h"

namespace moeserve::engine {
namespace {

TEST(SpecFlagTest, ParsesMethodsAndK) {
  Result<SpecConfig> mtp = ParseSpecFlag("mtp:3");
  ASSERT_TRUE(mtp.ok());
  EXPECT_EQ(mtp->method, SpecMethod::kMtp);
  EXPECT_EQ(mtp->num_speculative_tokens, 3);
  EXPECT_EQ(mtp->lookahead(), 2);
  EXPECT_EQ(SpecName(*mtp), "mtp:3");
  Result<SpecConfig> ngram = ParseSpecFlag("ngram:4");
  ASSERT_TRUE(ngram.ok());
  EXPECT_EQ(ngram->method, SpecMethod::kNgram);
  EXPECT_EQ(ngram->lookahead(), 0);
  EXPECT_FALSE(ParseSpecFlag("none")->enabled());
  // Sized by cost: up to kMaxSpeculativeTokens; "auto" is mtp:auto on a model with an MTP head.
  Result<SpecConfig> sized = ParseSpecFlag("ngram:auto");
  ASSERT_TRUE(sized.ok());
  EXPECT_TRUE(sized->sized_by_cost);
  EXPECT_EQ(sized->num_speculative_tokens, kMaxSpeculativeTokens);
  EXPECT_EQ(SpecName(*sized), "ngram:auto");
  Result<SpecConfig> automatic = ParseSpecFlag("auto");
  ASSERT_TRUE(automatic.ok());
  EXPECT_FALSE(automatic->enabled());  // until resolved for a model
  EXPECT_EQ(SpecName(ResolveSpec(*automatic, true)), "mtp:auto");
  EXPECT_EQ(ResolveSpec(*automatic, true).lookahead(), kMaxSpeculativeTokens - 1);
  EXPECT_FALSE(ResolveSpec(*automatic, false).enabled());
  EXPECT_EQ(SpecName(ResolveSpec(*ParseSpecFlag("mtp:2"), false)), "mtp:2");  // as given
  for (const char* bad : {"mtp", "mtp:", "mtp:0", "mtp:5", "mtp:2x", "eagle:2", "ngram:-1",
                          "mtp:99999999999999999999", "auto:2", "mtp:Auto", "mtp:auto ", "AUTO"}) {
    Result<SpecConfig> r = ParseSpecFlag(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--spec"), std::string::npos) << r.status().message();
  }
}

std::vector<int32_t> Propose(const std::vector<int32_t>& tokens, int64_t min_n, int64_t max_n,
                             int64_t k) {
  std::vector<int32_t> drafts(k, -1);
  drafts.resize(NgramPropose(tokens, min_n, max_n, k, drafts.data()));
  return drafts;
}

TEST(NgramProposeTest, LongestSuffixMatchThenMostRecent) {
  // Suffix "1 2 3" occurred at 0 (followed by 9) and the 2-gram "2 3" more recently at 6
  // (followed by 7): the longer match wins.
  EXPECT_EQ(Propose({1, 2, 3, 9, 8, 5, 2, 3, 7, 4, 1, 2, 3}, 1, 5, 3),
            (std::vector<int32_t>{9, 8, 5}));
  // Two occurrences of the same length: the most recent.
  EXPECT_EQ(Propose({4, 5, 1, 4, 5, 2, 4, 5}, 2, 5, 2), (std::vector<int32_t>{2, 4}));
  // Drafts stop at the end of the history (the match overlaps the suffix).
  EXPECT_EQ(Propose({7, 7, 7}, 1, 5, 4), (std::vector<int32_t>{7}));
  // No match, or shorter than the minimum.
  EXPECT_TRUE(Propose({1, 2, 3, 4}, 1, 5, 3).empty());
  EXPECT_TRUE(Propose({1, 2, 9, 3, 2}, 2, 5, 3).empty());
  EXPECT_EQ(Propose({1, 2, 9, 3, 2}, 1, 5, 3), (std::vector<int32_t>{9, 3, 2}));
  // Degenerate inputs.
  EXPECT_TRUE(Propose({}, 1, 5, 3).empty());
  EXPECT_TRUE(Propose({5}, 1, 5, 3).empty());
  EXPECT_TRUE(Propose({5, 5}, 1, 5, 0).empty());
}

// ---- the scheduler's side ----------------------------------------------------------------------

constexpr int32_t kEos = 2;
constexpr int32_t kFiller = 5;

class SpecSchedulerTest : public ::testing::Test {
 protected:
  void Make(int64_t budget, int64_t num_state_slots = 0, int64_t lookahead = 0) {
    cache_ = std::make_unique<KvCacheManager>(
        KvCacheConfig{.num_blocks = 100,
                      .block_size = 16,
                      .num_state_slots = num_state_slots,
                      .spec_state_slots_per_request = num_state_slots > 0 ? kK : 0,
                      .num_spec_state_slots = num_state_slots / (1 + kK) * kK,
                      .max_blocks_per_request = 64});
    scheduler_ = std::make_unique<Scheduler>(SchedulerConfig{.max_num_seqs = 8,
                                                             .max_num_batched_tokens = budget,
                                                             .max_model_len = 1024,
                                                             .num_speculative_tokens = kK,
                                                             .spec_lookahead = lookahead},
                                             *cache_);
  }

  Request& Add(int64_t prompt_len, int64_t max_tokens = 100, int64_t min_tokens = 0) {
    auto r = std::make_unique<Request>();
    r->id = next_id_++;
    r->prompt_token_ids.assign(prompt_len, kFiller);
    r->stop.max_tokens = max_tokens;
    r->stop.min_tokens = min_tokens;
    r->stop.eos_token_ids = {kEos};
    Request* raw = r.get();
    EXPECT_TRUE(scheduler_->AddRequest(std::move(r)).ok());
    return *raw;
  }

  // Applies one step in which request 0 (the only one) emits `tokens` and proposes `drafts`.
  const SchedulerOutput& Step(const std::vector<int32_t>& tokens,
                              const std::vector<int32_t>& drafts = {}) {
    const SchedulerOutput& out = scheduler_->Schedule();
    EXPECT_EQ(out.scheduled.size(), 1u);
    StepOutput step;
    step.token_start = {0, static_cast<int32_t>(tokens.size())};
    step.tokens = tokens;
    step.draft_start = {0, static_cast<int32_t>(drafts.size())};
    step.drafts = drafts;
    scheduler_->Update(out, step);
    return out;
  }

  static constexpr int64_t kK = 3;
  std::unique_ptr<KvCacheManager> cache_;
  std::unique_ptr<Scheduler> scheduler_;
  int64_t next_id_ = 0;
};

TEST_F(SpecSchedulerTest, DraftsAreVerifiedAfterTheLastToken) {
  Make(2048);
  Request& r = Add(10);
  Step({7}, {8, 9, 10});  // prefill: one token, three drafts
  EXPECT_EQ(r.draft_token_ids, (std::vector<int32_t>{8, 9, 10}));
  EXPECT_EQ(r.num_computed_tokens, 10);

  // Verify [7, 8, 9, 10] at positions 10..13; 8 accepted, 9 rejected, 20 recovered.
  const SchedulerOutput& out = scheduler_->Schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].first_pos, 10);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 4);
  EXPECT_EQ(out.scheduled[0].num_draft_tokens, 3);
  StepOutput step;
  step.token_start = {0, 2};
  step.tokens = {8, 20};
  step.draft_start = {0, 2};
  step.drafts = {21, 22};
  scheduler_->Update(out, step);
  EXPECT_EQ(r.output_token_ids, (std::vector<int32_t>{7, 8, 20}));
  // Positions 10 (7) and 11 (8) hold valid KV; 12 and 13 will be computed again.
  EXPECT_EQ(r.num_computed_tokens, 12);
  EXPECT_EQ(r.num_tokens(), 13);
  EXPECT_EQ(r.draft_token_ids, (std::vector<int32_t>{21, 22}));
  EXPECT_EQ(r.spec.num_drafts, 1);
  EXPECT_EQ(r.spec.num_draft_tokens, 3);
  EXPECT_EQ(r.spec.num_accepted_tokens, 1);
  EXPECT_EQ(r.spec.accepted_per_pos, (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(scheduler_->spec_stats().num_accepted_tokens, 1);
  EXPECT_DOUBLE_EQ(r.spec.mean_acceptance_length(), 2.0);
}

TEST_F(SpecSchedulerTest, TheBudgetTrimsDrafts) {
  Make(/*budget=*/3);
  Request& r = Add(2);
  Step({7}, {8, 9, 10});
  const SchedulerOutput& out = scheduler_->Schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 3);
  EXPECT_EQ(out.scheduled[0].num_draft_tokens, 2);
  EXPECT_EQ(r.draft_token_ids, (std::vector<int32_t>{8, 9}));  // the third is never verified
  scheduler_->Abort(r.id);
}

TEST_F(SpecSchedulerTest, AStopInsideAnAcceptedRunEndsThere) {
  Make(2048);
  Request& r = Add(10, /*max_tokens=*/100);
  Step({7}, {8, kEos, 10});
  Step({8, kEos, 10, 11});  // all accepted + bonus, but EOS is the second
  EXPECT_TRUE(r.finished());
  EXPECT_EQ(r.finish_reason, FinishReason::kStop);
  EXPECT_EQ(r.output_token_ids, (std::vector<int32_t>{7, 8, kEos}));
  EXPECT_TRUE(r.draft_token_ids.empty());
  EXPECT_EQ(cache_->num_used_blocks(), 0);
}

TEST_F(SpecSchedulerTest, MinTokensHoldsEosInsideARun) {
  Make(2048);
  Request& r = Add(10, 100, /*min_tokens=*/3);
  Step({7}, {kEos, kEos, 9});
  Step({kEos, kEos, 9, 12});  // EOS as outputs 2 and 3: only the third may stop
  EXPECT_TRUE(r.finished());
  EXPECT_EQ(r.output_token_ids, (std::vector<int32_t>{7, kEos, kEos}));
}

TEST_F(SpecSchedulerTest, MaxTokensIsNeverExceeded) {
  Make(2048);
  Request& r = Add(10, /*max_tokens=*/3);
  Step({7}, {8, 9, 10});  // more than a runner proposes: the stop check still ends at 3
  Step({8, 9, 10, 11});
  EXPECT_TRUE(r.finished());
  EXPECT_EQ(r.finish_reason, FinishReason::kLength);
  EXPECT_EQ(r.output_token_ids.size(), 3u);
}

// Draft slots come in sets of K from their own pool, enough for the requests that draft at once:
// a request finding none runs without (and drafts nothing), and takes a set once one frees.
TEST(SpecStateSlotsTest, DraftSlotsAreHandedOutWhileASetIsFree) {
  constexpr int64_t kK = 3;
  KvCacheManager cache(KvCacheConfig{.num_blocks = 100,
                                     .block_size = 16,
                                     .num_state_slots = 3 + 2 * kK,  // 3 requests, 2 drafting
                                     .spec_state_slots_per_request = kK,
                                     .num_spec_state_slots = 2 * kK,
                                     .max_blocks_per_request = 64});
  std::vector<Request> requests(4);
  for (Request& r : requests) r.prompt_token_ids.assign(10, kFiller);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cache.Allocate(requests[i], 10)) << i;
  EXPECT_EQ(requests[0].spec_state_slots.size(), static_cast<size_t>(kK));
  EXPECT_EQ(requests[1].spec_state_slots.size(), static_cast<size_t>(kK));
  EXPECT_TRUE(requests[2].spec_state_slots.empty());
  EXPECT_GE(requests[2].state_slot, 0);
  EXPECT_FALSE(cache.Allocate(requests[3], 10));  // no main slot left
  EXPECT_EQ(cache.num_used_state_slots(), 3 + 2 * kK);
  // A verify step traded request 0's slot with a draft's: the pools keep their sizes.
  std::swap(requests[0].state_slot, requests[0].spec_state_slots[0]);
  cache.Free(requests[0]);
  ASSERT_TRUE(cache.Allocate(requests[2], 0));  // the running request takes the freed set
  EXPECT_EQ(requests[2].spec_state_slots.size(), static_cast<size_t>(kK));
  ASSERT_TRUE(cache.Allocate(requests[3], 10));
  EXPECT_TRUE(requests[3].spec_state_slots.empty());
  for (int i = 1; i < 4; ++i) cache.Free(requests[i]);
  EXPECT_EQ(cache.num_used_state_slots(), 0);
}

TEST_F(SpecSchedulerTest, LookaheadBlocksAndStateSlots) {
  Make(2048, /*num_state_slots=*/8 * (1 + kK), /*lookahead=*/kK - 1);
  Request& r = Add(15, 100);
  const SchedulerOutput& out = scheduler_->Schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  // 15 prompt positions + 2 lookahead: two blocks; one main and three extra state slots.
  EXPECT_EQ(r.block_ids.size(), 2u);
  EXPECT_GE(r.state_slot, 0);
  EXPECT_EQ(r.spec_state_slots.size(), static_cast<size_t>(kK));
  EXPECT_EQ(cache_->num_used_state_slots(), 1 + kK);
  scheduler_->Abort(r.id);
  EXPECT_EQ(cache_->num_used_state_slots(), 0);
  EXPECT_EQ(cache_->num_used_blocks(), 0);
}

TEST_F(SpecSchedulerTest, PreemptionDropsDrafts) {
  Make(2048);
  Request& r = Add(10);
  Step({7}, {8, 9});
  ASSERT_FALSE(r.draft_token_ids.empty());
  EXPECT_TRUE(scheduler_->Abort(r.id));
  EXPECT_TRUE(r.draft_token_ids.empty());
}

}  // namespace
}  // namespace moeserve::engine
