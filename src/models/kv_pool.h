// Paged KV storage of one model: per layer, K and V pools of fixed-size blocks. Which blocks
// belong to which sequence is the engine's business (engine/kv_cache.h); a model only sees a
// sequence's block table.
#pragma once

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

}  // namespace bs
