#!/bin/sh
# Seed corpora for the fuzz harnesses, into build-fuzz/seeds-*: the chat templates of
# tests/data/tokenizer/jinja-cases.json, the test tokenizers, and the headers (metadata and
# tensor directory, no data) of the tiny test models converted to GGUF by build/toasted.
set -eu
cd "$(dirname "$0")/../.."
S=build-fuzz
mkdir -p $S/seeds-jinja $S/seeds-tok $S/seeds-gguf
python3 - tests/data/tokenizer/jinja-cases.json $S/seeds-jinja <<'PY'
import json, sys
for i, c in enumerate(json.load(open(sys.argv[1]))):
    open(f"{sys.argv[2]}/case{i}", "w").write(c["template"])
PY
cp tests/data/tokenizer/tiny-bpe/tokenizer.json $S/seeds-tok/tiny-bpe
cp tests/data/tokenizer/llama3-style/tokenizer.json $S/seeds-tok/llama3-style
for m in qwen3-tiny qwen3next-tiny qwen35moe-tiny; do
	build/toasted convert build/testdata/models/$m -o $S/$m.gguf --type q4_k_m >/dev/null
	python3 - $S/$m.gguf $S/seeds-gguf/$m <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
def skip(t, p):  # past a value of type t at p
    if t == 8:
        return p + 8 + struct.unpack_from("<Q", b, p)[0]
    if t == 9:
        at, n = struct.unpack_from("<IQ", b, p)
        p += 12
        for _ in range(n):
            p = skip(at, p)
        return p
    return p + size[t]
n_t, n_kv = struct.unpack_from("<QQ", b, 8)
p = 24
for _ in range(n_kv):
    p = skip(8, p)
    p = skip(struct.unpack_from("<I", b, p)[0], p + 4)
for _ in range(n_t):
    p = skip(8, p)
    p += 4 + 8 * struct.unpack_from("<I", b, p)[0] + 4 + 8
open(sys.argv[2], "wb").write(b[:p])
PY
	rm $S/$m.gguf
done
ls $S/seeds-jinja | wc -l
