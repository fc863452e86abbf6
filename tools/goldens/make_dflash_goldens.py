#!/usr/bin/env python3
"""Random DFlash test checkpoints (in the format users download) and golden drafter logits.

Writes, under --out (default tests/data):

    dflash-stories260K/      config.json model.safetensors golden.safetensors
        for the stories260K target (hidden 64, vocab 512, 5 layers): 2 layers, heads 4, kv heads 2,
        head_dim 16, intermediate 128, top-level block_size 8, dflash_config.target_layer_ids
        [1,2,3], mask_token_id 0 (<unk>), eps 1e-6, rope_theta 1e4, F32, names without prefix,
        embedding and LM head shared from the target.
    dflash-stories260K-swa/  same target; exercises the other spellings: `model.` prefix, BF16
        storage, block_size inside dflash_config (6), no target_layer_ids (default rule ->
        [1,2]), its own embed_tokens/lm_head, layer_types [sliding_attention, full_attention]
        with sliding_window 4 (layer 0 causal + windowed, layer 1 non-causal, dflash.md §1.4).
    dflash-tiny-qwen3/, dflash-tiny-llama/   only when tests/data/tiny-qwen3 / tiny-llama exist
        (made by make_target_goldens.py).

Golden tensors (golden.safetensors, all F32 unless noted):
    ctx_feats [23, n_taps*H_t]   random context features of positions 0..22 (N(0,1))
    anchors I32 [2]              anchor tokens of the two proposes
    anchor_pos I32 [2]           [20, 23]
    logits0 [B-1, V]             propose at s=20 after observing positions 0..19
    logits1 [B-1, V]             propose at s=23 after observing positions 20..22 as well

Weights come from numpy's seeded generator (identical on every machine); only the logits depend on
--device (fp32 everywhere, TF32 off on CUDA). Run:

    /usr/bin/python3 tools/goldens/make_dflash_goldens.py [--device cpu|cuda] [--out tests/data]
"""

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
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import dflash_ref  # noqa: E402

CTX = 23
ANCHOR_POS = [20, 23]


def drafter_specs(data_dir, stories_dir):
    specs = [
        dict(
            name="dflash-stories260K", target=stories_dir, seed=11, dtype="F32", prefix="",
            own_embed=False, block_where="top", block_size=8, layers=2, heads=4, kv_heads=2,
            head_dim=16, inter=128, target_layer_ids=[1, 2, 3], mask_token_id=0, eps=1e-6,
            rope_theta=10000.0, layer_types=None, sliding_window=None),
        dict(
            name="dflash-stories260K-swa", target=stories_dir, seed=12, dtype="BF16",
            prefix="model.", own_embed=True, block_where="dflash_config", block_size=6, layers=2,
            heads=4, kv_heads=2, head_dim=16, inter=96, target_layer_ids=None, mask_token_id=0,
            eps=1e-6, rope_theta=10000.0, layer_types=["sliding_attention", "full_attention"],
            sliding_window=4),
    ]
    tq = os.path.join(data_dir, "tiny-qwen3")
    if os.path.exists(os.path.join(tq, "config.json")):
        specs.append(dict(
            name="dflash-tiny-qwen3", target=tq, seed=13, dtype="F32", prefix="", own_embed=False,
            block_where="top", block_size=8, layers=2, heads=4, kv_heads=2, head_dim=32, inter=128,
            target_layer_ids=[0, 2], mask_token_id=None, eps=1e-6, rope_theta=1000000.0,
            layer_types=None, sliding_window=None))
    tl = os.path.join(data_dir, "tiny-llama")
    if os.path.exists(os.path.join(tl, "config.json")):
        specs.append(dict(
            name="dflash-tiny-llama", target=tl, seed=14, dtype="F32", prefix="", own_embed=False,
            block_where="dflash_config", block_size=5, layers=1, heads=6, kv_heads=2, head_dim=8,
            inter=96, target_layer_ids=None, mask_token_id=None, eps=1e-5, rope_theta=10000.0,
            layer_types=None, sliding_window=None))
    return specs


def make_checkpoint(spec, out_dir):
    with open(os.path.join(spec["target"], "config.json")) as f:
        tcfg = json.load(f)
    H = tcfg["hidden_size"]
    V = tcfg["vocab_size"]
    n_target = tcfg["num_hidden_layers"]
    mask_id = spec["mask_token_id"] if spec["mask_token_id"] is not None else V - 1
    L = spec["layers"]
    ids = spec["target_layer_ids"]
    n_taps = len(ids) if ids is not None else len(dflash_ref.default_target_layer_ids(n_target, L))
    hd, nh, nkv, inter = spec["head_dim"], spec["heads"], spec["kv_heads"], spec["inter"]
    rng = np.random.default_rng(spec["seed"])

    def lin(o, i, std):
        return (rng.standard_normal((o, i)) * std).astype(np.float32)

    def norm_w(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = {}
    w["fc.weight"] = lin(H, n_taps * H, 1.0 / np.sqrt(n_taps * H))
    w["hidden_norm.weight"] = norm_w(H)
    for li in range(L):
        p = "layers.%d." % li
        w[p + "input_layernorm.weight"] = norm_w(H)
        w[p + "post_attention_layernorm.weight"] = norm_w(H)
        w[p + "self_attn.q_proj.weight"] = lin(nh * hd, H, 0.25)
        w[p + "self_attn.k_proj.weight"] = lin(nkv * hd, H, 0.25)
        w[p + "self_attn.v_proj.weight"] = lin(nkv * hd, H, 0.25)
        w[p + "self_attn.o_proj.weight"] = lin(H, nh * hd, 0.15)
        w[p + "self_attn.q_norm.weight"] = norm_w(hd)
        w[p + "self_attn.k_norm.weight"] = norm_w(hd)
        w[p + "mlp.gate_proj.weight"] = lin(inter, H, 0.2)
        w[p + "mlp.up_proj.weight"] = lin(inter, H, 0.2)
        w[p + "mlp.down_proj.weight"] = lin(H, inter, 0.12)
    w["norm.weight"] = norm_w(H)
    if spec["own_embed"]:
        w["embed_tokens.weight"] = (rng.standard_normal((V, H)) * 0.35).astype(np.float32)
        w["lm_head.weight"] = (rng.standard_normal((V, H)) * 0.35).astype(np.float32)

    cfg = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "hidden_size": H,
        "intermediate_size": inter,
        "num_hidden_layers": L,
        "num_attention_heads": nh,
        "num_key_value_heads": nkv,
        "head_dim": hd,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rms_norm_eps": spec["eps"],
        "rope_theta": spec["rope_theta"],
        "rope_scaling": None,
        "max_position_embeddings": tcfg.get("max_position_embeddings", 2048),
        "vocab_size": V,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16" if spec["dtype"] == "BF16" else "float32",
        "num_target_layers": n_target,
    }
    dc = {"mask_token_id": mask_id}
    if ids is not None:
        dc["target_layer_ids"] = ids
    if spec["block_where"] == "top":
        cfg["block_size"] = spec["block_size"]
    else:
        dc["block_size"] = spec["block_size"]
    cfg["dflash_config"] = dc
    if spec["layer_types"] is not None:
        cfg["layer_types"] = spec["layer_types"]
        cfg["use_sliding_window"] = True
        cfg["sliding_window"] = spec["sliding_window"]
        cfg["max_window_layers"] = 0
    else:
        cfg["layer_types"] = ["full_attention"] * L
        cfg["use_sliding_window"] = False
        cfg["sliding_window"] = None
        cfg["max_window_layers"] = L

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    tensors = {spec["prefix"] + k: (spec["dtype"], v) for k, v in w.items()}
    dflash_ref.write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors,
                                 {"format": "pt"})
    return cfg, n_taps * H


def make_golden(spec, out_dir, width, device):
    ref = dflash_ref.DFlashRef(out_dir, spec["target"], device)
    V = ref.lm_head.shape[0]
    rng = np.random.default_rng(spec["seed"] + 1000)
    feats = rng.standard_normal((CTX, width)).astype(np.float32)
    anchors = rng.integers(3, V, size=2).astype(np.int32)
    logits0 = ref.propose(feats[: ANCHOR_POS[0]], int(anchors[0])).numpy()
    logits1 = ref.propose(feats[: ANCHOR_POS[1]], int(anchors[1])).numpy()
    meta = {
        "generator": "tools/goldens/make_dflash_goldens.py",
        "reference": "tools/reference/dflash_ref.py",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": device,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "target": os.path.relpath(spec["target"], ROOT),
        "seed": str(spec["seed"]),
    }
    dflash_ref.write_safetensors(os.path.join(out_dir, "golden.safetensors"), {
        "ctx_feats": ("F32", feats),
        "anchors": ("I32", anchors),
        "anchor_pos": ("I32", np.array(ANCHOR_POS, dtype=np.int32)),
        "logits0": ("F32", logits0),
        "logits1": ("F32", logits1),
    }, meta)
    d0 = logits0.argmax(-1).tolist()
    d1 = logits1.argmax(-1).tolist()
    print("  drafts0", d0, "drafts1", d1, flush=True)
    if len(set(d0 + d1)) < 3:
        print("  WARNING: drafts are nearly constant; raise the weight scales", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data"))
    ap.add_argument("--stories", default=os.path.join(ROOT, "models", "stories260K"))
    a = ap.parse_args()
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    for spec in drafter_specs(a.out, a.stories):
        out_dir = os.path.join(a.out, spec["name"])
        print(spec["name"], "->", out_dir, flush=True)
        _, width = make_checkpoint(spec, out_dir)
        make_golden(spec, out_dir, width, a.device)


if __name__ == "__main__":
    main()
