#!/bin/sh
# GGUF files written by `toasted convert` are read by llama.cpp's own Python reader (the `gguf`
# package from PyPI, installed into a venv under $BUILD): metadata, tensor infos, names and the
# dequantised values (tests/gguf_py_check.py). The tokenizer metadata is checked too.
set -eu
BUILD=${BUILD:-build}
TD=${TOASTED_TESTDATA:-$BUILD/testdata}
VENV=$BUILD/venv-gguf
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import gguf, numpy" 2>/dev/null; then
	python3 -m venv "$VENV"
	"$VENV/bin/pip" install -q --disable-pip-version-check "gguf==0.19.0" >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
for t in bf16 q8_0 q4_0 q4_1 q4_k_m q5_k_m q6_k; do
	"$BUILD/toasted" convert "$TD/models/qwen3-tiny" -o "$tmp/m.gguf" --type "$t" >/dev/null
	"$VENV/bin/python" tests/gguf_py_check.py "$tmp/m.gguf" "$TD/models/qwen3-tiny" || fail=1
done
"$BUILD/toasted" convert "$TD/models/qwen3next-vocab" -o "$tmp/v.gguf" --type q8_0 >/dev/null
"$VENV/bin/python" - "$tmp/v.gguf" <<'PY' || fail=1
import sys, gguf
r = gguf.GGUFReader(sys.argv[1])
f = r.fields
s = lambda k: bytes(f[k].parts[-1]).decode()
assert s("general.architecture") == "qwen3next" and s("tokenizer.ggml.model") == "gpt2"
assert s("tokenizer.ggml.pre") == "qwen2"
toks = f["tokenizer.ggml.tokens"]
assert len(toks.data) == 151936
assert bytes(toks.parts[toks.data[151644]]).decode() == "<|im_start|>"
assert len(f["tokenizer.ggml.merges"].data) == 151387
assert "<|im_start|>" in s("tokenizer.chat_template")
names = {t.name for t in r.tensors}
assert "blk.0.attn_qkv.weight" in names and "blk.0.ssm_ba.weight" in names and "blk.3.attn_q.weight" in names
print(sys.argv[1] + ": qwen3next tokenizer metadata and tensor names read by gguf")
PY
[ $fail = 0 ] && echo "gguf_py: OK"
exit $fail
