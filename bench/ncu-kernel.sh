#!/bin/bash
# Nsight Compute's detailed sections (speed of light, memory, warp states, occupancy) on a few
# kernels of a decode step, to say what bounds one kernel. Run on the device machine with
# carry/gpu: bash bench/ncu-kernel.sh NAME REGEX SKIP COUNT BENCH-ARGS...
#   e.g. lm_head  k_gemv_k4 96 2  --type q4_k --ctx 0    (the 97th Q4_K GEMV of a pass: lm_head)
#        attn68k  'k_attn_mma|k_attn_combine' auto:k_attn_mma:100 2  --type q4_k --ctx 68000
#   SKIP auto:KERNEL:N: skip to KERNEL's first launch with more than N blocks (a cheap listing first)
# The report goes to $OUT/ncu-NAME.txt; the lines that matter are printed.
set -u
NAME=$1 RE=$2 SKIP=$3 COUNT=$4
shift 4
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
. bench/gpu-env.sh
BENCH=(${BIN:-$B/toasted} bench --synthetic qwen3-next-80b-a3b --backend cuda --prompt 1 --decode 2 "$@")
if [[ $SKIP == auto:* ]]; then
	IFS=: read -r _ K N <<<"$SKIP"
	timeout 300 ncu --clock-control none --csv -k regex:"$RE" --launch-count 200 --metrics launch__grid_size \
		"${BENCH[@]}" >"$OUT/ncu-$NAME-list.csv" 2>/dev/null
	SKIP=$(python3 -c '
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
rows = rows[next(i for i, r in enumerate(rows) if "Kernel Name" in r):]  # (the bench output before it)
h = rows[0]; ki, vi = h.index("Kernel Name"), h.index("Metric Value")
for i, r in enumerate(rows[1:]):
    if sys.argv[2] in r[ki] and float(r[vi].replace(",", "")) > float(sys.argv[3]):
        print(i); break
else:
    print(0)' "$OUT/ncu-$NAME-list.csv" "$K" "$N")
	echo "ncu-kernel: skipping $SKIP launches"
fi
S=smsp__average_warps_issue_stalled
M=""
for r in long_scoreboard barrier membar short_scoreboard wait lg_throttle math_pipe_throttle mio_throttle \
	no_instruction not_selected selected drain sleeping branch_resolving dispatch_stall imc_miss tex_throttle; do
	M="$M${M:+,}${S}_${r}_per_issue_active.ratio"
done
timeout 300 ncu --clock-control none -k regex:"$RE" --launch-skip "$SKIP" --launch-count "$COUNT" \
	--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
	--section WarpStateStats --section Occupancy \
	--section LaunchStats --section SchedulerStats --metrics "$M" \
	"${BENCH[@]}" \
	>"$OUT/ncu-$NAME.txt" 2>&1
grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Grid Size|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Active Warps Per|Eligible Warps|Compute \(SM\) Thr|Mem Busy|Max Bandwidth|Block Limit|Dynamic Shared|issue_stalled|Shared Load|Shared Store|Global Load|Local Load|Local Store|Bank" \
	"$OUT/ncu-$NAME.txt" | head -120
