// Exact softmax attention with dropout on the attention weights, on the CPU, without the n x n matrix.
//
// Why: torch's CPU scaled_dot_product_attention has a fused (flash) kernel only for dropout 0; with dropout it
// materialises B*H*n*n weights, a mask and their gradients (at B=32, H=2, n=2048: 1 GiB per tensor), which made
// the reference's training of full attention (dropout 0.1 on the weights) ~20x slower than without dropout.
//
// What it computes, per (batch, head) and per block of query rows (the block's scores fit in the core's cache):
//   P = softmax(Q K^T * scale + key_bias),  O = (P * keep / (1 - p)) V
// where keep is a Bernoulli(1 - p) mask made inside the kernel from a counter-based hash of (seed, batch*head,
// row, column): the backward regenerates it from the same seed instead of storing it, as FlashAttention does on
// GPUs. The mask depends only on the seed and the element's position, never on the thread count or the block size.
// Products go through ATen's mm (the BLAS torch uses); the key bias, the softmax and the dropout run per row while
// it is in cache (`weights_rows`; ATen's add_ and _softmax_out were two passes and two dispatches per block, ~7% of
// the training step of full attention), and a row with no attended key is 0 rather than NaN. The softmax, the hash and
// the elementwise gradient loops are compiled for AVX-512, AVX2 and a baseline, chosen at load time by the dynamic
// loader (GCC target_clones), so one build runs on every x86-64 machine.
//
// Backward (the standard flash-attention derivation, with D_i = rowsum(dO_i * O_i) passed in):
//   dV += (P*keep/(1-p))^T dO,   dP = (dO V^T) * keep/(1-p),   dS = P * (dP - D),
//   dQ = dS K * scale,           dK += dS^T Q * scale.
// dK and dV are accumulated transposed (dK^T += Q^T dS, a [D, M] product whose A is a plain transpose of a
// [rows, D] block) and turned back once a head is done: the same sums, but BLAS runs the [M, rows]^T x [rows, D]
// form with a transposed [rows, M] operand at ~0.6x the rate of the block's other products (measured through
// torch.addmm on one thread: 24 against 40-44 GFLOP/s at rows 128, M 2048, D 32).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "hash_dropout.h"
#include "kernel_args.h"
#include "vec_math.h"  // maximum, lane_sum, exp_t

namespace {

using lra::check;
using lra::drop_threshold;
using lra::keep_scale;
using lra::kept;
using lra::row_key;

constexpr int64_t kQueryBlock = 128;  // query rows per block: 128 x 2048 fp32 scores = 1 MiB

// dS = P * (dPdrop * keep * scale - D)
template <typename T>
inline __attribute__((always_inline)) void grad_row_impl(const T* p, const T* dpdrop, T* ds, int64_t n,
                                                           uint32_t key, uint32_t threshold, T scale, T d) {
  for (int64_t j = 0; j < n; ++j) ds[j] = p[j] * ((kept(key, j, threshold) ? dpdrop[j] * scale : T(0)) - d);
}

LRA_CLONES void grad_row(const float* p, const float* dpdrop, float* ds, int64_t n, uint32_t key,
                         uint32_t threshold, float scale, float d) {
  grad_row_impl(p, dpdrop, ds, n, key, threshold, scale, d);
}
LRA_CLONES void grad_row(const double* p, const double* dpdrop, double* ds, int64_t n, uint32_t key,
                         uint32_t threshold, double scale, double d) {
  grad_row_impl(p, dpdrop, ds, n, key, threshold, scale, d);
}

// One block's attention weights from the mm's scores [rows, m], per row while it is in cache: the key bias added
// and the maximum (two passes), exp into the scores' own row with the sum in the same pass (`lane_sum`'s order, as a
// separate sum over the row would add them), then one scaling pass writing P (`probs`, where the caller keeps it:
// the backward) and its dropped form P * keep / (1 - p) over the scores. A row without an attended key (bias -inf on
// every key: a sequence of pads only) is 0 rather than ATen's NaN.
// Why one pass per row for all of it: the softmax, then a dropout pass over a second 1 MiB buffer, were six passes
// and twice the block's memory (a [128, 2048] block of scores and one of weights: more than a 1.25 MiB L2); the
// forward needs no undropped P at all. The same operations in the same order, so the same bits.
template <typename T>
inline __attribute__((always_inline)) void weights_rows_impl(T* scores, const T* bias, T* probs, int64_t rows,
                                                             int64_t m, uint64_t seed, int64_t bh, int64_t row0,
                                                             int64_t n, uint32_t threshold, T keep) {
  for (int64_t i = 0; i < rows; ++i) {
    T* s = scores + i * m;
    for (int64_t j = 0; j < m; ++j) s[j] += bias[j];
    const T top = lra::maximum(s, m);
    const T shift = top == -std::numeric_limits<T>::infinity() ? T(0) : top;
    const T total = lra::lane_sum<T>(m, [s, shift](int64_t j) __attribute__((always_inline)) {
      const T e = lra::exp_t(s[j] - shift);
      s[j] = e;
      return e;
    });
    const T inverse = total > T(0) ? T(1) / total : T(0);
    const uint32_t key = row_key(seed, bh, row0 + i, n);
    if (probs != nullptr) {
      T* p = probs + i * m;
      for (int64_t j = 0; j < m; ++j) {
        p[j] = s[j] * inverse;
        s[j] = p[j] * lra::keep_factor(key, j, threshold, keep);
      }
    } else {
      for (int64_t j = 0; j < m; ++j) s[j] = (s[j] * inverse) * lra::keep_factor(key, j, threshold, keep);
    }
  }
}

LRA_CLONES void weights_rows(float* scores, const float* bias, float* probs, int64_t rows, int64_t m, uint64_t seed,
                             int64_t bh, int64_t row0, int64_t n, uint32_t threshold, float keep) {
  weights_rows_impl(scores, bias, probs, rows, m, seed, bh, row0, n, threshold, keep);
}
LRA_CLONES void weights_rows(double* scores, const double* bias, double* probs, int64_t rows, int64_t m,
                             uint64_t seed, int64_t bh, int64_t row0, int64_t n, uint32_t threshold, double keep) {
  weights_rows_impl(scores, bias, probs, rows, m, seed, bh, row0, n, threshold, keep);
}

// rows [row0, row0 + r) of head h: scores = Q_blk K^T, then `weights_rows` (Pdrop into `scores`, P into `probs` when
// it is defined)
void block_weights(const at::Tensor& q_blk, const at::Tensor& k_t, const at::Tensor& bias_h, at::Tensor& scores,
                   const at::Tensor* probs, uint64_t seed, int64_t h, int64_t row0, int64_t n, uint32_t threshold,
                   double keep) {
  at::mm_out(scores, q_blk, k_t);
  AT_DISPATCH_FLOATING_TYPES(scores.scalar_type(), "flash_block_weights", [&] {
    weights_rows(scores.data_ptr<scalar_t>(), bias_h.data_ptr<scalar_t>(),
                 probs != nullptr ? probs->data_ptr<scalar_t>() : nullptr, scores.size(0), scores.size(1), seed, h,
                 row0, n, threshold, static_cast<scalar_t>(keep));
  });
}

// The keys a head's weights can be non-zero on: [0, last key with a finite bias]. Why: the keys after it (a right-
// padded sequence's pads: ListOps' median example fills 955 of its 2,048 positions) have weight exactly 0 in every
// row, so their scores, exponentials and products change no value; each block of the head is [rows, attended] (the
// variable-length form of flash attention), their gradients are exact zeros, and the dropout mask, drawn from each
// element's position, is the same. A mask with holes keeps its holes (only the trailing run is left out).
int64_t attended_keys(const at::Tensor& bias_h) {
  int64_t attended = 0;
  AT_DISPATCH_FLOATING_TYPES(bias_h.scalar_type(), "flash_attended_keys", [&] {
    const scalar_t* b = bias_h.data_ptr<scalar_t>();
    for (int64_t j = bias_h.size(0); j > 0; --j)
      if (b[j - 1] != -std::numeric_limits<scalar_t>::infinity()) {
        attended = j;
        break;
      }
  });
  return attended;
}

// the first rows x cols elements of a flat buffer as a contiguous [rows, cols] matrix (a block of a head's width)
at::Tensor matrix(const at::Tensor& buffer, int64_t rows, int64_t cols) {
  return buffer.narrow(0, 0, rows * cols).view({rows, cols});
}

}  // namespace

// q [BH, N, D] already multiplied by the softmax scale; k, v [BH, M, D]; bias [BH, M] (0 or -inf per key).
at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias, double p,
                   int64_t seed) {
  check({{&q, "q"}, {&k, "k"}, {&v, "v"}, {&bias, "bias"}});
  const int64_t bh = q.size(0), n = q.size(1), m = k.size(1);
  const uint32_t threshold = drop_threshold(p);
  const double scale = keep_scale(threshold);
  auto out = at::empty({bh, n, v.size(2)}, q.options());
  at::parallel_for(0, bh, 1, [&](int64_t begin, int64_t end) {
    auto scores = at::empty({kQueryBlock * m}, q.options());
    for (int64_t h = begin; h < end; ++h) {
      const int64_t mh = attended_keys(bias[h]);
      const auto k_t = k[h].narrow(0, 0, mh).t(), v_h = v[h].narrow(0, 0, mh), bias_h = bias[h].narrow(0, 0, mh);
      for (int64_t row0 = 0; row0 < n; row0 += kQueryBlock) {
        const int64_t r = std::min(kQueryBlock, n - row0);
        auto s = matrix(scores, r, mh);
        block_weights(q[h].narrow(0, row0, r), k_t, bias_h, s, nullptr, static_cast<uint64_t>(seed), h, row0, n,
                      threshold, scale);
        auto o = out[h].narrow(0, row0, r);
        at::mm_out(o, s, v_h);
      }
    }
  });
  return out;
}

// grad_out [BH, N, Dv]; delta [BH, N] = rowsum(grad_out * out). Returns dq (for the scaled q), dk, dv.
std::vector<at::Tensor> backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v, const at::Tensor& bias, const at::Tensor& delta, double p,
                                 int64_t seed) {
  check({{&grad_out, "grad_out"}, {&q, "q"}, {&k, "k"}, {&v, "v"}, {&bias, "bias"}, {&delta, "delta"}});
  const int64_t bh = q.size(0), n = q.size(1), m = k.size(1);
  const uint32_t threshold = drop_threshold(p);
  const double scale = keep_scale(threshold);
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  at::parallel_for(0, bh, 1, [&](int64_t begin, int64_t end) {
    auto scores = at::empty({kQueryBlock * m}, q.options());
    auto probs = at::empty({kQueryBlock * m}, q.options());
    auto dk_buffer = at::empty({k.size(2) * m}, q.options()), dv_buffer = at::empty({v.size(2) * m}, q.options());
    for (int64_t h = begin; h < end; ++h) {
      const int64_t mh = attended_keys(bias[h]);
      const auto k_h = k[h].narrow(0, 0, mh), v_t = v[h].narrow(0, 0, mh).t(), bias_h = bias[h].narrow(0, 0, mh);
      const auto k_t = k_h.t();
      auto dk_t = matrix(dk_buffer, k.size(2), mh), dv_t = matrix(dv_buffer, v.size(2), mh);
      dk_t.zero_();
      dv_t.zero_();
      for (int64_t row0 = 0; row0 < n; row0 += kQueryBlock) {
        const int64_t r = std::min(kQueryBlock, n - row0);
        auto s = matrix(scores, r, mh), pr = matrix(probs, r, mh);
        const auto q_blk = q[h].narrow(0, row0, r), go = grad_out[h].narrow(0, row0, r);
        block_weights(q_blk, k_t, bias_h, s, &pr, static_cast<uint64_t>(seed), h, row0, n, threshold, scale);
        AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "flash_dropout_backward", [&] {
          dv_t.addmm_(go.t(), s);  // dV^T += dO^T Pdrop
          at::mm_out(s, go, v_t);  // dPdrop = dO V^T, into the scores buffer
          const scalar_t* d = delta[h].data_ptr<scalar_t>() + row0;
          for (int64_t i = 0; i < r; ++i) {
            scalar_t* row = pr.data_ptr<scalar_t>() + i * mh;
            grad_row(row, s.data_ptr<scalar_t>() + i * mh, row, mh,
                     row_key(static_cast<uint64_t>(seed), h, row0 + i, n), threshold, static_cast<scalar_t>(scale),
                     d[i]);
          }
        });
        auto dq_blk = dq[h].narrow(0, row0, r);
        at::mm_out(dq_blk, pr, k_h);  // dQ = dS K
        dk_t.addmm_(q_blk.t(), pr);   // dK^T += Q^T dS
      }
      dk[h].narrow(0, 0, mh).copy_(dk_t.t());
      dv[h].narrow(0, 0, mh).copy_(dv_t.t());
      dk[h].narrow(0, mh, m - mh).zero_();  // the keys past the last attended one: no weight, no gradient
      dv[h].narrow(0, mh, m - mh).zero_();
    }
  });
  return {dq, dk, dv};
}

// The kernel's keep mask of rows [0, n) x columns [0, m) of one (batch, head), for tests against the materialised form.
at::Tensor keep_mask(int64_t seed, int64_t bh, int64_t n, int64_t m, double p) {
  auto mask = at::empty({n, m}, at::kBool);
  lra::fill_keep_mask(mask.data_ptr<bool>(), static_cast<uint64_t>(seed), bh, n, m, p);
  return mask;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("forward", &forward, "flash attention with in-kernel dropout: forward");
  module.def("backward", &backward, "flash attention with in-kernel dropout: backward");
  module.def("keep_mask", &keep_mask, "the dropout keep mask the kernel draws for one (batch, head)");
}
