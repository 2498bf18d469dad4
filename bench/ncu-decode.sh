#!/bin/bash
# Nsight Compute on one DeltaNet layer of the Q4_K decode step (48-layer synthetic model): time,
# DRAM bytes, occupancy and where warps stall, per kernel. Run on the device machine with
# carry/gpu: bash bench/ncu-decode.sh [TYPE]   (BIN=path: another toasted binary, e.g. the one
# bench/gpu.sh ab unpacks to $B/toasted-old)
set -u
T=${1:-q4_k}
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
. bench/gpu-env.sh
S=smsp__average_warps_issue_stalled
M=gpu__time_duration.sum,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,sm__maximum_warps_per_active_cycle_pct,smsp__inst_executed.sum,$S\_long_scoreboard_per_issue_active.ratio,$S\_barrier_per_issue_active.ratio,$S\_membar_per_issue_active.ratio,$S\_short_scoreboard_per_issue_active.ratio,$S\_wait_per_issue_active.ratio,$S\_lg_throttle_per_issue_active.ratio,$S\_math_pipe_throttle_per_issue_active.ratio,$S\_mio_throttle_per_issue_active.ratio,$S\_no_instruction_per_issue_active.ratio,$S\_not_selected_per_issue_active.ratio,$S\_selected_per_issue_active.ratio,$S\_drain_per_issue_active.ratio,$S\_sleeping_per_issue_active.ratio,$S\_branch_resolving_per_issue_active.ratio,$S\_dispatch_stall_per_issue_active.ratio
timeout 400 ncu --clock-control none --csv --print-units base -k regex:'k_gemv|k_moe|k_gdn_decode' --launch-skip 300 --launch-count 6 \
	--metrics $M ${BIN:-$B/toasted} bench --synthetic qwen3-next-80b-a3b --type $T --backend cuda --prompt 1 --ctx 0 --decode 3 \
	>"$OUT/ncu-decode.csv" 2>"$OUT/ncu-decode.err"
python3 bench/ncu-table.py "$OUT/ncu-decode.csv"
