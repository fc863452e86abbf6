#include "models/drafters/flashmap_fold.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <memory>
#include <numbers>
#include <numeric>

#include "core/dgemm.h"
#include "core/thread_pool.h"

// Dense symmetric eigensolver in the shape of LAPACK's dsyevd, in plain C++ (no new dependency: the
// GPU machine's image has no LAPACK), multi-threaded over a bs::ThreadPool:
//   1. blocked Householder tridiagonalisation (dsytrd/dlatrd): per column one symmetric
//      matrix-vector product over the trailing upper triangle (memory bound, parallel over row
//      chunks), per panel of kPanel columns one rank-2k update (dgemm);
//   2. Cuppen's divide and conquer on the tridiagonal (dstedc/dlaed0-4): QL on leaves, rank-one
//      merges with LAPACK's deflation, the secular equation solved per root, eigenvectors from
//      Gu-Eisenstat's recomputed z (orthogonal however close the eigenvalues are), then one dgemm
//      per merge;
//   3. the reflectors applied to the eigenvectors in blocks (compact WY, dormtr): dgemm.
// Why this shape (measured with bench/eigen_timing at n = 4096, docs/FLASHMAP.md "Load time"):
// the previous solver (unblocked tridiagonalisation, then QL applying every rotation to n-long
// rows of the eigenvector matrix) took 150-250 s on one core: QL's rotations are ~3n³
// memory-bound flops that neither block nor parallelise well, while D&C's eigenvector work is
// matrix products (and shrinks with deflation, which clustered spectra such as a rank-deficient
// Gram have plenty of). What remains memory bound is the symmetric product of the reduction
// (n³/3 reads of the trailing matrix), parallel over row chunks.
//
// Every reduction is split in a way that depends on n only, never on the thread count, so the
// result is the same bit for bit whatever the pool size (tests/unit/flashmap_fold_test.cc).

namespace bs {
namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BS_EIGEN_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define BS_EIGEN_CLONES
#endif

constexpr double kEps = DBL_EPSILON / 2;  // unit roundoff (LAPACK's dlamch('E'))
constexpr int64_t kPanel = 32;            // tridiagonalisation panel (LAPACK's dsytrd block)
constexpr int64_t kBackBlock = 128;       // reflectors applied per block to the eigenvectors
constexpr int64_t kLeaf = 32;             // D&C subproblems this small are solved by QL
constexpr int64_t kSymvChunk = 1 << 14;   // matrix entries per task of the symmetric product
constexpr int64_t kSerialMerge = 512;     // D&C merges smaller than this run one per thread

// Σ x[i] y[i] in four interleaved partial sums (vectorised; the order is fixed).
BS_EIGEN_CLONES double dot(const double* x, const double* y, int64_t n) {
  double s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int l = 0; l < 4; ++l) s[l] += x[i + l] * y[i + l];
  }
  for (; i < n; ++i) s[0] += x[i] * y[i];
  return (s[0] + s[2]) + (s[1] + s[3]);
}

// Upper-triangle row i of a symmetric product: returns Σ_j row[j] v[j] (row[0] on the diagonal)
// and adds row[j] * v[0] into acc[j] for j >= 1 (the mirrored lower entries), in one pass.
BS_EIGEN_CLONES double symv_row(const double* row, const double* v, double* acc, int64_t len) {
  const double vi = v[0];
  double s[8] = {row[0] * vi, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 1;
  for (; j + 8 <= len; j += 8) {
    for (int l = 0; l < 8; ++l) {
      const double x = row[j + l];
      s[l] += x * v[j + l];
      acc[j + l] += x * vi;
    }
  }
  for (; j < len; ++j) {
    s[0] += row[j] * v[j];
    acc[j] += row[j] * vi;
  }
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

// x[i] -= u[i] * f + w[i] * g.
BS_EIGEN_CLONES void sub2(double* x, const double* u, double f, const double* w, double g,
                          int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] -= u[i] * f + w[i] * g;
}

// Euclidean norm of x[0, n), scaled against overflow and underflow.
double norm2(const double* x, int64_t n) {
  double big = 0;
  for (int64_t i = 0; i < n; ++i) big = std::max(big, std::abs(x[i]));
  if (big == 0.0 || !std::isfinite(big)) return big;
  const double inv = 1.0 / big;
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += (x[i] * inv) * (x[i] * inv);
  return big * std::sqrt(s);
}

// LAPACK's dlarfg: H = I - tau v vᵀ with H x = beta e_0 for x[0, len); x is overwritten by v
// (v[0] = 1). x already a multiple of e_0: tau = 0, H = I.
void householder(double* x, int64_t len, double* beta, double* tau) {
  const double alpha = x[0];
  const double xnorm = norm2(x + 1, len - 1);
  x[0] = 1.0;
  if (xnorm == 0.0) {
    *beta = alpha;
    *tau = 0.0;
    return;
  }
  const double b = -std::copysign(std::hypot(alpha, xnorm), alpha);
  *tau = (b - alpha) / b;
  const double scale = 1.0 / (alpha - b);
  for (int64_t i = 1; i < len; ++i) x[i] *= scale;
  *beta = b;
}

// Blocked Householder reduction T = Qᵀ A Q of the symmetric a[n, n] (row-major; the upper
// triangle is read), Q = H_0 ... H_{n-2} (LAPACK's dsytrd with dlatrd's panels): diagonal d,
// off-diagonal e (e[i] couples i and i + 1), reflector k's tau in tau[k] and its v (v[0] = 1 at
// column k + 1) in row k of a, columns k + 1 .. n - 1.
class Tridiagonalizer {
 public:
  Tridiagonalizer(std::vector<double>& a, int64_t n, ThreadPool* pool)
      : a_(a), n_(n), pool_(pool) {}

  void run(std::vector<double>& d, std::vector<double>& e, std::vector<double>& tau) {
    const int64_t n = n_;
    d.assign(static_cast<size_t>(n), 0.0);
    e.assign(static_cast<size_t>(n), 0.0);
    tau.assign(static_cast<size_t>(n), 0.0);
    // The panel's V and W (its update of the trailing matrix is A -= V Wᵀ + W Vᵀ) as rows indexed
    // by the global row: V in vw_[0, kPanel), W in vw_[kPanel, 2 kPanel); wv the other way round.
    vw_.assign(static_cast<size_t>(2 * kPanel * n), 0.0);
    std::vector<double> wv(vw_.size());
    p_.resize(static_cast<size_t>(n));
    for (int64_t k0 = 0; k0 < n; k0 += kPanel) {
      const int64_t kend = std::min(k0 + kPanel, n);
      std::fill(vw_.begin(), vw_.end(), 0.0);
      for (int64_t k = k0; k < kend; ++k) {
        // Row k from the diagonal on (= column k from the diagonal down) already has the panel's
        // earlier reflectors applied (the previous step did that).
        double* row = &a_[k * n];
        d[k] = row[k];
        if (k + 1 == n) break;
        householder(row + k + 1, n - k - 1, &e[k], &tau[k]);
        std::copy(row + k + 1, row + n, vp(k - k0) + k + 1);
        column(k, k - k0, tau[k], /*next_in_panel=*/k + 1 < kend);
      }
      if (kend == n) break;
      // A[kend.., kend..] -= [V W] [W V]ᵀ on the upper triangle.
      for (int64_t l = 0; l < kPanel; ++l) {
        std::copy(wp(l) + kend, wp(l) + n, wv.data() + l * n + kend);
        std::copy(vp(l) + kend, vp(l) + n, wv.data() + (kPanel + l) * n + kend);
      }
      const int64_t m = n - kend;
      dgemm(m, m, 2 * kPanel, -1.0, {vw_.data() + kend, 1, n}, {wv.data() + kend, n, 1}, 1.0,
            &a_[kend * n + kend], n, 1, pool_, /*upper=*/true);
    }
  }

 private:
  double* vp(int64_t l) { return vw_.data() + l * n_; }
  double* wp(int64_t l) { return vw_.data() + (kPanel + l) * n_; }

  // Panel column j (global k) with its reflector v = vp(j) in place: w = wp(j) = tau (A v - V Wᵀv
  // - W Vᵀv) - (tau / 2) (wᵀv) v over rows k + 1 .., A the trailing matrix as the panel began;
  // then, when row k + 1 is in the panel, the panel's reflectors 0 .. j applied to it. Two
  // parallel passes: the symmetric product by row chunks of equal work (each chunk sums the
  // mirrored lower entries into its own accumulator row, and its share of the dots Wᵀv, Vᵀv);
  // then by row ranges, the accumulators in chunk order and the V, W terms. Chunks and ranges
  // depend on n - k only, so the sums do not depend on the thread count.
  void column(int64_t k, int64_t j, double tau, bool next_in_panel) {
    const int64_t n = n_, r0 = k + 1, m = n - r0;
    const double* v = vp(j);
    double* w = wp(j);
    double* next = &a_[r0 * n];  // row k + 1
    // The next row's update by reflectors 0 .. j-1 (V W of the panel so far).
    auto update_next = [&](int64_t lo, int64_t hi) {
      if (!next_in_panel) return;
      for (int64_t l = 0; l < j; ++l) {
        sub2(next + lo, vp(l) + lo, wp(l)[r0], wp(l) + lo, vp(l)[r0], hi - lo);
      }
    };
    if (tau == 0.0) {  // H = I: w = 0
      update_next(r0, n);
      return;
    }
    const int64_t total = m * (m + 1) / 2;
    const int64_t chunks = std::clamp<int64_t>(total / kSymvChunk, 1, 64);
    bounds_.assign(static_cast<size_t>(chunks + 1), n);
    bounds_[0] = r0;
    for (int64_t i = r0, c = 1, area = 0; i < n && c < chunks; ++i) {
      if (area * chunks >= total * c) bounds_[c++] = i;
      area += n - i;
    }
    acc_.resize(static_cast<size_t>(chunks * n));
    dots_.assign(static_cast<size_t>(chunks * 2 * kPanel), 0.0);
    double* p = p_.data();
    parallel_for(pool_, chunks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t ch = lo; ch < hi; ++ch) {
        double* ac = &acc_[ch * n];
        const int64_t b0 = bounds_[ch], b1 = bounds_[ch + 1];
        std::fill(ac + b0, ac + n, 0.0);
        for (int64_t i = b0; i < b1; ++i) p[i] = symv_row(&a_[i * n + i], v + i, ac + i, n - i);
        for (int64_t l = 0; l < j; ++l) {
          dots_[ch * 2 * kPanel + l] = dot(wp(l) + b0, v + b0, b1 - b0);
          dots_[ch * 2 * kPanel + kPanel + l] = dot(vp(l) + b0, v + b0, b1 - b0);
        }
      }
    });
    double f[kPanel], g[kPanel];  // Wᵀv, Vᵀv
    for (int64_t l = 0; l < j; ++l) {
      f[l] = g[l] = 0.0;
      for (int64_t ch = 0; ch < chunks; ++ch) {
        f[l] += dots_[ch * 2 * kPanel + l];
        g[l] += dots_[ch * 2 * kPanel + kPanel + l];
      }
    }
    const int64_t ranges = std::clamp<int64_t>(m / 256, 1, 64);
    pv_.assign(static_cast<size_t>(ranges), 0.0);
    parallel_for(pool_, ranges, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t q = lo; q < hi; ++q) {
        const int64_t i0 = r0 + m * q / ranges, i1 = r0 + m * (q + 1) / ranges;
        for (int64_t ch = 0; ch < chunks; ++ch) {
          const double* ac = &acc_[ch * n];
          for (int64_t i = std::max(i0, bounds_[ch] + 1); i < i1; ++i) p[i] += ac[i];
        }
        for (int64_t l = 0; l < j; ++l) sub2(p + i0, vp(l) + i0, f[l], wp(l) + i0, g[l], i1 - i0);
        for (int64_t i = i0; i < i1; ++i) p[i] *= tau;
        pv_[q] = dot(p + i0, v + i0, i1 - i0);
        update_next(i0, i1);
      }
    });
    double pv = 0;
    for (double x : pv_) pv += x;
    const double alpha = -0.5 * tau * pv;
    for (int64_t i = r0; i < n; ++i) w[i] = p[i] + alpha * v[i];
    if (next_in_panel) sub2(next + r0, v + r0, w[r0], w + r0, v[r0], m);
  }

  std::vector<double>& a_;
  const int64_t n_;
  ThreadPool* pool_;
  std::vector<double> vw_, p_, acc_, dots_, pv_;
  std::vector<int64_t> bounds_;
};

// u[n, n] (row-major) := Q u with Q = H_0 ... H_{n-2} as tridiagonalize left it in a and tau, in
// blocks of kBackBlock reflectors H_k0 ... H_k1-1 = I - V T Vᵀ (LAPACK's dlarft/dlarfb), the last
// block first. Clobbers a's entries left of each reflector (zeros there make V a plain view).
void apply_q(std::vector<double>& a, const std::vector<double>& tau, int64_t n, double* u,
             ThreadPool* pool) {
  const int64_t refl = n - 1;
  if (refl <= 0) return;
  std::vector<double> s, t, w, w2;
  for (int64_t k0 = (refl - 1) / kBackBlock * kBackBlock; k0 >= 0; k0 -= kBackBlock) {
    const int64_t nb = std::min(kBackBlock, refl - k0), mb = n - k0 - 1;
    // V [mb, nb]: column jj is reflector k0 + jj over rows k0 + 1 .., zero above its unit entry.
    double* v0 = &a[k0 * n + k0 + 1];
    for (int64_t jj = 0; jj < nb; ++jj) std::fill(v0 + jj * n, v0 + jj * n + jj, 0.0);
    const DView vt{v0, n, 1}, v{v0, 1, n};
    s.assign(static_cast<size_t>(nb * nb), 0.0);
    dgemm(nb, nb, mb, 1.0, vt, v, 0.0, s.data(), nb, 1, pool);  // S = VᵀV
    // T upper triangular: T[jj, jj] = tau, T[0:jj, jj] = -tau T[0:jj, 0:jj] S[0:jj, jj].
    t.assign(static_cast<size_t>(nb * nb), 0.0);
    for (int64_t jj = 0; jj < nb; ++jj) {
      const double tj = tau[k0 + jj];
      t[jj * nb + jj] = tj;
      for (int64_t i = 0; i < jj; ++i) {
        double x = 0;
        for (int64_t q = i; q < jj; ++q) x += t[i * nb + q] * s[q * nb + jj];
        t[i * nb + jj] = -tj * x;
      }
    }
    w.resize(static_cast<size_t>(nb * n));
    w2.resize(w.size());
    double* us = u + (k0 + 1) * n;
    dgemm(nb, n, mb, 1.0, vt, {us, n, 1}, 0.0, w.data(), n, 1, pool);  // W = Vᵀ U
    dgemm(nb, n, nb, 1.0, {t.data(), nb, 1}, {w.data(), n, 1}, 0.0, w2.data(), n, 1, pool);
    dgemm(mb, n, nb, -1.0, v, {w2.data(), n, 1}, 1.0, us, n, 1, pool);  // U -= V T W
  }
}

// Implicit-shift QL on the tridiagonal (d, e) of size n (e[n-1] is scratch), rotating the rows of
// zt (eigenvectors as rows, stride n). A coupling is negligible below eps relative to its two
// diagonal entries or below abs_tol (eps times the norm of the whole matrix: without it, zero
// eigenvalues of a rank-deficient Gram need not converge).
Status tridiagonal_ql(double* d, double* e, double* zt, int64_t n, double abs_tol) {
  constexpr int kMaxIterations = 200;
  for (int64_t l = 0; l < n; ++l) {
    for (int iter = 0;; ++iter) {
      int64_t m = l;
      for (; m + 1 < n; ++m) {
        const double scale = std::abs(d[m]) + std::abs(d[m + 1]);
        if (std::abs(e[m]) <= std::max(DBL_EPSILON * scale, abs_tol)) break;
      }
      if (m == l) break;
      if (iter == kMaxIterations) {
        return Status(StatusCode::kInternal, "symmetric eigensolver did not converge");
      }
      // Shift: the eigenvalue of the leading 2x2 block closer to d[l].
      double g = (d[l + 1] - d[l]) / (2.0 * e[l]);
      double r = std::hypot(g, 1.0);
      g = d[m] - d[l] + e[l] / (g + std::copysign(r, g));
      double s = 1.0, c = 1.0, p = 0.0;
      bool deflated = false;
      for (int64_t i = m - 1; i >= l; --i) {
        const double f = s * e[i], b = c * e[i];
        r = std::hypot(f, g);
        e[i + 1] = r;
        if (r == 0.0) {  // underflow: split the problem here
          d[i + 1] -= p;
          e[m] = 0.0;
          deflated = true;
          break;
        }
        s = f / r;
        c = g / r;
        g = d[i + 1] - p;
        r = (d[i] - g) * s + 2.0 * c * b;
        p = s * r;
        d[i + 1] = g + p;
        g = c * r - b;
        double* zi = &zt[i * n];
        double* zj = &zt[(i + 1) * n];
        for (int64_t k = 0; k < n; ++k) {
          const double t = zj[k];
          zj[k] = s * zi[k] + c * t;
          zi[k] = c * zi[k] - s * t;
        }
      }
      if (deflated) continue;
      d[l] -= p;
      e[l] = g;
      e[m] = 0.0;
    }
  }
  return Status::Ok();
}

// Root j (0-based, ascending) of the secular equation 1/rho + Σ_i z_i² / (dl_i - λ) = 0 with
// dl ascending and distinct, every z_i != 0, rho > 0 and k >= 2 (LAPACK's dlaed4): returns λ_j
// and writes delta[i] = dl_i - λ_j, accurate relative to itself (λ_j = dl_origin + tau with the
// nearer pole as origin, delta = (dl_i - dl_origin) - tau). Each step fits the poles left and
// right of the root by one pole each (value and slope, the fixed-weight scheme) and solves the
// fitted quadratic, falling back to bisection whenever that leaves the bracket.
double secular_root(int64_t j, int64_t k, const double* dl, const double* z, double rho,
                    double* delta) {
  const double rhoinv = 1.0 / rho;
  int64_t origin;
  double lo, hi, tau;
  if (j + 1 < k) {
    const double mid = 0.5 * (dl[j + 1] - dl[j]);
    double f = rhoinv;
    for (int64_t i = 0; i < k; ++i) f += z[i] * z[i] / ((dl[i] - dl[j]) - mid);
    if (f > 0) {  // the root lies left of the midpoint: nearer dl_j
      origin = j, lo = 0.0, hi = tau = mid;
    } else {
      origin = j + 1, lo = tau = -mid, hi = 0.0;
    }
  } else {  // the largest root, in (dl_k-1, dl_k-1 + rho |z|²]
    double zz = 0;
    for (int64_t i = 0; i < k; ++i) zz += z[i] * z[i];
    origin = k - 1, lo = 0.0, hi = tau = rho * zz;
  }
  for (int64_t i = 0; i < k; ++i) delta[i] = dl[i] - dl[origin];
  const int64_t split = std::min(j, k - 2);  // poles <= split fit as one pole at split
  for (int iter = 0; iter < 100; ++iter) {
    double psi = 0, dpsi = 0, phi = 0, dphi = 0;
    for (int64_t i = 0; i <= split; ++i) {
      const double t = z[i] / (delta[i] - tau);
      psi += z[i] * t;
      dpsi += t * t;
    }
    for (int64_t i = split + 1; i < k; ++i) {
      const double t = z[i] / (delta[i] - tau);
      phi += z[i] * t;
      dphi += t * t;
    }
    const double w = rhoinv + psi + phi;
    const double err =
        8.0 * (std::abs(psi) + std::abs(phi)) + 2.0 * rhoinv + std::abs(tau) * (dpsi + dphi);
    if (std::abs(w) <= kEps * err) break;
    if (w > 0) {
      hi = tau;
    } else {
      lo = tau;
    }
    // Fit: w(tau + eta) ~ c + q / (a - eta) + s / (b - eta), a and b the deltas of the bounding
    // poles; root of c (a - eta)(b - eta) + q (b - eta) + s (a - eta).
    const double a = delta[split] - tau, b = delta[split + 1] - tau;
    const double q = dpsi * a * a, s = dphi * b * b, c = w - dpsi * a - dphi * b;
    const double bb = c * (a + b) + q + s, cc = c * a * b + q * b + s * a;
    double next = 0.5 * (lo + hi);
    auto inside = [&](double x) { return std::isfinite(x) && x > lo && x < hi; };
    if (c == 0.0) {
      if (inside(tau + cc / bb)) next = tau + cc / bb;
    } else {
      const double disc = std::sqrt(std::max(0.0, bb * bb - 4.0 * c * cc));
      const double h = 0.5 * (bb + std::copysign(disc, bb));
      const double e1 = tau + h / c, e2 = tau + cc / h;
      if (inside(e1) && (!inside(e2) || std::abs(e1 - tau) < std::abs(e2 - tau))) {
        next = e1;
      } else if (inside(e2)) {
        next = e2;
      }
    }
    if (!(next > lo && next < hi)) break;  // the bracket is down to adjacent doubles
    tau = next;
  }
  for (int64_t i = 0; i < k; ++i) delta[i] -= tau;
  return dl[origin] + tau;
}

struct MergeNode {
  int64_t o, n1, n2;
  double beta;  // the coupling e[o + n1 - 1] torn out of the tridiagonal
};

// Scratch of merge, kept between merges (fresh pages of large buffers cost page faults).
struct MergeWork {
  std::vector<double> dd, zz, dl, zl, lam, delta, zh, gt, gb, res;
  std::vector<int8_t> kind;
  std::vector<int64_t> order, keep, pole;
  struct Rotation {
    int64_t x, y;
    double c, s;
  };
  std::vector<Rotation> rot;
};

// Merges the solved halves [o, o + n1) and [o + n1, o + n1 + n2) of the torn tridiagonal (LAPACK's
// dlaed1-3): the block-diagonal Q = diag(Q1, Q2) of eigenvectors (columns of z in the block) and
// eigenvalues d (unordered) become those of the whole block. z is row-major with stride n.
void merge(double* d, double* z, int64_t n, const MergeNode& mg, MergeWork& ws, ThreadPool* pool) {
  const int64_t o = mg.o, n1 = mg.n1, n2 = mg.n2, N = n1 + n2;
  if (mg.beta == 0.0) return;
  // T = diag(T1, T2) + rho u uᵀ with u = (last row of Q1, ±first row of Q2) / sqrt(2), |u| = 1.
  const double rho = 2.0 * std::abs(mg.beta), s2 = mg.beta < 0 ? -1.0 : 1.0;
  std::vector<double>& dd = ws.dd;
  std::vector<double>& zz = ws.zz;
  dd.assign(d + o, d + o + N);
  zz.resize(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    zz[i] =
        (i < n1 ? z[(o + n1 - 1) * n + o + i] : s2 * z[(o + n1) * n + o + i]) / std::numbers::sqrt2;
  }
  // Column kinds: 1 = nonzero in the top n1 rows only, 3 = bottom only, 2 = both (after a
  // deflating rotation mixed a top and a bottom column).
  std::vector<int8_t>& kind = ws.kind;
  kind.resize(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) kind[i] = i < n1 ? 1 : 3;
  std::vector<int64_t>& order = ws.order;
  order.resize(static_cast<size_t>(N));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return dd[x] < dd[y]; });
  double dmax = 0, zmax = 0;
  for (int64_t i = 0; i < N; ++i) {
    dmax = std::max(dmax, std::abs(dd[i]));
    zmax = std::max(zmax, std::abs(zz[i]));
  }
  // Deflation (dlaed2): a negligible z_i leaves (d_i, column i) an eigenpair; two poles closer
  // than the tolerance are rotated so that one of them has z = 0 (rotations recorded here, applied
  // to the columns below).
  const double tol = 8.0 * kEps * std::max(dmax, zmax);
  std::vector<int64_t>& keep = ws.keep;  // non-deflated, ascending d
  keep.clear();
  ws.rot.clear();
  int64_t prev = -1;
  for (int64_t idx : order) {
    if (rho * std::abs(zz[idx]) <= tol) continue;
    if (prev < 0) {
      prev = idx;
      continue;
    }
    const double tz = std::hypot(zz[idx], zz[prev]);
    const double c = zz[idx] / tz, s = -zz[prev] / tz, t = dd[idx] - dd[prev];
    if (std::abs(t * c * s) <= tol) {
      zz[idx] = tz;
      zz[prev] = 0.0;
      ws.rot.push_back({prev, idx, c, s});
      if (kind[prev] != kind[idx]) kind[prev] = kind[idx] = 2;
      const double dp = dd[prev] * c * c + dd[idx] * s * s;
      dd[idx] = dd[prev] * s * s + dd[idx] * c * c;
      dd[prev] = dp;
    } else {
      keep.push_back(prev);
    }
    prev = idx;
  }
  if (prev >= 0) keep.push_back(prev);
  std::copy(dd.begin(), dd.end(), d + o);
  const int64_t K = static_cast<int64_t>(keep.size());
  if (K == 0 && ws.rot.empty()) return;
  std::vector<double>& dl = ws.dl;
  std::vector<double>& zl = ws.zl;
  std::vector<double>& lam = ws.lam;
  dl.resize(static_cast<size_t>(K));
  zl.resize(dl.size());
  lam.resize(dl.size());
  for (int64_t i = 0; i < K; ++i) dl[i] = dd[keep[i]], zl[i] = zz[keep[i]];
  // delta[j * K + i] = dl_i - λ_j.
  std::vector<double>& delta = ws.delta;
  delta.resize(static_cast<size_t>(K * K));
  if (K == 1) {
    lam[0] = dl[0] + rho * zl[0] * zl[0];
    delta[0] = -rho * zl[0] * zl[0];
  } else if (K > 1) {
    parallel_for(pool, K, 4, [&](int64_t lo, int64_t hi) {
      for (int64_t j = lo; j < hi; ++j) {
        lam[j] = secular_root(j, K, dl.data(), zl.data(), rho, &delta[j * K]);
      }
    });
  }
  // Gu-Eisenstat: the z for which the computed λ are exact, ẑ_i² ∝ Π_j (λ_j - dl_i) /
  // Π_{j != i} (dl_j - dl_i) (dlaed3); the eigenvector of root j is ẑ_i / (dl_i - λ_j), normalised.
  std::vector<double>& zh = ws.zh;
  zh.resize(static_cast<size_t>(K));
  parallel_for(pool, K, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) zh[i] = delta[i * K + i];
    for (int64_t j = 0; j < K; ++j) {
      const double* dj = &delta[j * K];
      for (int64_t i = lo; i < hi; ++i) {
        if (i != j) zh[i] *= dj[i] / (dl[i] - dl[j]);
      }
    }
    for (int64_t i = lo; i < hi; ++i) zh[i] = std::copysign(std::sqrt(-zh[i]), zl[i]);
  });
  // Poles reordered by column kind (1, 2, 3): the top rows of the new vectors need kinds 1-2 only,
  // the bottom rows kinds 2-3 only.
  std::vector<int64_t>& pole = ws.pole;
  pole.clear();
  for (int8_t want : {1, 2, 3}) {
    for (int64_t i = 0; i < K; ++i) {
      if (kind[keep[i]] == want) pole.push_back(i);
    }
  }
  auto count = [&](int8_t want) {
    return std::count_if(keep.begin(), keep.end(), [&](int64_t i) { return kind[i] == want; });
  };
  const int64_t k1 = count(1), k3 = count(3), k2 = K - k1 - k3, kt = k1 + k2, kb = k2 + k3;
  // uvec[j * K + q] = component of root j's vector on pole[q] (in place of delta).
  double* uvec = delta.data();
  parallel_for(pool, K, 16, [&](int64_t lo, int64_t hi) {
    std::vector<double> uj(static_cast<size_t>(K));
    for (int64_t j = lo; j < hi; ++j) {
      double* dj = &delta[j * K];
      for (int64_t q = 0; q < K; ++q) uj[q] = zh[pole[q]] / dj[pole[q]];
      const double inv = 1.0 / norm2(uj.data(), K);
      for (int64_t q = 0; q < K; ++q) dj[q] = uj[q] * inv;
    }
  });
  // Per row of the block: the deflating rotations, then the non-deflated columns gathered (top
  // rows: kinds 1-2, bottom rows: kinds 2-3).
  std::vector<double>& gt = ws.gt;
  std::vector<double>& gb = ws.gb;
  gt.resize(static_cast<size_t>(n1 * kt));
  gb.resize(static_cast<size_t>(n2 * kb));
  parallel_for(pool, N, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      double* zr = z + (o + r) * n + o;
      for (const MergeWork::Rotation& g : ws.rot) {
        const double x = zr[g.x], y = zr[g.y];
        zr[g.x] = g.c * x + g.s * y;
        zr[g.y] = g.c * y - g.s * x;
      }
      if (r < n1) {
        for (int64_t q = 0; q < kt; ++q) gt[r * kt + q] = zr[keep[pole[q]]];
      } else {
        for (int64_t q = 0; q < kb; ++q) gb[(r - n1) * kb + q] = zr[keep[pole[k1 + q]]];
      }
    }
  });
  if (K == 0) return;
  // New vectors: top rows = Q[top, kinds 1-2] U[kinds 1-2, :], bottom likewise with kinds 2-3.
  std::vector<double>& res = ws.res;
  res.resize(static_cast<size_t>(N * K));
  dgemm(n1, K, kt, 1.0, {gt.data(), kt, 1}, {uvec, 1, K}, 0.0, res.data(), K, 1, pool);
  dgemm(n2, K, kb, 1.0, {gb.data(), kb, 1}, {uvec + k1, 1, K}, 0.0, res.data() + n1 * K, K, 1,
        pool);
  parallel_for(pool, N, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      for (int64_t j = 0; j < K; ++j) z[(o + r) * n + o + keep[j]] = res[r * K + j];
    }
  });
  for (int64_t j = 0; j < K; ++j) d[o + keep[j]] = lam[j];
}

// Eigenpairs of the symmetric tridiagonal (d, e) (e[i] couples i and i + 1): eigenvalues into d
// (unordered), eigenvector of d[j] into column j of z[n, n] (row-major). Cuppen's divide and
// conquer as LAPACK's dstedc: the matrix is scaled to norm ~1, torn into leaves of <= kLeaf rows
// by rank-one tears at the midpoints, the leaves solved by QL and merged bottom up.
Status tridiagonal_eigen(std::vector<double>& d, std::vector<double> e, int64_t n,
                         std::vector<double>& z, ThreadPool* pool) {
  z.assign(static_cast<size_t>(n * n), 0.0);
  double norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    norm = std::max(norm, std::abs(d[i]));
    if (i + 1 < n) norm = std::max(norm, std::abs(e[i]));
  }
  if (norm == 0.0 || n == 1) {
    for (int64_t i = 0; i < n; ++i) z[i * n + i] = 1.0;
    return Status::Ok();
  }
  for (int64_t i = 0; i < n; ++i) d[i] /= norm, e[i] /= norm;
  std::vector<std::pair<int64_t, int64_t>> leaves;
  std::vector<std::vector<MergeNode>> levels;
  auto tear = [&](auto&& self, int64_t o, int64_t size, size_t depth) -> void {
    if (size <= kLeaf) {
      leaves.emplace_back(o, size);
      return;
    }
    const int64_t n1 = size / 2;
    const double beta = e[o + n1 - 1];
    d[o + n1 - 1] -= std::abs(beta);
    d[o + n1] -= std::abs(beta);
    if (levels.size() <= depth) levels.resize(depth + 1);
    levels[depth].push_back({o, n1, size - n1, beta});
    self(self, o, n1, depth + 1);
    self(self, o + n1, size - n1, depth + 1);
  };
  tear(tear, 0, n, 0);
  std::atomic<bool> failed{false};
  parallel_for(pool, static_cast<int64_t>(leaves.size()), 1, [&](int64_t lo, int64_t hi) {
    std::vector<double> le, zt;
    for (int64_t t = lo; t < hi; ++t) {
      const auto [o, s] = leaves[t];
      le.assign(e.begin() + o, e.begin() + o + s);
      le[s - 1] = 0.0;
      zt.assign(static_cast<size_t>(s * s), 0.0);
      for (int64_t i = 0; i < s; ++i) zt[i * s + i] = 1.0;
      if (!tridiagonal_ql(&d[o], le.data(), zt.data(), s, kEps).ok()) failed = true;
      for (int64_t j = 0; j < s; ++j) {
        for (int64_t i = 0; i < s; ++i) z[(o + i) * n + o + j] = zt[j * s + i];
      }
    }
  });
  if (failed) return Status(StatusCode::kInternal, "symmetric eigensolver did not converge");
  MergeWork ws;
  for (size_t depth = levels.size(); depth-- > 0;) {
    const std::vector<MergeNode>& level = levels[depth];
    if (pool == nullptr || level.front().n1 + level.front().n2 < kSerialMerge) {
      parallel_for(pool, static_cast<int64_t>(level.size()), 1, [&](int64_t lo, int64_t hi) {
        MergeWork local;
        for (int64_t t = lo; t < hi; ++t) merge(d.data(), z.data(), n, level[t], local, nullptr);
      });
    } else {
      for (const MergeNode& mg : level) merge(d.data(), z.data(), n, mg, ws, pool);
    }
  }
  for (int64_t i = 0; i < n; ++i) d[i] *= norm;
  return Status::Ok();
}

}  // namespace

Result<SymmetricEigen> symmetric_eigen(std::vector<double> a, int64_t n, int threads) {
  if (n <= 0 || static_cast<int64_t>(a.size()) != n * n) {
    return InvalidArgument("symmetric_eigen: expected a {}x{} matrix, got {} values", n, n,
                           a.size());
  }
  std::unique_ptr<ThreadPool> owned;
  ThreadPool* pool = nullptr;
  if (threads != 1 && n >= 128) {
    owned = std::make_unique<ThreadPool>(threads);
    if (owned->size() > 1) pool = owned.get();
  }
  std::vector<double> d, e, tau, z;
  Tridiagonalizer(a, n, pool).run(d, e, tau);
  BS_RETURN_IF_ERROR(tridiagonal_eigen(d, e, n, z, pool));
  apply_q(a, tau, n, z.data(), pool);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return d[x] > d[y]; });
  // Canonical sign: each vector's largest-magnitude entry (first on ties) positive.
  std::vector<double> sign(static_cast<size_t>(n), 1.0);
  parallel_for(pool, (n + 63) / 64, 1, [&](int64_t lo, int64_t hi) {
    const int64_t c0 = lo * 64, c1 = std::min(n, hi * 64);
    std::vector<double> big(static_cast<size_t>(c1 - c0), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t c = c0; c < c1; ++c) {
        const double x = z[i * n + c];
        if (std::abs(x) > big[c - c0]) big[c - c0] = std::abs(x), sign[c] = x < 0 ? -1.0 : 1.0;
      }
    }
  });
  SymmetricEigen out;
  out.n = n;
  out.values.resize(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; ++c) out.values[c] = d[order[c]];
  parallel_for(pool, n, 64, [&](int64_t lo, int64_t hi) {
    std::vector<double> row(static_cast<size_t>(n));
    for (int64_t i = lo; i < hi; ++i) {
      std::copy(&z[i * n], &z[i * n] + n, row.begin());
      for (int64_t c = 0; c < n; ++c) z[i * n + c] = sign[order[c]] * row[order[c]];
    }
  });
  out.vectors = std::move(z);
  return out;
}

}  // namespace bs
