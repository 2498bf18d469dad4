/*
 * qwen_config.c - config.json -> struct toast_hparams for the Qwen3 family and Llama.
 *
 * Accepts both config styles seen in the wild: transformers 5 (rope_parameters, layer_types)
 * and released checkpoints (top-level rope_theta / partial_rotary_factor,
 * full_attention_interval, torch_dtype), and Qwen3.5's multimodal wrapper (text_config).
 * Every value is range-checked: a config is outside input.
 */
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/model.h"
#include "util/mem.h"

#define CFG_MAX_DIM (1 << 20)

struct cfg {
	json_t *root;
	struct toast_error *err;
	enum toast_status rc;
};

static json_t *cfg_get(struct cfg *c, const char *key)
{
	json_t *v = json_object_get(c->root, key);
	return json_is_null(v) ? NULL : v;
}

/* An integer key in [lo, hi]; def when absent and def >= lo, else an error. */
static int cfg_int(struct cfg *c, const char *key, int def, int lo, int hi)
{
	if (c->rc != TOAST_OK)
		return 0;
	json_t *v = cfg_get(c, key);
	if (!v) {
		if (def >= lo)
			return def;
		c->rc = toast_err_set(c->err, TOAST_ERR_FORMAT, "config.json: missing key \"%s\"", key);
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
		c->rc = toast_err_set(c->err, TOAST_ERR_FORMAT, "config.json: \"%s\" must be an integer in [%d, %d]",
				      key, lo, hi);
		return 0;
	}
	return (int)json_integer_value(v);
}

static double cfg_num(struct cfg *c, json_t *obj, const char *key, double def, bool *found)
{
	json_t *v = json_object_get(obj, key);
	if (found)
		*found = v && !json_is_null(v);
	if (!v || json_is_null(v))
		return def;
	if (!json_is_number(v)) {
		if (c->rc == TOAST_OK)
			c->rc = toast_err_set(c->err, TOAST_ERR_FORMAT, "config.json: \"%s\" must be a number", key);
		return def;
	}
	return json_number_value(v);
}

static bool cfg_bool(struct cfg *c, const char *key, bool def)
{
	json_t *v = cfg_get(c, key);
	if (!v)
		return def;
	if (!json_is_boolean(v)) {
		if (c->rc == TOAST_OK)
			c->rc = toast_err_set(c->err, TOAST_ERR_FORMAT, "config.json: \"%s\" must be true or false", key);
		return def;
	}
	return json_is_true(v);
}

/* token ids outside the vocabulary are ignored: the model can never produce them */
static bool cfg_token_ok(json_t *v, int n_vocab)
{
	return json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < n_vocab;
}

static void cfg_token_ids(struct cfg *c, const char *key, struct toast_hparams *hp)
{
	json_t *v = cfg_get(c, key);
	if (cfg_token_ok(v, hp->n_vocab) && hp->n_eos < TOAST_MAX_EOS) {
		hp->eos[hp->n_eos++] = (int32_t)json_integer_value(v);
	} else if (json_is_array(v)) {
		size_t i;
		json_t *e;
		json_array_foreach(v, i, e) if (cfg_token_ok(e, hp->n_vocab) && hp->n_eos < TOAST_MAX_EOS) hp->eos[hp->n_eos++] =
			(int32_t)json_integer_value(e);
	}
}

/* Defaults for keys a config.json leaves out are the reference's (transformers 5.17 config
 * classes): a different default would silently compute another model. */
static const struct {
	const char *name;
	enum toast_arch arch;
	int head_dim;        /* 0: hidden_size / num_attention_heads */
	int n_head_kv;
	double rot_fraction; /* partial_rotary_factor */
} cfg_archs[] = {
	{"qwen3", TOAST_ARCH_QWEN3, 128, 32, 1.0},
	{"qwen3_moe", TOAST_ARCH_QWEN3_MOE, 0, 4, 1.0},
	{"qwen3_next", TOAST_ARCH_QWEN3_NEXT, 256, 2, 0.25},
	{"qwen3_5_text", TOAST_ARCH_QWEN35, 256, 4, 0.25},
	{"qwen3_5_moe_text", TOAST_ARCH_QWEN35_MOE, 256, 2, 0.25},
	{"llama", TOAST_ARCH_LLAMA, 0, 0, 1.0},
};

static enum toast_status cfg_rope(struct cfg *c, struct toast_hparams *hp, double rot_fraction)
{
	json_t *rp = cfg_get(c, "rope_parameters");
	json_t *rs = cfg_get(c, "rope_scaling");
	if (rp && !json_is_object(rp))
		return toast_err_set(c->err, TOAST_ERR_FORMAT, "config.json: rope_parameters must be an object");
	bool found = false;
	double theta = rp ? cfg_num(c, rp, "rope_theta", 0, &found) : 0;
	if (!found)
		theta = cfg_num(c, c->root, "rope_theta", 10000.0, NULL);
	double prf = rp ? cfg_num(c, rp, "partial_rotary_factor", 0, &found) : 0;
	if (!found)
		prf = cfg_num(c, c->root, "partial_rotary_factor", rot_fraction, NULL);
	json_t *scaling = rp ? rp : rs;
	if (json_is_object(scaling)) {
		json_t *t = json_object_get(scaling, "rope_type");
		if (!t)
			t = json_object_get(scaling, "type");
		if (json_is_string(t) && strcmp(json_string_value(t), "default") != 0)
			return toast_err_set(c->err, TOAST_ERR_UNSUPPORTED,
					     "config.json: rope type \"%s\" is not supported (only default RoPE)",
					     json_string_value(t));
	}
	if (c->rc != TOAST_OK)
		return c->rc;
	if (!(theta > 0) || theta > FLT_MAX)
		return toast_err_set(c->err, TOAST_ERR_FORMAT, "config.json: rope_theta %g must be positive and fit a float",
				     theta);
	if (!(prf > 0) || prf > 1)
		return toast_err_set(c->err, TOAST_ERR_FORMAT, "config.json: partial_rotary_factor %g must be in (0, 1]", prf);
	hp->rope_theta = (float)theta;
	/* the reference runs a checkpoint in its own dtype, RoPE frequencies included */
	json_t *dt = cfg_get(c, "dtype");
	if (!dt)
		dt = cfg_get(c, "torch_dtype");
	const char *dts = json_string_value(dt);
	hp->rope_freq_type = !dts ? TOAST_DT_F32
			     : strcmp(dts, "bfloat16") == 0 ? TOAST_DT_BF16
			     : strcmp(dts, "float16") == 0 ? TOAST_DT_F16
							   : TOAST_DT_F32;
	hp->n_rot = (int)(hp->head_dim * prf);
	if (hp->n_rot % 2 || hp->n_rot < 2)
		return toast_err_set(c->err, TOAST_ERR_FORMAT, "config.json: rotary dims %d (head_dim %d x %g) must be even",
				     hp->n_rot, hp->head_dim, prf);
	return TOAST_OK;
}

static enum toast_status cfg_layers(struct cfg *c, struct toast_hparams *hp)
{
	int L = hp->n_layer;
	hp->layer_is_attn = calloc((size_t)L, sizeof(bool));
	hp->layer_is_moe = calloc((size_t)L, sizeof(bool));
	if (!hp->layer_is_attn || !hp->layer_is_moe)
		return toast_err_set(c->err, TOAST_ERR_NOMEM, "out of memory");
	bool hybrid = hp->arch == TOAST_ARCH_QWEN3_NEXT || hp->arch == TOAST_ARCH_QWEN35 || hp->arch == TOAST_ARCH_QWEN35_MOE;
	json_t *lt = cfg_get(c, "layer_types");
	if (lt) {
		if (!json_is_array(lt) || json_array_size(lt) != (size_t)L)
			return toast_err_set(c->err, TOAST_ERR_FORMAT,
					     "config.json: layer_types must list num_hidden_layers (%d) layer types", L);
		for (int il = 0; il < L; il++) {
			const char *s = json_string_value(json_array_get(lt, (size_t)il));
			if (!s)
				return toast_err_set(c->err, TOAST_ERR_FORMAT, "config.json: layer_types[%d] is not a string", il);
			if (strcmp(s, "full_attention") == 0)
				hp->layer_is_attn[il] = true;
			else if (strcmp(s, "linear_attention") == 0 && hybrid)
				hp->layer_is_attn[il] = false;
			else
				return toast_err_set(c->err, TOAST_ERR_UNSUPPORTED,
						     "config.json: layer_types[%d] \"%s\" is not supported", il, s);
		}
	} else {
		int interval = hybrid ? cfg_int(c, "full_attention_interval", 4, 1, CFG_MAX_DIM) : 1;
		if (c->rc != TOAST_OK)
			return c->rc;
		for (int il = 0; il < L; il++)
			hp->layer_is_attn[il] = (il + 1) % interval == 0;
	}
	/* MoE layers: all of them for qwen3.5-moe; qwen3_moe/next follow decoder_sparse_step and
	 * mlp_only_layers like the reference */
	if (hp->arch == TOAST_ARCH_QWEN35_MOE) {
		for (int il = 0; il < L; il++)
			hp->layer_is_moe[il] = true;
	} else if (hp->arch == TOAST_ARCH_QWEN3_MOE || hp->arch == TOAST_ARCH_QWEN3_NEXT) {
		int step = cfg_int(c, "decoder_sparse_step", 1, 1, CFG_MAX_DIM);
		if (c->rc != TOAST_OK)
			return c->rc;
		for (int il = 0; il < L; il++)
			hp->layer_is_moe[il] = hp->n_expert > 0 && (il + 1) % step == 0;
		json_t *only = cfg_get(c, "mlp_only_layers");
		size_t i;
		json_t *e;
		if (only && !json_is_array(only))
			return toast_err_set(c->err, TOAST_ERR_FORMAT, "config.json: mlp_only_layers must be a list");
		json_array_foreach(only, i, e)
		{
			if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= L)
				return toast_err_set(c->err, TOAST_ERR_FORMAT, "config.json: bad mlp_only_layers entry");
			hp->layer_is_moe[json_integer_value(e)] = false;
		}
	}
	return c->rc;
}

/* Variants the reference computes and the engine does not: refuse them rather than compute
 * another model. */
static void cfg_unsupported(struct cfg *c, const struct toast_hparams *hp)
{
	enum toast_arch A = hp->arch;
	json_t *act = cfg_get(c, "hidden_act");
	if (c->rc == TOAST_OK && act && !(json_is_string(act) && strcmp(json_string_value(act), "silu") == 0))
		c->rc = toast_err_set(c->err, TOAST_ERR_UNSUPPORTED, "config.json: hidden_act \"%s\" is not supported (silu)",
				      json_is_string(act) ? json_string_value(act) : "?");
	if (c->rc == TOAST_OK && cfg_bool(c, "attention_bias", false))
		c->rc = toast_err_set(c->err, TOAST_ERR_UNSUPPORTED, "config.json: attention_bias is not supported");
	/* sliding windows: every layer of qwen3_moe, layers from max_window_layers on of qwen3
	 * (unless layer_types says otherwise, which cfg_layers checks) */
	bool sliding = (A == TOAST_ARCH_QWEN3 || A == TOAST_ARCH_QWEN3_MOE) && cfg_bool(c, "use_sliding_window", false) &&
		       cfg_get(c, "sliding_window");
	if (sliding && A == TOAST_ARCH_QWEN3)
		sliding = !cfg_get(c, "layer_types") && cfg_int(c, "max_window_layers", 28, 0, 1 << 20) < hp->n_layer;
	if (c->rc == TOAST_OK && sliding)
		c->rc = toast_err_set(c->err, TOAST_ERR_UNSUPPORTED, "config.json: sliding-window attention is not supported");
}

void toast_hparams_free(struct toast_hparams *hp)
{
	if (!hp)
		return;
	free(hp->layer_is_attn);
	free(hp->layer_is_moe);
	hp->layer_is_attn = hp->layer_is_moe = NULL;
}

enum toast_status toast_hparams_parse(struct toast_hparams *hp, const char *json_text, struct toast_error *err)
{
	memset(hp, 0, sizeof(*hp));
	json_error_t je;
	json_t *doc = json_loads(json_text, 0, &je);
	if (!doc)
		return toast_err_set(err, TOAST_ERR_FORMAT, "config.json: not valid JSON (line %d: %s)", je.line, je.text);
	if (!json_is_object(doc)) {
		json_decref(doc);
		return toast_err_set(err, TOAST_ERR_FORMAT, "config.json: not a JSON object");
	}
	struct cfg c = {doc, err, TOAST_OK};
	json_t *jmt = json_object_get(doc, "model_type");
	const char *mt = json_string_value(jmt);
	if (jmt && !mt) {
		json_decref(doc);
		return toast_err_set(err, TOAST_ERR_FORMAT, "config.json: \"model_type\" must be a string");
	}
	json_t *tc = json_object_get(doc, "text_config");
	if (mt && (strcmp(mt, "qwen3_5") == 0 || strcmp(mt, "qwen3_5_moe") == 0) && json_is_object(tc)) {
		c.root = tc; /* the multimodal wrapper: the text decoder's config is nested */
		const char *tmt = json_string_value(json_object_get(tc, "model_type"));
		mt = tmt ? tmt : (strcmp(mt, "qwen3_5") == 0 ? "qwen3_5_text" : "qwen3_5_moe_text");
	}
	size_t ai = 0, n_archs = sizeof(cfg_archs) / sizeof(cfg_archs[0]);
	while (mt && ai < n_archs && strcmp(mt, cfg_archs[ai].name) != 0)
		ai++;
	if (!mt || ai == n_archs) {
		enum toast_status rc = toast_err_set(err, mt ? TOAST_ERR_UNSUPPORTED : TOAST_ERR_FORMAT,
						     mt ? "config.json: model_type \"%s\" is not supported (qwen3, qwen3_moe, "
							  "qwen3_next, qwen3_5_text, qwen3_5_moe_text, llama)"
							: "config.json: missing key \"model_type\"%s",
						     mt ? mt : "");
		json_decref(doc);
		return rc;
	}
	hp->arch = cfg_archs[ai].arch;
	hp->arch_name = cfg_archs[ai].name;
	enum toast_arch A = hp->arch;
	bool hybrid = A == TOAST_ARCH_QWEN3_NEXT || A == TOAST_ARCH_QWEN35 || A == TOAST_ARCH_QWEN35_MOE;
	bool moe = A == TOAST_ARCH_QWEN3_MOE || A == TOAST_ARCH_QWEN3_NEXT || A == TOAST_ARCH_QWEN35_MOE;
	hp->n_vocab = cfg_int(&c, "vocab_size", -1, 1, 1 << 24);
	hp->n_embd = cfg_int(&c, "hidden_size", -1, 1, CFG_MAX_DIM);
	hp->n_layer = cfg_int(&c, "num_hidden_layers", -1, 1, 4096);
	hp->n_head = cfg_int(&c, "num_attention_heads", -1, 1, 4096);
	hp->n_head_kv = cfg_int(&c, "num_key_value_heads", cfg_archs[ai].n_head_kv, 1, 4096);
	int hd = cfg_archs[ai].head_dim ? cfg_archs[ai].head_dim : hp->n_head ? hp->n_embd / hp->n_head : 0;
	hp->head_dim = cfg_int(&c, "head_dim", hd, 1, 65536);
	hp->n_ctx_train = cfg_int(&c, "max_position_embeddings", 32768, 1, 1 << 26);
	hp->norm_eps = (float)cfg_num(&c, c.root, "rms_norm_eps", 1e-6, NULL);
	hp->tie_embd = cfg_bool(&c, "tie_word_embeddings", false);
	hp->norm_plus_one = hybrid;
	cfg_unsupported(&c, hp);
	if (A == TOAST_ARCH_LLAMA && c.rc == TOAST_OK &&
	    (cfg_bool(&c, "attention_bias", false) || cfg_bool(&c, "mlp_bias", false)))
		c.rc = toast_err_set(err, TOAST_ERR_UNSUPPORTED, "config.json: attention_bias / mlp_bias are not supported");
	hp->attn_gated = hybrid && cfg_bool(&c, "attn_output_gate", true);
	/* intermediate_size is used by dense layers only (checked when a dense layer is bound) */
	hp->n_ff = cfg_int(&c, "intermediate_size", moe ? 0 : -1, moe ? 0 : 1, CFG_MAX_DIM);
	if (moe) {
		/* qwen3_moe and qwen3_next with 0 experts are all dense, like the reference */
		const char *ne_key = cfg_get(&c, "num_local_experts") && !cfg_get(&c, "num_experts") ? "num_local_experts"
												: "num_experts";
		int ne = cfg_int(&c, ne_key, -1, A == TOAST_ARCH_QWEN35_MOE ? 1 : 0, 1 << 16);
		hp->n_expert = ne;
		hp->n_expert_used = ne > 0 ? cfg_int(&c, "num_experts_per_tok", -1, 1, ne) : 0;
		hp->n_ff_exp = ne > 0 ? cfg_int(&c, "moe_intermediate_size", -1, 1, CFG_MAX_DIM) : 0;
		hp->n_ff_shexp = A == TOAST_ARCH_QWEN3_MOE ? 0 : cfg_int(&c, "shared_expert_intermediate_size", 0, 0, CFG_MAX_DIM);
		hp->norm_topk = A == TOAST_ARCH_QWEN35_MOE ? true : cfg_bool(&c, "norm_topk_prob", A == TOAST_ARCH_QWEN3_NEXT);
	}
	if (hybrid) {
		hp->ssm_n_k_head = cfg_int(&c, "linear_num_key_heads", -1, 1, 4096);
		hp->ssm_n_v_head = cfg_int(&c, "linear_num_value_heads", -1, 1, 4096);
		hp->ssm_d_k = cfg_int(&c, "linear_key_head_dim", -1, 1, 4096);
		hp->ssm_d_v = cfg_int(&c, "linear_value_head_dim", -1, 1, 4096);
		hp->ssm_conv_k = cfg_int(&c, "linear_conv_kernel_dim", 4, 2, 64);
	}
	hp->bos = -1;
	json_t *bos = cfg_get(&c, "bos_token_id");
	if (cfg_token_ok(bos, hp->n_vocab))
		hp->bos = (int32_t)json_integer_value(bos);
	cfg_token_ids(&c, "eos_token_id", hp);
	enum toast_status rc = c.rc;
	if (rc == TOAST_OK && hp->n_head % hp->n_head_kv)
		rc = toast_err_set(err, TOAST_ERR_FORMAT,
				   "config.json: num_attention_heads %d is not a multiple of num_key_value_heads %d", hp->n_head,
				   hp->n_head_kv);
	if (rc == TOAST_OK && !(hp->norm_eps > 0 && hp->norm_eps < 1))
		rc = toast_err_set(err, TOAST_ERR_FORMAT, "config.json: rms_norm_eps must be in (0, 1)");
	if (rc == TOAST_OK && hybrid && hp->ssm_n_v_head % hp->ssm_n_k_head)
		rc = toast_err_set(err, TOAST_ERR_FORMAT,
				   "config.json: linear_num_value_heads %d not a multiple of linear_num_key_heads %d",
				   hp->ssm_n_v_head, hp->ssm_n_k_head);
	if (rc == TOAST_OK)
		rc = cfg_rope(&c, hp, cfg_archs[ai].rot_fraction);
	if (rc == TOAST_OK)
		rc = cfg_layers(&c, hp);
	json_decref(doc);
	if (rc != TOAST_OK)
		toast_hparams_free(hp);
	return rc;
}
