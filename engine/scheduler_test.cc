#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/heap_counter.h"

namespace moeserve::engine {
namespace {

constexpr int32_t kEos = 2;
constexpr int32_t kFiller = 5;  // a sampled token that stops nothing

using Chunk = std::pair<int64_t, int64_t>;  // (request id, num_new_tokens)

SchedulerConfig Config(int64_t max_num_batched_tokens, int64_t max_num_seqs = 64,
                       int64_t max_model_len = 4096) {
  return SchedulerConfig{.max_num_seqs = max_num_seqs,
                         .max_num_batched_tokens = max_num_batched_tokens,
                         .max_model_len = max_model_len};
}

KvCacheConfig Pool(int64_t num_blocks, int64_t block_size = 16, bool prefix_caching = false) {
  return KvCacheConfig{
      .num_blocks = num_blocks, .block_size = block_size, .enable_prefix_caching = prefix_caching};
}

StopConditions MaxTokens(int64_t max_tokens) {
  StopConditions stop;
  stop.max_tokens = max_tokens;
  return stop;
}

std::vector<Chunk> Chunks(const SchedulerOutput& out) {
  std::vector<Chunk> chunks;
  for (const ScheduledRequest& s : out.scheduled)
    chunks.emplace_back(s.request->id, s.num_new_tokens);
  return chunks;
}

// A step's outputs in the runner's form from one sampled token per scheduled request (-1: a
// partial prefill, nothing sampled) and no drafts.
StepOutput FromSampled(const int32_t* sampled, size_t num_scheduled) {
  StepOutput step;
  step.token_start.push_back(0);
  step.draft_start.assign(num_scheduled + 1, 0);
  for (size_t i = 0; i < num_scheduled; ++i) {
    if (sampled[i] >= 0) step.tokens.push_back(sampled[i]);
    step.token_start.push_back(static_cast<int32_t>(step.tokens.size()));
  }
  return step;
}

class SchedulerTest : public ::testing::Test {
 protected:
  void Make(const SchedulerConfig& config, KvCacheConfig pool) {
    pool.max_blocks_per_request = (config.max_model_len + pool.block_size - 1) / pool.block_size;
    cache_ = std::make_unique<KvCacheManager>(pool);
    scheduler_ = std::make_unique<Scheduler>(config, *cache_);
  }

  Status TryAdd(std::vector<int32_t> prompt, StopConditions stop = {}) {
    auto r = std::make_unique<Request>();
    r->id = next_id_++;
    r->prompt_token_ids = std::move(prompt);
    r->stop = std::move(stop);
    ids_.push_back(r->id);
    return scheduler_->AddRequest(std::move(r));
  }

  // Adds a request whose prompt is `prompt_len` tokens no other request shares; returns its id.
  int64_t Add(int64_t prompt_len, StopConditions stop = {}) {
    std::vector<int32_t> prompt(prompt_len);
    for (int64_t i = 0; i < prompt_len; ++i) {
      prompt[i] = static_cast<int32_t>(next_id_ * 100000 + 100 + i);
    }
    return AddPrompt(std::move(prompt), std::move(stop));
  }

  int64_t AddPrompt(std::vector<int32_t> prompt, StopConditions stop = {}) {
    const int64_t id = next_id_;
    const Status status = TryAdd(std::move(prompt), std::move(stop));
    EXPECT_TRUE(status.ok()) << status.ToString();
    return id;
  }

  const Request& Get(int64_t id) const {
    const Request* r = scheduler_->Find(id);
    CHECK(r != nullptr) << "no request " << id;
    return *r;
  }

  // One engine step: schedule; "run the model", where every chunk that reaches the end of its
  // request's tokens samples `token` and partial prefill chunks sample nothing; apply outputs.
  const SchedulerOutput& Step(int32_t token = kFiller) {
    const SchedulerOutput& out = scheduler_->Schedule();
    sampled_.clear();
    for (const ScheduledRequest& s : out.scheduled) {
      const bool reaches_end = s.first_pos + s.num_new_tokens == s.request->num_tokens();
      sampled_.push_back(reaches_end ? token : -1);
    }
    scheduler_->Update(out, FromSampled(sampled_.data(), out.scheduled.size()));
    return out;
  }

  // Every test ends with nothing held: finished requests freed everything, and aborting the
  // unfinished ones frees the rest.
  void TearDown() override {
    if (!scheduler_) return;
    for (const int64_t id : ids_) scheduler_->Abort(id);
    EXPECT_FALSE(scheduler_->HasUnfinished());
    EXPECT_EQ(cache_->num_used_blocks(), 0) << "blocks leaked";
    EXPECT_EQ(cache_->num_used_state_slots(), 0) << "state slots leaked";
  }

  std::unique_ptr<KvCacheManager> cache_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<int64_t> ids_;
  std::vector<int32_t> sampled_;
  int64_t next_id_ = 1;
};

// ---- budget, chunking, order ------------------------------------------------------------------

TEST_F(SchedulerTest, TokenBudgetIsSplitAcrossRequests) {
  Make(Config(100), Pool(100));
  const int64_t a = Add(40), b = Add(40), c = Add(40);

  const SchedulerOutput& first = Step();
  EXPECT_EQ(Chunks(first), (std::vector<Chunk>{{a, 40}, {b, 40}, {c, 20}}));
  EXPECT_EQ(first.total_num_scheduled_tokens, 100);
  for (const ScheduledRequest& s : first.scheduled) EXPECT_TRUE(s.fresh);
  EXPECT_EQ(Get(c).num_computed_tokens, 20);
  EXPECT_EQ(Get(c).num_output_tokens(), 0);  // partial prefill: nothing sampled

  const SchedulerOutput& second = Step();
  EXPECT_EQ(Chunks(second), (std::vector<Chunk>{{a, 1}, {b, 1}, {c, 20}}));
  EXPECT_EQ(second.total_num_scheduled_tokens, 22);
  for (const ScheduledRequest& s : second.scheduled) EXPECT_FALSE(s.fresh);
  EXPECT_EQ(second.scheduled[2].first_pos, 20);
  EXPECT_EQ(Get(c).num_output_tokens(), 1);
}

TEST_F(SchedulerTest, ChunkedPrefillContinuesOverSteps) {
  Make(Config(32), Pool(100));
  const int64_t a = Add(100, MaxTokens(2));
  for (int64_t first_pos : {0, 32, 64}) {
    const SchedulerOutput& out = Step();
    ASSERT_EQ(out.scheduled.size(), 1u);
    EXPECT_EQ(out.scheduled[0].first_pos, first_pos);
    EXPECT_EQ(out.scheduled[0].num_new_tokens, 32);
    EXPECT_EQ(out.scheduled[0].fresh, first_pos == 0);
    EXPECT_EQ(Get(a).num_output_tokens(), 0);
  }
  const SchedulerOutput& last_chunk = Step();
  EXPECT_EQ(last_chunk.scheduled[0].first_pos, 96);
  EXPECT_EQ(last_chunk.scheduled[0].num_new_tokens, 4);
  EXPECT_EQ(Get(a).num_output_tokens(), 1);

  const SchedulerOutput& decode = Step();
  EXPECT_EQ(decode.scheduled[0].first_pos, 100);
  EXPECT_EQ(decode.scheduled[0].num_new_tokens, 1);
  EXPECT_TRUE(Get(a).finished());
  EXPECT_EQ(Get(a).finish_reason, FinishReason::kLength);
}

TEST_F(SchedulerTest, RunningRequestsComeBeforeWaitingOnes) {
  Make(Config(50), Pool(100));
  const int64_t a = Add(200);
  const int64_t b = Add(10);  // queued from the start, but a keeps the budget while it prefills
  for (int step = 0; step < 4; ++step) {
    EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{a, 50}}));
  }
  EXPECT_EQ(scheduler_->num_waiting(), 1);
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{a, 1}, {b, 10}}));
  EXPECT_EQ(scheduler_->num_running(), 2);
}

TEST_F(SchedulerTest, MaxNumSeqsCapsTheRunningSet) {
  Make(Config(1000, /*max_num_seqs=*/2), Pool(100));
  const int64_t a = Add(10, MaxTokens(1)), b = Add(10, MaxTokens(1)), c = Add(10, MaxTokens(1));
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{a, 10}, {b, 10}}));
  EXPECT_EQ(scheduler_->num_waiting(), 1);
  const SchedulerOutput& second = Step();  // a and b finished: c starts
  EXPECT_EQ(Chunks(second), (std::vector<Chunk>{{c, 10}}));
  EXPECT_EQ(second.finished_ids, (std::vector<int64_t>{a, b}));
}

TEST_F(SchedulerTest, WaitingRequestsStartInArrivalOrder) {
  Make(Config(2048), Pool(10));
  const int64_t a = Add(128, MaxTokens(1));  // 8 of the 10 blocks
  const int64_t b = Add(64);                 // needs 4: must wait for a
  const int64_t c = Add(16);                 // would fit, but does not overtake b
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{a, 128}}));
  EXPECT_EQ(scheduler_->num_waiting(), 2);
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{b, 64}, {c, 16}}));
}

// ---- preemption -------------------------------------------------------------------------------

TEST_F(SchedulerTest, PreemptsTheLastRunningRequestWhenBlocksRunOut) {
  Make(Config(1000), Pool(4, /*block_size=*/4));
  const int64_t a = Add(4, MaxTokens(10)), b = Add(4, MaxTokens(10)), c = Add(4, MaxTokens(10));
  Step();  // one full block each; each sampled a token at position 4
  EXPECT_EQ(cache_->num_used_blocks(), 3);

  // a takes the last free block for position 4; b finds none and preempts c, the last running.
  const SchedulerOutput& out = Step();
  EXPECT_EQ(Chunks(out), (std::vector<Chunk>{{a, 1}, {b, 1}}));
  EXPECT_EQ(out.preempted_ids, (std::vector<int64_t>{c}));
  const Request& victim = Get(c);
  EXPECT_EQ(victim.status, RequestStatus::kPreempted);
  EXPECT_EQ(victim.num_computed_tokens, 0);
  EXPECT_EQ(victim.num_preemptions, 1);
  EXPECT_TRUE(victim.block_ids.empty());
  EXPECT_EQ(victim.num_output_tokens(), 1);  // outputs are kept and recomputed
  EXPECT_EQ(scheduler_->num_waiting(), 1);

  // Still no room for c (it needs 2 blocks now).
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{a, 1}, {b, 1}}));

  // Once a leaves, c resumes from position 0 (prompt and its earlier output) as a fresh row.
  ASSERT_TRUE(scheduler_->Abort(a));
  const SchedulerOutput& resumed = Step();
  EXPECT_EQ(Chunks(resumed), (std::vector<Chunk>{{b, 1}, {c, 5}}));
  EXPECT_EQ(resumed.scheduled[1].first_pos, 0);
  EXPECT_TRUE(resumed.scheduled[1].fresh);
  EXPECT_EQ(Get(c).status, RequestStatus::kRunning);
  EXPECT_EQ(Get(c).num_output_tokens(), 2);
}

TEST_F(SchedulerTest, TheRequestAskingForBlocksMayBeTheVictim) {
  Make(Config(1000), Pool(3, /*block_size=*/4));
  const int64_t a = Add(6, MaxTokens(3)), b = Add(4, MaxTokens(3));
  Step();  // a: 2 blocks, b: 1 block; the pool is full
  // a's next position fits its blocks; b needs a block, and the last running request is b.
  const SchedulerOutput& out = Step();
  EXPECT_EQ(Chunks(out), (std::vector<Chunk>{{a, 1}}));
  EXPECT_EQ(out.preempted_ids, (std::vector<int64_t>{b}));
  EXPECT_EQ(Get(b).status, RequestStatus::kPreempted);
  EXPECT_EQ(scheduler_->num_running(), 1);
}

TEST_F(SchedulerTest, NoWaitingRequestStartsInAStepThatPreempted) {
  Make(Config(9), Pool(5, /*block_size=*/4));
  const int64_t a = Add(3, MaxTokens(8));
  const int64_t v = Add(16, MaxTokens(1));
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{a, 3}, {v, 6}}));
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{a, 1}, {v, 8}}));  // the pool is full
  // a needs a block for position 4 and preempts v. v's 4 blocks would hold its next 8-token
  // chunk, but memory is short this step: it waits (vLLM).
  const SchedulerOutput& out = Step();
  EXPECT_EQ(Chunks(out), (std::vector<Chunk>{{a, 1}}));
  EXPECT_EQ(out.preempted_ids, (std::vector<int64_t>{v}));
  const SchedulerOutput& next = Step();
  EXPECT_EQ(Chunks(next), (std::vector<Chunk>{{a, 1}, {v, 8}}));
  EXPECT_EQ(next.scheduled[1].first_pos, 0);
}

// ---- abort and release ------------------------------------------------------------------------

TEST_F(SchedulerTest, AbortsAWaitingRequest) {
  Make(Config(10), Pool(100));
  const int64_t a = Add(10), b = Add(10);
  Step();  // a takes the whole budget; b waits
  ASSERT_EQ(scheduler_->num_waiting(), 1);
  EXPECT_TRUE(scheduler_->Abort(b));
  EXPECT_EQ(scheduler_->num_waiting(), 0);
  EXPECT_TRUE(Get(b).finished());
  EXPECT_EQ(Get(b).finish_reason, FinishReason::kAbort);
  EXPECT_STREQ(FinishReasonName(Get(b).finish_reason), "abort");
  EXPECT_FALSE(scheduler_->Abort(b));    // already finished
  EXPECT_FALSE(scheduler_->Abort(999));  // unknown

  EXPECT_EQ(Step().finished_ids, (std::vector<int64_t>{b}));
  EXPECT_TRUE(Step().finished_ids.empty());  // reported once
  EXPECT_EQ(Get(a).status, RequestStatus::kRunning);
}

TEST_F(SchedulerTest, AbortsARunningRequestAndFreesItsBlocks) {
  Make(Config(1000), Pool(100));
  const int64_t a = Add(40), b = Add(20);
  Step();
  EXPECT_EQ(cache_->num_used_blocks(), 5);  // a: 3 blocks of 16, b: 2
  EXPECT_TRUE(scheduler_->Abort(a));
  EXPECT_EQ(cache_->num_used_blocks(), 2);
  EXPECT_TRUE(Get(a).block_ids.empty());
  EXPECT_EQ(scheduler_->num_running(), 1);
  const SchedulerOutput& out = Step();
  EXPECT_EQ(out.finished_ids, (std::vector<int64_t>{a}));
  EXPECT_EQ(Chunks(out), (std::vector<Chunk>{{b, 1}}));
}

TEST_F(SchedulerTest, AbortsAPreemptedRequest) {
  Make(Config(1000), Pool(4, /*block_size=*/4));
  Add(4, MaxTokens(10));
  Add(4, MaxTokens(10));
  const int64_t c = Add(4, MaxTokens(10));
  Step();
  ASSERT_EQ(Step().preempted_ids, (std::vector<int64_t>{c}));
  EXPECT_TRUE(scheduler_->Abort(c));
  EXPECT_EQ(scheduler_->num_waiting(), 0);
  EXPECT_EQ(Get(c).finish_reason, FinishReason::kAbort);
  EXPECT_EQ(cache_->num_used_blocks(), 4);  // a and b, 2 blocks each
}

TEST_F(SchedulerTest, AbortBetweenScheduleAndUpdateDropsTheStepsToken) {
  Make(Config(1000), Pool(100));
  const int64_t a = Add(10), b = Add(10);
  const SchedulerOutput& out = scheduler_->Schedule();
  ASSERT_EQ(out.scheduled.size(), 2u);
  ASSERT_TRUE(scheduler_->Abort(a));
  scheduler_->Release(a);  // the output still points at a: released at the next Schedule()
  EXPECT_NE(scheduler_->Find(a), nullptr);

  const int32_t sampled[] = {kFiller, kFiller};
  const std::vector<Request*>& updated = scheduler_->Update(out, FromSampled(sampled, 2));
  ASSERT_EQ(updated.size(), 1u);
  EXPECT_EQ(updated[0]->id, b);
  EXPECT_EQ(Get(a).num_output_tokens(), 0);

  EXPECT_EQ(scheduler_->Schedule().finished_ids, (std::vector<int64_t>{a}));
  EXPECT_EQ(scheduler_->Find(a), nullptr);
}

TEST_F(SchedulerTest, FinishedRequestsStayUntilReleased) {
  Make(Config(1000), Pool(100));
  const int64_t a = Add(10, MaxTokens(1));
  Step();
  ASSERT_TRUE(Get(a).finished());
  scheduler_->Release(a);  // still in the output of the step that finished it
  Step();
  EXPECT_EQ(scheduler_->Find(a), nullptr);

  const int64_t b = Add(10, MaxTokens(1));
  Step();
  Step();  // b is in no output now: released at once
  scheduler_->Release(b);
  EXPECT_EQ(scheduler_->Find(b), nullptr);
}

// ---- admission --------------------------------------------------------------------------------

TEST_F(SchedulerTest, RejectsAPromptLongerThanMaxModelLen) {
  Make(Config(1000, 64, /*max_model_len=*/64), Pool(100));
  const Status status = TryAdd(std::vector<int32_t>(65, 7));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "The prompt (65 tokens) is longer than the maximum model length of 64");
  EXPECT_EQ(scheduler_->num_waiting(), 0);
  EXPECT_TRUE(TryAdd(std::vector<int32_t>(64, 7)).ok());  // exactly max_model_len is fine
}

TEST_F(SchedulerTest, RejectsInvalidRequests) {
  Make(Config(1000, 64, /*max_model_len=*/64), Pool(3));
  const auto expect_rejected = [](const Status& status, const std::string& needle) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << "expected an error with " << needle;
    EXPECT_NE(status.message().find(needle), std::string::npos) << status.message();
  };
  expect_rejected(TryAdd({}), "prompt is empty");
  expect_rejected(TryAdd({1, 2}, MaxTokens(0)), "max_tokens");
  StopConditions min_over_max = MaxTokens(2);
  min_over_max.min_tokens = 3;
  expect_rejected(TryAdd({1, 2}, min_over_max), "min_tokens");
  // 40 + 10 tokens need 4 blocks of 16; the pool has 3.
  expect_rejected(TryAdd(std::vector<int32_t>(40, 1), MaxTokens(10)), "KV cache is too small");
  // Counted up to max_model_len: 20 + 1000 tokens are at most 64.
  expect_rejected(TryAdd(std::vector<int32_t>(20, 1), MaxTokens(1000)), "64 tokens need 4 blocks");
  EXPECT_TRUE(TryAdd(std::vector<int32_t>(20, 1), MaxTokens(28)).ok());

  auto duplicate = std::make_unique<Request>();
  duplicate->id = ids_.back();
  duplicate->prompt_token_ids = {1};
  expect_rejected(scheduler_->AddRequest(std::move(duplicate)), "already in use");
  EXPECT_EQ(scheduler_->num_waiting(), 1);
}

// ---- stop conditions --------------------------------------------------------------------------

class StopTest : public SchedulerTest {
 protected:
  // Runs one request, sampling `tokens` in turn, until it finishes or the tokens run out.
  const Request& Generate(StopConditions stop, const std::vector<int32_t>& tokens,
                          int64_t prompt_len = 8, int64_t max_model_len = 4096) {
    Make(Config(1000, 64, max_model_len), Pool(100));
    const int64_t id = Add(prompt_len, std::move(stop));
    for (const int32_t token : tokens) {
      if (Get(id).finished()) break;
      Step(token);
    }
    return Get(id);
  }

  static StopConditions WithEos(int64_t max_tokens = 16) {
    StopConditions stop = MaxTokens(max_tokens);
    stop.eos_token_ids = {kEos};
    return stop;
  }
};

TEST_F(StopTest, EosStops) {
  const Request& r = Generate(WithEos(), {kFiller, kEos, kFiller});
  EXPECT_EQ(r.output_token_ids, (std::vector<int32_t>{kFiller, kEos}));
  EXPECT_EQ(r.finish_reason, FinishReason::kStop);
  EXPECT_STREQ(FinishReasonName(r.finish_reason), "stop");
  EXPECT_EQ(Step().finished_ids, (std::vector<int64_t>{r.id}));
}

TEST_F(StopTest, IgnoreEosKeepsGoingUntilMaxTokens) {
  StopConditions stop = WithEos(/*max_tokens=*/3);
  stop.ignore_eos = true;
  const Request& r = Generate(stop, {kEos, kEos, kEos, kEos});
  EXPECT_EQ(r.output_token_ids, (std::vector<int32_t>{kEos, kEos, kEos}));
  EXPECT_EQ(r.finish_reason, FinishReason::kLength);
  EXPECT_STREQ(FinishReasonName(r.finish_reason), "length");
}

TEST_F(StopTest, StopTokenIdsStopEvenWithIgnoreEos) {
  StopConditions stop = WithEos();
  stop.ignore_eos = true;
  stop.stop_token_ids = {42};
  const Request& r = Generate(stop, {kFiller, 42, kFiller});
  EXPECT_EQ(r.output_token_ids, (std::vector<int32_t>{kFiller, 42}));
  EXPECT_EQ(r.finish_reason, FinishReason::kStop);
}

TEST_F(StopTest, MinTokensHoldsOffEosButKeepsTheToken) {
  StopConditions stop = WithEos();
  stop.min_tokens = 3;
  stop.stop_token_ids = {42};
  const Request& r = Generate(stop, {kEos, 42, kEos, kFiller});
  EXPECT_EQ(r.output_token_ids, (std::vector<int32_t>{kEos, 42, kEos}));
  EXPECT_EQ(r.finish_reason, FinishReason::kStop);
}

TEST_F(StopTest, MaxTokensStopsWithLength) {
  const Request& r = Generate(WithEos(/*max_tokens=*/2), {kFiller, kFiller, kFiller});
  EXPECT_EQ(r.num_output_tokens(), 2);
  EXPECT_EQ(r.finish_reason, FinishReason::kLength);
}

TEST_F(StopTest, MaxModelLenStopsWithLength) {
  const Request& r = Generate(WithEos(), std::vector<int32_t>(10, kFiller), /*prompt_len=*/10,
                              /*max_model_len=*/12);
  EXPECT_EQ(r.num_tokens(), 12);
  EXPECT_EQ(r.finish_reason, FinishReason::kLength);
}

TEST_F(StopTest, MaxModelLenIsAHardLimitEvenBeforeMinTokens) {
  StopConditions stop = WithEos(/*max_tokens=*/5);
  stop.min_tokens = 5;
  const Request& r = Generate(stop, std::vector<int32_t>(10, kFiller), /*prompt_len=*/10,
                              /*max_model_len=*/12);
  EXPECT_EQ(r.num_tokens(), 12);
  EXPECT_EQ(r.finish_reason, FinishReason::kLength);
}

// ---- prefill alignment (hybrid models) --------------------------------------------------------

SchedulerConfig Aligned(int64_t max_num_batched_tokens, int64_t long_prefill_token_threshold = 0) {
  SchedulerConfig config = Config(max_num_batched_tokens);
  config.prefill_alignment = 64;
  config.long_prefill_token_threshold = long_prefill_token_threshold;
  return config;
}

TEST_F(SchedulerTest, PrefillChunksEndAtAlignedPositions) {
  Make(Aligned(100), Pool(100));
  const int64_t a = Add(200);
  // Ends 64 and 128, not 100 and 200 - 72: then the last chunk reaches the end, uncut.
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{a, 64}}));
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{a, 64}}));
  const SchedulerOutput& last = Step();
  EXPECT_EQ(last.scheduled[0].first_pos, 128);
  EXPECT_EQ(last.scheduled[0].num_new_tokens, 72);
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{a, 1}}));
}

TEST_F(SchedulerTest, ARequestWhoseAlignedChunkIsEmptyWaits) {
  Make(Aligned(100), Pool(100));
  const int64_t a = Add(40);
  const int64_t b = Add(200);  // 60 tokens of budget left: its chunk would end at 0
  const int64_t c = Add(10);   // fits, but does not overtake b
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{a, 40}}));
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{a, 1}, {b, 64}, {c, 10}}));
}

TEST_F(SchedulerTest, ARunningPrefillWithAnEmptyAlignedChunkIsSkipped) {
  Make(Aligned(130, /*long_prefill_token_threshold=*/100), Pool(200));
  const int64_t x = Add(164), p = Add(1000), y = Add(2);
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{x, 64}, {p, 64}, {y, 2}}));
  // x's last chunk (100, uncut) leaves p 30 tokens: nothing aligned; y behind p still runs.
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{x, 100}, {y, 1}}));
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{x, 1}, {p, 64}, {y, 1}}));
}

// ---- prefix caching ---------------------------------------------------------------------------

TEST_F(SchedulerTest, ARepeatedPromptStartsAfterItsCachedPrefix) {
  Make(Config(1000), Pool(100, 16, /*prefix_caching=*/true));
  std::vector<int32_t> prompt(53);
  for (int32_t i = 0; i < 53; ++i) prompt[i] = 1000 + i;
  const int64_t a = AddPrompt(prompt, MaxTokens(1));
  Step();
  ASSERT_TRUE(Get(a).finished());
  EXPECT_EQ(Get(a).num_cached_tokens, 0);

  const int64_t b = AddPrompt(prompt, MaxTokens(1));
  const SchedulerOutput& out = Step();
  ASSERT_EQ(Chunks(out), (std::vector<Chunk>{{b, 5}}));
  EXPECT_EQ(out.scheduled[0].first_pos, 48);
  EXPECT_TRUE(out.scheduled[0].fresh);
  EXPECT_EQ(Get(b).num_cached_tokens, 48);

  // Exactly 48 tokens: the last one is recomputed, so only 2 of the 3 blocks are reused.
  const int64_t c = AddPrompt(std::vector<int32_t>(prompt.begin(), prompt.begin() + 48));
  const SchedulerOutput& exact = Step();
  ASSERT_EQ(Chunks(exact), (std::vector<Chunk>{{c, 16}}));
  EXPECT_EQ(Get(c).num_cached_tokens, 32);
}

TEST_F(SchedulerTest, APreemptedRequestResumesFromItsCachedBlocks) {
  Make(Config(1000), Pool(5, /*block_size=*/4, /*prefix_caching=*/true));
  const int64_t a = Add(4, MaxTokens(3)), b = Add(4, MaxTokens(3)), c = Add(8, MaxTokens(3));
  Step();  // 4 of 5 blocks; c's 2 blocks are cached
  // a takes the last block; b preempts c and takes c's tail block (freed first), evicting it.
  ASSERT_EQ(Step().preempted_ids, (std::vector<int64_t>{c}));
  // c finds its first block, but the other 2 it needs are not free: it gives the block back.
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{a, 1}, {b, 1}}));
  ASSERT_TRUE(Get(a).finished() && Get(b).finished());

  const SchedulerOutput& resumed = Step();
  ASSERT_EQ(Chunks(resumed), (std::vector<Chunk>{{c, 5}}));  // 8 prompt + 1 output - 4 cached
  EXPECT_EQ(resumed.scheduled[0].first_pos, 4);
  EXPECT_TRUE(resumed.scheduled[0].fresh);
  EXPECT_EQ(Get(c).num_cached_tokens, 0);  // recorded at the first schedule only
  EXPECT_EQ(Get(c).num_preemptions, 1);
}

// ---- GDN state slots --------------------------------------------------------------------------

TEST_F(SchedulerTest, HybridRequestsWaitForAStateSlot) {
  KvCacheConfig pool = Pool(100);
  pool.num_state_slots = 2;
  Make(Config(1000), pool);
  const int64_t a = Add(10, MaxTokens(2)), b = Add(10, MaxTokens(2)), c = Add(10, MaxTokens(2));
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{a, 10}, {b, 10}}));
  EXPECT_EQ(Get(a).state_slot, 0);
  EXPECT_EQ(Get(b).state_slot, 1);
  EXPECT_EQ(Get(c).state_slot, -1);
  EXPECT_EQ(cache_->num_used_blocks(), 2);  // c took nothing
  Step();  // a and b finish
  EXPECT_EQ(cache_->num_used_state_slots(), 0);
  EXPECT_EQ(Chunks(Step()), (std::vector<Chunk>{{c, 10}}));
  EXPECT_GE(Get(c).state_slot, 0);
}

// ---- invariants under random traffic ----------------------------------------------------------

struct TrafficCase {
  const char* name;
  int64_t prefill_alignment;
  int64_t num_state_slots;
  bool prefix_caching;
};

class RandomTrafficTest : public SchedulerTest,
                          public ::testing::WithParamInterface<TrafficCase> {};

// Random arrivals, stops and aborts over a small pool. Every step must respect the budget, the
// sequence cap and the alignment, chunks must continue where each request left off, and all
// requests must eventually finish.
TEST_P(RandomTrafficTest, KeepsEveryInvariant) {
  const TrafficCase& tc = GetParam();
  SchedulerConfig config = Config(192, /*max_num_seqs=*/6, /*max_model_len=*/512);
  config.prefill_alignment = tc.prefill_alignment;
  KvCacheConfig pool = Pool(48, 16, tc.prefix_caching);
  pool.num_state_slots = tc.num_state_slots;
  Make(config, pool);

  std::mt19937 rng(7);
  std::vector<int32_t> shared_prefix(64);
  for (int32_t& t : shared_prefix) t = static_cast<int32_t>(rng() % 1000) + 10;
  int64_t preemptions = 0;
  constexpr int kArrivalSteps = 2000;
  for (int step = 0; step < 2 * kArrivalSteps; ++step) {
    if (step < kArrivalSteps && rng() % 5 == 0) {
      // Half the prompts share a prefix, so the prefix cache gets hits.
      std::vector<int32_t> prompt(1 + rng() % 300);
      for (size_t i = 0; i < prompt.size(); ++i) {
        prompt[i] = i < shared_prefix.size() && rng() % 2 ? shared_prefix[i]
                                                          : static_cast<int32_t>(rng() % 1000) + 10;
      }
      StopConditions stop = MaxTokens(1 + rng() % 40);
      stop.eos_token_ids = {kEos};
      (void)TryAdd(std::move(prompt), std::move(stop));  // some are too large: fine
    }
    if (rng() % 50 == 0) scheduler_->Abort(ids_[rng() % ids_.size()]);

    const SchedulerOutput& out = scheduler_->Schedule();
    preemptions += static_cast<int64_t>(out.preempted_ids.size());
    ASSERT_LE(out.total_num_scheduled_tokens, config.max_num_batched_tokens);
    ASSERT_LE(scheduler_->num_running(), config.max_num_seqs);
    int64_t total = 0;
    std::set<int64_t> seen;
    sampled_.clear();
    for (const ScheduledRequest& s : out.scheduled) {
      const Request& r = *s.request;
      ASSERT_TRUE(seen.insert(r.id).second);
      ASSERT_GE(s.num_new_tokens, 1);
      ASSERT_EQ(r.num_computed_tokens, s.first_pos + s.num_new_tokens);
      ASSERT_LE(r.num_computed_tokens, r.num_tokens());
      ASSERT_EQ(static_cast<int64_t>(r.block_ids.size()),
                (r.num_computed_tokens + pool.block_size - 1) / pool.block_size);
      const int64_t end = s.first_pos + s.num_new_tokens;
      if (end < r.num_tokens()) {
        ASSERT_EQ(end % tc.prefill_alignment, 0) << "unaligned chunk end " << end;
      }
      if (!s.fresh) {
        ASSERT_GT(s.first_pos, 0);
      }
      total += s.num_new_tokens;
      sampled_.push_back(end == r.num_tokens() ? (rng() % 20 == 0 ? kEos : kFiller) : -1);
    }
    ASSERT_EQ(total, out.total_num_scheduled_tokens);
    scheduler_->Update(out, FromSampled(sampled_.data(), out.scheduled.size()));
    if (step >= kArrivalSteps && !scheduler_->HasUnfinished()) break;
  }
  EXPECT_FALSE(scheduler_->HasUnfinished()) << "requests starved";
  EXPECT_GT(preemptions, 0) << "the pool was never short: the test lost its point";
  if (tc.prefix_caching) {
    EXPECT_GT(cache_->prefix_cache_hits(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, RandomTrafficTest,
                         ::testing::Values(TrafficCase{"attention_prefix_cached", 1, 0, true},
                                           TrafficCase{"hybrid_aligned", 64, 4, false}),
                         [](const ::testing::TestParamInfo<TrafficCase>& info) {
                           return info.param.name;
                         });

// ---- no allocation in a steady decode step ----------------------------------------------------

class SteadyDecodeTest : public SchedulerTest, public ::testing::WithParamInterface<bool> {};

TEST_P(SteadyDecodeTest, AllocatesNothing) {
  const bool hybrid = GetParam();
  constexpr int kRequests = 8;
  KvCacheConfig pool = Pool(200, 16, /*prefix_caching=*/!hybrid);
  pool.num_state_slots = hybrid ? kRequests : 0;
  Make(Config(2048, /*max_num_seqs=*/kRequests), pool);
  for (int i = 0; i < kRequests; ++i) Add(10, MaxTokens(1000));
  Step();  // prefill
  Step();  // first decode
  const std::vector<int32_t> sampled(kRequests, kFiller);
  const StepOutput outputs = FromSampled(sampled.data(), kRequests);

  // Positions 11 to 60: every request crosses block boundaries at 16, 32 and 48.
  const int64_t before = HeapAllocations();
  for (int step = 0; step < 50; ++step) {
    const SchedulerOutput& out = scheduler_->Schedule();
    scheduler_->Update(out, outputs);
  }
  const int64_t allocations = HeapAllocations() - before;
  EXPECT_EQ(allocations, 0);

  EXPECT_EQ(scheduler_->num_running(), kRequests);
  for (const int64_t id : ids_) {
    EXPECT_EQ(Get(id).num_output_tokens(), 52);
    EXPECT_EQ(Get(id).block_ids.size(), 4u);
  }
  if (!hybrid) {
    EXPECT_EQ(cache_->num_cached_blocks(), 3 * kRequests);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, SteadyDecodeTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "hybrid" : "attention_prefix_cached";
                         });

TEST(HeapCounterTest, CountsAllocations) {
  const int64_t before = HeapAllocations();
  auto v = std::make_unique<std::vector<int>>(100);
  EXPECT_EQ(v->size(), 100u);
  EXPECT_GE(HeapAllocations() - before, 2);
}

}  // namespace
}  // namespace moeserve::engine
