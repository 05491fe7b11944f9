// Helpers of the model tests (and the engine's): how far a row of logits is from a reference, its
// argmax, the weights' matrices, model folders made for a test process.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include <fmt/format.h>

#include "model/weights.h"
#include "core/test_paths.h"

namespace moeserve::model::testing {

// max_i |a_i - b_i| / max_i |b_i| over one row (the goldens' definition).
inline double RowRelError(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

// The first index of the maximum.
inline int32_t Argmax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

// Every matrix of the weights in a fixed order: on_tensor(t) for one tensor (an empty view where
// a layer has no such matrix), on_blocks(m) for a matrix of blocks (weight_matrix.h).
template <typename OnTensor, typename OnBlocks>
void VisitMatrices(const ModelWeights& w, const OnTensor& on_tensor, const OnBlocks& on_blocks) {
  auto layer = [&](const DecoderLayerWeights& l) {
    for (const WeightMatrix* m : {&l.attention.qkv, &l.gdn.in_proj_qkvz, &l.gdn.in_proj_ba,
                                  &l.experts.shared.gate_up, &l.mlp.gate_up}) {
      on_blocks(*m);
    }
    for (const OwnedTensor* t : {&l.attention.o_proj, &l.gdn.out_proj, &l.experts.router,
                                 &l.experts.shared.down, &l.mlp.down}) {
      on_tensor(t->view());
    }
    for (const SwiGluWeights& e : l.experts.experts) {
      on_blocks(e.gate_up);
      on_tensor(e.down.view());
    }
  };
  on_tensor(w.embedding.view());
  for (const DecoderLayerWeights& l : w.layers) layer(l);
  on_tensor(w.lm_head.view());
  on_tensor(w.mtp.fc.view());
  for (const DecoderLayerWeights& l : w.mtp.layers) layer(l);
}

// Every tensor of the weights' matrices in a fixed order, a matrix of blocks block by block (an
// empty view where a layer has no such matrix).
inline void ForEachMatrix(const ModelWeights& w, const std::function<void(const Tensor&)>& f) {
  VisitMatrices(w, f, [&](const WeightMatrix& m) {
    if (!m.held()) f(Tensor());
    for (const WeightMatrix::Block& b : m.blocks()) f(b.rows.view());
  });
}

// A matrix's bytes (rows and scales); empty for an empty view.
inline std::string MatrixBytes(const Tensor& t) {
  if (t.rank() == 0) return "";
  return std::string(static_cast<const char*>(t.data()), t.bytes());
}

// Every matrix's bytes in VisitMatrices' order, a matrix of blocks as its blocks' bytes one after
// another: the same for a matrix whether the loader concatenated it or keeps a file's tensors.
inline std::vector<std::string> AllMatrixBytes(const ModelWeights& w) {
  std::vector<std::string> out;
  VisitMatrices(
      w, [&](const Tensor& t) { out.push_back(MatrixBytes(t)); },
      [&](const WeightMatrix& m) {
        std::string bytes;
        for (const WeightMatrix::Block& b : m.blocks()) bytes += MatrixBytes(b.rows.view());
        out.push_back(std::move(bytes));
      });
  return out;
}

// The folder `moeserve make-model <flags>` writes (MOESERVE_BINARY: every test target's), made
// once per test process and name, and removed when the process exits (ctest runs each test in a
// process of its own: a folder left behind per process would fill /tmp).
inline const std::string& MadeModel(const std::string& name, const std::string& flags) {
  struct Folders {
    std::map<std::string, std::string> paths;
    ~Folders() {
      std::error_code ec;
      for (const auto& [name, path] : paths) std::filesystem::remove_all(path, ec);
    }
  };
  static Folders folders;
  auto it = folders.paths.find(name);
  if (it != folders.paths.end()) return it->second;
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("moeserve_{}_{}", name, getpid()))
          .string();
  const std::string cmd =
      fmt::format("{} make-model {} --out {} 2>/dev/null", MOESERVE_BINARY, flags, path);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return folders.paths.emplace(name, path).first->second;
}

}  // namespace moeserve::model::testing
