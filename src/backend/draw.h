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

#endif
