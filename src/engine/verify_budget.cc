#include "engine/verify_budget.h"

#include <algorithm>
#include <tuple>

#include "core/check.h"

namespace bs {

StepTimeModel::StepTimeModel(std::vector<std::pair<int64_t, double>> verify, double fixed_seconds)
    : verify_(std::move(verify)) {
  std::sort(verify_.begin(), verify_.end());
  double floor = 0;
  for (auto& [rows, seconds] : verify_) {
    BS_CHECK(rows >= 1);
    seconds = std::max(seconds, floor);
    floor = seconds;
  }
  set_fixed_seconds(fixed_seconds);
}

double StepTimeModel::verify_seconds(int64_t rows) const {
  BS_CHECK(!verify_.empty());
  if (verify_.size() == 1) {  // one point: proportional to the rows beyond it, flat below
    const auto [r0, s0] = verify_.front();
    return rows <= r0 ? s0 : s0 * static_cast<double>(rows) / static_cast<double>(r0);
  }
  if (rows <= verify_.front().first) return verify_.front().second;
  // The segment [i - 1, i] holding `rows`, or the last one beyond the last point.
  size_t i = 1;
  while (i + 1 < verify_.size() && verify_[i].first < rows) ++i;
  const auto [r0, s0] = verify_[i - 1];
  const auto [r1, s1] = verify_[i];
  if (r1 == r0) return s1;
  const double slope = (s1 - s0) / static_cast<double>(r1 - r0);
  return s0 + slope * static_cast<double>(rows - r0);
}

namespace {

// a_j of sequence r, made non-increasing in j (1-based j).
std::vector<std::vector<float>> monotone_survival(std::span<const VerifyCandidates> seqs) {
  std::vector<std::vector<float>> a(seqs.size());
  for (size_t r = 0; r < seqs.size(); ++r) {
    const VerifyCandidates& s = seqs[r];
    BS_CHECK(s.survival.empty() || static_cast<int64_t>(s.survival.size()) >= s.drafts);
    float run = 1.0f;
    for (int64_t j = 0; j < s.drafts; ++j) {
      const float v = s.survival.empty() ? 1.0f : s.survival[static_cast<size_t>(j)];
      run = std::min(run, v >= 0.0f ? std::min(v, 1.0f) : 0.0f);  // NaN: 0
      a[r].push_back(run);
    }
  }
  return a;
}

}  // namespace

double modelled_tokens_per_second(std::span<const VerifyCandidates> seqs,
                                  std::span<const int64_t> lengths, const StepTimeModel& t) {
  BS_CHECK(lengths.size() == seqs.size());
  const std::vector<std::vector<float>> a = monotone_survival(seqs);
  double tau = 0;
  int64_t rows = 0;
  for (size_t r = 0; r < seqs.size(); ++r) {
    rows += 1 + lengths[r];
    tau += 1;
    for (int64_t j = 0; j < lengths[r]; ++j) tau += a[r][static_cast<size_t>(j)];
  }
  return tau / t.seconds(rows);
}

std::vector<int64_t> admit_drafts(std::span<const VerifyCandidates> seqs, const StepTimeModel& t) {
  const std::vector<std::vector<float>> a = monotone_survival(seqs);
  std::vector<int64_t> lengths(seqs.size(), 0);
  // The fixed part: every anchor row, and all drafts of the sequences that do not take part.
  double tau = 0;
  int64_t rows = 0;
  struct Candidate {
    float a;
    int64_t j;  // 0-based draft index
    size_t r;
  };
  std::vector<Candidate> order;
  for (size_t r = 0; r < seqs.size(); ++r) {
    tau += 1;
    rows += 1;
    if (seqs[r].fixed) {
      lengths[r] = seqs[r].drafts;
      rows += seqs[r].drafts;
      for (const float v : a[r]) tau += v;
      continue;
    }
    for (int64_t j = 0; j < seqs[r].drafts; ++j) {
      order.push_back({a[r][static_cast<size_t>(j)], j, r});
    }
  }
  // Descending a; ties to the earlier draft, then the earlier sequence. With a non-increasing in
  // j, (r, j - 1) always comes before (r, j), so each admitted set is a prefix of every block.
  std::sort(order.begin(), order.end(), [](const Candidate& x, const Candidate& y) {
    return std::tie(y.a, x.j, x.r) < std::tie(x.a, y.j, y.r);
  });
  double theta = tau / t.seconds(rows);
  for (const Candidate& c : order) {
    const double next = (tau + c.a) / t.seconds(rows + 1);
    if (!(next > theta)) break;  // the first candidate that does not raise theta ends the step
    BS_CHECK(lengths[c.r] == c.j);
    lengths[c.r] = c.j + 1;
    tau += c.a;
    rows += 1;
    theta = next;
  }
  return lengths;
}

}  // namespace bs
