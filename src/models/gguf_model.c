/*
 * gguf_model.c - a GGUF file as a model: hyper-parameters from its metadata, and its tensors
 * under the Hugging Face names the binder asks for, for the llama.cpp architectures qwen3,
 * qwen3moe, qwen3next, qwen35, qwen35moe and llama.
 *
 * llama.cpp's converter transforms some tensors; each transform is either undone here or
 * expressed as an hparams flag the forward pass honours (see toast_hparams):
 *   - hybrid archs: RMSNorm weights with +1 baked in (norm_plus_one false), A_log stored as
 *     ssm_a = -exp(A_log) (a_is_neg_exp), conv1d squeezed to [C][K] (the binder ignores size-1
 *     dims), Qwen3-Next's in_proj_qkvz regrouped into flat attn_qkv + attn_gate (the binder's flat
 *     path), experts stacked [E][rows][cols] (bind_experts' stacked path);
 *   - qwen35/qwen35moe with n_k_head != n_v_head: value heads reordered from grouped to tiled
 *     (v_heads_tiled: value head h reads key head h % n_k_head);
 *   - llama: attn_q/attn_k rows permuted for ggml's interleaved RoPE: undone here (rows copied
 *     back into Hugging Face order, an owned buffer), since the attention op is NeoX-style.
 * The name table is shared with the converter (convert.c), which applies the same transforms.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/gguf_names.h"
#include "models/model.h"
#include "util/mem.h"

#define GM_MAX_DIM (1 << 20)

static const struct {
	const char *name;
	enum toast_arch arch;
} gm_archs[] = {
	{"qwen3", TOAST_ARCH_QWEN3},     {"qwen3moe", TOAST_ARCH_QWEN3_MOE}, {"qwen3next", TOAST_ARCH_QWEN3_NEXT},
	{"qwen35", TOAST_ARCH_QWEN35},   {"qwen35moe", TOAST_ARCH_QWEN35_MOE}, {"llama", TOAST_ARCH_LLAMA},
};

const char *toast_gguf_arch_name(enum toast_arch a)
{
	for (size_t i = 0; i < sizeof(gm_archs) / sizeof(gm_archs[0]); i++)
		if (gm_archs[i].arch == a)
			return gm_archs[i].name;
	return NULL;
}

#define A_ALL 0x3f
#define A_BIT(a) (1u << (a))
#define A_HYBRID (A_BIT(TOAST_ARCH_QWEN3_NEXT) | A_BIT(TOAST_ARCH_QWEN35) | A_BIT(TOAST_ARCH_QWEN35_MOE))

/* Hugging Face name <-> GGUF name; layer entries are suffixes after "model.layers.N." / "blk.N." */
static const struct {
	bool layer;
	const char *hf, *gguf;
	unsigned archs;
} gm_names[] = {
	{false, "model.embed_tokens.weight", "token_embd.weight", A_ALL},
	{false, "model.norm.weight", "output_norm.weight", A_ALL},
	{false, "lm_head.weight", "output.weight", A_ALL},
	{true, "input_layernorm.weight", "attn_norm.weight", A_ALL},
	{true, "post_attention_layernorm.weight", "ffn_norm.weight", A_ALL & ~A_HYBRID},
	{true, "post_attention_layernorm.weight", "post_attention_norm.weight", A_HYBRID},
	{true, "self_attn.q_proj.weight", "attn_q.weight", A_ALL},
	{true, "self_attn.k_proj.weight", "attn_k.weight", A_ALL},
	{true, "self_attn.v_proj.weight", "attn_v.weight", A_ALL},
	{true, "self_attn.o_proj.weight", "attn_output.weight", A_ALL},
	{true, "self_attn.q_norm.weight", "attn_q_norm.weight", A_ALL},
	{true, "self_attn.k_norm.weight", "attn_k_norm.weight", A_ALL},
	{true, "mlp.gate_proj.weight", "ffn_gate.weight", A_ALL},
	{true, "mlp.up_proj.weight", "ffn_up.weight", A_ALL},
	{true, "mlp.down_proj.weight", "ffn_down.weight", A_ALL},
	{true, "mlp.gate.weight", "ffn_gate_inp.weight", A_ALL},
	{true, "mlp.experts.gate_proj", "ffn_gate_exps.weight", A_ALL},
	{true, "mlp.experts.up_proj", "ffn_up_exps.weight", A_ALL},
	{true, "mlp.experts.down_proj", "ffn_down_exps.weight", A_ALL},
	{true, "mlp.experts.gate_up_proj", "ffn_gate_up_exps.weight", A_ALL},
	{true, "mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight", A_ALL},
	{true, "mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight", A_ALL},
	{true, "mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight", A_ALL},
	{true, "mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight", A_ALL},
	{true, "linear_attn.in_proj_qkvz.weight", "ssm_in.weight", A_HYBRID},
	{true, "linear_attn.in_proj_qkv.weight", "attn_qkv.weight", A_HYBRID},
	{true, "linear_attn.in_proj_z.weight", "attn_gate.weight", A_HYBRID},
	{true, "linear_attn.in_proj_ba.weight", "ssm_ba.weight", A_HYBRID},
	{true, "linear_attn.in_proj_b.weight", "ssm_beta.weight", A_HYBRID},
	{true, "linear_attn.in_proj_a.weight", "ssm_alpha.weight", A_HYBRID},
	{true, "linear_attn.conv1d.weight", "ssm_conv1d.weight", A_HYBRID},
	{true, "linear_attn.A_log", "ssm_a", A_HYBRID},
	{true, "linear_attn.dt_bias", "ssm_dt.bias", A_HYBRID},
	{true, "linear_attn.norm.weight", "ssm_norm.weight", A_HYBRID},
	{true, "linear_attn.out_proj.weight", "ssm_out.weight", A_HYBRID},
};

/* map `name` from one naming to the other (to_gguf: HF -> GGUF); false when it has no mapping */
static bool gm_map(enum toast_arch arch, const char *name, bool to_gguf, char *out, size_t cap)
{
	const char *lp = to_gguf ? "model.layers." : "blk.";
	int il = -1, n = 0;
	const char *rest = name;
	if (strncmp(name, lp, strlen(lp)) == 0 && sscanf(name + strlen(lp), "%d.%n", &il, &n) == 1 && n > 0 && il >= 0)
		rest = name + strlen(lp) + n;
	for (size_t i = 0; i < sizeof(gm_names) / sizeof(gm_names[0]); i++) {
		if (!(gm_names[i].archs & A_BIT(arch)) || gm_names[i].layer != (il >= 0))
			continue;
		const char *from = to_gguf ? gm_names[i].hf : gm_names[i].gguf, *to = to_gguf ? gm_names[i].gguf : gm_names[i].hf;
		if (strcmp(rest, from) != 0)
			continue;
		int w = il >= 0 ? snprintf(out, cap, "%s%d.%s", to_gguf ? "blk." : "model.layers.", il, to)
				: snprintf(out, cap, "%s", to);
		return w > 0 && (size_t)w < cap;
	}
	return false;
}

bool toast_gguf_name_from_hf(enum toast_arch arch, const char *hf, char *out, size_t cap)
{
	return gm_map(arch, hf, true, out, cap);
}

/* ---- hyper-parameters ---- */

struct gm {
	const struct toast_gguf *g;
	const char *arch;
	struct toast_error *err;
	enum toast_status rc;
};

static int gm_int(struct gm *c, const char *key, bool required, int def, int lo, int hi)
{
	char k[160];
	int64_t v = def;
	snprintf(k, sizeof(k), "%s.%s", c->arch, key);
	if (c->rc == TOAST_OK)
		c->rc = toast_gguf_get_int(c->g, k, required, def, lo, hi, &v, c->err);
	return (int)v;
}

static float gm_f32(struct gm *c, const char *key, float def)
{
	char k[160];
	float v = def;
	snprintf(k, sizeof(k), "%s.%s", c->arch, key);
	if (c->rc == TOAST_OK)
		c->rc = toast_gguf_get_f32(c->g, k, false, def, &v, c->err);
	return v;
}

static void gm_token_id(struct gm *c, const char *key, int32_t *out, int n_vocab)
{
	int64_t v = -1;
	if (c->rc == TOAST_OK)
		c->rc = toast_gguf_get_int(c->g, key, false, -1, -1, n_vocab - 1, &v, c->err);
	*out = (int32_t)v;
}

static enum toast_status gm_rope(struct gm *c, struct toast_hparams *hp)
{
	char k[160];
	const char *s;
	size_t n;
	snprintf(k, sizeof(k), "%s.rope.scaling.type", c->arch);
	enum toast_status rc = toast_gguf_get_str(c->g, k, false, &s, &n, c->err);
	if (rc != TOAST_OK)
		return rc;
	if (s && !(n == 4 && memcmp(s, "none", 4) == 0))
		return toast_err_set(c->err, TOAST_ERR_UNSUPPORTED, "%s: RoPE scaling \"%.*s\" is not supported (only none)",
				     c->g->path, (int)(n < 64 ? n : 64), s);
	if (toast_gguf_find_tensor(c->g, "rope_freqs.weight"))
		return toast_err_set(c->err, TOAST_ERR_UNSUPPORTED,
				     "%s: rope_freqs.weight (per-dimension RoPE scaling, Llama 3 style) is not supported",
				     c->g->path);
	hp->rope_theta = gm_f32(c, "rope.freq_base", 10000.0f);
	hp->n_rot = gm_int(c, "rope.dimension_count", false, hp->head_dim, 2, hp->head_dim);
	/* files we write record the checkpoint dtype the reference rounded RoPE frequencies to */
	rc = toast_gguf_get_str(c->g, "toasted.rope.freq_dtype", false, &s, &n, c->err);
	hp->rope_freq_type = TOAST_DT_F32;
	if (rc == TOAST_OK && s && n == 4 && memcmp(s, "BF16", 4) == 0)
		hp->rope_freq_type = TOAST_DT_BF16;
	else if (rc == TOAST_OK && s && n == 3 && memcmp(s, "F16", 3) == 0)
		hp->rope_freq_type = TOAST_DT_F16;
	if (rc == TOAST_OK && c->rc == TOAST_OK && (!(hp->rope_theta > 0) || !isfinite(hp->rope_theta) || hp->n_rot % 2))
		rc = toast_err_set(c->err, TOAST_ERR_FORMAT, "%s: bad rope.freq_base or rope.dimension_count", c->g->path);
	return rc != TOAST_OK ? rc : c->rc;
}

enum toast_status toast_hparams_from_gguf(struct toast_hparams *hp, const struct toast_gguf *g, struct toast_error *err)
{
	memset(hp, 0, sizeof(*hp));
	const char *an;
	size_t anl;
	enum toast_status rc = toast_gguf_get_str(g, "general.architecture", true, &an, &anl, err);
	if (rc != TOAST_OK)
		return rc;
	bool known = false;
	for (size_t i = 0; i < sizeof(gm_archs) / sizeof(gm_archs[0]); i++)
		if (strlen(gm_archs[i].name) == anl && memcmp(gm_archs[i].name, an, anl) == 0) {
			hp->arch = gm_archs[i].arch;
			hp->arch_name = gm_archs[i].name;
			known = true;
		}
	if (!known)
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED,
				     "%s: architecture \"%.*s\" is not supported (qwen3, qwen3moe, qwen3next, qwen35, "
				     "qwen35moe, llama)",
				     g->path, (int)(anl < 64 ? anl : 64), an);
	struct gm c = {g, hp->arch_name, err, TOAST_OK};
	enum toast_arch A = hp->arch;
	bool hybrid = A == TOAST_ARCH_QWEN3_NEXT || A == TOAST_ARCH_QWEN35 || A == TOAST_ARCH_QWEN35_MOE;
	bool moe = A == TOAST_ARCH_QWEN3_MOE || A == TOAST_ARCH_QWEN3_NEXT || A == TOAST_ARCH_QWEN35_MOE;
	const struct toast_gguf_tensor *emb = toast_gguf_find_tensor(g, "token_embd.weight");
	hp->n_embd = gm_int(&c, "embedding_length", true, 0, 1, GM_MAX_DIM);
	hp->n_vocab = gm_int(&c, "vocab_size", false, emb ? (int)emb->ne[1] : 0, 1, 1 << 24);
	int n_block = gm_int(&c, "block_count", true, 0, 1, 4096);
	int n_nextn = gm_int(&c, "nextn_predict_layers", false, 0, 0, n_block - 1);
	hp->n_layer = n_block - n_nextn; /* MTP blocks come last and are not run */
	hp->n_ctx_train = gm_int(&c, "context_length", false, 4096, 1, 1 << 26);
	hp->n_head = gm_int(&c, "attention.head_count", true, 0, 1, 4096);
	hp->n_head_kv = gm_int(&c, "attention.head_count_kv", false, hp->n_head, 1, 4096);
	hp->head_dim = gm_int(&c, "attention.key_length", false, hp->n_head ? hp->n_embd / hp->n_head : 0, 1, 65536);
	int vlen = gm_int(&c, "attention.value_length", false, hp->head_dim, 1, 65536);
	hp->norm_eps = gm_f32(&c, "attention.layer_norm_rms_epsilon", 1e-6f);
	hp->n_ff = gm_int(&c, "feed_forward_length", !moe, 0, 0, GM_MAX_DIM);
	if (A == TOAST_ARCH_LLAMA && c.rc == TOAST_OK &&
	    (toast_gguf_find(g, "llama.expert_count") || toast_gguf_find_tensor(g, "blk.0.ffn_gate_inp.weight")))
		c.rc = toast_err_set(err, TOAST_ERR_UNSUPPORTED, "%s: llama with experts (Mixtral style) is not supported",
				     g->path);
	if (moe) {
		hp->n_expert = gm_int(&c, "expert_count", true, 0, 1, 1 << 16);
		hp->n_expert_used = gm_int(&c, "expert_used_count", true, 0, 1, hp->n_expert > 0 ? hp->n_expert : 1);
		hp->n_ff_exp = gm_int(&c, "expert_feed_forward_length", true, 0, 1, GM_MAX_DIM);
		hp->n_ff_shexp = gm_int(&c, "expert_shared_feed_forward_length", false, 0, 0, GM_MAX_DIM);
		char k[160];
		snprintf(k, sizeof(k), "%s.expert_weights_norm", c.arch);
		if (c.rc == TOAST_OK) /* llama.cpp renormalises the top-k weights of these archs unless told */
			c.rc = toast_gguf_get_bool(g, k, false, true, &hp->norm_topk, err);
		if (A == TOAST_ARCH_QWEN35_MOE)
			hp->norm_topk = true;
	}
	int interval = 1;
	if (hybrid) {
		hp->ssm_conv_k = gm_int(&c, "ssm.conv_kernel", true, 0, 2, 64);
		hp->ssm_d_k = gm_int(&c, "ssm.state_size", true, 0, 1, 4096);
		hp->ssm_n_k_head = gm_int(&c, "ssm.group_count", true, 0, 1, 4096);
		hp->ssm_n_v_head = gm_int(&c, "ssm.time_step_rank", true, 0, 1, 4096);
		int inner = gm_int(&c, "ssm.inner_size", true, 0, 1, GM_MAX_DIM);
		hp->ssm_d_v = hp->ssm_n_v_head ? inner / hp->ssm_n_v_head : 0;
		interval = gm_int(&c, "full_attention_interval", false, 4, 1, 4096);
		if (c.rc == TOAST_OK && (inner % hp->ssm_n_v_head || hp->ssm_n_v_head % hp->ssm_n_k_head))
			c.rc = toast_err_set(err, TOAST_ERR_FORMAT,
					     "%s: ssm.inner_size %d / time_step_rank %d / group_count %d do not divide", g->path,
					     inner, hp->ssm_n_v_head, hp->ssm_n_k_head);
		hp->norm_plus_one = false; /* the converter baked +1 into the weights */
		hp->a_is_neg_exp = true;
		hp->attn_gated = true;
		hp->v_heads_tiled = A != TOAST_ARCH_QWEN3_NEXT && hp->ssm_n_k_head != hp->ssm_n_v_head;
	}
	rc = c.rc;
	if (rc == TOAST_OK && (vlen != hp->head_dim || hp->n_head % hp->n_head_kv || !(hp->norm_eps > 0)))
		rc = toast_err_set(err, TOAST_ERR_FORMAT,
				   "%s: head_count %d / head_count_kv %d / key_length %d / value_length %d / eps inconsistent",
				   g->path, hp->n_head, hp->n_head_kv, hp->head_dim, vlen);
	if (rc == TOAST_OK)
		rc = gm_rope(&c, hp);
	if (rc == TOAST_OK) {
		hp->tie_embd = !toast_gguf_find_tensor(g, "output.weight");
		hp->bos = -1;
		int32_t id;
		gm_token_id(&c, "tokenizer.ggml.bos_token_id", &hp->bos, hp->n_vocab);
		const char *eos_keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
					  "tokenizer.ggml.eom_token_id"};
		for (int i = 0; i < 3; i++) {
			gm_token_id(&c, eos_keys[i], &id, hp->n_vocab);
			bool dup = false;
			for (int j = 0; j < hp->n_eos; j++)
				dup = dup || hp->eos[j] == id;
			if (id >= 0 && !dup)
				hp->eos[hp->n_eos++] = id;
		}
		rc = c.rc;
	}
	if (rc == TOAST_OK) {
		hp->layer_is_attn = calloc((size_t)hp->n_layer, sizeof(bool));
		hp->layer_is_moe = calloc((size_t)hp->n_layer, sizeof(bool));
		if (!hp->layer_is_attn || !hp->layer_is_moe)
			rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	}
	for (int il = 0; rc == TOAST_OK && il < hp->n_layer; il++) {
		char name[64];
		hp->layer_is_attn[il] = (il + 1) % interval == 0;
		snprintf(name, sizeof(name), "blk.%d.ffn_gate_inp.weight", il);
		hp->layer_is_moe[il] = moe && toast_gguf_find_tensor(g, name);
	}
	if (rc != TOAST_OK)
		toast_hparams_free(hp);
	return rc;
}

/* ---- tensor directory ---- */

/* llama: HF row h*hd + j*hd/2 + i was written to GGUF row h*hd + 2i + j; copy the rows back */
static enum toast_status gm_unpermute(struct toast_tensordir *td, struct toast_tensor *t, int n_head,
				      struct toast_error *err)
{
	int64_t rows = t->shape[0];
	if (t->n_dims != 2 || rows % n_head || (rows / n_head) % 2)
		return toast_err_set(err, TOAST_ERR_FORMAT, "tensor %s: %lld rows do not split into %d heads", t->name,
				     (long long)rows, n_head);
	size_t rb = t->n_bytes / (size_t)rows;
	int64_t hd = rows / n_head;
	uint8_t *buf = malloc(t->n_bytes ? t->n_bytes : 1);
	if (!buf || !toast_tensordir_own(td, buf))
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	for (int64_t r = 0; r < rows; r++) {
		int64_t h = r / hd, w = r % hd, j = w / (hd / 2), i = w % (hd / 2);
		memcpy(buf + (size_t)r * rb, (const uint8_t *)t->data + (size_t)(h * hd + 2 * i + j) * rb, rb);
	}
	t->data = buf;
	return TOAST_OK;
}

enum toast_status toast_gguf_tensordir(const struct toast_gguf *g, const struct toast_hparams *hp,
				       struct toast_tensordir *td, struct toast_error *err)
{
	memset(td, 0, sizeof(*td));
	size_t name_bytes = 0;
	char buf[512];
	for (int i = 0; i < g->n_tensors; i++)
		name_bytes += (gm_map(hp->arch, g->tensors[i].name, false, buf, sizeof(buf)) ? strlen(buf)
											      : strlen(g->tensors[i].name)) + 1;
	td->tensors = calloc((size_t)g->n_tensors + 1, sizeof(*td->tensors));
	td->names = malloc(name_bytes + 1);
	if (!td->tensors || !td->names) {
		toast_tensordir_close(td);
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory for %d tensors", g->n_tensors);
	}
	char *pos = td->names;
	enum toast_status rc = TOAST_OK;
	for (int i = 0; i < g->n_tensors && rc == TOAST_OK; i++) {
		const struct toast_gguf_tensor *gt = &g->tensors[i];
		struct toast_tensor *t = &td->tensors[td->n_tensors++];
		bool mapped = gm_map(hp->arch, gt->name, false, buf, sizeof(buf));
		const char *name = mapped ? buf : gt->name;
		int il = -1;
		/* a tensor of a decoder layer that has no name here would be silently left out (an
		 * attention bias, say): refuse it; MTP blocks (il >= n_layer) are not run */
		if (!mapped && (sscanf(gt->name, "blk.%d.", &il) != 1 || il < hp->n_layer)) {
			rc = toast_err_set(err, TOAST_ERR_UNSUPPORTED, "%s: tensor %s (%s) is not supported", g->path, gt->name,
					   hp->arch_name);
			break;
		}
		strcpy(pos, name);
		t->name = pos;
		pos += strlen(name) + 1;
		t->dtype = gt->dtype;
		t->dtype_name = gt->type_name;
		t->n_dims = gt->n_dims;
		t->n_elems = 1;
		for (int d = 0; d < gt->n_dims; d++) {
			t->shape[d] = gt->ne[gt->n_dims - 1 - d];
			t->n_elems *= gt->ne[d];
		}
		t->data = gt->data;
		t->n_bytes = gt->n_bytes;
		if (hp->arch == TOAST_ARCH_LLAMA && strstr(name, ".self_attn.q_proj.weight"))
			rc = gm_unpermute(td, t, hp->n_head, err);
		else if (hp->arch == TOAST_ARCH_LLAMA && strstr(name, ".self_attn.k_proj.weight"))
			rc = gm_unpermute(td, t, hp->n_head_kv, err);
	}
	if (rc == TOAST_OK)
		rc = toast_tensordir_index(td, g->path, err);
	if (rc != TOAST_OK)
		toast_tensordir_close(td);
	return rc;
}
