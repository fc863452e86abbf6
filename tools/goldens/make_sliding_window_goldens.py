#!/usr/bin/env python3
"""Sliding-window target goldens from the transformers-free reference (tools/reference/target_ref.py).

Writes two tiny random checkpoints in the layout users download, each with golden.safetensors
(prompt_ids I32 [P], logits F32 [P, V]) for a prompt much longer than the window:
  tests/data/tiny-mistral-swa  MistralForCausalLM (BF16 weights, head_dim 64), sliding_window 5 in every layer
  tests/data/tiny-qwen2-swa    Qwen2ForCausalLM, use_sliding_window, sliding_window 4,
                               max_window_layers 1 (layer 0 full, layers 1.. slide), q/k/v biases

CPU only, fp32 (Debian 12: apt-get install python3-torch python3-numpy):
    python3 tools/goldens/make_sliding_window_goldens.py --out tests/data
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import dflash_ref  # noqa: E402
from target_ref import TargetRef  # noqa: E402

# head_dim 64: the CUDA flash-prefill kernel (more than 16 rows, hd 64 or 128) takes the prompt.
H, HEADS, KV_HEADS, HD, INTER, V, LAYERS, PROMPT = 64, 4, 2, 64, 160, 320, 3, 24


def make(out_dir, name, arch, extra_cfg, qkv_bias, seed):
    rng = np.random.default_rng(seed)

    def lin(o, i, std):
        return (rng.standard_normal((o, i)) * std).astype(np.float32)

    def norm_w(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": (rng.standard_normal((V, H)) * 0.5).astype(np.float32)}
    for li in range(LAYERS):
        p = "model.layers.%d." % li
        w[p + "input_layernorm.weight"] = norm_w(H)
        w[p + "post_attention_layernorm.weight"] = norm_w(H)
        w[p + "self_attn.q_proj.weight"] = lin(HEADS * HD, H, 0.15)
        w[p + "self_attn.k_proj.weight"] = lin(KV_HEADS * HD, H, 0.15)
        w[p + "self_attn.v_proj.weight"] = lin(KV_HEADS * HD, H, 0.15)
        w[p + "self_attn.o_proj.weight"] = lin(H, HEADS * HD, 0.15)
        if qkv_bias:
            w[p + "self_attn.q_proj.bias"] = (rng.standard_normal(HEADS * HD) * 0.2).astype(np.float32)
            w[p + "self_attn.k_proj.bias"] = (rng.standard_normal(KV_HEADS * HD) * 0.2).astype(np.float32)
            w[p + "self_attn.v_proj.bias"] = (rng.standard_normal(KV_HEADS * HD) * 0.2).astype(np.float32)
        w[p + "mlp.gate_proj.weight"] = lin(INTER, H, 0.2)
        w[p + "mlp.up_proj.weight"] = lin(INTER, H, 0.2)
        w[p + "mlp.down_proj.weight"] = lin(H, INTER, 0.12)
    w["model.norm.weight"] = norm_w(H)
    w["lm_head.weight"] = lin(V, H, 0.4)
    cfg = {
        "architectures": [arch],
        "hidden_act": "silu",
        "hidden_size": H,
        "intermediate_size": INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HD,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "vocab_size": V,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }
    cfg.update(extra_cfg)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    dflash_ref.write_safetensors(os.path.join(d, "model.safetensors"),
                                 {k: ("BF16", v) for k, v in w.items()}, {"format": "pt"})
    ref = TargetRef(d)
    prompt = [int(t) for t in rng.integers(3, V, size=PROMPT)]
    with torch.no_grad():
        logits = ref.forward(prompt).numpy()
    # The same model without windows, to show that the window changes the logits.
    full = TargetRef(d)
    full.sliding = [False] * LAYERS
    with torch.no_grad():
        delta = float(np.abs(full.forward(prompt).numpy() - logits).max())
    dflash_ref.write_safetensors(
        os.path.join(d, "golden.safetensors"),
        {"prompt_ids": ("I32", np.array(prompt, dtype=np.int32)), "logits": ("F32", logits)},
        {"reference": "tools/reference/target_ref.py", "torch": torch.__version__,
         "sliding_layers": str(ref.sliding), "window": str(ref.window),
         "max_abs_change_vs_no_window": "%.4f" % delta})
    print("%s: sliding %s window %s, |logits - no-window logits| max %.4f"
          % (name, ref.sliding, ref.window, delta))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data")
    a = ap.parse_args()
    torch.manual_seed(0)
    make(a.out, "tiny-mistral-swa", "MistralForCausalLM",
         {"model_type": "mistral", "sliding_window": 5}, qkv_bias=False, seed=1401)
    make(a.out, "tiny-qwen2-swa", "Qwen2ForCausalLM",
         {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4,
          "max_window_layers": 1}, qkv_bias=True, seed=1402)


if __name__ == "__main__":
    main()
