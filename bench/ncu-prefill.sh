#!/bin/bash
# Nsight Compute on the big kernels of one 4,096-token prefill chunk of the Qwen3-Next shape
# (12-layer bf16 slice, or 48 layers of TYPE): time, DRAM bytes, tensor-pipe use, occupancy,
# stall reasons. Run on the device machine with carry/gpu: bash bench/ncu-prefill.sh [TYPE]
# CHUNK (4096), KERN (the big kernels; 'regex:^(?!k_fill)' for all), SKIP (40) and COUNT (14)
# choose the chunk and the kernels profiled.
set -u
T=${1:-bf16}
CHUNK=${CHUNK:-4096}
KERN=${KERN:-regex:k_moe_gg|k_attn_mma|k_gdn_state_f|k_gdn_intra_f|gemm|sm90|cutlass}
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
. bench/gpu-env.sh
if [ "$T" = bf16 ]; then ARGS="--layers 12"; else ARGS="--type $T"; fi
S=smsp__average_warps_issue_stalled
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread,$S\_long_scoreboard_per_issue_active.ratio,$S\_barrier_per_issue_active.ratio,$S\_short_scoreboard_per_issue_active.ratio,$S\_mio_throttle_per_issue_active.ratio,$S\_math_pipe_throttle_per_issue_active.ratio,$S\_not_selected_per_issue_active.ratio,$S\_wait_per_issue_active.ratio,$S\_lg_throttle_per_issue_active.ratio
# the kernels from the SKIP-th on of the first pass (the warm-up pass; SKIP 40 is the 4th layer at
# the default KERN)
timeout 500 ncu --clock-control none --csv --print-units base -k "$KERN" --launch-skip ${SKIP:-40} --launch-count ${COUNT:-14} \
	--metrics $M $B/toasted bench --synthetic qwen3-next-80b-a3b $ARGS \
	--backend cuda --chunk $CHUNK --prompt $CHUNK --ctx 0 --decode 1 >"$OUT/ncu-prefill.csv" 2>"$OUT/ncu-prefill.err"
python3 bench/ncu-table.py "$OUT/ncu-prefill.csv"
