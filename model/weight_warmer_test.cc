// WeightWarmer (case study #12): which bytes of which matrices it prefetches, within its budget,
// a step at a time, and when it says it is done.
#include "model/weight_warmer.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "core/dtype.h"

namespace moeserve::model {
namespace {

// Steps until the warmer is done; returns the number of steps.
int64_t Drain(WeightWarmer& warmer) {
  int64_t steps = 1;
  while (warmer.Step()) ++steps;
  return steps;
}

TEST(WeightWarmerTest, SmallMatricesAreWarmedWhole) {
  // int4 [64, 256]: 64 rows of 128 bytes, then 64 x 8 scales of 2 bytes (f16).
  OwnedTensor q4(DType::kQ4, {64, 256});
  OwnedTensor bf16(DType::kBF16, {3, 100});  // 600 bytes
  WeightWarmer warmer;
  warmer.Add(q4.view(), 2);
  warmer.Add(bf16.view(), 4);
  EXPECT_EQ(q4.view().bytes(), 64u * 128 + 64 * 8 * 2);
  // int4: 2 parts of rows and 2 of scales (4 KiB + 512 bytes each: one step apiece); bf16: 4 parts
  // of 150 bytes.
  EXPECT_EQ(Drain(warmer), 8);
  EXPECT_EQ(warmer.warmed_bytes(), q4.view().bytes() + 600);
  // Done: nothing more until new targets.
  EXPECT_FALSE(warmer.Step());
  EXPECT_EQ(warmer.warmed_bytes(), q4.view().bytes() + 600);
  warmer.Clear();
  EXPECT_FALSE(warmer.Step());
  warmer.Add(bf16.view(), 1);
  EXPECT_EQ(Drain(warmer), 1);
  EXPECT_EQ(warmer.warmed_bytes(), q4.view().bytes() + 1200);
}

TEST(WeightWarmerTest, LargeMatricesGetTheBudgetSharedOverTheirParts) {
  // bf16 [4096, 2048]: 16 MiB, far above the 4 MiB budget; 2 parts of 2 MiB each.
  OwnedTensor big(DType::kBF16, {4096, 2048});
  WeightWarmer warmer;
  warmer.Add(big.view(), 2);
  EXPECT_EQ(Drain(warmer),
            static_cast<int64_t>(WeightWarmer::kBudgetBytes / WeightWarmer::kStepBytes));
  EXPECT_EQ(warmer.warmed_bytes(), WeightWarmer::kBudgetBytes);
  // More parts than kMaxParts are read as kMaxParts; the budget is the same.
  warmer.Clear();
  warmer.Add(big.view(), 1000);
  Drain(warmer);
  EXPECT_EQ(warmer.warmed_bytes(), 2 * WeightWarmer::kBudgetBytes);
}

TEST(WeightWarmerTest, EmptyTargetsWarmNothing) {
  WeightWarmer warmer;
  EXPECT_FALSE(warmer.Step());
  warmer.Add(Tensor(), 2);  // an expert another rank holds
  OwnedTensor none(DType::kBF16, {0, 64});
  warmer.Add(none.view(), 2);
  EXPECT_FALSE(warmer.Step());
  EXPECT_EQ(warmer.warmed_bytes(), 0u);
}

}  // namespace
}  // namespace moeserve::model
