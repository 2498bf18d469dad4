#!/usr/bin/env python3
"""Where a prefill pass's wall time goes by the GPU's own clock: the kernels outside graphs in a
CUPTI trace (bench/cupti_trace.c) split into runs at each embedding kernel or idle stretch of
over 2 ms (a run is one pass of a prompt), and for the longest run: wall time, time with no
kernel running, the largest gaps (with the kernels on either side) and busy time per kernel.
Usage: prefill-gaps.py trace.csv"""
import collections
import re
import sys


def short(name):
    """a mangled name's function name (_Z13k_gdn_state_fILb1... -> k_gdn_state_f)"""
    m = re.match(r"_Z(\d+)", name)
    if m:
        return name[m.end():m.end() + int(m.group(1))]
    return name[:48]


rows = []
for line in open(sys.argv[1]):
    p = line.rstrip("\n").split(",", 6)
    if len(p) < 7 or p[2] != "0":
        continue
    rows.append((int(p[0]), int(p[1]), short(p[6])))
rows.sort()
runs, cur, end = [], [], 0
for r in rows:
    if cur and (r[0] - end > 2_000_000 or r[2].startswith("k_embed")):
        runs.append(cur)
        cur, end = [], 0
    cur.append(r)
    end = max(end, r[1])
if cur:
    runs.append(cur)


def span(run):
    return max(k[1] for k in run) - run[0][0]


for i, run in enumerate(runs):
    print(f"run {i}: {len(run)} kernels, {span(run) / 1e6:.2f} ms")
# the longest pass (not the synthetic weights' generation, which runs before any embedding)
passes = [r for r in runs if not any(k[2].startswith(("k_q_synth", "k_fill_synthetic")) for k in r)]
run = max(passes, key=span)
wall = span(run)
gaps, busy, end = [], collections.Counter(), run[0][0]
for j, (s, e, n) in enumerate(run):
    if s > end:
        gaps.append((s - end, run[j - 1][2] if j else "-", n))
    busy[n] += e - s
    end = max(end, e)
idle = sum(g[0] for g in gaps)
print(f"longest run: wall {wall / 1e6:.2f} ms, no kernel running {idle / 1e6:.2f} ms ({100 * idle / wall:.1f}%), {len(gaps)} gaps")
by_pair = collections.Counter()
for g, a, b in gaps:
    by_pair[(a, b)] += g
print("idle by the kernels around it (us):")
for (a, b), g in by_pair.most_common(12):
    print(f"  {g / 1e3:10.1f}  {a} -> {b}")
print("busy by kernel (ms):")
for n, t in busy.most_common(25):
    print(f"  {t / 1e6:8.2f}  {n}")
