#!/usr/bin/env python3
"""Independent PyTorch reference of the DSpark drafter (specs/dflash.md §4), fp32, dense.

DSpark = the DFlash backbone (tools/reference/dflash_ref.py) with
  * shifted rows ("anchor-as-first"): the block [x_s, MASK × (γ−1)] at positions s..s+γ−1 gives γ
    drafts; row k (0-based) predicts position s+k+1, so all γ rows are read out (DFlash drops row 0);
  * a vanilla rank-r Markov head applied left to right:
        U_k   = lm_head(norm(h_k))                                  [V]   base logits of row k
        b_k   = W2 · W1[prev_k]                                     [V]   W1, W2: [V, r]
        z_k   = U_k + b_k          (with dspark_draft_topk = K > 0: z_k = U_k + b_k on the K
                                    largest U_k entries, −inf elsewhere; ties to the lower id)
        prev_0 = anchor, prev_k = the token chosen at row k−1
    T = 0: d_k = argmax z_k (lowest id on ties); T > 0: d_k ~ softmax(z_k / T);
  * a confidence head c_k = σ(proj([norm(h_k) ; W1[prev_k]]))  (confidence_head_with_markov;
    proj over norm(h_k) alone otherwise); prefix survival a_k = Π_{i≤k} c_i.

Only the greedy chain is computed here (the goldens); the sampled chain follows the same rule
with sampled predecessors.
"""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash_family_ref  # noqa: E402


class DSparkRef(dflash_family_ref.BlockRef):
    def __init__(self, drafter_dir, target_dir, device="cpu"):
        super().__init__(drafter_dir, target_dir, device)
        dc = self.raw_cfg.get("dflash_config") or {}
        assert dc.get("projector_type") == "dspark", "not a DSpark config"
        self.rank = int(dc.get("markov_rank", 0))
        self.topk = int(dc.get("dspark_draft_topk") or 0)
        self.conf_on = bool(dc.get("enable_confidence_head", False))
        self.conf_markov = bool(dc.get("confidence_head_with_markov", True))
        if self.rank > 0:
            self.w1 = self.get_any("markov_head.markov_w1.weight", "markov_head.markov_w1")
            self.w2 = self.get_any("markov_head.markov_w2.weight", "markov_head.markov_w2")
        if self.conf_on:
            self.conf_w = self.get_any("confidence_head.proj.weight")  # [1, H (+ r)]
            self.conf_b = self.get_any("confidence_head.proj.bias")  # [1]

    @torch.no_grad()
    def propose_greedy(self, ctx_feats, anchor):
        """Returns (base logits U [γ, V], biased logits z [γ, V] along the greedy chain,
        drafts [γ], confidences c [γ] or None)."""
        h = self.block_hidden(ctx_feats, anchor)  # [γ, H], final-normed, all rows
        U = h @ self.lm_head.T
        prev = anchor
        zs, drafts, confs = [], [], []
        for k in range(U.shape[0]):
            z = U[k].clone()
            e = self.w1[prev] if self.rank > 0 else None
            if self.rank > 0:
                b = self.w2 @ e
                if self.topk > 0:
                    keep = dflash_family_ref.topk_lowest_id(U[k], self.topk)
                    zz = torch.full_like(z, float("-inf"))
                    zz[keep] = U[k][keep] + b[keep]
                    z = zz
                else:
                    z = U[k] + b
            elif self.topk > 0:
                keep = dflash_family_ref.topk_lowest_id(U[k], self.topk)
                zz = torch.full_like(z, float("-inf"))
                zz[keep] = U[k][keep]
                z = zz
            if self.conf_on:
                feat = torch.cat([h[k], e]) if (self.conf_markov and self.rank > 0) else h[k]
                confs.append(torch.sigmoid(self.conf_w[0] @ feat + self.conf_b[0]).item())
            d = int(torch.argmax(z).item())  # first index on ties
            zs.append(z)
            drafts.append(d)
            prev = d
        return (U.cpu(), torch.stack(zs).cpu(), drafts,
                np.array(confs, dtype=np.float32) if self.conf_on else None)
