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
// x_a * (sqrt2 * x_b)); the block products are torch's own matmul on row blocks, and the feature backward sums each
// x's contributions in another order than autograd: fp32 rounding.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "kernel_args.h"

namespace {

using lra::check;

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

// rows [row, row + rows) of group g of x [G, n, D], lifted into block [rows, F]
template <typename T>
void lift_block(const at::Tensor& x, int64_t g, int64_t row, const at::Tensor& block) {
  const int64_t n = x.size(1), d = x.size(2), f = block.size(1);
  const T* xr = x.data_ptr<T>() + (g * n + row) * d;
  T* out = block.data_ptr<T>();
  for (int64_t r = 0; r < block.size(0); ++r) lift_row(xr + r * d, out + r * f, d);
}

int64_t features_of(const at::Tensor& x) { return x.size(-1) * (x.size(-1) + 1) / 2; }

// fn(g, row, block) for every block of up to kBlock rows of each of `groups` groups of n rows, in parallel; `block`
// is this thread's buffer, [rows, f]
template <typename Fn>
void each_block(int64_t groups, int64_t n, int64_t f, const at::TensorOptions& options, const Fn& fn) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  at::parallel_for(0, groups * blocks, 1, [&](int64_t begin, int64_t end) {
    auto buffer = at::empty({kBlock, f}, options);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t g = i / blocks, row = (i % blocks) * kBlock;
      fn(g, row, buffer.narrow(0, 0, std::min(kBlock, n - row)));
    }
  });
}

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
  const int64_t groups = x.size(0), n = x.size(1), f = features_of(x);
  auto s = at::zeros({groups, w.size(2), f}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "polynomial_summary", [&] {
    at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
      auto buffer = at::empty({kBlock, f}, x.options());
      for (int64_t g = begin; g < end; ++g) {
        auto sg = s[g];
        for (int64_t row = 0; row < n; row += kBlock) {
          const int64_t rows = std::min(kBlock, n - row);
          auto block = buffer.narrow(0, 0, rows);
          lift_block<scalar_t>(x, g, row, block);
          sg.addmm_(w[g].narrow(0, row, rows).t(), block);
        }
      }
    });
  });
  return s;
}

// x [G, n, D], s [G, C, F] -> phi(x) s^T [G, n, C]
at::Tensor apply(const at::Tensor& x, const at::Tensor& s) {
  check({{&x, "x"}, {&s, "s"}});
  check_summary(x, s);
  const int64_t groups = x.size(0), n = x.size(1);
  auto out = at::empty({groups, n, s.size(1)}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "polynomial_apply", [&] {
    each_block(groups, n, features_of(x), x.options(), [&](int64_t g, int64_t row, const at::Tensor& block) {
      lift_block<scalar_t>(x, g, row, block);
      auto target = out[g].narrow(0, row, block.size(0));
      at::mm_out(target, block, s[g].t());
    });
  });
  return out;
}

// x [G, n, D], a [G, n, C], s [G, C, F] -> dx [G, n, D]: the backward of phi(x) under the feature gradient a s
at::Tensor backward_through(const at::Tensor& x, const at::Tensor& a, const at::Tensor& s) {
  check({{&x, "x"}, {&a, "a"}, {&s, "s"}});
  check_rows(x, a, "a");
  check_summary(x, s);
  const int64_t groups = x.size(0), n = x.size(1), d = x.size(2), f = features_of(x);
  auto dx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "polynomial_backward_through", [&] {
    each_block(groups, n, f, x.options(), [&](int64_t g, int64_t row, const at::Tensor& block) {
      auto grad = block;  // the block's feature gradients, a s
      at::mm_out(grad, a[g].narrow(0, row, block.size(0)), s[g]);
      const scalar_t* xr = x.data_ptr<scalar_t>() + (g * n + row) * d;
      const scalar_t* gr = grad.data_ptr<scalar_t>();
      scalar_t* out = dx.data_ptr<scalar_t>() + (g * n + row) * d;
      for (int64_t r = 0; r < block.size(0); ++r) fold_row(xr + r * d, gr + r * f, out + r * d, d);
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
