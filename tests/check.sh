#!/bin/sh
# check.sh - `toasted check` exit statuses: 0 when the model matches its reference, 1 for a
# mismatch (naming the first failing position), 2 for unusable input (missing or damaged model,
# reference or reference.json, bad arguments). References are damaged by patching bytes with dd.
set -u
BIN=${TOASTED_BIN:-build}/toasted
DATA=${TOASTED_TESTDATA:-build/testdata}
M=$DATA/models/qwen3-odd
fail=0
if [ ! -x "$BIN" ] || [ ! -f "$M/reference.safetensors" ]; then
	echo "check.sh: needs $BIN and $M (make testdata)" >&2
	exit 1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/toast-check-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

# expect STATUS TEXT WHAT ARGS...: `toasted check ARGS` exits with STATUS and prints TEXT
expect() {
	want=$1 text=$2 what=$3
	shift 3
	out=$("$BIN" check "$@" 2>&1)
	rc=$? bad=0
	if [ "$rc" != "$want" ]; then
		echo "check.sh: $what: exit status $rc, want $want" >&2
		bad=1
	fi
	case "$out" in
	*"$text"*) ;;
	*)
		echo "check.sh: $what: the output does not say \"$text\"" >&2
		bad=1
		;;
	esac
	if [ $bad = 1 ]; then
		echo "$out" | sed 's/^/    /' >&2
		fail=1
	fi
}

# tensor_at FILE NAME INDEX SIZE: file offset of element INDEX (SIZE bytes each) of tensor NAME
tensor_at() {
	hlen=$(od -An -tu8 -N8 "$1" | tr -d ' ')
	begin=$(dd if="$1" bs=1 skip=8 count="$hlen" 2>/dev/null |
		sed -n "s/.*\"$2\":{[^}]*\"data_offsets\":\[\([0-9]*\),.*/\1/p")
	[ -n "$begin" ] || { echo "check.sh: no tensor $2 in $1" >&2; exit 1; }
	echo $((8 + hlen + begin + $3 * $4))
}

# poke FILE OFFSET OCTAL-ESCAPES: overwrite bytes in place
poke() {
	printf "$3" | dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null
}

# a copy of the model's reference to damage: ref/reference.safetensors + ref/reference.json
fresh_ref() {
	rm -rf "$tmp/ref"
	mkdir "$tmp/ref"
	cp "$M/reference.safetensors" "$M/reference.json" "$tmp/ref/"
	R=$tmp/ref/reference.safetensors
}

V=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$M/config.json")

expect 0 PASS "the model against its own reference" "$M" --threads 2
expect 0 PASS "the same with --chunk=5" "$M" --chunk=5
expect 0 "8-bit KV cache" "an 8-bit KV cache, judged by KL as quantised weights are" "$M" --kv-cache q8
expect 1 "FAIL (quantised" "an 8-bit KV cache beyond a KL bound of 1e-9" "$M" --kv-cache q8 --max-kl 1e-9
expect 2 "unknown KV cache type" "an unknown KV cache type" "$M" --kv-cache q9

# 1: logits1 of position 123 perturbed (element 5 set to 1e6)
fresh_ref
poke "$R" "$(tensor_at "$R" logits1 $((123 * V + 5)) 4)" '\000\044\164\111'
expect 1 "first failing position 123" "perturbed logits" "$M" --reference "$R"
expect 1 "ids0: 12 tokens" "perturbed logits: ids0 still reported" "$M" --reference "$R"

# 1: greedy token 7 of reference.json changed
fresh_ref
awk -v V="$V" '/"greedy": \[/ { n = 0; inlist = 1; print; next }
	inlist && /^ *[0-9]+,?$/ { if (n++ == 7) { sub(/[0-9]+/, ($1 + 1) % V) } }
	{ print }' "$M/reference.json" > "$tmp/ref/reference.json"
expect 1 "first mismatch at generated token 7" "perturbed greedy token" "$M" --reference "$R"

# 2: unusable input
expect 2 "" "no arguments"
expect 2 "--chunk" "chunk 0" "$M" --chunk 0
expect 2 "--chunk" "chunk above the most a pass takes (32768)" "$M" --chunk 32769
expect 0 PASS "a chunk of 32768" "$M" --chunk 32768
expect 2 "--threads" "threads not a number" "$M" --threads two
expect 2 "unexpected argument" "unknown option" "$M" --fast
expect 2 "nope" "no such model" "$tmp/nope"
expect 2 "none.safetensors" "no such reference" "$M" --reference "$tmp/none.safetensors"
expect 2 "expected I32" "a reference made for another vocabulary" "$M" \
	--reference "$DATA/models/qwen3moe-odd/reference.safetensors"

fresh_ref
head -c 1000 "$M/reference.safetensors" > "$R"
expect 2 "reference.safetensors" "truncated reference" "$M" --reference "$R"

fresh_ref
poke "$R" "$(tensor_at "$R" ids0 3 4)" '\237\206\001\000' # ids0[3] = 99999
expect 2 "99999" "token id outside the vocabulary" "$M" --reference "$R"

fresh_ref
rm "$tmp/ref/reference.json"
expect 2 "reference.json" "no reference.json" "$M" --reference "$R"

for bad in 'not json' '{}' '{"greedy": "1 2 3"}' '{"greedy": [1, "2"]}' '{"greedy": [1.5]}' \
	'{"greedy": [1], "greedy_from": "ids7"}'; do
	fresh_ref
	printf '%s' "$bad" > "$tmp/ref/reference.json"
	expect 2 "reference.json" "reference.json $bad" "$M" --reference "$R"
done
fresh_ref
printf '{"greedy": [100000]}' > "$tmp/ref/reference.json"
expect 2 "100000" "greedy token outside the vocabulary" "$M" --reference "$R"

mkdir "$tmp/model"
cp "$M/config.json" "$M/reference.safetensors" "$M/reference.json" "$tmp/model/"
head -c 100000 "$M/model.safetensors" > "$tmp/model/model.safetensors"
expect 2 "model.safetensors" "truncated weights" "$tmp/model"
cp "$M/model.safetensors" "$tmp/model/"
sed 's/"model_type": "qwen3"/"model_type": "qwen4"/' "$M/config.json" > "$tmp/model/config.json"
expect 2 "qwen4" "unknown model_type" "$tmp/model"

[ $fail = 0 ] && echo "check.sh: OK"
exit $fail
