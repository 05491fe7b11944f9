// EngineLoop under concurrent handlers (no HTTP): eight threads submit greedy requests, some
// abort theirs midway, one submits past the waiting bound; every finished request gives the
// tokens it gives alone, aborted ones end as aborted, the loop ends idle, and StopAccepting /
// WaitUntilIdle / Stop shut it down. Also run under ThreadSanitizer in CI.
#include "server/engine_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "model/causal_lm.h"

namespace moeserve::server {
namespace {

const std::string kTinyDir = MOESERVE_SHARED_DIR "/testdata/tiny-qwen3next";

std::vector<int32_t> Prompt(int i) {
  std::vector<int32_t> p(5 + 3 * i);
  for (size_t j = 0; j < p.size(); ++j) p[j] = static_cast<int32_t>((i * 31 + j * 7) % 500);
  return p;
}

engine::SamplingParams Greedy(int64_t max_tokens) {
  engine::SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// Reads a channel until every choice finished; returns choice 0's tokens and finish reason.
std::pair<std::vector<int32_t>, engine::FinishReason> Drain(Channel& channel,
                                                            size_t num_choices = 1) {
  std::vector<int32_t> tokens;
  engine::FinishReason reason = engine::FinishReason::kNone;
  size_t finished = 0;
  std::vector<ChoiceUpdate> updates;
  while (finished < num_choices) {
    const Status s = channel.Wait(std::chrono::milliseconds(50), &updates);
    if (!s.ok()) return {tokens, engine::FinishReason::kNone};
    for (size_t c = 0; c < updates.size(); ++c) {
      if (c == 0) tokens.insert(tokens.end(), updates[c].tokens.begin(), updates[c].tokens.end());
      if (updates[c].finished) {
        ++finished;
        if (c == 0) reason = updates[c].finish_reason;
      }
    }
  }
  return {tokens, reason};
}

TEST(EngineLoopTest, ConcurrentHandlersGetWhatTheyGetAlone) {
  Result<std::unique_ptr<model::CausalLm>> lm =
      model::CausalLm::Load(kTinyDir, {.weight_dtype = std::nullopt, .threads = 1});
  ASSERT_TRUE(lm.ok());
  auto make_loop = [&] {
    Result<std::unique_ptr<engine::Engine>> engine = engine::Engine::Create(
        **lm, {.max_num_seqs = 4, .max_num_batched_tokens = 128, .max_model_len = 128});
    EXPECT_TRUE(engine.ok());
    return std::make_unique<EngineLoop>(std::move(*engine));
  };
  constexpr int kThreads = 8;
  std::vector<std::vector<int32_t>> alone(kThreads);
  {
    auto loop = make_loop();
    for (int i = 0; i < kThreads; ++i) {
      alone[i] = Drain(*loop->Submit({{Prompt(i), Greedy(20)}})).first;
      ASSERT_EQ(alone[i].size(), 20u);
    }
  }

  auto loop = make_loop();
  std::atomic<int> mismatches{0}, aborted{0}, refused{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 3; ++round) {
        std::shared_ptr<Channel> channel = loop->Submit({{Prompt(i), Greedy(20)}});
        if (i % 4 == 3 && round == 1) {  // a client gone midway
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          loop->Abort(channel);
          if (Drain(*channel).second == engine::FinishReason::kAbort) ++aborted;
          continue;
        }
        const auto [tokens, reason] = Drain(*channel);
        if (tokens != alone[i] || reason != engine::FinishReason::kLength) ++mismatches;
      }
      // One more with n = 2 choices past a waiting bound of 1: refused or served, never stuck.
      std::shared_ptr<Channel> bounded =
          loop->Submit({{Prompt(i), Greedy(4)}, {Prompt(i), Greedy(4)}}, /*max_waiting=*/1);
      if (!bounded->error().ok()) {
        ++refused;
      } else {
        Drain(*bounded, 2);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(refused.load(), kThreads);  // two choices never fit a bound of one
  EXPECT_LE(aborted.load(), 2);         // an abort may come after the end

  loop->StopAccepting();
  EXPECT_FALSE(loop->Submit({{Prompt(0), Greedy(2)}})->error().ok());
  EXPECT_TRUE(loop->WaitUntilIdle(std::chrono::seconds(10)));
  loop->Stop();
  EXPECT_TRUE(loop->healthy());
}

}  // namespace
}  // namespace moeserve::server
