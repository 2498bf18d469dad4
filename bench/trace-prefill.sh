#!/bin/bash
# Where one prefill pass's wall time goes as the GPU runs it: bench/cupti_trace.c injected into
# toasted bench, then bench/prefill-gaps.py (idle time between kernels, busy time per kernel).
# Run on the device machine with carry/gpu: bash bench/trace-prefill.sh [BENCH-ARGS...]
# (default: the bf16 12-layer slice, a 17,408-token prompt at the default pass; BIN: another toasted)
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
. bench/gpu-env.sh
. bench/cupti-env.sh
[ $# -gt 0 ] || set -- --layers 12
CUDA_INJECTION64_PATH=$CUPTI_TRACE TOASTED_TRACE_OUT=$OUT/prefill.csv timeout 300 \
	${BIN:-$B/toasted} bench --synthetic qwen3-next-80b-a3b --backend cuda --prompt 17408 --ctx 0 --decode 1 "$@" 2>&1 |
	grep -E "^prefill"
python3 bench/prefill-gaps.py "$OUT/prefill.csv"
xz -T4 "$OUT/prefill.csv"
