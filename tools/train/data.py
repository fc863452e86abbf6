#!/usr/bin/env python3
"""Training data for the stories260K drafters, sampled from the target itself.

    python3 tools/train/data.py --out OUT/data.pt --device cuda --seed 0 \
        --n-sample 16384 --n-greedy 16384 --n-eval 64 --len 256

Everything is one batched, KV-cached generation of --len tokens per sequence (position 0 = BOS):

  * "sample": --n-sample stories at temperature 1 from BOS alone;
  * "greedy": --n-greedy greedy (T = 0) continuations of prefixes of the sample stories: prefix
    length l ~ U{1..--max-prefix} (l = 1 is BOS alone), the prefix tokens forced, the rest argmax;
  * "eval": --n-eval held-out prompts, from separately seeded temperature-1 stories (a different
    generator stream from the training data), cut at a length ~ U{--eval-min..--eval-max}.

No stop token: stories260K separates stories with BOS (id 1) and never emits EOS (id 2), so every
sequence has exactly --len tokens. Hidden states are not stored: the trainers recompute the
target's taps on the fly (the target has 260K parameters).

Output: a torch file {tokens: int16 [N, len], kind: int8 [N] (0 sample, 1 greedy), eval_prompts:
list of int lists, args}, and eval_prompts.json next to it (ids and decoded text).
If `transformers` is importable (GPU machine), also checks this file's target forward against
transformers' LlamaForCausalLM on a batch of the generated data (max |logit diff| is logged).
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


@torch.no_grad()
def generate(target, prefix, prefix_len, greedy, length, gen, chunk=8192):
    """prefix [N, >=max(prefix_len)] forced tokens; position t < prefix_len[i] takes prefix[i, t],
    later positions the target's argmax (greedy[i]) or a temperature-1 sample."""
    outs = []
    N = prefix.shape[0]
    for c0 in range(0, N, chunk):
        sl = slice(c0, min(N, c0 + chunk))
        pre, plen, gr = prefix[sl], prefix_len[sl], greedy[sl]
        n = pre.shape[0]
        toks = torch.empty(n, length, dtype=torch.long, device=target.dev)
        toks[:, 0] = pre[:, 0]
        cache = {}
        logits = target.forward(toks[:, :1], 0, cache)[:, -1]
        for t in range(1, length):
            probs = torch.softmax(logits.float(), -1)
            samp = torch.multinomial(probs, 1, generator=gen)[:, 0]
            nxt = torch.where(gr, logits.argmax(-1), samp)
            if t < pre.shape[1]:
                nxt = torch.where(plen > t, pre[:, t], nxt)
            toks[:, t] = nxt
            if t + 1 < length:
                logits = target.forward(nxt[:, None], t, cache)[:, -1]
        outs.append(toks)
    return torch.cat(outs)


def decode(ids, vocab):
    s = "".join(vocab.get(i, "?") for i in ids)
    return s.replace("\u2581", " ")


def load_vocab():
    with open(os.path.join(common.TARGET_DIR, "tokenizer.json")) as f:
        tj = json.load(f)
    vocab = {v: k for k, v in tj["model"]["vocab"].items()}
    for t in tj.get("added_tokens", []):
        vocab[t["id"]] = t["content"]
    # Byte-fallback pieces <0xNN> rendered as bytes would need a decoder; keep them as text.
    return vocab


def hf_parity(target, toks, log):
    try:
        import transformers  # noqa: F401
        from transformers import LlamaForCausalLM
    except Exception as e:  # noqa: BLE001
        log("transformers not available (%s): parity check skipped" % type(e).__name__)
        return None
    try:
        try:
            m = LlamaForCausalLM.from_pretrained(common.TARGET_DIR, dtype=torch.float32)
        except TypeError:
            m = LlamaForCausalLM.from_pretrained(common.TARGET_DIR, torch_dtype=torch.float32)
        m = m.to(target.dev).eval()
        x = toks[:8].to(target.dev)
        with torch.no_grad():
            out = m(x, output_hidden_states=True)
            ref = out.logits.float()
            mine, feats = target.forward(x, taps=list(range(target.n_layers - 1)))
        d = (ref - mine).abs().max().item()
        dh = max((out.hidden_states[i + 1].float() - feats[..., i * target.H:(i + 1) * target.H])
                 .abs().max().item() for i in range(target.n_layers - 1))
        agree = (ref.argmax(-1) == mine.argmax(-1)).float().mean().item()
        log("transformers %s parity on [8, %d]: max |logit diff| %.3g, max |hidden diff| "
            "(hidden_states[1..%d]) %.3g, argmax agreement %.5f" % (
                transformers.__version__, x.shape[1], d, target.n_layers - 1, dh, agree))
        return {"max_logit_diff": d, "max_hidden_diff": dh, "argmax_agreement": agree,
                "transformers": transformers.__version__}
    except Exception as e:  # noqa: BLE001
        log("transformers parity check failed: %r" % (e,))
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-sample", type=int, default=16384)
    ap.add_argument("--n-greedy", type=int, default=16384)
    ap.add_argument("--max-prefix", type=int, default=128)
    ap.add_argument("--n-eval", type=int, default=64)
    ap.add_argument("--eval-min", type=int, default=8)
    ap.add_argument("--eval-max", type=int, default=32)
    ap.add_argument("--len", type=int, default=256)
    ap.add_argument("--no-hf-parity", action="store_true",
                    help="skip the transformers parity check (it does not change the data)")
    a = ap.parse_args()
    log = common.Log("data")
    dev = common.setup_device(a.device)
    common.seed_all(a.seed)
    target = common.Target(device=dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    L = a.len

    # 1. Temperature-1 stories from BOS.
    n = a.n_sample
    bos = torch.full((n, 1), target.bos, dtype=torch.long, device=dev)
    sample = generate(target, bos, torch.ones(n, dtype=torch.long, device=dev),
                      torch.zeros(n, dtype=torch.bool, device=dev), L, gen)
    common.sync(dev)
    log("sampled %d stories x %d tokens" % (n, L))

    # 2. Greedy continuations of prefixes of those stories.
    g = a.n_greedy
    src = torch.randint(0, n, (g,), generator=gen, device=dev)
    plen = torch.randint(1, a.max_prefix + 1, (g,), generator=gen, device=dev)
    greedy = generate(target, sample[src, :a.max_prefix], plen,
                      torch.ones(g, dtype=torch.bool, device=dev), L, gen)
    common.sync(dev)
    log("greedy continuations: %d x %d tokens (prefix 1..%d)" % (g, L, a.max_prefix))

    # 3. Held-out evaluation prompts: a separate generator stream.
    egen = torch.Generator(device=dev)
    egen.manual_seed(a.seed + 1000003)
    m = a.n_eval
    ebos = torch.full((m, 1), target.bos, dtype=torch.long, device=dev)
    ev = generate(target, ebos, torch.ones(m, dtype=torch.long, device=dev),
                  torch.zeros(m, dtype=torch.bool, device=dev), a.eval_max, egen)
    elen = torch.randint(a.eval_min, a.eval_max + 1, (m,), generator=egen, device=dev)
    prompts = [ev[i, :elen[i]].tolist() for i in range(m)]

    toks = torch.cat([sample, greedy]).to(torch.int16).cpu()
    kind = torch.cat([torch.zeros(n, dtype=torch.int8), torch.ones(g, dtype=torch.int8)])
    n_eos = int((toks == 2).sum())
    n_bos = int((toks[:, 1:] == target.bos).sum())
    log("tokens: %d (%d EOS, %d story separators); unique greedy rows: %d / %d" % (
        toks.numel(), n_eos, n_bos, len(set(map(tuple, greedy[:, :].tolist()))), g))
    parity = (hf_parity(target, toks[:8].long(), log)
              if a.device == "cuda" and not a.no_hf_parity else None)

    vocab = load_vocab()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    torch.save({"tokens": toks, "kind": kind, "eval_prompts": prompts, "args": vars(a),
                "hf_parity": parity}, a.out)
    with open(os.path.join(os.path.dirname(os.path.abspath(a.out)), "eval_prompts.json"), "w") as f:
        head = {"description": "held-out prompts for tools/train/eval.py: token ids (BOS first) of "
                               "temperature-1 stories of stories260K, cut at 8..32 tokens; a "
                               "generator stream separate from the training data",
                "made_by": "tools/train/data.py --seed %d" % a.seed}
        f.write(json.dumps(head, indent=1)[:-2] + ',\n "prompts": [\n')
        f.write(",\n".join("  " + json.dumps({"ids": p, "text": decode(p, vocab)})
                            for p in prompts))
        f.write("\n ]\n}\n")
    for i in range(2):
        log("sample %d: %r" % (i, decode(sample[i, :80].tolist(), vocab)))
        log("greedy %d (prefix %d): %r" % (i, int(plen[i]), decode(greedy[i, :80].tolist(), vocab)))
    log("wrote %s" % a.out)


if __name__ == "__main__":
    main()
