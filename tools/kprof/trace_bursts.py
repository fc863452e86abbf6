#!/usr/bin/env python3
"""Reads a kprof KPROF_TRACE timeline ("start_ns end_ns name" per kernel) and shows where a step's
time goes between its kernels.

A "burst" is a run of kernels with no idle gap longer than --gap-us between them (one graph
replay of a step, when the host waits between replays). Bursts with the same kernel count are
one kind of step. For each kind: replays, mean wall time (first start to last end), mean busy
time (the union of the kernels' spans), and the sum of kernel durations (over the wall time when
kernels overlap, e.g. under programmatic dependent launch). With --detail N, the N kernel
positions of the most frequent (or --kind K) step that add the most to the chain: the mean time
from the previous kernel's end to this kernel's end (its share of the step's wall time), its own
mean duration and its name.

  python3 trace_bursts.py trace.txt [--gap-us 20] [--detail 25] [--kind KERNELS]
"""
import argparse
import collections
import statistics


def read_trace(path):
    rows = []
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split(" ", 2)
            if len(parts) == 3 and parts[0].isdigit():
                rows.append((int(parts[0]), int(parts[1]), parts[2]))
    rows.sort()
    return rows


def split_bursts(rows, gap_ns):
    bursts, current, last_end = [], [], None
    for start, end, name in rows:
        if current and start - last_end > gap_ns:
            bursts.append(current)
            current = []
        if not current:
            last_end = end
        current.append((start, end, name))
        last_end = max(last_end, end)
    if current:
        bursts.append(current)
    return bursts


def busy_ns(burst):
    total, cur_start, cur_end = 0, None, None
    for start, end, _ in burst:
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    return total + (cur_end - cur_start if cur_end is not None else 0)


def short(name, width=90):
    return name if len(name) <= width else name[: width - 3] + "..."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--gap-us", type=float, default=20.0)
    ap.add_argument("--detail", type=int, default=25)
    ap.add_argument("--kind", type=int, default=0, help="kernel count of the step to detail")
    ap.add_argument("--min-replays", type=int, default=5)
    args = ap.parse_args()

    bursts = split_bursts(read_trace(args.trace), args.gap_us * 1e3)
    kinds = collections.defaultdict(list)
    for b in bursts:
        kinds[len(b)].append(b)
    print(f"{len(bursts)} bursts (idle gap > {args.gap_us} us splits them)")
    print(f"{'kernels':>8} {'replays':>8} {'wall_us':>9} {'busy_us':>9} {'sum_us':>9}  first kernel")
    frequent = [(k, v) for k, v in kinds.items() if len(v) >= args.min_replays]
    for k, v in sorted(frequent, key=lambda kv: -len(kv[1]) * kv[0]):
        wall = statistics.mean(b[-1][1] - b[0][0] for b in v)
        busy = statistics.mean(busy_ns(b) for b in v)
        total = statistics.mean(sum(e - s for s, e, _ in b) for b in v)
        print(f"{k:>8} {len(v):>8} {wall / 1e3:>9.1f} {busy / 1e3:>9.1f} {total / 1e3:>9.1f}  "
              f"{short(v[0][0][2], 60)}")
    if not frequent or args.detail <= 0:
        return
    kind = args.kind or max(frequent, key=lambda kv: len(kv[1]))[0]
    replays = kinds.get(kind, [])
    if not replays:
        print(f"no step with {kind} kernels")
        return
    # Per position: the step's chain advance (this end - the running max of earlier ends) and the
    # kernel's own duration, averaged over the replays.
    advance = [[] for _ in range(kind)]
    own = [[] for _ in range(kind)]
    for b in replays:
        reach = b[0][0]
        for i, (s, e, _) in enumerate(b):
            advance[i].append(max(0, e - reach))
            own[i].append(e - s)
            reach = max(reach, e)
    by_name = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for i in range(kind):
        entry = by_name[replays[0][i][2]]
        entry[0] += statistics.mean(advance[i]) / 1e3
        entry[1] += statistics.mean(own[i]) / 1e3
        entry[2] += 1
    print(f"\nstep with {kind} kernels, {len(replays)} replays: per kernel name, summed over the "
          f"step's positions (advance = its share of the wall time)")
    print(f"{'advance_us':>10} {'own_us':>9} {'count':>6}  name")
    for name, (adv, dur, count) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[: args.detail]:
        print(f"{adv:>10.1f} {dur:>9.1f} {count:>6}  {short(name)}")


if __name__ == "__main__":
    main()
