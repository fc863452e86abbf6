// Model block: the paged KV of one model. make_kv_pool allocates a model's pools; PagedBatch
// stages the index tensors of one paged forward over several sequences (positions, KV slots,
// block tables, KV lengths) once per step, with the part of the capture key they determine.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "models/drafter.h"
#include "models/kv_pool.h"

namespace bs {

// Per layer, K and V pools [num_blocks, block_size, kv_heads, head_dim] (the backend's dtype).
KvPool make_kv_pool(Backend& backend, int64_t num_layers, int64_t kv_heads, int64_t head_dim,
                    int64_t num_blocks);

// OK when `table` covers positions [0, end) with block ids of the pool; errors begin with `what`.
Status check_block_table(const KvPool& kv, std::span<const int32_t> table, int64_t end,
                         std::string_view what);

// A drafter's propose request: 1 <= num_drafts <= max_drafts, anchor id in [0, vocab),
// anchor_pos >= 0, a block table covering [0, anchor_pos + block_rows); errors begin with `what`.
Status check_propose(const KvPool& kv, const ProposeRequest& req, int64_t max_drafts, int64_t vocab,
                     int64_t block_rows, std::string_view what);

// The index tensors of one paged forward over several sequences whose rows lie back to back,
// staged once per step (one upload each) into buffers that grow by doubling:
//   positions, slots  I32 [rows]           row i of sequence r: position start_pos + i, its slot
//   tables            I32 [seqs, capacity] each sequence's block table, zero-padded
//   kv_lens           I32 [seqs]           start_pos + rows: the cached length the rows attend to
// Every model stages through it (target forward, drafter observe and propose), so none computes
// the slot formula or sizes table buffers itself.
class PagedBatch {
 public:
  struct Seq {
    std::span<const int32_t> block_table;  // covers positions [0, start_pos + rows)
    int64_t start_pos = 0;
    int64_t rows = 0;
  };

  // Stages `seqs`; without `with_tables` only positions and slots (context K/V writes).
  void stage(Backend& b, const KvPool& kv, std::span<const Seq> seqs, bool with_tables = true);

  int64_t seqs() const { return static_cast<int64_t>(seq_rows_.size()); }
  Tensor positions() const { return positions_.rows(0, rows_); }
  Tensor slots() const { return slots_.rows(0, rows_); }
  Tensor tables() const { return tables_.rows(0, seqs()); }  // [seqs, capacity]
  Tensor table(int64_t r) const { return tables_.rows(r, 1).view({capacity()}); }
  Tensor kv_lens() const { return kv_lens_.rows(0, seqs()); }
  int64_t capacity() const { return tables_.defined() ? tables_.dim(1) : 0; }
  // Bounds the attention launch (the lengths themselves are on the device): the staged tables'
  // longest coverage rounded up to a power of two of blocks (at least kMinBoundBlocks), at most
  // the capacity. Not the capacity itself: the tables only grow, so one long sequence (or the
  // server's worst-case plan at the end of the window) would leave every later step launching
  // blocks for keys no sequence has. A power of two keeps the captures of a growing sequence to
  // log2(length); the output does not depend on the bound (paged_attention's row invariance).
  int64_t max_kv_len() const { return bound_blocks_ * block_size_; }
  static constexpr int64_t kMinBoundBlocks = 64;
  // Rows of each sequence, and whether they are all equal (one batched attention call).
  std::span<const int64_t> seq_rows() const { return seq_rows_; }
  bool even() const;
  // What the staged buffers contribute to a capture key: their addresses and generation (bumped
  // on every reallocation), the rows of each sequence, the table capacity, the launch bound and
  // the pool.
  std::string key(const KvPool& kv) const;

 private:
  int64_t rows_ = 0, block_size_ = 0, generation_ = 0, bound_blocks_ = 0;
  std::vector<int64_t> seq_rows_;
  Tensor positions_, slots_, tables_, kv_lens_;
  std::vector<int32_t> positions_host_, slots_host_, tables_host_, kv_lens_host_;
};

}  // namespace bs
