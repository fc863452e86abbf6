#!/usr/bin/env python3
"""One tau table for the four drafter families from the outputs of a device run
(tools/train/run_device_s8.sh): eval.py's JSON files (PyTorch reference) and bench/eval_acceptance's
text outputs (the engine), as markdown on stdout.

    python3 tools/train/tau_table.py --eval A.json [B.json ...] --engine DIR

Engine outputs are read from DIR/engine_{cpu,cuda}_<run>.txt, <run> = the eval run's name with
spaces and '=' replaced (e.g. 'dspark T=0' -> engine_cpu_dspark_T0.txt); a missing one is a '-'.
"""

import argparse
import json
import os
import re


def engine_file_name(backend, run):
    return "engine_%s_%s.txt" % (backend, re.sub(r"[^A-Za-z0-9._]+", "", run.replace(" ", "_")))


def read_engine(path):
    """(tau, steps) from an eval_acceptance output, or None."""
    if not os.path.exists(path):
        return None
    with open(path, errors="replace") as f:
        text = f.read()
    m = re.search(r"steps (\d+): tau ([0-9.]+)", text)
    return (float(m.group(2)), int(m.group(1))) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--eval", nargs="+", required=True)
    ap.add_argument("--engine", default=None)
    a = ap.parse_args()
    runs, prompts, subset = {}, None, None
    for path in a.eval:
        if not os.path.exists(path):
            print("(missing: %s)" % path)
            continue
        with open(path) as f:
            res = json.load(f)
        prompts = res["prompts"]
        for name, r in res["runs"].items():
            runs[name] = r
            subset = r.get("subset", {}).get("prompts", subset)
    sub = "first %d" % subset if subset else "subset"
    print("| drafter | T | drafts/step | tau, PyTorch (%s prompts) | tau, PyTorch (%s) | "
          "tau, engine CPU | tau, engine CUDA | per-position acceptance, PyTorch (k = 1..) |"
          % (prompts, sub))
    print("|---|---|---|---|---|---|---|---|")
    for name, r in runs.items():
        eng = []
        for backend in ("cpu", "cuda"):
            e = read_engine(os.path.join(a.engine, engine_file_name(backend, name))) \
                if a.engine else None
            eng.append("%.2f (%d steps)" % e if e else "-")
        run = name.rsplit(" T=", 1)
        s = r.get("subset")
        print("| %s | %s | %d | %.2f (%d steps) | %s | %s | %s | %s |" % (
            run[0], run[1] if len(run) > 1 else "?", r["drafts_per_step"], r["tau"], r["steps"],
            "%.2f (%d steps)" % (s["tau"], s["steps"]) if s else "-", eng[0], eng[1],
            " ".join("%.2f" % x for x in r["per_position"])))
        if r.get("predicted_survival"):
            print("| %s (confidence head: predicted prefix survival) | %s | | | | | | %s |" % (
                run[0], run[1] if len(run) > 1 else "?",
                " ".join("%.2f" % x for x in r["predicted_survival"])))


if __name__ == "__main__":
    main()
