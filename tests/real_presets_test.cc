// make-model's real-shape presets through the binary: the published configurations in the
// config.json written, the real Qwen3 tokenizer and chat templates (rendered as Hugging Face's
// Jinja does, goldens in testdata/), a cut that generates, and bad command lines.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "tests/run_binary.h"
#include "core/test_paths.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using e2e::CommandResult;
using e2e::ReadFile;
using nlohmann::json;

// The published config.json values, typed in from the models' files (the sources are listed in
// cli/make_model.cc), not read from moeserve.
struct Published {
  const char* preset;
  const char* architecture;  // config.json "architectures"[0]
  int64_t vocab, hidden, layers, heads, kv_heads, head_dim;
  int64_t gdn_k_heads, gdn_v_heads, gdn_head_dim, conv_kernel;
  int64_t experts, top_k, expert_width, shared_expert_width, mtp_layers, max_positions;
  double rope_theta, partial_rotary_factor;
  const char* chat_goldens;  // testdata file with the chat template's renderings
};

const Published kPublished[] = {
    {"qwen3-30b-a3b",
     "Qwen3MoeForCausalLM",
     151936,
     2048,
     48,
     32,
     4,
     128,
     0,
     0,
     0,
     0,
     128,
     8,
     768,
     0,
     0,
     40960,
     1e6,
     1.0,
     "qwen3-tokenizer/chat_cases.jsonl"},
    {"qwen3.5-35b-a3b",
     "Qwen3_5MoeForConditionalGeneration",
     248320,
     2048,
     40,
     16,
     2,
     256,
     16,
     32,
     128,
     4,
     256,
     8,
     512,
     512,
     1,
     262144,
     1e7,
     0.25,
     "chat-templates/qwen3.5_cases.jsonl"},
    {"qwen3-next-80b-a3b",
     "Qwen3NextForCausalLM",
     151936,
     2048,
     48,
     16,
     2,
     256,
     16,
     32,
     128,
     4,
     512,
     10,
     512,
     512,
     1,
     262144,
     1e7,
     0.25,
     "qwen3-tokenizer/chat_cases.jsonl"},
};

// One JSON value per line.
std::vector<json> JsonLines(const std::string& text) {
  std::vector<json> values;
  size_t start = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1) {
    values.push_back(json::parse(text.substr(start, end - start)));
  }
  return values;
}

class RealPresetsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("moeserve_real_presets_{}_{}", getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  CommandResult Run(const std::string& args) { return e2e::RunMoeserve(args, dir_ / "err.txt"); }

  fs::path dir_;
};

TEST_F(RealPresetsTest, ConfigJsonHasThePublishedValues) {
  for (const Published& p : kPublished) {
    SCOPED_TRACE(p.preset);
    const fs::path out = dir_ / p.preset;
    const CommandResult made =
        Run(fmt::format("make-model --preset {} --no-weights --out {}", p.preset, out.string()));
    ASSERT_EQ(made.exit_code, 0) << made.err;
    for (const fs::directory_entry& e : fs::directory_iterator(out)) {
      EXPECT_NE(e.path().extension(), ".safetensors") << "--no-weights wrote " << e.path();
    }

    const json file = json::parse(ReadFile(out / "config.json"));
    EXPECT_EQ(file["architectures"][0], p.architecture);
    Result<io::ModelConfig> c = io::LoadModelConfig(out.string());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->vocab_size, p.vocab);
    EXPECT_EQ(c->hidden_size, p.hidden);
    EXPECT_EQ(c->num_hidden_layers, p.layers);
    EXPECT_EQ(c->num_attention_heads, p.heads);
    EXPECT_EQ(c->num_key_value_heads, p.kv_heads);
    EXPECT_EQ(c->head_dim, p.head_dim);
    EXPECT_EQ(c->num_experts, p.experts);
    EXPECT_EQ(c->num_experts_per_tok, p.top_k);
    EXPECT_EQ(c->moe_intermediate_size, p.expert_width);
    EXPECT_EQ(c->shared_expert_intermediate_size, p.shared_expert_width);
    EXPECT_EQ(c->num_mtp_layers, p.mtp_layers);
    EXPECT_EQ(c->max_position_embeddings, p.max_positions);
    EXPECT_EQ(c->rope_theta, p.rope_theta);
    EXPECT_EQ(c->partial_rotary_factor, p.partial_rotary_factor);
    EXPECT_EQ(c->rms_norm_eps, 1e-6);
    EXPECT_FALSE(c->tie_word_embeddings);
    EXPECT_TRUE(c->norm_topk_prob);
    if (p.gdn_k_heads > 0) {
      EXPECT_EQ(c->linear_num_key_heads, p.gdn_k_heads);
      EXPECT_EQ(c->linear_num_value_heads, p.gdn_v_heads);
      EXPECT_EQ(c->linear_key_head_dim, p.gdn_head_dim);
      EXPECT_EQ(c->linear_value_head_dim, p.gdn_head_dim);
      EXPECT_EQ(c->linear_conv_kernel_dim, p.conv_kernel);
      // Full attention every 4th layer: 3, 7, 11, ...
      EXPECT_EQ(c->num_layers_of(io::LayerType::kFullAttention), p.layers / 4);
      EXPECT_EQ(c->layer_types[3], io::LayerType::kFullAttention);
      EXPECT_EQ(c->layer_types[4], io::LayerType::kLinearAttention);
    } else {
      EXPECT_EQ(c->num_layers_of(io::LayerType::kFullAttention), p.layers);
    }
    // The Qwen3 tokenizer's <|endoftext|> and <|im_end|>.
    EXPECT_EQ(c->bos_token_id, 151643);
    EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>{151645});
    EXPECT_EQ(json::parse(ReadFile(out / "generation_config.json"))["eos_token_id"],
              json::parse("[151645, 151643]"));

    // The real tokenizer, byte for byte; the real chat template.
    EXPECT_TRUE(ReadFile(out / "tokenizer.json") ==
                ReadFile(MOESERVE_TESTDATA_DIR + "/qwen3-tokenizer/tokenizer.json"));
    const json tokenizer_config = json::parse(ReadFile(out / "tokenizer_config.json"));
    const json qwen3_config =
        json::parse(ReadFile(MOESERVE_TESTDATA_DIR + "/qwen3-tokenizer/tokenizer_config.json"));
    const bool qwen3_5 = std::string(p.preset) == "qwen3.5-35b-a3b";
    EXPECT_EQ(tokenizer_config["chat_template"],
              qwen3_5 ? ReadFile(MOESERVE_TESTDATA_DIR + "/chat-templates/qwen3.5.jinja")
                      : qwen3_config["chat_template"].get<std::string>());
    EXPECT_EQ(tokenizer_config["added_tokens_decoder"], qwen3_config["added_tokens_decoder"]);
  }
}

// chat and serve render with the folder's template: the renderings and token ids agree with
// Hugging Face's (qwen3-tokenizer/chat_cases.jsonl: transformers; qwen3.5_cases.jsonl: Jinja2
// set up as transformers, chat-templates/render_cases.py), and the ids decode back to the text.
// qwen3-next-80b-a3b writes the same files as qwen3-30b-a3b (ConfigJsonHasThePublishedValues).
TEST_F(RealPresetsTest, ChatTemplatesRenderAndTokenizeAsHuggingFace) {
  for (const Published& p : kPublished) {
    if (std::string(p.preset) == "qwen3-next-80b-a3b") continue;
    SCOPED_TRACE(p.preset);
    const fs::path out = dir_ / p.preset;
    ASSERT_EQ(
        Run(fmt::format("make-model --preset {} --no-weights --out {}", p.preset, out.string()))
            .exit_code,
        0);
    const std::string goldens = std::string(MOESERVE_TESTDATA_DIR + "/") + p.chat_goldens;
    const CommandResult r =
        Run(fmt::format("tokenize --model {} --chat-file {}", out.string(), goldens));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<json> expected = JsonLines(ReadFile(goldens)), got = JsonLines(r.out);
    ASSERT_EQ(got.size(), expected.size());
    ASSERT_GE(got.size(), 10u);
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE(expected[i]["id"].get<std::string>());
      EXPECT_EQ(got[i]["text"], expected[i]["rendered"]);
      if (expected[i].contains("ids")) {
        EXPECT_EQ(got[i]["ids"], expected[i]["ids"]);
      }
    }
    // The longest conversation's ids back to its text (special tokens kept).
    size_t longest = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i]["ids"].size() > got[longest]["ids"].size()) longest = i;
    }
    const std::vector<int64_t> ids = got[longest]["ids"];
    const CommandResult back = Run(
        fmt::format("detokenize --json --model {} --ids {}", out.string(), fmt::join(ids, ",")));
    ASSERT_EQ(back.exit_code, 0) << back.err;
    EXPECT_EQ(json::parse(back.out)["text"], got[longest]["text"]);
  }
}

// A cut of each (one layer, hidden 64, 4 experts: what --num-layers and friends are for) loads
// and generates with the real tokenizer; the overrides change only what they name.
TEST_F(RealPresetsTest, ACutGenerates) {
  for (const Published& p : kPublished) {
    SCOPED_TRACE(p.preset);
    const fs::path out = dir_ / p.preset;
    const CommandResult made =
        Run(fmt::format("make-model --preset {} --num-layers 1 --hidden-size 64 --num-experts 4 "
                        "--experts-per-token 2 --out {}",
                        p.preset, out.string()));
    ASSERT_EQ(made.exit_code, 0) << made.err;
    Result<io::ModelConfig> c = io::LoadModelConfig(out.string());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->num_hidden_layers, 1);
    EXPECT_EQ(c->hidden_size, 64);
    EXPECT_EQ(c->num_experts, 4);
    EXPECT_EQ(c->vocab_size, p.vocab);
    EXPECT_EQ(c->head_dim, p.head_dim);
    EXPECT_EQ(c->moe_intermediate_size, p.expert_width);
    EXPECT_EQ(c->num_mtp_layers, p.mtp_layers);

    const CommandResult r = Run(
        fmt::format("generate --json --model {} --prompt 'The capital of France is' --max-tokens 4 "
                    "--max-model-len 64",
                    out.string()));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json request = json::parse(r.out)["requests"][0];
    EXPECT_EQ(request["token_ids"].size(), 4u);
    EXPECT_EQ(request["num_prompt_tokens"], 5);  // "The| capital| of| France| is"
    for (const json& id : request["token_ids"]) EXPECT_LT(id.get<int64_t>(), p.vocab);
  }
}

TEST_F(RealPresetsTest, BadCommandLinesAreRefusedClearly) {
  struct Case {
    std::string args;
    std::string message;
  };
  const fs::path out = dir_ / "refused";
  const Case cases[] = {
      {"--preset qwen3-30b-a3b --arch qwen3_next",
       "--arch qwen3_next disagrees with --preset qwen3-30b-a3b, a qwen3_moe model"},
      {"--preset qwen3-next-80b-a3b --arch llama",
       "--arch llama disagrees with --preset qwen3-next-80b-a3b, a qwen3_next model"},
      {"--preset qwen3-31b-a3b",
       "--preset: 'qwen3-31b-a3b' is not one of tiny, small, bench, qwen3-30b-a3b, "
       "qwen3.5-35b-a3b, qwen3-next-80b-a3b"},
      // The vocabulary must cover the tokenizer's ids (151,669 of them).
      {"--preset qwen3-30b-a3b --vocab-size 151668",
       "--vocab-size 151668: the Qwen3 tokenizer of --preset qwen3-30b-a3b has ids up to "
       "151668, so the vocabulary must be at least 151669"},
      {"--preset qwen3.5-35b-a3b --vocab-size 512", "so the vocabulary must be at least 151669"},
      {"--preset qwen3-30b-a3b --mtp-layers 1", "--mtp-layers: qwen3_moe has no MTP head"},
      {"--preset qwen3-30b-a3b --shared-expert-intermediate-size 64",
       "--shared-expert-intermediate-size: qwen3_moe has no shared expert"},
      {"--preset qwen3-next-80b-a3b --num-layers 0", "--num-layers: must be positive"},
      {"--preset qwen3-next-80b-a3b --num-experts 4", "num_experts_per_tok (10) exceeds"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const CommandResult r =
        Run(fmt::format("make-model {} --no-weights --out {}", c.args, out.string()));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err.rfind("moeserve make-model: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(out)) << "a refused command wrote " << out;
  }
  // Agreeing --arch and the smallest vocabulary that covers the tokenizer are fine.
  const CommandResult ok = Run(fmt::format(
      "make-model --preset qwen3-30b-a3b --arch qwen3_moe --vocab-size 151669 --no-weights "
      "--out {}",
      out.string()));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

}  // namespace
}  // namespace moeserve
