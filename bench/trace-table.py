#!/usr/bin/env python3
"""Where a recorded decode step's time goes, from bench/cupti_trace.c's CSV.

Usage: trace-table.py TRACE.csv [POSITIONS.txt]

For every CUDA graph that was replayed (one per decode context: the step is recorded per
attention span), the replays are cut into steps and each kernel's share of the step's critical
path is its end minus the end of the kernel before it (kernels overlap under programmatic
dependent launch, so their own durations add up to more than the step). Printed per kernel:
launches a step, summed share (us a step), mean share and mean duration (us a launch), medians
over the replays. POSITIONS.txt, when given, gets the same per launch position of a step.
"""
import csv
import re
import statistics
import sys
from collections import defaultdict


def short(mangled):
    m = re.match(r"_Z(\d+)", mangled)
    if not m:
        return mangled[:40]
    n = int(m.group(1))
    name = mangled[m.end():m.end() + n]
    rest = mangled[m.end() + n:]
    if rest.startswith("I"):
        args = re.findall(r"L[ib](\d+)E", rest[:40])
        if args:
            name += "<" + ",".join(args) + ">"
    return name


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    graphs = defaultdict(list)
    for r in rows:
        if int(r["graph_id"]) != 0:
            graphs[int(r["graph_id"])].append((int(r["start_ns"]), int(r["end_ns"]), short(r["name"]), int(r["grid"])))
    pos_out = open(sys.argv[2], "w") if len(sys.argv) > 2 else None
    for gid, ks in sorted(graphs.items()):
        ks.sort()
        first = ks[0][2]
        starts = [i for i, k in enumerate(ks) if k[2] == first]
        n = len(ks) // len(starts)
        steps = [ks[i:i + n] for i in starts if len(ks[i:i + n]) == n]
        if not steps or any([k[2] for k in s] != [k[2] for k in steps[0]] for s in steps):
            print(f"graph {gid}: replays differ in their kernels; skipped")
            continue
        steps = steps[1:] if len(steps) > 2 else steps  # the first replay warms the caches
        step_us = statistics.median((max(k[1] for k in s) - s[0][0]) / 1e3 for s in steps)
        share = [statistics.median(((s[i][1] - (s[i - 1][1] if i else s[0][0])) / 1e3) for s in steps) for i in range(n)]
        dur = [statistics.median((s[i][1] - s[i][0]) / 1e3 for s in steps) for i in range(n)]
        names = [k[2] for k in steps[0]]
        grids = [k[3] for k in steps[0]]
        print(f"graph {gid}: {len(steps)} replays of {n} kernels, step {step_us:.1f} us (median)")
        agg = defaultdict(lambda: [0, 0.0, 0.0])
        for i in range(n):
            a = agg[names[i]]
            a[0] += 1
            a[1] += share[i]
            a[2] += dur[i]
        print(f"  {'kernel':<36} {'a step':>6} {'us a step':>10} {'share':>6} {'us each':>8} {'duration':>9}")
        for name, (c, s, d) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
            print(f"  {name:<36} {c:>6} {s:>10.1f} {100 * s / step_us:>5.1f}% {s / c:>8.2f} {d / c:>9.2f}")
        if pos_out:
            pos_out.write(f"graph {gid}: step {step_us:.1f} us\n")
            for i in range(n):
                pos_out.write(f"{i:4d} {names[i]:<36} grid {grids[i]:>6} share {share[i]:7.2f} duration {dur[i]:7.2f}\n")


if __name__ == "__main__":
    main()
