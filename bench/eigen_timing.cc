// Wall-clock time of the FlashMap fold's symmetric eigensolver (`symmetric_eigen`: LAPACK's dsyevd
// from OpenBLAS) on a synthetic n x n matrix (default n = 4096, the Qwen3-8B target hidden size),
// plus a spot check of the result: max |A u - λ u| / max|A| and max |uᵀu' - δ| over a few sampled
// eigenvectors. Results go to docs/FLASHMAP.md ("Load time").
//
//   eigen_timing [--n 4096] [--kind random|gram] [--rows R] [--seed 1] [--threads 0]
//
// random: a symmetric matrix of N(0, 1) entries (spread spectrum, little deflation: the slow case).
// gram: XᵀX of an R x n N(0, 1) matrix X (R < n gives n - R zero eigenvalues, like a rank-deficient
// embedding Gram).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "models/drafters/flashmap_fold.h"

int main(int argc, char** argv) {
  int64_t n = 4096, rows = 0;
  uint64_t seed = 1;
  int threads = 0;
  std::string kind = "random";
  CLI::App app{"Time symmetric_eigen on a synthetic matrix"};
  app.add_option("--n", n);
  app.add_option("--kind", kind)->check(CLI::IsMember({"random", "gram"}));
  app.add_option("--rows", rows, "gram: rows of X (default n / 2)");
  app.add_option("--seed", seed);
  app.add_option("--threads", threads, "BLAS threads (0: the hardware's)");
  CLI11_PARSE(app, argc, argv);

  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  std::vector<double> a(static_cast<size_t>(n * n));
  if (kind == "random") {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k <= i; ++k) a[i * n + k] = a[k * n + i] = nd(rng);
  } else {
    if (rows <= 0) rows = std::max<int64_t>(1, n / 2);
    std::vector<double> xt(static_cast<size_t>(n * rows));  // column i of X at xt[i * rows]
    for (double& x : xt) x = nd(rng);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k <= i; ++k) {
        double s = 0;
        for (int64_t r = 0; r < rows; ++r) s += xt[i * rows + r] * xt[k * rows + r];
        a[i * n + k] = a[k * n + i] = s;
      }
    }
  }
  const std::vector<double> a0 = a;

  const auto t0 = std::chrono::steady_clock::now();
  auto res = bs::symmetric_eigen(std::move(a), n, threads);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!res.ok()) {
    fmt::print(stderr, "symmetric_eigen failed: {}\n", res.status().message());
    return 1;
  }
  const bs::SymmetricEigen& e = *res;

  double scale = 0, resid = 0, ortho = 0;
  for (double x : a0) scale = std::max(scale, std::abs(x));
  std::vector<int64_t> cols{0, n / 3, n / 2, n - 1};
  for (int64_t c : cols) {
    for (int64_t i = 0; i < n; ++i) {
      double au = 0;
      for (int64_t k = 0; k < n; ++k) au += a0[i * n + k] * e.vectors[k * n + c];
      resid = std::max(resid, std::abs(au - e.values[c] * e.vectors[i * n + c]));
    }
    for (int64_t c2 : cols) {
      double dot = 0;
      for (int64_t i = 0; i < n; ++i) dot += e.vectors[i * n + c] * e.vectors[i * n + c2];
      ortho = std::max(ortho, std::abs(dot - (c == c2 ? 1.0 : 0.0)));
    }
  }
  fmt::print(
      "n {} kind {} threads {} : {:.2f} s  (lambda max {:.6g}, min {:.6g}; residual {:.2e}, "
      "orthogonality {:.2e})\n",
      n, kind, threads, secs, e.values.front(), e.values.back(), resid / std::max(scale, 1e-300),
      ortho);
  return 0;
}
