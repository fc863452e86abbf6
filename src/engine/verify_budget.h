// Verify-length scheduling across the sequences of a batched speculative step: the
// non-anticipating greedy rule of DSpark (arXiv 2607.05147, Algorithm 1; docs/DFLASH.md
// "Verify-length scheduling").
//
// A step verifies B_v = sum_r (1 + l_r) rows (each sequence's anchor and its first l_r drafts) and
// is expected to commit tau = sum_r (1 + sum_{j <= l_r} a_{r,j}) tokens, where a_{r,j} is the
// prefix survival of sequence r's draft j (the chance that drafts 1..j are all accepted: DSpark's
// confidence head, 1 for drafters without one). With t(B_v) the modelled time of a step, the rule
// maximises tokens per second theta = tau / t(B_v) greedily: every (r, j) in descending a (ties:
// smaller j, then smaller r), admitted one at a time while theta rises, stopping at the first
// candidate that would not raise it.
//
// The stop is what keeps the output distribution exact (lossless): whether (r, j) is verified then
// depends only on candidates ranked before it, i.e. on a values >= a_{r,j}, which are functions of
// drafts 1..j-1 of sequence r (a_{r,j} is computed from draft j-1, not from draft j) and of other
// sequences' drafts, never of draft j itself or a later one of row r. Truncating a block at a
// point chosen that way only changes how many drafts are checked, not the acceptance rule: at the
// first unverified position the target samples its token from its own distribution, as a
// rejected or a verified draft would leave it. A global search over all prefixes of the order
// (no early stop) would look at smaller a values, i.e. at draft j itself, and bias the output.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace bs {

// Whether a sequence's drafts take part in the batch's verify budget (GenerateOptions::
// verify_budget; CLI --verify-budget). kOff: every draft the sequence proposes is verified.
enum class VerifyBudget { kOff, kAuto };

// t(B_v): the modelled seconds of one speculative step verifying `rows` rows in all. A fixed part
// (drafting, context update, host work) plus the verify forward's time, interpolated linearly
// between measured row counts and extrapolated along the last segment. Measured points are made
// non-decreasing (a measured dip is noise: a longer verify never takes less time), so that the
// rule's stop is not triggered by it.
class StepTimeModel {
 public:
  StepTimeModel() = default;
  // `verify`: (rows, seconds) pairs, rows >= 1, in any order; `fixed_seconds` >= 0.
  StepTimeModel(std::vector<std::pair<int64_t, double>> verify, double fixed_seconds);

  bool empty() const { return verify_.empty(); }
  double seconds(int64_t rows) const { return fixed_ + verify_seconds(rows); }
  double verify_seconds(int64_t rows) const;
  double fixed_seconds() const { return fixed_; }
  void set_fixed_seconds(double s) { fixed_ = s > 0 ? s : 0; }
  const std::vector<std::pair<int64_t, double>>& verify_points() const { return verify_; }

 private:
  std::vector<std::pair<int64_t, double>> verify_;  // sorted by rows, seconds non-decreasing
  double fixed_ = 0;
};

// One sequence of the step: its k drafts with their prefix survivals. A non-increasing order is
// enforced (a_j is taken as min(a_1..a_j), a function of the same drafts).
struct VerifyCandidates {
  int64_t drafts = 0;               // k
  std::span<const float> survival;  // a_1 .. a_k; empty: 1 each (a drafter without confidences)
  bool fixed = false;               // all k verified whatever the rule says (verify_budget off)
};

// Algorithm 1: the number of drafts l_r each sequence verifies (0 .. drafts; fixed: drafts),
// admitting (r, j) in descending a while theta = tau / t(B_v) rises. `t` must not be empty.
std::vector<int64_t> admit_drafts(std::span<const VerifyCandidates> seqs, const StepTimeModel& t);

// The modelled tokens per second of verifying `lengths[r]` candidates of each sequence.
double modelled_tokens_per_second(std::span<const VerifyCandidates> seqs,
                                  std::span<const int64_t> lengths, const StepTimeModel& t);

}  // namespace bs
