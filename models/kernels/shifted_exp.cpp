// Performer's positive random features from their projections, forward and backward, one pass over the features each:
//
//   phi[r, m] = exp(proj[r, m] - offset[r]) + floor[r],
//   d proj[r, m] = grad[r, m] * exp(proj[r, m] - offset[r]),   d offset[r] = -sum_m d proj[r, m],
//
// for R rows (batch x heads x tokens) of M features; offset = |x|^2 / 2 plus the row's detached shift (+inf drops a
// pad key: its features are the floor, 0 there), floor the features' epsilon.
//
// Why: through ATen these are a subtraction, an exponential in place and an addition forward, a product and a row sum
// backward: five passes over [B, H, N, M] tensors (64 MiB each at B = 32, H = 2, N = 2048, M = 256), two of them
// per row of q and of k in each layer, ~200 ms of Performer's ~1.3 s training step on one Zen 5 core (loaded), ATen's
// exp alone ~1.3 ns an element. Here the forward reads the projections once and writes the features once, and the
// backward recomputes the exponential (the same loop: the same values) from the projections instead of reading a
// saved copy, in vectorised loops (vec_math.h) compiled for AVX-512, AVX2 and a baseline and picked at load time.
// Values are ATen's at fp32 rounding: exp to ~1 ulp, flushed to 0 below exp(-87.3) where ATen's gives subnormals,
// and the row sum in 16 lanes. Rows are independent, so no result depends on the thread count.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cstdint>
#include <vector>

#include "hash_dropout.h"  // LRA_CLONES
#include "kernel_args.h"
#include "vec_math.h"  // exp_t, sum

namespace {

using lra::check;
using lra::exp_t;

template <typename T>
inline __attribute__((always_inline)) void features_row_impl(const T* proj, T offset, T floor, T* out, int64_t m) {
  for (int64_t j = 0; j < m; ++j) out[j] = exp_t(proj[j] - offset) + floor;
}

LRA_CLONES void features_row(const float* proj, float offset, float floor, float* out, int64_t m) {
  features_row_impl(proj, offset, floor, out, m);
}
LRA_CLONES void features_row(const double* proj, double offset, double floor, double* out, int64_t m) {
  features_row_impl(proj, offset, floor, out, m);
}

// grad_proj = grad * exp(proj - offset); returns its sum, in 16 lanes
template <typename T>
inline __attribute__((always_inline)) T grad_row_impl(const T* grad, const T* proj, T offset, T* grad_proj,
                                                      int64_t m) {
  for (int64_t j = 0; j < m; ++j) grad_proj[j] = grad[j] * exp_t(proj[j] - offset);
  return lra::sum(grad_proj, m);
}

LRA_CLONES float grad_row(const float* grad, const float* proj, float offset, float* grad_proj, int64_t m) {
  return grad_row_impl(grad, proj, offset, grad_proj, m);
}
LRA_CLONES double grad_row(const double* grad, const double* proj, double offset, double* grad_proj, int64_t m) {
  return grad_row_impl(grad, proj, offset, grad_proj, m);
}

constexpr int64_t kGrain = 64;  // rows per parallel task

void check_rows(const at::Tensor& proj, const at::Tensor& offset, const at::Tensor& floor) {
  check({{&proj, "proj"}, {&offset, "offset"}, {&floor, "floor"}});
  TORCH_CHECK(proj.dim() == 2 && offset.numel() == proj.size(0) && floor.numel() == proj.size(0),
              "proj must be [R, M], offset and floor [R]");
}

}  // namespace

// proj [R, M], offset [R], floor [R] -> features [R, M]
at::Tensor forward(const at::Tensor& proj, const at::Tensor& offset, const at::Tensor& floor) {
  check_rows(proj, offset, floor);
  const int64_t m = proj.size(1);
  auto out = at::empty_like(proj);
  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "shifted_exp_forward", [&] {
    const scalar_t *ps = proj.data_ptr<scalar_t>(), *os = offset.data_ptr<scalar_t>(), *fs = floor.data_ptr<scalar_t>();
    scalar_t* out_s = out.data_ptr<scalar_t>();
    at::parallel_for(0, proj.size(0), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) features_row(ps + r * m, os[r], fs[r], out_s + r * m, m);
    });
  });
  return out;
}

// grad [R, M] and the forward's proj, offset -> grad_proj [R, M], grad_offset [R]
std::vector<at::Tensor> backward(const at::Tensor& grad, const at::Tensor& proj, const at::Tensor& offset) {
  check_rows(proj, offset, offset);
  check(grad, "grad");
  TORCH_CHECK(grad.sizes() == proj.sizes() && grad.scalar_type() == proj.scalar_type(),
              "grad must be proj's shape and dtype");
  const int64_t m = proj.size(1);
  auto grad_proj = at::empty_like(proj), grad_offset = at::empty_like(offset);
  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "shifted_exp_backward", [&] {
    const scalar_t *gs = grad.data_ptr<scalar_t>(), *ps = proj.data_ptr<scalar_t>(), *os = offset.data_ptr<scalar_t>();
    scalar_t *dp = grad_proj.data_ptr<scalar_t>(), *doff = grad_offset.data_ptr<scalar_t>();
    at::parallel_for(0, proj.size(0), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) doff[r] = -grad_row(gs + r * m, ps + r * m, os[r], dp + r * m, m);
    });
  });
  return {grad_proj, grad_offset};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("forward", &forward, "Performer's features exp(proj - offset) + floor: forward");
  module.def("backward", &backward, "Performer's features exp(proj - offset) + floor: backward");
}
