#!/bin/bash
# The timeline of recorded decode steps as the GPU runs them (bench/cupti_trace.c injected into
# toasted bench), summed per kernel on the step's critical path by bench/trace-table.py. Run
# on the device machine with carry/gpu: bash bench/trace-decode.sh [BENCH-ARGS...]
# (default: the 48-layer Q4_K model at contexts 0 and 68000; BIN=path: another toasted binary)
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
. bench/gpu-env.sh
. bench/cupti-env.sh
[ $# -gt 0 ] || set -- --type q4_k --ctx 0,68000
CUDA_INJECTION64_PATH=$CUPTI_TRACE TOASTED_TRACE_OUT=$OUT/trace.csv timeout 300 \
	${BIN:-$B/toasted} bench --synthetic qwen3-next-80b-a3b --backend cuda --prompt 1 --decode 32 "$@" 2>&1 | grep -A3 "^decode@"
python3 bench/trace-table.py "$OUT/trace.csv" "$OUT/trace-positions.txt"
xz -T4 "$OUT/trace.csv"
