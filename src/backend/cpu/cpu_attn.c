/*
 * cpu_attn.c - gated attention with a KV cache on the CPU (contract in backend.h).
 * RoPE angles are computed in f32 exactly as the reference does (f32 inverse frequencies times
 * an f32 position), so long positions round the same way.
 */
#include "backend/cpu/cpu.h"

static void attn_head_norm(float *x, int n, const struct toast_weight *w, bool plus_one, float eps, float *wtmp)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	float r = 1.0f / sqrtf((float)(ss / n) + eps);
	cpu_to_f32(w, 0, n, wtmp);
	for (int i = 0; i < n; i++)
		x[i] = x[i] * r * (plus_one ? 1.0f + wtmp[i] : wtmp[i]);
}

static void attn_rope(float *x, int n_rot, int pos, float theta, enum toast_dtype freq_type)
{
	int half = n_rot / 2;
	for (int i = 0; i < half; i++) {
		float inv = toast_rope_inv_freq(theta, i, n_rot, freq_type);
		float ang = (float)pos * inv;
		float c = cosf(ang), s = sinf(ang);
		float x0 = x[i], x1 = x[i + half];
		x[i] = x0 * c - x1 * s;
		x[i + half] = x1 * c + x0 * s;
	}
}

/* the 8-bit cache (backend.h) read in place: q · key j of KV head h, and o += w * value j */
static float attn_q8_dot(const struct toast_attn_args *a, const float *q, int j, int h)
{
	float s, acc = 0;
	const unsigned char *c = toast_kv_q8_codes(a->k_cache, a->n_head_kv, a->head_dim, false, j, h, &s);
	for (int d = 0; d < a->head_dim; d++)
		acc += q[d] * (float)((int)c[d] - 128);
	return acc * s;
}

static void attn_q8_axpy(const struct toast_attn_args *a, float w, int j, int h, float *o)
{
	float s;
	const unsigned char *c = toast_kv_q8_codes(a->v_cache, a->n_head_kv, a->head_dim, true, j, h, &s);
	w *= s;
	for (int d = 0; d < a->head_dim; d++)
		o[d] += w * (float)((int)c[(size_t)d * TOAST_KV_UNIT] - 128);
}

struct attn_ctx {
	struct cpu_backend *cb;
	const struct toast_attn_args *a;
	const float *qn; /* [T][n_head][head_dim] */
};

static void attn_task(void *p, int task, int tid)
{
	struct attn_ctx *c = p;
	const struct toast_attn_args *a = c->a;
	int hd = a->head_dim, kv_dim = a->n_head_kv * hd;
	int t = task / a->n_head, h = task % a->n_head;
	int kvh = h / (a->n_head / a->n_head_kv);
	int n_keys = a->pos + t + 1;
	const float *q = c->qn + ((size_t)t * a->n_head + h) * hd;
	const float *kc = (const float *)a->k_cache + kvh * hd;
	const float *vc = (const float *)a->v_cache + kvh * hd;
	bool q8 = a->kv_type == TOAST_KV_Q8;
	float *sc = c->cb->scratch[tid];
	float scale = 1.0f / sqrtf((float)hd), mx = -INFINITY;
	for (int j = 0; j < n_keys; j++) {
		sc[j] = q8 ? attn_q8_dot(a, q, j, kvh) : cpu_dot(q, kc + (size_t)j * kv_dim, hd);
		sc[j] *= scale;
		mx = sc[j] > mx ? sc[j] : mx;
	}
	float sum = 0;
	for (int j = 0; j < n_keys; j++) {
		sc[j] = expf(sc[j] - mx);
		sum += sc[j];
	}
	float *o = (float *)a->out + ((size_t)t * a->n_head + h) * hd;
	for (int d = 0; d < hd; d++)
		o[d] = 0;
	for (int j = 0; j < n_keys; j++) {
		float w = sc[j] / sum;
		if (q8) {
			attn_q8_axpy(a, w, j, kvh, o);
			continue;
		}
		const float *vr = vc + (size_t)j * kv_dim;
		for (int d = 0; d < hd; d++)
			o[d] += w * vr[d];
	}
	if (a->gated) {
		const float *g = (const float *)a->q + ((size_t)t * a->n_head + h) * 2 * hd + hd;
		for (int d = 0; d < hd; d++)
			o[d] *= cpu_sigmoid(g[d]);
	}
}

void cpu_attention(struct toast_backend *be, const struct toast_attn_args *a)
{
	struct cpu_backend *cb = cpu_of(be);
	int hd = a->head_dim, kv_dim = a->n_head_kv * hd;
	int qstride = a->gated ? 2 * hd : hd;
	bool q8 = a->kv_type == TOAST_KV_Q8;
	/* the normed queries, then a token's new K and V rows (Q8: quantised from there); a
	 * thread's scratch: its scores (at least head_dim: the norm's weights) */
	size_t nq = (size_t)a->T * a->n_head * hd;
	float *qn = cpu_shared(cb, nq + 2 * (size_t)kv_dim);
	if (!qn || !cpu_scratch(cb, (size_t)(a->pos + a->T) > (size_t)hd ? (size_t)(a->pos + a->T) : (size_t)hd))
		return;
	float *kvrow = qn + nq;
	float *wtmp = cb->scratch[0];
	for (int t = 0; t < a->T; t++) {
		int pos = a->pos + t;
		for (int h = 0; h < a->n_head; h++) {
			float *dst = qn + ((size_t)t * a->n_head + h) * hd;
			const float *src = (const float *)a->q + (size_t)t * a->n_head * qstride + (size_t)h * qstride;
			for (int d = 0; d < hd; d++)
				dst[d] = src[d];
			if (a->q_norm)
				attn_head_norm(dst, hd, a->q_norm, a->norm_plus_one, a->eps, wtmp);
			attn_rope(dst, a->n_rot, pos, a->rope_theta, a->rope_freq_type);
		}
		float *kd = q8 ? kvrow : (float *)a->k_cache + (size_t)pos * kv_dim;
		float *vd = q8 ? kvrow + kv_dim : (float *)a->v_cache + (size_t)pos * kv_dim;
		const float *ks = (const float *)a->k + (size_t)t * kv_dim;
		const float *vs = (const float *)a->v + (size_t)t * kv_dim;
		for (int i = 0; i < kv_dim; i++) {
			kd[i] = ks[i];
			vd[i] = vs[i];
		}
		for (int h = 0; h < a->n_head_kv; h++) {
			if (a->k_norm)
				attn_head_norm(kd + h * hd, hd, a->k_norm, a->norm_plus_one, a->eps, wtmp);
			attn_rope(kd + h * hd, a->n_rot, pos, a->rope_theta, a->rope_freq_type);
			if (q8) {
				toast_kv_q8_put(a->k_cache, a->n_head_kv, hd, false, pos, h, kd + h * hd);
				toast_kv_q8_put(a->v_cache, a->n_head_kv, hd, true, pos, h, vd + h * hd);
			}
		}
	}
	struct attn_ctx c = {cb, a, qn};
	toast_pool_for(cb->pool, a->T * a->n_head, attn_task, &c);
}
