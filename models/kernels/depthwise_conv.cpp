// Nystromformer's convolution skip: each head's values convolved along the sequence with that head's own K taps
// (zero padding K / 2 each side), padded positions zeroed first, forward and backward, on the head-major layout
// [B, H, N, D] the attention holds:
//
//   y[b,h,n,:] = sum_t w[h,t] * m[b,n+t-P] * v[b,h,n+t-P,:],                   P = K / 2
//
// Why compiled, and why its own loops: through ATen the skip is a mask multiply, a copy into a channels-last layout
// for the depthwise conv, the conv, and a copy back (and their backwards: the weight gradient of H*D channel copies of
// the H kernels, summed again), ~13 ms a layer at B = 32, H = 2, N = 2048, D = 32 on one Zen 5 core, for ~0.3 GFLOP.
// Here a (b, h) slab of N x D values (256 KiB) is walked in place: each output row is the sum over the taps of
// shifted rows of the same slab, which stay in L1/L2, accumulated in registers. An output element sums its taps in
// order t = 0 .. K-1 from zero, one multiply-add each (fused where the vector unit has FMA): the eager conv's order,
// so the forward is the same values at fp32 rounding (bit for bit where that conv also uses FMA); the weight
// gradient is a sum over B*N*D products in 64 running sums per tap, each slab's in float and the slabs' in double. fp64
// (tests) runs the same loops. The loops are compiled for AVX-512, AVX2 and a baseline (GCC target_clones) and picked
// at load time.
//
// Backward: dv = m * (the same convolution of the gradient with the taps reversed) and
// dw[h,t] = sum_{b,n,d} g[b,h,n,d] * m[b,n+t-P] * v[b,h,n+t-P,d].

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "hash_dropout.h"  // LRA_CLONES
#include "kernel_args.h"

namespace {

using lra::check;

constexpr int64_t kChunk = 64;  // output elements summed in registers at once (four AVX-512 vectors)
constexpr int64_t kLanes = 64;  // running sums of each of the weight gradient's dot products

// out[n*d + j] = sum_t w[t] * x[(n+t-p)*d + j] over the rows of one slab `x` [n, d] (rows outside [0, n) are zero):
// where every tap lands inside the slab the flat range is walked in chunks of kChunk accumulated in registers, and the
// p rows at either end, whose taps are cut, row by row. Both sum the taps in ascending order from zero.
template <typename T>
inline __attribute__((always_inline)) void conv_slab_impl(const T* x, const T* w, T* out, int64_t n, int64_t d,
                                                          int64_t k) {
  const int64_t p = k / 2;
  const int64_t first = std::min(p, n), last = std::max(first, n - (k - 1 - p));  // interior rows [first, last)
  int64_t i = first * d;
  const int64_t interior_end = last * d;
  for (; i + kChunk <= interior_end; i += kChunk) {
    T acc[kChunk] = {};
    for (int64_t t = 0; t < k; ++t) {
      const T wt = w[t];
      const T* src = x + i + (t - p) * d;
      for (int64_t j = 0; j < kChunk; ++j) acc[j] += wt * src[j];
    }
    for (int64_t j = 0; j < kChunk; ++j) out[i + j] = acc[j];
  }
  auto row_range = [&](int64_t row, int64_t col0, int64_t col1) {
    T* o = out + row * d;
    for (int64_t j = col0; j < col1; ++j) o[j] = T(0);
    const int64_t t0 = std::max<int64_t>(0, p - row), t1 = std::min<int64_t>(k, n + p - row);
    for (int64_t t = t0; t < t1; ++t) {
      const T wt = w[t];
      const T* src = x + (row + t - p) * d;
      for (int64_t j = col0; j < col1; ++j) o[j] += wt * src[j];
    }
  };
  for (; i < interior_end; ++i) {  // the interior's tail, shorter than a chunk
    const int64_t row = i / d, col = i % d, stop = std::min(interior_end, (row + 1) * d);
    row_range(row, col, col + (stop - i));
    i = stop - 1;
  }
  for (int64_t row = 0; row < first; ++row) row_range(row, 0, d);
  for (int64_t row = last; row < n; ++row) row_range(row, 0, d);
}

LRA_CLONES void conv_slab(const float* x, const float* w, float* out, int64_t n, int64_t d, int64_t k) {
  conv_slab_impl(x, w, out, n, d, k);
}
LRA_CLONES void conv_slab(const double* x, const double* w, double* out, int64_t n, int64_t d, int64_t k) {
  conv_slab_impl(x, w, out, n, d, k);
}

// dw[t] += sum over the slab of g[i] * x[i + (t-p)*d], for the i whose source row lies in [0, n): per tap a dot
// product in kLanes running sums — four vectors of AVX-512, independent chains, so the multiply-adds do not wait on
// one another (one vector of sums ran at a quarter of the speed) — added to `dw` (double)
template <typename T>
inline __attribute__((always_inline)) void weight_grad_slab_impl(const T* g, const T* x, double* dw, int64_t n,
                                                                 int64_t d, int64_t k) {
  const int64_t p = k / 2;
  for (int64_t t = 0; t < k; ++t) {
    const int64_t row0 = std::max<int64_t>(0, p - t), row1 = std::min<int64_t>(n, n + p - t);
    if (row1 <= row0) continue;
    const int64_t begin = row0 * d, end = row1 * d, shift = (t - p) * d;
    T lanes[kLanes] = {};
    int64_t i = begin;
    for (; i + kLanes <= end; i += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += g[i + l] * x[i + l + shift];
    for (int64_t l = 0; i + l < end; ++l) lanes[l] += g[i + l] * x[i + l + shift];
    double total = 0.0;
    for (int64_t l = 0; l < kLanes; ++l) total += static_cast<double>(lanes[l]);
    dw[t] += total;
  }
}

LRA_CLONES void weight_grad_slab(const float* g, const float* x, double* dw, int64_t n, int64_t d, int64_t k) {
  weight_grad_slab_impl(g, x, dw, n, d, k);
}
LRA_CLONES void weight_grad_slab(const double* g, const double* x, double* dw, int64_t n, int64_t d, int64_t k) {
  weight_grad_slab_impl(g, x, dw, n, d, k);
}

// x [n, d] <- src * m[row] (the padding mask, 1 or 0 per row): exact, as the eager multiply
template <typename T>
void masked_copy(const T* src, const T* m, T* x, int64_t n, int64_t d) {
  for (int64_t row = 0; row < n; ++row)
    for (int64_t j = 0; j < d; ++j) x[row * d + j] = src[row * d + j] * m[row];
}

// v [B, H, N, D], mask [B, N] (v's dtype) or undefined, weight [H, K] with K odd
void check_args(const at::Tensor& v, const at::Tensor& mask, const at::Tensor& weight) {
  check({{&v, "v"}, {&weight, "weight"}});
  if (mask.defined()) check({{&v, "v"}, {&mask, "mask"}});
  TORCH_CHECK(v.dim() == 4, "v must be [B, H, N, D]");
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == v.size(1), "weight must be [H, K]");
  TORCH_CHECK(weight.size(1) % 2 == 1, "weight must have an odd number of taps (P = K / 2 on both sides)");
  TORCH_CHECK(!mask.defined() || (mask.dim() == 2 && mask.size(0) == v.size(0) && mask.size(1) == v.size(2)),
              "mask must be [B, N]");
}

}  // namespace

// v [B, H, N, D], mask [B, N] (1/0 in v's dtype) or None, weight [H, K]. Returns y [B, H, N, D].
at::Tensor forward(const at::Tensor& v, const c10::optional<at::Tensor>& mask_opt, const at::Tensor& weight) {
  const at::Tensor mask = mask_opt.value_or(at::Tensor());
  check_args(v, mask, weight);
  const int64_t b = v.size(0), h = v.size(1), n = v.size(2), d = v.size(3), k = weight.size(1);
  auto out = at::empty_like(v);
  AT_DISPATCH_FLOATING_TYPES(v.scalar_type(), "depthwise_conv_forward", [&] {
    const scalar_t* vp = v.data_ptr<scalar_t>();
    const scalar_t* wp = weight.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, b * h, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> scratch(mask.defined() ? n * d : 0);
      for (int64_t s = begin; s < end; ++s) {
        const scalar_t* x = vp + s * n * d;
        if (mask.defined()) {
          masked_copy(x, mask.data_ptr<scalar_t>() + (s / h) * n, scratch.data(), n, d);
          x = scratch.data();
        }
        conv_slab(x, wp + (s % h) * k, op + s * n * d, n, d, k);
      }
    });
  });
  return out;
}

// grad, v [B, H, N, D], mask [B, N] or None, weight [H, K]. Returns {dv [B, H, N, D], dw [H, K]}.
std::vector<at::Tensor> backward(const at::Tensor& grad, const at::Tensor& v, const c10::optional<at::Tensor>& mask_opt,
                                 const at::Tensor& weight) {
  const at::Tensor mask = mask_opt.value_or(at::Tensor());
  check_args(v, mask, weight);
  check({{&v, "v"}, {&grad, "grad"}});
  TORCH_CHECK(grad.sizes() == v.sizes(), "grad must have v's shape");
  const int64_t b = v.size(0), h = v.size(1), n = v.size(2), d = v.size(3), k = weight.size(1);
  auto dv = at::empty_like(v);
  auto partial = at::zeros({b, h, k}, v.options().dtype(at::kDouble));  // each slab's dw, summed over b below
  const auto reversed = weight.flip({1}).contiguous();
  AT_DISPATCH_FLOATING_TYPES(v.scalar_type(), "depthwise_conv_backward", [&] {
    const scalar_t* gp = grad.data_ptr<scalar_t>();
    const scalar_t* vp = v.data_ptr<scalar_t>();
    const scalar_t* rp = reversed.data_ptr<scalar_t>();
    scalar_t* dvp = dv.data_ptr<scalar_t>();
    double* pp = partial.data_ptr<double>();
    at::parallel_for(0, b * h, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> scratch(mask.defined() ? n * d : 0);
      for (int64_t s = begin; s < end; ++s) {
        const scalar_t* g = gp + s * n * d;
        const scalar_t* x = vp + s * n * d;
        scalar_t* dx = dvp + s * n * d;
        conv_slab(g, rp + (s % h) * k, dx, n, d, k);  // K odd: the reversed taps keep P = K / 2 on both sides
        if (mask.defined()) {
          const scalar_t* m = mask.data_ptr<scalar_t>() + (s / h) * n;
          for (int64_t row = 0; row < n; ++row)
            for (int64_t j = 0; j < d; ++j) dx[row * d + j] *= m[row];
          masked_copy(x, m, scratch.data(), n, d);
          x = scratch.data();
        }
        weight_grad_slab(g, x, pp + s * k, n, d, k);
      }
    });
  });
  return {dv, partial.sum(0).to(v.scalar_type())};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("forward", &forward, "per-head depthwise convolution along the sequence, padding masked: forward");
  module.def("backward", &backward, "per-head depthwise convolution along the sequence, padding masked: backward");
}
