#!/usr/bin/env python3
"""Train a FlashMap drafter for stories260K (specs/flashmap.md §2, §5; seed 000's model) and export it
in the checkpoint format of tools/reference/flashmap_ref.py / src/models/drafters/flashmap.cc
(config.json + model.safetensors, F32, seed 000's tensor names, docs/FLASHMAP.md's conventions).

    python3 tools/train/flashmap.py --data OUT/data.pt --out OUT/stories260K-flashmap \
        --device cuda --seed 0 --teacher-steps 4000 --teacher-budget 100 \
        --distill-steps 1500 --distill-budget 100

Model (as the reference computes it, batched over many blocks): context rows hidden_norm(fc(taps))
at positions < p and the anchor row anchor_norm(anchor_proj(E[x_p])) at p are the cross-attention
keys/values; B slots at positions p+1..p+B hold a vocabulary-sized state x (per slot, R^V) embedded
as state_norm(softmax(e x) @ E) + g noise_norm(x @ E), e = s / (1-s)^2, g = noise_gate (t - s)
("jump" gate); x_embed; AdaLN-zero DiT layers (block self-attention, cross-attention, GELU MLP)
conditioned on time_embed(s * time_scale) + jump_embed(t * time_scale); final AdaLN; the head
(D -> Ht) then the target's frozen LM head. delta_{s,t}(x) = softmax(logits) is the two-time
denoiser; one jump X_{s,t}(x) = ((1-t) x + (t-s) delta) / (1-s).

Training, two stages (all times gamma: x_gamma = gamma onehot + (1 - gamma) noise):
  A. teacher (conditional flow model / denoiser D_s = delta_{s,s}): random anchors and target
     blocks as DFlash (§6.1), gamma = LUT(alpha), alpha ~ U[0,1] (FMLM's decoding-error time
     reparameterisation, K = V) with prob. 0.8, else gamma ~ U[0,1]; position-decayed CE of the
     block tokens x_{p+1..p+B}. jump_embed is held at zero (its last layer zero-initialised and
     frozen), so D depends on s only.
  B. flow-map distillation (student initialised from the teacher; jump_embed now trained from its
     zero last layer): teacher trajectories x_{gamma_k} of the probability-flow ODE by Euler steps
     on the fine grid gamma_k = LUT(k / K), k = 0..K (K = 12), from x_0 ~ N(0, I_V); for an (s, t)
     pair of the deployed jump grids, the exact flow-map target from the trajectory is
     delta*_{s,t} = ((1-s) x_t - (1-t) x_s) / (t - s) (a convex combination of the teacher's
     denoisers along the path; = x_1 = the teacher's final denoiser output when t = 1). Loss: soft
     CE(delta*_{s,t}, delta_theta(x_s; s, t)), position-decayed, (s, t) = (0, 1) with prob. 0.4,
     else one of the 2-, 3- and 4-jump grid intervals.
Jump grids (config time_grids, entry n-1 for n jumps): gamma at alpha = j/n, j = 0..n.
"""

import argparse
import copy
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import dflash  # noqa: E402  (anchor sampler)

SINUSOID_MAX_PERIOD = 10000.0


def timestep_sinusoid(t, dim):
    """t [...] (already scaled) -> [..., dim]: [cos(t f), sin(t f)], f_i = 1e4^(-i/h), h = dim//2
    (docs/FLASHMAP.md; flashmap_ref.timestep_sinusoid)."""
    half = dim // 2
    i = torch.arange(half, dtype=torch.float64, device=t.device)
    freqs = torch.exp(-math.log(SINUSOID_MAX_PERIOD) * i / half)
    args = t.double()[..., None] * freqs
    emb = torch.cat([torch.cos(args), torch.sin(args)], -1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[..., :1])], -1)
    return emb.float()


def layer_norm(x, eps):
    return F.layer_norm(x, (x.shape[-1],), eps=eps)


class FlashMapDrafter(common.ParamModule):
    def __init__(self, target, hidden=128, layers=2, heads=8, head_dim=16, inter=256, temb=64,
                 freq_dim=64, block_size=15, taps=(1, 2, 3), time_scale=1000.0, grids=None,
                 num_steps=1, eps=1e-6):
        super().__init__()
        self.D, self.Ht, self.V = hidden, target.H, target.V
        self.n_layers, self.heads, self.hd = layers, heads, head_dim
        self.inter, self.C, self.Fq = inter, temb, freq_dim
        self.B, self.taps = block_size, list(taps)
        self.time_scale, self.grids, self.num_steps = time_scale, grids, num_steps
        self.rms_eps = self.qk_eps = self.ln_eps = eps
        self.rope_theta = 10000.0
        self.embed = target.embed
        self.lm_head = target.lm_head
        self.tcfg = target.cfg
        self.register_buffer("inv_freq", common.rope_inv_freq(head_dim, self.rope_theta,
                                                              target.dev), persistent=False)
        P = nn.ParameterDict()
        D, Ht, C, HD = hidden, target.H, temb, heads * head_dim

        def lin(name, o, i, bias=True, zero=False):
            std = 1.0 / math.sqrt(i)
            P[name.replace(".", "__") + "__weight"] = nn.Parameter(
                torch.zeros(o, i) if zero else torch.randn(o, i) * std)
            if bias:
                P[name.replace(".", "__") + "__bias"] = nn.Parameter(torch.zeros(o))

        def norm(name, d):
            P[name.replace(".", "__") + "__weight"] = nn.Parameter(torch.ones(d))

        lin("fc", D, len(self.taps) * Ht, bias=False)
        norm("hidden_norm", D)
        lin("anchor_proj", D, Ht)
        norm("anchor_norm", D)
        norm("state_norm", Ht)
        norm("noise_norm", Ht)
        P["noise_gate"] = nn.Parameter(torch.ones(1))
        lin("x_embed", D, Ht)
        for t in ("time_embed", "jump_embed"):
            lin(t + ".linear_1", C, freq_dim)
            lin(t + ".linear_2", C, C, zero=(t == "jump_embed"))
        for i in range(layers):
            p = "layers.%d." % i
            for a in ("self_attn_adaln", "cross_attn_adaln", "mlp_adaln"):
                lin(p + a + ".linear", 3 * D, C, zero=True)  # AdaLN-zero
            for a in ("self_attn", "cross_attn"):
                for proj in ("q_proj", "k_proj", "v_proj"):
                    lin(p + a + "." + proj, HD, D, bias=False)
                lin(p + a + ".o_proj", D, HD, bias=False)
                norm(p + a + ".q_norm", head_dim)
                norm(p + a + ".k_norm", head_dim)
            lin(p + "mlp.fc1", inter, D)
            lin(p + "mlp.fc2", D, inter)
        lin("final_adaln.linear", 3 * D, C, zero=True)
        lin("head", Ht, D)
        # Start the head at the target's final norm scale, as a drafter reading the LM head.
        with torch.no_grad():
            P["head__weight"].mul_(0.3 * target.w["model.norm.weight"].cpu()[:, None])
        self.P = P
        self.to(target.dev)

    def config(self):
        c = self.tcfg
        return {
            "architectures": ["FlashMapDraftModel"],
            "model_type": "flashmap",
            "hidden_size": self.D,
            "target_hidden_size": self.Ht,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.heads,
            "head_dim": self.hd,
            "intermediate_size": self.inter,
            "timestep_embed_dim": self.C,
            "timestep_frequency_dim": self.Fq,
            "time_scale": self.time_scale,
            "time_grids": self.grids,
            "num_steps": self.num_steps,
            "noise_gate": "jump",
            "adaln_eps": self.ln_eps,
            "qk_norm_eps": self.qk_eps,
            "rms_norm_eps": self.rms_eps,
            "block_size": self.B,
            # vLLM capture semantics: "input of layer id" = residual after layer id - 1.
            "eagle_aux_hidden_state_layer_ids": [i + 1 for i in self.taps],
            "vocab_size": c["vocab_size"],
            "rope_theta": self.rope_theta,
            "bos_token_id": c.get("bos_token_id"),
            "eos_token_id": c.get("eos_token_id"),
            "torch_dtype": "float32",
        }

    # -- pieces --
    def lin(self, x, name, bias=True):
        y = x @ self.w(name + ".weight").T
        return y + self.w(name + ".bias") if bias else y

    def rms(self, x, name, eps):
        wt = self.w(name + ".weight")
        return x * (wt * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))

    def temb(self, prefix, t):
        e = timestep_sinusoid(t * self.time_scale, self.Fq)
        return self.lin(F.silu(self.lin(e, prefix + ".linear_1")), prefix + ".linear_2")

    def adaln(self, name, cond):
        return self.lin(F.silu(cond), name + ".linear").chunk(3, -1)

    def context(self, feats):
        """Context rows [N, L, D] (fc + hidden_norm), computed once per batch."""
        return self.rms(feats @ self.w("fc.weight").T, "hidden_norm", self.rms_eps)

    def embed_state(self, state, s, t):
        """state [N, A, B, V]; s, t [N, A] -> x_embed input [N, A, B, D]."""
        e = (s / (1.0 - s).clamp_min(1e-3) ** 2)[:, :, None, None]
        post = torch.softmax(state * e, -1)
        g = (self.w("noise_gate") * (t - s))[:, :, None, None]
        emb = (self.rms(post @ self.embed, "state_norm", self.rms_eps)
               + g * self.rms(state @ self.embed, "noise_norm", self.rms_eps))
        return self.lin(emb, "x_embed")

    def forward(self, ctx, tokens, anchors, state, s, t):
        """ctx [N, L, D] context rows of positions 0..L-1; tokens [N, L]; anchors [N, A] (p); state
        [N, A, B, V] at time s; s, t [N, A]. Block (n, a) cross-attends to context rows j < p and
        its anchor row at p; its slots sit at p+1..p+B. Returns logits [N, A, B, V]."""
        N, L, D = ctx.shape
        A, B = anchors.shape[1], state.shape[2]
        H, hd = self.heads, self.hd
        dev = ctx.device
        h = self.embed_state(state, s, t)
        cond = self.temb("time_embed", s) + self.temb("jump_embed", t)  # [N, A, C]
        slot_pos = anchors[:, :, None] + 1 + torch.arange(B, device=dev)  # [N, A, B]
        anc_tok = torch.gather(tokens, 1, anchors)
        anc = self.rms(self.lin(self.embed[anc_tok], "anchor_proj"), "anchor_norm", self.rms_eps)
        ctx_pos = torch.arange(L, device=dev)
        neg = torch.finfo(ctx.dtype).min
        ctx_bias = torch.zeros(N, A, L, device=dev).masked_fill(
            ctx_pos[None, None, :] >= anchors[:, :, None], neg)[:, None, :, None, :]
        scale = hd ** -0.5
        for i in range(self.n_layers):
            p = "layers.%d." % i
            # block self-attention (non-causal within the block)
            sc, sh, g = [m[:, :, None, :] for m in self.adaln(p + "self_attn_adaln", cond)]
            n = layer_norm(h, self.ln_eps) * (1 + sc) + sh
            a = p + "self_attn."
            q = common.rope(self.rms(self.lin(n, a + "q_proj", False).view(N, A, B, H, hd),
                                     a + "q_norm", self.qk_eps), slot_pos, self.inv_freq)
            k = common.rope(self.rms(self.lin(n, a + "k_proj", False).view(N, A, B, H, hd),
                                     a + "k_norm", self.qk_eps), slot_pos, self.inv_freq)
            v = self.lin(n, a + "v_proj", False).view(N, A, B, H, hd)
            att = torch.softmax(torch.einsum("nabhd,nachd->nhabc", q, k) * scale, -1)
            o = torch.einsum("nhabc,nachd->nabhd", att, v).reshape(N, A, B, H * hd)
            h = h + g * self.lin(o, a + "o_proj", False)
            # cross-attention to the context rows j < p and the anchor row
            sc, sh, g = [m[:, :, None, :] for m in self.adaln(p + "cross_attn_adaln", cond)]
            n = layer_norm(h, self.ln_eps) * (1 + sc) + sh
            c = p + "cross_attn."
            q = common.rope(self.rms(self.lin(n, c + "q_proj", False).view(N, A, B, H, hd),
                                     c + "q_norm", self.qk_eps), slot_pos, self.inv_freq)
            kc = common.rope(self.rms(self.lin(ctx, c + "k_proj", False).view(N, L, H, hd),
                                      c + "k_norm", self.qk_eps), ctx_pos, self.inv_freq)
            vc = self.lin(ctx, c + "v_proj", False).view(N, L, H, hd)
            ka = common.rope(self.rms(self.lin(anc, c + "k_proj", False).view(N, A, H, hd),
                                      c + "k_norm", self.qk_eps), anchors, self.inv_freq)
            va = self.lin(anc, c + "v_proj", False).view(N, A, H, hd)
            s_c = torch.einsum("nabhd,nlhd->nhabl", q, kc) * scale + ctx_bias
            s_a = torch.einsum("nabhd,nahd->nhab", q, ka)[..., None] * scale
            att = torch.softmax(torch.cat([s_c, s_a], -1), -1)
            o = (torch.einsum("nhabl,nlhd->nabhd", att[..., :L], vc)
                 + att[..., L:].permute(0, 2, 3, 1, 4) * va[:, :, None])
            h = h + g * self.lin(o.reshape(N, A, B, H * hd), c + "o_proj", False)
            # MLP
            sc, sh, g = [m[:, :, None, :] for m in self.adaln(p + "mlp_adaln", cond)]
            n = layer_norm(h, self.ln_eps) * (1 + sc) + sh
            h = h + g * self.lin(F.gelu(self.lin(n, p + "mlp.fc1")), p + "mlp.fc2")
        sc, sh, _ = [m[:, :, None, :] for m in self.adaln("final_adaln", cond)]
        h = layer_norm(h, self.ln_eps) * (1 + sc) + sh
        return self.lin(h, "head") @ self.lm_head.T

    @torch.no_grad()
    def draft(self, ctx, tokens, anchors, noise, num_steps):
        """The inference algorithm (reference draft_logits) on blocks: noise [N, A, B, V] is the
        starting state (already scaled); returns the last jump's logits."""
        grid = self.grids[num_steps - 1]
        state = noise
        N, A = anchors.shape
        for n in range(num_steps):
            t0, t1 = grid[n], grid[n + 1]
            s = torch.full((N, A), t0, device=ctx.device)
            t = torch.full((N, A), t1, device=ctx.device)
            logits = self(ctx, tokens, anchors, state, s, t)
            if n + 1 < num_steps:
                delta = torch.softmax(logits, -1)
                state = ((1.0 - t1) * state + (t1 - t0) * delta) / (1.0 - t0)
        return logits


def export(model, out_dir, meta=None):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(model.config(), f, indent=2)
        f.write("\n")
    md = {"format": "pt", "producer": "blockspec tools/train/flashmap.py"}
    if meta:
        md.update(meta)
    common.write_safetensors(os.path.join(out_dir, "model.safetensors"),
                             model.state_dict_export(), md)


def load(out_dir, target):
    with open(os.path.join(out_dir, "config.json")) as f:
        c = json.load(f)
    m = FlashMapDrafter(target, hidden=c["hidden_size"], layers=c["num_hidden_layers"],
                        heads=c["num_attention_heads"], head_dim=c["head_dim"],
                        inter=c["intermediate_size"], temb=c["timestep_embed_dim"],
                        freq_dim=c.get("timestep_frequency_dim") or c["timestep_embed_dim"],
                        block_size=c["block_size"],
                        taps=[i - 1 for i in c["eagle_aux_hidden_state_layer_ids"]],
                        time_scale=c["time_scale"], grids=c["time_grids"],
                        num_steps=c["num_steps"], eps=c["rms_norm_eps"])
    m.load_export(common.read_safetensors(os.path.join(out_dir, "model.safetensors")))
    return m.eval()


def make_grids(lut, max_jumps=4):
    return [[float(x) for x in lut.gamma(np.arange(n + 1) / n)] for n in range(1, max_jumps + 1)]


def block_targets(tokens, anchors, B):
    N, L = tokens.shape
    pos = anchors[:, :, None] + 1 + torch.arange(B, device=tokens.device)
    valid = pos < L
    labels = torch.gather(tokens, 1, pos.clamp(max=L - 1).view(N, -1)).view(pos.shape)
    return labels, valid


def decay(B, gamma, device):
    return torch.exp(-torch.arange(B, device=device).float() / gamma)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--inter", type=int, default=256)
    ap.add_argument("--temb", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=15)
    ap.add_argument("--taps", default="1,2,3", help="target layers (residual after them)")
    ap.add_argument("--gamma", type=float, default=7.0, help="position decay")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--teacher-steps", type=int, default=4000)
    ap.add_argument("--teacher-budget", type=float, default=0.0)
    ap.add_argument("--distill-steps", type=int, default=1500)
    ap.add_argument("--distill-budget", type=float, default=0.0)
    ap.add_argument("--distill-lr", type=float, default=5e-4)
    ap.add_argument("--distill-batch", type=int, default=32)
    ap.add_argument("--distill-anchors", type=int, default=16)
    ap.add_argument("--ode-steps", type=int, default=12, help="fine grid K (multiple of 12)")
    ap.add_argument("--p-one-jump", type=float, default=0.4)
    ap.add_argument("--val", type=int, default=256)
    ap.add_argument("--log-every", type=int, default=200)
    a = ap.parse_args()
    log = common.Log("flashmap")
    dev = common.setup_device(a.device)
    common.seed_all(a.seed)
    target = common.Target(device=dev)
    data = common.load_data(a.data)
    toks = data["tokens"].long().to(dev)
    val, toks = toks[:a.val], toks[a.val:]
    n_rows, L = toks.shape
    taps = [int(x) for x in a.taps.split(",")]
    lut = common.TimeLUT(target.V)
    grids = make_grids(lut, 4)
    log("time grids (gamma): %s" % [[round(x, 4) for x in g] for g in grids])
    model = FlashMapDrafter(target, hidden=a.hidden, layers=a.layers, heads=a.heads,
                            head_dim=a.head_dim, inter=a.inter, temb=a.temb, freq_dim=a.temb,
                            block_size=a.block_size, taps=taps, grids=grids)
    n_params = sum(p.numel() for p in model.parameters())
    log("FlashMap drafter: D=%d, %d layers, B=%d, taps %s, %d params; data %d x %d" % (
        a.hidden, a.layers, a.block_size, taps, n_params, n_rows, L))
    B, V = a.block_size, target.V
    wdec = decay(B, a.gamma, dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    t_start = time.time()
    vgen = torch.Generator(device=dev)
    vgen.manual_seed(a.seed + 1)
    v_ctx_feats = target.forward(val, taps=taps)[1]
    v_anchors = dflash.sample_anchors(val.shape[0], L, a.anchors, vgen, dev)
    v_noise = torch.randn(val.shape[0], a.anchors, B, V, generator=vgen, device=dev)

    @torch.no_grad()
    def validate(steps_list, chunk=32):
        """Teacher-forced per-row top-1 / prefix-accept of the jump drafts on held-out blocks."""
        model.eval()
        res = {}
        for ns in steps_list:
            hits = []
            for i in range(0, val.shape[0], chunk):
                sl = slice(i, i + chunk)
                ctx = model.context(v_ctx_feats[sl])
                lg = model.draft(ctx, val[sl], v_anchors[sl], v_noise[sl], ns)
                lab, valid = block_targets(val[sl], v_anchors[sl], B)
                hits.append(((lg.argmax(-1) == lab) & valid).float().flatten(0, 1))
            hit = torch.cat(hits)
            res[ns] = (hit.mean(0), torch.cumprod(hit, -1).mean(0))
        model.train()
        return res

    def report(tag, res):
        for ns, (acc, run) in res.items():
            log("%s %d jump(s): top-1 rows %s | prefix-accept tau ~ %.2f" % (
                tag, ns, " ".join("%.2f" % x for x in acc[:8].tolist()), 1 + run.sum().item()))

    # ---------------- Stage A: teacher denoiser ----------------
    for name, p in model.P.items():
        if name.startswith("jump_embed"):
            p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    lut_a = torch.tensor(lut.a, device=dev, dtype=torch.float32)
    lut_g = torch.tensor(lut.g, device=dev, dtype=torch.float32)

    def lut_gamma(alpha):
        idx = torch.searchsorted(lut_a, alpha.contiguous()).clamp(1, lut_a.numel() - 1)
        a0, a1 = lut_a[idx - 1], lut_a[idx]
        g0, g1 = lut_g[idx - 1], lut_g[idx]
        return g0 + (g1 - g0) * ((alpha - a0) / (a1 - a0).clamp_min(1e-12))

    step = 0
    t0 = time.time()
    sched = common.Schedule(a.teacher_steps, a.teacher_budget)
    while True:
        prog = sched.progress(step)
        if prog >= 1.0:
            break
        lr = common.cosine_lr(prog, a.lr)
        for gr in opt.param_groups:
            gr["lr"] = lr
        idx = torch.randint(0, n_rows, (a.batch,), generator=gen, device=dev)
        tb = toks[idx]
        with torch.no_grad():
            feats = target.forward(tb, taps=taps)[1]
        anchors = dflash.sample_anchors(a.batch, L, a.anchors, gen, dev)
        labels, valid = block_targets(tb, anchors, B)
        u = torch.rand(a.batch, a.anchors, generator=gen, device=dev)
        gam = torch.where(torch.rand(a.batch, a.anchors, generator=gen, device=dev) < 0.8,
                          lut_gamma(u), u).clamp(0.0, 0.999)
        x1 = F.one_hot(labels, V).float()
        x0 = torch.randn(a.batch, a.anchors, B, V, generator=gen, device=dev)
        g4 = gam[:, :, None, None]
        xs = g4 * x1 + (1 - g4) * x0
        logits = model(model.context(feats), tb, anchors, xs, gam, gam)
        ce = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="none")
        w = wdec * valid
        loss = (ce.view(labels.shape) * w).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % a.log_every == 0:
            log("teacher step %5d (%.0f%%) lr %.2e loss %.4f gnorm %.2f" % (
                step, 100 * prog, lr, loss.item(), gn.item()))
        step += 1
    teacher_steps = step
    log("teacher done: %d steps in %.0f s" % (step, time.time() - t0))
    report("teacher(before distill)", validate([1, 2, 4]))

    # Teacher ODE sampler (Euler on the fine alpha grid), for reference and for stage B.
    K = a.ode_steps
    fine = [float(x) for x in lut.gamma(np.arange(K + 1) / K)]
    teacher = copy.deepcopy(model).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)

    @torch.no_grad()
    def trajectory(ctx, tb, anchors, x0):
        """States at every fine-grid time: list of K+1 tensors [N, A, B, V]."""
        xs = [x0]
        x = x0
        N, A = anchors.shape
        for k in range(K):
            s = torch.full((N, A), fine[k], device=dev)
            d = torch.softmax(teacher(ctx, tb, anchors, x, s, s), -1)
            x = x + (fine[k + 1] - fine[k]) * (d - x) / (1.0 - fine[k])
            xs.append(x)
        return xs

    @torch.no_grad()
    def teacher_ode_tau(chunk=32):
        hits = []
        for i in range(0, val.shape[0], chunk):
            sl = slice(i, i + chunk)
            ctx = teacher.context(v_ctx_feats[sl])
            xK = trajectory(ctx, val[sl], v_anchors[sl], v_noise[sl])[-1]
            lab, valid = block_targets(val[sl], v_anchors[sl], B)
            hits.append(((xK.argmax(-1) == lab) & valid).float().flatten(0, 1))
        hit = torch.cat(hits)
        return hit.mean(0), torch.cumprod(hit, -1).mean(0)

    acc, run = teacher_ode_tau()
    log("teacher ODE (%d Euler steps): top-1 rows %s | prefix-accept tau ~ %.2f" % (
        K, " ".join("%.2f" % x for x in acc[:8].tolist()), 1 + run.sum().item()))

    # ---------------- Stage B: flow-map distillation ----------------
    # (s, t) pairs of the deployed grids as fine-grid indices.
    pairs = []
    for n in (2, 3, 4):
        for j in range(n):
            pairs.append((j * K // n, (j + 1) * K // n))
    one = (0, K)
    for p in model.parameters():
        p.requires_grad_(True)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=a.distill_lr, betas=(0.9, 0.95), weight_decay=0.0)
    step = 0
    t0 = time.time()
    sched = common.Schedule(a.distill_steps, a.distill_budget)
    wdec_d = decay(B, a.gamma, dev)
    fine_t = torch.tensor(fine, device=dev)
    while True:
        prog = sched.progress(step)
        if prog >= 1.0:
            break
        lr = common.cosine_lr(prog, a.distill_lr)
        for gr in opt.param_groups:
            gr["lr"] = lr
        idx = torch.randint(0, n_rows, (a.distill_batch,), generator=gen, device=dev)
        tb = toks[idx]
        N, A = a.distill_batch, a.distill_anchors
        with torch.no_grad():
            feats = target.forward(tb, taps=taps)[1]
            anchors = dflash.sample_anchors(N, L, A, gen, dev)
            x0 = torch.randn(N, A, B, V, generator=gen, device=dev)
            ctx_t = teacher.context(feats)
            traj = torch.stack(trajectory(ctx_t, tb, anchors, x0))  # [K+1, N, A, B, V]
            # pair per block
            pick = torch.randint(0, len(pairs), (N, A), generator=gen, device=dev)
            si = torch.tensor([p[0] for p in pairs], device=dev)[pick]
            ti = torch.tensor([p[1] for p in pairs], device=dev)[pick]
            use_one = torch.rand(N, A, generator=gen, device=dev) < a.p_one_jump
            si = torch.where(use_one, torch.zeros_like(si), si)
            ti = torch.where(use_one, torch.full_like(ti, K), ti)
            ar_n = torch.arange(N, device=dev)[:, None]
            ar_a = torch.arange(A, device=dev)[None, :]
            x_s = traj[si, ar_n, ar_a]  # [N, A, B, V]
            x_t = traj[ti, ar_n, ar_a]
            s, t = fine_t[si], fine_t[ti]
            s4, t4 = s[:, :, None, None], t[:, :, None, None]
            tgt = ((1 - s4) * x_t - (1 - t4) * x_s) / (t4 - s4)
            tgt = tgt.clamp_min(0)
            tgt = tgt / tgt.sum(-1, keepdim=True)
            _, valid = block_targets(tb, anchors, B)
        logits = model(model.context(feats), tb, anchors, x_s, s, t)
        ce = -(tgt * torch.log_softmax(logits, -1)).sum(-1)
        w = wdec_d * valid
        loss = (ce * w).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % a.log_every == 0:
            log("distill step %5d (%.0f%%) lr %.2e loss %.4f gnorm %.2f gate %.3f" % (
                step, 100 * prog, lr, loss.item(), gn.item(), model.w("noise_gate").item()))
        step += 1
    distill_steps = step
    log("distill done: %d steps in %.0f s" % (step, time.time() - t0))
    res = validate([1, 2, 4])
    report("student", res)
    export(model, a.out, {"teacher_steps": teacher_steps, "distill_steps": distill_steps,
                          "seed": a.seed})
    with open(os.path.join(a.out, "train_log.json"), "w") as f:
        json.dump({"args": vars(a), "teacher_steps": teacher_steps,
                   "distill_steps": distill_steps, "params": n_params, "grids": grids,
                   "fine_grid": fine,
                   "val": {str(k): {"top1": v[0].tolist(), "prefix_accept": v[1].tolist()}
                           for k, v in res.items()},
                   "seconds": time.time() - t_start}, f, indent=1)
    log("exported %s" % a.out)


if __name__ == "__main__":
    main()
