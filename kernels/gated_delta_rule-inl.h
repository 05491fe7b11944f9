// Per-target bodies of the gated delta rule (kernels/gated_delta_rule.h), for inclusion from
// foreach_target translation units: kernels/gated_delta_rule.cc dispatches to them, and
// kernels/gated_delta_rule_test.cc calls them on every compiled target.
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"
#include "kernels/gated_delta_rule.h"

#if defined(MOESERVE_KERNELS_GATED_DELTA_RULE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_GATED_DELTA_RULE_INL_H_
#undef MOESERVE_KERNELS_GATED_DELTA_RULE_INL_H_
#else
#define MOESERVE_KERNELS_GATED_DELTA_RULE_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {

// Helpers live in their own namespace: other kernels' -inl.h files share HWY_NAMESPACE, and
// inline functions of the same name there would silently merge at link time.
namespace gdn {

namespace hn = hwy::HWY_NAMESPACE;

// ---------------------------------------------------------------------------------------------
// One token (docs/spec/model.md §3.c.5). S is [dk][dv] row-major, so a row of S is dv-contiguous
// and the SIMD lanes run over the value dim j. Every column j is independent of the others:
//   m[j] = decay * sum_i S[i][j] k[i]          (pass 1: reads S)
//   delta[j] = beta * (v[j] - m[j])
//   S[i][j] = decay * S[i][j] + k[i] delta[j]; out[j] = sum_i S[i][j] q[i]   (pass 2: reads and
//                                                                             writes S)
// So the columns are processed in strips of up to 4 vectors: both passes run over one strip
// before the next, with m, delta and out in registers, and the strip (dk rows of at most 256
// bytes with AVX-512) is still in L1 when pass 2 reads it again. S then moves through memory
// once per token (one read, one write), which is what matters at decode, where a layer's states
// do not stay in cache from one token to the next.

// Columns [j0, j0 + kVecs * N) of one step. Pass 1 keeps even and odd rows in separate
// accumulators: 2 * kVecs independent FMA chains instead of kVecs hide the FMA latency.
template <size_t kVecs, class D>
HWY_INLINE void StepStrip(D d, float* HWY_RESTRICT S, const float* HWY_RESTRICT q,
                          const float* HWY_RESTRICT k, const float* HWY_RESTRICT v, float decay,
                          float beta, size_t dk, size_t dv, size_t j0, float* HWY_RESTRICT out) {
  using V = hn::Vec<D>;
  const size_t N = hn::Lanes(d);
  float* HWY_RESTRICT col = S + j0;

  V m_even[kVecs], m_odd[kVecs];
  for (size_t u = 0; u < kVecs; ++u) m_even[u] = m_odd[u] = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 <= dk; i += 2) {
    const V k0 = hn::Set(d, k[i]);
    const V k1 = hn::Set(d, k[i + 1]);
    const float* HWY_RESTRICT row0 = col + i * dv;
    const float* HWY_RESTRICT row1 = row0 + dv;
    for (size_t u = 0; u < kVecs; ++u) {
      m_even[u] = hn::MulAdd(hn::LoadU(d, row0 + u * N), k0, m_even[u]);
      m_odd[u] = hn::MulAdd(hn::LoadU(d, row1 + u * N), k1, m_odd[u]);
    }
  }
  if (i < dk) {
    const V k0 = hn::Set(d, k[i]);
    const float* HWY_RESTRICT row0 = col + i * dv;
    for (size_t u = 0; u < kVecs; ++u) {
      m_even[u] = hn::MulAdd(hn::LoadU(d, row0 + u * N), k0, m_even[u]);
    }
  }

  // delta = beta * (v - decay * m): decay is applied to the sum rather than to every S[i][j]
  // first, which is the same up to rounding and leaves pass 1 read-only.
  const V vdecay = hn::Set(d, decay);
  const V vbeta = hn::Set(d, beta);
  V delta[kVecs], o[kVecs];
  for (size_t u = 0; u < kVecs; ++u) {
    const V m = hn::Add(m_even[u], m_odd[u]);
    delta[u] = hn::Mul(vbeta, hn::NegMulAdd(vdecay, m, hn::LoadU(d, v + j0 + u * N)));
    o[u] = hn::Zero(d);
  }

  for (i = 0; i < dk; ++i) {
    const V ki = hn::Set(d, k[i]);
    const V qi = hn::Set(d, q[i]);
    float* HWY_RESTRICT row = col + i * dv;
    for (size_t u = 0; u < kVecs; ++u) {
      const V s = hn::MulAdd(vdecay, hn::LoadU(d, row + u * N), hn::Mul(ki, delta[u]));
      hn::StoreU(s, d, row + u * N);
      o[u] = hn::MulAdd(s, qi, o[u]);
    }
  }
  for (size_t u = 0; u < kVecs; ++u) hn::StoreU(o[u], d, out + j0 + u * N);
}

// Column j past the last whole vector (dv not a multiple of the lane count): the same two
// passes in scalar code.
HWY_INLINE void StepColumn(float* HWY_RESTRICT S, const float* HWY_RESTRICT q,
                           const float* HWY_RESTRICT k, const float* HWY_RESTRICT v, float decay,
                           float beta, size_t dk, size_t dv, size_t j, float* HWY_RESTRICT out) {
  float m = 0.0f;
  for (size_t i = 0; i < dk; ++i) m += S[i * dv + j] * k[i];
  const float delta = beta * (v[j] - decay * m);
  float o = 0.0f;
  for (size_t i = 0; i < dk; ++i) {
    const float s = decay * S[i * dv + j] + k[i] * delta;
    S[i * dv + j] = s;
    o += s * q[i];
  }
  out[j] = o;
}

// ---------------------------------------------------------------------------------------------
// Chunked form (docs/spec/model.md §3.c.6). Every step there is a small matrix product, so the
// chunk is one register-blocked kernel, MatMul, applied eight times, plus O(T^2) and O(T * dk)
// glue.

// C[r][j] = c_scale * C[r][j] + sum_{k < K} X[r * xr + k * xc] * B[k * bs + j] for kRows rows
// r and the kVecs * N columns j starting at B and C. X is read as broadcast scalars, so any
// strides work (row-major X, or a transposed view).
template <size_t kRows, size_t kVecs, class D>
HWY_INLINE void MatMulTile(D d, const float* HWY_RESTRICT X, size_t xr, size_t xc,
                           const float* HWY_RESTRICT B, size_t bs, size_t K, float c_scale,
                           float* HWY_RESTRICT C, size_t cs) {
  using V = hn::Vec<D>;
  const size_t N = hn::Lanes(d);
  V acc[kRows][kVecs];
  // c_scale == 0 must not read C: it may be uninitialized (and 0 * NaN is NaN).
  const V vscale = hn::Set(d, c_scale);
  for (size_t r = 0; r < kRows; ++r) {
    for (size_t u = 0; u < kVecs; ++u) {
      if (c_scale == 0.0f) {
        acc[r][u] = hn::Zero(d);
      } else if (c_scale == 1.0f) {
        acc[r][u] = hn::LoadU(d, C + r * cs + u * N);
      } else {
        acc[r][u] = hn::Mul(vscale, hn::LoadU(d, C + r * cs + u * N));
      }
    }
  }
  for (size_t k = 0; k < K; ++k) {
    V b[kVecs];
    for (size_t u = 0; u < kVecs; ++u) b[u] = hn::LoadU(d, B + k * bs + u * N);
    for (size_t r = 0; r < kRows; ++r) {
      const V x = hn::Set(d, X[r * xr + k * xc]);
      for (size_t u = 0; u < kVecs; ++u) acc[r][u] = hn::MulAdd(x, b[u], acc[r][u]);
    }
  }
  for (size_t r = 0; r < kRows; ++r) {
    for (size_t u = 0; u < kVecs; ++u) hn::StoreU(acc[r][u], d, C + r * cs + u * N);
  }
}

// kRows rows of C over columns [0, n): tiles of two vectors, then one, then scalar columns.
template <size_t kRows, class D>
HWY_INLINE void MatMulRows(D d, const float* HWY_RESTRICT X, size_t xr, size_t xc,
                           const float* HWY_RESTRICT B, size_t bs, size_t K, size_t n,
                           float c_scale, float* HWY_RESTRICT C, size_t cs) {
  const size_t N = hn::Lanes(d);
  size_t j = 0;
  for (; j + 2 * N <= n; j += 2 * N) {
    MatMulTile<kRows, 2>(d, X, xr, xc, B + j, bs, K, c_scale, C + j, cs);
  }
  if (j + N <= n) {
    MatMulTile<kRows, 1>(d, X, xr, xc, B + j, bs, K, c_scale, C + j, cs);
    j += N;
  }
  for (; j < n; ++j) {
    for (size_t r = 0; r < kRows; ++r) {
      float sum = c_scale == 0.0f ? 0.0f : c_scale * C[r * cs + j];
      for (size_t k = 0; k < K; ++k) sum += X[r * xr + k * xc] * B[k * bs + j];
      C[r * cs + j] = sum;
    }
  }
}

// C = c_scale * C + X @ B for X [M][K] (element (i, k) at X[i * xr + k * xc]), B [K][N] (row
// stride bs), C [M][N] (row stride cs). Two triangular shortcuts, applied per block of rows
// [i0, i1):
//   x_lower: X[i][k] == 0 for k > i, so k only runs to i1 (the caller must zero X[i][k] for
//            i < k < min(K, i1) -- the block reads them).
//   c_lower: only columns j <= i are wanted. The block computes columns up to i1 rounded up to
//            whole vectors (a scalar tail column costs a K-long dependency chain of FMAs, far
//            more than a few wasted lanes), so N must then be a multiple of the lane count; the
//            extra columns get values the caller ignores.
template <class D>
HWY_INLINE void MatMul(D d, size_t M, size_t K, size_t N, const float* HWY_RESTRICT X, size_t xr,
                       size_t xc, const float* HWY_RESTRICT B, size_t bs, float c_scale,
                       float* HWY_RESTRICT C, size_t cs, bool x_lower, bool c_lower) {
  constexpr size_t kRows = 4;
  const size_t lanes = hn::Lanes(d);
  const auto columns = [&](size_t i1) {
    return c_lower ? std::min(N, (i1 + lanes - 1) / lanes * lanes) : N;
  };
  size_t i = 0;
  for (; i + kRows <= M; i += kRows) {
    const size_t k_end = x_lower ? std::min(K, i + kRows) : K;
    MatMulRows<kRows>(d, X + i * xr, xr, xc, B, bs, k_end, columns(i + kRows), c_scale, C + i * cs,
                      cs);
  }
  for (; i < M; ++i) {
    const size_t k_end = x_lower ? std::min(K, i + 1) : K;
    MatMulRows<1>(d, X + i * xr, xr, xc, B, bs, k_end, columns(i + 1), c_scale, C + i * cs, cs);
  }
}

// y[0..n) += a * x[0..n).
template <class D>
HWY_INLINE void Axpy(D d, float a, const float* HWY_RESTRICT x, float* HWY_RESTRICT y, size_t n) {
  const size_t N = hn::Lanes(d);
  const auto va = hn::Set(d, a);
  size_t j = 0;
  for (; j + N <= n; j += N) {
    hn::StoreU(hn::MulAdd(va, hn::LoadU(d, x + j), hn::LoadU(d, y + j)), d, y + j);
  }
  for (; j < n; ++j) y[j] += a * x[j];
}

// The per-thread scratch of the chunk kernel: one aligned block, allocated on a thread's first
// call for dk, dv up to 256 and regrown only if a later call needs more.
class ChunkScratch {
 public:
  float* Get(size_t floats) {
    if (floats > capacity_) {
      buffer_ = hwy::AllocateAligned<float>(floats);
      capacity_ = floats;
    }
    return buffer_.get();
  }

 private:
  hwy::AlignedFreeUniquePtr<float[]> buffer_;
  size_t capacity_ = 0;
};

// Floats of scratch for a chunk with these head dims (layout in GatedDeltaRuleChunkImpl).
inline size_t ChunkScratchFloats(size_t dk, size_t dv) {
  constexpr size_t C = kGdnChunkSize;
  return 2 * C + 2 * C * C + dk * C + 3 * C * dk + 2 * C * dv;
}

}  // namespace gdn

// Inline (not static) so that the copy in each including translation unit is the same entity;
// HWY_EXPORT takes its address, which forces an out-of-line definition per target.
inline void GatedDeltaRuleStepImpl(float* HWY_RESTRICT S, const float* HWY_RESTRICT q,
                                   const float* HWY_RESTRICT k, const float* HWY_RESTRICT v,
                                   float g, float beta, int64_t dk_in, int64_t dv_in,
                                   float* HWY_RESTRICT out) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t dk = static_cast<size_t>(dk_in);
  const size_t dv = static_cast<size_t>(dv_in);
  const float decay = std::exp(g);
  size_t j = 0;
  for (; j + 4 * N <= dv; j += 4 * N) gdn::StepStrip<4>(d, S, q, k, v, decay, beta, dk, dv, j, out);
  switch ((dv - j) / N) {
    case 3:
      gdn::StepStrip<3>(d, S, q, k, v, decay, beta, dk, dv, j, out);
      break;
    case 2:
      gdn::StepStrip<2>(d, S, q, k, v, decay, beta, dk, dv, j, out);
      break;
    case 1:
      gdn::StepStrip<1>(d, S, q, k, v, decay, beta, dk, dv, j, out);
      break;
    default:
      break;
  }
  j += (dv - j) / N * N;
  for (; j < dv; ++j) gdn::StepColumn(S, q, k, v, decay, beta, dk, dv, j, out);
}

inline void GatedDeltaRuleChunkImpl(float* HWY_RESTRICT S, const float* HWY_RESTRICT q,
                                    const float* HWY_RESTRICT k, int64_t qk_stride,
                                    const float* HWY_RESTRICT v, int64_t v_stride,
                                    const float* HWY_RESTRICT g, const float* HWY_RESTRICT beta,
                                    int64_t T_in, int64_t dk_in, int64_t dv_in,
                                    float* HWY_RESTRICT out, int64_t out_stride) {
  namespace hn = hwy::HWY_NAMESPACE;
  CHECK_GE(T_in, 0);
  CHECK_LE(T_in, kGdnChunkSize);
  if (T_in == 0) return;
  const hn::ScalableTag<float> d;
  constexpr size_t C = kGdnChunkSize;  // row stride of the [T][T] and [dk][T] scratch matrices
  const size_t T = static_cast<size_t>(T_in);
  const size_t dk = static_cast<size_t>(dk_in);
  const size_t dv = static_cast<size_t>(dv_in);
  const size_t qs = static_cast<size_t>(qk_stride);
  const size_t vs = static_cast<size_t>(v_stride);
  const size_t os = static_cast<size_t>(out_stride);

  // Scratch (floats): gamma [C], exp(gamma) [C], Aqk [C][C], A [C][C], kT [dk][C],
  // -k_beta*exp(gamma) [C][dk], -W [C][dk], q*exp(gamma) [C][dk], v_beta [C][dv],
  // v_new [C][dv]. Only the first T rows (columns) of each are used.
  thread_local gdn::ChunkScratch scratch;
  float* HWY_RESTRICT gamma =
      scratch.Get(gdn::ChunkScratchFloats(std::max<size_t>(dk, 256), std::max<size_t>(dv, 256)));
  float* HWY_RESTRICT eg = gamma + C;
  float* HWY_RESTRICT Aqk = eg + C;
  float* HWY_RESTRICT A = Aqk + C * C;
  float* HWY_RESTRICT kT = A + C * C;
  float* HWY_RESTRICT nkbg = kT + dk * C;
  float* HWY_RESTRICT nW = nkbg + C * dk;
  float* HWY_RESTRICT qg = nW + C * dk;
  float* HWY_RESTRICT vb = qg + C * dk;
  float* HWY_RESTRICT v_new = vb + C * dv;

  // gamma = cumsum(g), and exp(gamma). Every exponent below is <= 0, since g <= 0: nothing
  // overflows, and exp(gamma) may underflow to 0 only where the true value is below 1e-38.
  float running = 0.0f;
  for (size_t t = 0; t < T; ++t) {
    gamma[t] = running += g[t];
    eg[t] = std::exp(gamma[t]);
  }
  const float g_last = gamma[T - 1];

  // Row-wise scaled copies: v_beta = v * beta, nkbg = -(k * beta) * exp(gamma) (negated so that
  // -W = Tm @ nkbg needs no separate negation), qg = q * exp(gamma); and kT = k^T, so that the
  // q k^T and k k^T products below are row-times-matrix like every other product here. kT's
  // columns [T, T_pad) are zero: those products run over whole vectors of columns.
  const size_t lanes = hn::Lanes(d);
  const size_t T_pad = (T + lanes - 1) / lanes * lanes;  // <= C, a multiple of every lane count
  for (size_t r = 0; r < dk; ++r) std::fill(kT + r * C + T, kT + r * C + T_pad, 0.0f);
  for (size_t t = 0; t < T; ++t) {
    const float* HWY_RESTRICT qt = q + t * qs;
    const float* HWY_RESTRICT kt = k + t * qs;
    const float* HWY_RESTRICT vt = v + t * vs;
    for (size_t r = 0; r < dk; ++r) {
      nkbg[t * dk + r] = -(kt[r] * beta[t]) * eg[t];
      qg[t * dk + r] = qt[r] * eg[t];
      kT[r * C + t] = kt[r];
    }
    for (size_t j = 0; j < dv; ++j) vb[t * dv + j] = vt[j] * beta[t];
  }

  // Lower triangles of q k^T (into Aqk) and k k^T (into A), then the decay mask:
  //   Aqk[i][j] = (q_i . k_j) * exp(gamma_i - gamma_j)            j <= i, else 0
  //   A[i][j]   = -beta_i * (k_i . k_j) * exp(gamma_i - gamma_j)  j < i, else 0
  // Zeros are written up to column T because MatMul's x_lower blocks read them.
  gdn::MatMul(d, T, dk, T_pad, q, qs, 1, kT, C, 0.0f, Aqk, C, /*x_lower=*/false, /*c_lower=*/true);
  gdn::MatMul(d, T, dk, T_pad, k, qs, 1, kT, C, 0.0f, A, C, /*x_lower=*/false, /*c_lower=*/true);
  for (size_t i = 0; i < T; ++i) {
    for (size_t j = 0; j < i; ++j) {
      const float decay = std::exp(gamma[i] - gamma[j]);
      Aqk[i * C + j] *= decay;
      A[i * C + j] = -(beta[i] * A[i * C + j] * decay);
    }
    A[i * C + i] = 0.0f;
    for (size_t j = i + 1; j < T; ++j) Aqk[i * C + j] = A[i * C + j] = 0.0f;
  }

  // A[i, :i] += A[i, :i] @ A[:i, :i] for i = 1 .. T-1, in place: term r adds A[i][r] * A[r][:r]
  // to entries left of r only, so walking r upwards reads every A[i][r] before it changes.
  for (size_t i = 2; i < T; ++i) {
    float* HWY_RESTRICT row = A + i * C;
    for (size_t r = 1; r < i; ++r) gdn::Axpy(d, row[r], A + r * C, row, r);
  }

  // With Tm = A + I (A strictly lower):
  //   U  = Tm @ v_beta = v_beta + A @ v_beta       -> v_new
  //   -W = Tm @ nkbg   = nkbg + A @ nkbg           -> nW
  std::copy(vb, vb + T * dv, v_new);
  std::copy(nkbg, nkbg + T * dk, nW);
  gdn::MatMul(d, T, T, dv, A, C, 1, vb, dv, 1.0f, v_new, dv, /*x_lower=*/true,
              /*c_lower=*/false);
  gdn::MatMul(d, T, T, dk, A, C, 1, nkbg, dk, 1.0f, nW, dk, /*x_lower=*/true,
              /*c_lower=*/false);

  // v_new = U - W @ S; out = qg @ S + Aqk @ v_new (S still the state before this chunk).
  gdn::MatMul(d, T, dk, dv, nW, dk, 1, S, dv, 1.0f, v_new, dv, /*x_lower=*/false,
              /*c_lower=*/false);
  gdn::MatMul(d, T, dk, dv, qg, dk, 1, S, dv, 0.0f, out, os, /*x_lower=*/false,
              /*c_lower=*/false);
  gdn::MatMul(d, T, T, dv, Aqk, C, 1, v_new, dv, 1.0f, out, os, /*x_lower=*/true,
              /*c_lower=*/false);

  // S = exp(g_last) * S + (k * exp(g_last - gamma))^T @ v_new, with kT scaled in place to
  // (k * exp(g_last - gamma))^T: [dk][T].
  for (size_t t = 0; t < T; ++t) {
    const float f = std::exp(g_last - gamma[t]);
    for (size_t r = 0; r < dk; ++r) kT[r * C + t] *= f;
  }
  gdn::MatMul(d, dk, T, dv, kT, C, 1, v_new, dv, std::exp(g_last), S, dv,
              /*x_lower=*/false, /*c_lower=*/false);
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MOESERVE_KERNELS_GATED_DELTA_RULE_INL_H_
