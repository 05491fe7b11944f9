// ModelGroup over local ranks (threads that follow rank 0's commands) on the golden tiny
// Qwen3-Next: the group's forward equals one rank's, commands of every kind reach the followers,
// a group stops cleanly whenever it is destroyed, and ranks loading at once, each over its own
// threads, load what one thread does. Runs under ThreadSanitizer in CI.
#include "model/model_group.h"
#include "model/testing.h"
#include "core/test_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moeserve::model {
namespace {

using testing::Argmax;
using testing::RowRelError;

const std::string kTinyDir = MOESERVE_TESTDATA_DIR + "/tiny-qwen3next";

// A prompt through the group: its logits [T, V], the greedy next token (argmax pairs), and the
// MTP head's drafts over the prompt (argmax pairs).
struct Outputs {
  std::vector<float> logits;
  int32_t next = -1;
  std::vector<int32_t> drafts;
};

Outputs RunPrompt(ModelGroup& group, const std::vector<int32_t>& prompt) {
  const int64_t T = static_cast<int64_t>(prompt.size());
  const int64_t V = group.model().config().vocab_size, H = group.model().config().hidden_size;
  group.CreateCache(CacheSizes{8, 16, 2});
  group.Reserve(T, T);
  group.ResetSlot(1);
  std::vector<int32_t> table(8), seq_of(T, 0), query_start{0, static_cast<int32_t>(T)}, rows(T);
  std::iota(table.begin(), table.end(), 0);
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<int64_t> positions(T);
  std::iota(positions.begin(), positions.end(), 0);
  const int32_t* tables[] = {table.data()};
  const int32_t slot = 1;
  const TokenBatch batch{T, prompt.data(), positions.data(), seq_of.data(), 1, query_start.data(),
                         tables, &slot};
  Outputs out;
  group.ForwardBatch(batch, rows.data(), T, LogitsMode::kFull);
  out.logits.assign(group.model().logits(), group.model().logits() + T * V);
  const std::vector<float> hidden(group.model().hidden(), group.model().hidden() + T * H);
  // The last row again, as argmax pairs, at the next position.
  const int32_t last = static_cast<int32_t>(T - 1);
  group.ResetSlot(1);  // the prompt again from zero state (its KV is rewritten in place)
  group.ForwardBatch(batch, &last, 1, LogitsMode::kArgmax);
  out.next = group.model().argmax()[0];
  EXPECT_EQ(out.next, std::max_element(&out.logits[(T - 1) * V], &out.logits[T * V]) -
                          &out.logits[(T - 1) * V]);
  std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
  next.push_back(out.next);
  const TokenBatch mtp{T, next.data(), positions.data(), seq_of.data(), 1, query_start.data(),
                       tables, &slot};
  group.MtpForwardBatch(mtp, hidden.data(), rows.data(), T, LogitsMode::kArgmax);
  out.drafts.assign(group.model().mtp_argmax(), group.model().mtp_argmax() + T);
  return out;
}

std::vector<int32_t> Prompt() {
  std::vector<int32_t> p(40);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>((i * 37 + 11) % 500);
  return p;
}

TEST(ModelGroupTest, RanksLoadingAtOnceOverThreadsLoadWhatOneThreadDoes) {
  for (DType dtype : {DType::kQ4, DType::kQ8, DType::kBF16}) {
    ParallelOptions two;
    two.tp = 2;
    Result<std::unique_ptr<ModelGroup>> one_thread =
        ModelGroup::Load(kTinyDir, {.weight_dtype = dtype, .threads = 1}, two);
    Result<std::unique_ptr<ModelGroup>> threads =
        ModelGroup::Load(kTinyDir, {.weight_dtype = dtype, .threads = 3}, two);
    ASSERT_TRUE(one_thread.ok() && threads.ok());
    std::vector<std::string> a, b;
    testing::ForEachMatrix((*one_thread)->model().weights(),
                           [&](const Tensor& t) { a.push_back(testing::MatrixBytes(t)); });
    testing::ForEachMatrix((*threads)->model().weights(),
                           [&](const Tensor& t) { b.push_back(testing::MatrixBytes(t)); });
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(a[i] == b[i]) << DTypeName(dtype) << " #" << i;
  }
}

TEST(ModelGroupTest, LocalRanksFollowRankZero) {
  Result<std::unique_ptr<CausalLm>> one_lm = CausalLm::Load(kTinyDir, {.weight_dtype = std::nullopt, .threads = 1});
  ASSERT_TRUE(one_lm.ok());
  ModelGroup one(**one_lm);
  const Outputs want = RunPrompt(one, Prompt());
  const int64_t V = one.model().config().vocab_size;
  for (const auto& [tp, ep] : std::vector<std::pair<int, bool>>{{2, false}, {2, true}, {4, true}}) {
    Result<std::unique_ptr<ModelGroup>> group =
        ModelGroup::Load(kTinyDir, {.weight_dtype = std::nullopt, .threads = 1},
                         {.tp = tp, .ep = ep, .comm = CommKind::kLocal, .link = std::nullopt});
    ASSERT_TRUE(group.ok()) << group.status().ToString();
    EXPECT_TRUE((*group)->leader());
    EXPECT_EQ((*group)->size(), tp);
    const Outputs got = RunPrompt(**group, Prompt());
    for (size_t row = 0; row * V < want.logits.size(); ++row) {
      EXPECT_LE(RowRelError(&got.logits[row * V], &want.logits[row * V], V), 1e-5)
          << "--tp " << tp << " row " << row;
    }
    EXPECT_EQ(got.next, want.next) << "--tp " << tp;
    EXPECT_EQ(got.drafts, want.drafts) << "--tp " << tp;
  }
}

TEST(ModelGroupTest, StopsWhenDestroyedAtAnyPoint) {
  for (int round = 0; round < 3; ++round) {
    Result<std::unique_ptr<ModelGroup>> group =
        ModelGroup::Load(kTinyDir, {.weight_dtype = std::nullopt, .threads = 1},
                         {.tp = 2, .ep = false, .comm = CommKind::kLocal, .link = std::nullopt});
    ASSERT_TRUE(group.ok());
    if (round > 0) (*group)->CreateCache(CacheSizes{4, 16, 1});
    if (round > 1) (*group)->ResetSlot(0);
  }  // each group's followers stop and join here
}

TEST(ModelGroupTest, ModelledLinkCountsTheLayersCollectives) {
  Result<std::unique_ptr<ModelGroup>> group = ModelGroup::Load(
      kTinyDir, {.weight_dtype = std::nullopt, .threads = 1},
      {.tp = 2, .ep = false, .comm = CommKind::kLocal, .link = parallel::LinkModel{1, 100}});
  ASSERT_TRUE(group.ok());
  ASSERT_NE((*group)->link(), nullptr);
  RunPrompt(**group, Prompt());
  // Per forward: the embedding, two reductions per layer, the logits exchange.
  EXPECT_GE((*group)->link()->num_collectives(), 2 * (2 * 4 + 2));
  EXPECT_GT((*group)->link()->modelled_seconds(), 0);
}

TEST(ModelGroupTest, ABadSplitFailsBeforeAnyRankStarts) {
  Result<std::unique_ptr<ModelGroup>> group =
      ModelGroup::Load(kTinyDir, {.weight_dtype = std::nullopt, .threads = 1},
                       {.tp = 3, .ep = false, .comm = CommKind::kLocal, .link = std::nullopt});
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().message(), "--tp 3 does not divide num_attention_heads (4)");
}

}  // namespace
}  // namespace moeserve::model
