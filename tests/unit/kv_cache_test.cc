// Property test of the paged KV bookkeeping against a trivial model: random reserve / append /
// truncate / free on several sequences, checking block ownership and that data written at a
// position reads back through the block table until it is truncated away.
#include "engine/kv_cache.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <set>

namespace bs {
namespace {

constexpr int64_t kBlock = 16;

TEST(KvCache, RandomOperationsMatchTrivialModel) {
  std::mt19937 rng(1234);
  constexpr int64_t kBlocks = 40;
  BlockAllocator alloc(kBlocks);
  // Backing store indexed by slot, and the trivial model: per sequence, the value at position p.
  std::vector<int64_t> store(kBlocks * kBlock, -1);
  std::vector<std::unique_ptr<SequenceKv>> seqs;
  std::vector<std::vector<int64_t>> model;
  int64_t next_value = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const int op = static_cast<int>(rng() % 10);
    if (seqs.empty() || op == 0) {
      seqs.push_back(std::make_unique<SequenceKv>(alloc, kBlock));
      model.emplace_back();
      continue;
    }
    const size_t i = rng() % seqs.size();
    SequenceKv& s = *seqs[i];
    if (op <= 5) {  // append 1..20 positions
      const int64_t n = 1 + rng() % 20;
      const int64_t len = s.length();
      const Status st = s.reserve(len + n);
      if (!st.ok()) {
        EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
        EXPECT_EQ(s.length(), len);
        continue;
      }
      for (int64_t p = len; p < len + n; ++p) {
        const auto table = s.block_table();
        store[table[p / kBlock] * kBlock + p % kBlock] = next_value;
        model[i].push_back(next_value++);
      }
      s.set_length(len + n);
    } else if (op <= 8) {  // rollback to a random shorter length
      const int64_t len = s.length() ? static_cast<int64_t>(rng() % (s.length() + 1)) : 0;
      s.truncate(len);
      model[i].resize(len);
    } else {  // free the whole sequence
      seqs.erase(seqs.begin() + static_cast<long>(i));
      model.erase(model.begin() + static_cast<long>(i));
      continue;
    }
    // Invariants: no block shared, capacity covers length with < 1 spare block, data intact.
    std::set<int32_t> owned;
    int64_t used = 0;
    for (size_t j = 0; j < seqs.size(); ++j) {
      const auto table = seqs[j]->block_table();
      for (int32_t b : table) ASSERT_TRUE(owned.insert(b).second) << "block " << b << " shared";
      used += static_cast<int64_t>(table.size());
      ASSERT_EQ(seqs[j]->length(), static_cast<int64_t>(model[j].size()));
      ASSERT_LT(seqs[j]->capacity() - seqs[j]->length(), kBlock + 20);
      for (int64_t p = 0; p < seqs[j]->length(); ++p) {
        ASSERT_EQ(store[table[p / kBlock] * kBlock + p % kBlock], model[j][p]);
      }
    }
    ASSERT_EQ(used + alloc.free_blocks(), kBlocks);
  }
}

TEST(KvCache, TruncateReleasesWholeBlocksOnly) {
  BlockAllocator alloc(8);
  SequenceKv s(alloc, kBlock);
  ASSERT_TRUE(s.reserve(40).ok());
  s.set_length(40);
  EXPECT_EQ(alloc.free_blocks(), 5);
  s.truncate(17);  // still needs 2 blocks
  EXPECT_EQ(s.length(), 17);
  EXPECT_EQ(s.block_table().size(), 2u);
  s.truncate(16);
  EXPECT_EQ(s.block_table().size(), 1u);
  s.clear();
  EXPECT_EQ(alloc.free_blocks(), 8);
}

TEST(KvCache, OutOfMemoryIsAnErrorAndKeepsState) {
  BlockAllocator alloc(2);
  SequenceKv s(alloc, kBlock);
  ASSERT_TRUE(s.reserve(20).ok());
  const Status st = s.reserve(100);
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
  EXPECT_NE(st.message().find("KV cache is full"), std::string::npos);
  EXPECT_EQ(s.block_table().size(), 2u);
  EXPECT_EQ(alloc.free_blocks(), 0);
}

// Prefix caching, block by block (blocks of 2 positions): a cached chain is matched only as far
// as its content and everything before it agree; matched blocks gain a reference; a block nobody
// references stays cached and counts as free, and allocate() evicts the one released longest ago.
TEST(KvCache, PrefixCacheMatchesSharesAndEvictsLeastRecentlyReleased) {
  BlockAllocator alloc(4, /*prefix_caching=*/true);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5};  // blocks [1 2] [3 4], token 5 not full
  std::vector<int32_t> blocks;
  {
    SequenceKv seq(alloc, 2);
    ASSERT_TRUE(seq.reserve(5).ok());
    seq.set_length(5);
    blocks.assign(seq.block_table().begin(), seq.block_table().end());
    EXPECT_TRUE(alloc.match_prefix(a, 2, 2).empty());  // nothing cached yet
    alloc.cache_prefix(a, seq.block_table(), 2);
    EXPECT_EQ(alloc.cached_blocks(), 2);
    EXPECT_EQ(alloc.free_blocks(), 1);
  }  // released: the two cached blocks stay cached, the third is free
  EXPECT_EQ(alloc.free_blocks(), 4);
  EXPECT_EQ(alloc.cached_blocks(), 2);
  // Same head: both blocks; a different second block: the first only; another first: none.
  std::vector<int32_t> got = alloc.match_prefix(a, 2, 2);
  EXPECT_EQ(got, std::vector<int32_t>(blocks.begin(), blocks.begin() + 2));
  EXPECT_EQ(alloc.free_blocks(), 2);  // taken
  EXPECT_EQ(alloc.match_prefix(std::vector<int32_t>{1, 2, 9, 9}, 2, 2),
            std::vector<int32_t>{blocks[0]});
  EXPECT_TRUE(alloc.match_prefix(std::vector<int32_t>{3, 4, 1, 2}, 2, 2).empty());
  EXPECT_EQ(alloc.match_prefix(a, 2, 1), std::vector<int32_t>{blocks[0]});  // at most 1
  // Release in the order: block 1, block 0 (three references), ...
  alloc.release(blocks[1]);
  for (int i = 0; i < 3; ++i) alloc.release(blocks[0]);
  EXPECT_EQ(alloc.free_blocks(), 4);
  // Two free blocks first, then the cached ones, least recently released first.
  std::vector<int32_t> order;
  for (int i = 0; i < 4; ++i) {
    auto b = alloc.allocate();
    ASSERT_TRUE(b.ok());
    order.push_back(*b);
  }
  EXPECT_EQ(order[2], blocks[1]);
  EXPECT_EQ(order[3], blocks[0]);
  EXPECT_EQ(alloc.cached_blocks(), 0);  // evicted: no longer matched
  EXPECT_FALSE(alloc.allocate().ok());
  for (int32_t b : order) alloc.release(b);
  EXPECT_TRUE(alloc.match_prefix(a, 2, 2).empty());
  // Without prefix caching nothing is ever cached.
  BlockAllocator plain(2);
  EXPECT_FALSE(plain.prefix_caching());
  plain.cache_prefix(a, std::vector<int32_t>{0, 1}, 2);
  EXPECT_EQ(plain.cached_blocks(), 0);
}

}  // namespace
}  // namespace bs
