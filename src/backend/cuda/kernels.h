// CUDA kernels of the CUDA backend, as plain launchers over raw device pointers and sizes (no
// Tensor, no Backend), so that each can be tested or timed alone. Every launcher enqueues on
// `stream` and returns the launch error (cudaSuccess when queued).
//
// Element types: activations are usually BF16, 1-D weights (norms, biases, inv_freq) F32; the
// elementwise kernels accept any float type per operand (In / Out carry it) and compute in fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "backend/token_rule.h"

namespace bs::cuda {

enum class Elem : int { kF32 = 0, kF16 = 1, kBF16 = 2, kF8E4M3 = 3 };

int elem_size(Elem t);

// A typed device pointer (read-only / writable).
struct In {
  const void* p = nullptr;
  Elem t = Elem::kBF16;
};
struct Out {
  void* p = nullptr;
  Elem t = Elem::kBF16;
};

// dst[i] = src[i] with type conversion (fp8/f16/bf16/f32 -> f32/bf16/f16).
cudaError_t convert(Out dst, In src, int64_t n, cudaStream_t s);
// dst[i] = value (in dst's type) for i < n.
cudaError_t fill(Out dst, int64_t n, float value, cudaStream_t s);

// ---- Elementwise ----
cudaError_t add(Out y, In a, In b, int64_t n, cudaStream_t s);
cudaError_t mul(Out y, In a, In b, int64_t n, cudaStream_t s);
cudaError_t axpby(Out y, float a, In x, float b, In z, int64_t n, cudaStream_t s);
cudaError_t silu_mul(Out y, In gate, In up, int64_t n, cudaStream_t s);
cudaError_t silu(Out y, In x, int64_t n, cudaStream_t s);
cudaError_t gelu(Out y, In x, int64_t n, bool tanh_approx, cudaStream_t s);
// y[r, i] += gate[i] * x[r, i].
cudaError_t gated_add(Out y, In x, In gate, int64_t rows, int64_t d, cudaStream_t s);
// y[r, i] = x[r, i] * (1 + scale[o + i]) + shift[o + i], o = per_row ? r * d : 0.
cudaError_t modulate(Out y, In x, In shift, In scale, int64_t rows, int64_t d, bool per_row,
                     cudaStream_t s);
// y[r, :] += bias[:] (matmul bias when the GEMM epilogue cannot take it).
cudaError_t add_bias(Out y, In bias, int64_t rows, int64_t m, cudaStream_t s);

// ---- Normalisation (one block per row) ----
cudaError_t rms_norm(Out y, In x, In w, int64_t rows, int64_t d, float eps, cudaStream_t s);
// w.p / b.p may be null (no affine part).
cudaError_t layer_norm(Out y, In x, In w, In b, int64_t rows, int64_t d, float eps, cudaStream_t s);
// y[r, i] = base[i] + gate / sqrt(sum_e w[e] z[r, e]^2 + eps) * x[r, i].
cudaError_t noise_combine(Out y, In base, In x, In z, In w, int64_t rows, int64_t d, int64_t e,
                          float gate, float eps, cudaStream_t s);
// y[r, :] = softmax(x[r, :] * scale), fp32 inside.
cudaError_t softmax(Out y, In x, int64_t rows, int64_t v, float scale, cudaStream_t s);
// out[r] = first index of the maximum of x[r, :]. Long rows split into 4096-element chunks
// over many blocks when `scratch` holds rows * chunks keys; one block per row otherwise.
cudaError_t argmax(int32_t* out, In x, int64_t rows, int64_t v, cudaStream_t s,
                   uint64_t* scratch = nullptr, int64_t scratch_keys = 0);

// ---- Indexing ----
// y[i, :] = table[ids[i], :] (rows with an out-of-range id are zero).
cudaError_t embedding(Out y, const int32_t* ids, In table, int64_t n, int64_t d, int64_t vocab,
                      cudaStream_t s);
// dst[r, off + c] = src[r, c] for c < d; dst rows have dst_cols elements (used both ways:
// copy_columns and, with swapped roles, slice_columns via src_cols / src_off).
cudaError_t copy_block(Out dst, int64_t dst_cols, int64_t dst_off, In src, int64_t src_cols,
                       int64_t src_off, int64_t rows, int64_t d, cudaStream_t s);
// ---- DSpark / DFlash2 (Backend::topk, scale_softcap, dynamic_conv) ----
// values[r, :k], ids[r, :k] = the k largest entries of x[r, :v], descending, ties to the lower
// index. One block per row, k passes over the row.
cudaError_t topk(float* values, int32_t* ids, In x, int64_t rows, int64_t v, int64_t k,
                 cudaStream_t s);
// y = cap > 0 ? cap * tanh(multiplier * x / cap) : multiplier * x.
cudaError_t scale_softcap(Out y, In x, int64_t n, float multiplier, float cap, cudaStream_t s);
// y[i, c] (=|+=) sum_{t < taps, t <= i % block_rows} (base[t, c] + dyn[i, which, t, c / group]) *
// x[i - t, c]; x, y [n, h], dyn [n, 2, taps, h / group], base [taps, h]. With `fast` (the
// default), the common case (every operand BF16, taps 2, group and h multiples of 8, 16-byte
// aligned rows, n * h < 2^31) runs dynamic_conv_bf16x8_kernel: 8 channels a thread, the same bits
// as the generic kernel (which `fast` = false forces, for tests and A/B).
cudaError_t dynamic_conv(Out y, In x, In dyn, int64_t which, In base, int64_t n, int64_t h,
                         int64_t taps, int64_t group, int64_t block_rows, bool accumulate,
                         cudaStream_t s, bool fast = true);
// DFlash2's fused convolutions (BF16 operands; taps 2; group and h multiples of 8, h / 8 a
// multiple of 32 and <= 1024; the listed pointers 16-byte aligned): whether they apply.
bool dynamic_conv_fused_supported(int64_t n, int64_t h, int64_t taps, int64_t group,
                                  std::initializer_list<const void*> rows);
// The prepare convolution from the projection's split-K partials part [splits, n, width] (F32;
// width 4 * groups: the whole projection, 2 * groups: its prepare half): dyn [n, 2, 2, groups]
// (its first `width` columns) = the partials summed in split order, rounded to BF16 (the finish
// half for the finish convolution); y = dynamic_conv(x, dyn, which 0, base [2, h]).
cudaError_t dynamic_conv_partials(__nv_bfloat16* y, __nv_bfloat16* dyn, const float* part,
                                  int64_t splits, int64_t width, const __nv_bfloat16* x,
                                  const __nv_bfloat16* base, int64_t n, int64_t h, int64_t group,
                                  int64_t block_rows, cudaStream_t s);
// The finish convolution and the next RMSNorm: residual += dynamic_conv(out, dyn, which 1, base);
// xn = rms_norm(residual) * w (F32 [h]); the bits of the two ops apart.
cudaError_t dynamic_conv_rms_norm(__nv_bfloat16* xn, __nv_bfloat16* residual,
                                  const __nv_bfloat16* out, const __nv_bfloat16* dyn,
                                  const __nv_bfloat16* base, const float* w, int64_t n, int64_t h,
                                  int64_t group, int64_t block_rows, float eps, cudaStream_t s);
// dst[r, :] = value; dst[r, ids[j]] = src[r, j] (two passes: fill, then the picked columns).
cudaError_t scatter_columns(Out dst, In src, const int32_t* ids, int64_t rows, int64_t v,
                            int64_t vs, float value, cudaStream_t s);
// Counter-based normals (backend.h seeded_normal).
cudaError_t seeded_normal(Out out, const int32_t* positions, int64_t n, int64_t d, uint64_t seed,
                          uint32_t stream_id, float scale, cudaStream_t s);

// ---- Speculative decoding ----
// Backend::greedy_accept for `seqs` verify blocks (rows [offsets[s], offsets[s + 1]) of tokens
// and target_ids): out[s, :] (width >= every k + 2) = [a, target_ids[a], d_1 .. d_k, 0 ...].
// One warp per block.
cudaError_t greedy_accept(int32_t* out, const int32_t* tokens, const int32_t* target_ids,
                          const int32_t* offsets, int64_t seqs, int64_t width, cudaStream_t s);

// ---- Positions and attention ----
// In-place neox RoPE on x[n, heads, hd]: angle = float(pos) * inv_freq[i] in fp32.
cudaError_t rope(Out x, const int32_t* positions, In inv_freq, int64_t n, int64_t heads, int64_t hd,
                 float attention_scaling, cudaStream_t s);

// ---- Faults (Backend's BackendFault) ----
// A KV slot outside [0, capacity) is an engine bug the kernels cannot return: they skip the row
// and report the first such slot here, and the backend turns it into a BackendFault at its next
// read-back. The record lives in host-mapped pinned memory, so the host reads it after the
// read-back's synchronisation with no copy and the fault-free path costs one branch.
enum class FaultOp : int32_t {
  kNone = 0,
  kKvWrite = 1,
  kAttentionPrologue = 2,
  kPrologueAttention = 3
};
struct FaultRecord {
  int32_t op = 0;  // FaultOp; written last, kNone until a fault
  int32_t slot = 0;
  int64_t capacity = 0;
};
// What a kernel gets: the first thread to move *claim (device memory) from 0 to 1 writes *record
// (the device address of the host-mapped record). A null claim reports nothing.
struct FaultSink {
  int* claim = nullptr;
  FaultRecord* record = nullptr;
};

// pool[slots[i] * row + c] = src[i * row + c] for k and v; a row whose slot is outside
// [0, capacity) is skipped and reported to `fault` (FaultOp::kKvWrite).
cudaError_t kv_write(Out k_pool, Out v_pool, In k, In v, const int32_t* slots, int64_t n,
                     int64_t row, int64_t capacity, FaultSink fault, cudaStream_t s);

struct AttentionArgs {
  void* out = nullptr;      // [num_seqs * n, heads, hd]
  const void* q = nullptr;  // [num_seqs * n, heads, hd]
  const void* k = nullptr;  // paged pool [blocks, bs, kv_heads, hd] or dense [kv_len, ...]
  const void* v = nullptr;
  Elem t = Elem::kBF16;                  // element type of out, q, k and v (all the same)
  const int32_t* block_table = nullptr;  // [num_seqs, table_stride]; null: dense k / v
  int64_t block_size = 16;
  int64_t n = 0, heads = 0, kv_heads = 0, hd = 0, kv_len = 0;  // n: query rows per sequence
  // Sequences of one launch (split-KV kernels only; the row kernel takes 1): sequence s has the
  // query / output rows [s * n, (s + 1) * n), the block table block_table + s * table_stride
  // and, with a device length, the length kv_len_dev[s].
  int64_t num_seqs = 1, table_stride = 0;
  bool causal = true;
  int64_t window = 0;
  float scale = 1.0f;
};
// One block per (query row, head), a fixed number of warps; online softmax in fp32 over the
// visible keys. hd <= 256, num_seqs == 1 (a batch of sequences comes with device lengths, which
// only the split-KV kernels read). A row's result does not depend on the other rows of the launch.
cudaError_t attention(const AttentionArgs& a, cudaStream_t s);

// Split-KV paged attention (paged_attention.cu) for BF16 q / out / pools with a block table and
// hd % 8 == 0, hd <= 256: one block per (64-key chunk, kv head, sequence, tile of 16 query
// vectors), then a combine pass; all a.num_seqs sequences in these two launches. a.kv_len
// bounds the launch; when kv_len_dev ([num_seqs]) is set the kernels read each sequence's
// actual length there (<= a.kv_len), else every sequence has a.kv_len. `workspace` holds
// split_attention_workspace(num_seqs * n, ...) bytes. A query row's result does not
// depend on n, on a.kv_len, on the other rows or on the other sequences of the launch.
bool split_attention_supported(const AttentionArgs& a);
size_t split_attention_workspace(int64_t rows, int64_t heads, int64_t hd, int64_t max_kv_len);
cudaError_t split_attention(const AttentionArgs& a, const int32_t* kv_len_dev, void* workspace,
                            cudaStream_t s);
// The split pass's kernel, for every later split_attention / prologue_attention launch of the
// process: version 1, a block per 64-key chunk; version 2, a block per run of
// consecutive chunks of its (sequence, kv head, tile), the next chunk's K / V loads in flight
// while the current one is computed: `chunks_per_block` (1 to 8) chunks per block, or with 0 up
// to 4 chosen from the launch size and the occupancy. Both give every row the same bits.
// Version 3: v1's blocks and arithmetic with cp.async K / V loads, 16-byte shared-memory reads and
// tile-sized shared memory (head dims 64 / 128 / 256; others run v1). Version 4 (the default):
// tensor cores (mma.sync scores and P . V, BF16 P), a block per 16 query vectors (16 / 32 / 64,
// set_split_mma_tile), head dims 64 / 128 (others run v3); its rounding differs from v1-v3, its
// rows are as invariant.
void set_split_kernel(int version, int chunks_per_block = 0);
constexpr int kDefaultSplitVersion = 4;  // the version a process starts with
// Queries per thread of v1-v3's split pass (2, 4 or 8; a block's tile is twice that) for every
// later launch; 0 (the default) picks by the launch's query vectors per kv head (<= 4: 2, <= 16:
// 4, more: 8). Only how the work is spread changes: every query's arithmetic is the same for any
// choice, so the bits are too (a measurement switch, BLOCKSPEC_ATTN_QPT).
void set_split_qpt(int queries_per_thread);
// v4's query vectors per block (16, 32 or 64: 1, 2 or 4 mma.sync m-tiles; anything else 16, the
// default) for every later launch: smaller tiles, more blocks for a verify's 64 vectors per kv
// head. A query's arithmetic is the same in any tile, so the bits are too (a measurement switch,
// BLOCKSPEC_ATTN_MMA_TILE).
void set_split_mma_tile(int vectors);
// Microbenchmark switches (never set in production): bit 1 skips v3's K / V loads, bit 2 its
// attention arithmetic, bit 4 the combine pass. The results are then meaningless.
void set_split_diag(int bits);

// Causal flash-attention prefill (flash_prefill.cu) for BF16 q / out / paged pools, head dim 64
// or 128: one block per (64 query rows, head, sequence), tensor-core scores and P V (mma.sync
// m16n8k16), online softmax in fp32, GQA. Same arguments and kv_len_dev rule as split_attention
// (no workspace); a query row's result does not depend on the other rows of the launch. Meant
// for prompt rows (more than kSkinnyMaxRows per sequence); it rounds differently from the
// split-KV kernel.
bool flash_prefill_supported(const AttentionArgs& a);
cudaError_t flash_prefill(const AttentionArgs& a, const int32_t* kv_len_dev, cudaStream_t s);

// The decoder-layer attention prologue (Backend::attention_prologue), BF16 activations and
// pools, F32 norms (null: none) and inv_freq.
struct PrologueArgs {
  const __nv_bfloat16* qkv = nullptr;  // [n, (heads + 2 kv_heads) * hd]
  __nv_bfloat16* q_out = nullptr;      // [n, heads, hd]
  __nv_bfloat16* k_pool = nullptr;     // [capacity, kv_heads, hd]
  __nv_bfloat16* v_pool = nullptr;
  const float* q_norm = nullptr;  // [hd]
  const float* k_norm = nullptr;
  const float* inv_freq = nullptr;  // [hd / 2]
  const int32_t* positions = nullptr;
  const int32_t* slots = nullptr;
  int64_t n = 0, heads = 0, kv_heads = 0, hd = 0, capacity = 0;
  float eps = 1e-6f, attention_scaling = 1.0f;
  FaultSink fault;  // rows with a slot outside [0, capacity): pools not written, reported here
};
cudaError_t attention_prologue(const PrologueArgs& a, cudaStream_t s);
// attention_prologue(p) then split_attention(a) with a.q = p.q_out, one launch fewer: the split
// blocks compute their query vectors and the call's own keys / values (the last n positions of
// each sequence) from p.qkv with the prologue's arithmetic, and write those keys / values to the
// pools; p.q_out is not written. Same results as the two calls, bit for bit. Needs
// prologue_attention_supported (head dim 64, 128 or 256, p and a describing the same rows and
// pools).
bool prologue_attention_supported(const AttentionArgs& a, const PrologueArgs& p);
cudaError_t prologue_attention(const AttentionArgs& a, const PrologueArgs& p,
                               const int32_t* kv_len_dev, void* workspace, cudaStream_t s);
// y[r, c] = silu(gate_up[r, c]) * gate_up[r, i_dim + c], BF16.
cudaError_t swiglu(void* y, const void* gate_up, int64_t rows, int64_t i_dim, cudaStream_t s);

// ---- Small-n matrix-vector products ----
// CUDA-core GEMV (GemvMode::kSimt): y[r, j] (+)= sum_c x[r, c] w[j, c] (+ bias[j]) for
// r < n <= 4, BF16 x and w, k % 8 == 0, x and w 16-byte aligned. y BF16 or F32; bias F32 or null.
bool gemv_supported(int64_t n, int64_t k, const void* x, const void* w);
cudaError_t gemv(Out y, const void* x, const void* w, const float* bias, int64_t n, int64_t m,
                 int64_t k, bool accumulate, int num_sms, cudaStream_t s);

// ---- FP8 weights with one F32 scale per output row (fp8_matmul.cu) ----
// scale[j] = max |w[j, :]| / 448 (1 for a zero row), q[j, :] = e4m3(w[j, :] / scale[j]) (nearest
// even, saturated); w BF16 or F32 [m, k].
cudaError_t quantize_fp8_rows(uint8_t* q, float* scale, In w, int64_t m, int64_t k, cudaStream_t s);
// w[j, c] = q[j, c] * scale[j] (BF16 or F32 out).
cudaError_t dequantize_fp8_rows(Out w, const uint8_t* q, const float* scale, int64_t m, int64_t k,
                                cudaStream_t s);
// Whether fp8_matmul takes these operands: k a multiple of 16, x and q 16-byte aligned.
bool fp8_matmul_supported(int64_t k, const void* x, const void* q);
// y[r, j] (+)= scale[j] * sum_c x[r, c] q[j, c] for BF16 x [n, k] on the tensor cores (x rounded
// to FP16, saturated); y BF16 or F32. A row's result does not depend on n. x16: scratch for
// n * k FP16 values (16-byte aligned) or null; with it, more than 8 rows of x are converted once
// up front instead of in every block (same values).
cudaError_t fp8_matmul(Out y, const void* x, const uint8_t* q, const float* scale, int64_t n,
                       int64_t m, int64_t k, bool accumulate, cudaStream_t s, void* x16 = nullptr);
// The same product through the bulk-copy engine (stream_bulk.cu; BLOCKSPEC_FP8_KERNEL=bulk): the
// same operands and shapes (n <= kSkinnyMaxRows a launch), fp8_matmul's arithmetic exactly (the
// same bits), the weights streamed by a producer warp's cp.async.bulk ring and x copied once per
// block into shared memory where it fits (up to 16 rows of k <= 4096; plain products from
// set_stream_resident_rows rows up) instead of streamed with every 16 features. `kind`
// (stream_gemm.h) derives x, as the BF16 stream GEMM's fused forms do: kSwiglu
// (x = gate_up [n, 2k]) gives swiglu then this product's bits; kRmsNormed (norm_w F32 [k],
// 16-byte aligned) scales the dot products by the row's 1 / rms before the weight scale.
enum class StreamX;
cudaError_t fp8_bulk_matmul(Out y, const void* x, const uint8_t* q, const float* scale, int64_t n,
                            int64_t m, int64_t k, bool accumulate, cudaStream_t s,
                            StreamX kind = StreamX{}, const float* norm_w = nullptr,
                            float eps = 0.0f);
// Whether fp8_bulk_matmul's kSwiglu takes n rows of k (derived once into shared memory; where
// they do not fit it returns cudaErrorNotSupported).
bool fp8_bulk_swiglu_fuses(int64_t n, int64_t k);
// v2 of the same product (BLOCKSPEC_FP8_KERNEL=v2; fp8_matmul above, v1, is the default): the
// same operands, supported shapes and contract (row r's result does not depend on n; x rounded
// to FP16 saturated; y (+)= scale[j] * sum), x staged once per block in shared memory and the
// weights streamed through a cp.async ring; k split over blocks for small m, reduced in a fixed
// split order (design at the top of fp8_matmul.cu's v2 section). The plan depends on m, k and
// the SM count only.
struct Fp8V2Plan {
  int64_t splits = 1;          // k splits (blocks per feature group)
  int64_t groups = 1;          // feature groups of 8 x 16 features (grid = splits x groups)
  int64_t chunks = 0;          // 64-wide k chunks
  int64_t slab_chunks = 1;     // chunks of the largest split (the x slab's width)
  int64_t partial_floats = 0;  // workspace: F32 split partials (0 without splits)
  int64_t counters = 0;        // workspace: int arrival counters, zero before the first use
};
Fp8V2Plan fp8_v2_plan(int64_t m, int64_t k, int num_sms);
// The workspace fp8_v2_plan(m, k, num_sms) asks for (both null when it has one split). The
// counters must be zero before the first launch; every launch leaves them zero.
struct Fp8V2Workspace {
  float* partials = nullptr;
  int* counters = nullptr;
  int num_sms = 0;
};
cudaError_t fp8_matmul_v2(Out y, const void* x, const uint8_t* q, const float* scale, int64_t n,
                          int64_t m, int64_t k, bool accumulate, const Fp8V2Workspace& ws,
                          cudaStream_t s);

// ---- Sampling (sampling.cu; the rules are backend/sampling.h) ----
struct FilterArg {
  float temperature = 1.0f;  // <= 0: one-hot at the argmax
  int32_t top_k = 0;         // <= 0 or >= v: off
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off (filtered_probs only; the candidate walk ignores it)
};
// probs[r, :] (F32 [rows, v]) = the filtered distribution of logits[r, :] (F32, BF16 or F16) with
// params[r], or params[0] for every row when num_params == 1 (host array).
cudaError_t filtered_probs(float* probs, In logits, int64_t rows, int64_t v,
                           const FilterArg* params, int64_t num_params, cudaStream_t s);
// Logits processing (backend/logit_rules.h) in place: request q (reqs[q], device) owns rows
// [first_row, first_row + rows) of logits [.., v]; its rules are tokens[token_offset ..
// token_offset + token_count) (device, sorted by token); row r's extra tokens e_1 .. e_r are
// row_tokens[first_row + 1 ..] (device; null when every request has one row). max_rows >= every
// request's rows.
struct LogitRulesArg {
  int64_t first_row = 0, rows = 0, stop_rows = 0, token_offset = 0, token_count = 0;
  float repetition = 1.0f, frequency = 0.0f, presence = 0.0f, pad = 0.0f;
};
cudaError_t apply_logit_rules(Out logits, int64_t v, const int32_t* row_tokens,
                              const LogitRulesArg* reqs, int64_t num_reqs, int64_t max_rows,
                              const sampling::TokenRule* tokens, cudaStream_t s);
// Bytes of device workspace sample_from_probs / rejection_sample need for `rows` rows of v.
size_t draw_workspace_bytes(int64_t rows, int64_t v);
// out[r] = the inverse-CDF draw from weights[r, :] (F32 [rows, v], >= 0) at uniforms[r].
cudaError_t sample_from_probs(int32_t* out, const float* weights, const float* uniforms,
                              int64_t rows, int64_t v, void* workspace, cudaStream_t s);
// Rejection sampling of drafts [k] (q [k, v], p [k + 1, v], uniforms [k + 1]) into out [k + 2] =
// [a, next, drafts] (greedy_accept's row layout). q and drafts may be null when k == 0.
cudaError_t rejection_sample(int32_t* out, const int32_t* drafts, const float* q, const float* p,
                             const float* uniforms, int64_t k, int64_t v, void* workspace,
                             cudaStream_t s);

// Tensor-core skinny GEMM for 1..kSkinnyMaxRows rows (GemvMode::kMma): y[r, j] (+)= sum_c x[r, c]
// w[j, c] (+ bias[j]) with BF16 x and w (any k and alignment; 16-byte loads when k % 8 == 0 and
// x, w are 16-byte aligned), y BF16 or F32, bias F32 or null. Row r's result is bit-identical
// whatever n is (1-row decode == row 0 of a 16-row verify).
constexpr int64_t kSkinnyMaxRows = 16;
cudaError_t skinny_gemm(Out y, const void* x, const void* w, const float* bias, int64_t n,
                        int64_t m, int64_t k, bool accumulate, cudaStream_t s);

// ---- Drafter walks (drafter_walks.cu; Backend::markov_row, candidate_walk, issue 14) ----
// markov_row: z[row] = u[row] + sum_c w2[row, c] * w1[prev[0], c] (fp32) for row < v, and *argmax
// = the first index of the maximum; z and argmax may be null. One launch: each block leaves its
// best key in keys[block] (kMarkovRowMaxBlocks of them) and the last block to finish (counted in
// *counter, which must start at 0 and is left at 0) writes *argmax.
constexpr int64_t kMarkovRowMaxBlocks = 1024;
cudaError_t markov_row(float* z, int32_t* argmax, In u, const int32_t* prev, In w1, In w2,
                       int64_t v, int64_t r, uint64_t* keys, unsigned* counter, int num_sms,
                       cudaStream_t s);
// Backend::markov_chain with norms (the greedy chain, z computed only for the ids that can win):
// drafts[j] for j < k, bit-identical to markov_row's argmax of row j of u [k, v] after
// drafts[j - 1] (anchor[0] for j = 0). k + 1 launches; keys / counter as markov_row's; workspace
// of markov_chain_workspace_bytes(k, v).
size_t markov_chain_workspace_bytes(int64_t k, int64_t v);
cudaError_t markov_chain_pruned(int32_t* drafts, const int32_t* anchor, In u, In w1, In w2,
                                const float* norms, int64_t k, int64_t v, int64_t r,
                                void* workspace, uint64_t* keys, unsigned* counter, cudaStream_t s);
// Backend::candidate_walk for one request, one block for the whole walk (plus a fill of rows with
// -inf and a clear of probs when they are written).
struct WalkArgs {
  int32_t* drafts = nullptr;        // [k]
  float* rows = nullptr;            // [k, v] or null
  float* probs = nullptr;           // [k, v] (sampled)
  const int32_t* anchor = nullptr;  // [1]
  const float* vals = nullptr;      // [k, t]
  const int32_t* ids = nullptr;     // [k, t]
  In pred{}, succ{}, scale{};       // [vocab, r], [vocab, r], [k, r] (p null: none / 1)
  const float* uniforms = nullptr;  // [k] (sampled)
  FilterArg filter{0.0f, 0, 1.0f};
  int64_t k = 0, t = 0, r = 0, v = 0, vocab = 0;  // v: row width; vocab: pred / succ rows
};
bool candidate_walk_supported(int64_t t, int64_t r);
// table: scratch of candidate_walk_table_floats(k, t, r) floats for the candidate terms of every
// row and predecessor (computed in parallel first, then looked up by the walk); null: the walk
// computes them row by row. Same result either way.
int64_t candidate_walk_table_floats(int64_t k, int64_t t, int64_t r);
cudaError_t candidate_walk(const WalkArgs& a, float* table, cudaStream_t s);
// Two-stage top-k (chunks of 4096 in shared memory, then a merge per row) for k <= kTopkFastK on
// long rows; same result as topk. workspace: topk_workspace_bytes(rows, v, k).
constexpr int64_t kTopkFastK = 64;
bool topk_two_stage(int64_t v, int64_t k);
size_t topk_workspace_bytes(int64_t rows, int64_t v, int64_t k);
cudaError_t topk_fast(float* values, int32_t* ids, In x, int64_t rows, int64_t v, int64_t k,
                      void* workspace, cudaStream_t s);

}  // namespace bs::cuda
