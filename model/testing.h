// Helpers of the model tests: how far a row of logits is from a reference, and its argmax.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "model/weights.h"

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

// Every matrix of the weights in a fixed order (an empty view where a layer has no such matrix).
inline void ForEachMatrix(const ModelWeights& w, const std::function<void(const Tensor&)>& f) {
  auto layer = [&](const DecoderLayerWeights& l) {
    for (const OwnedTensor* t :
         {&l.attention.qkv, &l.attention.o_proj, &l.gdn.in_proj_qkvz, &l.gdn.in_proj_ba,
          &l.gdn.out_proj, &l.experts.router, &l.experts.shared.gate_up, &l.experts.shared.down,
          &l.mlp.gate_up, &l.mlp.down}) {
      f(t->view());
    }
    for (const SwiGluWeights& e : l.experts.experts) {
      f(e.gate_up.view());
      f(e.down.view());
    }
  };
  f(w.embedding.view());
  for (const DecoderLayerWeights& l : w.layers) layer(l);
  f(w.lm_head.view());
  f(w.mtp.fc.view());
  for (const DecoderLayerWeights& l : w.mtp.layers) layer(l);
}

// A matrix's bytes (rows and scales); empty for an empty view.
inline std::string MatrixBytes(const Tensor& t) {
  if (t.rank() == 0) return "";
  return std::string(static_cast<const char*>(t.data()), t.bytes());
}

}  // namespace moeserve::model::testing
