#include "models/drafters/flashmap_fold.h"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <thread>

// LAPACK (dsyevd: Householder tridiagonalisation, divide and conquer, back-transformation) and
// BLAS (dgemm) from OpenBLAS, which threads them itself. OpenBLAS's thread count is process-wide,
// so every call here holds one lock, sets the count it was asked for and restores the previous
// one: the fold runs at load time, while the backend's own pool is idle, and the two never run at
// once (no oversubscription); the rest of the program never calls BLAS.

namespace bs {
namespace {

std::mutex& blas_mutex() {
  static std::mutex m;
  return m;
}

// Holds the BLAS lock and OpenBLAS's thread count for one call.
class BlasThreads {
 public:
  explicit BlasThreads(int threads) : lock_(blas_mutex()), previous_(openblas_get_num_threads()) {
    if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    openblas_set_num_threads(threads);
  }
  ~BlasThreads() { openblas_set_num_threads(previous_); }
  BlasThreads(const BlasThreads&) = delete;
  BlasThreads& operator=(const BlasThreads&) = delete;

 private:
  std::lock_guard<std::mutex> lock_;
  int previous_;
};

}  // namespace

Result<SymmetricEigen> symmetric_eigen(std::vector<double> a, int64_t n, int threads) {
  if (n <= 0 || static_cast<int64_t>(a.size()) != n * n) {
    return InvalidArgument("symmetric_eigen: expected a {}x{} matrix, got {} values", n, n,
                           a.size());
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = i; k < n; ++k) {
      if (!std::isfinite(a[i * n + k])) {
        return InvalidArgument("symmetric_eigen: entry ({}, {}) is {}, expected a finite value", i,
                               k, a[i * n + k]);
      }
    }
  }
  // Row-major upper = column-major lower: LAPACK reads it in place, no transposed copy. On return
  // column-major column e (a[e * n + i]) is the eigenvector of w[e], ascending.
  std::vector<double> w(static_cast<size_t>(n));
  lapack_int info;
  {
    BlasThreads guard(threads);
    info = LAPACKE_dsyevd(LAPACK_COL_MAJOR, 'V', 'L', static_cast<lapack_int>(n), a.data(),
                          static_cast<lapack_int>(n), w.data());
  }
  if (info != 0) {
    return InvalidArgument("symmetric_eigen: LAPACK dsyevd failed on the {}x{} matrix (info {})", n,
                           n, info);
  }
  SymmetricEigen out;
  out.n = n;
  out.values.resize(static_cast<size_t>(n));
  out.vectors.resize(static_cast<size_t>(n * n));
  for (int64_t c = 0; c < n; ++c) {
    const int64_t src = n - 1 - c;  // descending
    const double* u = &a[src * n];
    // Canonical sign: the largest-magnitude entry (first on ties) positive.
    int64_t big = 0;
    for (int64_t i = 1; i < n; ++i) {
      if (std::abs(u[i]) > std::abs(u[big])) big = i;
    }
    const double sign = u[big] < 0 ? -1.0 : 1.0;
    out.values[c] = w[src];
    for (int64_t i = 0; i < n; ++i) out.vectors[i * n + c] = sign * u[i];
  }
  return out;
}

std::vector<double> matmul_f64(std::span<const double> a, std::span<const double> b, int64_t m,
                               int64_t k, int64_t n, int threads) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  if (m == 0 || n == 0 || k == 0) return c;
  BlasThreads guard(threads);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), 1.0, a.data(),
              static_cast<blasint>(k), b.data(), static_cast<blasint>(n), 0.0, c.data(),
              static_cast<blasint>(n));
  return c;
}

}  // namespace bs
