#!/usr/bin/env python3
"""Acceptance of the trained drafters on held-out prompts, simulated with the PyTorch models: the
"PyTorch reference" figures the engine's speculative loop is compared against.

    python3 tools/train/eval.py --prompts tools/train/eval_prompts.json \
        --dflash models/stories260K-dflash --flashmap models/stories260K-flashmap \
        --dspark models/stories260K-dspark --dflash2 models/stories260K-dflash2 \
        --device cuda --max-new 192 --jumps 1,2,4 --seed 0 --subset 32 --json OUT/eval.json

Loop (batch over prompts, one target pass per step, as dflash.md §2 / serving.md §1):
  prefill: the target on the prompt (P tokens) gives the first token at position P (argmax at
    T = 0, a sample at T = 1) and the context features of positions 0..P-1;
  step: anchor = last committed token at position s; the drafter proposes from the features of
    positions 0..s-1, each family as the engine drafts it:
      DFlash: rows 1..B-1 of [anchor, MASK x (B-1)] -> B-1 drafts for s+1..s+B-1, the argmax of
        each row, proposal one-hot on it at every temperature;
      FlashMap: B slots -> B drafts for s+1..s+B, from seeded noise x0 ~ N(0, I_V) * noise_scale,
        with 1, 2 or 4 jumps; argmax, one-hot proposal;
      DSpark (dflash.md §4): all B rows (row k drafts s+k+1) -> B drafts, the Markov chain left
        to right: T = 0 argmax of z_k = U_k + W2 W1[prev_k], T > 0 a draw from
        q_k = softmax(z_k / T) (prev = the anchor, then the previous draft);
      DFlash2 (§5.4): rows 1..B-1 -> B-1 drafts by the candidate-selector walk: T = 0 argmax of
        the top-16 scores S_p, T > 0 a draw from q_p = softmax(S_p / T) over the candidates;
    the target verifies [anchor, drafts] in one pass;
  accept: T = 0: the longest prefix of drafts equal to the target's argmax, plus the target's
    argmax after it (bonus); T = 1: standard speculative rejection sampling with the drafter's
    proposal q (serving.md §1.9: accept d_k iff u q_k(d_k) < p_k(d_k); at the first rejection
    sample from norm(max(p_k - q_k, 0)) - for a one-hot q: p_k with d_k removed; if all are
    accepted the bonus is a sample of the next row) - lossless for any drafter;
  commit a accepted drafts + 1 bonus; the verify pass gives the context features of the new
    positions. Each prompt generates exactly --max-new tokens (the first from the prefill): as in
    the engine, a step verifies at most (tokens still wanted - 1) drafts; no stop token
    (stories260K never emits EOS).
Figures: tau = mean over verify steps of (accepted + 1), all prompts pooled; per-position
acceptance acc[k] = P(a >= k | draft k was verified), k = 1..#drafts (tau = 1 + sum_k acc[k] up to
the few clipped final steps); --subset N adds the same figures over the first N prompts' steps of
the run (at T = 0 equal to a run of those N prompts alone). DSpark runs also report the confidence
head's predicted prefix survival a_k = c_1..c_k averaged like acc[k]. At T = 0 the generated text is
checked against plain greedy decoding.
The target runs with a per-row KV buffer (positions s..s+#drafts written each step, causal mask
over absolute positions); --recompute instead reruns it over the whole sequence each step.
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import dflash  # noqa: E402
import dflash2  # noqa: E402
import dspark  # noqa: E402
import flashmap  # noqa: E402


def sample_from(p, gen):
    return torch.multinomial(p, 1, generator=gen)[:, 0]


@torch.no_grad()
def run_spec(target, prompts, kind, drafter, temp, max_new, gen, jumps=1, noise_scale=1.0,
             chunk=128, recompute=False):
    """Returns (accepted [steps], drafts offered [steps], prompt index [steps], outputs, drafts
    per step, DSpark's predicted survival [steps, nd] or None). kind: 'dflash' | 'dspark' |
    'dflash2' (drafter.propose) or 'flashmap'."""
    dev = target.dev
    all_a, all_k, all_i, all_surv, outs = [], [], [], [], []
    nd = drafter.B if kind == "flashmap" else drafter.num_drafts
    taps = drafter.taps
    for c0 in range(0, len(prompts), chunk):
        ps = prompts[c0:c0 + chunk]
        N = len(ps)
        P = torch.tensor([len(p) for p in ps], device=dev)
        Lmax = int(P.max()) + max_new + 2 * nd + 4  # an inactive row may sit nd past max_new
        buf = torch.zeros(N, Lmax, dtype=torch.long, device=dev)
        for i, p in enumerate(ps):
            buf[i, :len(p)] = torch.tensor(p, device=dev)
        rows = torch.arange(N, device=dev)
        Pm = int(P.max())
        if recompute:
            logits, feats = target.forward(buf, taps=taps)
        else:
            kv = target.new_cache(N, Lmax)
            feats = torch.zeros(N, Lmax, len(taps) * target.H, device=dev)
            logits, f0 = target.forward_rows(buf[:, :Pm], torch.arange(Pm, device=dev).expand(
                N, Pm), kv, taps=taps)
            feats[:, :Pm] = f0
        last = logits[rows, P - 1]
        first = last.argmax(-1) if temp == 0 else sample_from(torch.softmax(last / temp, -1), gen)
        buf[rows, P] = first
        s = P.clone()  # anchor position
        gen_n = torch.ones(N, dtype=torch.long, device=dev)
        blk = torch.arange(0, nd + 1, device=dev)
        while True:
            active = gen_n < max_new
            if not bool(active.any()):
                break
            anchors = s[:, None]
            q = None  # the proposal [N, nd, V]; None: one-hot on the drafts
            if kind == "flashmap":
                ctx = drafter.context(feats)
                noise = torch.randn(N, 1, drafter.B, drafter.V, generator=gen, device=dev)
                dl = drafter.draft(ctx, buf, anchors, noise * noise_scale, jumps)[:, 0]
                drafts = dl.argmax(-1)  # [N, nd]
            else:
                drafts, q = drafter.propose(feats, buf, anchors, temp, gen)
                if kind == "dspark":
                    all_surv.append(drafter.last_survival[active].cpu())
            pos = s[:, None] + blk  # anchor and draft positions
            buf[rows[:, None], pos[:, 1:]] = drafts
            if recompute:
                logits, feats = target.forward(buf, taps=taps)
                vl = logits[rows[:, None], pos]  # [N, nd+1, V]
            else:
                vl, fb = target.forward_rows(buf[rows[:, None], pos], pos, kv, taps=taps)
                feats[rows[:, None], pos] = fb
            # Drafts verified this step: at most the tokens still wanted minus the bonus (as the
            # engine does), so a prompt ends with exactly max_new generated tokens.
            kmax = (max_new - gen_n - 1).clamp(0, nd)
            allowed = torch.arange(nd, device=dev)[None, :] < kmax[:, None]
            if temp == 0:
                tgt = vl.argmax(-1)
                ok = (drafts == tgt[:, :nd]) & allowed
                a = torch.cumprod(ok.long(), -1).sum(-1)
                bonus = tgt[rows, a]
            else:
                a, bonus = rejection_sample(torch.softmax(vl / temp, -1), drafts, q, kmax,
                                            allowed, gen)
            buf[rows, s + a + 1] = bonus
            all_a.append(a[active].cpu())
            all_k.append(kmax[active].cpu())
            all_i.append((c0 + rows)[active].cpu())
            s = torch.where(active, s + a + 1, s)
            gen_n = torch.where(active, gen_n + a + 1, gen_n)
        for i in range(N):
            outs.append(buf[i, int(P[i]):int(P[i]) + max_new].tolist())
    acc = torch.cat(all_a) if all_a else torch.zeros(0, dtype=torch.long)
    kmx = torch.cat(all_k) if all_k else torch.zeros(0, dtype=torch.long)
    idx = torch.cat(all_i) if all_i else torch.zeros(0, dtype=torch.long)
    surv = torch.cat(all_surv) if all_surv else None
    return acc, kmx, idx, outs, nd, surv


def rejection_sample(p, drafts, q, kmax, allowed, gen):
    """Speculative rejection sampling (serving.md §1.9, dflash.md §2.5): p [N, nd+1, V] the
    target's rows, drafts [N, nd], q [N, nd, V] the proposal (None: one-hot on the drafts).
    Accept d_k iff u_k < p_k(d_k) / q_k(d_k) (a prefix); at the first rejection draw from
    norm(max(p_k - q_k, 0)) (p_k if that is all zero); if all kmax drafts are accepted, the bonus
    is a draw from p of the next row. Returns (accepted count a [N], bonus [N])."""
    N, nd = drafts.shape
    rows = torch.arange(N, device=p.device)
    pd = torch.gather(p[:, :nd], 2, drafts[..., None])[..., 0]
    u = torch.rand(N, nd, generator=gen, device=p.device)
    if q is None:
        ok = (u < pd) & allowed
    else:
        qd = torch.gather(q, 2, drafts[..., None])[..., 0]
        ok = (u * qd < pd) & allowed
    a = torch.cumprod(ok.long(), -1).sum(-1)
    pa = p[rows, a].clone()  # row a: residual (if rejected) or bonus row
    rej = a < kmax
    if q is None:
        da = drafts[rows, a.clamp(max=nd - 1)]
        pa[rows[rej], da[rej]] = 0.0
    else:
        qa = q[rows, a.clamp(max=nd - 1)]
        res = (pa - qa).clamp_min(0.0)
        empty = res.sum(-1) <= 0
        res[empty] = pa[empty]
        pa = torch.where(rej[:, None], res, pa)
    pa = pa / pa.sum(-1, keepdim=True)
    return a, sample_from(pa, gen)


def summarize(acc, kmx, nd, surv=None):
    steps = acc.numel()
    tau = (acc.float() + 1).mean().item()
    pos = [((acc >= k).sum() / (kmx >= k).sum().clamp_min(1)).item() for k in range(1, nd + 1)]
    hist = [(acc == k).sum().item() for k in range(nd + 1)]
    r = {"tau": tau, "steps": steps, "per_position": pos, "accept_hist": hist}
    if surv is not None:
        # DSpark's confidence head: the predicted prefix survival a_k = c_1 .. c_k, averaged over
        # the steps that verified draft k (compare with per_position).
        r["predicted_survival"] = [
            (surv[:, k - 1][kmx >= k].mean().item() if bool((kmx >= k).any()) else 0.0)
            for k in range(1, nd + 1)]
    return r


@torch.no_grad()
def greedy_reference(target, prompts, max_new):
    """Plain greedy decoding (KV-cached, batched) of max_new tokens per prompt."""
    dev = target.dev
    N = len(prompts)
    P = torch.tensor([len(p) for p in prompts], device=dev)
    Pm = int(P.max())
    buf = torch.zeros(N, Pm + max_new, dtype=torch.long, device=dev)
    for i, p in enumerate(prompts):
        buf[i, :len(p)] = torch.tensor(p, device=dev)
    rows = torch.arange(N, device=dev)
    kv = target.new_cache(N, Pm + max_new)
    logits = target.forward_rows(buf[:, :Pm], torch.arange(Pm, device=dev).expand(N, Pm), kv)
    nxt = logits[rows, P - 1].argmax(-1)
    for t in range(max_new):
        buf[rows, P + t] = nxt
        if t + 1 < max_new:
            nxt = target.forward_rows(nxt[:, None], (P + t)[:, None], kv)[:, 0].argmax(-1)
    return [buf[i, int(P[i]):int(P[i]) + max_new].tolist() for i in range(N)]


def fmt_row(name, r):
    pp = " ".join("%.3f" % x for x in r["per_position"])
    return "| %s | %.3f | %d | %s |" % (name, r["tau"], r["steps"], pp)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--prompts", required=True, help="eval_prompts.json (from data.py)")
    ap.add_argument("--dflash", default=None)
    ap.add_argument("--flashmap", default=None)
    ap.add_argument("--dspark", default=None)
    ap.add_argument("--dflash2", default=None)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--max-new", type=int, default=192)
    ap.add_argument("--n-prompts", type=int, default=0, help="0 = all")
    ap.add_argument("--subset", type=int, default=0,
                    help="also summarise the first N prompts of the run (their steps in it)")
    ap.add_argument("--jumps", default="1,2,4")
    ap.add_argument("--temps", default="0,1")
    ap.add_argument("--zero-noise", action="store_true",
                    help="also FlashMap at T=0 with noise_scale 0 (deterministic drafts)")
    ap.add_argument("--zero-noise-all-temps", action="store_true",
                    help="with --zero-noise: at every temperature, not only T=0")
    ap.add_argument("--no-sampled-noise", action="store_true",
                    help="skip the FlashMap runs with noise_scale 1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-greedy-check", action="store_true")
    ap.add_argument("--recompute", action="store_true",
                    help="recompute the target over the whole sequence each step (no KV cache)")
    a = ap.parse_args()
    log = common.Log("eval")
    dev = common.setup_device(a.device)
    target = common.Target(device=dev)
    with open(a.prompts) as f:
        prompts = [p["ids"] for p in json.load(f)["prompts"]]
    if a.n_prompts:
        prompts = prompts[:a.n_prompts]
    temps = [float(x) for x in a.temps.split(",")]
    jumps = [int(x) for x in a.jumps.split(",")]
    ref_greedy = None
    if 0.0 in temps and not a.no_greedy_check:
        ref_greedy = greedy_reference(target, prompts, a.max_new)
    results = {"prompts": len(prompts), "max_new": a.max_new, "seed": a.seed, "runs": {}}
    configs = []
    if a.dflash:
        d = dflash.load(a.dflash, target)
        for T in temps:
            configs.append(("dflash T=%g" % T, "dflash", d, T, 1, 1.0))
    for kind, path, module in (("dspark", a.dspark, dspark), ("dflash2", a.dflash2, dflash2)):
        if path:
            m = module.load(path, target)
            for T in temps:
                configs.append(("%s T=%g" % (kind, T), kind, m, T, 1, 1.0))
    if a.flashmap:
        fm = flashmap.load(a.flashmap, target)
        for T in temps:
            for j in jumps:
                configs.append(("flashmap %dj T=%g" % (j, T), "flashmap", fm, T, j, 1.0))
        if a.zero_noise:
            for T in temps:
                if T == 0.0 or a.zero_noise_all_temps:
                    for j in jumps:
                        configs.append(("flashmap %dj T=%g noise0" % (j, T), "flashmap", fm, T,
                                        j, 0.0))
        if a.no_sampled_noise:
            configs = [c for c in configs if c[1] != "flashmap" or c[5] == 0.0]
    for name, kind, model, T, j, ns in configs:
        gen = torch.Generator(device=dev)
        gen.manual_seed(a.seed)
        t0 = time.time()
        acc, kmx, idx, outs, nd, surv = run_spec(target, prompts, kind, model, T, a.max_new,
                                                 gen, jumps=j, noise_scale=ns,
                                                 recompute=a.recompute)
        r = summarize(acc, kmx, nd, surv)
        if 0 < a.subset < len(prompts):
            sub = idx < a.subset
            r["subset"] = dict(summarize(acc[sub], kmx[sub], nd,
                                         surv[sub] if surv is not None else None),
                               prompts=a.subset)
        r.update({"drafter": kind, "temperature": T, "jumps": j if kind == "flashmap" else None,
                  "noise_scale": ns if kind == "flashmap" else None, "drafts_per_step": nd})
        if T == 0 and ref_greedy is not None:
            same = sum(o == g for o, g in zip(outs, ref_greedy))
            r["greedy_match"] = "%d/%d" % (same, len(prompts))
        results["runs"][name] = r
        log("%-26s tau %.3f%s  steps %5d  (%.1f s)%s  acc %s" % (
            name, r["tau"],
            (" (first %d: %.3f)" % (a.subset, r["subset"]["tau"])) if "subset" in r else "",
            r["steps"], time.time() - t0,
            ("  greedy-identical %s" % r["greedy_match"]) if "greedy_match" in r else "",
            " ".join("%.2f" % x for x in r["per_position"])))
    lines = ["| run | tau | verify steps | per-position acceptance P(a >= k | draft k verified), k = 1.. |",
             "|---|---|---|---|"]
    for name, r in results["runs"].items():
        lines.append(fmt_row(name, r))
    table = "\n".join(lines)
    print(table, flush=True)
    results["table_md"] = table
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
        log("wrote %s" % a.json)


if __name__ == "__main__":
    main()
