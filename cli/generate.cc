// moeserve generate: greedy generation for one prompt, given as text (--prompt, encoded with the
// model's tokenizer) or as token ids; the text is streamed through the incremental detokenizer.
// Many concurrent prompts and sampling arrive with the engine and sampling work.
#include <algorithm>
#include <cstdio>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/activation_dump.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "core/timer.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {
namespace {

constexpr char kCommand[] = "generate";

struct Options {
  ModelFlags model;
  std::string prompt;
  std::string token_ids;
  int64_t max_tokens = 16;
  bool ignore_eos = false;
  bool json = false;
  std::string dump_activations;
};

int Run(const Options& o) {
  if (o.prompt.empty() == o.token_ids.empty()) {
    return UsageError(kCommand, InvalidArgument("give exactly one of --prompt and --token-ids"));
  }
  if (o.max_tokens < 1) return UsageError(kCommand, InvalidArgument("--max-tokens: must be >= 1"));
  if (Status s = o.model.Validate(); !s.ok()) return UsageError(kCommand, s);
  Result<std::string> dir = o.model.Dir();
  if (!dir.ok()) return RuntimeError(kCommand, dir.status());
  // The tokenizer is needed for a text prompt; with token ids it only adds the text to the output.
  std::unique_ptr<tokenizer::Tokenizer> tok;
  Result<std::unique_ptr<tokenizer::Tokenizer>> loaded_tok = tokenizer::Tokenizer::LoadFromDir(*dir);
  if (loaded_tok.ok()) {
    tok = std::move(*loaded_tok);
  } else if (!o.prompt.empty()) {
    return RuntimeError(kCommand, loaded_tok.status());
  }
  Result<std::unique_ptr<model::CausalLm>> loaded = o.model.Load();
  if (!loaded.ok()) return RuntimeError(kCommand, loaded.status());
  model::CausalLm& lm = **loaded;
  const io::ModelConfig& c = lm.config();
  std::vector<int32_t> prompt;
  if (!o.prompt.empty()) {
    Result<std::vector<int32_t>> encoded = tok->Encode(o.prompt);
    if (!encoded.ok()) return UsageError(kCommand, encoded.status().WithContext("--prompt"));
    prompt = std::move(*encoded);
    if (prompt.empty()) return UsageError(kCommand, InvalidArgument("--prompt is empty"));
    for (int32_t id : prompt) {
      if (id >= c.vocab_size) {
        return RuntimeError(kCommand, InvalidArgument("the tokenizer gives id {}, outside the "
                                                      "model's vocabulary of {}",
                                                      id, c.vocab_size));
      }
    }
  } else {
    Result<std::vector<int32_t>> parsed = ParseTokenIds(o.token_ids, c.vocab_size);
    if (!parsed.ok()) return UsageError(kCommand, parsed.status());
    prompt = std::move(*parsed);
  }
  const int64_t total = static_cast<int64_t>(prompt.size()) + o.max_tokens;
  if (total > c.max_position_embeddings) {
    return UsageError(kCommand, InvalidArgument("prompt + --max-tokens = {} exceeds the model's "
                                                "max_position_embeddings {}",
                                                total, c.max_position_embeddings));
  }
  Result<std::unique_ptr<ActivationDump>> attached =
      ActivationDump::AttachTo(lm, o.dump_activations);
  if (!attached.ok()) return RuntimeError(kCommand, attached.status());
  std::unique_ptr<ActivationDump> dump = std::move(*attached);

  SingleSequence seq(c, total);
  std::vector<int32_t> generated;
  std::string finish_reason = "length";
  // Text streams to stdout as tokens arrive (plain output), or is collected for --json.
  std::optional<tokenizer::IncrementalDetokenizer> detok;
  if (tok) detok.emplace(*tok, tokenizer::DetokenizerOptions{.skip_special_tokens = true});
  std::string text;
  auto emit = [&](const std::string& piece) {
    text += piece;
    if (!o.json && !piece.empty()) {
      std::fputs(piece.c_str(), stdout);
      std::fflush(stdout);
    }
  };
  std::vector<float> logits;
  Stopwatch watch;
  double ttft_ms = 0;
  int32_t next = 0;
  int64_t pos = 0;
  const int32_t* input = prompt.data();
  int64_t n = static_cast<int64_t>(prompt.size());
  while (static_cast<int64_t>(generated.size()) < o.max_tokens) {
    if (dump) dump->set_prefix(fmt::format("step{}.", generated.size()));
    lm.Forward(seq.Input(input, n, pos), seq.cache, false, nullptr, &logits);
    pos += n;
    next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (generated.empty()) ttft_ms = watch.ElapsedMillis();
    generated.push_back(next);
    if (detok) emit(detok->Add(next));
    if (!o.ignore_eos && std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), next) !=
                             c.eos_token_ids.end()) {
      finish_reason = "stop";
      break;
    }
    input = &next;
    n = 1;
  }
  if (detok) emit(detok->Flush());
  const double total_ms = watch.ElapsedMillis();
  const double tpot_ms =
      generated.size() > 1 ? (total_ms - ttft_ms) / static_cast<double>(generated.size() - 1) : 0;
  if (dump && !dump->status().ok()) return RuntimeError(kCommand, dump->status());

  if (o.json) {
    nlohmann::ordered_json request;
    request["index"] = 0;
    request["token_ids"] = generated;
    if (tok) request["text"] = text;
    request["finish_reason"] = finish_reason;
    request["ttft_ms"] = ttft_ms;
    request["tpot_ms"] = tpot_ms;
    request["num_prompt_tokens"] = prompt.size();
    nlohmann::ordered_json out;
    out["requests"] = {request};
    std::puts(out.dump(2).c_str());
  } else {
    // With a tokenizer the text was streamed; without one, the ids are the output.
    if (tok) {
      std::fputs("\n", stdout);
    } else {
      fmt::print("{}\n", fmt::join(generated, " "));
    }
    std::fprintf(stderr,
                 "generate: %zu prompt tokens, %zu generated (%s); TTFT %.1f ms, TPOT %.2f ms "
                 "(%.1f tokens/s)\n",
                 prompt.size(), generated.size(), finish_reason.c_str(), ttft_ms, tpot_ms,
                 tpot_ms > 0 ? 1000.0 / tpot_ms : 0.0);
  }
  return 0;
}

}  // namespace

int RunGenerate(const std::vector<std::string>& args) {
  Options o;
  FlagSet flags("moeserve generate",
                "Greedy generation for one prompt (text or token ids) through the model.");
  o.model.Register(flags);
  flags.String("prompt", &o.prompt, "prompt text, encoded with the model's tokenizer");
  flags.String("token-ids", &o.token_ids, "or: comma-separated prompt token ids, e.g. 1,2,3");
  flags.Int("max-tokens", &o.max_tokens, "tokens to generate at most");
  flags.Bool("ignore-eos", &o.ignore_eos, "keep generating past the end-of-sequence token");
  flags.Bool("json", &o.json, "print JSON: token ids, text, finish reason, TTFT and TPOT");
  flags.String("dump-activations", &o.dump_activations,
               "write named intermediates of every step as raw f32 into this folder");
  if (std::optional<int> exit_code = ParseFlags(flags, args, kCommand)) return *exit_code;
  return Run(o);
}

}  // namespace moeserve::cli
