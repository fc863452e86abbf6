#include "engine/kv_cache.h"

#include <algorithm>
#include <utility>

#include "core/check.h"

namespace bs {

BlockAllocator::BlockAllocator(int64_t num_blocks, bool prefix_caching)
    : num_blocks_(num_blocks),
      prefix_caching_(prefix_caching),
      refs_(static_cast<size_t>(num_blocks), 0),
      hash_of_(static_cast<size_t>(num_blocks), 0),
      idle_at_(static_cast<size_t>(num_blocks)) {
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

Result<int32_t> BlockAllocator::allocate() {
  int32_t b = 0;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!idle_.empty()) {  // evict the cached block released longest ago
    b = idle_.front();
    idle_.pop_front();
    index_.erase(hash_of_[b]);
    hash_of_[b] = 0;
  } else {
    return OutOfMemory("{}: all {} blocks are in use", kKvCacheFull, num_blocks_);
  }
  refs_[b] = 1;
  return b;
}

void BlockAllocator::release(int32_t block) {
  BS_CHECK(block >= 0 && block < num_blocks_ && refs_[block] > 0);
  if (--refs_[block] > 0) return;
  if (hash_of_[block] != 0) {
    idle_at_[block] = idle_.insert(idle_.end(), block);
  } else {
    free_.push_back(block);
  }
}

uint64_t BlockAllocator::chain(uint64_t parent, std::span<const int32_t> tokens) {
  // FNV-1a over the parent's hash and the tokens, then a final mix; collisions are caught by
  // comparing the content on a match.
  uint64_t h = 1469598103934665603ull ^ parent;
  h *= 1099511628211ull;
  for (int32_t t : tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 1099511628211ull;
  }
  h ^= h >> 31;
  h *= 0x9e3779b97f4a7c15ull;
  h ^= h >> 29;
  return h == 0 ? 1 : h;
}

std::vector<int32_t> BlockAllocator::match_prefix(std::span<const int32_t> tokens,
                                                  int64_t block_size, int64_t max_blocks) {
  std::vector<int32_t> out;
  if (!prefix_caching_) return out;
  uint64_t parent = 0;
  for (int64_t i = 0; i < max_blocks && (i + 1) * block_size <= std::ssize(tokens); ++i) {
    const auto content =
        tokens.subspan(static_cast<size_t>(i * block_size), static_cast<size_t>(block_size));
    const uint64_t h = chain(parent, content);
    const auto it = index_.find(h);
    if (it == index_.end() || it->second.parent != parent ||
        !std::equal(content.begin(), content.end(), it->second.tokens.begin(),
                    it->second.tokens.end())) {
      break;
    }
    const int32_t b = it->second.block;
    if (refs_[b]++ == 0) idle_.erase(idle_at_[b]);
    out.push_back(b);
    parent = h;
  }
  return out;
}

void BlockAllocator::cache_prefix(std::span<const int32_t> tokens, std::span<const int32_t> blocks,
                                  int64_t block_size) {
  if (!prefix_caching_) return;
  uint64_t parent = 0;
  for (int64_t i = 0; i < std::ssize(blocks) && (i + 1) * block_size <= std::ssize(tokens); ++i) {
    const auto content =
        tokens.subspan(static_cast<size_t>(i * block_size), static_cast<size_t>(block_size));
    const uint64_t h = chain(parent, content);
    const int32_t b = blocks[static_cast<size_t>(i)];
    BS_CHECK(b >= 0 && b < num_blocks_ && refs_[b] > 0);
    const auto it = index_.find(h);
    if (it == index_.end()) {
      if (hash_of_[b] != 0)
        break;  // cached under another chain (cannot happen without a collision)
      index_.emplace(h, Cached{.parent = parent,
                               .tokens = std::vector<int32_t>(content.begin(), content.end()),
                               .block = b});
      hash_of_[b] = h;
    } else if (it->second.parent != parent ||
               !std::equal(content.begin(), content.end(), it->second.tokens.begin(),
                           it->second.tokens.end())) {
      break;  // a hash collision: index nothing after it under a chain that is not this one
    }
    parent = h;
  }
}

SequenceKv::SequenceKv(BlockAllocator& allocator, int64_t block_size)
    : allocator_(allocator), block_size_(block_size) {}

SequenceKv::~SequenceKv() { truncate(0); }

int64_t take_cached_prefix(SequenceKv& kv, std::span<const int32_t> prompt) {
  BlockAllocator& a = kv.allocator();
  const int64_t block = kv.block_size();
  if (!a.prefix_caching() || prompt.empty()) return 0;
  std::vector<int32_t> blocks = a.match_prefix(prompt, block, (std::ssize(prompt) - 1) / block);
  const int64_t n = std::ssize(blocks) * block;
  kv.adopt(std::move(blocks), n);
  return n;
}

void SequenceKv::adopt(std::vector<int32_t> blocks, int64_t length) {
  BS_CHECK(blocks_.empty() && length_ == 0 &&
           length <= static_cast<int64_t>(blocks.size()) * block_size_);
  blocks_ = std::move(blocks);
  length_ = length;
}

Status SequenceKv::reserve(int64_t capacity_needed) {
  const size_t old = blocks_.size();
  while (capacity() < capacity_needed) {
    auto block = allocator_.allocate();
    if (!block.ok()) {
      while (blocks_.size() > old) {
        allocator_.release(blocks_.back());
        blocks_.pop_back();
      }
      return block.status();
    }
    blocks_.push_back(*block);
  }
  return Status::Ok();
}

void SequenceKv::set_length(int64_t length) {
  BS_CHECK(length >= 0 && length <= capacity());
  length_ = length;
}

void SequenceKv::truncate(int64_t length) {
  BS_CHECK(length >= 0);
  if (length < length_) length_ = length;
  const int64_t keep = (length + block_size_ - 1) / block_size_;
  while (static_cast<int64_t>(blocks_.size()) > keep) {
    allocator_.release(blocks_.back());
    blocks_.pop_back();
  }
}

}  // namespace bs
