// --dump-activations DIR: writes each named intermediate of a forward pass as raw f32
// ([rows, cols], row-major) to DIR/<prefix>L<layer>.<name>.f32, and lists them in
// DIR/index.jsonl ({"file", "name", "layer", "rows", "cols"} per line), so that activations can
// be compared with another implementation's, layer by layer.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "core/status.h"
#include "model/causal_lm.h"
#include "model/layer_context.h"

namespace moeserve::cli {

class ActivationDump {
 public:
  static Result<std::unique_ptr<ActivationDump>> Create(const std::string& dir);
  // Creates a dump in `dir` and sets it as lm's activation tap; nullptr when dir is empty.
  static Result<std::unique_ptr<ActivationDump>> AttachTo(model::CausalLm& lm,
                                                          const std::string& dir);
  ~ActivationDump();

  // Names written from now on start with `prefix` (e.g. "step3.").
  void set_prefix(std::string prefix) { prefix_ = std::move(prefix); }
  model::ActivationTap Tap();
  // The first write error, if any.
  const Status& status() const { return status_; }

 private:
  ActivationDump(std::string dir, std::FILE* index) : dir_(std::move(dir)), index_(index) {}
  std::string dir_;
  std::string prefix_;
  std::FILE* index_;
  Status status_;
};

}  // namespace moeserve::cli
