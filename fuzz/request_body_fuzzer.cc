// A /v1/completions or /v1/chat/completions body (the first byte picks the endpoint) through the
// checks the handlers run (server/request_check.h) on the default model: a 4xx error, or a
// request whose every prompt lies inside the vocabulary and leaves room for max_tokens within
// max_model_len, whose parameters validate, and whose choices the handler can build. Never a
// crash, a 5xx, or an exception.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "engine/sampling_params.h"
#include "fuzz/served_model.h"
#include "server/generation_job.h"

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
  const std::optional<server::ApiError> error =
      server::CheckGenerationRequest(model.Context(kMaxModelLen), *parsed, endpoint, &checked);
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
  // What the handler does next: one choice (a detokenizer with the stop strings) per engine
  // request, as many as n.
  const std::vector<engine::SamplingParams> fanned = engine::FanOut(params);
  if (static_cast<int64_t>(fanned.size()) != params.n) Fail("FanOut gave other than n choices");
  for (const engine::SamplingParams& p : fanned) {
    server::ChoiceState choice(*model.tok, p, 0);
    (void)choice;
  }
  return 0;
}
