// Full (softmax) attention, the mixer of the decoder's full-attention layers: output-gated in
// Qwen3-Next / Qwen3.5, plain in Qwen3 / Llama.
#pragma once

#include "kernels/attention.h"
#include "model/cache.h"
#include "model/layer_context.h"
#include "model/weights.h"

namespace moeserve::model {

// Full attention (docs/spec/model.md §3.d; with the output gate when config.attn_output_gate, q/k norm when
// present, partial NeoX RoPE) over x [T, H]; writes the batch's K/V at their positions into
// `kv` through each sequence's block table, then attends. out: [T, H].
void Attention(const LayerContext& ctx, const AttentionWeights& w, const TokenBatch& batch,
               const float* x, const kernels::PagedKvCache& kv, float* out);

}  // namespace moeserve::model
