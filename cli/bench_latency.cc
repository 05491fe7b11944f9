// moeserve bench latency: in-process prefill rate and decode TPOT of the engine at one or more
// batch sizes, against the memory-bandwidth roofline measured in the same run (docs/cli.md).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/ablation.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/latency_report.h"
#include "cli/model_flags.h"
#include "core/check.h"
#include "core/timer.h"
#include "kernels/fma_peak.h"
#include "kernels/isa.h"
#include "kernels/memory_bandwidth.h"
#include "model/model_files.h"
#include "model/checkpoint_layout.h"
#include "model/weight_bytes.h"

namespace moeserve::cli {
namespace {

constexpr char kCommand[] = "bench latency";

struct Options {
  ModelFlags model;
  EngineFlags engine;
  int64_t input_len = 128;
  int64_t output_len = 64;
  std::string batch_size = "1";
  int64_t seed = 0;
  std::string json_file;
  std::string report_file;          // --report: the results as an HTML page
  bool max_num_seqs_given = false;  // --max-num-seqs was on the command line
  int64_t turns = 1;                // > 1: a conversation instead of batches
  bool ablation = false;            // --ablation
  int64_t ablation_rounds = 3;      // --ablation-rounds
};

// --ablation: one optimization off, its TPOT and the change against everything on.
struct AblationRow {
  std::string optimization, flag;
  double tpot_ms = 0, change_pct = 0;
};

struct RunResult {
  int64_t batch_size, input_len, output_len;
  double prefill_tok_s, tpot_ms, decode_tok_s, roofline_tok_s, roofline_ratio;
  engine::SpecDecodeStats spec;  // speculative decoding: drafts and acceptance in this run
  // --comm-sim, per decode step on rank 0: the modelled link time of its collectives, the part
  // it waited for, and of that the part in all-to-all exchanges (--ep's combine).
  double link_ms = 0, link_exposed_ms = 0, a2a_exposed_ms = 0;
  // Ranks > 1, per decode step: MB of weights rank 0 prefetched while waiting (case study #12).
  double warmed_mb = 0;
  double prefill_gflops = 0, prefill_peak_ratio = 0;  // against the measured f32 FMA peak
};

// Rank 0's link counters (zero without --comm-sim) and the bytes its waits warmed.
struct LinkCounters {
  double modelled = 0, exposed = 0, exchange = 0, warmed = 0;
  static LinkCounters Of(const model::ModelGroup& group) {
    const auto warmed = static_cast<double>(group.model().warmed_bytes());
    const parallel::SimulatedLinkCommunicator* link = group.link();
    if (link == nullptr) return {.warmed = warmed};
    return {link->modelled_seconds(), link->exposed_seconds(), link->exchange_exposed_seconds(),
            warmed};
  }
};

// `batch` concurrent requests through a fresh engine (so no request finds another run's prompt
// in the prefix cache): each a different random prompt of input_len ids, ignore_eos, output_len
// tokens. The prompts go in together; the scheduler chunks them under --max-num-batched-tokens
// as it would when serving.
//   prefill_tok_s = batch * input_len / (time until every request has its first token)
//   tpot_ms       = over the steps after that in which every request got a token (the full
//                   batch decoding), their time / the tokens each request got in them: the time
//                   per output token of a request (one token a step, or more with accepted
//                   speculative drafts)
//   decode_tok_s  = batch * 1000 / tpot_ms, aggregate over the batch
Result<RunResult> RunBatch(model::ModelGroup& group, const engine::EngineConfig& config,
                           int64_t batch, int64_t input_len, int64_t output_len, int64_t seed) {
  ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine, CreateEngine(group, config));
  // Every request must run at once, or the batch measured is not `batch`.
  CHECK_GE(config.max_num_seqs, batch);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  engine::SamplingParams params;  // greedy: the benchmark measures the engine, not the sampler
  params.temperature = 0;
  params.max_tokens = output_len;
  params.ignore_eos = true;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int32_t> prompt(input_len);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % group.model().config().vocab_size);
    if (Result<int64_t> id = engine->AddRequest(std::move(prompt), params); !id.ok()) {
      return id.status();
    }
  }

  Stopwatch watch;
  int64_t num_started = 0;  // requests that have their first token
  double prefill_ms = 0, step_start_ms = 0, decode_ms = 0;
  int64_t decode_steps = 0, decode_tokens = 0;
  std::vector<int64_t> outputs_of(batch, 0);  // by request id: a fresh engine numbers from 0
  LinkCounters link_in_decode;
  while (engine->HasUnfinished()) {
    const LinkCounters before = LinkCounters::Of(group);
    ASSIGN_OR_RETURN(const std::vector<engine::Request*>* updated, StepEngine(*engine));
    const LinkCounters after = LinkCounters::Of(group);
    const double now = watch.ElapsedMillis();
    const bool prefilled = num_started == batch;  // before this step
    int64_t new_tokens = 0;
    for (const engine::Request* r : *updated) {
      num_started += r->num_output_tokens() == 1;  // a prefill emits exactly one token
      new_tokens += r->num_output_tokens() - outputs_of.at(r->id);
      outputs_of[r->id] = r->num_output_tokens();
    }
    if (prefilled && static_cast<int64_t>(updated->size()) == batch) {
      decode_ms += now - step_start_ms;
      decode_tokens += new_tokens;
      ++decode_steps;
      link_in_decode.modelled += after.modelled - before.modelled;
      link_in_decode.exposed += after.exposed - before.exposed;
      link_in_decode.exchange += after.exchange - before.exchange;
      link_in_decode.warmed += after.warmed - before.warmed;
    }
    if (!prefilled && num_started == batch) prefill_ms = now;
    step_start_ms = now;
  }
  if (decode_steps == 0) {
    return InvalidArgument(
        "no step decoded all {} requests at once (their prefills spread "
        "over more than --output-len {} steps): raise --output-len or "
        "--max-num-batched-tokens",
        batch, output_len);
  }
  RunResult r{batch, input_len, output_len, 0, 0, 0, 0, 0, engine->spec_stats()};
  r.prefill_tok_s = static_cast<double>(batch * input_len) / (prefill_ms * 1e-3);
  r.tpot_ms = decode_ms / (static_cast<double>(decode_tokens) / static_cast<double>(batch));
  r.decode_tok_s = static_cast<double>(batch) * 1000.0 / r.tpot_ms;
  const double per_step = 1e3 / static_cast<double>(decode_steps);
  r.link_ms = link_in_decode.modelled * per_step;
  r.link_exposed_ms = link_in_decode.exposed * per_step;
  r.a2a_exposed_ms = link_in_decode.exchange * per_step;
  r.warmed_mb = link_in_decode.warmed * 1e-6 / static_cast<double>(decode_steps);
  return r;
}

// One turn of a conversation: its prompt, what the prefix cache supplied, its time to first token.
struct TurnResult {
  int64_t prompt_tokens = 0, cached_tokens = 0;
  double ttft_ms = 0;
};

// A conversation of `turns` turns through one engine, one request at a time: turn k's prompt is
// turn k - 1's prompt and output plus input_len new random ids, and it generates output_len
// tokens (greedy, ignore_eos). With prefix caching each turn resumes where the last one ended.
Result<std::vector<TurnResult>> RunConversation(model::ModelGroup& group,
                                                const engine::EngineConfig& config, int64_t turns,
                                                int64_t input_len, int64_t output_len,
                                                int64_t seed) {
  ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine, CreateEngine(group, config));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  engine::SamplingParams params;
  params.temperature = 0;
  params.max_tokens = output_len;
  params.ignore_eos = true;
  std::vector<int32_t> conversation;
  std::vector<TurnResult> results;
  for (int64_t turn = 0; turn < turns; ++turn) {
    for (int64_t i = 0; i < input_len; ++i) {
      conversation.push_back(static_cast<int32_t>(rng() % group.model().config().vocab_size));
    }
    TurnResult t{static_cast<int64_t>(conversation.size()), 0, 0};
    Stopwatch watch;
    ASSIGN_OR_RETURN(const int64_t id, engine->AddRequest(conversation, params));
    while (engine->HasUnfinished()) {
      RETURN_IF_ERROR(StepEngine(*engine).status());
      if (t.ttft_ms == 0 && !engine->Find(id)->output_token_ids.empty()) {
        t.ttft_ms = watch.ElapsedMillis();
      }
    }
    const engine::Request* r = engine->Find(id);
    t.cached_tokens = r->num_cached_tokens;
    conversation.insert(conversation.end(), r->output_token_ids.begin(), r->output_token_ids.end());
    engine->Release(id);
    results.push_back(t);
  }
  return results;
}

// What the flags ask for, checked against each other (before the model loads).
struct Plan {
  std::vector<int32_t> batches;  // --batch-size, in order
  engine::EngineConfig config;   // the engine as the flags say, max_model_len filled in
  int64_t request_len = 0;       // positions of the longest request: all turns, prompt and output
};

// A usage error (InvalidArgument) names the flag.
Result<Plan> CheckFlags(const Options& o) {
  RETURN_IF_ERROR(o.model.Validate());
  RETURN_IF_ERROR(o.engine.Validate());
  if (o.input_len < 1 || o.output_len < 2) {
    return InvalidArgument("--input-len must be >= 1 and --output-len >= 2");
  }
  Plan plan;
  Result<std::vector<int32_t>> batches = ParseTokenIds(o.batch_size, 1 << 20);
  if (!batches.ok() ||
      std::any_of(batches->begin(), batches->end(), [](int32_t b) { return b < 1; })) {
    return InvalidArgument("--batch-size: '{}' is not a list of positive integers", o.batch_size);
  }
  plan.batches = std::move(*batches);
  // The engine: as the flags say, with max_model_len just what a request needs unless given.
  plan.config = o.engine.ToConfig();
  const int64_t max_batch = *std::max_element(plan.batches.begin(), plan.batches.end());
  if (o.max_num_seqs_given && plan.config.max_num_seqs < max_batch) {
    return InvalidArgument("--max-num-seqs {} is below --batch-size {}", plan.config.max_num_seqs,
                           max_batch);
  }
  if (o.turns < 1 || o.turns > 1000) return InvalidArgument("--turns must be in [1, 1000]");
  if (o.ablation_rounds < 1 || o.ablation_rounds > 100) {
    return InvalidArgument("--ablation-rounds must be in [1, 100]");
  }
  for (const auto& [flag, path] :
       {std::pair<const char*, const std::string&>{"--json", o.json_file},
        {"--report", o.report_file}}) {
    if (!path.empty()) RETURN_IF_ERROR(CheckWritableFile(flag, path));
  }
  if (o.turns > 1 && !o.report_file.empty()) {
    return InvalidArgument("--report charts batches, not --turns");
  }
  if (o.turns > 1 && o.ablation) return InvalidArgument("--ablation measures batches, not --turns");
  plan.request_len = o.turns * (o.input_len + o.output_len);
  if (plan.config.max_model_len == 0) {
    plan.config.max_model_len = plan.request_len;
  } else if (plan.config.max_model_len < plan.request_len) {
    return InvalidArgument("--max-model-len {} is below --input-len + --output-len = {}",
                           plan.config.max_model_len, plan.request_len);
  }
  return plan;
}

// Unless given, --max-num-seqs is the batch size: GDN state slots and the runner's rows are
// sized for it.
engine::EngineConfig ConfigFor(const Options& o, int64_t batch, const engine::EngineConfig& base) {
  engine::EngineConfig sized = base;
  if (!o.max_num_seqs_given) sized.max_num_seqs = batch;
  return sized;
}

// What the runs are judged against, measured on this machine in this run.
struct Ceilings {
  int64_t threads_per_rank = 0;
  int64_t threads_here = 0;  // threads of every rank on this machine
  model::ModelStats stats;
  double bandwidth = 0;  // GB/s read
  double fma_peak = 0;   // f32 GFLOP/s
  double prefill_flops_per_token = 0;
  double roofline = 0;  // tokens/s of one sequence
};

Ceilings MeasureCeilings(const Options& o, model::ModelGroup& group) {
  model::CausalLm& lm = group.model();
  const io::ModelConfig& c = lm.config();
  Ceilings m;
  m.threads_per_rank = static_cast<int64_t>(lm.pool().num_threads());
  m.threads_here = m.threads_per_rank * o.model.RanksOnThisMachine();
  // Weight bytes one decoded token reads as loaded: matrices as --weight-dtype stores each
  // (packed formats with their scales), vectors f32.
  const model::ModelWeights& weights = lm.weights();
  const std::optional<DType> lm_head =
      weights.lm_head.view().rank() == 2 ? std::optional(weights.lm_head.view().dtype())
                                         : std::nullopt;
  // A load that keeps the checkpoint's formats (a GGUF file's) reads them as stored.
  std::map<std::string, double> stored;
  if (weights.stored_formats) {
    Result<model::ModelFiles> files = model::OpenModelFiles(*o.model.Dir());
    CHECK(files.ok()) << files.status().ToString();  // the model was just loaded from it
    stored = *model::StoredBytesPerWeight(c, files->checkpoint);
  }
  m.stats = model::ComputeModelStats(c, [&](const model::CheckpointTensor& t) {
    if (weights.stored_formats && !(t.role == model::TensorRole::kLmHead && lm_head &&
                                    !IsGgmlBlockDType(*lm_head))) {
      return stored.at(t.name);
    }
    return model::LoadedBytesPerWeight(t, weights.matrix_dtype, weights.base_dtype, lm_head);
  });
  // Measured with as many threads as the ranks here compute with.
  ThreadPool bandwidth_pool(static_cast<size_t>(m.threads_here));
  m.bandwidth = kernels::MeasureReadBandwidth(bandwidth_pool).gb_per_s;
  // The compute ceiling prefill is judged against, on the same threads.
  m.fma_peak = kernels::MeasureFmaPeak(bandwidth_pool).gflops;
  // Flops of one prefill token: 2 per active matrix weight, without the embedding (a gather)
  // and lm_head (one token per prompt); attention's scores over the context come on top.
  const double embedding_params = static_cast<double>(c.vocab_size * c.hidden_size);
  m.prefill_flops_per_token = 2.0 * (static_cast<double>(m.stats.params_active) -
                                     embedding_params * (c.tie_word_embeddings ? 1 : 2));
  // The roofline of one sequence. A batch of B reads the shared weights once per step for all B
  // tokens but each token's own experts, so its aggregate rate may pass this single-sequence
  // bound: roofline_ratio = decode_tok_s / roofline_tok_s says how far batching carries past it.
  m.roofline = m.bandwidth * 1e9 / static_cast<double>(m.stats.bytes_per_token);
  return m;
}

// A warm-up run, then one measured run per batch size. Like vLLM's benchmark_latency, the
// warm-up has the measured shape (the largest batch, the whole prompt; two output tokens): the
// model's scratch grows to the largest step once and its pages are faulted in here, not in a
// measured prefill (a first prefill runs slower than the next ones).
Result<std::vector<RunResult>> MeasureBatches(const Options& o, const Plan& plan, const Ceilings& m,
                                              model::ModelGroup& group) {
  const int32_t largest = *std::max_element(plan.batches.begin(), plan.batches.end());
  RETURN_IF_ERROR(
      RunBatch(group, ConfigFor(o, largest, plan.config), largest, o.input_len, 2, o.seed + 1)
          .status());
  std::vector<RunResult> runs;
  for (int32_t b : plan.batches) {
    Result<RunResult> run =
        RunBatch(group, ConfigFor(o, b, plan.config), b, o.input_len, o.output_len, o.seed);
    if (!run.ok()) return run.status().WithContext(fmt::format("batch size {}", b));
    run->roofline_tok_s = m.roofline;
    run->roofline_ratio = run->decode_tok_s / m.roofline;
    run->prefill_gflops = run->prefill_tok_s * m.prefill_flops_per_token * 1e-9;
    run->prefill_peak_ratio = run->prefill_gflops / m.fma_peak;
    runs.push_back(*run);
  }
  return runs;
}

// --ablation: per optimization, TPOT with it off and the change against everything on.
struct Ablation {
  std::vector<AblationRow> rows;
  std::vector<double> baseline_runs;  // everything on, one TPOT per round
  double baseline = 0;                // their median
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// --ablation at the first batch size: rounds of runs -- everything on, then each optimization
// off in turn -- and per configuration the median TPOT over the rounds. The rounds interleave
// the configurations, so a drift of the machine (a VM's bandwidth moves over minutes) falls on
// all of them alike.
Result<Ablation> MeasureAblation(const Options& o, const Plan& plan, model::ModelGroup& group) {
  const int64_t b = plan.batches.front();
  const RunSwitches on{group.model().forward_options(), plan.config};
  // Every run sets the forward's switches it needs on every rank; the last puts them back.
  const auto tpot_of = [&](const RunSwitches& s) -> Result<double> {
    group.SetForwardOptions(s.forward);
    Result<RunResult> run =
        RunBatch(group, ConfigFor(o, b, s.engine), b, o.input_len, o.output_len, o.seed);
    if (!run.ok()) return run.status();
    return run->tpot_ms;
  };
  const std::vector<Optimization> opts =
      AblatableOptimizations(on, group.model().config(), group.size(), o.model.ep);
  Ablation a;
  std::vector<std::vector<double>> off_runs(opts.size());
  for (int64_t round = 0; round < o.ablation_rounds; ++round) {
    ASSIGN_OR_RETURN(const double all_on, tpot_of(on));
    a.baseline_runs.push_back(all_on);
    for (size_t i = 0; i < opts.size(); ++i) {
      Result<double> tpot = tpot_of(opts[i].off(on));
      if (!tpot.ok()) return tpot.status().WithContext("--ablation: " + opts[i].name);
      off_runs[i].push_back(*tpot);
    }
  }
  group.SetForwardOptions(on.forward);
  a.baseline = Median(a.baseline_runs);
  for (size_t i = 0; i < opts.size(); ++i) {
    const double tpot = Median(off_runs[i]);
    a.rows.push_back({opts[i].name, opts[i].flag, tpot, 100.0 * (tpot / a.baseline - 1.0)});
  }
  return a;
}

// The tables on stdout: the machine, one row per batch size, the ablation.
void PrintResults(const Options& o, const Plan& plan, const Ceilings& m,
                  const model::ModelGroup& group, const std::vector<RunResult>& runs,
                  const Ablation& ablation) {
  const model::CausalLm& lm = group.model();
  const io::ModelConfig& c = lm.config();
  fmt::print("model            {} ({} weights, lm_head {}, SIMD {}, {} threads{})\n",
             c.architecture_name, model::WeightFormatName(lm.weights()),
             DTypeName(lm.weights().lm_head_matrix().dtype()), kernels::ActiveIsa(), m.threads_here,
             group.size() > 1
                 ? fmt::format(", --tp {}{} over {}, {} per rank", group.size(),
                               o.model.ep ? " --ep" : "", o.model.comm, m.threads_per_rank)
                 : std::string());
  fmt::print("bytes per token  {:.1f} MB\n", m.stats.bytes_per_token * 1e-6);
  fmt::print("bandwidth        {:.1f} GB/s (measured in this run)\n", m.bandwidth);
  fmt::print("roofline         {:.1f} tokens/s (one sequence)\n", m.roofline);
  fmt::print(
      "f32 FMA peak     {:.1f} GFLOP/s (measured in this run; prefill counts {:.2f} GFLOP "
      "per token)\n\n",
      m.fma_peak, m.prefill_flops_per_token * 1e-9);
  const engine::SpecConfig& spec = plan.config.spec;
  if (spec.enabled()) {
    fmt::print("speculative      {}{}\n", engine::SpecName(spec),
               spec.disable_batch_size > 0
                   ? fmt::format(" (paused above batch {})", spec.disable_batch_size)
                   : "");
  }
  const bool link = group.link() != nullptr;
  if (link) {
    fmt::print(
        "modelled link    {} (--comm-sim): per decode step, the link time of rank 0's "
        "collectives, what of it was exposed, and of that the all-to-all's\n",
        o.model.comm_sim);
  }
  // Ranks: the MB of weights rank 0 prefetched per decode step while waiting (#12).
  const bool ranks = group.size() > 1;
  fmt::print("{:>5} {:>6} {:>6} {:>12} {:>8} {:>9} {:>12} {:>10}{}{}{}\n", "batch", "input",
             "output", "prefill t/s", "of peak", "TPOT ms", "decode t/s", "roofline",
             link ? "   link ms  exposed  a2a exp." : "", ranks ? "  warm MB" : "",
             spec.enabled() ? "  accept.len  accepted per position" : "");
  for (const RunResult& r : runs) {
    std::string acceptance;
    if (spec.enabled()) {
      std::vector<std::string> rates;
      for (int64_t n : r.spec.accepted_per_pos) {
        rates.push_back(fmt::format(
            "{:.3f}", r.spec.num_drafts > 0 ? static_cast<double>(n) / r.spec.num_drafts : 0.0));
      }
      acceptance =
          fmt::format("  {:>10.2f}  {}", r.spec.mean_acceptance_length(), fmt::join(rates, " "));
    }
    const std::string link_columns = link ? fmt::format(" {:>9.3f} {:>8.3f} {:>9.3f}", r.link_ms,
                                                        r.link_exposed_ms, r.a2a_exposed_ms)
                                          : "";
    fmt::print("{:>5} {:>6} {:>6} {:>12.1f} {:>7.1f}% {:>9.2f} {:>12.1f} {:>9.1f}%{}{}{}\n",
               r.batch_size, r.input_len, r.output_len, r.prefill_tok_s,
               100.0 * r.prefill_peak_ratio, r.tpot_ms, r.decode_tok_s, 100.0 * r.roofline_ratio,
               link_columns, ranks ? fmt::format(" {:>8.2f}", r.warmed_mb) : "", acceptance);
  }
  // How batching scales the aggregate decode rate, when batch 1 was measured.
  const auto one =
      std::find_if(runs.begin(), runs.end(), [](const RunResult& r) { return r.batch_size == 1; });
  if (one != runs.end()) {
    for (const RunResult& r : runs) {
      if (r.batch_size == 1) continue;
      fmt::print("aggregate decode at batch {} = {:.2f}\u00d7 batch 1\n", r.batch_size,
                 r.decode_tok_s / one->decode_tok_s);
    }
  }
  if (o.ablation) {
    const auto [low, high] =
        std::minmax_element(ablation.baseline_runs.begin(), ablation.baseline_runs.end());
    fmt::print(
        "\nablation         batch {}, TPOT with each optimization off in turn, median of {} "
        "interleaved rounds (everything on: {:.2f}-{:.2f} ms over the rounds)\n",
        plan.batches.front(), o.ablation_rounds, *low, *high);
    fmt::print("{:<54} {:>9} {:>9}  {}\n", "optimization off", "TPOT ms", "change", "flag");
    fmt::print("{:<54} {:>9.2f} {:>9}\n", "(none: everything on)", ablation.baseline, "");
    for (const AblationRow& row : ablation.rows) {
      fmt::print("{:<54} {:>9.2f} {:>+8.1f}%  {}\n", row.optimization, row.tpot_ms, row.change_pct,
                 row.flag);
    }
    if (ablation.rows.empty()) {
      fmt::print("(no optimization of this configuration can be switched off)\n");
    }
  }
}

// What --json writes and --report charts.
nlohmann::ordered_json ResultsJson(const Options& o, const Plan& plan, const Ceilings& m,
                                   const model::ModelGroup& group,
                                   const std::vector<RunResult>& runs, const Ablation& ablation) {
  const model::CausalLm& lm = group.model();
  nlohmann::ordered_json j;
  j["model"] = lm.config().architecture_name;
  j["cpu"] = CpuModelName();
  j["isa"] = kernels::ActiveIsa();
  j["isas_available"] = kernels::AvailableIsas();
  j["weight_dtype"] = model::WeightFormatName(lm.weights());
  j["lm_head_dtype"] = DTypeName(lm.weights().lm_head_matrix().dtype());
  j["threads"] = m.threads_here;
  j["tp"] = group.size();
  j["ep"] = o.model.ep;
  j["comm"] = o.model.comm;
  j["comm_sim"] = o.model.comm_sim;
  j["mc2"] = !o.model.no_mc2;
  j["mc2_max_tokens"] = o.model.mc2_max_tokens;
  j["fused_allreduce_norm"] = !o.model.no_fused_allreduce_norm;
  j["shared_expert_overlap"] = !o.model.no_shared_expert_overlap;
  j["fused_gdn_step"] = !o.model.no_fused_gdn_step;
  j["weight_prefetch"] = !o.model.no_weight_prefetch;
  j["greedy_argmax"] = plan.config.greedy_argmax;
  j["bandwidth_gbs"] = m.bandwidth;
  j["fma_peak_gflops"] = m.fma_peak;
  j["bytes_per_token"] = m.stats.bytes_per_token;
  j["runs"] = nlohmann::ordered_json::array();
  for (const RunResult& r : runs) {
    j["runs"].push_back({{"batch_size", r.batch_size},
                         {"input_len", r.input_len},
                         {"output_len", r.output_len},
                         {"prefill_tok_s", r.prefill_tok_s},
                         {"prefill_gflops", r.prefill_gflops},
                         {"prefill_peak_ratio", r.prefill_peak_ratio},
                         {"tpot_ms", r.tpot_ms},
                         {"decode_tok_s", r.decode_tok_s},
                         {"roofline_tok_s", r.roofline_tok_s},
                         {"roofline_ratio", r.roofline_ratio},
                         {"link_ms_per_step", r.link_ms},
                         {"link_exposed_ms_per_step", r.link_exposed_ms},
                         {"a2a_exposed_ms_per_step", r.a2a_exposed_ms},
                         {"warmed_mb_per_step", r.warmed_mb},
                         {"spec",
                          {{"method", engine::SpecName(plan.config.spec)},
                           {"num_drafts", r.spec.num_drafts},
                           {"num_draft_tokens", r.spec.num_draft_tokens},
                           {"num_accepted_tokens", r.spec.num_accepted_tokens},
                           {"num_accepted_tokens_per_pos", r.spec.accepted_per_pos},
                           {"mean_acceptance_length", r.spec.mean_acceptance_length()}}}});
  }
  j["ablation"] = nlohmann::ordered_json::array();
  for (const AblationRow& row : ablation.rows) {
    j["ablation"].push_back({{"optimization", row.optimization},
                             {"flag", row.flag},
                             {"tpot_ms", row.tpot_ms},
                             {"change_pct", row.change_pct}});
  }
  if (o.ablation) j["ablation_baseline_tpot_ms"] = ablation.baseline_runs;
  return j;
}

// --json and --report, when given.
Status WriteResultFiles(const Options& o, const nlohmann::ordered_json& j) {
  if (!o.json_file.empty()) RETURN_IF_ERROR(WriteTextFile(o.json_file, j.dump(2) + "\n"));
  if (!o.report_file.empty()) {
    RETURN_IF_ERROR(WriteTextFile(o.report_file, RenderLatencyReport(j)));
    fmt::print("\nreport           {}\n", o.report_file);
  }
  return OkStatus();
}

// --turns: the conversation with the engine as configured and, when that caches prefixes, again
// without, turn by turn: prompt, cached tokens, TTFT of each.
int RunTurns(const Options& o, model::ModelGroup& group, const engine::EngineConfig& config,
             double roofline, double bandwidth) {
  std::vector<std::vector<TurnResult>> runs;
  std::vector<engine::EngineConfig> configs = {config};
  if (config.enable_prefix_caching) {
    configs.push_back(config);
    configs.back().enable_prefix_caching = false;
  }
  for (const engine::EngineConfig& c : configs) {
    Result<std::vector<TurnResult>> run =
        RunConversation(group, c, o.turns, o.input_len, o.output_len, o.seed);
    if (!run.ok()) return InputOrRuntimeError(kCommand, run.status());
    runs.push_back(std::move(*run));
  }
  const io::ModelConfig& c = group.model().config();
  fmt::print("model            {} (SIMD {}, {} threads)\n", c.architecture_name,
             kernels::ActiveIsa(), group.model().pool().num_threads());
  fmt::print("bandwidth        {:.1f} GB/s, roofline {:.1f} tokens/s (measured in this run)\n",
             bandwidth, roofline);
  fmt::print("conversation     {} turns, each +{} tokens in, {} out\n\n", o.turns, o.input_len,
             o.output_len);
  const bool compare = runs.size() == 2;
  fmt::print("{:>4} {:>7} {:>7} {:>12}{}\n", "turn", "prompt", "cached", "TTFT ms",
             compare ? fmt::format(" {:>16} {:>7}", "TTFT ms uncached", "ratio") : "");
  for (int64_t t = 0; t < o.turns; ++t) {
    const TurnResult& r = runs[0][t];
    fmt::print(
        "{:>4} {:>7} {:>7} {:>12.1f}{}\n", t + 1, r.prompt_tokens, r.cached_tokens, r.ttft_ms,
        compare
            ? fmt::format(" {:>16.1f} {:>7.3f}", runs[1][t].ttft_ms, r.ttft_ms / runs[1][t].ttft_ms)
            : "");
  }
  if (!o.json_file.empty()) {
    nlohmann::ordered_json j;
    j["model"] = c.architecture_name;
    j["bandwidth_gbs"] = bandwidth;
    j["turns"] = nlohmann::ordered_json::array();
    for (int64_t t = 0; t < o.turns; ++t) {
      nlohmann::ordered_json turn = {{"prompt_tokens", runs[0][t].prompt_tokens},
                                     {"cached_tokens", runs[0][t].cached_tokens},
                                     {"ttft_ms", runs[0][t].ttft_ms}};
      if (compare) turn["ttft_ms_uncached"] = runs[1][t].ttft_ms;
      j["turns"].push_back(turn);
    }
    if (Status s = WriteTextFile(o.json_file, j.dump(2) + "\n"); !s.ok()) {
      return RuntimeError(kCommand, s);
    }
  }
  return 0;
}

int Run(const Options& o) {
  Result<Plan> plan = CheckFlags(o);
  if (!plan.ok()) return UsageError(kCommand, plan.status());
  // The largest batch's engine is the most any run holds (one engine at a time).
  const int64_t largest = *std::max_element(plan->batches.begin(), plan->batches.end());
  if (std::optional<int> refused =
          CheckMemoryPlan(o.model, o.engine, ConfigFor(o, largest, plan->config), kCommand)) {
    return *refused;
  }
  LoadedModel loaded = LoadOrFollow(o.model, kCommand);
  if (loaded.group == nullptr) return loaded.exit_code;
  model::ModelGroup& group = *loaded.group;
  const int64_t max_positions = group.model().config().max_position_embeddings;
  if (plan->request_len > max_positions) {
    return UsageError(kCommand, InvalidArgument("input + output length exceeds the model's "
                                                "max_position_embeddings {}",
                                                max_positions));
  }
  plan->config.spec = engine::ResolveSpec(plan->config.spec, group.model().has_mtp());
  const Ceilings m = MeasureCeilings(o, group);
  if (o.turns > 1) {
    return RunTurns(o, group, ConfigFor(o, 1, plan->config), m.roofline, m.bandwidth);
  }
  Result<std::vector<RunResult>> runs = MeasureBatches(o, *plan, m, group);
  if (!runs.ok()) return InputOrRuntimeError(kCommand, runs.status());
  Ablation ablation;
  if (o.ablation) {
    Result<Ablation> measured = MeasureAblation(o, *plan, group);
    if (!measured.ok()) return InputOrRuntimeError(kCommand, measured.status());
    ablation = std::move(*measured);
  }
  PrintResults(o, *plan, m, group, *runs, ablation);
  if (!o.json_file.empty() || !o.report_file.empty()) {
    const nlohmann::ordered_json j = ResultsJson(o, *plan, m, group, *runs, ablation);
    if (Status s = WriteResultFiles(o, j); !s.ok()) return RuntimeError(kCommand, s);
  }
  return 0;
}

}  // namespace

int RunBenchLatency(const std::vector<std::string>& args) {
  Options o;
  FlagSet flags(
      "moeserve bench latency",
      "In-process engine prefill rate and decode TPOT at each batch size, with the\n"
      "memory-bandwidth roofline (weight bytes per token / read bandwidth) measured in\n"
      "the same run. --max-model-len defaults to --input-len + --output-len, --max-num-seqs\n"
      "to the batch size.");
  o.model.Register(flags);
  o.engine.Register(flags);
  flags.Int("input-len", &o.input_len, "prompt tokens (random ids)");
  flags.Int("output-len", &o.output_len, "generated tokens");
  flags.String("batch-size", &o.batch_size,
               "concurrent requests, a list allowed (1,4,8): one measured run each");
  flags.Int("seed", &o.seed, "seed of the random prompts");
  flags.String("json", &o.json_file, "also write the results as JSON to this file");
  flags.String("report", &o.report_file,
               "also write the results as one self-contained HTML page (charts: the ablation's "
               "waterfall, TPOT and decode tok/s against batch size with the roofline)");
  flags.Bool("ablation", &o.ablation,
             "also measure TPOT at the first batch size with each case-study optimization "
             "switched off in turn (table: optimization, TPOT, change %)");
  flags.Int("ablation-rounds", &o.ablation_rounds,
            "--ablation: rounds of interleaved runs; each configuration's TPOT is its median");
  flags.Int("turns", &o.turns,
            "> 1: a conversation of this many turns instead (each +input-len tokens in, "
            "output-len out, batch 1): TTFT per turn, with and without prefix caching");
  if (std::optional<int> exit_code = ParseFlags(flags, args, kCommand)) return *exit_code;
  o.max_num_seqs_given = flags.WasSet("max-num-seqs");
  return Run(o);
}

}  // namespace moeserve::cli
