#!/bin/sh
# Seed corpora for the fuzz harnesses (after `make`), into build-fuzz/seeds-*: the chat templates of
# tests/data/tokenizer/jinja-cases.json, the test tokenizers, the headers (metadata and tensor
# directory, no data) of the tiny test models converted to GGUF by build/toasted, their
# config.json and safetensors headers, a few requests and events of docs/protocol.md,
# conversations for the real chat template, and texts for the real tokenizer.
set -eu
cd "$(dirname "$0")/../.."
S=build-fuzz
mkdir -p $S/seeds-jinja $S/seeds-tok $S/seeds-gguf $S/seeds-proto $S/seeds-model $S/seeds-chat $S/seeds-encode
# fz_encode: the texts of the Qwen3 tokenizer cases
python3 - tests/data/tokenizer/qwen3-cases.jsonl $S/seeds-encode <<'PY'
import json, sys
for i, line in enumerate(open(sys.argv[1])):
    open(f"{sys.argv[2]}/case{i}", "w").write(json.loads(line)["text"])
PY
# fz_chat: the conversations of the real-vocabulary test model, with tools and a reply in parts
python3 - build/testdata/models/qwen3next-vocab/chat-cases.json $S/seeds-chat <<'PY'
import json, sys
for i, c in enumerate(json.load(open(sys.argv[1]))):
    ctx = dict(c["template_kwargs"], messages=c["messages"], add_generation_prompt=True)
    open(f"{sys.argv[2]}/case{i}", "w").write(json.dumps(ctx))
tool = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "x"}]},
        {"role": "assistant", "content": "<think>\nr\n</think>\n\nok", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "content": "42"}, {"role": "user", "content": "y"}]
open(f"{sys.argv[2]}/tools", "w").write(json.dumps({"messages": msgs, "tools": [tool], "add_generation_prompt": True, "enable_thinking": False}))
PY
# fz_model: 0 and a config.json, 1 and a safetensors header (its length and JSON, no data),
# 2 and a SHA256SUMS
printf '\002%064d  config.json\n%064d  model-00001-of-00002.safetensors\n%064d *sub/tokenizer.json\n' 0 1 2 >$S/seeds-model/sums
for d in build/testdata/models/*/; do
	m=$(basename "$d")
	{ printf '\000'; cat "$d/config.json"; } >$S/seeds-model/config-$m
	[ -f "$d/model.safetensors" ] || continue
	n=$(od -An -tu8 -N8 "$d/model.safetensors" | tr -d ' ')
	{ printf '\001'; head -c $((8 + n)) "$d/model.safetensors"; } >$S/seeds-model/st-$m
done
# fz_proto: the first byte picks the reader (0 HTTP head, 1 request line, 2 event line)
printf '\000POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json\r\nContent-Length: 42\r\nExpect: 100-continue\r\n\r\n' >$S/seeds-proto/http-post
printf '\000GET /v1/models HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n' >$S/seeds-proto/http-get
printf '\001{"v":1,"id":"r1","type":"chat","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":5,"temperature":0.7,"top_p":0.8,"top_k":20,"seed":1,"stop":["x","y"],"stream":true}' >$S/seeds-proto/req-chat
printf '\001{"v":1,"id":"r2","type":"tokenize","text":"abc"}' >$S/seeds-proto/req-tokenize
printf '\002{"id":"r1","delta":"Hel"}' >$S/seeds-proto/ev-delta
printf '\002{"id":"r1","done":{"finish_reason":"stop","usage":{"prompt_tokens":12,"completion_tokens":3,"cached_tokens":0}}}' >$S/seeds-proto/ev-done
printf '\002{"id":"r2","error":{"code":"bad_request","message":"m"}}' >$S/seeds-proto/ev-error
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
