// Runs the moeserve binary as a user would: make-model for every architecture, inspect on the
// result, and bad command lines.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/model_config.h"
#include "model/checkpoint_layout.h"

#include "tests/run_binary.h"
#include "core/test_paths.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using e2e::CommandResult;
using e2e::ReadFile;

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("moeserve_cli_test_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }

  // Runs `moeserve <args>`; args are passed through the shell as written.
  static CommandResult Run(const std::string& args) {
    return e2e::RunMoeserve(args, *dir_ / "stderr.txt");
  }

  static fs::path Dir(const std::string& name) { return *dir_ / name; }

  static fs::path* dir_;
};

fs::path* CliTest::dir_ = nullptr;

TEST_F(CliTest, MakeModelThenInspectEveryArchitecture) {
  for (const char* arch : {"qwen3_next", "qwen3_5_moe", "qwen3_moe", "qwen3", "llama"}) {
    SCOPED_TRACE(arch);
    const fs::path out = Dir(std::string("tiny_") + arch);
    CommandResult made = Run(fmt::format("make-model --arch {} --preset tiny --seed 1 --out {}",
                                         arch, out.string()));
    ASSERT_EQ(made.exit_code, 0) << made.err;
    for (const char* file : {"config.json", "model.safetensors", "tokenizer.json",
                             "tokenizer_config.json", "generation_config.json"}) {
      EXPECT_TRUE(fs::exists(out / file)) << file;
    }
    CommandResult inspected = Run("inspect --json --bandwidth 10 --model " + out.string());
    ASSERT_EQ(inspected.exit_code, 0) << inspected.err;
    const json j = json::parse(inspected.out);

    Result<io::ModelConfig> config = io::LoadModelConfig(out.string());
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    EXPECT_EQ(io::ArchitectureFlagName(config->architecture), arch);
    EXPECT_EQ(j["architecture"], config->architecture_name);
    EXPECT_EQ(j["layer_types"].size(), static_cast<size_t>(config->num_hidden_layers));
    const model::ModelStats stats = model::ComputeModelStats(
        *config, [](const model::CheckpointTensor&) { return size_t{2}; });
    EXPECT_EQ(j["params_total"], stats.params_total);
    EXPECT_EQ(j["params_active"], stats.params_active);
    EXPECT_EQ(j["bytes_per_token"], stats.bytes_per_token);
    EXPECT_DOUBLE_EQ(j["bandwidth_gbs"].get<double>(), 10.0);
    EXPECT_NEAR(j["roofline_tok_s"].get<double>(), 10e9 / stats.bytes_per_token, 1e-6);

    // The tokenizer's special tokens sit right after the BPE vocabulary, inside the model's.
    const json tok = json::parse(ReadFile(out / "tokenizer.json"));
    int64_t im_end = -1;
    for (const json& added : tok["added_tokens"]) {
      if (added["content"] == "<|im_end|>") im_end = added["id"];
    }
    EXPECT_EQ(config->eos_token_ids, std::vector<int64_t>{im_end});
    EXPECT_LT(im_end, config->vocab_size);
  }
}

// The tiny hybrid preset has the shapes of testdata/tiny-qwen3next: the hand
// computation of model/checkpoint_layout_test.cc applies.
TEST_F(CliTest, TinyQwen3NextCountsMatchTheHandComputation) {
  const fs::path out = Dir("tiny_counts");
  ASSERT_EQ(Run("make-model --arch qwen3_next --preset tiny --out " + out.string()).exit_code, 0);
  CommandResult r = Run("inspect --json --bandwidth 20 --model " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["params_total"], 4873816);
  EXPECT_EQ(j["params_active"], 2514520);
  EXPECT_EQ(j["params_mtp"], 1281664);
  EXPECT_EQ(j["bytes_per_token"], 2 * (2514520 - 512 * 256 + 256));
  // And the written folder has exactly the tensors of the independent golden checkpoint.
  const json mine = json::parse(ReadFile(out / "config.json"));
  EXPECT_EQ(mine["layer_types"],
            json::parse(ReadFile(MOESERVE_TESTDATA_DIR + "/tiny-qwen3next/config.json"))
                ["layer_types"]);
}

// inspect names the SIMD target the kernels run with; MOESERVE_ISA restricts it.
TEST_F(CliTest, InspectPrintsTheSimdTargetAndMoeserveIsaRestrictsIt) {
  const fs::path out = Dir("tiny_isa");
  ASSERT_EQ(Run("make-model --preset tiny --out " + out.string()).exit_code, 0);
  CommandResult r = Run("inspect --json --bandwidth 20 --model " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json best = json::parse(r.out);
  ASSERT_FALSE(best["isas_available"].empty());
  EXPECT_EQ(best["isa"], best["isas_available"][0]);
  const std::string worst = best["isas_available"].back();
  r = e2e::RunShell("MOESERVE_ISA=" + worst + " " + MOESERVE_BINARY + " inspect --bandwidth 20 --model " +
                   out.string(),
                    Dir("isa.err"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("SIMD             " + worst + " (this CPU and build: "), std::string::npos)
      << r.out;
}

TEST_F(CliTest, MakeModelIsDeterministicForASeed) {
  const fs::path a = Dir("seed_a"), b = Dir("seed_b"), c = Dir("seed_c");
  ASSERT_EQ(Run("make-model --preset tiny --seed 5 --out " + a.string()).exit_code, 0);
  ASSERT_EQ(Run("make-model --preset tiny --seed 5 --threads 1 --out " + b.string()).exit_code, 0);
  ASSERT_EQ(Run("make-model --preset tiny --seed 6 --out " + c.string()).exit_code, 0);
  for (const char* file : {"model.safetensors", "tokenizer.json", "config.json"}) {
    EXPECT_EQ(ReadFile(a / file), ReadFile(b / file)) << file;
  }
  EXPECT_NE(ReadFile(a / "model.safetensors"), ReadFile(c / "model.safetensors"));
}

TEST_F(CliTest, ShardedF32Model) {
  const fs::path out = Dir("sharded");
  CommandResult made = Run("make-model --arch qwen3_moe --preset tiny --dtype f32 "
                           "--max-shard-size 2 --out " + out.string());
  ASSERT_EQ(made.exit_code, 0) << made.err;
  EXPECT_TRUE(fs::exists(out / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));
  CommandResult r = Run("inspect --json --bandwidth 10 --model " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["bytes_per_token"].get<int64_t>() % 4, 0);
  EXPECT_EQ(j["weight_bytes"].get<int64_t>(), 4 * j["params_total"].get<int64_t>());
}

TEST_F(CliTest, SizeOverrides) {
  const fs::path out = Dir("override");
  CommandResult made = Run("make-model --arch qwen3_next --preset tiny --hidden-size 128 "
                           "--num-layers 8 --num-experts 4 --experts-per-token 1 "
                           "--vocab-size 300 --mtp-layers 0 --out " + out.string());
  ASSERT_EQ(made.exit_code, 0) << made.err;
  Result<io::ModelConfig> config = io::LoadModelConfig(out.string());
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->hidden_size, 128);
  EXPECT_EQ(config->num_hidden_layers, 8);
  EXPECT_EQ(config->num_layers_of(io::LayerType::kFullAttention), 2);
  EXPECT_EQ(config->num_experts, 4);
  EXPECT_EQ(config->num_experts_per_tok, 1);
  EXPECT_EQ(config->vocab_size, 300);
  EXPECT_EQ(config->num_mtp_layers, 0);
  EXPECT_EQ(Run("inspect --bandwidth 5 --model " + out.string()).exit_code, 0);
}

TEST_F(CliTest, HumanInspectOutputAndMeasuredBandwidth) {
  const fs::path out = Dir("human");
  ASSERT_EQ(Run("make-model --arch qwen3_5_moe --preset tiny --out " + out.string()).exit_code, 0);
  CommandResult r = Run("inspect --threads 1 --model " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Qwen3_5MoeForConditionalGeneration"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 x linear_attention, full_attention"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("measured read bandwidth"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("roofline decode"), std::string::npos) << r.out;
}

// Bad command lines: exit code 2 and one line naming the problem.
TEST_F(CliTest, BadCommandLinesExit2WithOneLine) {
  const fs::path out = Dir("bad");
  struct Case {
    std::string args;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"", "usage"},
      {"frobnicate", "unknown subcommand 'frobnicate'"},
      {"make-model --bogus", "unknown flag --bogus"},
      {"make-model --out", "--out needs a value"},
      {"make-model --seed abc --out " + out.string(), "--seed: 'abc' is not an integer"},
      {"make-model --arch gpt2 --out " + out.string(), "--arch: 'gpt2'"},
      {"make-model --preset huge --out " + out.string(), "--preset: 'huge'"},
      {"make-model --dtype f16 --out " + out.string(), "--dtype: 'f16'"},
      {"make-model --vocab-size 100 --out " + out.string(), "--vocab-size"},
      {"make-model --hidden-size 0 --out " + out.string(), "--hidden-size"},
      {"make-model --arch qwen3 --num-experts 4 --out " + out.string(), "--num-experts"},
      {"make-model --arch qwen3 --mtp-layers 1 --out " + out.string(), "--mtp-layers"},
      {"make-model --num-heads 3 --out " + out.string(), "num_key_value_heads"},
      {"make-model", "--out is required"},
      {"inspect --bandwidth fast", "--bandwidth: 'fast' is not a number"},
      {"inspect --bandwidth -1", "--bandwidth"},
      {"inspect extra", "unexpected argument 'extra'"},
  };
  for (const Case& c : cases) {
    CommandResult r = Run(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.err;
    if (c.args.empty()) continue;  // prints the usage text
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << c.args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << ": " << r.err;
  }
}

TEST_F(CliTest, RuntimeFailuresExit1NamingTheProblem) {
  CommandResult r = Run("inspect --bandwidth 1 --model /nonexistent/model");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/nonexistent/model"), std::string::npos) << r.err;

  // A folder whose weights do not match its config.json.
  const fs::path a = Dir("mismatch_a"), b = Dir("mismatch_b");
  ASSERT_EQ(Run("make-model --preset tiny --out " + a.string()).exit_code, 0);
  ASSERT_EQ(Run("make-model --preset tiny --hidden-size 128 --out " + b.string()).exit_code, 0);
  fs::copy_file(b / "config.json", a / "config.json", fs::copy_options::overwrite_existing);
  r = Run("inspect --bandwidth 1 --model " + a.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("model.embed_tokens.weight"), std::string::npos) << r.err;
}

// logits and generate on the independent tiny Qwen3-Next golden model.
TEST_F(CliTest, LogitsGenerateAndActivationDumpOnTheGoldenModel) {
  const std::string tiny = MOESERVE_TESTDATA_DIR + "/tiny-qwen3next";
  const json golden = json::parse(ReadFile(tiny + "/golden.json"));
  const json& prompt = golden["prompts"][0];
  std::string ids;
  for (const json& id : prompt["token_ids"]) ids += (ids.empty() ? "" : ",") + id.dump();
  const fs::path out = Dir("logits.f32"), dump = Dir("dump");

  CommandResult r = Run(fmt::format("logits --model {} --token-ids {} --all-positions --mtp "
                                    "--out {} --dump-activations {}",
                                    tiny, ids, out.string(), dump.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string mine = ReadFile(out), theirs = ReadFile(tiny + "/logits_prompt10.f32");
  ASSERT_EQ(mine.size(), theirs.size());
  const float* a = reinterpret_cast<const float*>(mine.data());
  const float* b = reinterpret_cast<const float*>(theirs.data());
  for (size_t i = 0; i < mine.size() / 4; ++i) EXPECT_NEAR(a[i], b[i], 1e-3) << i;
  EXPECT_EQ(ReadFile(out.string() + ".mtp").size(),
            ReadFile(tiny + "/logits_mtp_prompt10.f32").size());
  // The dump: an index line per intermediate and its file, [rows, cols] f32.
  const std::string index = ReadFile(dump / "index.jsonl");
  EXPECT_NE(index.find("\"file\": \"L00.input_norm.f32\""), std::string::npos) << index;
  EXPECT_NE(index.find("router_probs"), std::string::npos);
  EXPECT_NE(index.find("mtp.L04.attn_out.f32"), std::string::npos);
  EXPECT_EQ(ReadFile(dump / "L03.attn_out.f32").size(), 10u * 256u * 4u);

  r = Run(fmt::format("generate --model {} --token-ids {} --max-tokens 16 --ignore-eos --json",
                      tiny, ids));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json generated = json::parse(r.out)["requests"][0];
  EXPECT_EQ(generated["token_ids"], prompt["greedy_continuation"]);
  EXPECT_EQ(generated["finish_reason"], "length");
  EXPECT_EQ(generated["num_prompt_tokens"], 10);

  r = Run(fmt::format("bench latency --model {} --input-len 20 --output-len 5 --json {}", tiny,
                      Dir("bench.json").string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json bench = json::parse(ReadFile(Dir("bench.json")));
  EXPECT_GT(bench["bandwidth_gbs"].get<double>(), 0.0);
  EXPECT_GT(bench["runs"][0]["tpot_ms"].get<double>(), 0.0);
  EXPECT_GT(bench["runs"][0]["roofline_ratio"].get<double>(), 0.0);
  EXPECT_NE(r.out.find("roofline"), std::string::npos);
  // Packed weights, quantized at load: fewer bytes per token, int4 fewest.
  int64_t packed_bytes = bench["bytes_per_token"];
  for (const char* dtype : {"int8", "int4"}) {
    r = Run(fmt::format("bench latency --model {} --input-len 20 --output-len 5 --weight-dtype {} "
                        "--json {}",
                        tiny, dtype, Dir("packed.json").string()));
    ASSERT_EQ(r.exit_code, 0) << dtype << ": " << r.err;
    const json packed = json::parse(ReadFile(Dir("packed.json")));
    EXPECT_EQ(packed["weight_dtype"], dtype);
    EXPECT_LT(packed["bytes_per_token"].get<int64_t>(), packed_bytes) << dtype;
    packed_bytes = packed["bytes_per_token"];
  }

  for (const std::string& bad : {std::string("--token-ids 1,x"), std::string("--token-ids 512"),
                                 std::string("--token-ids 1 --weight-dtype f16"),
                                 std::string("--token-ids 1 --max-tokens 0")}) {
    r = Run(fmt::format("generate --model {} {}", tiny, bad));
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << bad << ": " << r.err;
  }
  r = Run("logits --model /nonexistent --token-ids 1 --out " + out.string());
  EXPECT_EQ(r.exit_code, 1);
}

// tokenize / detokenize with the real Qwen3 tokenizer (a folder with only tokenizer files), and
// the chat goldens through --chat-file.
// make-model --inflate-from: the default model with its experts 4x as wide computes the same
// function (cli/inflate_model.h): the same logits and MTP draft logits to float rounding, the same
// greedy text; bad factors and a model without experts are clear errors.
TEST_F(CliTest, AnInflatedModelComputesTheSameFunction) {
  const fs::path inflated = Dir("inflated");
  const std::string from = MOESERVE_DEFAULT_MODEL_DIR;
  CommandResult made = Run(fmt::format("make-model --inflate-from {} --inflate-factor 4 --out {}",
                                       from, inflated.string()));
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const json a = json::parse(ReadFile(fs::path(from) / "config.json"));
  const json b = json::parse(ReadFile(inflated / "config.json"));
  EXPECT_EQ(b["moe_intermediate_size"], 4 * a["moe_intermediate_size"].get<int>());
  EXPECT_EQ(ReadFile(inflated / "tokenizer.json"), ReadFile(fs::path(from) / "tokenizer.json"));

  auto logits = [&](const std::string& model, const std::string& name) {
    const fs::path out = Dir(name);
    CommandResult r = Run(fmt::format(
        "logits --model {} --token-ids 1,40,300,7,1200,55,9,610 --all-positions --mtp --out {}",
        model, out.string()));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<float> v;
    for (const fs::path& f : {out, fs::path(out.string() + ".mtp")}) {
      const std::string bytes = ReadFile(f);
      const size_t n = bytes.size() / sizeof(float);
      v.resize(v.size() + n);
      std::memcpy(v.data() + v.size() - n, bytes.data(), n * sizeof(float));
    }
    return v;
  };
  const std::vector<float> x = logits(from, "logits_a"), y = logits(inflated.string(), "logits_b");
  ASSERT_EQ(x.size(), y.size());
  ASSERT_GT(x.size(), 0u);
  float max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(x[i] - y[i]));
    max_abs = std::max(max_abs, std::abs(x[i]));
  }
  EXPECT_LT(max_diff, 1e-4f * max_abs) << "max |logit| " << max_abs;
  // A model that reads more: the experts are most of the default model's bytes.
  EXPECT_GT(fs::file_size(inflated / "model.safetensors"),
            2 * fs::file_size(fs::path(from) / "model.safetensors"));

  auto greedy = [&](const std::string& model) {
    CommandResult r = Run(fmt::format(
        "generate --model {} --prompt 'And God said' --max-tokens 24 --temperature 0 --spec mtp:2 "
        "--json",
        model));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? json::parse(r.out)["requests"][0]["token_ids"] : json();
  };
  EXPECT_EQ(greedy(from), greedy(inflated.string()));

  for (const char* bad : {"--inflate-factor 3", "--inflate-factor 1", "--inflate-factor 2048",
                          "--inflate-factor 2 --preset tiny"}) {
    CommandResult r = Run(
        fmt::format("make-model --inflate-from {} {} --out {}", from, bad, Dir("bad").string()));
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_NE(r.err.find("--"), std::string::npos) << r.err;
  }
  ASSERT_EQ(Run("make-model --arch qwen3 --preset tiny --out " + Dir("dense").string()).exit_code,
            0);
  CommandResult dense = Run(fmt::format("make-model --inflate-from {} --inflate-factor 2 --out {}",
                                        Dir("dense").string(), Dir("bad").string()));
  EXPECT_EQ(dense.exit_code, 2);
  EXPECT_NE(dense.err.find("without routed experts"), std::string::npos) << dense.err;
}

TEST_F(CliTest, TokenizeDetokenizeAndChatFile) {
  const std::string qwen = MOESERVE_TESTDATA_DIR + "/qwen3-tokenizer";
  CommandResult r = Run("tokenize --model " + qwen + " --text 'Hello world' --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["ids"], json::parse("[9707, 1879]"));
  r = Run("detokenize --model " + qwen + " --ids 151644,9707,1879,151645 --no-special");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Hello world\n");

  r = Run("tokenize --model " + qwen + " --chat-file " + qwen + "/chat_cases.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream got(r.out), want(ReadFile(qwen + "/chat_cases.jsonl"));
  std::string got_line, want_line;
  int cases = 0;
  while (std::getline(want, want_line)) {
    ASSERT_TRUE(std::getline(got, got_line)) << cases;
    const json g = json::parse(got_line), w = json::parse(want_line);
    EXPECT_EQ(g["text"], w["rendered"]) << w["id"];
    EXPECT_EQ(g["ids"], w["ids"]) << w["id"];
    ++cases;
  }
  EXPECT_EQ(cases, 15);
  r = Run("tokenize --model " + qwen + " --chat-template " + qwen +
          "/chat_template_qwen3_next_thinking.jinja --chat-file " + qwen +
          "/chat_cases_qwen3_next_thinking.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream got2(r.out), want2(ReadFile(qwen + "/chat_cases_qwen3_next_thinking.jsonl"));
  cases = 0;
  while (std::getline(want2, want_line) && std::getline(got2, got_line)) {
    EXPECT_EQ(json::parse(got_line)["ids"], json::parse(want_line)["ids"]);
    ++cases;
  }
  EXPECT_EQ(cases, 3);

  r = Run("tokenize --model /nonexistent --text hi");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("/nonexistent"), std::string::npos) << r.err;
  r = Run("detokenize --model " + qwen + " --ids 1,x");
  EXPECT_EQ(r.exit_code, 2) << r.err;
}

TEST_F(CliTest, HelpAndVersion) {
  CommandResult r = Run("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("make-model"), std::string::npos);
  EXPECT_NE(r.out.find("inspect"), std::string::npos);
  r = Run("make-model --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--mtp-layers"), std::string::npos);
  r = Run("--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("moeserve"), std::string::npos);
}

}  // namespace
}  // namespace moeserve
