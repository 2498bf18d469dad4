#!/usr/bin/env python3
"""make-reference.py - build small random models and their upstream reference outputs.

    make-reference.py OUT_DIR [NAME ...]

writes OUT_DIR/NAME/{config.json, model.safetensors.xz, reference.safetensors.xz,
reference.json} for each fixture below (all of them when no NAME is given), the layout of
tests/data/models (`make-reference.py tests/data/models` rebuilds the committed fixtures byte
for byte). Not run in CI (it needs torch and transformers 5.17); the fixtures it made are
committed. Same procedure as the shared references (../shared/README.md):

 1. random init from the config (initializer_range 0.08), then perturb every norm weight,
    A_log and dt_bias so that a wrong norm variant or a dropped bias shows up;
 2. round every weight to bf16 and save_pretrained() them: bf16 safetensors, Hub tensor names
    (per-expert MoE tensors, Qwen3-Next's grouped in_proj_qkvz / in_proj_ba);
 3. optionally rewrite config.json the way released checkpoints write it ("hub" style);
 4. run the same model object, cast back with .float(), in float32 on the CPU. The cast to
    bf16 in step 2 also rounds RoPE's inv_freq buffer to bf16 (the shared references have it
    so, and the engine rounds inv_freq to the config's dtype to match). Note that
    from_pretrained(dtype=bfloat16) would NOT do this in transformers 5.17: it keeps inv_freq
    in float32. The script checks that the saved files reload to exactly these weights;
 5. reference.safetensors: ids0 (12 tokens), ids1 (hundreds of tokens: many prefill chunks),
    logits0/1 (float32, every position), hidden0.L (embedding, after each layer, final norm);
    reference.json: 40 greedy tokens continuing ids0 computed with the cache, and whether a
    no-cache recompute agrees.
"""
import copy
import json
import lzma
import os
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import save_file
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

TRANSFORMERS_VERSION = "5.17.0"
N_GREEDY = 40

# Shapes chosen so that nothing divides nicely: hidden sizes that are not multiples of 8,
# head ratios 3:1, 2:1, 5:1 and 1:1, key head dim != value head dim both ways, GDN value/key
# head ratios 2 and 1, odd rotary pair counts, rotary dims that truncate (18 * 0.25),
# attention every 3rd and every 2nd layer, MoE and dense layers mixed, renormalised and raw
# top-k weights, a conv kernel of 3, theta 1e6, eps 1e-5, untied heads.
FIXTURES = {
    "qwen3next-odd": dict(
        seed=11, n_ids1=480,
        config=dict(
            model_type="qwen3_next", vocab_size=131, hidden_size=52, num_hidden_layers=7,
            full_attention_interval=3, num_attention_heads=6, num_key_value_heads=2, head_dim=20,
            partial_rotary_factor=0.5, linear_num_key_heads=3, linear_num_value_heads=6,
            linear_key_head_dim=20, linear_value_head_dim=12, linear_conv_kernel_dim=3,
            num_experts=12, num_experts_per_tok=3, moe_intermediate_size=6,
            shared_expert_intermediate_size=14, intermediate_size=24, norm_topk_prob=True,
            tie_word_embeddings=False, max_position_embeddings=2048)),
    "qwen35moe-odd": dict(
        seed=12, n_ids1=400, style="hub",
        config=dict(
            model_type="qwen3_5_moe_text", vocab_size=149, hidden_size=44, num_hidden_layers=5,
            full_attention_interval=2, num_attention_heads=5, num_key_value_heads=1, head_dim=18,
            partial_rotary_factor=0.25, rope_theta=1000000.0, linear_num_key_heads=4,
            linear_num_value_heads=4, linear_key_head_dim=12, linear_value_head_dim=22,
            linear_conv_kernel_dim=4, num_experts=10, num_experts_per_tok=4, moe_intermediate_size=8,
            shared_expert_intermediate_size=12, tie_word_embeddings=False,
            max_position_embeddings=2048)),
    "qwen3-odd": dict(
        seed=13, n_ids1=500,
        config=dict(
            model_type="qwen3", vocab_size=127, hidden_size=90, num_hidden_layers=3,
            num_attention_heads=6, num_key_value_heads=3, head_dim=14, intermediate_size=50,
            rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
            max_position_embeddings=2048)),
    "qwen3moe-odd": dict(
        seed=19, n_ids1=300,
        config=dict(
            model_type="qwen3_moe", vocab_size=157, hidden_size=56, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=4, head_dim=16, intermediate_size=36,
            num_experts=9, num_experts_per_tok=2, moe_intermediate_size=14, norm_topk_prob=False,
            decoder_sparse_step=2, mlp_only_layers=[3], tie_word_embeddings=False,
            max_position_embeddings=2048)),
}


def make_config(spec):
    kw = copy.deepcopy(spec["config"])
    mt = kw.pop("model_type")
    rope = {"rope_type": "default", "rope_theta": kw.pop("rope_theta", 10000.0)}
    if "partial_rotary_factor" in kw:
        rope["partial_rotary_factor"] = kw.pop("partial_rotary_factor")
    return AutoConfig.for_model(mt, rope_parameters=rope, initializer_range=0.08, **kw)


def perturb(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("A_log") or name.endswith("dt_bias"):
                p.add_(0.2 * torch.randn(p.shape, generator=gen))


def hub_style(cfg, spec):
    """Rewrite a transformers-5 config.json the way released checkpoints write it."""
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp["rope_theta"]
    if "partial_rotary_factor" in rp:
        cfg["partial_rotary_factor"] = rp["partial_rotary_factor"]
    cfg.pop("layer_types")
    cfg["full_attention_interval"] = spec["config"]["full_attention_interval"]
    cfg["torch_dtype"] = cfg.pop("dtype")
    return cfg


def bf16_round(x):
    return x.to(torch.bfloat16).float()


def check_saved(ref, d):
    """The saved directory must reload to exactly ref's weights, stored as bf16, and ref's
    RoPE inverse frequencies must be the bf16-rounded f32 ones."""
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        for k in f.keys():
            assert f.get_tensor(k).dtype == torch.bfloat16, k
    disk = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).float()
    mine = dict(ref.named_parameters())
    theirs = dict(disk.named_parameters())
    assert set(mine) == set(theirs), set(mine) ^ set(theirs)
    for k, v in mine.items():
        assert torch.equal(v, theirs[k]), k
    c = ref.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    dim = int(head_dim * c.rope_parameters.get("partial_rotary_factor", 1.0))
    exact = 1.0 / (c.rope_parameters["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    inv = ref.model.rotary_emb.inv_freq
    assert inv.dtype == torch.float32 and torch.equal(inv, bf16_round(exact)), (inv, exact)
    assert not torch.equal(bf16_round(exact), exact)  # the rounding is visible in this fixture


@torch.no_grad()
def greedy(ref, ids0):
    out = ref(ids0[None], use_cache=True)
    cache, toks = out.past_key_values, []
    for _ in range(N_GREEDY):
        tok = int(out.logits[0, -1].argmax())
        toks.append(tok)
        out = ref(torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
    agrees, margin = True, float("inf")
    for i in range(N_GREEDY):
        seq = torch.cat([ids0, torch.tensor(toks[:i], dtype=ids0.dtype)])
        logits = ref(seq[None], use_cache=False).logits[0, -1]
        agrees &= int(logits.argmax()) == toks[i]
        top2 = logits.topk(2).values
        margin = min(margin, float((top2[0] - top2[1]) / logits.abs().max()))
    return toks, agrees, margin


def write_xz(path, data):
    with open(path, "wb") as f:
        f.write(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))


@torch.no_grad()
def make(name, spec, out_root):
    torch.manual_seed(spec["seed"])
    cfg = make_config(spec)
    # eager experts: torch's CPU grouped_mm (the default) rejects rows that are not a multiple
    # of 16 bytes, and the per-expert loop is the plainest reference anyway
    model = AutoModelForCausalLM.from_config(cfg, experts_implementation="eager")
    perturb(model, torch.Generator().manual_seed(spec["seed"] + 1000))
    model = model.to(torch.bfloat16)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        cpath = os.path.join(d, "config.json")
        with open(cpath) as f:
            cfgj = json.load(f)
        if spec.get("style") == "hub":
            cfgj = hub_style(cfgj, spec)
        with open(cpath, "w") as f:
            json.dump(cfgj, f, indent=2, sort_keys=True)
            f.write("\n")
        ref = model.float().eval()
        check_saved(ref, d)
        with open(os.path.join(d, "model.safetensors"), "rb") as f:
            weights = f.read()
        with open(cpath) as f:
            config_text = f.read()

    V = ref.config.vocab_size
    gen = torch.Generator().manual_seed(spec["seed"] + 2000)
    ids0 = torch.randint(0, V, (12,), generator=gen)
    ids1 = torch.randint(0, V, (spec["n_ids1"],), generator=gen)
    out0 = ref(ids0[None], output_hidden_states=True, use_cache=False)
    tensors = {"ids0": ids0.to(torch.int32), "ids1": ids1.to(torch.int32),
               "logits0": out0.logits[0].float(),
               "logits1": ref(ids1[None], use_cache=False).logits[0].float()}
    assert len(out0.hidden_states) == ref.config.num_hidden_layers + 1
    for i, h in enumerate(out0.hidden_states):
        tensors["hidden0.%d" % i] = h[0].float()
    toks, agrees, margin = greedy(ref, ids0)
    assert agrees, "%s: the cached greedy continuation differs from a no-cache recompute" % name
    # a useful greedy test: no near-ties (float32 engines differ by ~1e-6) and no short loop
    assert margin > 1e-4, "%s: greedy near-tie (margin %.2g): pick another seed" % (name, margin)
    assert len(set(toks)) >= 8, "%s: greedy loops over %d tokens: pick another seed" % (name, len(set(toks)))

    dst = os.path.join(out_root, name)
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(dst, "config.json"), "w") as f:
        f.write(config_text)
    write_xz(os.path.join(dst, "model.safetensors.xz"), weights)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "reference.safetensors")
        save_file({k: v.contiguous() for k, v in tensors.items()}, p)
        write_xz(os.path.join(dst, "reference.safetensors.xz"), open(p, "rb").read())
    with open(os.path.join(dst, "reference.json"), "w") as f:
        json.dump({"greedy_from": "ids0", "greedy": toks, "greedy_nocache_agrees": agrees,
                   "notes": "made by tools/make-reference.py with transformers %s, torch %s: logits "
                            "computed in float32 on CPU from the bf16 weights in model.safetensors"
                            % (transformers.__version__, torch.__version__.split("+")[0])},
                  f, indent=1)
        f.write("\n")
    print("%s: %s, %d layers, ids1 %d tokens, greedy %d distinct, margin %.2g" % (name,
          ref.config.model_type, ref.config.num_hidden_layers, len(ids1), len(set(toks)), margin))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if transformers.__version__ != TRANSFORMERS_VERSION:
        sys.exit("make-reference: transformers %s is needed (found %s)"
                 % (TRANSFORMERS_VERSION, transformers.__version__))
    torch.set_num_threads(1)  # one summation order, whatever the machine
    names = sys.argv[2:] or list(FIXTURES)
    for n in names:
        make(n, FIXTURES[n], sys.argv[1])


if __name__ == "__main__":
    main()
