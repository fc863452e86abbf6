// Model block: the drafter context K/V path ("KV injection") of DFlash, DSpark, DFlash2 and
// FlashMap. Tapped target hidden states of committed positions become extra keys and values of
// every drafter layer:
//   ctx = hidden_norm(taps · fcᵀ)                        [n, H]
//   [K_l | V_l] = ctx · kv_fusedᵀ   (one GEMM for every layer, rows K0 V0 K1 V1 ...)
//   K_l = rope(k_norm_l(K_l)) at the rows' positions;    K_l, V_l written at the rows' slots
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "models/drafter.h"
#include "models/kv_pool.h"
#include "models/rope.h"

namespace bs {

struct ContextKv {
  Tensor fc;                    // [H, n_taps * target hidden]
  Tensor hidden_norm;           // [H]
  Tensor kv_fused;              // [L * 2 * kv_dim, H]: per layer its k_proj rows, then v_proj rows
  std::vector<Tensor> k_norms;  // per layer [hd]
  Rope rope;
  float eps = 1e-6f;    // hidden_norm
  float k_eps = 1e-6f;  // k_norm
  int64_t kv_heads = 0, head_dim = 0;

  int64_t layers() const { return static_cast<int64_t>(k_norms.size()); }
  int64_t kv_dim() const { return kv_heads * head_dim; }
};

// Buffers of the path for up to `rows` rows; `generation` changes whenever they are reallocated
// (captured op sequences hold their addresses).
struct ContextKvScratch {
  int64_t rows = 0, generation = 0;
  Tensor ctx;    // [rows, H]
  Tensor fused;  // [rows, L * 2 * kv_dim]
  Tensor k, v;   // [rows, kv_dim]

  void ensure(Backend& b, const ContextKv& w, int64_t rows);
};

// ctx = hidden_norm(taps · fcᵀ) of n = taps.dim(0) rows, then write_context_kv. positions and
// slots (I32 [n], a PagedBatch's) say where each row goes.
void context_kv(Backend& b, const ContextKv& w, const Tensor& taps, const Tensor& positions,
                const Tensor& slots, ContextKvScratch& s, KvPool& kv);

// The taps of several observe requests back to back (request i's rows after request i - 1's; a
// request without rows adds none) in `buffer`, grown to at least their rows [>= 64, width];
// returns those rows. A batched observe's context_kv input.
Tensor stack_taps(Backend& b, std::span<const ObserveRequest> reqs, int64_t width, Tensor* buffer);

// K/V of every layer for context rows ctx [n, H] (already projected).
void write_context_kv(Backend& b, const ContextKv& w, const Tensor& ctx, const Tensor& positions,
                      const Tensor& slots, ContextKvScratch& s, KvPool& kv);

}  // namespace bs
