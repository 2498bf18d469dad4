/*
 * test_cuda_layout.cpp - the CUDA backend's reading of quantised weights, tested on any machine:
 * the device code of src/backend/cuda/cu_quant.cuh compiled for the host (tests/cuda_emu.h) and
 * checked against the CPU reference dequantisers (format/quant.h) for every type:
 *   - the device layout (planes, split blocks) made from file bytes as k_quant.cu makes it;
 *   - cu_dq8 (prefill tiles, embedding rows, odd shapes) on every 8 elements, and its two
 *     halves (cu_dq8_load, cu_dq8_cvt) compiled for each type as the grouped GEMM uses them;
 *   - the decode chunks qk<TYPE> (load, prep, deq4 at f4 positions) cover every element once
 *     and dequantise it, their loads are aligned, and their shared-memory swizzle is a
 *     permutation under which the eight lanes of a quarter warp hit distinct banks;
 *   - cu_qdot against a double dot product;
 *   - synthetic weights: the bytes the device fill makes equal those the CPU backend makes.
 * The kernels around this code (grids, reductions) are tested on a GPU by test_ops.
 */
#include "cuda_emu.h"

#include "backend/cuda/cu_quant.cuh"

extern "C" {
#include "backend/synth_quant.h"
#include "format/quant.h"
#include "test.h"
}

#include <stdlib.h>

static uint64_t emu_rng = 0x9e3779b97f4a7c15ull;

static double emu_rnd(void) /* [-1, 1) */
{
	emu_rng ^= emu_rng << 13;
	emu_rng ^= emu_rng >> 7;
	emu_rng ^= emu_rng << 17;
	return (double)(emu_rng >> 11) / (double)(1ull << 52) - 1.0;
}

struct emu_w {
	struct toast_weight w;
	float *ref; /* [n_out][n_in], the CPU reference dequantisation */
	uint8_t *dev;
	cu_layout l;
	cu_wd wd;
};

static uint8_t *emu_alloc(size_t n)
{
	size_t a = (n + 255) & ~(size_t)255;
	uint8_t *p = (uint8_t *)aligned_alloc(256, a ? a : 256);
	memset(p, 0, a ? a : 256);
	return p;
}

static void emu_reference(emu_w *e)
{
	const struct toast_weight *w = &e->w;
	e->ref = (float *)malloc((size_t)w->n_in * w->n_out * sizeof(float));
	if (cu_is_mlx(w->type)) {
		int bits = w->type == TOAST_DT_MLX4 ? 4 : 8, sbs = toast_dtypes[w->sb_type].type_size;
		int64_t ng = w->n_in / w->group_size;
		for (int64_t r = 0; r < w->n_out; r++)
			toast_dequant_mlx(bits, w->group_size, (const uint32_t *)w->data + r * w->n_in * bits / 32,
					  (const char *)w->scales + r * ng * sbs, (const char *)w->biases + r * ng * sbs, w->sb_type,
					  e->ref + r * w->n_in, w->n_in);
	} else {
		toast_dequant(w->type, w->data, e->ref, w->n_in * w->n_out);
	}
}

/* the device layout of file bytes, as cu_q_upload makes it */
static void emu_upload(emu_w *e)
{
	const struct toast_weight *w = &e->w;
	e->l = cu_layout_of(w->type, w->n_in, w->n_out, w->sb_type, w->group_size);
	e->dev = emu_alloc(e->l.bytes);
	if (cu_is_mlx(w->type)) {
		size_t nq = (size_t)e->l.q_row * w->n_out, ns = (size_t)e->l.m_row * w->n_out;
		int mu = toast_dtypes[w->sb_type].type_size;
		for (size_t i = 0; i < nq; i++)
			e->dev[e->l.tiled ? cu_tile_pos(e->l.q_row, 0, i) : i] = ((const uint8_t *)w->data)[i];
		for (size_t i = 0; i < ns; i++) {
			size_t at = e->l.tiled ? cu_tile_pos(e->l.m_row, mu, i) : i;
			e->dev[e->l.m_off + at] = ((const uint8_t *)w->scales)[i];
			e->dev[e->l.b_off + at] = ((const uint8_t *)w->biases)[i];
		}
	} else {
		cu_qgeo g = cu_qgeo_for(w->type, w->n_in);
		for (size_t i = 0; i < w->n_bytes; i++)
			e->dev[cu_qdev_pos(g, e->l.m_off, w->n_in / g.blck, i)] = ((const uint8_t *)w->data)[i];
	}
	e->wd = {e->dev, 0, e->l.m_off, e->l.b_off, e->l.q_row, e->l.m_row, (int)w->type, (int)w->sb_type, w->group_size,
		 e->l.tiled};
}

/* a weight of random values quantised by the reference quantisers */
static emu_w emu_random(enum toast_dtype type, int64_t n_out, int64_t n_in, int gs, enum toast_dtype sb_type)
{
	emu_w e = {};
	struct toast_weight *w = &e.w;
	*w = (struct toast_weight){.name = "emu", .type = type, .n_in = n_in, .n_out = n_out};
	float *x = (float *)malloc((size_t)n_in * sizeof(float));
	if (cu_is_mlx(type)) {
		int bits = type == TOAST_DT_MLX4 ? 4 : 8, sbs = toast_dtypes[sb_type].type_size;
		int64_t ng = n_in / gs;
		uint32_t *q = (uint32_t *)malloc((size_t)n_out * n_in * bits / 8);
		uint8_t *s = (uint8_t *)malloc((size_t)n_out * ng * sbs), *z = (uint8_t *)malloc((size_t)n_out * ng * sbs);
		float *fs = (float *)malloc(ng * sizeof(float)), *fz = (float *)malloc(ng * sizeof(float));
		for (int64_t r = 0; r < n_out; r++) {
			for (int64_t i = 0; i < n_in; i++)
				x[i] = (float)(emu_rnd() * 0.1 + 0.02);
			toast_quant_mlx(bits, gs, x, n_in, q + r * n_in * bits / 32, fs, fz);
			for (int64_t g = 0; g < ng; g++) {
				uint8_t *ps = s + (r * ng + g) * sbs, *pz = z + (r * ng + g) * sbs;
				if (sb_type == TOAST_DT_F32) {
					memcpy(ps, &fs[g], 4), memcpy(pz, &fz[g], 4);
				} else {
					uint16_t hs = sb_type == TOAST_DT_BF16 ? toast_f32_to_bf16(fs[g]) : toast_f32_to_f16(fs[g]);
					uint16_t hz = sb_type == TOAST_DT_BF16 ? toast_f32_to_bf16(fz[g]) : toast_f32_to_f16(fz[g]);
					memcpy(ps, &hs, 2), memcpy(pz, &hz, 2);
				}
			}
		}
		w->data = q, w->scales = s, w->biases = z, w->sb_type = sb_type, w->group_size = gs;
		free(fs), free(fz);
	} else {
		size_t row = 0;
		toast_dtype_bytes(type, n_in, &row);
		uint8_t *d = (uint8_t *)malloc(row * n_out);
		for (int64_t r = 0; r < n_out; r++) {
			for (int64_t i = 0; i < n_in; i++)
				x[i] = (float)(emu_rnd() * 0.1 + 0.02);
			toast_quant(type, x, d + r * row, n_in);
		}
		w->data = d, w->n_bytes = row * n_out;
	}
	free(x);
	emu_reference(&e);
	emu_upload(&e);
	return e;
}

static void emu_free(emu_w *e)
{
	free((void *)e->w.data), free((void *)e->w.scales), free((void *)e->w.biases);
	free(e->ref), free(e->dev);
}

static double emu_row_max(const emu_w *e, int64_t r)
{
	double m = 0;
	for (int64_t i = 0; i < e->w.n_in; i++)
		m = fmax(m, fabs(e->ref[r * e->w.n_in + i]));
	return m > 0 ? m : 1;
}

/* cu_dq8 (TYPE CU_QT_ANY), or its two halves compiled for the weight's type */
template <int TYPE>
static void check_dq8(const char *what, const emu_w *e)
{
	double worst = 0;
	for (int64_t r = 0; r < e->w.n_out; r++) {
		double mx = emu_row_max(e, r);
		for (int64_t k = 0; k < e->w.n_in; k += 8) {
			float y[8];
			if (TYPE == CU_QT_ANY)
				cu_dq8(e->wd, 0, r, k, y);
			else
				cu_dq8_cvt<TYPE>(e->wd, cu_dq8_load<TYPE>(e->wd, 0, r, k), k, y);
			for (int j = 0; j < 8; j++) {
				double d = fabs(y[j] - e->ref[r * e->w.n_in + k + j]) / mx;
				worst = isnan(d) ? INFINITY : fmax(worst, d);
			}
		}
	}
	CHECK(worst < 1e-6, "%s %s: cu_dq8%s differs from the reference by %.3g", what, toast_dtype_name(e->w.type),
	      TYPE == CU_QT_ANY ? "" : " (typed)", worst);
}

template <int TYPE>
static void check_chunks(const char *what, const emu_w *e)
{
	check_dq8<TYPE>(what, e);
	typedef qk<TYPE> Q;
	int64_t n_in = e->w.n_in;
	int nc = (int)(n_in / Q::EPC), n4 = (int)(n_in / 4);
	/* the swizzle permutes a row's float4 positions */
	int *seen = (int *)calloc((size_t)n_in, sizeof(int));
	for (int f = 0; f < n4; f++) {
		int p = Q::swz(f);
		CHECK(p >= 0 && p < n4 && !seen[p]++, "%s %s: swizzle of %d is %d, out of range or taken", what,
		      toast_dtype_name(e->w.type), f, p);
	}
	/* a quarter warp (8 consecutive chunks) reads distinct banks at each position (the general
	 * path, 8 elements a chunk, is not swizzled) */
	for (int c0 = 0; TYPE != CU_QT_ANY && c0 + 8 <= nc; c0 += 8)
		for (int i = 0; i < Q::NP; i++) {
			int banks = 0;
			for (int q = 0; q < 8; q++)
				banks |= 1 << (Q::swz(Q::f4(c0 + q, i)) & 7);
			CHECK(banks == 0xff, "%s %s: chunks %d..%d position %d share banks (mask %02x)", what,
			      toast_dtype_name(e->w.type), c0, c0 + 7, i, banks);
		}
	/* every element once, dequantised */
	double worst = 0, dot_worst = 0;
	float *xs = (float *)malloc((size_t)n_in * sizeof(float));
	double *x = (double *)malloc((size_t)n_in * sizeof(double));
	for (int64_t i = 0; i < n_in; i++) {
		x[i] = emu_rnd();
		xs[cu_qpos<TYPE>(i)] = (float)x[i];
	}
	for (int64_t r = 0; r < e->w.n_out; r++) {
		memset(seen, 0, (size_t)n_in * sizeof(int));
		double mx = emu_row_max(e, r), dot = 0, ref = 0, mag = 0;
		cu_wrow row = cu_row(e->wd, 0, r);
		for (int c = 0; c < nc; c++) {
			typename Q::chunk k = cu_qload<TYPE>(e->wd, row, 0, r, c);
			typename Q::info in = Q::prep(k, c);
			for (int i = 0; i < Q::NP; i++) {
				float4 y = Q::deq4(k, in, c, i);
				float v[4] = {y.x, y.y, y.z, y.w};
				int f = Q::f4(c, i);
				for (int j = 0; j < 4; j++) {
					int64_t el = 4 * f + j;
					if (el < 0 || el >= n_in) {
						worst = INFINITY;
						continue;
					}
					seen[el]++;
					double d = fabs(v[j] - e->ref[r * n_in + el]) / mx;
					worst = isnan(d) ? INFINITY : fmax(worst, d);
				}
			}
			dot += cu_qdot<TYPE>(k, c, xs);
		}
		for (int64_t i = 0; i < n_in; i++) {
			CHECK(seen[i] == 1, "%s %s: element %lld read %d times", what, toast_dtype_name(e->w.type), (long long)i,
			      seen[i]);
			ref += e->ref[r * n_in + i] * x[i];
			mag += fabs(e->ref[r * n_in + i] * x[i]);
		}
		dot_worst = fmax(dot_worst, fabs(dot - ref) / (mag > 0 ? mag : 1));
	}
	/* 8-bit codes: the offset z - 32768 s is rounded (s 2^-9 at most; bf16 inputs round by 2^-9) */
	CHECK(worst < 1e-5, "%s %s: decode chunks differ from the reference by %.3g", what, toast_dtype_name(e->w.type),
	      worst);
	CHECK(dot_worst < 1e-5, "%s %s: cu_qdot differs from the dot product by %.3g", what, toast_dtype_name(e->w.type),
	      dot_worst);
	free(seen), free(xs), free(x);
}

static void check_weight(const char *what, const emu_w *e)
{
	long mis = emu_misaligned;
	/* a Q8_0 or MLX weight that is not tiled takes the CU_QT_ANY kernels */
	switch (cu_ktype(e->wd)) {
	case TOAST_DT_Q4_0: check_chunks<TOAST_DT_Q4_0>(what, e); break;
	case TOAST_DT_Q4_1: check_chunks<TOAST_DT_Q4_1>(what, e); break;
	case TOAST_DT_Q8_0: check_chunks<TOAST_DT_Q8_0>(what, e); break;
	case TOAST_DT_Q4_K: check_chunks<TOAST_DT_Q4_K>(what, e); break;
	case TOAST_DT_Q5_K: check_chunks<TOAST_DT_Q5_K>(what, e); break;
	case TOAST_DT_Q6_K: check_chunks<TOAST_DT_Q6_K>(what, e); break;
	case TOAST_DT_MLX4: check_chunks<TOAST_DT_MLX4>(what, e); break;
	case TOAST_DT_MLX8: check_chunks<TOAST_DT_MLX8>(what, e); break;
	default: break;
	}
	check_chunks<CU_QT_ANY>(what, e);
	CHECK(emu_misaligned == mis, "%s %s: %ld misaligned vector loads", what, toast_dtype_name(e->w.type),
	      emu_misaligned - mis);
}

/* the synthetic weight as the CPU backend makes it, and as k_q_synth makes it on the device */
static void check_synthetic(enum toast_dtype type, int64_t n_out, int64_t n_in)
{
	emu_w e = {};
	struct toast_weight *w = &e.w;
	bool mlx = cu_is_mlx(type);
	*w = (struct toast_weight){.name = "synthetic.layers.3.weight", .type = type, .n_in = n_in, .n_out = n_out};
	if (mlx) {
		w->group_size = TOAST_SYNTH_MLX_GROUP, w->sb_type = TOAST_DT_BF16;
		w->n_bytes = (size_t)n_out * n_in * (type == TOAST_DT_MLX4 ? 4 : 8) / 8 + 4 * (size_t)n_out * (n_in / 64);
	} else {
		toast_dtype_bytes(type, n_in, &w->n_bytes);
		w->n_bytes *= (size_t)n_out;
	}
	void *buf = malloc(w->n_bytes);
	toast_synthetic_fill_quant(w, buf);
	emu_reference(&e);
	emu_upload(&e);
	/* the device fill */
	uint8_t *dev = emu_alloc(e.l.bytes);
	uint64_t seed = toast_synthetic_seed(w->name);
	size_t nq = mlx ? (size_t)e.l.q_row * n_out : w->n_bytes;
	cu_qgeo geo = cu_qgeo_for(type, n_in);
	for (size_t i = 0; i < nq; i++)
		dev[mlx && e.l.tiled ? cu_tile_pos(e.l.q_row, 0, i) : cu_qdev_pos(geo, e.l.m_off, n_in / geo.blck, i)] =
			toast_synth_qbyte(type, seed, i, n_in);
	if (mlx)
		for (size_t g = 0; g < (size_t)n_out * (n_in / 64); g++) {
			uint16_t s = toast_synth_mlx_sb(type == TOAST_DT_MLX4 ? 4 : 8, seed, g, 0, n_in);
			uint16_t z = toast_synth_mlx_sb(type == TOAST_DT_MLX4 ? 4 : 8, seed, g, 1, n_in);
			size_t at = e.l.tiled ? cu_tile_pos(e.l.m_row, 2, 2 * g) : 2 * g;
			memcpy(dev + e.l.m_off + at, &s, 2), memcpy(dev + e.l.b_off + at, &z, 2);
		}
	CHECK(memcmp(dev, e.dev, e.l.bytes) == 0, "synthetic %s: the device fill differs from the CPU's bytes",
	      toast_dtype_name(type));
	/* finite, of the order of 1/sqrt(n_in), not all one value */
	double ss = 0, sum = 0;
	bool finite = true;
	for (size_t i = 0; i < (size_t)n_in * n_out; i++) {
		finite = finite && isfinite(e.ref[i]);
		ss += (double)e.ref[i] * e.ref[i];
		sum += e.ref[i];
	}
	double n = (double)n_in * n_out, rms = sqrt(ss / n) * sqrt((double)n_in);
	CHECK(finite && rms > 0.05 && rms < 5 && fabs(sum / n) * sqrt((double)n_in) < 1,
	      "synthetic %s: rms %.3g and mean %.3g (x sqrt(n_in)) out of range", toast_dtype_name(type), rms,
	      sum / n * sqrt((double)n_in));
	check_weight("synthetic", &e);
	free(dev), free(buf), free(e.ref), free(e.dev);
}

/* the tiled planes (Q4_K): every byte of the padded planes has one place, and the tensor-core
 * loads (cu_kq<Q4_K>::load: a lane's 16 bytes at 512 p + 16 lane of a unit, its decode row's
 * header at 16 (lane % 16)) read rows g and g + 8's bytes 32p + 8t.. and row lane % 16's header */
static void check_tiles(void)
{
	for (int64_t nu = 1; nu <= 8; nu *= 2) {
		int64_t rows = 48, nq = rows * nu * 128;
		int *seen = (int *)calloc((size_t)nq, sizeof(int)), *mseen = (int *)calloc((size_t)(rows * nu), sizeof(int));
		bool ok = true;
		for (int64_t r = 0; r < rows; r++)
			for (int64_t j = 0; j < nu * 128; j++) {
				size_t o = cu_tq_off(nu, r, j);
				ok = ok && o < (size_t)nq && !seen[o]++ && (j % 8 == 0 || o == cu_tq_off(nu, r, j & ~7) + (j & 7));
			}
		for (int64_t r = 0; r < rows; r++)
			for (int64_t u = 0; u < nu; u++) {
				size_t o = cu_tm_off(nu, r, u, 16);
				ok = ok && o % 16 == 0 && o / 16 < (size_t)(rows * nu) && !mseen[o / 16]++;
			}
		for (int64_t r0 = 0; r0 < rows; r0 += 16)
			for (int64_t u = 0; u < nu; u++)
				for (int lane = 0; lane < 32; lane++) {
					int g = lane / 4, t = lane % 4;
					size_t base = cu_tq_off(nu, r0, 0) + 16 * lane + 2048 * u;
					for (int p = 0; p < 4; p++)
						ok = ok && cu_tq_off(nu, r0 + g, 128 * u + 32 * p + 8 * t) == base + 512 * p &&
						     cu_tq_off(nu, r0 + g + 8, 128 * u + 32 * p + 8 * t) == base + 512 * p + 8;
					ok = ok && cu_tm_off(nu, r0 + lane % 16, u, 16) == cu_tm_off(nu, r0, 0, 16) + 256 * u + 16 * (lane % 16);
				}
		CHECK(ok, "tiled planes, %lld superblocks a row: a byte placed twice, out of the plane, or not where a lane loads it",
		      (long long)nu);
		free(seen), free(mseen);
	}
	/* Q6_K (cu_kq<Q6_K>::load): load c of lane 4g + t reads word t of runs 2c, 2c + 1 of row g, then of row
	 * g + 8, at 3072 u + 512 c + 16 lane of the tile's plane (file byte 210 (r nb + u) + 16 run + 4 t + i) */
	cu_qgeo q6 = cu_qgeo_of(TOAST_DT_Q6_K);
	bool ok6 = true;
	for (int64_t nb = 1; nb <= 4; nb *= 2)
		for (int64_t r0 = 0; r0 < 32; r0 += 16)
			for (int64_t u = 0; u < nb; u++)
				for (int lane = 0; lane < 32; lane++)
					for (int c = 0; c < 6; c++)
						for (int w = 0; w < 4; w++)
							for (int i = 0; i < 4; i++) {
								int g = lane / 4, t = lane % 4, run = 2 * c + (w & 1);
								int64_t r = r0 + g + 8 * (w >> 1);
								size_t file = (size_t)(r * nb + u) * 210 + 16 * run + 4 * t + i;
								size_t want = (size_t)(r0 / 16 * nb + u) * 3072 + 512 * c + 16 * lane + 4 * w + i;
								ok6 = ok6 && cu_qdev_pos(q6, 0, nb, file) == want;
							}
	CHECK(ok6, "Q6_K tiles: a quant byte not where a tensor-core lane loads it");
	/* Q5_K (cu_kq<Q5_K>::load): load c of lane 4g + t reads bytes 32c + 8t.. (qh, then the codes' runs)
	 * of row g, then of row g + 8, at 2560 u + 512 c + 16 lane */
	cu_qgeo q5 = cu_qgeo_of(TOAST_DT_Q5_K);
	bool ok5 = true;
	for (int64_t nb = 1; nb <= 4; nb *= 2)
		for (int64_t r0 = 0; r0 < 32; r0 += 16)
			for (int64_t u = 0; u < nb; u++)
				for (int lane = 0; lane < 32; lane++)
					for (int c = 0; c < 5; c++)
						for (int i = 0; i < 16; i++) {
							int64_t r = r0 + lane / 4 + 8 * (i >> 3);
							size_t file = (size_t)(r * nb + u) * 176 + 16 + 32 * c + 8 * (lane % 4) + (i & 7);
							size_t want = (size_t)(r0 / 16 * nb + u) * 2560 + 512 * c + 16 * lane + i;
							ok5 = ok5 && cu_qdev_pos(q5, 0, nb, file) == want;
						}
	CHECK(ok5, "Q5_K tiles: a quant byte not where a tensor-core lane loads it");
	/* Q8_0 (cu_kq<Q8_0>::load): unit u (blocks 4u..4u + 3) of lane 4g + t reads bytes 8t.. of block 4u + p
	 * of row g, then of row g + 8, at 2048 u + 512 p + 16 lane (as MLX8's codes lie), and its decode row
	 * lane % 16's d of blocks 4u + 2 (lane / 16) and one more at 32 b + 2 (lane % 16) of the tile's meta */
	cu_qgeo q8 = cu_qgeo_for(TOAST_DT_Q8_0, 128);
	bool ok8 = q8.tiled && !cu_qgeo_for(TOAST_DT_Q8_0, 96).tiled;
	for (int64_t nb = 4; nb <= 16; nb *= 2)
		for (int64_t r0 = 0; r0 < 32; r0 += 16)
			for (int64_t u = 0; u < nb / 4; u++)
				for (int lane = 0; lane < 32; lane++) {
					for (int p = 0; p < 4; p++)
						for (int i = 0; i < 16; i++) {
							int64_t r = r0 + lane / 4 + 8 * (i >> 3);
							size_t file = (size_t)(r * nb + 4 * u + p) * 34 + 2 + 8 * (lane % 4) + (i & 7);
							size_t want = (size_t)(r0 / 16 * (nb / 4) + u) * 2048 + 512 * p + 16 * lane + i;
							ok8 = ok8 && cu_qdev_pos(q8, 0, nb, file) == want;
						}
					for (int k = 0; k < 2; k++)
						for (int i = 0; i < 2; i++) {
							int64_t r = r0 + lane % 16, b = 4 * u + 2 * (lane / 16) + k;
							size_t file = (size_t)(r * nb + b) * 34 + i;
							size_t want = (size_t)(r0 / 16 * nb + b) * 32 + 2 * (lane % 16) + i;
							ok8 = ok8 && cu_qdev_pos(q8, 0, nb, file) == want;
						}
				}
	CHECK(ok8, "Q8_0 tiles: a byte not where a tensor-core lane loads it");
}

int main(void)
{
	check_tiles();
	const enum toast_dtype gguf[] = {TOAST_DT_Q4_0, TOAST_DT_Q4_1, TOAST_DT_Q8_0,
					 TOAST_DT_Q4_K, TOAST_DT_Q5_K, TOAST_DT_Q6_K};
	const int64_t widths[] = {512, 2048}, heights[] = {5, 37}; /* 37: tiles of 16 rows (Q4_K), the last partial */
	for (enum toast_dtype t : gguf)
		for (int64_t n_in : widths)
			for (int64_t n_out : heights) {
				emu_w e = emu_random(t, n_out, n_in, 0, TOAST_DT_BF16);
				check_weight("random", &e);
				emu_free(&e);
			}
	const enum toast_dtype mlx[] = {TOAST_DT_MLX4, TOAST_DT_MLX8}, sbs[] = {TOAST_DT_BF16, TOAST_DT_F16, TOAST_DT_F32};
	const int groups[] = {32, 64, 128};
	for (enum toast_dtype t : mlx)
		for (int gs : groups)
			for (enum toast_dtype sb : sbs)
				for (int64_t n_out : heights) {
					emu_w e = emu_random(t, n_out, 512, gs, sb); /* tiled */
					check_weight("random mlx", &e);
					emu_free(&e);
				}
	for (enum toast_dtype t : mlx) { /* rows not whole units of codes: row-major */
		emu_w e = emu_random(t, 19, t == TOAST_DT_MLX4 ? 576 : 320, 64, TOAST_DT_BF16);
		CHECK(!e.l.tiled, "an MLX weight of %lld columns is tiled", (long long)e.w.n_in);
		check_weight("random mlx, not tiled", &e);
		emu_free(&e);
	}
	const int64_t q8_rows[] = {96, 160}; /* Q8_0 rows not whole units of four blocks: row-major */
	for (int64_t n_in : q8_rows) {
		emu_w e = emu_random(TOAST_DT_Q8_0, 19, n_in, 0, TOAST_DT_BF16);
		CHECK(!e.l.tiled, "a Q8_0 weight of %lld columns is tiled", (long long)n_in);
		check_weight("random, not tiled", &e);
		emu_free(&e);
	}
	check_synthetic(TOAST_DT_Q8_0, 7, 96);
	for (enum toast_dtype t : gguf)
		check_synthetic(t, 7, 2048);
	check_synthetic(TOAST_DT_Q4_K, 40, 512);
	check_synthetic(TOAST_DT_MLX4, 5, 2048);
	check_synthetic(TOAST_DT_MLX8, 5, 512);
	check_synthetic(TOAST_DT_MLX4, 37, 512);
	return test_done("test_cuda_layout");
}
