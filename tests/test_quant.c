/*
 * test_quant.c - quantised weight formats:
 *   - every GGUF block type and MLX affine dequantised bit-exactly against a reference written
 *     here from the specification, one element at a time by index (not from src/format/quant.c);
 *   - the quantisers' round trip (quantise -> dequantise) within per-type error bounds, and
 *     exactness where the format can represent the input;
 *   - the CPU backend's matmul with quantised weights against an f64 reference over the
 *     dequantised values, on awkward shapes (1, 7, 31 rows; 1 and 5 tokens; 1 and 3 threads).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "format/quant.h"
#include "test.h"
#include "util/half.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t rnd32(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 32);
}

static double rndu(void) /* [-1, 1) */
{
	return (double)rnd32() / 2147483648.0 - 1.0;
}

static double rndn(void) /* roughly normal */
{
	return (rndu() + rndu() + rndu() + rndu()) * 0.866;
}

/* a random finite half of moderate size (weights' scales are small positive or negative) */
static uint16_t rnd_half(void)
{
	return toast_f32_to_f16((float)(rndu() * 0.05));
}

static float h2f(const uint8_t *p)
{
	return toast_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

static void seth(uint8_t *p, uint16_t h)
{
	p[0] = (uint8_t)h;
	p[1] = (uint8_t)(h >> 8);
}

/* ---- the specification, element by element ---- */

static float spec_q4_0(const uint8_t *b, int k)
{
	int q = k < 16 ? b[2 + k] & 15 : b[2 + k - 16] >> 4;
	return (float)(q - 8) * h2f(b);
}

static float spec_q4_1(const uint8_t *b, int k)
{
	int q = k < 16 ? b[4 + k] & 15 : b[4 + k - 16] >> 4;
	return (float)q * h2f(b) + h2f(b + 2);
}

static float spec_q8_0(const uint8_t *b, int k)
{
	return (float)(int8_t)b[2 + k] * h2f(b);
}

static void spec_k_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	} else {
		*sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
		*m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
	}
}

static float spec_q4_k(const uint8_t *b, int k)
{
	int j = k / 32, sc, m;
	spec_k_scale_min(b + 4, j, &sc, &m);
	uint8_t byte = b[16 + 32 * (j / 2) + k % 32];
	int q = j % 2 == 0 ? byte & 15 : byte >> 4;
	return (h2f(b) * (float)sc) * (float)q - (h2f(b + 2) * (float)m);
}

static float spec_q5_k(const uint8_t *b, int k)
{
	int j = k / 32, sc, m;
	spec_k_scale_min(b + 4, j, &sc, &m);
	uint8_t byte = b[48 + 32 * (j / 2) + k % 32];
	int q = (j % 2 == 0 ? byte & 15 : byte >> 4) + ((b[16 + k % 32] >> j & 1) ? 16 : 0);
	return (h2f(b) * (float)sc) * (float)q - (h2f(b + 2) * (float)m);
}

static float spec_q6_k(const uint8_t *b, int k)
{
	int h = k / 128, r = k % 128, l = r % 32, s = r / 32;
	uint8_t lo = b[64 * h + l + 32 * (s & 1)];
	int low = s < 2 ? lo & 15 : lo >> 4;
	int high = b[128 + 32 * h + l] >> (2 * s) & 3;
	int q = (low | high << 4) - 32;
	return (h2f(b + 208) * (float)(int8_t)b[192 + k / 16]) * (float)q;
}

struct qtype {
	enum toast_dtype t;
	float (*spec)(const uint8_t *, int);
	int half_at[2]; /* byte offsets of f16 fields (-1: none) */
	double rt_bound; /* round-trip RMS error / RMS of the input, normal-ish data */
};

static const struct qtype qtypes[] = {
	{TOAST_DT_Q4_0, spec_q4_0, {0, -1}, 0.15},  {TOAST_DT_Q4_1, spec_q4_1, {0, 2}, 0.11},
	{TOAST_DT_Q8_0, spec_q8_0, {0, -1}, 0.009}, {TOAST_DT_Q4_K, spec_q4_k, {0, 2}, 0.09},
	{TOAST_DT_Q5_K, spec_q5_k, {0, 2}, 0.045},  {TOAST_DT_Q6_K, spec_q6_k, {208, -1}, 0.027},
};
#define N_QTYPES (int)(sizeof(qtypes) / sizeof(qtypes[0]))

static bool same_bits(float a, float b)
{
	return memcmp(&a, &b, sizeof(float)) == 0;
}

static void test_dequant_exact(void)
{
	enum { NB = 200 };
	for (int qi = 0; qi < N_QTYPES; qi++) {
		const struct qtype *q = &qtypes[qi];
		int blck = toast_dtypes[q->t].blck, bs = toast_dtypes[q->t].type_size;
		uint8_t *blocks = malloc((size_t)NB * bs);
		float *got = malloc((size_t)NB * blck * sizeof(float));
		for (int i = 0; i < NB * bs; i++)
			blocks[i] = (uint8_t)rnd32();
		for (int i = 0; i < NB; i++)
			for (int h = 0; h < 2; h++)
				if (q->half_at[h] >= 0)
					seth(blocks + (size_t)i * bs + q->half_at[h], rnd_half());
		toast_dequant(q->t, blocks, got, (int64_t)NB * blck);
		int bad = 0;
		for (int i = 0; i < NB; i++)
			for (int k = 0; k < blck; k++) {
				float want = q->spec(blocks + (size_t)i * bs, k);
				if (!same_bits(got[(size_t)i * blck + k], want) && bad++ < 3)
					fprintf(stderr, "%s block %d element %d: got %.9g want %.9g\n", toast_dtype_name(q->t),
						i, k, got[(size_t)i * blck + k], want);
			}
		CHECK(bad == 0, "%s: %d elements differ from the specification", toast_dtype_name(q->t), bad);
		/* a row offset: dequantising blocks 3.. gives the same values as from the start */
		toast_dequant(q->t, blocks + 3 * bs, got, (int64_t)2 * blck);
		CHECK(same_bits(got[blck + 5], q->spec(blocks + 4 * bs, 5)), "%s: offset dequantisation",
		      toast_dtype_name(q->t));
		free(blocks);
		free(got);
	}
}

static void test_dequant_mlx(void)
{
	const enum toast_dtype sbt[] = {TOAST_DT_BF16, TOAST_DT_F16, TOAST_DT_F32};
	for (int bits = 4; bits <= 8; bits += 4)
		for (int si = 0; si < 3; si++) {
			enum { GS = 64, N = 4 * GS };
			uint32_t q[N * 8 / 32];
			uint8_t sc[4 * 4], bi[4 * 4];
			float got[N];
			for (size_t i = 0; i < sizeof(q) / 4; i++)
				q[i] = rnd32();
			for (int g = 0; g < 4; g++) {
				float s = (float)(rndu() * 0.02), z = (float)(rndu() * 0.1);
				if (sbt[si] == TOAST_DT_F32) {
					memcpy(sc + 4 * g, &s, 4);
					memcpy(bi + 4 * g, &z, 4);
				} else {
					uint16_t hs = sbt[si] == TOAST_DT_BF16 ? toast_f32_to_bf16(s) : toast_f32_to_f16(s);
					uint16_t hz = sbt[si] == TOAST_DT_BF16 ? toast_f32_to_bf16(z) : toast_f32_to_f16(z);
					memcpy(sc + 2 * g, &hs, 2);
					memcpy(bi + 2 * g, &hz, 2);
				}
			}
			toast_dequant_mlx(bits, GS, q, sc, bi, sbt[si], got, N);
			int bad = 0;
			for (int j = 0; j < N; j++) {
				/* code j: bit position j*bits of the row's little-endian bit stream */
				int bit = j * bits;
				unsigned code = (unsigned)(q[bit / 32] >> (bit % 32)) & ((1u << bits) - 1);
				float s, z;
				int g = j / GS;
				if (sbt[si] == TOAST_DT_F32) {
					memcpy(&s, sc + 4 * g, 4);
					memcpy(&z, bi + 4 * g, 4);
				} else {
					uint16_t hs, hz;
					memcpy(&hs, sc + 2 * g, 2);
					memcpy(&hz, bi + 2 * g, 2);
					s = sbt[si] == TOAST_DT_BF16 ? toast_bf16_to_f32(hs) : toast_f16_to_f32(hs);
					z = sbt[si] == TOAST_DT_BF16 ? toast_bf16_to_f32(hz) : toast_f16_to_f32(hz);
				}
				bad += !same_bits(got[j], s * (float)code + z);
			}
			CHECK(bad == 0, "MLX%d (%s scales): %d elements differ", bits, toast_dtype_name(sbt[si]), bad);
		}
}

/* mlx.core.quantize's affine scheme: within bounds, and each group's edge of larger magnitude is
 * exactly representable (scale = edge / q0, bias = edge) */
static void test_mlx_quant(void)
{
	enum { N = 64 * 64 };
	float x[N], y[N], s[N / 64], z[N / 64];
	uint32_t q[N / 4];
	for (int bits = 4; bits <= 8; bits += 4) {
		for (int i = 0; i < N; i++)
			x[i] = (float)(rndn() * 0.03);
		toast_quant_mlx(bits, 64, x, N, q, s, z);
		toast_dequant_mlx(bits, 64, q, s, z, TOAST_DT_F32, y, N);
		double se = 0, sx = 0;
		int edge_bad = 0;
		for (int g = 0; g < N / 64; g++) {
			float lo = x[g * 64], hi = x[g * 64];
			int ilo = g * 64, ihi = g * 64;
			for (int j = g * 64; j < g * 64 + 64; j++) {
				if (x[j] < lo)
					lo = x[j], ilo = j;
				if (x[j] > hi)
					hi = x[j], ihi = j;
			}
			int ie = fabsf(lo) > fabsf(hi) ? ilo : ihi;
			edge_bad += fabsf(y[ie] - x[ie]) > 1e-6f * fabsf(x[ie]);
		}
		for (int i = 0; i < N; i++) {
			se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
			sx += (double)x[i] * x[i];
		}
		double rel = sqrt(se / sx), bound = bits == 4 ? 0.12 : 0.008;
		printf("  MLX%d round trip: relative RMS error %.4f (bound %.3f)\n", bits, rel, bound);
		CHECK(rel < bound && edge_bad == 0, "MLX%d: error %.4g, %d groups lose their edge", bits, rel, edge_bad);
	}
}

static void test_roundtrip(void)
{
	enum { N = 256 * 64 };
	float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
	uint8_t *buf = malloc(N * 2);
	double prev_err[N_QTYPES];
	for (int i = 0; i < N; i++) /* rows of different scales, a few outliers */
		x[i] = (float)(rndn() * (0.01 + 0.02 * (i / 256 % 5)) * (i % 97 == 0 ? 6 : 1));
	for (int qi = 0; qi < N_QTYPES; qi++) {
		const struct qtype *q = &qtypes[qi];
		toast_quant(q->t, x, buf, N);
		toast_dequant(q->t, buf, y, N);
		double se = 0, sx = 0;
		bool finite = true;
		for (int i = 0; i < N; i++) {
			se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
			sx += (double)x[i] * x[i];
			finite = finite && isfinite(y[i]);
		}
		double rel = sqrt(se / sx);
		prev_err[qi] = rel;
		printf("  %s round trip: relative RMS error %.4f (bound %.3f)\n", toast_dtype_name(q->t), rel, q->rt_bound);
		CHECK(finite && rel < q->rt_bound, "%s: round-trip error %.4g above %.3g", toast_dtype_name(q->t), rel,
		      q->rt_bound);
		/* all zero quantises to all zero */
		float z[256] = {0}, zy[256];
		toast_quant(q->t, z, buf, 256);
		toast_dequant(q->t, buf, zy, 256);
		bool zero = true;
		for (int i = 0; i < 256; i++)
			zero = zero && zy[i] == 0;
		CHECK(zero, "%s: zeros do not round-trip", toast_dtype_name(q->t));
	}
	/* more bits, less error; K-quants beat the legacy 4-bit types */
	CHECK(prev_err[5] < prev_err[4] && prev_err[4] < prev_err[3] && prev_err[3] < prev_err[0] &&
		      prev_err[2] < prev_err[4],
	      "error ordering Q6_K < Q5_K < Q4_K < Q4_0, Q8_0 < Q5_K");
	/* exactly representable values: Q8_0 of k * 2^-7 for |k| <= 127 with the max at 127 */
	for (int i = 0; i < 32; i++)
		x[i] = (float)((int)(rnd32() % 255) - 127) / 128.0f;
	x[7] = 127.0f / 128.0f;
	toast_quant(TOAST_DT_Q8_0, x, buf, 32);
	toast_dequant(TOAST_DT_Q8_0, buf, y, 32);
	int bad = 0;
	for (int i = 0; i < 32; i++)
		bad += y[i] != x[i];
	CHECK(bad == 0, "Q8_0: %d exactly representable values changed", bad);
	/* the scale is stored as the standard d = amax/127 in f16 */
	CHECK(h2f(buf) == toast_f16_to_f32(toast_f32_to_f16(x[7] / 127)), "Q8_0 scale %g", h2f(buf));
	/* Q4_1 stores min exactly (f16) as m */
	for (int i = 0; i < 32; i++)
		x[i] = (float)(i % 16) * 0.25f - 1.0f;
	toast_quant(TOAST_DT_Q4_1, x, buf, 32);
	toast_dequant(TOAST_DT_Q4_1, buf, y, 32);
	bad = 0;
	for (int i = 0; i < 32; i++)
		bad += y[i] != x[i];
	CHECK(h2f(buf + 2) == -1.0f && bad == 0, "Q4_1: min %g, %d values of an exact grid changed", h2f(buf + 2), bad);
	free(x);
	free(y);
	free(buf);
}

static void test_matmul(void)
{
	const int rows[] = {1, 7, 31}, Ts[] = {1, 5}, threads[] = {1, 3};
	for (int qi = 0; qi < N_QTYPES; qi++)
		for (int ti = 0; ti < 2; ti++) {
			struct toast_backend *be = NULL;
			struct toast_error err = {0};
			if (toast_backend_cpu_new(threads[ti], &be, &err) != TOAST_OK) {
				CHECK(0, "cpu backend: %s", err.msg);
				return;
			}
			enum toast_dtype t = qtypes[qi].t;
			for (int ri = 0; ri < 3; ri++)
				for (int Ti = 0; Ti < 2; Ti++) {
					int n_out = rows[ri], T = Ts[Ti], n_in = toast_dtypes[t].blck == 256 ? 512 : 96;
					size_t nb = 0;
					toast_dtype_bytes(t, (int64_t)n_out * n_in, &nb);
					float *wf = malloc((size_t)n_out * n_in * sizeof(float)), *wd = malloc((size_t)n_out * n_in * 4);
					void *wq = malloc(nb);
					for (int i = 0; i < n_out * n_in; i++)
						wf[i] = (float)(rndn() * 0.05);
					toast_quant(t, wf, wq, (int64_t)n_out * n_in);
					toast_dequant(t, wq, wd, (int64_t)n_out * n_in);
					struct toast_weight W = {.name = "w", .type = t, .n_in = n_in, .n_out = n_out, .data = wq, .n_bytes = nb};
					float *x = be->ops->alloc(be, (size_t)T * n_in * 4), *y = be->ops->alloc(be, (size_t)T * n_out * 4);
					for (int i = 0; i < T * n_in; i++)
						x[i] = (float)rndu();
					for (int i = 0; i < T * n_out; i++)
						y[i] = 0.5f;
					struct toast_mm_in min = {.act = x};
					struct toast_mm_out mout = {.out = y, .mode = TOAST_MM_ADD, .W = &W};
					be->ops->matmul(be, &min, &mout, 1, T);
					be->ops->sync(be, &err);
					double maxd = 0, maxr = 0;
					for (int tt = 0; tt < T; tt++)
						for (int r = 0; r < n_out; r++) {
							double ref = 0.5;
							for (int i = 0; i < n_in; i++)
								ref += (double)wd[(size_t)r * n_in + i] * x[(size_t)tt * n_in + i];
							double d = fabs(y[(size_t)tt * n_out + r] - ref);
							maxd = isnan(d) ? INFINITY : fmax(maxd, d);
							maxr = fmax(maxr, fabs(ref));
						}
					CHECK(maxd <= 1e-5 * fmax(maxr, 1), "%s matmul %dx%d T=%d threads=%d: max error %.3g",
					      toast_dtype_name(t), n_out, n_in, T, threads[ti], maxd);
					be->ops->release(be, x);
					be->ops->release(be, y);
					free(wf);
					free(wd);
					free(wq);
				}
			toast_backend_free(be);
		}
}

int main(void)
{
	test_dequant_exact();
	test_dequant_mlx();
	test_roundtrip();
	test_mlx_quant();
	test_matmul();
	return test_done("test_quant");
}
