#!/usr/bin/env python3
"""One line per kernel from an `ncu --csv --print-units base` file: time (us), DRAM bytes (MB),
the other metrics by a short name, warp-stall reasons of at least 0.3 cycles an issue."""
import collections
import csv
import sys

SHORT = {"gpu__time_duration.sum": ("us", 1e3), "dram__bytes_read.sum": ("MB rd", 1e6),
         "dram__bytes_write.sum": ("MB wr", 1e6),
         "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": ("tensor%", 1),
         "sm__warps_active.avg.pct_of_peak_sustained_active": ("warps%", 1), "launch__grid_size": ("grid", 1),
         "launch__registers_per_thread": ("regs", 1), "smsp__inst_executed.sum": ("warp instr", 1),
         "sm__maximum_warps_per_active_cycle_pct": ("max warps%", 1)}
STALL = "smsp__average_warps_issue_stalled_"

rows = list(csv.reader(open(sys.argv[1], errors="replace")))
h = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if h is None:
    print("ncu: no rows")
    sys.exit()
c = rows[h]
ki, ii, mi, vi = c.index("Kernel Name"), c.index("ID"), c.index("Metric Name"), c.index("Metric Value")
kernels = collections.OrderedDict()
for r in rows[h + 1:]:
    if len(r) > vi:
        kernels.setdefault((r[ii], r[ki][:60]), {})[r[mi]] = r[vi]
for (i, name), m in kernels.items():
    out = []
    for key, v in m.items():
        try:
            f = float(v.replace(",", ""))
        except ValueError:
            continue
        if key in SHORT:
            label, div = SHORT[key]
            out.append(f"{label} {f / div:.4g}")
        elif key.startswith(STALL):
            if f >= 0.3:
                out.append(f"st:{key[len(STALL):].replace('_per_issue_active.ratio', '')} {f:.2g}")
        else:
            out.append(f"{key} {f:.4g}")
    print(f"{i} {name}: " + ", ".join(out))
