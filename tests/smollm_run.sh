#!/bin/sh
# The demo: the real model (make model) answers a plain factual question through `toasted run`
# (greedy), and the answer names the right city. The toast client test follows the daemon.
set -eu
BUILD=${BUILD:-build}
MODEL=${TOASTED_SMOLLM:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$MODEL" ] || { echo "smollm_run: $MODEL is missing (make model)" >&2; exit 1; }
out=$("$BUILD/toasted" run "$MODEL" "What is the capital of France?" --temperature 0 --max-tokens 32 --backend cpu)
echo "smollm_run: $out"
case "$out" in
*Paris*) echo "smollm_run: OK" ;;
*) echo "smollm_run: the answer does not name Paris" >&2; exit 1 ;;
esac
