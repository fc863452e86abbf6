#!/usr/bin/env python3
"""Random DFlash2 test checkpoints (z-lab / vLLM layout) and golden drafts.

Writes, under --out (default tests/data):

    dflash2-stories260K/  target models/stories260K. architectures [DFlash2DraftModel], F32, names
        without prefix, dflash_config {block_size 6, conv_kernel_size 2, conv_group_size 16,
        selector_rank 8, selector_top_k 16, output_multiplier 0.5, final_logit_softcapping 8,
        input_embedding_scale 1.5}, rms_norm_eps 1e-5, rope_parameters {rope_theta, rope_type},
        is_causal false; raw codebook names candidate_selector.{predecessor,successor}_codebook.
    dflash2-tiny-qwen3/   target tests/data/tiny-qwen3. No architectures, BF16, `model.` prefix,
        block_size 8, conv_group_size 8, selector_rank 12, selector_top_k 16, codebooks spelled
        `.weight`, no multiplier / softcap / embedding scale.

Golden tensors (golden.safetensors; F32 unless noted), two proposes as make_dflash_goldens.py:
    ctx_feats, anchors I32 [2], anchor_pos I32 [2]
    unary{0,1}  [B−1, V]  u_p (× output_multiplier, soft-capped)
    cands{0,1}  I32 [B−1, K]  the top-K candidates of every row (descending, ties to the lower id)
    scores{0,1} [B−1, K]  S_p along the greedy walk
    drafts{0,1} I32 [B−1]

    /usr/bin/python3 tools/goldens/make_dflash2_goldens.py [--out tests/data]
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import family_goldens  # noqa: E402  (also puts tools/reference on the path)
import dflash2_ref  # noqa: E402


def specs(data_dir, stories_dir):
    return [
        family_goldens.stories_spec(
            "dflash2-stories260K", stories_dir, 31, block_where="dflash_config", block_size=6,
            eps=1e-5, arch=["DFlash2DraftModel"], group=16, rank=8, top_k=16, raw_names=True,
            mult=0.5, cap=8.0, emb_scale=1.5),
        family_goldens.tiny_qwen3_spec(
            "dflash2-tiny-qwen3", data_dir, 32, block_size=8, group=8, rank=12, top_k=16,
            raw_names=False, mult=None, cap=None, emb_scale=None),
    ]


def extend(spec, out_dir, cfg, rng):
    H, V, R, K = cfg["hidden_size"], cfg["vocab_size"], spec["rank"], 2
    G = H // spec["group"]
    if spec["arch"]:
        cfg["architectures"] = spec["arch"]
        cfg["auto_map"] = {"AutoModel": "dflash.DFlash2DraftModel"}
        # transformers 5.x style RoPE and the explicit non-causal flag of the z-lab configs.
        cfg["rope_parameters"] = {"rope_theta": cfg.pop("rope_theta"), "rope_type": "default"}
        cfg.pop("rope_scaling", None)
        cfg["is_causal"] = False
    else:
        cfg.pop("architectures", None)
        cfg.pop("auto_map", None)
    dc = cfg["dflash_config"]
    dc.update({"conv_kernel_size": K, "conv_group_size": spec["group"], "selector_rank": R,
               "selector_top_k": spec["top_k"]})
    if spec["mult"] is not None:
        dc["output_multiplier"] = spec["mult"]
    if spec["cap"] is not None:
        dc["final_logit_softcapping"] = spec["cap"]
    if spec["emb_scale"] is not None:
        dc["input_embedding_scale"] = spec["emb_scale"]
    extra = {}
    for li in range(cfg["num_hidden_layers"]):
        for which in ("attention", "mlp"):
            p = "layers.%d.%s_conv." % (li, which)
            base = np.zeros((2, K, H), dtype=np.float32)
            base[:, 0] = 1.0 + 0.2 * rng.standard_normal((2, H))
            base[:, 1] = 0.3 * rng.standard_normal((2, H))
            extra[p + "base_kernel"] = base.astype(np.float32)
            extra[p + "kernel_projection.weight"] = (
                rng.standard_normal((2 * K * G, H)) * 0.2 / np.sqrt(H) * 4).astype(np.float32)
    suffix = "" if spec["raw_names"] else ".weight"
    extra["candidate_selector.predecessor_codebook" + suffix] = (
        rng.standard_normal((V, R))).astype(np.float32)
    extra["candidate_selector.successor_codebook" + suffix] = (
        rng.standard_normal((V, R)) / np.sqrt(R)).astype(np.float32)
    extra["candidate_selector.hidden_projection.weight"] = (
        rng.standard_normal((R, H)) * 1.5 / np.sqrt(H)).astype(np.float32)
    return extra


def propose(ref, ctx_feats, anchor):
    u, C, S, drafts = ref.propose_greedy(ctx_feats, anchor)
    print("  drafts", drafts, "(argmax of u alone:", u.numpy().argmax(-1).tolist(), ")",
          flush=True)
    return {"unary": ("F32", u.numpy()), "cands": ("I32", C.numpy().astype(np.int32)),
            "scores": ("F32", S.numpy()), "drafts": ("I32", np.array(drafts, dtype=np.int32))}


if __name__ == "__main__":
    family_goldens.main(__doc__, specs, extend, (dflash2_ref.DFlash2Ref, propose),
                        "tools/goldens/make_dflash2_goldens.py", "tools/reference/dflash2_ref.py")
