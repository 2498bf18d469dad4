/*
 * draw.h - the sampler's draw (repetition penalty, temperature, top-k, top-p, min-p, then one
 * uniform) over a few of the largest logits, written once for the host and the device: the
 * sampler (engine/sampler.c) draws with it on the host, and a backend's pick
 * (toast_backend_ops.pick) on the device, so that a draw chained on the GPU chooses exactly the
 * token the host would from the same logits and the same uniform.
 *
 * Exactness: only IEEE-rounded operations, each written out (the device's explicitly rounded
 * intrinsics, so that no multiply-add is contracted), and an exp of our own in double rounded
 * to float (the host's expf and the device's differ in their last bit). Order of every sum as
 * the sampler's. Plain C, and CUDA where __CUDACC__ (functions __host__ __device__).
 */
#ifndef TOAST_BACKEND_DRAW_H
#define TOAST_BACKEND_DRAW_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define TOAST_HD __host__ __device__
#else
#define TOAST_HD
#endif

/* One draw: from the n_top largest logits, each one seen lately lowered by repeat_penalty (CTRL's,
 * as the sampler's), the top_k best of them; temperature 0: the best, else each divided by
 * temperature, the nucleus of top_p, those at least min_p of the most likely, chosen by u in
 * [0, 1). The tokens seen lately are recent[0..n_recent) (oldest first) and, with prev, the
 * token of the pick before this one (still pending when this one is queued): the last last_n. */
struct toast_draw {
	float temperature, top_p, min_p;
	int top_k, n_top;
	double u;
	float repeat_penalty; /* 1: none */
	int last_n, n_recent;
	const int32_t *recent; /* (host memory) */
	bool prev;
};

TOAST_HD static inline double draw_mul(double a, double b)
{
#ifdef __CUDA_ARCH__
	return __dmul_rn(a, b);
#else
	return a * b;
#endif
}

TOAST_HD static inline double draw_add(double a, double b)
{
#ifdef __CUDA_ARCH__
	return __dadd_rn(a, b);
#else
	return a + b;
#endif
}

/* 2^k as a double, for -1022 <= k <= 1023 */
TOAST_HD static inline double draw_pow2(int k)
{
	uint64_t b = (uint64_t)(k + 1023) << 52;
	double v;
	memcpy(&v, &b, sizeof(v));
	return v;
}
/* exp(x) for x <= 0, as a float: x = k ln 2 + r (ln 2 in two parts, k ln2_hi exact), exp(r) by
 * Taylor's series to r^13 in double (|r| <= 0.35: error ~2e-16), scaled by 2^k. k is rounded to
 * nearest by adding and taking away 1.5 * 2^52, and 2^k made from its bits: rint's and ldexp's
 * answers here, without their calls (they were a fifth of sampling from every logit). */
TOAST_HD static inline float toast_draw_exp(float x)
{
	if (!(x > -104.0f)) /* (exp(-104) is below float's least subnormal) */
		return 0.0f;
	double k = draw_add(draw_add(draw_mul(x, 1.4426950408889634), 0x1.8p52), -0x1.8p52);
	double r = draw_add(x, -draw_mul(k, 6.93147180369123816490e-01)); /* (ln 2's upper part: k times it is exact) */
	r = draw_add(r, -draw_mul(k, 1.90821492927058770002e-10));
	double p = 1.0 / 6227020800.0; /* 1/13! */
	const double inv[13] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0,
				1.0 / 5040.0,      1.0 / 720.0,      1.0 / 120.0,     1.0 / 24.0,     1.0 / 6.0,
				0.5,               1.0,              1.0};
	for (int i = 0; i < 13; i++)
		p = draw_add(draw_mul(p, r), inv[i]);
	return (float)draw_mul(p, draw_pow2((int)k)); /* (exact: p * 2^k stays normal in double) */
}

/* the sum of p[0..k), in order */
TOAST_HD static inline double toast_draw_sum(const float *p, int k)
{
	double z = 0;
	for (int i = 0; i < k; i++)
		z = draw_add(z, p[i]);
	return z;
}
/* p[0..k) (logits already divided by the temperature) become exp(p - max); returns their sum
 * (each p[i] depends only on itself and the max: a device may make them in parallel) */
TOAST_HD static inline double toast_draw_probs(float *p, int k)
{
	float max = p[0];
	for (int i = 1; i < k; i++)
		max = p[i] > max ? p[i] : max;
	for (int i = 0; i < k; i++)
		p[i] = toast_draw_exp(p[i] - max);
	return toast_draw_sum(p, k);
}

/* The index in p[0..k) drawn by u (p from toast_draw_probs, z their sum over all candidates;
 * with top_p < 1, p sorted, larger first): the nucleus is each candidate while the mass before it
 * is below top_p; of it, min-p keeps those with p >= min_p (the most likely, 1, always). */
TOAST_HD static inline int toast_draw_tail(const float *p, int k, double z, float top_p, float min_p, double u)
{
	if (top_p < 1) {
		double cum = 0;
		int m = 0;
		while (m < k && cum < top_p)
			cum = draw_add(cum, p[m++] / z);
		k = m;
	}
	double keep_z = 0;
	int last = 0;
	for (int i = 0; i < k; i++)
		if (p[i] >= min_p || p[i] == 1.0f)
			keep_z = draw_add(keep_z, p[last = i]);
	double t = draw_mul(u, keep_z), acc = 0;
	for (int i = 0; i < k; i++) {
		if (!(p[i] >= min_p || p[i] == 1.0f))
			continue;
		acc = draw_add(acc, p[i]);
		if (t < acc)
			return i;
	}
	return last;
}

/* The draw d over vals[0..k) (k >= 1: the largest logits, larger first; d->temperature > 0),
 * p scratch of k: the index chosen. */
TOAST_HD static inline int toast_draw_top(const float *vals, int k, const struct toast_draw *d, float *p)
{
	for (int i = 0; i < k; i++)
		p[i] = vals[i] / d->temperature;
	double z = toast_draw_probs(p, k);
	return toast_draw_tail(p, k, z, d->top_p, d->min_p, d->u);
}

/* whether id is among the tokens seen lately (recent: d's, oldest first; prev: the pending
 * pick's token, when d->prev) */
TOAST_HD static inline bool toast_draw_seen(const struct toast_draw *d, const int32_t *recent, int32_t prev, int32_t id)
{
	if (d->prev && id == prev)
		return true;
	/* (prev pushes the oldest out of a full window) */
	for (int j = d->prev && d->n_recent >= d->last_n ? 1 : 0; j < d->n_recent; j++)
		if (recent[j] == id)
			return true;
	return false;
}

/* a logit so penalised (the sampler's repetition penalty) */
TOAST_HD static inline float toast_draw_penalize(float l, float penalty)
{
	return l > 0 ? l / penalty : l * penalty;
}

/* The draw d over the n largest logits (vals, ids: larger first, the lower id first among
 * equals, as top() gives them; both modified), prev the pending pick's token: the penalty,
 * the candidates sorted again, then the best or toast_draw_top over the top_k best. p scratch
 * of n. The token chosen, 0 when n is 0. (What a backend's pick makes on the device.) */
static inline int32_t toast_draw_pick(float *vals, int32_t *ids, int n, const struct toast_draw *d, int32_t prev,
				      float *p)
{
	if (n <= 0)
		return 0;
	if (d->repeat_penalty != 1.0f) {
		for (int i = 0; i < n; i++)
			if (toast_draw_seen(d, d->recent, prev, ids[i]))
				vals[i] = toast_draw_penalize(vals[i], d->repeat_penalty);
		for (int i = 1; i < n; i++) { /* insertion sort: larger first, then the lower id */
			float v = vals[i];
			int32_t id = ids[i];
			int j = i;
			for (; j > 0 && (vals[j - 1] < v || (vals[j - 1] == v && ids[j - 1] > id)); j--) {
				vals[j] = vals[j - 1];
				ids[j] = ids[j - 1];
			}
			vals[j] = v;
			ids[j] = id;
		}
	}
	if (d->temperature <= 0)
		return ids[0];
	int k = d->top_k > 0 && d->top_k < n ? d->top_k : n;
	return ids[toast_draw_top(vals, k, d, p)];
}

/* ---- the draw over every logit: top_k 0 or over TOAST_TOP_MAX, on the host and in a backend's
 * pick (d->n_top 0) ----
 * Its sums are of integers, so that they do not depend on their order and a device makes them in
 * parallel: each candidate's probability p (toast_draw_exp of its logit / temperature less the
 * largest's; the largest's is 1) weighs p * 2^40, truncated (a candidate under 2^-40 of the best
 * weighs 0: it is never drawn). The nucleus (top_p < 1) is every candidate whose logit is at
 * least that of the first candidate, from the largest logit down, at which the weights so far
 * exceed toast_draw_cut(top_p, z) of their sum z (equal logits are all in or all out); of it,
 * min-p keeps those with p >= min_p (the largest, 1, always); the token drawn by u is the first
 * kept candidate by index at which the kept weights so far exceed toast_draw_cut(u, their sum).
 * The nucleus' least logit is found as a device finds it: three rounds over the digits of the
 * logits' order (toast_draw_order; 11, 11 and 10 bits from the top), each summing the weights
 * of the candidates that have the digits found so far by their next digit. */

#define TOAST_DRAW_WIDE_MAX (1 << 23) /* logits at most: the weights' sum stays below 2^63 */

/* a logit's place in the order of top() and the picks (larger first, -0 as +0); 0 for NaN,
 * which is never a candidate */
TOAST_HD static inline uint32_t toast_draw_order(float v)
{
	uint32_t u;
	memcpy(&u, &v, sizeof(u));
	/* (no branches: the signs of logits are not predictable) */
	uint32_t o = u ^ ((uint32_t)((int32_t)u >> 31) | 0x80000000u); /* negative: every bit flipped */
	o = (u << 1) == 0 ? 0x80000000u : o;
	return (u & 0x7fffffffu) > 0x7f800000u ? 0u : o;
}

/* a logit's key in top()'s order: its order (toast_draw_order's) in the high word, the
 * complement of its index in the low (the lower index first among equals) */
TOAST_HD static inline uint64_t toast_draw_key(uint32_t o, int32_t i)
{
	return (uint64_t)o << 32 | (0xffffffffu - (uint32_t)i);
}

TOAST_HD static inline uint64_t toast_draw_weight(float p)
{
	return (uint64_t)draw_mul(p, 0x1p40); /* (exact before the truncation) */
}

/* the weight a share f in [0, 1] of z (> 0) is: the first candidate at which the weights so far
 * exceed it is drawn */
TOAST_HD static inline uint64_t toast_draw_cut(double f, uint64_t z)
{
	uint64_t c = (uint64_t)draw_mul(f, (double)z);
	return c < z ? c : z - 1;
}

/* round r (0, 1, 2) of the search for the nucleus' least logit: the digit of order o it sums by,
 * and whether o has the digits found before it (pre) */
TOAST_HD static inline unsigned toast_draw_digit(uint32_t o, int r)
{
	return r == 0 ? o >> 21 : r == 1 ? (o >> 10) & 0x7ffu : o & 0x3ffu;
}

TOAST_HD static inline bool toast_draw_has(uint32_t o, int r, uint32_t pre)
{
	return o != 0 && (r == 0 || o >> (r == 1 ? 21 : 10) == pre);
}

/* the digits found so far, with round r's d */
TOAST_HD static inline uint32_t toast_draw_pre(uint32_t pre, int r, unsigned d)
{
	return r == 0 ? d : pre << (r == 1 ? 11 : 10) | d;
}

/* The draw d (temperature > 0; its top_k and penalty are not used) over the candidates of x[0..n)
 * (n <= TOAST_DRAW_WIDE_MAX): those not NaN whose key, toast_draw_order's in the high word and
 * the complement of the index in the low (top()'s order), is at least kmin (0: every one). w:
 * scratch of 2n. The index chosen, 0 when there is no candidate. (Host code; a backend's pick
 * makes the same on the device. Here only the candidates that can change the answer are kept,
 * in order, after the first pass: not those whose weight is 0, nor, without a nucleus, those
 * min-p cannot keep; the kept weights are summed by 4,096, so that the draw walks one part.) */
static inline int32_t toast_draw_wide(const float *x, int n, uint64_t kmin, const struct toast_draw *d, uint64_t *w)
{
	enum { KEEP = 1, PART = 4096 }; /* w[j]: candidate j's weight << 1, whether p >= min_p; w[n + j] its index */
	uint32_t omax = 0;
	int best = 0;
	for (int i = 0; i < n; i++) {
		uint32_t o = toast_draw_order(x[i]);
		if (o > omax && toast_draw_key(o, i) >= kmin)
			omax = o, best = i;
	}
	if (omax == 0)
		return 0;
	bool nucleus = d->top_p < 1;
	float vmax = x[best] == 0.0f ? 0.0f : x[best], ymax = vmax / d->temperature;
	/* (below e^-28.5 a weight is 0; below min_p by more than the exp's error, p is not kept) */
	float low = !nucleus && d->min_p > 0 ? (float)log(d->min_p) - 1e-4f : -28.5f;
	uint64_t z = 0, h[2048] = {0};
	int m = 0;
	for (int i = 0; i < n; i++) {
		uint32_t o = toast_draw_order(x[i]);
		float y = x[i] / d->temperature - ymax;
		if (o == 0 || (y < low && x[i] != vmax) ||
		    (kmin && toast_draw_key(o, i) < kmin))
			continue;
		float p = x[i] == vmax ? 1.0f : toast_draw_exp(y);
		uint64_t wi = toast_draw_weight(p);
		w[m] = wi << 1 | (p >= d->min_p || p == 1.0f ? KEEP : 0);
		w[n + m++] = (uint64_t)i;
		z += wi;
		h[toast_draw_digit(o, 0)] += wi;
	}
	uint32_t least = 0; /* the nucleus' least order */
	if (nucleus) {
		uint64_t cut = toast_draw_cut(d->top_p, z), above = 0;
		for (int r = 0; r < 3; r++) {
			if (r > 0) {
				memset(h, 0, sizeof(h));
				for (int j = 0; j < m; j++) {
					uint32_t o = toast_draw_order(x[w[n + j]]);
					if (toast_draw_has(o, r, least))
						h[toast_draw_digit(o, r)] += w[j] >> 1;
				}
			}
			unsigned g = r == 2 ? 1023 : 2047;
			while (g > 0 && above + h[g] <= cut) /* (above <= cut < above + the sums: not 0) */
				above += h[g--];
			least = toast_draw_pre(least, r, g);
		}
	}
	for (int j = 0; j < m; j++) /* (those the nucleus leaves out are not kept) */
		if (least && toast_draw_order(x[w[n + j]]) < least)
			w[j] &= ~(uint64_t)KEEP;
	uint64_t part[TOAST_DRAW_WIDE_MAX / PART] = {0}, keep_z = 0, acc = 0;
	for (int j0 = 0; j0 < m; j0 += PART) {
		uint64_t s = 0;
		for (int j = j0; j < m && j < j0 + PART; j++)
			s += w[j] & KEEP ? w[j] >> 1 : 0;
		part[j0 / PART] = s;
		keep_z += s;
	}
	uint64_t cut = toast_draw_cut(d->u, keep_z);
	int j0 = 0;
	for (; acc + part[j0 / PART] <= cut; j0 += PART)
		acc += part[j0 / PART];
	for (int j = j0; j < m; j++)
		if ((w[j] & KEEP) && (acc += w[j] >> 1) > cut)
			return (int32_t)w[n + j];
	return best; /* (not reached: the kept weights sum to keep_z > cut) */
}

#endif
