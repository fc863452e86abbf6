#include "models/blocks/paged_kv.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>

namespace bs {

KvPool make_kv_pool(Backend& backend, int64_t num_layers, int64_t kv_heads, int64_t head_dim,
                    int64_t num_blocks) {
  KvPool pool;
  pool.num_blocks = num_blocks;
  for (int64_t i = 0; i < num_layers; ++i) {
    pool.k.push_back(backend.empty({num_blocks, pool.block_size, kv_heads, head_dim}));
    pool.v.push_back(backend.empty({num_blocks, pool.block_size, kv_heads, head_dim}));
  }
  return pool;
}

Status check_block_table(const KvPool& kv, std::span<const int32_t> table, int64_t end,
                         std::string_view what) {
  const int64_t needed = (end + kv.block_size - 1) / kv.block_size;
  if (static_cast<int64_t>(table.size()) < needed) {
    return InvalidArgument("{}: block table has {} blocks, {} positions need {}", what,
                           table.size(), end, needed);
  }
  for (int64_t b = 0; b < needed; ++b) {
    if (table[b] < 0 || table[b] >= kv.num_blocks) {
      return InvalidArgument("{}: block id {} out of range [0, {})", what, table[b], kv.num_blocks);
    }
  }
  return Status::Ok();
}

Status check_propose(const KvPool& kv, const ProposeRequest& req, int64_t max_drafts, int64_t vocab,
                     int64_t block_rows, std::string_view what) {
  if (req.num_drafts < 1 || req.num_drafts > max_drafts) {
    return InvalidArgument("{}: num_drafts {} out of range [1, {}]", what, req.num_drafts,
                           max_drafts);
  }
  if (req.anchor < 0 || req.anchor >= vocab) {
    return InvalidArgument("{}: anchor token {} out of range [0, {})", what, req.anchor, vocab);
  }
  if (req.anchor_pos < 0)
    return InvalidArgument("{}: negative anchor_pos {}", what, req.anchor_pos);
  return check_block_table(kv, req.block_table, req.anchor_pos + block_rows, what);
}

void PagedBatch::stage(Backend& b, const KvPool& kv, std::span<const Seq> seqs, bool with_tables) {
  const int64_t num_seqs = static_cast<int64_t>(seqs.size());
  int64_t rows = 0, table_blocks = 0;
  for (const Seq& s : seqs) {
    rows += s.rows;
    table_blocks = std::max(table_blocks, static_cast<int64_t>(s.block_table.size()));
  }
  // Buffers grow by doubling, so that a long generation re-captures its graphs only
  // log2(length) times; the size is recorded once the buffers exist (an AllocationError leaves
  // a consistent state).
  const int64_t have = positions_.defined() ? positions_.dim(0) : 0;
  if (rows > have) {
    const int64_t r = std::max<int64_t>({rows, 2 * have, 16});
    positions_ = Tensor();
    slots_ = b.empty({r}, DType::kI32);
    positions_ = b.empty({r}, DType::kI32);
    ++generation_;
  }
  if (with_tables) {
    const int64_t cap = capacity(), have_seqs = tables_.defined() ? tables_.dim(0) : 0;
    if (cap < table_blocks || have_seqs < num_seqs) {
      const int64_t new_cap =
          cap >= table_blocks ? cap : std::max<int64_t>({table_blocks, 64, 2 * cap});
      const int64_t new_seqs = std::max<int64_t>({num_seqs, 2 * have_seqs, 1});
      tables_ = Tensor();
      kv_lens_ = b.empty({new_seqs}, DType::kI32);
      tables_ = b.empty({new_seqs, new_cap}, DType::kI32);
      ++generation_;
    }
  }
  block_size_ = kv.block_size;
  bound_blocks_ =
      with_tables ? std::min(capacity(),
                             std::max(kMinBoundBlocks, static_cast<int64_t>(std::bit_ceil(
                                                           static_cast<uint64_t>(table_blocks)))))
                  : capacity();
  rows_ = rows;
  seq_rows_.clear();
  positions_host_.clear();
  slots_host_.clear();
  kv_lens_host_.clear();
  tables_host_.assign(with_tables ? static_cast<size_t>(num_seqs * capacity()) : 0, 0);
  for (int64_t r = 0; r < num_seqs; ++r) {
    const Seq& s = seqs[r];
    for (int64_t i = 0; i < s.rows; ++i) {
      positions_host_.push_back(static_cast<int32_t>(s.start_pos + i));
      const int64_t pos = s.start_pos + i;  // its pool slot: block table[pos / block size]
      slots_host_.push_back(static_cast<int32_t>(
          s.block_table[pos / kv.block_size] * kv.block_size + pos % kv.block_size));
    }
    seq_rows_.push_back(s.rows);
    kv_lens_host_.push_back(static_cast<int32_t>(s.start_pos + s.rows));
    if (with_tables) {
      std::copy(s.block_table.begin(), s.block_table.end(), tables_host_.begin() + r * capacity());
    }
  }
  if (rows > 0) {
    b.copy_from_host(positions_.rows(0, rows), positions_host_.data());
    b.copy_from_host(slots_.rows(0, rows), slots_host_.data());
  }
  if (with_tables && num_seqs > 0) {
    b.copy_from_host(tables_.rows(0, num_seqs), tables_host_.data());
    b.copy_from_host(kv_lens_.rows(0, num_seqs), kv_lens_host_.data());
  }
}

bool PagedBatch::even() const {
  return std::all_of(seq_rows_.begin(), seq_rows_.end(),
                     [&](int64_t n) { return n == seq_rows_[0]; });
}

std::string PagedBatch::key(const KvPool& kv) const {
  // The buffers' addresses tell two models' batches apart; the generation, reallocations at an
  // address used before.
  // The pool's block count too: a graph bakes the pool's capacity in (the prologue and kv_write
  // drop rows whose slot lies past it), and the caching allocator gives a released pool's
  // addresses to the next pool of the same size class (13 to 16 blocks of stories260K: 16 KiB);
  // kv_pool_id names the addresses only (tests/e2e/capture_key_pool_test.cc).
  return fmt::format("{}:{}:{}:{}:{}:{}:{:x}:{}", static_cast<const void*>(positions_.data()),
                     static_cast<const void*>(tables_.defined() ? tables_.data() : nullptr),
                     generation_, fmt::join(seq_rows_, ","), capacity(), bound_blocks_,
                     kv_pool_id(kv), kv.k.empty() ? int64_t{0} : kv.k[0].dim(0));
}

}  // namespace bs
