// Pivoted-QR landmarks (Businger-Golub column pivoting of a row sketch of softmax(Q K^T)): the sketch rows and the
// m greedy pivots of one sequence and head in one pass over its own state, which stays in the core's cache.
//
// Why: the eager form (`models/landmarks/pivoted_qr.py`) builds the sketch A_S = softmax(Q_S K^T) as a [B, H, l, N]
// tensor (l = 128, N = 2048 on ListOps: 64 MiB, five passes to mask, normalise and zero it) and runs its m = 64
// sequential steps as about twenty torch operators each over the whole batch, every step's mat-vec q^T A re-reading
// the whole sketch from memory: about a quarter of the residual-pivoted training step on one core. Here each
// (sequence, head) forms its own l x w sketch (w: its last eligible key + 1) with one product, and runs its steps on
// it while it is in L2: a vectorised mat-vec, dot products and a downdate per step.
//
// It computes what the eager loop computes, in the same formulas and order of operations (the docstrings of
// `sketch_rows_softmax` and `greedy_pivots` state them): the sketch rows' softmax over the eligible keys (invalid rows
// zero); the column norms ||a_j||^2 and the floor max(tol, 1e-6)^2 ||A_S||_F^2 in fp64; per step t the eligible
// column of largest downdated residual (the first on a tie, as torch's argmax), its residual a_j - Q W[:, j] made
// orthogonal to Q again, normalised, orthogonalised and normalised a second time, the step valid while the pivot's
// residual norm^2 exceeds the floor (and every step before it was valid), w = q^T A and the fp64 downdate
// ||E_j||^2 <- max(||E_j||^2 - w_j^2, 0). The sums run in another order than the BLAS and softmax's exp is the
// polynomial of vec_math.h: the same values at fp32 rounding, so the same pivots unless two residuals tie within
// rounding. Once a step is invalid every later one is (the eager loop's validity only falls), so the kernel stops
// there and leaves the remaining slots invalid, as the eager loop's are. fp64 (tests) uses the C library's exp. The
// loops are compiled for AVX-512, AVX2 and a baseline (GCC target_clones) and picked at load time.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "hash_dropout.h"  // LRA_CLONES
#include "kernel_args.h"
#include "vec_math.h"  // dot, exp_t, maximum, sum

namespace {

using lra::check;
using lra::dot;
using lra::exp_t;
using lra::maximum;
using lra::sum;

// x <- x - basis^T c, with basis [t, l] (row s: the s-th direction) and c [t]: the product first, then the difference
template <typename T>
inline __attribute__((always_inline)) void subtract_combination(T* x, const T* basis, const T* c, int64_t t,
                                                                int64_t ell, T* tmp) {
  for (int64_t i = 0; i < ell; ++i) tmp[i] = T(0);
  for (int64_t s = 0; s < t; ++s) {
    const T* q = basis + s * ell;
    const T cs = c[s];
    for (int64_t i = 0; i < ell; ++i) tmp[i] += q[i] * cs;
  }
  for (int64_t i = 0; i < ell; ++i) x[i] -= tmp[i];
}

// x <- x - Q (Q^T x): one Gram-Schmidt pass against the first t directions
template <typename T>
inline __attribute__((always_inline)) void orthogonalise(T* x, const T* basis, int64_t t, int64_t ell, T* proj,
                                                         T* tmp) {
  for (int64_t s = 0; s < t; ++s) proj[s] = dot(basis + s * ell, x, ell);
  subtract_combination(x, basis, proj, t, ell, tmp);
}

template <typename T>
inline __attribute__((always_inline)) T norm(const T* x, int64_t n) {
  return std::sqrt(dot(x, x, n));
}

// The softmax of each sketch row over the eligible keys, in place on a [ell, w] (invalid rows: zero)
template <typename T>
inline __attribute__((always_inline)) void sketch_softmax(T* a, const bool* eligible, const bool* rows_valid,
                                                          int64_t ell, int64_t w) {
  for (int64_t i = 0; i < ell; ++i) {
    T* row = a + i * w;
    if (!rows_valid[i]) {
      for (int64_t j = 0; j < w; ++j) row[j] = T(0);
      continue;
    }
    for (int64_t j = 0; j < w; ++j) row[j] = eligible[j] ? row[j] : -std::numeric_limits<T>::infinity();
    const T top = maximum(row, w);
    for (int64_t j = 0; j < w; ++j) row[j] = exp_t(row[j] - top);
    const T total = sum(row, w);
    for (int64_t j = 0; j < w; ++j) row[j] = row[j] / total;
  }
}

// The greedy steps on one sketch a [ell, w] (softmax rows) with the keys that may be picked: writes up to m pivots
// and their validity (the caller's zeros stay where the loop stopped). Scratch: col_sq, resid [w] (fp64), basis
// [m, ell], proj_rows [m, w], col, tmp [ell], coef [m], pickable [w].
template <typename T>
inline __attribute__((always_inline)) void greedy_one(const T* a, const bool* eligible, int64_t ell, int64_t w,
                                                      int64_t m, double tol, int64_t* idx, bool* ok, double* resid,
                                                      T* basis, T* proj_rows, T* col, T* tmp, T* coef,
                                                      bool* pickable) {
  // ||a_j||^2 in fp64, accumulated row by row as torch sums a [ell, N] tensor over its rows
  for (int64_t j = 0; j < w; ++j) resid[j] = 0.0;
  for (int64_t i = 0; i < ell; ++i) {
    const T* row = a + i * w;
    for (int64_t j = 0; j < w; ++j) resid[j] += static_cast<double>(row[j]) * static_cast<double>(row[j]);
  }
  double total = 0.0;
  for (int64_t j = 0; j < w; ++j) total += resid[j];
  const double relative = std::max(tol, 1e-6);
  const double floor_sq = relative * relative * total;
  for (int64_t j = 0; j < w; ++j) pickable[j] = eligible[j];
  const int64_t steps = std::min(m, w);
  for (int64_t t = 0; t < steps; ++t) {
    int64_t j = 0;  // argmax of the residuals of pickable columns (others -1), the first on a tie
    double best = pickable[0] ? resid[0] : -1.0;
    for (int64_t c = 1; c < w; ++c) {
      const double value = pickable[c] ? resid[c] : -1.0;
      if (value > best) {
        best = value;
        j = c;
      }
    }
    for (int64_t i = 0; i < ell; ++i) col[i] = a[i * w + j];
    if (t > 0) {
      for (int64_t s = 0; s < t; ++s) coef[s] = proj_rows[s * w + j];
      subtract_combination(col, basis, coef, t, ell, tmp);  // a_j - Q W[:, j]
      orthogonalise(col, basis, t, ell, coef, tmp);
    }
    const T length = norm(col, ell);
    if (!(static_cast<double>(length) * static_cast<double>(length) > floor_sq)) return;  // this and every later step
    T* q = basis + t * ell;
    const T scale = std::max(length, T(1e-30));
    for (int64_t i = 0; i < ell; ++i) q[i] = col[i] / scale;
    if (t > 0) {  // second pass: Gram-Schmidt alone loses orthogonality
      orthogonalise(q, basis, t, ell, coef, tmp);
      const T again = std::max(norm(q, ell), T(1e-30));
      for (int64_t i = 0; i < ell; ++i) q[i] = q[i] / again;
    }
    T* proj = proj_rows + t * w;  // w = q^T A, row by row of A
    for (int64_t c = 0; c < w; ++c) proj[c] = T(0);
    for (int64_t i = 0; i < ell; ++i) {
      const T qi = q[i];
      const T* row = a + i * w;
      for (int64_t c = 0; c < w; ++c) proj[c] += qi * row[c];
    }
    for (int64_t c = 0; c < w; ++c) {
      const double left = resid[c] - static_cast<double>(proj[c]) * static_cast<double>(proj[c]);
      resid[c] = left < 0.0 ? 0.0 : left;
    }
    pickable[j] = false;
    idx[t] = j;
    ok[t] = true;
  }
}

LRA_CLONES void sketch_softmax_rows(float* a, const bool* eligible, const bool* rows_valid, int64_t ell, int64_t w) {
  sketch_softmax(a, eligible, rows_valid, ell, w);
}
LRA_CLONES void sketch_softmax_rows(double* a, const bool* eligible, const bool* rows_valid, int64_t ell, int64_t w) {
  sketch_softmax(a, eligible, rows_valid, ell, w);
}

LRA_CLONES void greedy_steps(const float* a, const bool* eligible, int64_t ell, int64_t w, int64_t m, double tol,
                             int64_t* idx, bool* ok, double* resid, float* basis, float* proj_rows, float* col,
                             float* tmp, float* coef, bool* pickable) {
  greedy_one(a, eligible, ell, w, m, tol, idx, ok, resid, basis, proj_rows, col, tmp, coef, pickable);
}
LRA_CLONES void greedy_steps(const double* a, const bool* eligible, int64_t ell, int64_t w, int64_t m, double tol,
                             int64_t* idx, bool* ok, double* resid, double* basis, double* proj_rows, double* col,
                             double* tmp, double* coef, bool* pickable) {
  greedy_one(a, eligible, ell, w, m, tol, idx, ok, resid, basis, proj_rows, col, tmp, coef, pickable);
}

// Rows [begin, end) of the flat (sequence, head) axis: the sketch, its softmax, the pivots
template <typename T>
void pivots_rows(const at::Tensor& qs, const at::Tensor& k, const bool* eligible, const bool* rows_valid,
                 int64_t begin, int64_t end, int64_t m, double tol, int64_t* idx, bool* ok) {
  const int64_t ell = qs.size(1), n = k.size(1);
  auto sketch = at::empty({ell * n}, qs.options());
  std::vector<double> resid(n);
  std::vector<T> scratch(static_cast<size_t>(m) * (ell + n) + 2 * ell + m);
  auto pickable = std::make_unique<bool[]>(n);
  for (int64_t r = begin; r < end; ++r) {
    const bool* el = eligible + r * n;
    int64_t w = 0;
    for (int64_t j = 0; j < n; ++j)
      if (el[j]) w = j + 1;
    if (w == 0) continue;  // nothing to pick: every slot invalid (the outputs' zeros)
    auto a = sketch.narrow(0, 0, ell * w).view({ell, w});  // the sketch rows, [ell, w] dense
    at::mm_out(a, qs[r], k[r].narrow(0, 0, w).t());
    T* a_ptr = a.data_ptr<T>();
    sketch_softmax_rows(a_ptr, el, rows_valid + r * ell, ell, w);
    T* base = scratch.data();
    T* proj_rows = base + m * ell;
    T* col = proj_rows + m * n;
    greedy_steps(a_ptr, el, ell, w, m, tol, idx + r * m, ok + r * m, resid.data(), base, proj_rows, col, col + ell,
                 col + 2 * ell, pickable.get());
  }
}

}  // namespace

// qs [R, l, D] (the sketch's query rows) and k [R, N, D], both scaled so that qs k^T are the attention logits;
// eligible [R, N] bool (the keys that may be picked: the real ones), rows_valid [R, l] bool -> pivots [R, m] int64
// (0 where invalid) and validity [R, m] bool
std::vector<at::Tensor> pivots(const at::Tensor& qs, const at::Tensor& k, const at::Tensor& eligible,
                               const at::Tensor& rows_valid, int64_t m, double tol) {
  check({{&qs, "qs"}, {&k, "k"}});
  TORCH_CHECK(qs.dim() == 3 && k.dim() == 3 && qs.size(0) == k.size(0) && qs.size(2) == k.size(2),
              "qs must be [R, l, D] and k [R, N, D]");
  const int64_t rows = qs.size(0), ell = qs.size(1), n = k.size(1);
  TORCH_CHECK(eligible.scalar_type() == at::kBool && eligible.is_contiguous() && eligible.dim() == 2 &&
                  eligible.size(0) == rows && eligible.size(1) == n,
              "eligible must be a contiguous bool [R, N]");
  TORCH_CHECK(rows_valid.scalar_type() == at::kBool && rows_valid.is_contiguous() && rows_valid.dim() == 2 &&
                  rows_valid.size(0) == rows && rows_valid.size(1) == ell,
              "rows_valid must be a contiguous bool [R, l]");
  TORCH_CHECK(m >= 0, "m must be >= 0");
  auto idx = at::zeros({rows, m}, qs.options().dtype(at::kLong));
  auto ok = at::zeros({rows, m}, qs.options().dtype(at::kBool));
  if (rows == 0 || m == 0 || n == 0 || ell == 0) return {idx, ok};
  const bool* el = eligible.data_ptr<bool>();
  const bool* rv = rows_valid.data_ptr<bool>();
  int64_t* ip = idx.data_ptr<int64_t>();
  bool* op = ok.data_ptr<bool>();
  AT_DISPATCH_FLOATING_TYPES(qs.scalar_type(), "pivoted_qr_pivots", [&] {
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      pivots_rows<scalar_t>(qs, k, el, rv, begin, end, m, tol, ip, op);
    });
  });
  return {idx, ok};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("pivots", &pivots, "pivoted-QR pivots of a row sketch of softmax(Q K^T), one pass per sequence and head");
}
