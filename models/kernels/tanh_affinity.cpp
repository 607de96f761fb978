// The outlier-spectral mixer's affinity columns from their dot products, forward and backward, one pass each:
//
//   y = tanh(dots / T),   cols = y * valid_j * mask_i,   d dots = grad * mask_i * valid_j * (1 - y^2) / T,
//
// dots [B, H, n, s] (normalised tokens against the s landmarks), valid [B, H, s] and mask [B, n] the landmarks' and
// the tokens' 0/1 factors (no mask: every token real).
//
// Why: through ATen the forward is a division, tanh and two mask products, four passes over [B, H, n, s] (32 MiB
// each at B = 32, H = 2, n = 2048, s = 64), and ATen's tanh alone ran at ~2.3 ns an element on one Zen 5 core (19 ms
// a call, against 5.7 for exp of the same tensor). Here tanh is computed as the Cephes library's single-precision
// tanhf does it — an odd degree-11 polynomial for |x| < 0.625, (1 - e) / (1 + e) with e = exp(-2|x|) above (vec_math.h's
// exp, ~1 ulp) — in one loop with both branches computed and one selected, so it vectorises (compiled for AVX-512,
// AVX2 and a baseline, picked at load time). Its values are ATen's at fp32 rounding (within 2 float eps of the exact
// tanh, ATen's within 1); the division and the 0/1 products are IEEE operations as there, and the backward takes
// eager's steps in eager's order (whether 1 - y^2 is contracted into one FMA depends, here as in ATen, on the
// compiler and the CPU). fp64 (tests) uses the C library's tanh. Elements are independent, so no result depends on
// the thread count.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "hash_dropout.h"  // LRA_CLONES
#include "kernel_args.h"
#include "vec_math.h"  // exp_nonpositive

namespace {

using lra::check;

inline float tanh_t(float x) {
  const float a = x < 0.0f ? -x : x;
  // |x| < 0.625: x + x^3 P(x^2), the Cephes tanhf minimax polynomial
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  // above: (1 - e) / (1 + e), e = exp(-2|x|) in (0, 0.29] (exp_nonpositive floors it near 1e-38: tanh is 1 there)
  const float e = lra::exp_nonpositive(-2.0f * a);
  const float big = (1.0f - e) / (1.0f + e);
  const float large = x < 0.0f ? -big : big;
  return a < 0.625f ? small : large;
}
inline double tanh_t(double x) { return std::tanh(x); }

// one row i of one (batch, head): y[j] = tanh(d[j] / t), out[j] = y[j] * valid[j] * m
template <typename T>
inline __attribute__((always_inline)) void forward_row_impl(const T* d, const T* valid, T m, T t, T* y, T* out,
                                                            int64_t s) {
  for (int64_t j = 0; j < s; ++j) {
    const T v = tanh_t(d[j] / t);
    y[j] = v;
    out[j] = v * valid[j] * m;
  }
}

LRA_CLONES void forward_row(const float* d, const float* valid, float m, float t, float* y, float* out, int64_t s) {
  forward_row_impl(d, valid, m, t, y, out, s);
}
LRA_CLONES void forward_row(const double* d, const double* valid, double m, double t, double* y, double* out,
                            int64_t s) {
  forward_row_impl(d, valid, m, t, y, out, s);
}

// eager's chain backwards: the mask product's (grad * m), the valid product's (* valid), tanh's (* (1 - y^2)), the
// division's (/ t)
template <typename T>
inline __attribute__((always_inline)) void backward_row_impl(const T* g, const T* y, const T* valid, T m, T t, T* dd,
                                                             int64_t s) {
  for (int64_t j = 0; j < s; ++j) {
    const T gy = g[j] * m * valid[j];
    dd[j] = gy * (T(1) - y[j] * y[j]) / t;
  }
}

LRA_CLONES void backward_row(const float* g, const float* y, const float* valid, float m, float t, float* dd,
                             int64_t s) {
  backward_row_impl(g, y, valid, m, t, dd, s);
}
LRA_CLONES void backward_row(const double* g, const double* y, const double* valid, double m, double t, double* dd,
                             int64_t s) {
  backward_row_impl(g, y, valid, m, t, dd, s);
}

constexpr int64_t kGrainRows = 64;  // rows per parallel task

struct Shape {
  int64_t bh, heads, n, s;
};

Shape shape_of(const at::Tensor& dots, const at::Tensor& valid, const std::optional<at::Tensor>& mask) {
  TORCH_CHECK(dots.dim() == 4, "dots must be [B, H, n, s]");
  const Shape g{dots.size(0) * dots.size(1), dots.size(1), dots.size(2), dots.size(3)};
  TORCH_CHECK(valid.dim() == 3 && valid.size(0) == dots.size(0) && valid.size(1) == g.heads && valid.size(2) == g.s,
              "valid must be [B, H, s]");
  if (mask) {
    check(*mask, "mask");
    TORCH_CHECK(mask->scalar_type() == dots.scalar_type(), "mask must have the dtype of dots");
    TORCH_CHECK(mask->dim() == 2 && mask->size(0) == dots.size(0) && mask->size(1) == g.n, "mask must be [B, n]");
  }
  return g;
}

// the mask factor of row r (of all B*H*n rows): mask[b, i], or 1 without a mask
template <typename T>
inline T row_mask(const T* mask, const Shape& g, int64_t r) {
  if (mask == nullptr) return T(1);
  const int64_t bh = r / g.n, i = r % g.n;
  return mask[(bh / g.heads) * g.n + i];
}

}  // namespace

// dots [B, H, n, s], temperature, valid [B, H, s], mask [B, n] or None -> cols (masked), y = tanh(dots / T)
std::vector<at::Tensor> forward(const at::Tensor& dots, double temperature, const at::Tensor& valid,
                                const std::optional<at::Tensor>& mask) {
  check({{&dots, "dots"}, {&valid, "valid"}});
  const Shape g = shape_of(dots, valid, mask);
  auto y = at::empty_like(dots), cols = at::empty_like(dots);
  AT_DISPATCH_FLOATING_TYPES(dots.scalar_type(), "tanh_affinity_forward", [&] {
    const scalar_t *d = dots.data_ptr<scalar_t>(), *vs = valid.data_ptr<scalar_t>();
    const scalar_t* ms = mask ? mask->data_ptr<scalar_t>() : nullptr;
    scalar_t *ys = y.data_ptr<scalar_t>(), *out = cols.data_ptr<scalar_t>();
    const auto t = static_cast<scalar_t>(temperature);
    at::parallel_for(0, g.bh * g.n, kGrainRows, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        forward_row(d + r * g.s, vs + (r / g.n) * g.s, row_mask(ms, g, r), t, ys + r * g.s, out + r * g.s, g.s);
    });
  });
  return {cols, y};
}

// grad [B, H, n, s] of cols, the forward's y, temperature, valid, mask -> the dots' gradient
at::Tensor backward(const at::Tensor& grad, const at::Tensor& y, double temperature, const at::Tensor& valid,
                    const std::optional<at::Tensor>& mask) {
  check({{&grad, "grad"}, {&y, "y"}, {&valid, "valid"}});
  TORCH_CHECK(grad.sizes() == y.sizes(), "grad must have y's shape");
  const Shape g = shape_of(y, valid, mask);
  auto grad_dots = at::empty_like(y);
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "tanh_affinity_backward", [&] {
    const scalar_t *gs = grad.data_ptr<scalar_t>(), *ys = y.data_ptr<scalar_t>(), *vs = valid.data_ptr<scalar_t>();
    const scalar_t* ms = mask ? mask->data_ptr<scalar_t>() : nullptr;
    scalar_t* dd = grad_dots.data_ptr<scalar_t>();
    const auto t = static_cast<scalar_t>(temperature);
    at::parallel_for(0, g.bh * g.n, kGrainRows, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        backward_row(gs + r * g.s, ys + r * g.s, vs + (r / g.n) * g.s, row_mask(ms, g, r), t, dd + r * g.s, g.s);
    });
  });
  return grad_dots;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("forward", &forward, "the spectral mixer's masked tanh affinity: forward (cols, tanh)");
  module.def("backward", &backward, "the spectral mixer's masked tanh affinity: backward");
}
