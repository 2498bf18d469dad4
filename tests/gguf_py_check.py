"""Read a GGUF written by `toasted convert` with llama.cpp's own Python reader (the `gguf`
package) and check it: metadata and tensor infos parse, every tensor name belongs to the
architecture in gguf's tensor tables, shapes are ggml's (ne innermost first), and gguf's
dequantisation of every matrix matches the source model's weights within the type's error
bound (so the block layouts are the standard ones).

usage: gguf_py_check.py FILE.gguf SOURCE_DIR
"""
import json
import struct
import sys

import numpy as np
import gguf
from importlib.metadata import version
from gguf.quants import dequantize

# relative RMS error bounds of one tensor's dequantised values against the source (bf16)
BOUND = {"F32": 1e-6, "BF16": 1e-6, "F16": 1e-3, "Q8_0": 0.012, "Q6_K": 0.03, "Q5_K": 0.05,
         "Q4_K": 0.11, "Q4_1": 0.12, "Q4_0": 0.15}


def load_safetensors(d):
    with open(d + "/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, e in hdr.items():
        if k == "__metadata__":
            continue
        assert e["dtype"] == "BF16", e["dtype"]
        b = np.frombuffer(data[e["data_offsets"][0]:e["data_offsets"][1]], dtype=np.uint16)
        out[k] = (b.astype(np.uint32) << 16).view(np.float32).reshape(e["shape"])
    return out


def main():
    path, src = sys.argv[1], sys.argv[2]
    r = gguf.GGUFReader(path)
    fields = r.fields
    arch = bytes(fields["general.architecture"].parts[-1]).decode()
    assert fields["GGUF.version"].parts[-1][0] == 3
    cfg = json.load(open(src + "/config.json"))
    cfg = cfg.get("text_config", cfg)
    assert fields[arch + ".block_count"].parts[-1][0] == cfg["num_hidden_layers"]
    assert fields[arch + ".embedding_length"].parts[-1][0] == cfg["hidden_size"]
    assert fields[arch + ".attention.head_count"].parts[-1][0] == cfg["num_attention_heads"]
    # names: every tensor is one gguf knows for this architecture
    arch_id = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch_id]}
    nl = cfg["num_hidden_layers"]
    allowed = set()
    for k in known:
        for b in range(nl) if "{bid}" in k else [0]:
            base = k.format(bid=b)
            allowed |= {base + ".weight", base + ".bias", base}
    src_w = load_safetensors(src)
    checked = 0
    for t in r.tensors:
        assert t.name in allowed, f"{t.name} is not a {arch} tensor"
        shape = [int(x) for x in reversed(t.shape)]  # PyTorch order
        d = dequantize(t.data, t.tensor_type).reshape(shape)
        name = t.name
        # direct counterparts (qwen3/llama-free of transforms): layer and global matrices
        hf = None
        m = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight"}
        if name in m:
            hf = m[name]
        elif name.startswith("blk."):
            _, b, rest = name.split(".", 2)
            sub = {"attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
                   "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
                   "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
                   "ffn_down.weight": "mlp.down_proj.weight", "attn_norm.weight": "input_layernorm.weight",
                   "ffn_norm.weight": "post_attention_layernorm.weight"}.get(rest)
            hf = f"model.layers.{b}.{sub}" if sub else None
        if hf is None or hf not in src_w:
            continue
        ref = src_w[hf]
        assert list(ref.shape) == shape, (name, ref.shape, shape)
        err = float(np.sqrt(((d - ref) ** 2).mean() / max((ref ** 2).mean(), 1e-30)))
        bound = BOUND[t.tensor_type.name]
        assert err <= bound, f"{name} ({t.tensor_type.name}): error {err:.4g} above {bound}"
        checked += 1
    assert checked >= 10, checked
    types = sorted({t.tensor_type.name for t in r.tensors})
    print(f"{path}: gguf {version('gguf')} reads {len(r.tensors)} tensors, {len(fields)} fields; "
          f"{checked} matrices match the source; types {types}")


if __name__ == "__main__":
    main()
