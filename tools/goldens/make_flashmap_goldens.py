#!/usr/bin/env python3
"""Random-init FlashMap test checkpoints for the stories260K target, and draft-logit goldens.

    /usr/bin/python3 tools/goldens/make_flashmap_goldens.py [--out tests/data] \
        [--target models/stories260K] [--device cpu|cuda]

Needs torch and numpy only (safetensors are written by hand, tools/reference/flashmap_ref.py). Writes:

    OUT/flashmap-stories260K/        config.json, model.safetensors (BF16)
    OUT/flashmap-stories260K-dv128/  the same weights, config draft_vocab_size 128, draft_vocab.safetensors
                                     (ids: all 512 target ids in a seeded "frequency" order, counts: I64)
    OUT/flashmap-goldens/golden.safetensors

The checkpoints follow seed 000's names and shapes (no `model.` prefix; embedding and LM head are the
target's): hidden 64, target_hidden_size 64, 2 layers, 4 heads of 16, intermediate 128, timestep_embed_dim
32, timestep_frequency_dim 16, block_size 8, eagle_aux_hidden_state_layer_ids [1, 2, 3] (target taps after
layers 0, 1, 2), time grids for 1, 2 and 3 jumps, noise_gate "jump". Weights are random (seeded), not
AdaLN-zero, so every sub-block contributes; they are stored in BF16 and the goldens are computed from the
stored (rounded) values, in float64, on --device.

Golden tensors (F32 unless noted; B = 8 slots, V = 512, P = 11 context positions, anchor at position P):
    taps [P, 192]             context features of positions 0..P-1 (fed to observe)
    anchor I32 [1]            anchor token (at position P)
    noise_vocab [B, V]        the vocabulary-sized starting state x0 (exact path; noise_scale 1)
    noise_eig [B, 64]         x0 mapped into the canonical eigenbasis (folded one-jump path):
                              U Λ^½ noise_eig = Eᵀ x0 (flashmap_ref.canonical_eigh)
    logits_j{1,2,3} [B, V]    draft logits with 1, 2, 3 jumps from noise_vocab
    logits_j1_zero [B, V]     1 jump from zero noise (noise_scale 0)
    dv_logits_j{1,2} [B, V]   the dv128 checkpoint (-inf outside its 128 draft ids)
    dv_hot_ids I32 [128]      its draft vocabulary (sorted target ids)
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import flashmap_ref as ref  # noqa: E402

SEED = 260
P = 11
ANCHOR = 403

CONFIG = {
    "architectures": ["FlashMapDraftModel"],
    "model_type": "flashmap",
    "hidden_size": 64,
    "target_hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "head_dim": 16,
    "intermediate_size": 128,
    "timestep_embed_dim": 32,
    "timestep_frequency_dim": 16,
    "time_scale": 1000.0,
    "time_grids": [[0.0, 1.0], [0.0, 0.6, 1.0], [0.0, 0.35, 0.7, 1.0]],
    "num_steps": 1,
    "noise_gate": "jump",
    "adaln_eps": 1e-6,
    "qk_norm_eps": 1e-6,
    "rms_norm_eps": 1e-6,
    "block_size": 8,
    "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
    "vocab_size": 512,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
}


def make_weights(cfg, gen):
    D, Ht, L = cfg["hidden_size"], cfg["target_hidden_size"], cfg["num_hidden_layers"]
    H, hd, inter = cfg["num_attention_heads"], cfg["head_dim"], cfg["intermediate_size"]
    C, Fq = cfg["timestep_embed_dim"], cfg["timestep_frequency_dim"]
    n_aux = len(cfg["eagle_aux_hidden_state_layer_ids"])
    w = {}

    def lin(name, out, inp, bias=True, gain=1.0, bias_std=0.02):
        w[name + ".weight"] = torch.randn(out, inp, generator=gen) * (gain / inp**0.5)
        if bias:
            w[name + ".bias"] = torch.randn(out, generator=gen) * bias_std

    def norm(name, dim):
        w[name + ".weight"] = 1.0 + 0.1 * torch.randn(dim, generator=gen)

    lin("fc", D, n_aux * Ht, bias=False)
    norm("hidden_norm", D)
    lin("anchor_proj", D, Ht)
    norm("anchor_norm", D)
    norm("state_norm", Ht)
    norm("noise_norm", Ht)
    w["noise_gate"] = torch.tensor([0.9])
    lin("x_embed", D, Ht)
    for t in ("time_embed", "jump_embed"):
        lin(t + ".linear_1", C, Fq, gain=1.5)
        lin(t + ".linear_2", C, C, gain=1.5)
    for i in range(L):
        p = "layers.%d." % i
        for a in ("self_attn_adaln", "cross_attn_adaln", "mlp_adaln"):
            lin(p + a + ".linear", 3 * D, C, gain=0.5, bias_std=0.3)
        for a in ("self_attn", "cross_attn"):
            for proj in ("q_proj", "k_proj", "v_proj"):
                lin(p + a + "." + proj, H * hd, D, bias=False)
            lin(p + a + ".o_proj", D, H * hd, bias=False)
            norm(p + a + ".q_norm", hd)
            norm(p + a + ".k_norm", hd)
        lin(p + "mlp.fc1", inter, D)
        lin(p + "mlp.fc2", D, inter)
    lin("final_adaln.linear", 3 * D, C, gain=0.5, bias_std=0.3)
    lin("head", Ht, D, gain=2.0)
    return {k: v.to(torch.bfloat16) for k, v in w.items()}


def write_checkpoint(folder, cfg, weights):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    ref.write_safetensors(os.path.join(folder, "model.safetensors"), weights, {"format": "pt"})


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.abspath(os.path.join(here, "..", ".."))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(root, "tests", "data"))
    ap.add_argument("--target", default=os.path.join(root, "models", "stories260K"))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()

    gen = torch.Generator().manual_seed(SEED)
    weights = make_weights(CONFIG, gen)
    main_dir = os.path.join(args.out, "flashmap-stories260K")
    write_checkpoint(main_dir, CONFIG, weights)

    dv_cfg = dict(CONFIG, draft_vocab_size=128)
    dv_dir = os.path.join(args.out, "flashmap-stories260K-dv128")
    write_checkpoint(dv_dir, dv_cfg, weights)
    order = torch.randperm(CONFIG["vocab_size"], generator=gen)
    counts = torch.arange(CONFIG["vocab_size"], 0, -1, dtype=torch.int64) * 7
    ref.write_safetensors(os.path.join(dv_dir, "draft_vocab.safetensors"),
                          {"ids": order.to(torch.int64), "counts": counts})

    B, V, Ht = CONFIG["block_size"], CONFIG["vocab_size"], CONFIG["target_hidden_size"]
    n_aux = len(CONFIG["eagle_aux_hidden_state_layer_ids"])
    taps = torch.randn(P, n_aux * Ht, generator=gen)
    x0 = torch.randn(B, V, generator=gen)

    m = ref.load_reference(main_dir, args.target, args.device)
    dv = ref.load_reference(dv_dir, args.target, args.device)
    g = {
        "taps": taps,
        "anchor": torch.tensor([ANCHOR], dtype=torch.int32),
        "noise_vocab": x0,
    }
    z = m.eigen_noise(x0)  # float64; stored as F32
    g["noise_eig"] = z
    for n in (1, 2, 3):
        g["logits_j%d" % n] = m.draft_logits(taps, ANCHOR, n, x0)
    g["logits_j1_zero"] = m.draft_logits(taps, ANCHOR, 1, x0, noise_scale=0.0)
    for n in (1, 2):
        g["dv_logits_j%d" % n] = dv.draft_logits(taps, ANCHOR, n, x0)
    g["dv_hot_ids"] = dv.hot_ids.to(torch.int32)

    # Self-checks: the folded one-jump path equals the exact one; the dv logits are the full ones
    # restricted to the draft vocabulary at one jump (the head is the same; between jumps it is not).
    folded = m.one_jump_folded(taps, ANCHOR, z)
    err = (folded - g["logits_j1"]).abs().max().item()
    assert err < 1e-9, err
    hot = dv.hot_ids
    assert torch.equal(g["dv_logits_j1"][:, hot], g["logits_j1"][:, hot])
    for n in (1, 2, 3):
        print("%d jump(s): argmax %s" % (n, g["logits_j%d" % n].argmax(-1).tolist()))
    print("dv 1 jump: argmax %s" % g["dv_logits_j1"].argmax(-1).tolist())
    print("folded vs exact one jump: max |diff| %.3g" % err)

    out = {k: (v.float().cpu() if v.is_floating_point() else v.cpu()) for k, v in g.items()}
    gdir = os.path.join(args.out, "flashmap-goldens")
    os.makedirs(gdir, exist_ok=True)
    ref.write_safetensors(os.path.join(gdir, "golden.safetensors"), out,
                          {"P": P, "anchor_pos": P, "made_by": "tools/goldens/make_flashmap_goldens.py",
                           "device": args.device, "torch": torch.__version__})
    print("wrote", main_dir, dv_dir, gdir)


if __name__ == "__main__":
    main()
