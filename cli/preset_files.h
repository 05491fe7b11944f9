// The real tokenizer and chat templates that make-model's real-shape presets (qwen3-30b-a3b,
// qwen3.5-35b-a3b, qwen3-next-80b-a3b) write: the Qwen3 tokenizer of testdata/qwen3-tokenizer
// and the Qwen3.5 chat template of testdata/chat-templates, embedded in the binary at build time
// (cli/CMakeLists.txt), so that make-model does not need the source tree.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace moeserve::cli {

// testdata/qwen3-tokenizer/tokenizer.json, byte for byte (inflated from the embedded gzip
// stream; a corrupt stream is an Internal error).
Result<std::string> Qwen3TokenizerJson();
// testdata/qwen3-tokenizer/tokenizer_config.json: Qwen3's special tokens and its chat template
// (hermes-style JSON tool calls, enable_thinking), the format Qwen3-30B-A3B and Qwen3-Next use.
std::string_view Qwen3TokenizerConfigJson();
// testdata/chat-templates/qwen3.5.jinja: the template the Qwen3.5 family ships (XML tool calls,
// <think> opened in the generation prompt).
std::string_view Qwen35ChatTemplate();

}  // namespace moeserve::cli
