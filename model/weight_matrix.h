// WeightMatrix: a weight matrix [N, K] held as blocks of rows stacked in order, each a tensor of
// its own dtype -- one block for what the loader concatenates itself (q | k | v copied into one
// allocation), several for the separate tensors of a GGUF file used in place (its attn_q, attn_k,
// attn_v, often Q4_K, Q4_K and Q6_K; an expert's gate and up). The kernels multiply block by
// block into the columns of one output (model/layer_context.h's MatMul), each output column's
// bits the same as from one concatenated matrix (kernels/matmul.h: never dependent on n).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace moeserve::model {

class WeightMatrix {
 public:
  struct Block {
    int64_t first_row;  // of the matrix
    OwnedTensor rows;   // [n_i, K]
  };

  WeightMatrix() = default;
  // One block: the whole matrix.
  explicit WeightMatrix(OwnedTensor whole);

  // Adds the block of rows that starts at `first_row` (blocks may come in any order; they are
  // kept in row order). Its K must be the other blocks'; rows must not overlap.
  void AddBlock(int64_t first_row, OwnedTensor rows);

  bool held() const { return !blocks_.empty(); }
  std::span<const Block> blocks() const { return blocks_; }
  int64_t rows() const;  // the last block's end (0 when empty)
  int64_t cols() const;  // K (0 when empty)
  // The matrix's one block (CHECKs there is one): a matrix the loader allocated whole.
  const Tensor& whole() const;
  // True when the blocks cover rows [0, rows()) without a gap.
  bool contiguous_rows() const;

 private:
  std::vector<Block> blocks_;
};

}  // namespace moeserve::model
