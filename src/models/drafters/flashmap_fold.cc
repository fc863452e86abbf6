#include "models/drafters/flashmap_fold.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>

namespace bs {
namespace {

// Householder reduction of the symmetric a[n, n] to tridiagonal form T = Qᵀ A Q. Returns the
// diagonal in d, the off-diagonal in e (e[i] couples rows i and i + 1; e[n-1] = 0) and Qᵀ in
// qt (row i of qt is column i of Q).
void tridiagonalize(std::vector<double>& a, int64_t n, std::vector<double>& d,
                    std::vector<double>& e, std::vector<double>& qt) {
  qt.assign(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) qt[i * n + i] = 1.0;
  std::vector<double> v, p, w;
  for (int64_t k = 0; k + 2 < n; ++k) {
    // Reflect x = a[k+1.., k] onto alpha e_0.
    const int64_t m = n - k - 1, o = k + 1;
    double norm = 0;
    for (int64_t i = 0; i < m; ++i) norm += a[(o + i) * n + k] * a[(o + i) * n + k];
    norm = std::sqrt(norm);
    if (norm == 0.0) continue;
    const double x0 = a[o * n + k];
    const double alpha = x0 > 0 ? -norm : norm;
    v.assign(static_cast<size_t>(m), 0.0);
    for (int64_t i = 0; i < m; ++i) v[i] = a[(o + i) * n + k];
    v[0] -= alpha;
    double vnorm = 0;
    for (double x : v) vnorm += x * x;
    vnorm = std::sqrt(vnorm);
    if (vnorm == 0.0) continue;
    for (double& x : v) x /= vnorm;
    // A22 <- H A22 H with H = I - 2 v vᵀ: A22 -= 2 (v wᵀ + w vᵀ), w = p - (vᵀp) v, p = A22 v.
    p.assign(static_cast<size_t>(m), 0.0);
    for (int64_t i = 0; i < m; ++i) {
      const double* row = &a[(o + i) * n + o];
      double s = 0;
      for (int64_t j = 0; j < m; ++j) s += row[j] * v[j];
      p[i] = s;
    }
    double vp = 0;
    for (int64_t i = 0; i < m; ++i) vp += v[i] * p[i];
    for (int64_t i = 0; i < m; ++i) p[i] -= vp * v[i];  // p is now w
    for (int64_t i = 0; i < m; ++i) {
      double* row = &a[(o + i) * n + o];
      for (int64_t j = 0; j < m; ++j) row[j] -= 2.0 * (v[i] * p[j] + p[i] * v[j]);
    }
    a[o * n + k] = a[k * n + o] = alpha;
    for (int64_t i = 1; i < m; ++i) a[(o + i) * n + k] = a[k * n + o + i] = 0.0;
    // Q <- Q H, i.e. rows o.. of Qᵀ: qt[o+i, :] -= 2 v[i] (vᵀ qt[o.., :]) (row-wise, so both
    // passes stream contiguous rows).
    w.assign(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < m; ++i) {
      const double* row = &qt[(o + i) * n];
      for (int64_t c = 0; c < n; ++c) w[c] += v[i] * row[c];
    }
    for (int64_t i = 0; i < m; ++i) {
      double* row = &qt[(o + i) * n];
      const double f = 2.0 * v[i];
      for (int64_t c = 0; c < n; ++c) row[c] -= f * w[c];
    }
  }
  d.assign(static_cast<size_t>(n), 0.0);
  e.assign(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < n; ++i) d[i] = a[i * n + i];
  for (int64_t i = 0; i + 1 < n; ++i) e[i] = a[(i + 1) * n + i];
}

// Implicit-shift QL on the tridiagonal (d, e), rotating the rows of zt (eigenvectors as rows).
Status tridiagonal_ql(std::vector<double>& d, std::vector<double>& e, std::vector<double>& zt,
                      int64_t n) {
  constexpr int kMaxIterations = 200;
  for (int64_t l = 0; l < n; ++l) {
    for (int iter = 0;; ++iter) {
      int64_t m = l;
      for (; m + 1 < n; ++m) {
        const double scale = std::abs(d[m]) + std::abs(d[m + 1]);
        if (std::abs(e[m]) <= DBL_EPSILON * scale) break;
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

}  // namespace

Result<SymmetricEigen> symmetric_eigen(std::vector<double> a, int64_t n) {
  if (n <= 0 || static_cast<int64_t>(a.size()) != n * n) {
    return InvalidArgument("symmetric_eigen: expected a {}x{} matrix, got {} values", n, n,
                           a.size());
  }
  std::vector<double> d, e, zt;
  tridiagonalize(a, n, d, e, zt);
  BS_RETURN_IF_ERROR(tridiagonal_ql(d, e, zt, n));
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return d[x] > d[y]; });
  SymmetricEigen out;
  out.n = n;
  out.values.resize(static_cast<size_t>(n));
  out.vectors.assign(static_cast<size_t>(n * n), 0.0);
  for (int64_t c = 0; c < n; ++c) {
    const double* z = &zt[order[c] * n];
    int64_t big = 0;
    for (int64_t i = 1; i < n; ++i) {
      if (std::abs(z[i]) > std::abs(z[big])) big = i;
    }
    const double sign = z[big] < 0 ? -1.0 : 1.0;
    out.values[c] = d[order[c]];
    for (int64_t i = 0; i < n; ++i) out.vectors[i * n + c] = sign * z[i];
  }
  return out;
}

}  // namespace bs
