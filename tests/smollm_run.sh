#!/bin/sh
# The demo: the real model (make model) answers a plain factual question, greedily, through
# `toasted run` and through the daemon and the `toast` client, and the answers name the right city.
# Then a sampled echo with drafts (--draft 7; temperature 1 and a seed under which drafts are both
# taken and refused within 24 tokens, so that every uniform counts): drafts are taken, and the
# daemon's reply is the one without drafts (on the CPU; a GPU's verifying pass rounds differently).
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
S="--seed 3 --max-tokens 24 --temperature 1 --top-p 1"
tmp=$(mktemp -d)
export TOASTED_SOCKET="$tmp/toasted.sock"
if "$BUILD/toasted" start "$MODEL" --backend "$BACKEND" --log "$tmp/log" >/dev/null; then
	out=$(timeout 120 "$BUILD/toast" "$Q" --temperature 0 --max-tokens 32 </dev/null)
	echo "smollm_run ($BACKEND): toast: $out"
	case "$out" in *Paris*) ;; *) echo "smollm_run: toast's answer does not name Paris" >&2; fail=1 ;; esac
	plain=$(timeout 120 "$BUILD/toast" $S <bench/spec/echo.txt)
	drafted=$(timeout 120 "$BUILD/toast" $S --draft 7 <bench/spec/echo.txt)
	if [ -z "$plain" ] || { [ "$BACKEND" = cpu ] && [ "$plain" != "$drafted" ]; }; then
		echo "smollm_run: a sampled reply with drafts is not the one without: '$plain' / '$drafted'" >&2
		fail=1
	fi
	"$BUILD/toasted" stop >/dev/null || fail=1
else
	echo "smollm_run: toasted start failed" >&2
	fail=1
fi
taken=$("$BUILD/toasted" run "$MODEL" $S --draft 7 --stats --backend "$BACKEND" <bench/spec/echo.txt 2>&1 >/dev/null |
	sed -n 's/^drafts: \([0-9]*\) of.*/\1/p')
echo "smollm_run ($BACKEND): sampled echo, draft tokens taken: ${taken:-none}"
[ "${taken:-0}" -gt 0 ] || { echo "smollm_run: no draft taken on a sampled echo" >&2; fail=1; }
rm -rf "$tmp"
[ $fail = 0 ] && echo "smollm_run ($BACKEND): OK"
exit $fail
