#!/usr/bin/env python3
"""Train a DSpark drafter for stories260K (specs/dflash.md §4.3) and export it in the SpecForge /
DeepSpec layout (DSparkDraftModel, dflash_config.projector_type "dspark"), as
src/models/drafters/dspark.cc and tools/reference/dspark_ref.py read it.

    python3 tools/train/dspark.py --data OUT/data.pt --out OUT/stories260K-dspark --device cuda \
        --seed 0 --steps 6000 --time-budget 150

Hyper-parameters: the DFlash trainer's (tools/train/dflash.py) plus the paper's loss weights; the
device run (tools/train/run_device_s8.sh) trains block 8 with the DFlash row decay gamma 7.

Model: the DFlash drafter of tools/train/dflash.py (same backbone, context injection and block
mask) read out at every block row (shifted rows: row k of [x_p, MASK x (B-1)] predicts x_{p+k+1},
B rows give B drafts), plus
  * a vanilla Markov head: W1 [V, r] (embedding), W2 [V, r]; b_k = W2 · W1[prev_k] with teacher
    forcing, prev = [x_p, x_{p+1}, .., x_{p+B-1}] (the ground-truth predecessors);
  * a confidence head proj [1, H + r] + bias: c_k = sigmoid(proj · [h_k ; W1[prev_k]]).
Loss (§4.3), row weights w_k = exp(-k / gamma) (k = 0..B-1) times a contiguous-valid mask:
  L = 0.1 · Σw CE(p_d, x*) / Σw + 0.9 · Σw ||p_d - p_t||_1 / Σw + 1.0 · Σw BCE(c, α) / Σw
with p_d = softmax(U + b), p_t = the target's distribution at the label position (its logits of
the previous position, recomputed on the fly) and α = clamp(1 - ½ ||p_d - p_t||_1, 0, 1) (the
exact acceptance probability of speculative sampling), detached.
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


class DSparkDrafter(dflash.DFlashDrafter):
    def __init__(self, target, rank=64, **kw):
        super().__init__(target, **kw)
        V = target.cfg["vocab_size"]
        self.rank = rank
        self.P["markov_head__markov_w1__weight"] = nn.Parameter(torch.randn(V, rank) * 0.02)
        # Zero W2: training starts from the plain (shifted) DFlash proposal.
        self.P["markov_head__markov_w2__weight"] = nn.Parameter(torch.zeros(V, rank))
        self.P["confidence_head__proj__weight"] = nn.Parameter(torch.zeros(1, self.H + rank))
        self.P["confidence_head__proj__bias"] = nn.Parameter(torch.zeros(1))
        self.to(target.dev)

    def config(self, target):
        c = super().config(target)
        c["architectures"] = ["DSparkDraftModel"]
        c["auto_map"] = {"AutoModel": "dspark.DSparkDraftModel"}
        c["dflash_config"].update({
            "projector_type": "dspark", "sample_from_anchor": True, "markov_rank": self.rank, "markov_head_type": "vanilla",
            "enable_confidence_head": True, "confidence_head_with_markov": True,
            "confidence_head_alpha": 1.0})
        return c

    num_drafts = property(lambda self: self.B)  # shifted rows: row k drafts s+k+1

    @torch.no_grad()
    def propose(self, feats, tokens, anchors, temp, gen):
        """The Markov chain left to right over the B rows (prev_0 = the anchor, then the token
        chosen at the previous row): T = 0 argmax of z_k = U_k + W2 W1[prev_k]; T > 0 a draw from
        q_k = softmax(z_k / T), which is the proposal of the rejection step. anchors [N, 1] ->
        drafts [N, B], q [N, B, V] or None (T = 0). Also sets self.last_survival [N, B], the
        confidence head's prefix survival a_k = c_0 .. c_k along the chain."""
        hid = self(feats, tokens, anchors, first_row=0)[:, 0]  # [N, B, H]
        prev = torch.gather(tokens, 1, anchors)[:, 0]
        drafts, qs, confs = [], [], []
        for k in range(self.B):
            z, conf = self.markov_and_confidence(hid[:, k], prev)
            prev = common.draw(z, temp, gen, qs)
            drafts.append(prev)
            confs.append(torch.sigmoid(conf))
        self.last_survival = torch.cumprod(torch.stack(confs, 1), 1)
        return torch.stack(drafts, 1), (torch.stack(qs, 1) if qs else None)

    def markov_and_confidence(self, hid, prev):
        """hid [.., B, H] final-normed rows, prev [.., B] predecessors -> biased logits, conf
        logits."""
        e = self.w("markov_head.markov_w1.weight")[prev]  # [.., r]
        z = self.logits(hid) + e @ self.w("markov_head.markov_w2.weight").T
        conf = (torch.cat([hid, e], -1) @ self.w("confidence_head.proj.weight").T)[..., 0]
        return z, conf + self.w("confidence_head.proj.bias")[0]


def dspark_loss(model, feats, target_logits, tokens, anchors, gamma, alphas=(0.1, 0.9, 1.0)):
    """Returns loss, per-row acceptance α (mean), per-row top-1 accuracy."""
    B = model.B
    N, L = tokens.shape
    hid = model(feats, tokens, anchors, first_row=0)  # [N, A, B, H]
    k = torch.arange(B, device=tokens.device)
    lab_pos = anchors[:, :, None] + 1 + k  # row k predicts p + k + 1
    valid = torch.cumprod((lab_pos < L).long(), -1).bool()
    lab_pos_c = lab_pos.clamp(max=L - 1)
    labels = torch.gather(tokens, 1, lab_pos_c.view(N, -1)).view(lab_pos.shape)
    prev = torch.gather(tokens, 1, (lab_pos_c - 1).view(N, -1)).view(lab_pos.shape)
    z, conf = model.markov_and_confidence(hid, prev)
    w = torch.exp(-k.float() / gamma) * valid
    ws = w.sum()
    ce = F.cross_entropy(z.reshape(-1, z.shape[-1]), labels.reshape(-1),
                         reduction="none").view(lab_pos.shape)
    # The target's distribution of the label position: its logits at the previous position.
    t_log = torch.gather(target_logits, 1,
                         (lab_pos_c - 1).view(N, -1, 1).expand(-1, -1, target_logits.shape[-1]))
    p_t = torch.softmax(t_log.view(*lab_pos.shape, -1).float(), -1)
    p_d = torch.softmax(z.float(), -1)
    tv = (p_d - p_t).abs().sum(-1)
    alpha = (1 - 0.5 * tv).clamp(0, 1).detach()
    bce = F.binary_cross_entropy_with_logits(conf, alpha, reduction="none")
    loss = (alphas[0] * (ce * w).sum() + alphas[1] * (tv * w).sum() +
            alphas[2] * (bce * w).sum()) / ws
    with torch.no_grad():
        acc = ((z.argmax(-1) == labels) & valid).float().sum((0, 1)) / valid.float().sum(
            (0, 1)).clamp_min(1)
        mean_alpha = (alpha * valid).sum((0, 1)) / valid.float().sum((0, 1)).clamp_min(1)
    return loss, mean_alpha, acc


def load(out_dir, target):
    rank = dflash.read_config(out_dir)["dflash_config"]["markov_rank"]
    return dflash.load(out_dir, target, cls=DSparkDrafter, rank=rank)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    common.add_train_args(ap, block_size=7, gamma=4.0)
    ap.add_argument("--rank", type=int, default=64, help="Markov rank r")
    a = ap.parse_args()
    log, dev, target, toks, val, taps = common.setup_training(a, "dspark")
    n_rows, L = toks.shape
    model = DSparkDrafter(target, rank=a.rank, layers=a.layers, block_size=a.block_size,
                          taps=taps, inter=a.inter, mask_token_id=a.mask_token_id)
    n_params = sum(p.numel() for p in model.parameters())
    log("DSpark drafter: %d layers, B=%d (B drafts), rank %d, gamma %g, %d params; data %d x %d"
        % (a.layers, a.block_size, a.rank, a.gamma, n_params, n_rows, L))

    def step_loss(tb, gen):
        t_logits, feats = target.forward(tb, taps=taps)
        anchors = dflash.sample_anchors(a.batch, L, a.anchors, gen, dev)
        loss, alpha, acc = dspark_loss(model, feats, t_logits, tb, anchors, a.gamma)
        return loss, (alpha, acc)

    t0 = time.time()
    step = common.train_loop(
        a, model, toks, step_loss, log,
        lambda st: "alpha[0..3] %s acc[0..3] %s" % (common.fmt_list(st[0][:4]),
                                                    common.fmt_list(st[1][:4])))
    model.eval()
    with torch.no_grad():
        vg = torch.Generator(device=dev)
        vg.manual_seed(a.seed + 1)
        vb = val[:a.batch]
        t_logits, feats = target.forward(vb, taps=taps)
        anchors = dflash.sample_anchors(vb.shape[0], L, a.anchors, vg, dev)
        vl, valpha, vacc = dspark_loss(model, feats, t_logits, vb, anchors, a.gamma)
    log("done: %d steps in %.0f s; val loss %.4f; val alpha per row %s; expected tau(T=1) ~ %.2f"
        % (step, time.time() - t0, vl.item(), common.fmt_list(valpha),
           1 + torch.cumprod(valpha, 0).sum().item()))
    log("val top-1 per row (teacher-forced predecessors) %s" % common.fmt_list(vacc))
    dflash.finish(model, target, a, step, t0, log, vl.item(), val_alpha=valpha.tolist(),
                  val_top1=vacc.tolist())


if __name__ == "__main__":
    main()
