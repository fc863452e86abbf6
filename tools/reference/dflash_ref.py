#!/usr/bin/env python3
"""Independent PyTorch reference of the DFlash drafter forward (specs/dflash.md §1.3-§1.4, §3).

Dense and stateless on purpose: no paging, no KV cache. Given the tapped target features of the
context positions [0, s) and an anchor token at position s, it recomputes everything:

    ctx   = hidden_norm(C · W_fcᵀ)                                  [s, H]     (C = taps, [s, n_taps*H_t])
    block = E[[anchor, mask × (B−1)]]                                [B, H]     positions s .. s+B−1
    per layer (pre-norm residual):
        x = input_layernorm(h)
        q = RoPE(q_norm(x Wqᵀ))                                      block rows only
        k = RoPE(k_norm([ctx Wkᵀ ; x Wkᵀ]))   v = [ctx Wvᵀ ; x Wvᵀ]   same Wk/Wv/k_norm for both
        h = h + softmax(q kᵀ / sqrt(d) + mask) v Woᵀ                 mask: none for full-attention
                                                                     DFlash layers (non-causal)
        h = h + down(silu(gate(y)) * up(y)),  y = post_attention_layernorm(h)
    logits = lm_head(norm(h[1:]))                                    [B−1, V]; row j → position s+j

Everything is computed in fp32 (weights of any stored dtype are upcast), like blockspec's CPU
backend. The checkpoint is read in the format users download (config.json + *.safetensors, names
with or without a `model.` prefix); the embedding and LM head come from the target checkpoint
unless the drafter ships its own.

This file also holds a small numpy-only safetensors reader/writer (Debian's python3 has no
`safetensors` package); it is used by tools/goldens/make_dflash_goldens.py.

Usage as a script (prints the draft argmax of one propose on random features):
    python3 tools/reference/dflash_ref.py --drafter tests/data/dflash-stories260K \
        --target models/stories260K [--device cpu|cuda]
"""

import argparse
import glob
import json
import math
import os

import numpy as np
import torch

import safetensors_io

# ---------------------------------------------------------------------------------------------
# safetensors (numpy only)
# ---------------------------------------------------------------------------------------------

_ST_NP = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "U8": np.uint8}


def _bf16_bits_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """Round-to-nearest-even fp32 -> bf16 bit pattern (uint16); NaN kept NaN."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (b + np.uint32(0x7FFF) + ((b >> 16) & np.uint32(1))) >> 16
    nan = (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = np.where(nan, (b >> 16) | np.uint32(0x40), rounded)
    return rounded.astype(np.uint16)


def read_safetensors(path):
    """{name: numpy array}; BF16 is returned as float32 (exact)."""
    out = {}
    for name, (dt, shape, raw) in safetensors_io.read_raw(path)[0].items():
        if dt == "BF16":
            arr = _bf16_bits_to_f32(np.frombuffer(raw, dtype="<u2")).reshape(shape)
        elif dt in _ST_NP:
            arr = np.frombuffer(raw, dtype=np.dtype(_ST_NP[dt]).newbyteorder("<")).reshape(shape)
        else:
            raise ValueError("%s: tensor %s has unsupported dtype %s" % (path, name, dt))
        out[name] = arr.copy()
    return out


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (dtype_str, numpy array)} with dtype_str in F32, BF16, F16, I32."""
    items = []
    for name, (dt, arr) in tensors.items():
        if dt == "BF16":
            raw = f32_to_bf16_bits(np.asarray(arr, dtype=np.float32)).astype("<u2").tobytes()
            esize = 2
        else:
            a = np.ascontiguousarray(arr, dtype=np.dtype(_ST_NP[dt]).newbyteorder("<"))
            raw = a.tobytes()
            esize = a.dtype.itemsize
        items.append((name, dt, list(np.shape(arr)), raw, esize))
    # Larger elements first, then by name: every tensor stays aligned to its element size.
    items.sort(key=lambda t: (-t[4], t[0]))
    safetensors_io.write_raw(path, [it[:4] for it in items], metadata)


def read_checkpoint_dir(d):
    """Every tensor of every *.safetensors file of a checkpoint folder."""
    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    files = [f for f in files if os.path.basename(f) != "golden.safetensors"]
    if not files:
        raise FileNotFoundError("no .safetensors file in " + d)
    sd = {}
    for f in files:
        sd.update(read_safetensors(f))
    return sd


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


def default_target_layer_ids(num_target_layers, num_draft_layers):
    """dflash.md §1.1: L = 1 -> [N // 2]; else round(1 + i (N-4) / (L-1)) with Python's round."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [int(round(1 + (i * span) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


class DFlashConfig:
    def __init__(self, cfg, target_cfg):
        dc = cfg.get("dflash_config") or {}
        self.hidden = cfg["hidden_size"]
        self.inter = cfg["intermediate_size"]
        self.layers = cfg["num_hidden_layers"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads") or self.heads
        self.head_dim = cfg.get("head_dim") or self.hidden // self.heads
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rtype = rp.get("rope_type", rp.get("type", "default")) if rp else "default"
        if rtype != "default":
            raise NotImplementedError("reference supports default RoPE only, got " + str(rtype))
        self.rope_theta = float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        self.block_size = dc.get("block_size", cfg.get("block_size"))
        if self.block_size is None:
            raise ValueError("config has no block_size (top level or dflash_config)")
        self.mask_token_id = dc.get("mask_token_id", cfg.get("mask_token_id"))
        if self.mask_token_id is None:
            raise ValueError("config has no dflash_config.mask_token_id")
        n_target = target_cfg["num_hidden_layers"]
        ids = dc.get("target_layer_ids", cfg.get("target_layer_ids"))
        self.target_layer_ids = list(ids) if ids is not None else default_target_layer_ids(
            n_target, self.layers)
        # Layer types and masks (dflash.md §1.4).
        # As blockspec's config parser (src/io/hf_config.h): sliding_window counts unless
        # use_sliding_window is false; without layer_types, layers >= max_window_layers slide
        # only when use_sliding_window is explicitly true.
        use_sliding = cfg.get("use_sliding_window", True)
        sliding = cfg.get("sliding_window") if use_sliding else None
        lt = cfg.get("layer_types")
        if lt is None:
            mwl = cfg.get("max_window_layers", self.layers)
            explicit = "use_sliding_window" in cfg and use_sliding
            lt = ["sliding_attention" if explicit and sliding is not None and i >= mwl
                  else "full_attention" for i in range(self.layers)]
        self.layer_types = lt
        self.causal = []
        self.window = []
        for t in lt:
            if cfg.get("is_causal") is not None:
                c = bool(cfg["is_causal"])
            elif dc.get("causal") is not None:
                c = bool(dc["causal"])
            else:
                c = t == "sliding_attention"
            self.causal.append(c)
            self.window.append(int(sliding) if (t == "sliding_attention" and sliding) else 0)


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------


class DFlashRef:
    def __init__(self, drafter_dir, target_dir, device="cpu"):
        self.device = torch.device(device)
        with open(os.path.join(drafter_dir, "config.json")) as f:
            cfg = json.load(f)
        with open(os.path.join(target_dir, "config.json")) as f:
            tcfg = json.load(f)
        self.cfg = DFlashConfig(cfg, tcfg)
        sd = read_checkpoint_dir(drafter_dir)
        tsd = read_checkpoint_dir(target_dir)

        def t(a):
            return torch.tensor(np.asarray(a, dtype=np.float32), device=self.device)

        def get(name):
            for n in (name, "model." + name):
                if n in sd:
                    return t(sd[n])
            raise KeyError("drafter tensor %s not found" % name)

        def get_opt(name):
            for n in (name, "model." + name):
                if n in sd:
                    return t(sd[n])
            return None

        self.fc = get("fc.weight")
        self.hidden_norm = get("hidden_norm.weight")
        self.norm = get("norm.weight")
        self.layers = []
        for i in range(self.cfg.layers):
            p = "layers.%d." % i
            self.layers.append({k: get(p + k + ".weight") for k in (
                "input_layernorm", "post_attention_layernorm", "self_attn.q_proj",
                "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
                "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")})
        emb = get_opt("embed_tokens.weight")
        if emb is None:
            emb = t(tsd["model.embed_tokens.weight"])
        head = get_opt("lm_head.weight")
        if head is None:
            head = t(tsd["lm_head.weight"]) if "lm_head.weight" in tsd else t(
                tsd["model.embed_tokens.weight"])
        self.embed, self.lm_head = emb, head
        c = self.cfg
        self.inv_freq = 1.0 / (c.rope_theta ** (
            torch.arange(0, c.head_dim, 2, dtype=torch.int64).float().to(self.device) / c.head_dim))

    def _rms(self, x, w):
        x32 = x.float()
        return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.cfg.eps))

    def _rope(self, x, pos):
        """x [T, heads, d] at positions pos [T]; neox rotate-half."""
        ang = pos.float()[:, None] * self.inv_freq[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
        sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rot * sin

    def _mask(self, layer, q_pos, k_pos):
        """Additive mask [Q, K] per dflash.md §1.4 (qpos = absolute query position)."""
        causal, window = self.cfg.causal[layer], self.cfg.window[layer]
        qp = q_pos[:, None]
        kp = k_pos[None, :]
        ok = torch.ones(qp.shape[0], kp.shape[1], dtype=torch.bool, device=self.device)
        if causal:
            ok &= kp <= qp
        if window > 0:
            ok &= (qp - kp) < window
            if not causal:
                ok &= (kp - qp) < window
        m = torch.zeros(ok.shape, device=self.device)
        return m.masked_fill(~ok, float("-inf"))

    @torch.no_grad()
    def block_hidden(self, ctx_feats, anchor, num_rows=None, hook=None, embed_scale=1.0):
        """Final-normed hidden states [B, H] of every row of the block [anchor, mask × (B−1)] at
        positions s..s+B−1 (ctx_feats [s, n_taps*H_t]: features of positions 0..s-1). The
        DFlash2 extensions (dflash_family_ref.py): block embeddings × embed_scale, and a
        sublayer hook around attention and MLP:
            x = input_layernorm(h); x, st = hook.prepare(layer, "attention", x)
            h = h + hook.finish(layer, "attention", self_attn(x, ctx) Woᵀ, st)
            y = post_attention_layernorm(h); y, st = hook.prepare(layer, "mlp", y)
            h = h + hook.finish(layer, "mlp", mlp(y), st)"""
        c = self.cfg
        B = c.block_size if num_rows is None else num_rows
        feats = torch.as_tensor(np.asarray(ctx_feats, dtype=np.float32), device=self.device)
        s = feats.shape[0]
        ctx = self._rms(feats @ self.fc.T, self.hidden_norm)  # [s, H]
        ids = torch.tensor([anchor] + [c.mask_token_id] * (B - 1), device=self.device)
        h = self.embed[ids]  # [B, H]
        if embed_scale != 1.0:
            h = h * embed_scale
        ctx_pos = torch.arange(0, s, device=self.device)
        blk_pos = torch.arange(s, s + B, device=self.device)
        key_pos = torch.cat([ctx_pos, blk_pos])
        group = c.heads // c.kv_heads
        for li, L in enumerate(self.layers):
            x = self._rms(h, L["input_layernorm"])
            if hook is not None:
                x, st = hook.prepare(li, "attention", x)
            q = (x @ L["self_attn.q_proj"].T).view(B, c.heads, c.head_dim)
            q = self._rope(self._rms(q, L["self_attn.q_norm"]), blk_pos)
            kin = torch.cat([ctx, x], 0)  # context never passes input_layernorm
            k = (kin @ L["self_attn.k_proj"].T).view(s + B, c.kv_heads, c.head_dim)
            k = self._rope(self._rms(k, L["self_attn.k_norm"]), key_pos)
            v = (kin @ L["self_attn.v_proj"].T).view(s + B, c.kv_heads, c.head_dim)
            k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, s+B, d]
            v = v.repeat_interleave(group, dim=1).transpose(0, 1)
            qh = q.transpose(0, 1)  # [heads, B, d]
            scores = (qh @ k.transpose(1, 2)) / math.sqrt(c.head_dim) + self._mask(
                li, blk_pos, key_pos)
            a = torch.softmax(scores, -1) @ v  # [heads, B, d]
            a = a.transpose(0, 1).reshape(B, c.heads * c.head_dim) @ L["self_attn.o_proj"].T
            h = h + (hook.finish(li, "attention", a, st) if hook is not None else a)
            y = self._rms(h, L["post_attention_layernorm"])
            if hook is not None:
                y, st = hook.prepare(li, "mlp", y)
            m = torch.nn.functional.silu(y @ L["mlp.gate_proj"].T) * (y @ L["mlp.up_proj"].T)
            m = m @ L["mlp.down_proj"].T
            h = h + (hook.finish(li, "mlp", m, st) if hook is not None else m)
        return self._rms(h, self.norm)

    @torch.no_grad()
    def propose(self, ctx_feats, anchor, num_rows=None):
        """ctx_feats [s, n_taps*H_t] (features of positions 0..s-1); anchor at position s.
        Returns logits [B-1, V] (row j-1 predicts position s+j)."""
        out = self.block_hidden(ctx_feats, anchor, num_rows)[1:]
        return (out @ self.lm_head.T).cpu()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--context", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    ref = DFlashRef(a.drafter, a.target, a.device)
    rng = np.random.default_rng(a.seed)
    width = len(ref.cfg.target_layer_ids) * ref.fc.shape[1] // len(ref.cfg.target_layer_ids)
    feats = rng.standard_normal((a.context, width)).astype(np.float32)
    logits = ref.propose(feats, anchor=1)
    print("drafts:", logits.argmax(-1).tolist())


if __name__ == "__main__":
    main()
