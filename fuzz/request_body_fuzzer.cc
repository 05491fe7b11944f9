// A /v1/completions or /v1/chat/completions body (the first byte picks the endpoint) through the
// checks the handlers run (server/request_check.h) on the default model: a 4xx error, or a
// request whose every prompt lies inside the vocabulary and leaves room for max_tokens within
// max_model_len, whose choices stay within --max-choices-per-request, whose parameters the engine
// prepares, and whose choices the handler can build. Never a crash, a 5xx, or an exception.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "engine/sampler.h"
#include "engine/sampling_params.h"
#include "fuzz/served_model.h"
#include "server/generation_job.h"
#include "structured/grammar_cache.h"

namespace {

using namespace moeserve;

constexpr int64_t kMaxModelLen = 256;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "request_body_fuzzer: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const fuzz::ServedModel& model = fuzz::LoadServedModel();
  const server::Endpoint endpoint =
      data[0] % 2 == 0 ? server::Endpoint::kCompletions : server::Endpoint::kChat;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);

  Result<server::json> parsed = server::ParseRequestBody(body);
  if (!parsed.ok()) return 0;
  server::CheckedRequest checked;
  const std::optional<server::ApiError> error = server::CheckGenerationRequest(
      model.Context(kMaxModelLen), *parsed, endpoint, &checked, body);
  if (error) {
    if (error->status < 400 || error->status >= 500) Fail(error->Body().c_str());
    return 0;
  }
  const engine::SamplingParams& params = checked.request.params;
  if (checked.prompts.empty() || checked.prompts.size() != checked.prompt_texts.size()) {
    Fail("a checked request without prompts, or texts and prompts differing in number");
  }
  for (const std::vector<int32_t>& prompt : checked.prompts) {
    if (prompt.empty()) Fail("an empty prompt passed the checks");
    for (int32_t id : prompt) {
      if (id < 0 || id >= model.options.vocab_size) Fail("a prompt id outside the vocabulary");
    }
    if (static_cast<int64_t>(prompt.size()) + params.max_tokens > kMaxModelLen) {
      Fail("prompt + max_tokens exceed max_model_len");
    }
  }
  if (params.max_tokens > *model.options.max_tokens_cap) Fail("max_tokens above the cap");
  if (!params.Validate(model.options.vocab_size).ok()) Fail("checked params do not validate");
  if (static_cast<int64_t>(checked.prompts.size()) * params.n >
      model.options.request_limits.max_choices) {
    Fail("more choices than --max-choices-per-request");
  }
  // What the handler does next: the parameters prepared once (the engine's checks and tables),
  // and one choice (a detokenizer over the shared stop strings) per engine request.
  std::vector<int32_t> eos_ids;
  for (int64_t id : model.config.eos_token_ids) eos_ids.push_back(static_cast<int32_t>(id));
  // Structured output compiled as the handler compiles it: a refusal there is a 400.
  static structured::GrammarCache grammars(*model.tok, eos_ids);
  std::shared_ptr<const structured::CompiledGrammar> grammar;
  if (params.structured_outputs.has_value()) {
    Result<std::shared_ptr<const structured::CompiledGrammar>> compiled =
        grammars.Get(*params.structured_outputs);
    if (!compiled.ok()) return 0;
    grammar = std::move(*compiled);
  }
  Result<std::shared_ptr<const engine::PreparedParams>> prepared =
      engine::PrepareParams(params, eos_ids, model.options.vocab_size, grammar);
  if (!prepared.ok()) Fail(prepared.status().ToString().c_str());
  for (int64_t j = 0; j < params.n; ++j) {
    server::ChoiceState choice(*model.tok, *prepared, 0);
    (void)choice;
  }
  return 0;
}
