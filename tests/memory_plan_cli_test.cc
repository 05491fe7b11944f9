// The memory plan through the binary: a Qwen3-Next-80B-A3B folder with config.json alone (160 GB
// of bf16 weights it does not have) is refused by generate, serve, chat and bench latency before
// anything loads, with the plan in the message; inspect prints the plan.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/memory_info.h"
#include "tests/run_binary.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using e2e::CommandResult;
using nlohmann::json;

class MemoryPlanCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / fmt::format("moeserve_plan_{}", getpid()));
    fs::create_directories(*dir_);
    const CommandResult made = Run(fmt::format(
        "make-model --preset qwen3-next-80b-a3b --no-weights --out {}", Model().string()));
    ASSERT_EQ(made.exit_code, 0) << made.err;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override {
    // 152 GiB of bf16 weights: refused on any machine with less memory available.
    if (AvailableMemoryBytes() > (int64_t{150} << 30)) GTEST_SKIP() << "this machine fits it";
  }

  static CommandResult Run(const std::string& args) {
    return e2e::RunMoeserve(args, *dir_ / "stderr.txt");
  }
  static fs::path Model() { return *dir_ / "qwen3-next-80b-a3b"; }

  static fs::path* dir_;
};

fs::path* MemoryPlanCliTest::dir_ = nullptr;

TEST_F(MemoryPlanCliTest, RunsThatDoNotFitAreRefusedBeforeLoading) {
  const std::string model = "--model " + Model().string();
  const std::string commands[] = {
      "generate " + model + " --prompt hi --max-model-len 4096",
      "serve " + model + " --port 0 --max-model-len 4096",
      "chat " + model + " --max-model-len 4096 </dev/null",
      "bench latency " + model + " --input-len 8 --output-len 4 --batch-size 1,2",
  };
  for (const std::string& command : commands) {
    SCOPED_TRACE(command);
    const CommandResult r = Run(command);
    EXPECT_EQ(r.exit_code, 1);
    const std::string name = command.substr(0, command.find(" --model"));
    EXPECT_EQ(r.err.rfind("moeserve " + name + ": the run does not fit in memory: it needs ", 0),
              0u)
        << r.err;
    for (const char* part : {"nothing was loaded", "--ignore-memory-plan",
                             "memory plan: weights "
                             "at bf16",
                             "\n    experts  ", "\n  KV cache", "\n  GDN state slots", "\n  total",
                             "does not fit (short by"}) {
      EXPECT_NE(r.err.find(part), std::string::npos) << part << "\n" << r.err;
    }
    // The folder has no weights: a load would have said so.
    EXPECT_EQ(r.err.find("safetensors"), std::string::npos) << r.err;
  }
}

// --ignore-memory-plan goes on to the load (which here finds no weights to load).
TEST_F(MemoryPlanCliTest, IgnoreMemoryPlanLoadsAnyway) {
  const CommandResult r =
      Run(fmt::format("generate --model {} --prompt hi --max-model-len 4096 --ignore-memory-plan",
                      Model().string()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--ignore-memory-plan: loading although the run does not fit"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("contains neither model.safetensors.index.json nor model.safetensors"),
            std::string::npos)
      << r.err;
}

// What the engine would refuse after loading is refused before, as the same usage error.
TEST_F(MemoryPlanCliTest, FlagsTheEngineRefusesAreUsageErrorsBeforeLoading) {
  const CommandResult r = Run(fmt::format("generate --model {} --prompt hi", Model().string()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("moeserve generate: the KV cache (5041 blocks, 4.000 GiB) cannot hold "
                       "one request of --max-model-len 262144"),
            std::string::npos)
      << r.err;
}

TEST_F(MemoryPlanCliTest, InspectPrintsThePlan) {
  const std::string model = "--model " + Model().string();
  CommandResult r = Run("inspect --bandwidth 10 --weight-dtype int4 --max-model-len 8192 " + model);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* part :
       {"weights          none in the folder (config.json only; bfloat16 assumed)",
        "memory plan: weights at int4, --max-model-len 8192, --max-num-seqs 64",
        "int4 projections and experts; embedding and routers bf16; lm_head int8", "\n  total",
        "\n  available"}) {
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
  }

  r = Run("inspect --json --bandwidth 10 --max-model-len 8192 --max-num-seqs 4 " + model);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json bf16_run = json::parse(r.out);
  const json& bf16 = bf16_run["memory_plan"];
  r =
      Run("inspect --json --bandwidth 10 --max-model-len 8192 --max-num-seqs 4 "
          "--weight-dtype int4 " +
          model);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json int4_run = json::parse(r.out);
  const json& int4 = int4_run["memory_plan"];
  // Bytes per decoded token (the roofline's) as the weights will be held: int4's active
  // matrices at 4.5 bits and lm_head at 8, against 16 bits as stored.
  const int64_t bf16_per_token = bf16_run["bytes_per_token"];
  const int64_t int4_per_token = int4_run["bytes_per_token"];
  EXPECT_LT(int4_per_token, bf16_per_token / 3);
  EXPECT_GT(int4_per_token, bf16_per_token * 9 / 32);
  for (const json& plan : {bf16, int4}) {
    int64_t weights = 0;
    for (const auto& [kind, bytes] : plan["weights"].items()) weights += bytes.get<int64_t>();
    EXPECT_EQ(plan["weights_total"], weights);
    EXPECT_EQ(plan["total"],
              weights + plan["kv_cache"].get<int64_t>() + plan["gdn_state_slots"].get<int64_t>() +
                  plan["gdn_state_checkpoints"].get<int64_t>() + plan["scratch"].get<int64_t>() +
                  plan["runtime_reserve"].get<int64_t>());
    EXPECT_EQ(plan["fits"], plan["total"].get<int64_t>() <= plan["available"].get<int64_t>());
    // The flags size the caches alike whatever the weights.
    EXPECT_EQ(plan["kv_cache"], bf16["kv_cache"]);
  }
  // 79.7 B parameters: about 2 bytes each at bf16; int4 takes 4.5 bits per weight (an f16 scale
  // per 32), and the embedding stays bf16, lm_head int8.
  EXPECT_GT(bf16["weights_total"].get<int64_t>(), int64_t{159} * 1000 * 1000 * 1000);
  EXPECT_LT(int4["weights_total"].get<int64_t>(), bf16["weights_total"].get<int64_t>() / 3);
  EXPECT_GT(int4["weights_total"].get<int64_t>(), bf16["weights_total"].get<int64_t>() * 9 / 32);
  // 12 attention layers and the MTP layer, 2 KV heads x 256, f32 K and V, 8192 positions each
  // for 4 requests.
  EXPECT_EQ(bf16["kv_cache"], int64_t{13} * 2 * 2 * 256 * 4 * 8192 * 4);

  // Flags the model refuses, and bad values: usage errors, one line each.
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--tp 3", "--tp 3"},
           {"--tp 2 --ep --max-model-len 64", ""},  // 512 experts split whole: fine
           {"--weight-dtype int3", "--weight-dtype: 'int3' is not"},
           {"--max-num-seqs 0", "--max-num-seqs: must be >= 1"},
           {"--kv-cache-memory -1", "--kv-cache-memory: must not be negative"},
           {"--max-model-len 300000", "--max-model-len 300000 is outside [1, 262144]"},
           {"--block-size 100000", "--block-size must be in [1, 256]"},
           {"--spec mtp:9", "--spec"},
       }) {
    SCOPED_TRACE(flags);
    r = Run("inspect --bandwidth 10 " + flags + " " + model);
    if (message.empty()) {
      EXPECT_EQ(r.exit_code, 0) << r.err;
      continue;
    }
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err.rfind("moeserve inspect: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
}  // namespace moeserve
