#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "core/check.h"

namespace moeserve::engine {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// GatherLogprobs keeps small top-n lists by insertion (one compare per token for most of the
// vocabulary); larger ones sort an index array.
constexpr int64_t kMaxInsertionTopN = 64;

// top-p bins the tokens by logit below the max: kTopPBuckets bins over kTopPRange nats (weights
// down to e^-32 ~ 1e-14 of the max), the last bin catching everything lighter.
constexpr int64_t kTopPBuckets = 4096;
constexpr float kTopPRange = 32.0f;

// The k-th largest of values [n] (1 <= k < n); buffer holds n floats. Small k keeps a min-heap
// of the k largest (one compare for most values), large k selects in a copy.
float KthLargest(const float* values, int64_t n, int64_t k, float* buffer) {
  if (k * 16 > n) {
    std::copy(values, values + n, buffer);
    std::nth_element(buffer, buffer + (k - 1), buffer + n, std::greater<float>());
    return buffer[k - 1];
  }
  std::copy(values, values + k, buffer);
  std::make_heap(buffer, buffer + k, std::greater<float>());
  for (int64_t i = k; i < n; ++i) {
    if (values[i] > buffer[0]) {
      std::pop_heap(buffer, buffer + k, std::greater<float>());
      buffer[k - 1] = values[i];
      std::push_heap(buffer, buffer + k, std::greater<float>());
    }
  }
  return buffer[0];
}

// Sorted, without repeats.
std::vector<int32_t> SortedUnique(std::vector<int32_t> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace

int32_t GreedyToken(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

void LogSoftmax(const float* logits, int64_t vocab, float* out) {
  float max = kNegInf;
  for (int64_t i = 0; i < vocab; ++i) max = std::max(max, logits[i]);
  if (max == kNegInf) {  // nothing possible: every logprob is -inf
    std::fill(out, out + vocab, kNegInf);
    return;
  }
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(logits[i] - max);
  const double log_normalizer = static_cast<double>(max) + std::log(sum);
  for (int64_t i = 0; i < vocab; ++i) {
    out[i] = static_cast<float>(static_cast<double>(logits[i]) - log_normalizer);
  }
}

void GatherLogprobs(const float* logprobs, int64_t vocab, int64_t n, int32_t token,
                    SampledToken* result) {
  CHECK(token >= 0 && token < vocab) << "token " << token << " outside [0, " << vocab << ")";
  if (n < 0 || n > vocab) n = vocab;
  const float own = logprobs[token];
  // vLLM's rank: the number of tokens whose logprob is >= the token's own (ties count against it).
  int64_t at_least = 0;
  for (int64_t i = 0; i < vocab; ++i) at_least += logprobs[i] >= own;
  result->sampled = TokenLogprob{token, own, at_least};

  std::vector<TokenLogprob>& top = result->top;
  top.clear();
  if (n == 0) return;
  top.reserve(n);
  if (n <= kMaxInsertionTopN) {
    // Ids arrive ascending, so an equal logprob already listed has the lower id and stays ahead.
    for (int64_t i = 0; i < vocab; ++i) {
      const float lp = logprobs[i];
      if (static_cast<int64_t>(top.size()) == n) {
        if (!(lp > top.back().logprob)) continue;
        top.pop_back();
      }
      auto at = std::find_if(top.begin(), top.end(),
                             [lp](const TokenLogprob& e) { return e.logprob < lp; });
      top.insert(at, TokenLogprob{static_cast<int32_t>(i), lp, 0});
    }
  } else {
    std::vector<int32_t> ids(vocab);
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [logprobs](int32_t a, int32_t b) {
      return logprobs[a] > logprobs[b] || (logprobs[a] == logprobs[b] && a < b);
    });
    for (int64_t i = 0; i < n; ++i) top.push_back(TokenLogprob{ids[i], logprobs[ids[i]], 0});
  }
  // vLLM's top-N ranks are positions: 1 .. n.
  for (size_t i = 0; i < top.size(); ++i) top[i].rank = static_cast<int64_t>(i) + 1;
}

SamplerTables::SamplerTables(const SamplingParams& p, std::span<const int32_t> eos_token_ids,
                             int64_t vocab) {
  CHECK_GT(vocab, 0);
  auto check_id = [vocab](int32_t id, const char* what) {
    CHECK(id >= 0 && id < vocab) << what << " token " << id << " outside [0, " << vocab << ")";
  };
  if (p.allowed_token_ids.has_value()) {
    allowed_ids = SortedUnique(*p.allowed_token_ids);
    CHECK(!allowed_ids.empty()) << "allowed_token_ids is empty";
    for (int32_t id : allowed_ids) check_id(id, "allowed_token_ids");
    if (static_cast<int64_t>(allowed_ids.size()) == vocab) allowed_ids.clear();  // no-op
  }

  for (const std::vector<int32_t>& seq : p.bad_words_token_ids) {
    for (int32_t id : seq) check_id(id, "bad_words");
    if (seq.size() == 1) {
      banned_ids.push_back(seq[0]);
    } else if (seq.size() > 1) {
      bad_sequences.push_back(seq);
    }
  }
  banned_ids = SortedUnique(std::move(banned_ids));

  if (p.min_tokens > 0) {
    std::vector<int32_t> ids(eos_token_ids.begin(), eos_token_ids.end());
    ids.insert(ids.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
    min_tokens_stop_ids = SortedUnique(std::move(ids));
    for (int32_t id : min_tokens_stop_ids) check_id(id, "min_tokens stop");
  }

  // The last bias given per token: a stable sort by id keeps the order given within a token.
  // Each token's bias is added once, so applying them by id gives the same logits as any order.
  logit_bias = p.logit_bias;
  std::stable_sort(logit_bias.begin(), logit_bias.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t kept = 0;
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const auto [id, bias] = logit_bias[i];
    check_id(id, "logit_bias");
    if (i + 1 < logit_bias.size() && logit_bias[i + 1].first == id) continue;  // a later one wins
    const float clamped = std::clamp(bias, -100.0f, 100.0f);
    if (clamped != 0.0f) logit_bias[kept++] = {id, clamped};  // zero biases change nothing
  }
  logit_bias.resize(kept);
}

Result<std::shared_ptr<const PreparedParams>> PrepareParams(
    SamplingParams p, std::span<const int32_t> eos_token_ids, int64_t vocab,
    std::shared_ptr<const structured::CompiledGrammar> grammar) {
  RETURN_IF_ERROR(p.Validate(vocab));
  if (!p.bad_words.empty() && p.bad_words_token_ids.empty()) {
    return InvalidArgument("bad_words must be tokenized (ResolveBadWords) before the engine");
  }
  if (p.structured_outputs.has_value() != (grammar != nullptr)) {
    return InvalidArgument("{}", p.structured_outputs.has_value()
                                     ? "structured output needs the tokenizer: this frontend "
                                       "has none"
                                     : "a grammar was given without structured_outputs");
  }
  p.Normalize();
  SamplerTables tables(p, eos_token_ids, vocab);
  return std::make_shared<const PreparedParams>(PreparedParams{
      .params = std::move(p), .tables = std::move(tables), .grammar = std::move(grammar)});
}

uint64_t ChoiceSeed(const SamplingParams& p, int64_t choice, uint64_t unseeded) {
  if (!p.seed.has_value() || *p.seed == -1) return unseeded;
  return static_cast<uint64_t>(*p.seed) + static_cast<uint64_t>(choice);  // wraps as FanOut's
}

RequestSampler::RequestSampler(const SamplingParams& p, std::span<const int32_t> prompt,
                               std::span<const int32_t> eos_token_ids, int64_t vocab,
                               uint64_t unseeded_seed)
    : RequestSampler(
          std::make_shared<const PreparedParams>(PreparedParams{
              .params = p, .tables = SamplerTables(p, eos_token_ids, vocab), .grammar = nullptr}),
          prompt, vocab, ChoiceSeed(p, 0, unseeded_seed)) {}

RequestSampler::RequestSampler(std::shared_ptr<const PreparedParams> prepared,
                               std::span<const int32_t> prompt, int64_t vocab, uint64_t seed)
    : prepared_(std::move(prepared)),
      vocab_(vocab),
      greedy_(prepared_->params.greedy()),
      temperature_(static_cast<float>(prepared_->params.temperature)),
      top_p_(prepared_->params.top_p),
      top_k_(prepared_->params.top_k > 0 && prepared_->params.top_k < vocab
                 ? prepared_->params.top_k
                 : 0),
      min_p_(prepared_->params.min_p),
      logprobs_(prepared_->params.logprobs),
      min_tokens_(tables().min_tokens_stop_ids.empty() ? 0 : prepared_->params.min_tokens),
      repetition_penalty_(static_cast<float>(prepared_->params.repetition_penalty)),
      frequency_penalty_(static_cast<float>(prepared_->params.frequency_penalty)),
      presence_penalty_(static_cast<float>(prepared_->params.presence_penalty)),
      generator_(seed) {
  CHECK_GT(vocab, 0);
  const SamplingParams& p = prepared_->params;
  if (greedy_) {  // as Normalize leaves them; the greedy path never reads them anyway
    top_p_ = 1.0;
    top_k_ = 0;
    min_p_ = 0.0;
  }

  // Outputs past vocab distinct tokens are impossible, and past max_tokens the request stops.
  const size_t max_new_distinct = static_cast<size_t>(std::min<int64_t>(p.max_tokens, vocab));
  if (repetition_penalty_ != 1.0f) {
    in_prompt_or_output_.assign(vocab, 0);
    for (int32_t t : prompt) {
      CHECK(t >= 0 && t < vocab) << "prompt token " << t << " outside [0, " << vocab << ")";
      if (!in_prompt_or_output_[t]) {
        in_prompt_or_output_[t] = 1;
        prompt_or_output_ids_.push_back(t);
      }
    }
    prompt_or_output_ids_.reserve(
        std::min<size_t>(prompt_or_output_ids_.size() + max_new_distinct, vocab));
  }
  if (frequency_penalty_ != 0.0f || presence_penalty_ != 0.0f) {
    output_counts_.assign(vocab, 0);
    output_ids_.reserve(max_new_distinct);
  }

  if (!greedy_ && top_p_ < 1.0) {
    order_.resize(vocab);
    bin_mass_.resize(kTopPBuckets);
  }

  if (prepared_->grammar != nullptr) {
    matcher_.emplace(prepared_->grammar);
    // Bits for every model id, and at least the tokenizer's (ids past the model's are ignored).
    grammar_mask_.resize(
        std::max<size_t>((vocab + 31) / 32, prepared_->grammar->vocabulary().mask_words()));
    grammar_logits_.resize(vocab);
    grammar_active_ = p.structured_outputs_after_token < 0;
  }

  const SamplerTables& t = tables();
  plain_greedy_ = greedy_ && !matcher_.has_value() && t.allowed_ids.empty() &&
                  t.banned_ids.empty() && t.bad_sequences.empty() && min_tokens_ == 0 &&
                  t.logit_bias.empty() && repetition_penalty_ == 1.0f && output_counts_.empty() &&
                  !logprobs_.has_value();
}

void RequestSampler::ApplyProcessors(const float* logits, std::span<const int32_t> outputs,
                                     float* work) const {
  const SamplerTables& t = tables();
  if (t.allowed_ids.empty()) {
    std::copy(logits, logits + vocab_, work);
  } else {
    std::fill(work, work + vocab_, kNegInf);
    for (int32_t id : t.allowed_ids) work[id] = logits[id];
  }

  for (int32_t id : t.banned_ids) work[id] = kNegInf;
  for (const std::vector<int32_t>& seq : t.bad_sequences) {
    const size_t prefix = seq.size() - 1;
    if (outputs.size() < prefix) continue;
    if (std::equal(seq.begin(), seq.end() - 1, outputs.end() - prefix)) work[seq.back()] = kNegInf;
  }

  if (static_cast<int64_t>(outputs.size()) < min_tokens_) {
    for (int32_t id : t.min_tokens_stop_ids) work[id] = kNegInf;
  }

  for (const auto& [id, bias] : t.logit_bias) work[id] += bias;

  // vLLM's apply_penalties: repetition over prompt and outputs, then frequency and presence over
  // outputs; each is per token, so touching only the listed tokens keeps vLLM's order.
  if (repetition_penalty_ != 1.0f) {
    const float r = repetition_penalty_;
    for (int32_t id : prompt_or_output_ids_) work[id] = work[id] > 0 ? work[id] / r : work[id] * r;
  }
  if (!output_counts_.empty()) {
    for (int32_t id : output_ids_) {
      work[id] -= frequency_penalty_ * static_cast<float>(output_counts_[id]);
      work[id] -= presence_penalty_;
    }
  }
}

double RequestSampler::FinalWeights(float* work, float* weights) {
  const int64_t V = vocab_;
  float max = kNegInf;
  if (temperature_ != 1.0f) {
    for (int64_t i = 0; i < V; ++i) {
      work[i] /= temperature_;
      max = std::max(max, work[i]);
    }
  } else {
    for (int64_t i = 0; i < V; ++i) max = std::max(max, work[i]);
  }
  if (max == kNegInf) return 0.0;  // every token masked

  // min_p: p < min_p * p_max  <=>  logit < max + log(min_p) (softmax's normalizer cancels).
  if (min_p_ > 0.0) {
    const float cut = max + static_cast<float>(std::log(min_p_));
    for (int64_t i = 0; i < V; ++i) {
      if (work[i] < cut) work[i] = kNegInf;
    }
  }

  // top-k: keep every logit >= the k-th largest (vLLM's mask is `logits < kth`, so ties at the
  // boundary all stay). weights is free scratch until the exp below.
  if (top_k_ > 0) {
    const float kth = KthLargest(work, V, top_k_, weights);
    for (int64_t i = 0; i < V; ++i) {
      if (work[i] < kth) work[i] = kNegInf;
    }
  }

  double total = 0.0;
  for (int64_t i = 0; i < V; ++i) {
    weights[i] = work[i] == kNegInf ? 0.0f : std::exp(work[i] - max);
    total += weights[i];
  }

  // top-p: keep the shortest prefix of the tokens by descending probability (ties: lower id
  // first) whose mass reaches top_p -- a token stays when the mass strictly before it is below
  // top_p * total, so the first always does. This is vLLM's "mask where the ascending cumulative
  // probability <= 1 - p". Rather than sorting the vocabulary, the tokens' mass is binned by
  // logit (kTopPBuckets bins below the max, the last one catching the rest); the bin where the
  // running mass reaches top_p * total holds the last kept token, and only that bin is sorted.
  if (top_p_ < 1.0) {
    const double needed = top_p_ * total;
    const float bins_per_nat = kTopPBuckets / kTopPRange;
    auto bin = [&](float logit) {
      const float d = (max - logit) * bins_per_nat;
      return d < kTopPBuckets - 1 ? static_cast<int64_t>(d) : kTopPBuckets - 1;
    };
    std::fill(bin_mass_.begin(), bin_mass_.end(), 0.0);
    for (int64_t i = 0; i < V; ++i) {
      if (weights[i] > 0.0f) bin_mass_[bin(work[i])] += weights[i];
    }
    // The first non-empty bin where the mass so far reaches `needed` (or the last, if rounding
    // leaves the sum just short); the mass of the bins before it is below `needed`.
    int64_t boundary = -1;
    double above = 0.0, before_boundary = 0.0;
    for (int64_t b = 0; b < kTopPBuckets; ++b) {
      if (bin_mass_[b] == 0.0) continue;
      boundary = b;
      before_boundary = above;
      if (above + bin_mass_[b] >= needed) break;
      above += bin_mass_[b];
    }
    DCHECK(boundary >= 0);
    int64_t count = 0;
    for (int64_t i = 0; i < V; ++i) {
      if (weights[i] > 0.0f && bin(work[i]) == boundary) order_[count++] = static_cast<int32_t>(i);
    }
    std::sort(order_.begin(), order_.begin() + count, [work](int32_t a, int32_t b) {
      return work[a] > work[b] || (work[a] == work[b] && a < b);
    });
    double before = before_boundary;
    int64_t kept = 0;
    while (kept < count && before < needed) before += weights[order_[kept++]];
    // Bins are monotone in the logit, so the kept tokens are exactly those ordered at or before
    // the last kept one.
    const int32_t last = order_[kept - 1];
    const float last_logit = work[last];
    total = 0.0;
    for (int64_t i = 0; i < V; ++i) {
      const bool keep = work[i] > last_logit || (work[i] == last_logit && i <= last);
      if (!keep) weights[i] = 0.0f;
      total += weights[i];
    }
  }
  return total;
}

int32_t RequestSampler::Draw(const float* weights, double total) {
  // One uniform double in [0, 1) from the top 53 bits, then the inverse CDF over token ids in
  // ascending order. vLLM draws by the exponential race (argmax p_i / q_i, q_i ~ Exp(1)); both
  // give token i with probability weights[i] / total.
  const double u = static_cast<double>(generator_() >> 11) * 0x1.0p-53;
  const double target = u * total;
  double cumulative = 0.0;
  int32_t last = -1;
  for (int64_t i = 0; i < vocab_; ++i) {
    if (weights[i] > 0.0f) {
      cumulative += weights[i];
      last = static_cast<int32_t>(i);
      if (cumulative > target) return last;
    }
  }
  return last;  // only when rounding put target at total
}

const float* RequestSampler::GrammarMasked(const float* logits) {
  matcher_->FillNextTokenBitmask(grammar_mask_);
  if (matcher_->IsFinished() || matcher_->overflowed()) {
    // Past the end, or the grammar proved too ambiguous to follow: the request can only end.
    std::fill(grammar_mask_.begin(), grammar_mask_.end(), 0u);
    for (int32_t id : prepared_->grammar->vocabulary().eos_ids()) {
      if (id < vocab_) grammar_mask_[id >> 5] |= 1u << (id & 31);
    }
  }
  for (int64_t w = 0; w * 32 < vocab_; ++w) {
    const uint32_t bits = grammar_mask_[w];
    const int64_t end = std::min<int64_t>(vocab_, (w + 1) * 32);
    if (bits == ~0u) {
      std::copy(logits + w * 32, logits + end, grammar_logits_.data() + w * 32);
      continue;
    }
    for (int64_t i = w * 32; i < end; ++i) {
      grammar_logits_[i] = (bits >> (i & 31)) & 1u ? logits[i] : kNegInf;
    }
  }
  return grammar_logits_.data();
}

bool RequestSampler::GrammarComplete() {
  if (!matcher_->CanEnd()) return false;
  if (matcher_->IsFinished() || matcher_->overflowed()) return true;
  matcher_->FillNextTokenBitmask(grammar_mask_);
  const structured::Vocabulary& v = prepared_->grammar->vocabulary();
  for (int32_t id : v.eos_ids()) grammar_mask_[id >> 5] &= ~(1u << (id & 31));
  return std::all_of(grammar_mask_.begin(), grammar_mask_.end(), [](uint32_t w) { return w == 0; });
}

void RequestSampler::Sample(const float* logits, std::span<const int32_t> outputs, float* scratch,
                            SampledToken* result) {
  // The grammar first, as vLLM applies its bitmask to the logits before the sampler: every later
  // step, logprobs included, sees only what the grammar allows.
  const bool masked = matcher_.has_value() && grammar_active_;
  if (masked) logits = GrammarMasked(logits);
  int32_t token;
  if (plain_greedy_) {
    token = GreedyToken(logits, vocab_);
  } else {
    float* work = scratch;
    ApplyProcessors(logits, outputs, work);
    if (greedy_) {
      token = GreedyToken(work, vocab_);
    } else {
      float* weights = scratch + vocab_;
      const double total = FinalWeights(work, weights);
      // Nothing left to draw from (every allowed token banned, say): the argmax of what is
      // left, id 0 when everything is -inf.
      token =
          total > 0.0 && std::isfinite(total) ? Draw(weights, total) : GreedyToken(work, vocab_);
    }
  }
  // The processors left nothing the grammar allows (min_tokens holding back the EOS that alone
  // completes it, say): the grammar wins, its most likely token.
  if (masked && !GrammarAllows(token)) token = GreedyToken(logits, vocab_);
  result->token = token;
  if (logprobs_.has_value()) {
    // Logprobs of the raw logits (vLLM's default raw_logprobs), which Sample never modifies, so
    // computing them after the draw gives the same values and frees the scratch for it.
    LogSoftmax(logits, vocab_, scratch);
    GatherLogprobs(scratch, vocab_, *logprobs_, token, result);
  } else {
    result->sampled = TokenLogprob{token, 0.0f, 0};
    result->top.clear();
  }
}

void RequestSampler::Accept(int32_t token) {
  CHECK(token >= 0 && token < vocab_) << "accepted token " << token << " outside vocabulary";
  // Sample chose a token of the mask; past the end (EOS again, under ignore_eos) the matcher
  // refuses it and stays finished.
  if (matcher_.has_value()) {
    if (grammar_active_) {
      matcher_->AcceptToken(token);
      if (prepared_->params.structured_outputs_rearm && GrammarComplete()) {
        matcher_.emplace(prepared_->grammar);  // asleep until the token comes again
        grammar_active_ = false;
      }
    } else if (token == prepared_->params.structured_outputs_after_token) {
      grammar_active_ = true;  // the answer starts after this token
    }
  }
  if (!in_prompt_or_output_.empty() && !in_prompt_or_output_[token]) {
    in_prompt_or_output_[token] = 1;
    prompt_or_output_ids_.push_back(token);
  }
  if (!output_counts_.empty() && output_counts_[token]++ == 0) output_ids_.push_back(token);
}

}  // namespace moeserve::engine
