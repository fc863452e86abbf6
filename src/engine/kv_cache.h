// Paged KV bookkeeping: a free list of fixed-size blocks shared by sequences, and each
// sequence's block table with append / truncate (rollback of rejected drafts).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace bs {

// The start of allocate()'s error, which tells a full KV pool from a device out of memory.
inline constexpr std::string_view kKvCacheFull = "KV cache is full";

class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks);
  // OutOfMemory naming the pool size when every block is taken (message starts kKvCacheFull).
  Result<int32_t> allocate();
  void release(int32_t block);
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_blocks() const { return num_blocks_; }

 private:
  int64_t num_blocks_;
  std::vector<int32_t> free_;    // LIFO free list
  std::vector<uint8_t> in_use_;  // [num_blocks] double-free / foreign-block guard
};

// One sequence's view of the cache: positions [0, length()) are valid.
class SequenceKv {
 public:
  SequenceKv(BlockAllocator& allocator, int64_t block_size);
  ~SequenceKv();
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;

  // Makes room for positions [0, capacity); allocates blocks as needed. On OutOfMemory the
  // sequence keeps what it had.
  Status reserve(int64_t capacity);
  // Marks positions [0, length) valid (length <= reserved capacity).
  void set_length(int64_t length);
  // Drops positions >= length and returns whole blocks no longer needed to the allocator.
  void truncate(int64_t length);
  void clear() { truncate(0); }

  int64_t length() const { return length_; }
  int64_t capacity() const { return static_cast<int64_t>(blocks_.size()) * block_size_; }
  std::span<const int32_t> block_table() const { return blocks_; }

 private:
  BlockAllocator& allocator_;
  int64_t block_size_;
  int64_t length_ = 0;
  std::vector<int32_t> blocks_;
};

}  // namespace bs
