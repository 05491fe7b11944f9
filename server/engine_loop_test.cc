// EngineLoop under concurrent handlers (no HTTP): eight threads submit greedy requests, some
// abort theirs midway, one submits past the waiting bound; every finished request gives the
// tokens it gives alone, aborted ones end as aborted, the loop ends idle, and StopAccepting /
// WaitUntilIdle / Stop shut it down. Also run under ThreadSanitizer in CI.
#include "server/engine_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "model/causal_lm.h"
#include "core/test_paths.h"

namespace moeserve::server {
namespace {

const std::string kTinyDir = MOESERVE_TESTDATA_DIR + "/tiny-qwen3next";

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

// The engine requests of one API request over `prompts` (n choices each), made on this thread.
std::vector<ChoiceInput> Choices(const EngineLoop& loop, std::vector<std::vector<int32_t>> prompts,
                                 engine::SamplingParams params) {
  Result<std::shared_ptr<const engine::PreparedParams>> prepared =
      loop.engine().PrepareParams(std::move(params));
  EXPECT_TRUE(prepared.ok()) << prepared.status().ToString();
  return PrepareChoices(loop.engine(), *prepared, prompts);
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
      alone[i] = Drain(*loop->Submit(Choices(*loop, {Prompt(i)}, Greedy(20)))).first;
      ASSERT_EQ(alone[i].size(), 20u);
    }
  }

  auto loop = make_loop();
  std::atomic<int> mismatches{0}, aborted{0}, refused{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 3; ++round) {
        std::shared_ptr<Channel> channel = loop->Submit(Choices(*loop, {Prompt(i)}, Greedy(20)));
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
          loop->Submit(Choices(*loop, {Prompt(i), Prompt(i)}, Greedy(4)), /*max_waiting=*/1);
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
  EXPECT_FALSE(loop->Submit(Choices(*loop, {Prompt(0)}, Greedy(2)))->error().ok());
  EXPECT_TRUE(loop->WaitUntilIdle(std::chrono::seconds(10)));
  loop->Stop();
  EXPECT_TRUE(loop->healthy());
}

// Issue #31: what a request costs to prepare -- validation, de-duplication, its choices'
// samplers with their [vocab] arrays -- is paid by the thread that prepares it (a handler's), and
// the loop only queues what it is given. The largest request the server lets through -- 64
// choices, each with a bias for every token of the vocabulary and the penalties and top-p that
// give a sampler all its per-token state -- is admitted while a small greedy request decodes
// alone (one sequence at a time: the large one waits), and the small one takes about as long
// as it takes alone. (Before, the loop de-duplicated each choice's biases in quadratic time,
// and no request got a token meanwhile.)
TEST(EngineLoopTest, AdmittingALargeRequestDoesNotStallTheLoop) {
  Result<std::unique_ptr<model::CausalLm>> lm = model::CausalLm::Load(
      MOESERVE_DEFAULT_MODEL_DIR, {.weight_dtype = std::nullopt, .threads = 1});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  Result<std::unique_ptr<engine::Engine>> engine = engine::Engine::Create(
      **lm, {.max_num_seqs = 1, .max_num_batched_tokens = 256, .max_model_len = 256});
  ASSERT_TRUE(engine.ok());
  EngineLoop loop(std::move(*engine));
  const int64_t vocab = loop.engine().model().config().vocab_size;

  engine::SamplingParams large;
  large.n = 64;
  large.temperature = 1.0;
  large.top_p = 0.9;
  large.repetition_penalty = 1.1;
  large.frequency_penalty = 0.5;
  large.seed = 7;
  large.max_tokens = 1;
  for (int32_t id = 0; id < vocab; ++id) large.logit_bias.emplace_back(id, 0.01f * (id % 7 + 1));
  // Prepared here, as a handler does: one set of parameters and tables, 64 samplers built.
  Result<std::shared_ptr<const engine::PreparedParams>> prepared =
      loop.engine().PrepareParams(large);
  ASSERT_TRUE(prepared.ok());
  EXPECT_EQ((*prepared)->tables.logit_bias.size(), static_cast<size_t>(vocab));
  const std::vector<std::vector<int32_t>> prompts = {Prompt(2)};
  std::vector<ChoiceInput> choices = PrepareChoices(loop.engine(), *prepared, prompts);
  ASSERT_EQ(choices.size(), 64u);
  for (const ChoiceInput& c : choices) {
    ASSERT_TRUE(c.request.ok());
    EXPECT_NE((*c.request)->sampler, nullptr);                 // built on this thread
    EXPECT_EQ((*c.request)->prepared.get(), prepared->get());  // shared, not copied
  }

  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  Clock::time_point start = Clock::now();
  const auto [alone_tokens, alone_reason] =
      Drain(*loop.Submit(Choices(loop, {Prompt(1)}, Greedy(24))));
  const double alone = seconds(Clock::now() - start);
  ASSERT_EQ(alone_tokens.size(), 24u);

  start = Clock::now();
  std::shared_ptr<Channel> small = loop.Submit(Choices(loop, {Prompt(1)}, Greedy(24)));
  std::shared_ptr<Channel> big = loop.Submit(std::move(choices));
  const auto [tokens, reason] = Drain(*small);
  const double beside = seconds(Clock::now() - start);
  EXPECT_EQ(tokens, alone_tokens);
  EXPECT_EQ(reason, engine::FinishReason::kLength);
  // A wide margin: this is not a benchmark, only a check that admission is not the loop's work.
  EXPECT_LT(beside, 3 * alone + 1.0)
      << "alone " << alone << " s, beside the large request " << beside << " s";
  std::printf("small greedy request: alone %.3f s, while 64 choices were admitted %.3f s\n", alone,
              beside);
  // The large request runs too: its 64 choices end, one token each.
  std::vector<ChoiceUpdate> updates;
  size_t finished = 0;
  while (finished < 64) {
    ASSERT_TRUE(big->Wait(std::chrono::milliseconds(100), &updates).ok());
    for (const ChoiceUpdate& u : updates) finished += u.finished;
  }
  loop.Stop();
}

}  // namespace
}  // namespace moeserve::server
