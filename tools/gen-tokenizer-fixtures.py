#!/usr/bin/env python3
"""Write the tokenizer fixtures of tests/data/tokenizer/ that do not come from a real model:

tiny-bpe/      a hand-made GPT-2-style byte-level BPE (ByteLevel pre-tokenizer with its built-in
               regex, ids = byte values, 18 merges chosen so that merge order, not longest match,
               decides); tests/test_tokenizer.c checks hand-derived expectations on it.
llama3-style/  a BPE trained here with Hugging Face `tokenizers` on this repository's text, with a
               Llama-3-style Split regex (\\p{N}{1,3}), ignore_merges, an NFKC normaliser and
               lstrip/rstrip/single_word added tokens; cases.jsonl holds random texts and the ids
               `tokenizers` gives them (add_special_tokens=False).

Run from the repository root: python3 tools/gen-tokenizer-fixtures.py (needs `tokenizers`).
"""
import json
import os
import random


def byte_char(b):
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


def tiny_bpe(d):
    vocab = {byte_char(b): b for b in range(256)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("l", "l"), ("e", "ll"), ("he", "ll"), ("hell", "o"),
              ("Ġ", "Ġ"), ("'", "s"), ("1", "2"), ("a", "a"), ("aa", "aa"), ("Ġ", "w"), ("o", "r"),
              ("Ġw", "or"), ("l", "d"), ("Ġwor", "ld"), ("e", "l")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    added = [{"id": len(vocab) + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, c in enumerate(["<|endoftext|>", "<|im_end|>", "<|im_start|>"])]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": [[a, b] for a, b in merges]}}
    os.makedirs(d, exist_ok=True)
    with open(d + "/tokenizer.json", "w") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    with open(d + "/tokenizer_config.json", "w") as f:
        json.dump({"eos_token": "<|endoftext|>", "bos_token": None}, f)


def llama3_style(d):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    corpus = ""
    for root in ("src", "docs", "tests"):
        for dirpath, _, files in os.walk(root):
            for fn in sorted(files):
                if fn.endswith((".c", ".h", ".md")):
                    corpus += open(os.path.join(dirpath, fn), errors="replace").read()
    corpus += open("README.md").read()
    t = Tokenizer(models.BPE(ignore_merges=True))
    t.normalizer = normalizers.Sequence([normalizers.NFKC()])
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator([corpus], trainers.BpeTrainer(vocab_size=800, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t.add_special_tokens([AddedToken("<|begin_of_text|>", special=True), AddedToken("<|eot_id|>", special=True),
                          AddedToken("[MASK]", lstrip=True, rstrip=True, special=True)])
    t.add_tokens([AddedToken("word", single_word=True), AddedToken("ﬁx", normalized=True)])
    os.makedirs(d, exist_ok=True)
    t.save(d + "/tokenizer.json")
    random.seed(3)
    pools = [range(0x20, 0x7f), range(0xa0, 0x250), range(0x300, 0x370), range(0x370, 0x530), range(0x4e00, 0x4e40),
             range(0x1f300, 0x1f340), range(0xff00, 0xff60), [0xfb01, 0x2126, 0x212b, 0x1e0a, 0x323, 0x307, 0x2460]]
    words = ["word", "[MASK]", "<|eot_id|>", "ﬁx", "fix", " ", "  ", "\n", "1234567", "don't", "x_word", "word_x"]
    cases = []
    for _ in range(300):
        s = ""
        for _ in range(random.randint(0, 30)):
            s += random.choice(words) if random.random() < 0.15 else chr(random.choice(random.choice(pools)))
        cases.append(s)
    with open(d + "/cases.jsonl", "w") as f:
        for s in cases:
            f.write(json.dumps({"text": s, "ids": t.encode(s, add_special_tokens=False).ids}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    tiny_bpe("tests/data/tokenizer/tiny-bpe")
    llama3_style("tests/data/tokenizer/llama3-style")
    print("wrote tests/data/tokenizer/tiny-bpe and tests/data/tokenizer/llama3-style")
