/*
 * qwen.c - the Qwen3 family (and Llama) forward pass: weight binding from Hugging Face tensor
 * names, per-session state, and the layer loop as backend op calls.
 *
 * Weights are used in place (mmapped file data); nothing is regrouped: Qwen3-Next's grouped
 * in_proj_qkvz / in_proj_ba outputs are consumed as they are by the gdn op (backend.h). A GGUF
 * file presents the same names through gguf_model.c, its transforms as hparams flags.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/synth_quant.h"
#include "format/safetensors.h"
#include "models/gguf_names.h"
#include "models/model.h"
#include "models/quantize.h"
#include "util/fs.h"
#include "util/half.h"
#include "util/hash.h"
#include "util/mem.h"

#define CONFIG_MAX_BYTES (4u << 20)

struct binder {
	struct toast_model *m;
	const char *prefix; /* "model." or "model.language_model." */
	struct toast_error *err;
	enum toast_status rc;
};

static bool bind_dtype_ok(enum toast_dtype t)
{
	return t == TOAST_DT_F32 || t == TOAST_DT_F16 || t == TOAST_DT_BF16 ||
	       (toast_dtype_is_quant(t) && t != TOAST_DT_MLX4 && t != TOAST_DT_MLX8);
}

#define BIND_TYPES "F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K or MLX affine 4/8-bit"

/* The parts of an MLX affine weight (format/quant.h): NAME.weight uint32 [..][n_in*bits/32],
 * NAME.scales and NAME.biases [..][n_in/group_size] of one float type, outer dims equal. */
struct bind_mlx {
	const struct toast_tensor *s, *z;
	int bits, gs;
};

static bool bind_mlx_parts(struct binder *b, const struct toast_tensor *t, int64_t n_in, struct bind_mlx *x)
{
	char name[512];
	size_t l = strlen(t->name);
	if (l < 7 || l + 2 > sizeof(name) || strcmp(t->name + l - 7, ".weight") != 0) {
		b->rc = toast_err_set(b->err, TOAST_ERR_FORMAT, "tensor %s is U32 but not an MLX .weight", t->name);
		return false;
	}
	snprintf(name, sizeof(name), "%.*s.scales", (int)(l - 7), t->name);
	x->s = toast_tensordir_find(&b->m->td, name);
	snprintf(name, sizeof(name), "%.*s.biases", (int)(l - 7), t->name);
	x->z = toast_tensordir_find(&b->m->td, name);
	int64_t packed = t->shape[t->n_dims - 1], groups = x->s ? x->s->shape[x->s->n_dims - 1] : 0;
	x->bits = n_in > 0 ? (int)(packed * 32 / n_in) : 0;
	x->gs = groups > 0 ? (int)(n_in / groups) : 0;
	bool ok = x->s && x->z && (x->bits == 4 || x->bits == 8) && packed * 32 == (int64_t)x->bits * n_in &&
		  (x->gs == 32 || x->gs == 64 || x->gs == 128) && groups * x->gs == n_in && x->s->n_dims == t->n_dims &&
		  x->z->n_dims == t->n_dims && x->s->dtype == x->z->dtype &&
		  (x->s->dtype == TOAST_DT_BF16 || x->s->dtype == TOAST_DT_F16 || x->s->dtype == TOAST_DT_F32);
	for (int i = 0; ok && i + 1 < t->n_dims; i++)
		ok = x->s->shape[i] == t->shape[i] && x->z->shape[i] == t->shape[i];
	ok = ok && x->z->shape[t->n_dims - 1] == groups;
	if (!ok)
		b->rc = toast_err_set(b->err, TOAST_ERR_FORMAT,
				      "tensor %s: not an MLX affine 4/8-bit weight of rows of %lld (scales/biases missing, "
				      "or their shapes or types disagree)",
				      t->name, (long long)n_in);
	return ok;
}

static void bind_set_mlx(struct toast_weight *w, const struct bind_mlx *x, const void *scales, const void *biases,
			 size_t sb_bytes)
{
	w->type = x->bits == 4 ? TOAST_DT_MLX4 : TOAST_DT_MLX8;
	w->scales = scales;
	w->biases = biases;
	w->sb_type = x->s->dtype;
	w->group_size = x->gs;
	w->n_bytes += 2 * sb_bytes;
}

/* A synthetic weight of the model's type (see toast_model_load_synthetic) */
static void bind_synthetic(const struct toast_model *m, struct toast_weight *w, const char *name, int64_t n_out,
			   int64_t n_in)
{
	enum toast_dtype want = m->synth_mix == TOAST_MIX_NONE
					? m->synth_type
					: toast_quant_pick(m->synth_mix, name, m->hp.tie_embd, m->hp.n_layer, n_in, TOAST_DT_BF16);
	bool mlx = want == TOAST_DT_MLX4 || want == TOAST_DT_MLX8;
	enum toast_dtype t = n_out == 1 ? TOAST_DT_F32 : want;
	if (n_out > 1 && strstr(name, "mlp.gate.weight")) /* the router: as published checkpoints keep it */
		t = mlx ? TOAST_DT_MLX8 : TOAST_DT_BF16;
	if (n_in % (mlx ? TOAST_SYNTH_MLX_GROUP : toast_dtypes[t].blck)) /* rows not whole blocks (conv1d) */
		t = TOAST_DT_BF16;
	toast_synthetic_weight(w, name, t, n_out, n_in);
}

/* Bind the tensor `name` as n_out x n_in (a vector when n_out == 1; size-1 dims are ignored so
 * conv1d's [C, 1, K] binds as C x K). */
static void bind_as(struct binder *b, struct toast_weight *w, const char *name, int64_t n_out, int64_t n_in)
{
	if (b->rc != TOAST_OK)
		return;
	if (b->m->synthetic) {
		char **names = realloc(b->m->synth_names, (b->m->n_synth_names + 1) * sizeof(char *));
		char *nm = names ? toast_strdup(name) : NULL;
		if (names)
			b->m->synth_names = names;
		if (!nm) {
			b->rc = toast_err_set(b->err, TOAST_ERR_NOMEM, "out of memory");
			return;
		}
		b->m->synth_names[b->m->n_synth_names++] = nm;
		bind_synthetic(b->m, w, nm, n_out, n_in);
		b->m->weight_bytes += w->n_bytes;
		return;
	}
	const struct toast_tensor *t = toast_tensordir_find(&b->m->td, name);
	if (!t) {
		b->rc = toast_err_set(b->err, TOAST_ERR_FORMAT, "missing tensor %s", name);
		return;
	}
	int64_t dims[TOAST_MAX_DIMS];
	int nd = 0;
	for (int i = 0; i < t->n_dims; i++)
		if (t->shape[i] != 1)
			dims[nd++] = t->shape[i];
	struct bind_mlx mx = {0};
	int64_t n_in_stored = n_in;
	if (t->dtype == TOAST_DT_U32) {
		if (!bind_mlx_parts(b, t, n_in, &mx))
			return;
		n_in_stored = n_in * mx.bits / 32;
	}
	int64_t want[2] = {n_out, n_in_stored};
	int nw = 0;
	int64_t wdims[2];
	for (int i = 0; i < 2; i++)
		if (want[i] != 1)
			wdims[nw++] = want[i];
	bool ok = nd == nw;
	for (int i = 0; ok && i < nd; i++)
		ok = dims[i] == wdims[i];
	if (!ok) {
		char got[128] = "", *p = got;
		for (int i = 0; i < t->n_dims; i++)
			p += snprintf(p, (size_t)(got + sizeof(got) - p), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
		b->rc = toast_err_set(b->err, TOAST_ERR_FORMAT, "tensor %s has shape [%s], expected [%lld, %lld]", name, got,
				      (long long)n_out, (long long)n_in);
		return;
	}
	if (!mx.s && !bind_dtype_ok(t->dtype)) {
		b->rc = toast_err_set(b->err, TOAST_ERR_FORMAT, "tensor %s has type %s (toasted computes with "
				      BIND_TYPES ")", name, t->dtype_name);
		return;
	}
	*w = (struct toast_weight){.name = t->name, .type = t->dtype, .n_out = n_out, .n_in = n_in, .data = t->data,
				   .n_bytes = t->n_bytes};
	if (mx.s)
		bind_set_mlx(w, &mx, mx.s->data, mx.z->data, mx.s->n_bytes);
	b->m->weight_bytes += w->n_bytes;
}

static void bindf(struct binder *b, struct toast_weight *w, int64_t n_out, int64_t n_in, const char *fmt, ...)
	TOAST_PRINTF(5, 6);
static void bindf(struct binder *b, struct toast_weight *w, int64_t n_out, int64_t n_in, const char *fmt, ...)
{
	char name[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(name, sizeof(name), fmt, ap);
	va_end(ap);
	bind_as(b, w, name, n_out, n_in);
}

static bool has_tensor(struct binder *b, const char *fmt, int il, const char *rest)
{
	if (b->m->synthetic) /* what a real checkpoint of the architecture has */
		return strstr(rest, "in_proj_qkvz") || strstr(rest, "in_proj_ba") ? b->m->hp.arch == TOAST_ARCH_QWEN3_NEXT
										      : true;
	char name[512];
	snprintf(name, sizeof(name), fmt, b->prefix, il, rest);
	return toast_tensordir_find(&b->m->td, name) != NULL;
}

/* a stacked expert tensor [n_expert][rows][cols] (cols packed for MLX), with its MLX parts */
struct bind_stack {
	const struct toast_tensor *t;
	struct bind_mlx mx;
};

/* bind expert e of a stack as rows [row0, row0+rows) of its slice */
static void bind_stacked(struct toast_weight *w, const struct bind_stack *st, int e, int64_t row0, int64_t rows,
			 int64_t cols)
{
	const struct toast_tensor *t = st->t;
	size_t slice = t->n_bytes / (size_t)t->shape[0], rb = slice / (size_t)t->shape[1];
	*w = (struct toast_weight){.name = t->name, .type = t->dtype, .n_in = cols, .n_out = rows,
				   .data = (const char *)t->data + (size_t)e * slice + (size_t)row0 * rb,
				   .n_bytes = (size_t)rows * rb};
	if (st->mx.s) {
		size_t sslice = st->mx.s->n_bytes / (size_t)t->shape[0], srb = sslice / (size_t)t->shape[1];
		size_t off = (size_t)e * sslice + (size_t)row0 * srb;
		bind_set_mlx(w, &st->mx, (const char *)st->mx.s->data + off, (const char *)st->mx.z->data + off,
			     (size_t)rows * srb);
	}
}

/* experts.WHAT (Hugging Face fused or GGUF) or switch_mlp.WHAT.weight (MLX), or none */
static bool bind_stack(struct binder *b, int il, const char *what, int64_t rows, int64_t cols, struct bind_stack *st)
{
	char name[512];
	memset(st, 0, sizeof(*st));
	snprintf(name, sizeof(name), "%slayers.%d.mlp.experts.%s", b->prefix, il, what);
	st->t = toast_tensordir_find(&b->m->td, name);
	if (!st->t) {
		snprintf(name, sizeof(name), "%slayers.%d.mlp.switch_mlp.%s.weight", b->prefix, il, what);
		st->t = toast_tensordir_find(&b->m->td, name);
	}
	if (!st->t || b->rc != TOAST_OK)
		return st->t != NULL;
	int ne = b->m->hp.n_expert;
	int64_t cols_stored = cols;
	if (st->t->dtype == TOAST_DT_U32 && st->t->n_dims == 3) {
		if (!bind_mlx_parts(b, st->t, cols, &st->mx))
			return true;
		cols_stored = cols * st->mx.bits / 32;
	}
	const struct toast_tensor *t = st->t;
	if (t->n_dims != 3 || t->shape[0] != ne || t->shape[1] != rows || t->shape[2] != cols_stored ||
	    (!st->mx.s && !bind_dtype_ok(t->dtype)))
		b->rc = toast_err_set(b->err, TOAST_ERR_FORMAT, "tensor %s: expected [%d, %lld, %lld] of " BIND_TYPES, name,
				      ne, (long long)rows, (long long)cols);
	else
		b->m->weight_bytes += t->n_bytes + (st->mx.s ? st->mx.s->n_bytes + st->mx.z->n_bytes : 0);
	return true;
}

/* experts: per-expert tensors (experts.E.gate_proj.weight), or stacked ones [E][rows][cols]:
 * fused experts.gate_up_proj [E][2*n_ff][n_embd] (gate rows first) or experts.gate_proj and
 * experts.up_proj [E][n_ff][n_embd], with experts.down_proj [E][n_embd][n_ff] */
static void bind_experts(struct binder *b, struct toast_layer *l, int il)
{
	const struct toast_hparams *hp = &b->m->hp;
	int ne = hp->n_expert, E = hp->n_embd, F = hp->n_ff_exp;
	struct toast_experts *xs[3] = {&l->gate_exps, &l->up_exps, &l->down_exps};
	for (int i = 0; i < 3; i++) {
		xs[i]->n_expert = ne;
		xs[i]->w = calloc((size_t)ne, sizeof(struct toast_weight));
		if (!xs[i]->w && b->rc == TOAST_OK)
			b->rc = toast_err_set(b->err, TOAST_ERR_NOMEM, "out of memory");
	}
	if (b->rc != TOAST_OK)
		return;
	struct bind_stack gu, g = {0}, u = {0}, dn;
	bool fused = bind_stack(b, il, "gate_up_proj", 2 * F, E, &gu), have_g = false, have_u = false;
	if (!fused) {
		have_g = bind_stack(b, il, "gate_proj", F, E, &g);
		have_u = bind_stack(b, il, "up_proj", F, E, &u);
	}
	if (!fused && !have_g && !have_u) {
		for (int e = 0; e < ne && b->rc == TOAST_OK; e++) {
			bindf(b, &l->gate_exps.w[e], F, E, "%slayers.%d.mlp.experts.%d.gate_proj.weight", b->prefix, il, e);
			bindf(b, &l->up_exps.w[e], F, E, "%slayers.%d.mlp.experts.%d.up_proj.weight", b->prefix, il, e);
			bindf(b, &l->down_exps.w[e], E, F, "%slayers.%d.mlp.experts.%d.down_proj.weight", b->prefix, il, e);
		}
		return;
	}
	bool have_d = bind_stack(b, il, "down_proj", E, F, &dn);
	if (b->rc == TOAST_OK && (!have_d || (!fused && (!have_g || !have_u))))
		b->rc = toast_err_set(b->err, TOAST_ERR_FORMAT, "layer %d: stacked expert tensors are incomplete", il);
	for (int e = 0; e < ne && b->rc == TOAST_OK; e++) {
		bind_stacked(&l->gate_exps.w[e], fused ? &gu : &g, e, 0, F, E);
		bind_stacked(&l->up_exps.w[e], fused ? &gu : &u, e, fused ? F : 0, F, E);
		bind_stacked(&l->down_exps.w[e], &dn, e, 0, E, F);
	}
}

static void bind_layer(struct binder *b, int il)
{
	struct toast_model *m = b->m;
	const struct toast_hparams *hp = &m->hp;
	struct toast_layer *l = &m->layers[il];
	const char *P = b->prefix;
	int E = hp->n_embd;
	l->is_attn = hp->layer_is_attn[il];
	l->is_moe = hp->layer_is_moe[il];
	bindf(b, &l->attn_norm, 1, E, "%slayers.%d.input_layernorm.weight", P, il);
	bindf(b, &l->ffn_norm, 1, E, "%slayers.%d.post_attention_layernorm.weight", P, il);
	if (l->is_attn) {
		int hd = hp->head_dim, qd = hp->n_head * hd * (hp->attn_gated ? 2 : 1);
		bindf(b, &l->wq, qd, E, "%slayers.%d.self_attn.q_proj.weight", P, il);
		bindf(b, &l->wk, hp->n_head_kv * hd, E, "%slayers.%d.self_attn.k_proj.weight", P, il);
		bindf(b, &l->wv, hp->n_head_kv * hd, E, "%slayers.%d.self_attn.v_proj.weight", P, il);
		bindf(b, &l->wo, E, hp->n_head * hd, "%slayers.%d.self_attn.o_proj.weight", P, il);
		l->has_qk_norm = has_tensor(b, "%slayers.%d.%s", il, "self_attn.q_norm.weight");
		if (l->has_qk_norm) {
			bindf(b, &l->q_norm, 1, hd, "%slayers.%d.self_attn.q_norm.weight", P, il);
			bindf(b, &l->k_norm, 1, hd, "%slayers.%d.self_attn.k_norm.weight", P, il);
		}
	} else {
		int nk = hp->ssm_n_k_head, nv = hp->ssm_n_v_head, dk = hp->ssm_d_k, dv = hp->ssm_d_v;
		int conv_dim = 2 * nk * dk + nv * dv;
		l->qkvz_grouped = has_tensor(b, "%slayers.%d.%s", il, "linear_attn.in_proj_qkvz.weight");
		l->ba_grouped = has_tensor(b, "%slayers.%d.%s", il, "linear_attn.in_proj_ba.weight");
		if (l->qkvz_grouped) {
			bindf(b, &l->ssm_qkv, conv_dim + nv * dv, E, "%slayers.%d.linear_attn.in_proj_qkvz.weight", P, il);
		} else {
			bindf(b, &l->ssm_qkv, conv_dim, E, "%slayers.%d.linear_attn.in_proj_qkv.weight", P, il);
			bindf(b, &l->ssm_z, nv * dv, E, "%slayers.%d.linear_attn.in_proj_z.weight", P, il);
		}
		if (l->ba_grouped) {
			bindf(b, &l->ssm_b, 2 * nv, E, "%slayers.%d.linear_attn.in_proj_ba.weight", P, il);
		} else {
			bindf(b, &l->ssm_b, nv, E, "%slayers.%d.linear_attn.in_proj_b.weight", P, il);
			bindf(b, &l->ssm_a, nv, E, "%slayers.%d.linear_attn.in_proj_a.weight", P, il);
		}
		bindf(b, &l->ssm_conv, conv_dim, hp->ssm_conv_k, "%slayers.%d.linear_attn.conv1d.weight", P, il);
		bindf(b, &l->ssm_A, 1, nv, "%slayers.%d.linear_attn.A_log", P, il);
		bindf(b, &l->ssm_dt, 1, nv, "%slayers.%d.linear_attn.dt_bias", P, il);
		bindf(b, &l->ssm_norm, 1, dv, "%slayers.%d.linear_attn.norm.weight", P, il);
		bindf(b, &l->ssm_out, E, nv * dv, "%slayers.%d.linear_attn.out_proj.weight", P, il);
	}
	if (l->is_moe) {
		bindf(b, &l->router, hp->n_expert, E, "%slayers.%d.mlp.gate.weight", P, il);
		bind_experts(b, l, il);
		l->has_shexp = hp->n_ff_shexp > 0;
		if (l->has_shexp) {
			int F = hp->n_ff_shexp;
			bindf(b, &l->sh_gate, F, E, "%slayers.%d.mlp.shared_expert.gate_proj.weight", P, il);
			bindf(b, &l->sh_up, F, E, "%slayers.%d.mlp.shared_expert.up_proj.weight", P, il);
			bindf(b, &l->sh_down, E, F, "%slayers.%d.mlp.shared_expert.down_proj.weight", P, il);
			l->has_sh_gate_inp = has_tensor(b, "%slayers.%d.%s", il, "mlp.shared_expert_gate.weight");
			if (l->has_sh_gate_inp)
				bindf(b, &l->sh_gate_inp, 1, E, "%slayers.%d.mlp.shared_expert_gate.weight", P, il);
		}
	} else {
		if (hp->n_ff <= 0 && b->rc == TOAST_OK) {
			b->rc = toast_err_set(b->err, TOAST_ERR_FORMAT, "config.json: layer %d is dense but intermediate_size is missing", il);
			return;
		}
		bindf(b, &l->ffn_gate, hp->n_ff, E, "%slayers.%d.mlp.gate_proj.weight", P, il);
		bindf(b, &l->ffn_up, hp->n_ff, E, "%slayers.%d.mlp.up_proj.weight", P, il);
		bindf(b, &l->ffn_down, E, hp->n_ff, "%slayers.%d.mlp.down_proj.weight", P, il);
	}
}

int toast_layer_weights(struct toast_layer *l, struct toast_weight *ws[TOAST_LAYER_MAX_WEIGHTS])
{
	struct toast_weight *all[] = {&l->attn_norm, &l->ffn_norm, &l->wq, &l->wk, &l->wv, &l->wo, &l->q_norm,
				      &l->k_norm, &l->ssm_qkv, &l->ssm_z, &l->ssm_b, &l->ssm_a, &l->ssm_conv,
				      &l->ssm_A, &l->ssm_dt, &l->ssm_norm, &l->ssm_out, &l->ffn_gate, &l->ffn_up,
				      &l->ffn_down, &l->router, &l->sh_gate, &l->sh_up, &l->sh_down, &l->sh_gate_inp};
	_Static_assert(sizeof(all) / sizeof(all[0]) == TOAST_LAYER_MAX_WEIGHTS, "layer weight list");
	int n = 0;
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		if (all[i]->n_out > 0) /* bound (synthetic weights have no data until prepared) */
			ws[n++] = all[i];
	return n;
}

static size_t weight_decode_bytes(struct toast_model *m)
{
	const struct toast_hparams *hp = &m->hp;
	size_t n = (m->output_tied ? m->tok_embd.n_bytes : m->output.n_bytes) + m->output_norm.n_bytes;
	for (int il = 0; il < hp->n_layer; il++) {
		struct toast_layer *l = &m->layers[il];
		struct toast_weight *ws[TOAST_LAYER_MAX_WEIGHTS];
		int nw = toast_layer_weights(l, ws);
		for (int i = 0; i < nw; i++)
			n += ws[i]->n_bytes;
		if (l->is_moe)
			n += (size_t)hp->n_expert_used * (l->gate_exps.w[0].n_bytes + l->up_exps.w[0].n_bytes +
							 l->down_exps.w[0].n_bytes);
	}
	size_t row = 0; /* one embedding row */
	toast_dtype_bytes(m->tok_embd.type, hp->n_embd, &row);
	return n + row;
}

/* 2 FLOPs per weight element a token multiplies: the dense matrices, the router, the routed
 * experts it uses and the shared one, the convolution taps; not the embedding lookup (no
 * product) nor the output head (once per prompt, not per token) */
static double weight_token_flops(struct toast_model *m)
{
	double n = 0;
	for (int il = 0; il < m->hp.n_layer; il++) {
		struct toast_layer *l = &m->layers[il];
		struct toast_weight *ws[TOAST_LAYER_MAX_WEIGHTS];
		int nw = toast_layer_weights(l, ws);
		for (int i = 0; i < nw; i++)
			if (ws[i]->n_out > 1)
				n += (double)ws[i]->n_out * (double)ws[i]->n_in;
		if (l->is_moe) {
			const struct toast_weight *g = &l->gate_exps.w[0], *u = &l->up_exps.w[0], *d = &l->down_exps.w[0];
			n += (double)m->hp.n_expert_used *
			     ((double)g->n_out * g->n_in + (double)u->n_out * u->n_in + (double)d->n_out * d->n_in);
		}
	}
	return 2 * n;
}

static bool model_quantized(struct toast_model *m)
{
	bool q = toast_dtype_is_quant(m->tok_embd.type) || toast_dtype_is_quant(m->output.type);
	for (int il = 0; il < m->hp.n_layer && !q; il++) {
		struct toast_layer *l = &m->layers[il];
		struct toast_weight *ws[TOAST_LAYER_MAX_WEIGHTS];
		int nw = toast_layer_weights(l, ws);
		for (int i = 0; i < nw; i++)
			q = q || toast_dtype_is_quant(ws[i]->type);
		q = q || (l->is_moe && toast_dtype_is_quant(l->gate_exps.w[0].type));
	}
	return q;
}

static enum toast_status model_prepare(struct toast_model *m, struct toast_error *err)
{
	struct toast_backend *be = m->be;
	enum toast_status rc = be->ops->prepare_weight(be, &m->tok_embd, err);
	if (rc == TOAST_OK)
		rc = be->ops->prepare_weight(be, &m->output_norm, err);
	if (m->output_tied)
		m->output = m->tok_embd;
	else if (rc == TOAST_OK)
		rc = be->ops->prepare_weight(be, &m->output, err);
	size_t done = m->tok_embd.n_bytes + m->output_norm.n_bytes + (m->output_tied ? 0 : m->output.n_bytes);
	for (int il = 0; il < m->hp.n_layer && rc == TOAST_OK; il++) {
		struct toast_layer *l = &m->layers[il];
		struct toast_weight *ws[TOAST_LAYER_MAX_WEIGHTS];
		int nw = toast_layer_weights(l, ws);
		for (int i = 0; i < nw && rc == TOAST_OK; i++) {
			rc = be->ops->prepare_weight(be, ws[i], err);
			done += ws[i]->n_bytes;
		}
		struct toast_experts *xs[] = {&l->gate_exps, &l->up_exps, &l->down_exps};
		for (int i = 0; i < 3 && l->is_moe && rc == TOAST_OK; i++) {
			rc = be->ops->prepare_experts(be, xs[i], err);
			done += (size_t)xs[i]->n_expert * xs[i]->w[0].n_bytes;
		}
		if (rc == TOAST_OK && m->progress &&
		    m->progress(m->progress_ud, done < m->weight_bytes ? done : m->weight_bytes, m->weight_bytes))
			rc = toast_err_set(err, TOAST_ERR_CANCELLED, "loading cancelled");
	}
	return rc;
}

/* config.json + safetensors, or a GGUF file: hparams and the tensor directory */
static enum toast_status model_open(struct toast_model *m, const char *path, struct toast_error *err)
{
	struct stat sb;
	if (stat(path, &sb) == 0 && !S_ISDIR(sb.st_mode)) { /* a file: GGUF */
		if (!toast_gguf_is_gguf(path))
			return toast_err_set(err, TOAST_ERR_IO,
					     "%s/config.json: not a directory, and %s is not a GGUF file (bad magic)", path,
					     path);
		m->is_gguf = true;
		enum toast_status rc = toast_gguf_open(&m->gguf, path, err);
		if (rc == TOAST_OK)
			rc = toast_hparams_from_gguf(&m->hp, &m->gguf, err);
		return rc == TOAST_OK ? toast_gguf_tensordir(&m->gguf, &m->hp, &m->td, err) : rc;
	}
	char cfg[4096], *text = NULL;
	if (!toast_path_join(cfg, sizeof(cfg), path, "config.json"))
		return toast_err_set(err, TOAST_ERR_INVALID, "%s: path too long", path);
	enum toast_status rc = toast_read_file(cfg, CONFIG_MAX_BYTES, &text, NULL, err);
	if (rc == TOAST_OK) {
		rc = toast_hparams_parse(&m->hp, text, err);
		free(text);
		if (rc != TOAST_OK)
			toast_err_prefix(err, "%s/", path); /* "DIR/config.json: ..." */
	}
	if (rc == TOAST_OK)
		rc = toast_st_open_dir(&m->td, path, err);
	/* mlx-lm converts hybrid checkpoints with +1 baked into the zero-centred norms and conv1d
	 * moved to [C, K, 1]: that layout marks such a directory */
	for (int il = 0; rc == TOAST_OK && il < m->hp.n_layer && m->hp.norm_plus_one; il++) {
		char name[160];
		snprintf(name, sizeof(name), "%slayers.%d.linear_attn.conv1d.weight",
			 toast_tensordir_find(&m->td, "model.language_model.embed_tokens.weight") ? "model.language_model."
												    : "model.",
			 il);
		const struct toast_tensor *c = toast_tensordir_find(&m->td, name);
		if (c) {
			m->hp.norm_plus_one = !(c->n_dims == 3 && c->shape[2] == 1 && c->shape[1] > 1);
			break;
		}
	}
	return rc;
}

static enum toast_status model_bind(struct toast_model *m, enum toast_quant_mix quant, struct toast_error *err);

enum toast_status toast_model_load(struct toast_model *m, const char *path, struct toast_backend *be,
				   enum toast_quant_mix quant, toast_progress_cb progress, void *progress_ud,
				   struct toast_error *err)
{
	memset(m, 0, sizeof(*m));
	m->be = be;
	m->progress = progress;
	m->progress_ud = progress_ud;
	enum toast_status rc = model_open(m, path, err);
	if (rc != TOAST_OK) {
		toast_model_unload(m);
		return rc;
	}
	rc = model_bind(m, quant, err);
	if (rc != TOAST_OK) {
		toast_err_prefix(err, "%s: ", path);
		toast_model_unload(m);
	}
	return rc;
}

enum toast_status toast_model_load_synthetic(struct toast_model *m, const char *config_json, int n_layer,
					     enum toast_dtype type, enum toast_quant_mix mix, struct toast_backend *be,
					     struct toast_error *err)
{
	memset(m, 0, sizeof(*m));
	m->be = be;
	m->synthetic = true;
	m->synth_type = type;
	m->synth_mix = mix;
	if (mix == TOAST_MIX_NONE && type != TOAST_DT_BF16 && !toast_dtype_is_quant(type))
		return toast_err_set(err, TOAST_ERR_INVALID, "synthetic model: weights of type %s are not made (bf16, "
				     "q4_0, q4_1, q8_0, q4_k, q5_k, q6_k, mlx4, mlx8)", toast_dtype_name(type));
	enum toast_status rc = toast_hparams_parse(&m->hp, config_json, err);
	if (rc == TOAST_OK && n_layer > 0 && n_layer < m->hp.n_layer)
		m->hp.n_layer = n_layer; /* the per-layer tables are longer than needed: harmless */
	if (rc == TOAST_OK)
		rc = model_bind(m, TOAST_MIX_NONE, err);
	if (rc != TOAST_OK) {
		toast_err_prefix(err, "synthetic model: ");
		toast_model_unload(m);
	}
	return rc;
}

static enum toast_status model_bind(struct toast_model *m, enum toast_quant_mix quant, struct toast_error *err)
{
	enum toast_status rc;
	const struct toast_hparams *hp = &m->hp;
	struct binder b = {m, "model.", err, TOAST_OK};
	if (toast_tensordir_find(&m->td, "model.language_model.embed_tokens.weight"))
		b.prefix = "model.language_model.";
	m->layers = calloc((size_t)hp->n_layer, sizeof(*m->layers));
	if (!m->layers)
		b.rc = toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	bindf(&b, &m->tok_embd, hp->n_vocab, hp->n_embd, "%sembed_tokens.weight", b.prefix);
	bindf(&b, &m->output_norm, 1, hp->n_embd, "%snorm.weight", b.prefix);
	if (!hp->tie_embd || toast_tensordir_find(&m->td, "lm_head.weight"))
		bind_as(&b, &m->output, "lm_head.weight", hp->n_vocab, hp->n_embd);
	else
		m->output_tied = true; /* set from tok_embd once it is prepared */
	for (int il = 0; il < hp->n_layer && b.rc == TOAST_OK; il++)
		bind_layer(&b, il);
	rc = b.rc;
	if (rc == TOAST_OK && quant != TOAST_MIX_NONE)
		rc = toast_model_quantize(m, quant, err);
	if (rc == TOAST_OK) {
		m->decode_bytes = weight_decode_bytes(m);
		m->token_flops = weight_token_flops(m);
		m->quantized = model_quantized(m);
		rc = model_prepare(m, err);
	}
	return rc;
}

void toast_model_unload(struct toast_model *m)
{
	if (!m)
		return;
	/* backend copies of weights are released with the backend itself */
	if (m->layers)
		for (int il = 0; il < m->hp.n_layer; il++) {
			free(m->layers[il].gate_exps.w);
			free(m->layers[il].up_exps.w);
			free(m->layers[il].down_exps.w);
		}
	free(m->layers);
	for (size_t i = 0; i < m->n_synth_names; i++)
		free(m->synth_names[i]);
	free(m->synth_names);
	toast_tensordir_close(&m->td);
	toast_gguf_close(&m->gguf);
	toast_hparams_free(&m->hp);
	memset(m, 0, sizeof(*m));
}

/* ---- state ---- */

static int ssm_conv_dim(const struct toast_hparams *hp)
{
	return 2 * hp->ssm_n_k_head * hp->ssm_d_k + hp->ssm_n_v_head * hp->ssm_d_v;
}

void toast_model_state_free(const struct toast_model *m, struct toast_state *s)
{
	if (!s || !m || !m->be)
		return;
	struct toast_backend *be = m->be;
	for (int il = 0; il < m->hp.n_layer; il++) {
		if (s->k_cache)
			be->ops->release(be, s->k_cache[il]);
		if (s->v_cache)
			be->ops->release(be, s->v_cache[il]);
		if (s->conv)
			be->ops->release(be, s->conv[il]);
		if (s->ssm)
			be->ops->release(be, s->ssm[il]);
	}
	toast_model_state_keep(m, s, 0, NULL);
	free(s->k_cache);
	free(s->v_cache);
	free(s->conv);
	free(s->ssm);
	memset(s, 0, sizeof(*s));
}

/* one attention layer's K (or V) cache of n tokens */
static size_t state_kv_bytes(const struct toast_model *m, int64_t n)
{
	return toast_kv_bytes(m->kv_type, m->hp.n_head_kv, m->hp.head_dim, m->be->act_size, n);
}

/* two slots: see toast_gdn_args */
static size_t state_conv_bytes(const struct toast_model *m)
{
	return 2 * (size_t)(m->hp.ssm_conv_k - 1) * ssm_conv_dim(&m->hp) * sizeof(float);
}

static size_t state_ssm_bytes(const struct toast_model *m)
{
	const struct toast_hparams *hp = &m->hp;
	return (size_t)hp->ssm_n_v_head * hp->ssm_d_v * hp->ssm_d_k * sizeof(float);
}

/* a state's id, unique: it keys the steps recorded on it */
static uint64_t state_new_id(void)
{
	static _Atomic uint64_t next_id = 1;
	return next_id++;
}

enum toast_status toast_model_state_new(const struct toast_model *m, int n_ctx, struct toast_state *s,
					struct toast_error *err)
{
	memset(s, 0, sizeof(*s));
	struct toast_backend *be = m->be;
	int L = m->hp.n_layer;
	s->id = state_new_id();
	s->n_ctx = n_ctx;
	s->k_cache = calloc((size_t)L, sizeof(void *));
	s->v_cache = calloc((size_t)L, sizeof(void *));
	s->conv = calloc((size_t)L, sizeof(void *));
	s->ssm = calloc((size_t)L, sizeof(float *));
	bool ok = s->k_cache && s->v_cache && s->conv && s->ssm;
	for (int il = 0; il < L && ok; il++) {
		if (m->layers[il].is_attn) {
			size_t n = state_kv_bytes(m, n_ctx);
			ok = (s->k_cache[il] = be->ops->alloc(be, n)) && (s->v_cache[il] = be->ops->alloc(be, n));
		} else {
			ok = (s->conv[il] = be->ops->alloc(be, state_conv_bytes(m))) &&
			     (s->ssm[il] = be->ops->alloc(be, state_ssm_bytes(m)));
		}
	}
	if (!ok) {
		toast_model_state_free(m, s);
		return toast_err_set(err, TOAST_ERR_NOMEM, "cannot allocate the state for %d tokens of context", n_ctx);
	}
	return TOAST_OK;
}

void toast_model_state_zero(const struct toast_model *m, struct toast_state *s)
{
	struct toast_backend *be = m->be;
	for (int il = 0; il < m->hp.n_layer; il++)
		if (!m->layers[il].is_attn) { /* the KV cache needs no clearing: rows >= pos are never read */
			be->ops->zero(be, s->conv[il], state_conv_bytes(m));
			be->ops->zero(be, s->ssm[il], state_ssm_bytes(m));
		}
}

enum toast_status toast_model_state_keep(const struct toast_model *m, struct toast_state *s, int max_T,
					 struct toast_error *err)
{
	struct toast_backend *be = m->be;
	int L = m->hp.n_layer;
	if (s->keep_T || max_T > 1) /* steps recorded before keep (or no longer keep) other buffers */
		s->id = state_new_id();
	for (int il = 0; il < L && s->ssm_keep; il++) {
		be->ops->release(be, s->ssm_keep[il]);
		be->ops->release(be, s->conv_keep[il]);
	}
	free(s->ssm_keep);
	free(s->conv_keep);
	s->ssm_keep = s->conv_keep = NULL;
	s->keep_T = 0;
	if (max_T <= 1)
		return TOAST_OK;
	if (max_T > TOAST_GDN_KEEP_MAX)
		return toast_err_set(err, TOAST_ERR_INVALID, "states kept for steps of %d tokens (at most %d)", max_T,
				     TOAST_GDN_KEEP_MAX);
	s->ssm_keep = calloc((size_t)L, sizeof(float *));
	s->conv_keep = calloc((size_t)L, sizeof(float *));
	bool ok = s->ssm_keep && s->conv_keep;
	for (int il = 0; il < L && ok; il++)
		if (!m->layers[il].is_attn) /* (one conv slot a token) */
			ok = (s->ssm_keep[il] = be->ops->alloc(be, (size_t)(max_T - 1) * state_ssm_bytes(m))) &&
			     (s->conv_keep[il] = be->ops->alloc(be, (size_t)(max_T - 1) * state_conv_bytes(m) / 2));
	if (!ok) {
		toast_model_state_keep(m, s, 0, NULL);
		return toast_err_set(err, TOAST_ERR_NOMEM, "cannot allocate the states of steps of %d tokens", max_T);
	}
	s->keep_T = max_T;
	return TOAST_OK;
}

/* a rewind's copies, REWIND_BATCH at most at a time (the CUDA backend's copies a launch) */
#define REWIND_BATCH 32
static void rewind_copy(struct toast_backend *be, void *const *dst, const void *const *src, const size_t *bytes, int k)
{
	if (be->ops->copy_many)
		be->ops->copy_many(be, dst, src, bytes, k);
	else
		for (int i = 0; i < k; i++)
			be->ops->copy(be, dst[i], src[i], bytes[i]);
}

enum toast_status toast_model_state_rewind(const struct toast_model *m, struct toast_state *s, int pos, int T, int n,
					   struct toast_error *err)
{
	if (T < 2 || T > s->keep_T || n < 1 || n > T || pos < 0)
		return toast_err_set(err, TOAST_ERR_INVALID, "rewind: %d of %d tokens (states kept for %d)", n, T, s->keep_T);
	if (n == T)
		return TOAST_OK;
	size_t sb = state_ssm_bytes(m), cb = state_conv_bytes(m) / 2;
	void *dst[REWIND_BATCH];
	const void *src[REWIND_BATCH];
	size_t bytes[REWIND_BATCH];
	int k = 0;
	for (int il = 0; il < m->hp.n_layer; il++) { /* each GDN layer's two states, after token n - 1 */
		if (m->layers[il].is_attn)
			continue;
		dst[k] = s->ssm[il], src[k] = (char *)s->ssm_keep[il] + (size_t)(n - 1) * sb, bytes[k++] = sb;
		dst[k] = (char *)s->conv[il] + (size_t)((pos + n) & 1) * cb;
		src[k] = (char *)s->conv_keep[il] + (size_t)(n - 1) * cb, bytes[k++] = cb;
		if (k == REWIND_BATCH) {
			rewind_copy(m->be, dst, src, bytes, k);
			k = 0;
		}
	}
	if (k)
		rewind_copy(m->be, dst, src, bytes, k);
	return TOAST_OK;
}

/* ---- state images (model.h) ---- */

size_t toast_model_kv_bytes(const struct toast_model *m, int n)
{
	size_t b = 0;
	for (int il = 0; il < m->hp.n_layer; il++)
		b += m->layers[il].is_attn ? 2 * state_kv_bytes(m, n) : 0;
	return b;
}

size_t toast_model_rec_bytes(const struct toast_model *m)
{
	size_t b = 0;
	for (int il = 0; il < m->hp.n_layer; il++)
		b += m->layers[il].is_attn ? 0 : state_conv_bytes(m) + state_ssm_bytes(m);
	return b;
}

/* Copy between a state and an image (load: image -> state), part by part in layer order; the
 * kv image has kv_rows rows per layer, of which the first n are copied. */
static enum toast_status state_image_move(const struct toast_model *m, const struct toast_state *s, int n,
					  unsigned char *kv, int kv_rows, unsigned char *rec, bool img_host, bool load,
					  struct toast_error *err)
{
	struct toast_backend *be = m->be;
	enum toast_status rc = TOAST_OK;
	size_t kvn = state_kv_bytes(m, n), kvs = state_kv_bytes(m, kv_rows), cb = state_conv_bytes(m), sb = state_ssm_bytes(m);
	for (int il = 0; il < m->hp.n_layer && rc == TOAST_OK; il++) {
		void *bufs[2];
		size_t sizes[2], strides[2];
		unsigned char **img;
		if (m->layers[il].is_attn) {
			bufs[0] = s->k_cache[il], bufs[1] = s->v_cache[il], img = &kv;
			sizes[0] = sizes[1] = kvn;
			strides[0] = strides[1] = kvs;
		} else {
			bufs[0] = s->conv[il], bufs[1] = s->ssm[il], img = &rec;
			strides[0] = sizes[0] = cb;
			strides[1] = sizes[1] = sb;
		}
		if (!*img)
			continue;
		for (int k = 0; k < 2 && rc == TOAST_OK; k++) {
			rc = load ? toast_backend_move(be, bufs[k], false, *img, img_host, sizes[k], err)
				  : toast_backend_move(be, *img, img_host, bufs[k], false, sizes[k], err);
			*img += strides[k];
		}
	}
	if (rc == TOAST_OK)
		rc = be->ops->sync(be, err);
	return rc;
}

enum toast_status toast_model_state_save(const struct toast_model *m, const struct toast_state *s, int n, void *kv,
					 void *rec, bool img_host, struct toast_error *err)
{
	if (n < 0 || n > s->n_ctx)
		return toast_err_set(err, TOAST_ERR_INVALID, "state image of %d tokens (context %d)", n, s->n_ctx);
	return state_image_move(m, s, n, kv, n, rec, img_host, false, err);
}

enum toast_status toast_model_state_load(const struct toast_model *m, struct toast_state *s, int n, const void *kv,
					 int kv_rows, const void *rec, bool img_host, struct toast_error *err)
{
	if (n < 0 || n > s->n_ctx || kv_rows < n)
		return toast_err_set(err, TOAST_ERR_INVALID, "state image: %d tokens of %d (context %d)", n, kv_rows,
				     s->n_ctx);
	/* the image is only read: the cast lets one walker serve both directions */
	return state_image_move(m, s, n, (unsigned char *)(uintptr_t)kv, kv_rows, (unsigned char *)(uintptr_t)rec,
				img_host, true, err);
}

static uint64_t fp_weight(uint64_t h, const struct toast_weight *w)
{
	h = toast_fnv1a(&w->type, sizeof(w->type), h);
	h = toast_fnv1a(&w->n_in, sizeof(w->n_in), h);
	return w->data ? toast_fnv1a(w->data, w->n_bytes, h) : h;
}

/* the element types a matrix is stored and computed in: a quantised model computes other states */
static uint64_t fp_types(uint64_t h, const struct toast_weight *w)
{
	int t[3] = {w->type, w->dev_type, w->group_size};
	return toast_fnv1a(t, sizeof(t), h);
}

uint64_t toast_model_fingerprint(const struct toast_model *m)
{
	const struct toast_hparams *hp = &m->hp;
	int dims[] = {hp->arch,      hp->n_vocab,      hp->n_embd,       hp->n_layer,  hp->n_head,    hp->n_head_kv,
		      hp->head_dim,  hp->n_rot,        hp->ssm_n_k_head, hp->ssm_n_v_head, hp->ssm_d_k, hp->ssm_d_v,
		      hp->ssm_conv_k, (int)m->be->act_type, m->synthetic, (int)m->kv_type};
	uint64_t h = toast_fnv1a(dims, sizeof(dims), TOAST_FNV_OFFSET);
	h = toast_fnv1a(&hp->rope_theta, sizeof(hp->rope_theta), h);
	for (int il = 0; il < hp->n_layer; il++) {
		const struct toast_layer *l = &m->layers[il];
		h = toast_fnv1a(&l->is_attn, sizeof(bool), h);
		h = fp_weight(h, &l->attn_norm);
		h = fp_weight(h, &l->ffn_norm);
		const struct toast_weight *mats[] = {&l->wq,      &l->wk,       &l->wv,      &l->wo,       &l->ssm_qkv,
						     &l->ssm_z,   &l->ssm_out,  &l->ffn_gate, &l->ffn_up,  &l->ffn_down,
						     &l->router,  &l->sh_gate,  &l->sh_up,   &l->sh_down};
		for (size_t k = 0; k < sizeof(mats) / sizeof(mats[0]); k++)
			h = fp_types(h, mats[k]);
		const struct toast_experts *x[] = {&l->gate_exps, &l->up_exps, &l->down_exps};
		for (int k = 0; k < 3; k++)
			if (x[k]->n_expert > 0 && x[k]->w)
				h = fp_types(h, &x[k]->w[0]);
	}
	h = fp_types(fp_types(h, &m->tok_embd), &m->output);
	return fp_weight(h, &m->output_norm);
}

/* ---- work buffers ---- */

void toast_model_work_free(const struct toast_model *m, struct toast_work *w)
{
	if (!w || !m || !m->be) /* no backend: the model failed to load and w was never allocated */
		return;
	struct toast_backend *be = m->be;
	void *bufs[] = {w->x, w->h, w->q, w->k, w->v, w->o, w->qkv, w->z, w->b, w->a, w->g_out, w->ff_act, w->logits,
			w->logits_all};
	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		be->ops->release(be, bufs[i]);
	memset(w, 0, sizeof(*w));
}

enum toast_status toast_model_work_new(const struct toast_model *m, int max_T, struct toast_work *w,
				       struct toast_error *err)
{
	memset(w, 0, sizeof(*w));
	const struct toast_hparams *hp = &m->hp;
	struct toast_backend *be = m->be;
	size_t T = (size_t)max_T, as = be->act_size;
	size_t vdim = (size_t)hp->ssm_n_v_head * hp->ssm_d_v;
	size_t ff = (size_t)hp->n_ff;
	w->max_T = max_T;
	bool ok = (w->x = be->ops->alloc(be, T * hp->n_embd * sizeof(float))) &&
		  (w->h = be->ops->alloc(be, T * hp->n_embd * as)) &&
		  (w->q = be->ops->alloc(be, T * hp->n_head * hp->head_dim * 2 * sizeof(float))) &&
		  (w->k = be->ops->alloc(be, T * hp->n_head_kv * hp->head_dim * sizeof(float))) &&
		  (w->v = be->ops->alloc(be, T * hp->n_head_kv * hp->head_dim * sizeof(float))) &&
		  (w->o = be->ops->alloc(be, T * hp->n_head * hp->head_dim * as)) &&
		  (w->qkv = be->ops->alloc(be, T * ((size_t)ssm_conv_dim(hp) + vdim) * sizeof(float) + 1)) &&
		  (w->z = be->ops->alloc(be, T * vdim * sizeof(float) + 1)) &&
		  (w->b = be->ops->alloc(be, T * 2 * hp->ssm_n_v_head * sizeof(float) + 1)) &&
		  (w->a = be->ops->alloc(be, T * hp->ssm_n_v_head * sizeof(float) + 1)) &&
		  (w->g_out = be->ops->alloc(be, T * vdim * sizeof(float) + 1)) &&
		  (w->ff_act = be->ops->alloc(be, T * ff * as + 1)) &&
		  (w->logits = be->ops->alloc(be, hp->n_vocab * sizeof(float)));
	if (!ok) {
		toast_model_work_free(m, w);
		return toast_err_set(err, TOAST_ERR_NOMEM, "cannot allocate activations for %d tokens", max_T);
	}
	return TOAST_OK;
}

/* ---- forward ---- */

/* read an f32 or act backend buffer of n values into host f32 */
static enum toast_status fwd_read_f32(struct toast_backend *be, float *dst, const void *src, size_t n, bool act,
				      struct toast_error *err)
{
	if (!act || be->act_type == TOAST_DT_F32)
		return be->ops->read(be, dst, src, n * sizeof(float), err);
	uint16_t *tmp = malloc(n * sizeof(uint16_t));
	if (!tmp)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	enum toast_status rc = be->ops->read(be, tmp, src, n * sizeof(uint16_t), err);
	for (size_t i = 0; rc == TOAST_OK && i < n; i++)
		dst[i] = be->act_type == TOAST_DT_BF16 ? toast_bf16_to_f32(tmp[i]) : toast_f16_to_f32(tmp[i]);
	free(tmp);
	return rc;
}

static enum toast_status fwd_hook(struct toast_backend *be, toast_layer_hook hook, void *ud, int index, const void *buf,
				  bool act, int T, int n, struct toast_error *err)
{
	float *host = malloc((size_t)T * n * sizeof(float));
	if (!host)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	enum toast_status rc = fwd_read_f32(be, host, buf, (size_t)T * n, act, err);
	if (rc == TOAST_OK)
		hook(ud, index, host, T, n);
	free(host);
	return rc;
}

/* the normed residual as a matmul input (the norm is fused into the projections that read it) */
static struct toast_mm_in fwd_normed(const struct toast_model *m, const float *x, const struct toast_weight *norm_w)
{
	return (struct toast_mm_in){.norm_x = x, .norm_w = norm_w, .eps = m->hp.norm_eps, .plus_one = m->hp.norm_plus_one};
}

static struct toast_mm_in fwd_act(const void *act)
{
	return (struct toast_mm_in){.act = act};
}

/* the keys a step may see, rounded up to a power of two from 1024 (at most n_ctx): attention
 * sizes its decode work by it, and a recorded decode step is keyed on it, so one recording
 * serves until the context doubles */
static int fwd_span(const struct toast_state *s, int end)
{
	int span = 1024;
	while (span < end && span < s->n_ctx)
		span *= 2;
	return span < s->n_ctx ? span : s->n_ctx;
}

static void fwd_attention(const struct toast_model *m, const struct toast_layer *l, struct toast_state *s,
			  struct toast_work *w, int il, int T, int pos)
{
	const struct toast_hparams *hp = &m->hp;
	struct toast_backend *be = m->be;
	struct toast_mm_in in = fwd_normed(m, w->x, &l->attn_norm);
	struct toast_mm_out qkv[3] = {
		{.out = w->q, .mode = TOAST_MM_F32, .W = &l->wq},
		{.out = w->k, .mode = TOAST_MM_F32, .W = &l->wk},
		{.out = w->v, .mode = TOAST_MM_F32, .W = &l->wv}};
	be->ops->matmul(be, &in, qkv, 3, T);
	struct toast_attn_args a = {
		.q = w->q, .k = w->k, .v = w->v,
		.q_norm = l->has_qk_norm ? &l->q_norm : NULL, .k_norm = l->has_qk_norm ? &l->k_norm : NULL,
		.norm_plus_one = hp->norm_plus_one, .eps = hp->norm_eps,
		.n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim, .n_rot = hp->n_rot,
		.rope_theta = hp->rope_theta, .rope_freq_type = hp->rope_freq_type, .gated = hp->attn_gated,
		.kv_type = m->kv_type, .k_cache = s->k_cache[il], .v_cache = s->v_cache[il], .n_ctx = s->n_ctx, .pos = pos, .T = T,
		.span = fwd_span(s, pos + T), .out = w->o,
	};
	be->ops->attention(be, &a);
	struct toast_mm_in oin = fwd_act(w->o);
	struct toast_mm_out o = {.out = w->x, .mode = TOAST_MM_ADD, .W = &l->wo};
	be->ops->matmul(be, &oin, &o, 1, T);
}

static void fwd_gdn(const struct toast_model *m, const struct toast_layer *l, struct toast_state *s,
		    struct toast_work *w, int il, int T, int pos)
{
	const struct toast_hparams *hp = &m->hp;
	struct toast_backend *be = m->be;
	struct toast_mm_in in = fwd_normed(m, w->x, &l->attn_norm);
	in.prefetch = s->ssm[il]; /* the step reads it first, before its input is ready */
	in.prefetch_bytes = (size_t)hp->ssm_n_v_head * hp->ssm_d_v * hp->ssm_d_k * sizeof(float);
	struct toast_mm_out outs[4];
	int n = 0;
	outs[n++] = (struct toast_mm_out){.out = w->qkv, .mode = TOAST_MM_F32, .W = &l->ssm_qkv};
	if (!l->qkvz_grouped)
		outs[n++] = (struct toast_mm_out){.out = w->z, .mode = TOAST_MM_F32, .W = &l->ssm_z};
	outs[n++] = (struct toast_mm_out){.out = w->b, .mode = TOAST_MM_F32, .W = &l->ssm_b};
	if (!l->ba_grouped)
		outs[n++] = (struct toast_mm_out){.out = w->a, .mode = TOAST_MM_F32, .W = &l->ssm_a};
	be->ops->matmul(be, &in, outs, n, T);
	struct toast_gdn_args a = {
		.qkv = w->qkv, .z = w->z, .b = w->b, .a = w->a,
		.qkvz_grouped = l->qkvz_grouped, .ba_grouped = l->ba_grouped,
		.v_heads_tiled = hp->v_heads_tiled,
		.conv_w = &l->ssm_conv, .A_log = &l->ssm_A, .a_is_neg_exp = hp->a_is_neg_exp, .dt_bias = &l->ssm_dt,
		.norm_w = &l->ssm_norm,
		.n_k_head = hp->ssm_n_k_head, .n_v_head = hp->ssm_n_v_head, .d_k = hp->ssm_d_k, .d_v = hp->ssm_d_v,
		.conv_k = hp->ssm_conv_k, .eps = hp->norm_eps,
		.conv_state = s->conv[il], .ssm_state = s->ssm[il], .pos = pos, .T = T, .out = w->g_out,
	};
	if (T > 1 && T <= s->keep_T)
		a.ssm_keep = s->ssm_keep[il], a.conv_keep = s->conv_keep[il];
	be->ops->gdn(be, &a);
	struct toast_mm_in oin = {.xf = w->g_out};
	struct toast_mm_out o = {.out = w->x, .mode = TOAST_MM_ADD, .W = &l->ssm_out};
	be->ops->matmul(be, &oin, &o, 1, T);
}

static void fwd_ffn(const struct toast_model *m, const struct toast_layer *l, struct toast_work *w, int T)
{
	const struct toast_hparams *hp = &m->hp;
	struct toast_backend *be = m->be;
	if (!l->is_moe) {
		struct toast_mm_in in = fwd_normed(m, w->x, &l->ffn_norm);
		struct toast_mm_out gu = {.out = w->ff_act, .mode = TOAST_MM_GLU, .W = &l->ffn_gate, .W2 = &l->ffn_up};
		be->ops->matmul(be, &in, &gu, 1, T);
		struct toast_mm_in din = fwd_act(w->ff_act);
		struct toast_mm_out d = {.out = w->x, .mode = TOAST_MM_ADD, .W = &l->ffn_down};
		be->ops->matmul(be, &din, &d, 1, T);
		return;
	}
	struct toast_moe_args a = {
		.x = w->x, .norm_w = &l->ffn_norm, .eps = hp->norm_eps, .plus_one = hp->norm_plus_one,
		.router = &l->router, .gate = &l->gate_exps, .up = &l->up_exps, .down = &l->down_exps,
		.n_expert = hp->n_expert, .n_expert_used = hp->n_expert_used, .norm_topk = hp->norm_topk,
		.sh_gate = l->has_shexp ? &l->sh_gate : NULL, .sh_up = l->has_shexp ? &l->sh_up : NULL,
		.sh_down = l->has_shexp ? &l->sh_down : NULL,
		.sh_gate_inp = l->has_sh_gate_inp ? &l->sh_gate_inp : NULL,
		.n_embd = hp->n_embd, .n_ff = hp->n_ff_exp, .n_ff_sh = hp->n_ff_shexp, .T = T,
	};
	be->ops->moe(be, &a);
}

enum toast_status toast_model_forward(const struct toast_model *m, struct toast_state *s, struct toast_work *w,
				      const int32_t *ids, int T, int pos, bool all_logits, toast_layer_hook hook,
				      void *hook_ud, struct toast_error *err)
{
	const struct toast_hparams *hp = &m->hp;
	struct toast_backend *be = m->be;
	int E = hp->n_embd;
	if (T <= 0 || T > w->max_T || pos < 0 || pos + T > s->n_ctx)
		return toast_err_set(err, TOAST_ERR_INVALID, "forward: %d tokens at %d (max %d, context %d)", T, pos,
				     w->max_T, s->n_ctx);
	if (!ids && (T != 1 || !be->ops->begin_step_pick))
		return toast_err_set(err, TOAST_ERR_INVALID, "forward: a step from the device's pick is one token, on a backend "
							    "that picks");
	for (int t = 0; ids && t < T; t++)
		if (ids[t] < 0 || ids[t] >= hp->n_vocab)
			return toast_err_set(err, TOAST_ERR_INVALID, "token id %d outside the vocabulary (%d)", ids[t],
					     hp->n_vocab);
	bool all_rows = all_logits || hook; /* the head on every row, into logits_all */
	int rows = all_rows ? T : 1;
	if (all_rows && !w->logits_all &&
	    !(w->logits_all = be->ops->alloc(be, (size_t)w->max_T * hp->n_vocab * sizeof(float))))
		return toast_err_set(err, TOAST_ERR_NOMEM, "cannot allocate the logits of %d tokens", w->max_T);
	enum toast_status rc = TOAST_OK;
	if (ids)
		be->ops->begin_step(be, ids, T, pos);
	else
		be->ops->begin_step_pick(be, pos);
	/* a decode step can be replayed from a recording: same state, same buffers, T == 1 (or up to
	 * s->record_T, keyed by T and all_logits too; the span is below 2^28: n_ctx <= 2^26) */
	bool record = (T == 1 || T <= s->record_T) && T <= TOAST_RECORD_MAX_T && !hook && be->ops->graph_begin;
	uint64_t key = (uint64_t)s->id << 32 | (uint64_t)all_logits << 31 | (uint64_t)(T - 1) << 28 |
		       (uint32_t)fwd_span(s, pos + T);
	if (record && be->ops->graph_begin(be, key)) /* replayed: the next read waits for it */
		return be->ops->status ? be->ops->status(be, err) : be->ops->sync(be, err);
	be->ops->embed(be, w->x, &m->tok_embd, T);
	if (hook)
		rc = fwd_hook(be, hook, hook_ud, 0, w->x, false, T, E, err);
	for (int il = 0; il < hp->n_layer && rc == TOAST_OK; il++) {
		const struct toast_layer *l = &m->layers[il];
		if (l->is_attn)
			fwd_attention(m, l, s, w, il, T, pos);
		else
			fwd_gdn(m, l, s, w, il, T, pos);
		fwd_ffn(m, l, w, T);
		if (hook && il + 1 < hp->n_layer)
			rc = fwd_hook(be, hook, hook_ud, il + 1, w->x, false, T, E, err);
	}
	if (rc != TOAST_OK)
		return rc;
	/* final norm and head: every row for all_logits (and the hook), else the last row only */
	struct toast_mm_in in = fwd_normed(m, w->x + (size_t)(T - rows) * E, &m->output_norm);
	in.norm_out = hook ? w->h : NULL;
	struct toast_mm_out head = {.out = all_rows ? w->logits_all : w->logits, .mode = TOAST_MM_F32, .W = &m->output};
	be->ops->matmul(be, &in, &head, 1, rows);
	if (hook)
		rc = fwd_hook(be, hook, hook_ud, hp->n_layer, w->h, true, rows, E, err);
	if (rc == TOAST_OK && all_rows) /* the last token's row where decode's would be */
		be->ops->copy(be, w->logits, w->logits_all + (size_t)(T - 1) * hp->n_vocab, (size_t)hp->n_vocab * sizeof(float));
	if (record)
		be->ops->graph_end(be, key);
	if (rc == TOAST_OK)
		rc = be->ops->sync(be, err);
	return rc;
}
