#!/usr/bin/env python3
"""Train a DFlash drafter for stories260K (specs/dflash.md §1, §6.1) and export it in the public
DFlashDraftModel layout (config.json + model.safetensors, F32), as tools/reference/dflash_ref.py and
src/models/drafters/dflash.cc read it.

    python3 tools/train/dflash.py --data OUT/data.pt --out OUT/stories260K-dflash --device cuda \
        --seed 0 --steps 6000 --time-budget 150

Model (Qwen3-style, hidden = target hidden 64): fc [H, n_taps*H] + hidden_norm over the target's
residual stream after `--taps` layers (HF hidden_states[id+1]); per layer pre-norm attention whose
keys/values are [context rows ; block rows] (same k_proj/v_proj/k_norm), q/k per-head RMSNorm, neox
RoPE, SwiGLU MLP; final norm; the target's embedding (block tokens [anchor, MASK x (B-1)]) and LM
head (tied = embedding), both frozen and not exported.

Recipe (§6.1): every step takes --batch target-generated sequences, recomputes the target taps,
draws --anchors anchors per sequence uniformly without replacement from positions 1..L-2, and runs
all blocks in one forward with the DFlash block mask: the query of block b sees context keys
j < anchor_b and all B keys of its own block. Row k (1..B-1) predicts x_{p+k} with weight
exp(-(k-1)/gamma); loss = sum w CE / sum w. AdamW, warmup 4 %, cosine to 0, grad clip 1.0.
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class DFlashDrafter(common.ParamModule):
    def __init__(self, target, layers=2, block_size=16, taps=(1, 2, 3), heads=8, kv_heads=4,
                 head_dim=8, inter=256, eps=1e-6, mask_token_id=0, rope_theta=10000.0):
        super().__init__()
        H = target.H
        self.H, self.B, self.taps = H, block_size, list(taps)
        self.heads, self.kv_heads, self.hd = heads, kv_heads, head_dim
        self.inter, self.eps, self.mask_id = inter, eps, mask_token_id
        self.rope_theta = rope_theta
        self.n_layers = layers
        self.embed = target.embed  # frozen, not a parameter
        self.lm_head = target.lm_head
        self.register_buffer("inv_freq", common.rope_inv_freq(head_dim, rope_theta,
                                                              target.dev), persistent=False)
        P = nn.ParameterDict()
        std = 0.02

        def lin(name, o, i):
            P[name.replace(".", "__")] = nn.Parameter(torch.randn(o, i) * std)

        def norm(name, d):
            P[name.replace(".", "__")] = nn.Parameter(torch.ones(d))

        lin("fc.weight", H, len(self.taps) * H)
        norm("hidden_norm.weight", H)
        for i in range(layers):
            p = "layers.%d." % i
            norm(p + "input_layernorm.weight", H)
            lin(p + "self_attn.q_proj.weight", heads * head_dim, H)
            lin(p + "self_attn.k_proj.weight", kv_heads * head_dim, H)
            lin(p + "self_attn.v_proj.weight", kv_heads * head_dim, H)
            lin(p + "self_attn.o_proj.weight", H, heads * head_dim)
            norm(p + "self_attn.q_norm.weight", head_dim)
            norm(p + "self_attn.k_norm.weight", head_dim)
            norm(p + "post_attention_layernorm.weight", H)
            lin(p + "mlp.gate_proj.weight", inter, H)
            lin(p + "mlp.up_proj.weight", inter, H)
            lin(p + "mlp.down_proj.weight", H, inter)
        norm("norm.weight", H)
        # The drafter's output goes through the target's LM head: start from the target's final
        # norm weight so the initial logits have the target's scale.
        P["norm__weight"].data.copy_(target.w["model.norm.weight"])
        self.P = P
        self.to(target.dev)

    def config(self, target):
        c = target.cfg
        return {
            "architectures": ["DFlashDraftModel"],
            "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
            "model_type": "qwen3",
            "hidden_size": self.H,
            "intermediate_size": self.inter,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.hd,
            "hidden_act": "silu",
            "rms_norm_eps": self.eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "max_position_embeddings": c["max_position_embeddings"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": self.n_layers,
            "layer_types": ["full_attention"] * self.n_layers,
            "vocab_size": c["vocab_size"],
            "bos_token_id": c.get("bos_token_id"),
            "eos_token_id": c.get("eos_token_id"),
            "block_size": self.B,
            "num_target_layers": c["num_hidden_layers"],
            "dflash_config": {"target_layer_ids": self.taps, "mask_token_id": self.mask_id},
            "torch_dtype": "float32",
        }

    def forward(self, feats, tokens, anchors, num_rows=None, first_row=1, conv=None):
        """feats [N, L, n_taps*H] target taps of positions 0..L-1; tokens [N, L]; anchors [N, A]
        (anchor positions p, the block occupies p..p+B-1). Context of block (n, a) = positions
        j < p. Returns the final-normed hidden of rows first_row..B-1: [N, A, B-first_row, H]
        (DFlash reads rows 1..B-1; DSpark's shifted layout, tools/train/dspark.py, all B).
        conv: DFlash2's sublayer convolutions (tools/train/dflash2.py), an object with
        prepare(layer, sublayer, x [N, A, B, H]) -> (x', state) and finish(layer, sublayer, out,
        state) -> out' around both sublayers of every layer."""
        B = self.B if num_rows is None else num_rows
        N, L, _ = feats.shape
        A = anchors.shape[1]
        h_, kvh, hd = self.heads, self.kv_heads, self.hd
        g = h_ // kvh
        eps = self.eps
        ctx = common.rms_norm(feats @ self.w("fc.weight").T, self.w("hidden_norm.weight"), eps)
        anchor_tok = torch.gather(tokens, 1, anchors)  # [N, A]
        blk_tok = torch.full((N, A, B), self.mask_id, dtype=torch.long, device=feats.device)
        blk_tok[:, :, 0] = anchor_tok
        h = self.embed[blk_tok]  # [N, A, B, H]
        blk_pos = anchors[:, :, None] + torch.arange(B, device=feats.device)  # [N, A, B]
        ctx_pos = torch.arange(L, device=feats.device)
        ctx_mask = ctx_pos[None, None, :] < anchors[:, :, None]  # [N, A, L]
        neg = torch.finfo(feats.dtype).min
        ctx_bias = torch.zeros(N, A, L, device=feats.device).masked_fill(~ctx_mask, neg)
        ctx_bias = ctx_bias[:, None, :, None, :]  # [N, 1, A, 1, L]
        scale = 1.0 / math.sqrt(hd)
        for i in range(self.n_layers):
            p = "layers.%d." % i
            x = common.rms_norm(h, self.w(p + "input_layernorm.weight"), eps)
            if conv is not None:
                x, st = conv.prepare(i, 0, x)
            q = (x @ self.w(p + "self_attn.q_proj.weight").T).view(N, A, B, h_, hd)
            q = common.rope(common.rms_norm(q, self.w(p + "self_attn.q_norm.weight"), eps),
                            blk_pos, self.inv_freq)
            kw, vw = self.w(p + "self_attn.k_proj.weight"), self.w(p + "self_attn.v_proj.weight")
            kn = self.w(p + "self_attn.k_norm.weight")
            kc = common.rope(common.rms_norm((ctx @ kw.T).view(N, L, kvh, hd), kn, eps),
                             ctx_pos, self.inv_freq)
            vc = (ctx @ vw.T).view(N, L, kvh, hd)
            kb = common.rope(common.rms_norm((x @ kw.T).view(N, A, B, kvh, hd), kn, eps),
                             blk_pos, self.inv_freq)
            vb = (x @ vw.T).view(N, A, B, kvh, hd)
            kc, vc = kc.repeat_interleave(g, 2), vc.repeat_interleave(g, 2)
            kb, vb = kb.repeat_interleave(g, 3), vb.repeat_interleave(g, 3)
            sc = torch.einsum("nabhd,nlhd->nhabl", q, kc) * scale + ctx_bias
            sb = torch.einsum("nabhd,nachd->nhabc", q, kb) * scale
            att = torch.softmax(torch.cat([sc, sb], -1), -1)
            o = (torch.einsum("nhabl,nlhd->nabhd", att[..., :L], vc)
                 + torch.einsum("nhabc,nachd->nabhd", att[..., L:], vb))
            o = o.reshape(N, A, B, h_ * hd) @ self.w(p + "self_attn.o_proj.weight").T
            h = h + (conv.finish(i, 0, o, st) if conv is not None else o)
            y = common.rms_norm(h, self.w(p + "post_attention_layernorm.weight"), eps)
            if conv is not None:
                y, st = conv.prepare(i, 1, y)
            m = F.silu(y @ self.w(p + "mlp.gate_proj.weight").T) * (
                y @ self.w(p + "mlp.up_proj.weight").T)
            m = m @ self.w(p + "mlp.down_proj.weight").T
            h = h + (conv.finish(i, 1, m, st) if conv is not None else m)
        return common.rms_norm(h[:, :, first_row:], self.w("norm.weight"), eps)

    def logits(self, hidden):
        return hidden @ self.lm_head.T

    # Drafts of one block per row (tools/train/eval.py): DFlash proposes the argmax of rows
    # 1..B-1 with a one-hot proposal (q = None), at every temperature, as the engine does.
    num_drafts = property(lambda self: self.B - 1)

    @torch.no_grad()
    def propose(self, feats, tokens, anchors, temp, gen):
        """anchors [N, 1] -> drafts [N, num_drafts], q [N, num_drafts, V] or None (one-hot)."""
        return self.logits(self(feats, tokens, anchors))[:, 0].argmax(-1), None


def export(model, target, out_dir, meta=None):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(model.config(target), f, indent=2)
        f.write("\n")
    md = {"format": "pt", "producer": "blockspec tools/train/dflash.py"}
    if meta:
        md.update(meta)
    common.write_safetensors(os.path.join(out_dir, "model.safetensors"),
                             model.state_dict_export(), md)


def finish(model, target, a, step, t0, log, val_loss, **fields):
    """Export (config.json + model.safetensors with steps / seed / val_loss / producer in its
    metadata), train_log.json with `fields`, and the closing log line."""
    export(model, target, a.out, {"steps": step, "seed": a.seed, "val_loss": "%.4f" % val_loss,
                                  "producer": "blockspec tools/train/%s.py" % log.tag})
    common.write_train_log(a.out, a, steps=step, params=sum(p.numel() for p in model.parameters()),
                           val_loss=val_loss, seconds=time.time() - t0, **fields)
    log("exported %s" % a.out)


def read_config(out_dir):
    with open(os.path.join(out_dir, "config.json")) as f:
        return json.load(f)


def load(out_dir, target, cls=None, **extra):
    """An exported drafter of this family (cls: DFlashDrafter or a subclass, built with the
    backbone fields of config.json plus `extra`)."""
    c = read_config(out_dir)
    dc = c["dflash_config"]
    m = (cls or DFlashDrafter)(
        target, layers=c["num_hidden_layers"], block_size=dc.get("block_size", c.get("block_size")),
        taps=dc["target_layer_ids"], heads=c["num_attention_heads"],
        kv_heads=c["num_key_value_heads"], head_dim=c["head_dim"], inter=c["intermediate_size"],
        eps=c["rms_norm_eps"], mask_token_id=dc["mask_token_id"],
        rope_theta=c.get("rope_theta", (c.get("rope_parameters") or {}).get("rope_theta")),
        **extra)
    m.load_export(common.read_safetensors(os.path.join(out_dir, "model.safetensors")))
    return m.eval()


def sample_anchors(N, L, A, gen, device):
    """A distinct anchors per row, uniform over 1..L-2, sorted."""
    r = torch.rand(N, L - 2, generator=gen, device=device)
    return (r.topk(A, -1).indices + 1).sort(-1).values


def block_loss(model, feats, tokens, anchors, gamma):
    """Position-decayed CE of rows 1..B-1 (dflash.md §6.1). Returns loss, per-row top-1 acc."""
    B = model.B
    N, L = tokens.shape
    hid = model(feats, tokens, anchors)  # [N, A, B-1, H]
    logits = model.logits(hid)
    k = torch.arange(1, B, device=tokens.device)
    pos = anchors[:, :, None] + k  # [N, A, B-1]
    valid = pos < L
    labels = torch.gather(tokens, 1, pos.clamp(max=L - 1).view(N, -1)).view(pos.shape)
    w = torch.exp(-(k.float() - 1) / gamma) * valid
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                         reduction="none").view(pos.shape)
    loss = (ce * w).sum() / w.sum()
    with torch.no_grad():
        hit = (logits.argmax(-1) == labels) & valid
        acc = hit.float().sum((0, 1)) / valid.float().sum((0, 1)).clamp_min(1)
        # P(all rows 1..k correct): the greedy acceptance proxy
        run = torch.cumprod(hit.float(), -1)
        accept = run.sum((0, 1)) / valid.float().sum((0, 1)).clamp_min(1)
    return loss, acc, accept


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    common.add_train_args(ap, block_size=16, gamma=7.0)
    a = ap.parse_args()
    log, dev, target, toks, val, taps = common.setup_training(a, "dflash")
    n_rows, L = toks.shape
    model = DFlashDrafter(target, layers=a.layers, block_size=a.block_size, taps=taps,
                          inter=a.inter, mask_token_id=a.mask_token_id)
    n_params = sum(p.numel() for p in model.parameters())
    log("DFlash drafter: %d layers, B=%d, taps %s, %d params; data %d x %d" % (
        a.layers, a.block_size, taps, n_params, n_rows, L))
    vgen = torch.Generator(device=dev)
    vgen.manual_seed(a.seed + 1)
    vfe = target.forward(val, taps=taps)[1]
    v_anchors = sample_anchors(val.shape[0], L, a.anchors, vgen, dev)

    def validate():
        model.eval()
        with torch.no_grad():
            tot, accs, accepts = 0.0, 0, 0
            for i in range(0, val.shape[0], a.batch):
                sl = slice(i, i + a.batch)
                l_, acc_, ac_ = block_loss(model, vfe[sl], val[sl], v_anchors[sl], a.gamma)
                tot += l_.item()
                accs = accs + acc_
                accepts = accepts + ac_
            nb = math.ceil(val.shape[0] / a.batch)
        model.train()
        return tot / nb, accs / nb, accepts / nb

    def step_loss(tb, gen):
        feats = target.forward(tb, taps=taps)[1]
        anchors = sample_anchors(a.batch, L, a.anchors, gen, dev)
        loss, acc, _ = block_loss(model, feats, tb, anchors, a.gamma)
        return loss, acc

    t0 = time.time()
    step = common.train_loop(a, model, toks, step_loss, log,
                             lambda acc: "acc[1..4] " + common.fmt_list(acc[:4]))
    vl, vacc, vacc_run = validate()
    log("done: %d steps in %.0f s; val loss %.4f" % (step, time.time() - t0, vl))
    log("val top-1 per row 1..%d: %s" % (a.block_size - 1, common.fmt_list(vacc)))
    log("val P(rows 1..k all right): %s -> teacher-forced tau ~ %.2f" % (
        common.fmt_list(vacc_run), 1 + vacc_run.sum().item()))
    finish(model, target, a, step, t0, log, vl, val_top1=vacc.tolist(),
           val_prefix_accept=vacc_run.tolist())


if __name__ == "__main__":
    main()
