#include "io/gguf_writer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "io/gguf.h"

namespace moeserve::io {
namespace {

namespace fs = std::filesystem;

class GgufWriterTest : public ::testing::Test {
 protected:
  void TearDown() override {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  const std::string path_ =
      (fs::temp_directory_path() / fmt::format("moeserve_gguf_writer_{}", getpid())).string();
};

// What the writer writes, the reader reads back: every value, the tensors' shapes, types and
// bytes, at the default and at a wider alignment.
TEST_F(GgufWriterTest, ReaderReadsBackWhatItWrote) {
  for (uint32_t alignment : {32u, 64u}) {
    GgufWriter w(alignment);
    w.SetString("general.architecture", "qwen3moe");
    w.SetU32("qwen3moe.block_count", 2);
    w.SetF32("qwen3moe.rope.freq_base", 1e6f);
    w.SetBool("tokenizer.ggml.add_bos_token", false);
    w.SetArray("tokenizer.ggml.tokens", GgufType::kString, {"a", "\xc4\xa0" "b"});
    w.SetArray("tokenizer.ggml.token_type", GgufType::kInt32, {1, 3});
    w.Set("i64", {GgufType::kInt64, GgufType::kUint8, int64_t{-5}});
    std::string f32(4 * 6, '\0');
    for (size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<char>(i);
    w.AddTensor("a.weight", {3, 2}, 0, f32);                 // F32 [2, 3]
    w.AddTensor("b.weight", {32, 2}, 8, std::string(68, 'q'));  // Q8_0: 2 blocks
    ASSERT_TRUE(w.Write(path_).ok());

    Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(path_);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    const GgufFile& g = **f;
    EXPECT_EQ(g.alignment(), alignment);
    EXPECT_EQ(g.FindValue("general.architecture")->value, "qwen3moe");
    EXPECT_EQ(g.FindValue("qwen3moe.block_count")->type, GgufType::kUint32);
    EXPECT_EQ(g.FindValue("qwen3moe.block_count")->value, 2);
    EXPECT_EQ(g.FindValue("qwen3moe.rope.freq_base")->value, 1e6);
    EXPECT_EQ(g.FindValue("tokenizer.ggml.add_bos_token")->value, false);
    EXPECT_EQ(g.FindValue("tokenizer.ggml.tokens")->value,
              nlohmann::json::array({"a", "\xc4\xa0" "b"}));
    EXPECT_EQ(g.FindValue("tokenizer.ggml.token_type")->element_type, GgufType::kInt32);
    EXPECT_EQ(g.FindValue("i64")->value, -5);
    ASSERT_EQ(g.tensors().size(), 2u);
    EXPECT_EQ(g.tensors()[0].ne, (std::vector<int64_t>{3, 2}));
    EXPECT_EQ(g.tensors()[1].type, 8u);
    EXPECT_EQ(std::memcmp(g.tensors()[0].bytes.data(), f32.data(), f32.size()), 0);
    EXPECT_EQ(g.tensors()[1].bytes.size(), 68u);
    EXPECT_EQ(static_cast<char>(g.tensors()[1].bytes[67]), 'q');
  }
}

TEST_F(GgufWriterTest, RefusesWhatItCannotWriteNamingIt) {
  {
    GgufWriter w;
    w.AddTensor("short.weight", {32, 2}, 8, std::string(67, 'q'));
    const Status s = w.Write(path_);
    EXPECT_NE(s.message().find("short.weight"), std::string::npos) << s.message();
  }
  {
    GgufWriter w;
    w.Set("n", {GgufType::kUint32, GgufType::kUint8, "seven"});
    const Status s = w.Write(path_);
    EXPECT_NE(s.message().find("key n"), std::string::npos) << s.message();
  }
  EXPECT_FALSE(fs::exists(path_));
}

}  // namespace
}  // namespace moeserve::io
