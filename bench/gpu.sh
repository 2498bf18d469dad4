#!/bin/bash
# One GPU session's work in one call: correctness of every CUDA op and model against the CPU
# oracle, then timing. Run on the device machine from the repository root, with carry/gpu
# (made here by tools/gpu-bundle.sh) carried. Full logs go to $OUT; a short table is printed last.
# Usage: bench/gpu.sh [quick|full|perf|cache|quant|ab|dab|pab|prec|probe|demo|load|steps]   (cache: only the session cache's checks and benchmark)
#   demo: the product on the GPU: the real demo model (SmolLM2-135M-Instruct, 98 MB: more than a
#   run carries with the tree, so it comes in parts, see below) through test_smollm (CUDA against
#   the CPU), tests/smollm_run.sh on the CUDA backend (`toasted run`, the daemon, `toast`), its
#   speed, the daemon's first requests (bench/first_request.py), and the daemon and client suites
#   with the CUDA backend (the default where a GPU is)
#   dab: ab for dense models (test_ops, the dense fixtures on CUDA, decode of the Qwen3-8B and
#   SmolLM2 shapes in bench/*.json by every binary of carry/gpu/ab and toasted)
#   probe: bench/decode_probe.cu, what a chain of dependent GEMVs costs by way of running it, and
#   bench/k4_probe.cu, what bounds a Q4_K GEMV's byte rate (the reads, the work, the layout), and
#   bench/read_probe.cu, the DRAM read rate by the shape of the grid (decode attention's ring)
#   quant: quantised weights (issue 7): test_ops (every op, every weight type, against the
#   reference), the op timings with 4-bit weights, and the whole Qwen3-Next-80B-A3B (48 layers)
#   at Q4_K, Q4_K_M (a converted file's mix) and MLX 4-bit: prefill 128/4096/17408, decode at 0
#   and 68000 of context, per-kernel profiles. About 6 minutes on an H200.
set -u
MODE=${1:-full}
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
. bench/gpu-env.sh
{
	date -u
	nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
	ldd $B/toasted | grep -E "not found|cublas|cudart|jansson"
} >"$OUT/env.log" 2>&1
cat "$OUT/env.log"
sh tools/unpack-testdata.sh tests/data build/testdata >/dev/null || echo "unpack failed"
summary=()
if [ "$MODE" = probe ]; then
	for args in ${PROBE_ARGS:-"2048" "1024" "512" "2048 3"}; do # (3 weight sets of 8 MB: the weights stay in L2)
		timeout 120 $B/decode_probe 256 $args | tee -a "$OUT/probe.log"
	done
	for args in "151936 2048" "12352 2048"; do # a Q4_K GEMV's byte rate by layout (lm_head, qkvz)
		timeout 60 $B/k4_probe $args | tee -a "$OUT/probe.log"
	done
	for mb in 139 1600; do # DRAM read rate by grid shape: decode attention's at 68K, and a long stream
		timeout 60 $B/read_probe $mb | tee -a "$OUT/probe.log"
	done
	exit 0
fi
# load: `toasted bench` of a whole-model GGUF file (Qwen3-Next-80B-A3B at Q4_K, 48 layers, ~45 GB)
# whose data is a hole (bench/sparse-gguf.py; its metadata from the real-vocabulary test model's
# conversion): the time from the file to a model on the GPU, in LOAD_ROUNDS rounds (default 2:
# the first fills the page cache), and decode from a file's layout. LOAD_LAYERS: fewer layers;
# LOAD_FILL=1: the data written (random bytes), and each run starts with the file's pages out of
# the page cache (read from the disk); LOAD_ENVS="VAR=1,...": settings each round also runs under.
if [ "$MODE" = load ]; then
	D=${LOAD_DIR:-/tmp}
	$B/toasted convert build/testdata/models/qwen3next-vocab -o $D/vocab.gguf --type q4_k_m >/dev/null &&
		python3 bench/sparse-gguf.py $D/vocab.gguf $D/big.gguf --layers ${LOAD_LAYERS:-48} \
			${LOAD_FILL:+--fill} || exit 1
	free -g | head -2
	IFS=, read -ra envs <<<"${LOAD_ENVS:-}"
	for r in $(seq ${LOAD_ROUNDS:-2}); do
		for ev in "" "${envs[@]}"; do
			[ -n "${LOAD_FILL:-}" ] && python3 -c 'import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' $D/big.gguf
			t0=$(date +%s.%N)
			timeout 400 env $ev $B/toasted bench $D/big.gguf --backend cuda --prompt 1 --ctx 0 --decode 64 \
				>"$OUT/load.tmp" 2>&1
			rc=$?
			summary+=("load round $r ${ev:-default}: rc=$rc, $(grep -o 'loaded in [0-9.]* s' "$OUT/load.tmp"), the whole run $(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $t0}") s; decode $(awk '/^0 +[0-9.]+ / {print $2 " tok/s, " $6 "x floor"}' "$OUT/load.tmp")")
			cat "$OUT/load.tmp" >>"$OUT/load.log"
		done
	done
	rm -f $D/big.gguf $D/vocab.gguf "$OUT/load.tmp"
	echo
	echo "==== summary ===="
	printf '%s\n' "${summary[@]}"
	exit 0
fi
# the session cache: restores and files bit for bit on the GPU, then time to first token with a
# hit and a miss at 1K, 8K and 20K tokens of history (Qwen3-Next shape, 12 of 48 layers)
if [ "$MODE" = cache ]; then
	timeout 300 $B/test_cache >"$OUT/test_cache.log" 2>&1
	summary+=("test_cache (cpu + cuda): rc=$? $(tail -1 "$OUT/test_cache.log")")
	grep -E "failed|SKIP" "$OUT/test_cache.log" | head -20
	timeout 500 $B/toasted bench --synthetic qwen3-next-80b-a3b --layers 12 --backend cuda --chunk 4096 \
		--cache --history 1000,8000,20000 --new 64 >"$OUT/bench-cache.log" 2>&1
	summary+=("bench --cache rc=$?")
	cat "$OUT/bench-cache.log"
	echo
	echo "==== summary ===="
	printf '%s\n' "${summary[@]}"
	exit 0
fi
# steps: steps of several tokens (speculative decoding's verifying pass): test_ops and test_cache
# (the drafts against plain greedy) on CUDA, the 48-layer Q4_K step of 1..8 tokens (kept and
# rewound states too), the plain decode rate, and where a step of 2 goes (bench/trace-decode.sh)
if [ "$MODE" = steps ]; then
	TOASTED_TESTDATA=build/testdata timeout 300 $B/test_ops >"$OUT/test_ops.log" 2>&1
	summary+=("test_ops: rc=$? $(tail -1 "$OUT/test_ops.log")")
	grep -E "FAIL|failed" "$OUT/test_ops.log" | head -20
	for r in 1 2; do
		timeout 200 $B/toasted bench --synthetic qwen3-next-80b-a3b --type q4_k --backend cuda --prompt 1 --ctx 0 \
			--decode 64 --steps ${STEPS:-1,2,3,4,8} 2>&1 | tee -a "$OUT/steps.log" | grep -vE '^(load|synth)'
	done
	timeout 200 $B/toasted bench --synthetic qwen3-next-80b-a3b --type q4_k --backend cuda --prompt 1 --ctx 0 \
		--decode 128 2>&1 | tee "$OUT/decode.log" | grep -A3 '^decode@'
	bash bench/trace-decode.sh --type q4_k --ctx 0 --steps 2 2>&1 | tail -30
	if [ -x $B/test_cache ]; then
		TOASTED_TESTDATA=build/testdata timeout ${CACHE_S:-240} $B/test_cache >"$OUT/test_cache.log" 2>&1
		summary+=("test_cache: rc=$? $(tail -1 "$OUT/test_cache.log")")
		grep -E "FAIL|failed" "$OUT/test_cache.log" | head -20
	fi
	echo
	echo "==== summary ===="
	printf '%s\n' "${summary[@]}"
	exit 0
fi
# demo: the model's parts (split -b 25M models/SmolLM2-135M-Instruct.Q4_1.gguf carry/smol/part.)
# arrive one a run (`mkdir -p /tmp/smol && cp carry/smol/part.* /tmp/smol/`, the machine kept
# warm between runs); the last run carries the last part and carry/gpu and runs this
if [ "$MODE" = demo ]; then
	M=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
	mkdir -p /tmp/smol
	cp carry/smol/part.* /tmp/smol/ 2>/dev/null
	cat /tmp/smol/part.* >$M
	echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $M" | sha256sum -c || exit 1
	export TOASTED_SMOLLM=$M TOASTED_BIN=$B TOASTED_TESTDATA=build/testdata
	timeout 300 $B/test_smollm >"$OUT/test_smollm.log" 2>&1
	summary+=("test_smollm (cpu, then cuda against cpu): rc=$? $(tail -1 "$OUT/test_smollm.log")")
	cat "$OUT/test_smollm.log"
	BUILD=$B BACKEND=cuda timeout 200 sh tests/smollm_run.sh >"$OUT/smollm_run.log" 2>&1
	summary+=("smollm_run.sh (cuda): rc=$? $(tail -1 "$OUT/smollm_run.log")")
	cat "$OUT/smollm_run.log"
	for be in cuda cpu; do
		timeout 120 $B/toasted run $M 'Write a short story about a cat.' --temperature 0 --max-tokens 256 \
			--backend $be --stats </dev/null >"$OUT/run-$be.txt" 2>"$OUT/run-$be.log"
		summary+=("toasted run ($be): rc=$? $(tr '\n' ' ' <"$OUT/run-$be.log")")
	done
	cmp -s "$OUT/run-cpu.txt" "$OUT/run-cuda.txt" && summary+=("the story: the same text on both") ||
		summary+=("the story differs: $(cmp "$OUT/run-cpu.txt" "$OUT/run-cuda.txt")")
	head -c 600 "$OUT/run-cuda.txt"
	echo
	timeout 200 $B/toasted bench $M --backend cuda --prompt 128,1024 --ctx 0,1000 --decode 128 >"$OUT/bench-smollm.log" 2>&1
	summary+=("bench smollm (cuda): rc=$?")
	cat "$OUT/bench-smollm.log"
	TOASTED_CUDA_PROFILE=1 timeout 100 $B/toasted bench $M --backend cuda --prompt 1 --ctx 0 --decode 20 2>&1 |
		grep -A30 "cuda profile" | head -30
	# the daemon's start and its first requests (ttft of request 1 against the rest)
	timeout 200 python3 bench/first_request.py build/testdata/models/qwen3next-vocab $M 2>&1 | tee "$OUT/first_request.log"
	for t in daemon_test cache_test toast_test fuzz_proto; do
		timeout 300 python3 tests/$t.py >"$OUT/$t.log" 2>&1
		summary+=("$t.py (cuda): rc=$? $(tail -1 "$OUT/$t.log")")
		grep FAILED "$OUT/$t.log" | head -5
	done
	echo
	echo "==== summary ===="
	printf '%s\n' "${summary[@]}"
	exit 0
fi
# the older binaries of carry/gpu/ab (NAME.xz) unpacked beside toasted; their names in olds
unpack_olds() {
	olds=()
	for f in carry/gpu/ab/*.xz; do
		[ -e "$f" ] || continue
		n=$(basename "$f" .xz)
		python3 -c 'import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' "$f" >$B/$n
		chmod +x $B/$n
		olds+=("$n")
	done
}
# ab: a kernel change against the binaries before it (carry/gpu/ab/NAME.xz, put there by hand,
# e.g. toasted-old.xz: an sm_90a build of the older commit, strip, xz -9e; ~4 MB each):
# test_ops, then decode of the 48-layer Q4_K and MLX4 models and the bf16 slice by every binary
# in turn (same machine; AB_MODELS="--type q4_k,--layers 12": a comma-separated list;
# AB_ROUNDS, default 2; AB_ENVS="VAR=1,VAR=2": settings the new binary also runs under), then
# the decode timeline of each (bench/trace-decode.sh, of --type AB_TRACE_TYPE, default q4_k).
# AB_PERF=1: the op timings too; AB_NCU=1: Nsight Compute on one DeltaNet layer.
# AB_NEW_MODELS: more bench arguments (comma-separated) that only the new binary runs, after the
# others each round (options the old ones lack: "--type q4_k --kv-cache q8"). AB_TRACE=0: no
# decode timelines.
if [ "$MODE" = ab ]; then
	unpack_olds
	timeout 300 $B/test_ops >"$OUT/test_ops.log" 2>&1
	summary+=("test_ops: rc=$? $(grep -c 'failed' "$OUT/test_ops.log") failures, $(tail -1 "$OUT/test_ops.log")")
	grep -E "failed" "$OUT/test_ops.log" | head -20
	if [ "${AB_PERF:-0}" = 1 ]; then
		timeout 240 $B/test_ops --perf >"$OUT/ops-perf.log" 2>&1
		grep -hE "^(gemv|moe) " "$OUT/ops-perf.log"
	fi
	# the runs of a round, "BINARY [ENV]|BENCH-ARGS" each
	IFS=, read -ra envs <<<"${AB_ENVS:-}"
	IFS=, read -ra models <<<"${AB_MODELS:---type q4_k,--type mlx4,--layers 12}"
	IFS=, read -ra new_models <<<"${AB_NEW_MODELS:-}"
	runs=()
	for v in "${olds[@]}" toasted "${envs[@]/#/toasted }"; do
		for t in "${models[@]}"; do runs+=("$v|$t"); done
	done
	for t in "${new_models[@]}"; do runs+=("toasted|$t"); done
	for r in $(seq ${AB_ROUNDS:-2}); do
		for x in "${runs[@]}"; do
			v=${x%%|*} t=${x#*|}
			read -r bin ev <<<"$v"
			timeout 200 env $ev $B/$bin bench --synthetic qwen3-next-80b-a3b $t --backend cuda --prompt 1 --ctx 0,68000 \
				--decode 64 >"$OUT/ab.tmp" 2>&1
			summary+=("round $r $v $t: $(awk '/^[0-9]+ +[0-9.]+ +[0-9.]+/ {printf "ctx%s %s tok/s (%sx floor)  ", $1, $2, $6}' "$OUT/ab.tmp")")
		done
	done
	rm -f "$OUT/ab.tmp"
	[ "${AB_TRACE:-1}" = 1 ] && for v in "${olds[@]}" toasted; do
		BIN=$B/$v timeout 300 bash bench/trace-decode.sh --type ${AB_TRACE_TYPE:-q4_k} --ctx ${AB_TRACE_CTX:-0} >"$OUT/trace-$v.log" 2>&1
		mv "$OUT/trace-positions.txt" "$OUT/trace-positions-$v.txt"
		rm -f "$OUT/trace.csv.xz"
		echo "== trace of $v"
		grep -A12 "^graph" "$OUT/trace-$v.log"
	done
	[ "${AB_NCU:-0}" = 1 ] && command -v ncu >/dev/null && timeout 300 bash bench/ncu-decode.sh q4_k
	echo
	echo "==== summary ===="
	printf '%s\n' "${summary[@]}"
	exit 0
fi
# dab: ab for the dense models' path (Qwen3-8B's and SmolLM2's shapes, bench/*.json, synthetic):
# test_ops, the dense fixtures' checks, then decode at ctx 0 and 4000 by every binary in turn
# (DAB_MODELS: a comma-separated list of bench arguments)
if [ "$MODE" = dab ]; then
	unpack_olds
	timeout 300 $B/test_ops >"$OUT/test_ops.log" 2>&1
	summary+=("test_ops: rc=$? $(grep -c 'failed' "$OUT/test_ops.log") failures, $(tail -1 "$OUT/test_ops.log")")
	grep -E "failed" "$OUT/test_ops.log" | head -20
	for m in qwen3-tiny qwen35-tiny qwen3-odd; do
		timeout 120 $B/toasted check build/testdata/models/$m --backend cuda --chunk 1 >"$OUT/check.tmp" 2>&1
		summary+=("check $m chunk 1: rc=$? $(grep -E '^ids|^greedy|^toasted' "$OUT/check.tmp" | tr '\n' ' ')")
	done
	for r in $(seq ${AB_ROUNDS:-2}); do
		for v in "${olds[@]}" toasted; do
			IFS=, read -ra dmodels <<<"${DAB_MODELS:-bench/qwen3-8b.json --type q4_k,bench/qwen3-8b.json --type q8_0,bench/qwen3-8b.json --layers 12,bench/smollm2-135m.json --type q4_1}"
			for t in "${dmodels[@]}"; do
				timeout 200 $B/$v bench --synthetic $t --backend cuda --prompt 1 --ctx 0,4000 --decode 64 >"$OUT/ab.tmp" 2>&1
				summary+=("round $r $v $t: $(awk '/^[0-9]+ +[0-9.]+ +[0-9.]+/ {printf "ctx%s %s tok/s (%sx floor)  ", $1, $2, $6}' "$OUT/ab.tmp")")
			done
		done
	done
	rm -f "$OUT/ab.tmp" "$OUT/check.tmp"
	echo
	echo "==== summary ===="
	printf '%s\n' "${summary[@]}"
	exit 0
fi
# pab: the prefill side of ab: test_ops, then the 17K prompt (the bf16 slice at its default pass,
# Q4_K in passes of 4,096 and in one) by every binary in turn, AB_ROUNDS rounds, and each
# binary's per-kernel profile of a 4,096-token pass of the bf16 slice
if [ "$MODE" = pab ]; then
	unpack_olds
	timeout 300 $B/test_ops >"$OUT/test_ops.log" 2>&1
	summary+=("test_ops: rc=$? $(grep -c 'failed' "$OUT/test_ops.log") failures, $(tail -1 "$OUT/test_ops.log")")
	grep -E "failed" "$OUT/test_ops.log" | head -20
	timeout 240 $B/test_ops --perf >"$OUT/ops-perf.log" 2>&1
	grep -h "gdn prefill" "$OUT/ops-perf.log"
	for r in $(seq ${AB_ROUNDS:-2}); do
		for v in "${olds[@]}" toasted; do
			for t in "--layers 12" "--type q4_k --chunk 4096" "--type q4_k --chunk 32768"; do
				timeout 200 $B/$v bench --synthetic qwen3-next-80b-a3b $t --backend cuda --prompt 17408 --ctx 0 \
					--decode 1 >"$OUT/ab.tmp" 2>&1
				summary+=("round $r $v $t: $(awk '/^prefill/ {printf "%s ms, %s x GEMM", $4, $7}' "$OUT/ab.tmp")")
			done
		done
	done
	rm -f "$OUT/ab.tmp"
	for v in "${olds[@]}" toasted; do
		echo "== profile of $v"
		TOASTED_CUDA_PROFILE=1 timeout 200 $B/$v bench --synthetic qwen3-next-80b-a3b --layers 12 --backend cuda \
			--chunk 4096 --prompt 4096 --ctx 0 --decode 1 2>&1 | grep -A40 "cuda profile" | tee "$OUT/profile-$v.txt" | head -24
	done
	echo
	echo "==== summary ===="
	printf '%s\n' "${summary[@]}"
	exit 0
fi
# prec: the fp16 products of normed inputs against bf16 ones (TOASTED_CUDA_BF16_GEMM=1), same
# binary: PREC_PART=1 test_ops under both (the bf16 products must fail test_matmul_precise) and
# every fixture's prefill-chunk check under both; PREC_PART=2 the 17K prompt under both, two rounds
if [ "$MODE" = prec ]; then
	if [ "${PREC_PART:-1}" = 1 ]; then
		for ev in "" TOASTED_CUDA_BF16_GEMM=1; do
			log="$OUT/test_ops${ev:+-bf16}.log"
			timeout 280 env $ev $B/test_ops >"$log" 2>&1
			summary+=("test_ops ${ev:-fp16}: rc=$? $(grep -c 'failed' "$log") failures, $(tail -1 "$log")")
			grep -E "failed|largest error" "$log" | head -12
		done
		for m in qwen3-tiny qwen3moe-tiny qwen35-tiny qwen35moe-tiny qwen3next-tiny qwen3-odd qwen3moe-odd qwen35moe-odd qwen3next-odd; do
			for ev in "" TOASTED_CUDA_BF16_GEMM=1; do
				timeout 120 env $ev $B/toasted check build/testdata/models/$m --backend cuda --chunk 64 >"$OUT/check.tmp" 2>&1
				summary+=("check $m chunk 64 ${ev:-fp16}: rc=$? $(grep -E '^ids|^greedy|^toasted' "$OUT/check.tmp" | tr '\n' ' ')")
			done
		done
	else
		for r in 1 2; do
			for ev in "" TOASTED_CUDA_BF16_GEMM=1; do
				for t in "--layers 12" "--type q4_k --chunk 4096" "--type q4_k --chunk 32768"; do
					timeout 200 env $ev $B/toasted bench --synthetic qwen3-next-80b-a3b $t --backend cuda --prompt 17408 \
						--ctx 0 --decode 1 >"$OUT/ab.tmp" 2>&1
					summary+=("round $r ${ev:-fp16} $t: $(awk '/^prefill/ {printf "%s ms, %s x GEMM", $4, $7}' "$OUT/ab.tmp")")
				done
			done
		done
		timeout 200 $B/test_cache >"$OUT/test_cache.log" 2>&1
		summary+=("test_cache (cpu + cuda): rc=$? $(tail -1 "$OUT/test_cache.log")")
	fi
	rm -f "$OUT/check.tmp" "$OUT/ab.tmp"
	echo
	echo "==== summary ===="
	printf '%s\n' "${summary[@]}"
	exit 0
fi
if [ "$MODE" = quant ]; then
	timeout 300 $B/test_ops >"$OUT/test_ops.log" 2>&1
	rc=$?
	summary+=("test_ops (every op and weight type, cpu + cuda vs reference): rc=$rc, $(grep -c 'failed' "$OUT/test_ops.log") failures")
	grep -E "failed|cuda|OK" "$OUT/test_ops.log" | head -40
	timeout 240 $B/test_ops --perf >"$OUT/ops-perf.log" 2>&1
	summary+=("test_ops --perf rc=$?")
	cat "$OUT/ops-perf.log"
	# every fixture model against its reference on the GPU (decode-sized and prefill chunks)
	for m in qwen3-tiny qwen3moe-tiny qwen35-tiny qwen35moe-tiny qwen3next-tiny qwen3next-tiny-hubcfg qwen3-odd qwen3moe-odd qwen35moe-odd qwen3next-odd; do
		for c in 64 1; do
			timeout 120 $B/toasted check build/testdata/models/$m --backend cuda --chunk $c >"$OUT/check.tmp" 2>&1
			summary+=("check $m chunk $c: rc=$? $(grep -E '^ids|^greedy|^toasted' "$OUT/check.tmp" | tr '\n' ' ')")
			cat "$OUT/check.tmp" >>"$OUT/test_ops.log"
		done
	done
	for t in q4_k q4_k_m mlx4; do
		timeout 420 $B/toasted bench --synthetic qwen3-next-80b-a3b --type $t --backend cuda --chunk 4096 \
			--prompt 128,4096,17408 --ctx 0,68000 --decode 64 >"$OUT/bench-$t.log" 2>&1
		summary+=("bench $t (48 layers) rc=$?")
		TOASTED_CUDA_PROFILE=1 timeout 200 $B/toasted bench --synthetic qwen3-next-80b-a3b --type $t --backend cuda \
			--prompt 1 --ctx 0 --decode 20 >>"$OUT/profiles.txt" 2>&1
		TOASTED_CUDA_PROFILE=1 timeout 200 $B/toasted bench --synthetic qwen3-next-80b-a3b --type $t --backend cuda \
			--chunk 4096 --prompt 4096 --ctx 0 --decode 1 >>"$OUT/profiles.txt" 2>&1
	done
	# the bf16 12-layer slice of issue 6 (the same GEMV kernel), and the session cache's checks
	timeout 200 $B/toasted bench --synthetic qwen3-next-80b-a3b --layers 12 --backend cuda --chunk 4096 \
		--prompt 128,1024,17408 --ctx 0,28000,68000 --decode 64 >"$OUT/bench-bf16.log" 2>&1
	summary+=("bench bf16 (12 layers) rc=$?")
	# the 17K prompt in passes of 8192, 16384, one pass, and the default (issue 6's prefill figure)
	for c in 8192 16384 32768 ""; do
		timeout 100 $B/toasted bench --synthetic qwen3-next-80b-a3b --layers 12 --backend cuda ${c:+--chunk $c} \
			--prompt 17408 --ctx 0 --decode 1 2>&1 | grep -E "^prefill|passes of" | sed "s/^/chunk ${c:-default}: /" >>"$OUT/bench-bf16.log"
	done
	timeout 200 $B/toasted bench --synthetic qwen3-next-80b-a3b --type q4_k --backend cuda --chunk 32768 \
		--prompt 17408 --ctx 0 --decode 1 2>&1 | grep -E "^prefill" | sed "s/^/q4_k chunk 32768: /" >>"$OUT/bench-bf16.log"
	cat "$OUT/bench-bf16.log"
	timeout 200 $B/test_cache >"$OUT/test_cache.log" 2>&1
	summary+=("test_cache (cpu + cuda): rc=$? $(tail -1 "$OUT/test_cache.log")")
	rm -f "$OUT/check.tmp"
	echo
	echo "==== summary ===="
	printf '%s\n' "${summary[@]}"
	grep -E "failed" "$OUT/test_ops.log" "$OUT/test_cache.log" | head -10
	grep -hE "^(gemv|moe) " "$OUT/ops-perf.log"
	for t in bf16 q4_k q4_k_m mlx4; do
		awk -v t=$t '/^weights:/ {w=$0} /^prefill/ {p=p " " $2 ":" $5 "(" $4 "ms, " $7 "x GEMM)"} /^[0-9]+ +[0-9.]+ +[0-9.]+/ {d=d " ctx" $1 ":" $2 "tok/s(" $6 "x floor)"}
			END {print t ": prefill tok/s" p "; decode" d; print "  " w}' "$OUT/bench-$t.log"
	done
	exit 0
fi
# 1. every op against the scalar reference (MODE=perf skips 1 and 2)
if [ "$MODE" != perf ]; then
timeout 300 $B/test_ops >"$OUT/test_ops.log" 2>&1
rc=$?
summary+=("test_ops (cpu + cuda ops vs reference): rc=$rc, $(grep -c 'failed' "$OUT/test_ops.log") failures")
grep -E "failed|cuda" "$OUT/test_ops.log" | head -40
rm -f "$OUT/checks.log"
# 2. every shared model against its reference on the GPU
for m in qwen3-tiny qwen3moe-tiny qwen35-tiny qwen35moe-tiny qwen3next-tiny qwen3next-tiny-hubcfg qwen3-odd qwen3moe-odd qwen35moe-odd qwen3next-odd; do
	for c in 64 1 7; do
		echo "== $m chunk $c" >>"$OUT/checks.log"
		timeout 120 $B/toasted check build/testdata/models/$m --backend cuda --chunk $c >"$OUT/check.tmp" 2>&1
		rc=$?
		cat "$OUT/check.tmp" >>"$OUT/checks.log"
		summary+=("check $m chunk $c: rc=$rc $(grep -E '^ids|^greedy|^toasted' "$OUT/check.tmp" | tr '\n' ' ')")
	done
done
fi
# 3a. each op alone at the real decode shapes (clocks ramped by sustained load, unlike ncu)
timeout 200 $B/test_ops --perf >"$OUT/ops-perf.log" 2>&1
cat "$OUT/ops-perf.log"
# 3. timing at the real Qwen3-Next shape, 12 of 48 layers in bf16
if [ "$MODE" != quick ]; then
	timeout 400 $B/toasted bench --synthetic qwen3-next-80b-a3b --layers 12 --backend cuda --chunk 4096 \
		--prompt 128,1024,4096,17408 --ctx 0,28000,68000 --decode 64 >"$OUT/bench.log" 2>&1
	summary+=("bench rc=$?")
	cat "$OUT/bench.log"
fi
rm -f "$OUT/check.tmp"
grep -h "per-layer" "$OUT/checks.log" | sort -u | head -20
# 3b. what the slow kernels do (ncu metrics on the op timings: achieved DRAM bytes, occupancy)
if [ "$MODE" != quick ] && command -v ncu >/dev/null; then
	timeout 200 ncu --clock-control none --csv --print-units base -k regex:'k_moe|k_attn_tile|k_gdn_decode' --launch-count 8 \
		--metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread \
		$B/test_ops --perf >"$OUT/ncu-ops.csv" 2>&1
	python3 bench/ncu-table.py "$OUT/ncu-ops.csv"
fi
# 4. where a decode step's time goes: every kernel timed with events at working clocks (no graph)
if [ "$MODE" != quick ]; then
	TOASTED_CUDA_PROFILE=1 timeout 200 $B/toasted bench --synthetic qwen3-next-80b-a3b --layers 12 --backend cuda \
		--prompt 1 --ctx 0 --decode 50 >"$OUT/profile.txt" 2>&1
	grep -A40 "cuda profile" "$OUT/profile.txt"
	TOASTED_CUDA_PROFILE=1 timeout 200 $B/toasted bench --synthetic qwen3-next-80b-a3b --layers 12 --backend cuda \
		--chunk 4096 --prompt 4096 --ctx 0 --decode 1 >"$OUT/profile-prefill.txt" 2>&1
	grep -A40 "cuda profile" "$OUT/profile-prefill.txt"
fi
echo
echo "==== summary ===="
printf '%s\n' "${summary[@]}"
