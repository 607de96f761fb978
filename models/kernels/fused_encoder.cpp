// The encoder's memory-bound chain on the CPU, forward and backward, in one pass per step of the chain.
//
// Why: around its matmuls the eager encoder makes one memory pass per operator over [B*N, features] tensors (at the
// faithful ListOps size 16-48 MiB each): the bias a linear layer writes before its product, GELU, the dropout mask
// (a draw, a compare, a cast, a scale) and its multiply, the residual add, the head split/merge copies and the
// padding-mask multiplies around attention, and each of their backwards. Here each step reads its inputs once and
// writes its output once, and the dropout mask is made inside the kernel from the hash of `hash_dropout.h`
// (seeded per call from torch's generator), so no mask is stored and the backward regenerates it.
//
// What it computes (R = B*N token rows; every bias is added here, after an unbiased matmul):
//   bias_dropout_add:  out = residual + dropout(y + bias[r % P])       (P = 1: a linear layer's bias; P = N: the
//                      position embedding; residual absent for the embedding's dropout)
//   bias_dropout_add_norm: the same out, and normed = layer_norm(out) (the next sublayer's input) while the row is in
//                      cache; its backward adds the norm's to out's gradient in the same pass
//   bias_gelu_dropout: out = dropout(gelu(h + bias))                   (the FFN's first layer; GELU exact, with
//                      erf, in the vectorisable form of `gelu.h`: ATen's own formula)
//   split_heads:       q, k, v [B, H, N, D] = (proj [R, 3*H*D] + bias) in head-major order, v times the key mask
//   merge_heads:       out [R, H*D] = ctx [B, H, N, D] in token-major order, times the key mask
//                      (the head-major tensors the backward and the merge read may have any strides)
// Backwards: dropout's is grad * keep * scale, GELU's gelu'(x) = Phi(x) + x phi(x) at the recomputed x, the
// head copies' the transposed copies, and each bias gradient a column sum accumulated in the CPU accumulation type
// (double for fp32) per fixed block of rows, the blocks then summed in order. Every block boundary depends only on
// the shapes, so the results are the same for any thread count.

#include <torch/extension.h>

#include <ATen/AccumulateType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "gelu.h"
#include "hash_dropout.h"
#include "kernel_args.h"
#include "vec_math.h"  // lane_sum, sum, dot

namespace {

using lra::check;
using lra::drop_row;

// values per block of rows, the unit of parallel work and of the bias gradients' partial sums: the block's rows
// depend on the width alone, so the order of every sum is the same for any thread count
constexpr int64_t kBlockElements = 16384;

int64_t block_rows(int64_t cols) { return std::max<int64_t>(1, kBlockElements / std::max<int64_t>(cols, 1)); }

int64_t blocks_of(int64_t rows, int64_t per_block) { return (rows + per_block - 1) / per_block; }

// One call's dropout: p's threshold and scale, and the seed its mask is hashed from (stream 0, one key per row).
struct Dropout {
  uint64_t seed;
  uint32_t threshold;
  double scale;

  Dropout(double p, int64_t seed_) : seed(static_cast<uint64_t>(seed_)), threshold(lra::drop_threshold(p)) {
    scale = lra::keep_scale(threshold);
  }
  bool active() const { return threshold != 0; }
  uint32_t key(int64_t row) const { return lra::row_key(seed, 0, row, 0); }
};

// out = residual + (y + bias) * keep_factor, per element of one row
template <typename T, bool kResidual, bool kDropping>
inline __attribute__((always_inline)) void bias_drop_add_impl(const T* y, const T* bias, const T* residual, T* out,
                                                                int64_t n, uint32_t key, uint32_t threshold,
                                                                T scale) {
  for (int64_t j = 0; j < n; ++j) {
    T v = y[j] + bias[j];
    if constexpr (kDropping) v = v * lra::keep_factor(key, j, threshold, scale);
    if constexpr (kResidual) v = residual[j] + v;
    out[j] = v;
  }
}

template <typename T>
inline __attribute__((always_inline)) void bias_drop_add_dispatch(const T* y, const T* bias, const T* residual,
                                                                    T* out, int64_t n, uint32_t key,
                                                                    uint32_t threshold, T scale) {
  if (residual != nullptr) {
    if (threshold != 0) return bias_drop_add_impl<T, true, true>(y, bias, residual, out, n, key, threshold, scale);
    return bias_drop_add_impl<T, true, false>(y, bias, residual, out, n, key, threshold, scale);
  }
  if (threshold != 0) return bias_drop_add_impl<T, false, true>(y, bias, residual, out, n, key, threshold, scale);
  return bias_drop_add_impl<T, false, false>(y, bias, residual, out, n, key, threshold, scale);
}

LRA_CLONES void bias_drop_add_row(const float* y, const float* bias, const float* residual, float* out, int64_t n,
                                  uint32_t key, uint32_t threshold, float scale) {
  bias_drop_add_dispatch(y, bias, residual, out, n, key, threshold, scale);
}
LRA_CLONES void bias_drop_add_row(const double* y, const double* bias, const double* residual, double* out,
                                  int64_t n, uint32_t key, uint32_t threshold, double scale) {
  bias_drop_add_dispatch(y, bias, residual, out, n, key, threshold, scale);
}

// out = gelu(h + bias) * keep_factor, per element of one row
template <typename T, bool kDropping>
inline __attribute__((always_inline)) void bias_gelu_drop_impl(const T* h, const T* bias, T* out, int64_t n,
                                                                 uint32_t key, uint32_t threshold, T scale) {
  for (int64_t j = 0; j < n; ++j) {
    const T x = h[j] + bias[j];
    T cdf, pdf;
    lra::normal_cdf_pdf(x, cdf, pdf);
    T v = x * cdf;
    if constexpr (kDropping) v = v * lra::keep_factor(key, j, threshold, scale);
    out[j] = v;
  }
}

// grad_h = grad * keep_factor * (Phi(x) + x phi(x)) with x = h + bias, per element of one row (ATen's gelu_backward
// of the dropout's backward)
template <typename T, bool kDropping>
inline __attribute__((always_inline)) void bias_gelu_drop_grad_impl(const T* grad, const T* h, const T* bias,
                                                                      T* grad_h, int64_t n, uint32_t key,
                                                                      uint32_t threshold, T scale) {
  for (int64_t j = 0; j < n; ++j) {
    const T x = h[j] + bias[j];
    T dy = grad[j];
    if constexpr (kDropping) dy = dy * lra::keep_factor(key, j, threshold, scale);
    T cdf, pdf;
    lra::normal_cdf_pdf(x, cdf, pdf);
    grad_h[j] = dy * (cdf + x * pdf);
  }
}

template <typename T>
inline __attribute__((always_inline)) void bias_gelu_drop_dispatch(const T* h, const T* bias, T* out, int64_t n,
                                                                     uint32_t key, uint32_t threshold, T scale) {
  if (threshold != 0) return bias_gelu_drop_impl<T, true>(h, bias, out, n, key, threshold, scale);
  return bias_gelu_drop_impl<T, false>(h, bias, out, n, key, threshold, scale);
}

template <typename T>
inline __attribute__((always_inline)) void bias_gelu_drop_grad_dispatch(const T* grad, const T* h, const T* bias,
                                                                          T* grad_h, int64_t n, uint32_t key,
                                                                          uint32_t threshold, T scale) {
  if (threshold != 0) return bias_gelu_drop_grad_impl<T, true>(grad, h, bias, grad_h, n, key, threshold, scale);
  return bias_gelu_drop_grad_impl<T, false>(grad, h, bias, grad_h, n, key, threshold, scale);
}

LRA_CLONES void bias_gelu_drop_row(const float* h, const float* bias, float* out, int64_t n, uint32_t key,
                                   uint32_t threshold, float scale) {
  bias_gelu_drop_dispatch(h, bias, out, n, key, threshold, scale);
}
LRA_CLONES void bias_gelu_drop_row(const double* h, const double* bias, double* out, int64_t n, uint32_t key,
                                   uint32_t threshold, double scale) {
  bias_gelu_drop_dispatch(h, bias, out, n, key, threshold, scale);
}
LRA_CLONES void bias_gelu_drop_grad_row(const float* grad, const float* h, const float* bias, float* grad_h,
                                        int64_t n, uint32_t key, uint32_t threshold, float scale) {
  bias_gelu_drop_grad_dispatch(grad, h, bias, grad_h, n, key, threshold, scale);
}
LRA_CLONES void bias_gelu_drop_grad_row(const double* grad, const double* h, const double* bias, double* grad_h,
                                        int64_t n, uint32_t key, uint32_t threshold, double scale) {
  bias_gelu_drop_grad_dispatch(grad, h, bias, grad_h, n, key, threshold, scale);
}

// acc[j] += x[j] in the accumulation type (a bias gradient's column sum)
template <typename T, typename A>
inline __attribute__((always_inline)) void accumulate_impl(const T* x, A* acc, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<A>(x[j]);
}

LRA_CLONES void accumulate_row(const float* x, double* acc, int64_t n) { accumulate_impl(x, acc, n); }
LRA_CLONES void accumulate_row(const double* x, double* acc, int64_t n) { accumulate_impl(x, acc, n); }

// The column sums of each block's rows (`partials` [blocks, cols]) summed in block order: a bias gradient
template <typename T>
at::Tensor sum_partials(const std::vector<at::acc_type<T, false>>& partials, int64_t cols, const at::Tensor& like) {
  using A = at::acc_type<T, false>;
  std::vector<A> total(cols, A(0));
  const int64_t blocks = static_cast<int64_t>(partials.size()) / std::max<int64_t>(cols, 1);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t j = 0; j < cols; ++j) total[j] += partials[b * cols + j];
  auto out = at::empty({cols}, like.options());
  T* data = out.data_ptr<T>();
  for (int64_t j = 0; j < cols; ++j) data[j] = static_cast<T>(total[j]);
  return out;
}

// Σ_k x[k*P + p] for each of the P rows of a periodic bias (the position embedding's gradient): each row's sum in
// the order of k, whatever the thread count
template <typename T>
at::Tensor periodic_sums(const at::Tensor& x, int64_t period) {
  using A = at::acc_type<T, false>;
  const int64_t rows = x.size(0), cols = x.size(1), repeats = rows / period;
  auto out = at::empty({period, cols}, x.options());
  const T* src = x.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  at::parallel_for(0, period, 16, [&](int64_t begin, int64_t end) {
    std::vector<A> acc(cols);
    for (int64_t p = begin; p < end; ++p) {
      std::fill(acc.begin(), acc.end(), A(0));
      for (int64_t k = 0; k < repeats; ++k) accumulate_row(src + (k * period + p) * cols, acc.data(), cols);
      for (int64_t j = 0; j < cols; ++j) dst[p * cols + j] = static_cast<T>(acc[j]);
    }
  });
  return out;
}

// The key mask [B, N] in the data's dtype (1 attended, 0 pad), or null without one
template <typename T>
const T* mask_data(const std::optional<at::Tensor>& mask) {
  return mask.has_value() ? mask->data_ptr<T>() : nullptr;
}

void check_mask(const std::optional<at::Tensor>& mask, const at::Tensor& like, int64_t batch, int64_t n) {
  if (!mask.has_value()) return;
  check(*mask, "mask");
  TORCH_CHECK(mask->scalar_type() == like.scalar_type(), "mask must have the data's dtype");
  TORCH_CHECK(mask->numel() == batch * n, "mask must be [B, N]");
}

// row r = b*N + n of a token-major [R, S*H*D] tensor <-> position (b, ., n, .) of head-major [B, H, N, D] tensors
struct Heads {
  int64_t batch, n, heads, d;
  int64_t rows() const { return batch * n; }
  int64_t width() const { return heads * d; }
  int64_t offset(int64_t row, int64_t h) const { return (((row / n) * heads + h) * n + row % n) * d; }
};

// dst (head-major) at row r = (src_row + bias) * mask[r]: bias and mask may be null
template <typename T>
void scatter_row(const T* src_row, const T* bias, const T* mask, T* dst, const Heads& g, int64_t row) {
  const T m = mask != nullptr ? mask[row] : T(1);
  for (int64_t h = 0; h < g.heads; ++h) {
    const T* s = src_row + h * g.d;
    T* o = dst + g.offset(row, h);
    if (bias == nullptr) {
      for (int64_t j = 0; j < g.d; ++j) o[j] = s[j];
    } else {
      const T* b = bias + h * g.d;
      for (int64_t j = 0; j < g.d; ++j) o[j] = s[j] + b[j];
    }
    if (mask != nullptr)
      for (int64_t j = 0; j < g.d; ++j) o[j] *= m;
  }
}

// A [B, H, N, D] tensor read through its strides: an attention's gradients are often transposed or sliced views,
// which a contiguous copy would cost one more pass over
template <typename T>
struct HeadsView {
  const T* data;
  int64_t sb, sh, sn, sd;

  explicit HeadsView(const at::Tensor& t)
      : data(t.data_ptr<T>()), sb(t.stride(0)), sh(t.stride(1)), sn(t.stride(2)), sd(t.stride(3)) {}
  const T* at(int64_t b, int64_t h, int64_t n) const { return data + b * sb + h * sh + n * sn; }
};

// dst_row = src (head-major) at row r * mask[r]: the mask may be null
template <typename T>
void gather_row(const HeadsView<T>& src, const T* mask, T* dst_row, const Heads& g, int64_t row) {
  const int64_t b = row / g.n, n = row % g.n;
  for (int64_t h = 0; h < g.heads; ++h) {
    const T* s = src.at(b, h, n);
    T* o = dst_row + h * g.d;
    if (src.sd == 1) {
      for (int64_t j = 0; j < g.d; ++j) o[j] = s[j];
    } else {
      for (int64_t j = 0; j < g.d; ++j) o[j] = s[j * src.sd];
    }
    if (mask != nullptr)
      for (int64_t j = 0; j < g.d; ++j) o[j] *= mask[row];
  }
}

// Whether a head-major source is stored D-major (`[B, H, D, N]` in memory: a transposed gradient, as GPA's dq and
// dk and Nyström's dk arrive), so that `gather_runs` reads it.
template <typename T>
bool runs_along_n(const HeadsView<T>& src) {
  return src.sn == 1 && src.sd != 1;
}

// A head-major source whose batch is interleaved within a sequence's stride, made row-major first by ATen's copy; any
// other as it is. Linformer's dk and dv arrive so, [H, N, B, D] in memory (its sequence projection runs over the
// batch's columns): each row's D values sit B*D floats (4 KiB) from the next row's, and read row by row the backward
// split took 15-16 ms a call against 3.2-4.0 for row-major gradients, where the copy takes 1.1-1.2 ms (B 32, H 2,
// N 2048, D 32; one Zen 5 thread, loaded). The same values land in the same places.
at::Tensor readable(const at::Tensor& t) {
  const bool interleaved = t.stride(3) == 1 && t.stride(0) < t.stride(2);
  return interleaved ? t.contiguous() : t;
}

// dst rows [r0, r1) (`cols` apart; `dst` at this source's first column) = a D-major source at those rows, times
// mask[row] when given, read along N where it is contiguous, a head and a column at a time. Row by row
// (`gather_row`) it reads D values N apart for each row, each in another page: GPA's backward split took 27-31 ms a
// call that way and 19-25 this way (B 32, N 2048, H 2, D 32; one Zen 4 thread, idle, four alternating runs). The
// same values land in the same places.
template <typename T>
void gather_runs(const HeadsView<T>& src, const T* mask, T* dst, int64_t cols, const Heads& g, int64_t r0,
                 int64_t r1) {
  for (int64_t start = r0; start < r1;) {  // a run of rows within one sequence
    const int64_t b = start / g.n, n0 = start % g.n, count = std::min(r1 - start, g.n - n0);
    for (int64_t h = 0; h < g.heads; ++h)
      for (int64_t j = 0; j < g.d; ++j) {
        const T* s = src.at(b, h, n0) + j * src.sd;
        T* o = dst + start * cols + h * g.d + j;
        if (mask == nullptr) {
          for (int64_t i = 0; i < count; ++i) o[i * cols] = s[i];
        } else {
          for (int64_t i = 0; i < count; ++i) o[i * cols] = s[i] * mask[start + i];
        }
      }
    start += count;
  }
}

// parallel over fixed blocks of `rows` rows of `cols` columns: body(first row, end row, block index)
template <typename F>
void for_blocks(int64_t rows, int64_t cols, const F& body) {
  const int64_t per = block_rows(cols);
  at::parallel_for(0, blocks_of(rows, per), 1, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) body(blk * per, std::min(rows, (blk + 1) * per), blk);
  });
}

template <typename T>
std::vector<at::acc_type<T, false>> partials_for(int64_t rows, int64_t cols) {
  return std::vector<at::acc_type<T, false>>(blocks_of(rows, block_rows(cols)) * cols);
}

// The layer norm of one row x [n] in cache: normed = (x - mean) * rstd * weight + shift, with rstd = 1 / sqrt(the
// biased variance + eps); the moments in two passes over the row as ATen's, each a `lra::lane_sum` in the data's type
// (ATen's CPU layer norm sums fp32 in fp32 too)
template <typename T>
inline __attribute__((always_inline)) void norm_row_impl(const T* x, const T* weight, const T* shift, T* normed,
                                                           T* stats, int64_t n, double eps) {
  const T mean = lra::sum(x, n) / static_cast<T>(n);
  const T squares = lra::lane_sum<T>(n, [&](int64_t j) __attribute__((always_inline)) {
    return (x[j] - mean) * (x[j] - mean);
  });
  const T rstd = T(1) / std::sqrt(squares / static_cast<T>(n) + static_cast<T>(eps));
  for (int64_t i = 0; i < n; ++i) normed[i] = (x[i] - mean) * rstd * weight[i] + shift[i];
  stats[0] = mean;
  stats[1] = rstd;
}

LRA_CLONES void norm_row(const float* x, const float* weight, const float* shift, float* normed, float* stats,
                         int64_t n, double eps) {
  norm_row_impl(x, weight, shift, normed, stats, n, eps);
}
LRA_CLONES void norm_row(const double* x, const double* weight, const double* shift, double* normed, double* stats,
                         int64_t n, double eps) {
  norm_row_impl(x, weight, shift, normed, stats, n, eps);
}

// The layer norm's backward on one row, added to the gradient the row already has (the residual stream's):
//   total = grad_out + rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = grad_normed * weight,  xhat = (x - mean) * rstd
// and the row's terms of the weight's and the shift's gradients (grad_normed * xhat, grad_normed) accumulated
template <typename T, typename A>
inline __attribute__((always_inline)) void norm_grad_row_impl(const T* grad_out, const T* grad_normed, const T* x,
                                                                const T* weight, const T* stats, T* total,
                                                                A* weight_acc, A* shift_acc, int64_t n) {
  const T m = stats[0], r = stats[1];
  const T g_sum = lra::dot(grad_normed, weight, n);
  const T gx_sum = lra::lane_sum<T>(n, [&](int64_t j) __attribute__((always_inline)) {
    return grad_normed[j] * weight[j] * ((x[j] - m) * r);
  });
  const T a = g_sum / static_cast<T>(n), c = gx_sum / static_cast<T>(n);
  for (int64_t i = 0; i < n; ++i) {
    const T xhat = (x[i] - m) * r;
    weight_acc[i] += static_cast<A>(grad_normed[i] * xhat);
    shift_acc[i] += static_cast<A>(grad_normed[i]);
    total[i] = grad_out[i] + r * (grad_normed[i] * weight[i] - a - xhat * c);
  }
}

LRA_CLONES void norm_grad_row(const float* grad_out, const float* grad_normed, const float* x, const float* weight,
                              const float* stats, float* total, double* weight_acc, double* shift_acc, int64_t n) {
  norm_grad_row_impl(grad_out, grad_normed, x, weight, stats, total, weight_acc, shift_acc, n);
}
LRA_CLONES void norm_grad_row(const double* grad_out, const double* grad_normed, const double* x,
                              const double* weight, const double* stats, double* total, double* weight_acc,
                              double* shift_acc, int64_t n) {
  norm_grad_row_impl(grad_out, grad_normed, x, weight, stats, total, weight_acc, shift_acc, n);
}

void check_rows(const at::Tensor& t, const char* name, int64_t rows, int64_t cols) {
  TORCH_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols, name, " must be [", rows, ", ", cols, "]");
}

// The arguments of residual + dropout(y + bias[r % P]): y [R, F], bias [P, F] with P dividing R, residual [R, F] or None
void check_add_args(const std::optional<at::Tensor>& residual, const at::Tensor& y, const at::Tensor& bias) {
  check({{&y, "y"}, {&bias, "bias"}});
  const int64_t rows = y.size(0), cols = y.size(1), period = bias.size(0);
  check_rows(bias, "bias", period, cols);
  TORCH_CHECK(period > 0 && rows % period == 0, "bias rows must divide y's rows");
  if (residual.has_value()) {
    check({{&y, "y"}, {&*residual, "residual"}});
    check_rows(*residual, "residual", rows, cols);
  }
}

}  // namespace

// out = residual + dropout(y + bias[r % P]): y [R, F], bias [P, F] (P divides R), residual [R, F] or None
at::Tensor bias_dropout_add_forward(const std::optional<at::Tensor>& residual, const at::Tensor& y,
                                    const at::Tensor& bias, double p, int64_t seed) {
  check_add_args(residual, y, bias);
  const int64_t rows = y.size(0), cols = y.size(1), period = bias.size(0);
  const Dropout drop(p, seed);
  auto out = at::empty_like(y);
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "bias_dropout_add_forward", [&] {
    const scalar_t *ys = y.data_ptr<scalar_t>(), *bs = bias.data_ptr<scalar_t>();
    const scalar_t* rs = residual.has_value() ? residual->data_ptr<scalar_t>() : nullptr;
    scalar_t* os = out.data_ptr<scalar_t>();
    for_blocks(rows, cols, [&](int64_t r0, int64_t r1, int64_t) {
      for (int64_t r = r0; r < r1; ++r)
        bias_drop_add_row(ys + r * cols, bs + (r % period) * cols, rs == nullptr ? nullptr : rs + r * cols,
                          os + r * cols, cols, drop.key(r), drop.threshold, static_cast<scalar_t>(drop.scale));
    });
  });
  return out;
}

// grad [R, F] -> grad_y = grad * keep * scale, grad_bias [P, F] (the residual's gradient is grad itself)
std::vector<at::Tensor> bias_dropout_add_backward(const at::Tensor& grad, int64_t period, double p, int64_t seed) {
  check(grad, "grad");
  const int64_t rows = grad.size(0), cols = grad.size(1);
  TORCH_CHECK(period > 0 && rows % period == 0, "bias rows must divide grad's rows");
  const Dropout drop(p, seed);
  auto grad_y = drop.active() ? at::empty_like(grad) : grad;
  at::Tensor grad_bias;
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "bias_dropout_add_backward", [&] {
    const scalar_t* gs = grad.data_ptr<scalar_t>();
    scalar_t* dy = grad_y.data_ptr<scalar_t>();
    auto partials = partials_for<scalar_t>(period == 1 ? rows : 0, cols);
    for_blocks(rows, cols, [&](int64_t r0, int64_t r1, int64_t blk) {
      for (int64_t r = r0; r < r1; ++r) {
        if (drop.active())
          drop_row(gs + r * cols, dy + r * cols, cols, drop.key(r), drop.threshold, static_cast<scalar_t>(drop.scale));
        if (period == 1) accumulate_row(dy + r * cols, partials.data() + blk * cols, cols);
      }
    });
    grad_bias = period == 1 ? sum_partials<scalar_t>(partials, cols, grad).view({1, cols})
                            : periodic_sums<scalar_t>(grad_y, period);
  });
  return {grad_y, grad_bias};
}

// out = residual + dropout(y + bias[r % P]) and normed = layer_norm(out) (weight, shift [F], eps) in one pass per row:
// the next sublayer's input is made while the row is in cache. Returns out, normed and the rows' stats [R, 2] (mean,
// rstd) for the backward.
std::vector<at::Tensor> bias_dropout_add_norm_forward(const std::optional<at::Tensor>& residual, const at::Tensor& y,
                                                      const at::Tensor& bias, double p, int64_t seed,
                                                      const at::Tensor& weight, const at::Tensor& shift, double eps) {
  check_add_args(residual, y, bias);
  check({{&weight, "weight"}, {&shift, "shift"}});
  const int64_t rows = y.size(0), cols = y.size(1), period = bias.size(0);
  TORCH_CHECK(weight.numel() == cols && shift.numel() == cols, "weight and shift must have y's columns");
  const Dropout drop(p, seed);
  auto out = at::empty_like(y), normed = at::empty_like(y), stats = at::empty({rows, 2}, y.options());
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "bias_dropout_add_norm_forward", [&] {
    const scalar_t *ys = y.data_ptr<scalar_t>(), *bs = bias.data_ptr<scalar_t>();
    const scalar_t *ws = weight.data_ptr<scalar_t>(), *ss = shift.data_ptr<scalar_t>();
    const scalar_t* rs = residual.has_value() ? residual->data_ptr<scalar_t>() : nullptr;
    scalar_t *os = out.data_ptr<scalar_t>(), *ns = normed.data_ptr<scalar_t>(), *st = stats.data_ptr<scalar_t>();
    for_blocks(rows, cols, [&](int64_t r0, int64_t r1, int64_t) {
      for (int64_t r = r0; r < r1; ++r) {
        bias_drop_add_row(ys + r * cols, bs + (r % period) * cols, rs == nullptr ? nullptr : rs + r * cols,
                          os + r * cols, cols, drop.key(r), drop.threshold, static_cast<scalar_t>(drop.scale));
        norm_row(os + r * cols, ws, ss, ns + r * cols, st + 2 * r, cols, eps);
      }
    });
  });
  return {out, normed, stats};
}

// grad_out, grad_normed [R, F] (the gradients of out and of normed), out and stats from the forward -> the residual's
// gradient (grad_out + the norm's backward: out's whole gradient), grad_y (that times keep * scale), grad_bias [P, F],
// grad_weight, grad_shift [F], in one pass per row
std::vector<at::Tensor> bias_dropout_add_norm_backward(const at::Tensor& grad_out, const at::Tensor& grad_normed,
                                                       const at::Tensor& out, const at::Tensor& stats,
                                                       const at::Tensor& weight, int64_t period, double p,
                                                       int64_t seed) {
  check({{&grad_out, "grad_out"}, {&grad_normed, "grad_normed"}, {&out, "out"}, {&stats, "stats"}, {&weight, "weight"}});
  const int64_t rows = out.size(0), cols = out.size(1);
  check_rows(grad_out, "grad_out", rows, cols);
  check_rows(grad_normed, "grad_normed", rows, cols);
  check_rows(stats, "stats", rows, 2);
  TORCH_CHECK(period > 0 && rows % period == 0, "bias rows must divide the rows");
  const Dropout drop(p, seed);
  auto total = at::empty_like(out);
  auto grad_y = drop.active() ? at::empty_like(out) : total;
  at::Tensor grad_bias, grad_weight, grad_shift;
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "bias_dropout_add_norm_backward", [&] {
    const scalar_t *go = grad_out.data_ptr<scalar_t>(), *gn = grad_normed.data_ptr<scalar_t>();
    const scalar_t *xs = out.data_ptr<scalar_t>(), *st = stats.data_ptr<scalar_t>(), *ws = weight.data_ptr<scalar_t>();
    scalar_t *ts = total.data_ptr<scalar_t>(), *dy = grad_y.data_ptr<scalar_t>();
    auto bias_parts = partials_for<scalar_t>(period == 1 ? rows : 0, cols);
    auto weight_parts = partials_for<scalar_t>(rows, cols), shift_parts = partials_for<scalar_t>(rows, cols);
    for_blocks(rows, cols, [&](int64_t r0, int64_t r1, int64_t blk) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t at_row = r * cols;
        norm_grad_row(go + at_row, gn + at_row, xs + at_row, ws, st + 2 * r, ts + at_row,
                      weight_parts.data() + blk * cols, shift_parts.data() + blk * cols, cols);
        if (drop.active())
          drop_row(ts + at_row, dy + at_row, cols, drop.key(r), drop.threshold, static_cast<scalar_t>(drop.scale));
        if (period == 1) accumulate_row(dy + at_row, bias_parts.data() + blk * cols, cols);
      }
    });
    grad_bias = period == 1 ? sum_partials<scalar_t>(bias_parts, cols, out).view({1, cols})
                            : periodic_sums<scalar_t>(grad_y, period);
    grad_weight = sum_partials<scalar_t>(weight_parts, cols, out);
    grad_shift = sum_partials<scalar_t>(shift_parts, cols, out);
  });
  return {total, grad_y, grad_bias, grad_weight, grad_shift};
}

// out = dropout(gelu(h + bias)): h [R, F], bias [F]
at::Tensor bias_gelu_dropout_forward(const at::Tensor& h, const at::Tensor& bias, double p, int64_t seed) {
  check({{&h, "h"}, {&bias, "bias"}});
  const int64_t rows = h.size(0), cols = h.size(1);
  TORCH_CHECK(bias.numel() == cols, "bias must have h's columns");
  const Dropout drop(p, seed);
  auto out = at::empty_like(h);
  AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "bias_gelu_dropout_forward", [&] {
    const scalar_t *hs = h.data_ptr<scalar_t>(), *bs = bias.data_ptr<scalar_t>();
    scalar_t* os = out.data_ptr<scalar_t>();
    for_blocks(rows, cols, [&](int64_t r0, int64_t r1, int64_t) {
      for (int64_t r = r0; r < r1; ++r)
        bias_gelu_drop_row(hs + r * cols, bs, os + r * cols, cols, drop.key(r), drop.threshold,
                           static_cast<scalar_t>(drop.scale));
    });
  });
  return out;
}

// grad [R, F] -> grad_h = gelu'(h + bias) * grad * keep * scale, grad_bias [F]
std::vector<at::Tensor> bias_gelu_dropout_backward(const at::Tensor& grad, const at::Tensor& h,
                                                   const at::Tensor& bias, double p, int64_t seed) {
  check({{&grad, "grad"}, {&h, "h"}, {&bias, "bias"}});
  const int64_t rows = h.size(0), cols = h.size(1);
  check_rows(grad, "grad", rows, cols);
  const Dropout drop(p, seed);
  auto grad_h = at::empty_like(h);
  at::Tensor grad_bias;
  AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "bias_gelu_dropout_backward", [&] {
    const scalar_t *hs = h.data_ptr<scalar_t>(), *bs = bias.data_ptr<scalar_t>(), *gs = grad.data_ptr<scalar_t>();
    scalar_t* dh = grad_h.data_ptr<scalar_t>();
    auto partials = partials_for<scalar_t>(rows, cols);
    for_blocks(rows, cols, [&](int64_t r0, int64_t r1, int64_t blk) {
      for (int64_t r = r0; r < r1; ++r) {
        bias_gelu_drop_grad_row(gs + r * cols, hs + r * cols, bs, dh + r * cols, cols, drop.key(r), drop.threshold,
                                static_cast<scalar_t>(drop.scale));
        accumulate_row(dh + r * cols, partials.data() + blk * cols, cols);
      }
    });
    grad_bias = sum_partials<scalar_t>(partials, cols, h);
  });
  return {grad_h, grad_bias};
}

// proj [B*N, 3*H*D], bias [3*H*D], mask [B, N] or None -> q, k, v [B, H, N, D] (v times the mask)
std::vector<at::Tensor> split_heads_forward(const at::Tensor& proj, const at::Tensor& bias,
                                            const std::optional<at::Tensor>& mask, int64_t batch, int64_t heads) {
  check({{&proj, "proj"}, {&bias, "bias"}});
  const int64_t rows = proj.size(0), width = proj.size(1) / 3;
  const Heads g{batch, rows / batch, heads, width / heads};
  TORCH_CHECK(rows == g.rows() && proj.size(1) == 3 * g.width() && bias.numel() == proj.size(1),
              "proj must be [B*N, 3*H*D] and bias [3*H*D]");
  check_mask(mask, proj, batch, g.n);
  std::vector<at::Tensor> out;
  for (int s = 0; s < 3; ++s) out.push_back(at::empty({batch, heads, g.n, g.d}, proj.options()));
  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "split_heads_forward", [&] {
    const scalar_t *ps = proj.data_ptr<scalar_t>(), *bs = bias.data_ptr<scalar_t>(), *ms = mask_data<scalar_t>(mask);
    for_blocks(rows, proj.size(1), [&](int64_t r0, int64_t r1, int64_t) {
      for (int64_t r = r0; r < r1; ++r)
        for (int s = 0; s < 3; ++s)
          scatter_row(ps + r * 3 * g.width() + s * g.width(), bs + s * g.width(), s == 2 ? ms : nullptr,
                      out[s].data_ptr<scalar_t>(), g, r);
    });
  });
  return out;
}

// dq, dk, dv [B, H, N, D] (any strides), mask [B, N] or None -> dproj [B*N, 3*H*D], dbias [3*H*D]
std::vector<at::Tensor> split_heads_backward(const at::Tensor& dq_in, const at::Tensor& dk_in, const at::Tensor& dv_in,
                                             const std::optional<at::Tensor>& mask) {
  check({{&dq_in, "dq"}, {&dk_in, "dk"}, {&dv_in, "dv"}}, /*contiguous=*/false);
  TORCH_CHECK(dq_in.dim() == 4 && dq_in.sizes() == dk_in.sizes() && dq_in.sizes() == dv_in.sizes(),
              "dq, dk, dv must be [B, H, N, D]");
  const at::Tensor dq = readable(dq_in), dk = readable(dk_in), dv = readable(dv_in);
  const Heads g{dq.size(0), dq.size(2), dq.size(1), dq.size(3)};
  check_mask(mask, dq, g.batch, g.n);
  const int64_t cols = 3 * g.width();
  auto dproj = at::empty({g.rows(), cols}, dq.options());
  at::Tensor dbias;
  AT_DISPATCH_FLOATING_TYPES(dq.scalar_type(), "split_heads_backward", [&] {
    const HeadsView<scalar_t> grads[3] = {HeadsView<scalar_t>(dq), HeadsView<scalar_t>(dk), HeadsView<scalar_t>(dv)};
    const scalar_t* ms = mask_data<scalar_t>(mask);
    scalar_t* ds = dproj.data_ptr<scalar_t>();
    auto partials = partials_for<scalar_t>(g.rows(), cols);
    for_blocks(g.rows(), cols, [&](int64_t r0, int64_t r1, int64_t blk) {
      for (int s = 0; s < 3; ++s)  // D-major sources for the whole block first, then the rest row by row
        if (runs_along_n(grads[s])) gather_runs(grads[s], s == 2 ? ms : nullptr, ds + s * g.width(), cols, g, r0, r1);
      for (int64_t r = r0; r < r1; ++r) {
        for (int s = 0; s < 3; ++s)
          if (!runs_along_n(grads[s]))
            gather_row(grads[s], s == 2 ? ms : nullptr, ds + r * cols + s * g.width(), g, r);
        accumulate_row(ds + r * cols, partials.data() + blk * cols, cols);
      }
    });
    dbias = sum_partials<scalar_t>(partials, cols, dq);
  });
  return {dproj, dbias};
}

// ctx [B, H, N, D] (any strides), mask [B, N] or None -> [B*N, H*D] (times the mask)
at::Tensor merge_heads_forward(const at::Tensor& ctx_in, const std::optional<at::Tensor>& mask) {
  check(ctx_in, "ctx", /*contiguous=*/false);
  TORCH_CHECK(ctx_in.dim() == 4, "ctx must be [B, H, N, D]");
  const at::Tensor ctx = readable(ctx_in);
  const Heads g{ctx.size(0), ctx.size(2), ctx.size(1), ctx.size(3)};
  check_mask(mask, ctx, g.batch, g.n);
  auto out = at::empty({g.rows(), g.width()}, ctx.options());
  AT_DISPATCH_FLOATING_TYPES(ctx.scalar_type(), "merge_heads_forward", [&] {
    const HeadsView<scalar_t> cs(ctx);
    const scalar_t* ms = mask_data<scalar_t>(mask);
    scalar_t* os = out.data_ptr<scalar_t>();
    for_blocks(g.rows(), g.width(), [&](int64_t r0, int64_t r1, int64_t) {
      if (runs_along_n(cs)) {
        gather_runs(cs, ms, os, g.width(), g, r0, r1);
      } else {
        for (int64_t r = r0; r < r1; ++r) gather_row(cs, ms, os + r * g.width(), g, r);
      }
    });
  });
  return out;
}

// grad [B*N, H*D], mask [B, N] or None -> dctx [B, H, N, D] (times the mask)
at::Tensor merge_heads_backward(const at::Tensor& grad, const std::optional<at::Tensor>& mask, int64_t batch,
                                int64_t heads) {
  check(grad, "grad");
  const Heads g{batch, grad.size(0) / batch, heads, grad.size(1) / heads};
  TORCH_CHECK(grad.size(0) == g.rows() && grad.size(1) == g.width(), "grad must be [B*N, H*D]");
  check_mask(mask, grad, batch, g.n);
  auto dctx = at::empty({batch, heads, g.n, g.d}, grad.options());
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "merge_heads_backward", [&] {
    const scalar_t *gs = grad.data_ptr<scalar_t>(), *ms = mask_data<scalar_t>(mask);
    scalar_t* ds = dctx.data_ptr<scalar_t>();
    for_blocks(g.rows(), g.width(), [&](int64_t r0, int64_t r1, int64_t) {
      for (int64_t r = r0; r < r1; ++r) scatter_row(gs + r * g.width(), static_cast<const scalar_t*>(nullptr), ms, ds, g, r);
    });
  });
  return dctx;
}

// The keep mask [rows, cols] a call with this seed and p draws (for tests against the materialised form)
at::Tensor keep_mask(int64_t seed, int64_t rows, int64_t cols, double p) {
  auto mask = at::empty({rows, cols}, at::kBool);
  lra::fill_keep_mask(mask.data_ptr<bool>(), static_cast<uint64_t>(seed), 0, rows, cols, p);
  return mask;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("bias_dropout_add_forward", &bias_dropout_add_forward, "residual + dropout(y + bias): forward");
  module.def("bias_dropout_add_backward", &bias_dropout_add_backward, "residual + dropout(y + bias): backward");
  module.def("bias_dropout_add_norm_forward", &bias_dropout_add_norm_forward,
             "residual + dropout(y + bias), and its layer norm: forward");
  module.def("bias_dropout_add_norm_backward", &bias_dropout_add_norm_backward,
             "residual + dropout(y + bias), and its layer norm: backward");
  module.def("bias_gelu_dropout_forward", &bias_gelu_dropout_forward, "dropout(gelu(h + bias)): forward");
  module.def("bias_gelu_dropout_backward", &bias_gelu_dropout_backward, "dropout(gelu(h + bias)): backward");
  module.def("split_heads_forward", &split_heads_forward, "the qkv projection (+ bias) into heads: forward");
  module.def("split_heads_backward", &split_heads_backward, "the qkv projection (+ bias) into heads: backward");
  module.def("merge_heads_forward", &merge_heads_forward, "heads into token rows, times the mask: forward");
  module.def("merge_heads_backward", &merge_heads_backward, "heads into token rows, times the mask: backward");
  module.def("keep_mask", &keep_mask, "the dropout keep mask a call draws");
}
