// The default model's folder as `serve` reads it, for the fuzz targets of the request paths:
// tokenizer, chat template, generation_config.json's defaults, and the ServerOptions serve
// builds from them. Loaded once per process; a folder that does not load aborts the target.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "cli/model_files.h"
#include "io/model_config.h"
#include "server/http_server.h"
#include "server/request_check.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "core/test_paths.h"

namespace moeserve::fuzz {

struct ServedModel {
  std::string dir = MOESERVE_DEFAULT_MODEL_DIR;
  io::ModelConfig config;
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::optional<tokenizer::ChatTemplate> chat_template;
  server::ServerOptions options;

  // The checks' context at a given max_model_len (the engine's, in the server), with the KV
  // cache an engine of the default sizing holds (--max-num-seqs 64 full-length requests).
  server::RequestContext Context(int64_t max_model_len) const {
    return {.tok = *tok,
            .chat_template = chat_template ? &*chat_template : nullptr,
            .served_model_name = options.served_model_name,
            .vocab_size = options.vocab_size,
            .max_model_len = max_model_len,
            .default_params = options.default_params,
            .extra_eos_ids = options.extra_eos_ids,
            .max_tokens_cap = options.max_tokens_cap,
            .limits = options.request_limits,
            .kv_cache_tokens = 64 * max_model_len};
  }
};

template <typename T>
T OrDie(Result<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "fuzz setup: %s: %s\n", what, r.status().ToString().c_str());
    std::abort();
  }
  return std::move(*r);
}

inline const ServedModel& LoadServedModel() {
  static const ServedModel* model = [] {
    auto* m = new ServedModel;
    m->config = OrDie(io::LoadModelConfig(m->dir), "config.json");
    m->tok = OrDie(tokenizer::Tokenizer::LoadFromDir(m->dir), "tokenizer");
    m->chat_template = OrDie(cli::LoadChatTemplate(m->dir, ""), "chat template");
    const cli::GenerationConfig generation =
        OrDie(cli::LoadGenerationConfig(m->dir), "generation_config.json");
    m->options.served_model_name = "default";
    m->options.model_root = m->dir;
    m->options.vocab_size = m->config.vocab_size;
    generation.ApplyTo(&m->options.default_params);
    m->options.extra_eos_ids = generation.ExtraEosIds(m->config.eos_token_ids);
    // Every generation stops within 16 tokens and at most 8 choices wait: an input stays
    // cheap, however large its max_tokens or n (a 503 past the bound is an answer too).
    m->options.max_tokens_cap = 16;
    m->options.max_waiting_requests = 8;
    return m;
  }();
  return *model;
}

}  // namespace moeserve::fuzz
