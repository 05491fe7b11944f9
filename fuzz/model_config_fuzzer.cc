// Feeds arbitrary bytes to the config.json parser: it must return a Status or a ModelConfig whose
// derived sizes are computable -- never crash, overflow or recurse without bound (a config
// nested thousands of levels deep is refused by the JSON reader's limit, core/json.h).
#include <cstdint>
#include <string_view>

#include "io/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = moeserve::io::ParseModelConfig(text);
  if (config.ok()) {
    // What loading and the engine compute from a config they accept.
    volatile int64_t sink = config->linear_conv_dim() + config->num_layers_of(moeserve::io::LayerType::kFullAttention);
    (void)sink;
    (void)moeserve::io::ModelConfigToJson(*config);
  }
  return 0;
}
