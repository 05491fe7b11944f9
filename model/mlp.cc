#include "model/mlp.h"

#include "kernels/activations.h"
#include "kernels/matmul.h"
#include "model/layer_util.h"

namespace moeserve::model {
namespace {

// out [n, H] = down(silu(gate x) * up x) for n rows of x (row stride x_stride); `mid` is scratch
// of [n, 2 I].
void SwiGluRows(const LayerContext& ctx, const SwiGluWeights& w, const float* x, int64_t x_stride,
                int64_t n, std::vector<float>& mid, float* out) {
  const int64_t I = w.width(), H = ctx.config.hidden_size;
  float* m = Grow(mid, n * 2 * I);
  MatMul(ctx, x, x_stride, n, w.gate_up, m, 2 * I);  // [n, gate | up]
  for (int64_t i = 0; i < n; ++i) kernels::SwiGlu(m + i * 2 * I, m + i * 2 * I + I, m + i * 2 * I, I);
  MatMul(ctx, m, 2 * I, n, w.down, out, H);
}

}  // namespace

void SwiGluMlp(const LayerContext& ctx, const SwiGluWeights& w, const float* x, int64_t T,
               float* out) {
  SwiGluRows(ctx, w, x, ctx.config.hidden_size, T, ctx.scratch.expert_mid, out);
}

}  // namespace moeserve::model
