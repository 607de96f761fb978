// Performer's FAVOR+ core, forward and backward, 64 rows at a time in cache: no [N, M] tensor of projections or
// features is ever written to memory.
//
// What it computes, per group g (a batch and head) with x = q or k [N, D] (already scaled), W [M, D] (the head's,
// or one shared by the heads), [V | 1] [N, E] and eps = the features' epsilon:
//   proj = x W^T,  half = |x|^2 / 2,  stat = max_m proj - half (eps = 0) or max_m proj (eps > 0),
//   queries: offset = half + stat,                      phi(q) = exp(proj - offset) + eps
//   keys:    offset = half + shift, shift = max over the valid keys of stat (0 when none is),
//            phi(k) = exp(proj - offset) + eps, and 0 for a key the mask drops (no eps)
//   S^T = [V | 1]^T phi(K)  [E, M],   both = phi(Q) S  [N, E]
// with the shifts constants (detached) and the offsets' |x|^2 / 2 differentiated, as PerformerAttention's eager
// chain (`_factors`, `FeatureMix`) computes them.
//
// Why: the chain forms the projections of q and of k ([B, H, N, M], 64 MiB each at the ListOps shape B 32, H 2,
// N 2048, M 256) with products that write them to memory (64 GFLOP/s on one Zen 5 thread where the same product into
// a cache-sized block runs at 86, the square yardstick at 91-94), reads them back for the row maxima, for the
// exponential, for the mix, and the backward reads and writes as many of their gradients: ~0.3 s of a ~1.4 s
// training step in memory passes and slowed products. Here a thread's 64-row block of projections, features and
// their gradients stays in its L2 and is multiplied there.
//
// The keys' shift is the maximum over all keys, known only after the last block: `summary` keeps it running and
// rescales the sum S^T made so far by exp(old - new) when a block raises it (an online maximum, as flash attention
// keeps its softmax's), the eps part (eps * sum of [V | 1] over the valid keys) kept apart, unscaled. The backward
// recomputes each block's projections and exponentials from x (two more x W^T products a layer) with the offsets
// the forward saved. Rounding: exp to ~1 ulp (vec_math.h: flushed to 0 below exp(-87.3)), the products summed by the
// BLAS in other orders than the chain's, the rescaling one more rounding: fp32 rounding. Groups are independent and
// each is summed in one order, so no result depends on the thread count.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "blas.h"          // product, transpose_into
#include "hash_dropout.h"  // LRA_CLONES
#include "kernel_args.h"
#include "vec_math.h"  // exp_t, maximum, sum, dot

namespace {

using lra::check;
using lra::product;
using lra::transpose_into;

constexpr int64_t kBlock = 64;  // rows a block: 64 x 256 fp32 projections = 64 KiB a buffer, four of them in L2

// the shapes of one call: G groups of n rows of d, m features, e = D + 1 value columns; `heads` picks W's head
struct Shape {
  int64_t groups, n, d, m, e, heads, w_heads;
  const void* w;
  template <typename T>
  const T* w_of(int64_t g) const {  // the group's W [m, d]
    return static_cast<const T*>(w) + (w_heads == 1 ? 0 : g % heads) * m * d;
  }
};

Shape shape_of(const at::Tensor& x, const at::Tensor& w, int64_t heads, int64_t e) {
  TORCH_CHECK(x.dim() == 3, "x must be [G, N, D]");
  TORCH_CHECK(w.dim() == 3 && w.size(2) == x.size(2), "w must be [1 or H, M, D]");
  TORCH_CHECK(heads >= 1 && x.size(0) % heads == 0, "the groups must be batches of `heads` heads");
  TORCH_CHECK(w.size(0) == 1 || w.size(0) == heads, "w must have one head or `heads`");
  return {x.size(0), x.size(1), x.size(2), w.size(1), e, heads, w.size(0), w.data_ptr()};
}

// one thread's block buffers: the projections (then their exponentials), the features, their gradients [kBlock, m],
// a transposed result [max(e, d), kBlock] and the rows' offsets and offset gradients. One ATen allocation (64-byte
// aligned) cut at multiples of kBlock elements: the BLAS's summation order may follow its operands' alignment, and
// each thread's own heap blocks (std::vector) gave 1 and 2 threads different bits.
template <typename T>
struct Block {
  at::Tensor storage;
  T *expo, *phi, *grad, *out, *offset, *grad_offset;
  Block(const Shape& s, const at::TensorOptions& options)
      : storage(at::empty({kBlock * (3 * s.m + std::max(s.e, s.d) + 2)}, options)),
        expo(storage.data_ptr<T>()),
        phi(expo + kBlock * s.m),
        grad(phi + kBlock * s.m),
        out(grad + kBlock * s.m),
        offset(out + kBlock * std::max(s.e, s.d)),
        grad_offset(offset + kBlock) {}
};

// fn(g, b) for every group, in parallel, with this thread's block buffers b
template <typename T, typename Fn>
void each_group(const Shape& s, const at::TensorOptions& options, const Fn& fn) {
  at::parallel_for(0, s.groups, 1, [&](int64_t begin, int64_t end) {
    Block<T> b(s, options);
    for (int64_t g = begin; g < end; ++g) fn(g, b);
  });
}

// fn(row, rows) for a group's blocks [row, row + rows) of up to kBlock rows, in order
template <typename Fn>
void each_block(const Shape& s, const Fn& fn) {
  for (int64_t row = 0; row < s.n; row += kBlock) fn(row, std::min(kBlock, s.n - row));
}

// the row's |x|^2 / 2 and its statistic (max_m proj, less |x|^2 / 2 without eps)
template <typename T>
inline void row_stat(const T* x, const T* proj, const Shape& s, bool eps, T& half, T& stat) {
  half = lra::dot(x, x, s.d) / T(2);
  const T top = lra::maximum(proj, s.m);
  stat = eps ? top : top - half;
}

// expo[j] = exp(proj[j] - offset) in place; phi[j] = expo[j] + floor
template <typename T>
inline __attribute__((always_inline)) void features_row_impl(T* proj, T offset, T floor, T* phi, int64_t m) {
  for (int64_t j = 0; j < m; ++j) {
    proj[j] = lra::exp_t(proj[j] - offset);
    phi[j] = proj[j] + floor;
  }
}
LRA_CLONES void features_row(float* proj, float offset, float floor, float* phi, int64_t m) {
  features_row_impl(proj, offset, floor, phi, m);
}
LRA_CLONES void features_row(double* proj, double offset, double floor, double* phi, int64_t m) {
  features_row_impl(proj, offset, floor, phi, m);
}

// grad[j] *= expo[j] (the projections' gradient); returns -sum_j of it (the offset's gradient), in 16 lanes
template <typename T>
inline __attribute__((always_inline)) T through_exp_impl(T* grad, const T* expo, int64_t m) {
  for (int64_t j = 0; j < m; ++j) grad[j] *= expo[j];
  return -lra::sum(grad, m);
}
LRA_CLONES float through_exp(float* grad, const float* expo, int64_t m) { return through_exp_impl(grad, expo, m); }
LRA_CLONES double through_exp(double* grad, const double* expo, int64_t m) { return through_exp_impl(grad, expo, m); }

// the block's projections x_blk W^T into b.expo
template <typename T>
void project(const T* x, int64_t rows, const Shape& s, const T* w, Block<T>& b) {
  product<T>(false, true, rows, s.m, s.d, 1, x, s.d, w, s.d, 0, b.expo, s.m);
}

// dx_blk = dproj W + x * grad_offset (the offset's |x|^2 / 2), the block's projection gradients in b.grad
template <typename T>
void fold(const T* x, int64_t rows, const Shape& s, const T* w, Block<T>& b, T* dx) {
  product<T>(false, false, rows, s.d, s.m, 1, b.grad, s.m, w, s.d, 0, dx, s.d);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t a = 0; a < s.d; ++a) dx[r * s.d + a] += x[r * s.d + a] * b.grad_offset[r];
}

template <typename T>
const T* valid_of(const std::optional<at::Tensor>& valid) {
  return valid.has_value() ? valid->data_ptr<T>() : nullptr;
}

void check_valid(const std::optional<at::Tensor>& valid, const at::Tensor& x, const Shape& s) {
  if (!valid.has_value()) return;
  check(*valid, "valid");
  TORCH_CHECK(valid->scalar_type() == x.scalar_type(), "valid must have x's dtype");
  TORCH_CHECK(valid->numel() == s.groups / s.heads * s.n, "valid must be [B, N]");
}

void check_rows(const at::Tensor& x, const at::Tensor& a, const char* name, int64_t cols) {
  TORCH_CHECK(a.dim() == 3 && a.size(0) == x.size(0) && a.size(1) == x.size(1) && a.size(2) == cols, name,
              " must be [G, N, ", cols, "]");
}

void check_summary(const at::Tensor& st, const Shape& s, const char* name) {
  TORCH_CHECK(st.dim() == 3 && st.size(0) == s.groups && st.size(1) == s.e && st.size(2) == s.m, name,
              " must be [G, E, M]");
}

}  // namespace

// keys [G, N, D], w [1 or H, M, D], values [G, N, E], valid [B, N] (1 keeps a key) or None, heads H, eps
// -> S^T [G, E, M] = [V | 1]^T phi(K), shift [G]
std::vector<at::Tensor> summary(const at::Tensor& keys, const at::Tensor& w, const at::Tensor& values,
                                const std::optional<at::Tensor>& valid, int64_t heads, double eps) {
  check({{&keys, "keys"}, {&w, "w"}, {&values, "values"}});
  const Shape s = shape_of(keys, w, heads, values.size(-1));
  check_rows(keys, values, "values", s.e);
  check_valid(valid, keys, s);
  auto summary_t = at::empty({s.groups, s.e, s.m}, keys.options());
  auto shift = at::empty({s.groups}, keys.options());
  AT_DISPATCH_FLOATING_TYPES(keys.scalar_type(), "performer_summary", [&] {
    using T = scalar_t;
    const T* ok = valid_of<T>(valid);
    const T floor = static_cast<T>(eps);
    each_group<T>(s, keys.options(), [&](int64_t g, Block<T>& b) {
      T* st = summary_t.data_ptr<T>() + g * s.e * s.m;
      std::fill(st, st + s.e * s.m, T(0));
      std::vector<T> kept(s.e, T(0));  // eps * [V | 1] summed over the valid keys: the unscaled part of S^T
      T running = -std::numeric_limits<T>::infinity();
      const T* w_g = s.w_of<T>(g);
      each_block(s, [&](int64_t row, int64_t rows) {
        const T* x = keys.data_ptr<T>() + (g * s.n + row) * s.d;
        const T* v = values.data_ptr<T>() + (g * s.n + row) * s.e;
        const T* keep = ok ? ok + (g / s.heads) * s.n + row : nullptr;
        project(x, rows, s, w_g, b);
        T top = -std::numeric_limits<T>::infinity();
        for (int64_t r = 0; r < rows; ++r) {
          if (keep && keep[r] == T(0)) continue;
          T stat;
          row_stat(x + r * s.d, b.expo + r * s.m, s, eps > 0, b.offset[r], stat);  // offset: half for now
          top = std::max(top, stat);
        }
        if (top > running) {  // a larger shift: what S^T holds so far, times exp(old - new)
          if (running != -std::numeric_limits<T>::infinity()) {
            const T rescale = lra::exp_t(running - top);
            for (int64_t i = 0; i < s.e * s.m; ++i) st[i] *= rescale;
          }
          running = top;
        }
        for (int64_t r = 0; r < rows; ++r) {  // the exponentials in place (the eps part is kept apart)
          T* e = b.expo + r * s.m;
          if (keep && keep[r] == T(0)) {
            std::fill(e, e + s.m, T(0));
            continue;
          }
          features_row(e, b.offset[r] + running, T(0), e, s.m);
          for (int64_t c = 0; c < s.e; ++c) kept[c] += floor * v[r * s.e + c];
        }
        product<T>(true, false, s.e, s.m, rows, 1, v, s.e, b.expo, s.m, 1, st, s.m);  // S^T += V^T e
      });
      for (int64_t c = 0; c < s.e; ++c)
        for (int64_t j = 0; j < s.m; ++j) st[c * s.m + j] += kept[c];
      shift.data_ptr<T>()[g] = running == -std::numeric_limits<T>::infinity() ? T(0) : running;
    });
  });
  return {summary_t, shift};
}

// queries [G, N, D], w, S^T [G, E, M] -> both = phi(Q) S [G, N, E], offsets [G, N]. Each block's product is formed
// transposed, S^T phi_blk^T [E, rows], and copied into place (an [rows, 33] output runs the BLAS on a column tile and
// a sliver).
std::vector<at::Tensor> apply(const at::Tensor& queries, const at::Tensor& w, const at::Tensor& summary_t,
                              int64_t heads, double eps) {
  check({{&queries, "queries"}, {&w, "w"}, {&summary_t, "summary_t"}});
  const Shape s = shape_of(queries, w, heads, summary_t.size(1));
  check_summary(summary_t, s, "summary_t");
  auto both = at::empty({s.groups, s.n, s.e}, queries.options());
  auto offsets = at::empty({s.groups, s.n}, queries.options());
  AT_DISPATCH_FLOATING_TYPES(queries.scalar_type(), "performer_apply", [&] {
    using T = scalar_t;
    const T floor = static_cast<T>(eps);
    each_group<T>(s, queries.options(), [&](int64_t g, Block<T>& b) {
      const T* w_g = s.w_of<T>(g);
      const T* st = summary_t.data_ptr<T>() + g * s.e * s.m;
      each_block(s, [&](int64_t row, int64_t rows) {
        const T* x = queries.data_ptr<T>() + (g * s.n + row) * s.d;
        T* off = offsets.data_ptr<T>() + g * s.n + row;
        project(x, rows, s, w_g, b);
        for (int64_t r = 0; r < rows; ++r) {
          T half, stat;
          row_stat(x + r * s.d, b.expo + r * s.m, s, eps > 0, half, stat);
          off[r] = half + stat;
          features_row(b.expo + r * s.m, off[r], floor, b.phi + r * s.m, s.m);
        }
        product<T>(false, true, s.e, rows, s.m, 1, st, s.m, b.phi, s.m, 0, b.out, rows);
        transpose_into(b.out, s.e, rows, both.data_ptr<T>() + (g * s.n + row) * s.e);
      });
    });
  });
  return {both, offsets};
}

// queries, w, the forward's offsets [G, N], grad_both [G, N, E], S^T -> dq [G, N, D], dS^T [G, E, M]
std::vector<at::Tensor> backward_queries(const at::Tensor& queries, const at::Tensor& w, const at::Tensor& offsets,
                                         const at::Tensor& grad_both, const at::Tensor& summary_t, int64_t heads,
                                         double eps) {
  check({{&queries, "queries"}, {&w, "w"}, {&offsets, "offsets"}, {&grad_both, "grad_both"},
         {&summary_t, "summary_t"}});
  const Shape s = shape_of(queries, w, heads, summary_t.size(1));
  check_summary(summary_t, s, "summary_t");
  check_rows(queries, grad_both, "grad_both", s.e);
  TORCH_CHECK(offsets.numel() == s.groups * s.n, "offsets must be [G, N]");
  auto dq = at::empty_like(queries);
  auto grad_summary_t = at::zeros_like(summary_t);
  AT_DISPATCH_FLOATING_TYPES(queries.scalar_type(), "performer_backward_queries", [&] {
    using T = scalar_t;
    const T floor = static_cast<T>(eps);
    each_group<T>(s, queries.options(), [&](int64_t g, Block<T>& b) {
      const T* w_g = s.w_of<T>(g);
      const T* st = summary_t.data_ptr<T>() + g * s.e * s.m;
      T* dst = grad_summary_t.data_ptr<T>() + g * s.e * s.m;
      each_block(s, [&](int64_t row, int64_t rows) {
        const T* x = queries.data_ptr<T>() + (g * s.n + row) * s.d;
        const T* go = grad_both.data_ptr<T>() + (g * s.n + row) * s.e;
        const T* off = offsets.data_ptr<T>() + g * s.n + row;
        project(x, rows, s, w_g, b);
        for (int64_t r = 0; r < rows; ++r) features_row(b.expo + r * s.m, off[r], floor, b.phi + r * s.m, s.m);
        product<T>(true, false, s.e, s.m, rows, 1, go, s.e, b.phi, s.m, 1, dst, s.m);   // dS^T += G^T phi
        product<T>(false, false, rows, s.m, s.e, 1, go, s.e, st, s.m, 0, b.grad, s.m);  // dphi = G S^T
        for (int64_t r = 0; r < rows; ++r) b.grad_offset[r] = through_exp(b.grad + r * s.m, b.expo + r * s.m, s.m);
        fold(x, rows, s, w_g, b, dq.data_ptr<T>() + (g * s.n + row) * s.d);
      });
    });
  });
  return {dq, grad_summary_t};
}

// keys, w, values, valid, the forward's shift [G], dS^T [G, E, M] -> dk [G, N, D], dvalues [G, N, E]
std::vector<at::Tensor> backward_keys(const at::Tensor& keys, const at::Tensor& w, const at::Tensor& values,
                                      const std::optional<at::Tensor>& valid, const at::Tensor& shift,
                                      const at::Tensor& grad_summary_t, int64_t heads, double eps) {
  check({{&keys, "keys"}, {&w, "w"}, {&values, "values"}, {&shift, "shift"}, {&grad_summary_t, "grad_summary_t"}});
  const Shape s = shape_of(keys, w, heads, values.size(-1));
  check_rows(keys, values, "values", s.e);
  check_valid(valid, keys, s);
  check_summary(grad_summary_t, s, "grad_summary_t");
  TORCH_CHECK(shift.numel() == s.groups, "shift must be [G]");
  auto dk = at::empty_like(keys), dvalues = at::empty_like(values);
  AT_DISPATCH_FLOATING_TYPES(keys.scalar_type(), "performer_backward_keys", [&] {
    using T = scalar_t;
    const T* ok = valid_of<T>(valid);
    const T floor = static_cast<T>(eps);
    each_group<T>(s, keys.options(), [&](int64_t g, Block<T>& b) {
      const T* w_g = s.w_of<T>(g);
      const T* dst = grad_summary_t.data_ptr<T>() + g * s.e * s.m;
      each_block(s, [&](int64_t row, int64_t rows) {
        const T* x = keys.data_ptr<T>() + (g * s.n + row) * s.d;
        const T* v = values.data_ptr<T>() + (g * s.n + row) * s.e;
        const T* keep = ok ? ok + (g / s.heads) * s.n + row : nullptr;
        project(x, rows, s, w_g, b);
        for (int64_t r = 0; r < rows; ++r) {
          T* e = b.expo + r * s.m;
          if (keep && keep[r] == T(0)) {  // a dropped key: features 0, no gradient
            std::fill(e, e + s.m, T(0));
            std::fill(b.phi + r * s.m, b.phi + (r + 1) * s.m, T(0));
            continue;
          }
          const T half = lra::dot(x + r * s.d, x + r * s.d, s.d) / T(2);
          features_row(e, half + shift.data_ptr<T>()[g], floor, b.phi + r * s.m, s.m);
        }
        // dvalues_blk^T = dS^T phi_blk^T [E, rows], copied into place; dphi = [V | 1]_blk dS^T
        product<T>(false, true, s.e, rows, s.m, 1, dst, s.m, b.phi, s.m, 0, b.out, rows);
        transpose_into(b.out, s.e, rows, dvalues.data_ptr<T>() + (g * s.n + row) * s.e);
        product<T>(false, false, rows, s.m, s.e, 1, v, s.e, dst, s.m, 0, b.grad, s.m);
        for (int64_t r = 0; r < rows; ++r) b.grad_offset[r] = through_exp(b.grad + r * s.m, b.expo + r * s.m, s.m);
        fold(x, rows, s, w_g, b, dk.data_ptr<T>() + (g * s.n + row) * s.d);
      });
    });
  });
  return {dk, dvalues};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("summary", &summary, "Performer's S^T = [V | 1]^T phi(K) and the keys' shift, block by block");
  module.def("apply", &apply, "Performer's phi(Q) S and the queries' offsets, block by block");
  module.def("backward_queries", &backward_queries, "the queries' gradient and dS^T, block by block");
  module.def("backward_keys", &backward_keys, "the keys' and [V | 1]'s gradients, block by block");
}
