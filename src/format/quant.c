/*
 * quant.c - GGUF block dequantisers and reference quantisers, MLX affine dequantiser.
 * Layouts and the exact arithmetic are documented in quant.h. The quantisers follow ggml's
 * reference algorithms (quantize_row_*_ref) so files we write quantise like llama.cpp's.
 */
#include "format/quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "util/half.h"

#define QK 32
#define QK_K 256
#define GROUP_MAX_EPS 1e-15f

static inline float fp16(const uint8_t *p)
{
	return toast_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

static inline void put16(uint8_t *p, float v)
{
	uint16_t h = toast_f32_to_f16(v);
	p[0] = (uint8_t)h;
	p[1] = (uint8_t)(h >> 8);
}

/* the 6-bit scale and min of sub-block j of a Q4_K/Q5_K block */
static inline void k4_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	} else {
		*sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
		*m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
	}
}

/* ---- dequantisation ---- */

static void dq_q4_0(const uint8_t *b, float *y)
{
	float d = fp16(b);
	for (int j = 0; j < 16; j++) {
		y[j] = (float)((b[2 + j] & 0xF) - 8) * d;
		y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
	}
}

static void dq_q4_1(const uint8_t *b, float *y)
{
	float d = fp16(b), m = fp16(b + 2);
	for (int j = 0; j < 16; j++) {
		y[j] = (float)(b[4 + j] & 0xF) * d + m;
		y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
	}
}

static void dq_q8_0(const uint8_t *b, float *y)
{
	float d = fp16(b);
	for (int j = 0; j < 32; j++)
		y[j] = (float)(int8_t)b[2 + j] * d;
}

/* Q4_K (qh all zero) and Q5_K (qh its fifth bits): q points at the 128 nibble bytes */
static void dq_k45(const uint8_t *b, const uint8_t *qh, const uint8_t *q, float *y)
{
	float d = fp16(b), dmin = fp16(b + 2);
	for (int j = 0; j < 8; j += 2, q += 32) {
		uint8_t s0, m0, s1, m1;
		k4_scale_min(j, b + 4, &s0, &m0);
		k4_scale_min(j + 1, b + 4, &s1, &m1);
		float d0 = d * s0, mm0 = dmin * m0, d1 = d * s1, mm1 = dmin * m1;
		for (int l = 0; l < 32; l++)
			*y++ = d0 * (float)((q[l] & 0xF) | (qh[l] >> j & 1) << 4) - mm0;
		for (int l = 0; l < 32; l++)
			*y++ = d1 * (float)((q[l] >> 4) | (qh[l] >> (j + 1) & 1) << 4) - mm1;
	}
}

static void dq_q4_k(const uint8_t *b, float *y)
{
	static const uint8_t no_high_bits[32];
	dq_k45(b, no_high_bits, b + 16, y);
}

static void dq_q5_k(const uint8_t *b, float *y)
{
	dq_k45(b, b + 16, b + 48, y);
}

static void dq_q6_k(const uint8_t *b, float *y)
{
	const uint8_t *ql = b, *qh = b + 128;
	const int8_t *sc = (const int8_t *)(b + 192);
	float d = fp16(b + 208);
	for (int h = 0; h < 2; h++, y += 128, ql += 64, qh += 32, sc += 8)
		for (int l = 0; l < 32; l++) {
			int is = l / 16;
			int q1 = ((ql[l] & 0xF) | ((qh[l] >> 0 & 3) << 4)) - 32;
			int q2 = ((ql[l + 32] & 0xF) | ((qh[l] >> 2 & 3) << 4)) - 32;
			int q3 = ((ql[l] >> 4) | ((qh[l] >> 4 & 3) << 4)) - 32;
			int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6 & 3) << 4)) - 32;
			y[l] = d * (float)sc[is] * (float)q1;
			y[l + 32] = d * (float)sc[is + 2] * (float)q2;
			y[l + 64] = d * (float)sc[is + 4] * (float)q3;
			y[l + 96] = d * (float)sc[is + 6] * (float)q4;
		}
}

void toast_dequant(enum toast_dtype t, const void *src, float *dst, int64_t n)
{
	const uint8_t *b = src;
	int blck = toast_dtypes[t].blck, bs = toast_dtypes[t].type_size;
	void (*fn)(const uint8_t *, float *) = NULL;
	switch (t) {
	case TOAST_DT_Q4_0: fn = dq_q4_0; break;
	case TOAST_DT_Q4_1: fn = dq_q4_1; break;
	case TOAST_DT_Q8_0: fn = dq_q8_0; break;
	case TOAST_DT_Q4_K: fn = dq_q4_k; break;
	case TOAST_DT_Q5_K: fn = dq_q5_k; break;
	case TOAST_DT_Q6_K: fn = dq_q6_k; break;
	default: memset(dst, 0, (size_t)n * sizeof(float)); return;
	}
	for (int64_t i = 0; i < n / blck; i++)
		fn(b + i * bs, dst + i * blck);
}

/* MLX parts come from safetensors files, whose data need not be aligned: load bytewise */
static inline float sb_f32(const void *p, int64_t i, enum toast_dtype t)
{
	if (t == TOAST_DT_F32) {
		float f;
		memcpy(&f, (const char *)p + 4 * i, 4);
		return f;
	}
	uint16_t h;
	memcpy(&h, (const char *)p + 2 * i, 2);
	return t == TOAST_DT_BF16 ? toast_bf16_to_f32(h) : toast_f16_to_f32(h);
}

void toast_dequant_mlx(int bits, int group_size, const uint32_t *q, const void *scales, const void *biases,
		       enum toast_dtype sb_type, float *dst, int64_t n)
{
	int per = 32 / bits;
	uint32_t mask = (1u << bits) - 1;
	for (int64_t g = 0; g < n / group_size; g++) {
		float s = sb_f32(scales, g, sb_type), z = sb_f32(biases, g, sb_type);
		for (int j = 0; j < group_size; j++) {
			int64_t k = g * group_size + j;
			uint32_t word;
			memcpy(&word, q + k / per, 4);
			dst[k] = s * (float)(word >> (k % per * bits) & mask) + z;
		}
	}
}

/* ---- quantisation (ggml reference algorithms) ---- */

static inline int nearest_int(float v)
{
	return (int)lrintf(v); /* round half to even, as ggml's magic-number rounding */
}

static inline int clampi(int v, int lo, int hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

static void q_q8_0(const float *x, uint8_t *b)
{
	float amax = 0;
	for (int j = 0; j < QK; j++)
		amax = fmaxf(amax, fabsf(x[j]));
	float d = amax / 127, id = d ? 1.0f / d : 0.0f;
	put16(b, d);
	for (int j = 0; j < QK; j++)
		b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

static void q_q4_0(const float *x, uint8_t *b)
{
	float amax = 0, max = 0;
	for (int j = 0; j < QK; j++)
		if (amax < fabsf(x[j])) {
			amax = fabsf(x[j]);
			max = x[j];
		}
	float d = max / -8, id = d ? 1.0f / d : 0.0f;
	put16(b, d);
	for (int j = 0; j < 16; j++) {
		int q0 = (int8_t)(x[j] * id + 8.5f), q1 = (int8_t)(x[j + 16] * id + 8.5f);
		b[2 + j] = (uint8_t)((q0 < 15 ? q0 : 15) | (q1 < 15 ? q1 : 15) << 4);
	}
}

static void q_q4_1(const float *x, uint8_t *b)
{
	float min = FLT_MAX, max = -FLT_MAX;
	for (int j = 0; j < QK; j++) {
		min = fminf(min, x[j]);
		max = fmaxf(max, x[j]);
	}
	float d = (max - min) / 15, id = d ? 1.0f / d : 0.0f;
	put16(b, d);
	put16(b + 2, min);
	for (int j = 0; j < 16; j++) {
		int q0 = (int8_t)((x[j] - min) * id + 0.5f), q1 = (int8_t)((x[j + 16] - min) * id + 0.5f);
		b[4 + j] = (uint8_t)((q0 < 15 ? q0 : 15) | (q1 < 15 ? q1 : 15) << 4);
	}
}

/* ggml make_qkx2_quants: weighted least-squares scale and min for n values in [0, nmax]
 * (scale returned, -min in *the_min), searching nstep+1 candidate scales. */
static float qkx2(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min, uint8_t *Laux,
		  float rmin, float rdelta, int nstep)
{
	float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
	for (int i = 1; i < n; i++) {
		min = fminf(min, x[i]);
		max = fmaxf(max, x[i]);
		sum_w += w[i];
		sum_x += w[i] * x[i];
	}
	if (min > 0)
		min = 0;
	if (max == min) {
		memset(L, 0, (size_t)n);
		*the_min = -min;
		return 0.0f;
	}
	float iscale = nmax / (max - min), scale = 1 / iscale, best_error = 0;
	for (int i = 0; i < n; i++) {
		L[i] = (uint8_t)clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
		float diff = scale * L[i] + min - x[i];
		best_error += w[i] * diff * diff;
	}
	for (int is = 0; is <= nstep; is++) {
		iscale = (rmin + rdelta * is + nmax) / (max - min);
		float sum_l = 0, sum_l2 = 0, sum_xl = 0;
		for (int i = 0; i < n; i++) {
			int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
			Laux[i] = (uint8_t)l;
			sum_l += w[i] * l;
			sum_l2 += w[i] * l * l;
			sum_xl += w[i] * l * x[i];
		}
		float D = sum_w * sum_l2 - sum_l * sum_l;
		if (D > 0) {
			float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
			float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
			if (this_min > 0) {
				this_min = 0;
				this_scale = sum_xl / sum_l2;
			}
			float cur_error = 0;
			for (int i = 0; i < n; i++) {
				float diff = this_scale * Laux[i] + this_min - x[i];
				cur_error += w[i] * diff * diff;
			}
			if (cur_error < best_error) {
				memcpy(L, Laux, (size_t)n);
				best_error = cur_error;
				scale = this_scale;
				min = this_min;
			}
		}
	}
	*the_min = -min;
	return scale;
}

/* Q4_K and Q5_K share the scale search and the packing of 6-bit scales and mins */
static void q_k_scales(const float *x, int nmax, float rmin, int nstep, uint8_t *blk, uint8_t *L)
{
	float mins[8], scales[8], weights[32], max_scale = 0, max_min = 0;
	uint8_t Laux[32];
	for (int j = 0; j < 8; j++) {
		float sum_x2 = 0;
		for (int l = 0; l < 32; l++)
			sum_x2 += x[32 * j + l] * x[32 * j + l];
		float av_x = sqrtf(sum_x2 / 32);
		for (int l = 0; l < 32; l++)
			weights[l] = av_x + fabsf(x[32 * j + l]);
		scales[j] = qkx2(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
		max_scale = fmaxf(max_scale, scales[j]);
		max_min = fmaxf(max_min, mins[j]);
	}
	float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
	uint8_t *s = blk + 4;
	memset(s, 0, 12);
	for (int j = 0; j < 8; j++) {
		int ls = clampi(nearest_int(inv_scale * scales[j]), 0, 63), lm = clampi(nearest_int(inv_min * mins[j]), 0, 63);
		if (j < 4) {
			s[j] = (uint8_t)ls;
			s[j + 4] = (uint8_t)lm;
		} else {
			s[j + 4] = (uint8_t)((ls & 0xF) | (lm & 0xF) << 4);
			s[j - 4] |= (uint8_t)((ls >> 4) << 6);
			s[j] |= (uint8_t)((lm >> 4) << 6);
		}
	}
	put16(blk, max_scale / 63.f);
	put16(blk + 2, max_min / 63.f);
	/* the final codes against the rounded scales */
	for (int j = 0; j < 8; j++) {
		uint8_t sc, m;
		k4_scale_min(j, s, &sc, &m);
		float d = fp16(blk) * sc;
		if (!d)
			continue;
		float dm = fp16(blk + 2) * m;
		for (int i = 0; i < 32; i++)
			L[32 * j + i] = (uint8_t)clampi(nearest_int((x[32 * j + i] + dm) / d), 0, nmax);
	}
}

static void q_q4_k(const float *x, uint8_t *b)
{
	uint8_t L[QK_K];
	q_k_scales(x, 15, -1.0f, 20, b, L);
	uint8_t *q = b + 16;
	for (int j = 0; j < QK_K; j += 64, q += 32)
		for (int l = 0; l < 32; l++)
			q[l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
}

static void q_q5_k(const float *x, uint8_t *b)
{
	uint8_t L[QK_K];
	q_k_scales(x, 31, -0.5f, 15, b, L);
	uint8_t *qh = b + 16, *ql = b + 48;
	memset(qh, 0, 32);
	uint8_t m1 = 1, m2 = 2;
	for (int n = 0; n < QK_K; n += 64, ql += 32, m1 <<= 2, m2 <<= 2)
		for (int j = 0; j < 32; j++) {
			int l1 = L[n + j], l2 = L[n + j + 32];
			if (l1 > 15) {
				l1 -= 16;
				qh[j] |= m1;
			}
			if (l2 > 15) {
				l2 -= 16;
				qh[j] |= m2;
			}
			ql[j] = (uint8_t)(l1 | l2 << 4);
		}
}

/* ggml make_qx_quants with rmse_type 1 (weights x²): symmetric scale for codes in [-nmax, nmax-1] */
static float qx(int n, int nmax, const float *x, int8_t *L)
{
	float max = 0, amax = 0;
	for (int i = 0; i < n; i++)
		if (fabsf(x[i]) > amax) {
			amax = fabsf(x[i]);
			max = x[i];
		}
	if (amax < GROUP_MAX_EPS) {
		memset(L, 0, (size_t)n);
		return 0;
	}
	float iscale = -nmax / max, sumlx = 0, suml2 = 0;
	for (int i = 0; i < n; i++) {
		int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
		L[i] = (int8_t)(l + nmax);
		float w = x[i] * x[i];
		sumlx += w * x[i] * l;
		suml2 += w * l * l;
	}
	float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
	for (int is = -9; is <= 9; is++) {
		if (is == 0)
			continue;
		iscale = -(nmax + 0.1f * is) / max;
		sumlx = suml2 = 0;
		for (int i = 0; i < n; i++) {
			int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
			float w = x[i] * x[i];
			sumlx += w * x[i] * l;
			suml2 += w * l * l;
		}
		if (suml2 > 0 && sumlx * sumlx > best * suml2) {
			for (int i = 0; i < n; i++)
				L[i] = (int8_t)(nmax + clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1));
			scale = sumlx / suml2;
			best = scale * sumlx;
		}
	}
	return scale;
}

static void q_q6_k(const float *x, uint8_t *b)
{
	int8_t L[QK_K];
	float scales[16], max_scale = 0, max_abs = 0;
	for (int ib = 0; ib < 16; ib++) {
		scales[ib] = qx(16, 32, x + 16 * ib, L + 16 * ib);
		if (fabsf(scales[ib]) > max_abs) {
			max_abs = fabsf(scales[ib]);
			max_scale = scales[ib];
		}
	}
	memset(b, 0, 210);
	if (max_abs < GROUP_MAX_EPS)
		return;
	uint8_t *ql = b, *qh = b + 128;
	int8_t *sc = (int8_t *)(b + 192);
	float iscale = -128.f / max_scale;
	put16(b + 208, 1 / iscale);
	for (int ib = 0; ib < 16; ib++)
		sc[ib] = (int8_t)(nearest_int(iscale * scales[ib]) < 127 ? nearest_int(iscale * scales[ib]) : 127);
	for (int j = 0; j < 16; j++) {
		float d = fp16(b + 208) * sc[j];
		if (!d)
			continue;
		for (int i = 0; i < 16; i++)
			L[16 * j + i] = (int8_t)(clampi(nearest_int(x[16 * j + i] / d), -32, 31) + 32);
	}
	for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32)
		for (int l = 0; l < 32; l++) {
			int q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF, q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
			ql[l] = (uint8_t)(q1 | q3 << 4);
			ql[l + 32] = (uint8_t)(q2 | q4 << 4);
			qh[l] = (uint8_t)((L[j + l] >> 4) | (L[j + l + 32] >> 4) << 2 | (L[j + l + 64] >> 4) << 4 |
					  (L[j + l + 96] >> 4) << 6);
		}
}

void toast_quant(enum toast_dtype t, const float *src, void *dst, int64_t n)
{
	uint8_t *b = dst;
	void (*fn)(const float *, uint8_t *) = NULL;
	switch (t) {
	case TOAST_DT_F32: memcpy(dst, src, (size_t)n * sizeof(float)); return;
	case TOAST_DT_BF16:
		for (int64_t i = 0; i < n; i++)
			((uint16_t *)dst)[i] = toast_f32_to_bf16(src[i]);
		return;
	case TOAST_DT_F16:
		for (int64_t i = 0; i < n; i++)
			((uint16_t *)dst)[i] = toast_f32_to_f16(src[i]);
		return;
	case TOAST_DT_Q4_0: fn = q_q4_0; break;
	case TOAST_DT_Q4_1: fn = q_q4_1; break;
	case TOAST_DT_Q8_0: fn = q_q8_0; break;
	case TOAST_DT_Q4_K: fn = q_q4_k; break;
	case TOAST_DT_Q5_K: fn = q_q5_k; break;
	case TOAST_DT_Q6_K: fn = q_q6_k; break;
	default: return; /* MLX and plain integer types are not produced here */
	}
	int blck = toast_dtypes[t].blck, bs = toast_dtypes[t].type_size;
	for (int64_t i = 0; i < n / blck; i++)
		fn(src + i * blck, b + i * bs);
}

void toast_quant_mlx(int bits, int group_size, const float *src, int64_t n, uint32_t *q, float *scales,
		     float *biases)
{
	float n_bins = (float)((1 << bits) - 1);
	int per = 32 / bits;
	memset(q, 0, (size_t)(n / per) * sizeof(uint32_t));
	for (int64_t g = 0; g < n / group_size; g++) {
		const float *w = src + g * group_size;
		float w_min = INFINITY, w_max = -INFINITY;
		for (int j = 0; j < group_size; j++) {
			w_min = fminf(w_min, w[j]);
			w_max = fmaxf(w_max, w[j]);
		}
		bool neg_edge = fabsf(w_min) > fabsf(w_max);
		float scale = fmaxf((w_max - w_min) / n_bins, 1e-7f);
		scale = neg_edge ? scale : -scale;
		float edge = neg_edge ? w_min : w_max, q0 = rintf(edge / scale), bias = 0;
		if (q0 != 0) {
			scale = edge / q0;
			bias = edge;
		}
		for (int j = 0; j < group_size; j++) {
			float v = fminf(fmaxf(rintf((w[j] - bias) / scale), 0.0f), n_bins);
			int64_t k = g * group_size + j;
			q[k / per] |= (uint32_t)v << (k % per * bits);
		}
		scales[g] = scale;
		biases[g] = bias;
	}
}
