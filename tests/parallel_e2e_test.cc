// Tensor and expert parallel ranks end to end, through the real binary: `logits` over --tp 2 /
// --tp 2 --ep / --tp 4 --ep, as threads (--comm local) and as processes under `mpirun -np N`
// (--comm mpi), equals one rank's within 1e-5 relative (MTP draft logits too); `generate` under
// mpirun gives one rank's greedy tokens for eight concurrent prompts; `serve` under mpirun
// answers completions as one rank's server does and exits 0 when rank 0 is stopped; splits that
// cannot work exit 2 naming the numbers.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/run_binary.h"
#include "tests/server_process.h"
#include "core/test_paths.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kTinyDir = MOESERVE_TESTDATA_DIR + "/tiny-qwen3next";
// mpirun as ctest runs it: as root in containers, more ranks than cores, no pinning; Open MPI
// leaves its own allocations to the exit, which LeakSanitizer would report under the asan preset.
const std::string kMpiEnv =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0";
const std::string kMpirun = kMpiEnv + " mpirun --oversubscribe --bind-to none";
const std::vector<std::string> kMpirunServe = {"env",
                                               "OMPI_ALLOW_RUN_AS_ROOT=1",
                                               "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                               "ASAN_OPTIONS=detect_leaks=0",
                                               "mpirun",
                                               "-np",
                                               "2",
                                               "--oversubscribe",
                                               "--bind-to",
                                               "none"};

class ParallelE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / fmt::format("moeserve_tp_e2e_{}", getpid()));
    fs::create_directories(*dir_);
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static e2e::CommandResult Run(const std::string& args) {
    return e2e::RunMoeserve(args, *dir_ / "err.txt");
  }
  // `moeserve <args>` under `mpirun -np N`.
  static e2e::CommandResult RunMpi(int np, const std::string& args) {
    return e2e::RunShell(fmt::format("{} -np {} {} {}", kMpirun, np, MOESERVE_BINARY, args),
                         *dir_ / "mpi_err.txt");
  }
  static std::vector<float> ReadF32(const fs::path& path) {
    const std::string bytes = e2e::ReadFile(path);
    std::vector<float> out(bytes.size() / sizeof(float));
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
    return out;
  }
  static inline fs::path* dir_ = nullptr;
};

// max |a - b| / max |b| per row of `vocab`, the worst row.
double WorstRowRelError(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  double worst = 0;
  for (size_t row = 0; row * vocab < b.size(); ++row) {
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(a[row * vocab + i]) - b[row * vocab + i]));
      scale = std::max(scale, std::fabs(static_cast<double>(b[row * vocab + i])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

TEST_F(ParallelE2eTest, LogitsOverRanksEqualOneRank) {
  const std::string common = fmt::format(
      "logits --model {} --token-ids 1,5,9,200,33,7,100,4,22,45,13,2,9,9,9,301,77 --all-positions "
      "--mtp",
      kTinyDir);
  const fs::path ref = *dir_ / "one.f32";
  ASSERT_EQ(Run(fmt::format("{} --out {}", common, ref.string())).exit_code, 0);
  const std::vector<float> want = ReadF32(ref), want_mtp = ReadF32(ref.string() + ".mtp");
  ASSERT_EQ(want.size(), 17u * 512);
  struct Layout {
    int np;  // 0: --comm local
    std::string flags;
  };
  const std::vector<Layout> layouts = {{0, "--tp 2"},          {0, "--tp 4 --ep --threads 1"},
                                       {2, "--tp 2"},          {2, "--tp 2 --ep"},
                                       {4, "--tp 4 --ep"},     {0, "--tp 2 --comm-sim 5,10"}};
  for (const Layout& l : layouts) {
    const std::string what = fmt::format("{} {}", l.np > 0 ? fmt::format("mpirun -np {}", l.np)
                                                           : std::string("local"),
                                         l.flags);
    const fs::path out = *dir_ / "ranks.f32";
    fs::remove(out);
    const std::string args = fmt::format("{} --out {} {}", common, out.string(), l.flags);
    const e2e::CommandResult r =
        l.np > 0 ? RunMpi(l.np, args + " --comm mpi") : Run(args);
    ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.err;
    const std::vector<float> got = ReadF32(out), got_mtp = ReadF32(out.string() + ".mtp");
    ASSERT_EQ(got.size(), want.size()) << what;
    ASSERT_EQ(got_mtp.size(), want_mtp.size()) << what;
    EXPECT_LE(WorstRowRelError(got, want, 512), 1e-5) << what;
    EXPECT_LE(WorstRowRelError(got_mtp, want_mtp, 512), 1e-5) << what;
  }
}

// make-model's Qwen3.5-MoE and Qwen3-MoE (KV heads replicated at --tp 4) under mpirun.
TEST_F(ParallelE2eTest, MadeModelsUnderMpirunEqualOneRank) {
  for (const std::string arch : {"qwen3_5_moe", "qwen3_moe"}) {
    const fs::path model = *dir_ / arch;
    ASSERT_EQ(Run(fmt::format("make-model --arch {} --preset tiny --seed 4 --out {}", arch,
                              model.string()))
                  .exit_code,
              0);
    const std::string common = fmt::format(
        "logits --model {} --token-ids 3,1,4,1,5,9,2,6,5,3,5,8,9,7 --all-positions",
        model.string());
    const fs::path ref = *dir_ / "made_one.f32", out = *dir_ / "made_ranks.f32";
    ASSERT_EQ(Run(fmt::format("{} --out {}", common, ref.string())).exit_code, 0);
    const std::vector<float> want = ReadF32(ref);
    for (const auto& [np, flags] : std::vector<std::pair<int, std::string>>{
             {2, "--tp 2"}, {2, "--tp 2 --ep"}, {4, "--tp 4 --ep"}}) {
      fs::remove(out);
      const e2e::CommandResult r = RunMpi(
          np, fmt::format("{} --out {} {} --comm mpi", common, out.string(), flags));
      ASSERT_EQ(r.exit_code, 0) << arch << " " << flags << "\n" << r.err;
      const std::vector<float> got = ReadF32(out);
      ASSERT_EQ(got.size(), want.size()) << arch << " " << flags;
      EXPECT_LE(WorstRowRelError(got, want, 512), 1e-5) << arch << " " << flags;
    }
  }
}

TEST_F(ParallelE2eTest, GenerateUnderMpirunGivesOneRanksTokens) {
  const fs::path file = *dir_ / "prompts.jsonl";
  {
    std::ofstream out(file);
    for (int i = 0; i < 8; ++i) {
      out << json{{"prompt", fmt::format("Request {}: once upon a time", i)},
                  {"max_tokens", 6 + 3 * i},
                  {"temperature", 0},
                  {"ignore_eos", true}}
                 .dump()
          << "\n";
    }
  }
  const std::string args = fmt::format("generate --prompts-file {} --json", file.string());
  const e2e::CommandResult one = Run(args);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const e2e::CommandResult two = RunMpi(2, args + " --tp 2 --ep --comm mpi");
  ASSERT_EQ(two.exit_code, 0) << two.err;
  const json a = json::parse(one.out), b = json::parse(two.out);
  ASSERT_EQ(a["requests"].size(), 8u);
  ASSERT_EQ(b["requests"].size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(b["requests"][i]["token_ids"], a["requests"][i]["token_ids"]) << "request " << i;
  }
}

// Hybrid prefix caching under mpirun: requests sharing a long prefix run one after another
// (--max-num-seqs 1), so each after the first resumes from a GDN state checkpoint -- copied on
// both processes' shards -- and gives one process's tokens.
TEST_F(ParallelE2eTest, PrefixCacheHitsUnderMpirunGiveOneRanksTokens) {
  const fs::path file = *dir_ / "shared_prefix.jsonl";
  std::string shared;
  for (int i = 0; i < 20; ++i) shared += fmt::format("Line {} of a shared system prompt. ", i);
  {
    std::ofstream out(file);
    for (int i = 0; i < 4; ++i) {
      out << json{{"prompt", shared + fmt::format("Question {}?", i)},
                  {"max_tokens", 8},
                  {"temperature", 0},
                  {"ignore_eos", true}}
                 .dump()
          << "\n";
    }
  }
  const std::string args =
      fmt::format("generate --prompts-file {} --json --max-num-seqs 1", file.string());
  const e2e::CommandResult one = Run(args);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const e2e::CommandResult two = RunMpi(2, args + " --tp 2 --comm mpi");
  ASSERT_EQ(two.exit_code, 0) << two.err;
  const json a = json::parse(one.out), b = json::parse(two.out);
  ASSERT_EQ(b["requests"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(b["requests"][i]["token_ids"], a["requests"][i]["token_ids"]) << "request " << i;
    if (i > 0) {
      EXPECT_GT(b["requests"][i]["num_cached_tokens"].get<int64_t>(), 0) << b.dump();
    }
  }
}

// The pid of rank `rank` of an mpirun job serving on `port` (its environment names the rank).
pid_t RankServing(int port, int rank) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string cmdline = e2e::ReadFile(entry.path() / "cmdline");
    if (cmdline.find(std::string(MOESERVE_BINARY) + '\0' + "serve") != 0) continue;
    if (cmdline.find(std::string("--port") + '\0' + std::to_string(port)) == std::string::npos) {
      continue;
    }
    const std::string environ = e2e::ReadFile(entry.path() / "environ");
    if (environ.find(fmt::format("OMPI_COMM_WORLD_RANK={}", rank) + '\0') != std::string::npos) {
      return static_cast<pid_t>(std::stol(name));
    }
  }
  return -1;
}

TEST_F(ParallelE2eTest, ServeUnderMpirunAnswersAsOneRank) {
  const std::vector<json> bodies = {
      {{"prompt", "The capital of France is"}, {"max_tokens", 16}, {"temperature", 0}},
      {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}},
      {{"prompt", "A B C"}, {"max_tokens", 8}, {"temperature", 0.8}, {"seed", 7}, {"n", 2}}};
  auto answers = [&](int port) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    std::vector<json> texts;
    for (const json& body : bodies) {
      auto r = c.Post("/v1/completions", body.dump(), "application/json");
      EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
      if (!r || r->status != 200) return texts;
      const json answer = json::parse(r->body);
      json choices;
      for (const json& choice : answer["choices"]) choices.push_back(choice["text"]);
      texts.push_back(choices);
    }
    return texts;
  };
  std::vector<json> want;
  {
    e2e::ServerProcess one({"--max-model-len", "512"}, *dir_ / "one.err");
    ASSERT_TRUE(one.ok()) << one.log();
    want = answers(one.port());
    EXPECT_EQ(one.Stop(), 0);
  }
  e2e::ServerProcess ranks(
      {"--max-model-len", "512", "--tp", "2", "--comm", "mpi"}, *dir_ / "mpi.err", kMpirunServe);
  ASSERT_TRUE(ranks.ok()) << ranks.log();
  const std::vector<json> got = answers(ranks.port());
  ASSERT_EQ(got.size(), want.size());
  // Greedy answers are one rank's; the seeded sampled one draws from logits that differ in the
  // last bits, so only its shape is compared.
  EXPECT_EQ(got[0], want[0]);
  EXPECT_EQ(got[1], want[1]);
  EXPECT_EQ(got[2].size(), want[2].size());
  // Stopping rank 0 (what Ctrl-C in a terminal does) shuts the group down: every process exits
  // 0, and so does mpirun.
  const pid_t rank0 = RankServing(ranks.port(), 0);
  ASSERT_GT(rank0, 0);
  kill(rank0, SIGTERM);
  EXPECT_EQ(ranks.Wait(), 0) << ranks.log();
}

// A rank that dies ends the job: Open MPI takes every process down and mpirun exits non-zero --
// nothing hangs. (Rank 0 does not get to answer in-flight requests with an error first;
// docs/parallel.md.)
TEST_F(ParallelE2eTest, ADeadRankEndsTheJob) {
  e2e::ServerProcess ranks(
      {"--max-model-len", "256", "--tp", "2", "--comm", "mpi"}, *dir_ / "dead.err", kMpirunServe);
  ASSERT_TRUE(ranks.ok()) << ranks.log();
  const pid_t rank1 = RankServing(ranks.port(), 1);
  ASSERT_GT(rank1, 0);
  kill(rank1, SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(ranks.Wait(), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

TEST_F(ParallelE2eTest, SplitsThatCannotWorkExitTwo) {
  const std::string logits = fmt::format("logits --model {} --token-ids 1,2 --out {}", kTinyDir,
                                         (*dir_ / "bad.f32").string());
  e2e::CommandResult r = Run(logits + " --tp 3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--tp 3 does not divide num_attention_heads (4)"), std::string::npos)
      << r.err;
  r = Run(logits + " --tp 8 --ep");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--tp 8"), std::string::npos) << r.err;
  r = Run(fmt::format("generate --model {} --token-ids 1,2 --max-tokens 2 --tp 16", kTinyDir));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--tp 16 does not divide num_attention_heads (4)"), std::string::npos)
      << r.err;
  r = RunMpi(2, logits + " --tp 4 --comm mpi");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--tp 4 but mpirun started 2 processes"), std::string::npos) << r.err;
  r = Run(logits + " --comm tcp");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--comm: 'tcp' is not local or mpi"), std::string::npos) << r.err;
  r = Run(logits + " --tp 2 --comm-sim 5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--comm-sim"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace moeserve
