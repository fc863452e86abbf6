#!/usr/bin/env python3
"""Independent PyTorch reference of the DFlash2 drafter (specs/dflash.md §5), fp32, dense.

DFlash2 = the DFlash backbone and layout (row j of [x_s, MASK × (B−1)] predicts s+j, rows 1..B−1)
plus two modules:

  * grouped dynamic causal convolutions around both sublayers of every layer, over the B block
    rows only (zero before row 0); channel group g(c) = c // conv_group_size:
        conv(x, D, base)[i, c] = Σ_{t<K} (base[t, c] + D[i, t, g(c)]) · x[i−t, c]
        prepare(x): D = (x · Wprojᵀ) as [B, 2, K, G];  return conv(x, D[:, 0], base[0]), D[:, 1]
        finish(y, D1) = conv(y, D1, base[1])
    tensors layers.{i}.{attention,mlp}_conv.base_kernel [2, K, H] and
    .kernel_projection.weight [2·K·G, H];
  * the candidate selector walk, in fp32:
        u_p      = lm_head(h_p) × output_multiplier, then cap·tanh(u_p / cap) when
                   final_logit_softcapping = cap is set
        U_p, C_p = top-K of u_p (K = selector_top_k), sorted descending, ties to the lower id
        z_p      = hidden_projection · h_p                                         [R]
        S_p[k]   = U_p[k] + Σ_r A[pred][r] · z_p[r] · Bc[C_p[k]][r]   (A, Bc: [V, R] codebooks)
        T = 0:  d_p = the candidate with the largest S_p (on exact ties of S: the lowest token id,
                as an argmax over the full-vocabulary row with −inf outside the candidates)
        T > 0:  d_p ~ softmax(S_p / T) over the K candidates
        pred     = anchor for p = 1, then d_{p−1}
Only the greedy walk is computed here (the goldens).
"""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash_family_ref  # noqa: E402


class _Convs:
    def __init__(self, ref):
        dc = ref.raw_cfg["dflash_config"]
        self.K = int(dc["conv_kernel_size"])
        self.gs = int(dc["conv_group_size"])
        self.base, self.proj = {}, {}
        for li in range(ref.cfg.layers):
            for which in ("attention", "mlp"):
                p = "layers.%d.%s_conv." % (li, which)
                self.base[li, which] = ref.get_any(p + "base_kernel")
                self.proj[li, which] = ref.get_any(p + "kernel_projection.weight")

    def _conv(self, x, D, base):
        # x [B, H], D [B, K, G], base [K, H]
        B, H = x.shape
        Dc = D.repeat_interleave(self.gs, dim=2)  # [B, K, H]: D[i, t, c // gs]
        out = torch.zeros_like(x)
        for t in range(self.K):
            shifted = torch.zeros_like(x)
            if t < B:
                shifted[t:] = x[: B - t]
            out = out + (base[t][None, :] + Dc[:, t, :]) * shifted
        return out

    def prepare(self, li, which, x):
        B, H = x.shape
        D = (x @ self.proj[li, which].T).view(B, 2, self.K, H // self.gs)
        return self._conv(x, D[:, 0], self.base[li, which][0]), D[:, 1]

    def finish(self, li, which, y, D1):
        return self._conv(y, D1, self.base[li, which][1])


class DFlash2Ref(dflash_family_ref.BlockRef):
    def __init__(self, drafter_dir, target_dir, device="cpu"):
        super().__init__(drafter_dir, target_dir, device)
        dc = self.raw_cfg["dflash_config"]
        self.top_k = int(dc.get("selector_top_k", 16))
        self.mult = float(dc.get("output_multiplier", self.raw_cfg.get("output_multiplier", 1.0)))
        cap = dc.get("final_logit_softcapping", self.raw_cfg.get("final_logit_softcapping"))
        self.cap = float(cap) if cap else 0.0
        self.convs = _Convs(self)
        self.pred_cb = self.get_any("candidate_selector.predecessor_codebook",
                                    "candidate_selector.predecessor_codebook.weight")
        self.succ_cb = self.get_any("candidate_selector.successor_codebook",
                                    "candidate_selector.successor_codebook.weight")
        self.hproj = self.get_any("candidate_selector.hidden_projection.weight")

    @torch.no_grad()
    def propose_greedy(self, ctx_feats, anchor):
        """Returns (unary logits u [B−1, V], candidates C [B−1, K], scores S [B−1, K] along the
        greedy walk, drafts [B−1])."""
        h = self.block_hidden(ctx_feats, anchor, hook=self.convs)[1:]  # rows 1..B−1
        u = (h @ self.lm_head.T) * self.mult
        if self.cap > 0:
            u = self.cap * torch.tanh(u / self.cap)
        z = h @ self.hproj.T  # [B−1, R]
        pred = anchor
        cands, scores, drafts = [], [], []
        for p in range(h.shape[0]):
            C = dflash_family_ref.topk_lowest_id(u[p], self.top_k)
            S = u[p][C] + (self.succ_cb[C] * z[p][None, :]) @ self.pred_cb[pred]
            full = torch.full_like(u[p], float("-inf"))
            full[C] = S
            d = int(torch.argmax(full).item())
            cands.append(C)
            scores.append(S)
            drafts.append(d)
            pred = d
        return u.cpu(), torch.stack(cands).cpu(), torch.stack(scores).cpu(), drafts
