#!/bin/sh
# toasted run / tokenize / detokenize end to end on models/qwen3next-vocab (random weights, the
# real Qwen3 vocabulary and chat template): every chat case of chat-cases.json gives its greedy
# ids and text exactly; stdin is appended to PROMPT after a blank line; stop strings are never
# printed; the context limit and bad options fail with a message and exit status 2.
set -u
BIN=${TOASTED_BIN:-build}/toasted
DATA=${TOASTED_TESTDATA:-build/testdata}
M=$DATA/models/qwen3next-vocab
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
no() { echo "cli_run.sh: FAIL: $*" >&2; fail=1; }
[ -x "$BIN" ] || { no "$BIN is missing"; exit 1; }
[ -f "$M/chat-cases.json" ] || { no "$M/chat-cases.json is missing"; exit 1; }
run() { "$BIN" run "$M" --backend cpu --threads 2 "$@"; }

# one directory per case: messages.json, flags, ids, text
python3 - "$M/chat-cases.json" "$T" <<'PY' || no "reading chat-cases.json"
import json, sys
cases = json.load(open(sys.argv[1]))
for i, c in enumerate(cases):
    d = f"{sys.argv[2]}/case{i}"
    import os; os.makedirs(d)
    json.dump(c["messages"], open(d + "/messages.json", "w"))
    open(d + "/flags", "w").write("--no-think" if c["template_kwargs"].get("enable_thinking") is False else "")
    open(d + "/ids", "w").write(" ".join(map(str, c["greedy_ids"])) + "\n")
    open(d + "/text", "wb").write(c["greedy_text"].encode())
    open(d + "/prompt", "wb").write(c["prompt_text"].encode())
    open(d + "/prompt_ids", "w").write(" ".join(map(str, c["prompt_ids"])) + "\n")
print(len(cases), file=open(sys.argv[2] + "/n", "w"))
PY
n=$(cat "$T/n" 2>/dev/null || echo 0)
[ "$n" = 6 ] || no "expected 6 chat cases, found $n"
i=0
while [ $i -lt "$n" ]; do
	d=$T/case$i
	flags=$(cat "$d/flags")
	# shellcheck disable=SC2086
	run --messages "$d/messages.json" $flags --temperature 0 --ignore-eos --max-tokens 24 --print-ids </dev/null >"$d/got_ids" ||
		no "case $i: run --print-ids failed"
	cmp -s "$d/got_ids" "$d/ids" || no "case $i: greedy ids $(cat "$d/got_ids") want $(cat "$d/ids")"
	# shellcheck disable=SC2086
	run --messages "$d/messages.json" $flags --temperature 0 --ignore-eos --max-tokens 24 </dev/null >"$d/got_text" ||
		no "case $i: run failed"
	cmp -s "$d/got_text" "$d/text" || no "case $i: greedy text differs"
	"$BIN" tokenize "$M" <"$d/prompt" >"$d/got_prompt_ids" || no "case $i: tokenize failed"
	cmp -s "$d/got_prompt_ids" "$d/prompt_ids" || no "case $i: tokenize of the prompt text differs"
	# shellcheck disable=SC2046
	"$BIN" detokenize "$M" $(cat "$d/ids") >"$d/detok" || no "case $i: detokenize failed"
	cmp -s "$d/detok" "$d/text" || no "case $i: detokenize differs from greedy_text"
	i=$((i + 1))
done

# PROMPT + stdin compose as PROMPT + "\n\n" + stdin
printf 'line one\nline two' | run "summarise" --temperature 0 --max-tokens 4 --ignore-eos --print-ids >"$T/piped" ||
	no "run with stdin failed"
run "$(printf 'summarise\n\nline one\nline two')" --temperature 0 --max-tokens 4 --ignore-eos --print-ids </dev/null >"$T/joined" ||
	no "run with the joined prompt failed"
cmp -s "$T/piped" "$T/joined" || no "stdin is not appended as PROMPT + blank line + stdin"
# stdin alone is the prompt
printf 'Explain quicksort in one sentence.' | run --temperature 0 --ignore-eos --max-tokens 24 --print-ids >"$T/stdin_only" ||
	no "run with stdin only failed"
cmp -s "$T/stdin_only" "$T/case0/ids" || no "stdin alone is not the user message"

# a stop string is never printed, nor anything after it (case 0 text: " iets momentoscontro想找 swingerclub ...")
run "Explain quicksort in one sentence." --temperature 0 --ignore-eos --max-tokens 24 --stop "swinger" </dev/null >"$T/stop" ||
	no "run --stop failed"
printf ' iets momentoscontro想找 ' | cmp -s - "$T/stop" || no "--stop: got '$(cat "$T/stop")'"
# sampling with a seed is reproducible
run "hi" --temperature 1 --seed 42 --max-tokens 12 --ignore-eos --print-ids </dev/null >"$T/s1" || no "seeded run failed"
run "hi" --temperature 1 --seed 42 --max-tokens 12 --ignore-eos --print-ids </dev/null >"$T/s2" || no "seeded run failed"
cmp -s "$T/s1" "$T/s2" || no "--seed does not reproduce"
# "--" ends the options: a prompt may begin with '-'; a third argument is refused
run --temperature 0 --ignore-eos --max-tokens 24 --print-ids -- "Explain quicksort in one sentence." </dev/null >"$T/dashdash" ||
	no "run -- PROMPT failed"
cmp -s "$T/dashdash" "$T/case0/ids" || no "run -- PROMPT is not the user message"
run --temperature 0 --max-tokens 2 -- "-v" </dev/null >/dev/null || no "run -- -v (a prompt) failed"
run "hi" -- "there" </dev/null >/dev/null 2>&1
[ $? = 2 ] || no "a second prompt after -- accepted"
# --stats on stderr
run "hi" --temperature 0 --max-tokens 3 --ignore-eos --stats </dev/null >/dev/null 2>"$T/stats" || no "--stats failed"
grep -q "prompt: 9 tokens" "$T/stats" && grep -q "tok/s" "$T/stats" || no "--stats: $(cat "$T/stats")"

# errors: the context limit, bad options, a missing model
run "Explain quicksort in one sentence." --ctx-size 16 </dev/null >/dev/null 2>"$T/err"
st=$?
[ $st = 2 ] && grep -q "leaves no room" "$T/err" || no "context limit: status $st, $(cat "$T/err")"
run "hi" --top-p 2 </dev/null >/dev/null 2>&1
[ $? = 2 ] || no "--top-p 2 accepted"
"$BIN" run /nonexistent "hi" </dev/null >/dev/null 2>&1
[ $? = 2 ] || no "a missing model directory is not exit status 2"
# tokenize --jsonl
printf '{"text": "Hello world"}\n{"text": "<|im_start|>user"}\n' | "$BIN" tokenize "$M" --jsonl >"$T/jsonl" || no "tokenize --jsonl failed"
printf '{"ids": [9707, 1879]}\n{"ids": [151644, 872]}\n' | cmp -s - "$T/jsonl" || no "tokenize --jsonl: $(cat "$T/jsonl")"

[ $fail = 0 ] && echo "cli_run.sh: OK"
exit $fail
