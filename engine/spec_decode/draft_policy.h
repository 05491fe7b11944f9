// Drafts sized by cost (--spec mtp:auto, ngram:auto; docs/performance.md, "Speculative decoding
// on inflated models"). Drafting pays only while the tokens a verify step is expected to emit
// grow faster than its cost: on a bandwidth-bound MoE a step of 1 + K tokens reads the union of
// their experts (up to 1 + K times a token's bytes), on a small model a step of several tokens is
// compute-bound. So before each step the policy picks, for the b requests about to decode, the
// drafts D_i of each maximizing
//
//   expected tokens / expected time = (b + sum_i sum_{j < D_i} reach_ij)
//                                     / (forward(b + sum_i D_i) + propose(max_i D_i))
//
// reach_ij = a_i0 * ... * a_ij: request i's chance that its draft j is accepted (its running
// acceptance per position); forward(n): the measured time of a decode step of n tokens (the
// whole step but drafting); propose(p): of drafting p positions deep (an MTP head pass each).
// Both are running averages of this engine's own steps. Reach falls along a request's drafts, so
// the best total of D drafts is the D largest reaches: one sorted pass tries every D.
//
// Exploration: a cost not measured (or not measured for kStaleSteps steps) is taken as the
// largest measured one below it -- optimistic, so it gets tried -- but steps only one token
// longer than the longest measured are considered, costed as that one plus the last measured
// token's increment, so a new engine walks up a draft at a time and stops where measured costs
// say. Requests start from the acceptance seen so far by all (0.5 per position before any). An MTP
// request whose best choice was no drafts kStopAfter steps in a row stops drafting for good: the
// head stops running over its tokens, which is what makes "no drafts" as cheap as --spec none.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/request.h"

namespace moeserve::engine {

class DraftPolicy {
 public:
  // Steps of more tokens are not measured and never chosen to draft into.
  static constexpr int64_t kMaxStepTokens = 64;
  static constexpr int64_t kStaleSteps = 256;
  static constexpr int32_t kStopAfter = 8;
  static constexpr double kCostSmoothing = 0.2;  // weight of the newest measurement

  // stop_idle_requests: a request that has not drafted for kStopAfter steps stops for good (MTP:
  // its head's pass over every token is the cost of staying ready; n-gram lookup costs nothing).
  explicit DraftPolicy(bool stop_idle_requests);

  // A decode step (every request one token plus its drafts) of `tokens` tokens took `nanos`,
  // drafting excluded.
  void RecordForward(int64_t tokens, int64_t nanos);
  // Drafting up to `passes` positions deep (0: none, for MTP still its pass over the verified
  // tokens) took `nanos`.
  void RecordPropose(int64_t passes, int64_t nanos);
  // A verify step of request r decided `drafts` positions, `accepted` of them accepted: the
  // acceptance new requests start from.
  void RecordVerify(int64_t drafts, int64_t accepted);

  // The drafts of each request of the next step: limit[i] (0 .. kMaxSpeculativeTokens, what
  // max_tokens and max_model_len leave) caps budget[i]. Requests not stopped take the running
  // acceptance on their first call; a request idle for kStopAfter steps is stopped
  // (r.drafts_stopped).
  void Choose(std::span<Request* const> requests, std::span<const int32_t> limit,
              std::span<int32_t> budget);

  // The estimates (tests, docs): forward(n) / propose(p) in nanoseconds, 0 when unknown.
  double forward_estimate(int64_t tokens) const { return Estimate(forward_, tokens); }
  double propose_estimate(int64_t passes) const { return Estimate(propose_, passes); }

 private:
  struct Cost {
    double nanos = 0;
    int64_t measured_at = -1;  // step of the last measurement; -1: never
  };
  bool Fresh(const Cost& c) const {
    return c.measured_at >= 0 && step_ - c.measured_at < kStaleSteps;
  }
  // The cost of `n`, or of the largest fresh entry below it, or 0.
  double Estimate(std::span<const Cost> table, int64_t n) const;
  // forward(n) for a choice: Estimate, but one token beyond the longest fresh step `frontier`
  // costs as much more as the token before it did.
  double ForwardEstimate(int64_t n, int64_t frontier) const;
  static void Update(Cost& c, double nanos, int64_t step);

  bool stop_idle_requests_;
  int64_t step_ = 0;
  std::array<Cost, kMaxStepTokens + 1> forward_ = {};
  std::array<Cost, kMaxSpeculativeTokens + 1> propose_ = {};
  // Over all requests; before any verify step, an even chance per position.
  std::array<float, kMaxSpeculativeTokens> acceptance_ = {0.5f, 0.5f, 0.5f, 0.5f};
  struct Candidate {
    float reach;
    int32_t request;
    int32_t depth;  // 1-based: the draft's position
  };
  std::vector<Candidate> candidates_;
};

}  // namespace moeserve::engine
