// Paged KV bookkeeping: a free list of fixed-size blocks shared by sequences, and each
// sequence's block table with append / truncate (rollback of rejected drafts).
//
// Prefix caching (vLLM's automatic prefix caching, optional): a block full of a prompt's tokens
// is indexed by its content and everything before it (a hash chain, the tokens compared on a
// match). A later sequence whose prompt starts with the same full blocks takes them (one more
// reference each) instead of computing them again; a block nobody references stays cached until
// allocate() needs it (least recently released first). Cached blocks are never written again: a
// sequence only writes positions at or after its length, and its length starts after the blocks
// it took.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace bs {

// The start of allocate()'s error, which tells a full KV pool from a device out of memory.
inline constexpr std::string_view kKvCacheFull = "KV cache is full";

class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks, bool prefix_caching = false);
  // A block with one reference: a free one, else (prefix caching) the cached block released
  // longest ago, dropped from the cache. OutOfMemory naming the pool size when every block is
  // referenced (message starts kKvCacheFull).
  Result<int32_t> allocate();
  // Drops one reference; a block nobody references is free again, or stays cached.
  void release(int32_t block);
  // Blocks allocate() can still hand out: the free ones and the cached ones nobody references.
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size() + idle_.size()); }
  int64_t num_blocks() const { return num_blocks_; }
  bool prefix_caching() const { return prefix_caching_; }

  // ---- Prefix caching (no-ops without it) ----
  // The cached blocks that hold tokens[0, n * block_size) for the largest n <= max_blocks, each
  // taken (one more reference): block i holds positions [i * block_size, (i + 1) * block_size).
  std::vector<int32_t> match_prefix(std::span<const int32_t> tokens, int64_t block_size,
                                    int64_t max_blocks);
  // Caches blocks[i] as holding tokens [i * block_size, (i + 1) * block_size) for every full block
  // of `tokens` that `blocks` covers (their K/V written, or queued to be before any later use).
  // A content already cached in another block keeps that one.
  void cache_prefix(std::span<const int32_t> tokens, std::span<const int32_t> blocks,
                    int64_t block_size);
  int64_t cached_blocks() const { return static_cast<int64_t>(index_.size()); }

 private:
  struct Cached {
    uint64_t parent = 0;          // the chain hash of the blocks before it
    std::vector<int32_t> tokens;  // its content
    int32_t block = 0;
  };
  // The chain hash of a block of `tokens` after blocks hashing to `parent` (never 0).
  static uint64_t chain(uint64_t parent, std::span<const int32_t> tokens);

  int64_t num_blocks_;
  bool prefix_caching_;
  std::vector<int32_t> free_;  // LIFO free list
  std::vector<int32_t> refs_;  // [num_blocks] references; guards double frees and foreign blocks
  std::unordered_map<uint64_t, Cached> index_;  // chain hash -> its block
  std::vector<uint64_t> hash_of_;               // [num_blocks] a cached block's key, 0 if none
  std::list<int32_t> idle_;  // cached blocks without references, least recently released first
  std::vector<std::list<int32_t>::iterator> idle_at_;  // [num_blocks] a block's place in idle_
};

// One sequence's view of the cache: positions [0, length()) are valid.
class SequenceKv {
 public:
  SequenceKv(BlockAllocator& allocator, int64_t block_size);
  ~SequenceKv();
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;

  // Starts an empty sequence on `blocks` (taken from the allocator's prefix cache, one
  // reference each) holding positions [0, length).
  void adopt(std::vector<int32_t> blocks, int64_t length);
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
  BlockAllocator& allocator() const { return allocator_; }
  int64_t block_size() const { return block_size_; }

 private:
  BlockAllocator& allocator_;
  int64_t block_size_;
  int64_t length_ = 0;
  std::vector<int32_t> blocks_;
};

// Prefix caching: starts the empty `kv` on the cached blocks that hold the longest run of whole
// blocks of `prompt` short of its last token (whose row has to be computed for its logits);
// returns how many tokens they hold (0 without prefix caching or a match).
int64_t take_cached_prefix(SequenceKv& kv, std::span<const int32_t> prompt);

}  // namespace bs
