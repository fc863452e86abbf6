// Paged KV storage of one model: per layer, K and V pools of fixed-size blocks. Which blocks
// belong to which sequence is the engine's business (engine/kv_cache.h); a model only sees a
// sequence's block table.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/tensor.h"

namespace bs {

inline constexpr int64_t kKvBlockSize = 16;

struct KvPool {
  int64_t num_blocks = 0;
  int64_t block_size = kKvBlockSize;
  std::vector<Tensor> k;  // per layer [num_blocks, block_size, kv_heads, head_dim]
  std::vector<Tensor> v;  // per layer [num_blocks, block_size, kv_heads, head_dim]
};

// Bytes of a pool's K and V tensors.
inline int64_t kv_pool_bytes(const KvPool& kv) {
  int64_t bytes = 0;
  for (const Tensor& t : kv.k) bytes += static_cast<int64_t>(t.nbytes());
  for (const Tensor& t : kv.v) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

// Identifies a pool's tensors (for the keys of captured op sequences, Backend::run_captured).
inline uintptr_t kv_pool_id(const KvPool& kv) {
  uintptr_t id = 0;
  for (size_t i = 0; i < kv.k.size(); ++i) {
    id = id * 1000003u + reinterpret_cast<uintptr_t>(kv.k[i].data());
    id = id * 1000003u + reinterpret_cast<uintptr_t>(kv.v[i].data());
  }
  return id;
}

}  // namespace bs
