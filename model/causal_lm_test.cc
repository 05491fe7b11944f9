// The forward pass against independent goldens (testdata/tiny-qwen3next: llama.cpp in
// f32, cross-checked with a numpy f64 reference written from HF's modelling code).
#include "model/causal_lm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "model/arch/qwen3_next.h"
#include "model/checkpoint_layout.h"
#include "model/testing.h"
#include "core/test_paths.h"

namespace moeserve::model {
namespace {

using testing::Argmax;
using testing::RowRelError;

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kTinyDir = MOESERVE_TESTDATA_DIR + "/tiny-qwen3next";
constexpr int64_t kVocab = 512;

std::vector<float> ReadF32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

json Golden() {
  std::ifstream in(kTinyDir + "/golden.json");
  return json::parse(in);
}

// A single sequence with a shuffled block table, so paging is exercised.
struct Sequence {
  explicit Sequence(const io::ModelConfig& config, int64_t max_tokens = 256)
      : cache(config, CacheSizes{(max_tokens + 15) / 16 + 3, 16, 1}) {
    table.resize(cache.sizes().num_blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(7));
    cache.ResetSlot(0);
  }
  // Feeds tokens at the next positions; returns logits of the last (or every) token.
  std::vector<float> Feed(CausalLm& lm, const std::vector<int32_t>& tokens, bool all = false,
                          std::vector<float>* hidden = nullptr) {
    SequenceInput in{tokens.data(), static_cast<int64_t>(tokens.size()), pos, table.data(), 0};
    std::vector<float> logits;
    lm.Forward(in, cache, all, hidden, &logits);
    pos += static_cast<int64_t>(tokens.size());
    return logits;
  }
  ModelCache cache;
  std::vector<int32_t> table;
  int64_t pos = 0;
};

std::unique_ptr<CausalLm> LoadOrDie(const std::string& dir, LoadOptions options = {}) {
  Result<std::unique_ptr<CausalLm>> lm = CausalLm::Load(dir, options);
  EXPECT_TRUE(lm.ok()) << lm.status().ToString();
  return lm.ok() ? std::move(*lm) : nullptr;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

// Prompt logits at every position, then 16 greedy steps with their logits.
TEST_P(GoldenTest, LogitsAndGreedyContinuationMatch) {
  const json golden = Golden();
  const json* prompt = nullptr;
  for (const json& p : golden["prompts"]) {
    if (p["name"] == GetParam()) prompt = &p;
  }
  ASSERT_NE(prompt, nullptr);
  std::unique_ptr<CausalLm> lm = LoadOrDie(kTinyDir);
  ASSERT_NE(lm, nullptr);
  const std::vector<int32_t> tokens = (*prompt)["token_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> greedy = (*prompt)["greedy_continuation"].get<std::vector<int32_t>>();
  const std::vector<float> expected = ReadF32(kTinyDir + "/" + (*prompt)["logits_file"].get<std::string>());
  const std::vector<float> expected_next =
      ReadF32(kTinyDir + "/" + (*prompt)["continuation_logits_file"].get<std::string>());
  ASSERT_EQ(expected.size(), tokens.size() * kVocab);

  Sequence seq(lm->config());
  const std::vector<float> logits = seq.Feed(*lm, tokens, /*all=*/true);
  ASSERT_EQ(logits.size(), expected.size());
  double worst = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    worst = std::max(worst, RowRelError(&logits[t * kVocab], &expected[t * kVocab], kVocab));
  }
  EXPECT_LT(worst, 1e-4) << "prompt rows";
  RecordProperty("prompt_max_rel_error", std::to_string(worst));
  EXPECT_EQ(Argmax(&logits[(tokens.size() - 1) * kVocab], kVocab), greedy[0]);

  worst = 0;
  for (size_t j = 0; j < greedy.size(); ++j) {
    const std::vector<float> next = seq.Feed(*lm, {greedy[j]});
    worst = std::max(worst, RowRelError(next.data(), &expected_next[j * kVocab], kVocab));
    if (j + 1 < greedy.size()) {
      EXPECT_EQ(Argmax(next.data(), kVocab), greedy[j + 1]) << j;
    }
  }
  EXPECT_LT(worst, 1e-4) << "continuation rows";
  RecordProperty("continuation_max_rel_error", std::to_string(worst));
}

INSTANTIATE_TEST_SUITE_P(TinyQwen3Next, GoldenTest, ::testing::Values("prompt10", "prompt150"));

TEST(MtpGoldenTest, FirstPassAndChainMatch) {
  const json golden = Golden();
  const json& mtp = golden["mtp"][0];
  const json& prompt = golden["prompts"][0];
  ASSERT_EQ(mtp["prompt"], prompt["name"]);
  std::unique_ptr<CausalLm> lm = LoadOrDie(kTinyDir);
  ASSERT_NE(lm, nullptr);
  ASSERT_TRUE(lm->has_mtp());
  const std::vector<int32_t> tokens = prompt["token_ids"].get<std::vector<int32_t>>();
  Sequence seq(lm->config());
  std::vector<float> hidden;
  seq.Feed(*lm, tokens, false, &hidden);

  // First pass: (hidden at t, token t + 1) at position t for every prompt position.
  const std::vector<int32_t> next = mtp["input_token_ids"].get<std::vector<int32_t>>();
  const int64_t T = static_cast<int64_t>(next.size());
  std::vector<float> mtp_hidden, logits;
  lm->MtpForward(hidden.data(), next.data(), T, 0, seq.table.data(), seq.cache, &mtp_hidden,
                 &logits);
  const std::vector<float> expected = ReadF32(kTinyDir + "/" + mtp["logits_file"].get<std::string>());
  ASSERT_EQ(logits.size(), expected.size());
  double worst = 0;
  for (int64_t t = 0; t < T; ++t) {
    worst = std::max(worst, RowRelError(&logits[t * kVocab], &expected[t * kVocab], kVocab));
    EXPECT_EQ(Argmax(&logits[t * kVocab], kVocab), mtp["draft_argmax"][t].get<int32_t>()) << t;
  }
  EXPECT_LT(worst, 1e-4);

  // Chain: each draft token with the MTP head's own previous output, one position further.
  const json& chain = mtp["chain"];
  const std::vector<int32_t> drafts = chain["draft_tokens"].get<std::vector<int32_t>>();
  const std::vector<float> expected_chain =
      ReadF32(kTinyDir + "/" + chain["logits_file"].get<std::string>());
  const int64_t H = lm->config().hidden_size;
  std::vector<float> prev(mtp_hidden.end() - H, mtp_hidden.end());
  EXPECT_EQ(Argmax(&logits[(T - 1) * kVocab], kVocab), drafts[0]);
  for (int64_t s = 1; s < static_cast<int64_t>(drafts.size()); ++s) {
    std::vector<float> step_hidden, step_logits;
    lm->MtpForward(prev.data(), &drafts[s - 1], 1, T - 1 + s, seq.table.data(), seq.cache,
                   &step_hidden, &step_logits);
    EXPECT_LT(RowRelError(step_logits.data(), &expected_chain[(s - 1) * kVocab], kVocab), 1e-4);
    EXPECT_EQ(Argmax(step_logits.data(), kVocab), drafts[s]);
    prev = step_hidden;
  }
}

// Prefill of N tokens then decoding equals N single-token steps, and a prefill split into
// chunks of any size equals one prefill (up to the rounding of the chunked GDN form).
TEST(ForwardTest, PrefillSplitsAndStepsAgree) {
  std::unique_ptr<CausalLm> lm = LoadOrDie(kTinyDir);
  ASSERT_NE(lm, nullptr);
  const std::vector<int32_t> tokens =
      Golden()["prompts"][1]["token_ids"].get<std::vector<int32_t>>();  // 150 tokens
  Sequence whole(lm->config());
  const std::vector<float> all = whole.Feed(*lm, tokens, true);

  Sequence steps(lm->config());
  double worst = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::vector<float> row = steps.Feed(*lm, {tokens[t]});
    worst = std::max(worst, RowRelError(row.data(), &all[t * kVocab], kVocab));
  }
  EXPECT_LT(worst, 1e-5) << "steps vs prefill";

  for (int64_t chunk : {1, 7, 50, 64, 100}) {
    Sequence split(lm->config());
    std::vector<float> last;
    for (size_t t0 = 0; t0 < tokens.size(); t0 += chunk) {
      const size_t t1 = std::min(tokens.size(), t0 + chunk);
      last = split.Feed(*lm, std::vector<int32_t>(tokens.begin() + t0, tokens.begin() + t1));
    }
    EXPECT_LT(RowRelError(last.data(), &all[(tokens.size() - 1) * kVocab], kVocab), 1e-5)
        << "chunk " << chunk;
  }
}

// A verify run [x, d1, d2, d3] (TokenBatch::verify_slots) keeps the GDN state after each token
// in its own slot: the state after d1 -- as if d2 and d3 had been rejected -- equals, bit for
// bit, the state of a sequence that decoded x and d1 one step at a time and never saw d2 or d3;
// so do the logits of x and d1. The state the run started from is the slot after x.
TEST(ForwardTest, VerifyRunKeepsTheStateAfterEachToken) {
  std::unique_ptr<CausalLm> lm = LoadOrDie(kTinyDir);
  ASSERT_NE(lm, nullptr);
  const io::ModelConfig& c = lm->config();
  const std::vector<int32_t> prompt =
      Golden()["prompts"][1]["token_ids"].get<std::vector<int32_t>>();  // 150 tokens
  const std::vector<int32_t> run = {17, 250, 3, 99};
  const int64_t P = static_cast<int64_t>(prompt.size());
  // Two sequences in one cache: slot 0 decodes step by step; slot 1 verifies into slots 1..4.
  ModelCache cache(c, CacheSizes{40, 16, 5});
  std::vector<int32_t> table0(20), table1(20);
  std::iota(table0.begin(), table0.end(), 0);
  std::iota(table1.begin(), table1.end(), 20);
  cache.ResetSlot(0);
  cache.ResetSlot(1);
  lm->Forward({prompt.data(), P, 0, table0.data(), 0}, cache, false, nullptr, nullptr);
  lm->Forward({prompt.data(), P, 0, table1.data(), 1}, cache, false, nullptr, nullptr);

  std::vector<std::vector<float>> step_logits(2);
  for (int t = 0; t < 2; ++t) {
    lm->Forward({&run[t], 1, P + t, table0.data(), 0}, cache, false, nullptr, &step_logits[t]);
  }

  std::vector<int64_t> positions(4);
  std::iota(positions.begin(), positions.end(), P);
  const std::vector<int32_t> seq_of(4, 0), query_start = {0, 4}, slot = {1};
  const std::vector<int32_t> verify = {1, 2, 3, 4};
  const int32_t* tables[] = {table1.data()};
  const int32_t* verify_slots[] = {verify.data()};
  const TokenBatch batch{4, run.data(), positions.data(), seq_of.data(), 1, query_start.data(),
                         tables, slot.data(), verify_slots};
  const std::vector<int32_t> rows = {0, 1, 2, 3};
  lm->Reserve(4, 4);
  lm->ForwardBatch(batch, cache, rows.data(), 4);
  const int64_t V = c.vocab_size;
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(0, std::memcmp(lm->logits() + t * V, step_logits[t].data(), V * sizeof(float)))
        << "logits of verify token " << t;
  }
  const int64_t conv_floats = (c.linear_conv_kernel_dim - 1) * c.linear_conv_dim();
  const int64_t state_floats =
      c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
  int64_t gdn_layers = 0;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    if (c.layer_types[layer] != io::LayerType::kLinearAttention) continue;
    ++gdn_layers;
    // Slot 2: after x and d1. Slot 0 decoded exactly those.
    EXPECT_EQ(0, std::memcmp(cache.recurrent_state(layer, 2), cache.recurrent_state(layer, 0),
                             state_floats * sizeof(float)))
        << "recurrent state, layer " << layer;
    EXPECT_EQ(0, std::memcmp(cache.conv_state(layer, 2), cache.conv_state(layer, 0),
                             conv_floats * sizeof(float)))
        << "conv window, layer " << layer;
    // Later slots moved on: the run really wrote a state per token.
    EXPECT_NE(0, std::memcmp(cache.recurrent_state(layer, 4), cache.recurrent_state(layer, 2),
                             state_floats * sizeof(float)));
  }
  EXPECT_GT(gdn_layers, 0);
}

// ---- The same weights in other files: f32, and the Qwen3.5-MoE layout. ----

// Writes `dir` holding the tiny model's weights as `config` lays them out, in dtype.
void Resave(const io::ModelConfig& config, DType dtype, const std::string& dir) {
  Result<io::SafetensorsCheckpoint> source = io::SafetensorsCheckpoint::Open(kTinyDir);
  ASSERT_TRUE(source.ok());
  Result<io::ModelConfig> next_config = io::LoadModelConfig(kTinyDir);
  ASSERT_TRUE(next_config.ok());
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << io::ModelConfigToJson(config);

  // Qwen3.5 tensors from Qwen3-Next's: split projections (un-interleaved), fused experts.
  const std::vector<int64_t> qkvz = qwen3_next::QkvzSourceRows(*next_config);
  const std::vector<int64_t> ba = qwen3_next::BaSourceRows(*next_config);
  const int64_t key_dim = config.linear_key_dim(), value_dim = config.linear_value_dim();
  const int64_t nv = config.linear_num_value_heads, H = config.hidden_size;
  const int64_t I = config.moe_intermediate_size;
  auto source_f32 = [&](const std::string& name) {
    const io::SafetensorsTensor* t = source->Find(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<float> v(t->numel());
    ConvertToF32(t->dtype, t->bytes.data(), v.data(), v.size());
    return v;
  };
  auto rows_of = [&](const std::vector<float>& m, const std::vector<int64_t>& order, int64_t from,
                     int64_t count) {
    std::vector<float> out;
    for (int64_t i = from; i < from + count; ++i) {
      out.insert(out.end(), m.begin() + order[i] * H, m.begin() + (order[i] + 1) * H);
    }
    return out;
  };
  std::vector<io::SafetensorsTensorSpec> specs;
  std::vector<std::vector<float>> values;
  ForEachCheckpointTensor(config, [&](const CheckpointTensor& t) {
    specs.push_back({t.name, dtype, t.shape});
    std::string next_name = t.name;
    const std::string lm_prefix = "model.language_model.";
    if (next_name.starts_with(lm_prefix)) next_name = "model." + next_name.substr(lm_prefix.size());
    const std::string base = next_name.substr(0, next_name.rfind(".in_proj") + 1);
    std::vector<float> v;
    switch (t.role) {
      case TensorRole::kGdnInProjQkv:
        v = rows_of(source_f32(base + "in_proj_qkvz.weight"), qkvz, 0, 2 * key_dim + value_dim);
        break;
      case TensorRole::kGdnInProjZ:
        v = rows_of(source_f32(base + "in_proj_qkvz.weight"), qkvz, 2 * key_dim + value_dim,
                    value_dim);
        break;
      case TensorRole::kGdnInProjB: v = rows_of(source_f32(base + "in_proj_ba.weight"), ba, 0, nv); break;
      case TensorRole::kGdnInProjA: v = rows_of(source_f32(base + "in_proj_ba.weight"), ba, nv, nv); break;
      case TensorRole::kExpertsGateUp:
      case TensorRole::kExpertsDown: {
        const std::string experts = next_name.substr(0, next_name.rfind("experts.") + 8);
        for (int64_t e = 0; e < t.shape[0]; ++e) {
          const std::string p = experts + std::to_string(e) + ".";
          for (const char* part : t.role == TensorRole::kExpertsGateUp
                                      ? std::vector<const char*>{"gate_proj", "up_proj"}
                                      : std::vector<const char*>{"down_proj"}) {
            const std::vector<float> m = source_f32(p + part + ".weight");
            v.insert(v.end(), m.begin(), m.end());
          }
        }
        (void)I;
        break;
      }
      default:
        v = source_f32(next_name);
    }
    values.push_back(std::move(v));
  });
  Status s = io::WriteSafetensorsCheckpoint(
      dir, specs,
      [&](size_t i, std::span<std::byte> out) {
        ASSERT_EQ(values[i].size() * DTypeSize(dtype), out.size()) << specs[i].name;
        ConvertFromF32(values[i].data(), dtype, out.data(), values[i].size());
      },
      uint64_t{1} << 40);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

std::vector<float> PromptLogits(CausalLm& lm) {
  const std::vector<int32_t> tokens =
      Golden()["prompts"][1]["token_ids"].get<std::vector<int32_t>>();
  Sequence seq(lm.config());
  std::vector<float> logits = seq.Feed(lm, tokens, true);
  for (int32_t t : {5, 77, 300}) {
    const std::vector<float> next = seq.Feed(lm, {t});
    logits.insert(logits.end(), next.begin(), next.end());
  }
  return logits;
}

TEST(ForwardTest, SameWeightsInF32AndInTheQwen35LayoutGiveIdenticalLogits) {
  std::unique_ptr<CausalLm> reference = LoadOrDie(kTinyDir);
  ASSERT_NE(reference, nullptr);
  const std::vector<float> expected = PromptLogits(*reference);
  const std::string tmp = (fs::temp_directory_path() / ("moeserve_resave_" + std::to_string(getpid()))).string();

  io::ModelConfig next = reference->config();
  Resave(next, DType::kF32, tmp + "/f32");
  std::unique_ptr<CausalLm> f32 = LoadOrDie(tmp + "/f32");
  ASSERT_NE(f32, nullptr);
  EXPECT_EQ(f32->weights().matrix_dtype, DType::kF32);
  EXPECT_EQ(PromptLogits(*f32), expected) << "f32 checkpoint";

  io::ModelConfig q35 = next;
  q35.architecture = io::Architecture::kQwen3_5Moe;
  q35.architecture_name = "Qwen3_5MoeForConditionalGeneration";
  q35.model_type = "qwen3_5_moe_text";
  Resave(q35, DType::kBF16, tmp + "/qwen3_5");
  const json written = json::parse(std::ifstream(tmp + "/qwen3_5/config.json"));
  EXPECT_TRUE(written.contains("text_config"));
  std::unique_ptr<CausalLm> q35_lm = LoadOrDie(tmp + "/qwen3_5");
  ASSERT_NE(q35_lm, nullptr);
  EXPECT_EQ(q35_lm->config().architecture, io::Architecture::kQwen3_5Moe);
  EXPECT_EQ(PromptLogits(*q35_lm), expected) << "Qwen3.5-MoE layout";
  fs::remove_all(tmp);
}

TEST(LoadTest, CorruptModelsAreRejectedNamingTheTensor) {
  const std::string tmp = (fs::temp_directory_path() / ("moeserve_corrupt_" + std::to_string(getpid()))).string();
  Result<io::ModelConfig> config = io::LoadModelConfig(kTinyDir);
  ASSERT_TRUE(config.ok());

  // A config that disagrees with the weights.
  fs::create_directories(tmp + "/wider");
  fs::copy_file(kTinyDir + "/model.safetensors", tmp + "/wider/model.safetensors");
  io::ModelConfig wider = *config;
  wider.moe_intermediate_size = 64;
  std::ofstream(tmp + "/wider/config.json") << io::ModelConfigToJson(wider);
  Result<std::unique_ptr<CausalLm>> lm = CausalLm::Load(tmp + "/wider", {});
  ASSERT_FALSE(lm.ok());
  EXPECT_NE(lm.status().message().find("model.layers.0.mlp.experts.0.gate_proj.weight"),
            std::string::npos) << lm.status().message();

  // A tensor missing, and one with a wrong shape: rewrite the checkpoint without / with it.
  Result<io::SafetensorsCheckpoint> source = io::SafetensorsCheckpoint::Open(kTinyDir);
  ASSERT_TRUE(source.ok());
  for (const std::string& variant : {std::string("missing"), std::string("misshapen")}) {
    const std::string dir = tmp + "/" + variant;
    fs::create_directories(dir);
    fs::copy_file(kTinyDir + "/config.json", dir + "/config.json");
    const std::string victim = "model.layers.2.linear_attn.in_proj_qkvz.weight";
    std::vector<io::SafetensorsTensorSpec> specs;
    std::vector<const io::SafetensorsTensor*> sources;
    for (const io::SafetensorsTensor* t : source->tensors()) {
      if (t->name == victim && variant == "missing") continue;
      std::vector<int64_t> shape = t->shape;
      if (t->name == victim) std::swap(shape[0], shape[1]);
      specs.push_back({t->name, t->dtype, shape});
      sources.push_back(t);
    }
    ASSERT_TRUE(io::WriteSafetensorsCheckpoint(
                    dir, specs,
                    [&](size_t i, std::span<std::byte> out) {
                      std::memcpy(out.data(), sources[i]->bytes.data(), out.size());
                    },
                    uint64_t{1} << 40)
                    .ok());
    lm = CausalLm::Load(dir, {});
    ASSERT_FALSE(lm.ok()) << variant;
    EXPECT_NE(lm.status().message().find(victim), std::string::npos) << lm.status().message();
  }
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace moeserve::model
