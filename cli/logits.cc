// moeserve logits: runs token ids through the model and writes the logits (docs/cli.md).
#include <algorithm>
#include <cstdio>
#include <numeric>

#include "cli/activation_dump.h"
#include "cli/commands.h"
#include "cli/model_flags.h"

namespace moeserve::cli {
namespace {

constexpr char kCommand[] = "logits";

struct Options {
  ModelFlags model;
  std::string token_ids;
  std::string out;
  bool all_positions = false;
  bool mtp = false;
  std::string dump_activations;
};

int32_t Argmax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

// Returns the exit code: usage errors (flags, token ids) 2, runtime failures 1.
int Run(const Options& o) {
  if (o.token_ids.empty()) return UsageError(kCommand, InvalidArgument("--token-ids is required"));
  if (o.out.empty()) return UsageError(kCommand, InvalidArgument("--out is required"));
  if (Status s = o.model.Validate(); !s.ok()) return UsageError(kCommand, s);
  LoadedModel loaded = LoadOrFollow(o.model, kCommand);
  if (loaded.group == nullptr) return loaded.exit_code;
  model::ModelGroup& group = *loaded.group;
  model::CausalLm& lm = group.model();
  const io::ModelConfig& c = lm.config();
  Result<std::vector<int32_t>> parsed = ParseTokenIds(o.token_ids, c.vocab_size);
  if (!parsed.ok()) return UsageError(kCommand, parsed.status());
  const std::vector<int32_t>& tokens = *parsed;
  if (o.mtp && !lm.has_mtp()) {
    return UsageError(kCommand, InvalidArgument("--mtp: the model has no MTP head"));
  }
  Result<std::unique_ptr<ActivationDump>> attached =
      ActivationDump::AttachTo(lm, o.dump_activations);
  if (!attached.ok()) return RuntimeError(kCommand, attached.status());
  std::unique_ptr<ActivationDump> dump = std::move(*attached);

  const int64_t T = static_cast<int64_t>(tokens.size()), V = c.vocab_size;
  // One sequence through the group (every rank of --tp runs it on its shard): an identity block
  // table, state slot 0.
  model::CacheSizes sizes;
  sizes.num_blocks = (T + sizes.block_size - 1) / sizes.block_size;
  group.CreateCache(sizes);
  group.Reserve(T, T);
  group.ResetSlot(0);
  std::vector<int32_t> table(sizes.num_blocks), seq_of(T, 0),
      query_start{0, static_cast<int32_t>(T)};
  std::iota(table.begin(), table.end(), 0);
  std::vector<int64_t> positions(T);
  std::iota(positions.begin(), positions.end(), 0);
  const int32_t* tables[] = {table.data()};
  const int32_t slot = 0;
  const model::TokenBatch batch{T, tokens.data(),      positions.data(), seq_of.data(),
                                1, query_start.data(), tables,           &slot};
  std::vector<int32_t> rows;
  for (int64_t t = o.all_positions ? 0 : T - 1; t < T; ++t) rows.push_back(static_cast<int32_t>(t));
  const int64_t R = static_cast<int64_t>(rows.size());
  group.ForwardBatch(batch, rows.data(), R, model::LogitsMode::kFull);
  const std::vector<float> hidden(lm.hidden(), lm.hidden() + T * c.hidden_size);
  const std::vector<float> logits(lm.logits(), lm.logits() + R * V);
  Status s = WriteF32File(o.out, logits.data(), logits.size());
  if (!s.ok()) return RuntimeError(kCommand, s);

  if (o.mtp) {
    // The MTP first pass over every position: (hidden at t, token t + 1), the last row paired
    // with the greedy next token (docs/spec/model.md §3.h).
    std::vector<int32_t> next(tokens.begin() + 1, tokens.end());
    next.push_back(Argmax(logits.data() + logits.size() - V, V));
    if (dump) dump->set_prefix("mtp.");
    const model::TokenBatch mtp_batch{T, next.data(),        positions.data(), seq_of.data(),
                                      1, query_start.data(), tables,           &slot};
    group.MtpForwardBatch(mtp_batch, hidden.data(), rows.data(), R, model::LogitsMode::kFull);
    s = WriteF32File(o.out + ".mtp", lm.mtp_logits(), R * V);
    if (!s.ok()) return RuntimeError(kCommand, s);
  }
  if (dump && !dump->status().ok()) return RuntimeError(kCommand, dump->status());
  return 0;
}

}  // namespace

int RunLogits(const std::vector<std::string>& args) {
  Options o;
  FlagSet flags("moeserve logits",
                "Runs token ids through the model and writes the logits as raw little-endian f32,\n"
                "row-major [n_positions, vocab].");
  o.model.Register(flags);
  flags.String("token-ids", &o.token_ids, "comma-separated prompt token ids, e.g. 1,2,3");
  flags.String("out", &o.out, "output file");
  flags.Bool("all-positions", &o.all_positions, "logits of every position (default: the last)");
  flags.Bool("mtp", &o.mtp, "also write the MTP head's draft logits to OUT.mtp");
  flags.String("dump-activations", &o.dump_activations,
               "write named intermediates of every layer as raw f32 into this folder");
  if (std::optional<int> exit_code = ParseFlags(flags, args, kCommand)) return *exit_code;
  return Run(o);
}

}  // namespace moeserve::cli
