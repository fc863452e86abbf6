// dgemm against a naive triple loop: shapes around the register and cache blocks, transposed and
// strided views, beta, the upper-triangle mode, and independence from the thread count.
#include "core/dgemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace bs {
namespace {

struct Case {
  int64_t m, n, k;
  bool ta, tb;
  double alpha, beta;
  bool upper;
};

std::vector<double> run(const Case& cs, const std::vector<double>& a, const std::vector<double>& b,
                        std::vector<double> c, ThreadPool* pool) {
  // A is stored [m, k] (or [k, m] when transposed), B [k, n] (or [n, k]); C is column-major
  // [m, n] with a leading dimension of m + 3 to exercise strides.
  const DView av = cs.ta ? DView{a.data(), 1, cs.m} : DView{a.data(), cs.k, 1};
  const DView bv = cs.tb ? DView{b.data(), 1, cs.k} : DView{b.data(), cs.n, 1};
  dgemm(cs.m, cs.n, cs.k, cs.alpha, av, bv, cs.beta, c.data(), 1, cs.m + 3, pool, cs.upper);
  return c;
}

TEST(Dgemm, MatchesNaiveProduct) {
  std::mt19937 rng(1);
  std::normal_distribution<double> nd;
  ThreadPool pool(3);
  const std::vector<Case> cases = {
      {1, 1, 1, false, false, 1.0, 0.0, false},        {7, 9, 5, true, false, 2.0, 0.5, false},
      {6, 8, 256, false, true, -1.0, 1.0, false},      {97, 515, 300, true, true, 1.0, 0.0, false},
      {200, 130, 513, false, false, 0.5, -2.0, false}, {300, 300, 64, true, false, -1.0, 1.0, true},
      {150, 170, 9, false, true, 1.0, 1.0, true},      {40, 30, 0, false, false, 1.0, 3.0, false},
  };
  for (const Case& cs : cases) {
    std::vector<double> a(cs.m * cs.k), b(cs.k * cs.n), c(cs.n * (cs.m + 3));
    for (double& x : a) x = nd(rng);
    for (double& x : b) x = nd(rng);
    for (double& x : c) x = nd(rng);
    const std::vector<double> got = run(cs, a, b, c, &pool);
    double worst = 0;
    for (int64_t i = 0; i < cs.m; ++i) {
      for (int64_t j = 0; j < cs.n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < cs.k; ++p) {
          s += (cs.ta ? a[p * cs.m + i] : a[i * cs.k + p]) *
               (cs.tb ? b[j * cs.k + p] : b[p * cs.n + j]);
        }
        const double want = cs.beta * c[i + j * (cs.m + 3)] + cs.alpha * s;
        const double x = got[i + j * (cs.m + 3)];
        if (cs.upper && j < i) {
          // Below the diagonal: either untouched or computed, never anything else.
          if (x != c[i + j * (cs.m + 3)]) worst = std::max(worst, std::abs(x - want));
        } else {
          worst = std::max(worst, std::abs(x - want));
        }
      }
    }
    EXPECT_LT(worst, 1e-12 * (1.0 + static_cast<double>(cs.k)))
        << cs.m << "x" << cs.n << "x" << cs.k;
    // Padding rows of C (the leading dimension) are never written.
    for (int64_t j = 0; j < cs.n; ++j) {
      for (int64_t i = cs.m; i < cs.m + 3; ++i)
        EXPECT_EQ(got[i + j * (cs.m + 3)], c[i + j * (cs.m + 3)]);
    }
    EXPECT_EQ(got, run(cs, a, b, c, nullptr)) << "thread count changed the result";
  }
}

}  // namespace
}  // namespace bs
