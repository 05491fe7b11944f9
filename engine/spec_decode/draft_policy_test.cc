// DraftPolicy (drafts sized by cost) against step costs and acceptance set by the test: it
// explores one draft at a time, settles on the K that maximizes expected tokens per second, stops
// idle MTP requests, and forgets costs it has not measured for a while.
#include "engine/spec_decode/draft_policy.h"

#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <vector>

namespace moeserve::engine {
namespace {

// Runs `steps` steps of one request against a modelled machine: forward(n) for a step of n
// tokens, propose(p) for p drafts deep; returns the budgets chosen.
std::vector<int32_t> RunSteps(DraftPolicy& policy, Request& r, int steps,
                              const std::function<double(int64_t)>& forward,
                              const std::function<double(int64_t)>& propose) {
  std::vector<int32_t> chosen;
  int32_t budget = 0;
  for (int s = 0; s < steps; ++s) {
    // The step verifies last step's drafts, then drafts for the next.
    policy.RecordForward(1 + budget, static_cast<int64_t>(forward(1 + budget)));
    Request* requests[] = {&r};
    const int32_t limit[] = {kMaxSpeculativeTokens};
    int32_t next[] = {0};
    policy.Choose(requests, limit, next);
    policy.RecordPropose(next[0], static_cast<int64_t>(propose(next[0])));
    budget = next[0];
    chosen.push_back(budget);
  }
  return chosen;
}

// A request the policy has seen, accepted with probability a at every position.
void Seen(Request& r, float a) {
  r.draft_policy_seen = true;
  r.draft_acceptance = {a, a, a, a};
}

TEST(DraftPolicyTest, ChoosesTheKWithTheMostTokensPerSecond) {
  // A compute-bound step of n tokens costs 1 + 0.2 (n - 1); drafts always accepted: the more
  // the better, so it walks up to K = 4 and stays.
  {
    DraftPolicy policy(/*stop_idle_requests=*/true);
    Request r;
    Seen(r, 1);
    const auto chosen = RunSteps(
        policy, r, 20, [](int64_t n) { return 1e6 * (1 + 0.2 * (n - 1)); },
        [](int64_t) { return 0.0; });
    // One draft more than the longest step measured, one at a time (RunSteps measures a plain
    // step before the first choice).
    EXPECT_EQ(chosen[0], 1);
    EXPECT_EQ(chosen[1], 2);
    EXPECT_EQ(chosen[2], 3);
    EXPECT_EQ(chosen.back(), 4);
    EXPECT_FALSE(r.drafts_stopped);
  }
  {
    // Nothing measured at all: no drafts (the plain step is measured first).
    DraftPolicy policy(true);
    Request r;
    Request* requests[] = {&r};
    const int32_t limit[] = {4};
    int32_t budget[] = {-1};
    policy.Choose(requests, limit, budget);
    EXPECT_EQ(budget[0], 0);
    EXPECT_FALSE(r.drafts_stopped);
  }
  // The same machine, acceptance 0.5 per position: tokens 1, 1.5, 1.75, 1.875, 1.94 against
  // cost 1, 1.2, 1.4, 1.6, 1.8: rates 1, 1.25, 1.25, 1.17, 1.08 -- K = 1 (ties go to fewer).
  {
    DraftPolicy policy(true);
    Request r;
    Seen(r, 0.5f);
    const auto chosen = RunSteps(
        policy, r, 30, [](int64_t n) { return 1e6 * (1 + 0.2 * (n - 1)); },
        [](int64_t) { return 0.0; });
    EXPECT_EQ(chosen.back(), 1);
  }
}

TEST(DraftPolicyTest, StopsARequestWhenNoDraftsPayAndCountsTheMtpPass) {
  // A bandwidth-bound MoE: a step of n tokens reads the union of their experts (cost ~ n), the
  // MTP pass costs 0.1 even without drafts. Acceptance 0.7: K = 1 yields 1.7 tokens for 2.1:
  // worse than no drafting at all (1 for 1), though better than no drafts with the pass (1 for
  // 1.1). The request stops after kStopAfter idle steps.
  DraftPolicy policy(true);
  Request r;
  Seen(r, 0.7f);
  const auto chosen = RunSteps(
      policy, r, 20, [](int64_t n) { return 1e6 * n; }, [](int64_t) { return 1e5; });
  EXPECT_TRUE(r.drafts_stopped);
  int drafted = 0;
  for (int32_t k : chosen) drafted += k > 0;
  EXPECT_LE(drafted, 2);  // the exploration: one draft, measured too dear
  // Without stopping (n-gram: no pass to save), no drafts are chosen either, the request goes on.
  DraftPolicy ngram(false);
  Request q;
  Seen(q, 0.7f);
  const auto plain = RunSteps(
      ngram, q, 20, [](int64_t n) { return 1e6 * n; }, [](int64_t) { return 0.0; });
  EXPECT_EQ(plain.back(), 0);
  EXPECT_FALSE(q.drafts_stopped);
}

TEST(DraftPolicyTest, NewRequestsStartFromTheAcceptanceSeenSoFar) {
  DraftPolicy policy(true);
  for (int i = 0; i < 50; ++i) policy.RecordVerify(4, 0);  // every first draft rejected
  Request r;
  Request* requests[] = {&r};
  const int32_t limit[] = {4};
  int32_t budget[] = {-1};
  policy.Choose(requests, limit, budget);
  EXPECT_TRUE(r.draft_policy_seen);
  EXPECT_LT(r.draft_acceptance[0], 0.01f);
  EXPECT_EQ(budget[0], 0);
}

TEST(DraftPolicyTest, SharesDraftsAmongRequestsByReach) {
  // Two requests, a step's cost flat up to 4 tokens then steep: 2 drafts fit; they go to the
  // likelier ones (request 0's first two: 0.9, 0.81 beat request 1's 0.3).
  DraftPolicy policy(false);
  for (int64_t n = 1; n <= 8; ++n) policy.RecordForward(n, n <= 4 ? 1000000 : 1000000 * n);
  policy.RecordPropose(0, 0);
  Request a, c;
  Seen(a, 0.9f);
  Seen(c, 0.3f);
  Request* requests[] = {&a, &c};
  const int32_t limit[] = {4, 4};
  int32_t budget[] = {0, 0};
  policy.Choose(requests, limit, budget);
  EXPECT_EQ(budget[0], 2);
  EXPECT_EQ(budget[1], 0);
  // A limit caps a request's drafts (max_tokens, max_model_len).
  const int32_t capped[] = {1, 4};
  policy.Choose(requests, capped, budget);
  EXPECT_EQ(budget[0], 1);
  EXPECT_EQ(budget[1], 1);
}

TEST(DraftPolicyTest, CostsNotMeasuredForLongAreForgotten) {
  DraftPolicy policy(false);
  policy.RecordForward(1, 1000);
  EXPECT_EQ(policy.forward_estimate(1), 1000);
  EXPECT_EQ(policy.forward_estimate(3), 1000);  // the largest measured below
  EXPECT_EQ(policy.forward_estimate(0), 0);
  Request r;
  Request* requests[] = {&r};
  const int32_t limit[] = {0};
  int32_t budget[] = {0};
  for (int64_t s = 0; s < DraftPolicy::kStaleSteps; ++s) policy.Choose(requests, limit, budget);
  EXPECT_EQ(policy.forward_estimate(1), 0);
  // Out-of-range measurements are ignored.
  policy.RecordForward(DraftPolicy::kMaxStepTokens + 1, 5);
  policy.RecordForward(0, 5);
  policy.RecordPropose(kMaxSpeculativeTokens + 1, 5);
  EXPECT_EQ(policy.forward_estimate(DraftPolicy::kMaxStepTokens), 0);
}

}  // namespace
}  // namespace moeserve::engine
