// Backend::greedy_accept on the CPU reference against accept_greedy (the host acceptance rule):
// random batches of verify blocks of every size 0..20 drafts, with everything accepted, nothing,
// or a first mismatch anywhere in between, in one call.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/speculative_accept.h"

namespace bs {
namespace {

struct Case {
  std::vector<int32_t> offsets;  // [S + 1]
  std::vector<int32_t> tokens;   // [rows]: anchor, drafts per block
  std::vector<int32_t> target;   // [rows]
  int64_t width = 0;
};

// A batch of `seqs` blocks with k in [0, max_k]; block i's drafts match the target's argmax up to
// a chosen first mismatch (or all of them).
Case random_case(std::mt19937& rng, int64_t seqs, int64_t max_k, int32_t vocab) {
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  Case c;
  c.offsets.push_back(0);
  int64_t widest = 0;
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t k = std::uniform_int_distribution<int64_t>(0, max_k)(rng);
    // 0 .. k - 1: first rejected draft; k: every draft accepted.
    const int64_t mismatch = std::uniform_int_distribution<int64_t>(0, k)(rng);
    c.tokens.push_back(tok(rng));  // the anchor
    for (int64_t i = 0; i <= k; ++i) c.target.push_back(tok(rng));
    const size_t first = static_cast<size_t>(c.offsets.back());
    for (int64_t i = 0; i < k; ++i) {
      int32_t d = c.target[first + static_cast<size_t>(i)];
      if (i == mismatch) d = (d + 1 + tok(rng) % (vocab - 1)) % vocab;  // any other token
      if (i > mismatch && rng() % 2) d = tok(rng);  // after a rejection anything goes
      c.tokens.push_back(d);
    }
    c.offsets.push_back(static_cast<int32_t>(c.tokens.size()));
    widest = std::max(widest, k + 2);
  }
  c.width = widest + static_cast<int64_t>(rng() % 3);
  return c;
}

Tensor ints(Backend& be, const std::vector<int32_t>& v) {
  Tensor t = be.empty({static_cast<int64_t>(v.size())}, DType::kI32);
  be.copy_from_host(t, v.data());
  return t;
}

// greedy_accept's rows for `c`, computed on `be`.
std::vector<int32_t> run_op(Backend& be, const Case& c) {
  const int64_t seqs = static_cast<int64_t>(c.offsets.size()) - 1;
  const Tensor out = be.empty({seqs, c.width}, DType::kI32);
  // Garbage in the output first: every entry must be written.
  std::vector<int32_t> junk(static_cast<size_t>(seqs * c.width), -7);
  be.copy_from_host(out, junk.data());
  be.greedy_accept(out, ints(be, c.tokens), ints(be, c.target), ints(be, c.offsets));
  std::vector<int32_t> host(junk.size());
  be.copy_to_host(host.data(), out);
  return host;
}

// What the op must give: accept_greedy's (a, next), every draft, zeros after.
void expect_matches_accept_greedy(const Case& c, const std::vector<int32_t>& got,
                                  const std::string& what) {
  const size_t seqs = c.offsets.size() - 1, width = static_cast<size_t>(c.width);
  for (size_t s = 0; s < seqs; ++s) {
    const size_t first = static_cast<size_t>(c.offsets[s]);
    const size_t k = static_cast<size_t>(c.offsets[s + 1]) - first - 1;
    const std::span<const int32_t> drafts(c.tokens.data() + first + 1, k);
    const std::span<const int32_t> target(c.target.data() + first, k + 1);
    const AcceptResult ref = accept_greedy(drafts, target);
    const int32_t* row = got.data() + s * width;
    EXPECT_EQ(row[0], ref.accepted) << what << " block " << s;
    EXPECT_EQ(row[1], ref.next) << what << " block " << s;
    for (size_t i = 0; i < k; ++i) EXPECT_EQ(row[2 + i], drafts[i]) << what << " block " << s;
    for (size_t j = k + 2; j < width; ++j) EXPECT_EQ(row[j], 0) << what << " block " << s;
  }
}

TEST(GreedyAccept, MatchesAcceptGreedyOnRandomBatches) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(5);
  int64_t all = 0, none = 0, mid = 0;
  for (int iter = 0; iter < 300; ++iter) {
    const int64_t seqs = 1 + iter % 9;
    const Case c = random_case(rng, seqs, 20, iter % 2 ? 7 : 50000);
    const std::vector<int32_t> got = run_op(*be, c);
    expect_matches_accept_greedy(c, got, "iteration " + std::to_string(iter));
    for (int64_t s = 0; s < seqs; ++s) {
      const int64_t k = c.offsets[s + 1] - c.offsets[s] - 1, a = got[s * c.width];
      all += k > 0 && a == k;
      none += k > 0 && a == 0;
      mid += a > 0 && a < k;
    }
  }
  // Every regime occurred many times.
  EXPECT_GT(all, 50);
  EXPECT_GT(none, 50);
  EXPECT_GT(mid, 50);
}

TEST(GreedyAccept, HandPickedBlocks) {
  auto be = make_cpu_backend(1);
  // Block 0: all 3 drafts accepted (bonus 9); block 1: no drafts; block 2: the second draft is
  // rejected (correction 6); block 3: the first draft is rejected.
  const Case c{.offsets = {0, 4, 5, 9, 11},
               .tokens = {1, 2, 3, 4, 8, 5, 5, 7, 7, 3, 4},
               .target = {2, 3, 4, 9, 11, 5, 6, 1, 1, 5, 6},
               .width = 5};
  const std::vector<int32_t> got = run_op(*be, c);
  const std::vector<int32_t> want = {3, 9,  2, 3, 4,   // a = 3, next = bonus
                                     0, 11, 0, 0, 0,   // k = 0
                                     1, 6,  5, 7, 7,   // a = 1, next = correction
                                     0, 5,  4, 0, 0};  // a = 0
  EXPECT_EQ(got, want);
  expect_matches_accept_greedy(c, got, "hand-picked");
}

}  // namespace
}  // namespace bs
