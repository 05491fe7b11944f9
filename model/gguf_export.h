// A model written as a GGUF file laid out as llama.cpp's converter lays one out (the inverse of
// gguf_checkpoint.h): the `{arch}.*` keys, tensors under GGUF names with their dimensions
// reversed, each projection's routed experts stacked into one [E, out, in] tensor (Qwen3.5's fused
// gate_up split into gate and up), vectors in f32, and the converter's rewrites (Qwen3.5: the
// Gated DeltaNet value heads reordered to llama.cpp's tiled order in every v-indexed tensor).
// What tests and by-hand checks make GGUF files with; the tokenizer's keys are the caller's to
// add.
#pragma once

#include "core/dtype.h"
#include "core/status.h"
#include "io/gguf_writer.h"
#include "io/model_config.h"
#include "io/safetensors.h"

namespace moeserve::model {

// Adds `config`'s keys and `checkpoint`'s tensors to `writer`, the matrices in `matrix_dtype`
// (f32, f16, bf16, or a GGML block format quantized by kernels' reference quantizer). Errors
// name an architecture GGUF export does not cover, a tensor the checkpoint lacks, or a model
// read from a GGUF file (its rewrites would be applied twice).
Status AddGgufModel(const io::ModelConfig& config, const io::SafetensorsCheckpoint& checkpoint,
                    DType matrix_dtype, io::GgufWriter& writer);

}  // namespace moeserve::model
