#!/usr/bin/env python3
"""When each kernel's blocks of a decode step became resident and when their wait returned.

Usage: timeline-table.py TRACE.csv TIMELINE.csv [POSITIONS.txt]

TRACE.csv: bench/cupti_trace.c's kernel records (start, end, grid id, name); TIMELINE.csv: a
toasted built with -DTOAST_TIMELINE (bench/timeline.sh), one row per block of every kernel that
calls cu_pdl_wait() in one decode-graph replay: t_in when its thread 0 reached the wait (its
weight loads issued), t_out when the wait returned. Joined on the grid id (a graph node's);
times in us from the end of the kernel before (prev_end), averaged per kernel over the step:

  share    end - prev_end (the kernel's share of the step's critical path)
  in0/in50/in100  the first, median and last block's t_in - prev_end (< 0: resident before the
           kernel before it had ended)
  rel      the first t_out - prev_end (how long after the previous kernel's end the wait let go)
  rel100   the last block's t_out - prev_end
  after    end - the last t_out (the work after the input was readable, the tail included)
  sms      the SMs its blocks ran on

Then, for kernels with marks (cu_tl_mark(i): a point inside the kernel, noted by thread 0), the
median and the last block's mark i - prev_end, per mark (mN/50, mN/100); and the three block
indices whose last mark lies furthest past the launch's median one (medians over the launches).

The two clocks differ by a constant: the smallest t_in - start of any kernel is taken as zero.
"""
import csv
import importlib
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
shortname = importlib.import_module("trace-table").short  # the kernel names trace-table.py prints
NMARK = 4


def main():
    blocks = defaultdict(list)
    for r in csv.DictReader(open(sys.argv[2])):
        marks = tuple(int(r.get(f"mark{i}") or 0) for i in range(NMARK))
        blocks[int(r["grid"])].append((int(r["t_in"]), int(r["t_out"]), int(r["smid"]), marks, int(r["block"])))
    # CUPTI's grid id is a graph node's, the same in every replay: the replay noted is the one
    # whose kernels all lie one same offset from the block times (the two clocks differ by a
    # constant); that offset is taken as the smallest t_in - start of any kernel
    graphs = defaultdict(list)
    for r in csv.DictReader(open(sys.argv[1])):
        if int(r["graph_id"]) != 0:
            graphs[int(r["graph_id"])].append((int(r["start_ns"]), int(r["end_ns"]), shortname(r["name"]),
                                               int(r["grid"]), int(r["grid_id"])))
    best = None
    for gid, ks in graphs.items():
        ks.sort()
        ids = {k[4] for k in ks}
        if not ids & blocks.keys():
            continue
        n = len(ids)
        for i in range(0, len(ks) - n + 1, n):
            rep = ks[i:i + n]
            offs = [min(b[0] for b in blocks[k[4]]) - k[0] for k in rep if k[4] in blocks]
            if len(offs) > 1 and (best is None or max(offs) - min(offs) < best[0]):
                best = (max(offs) - min(offs), min(offs), gid, rep)
    if best is None:
        print("timeline: no kernel of the block records is in the CUPTI trace")
        return 1
    _, off, graph, step = best
    for g in blocks:
        blocks[g] = [(a - off, b - off, c, tuple(x - off if x else None for x in m), i) for a, b, c, m, i in blocks[g]]
    print(f"graph {graph}: a replay of {len(step)} kernels, {sum(k[4] in blocks for k in step)} with block "
          f"records, step {(step[-1][1] - step[0][0]) / 1e3:.1f} us (clock offset {off / 1e3:.2f} us)")
    agg = defaultdict(lambda: defaultdict(list))
    late = defaultdict(lambda: defaultdict(list))  # (kernel, grid) -> block -> its last mark - the launch's median
    pos = []
    for i, (st, en, name, grid, g) in enumerate(step):
        if i == 0:
            continue
        prev = step[i - 1][1]
        row = {"share": (en - prev) / 1e3}
        b = blocks.get(g)
        if b:
            tin = sorted(x[0] for x in b)
            tout = sorted(x[1] for x in b)
            row.update({
                "in0": (tin[0] - prev) / 1e3, "in50": (tin[len(tin) // 2] - prev) / 1e3, "in100": (tin[-1] - prev) / 1e3,
                "rel": (tout[0] - prev) / 1e3, "rel100": (tout[-1] - prev) / 1e3, "after": (en - tout[-1]) / 1e3,
                "sms": len(set(x[2] for x in b)),
            })
            for m in range(NMARK):
                ts = sorted(x[3][m] for x in b if x[3][m] is not None)
                if ts:
                    row[f"m{m}/50"] = (ts[len(ts) // 2] - prev) / 1e3
                    row[f"m{m}/100"] = (ts[-1] - prev) / 1e3
            last = [(max(t for t in x[3] if t is not None), x[4]) for x in b if any(t is not None for t in x[3])]
            if last:
                med = statistics.median(t for t, _ in last)
                for t, i in last:
                    late[(name, grid)][i].append((t - med) / 1e3)
        for k, v in row.items():
            agg[name][k].append(v)
        pos.append((i, name, grid, row))
    cols = ["share", "in0", "in50", "in100", "rel", "rel100", "after", "sms"]
    order = sorted(agg.items(), key=lambda kv: -sum(kv[1]["share"]))  # the largest share of the step first
    print(f"  {'kernel':<30} {'n':>3} " + " ".join(f"{c:>7}" for c in cols))
    for name, d in order:
        vals = [f"{statistics.mean(d[c]):7.2f}" if d.get(c) else f"{'':>7}" for c in cols]
        print(f"  {name:<30} {len(d['share']):>3} " + " ".join(vals))
    mcols = [f"m{m}/{q}" for m in range(NMARK) for q in (50, 100)]
    marked = [(n, d) for n, d in order if d.get("m0/50")]
    if marked:
        print(f"\n  {'marks (us from prev_end)':<30} {'n':>3} " + " ".join(f"{c:>7}" for c in ["rel100"] + mcols))
        for name, d in marked:
            vals = [f"{statistics.mean(d[c]):7.2f}" if d.get(c) else f"{'':>7}" for c in ["rel100"] + mcols]
            print(f"  {name:<30} {len(d['share']):>3} " + " ".join(vals))
    # the blocks that end last launch after launch (by their last mark): a straggler sets a
    # kernel's end (the router's shared-gate block did, docs/PERF.md)
    if late:
        print(f"\n  {'latest blocks (last mark - median)':<30} {'grid':>5}  " + "  ".join(["block: us"] * 3))
        for name, d in order:
            for (n, grid) in sorted(k for k in late if k[0] == name):
                top = sorted(((statistics.median(v), i) for i, v in late[(n, grid)].items()), reverse=True)[:3]
                print(f"  {name:<30} {grid:>5}  " + "  ".join(f"{i:>5}: {t:5.2f}" for t, i in top))
    if len(sys.argv) > 3:
        with open(sys.argv[3], "w") as f:
            for i, name, grid, row in pos:
                f.write(f"{i:4d} {name:<30} grid {grid:>5} " +
                        " ".join(f"{c} {row[c]:7.2f}" for c in cols + mcols if c in row) + "\n")
    return 0


sys.exit(main())
