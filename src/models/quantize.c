/*
 * quantize.c - quantisation mixes (llama.cpp's choices, see quantize.h) and load-time
 * quantisation of a bound model: each float matrix is converted row by row with the reference
 * quantisers of format/quant.c into a buffer the tensor directory owns.
 */
#include "models/quantize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "format/quant.h"
#include "util/half.h"
#include "util/mem.h"

static const struct {
	const char *name;
	enum toast_quant_mix mix;
	int ftype;
	enum toast_dtype base;
} qm_mixes[] = {
	{"none", TOAST_MIX_NONE, -1, TOAST_DT_UNKNOWN},  {"bf16", TOAST_MIX_BF16, 32, TOAST_DT_BF16},
	{"q8_0", TOAST_MIX_Q8_0, 7, TOAST_DT_Q8_0},      {"q4_0", TOAST_MIX_Q4_0, 2, TOAST_DT_Q4_0},
	{"q4_1", TOAST_MIX_Q4_1, 3, TOAST_DT_Q4_1},      {"q4_k_m", TOAST_MIX_Q4_K_M, 15, TOAST_DT_Q4_K},
	{"q5_k_m", TOAST_MIX_Q5_K_M, 17, TOAST_DT_Q5_K}, {"q6_k", TOAST_MIX_Q6_K, 18, TOAST_DT_Q6_K},
};
#define QM_N (sizeof(qm_mixes) / sizeof(qm_mixes[0]))

bool toast_quant_mix_parse(const char *s, enum toast_quant_mix *out)
{
	for (size_t i = 0; i < QM_N; i++)
		if (strcasecmp(s, qm_mixes[i].name) == 0) {
			*out = qm_mixes[i].mix;
			return true;
		}
	return false;
}

const char *toast_quant_mix_name(enum toast_quant_mix mix)
{
	for (size_t i = 0; i < QM_N; i++)
		if (qm_mixes[i].mix == mix)
			return qm_mixes[i].name;
	return "?";
}

int toast_quant_mix_ftype(enum toast_quant_mix mix)
{
	for (size_t i = 0; i < QM_N; i++)
		if (qm_mixes[i].mix == mix)
			return qm_mixes[i].ftype;
	return -1;
}

static bool qm_more_bits(int il, int n)
{
	return il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2;
}

enum toast_dtype toast_quant_pick(enum toast_quant_mix mix, const char *hf_name, bool tied_embd, int n_layer,
				  int64_t n_in, enum toast_dtype src)
{
	enum toast_dtype t = TOAST_DT_UNKNOWN;
	for (size_t i = 0; i < QM_N; i++)
		if (qm_mixes[i].mix == mix)
			t = qm_mixes[i].base;
	if (t == TOAST_DT_UNKNOWN || strstr(hf_name, "mlp.gate.weight") || strstr(hf_name, "shared_expert_gate") ||
	    strstr(hf_name, "conv1d"))
		return src;
	const char *lp = strstr(hf_name, "layers.");
	int il = lp ? atoi(lp + 7) : 0;
	bool output = strcmp(hf_name, "lm_head.weight") == 0 || (tied_embd && strstr(hf_name, "embed_tokens"));
	bool k_mix = mix == TOAST_MIX_Q4_K_M || mix == TOAST_MIX_Q5_K_M;
	if (output && (k_mix || mix == TOAST_MIX_Q4_0 || mix == TOAST_MIX_Q4_1))
		t = TOAST_DT_Q6_K;
	else if (k_mix && (strstr(hf_name, "v_proj") || strstr(hf_name, "down_proj")) && qm_more_bits(il, n_layer))
		t = TOAST_DT_Q6_K;
	if (n_in % toast_dtypes[t].blck)
		t = t == TOAST_DT_Q4_K ? TOAST_DT_Q4_1 : t == TOAST_DT_Q5_K || t == TOAST_DT_Q6_K ? TOAST_DT_Q8_0 : t;
	if (n_in % toast_dtypes[t].blck)
		t = TOAST_DT_BF16;
	return t;
}

static void qm_row_f32(const struct toast_weight *w, int64_t r, float *dst)
{
	if (toast_dtype_is_quant(w->type)) { /* requantising: rows are whole blocks */
		size_t rb = 0;
		toast_dtype_bytes(w->type, w->n_in, &rb);
		toast_dequant(w->type, (const uint8_t *)w->data + (size_t)r * rb, dst, w->n_in);
		return;
	}
	for (int64_t i = 0; i < w->n_in; i++) {
		int64_t k = r * w->n_in + i;
		dst[i] = w->type == TOAST_DT_F32 ? ((const float *)w->data)[k]
			 : w->type == TOAST_DT_BF16 ? toast_bf16_to_f32(((const uint16_t *)w->data)[k])
						    : toast_f16_to_f32(((const uint16_t *)w->data)[k]);
	}
}

static enum toast_status qm_weight(struct toast_model *m, struct toast_weight *w, enum toast_quant_mix mix,
				   float *row, struct toast_error *err)
{
	if (!w->data || w->n_out <= 1 || w->type == TOAST_DT_MLX4 || w->type == TOAST_DT_MLX8 ||
	    !(w->type == TOAST_DT_F32 || w->type == TOAST_DT_F16 || w->type == TOAST_DT_BF16 || toast_dtype_is_quant(w->type)))
		return TOAST_OK;
	enum toast_dtype t = toast_quant_pick(mix, w->name, m->hp.tie_embd, m->hp.n_layer, w->n_in, w->type);
	size_t rb, nb;
	if (t == w->type)
		return TOAST_OK;
	if (!toast_dtype_bytes(t, w->n_in, &rb) || !toast_mul_ok(rb, (size_t)w->n_out, &nb))
		return toast_err_set(err, TOAST_ERR_INVALID, "tensor %s: cannot be %s", w->name, toast_dtype_name(t));
	uint8_t *buf = malloc(nb);
	if (!buf || !toast_tensordir_own(&m->td, buf))
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory quantising %s", w->name);
	for (int64_t r = 0; r < w->n_out; r++) {
		qm_row_f32(w, r, row);
		toast_quant(t, row, buf + (size_t)r * rb, w->n_in);
	}
	m->weight_bytes += nb - w->n_bytes;
	w->type = t;
	w->data = buf;
	w->n_bytes = nb;
	return TOAST_OK;
}

enum toast_status toast_model_quantize(struct toast_model *m, enum toast_quant_mix mix, struct toast_error *err)
{
	const struct toast_hparams *hp = &m->hp;
	int64_t widest = hp->n_embd;
	widest = hp->n_ff > widest ? hp->n_ff : widest;
	widest = hp->n_ff_exp > widest ? hp->n_ff_exp : widest;
	widest = hp->n_ff_shexp > widest ? hp->n_ff_shexp : widest;
	widest = (int64_t)hp->n_head * hp->head_dim > widest ? (int64_t)hp->n_head * hp->head_dim : widest;
	widest = (int64_t)hp->ssm_n_v_head * hp->ssm_d_v > widest ? (int64_t)hp->ssm_n_v_head * hp->ssm_d_v : widest;
	float *row = malloc((size_t)widest * sizeof(float));
	if (!row)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	enum toast_status rc = qm_weight(m, &m->tok_embd, mix, row, err);
	if (rc == TOAST_OK && !m->output_tied) /* a tied head is the embedding, set when prepared */
		rc = qm_weight(m, &m->output, mix, row, err);
	for (int il = 0; il < hp->n_layer && rc == TOAST_OK; il++) {
		struct toast_layer *l = &m->layers[il];
		struct toast_weight *ws[TOAST_LAYER_MAX_WEIGHTS];
		int nw = toast_layer_weights(l, ws);
		for (int i = 0; i < nw && rc == TOAST_OK; i++)
			rc = qm_weight(m, ws[i], mix, row, err);
		struct toast_experts *xs[] = {&l->gate_exps, &l->up_exps, &l->down_exps};
		for (int x = 0; x < 3 && l->is_moe; x++)
			for (int e = 0; e < xs[x]->n_expert && rc == TOAST_OK; e++)
				rc = qm_weight(m, &xs[x]->w[e], mix, row, err);
	}
	free(row);
	return rc;
}
