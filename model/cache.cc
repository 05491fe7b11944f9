#include "model/cache.h"

#include <cstring>

#include "core/check.h"

namespace moeserve::model {

ModelCache::ModelCache(const io::ModelConfig& c, const CacheSizes& sizes) : sizes_(sizes) {
  CHECK_GT(sizes.block_size, 0);
  const int64_t layers = c.num_hidden_layers + c.num_mtp_layers;
  layers_.resize(layers);
  for (int64_t i = 0; i < layers; ++i) {
    LayerStorage& s = layers_[i];
    const bool attention =
        i >= c.num_hidden_layers || c.layer_types[i] == io::LayerType::kFullAttention;
    if (attention) {
      const int64_t floats =
          sizes.num_blocks * sizes.block_size * c.num_key_value_heads * c.head_dim;
      s.k = TensorStorage(floats * sizeof(float));
      s.v = TensorStorage(floats * sizeof(float));
      s.kv = kernels::PagedKvCache{reinterpret_cast<float*>(s.k.data()),
                                   reinterpret_cast<float*>(s.v.data()), sizes.num_blocks,
                                   sizes.block_size, c.num_key_value_heads, c.head_dim};
    } else {
      s.conv_per_slot = (c.linear_conv_kernel_dim - 1) * c.linear_conv_dim();
      s.recurrent_per_slot =
          c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
      s.conv = TensorStorage(sizes.num_state_slots * s.conv_per_slot * sizeof(float));
      s.recurrent = TensorStorage(sizes.num_state_slots * s.recurrent_per_slot * sizeof(float));
    }
  }
}

const kernels::PagedKvCache& ModelCache::kv(int64_t layer) const {
  const LayerStorage& s = layers_.at(layer);
  CHECK(s.kv.k != nullptr) << "layer " << layer << " has no KV cache";
  return s.kv;
}

float* ModelCache::conv_state(int64_t layer, int32_t slot) {
  LayerStorage& s = layers_.at(layer);
  CHECK(slot >= 0 && slot < sizes_.num_state_slots && s.conv_per_slot > 0);
  return reinterpret_cast<float*>(s.conv.data()) + slot * s.conv_per_slot;
}

float* ModelCache::recurrent_state(int64_t layer, int32_t slot) {
  LayerStorage& s = layers_.at(layer);
  CHECK(slot >= 0 && slot < sizes_.num_state_slots && s.recurrent_per_slot > 0);
  return reinterpret_cast<float*>(s.recurrent.data()) + slot * s.recurrent_per_slot;
}

void ModelCache::ResetSlot(int32_t slot) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    LayerStorage& s = layers_[i];
    if (s.conv_per_slot == 0) continue;
    std::memset(conv_state(i, slot), 0, s.conv_per_slot * sizeof(float));
    std::memset(recurrent_state(i, slot), 0, s.recurrent_per_slot * sizeof(float));
  }
}

void ModelCache::CopySlot(int32_t from, int32_t to) {
  if (from == to) return;
  for (size_t i = 0; i < layers_.size(); ++i) {
    LayerStorage& s = layers_[i];
    if (s.conv_per_slot == 0) continue;
    std::memcpy(conv_state(i, to), conv_state(i, from), s.conv_per_slot * sizeof(float));
    std::memcpy(recurrent_state(i, to), recurrent_state(i, from),
                s.recurrent_per_slot * sizeof(float));
  }
}

int64_t ModelCache::kv_bytes() const {
  int64_t n = 0;
  for (const LayerStorage& s : layers_) n += s.k.size() + s.v.size();
  return n;
}

int64_t ModelCache::state_bytes() const {
  int64_t n = 0;
  for (const LayerStorage& s : layers_) n += s.conv.size() + s.recurrent.size();
  return n;
}

}  // namespace moeserve::model
