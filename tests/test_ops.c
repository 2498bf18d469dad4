/*
 * test_ops.c - every backend op against a straightforward scalar reference (double precision)
 * on awkward shapes: odd sizes, one token, chunks that do not divide the sequence, state
 * carried across calls. Runs on the CPU backend with 1 and 3 threads, and on CUDA when the
 * build and the machine have it (SKIP otherwise, never OK).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "format/quant.h"
#include "test.h"
#include "util/half.h"

/* ---- helpers ---- */

static uint64_t rng_state = 88172645463325252ull;

static double rnd(void) /* uniform in [-1, 1) */
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (double)(rng_state >> 11) / (double)(1ull << 52) - 1.0;
}

static float bf16r(float x)
{
	return toast_bf16_to_f32(toast_f32_to_bf16(x));
}

/* host f32 array of n values in [-scale, scale), rounded to bf16 so every backend sees the same input */
static float *rand_vec(size_t n, double scale)
{
	float *v = malloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		v[i] = bf16r((float)(rnd() * scale));
	return v;
}

struct hw { /* a host weight and its values in f32 */
	struct toast_weight w;
	float *f;
};

/* the group size and scale type of the MLX weights mkw_quant makes (tests change them) */
static int mlx_gs = 64;
static enum toast_dtype mlx_sb = TOAST_DT_BF16;
/* > 0: test_moe's bf16 router rows repeat with this period, so the logits tie in groups (the
 * experts chosen among equal logits: the lower index first) */
static int moe_tie_period;
/* > 0: test_moe's token rows repeat with this period, so tokens choose the same experts in the
 * same slots (a step's kernels group a slot's tokens by expert) */
static int moe_tok_period;

/* scale or bias v stored as mlx_sb at p[i] */
static void mlx_sb_put(void *p, size_t i, float v)
{
	if (mlx_sb == TOAST_DT_F32)
		((float *)p)[i] = v;
	else
		((uint16_t *)p)[i] = mlx_sb == TOAST_DT_BF16 ? toast_f32_to_bf16(v) : toast_f32_to_f16(v);
}

/* a quantised weight: random values quantised by the reference quantisers (MLX: group mlx_gs,
 * mlx_sb scales), f their exact dequantisation */
static struct hw mkw_quant(enum toast_dtype type, int64_t n_out, int64_t n_in, double scale, double offset)
{
	struct hw h;
	size_t n = (size_t)(n_out * n_in);
	float *x = malloc((size_t)n_in * sizeof(float));
	h.f = malloc(n * sizeof(float));
	h.w = (struct toast_weight){.name = "test", .type = type, .n_in = n_in, .n_out = n_out};
	if (type == TOAST_DT_MLX4 || type == TOAST_DT_MLX8) {
		int bits = type == TOAST_DT_MLX4 ? 4 : 8, gs = mlx_gs;
		size_t ng = (size_t)n_out * (size_t)(n_in / gs), sbs = mlx_sb == TOAST_DT_F32 ? 4 : 2;
		uint32_t *q = malloc(n * (size_t)bits / 8);
		void *sc = malloc(ng * sbs), *bi = malloc(ng * sbs);
		float *fs = malloc((size_t)(n_in / gs) * sizeof(float)), *fb = malloc((size_t)(n_in / gs) * sizeof(float));
		for (int64_t r = 0; r < n_out; r++) {
			for (int64_t i = 0; i < n_in; i++)
				x[i] = (float)(offset + rnd() * scale);
			toast_quant_mlx(bits, gs, x, n_in, q + r * n_in * bits / 32, fs, fb);
			for (int64_t g = 0; g < n_in / gs; g++) {
				mlx_sb_put(sc, (size_t)(r * (n_in / gs) + g), fs[g]);
				mlx_sb_put(bi, (size_t)(r * (n_in / gs) + g), fb[g]);
			}
			toast_dequant_mlx(bits, gs, q + r * n_in * bits / 32, (char *)sc + (size_t)(r * (n_in / gs)) * sbs,
					  (char *)bi + (size_t)(r * (n_in / gs)) * sbs, mlx_sb, h.f + r * n_in, n_in);
		}
		h.w.data = q, h.w.scales = sc, h.w.biases = bi, h.w.sb_type = mlx_sb, h.w.group_size = gs;
		h.w.n_bytes = n * (size_t)bits / 8 + 2 * sbs * ng;
		free(fs), free(fb);
	} else {
		size_t rb = 0;
		toast_dtype_bytes(type, n_in, &rb);
		uint8_t *d = malloc(rb * (size_t)n_out);
		for (int64_t r = 0; r < n_out; r++) {
			for (int64_t i = 0; i < n_in; i++)
				x[i] = (float)(offset + rnd() * scale);
			toast_quant(type, x, d + r * rb, n_in);
		}
		toast_dequant(type, d, h.f, (int64_t)n);
		h.w.data = d, h.w.n_bytes = rb * (size_t)n_out;
	}
	free(x);
	return h;
}

static struct hw mkw(enum toast_dtype type, int64_t n_out, int64_t n_in, double scale, double offset)
{
	if (toast_dtype_is_quant(type))
		return mkw_quant(type, n_out, n_in, scale, offset);
	struct hw h;
	size_t n = (size_t)(n_out * n_in);
	h.f = malloc(n * sizeof(float));
	void *data = malloc(n * (type == TOAST_DT_F32 ? 4 : 2));
	for (size_t i = 0; i < n; i++) {
		float v = bf16r((float)(offset + rnd() * scale));
		h.f[i] = v;
		if (type == TOAST_DT_F32)
			((float *)data)[i] = v;
		else if (type == TOAST_DT_BF16)
			((uint16_t *)data)[i] = toast_f32_to_bf16(v);
		else
			((uint16_t *)data)[i] = toast_f32_to_f16(v), h.f[i] = toast_f16_to_f32(toast_f32_to_f16(v));
	}
	h.w = (struct toast_weight){.name = "test", .type = type, .n_in = n_in, .n_out = n_out, .data = data,
				    .n_bytes = n * (type == TOAST_DT_F32 ? 4 : 2)};
	return h;
}

static void freew(struct hw *h)
{
	free((void *)h->w.data);
	free((void *)h->w.scales);
	free((void *)h->w.biases);
	free(h->f);
}

static void *put(struct toast_backend *be, const float *x, size_t n, bool act)
{
	size_t es = act ? be->act_size : 4;
	void *d = be->ops->alloc(be, n * es + 16);
	if (!act || be->act_type == TOAST_DT_F32) {
		be->ops->write(be, d, x, n * 4);
	} else {
		uint16_t *t = malloc(n * 2);
		for (size_t i = 0; i < n; i++)
			t[i] = toast_f32_to_bf16(x[i]);
		be->ops->write(be, d, t, n * 2);
		free(t);
	}
	return d;
}

static float *get(struct toast_backend *be, const void *d, size_t n, bool act)
{
	float *x = malloc(n * sizeof(float));
	struct toast_error err;
	if (!act || be->act_type == TOAST_DT_F32) {
		CHECK(be->ops->read(be, x, d, n * 4, &err) == TOAST_OK, "read: %s", err.msg);
	} else {
		uint16_t *t = malloc(n * 2);
		CHECK(be->ops->read(be, t, d, n * 2, &err) == TOAST_OK, "read: %s", err.msg);
		for (size_t i = 0; i < n; i++)
			x[i] = toast_bf16_to_f32(t[i]);
		free(t);
	}
	return x;
}

static void prep(struct toast_backend *be, struct hw *h)
{
	struct toast_error err;
	CHECK(be->ops->prepare_weight(be, &h->w, &err) == TOAST_OK, "prepare: %s", err.msg);
}

/* max|a-b| / max|b|, NaN counts as failure */
/* max |a - b| relative to max |b|, or to floor where that is larger */
static double relerr_floor(const float *a, const double *b, size_t n, double floor)
{
	double mr = floor, md = 0;
	for (size_t i = 0; i < n; i++) {
		mr = fmax(mr, fabs(b[i]));
		double d = fabs(a[i] - b[i]);
		md = isnan(d) ? INFINITY : fmax(md, d);
	}
	return mr > 0 ? md / mr : md;
}

static double relerr(const float *a, const double *b, size_t n)
{
	return relerr_floor(a, b, n, 0);
}

static double dsilu(double x)
{
	return x / (1 + exp(-x));
}

static double dsig(double x)
{
	return 1 / (1 + exp(-x));
}

struct ctx {
	struct toast_backend *be;
	const char *name;
	double tol; /* relative error bound for this backend */
	/* test_matmul_types' values when not 0: the weights' and the norm weight's amplitude (0.1,
	 * 0.5), and spike: each input row's first element 1000x the rest (1e5x for f32 rows) */
	double w_amp, nw_amp;
	bool spike;
	bool xf; /* a plain input given as f32 rows (toast_mm_in.xf), not act */
};

/* ---- matmul (plain and with the fused RMSNorm input, several outputs, SiLU(gate) * up) ---- */

/* y = RMSNorm(x) per row in double */
static double *ref_norm(const float *x, const float *w, int T, int n, bool plus_one)
{
	double *y = malloc((size_t)T * n * sizeof(double));
	for (int t = 0; t < T; t++) {
		double ss = 0;
		for (int i = 0; i < n; i++)
			ss += (double)x[t * n + i] * x[t * n + i];
		double r = 1 / sqrt(ss / n + 1e-6);
		for (int i = 0; i < n; i++)
			y[t * n + i] = x[t * n + i] * r * (plus_one ? 1 + w[i] : w[i]);
	}
	return y;
}

/* n_outs outputs of one input, weight k of types[k]; normed: the input is RMSNorm(x) (norm_out
 * checked too); mode TOAST_MM_GLU: each output is SiLU(x · W) * (x · W2), W2 a second weight */
static double test_matmul_types(struct ctx *c, const enum toast_dtype *types, int T, const int *n_out, int n_outs,
				int n_in, enum toast_mm_mode mode, bool normed, bool plus_one)
{
	double emax = 0;
	struct toast_backend *be = c->be;
	float *x = rand_vec((size_t)T * n_in, normed ? 3 : 1);
	for (int t = 0; c->spike && t < T; t++) /* normed: past 65504 after the norm; f32 rows: as given */
		x[(size_t)t * n_in] *= normed ? 1000 : 1e5f;
	double nwa = c->nw_amp ? c->nw_amp : 0.5, wa = c->w_amp ? c->w_amp : 0.1;
	struct hw nw = mkw(TOAST_DT_BF16, 1, n_in, nwa, plus_one ? 0 : 2 * nwa);
	prep(be, &nw);
	double *in_ref = NULL;
	if (normed) {
		in_ref = ref_norm(x, nw.f, T, n_in, plus_one);
	} else {
		in_ref = malloc((size_t)T * n_in * sizeof(double));
		for (size_t i = 0; i < (size_t)T * n_in; i++)
			in_ref[i] = x[i];
	}
	bool xf = !normed && c->xf;
	for (size_t i = 0; xf && i < (size_t)T * n_in; i++) /* (rand_vec's values are bf16) */
		in_ref[i] = x[i] = x[i] * (1 + 1e-3f * (float)rnd());
	void *dx = put(be, x, (size_t)T * n_in, !normed && !xf);
	void *dnorm = normed ? be->ops->alloc(be, (size_t)T * n_in * be->act_size) : NULL;
	struct toast_mm_in in = {.act = normed || xf ? NULL : dx, .xf = xf ? dx : NULL, .norm_x = normed ? dx : NULL,
				 .norm_w = &nw.w, .eps = 1e-6f, .plus_one = plus_one, .norm_out = dnorm};
	struct toast_mm_out outs[TOAST_MM_MAX_OUT];
	struct hw w[TOAST_MM_MAX_OUT], w2[TOAST_MM_MAX_OUT];
	float *y0[TOAST_MM_MAX_OUT];
	bool act_out = mode == TOAST_MM_ACT || mode == TOAST_MM_GLU, glu = mode == TOAST_MM_GLU;
	for (int k = 0; k < n_outs; k++) {
		w[k] = mkw(types[k], n_out[k], n_in, wa, 0);
		prep(be, &w[k]);
		if (glu) {
			w2[k] = mkw(types[k], n_out[k], n_in, wa, 0);
			prep(be, &w2[k]);
		}
		y0[k] = rand_vec((size_t)T * n_out[k], 1);
		outs[k] = (struct toast_mm_out){put(be, y0[k], (size_t)T * n_out[k], act_out), mode, &w[k].w,
						glu ? &w2[k].w : NULL};
	}
	be->ops->matmul(be, &in, outs, n_outs, T);
	for (int k = 0; k < n_outs; k++) {
		float *y = get(be, outs[k].out, (size_t)T * n_out[k], act_out);
		double *ref = malloc((size_t)T * n_out[k] * sizeof(double));
		double typ = 0; /* the typical size of such a dot product: one output row may be near 0 */
		for (int t = 0; t < T; t++)
			for (int r = 0; r < n_out[k]; r++) {
				double s = 0, s2 = 0, su = 0, su2 = 0;
				for (int i = 0; i < n_in; i++) {
					double p = (double)w[k].f[(size_t)r * n_in + i] * in_ref[(size_t)t * n_in + i];
					s += p;
					s2 += p * p;
					if (glu) {
						double q = (double)w2[k].f[(size_t)r * n_in + i] * in_ref[(size_t)t * n_in + i];
						su += q;
						su2 += q * q;
					}
				}
				typ = fmax(typ, glu ? sqrt(s2) * sqrt(su2) : sqrt(s2));
				ref[(size_t)t * n_out[k] + r] =
					glu ? dsilu(s) * su : (mode == TOAST_MM_ADD ? y0[k][(size_t)t * n_out[k] + r] : 0) + s;
			}
		double e = relerr_floor(y, ref, (size_t)T * n_out[k], typ);
		emax = fmax(emax, e);
		CHECK(e < c->tol, "%s matmul %s T=%d out %d/%d %dx%d mode %d normed %d: error %.3g", c->name,
		      toast_dtype_name(types[k]), T, k, n_outs, n_out[k], n_in, mode, normed, e);
		be->ops->release(be, outs[k].out);
		free(y), free(ref), free(y0[k]), freew(&w[k]);
		if (glu)
			freew(&w2[k]);
	}
	if (normed) {
		float *yn = get(be, dnorm, (size_t)T * n_in, true);
		double e = relerr(yn, in_ref, (size_t)T * n_in);
		double tol = fmax(c->tol, 4e-3); /* (activations: bf16 on a GPU) */
		CHECK(e < tol, "%s matmul norm_out T=%d n=%d: error %.3g", c->name, T, n_in, e);
		free(yn);
	}
	be->ops->release(be, dx);
	be->ops->release(be, dnorm);
	free(x), free(in_ref), freew(&nw);
	return emax;
}

/* test_matmul_types with one type; returns the largest output error */
static double test_matmul(struct ctx *c, enum toast_dtype type, int T, const int *n_out, int n_outs, int n_in,
			  enum toast_mm_mode mode, bool normed, bool plus_one)
{
	enum toast_dtype types[TOAST_MM_MAX_OUT];
	for (int k = 0; k < n_outs; k++)
		types[k] = type;
	return test_matmul_types(c, types, T, n_out, n_outs, n_in, mode, normed, plus_one);
}

/* Products of a normed input or f32 rows (DeltaNet's output into out_proj) held to 1e-3, where
 * bf16 operands give 1.1-2.9e-3 (H100; fp16 ones 4.3e-4): they feed DeltaNet's and attention's
 * f32 math, or carry DeltaNet's output, the rounding the models are most sensitive to. Prefill
 * sizes (cuBLAS on a GPU) and decode ones of bf16 weights (f32 GEMVs); rows of any length; then
 * values fp16 cannot hold unscaled: inputs and weights beyond 65504, weights in its subnormal
 * range. Prints the largest error. (Quantised weights at decode read f32 rows in bf16 on a GPU:
 * test_quant.) */
static void test_matmul_precise(struct ctx *c)
{
	struct ctx p = *c;
	p.tol = fmin(c->tol, 1e-3);
	p.xf = true; /* (the cases not normed take f32 rows) */
	int o2[] = {512, 96}, o1[] = {256};
	double e = test_matmul(&p, TOAST_DT_BF16, 64, o2, 2, 2048, TOAST_MM_F32, true, true);
	e = fmax(e, test_matmul(&p, TOAST_DT_Q4_K, 33, o2, 2, 2048, TOAST_MM_F32, true, false));
	e = fmax(e, test_matmul(&p, TOAST_DT_MLX4, 17, o1, 1, 1024, TOAST_MM_F32, true, true));
	e = fmax(e, test_matmul(&p, TOAST_DT_Q6_K, 12, o1, 1, 512, TOAST_MM_ADD, true, false));
	e = fmax(e, test_matmul(&p, TOAST_DT_BF16, 20, o2, 2, 100, TOAST_MM_F32, true, true));
	e = fmax(e, test_matmul(&p, TOAST_DT_BF16, 9, o1, 1, 37, TOAST_MM_ADD, true, false));
	e = fmax(e, test_matmul(&p, TOAST_DT_BF16, 1, o1, 1, 4096, TOAST_MM_ADD, false, false));
	e = fmax(e, test_matmul(&p, TOAST_DT_BF16, 5, o2, 2, 1024, TOAST_MM_F32, false, false));
	e = fmax(e, test_matmul(&p, TOAST_DT_BF16, 40, o1, 1, 4096, TOAST_MM_ADD, false, false));
	e = fmax(e, test_matmul(&p, TOAST_DT_Q4_K, 20, o2, 2, 1024, TOAST_MM_ADD, false, false));
	e = fmax(e, test_matmul(&p, TOAST_DT_BF16, 12, o1, 1, 100, TOAST_MM_F32, false, false));
	p.w_amp = 1e5, p.nw_amp = 3000, p.spike = true;
	e = fmax(e, test_matmul(&p, TOAST_DT_BF16, 16, o1, 1, 1024, TOAST_MM_F32, true, false));
	e = fmax(e, test_matmul(&p, TOAST_DT_BF16, 16, o1, 1, 1024, TOAST_MM_F32, false, false)); /* rows past 65504 */
	p.w_amp = 1e-6, p.nw_amp = 0, p.spike = false;
	e = fmax(e, test_matmul(&p, TOAST_DT_BF16, 16, o1, 1, 1024, TOAST_MM_F32, true, true));
	printf("%s: products of normed inputs and f32 rows, largest error %.3g (bound %.3g)\n", c->name, e, p.tol);
}

/* rows of a (quantised) table for the step's ids */
static void test_embed(struct ctx *c, enum toast_dtype type, int n_vocab, int n)
{
	struct toast_backend *be = c->be;
	struct hw w = mkw(type, n_vocab, n, 1, 0);
	prep(be, &w);
	int32_t ids[] = {0, n_vocab - 1, 3, 3, 17 % n_vocab};
	int T = 5;
	float *dx = be->ops->alloc(be, (size_t)T * n * sizeof(float));
	be->ops->begin_step(be, ids, T, 0);
	be->ops->embed(be, dx, &w.w, T);
	float *x = get(be, dx, (size_t)T * n, false);
	double *ref = malloc((size_t)T * n * sizeof(double));
	for (int t = 0; t < T; t++)
		for (int i = 0; i < n; i++)
			ref[(size_t)t * n + i] = w.f[(size_t)ids[t] * n + i];
	double e = relerr(x, ref, (size_t)T * n);
	CHECK(e < 1e-5, "%s embed %s %dx%d: error %.3g", c->name, toast_dtype_name(type), n_vocab, n, e);
	be->ops->release(be, dx);
	free(x), free(ref), freew(&w);
}

/* a synthetic quantised weight made by the backend: its product with an input against the
 * bytes the CPU definition gives (a differing scale field would show); the CPU backend's bytes
 * are compared exactly (the CUDA backend's split layouts: test_cuda_layout) */
static void test_synthetic(struct ctx *c, enum toast_dtype type, int n_out, int n_in)
{
	struct toast_backend *be = c->be;
	const char *name = "blk.7.synthetic.weight";
	struct toast_weight w, hw;
	toast_synthetic_weight(&w, name, type, n_out, n_in);
	toast_synthetic_weight(&hw, name, type, n_out, n_in);
	void *buf = malloc(hw.n_bytes);
	toast_synthetic_fill_quant(&hw, buf);
	float *f = malloc((size_t)n_out * n_in * sizeof(float));
	if (type == TOAST_DT_MLX4 || type == TOAST_DT_MLX8) {
		int bits = type == TOAST_DT_MLX4 ? 4 : 8, ng = n_in / hw.group_size;
		for (int r = 0; r < n_out; r++)
			toast_dequant_mlx(bits, hw.group_size, (const uint32_t *)hw.data + (size_t)r * n_in * bits / 32,
					  (const uint16_t *)hw.scales + (size_t)r * ng, (const uint16_t *)hw.biases + (size_t)r * ng,
					  hw.sb_type, f + (size_t)r * n_in, n_in);
	} else {
		toast_dequant(type, hw.data, f, (int64_t)n_out * n_in);
	}
	struct toast_error err;
	CHECK(be->ops->prepare_weight(be, &w, &err) == TOAST_OK, "synthetic %s: %s", toast_dtype_name(type), err.msg);
	if (strcmp(be->name, "cpu") == 0) {
		CHECK(w.data && memcmp(w.data, buf, hw.n_bytes) == 0, "%s synthetic %s: bytes differ from the definition",
		      c->name, toast_dtype_name(type));
	}
	float *x = rand_vec((size_t)n_in, 1);
	void *dx = put(be, x, (size_t)n_in, true);
	float *dy = be->ops->alloc(be, (size_t)n_out * sizeof(float));
	struct toast_mm_in in = {.act = dx};
	struct toast_mm_out o = {.out = dy, .mode = TOAST_MM_F32, .W = &w};
	be->ops->matmul(be, &in, &o, 1, 1);
	float *y = get(be, dy, (size_t)n_out, false);
	double *ref = malloc((size_t)n_out * sizeof(double));
	for (int r = 0; r < n_out; r++) {
		ref[r] = 0;
		for (int i = 0; i < n_in; i++)
			ref[r] += (double)f[(size_t)r * n_in + i] * x[i];
	}
	double e = relerr(y, ref, (size_t)n_out);
	CHECK(e < c->tol, "%s synthetic %s %dx%d: error %.3g", c->name, toast_dtype_name(type), n_out, n_in, e);
	be->ops->release(be, dx), be->ops->release(be, dy);
	free(buf), free(f), free(x), free(y), free(ref);
}

/* ---- attention: two calls (T1 then T2 tokens) against one reference over T1+T2 ---- */

static void ref_head_norm(double *x, int n, const float *w, bool p1)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += x[i] * x[i];
	double r = 1 / sqrt(ss / n + 1e-6);
	for (int i = 0; i < n; i++)
		x[i] = x[i] * r * (p1 ? 1 + w[i] : w[i]);
}

static void ref_rope(double *x, int n_rot, int pos, double theta)
{
	int h = n_rot / 2;
	for (int i = 0; i < h; i++) {
		float inv = bf16r(1.0f / powf((float)theta, (float)(2 * i) / (float)n_rot));
		double a = (double)((float)pos * inv);
		double x0 = x[i], x1 = x[i + h];
		x[i] = x0 * cos(a) - x1 * sin(a);
		x[i + h] = x1 * cos(a) + x0 * sin(a);
	}
}

/* span_min > 0: the span is at least that (a recorded decode step early in a long context: more
 * splits than keys, some of them empty). kv: the cache's type; an 8-bit cache is read back and
 * checked against the reference's K and V (its layout, its codes within one step), and the
 * reference attends over what it holds. */
static void test_attention(struct ctx *c, int n_head, int n_head_kv, int hd, int n_rot, bool gated, bool qk_norm,
			   int T1, int T2, int span_min, enum toast_kv_type kv)
{
	struct toast_backend *be = c->be;
	int T = T1 + T2, kvd = n_head_kv * hd, qs = gated ? 2 * hd : hd, n_ctx = T + 3 + span_min;
	float *q = rand_vec((size_t)T * n_head * qs, 2), *k = rand_vec((size_t)T * kvd, 2), *v = rand_vec((size_t)T * kvd, 1);
	struct hw qn = mkw(TOAST_DT_BF16, 1, hd, 0.3, 0), kn = mkw(TOAST_DT_BF16, 1, hd, 0.3, 0);
	prep(be, &qn), prep(be, &kn);
	size_t kvb = toast_kv_bytes(kv, n_head_kv, hd, be->act_size, n_ctx);
	void *kc = be->ops->alloc(be, kvb), *vc = be->ops->alloc(be, kvb);
	float *out = malloc((size_t)T * n_head * hd * sizeof(float));
	int done = 0;
	for (int part = 0; part < 2; part++) {
		int n = part ? T2 : T1;
		if (!n)
			continue;
		float *dq = put(be, q + (size_t)done * n_head * qs, (size_t)n * n_head * qs, false);
		float *dk = put(be, k + (size_t)done * kvd, (size_t)n * kvd, false);
		float *dv = put(be, v + (size_t)done * kvd, (size_t)n * kvd, false);
		void *dout = be->ops->alloc(be, (size_t)n * n_head * hd * be->act_size);
		int32_t *ids = calloc((size_t)n, sizeof(int32_t));
		be->ops->begin_step(be, ids, n, done); /* the step carries pos to a backend that records steps */
		free(ids);
		/* the span the keys fit in, in whole 256s (decode: that many splits of 256), or the cache */
		int span = (done + n + 255) / 256 * 256;
		span = span < span_min ? span_min : span;
		struct toast_attn_args a = {dq, dk, dv, qk_norm ? &qn.w : NULL, qk_norm ? &kn.w : NULL, true, 1e-6f,
					    n_head, n_head_kv, hd, n_rot, 10000.0f, TOAST_DT_BF16, gated, kv, kc, vc, n_ctx, done, n,
					    dout, span < n_ctx ? span : 0};
		be->ops->attention(be, &a);
		float *o = get(be, dout, (size_t)n * n_head * hd, true);
		memcpy(out + (size_t)done * n_head * hd, o, (size_t)n * n_head * hd * sizeof(float));
		free(o);
		be->ops->release(be, dq), be->ops->release(be, dk), be->ops->release(be, dv), be->ops->release(be, dout);
		done += n;
	}
	/* reference */
	double *K = malloc((size_t)T * kvd * sizeof(double)), *ref = malloc((size_t)T * n_head * hd * sizeof(double));
	double *Q = malloc((size_t)hd * sizeof(double)), *sc = malloc((size_t)T * sizeof(double));
	for (int t = 0; t < T; t++)
		for (int h = 0; h < n_head_kv; h++) {
			double *kk = K + (size_t)t * kvd + h * hd;
			for (int d = 0; d < hd; d++)
				kk[d] = k[(size_t)t * kvd + h * hd + d];
			if (qk_norm)
				ref_head_norm(kk, hd, kn.f, true);
			ref_rope(kk, n_rot, t, 10000.0);
		}
	double *V = malloc((size_t)T * kvd * sizeof(double));
	for (size_t i = 0; i < (size_t)T * kvd; i++)
		V[i] = v[i];
	if (kv == TOAST_KV_Q8) {
		unsigned char *hk = malloc(kvb), *hv = malloc(kvb);
		struct toast_error err;
		CHECK(be->ops->read(be, hk, kc, kvb, &err) == TOAST_OK && be->ops->read(be, hv, vc, kvb, &err) == TOAST_OK,
		      "read the cache");
		float *row = malloc((size_t)hd * sizeof(float));
		double worst = 0;
		for (int t = 0; t < T; t++)
			for (int h = 0; h < n_head_kv; h++)
				for (int is_v = 0; is_v < 2; is_v++) {
					double *x = (is_v ? V : K) + (size_t)t * kvd + h * hd, amax = 0;
					toast_kv_q8_get(is_v ? hv : hk, n_head_kv, hd, is_v, t, h, row);
					for (int d = 0; d < hd; d++)
						amax = fmax(amax, fabs(x[d]));
					for (int d = 0; d < hd; d++) { /* within half a code step (and the f32 K of the op) */
						worst = fmax(worst, fabs(row[d] - x[d]) / (amax / 127));
						x[d] = row[d];
					}
				}
		CHECK(worst < 0.52, "%s 8-bit cache heads %d hd %d T %d: off by %.3g of a code step", c->name, n_head_kv, hd, T,
		      worst);
		free(hk), free(hv), free(row);
	}
	for (int t = 0; t < T; t++)
		for (int h = 0; h < n_head; h++) {
			const float *qq = q + ((size_t)t * n_head + h) * qs;
			for (int d = 0; d < hd; d++)
				Q[d] = qq[d];
			if (qk_norm)
				ref_head_norm(Q, hd, qn.f, true);
			ref_rope(Q, n_rot, t, 10000.0);
			int kvh = h / (n_head / n_head_kv);
			double mx = -INFINITY, sum = 0;
			for (int j = 0; j <= t; j++) {
				double s = 0;
				for (int d = 0; d < hd; d++)
					s += Q[d] * K[(size_t)j * kvd + kvh * hd + d];
				sc[j] = s / sqrt(hd);
				mx = fmax(mx, sc[j]);
			}
			for (int j = 0; j <= t; j++)
				sum += sc[j] = exp(sc[j] - mx);
			for (int d = 0; d < hd; d++) {
				double o = 0;
				for (int j = 0; j <= t; j++)
					o += sc[j] / sum * V[(size_t)j * kvd + kvh * hd + d];
				if (gated)
					o *= dsig(qq[hd + d]);
				ref[((size_t)t * n_head + h) * hd + d] = o;
			}
		}
	double e = relerr(out, ref, (size_t)T * n_head * hd);
	CHECK(e < c->tol, "%s attention%s heads %d/%d hd %d rot %d gated %d norm %d T %d+%d: error %.3g", c->name,
	      kv == TOAST_KV_Q8 ? " (8-bit cache)" : "", n_head, n_head_kv, hd, n_rot, gated, qk_norm, T1, T2, e);
	be->ops->release(be, kc), be->ops->release(be, vc);
	free(q), free(k), free(v), free(out), free(K), free(V), free(ref), free(Q), free(sc), freew(&qn), freew(&kn);
}

/* ---- gated deltanet: several calls against the token recurrence ---- */

struct gdn_shape {
	int nk, nv, dk, dv, K;
	bool grouped;
	bool tiled; /* value head h reads key head h % nk */
	bool keep;  /* the states after each token of a part but its last kept and checked */
};

static void test_gdn(struct ctx *c, struct gdn_shape sh, const int *parts, int n_parts)
{
	struct toast_backend *be = c->be;
	int nk = sh.nk, nv = sh.nv, dk = sh.dk, dv = sh.dv, K = sh.K, r = nv / nk;
	int key_dim = nk * dk, vdim = nv * dv, conv_dim = 2 * key_dim + vdim, T = 0;
	for (int i = 0; i < n_parts; i++)
		T += parts[i];
	/* flat inputs; the grouped layout is built from them */
	float *xin = rand_vec((size_t)T * conv_dim, 1), *z = rand_vec((size_t)T * vdim, 2);
	float *b = rand_vec((size_t)T * nv, 2), *av = rand_vec((size_t)T * nv, 2);
	struct hw cw = mkw(TOAST_DT_BF16, conv_dim, K, 0.5, 0), Al = mkw(TOAST_DT_F32, 1, nv, 0.5, 0);
	struct hw dt = mkw(TOAST_DT_BF16, 1, nv, 0.5, 0), nw = mkw(TOAST_DT_BF16, 1, dv, 0.3, 1);
	prep(be, &cw), prep(be, &Al), prep(be, &dt), prep(be, &nw);
	float *conv = be->ops->alloc(be, 2 * (size_t)(K - 1) * conv_dim * sizeof(float));
	float *ssm = be->ops->alloc(be, (size_t)nv * dv * dk * 4);
	float *out = malloc((size_t)T * vdim * sizeof(float));
	/* the output projection right after it, as the model has it: added to the residual stream,
	 * in Q4_K where the width allows (on a GPU the tensor-core GEMV, its f32 input rounded to
	 * bf16: 4e-3; 1e-3 for bf16 weights, whose prefill products take the output as fp16 scaled
	 * by its largest |value|) of the product of the output the backend gave */
	enum { NP = 40 };
	bool pq = vdim % 256 == 0;
	struct hw pw = mkw(pq ? TOAST_DT_Q4_K : TOAST_DT_BF16, NP, vdim, 0.5, 0);
	prep(be, &pw);
	double pe = 0;
	int done = 0;
	size_t n_S = (size_t)nv * dv * dk, n_cw = (size_t)(K - 1) * conv_dim;
	float *keep_S = sh.keep ? calloc((size_t)T * n_S, sizeof(float)) : NULL;
	float *keep_c = sh.keep ? calloc((size_t)T * n_cw, sizeof(float)) : NULL;
	for (int pi = 0; pi < n_parts; pi++) {
		int n = parts[pi];
		float *qkv, *zz = z + (size_t)done * vdim, *bb = b + (size_t)done * nv, *aa = av + (size_t)done * nv, *ba;
		if (sh.grouped) {
			int G = 2 * dk + 2 * r * dv;
			qkv = malloc((size_t)n * (conv_dim + vdim) * sizeof(float));
			ba = malloc((size_t)n * 2 * nv * sizeof(float));
			for (int t = 0; t < n; t++) {
				const float *x = xin + (size_t)(done + t) * conv_dim;
				float *row = qkv + (size_t)t * (conv_dim + vdim);
				for (int g = 0; g < nk; g++) {
					for (int i = 0; i < dk; i++) {
						row[g * G + i] = x[g * dk + i];
						row[g * G + dk + i] = x[key_dim + g * dk + i];
					}
					for (int i = 0; i < r * dv; i++) {
						row[g * G + 2 * dk + i] = x[2 * key_dim + g * r * dv + i];
						row[g * G + 2 * dk + r * dv + i] = zz[(size_t)t * vdim + g * r * dv + i];
					}
					for (int j = 0; j < r; j++) {
						ba[(size_t)t * 2 * nv + g * 2 * r + j] = bb[(size_t)t * nv + g * r + j];
						ba[(size_t)t * 2 * nv + g * 2 * r + r + j] = aa[(size_t)t * nv + g * r + j];
					}
				}
			}
		} else {
			qkv = malloc((size_t)n * conv_dim * sizeof(float));
			memcpy(qkv, xin + (size_t)done * conv_dim, (size_t)n * conv_dim * sizeof(float));
			ba = NULL;
		}
		float *dqkv = put(be, qkv, (size_t)n * (conv_dim + (sh.grouped ? vdim : 0)), false);
		float *dz = sh.grouped ? NULL : put(be, zz, (size_t)n * vdim, false);
		float *db = sh.grouped ? put(be, ba, (size_t)n * 2 * nv, false) : put(be, bb, (size_t)n * nv, false);
		float *da = sh.grouped ? NULL : put(be, aa, (size_t)n * nv, false);
		float *dout = be->ops->alloc(be, (size_t)n * vdim * sizeof(float));
		int32_t *ids = calloc((size_t)n, sizeof(int32_t));
		float *resid = rand_vec((size_t)n * NP, 1);
		float *dp = put(be, resid, (size_t)n * NP, false);
		be->ops->begin_step(be, ids, n, done); /* the step carries pos to a backend that records steps */
		free(ids);
		struct toast_gdn_args a = {dqkv, dz, db, da, sh.grouped, sh.grouped, &cw.w, &Al.w, false, &dt.w, &nw.w,
					   nk, nv, dk, dv, K, 1e-6f, conv, ssm, done, n, dout, sh.tiled, NULL, NULL};
		if (sh.keep && n > 1) {
			a.ssm_keep = be->ops->alloc(be, (n - 1) * n_S * sizeof(float));
			a.conv_keep = be->ops->alloc(be, (n - 1) * n_cw * sizeof(float));
		}
		be->ops->gdn(be, &a);
		if (a.ssm_keep) {
			float *ks = get(be, a.ssm_keep, (n - 1) * n_S, false), *kc = get(be, a.conv_keep, (n - 1) * n_cw, false);
			memcpy(keep_S + (size_t)done * n_S, ks, (n - 1) * n_S * sizeof(float));
			memcpy(keep_c + (size_t)done * n_cw, kc, (n - 1) * n_cw * sizeof(float));
			free(ks), free(kc);
			be->ops->release(be, a.ssm_keep), be->ops->release(be, a.conv_keep);
		}
		struct toast_mm_in pin = {.xf = dout}; /* right after it, as in the model */
		struct toast_mm_out po = {.out = dp, .mode = TOAST_MM_ADD, .W = &pw.w};
		be->ops->matmul(be, &pin, &po, 1, n);
		float *o = get(be, dout, (size_t)n * vdim, false);
		memcpy(out + (size_t)done * vdim, o, (size_t)n * vdim * sizeof(float));
		float *pr = get(be, dp, (size_t)n * NP, false);
		double *pref = calloc((size_t)n * NP, sizeof(double));
		for (int t = 0; t < n; t++)
			for (int i = 0; i < NP; i++) {
				pref[t * NP + i] = resid[t * NP + i];
				for (int j = 0; j < vdim; j++)
					pref[t * NP + i] += (double)o[(size_t)t * vdim + j] * pw.f[(size_t)i * vdim + j];
			}
		pe = fmax(pe, relerr(pr, pref, (size_t)n * NP));
		be->ops->release(be, dp);
		free(resid), free(pr), free(pref), free(o), free(qkv), free(ba);
		be->ops->release(be, dqkv), be->ops->release(be, dz), be->ops->release(be, db), be->ops->release(be, da);
		be->ops->release(be, dout);
		done += n;
	}
	/* reference: token recurrence in double, S[h][i][j] (i key, j value) */
	double *S = calloc((size_t)nv * dk * dv, sizeof(double)), *ref = malloc((size_t)T * vdim * sizeof(double));
	double *cv = malloc((size_t)conv_dim * sizeof(double)), *o = malloc((size_t)dv * sizeof(double));
	for (int t = 0; t < T; t++) {
		for (int ch = 0; ch < conv_dim; ch++) {
			double s = 0;
			for (int j = 0; j < K; j++) {
				int tt = t - (K - 1) + j;
				s += tt >= 0 ? (double)cw.f[(size_t)ch * K + j] * xin[(size_t)tt * conv_dim + ch] : 0;
			}
			cv[ch] = dsilu(s);
		}
		for (int g = 0; g < nk; g++) {
			double sq = 0, sk = 0;
			for (int i = 0; i < dk; i++) {
				sq += cv[g * dk + i] * cv[g * dk + i];
				sk += cv[key_dim + g * dk + i] * cv[key_dim + g * dk + i];
			}
			for (int i = 0; i < dk; i++) {
				cv[g * dk + i] /= sqrt(sq + 1e-6) * sqrt(dk);
				cv[key_dim + g * dk + i] /= sqrt(sk + 1e-6);
			}
		}
		for (int h = 0; h < nv; h++) {
			int kh = sh.tiled ? h % nk : h / r;
			double beta = dsig(b[(size_t)t * nv + h]);
			double x = av[(size_t)t * nv + h] + dt.f[h];
			double g = -exp(Al.f[h]) * (x > 20 ? x : log1p(exp(x))), alpha = exp(g);
			double *Sh = S + (size_t)h * dk * dv, *qv = cv + kh * dk, *kv = cv + key_dim + kh * dk;
			double *vv = cv + 2 * key_dim + h * dv;
			for (int j = 0; j < dv; j++) {
				double m = 0;
				for (int i = 0; i < dk; i++)
					m += (Sh[i * dv + j] *= alpha) * kv[i];
				double d = beta * (vv[j] - m);
				o[j] = 0;
				for (int i = 0; i < dk; i++) {
					Sh[i * dv + j] += kv[i] * d;
					o[j] += Sh[i * dv + j] * qv[i];
				}
			}
			double ss = 0;
			for (int j = 0; j < dv; j++)
				ss += o[j] * o[j];
			double rr = 1 / sqrt(ss / dv + 1e-6);
			for (int j = 0; j < dv; j++)
				ref[(size_t)t * vdim + h * dv + j] = o[j] * rr * nw.f[j] * dsilu(z[(size_t)t * vdim + h * dv + j]);
		}
		/* a kept state: token t is not the last of its part */
		bool kept = false;
		for (int pi = 0, d0 = 0; sh.keep && pi < n_parts; d0 += parts[pi++])
			kept = kept || (t >= d0 && t < d0 + parts[pi] - 1);
		if (kept) {
			double es = 0, ec = 0, ms = 0;
			for (int h = 0; h < nv; h++)
				for (int j = 0; j < dv; j++)
					for (int i = 0; i < dk; i++) {
						double r = S[((size_t)h * dk + i) * dv + j];
						es = fmax(es, fabs(keep_S[(size_t)t * n_S + ((size_t)h * dv + j) * dk + i] - r));
						ms = fmax(ms, fabs(r));
					}
			for (int j = 0; j < K - 1; j++)
				for (int ch = 0; ch < conv_dim; ch++) {
					int tt = t - (K - 2) + j;
					double r = tt >= 0 ? xin[(size_t)tt * conv_dim + ch] : 0;
					ec = fmax(ec, fabs(keep_c[((size_t)t * (K - 1) + j) * conv_dim + ch] - r));
				}
			CHECK(es <= 1e-4 * ms && ec == 0, "%s gdn nk %d nv %d dk %d dv %d K %d: the state kept after token %d: "
			      "error %.3g (of %.3g), conv window %.3g", c->name, nk, nv, dk, dv, K, t, es, ms, ec);
		}
	}
	double e = relerr(out, ref, (size_t)T * vdim);
	char pdesc[64] = "", *pp = pdesc;
	for (int i = 0; i < n_parts && pp < pdesc + 50; i++)
		pp += sprintf(pp, "%s%d", i ? "+" : "", parts[i]);
	CHECK(e < c->tol * 3, "%s gdn nk %d nv %d dk %d dv %d K %d grouped %d tiled %d T %s: error %.3g", c->name, nk, nv,
	      dk, dv, K, sh.grouped, sh.tiled, pdesc, e);
	CHECK(pe < (pq ? 4e-3 : 1e-3), "%s gdn nk %d nv %d dk %d dv %d T %s, its output projected (%s): error %.3g",
	      c->name, nk, nv, dk, dv, pdesc, pq ? "Q4_K" : "bf16", pe);
	/* the final state too */
	float *st = get(be, ssm, (size_t)nv * dv * dk, false);
	double *sref = malloc((size_t)nv * dv * dk * sizeof(double));
	for (int h = 0; h < nv; h++)
		for (int j = 0; j < dv; j++)
			for (int i = 0; i < dk; i++)
				sref[((size_t)h * dv + j) * dk + i] = S[((size_t)h * dk + i) * dv + j];
	/* the state is f32 on every backend (no 16-bit rounding on its path), so it is held to f32's
	 * accuracy and not to the activations' tolerance */
	e = relerr(st, sref, (size_t)nv * dv * dk);
	CHECK(e < (c->tol * 3 < 1e-4 ? c->tol * 3 : 1e-4), "%s gdn state nk %d nv %d dk %d dv %d T %s: error %.3g",
	      c->name, nk, nv, dk, dv, pdesc, e);
	be->ops->release(be, conv), be->ops->release(be, ssm);
	free(st), free(sref), free(xin), free(z), free(b), free(av), free(out), free(S), free(ref), free(cv), free(o);
	free(keep_S), free(keep_c);
	freew(&cw), freew(&Al), freew(&dt), freew(&nw), freew(&pw);
}

/* ---- moe ---- */

/* weight types of a MoE test: router, routed gate/up, routed down, shared expert */
struct moe_types {
	enum toast_dtype router, gate_up, down, shared;
};

static const struct moe_types moe_bf16 = {TOAST_DT_BF16, TOAST_DT_BF16, TOAST_DT_BF16, TOAST_DT_BF16};
static const struct moe_types moe_q4k = {TOAST_DT_BF16, TOAST_DT_Q4_K, TOAST_DT_Q4_K, TOAST_DT_Q4_K};
static const struct moe_types moe_q8 = {TOAST_DT_BF16, TOAST_DT_Q8_0, TOAST_DT_Q8_0, TOAST_DT_Q8_0};
static const struct moe_types moe_mlx4 = {TOAST_DT_MLX8, TOAST_DT_MLX4, TOAST_DT_MLX4, TOAST_DT_MLX4};
static const struct moe_types moe_mlx8 = {TOAST_DT_MLX8, TOAST_DT_MLX8, TOAST_DT_MLX8, TOAST_DT_MLX8};
static const struct moe_types moe_q5k = {TOAST_DT_BF16, TOAST_DT_Q5_K, TOAST_DT_Q5_K, TOAST_DT_Q5_K};

/* the experts' planes one after another in one buffer a plane, as a GGUF or MLX tensor holds
 * them (the CUDA backend then uploads many at once); j: the three buffers, to free */
static void join_experts(struct toast_experts *X, void *j[3])
{
	const struct toast_weight *w0 = &X->w[0];
	bool mlx = w0->type == TOAST_DT_MLX4 || w0->type == TOAST_DT_MLX8;
	size_t ns = mlx ? (size_t)w0->n_out * (size_t)(w0->n_in / w0->group_size) * (w0->sb_type == TOAST_DT_F32 ? 4 : 2) : 0;
	size_t nq = w0->n_bytes - 2 * ns, n[3] = {nq, ns, ns};
	for (int p = 0; p < 3; p++) {
		j[p] = n[p] ? malloc(n[p] * (size_t)X->n_expert) : NULL;
		for (int e = 0; n[p] && e < X->n_expert; e++) {
			const void **at = p == 0 ? &X->w[e].data : p == 1 ? &X->w[e].scales : &X->w[e].biases;
			memcpy((char *)j[p] + n[p] * (size_t)e, *at, n[p]);
			*at = (char *)j[p] + n[p] * (size_t)e;
		}
	}
}

/* the routed experts' up of type up (gate: ty->gate_up) */
static void test_moe_up(struct ctx *c, int T, int E, int ne, int k, int F, int Fs, bool norm_topk, bool sh_gate,
			const struct moe_types *ty, enum toast_dtype up)
{
	struct toast_backend *be = c->be;
	struct toast_error err;
	float *x0 = rand_vec((size_t)T * E, 3);
	for (int t = moe_tok_period; moe_tok_period > 0 && t < T; t++)
		memcpy(x0 + (size_t)t * E, x0 + (size_t)(t % moe_tok_period) * E, E * sizeof(float));
	struct hw nw = mkw(TOAST_DT_BF16, 1, E, 0.5, 0);
	prep(be, &nw);
	double *hd = ref_norm(x0, nw.f, T, E, true);
	float *h = malloc((size_t)T * E * sizeof(float)); /* the reference's input: the normed x, kept in double below */
	for (size_t i = 0; i < (size_t)T * E; i++)
		h[i] = (float)hd[i];
	struct hw router = mkw(ty->router, ne, E, 0.5, 0);
	if (moe_tie_period > 0 && ty->router == TOAST_DT_BF16)
		for (int e = moe_tie_period; e < ne; e++) {
			memcpy(router.f + (size_t)e * E, router.f + (size_t)(e % moe_tie_period) * E, E * sizeof(float));
			memcpy((uint16_t *)router.w.data + (size_t)e * E, (uint16_t *)router.w.data + (size_t)(e % moe_tie_period) * E,
			       E * 2);
		}
	struct hw *gw = malloc(sizeof(struct hw) * ne), *uw = malloc(sizeof(struct hw) * ne), *dw = malloc(sizeof(struct hw) * ne);
	struct toast_experts G = {ne, calloc(ne, sizeof(struct toast_weight)), NULL}, U = G, D = G;
	U.w = calloc(ne, sizeof(struct toast_weight));
	D.w = calloc(ne, sizeof(struct toast_weight));
	for (int e = 0; e < ne; e++) {
		gw[e] = mkw(ty->gate_up, F, E, 0.2, 0), uw[e] = mkw(up, F, E, 0.2, 0);
		dw[e] = mkw(ty->down, E, F, 0.2, 0);
		G.w[e] = gw[e].w, U.w[e] = uw[e].w, D.w[e] = dw[e].w;
	}
	void *gj[3]; /* gate's experts in one buffer (a file's way), up's and down's each its own */
	join_experts(&G, gj);
	enum toast_dtype st = Fs ? ty->shared : TOAST_DT_BF16;
	struct hw sg = mkw(st, Fs ? Fs : 1, E, 0.2, 0), su = mkw(st, Fs ? Fs : 1, E, 0.2, 0);
	struct hw sd = mkw(st, E, Fs ? Fs : 1, 0.2, 0), sgi = mkw(TOAST_DT_BF16, 1, E, 0.3, 0);
	prep(be, &router), prep(be, &sg), prep(be, &su), prep(be, &sd), prep(be, &sgi);
	CHECK(be->ops->prepare_experts(be, &G, &err) == TOAST_OK && be->ops->prepare_experts(be, &U, &err) == TOAST_OK &&
		      be->ops->prepare_experts(be, &D, &err) == TOAST_OK,
	      "prepare experts: %s", err.msg);
	float *dx = put(be, x0, (size_t)T * E, false);
	struct toast_moe_args a = {dx, &nw.w, 1e-6f, true, &router.w, &G, &U, &D, ne, k, norm_topk, Fs ? &sg.w : NULL, Fs ? &su.w : NULL,
				   Fs ? &sd.w : NULL, Fs && sh_gate ? &sgi.w : NULL, E, F, Fs, T};
	be->ops->moe(be, &a);
	float *x = get(be, dx, (size_t)T * E, false);
	double *ref = malloc((size_t)T * E * sizeof(double)), *p = malloc(ne * sizeof(double));
	double *act = malloc((size_t)(F > Fs ? F : Fs) * sizeof(double));
	int *sel = malloc(k * sizeof(int));
	for (int t = 0; t < T; t++) {
		const float *ht = h + (size_t)t * E;
		double mx = -INFINITY, sum = 0;
		for (int e = 0; e < ne; e++) {
			double s = 0;
			for (int i = 0; i < E; i++)
				s += (double)router.f[(size_t)e * E + i] * ht[i];
			p[e] = s;
			mx = fmax(mx, s);
		}
		for (int e = 0; e < ne; e++)
			sum += p[e] = exp(p[e] - mx);
		double tot = 0;
		for (int j = 0; j < k; j++) {
			int best = -1;
			for (int e = 0; e < ne; e++) {
				bool taken = false;
				for (int i = 0; i < j; i++)
					taken |= sel[i] == e;
				if (!taken && (best < 0 || p[e] > p[best]))
					best = e;
			}
			sel[j] = best;
			tot += p[best] / sum;
		}
		for (int i = 0; i < E; i++)
			ref[(size_t)t * E + i] = x0[(size_t)t * E + i];
		for (int j = 0; j < k + (Fs ? 1 : 0); j++) {
			bool shared = j == k;
			int e = shared ? 0 : sel[j], FF = shared ? Fs : F;
			const float *gf = shared ? sg.f : gw[e].f, *uf = shared ? su.f : uw[e].f, *df = shared ? sd.f : dw[e].f;
			double wgt = shared ? 1 : p[e] / sum / (norm_topk ? tot : 1);
			if (shared && sh_gate) {
				double s = 0;
				for (int i = 0; i < E; i++)
					s += (double)sgi.f[i] * ht[i];
				wgt = dsig(s);
			}
			for (int r = 0; r < FF; r++) {
				double gg = 0, uu = 0;
				for (int i = 0; i < E; i++) {
					gg += (double)gf[(size_t)r * E + i] * ht[i];
					uu += (double)uf[(size_t)r * E + i] * ht[i];
				}
				act[r] = dsilu(gg) * uu;
			}
			for (int i = 0; i < E; i++) {
				double s = 0;
				for (int r = 0; r < FF; r++)
					s += (double)df[(size_t)i * FF + r] * act[r];
				ref[(size_t)t * E + i] += wgt * s;
			}
		}
	}
	double e = relerr(x, ref, (size_t)T * E);
	CHECK(e < c->tol, "%s moe T=%d E=%d experts %d top %d F %d shared %d norm %d gate %d types %s/%s%s%s/%s/%s: error %.3g",
	      c->name, T, E, ne, k, F, Fs, norm_topk, sh_gate, toast_dtype_name(ty->router), toast_dtype_name(ty->gate_up),
	      up != ty->gate_up ? "+" : "", up != ty->gate_up ? toast_dtype_name(up) : "", toast_dtype_name(ty->down),
	      toast_dtype_name(st), e);
	be->ops->release(be, dx);
	freew(&nw), free(hd);
	for (int e2 = 0; e2 < ne; e2++)
		freew(&gw[e2]), freew(&uw[e2]), freew(&dw[e2]);
	free(gw), free(uw), free(dw), free(G.w), free(U.w), free(D.w), free(gj[0]), free(gj[1]), free(gj[2]);
	freew(&router), freew(&sg), freew(&su), freew(&sd), freew(&sgi);
	free(h), free(x0), free(x), free(ref), free(p), free(act), free(sel);
}

static void test_moe_types(struct ctx *c, int T, int E, int ne, int k, int F, int Fs, bool norm_topk, bool sh_gate,
			   const struct moe_types *ty)
{
	test_moe_up(c, T, E, ne, k, F, Fs, norm_topk, sh_gate, ty, ty->gate_up);
}

#define DRAW(t, tp, mp, k, uu)                                                                                   \
	{.temperature = t, .top_p = tp, .min_p = mp, .top_k = k, .n_top = k, .u = uu, .repeat_penalty = 1}

/* pick(): greedy, and draws of every kind (top_k 1..32, 40 and 100: runs of 32, 64, 128; top_k
 * 0, 300 and 1000: from every logit; nucleus or not, min-p, a flat and a sharp temperature, u at both ends; a
 * repetition penalty over tokens among the largest, greedy and drawn, from the top or from every
 * logit (n_top 0, under 1 too), with the pick before it pending and counted), each exactly the
 * host's token; picks queued two at a time are read in order */
static void test_picks(struct ctx *c, const float *x, void *d, int n)
{
	struct toast_draw draws[] = {
		DRAW(0.7f, 0.8f, 0, 20, 0.37),  DRAW(1.3f, 1, 0.05f, 32, 0.999999), DRAW(0.2f, 0.95f, 0, 7, 0.0),
		DRAW(1, 1, 0, 1, 0.5),          DRAW(50, 0.5f, 0, 32, 0.61),        DRAW(0.7f, 0.8f, 0.2f, 20, 0.93),
		DRAW(3, 0.999f, 0, 31, 0.0001), DRAW(1.5f, 0.95f, 0, 100, 0.71),    DRAW(0.7f, 0.95f, 0, 0, 0.3),
		DRAW(1.3f, 1, 0.05f, 0, 0.77),  DRAW(50, 0.5f, 0, 0, 0.999999),     DRAW(1, 1, 0, 0, 0.0),
		DRAW(0.2f, 0.05f, 0, 0, 0.5),   DRAW(0.8f, 0.9f, 0, 300, 0.42),     DRAW(1.5f, 1, 0.02f, 1000, 0.9),
		DRAW(0.7f, 0.8f, 0, 20, 0.45),  DRAW(0, 1, 0, 1, 0),
		DRAW(2, 1, 0, 40, 0.2),         DRAW(0.7f, 0.9f, 0, 20, 0.8),       DRAW(0.7f, 0.8f, 0, 20, 0.45),
		DRAW(0, 1, 0, 1, 0),            DRAW(0.7f, 0.95f, 0, 0, 0.6),       DRAW(1, 0.9f, 0.02f, 0, 0.3),
	};
	int nd = (int)(sizeof(draws) / sizeof(draws[0]));
	for (int i = 0; i < nd; i++) /* (a top_k over 256: from every logit) */
		draws[i].n_top = draws[i].top_k > TOAST_TOP_MAX ? 0 : draws[i].n_top;
	/* the last eight with a penalty: tokens seen lately among the largest (every other one of the
	 * 64 best, the best first), a window of 64 or of as many as are seen (full: the pending pick
	 * pushes the oldest out); the last five from every logit (n_top 0), the penalty under 1 in
	 * three */
	int32_t seen[TOAST_TOP_MAX];
	float sv[TOAST_TOP_MAX];
	int ns = toast_top_host(x, n, 64, seen, sv);
	for (int i = 0; i < ns / 2; i++)
		seen[i] = seen[2 * i];
	if (ns / 2 >= 3)
		seen[ns / 2 - 1] = seen[1]; /* (a token seen twice) */
	for (int i = nd - 8; i < nd; i++) {
		bool every = i >= nd - 5;
		draws[i].repeat_penalty = every && i % 2 == 0 ? 0.7f : i % 2 ? 1.3f : 2.5f;
		draws[i].last_n = i == nd - 1 || i == nd - 5 ? ns / 2 : 64;
		draws[i].n_recent = ns / 2;
		draws[i].recent = seen;
		draws[i].n_top = every ? 0 : draws[i].top_k + draws[i].last_n;
	}
	/* every draw queued second after another (-1: greedy), counting it as seen when odd and in
	 * the last three (penalised: greedy, top 40, and a full window) */
	for (int i = -1; i < nd; i++) {
		struct toast_draw *a = i < 0 ? NULL : &draws[i], *b = i + 1 < nd ? &draws[i + 1] : NULL;
		int nb = n > 1 ? n - 1 : n;
		struct toast_error err = {0};
		if (b)
			b->prev = (i + 1) % 2 == 1 || i + 1 >= nd - 3;
		c->be->ops->pick(c->be, d, n, a);
		c->be->ops->pick(c->be, d, nb, b);
		int32_t got = c->be->ops->pick_read(c->be, &err), got2 = c->be->ops->pick_read(c->be, &err);
		int32_t want = toast_pick_host(x, n, a, -1), want2 = toast_pick_host(x, nb, b, want);
		CHECK(got == want && got2 == want2, "%s: picks of %d (draw %d) and %d (draw %d%s): %d and %d (%d and %d expected) %s",
		      c->name, n, i, nb, i + 1, b && b->prev ? ", the first seen" : "", got, got2, want, want2, err.msg);
		if (b)
			b->prev = false;
	}
	/* many uniforms through one draw: the boundaries between tokens fall where the host's do;
	 * every third a random draw (top_k 1..32 or 1..200, a penalty over 1, under 1 or none, windows
	 * of 1..ns/2 seen tokens, n_top with room for them or not; or from every logit, top_k 0 or
	 * over 256, or n_top 0) */
	for (int j = 0; j < 36; j++) {
		struct toast_draw dr = draws[j % nd];
		if (j % 3 == 2) {
			double q = (rnd() + 1) / 2;
			dr = (struct toast_draw){.temperature = q < 0.1 ? 0 : (float)(0.05 + 3 * q * q),
						 .top_p = (float)(0.1 + 0.9 * (rnd() + 1) / 2),
						 .min_p = q < 0.5 ? 0 : (float)(0.2 * q),
						 .top_k = 1 + (int)((rnd() < 0 ? 31 : 199) * (rnd() + 1) / 2)};
			double pq = rnd();
			dr.repeat_penalty = pq < -0.3 ? 1 : pq < 0.3 ? (float)(1 + 3 * q) : (float)(0.3 + 0.6 * q);
			dr.last_n = 1 + (int)((ns / 2) * (rnd() + 1) / 2);
			dr.n_recent = dr.last_n < ns / 2 ? dr.last_n : ns / 2;
			dr.recent = seen + ns / 2 - dr.n_recent;
			dr.n_top = dr.top_k + (dr.repeat_penalty != 1 && rnd() < 0.5 ? dr.last_n : 0); /* (or too few) */
			double e = rnd();
			if (e < -0.4) /* from every logit: top_k 0 or over 256, or the top_k best of the penalised */
				dr.top_k = dr.n_top = 0;
			else if (e < -0.25)
				dr.top_k = 257 + (int)(1800 * (rnd() + 1) / 2), dr.n_top = 0;
			else if (e < -0.1)
				dr.n_top = 0;
		}
		dr.u = (rnd() + 1) / 2;
		struct toast_error err = {0};
		c->be->ops->pick(c->be, d, n, &dr);
		int32_t got = c->be->ops->pick_read(c->be, &err), want = toast_pick_host(x, n, &dr, -1);
		CHECK(got == want, "%s: a draw of %d (u %.17g): %d (%d expected) %s", c->name, n, dr.u, got, want, err.msg);
	}
	/* pick_rows (a speculative step's): rows of x turned by 7 r, the largest of each, or each row
	 * its own draw without a penalty (top 20, 7, 100, from every logit, over 256) */
	if (c->be->ops->pick_rows) {
		enum { R = 5 };
		int sel[R] = {0, 2, 7, 8, 14};
		struct toast_draw dr[R];
		float *xs = malloc((size_t)R * n * sizeof(float));
		for (int r = 0; r < R; r++) {
			dr[r] = draws[sel[r]];
			dr[r].u = (rnd() + 1) / 2;
			for (int i = 0; i < n; i++)
				xs[(size_t)r * n + i] = x[(i + 7 * r) % n];
		}
		void *dx = put(c->be, xs, (size_t)R * n, false);
		for (int g = 0; g < 2; g++) {
			int32_t got[R];
			struct toast_error err = {0};
			int rc = c->be->ops->pick_rows(c->be, dx, n, R, g ? dr : NULL, got, &err);
			for (int r = 0; r < R; r++) {
				int32_t want = toast_pick_host(xs + (size_t)r * n, n, g ? dr + r : NULL, -1);
				CHECK(rc == 0 && got[r] == want, "%s: pick_rows of %d, row %d (%s): %d (%d expected) %s", c->name,
				      n, r, g ? "drawn" : "the largest", got[r], want, err.msg);
			}
		}
		c->be->ops->release(c->be, dx);
		free(xs);
	}
}

/* top(): exactly toast_top_host's answer (ties, -0, NaN, -inf; sizes around the GPU's
 * 2048-key blocks, the real vocabulary, and more blocks' bests than one block merges at once;
 * m around the runs of 32, 64, 128 and 256 keys); the picks on each (k_pick_wide with 1, 2, 4
 * and 8 logits a thread on 132 SMs: up to 135K, 270K, 540K and 1.08M) */
static void test_top(struct ctx *c)
{
	int sizes[] = {1, 5, 2047, 2048, 2049, 12289, 151936, 65537, 1000003, 300007};
	int ms[] = {1, 7, 20, 32, 33, 64, 65, 128, 129, 200, 256};
	for (int si = 0; si < (int)(sizeof(sizes) / sizeof(sizes[0])); si++) {
		int n = sizes[si];
		float *x = malloc((size_t)n * sizeof(float));
		for (int i = 0; i < n; i++) {
			double u = rnd();
			x[i] = si % 2 ? (float)(int)(u * 40) * 0.125f : (float)(u * 30); /* odd sizes: many ties */
			if (n == 65537)
				x[i] = (float)(i % 4096); /* the best tied across every block: the lowest index wins */
			if (i % 997 == 3)
				x[i] = NAN;
			else if (i % 991 == 5)
				x[i] = -INFINITY;
			else if (i % 89 == 7)
				x[i] = -0.0f;
		}
		if (n == 2049)
			x[2048] = 1e30f; /* the best in the last, nearly empty block */
		void *d = put(c->be, x, (size_t)n, false);
		for (int mi = 0; mi < (int)(sizeof(ms) / sizeof(ms[0])); mi++) {
			int32_t ids[256], rid[256];
			float vals[256], rval[256];
			struct toast_error err = {0};
			int want = toast_top_host(x, n, ms[mi], rid, rval);
			int got = c->be->ops->top(c->be, d, n, ms[mi], ids, vals, &err);
			int bad = got != want;
			for (int j = 0; !bad && j < got; j++)
				bad = ids[j] != rid[j] || vals[j] != rval[j];
			CHECK(!bad, "%s: top %d of %d: %d entries (%d expected)%s %s", c->name, ms[mi], n, got, want,
			      bad ? ", wrong ids or values" : "", err.msg);
		}
		if (c->be->ops->pick) /* the device's picks: top 1's id, or the host's draw */
			test_picks(c, x, d, n);
		c->be->ops->release(c->be, d);
		free(x);
	}
	/* nothing but NaN: no entries, and a pick of token 0 (what the sampler makes of that) */
	float nan[3000];
	for (int i = 0; i < 3000; i++)
		nan[i] = NAN;
	void *d = put(c->be, nan, 3000, false);
	int32_t ids[20];
	float vals[20];
	struct toast_error err = {0};
	int n1 = c->be->ops->top(c->be, d, 3000, 1, ids, vals, &err);
	int n20 = c->be->ops->top(c->be, d, 3000, 20, ids, vals, &err);
	CHECK(n1 == 0 && n20 == 0, "%s: the top of NaNs is empty (%d, %d) %s", c->name, n1, n20, err.msg);
	if (c->be->ops->pick)
		test_picks(c, nan, d, 3000);
	c->be->ops->release(c->be, d);
}

static void test_moe(struct ctx *c, int T, int E, int ne, int k, int F, int Fs, bool norm_topk, bool sh_gate)
{
	test_moe_types(c, T, E, ne, k, F, Fs, norm_topk, sh_gate, &moe_bf16);
}

static const enum toast_dtype quant_types[] = {TOAST_DT_Q4_0, TOAST_DT_Q4_1, TOAST_DT_Q8_0, TOAST_DT_Q4_K,
					      TOAST_DT_Q5_K, TOAST_DT_Q6_K, TOAST_DT_MLX4, TOAST_DT_MLX8};
#define N_QUANT_TYPES (int)(sizeof(quant_types) / sizeof(quant_types[0]))

/* quantised weights: every op that reads a matrix, every type, decode and prefill sizes */
static void test_quant(struct ctx *c)
{
	int o1[] = {7}, o2[] = {33, 5}, o3[] = {129, 64, 1, 300}, o4[] = {40961}, o5[] = {33001}, o7[] = {9001};
	for (int i = 0; i < N_QUANT_TYPES; i++) {
		enum toast_dtype t = quant_types[i];
		test_matmul(c, t, 1, o1, 1, 512, TOAST_MM_ACT, false, false);
		test_matmul(c, t, 2, o2, 2, 256, TOAST_MM_F32, true, true);
		test_matmul(c, t, 3, o2, 2, 512, TOAST_MM_F32, true, false);
		test_matmul(c, t, 8, o3, 4, 256, TOAST_MM_ADD, false, false);
		test_matmul(c, t, 5, o2, 2, 2048, TOAST_MM_F32, true, true);
		test_matmul(c, t, 4, o2, 2, 2048, TOAST_MM_F32, true, false);
		test_matmul(c, t, 9, o2, 2, 512, TOAST_MM_F32, true, true); /* prefill: tensor cores on a GPU */
		test_matmul(c, t, 33, o3, 4, 256, TOAST_MM_ACT, false, false);
		int o8[] = {1536}, o9[] = {301};
		test_matmul(c, t, 1, o8, 1, 512, TOAST_MM_GLU, true, false); /* tensor cores where they read t */
		test_matmul(c, t, 1, o9, 1, 256, TOAST_MM_GLU, false, false);
		test_matmul(c, t, 4, o9, 1, 256, TOAST_MM_GLU, true, true);
		test_matmul(c, t, 9, o9, 1, 512, TOAST_MM_GLU, true, false); /* prefill */
		test_embed(c, t, 37, 256);
		test_synthetic(c, t, 17, 2048);
	}
	/* four rows a warp (rows for many waves of blocks), and a weight dequantised in two pieces
	 * for the GEMM */
	test_matmul(c, TOAST_DT_Q4_K, 1, o4, 1, 256, TOAST_MM_F32, true, true);
	struct ctx cf = *c; /* f32 rows into quantised decode GEMVs (tensor cores on a GPU) */
	cf.xf = true;
	int of[] = {160};
	test_matmul(&cf, TOAST_DT_Q4_K, 1, of, 1, 4096, TOAST_MM_ADD, false, false);
	test_matmul(&cf, TOAST_DT_MLX4, 4, of, 1, 512, TOAST_MM_F32, false, false);
	test_matmul(&cf, TOAST_DT_Q8_0, 1, of, 1, 1024, TOAST_MM_ADD, false, false);
	test_matmul(c, TOAST_DT_MLX4, 4, o4, 1, 256, TOAST_MM_ADD, false, false);
	test_matmul(c, TOAST_DT_Q8_0, 9, o5, 1, 1024, TOAST_MM_F32, false, false);
	/* one call, outputs of several types (a launch per type; the norm output written once) */
	enum toast_dtype mix[] = {TOAST_DT_Q4_K, TOAST_DT_BF16, TOAST_DT_MLX4, TOAST_DT_Q4_K};
	test_matmul_types(c, mix, 1, o3, 4, 256, TOAST_MM_F32, true, true);
	test_matmul_types(c, mix, 12, o3, 4, 256, TOAST_MM_F32, true, true);
	/* MoE: the Qwen3-Next widths (n_embd 2048: gate/up rows loaded whole; n_ff 512: down rows
	 * loaded whole), narrower ones, mixed types, prefill */
	struct moe_types q6 = {TOAST_DT_BF16, TOAST_DT_Q6_K, TOAST_DT_Q6_K, TOAST_DT_Q6_K};
	struct moe_types mixed = {TOAST_DT_Q8_0, TOAST_DT_Q4_K, TOAST_DT_Q6_K, TOAST_DT_MLX4};
	struct moe_types small = {TOAST_DT_Q4_1, TOAST_DT_Q5_K, TOAST_DT_Q4_0, TOAST_DT_MLX8};
	test_moe_types(c, 1, 2048, 3, 2, 256, 256, true, true, &moe_q4k);
	test_moe_types(c, 1, 256, 4, 2, 512, 512, true, true, &moe_q4k);
	test_moe_types(c, 3, 2048, 4, 2, 512, 512, true, true, &moe_q4k); /* three tokens, three expert sets */
	test_moe_types(c, 1, 256, 4, 2, 256, 512, true, true, &moe_q4k);  /* a shared expert wider than the rest */
	test_moe_types(c, 2, 2048, 3, 2, 256, 256, true, true, &moe_mlx4);
	test_moe_types(c, 2, 256, 4, 3, 512, 512, true, true, &moe_mlx4);
	/* MLX4 and MLX8 on tensor cores with groups of 128 and f16 scales, f32 scales; groups of 32
	 * (two scales in one mma) take the SIMT kernels */
	struct {
		int gs;
		enum toast_dtype sb;
	} mx[] = {{128, TOAST_DT_F16}, {64, TOAST_DT_F32}, {32, TOAST_DT_BF16}};
	for (int i = 0; i < 3; i++) {
		mlx_gs = mx[i].gs, mlx_sb = mx[i].sb;
		for (int b = 0; b < 2; b++) {
			enum toast_dtype t = b ? TOAST_DT_MLX8 : TOAST_DT_MLX4;
			test_matmul(c, t, 1, o7, 1, 2048, TOAST_MM_F32, true, true);
			test_matmul(c, t, 8, o3, 4, 512, TOAST_MM_ACT, false, false);
			test_moe_types(c, 1, 2048, 3, 2, 512, 512, true, true, b ? &moe_mlx8 : &moe_mlx4);
		}
	}
	mlx_gs = 64, mlx_sb = TOAST_DT_BF16;
	/* MLX rows that are not whole 128-byte units of codes (MLX4 n_in % 256, MLX8 % 128): not tiled
	 * on a GPU, so the CU_QT_ANY kernels (and the general GEMV path) read them; Q8_0 the same */
	int o10[] = {33, 5};
	test_matmul(c, TOAST_DT_MLX4, 1, o10, 2, 320, TOAST_MM_F32, true, true);
	test_matmul(c, TOAST_DT_MLX8, 1, o10, 2, 192, TOAST_MM_ADD, false, false);
	test_matmul(c, TOAST_DT_MLX4, 9, o10, 2, 320, TOAST_MM_F32, true, false);
	test_moe_types(c, 1, 384, 4, 2, 192, 192, true, true, &moe_mlx4);
	test_moe_types(c, 70, 384, 8, 3, 192, 192, true, true, &moe_mlx4); /* the grouped GEMM */
	/* Q8_0 rows that are not whole units of four blocks (n_in % 128): as above (at n_embd 256 only
	 * down's rows, n_ff 96); tiled rows of an odd count of units (384: the SIMT GEMV reads tiles) */
	test_matmul(c, TOAST_DT_Q8_0, 1, o10, 2, 384, TOAST_MM_ADD, false, false);
	test_matmul(c, TOAST_DT_Q8_0, 3, o10, 2, 384, TOAST_MM_F32, true, true);
	test_moe_types(c, 1, 384, 4, 2, 128, 128, true, true, &moe_q8);
	test_matmul(c, TOAST_DT_Q8_0, 1, o10, 2, 160, TOAST_MM_F32, true, true);
	test_matmul(c, TOAST_DT_Q8_0, 9, o10, 2, 224, TOAST_MM_ACT, false, false);
	int o11[] = {301};
	test_matmul(c, TOAST_DT_Q8_0, 1, o11, 1, 160, TOAST_MM_GLU, true, false);
	test_moe_types(c, 1, 160, 4, 2, 96, 96, true, true, &moe_q8);
	test_moe_types(c, 1, 256, 4, 2, 96, 96, true, true, &moe_q8);
	test_moe_types(c, 70, 160, 8, 3, 96, 96, true, true, &moe_q8);
	test_moe_types(c, 70, 256, 8, 3, 96, 96, true, true, &moe_q8);
	test_moe_types(c, 1, 2048, 3, 2, 256, 0, true, false, &moe_q8);
	test_moe_types(c, 5, 256, 4, 2, 512, 512, true, false, &moe_q8);
	test_moe_types(c, 3, 2048, 2, 2, 256, 0, false, true, &q6);
	test_moe_types(c, 3, 256, 4, 2, 512, 512, false, true, &q6);
	test_moe_types(c, 3, 256, 4, 2, 256, 0, false, false, &moe_q5k);
	/* MLX 8-bit experts (an 8-bit MLX checkpoint; groups of 32 above: the SIMT kernels) */
	test_moe_types(c, 1, 2048, 16, 10, 512, 512, true, true, &moe_mlx8);
	test_moe_types(c, 3, 256, 4, 2, 256, 0, false, false, &moe_mlx8);
	test_moe_types(c, 2, 256, 8, 3, 256, 256, true, true, &mixed);
	test_moe_types(c, 1, 256, 8, 3, 256, 0, true, false, &small);
	test_moe_types(c, 70, 256, 8, 3, 256, 256, true, true, &moe_q4k); /* prefill-sized: the grouped GEMM */
	test_moe_types(c, 70, 256, 8, 3, 256, 256, true, true, &moe_mlx4);
	test_moe_types(c, 33, 256, 8, 2, 256, 256, true, true, &mixed);
	/* value heads in llama.cpp's tiled order */
	struct gdn_shape tiled = {2, 6, 32, 48, 4, false, true, false}, tiled_big = {4, 8, 128, 128, 4, false, true, false};
	int p1[] = {1, 1, 1}, p3[] = {5, 1, 70};
	test_gdn(c, tiled, p1, 3);
	test_gdn(c, tiled, p3, 3);
	test_gdn(c, tiled_big, p1, 3);
	test_gdn(c, tiled_big, p3, 3);
}

/* The CUDA backend's kernel variants of packed weights, at the widths that select them (many
 * rows and units a warp, Qwen3-Next's n_embd 2048 and n_ff 512 with 10 of 16 or 64 experts, each
 * type's SIMT and tensor-core expert kernels). GPU only: the CPU backend runs one generic path
 * whatever the width, which test_quant's cases cover, and at these widths quantising the
 * weights is most of the test's time (45 of 58 s on the CPU, four times that under ASan). */
static void test_quant_kernels(struct ctx *c)
{
	/* the tensor-core GEMVs with more units (tile, superblock) a warp than they
	 * have in flight: every warp 5 tiles of one superblock, 3 tiles of two, and T = 8 */
	int o6[] = {20011}, o7[] = {9001};
	enum toast_dtype tc_types[] = {TOAST_DT_Q4_K, TOAST_DT_Q5_K, TOAST_DT_Q6_K, TOAST_DT_MLX4, TOAST_DT_MLX8};
	for (int k = 0; k < 5; k++) {
		enum toast_dtype t = tc_types[k];
		test_matmul(c, t, 1, o6, 1, 2048, TOAST_MM_F32, true, true);
		test_matmul(c, t, 1, o7, 1, 4096, TOAST_MM_ADD, false, false);
		test_matmul(c, t, 8, o7, 1, 2048, TOAST_MM_ACT, false, false);
		/* steps of 2 to 4 tokens (the instances for 2 and 4, their norms in one reduction) */
		test_matmul(c, t, 2, o6, 1, 2048, TOAST_MM_F32, true, true);
		test_matmul(c, t, 3, o7, 1, 2048, TOAST_MM_ADD, true, false);
		test_matmul(c, t, 4, o7, 1, 4096, TOAST_MM_F32, false, false);
	}
	/* Q8_0 experts with a shared expert of another type: the SIMT kernels compiled for Q8_0 */
	struct moe_types q8sh = {TOAST_DT_BF16, TOAST_DT_Q8_0, TOAST_DT_Q8_0, TOAST_DT_Q4_K};
	test_moe_types(c, 1, 2048, 16, 10, 512, 512, true, true, &q8sh);
	/* a Q5_K_M file's experts (Q5_K, down Q5_K or Q6_K) at the Qwen3-Next widths (narrower ones
	 * in test_quant): on tensor cores, but down of two types (routed Q6_K, shared Q5_K) in the
	 * SIMT kernels compiled for each */
	struct moe_types q5m = {TOAST_DT_BF16, TOAST_DT_Q5_K, TOAST_DT_Q6_K, TOAST_DT_Q5_K};
	test_moe_types(c, 1, 2048, 16, 10, 512, 512, true, true, &moe_q5k);
	test_moe_types(c, 1, 2048, 16, 10, 512, 512, true, true, &q5m);
	/* a Q4_K_M file's experts: Q4_K gate/up and Q6_K down, both on tensor cores, at the
	 * Qwen3-Next widths with ten of sixteen experts, and eight of 64 without renormalising */
	struct moe_types q4km = {TOAST_DT_BF16, TOAST_DT_Q4_K, TOAST_DT_Q6_K, TOAST_DT_Q6_K};
	test_moe_types(c, 2, 2048, 16, 10, 512, 0, true, false, &q4km);
	test_moe_types(c, 1, 2048, 64, 8, 256, 0, false, false, &q4km);
	/* steps of 2 to 8 tokens: gate/up's and down's kernels of every token in a block (a column
	 * each; ten of sixteen experts, so tokens share experts). Gate/up groups a slot's tokens by
	 * expert: token rows repeating with a period make groups of several tokens in every slot,
	 * a period of 1 one group; h in registers (T = 2 at 2048) or staged in rounds */
	test_moe_types(c, 2, 2048, 16, 10, 512, 512, true, true, &moe_q4k);
	test_moe_types(c, 8, 2048, 16, 10, 512, 512, true, true, &moe_q4k);
	test_moe_types(c, 4, 2048, 16, 10, 512, 512, true, true, &moe_mlx4);
	test_moe_types(c, 7, 2048, 16, 10, 512, 0, false, false, &q4km);
	for (int per = 1; per <= 3; per++) {
		moe_tok_period = per;
		test_moe_types(c, per == 2 ? 2 : 7, 2048, 16, 10, 512, 512, true, true, per == 3 ? &q5m : &moe_q4k);
		test_moe_types(c, 8, 256, 8, 3, 256, 512, true, true, &moe_q4k); /* a shared expert wider */
	}
	moe_tok_period = 0;
	struct moe_types q6k = {TOAST_DT_BF16, TOAST_DT_Q6_K, TOAST_DT_Q6_K, TOAST_DT_Q6_K};
	test_moe_types(c, 3, 2048, 16, 10, 512, 512, true, true, &q6k);
	test_moe_types(c, 5, 2048, 16, 10, 512, 512, true, true, &moe_q8);
	test_moe_types(c, 6, 2048, 16, 10, 512, 512, true, true, &moe_mlx8);
	/* every decode kernel variant of the three split or blocked types: n_embd 2048 (rows loaded
	 * whole) or not, n_ff 512 (down rows loaded whole) or not, with and without a shared expert */
	enum toast_dtype grid_types[] = {TOAST_DT_Q4_K, TOAST_DT_Q8_0, TOAST_DT_Q6_K};
	for (int i = 0; i < 3; i++)
		for (int E = 256; E <= 2048; E *= 8)
			for (int F = 256; F <= 512; F *= 2)
				for (int Fs = 0; Fs <= F; Fs += F) {
					enum toast_dtype t = grid_types[i];
					struct moe_types ty = {TOAST_DT_BF16, t, t, t};
					test_moe_types(c, 1, E, 3, 2, F, Fs, true, Fs > 0, &ty);
				}
}

/* copy_many (where the backend has it): 40 copies, more than a launch takes, of sizes in whole
 * words and in 16-byte units, some at ends 4 bytes off 16 */
static void test_copy_many(struct ctx *c)
{
	struct toast_backend *be = c->be;
	if (!be->ops->copy_many)
		return;
	enum { N = 40 };
	void *dst[N], *dbuf[N];
	const void *src[N];
	float *sbuf[N], *host[N];
	size_t bytes[N];
	for (int i = 0; i < N; i++) {
		size_t words = i % 3 == 0 ? 4 * (size_t)(1 + i * 977) : (size_t)(1 + i * 1311);
		int off = i % 4 == 1; /* a word past the buffer's start */
		bytes[i] = words * 4;
		host[i] = rand_vec(words + 1, 1);
		sbuf[i] = put(be, host[i], words + 1, false);
		dbuf[i] = be->ops->alloc(be, (words + 1) * 4);
		src[i] = sbuf[i] + off, dst[i] = (float *)dbuf[i] + off;
	}
	be->ops->copy_many(be, dst, src, bytes, N);
	int bad = 0;
	for (int i = 0; i < N; i++) {
		int off = i % 4 == 1;
		float *got = get(be, dbuf[i], bytes[i] / 4 + 1, false);
		bad += memcmp(got + off, host[i] + off, bytes[i]) != 0 || (!off && got[bytes[i] / 4] != 0) || (off && got[0] != 0);
		free(got), free(host[i]);
		be->ops->release(be, sbuf[i]), be->ops->release(be, dbuf[i]);
	}
	CHECK(bad == 0, "%s copy_many: %d of %d copies wrong (or past their ends)", c->name, bad, N);
}

/* the gated DeltaNet op on every register layout and path of the decode and prefill kernels */
static void test_gdn_shapes(struct ctx *c)
{
	struct gdn_shape flat = {2, 4, 32, 48, 4, false, false, false}, grouped = {2, 4, 32, 48, 4, true, false, false};
	struct gdn_shape odd = {3, 3, 7, 5, 3, false, false, false}, big = {2, 6, 128, 128, 4, true, false, false};
	int p1[] = {1, 1, 1}, p2[] = {12}, p3[] = {5, 1, 70}, p4[] = {64, 64, 1, 3}, p5[] = {131};
	test_gdn(c, flat, p1, 3);
	test_gdn(c, flat, p2, 1);
	test_gdn(c, grouped, p2, 1);
	test_gdn(c, grouped, p3, 3);
	test_gdn(c, odd, p4, 4);
	/* the decode kernel's other register layouts: key heads of 64 and 256 */
	struct gdn_shape k64 = {2, 4, 64, 64, 4, false, false, false}, k256 = {1, 2, 256, 32, 4, true, false, false};
	test_gdn(c, k64, p3, 3);
	test_gdn(c, k256, p1, 3);
	test_gdn(c, big, p5, 1);
	test_gdn(c, big, p1, 3);
	/* the CUDA fast path (d_k 128, d_v a multiple of 32): two blocks of state rows, many chunks
	 * with a partial last one, decode between prefills, a partial single chunk; flat layout with
	 * one value head a key head and T exactly one chunk, then 2 tokens; d_k 128 with d_v 48 takes
	 * the general kernels */
	struct gdn_shape fast2 = {2, 4, 128, 64, 4, true, false, false}, fast_flat = {4, 4, 128, 32, 2, false, false, false};
	struct gdn_shape slow128 = {1, 2, 128, 48, 4, false, false, false};
	int p6[] = {200, 1, 63}, p7[] = {64, 129, 2}, p8[] = {70, 3};
	test_gdn(c, fast2, p6, 3);
	test_gdn(c, fast_flat, p7, 3);
	test_gdn(c, slow128, p8, 2);
	/* decode steps of several tokens (on a GPU the decode kernel takes up to 8, token after
	 * token): an even count leaves the conv state in the slot it read, which the key head's
	 * other value heads read too; a conv of 5 taps reaches back past a step of 2 into the state */
	struct gdn_shape tiled2 = {4, 8, 128, 128, 4, false, true, false}, k5 = {2, 4, 32, 48, 5, true, false, false};
	int p9[] = {2, 4, 1, 3, 8, 2}, p10[] = {1, 2, 1, 2, 4, 6, 9};
	test_gdn(c, big, p9, 6);
	test_gdn(c, tiled2, p9, 6);
	test_gdn(c, odd, p10, 7);
	test_gdn(c, k5, p10, 7);
	test_gdn(c, k64, p9, 6);
	test_gdn(c, k256, p10, 7);
	struct gdn_shape wide = {1, 2, 256, 256, 4, true, false, false}; /* a step of 8 past 48 KB of smem */
	test_gdn(c, wide, p9, 6);
	/* and keeping the states after each token (a speculative step's), every register layout:
	 * d_k 128 (and the tiled heads), 64, 32, 256, and none (d_k 7, a conv of 3) */
	int p11[] = {3, 1, 2, 8, 4};
	struct gdn_shape kept[] = {big, tiled2, k64, flat, k256, odd, k5};
	for (int i = 0; i < 7; i++) {
		kept[i].keep = true;
		test_gdn(c, kept[i], p11, 5);
	}
}

static void test_backend(struct ctx *c)
{
	test_top(c);
	test_copy_many(c);
	enum toast_dtype types[] = {TOAST_DT_BF16, TOAST_DT_F16, TOAST_DT_F32};
	int o1[] = {7}, o2[] = {33, 5}, o3[] = {129, 64, 1, 300}, o4[] = {4097}, o5[] = {300}, o6[] = {256, 8, 8, 512};
	for (int i = 0; i < 3; i++) {
		test_matmul(c, types[i], 1, o1, 1, 31, TOAST_MM_ACT, false, false);
		test_matmul(c, types[i], 5, o2, 2, 64, TOAST_MM_F32, false, false);
		test_matmul(c, types[i], 7, o3, 4, 96, TOAST_MM_ADD, false, false);
	}
	test_matmul(c, TOAST_DT_BF16, 1, o4, 1, 256, TOAST_MM_ADD, false, false);
	test_matmul(c, TOAST_DT_BF16, 31, o5, 1, 4097, TOAST_MM_ACT, false, false);
	/* the fused RMSNorm input: decode-sized and prefill-sized T, 1 to 4 outputs, odd n_in */
	test_matmul(c, TOAST_DT_BF16, 1, o6, 4, 128, TOAST_MM_F32, true, true);
	test_matmul(c, TOAST_DT_BF16, 3, o2, 2, 31, TOAST_MM_F32, true, false);
	test_matmul(c, TOAST_DT_BF16, 8, o3, 4, 2048, TOAST_MM_F32, true, true);
	test_matmul(c, TOAST_DT_BF16, 9, o2, 2, 136, TOAST_MM_F32, true, true);
	test_matmul(c, TOAST_DT_BF16, 64, o5, 1, 4097, TOAST_MM_F32, true, true);
	/* SiLU(gate) * up (a dense MLP): decode (one GEMV launch on a GPU), odd n_in, prefill */
	int o8[] = {1536}, o9[] = {12288};
	test_matmul(c, TOAST_DT_BF16, 1, o8, 1, 576, TOAST_MM_GLU, true, false);
	test_matmul(c, TOAST_DT_BF16, 1, o5, 1, 31, TOAST_MM_GLU, false, false);
	test_matmul(c, TOAST_DT_BF16, 1, o9, 1, 256, TOAST_MM_GLU, true, true); /* four rows a warp elsewhere */
	test_matmul(c, TOAST_DT_BF16, 3, o5, 1, 136, TOAST_MM_GLU, true, false);
	test_matmul(c, TOAST_DT_BF16, 33, o5, 1, 136, TOAST_MM_GLU, false, false);
	test_attention(c, 4, 2, 64, 16, true, true, 5, 0, 0, TOAST_KV_ACT);
	test_attention(c, 4, 2, 64, 16, true, true, 5, 1, 0, TOAST_KV_ACT);
	test_attention(c, 3, 1, 32, 32, false, true, 1, 7, 0, TOAST_KV_ACT);
	test_attention(c, 2, 2, 24, 8, false, false, 9, 33, 0, TOAST_KV_ACT);
	test_attention(c, 16, 2, 256, 64, true, true, 7, 1, 0, TOAST_KV_ACT);
	/* prefill on tensor cores: several row blocks and key tiles, partial ones, a second chunk
	 * after the first; rows that do not fill a block evenly (3 heads a KV head); a short chunk
	 * after a long history (split keys) */
	test_attention(c, 16, 2, 256, 64, true, true, 150, 77, 0, TOAST_KV_ACT);
	test_attention(c, 6, 2, 128, 32, false, true, 100, 40, 0, TOAST_KV_ACT);
	test_attention(c, 2, 2, 128, 128, true, false, 65, 64, 0, TOAST_KV_ACT);
	test_attention(c, 4, 2, 64, 64, true, true, 700, 20, 0, TOAST_KV_ACT);
	/* decode on tensor cores after a long prompt (several key tiles and splits), 16 query
	 * heads a KV head (the most it takes) */
	test_attention(c, 4, 2, 64, 64, true, true, 700, 1, 0, TOAST_KV_ACT);
	test_attention(c, 16, 1, 128, 128, true, true, 300, 1, 0, TOAST_KV_ACT);
	/* decode: the ring of key tiles going round at head_dim 256 (5 tiles in one split); more
	 * splits than the combine has groups (a span of 2048: 8 splits of 76 keys); and 8 splits at
	 * position 5 (2 without keys) */
	test_attention(c, 2, 1, 256, 64, true, true, 260, 1, 0, TOAST_KV_ACT);
	test_attention(c, 4, 2, 64, 64, true, true, 600, 1, 2048, TOAST_KV_ACT);
	test_attention(c, 16, 2, 256, 64, true, true, 5, 1, 2048, TOAST_KV_ACT);
	/* decode in one split (the attention kernel writes the output, 64 dims a block): the new
	 * key in a late tile, without norms or gate; at pos 0, then 1; 16 query heads a KV head */
	test_attention(c, 6, 2, 128, 32, false, false, 200, 1, 0, TOAST_KV_ACT);
	test_attention(c, 4, 2, 64, 64, true, true, 1, 1, 0, TOAST_KV_ACT);
	test_attention(c, 16, 1, 128, 128, true, true, 100, 1, 0, TOAST_KV_ACT);
	/* the same heads in four splits (partials and the combine) */
	test_attention(c, 16, 1, 128, 128, true, true, 300, 1, 1024, TOAST_KV_ACT);
	/* decode in many splits: 32 of 7 keys; as many as are resident (66 on an H200), most
	 * without keys; 8 KV heads of 128 dims in 16 */
	test_attention(c, 16, 2, 256, 64, true, true, 200, 1, 8192, TOAST_KV_ACT);
	test_attention(c, 16, 2, 256, 64, true, true, 5, 1, 32768, TOAST_KV_ACT);
	test_attention(c, 32, 8, 128, 128, true, false, 150, 1, 4096, TOAST_KV_ACT);
	/* steps of 2 to 8 tokens (speculative decoding's) take the decode kernel where their query
	 * rows are few (n_rep <= 16): in one split (the output written by it), in splits, query rows
	 * of two tokens in one block (n_rep 3, 6), an 8-bit cache; n_rep 17 takes prefill's */
	test_attention(c, 16, 2, 256, 64, true, true, 5, 2, 0, TOAST_KV_ACT);
	test_attention(c, 16, 2, 256, 64, true, true, 300, 4, 1024, TOAST_KV_ACT);
	test_attention(c, 6, 2, 128, 32, false, true, 100, 8, 0, TOAST_KV_Q8);
	test_attention(c, 12, 2, 64, 64, true, true, 603, 3, 2048, TOAST_KV_Q8);
	test_attention(c, 32, 2, 128, 128, true, false, 40, 2, 4096, TOAST_KV_ACT);
	test_attention(c, 34, 2, 64, 64, true, true, 10, 3, 0, TOAST_KV_ACT);
	/* the 8-bit cache: prefill and decode at each head_dim, in one split and in several, a
	 * split's last unit partly past its keys, odd positions (units of 4 split across calls) */
	test_attention(c, 4, 2, 64, 16, true, true, 5, 1, 0, TOAST_KV_Q8);
	test_attention(c, 3, 1, 32, 32, false, true, 1, 7, 0, TOAST_KV_Q8);
	test_attention(c, 2, 2, 24, 8, false, false, 9, 33, 0, TOAST_KV_Q8);
	test_attention(c, 16, 2, 256, 64, true, true, 150, 77, 0, TOAST_KV_Q8);
	test_attention(c, 6, 2, 128, 32, false, true, 101, 40, 0, TOAST_KV_Q8);
	test_attention(c, 4, 2, 64, 64, true, true, 701, 19, 0, TOAST_KV_Q8);
	test_attention(c, 2, 1, 256, 64, true, true, 261, 1, 0, TOAST_KV_Q8);
	test_attention(c, 4, 2, 64, 64, true, true, 603, 1, 2048, TOAST_KV_Q8);
	/* splits of a length that is not whole units, rounded up to them: decode, 8 splits of 73
	 * keys; prefill after a history, 5 splits of 145 */
	test_attention(c, 4, 2, 64, 64, true, true, 583, 1, 2048, TOAST_KV_Q8);
	test_attention(c, 4, 2, 64, 64, true, true, 703, 19, 0, TOAST_KV_Q8);
	test_attention(c, 16, 2, 256, 64, true, true, 5, 1, 2048, TOAST_KV_Q8);
	test_attention(c, 6, 2, 128, 32, false, false, 199, 1, 0, TOAST_KV_Q8);
	test_attention(c, 16, 1, 128, 128, true, true, 302, 1, 1024, TOAST_KV_Q8);
	test_attention(c, 32, 1, 128, 128, true, true, 77, 1, 0, TOAST_KV_Q8);
	test_attention(c, 16, 2, 256, 64, true, true, 201, 1, 8192, TOAST_KV_Q8);
	test_attention(c, 16, 2, 256, 64, true, true, 203, 1, 32768, TOAST_KV_Q8);
	test_gdn_shapes(c);
	test_moe(c, 1, 32, 8, 2, 16, 0, false, false);
	test_moe(c, 5, 48, 16, 4, 24, 20, true, true);
	test_moe(c, 13, 33, 7, 3, 17, 9, true, false);
	test_moe(c, 2, 64, 4, 4, 8, 8, false, true);
	test_moe(c, 70, 128, 16, 4, 64, 64, true, true);  /* prefill-sized: the grouped path on a GPU */
	test_moe(c, 33, 64, 8, 2, 128, 0, false, false);
	/* decode choosing among Qwen3-Next's 512 experts (on a GPU each expert kernel chooses from
	 * the logits: every lane's 16 of them), 500 (the last ones short), more than a warp can hold
	 * (600: the router's last block chooses), and 10 of 64 in Q4_K */
	test_moe(c, 3, 64, 512, 10, 16, 16, true, true);
	test_moe(c, 1, 32, 500, 33, 8, 0, false, false);
	test_moe(c, 2, 64, 600, 8, 16, 0, true, false);
	/* a shared expert's gate over more of n_embd than the router's gate block holds in registers
	 * (2,048 of it; the rest loaded after the wait), with experts that are not whole warps of the
	 * router's blocks */
	test_moe(c, 1, 2304, 12, 3, 16, 16, true, true);
	/* tied logits, in groups of 5 or 6 and of 170 or 171 among 512 experts, of 7 or 8 among
	 * 64: which of the tied experts run is decided by the tie rule (the lower index first) */
	int periods[] = {100, 3, 9};
	for (int i = 0; i < 3; i++) {
		moe_tie_period = periods[i];
		test_moe(c, 2, 64, i < 2 ? 512 : 64, 10, 16, 16, true, true);
	}
	moe_tie_period = 0;
	test_moe_types(c, 2, 256, 64, 10, 256, 256, true, true, &moe_q4k);
}

/* The tensor-core gate/up kernel choosing 10 of 512 experts, Qwen3-Next's decode (each block
 * picks its slot's expert from the router's logits), with tied logits in groups of 5 or 6 and of
 * 170 or 171 (test_backend has these only for bf16 experts, which take the other kernel, and
 * Q4_K among 64). GPU only: the weights of 512 experts are the test's cost, and the CPU backend
 * chooses the same way at any number of experts (test_backend). */
static void test_moe_pick(struct ctx *c)
{
	int periods[] = {0, 100, 3};
	for (int i = 0; i < 3; i++) {
		moe_tie_period = periods[i];
		test_moe_types(c, i ? 1 : 2, 256, 512, 10, 256, i ? 0 : 256, true, true, &moe_q4k);
	}
	moe_tie_period = 0;
}

/* MoE at prefill sizes (T > 8), the CUDA backend's grouped GEMMs (n_embd % 128, n_ff % 64): row
 * tiles of 64 token-slots per expert, several per expert and partial, experts with no rows,
 * Qwen3-Next's n_embd 2048 / n_ff 512 and narrower, bf16 and packed weights, gate and up of two
 * types. Run on the GPU only: the CPU backend has no such path, and the reference is the cost. */
static void test_moe_prefill(struct ctx *c)
{
	struct moe_types k5 = {TOAST_DT_BF16, TOAST_DT_Q5_K, TOAST_DT_Q6_K, TOAST_DT_BF16};
	struct moe_types q4k_bf16 = {TOAST_DT_BF16, TOAST_DT_Q4_K, TOAST_DT_BF16, TOAST_DT_BF16};
	/* 300 slots over 3 experts: about 100 rows each, two tiles, the second partial */
	test_moe_types(c, 150, 2048, 3, 2, 512, 512, true, true, &moe_bf16);
	test_moe_types(c, 150, 2048, 3, 2, 512, 512, true, true, &moe_q4k);
	test_moe_types(c, 150, 2048, 3, 2, 512, 0, true, false, &moe_mlx4);
	test_moe_types(c, 150, 2048, 3, 2, 512, 512, false, true, &moe_q8);
	/* 520 slots over 2 experts: every token on both, 260 rows: two whole 128-row tiles and one
	 * of 4 */
	test_moe_types(c, 260, 256, 2, 2, 128, 128, true, true, &moe_bf16);
	/* groups of 128 rows or more on average: K-quant (and bf16, above) weights take 128-row
	 * tiles (two whole and a partial one of 4 rows), the others 64-row ones; uneven groups over
	 * 4 experts */
	test_moe_types(c, 260, 256, 2, 2, 256, 256, true, true, &moe_q4k);
	test_moe_types(c, 260, 256, 2, 2, 128, 0, true, false, &moe_mlx4);
	test_moe_types(c, 300, 256, 4, 2, 256, 256, true, true, &moe_q8);
	test_moe_types(c, 260, 512, 2, 2, 256, 256, true, true, &k5);
	/* 40 slots over 64 experts: most have no rows, the rest one partial tile */
	test_moe_types(c, 20, 256, 64, 2, 128, 0, true, false, &moe_bf16);
	test_moe_types(c, 20, 256, 64, 2, 128, 128, true, true, &moe_q8);
	test_moe_types(c, 20, 256, 64, 2, 128, 128, true, true, &moe_mlx4);
	test_moe_types(c, 20, 256, 64, 2, 256, 256, true, true, &moe_q4k);
	/* narrower: n_embd 256 (two 128-column tiles of down), n_ff 128 (two 64-column tiles of
	 * gate/up, two k steps of down); n_ff 256 for the 256-element blocks */
	test_moe_types(c, 100, 256, 4, 3, 128, 128, true, true, &moe_bf16);
	test_moe_types(c, 100, 256, 4, 3, 128, 128, true, true, &moe_q8);
	test_moe_types(c, 100, 256, 4, 3, 256, 0, true, false, &moe_q4k);
	test_moe_types(c, 100, 256, 4, 3, 256, 256, true, true, &k5);
	/* gate and up of two types: the kernel's any-type path */
	test_moe_up(c, 100, 256, 4, 3, 256, 256, true, true, &q4k_bf16, TOAST_DT_Q8_0);
	/* more experts than a warp chooses from (the top-k by a block per token) */
	test_moe_types(c, 20, 256, 520, 2, 64, 64, true, true, &moe_bf16);
}

/* what the CUDA backend cannot compute is refused when the weight is prepared, by name */
static void test_cuda_refusals(struct ctx *c)
{
	struct toast_backend *be = c->be;
	struct toast_error err;
	int32_t ints[64] = {0};
	struct toast_weight w = {.name = "blk.0.odd.weight", .type = TOAST_DT_I32, .n_in = 8, .n_out = 8, .data = ints,
				 .n_bytes = sizeof(ints)};
	CHECK(be->ops->prepare_weight(be, &w, &err) != TOAST_OK && strstr(err.msg, "blk.0.odd.weight"),
	      "an I32 matrix was not refused by name");
	uint32_t q[64] = {0};
	uint16_t sb[16] = {0};
	struct toast_weight m = {.name = "blk.0.mlx16.weight", .type = TOAST_DT_MLX4, .n_in = 64, .n_out = 2, .data = q,
				 .n_bytes = 64 + 32, .scales = sb, .biases = sb, .sb_type = TOAST_DT_BF16, .group_size = 16};
	CHECK(be->ops->prepare_weight(be, &m, &err) != TOAST_OK && strstr(err.msg, "blk.0.mlx16.weight"),
	      "an MLX weight of group 16 was not refused by name");
	uint8_t blk[144 * 2] = {0}; /* a Q4_K row of 64 elements: a quarter of a superblock */
	struct toast_weight p = {.name = "blk.0.part.weight", .type = TOAST_DT_Q4_K, .n_in = 64, .n_out = 2, .data = blk,
				 .n_bytes = 0};
	CHECK(be->ops->prepare_weight(be, &p, &err) != TOAST_OK && strstr(err.msg, "blk.0.part.weight") &&
		      strstr(err.msg, "whole blocks"),
	      "a Q4_K weight of partial superblocks was not refused by name: %s", err.msg);
	struct toast_error e2;
	CHECK(be->ops->sync(be, &e2) == TOAST_OK, "a refused weight poisoned the backend: %s", e2.msg);
}

/* ---- --perf: each op at Qwen3-Next-80B-A3B decode shapes, time per call and bandwidth ---- */

#include "util/timeutil.h"

/* a synthetic weight of type t (vectors f32), made by the backend */
static struct toast_weight synth_t(struct toast_backend *be, const char *name, enum toast_dtype t, int64_t n_out,
				   int64_t n_in)
{
	struct toast_weight w;
	toast_synthetic_weight(&w, name, n_out == 1 ? TOAST_DT_F32 : t, n_out, n_in);
	struct toast_error err;
	CHECK(be->ops->prepare_weight(be, &w, &err) == TOAST_OK, "%s", err.msg);
	return w;
}

static struct toast_weight synth(struct toast_backend *be, const char *name, int64_t n_out, int64_t n_in)
{
	return synth_t(be, name, TOAST_DT_BF16, n_out, n_in);
}

static double perf_time(struct toast_backend *be, void (*fn)(void *), void *ctx)
{
	struct toast_error err;
	for (int i = 0; i < 5; i++)
		fn(ctx);
	be->ops->sync(be, &err);
	int n = 0;
	double t0 = toast_now(), t;
	do {
		fn(ctx);
		n++;
		if (n % 10 == 0)
			be->ops->sync(be, &err);
		t = toast_now() - t0;
	} while (t < 0.3 || n % 10);
	be->ops->sync(be, &err);
	return (toast_now() - t0) / n;
}

struct perf_mm {
	struct toast_backend *be;
	struct toast_mm_in in;
	struct toast_mm_out out[4];
	int n;
};
static void perf_mm_fn(void *p)
{
	struct perf_mm *c = p;
	c->be->ops->matmul(c->be, &c->in, c->out, c->n, 1);
}
static void perf_moe_fn(void *p)
{
	struct toast_backend **be = p;
	be[0]->ops->moe(be[0], (struct toast_moe_args *)be[1]);
}
static void perf_gdn_fn(void *p)
{
	struct toast_backend **be = p;
	be[0]->ops->gdn(be[0], (struct toast_gdn_args *)be[1]);
}
static void perf_attn_fn(void *p)
{
	struct toast_backend **be = p;
	be[0]->ops->attention(be[0], (struct toast_attn_args *)be[1]);
}

struct perf_top {
	struct toast_backend *be;
	const float *x;
	int n, m; /* m 0: read all n */
};
static void perf_top_fn(void *p)
{
	struct perf_top *c = p;
	static int32_t ids[256];
	static float vals[256], all[151936];
	struct toast_error err;
	if (c->m)
		c->be->ops->top(c->be, c->x, c->n, c->m, ids, vals, &err);
	else
		c->be->ops->read(c->be, all, c->x, (size_t)c->n * 4, &err);
}

static void perf_row(const char *name, double t, double bytes)
{
	printf("%-40s %10.1f us %10.1f GB/s\n", name, t * 1e6, bytes / t / 1e9);
}

/* the same for compute-bound ops: the rate of flops */
static void perf_row_flops(const char *name, double t, double flops)
{
	printf("%-40s %10.1f us %10.1f TFLOP/s\n", name, t * 1e6, flops / t / 1e12);
}

/* MoE decode at the Qwen3-Next shape (512 experts of 512x2048, top 10, shared expert): bytes
 * read are the router's and the 11 experts' (packed). On a GPU, prefill too: 4096 tokens, the
 * rate of the routed experts' flops (2 T k 3 n_embd n_ff; the router, the shared expert and the
 * grouping are in the time, not in the count) */
static void perf_moe(struct toast_backend *be, float *x, const struct toast_weight *nw, enum toast_dtype type,
		     enum toast_dtype router_type)
{
	const int E = 2048, NE = 512, F = 512, K = 10;
	struct toast_weight router = synth_t(be, "perf.router", router_type, NE, E);
	struct toast_experts G = {NE, calloc(NE, sizeof(struct toast_weight)), NULL}, U = G, D = G;
	U.w = calloc(NE, sizeof(struct toast_weight));
	D.w = calloc(NE, sizeof(struct toast_weight));
	for (int e = 0; e < NE; e++) {
		toast_synthetic_weight(&G.w[e], "perf.g", type, F, E);
		toast_synthetic_weight(&U.w[e], "perf.u", type, F, E);
		toast_synthetic_weight(&D.w[e], "perf.d", type, E, F);
	}
	struct toast_error err;
	CHECK(be->ops->prepare_experts(be, &G, &err) == TOAST_OK && be->ops->prepare_experts(be, &U, &err) == TOAST_OK &&
		      be->ops->prepare_experts(be, &D, &err) == TOAST_OK, "%s", err.msg);
	struct toast_weight sg = synth_t(be, "perf.sg", type, F, E), su = synth_t(be, "perf.su", type, F, E);
	struct toast_weight sd = synth_t(be, "perf.sd", type, E, F), sgi = synth(be, "perf.sgi", 1, E);
	struct toast_moe_args ma = {x, nw, 1e-6f, true, &router, &G, &U, &D, NE, K, true, &sg, &su, &sd, &sgi, E, F, F, 1};
	void *mctx[2] = {be, &ma};
	char name[80];
	snprintf(name, sizeof(name), "moe %s 512 experts top-10 + shared", toast_dtype_name(type));
	perf_row(name, perf_time(be, perf_moe_fn, mctx),
		 (double)router.n_bytes + (K + 1.0) * (G.w[0].n_bytes + U.w[0].n_bytes + D.w[0].n_bytes));
	if (toast_backend_cuda_available()) { /* minutes a call on a CPU */
		const int TP = 4096;
		float *xph = rand_vec((size_t)TP * E, 3);
		struct toast_moe_args pa = ma;
		pa.x = put(be, xph, (size_t)TP * E, false);
		pa.T = TP;
		void *pctx[2] = {be, &pa};
		snprintf(name, sizeof(name), "moe prefill %s T=4096 (routed flops)", toast_dtype_name(type));
		perf_row_flops(name, perf_time(be, perf_moe_fn, pctx), 2.0 * TP * K * 3 * E * F);
		be->ops->release(be, pa.x);
		free(xph);
	}
	free(G.w), free(U.w), free(D.w);
}

/* the quantised GEMVs and MoE of a decode step at Qwen3-Next shapes, GB/s of packed bytes */
static void perf_quant(struct toast_backend *be, float *x, const struct toast_weight *nw, enum toast_dtype type)
{
	const int E = 2048, V = 151936;
	const char *tn = toast_dtype_name(type);
	char name[80];
	struct toast_weight wqkvz = synth_t(be, "perf.q.qkvz", type, 12288, E), wba = synth_t(be, "perf.q.ba", type, 64, E);
	float *yq = be->ops->alloc(be, 12288 * 4), *yb = be->ops->alloc(be, 64 * 4);
	struct perf_mm mm = {be,
			     {.norm_x = x, .norm_w = nw, .eps = 1e-6f, .plus_one = true},
			     {{.out = yq, .mode = TOAST_MM_F32, .W = &wqkvz}, {.out = yb, .mode = TOAST_MM_F32, .W = &wba}},
			     2};
	snprintf(name, sizeof(name), "gemv %s qkvz+ba 12352x2048 (normed in)", tn);
	perf_row(name, perf_time(be, perf_mm_fn, &mm), (double)wqkvz.n_bytes + wba.n_bytes);
	struct toast_weight wout = synth_t(be, "perf.q.out", type, E, 4096);
	float *a4 = rand_vec(4096, 1);
	void *act = put(be, a4, 4096, true);
	struct perf_mm mo = {be, {.act = act}, {{.out = x, .mode = TOAST_MM_ADD, .W = &wout}}, 1};
	snprintf(name, sizeof(name), "gemv %s out_proj 2048x4096 (+= res.)", tn);
	perf_row(name, perf_time(be, perf_mm_fn, &mo), (double)wout.n_bytes);
	struct toast_weight wexp = synth_t(be, "perf.q.exp", type, 512, E);
	float *ye = be->ops->alloc(be, 512 * 4);
	struct perf_mm me = {be, {.norm_x = x, .norm_w = nw, .eps = 1e-6f, .plus_one = true},
			     {{.out = ye, .mode = TOAST_MM_F32, .W = &wexp}}, 1};
	snprintf(name, sizeof(name), "gemv %s 512x2048 (one expert matrix)", tn);
	perf_row(name, perf_time(be, perf_mm_fn, &me), (double)wexp.n_bytes);
	struct toast_weight wlm = synth_t(be, "perf.q.lm_head", type, V, E);
	float *lg = be->ops->alloc(be, (size_t)V * 4);
	struct perf_mm ml = {be, {.norm_x = x, .norm_w = nw, .eps = 1e-6f, .plus_one = true},
			     {{.out = lg, .mode = TOAST_MM_F32, .W = &wlm}}, 1};
	snprintf(name, sizeof(name), "gemv %s lm_head 151936x2048", tn);
	perf_row(name, perf_time(be, perf_mm_fn, &ml), (double)wlm.n_bytes);
	perf_moe(be, x, nw, type, type == TOAST_DT_MLX4 || type == TOAST_DT_MLX8 ? TOAST_DT_MLX8 : TOAST_DT_BF16);
	be->ops->release(be, yq), be->ops->release(be, yb), be->ops->release(be, act), be->ops->release(be, ye);
	be->ops->release(be, lg);
	free(a4);
}

static void perf_backend(struct toast_backend *be)
{
	const int E = 2048, V = 151936;
	float *xh = rand_vec((size_t)E, 3);
	float *x = put(be, xh, E, false);
	struct toast_weight nw = synth(be, "perf.norm", 1, E);
	int32_t id0 = 0;
	be->ops->begin_step(be, &id0, 1, 0);
	/* GDN input projections: qkvz + ba, normed input */
	struct toast_weight wqkvz = synth(be, "perf.qkvz", 12288, E), wba = synth(be, "perf.ba", 64, E);
	float *yq = be->ops->alloc(be, 12288 * 4), *yb = be->ops->alloc(be, 64 * 4);
	struct perf_mm mm = {be,
			     {.norm_x = x, .norm_w = &nw, .eps = 1e-6f, .plus_one = true},
			     {{.out = yq, .mode = TOAST_MM_F32, .W = &wqkvz}, {.out = yb, .mode = TOAST_MM_F32, .W = &wba}},
			     2};
	perf_row("gemv qkvz+ba 12352x2048 (normed in)", perf_time(be, perf_mm_fn, &mm), 12352.0 * E * 2);
	/* out_proj: act input, residual add */
	struct toast_weight wout = synth(be, "perf.out", E, 4096);
	float *a4 = rand_vec(4096, 1);
	void *act = put(be, a4, 4096, true);
	struct perf_mm mo = {be, {.act = act}, {{.out = x, .mode = TOAST_MM_ADD, .W = &wout}}, 1};
	perf_row("gemv out_proj 2048x4096 (+= residual)", perf_time(be, perf_mm_fn, &mo), 2048.0 * 4096 * 2);
	/* lm_head */
	struct toast_weight wlm = synth(be, "perf.lm_head", V, E);
	float *lg = be->ops->alloc(be, (size_t)V * 4);
	struct perf_mm ml = {be, {.norm_x = x, .norm_w = &nw, .eps = 1e-6f, .plus_one = true},
			     {{.out = lg, .mode = TOAST_MM_F32, .W = &wlm}}, 1};
	perf_row("gemv lm_head 151936x2048", perf_time(be, perf_mm_fn, &ml), (double)V * E * 2);
	/* the next token from the logits: the top 1 and the top 20 (what sampling reads) against
	 * reading all of them */
	for (int m = 1; m <= 20; m += 19) {
		struct perf_top pt = {be, lg, V, m};
		char name[64];
		snprintf(name, sizeof(name), "top %d of %d logits (to the host)", m, V);
		perf_row(name, perf_time(be, perf_top_fn, &pt), (double)V * 4);
	}
	{
		struct perf_top pt = {be, lg, V, 0};
		perf_row("read all 151936 logits", perf_time(be, perf_top_fn, &pt), (double)V * 4);
	}
	perf_moe(be, x, &nw, TOAST_DT_BF16, TOAST_DT_BF16);
	/* the same with 4-bit weights (GGUF Q4_K, MLX affine 4-bit): GB/s of the packed bytes */
	perf_quant(be, x, &nw, TOAST_DT_Q4_K);
	perf_quant(be, x, &nw, TOAST_DT_MLX4);
	/* GDN decode */
	int nk = 16, nv = 32, dk = 128, dv = 128, cd = 2 * nk * dk + nv * dv;
	struct toast_weight cw = synth(be, "perf.conv", cd, 4), Al = synth(be, "perf.A", 1, nv);
	struct toast_weight dt = synth(be, "perf.dt", 1, nv), gn = synth(be, "perf.gn", 1, dv);
	float *qkvz = be->ops->alloc(be, (size_t)(cd + nv * dv) * 4), *ba = be->ops->alloc(be, 2 * nv * 4);
	float *cst = be->ops->alloc(be, 2 * 3 * (size_t)cd * 4), *ssm = be->ops->alloc(be, (size_t)nv * dv * dk * 4);
	float *gout = be->ops->alloc(be, (size_t)nv * dv * sizeof(float));
	struct toast_gdn_args ga = {qkvz, NULL, ba, NULL, true, true, &cw, &Al, false, &dt, &gn, nk, nv, dk, dv, 4, 1e-6f,
				    cst, ssm, 0, 1, gout, false, NULL, NULL};
	void *gctx[2] = {be, &ga};
	perf_row("gdn decode (32 heads, state r+w)", perf_time(be, perf_gdn_fn, gctx), 2.0 * nv * dv * dk * 4);
	/* GDN prefill: a 4,096-token chunk; bytes of q/k/v in and o out */
	{
		const int TP = 4096;
		float *pq = be->ops->alloc(be, (size_t)TP * (cd + nv * dv) * 4), *pba = be->ops->alloc(be, (size_t)TP * 2 * nv * 4);
		float *pout = be->ops->alloc(be, (size_t)TP * nv * dv * sizeof(float));
		int32_t *pids = calloc((size_t)TP, sizeof(int32_t));
		be->ops->begin_step(be, pids, TP, 0);
		struct toast_gdn_args gp = {pq, NULL, pba, NULL, true, true, &cw, &Al, false, &dt, &gn, nk, nv, dk, dv, 4,
					    1e-6f, cst, ssm, 0, TP, pout, false, NULL, NULL};
		void *pctx[2] = {be, &gp};
		perf_row("gdn prefill 4096 (qkv in, o out)", perf_time(be, perf_gdn_fn, pctx),
			 (double)TP * cd * 4 + (double)TP * nv * dv * 4);
		be->ops->release(be, pq), be->ops->release(be, pba), be->ops->release(be, pout);
		free(pids);
	}
	/* attention decode at several contexts; the last row reads the same bytes in the same grid
	 * as the one before it from a cache of one KV head, whose rows lie end to end (two KV heads
	 * interleave their halves of each 1 KB row): what the cache's layout costs */
	int ctxs[] = {4096, 28672, 69632, 139264, 4096, 69632}, kvs[] = {2, 2, 2, 1, 2, 2};
	for (int i = 0; i < 6; i++) {
		int n_ctx = ctxs[i], hd = 256, n_kv = kvs[i], kvd = n_kv * hd;
		enum toast_kv_type kv = i >= 4 ? TOAST_KV_Q8 : TOAST_KV_ACT; /* the last two: an 8-bit cache */
		size_t kvb = toast_kv_bytes(kv, n_kv, hd, be->act_size, n_ctx);
		void *kc = be->ops->alloc(be, kvb), *vc = be->ops->alloc(be, kvb);
		float *q = be->ops->alloc(be, 16 * 2 * hd * 4), *k = be->ops->alloc(be, kvd * 4), *v = be->ops->alloc(be, kvd * 4);
		void *o = be->ops->alloc(be, 16 * hd * be->act_size);
		struct toast_weight qn = synth(be, "perf.qn", 1, hd), kn = synth(be, "perf.kn", 1, hd);
		int pos = n_ctx - 1;
		be->ops->begin_step(be, &id0, 1, pos);
		struct toast_attn_args aa = {q, k, v, &qn, &kn, true, 1e-6f, 8 * n_kv, n_kv, hd, 64, 1e7f, TOAST_DT_BF16, true,
					     kv, kc, vc, n_ctx, pos, 1, o, 0};
		void *actx[2] = {be, &aa};
		char name[64];
		snprintf(name, sizeof(name), "attention decode at %d%s", n_ctx,
			 n_kv == 1 ? " (1 KV head)" : kv == TOAST_KV_Q8 ? " (8-bit cache)" : "");
		perf_row(name, perf_time(be, perf_attn_fn, actx), 2.0 * kvb);
		be->ops->release(be, kc), be->ops->release(be, vc), be->ops->release(be, q), be->ops->release(be, k);
		be->ops->release(be, v), be->ops->release(be, o);
	}
	/* attention prefill: a 4,096-token chunk at the start and at the end of a 16K prompt;
	 * FLOPs of the causal QKᵀ and PV products */
	int pre[] = {0, 12288}, TP = 4096;
	int32_t *ids = calloc((size_t)TP, sizeof(int32_t));
	for (int i = 0; i < 2; i++) {
		int n_ctx = pre[i] + TP, hd = 256, kvd = 2 * hd;
		void *kc = be->ops->alloc(be, (size_t)n_ctx * kvd * be->act_size), *vc = be->ops->alloc(be, (size_t)n_ctx * kvd * be->act_size);
		float *q = be->ops->alloc(be, (size_t)TP * 16 * 2 * hd * 4), *k = be->ops->alloc(be, (size_t)TP * kvd * 4);
		float *v = be->ops->alloc(be, (size_t)TP * kvd * 4);
		void *o = be->ops->alloc(be, (size_t)TP * 16 * hd * be->act_size);
		struct toast_weight qn = synth(be, "perf.qn", 1, hd), kn = synth(be, "perf.kn", 1, hd);
		be->ops->begin_step(be, ids, TP, pre[i]);
		struct toast_attn_args aa = {q, k, v, &qn, &kn, true, 1e-6f, 16, 2, hd, 64, 1e7f, TOAST_DT_BF16, true,
					     TOAST_KV_ACT, kc, vc, n_ctx, pre[i], TP, o, 0};
		void *actx[2] = {be, &aa};
		char name[64];
		snprintf(name, sizeof(name), "attention prefill 4096 at %d", pre[i]);
		double pairs = (double)TP * pre[i] + (double)TP * (TP + 1) / 2;
		perf_row_flops(name, perf_time(be, perf_attn_fn, actx), 4.0 * 16 * hd * pairs);
		be->ops->release(be, kc), be->ops->release(be, vc), be->ops->release(be, q), be->ops->release(be, k);
		be->ops->release(be, v), be->ops->release(be, o);
	}
	free(ids);
	free(xh), free(a4);
}

/* one group of tests alone on the CUDA backend (a GPU session's quick check) */
static int test_on_gpu(const char *what, void (*run)(struct ctx *))
{
	struct toast_backend *be;
	struct toast_error err;
	CHECK(toast_backend_cuda_new(&be, &err) == TOAST_OK, "%s", err.msg);
	if (!test_failures) {
		struct ctx c = {.be = be, .name = "cuda", .tol = 1.5e-2};
		run(&c);
		toast_backend_free(be);
	}
	return test_done(what);
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--perf") == 0) {
		struct toast_backend *be;
		struct toast_error err;
		bool cuda = toast_backend_cuda_available();
		if ((cuda ? toast_backend_cuda_new(&be, &err) : toast_backend_cpu_new(0, &be, &err)) != TOAST_OK) {
			fprintf(stderr, "%s\n", err.msg);
			return 1;
		}
		printf("op timings on the %s backend (Qwen3-Next-80B-A3B decode shapes)\n", be->name);
		perf_backend(be);
		toast_backend_free(be);
		return test_done("test_ops --perf");
	}
	if (argc > 1 && strcmp(argv[1], "kernels") == 0) /* test_quant_kernels alone (a GPU's) */
		return test_on_gpu("test_ops kernels", test_quant_kernels);
	if (argc > 1 && strcmp(argv[1], "gdn") == 0) /* the DeltaNet op alone, on a GPU */
		return test_on_gpu("test_ops gdn", test_gdn_shapes);
	if (argc > 1 && strcmp(argv[1], "top") == 0) { /* top() and the picks alone, on each backend */
		struct toast_backend *be;
		struct toast_error err;
		for (int k = 0; k < 2; k++) {
			if (k == 1 && !toast_backend_cuda_available())
				break;
			bool ok = (k ? toast_backend_cuda_new(&be, &err) : toast_backend_cpu_new(1, &be, &err)) == TOAST_OK;
			CHECK(ok, "%s", err.msg);
			if (!ok)
				continue;
			struct ctx c = {.be = be, .name = k ? "cuda" : "cpu", .tol = 0};
			test_top(&c);
			toast_backend_free(be);
		}
		return test_done("test_ops top");
	}
	int threads[] = {1, 3};
	for (int i = 0; i < 2; i++) {
		struct toast_backend *be;
		struct toast_error err;
		CHECK(toast_backend_cpu_new(threads[i], &be, &err) == TOAST_OK, "%s", err.msg);
		char name[32];
		snprintf(name, sizeof(name), "cpu/%d", threads[i]);
		struct ctx c = {.be = be, .name = name, .tol = 2e-5};
		test_backend(&c);
		test_matmul_precise(&c);
		if (i == 0) /* the CPU reads quantised weights the same way with any number of threads */
			test_quant(&c);
		toast_backend_free(be);
	}
	if (toast_backend_cuda_available()) {
		struct toast_backend *be;
		struct toast_error err;
		CHECK(toast_backend_cuda_new(&be, &err) == TOAST_OK, "%s", err.msg);
		struct ctx c = {.be = be, .name = "cuda", .tol = 1.5e-2};
		test_backend(&c);
		test_matmul_precise(&c);
		test_quant(&c);
		test_quant_kernels(&c);
		test_moe_pick(&c);
		test_moe_prefill(&c);
		test_cuda_refusals(&c);
		toast_backend_free(be);
	} else {
		printf("test_ops: cuda SKIP (no CUDA device in this build or machine)\n");
	}
	return test_done("test_ops");
}
