#include "models/blocks/context_kv.h"

#include <algorithm>

namespace bs {

void ContextKvScratch::ensure(Backend& b, const ContextKv& w, int64_t n) {
  if (n <= rows) return;
  const int64_t r = std::max<int64_t>(n, 64), kv_dim = w.kv_dim();
  rows = 0;  // until every buffer exists (an AllocationError leaves a consistent state)
  ++generation;
  ctx = b.empty({r, w.hidden_norm.dim(0)});
  fused = b.empty({r, w.layers() * 2 * kv_dim});
  k = b.empty({r, kv_dim});
  v = b.empty({r, kv_dim});
  rows = r;
}

Tensor stack_taps(Backend& b, std::span<const ObserveRequest> reqs, int64_t width, Tensor* buffer) {
  int64_t n = 0;
  for (const ObserveRequest& req : reqs) n += req.taps.dim(0);
  if (!buffer->defined() || buffer->dim(0) < n)
    *buffer = b.empty({std::max<int64_t>(n, 64), width});
  int64_t row = 0;
  for (const ObserveRequest& req : reqs) {
    const int64_t rows = req.taps.dim(0);
    if (rows > 0) b.copy(buffer->rows(row, rows), req.taps);
    row += rows;
  }
  return buffer->rows(0, n);
}

void context_kv(Backend& b, const ContextKv& w, const Tensor& taps, const Tensor& positions,
                const Tensor& slots, ContextKvScratch& s, KvPool& kv) {
  const int64_t n = taps.dim(0);
  const Tensor ctx = s.ctx.rows(0, n);
  b.matmul(ctx, taps, w.fc);
  b.rms_norm(ctx, ctx, w.hidden_norm, w.eps);
  write_context_kv(b, w, ctx, positions, slots, s, kv);
}

void write_context_kv(Backend& b, const ContextKv& w, const Tensor& ctx, const Tensor& positions,
                      const Tensor& slots, ContextKvScratch& s, KvPool& kv) {
  const int64_t n = ctx.dim(0), kv_dim = w.kv_dim();
  const Tensor fused = s.fused.rows(0, n), k = s.k.rows(0, n), v = s.v.rows(0, n);
  b.matmul(fused, ctx, w.kv_fused);  // [n, L * 2 * kv_dim]: K0 V0 K1 V1 ...
  const Tensor k_heads = k.view({n, w.kv_heads, w.head_dim});
  for (int64_t l = 0; l < w.layers(); ++l) {
    b.slice_columns(k, fused, l * 2 * kv_dim);
    b.slice_columns(v, fused, l * 2 * kv_dim + kv_dim);
    b.rms_norm(k, k, w.k_norms[l], w.k_eps);
    b.rope(k_heads, positions, w.rope.inv_freq, w.rope.attention_scaling);
    b.kv_write(kv.k[l], kv.v[l], k_heads, v.view({n, w.kv_heads, w.head_dim}), slots);
  }
}

}  // namespace bs
