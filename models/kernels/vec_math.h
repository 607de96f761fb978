// exp, max, sum and dot product for the compiled kernels' fp32 loops, written so that a compiler vectorises a loop
// over them: no calls, no branches, only arithmetic, rounding and bit operations (with `-fno-trapping-math`, GCC turns
// their selects into vector blends). fp64 (tests, the approximation study) uses the C library's exp.
//
// Why not ATen's exp: called on cache-sized blocks inside a kernel, at::exp_ cost ~2.4 ns an element on one core
// (a [128, 1989] block: ~600 us; this loop, with the subtraction and the scaling around it, ~50-170 us), and a fused
// pass wants the value in a register, not a block in memory.

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace lra {

// exp(x) for x <= 0 (what GELU needs): a Cephes-style range reduction and degree-6 polynomial, as ATen's vectorised
// exp (aten/src/ATen/cpu/vec/vec512/vec512_float.h), |relative error| about 1 ulp; flushes below exp(-87.3) to ~1e-38
inline float exp_nonpositive(float x) {
  x = x < -87.3365f ? -87.3365f : x;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// exp(x) for x <= 88 (a softmax's or log-sum-exp's arguments, <= 0 up to rounding): the polynomial above, and 0 below
// exp(-87.33), the smallest normal (torch's gives subnormals there, GELU's the floor), so exp(-inf) is 0
inline float exp_t(float x) { return x < -87.3365f ? 0.0f : exp_nonpositive(x); }
inline double exp_t(double x) { return std::exp(x); }

// max of x[0..w) (-inf for w = 0): element i in lane i % 16 of 16 running maxima, the tail in lane 0, then the lanes
// together. The lanes are held in 16-byte GCC vectors (a vector's compare-and-select is a max instruction, and four
// independent ones a step): written as an array of 16, GCC kept this loop scalar, ~0.15 ns an element on a Zen 5
// core against ~0.05 (a softmax row of 2,048 spent a third of its time here). 16 bytes because every x86-64 target
// has them: wider vectors ran ~0.035 in an AVX-512 clone but ~1.2 ns in baseline code, which lowers them element by
// element. The four vectors are then folded into one by vector maxima, and only its lanes compared one by one (were
// 15 dependent scalar compares): a row of 256 (Performer's features) ~0.10 -> ~0.056 ns an element, of 64 ~0.33 ->
// ~0.06. The maximum is the same in any order (only a row whose maximum is a zero of both signs may give the other).
template <typename T>
inline __attribute__((always_inline)) T maximum(const T* x, int64_t w) {
  constexpr int64_t kLanes = 16, kWidth = 16 / sizeof(T), kParts = kLanes / kWidth;
  typedef T Vector __attribute__((vector_size(kWidth * sizeof(T))));
  Vector top[kParts];
  for (int64_t p = 0; p < kParts; ++p)
    for (int64_t l = 0; l < kWidth; ++l) top[p][l] = -std::numeric_limits<T>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= w; i += kLanes)
    for (int64_t p = 0; p < kParts; ++p) {
      Vector next;
      std::memcpy(&next, x + i + p * kWidth, sizeof next);
      top[p] = next > top[p] ? next : top[p];
    }
  for (int64_t p = 1; p < kParts; ++p) top[0] = top[p] > top[0] ? top[p] : top[0];  // the vectors into one
  T lanes[kWidth];
  std::memcpy(lanes, top, sizeof lanes);
  for (; i < w; ++i) lanes[0] = x[i] > lanes[0] ? x[i] : lanes[0];
  T result = lanes[0];
  for (int64_t l = 1; l < kWidth; ++l) result = lanes[l] > result ? lanes[l] : result;
  return result;
}

// sum of term(0) .. term(n - 1), term j in lane j % 16 of 16 running sums, then the lanes in order (so that the loop
// vectorises, and a sum over a prefix followed by exact zeros is the prefix's sum bit for bit): every sum over a row
template <typename T, typename Term>
inline __attribute__((always_inline)) T lane_sum(int64_t n, const Term& term) {
  constexpr int64_t kLanes = 16;
  T lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += term(i + l);
  for (int64_t l = 0; i + l < n; ++l) lanes[l] += term(i + l);
  T total = T(0);
  for (int64_t l = 0; l < kLanes; ++l) total += lanes[l];
  return total;
}

// sum of x[0..n) (`lane_sum`)
template <typename T>
inline __attribute__((always_inline)) T sum(const T* x, int64_t n) {
  return lane_sum<T>(n, [x](int64_t j) __attribute__((always_inline)) { return x[j]; });
}

// p[0..n) = softmax of s[0..n) + bias[0..n), the biased scores left in s (p may be s): the maximum, exp, the sum in 16
// lanes, the scaling; where no key is attended (bias -inf on all of them) p is 0 rather than NaN
template <typename T>
inline __attribute__((always_inline)) void biased_softmax(T* s, const T* bias, T* p, int64_t n) {
  for (int64_t j = 0; j < n; ++j) s[j] += bias[j];
  const T top = maximum(s, n);
  const T shift = top == -std::numeric_limits<T>::infinity() ? T(0) : top;
  for (int64_t j = 0; j < n; ++j) p[j] = exp_t(s[j] - shift);
  const T total = sum(p, n);
  const T inverse = total > T(0) ? T(1) / total : T(0);
  for (int64_t j = 0; j < n; ++j) p[j] *= inverse;
}

// x . y over n elements (`lane_sum`)
template <typename T>
inline __attribute__((always_inline)) T dot(const T* x, const T* y, int64_t n) {
  return lane_sum<T>(n, [x, y](int64_t j) __attribute__((always_inline)) { return x[j] * y[j]; });
}

}  // namespace lra
