#include "model/checkpoint_layout.h"

#include <gtest/gtest.h>

#include <set>

#include "io/model_config.h"
#include "io/safetensors.h"
#include "core/test_paths.h"

namespace moeserve::model {
namespace {

const std::string kTinyDir = MOESERVE_TESTDATA_DIR + "/tiny-qwen3next";

// The walk lists exactly the tensors of an independently made Qwen3-Next checkpoint: same
// names, same shapes, nothing missing, nothing extra.
TEST(CheckpointLayoutTest, MatchesTheIndependentTinyQwen3NextCheckpoint) {
  Result<io::ModelConfig> config = io::LoadModelConfig(kTinyDir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  Result<io::SafetensorsCheckpoint> checkpoint = io::SafetensorsCheckpoint::Open(kTinyDir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();

  std::set<std::string> listed;
  ForEachCheckpointTensor(*config, [&](const CheckpointTensor& t) {
    EXPECT_TRUE(listed.insert(t.name).second) << "listed twice: " << t.name;
    const io::SafetensorsTensor* stored = checkpoint->Find(t.name);
    ASSERT_NE(stored, nullptr) << t.name;
    EXPECT_EQ(stored->shape, t.shape) << t.name;
  });
  std::set<std::string> stored;
  for (const io::SafetensorsTensor* t : checkpoint->tensors()) stored.insert(t->name);
  EXPECT_EQ(listed, stored);

  Result<std::vector<ResolvedTensor>> resolved = ResolveCheckpoint(*config, *checkpoint);
  ASSERT_TRUE(resolved.ok()) << resolved.status().ToString();
  EXPECT_EQ(resolved->size(), stored.size());
}

// Parameter counts of the tiny Qwen3-Next shapes, by hand (H 256, vocab 512, 3 GDN + 1
// attention layers, 8 experts top-2 of width 128, shared expert 128, one MTP layer).
TEST(CheckpointLayoutTest, StatsEqualAHandComputation) {
  Result<io::ModelConfig> config = io::LoadModelConfig(kTinyDir);
  ASSERT_TRUE(config.ok());
  const int64_t H = 256, V = 512;
  const int64_t norms = 2 * H;  // input + post-attention layernorm of one layer
  // GDN: in_proj_qkvz (2*128 + 2*256) x H, in_proj_ba 8 x H, conv 512 x 4, dt_bias 4, A_log 4,
  // norm 64, out_proj H x 256.
  const int64_t gdn = 768 * H + 8 * H + 512 * 4 + 4 + 4 + 64 + H * 256;
  // Attention: q_proj (4 heads x 64 x 2 for the gate) x H, k/v 128 x H, o_proj H x 256, q/k norm.
  const int64_t attn = 512 * H + 2 * 128 * H + H * 256 + 2 * 64;
  const int64_t expert = 3 * 128 * H;
  const int64_t router = 8 * H, shared = 3 * 128 * H + H;  // + shared_expert_gate
  const int64_t moe_total = router + 8 * expert + shared;
  const int64_t moe_active = router + 2 * expert + shared;
  const int64_t total = 2 * V * H + H + 4 * norms + 3 * gdn + attn + 4 * moe_total;
  const int64_t active = 2 * V * H + H + 4 * norms + 3 * gdn + attn + 4 * moe_active;
  const int64_t mtp = H * 2 * H + 2 * H + norms + attn + moe_total + H;
  EXPECT_EQ(total, 4873816);
  EXPECT_EQ(total + mtp, 6155480);  // "6.2 M-parameter" says the golden's README

  const ModelStats stats =
      ComputeModelStats(*config, [](const CheckpointTensor&) { return size_t{2}; });
  EXPECT_EQ(stats.params_total, total);
  EXPECT_EQ(stats.params_active, active);
  EXPECT_EQ(stats.params_mtp, mtp);
  // One embedding row instead of the table.
  EXPECT_EQ(stats.bytes_per_token, 2 * (active - V * H + H));
}

TEST(CheckpointLayoutTest, MissingAndMisshapenTensorsAreNamed) {
  Result<io::ModelConfig> config = io::LoadModelConfig(kTinyDir);
  ASSERT_TRUE(config.ok());
  Result<io::SafetensorsCheckpoint> checkpoint = io::SafetensorsCheckpoint::Open(kTinyDir);
  ASSERT_TRUE(checkpoint.ok());

  io::ModelConfig more_experts = *config;
  more_experts.num_experts = 9;
  Result<std::vector<ResolvedTensor>> r = ResolveCheckpoint(more_experts, *checkpoint);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("model.layers.0.mlp.gate.weight"), std::string::npos)
      << r.status().message();

  io::ModelConfig wider = *config;
  wider.hidden_size = 128;
  r = ResolveCheckpoint(wider, *checkpoint);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("model.embed_tokens.weight"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("[512, 256]"), std::string::npos) << r.status().message();
}

TEST(CheckpointLayoutTest, Qwen35UsesSplitProjectionsFusedExpertsAndLanguageModelPrefix) {
  Result<io::ModelConfig> config = io::LoadModelConfig(kTinyDir);
  ASSERT_TRUE(config.ok());
  io::ModelConfig c = *config;
  c.architecture = io::Architecture::kQwen3_5Moe;
  c.architecture_name = "Qwen3_5MoeForConditionalGeneration";
  std::map<std::string, std::vector<int64_t>> shapes;
  ForEachCheckpointTensor(c, [&](const CheckpointTensor& t) { shapes[t.name] = t.shape; });
  const std::string p = "model.language_model.layers.0.";
  EXPECT_EQ(shapes.at(p + "linear_attn.in_proj_qkv.weight"), (std::vector<int64_t>{512, 256}));
  EXPECT_EQ(shapes.at(p + "linear_attn.in_proj_z.weight"), (std::vector<int64_t>{256, 256}));
  EXPECT_EQ(shapes.at(p + "linear_attn.in_proj_b.weight"), (std::vector<int64_t>{4, 256}));
  EXPECT_EQ(shapes.at(p + "linear_attn.in_proj_a.weight"), (std::vector<int64_t>{4, 256}));
  EXPECT_EQ(shapes.at(p + "mlp.experts.gate_up_proj"), (std::vector<int64_t>{8, 256, 256}));
  EXPECT_EQ(shapes.at(p + "mlp.experts.down_proj"), (std::vector<int64_t>{8, 256, 128}));
  EXPECT_EQ(shapes.count(p + "linear_attn.in_proj_qkvz.weight"), 0u);
  EXPECT_EQ(shapes.count("model.language_model.embed_tokens.weight"), 1u);
  EXPECT_EQ(shapes.count("lm_head.weight"), 1u);
  EXPECT_EQ(shapes.count("mtp.layers.0.mlp.experts.gate_up_proj"), 1u);

  // Same parameter counts as the per-expert Qwen3-Next layout of the same shapes.
  auto two = [](const CheckpointTensor&) { return size_t{2}; };
  const ModelStats next = ComputeModelStats(*config, two);
  const ModelStats q35 = ComputeModelStats(c, two);
  EXPECT_EQ(next.params_total, q35.params_total);
  EXPECT_EQ(next.params_active, q35.params_active);
  EXPECT_EQ(next.bytes_per_token, q35.bytes_per_token);
}

TEST(CheckpointLayoutTest, DenseAndTiedModels) {
  io::ModelConfig c;
  c.architecture = io::Architecture::kQwen3;
  c.architecture_name = "Qwen3ForCausalLM";
  c.vocab_size = 100;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.layer_types.assign(2, io::LayerType::kFullAttention);
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.intermediate_size = 32;
  c.qk_norm = true;
  c.tie_word_embeddings = true;
  std::set<std::string> names;
  ForEachCheckpointTensor(c, [&](const CheckpointTensor& t) { names.insert(t.name); });
  EXPECT_EQ(names.count("lm_head.weight"), 0u);
  EXPECT_EQ(names.count("model.layers.1.mlp.down_proj.weight"), 1u);
  EXPECT_EQ(names.count("model.layers.1.self_attn.q_norm.weight"), 1u);
  // embed 1600; per layer: norms 32, q 256, k 128, v 128, o 256, q/k norm 16, mlp 3*512.
  const ModelStats s = ComputeModelStats(c, [](const CheckpointTensor&) { return size_t{4}; });
  const int64_t layer = 32 + 256 + 128 + 128 + 256 + 16 + 3 * 512;
  EXPECT_EQ(s.params_total, 1600 + 16 + 2 * layer);
  EXPECT_EQ(s.params_active, s.params_total);
  EXPECT_EQ(s.bytes_per_token, 4 * (1600 + 16 + 2 * layer));  // tied: lm_head reads the table
}

}  // namespace
}  // namespace moeserve::model
