#include "models/blocks/paged_kv.h"

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

}  // namespace bs
