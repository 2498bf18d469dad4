#!/bin/bash
# When each decode kernel's blocks became resident and when their dependent-launch wait let go,
# against CUPTI's kernel records (bench/timeline-table.py). Needs carry/gpu/bin/toasted-tl.xz,
# a build with -DTOAST_TIMELINE (TIMELINE=1 sh tools/gpu-bundle.sh). Run on the device machine:
#   bash bench/timeline.sh [BENCH-ARGS...]   (default: the 48-layer Q4_K model at context 0)
# Kernels with cu_tl_mark() points also get the median and last block's time at each.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
. bench/gpu-env.sh
[ -x $B/toasted-tl ] || { echo "timeline: no toasted-tl in carry/gpu/bin"; exit 1; }
. bench/cupti-env.sh
[ $# -gt 0 ] || set -- --type q4_k --ctx 0
tag=${TL_TAG:-}$(echo "$*" | tr -c 'a-z0-9_\n' '_') # (TL_TAG: a prefix, for runs of one model under settings)
CUDA_INJECTION64_PATH=$CUPTI_TRACE TOASTED_TRACE_OUT=$OUT/tl-trace-$tag.csv \
	TOASTED_TIMELINE=$OUT/tl-blocks-$tag.csv TOASTED_TIMELINE_STEP=${TL_STEP:-16} timeout 300 \
	$B/toasted-tl bench --synthetic qwen3-next-80b-a3b --backend cuda --prompt 1 --decode 32 "$@" 2>&1 |
	grep -E "^decode@|timeline:"
python3 bench/timeline-table.py "$OUT/tl-trace-$tag.csv" "$OUT/tl-blocks-$tag.csv" "$OUT/tl-positions-$tag.txt"
xz -T4 "$OUT/tl-trace-$tag.csv" "$OUT/tl-blocks-$tag.csv"
