#!/usr/bin/env python3
"""Differential test of the tokenizer against Hugging Face `tokenizers` (pip install tokenizers):
random texts (mixed scripts, spaces, digits, emoji, special tokens, random assigned code points)
encoded by both; every difference is printed unless a code point whose normalisation differs
between the two explains it (utf8proc's tables are newer than upstream's: README, "Known
differences"). With `all` for N: every assigned code point (by Python's tables) in seven
contexts instead. Needs `make` first. Exit 1 on an unexplained difference.

    python3 tests/fuzz/difftok.py MODEL_DIR [N|all] [SEED]
"""
import json
import random
import subprocess
import sys
import unicodedata

import tokenizers

model = sys.argv[1]
every = len(sys.argv) > 2 and sys.argv[2] == "all"
n = 0 if every else int(sys.argv[2]) if len(sys.argv) > 2 else 20000
seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
hf = tokenizers.Tokenizer.from_file(f"{model}/tokenizer.json")
form = {"NFC": "NFC", "NFKC": "NFKC", "NFD": "NFD", "NFKD": "NFKD"}
norm = json.load(open(f"{model}/tokenizer.json")).get("normalizer") or {}
kinds = [x.get("type") for x in norm.get("normalizers", [norm])]
forms = [form[k] for k in kinds if k in form]
rng = random.Random(seed)
pieces = [" ", "  ", "\n", "\r\n", "\t", "'s", "'T", "'re", "123", "4567", "a", "Z", "hello", " world", "é", "e\u0301",
          "中文", "日本語", "한국어", "🙂", "👍🏽", "\u200b", "\u00a0", "ǅ", "ﬁ", "Ⅻ", "①", "½", "٣", "\u0300", "<|im_start|>",
          "<|im_end|>", "<think>", "</think>", "<tool_call>", "[MASK]", " [MASK] ", "\uff3b", "ß", "İ", "ς", "\ufeff",
          "$$", "...", "!!!", "---", "```", "\\n", "\x00", "\x7f", "\u2028", "\u3000", "ａｂｃ", "x" * 30, "1" * 20]


def assigned():
    while True:
        cp = rng.randint(0x20, 0x2FFFF)
        if not 0xD800 <= cp <= 0xDFFF and unicodedata.category(chr(cp)) not in ("Cn", "Cs", "Co"):
            return chr(cp)


texts = ["".join(rng.choice(pieces) if rng.random() < 0.6 else assigned() for _ in range(rng.randint(1, 12)))
         for _ in range(n)]
if every:
    for cp in range(0x80, 0x30000):
        c = chr(cp)
        if not 0xD800 <= cp <= 0xDFFF and unicodedata.category(c) not in ("Cn", "Cs", "Co"):
            texts += [c, "a" + c, c + "1", " " + c, "1" + c, c + "'s", c + c]
    n = len(texts)
r = subprocess.run(["build/toasted", "tokenize", model, "--jsonl"], capture_output=True, check=True,
                   input="".join(json.dumps({"text": t}) + "\n" for t in texts).encode())
ours = [json.loads(line)["ids"] for line in r.stdout.decode().splitlines()]
assert len(ours) == n


def norm_differs(c):
    if hf.normalizer is None:
        return False
    for s in (c, "a" + c + "\u0300"):
        want = s
        for f in forms:
            want = unicodedata.normalize(f, want)
        if want != s and want != hf.normalizer.normalize_str(s):
            return True
    return False


differ = unexplained = 0
for t, o in zip(texts, ours):
    if hf.encode(t, add_special_tokens=False).ids == o:
        continue
    differ += 1
    if not any(norm_differs(c) for c in t):
        unexplained += 1
        print("DIFF", repr(t), "\n  upstream", hf.encode(t, add_special_tokens=False).ids, "\n  ours    ", o)
print(f"{model}: {n} texts, {differ} differ, {unexplained} not explained by normalisation tables "
      f"(tokenizers {tokenizers.__version__}, Python's Unicode {unicodedata.unidata_version})")
sys.exit(1 if unexplained else 0)
