// The dropout mask every compiled kernel makes in place: a counter-based hash of (seed, stream, row, column).
//
// Why a hash: a kernel that draws its mask from a hash of the element's position needs neither a stored mask nor a
// generator's state in its backward (it regenerates the mask from the seed, as FlashAttention does on GPUs), and the
// mask depends only on the seed and the position, never on the thread count or how the work is blocked. The seed
// comes from torch's default generator (one draw per call, `models/kernels/__init__.py`), so a run stays
// reproducible from its seed and resumes bit-identically.
//
// Each element is kept when its 32-bit hash is >= round(p * 2^32): with probability 1 - p', p' = that threshold
// / 2^32, and kept values are scaled by 1 / (1 - p'). The loops are compiled for AVX-512, AVX2 and a baseline and
// picked by the dynamic loader (GCC target_clones), never -march=native: one build serves every x86-64 node.

#pragma once

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LRA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LRA_CLONES
#endif

namespace lra {

// murmur3's 32-bit finaliser: a bijection with full avalanche, so consecutive counters give independent bits
inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  x ^= x >> 16;
  return x;
}

// the key of one row of one stream (a (batch, head) of attention weights; 0 for a [rows, features] activation):
// every element's bits are mix32(row_key + column * golden)
inline uint32_t row_key(uint64_t seed, int64_t stream, int64_t row, int64_t rows) {
  const uint64_t counter = static_cast<uint64_t>(stream) * static_cast<uint64_t>(rows) + static_cast<uint64_t>(row);
  uint32_t key = mix32(static_cast<uint32_t>(seed) ^ mix32(static_cast<uint32_t>(seed >> 32) + 0x9e3779b9u));
  key = mix32(key ^ static_cast<uint32_t>(counter));
  return mix32(key + static_cast<uint32_t>(counter >> 32) * 0x85ebca6bu);
}

inline bool kept(uint32_t key, int64_t column, uint32_t threshold) {
  return mix32(key + static_cast<uint32_t>(column) * 0x9e3779b9u) >= threshold;
}

// the threshold a hash must reach to keep its element: round(p * 2^32), at most 2^32 - 1
inline uint32_t drop_threshold(double p) {
  TORCH_CHECK(p >= 0.0 && p < 1.0, "dropout must be in [0, 1), got ", p);
  return static_cast<uint32_t>(std::min(std::llround(p * 4294967296.0), 4294967295LL));
}

// 1 / (1 - p') for the threshold's p'
inline double keep_scale(uint32_t threshold) { return 4294967296.0 / (4294967296.0 - static_cast<double>(threshold)); }

// what element `column` of a row is multiplied by: scale where kept, 0 where dropped (a select between two
// constants, so the loops that use it vectorise on AVX2 too, where a conditional load would not)
template <typename T>
inline __attribute__((always_inline)) T keep_factor(uint32_t key, int64_t column, uint32_t threshold, T scale) {
  return kept(key, column, threshold) ? scale : T(0);
}

// out[j] = x[j] * keep_factor: a dropout forward, and (with x the gradient) its backward — the eager form's
// x * (keep * scale). (The clones are static: every kernel is one translation unit, with its own copies and resolver.)
template <typename T>
inline __attribute__((always_inline)) void drop_row_impl(const T* x, T* out, int64_t n, uint32_t key,
                                                           uint32_t threshold, T scale) {
  for (int64_t j = 0; j < n; ++j) out[j] = x[j] * keep_factor(key, j, threshold, scale);
}

static LRA_CLONES void drop_row(const float* x, float* out, int64_t n, uint32_t key, uint32_t threshold,
                                float scale) {
  drop_row_impl(x, out, n, key, threshold, scale);
}
static LRA_CLONES void drop_row(const double* x, double* out, int64_t n, uint32_t key, uint32_t threshold,
                                double scale) {
  drop_row_impl(x, out, n, key, threshold, scale);
}

// the keep mask of rows [0, n) x columns [0, m) of one stream, as a kernel draws it (for tests)
inline void fill_keep_mask(bool* mask, uint64_t seed, int64_t stream, int64_t n, int64_t m, double p) {
  const uint32_t threshold = drop_threshold(p);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t key = row_key(seed, stream, i, n);
    for (int64_t j = 0; j < m; ++j) mask[i * m + j] = kept(key, j, threshold);
  }
}

}  // namespace lra
