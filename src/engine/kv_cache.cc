#include "engine/kv_cache.h"

#include "core/check.h"

namespace bs {

BlockAllocator::BlockAllocator(int64_t num_blocks)
    : num_blocks_(num_blocks), in_use_(static_cast<size_t>(num_blocks), 0) {
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

Result<int32_t> BlockAllocator::allocate() {
  if (free_.empty()) {
    return OutOfMemory("{}: all {} blocks are in use", kKvCacheFull, num_blocks_);
  }
  const int32_t b = free_.back();
  free_.pop_back();
  in_use_[b] = 1;
  return b;
}

void BlockAllocator::release(int32_t block) {
  BS_CHECK(block >= 0 && block < num_blocks_ && in_use_[block]);
  in_use_[block] = 0;
  free_.push_back(block);
}

SequenceKv::SequenceKv(BlockAllocator& allocator, int64_t block_size)
    : allocator_(allocator), block_size_(block_size) {}

SequenceKv::~SequenceKv() { truncate(0); }

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
