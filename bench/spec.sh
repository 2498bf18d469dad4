#!/bin/bash
# Speculative decoding (toast_gen_opts.draft) on a real model: each prompt of bench/spec/ through
# `toasted run --temperature TEMP --seed SEED --stats` with drafts of 0, 2, 4 and 7 tokens; the text
# must not change, and the table gives decode tok/s and the drafts taken. Usage (repository root;
# MODEL: a GGUF or model directory, default the demo model; BIN: where toasted is; BACKEND:
# cpu|cuda; TEMP: 0, greedy, by default, else the default sampler's top-k 20 and top-p 0.8):
#   MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf BACKEND=cpu bash bench/spec.sh
# On the device machine the demo model arrives in parts (bench/gpu.sh's demo mode): SMOL_PARTS=1
# assembles it from /tmp/smol first.
set -u
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
BIN=${BIN:-build}
BACKEND=${BACKEND:-cpu}
TEMP=${TEMP:-0}
SEED=${SEED:-1}
OUT=${OUT:-/tmp/spec-out}
mkdir -p "$OUT"
if [ "${SMOL_PARTS:-0}" = 1 ]; then
	MODEL=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
	cat /tmp/smol/part.* >"$MODEL"
	echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $MODEL" | sha256sum -c >/dev/null || exit 1
fi
printf '%-8s %6s %10s %14s %8s\n' prompt draft "tok/s" "drafts taken" text
for p in bench/spec/*.txt; do
	name=$(basename "$p" .txt)
	for d in 0 2 4 7; do
		"$BIN/toasted" run "$MODEL" "$(cat "$p")" --temperature "$TEMP" --seed "$SEED" --max-tokens 200 --backend "$BACKEND" --stats \
			--draft $d </dev/null >"$OUT/$name-$d.txt" 2>"$OUT/$name-$d.log"
		rc=$?
		tps=$(grep -o 'decode: [0-9]* tokens in [0-9.]* s ([0-9.]* tok/s)' "$OUT/$name-$d.log" | grep -o '([0-9.]*' | tr -d '(')
		taken=$(grep -o 'drafts: [0-9]* of [0-9]*' "$OUT/$name-$d.log" | sed 's/drafts: //')
		same=$(cmp -s "$OUT/$name-0.txt" "$OUT/$name-$d.txt" && echo same || echo DIFFERS)
		[ $rc = 0 ] || same="rc=$rc"
		printf '%-8s %6d %10s %14s %8s\n' "$name" $d "${tps:--}" "${taken:--}" "$same"
	done
done
