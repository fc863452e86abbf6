// Host-side linear algebra of the FlashMap noise fold (load time only), through LAPACK and BLAS
// (OpenBLAS): a symmetric eigensolver in double and the canonical eigenbasis of EᵀE
// (FlashMapConventions), and the double GEMM that folds it into x_embed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace bs {

struct SymmetricEigen {
  int64_t n = 0;
  std::vector<double> values;   // [n], descending
  std::vector<double> vectors;  // [n, n] row-major; eigenvector e is column e: vectors[i * n + e]
};

// Eigen-decomposition A = U diag(values) Uᵀ of a symmetric a[n, n] (row-major; only symmetry is
// assumed, not definiteness, and only the upper triangle is read) by LAPACK's dsyevd (divide and
// conquer). Values come sorted descending and every eigenvector is signed so that its
// largest-magnitude entry (first on ties) is positive, so the basis is canonical for distinct
// eigenvalues. O(n³), on `threads` BLAS threads (<= 0: the hardware's). A non-finite entry is an
// InvalidArgument.
Result<SymmetricEigen> symmetric_eigen(std::vector<double> a, int64_t n, int threads = 0);

// C [m, n] = A [m, k] B [k, n], all row-major, by BLAS's dgemm on `threads` threads (<= 0: the
// hardware's).
std::vector<double> matmul_f64(std::span<const double> a, std::span<const double> b, int64_t m,
                               int64_t k, int64_t n, int threads = 0);

}  // namespace bs
