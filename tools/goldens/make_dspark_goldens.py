#!/usr/bin/env python3
"""Random DSpark test checkpoints (SpecForge / DeepSpec layout) and golden drafts.

Writes, under --out (default tests/data):

    dspark-stories260K/   target models/stories260K. architectures [DSparkDraftModel], F32, names
        without prefix, top-level block_size 7 (7 drafts), 2 layers, dflash_config
        {projector_type dspark, markov_rank 16, markov_head_type vanilla, enable_confidence_head,
        confidence_head_with_markov}, tensors markov_head.markov_w{1,2}.weight,
        confidence_head.proj.{weight,bias}.
    dspark-tiny-qwen3/    target tests/data/tiny-qwen3. No architectures (detected from
        dflash_config), BF16, `model.` prefix, dflash_config.block_size 5, markov_rank 8 with the
        raw spellings markov_head.markov_w{1,2}, dspark_draft_topk 6, confidence head without the
        Markov feature (confidence_head_with_markov false).

Golden tensors (golden.safetensors; F32 unless noted), for two proposes as in make_dflash_goldens.py
(s = 20 after observing positions 0..19, s = 23 after observing 20..22 as well):
    ctx_feats [23, n_taps*H_t], anchors I32 [2], anchor_pos I32 [2]
    base{0,1}   [γ, V]  U_k = lm_head(norm(h_k)) of every block row
    biased{0,1} [γ, V]  U_k + b_k along the greedy chain (−inf outside the top-k when restricted)
    drafts{0,1} I32 [γ] the greedy chain
    conf{0,1}   [γ]     c_k (per-row survival)

    /usr/bin/python3 tools/goldens/make_dspark_goldens.py [--out tests/data]
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import family_goldens  # noqa: E402  (also puts tools/reference on the path)
import dspark_ref  # noqa: E402


def specs(data_dir, stories_dir):
    return [
        family_goldens.stories_spec(
            "dspark-stories260K", stories_dir, 21, block_where="top", block_size=7, eps=1e-6,
            arch=["DSparkDraftModel"], rank=16, raw_names=False, topk=0, conf_markov=True),
        family_goldens.tiny_qwen3_spec(
            "dspark-tiny-qwen3", data_dir, 22, block_size=5, rank=8, raw_names=True, topk=6,
            conf_markov=False),
    ]


def extend(spec, out_dir, cfg, rng):
    H, V, r = cfg["hidden_size"], cfg["vocab_size"], spec["rank"]
    if spec["arch"]:
        cfg["architectures"] = spec["arch"]
        cfg["auto_map"] = {"AutoModel": "dspark.DSparkDraftModel"}
    else:
        cfg.pop("architectures", None)
        cfg.pop("auto_map", None)
    dc = cfg["dflash_config"]
    dc.update({"attention_mode": "gqa", "projector_type": "dspark", "markov_rank": r,
               "markov_head_type": "vanilla", "confidence_head_alpha": 1.0,
               "enable_confidence_head": True,
               "confidence_head_with_markov": spec["conf_markov"]})
    if spec["topk"]:
        dc["dspark_draft_topk"] = spec["topk"]
    suffix = "" if spec["raw_names"] else ".weight"
    extra = {
        "markov_head.markov_w1" + suffix: (rng.standard_normal((V, r))).astype(np.float32),
        "markov_head.markov_w2" + suffix:
            (rng.standard_normal((V, r)) * 1.5 / np.sqrt(r)).astype(np.float32),
    }
    width = H + (r if spec["conf_markov"] else 0)
    extra["confidence_head.proj.weight"] = (
        rng.standard_normal((1, width)) * 2.0 / np.sqrt(width)).astype(np.float32)
    extra["confidence_head.proj.bias"] = np.array([0.5], dtype=np.float32)
    return extra


def propose(ref, ctx_feats, anchor):
    U, z, drafts, conf = ref.propose_greedy(ctx_feats, anchor)
    print("  drafts", drafts, "(argmax of U alone:", U.numpy().argmax(-1).tolist(), ") conf",
          np.round(conf, 3).tolist(), flush=True)
    return {"base": ("F32", U.numpy()), "biased": ("F32", z.numpy()),
            "drafts": ("I32", np.array(drafts, dtype=np.int32)), "conf": ("F32", conf)}


if __name__ == "__main__":
    family_goldens.main(__doc__, specs, extend, (dspark_ref.DSparkRef, propose),
                        "tools/goldens/make_dspark_goldens.py", "tools/reference/dspark_ref.py")
