/*
 * cu_quant.cuh - quantised weights on the device: their layout, and the device code that reads
 * them (dequantisation in registers; bf16 activations stay bf16 or f32, accumulation is f32).
 *
 * Device layout of one matrix (or one expert of a set; experts lie at a fixed stride), all
 * planes 256-byte aligned, the same bytes as the file (format/quant.h), only regrouped:
 *   - BF16: [n_out][n_in] bf16 (f32/f16 matrices are converted at upload);
 *   - Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K (blocks of 18, 20, 34, 144, 176, 210 bytes): each block
 *     split into its quants and the rest: a quant plane [n_out][nb][qb] (qb = 16, 16, 32, 128,
 *     160, 192: Q5_K's qh then qs, Q6_K's ql then qh), then a meta plane [n_out][nb][bs - qb] (d;
 *     d,m; d; d,dmin,scales[12] for both K types; scales[16],d), so quants load as aligned 16-byte
 *     vectors. The K-quants' planes are tiled (cu_qgeo.tiled, below): 16 rows' superblock as a
 *     tensor-core warp reads it (Q4_K 2048 bytes, Q5_K 2560, Q6_K 3072) and the 16 rows' headers
 *     together (cu_tm_off), n_out padded to 16 rows (zeros); so are Q8_0's when a row is whole
 *     units of four blocks (cu_tiled: 16 rows' block in 512 bytes, their d's together), which
 *     puts its codes where an MLX8 plane's lie;
 *   - MLX4/MLX8: the packed words [n_out][n_in*bits/8 bytes], then scales, then biases
 *     [n_out][n_in/group] in the checkpoint's type (bf16, f16 or f32); tiled like Q4_K when a row
 *     is whole 128-byte units of codes (cu_tiled, cu_tile_pos: scales and biases [tile][group][16]).
 * A tiled layout gives a warp's loads 512 contiguous bytes where a row-major one gave it a
 * sector of each of 8 rows (the 4-bit GEMVs were bound by those requests on an H200).
 *
 * Decode kernels read a row as "chunks": 16 packed bytes (and their scales) per lane and step,
 * 32 consecutive elements for 4-bit types, 16 for 8-bit, 8 for bf16 (struct qk<TYPE>). Each
 * chunk is NP float4 positions of the input; the input rows in shared memory are stored with a
 * per-type XOR swizzle of their float4 index (qk::swz) so that the eight lanes of a quarter warp,
 * which read the same position of eight consecutive chunks, hit distinct banks. Dequantised
 * values come from byte-permute "magic" floats: a code q < 128 placed in the mantissa of 128.0
 * is exactly 128 + q (8-bit codes: 32768 + q), so y = fma(128 + q, scale, bias - 128 * scale)
 * costs one PRMT and one FFMA and no int-to-float conversion (a quarter-rate instruction).
 */
#ifndef TOAST_CU_QUANT_CUH
#define TOAST_CU_QUANT_CUH

#include <type_traits>

#ifndef TOAST_CUDA_EMU /* tests/cuda_emu.h compiles this header for the host, to test it without a GPU */
#include <cuda_fp16.h>

#include "backend/cuda/cuda_common.cuh"
#endif

/* GGUF block geometry: elements and bytes per block, and the quant bytes [qoff, qoff + qb) that
 * go to the quant plane (qb == bs: not split). Plain and MLX types: blck elements in bs bytes. */
struct cu_qgeo {
	int blck, bs, qoff, qb;
	int tiled; /* the planes in tiles of 16 rows (cu_tq_off, cu_tm_off) */
};

__host__ __device__ static inline constexpr cu_qgeo cu_qgeo_of(int type)
{
	switch (type) {
	case TOAST_DT_Q4_0: return {32, 18, 2, 16};
	case TOAST_DT_Q4_1: return {32, 20, 4, 16};
	case TOAST_DT_Q8_0: return {32, 34, 2, 32};
	case TOAST_DT_Q4_K: return {256, 144, 16, 128, 1};
	case TOAST_DT_Q5_K: return {256, 176, 16, 160, 1};
	case TOAST_DT_Q6_K: return {256, 210, 0, 192, 1};
	case TOAST_DT_MLX4: return {8, 4, 0, 4};
	case TOAST_DT_MLX8: return {4, 4, 0, 4};
	case TOAST_DT_F32: return {1, 4, 0, 4};
	default: return {1, 2, 0, 2}; /* BF16 */
	}
}

/* Q6_K (tiled): the offset of word j (0..3) of run r (0..11: ql's 8, qh's 4) of a row's superblock
 * from the row's place in its tile's unit (cu_trow_at): a tensor-core lane takes word j of every run
 * (a 16-element sub-block spans one run, four lanes four words of it), two runs' words of rows g
 * and g + 8 in one 16-byte load */
__host__ __device__ static inline int cu_q6_word(int r, int j)
{
	return (r >> 1) * 512 + j * 16 + (r & 1) * 4;
}

/*
 * Tiled planes (Q4_K, Q5_K, Q6_K; Q8_0, MLX4, MLX8 whose rows are whole units: cu_tiled): rows in tiles
 * of 16 (n_out padded to a multiple of 16), and superblock (unit) u of a tile stored as a
 * tensor-core warp reads it (cu_kq): its 16 x qb quant bytes as [32-byte run p of a row][lane
 * 4g + t][row g, then row g + 8: the lane's 8 bytes 32p + 8t.. of the run] (Q6_K: two runs' words
 * t, cu_q6_word), so that a lane's bytes of both its rows are 16-byte loads and each load of the
 * warp reads 512 contiguous bytes; the 16 rows' headers (MLX: scales, biases) together,
 * [tile][u][row][mb bytes]. Row-major planes gave a warp's load a sector of each of 8 rows and
 * its header load 16 rows' lines: at 2.9 TB/s on an H200 the Q4_K GEMVs were bound by those
 * requests, not by DRAM (bench/k4_probe.cu, docs/PERF.md).
 *   cu_trr: row rr's place in its tile's unit (the rest of its bytes are offsets from there);
 *   cu_tu_byte: byte jj of a row's unit of runs (Q4_K's codes; Q5_K's qh, then codes) from there;
 *   cu_tq_off: byte j of row r of a plane of 128-byte units (Q4_K, MLX: nu units a row);
 *   cu_tm_off: the mb-byte header of unit u of row r in its plane.
 */
__host__ __device__ static inline size_t cu_trr(int64_t rr)
{
	return (size_t)((rr & 7) * 64 + ((rr >> 3) & 1) * 8);
}

__host__ __device__ static inline size_t cu_tu_byte(int64_t jj)
{
	return (size_t)((jj >> 5) * 512 + ((jj >> 3) & 3) * 16 + (jj & 7));
}

__host__ __device__ static inline size_t cu_tq_byte(int64_t j)
{
	return (size_t)((j >> 7) * 2048) + cu_tu_byte(j & 127);
}

__host__ __device__ static inline size_t cu_tq_off(int64_t nu, int64_t r, int64_t j)
{
	return (size_t)((r >> 4) * nu) * 2048 + cu_trr(r) + cu_tq_byte(j);
}

__host__ __device__ static inline size_t cu_tm_off(int64_t nu, int64_t r, int64_t u, int mb)
{
	return ((size_t)((r >> 4) * nu + u) * 16 + (size_t)(r & 15)) * (size_t)mb;
}

/* where byte i of a row-major plane of row_bytes a row lies in the plane tiled: the codes (mu 0:
 * cu_tq_off), or an MLX scale or bias plane of mu-byte values (cu_tm_off) */
__host__ __device__ static inline size_t cu_tile_pos(int64_t row_bytes, int mu, size_t i)
{
	int64_t r = (int64_t)(i / (size_t)row_bytes), j = (int64_t)(i - (size_t)r * (size_t)row_bytes);
	if (!mu)
		return cu_tq_off(row_bytes >> 7, r, j);
	return cu_tm_off(row_bytes / mu, r, j / mu, mu) + (size_t)(j % mu);
}

/* the device offset of byte i of a GGUF-block tensor in file layout (identity when not split); nb
 * blocks a row; g.tiled as the weight is (cu_qgeo_for) */
__host__ __device__ static inline size_t cu_qdev_pos(const cu_qgeo &g, size_t m_off, int64_t nb, size_t i)
{
	if (g.qb == g.bs)
		return i;
	size_t b = i / (size_t)g.bs;
	int o = (int)(i - b * (size_t)g.bs), mb = g.bs - g.qb;
	if (o >= g.qoff && o < g.qoff + g.qb) {
		int q = o - g.qoff;
		if (g.tiled) {
			int64_t r = (int64_t)(b / (size_t)nb), u = (int64_t)b - r * nb;
			size_t at = (size_t)((r >> 4) * nb + u) * 16 * g.qb + cu_trr(r); /* units of 16 rows x qb bytes */
			return at + (g.qb == 192 ? (size_t)(cu_q6_word(q >> 4, (q >> 2) & 3) + (q & 3)) : cu_tu_byte(q));
		}
		return b * (size_t)g.qb + (size_t)q;
	}
	size_t mo = (size_t)(o < g.qoff ? o : o - g.qb);
	if (g.tiled) {
		int64_t r = (int64_t)(b / (size_t)nb);
		return m_off + cu_tm_off(nb, r, (int64_t)b - r * nb, mb) + mo;
	}
	return m_off + b * (size_t)mb + mo;
}

static inline bool cu_is_mlx(int type)
{
	return type == TOAST_DT_MLX4 || type == TOAST_DT_MLX8;
}

/* where the planes of one matrix lie (bytes from its start) */
struct cu_layout {
	int64_t q_row, m_row; /* bytes per row of the quant and meta (MLX: scales, biases) planes */
	size_t m_off, b_off, bytes;
	bool tiled; /* (cu_tiled) */
};

static inline size_t cu_align256(size_t n)
{
	return (n + 255) & ~(size_t)255;
}

/* whether a weight's planes are tiled: the K-quants' always, a Q8_0 or MLX weight's when its rows
 * are whole 128-byte units of codes (kernels compiled for those kinds read tiled weights; cu_ktype
 * sends the others to CU_QT_ANY) */
__host__ __device__ static inline bool cu_tiled(int type, int64_t n_in)
{
	return cu_qgeo_of(type).tiled || (type == TOAST_DT_MLX4 && n_in % 256 == 0) ||
	       ((type == TOAST_DT_MLX8 || type == TOAST_DT_Q8_0) && n_in % 128 == 0);
}

/* a GGUF-block weight's geometry, tiled as the weight is (cu_qdev_pos) */
__host__ __device__ static inline cu_qgeo cu_qgeo_for(int type, int64_t n_in)
{
	cu_qgeo g = cu_qgeo_of(type);
	g.tiled = cu_tiled(type, n_in);
	return g;
}

static inline cu_layout cu_layout_of(int type, int64_t n_in, int64_t n_out, int sb_type, int gs)
{
	cu_qgeo g = cu_qgeo_of(type);
	cu_layout l = {};
	int64_t nb = n_in / g.blck;
	l.tiled = cu_tiled(type, n_in);
	int64_t rows = l.tiled ? (n_out + 15) & ~(int64_t)15 : n_out;
	l.q_row = nb * g.qb;
	l.m_row = cu_is_mlx(type) ? n_in / gs * toast_dtypes[sb_type].type_size : nb * (g.bs - g.qb);
	l.m_off = cu_align256((size_t)l.q_row * rows);
	l.b_off = cu_align256(l.m_off + (size_t)l.m_row * rows);
	l.bytes = cu_is_mlx(type) ? l.b_off + (size_t)l.m_row * rows : l.m_off + (size_t)l.m_row * rows;
	return l;
}

/* a kernel type: a weight type whose reads are compiled for it, or any type (a runtime switch) */
#define CU_QT_ANY (-1)

/* A weight on the device as kernels see it: matrix `e` of a set (0 for a single one). */
struct cu_wd {
	const uint8_t *base;
	size_t stride; /* bytes between experts */
	size_t m_off, b_off;
	int64_t q_row, m_row;
	int type, sb_type, gs;
	int tiled; /* (cu_tiled) */
};

/* the row pointers of one row: quants, meta (scales), MLX biases */
struct cu_wrow {
	const uint8_t *q, *m, *b;
};

/* (not for tiled weights: cu_qrow) */
__device__ __forceinline__ cu_wrow cu_row(const cu_wd &w, size_t e, int64_t r)
{
	const uint8_t *x = w.base + e * w.stride;
	return {x + r * w.q_row, x + w.m_off + r * w.m_row, x + w.b_off + r * w.m_row};
}

/* kernels compiled for a K-quant, Q8_0 or MLX kind read tiled weights (cu_ktype) */
__host__ __device__ constexpr bool cu_tiled_kind(int type)
{
	return type == TOAST_DT_Q4_K || type == TOAST_DT_Q5_K || type == TOAST_DT_Q6_K || type == TOAST_DT_Q8_0 ||
	       type == TOAST_DT_MLX4 || type == TOAST_DT_MLX8;
}

/* the kernel type of a weight: its type, or CU_QT_ANY for one of a tiled kind that is not tiled */
static inline int cu_ktype(const cu_wd &w)
{
	return cu_tiled_kind(w.type) && !w.tiled ? CU_QT_ANY : w.type;
}

/* whether kernels of type TYPE read w tiled: CU_QT_ANY as the weight is */
template <int TYPE>
__device__ __forceinline__ bool cu_kind_tiled(const cu_wd &w)
{
	if constexpr (TYPE == CU_QT_ANY)
		return w.tiled;
	else
		return cu_tiled_kind(TYPE);
}

/* bytes of a meta unit of a tiled weight: a K-quant header, a Q8_0 d, an MLX scale (or bias),
 * for kernels of type TYPE */
template <int TYPE>
__device__ __forceinline__ int cu_tmu(const cu_wd &w)
{
	const int t = TYPE == CU_QT_ANY ? w.type : TYPE;
	if (t == TOAST_DT_Q4_K || t == TOAST_DT_Q5_K)
		return 16;
	if (t == TOAST_DT_Q6_K)
		return 18;
	return t != TOAST_DT_Q8_0 && w.sb_type == TOAST_DT_F32 ? 4 : 2;
}

/* a tiled weight's row rr of tile `tile` of matrix e: q + 16 qb u + cu_tu_byte(jj) is byte jj of
 * its unit u (qb bytes a row; Q4_K and MLX: q + cu_tq_byte(j); Q6_K: cu_q6_word; an 8-byte
 * granule stays whole), m + 16 mu u (b + ..: MLX) its meta unit u (mu = cu_tmu: a K-quant header,
 * an MLX scale and bias of group u) */
__device__ __forceinline__ cu_wrow cu_trow_at(const cu_wd &w, size_t e, int64_t tile, int rr, int mu)
{
	const uint8_t *x = w.base + e * w.stride;
	int64_t mt = tile * 16 * w.m_row + rr * mu;
	return {x + tile * 16 * w.q_row + cu_trr(rr), x + w.m_off + mt, x + w.b_off + mt};
}

/* row r of a weight as kernels of type TYPE read it (cu_dq8_at, the SIMT chunks) */
template <int TYPE>
__device__ __forceinline__ cu_wrow cu_qrow(const cu_wd &w, size_t e, int64_t r)
{
	if (cu_kind_tiled<TYPE>(w))
		return cu_trow_at(w, e, r >> 4, (int)(r & 15), cu_tmu<TYPE>(w));
	return cu_row(w, e, r);
}

/* the descriptor of a prepared weight (dev, dev_type) or of the first expert of a set */
static inline cu_wd cu_wd_of(const struct toast_weight *w, const void *base, size_t n_set)
{
	cu_layout l = cu_layout_of(w->dev_type, w->n_in, w->n_out, w->sb_type, w->group_size);
	cu_wd d = {(const uint8_t *)base, n_set > 1 ? cu_align256(l.bytes) : 0, l.m_off, l.b_off, l.q_row, l.m_row,
		   (int)w->dev_type, (int)w->sb_type, w->group_size, l.tiled};
	return d;
}

static inline cu_wd cu_wd_weight(const struct toast_weight *w)
{
	return cu_wd_of(w, w->dev, 1);
}

static inline cu_wd cu_wd_experts(const struct toast_experts *x)
{
	return cu_wd_of(&x->w[0], x->dev, (size_t)x->n_expert);
}

/* ---- loads and magic conversions ---- */

__device__ __forceinline__ uint4 cu_ld16(const uint8_t *p)
{
	return __ldg((const uint4 *)p);
}

__device__ __forceinline__ uint2 cu_ld8(const uint8_t *p)
{
	return __ldg((const uint2 *)p);
}

__device__ __forceinline__ uint32_t cu_ld4(const uint8_t *p)
{
	return __ldg((const uint32_t *)p);
}

/* the 16 bytes of run r of a Q6_K superblock's quants q (a row's place in its unit), word by word */
__device__ __forceinline__ uint4 cu_q6_run(const uint8_t *q, int r)
{
	return make_uint4(cu_ld4(q + cu_q6_word(r, 0)), cu_ld4(q + cu_q6_word(r, 1)), cu_ld4(q + cu_q6_word(r, 2)),
			  cu_ld4(q + cu_q6_word(r, 3)));
}

__device__ __forceinline__ float cu_ldf16(const uint8_t *p)
{
	return __half2float(__ushort_as_half(__ldg((const unsigned short *)p)));
}

/* scale or bias i of an MLX row, stored as sb_type */
__device__ __forceinline__ float cu_ldsb(const uint8_t *p, int sb_type, int64_t i)
{
	if (sb_type == TOAST_DT_F32)
		return __ldg((const float *)p + i);
	unsigned short h = __ldg((const unsigned short *)p + i);
	return sb_type == TOAST_DT_BF16 ? __uint_as_float((unsigned)h << 16) : __half2float(__ushort_as_half(h));
}

/* 128 + byte b of v (the byte < 128), exactly */
__device__ __forceinline__ float cu_m128(uint32_t v, int b)
{
	return __uint_as_float(__byte_perm(v, 0x43000000u, 0x7044u | (b << 8)));
}

/* 32768 + byte b of v, exactly */
__device__ __forceinline__ float cu_m32k(uint32_t v, int b)
{
	return __uint_as_float(__byte_perm(v, 0x47000000u, 0x7404u | (b << 4)));
}

__device__ __forceinline__ uint32_t cu_word(const uint4 &u, int i)
{
	return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}

/* the 6-bit scales and mins of sub-blocks 2p and 2p+1 of a Q4_K/Q5_K block from its header
 * (words y, z, w = scales[0..11]), as bytes [sc_2p, sc_2p+1, m_2p, m_2p+1] (format/quant.h) */
__device__ __forceinline__ uint32_t cu_k4_pair(const uint4 &h, int p)
{
	uint32_t V = __byte_perm(h.y, h.z, (p & 1) ? 0x7632 : 0x5410); /* s[2q],s[2q+1],s[2q+4],s[2q+5] */
	uint32_t W = __byte_perm(h.w, 0, (p & 1) ? 0x3232 : 0x1010);   /* s[8+2q],s[9+2q] twice */
	uint32_t hi = (W & 0x0f0fu) | ((W >> 4) & 0x0f0f0000u) | ((V & 0xc0c0c0c0u) >> 2);
	return p < 2 ? V & 0x3f3f3f3fu : hi;
}


/*
 * Dequantise 8 consecutive elements k..k+7 (k % 8 == 0) of row r of matrix e: the general path
 * (prefill tiles, embedding rows, odd shapes, mixed types). In two halves, so a kernel can issue
 * the loads of one tile before it computes on the previous one and convert them afterwards:
 * cu_dq8_load reads the bytes and converts nothing, cu_dq8_cvt makes the 8 floats. TYPE is the
 * weight's type, or CU_QT_ANY for a runtime switch on w.type; raw words per type:
 *   BF16: a = the 8 values;  Q4_0/Q4_1: b = 8 quant bytes, c = d, d = m (f16 bits);
 *   Q8_0: b = 8 int8, c = d;  Q4_K/Q5_K: a = the block's header (d, dmin, scales), b = 8 quant
 *   bytes, (c, d) = Q5_K's 8 qh bytes;  Q6_K: b = 8 ql bytes, (c, d) = 8 qh bytes, a.x = d,
 *   a.y = the int8 scale;  MLX4/MLX8: a.x, a.y = scale and bias (sb_type bits), b = the codes.
 */
struct cu_dq8_raw {
	uint4 a;
	uint2 b;
	uint32_t c, d;
};

/* scale or bias i of an MLX row as stored (f32 bits, or bf16/f16 bits in the low half) */
__device__ __forceinline__ uint32_t cu_ldsb_bits(const uint8_t *p, int sb_type, int64_t i)
{
	if (sb_type == TOAST_DT_F32)
		return __ldg((const uint32_t *)p + i);
	return __ldg((const unsigned short *)p + i);
}

__device__ __forceinline__ float cu_sb_float(uint32_t v, int sb_type)
{
	if (sb_type == TOAST_DT_F32)
		return __uint_as_float(v);
	return sb_type == TOAST_DT_BF16 ? __uint_as_float(v << 16) : __half2float(__ushort_as_half((unsigned short)v));
}

__device__ __forceinline__ float cu_f16_float(uint32_t v)
{
	return __half2float(__ushort_as_half((unsigned short)v));
}

template <int TYPE>
__device__ __forceinline__ cu_dq8_raw cu_dq8_at(const cu_wd &w, const cu_wrow &p, int64_t k)
{
	cu_dq8_raw x = {};
	const int t = TYPE == CU_QT_ANY ? w.type : TYPE;
	switch (t) {
	case TOAST_DT_BF16:
		x.a = cu_ld16(p.q + 2 * k);
		break;
	case TOAST_DT_Q4_0:
	case TOAST_DT_Q4_1: {
		int64_t b = k >> 5;
		bool q40 = t == TOAST_DT_Q4_0;
		x.b = cu_ld8(p.q + 16 * b + (k & 15));
		x.c = __ldg((const unsigned short *)(p.m + (q40 ? 2 : 4) * b));
		x.d = q40 ? 0 : __ldg((const unsigned short *)(p.m + 4 * b + 2));
		break;
	}
	case TOAST_DT_Q8_0: { /* (tiled: codes as MLX8's, the d's of 16 rows together) */
		int64_t b = k >> 5;
		bool tl = cu_kind_tiled<TYPE>(w);
		x.b = cu_ld8(p.q + (tl ? (int64_t)cu_tq_byte(k) : k));
		x.c = __ldg((const unsigned short *)(p.m + (tl ? 32 : 2) * b));
		break;
	}
	case TOAST_DT_Q4_K: /* (tiled) byte 128 (k / 256) + 32 ((k / 64) % 4) + k % 32, its cu_tq_byte */
		x.a = cu_ld16(p.m + 256 * (k >> 8));
		x.b = cu_ld8(p.q + 512 * (k >> 6) + 16 * ((k >> 3) & 3));
		break;
	case TOAST_DT_Q5_K: { /* (tiled) */
		int64_t b = k >> 8;
		const uint8_t *q = p.q + 2560 * b;
		int j = (int)(k >> 5) & 7, l = (int)(k & 31);
		x.a = cu_ld16(p.m + 256 * b);
		x.b = cu_ld8(q + cu_tu_byte(32 + 32 * (j >> 1) + l));
		uint2 qh = cu_ld8(q + cu_tu_byte(l));
		x.c = qh.x, x.d = qh.y;
		break;
	}
	case TOAST_DT_Q6_K: {
		int64_t b = k >> 8;
		int kk = (int)(k & 255), h = kk >> 7, l = kk & 31, s = (kk >> 5) & 3;
		/* ql bytes 64h + 32(s & 1) + l.., qh bytes 128 + 32h + l..: words j, j + 1 of a run */
		const uint8_t *q = p.q + 3072 * b, *m = p.m + 288 * b; /* (tiled: units of 16 rows) */
		int rl = 4 * h + 2 * (s & 1) + (l >> 4), rh = 8 + 2 * h + (l >> 4), j = (l >> 2) & 3;
		x.b = make_uint2(cu_ld4(q + cu_q6_word(rl, j)), cu_ld4(q + cu_q6_word(rl, j + 1)));
		x.c = cu_ld4(q + cu_q6_word(rh, j)), x.d = cu_ld4(q + cu_q6_word(rh, j + 1));
		x.a.x = __ldg((const unsigned short *)(m + 16));
		x.a.y = __ldg(m + kk / 16);
		break;
	}
	case TOAST_DT_MLX4:
	case TOAST_DT_MLX8: {
		bool tl = cu_kind_tiled<TYPE>(w);
		int64_t g = k / w.gs * (tl ? 16 : 1), j = t == TOAST_DT_MLX4 ? k / 2 : k; /* (tiled: 16 rows a group) */
		const uint8_t *q = p.q + (tl ? (int64_t)cu_tq_byte(j) : j);
		x.a.x = cu_ldsb_bits(p.m, w.sb_type, g);
		x.a.y = cu_ldsb_bits(p.b, w.sb_type, g);
		x.b = t == TOAST_DT_MLX4 ? make_uint2(__ldg((const uint32_t *)q), 0) : cu_ld8(q);
		break;
	}
	default: /* not reached: uploads accept only the types above */
		break;
	}
	return x;
}

template <int TYPE>
__device__ __forceinline__ cu_dq8_raw cu_dq8_load(const cu_wd &w, size_t e, int64_t r, int64_t k)
{
	return cu_dq8_at<TYPE>(w, cu_qrow<TYPE>(w, e, r), k);
}

template <int TYPE>
__device__ __forceinline__ void cu_dq8_cvt(const cu_wd &w, const cu_dq8_raw &x, int64_t k, float *y)
{
	const int t = TYPE == CU_QT_ANY ? w.type : TYPE;
	switch (t) {
	case TOAST_DT_BF16:
		cu_bf16x8(x.a, y);
		return;
	case TOAST_DT_Q4_0:
	case TOAST_DT_Q4_1: {
		int sh = k & 16 ? 4 : 0;
		float d = cu_f16_float(x.c), m = t == TOAST_DT_Q4_0 ? -8.0f * d : cu_f16_float(x.d);
		for (int j = 0; j < 8; j++)
			y[j] = (float)((((j < 4 ? x.b.x : x.b.y) >> (8 * (j & 3) + sh)) & 15)) * d + m;
		return;
	}
	case TOAST_DT_Q8_0: {
		float d = cu_f16_float(x.c);
		for (int j = 0; j < 8; j++)
			y[j] = (float)(int8_t)((j < 4 ? x.b.x : x.b.y) >> (8 * (j & 3))) * d;
		return;
	}
	case TOAST_DT_Q4_K:
	case TOAST_DT_Q5_K: {
		bool q5 = t == TOAST_DT_Q5_K;
		int j = (int)(k >> 5) & 7;
		uint32_t sm = cu_k4_pair(x.a, j >> 1);
		float2 dm = __half22float2(*(const __half2 *)&x.a.x);
		float d = dm.x * (float)((sm >> (8 * (j & 1))) & 0xff), mn = dm.y * (float)((sm >> (16 + 8 * (j & 1))) & 0xff);
		for (int i = 0; i < 8; i++) {
			uint32_t q = ((i < 4 ? x.b.x : x.b.y) >> (8 * (i & 3) + 4 * (j & 1))) & 15;
			if (q5)
				q |= (((i < 4 ? x.c : x.d) >> (8 * (i & 3) + j)) & 1) << 4;
			y[i] = d * (float)q - mn;
		}
		return;
	}
	case TOAST_DT_Q6_K: {
		int s = (int)(k >> 5) & 3;
		float d = cu_f16_float(x.a.x) * (float)(int8_t)x.a.y;
		for (int i = 0; i < 8; i++) {
			uint32_t lo = ((i < 4 ? x.b.x : x.b.y) >> (8 * (i & 3) + 4 * (s >> 1))) & 15;
			uint32_t hi = ((i < 4 ? x.c : x.d) >> (8 * (i & 3) + 2 * s)) & 3;
			y[i] = d * (float)((int)(lo | hi << 4) - 32);
		}
		return;
	}
	case TOAST_DT_MLX4:
	case TOAST_DT_MLX8: {
		bool m4 = t == TOAST_DT_MLX4;
		float s = cu_sb_float(x.a.x, w.sb_type), z = cu_sb_float(x.a.y, w.sb_type);
		for (int i = 0; i < 8; i++) {
			uint32_t q = m4 ? (x.b.x >> (4 * i)) & 15 : ((i < 4 ? x.b.x : x.b.y) >> (8 * (i & 3))) & 255;
			y[i] = s * (float)q + z;
		}
		return;
	}
	default: /* not reached */
		for (int i = 0; i < 8; i++)
			y[i] = 0.0f;
	}
}

/* both halves, any type */
__device__ __forceinline__ void cu_dq8(const cu_wd &w, size_t e, int64_t r, int64_t k, float *y)
{
	cu_dq8_cvt<CU_QT_ANY>(w, cu_dq8_load<CU_QT_ANY>(w, e, r, k), k, y);
}

/* ---- decode chunks: struct qk<TYPE> ----
 * EPC elements per chunk, NP = EPC / 4 float4 positions; chunk c of a row:
 *   load(row, c)      all global loads of the chunk (issued early by the kernels);
 *   prep(chunk, c)    its scales as floats (info);
 *   f4(c, i)          the float4 index in the input row of position i;
 *   deq4(chunk, info, c, i)  the four dequantised values at position i;
 *   swz(f)            the physical float4 index of logical f in shared memory.
 * CU_QT_ANY reads any type through cu_dq8 (8 elements a chunk, no swizzle).
 */

template <int TYPE>
struct qk;

template <>
struct qk<TOAST_DT_BF16> {
	static constexpr int EPC = 8, NP = 2;
	typedef uint4 chunk;
	struct info {};
	static __device__ __forceinline__ int swz(int f) { return f; }
	static __device__ __forceinline__ int f4(int c, int i) { return 2 * c + i; }
	static __device__ __forceinline__ chunk load(const cu_wrow &w, int c) { return cu_ld16(w.q + 16 * c); }
	static __device__ __forceinline__ info prep(const chunk &, int) { return {}; }
	static __device__ __forceinline__ float4 deq4(const chunk &k, const info &, int, int i)
	{
		uint32_t a = i ? k.z : k.x, b = i ? k.w : k.y;
		return make_float4(__uint_as_float(a << 16), __uint_as_float(a & 0xffff0000u), __uint_as_float(b << 16),
				   __uint_as_float(b & 0xffff0000u));
	}
};

/* the two runs of a Q4_K/Q5_K chunk: d*sc and -(128 d*sc + dmin*m) of sub-blocks 2p, 2p+1 */
struct cu_k4info {
	float dA, oA, dB, oB;
};

__device__ __forceinline__ cu_k4info cu_k4_info(const uint4 &h, int c)
{
	uint32_t sm = cu_k4_pair(h, (int)(c >> 1) & 3);
	float2 dm = __half22float2(*(const __half2 *)&h.x);
	float dA = dm.x * (cu_m128(sm, 0) - 128.0f), dB = dm.x * (cu_m128(sm, 1) - 128.0f);
	float mA = dm.y * (cu_m128(sm, 2) - 128.0f), mB = dm.y * (cu_m128(sm, 3) - 128.0f);
	return {dA, fmaf(-128.0f, dA, -mA), dB, fmaf(-128.0f, dB, -mB)};
}

__device__ __forceinline__ float4 cu_deq4_bytes(uint32_t q, float d, float o)
{
	return make_float4(fmaf(cu_m128(q, 0), d, o), fmaf(cu_m128(q, 1), d, o), fmaf(cu_m128(q, 2), d, o),
			   fmaf(cu_m128(q, 3), d, o));
}

/* Q4_K chunk c: block c/8, qs bytes 16*(c%8).. : low nibbles are elements 16*(c&1).. of
 * sub-block 2p (p = (c/2)%4), high nibbles the same of sub-block 2p+1 */
template <>
struct qk<TOAST_DT_Q4_K> {
	static constexpr int EPC = 32, NP = 8;
	struct chunk {
		uint4 q, h;
	};
	typedef cu_k4info info;
	static __device__ __forceinline__ int swz(int f) { return f ^ ((f >> 4) & 3); }
	static __device__ __forceinline__ int f4(int c, int i)
	{
		return (c >> 3) * 64 + ((c >> 1) & 3) * 16 + (c & 1) * 4 + (i >> 2) * 8 + (i & 3);
	}
	static __device__ __forceinline__ chunk load(const cu_wd &w, size_t e, int64_t r, int c) /* (tiled) */
	{
		cu_wrow t = cu_qrow<TOAST_DT_Q4_K>(w, e, r);
		const uint8_t *q = t.q + cu_tq_byte((c >> 3) * 128 + 16 * (c & 7));
		uint2 lo = cu_ld8(q), hi = cu_ld8(q + 16); /* granules 2i, 2i + 1 of a run: 16 bytes apart */
		return {make_uint4(lo.x, lo.y, hi.x, hi.y), cu_ld16(t.m + 256 * (c >> 3))};
	}
	static __device__ __forceinline__ info prep(const chunk &k, int c) { return cu_k4_info(k.h, c); }
	static __device__ __forceinline__ float4 deq4(const chunk &k, const info &in, int, int i)
	{
		uint32_t w = cu_word(k.q, i & 3);
		return i < 4 ? cu_deq4_bytes(w & 0x0f0f0f0fu, in.dA, in.oA) : cu_deq4_bytes((w >> 4) & 0x0f0f0f0fu, in.dB, in.oB);
	}
};

/* Q5_K: as Q4_K, the fifth bit of element l of sub-block j is bit j of qh[l] */
template <>
struct qk<TOAST_DT_Q5_K> {
	static constexpr int EPC = 32, NP = 8;
	struct chunk {
		uint4 q, h, qh;
	};
	typedef cu_k4info info;
	static __device__ __forceinline__ int swz(int f) { return qk<TOAST_DT_Q4_K>::swz(f); }
	static __device__ __forceinline__ int f4(int c, int i) { return qk<TOAST_DT_Q4_K>::f4(c, i); }
	static __device__ __forceinline__ chunk load(const cu_wd &wd, size_t e, int64_t r, int c) /* (tiled) */
	{
		cu_wrow w = cu_qrow<TOAST_DT_Q5_K>(wd, e, r);
		const uint8_t *q = w.q + (c >> 3) * 2560, *qs = q + cu_tu_byte(32 + 16 * (c & 7)), *qh = q + cu_tu_byte(16 * (c & 1));
		uint2 s0 = cu_ld8(qs), s1 = cu_ld8(qs + 16), h0 = cu_ld8(qh), h1 = cu_ld8(qh + 16); /* (granules 16 bytes apart) */
		return {make_uint4(s0.x, s0.y, s1.x, s1.y), cu_ld16(w.m + (c >> 3) * 256), make_uint4(h0.x, h0.y, h1.x, h1.y)};
	}
	static __device__ __forceinline__ info prep(const chunk &k, int c) { return cu_k4_info(k.h, c); }
	static __device__ __forceinline__ float4 deq4(const chunk &k, const info &in, int c, int i)
	{
		uint32_t w = cu_word(k.q, i & 3), hb = (cu_word(k.qh, i & 3) >> (2 * ((c >> 1) & 3) + (i >> 2))) & 0x01010101u;
		return i < 4 ? cu_deq4_bytes((w & 0x0f0f0f0fu) | hb << 4, in.dA, in.oA)
			     : cu_deq4_bytes(((w >> 4) & 0x0f0f0f0fu) | hb << 4, in.dB, in.oB);
	}
};

/* Q6_K (split): chunk c = block c/8, (half hh, s, m) = bits 2, 1, 0 of c%8: ql bytes
 * 64hh + 32s + 16m.. (low nibbles: run s, high: run s+2, elements 16m..16m+15 of each) */
template <>
struct qk<TOAST_DT_Q6_K> {
	static constexpr int EPC = 32, NP = 8;
	struct chunk {
		uint4 ql, qh;
		float dA, dB;
	};
	struct info {
		float dA, oA, dB, oB;
	};
	static __device__ __forceinline__ int swz(int f) { return f ^ (((f >> 4) & 2) | ((f >> 3) & 1)); }
	static __device__ __forceinline__ int f4(int c, int i)
	{
		return (c >> 3) * 64 + ((c >> 2) & 1) * 32 + ((c >> 1) & 1) * 8 + (c & 1) * 4 + (i >> 2) * 16 + (i & 3);
	}
	static __device__ __forceinline__ chunk load(const cu_wd &wd, size_t e, int64_t r, int c) /* (tiled) */
	{
		cu_wrow w = cu_qrow<TOAST_DT_Q6_K>(wd, e, r);
		int b = c >> 3;
		int hh = (int)(c >> 2) & 1, m = (int)c & 1, sc = 8 * hh + 2 * ((int)(c >> 1) & 1) + m;
		const uint8_t *meta = w.m + 288 * b;
		float d = cu_ldf16(meta + 16);
		const uint8_t *q = w.q + 3072 * b;
		return {cu_q6_run(q, c & 7), cu_q6_run(q, 8 + 2 * hh + m), d * (float)(int8_t)__ldg(meta + sc),
			d * (float)(int8_t)__ldg(meta + sc + 4)};
	}
	static __device__ __forceinline__ info prep(const chunk &k, int) { return {k.dA, -160.0f * k.dA, k.dB, -160.0f * k.dB}; }
	static __device__ __forceinline__ float4 deq4(const chunk &k, const info &in, int c, int i)
	{
		int s = (int)(c >> 1) & 1;
		uint32_t w = cu_word(k.ql, i & 3), hw = cu_word(k.qh, i & 3);
		return i < 4 ? cu_deq4_bytes((w & 0x0f0f0f0fu) | ((hw >> (2 * s)) & 0x03030303u) << 4, in.dA, in.oA)
			     : cu_deq4_bytes(((w >> 4) & 0x0f0f0f0fu) | ((hw >> (2 * s + 4)) & 0x03030303u) << 4, in.dB, in.oB);
	}
};

/* Q8_0 (split, tiled): chunk c = half c&1 of block c/2 (16 int8) */
template <>
struct qk<TOAST_DT_Q8_0> {
	static constexpr int EPC = 16, NP = 4;
	struct chunk {
		uint4 q;
		float d;
	};
	struct info {
		float d, o;
	};
	static __device__ __forceinline__ int swz(int f) { return f ^ ((f >> 3) & 3); }
	static __device__ __forceinline__ int f4(int c, int i) { return 4 * c + i; }
	static __device__ __forceinline__ chunk load(const cu_wd &w, size_t e, int64_t r, int c) /* (tiled) */
	{
		cu_wrow p = cu_qrow<TOAST_DT_Q8_0>(w, e, r);
		const uint8_t *q = p.q + cu_tq_byte(16 * c);
		uint2 lo = cu_ld8(q), hi = cu_ld8(q + 16); /* granules 2i, 2i + 1 of a run: 16 bytes apart */
		return {make_uint4(lo.x, lo.y, hi.x, hi.y), cu_ldf16(p.m + 32 * (c >> 1))};
	}
	static __device__ __forceinline__ info prep(const chunk &k, int) { return {k.d, -32896.0f * k.d}; }
	static __device__ __forceinline__ float4 deq4(const chunk &k, const info &in, int, int i)
	{
		uint32_t w = cu_word(k.q, i) ^ 0x80808080u; /* int8 -> q + 128 */
		return make_float4(fmaf(cu_m32k(w, 0), in.d, in.o), fmaf(cu_m32k(w, 1), in.d, in.o),
				   fmaf(cu_m32k(w, 2), in.d, in.o), fmaf(cu_m32k(w, 3), in.d, in.o));
	}
};

/* Q4_0 / Q4_1 (split): chunk c = block c: byte l's low nibble is element l, high l + 16 */
template <int TYPE>
struct qk_q4 {
	static constexpr int EPC = 32, NP = 8;
	struct chunk {
		uint4 q;
		float d, m;
	};
	struct info {
		float d, o;
	};
	static __device__ __forceinline__ int swz(int f) { return f ^ ((f >> 3) & 7); }
	static __device__ __forceinline__ int f4(int c, int i) { return 8 * c + i; }
	static __device__ __forceinline__ chunk load(const cu_wrow &w, int c)
	{
		if (TYPE == TOAST_DT_Q4_0) {
			float d = cu_ldf16(w.m + 2 * c);
			return {cu_ld16(w.q + 16 * c), d, -8.0f * d};
		}
		return {cu_ld16(w.q + 16 * c), cu_ldf16(w.m + 4 * c), cu_ldf16(w.m + 4 * c + 2)};
	}
	static __device__ __forceinline__ info prep(const chunk &k, int) { return {k.d, fmaf(-128.0f, k.d, k.m)}; }
	static __device__ __forceinline__ float4 deq4(const chunk &k, const info &in, int, int i)
	{
		uint32_t w = cu_word(k.q, i & 3);
		return cu_deq4_bytes(i < 4 ? w & 0x0f0f0f0fu : (w >> 4) & 0x0f0f0f0fu, in.d, in.o);
	}
};
template <>
struct qk<TOAST_DT_Q4_0> : qk_q4<TOAST_DT_Q4_0> {};
template <>
struct qk<TOAST_DT_Q4_1> : qk_q4<TOAST_DT_Q4_1> {};

/* MLX affine: chunk c = 16 bytes of packed words (32 four-bit or 16 eight-bit codes), one group */
template <int BITS>
struct qk_mlx {
	static constexpr int EPC = 128 / BITS, NP = EPC / 4;
	struct chunk {
		uint4 q;
		float s, z;
	};
	struct info {
		float s, o;
	};
	static __device__ __forceinline__ int swz(int f) { return BITS == 4 ? f ^ ((f >> 3) & 7) : f ^ ((f >> 3) & 3); }
	static __device__ __forceinline__ int f4(int c, int i) { return NP * c + i; }
	static __device__ __forceinline__ chunk load(const cu_wd &w, size_t e, int64_t r, int c) /* (tiled) */
	{
		cu_wrow p = cu_qrow<BITS == 4 ? TOAST_DT_MLX4 : TOAST_DT_MLX8>(w, e, r);
		const uint8_t *q = p.q + cu_tq_byte(16 * c);
		uint2 lo = cu_ld8(q), hi = cu_ld8(q + 16); /* granules 2i, 2i + 1 of a run: 16 bytes apart */
		int g = 16 * (c * EPC / w.gs);
		return {make_uint4(lo.x, lo.y, hi.x, hi.y), cu_ldsb(p.m, w.sb_type, g), cu_ldsb(p.b, w.sb_type, g)};
	}
	static __device__ __forceinline__ info prep(const chunk &k, int)
	{
		return {k.s, fmaf(BITS == 4 ? -128.0f : -32768.0f, k.s, k.z)};
	}
	static __device__ __forceinline__ float4 deq4(const chunk &k, const info &in, int, int i)
	{
		if (BITS == 8) {
			uint32_t w = cu_word(k.q, i);
			return make_float4(fmaf(cu_m32k(w, 0), in.s, in.o), fmaf(cu_m32k(w, 1), in.s, in.o),
					   fmaf(cu_m32k(w, 2), in.s, in.o), fmaf(cu_m32k(w, 3), in.s, in.o));
		}
		/* word i/2 holds codes 8(i/2)..: nibble n at bits 4n; position i is nibbles 4(i&1)..+3 */
		uint32_t w = cu_word(k.q, i >> 1), lo = w & 0x0f0f0f0fu, hi = (w >> 4) & 0x0f0f0f0fu;
		int b = 2 * (i & 1);
		return make_float4(fmaf(cu_m128(lo, b), in.s, in.o), fmaf(cu_m128(hi, b), in.s, in.o),
				   fmaf(cu_m128(lo, b + 1), in.s, in.o), fmaf(cu_m128(hi, b + 1), in.s, in.o));
	}
};
template <>
struct qk<TOAST_DT_MLX4> : qk_mlx<4> {};
template <>
struct qk<TOAST_DT_MLX8> : qk_mlx<8> {};

/* any type through cu_dq8: the chunk holds its 8 values */
template <>
struct qk<CU_QT_ANY> {
	static constexpr int EPC = 8, NP = 2;
	struct chunk {
		float4 a, b;
	};
	struct info {};
	static __device__ __forceinline__ int swz(int f) { return f; }
	static __device__ __forceinline__ int f4(int c, int i) { return 2 * c + i; }
	static __device__ __forceinline__ info prep(const chunk &, int) { return {}; }
	static __device__ __forceinline__ float4 deq4(const chunk &k, const info &, int, int i) { return i ? k.b : k.a; }
};

/* load chunk c of row (of matrix e) of w: MLX chunks need the scale type and group size */
template <int TYPE>
__device__ __forceinline__ typename qk<TYPE>::chunk cu_qload(const cu_wd &w, const cu_wrow &row, size_t e, int64_t r,
							     int c)
{
	if constexpr (cu_tiled_kind(TYPE))
		return qk<TYPE>::load(w, e, r, c);
	else if constexpr (TYPE == CU_QT_ANY) {
		float y[8];
		cu_dq8(w, e, r, 8 * c, y);
		return {make_float4(y[0], y[1], y[2], y[3]), make_float4(y[4], y[5], y[6], y[7])};
	} else
		return qk<TYPE>::load(row, c);
}

/* the dot product of chunk c with an input row x (f32, swizzled for TYPE, in shared memory) */
template <int TYPE>
__device__ __forceinline__ float cu_qdot(const typename qk<TYPE>::chunk &k, int c, const float *x)
{
	typedef qk<TYPE> Q;
	typename Q::info in = Q::prep(k, c);
	float acc = 0.0f;
#pragma unroll
	for (int i = 0; i < Q::NP; i++) {
		float4 y = Q::deq4(k, in, c, i), v = ((const float4 *)x)[Q::swz(Q::f4(c, i))];
		acc += y.x * v.x + y.y * v.y + y.z * v.z + y.w * v.w;
	}
	return acc;
}

/* element i of an input row stored for TYPE's swizzle */
template <int TYPE>
__device__ __forceinline__ int64_t cu_qpos(int64_t i)
{
	return 4 * qk<TYPE>::swz(i >> 2) + (i & 3);
}

#ifndef TOAST_CUDA_EMU
/* row (shared memory, stored for TYPE's swizzle) = RMSNorm(x) of n elements with weight w (1 + w
 * when plus_one), and the same values in order to out (f32) or outb (bf16) when not NULL. Called
 * by a whole block; red: 32 floats of shared memory; no barrier after the writes. Whole float4s
 * when n % 4 == 0 and x, w are 16-byte aligned (the swizzles move float4s, never split them):
 * a GEMV block of a few rows spends as many instructions here as on its rows otherwise. */
template <int TYPE>
__device__ __forceinline__ void cu_stage_norm(const float *x, const float *w, int64_t n, float eps, int plus_one,
					      float *row, float *red, float *out, bf16 *outb)
{
	if ((n & 3) == 0 && (((uintptr_t)x | (uintptr_t)w | (uintptr_t)out) & 15) == 0 && ((uintptr_t)outb & 3) == 0) {
		float p1 = plus_one ? 1.0f : 0.0f;
		int n4 = (int)(n >> 2);
		/* at most two float4s a thread: x and w read once, the norm taken from registers (every
		 * thread makes the one pass: the block sum needs them all) */
		bool one = n4 <= 2 * (int)blockDim.x;
		float r = one ? 0.0f : cu_rms4(x, n, eps, red);
		for (int i0 = threadIdx.x; i0 < n4 || (one && i0 == (int)threadIdx.x); i0 += 2 * blockDim.x) {
			float4 y[2], g[2]; /* both loads before the stores: one L2 round trip, not two */
			float ss = 0;
#pragma unroll
			for (int k = 0; k < 2; k++)
				if (i0 + k * (int)blockDim.x < n4) {
					y[k] = ((const float4 *)x)[i0 + k * blockDim.x];
					g[k] = ((const float4 *)w)[i0 + k * blockDim.x];
					ss += y[k].x * y[k].x + y[k].y * y[k].y + y[k].z * y[k].z + y[k].w * y[k].w;
				}
			if (one)
				r = rsqrtf(cu_block_sum(ss, red) / n + eps);
#pragma unroll
			for (int k = 0; k < 2; k++)
				if (i0 + k * (int)blockDim.x < n4)
					y[k] = make_float4(y[k].x * r * (p1 + g[k].x), y[k].y * r * (p1 + g[k].y),
							   y[k].z * r * (p1 + g[k].z), y[k].w * r * (p1 + g[k].w));
#pragma unroll
			for (int k = 0; k < 2; k++) {
				int i = i0 + k * blockDim.x;
				if (i >= n4)
					break;
				((float4 *)row)[qk<TYPE>::swz(i)] = y[k];
				if (out)
					((float4 *)out)[i] = y[k];
				if (outb) {
					((__nv_bfloat162 *)outb)[2 * i] = __floats2bfloat162_rn(y[k].x, y[k].y);
					((__nv_bfloat162 *)outb)[2 * i + 1] = __floats2bfloat162_rn(y[k].z, y[k].w);
				}
			}
		}
		return;
	}
	float r = cu_rms(x, n, eps, red);
	for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
		float y = x[i] * r * (plus_one ? 1.0f + w[i] : w[i]);
		row[cu_qpos<TYPE>(i)] = y;
		if (out)
			out[i] = y;
		if (outb)
			outb[i] = __float2bfloat16(y);
	}
}

/*
 * Weights on tensor cores at decode (k_gemv_k4, k_moe_*_k4): a warp multiplies 16 weight rows
 * by up to 8 input rows (the mma's 8 columns) one superblock (256 elements) at a time, with the
 * codes as exact bf16 integers: 128 + q is a bf16 whose mantissa holds q, so one LOP3 makes two
 * of them, and the tensor core sums x * (128 + q) in f32 over the elements one scale covers.
 * The scale comes after: e.g. Q4_K's d*sc * C + (-(128 d*sc) - dmin*m) * sum(x), with sum(x) of
 * the bf16 input staged once. About 2 instructions a weight, where dequantising in registers
 * and one FFMA a product takes 6 and more (the 4-bit kernels were issue-bound).
 *
 * cu_kq<TYPE> is one kind of weight, for kernels written once for all: Q4_K and Q5_K (sub-blocks
 * of 32), Q6_K (sub-blocks of 16), MLX4 (chunks of 64), Q8_0 (blocks of 32) and MLX8 (chunks of
 * 64). EL is the elements of a unit (a superblock of 256; 128 for the 8-bit kinds), SUB what one
 * scale covers (the input's sums are staged per SUB elements), PAIR4 the staged order of eight
 * elements (x0 x4 x1 x5 x2 x6 x3 x7, else x0 x2 x1 x3 x4 x6 x5 x7). Each has: ld, what a lane
 * holds of one unit of its rows g and g+8 (g = lane / 4, t = lane % 4) and of its decode row
 * (lane % 16); load(W, p, u, lane), which issues the loads of unit u of the tile whose rows
 * p = cu_krows_of<TYPE>(..) locates; scales(W, L, sc, lane), which decodes the
 * warp's scales of the unit into sc (at most 1 KB; the caller syncs the warp around it); and
 * mma<COLS>(acc, L, sc, x, xs0, xs1, wt, g, t): acc (the lane's C fragment: rows g, g+8 x columns
 * 2t, 2t+1) += the unit, with x the lane's staged input row (column g; bf16, in the staged order)
 * at the unit's first element, xs0 and xs1 the SUB-element sums of columns 2t and 2t+1 there, wt
 * a factor on the whole (the MoE's routing weight); COLS 1: only column 0 is wanted.
 */
#define CU_K4_MAGIC 0x43004300u /* two bf16 128.0 */

/* (v & mask) | magic in one LOP3 (the compiler makes two of it with both constants
 * immediate): the BITS-bit codes (4: Q4_K, MLX4; 6: Q6_K) at bits 0 and 16 of v as two bf16
 * 128 + q */
template <int BITS>
__device__ __forceinline__ unsigned cu_two_codes(uint32_t v, uint32_t magic)
{
	unsigned r;
	asm("lop3.b32 %0, %1, %3, %2, 0xea;" : "=r"(r) : "r"(v), "r"(magic), "n"(((1u << BITS) - 1) * 0x10001u));
	return r;
}

/* the 4-bit codes (128 bytes a row a superblock) a lane holds of a superblock of two row-major
 * rows at qa, qb: bytes 8t..8t+7 of each 32-byte run p (bench/k4_probe.cu's row-major layout;
 * the kernels read tiles, cu_k4_tile_codes) */
__device__ __forceinline__ void cu_k4_codes(uint2 *a, uint2 *b, const uint8_t *qa, const uint8_t *qb, int t)
{
#pragma unroll
	for (int p = 0; p < 4; p++) {
		a[p] = cu_ld8(qa + 32 * p + 8 * t);
		b[p] = cu_ld8(qb + 32 * p + 8 * t);
	}
}

template <int TYPE>
struct cu_kq;

/* the same from a tiled unit (cu_tq_off) at q + 16 lane: run p of rows g, g + 8 in one load */
__device__ __forceinline__ void cu_k4_tile_codes(uint2 *a, uint2 *b, const uint8_t *q)
{
#pragma unroll
	for (int p = 0; p < 4; p++) {
		uint4 v = cu_ld16(q + 512 * p);
		a[p] = make_uint2(v.x, v.y), b[p] = make_uint2(v.z, v.w);
	}
}

/* where a lane reads the units of a tile of 16 rows r0.. of matrix e from (every cu_kq kind is
 * tiled): its 16 bytes of the tile's first unit and its decode row's header there (the padding
 * rows need no clamp) */
struct cu_krows {
	const uint8_t *a, *h;
};

template <int TYPE>
__device__ __forceinline__ cu_krows cu_krows_of(const cu_wd &W, size_t e, int64_t r0, int lane)
{
	static_assert(cu_tiled_kind(TYPE), "tensor-core kinds read tiled weights");
	const uint8_t *x = W.base + e * W.stride;
	int64_t tile = r0 >> 4;
	return {x + tile * 16 * W.q_row + 16 * lane, x + W.m_off + tile * 16 * W.m_row + (lane & 15) * cu_tmu<TYPE>(W)};
}

/* Q5_K's fifth bits: bits k and k + 16 of v as bit 4 of two bf16 128 + q (magic: their other
 * bits), for cu_two_codes<4> to put the low four bits into */
__device__ __forceinline__ unsigned cu_q5_high(uint32_t v, int k, uint32_t magic)
{
	unsigned r, x = k <= 4 ? v << (4 - k) : v >> (k - 4);
	asm("lop3.b32 %0, %1, %3, %2, 0xea;" : "=r"(r) : "r"(x), "r"(magic), "n"(0x00100010));
	return r;
}

/*
 * Q4_K and Q5_K (cu_k4_mma): a 32-byte run p of a row's codes holds sub-block 2p in its low
 * nibbles and 2p+1 in its high ones (the lane's bytes: elements 8t.. of each). The mma's k order
 * within a sub-block is ours to choose: word w of the lane's 8 bytes gives its k values 2t, 2t+1,
 * 2t+8, 2t+9 as elements 8t+4w + 0, 2, 1, 3, so the input is staged bf16 with each group of four
 * stored as x0, x2, x1, x3 and a lane reads its B fragment as one 8-byte load. Q5_K's fifth bit
 * of element l of sub-block s is bit s of qh[l]: the lane's qh bytes 8t..8t+7 hold those of
 * its elements of every sub-block, word w's bytes as its codes' (cu_q5_high). Both types take
 * the same scales: d*sc * C + (-(128 d*sc) - dmin*m) * sum(x).
 */
template <int COLS, bool Q5>
__device__ __forceinline__ void cu_k4_mma(float *acc, const uint2 *A, const uint2 *B, uint2 ha, uint2 hb,
					  const void *vsc, const bf16 *x, const float *xs0, const float *xs1, float wt,
					  int g, int t)
{
	const float4 *sc = (const float4 *)vsc;
	uint32_t magic = CU_K4_MAGIC;
	asm("" : "+r"(magic)); /* a register, not an immediate */
#pragma unroll
	for (int p = 0; p < 4; p++) {
		float4 sa = sc[p * 16 + g], sb = sc[p * 16 + g + 8];
#pragma unroll
		for (int h = 0; h < 2; h++) { /* sub-block 2p + h: the low, then the high nibbles */
			int s = 2 * p + h;
			float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
			uint4 bx = *(const uint4 *)(x + 32 * s + 8 * t); /* both k-steps' B */
#pragma unroll
			for (int w = 0; w < 2; w++) {
				uint32_t wa = w ? A[p].y : A[p].x, wb = w ? B[p].y : B[p].x;
				uint32_t m[4] = {magic, magic, magic, magic}; /* bytes 0, 2 then 1, 3 of rows g, g + 8 */
				if (Q5) {
					uint32_t qa = w ? ha.y : ha.x, qb = w ? hb.y : hb.x;
					m[0] = cu_q5_high(qa, s, magic), m[1] = cu_q5_high(qb, s, magic);
					m[2] = cu_q5_high(qa, s + 8, magic), m[3] = cu_q5_high(qb, s + 8, magic);
				}
				unsigned fa[4] = {cu_two_codes<4>(wa >> (4 * h), m[0]), cu_two_codes<4>(wb >> (4 * h), m[1]),
						  cu_two_codes<4>(wa >> (4 * h + 8), m[2]),
						  cu_two_codes<4>(wb >> (4 * h + 8), m[3])};
				cu_mma_bf16(c, fa, w ? bx.z : bx.x, w ? bx.w : bx.y);
			}
			float da = (h ? sa.z : sa.x) * wt, oa = (h ? sa.w : sa.y) * wt;
			float db = (h ? sb.z : sb.x) * wt, ob = (h ? sb.w : sb.y) * wt;
			acc[0] = fmaf(oa, xs0[s], fmaf(da, c[0], acc[0]));
			acc[2] = fmaf(ob, xs0[s], fmaf(db, c[2], acc[2]));
			if (COLS > 1) {
				acc[1] = fmaf(oa, xs1[s], fmaf(da, c[1], acc[1]));
				acc[3] = fmaf(ob, xs1[s], fmaf(db, c[3], acc[3]));
			}
		}
	}
}

/* Q4_K's and Q5_K's scales of the decode row's header h into sc[4][16] float4 (pair, row: dA,
 * oA, dB, oB; a pair's rows contiguous, so that the stores and the 8 rows a load reads take no
 * bank twice): lane l decodes row l % 16, pairs 2 (l / 16) and 2 (l / 16) + 1 */
__device__ __forceinline__ void cu_k4_scales(const uint4 &h, void *vsc, int lane)
{
	float4 *sc = (float4 *)vsc;
#pragma unroll
	for (int q = 0; q < 2; q++) {
		int p = 2 * (lane >> 4) + q;
		cu_k4info in = cu_k4_info(h, 2 * p);
		sc[p * 16 + (lane & 15)] = make_float4(in.dA, in.oA, in.dB, in.oB);
	}
}

template <>
struct cu_kq<TOAST_DT_Q4_K> {
	static constexpr int EL = 256, SUB = 32;
	static constexpr bool PAIR4 = false;
	struct ld {
		uint2 a[4], b[4];
		uint4 h; /* the decode row's header */
	};
	static __device__ __forceinline__ ld load(const cu_wd &, const cu_krows &p, int sb, int)
	{
		ld L;
		cu_k4_tile_codes(L.a, L.b, p.a + 2048 * sb);
		L.h = cu_ld16(p.h + 256 * sb);
		return L;
	}
	static __device__ __forceinline__ void scales(const cu_wd &, const ld &L, void *vsc, int lane)
	{
		cu_k4_scales(L.h, vsc, lane);
	}
	template <int COLS>
	static __device__ __forceinline__ void mma(float *acc, const ld &L, const void *vsc, const bf16 *x, const float *xs0,
						   const float *xs1, float wt, int g, int t)
	{
		cu_k4_mma<COLS, false>(acc, L.a, L.b, make_uint2(0, 0), make_uint2(0, 0), vsc, x, xs0, xs1, wt, g, t);
	}
};

/* Q5_K: a superblock's 160 quant bytes are qh[32], then codes as Q4_K's */
template <>
struct cu_kq<TOAST_DT_Q5_K> {
	static constexpr int EL = 256, SUB = 32;
	static constexpr bool PAIR4 = false;
	struct ld {
		uint2 a[4], b[4];
		uint2 ha, hb; /* qh bytes 8t.. of rows g, g + 8 */
		uint4 h;
	};
	static __device__ __forceinline__ ld load(const cu_wd &, const cu_krows &p, int sb, int)
	{
		ld L; /* (tiled: qh as a run before the codes' four) */
		const uint8_t *q = p.a + 2560 * sb;
		uint4 h = cu_ld16(q);
		L.ha = make_uint2(h.x, h.y), L.hb = make_uint2(h.z, h.w);
		cu_k4_tile_codes(L.a, L.b, q + 512);
		L.h = cu_ld16(p.h + 256 * sb);
		return L;
	}
	static __device__ __forceinline__ void scales(const cu_wd &, const ld &L, void *vsc, int lane)
	{
		cu_k4_scales(L.h, vsc, lane);
	}
	template <int COLS>
	static __device__ __forceinline__ void mma(float *acc, const ld &L, const void *vsc, const bf16 *x, const float *xs0,
						   const float *xs1, float wt, int g, int t)
	{
		cu_k4_mma<COLS, true>(acc, L.a, L.b, L.ha, L.hb, vsc, x, xs0, xs1, wt, g, t);
	}
};

/* (a & 0x0f0f0f0f) | (b & 0xf0f0f0f0): a's low nibbles, b's high ones */
__device__ __forceinline__ uint32_t cu_nib_sel(uint32_t a, uint32_t b)
{
	uint32_t r;
	asm("lop3.b32 %0, %1, %2, 0x0f0f0f0f, 0xd8;" : "=r"(r) : "r"(b), "r"(a)); /* (second & third) | (first & ~third) */
	return r;
}

/*
 * Q6_K: a code q (6 bits) as the bf16 128 + q, the mma summing x * (128 + q) over one 16-element
 * sub-block (one k-step, its own scale), then d*sc * (C - 160 * sum(x)) with the input staged
 * as for Q4_K and summed over 16. A superblock's quarter u = 2n + h (n, h: bits of element 128n
 * + 32qq + 16h + j, qq = 0..3) is 16 bytes of ql run A (qq 0 in the low nibbles, 2 in the high),
 * 16 of run B (qq 1, 3) and 16 of qh (qq's two bits at 2qq); lane (g, t) holds bytes j =
 * 4t..4t+3 of each for rows g and g + 8, so that bytes 0, 2 of a word are its k values 2t, 2t+1
 * and bytes 1, 3 are 2t+8, 2t+9 (the staged order), as for Q4_K. Per 16 codes: 5 shifts, 4
 * selects, 8 LOP3 and 4 shifts.
 */
template <>
struct cu_kq<TOAST_DT_Q6_K> {
	static constexpr int EL = 256, SUB = 16;
	static constexpr bool PAIR4 = false;
	struct ld {
		uint32_t a[2][4], b[2][4], h[2][4]; /* [row g, g + 8][quarter] */
		uint32_t sc[2];                     /* the 8 scales of the lane's decode row (scales) */
		float d;
	};
	/* quant plane: ql[128] then qh[64]; meta plane: scales[16] then d (2-byte aligned), of which
	 * lane l decodes row l % 16, sub-blocks 8 (l / 16).. */
	static __device__ __forceinline__ ld load(const cu_wd &, const cu_krows &p, int sb, int lane)
	{
		ld L;
		/* word t of each run (a[u], b[u]: ql runs 4n + h and 4n + 2 + h, h[u]: qh run 8 + 2n + h,
		 * u = 2n + h), a load two runs' of rows g and g + 8 (cu_q6_word) */
		const uint8_t *q = p.a + 3072 * sb;
		auto put = [](uint32_t *ga, uint32_t *gb, uint4 v) { ga[0] = v.x, ga[1] = v.y, gb[0] = v.z, gb[1] = v.w; };
		put(L.a[0], L.a[1], cu_ld16(q));
		put(L.b[0], L.b[1], cu_ld16(q + 512));
		put(L.a[0] + 2, L.a[1] + 2, cu_ld16(q + 1024));
		put(L.b[0] + 2, L.b[1] + 2, cu_ld16(q + 1536));
		put(L.h[0], L.h[1], cu_ld16(q + 2048));
		put(L.h[0] + 2, L.h[1] + 2, cu_ld16(q + 2560));
		const uint8_t *h = p.h + 288 * sb;
		const unsigned short *m = (const unsigned short *)(h + 8 * (lane >> 4));
		L.sc[0] = __ldg(m) | (uint32_t)__ldg(m + 1) << 16;
		L.sc[1] = __ldg(m + 2) | (uint32_t)__ldg(m + 3) << 16;
		L.d = cu_ldf16(h + 16);
		return L;
	}
	/* d * sc into sc[16][8] float2 (sub-block, g: rows g, g+8) */
	static __device__ __forceinline__ void scales(const cu_wd &, const ld &L, void *vsc, int lane)
	{
		int r = lane & 15, s0 = 8 * (lane >> 4);
		float *f = (float *)vsc;
#pragma unroll
		for (int i = 0; i < 8; i++)
			f[((s0 + i) * 8 + (r & 7)) * 2 + (r >> 3)] = L.d * (float)(int8_t)(L.sc[i >> 2] >> (8 * (i & 3)));
	}
	template <int COLS>
	static __device__ __forceinline__ void mma(float *acc, const ld &L, const void *vsc, const bf16 *x, const float *xs0,
						   const float *xs1, float wt, int g, int t)
	{
		const float2 *sc = (const float2 *)vsc;
		uint32_t magic = CU_K4_MAGIC;
		asm("" : "+r"(magic));
#pragma unroll
		for (int u = 0; u < 4; u++) {
			uint32_t c[2][4]; /* [row][qq]: a byte a code, its low 6 bits */
#pragma unroll
			for (int r = 0; r < 2; r++) {
				uint32_t A = L.a[r][u], B = L.b[r][u], H = L.h[r][u];
				c[r][0] = cu_nib_sel(A, H << 4);
				c[r][1] = cu_nib_sel(B, H << 2);
				c[r][2] = cu_nib_sel(A >> 4, H);
				c[r][3] = cu_nib_sel(B >> 4, H >> 2);
			}
#pragma unroll
			for (int qq = 0; qq < 4; qq++) {
				int s = 8 * (u >> 1) + 2 * qq + (u & 1);
				unsigned fa[4] = {cu_two_codes<6>(c[0][qq], magic), cu_two_codes<6>(c[1][qq], magic),
						  cu_two_codes<6>(c[0][qq] >> 8, magic),
						  cu_two_codes<6>(c[1][qq] >> 8, magic)};
				uint2 bx = *(const uint2 *)(x + 16 * s + 4 * t);
				float cc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
				cu_mma_bf16(cc, fa, bx.x, bx.y);
				float2 ds = sc[s * 8 + g];
				float da = ds.x * wt, db = ds.y * wt;
				acc[0] = fmaf(da, fmaf(-160.0f, xs0[s], cc[0]), acc[0]);
				acc[2] = fmaf(db, fmaf(-160.0f, xs0[s], cc[2]), acc[2]);
				if (COLS > 1) {
					acc[1] = fmaf(da, fmaf(-160.0f, xs1[s], cc[1]), acc[1]);
					acc[3] = fmaf(db, fmaf(-160.0f, xs1[s], cc[3]), acc[3]);
				}
			}
		}
	}
};

/*
 * MLX4 (affine 4-bit in groups of 64 or a multiple of 64): the mma sums x * (128 + q) over the
 * 64 elements of chunk p of a superblock (one group, one scale), then s * C + (z - 128 s) *
 * sum(x). A chunk of a row is 32 bytes, as a Q4_K run is, and the lane holds the same bytes of it
 * (elements 16t..16t+15). A packed word holds 8 elements, element n at bits 4n, so the word
 * shifted by 4i and masked with 0x000f000f gives elements i and i + 4: word w's two k-steps take
 * its elements 0, 4, 1, 5 and 2, 6, 3, 7 as the k values 2t, 2t+1, 2t+8, 2t+9, and the input is
 * staged bf16 with each group of eight stored as x0 x4 x1 x5 x2 x6 x3 x7 (PAIR4). Groups of 32
 * would put two scales in one mma: they take the SIMT kernels (cu_kq_fits).
 */
template <>
struct cu_kq<TOAST_DT_MLX4> {
	static constexpr int EL = 256, SUB = 64;
	static constexpr bool PAIR4 = true;
	struct ld {
		uint2 a[4], b[4];
		uint32_t s[2], z[2]; /* scale and bias bits, as stored, of the decode row's two chunks */
	};
	/* the decode row's biases lie b_off - m_off after its scales; lane l decodes chunks 2 (l /
	 * 16) and 2 (l / 16) + 1 */
	static __device__ __forceinline__ ld load(const cu_wd &W, const cu_krows &p, int sb, int lane)
	{
		ld L;
		int per = W.gs >> 6;
		const uint8_t *rh = p.h, *rz = rh + (W.b_off - W.m_off);
		cu_k4_tile_codes(L.a, L.b, p.a + 2048 * sb);
#pragma unroll
		for (int q = 0; q < 2; q++) { /* (tiled: a group's 16 rows together) */
			int c = 4 * sb + 2 * (lane >> 4) + q, grp = 16 * (per == 1 ? c : c / per);
			L.s[q] = cu_ldsb_bits(rh, W.sb_type, grp);
			L.z[q] = cu_ldsb_bits(rz, W.sb_type, grp);
		}
		return L;
	}
	/* (s, z - 128 s) into sc[4][16] float2 (chunk, row) */
	static __device__ __forceinline__ void scales(const cu_wd &W, const ld &L, void *vsc, int lane)
	{
		float2 *sc = (float2 *)vsc;
#pragma unroll
		for (int q = 0; q < 2; q++) {
			float s = cu_sb_float(L.s[q], W.sb_type), z = cu_sb_float(L.z[q], W.sb_type);
			sc[(2 * (lane >> 4) + q) * 16 + (lane & 15)] = make_float2(s, fmaf(-128.0f, s, z));
		}
	}
	template <int COLS>
	static __device__ __forceinline__ void mma(float *acc, const ld &L, const void *vsc, const bf16 *x, const float *xs0,
						   const float *xs1, float wt, int g, int t)
	{
		const float2 *sc = (const float2 *)vsc;
		uint32_t magic = CU_K4_MAGIC;
		asm("" : "+r"(magic));
#pragma unroll
		for (int p = 0; p < 4; p++) {
			float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
			for (int w = 0; w < 2; w++) {
				uint32_t wa = w ? L.a[p].y : L.a[p].x, wb = w ? L.b[p].y : L.b[p].x;
				uint4 bx = *(const uint4 *)(x + 64 * p + 16 * t + 8 * w); /* both k-steps' B */
				unsigned f0[4] = {cu_two_codes<4>(wa, magic), cu_two_codes<4>(wb, magic),
						  cu_two_codes<4>(wa >> 4, magic), cu_two_codes<4>(wb >> 4, magic)};
				cu_mma_bf16(c, f0, bx.x, bx.y);
				unsigned f1[4] = {cu_two_codes<4>(wa >> 8, magic), cu_two_codes<4>(wb >> 8, magic),
						  cu_two_codes<4>(wa >> 12, magic), cu_two_codes<4>(wb >> 12, magic)};
				cu_mma_bf16(c, f1, bx.z, bx.w);
			}
			float2 sa = sc[p * 16 + g], sb = sc[p * 16 + g + 8];
			float da = sa.x * wt, oa = sa.y * wt, db = sb.x * wt, ob = sb.y * wt;
			acc[0] = fmaf(oa, xs0[p], fmaf(da, c[0], acc[0]));
			acc[2] = fmaf(ob, xs0[p], fmaf(db, c[2], acc[2]));
			if (COLS > 1) {
				acc[1] = fmaf(oa, xs1[p], fmaf(da, c[1], acc[1]));
				acc[3] = fmaf(ob, xs1[p], fmaf(db, c[3], acc[3]));
			}
		}
	}
};

/*
 * 8-bit codes (Q8_0, MLX8; cu_k8_mma): a byte q' (Q8_0: q + 128, its top bit flipped in the
 * LOP3 that takes it) is 16 hi + lo, two 4-bit codes made as Q4_K's are; the mma sums x * (128
 * + lo) and x * (128 + hi) into two accumulators, and x * q' = 16 C_hi + C_lo - 2176 sum(x). A
 * unit is 128 elements (EL), four 32-byte runs of a row, so that a lane holds what it holds of
 * Q4_K's 256: bytes 8t..8t+7 of each run (cu_k4_tile_codes), word w giving the k values 2t, 2t+1,
 * 2t+8, 2t+9 as elements 8t + 4w + 0, 2, 1, 3 (Q4_K's staged order). sc[group][16] float2 (scale
 * s, offset o): a group of SUB elements adds 16 s C_hi + s C_lo + o sum(x).
 */
/* ((v ^ c) & 0x000f000f) | (c & ~0x000f000f): bits 0-3 and 16-19 of v (xor c's there) in c's others */
__device__ __forceinline__ unsigned cu_nib_codes(uint32_t v, uint32_t c)
{
	unsigned r;
	asm("lop3.b32 %0, %1, %3, %2, 0x6a;" : "=r"(r) : "r"(v), "r"(c), "n"(0x000f000f));
	return r;
}

template <int COLS, int SUB, bool FLIP>
__device__ __forceinline__ void cu_k8_mma(float *acc, const uint2 *A, const uint2 *B, const void *vsc, const bf16 *x,
					  const float *xs0, const float *xs1, float wt, int g, int t)
{
	const float2 *sc = (const float2 *)vsc;
	uint32_t lo = CU_K4_MAGIC, hi = CU_K4_MAGIC ^ (FLIP ? 0x00080008u : 0u);
	asm("" : "+r"(lo), "+r"(hi));
#pragma unroll
	for (int q = 0; q < 128 / SUB; q++) {
		float cl[4] = {0.0f, 0.0f, 0.0f, 0.0f}, ch[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
		for (int p = q * (SUB / 32); p < (q + 1) * (SUB / 32); p++) {
			uint4 bx = *(const uint4 *)(x + 32 * p + 8 * t); /* both k-steps' B */
#pragma unroll
			for (int w = 0; w < 2; w++) {
				uint32_t wa = w ? A[p].y : A[p].x, wb = w ? B[p].y : B[p].x;
				unsigned fl[4] = {cu_nib_codes(wa, lo), cu_nib_codes(wb, lo), cu_nib_codes(wa >> 8, lo),
						  cu_nib_codes(wb >> 8, lo)};
				unsigned fh[4] = {cu_nib_codes(wa >> 4, hi), cu_nib_codes(wb >> 4, hi), cu_nib_codes(wa >> 12, hi),
						  cu_nib_codes(wb >> 12, hi)};
				cu_mma_bf16(cl, fl, w ? bx.z : bx.x, w ? bx.w : bx.y);
				cu_mma_bf16(ch, fh, w ? bx.z : bx.x, w ? bx.w : bx.y);
			}
		}
		float2 sa = sc[q * 16 + g], sb = sc[q * 16 + g + 8];
		float da = sa.x * wt, oa = sa.y * wt, db = sb.x * wt, ob = sb.y * wt;
		acc[0] = fmaf(16.0f * da, ch[0], fmaf(da, cl[0], fmaf(oa, xs0[q], acc[0])));
		acc[2] = fmaf(16.0f * db, ch[2], fmaf(db, cl[2], fmaf(ob, xs0[q], acc[2])));
		if (COLS > 1) {
			acc[1] = fmaf(16.0f * da, ch[1], fmaf(da, cl[1], fmaf(oa, xs1[q], acc[1])));
			acc[3] = fmaf(16.0f * db, ch[3], fmaf(db, cl[3], fmaf(ob, xs1[q], acc[3])));
		}
	}
}

/* Q8_0 (tiled): a run is a block (the 16 rows' d's of a block together); value d q */
template <>
struct cu_kq<TOAST_DT_Q8_0> {
	static constexpr int EL = 128, SUB = 32;
	static constexpr bool PAIR4 = false;
	struct ld {
		uint2 a[4], b[4];
		uint32_t d; /* the d of blocks 2 (lane / 16), +1 of the unit, of the decode row (f16 bits) */
	};
	static __device__ __forceinline__ ld load(const cu_wd &, const cu_krows &p, int u, int lane)
	{
		ld L;
		cu_k4_tile_codes(L.a, L.b, p.a + 2048 * u);
		const uint8_t *h = p.h + 32 * (4 * u + 2 * (lane >> 4));
		L.d = (uint32_t)__ldg((const unsigned short *)h) | (uint32_t)__ldg((const unsigned short *)(h + 32)) << 16;
		return L;
	}
	static __device__ __forceinline__ void scales(const cu_wd &, const ld &L, void *vsc, int lane)
	{
		float2 *sc = (float2 *)vsc;
#pragma unroll
		for (int i = 0; i < 2; i++) {
			float d = cu_f16_float(L.d >> (16 * i));
			sc[(2 * (lane >> 4) + i) * 16 + (lane & 15)] = make_float2(d, -2304.0f * d);
		}
	}
	template <int COLS>
	static __device__ __forceinline__ void mma(float *acc, const ld &L, const void *vsc, const bf16 *x, const float *xs0,
						   const float *xs1, float wt, int g, int t)
	{
		cu_k8_mma<COLS, SUB, true>(acc, L.a, L.b, vsc, x, xs0, xs1, wt, g, t);
	}
};

/* MLX8 (groups of 64k): a group's chunk of 64 elements is two runs; value s q + z */
template <>
struct cu_kq<TOAST_DT_MLX8> {
	static constexpr int EL = 128, SUB = 64;
	static constexpr bool PAIR4 = false;
	struct ld {
		uint2 a[4], b[4];
		uint32_t s, z; /* scale and bias bits, as stored, of the decode row's chunk lane / 16 */
	};
	static __device__ __forceinline__ ld load(const cu_wd &W, const cu_krows &p, int u, int lane)
	{
		ld L;
		cu_k4_tile_codes(L.a, L.b, p.a + 2048 * u);
		int c = 2 * u + (lane >> 4), per = W.gs >> 6, grp = 16 * (per == 1 ? c : c / per); /* (tiled) */
		L.s = cu_ldsb_bits(p.h, W.sb_type, grp);
		L.z = cu_ldsb_bits(p.h + (W.b_off - W.m_off), W.sb_type, grp);
		return L;
	}
	static __device__ __forceinline__ void scales(const cu_wd &W, const ld &L, void *vsc, int lane)
	{
		float s = cu_sb_float(L.s, W.sb_type), z = cu_sb_float(L.z, W.sb_type);
		((float2 *)vsc)[(lane >> 4) * 16 + (lane & 15)] = make_float2(s, fmaf(-2176.0f, s, z));
	}
	template <int COLS>
	static __device__ __forceinline__ void mma(float *acc, const ld &L, const void *vsc, const bf16 *x, const float *xs0,
						   const float *xs1, float wt, int g, int t)
	{
		cu_k8_mma<COLS, SUB, false>(acc, L.a, L.b, vsc, x, xs0, xs1, wt, g, t);
	}
};

/* elements 8j..8j+7 of an input row, v (f32), to bf16 in TYPE's staged order at xs + 8j, and
 * the sum of the SUB / 8 lanes' rounded values to *sum from the first of them (lanes
 * (SUB / 8) i.. must stage the 8-groups (SUB / 8) i'.. together) */
template <int TYPE>
__device__ __forceinline__ void cu_kq_stage8(const float *v, bf16 *xs, int j, float *sum)
{
	constexpr int SUB = cu_kq<TYPE>::SUB;
	constexpr bool P4 = cu_kq<TYPE>::PAIR4;
	__nv_bfloat162 p[4];
#pragma unroll
	for (int i = 0; i < 4; i++) {
		int lo = P4 ? i : (i & 1) + 4 * (i >> 1);
		p[i] = __floats2bfloat162_rn(v[lo], v[lo + (P4 ? 4 : 2)]);
	}
	*(uint4 *)(xs + 8 * j) = *(const uint4 *)p;
	float s = 0;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		float2 f = __bfloat1622float2(p[i]);
		s += f.x + f.y;
	}
#pragma unroll
	for (int m = 1; m < SUB / 8; m *= 2)
		s += __shfl_xor_sync(0xffffffffu, s, m);
	if ((threadIdx.x & (SUB / 8 - 1)) == 0)
		*sum = s;
}
#endif

/* whether decode kernels may take w on tensor cores (cu_kq): MLX needs groups of 64k */
static inline bool cu_kq_fits(const cu_wd &w)
{
	return w.type == TOAST_DT_Q4_K || w.type == TOAST_DT_Q5_K || w.type == TOAST_DT_Q6_K ||
	       (w.type == TOAST_DT_Q8_0 && w.tiled) || (cu_is_mlx(w.type) && w.gs % 64 == 0 && w.tiled);
}

/* fn(std::integral_constant<int, T>()) for the type T (a runtime type) when it has a cu_kq kind,
 * its result; false for the other types: a tensor-core launch's template argument */
template <typename Fn>
static bool cu_with_kq(int type, Fn fn)
{
	switch (type) {
	case TOAST_DT_Q4_K: return fn(std::integral_constant<int, TOAST_DT_Q4_K>());
	case TOAST_DT_Q5_K: return fn(std::integral_constant<int, TOAST_DT_Q5_K>());
	case TOAST_DT_Q6_K: return fn(std::integral_constant<int, TOAST_DT_Q6_K>());
	case TOAST_DT_Q8_0: return fn(std::integral_constant<int, TOAST_DT_Q8_0>());
	case TOAST_DT_MLX4: return fn(std::integral_constant<int, TOAST_DT_MLX4>());
	case TOAST_DT_MLX8: return fn(std::integral_constant<int, TOAST_DT_MLX8>());
	default: return false;
	}
}

/* ---- k_quant.cu ---- */

/* Write the data (host, file layout) of w[0, count) into dst + i * stride in the device layout l.
 * With count > 1 each weight's planes follow the one's before in memory (cu_q_follows), as the
 * experts of a GGUF or MLX tensor do, and are copied many at a time. */
enum toast_status cu_q_upload(struct cuda_backend *cb, void *dst, size_t stride, const struct toast_weight *w, int count,
			      const cu_layout &l, struct toast_error *err);
/* whether b's planes lie right after a's (both of layout l) */
bool cu_q_follows(const struct toast_weight *a, const struct toast_weight *b, const cu_layout &l);
/* Fill dst with the synthetic weight w (backend/synth_quant.h) in the device layout l. */
void cu_q_fill_synthetic(struct cuda_backend *cb, void *dst, const struct toast_weight *w, const cu_layout &l);
/* Rows [r0, r0 + n) of matrix e of w, dequantised to bf16 [n][n_in] in out; lo (if not NULL)
 * gets what bf16 rounded off (value - out, in bf16), so that out + lo holds ~16 bits. */
void cu_q_dequant_bf16(struct cuda_backend *cb, const cu_wd &w, size_t e, int64_t r0, int64_t n, int64_t n_in,
		       bf16 *out, bf16 *lo);
/* The largest |value| of the n_out rows of w (bf16 or quantised; one matrix) into *amax. */
void cu_q_amax(struct cuda_backend *cb, const cu_wd &w, int64_t n_out, int64_t n_in, float *amax);
/* Rows [r0, r0 + n) of w as fp16 [n][n_in] in out, times the power of two s that puts *amax in
 * [2^14, 2^15); f16_slots[CU_F16_ALPHA] = 1 / (s * f16_slots[CU_F16_SX]), the GEMM's alpha for an
 * input scaled by f16_slots[CU_F16_SX] (cu_norm_rows, cu_f16_rows). */
void cu_q_dequant_f16(struct cuda_backend *cb, const cu_wd &w, int64_t r0, int64_t n, int64_t n_in, __half *out,
		      const float *amax);

#endif
