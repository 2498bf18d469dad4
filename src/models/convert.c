/*
 * convert.c - a Hugging Face model directory -> one GGUF v3 file, as llama.cpp's
 * convert_hf_to_gguf.py + llama-quantize would write it: llama.cpp's architecture names, metadata
 * keys, tensor names and transforms (see gguf_model.c, which undoes them), the tokenizer and chat
 * template, and the quantisation mix of toast_quant_pick().
 *
 * One output tensor is produced at a time (f32, transformed, then quantised), so memory stays at
 * about one tensor whatever the model's size.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/quant.h"
#include "format/safetensors.h"
#include "models/convert.h"
#include "models/gguf_names.h"
#include "models/quantize.h"
#include "util/fs.h"
#include "util/half.h"
#include "util/mem.h"

#define CV_MAX_JSON (64u << 20)

enum cv_kind {
	CV_PLAIN,      /* one source tensor, maybe transformed */
	CV_STACK,      /* per-expert tensors stacked [E][rows][cols] */
	CV_SPLIT_GATE, /* first half of a fused experts.gate_up_proj */
	CV_SPLIT_UP,   /* second half */
	CV_QKVZ_QKV,   /* Qwen3-Next in_proj_qkvz regrouped: flat [q | k | v] */
	CV_QKVZ_Z,     /* ... and z */
};

struct cv_item {
	char gguf[160], hf[256];
	enum cv_kind kind;
	const struct toast_tensor *src;
	int layer;
	char proj[16]; /* CV_STACK: gate_proj, up_proj or down_proj */
	int n_dims;
	int64_t shape[4]; /* outermost first */
	enum toast_dtype type;
};

struct cv {
	const char *dir;
	struct toast_hparams hp;
	struct toast_tensordir td;
	json_t *config;
	const char *prefix; /* "model." or "model.language_model." */
	enum toast_quant_mix mix;
	struct cv_item *items;
	int n_items, cap_items;
	struct toast_error *err;
};

static int64_t cv_numel(const struct cv_item *it)
{
	int64_t n = 1;
	for (int i = 0; i < it->n_dims; i++)
		n *= it->shape[i];
	return n;
}

static void cv_src_f32(const struct toast_tensor *t, int64_t off, int64_t n, float *dst)
{
	for (int64_t i = 0; i < n; i++) {
		int64_t k = off + i;
		dst[i] = t->dtype == TOAST_DT_F32 ? ((const float *)t->data)[k]
			 : t->dtype == TOAST_DT_BF16 ? toast_bf16_to_f32(((const uint16_t *)t->data)[k])
						     : toast_f16_to_f32(((const uint16_t *)t->data)[k]);
	}
}

static bool cv_ends(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a >= b && strcmp(s + a - b, suffix) == 0;
}

static bool cv_hybrid(enum toast_arch a)
{
	return a == TOAST_ARCH_QWEN3_NEXT || a == TOAST_ARCH_QWEN35 || a == TOAST_ARCH_QWEN35_MOE;
}

/* ---- planning: which tensors, with which names, shapes and types ---- */

static struct cv_item *cv_add(struct cv *c, enum cv_kind kind, const char *hf, const struct toast_tensor *src,
			      int n_dims, const int64_t *shape)
{
	if (c->n_items == c->cap_items) {
		int cap = c->cap_items ? 2 * c->cap_items : 256;
		struct cv_item *n = realloc(c->items, (size_t)cap * sizeof(*n));
		if (!n)
			return NULL;
		c->items = n;
		c->cap_items = cap;
	}
	struct cv_item *it = &c->items[c->n_items++];
	memset(it, 0, sizeof(*it));
	it->kind = kind;
	it->src = src;
	snprintf(it->hf, sizeof(it->hf), "%s", hf);
	const char *lp = strstr(hf, "layers.");
	it->layer = lp ? atoi(lp + 7) : -1;
	it->n_dims = n_dims;
	memcpy(it->shape, shape, (size_t)n_dims * sizeof(int64_t));
	return it;
}

/* name, output type; false (error set) when the arch has no GGUF name for it */
static bool cv_finish_item(struct cv *c, struct cv_item *it)
{
	if (!toast_gguf_name_from_hf(c->hp.arch, it->hf, it->gguf, sizeof(it->gguf))) {
		toast_err_set(c->err, TOAST_ERR_UNSUPPORTED, "%s: tensor %s has no GGUF name for architecture %s", c->dir,
			      it->hf, toast_gguf_arch_name(c->hp.arch));
		return false;
	}
	int big = 0;
	for (int i = 0; i < it->n_dims; i++)
		big += it->shape[i] > 1;
	enum toast_dtype src = it->src ? it->src->dtype : TOAST_DT_BF16;
	if (big <= 1 || strstr(it->hf, "conv1d"))
		it->type = TOAST_DT_F32; /* vectors, the conv kernel: f32 as llama.cpp keeps them */
	else
		it->type = toast_quant_pick(c->mix, it->hf, c->hp.tie_embd, c->hp.n_layer, it->shape[it->n_dims - 1], src);
	return true;
}

static enum toast_status cv_plan(struct cv *c)
{
	const struct toast_hparams *hp = &c->hp;
	size_t pl = strlen(c->prefix);
	int nk = hp->ssm_n_k_head, nv = hp->ssm_n_v_head, dk = hp->ssm_d_k, dv = hp->ssm_d_v;
	for (int i = 0; i < c->td.n_tensors; i++) {
		const struct toast_tensor *t = &c->td.tensors[i];
		char hf[256];
		if (strncmp(t->name, "mtp.", 4) == 0 || strstr(t->name, ".visual.") || strncmp(t->name, "model.visual", 12) == 0)
			continue; /* the MTP head and vision tower are not part of the text decoder */
		if (strncmp(t->name, c->prefix, pl) == 0)
			snprintf(hf, sizeof(hf), "model.%s", t->name + pl);
		else
			snprintf(hf, sizeof(hf), "%s", t->name);
		if (strcmp(hf, "lm_head.weight") == 0 && hp->tie_embd)
			continue;
		if (t->dtype != TOAST_DT_F32 && t->dtype != TOAST_DT_F16 && t->dtype != TOAST_DT_BF16)
			return toast_err_set(c->err, TOAST_ERR_UNSUPPORTED, "%s: tensor %s is %s (convert reads F32, F16, BF16)",
					     c->dir, t->name, t->dtype_name);
		int il = -1, e = -1;
		char proj[16] = "";
		struct cv_item *it = NULL;
		if (sscanf(hf, "model.layers.%d.mlp.experts.%d.%15[a-z_].weight", &il, &e, proj) == 3) {
			if (e != 0)
				continue; /* stacked when expert 0 is seen */
			snprintf(hf, sizeof(hf), "model.layers.%d.mlp.experts.%s", il, proj);
			int64_t shape[3] = {hp->n_expert, t->shape[0], t->shape[1]};
			it = cv_add(c, CV_STACK, hf, t, 3, shape);
			if (it)
				snprintf(it->proj, sizeof(it->proj), "%s", proj);
		} else if (cv_ends(hf, "mlp.experts.gate_up_proj")) {
			int64_t shape[3] = {t->shape[0], t->shape[1] / 2, t->shape[2]};
			char h2[256];
			int keep = (int)(strlen(hf) - strlen("gate_up_proj"));
			snprintf(h2, sizeof(h2), "%.*sgate_proj", keep, hf);
			if ((it = cv_add(c, CV_SPLIT_GATE, h2, t, 3, shape)) && !cv_finish_item(c, it))
				return c->err ? c->err->code : TOAST_ERR_UNSUPPORTED;
			snprintf(h2, sizeof(h2), "%.*sup_proj", keep, hf);
			it = cv_add(c, CV_SPLIT_UP, h2, t, 3, shape);
		} else if (cv_ends(hf, "linear_attn.in_proj_qkvz.weight")) {
			int64_t sq[2] = {2 * nk * dk + nv * dv, hp->n_embd}, sz[2] = {nv * dv, hp->n_embd};
			char h2[256];
			int keep = (int)(strlen(hf) - strlen("in_proj_qkvz.weight"));
			snprintf(h2, sizeof(h2), "%.*sin_proj_qkv.weight", keep, hf);
			if ((it = cv_add(c, CV_QKVZ_QKV, h2, t, 2, sq)) && !cv_finish_item(c, it))
				return c->err ? c->err->code : TOAST_ERR_UNSUPPORTED;
			snprintf(h2, sizeof(h2), "%.*sin_proj_z.weight", keep, hf);
			it = cv_add(c, CV_QKVZ_Z, h2, t, 2, sz);
		} else {
			int64_t shape[4];
			int nd = 0;
			for (int d = 0; d < t->n_dims && nd < 4; d++)
				if (!(strstr(hf, "conv1d") && t->shape[d] == 1)) /* conv1d [C,1,K] -> [C,K] */
					shape[nd++] = t->shape[d];
			if (nd == 0 || t->n_dims > 4)
				return toast_err_set(c->err, TOAST_ERR_UNSUPPORTED, "%s: tensor %s: %d dimensions", c->dir,
						     t->name, t->n_dims);
			it = cv_add(c, CV_PLAIN, hf, t, nd, shape);
		}
		if (!it)
			return toast_err_set(c->err, TOAST_ERR_NOMEM, "out of memory");
		if (!cv_finish_item(c, it))
			return c->err ? c->err->code : TOAST_ERR_UNSUPPORTED;
	}
	return TOAST_OK;
}

/* ---- producing one tensor's values ---- */

/* rows [r][cols] reordered: out row r = in row perm(r) */
static void cv_permute_rows(float *x, int64_t rows, int64_t cols, int64_t (*perm)(int64_t, const int *),
			    const int *a, float *tmp)
{
	memcpy(tmp, x, (size_t)(rows * cols) * sizeof(float));
	for (int64_t r = 0; r < rows; r++)
		memcpy(x + r * cols, tmp + perm(r, a) * cols, (size_t)cols * sizeof(float));
}

/* llama.cpp's llama q/k permutation: GGUF row h*hd + 2i + j holds HF row h*hd + j*hd/2 + i;
 * a = {head_dim} */
static int64_t cv_perm_rope(int64_t r, const int *a)
{
	int64_t hd = a[0], h = r / hd, w = r % hd, i = w / 2, j = w % 2;
	return h * hd + j * (hd / 2) + i;
}

/* qwen35 value heads grouped -> tiled: new head p = j*nk + g holds old head g*r + j;
 * a = {nk, r, head_dim} */
static int64_t cv_perm_tiled(int64_t x, const int *a)
{
	int64_t nk = a[0], rr = a[1], hd = a[2], p = x / hd, i = x % hd;
	return ((p % nk) * rr + p / nk) * hd + i;
}

static enum toast_status cv_fill(struct cv *c, const struct cv_item *it, float *out, float *tmp)
{
	const struct toast_hparams *hp = &c->hp;
	const struct toast_tensor *t = it->src;
	int64_t n = cv_numel(it), cols = it->shape[it->n_dims - 1], rows = n / cols;
	int nk = hp->ssm_n_k_head, nv = hp->ssm_n_v_head, dk = hp->ssm_d_k, dv = hp->ssm_d_v;
	switch (it->kind) {
	case CV_STACK: {
		int64_t per = n / hp->n_expert;
		for (int e = 0; e < hp->n_expert; e++) {
			char name[256];
			snprintf(name, sizeof(name), "%slayers.%d.mlp.experts.%d.%s.weight", c->prefix, it->layer, e, it->proj);
			const struct toast_tensor *x = toast_tensordir_find(&c->td, name);
			if (!x || x->n_elems != per || x->dtype != t->dtype)
				return toast_err_set(c->err, TOAST_ERR_FORMAT, "%s: expert tensor %s missing or unlike expert 0",
						     c->dir, name);
			cv_src_f32(x, 0, per, out + (size_t)e * per);
		}
		return TOAST_OK;
	}
	case CV_SPLIT_GATE:
	case CV_SPLIT_UP: {
		int64_t per = it->shape[1] * it->shape[2];
		for (int64_t e = 0; e < it->shape[0]; e++)
			cv_src_f32(t, e * 2 * per + (it->kind == CV_SPLIT_UP ? per : 0), per, out + e * per);
		return TOAST_OK;
	}
	case CV_QKVZ_QKV:
	case CV_QKVZ_Z: {
		/* source group g: [q_g (dk) | k_g (dk) | v of r heads (r*dv) | z of r heads (r*dv)] rows */
		int64_t r = nv / nk, grp = 2 * dk + 2 * r * dv, E = cols, o = 0;
		for (int part = it->kind == CV_QKVZ_QKV ? 0 : 3; part < (it->kind == CV_QKVZ_QKV ? 3 : 4); part++)
			for (int64_t g = 0; g < nk; g++) {
				int64_t off = part == 0 ? 0 : part == 1 ? dk : part == 2 ? 2 * dk : 2 * dk + r * dv;
				int64_t len = part < 2 ? dk : r * dv;
				cv_src_f32(t, (g * grp + off) * E, len * E, out + o * E);
				o += len;
			}
		return TOAST_OK;
	}
	case CV_PLAIN: break;
	}
	cv_src_f32(t, 0, n, out);
	const char *hf = it->hf;
	if (cv_hybrid(hp->arch) && cv_ends(hf, "norm.weight") && !cv_ends(hf, "linear_attn.norm.weight"))
		for (int64_t i = 0; i < n; i++)
			out[i] += 1.0f; /* llama.cpp bakes the zero-centred RMSNorm's +1 in */
	if (cv_ends(hf, "linear_attn.A_log"))
		for (int64_t i = 0; i < n; i++)
			out[i] = -expf(out[i]);
	if (hp->arch == TOAST_ARCH_LLAMA && (cv_ends(hf, "q_proj.weight") || cv_ends(hf, "k_proj.weight"))) {
		int a[1] = {hp->head_dim};
		cv_permute_rows(out, rows, cols, cv_perm_rope, a, tmp);
	}
	bool tile = (hp->arch == TOAST_ARCH_QWEN35 || hp->arch == TOAST_ARCH_QWEN35_MOE) && nk != nv &&
		    strstr(hf, "linear_attn.");
	if (tile) {
		int r = nv / nk, av[3] = {nk, r, dv}, a1[3] = {nk, r, 1};
		int64_t vrow0 = 2 * (int64_t)nk * dk;
		if (cv_ends(hf, "in_proj_qkv.weight") || strstr(hf, "conv1d"))
			cv_permute_rows(out + vrow0 * cols, rows - vrow0, cols, cv_perm_tiled, av, tmp);
		else if (cv_ends(hf, "in_proj_z.weight"))
			cv_permute_rows(out, rows, cols, cv_perm_tiled, av, tmp);
		else if (cv_ends(hf, "in_proj_a.weight") || cv_ends(hf, "in_proj_b.weight") || cv_ends(hf, "A_log") ||
			 cv_ends(hf, "dt_bias"))
			cv_permute_rows(out, it->n_dims == 1 ? n : rows, it->n_dims == 1 ? 1 : cols, cv_perm_tiled, a1, tmp);
		else if (cv_ends(hf, "out_proj.weight")) /* columns: permute each row */
			for (int64_t rr = 0; rr < rows; rr++)
				cv_permute_rows(out + rr * cols, cols, 1, cv_perm_tiled, av, tmp);
	}
	return TOAST_OK;
}

/* ---- metadata ---- */

static void cv_put_arch(struct cv *c, struct toast_gguf_writer *w)
{
	const struct toast_hparams *hp = &c->hp;
	const char *A = toast_gguf_arch_name(hp->arch);
	char k[160];
#define KEY(s) (snprintf(k, sizeof(k), "%s." s, A), k)
	toast_gguf_put_u32(w, KEY("context_length"), (uint32_t)hp->n_ctx_train);
	toast_gguf_put_u32(w, KEY("embedding_length"), (uint32_t)hp->n_embd);
	toast_gguf_put_u32(w, KEY("block_count"), (uint32_t)hp->n_layer);
	if (hp->n_ff > 0)
		toast_gguf_put_u32(w, KEY("feed_forward_length"), (uint32_t)hp->n_ff);
	toast_gguf_put_u32(w, KEY("attention.head_count"), (uint32_t)hp->n_head);
	toast_gguf_put_u32(w, KEY("attention.head_count_kv"), (uint32_t)hp->n_head_kv);
	toast_gguf_put_u32(w, KEY("attention.key_length"), (uint32_t)hp->head_dim);
	toast_gguf_put_u32(w, KEY("attention.value_length"), (uint32_t)hp->head_dim);
	toast_gguf_put_u32(w, KEY("rope.dimension_count"), (uint32_t)hp->n_rot);
	toast_gguf_put_f32(w, KEY("rope.freq_base"), hp->rope_theta);
	toast_gguf_put_f32(w, KEY("attention.layer_norm_rms_epsilon"), hp->norm_eps);
	toast_gguf_put_u32(w, KEY("vocab_size"), (uint32_t)hp->n_vocab);
	if (hp->n_expert > 0) {
		toast_gguf_put_u32(w, KEY("expert_count"), (uint32_t)hp->n_expert);
		toast_gguf_put_u32(w, KEY("expert_used_count"), (uint32_t)hp->n_expert_used);
		toast_gguf_put_u32(w, KEY("expert_feed_forward_length"), (uint32_t)hp->n_ff_exp);
		if (hp->n_ff_shexp > 0)
			toast_gguf_put_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)hp->n_ff_shexp);
		toast_gguf_put_bool(w, KEY("expert_weights_norm"), hp->norm_topk);
	}
	if (cv_hybrid(hp->arch)) {
		toast_gguf_put_u32(w, KEY("ssm.conv_kernel"), (uint32_t)hp->ssm_conv_k);
		toast_gguf_put_u32(w, KEY("ssm.state_size"), (uint32_t)hp->ssm_d_k);
		toast_gguf_put_u32(w, KEY("ssm.group_count"), (uint32_t)hp->ssm_n_k_head);
		toast_gguf_put_u32(w, KEY("ssm.time_step_rank"), (uint32_t)hp->ssm_n_v_head);
		toast_gguf_put_u32(w, KEY("ssm.inner_size"), (uint32_t)(hp->ssm_n_v_head * hp->ssm_d_v));
		int interval = 1;
		while (interval <= hp->n_layer && !hp->layer_is_attn[interval - 1])
			interval++;
		toast_gguf_put_u32(w, KEY("full_attention_interval"), (uint32_t)interval);
	}
	if (hp->arch == TOAST_ARCH_QWEN35 || hp->arch == TOAST_ARCH_QWEN35_MOE) {
		/* Qwen3.5's interleaved MRoPE sections (text-only input reduces it to plain partial RoPE;
		 * llama.cpp requires the key) */
		int32_t sec[4] = {11, 11, 10, 0};
		json_t *rp = json_object_get(c->config, "rope_parameters");
		json_t *ms = json_object_get(json_is_object(rp) ? rp : c->config, "mrope_section");
		for (size_t i = 0; json_is_array(ms) && i < 4; i++)
			sec[i] = i < json_array_size(ms) ? (int32_t)json_integer_value(json_array_get(ms, i)) : 0;
		toast_gguf_put_i32_arr(w, KEY("rope.dimension_sections"), sec, 4);
	}
#undef KEY
}

/* the layer pattern must be what full_attention_interval can say */
static enum toast_status cv_check_layers(struct cv *c)
{
	const struct toast_hparams *hp = &c->hp;
	if (!cv_hybrid(hp->arch))
		return TOAST_OK;
	int interval = 1;
	while (interval <= hp->n_layer && !hp->layer_is_attn[interval - 1])
		interval++;
	for (int il = 0; il < hp->n_layer; il++)
		if (hp->layer_is_attn[il] != ((il + 1) % interval == 0))
			return toast_err_set(c->err, TOAST_ERR_UNSUPPORTED,
					     "%s: attention layers are not every %d-th layer: GGUF cannot describe them", c->dir,
					     interval);
	return TOAST_OK;
}

enum toast_status toast_convert(const char *dir, const char *out_path, enum toast_quant_mix mix,
				struct toast_error *err)
{
	struct cv c = {.dir = dir, .mix = mix, .err = err, .prefix = "model."};
	struct toast_gguf_writer *w = NULL;
	char path[4096], *text = NULL;
	float *buf = NULL, *tmp = NULL;
	void *q = NULL;
	enum toast_status rc = TOAST_OK;
	if (mix == TOAST_MIX_NONE)
		return toast_err_set(err, TOAST_ERR_INVALID, "convert needs a type");
	if (!toast_path_join(path, sizeof(path), dir, "config.json"))
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: path too long", dir);
	rc = toast_read_file(path, CV_MAX_JSON, &text, NULL, err);
	if (rc == TOAST_OK)
		rc = toast_hparams_parse(&c.hp, text, err);
	if (rc == TOAST_OK) {
		c.config = json_loads(text, 0, NULL);
		json_t *tc = json_object_get(c.config, "text_config");
		if (json_is_object(tc)) { /* keep a reference to the nested decoder config */
			json_incref(tc);
			json_decref(c.config);
			c.config = tc;
		}
		rc = toast_st_open_dir(&c.td, dir, err);
	}
	free(text);
	if (rc != TOAST_OK)
		goto done;
	if (toast_tensordir_find(&c.td, "model.language_model.embed_tokens.weight"))
		c.prefix = "model.language_model.";
	if ((rc = cv_check_layers(&c)) != TOAST_OK || (rc = cv_plan(&c)) != TOAST_OK)
		goto done;
	if ((rc = toast_gguf_writer_new(out_path, &w, err)) != TOAST_OK)
		goto done;
	toast_gguf_put_str(w, "general.architecture", toast_gguf_arch_name(c.hp.arch),
			   strlen(toast_gguf_arch_name(c.hp.arch)));
	toast_gguf_put_str(w, "general.type", "model", 5);
	const char *base = strrchr(dir, '/');
	base = base && base[1] ? base + 1 : dir;
	toast_gguf_put_str(w, "general.name", base, strlen(base));
	toast_gguf_put_u32(w, "general.file_type", (uint32_t)toast_quant_mix_ftype(mix));
	toast_gguf_put_u32(w, "general.quantization_version", 2);
	const char *fd = toast_dtype_name(c.hp.rope_freq_type);
	toast_gguf_put_str(w, "toasted.rope.freq_dtype", fd, strlen(fd));
	cv_put_arch(&c, w);
	if ((rc = toast_convert_tokenizer(w, dir, &c.hp, err)) != TOAST_OK)
		goto done;
	int64_t biggest = 1;
	size_t biggest_q = 1;
	for (int i = 0; i < c.n_items; i++) {
		struct cv_item *it = &c.items[i];
		size_t nb;
		toast_gguf_add_tensor(w, it->gguf, it->type, it->n_dims, it->shape);
		if (!toast_dtype_bytes(it->type, cv_numel(it), &nb)) {
			rc = toast_err_set(err, TOAST_ERR_INVALID, "%s: tensor %s: bad size", dir, it->gguf);
			goto done;
		}
		biggest = cv_numel(it) > biggest ? cv_numel(it) : biggest;
		biggest_q = nb > biggest_q ? nb : biggest_q;
	}
	buf = malloc((size_t)biggest * sizeof(float));
	tmp = malloc((size_t)biggest * sizeof(float));
	q = malloc(biggest_q);
	if (!buf || !tmp || !q) {
		rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory for a tensor of %lld elements", (long long)biggest);
		goto done;
	}
	if ((rc = toast_gguf_writer_begin(w, err)) != TOAST_OK)
		goto done;
	for (int i = 0; i < c.n_items && rc == TOAST_OK; i++) {
		struct cv_item *it = &c.items[i];
		size_t nb;
		toast_dtype_bytes(it->type, cv_numel(it), &nb);
		rc = cv_fill(&c, it, buf, tmp);
		if (rc == TOAST_OK) {
			toast_quant(it->type, buf, q, cv_numel(it));
			rc = toast_gguf_write_tensor(w, q, nb, err);
		}
	}
	if (rc == TOAST_OK)
		rc = toast_gguf_writer_finish(w, err);
done:
	toast_gguf_writer_free(w);
	free(buf);
	free(tmp);
	free(q);
	free(c.items);
	json_decref(c.config);
	toast_tensordir_close(&c.td);
	toast_hparams_free(&c.hp);
	return rc;
}
