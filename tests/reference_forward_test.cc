// Qwen3-MoE, dense Qwen3 and Llama models made by `moeserve make-model`, run by CausalLm and by a
// plain reference forward written here in double precision straight from the Hugging Face
// modelling code (full causal attention over the whole prompt, no cache, no kernels).
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/causal_lm.h"
#include "core/test_paths.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using Matrix = std::vector<double>;  // row-major

class ReferenceModel {
 public:
  ReferenceModel(const io::ModelConfig& c, const io::SafetensorsCheckpoint& ckpt)
      : c_(c), ckpt_(ckpt) {}

  // Logits [T, V] for every position of `tokens`.
  Matrix Forward(const std::vector<int32_t>& tokens) const {
    const int64_t T = tokens.size(), H = c_.hidden_size;
    Matrix x(T * H);
    const Matrix embed = Get("model.embed_tokens.weight");
    for (int64_t t = 0; t < T; ++t) {
      std::copy(embed.begin() + tokens[t] * H, embed.begin() + (tokens[t] + 1) * H,
                x.begin() + t * H);
    }
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      const std::string p = fmt::format("model.layers.{}.", l);
      Matrix h = RmsNorm(x, T, H, Get(p + "input_layernorm.weight"));
      Add(x, AttentionBlock(h, T, p + "self_attn."));
      h = RmsNorm(x, T, H, Get(p + "post_attention_layernorm.weight"));
      Add(x, c_.IsMoeLayer(l) ? Moe(h, T, p + "mlp.") : Mlp(h, T, p + "mlp."));
    }
    const Matrix hf = RmsNorm(x, T, H, Get("model.norm.weight"));
    return Linear(hf, T, c_.tie_word_embeddings ? embed : Get("lm_head.weight"), c_.vocab_size);
  }

 private:
  Matrix Get(const std::string& name) const {
    const io::SafetensorsTensor* t = ckpt_.Find(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<float> f(t->numel());
    ConvertToF32(t->dtype, t->bytes.data(), f.data(), f.size());
    return Matrix(f.begin(), f.end());
  }
  static void Add(Matrix& x, const Matrix& y) {
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  }
  // Plain RMSNorm (Qwen3 / Llama: weight as stored) over rows of n.
  Matrix RmsNorm(const Matrix& x, int64_t rows, int64_t n, const Matrix& w) const {
    Matrix y(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < n; ++i) ss += x[r * n + i] * x[r * n + i];
      const double inv = 1.0 / std::sqrt(ss / n + c_.rms_norm_eps);
      for (int64_t i = 0; i < n; ++i) y[r * n + i] = x[r * n + i] * inv * w[i];
    }
    return y;
  }
  // y [T, out] = x [T, in] W^T with W [out, in].
  static Matrix Linear(const Matrix& x, int64_t T, const Matrix& W, int64_t out) {
    const int64_t in = static_cast<int64_t>(W.size()) / out;
    Matrix y(T * out);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t o = 0; o < out; ++o) {
        double s = 0;
        for (int64_t i = 0; i < in; ++i) s += x[t * in + i] * W[o * in + i];
        y[t * out + o] = s;
      }
    }
    return y;
  }
  static double Silu(double v) { return v / (1.0 + std::exp(-v)); }

  Matrix AttentionBlock(const Matrix& h, int64_t T, const std::string& p) const {
    const int64_t H = c_.hidden_size, nh = c_.num_attention_heads, nkv = c_.num_key_value_heads;
    const int64_t hd = c_.head_dim, half = c_.rotary_dim / 2;
    Matrix q = Linear(h, T, Get(p + "q_proj.weight"), nh * hd);
    Matrix k = Linear(h, T, Get(p + "k_proj.weight"), nkv * hd);
    const Matrix v = Linear(h, T, Get(p + "v_proj.weight"), nkv * hd);
    if (c_.qk_norm) {
      q = RmsNorm(q, T * nh, hd, Get(p + "q_norm.weight"));
      k = RmsNorm(k, T * nkv, hd, Get(p + "k_norm.weight"));
    }
    // NeoX rotate_half RoPE on the first rotary_dim dims of every head.
    auto rope = [&](Matrix& m, int64_t heads) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t hh = 0; hh < heads; ++hh) {
          double* x = &m[(t * heads + hh) * hd];
          for (int64_t j = 0; j < half; ++j) {
            const double angle = t * std::pow(c_.rope_theta, -2.0 * j / c_.rotary_dim);
            const double a = x[j], b = x[j + half];
            x[j] = a * std::cos(angle) - b * std::sin(angle);
            x[j + half] = b * std::cos(angle) + a * std::sin(angle);
          }
        }
      }
    };
    rope(q, nh);
    rope(k, nkv);
    Matrix o(T * nh * hd, 0.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t hh = 0; hh < nh; ++hh) {
        const int64_t kh = hh / (nh / nkv);
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int64_t u = 0; u <= t; ++u) {
          double d = 0;
          for (int64_t i = 0; i < hd; ++i) d += q[(t * nh + hh) * hd + i] * k[(u * nkv + kh) * hd + i];
          s[u] = d * scale;
          mx = std::max(mx, s[u]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (int64_t u = 0; u <= t; ++u) {
          for (int64_t i = 0; i < hd; ++i) {
            o[(t * nh + hh) * hd + i] += s[u] / sum * v[(u * nkv + kh) * hd + i];
          }
        }
      }
    }
    return Linear(o, T, Get(p + "o_proj.weight"), H);
  }

  Matrix SwiGlu(const Matrix& h, int64_t T, const std::string& p, int64_t width) const {
    const Matrix g = Linear(h, T, Get(p + "gate_proj.weight"), width);
    const Matrix u = Linear(h, T, Get(p + "up_proj.weight"), width);
    Matrix a(T * width);
    for (size_t i = 0; i < a.size(); ++i) a[i] = Silu(g[i]) * u[i];
    return Linear(a, T, Get(p + "down_proj.weight"), c_.hidden_size);
  }
  Matrix Mlp(const Matrix& h, int64_t T, const std::string& p) const {
    return SwiGlu(h, T, p, c_.intermediate_size);
  }
  Matrix Moe(const Matrix& h, int64_t T, const std::string& p) const {
    const int64_t H = c_.hidden_size, E = c_.num_experts, k = c_.num_experts_per_tok;
    const Matrix logits = Linear(h, T, Get(p + "gate.weight"), E);
    Matrix out(T * H, 0.0);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> prob(E);
      const double mx = *std::max_element(logits.begin() + t * E, logits.begin() + (t + 1) * E);
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += (prob[e] = std::exp(logits[t * E + e] - mx));
      for (double& pr : prob) pr /= sum;
      std::vector<int64_t> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return prob[a] > prob[b]; });
      double top = 0;
      for (int64_t j = 0; j < k; ++j) top += prob[order[j]];
      const Matrix row(h.begin() + t * H, h.begin() + (t + 1) * H);
      for (int64_t j = 0; j < k; ++j) {
        const double w = c_.norm_topk_prob ? prob[order[j]] / top : prob[order[j]];
        const Matrix y = SwiGlu(row, 1, fmt::format("{}experts.{}.", p, order[j]),
                                c_.moe_intermediate_size);
        for (int64_t i = 0; i < H; ++i) out[t * H + i] += w * y[i];
      }
    }
    return out;
  }

  const io::ModelConfig& c_;
  const io::SafetensorsCheckpoint& ckpt_;
};

double RowRelError(const float* a, const double* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

class ReferenceForwardTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceForwardTest, MatchesThePlainForwardAndStepsEqualPrefill) {
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("moeserve_ref_{}_{}", GetParam(), getpid());
  const std::string cmd = fmt::format("{} make-model --arch {} --preset tiny --seed 3 --out {}",
                                      MOESERVE_BINARY, GetParam(), dir.string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  Result<io::ModelConfig> config = io::LoadModelConfig(dir.string());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  Result<io::SafetensorsCheckpoint> ckpt = io::SafetensorsCheckpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok());
  Result<std::unique_ptr<model::CausalLm>> lm = model::CausalLm::Load(dir.string(), {});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();

  std::vector<int32_t> tokens(40);
  std::mt19937 rng(11);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 500);
  const Matrix expected = ReferenceModel(*config, *ckpt).Forward(tokens);
  const int64_t T = tokens.size(), V = config->vocab_size;

  model::ModelCache cache(*config, model::CacheSizes{4, 16, 1});
  std::vector<int32_t> table = {2, 0, 3, 1};
  std::vector<float> logits;
  (*lm)->Forward({tokens.data(), T, 0, table.data(), 0}, cache, true, nullptr, &logits);
  double worst = 0;
  for (int64_t t = 0; t < T; ++t) {
    worst = std::max(worst, RowRelError(&logits[t * V], &expected[t * V], V));
  }
  EXPECT_LT(worst, 1e-4);

  model::ModelCache step_cache(*config, model::CacheSizes{4, 16, 1});
  double step_worst = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> row;
    (*lm)->Forward({&tokens[t], 1, t, table.data(), 0}, step_cache, false, nullptr, &row);
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < V; ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(row[i] - logits[t * V + i])));
      scale = std::max(scale, static_cast<double>(std::fabs(logits[t * V + i])));
    }
    step_worst = std::max(step_worst, diff / scale);
  }
  EXPECT_LT(step_worst, 1e-5);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Architectures, ReferenceForwardTest,
                         ::testing::Values("qwen3_moe", "qwen3", "llama"));

}  // namespace
}  // namespace moeserve
