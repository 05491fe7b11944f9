// A GGUF file (llama.cpp's single-file format, io/gguf.h) read as a model checkpoint: the
// config from its `{arch}.*` keys, and its tensors under the Hugging Face names and shapes the
// loader walks (checkpoint_layout.h), in place in the mapped file. What llama.cpp's converter
// changed is undone here or named for the loader:
//   - dimensions: GGUF lists ne[0] innermost, so a [out, in] matrix is ne = [in, out];
//   - routed experts: one [E, out, in] tensor per projection (ffn_{gate,up,down}_exps), which
//     each expert's tensor is a slice of;
//   - names: blk.N.attn_q.weight for model.layers.N.self_attn.q_proj.weight, ... (GgufName);
//   - squeezed dimensions of 1 (a conv weight's [conv_dim, 1, K] as [conv_dim, K]).
// Architectures: qwen3moe, qwen3, llama (its q and k rows interleaved per head for ggml's rope),
// qwen3next and qwen35moe (their MTP layers appended as blk.{L + i} with nextn.* tensors;
// qwen35moe's Gated DeltaNet value heads in llama.cpp's tiled order, which the layer runs as
// stored, and its fused experts split into ffn_{gate,up}_exps or merged as ffn_gate_up_exps);
// what the converter rewrote is named in ModelConfig::gguf for the walk, the loader and the
// layers. Tensor types: F32, F16, BF16 and GGML's block formats (core/dtype.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/gguf.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/checkpoint_layout.h"

namespace moeserve::model {

struct GgufCheckpoint {
  std::shared_ptr<const io::GgufFile> file;  // metadata: tokenizer, chat template
  io::ModelConfig config;
  io::SafetensorsCheckpoint checkpoint;  // Hugging Face names and shapes, bytes in `file`
};

// Opens `path`. Errors name the file and the key or tensor: an architecture or tensor type
// moeserve does not read, a missing or misshapen tensor, a value out of bounds.
Result<GgufCheckpoint> OpenGgufCheckpoint(const std::string& path);

// The model config a GGUF file's metadata describes (the `{arch}.*` and tokenizer id keys, the
// vocabulary and tied embedding from the tensors), validated as a config.json is.
Result<io::ModelConfig> GgufModelConfig(const io::GgufFile& file);

// Where a checkpoint tensor lives in a GGUF file: the tensor's name, and for one expert's slice
// of a routed-expert tensor, the expert (-1: the whole tensor).
struct GgufName {
  std::string name;
  int64_t expert = -1;
};
GgufName GgufNameOf(const io::ModelConfig& config, const CheckpointTensor& spec);

// GGUF's architecture name for `arch` ("qwen3moe", ...).
std::string_view GgufArchitectureName(io::Architecture arch);

// True when `path` names a GGUF file (by its magic bytes, whatever its name).
bool IsGgufFile(const std::string& path);

}  // namespace moeserve::model
