// Model block: the paged KV of one model. make_kv_pool allocates a model's pools; PagedBatch
// stages the index tensors of one paged forward over several sequences (positions, KV slots,
// block tables, KV lengths) once per step, with the part of the capture key they determine.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "models/kv_pool.h"

namespace bs {

// Per layer, K and V pools [num_blocks, block_size, kv_heads, head_dim] (the backend's dtype).
KvPool make_kv_pool(Backend& backend, int64_t num_layers, int64_t kv_heads, int64_t head_dim,
                    int64_t num_blocks);

// The pool slot of position `pos` of a sequence with block table `table`.
inline int32_t kv_slot(const KvPool& kv, std::span<const int32_t> table, int64_t pos) {
  return static_cast<int32_t>(table[pos / kv.block_size] * kv.block_size + pos % kv.block_size);
}

}  // namespace bs
