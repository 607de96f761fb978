// Randomly pivoted Cholesky (Chen, Epperly, Tropp & Webber, arXiv 2207.06503) on the exp kernel exp(z z^T): the m
// pivots of one sequence and head in one pass over its own state, which stays in the core's cache.
//
// Why: the eager loop (`models/landmarks/rpcholesky.py`) runs its m sequential steps as about twenty torch operators
// each over the whole batch, every one a memory pass over an N-wide state (the weights, their cumulative sum, the
// kernel column, the residual diagonal, the factor F): at WildCat's ListOps shape (64 sequence-heads, N = 2048,
// D = 32, m = 64) about 0.45 s per layer on one core, most of WildCat's forward. Here each (sequence, head) runs its
// m steps alone, cut after its own last eligible token: its features (N x D), factor (m x N) and diagonal fit in the
// L2 cache, and each step is a few vectorised loops over them.
//
// It computes what the eager loop computes, in the same formulas and order of operations (the module docstring of
// `models/landmarks/rpcholesky.py` states them): per step t, the weights d^G_i e^{|z_i|^2} in the log domain
// (log(max(d, 1e-38)) + |z_i|^2 over tokens with d_i > 0 and, with bins, in bin t mod C), shifted by their maximum,
// exponentiated and summed cumulatively in double (as torch's CPU cumsum accumulates fp32), the pivot the first index
// whose cumulative weight exceeds u_t * total (at most the first that reaches total); the Gaussian kernel column
// G[:, j] = exp(z.z_j - |z|^2/2 - |z_j|^2/2) minus F F[j]^T; the pivot valid when its residual g_j > tol; the new
// factor row f = col / sqrt(g_j) and the downdate d <- max(d - f^2, 0), the pivot's d set to 0. The sums (dot
// products, F F[j]^T) run in another order than the BLAS, and fp32 exp and log are Cephes-style polynomials (about
// 1 ulp, as ATen's vectorised ones): the weights agree with the eager loop's at fp32 rounding, so the pivots are the
// same unless a draw lands within rounding of a boundary of the cumulative weights. fp64 uses the C library's exp
// and log. The loops are compiled for AVX-512, AVX2 and a baseline (GCC target_clones) and picked at load time.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "hash_dropout.h"  // LRA_CLONES
#include "kernel_args.h"
#include "vec_math.h"     // exp_t, maximum

namespace {

using lra::check;
using lra::exp_t;
using lra::maximum;

inline float bits_to_float(int32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

inline int32_t float_to_bits(float x) {
  int32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

// log(x) for x > 0 (subnormals included): Cephes' logf, about 1 ulp
inline float log_poly(float x) {
  const bool tiny = x < 1.17549435e-38f;  // subnormal: scale by 2^23 first
  x = tiny ? x * 8388608.0f : x;
  const int32_t bits = float_to_bits(x);
  float e = static_cast<float>(((bits >> 23) & 0xff) - 126) - (tiny ? 23.0f : 0.0f);
  float m = bits_to_float((bits & 0x007fffff) | 0x3f000000);  // in [0.5, 1)
  const bool low = m < 0.707106781186547524f;
  e = low ? e - 1.0f : e;
  m = low ? m + m - 1.0f : m - 1.0f;
  const float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m + -1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m + -1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m + -1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m + -2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y = y + e * -2.12194440e-4f;
  y = y - 0.5f * z;
  return m + y + e * 0.693359375f;
}

inline float log_t(float x) { return log_poly(x); }
inline double log_t(double x) { return std::log(x); }

// log(max(d, 1e-38)) + |z|^2 where a token may be drawn, -inf elsewhere: the eager loop's log-weight
template <typename T>
inline __attribute__((always_inline)) T log_weight(T resid, T sq, bool allowed) {
  const T r = resid < T(1e-38) ? T(1e-38) : resid;
  const T lw = log_t(allowed ? r : T(1)) + sq;
  return allowed ? lw : -std::numeric_limits<T>::infinity();
}

// One (sequence, head) cut after its last eligible token (w: nothing past it is ever drawn): z [w, d] row-major,
// the eligible tokens, m uniforms; writes m pivots and their validity. `zt` [d, w], `sq` [w], `resid` [w], `wts`
// [w], `col` [w], `acc` [w] and `factor` [m, w] are the caller's scratch.
template <typename T>
inline __attribute__((always_inline)) void pivots_one(const T* z, const bool* eligible, const int64_t* bins,
                                                      const T* u, int64_t w, int64_t d, int64_t m, int64_t num_bins,
                                                      T tol, int64_t* idx, bool* ok, T* zt, T* sq, T* resid, T* wts,
                                                      T* col, T* acc, T* factor) {
  for (int64_t i = 0; i < w; ++i) {
    const T* zi = z + i * d;
    T s = T(0);
    for (int64_t k = 0; k < d; ++k) {
      zt[k * w + i] = zi[k];
      s += zi[k] * zi[k];
    }
    sq[i] = s;  // |z_i|^2 (= 2 * half_sq)
    resid[i] = eligible[i] ? T(1) : T(0);
  }
  for (int64_t t = 0; t < m; ++t) {
    const int64_t bin_t = num_bins > 0 ? t % num_bins : 0;
    // the weights' logs (-inf where nothing may be drawn) and their maximum
    if (bins == nullptr) {
      for (int64_t i = 0; i < w; ++i) wts[i] = log_weight(resid[i], sq[i], resid[i] > T(0));
    } else {
      for (int64_t i = 0; i < w; ++i) wts[i] = log_weight(resid[i], sq[i], (resid[i] > T(0)) & (bins[i] == bin_t));
    }
    const T top = maximum(wts, w);
    const bool has = std::isfinite(top);
    int64_t j = 0;
    if (has) {
      for (int64_t i = 0; i < w; ++i) wts[i] = exp_t(wts[i] - top);
      double run = 0.0;  // the cumulative sum in double, stored in T: torch's CPU cumsum
      for (int64_t i = 0; i < w; ++i) {
        run += static_cast<double>(wts[i]);
        wts[i] = static_cast<T>(run);
      }
      const T total = wts[w - 1];
      const T target = u[t] * total;
      const int64_t above = std::upper_bound(wts, wts + w, target) - wts;  // searchsorted(right=True)
      const int64_t reach = std::lower_bound(wts, wts + w, total) - wts;
      j = std::min(above, reach);
    }
    // the residual column of the Gaussian kernel at j
    const T sq_j = sq[j];
    for (int64_t i = 0; i < w; ++i) col[i] = T(0);
    for (int64_t k = 0; k < d; ++k) {
      const T zjk = z[j * d + k];
      const T* row = zt + k * w;
      for (int64_t i = 0; i < w; ++i) col[i] += row[i] * zjk;
    }
    const T half_j = T(0.5) * sq_j;
    for (int64_t i = 0; i < w; ++i) col[i] = exp_t((col[i] - T(0.5) * sq[i]) - half_j);
    if (bins != nullptr) {
      const int64_t bj = bins[j];
      for (int64_t i = 0; i < w; ++i) col[i] = col[i] * static_cast<T>(bins[i] == bj);
    }
    if (t > 0) {
      for (int64_t i = 0; i < w; ++i) acc[i] = T(0);
      for (int64_t s = 0; s < t; ++s) {
        const T* fs = factor + s * w;
        const T fj = fs[j];
        for (int64_t i = 0; i < w; ++i) acc[i] += fs[i] * fj;
      }
      for (int64_t i = 0; i < w; ++i) col[i] = col[i] - acc[i];
    }
    const T g_j = col[j];
    const bool valid = has && g_j > tol;
    const T scale = (valid ? T(1) : T(0)) * (T(1) / std::sqrt(g_j < tol ? tol : g_j));
    T* ft = factor + t * w;
    for (int64_t i = 0; i < w; ++i) {
      const T f = col[i] * scale;
      ft[i] = f;
      const T left = resid[i] - f * f;
      resid[i] = left < T(0) ? T(0) : left;
    }
    if (has) resid[j] = T(0);
    idx[t] = valid ? j : 0;
    ok[t] = valid;
  }
}

template <typename T>
inline __attribute__((always_inline)) void pivots_rows_impl(const T* z, const bool* eligible, const int64_t* bins,
                                                            const T* u, int64_t begin, int64_t end, int64_t n,
                                                            int64_t d, int64_t m, int64_t num_bins, T tol,
                                                            int64_t* idx, bool* ok) {
  std::vector<T> scratch(static_cast<size_t>(n) * (d + 5 + m));
  for (int64_t r = begin; r < end; ++r) {
    int64_t w = 0;
    for (int64_t i = 0; i < n; ++i)
      if (eligible[r * n + i]) w = i + 1;
    if (w == 0) continue;  // nothing to draw: every slot invalid (the outputs' zeros)
    T* base = scratch.data();
    pivots_one<T>(z + r * n * d, eligible + r * n, bins == nullptr ? nullptr : bins + r * n, u + r * m, w, d, m,
                  num_bins, tol, idx + r * m, ok + r * m, base, base + d * w, base + (d + 1) * w,
                  base + (d + 2) * w, base + (d + 3) * w, base + (d + 4) * w, base + (d + 5) * w);
  }
}

LRA_CLONES void pivots_rows(const float* z, const bool* eligible, const int64_t* bins, const float* u, int64_t begin,
                            int64_t end, int64_t n, int64_t d, int64_t m, int64_t num_bins, float tol, int64_t* idx,
                            bool* ok) {
  pivots_rows_impl(z, eligible, bins, u, begin, end, n, d, m, num_bins, tol, idx, ok);
}
LRA_CLONES void pivots_rows(const double* z, const bool* eligible, const int64_t* bins, const double* u,
                            int64_t begin, int64_t end, int64_t n, int64_t d, int64_t m, int64_t num_bins, double tol,
                            int64_t* idx, bool* ok) {
  pivots_rows_impl(z, eligible, bins, u, begin, end, n, d, m, num_bins, tol, idx, ok);
}

}  // namespace

// z [R, N, D], eligible [R, N] bool, u [R, m] (z's dtype), bins [R, N] int64 or empty -> pivots [R, m] int64 (0
// where invalid) and validity [R, m] bool
std::vector<at::Tensor> pivots(const at::Tensor& z, const at::Tensor& eligible, const at::Tensor& u,
                               const at::Tensor& bins, int64_t num_bins, double tol) {
  check({{&z, "z"}, {&u, "u"}});
  TORCH_CHECK(z.dim() == 3 && eligible.dim() == 2 && u.dim() == 2, "z must be [R, N, D], eligible [R, N], u [R, m]");
  const int64_t rows = z.size(0), n = z.size(1), d = z.size(2), m = u.size(1);
  TORCH_CHECK(eligible.scalar_type() == at::kBool && eligible.is_contiguous() && eligible.size(0) == rows &&
                  eligible.size(1) == n,
              "eligible must be a contiguous bool [R, N]");
  TORCH_CHECK(u.size(0) == rows, "u must be [R, m]");
  const bool binned = bins.numel() > 0;
  if (binned) {
    TORCH_CHECK(bins.scalar_type() == at::kLong && bins.is_contiguous() && bins.size(0) == rows && bins.size(1) == n,
                "bins must be a contiguous int64 [R, N]");
    TORCH_CHECK(num_bins >= 1, "num_bins must be positive");
  }
  auto idx = at::zeros({rows, m}, z.options().dtype(at::kLong));
  auto ok = at::zeros({rows, m}, z.options().dtype(at::kBool));
  if (rows == 0 || m == 0 || n == 0) return {idx, ok};
  const bool* el = eligible.data_ptr<bool>();
  const int64_t* bn = binned ? bins.data_ptr<int64_t>() : nullptr;
  int64_t* ip = idx.data_ptr<int64_t>();
  bool* op = ok.data_ptr<bool>();
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "rpcholesky_pivots", [&] {
    const scalar_t* zp = z.data_ptr<scalar_t>();
    const scalar_t* up = u.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      pivots_rows(zp, el, bn, up, begin, end, n, d, m, binned ? num_bins : 0, static_cast<scalar_t>(tol), ip, op);
    });
  });
  return {idx, ok};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("pivots", &pivots, "randomly pivoted Cholesky pivots of exp(z z^T), one pass per sequence and head");
}
