#!/bin/sh
# The demo: the real model (make model) answers a plain factual question, greedily, through
# `toasted run` and through the daemon and the `toast` client, and the answers name the right city.
# BACKEND=cuda runs both on the GPU (bench/gpu.sh demo); the default is the CPU.
set -u
BUILD=${BUILD:-build}
BACKEND=${BACKEND:-cpu}
MODEL=${TOASTED_SMOLLM:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$MODEL" ] || { echo "smollm_run: $MODEL is missing (make model)" >&2; exit 1; }
Q="What is the capital of France?"
fail=0
out=$("$BUILD/toasted" run "$MODEL" "$Q" --temperature 0 --max-tokens 32 --backend "$BACKEND" </dev/null)
echo "smollm_run ($BACKEND): toasted run: $out"
case "$out" in *Paris*) ;; *) echo "smollm_run: toasted run's answer does not name Paris" >&2; fail=1 ;; esac
tmp=$(mktemp -d)
export TOASTED_SOCKET="$tmp/toasted.sock"
if "$BUILD/toasted" start "$MODEL" --backend "$BACKEND" --log "$tmp/log" >/dev/null; then
	out=$(timeout 120 "$BUILD/toast" "$Q" --temperature 0 --max-tokens 32 </dev/null)
	echo "smollm_run ($BACKEND): toast: $out"
	case "$out" in *Paris*) ;; *) echo "smollm_run: toast's answer does not name Paris" >&2; fail=1 ;; esac
	"$BUILD/toasted" stop >/dev/null || fail=1
else
	echo "smollm_run: toasted start failed" >&2
	fail=1
fi
rm -rf "$tmp"
[ $fail = 0 ] && echo "smollm_run ($BACKEND): OK"
exit $fail
