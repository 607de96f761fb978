// Local (sliding-window) attention on the CPU, forward and backward, one (batch, head) slab at a time, without the
// unfolded key windows, score masks, pads and folded-back gradients of the eager form (models/attention/local.py).
//
// What it computes, per (batch, head), for query i and key j of an n-token slab [n, d]:
//   P_ij  = softmax_j(scale * q_i . k_j + bias_j) over the keys of i's band, i - left <= j <= i + right,
//   out_i = sum_j P_ij v_j,
// bias_j 0 for an attended key and -inf for a pad; a query whose band holds no attended key gets out_i = 0 (the eager
// form zeroes that row's output too). left = right = w, or left = w, right = 0 for causal attention.
//
// Why: the eager form cuts the queries into blocks, scores each against an unfolded view of the keys padded by w on
// both sides, adds a [B, 1, blocks, c, c + 2w] mask bias built for the call, and its backward folds the windows'
// gradients back (unfold_backward) — memory passes over 100 MB tensors that were about a third of local's training
// step. Here a block of R query rows scores only its key range [r0 - left, r1 + right) cut to [0, n), an
// [R, <= R + left + right] tile that stays in cache, masks, exponentiates and normalises it there and multiplies it
// into the values. Products go through the BLAS torch uses (its sgemm_ / dgemm_: no tensor and no dispatch per
// call), the softmax through vectorised loops (vec_math.h) compiled for AVX-512, AVX2 and a baseline and picked at
// load time.
//
// Backward recomputes each tile's P (the same loops: the same values) instead of storing it:
//   dP = dO V^T,  dS = P * (dP - rowsum(P * dP)),  dQ = scale * dS K,  dK += scale * dS^T Q,  dV += P^T dO,
// rowsum(P * dP) being softmax's own backward term (autograd's form). A slab's dK and dV are summed block after
// block in order, and slabs are independent, so no result depends on the thread count.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "blas.h"  // product
#include "hash_dropout.h"  // LRA_CLONES
#include "kernel_args.h"
#include "vec_math.h"  // biased_softmax, dot

namespace {

using lra::check;
using lra::dot;
using lra::product;

// One row of scores `s` [width] over keys k0 .. k0 + width - 1 -> its weights in place: the band [lo, hi) of the row
// (positions within the tile) with the keys' bias added, softmaxed; every other position 0 (and the whole row 0 when
// no key of the band is attended)
template <typename T>
inline __attribute__((always_inline)) void band_softmax_impl(T* s, const T* bias, int64_t width, int64_t lo,
                                                             int64_t hi) {
  for (int64_t j = 0; j < lo; ++j) s[j] = T(0);
  for (int64_t j = hi; j < width; ++j) s[j] = T(0);
  lra::biased_softmax(s + lo, bias + lo, s + lo, hi - lo);
}

LRA_CLONES void band_softmax(float* s, const float* bias, int64_t width, int64_t lo, int64_t hi) {
  band_softmax_impl(s, bias, width, lo, hi);
}
LRA_CLONES void band_softmax(double* s, const double* bias, int64_t width, int64_t lo, int64_t hi) {
  band_softmax_impl(s, bias, width, lo, hi);
}

// One row of weights `p` and their gradient `dp` [width] -> dS = p * (dp - sum(p * dp)) in `p`
template <typename T>
inline __attribute__((always_inline)) void softmax_grad_impl(T* p, const T* dp, int64_t width) {
  const T delta = dot(p, dp, width);
  for (int64_t i = 0; i < width; ++i) p[i] = p[i] * (dp[i] - delta);
}

LRA_CLONES void softmax_grad(float* p, const float* dp, int64_t width) { softmax_grad_impl(p, dp, width); }
LRA_CLONES void softmax_grad(double* p, const double* dp, int64_t width) { softmax_grad_impl(p, dp, width); }

// The geometry of one (batch, head) slab: n tokens of d features, a band of `left` keys before and `right` after each
// query, blocks of `rows` queries
struct Band {
  int64_t n, d, left, right, rows;
  int64_t key_begin(int64_t r0) const { return std::max<int64_t>(0, r0 - left); }
  int64_t key_end(int64_t r1) const { return std::min(n, r1 + right); }
  int64_t widest() const { return std::min(n, rows + left + right); }
};

// The weights P of the queries [r0, r1) over the keys [k0, k1) into `tile` [r1 - r0, k1 - k0]
template <typename T>
void block_weights(const Band& g, const T* q, const T* k, const T* bias, T scale, int64_t r0, int64_t r1, int64_t k0,
                   int64_t k1, T* tile) {
  const int64_t width = k1 - k0;
  product<T>(false, true, r1 - r0, width, g.d, scale, q + r0 * g.d, g.d, k + k0 * g.d, g.d, T(0), tile, width);
  for (int64_t i = r0; i < r1; ++i) {
    const int64_t lo = std::max(k0, i - g.left) - k0, hi = std::min(k1, i + g.right + 1) - k0;
    band_softmax(tile + (i - r0) * width, bias + k0, width, lo, hi);
  }
}

Band band_of(const at::Tensor& q, int64_t left, int64_t right, int64_t rows) {
  TORCH_CHECK(q.dim() == 4, "q must be [B, H, N, D]");
  TORCH_CHECK(left >= 0 && right >= 0 && rows > 0, "left and right must be >= 0 and rows > 0");
  return Band{q.size(2), q.size(3), left, right, rows};
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias) {
  check({{&q, "q"}, {&k, "k"}, {&v, "v"}, {&bias, "bias"}});
  TORCH_CHECK(q.sizes() == k.sizes() && q.sizes() == v.sizes(), "q, k and v must have one shape [B, H, N, D]");
  TORCH_CHECK(bias.dim() == 2 && bias.size(0) == q.size(0) && bias.size(1) == q.size(2), "bias must be [B, N]");
}

}  // namespace

// q, k, v [B, H, N, D]; bias [B, N] (0 or -inf per key); the band `left`, `right`; queries per block `rows`
at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias, double scale,
                   int64_t left, int64_t right, int64_t rows) {
  check_inputs(q, k, v, bias);
  const Band g = band_of(q, left, right, rows);
  const int64_t heads = q.size(1), slab = g.n * g.d;
  auto out = at::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "local_attention_forward", [&] {
    const scalar_t *qs = q.data_ptr<scalar_t>(), *ks = k.data_ptr<scalar_t>(), *vs = v.data_ptr<scalar_t>();
    const scalar_t* bs = bias.data_ptr<scalar_t>();
    scalar_t* os = out.data_ptr<scalar_t>();
    at::parallel_for(0, q.size(0) * heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> tile(g.rows * g.widest());
      for (int64_t h = begin; h < end; ++h) {
        const scalar_t *qh = qs + h * slab, *kh = ks + h * slab, *vh = vs + h * slab, *bh = bs + (h / heads) * g.n;
        for (int64_t r0 = 0; r0 < g.n; r0 += g.rows) {
          const int64_t r1 = std::min(g.n, r0 + g.rows), k0 = g.key_begin(r0), k1 = g.key_end(r1);
          block_weights<scalar_t>(g, qh, kh, bh, static_cast<scalar_t>(scale), r0, r1, k0, k1, tile.data());
          product<scalar_t>(false, false, r1 - r0, g.d, k1 - k0, scalar_t(1), tile.data(), k1 - k0, vh + k0 * g.d, g.d,
                            scalar_t(0), os + h * slab + r0 * g.d, g.d);
        }
      }
    });
  });
  return out;
}

// grad_out and the forward's arguments -> dq, dk, dv [B, H, N, D]
std::vector<at::Tensor> backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v, const at::Tensor& bias, double scale, int64_t left, int64_t right,
                                 int64_t rows) {
  check_inputs(q, k, v, bias);
  check(grad_out, "grad_out");
  TORCH_CHECK(grad_out.sizes() == q.sizes() && grad_out.scalar_type() == q.scalar_type(),
              "grad_out must be q's shape and dtype");
  const Band g = band_of(q, left, right, rows);
  const int64_t heads = q.size(1), slab = g.n * g.d;
  auto dq = at::empty_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "local_attention_backward", [&] {
    const scalar_t *qs = q.data_ptr<scalar_t>(), *ks = k.data_ptr<scalar_t>(), *vs = v.data_ptr<scalar_t>();
    const scalar_t *bs = bias.data_ptr<scalar_t>(), *gs = grad_out.data_ptr<scalar_t>();
    scalar_t *dqs = dq.data_ptr<scalar_t>(), *dks = dk.data_ptr<scalar_t>(), *dvs = dv.data_ptr<scalar_t>();
    const scalar_t s = static_cast<scalar_t>(scale);
    at::parallel_for(0, q.size(0) * heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> tile(g.rows * g.widest()), dp(g.rows * g.widest());
      for (int64_t h = begin; h < end; ++h) {
        const int64_t base = h * slab;
        const scalar_t *qh = qs + base, *kh = ks + base, *vh = vs + base, *go = gs + base, *bh = bs + (h / heads) * g.n;
        for (int64_t r0 = 0; r0 < g.n; r0 += g.rows) {
          const int64_t r1 = std::min(g.n, r0 + g.rows), k0 = g.key_begin(r0), k1 = g.key_end(r1);
          const int64_t r = r1 - r0, width = k1 - k0;
          block_weights<scalar_t>(g, qh, kh, bh, s, r0, r1, k0, k1, tile.data());
          const scalar_t* go_blk = go + r0 * g.d;
          // dP = dO V^T; dV += P^T dO
          product<scalar_t>(false, true, r, width, g.d, scalar_t(1), go_blk, g.d, vh + k0 * g.d, g.d, scalar_t(0),
                            dp.data(), width);
          product<scalar_t>(true, false, width, g.d, r, scalar_t(1), tile.data(), width, go_blk, g.d, scalar_t(1),
                            dvs + base + k0 * g.d, g.d);
          for (int64_t i = 0; i < r; ++i) softmax_grad(tile.data() + i * width, dp.data() + i * width, width);
          // dQ = scale dS K; dK += scale dS^T Q
          product<scalar_t>(false, false, r, g.d, width, s, tile.data(), width, kh + k0 * g.d, g.d, scalar_t(0),
                            dqs + base + r0 * g.d, g.d);
          product<scalar_t>(true, false, width, g.d, r, s, tile.data(), width, qh + r0 * g.d, g.d, scalar_t(1),
                            dks + base + k0 * g.d, g.d);
        }
      }
    });
  });
  return {dq, dk, dv};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("forward", &forward, "local (sliding-window) attention: forward");
  module.def("backward", &backward, "local (sliding-window) attention: backward");
}
