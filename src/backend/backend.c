/* backend.c - backend selection helpers that do not depend on CUDA being built. */
#include "backend/backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/draw.h"
#include "backend/synth_quant.h"
#include "util/half.h"

uint64_t toast_synthetic_seed(const char *name)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (const char *p = name ? name : ""; *p; p++)
		h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
	return h;
}

/* splitmix64 of (seed, i): a stateless generator, so any backend can fill in parallel */
float toast_synthetic_value(uint64_t seed, uint64_t i, int64_t n_in, int64_t n_out)
{
	uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	float u = (float)(z >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
	if (n_out == 1)
		return 0.1f * u;
	return (2.0f * u - 1.0f) / sqrtf((float)n_in);
}

void toast_synthetic_weight(struct toast_weight *w, const char *name, enum toast_dtype type, int64_t n_out, int64_t n_in)
{
	*w = (struct toast_weight){.name = name, .type = type, .n_in = n_in, .n_out = n_out};
	size_t row = 0;
	if (type == TOAST_DT_MLX4 || type == TOAST_DT_MLX8) {
		w->group_size = TOAST_SYNTH_MLX_GROUP;
		w->sb_type = TOAST_DT_BF16;
		row = (size_t)n_in * (type == TOAST_DT_MLX4 ? 4 : 8) / 8 + 2 * (size_t)(n_in / TOAST_SYNTH_MLX_GROUP) * 2;
	} else {
		toast_dtype_bytes(type, n_in, &row);
	}
	w->n_bytes = row * (size_t)n_out;
}

void toast_synthetic_fill_quant(struct toast_weight *w, void *buf)
{
	uint64_t seed = toast_synthetic_seed(w->name);
	uint8_t *b = buf;
	bool mlx = w->type == TOAST_DT_MLX4 || w->type == TOAST_DT_MLX8;
	int bits = w->type == TOAST_DT_MLX4 ? 4 : 8;
	size_t n_q = mlx ? (size_t)w->n_out * (size_t)w->n_in * (size_t)bits / 8 : w->n_bytes;
	/* the random stream word by word, then the scale fields over it (synth_quant.h) */
	for (size_t j = 0; j < n_q / 4; j++) {
		uint32_t v = toast_synth_word(seed, j);
		memcpy(b + 4 * j, &v, 4);
	}
	for (size_t i = n_q & ~(size_t)3; i < n_q; i++)
		b[i] = toast_synth_qbyte(w->type, seed, i, w->n_in);
	w->data = b;
	if (mlx) {
		size_t n_g = (size_t)w->n_out * (size_t)(w->n_in / w->group_size);
		uint16_t *sc = (uint16_t *)(b + n_q), *bi = sc + n_g;
		for (size_t g = 0; g < n_g; g++) {
			sc[g] = toast_synth_mlx_sb(bits, seed, g, 0, w->n_in);
			bi[g] = toast_synth_mlx_sb(bits, seed, g, 1, w->n_in);
		}
		w->scales = sc;
		w->biases = bi;
		w->sb_type = TOAST_DT_BF16;
		return;
	}
	int bs = toast_synth_block_bytes(w->type), start, expo, neg;
	for (size_t blk = 0; blk < n_q / (size_t)bs; blk++)
		for (int k = 0; k < 6; k++) { /* the fields lie in the first four and last two bytes */
			int o = k < 4 ? k : bs - 6 + k;
			if (toast_synth_field(w->type, o, &start, &expo, &neg))
				b[blk * (size_t)bs + (size_t)o] = toast_synth_qbyte(w->type, seed, blk * (size_t)bs + (size_t)o, w->n_in);
		}
}

float toast_rope_inv_freq(float theta, int i, int n_rot, enum toast_dtype freq_type)
{
	float inv = 1.0f / powf(theta, (float)(2 * i) / (float)n_rot);
	if (freq_type == TOAST_DT_BF16)
		return toast_bf16_to_f32(toast_f32_to_bf16(inv));
	if (freq_type == TOAST_DT_F16)
		return toast_f16_to_f32(toast_f32_to_f16(inv));
	return inv;
}

enum toast_status toast_backend_move(struct toast_backend *be, void *dst, bool dst_host, const void *src,
				     bool src_host, size_t n, struct toast_error *err)
{
	if (n == 0)
		return TOAST_OK;
	if (dst_host && src_host) {
		memcpy(dst, src, n);
		return TOAST_OK;
	}
	if (dst_host)
		return be->ops->read(be, dst, src, n, err);
	if (src_host)
		be->ops->write(be, dst, src, n);
	else
		be->ops->copy(be, dst, src, n);
	return TOAST_OK;
}

#ifndef TOAST_HAVE_CUDA
enum toast_status toast_backend_cuda_new(struct toast_backend **out, struct toast_error *err)
{
	*out = NULL;
	return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "this build has no CUDA backend (nvcc was not found at build time)");
}

bool toast_backend_cuda_available(void)
{
	return false;
}
#endif

/* a before b in top order: larger value, then lower index */
static bool top_before(float va, int32_t ia, float vb, int32_t ib)
{
	return va > vb || (va == vb && ia < ib);
}

static void top_swap(int32_t *ids, float *vals, int a, int b)
{
	float tv = vals[a];
	int32_t ti = ids[a];
	vals[a] = vals[b];
	ids[a] = ids[b];
	vals[b] = tv;
	ids[b] = ti;
}

/* restore the heap (the worst entry at the root) below i */
static void top_sift(int32_t *ids, float *vals, int n, int i)
{
	for (;;) {
		int w = i, l = 2 * i + 1, r = l + 1;
		if (l < n && top_before(vals[w], ids[w], vals[l], ids[l]))
			w = l;
		if (r < n && top_before(vals[w], ids[w], vals[r], ids[r]))
			w = r;
		if (w == i)
			return;
		top_swap(ids, vals, i, w);
		i = w;
	}
}

int toast_top_host(const float *x, int n, int m, int32_t *ids, float *vals)
{
	if (m < 1 || m > TOAST_TOP_MAX)
		return 0;
	/* a heap of the best m seen so far, the worst of them at the root: O(n log m) */
	int k = 0;
	for (int i = 0; i < n; i++) {
		float v = x[i] == 0.0f ? 0.0f : x[i];
		if (isnan(v))
			continue;
		if (k < m) {
			int j = k++;
			vals[j] = v;
			ids[j] = i;
			for (; j > 0 && top_before(vals[(j - 1) / 2], ids[(j - 1) / 2], vals[j], ids[j]); j = (j - 1) / 2)
				top_swap(ids, vals, (j - 1) / 2, j);
		} else if (top_before(v, i, vals[0], ids[0])) {
			vals[0] = v;
			ids[0] = i;
			top_sift(ids, vals, k, 0);
		}
	}
	/* heap sort: the worst to the end, one at a time */
	for (int n_heap = k; n_heap > 1; n_heap--) {
		top_swap(ids, vals, 0, n_heap - 1);
		top_sift(ids, vals, n_heap - 1, 0);
	}
	return k;
}

uint64_t toast_top_key(const float *x, int n, int k, uint64_t *keys)
{
	if (k < 1 || k >= n)
		return 0;
	int m = 0;
	for (int i = 0; i < n; i++) {
		uint32_t o = toast_draw_order(x[i]);
		if (o != 0)
			keys[m++] = toast_draw_key(o, i);
	}
	if (k >= m)
		return 0;
	/* the k largest to the front by quickselect (keys are distinct), the least of them left at
	 * k - 1 */
	int lo = 0, hi = m - 1, t = k - 1;
	while (lo < hi) {
		uint64_t pivot = keys[lo + (hi - lo) / 2];
		int i = lo, j = hi;
		while (i <= j) {
			while (keys[i] > pivot)
				i++;
			while (keys[j] < pivot)
				j--;
			if (i <= j) {
				uint64_t tmp = keys[i];
				keys[i++] = keys[j];
				keys[j--] = tmp;
			}
		}
		if (t <= j)
			hi = j;
		else if (t >= i)
			lo = i;
		else
			break;
	}
	return keys[t];
}

/* the largest of x[0..n) (d NULL), or toast_draw_pick's draw d from top()'s m largest */
static int32_t pick_top(const float *x, int n, int m, const struct toast_draw *d, int32_t prev)
{
	int32_t ids[TOAST_TOP_MAX];
	float vals[TOAST_TOP_MAX], p[TOAST_TOP_MAX];
	int got = toast_top_host(x, n, m, ids, vals);
	return d ? toast_draw_pick(vals, ids, got, d, prev, p) : got ? ids[0] : 0;
}

/* the draw d with d->n_top 0 over every logit of x[0..n) (toast_pick_host's): the penalty on
 * every token seen, then the best (temperature 0), toast_draw_pick's draw from the top_k best
 * (top_k 1..TOAST_TOP_MAX), or toast_draw_wide's from all or (top_k over TOAST_TOP_MAX) from the
 * top_k best. Scratch: l of n, w of 2n. */
static int32_t pick_every(const float *x, int n, const struct toast_draw *d, int32_t prev, float *l, uint64_t *w)
{
	memcpy(l, x, (size_t)n * sizeof(*l));
	if (d->repeat_penalty != 1.0f) /* (each from x: a token seen twice is penalised once) */
		for (int j = -1; j < d->n_recent; j++) {
			int32_t id = j < 0 ? (d->prev ? prev : -1) : d->recent[j];
			if (id >= 0 && id < n && toast_draw_seen(d, d->recent, prev, id))
				l[id] = toast_draw_penalize(x[id], d->repeat_penalty);
		}
	if (d->temperature > 0 && (d->top_k == 0 || d->top_k > TOAST_TOP_MAX))
		return toast_draw_wide(l, n, toast_top_key(l, n, d->top_k, w), d, w);
	struct toast_draw dk = *d;
	dk.repeat_penalty = 1.0f; /* (applied) */
	return pick_top(l, n, d->temperature <= 0 ? 1 : d->top_k, &dk, prev);
}

int32_t toast_pick_host(const float *x, int n, const struct toast_draw *d, int32_t prev)
{
	if (d && d->n_top == 0) {
		float *l = n <= TOAST_DRAW_WIDE_MAX ? malloc((size_t)n * sizeof(*l)) : NULL;
		uint64_t *w = l ? malloc(2 * (size_t)n * sizeof(*w)) : NULL;
		int32_t id = w ? pick_every(x, n, d, prev, l, w) : -1;
		free(l);
		free(w);
		return id;
	}
	return pick_top(x, n, d ? d->n_top : 1, d, prev);
}

size_t toast_kv_bytes(enum toast_kv_type t, int n_head_kv, int head_dim, size_t act_size, int64_t n)
{
	if (t == TOAST_KV_Q8)
		return (size_t)((n + TOAST_KV_UNIT - 1) / TOAST_KV_UNIT) * toast_kv_unit_bytes(n_head_kv, head_dim);
	return (size_t)n * (size_t)n_head_kv * (size_t)head_dim * act_size;
}

void toast_kv_q8_put(void *buf, int n_head_kv, int head_dim, bool is_v, int64_t t, int h, const float *x)
{
	size_t step = is_v ? TOAST_KV_UNIT : 1, at = toast_kv_q8_code_at(n_head_kv, head_dim, is_v, t, h);
	unsigned char *b = buf;
	float amax = 0;
	for (int i = 0; i < head_dim; i++)
		amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
	for (int i = 0; i < head_dim; i++)
		b[at + (size_t)i * step] = (unsigned char)toast_kv_q8_code(x[i], amax);
	float scale = toast_kv_q8_scale(amax);
	memcpy(b + toast_kv_q8_scale_at(n_head_kv, head_dim, t, h), &scale, sizeof(scale));
}

const unsigned char *toast_kv_q8_codes(const void *buf, int n_head_kv, int head_dim, bool is_v, int64_t t, int h,
				       float *scale)
{
	const unsigned char *b = buf;
	memcpy(scale, b + toast_kv_q8_scale_at(n_head_kv, head_dim, t, h), sizeof(*scale));
	return b + toast_kv_q8_code_at(n_head_kv, head_dim, is_v, t, h);
}

void toast_kv_q8_get(const void *buf, int n_head_kv, int head_dim, bool is_v, int64_t t, int h, float *x)
{
	size_t step = is_v ? TOAST_KV_UNIT : 1;
	float scale;
	const unsigned char *c = toast_kv_q8_codes(buf, n_head_kv, head_dim, is_v, t, h, &scale);
	for (int i = 0; i < head_dim; i++)
		x[i] = (float)((int)c[(size_t)i * step] - 128) * scale;
}
