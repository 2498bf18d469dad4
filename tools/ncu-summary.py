#!/usr/bin/env python3
"""Summarise `ncu --csv --metrics gpu__time_duration.sum` output: time per kernel name per step.
Usage: ncu-summary.py FILE.csv STEPS"""
import csv, sys, collections

rows = list(csv.reader(open(sys.argv[1], errors="replace")))
steps = float(sys.argv[2])
head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if head is None:
    sys.exit("no kernel rows in " + sys.argv[1])
cols = rows[head]
ki, mi, vi = cols.index("Kernel Name"), cols.index("Metric Name"), cols.index("Metric Value")
tot, cnt = collections.Counter(), collections.Counter()
for r in rows[head + 1:]:
    if len(r) <= vi or r[mi] != "gpu__time_duration.sum":
        continue
    name = r[ki].split("(")[0].split("<")[0].replace("void ", "")
    tot[name] += float(r[vi].replace(",", ""))
    cnt[name] += 1
all_ns = sum(tot.values())
print(f"{'kernel':32s} {'launches/step':>13s} {'us/step':>9s} {'share':>6s}")
for name, ns in tot.most_common():
    print(f"{name:32s} {cnt[name] / steps:13.1f} {ns / steps / 1e3:9.1f} {100 * ns / all_ns:5.1f}%")
print(f"{'total (kernel time only)':32s} {sum(cnt.values()) / steps:13.1f} {all_ns / steps / 1e3:9.1f}")
