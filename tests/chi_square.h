// Chi-square goodness-of-fit testing for the statistical sampling tests (deterministic seeds;
// each test fails only when p < kAlpha, a false-alarm rate of 1e-4 per test).
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace bs::test_util {

constexpr double kAlpha = 1e-4;

// Regularised upper incomplete gamma Q(a, x): series for x < a + 1, else a continued fraction
// (modified Lentz).
inline double gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1) {
    double term = 1.0 / a, sum = term, ap = a;
    for (int n = 0; n < 100000; ++n) {
      ap += 1;
      term *= x / ap;
      sum += term;
      if (std::abs(term) < std::abs(sum) * 1e-16) break;
    }
    return 1.0 - sum * std::exp(log_prefix);
  }
  constexpr double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 100000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::abs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1 / d;
    const double delta = d * c;
    h *= delta;
    if (std::abs(delta - 1) < 1e-16) break;
  }
  return std::exp(log_prefix) * h;
}

inline double chi2_pvalue(double stat, int df) { return gamma_q(df / 2.0, stat / 2.0); }

// Chi-square goodness of fit of `counts` (n samples) to `probs`; cells expecting fewer than 5
// samples are pooled. An observation outside the support fails outright (p = 0).
template <typename Key>
double goodness_of_fit(const std::map<Key, int64_t>& counts, const std::map<Key, double>& probs,
                       int64_t n, std::string* detail) {
  for (const auto& [key, c] : counts) {
    auto it = probs.find(key);
    if (it == probs.end() || it->second <= 0) {
      *detail = "an observation has probability 0";
      return 0;
    }
  }
  double stat = 0, pooled_e = 0, pooled_o = 0;
  int cells = 0;
  for (const auto& [key, p] : probs) {
    const double e = p * static_cast<double>(n);
    auto it = counts.find(key);
    const double o = it == counts.end() ? 0 : static_cast<double>(it->second);
    if (e < 5) {
      pooled_e += e;
      pooled_o += o;
      continue;
    }
    stat += (o - e) * (o - e) / e;
    ++cells;
  }
  if (pooled_e > 0) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++cells;
  }
  *detail = "chi2 " + std::to_string(stat) + " over " + std::to_string(cells) + " cells";
  return cells > 1 ? chi2_pvalue(stat, cells - 1) : 1.0;
}

// The cells of a distribution over indices: index -> probability, for probabilities > 0.
template <typename T>
std::map<int32_t, double> support(const std::vector<T>& probs) {
  std::map<int32_t, double> m;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] > 0) m[static_cast<int32_t>(i)] = static_cast<double>(probs[i]);
  }
  return m;
}

}  // namespace bs::test_util
