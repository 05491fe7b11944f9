#include "model/weight_matrix.h"

#include <algorithm>

#include "core/check.h"

namespace moeserve::model {

WeightMatrix::WeightMatrix(OwnedTensor whole) { AddBlock(0, std::move(whole)); }

void WeightMatrix::AddBlock(int64_t first_row, OwnedTensor rows) {
  const Tensor& t = rows.view();
  CHECK_EQ(t.rank(), 2u) << "a weight matrix block is [rows, K], not " << t.ShapeString();
  CHECK(blocks_.empty() || t.dim(1) == cols())
      << "a block of " << t.ShapeString() << " in a matrix of " << cols() << " columns";
  const int64_t end = first_row + t.dim(0);
  auto at = std::lower_bound(blocks_.begin(), blocks_.end(), first_row,
                             [](const Block& b, int64_t row) { return b.first_row < row; });
  CHECK(at == blocks_.end() || end <= at->first_row) << "overlapping blocks at row " << first_row;
  CHECK(at == blocks_.begin() ||
        (at - 1)->first_row + (at - 1)->rows.view().dim(0) <= first_row)
      << "overlapping blocks at row " << first_row;
  blocks_.insert(at, Block{first_row, std::move(rows)});
}

int64_t WeightMatrix::rows() const {
  return blocks_.empty() ? 0 : blocks_.back().first_row + blocks_.back().rows.view().dim(0);
}

int64_t WeightMatrix::cols() const { return blocks_.empty() ? 0 : blocks_[0].rows.view().dim(1); }

const Tensor& WeightMatrix::whole() const {
  CHECK_EQ(blocks_.size(), 1u) << "a matrix of " << blocks_.size() << " blocks has no one tensor";
  return blocks_[0].rows.view();
}

bool WeightMatrix::contiguous_rows() const {
  int64_t row = 0;
  for (const Block& b : blocks_) {
    if (b.first_row != row) return false;
    row += b.rows.view().dim(0);
  }
  return true;
}

}  // namespace moeserve::model
