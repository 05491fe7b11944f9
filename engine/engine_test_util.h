// Helpers of the engine tests over real models: loading, runs to the end with every token's
// logits, the same request alone, bit-for-bit and relative comparisons.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/check.h"
#include "engine/engine.h"
#include "model/testing.h"
#include "core/test_paths.h"

namespace moeserve::engine::test_util {

namespace fs = std::filesystem;

// Under AddressSanitizer (a Debug build, many times slower) the longest tests run a part of their
// matrix: enough to take every path once.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

inline const std::string kHybridDir = MOESERVE_TESTDATA_DIR + "/tiny-qwen3next";

inline std::unique_ptr<model::CausalLm> LoadModel(
    const std::string& dir, std::optional<DType> weight_dtype = std::nullopt) {
  Result<std::unique_ptr<model::CausalLm>> lm =
      model::CausalLm::Load(dir, {.weight_dtype = weight_dtype, .threads = 2});
  EXPECT_TRUE(lm.ok()) << lm.status().ToString();
  return lm.ok() ? std::move(*lm) : nullptr;
}

using model::testing::MadeModel;

// A hybrid model with an MTP layer (random weights: its drafts are mostly rejected).
inline const std::string& HybridMtpDir() {
  return MadeModel("engine_mtp", "--arch qwen3_next --preset tiny --seed 6 --mtp-layers 1");
}

// An attention-only MoE model (prefix caching applies).
inline const std::string& Qwen3MoeDir() {
  return MadeModel("engine", "--arch qwen3_moe --preset tiny --seed 5");
}

inline std::vector<int32_t> RandomPrompt(int64_t n, uint32_t seed, int64_t vocab) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % (vocab - 4));
  return p;
}

inline SamplingParams Greedy(int64_t max_tokens) {
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = max_tokens;
  params.ignore_eos = true;
  return params;
}

// Everything a request produced: its tokens and the logits each was sampled from.
struct Trace {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

// Runs the prompts through `engine` (all added at once, or one more every `stagger` steps) to
// the end; returns each request's trace by prompt index. Checks block accounting returns to 0.
inline std::vector<Trace> RunAll(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                          int64_t max_tokens, int64_t stagger = 0,
                          int64_t* preemptions = nullptr,
                          std::optional<SamplingParams> params = std::nullopt) {
  std::map<int64_t, size_t> index_of;
  std::vector<Trace> traces(prompts.size());
  size_t added = 0;
  auto add = [&] {
    Result<int64_t> id = engine.AddRequest(prompts[added], params.value_or(Greedy(max_tokens)));
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    index_of[*id] = added++;
  };
  if (stagger == 0) {
    while (added < prompts.size()) add();
  } else {
    add();
  }
  int64_t step = 0;
  while (engine.HasUnfinished() || added < prompts.size()) {
    if (stagger > 0 && added < prompts.size() && step % stagger == stagger - 1) add();
    engine.Step();
    ++step;
    const SchedulerOutput& out = engine.last_schedule();
    if (preemptions != nullptr) *preemptions += static_cast<int64_t>(out.preempted_ids.size());
    for (size_t i = 0; i < out.scheduled.size(); ++i) {
      Trace& t = traces[index_of.at(out.scheduled[i].request->id)];
      const Request* r = engine.Find(out.scheduled[i].request->id);
      // Each token the step emitted (several with accepted drafts; those after a stop are
      // dropped) and the logits row it came from.
      for (int64_t j = 0; t.tokens.size() < r->output_token_ids.size(); ++j) {
        const float* logits = engine.runner().logits_of(static_cast<int64_t>(i), j);
        if (logits == nullptr) break;
        t.tokens.push_back(r->output_token_ids[t.tokens.size()]);
        t.logits.emplace_back(logits, logits + engine.model().config().vocab_size);
      }
    }
    EXPECT_LT(step, 100000) << "engine does not finish";
  }
  for (const auto& [id, index] : index_of) {
    const Request* r = engine.Find(id);
    EXPECT_EQ(r->output_token_ids, traces[index].tokens);
    engine.Release(id);
  }
  EXPECT_EQ(engine.cache_manager().num_used_blocks(), 0);
  EXPECT_EQ(engine.cache_manager().num_used_state_slots(), 0);
  return traces;
}

// GiB of one KV block of `config`'s engine.
inline double BlockGiB(model::CausalLm& lm, const EngineConfig& config) {
  auto probe = Engine::Create(lm, config);
  CHECK(probe.ok()) << probe.status().ToString();
  return static_cast<double>((*probe)->layout().kv_bytes) / (*probe)->layout().num_blocks /
         (1024.0 * 1024.0 * 1024.0);
}

// The same request alone in a fresh engine of the same configuration.
inline Trace RunAlone(model::CausalLm& lm, const EngineConfig& config, const std::vector<int32_t>& prompt,
               int64_t max_tokens) {
  Result<std::unique_ptr<Engine>> engine = Engine::Create(lm, config);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return RunAll(**engine, {prompt}, max_tokens)[0];
}

inline void ExpectBitIdentical(const Trace& got, const Trace& want, const std::string& what) {
  ASSERT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  for (size_t s = 0; s < want.logits.size(); ++s) {
    EXPECT_EQ(0, std::memcmp(got.logits[s].data(), want.logits[s].data(),
                             want.logits[s].size() * sizeof(float)))
        << what << ": logits of output " << s << " differ";
  }
}

inline double MaxRelError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

// Greedy, but through the sampler (logprobs): every rank holds the full logits rows, not only
// the argmax pairs of plain greedy.
inline SamplingParams GreedyWithLogits(int64_t max_tokens) {
  SamplingParams params = Greedy(max_tokens);
  params.logprobs = 0;
  return params;
}

// `tp` local ranks (threads) over the model folder.
inline std::unique_ptr<model::ModelGroup> LoadRanks(const std::string& dir, int tp, bool ep,
                                             int64_t mc2_max_tokens = 0) {
  model::LoadOptions options{.weight_dtype = std::nullopt, .threads = 1};
  options.forward.mc2_max_tokens = mc2_max_tokens;
  Result<std::unique_ptr<model::ModelGroup>> group = model::ModelGroup::Load(
      dir, options, {.tp = tp, .ep = ep, .link = std::nullopt});
  EXPECT_TRUE(group.ok()) << group.status().ToString();
  return group.ok() ? std::move(*group) : nullptr;
}

}  // namespace moeserve::engine::test_util
