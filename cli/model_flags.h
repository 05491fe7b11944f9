// Flags shared by the subcommands that run a model (logits, generate, bench latency), and the
// loading they drive.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cli/flags.h"
#include "core/status.h"
#include "model/causal_lm.h"

namespace moeserve::cli {

struct ModelFlags {
  std::string model;         // "" = the default model
  std::string weight_dtype;  // "" = as the checkpoint
  int64_t threads = 0;       // 0 = all cores

  void Register(FlagSet& flags);
  // Checks the flag values (a usage error names the flag).
  Status Validate() const;
  // Loads the model (after Validate), logging what was loaded and how long it took.
  Result<std::unique_ptr<model::CausalLm>> Load() const;
};

// Parses "1,2,3" into token ids, each in [0, vocab_size).
Result<std::vector<int32_t>> ParseTokenIds(const std::string& text, int64_t vocab_size);

// Writes floats as raw little-endian f32.
Status WriteF32File(const std::string& path, const float* data, size_t n);

}  // namespace moeserve::cli
