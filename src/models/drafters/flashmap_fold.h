// Host-side linear algebra of the FlashMap noise fold (load time only): a symmetric eigensolver
// in double and the canonical eigenbasis of EᵀE (FlashMapConventions).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace bs {

struct SymmetricEigen {
  int64_t n = 0;
  std::vector<double> values;   // [n], descending
  std::vector<double> vectors;  // [n, n] row-major; eigenvector e is column e: vectors[i * n + e]
};

// Eigen-decomposition A = U diag(values) Uᵀ of a symmetric a[n, n] (row-major; only symmetry is
// assumed, not definiteness, and only the upper triangle is read): blocked Householder
// tridiagonalisation, divide and conquer on the tridiagonal, blocked back-transformation. Values
// come sorted descending and every eigenvector is signed so that its largest-magnitude entry
// (first on ties) is positive, so the basis is canonical for distinct eigenvalues. O(n³), on
// `threads` host threads (<= 0: the hardware's); the result does not depend on the thread count.
Result<SymmetricEigen> symmetric_eigen(std::vector<double> a, int64_t n, int threads = 0);

}  // namespace bs
