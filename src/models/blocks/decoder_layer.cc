#include "models/blocks/decoder_layer.h"

#include <cmath>

namespace bs {

Result<DecoderLayer> load_decoder_layer(WeightLoader& w, const io::TransformerConfig& c,
                                        int64_t index, DecoderLayerOptions options,
                                        AttentionMask mask) {
  const int64_t h = c.hidden_size, hd = c.head_dim, q_dim = c.num_heads * hd,
                kv_dim = c.num_kv_heads * hd, inter = c.intermediate_size;
  DecoderLayer L;
  L.mask = mask;
  const std::string p = "layers." + std::to_string(index) + ".", a = p + "self_attn.",
                    m = p + "mlp.";
  BS_ASSIGN_OR_RETURN(L.input_norm, w.load(p + "input_layernorm.weight", {h}));
  BS_ASSIGN_OR_RETURN(L.post_norm, w.load(p + "post_attention_layernorm.weight", {h}));
  BS_ASSIGN_OR_RETURN(
      L.w_qkv.w, w.load_stacked({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                                {{q_dim, h}, {kv_dim, h}, {kv_dim, h}}));
  BS_ASSIGN_OR_RETURN(L.wo.w, w.load(a + "o_proj.weight", {h, q_dim}));
  if (options.attention_bias) {
    BS_ASSIGN_OR_RETURN(L.b_qkv,
                        w.load_stacked({a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"},
                                       {{q_dim}, {kv_dim}, {kv_dim}}));
    BS_ASSIGN_OR_RETURN(L.bo, w.load_optional(a + "o_proj.bias", {h}));
  }
  if (options.qk_norm) {
    BS_ASSIGN_OR_RETURN(L.q_norm, w.load(a + "q_norm.weight", {hd}));
    BS_ASSIGN_OR_RETURN(L.k_norm, w.load(a + "k_norm.weight", {hd}));
  }
  BS_ASSIGN_OR_RETURN(L.w_gate_up.w, w.load_stacked({m + "gate_proj.weight", m + "up_proj.weight"},
                                                    {{inter, h}, {inter, h}}));
  BS_ASSIGN_OR_RETURN(L.w_down.w, w.load(m + "down_proj.weight", {h, inter}));
  if (options.mlp_bias) {
    BS_ASSIGN_OR_RETURN(L.b_gate_up, w.load_stacked({m + "gate_proj.bias", m + "up_proj.bias"},
                                                    {{inter}, {inter}}));
    BS_ASSIGN_OR_RETURN(L.b_down, w.load(m + "down_proj.bias", {h}));
  }
  return L;
}

void LayerActivations::allocate_layers(Backend& backend, const io::TransformerConfig& c,
                                       int64_t rows) {
  x = backend.empty({rows, c.hidden_size});
  xn = backend.empty({rows, c.hidden_size});
  qkv = backend.empty({rows, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim});
  q = backend.empty({rows, c.num_heads, c.head_dim});
  attn = backend.empty({rows, c.num_heads, c.head_dim});
  gate_up = backend.empty({rows, 2 * c.intermediate_size});
  act = backend.empty({rows, c.intermediate_size});
}

LayerActivations LayerActivations::first_rows(int64_t n) const {
  LayerActivations a;
  for (auto [dst, src] : {std::pair{&a.x, &x},
                          {&a.xn, &xn},
                          {&a.qkv, &qkv},
                          {&a.q, &q},
                          {&a.attn, &attn},
                          {&a.gate_up, &gate_up},
                          {&a.act, &act}}) {
    *dst = src->rows(0, n);
  }
  return a;
}

PagedAttention PagedAttention::of(const PagedBatch& batch, const Rope& rope, double eps,
                                  int64_t head_dim, bool fused) {
  return {.positions = batch.positions(),
          .slots = batch.slots(),
          .tables = batch.tables(),
          .kv_lens = batch.kv_lens(),
          .max_kv_len = batch.max_kv_len(),
          .uneven_rows = batch.even() ? std::span<const int64_t>() : batch.seq_rows(),
          .fused = fused,
          .rope = rope,
          .eps = static_cast<float>(eps),
          .scale = 1.0f / std::sqrt(static_cast<float>(head_dim))};
}

namespace {

// y (+)= x · Wᵀ + bias.
void linear(Backend& b, const Tensor& y, const Tensor& x, const DenseWeight& w, const Tensor& bias,
            bool accumulate) {
  if (bias.defined()) {
    b.matmul(y, x, w.w, &bias, accumulate);  // biased weights are never FP8 (targets only)
  } else {
    w.apply(b, y, x, accumulate);
  }
}

// y += swiglu(gate_up) · Wᵀ + bias, the activation in act where the backend does not fuse it.
void swiglu_linear(Backend& b, const Tensor& y, const Tensor& act, const Tensor& gate_up,
                   const DenseWeight& w, const Tensor& bias) {
  if (w.fp8.defined()) return b.swiglu_matmul_fp8(y, act, gate_up, w.fp8, /*accumulate=*/true);
  b.swiglu_matmul(y, act, gate_up, w.w, bias.defined() ? &bias : nullptr, /*accumulate=*/true);
}

void attention(Backend& b, const DecoderLayer& L, const LayerActivations& a,
               const PagedAttention& p, const Tensor& k_pool, const Tensor& v_pool) {
  if (p.uneven_rows.empty() && p.fused) {
    b.prologue_attention(a.attn, a.q, a.qkv, L.q_norm, L.k_norm, p.eps, p.positions,
                         p.rope.inv_freq, p.rope.attention_scaling, k_pool, v_pool, p.slots,
                         p.tables, p.kv_lens, p.max_kv_len, L.mask, p.scale);
    return;
  }
  b.attention_prologue(a.q, a.qkv, L.q_norm, L.k_norm, p.eps, p.positions, p.rope.inv_freq,
                       p.rope.attention_scaling, k_pool, v_pool, p.slots);
  if (p.uneven_rows.empty()) {
    b.paged_attention_batch(a.attn, a.q, k_pool, v_pool, p.tables, p.kv_lens, p.max_kv_len, L.mask,
                            p.scale);
    return;
  }
  // Uneven rows (a served batch where some verify blocks are shorter, prompts of several
  // lengths): each run of consecutive sequences with equal rows in one batched call (the same
  // rows bit for bit), so that one short block among 32 costs three calls, not 32.
  const int64_t capacity = p.tables.dim(1);
  const int64_t num_seqs = static_cast<int64_t>(p.uneven_rows.size());
  for (int64_t s = 0, row = 0; s < num_seqs;) {
    const int64_t n = p.uneven_rows[static_cast<size_t>(s)];
    int64_t run = 1;
    while (s + run < num_seqs && p.uneven_rows[static_cast<size_t>(s + run)] == n) ++run;
    if (run == 1) {
      const Tensor kv_len = p.kv_lens.rows(s, 1);
      b.paged_attention(a.attn.rows(row, n), a.q.rows(row, n), k_pool, v_pool,
                        p.tables.rows(s, 1).view({capacity}), KvLength(p.max_kv_len, &kv_len),
                        L.mask, p.scale);
    } else {
      b.paged_attention_batch(a.attn.rows(row, run * n), a.q.rows(row, run * n), k_pool, v_pool,
                              p.tables.rows(s, run), p.kv_lens.rows(s, run), p.max_kv_len, L.mask,
                              p.scale);
    }
    s += run;
    row += run * n;
  }
}

}  // namespace

// Biased weights are never FP8 (targets only).
void norm_linear(Backend& b, const Tensor& y, const Tensor& xn, const Tensor& x,
                 const Tensor& norm_w, float eps, const DenseWeight& w, const Tensor& bias) {
  if (w.fp8.defined()) return b.norm_matmul_fp8(y, xn, x, norm_w, eps, w.fp8);
  b.norm_matmul(y, xn, x, norm_w, eps, w.w, bias.defined() ? &bias : nullptr);
}

void decoder_layer(Backend& b, int64_t index, const DecoderLayer& L, const LayerActivations& a,
                   const PagedAttention& p, KvPool& kv, const SublayerConvs* convs) {
  // Sublayer s reads norm(x) (or its convolution) and adds its output to x (or its convolution).
  auto input = [&](int s) -> const Tensor& {
    if (!convs) return a.xn;
    convs->prepare(index, s, convs->in, a.xn);
    return convs->in;
  };
  // With convs, a sublayer's finish also writes the norm after it (norm_w) into a.xn.
  auto output = [&](int s, const DenseWeight& w, const Tensor& bias, const Tensor& x,
                    const Tensor& norm_w) {
    if (!convs) return linear(b, a.x, x, w, bias, /*accumulate=*/true);
    linear(b, convs->out, x, w, bias, /*accumulate=*/false);
    convs->finish(index, s, a.x, convs->out, a.xn, norm_w, p.eps);
  };
  // Attention: x += o_proj(attn(rope(q_norm(q)), rope(k_norm(k)), v)).
  if (!convs) {
    norm_linear(b, a.qkv, a.xn, a.x, L.input_norm, p.eps, L.w_qkv, L.b_qkv);
  } else {
    if (!convs->input_normed) b.rms_norm(a.xn, a.x, L.input_norm, p.eps);
    linear(b, a.qkv, input(0), L.w_qkv, L.b_qkv, /*accumulate=*/false);
  }
  attention(b, L, a, p, kv.k[index], kv.v[index]);
  output(0, L.wo, L.bo, a.attn, L.post_norm);
  // MLP: x += down(silu(gate(y)) * up(y)), y = post_norm(x).
  if (!convs) {
    norm_linear(b, a.gate_up, a.xn, a.x, L.post_norm, p.eps, L.w_gate_up, L.b_gate_up);
    swiglu_linear(b, a.x, a.act, a.gate_up, L.w_down, L.b_down);
    return;
  }
  linear(b, a.gate_up, input(1), L.w_gate_up, L.b_gate_up, /*accumulate=*/false);
  b.swiglu(a.act, a.gate_up);
  output(1, L.w_down, L.b_down, a.act, convs->next_input_norm);
}

}  // namespace bs
