#include "engine/spec_decode/draft_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "engine/spec_decode/spec_config.h"

namespace moeserve::engine {

DraftPolicy::DraftPolicy(bool stop_idle_requests) : stop_idle_requests_(stop_idle_requests) {
  candidates_.reserve(kMaxStepTokens * kMaxSpeculativeTokens);
}

void DraftPolicy::Update(Cost& c, double nanos, int64_t step) {
  c.nanos = c.measured_at < 0 ? nanos : c.nanos + kCostSmoothing * (nanos - c.nanos);
  c.measured_at = step;
}

void DraftPolicy::RecordForward(int64_t tokens, int64_t nanos) {
  if (tokens >= 1 && tokens <= kMaxStepTokens) Update(forward_[tokens], nanos, step_);
}

void DraftPolicy::RecordPropose(int64_t passes, int64_t nanos) {
  if (passes >= 0 && passes <= kMaxSpeculativeTokens) Update(propose_[passes], nanos, step_);
}

void DraftPolicy::RecordVerify(int64_t drafts, int64_t accepted) {
  // As the scheduler's per-request estimate (Scheduler::Update), over every request.
  constexpr float a = SpecConfig::kAcceptanceSmoothing;
  for (int64_t pos = 0; pos < accepted && pos < kMaxSpeculativeTokens; ++pos) {
    acceptance_[pos] += a * (1.0f - acceptance_[pos]);
  }
  if (accepted < drafts && accepted < kMaxSpeculativeTokens) acceptance_[accepted] *= 1.0f - a;
}

double DraftPolicy::Estimate(std::span<const Cost> table, int64_t n) const {
  for (int64_t m = std::min<int64_t>(n, static_cast<int64_t>(table.size()) - 1); m >= 0; --m) {
    if (Fresh(table[m])) return table[m].nanos;
  }
  return 0;
}

double DraftPolicy::ForwardEstimate(int64_t n, int64_t frontier) const {
  const double at = Estimate(forward_, n);
  if (n <= frontier || frontier < 2 || !Fresh(forward_[frontier])) return at;
  const double below = Estimate(forward_, frontier - 1);
  return below > 0 ? at + std::max(0.0, at - below) * static_cast<double>(n - frontier) : at;
}

void DraftPolicy::Choose(std::span<Request* const> requests, std::span<const int32_t> limit,
                         std::span<int32_t> budget) {
  CHECK_EQ(requests.size(), limit.size());
  CHECK_EQ(requests.size(), budget.size());
  ++step_;
  const auto b = static_cast<int64_t>(requests.size());
  std::fill(budget.begin(), budget.end(), 0);
  // The longest fresh measured step: one token beyond it is the furthest a choice may go.
  int64_t frontier = 0;
  for (int64_t n = kMaxStepTokens; n >= 1; --n) {
    if (Fresh(forward_[n])) {
      frontier = n;
      break;
    }
  }
  candidates_.clear();
  for (int64_t i = 0; i < b; ++i) {
    Request& r = *requests[i];
    if (r.drafts_stopped) continue;
    if (!r.draft_policy_seen) {
      r.draft_policy_seen = true;
      r.draft_acceptance = acceptance_;
    }
    float reach = 1;
    for (int32_t j = 0; j < limit[i]; ++j) {
      reach *= r.draft_acceptance[j];
      candidates_.push_back({reach, static_cast<int32_t>(i), j + 1});
    }
  }
  // Larger reach first; among equals the shallower draft, then the earlier request (a request's
  // reaches never rise, so every prefix of this order is a prefix of each request's drafts).
  std::sort(candidates_.begin(), candidates_.end(), [](const Candidate& x, const Candidate& y) {
    if (x.reach != y.reach) return x.reach > y.reach;
    if (x.depth != y.depth) return x.depth < y.depth;
    return x.request < y.request;
  });
  const int64_t longest = std::min(kMaxStepTokens, frontier + 1);
  const int64_t max_drafts =
      std::clamp<int64_t>(longest - b, 0, static_cast<int64_t>(candidates_.size()));
  // Rate of D drafts: expected tokens / expected time; an unknown (zero) cost is tried first.
  // No drafts, when idle requests stop, is weighed as what it leads to: no drafting at all.
  auto rate = [&](int64_t drafts, double tokens, int64_t passes) {
    const double t = ForwardEstimate(b + drafts, frontier) +
                     (drafts == 0 && stop_idle_requests_ ? 0.0 : Estimate(propose_, passes));
    return t > 0 ? tokens / t : std::numeric_limits<double>::infinity();
  };
  int64_t best = 0, passes = 0;
  double tokens = static_cast<double>(b);
  double best_rate = rate(0, tokens, 0);
  for (int64_t d = 1; d <= max_drafts && std::isfinite(best_rate); ++d) {
    const Candidate& c = candidates_[d - 1];
    tokens += c.reach;
    passes = std::max<int64_t>(passes, c.depth);
    const double r = rate(d, tokens, passes);
    if (r > best_rate) {
      best_rate = r;
      best = d;
    }
  }
  for (int64_t d = 0; d < best; ++d) ++budget[candidates_[d].request];
  for (int64_t i = 0; i < b; ++i) {
    Request& r = *requests[i];
    if (r.drafts_stopped) continue;
    r.steps_without_drafts = budget[i] > 0 ? 0 : r.steps_without_drafts + 1;
    // A request limited by max_tokens or the context is not idle by choice.
    if (stop_idle_requests_ && limit[i] > 0 && r.steps_without_drafts >= kStopAfter) {
      r.drafts_stopped = true;
    }
  }
}

}  // namespace moeserve::engine
