// moeserve bench latency: in-process decode and prefill speed of one model, against the
// memory-bandwidth roofline measured in the same run (CLI.md).
#include <algorithm>
#include <cstdio>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_flags.h"
#include "core/log.h"
#include "core/timer.h"
#include "kernels/memory_bandwidth.h"
#include "model/checkpoint_layout.h"

namespace moeserve::cli {
namespace {

constexpr char kCommand[] = "bench latency";

struct Options {
  ModelFlags model;
  int64_t input_len = 128;
  int64_t output_len = 64;
  std::string batch_size = "1";
  int64_t seed = 0;
  std::string json_file;
};

struct RunResult {
  int64_t batch_size, input_len, output_len;
  double prefill_tok_s, tpot_ms, decode_tok_s, roofline_tok_s, roofline_ratio;
};

// One sequence: prefill input_len random tokens, then output_len greedy decode steps.
RunResult RunOnce(model::CausalLm& lm, const Options& o, double roofline_tok_s) {
  const io::ModelConfig& c = lm.config();
  SingleSequence seq(c, o.input_len + o.output_len);
  std::mt19937 rng(static_cast<uint32_t>(o.seed));
  std::vector<int32_t> prompt(o.input_len);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % c.vocab_size);

  std::vector<float> logits;
  Stopwatch watch;
  lm.Forward(seq.Input(prompt.data(), o.input_len, 0), seq.cache, false, nullptr, &logits);
  const double prefill_s = watch.ElapsedSeconds();
  int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  watch.Reset();
  for (int64_t i = 1; i < o.output_len; ++i) {
    lm.Forward(seq.Input(&next, 1, o.input_len + i - 1), seq.cache, false, nullptr, &logits);
    next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  const double decode_s = watch.ElapsedSeconds();
  RunResult r{1, o.input_len, o.output_len, o.input_len / prefill_s, 0, 0, roofline_tok_s, 0};
  const int64_t steps = std::max<int64_t>(o.output_len - 1, 1);
  r.tpot_ms = decode_s * 1000.0 / steps;
  r.decode_tok_s = 1000.0 / r.tpot_ms;
  r.roofline_ratio = r.decode_tok_s / roofline_tok_s;
  return r;
}

int Run(const Options& o) {
  if (Status s = o.model.Validate(); !s.ok()) return UsageError(kCommand, s);
  if (o.input_len < 1 || o.output_len < 2) {
    return UsageError(kCommand, InvalidArgument("--input-len must be >= 1 and --output-len >= 2"));
  }
  Result<std::vector<int32_t>> batches = ParseTokenIds(o.batch_size, 1 << 20);
  if (!batches.ok() || std::any_of(batches->begin(), batches->end(), [](int32_t b) { return b < 1; })) {
    return UsageError(kCommand, InvalidArgument("--batch-size: '{}' is not a list of positive "
                                                "integers", o.batch_size));
  }
  for (int32_t b : *batches) {
    if (b != 1) {
      return UsageError(kCommand, InvalidArgument("--batch-size {}: batches above 1 need the "
                                                  "continuous-batching engine, not built yet", b));
    }
  }
  Result<std::unique_ptr<model::CausalLm>> loaded = o.model.Load();
  if (!loaded.ok()) return RuntimeError(kCommand, loaded.status());
  model::CausalLm& lm = **loaded;
  const io::ModelConfig& c = lm.config();
  if (o.input_len + o.output_len > c.max_position_embeddings) {
    return UsageError(kCommand, InvalidArgument("input + output length exceeds the model's "
                                                "max_position_embeddings {}",
                                                c.max_position_embeddings));
  }

  // Weight bytes one decoded token reads as loaded: matrices in the weight dtype, vectors f32.
  const size_t matrix_size = DTypeSize(lm.weights().matrix_dtype);
  const model::ModelStats stats =
      model::ComputeModelStats(c, [&](const model::CheckpointTensor& t) {
        return t.kind == model::TensorKind::kLinear || t.kind == model::TensorKind::kEmbedding
                   ? matrix_size
                   : sizeof(float);
      });
  const double bandwidth = kernels::MeasureReadBandwidth(lm.pool()).gb_per_s;
  const double roofline = bandwidth * 1e9 / static_cast<double>(stats.bytes_per_token);

  // A short warm-up run (page faults, caches), then the measured one.
  Options warm = o;
  warm.input_len = std::min<int64_t>(o.input_len, 16);
  warm.output_len = 4;
  RunOnce(lm, warm, roofline);
  std::vector<RunResult> runs;
  for (int32_t b : *batches) {
    runs.push_back(RunOnce(lm, o, roofline));
    runs.back().batch_size = b;
  }

  fmt::print("model            {} ({} weights, {} threads)\n", c.architecture_name,
             DTypeName(lm.weights().matrix_dtype), lm.pool().num_threads());
  fmt::print("bytes per token  {:.1f} MB\n", stats.bytes_per_token * 1e-6);
  fmt::print("bandwidth        {:.1f} GB/s (measured in this run)\n", bandwidth);
  fmt::print("roofline         {:.1f} tokens/s\n\n", roofline);
  fmt::print("{:>5} {:>6} {:>6} {:>12} {:>9} {:>12} {:>10}\n", "batch", "input", "output",
             "prefill t/s", "TPOT ms", "decode t/s", "roofline");
  for (const RunResult& r : runs) {
    fmt::print("{:>5} {:>6} {:>6} {:>12.1f} {:>9.2f} {:>12.1f} {:>9.1f}%\n", r.batch_size,
               r.input_len, r.output_len, r.prefill_tok_s, r.tpot_ms, r.decode_tok_s,
               100.0 * r.roofline_ratio);
  }
  if (!o.json_file.empty()) {
    nlohmann::ordered_json j;
    j["model"] = c.architecture_name;
    j["weight_dtype"] = DTypeName(lm.weights().matrix_dtype);
    j["threads"] = lm.pool().num_threads();
    j["bandwidth_gbs"] = bandwidth;
    j["bytes_per_token"] = stats.bytes_per_token;
    j["runs"] = nlohmann::ordered_json::array();
    for (const RunResult& r : runs) {
      j["runs"].push_back({{"batch_size", r.batch_size},
                           {"input_len", r.input_len},
                           {"output_len", r.output_len},
                           {"prefill_tok_s", r.prefill_tok_s},
                           {"tpot_ms", r.tpot_ms},
                           {"decode_tok_s", r.decode_tok_s},
                           {"roofline_tok_s", r.roofline_tok_s},
                           {"roofline_ratio", r.roofline_ratio}});
    }
    j["ablation"] = nlohmann::ordered_json::array();
    std::FILE* f = std::fopen(o.json_file.c_str(), "w");
    if (f == nullptr) return RuntimeError(kCommand, IoError("cannot write {}", o.json_file));
    std::fputs((j.dump(2) + "\n").c_str(), f);
    std::fclose(f);
  }
  return 0;
}

int RunLatency(const std::vector<std::string>& args) {
  Options o;
  FlagSet flags("moeserve bench latency",
                "In-process decode TPOT and prefill rate, with the memory-bandwidth roofline\n"
                "(weight bytes per token / read bandwidth) measured in the same run.");
  o.model.Register(flags);
  flags.Int("input-len", &o.input_len, "prompt tokens (random ids)");
  flags.Int("output-len", &o.output_len, "generated tokens");
  flags.String("batch-size", &o.batch_size, "concurrent sequences, a list allowed (1 for now)");
  flags.Int("seed", &o.seed, "seed of the random prompt");
  flags.String("json", &o.json_file, "also write the results as JSON to this file");
  if (std::optional<int> exit_code = ParseFlags(flags, args, kCommand)) return *exit_code;
  return Run(o);
}

}  // namespace

int RunBench(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "latency") {
    return RunLatency(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::puts("usage: moeserve bench latency [flags]   (see --help of it)");
    return 0;
  }
  return UsageError("bench", InvalidArgument("expected 'bench latency' (got '{}')",
                                             args.empty() ? "" : args[0]));
}

}  // namespace moeserve::cli
