#include "kernels/ref/gated_delta_rule_ref.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/check.h"
#include "kernels/gated_delta_rule.h"

namespace moeserve::kernels::ref {

void GatedDeltaRuleStep(float* S, const float* q, const float* k, const float* v, float g,
                        float beta, int64_t dk, int64_t dv, float* out) {
  // Spec §3.c.5, one statement at a time. Values are stored in f32 between statements, as in the
  // torch reference; only the sums over i run in double.
  const float decay = std::exp(g);
  for (int64_t i = 0; i < dk * dv; ++i) S[i] *= decay;

  // delta[j] = beta * (v[j] - m[j]) with m = S^T k.
  std::vector<float> delta(static_cast<size_t>(dv));
  for (int64_t j = 0; j < dv; ++j) {
    double m = 0.0;
    for (int64_t i = 0; i < dk; ++i) m += static_cast<double>(S[i * dv + j]) * k[i];
    delta[j] = beta * (v[j] - static_cast<float>(m));
  }

  // S += k (x) delta.
  for (int64_t i = 0; i < dk; ++i) {
    for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += k[i] * delta[j];
  }

  // out = S^T q with the updated S.
  for (int64_t j = 0; j < dv; ++j) {
    double o = 0.0;
    for (int64_t i = 0; i < dk; ++i) o += static_cast<double>(S[i * dv + j]) * q[i];
    out[j] = static_cast<float>(o);
  }
}

void GatedDeltaRuleChunk(float* S, const float* q, const float* k, int64_t qk_stride,
                         const float* v, int64_t v_stride, const float* g, const float* beta,
                         int64_t T, int64_t dk, int64_t dv, float* out, int64_t out_stride) {
  // Spec §3.c.6 for one chunk of C = T rows. Padding the chunk to 64 rows with zeros (as HF does)
  // changes nothing for the real rows or for S, so the padded rows are never formed. Matrices are
  // f32 between steps, as in torch; each matrix-product sum runs in double.
  CHECK_GE(T, 0);
  CHECK_LE(T, kGdnChunkSize);
  if (T == 0) return;
  const int64_t C = T;
  auto Q = [&](int64_t t, int64_t r) { return q[t * qk_stride + r]; };
  auto K = [&](int64_t t, int64_t r) { return k[t * qk_stride + r]; };

  // k_beta = k * beta, v_beta = v * beta (row-wise): [C, dk] and [C, dv].
  std::vector<float> kb(C * dk), vb(C * dv);
  for (int64_t t = 0; t < C; ++t) {
    for (int64_t r = 0; r < dk; ++r) kb[t * dk + r] = K(t, r) * beta[t];
    for (int64_t j = 0; j < dv; ++j) vb[t * dv + j] = v[t * v_stride + j] * beta[t];
  }

  // gamma = cumsum(g) [C]; L[i][j] = exp(gamma[i] - gamma[j]) for i >= j, else 0: [C, C].
  std::vector<float> gamma(C);
  float running = 0.0f;
  for (int64_t t = 0; t < C; ++t) gamma[t] = running += g[t];
  std::vector<float> L(C * C, 0.0f);
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t j = 0; j <= i; ++j) L[i * C + j] = std::exp(gamma[i] - gamma[j]);
  }

  // A = -(k_beta k^T * L) with the diagonal and upper triangle zero: [C, C].
  std::vector<float> A(C * C, 0.0f);
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t j = 0; j < i; ++j) {
      double dot = 0.0;
      for (int64_t r = 0; r < dk; ++r) dot += static_cast<double>(kb[i * dk + r]) * K(j, r);
      A[i * C + j] = -(static_cast<float>(dot) * L[i * C + j]);
    }
  }

  // for i in 1..C-1: A[i, :i] = A[i, :i] + A[i, :i] @ A[:i, :i] (the row is the one before this
  // iteration; rows above it are already final).
  std::vector<float> row(C);
  for (int64_t i = 1; i < C; ++i) {
    for (int64_t j = 0; j < i; ++j) row[j] = A[i * C + j];
    for (int64_t j = 0; j < i; ++j) {
      double sum = 0.0;
      for (int64_t r = 0; r < i; ++r) sum += static_cast<double>(row[r]) * A[r * C + j];
      A[i * C + j] = row[j] + static_cast<float>(sum);
    }
  }
  // Tm = A + I.
  for (int64_t i = 0; i < C; ++i) A[i * C + i] = 1.0f;

  // U = Tm @ v_beta [C, dv]; W = Tm @ (k_beta * exp(gamma)) [C, dk].
  std::vector<float> kbg(C * dk);
  for (int64_t t = 0; t < C; ++t) {
    const float eg = std::exp(gamma[t]);
    for (int64_t r = 0; r < dk; ++r) kbg[t * dk + r] = kb[t * dk + r] * eg;
  }
  std::vector<float> U(C * dv), W(C * dk);
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t j = 0; j < dv; ++j) {
      double sum = 0.0;
      for (int64_t t = 0; t < C; ++t) sum += static_cast<double>(A[i * C + t]) * vb[t * dv + j];
      U[i * dv + j] = static_cast<float>(sum);
    }
    for (int64_t r = 0; r < dk; ++r) {
      double sum = 0.0;
      for (int64_t t = 0; t < C; ++t) sum += static_cast<double>(A[i * C + t]) * kbg[t * dk + r];
      W[i * dk + r] = static_cast<float>(sum);
    }
  }

  // Aqk = (q k^T * L) with the strict upper triangle zero: [C, C].
  std::vector<float> Aqk(C * C, 0.0f);
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      double dot = 0.0;
      for (int64_t r = 0; r < dk; ++r) dot += static_cast<double>(Q(i, r)) * K(j, r);
      Aqk[i * C + j] = static_cast<float>(dot) * L[i * C + j];
    }
  }

  // v_new = U - W @ S: [C, dv].
  std::vector<float> v_new(C * dv);
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t j = 0; j < dv; ++j) {
      double sum = 0.0;
      for (int64_t r = 0; r < dk; ++r) sum += static_cast<double>(W[i * dk + r]) * S[r * dv + j];
      v_new[i * dv + j] = U[i * dv + j] - static_cast<float>(sum);
    }
  }

  // o = (q * exp(gamma)) @ S + Aqk @ v_new: [C, dv], with S as it was before this chunk.
  std::vector<float> qg(C * dk);
  for (int64_t t = 0; t < C; ++t) {
    const float eg = std::exp(gamma[t]);
    for (int64_t r = 0; r < dk; ++r) qg[t * dk + r] = Q(t, r) * eg;
  }
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t j = 0; j < dv; ++j) {
      double inter = 0.0;
      for (int64_t r = 0; r < dk; ++r) inter += static_cast<double>(qg[i * dk + r]) * S[r * dv + j];
      double intra = 0.0;
      for (int64_t t = 0; t <= i; ++t) {
        intra += static_cast<double>(Aqk[i * C + t]) * v_new[t * dv + j];
      }
      out[i * out_stride + j] = static_cast<float>(inter) + static_cast<float>(intra);
    }
  }

  // S = S * exp(gamma_last) + (k * exp(gamma_last - gamma))^T @ v_new: [dk, dv].
  const float g_last = gamma[C - 1];
  const float e_last = std::exp(g_last);
  std::vector<float> kd(C * dk);
  for (int64_t t = 0; t < C; ++t) {
    const float f = std::exp(g_last - gamma[t]);
    for (int64_t r = 0; r < dk; ++r) kd[t * dk + r] = K(t, r) * f;
  }
  for (int64_t r = 0; r < dk; ++r) {
    for (int64_t j = 0; j < dv; ++j) {
      double sum = 0.0;
      for (int64_t t = 0; t < C; ++t)
        sum += static_cast<double>(kd[t * dk + r]) * v_new[t * dv + j];
      S[r * dv + j] = S[r * dv + j] * e_last + static_cast<float>(sum);
    }
  }
}

}  // namespace moeserve::kernels::ref
