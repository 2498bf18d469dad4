#!/usr/bin/env python3
"""Write a GGUF file of the whole Qwen3-Next-80B-A3B shape (48 layers, 512 experts) whose tensor
data is a hole: the header (metadata and tensor directory) is real, the ~45 GB after it are
zeros that take no disk (ftruncate). It times what `toasted start` does with a real 4-bit file
once its bytes are in the page cache: reading the header, mapping the data, and every upload to
the GPU, with no download and no disk in the way (reading a hole costs a page of zeros).

    python3 bench/sparse-gguf.py SMALL.gguf OUT.gguf [--layers N] [--fill]

--fill writes the data instead (random bytes, ~1 GB a layer), for a load from the disk.

SMALL.gguf gives the metadata that is not the shape (the tokenizer, its merges, the chat
template): a qwen3next file of `toasted convert` with the real vocabulary, e.g. of
build/testdata/models/qwen3next-vocab. Matrices are Q4_K (the LM head Q6_K, the router bf16),
vectors f32, laid out as llama.cpp's qwen3next converter names them (the DeltaNet input
projection as attn_qkv and attn_gate, as toasted convert writes it). Standard library only: the
device machine has no gguf package."""
import argparse
import os
import struct

F32, Q4_K, Q6_K, BF16 = 0, 12, 14, 30
BLOCK = {F32: (1, 4), BF16: (1, 2), Q4_K: (256, 144), Q6_K: (256, 210)}

# Qwen3-Next-80B-A3B (docs/qwen3next-spec.md section 1)
E, V, NH, NKV, HD, NE, NU, FE, FS = 2048, 151936, 16, 2, 256, 512, 10, 512, 512
SK, SNK, SNV, SDV, CONV = 128, 16, 32, 128, 4
SHAPE = {
    "embedding_length": E, "context_length": 262144, "feed_forward_length": 5120,
    "attention.head_count": NH, "attention.head_count_kv": NKV, "attention.key_length": HD,
    "attention.value_length": HD, "rope.dimension_count": 64, "expert_count": NE,
    "expert_used_count": NU, "expert_feed_forward_length": FE, "expert_shared_feed_forward_length": FS,
    "ssm.conv_kernel": CONV, "ssm.state_size": SK, "ssm.group_count": SNK, "ssm.time_step_rank": SNV,
    "ssm.inner_size": SNV * SDV, "full_attention_interval": 4,
}


def tensors(n_layer):
    """(name, dims with ne0 first, type) of every tensor"""
    conv_dim = 2 * SNK * SK + SNV * SDV
    out = [("token_embd.weight", [E, V], Q4_K)]
    for il in range(n_layer):
        b = f"blk.{il}."
        out.append((b + "attn_norm.weight", [E], F32))
        if il % 4 == 3:
            out += [(b + "attn_q.weight", [E, 2 * NH * HD], Q4_K), (b + "attn_k.weight", [E, NKV * HD], Q4_K),
                    (b + "attn_v.weight", [E, NKV * HD], Q4_K), (b + "attn_output.weight", [NH * HD, E], Q4_K),
                    (b + "attn_q_norm.weight", [HD], F32), (b + "attn_k_norm.weight", [HD], F32)]
        else:
            out += [(b + "ssm_a", [SNV], F32), (b + "ssm_conv1d.weight", [CONV, conv_dim], F32),
                    (b + "ssm_dt.bias", [SNV], F32), (b + "ssm_ba.weight", [E, 2 * SNV], Q4_K),
                    (b + "attn_qkv.weight", [E, conv_dim], Q4_K), (b + "attn_gate.weight", [E, SNV * SDV], Q4_K),
                    (b + "ssm_norm.weight", [SDV], F32), (b + "ssm_out.weight", [SNV * SDV, E], Q4_K)]
        out += [(b + "ffn_gate_inp.weight", [E, NE], BF16), (b + "ffn_gate_exps.weight", [E, FE, NE], Q4_K),
                (b + "ffn_up_exps.weight", [E, FE, NE], Q4_K), (b + "ffn_down_exps.weight", [FE, E, NE], Q4_K),
                (b + "ffn_gate_shexp.weight", [E, FS], Q4_K), (b + "ffn_up_shexp.weight", [E, FS], Q4_K),
                (b + "ffn_down_shexp.weight", [FS, E], Q4_K), (b + "ffn_gate_inp_shexp.weight", [E, 1], F32),
                (b + "post_attention_norm.weight", [E], F32)]
    return out + [("output_norm.weight", [E], F32), ("output.weight", [E, V], Q6_K)]


class Reader:
    SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def __init__(self, data):
        self.d, self.p = data, 0

    def get(self, fmt):
        v = struct.unpack_from("<" + fmt, self.d, self.p)[0]
        self.p += struct.calcsize("<" + fmt)
        return v

    def skip_value(self, t):
        if t == 8:
            n = self.get("Q")
            self.p += n
        elif t == 9:
            at, n = self.get("I"), self.get("Q")
            for _ in range(n):
                self.skip_value(at)
        else:
            self.p += struct.calcsize("<" + self.SCALAR[t])


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("small")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--fill", action="store_true", help="write the data (random bytes) instead of a hole")
    a = ap.parse_args()
    with open(a.small, "rb") as f:
        r = Reader(f.read())
    if r.d[:4] != b"GGUF":
        raise SystemExit(f"{a.small}: not a GGUF file")
    r.p = 4
    r.get("I")
    r.get("Q")
    n_kv = r.get("Q")
    kvs, arch = [], None
    for _ in range(n_kv):
        k0 = r.p
        n = r.get("Q")
        key = r.d[r.p:r.p + n].decode()
        r.p += n
        t = r.get("I")
        v0 = r.p
        r.skip_value(t)
        if key == "general.architecture":
            arch = r.d[v0 + 8:r.p].decode()
        kvs.append((key, r.d[k0:r.p]))
    if arch != "qwen3next":
        raise SystemExit(f"{a.small}: architecture {arch}, not qwen3next")
    pre = arch + "."
    meta = [raw for key, raw in kvs if not (key.startswith(pre) and key[len(pre):] in SHAPE or key == pre + "block_count")]
    meta += [gstr(pre + k) + struct.pack("<II", 4, v) for k, v in SHAPE.items()]
    meta.append(gstr(pre + "block_count") + struct.pack("<II", 4, a.layers))

    align, off, infos = 32, 0, []
    for name, dims, t in tensors(a.layers):
        n = 1
        for x in dims:
            n *= x
        blk, size = BLOCK[t]
        infos.append(gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", x) for x in dims) +
                     struct.pack("<IQ", t, off))
        off += (n // blk * size + align - 1) // align * align
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(meta)) + b"".join(meta) + b"".join(infos)
    head += b"\0" * (-len(head) % align)
    with open(a.out, "wb") as f:
        f.write(head)
        if a.fill:  # a random 64 MB block again and again: bytes the disk must give back
            block = os.urandom(64 << 20)
            for at in range(0, off, len(block)):
                f.write(block[:min(len(block), off - at)])
            f.flush()
            os.fsync(f.fileno())
        else:
            f.truncate(len(head) + off)
    print(f"{a.out}: {a.layers} layers, {len(infos)} tensors, {off / 1e9:.2f} GB of data ({'written' if a.fill else 'a hole'})")


if __name__ == "__main__":
    main()
