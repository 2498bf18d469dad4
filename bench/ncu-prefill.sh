#!/bin/bash
# Nsight Compute on the big kernels of one 4,096-token prefill chunk of the Qwen3-Next shape
# (12-layer bf16 slice, or 48 layers of TYPE): time, DRAM bytes, tensor-pipe use, occupancy,
# stall reasons. Run on the device machine with carry/gpu: bash bench/ncu-prefill.sh [TYPE]
set -u
T=${1:-bf16}
OUT=${OUT:-/tmp/gpu-out}
B=/tmp/gpu-bin
mkdir -p $B "$OUT"
for f in carry/gpu/bin/*.xz; do
	[ -x "$B/$(basename "$f" .xz)" ] || python3 -c 'import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' "$f" >"$B/$(basename "$f" .xz)"
done
chmod +x $B/*
CUBLAS_DIR=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/carry/gpu/lib:/usr/local/cuda/lib64:${CUBLAS_DIR:-}:${LD_LIBRARY_PATH:-}
if [ "$T" = bf16 ]; then ARGS="--layers 12"; else ARGS="--type $T"; fi
S=smsp__average_warps_issue_stalled
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread,$S\_long_scoreboard_per_issue_active.ratio,$S\_barrier_per_issue_active.ratio,$S\_short_scoreboard_per_issue_active.ratio,$S\_mio_throttle_per_issue_active.ratio,$S\_math_pipe_throttle_per_issue_active.ratio,$S\_not_selected_per_issue_active.ratio,$S\_wait_per_issue_active.ratio,$S\_lg_throttle_per_issue_active.ratio
# the first 4,096-token chunk's kernels of the 4th layer on (the warm-up pass runs first)
timeout 500 ncu --csv --print-units base -k regex:'k_moe_gg|k_attn_mma|k_gdn_state_f|k_gdn_intra_f|gemm|sm90|cutlass' \
	--launch-skip 40 --launch-count 14 --metrics $M $B/toasted bench --synthetic qwen3-next-80b-a3b $ARGS \
	--backend cuda --chunk 4096 --prompt 4096 --ctx 0 --decode 1 >"$OUT/ncu-prefill.csv" 2>"$OUT/ncu-prefill.err"
python3 - "$OUT/ncu-prefill.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print("ncu: no rows"); sys.exit()
h = rows[0]; ki = h.index("Kernel Name"); ii = h.index("ID"); mi = h.index("Metric Name"); vi = h.index("Metric Value")
k = collections.OrderedDict()
for r in rows[1:]:
    k.setdefault((r[ii], r[ki][:60]), {})[r[mi]] = r[vi]
short = {"gpu__time_duration.sum": "us", "dram__bytes_read.sum": "MB rd", "dram__bytes_write.sum": "MB wr",
         "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor%",
         "sm__warps_active.avg.pct_of_peak_sustained_active": "warps%", "launch__grid_size": "grid",
         "launch__registers_per_thread": "regs"}
for (i, n), m in k.items():
    out = []
    for key, v in m.items():
        try:
            f = float(v.replace(",", ""))
        except ValueError:
            continue
        if key in short:
            f = f / 1e3 if short[key] == "us" else f / 1e6 if short[key].startswith("MB") else f
            out.append(f"{short[key]} {f:.4g}")
        elif f >= 0.3:
            out.append(f"{key.replace('smsp__average_warps_issue_stalled_', 'st:').replace('_per_issue_active.ratio', '')} {f:.2g}")
    print(f"{i} {n}: " + ", ".join(out))
PY
