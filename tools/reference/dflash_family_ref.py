#!/usr/bin/env python3
"""The DFlash block forward with the hooks DSpark and DFlash2 need (specs/dflash.md §1.3, §4, §5),
fp32, dense, stateless. Shared by dspark_ref.py and dflash2_ref.py; the DFlash math itself is
dflash_ref.py's (same config reader, RMSNorm, RoPE and masks), extended by

  * `input_embedding_scale` (DFlash2): block embeddings × scale;
  * per-layer sublayer hooks (DFlash2's grouped dynamic convolutions):
        x = input_layernorm(h); x, st = hook.prepare(layer, "attention", x)
        a = self_attn(x, ctx) Woᵀ;  h = h + hook.finish(layer, "attention", a, st)
        y = post_attention_layernorm(h); y, st = hook.prepare(layer, "mlp", y)
        m = mlp(y);                  h = h + hook.finish(layer, "mlp", m, st)
  * block_hidden() returns the final-normed hidden states of *every* block row; the families pick
    their rows (DSpark all γ, DFlash2 rows 1..B−1).
"""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash_ref  # noqa: E402


def topk_lowest_id(x, k):
    """Indices of the k largest entries of a 1-D tensor, sorted by value descending, ties to the
    lower index (a stable sort of −x)."""
    order = np.argsort(-x.detach().cpu().numpy().astype(np.float64), kind="stable")
    return torch.as_tensor(order[:k].copy(), dtype=torch.long, device=x.device)


class BlockRef(dflash_ref.DFlashRef):
    def __init__(self, drafter_dir, target_dir, device="cpu"):
        import json
        with open(os.path.join(drafter_dir, "config.json")) as f:
            self.raw_cfg = json.load(f)
        self._sd = dflash_ref.read_checkpoint_dir(drafter_dir)
        super().__init__(drafter_dir, target_dir, device)
        dc = self.raw_cfg.get("dflash_config") or {}
        self.embed_scale = float(dc.get("input_embedding_scale",
                                        self.raw_cfg.get("input_embedding_scale", 1.0)))

    def get_any(self, *names):
        for name in names:
            for n in (name, "model." + name):
                if n in self._sd:
                    return torch.tensor(np.asarray(self._sd[n], dtype=np.float32),
                                        device=self.device)
        raise KeyError("drafter tensor %s not found" % " / ".join(names))

    def block_hidden(self, ctx_feats, anchor, hook=None):
        """Final-normed hidden states [B, H] of the block [anchor, mask × (B−1)] at s..s+B−1."""
        return super().block_hidden(ctx_feats, anchor, hook=hook, embed_scale=self.embed_scale)
