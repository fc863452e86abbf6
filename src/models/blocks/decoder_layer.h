// Model block: the pre-norm decoder layer of the Llama / Qwen2 / Qwen3 families, the layer of
// every target and of every DFlash-family drafter (DFlash, DSpark, DFlash2):
//   x += o_proj(attention(rope(q_norm(q)), rope(k_norm(k)), v))   q, k, v = qkv(input_norm(x))
//   x += down(silu(gate(y)) * up(y))                               y = post_norm(x)
// with K/V written into the paged pool and attention over each sequence's cache.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "backend/backend.h"
#include "io/hf_config.h"
#include "models/blocks/paged_kv.h"
#include "models/blocks/weights.h"
#include "models/kv_pool.h"
#include "models/rope.h"

namespace bs {

// Projections are stored fused: q/k/v rows stacked in one matrix and gate/up rows in another, so
// each takes one GEMM (one weight stream instead of three or two).
struct DecoderLayer {
  Tensor input_norm, post_norm;         // [hidden]
  DenseWeight w_qkv;                    // [(heads + 2 kv) * hd, hidden]
  DenseWeight wo;                       // [hidden, heads * hd]
  DenseWeight w_gate_up;                // [2 * inter, hidden]: gate rows, then up rows
  DenseWeight w_down;                   // [hidden, inter]
  Tensor b_qkv, bo, b_gate_up, b_down;  // biases or undefined
  Tensor q_norm, k_norm;                // [hd] (qk-norm families) or undefined
  AttentionMask mask;                   // causal / sliding window of this layer
};

struct DecoderLayerOptions {
  bool qk_norm = false;
  bool attention_bias = false;  // q/k/v biases required; o_proj's optional
  bool mlp_bias = false;
};

// Loads layer `index` (tensors "layers.{index}.*", HF names) of a model shaped like `c`.
Result<DecoderLayer> load_decoder_layer(WeightLoader& w, const io::TransformerConfig& c,
                                        int64_t index, DecoderLayerOptions options,
                                        AttentionMask mask);

// Activations of one pass of a decoder layer stack over `rows` rows.
struct LayerActivations {
  Tensor x, xn;    // [rows, hidden]: residual stream, normed
  Tensor qkv;      // [rows, (heads + 2 kv_heads) * hd]
  Tensor q, attn;  // [rows, heads, hd]
  Tensor gate_up;  // [rows, 2 * inter]
  Tensor act;      // [rows, inter]

  void allocate_layers(Backend& backend, const io::TransformerConfig& c, int64_t rows);
  // The first n rows of every buffer.
  LayerActivations first_rows(int64_t n) const;
};

// The paged attention inputs of one forward over S sequences whose rows lie back to back
// (PagedBatch stages them), plus the RoPE tables and the layer stack's constants.
struct PagedAttention {
  Tensor positions, slots;  // I32 [rows]
  Tensor tables;            // I32 [S, capacity]
  Tensor kv_lens;           // I32 [S]: each sequence's cached length after this forward
  int64_t max_kv_len = 0;   // capacity * block_size (bounds the launch)
  // Rows of each sequence when they differ (then one batched attention call per run of
  // consecutive sequences with equal rows); empty when every sequence has equally many rows (one
  // batched call).
  std::span<const int64_t> uneven_rows;
  // One fused prologue + attention call where the backend has one (causal target rows).
  bool fused = false;
  Rope rope;
  float eps = 1e-6f;   // rms_norm_eps
  float scale = 1.0f;  // 1 / sqrt(hd)

  // The inputs `batch` staged, for a model with this RoPE, rms_norm_eps and head_dim.
  static PagedAttention of(const PagedBatch& batch, const Rope& rope, double eps, int64_t head_dim,
                           bool fused = false);
};

// DFlash2's block convolutions around both sublayers (DFlashModules::conv_prepare / finish):
// prepare(layer, sublayer, y, x) writes the sublayer input y from the normed x; finish(layer,
// sublayer, residual, out, xn, norm_w, eps) adds the convolved sublayer output to the residual
// and, with norm_w defined, writes the norm that follows, xn = rms_norm(residual) · norm_w (one
// fused op on the GPU). `in` / `out` [rows, hidden].
struct SublayerConvs {
  std::function<void(int64_t layer, int sublayer, const Tensor& y, const Tensor& x)> prepare;
  std::function<void(int64_t layer, int sublayer, const Tensor& residual, const Tensor& out,
                     const Tensor& xn, const Tensor& norm_w, float eps)>
      finish;
  Tensor in, out;
  // Set by the layer loop before each layer: the next layer's input norm (undefined after the
  // last layer), which this layer's MLP finish writes, and whether this layer's input norm was
  // written that way by the layer before (then it is not computed again).
  Tensor next_input_norm;
  bool input_normed = false;
};

// y = rms_norm(x; norm_w, eps) · Wᵀ (+ bias): Backend::norm_matmul (or norm_matmul_fp8 for FP8
// weights), the normalized rows written to xn only where the backend does not fuse the pair.
void norm_linear(Backend& b, const Tensor& y, const Tensor& xn, const Tensor& x,
                 const Tensor& norm_w, float eps, const DenseWeight& w, const Tensor& bias = {});

// Layer `index` (weights L) over the rows of `a`, K/V into kv.k[index] / kv.v[index].
void decoder_layer(Backend& b, int64_t index, const DecoderLayer& L, const LayerActivations& a,
                   const PagedAttention& p, KvPool& kv, const SublayerConvs* convs = nullptr);

}  // namespace bs
