// GELU (exact, with erf, as torch's nn.GELU()) and its derivative, written so that a compiler vectorises a loop over
// them: no calls, no branches, only arithmetic, rounding and bit operations.
//
// Why not ATen's kernel: called on cache-sized blocks inside a fused pass, ATen's gelu_backward cost 2-3x its
// whole-tensor time (per-call setup), and a fused pass wants GELU's value in a register, not a block in memory.
//
// fp32 is ATen's own vectorised formula (aten/src/ATen/cpu/vec/vec512/vec512_float.h, Vectorized<float>::erf): the
// Abramowitz-Stegun 7.1.26 erf, |error| < 1.5e-7, with exp from a Cephes-style range reduction and degree-6 polynomial
// (about 1 ulp) — the same values as the eager path's at fp32 rounding. fp64 (tests, the approximation study) uses
// the C library's erf and exp.

#pragma once

#include <cmath>

#include "vec_math.h"  // exp_nonpositive

namespace lra {

// Phi(x) = P(Z <= x) and phi(x) = exp(-x^2/2) / sqrt(2 pi) of one value: gelu(x) = x Phi(x), gelu'(x) = Phi + x phi
inline void normal_cdf_pdf(float x, float& cdf, float& pdf) {
  const float z = x * 0.707106781186547524f;  // erf's argument, x / sqrt(2)
  const float az = std::fabs(z);
  const float t = 1.0f / (0.3275911f * az + 1.0f);
  float r = 1.061405429f * t + -1.453152027f;
  r = r * t + 1.421413741f;
  r = r * t + -0.284496736f;
  r = r * t + 0.254829592f;
  const float e = exp_nonpositive(-(z * z));  // exp(-x^2/2): erf's and the density's
  const float erf_abs = 1.0f - r * t * e;
  const float erf = z < 0.0f ? -erf_abs : erf_abs;
  cdf = 0.5f * (1.0f + erf);
  pdf = 0.398942280401432678f * e;
}

inline void normal_cdf_pdf(double x, double& cdf, double& pdf) {
  cdf = 0.5 * (1.0 + std::erf(x * 0.707106781186547524));
  pdf = 0.398942280401432678 * std::exp(-0.5 * x * x);
}

}  // namespace lra
