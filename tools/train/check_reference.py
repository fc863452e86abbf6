#!/usr/bin/env python3
"""Cross-check of exported drafters against the independent references in tools/reference/
(written from specs/dflash.md, not from this trainer): on real target features of held-out
prompts, the trainer's greedy proposal (drafts and the logits they are the argmax of) must equal
the reference's.

    python3 tools/train/check_reference.py --dspark DIR --dflash2 DIR [--dflash DIR] \
        --prompts tools/train/eval_prompts.json [--n 4]

Per prompt the anchor is the prompt's last token (context = the positions before it). Compared:
  DFlash   rows 1..B-1 logits (dflash_ref.DFlashRef.propose), argmax drafts;
  DSpark   the biased logits z_k along the greedy Markov chain and the chain itself, the
           confidences c_k (dspark_ref.DSparkRef.propose_greedy);
  DFlash2  the unary logits, the top-K candidates, the selector scores along the greedy walk and
           the drafts (dflash2_ref.DFlash2Ref.propose_greedy).
--perturb also checks a copy of each checkpoint whose family tensors (Markov and confidence heads,
convolutions, selector) get large random offsets, so that modules a short training left near their
initialisation (zero W2, identity convolutions) are exercised too.
Exit code 1 when a draft differs or a logit differs by more than --tol.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import common  # noqa: E402
import dflash  # noqa: E402
import dflash2  # noqa: E402
import dspark  # noqa: E402


def max_diff(a, b):
    a, b = torch.as_tensor(a).float(), torch.as_tensor(b).float()
    fin = torch.isfinite(a) & torch.isfinite(b)
    if not bool((torch.isfinite(a) == torch.isfinite(b)).all()):
        return float("inf")
    return (a[fin] - b[fin]).abs().max().item() if bool(fin.any()) else 0.0


@torch.no_grad()
def check(kind, path, target, prompts, tol, log):
    import dflash2_ref
    import dflash_ref
    import dspark_ref
    if kind == "dflash":
        mine, ref = dflash.load(path, target), dflash_ref.DFlashRef(path, common.TARGET_DIR)
    elif kind == "dspark":
        mine, ref = dspark.load(path, target), dspark_ref.DSparkRef(path, common.TARGET_DIR)
    else:
        mine, ref = dflash2.load(path, target), dflash2_ref.DFlash2Ref(path, common.TARGET_DIR)
    ok, worst = True, 0.0
    for ids in prompts:
        toks = torch.tensor([ids], device=target.dev)
        feats = target.forward(toks, taps=mine.taps)[1]
        s = len(ids) - 1  # anchor position
        anchors = torch.tensor([[s]], device=target.dev)
        drafts, _ = mine.propose(feats, toks, anchors, 0, None)
        drafts = drafts[0].tolist()
        ctx = feats[0, :s].cpu().numpy()
        if kind == "dflash":
            r_logits = ref.propose(ctx, ids[s])
            m_logits = mine.logits(mine(feats, toks, anchors))[0, 0]
            r_drafts = torch.as_tensor(r_logits).argmax(-1).tolist()
            diffs = [max_diff(m_logits, r_logits)]
        elif kind == "dspark":
            _, z, r_drafts, conf = ref.propose_greedy(ctx, ids[s])
            hid = mine(feats, toks, anchors, first_row=0)[0, 0]
            prev = torch.tensor([ids[s]] + drafts[:-1], device=target.dev)
            m_z, m_conf = mine.markov_and_confidence(hid, prev)
            diffs = [max_diff(m_z, z), max_diff(torch.sigmoid(m_conf), conf)]
        else:
            u, C, S, r_drafts = ref.propose_greedy(ctx, ids[s])
            hid = mine(feats, toks, anchors, conv=mine.convs)[0, 0]
            m_u = mine.logits(hid)
            m_C = torch.sort(m_u, dim=-1, descending=True, stable=True).indices[:, :mine.top_k]
            diffs = [max_diff(m_u, u), 0.0 if torch.equal(m_C.cpu(), C) else float("inf")]
        same = drafts == list(r_drafts)
        worst = max([worst] + diffs)
        ok = ok and same and max(diffs) <= tol
        if not same or max(diffs) > tol:
            log("%s: prompt of %d tokens: drafts %s vs reference %s, max diffs %s" % (
                kind, len(ids), drafts, list(r_drafts), diffs))
    log("%s %s: %d prompts, drafts %s, max |diff| %.3g (tol %.1g)" % (
        kind, path, len(prompts), "identical" if ok else "DIFFER", worst, tol))
    return ok


FAMILY_TENSORS = ("markov_head.", "confidence_head.", "_conv.", "candidate_selector.")


def perturbed_copy(path, out_dir, seed=0):
    """path's checkpoint with N(0, 0.5) added to every family tensor, in out_dir."""
    gen = torch.Generator().manual_seed(seed)
    sd = common.read_safetensors(os.path.join(path, "model.safetensors"))
    for k, v in sd.items():
        if any(t in k for t in FAMILY_TENSORS):
            sd[k] = v + 0.5 * torch.randn(v.shape, generator=gen)
    os.makedirs(out_dir, exist_ok=True)
    shutil.copy(os.path.join(path, "config.json"), out_dir)
    common.write_safetensors(os.path.join(out_dir, "model.safetensors"), sd)
    return out_dir


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dflash", default=None)
    ap.add_argument("--dspark", default=None)
    ap.add_argument("--dflash2", default=None)
    ap.add_argument("--prompts", default=os.path.join(HERE, "eval_prompts.json"))
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--perturb", action="store_true")
    a = ap.parse_args()
    log = common.Log("check")
    common.setup_device("cpu")
    target = common.Target(device="cpu")
    with open(a.prompts) as f:
        prompts = [p["ids"] for p in json.load(f)["prompts"]][:a.n]
    ok = True
    tmp = tempfile.mkdtemp(prefix="check_reference_")
    for kind in ("dflash", "dspark", "dflash2"):
        if getattr(a, kind):
            ok = check(kind, getattr(a, kind), target, prompts, a.tol, log) and ok
            if a.perturb and kind != "dflash":
                pert = perturbed_copy(getattr(a, kind), os.path.join(tmp, kind))
                ok = check(kind, pert, target, prompts, a.tol, log) and ok
    shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
