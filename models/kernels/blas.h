// Row-major matrix products for the compiled kernels straight through the BLAS torch's CPU build carries.
//
// Why not at::mm: a kernel that multiplies thousands of cache-sized blocks a call pays for a tensor view, a dispatch
// and an output check per block through ATen; the Fortran BLAS under it (MKL on x86-64, exported by libtorch_cpu —
// ATen's C++ wrapper at::native::cpublas::gemm is not exported to extensions) takes raw pointers. The same routine
// ATen's own products call.

#pragma once

#include <cstdint>

extern "C" {
// MKL's thread count for the calling thread (0 restores the global one); weak: absent from a BLAS other than MKL
int MKL_Set_Num_Threads_Local(int) __attribute__((weak));  // mkl_service.h's C name (the lower-case one is Fortran's)
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc);
}

namespace lra {

inline void gemm(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
                 const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
                 const int* ldc) {
  sgemm_(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void gemm(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
                 const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
                 const int* ldc) {
  dgemm_(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// The calling thread's products on one MKL thread while it lives. Why: MKL threads a product itself when called
// outside an OpenMP parallel region (a kernel's parallel loop over one group, or torch at 2 threads running it inline)
// and sums in another order than its one-thread kernel: Performer's and polynomial attention's blocked summaries
// differed in their last bits between 1 and 2 torch threads. A kernel's own parallel loop is its only threading.
class OneBlasThread {
 public:
  OneBlasThread() : previous_(MKL_Set_Num_Threads_Local ? MKL_Set_Num_Threads_Local(1) : 0) {}
  ~OneBlasThread() {
    if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(previous_);
  }
  OneBlasThread(const OneBlasThread&) = delete;
  OneBlasThread& operator=(const OneBlasThread&) = delete;

 private:
  int previous_;
};

// row-major C[M, N] = alpha * op(A) op(B) + beta * C, op(X) = X or its transpose (`ta`, `tb`; A stored [M, K] or
// [K, M], B [K, N] or [N, K], each with its row stride): the column-major BLAS computing C^T = op(B)^T op(A)^T
template <typename T>
void product(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
             int64_t ldb, T beta, T* C, int64_t ldc) {
  const int m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
  const int la = static_cast<int>(ldb), lb = static_cast<int>(lda), lc = static_cast<int>(ldc);
  const OneBlasThread one;
  gemm(tb ? "T" : "N", ta ? "T" : "N", &m, &n, &k, &alpha, B, &la, A, &lb, &beta, C, &lc);
}

// x [rows, cols] (row-major) -> xt [cols, rows]: a block into its columns for a product that takes it so, and a
// transposed result back into rows (the loop writes its output contiguously)
template <typename T>
void transpose_into(const T* x, int64_t rows, int64_t cols, T* xt) {
  for (int64_t a = 0; a < cols; ++a)
    for (int64_t r = 0; r < rows; ++r) xt[a * rows + r] = x[r * cols + a];
}

}  // namespace lra
