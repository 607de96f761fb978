// Row log-sum-exp of attention scores, lse_i = log sum_j exp(q_i . k_j + bias_j), forward and backward, per
// (batch, head) and block of query rows, without the n x n matrix: residual-pivoted attention's exact column
// normaliser.
//
// Why compiled, and why its own loops: the sum costs O(n^2 d) with d = 32, so per score the products are only
// ~64 flops each way, and the element-wise work around them decides the time. Through ATen (scores + bias,
// logsumexp; in the backward exp(S - lse) * grad as sub_, exp_, mul_) it was most of the pivoted step: at::exp_
// alone ~2.4 ns an element on one core. Here each score row is read once per pass while it is in L1: the forward
// takes the row's maximum and its sum of exp(s - max) in 16 vector lanes, the backward forms
// W = exp(S + bias - lse) * grad in one pass. exp is the Cephes-style polynomial of vec_math.h (about 1 ulp, as
// ATen's vectorised exp) and the sums run in another order than ATen's: the same values at fp32 rounding. fp64
// (tests) uses the C library's exp and log. The loops are compiled for AVX-512, AVX2 and a baseline (GCC
// target_clones) and picked at load time; the products go through ATen's mm (the BLAS torch uses).
//
// Backward: dq = W k and dk = W^T q, dk accumulated transposed (dK^T += Q^T W, the faster BLAS form; see
// flash_attention.cpp) and turned back once per head.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "hash_dropout.h"  // LRA_CLONES
#include "kernel_args.h"
#include "vec_math.h"  // exp_t, maximum, sum

namespace {

using lra::check;
using lra::exp_t;
using lra::maximum;
using lra::sum;

constexpr int64_t kQueryBlock = 128;  // query rows per block: 128 x 2048 fp32 scores = 1 MiB

// lse of each of `rows` rows of `scores` [rows, m] with `bias` [m] added (-inf where no key is attended: exp 0);
// a row without an attended key gets -inf. Element j is summed in lane j % 16 whatever m is, so keys cut off after
// the last attended one (pivoted's length groups) give the sums of the whole width bit for bit: the cut terms add
// exact zeros. `shifted` [m] is the caller's scratch.
template <typename T>
inline __attribute__((always_inline)) void row_lse_impl(const T* scores, const T* bias, T* shifted, T* out,
                                                        int64_t rows, int64_t m) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* s = scores + i * m;
    for (int64_t j = 0; j < m; ++j) shifted[j] = s[j] + bias[j];
    const T top = maximum(shifted, m);
    if (top == -std::numeric_limits<T>::infinity()) {
      out[i] = top;
      continue;
    }
    for (int64_t j = 0; j < m; ++j) shifted[j] = exp_t(shifted[j] - top);
    out[i] = top + std::log(sum(shifted, m));
  }
}

LRA_CLONES void row_lse(const float* scores, const float* bias, float* shifted, float* out, int64_t rows, int64_t m) {
  row_lse_impl(scores, bias, shifted, out, rows, m);
}
LRA_CLONES void row_lse(const double* scores, const double* bias, double* shifted, double* out, int64_t rows,
                        int64_t m) {
  row_lse_impl(scores, bias, shifted, out, rows, m);
}

// scores [rows, m] <- exp(scores + bias - lse_i) * grad_i: the row-scaled probabilities W of the backward
template <typename T>
inline __attribute__((always_inline)) void row_weights_impl(T* scores, const T* bias, const T* lse, const T* grad,
                                                            int64_t rows, int64_t m) {
  for (int64_t i = 0; i < rows; ++i) {
    T* s = scores + i * m;
    const T shift = lse[i], scale = grad[i];
    for (int64_t j = 0; j < m; ++j) s[j] = exp_t((s[j] + bias[j]) - shift) * scale;
  }
}

LRA_CLONES void row_weights(float* scores, const float* bias, const float* lse, const float* grad, int64_t rows,
                            int64_t m) {
  row_weights_impl(scores, bias, lse, grad, rows, m);
}
LRA_CLONES void row_weights(double* scores, const double* bias, const double* lse, const double* grad, int64_t rows,
                            int64_t m) {
  row_weights_impl(scores, bias, lse, grad, rows, m);
}

}  // namespace

// q [BH, N, D], k [BH, M, D] (both as scaled as the caller wants the scores), bias [BH, M]. Returns [BH, N].
at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& bias) {
  check({{&q, "q"}, {&k, "k"}, {&bias, "bias"}});
  const int64_t bh = q.size(0), n = q.size(1), m = k.size(1);
  auto out = at::empty({bh, n}, q.options());
  at::parallel_for(0, bh, 1, [&](int64_t begin, int64_t end) {
    auto scores = at::empty({kQueryBlock, m}, q.options());
    auto shifted = at::empty({m}, q.options());
    for (int64_t h = begin; h < end; ++h) {
      const auto k_t = k[h].t();
      for (int64_t row0 = 0; row0 < n; row0 += kQueryBlock) {
        const int64_t r = std::min(kQueryBlock, n - row0);
        auto s = scores.narrow(0, 0, r);
        at::mm_out(s, q[h].narrow(0, row0, r), k_t);
        AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "row_lse_forward", [&] {
          row_lse(s.data_ptr<scalar_t>(), bias[h].data_ptr<scalar_t>(), shifted.data_ptr<scalar_t>(),
                  out[h].data_ptr<scalar_t>() + row0, r, m);
        });
      }
    }
  });
  return out;
}

// Its backward: with W = exp(S - lse) * grad (row-scaled probabilities), dq = W k and dk = W^T q. `lse` must be
// finite (a row without a key: lse 0 and grad 0, set by the caller).
std::vector<at::Tensor> backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& bias, const at::Tensor& lse) {
  check({{&grad, "grad"}, {&q, "q"}, {&k, "k"}, {&bias, "bias"}, {&lse, "lse"}});
  const int64_t bh = q.size(0), n = q.size(1), m = k.size(1);
  auto dq = at::empty_like(q), dk = at::empty_like(k);
  at::parallel_for(0, bh, 1, [&](int64_t begin, int64_t end) {
    auto scores = at::empty({kQueryBlock, m}, q.options());
    auto dk_t = at::empty({k.size(2), m}, q.options());
    for (int64_t h = begin; h < end; ++h) {
      const auto k_t = k[h].t();
      dk_t.zero_();
      for (int64_t row0 = 0; row0 < n; row0 += kQueryBlock) {
        const int64_t r = std::min(kQueryBlock, n - row0);
        auto s = scores.narrow(0, 0, r);
        const auto q_blk = q[h].narrow(0, row0, r);
        at::mm_out(s, q_blk, k_t);
        AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "row_lse_backward", [&] {
          row_weights(s.data_ptr<scalar_t>(), bias[h].data_ptr<scalar_t>(), lse[h].data_ptr<scalar_t>() + row0,
                      grad[h].data_ptr<scalar_t>() + row0, r, m);
        });
        auto dq_blk = dq[h].narrow(0, row0, r);
        at::mm_out(dq_blk, s, k[h]);
        dk_t.addmm_(q_blk.t(), s);  // dK^T += Q^T W
      }
      dk[h].copy_(dk_t.t());
    }
  });
  return {dq, dk};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("forward", &forward, "row log-sum-exp of the scores, blockwise: forward");
  module.def("backward", &backward, "row log-sum-exp of the scores, blockwise: backward");
}
