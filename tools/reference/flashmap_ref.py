#!/usr/bin/env python3
"""Independent PyTorch reference of the FlashMap drafter (seeds/000, specs/flashmap.md), dense and unfolded.

This is the algorithm blockspec's C++ drafter (src/models/drafters/flashmap.cc) must reproduce, written
from the specification with plain torch and no load-time folds:

* context rows  c_j = hidden_norm(fc(taps_j))                  at positions 0 .. p-1
  anchor row    a   = anchor_norm(anchor_proj(E[x_p]))          at position p
  per layer l:  K = RoPE(k_norm_l(row · Wk_lᵀ)), V = row · Wv_lᵀ (cross-attention keys/values)
* B slots at positions p+1 .. p+B start from a vocabulary-sized noise state x0 [B, V]; for each jump
  n (times t_n -> t_n+1 of time_grids[N-1]):
      e     = t_n / max(1 - t_n, 1e-3)^2
      post  = softmax(e · state)
      emb   = state_norm(post @ E) + g_n · noise_norm(state @ E)
      h     = DiT_n(x_embed(emb))            (AdaLN modulations from time_embed(t_n) + jump_embed(t_n+1))
      state = ((1 - t_n+1) · state + (t_n+1 - t_n) · softmax(lm_head · head(h))) / (1 - t_n)   (n < N-1)
  logits = lm_head[draft vocab] · head(h) (the DiT head is applied, then the LM head: no fold)
* the folded one-jump path of the seed (noise drawn in the embedding's eigenbasis) is also implemented
  here (`one_jump_folded`), only to check it against the unfolded computation.

Conventions the seed leaves open are the ones blockspec picked (docs/FLASHMAP.md); they are all in the
`Conventions` section below. Everything is computed in float64 by default (--dtype), so a golden made with
it measures the C++ fp32 error only.

Also holds a minimal safetensors reader/writer (the `safetensors` package is not needed).

Usage as a self-check:  python3 tools/reference/flashmap_ref.py --ckpt DIR --target DIR [--device cpu|cuda]
"""

import argparse
import json
import math
import os

import numpy as np
import torch

import safetensors_io

# ----------------------------------------------------------------------------------------------------------
# safetensors by hand: [u64 LE header length][JSON header][raw data]
# ----------------------------------------------------------------------------------------------------------

_ST_DTYPES = {
    "F32": (torch.float32, 4),
    "F64": (torch.float64, 8),
    "BF16": (torch.bfloat16, 2),
    "F16": (torch.float16, 2),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
}
_ST_NAMES = {v[0]: k for k, v in _ST_DTYPES.items()}
_RAW_VIEW = {torch.bfloat16: (torch.int16, np.int16)}


def read_safetensors(path):
    """{name: tensor (CPU, stored dtype)} and the metadata dict."""
    tensors, meta = safetensors_io.read_raw(path)
    out = {}
    for name, (dt, shape, raw) in tensors.items():
        dtype, _ = _ST_DTYPES[dt]
        if dtype in _RAW_VIEW:
            tview, nview = _RAW_VIEW[dtype]
            arr = np.frombuffer(raw, dtype=nview).copy()
            t = torch.from_numpy(arr).view(dtype)
        else:
            arr = np.frombuffer(raw, dtype=torch.empty(0, dtype=dtype).numpy().dtype).copy()
            t = torch.from_numpy(arr)
        out[name] = t.reshape(shape)
    return out, meta


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: CPU tensor}; data laid out by descending element size, then name."""
    items = sorted(tensors.items(), key=lambda kv: (-_ST_DTYPES[_ST_NAMES[kv[1].dtype]][1], kv[0]))
    raw_items = []
    for name, t in items:
        t = t.detach().cpu().contiguous()
        if t.dtype in _RAW_VIEW:
            raw = t.view(_RAW_VIEW[t.dtype][0]).numpy().tobytes()
        else:
            raw = t.numpy().tobytes()
        raw_items.append((name, _ST_NAMES[t.dtype], list(t.shape), raw))
    safetensors_io.write_raw(path, raw_items, metadata)


# ----------------------------------------------------------------------------------------------------------
# Conventions: what seed 000 leaves unspecified, as blockspec decided it (docs/FLASHMAP.md §Unknowns).
# ----------------------------------------------------------------------------------------------------------

SINUSOID_MAX_PERIOD = 10000.0


def timestep_sinusoid(t, dim):
    """Frequency features of one time value: [cos(t f_0..f_h-1), sin(t f_0..f_h-1)] (+ a zero when dim is
    odd), f_i = max_period^(-i/h), h = dim // 2 (FMLM / DiT form), computed in float64, rounded to
    float32 (the C++ code rounds the same float64 values)."""
    half = dim // 2
    i = torch.arange(half, dtype=torch.float64)
    freqs = torch.exp(-math.log(SINUSOID_MAX_PERIOD) * i / half)
    args = float(t) * freqs
    emb = torch.cat([torch.cos(args), torch.sin(args)])
    if dim % 2:
        emb = torch.cat([emb, torch.zeros(1, dtype=torch.float64)])
    return emb.float()


def rope_inv_freq(head_dim, theta):
    """transformers' default inv_freq in float32."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def apply_rope(x, positions, inv_freq):
    """neox (rotate-half) RoPE of x [n, heads, hd] at positions [n]; angles in float32 as the engine."""
    angle = positions.float()[:, None] * inv_freq[None, :]  # float32 product
    cos = torch.cos(angle.to(x.dtype))[:, None, :]
    sin = torch.sin(angle.to(x.dtype))[:, None, :]
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def canonical_eigh(gram):
    """Eigen-decomposition of a symmetric PSD matrix, canonical: eigenvalues descending (negatives clamped
    to 0), each eigenvector's largest-magnitude entry (first on ties) positive."""
    lam, u = torch.linalg.eigh(gram.double())
    lam = lam.flip(0).clamp(min=0.0)
    u = u.flip(1)
    idx = u.abs().argmax(dim=0)
    sign = torch.sign(u[idx, torch.arange(u.shape[1])])
    sign[sign == 0] = 1
    return lam, u * sign[None, :]


# The seed's noise rows are keyed by position; blockspec keys slot k of a block anchored at p by the
# slot's own position p + 1 + k (stream 0: eigenbasis noise of the folded one-jump step, stream 1: the
# vocabulary-sized state of the exact path). The generator itself (splitmix64 + Box-Muller) lives in the
# engine's backend (seeded_normal); goldens feed their noise explicitly instead.


# ----------------------------------------------------------------------------------------------------------
# The reference model
# ----------------------------------------------------------------------------------------------------------


def load_config(ckpt_dir):
    with open(os.path.join(ckpt_dir, "config.json")) as f:
        return json.load(f)


def rope_theta(cfg):
    rp = cfg.get("rope_parameters") or {}
    return float(rp.get("rope_theta", cfg.get("rope_theta", 1e4)))


def hot_ids_from_folder(ckpt_dir, cfg, weights):
    """Draft vocabulary (sorted target ids) or None: d2t in the weights, else draft_vocab.safetensors."""
    vocab = int(cfg["vocab_size"])
    size = int(cfg.get("draft_vocab_size") or vocab)
    if size == vocab:
        return None
    if "d2t" in weights:
        d2t = weights["d2t"].long()
    else:
        dv, _ = read_safetensors(os.path.join(ckpt_dir, "draft_vocab.safetensors"))
        hot = dv["ids"][:size].long().sort().values
        d2t = hot - torch.arange(size)
    return torch.arange(size) + d2t


class FlashMapRef:
    def __init__(self, cfg, weights, embed, lm_head, hot_ids=None, device="cpu", dtype=torch.float64):
        self.cfg = cfg
        self.dev, self.dt = torch.device(device), dtype
        w = {k: v.to(self.dev, self.dt) for k, v in weights.items() if k != "d2t"}
        self.w = w
        self.vocab = int(cfg["vocab_size"])
        self.E = embed[: self.vocab].to(self.dev, self.dt)  # [V, Ht]
        self.lm_head = lm_head[: self.vocab].to(self.dev, self.dt)  # [V, Ht]
        self.target_vocab = embed.shape[0]
        self.hot_ids = None if hot_ids is None else hot_ids.to(self.dev)
        self.D = int(cfg["hidden_size"])
        self.Ht = int(cfg["target_hidden_size"])
        self.L = int(cfg["num_hidden_layers"])
        self.H = int(cfg["num_attention_heads"])
        self.hd = int(cfg.get("head_dim") or self.D // self.H)
        self.B = int(cfg["block_size"])
        self.rms_eps = float(cfg["rms_norm_eps"])
        self.qk_eps = float(cfg["qk_norm_eps"])
        self.ln_eps = float(cfg["adaln_eps"])
        self.freq_dim = int(cfg.get("timestep_frequency_dim") or cfg["timestep_embed_dim"])
        self.inv_freq = rope_inv_freq(self.hd, rope_theta(cfg)).to(self.dev)

    # -- blocks --
    def rms(self, x, name):
        """FlashMap RMSNorm x * (w * rsqrt(mean(x^2) + eps)); q/k norms use qk_norm_eps."""
        weight = self.w[name]
        eps = self.qk_eps if name.endswith(("q_norm.weight", "k_norm.weight")) else self.rms_eps
        return x * (weight * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))

    def lin(self, x, name, bias=True):
        y = x @ self.w[name + ".weight"].T
        if bias:
            y = y + self.w[name + ".bias"]
        return y

    def ln(self, x):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=self.ln_eps)

    def timestep(self, prefix, t):
        emb = timestep_sinusoid(t, self.freq_dim).to(self.dev, self.dt)
        return self.lin(torch.nn.functional.silu(self.lin(emb, prefix + ".linear_1")), prefix + ".linear_2")

    def adaln(self, name, cond):
        return self.lin(torch.nn.functional.silu(cond), name + ".linear").chunk(3, dim=-1)  # scale, shift, gate

    def grid(self, num_steps):
        return [float(t) for t in self.cfg["time_grids"][num_steps - 1]]

    def noise_gate(self, t0, t1):
        g = float(self.w["noise_gate"].reshape(-1)[0])
        return g * (t1 - t0) if self.cfg["noise_gate"] == "jump" else g

    def cond(self, t0, t1):
        s = float(self.cfg["time_scale"])
        return self.timestep("time_embed", t0 * s) + self.timestep("jump_embed", t1 * s)

    def heads(self, x):
        return x.reshape(x.shape[0], self.H, self.hd)

    def attend(self, q, k, v):
        """Non-causal attention of q [n, H, hd] over k, v [m, H, hd]."""
        scores = torch.einsum("nhd,mhd->hnm", q, k) * self.hd**-0.5
        p = torch.softmax(scores, dim=-1)
        return torch.einsum("hnm,mhd->nhd", p, v).reshape(q.shape[0], self.H * self.hd)

    # -- context --
    def context_kv(self, taps, anchor):
        """Per layer (K, V) [p+1, H, hd] for context positions 0..p-1 (taps) and the anchor at p."""
        p = taps.shape[0]
        ctx = self.rms(taps.to(self.dev, self.dt) @ self.w["fc.weight"].T, "hidden_norm.weight")
        a = self.rms(self.lin(self.E[anchor][None, :], "anchor_proj"), "anchor_norm.weight")
        rows = torch.cat([ctx, a])
        pos = torch.arange(p + 1, device=self.dev)
        kv = []
        for i in range(self.L):
            pre = "layers.%d.cross_attn." % i
            k = self.rms(self.heads(rows @ self.w[pre + "k_proj.weight"].T), pre + "k_norm.weight")
            k = apply_rope(k, pos, self.inv_freq)
            v = self.heads(rows @ self.w[pre + "v_proj.weight"].T)
            kv.append((k, v))
        return kv

    # -- DiT --
    def dit(self, h, slot_pos, t0, t1, kv):
        cond = self.cond(t0, t1)
        for i in range(self.L):
            pre = "layers.%d." % i
            sc, sh, g = self.adaln(pre + "self_attn_adaln", cond)
            n = self.ln(h) * (1 + sc) + sh
            a = pre + "self_attn."
            q = apply_rope(self.rms(self.heads(n @ self.w[a + "q_proj.weight"].T), a + "q_norm.weight"),
                           slot_pos, self.inv_freq)
            k = apply_rope(self.rms(self.heads(n @ self.w[a + "k_proj.weight"].T), a + "k_norm.weight"),
                           slot_pos, self.inv_freq)
            v = self.heads(n @ self.w[a + "v_proj.weight"].T)
            h = h + g * (self.attend(q, k, v) @ self.w[a + "o_proj.weight"].T)

            sc, sh, g = self.adaln(pre + "cross_attn_adaln", cond)
            n = self.ln(h) * (1 + sc) + sh
            c = pre + "cross_attn."
            q = apply_rope(self.rms(self.heads(n @ self.w[c + "q_proj.weight"].T), c + "q_norm.weight"),
                           slot_pos, self.inv_freq)
            ck, cv = kv[i]
            h = h + g * (self.attend(q, ck, cv) @ self.w[c + "o_proj.weight"].T)

            sc, sh, g = self.adaln(pre + "mlp_adaln", cond)
            n = self.ln(h) * (1 + sc) + sh
            m = torch.nn.functional.gelu(self.lin(n, pre + "mlp.fc1"))  # erf form
            h = h + g * self.lin(m, pre + "mlp.fc2")
        sc, sh, _ = self.adaln("final_adaln", cond)
        return self.ln(h) * (1 + sc) + sh

    def head_logits(self, h, rows=None):
        """lm_head[rows] · head(h): [B, |rows|] (all drafter-vocab rows when rows is None)."""
        y = self.lin(h, "head")
        lm = self.lm_head if rows is None else self.lm_head[rows]
        return y @ lm.T

    def scatter(self, logits):
        """[B, V'] draft-vocab logits -> [B, target vocab] with -inf outside."""
        out = torch.full((logits.shape[0], self.target_vocab), float("-inf"), device=self.dev, dtype=self.dt)
        ids = self.hot_ids if self.hot_ids is not None else torch.arange(self.vocab, device=self.dev)
        out[:, ids] = logits
        return out

    # -- draft step, exact algorithm (any number of jumps) --
    def draft_logits(self, taps, anchor, num_steps, state_noise, noise_scale=1.0):
        """taps [p, n_aux*Ht] (context positions 0..p-1), anchor token at p, state_noise [B, V]."""
        p = taps.shape[0]
        kv = self.context_kv(taps, anchor)
        slot_pos = p + 1 + torch.arange(self.B, device=self.dev)
        grid = self.grid(num_steps)
        state = state_noise.to(self.dev, self.dt) * noise_scale
        for n in range(num_steps):
            t0, t1 = grid[n], grid[n + 1]
            e = t0 / max(1.0 - t0, 1e-3) ** 2
            post = torch.softmax(state * e, dim=-1)
            emb = self.rms(post @ self.E, "state_norm.weight") + self.noise_gate(t0, t1) * self.rms(
                state @ self.E, "noise_norm.weight")
            h = self.dit(self.lin(emb, "x_embed"), slot_pos, t0, t1, kv)
            if n + 1 < num_steps:
                delta = torch.softmax(self.head_logits(h), dim=-1)
                state = ((1.0 - t1) * state + (t1 - t0) * delta) / (1.0 - t0)
        return self.scatter(self.head_logits(h, self.hot_ids))

    # -- the folded one-jump path (only to check the fold; needs t_0 = 0) --
    def eigenbasis(self):
        lam, u = canonical_eigh(self.E.T.double() @ self.E.double())
        return lam.to(self.dev), u.to(self.dev)

    def eigen_noise(self, x0):
        """z with U Λ^½ z = Eᵀ x0 (zero on null directions): the eigenbasis noise whose folded read-out
        equals x0's."""
        lam, u = self.eigenbasis()
        proj = (x0.to(self.dev).double() @ self.E.double()) @ u  # [B, Ht]
        keep = lam > lam.max() * 1e-12
        z = torch.zeros_like(proj)
        z[:, keep] = proj[:, keep] / lam[keep].sqrt()
        return z

    def one_jump_folded(self, taps, anchor, z, noise_scale=1.0):
        grid = self.grid(1)
        assert grid[0] == 0.0, "the folded one-jump path needs t_0 = 0"
        lam, u = self.eigenbasis()
        lam, u = lam.to(self.dt), u.to(self.dt)
        uniform = torch.full((1, self.vocab), 1.0 / self.vocab, device=self.dev, dtype=self.dt)
        first_hidden = self.lin(self.rms(uniform @ self.E, "state_norm.weight"), "x_embed")[0]
        noise_embed = (self.w["x_embed.weight"] * self.w["noise_norm.weight"][None, :]) @ u * lam.sqrt()[None, :]
        eig = lam / self.Ht
        z = z.to(self.dev, self.dt) * noise_scale
        rms = torch.rsqrt((z * z) @ eig + self.rms_eps)
        g = self.noise_gate(grid[0], grid[1])
        hidden = first_hidden + (g * rms)[:, None] * (z @ noise_embed.T)
        p = taps.shape[0]
        kv = self.context_kv(taps, anchor)
        slot_pos = p + 1 + torch.arange(self.B, device=self.dev)
        h = self.dit(hidden, slot_pos, grid[0], grid[1], kv)
        return self.scatter(self.head_logits(h, self.hot_ids))


def load_reference(ckpt_dir, target_dir, device="cpu", dtype=torch.float64):
    cfg = load_config(ckpt_dir)
    weights, _ = read_safetensors(os.path.join(ckpt_dir, "model.safetensors"))
    target, _ = read_safetensors(os.path.join(target_dir, "model.safetensors"))
    embed = target["model.embed_tokens.weight"].float()
    lm_head = target["lm_head.weight"].float() if "lm_head.weight" in target else embed
    hot = hot_ids_from_folder(ckpt_dir, cfg, weights)
    weights = {k: v.float() for k, v in weights.items() if k not in ("embed_tokens.weight", "lm_head.weight", "t2d")}
    return FlashMapRef(cfg, weights, embed, lm_head, hot, device, dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    ref = load_reference(args.ckpt, args.target, args.device)
    gen = torch.Generator().manual_seed(0)
    n_aux = len(ref.cfg["eagle_aux_hidden_state_layer_ids"])
    taps = torch.randn(7, n_aux * ref.Ht, generator=gen)
    x0 = torch.randn(ref.B, ref.vocab, generator=gen)
    exact = ref.draft_logits(taps, 5, 1, x0)
    folded = ref.one_jump_folded(taps, 5, ref.eigen_noise(x0))
    fin = torch.isfinite(exact)
    err = (exact[fin] - folded[fin]).abs().max().item()
    print("one jump: folded vs unfolded max |diff| = %.3g (max |logit| %.3g)" % (err, exact[fin].abs().max()))
    for n in range(1, len(ref.cfg["time_grids"]) + 1):
        y = ref.draft_logits(taps, 5, n, x0)
        print("%d jump(s): argmax %s" % (n, y.argmax(-1).tolist()))
    assert err < 1e-8 * max(1.0, exact[fin].abs().max().item())


if __name__ == "__main__":
    main()
