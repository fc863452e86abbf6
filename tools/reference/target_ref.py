#!/usr/bin/env python3
"""Independent PyTorch reference of the Llama / Mistral / Qwen2 decoder with sliding-window layers.

Written from the Hugging Face semantics, without transformers: dense, stateless, fp32.

    h = E[ids]
    per layer (pre-norm residual):
        x = input_layernorm(h)
        q, k, v = x Wqᵀ (+bq), x Wkᵀ (+bk), x Wvᵀ (+bv)     (Qwen2: biases on q, k, v)
        q, k = RoPE(q), RoPE(k)                             rotate-half, theta = rope_theta
        h = h + softmax(q kᵀ / sqrt(hd) + mask) v Woᵀ       GQA: kv head = head / (heads / kv_heads)
        h = h + down(silu(gate(y)) * up(y)),  y = post_attention_layernorm(h)
    logits = lm_head(norm(h))

mask: key j is visible from query i iff j <= i, and on a sliding layer also j > i - sliding_window
(transformers' masking_utils.sliding_window_overlay: `kv_idx > q_idx - sliding_window`, i.e. the
window counts the visible keys including the query's own position).

Which layers slide (transformers' Mistral / Qwen2 configs): `layer_types` when present, else
Mistral: every layer when sliding_window is set; Qwen2: layers >= max_window_layers when
use_sliding_window is true.
"""

import json
import math
import os

import torch

from dflash_ref import read_checkpoint_dir


def sliding_layers(cfg):
    n = cfg["num_hidden_layers"]
    window = cfg.get("sliding_window")
    if cfg.get("layer_types"):
        return [t == "sliding_attention" for t in cfg["layer_types"]], window
    if window is None:
        return [False] * n, None
    if cfg.get("model_type") == "mistral":
        return [True] * n, window
    if cfg.get("use_sliding_window", False):
        first = cfg.get("max_window_layers", n)
        return [i >= first for i in range(n)], window
    return [False] * n, None


def rope(x, positions, theta):
    # x [n, heads, hd]; rotate-half pairing (i, i + hd/2).
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], dim=-1).to(torch.float32)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], dim=-1).to(torch.float32)[:, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated * sin


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class TargetRef:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        sd = read_checkpoint_dir(model_dir)
        self.w = {k[len("model."):] if k.startswith("model.") else k: torch.from_numpy(v).float()
                  for k, v in sd.items()}
        if "lm_head.weight" not in self.w:
            self.w["lm_head.weight"] = self.w["embed_tokens.weight"]
        self.sliding, self.window = sliding_layers(self.cfg)

    def forward(self, ids):
        """Logits [n, V] of every position of `ids` (positions 0 .. n-1)."""
        c, w = self.cfg, self.w
        H, nh, nkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        hd = c.get("head_dim") or H // nh
        eps = c["rms_norm_eps"]
        theta = c.get("rope_theta") or c.get("rope_parameters", {}).get("rope_theta", 10000.0)
        n = len(ids)
        pos = torch.arange(n)
        h = w["embed_tokens.weight"][torch.tensor(ids)]
        qi, kj = pos[:, None], pos[None, :]
        for li in range(c["num_hidden_layers"]):
            p = "layers.%d." % li
            x = rms_norm(h, w[p + "input_layernorm.weight"], eps)

            def proj(name):
                y = x @ w[p + "self_attn.%s.weight" % name].T
                b = w.get(p + "self_attn.%s.bias" % name)
                return y + b if b is not None else y

            q = rope(proj("q_proj").view(n, nh, hd), pos, theta)
            k = rope(proj("k_proj").view(n, nkv, hd), pos, theta)
            v = proj("v_proj").view(n, nkv, hd)
            rep = nh // nkv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            visible = kj <= qi
            if self.sliding[li]:
                visible = visible & (kj > qi - self.window)
            scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
            scores = scores.masked_fill(~visible[None], float("-inf"))
            attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, nh * hd)
            o = attn @ w[p + "self_attn.o_proj.weight"].T
            if p + "self_attn.o_proj.bias" in w:
                o = o + w[p + "self_attn.o_proj.bias"]
            h = h + o
            y = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
            gate = y @ w[p + "mlp.gate_proj.weight"].T
            up = y @ w[p + "mlp.up_proj.weight"].T
            h = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        return rms_norm(h, w["norm.weight"], eps) @ w["lm_head.weight"].T
