// Skyformer's Gaussian kernel from its logits, forward and backward, one pass over the [n, p] kernel each:
//
//   kappa = exp(min(s, 0)),   d s = grad * kappa where s <= 0, else 0,
//
// s = a.b - |a|^2/2 - |b|^2/2 (<= 0 but for rounding; -1e4 lower on a left-out row, whose kernel is then exactly 0).
//
// Why: through ATen these are a clamp and an exponential forward, and a product, a comparison and a select backward:
// five passes over [B, H, n, m] tensors (32 MiB each at B = 32, H = 2, n = 2048, m = 128), ~250 ms of Skyformer's
// ~1.7 s training step on one Zen 5 core (loaded). ATen's exp of the [m, n] kernel ran at ~3.4 ns an element, against
// ~0.7 for the [n, m] one: exponents between -104 and -87 (far pairs) give subnormal results, which the core computes
// through slow assists. Here the exponential is vec_math.h's (flushed to 0 below exp(-87.3): no subnormals) in
// vectorised loops compiled for AVX-512, AVX2 and a baseline and picked at load time, and the backward recomputes it
// from the logits (the same values) instead of reading a saved copy and a saved mask, its products flushed to zero
// where they would be subnormal (`FlushSubnormals`). Values are ATen's at fp32 rounding, but for subnormals
// (< 1.2e-38), which are 0 here. Elements are independent, so no result depends on the thread count.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cstdint>
#include <vector>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "hash_dropout.h"  // LRA_CLONES
#include "kernel_args.h"
#include "vec_math.h"  // exp_t

namespace {

using lra::check;
using lra::exp_t;

template <typename T>
inline __attribute__((always_inline)) void forward_span_impl(const T* s, T* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = exp_t(s[j] < T(0) ? s[j] : T(0));
}

LRA_CLONES void forward_span(const float* s, float* out, int64_t n) { forward_span_impl(s, out, n); }
LRA_CLONES void forward_span(const double* s, double* out, int64_t n) { forward_span_impl(s, out, n); }

// torch's clamp passes the gradient where the input is within the bound, s <= 0 included
template <typename T>
inline __attribute__((always_inline)) void backward_span_impl(const T* grad, const T* s, T* grad_s, int64_t n) {
  for (int64_t j = 0; j < n; ++j) grad_s[j] = s[j] <= T(0) ? grad[j] * exp_t(s[j]) : T(0);
}

LRA_CLONES void backward_span(const float* grad, const float* s, float* grad_s, int64_t n) {
  backward_span_impl(grad, s, grad_s, n);
}
LRA_CLONES void backward_span(const double* grad, const double* s, double* grad_s, int64_t n) {
  backward_span_impl(grad, s, grad_s, n);
}

constexpr int64_t kGrain = 1 << 16;  // elements per parallel task

// Flush-to-zero for the enclosing scope of this thread (x86: MXCSR's FTZ bit), the previous mode restored after: the
// backward's product of a gradient and a kernel value near exp(-87) is often subnormal, and each such result costs a
// slow assist (the backward of a [32, 2, 128, 2048] kernel: 31 ms unflushed, 20 ms flushed). Flushed, it is 0.
struct FlushSubnormals {
#if defined(__SSE__)
  unsigned int saved = _mm_getcsr();
  FlushSubnormals() { _mm_setcsr(saved | _MM_FLUSH_ZERO_ON); }
  ~FlushSubnormals() { _mm_setcsr(saved); }
#endif
};

}  // namespace

// logits (any shape, contiguous) -> exp(min(logits, 0))
at::Tensor forward(const at::Tensor& logits) {
  check(logits, "logits");
  auto out = at::empty_like(logits);
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "clamped_exp_forward", [&] {
    const scalar_t* s = logits.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, logits.numel(), kGrain,
                     [&](int64_t begin, int64_t end) { forward_span(s + begin, o + begin, end - begin); });
  });
  return out;
}

// grad and the forward's logits -> the logits' gradient
at::Tensor backward(const at::Tensor& grad, const at::Tensor& logits) {
  check({{&grad, "grad"}, {&logits, "logits"}});
  TORCH_CHECK(grad.sizes() == logits.sizes(), "grad must have the logits' shape");
  auto grad_logits = at::empty_like(logits);
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "clamped_exp_backward", [&] {
    const scalar_t *g = grad.data_ptr<scalar_t>(), *s = logits.data_ptr<scalar_t>();
    scalar_t* d = grad_logits.data_ptr<scalar_t>();
    at::parallel_for(0, logits.numel(), kGrain, [&](int64_t begin, int64_t end) {
      const FlushSubnormals flush;
      backward_span(g + begin, s + begin, d + begin, end - begin);
    });
  });
  return grad_logits;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("forward", &forward, "Skyformer's Gaussian kernel exp(min(logits, 0)): forward");
  module.def("backward", &backward, "Skyformer's Gaussian kernel exp(min(logits, 0)): backward");
}
