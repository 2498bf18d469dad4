#!/bin/sh
# toasted bench end to end on the CPU, on the small synthetic Qwen3-Next shape
# (bench/qwen3next-small.json: random weights made at load): decode through generation, greedy
# and drawn from the top 20 with a repetition penalty (the sampler's top + penalty window), and
# from every logit (top-k 0: a nucleus; top-k 300; min-p with a penalty under 1), a row for every
# --ctx; a bad option fails with exit status 2. Speed is not judged here (docs/PERF.md holds the
# figures); that the benchmark runs and reports is.
set -u
BIN=${TOASTED_BIN:-build}/toasted
CFG=bench/qwen3next-small.json
fail=0
no() { echo "bench_cpu.sh: FAIL: $*" >&2; fail=1; }
[ -x "$BIN" ] || { no "$BIN is missing"; exit 1; }
[ -f "$CFG" ] || { no "$CFG is missing"; exit 1; }
bench() { "$BIN" bench --synthetic "$CFG" --backend cpu --threads 2 --prompt 8 --decode 4 "$@"; }

# the decode rows of bench's output: "CTX TOK/S ..." for each --ctx, in order
rows() { awk '/^decode@ctx/ {d = 1; next} d && /^[0-9]+ +[0-9.]+ / {printf "%s ", $1}'; }

out=$(bench --ctx 0 2>&1) || no "greedy: exit $?: $out"
[ "$(printf '%s\n' "$out" | rows)" = "0 " ] || no "greedy: no decode row at ctx 0: $out"
out=$(bench --ctx 0,16 --top 20 --repeat-penalty 1.1 2>&1) || no "top 20, penalty 1.1: exit $?: $out"
[ "$(printf '%s\n' "$out" | rows)" = "0 16 " ] || no "top 20, penalty 1.1: no decode rows at ctx 0 and 16: $out"
out=$(bench --ctx 0 --top 0 --top-p 0.9 2>&1) || no "top-k 0, top-p 0.9: exit $?: $out"
[ "$(printf '%s\n' "$out" | rows)" = "0 " ] || no "top-k 0, top-p 0.9: no decode row at ctx 0: $out"
out=$(bench --ctx 0 --top 300 --top-p 0.9 2>&1) || no "top-k 300, top-p 0.9: exit $?: $out"
[ "$(printf '%s\n' "$out" | rows)" = "0 " ] || no "top-k 300, top-p 0.9: no decode row at ctx 0: $out"
out=$(bench --ctx 0 --top 0 --min-p 0.05 --repeat-penalty 0.9 2>&1) || no "top-k 0, min-p 0.05, penalty 0.9: exit $?: $out"
[ "$(printf '%s\n' "$out" | rows)" = "0 " ] || no "top-k 0, min-p 0.05, penalty 0.9: no decode row at ctx 0: $out"
bench --min-p 2 >/dev/null 2>&1
[ $? = 2 ] || no "--min-p 2 is not refused with exit status 2"
bench --top-p 0 >/dev/null 2>&1
[ $? = 2 ] || no "--top-p 0 is not refused with exit status 2"
bench --repeat-penalty 0 >/dev/null 2>&1
[ $? = 2 ] || no "--repeat-penalty 0 is not refused with exit status 2"
[ $fail = 0 ] && echo "bench_cpu.sh: OK"
exit $fail
