// GGUF files as checkpoints (gguf_checkpoint.h): a make-model folder written as GGUF by our own
// exporter (gguf_export.h) loads to the same bytes and logits as the folder; block formats
// dequantize as their definition says; malformed files and splits are refused naming the field.
#include "model/gguf_checkpoint.h"

#include <gmock/gmock.h>
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
#include "model/weight_bytes.h"
#include "core/test_paths.h"

namespace moeserve::model {
namespace {

namespace fs = std::filesystem;
using testing::AllMatrixBytes;
using testing::MatrixBytes;

// Widths that are whole K-quant super-blocks (256), as real models' are.
const char kQwen3MoeFlags[] =
    "--arch qwen3_moe --preset tiny --hidden-size 256 --num-layers 2 --moe-intermediate-size 256 "
    "--vocab-size 512 --seed 3";
const char kQwen3NextFlags[] =
    "--arch qwen3_next --preset tiny --hidden-size 256 --num-layers 4 --moe-intermediate-size 256 "
    "--shared-expert-intermediate-size 256 --vocab-size 512 --seed 6";
// Qwen3.5-MoE: 4 linear key heads, 8 value heads of 128 (so the converter reorders the value
// heads, by a permutation that is not its own inverse), an MTP layer (the hybrid presets'
// default).
const char kQwen35Flags[] =
    "--arch qwen3_5_moe --preset small --hidden-size 256 --num-layers 4 --num-experts 8 "
    "--experts-per-token 2 --moe-intermediate-size 256 --shared-expert-intermediate-size 256 "
    "--vocab-size 512 --seed 8";
const char kLlamaFlags[] =
    "--arch llama --preset tiny --hidden-size 256 --num-layers 2 --intermediate-size 512 "
    "--vocab-size 512 --seed 5";
const char kQwen3Flags[] =
    "--arch qwen3 --preset tiny --hidden-size 256 --num-layers 2 --intermediate-size 512 "
    "--vocab-size 512 --seed 4";

// A writer holding `dir` as GGUF with its matrices in `dtype`.
io::GgufWriter WriterOf(const std::string& dir, DType dtype) {
  Result<ModelFiles> files = OpenModelFiles(dir);
  EXPECT_TRUE(files.ok()) << files.status().ToString();
  io::GgufWriter writer;
  const Status added = AddGgufModel(files->config, files->checkpoint, dtype, writer);
  EXPECT_TRUE(added.ok()) << added.ToString();
  return writer;
}

// `dir` written as a GGUF file with its matrices in `dtype`, once per process and name.
const std::string& GgufOf(const std::string& dir, DType dtype) {
  static std::map<std::string, std::string> made;
  const std::string key = dir + "/" + std::string(DTypeName(dtype));
  if (auto it = made.find(key); it != made.end()) return it->second;
  const std::string path = dir + fmt::format("/model-{}.gguf", DTypeName(dtype));
  const Status written = WriterOf(dir, dtype).Write(path);
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
  std::vector<std::string> out = AllMatrixBytes(w);
  auto vec = [&](const std::vector<float>& v) {
    out.emplace_back(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  };
  auto layer = [&](const DecoderLayerWeights& l) {
    for (const std::vector<float>* v :
         {&l.input_norm, &l.post_attention_norm, &l.attention.q_norm, &l.attention.k_norm,
          &l.attention.qkv_bias, &l.gdn.conv, &l.gdn.dt_bias, &l.gdn.neg_exp_a, &l.gdn.norm,
          &l.experts.shared_gate}) {
      vec(*v);
    }
  };
  vec(w.final_norm);
  for (const DecoderLayerWeights& l : w.layers) layer(l);
  for (const std::vector<float>* v :
       {&w.mtp.pre_fc_norm_embedding, &w.mtp.pre_fc_norm_hidden, &w.mtp.norm}) {
    vec(*v);
  }
  for (const DecoderLayerWeights& l : w.mtp.layers) layer(l);
  return out;
}

// The last token's logits of a fixed prompt, then (with `decode`) those of `decode` more tokens
// fed one at a time (decode steps), appended.
std::vector<float> PromptLogits(const std::string& path, LoadOptions options = {},
                                int decode = 0) {
  Result<std::unique_ptr<CausalLm>> lm = CausalLm::Load(path, options);
  EXPECT_TRUE(lm.ok()) << lm.status().ToString();
  if (!lm.ok()) return {};
  ModelCache cache((*lm)->config(), CacheSizes{4, 16, 1});
  std::vector<int32_t> table(4);
  std::iota(table.begin(), table.end(), 0);
  cache.ResetSlot(0);
  const std::vector<int32_t> prompt = {1, 17, 300, 42, 7, 511, 256, 3};
  std::vector<float> logits, out;
  (*lm)->Forward({prompt.data(), static_cast<int64_t>(prompt.size()), 0, table.data(), 0}, cache,
                 false, nullptr, &out);
  for (int i = 0; i < decode; ++i) {
    const int32_t token = 100 + 37 * i;
    const int64_t pos = static_cast<int64_t>(prompt.size()) + i;
    (*lm)->Forward({&token, 1, pos, table.data(), 0}, cache, false, nullptr, &logits);
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

// The error opening `dir`'s Q8_0 GGUF file once `edit` changed it (empty, and a failed
// expectation, when it opens).
std::string OpenErrorAfter(const std::string& dir,
                           const std::function<void(io::GgufWriter&)>& edit) {
  const std::string path = dir + "/malformed.gguf";
  io::GgufWriter w = WriterOf(dir, DType::kGgmlQ8_0);
  edit(w);
  EXPECT_TRUE(w.Write(path).ok());
  Result<ModelFiles> files = OpenModelFiles(path);
  EXPECT_FALSE(files.ok());
  return files.ok() ? std::string() : files.status().message();
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
    // (By default a GGUF file is used as stored, its routers f32 as llama.cpp's converter writes
    // them: its logits are compared below.)
    for (std::optional<DType> load : {std::optional(DType::kBF16), std::optional(DType::kF32),
                                      std::optional(DType::kQ4)}) {
      // The folder is bf16: a packed format keeps the embedding and routers in the file's
      // precision.
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

// `moeserve export-gguf` then `moeserve generate --model FILE.gguf`: the tokenizer, chat
// template, config and weights all from the file give the folder's text, greedy.
TEST(GgufCommandsTest, ExportedFileGeneratesTheFoldersText) {
  const std::string& dir = testing::MadeModel("gguf_qwen3next", kQwen3NextFlags);
  const std::string gguf = dir + "/exported.gguf";
  auto run = [](const std::string& cmd) {
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    EXPECT_NE(p, nullptr) << cmd;
    if (p == nullptr) return out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
    EXPECT_EQ(pclose(p), 0) << cmd;
    return out;
  };
  run(fmt::format("{} export-gguf --model {} --out {} --type bf16 2>/dev/null", MOESERVE_BINARY,
                  dir, gguf));
  auto generate = [&](const std::string& model) {
    return run(fmt::format("{} generate --model {} --prompt 'The morning came' --max-tokens 12 "
                           "2>/dev/null",
                           MOESERVE_BINARY, model));
  };
  const std::string from_folder = generate(dir), from_gguf = generate(gguf);
  EXPECT_FALSE(from_folder.empty());
  EXPECT_EQ(from_gguf, from_folder);
  // A type that is no GGML format moeserve writes is refused.
  EXPECT_NE(std::system(fmt::format("{} export-gguf --model {} --out {}.x --type q3_k 2>/dev/null",
                                    MOESERVE_BINARY, dir, gguf)
                            .c_str()),
            0);
}

INSTANTIATE_TEST_SUITE_P(Architectures, SameBitsTest,
                         ::testing::Values(MadeArch{"gguf_qwen3moe", kQwen3MoeFlags},
                                           MadeArch{"gguf_qwen3", kQwen3Flags},
                                           MadeArch{"gguf_qwen3next", kQwen3NextFlags},
                                           MadeArch{"gguf_llama", kLlamaFlags}));

// Qwen3.5's Gated DeltaNet value heads as llama.cpp's converter stores them
// (_LinearAttentionVReorderBase): Hugging Face's heads grouped by key head, [g0 v0 .. v(r-1), g1
// v0 ...], viewed as [nk, r, d] and swapped to [r, nk, d]. Entry i of the result is the source
// entry stored at i: `offset` entries in place, then nv heads of `unit` entries.
std::vector<int64_t> ConverterValueOrder(const io::ModelConfig& c, int64_t unit, int64_t offset) {
  const int64_t nk = c.linear_num_key_heads, r = c.linear_num_value_heads / nk;
  std::vector<int64_t> order(static_cast<size_t>(offset));
  std::iota(order.begin(), order.end(), 0);
  for (int64_t j = 0; j < r; ++j) {
    for (int64_t g = 0; g < nk; ++g) {
      for (int64_t i = 0; i < unit; ++i) order.push_back(offset + (g * r + j) * unit + i);
    }
  }
  return order;
}

// A [rows, cols] matrix (unpacked dtype) with its rows, or its columns, gathered by `order`, in
// place.
void Reorder(const Tensor& t, const std::vector<int64_t>& order, bool columns) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  const size_t size = DTypeSize(t.dtype());
  auto* data = static_cast<char*>(t.data());
  const std::string was(data, static_cast<size_t>(rows * cols) * size);
  ASSERT_EQ(static_cast<int64_t>(order.size()), columns ? cols : rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t from = columns ? r * cols + order[c] : order[r] * cols + c;
      std::memcpy(data + (r * cols + c) * size, was.data() + from * size, size);
    }
  }
}

std::vector<float> Gathered(const std::vector<float>& v, const std::vector<int64_t>& order,
                            int64_t width = 1) {
  std::vector<float> out;
  for (int64_t i : order) out.insert(out.end(), v.begin() + i * width, v.begin() + (i + 1) * width);
  return out;
}

// The weights a folder loads to, with every GDN layer's v-indexed parts in the converter's order:
// what the folder's qwen35moe GGUF file must load to.
void ToConverterOrder(const io::ModelConfig& c, ModelWeights& w) {
  const int64_t nv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
  const int64_t key_dim = c.linear_key_dim(), conv_dim = c.linear_conv_dim();
  std::vector<int64_t> qkvz = ConverterValueOrder(c, dv, 2 * key_dim);  // [q | k | v] ...
  for (int64_t i : ConverterValueOrder(c, dv, 0)) qkvz.push_back(conv_dim + i);  // ... | z
  std::vector<int64_t> ba = ConverterValueOrder(c, 1, 0);
  for (int64_t i : ConverterValueOrder(c, 1, 0)) ba.push_back(nv + i);
  const std::vector<int64_t> channels = ConverterValueOrder(c, dv, 2 * key_dim);
  for (size_t i = 0; i < c.layer_types.size(); ++i) {
    if (c.layer_types[i] != io::LayerType::kLinearAttention) continue;
    GdnWeights& g = w.layers[i].gdn;
    Reorder(g.in_proj_qkvz.whole(), qkvz, false);
    Reorder(g.in_proj_ba.whole(), ba, false);
    Reorder(g.out_proj.view(), ConverterValueOrder(c, dv, 0), true);
    g.dt_bias = Gathered(g.dt_bias, ConverterValueOrder(c, 1, 0));
    g.neg_exp_a = Gathered(g.neg_exp_a, ConverterValueOrder(c, 1, 0));
    std::vector<float> conv = g.conv;  // [Kc][conv_dim]: gather each tap's channels
    for (int64_t j = 0; j < c.linear_conv_kernel_dim; ++j) {
      for (int64_t ch = 0; ch < conv_dim; ++ch) {
        g.conv[j * conv_dim + ch] = conv[j * conv_dim + channels[ch]];
      }
    }
  }
}

// A Qwen3.5-MoE folder (4 linear key heads, 8 value heads, an MTP layer) and its qwen35moe GGUF
// files: every weight loads to the same bits, the GDN layers' value heads in the converter's
// (tiled) order; the model runs the tiled file by mapping value head p to key head p % nk. The
// logits agree closely, not bit for bit: out_proj sums its value columns in the tiled order.
TEST(GgufQwen35Test, TiledValueHeadsLoadAsTheConverterStoresThemAndRunTheFolder) {
  const std::string& dir = testing::MadeModel("gguf_qwen35", kQwen35Flags);
  Result<io::ModelConfig> config = LoadModelConfigAt(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_NE(config->linear_num_key_heads, config->linear_num_value_heads);
  ASSERT_EQ(config->num_mtp_layers, 1);
  for (DType file_dtype : {DType::kBF16, DType::kF32}) {
    const std::string& gguf = GgufOf(dir, file_dtype);
    Result<io::ModelConfig> read = LoadModelConfigAt(gguf);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_TRUE(read->gguf.gdn_v_heads_tiled && read->gguf.experts_split);
    EXPECT_EQ(read->layer_types, config->layer_types);
    EXPECT_EQ(read->num_mtp_layers, 1);
    EXPECT_EQ(read->rotary_dim, config->rotary_dim);
    for (std::optional<DType> load : {std::optional(DType::kBF16), std::optional(DType::kF32)}) {
      if (file_dtype == DType::kF32 && load != DType::kF32) continue;
      Result<ModelWeights> a = Load(dir, load), b = Load(gguf, load);
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      ToConverterOrder(*config, *a);
      const std::vector<std::string> want = AllBytes(*a), got = AllBytes(*b);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(got[i] == want[i]) << DTypeName(file_dtype) << " load "
                                       << (load ? DTypeName(*load) : "default") << " #" << i;
      }
    }
    // A prefill, then decode steps (the fused GDN step, and without it): close to the folder's.
    const LoadOptions f32{.weight_dtype = DType::kF32};
    const std::vector<float> want = PromptLogits(dir, f32, 3), got = PromptLogits(gguf, f32, 3);
    ASSERT_EQ(got.size(), want.size());
    const int64_t V = config->vocab_size;
    for (size_t row = 0; row * V < got.size(); ++row) {
      const float* g = got.data() + row * V;
      const float* w = want.data() + row * V;
      EXPECT_LT(testing::RowRelError(g, w, V), 1e-5) << DTypeName(file_dtype) << " row " << row;
      EXPECT_EQ(std::max_element(g, g + V) - g, std::max_element(w, w + V) - w);
    }
    LoadOptions unfused = f32;
    unfused.forward.fused_gdn_step = false;
    const std::vector<float> stepwise = PromptLogits(gguf, unfused, 3);
    ASSERT_EQ(stepwise.size(), got.size());
    EXPECT_EQ(std::memcmp(stepwise.data(), got.data(), got.size() * sizeof(float)), 0)
        << "the fused decode step reads the tiled heads as the unfused passes do";
  }
}

// llama.cpp also reads a merged ffn_gate_up_exps ([E, 2I, H]: each expert's gate rows, then its
// up rows), Hugging Face's fused layout as it stands: the same file with each layer's
// ffn_gate_exps and ffn_up_exps merged loads to the same weights and logits.
TEST(GgufQwen35Test, MergedGateUpExpertsLoadAsTheSplitOnes) {
  const std::string& dir = testing::MadeModel("gguf_qwen35", kQwen35Flags);
  const std::string& split = GgufOf(dir, DType::kF32);
  Result<std::unique_ptr<io::GgufFile>> file = io::GgufFile::Open(split);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  io::GgufWriter w;
  for (const auto& [key, value] : (*file)->metadata()) w.Set(key, value);
  int merged = 0;
  for (const io::GgufTensor& t : (*file)->tensors()) {
    const auto as_string = [](std::span<const std::byte> b) {
      return std::string(reinterpret_cast<const char*>(b.data()), b.size());
    };
    if (t.name.ends_with("ffn_up_exps.weight")) continue;
    if (!t.name.ends_with("ffn_gate_exps.weight")) {
      w.AddTensor(t.name, t.ne, t.type, as_string(t.bytes));
      continue;
    }
    const std::string blk = t.name.substr(0, t.name.size() - std::strlen("ffn_gate_exps.weight"));
    const io::GgufTensor* up = (*file)->Find(blk + "ffn_up_exps.weight");
    ASSERT_NE(up, nullptr);
    const int64_t E = t.ne[2];
    const size_t per_expert = t.bytes.size() / static_cast<size_t>(E);
    std::string bytes;
    for (int64_t e = 0; e < E; ++e) {
      bytes += as_string(t.bytes.subspan(e * per_expert, per_expert));
      bytes += as_string(up->bytes.subspan(e * per_expert, per_expert));
    }
    w.AddTensor(blk + "ffn_gate_up_exps.weight", {t.ne[0], 2 * t.ne[1], E}, t.type,
                std::move(bytes));
    ++merged;
  }
  EXPECT_EQ(merged, 5);  // 4 layers and the MTP layer
  const std::string path = dir + "/merged.gguf";
  ASSERT_TRUE(w.Write(path).ok());
  Result<io::ModelConfig> c = LoadModelConfigAt(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->gguf.experts_split);
  Result<ModelWeights> a = Load(split, DType::kF32), b = Load(path, DType::kF32);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_TRUE(AllBytes(*a) == AllBytes(*b));
  const std::vector<float> want = PromptLogits(split), got = PromptLogits(path);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

// A model read from a GGUF file is not exported again: its rewrites (tiled heads, -exp(A), norms
// with their 1) would be applied twice.
TEST(GgufQwen35Test, ExportRefusesAModelReadFromAGgufFile) {
  const std::string& dir = testing::MadeModel("gguf_qwen35", kQwen35Flags);
  Result<ModelFiles> files = OpenModelFiles(GgufOf(dir, DType::kF32));
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  io::GgufWriter writer;
  const Status added = AddGgufModel(files->config, files->checkpoint, DType::kF32, writer);
  EXPECT_THAT(added.message(), ::testing::HasSubstr("this model was read from a GGUF file"));
}

// qwen35moe files that lie about the model are refused naming the tensor or key: the split GDN
// projections, the split experts, the MTP layer, the layer-type list.
TEST(GgufQwen35Test, RefusesMissingAndMisshapenTensorsNamingThem) {
  const std::string& dir = testing::MadeModel("gguf_qwen35", kQwen35Flags);
  auto error = [&](const std::function<void(io::GgufWriter&)>& edit) {
    return OpenErrorAfter(dir, edit);
  };
  auto f32 = [](int64_t n) { return std::string(static_cast<size_t>(n) * 4, '\0'); };
  using ::testing::HasSubstr;
  EXPECT_THAT(error([](io::GgufWriter& w) { w.RemoveTensor("blk.0.ssm_alpha.weight"); }),
              HasSubstr("no tensor blk.0.ssm_alpha.weight (for "
                        "model.layers.0.linear_attn.in_proj_a.weight, shape [8, 256])"));
  EXPECT_THAT(error([&](io::GgufWriter& w) {
                w.RemoveTensor("blk.1.ssm_beta.weight");
                w.AddTensor("blk.1.ssm_beta.weight", {256, 2}, 0, f32(512));
              }),
              HasSubstr("tensor blk.1.ssm_beta.weight has shape [2, 256] (ne reversed), but the "
                        "config implies [8, 256]"));
  EXPECT_THAT(error([&](io::GgufWriter& w) {
                w.RemoveTensor("blk.2.ssm_out.weight");
                w.AddTensor("blk.2.ssm_out.weight", {128, 256}, 0, f32(128 * 256));
              }),
              HasSubstr("tensor blk.2.ssm_out.weight has shape [256, 128] (ne reversed), but the "
                        "config implies [256, 1024]"));
  EXPECT_THAT(error([](io::GgufWriter& w) { w.RemoveTensor("blk.1.ffn_up_exps.weight"); }),
              HasSubstr("no tensor blk.1.ffn_up_exps.weight (for "
                        "model.layers.1.mlp.experts.0.up_proj.weight"));
  EXPECT_THAT(error([&](io::GgufWriter& w) {  // merged experts, but the wrong width
                w.AddTensor("blk.0.ffn_gate_up_exps.weight", {256, 128, 8}, 0, f32(256 * 128 * 8));
              }),
              HasSubstr("tensor blk.0.ffn_gate_up_exps.weight has shape [8, 128, 256] (ne "
                        "reversed), but the config implies [8, 512, 256]"));
  EXPECT_THAT(error([](io::GgufWriter& w) { w.RemoveTensor("blk.4.nextn.eh_proj.weight"); }),
              HasSubstr("no tensor blk.4.nextn.eh_proj.weight (for mtp.fc.weight"));
  EXPECT_THAT(error([](io::GgufWriter& w) { w.RemoveTensor("blk.4.attn_q.weight"); }),
              HasSubstr("no tensor blk.4.attn_q.weight (for mtp.layers.0.self_attn.q_proj"));
  EXPECT_THAT(error([](io::GgufWriter& w) { w.SetU32("qwen35moe.ssm.time_step_rank", 1); }),
              HasSubstr("linear_num_value_heads (1) must be a multiple of linear_num_key_heads (4)"));
  const std::string recurrent = "qwen35moe.attention.recurrent_layers";
  EXPECT_THAT(error([&](io::GgufWriter& w) {
                w.SetArray(recurrent, io::GgufType::kBool, nlohmann::json::array({true, false}));
              }),
              HasSubstr("key qwen35moe.attention.recurrent_layers is not a list of 5 flags"));
  EXPECT_THAT(error([&](io::GgufWriter& w) {
                w.SetArray(recurrent, io::GgufType::kBool,
                           nlohmann::json::array({true, true, true, false, true}));
              }),
              HasSubstr("entry 4 is true, not false (an MTP block has full attention)"));
  EXPECT_THAT(error([&](io::GgufWriter& w) {
                w.SetArray(recurrent, io::GgufType::kInt32, nlohmann::json::array({1, 1, 1, 0, 0}));
              }),
              HasSubstr("entry 0 is 1, not a boolean"));
  // The list wins over the interval: a full-attention layer 0 asks for attention tensors there.
  EXPECT_THAT(error([&](io::GgufWriter& w) {
                w.SetArray(recurrent, io::GgufType::kBool,
                           nlohmann::json::array({false, true, true, false, false}));
              }),
              HasSubstr("no tensor blk.0.attn_q.weight"));
}

constexpr DType kBlockDTypes[] = {DType::kGgmlQ8_0, DType::kGgmlQ4_0, DType::kGgmlQ4_1,
                                  DType::kGgmlQ5_0, DType::kGgmlQ5_1, DType::kGgmlQ4_K,
                                  DType::kGgmlQ5_K, DType::kGgmlQ6_K};

// Loaded as f32, a block-format file's matrices are the format's dequantization of its bytes
// (the scalar twin, which kernels' tests hold to an independent numpy definition); loaded into
// the default packed format (int8), its logits stay within a stated distance of that f32
// forward.
TEST(GgufBlockFormatsTest, LoadAsTheirDequantizationAndRunCloseToIt) {
  const std::string& dir = testing::MadeModel("gguf_qwen3moe", kQwen3MoeFlags);
  for (DType dtype : kBlockDTypes) {
    const std::string& gguf = GgufOf(dir, dtype);
    Result<ModelWeights> w = Load(gguf, DType::kF32);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    Result<std::unique_ptr<io::GgufFile>> file = io::GgufFile::Open(gguf);
    ASSERT_TRUE(file.ok());
    const io::GgufTensor* stored = (*file)->Find("blk.1.ffn_down_exps.weight");  // [E, H, I]
    const int64_t I = stored->ne[0], H = stored->ne[1];
    std::vector<float> want(static_cast<size_t>(H * I));
    const size_t row_bytes = StoredRowBytes(dtype, I);
    const std::byte* expert3 = stored->bytes.data() + 3 * H * row_bytes;
    for (int64_t r = 0; r < H; ++r) {
      kernels::ref::DequantizeGgmlRowRef(dtype, expert3 + r * row_bytes, want.data() + r * I, I);
    }
    const Tensor& got = w->layers[1].experts.experts[3].down.view();
    ASSERT_EQ(got.dtype(), DType::kF32);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
        << DTypeName(dtype);

    // Requantized at load to int8: a second rounding of each weight, as far from the f32 forward
    // as int8 is on the bf16 folder. On the dense model: a tiny random MoE's router flips experts
    // on rounding far smaller than that.
    const std::string& dense = GgufOf(testing::MadeModel("gguf_qwen3", kQwen3Flags), dtype);
    const std::vector<float> exact = PromptLogits(dense, {.weight_dtype = DType::kF32});
    const std::vector<float> packed = PromptLogits(dense, {.weight_dtype = DType::kQ8});
    ASSERT_EQ(exact.size(), packed.size());
    EXPECT_LT(testing::RowRelError(packed.data(), exact.data(), static_cast<int64_t>(exact.size())),
              0.03)
        << DTypeName(dtype);
  }
}

// By default a block-format file is used in place: each matrix a view of the file's bytes (q, k
// and v three blocks of one matrix), none copied. With f32 activations its logits are bit for bit
// those of its f32 dequantization (the kernels multiply each weight exactly as dequantized, in the
// f32 kernels' order); with int8 activations per block (the default, as llama.cpp) within a
// stated distance of them.
TEST(GgufBlockFormatsTest, UsedInPlaceAsTheirDequantization) {
  for (const MadeArch& arch : {MadeArch{"gguf_qwen3", kQwen3Flags},
                               MadeArch{"gguf_qwen3moe", kQwen3MoeFlags}}) {
    const std::string& dir = testing::MadeModel(arch.name, arch.flags);
    for (DType dtype : kBlockDTypes) {
      const std::string& gguf = GgufOf(dir, dtype);
      Result<ModelWeights> w = Load(gguf, std::nullopt);
      ASSERT_TRUE(w.ok()) << w.status().ToString();
      EXPECT_TRUE(w->stored_formats);
      const DecoderLayerWeights& layer = w->layers[1];
      ASSERT_EQ(layer.attention.qkv.blocks().size(), 3u);
      for (const WeightMatrix::Block& b : layer.attention.qkv.blocks()) {
        EXPECT_TRUE(b.rows.borrowed());
        EXPECT_EQ(b.rows.view().dtype(), dtype);
      }
      EXPECT_TRUE(layer.attention.qkv.contiguous_rows());
      const Tensor& down = layer.moe ? layer.experts.experts[3].down.view() : layer.mlp.down.view();
      EXPECT_EQ(down.dtype(), dtype);
      EXPECT_TRUE(layer.moe ? layer.experts.experts[3].down.borrowed() : layer.mlp.down.borrowed());
      EXPECT_TRUE(w->embedding.borrowed());
      EXPECT_EQ(w->embedding.view().dtype(), dtype);

      const std::vector<float> exact = PromptLogits(gguf, {.weight_dtype = DType::kF32});
      LoadOptions f32_activations;
      f32_activations.ggml_activations = kernels::GgmlActivations::kF32;
      const std::vector<float> f32 = PromptLogits(gguf, f32_activations);
      ASSERT_EQ(f32.size(), exact.size());
      EXPECT_EQ(std::memcmp(f32.data(), exact.data(), exact.size() * sizeof(float)), 0)
          << arch.name << " " << DTypeName(dtype);
      if (std::string(arch.name) == "gguf_qwen3") {  // a tiny MoE's routers flip on less
        const std::vector<float> int8 = PromptLogits(gguf);
        ASSERT_EQ(int8.size(), exact.size());
        EXPECT_LT(
            testing::RowRelError(int8.data(), exact.data(), static_cast<int64_t>(exact.size())),
            0.03)
            << DTypeName(dtype);
      }
    }
  }
}

// What the memory plan counts for a file used as stored is what its load holds, views included,
// on one rank and on each of two.
TEST(GgufBlockFormatsTest, StoredWeightBytesAreWhatTheLoadHolds) {
  const std::string& dir = testing::MadeModel("gguf_qwen3moe", kQwen3MoeFlags);
  for (DType dtype : {DType::kGgmlQ4_K, DType::kGgmlQ8_0}) {
    Result<ModelFiles> files = OpenModelFiles(GgufOf(dir, dtype));
    ASSERT_TRUE(files.ok());
    for (ShardSpec spec : {ShardSpec{}, ShardSpec{0, 2, false}, ShardSpec{1, 2, true}}) {
      Result<ShardLayout> shard = MakeShardLayout(files->config, spec);
      ASSERT_TRUE(shard.ok());
      Result<ModelWeights> w = LoadWeights(files->config, *shard, files->checkpoint, std::nullopt);
      if (!w.ok()) {  // Q4_K's super-blocks do not split at half a row
        EXPECT_EQ(dtype, DType::kGgmlQ4_K) << w.status().ToString();
        continue;
      }
      Result<WeightBytes> planned = StoredWeightBytes(files->config, *shard, files->checkpoint);
      ASSERT_TRUE(planned.ok()) << planned.status().ToString();
      const WeightBytes held = CountWeightBytes(*w);
      EXPECT_EQ(planned->bytes, held.bytes) << DTypeName(dtype) << " rank " << spec.rank;
      EXPECT_GT(held.total(), 0);
    }
  }
}

// Ranks keep whole blocks: a --tp split inside a Q4_K super-block (256 weights) is refused naming
// the tensor; Q8_0's blocks of 32 split at the same place load.
TEST(GgufBlockFormatsTest, TensorParallelSplitsKeepBlocksWhole) {
  const std::string& dir = testing::MadeModel("gguf_qwen3moe", kQwen3MoeFlags);
  const Result<ModelWeights> k = Load(GgufOf(dir, DType::kGgmlQ4_K), DType::kQ8, {0, 2, false});
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("o_proj.weight' is q4_k"), std::string::npos)
      << k.status().message();
  EXPECT_NE(k.status().message().find("splits a block"), std::string::npos);
  for (int rank : {0, 1}) {
    const Result<ModelWeights> q = Load(GgufOf(dir, DType::kGgmlQ8_0), DType::kQ8, {rank, 2, false});
    EXPECT_TRUE(q.ok()) << q.status().ToString();
    // Used in place, a rank's whole rows are views of the file; its half of each o_proj row a
    // copy of those blocks.
    const Result<ModelWeights> s = Load(GgufOf(dir, DType::kGgmlQ8_0), std::nullopt, {rank, 2, false});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const AttentionWeights& a = s->layers[0].attention;
    for (const WeightMatrix::Block& b : a.qkv.blocks()) EXPECT_TRUE(b.rows.borrowed());
    EXPECT_FALSE(a.o_proj.borrowed());
    EXPECT_EQ(a.o_proj.view().dtype(), DType::kGgmlQ8_0);
    Result<ModelFiles> files = OpenModelFiles(GgufOf(dir, DType::kGgmlQ8_0));
    ASSERT_TRUE(files.ok());
    const io::SafetensorsTensor* o = files->checkpoint.Find("model.layers.0.self_attn.o_proj.weight");
    ASSERT_NE(o, nullptr);
    const int64_t H = o->shape[0], K = o->shape[1];
    const size_t half = StoredRowBytes(DType::kGgmlQ8_0, K / 2);
    for (int64_t r = 0; r < H; ++r) {
      ASSERT_EQ(std::memcmp(static_cast<const std::byte*>(a.o_proj.view().data()) + r * half,
                            o->bytes.data() + r * StoredRowBytes(DType::kGgmlQ8_0, K) + rank * half,
                            half),
                0)
          << "row " << r;
    }
  }
}

// The ids generation stops on: eos, eot and eom, and the control tokens that end a turn or a text
// (what a folder's generation_config.json adds, which a GGUF file does not hold).
TEST(GgufCheckpointTest, StopsOnTheTurnAndTextEnds) {
  const std::string& dir = testing::MadeModel("gguf_qwen3moe", kQwen3MoeFlags);
  io::GgufWriter w = WriterOf(dir, DType::kGgmlQ8_0);
  nlohmann::json tokens = nlohmann::json::array(), types = nlohmann::json::array();
  for (int i = 0; i < 512; ++i) {
    tokens.push_back(i == 500 ? "<|endoftext|>" : i == 501 ? "<|im_end|>" : fmt::format("t{}", i));
    types.push_back(i >= 500 ? 3 : 1);
  }
  tokens[502] = "<|endoftext|>";  // the same text, not a control token: not a stop
  types[502] = 1;
  w.SetArray("tokenizer.ggml.tokens", io::GgufType::kString, tokens);
  w.SetArray("tokenizer.ggml.token_type", io::GgufType::kInt32, types);
  w.SetU32("tokenizer.ggml.eos_token_id", 501);
  w.SetU32("tokenizer.ggml.eot_token_id", 7);
  const std::string path = dir + "/stops.gguf";
  ASSERT_TRUE(w.Write(path).ok());
  Result<io::ModelConfig> c = LoadModelConfigAt(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{501, 7, 500}));
}

// Every architecture moeserve runs reads and writes as GGUF under llama.cpp's name for it.
TEST(GgufCheckpointTest, EveryArchitectureHasItsGgufName) {
  EXPECT_EQ(GgufArchitectureName(io::Architecture::kQwen3Next), "qwen3next");
  EXPECT_EQ(GgufArchitectureName(io::Architecture::kQwen3_5Moe), "qwen35moe");
  EXPECT_EQ(GgufArchitectureName(io::Architecture::kQwen3Moe), "qwen3moe");
  EXPECT_EQ(GgufArchitectureName(io::Architecture::kQwen3), "qwen3");
  EXPECT_EQ(GgufArchitectureName(io::Architecture::kLlama), "llama");
}

// Files that lie about the model are refused naming the key or tensor.
TEST(GgufCheckpointTest, RefusesMalformedModelsNamingTheField) {
  const std::string& dir = testing::MadeModel("gguf_qwen3moe", kQwen3MoeFlags);
  auto error = [&](const std::function<void(io::GgufWriter&)>& edit) {
    return OpenErrorAfter(dir, edit);
  };
  using ::testing::HasSubstr;
  EXPECT_THAT(error([](io::GgufWriter& w) { w.SetString("general.architecture", "falcon"); }),
              HasSubstr("general.architecture 'falcon' is not one moeserve reads"));
  EXPECT_THAT(error([](io::GgufWriter& w) { w.SetU32("qwen3moe.block_count", 3); }),
              HasSubstr("no tensor blk.2.attn_norm.weight"));
  EXPECT_THAT(error([](io::GgufWriter& w) { w.SetU32("qwen3moe.embedding_length", 0); }),
              HasSubstr("qwen3moe.embedding_length is 0, outside"));
  EXPECT_THAT(error([](io::GgufWriter& w) { w.SetString("qwen3moe.block_count", "two"); }),
              HasSubstr("qwen3moe.block_count is \"two\", not an integer"));
  EXPECT_THAT(error([](io::GgufWriter& w) {
                w.Set("qwen3moe.expert_count",
                      {io::GgufType::kUint64, io::GgufType::kUint8, uint64_t{1} << 63});
              }),
              HasSubstr("qwen3moe.expert_count is 9223372036854775808, outside"));
  EXPECT_THAT(error([](io::GgufWriter& w) { w.SetU32("qwen3moe.expert_used_count", 9); }),
              HasSubstr("expert_used_count is 9, outside [1, 8]"));
  EXPECT_THAT(error([](io::GgufWriter& w) { w.SetU32("tokenizer.ggml.eos_token_id", 512); }),
              HasSubstr("tokenizer.ggml.eos_token_id is 512, not a token id"));
  EXPECT_THAT(error([](io::GgufWriter& w) { w.SetString("qwen3moe.rope.scaling.type", "yarn"); }),
              HasSubstr("rope scaling"));
  EXPECT_THAT(error([](io::GgufWriter& w) { w.RemoveTensor("blk.1.ffn_up_exps.weight"); }),
              HasSubstr("no tensor blk.1.ffn_up_exps.weight (for model.layers.1.mlp.experts.0"));
  EXPECT_THAT(error([](io::GgufWriter& w) {
                w.RemoveTensor("blk.0.attn_q.weight");
                w.AddTensor("blk.0.attn_q.weight", {256, 128}, 10, std::string(128 * 84, '\0'));
              }),
              HasSubstr("tensor blk.0.attn_q.weight has type Q2_K, which moeserve does not read"));
  EXPECT_THAT(error([](io::GgufWriter& w) {
                w.RemoveTensor("blk.0.attn_q.weight");
                w.AddTensor("blk.0.attn_q.weight", {256, 32}, 0, std::string(256 * 32 * 4, '\0'));
              }),
              HasSubstr("blk.0.attn_q.weight has shape [32, 256] (ne reversed), but the config implies"));
}

}  // namespace
}  // namespace moeserve::model
