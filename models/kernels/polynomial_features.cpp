// The degree-2 symmetric tensor features of polynomial attention, and the attention's core on them, block by block.
//
// Why: phi(x) = [x_a^2 (a < D), sqrt2 * x_a * x_b (a < b)] (D(D+1)/2 features: F = 528 for D = 32) was built in torch
// as an outer product of D*D values per token, an index of its upper triangle and a concatenation, and the backward
// scattered back through the same: about ten passes over tensors of B*H*N*1024 floats (0.5 GiB at the faithful
// ListOps size) where one write of the 528 features is needed. `forward`/`backward` compute each row's features
// from its D values in registers and write them once, and read each row's feature gradients once.
//
// The attention itself, out = phi(Q) S^T with S = W^T phi(K) (W = [V | 1], padded keys zeroed; C = D + 1 = 33),
// needs no [n, F] tensor at all: `summary` (S, and in the backward dS = G^T phi(Q)) and `apply` (phi(Q) S^T, and
// dW = phi(K) dS^T) lift 64 rows at a time into a buffer that stays in the core's cache and multiply it there, and
// `backward_through` makes each block's feature gradients (G S for Q, W dS for K) the same way and folds them into
// dx at once. What memory held twice a layer — phi(Q), phi(K) and their gradients, [B, H, n, F] each, 0.27 GB at
// the faithful ListOps size — is now 64 rows of one of them per thread; phi is recomputed in the backward (it
// costs D(D+1)/2 products a row against C*F multiply-adds of the products around it).
//
// Rounding: the features are bit-identical to the torch form (the same products in the same order:
// x_a * (sqrt2 * x_b)); the block products go straight to the BLAS torch's own matmul calls (blas.h: no tensor view
// or dispatch per block), and the feature backward sums each x's contributions in another order than autograd: fp32
// rounding.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "blas.h"  // product, transpose_into
#include "hash_dropout.h"  // LRA_CLONES
#include "kernel_args.h"

namespace {

using lra::check;
using lra::product;
using lra::transpose_into;

constexpr int64_t kBlock = 64;  // rows a block: 64 x 528 fp32 features = 135 KB, inside a core's L2

template <typename T>
inline void lift_row(const T* xr, T* out, int64_t d) {
  const T s2 = static_cast<T>(std::sqrt(2.0));
  for (int64_t a = 0; a < d; ++a) out[a] = xr[a] * xr[a];
  int64_t at = d;
  for (int64_t a = 0; a < d; ++a) {
    const T xa = xr[a];
    for (int64_t b = a + 1; b < d; ++b) out[at++] = xa * (s2 * xr[b]);
  }
}

// dphi/dx_a = 2 x_a g_a + sqrt2 * sum_{b != a} x_b g_{pair(a, b)}: one row
template <typename T>
inline void fold_row(const T* xr, const T* gr, T* out, int64_t d) {
  const T s2 = static_cast<T>(std::sqrt(2.0));
  for (int64_t a = 0; a < d; ++a) out[a] = T(2) * xr[a] * gr[a];
  int64_t at = d;
  for (int64_t a = 0; a < d; ++a) {
    const T xa = xr[a];
    T acc = T(0);
    for (int64_t b = a + 1; b < d; ++b, ++at) {
      const T gs = s2 * gr[at];
      acc += xr[b] * gs;   // to x_a
      out[b] += xa * gs;   // to x_b
    }
    out[a] += acc;
  }
}

// The blocked core works on a block's columns: x^T [D, rows] and phi^T [F, rows], so that each feature's loop runs
// along the block's rows, contiguous and vectorised, while every row gets lift_row's and fold_row's operations in their
// order (the same values; built without FMA contraction, as the scalar rows were). Row by row, the short inner loops
// of the triangle (31 down to 1 pairs at D = 32) left lifting and folding at ~500 and ~1,200 cycles a row; the
// products take the transposed operands from the BLAS at its full rate.

// phi^T [F, rows] of the block whose x^T is [d, rows]: lift_row along the rows
template <typename T>
inline __attribute__((always_inline)) void lift_columns_impl(const T* __restrict xt, T* __restrict phit, int64_t rows,
                                                             int64_t d) {
  const T s2 = static_cast<T>(std::sqrt(2.0));
  for (int64_t a = 0; a < d; ++a)
    for (int64_t r = 0; r < rows; ++r) phit[a * rows + r] = xt[a * rows + r] * xt[a * rows + r];
  int64_t at = d;
  for (int64_t a = 0; a < d; ++a)
    for (int64_t b = a + 1; b < d; ++b, ++at)
      for (int64_t r = 0; r < rows; ++r) phit[at * rows + r] = xt[a * rows + r] * (s2 * xt[b * rows + r]);
}

LRA_CLONES void lift_columns(const float* xt, float* phit, int64_t rows, int64_t d) {
  lift_columns_impl(xt, phit, rows, d);
}
LRA_CLONES void lift_columns(const double* xt, double* phit, int64_t rows, int64_t d) {
  lift_columns_impl(xt, phit, rows, d);
}

// dx^T [d, rows] of the block from x^T [d, rows] and the feature gradients g^T [F, rows]: fold_row along the rows
template <typename T>
inline __attribute__((always_inline)) void fold_columns_impl(const T* __restrict xt, const T* __restrict gt,
                                                             T* __restrict dxt, int64_t rows, int64_t d) {
  const T s2 = static_cast<T>(std::sqrt(2.0));
  T acc[kBlock];
  for (int64_t a = 0; a < d; ++a)
    for (int64_t r = 0; r < rows; ++r) dxt[a * rows + r] = T(2) * xt[a * rows + r] * gt[a * rows + r];
  int64_t at = d;
  for (int64_t a = 0; a < d; ++a) {
    for (int64_t r = 0; r < rows; ++r) acc[r] = T(0);
    for (int64_t b = a + 1; b < d; ++b, ++at)
      for (int64_t r = 0; r < rows; ++r) {
        const T gs = s2 * gt[at * rows + r];
        acc[r] += xt[b * rows + r] * gs;            // to x_a
        dxt[b * rows + r] += xt[a * rows + r] * gs;  // to x_b
      }
    for (int64_t r = 0; r < rows; ++r) dxt[a * rows + r] += acc[r];
  }
}

LRA_CLONES void fold_columns(const float* xt, const float* gt, float* dxt, int64_t rows, int64_t d) {
  fold_columns_impl(xt, gt, dxt, rows, d);
}
LRA_CLONES void fold_columns(const double* xt, const double* gt, double* dxt, int64_t rows, int64_t d) {
  fold_columns_impl(xt, gt, dxt, rows, d);
}

// one thread's buffers for blocks of up to kBlock rows: x^T, phi^T (or the feature gradients'), and a [C, rows] or
// [D, rows] result
template <typename T>
struct BlockBuffers {
  at::Tensor storage;
  T *xt, *phit, *out;
  BlockBuffers(int64_t d, int64_t f, int64_t c, const at::TensorOptions& options)
      : storage(at::empty({(d + f + std::max(c, d)) * kBlock}, options)),
        xt(storage.data_ptr<T>()),
        phit(xt + d * kBlock),
        out(phit + f * kBlock) {}
};

// fn(g, row, rows, buffers) for every block [row, row + rows) of up to kBlock rows of each of `groups` groups of n
// rows, in parallel, with this thread's buffers
template <typename T, typename Fn>
void each_block(int64_t groups, int64_t n, int64_t d, int64_t f, int64_t c, const at::TensorOptions& options,
                const Fn& fn) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  at::parallel_for(0, groups * blocks, 1, [&](int64_t begin, int64_t end) {
    BlockBuffers<T> buf(d, f, c, options);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t g = i / blocks, row = (i % blocks) * kBlock;
      fn(g, row, std::min(kBlock, n - row), buf);
    }
  });
}

int64_t features_of(const at::Tensor& x) { return x.size(-1) * (x.size(-1) + 1) / 2; }

void check_rows(const at::Tensor& x, const at::Tensor& a, const char* a_name) {
  TORCH_CHECK(x.dim() == 3 && a.dim() == 3 && a.size(0) == x.size(0) && a.size(1) == x.size(1), "x must be [G, n, D] and ",
              a_name, " [G, n, C]");
}

void check_summary(const at::Tensor& x, const at::Tensor& s) {
  TORCH_CHECK(s.dim() == 3 && s.size(0) == x.size(0) && s.size(2) == features_of(x), "s must be [G, C, D(D+1)/2]");
}

}  // namespace

// x [R, D] -> phi [R, D(D+1)/2]
at::Tensor forward(const at::Tensor& x) {
  check(x, "x");
  const int64_t rows = x.size(0), d = x.size(1), f = features_of(x);
  auto phi = at::empty({rows, f}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "polynomial_features_forward", [&] {
    const scalar_t* xs = x.data_ptr<scalar_t>();
    scalar_t* out = phi.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) lift_row(xs + r * d, out + r * f, d);
    });
  });
  return phi;
}

// grad [R, D(D+1)/2], x [R, D] -> dx [R, D]
at::Tensor backward(const at::Tensor& grad, const at::Tensor& x) {
  check({{&grad, "grad"}, {&x, "x"}});
  const int64_t rows = x.size(0), d = x.size(1), f = features_of(x);
  TORCH_CHECK(grad.size(0) == rows && grad.size(1) == f, "grad must be [rows, D(D+1)/2]");
  auto dx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "polynomial_features_backward", [&] {
    const scalar_t *xs = x.data_ptr<scalar_t>(), *gs = grad.data_ptr<scalar_t>();
    scalar_t* out = dx.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) fold_row(xs + r * d, gs + r * f, out + r * d, d);
    });
  });
  return dx;
}

// x [G, n, D], w [G, n, C] -> w^T phi(x) [G, C, F]
at::Tensor summary(const at::Tensor& x, const at::Tensor& w) {
  check({{&x, "x"}, {&w, "w"}});
  check_rows(x, w, "w");
  const int64_t groups = x.size(0), n = x.size(1), d = x.size(2), c = w.size(2), f = features_of(x);
  auto s = at::zeros({groups, c, f}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "polynomial_summary", [&] {
    at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
      BlockBuffers<scalar_t> buf(d, f, c, x.options());
      for (int64_t g = begin; g < end; ++g) {
        scalar_t* sg = s.data_ptr<scalar_t>() + g * c * f;
        for (int64_t row = 0; row < n; row += kBlock) {
          const int64_t rows = std::min(kBlock, n - row);
          transpose_into(x.data_ptr<scalar_t>() + (g * n + row) * d, rows, d, buf.xt);
          lift_columns(buf.xt, buf.phit, rows, d);
          const scalar_t* wg = w.data_ptr<scalar_t>() + (g * n + row) * c;
          product<scalar_t>(true, true, c, f, rows, 1, wg, c, buf.phit, rows, 1, sg, f);  // s_g += w_blk^T phi_blk
        }
      }
    });
  });
  return s;
}

// x [G, n, D], s [G, C, F] -> phi(x) s^T [G, n, C]. Each block's product is formed transposed, s_g phi_blk^T
// [C, rows], and copied into place: with C = D + 1 = 33 columns the BLAS's row-major [rows, C] form runs on a column
// tile and a sliver (71 against 57 ms a call at the ListOps shape, one Zen 5 thread), the transposed one does not.
at::Tensor apply(const at::Tensor& x, const at::Tensor& s) {
  check({{&x, "x"}, {&s, "s"}});
  check_summary(x, s);
  const int64_t groups = x.size(0), n = x.size(1), d = x.size(2), c = s.size(1), f = features_of(x);
  auto out = at::empty({groups, n, c}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "polynomial_apply", [&] {
    each_block<scalar_t>(groups, n, d, f, c, x.options(),
                         [&](int64_t g, int64_t row, int64_t rows, BlockBuffers<scalar_t>& buf) {
                           transpose_into(x.data_ptr<scalar_t>() + (g * n + row) * d, rows, d, buf.xt);
                           lift_columns(buf.xt, buf.phit, rows, d);
                           product<scalar_t>(false, false, c, rows, f, 1, s.data_ptr<scalar_t>() + g * c * f, f,
                                             buf.phit, rows, 0, buf.out, rows);
                           transpose_into(buf.out, c, rows, out.data_ptr<scalar_t>() + (g * n + row) * c);
                         });
  });
  return out;
}

// x [G, n, D], a [G, n, C], s [G, C, F] -> dx [G, n, D]: the backward of phi(x) under the feature gradient a s,
// each block's made transposed, (a s)^T = s^T a_blk^T [F, rows], and folded along the rows
at::Tensor backward_through(const at::Tensor& x, const at::Tensor& a, const at::Tensor& s) {
  check({{&x, "x"}, {&a, "a"}, {&s, "s"}});
  check_rows(x, a, "a");
  check_summary(x, s);
  const int64_t groups = x.size(0), n = x.size(1), d = x.size(2), c = a.size(2), f = features_of(x);
  auto dx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "polynomial_backward_through", [&] {
    each_block<scalar_t>(groups, n, d, f, c, x.options(),
                         [&](int64_t g, int64_t row, int64_t rows, BlockBuffers<scalar_t>& buf) {
                           const scalar_t* ag = a.data_ptr<scalar_t>() + (g * n + row) * c;
                           product<scalar_t>(true, true, f, rows, c, 1, s.data_ptr<scalar_t>() + g * c * f, f, ag, c,
                                             0, buf.phit, rows);
                           transpose_into(x.data_ptr<scalar_t>() + (g * n + row) * d, rows, d, buf.xt);
                           fold_columns(buf.xt, buf.phit, buf.out, rows, d);
                           transpose_into(buf.out, d, rows, dx.data_ptr<scalar_t>() + (g * n + row) * d);
                         });
  });
  return dx;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("forward", &forward, "degree-2 symmetric tensor features: forward");
  module.def("backward", &backward, "degree-2 symmetric tensor features: backward");
  module.def("summary", &summary, "w^T phi(x), block by block");
  module.def("apply", &apply, "phi(x) s^T, block by block");
  module.def("backward_through", &backward_through, "the features' backward under the gradient a s, block by block");
}
