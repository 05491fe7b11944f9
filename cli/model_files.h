// The files of a model folder that the text-facing subcommands (tokenize, chat, serve) read
// besides the weights: the chat template (tokenizer_config.json or --chat-template) and
// generation_config.json's sampling defaults.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/sampling_params.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {

// The file's bytes; InvalidArgument when it holds more than max_bytes (a device, a wrong file).
Result<std::string> ReadTextFile(const std::string& path,
                                 size_t max_bytes = std::numeric_limits<size_t>::max());

// The tokenizer of the model at `path`: a folder's tokenizer.json, a GGUF file's metadata.
Result<std::unique_ptr<tokenizer::Tokenizer>> LoadModelTokenizer(const std::string& path);

// The chat template: `file` (--chat-template; "" none) with tokenizer_config.json's special tokens
// when the folder has them, else tokenizer_config.json's own (a GGUF file: its
// tokenizer.chat_template and special tokens). nullopt when there is neither; an
// error when a template that would be used does not parse.
Result<std::optional<tokenizer::ChatTemplate>> LoadChatTemplate(const std::string& dir,
                                                                const std::string& file);
// The same, with "none" as a NotFound error that says how to give one.
Result<tokenizer::ChatTemplate> RequireChatTemplate(const std::string& dir,
                                                    const std::string& file);
// RequireChatTemplate of what LoadChatTemplate gave for `dir`.
Result<tokenizer::ChatTemplate> RequiredChatTemplate(
    const std::string& dir, Result<std::optional<tokenizer::ChatTemplate>> loaded);

// The tokenizer and the chat template (LoadModelTokenizer and LoadChatTemplate's) of a model
// that needs both: a GGUF file's built from one read of its metadata.
struct ModelTokenizer {
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  Result<std::optional<tokenizer::ChatTemplate>> chat_template =
      std::optional<tokenizer::ChatTemplate>();
};
Result<ModelTokenizer> LoadModelTokenizerAndTemplate(const std::string& dir,
                                                     const std::string& file);

// What the model folder's generation_config.json changes in the defaults (vLLM's
// --generation-config auto: get_diff_sampling_param and update_from_generation_config).
struct GenerationConfig {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k, max_new_tokens;
  std::vector<int32_t> eos_token_ids;

  // Sets the sampling keys the file gives, except those `keep` names (flags given), and returns
  // "key=value" for each one set.
  std::vector<std::string> ApplyTo(engine::SamplingParams* p,
                                   const std::vector<std::string>& keep = {}) const;
  // The file's EOS ids that the model's config lacks: vLLM stops on them too (unless
  // ignore_eos), so they join a request's stop_token_ids.
  std::vector<int32_t> ExtraEosIds(std::span<const int64_t> model_eos_ids) const;
};

// A folder without the file has no overrides; a malformed one is an error naming it.
Result<GenerationConfig> LoadGenerationConfig(const std::string& dir);

}  // namespace moeserve::cli
