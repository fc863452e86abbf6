#include "core/dgemm.h"

#include <algorithm>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BS_DGEMM_X86 1
#endif

namespace bs {
namespace {

// Register block MR x NR, cache blocks KC (depth of one packed pass), MC x NC (one task: an MC x KC
// block of A stays in L2 while it meets NC / NR column panels of B, each KC x NR in L1).
constexpr int64_t kMR = 6, kNR = 8, kKC = 256, kMC = 96, kNC = 512;

// ab[MR][NR] = Σ_p a[p][0..MR) ⊗ b[p][0..NR) over kc packed steps.
void kernel_generic(int64_t kc, const double* a, const double* b, double* ab) {
  double acc[kMR][kNR] = {};
  for (int64_t p = 0; p < kc; ++p, a += kMR, b += kNR) {
    for (int64_t i = 0; i < kMR; ++i) {
      for (int64_t j = 0; j < kNR; ++j) acc[i][j] += a[i] * b[j];
    }
  }
  for (int64_t i = 0; i < kMR; ++i) {
    for (int64_t j = 0; j < kNR; ++j) ab[i * kNR + j] = acc[i][j];
  }
}

#ifdef BS_DGEMM_X86
__attribute__((target("avx2,fma"))) void kernel_fma(int64_t kc, const double* a, const double* b,
                                                    double* ab) {
  __m256d c00 = _mm256_setzero_pd(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
          c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t p = 0; p < kc; ++p, a += kMR, b += kNR) {
    const __m256d b0 = _mm256_loadu_pd(b), b1 = _mm256_loadu_pd(b + 4);
    __m256d x = _mm256_broadcast_sd(a);
    c00 = _mm256_fmadd_pd(x, b0, c00);
    c01 = _mm256_fmadd_pd(x, b1, c01);
    x = _mm256_broadcast_sd(a + 1);
    c10 = _mm256_fmadd_pd(x, b0, c10);
    c11 = _mm256_fmadd_pd(x, b1, c11);
    x = _mm256_broadcast_sd(a + 2);
    c20 = _mm256_fmadd_pd(x, b0, c20);
    c21 = _mm256_fmadd_pd(x, b1, c21);
    x = _mm256_broadcast_sd(a + 3);
    c30 = _mm256_fmadd_pd(x, b0, c30);
    c31 = _mm256_fmadd_pd(x, b1, c31);
    x = _mm256_broadcast_sd(a + 4);
    c40 = _mm256_fmadd_pd(x, b0, c40);
    c41 = _mm256_fmadd_pd(x, b1, c41);
    x = _mm256_broadcast_sd(a + 5);
    c50 = _mm256_fmadd_pd(x, b0, c50);
    c51 = _mm256_fmadd_pd(x, b1, c51);
  }
  _mm256_storeu_pd(ab + 0, c00);
  _mm256_storeu_pd(ab + 4, c01);
  _mm256_storeu_pd(ab + 8, c10);
  _mm256_storeu_pd(ab + 12, c11);
  _mm256_storeu_pd(ab + 16, c20);
  _mm256_storeu_pd(ab + 20, c21);
  _mm256_storeu_pd(ab + 24, c30);
  _mm256_storeu_pd(ab + 28, c31);
  _mm256_storeu_pd(ab + 32, c40);
  _mm256_storeu_pd(ab + 36, c41);
  _mm256_storeu_pd(ab + 40, c50);
  _mm256_storeu_pd(ab + 44, c51);
}
#endif

using Kernel = void (*)(int64_t, const double*, const double*, double*);

Kernel pick_kernel() {
#ifdef BS_DGEMM_X86
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return kernel_fma;
#endif
  return kernel_generic;
}

// Packs rows [i0, i0 + MR) x depth [p0, p0 + kc) of A as dst[p][0..MR), zero-padded past m.
void pack_a(DView a, int64_t m, int64_t i0, int64_t p0, int64_t kc, double* dst) {
  const int64_t rows = std::min(kMR, m - i0);
  for (int64_t p = 0; p < kc; ++p, dst += kMR) {
    const double* src = a.p + i0 * a.rs + (p0 + p) * a.cs;
    int64_t i = 0;
    for (; i < rows; ++i) dst[i] = src[i * a.rs];
    for (; i < kMR; ++i) dst[i] = 0.0;
  }
}

// Packs depth [p0, p0 + kc) x columns [j0, j0 + NR) of B as dst[p][0..NR), zero-padded past n.
void pack_b(DView b, int64_t n, int64_t j0, int64_t p0, int64_t kc, double* dst) {
  const int64_t cols = std::min(kNR, n - j0);
  for (int64_t p = 0; p < kc; ++p, dst += kNR) {
    const double* src = b.p + (p0 + p) * b.rs + j0 * b.cs;
    int64_t j = 0;
    if (b.cs == 1) {
      for (; j < cols; ++j) dst[j] = src[j];
    } else {
      for (; j < cols; ++j) dst[j] = src[j * b.cs];
    }
    for (; j < kNR; ++j) dst[j] = 0.0;
  }
}

}  // namespace

void dgemm(int64_t m, int64_t n, int64_t k, double alpha, DView a, DView b, double beta, double* c,
           int64_t rs_c, int64_t cs_c, ThreadPool* pool, bool upper) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || alpha == 0.0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = upper ? i : 0; j < n; ++j) {
        double& x = c[i * rs_c + j * cs_c];
        x = beta == 0.0 ? 0.0 : beta * x;
      }
    }
    return;
  }
  static const Kernel kernel = pick_kernel();
  // Small products stay on the calling thread (a pool round trip costs some microseconds).
  if (static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) < 1 << 18) {
    pool = nullptr;
  }
  const int64_t panels_a = (m + kMR - 1) / kMR, panels_b = (n + kNR - 1) / kNR;
  const int64_t kc_max = std::min(k, kKC);
  std::vector<double> ap(static_cast<size_t>(panels_a * kMR * kc_max));
  std::vector<double> bp(static_cast<size_t>(panels_b * kNR * kc_max));
  const int64_t tiles_m = (m + kMC - 1) / kMC, tiles_n = (n + kNC - 1) / kNC;
  for (int64_t p0 = 0; p0 < k; p0 += kKC) {
    const int64_t kc = std::min(kKC, k - p0);
    const double beta_here = p0 == 0 ? beta : 1.0;
    // Pack every MR panel of A and NR panel of B for this depth slice.
    parallel_for(pool, panels_a + panels_b, 16, [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        if (t < panels_a) {
          pack_a(a, m, t * kMR, p0, kc, &ap[t * kMR * kc]);
        } else {
          const int64_t q = t - panels_a;
          pack_b(b, n, q * kNR, p0, kc, &bp[q * kNR * kc]);
        }
      }
    });
    parallel_for(pool, tiles_m * tiles_n, 1, [&](int64_t lo, int64_t hi) {
      alignas(32) double ab[kMR * kNR];
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t i0 = (t / tiles_n) * kMC, j0 = (t % tiles_n) * kNC;
        const int64_t i1 = std::min(m, i0 + kMC), j1 = std::min(n, j0 + kNC);
        if (upper && j1 <= i0) continue;
        for (int64_t jr = j0; jr < j1; jr += kNR) {
          const double* bpan = &bp[(jr / kNR) * kNR * kc];
          const int64_t nr = std::min(kNR, n - jr);
          for (int64_t ir = i0; ir < i1; ir += kMR) {
            if (upper && jr + nr <= ir) break;  // this and the later row panels lie below
            const int64_t mr = std::min(kMR, m - ir);
            for (int64_t i = 0; i < mr; ++i) __builtin_prefetch(c + (ir + i) * rs_c + jr * cs_c, 1);
            kernel(kc, &ap[(ir / kMR) * kMR * kc], bpan, ab);
            for (int64_t i = 0; i < mr; ++i) {
              double* crow = c + (ir + i) * rs_c + jr * cs_c;
              const double* abr = ab + i * kNR;
              if (beta_here == 0.0) {
                for (int64_t j = 0; j < nr; ++j) crow[j * cs_c] = alpha * abr[j];
              } else if (beta_here == 1.0) {
                for (int64_t j = 0; j < nr; ++j) crow[j * cs_c] += alpha * abr[j];
              } else {
                for (int64_t j = 0; j < nr; ++j) {
                  crow[j * cs_c] = beta_here * crow[j * cs_c] + alpha * abr[j];
                }
              }
            }
          }
        }
      }
    });
  }
}

}  // namespace bs
