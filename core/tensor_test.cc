#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace moeserve {
namespace {

TEST(TensorTest, DefaultIsEmptyScalarView) {
  const Tensor t;
  EXPECT_EQ(t.rank(), 0u);
  EXPECT_EQ(t.numel(), 1);  // the empty product
  EXPECT_EQ(t.data(), nullptr);
  EXPECT_EQ(t.ShapeString(), "[]");
}

TEST(TensorTest, ShapeStridesNumelBytes) {
  std::vector<uint16_t> buf(2 * 3 * 4);
  const Tensor t(buf.data(), DType::kBF16, {2, 3, 4});
  EXPECT_EQ(t.dtype(), DType::kBF16);
  EXPECT_EQ(t.rank(), 3u);
  EXPECT_EQ(t.dim(0), 2);
  EXPECT_EQ(t.dim(1), 3);
  EXPECT_EQ(t.dim(2), 4);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(1), 4);
  EXPECT_EQ(t.stride(2), 1);
  EXPECT_EQ(std::vector<int64_t>(t.shape().begin(), t.shape().end()),
            (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.bytes(), 48u);
  EXPECT_TRUE(t.contiguous());
  EXPECT_EQ(t.data(), buf.data());
  EXPECT_EQ(t.data_as<uint16_t>(), buf.data());
  EXPECT_EQ(t.ShapeString(), "[2, 3, 4]");
}

TEST(TensorTest, ZeroSizedDimension) {
  float x = 0.0f;
  const Tensor t(&x, DType::kF32, {4, 0});
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.bytes(), 0u);
  EXPECT_EQ(t.ShapeString(), "[4, 0]");
}

TEST(TensorTest, SliceOuterDimStaysContiguous) {
  std::vector<float> buf(4 * 5);
  const Tensor t(buf.data(), DType::kF32, {4, 5});
  const Tensor rows = t.Slice(0, 1, 3);
  EXPECT_EQ(rows.ShapeString(), "[2, 5]");
  EXPECT_EQ(rows.data_as<float>(), buf.data() + 5);
  EXPECT_EQ(rows.stride(0), 5);
  EXPECT_EQ(rows.stride(1), 1);
  EXPECT_EQ(rows.numel(), 10);
  EXPECT_TRUE(rows.contiguous());
}

TEST(TensorTest, SliceInnerDimIsNotContiguous) {
  std::vector<int8_t> buf(4 * 5);
  const Tensor t(buf.data(), DType::kI8, {4, 5});
  const Tensor cols = t.Slice(1, 2, 4);
  EXPECT_EQ(cols.ShapeString(), "[4, 2]");
  EXPECT_EQ(cols.data_as<int8_t>(), buf.data() + 2);
  EXPECT_EQ(cols.stride(0), 5);  // rows still 5 elements apart
  EXPECT_EQ(cols.stride(1), 1);
  EXPECT_FALSE(cols.contiguous());

  // Narrowing the inner dim to one column and the outer to one row is contiguous again.
  const Tensor one = cols.Slice(0, 3, 4).Slice(1, 1, 2);
  EXPECT_EQ(one.data_as<int8_t>(), buf.data() + 3 * 5 + 3);
  EXPECT_TRUE(one.contiguous());
}

TEST(TensorTest, SliceOffsetsScaleWithElementSize) {
  std::vector<double> buf(3 * 2 * 4);
  const Tensor t(buf.data(), DType::kF64, {3, 2, 4});
  const Tensor s = t.Slice(1, 1, 2).Slice(2, 3, 4);
  EXPECT_EQ(s.ShapeString(), "[3, 1, 1]");
  EXPECT_EQ(s.data_as<double>(), buf.data() + 4 + 3);
  EXPECT_EQ(s.stride(0), 8);
  EXPECT_FALSE(s.contiguous());

  const Tensor empty = t.Slice(0, 3, 3);
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.data_as<double>(), buf.data() + 24);  // one past the end: a valid pointer
}

TEST(TensorTest, ReshapeSharesMemory) {
  std::vector<int32_t> buf(24);
  const Tensor t(buf.data(), DType::kI32, {2, 3, 4});
  const Tensor r = t.Reshape({6, 4});
  EXPECT_EQ(r.ShapeString(), "[6, 4]");
  EXPECT_EQ(r.data(), t.data());
  EXPECT_EQ(r.dtype(), DType::kI32);
  EXPECT_EQ(r.stride(0), 4);
  EXPECT_EQ(t.Reshape({24}).ShapeString(), "[24]");
  EXPECT_EQ(t.Reshape({1, 24, 1}).stride(0), 24);

  // A slice along the outer dim is still contiguous, so it reshapes too.
  const Tensor s = t.Slice(0, 1, 2).Reshape({3, 4});
  EXPECT_EQ(s.data_as<int32_t>(), buf.data() + 12);
}

TEST(TensorTest, MaxRank) {
  std::vector<uint8_t> buf(64);
  const Tensor t(buf.data(), DType::kU8, {2, 2, 2, 2, 2, 2});
  EXPECT_EQ(t.rank(), kMaxTensorRank);
  EXPECT_EQ(t.stride(0), 32);
  EXPECT_EQ(t.numel(), 64);
}

TEST(TensorDeathTest, ReshapeToWrongNumelCheckFails) {
  std::vector<float> buf(6);
  const Tensor t(buf.data(), DType::kF32, {2, 3});
  EXPECT_DEATH(t.Reshape({4, 2}), "CHECK failed.*Reshape \\[2, 3\\] -> \\[4, 2\\]");
}

TEST(TensorDeathTest, ReshapeOfNonContiguousCheckFails) {
  std::vector<float> buf(6);
  const Tensor t = Tensor(buf.data(), DType::kF32, {2, 3}).Slice(1, 0, 2);
  EXPECT_DEATH(t.Reshape({4}), "non-contiguous");
}

TEST(TensorDeathTest, SliceOutOfBoundsCheckFails) {
  std::vector<float> buf(6);
  const Tensor t(buf.data(), DType::kF32, {2, 3});
  EXPECT_DEATH(t.Slice(1, 2, 4), "slice \\[2, 4\\) of dim 1");
  EXPECT_DEATH(t.Slice(2, 0, 1), "CHECK failed");
}

TEST(TensorDeathTest, RankAboveMaxCheckFails) {
  std::vector<float> buf(128);
  EXPECT_DEATH(Tensor(buf.data(), DType::kF32, {2, 2, 2, 2, 2, 2, 2}), "CHECK failed");
}

TEST(TensorTest, GgmlBlockRowsAreTheFileBytes) {
  // Q4_K: 256 weights in 144 bytes; Q8_0: 32 in 34. A [N, K] tensor is N rows of K / block
  // blocks, no scales after them: the bytes a GGUF file holds.
  EXPECT_EQ(TensorBytes(DType::kGgmlQ4_K, std::vector<int64_t>{3, 512}), 3u * 2 * 144);
  EXPECT_EQ(TensorBytes(DType::kGgmlQ8_0, std::vector<int64_t>{5, 96}), 5u * 3 * 34);
  EXPECT_EQ(TensorBytes(DType::kGgmlQ6_K, std::vector<int64_t>{0, 256}), 0u);
  // Rank 3 (a GGUF file's stacked experts [E, N, K]) is E * N rows.
  EXPECT_EQ(TensorBytes(DType::kGgmlQ5_0, std::vector<int64_t>{2, 3, 64}), 6u * 2 * 22);
  for (DType dtype : {DType::kGgmlQ8_0, DType::kGgmlQ4_0, DType::kGgmlQ4_1, DType::kGgmlQ5_0,
                      DType::kGgmlQ5_1, DType::kGgmlQ4_K, DType::kGgmlQ5_K, DType::kGgmlQ6_K}) {
    const int64_t K = 2 * GgmlBlockWeights(dtype);
    EXPECT_EQ(TensorBytes(dtype, std::vector<int64_t>{7, K}), 7 * StoredRowBytes(dtype, K))
        << DTypeName(dtype);
    const OwnedTensor owned(dtype, {7, K});
    EXPECT_EQ(owned.view().bytes(), 7 * StoredRowBytes(dtype, K)) << DTypeName(dtype);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(owned.view().data()) % kTensorAlignment, 0u);
  }
}

TEST(TensorTest, GgmlBlockViewsOfRows) {
  // A mapped [E * N, K] Q4_K tensor: expert e's rows by Slice, or by Reshape then Slice.
  constexpr int64_t kE = 3, kN = 4, kK = 512;
  const size_t row = StoredRowBytes(DType::kGgmlQ4_K, kK);  // 288
  std::vector<std::byte> file(kE * kN * row);
  const Tensor all(file.data(), DType::kGgmlQ4_K, {kE * kN, kK});
  EXPECT_EQ(all.bytes(), file.size());
  const Tensor expert = all.Slice(0, 2 * kN, 3 * kN);
  EXPECT_EQ(expert.ShapeString(), "[4, 512]");
  EXPECT_EQ(expert.data(), file.data() + 2 * kN * row);
  EXPECT_TRUE(expert.contiguous());
  EXPECT_EQ(expert.bytes(), kN * row);
  const Tensor stacked = all.Reshape({kE, kN, kK});
  const Tensor same = stacked.Slice(0, 2, 3).Reshape({kN, kK});
  EXPECT_EQ(same.data(), expert.data());
  EXPECT_EQ(stacked.Slice(1, 1, 3).data(), file.data() + row);  // rows 1, 2 of expert 0
  // Columns at block boundaries: the second block of every row (not contiguous).
  const Tensor second = all.Slice(1, 256, 512);
  EXPECT_EQ(second.data(), file.data() + 144);
  EXPECT_FALSE(second.contiguous());
  EXPECT_EQ(ElementOffsetBytes(DType::kGgmlQ4_K, 3 * kK), 3 * row);
  EXPECT_EQ(ElementOffsetBytes(DType::kF32, 3), 12u);
}

TEST(TensorDeathTest, GgmlBlockShapesCheckFail) {
  std::vector<std::byte> buf(1024);
  EXPECT_DEATH(Tensor(buf.data(), DType::kGgmlQ4_K, {2, 100}), "rows of 256-weight blocks");
  EXPECT_DEATH(Tensor(buf.data(), DType::kGgmlQ8_0, {}), "rank 0");
  EXPECT_DEATH(TensorBytes(DType::kGgmlQ8_0, std::vector<int64_t>{2, 33}),
               "not a multiple of its block of 32");
  const Tensor t(buf.data(), DType::kGgmlQ8_0, {2, 64});
  EXPECT_DEATH(t.Slice(1, 16, 64), "cuts its blocks of 32 weights");
  EXPECT_DEATH(t.Reshape({128}).Slice(0, 0, 16), "cuts its blocks");
  EXPECT_DEATH(ElementOffsetBytes(DType::kGgmlQ8_0, 40), "offset of 40 weights");
}

TEST(OwnedTensorTest, AlignedAndZeroed) {
  // Odd sizes so that the allocation is not naturally a multiple of the alignment.
  for (int64_t cols : {1, 3, 17, 1000}) {
    const OwnedTensor t(DType::kBF16, {3, cols});
    const Tensor& v = t.view();
    EXPECT_EQ(v.ShapeString(), "[3, " + std::to_string(cols) + "]");
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kTensorAlignment, 0u);
    EXPECT_TRUE(v.contiguous());
    const uint16_t* p = v.data_as<uint16_t>();
    for (int64_t i = 0; i < v.numel(); ++i) ASSERT_EQ(p[i], 0u) << i;
  }
  // The implicit conversion to a view.
  const OwnedTensor t(DType::kF32, {2, 2});
  const Tensor& view = t;
  EXPECT_EQ(view.data(), t.view().data());
}

TEST(OwnedTensorTest, MemoryIsWritable) {
  const OwnedTensor t(DType::kI32, {4, 4});
  int32_t* p = t.view().data_as<int32_t>();
  for (int i = 0; i < 16; ++i) p[i] = i;
  EXPECT_EQ(t.view().Slice(0, 2, 3).data_as<int32_t>()[1], 9);
}

TEST(OwnedTensorTest, BorrowedKeepsItsOwnerAlive) {
  auto owner = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6});
  std::weak_ptr<std::vector<float>> watch = owner;
  const size_t stored = TensorStorageBytes();
  const Tensor view(owner->data(), DType::kF32, {2, 3});
  OwnedTensor t = OwnedTensor::Borrowed(view, std::move(owner));
  EXPECT_TRUE(t.borrowed());
  EXPECT_EQ(TensorStorageBytes(), stored);  // no storage of its own
  OwnedTensor moved = std::move(t);
  EXPECT_FALSE(t.borrowed());  // NOLINT(bugprone-use-after-move): left empty
  EXPECT_EQ(t.view().data(), nullptr);
  ASSERT_FALSE(watch.expired());
  EXPECT_EQ(moved.view().data_as<float>()[4], 5.0f);
  moved = OwnedTensor();
  EXPECT_TRUE(watch.expired());
  EXPECT_FALSE(OwnedTensor(DType::kF32, {1}).borrowed());
  float x[4] = {};
  EXPECT_DEATH(OwnedTensor::Borrowed(Tensor(x, DType::kF32, {2, 2}).Slice(1, 0, 1),
                                     std::make_shared<int>(0)),
               "contiguous");
}

TEST(TensorStorageTest, AlignedZeroedAndMovable) {
  TensorStorage empty;
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(TensorStorage(0).data(), nullptr);

  TensorStorage a(100);
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(a.size(), 100u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % kTensorAlignment, 0u);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a.data()[i], std::byte{0}) << i;

  std::byte* const p = a.data();
  TensorStorage b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), 100u);
  // The moved-from storage is empty, not a size without memory.
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(a.size(), 0u);

  TensorStorage c(8);
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.size(), 100u);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.size(), 0u);
}

TEST(CheckedNumelTest, ValidShapes) {
  int64_t n = -1;
  ASSERT_TRUE(CheckedNumel(std::vector<int64_t>{}, &n));
  EXPECT_EQ(n, 1);
  ASSERT_TRUE(CheckedNumel(std::vector<int64_t>{3, 0, 5}, &n));
  EXPECT_EQ(n, 0);
  ASSERT_TRUE(CheckedNumel(std::vector<int64_t>{4096, 4096, 128}, &n));
  EXPECT_EQ(n, int64_t{4096} * 4096 * 128);
  const int64_t max = std::numeric_limits<int64_t>::max();
  ASSERT_TRUE(CheckedNumel(std::vector<int64_t>{max, 1}, &n));
  EXPECT_EQ(n, max);
}

TEST(CheckedNumelTest, RejectsNegativeAndOverflow) {
  int64_t n = 7;
  EXPECT_FALSE(CheckedNumel(std::vector<int64_t>{2, -1}, &n));
  EXPECT_FALSE(CheckedNumel(std::vector<int64_t>{-1, -1}, &n));  // product positive, still bad
  EXPECT_FALSE(CheckedNumel(std::vector<int64_t>{int64_t{1} << 32, int64_t{1} << 31}, &n));
  EXPECT_FALSE(CheckedNumel(std::vector<int64_t>{std::numeric_limits<int64_t>::max(), 2}, &n));
  EXPECT_EQ(n, 7);  // untouched on failure
}

}  // namespace
}  // namespace moeserve

namespace moeserve {
namespace {

TEST(OwnedTensorMoveTest, MovedFromIsEmpty) {
  OwnedTensor a(DType::kF32, {2, 3});
  void* data = a.view().data();
  OwnedTensor b(std::move(a));
  EXPECT_EQ(b.view().data(), data);
  EXPECT_EQ(b.view().numel(), 6);
  EXPECT_EQ(a.view().data(), nullptr);  // NOLINT(bugprone-use-after-move): checking the state
  EXPECT_EQ(a.view().rank(), 0u);
  OwnedTensor c;
  c = std::move(b);
  EXPECT_EQ(c.view().data(), data);
  EXPECT_EQ(b.view().data(), nullptr);  // NOLINT(bugprone-use-after-move)
}

}  // namespace
}  // namespace moeserve
