#include "engine/sampler.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <regex>
#include <set>
#include <vector>

#include "core/check.h"
#include "core/heap_counter.h"
#include "structured/structured.h"

namespace moeserve::engine {

// Reads RequestSampler's intermediate results (it is a friend).
class RequestSamplerTestPeer {
 public:
  // The logits after allowed_token_ids, bad words, min_tokens, logit_bias and penalties.
  static std::vector<float> Processed(const RequestSampler& s, const std::vector<float>& logits,
                                      std::span<const int32_t> outputs) {
    std::vector<float> work(s.vocab_);
    s.ApplyProcessors(logits.data(), outputs, work.data());
    return work;
  }
  // The distribution a random row draws from (all zero when nothing is left).
  static std::vector<double> FinalProbs(RequestSampler& s, const std::vector<float>& logits,
                                        std::span<const int32_t> outputs) {
    std::vector<float> work(s.vocab_), weights(s.vocab_);
    s.ApplyProcessors(logits.data(), outputs, work.data());
    const double total = s.FinalWeights(work.data(), weights.data());
    std::vector<double> probs(s.vocab_, 0.0);
    if (total > 0) {
      for (int64_t i = 0; i < s.vocab_; ++i) probs[i] = weights[i] / total;
    }
    return probs;
  }
};

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr float kInfF = std::numeric_limits<float>::infinity();

std::vector<float> RandomLogits(int64_t vocab, double scale, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, static_cast<float>(scale));
  std::vector<float> logits(vocab);
  for (float& l : logits) l = normal(rng);
  return logits;
}

// ---------------------------------------------------------------------------------------------
// The reference: vLLM's pipeline written plainly, in double, with full sorts as vLLM's
// apply_top_k_top_p_pytorch does. It flags decisions that sit so close to their threshold that
// float (the sampler) and double (here) may legitimately disagree.

struct Reference {
  std::vector<double> processed;  // after penalties, before temperature
  std::vector<double> probs;      // the final distribution (one-hot for greedy)
  int32_t greedy = -1;
  bool near_boundary = false;
  bool all_masked = false;
};

std::vector<double> Softmax(const std::vector<double>& l) {
  double max = -kInf;
  for (double v : l) max = std::max(max, v);
  std::vector<double> p(l.size(), 0.0);
  if (max == -kInf) return p;
  double sum = 0;
  for (size_t i = 0; i < l.size(); ++i) sum += p[i] = std::exp(l[i] - max);
  for (double& v : p) v /= sum;
  return p;
}

Reference ReferenceSample(const SamplingParams& p, const std::vector<int32_t>& prompt,
                          const std::vector<int32_t>& outputs, const std::vector<int32_t>& eos,
                          const std::vector<float>& raw) {
  const int64_t V = static_cast<int64_t>(raw.size());
  Reference ref;
  std::vector<double> l(raw.begin(), raw.end());
  if (p.allowed_token_ids.has_value()) {
    std::vector<bool> allowed(V, false);
    for (int32_t id : *p.allowed_token_ids) allowed[id] = true;
    for (int64_t i = 0; i < V; ++i) {
      if (!allowed[i]) l[i] = -kInf;
    }
  }
  for (const std::vector<int32_t>& seq : p.bad_words_token_ids) {
    const size_t prefix = seq.size() - 1;
    if (prefix > outputs.size()) continue;
    bool match = true;
    for (size_t j = 0; j < prefix; ++j) match &= outputs[outputs.size() - prefix + j] == seq[j];
    if (match) l[seq.back()] = -kInf;
  }
  if (static_cast<int64_t>(outputs.size()) < p.min_tokens) {
    for (int32_t id : eos) l[id] = -kInf;
    for (int32_t id : p.stop_token_ids) l[id] = -kInf;
  }
  std::map<int32_t, double> bias;
  for (const auto& [id, b] : p.logit_bias) bias[id] = std::clamp<double>(b, -100, 100);
  for (const auto& [id, b] : bias) l[id] += b;
  std::vector<int> count(V, 0);
  std::vector<bool> seen(V, false);
  for (int32_t t : prompt) seen[t] = true;
  for (int32_t t : outputs) seen[t] = true, ++count[t];
  for (int64_t i = 0; i < V; ++i) {
    if (seen[i]) l[i] = l[i] > 0 ? l[i] / p.repetition_penalty : l[i] * p.repetition_penalty;
    l[i] -= p.frequency_penalty * count[i];
    l[i] -= p.presence_penalty * (count[i] > 0 ? 1 : 0);
  }
  ref.processed = l;
  ref.all_masked = std::all_of(l.begin(), l.end(), [](double v) { return v == -kInf; });

  if (p.greedy()) {
    ref.greedy = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    ref.probs.assign(V, 0.0);
    ref.probs[ref.greedy] = 1.0;
    return ref;
  }
  for (double& v : l) v /= p.temperature;

  if (p.min_p > 0) {
    const std::vector<double> probs = Softmax(l);
    const double threshold = p.min_p * *std::max_element(probs.begin(), probs.end());
    for (int64_t i = 0; i < V; ++i) {
      if (probs[i] > 0 && std::abs(probs[i] - threshold) < 1e-5 * threshold) {
        ref.near_boundary = true;
      }
      if (probs[i] < threshold) l[i] = -kInf;
    }
  }
  if (p.top_k > 0 && p.top_k < V) {
    std::vector<double> sorted = l;
    std::sort(sorted.begin(), sorted.end());
    const double kth = sorted[V - p.top_k];
    const double next = sorted[V - p.top_k - 1];
    if (next != -kInf && next != kth && kth - next < 1e-5 * (1 + std::abs(kth))) {
      ref.near_boundary = true;
    }
    for (double& v : l) {
      if (v < kth) v = -kInf;
    }
  }
  if (p.top_p < 1) {
    // Ascending, ties: higher id first (so that a tie is cut at the higher ids).
    std::vector<int32_t> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(),
              [&](int32_t a, int32_t b) { return l[a] < l[b] || (l[a] == l[b] && a > b); });
    std::vector<double> sorted(V);
    for (int64_t j = 0; j < V; ++j) sorted[j] = l[idx[j]];
    const std::vector<double> probs = Softmax(sorted);
    double cumulative = 0;
    for (int64_t j = 0; j < V; ++j) {
      cumulative += probs[j];
      if (probs[j] > 0 && std::abs(cumulative - (1 - p.top_p)) < 1e-6) ref.near_boundary = true;
      if (cumulative <= 1 - p.top_p && j != V - 1) l[idx[j]] = -kInf;
    }
  }
  ref.probs = Softmax(l);
  return ref;
}

// ---------------------------------------------------------------------------------------------
// Processors, one at a time, on hand-made rows.

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0;
  p.Normalize();
  return p;
}

struct Sampling {
  std::vector<float> scratch;
  SampledToken result;
  int32_t Sample(RequestSampler& s, const std::vector<float>& logits,
                 const std::vector<int32_t>& outputs = {}) {
    scratch.resize(2 * logits.size());
    s.Sample(logits.data(), outputs, scratch.data(), &result);
    return result.token;
  }
};

TEST(GreedyTokenTest, TiesGoToTheLowestId) {
  const std::vector<float> logits = {1, 3, 2, 3, 3};
  EXPECT_EQ(GreedyToken(logits.data(), 5), 1);
  const std::vector<float> all_masked(4, -kInfF);
  EXPECT_EQ(GreedyToken(all_masked.data(), 4), 0);
}

TEST(SamplerTest, PlainGreedyOnlyWithoutProcessors) {
  const std::vector<int32_t> eos = {0};
  auto plain = [&](const SamplingParams& p) {
    return RequestSampler(p, {}, eos, 10, 1).plain_greedy();
  };
  SamplingParams p = Greedy();
  EXPECT_TRUE(plain(p));
  SamplingParams q = p;
  q.logprobs = 0;
  EXPECT_FALSE(plain(q));
  q = p;
  q.allowed_token_ids = {{1, 2}};
  EXPECT_FALSE(plain(q));
  q = p;
  q.bad_words_token_ids = {{3}};
  EXPECT_FALSE(plain(q));
  q = p;
  q.min_tokens = 2;
  EXPECT_FALSE(plain(q));
  q = p;
  q.logit_bias = {{3, 1.0f}};
  EXPECT_FALSE(plain(q));
  q = p;
  q.repetition_penalty = 1.1;
  EXPECT_FALSE(plain(q));
  q = p;
  q.frequency_penalty = 0.5;
  EXPECT_FALSE(plain(q));
  q = p;
  q.presence_penalty = -0.5;
  EXPECT_FALSE(plain(q));
  q = SamplingParams();  // temperature 1
  EXPECT_FALSE(plain(q));
}

TEST(SamplerTest, GreedyFastPathIsArgmaxOfRawLogits) {
  std::mt19937_64 rng(7);
  RequestSampler s(Greedy(), {}, {}, 300, 1);
  Sampling run;
  for (int i = 0; i < 20; ++i) {
    const std::vector<float> logits = RandomLogits(300, 3, rng);
    EXPECT_EQ(run.Sample(s, logits), GreedyToken(logits.data(), 300));
  }
}

TEST(SamplerTest, AllowedTokenIds) {
  SamplingParams p = Greedy();
  p.allowed_token_ids = {{4, 2, 7}};
  RequestSampler greedy(p, {}, {}, 10, 1);
  std::vector<float> logits = {9, 8, 1, 7, 2, 6, 5, 0, 3, 4};
  Sampling run;
  EXPECT_EQ(run.Sample(greedy, logits), 4);

  p = SamplingParams();
  p.allowed_token_ids = {{4, 2, 7}};
  RequestSampler random(p, {}, {}, 10, 1);
  std::set<int32_t> drawn;
  for (int i = 0; i < 2000; ++i) drawn.insert(run.Sample(random, logits));
  EXPECT_EQ(drawn, (std::set<int32_t>{2, 4, 7}));
}

TEST(SamplerTest, BadWordsSingleTokenAlwaysBanned) {
  SamplingParams p = Greedy();
  p.bad_words_token_ids = {{3}};
  RequestSampler s(p, {}, {}, 6, 1);
  const std::vector<float> logits = {0, 1, 2, 9, 4, 5};
  Sampling run;
  EXPECT_EQ(run.Sample(s, logits), 5);
  EXPECT_EQ(run.Sample(s, logits, {1, 2, 3}), 5);
}

TEST(SamplerTest, BadWordsMultiTokenOnlyAfterTheirPrefix) {
  SamplingParams p = Greedy();
  p.bad_words_token_ids = {{1, 2, 5}, {4, 5}};
  RequestSampler s(p, {}, {}, 6, 1);
  const std::vector<float> logits = {0, 1, 2, 3, 4, 9};
  Sampling run;
  EXPECT_EQ(run.Sample(s, logits), 5);             // no prefix yet
  EXPECT_EQ(run.Sample(s, logits, {2}), 5);        // [1 2] not matched
  EXPECT_EQ(run.Sample(s, logits, {1, 2}), 4);     // [1 2] -> 5 banned
  EXPECT_EQ(run.Sample(s, logits, {0, 1, 2}), 4);  // suffix match
  EXPECT_EQ(run.Sample(s, logits, {1, 2, 0}), 5);  // not at the end
  EXPECT_EQ(run.Sample(s, logits, {3, 4}), 4);     // [4] -> 5 banned, 4 itself is fine
  EXPECT_EQ(run.Sample(s, logits, {4, 3}), 5);
}

TEST(SamplerTest, MinTokensSuppressesEosAndStopIdsUntilReached) {
  for (bool ignore_eos : {false, true}) {
    SCOPED_TRACE(ignore_eos);
    SamplingParams p = Greedy();
    p.min_tokens = 3;
    p.stop_token_ids = {5};
    p.ignore_eos = ignore_eos;  // EOS still masked, as vLLM
    const std::vector<int32_t> eos = {6, 7};
    RequestSampler s(p, {}, eos, 8, 1);
    Sampling run;
    std::vector<float> logits = {0, 1, 2, 3, 4, 9, 8, 7};  // stop 5 > eos 6 > eos 7 > 4
    std::vector<int32_t> outputs;
    for (int step = 0; step < 3; ++step) {
      EXPECT_EQ(run.Sample(s, logits, outputs), 4) << step;
      outputs.push_back(4);
    }
    EXPECT_EQ(run.Sample(s, logits, outputs), 5);
    logits[5] = 0;
    EXPECT_EQ(run.Sample(s, logits, outputs), 6);
    logits[6] = 0;
    EXPECT_EQ(run.Sample(s, logits, outputs), 7);
  }
}

TEST(SamplerTest, MinTokensOnRandomRows) {
  SamplingParams p;
  p.min_tokens = 2;
  p.stop_token_ids = {1};
  RequestSampler s(p, {}, std::vector<int32_t>{0}, 4, 3);
  const std::vector<float> logits = {5, 5, 0, 0};
  std::vector<int32_t> outputs;
  auto probs = RequestSamplerTestPeer::FinalProbs(s, logits, outputs);
  EXPECT_EQ(probs[0], 0.0);
  EXPECT_EQ(probs[1], 0.0);
  EXPECT_NEAR(probs[2], 0.5, 1e-7);
  outputs = {2, 3};
  probs = RequestSamplerTestPeer::FinalProbs(s, logits, outputs);
  EXPECT_GT(probs[0], 0.4);
  EXPECT_GT(probs[1], 0.4);
}

TEST(SamplerTest, LogitBiasAddsAndClamps) {
  SamplingParams p = Greedy();
  p.logit_bias = {{0, 3.0f}, {2, -1.5f}};
  RequestSampler s(p, {}, {}, 4, 1);
  const std::vector<float> logits = {1, 3.5f, 2, 0};
  const auto processed = RequestSamplerTestPeer::Processed(s, logits, {});
  EXPECT_EQ(processed, (std::vector<float>{4, 3.5f, 0.5f, 0}));
  Sampling run;
  EXPECT_EQ(run.Sample(s, logits), 0);

  p.logit_bias = {{0, 1000.0f}};  // clamped to 100, even when not normalized
  RequestSampler clamped(p, {}, {}, 4, 1);
  const std::vector<float> big = {0, 150, 0, 0};
  EXPECT_EQ(RequestSamplerTestPeer::Processed(clamped, big, {})[0], 100.0f);
  EXPECT_EQ(run.Sample(clamped, big), 1);
}

TEST(SamplerTest, RepetitionPenaltyOnPromptAndOutputTokens) {
  SamplingParams p = Greedy();
  p.repetition_penalty = 2.0;
  const std::vector<int32_t> prompt = {0, 1, 1};
  RequestSampler s(p, prompt, {}, 5, 1);
  const std::vector<float> logits = {4, -4, 4, -4, 4};
  EXPECT_EQ(RequestSamplerTestPeer::Processed(s, logits, {}),
            (std::vector<float>{2, -8, 4, -4, 4}));
  s.Accept(3);
  s.Accept(3);  // once per token, not per occurrence
  EXPECT_EQ(RequestSamplerTestPeer::Processed(s, logits, std::vector<int32_t>{3, 3}),
            (std::vector<float>{2, -8, 4, -8, 4}));
}

TEST(SamplerTest, FrequencyAndPresenceCountOutputsOnly) {
  SamplingParams p = Greedy();
  p.frequency_penalty = 0.5;
  p.presence_penalty = 0.25;
  const std::vector<int32_t> prompt = {0, 0, 4};
  RequestSampler s(p, prompt, {}, 5, 1);
  const std::vector<float> logits = {1, 1, 1, 1, 1};
  EXPECT_EQ(RequestSamplerTestPeer::Processed(s, logits, {}), logits);
  for (int32_t t : {2, 2, 2, 3}) s.Accept(t);
  const std::vector<int32_t> outputs = {2, 2, 2, 3};
  EXPECT_EQ(RequestSamplerTestPeer::Processed(s, logits, outputs),
            (std::vector<float>{1, 1, 1 - 1.5f - 0.25f, 1 - 0.5f - 0.25f, 1}));
}

TEST(SamplerTest, PenaltiesApplyInVllmOrder) {
  // repetition, then frequency, then presence on one token: (3 / 1.5) - 2 * 0.5 - 1 = 0.
  SamplingParams p = Greedy();
  p.repetition_penalty = 1.5;
  p.frequency_penalty = 0.5;
  p.presence_penalty = 1.0;
  RequestSampler s(p, {}, {}, 2, 1);
  s.Accept(0);
  s.Accept(0);
  const std::vector<float> logits = {3, -1};
  const std::vector<int32_t> outputs = {0, 0};
  EXPECT_EQ(RequestSamplerTestPeer::Processed(s, logits, outputs), (std::vector<float>{0, -1}));
}

TEST(SamplerTest, TopKKeepsTiesAtTheBoundary) {
  SamplingParams p;
  p.top_k = 2;
  RequestSampler s(p, {}, {}, 6, 1);
  const std::vector<float> logits = {1, 2, 2, 2, 0, 1};
  const auto probs = RequestSamplerTestPeer::FinalProbs(s, logits, {});
  EXPECT_EQ(probs, (std::vector<double>{0, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0, 0}));
}

TEST(SamplerTest, TopPCutsTiesAtTheHigherIds) {
  SamplingParams p;
  p.top_p = 0.35;  // ten equal tokens: 4 reach 0.35 (vLLM: cumsum <= 0.65 masks six)
  RequestSampler s(p, {}, {}, 10, 1);
  const std::vector<float> logits(10, 0.5f);
  const auto probs = RequestSamplerTestPeer::FinalProbs(s, logits, {});
  for (int i = 0; i < 10; ++i) EXPECT_EQ(probs[i], i < 4 ? 0.25 : 0.0) << i;
}

TEST(SamplerTest, TopPAlwaysKeepsTheMostLikely) {
  SamplingParams p;
  p.top_p = 1e-9;
  RequestSampler s(p, {}, {}, 5, 1);
  const std::vector<float> logits = {0, 1, 3, 2, 1};
  const auto probs = RequestSamplerTestPeer::FinalProbs(s, logits, {});
  EXPECT_EQ(probs, (std::vector<double>{0, 0, 1, 0, 0}));
}

TEST(SamplerTest, TopPOverALargeFlatTail) {
  // Most of the mass in tokens far below the first candidate threshold (1e-3 of the max).
  SamplingParams p;
  p.top_p = 0.9;
  const int64_t V = 20000;
  std::vector<float> logits(V, -8.0f);
  logits[17] = 0;
  RequestSampler s(p, {}, {}, V, 1);
  SamplingParams ref_params = p;
  const Reference ref = ReferenceSample(ref_params, {}, {}, {}, logits);
  const auto probs = RequestSamplerTestPeer::FinalProbs(s, logits, {});
  int64_t kept = 0, ref_kept = 0;
  for (int64_t i = 0; i < V; ++i) {
    kept += probs[i] > 0;
    ref_kept += ref.probs[i] > 0;
  }
  EXPECT_GT(kept, 10000);
  // Equal tails: float and double may cut one token apart at most.
  EXPECT_NEAR(kept, ref_kept, 1);
  EXPECT_GT(probs[17], 0);
}

TEST(SamplerTest, TopPAcrossTheWholeLogitRange) {
  // Logits spread over 60 nats, beyond the 32 that top-p bins finely, cut from the head to deep
  // in the tail: each cut matches the reference. A cut in a tail lighter than float's precision
  // (top_p 1 - 1e-12) may fall elsewhere, but only on mass of that size.
  const int64_t V = 3000;
  std::vector<float> logits(V);
  for (int64_t i = 0; i < V; ++i) logits[i] = -0.02f * static_cast<float>((i * 7919) % V);
  for (double top_p : {1e-6, 0.1, 0.5, 0.9, 0.999, 0.999999, 1 - 1e-12}) {
    SCOPED_TRACE(top_p);
    SamplingParams p;
    p.top_p = top_p;
    RequestSampler s(p, {}, {}, V, 1);
    const Reference ref = ReferenceSample(p, {}, {}, {}, logits);
    const auto probs = RequestSamplerTestPeer::FinalProbs(s, logits, {});
    double distance = 0;
    for (int64_t i = 0; i < V; ++i) distance += std::abs(probs[i] - ref.probs[i]) / 2;
    EXPECT_LT(distance, 1e-6);
    if (ref.near_boundary) continue;
    for (int64_t i = 0; i < V; ++i) ASSERT_EQ(probs[i] > 0, ref.probs[i] > 0) << i;
  }
}

TEST(SamplerTest, MinPMasksRelativeToTheMostLikely) {
  SamplingParams p;
  p.min_p = 0.2;
  RequestSampler s(p, {}, {}, 4, 1);
  // probabilities proportional to 1, 0.25, 0.1, 0.5 -> 0.1 < 0.2 * 1 is masked.
  const std::vector<float> logits = {0, std::log(0.25f), std::log(0.1f), std::log(0.5f)};
  const auto probs = RequestSamplerTestPeer::FinalProbs(s, logits, {});
  EXPECT_GT(probs[1], 0);
  EXPECT_EQ(probs[2], 0);
  EXPECT_NEAR(probs[0], 1 / 1.75, 1e-6);
}

TEST(SamplerTest, EverythingMaskedFallsBackToArgmax) {
  SamplingParams p;
  p.allowed_token_ids = {{2}};
  p.bad_words_token_ids = {{2}};
  RequestSampler s(p, {}, {}, 4, 1);
  Sampling run;
  EXPECT_EQ(run.Sample(s, {1, 2, 3, 4}), 0);
}

// ---------------------------------------------------------------------------------------------
// Many random parameter combinations against the reference.

TEST(SamplerTest, MatchesReferenceOnRandomCombinations) {
  std::mt19937_64 rng(20240611);
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  auto pick = [&](auto... values) {
    const std::vector<std::common_type_t<decltype(values)...>> v = {values...};
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
  };
  int compared = 0, skipped = 0, greedy_compared = 0;
  for (int iteration = 0; iteration < 1500; ++iteration) {
    const int64_t V = pick(int64_t{5}, int64_t{50}, int64_t{257});
    auto token = [&]() { return std::uniform_int_distribution<int32_t>(0, V - 1)(rng); };
    SamplingParams p;
    p.temperature = pick(0.0, 1.0, 0.7, 0.3, 1.5, 2.0, 0.05);
    p.top_p = pick(1.0, 1.0, 0.9, 0.5, 0.2, 0.99);
    p.top_k = pick(int64_t{0}, int64_t{0}, int64_t{1}, int64_t{3}, int64_t{20}, V, V + 3);
    p.min_p = pick(0.0, 0.0, 0.05, 0.3);
    if (uniform(0, 1) < 0.5) p.repetition_penalty = pick(0.5, 0.9, 1.2, 2.0);
    if (uniform(0, 1) < 0.5) p.frequency_penalty = uniform(-2, 2);
    if (uniform(0, 1) < 0.5) p.presence_penalty = uniform(-2, 2);
    if (uniform(0, 1) < 0.3) {
      for (int i = 0; i < 3; ++i) p.logit_bias.emplace_back(token(), float(uniform(-120, 120)));
    }
    if (uniform(0, 1) < 0.2) {
      p.allowed_token_ids.emplace();
      for (int i = 0; i < 1 + V / 3; ++i) p.allowed_token_ids->push_back(token());
    }
    std::vector<int32_t> prompt(std::uniform_int_distribution<int>(0, 12)(rng));
    for (int32_t& t : prompt) t = token();
    std::vector<int32_t> outputs(std::uniform_int_distribution<int>(0, 6)(rng));
    for (int32_t& t : outputs) t = token();
    if (uniform(0, 1) < 0.3) {
      p.bad_words_token_ids.push_back({token()});
      p.bad_words_token_ids.push_back({token(), token()});
      if (!outputs.empty()) p.bad_words_token_ids.push_back({outputs.back(), token()});
    }
    std::vector<int32_t> eos = {token()};
    if (uniform(0, 1) < 0.3) {
      p.min_tokens = pick(int64_t{1}, int64_t{4}, int64_t{10});
      p.stop_token_ids = {token(), token()};
    }
    p.max_tokens = std::max<int64_t>(p.min_tokens, 16);
    p.seed = iteration;
    ASSERT_TRUE(p.Validate(V).ok()) << p.Validate(V).ToString();
    p.Normalize();

    RequestSampler s(p, prompt, eos, V, 0);
    for (int32_t t : outputs) s.Accept(t);
    const std::vector<float> logits = RandomLogits(V, pick(1.0, 3.0, 8.0), rng);
    const Reference ref = ReferenceSample(p, prompt, outputs, eos, logits);
    SCOPED_TRACE(::testing::Message()
                 << "iteration " << iteration << " V " << V << " t " << p.temperature << " top_p "
                 << p.top_p << " top_k " << p.top_k << " min_p " << p.min_p);

    const std::vector<float> processed = RequestSamplerTestPeer::Processed(s, logits, outputs);
    for (int64_t i = 0; i < V; ++i) {
      if (ref.processed[i] == -kInf) {
        ASSERT_EQ(processed[i], -kInfF) << i;
      } else {
        ASSERT_NEAR(processed[i], ref.processed[i], 1e-5 * (1 + std::abs(ref.processed[i]))) << i;
      }
    }
    if (ref.all_masked) continue;
    if (p.greedy()) {
      Sampling run;
      ASSERT_EQ(run.Sample(s, logits, outputs), ref.greedy);
      ++greedy_compared;
      continue;
    }
    if (ref.near_boundary) {
      ++skipped;
      continue;
    }
    const std::vector<double> probs = RequestSamplerTestPeer::FinalProbs(s, logits, outputs);
    for (int64_t i = 0; i < V; ++i) {
      // The same support, except for probabilities below float's range (exp underflows).
      if (ref.probs[i] == 0 || ref.probs[i] > 1e-30) {
        ASSERT_EQ(probs[i] > 0, ref.probs[i] > 0)
            << i << ": " << probs[i] << " vs " << ref.probs[i];
      }
      // Logits divided by a small temperature reach ~1e3: float exp is then good to ~1e-4.
      ASSERT_NEAR(probs[i], ref.probs[i], 1e-6 + 1e-3 * ref.probs[i]) << i;
    }
    ++compared;
  }
  std::printf("compared %d random rows, %d greedy rows; %d skipped near a threshold\n", compared,
              greedy_compared, skipped);
  EXPECT_GT(compared, 900);
  EXPECT_GT(greedy_compared, 100);
  EXPECT_LT(skipped, 20);
}

// ---------------------------------------------------------------------------------------------
// Logprobs.

TEST(LogprobsTest, LogSoftmaxMatchesDouble) {
  std::mt19937_64 rng(3);
  for (int64_t V : {1, 7, 1000}) {
    const std::vector<float> logits = RandomLogits(V, 10, rng);
    std::vector<float> out(V);
    LogSoftmax(logits.data(), V, out.data());
    double max = -kInf, sum = 0;
    for (float l : logits) max = std::max<double>(max, l);
    for (float l : logits) sum += std::exp(l - max);
    for (int64_t i = 0; i < V; ++i) {
      EXPECT_NEAR(out[i], logits[i] - max - std::log(sum), 1e-5 * (1 + std::abs(out[i])));
    }
  }
}

TEST(LogprobsTest, GatherTopNWithTies) {
  const std::vector<float> lp = {-3, -1, -2, -1, -5, -2, -1};
  SampledToken r;
  GatherLogprobs(lp.data(), 7, 4, 5, &r);
  EXPECT_EQ(r.sampled.token, 5);
  EXPECT_EQ(r.sampled.logprob, -2);
  EXPECT_EQ(r.sampled.rank, 5);  // vLLM counts logprobs >= its own: -1 x3 and -2 x2
  ASSERT_EQ(r.top.size(), 4u);
  const std::vector<int32_t> want_ids = {1, 3, 6, 2};    // descending, ties by lower id
  const std::vector<int64_t> want_ranks = {1, 2, 3, 4};  // vLLM: positions
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r.top[i].token, want_ids[i]) << i;
    EXPECT_EQ(r.top[i].logprob, lp[want_ids[i]]);
    EXPECT_EQ(r.top[i].rank, want_ranks[i]) << i;
  }
  GatherLogprobs(lp.data(), 7, 0, 1, &r);
  EXPECT_TRUE(r.top.empty());
  EXPECT_EQ(r.sampled.rank, 3);  // tied with two others at the top
  GatherLogprobs(lp.data(), 7, 0, 4, &r);
  EXPECT_EQ(r.sampled.rank, 7);
  GatherLogprobs(lp.data(), 7, -1, 0, &r);  // the whole vocabulary
  ASSERT_EQ(r.top.size(), 7u);
  EXPECT_EQ(r.top.back().token, 4);
  GatherLogprobs(lp.data(), 7, 100, 0, &r);  // more than the vocabulary
  EXPECT_EQ(r.top.size(), 7u);
}

TEST(LogprobsTest, SmallAndLargeTopNAgree) {
  // n <= 64 inserts, larger n sorts: both must give the same order on many ties.
  std::mt19937_64 rng(5);
  std::vector<float> lp(500);
  for (float& v : lp) v = -static_cast<float>(std::uniform_int_distribution<int>(0, 40)(rng));
  SampledToken small, large;
  GatherLogprobs(lp.data(), 500, 64, 9, &small);
  GatherLogprobs(lp.data(), 500, 65, 9, &large);
  ASSERT_EQ(small.top.size(), 64u);
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(small.top[i].token, large.top[i].token) << i;
    EXPECT_EQ(small.top[i].rank, large.top[i].rank) << i;
  }
}

TEST(LogprobsTest, SampleReportsRawLogprobs) {
  // Processors change what is drawn, not the logprobs: they are of the raw logits.
  std::mt19937_64 rng(11);
  const int64_t V = 64;
  SamplingParams p;
  p.temperature = 0.5;
  p.top_k = 3;
  p.logit_bias = {{10, 5.0f}};
  p.repetition_penalty = 1.7;
  p.logprobs = 5;
  const std::vector<int32_t> prompt = {10, 11};
  RequestSampler s(p, prompt, {}, V, 9);
  Sampling run;
  for (int step = 0; step < 30; ++step) {
    const std::vector<float> logits = RandomLogits(V, 2, rng);
    const int32_t token = run.Sample(s, logits);
    std::vector<float> lp(V);
    LogSoftmax(logits.data(), V, lp.data());
    EXPECT_EQ(run.result.sampled.token, token);
    EXPECT_EQ(run.result.sampled.logprob, lp[token]);
    int64_t rank = 1;
    for (float v : lp) rank += v > lp[token];
    EXPECT_EQ(run.result.sampled.rank, rank);
    ASSERT_EQ(run.result.top.size(), 5u);
    std::vector<int32_t> ids(V);
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return lp[a] > lp[b]; });
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(run.result.top[i].token, ids[i]);
      EXPECT_EQ(run.result.top[i].logprob, lp[ids[i]]);
    }
  }
}

TEST(LogprobsTest, GreedyWithLogprobsAndTiedLogits) {
  SamplingParams p = Greedy();
  p.logprobs = 2;
  RequestSampler s(p, {}, {}, 4, 1);
  Sampling run;
  EXPECT_EQ(run.Sample(s, {2, 5, 5, 1}), 1);
  EXPECT_EQ(run.result.sampled.rank, 2);  // vLLM's rank counts the tie
  EXPECT_NEAR(run.result.sampled.logprob,
              5 - std::log(std::exp(2.0) + 2 * std::exp(5.0) + std::exp(1.0)), 1e-6);
  ASSERT_EQ(run.result.top.size(), 2u);
  EXPECT_EQ(run.result.top[0].token, 1);
  EXPECT_EQ(run.result.top[1].token, 2);
  EXPECT_EQ(run.result.top[1].rank, 2);
}

TEST(LogprobsTest, NoLogprobsLeavesTopEmpty) {
  RequestSampler s(SamplingParams(), {}, {}, 4, 1);
  Sampling run;
  run.result.top.resize(3);
  run.Sample(s, {1, 2, 3, 4});
  EXPECT_TRUE(run.result.top.empty());
}

// ---------------------------------------------------------------------------------------------
// Seeds.

std::vector<int32_t> Draws(const SamplingParams& p, uint64_t unseeded, int count,
                           const std::vector<float>& logits) {
  RequestSampler s(p, {}, {}, static_cast<int64_t>(logits.size()), unseeded);
  Sampling run;
  std::vector<int32_t> tokens;
  for (int i = 0; i < count; ++i) tokens.push_back(run.Sample(s, logits));
  return tokens;
}

TEST(SeedTest, SameSeedSameTokens) {
  std::mt19937_64 rng(1);
  const std::vector<float> logits = RandomLogits(50, 1, rng);
  SamplingParams p;
  p.seed = 1234;
  p.top_p = 0.95;
  // The unseeded seed is ignored when the request has its own.
  EXPECT_EQ(Draws(p, 1, 100, logits), Draws(p, 2, 100, logits));
  p.seed.reset();
  EXPECT_EQ(Draws(p, 77, 100, logits), Draws(p, 77, 100, logits));
}

TEST(SeedTest, SameSeedSameTokensWhateverElseRuns) {
  // Another request sampling in between changes nothing: each has its own generator.
  std::mt19937_64 rng(2);
  const std::vector<float> logits = RandomLogits(50, 1, rng);
  SamplingParams p;
  p.seed = 99;
  const std::vector<int32_t> alone = Draws(p, 0, 40, logits);
  RequestSampler a(p, {}, {}, 50, 0);
  RequestSampler other(SamplingParams(), {}, {}, 50, 5);
  Sampling run, other_run;
  std::vector<int32_t> interleaved;
  for (int i = 0; i < 40; ++i) {
    for (int j = 0; j < i % 3; ++j) other_run.Sample(other, logits);
    interleaved.push_back(run.Sample(a, logits));
  }
  EXPECT_EQ(alone, interleaved);
}

TEST(SeedTest, DifferentSeedsDifferentSequences) {
  std::mt19937_64 rng(4);
  const std::vector<float> logits = RandomLogits(50, 1, rng);
  SamplingParams p;
  std::set<std::vector<int32_t>> sequences;
  for (int64_t seed = 0; seed < 10; ++seed) {
    p.seed = seed;
    sequences.insert(Draws(p, 0, 20, logits));
  }
  EXPECT_EQ(sequences.size(), 10u);
  p.seed.reset();
  EXPECT_NE(Draws(p, 1, 20, logits), Draws(p, 2, 20, logits));
}

// ---------------------------------------------------------------------------------------------
// Allocation: Sample allocates nothing without logprobs, and Accept nothing up to max_tokens.

TEST(SamplerAllocationTest, SampleAndAcceptDoNotAllocate) {
  std::mt19937_64 rng(8);
  const int64_t V = 3000;
  std::vector<SamplingParams> configs(6);
  configs[0].temperature = 0;  // plain greedy
  configs[1] = configs[0];
  configs[1].repetition_penalty = 1.3;  // greedy with processors
  configs[1].logit_bias = {{3, 2.0f}};
  configs[2].top_p = 0.9;  // random, top-p sorts
  configs[3].top_k = 40;
  configs[3].min_p = 0.05;
  configs[3].temperature = 0.7;
  configs[4].top_p = 0.8;
  configs[4].top_k = 100;
  configs[4].frequency_penalty = 0.5;
  configs[4].presence_penalty = 0.5;
  configs[4].repetition_penalty = 1.1;
  configs[4].allowed_token_ids.emplace(V / 2);
  std::iota(configs[4].allowed_token_ids->begin(), configs[4].allowed_token_ids->end(), 0);
  configs[4].bad_words_token_ids = {{5}, {6, 7}, {8, 9, 10}};
  configs[4].min_tokens = 5;
  configs[4].stop_token_ids = {1, 2};
  configs[5].top_p = 0.999;  // many candidates
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> eos = {0};
  const std::vector<float> logits = RandomLogits(V, 2, rng);
  std::vector<float> scratch(2 * V);
  for (size_t c = 0; c < configs.size(); ++c) {
    SCOPED_TRACE(c);
    SamplingParams& p = configs[c];
    p.max_tokens = 64;
    p.Normalize();
    RequestSampler s(p, prompt, eos, V, 1);
    SampledToken result;
    std::vector<int32_t> outputs;
    outputs.reserve(p.max_tokens);
    const int64_t before = HeapAllocations();
    for (int step = 0; step < p.max_tokens; ++step) {
      s.Sample(logits.data(), outputs, scratch.data(), &result);
      s.Accept(result.token);
      outputs.push_back(result.token);
    }
    EXPECT_EQ(HeapAllocations() - before, 0);
  }
}

// ---------------------------------------------------------------------------------------------
// Statistics: the tokens drawn follow the intended distribution.

// Regularized upper incomplete gamma Q(a, x) (series below a + 1, continued fraction above).
double GammaQ(double a, double x) {
  if (x <= 0) return 1.0;
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000 && term > sum * 1e-16; ++n) sum += term *= x / (a + n);
    return 1.0 - sum * std::exp(log_prefix);
  }
  const double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::abs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1 / d;
    const double delta = d * c;
    h *= delta;
    if (std::abs(delta - 1) < 1e-16) break;
  }
  return std::exp(log_prefix) * h;
}

// P(chi-square with df degrees > x).
double ChiSquarePValue(double x, int df) { return GammaQ(df / 2.0, x / 2.0); }

// The x with P(chi-square > x) = alpha, by bisection.
double ChiSquareQuantile(double alpha, int df) {
  double lo = 0, hi = 10.0 * df + 100;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (ChiSquarePValue(mid, df) > alpha ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

TEST(ChiSquareTest, KnownQuantiles) {
  EXPECT_NEAR(ChiSquareQuantile(0.001, 1), 10.828, 1e-3);
  EXPECT_NEAR(ChiSquareQuantile(0.001, 4), 18.467, 1e-3);
  EXPECT_NEAR(ChiSquareQuantile(0.001, 49), 85.351, 1e-2);
  EXPECT_NEAR(ChiSquarePValue(3.841, 1), 0.05, 1e-4);
}

// Samples needed so that any change of 1 % of the probability mass (total variation 0.01) is
// rejected at the 0.999 quantile with probability >= 0.999. A change delta gives the statistic a
// non-centrality lambda = N * sum(delta_i^2 / p_i); with sum |delta_i| = 0.02 split into a gain
// on a set A and a loss on a set B, Cauchy-Schwarz gives lambda >= N * 1e-4 * (1/P(A) + 1/P(B))
// >= N * 4e-4. The non-central chi-square is taken as normal (mean df + lambda, variance
// 2 (df + 2 lambda)); lambda is raised until its 0.1 % quantile passes the critical value.
int64_t SamplesFor1PercentShift(int df) {
  const double critical = ChiSquareQuantile(0.001, df);
  const double z999 = 3.090;
  double lambda = 0;
  while (df + lambda - z999 * std::sqrt(2 * (df + 2 * lambda)) < critical) lambda += 0.5;
  return static_cast<int64_t>(std::ceil(lambda / 4e-4));
}

struct ChiSquare {
  double statistic = 0;
  int df = 0;
};

// Pearson's statistic of counts against probs, bins with expected count < 5 pooled.
ChiSquare PearsonStatistic(const std::vector<int64_t>& counts, const std::vector<double>& probs,
                           int64_t n) {
  ChiSquare result;
  double pooled_expected = 0, pooled_observed = 0;
  int bins = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double expected = probs[i] * n;
    if (expected < 5) {
      pooled_expected += expected;
      pooled_observed += counts[i];
      continue;
    }
    result.statistic += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++bins;
  }
  if (pooled_expected >= 5) {
    result.statistic +=
        (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++bins;
  } else {
    // Too little to form its own bin: must be (nearly) empty.
    EXPECT_LT(pooled_observed, 20);
  }
  result.df = bins - 1;
  return result;
}

// Token ids by descending probability.
std::vector<size_t> ByProbability(const std::vector<double>& probs) {
  std::vector<size_t> idx(probs.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return probs[a] > probs[b]; });
  return idx;
}

// Moves 1 % of the mass from the most likely token to the second: of the 1 % changes between
// two tokens, the hardest to see.
std::vector<double> PairShifted(std::vector<double> probs) {
  const std::vector<size_t> idx = ByProbability(probs);
  probs[idx[0]] -= 0.01;
  probs[idx[1]] += 0.01;
  return probs;
}

// Moves 1 % of the mass from the likelier half of the distribution to the other half, in
// proportion to each token's probability: the 1 % change of least non-centrality (the bound
// in SamplesFor1PercentShift).
std::vector<double> WorstCaseShifted(std::vector<double> probs) {
  const std::vector<size_t> idx = ByProbability(probs);
  double top_mass = 0;
  size_t split = 0;
  while (split < idx.size() && top_mass < 0.5) top_mass += probs[idx[split++]];
  for (size_t j = 0; j < idx.size(); ++j) {
    const double p = probs[idx[j]];
    probs[idx[j]] += j < split ? -0.01 * p / top_mass : 0.01 * p / (1 - top_mass);
  }
  return probs;
}

TEST(SamplerStatisticsTest, DrawsFollowTheIntendedDistribution) {
  const int64_t V = 50;
  std::mt19937_64 rng(42);
  const std::vector<float> logits = RandomLogits(V, 1.5, rng);
  struct Config {
    const char* name;
    double temperature = 1, top_p = 1, min_p = 0;
    int64_t top_k = 0;
  };
  const std::vector<Config> configs = {
      {"temperature 1", 1.0},
      {"temperature 0.7", 0.7},
      {"top_p 0.8", 1.0, 0.8},
      {"top_k 5", 1.0, 1.0, 0.0, 5},
      {"min_p 0.1", 1.0, 1.0, 0.1},
      {"temperature 0.7 top_p 0.8 top_k 5", 0.7, 0.8, 0.0, 5},
      {"temperature 1.3 top_p 0.9 top_k 20 min_p 0.05", 1.3, 0.9, 0.05, 20},
  };
  for (const Config& c : configs) {
    SCOPED_TRACE(c.name);
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_p = c.top_p;
    p.top_k = c.top_k;
    p.min_p = c.min_p;
    p.seed = 2024;
    p.Normalize();
    const std::vector<double> expected = ReferenceSample(p, {}, {}, {}, logits).probs;
    int df = -1;
    for (double e : expected) df += e > 0;
    // Pooling only lowers df, which lowers the samples needed: this is enough.
    const int64_t n = std::max<int64_t>(200000, SamplesFor1PercentShift(df));

    RequestSampler s(p, {}, {}, V, 0);
    std::vector<float> scratch(2 * V);
    SampledToken result;
    std::vector<int64_t> counts(V, 0);
    for (int64_t i = 0; i < n; ++i) {
      s.Sample(logits.data(), {}, scratch.data(), &result);
      ++counts[result.token];
    }
    for (int64_t i = 0; i < V; ++i) {
      if (expected[i] == 0) {
        EXPECT_EQ(counts[i], 0) << "masked token " << i << " drawn";
      }
    }
    const ChiSquare fit = PearsonStatistic(counts, expected, n);
    const double critical = ChiSquareQuantile(0.001, fit.df);
    EXPECT_LT(fit.statistic, critical) << "df " << fit.df << " n " << n;
    // The same draws against distributions with 1 % of their mass moved are rejected: the test
    // above would fail for an error of that size.
    const ChiSquare pair = PearsonStatistic(counts, PairShifted(expected), n);
    EXPECT_GT(pair.statistic, ChiSquareQuantile(0.001, pair.df)) << "df " << pair.df;
    const ChiSquare worst = PearsonStatistic(counts, WorstCaseShifted(expected), n);
    EXPECT_GT(worst.statistic, ChiSquareQuantile(0.001, worst.df)) << "df " << worst.df;
    std::printf("%-46s n %6lld df %2d: chi2 %5.1f < %5.1f; 1%% moved: %5.1f, %5.1f\n", c.name,
                static_cast<long long>(n), fit.df, fit.statistic, critical, pair.statistic,
                worst.statistic);
  }
}

// A target distribution for the verification tests: random logits over 50 tokens through
// temperature 0.8 (and top_k), its exact probabilities, and the sample size of a 1 % shift.
struct VerifyTarget {
  static constexpr int64_t kVocab = 50;
  std::vector<float> logits;
  SamplingParams params;
  std::vector<double> expected;
  int64_t n = 0;

  VerifyTarget(int64_t top_k, int64_t seed) {
    std::mt19937_64 rng(7);
    logits = RandomLogits(kVocab, 1.5, rng);
    params.temperature = 0.8;
    params.top_k = top_k;
    params.seed = seed;
    params.Normalize();
    expected = ReferenceSample(params, {}, {}, {}, logits).probs;
    int df = -1;
    for (double e : expected) df += e > 0;
    n = std::max<int64_t>(200000, SamplesFor1PercentShift(df));
  }
};

// Speculative verification with a one-hot draft (MTP's argmax, n-gram): token = the draft with
// probability p(draft), else a draw from p without it. Whatever the draft, the tokens a row emits
// follow p exactly -- the property that makes speculative decoding lossless (arXiv 2211.17192).
TEST(SamplerStatisticsTest, VerifiedTokensFollowTheTargetDistribution) {
  const VerifyTarget target(/*top_k=*/30, /*seed=*/99);
  const int64_t V = VerifyTarget::kVocab, n = target.n;
  const std::vector<float>& logits = target.logits;
  const SamplingParams& p = target.params;
  const std::vector<double>& expected = target.expected;
  const std::vector<size_t> order = ByProbability(expected);
  // Drafts the target likes, finds middling, and rules out (top-k masks it).
  const int32_t masked = static_cast<int32_t>(order.back());
  ASSERT_EQ(expected[masked], 0.0);
  for (const int32_t draft :
       {static_cast<int32_t>(order[0]), static_cast<int32_t>(order[8]), masked}) {
    SCOPED_TRACE(fmt::format("draft {} (p = {:.4f})", draft, expected[draft]));
    RequestSampler s(p, {}, {}, V, 0);
    std::vector<float> scratch(2 * V);
    SampledToken result;
    std::vector<int64_t> counts(V, 0);
    int64_t accepted = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool ok = s.Verify(logits.data(), {}, draft, scratch.data(), &result);
      EXPECT_EQ(ok, result.token == draft);
      accepted += ok;
      ++counts[result.token];
    }
    EXPECT_EQ(counts[masked], 0) << "a token the target rules out was emitted";
    // The acceptance rate is p(draft): within 5 standard deviations.
    const double sd = std::sqrt(expected[draft] * (1 - expected[draft]) / n);
    EXPECT_NEAR(static_cast<double>(accepted) / n, expected[draft], 5 * sd + 1e-12);
    const ChiSquare fit = PearsonStatistic(counts, expected, n);
    EXPECT_LT(fit.statistic, ChiSquareQuantile(0.001, fit.df)) << "df " << fit.df;
    // A 1 % error would have been seen.
    const ChiSquare worst = PearsonStatistic(counts, WorstCaseShifted(expected), n);
    EXPECT_GT(worst.statistic, ChiSquareQuantile(0.001, worst.df));
    std::printf("verify draft %2d p %.4f: accepted %.4f, chi2 %5.1f (df %d); 1%% moved: %5.1f\n",
                draft, expected[draft], static_cast<double>(accepted) / n, fit.statistic, fit.df,
                worst.statistic);
  }
}

// A wrong rejection rule is caught: accepting the draft with probability sqrt(p(d)) (a rule of
// the same shape that is not lossless) makes the emitted tokens fail the same test.
TEST(SamplerStatisticsTest, AWrongAcceptanceRuleIsRejected) {
  const VerifyTarget target(/*top_k=*/0, /*seed=*/5);
  const int64_t V = VerifyTarget::kVocab, n = target.n;
  const std::vector<float>& logits = target.logits;
  const SamplingParams& p = target.params;
  const std::vector<double>& expected = target.expected;
  const int32_t draft = static_cast<int32_t>(ByProbability(expected)[3]);
  RequestSampler s(p, {}, {}, V, 0);
  std::vector<float> scratch(2 * V);
  SampledToken result;
  std::vector<int64_t> counts(V, 0);
  std::mt19937_64 coin(11);
  std::uniform_real_distribution<double> uniform(0, 1);
  for (int64_t i = 0; i < n; ++i) {
    // Accept with sqrt(p) instead of p, otherwise the sampler's own recovered draw.
    if (uniform(coin) < std::sqrt(expected[draft])) {
      ++counts[draft];
      continue;
    }
    do {
      s.Verify(logits.data(), {}, draft, scratch.data(), &result);
    } while (result.token == draft);
    ++counts[result.token];
  }
  const ChiSquare fit = PearsonStatistic(counts, expected, n);
  EXPECT_GT(fit.statistic, ChiSquareQuantile(0.001, fit.df));
}

// Verification draws each row's token as Sample does, with one uniform of the request's
// generator: whatever the drafts, a seeded request emits the tokens it would without them.
TEST(SamplerTest, VerifyEmitsWhatSampleWouldWhateverTheDraft) {
  const int64_t V = 60;
  std::mt19937_64 rng(21);
  SamplingParams p;
  p.temperature = 0.9;
  p.top_p = 0.9;
  p.presence_penalty = 0.5;
  p.seed = 77;
  p.Normalize();
  RequestSampler plain(p, {}, {}, V, 0), verifying(p, {}, {}, V, 0);
  std::vector<float> scratch(2 * V);
  std::vector<int32_t> outputs;
  SampledToken a, b;
  int64_t accepted = 0;
  for (int i = 0; i < 2000; ++i) {
    const std::vector<float> logits = RandomLogits(V, 2.0, rng);
    plain.Sample(logits.data(), outputs, scratch.data(), &a);
    const int32_t draft = i % 3 == 0 ? a.token : static_cast<int32_t>(rng() % V);
    accepted += verifying.Verify(logits.data(), outputs, draft, scratch.data(), &b);
    ASSERT_EQ(a.token, b.token) << "step " << i;
    plain.Accept(a.token);
    verifying.Accept(b.token);
    outputs.push_back(a.token);
  }
  EXPECT_GE(accepted, 2000 / 3);
}

TEST(SamplerTest, GreedyVerifyAcceptsExactlyTheArgmax) {
  const int64_t V = 40;
  std::mt19937_64 rng(3);
  const std::vector<float> logits = RandomLogits(V, 2.0, rng);
  const int32_t argmax = GreedyToken(logits.data(), V);
  for (const bool penalty : {false, true}) {
    SamplingParams p;
    p.temperature = 0;
    if (penalty) p.repetition_penalty = 1.5;
    p.Normalize();
    const std::vector<int32_t> outputs = {argmax};  // the penalty may move the argmax
    RequestSampler s(p, {}, {}, V, 0);
    std::vector<float> scratch(2 * V);
    SampledToken sampled, verified;
    s.Sample(logits.data(), outputs, scratch.data(), &sampled);
    for (int32_t draft = 0; draft < V; ++draft) {
      EXPECT_EQ(s.Verify(logits.data(), outputs, draft, scratch.data(), &verified),
                draft == sampled.token);
      EXPECT_EQ(verified.token, sampled.token);
    }
  }
}

// ---- Structured output ----

// A vocabulary of single bytes, a few multi-byte tokens and an EOS (id 9), and the regex
// (ab|c)+d over it.
struct GrammarFixture {
  static constexpr int32_t kEos = 9;
  std::vector<std::string> bytes = {"a", "b", "c", "d", "ab", "abc", "cd", "x", "da", ""};
  std::shared_ptr<const structured::CompiledGrammar> grammar;
  GrammarFixture() {
    auto vocab = structured::Vocabulary::Create(bytes, {kEos});
    CHECK(vocab.ok());
    auto g = structured::Compile({structured::GrammarSpec::Kind::kRegex, "(ab|c)+d", {}}, *vocab);
    CHECK(g.ok());
    grammar = *g;
  }
  int64_t vocab() const { return static_cast<int64_t>(bytes.size()); }
  std::shared_ptr<const PreparedParams> Prepare(SamplingParams p) const {
    p.structured_outputs =
        structured::GrammarSpec{structured::GrammarSpec::Kind::kRegex, "(ab|c)+d", {}};
    auto prepared = PrepareParams(p, std::vector<int32_t>{kEos}, vocab(), grammar);
    CHECK(prepared.ok()) << prepared.status().ToString();
    return *prepared;
  }
};

TEST(SamplerGrammarTest, EveryRandomOutputIsASentence) {
  const GrammarFixture f;
  std::mt19937_64 rng(5);
  SamplingParams p;
  p.temperature = 1.0;
  const auto prepared = f.Prepare(p);
  std::vector<float> scratch(2 * f.vocab());
  const std::regex pattern("(ab|c)+d");
  int ended = 0;
  for (int run = 0; run < 300; ++run) {
    RequestSampler sampler(prepared, {}, f.vocab(), rng());
    std::vector<int32_t> outputs;
    std::string text;
    SampledToken t;
    for (int step = 0; step < 40; ++step) {
      const std::vector<float> logits = RandomLogits(f.vocab(), 3.0, rng);
      sampler.Sample(logits.data(), outputs, scratch.data(), &t);
      sampler.Accept(t.token);
      outputs.push_back(t.token);
      if (t.token == GrammarFixture::kEos) break;
      text += f.bytes[t.token];
      ASSERT_NE(t.token, 7) << "x is never allowed";
    }
    if (t.token == GrammarFixture::kEos) {
      ++ended;
      EXPECT_TRUE(std::regex_match(text, pattern)) << text;
      EXPECT_TRUE(sampler.matcher()->IsFinished());
    }
  }
  EXPECT_GT(ended, 100);
}

TEST(SamplerGrammarTest, GreedyTakesTheBestAllowedTokenAndLogprobsAreMasked) {
  const GrammarFixture f;
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 3;
  RequestSampler sampler(f.Prepare(p), {}, f.vocab(), 1);
  EXPECT_FALSE(sampler.plain_greedy());
  const std::vector<float> logits = {0, 0, 1, 0, 2, 3, 0, 9, 0, 8};
  std::vector<float> scratch(2 * f.vocab());
  SampledToken t;
  sampler.Sample(logits.data(), {}, scratch.data(), &t);
  // Allowed first: a, c, ab, abc, cd. The best of them, not x or EOS.
  EXPECT_EQ(t.token, 5);
  std::vector<int32_t> top_ids;
  for (const TokenLogprob& e : t.top) top_ids.push_back(e.token);
  EXPECT_EQ(top_ids, (std::vector<int32_t>{5, 4, 2}));
  // Logprobs of the masked distribution (as vLLM's, whose bitmask comes before the sampler).
  const double z = 2 * std::exp(0.0) + std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(t.sampled.logprob, 3.0 - std::log(z), 1e-5);
}

TEST(SamplerGrammarTest, TheGrammarWinsWhenTheProcessorsLeaveNothing) {
  const GrammarFixture f;
  SamplingParams p;
  p.temperature = 1.0;
  p.min_tokens = 5;  // masks EOS, which alone is allowed once "cd" is read
  RequestSampler sampler(f.Prepare(p), {}, f.vocab(), 7);
  sampler.Accept(6);  // "cd"
  std::vector<float> logits(f.vocab(), 0.0f);
  std::vector<float> scratch(2 * f.vocab());
  SampledToken t;
  const std::vector<int32_t> outputs = {6};
  sampler.Sample(logits.data(), outputs, scratch.data(), &t);
  EXPECT_EQ(t.token, GrammarFixture::kEos);
}

// With structured_outputs_after_token (a reasoning model's </think>), tokens are free until that
// token, and the grammar holds from the next one.
TEST(SamplerGrammarTest, TheGrammarWakesAfterItsToken) {
  const GrammarFixture f;
  SamplingParams p;
  p.temperature = 0;
  p.structured_outputs_after_token = 8;  // "da" stands for </think>
  RequestSampler sampler(f.Prepare(p), {}, f.vocab(), 1);
  std::vector<float> logits(f.vocab(), 0.0f);
  logits[7] = 5;  // "x": refused by the grammar, the favourite
  std::vector<float> scratch(2 * f.vocab());
  SampledToken t;
  sampler.Sample(logits.data(), {}, scratch.data(), &t);
  EXPECT_EQ(t.token, 7);  // free before the token
  sampler.Accept(7);
  sampler.Accept(8);  // the answer starts
  sampler.Sample(logits.data(), {}, scratch.data(), &t);
  EXPECT_NE(t.token, 7);
  EXPECT_EQ(sampler.matcher()->num_tokens(), 0);  // neither token went to the grammar
}

// With structured_outputs_rearm the grammar sleeps again once complete, and wakes at the next
// trigger with a fresh matcher: (ab|c)+d sentences among free text, each after a "da".
TEST(SamplerGrammarTest, ARearmedGrammarSleepsWhenCompleteAndWakesAgain) {
  const GrammarFixture f;
  SamplingParams p;
  p.temperature = 1.0;
  p.structured_outputs_after_token = 8;
  p.structured_outputs_rearm = true;
  const auto prepared = f.Prepare(p);
  std::mt19937_64 rng(3);
  std::vector<float> scratch(2 * f.vocab());
  const std::regex sentence("(ab|c)+d");
  int sentences = 0, free_x = 0;
  for (int run = 0; run < 50; ++run) {
    RequestSampler sampler(prepared, {}, f.vocab(), rng());
    std::string text;
    bool inside = false;
    SampledToken t;
    for (int step = 0; step < 60; ++step) {
      std::vector<float> logits = RandomLogits(f.vocab(), 2.0, rng);
      logits[8] += 2;  // wake often
      logits[GrammarFixture::kEos] = -1e9;
      sampler.Sample(logits.data(), {}, scratch.data(), &t);
      sampler.Accept(t.token);
      if (inside) {
        ASSERT_NE(t.token, 7) << "x inside a sentence";
        text += f.bytes[t.token];
        if (std::regex_match(text, sentence)) {  // nothing can follow a sentence's d
          ++sentences;
          inside = false;  // complete: asleep again
          text.clear();
        }
      } else if (t.token == 8) {
        inside = true;
      } else {
        free_x += t.token == 7;  // refused inside, free outside
      }
    }
  }
  EXPECT_GT(sentences, 20);
  EXPECT_GT(free_x, 20);
}

TEST(SamplerGrammarTest, ARequestAskingForAGrammarNeedsOne) {
  SamplingParams p;
  p.structured_outputs = structured::GrammarSpec{structured::GrammarSpec::Kind::kRegex, "a", {}};
  EXPECT_FALSE(PrepareParams(p, std::vector<int32_t>{0}, 10).ok());
  const GrammarFixture f;
  EXPECT_FALSE(PrepareParams(SamplingParams{}, std::vector<int32_t>{0}, 10, f.grammar).ok());
}

}  // namespace
}  // namespace moeserve::engine
