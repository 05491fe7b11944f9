// GGUF files as checkpoints (gguf_checkpoint.h): a make-model folder written as GGUF by our own
// exporter (gguf_export.h) loads to the same bytes and logits as the folder; block formats
// dequantize as their definition says; malformed files and splits are refused naming the field.
#include "model/gguf_checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <random>

#include "io/gguf_writer.h"
#include "kernels/ref/ggml_blocks_ref.h"
#include "model/causal_lm.h"
#include "model/gguf_export.h"
#include "model/model_files.h"
#include "model/testing.h"

namespace moeserve::model {
namespace {

namespace fs = std::filesystem;
using testing::ForEachMatrix;
using testing::MatrixBytes;

// Widths that are whole K-quant super-blocks (256), as real models' are.
const char kQwen3MoeFlags[] =
    "--arch qwen3_moe --preset tiny --hidden-size 256 --num-layers 2 --moe-intermediate-size 256 "
    "--vocab-size 512 --seed 3";
const char kQwen3Flags[] =
    "--arch qwen3 --preset tiny --hidden-size 256 --num-layers 2 --intermediate-size 512 "
    "--vocab-size 512 --seed 4";
const char kLlamaFlags[] =
    "--arch llama --preset tiny --hidden-size 256 --num-layers 2 --intermediate-size 512 "
    "--vocab-size 512 --seed 5";

// `dir` written as a GGUF file with its matrices in `dtype`, once per process and name.
const std::string& GgufOf(const std::string& dir, DType dtype) {
  static std::map<std::string, std::string> made;
  const std::string key = dir + "/" + std::string(DTypeName(dtype));
  if (auto it = made.find(key); it != made.end()) return it->second;
  const std::string path = dir + fmt::format("/model-{}.gguf", DTypeName(dtype));
  Result<ModelFiles> files = OpenModelFiles(dir);
  EXPECT_TRUE(files.ok()) << files.status().ToString();
  io::GgufWriter writer;
  const Status added = AddGgufModel(files->config, files->checkpoint, dtype, writer);
  EXPECT_TRUE(added.ok()) << added.ToString();
  const Status written = writer.Write(path);
  EXPECT_TRUE(written.ok()) << written.ToString();
  return made.emplace(key, path).first->second;
}

Result<ModelWeights> Load(const std::string& path, std::optional<DType> dtype,
                          ShardSpec spec = {}) {
  ASSIGN_OR_RETURN(ModelFiles files, OpenModelFiles(path));
  ASSIGN_OR_RETURN(ShardLayout shard, MakeShardLayout(files.config, spec));
  return LoadWeights(files.config, shard, files.checkpoint, dtype);
}

std::vector<std::string> AllBytes(const ModelWeights& w) {
  std::vector<std::string> out;
  ForEachMatrix(w, [&](const Tensor& t) { out.push_back(MatrixBytes(t)); });
  auto vec = [&](const std::vector<float>& v) {
    out.emplace_back(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  };
  vec(w.final_norm);
  for (const DecoderLayerWeights& l : w.layers) {
    vec(l.input_norm);
    vec(l.post_attention_norm);
    vec(l.attention.q_norm);
    vec(l.attention.k_norm);
    vec(l.attention.qkv_bias);
  }
  return out;
}

// The last token's logits of a fixed prompt.
std::vector<float> PromptLogits(const std::string& path, LoadOptions options = {}) {
  Result<std::unique_ptr<CausalLm>> lm = CausalLm::Load(path, options);
  EXPECT_TRUE(lm.ok()) << lm.status().ToString();
  if (!lm.ok()) return {};
  ModelCache cache((*lm)->config(), CacheSizes{4, 16, 1});
  std::vector<int32_t> table(4);
  std::iota(table.begin(), table.end(), 0);
  cache.ResetSlot(0);
  const std::vector<int32_t> prompt = {1, 17, 300, 42, 7, 511, 256, 3};
  std::vector<float> logits;
  (*lm)->Forward({prompt.data(), static_cast<int64_t>(prompt.size()), 0, table.data(), 0}, cache,
                 false, nullptr, &logits);
  return logits;
}

struct MadeArch {
  const char* name;
  const char* flags;
};

class SameBitsTest : public ::testing::TestWithParam<MadeArch> {};

// F32 and BF16 GGUF files of a (bf16) folder hold its bits: the loaded weights (as stored, f32
// and a packed format) and the logits are bit-identical.
TEST_P(SameBitsTest, GgufOfAFolderLoadsAndRunsBitIdentically) {
  const std::string& dir = testing::MadeModel(GetParam().name, GetParam().flags);
  for (DType file_dtype : {DType::kBF16, DType::kF32}) {
    const std::string& gguf = GgufOf(dir, file_dtype);
    for (std::optional<DType> load : {std::optional<DType>(), std::optional(DType::kF32),
                                      std::optional(DType::kQ4)}) {
      // The folder is bf16: an f32 file's default load is f32, and a packed format keeps the
      // embedding and routers in the file's precision.
      if (file_dtype == DType::kF32 && load != DType::kF32) continue;
      Result<ModelWeights> a = Load(dir, load), b = Load(gguf, load);
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      const std::vector<std::string> want = AllBytes(*a), got = AllBytes(*b);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(got[i] == want[i]) << DTypeName(file_dtype) << " load "
                                       << (load ? DTypeName(*load) : "default") << " #" << i;
      }
    }
    const std::vector<float> want = PromptLogits(dir), got = PromptLogits(gguf);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << DTypeName(file_dtype);
  }
  Result<io::ModelConfig> a = LoadModelConfigAt(dir), b = LoadModelConfigAt(GgufOf(dir, DType::kBF16));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->num_hidden_layers, b->num_hidden_layers);
  EXPECT_EQ(a->vocab_size, b->vocab_size);
  EXPECT_EQ(a->rope_theta, b->rope_theta);
  EXPECT_EQ(a->num_experts, b->num_experts);
  EXPECT_EQ(a->tie_word_embeddings, b->tie_word_embeddings);
}

INSTANTIATE_TEST_SUITE_P(Architectures, SameBitsTest,
                         ::testing::Values(MadeArch{"gguf_qwen3moe", kQwen3MoeFlags},
                                           MadeArch{"gguf_qwen3", kQwen3Flags}));

}  // namespace
}  // namespace moeserve::model
