#!/usr/bin/env python3
"""Shared steps of make_dspark_goldens.py and make_dflash2_goldens.py: a DFlash backbone checkpoint
from make_dflash_goldens.make_checkpoint, the family's extra config keys and tensors, then the
goldens of two proposes (s = 20 after observing positions 0..19, s = 23 after 20..22 as well)."""

import argparse
import datetime
import json
import os
import platform
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import dflash_ref  # noqa: E402
import make_dflash_goldens  # noqa: E402

CTX = 23
ANCHOR_POS = [20, 23]


def stories_spec(name, stories_dir, seed, **family):
    """A 2-layer F32 drafter for models/stories260K (names without prefix, mask token 0); family:
    block_where, block_size, eps, arch and the family's own keys."""
    return dict(name=name, target=stories_dir, seed=seed, dtype="F32", prefix="", own_embed=False,
                layers=2, heads=4, kv_heads=2, head_dim=16, inter=128, target_layer_ids=[1, 2, 3],
                mask_token_id=0, rope_theta=10000.0, layer_types=None, sliding_window=None,
                **family)


def tiny_qwen3_spec(name, data_dir, seed, **family):
    """A 1-layer BF16 drafter for tests/data/tiny-qwen3 (`model.` prefix, no architectures, no
    mask_token_id, block size in dflash_config); family: block_size and the family's own keys."""
    return dict(name=name, target=os.path.join(data_dir, "tiny-qwen3"), seed=seed, dtype="BF16",
                prefix="model.", own_embed=False, block_where="dflash_config", layers=1, heads=4,
                kv_heads=2, head_dim=16, inter=96, target_layer_ids=[0, 2], mask_token_id=None,
                eps=1e-6, rope_theta=1000000.0, layer_types=None, sliding_window=None, arch=None,
                **family)


def main(doc, specs, extend, golden, generator, reference):
    """The makers' command line: --out (default tests/data), --stories (the stories260K folder);
    specs(out, stories) lists the checkpoints to write."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data"))
    ap.add_argument("--stories", default=os.path.join(ROOT, "models", "stories260K"))
    a = ap.parse_args()
    for spec in specs(a.out, a.stories):
        make(spec, os.path.join(a.out, spec["name"]), extend, golden, generator, reference)


def make(spec, out_dir, extend, golden, generator, reference):
    """extend(spec, out_dir, cfg, rng) -> {name: array} edits cfg in place and returns the extra
    tensors; golden = (ref_cls, propose): ref = ref_cls(out_dir, target_dir, "cpu") is the
    reference drafter, propose(ref, ctx_feats, anchor) -> {name: (dtype, array)} the goldens of
    one propose, stored as name0 / name1 for the two anchors."""
    print(spec["name"], "->", out_dir, flush=True)
    cfg, width = make_dflash_goldens.make_checkpoint(spec, out_dir)
    rng = np.random.default_rng(spec["seed"] + 500)
    extra = extend(spec, out_dir, cfg, rng)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    path = os.path.join(out_dir, "model.safetensors")
    tensors = {k: (spec["dtype"], v) for k, v in dflash_ref.read_safetensors(path).items()}
    for k, v in extra.items():
        tensors[spec["prefix"] + k] = (spec["dtype"], v)
    dflash_ref.write_safetensors(path, tensors, {"format": "pt"})

    V = cfg["vocab_size"]
    grng = np.random.default_rng(spec["seed"] + 1000)
    feats = grng.standard_normal((CTX, width)).astype(np.float32)
    anchors = grng.integers(3, V, size=2).astype(np.int32)
    out = {
        "ctx_feats": ("F32", feats),
        "anchors": ("I32", anchors),
        "anchor_pos": ("I32", np.array(ANCHOR_POS, dtype=np.int32)),
    }
    ref_cls, propose = golden
    ref = ref_cls(out_dir, spec["target"], "cpu")
    for i, s in enumerate(ANCHOR_POS):
        for name, value in propose(ref, feats[:s], int(anchors[i])).items():
            out["%s%d" % (name, i)] = value
    meta = {
        "generator": generator,
        "reference": reference,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": "cpu",
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "target": os.path.relpath(spec["target"], ROOT),
        "seed": str(spec["seed"]),
    }
    dflash_ref.write_safetensors(os.path.join(out_dir, "golden.safetensors"), out, meta)
