// FlashMap load-time folds: the eigensolver behind the noise fold, and the folded one-jump draft
// (eigenbasis noise, no vocabulary-sized tensor) against the unfolded computation (the exact
// algorithm with a vocabulary-sized state) fed the same noise.
#include "models/drafters/flashmap_fold.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "io/json_file.h"
#include "models/drafters/flashmap.h"
#include "models/registry.h"

namespace bs {
namespace {

const std::string kTarget = std::string(BS_SOURCE_DIR) + "/models/stories260K";
const std::string kDrafter = std::string(BS_TEST_DATA) + "/flashmap-stories260K";
const std::string kDrafterDv = std::string(BS_TEST_DATA) + "/flashmap-stories260K-dv128";

void check_eigen(const std::vector<double>& a, int64_t n, double tol) {
  auto res = symmetric_eigen(a, n);
  ASSERT_TRUE(res.ok()) << res.status().message();
  const SymmetricEigen& e = *res;
  for (int64_t c = 0; c + 1 < n; ++c) EXPECT_GE(e.values[c], e.values[c + 1]);
  double scale = 1e-300;
  for (double x : a) scale = std::max(scale, std::abs(x));
  for (int64_t c = 0; c < n; ++c) {
    // A u = λ u.
    for (int64_t i = 0; i < n; ++i) {
      double au = 0;
      for (int64_t k = 0; k < n; ++k) au += a[i * n + k] * e.vectors[k * n + c];
      EXPECT_NEAR(au, e.values[c] * e.vectors[i * n + c], tol * scale) << "col " << c;
    }
    // Orthonormal columns.
    for (int64_t c2 = 0; c2 < n; ++c2) {
      double dot = 0;
      for (int64_t i = 0; i < n; ++i) dot += e.vectors[i * n + c] * e.vectors[i * n + c2];
      EXPECT_NEAR(dot, c == c2 ? 1.0 : 0.0, tol);
    }
    // Canonical sign: the largest-magnitude entry is positive.
    int64_t big = 0;
    for (int64_t i = 1; i < n; ++i) {
      if (std::abs(e.vectors[i * n + c]) > std::abs(e.vectors[big * n + c])) big = i;
    }
    EXPECT_GT(e.vectors[big * n + c], 0.0);
  }
}

TEST(FlashMapEigen, RandomSymmetricAndGram) {
  std::mt19937 rng(3);
  std::normal_distribution<double> nd;
  for (int64_t n : {1, 2, 3, 8, 33, 64}) {
    std::vector<double> a(n * n);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k <= i; ++k) a[i * n + k] = a[k * n + i] = nd(rng);
    check_eigen(a, n, 1e-10);
    // A Gram matrix XᵀX of a tall X (PSD, like EᵀE).
    const int64_t rows = 3 * n + 1;
    std::vector<double> x(rows * n), g(n * n, 0.0);
    for (double& v : x) v = nd(rng);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < n; ++k)
        for (int64_t r = 0; r < rows; ++r) g[i * n + k] += x[r * n + i] * x[r * n + k];
    check_eigen(g, n, 1e-10);
  }
}

TEST(FlashMapEigen, DegenerateMatrices) {
  check_eigen(std::vector<double>(16, 0.0), 4, 1e-12);  // zero
  std::vector<double> id(25, 0.0);
  for (int i = 0; i < 5; ++i) id[i * 5 + i] = 2.0;  // repeated eigenvalue
  check_eigen(id, 5, 1e-12);
  // Rank one: v vᵀ.
  const std::vector<double> v{1, -2, 3, 0.5, 0};
  std::vector<double> r1(25);
  for (int i = 0; i < 5; ++i)
    for (int k = 0; k < 5; ++k) r1[i * 5 + k] = v[i] * v[k];
  check_eigen(r1, 5, 1e-12);
  auto e = symmetric_eigen(r1, 5);
  ASSERT_TRUE(e.ok());
  EXPECT_NEAR(e->values[0], 1 + 4 + 9 + 0.25, 1e-12);
  // Already tridiagonal and diagonal inputs.
  std::vector<double> diag(9, 0.0);
  diag[0] = -1, diag[4] = 5, diag[8] = 2;
  check_eigen(diag, 3, 1e-12);
  EXPECT_FALSE(symmetric_eigen({1, 2, 3}, 2).ok());
}

// Max |A U - U Λ| / max|A| and max |UᵀU - I| of a decomposition, plus the ordering and sign
// conventions (checked with EXPECTs).
struct EigenErrors {
  double residual = 0, orthogonality = 0;
};
EigenErrors eigen_errors(const std::vector<double>& a, const SymmetricEigen& e) {
  const int64_t n = e.n;
  for (int64_t c = 0; c + 1 < n; ++c) EXPECT_GE(e.values[c], e.values[c + 1]);
  std::vector<double> ut(n * n);  // ut[c * n + i] = U[i, c]
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < n; ++c) ut[c * n + i] = e.vectors[i * n + c];
  double scale = 1e-300;
  for (double x : a) scale = std::max(scale, std::abs(x));
  EigenErrors err;
  for (int64_t c = 0; c < n; ++c) {
    const double* u = &ut[c * n];
    int64_t big = 0;
    for (int64_t i = 0; i < n; ++i) {
      double au = 0;
      for (int64_t k = 0; k < n; ++k) au += a[i * n + k] * u[k];
      err.residual = std::max(err.residual, std::abs(au - e.values[c] * u[i]) / scale);
      if (std::abs(u[i]) > std::abs(u[big])) big = i;
    }
    EXPECT_GT(u[big], 0.0) << "col " << c;
    for (int64_t c2 = c; c2 < n; ++c2) {
      double dot = 0;
      for (int64_t i = 0; i < n; ++i) dot += u[i] * ut[c2 * n + i];
      err.orthogonality = std::max(err.orthogonality, std::abs(dot - (c == c2 ? 1.0 : 0.0)));
    }
  }
  return err;
}

// A = Q diag(lambda) Qᵀ with Q a product of random Householder reflectors; q gets Q (row-major).
std::vector<double> with_spectrum(const std::vector<double>& lambda, std::mt19937& rng,
                                  std::vector<double>* q) {
  const int64_t n = static_cast<int64_t>(lambda.size());
  std::normal_distribution<double> nd;
  std::vector<double> a(n * n, 0.0);
  q->assign(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i) a[i * n + i] = lambda[i], (*q)[i * n + i] = 1.0;
  std::vector<double> v(n), av(n);
  for (int r = 0; r < 6; ++r) {  // A <- H A H, Q <- H Q with H = I - 2 v vᵀ
    double norm = 0;
    for (double& x : v) x = nd(rng), norm += x * x;
    for (double& x : v) x /= std::sqrt(norm);
    for (int64_t i = 0; i < n; ++i) {
      av[i] = 0;
      for (int64_t k = 0; k < n; ++k) av[i] += a[i * n + k] * v[k];
    }
    double vav = 0;
    for (int64_t i = 0; i < n; ++i) vav += v[i] * av[i];
    // H A H = A - 2 v (Av)ᵀ - 2 (Av) vᵀ + 4 (vᵀAv) v vᵀ.
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < n; ++k)
        a[i * n + k] += -2 * v[i] * av[k] - 2 * av[i] * v[k] + 4 * vav * v[i] * v[k];
    for (int64_t k = 0; k < n; ++k) {
      double vq = 0;
      for (int64_t i = 0; i < n; ++i) vq += v[i] * (*q)[i * n + k];
      for (int64_t i = 0; i < n; ++i) (*q)[i * n + k] -= 2 * v[i] * vq;
    }
  }
  for (int64_t i = 0; i < n; ++i)  // exact symmetry
    for (int64_t k = 0; k < i; ++k) a[i * n + k] = a[k * n + i];
  return a;
}

TEST(FlashMapEigen, LargeClusteredAndRepeatedSpectrum) {
  // n = 520 (D&C with several merge levels): a spread part, an exactly repeated eigenvalue, a
  // cluster 1e-12 apart, many tiny near-equal values and exact zeros (a rank-deficient matrix).
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> ud(-1.0, 1.0);
  std::vector<double> lambda;
  for (int i = 0; i < 150; ++i) lambda.push_back(100.0 * ud(rng));
  for (int i = 0; i < 60; ++i) lambda.push_back(7.5);
  for (int i = 0; i < 40; ++i) lambda.push_back(50.0 + 1e-12 * i);
  for (int i = 0; i < 120; ++i) lambda.push_back(1e-9 * (1.0 + 1e-3 * ud(rng)));
  for (int i = 0; i < 150; ++i) lambda.push_back(0.0);
  std::shuffle(lambda.begin(), lambda.end(), rng);
  const int64_t n = static_cast<int64_t>(lambda.size());
  std::vector<double> q;
  const std::vector<double> a = with_spectrum(lambda, rng, &q);
  auto res = symmetric_eigen(a, n);
  ASSERT_TRUE(res.ok()) << res.status().message();
  const EigenErrors err = eigen_errors(a, *res);
  EXPECT_LT(err.residual, 1e-13);
  EXPECT_LT(err.orthogonality, 1e-12);
  // The spectrum, and each known eigenvector inside the computed eigenspace of its cluster (the
  // computed vectors whose values are within 1e-9 of it): |projection| = 1.
  std::vector<double> sorted = lambda;
  std::sort(sorted.rbegin(), sorted.rend());
  for (int64_t c = 0; c < n; ++c) EXPECT_NEAR(res->values[c], sorted[c], 1e-12 * 100.0) << c;
  for (int64_t i = 0; i < n; ++i) {
    double proj = 0;
    for (int64_t c = 0; c < n; ++c) {
      if (std::abs(res->values[c] - lambda[i]) > 1e-9 * 100.0) continue;
      double dot = 0;
      for (int64_t r = 0; r < n; ++r) dot += q[r * n + i] * res->vectors[r * n + c];
      proj += dot * dot;
    }
    EXPECT_NEAR(proj, 1.0, 1e-10) << "eigenvector " << i << " (lambda " << lambda[i] << ")";
  }
}

TEST(FlashMapEigen, LargeRandomAndRankDeficientGram) {
  std::mt19937 rng(9);
  std::normal_distribution<double> nd;
  for (int64_t n : {300, 600}) {
    std::vector<double> a(n * n);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k <= i; ++k) a[i * n + k] = a[k * n + i] = nd(rng);
    auto res = symmetric_eigen(a, n);
    ASSERT_TRUE(res.ok()) << res.status().message();
    EigenErrors err = eigen_errors(a, *res);
    EXPECT_LT(err.residual, 1e-13) << n;
    EXPECT_LT(err.orthogonality, 1e-12) << n;
    // XᵀX of a wide X [n / 3, n]: 2n/3 zero eigenvalues (the QL solver this replaced did not
    // converge on such a matrix at n = 300).
    const int64_t rows = n / 3;
    std::vector<double> x(rows * n), g(n * n, 0.0);
    for (double& v : x) v = nd(rng);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < n; ++k) g[i * n + k] += x[r * n + i] * x[r * n + k];
    res = symmetric_eigen(g, n);
    ASSERT_TRUE(res.ok()) << res.status().message();
    err = eigen_errors(g, *res);
    EXPECT_LT(err.residual, 1e-13) << n;
    EXPECT_LT(err.orthogonality, 1e-12) << n;
    for (int64_t c = rows; c < n; ++c) EXPECT_LT(std::abs(res->values[c]), 1e-12 * res->values[0]);
  }
}

TEST(FlashMapEigen, GluedWilkinsonTridiagonal) {
  // 20 copies of Wilkinson's W21+ glued by 1e-10: pairs of eigenvalues closer than 1e-14 and
  // groups of 20 near-equal ones, the hard case for a tridiagonal eigensolver's orthogonality.
  const int64_t n = 20 * 21;
  std::vector<double> a(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    a[i * n + i] = std::abs(10.0 - static_cast<double>(i % 21));
    if (i + 1 < n) a[i * n + i + 1] = a[(i + 1) * n + i] = (i % 21 == 20) ? 1e-10 : 1.0;
  }
  auto res = symmetric_eigen(a, n);
  ASSERT_TRUE(res.ok()) << res.status().message();
  const EigenErrors err = eigen_errors(a, *res);
  EXPECT_LT(err.residual, 1e-13);
  EXPECT_LT(err.orthogonality, 1e-12);
}

TEST(FlashMapEigen, ThreadCountChangesOnlyRounding) {
  // OpenBLAS splits some reductions by thread, so the bits may differ; the canonical basis may not.
  std::mt19937 rng(4);
  std::normal_distribution<double> nd;
  const int64_t n = 700;
  std::vector<double> a(n * n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k <= i; ++k) a[i * n + k] = a[k * n + i] = nd(rng);
  auto one = symmetric_eigen(a, n, 1);
  auto three = symmetric_eigen(a, n, 3);
  ASSERT_TRUE(one.ok() && three.ok());
  for (int64_t c = 0; c < n; ++c) EXPECT_NEAR(one->values[c], three->values[c], 1e-11) << c;
  for (int64_t i = 0; i < n * n; ++i) ASSERT_NEAR(one->vectors[i], three->vectors[i], 1e-9) << i;
}

TEST(FlashMapEigen, NonFiniteAndMisshapenInputsAreErrors) {
  std::vector<double> a{1, 2, 2, 1};
  a[1] = std::nan("");
  auto res = symmetric_eigen(a, 2);
  ASSERT_FALSE(res.ok());
  EXPECT_NE(res.status().message().find("entry (0, 1)"), std::string::npos)
      << res.status().message();
  a[1] = 2, a[3] = INFINITY;
  EXPECT_FALSE(symmetric_eigen(a, 2).ok());
  EXPECT_FALSE(symmetric_eigen({}, 0).ok());
}

TEST(FlashMapEigen, MatmulMatchesLoops) {
  std::mt19937 rng(6);
  std::normal_distribution<double> nd;
  const int64_t m = 37, k = 70, n = 45;
  std::vector<double> a(m * k), b(k * n);
  for (double& x : a) x = nd(rng);
  for (double& x : b) x = nd(rng);
  const std::vector<double> c = matmul_f64(a, b, m, k, n, 2);
  ASSERT_EQ(c.size(), static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) s += a[i * k + l] * b[l * n + j];
      EXPECT_NEAR(c[i * n + j], s, 1e-12) << i << "," << j;
    }
  }
}

class FlashMapFold : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend(2);
    auto t = load_target(kTarget, *backend_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    target_ = std::move(*t);
  }

  std::unique_ptr<FlashMapDrafter> load(const std::string& dir, bool fold, int steps = 0,
                                        float noise_scale = 1.0f) {
    auto cfg = io::read_json_file(dir + "/config.json");
    EXPECT_TRUE(cfg.ok());
    DrafterOptions opt{.flashmap_steps = steps, .flashmap_noise_scale = noise_scale};
    auto d = load_flashmap_drafter(dir, *cfg, *target_, opt, {.fold_one_jump = fold});
    EXPECT_TRUE(d.ok()) << d.status().message();
    return d.ok() ? std::move(*d) : nullptr;
  }

  // Observes random taps for positions [0, p), then drafts the block after the anchor at p with
  // the given starting noise; returns the [B, V] logits.
  std::vector<float> draft(FlashMapDrafter& d, int64_t p, const std::vector<float>& taps,
                           std::vector<float> noise, int64_t num_drafts = 0) {
    KvPool kv = d.make_kv_pool(6);
    const std::vector<int32_t> table{4, 1, 5, 0, 3, 2};  // scattered blocks
    const int64_t cols = static_cast<int64_t>(d.target_layers().size()) * 64;
    if (p > 0) {
      Tensor t = backend_->empty({p, cols}, DType::kF32);
      backend_->copy_from_host(t, taps.data());
      EXPECT_TRUE(d.observe(kv, table, t, 0).ok());
    }
    d.inject_noise(std::move(noise));
    Tensor logits;
    ProposeRequest req{.anchor = 403,
                       .anchor_pos = p,
                       .block_table = table,
                       .num_drafts = num_drafts ? num_drafts : d.block_size(),
                       .noise_seed = 5};
    const Status st = d.propose(kv, req, &logits);
    EXPECT_TRUE(st.ok()) << st.message();
    return backend_->to_host_f32(logits);
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLM> target_;
};

void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rel) {
  ASSERT_EQ(a.size(), b.size());
  double scale = 1e-6;
  for (float x : a)
    if (std::isfinite(x)) scale = std::max(scale, static_cast<double>(std::abs(x)));
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
      EXPECT_EQ(a[i], b[i]) << i;
    } else {
      EXPECT_NEAR(a[i], b[i], rel * scale) << i;
    }
  }
}

TEST_F(FlashMapFold, FoldedOneJumpEqualsUnfolded) {
  for (const std::string& dir : {kDrafter, kDrafterDv}) {
    auto folded = load(dir, true);
    auto exact = load(dir, false);
    ASSERT_TRUE(folded && exact);
    EXPECT_TRUE(folded->folded());
    EXPECT_FALSE(exact->folded());
    EXPECT_EQ(folded->noise_dim(), 64);
    EXPECT_EQ(exact->noise_dim(), 512);
    const int64_t B = folded->block_size();
    std::mt19937 rng(11);
    std::normal_distribution<float> nd;
    // p = 3 (context shorter than the block: chunked cross-attention) and p = 21.
    for (int64_t p : {3, 21}) {
      std::vector<float> taps(p * 192), x0(B * 512);
      for (float& v : taps) v = nd(rng);
      for (float& v : x0) v = nd(rng);
      auto z = folded->eigen_noise_from_vocab(x0);
      ASSERT_TRUE(z.ok()) << z.status().message();
      ASSERT_EQ(z->size(), static_cast<size_t>(B * 64));
      const std::vector<float> a = draft(*folded, p, taps, *z);
      const std::vector<float> b = draft(*exact, p, taps, x0);
      expect_close(a, b, 2e-5);
      // Fewer drafts: the same leading rows (the DiT always runs all B slots).
      const std::vector<float> a3 = draft(*folded, p, taps, *z, 3);
      ASSERT_EQ(a3.size(), static_cast<size_t>(3 * 512));
      for (size_t i = 0; i < a3.size(); ++i) EXPECT_EQ(a3[i], a[i]);
    }
  }
}

TEST_F(FlashMapFold, FoldedEqualsUnfoldedAtOtherNoiseScales) {
  for (float scale : {0.0f, 0.5f}) {
    auto folded = load(kDrafter, true, 1, scale);
    auto exact = load(kDrafter, false, 1, scale);
    ASSERT_TRUE(folded && exact);
    std::mt19937 rng(12);
    std::normal_distribution<float> nd;
    std::vector<float> taps(9 * 192), x0(8 * 512);
    for (float& v : taps) v = nd(rng);
    for (float& v : x0) v = nd(rng);
    auto z = folded->eigen_noise_from_vocab(x0);
    ASSERT_TRUE(z.ok());
    expect_close(draft(*folded, 9, taps, *z), draft(*exact, 9, taps, x0), 2e-5);
  }
}

TEST_F(FlashMapFold, EigenNoiseReproducesTheEmbeddedNoise) {
  // U Λ^½ z = Eᵀ x0, checked through the norms: |Eᵀx0|² = Σ λ z² (λ from the Gram matrix).
  auto d = load(kDrafter, true);
  ASSERT_TRUE(d);
  const std::vector<float> e = backend_->to_host_f32(target_->embed_tokens());
  std::vector<double> gram(64 * 64, 0.0);
  for (int64_t v = 0; v < 512; ++v)
    for (int64_t i = 0; i < 64; ++i)
      for (int64_t k = 0; k < 64; ++k) gram[i * 64 + k] += double(e[v * 64 + i]) * e[v * 64 + k];
  auto eig = symmetric_eigen(gram, 64);
  ASSERT_TRUE(eig.ok());
  std::mt19937 rng(13);
  std::normal_distribution<float> nd;
  std::vector<float> x0(2 * 512);
  for (float& v : x0) v = nd(rng);
  auto z = d->eigen_noise_from_vocab(x0);
  ASSERT_TRUE(z.ok());
  for (int64_t r = 0; r < 2; ++r) {
    double direct = 0, folded = 0;
    for (int64_t h = 0; h < 64; ++h) {
      double s = 0;
      for (int64_t v = 0; v < 512; ++v) s += double(x0[r * 512 + v]) * e[v * 64 + h];
      direct += s * s;
      folded += eig->values[h] * double((*z)[r * 64 + h]) * (*z)[r * 64 + h];
    }
    EXPECT_NEAR(folded, direct, 1e-4 * direct);
  }
}

}  // namespace
}  // namespace bs
