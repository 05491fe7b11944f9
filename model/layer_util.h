// Helpers the layer files share (gated_deltanet.cc, attention.cc, moe.cc, mlp.cc,
// decoder_layer.cc, layer_context.cc); not for other includers.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace moeserve::model {

// v's data with room for at least n elements: a batch larger than Scratch::Reserve planned grows
// it (and allocates), any other finds it large enough.
template <typename T>
T* Grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace moeserve::model
