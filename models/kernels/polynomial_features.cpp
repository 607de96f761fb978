// The degree-2 symmetric tensor features of polynomial attention, forward and backward, one pass per row.
//
// Why: phi(x) = [x_a^2 (a < D), sqrt2 * x_a * x_b (a < b)] (D(D+1)/2 features: 528 for D = 32) was built in torch as
// an outer product of D*D values per token, an index of its upper triangle and a concatenation, and the backward
// scattered back through the same: about ten passes over tensors of B*H*N*1024 floats (0.5 GiB at the faithful
// ListOps size) where one write of the 528 features is needed. Here each row's features are computed from its D
// values in registers and written once; the backward reads each row's feature gradients once and writes D values.
// The forward is bit-identical to the torch form (the same products in the same order: x_a * (sqrt2 * x_b)); the
// backward sums each x's contributions in another order (fp32 rounding).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>

#include "kernel_args.h"

namespace {

using lra::check;

template <typename T>
void forward_rows(const T* x, T* phi, int64_t rows, int64_t d, int64_t f) {
  const T s2 = static_cast<T>(std::sqrt(2.0));
  at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * d;
      T* out = phi + r * f;
      for (int64_t a = 0; a < d; ++a) out[a] = xr[a] * xr[a];
      int64_t at = d;
      for (int64_t a = 0; a < d; ++a) {
        const T xa = xr[a];
        for (int64_t b = a + 1; b < d; ++b) out[at++] = xa * (s2 * xr[b]);
      }
    }
  });
}

// dphi/dx_a = 2 x_a g_a + sqrt2 * sum_{b != a} x_b g_{pair(a, b)}
template <typename T>
void backward_rows(const T* x, const T* g, T* dx, int64_t rows, int64_t d, int64_t f) {
  const T s2 = static_cast<T>(std::sqrt(2.0));
  at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * d;
      const T* gr = g + r * f;
      T* out = dx + r * d;
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
  });
}

}  // namespace

// x [R, D] -> phi [R, D(D+1)/2]
at::Tensor forward(const at::Tensor& x) {
  check(x, "x");
  const int64_t rows = x.size(0), d = x.size(1), f = d * (d + 1) / 2;
  auto phi = at::empty({rows, f}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "polynomial_features_forward", [&] {
    forward_rows<scalar_t>(x.data_ptr<scalar_t>(), phi.data_ptr<scalar_t>(), rows, d, f);
  });
  return phi;
}

// grad [R, D(D+1)/2], x [R, D] -> dx [R, D]
at::Tensor backward(const at::Tensor& grad, const at::Tensor& x) {
  check(grad, "grad");
  check(x, "x");
  const int64_t rows = x.size(0), d = x.size(1), f = d * (d + 1) / 2;
  TORCH_CHECK(grad.size(0) == rows && grad.size(1) == f, "grad must be [rows, D(D+1)/2]");
  auto dx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "polynomial_features_backward", [&] {
    backward_rows<scalar_t>(x.data_ptr<scalar_t>(), grad.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(), rows, d, f);
  });
  return dx;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("forward", &forward, "degree-2 symmetric tensor features: forward");
  module.def("backward", &backward, "degree-2 symmetric tensor features: backward");
}
