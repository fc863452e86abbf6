#!/usr/bin/env python3
"""Train a DFlash2 drafter for stories260K (specs/dflash.md §5.5) and export it in the z-lab
layout (DFlash2DraftModel), as src/models/drafters/dflash2.cc and tools/reference/dflash2_ref.py
read it.

    python3 tools/train/dflash2.py --data OUT/data.pt --out OUT/stories260K-dflash2 --device cuda \
        --seed 0 --steps 6000 --time-budget 150

Trained for the shipped stories260K drafter by tools/train/run_device_s8.sh (block 16, as DFlash).

Model: the DFlash drafter of tools/train/dflash.py (rows 1..B-1) plus
  * grouped dynamic causal 2-tap convolutions around both sublayers of every layer, over the B
    block rows, identity-initialised (base[:, 0] = 1, other taps 0, projection 0);
  * the candidate selector: predecessor / successor codebooks [V, R], hidden_projection [R, H].
Loss (NeMo AutoModel's dflash2_core, §5.5): base = the DFlash decay-weighted CE of the unary logits;
selector = CE over the top-K unary candidates scored with the ground-truth predecessor
(S[k] = U[k] + Σ_r A[x_{p+j-1}][r] z[r] Bc[C[k]][r]), label = the slot of the true token, rows
whose true token is outside the top-K excluded (their share is logged as candidate recall);
L = base + --selector-weight · selector.
"""

import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import dflash  # noqa: E402


class Convs:
    """DFlash2's sublayer convolutions over the block rows (dim -2 of [N, A, B, H])."""

    def __init__(self, model, taps, group):
        self.m, self.K, self.g = model, taps, group

    def _conv(self, x, D, base):
        # x [N, A, B, H], D [N, A, B, K, G], base [K, H]
        Dc = D.repeat_interleave(self.g, dim=-1)  # [N, A, B, K, H]
        out = torch.zeros_like(x)
        for t in range(self.K):
            shifted = F.pad(x, (0, 0, t, 0))[..., : x.shape[-2], :]  # x[i - t], zero before 0
            out = out + (base[t] + Dc[..., t, :]) * shifted
        return out

    def prepare(self, layer, sub, x):
        p = "layers.%d.%s_conv." % (layer, ("attention", "mlp")[sub])
        H = x.shape[-1]
        D = (x @ self.m.w(p + "kernel_projection.weight").T).view(
            *x.shape[:-1], 2, self.K, H // self.g)
        base = self.m.w(p + "base_kernel")
        return self._conv(x, D[..., 0, :, :], base[0]), D[..., 1, :, :]

    def finish(self, layer, sub, out, D1):
        p = "layers.%d.%s_conv." % (layer, ("attention", "mlp")[sub])
        return self._conv(out, D1, self.m.w(p + "base_kernel")[1])


class DFlash2Drafter(dflash.DFlashDrafter):
    def __init__(self, target, taps_k=2, group=16, rank=32, top_k=16, **kw):
        super().__init__(target, **kw)
        V, H = target.cfg["vocab_size"], self.H
        self.K, self.group, self.rank, self.top_k = taps_k, group, rank, top_k
        for i in range(self.n_layers):
            for sub in ("attention", "mlp"):
                p = "layers__%d__%s_conv__" % (i, sub)
                base = torch.zeros(2, taps_k, H)
                base[:, 0] = 1.0
                self.P[p + "base_kernel"] = nn.Parameter(base)
                self.P[p + "kernel_projection__weight"] = nn.Parameter(
                    torch.zeros(2 * taps_k * (H // group), H))
        self.P["candidate_selector__predecessor_codebook"] = nn.Parameter(
            torch.randn(V, rank) * 0.02)
        self.P["candidate_selector__successor_codebook"] = nn.Parameter(torch.randn(V, rank) * 0.02)
        self.P["candidate_selector__hidden_projection__weight"] = nn.Parameter(
            torch.randn(rank, H) * 0.02)
        self.convs = Convs(self, taps_k, group)
        self.to(target.dev)

    @torch.no_grad()
    def propose(self, feats, tokens, anchors, temp, gen):
        """The candidate-selector walk (specs/dflash.md §5.4) over rows 1..B-1 in fp32: top-K of
        the unary logits (descending, ties to the lower id), S = U + (A[pred] * z) . Bc[C],
        pred = the anchor, then the previous draft; T = 0: the argmax of S scattered into a -inf
        vocabulary row (exact ties to the lower token id); T > 0: a draw from softmax(S / T) over
        the candidates, which (scattered into the vocabulary) is q. anchors [N, 1] -> drafts
        [N, B-1], q [N, B-1, V] or None (T = 0)."""
        hid = self(feats, tokens, anchors, conv=self.convs)[:, 0]  # [N, B-1, H]
        u = self.logits(hid)
        order = torch.sort(u, dim=-1, descending=True, stable=True)
        U, C = order.values[..., :self.top_k], order.indices[..., :self.top_k]
        z = hid @ self.w("candidate_selector.hidden_projection.weight").T  # [N, B-1, R]
        A = self.w("candidate_selector.predecessor_codebook")
        Bc = self.w("candidate_selector.successor_codebook")
        pred = torch.gather(tokens, 1, anchors)[:, 0]
        drafts, qs = [], []
        for p in range(u.shape[1]):
            S = U[:, p] + ((A[pred] * z[:, p])[:, None, :] * Bc[C[:, p]]).sum(-1)  # [N, K]
            full = torch.full_like(u[:, p], float("-inf")).scatter(1, C[:, p], S)
            pred = common.draw(full, temp, gen, qs)
            drafts.append(pred)
        return torch.stack(drafts, 1), (torch.stack(qs, 1) if qs else None)

    def config(self, target):
        c = super().config(target)
        c["architectures"] = ["DFlash2DraftModel"]
        c["auto_map"] = {"AutoModel": "dflash.DFlash2DraftModel"}
        c["is_causal"] = False
        c["dflash_config"]["block_size"] = c.pop("block_size")
        c["dflash_config"].update({"conv_kernel_size": self.K, "conv_group_size": self.group,
                                   "selector_rank": self.rank, "selector_top_k": self.top_k})
        return c


def dflash2_loss(model, feats, tokens, anchors, gamma, sel_weight):
    B, T = model.B, model.top_k
    N, L = tokens.shape
    hid = model(feats, tokens, anchors, conv=model.convs)  # [N, A, B-1, H], rows 1..B-1
    u = model.logits(hid)
    k = torch.arange(1, B, device=tokens.device)
    pos = anchors[:, :, None] + k  # row j predicts p + j
    valid = pos < L
    posc = pos.clamp(max=L - 1)
    labels = torch.gather(tokens, 1, posc.view(N, -1)).view(pos.shape)
    prev = torch.gather(tokens, 1, (posc - 1).view(N, -1)).view(pos.shape)
    w = torch.exp(-(k.float() - 1) / gamma) * valid
    ce = F.cross_entropy(u.reshape(-1, u.shape[-1]), labels.reshape(-1),
                         reduction="none").view(pos.shape)
    base = (ce * w).sum() / w.sum()
    U, C = u.topk(T, -1)  # [N, A, B-1, T]
    z = hid @ model.w("candidate_selector.hidden_projection.weight").T  # [.., R]
    a = model.w("candidate_selector.predecessor_codebook")[prev]  # [.., R]
    bc = model.w("candidate_selector.successor_codebook")[C]  # [.., T, R]
    S = U + ((a * z)[..., None, :] * bc).sum(-1)
    hit = C == labels[..., None]
    inside = hit.any(-1) & valid
    slot = hit.float().argmax(-1)
    sce = F.cross_entropy(S.reshape(-1, T), slot.reshape(-1), reduction="none").view(pos.shape)
    ws = w * inside
    sel = (sce * ws).sum() / ws.sum().clamp_min(1e-6)
    with torch.no_grad():
        recall = inside.float().sum((0, 1)) / valid.float().sum((0, 1)).clamp_min(1)
        right = ((C.gather(-1, S.argmax(-1, keepdim=True))[..., 0] == labels) & valid)
        acc = right.float().sum((0, 1)) / valid.float().sum((0, 1)).clamp_min(1)
    return base + sel_weight * sel, base, sel, recall, acc


def load(out_dir, target):
    dc = dflash.read_config(out_dir)["dflash_config"]
    return dflash.load(out_dir, target, cls=DFlash2Drafter, taps_k=dc["conv_kernel_size"],
                       group=dc["conv_group_size"], rank=dc["selector_rank"],
                       top_k=dc.get("selector_top_k", 16))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    common.add_train_args(ap, block_size=16, gamma=7.0)
    ap.add_argument("--group", type=int, default=16, help="conv_group_size")
    ap.add_argument("--rank", type=int, default=32, help="selector_rank")
    ap.add_argument("--top-k", type=int, default=16, help="selector_top_k")
    ap.add_argument("--selector-weight", type=float, default=1.0)
    a = ap.parse_args()
    log, dev, target, toks, val, taps = common.setup_training(a, "dflash2")
    n_rows, L = toks.shape
    model = DFlash2Drafter(target, group=a.group, rank=a.rank, top_k=a.top_k, layers=a.layers,
                           block_size=a.block_size, taps=taps, inter=a.inter,
                           mask_token_id=a.mask_token_id)
    n_params = sum(p.numel() for p in model.parameters())
    log("DFlash2 drafter: %d layers, B=%d, group %d, rank %d, top-%d, %d params; data %d x %d" % (
        a.layers, a.block_size, a.group, a.rank, a.top_k, n_params, n_rows, L))

    def step_loss(tb, gen):
        with torch.no_grad():
            feats = target.forward(tb, taps=taps)[1]
        anchors = dflash.sample_anchors(a.batch, L, a.anchors, gen, dev)
        loss, base, sel, recall, acc = dflash2_loss(model, feats, tb, anchors, a.gamma,
                                                    a.selector_weight)
        return loss, (base, sel, recall, acc)

    t0 = time.time()
    step = common.train_loop(
        a, model, toks, step_loss, log,
        lambda st: "(base %.4f selector %.4f) recall[1..4] %s acc[1..4] %s" % (
            st[0].item(), st[1].item(), common.fmt_list(st[2][:4]), common.fmt_list(st[3][:4])))
    model.eval()
    with torch.no_grad():
        vg = torch.Generator(device=dev)
        vg.manual_seed(a.seed + 1)
        vb = val[:a.batch]
        feats = target.forward(vb, taps=taps)[1]
        anchors = dflash.sample_anchors(vb.shape[0], L, a.anchors, vg, dev)
        vl, vbase, _, vrec, vacc = dflash2_loss(model, feats, vb, anchors, a.gamma,
                                                a.selector_weight)
    log("done: %d steps in %.0f s; val loss %.4f (base %.4f); val recall@%d %s" % (
        step, time.time() - t0, vl.item(), vbase.item(), a.top_k, common.fmt_list(vrec)))
    log("val top-1 of the selector (teacher-forced predecessor) %s" % common.fmt_list(vacc))
    dflash.finish(model, target, a, step, t0, log, vl.item(), val_base_loss=vbase.item(),
                  val_recall=vrec.tolist(), val_top1=vacc.tolist())


if __name__ == "__main__":
    main()
