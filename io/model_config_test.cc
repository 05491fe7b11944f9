#include "io/model_config.h"
#include "core/test_paths.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace moeserve::io {
namespace {

using nlohmann::json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A Qwen3.5-35B-A3B style config (docs/spec/model.md §1.3), text keys under text_config.
constexpr char kQwen35Config[] = R"({
  "architectures": ["Qwen3_5MoeForConditionalGeneration"],
  "model_type": "qwen3_5_moe",
  "tie_word_embeddings": false,
  "text_config": {
    "model_type": "qwen3_5_moe_text",
    "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "attn_output_gate": true,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                        "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                        "mrope_interleaved": true},
    "max_position_embeddings": 262144,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": false,
    "mtp_num_hidden_layers": 1, "eos_token_id": 248044
  },
  "vision_config": {"depth": 27}
})";

constexpr char kQwen3MoeConfig[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
  "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
  "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
  "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
  "rope_theta": 1000000.0, "rope_scaling": null, "rms_norm_eps": 1e-06,
  "tie_word_embeddings": false, "bos_token_id": 151643, "eos_token_id": 151645,
  "torch_dtype": "bfloat16"
})";

constexpr char kQwen3Config[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
  "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
  "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
  "rope_theta": 1000000, "rms_norm_eps": 1e-06, "tie_word_embeddings": true,
  "eos_token_id": 151645
})";

constexpr char kLlamaConfig[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
  "num_hidden_layers": 32, "num_attention_heads": 32,
  "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "eos_token_id": [2, 3]
})";

TEST(ModelConfigTest, ParsesTinyQwen3NextGolden) {
  Result<ModelConfig> c = LoadModelConfig(MOESERVE_TESTDATA_DIR + "/tiny-qwen3next");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kQwen3Next);
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->hidden_size, 256);
  EXPECT_EQ(c->num_hidden_layers, 4);
  EXPECT_EQ(c->layer_types,
            (std::vector<LayerType>{LayerType::kLinearAttention, LayerType::kLinearAttention,
                                    LayerType::kLinearAttention, LayerType::kFullAttention}));
  EXPECT_EQ(c->num_attention_heads, 4);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->rotary_dim, 16);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e7);
  EXPECT_EQ(c->linear_num_key_heads, 2);
  EXPECT_EQ(c->linear_num_value_heads, 4);
  EXPECT_EQ(c->linear_conv_dim(), 2 * 2 * 64 + 4 * 64);
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->num_experts_per_tok, 2);
  EXPECT_EQ(c->moe_intermediate_size, 128);
  EXPECT_EQ(c->shared_expert_intermediate_size, 128);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_TRUE(c->one_centered_norm);
  EXPECT_TRUE(c->attn_output_gate);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->num_mtp_layers, 1);
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>{511});
  EXPECT_EQ(c->bos_token_id, 509);
  EXPECT_TRUE(c->IsMoeLayer(0));
}

TEST(ModelConfigTest, ParsesQwen35WithTextConfigAndRopeParameters) {
  Result<ModelConfig> c = ParseModelConfig(kQwen35Config);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kQwen3_5Moe);
  EXPECT_EQ(c->model_type, "qwen3_5_moe_text");
  EXPECT_EQ(c->vocab_size, 248320);
  EXPECT_EQ(c->num_hidden_layers, 40);
  EXPECT_EQ(c->num_layers_of(LayerType::kFullAttention), 10);
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(c->layer_types[i],
              i % 4 == 3 ? LayerType::kFullAttention : LayerType::kLinearAttention);
  }
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e7);
  EXPECT_DOUBLE_EQ(c->partial_rotary_factor, 0.25);
  EXPECT_EQ(c->rotary_dim, 64);
  EXPECT_EQ(c->num_experts, 256);
  EXPECT_EQ(c->num_mtp_layers, 1);
  EXPECT_TRUE(c->norm_topk_prob);  // Qwen3.5 always renormalises
  EXPECT_EQ(c->max_position_embeddings, 262144);
  EXPECT_TRUE(c->IsMoeLayer(39));
}

TEST(ModelConfigTest, ParsesQwen35CausalLmAtTopLevel) {
  json j = json::parse(kQwen35Config)["text_config"];
  j["architectures"] = {"Qwen3_5MoeForCausalLM"};
  Result<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kQwen3_5Moe);
  EXPECT_EQ(c->architecture_name, "Qwen3_5MoeForCausalLM");
  EXPECT_EQ(c->hidden_size, 2048);
}

TEST(ModelConfigTest, ParsesQwen3Moe) {
  Result<ModelConfig> c = ParseModelConfig(kQwen3MoeConfig);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kQwen3Moe);
  EXPECT_EQ(c->num_layers_of(LayerType::kFullAttention), 48);
  EXPECT_EQ(c->rotary_dim, 128);
  EXPECT_FALSE(c->one_centered_norm);
  EXPECT_FALSE(c->attn_output_gate);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->shared_expert_intermediate_size, 0);
  EXPECT_EQ(c->num_mtp_layers, 0);
  EXPECT_TRUE(c->IsMoeLayer(0));
}

TEST(ModelConfigTest, Qwen3MoeDenseLayersFromSparseStepAndMlpOnlyLayers) {
  json j = json::parse(kQwen3MoeConfig);
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  Result<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->IsMoeLayer(0));
  EXPECT_TRUE(c->IsMoeLayer(1));
  EXPECT_FALSE(c->IsMoeLayer(2));
  EXPECT_FALSE(c->IsMoeLayer(3));  // in mlp_only_layers
  EXPECT_TRUE(c->IsMoeLayer(5));
}

TEST(ModelConfigTest, Qwen3MoeNormTopkDefaultsToFalseLikeHf) {
  json j = json::parse(kQwen3MoeConfig);
  j.erase("norm_topk_prob");
  Result<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->norm_topk_prob);
}

TEST(ModelConfigTest, ParsesQwen3Dense) {
  Result<ModelConfig> c = ParseModelConfig(kQwen3Config);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kQwen3);
  EXPECT_EQ(c->num_experts, 0);
  EXPECT_EQ(c->intermediate_size, 3072);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->IsMoeLayer(0));
  EXPECT_EQ(c->bos_token_id, -1);
}

TEST(ModelConfigTest, ParsesLlamaWithDerivedHeadDim) {
  Result<ModelConfig> c = ParseModelConfig(kLlamaConfig);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kLlama);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_key_value_heads, 32);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{2, 3}));
}

TEST(ModelConfigTest, ArchitectureFromModelTypeWhenArchitecturesAbsent) {
  json j = json::parse(kQwen3Config);
  j.erase("architectures");
  Result<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kQwen3);
}

TEST(ModelConfigTest, ExplicitLayerTypesWin) {
  json j = json::parse(ReadFile(MOESERVE_TESTDATA_DIR + "/tiny-qwen3next/config.json"));
  j["layer_types"] = {"full_attention", "linear_attention", "linear_attention", "full_attention"};
  Result<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->layer_types[0], LayerType::kFullAttention);
  EXPECT_EQ(c->layer_types[1], LayerType::kLinearAttention);
}

// Each malformed config is rejected with a message naming the problem.
struct BadConfigCase {
  const char* name;
  std::function<void(json&)> edit;
  const char* expected_in_message;
};

TEST(ModelConfigTest, RejectsMalformedConfigsNamingTheProblem) {
  const json base =
      json::parse(ReadFile(MOESERVE_TESTDATA_DIR + "/tiny-qwen3next/config.json"));
  const std::vector<BadConfigCase> cases = {
      {"unknown architecture", [](json& j) { j["architectures"] = {"GPT2LMHeadModel"}; },
       "GPT2LMHeadModel"},
      {"architectures not a list", [](json& j) { j["architectures"] = 7; }, "architectures"},
      {"missing hidden_size", [](json& j) { j.erase("hidden_size"); }, "hidden_size"},
      {"missing vocab_size", [](json& j) { j.erase("vocab_size"); }, "vocab_size"},
      {"missing num_experts", [](json& j) { j.erase("num_experts"); }, "num_experts"},
      {"missing linear heads", [](json& j) { j.erase("linear_num_value_heads"); },
       "linear_num_value_heads"},
      {"hidden_size is a string", [](json& j) { j["hidden_size"] = "256"; }, "hidden_size"},
      {"hidden_size is a float", [](json& j) { j["hidden_size"] = 256.5; }, "hidden_size"},
      {"negative layers", [](json& j) { j["num_hidden_layers"] = -1; }, "num_hidden_layers"},
      {"zero hidden", [](json& j) { j["hidden_size"] = 0; }, "hidden_size"},
      {"rope_theta a string", [](json& j) { j["rope_theta"] = "big"; }, "rope_theta"},
      {"tie not bool", [](json& j) { j["tie_word_embeddings"] = "no"; }, "tie_word_embeddings"},
      {"layer_types too short", [](json& j) { j["layer_types"] = {"full_attention"}; },
       "layer_types"},
      {"layer_types unknown value", [](json& j) { j["layer_types"][0] = "sliding"; }, "sliding"},
      {"heads not divisible", [](json& j) { j["num_key_value_heads"] = 3; },
       "num_key_value_heads"},
      {"top-k above experts", [](json& j) { j["num_experts_per_tok"] = 9; },
       "num_experts_per_tok"},
      {"gdn heads not divisible", [](json& j) { j["linear_num_value_heads"] = 3; },
       "linear_num_value_heads"},
      {"eos outside vocab", [](json& j) { j["eos_token_id"] = 512; }, "eos_token_id"},
      {"partial rotary zero", [](json& j) { j["partial_rotary_factor"] = 0.0; },
       "partial_rotary_factor"},
      {"mlp_only_layers not a list", [](json& j) { j["mlp_only_layers"] = 3; },
       "mlp_only_layers"},
      {"rope_scaling not an object", [](json& j) { j["rope_scaling"] = 2; }, "rope_scaling"},
      // Found by model_config_fuzzer: a division by zero (SIGFPE) before the check.
      {"decoder_sparse_step zero", [](json& j) { j["decoder_sparse_step"] = 0; },
       "decoder_sparse_step"},
      {"decoder_sparse_step negative", [](json& j) { j["decoder_sparse_step"] = -2; },
       "decoder_sparse_step"},
  };
  for (const BadConfigCase& bad : cases) {
    json j = base;
    bad.edit(j);
    Result<ModelConfig> c = ParseModelConfig(j.dump());
    ASSERT_FALSE(c.ok()) << bad.name;
    EXPECT_NE(c.status().message().find(bad.expected_in_message), std::string::npos)
        << bad.name << ": " << c.status().message();
  }
}

TEST(ModelConfigTest, RejectsNonJsonAndNonObject) {
  EXPECT_FALSE(ParseModelConfig("{\"vocab_size\": ").ok());
  // Nested past the JSON reader's limit: refused before it is parsed (core/json.h).
  Result<ModelConfig> deep = ParseModelConfig(std::string(5000, '[') + std::string(5000, ']'));
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("config.json: nests deeper than 128 levels"),
            std::string::npos)
      << deep.status().message();
  EXPECT_FALSE(ParseModelConfig("[1, 2]").ok());
  Result<ModelConfig> c = ParseModelConfig("");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("JSON"), std::string::npos);
}

TEST(ModelConfigTest, MissingFileNamesThePath) {
  Result<ModelConfig> c = LoadModelConfig("/nonexistent/model");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/nonexistent/model/config.json"), std::string::npos);
}

TEST(ModelConfigTest, QwenDenseRequiresIntermediateSize) {
  json j = json::parse(kQwen3Config);
  j.erase("intermediate_size");
  Result<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("intermediate_size"), std::string::npos);
}

void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.architecture_name, b.architecture_name);
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.layer_types, b.layer_types);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rotary_dim, b.rotary_dim);
  EXPECT_DOUBLE_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.attn_output_gate, b.attn_output_gate);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.linear_num_key_heads, b.linear_num_key_heads);
  EXPECT_EQ(a.linear_num_value_heads, b.linear_num_value_heads);
  EXPECT_EQ(a.linear_key_head_dim, b.linear_key_head_dim);
  EXPECT_EQ(a.linear_value_head_dim, b.linear_value_head_dim);
  EXPECT_EQ(a.linear_conv_kernel_dim, b.linear_conv_kernel_dim);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.num_experts_per_tok, b.num_experts_per_tok);
  EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
  EXPECT_EQ(a.shared_expert_intermediate_size, b.shared_expert_intermediate_size);
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
  EXPECT_EQ(a.one_centered_norm, b.one_centered_norm);
  EXPECT_DOUBLE_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.num_mtp_layers, b.num_mtp_layers);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
}

TEST(ModelConfigTest, ToJsonRoundTripsEveryArchitecture) {
  std::vector<std::string> texts = {kQwen35Config, kQwen3MoeConfig, kQwen3Config, kLlamaConfig,
                                    ReadFile(MOESERVE_TESTDATA_DIR + "/tiny-qwen3next/config.json")};
  json causal = json::parse(kQwen35Config)["text_config"];
  causal["architectures"] = {"Qwen3_5MoeForCausalLM"};
  texts.push_back(causal.dump());
  for (const std::string& text : texts) {
    Result<ModelConfig> a = ParseModelConfig(text);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    const std::string written = ModelConfigToJson(*a);
    Result<ModelConfig> b = ParseModelConfig(written);
    ASSERT_TRUE(b.ok()) << b.status().ToString() << "\n" << written;
    SCOPED_TRACE(a->architecture_name);
    ExpectSameConfig(*a, *b);
  }
  // Qwen3.5 ConditionalGeneration keeps its layout: text_config + rope_parameters.
  const json written = json::parse(ModelConfigToJson(*ParseModelConfig(kQwen35Config)));
  ASSERT_TRUE(written.contains("text_config"));
  EXPECT_TRUE(written["text_config"].contains("rope_parameters"));
  EXPECT_FALSE(written.contains("hidden_size"));
}

TEST(ModelConfigTest, ArchitectureNames) {
  Architecture arch;
  for (const char* name : {"qwen3_next", "qwen3_5_moe", "qwen3_moe", "qwen3", "llama"}) {
    ASSERT_TRUE(ParseArchitectureFlagName(name, &arch)) << name;
    EXPECT_EQ(ArchitectureFlagName(arch), name);
  }
  EXPECT_FALSE(ParseArchitectureFlagName("gpt2", &arch));
}

}  // namespace
}  // namespace moeserve::io
