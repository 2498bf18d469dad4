/*
 * k_matmul.cu - products of one input with up to TOAST_MM_MAX_OUT weight matrices (bf16 or
 * packed quantised types), f32 accumulation (contract: toast_mm_in / toast_mm_out in backend.h).
 *
 * Decode-sized T (<= CU_GEMV_MAX_T): one GEMV launch per weight type among the outputs. Each
 * block stages the input in shared memory as f32 (computing the RMSNorm there when the input is
 * a normed residual, so the norm costs no launch and no rounding), then each warp streams one or
 * four weight rows in 16-byte chunks, dequantising quantised ones in registers (cu_quant.cuh);
 * tiled quantised types (all but Q4_0, Q4_1) go to tensor cores (k_gemv_k4). Larger T: the
 * normed input is written once in bf16 and each output is a cuBLAS GEMM on tensor cores; a
 * quantised weight is first dequantised to bf16 in pieces of CU_DEQUANT_PIECE bytes. A dense
 * MLP's gate and up (TOAST_MM_GLU) at decode: one GEMV launch whose warps (or blocks, on tensor
 * cores) take the same rows of both and store SiLU(gate) * up; at other sizes their two
 * products, then that.
 */
#include "backend/cuda/cu_quant.cuh"

#define GEMV_WARPS 8

struct gemv_job {
	void *out;
	cu_wd W;
	int mode;
	int64_t n_out;
	int64_t first_block; /* blocks before this job's */
	cu_wd W2;            /* TOAST_MM_GLU (the only job): the up matrix */
};

struct gemv_args {
	struct gemv_job job[TOAST_MM_MAX_OUT];
	int n_jobs;
	int nt;                /* tokens (the kernel's T may be larger: rows nt..T-1 are zero) */
	int64_t n_in;
	const bf16 *act;       /* input rows, or */
	const float *xf;       /* f32 input rows (tensor cores round them to bf16 unless xf_exact), or NULL: */
	bool xf_exact;
	const float *norm_x;   /* RMSNorm(norm_x) with norm_w */
	const float *norm_w;
	float eps;
	int plus_one;
	bf16 *norm_out;        /* written by block 0 when set */
	const char *pf;        /* toast_mm_in.prefetch: k_gemv_k4's blocks ask L2 for a share each */
	size_t pf_bytes;
};

/* a dense MLP's act value from its gate and up products (as cu_swiglu rounds it) */
__device__ __forceinline__ void gemv_store_glu(void *out, int64_t n_out, int t, int64_t r, float g, float u)
{
	((bf16 *)out)[t * n_out + r] = cu_swiglu1(g, u);
}

__device__ __forceinline__ void gemv_store(void *out, int mode, int64_t n_out, int t, int64_t r, float v)
{
	if (mode == TOAST_MM_ACT)
		((bf16 *)out)[t * n_out + r] = __float2bfloat16(v);
	else if (mode == TOAST_MM_F32)
		((float *)out)[t * n_out + r] = v;
	else
		((float *)out)[t * n_out + r] += v;
}

/* stage the T input rows in shared memory as f32: xs[t][n_in], element i at cu_qpos<TYPE>(i) */
template <int TYPE, int T>
__device__ __forceinline__ void gemv_stage(const gemv_args &a, float *xs)
{
	__shared__ float red[32];
	int64_t n = a.n_in;
	for (int t = 0; t < T; t++) {
		float *row = xs + t * n;
		if (t < a.nt && a.act && (n & 7) == 0 && ((uintptr_t)a.act & 15) == 0) { /* 8 bf16 at a time */
			const uint4 *src = (const uint4 *)(a.act + t * n);
			for (int i = threadIdx.x; i < (int)(n >> 3); i += blockDim.x) {
				float f[8];
				cu_bf16x8(src[i], f);
				((float4 *)row)[qk<TYPE>::swz(2 * i)] = make_float4(f[0], f[1], f[2], f[3]);
				((float4 *)row)[qk<TYPE>::swz(2 * i + 1)] = make_float4(f[4], f[5], f[6], f[7]);
			}
			continue;
		}
		if (t < a.nt && a.xf && (n & 3) == 0 && ((uintptr_t)a.xf & 15) == 0) { /* a float4 at a time */
			const float4 *src = (const float4 *)(a.xf + t * n);
			for (int i = threadIdx.x; i < (int)(n >> 2); i += blockDim.x)
				((float4 *)row)[qk<TYPE>::swz(i)] = src[i];
			continue;
		}
		if (t >= a.nt || a.act || a.xf) {
			for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
				row[cu_qpos<TYPE>(i)] = t >= a.nt ? 0.0f : a.act ? __bfloat162float(a.act[t * n + i]) : a.xf[t * n + i];
			continue;
		}
		cu_stage_norm<TYPE>(a.norm_x + t * n, a.norm_w, n, a.eps, a.plus_one, row, red, NULL,
				    a.norm_out && blockIdx.x == 0 ? a.norm_out + t * n : NULL);
	}
	__syncthreads();
}

/*
 * ROWS weight rows per warp, each lane streaming chunks (qk<TYPE>: 16 packed bytes and their
 * scales) of all of them before using any; each input float4 is read once per position and
 * used for every row. The first B chunks of each row are loaded before the input is staged, so
 * their DRAM latency hides behind the staging (and the norm); each chunk's slot is refilled as
 * soon as it is used. Requires n_in % EPC == 0 and 16-byte aligned rows. GLU: the warp's rows are
 * ROWS / 2 rows of the gate and the same rows of the up matrix, stored as SiLU(gate) * up.
 */
template <int TYPE, int T, int ROWS, bool GLU = false>
__global__ void __launch_bounds__(GEMV_WARPS * 32) k_gemv(gemv_args a)
{
	typedef qk<TYPE> Q;
	const int OUT_ROWS = GLU ? ROWS / 2 : ROWS, GEMV_BLOCK_ROWS = GEMV_WARPS * OUT_ROWS;
	const int B = T <= 2 ? 2 : 1; /* chunks in flight per row and lane */
	extern __shared__ float xs[];
	int j = 0;
	while (j + 1 < a.n_jobs && blockIdx.x >= a.job[j + 1].first_block)
		j++;
	const gemv_job &jb = a.job[j];
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int64_t r0 = (blockIdx.x - jb.first_block) * GEMV_BLOCK_ROWS + warp * OUT_ROWS;
	bool live = r0 < jb.n_out;
	int64_t n_in = a.n_in;
	int nc = (int)(n_in / Q::EPC);
	/* row r of the warp: its matrix and its row there */
	auto wd = [&](int r) -> const cu_wd & { return GLU && r >= OUT_ROWS ? jb.W2 : jb.W; };
	auto row = [&](int r) { return r0 + (GLU ? r % OUT_ROWS : r); };
	cu_wrow w[ROWS];
#pragma unroll
	for (int r = 0; r < ROWS; r++)
		w[r] = cu_row(wd(r), 0, min(row(r), jb.n_out - 1));
	typename Q::chunk k[B][ROWS];
	if (live)
#pragma unroll
		for (int b = 0; b < B; b++)
			if (lane + 32 * b < nc)
#pragma unroll
				for (int r = 0; r < ROWS; r++)
					k[b][r] = cu_qload<TYPE>(wd(r), w[r], 0, row(r), lane + 32 * b);
	cu_pdl_wait();
	gemv_stage<TYPE, T>(a, xs);
	if (!live)
		return;
	float acc[ROWS][T];
#pragma unroll
	for (int r = 0; r < ROWS; r++)
#pragma unroll
		for (int t = 0; t < T; t++)
			acc[r][t] = 0.0f;
	for (int c0 = lane; c0 < nc; c0 += 32 * B) {
#pragma unroll
		for (int b = 0; b < B; b++) {
			int c = c0 + 32 * b;
			if (c >= nc)
				break;
			typename Q::info in[ROWS];
#pragma unroll
			for (int r = 0; r < ROWS; r++)
				in[r] = Q::prep(k[b][r], c);
#pragma unroll
			for (int i = 0; i < Q::NP; i++) {
				int f = Q::swz(Q::f4(c, i));
				float4 xv[T];
#pragma unroll
				for (int t = 0; t < T; t++)
					xv[t] = ((const float4 *)(xs + t * n_in))[f];
#pragma unroll
				for (int r = 0; r < ROWS; r++) {
					float4 y = Q::deq4(k[b][r], in[r], c, i);
#pragma unroll
					for (int t = 0; t < T; t++)
						acc[r][t] += y.x * xv[t].x + y.y * xv[t].y + y.z * xv[t].z + y.w * xv[t].w;
				}
			}
			if (c + 32 * B < nc)
#pragma unroll
				for (int r = 0; r < ROWS; r++)
					k[b][r] = cu_qload<TYPE>(wd(r), w[r], 0, row(r), c + 32 * B);
		}
	}
	cu_pdl_trigger();
#pragma unroll
	for (int r = 0; r < ROWS; r++)
#pragma unroll
		for (int t = 0; t < T; t++)
			acc[r][t] = cu_warp_sum(acc[r][t]);
	if (lane == 0)
#pragma unroll
		for (int r = 0; r < OUT_ROWS; r++)
			if (r0 + r < jb.n_out)
#pragma unroll
				for (int t = 0; t < T; t++)
					if (t < a.nt) {
						if constexpr (GLU)
							gemv_store_glu(jb.out, jb.n_out, t, r0 + r, acc[r][t], acc[r + OUT_ROWS][t]);
						else
							gemv_store(jb.out, jb.mode, jb.n_out, t, r0 + r, acc[r][t]);
					}
}

/*
 * cu_kq types on tensor cores (tiled weights of all but Q4_0 and Q4_1: gemv_launch_any): a block of
 * GQ_WARPS warps takes rt consecutive tiles of 16 rows (rt chosen so the grid is one wave of
 * resident blocks: a block that ends and a new one that starts pay the load latency and the
 * staging again); warp w takes units (superblocks; 128 elements of 8-bit types) w, w + 8, .. of
 * each tile, two in flight (the first two loaded before the wait); the tiles' partial sums meet
 * in shared memory at the end. The input is staged once a block in bf16 (the activation type:
 * the values the prefill GEMMs take) with its sub-block sums. T: 1, 2, 4 or 8 (columns nt.. zeros).
 * Two blocks an SM: at three (80 registers) the two superblocks in flight spilled, and the
 * spills' local traffic shared the L1 with the loads that bound this kernel.
 */
#define GQ_WARPS 8
#define GQ_MAX_RT 48 /* tiles a block (T = 1; T > 1: 32 / T, 16 KB of partial sums) */

/* shared memory: input rows [T][n_in + pad] bf16, sub-block sums [T][n_in / sub], scales
 * [GQ_WARPS] x 1 KB, partial sums [rt][GQ_WARPS][16][T] */
static size_t gq_smem(int T, int64_t n_in, int rt, int sub)
{
	return (size_t)T * ((size_t)n_in + (T > 1 ? 32 : 0)) * 2 + (size_t)T * (n_in / sub) * 4 + GQ_WARPS * 64 * 16 +
	       (size_t)rt * GQ_WARPS * 16 * T * 4;
}

template <int T, int TYPE, bool GLU = false>
__global__ void __launch_bounds__(GQ_WARPS * 32, 2) k_gemv_k4(gemv_args a, int rt, int one_wave)
{
	typedef cu_kq<TYPE> K;
	constexpr int SUB = K::SUB;
	extern __shared__ __align__(16) unsigned char gq_sm[];
	__shared__ float red[GQ_WARPS * 8]; /* (cu_block_sum's 32, or the warps' sums of T norms) */
	int j = 0;
	while (j + 1 < a.n_jobs && blockIdx.x >= a.job[j + 1].first_block)
		j++;
	const gemv_job &jb = a.job[j];
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
	/* GLU: tile 2i is the gate's tile i, 2i + 1 the up matrix's (rt is even: a block has both) */
	int64_t n_in = a.n_in, tile0 = (blockIdx.x - jb.first_block) * rt, tiles = (jb.n_out + 15) / 16 * (GLU ? 2 : 1);
	int ntile = (int)min((int64_t)rt, tiles - tile0);
	/* rows 64 bytes apart at T = 8: a B fragment's 8 columns in 2 wavefronts */
	int nsb = (int)(n_in / K::EL), xstride = (int)(n_in + (T > 1 ? 32 : 0)), nsub = (int)(n_in / SUB);
	bf16 *xs = (bf16 *)gq_sm;
	float *xsum = (float *)(xs + T * xstride);
	void *sc = (float4 *)(xsum + T * nsub) + warp * 64;
	float *part = (float *)((float4 *)(xsum + T * nsub) + GQ_WARPS * 64);
	/* the warp's units: unit i is tile i / m, superblock warp + GQ_WARPS * (i % m), kept as
	 * counters (a division a unit was ~30 of its ~400 instructions) */
	int m = warp < nsb ? (nsb - warp + GQ_WARPS - 1) / GQ_WARPS : 0, units = ntile * m;
	auto next = [&](int &tl, int &k) {
		if (++k == m)
			k = 0, tl++;
	};
	int lt = 0, lk = 0; /* the next unit to load */
	auto load = [&]() {
		int64_t vt = tile0 + lt, r0 = (GLU ? vt >> 1 : vt) * 16;
		const cu_wd &W = GLU && (vt & 1) ? jb.W2 : jb.W;
		typename K::ld L = K::load(W, cu_krows_of<TYPE>(W, 0, r0, lane), warp + GQ_WARPS * lk, lane);
		next(lt, lk);
		return L;
	};
	typename K::ld L[2];
	if (units > 0)
		L[0] = load();
	if (units > 1)
		L[1] = load();
	if (a.pf && threadIdx.x == 0) { /* the block's share of what the next kernel reads first */
		size_t per = (a.pf_bytes / gridDim.x + 255) & ~(size_t)255, off = blockIdx.x * per;
		if (off < a.pf_bytes)
			cu_prefetch_l2(a.pf + off, (unsigned)(min(per, a.pf_bytes - off) & ~(size_t)15));
	}
	cu_pdl_wait();
	/* the input rows: RMSNorm(norm_x), act or xf, in bf16, 8 elements a thread */
	float p1 = a.plus_one ? 1.0f : 0.0f;
	int n8 = (int)(n_in / 8), tot = T * n8;
	/* group i (8 elements of column i / n8): raw x (and the norm's w) or act, then staged */
	auto load_in = [&](int i, float *v, float *w) {
		int c = i / n8, q = i - c * n8;
		if (c >= a.nt)
			return;
		if (a.act) {
			cu_bf16x8(((const uint4 *)(a.act + c * n_in))[q], v);
			return;
		}
		if (a.xf) {
			const float4 *x4 = (const float4 *)(a.xf + c * n_in) + 2 * q;
			float4 x0 = x4[0], x1 = x4[1];
			v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w, v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
			return;
		}
		const float4 *x4 = (const float4 *)(a.norm_x + c * n_in) + 2 * q, *w4 = (const float4 *)a.norm_w + 2 * q;
		float4 x0 = x4[0], x1 = x4[1], w0 = w4[0], w1 = w4[1];
		v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w, v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
		w[0] = w0.x, w[1] = w0.y, w[2] = w0.z, w[3] = w0.w, w[4] = w1.x, w[5] = w1.y, w[6] = w1.z, w[7] = w1.w;
	};
	auto stage_in = [&](int i, float *v, const float *w, float r) {
		int c = i / n8, q = i - c * n8;
		if (a.norm_x && c < a.nt) {
#pragma unroll
			for (int e = 0; e < 8; e++)
				v[e] = v[e] * r * (p1 + w[e]);
			if (a.norm_out && blockIdx.x == 0) {
				__nv_bfloat162 *o = (__nv_bfloat162 *)(a.norm_out + c * n_in + 8 * q);
#pragma unroll
				for (int e = 0; e < 4; e++)
					o[e] = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
			}
		}
		cu_kq_stage8<TYPE>(v, xs + c * xstride, q, xsum + c * nsub + q / (SUB / 8)); /* whole warps: n8 % 32 == 0 */
	};
	if (T == 1 && tot <= 2 * (int)blockDim.x) {
		/* one token, two groups a thread at most: x and w read once, the norm from registers */
		float v[2][8] = {}, w[2][8], ss = 0;
#pragma unroll
		for (int k = 0; k < 2; k++) {
			int i = threadIdx.x + k * blockDim.x;
			if (i < tot) {
				load_in(i, v[k], w[k]);
#pragma unroll
				for (int e = 0; e < 8; e++)
					ss += v[k][e] * v[k][e];
			}
		}
		float r = a.norm_x ? rsqrtf(cu_block_sum(ss, red) / n_in + a.eps) : 0.0f;
#pragma unroll
		for (int k = 0; k < 2; k++)
			if (threadIdx.x + k * blockDim.x < tot)
				stage_in(threadIdx.x + k * blockDim.x, v[k], w[k], r);
	} else {
		float rs[T] = {}; /* every column's norm in one reduction */
		if (T == 1 && a.norm_x)
			rs[0] = cu_rms4(a.norm_x, n_in, a.eps, red);
		else if (a.norm_x) {
			float ss[T] = {};
			for (int i = threadIdx.x; i < (int)(n_in >> 2); i += blockDim.x)
#pragma unroll
				for (int c = 0; c < T; c++)
					if (c < a.nt) {
						float4 v = ((const float4 *)(a.norm_x + c * n_in))[i];
						ss[c] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
					}
#pragma unroll
			for (int c = 0; c < T; c++)
				ss[c] = cu_warp_sum(ss[c]);
			if (lane == 0)
#pragma unroll
				for (int c = 0; c < T; c++)
					red[warp * T + c] = ss[c];
			__syncthreads();
#pragma unroll
			for (int c = 0; c < T; c++) {
				float v = 0;
				for (int w = 0; w < GQ_WARPS; w++)
					v += red[w * T + c];
				rs[c] = rsqrtf(v / n_in + a.eps);
			}
		}
		for (int i0 = threadIdx.x; i0 < tot; i0 += 2 * blockDim.x) {
			float v[2][8] = {}, w[2][8]; /* two groups' loads before either's stores */
#pragma unroll
			for (int k = 0; k < 2; k++)
				if (i0 + k * (int)blockDim.x < tot)
					load_in(i0 + k * blockDim.x, v[k], w[k]);
#pragma unroll
			for (int k = 0; k < 2; k++) {
				int i = i0 + k * blockDim.x;
				if (i < tot)
					stage_in(i, v[k], w[k], rs[i / n8]);
			}
		}
	}
	__syncthreads();
	cu_tl_mark(0); /* input staged */
	if (one_wave) /* the next kernel's blocks take no room this grid still needs */
		cu_pdl_trigger();
	/* the lane's B column g and C columns 2t, 2t + 1, those past T read row 0 (not stored) */
	const bf16 *xg = xs + (g & (T - 1)) * xstride;
	const float *xs0 = xsum + (2 * t & (T - 1)) * nsub, *xs1 = xsum + ((2 * t + 1) & (T - 1)) * nsub;
	float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
	int ct = 0, ck = 0; /* unit i's tile and superblock */
	for (int i0 = 0; i0 < units; i0 += 2) {
#pragma unroll
		for (int k = 0; k < 2; k++) {
			int i = i0 + k;
			if (i >= units)
				break;
			int sb = warp + GQ_WARPS * ck;
			__syncwarp();
			K::scales(jb.W, L[k], sc, lane);
			__syncwarp();
			K::template mma<T>(acc, L[k], sc, xg + sb * K::EL, xs0 + sb * (K::EL / SUB), xs1 + sb * (K::EL / SUB), 1.0f, g, t);
			if (i + 2 < units)
				L[k] = load();
			if (ck == m - 1) { /* the tile's last superblock of this warp */
				float *pp = part + (ct * GQ_WARPS + warp) * 16 * T;
				if (2 * t < T) {
					pp[g * T + (T > 1 ? 2 * t : 0)] = acc[0];
					pp[(g + 8) * T + (T > 1 ? 2 * t : 0)] = acc[2];
				}
				if (T > 1 && 2 * t < T) {
					pp[g * T + 2 * t + 1] = acc[1];
					pp[(g + 8) * T + 2 * t + 1] = acc[3];
				}
				acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
			}
			next(ct, ck);
		}
	}
	cu_tl_mark(1); /* warp 0's MMAs */
	if (!one_wave)
		cu_pdl_trigger();
	__syncthreads();
	cu_tl_mark(2); /* every warp's */
	/* the warps' partial sums of each tile (GLU: of each pair, the gate's tile and the up matrix's) */
	const int TW = GLU ? 2 : 1;
	int nw = min(nsb, GQ_WARPS);
	for (int q = threadIdx.x; q < ntile / TW * 16 * T; q += blockDim.x) {
		int p = q / (16 * T), rc = q - p * 16 * T, c = rc % T;
		int64_t row = ((GLU ? tile0 >> 1 : tile0) + p) * 16 + rc / T;
		float v[TW] = {};
		for (int w = 0; w < nw; w++)
#pragma unroll
			for (int s = 0; s < TW; s++)
				v[s] += part[((TW * p + s) * GQ_WARPS + w) * 16 * T + rc];
		if (c < a.nt && row < jb.n_out) {
			if constexpr (GLU)
				gemv_store_glu(jb.out, jb.n_out, c, row, v[0], v[1]);
			else
				gemv_store(jb.out, jb.mode, jb.n_out, c, row, v[0]);
		}
	}
}

/* any shape and weight type: one warp per (row, token), input from global (act bf16 or f32);
 * plain types element by element, quantised ones 8 at a time */
__global__ void k_gemv_plain(void *out, int mode, const bf16 *x, const float *xf, cu_wd W, int64_t n_out, int64_t n_in)
{
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp;
	int t = blockIdx.y;
	if (r >= n_out)
		return;
	float acc = 0;
	if (W.type == TOAST_DT_F32 || W.type == TOAST_DT_BF16) {
		for (int64_t i = lane; i < n_in; i += 32)
			acc += cu_ldw(W.base, W.type, r * n_in + i) * (xf ? xf[t * n_in + i] : __bfloat162float(x[t * n_in + i]));
	} else {
		for (int64_t i = 8 * lane; i < n_in; i += 256) {
			float y[8];
			cu_dq8(W, 0, r, i, y);
			for (int q = 0; q < 8; q++)
				acc += y[q] * (xf ? xf[t * n_in + i + q] : __bfloat162float(x[t * n_in + i + q]));
		}
	}
	acc = cu_warp_sum(acc);
	if (lane == 0)
		gemv_store(out, mode, n_out, t, r, acc);
}

/* y = RMSNorm(x) rows, to f32, bf16 and/or scaled fp16 (cu_norm_rows) */
__global__ void k_norm_rows(const float *x, const float *w, int64_t n, float eps, int plus_one, float *yf, bf16 *yb,
			    bf16 *ylo, __half *yh, float *slots)
{
	__shared__ float red[32];
	const float *xr = x + blockIdx.x * n;
	float p1 = plus_one ? 1.0f : 0.0f, s = 1.0f;
	if (yh) { /* |x_i| / rms(x) <= sqrt(n): |y_i| <= sqrt(n) max|p1 + w| */
		float m = 0;
		for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
			m = fmaxf(m, fabsf(p1 + w[i]));
		s = cu_f16_scale(sqrtf((float)n) * cu_block_max(m, red));
		if (blockIdx.x == 0 && threadIdx.x == 0)
			slots[CU_F16_SX] = s;
	}
	if ((n & 3) == 0 && (((uintptr_t)x | (uintptr_t)w | (uintptr_t)yf) & 15) == 0 &&
	    (((uintptr_t)yb | (uintptr_t)ylo | (uintptr_t)yh) & 3) == 0) { /* a float4 at a time */
		int n4 = (int)(n >> 2);
		float r = cu_rms4(xr, n, eps, red);
		size_t o = (size_t)blockIdx.x * n4;
		for (int i = threadIdx.x; i < n4; i += blockDim.x) {
			float4 v = cu_norm4(xr, w, i, r, p1);
			float y[4] = {v.x, v.y, v.z, v.w};
			if (yf)
				((float4 *)yf)[o + i] = v;
			__nv_bfloat162 hi[2] = {__floats2bfloat162_rn(y[0], y[1]), __floats2bfloat162_rn(y[2], y[3])};
			if (yb)
				((__nv_bfloat162 *)yb)[2 * (o + i)] = hi[0], ((__nv_bfloat162 *)yb)[2 * (o + i) + 1] = hi[1];
			if (ylo)
				for (int h = 0; h < 2; h++) {
					float2 f = __bfloat1622float2(hi[h]);
					((__nv_bfloat162 *)ylo)[2 * (o + i) + h] = __floats2bfloat162_rn(y[2 * h] - f.x, y[2 * h + 1] - f.y);
				}
			if (yh)
				for (int h = 0; h < 2; h++)
					((__half2 *)yh)[2 * (o + i) + h] = __floats2half2_rn(y[2 * h] * s, y[2 * h + 1] * s);
		}
		return;
	}
	float r = cu_rms(xr, n, eps, red);
	for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
		float y = xr[i] * r * (p1 + w[i]);
		if (yf)
			yf[blockIdx.x * n + i] = y;
		bf16 hi = __float2bfloat16(y);
		if (yb)
			yb[blockIdx.x * n + i] = hi;
		if (ylo)
			ylo[blockIdx.x * n + i] = __float2bfloat16(y - __bfloat162float(hi));
		if (yh)
			yh[blockIdx.x * n + i] = __float2half_rn(y * s);
	}
}

/* the largest |x[i]| into *amax (f32 bits; zero it first) */
__global__ void k_f32_amax(const float *x, size_t n, unsigned *amax)
{
	float m = 0;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		m = fmaxf(m, fabsf(x[i]));
	cu_amax_add(m, amax);
}

__global__ void k_f32_to_f16(const float *x, size_t n, __half *yh, bf16 *yb, float *slots)
{
	float s = cu_f16_scale(slots[CU_F16_XMAX]); /* (not read when yh is NULL) */
	if (yh && blockIdx.x == 0 && threadIdx.x == 0)
		slots[CU_F16_SX] = s;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		if (yh)
			yh[i] = __float2half_rn(x[i] * s);
		if (yb)
			yb[i] = __float2bfloat16(x[i]);
	}
}

void cu_f16_rows(struct cuda_backend *cb, const float *x, size_t n, __half *yh, bf16 *yb)
{
	unsigned blocks = cu_blocks(n, 256), cap = (unsigned)cb->n_sm * 16;
	blocks = blocks < cap ? blocks : cap;
	if (yh) {
		cu_fail(cb, cudaMemsetAsync(cb->f16_slots + CU_F16_XMAX, 0, sizeof(float), cb->stream), "input maximum");
		cu_launch(cb, k_f32_amax, blocks, 256, 0, x, n, (unsigned *)(cb->f16_slots + CU_F16_XMAX));
	}
	cu_launch(cb, k_f32_to_f16, blocks, 256, 0, x, n, yh, yb, cb->f16_slots);
	cu_launched(cb, "f32 rows to fp16");
}

void cu_norm_rows(struct cuda_backend *cb, const float *x, const struct toast_weight *w, int T, int64_t n, float eps,
		  bool plus_one, float *yf, bf16 *yb, bf16 *ylo, __half *yh)
{
	cu_launch(cb, k_norm_rows, T, 256, 0, x, (const float *)w->dev, n, eps, (int)plus_one, yf, yb, ylo, yh,
		  cb->f16_slots);
	cu_launched(cb, "rmsnorm");
}

static void cublas_gemm(struct cuda_backend *cb, const struct toast_mm_out *o, const void *W, int64_t n_out, void *out,
			const bf16 *in, int T)
{
	/* column-major: outᵀ [n_out x T] = W (row-major n_out x n_in = col-major n_in x n_out, op T) · inᵀ;
	 * out may start at a row block of a wider output: its leading dimension is o->W->n_out */
	int64_t n_in = o->W->n_in, ld = o->W->n_out;
	float alpha = 1.0f, beta = o->mode == TOAST_MM_ADD ? 1.0f : 0.0f;
	cudaDataType_t ct = o->mode == TOAST_MM_ACT ? CUDA_R_16BF : CUDA_R_32F;
	cublasStatus_t st = cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, T, (int)n_in, &alpha, W,
					 CUDA_R_16BF, (int)n_in, in, CUDA_R_16BF, (int)n_in, &beta, out, ct, (int)ld,
					 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	if (st != CUBLAS_STATUS_SUCCESS)
		cu_fail_msg(cb, "cublasGemmEx %lldx%dx%lld: status %d", (long long)n_out, T, (long long)n_in, (int)st);
	cu_launched(cb, "matmul (cublas)");
}

double cu_gemm_rate(struct cuda_backend *cb)
{
	const int n = 8192;
	size_t bytes = (size_t)n * n * 2;
	bf16 *a = NULL, *b = NULL, *c = NULL;
	cudaEvent_t e0 = NULL, e1 = NULL;
	double best = 0;
	if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess &&
	    cudaMalloc(&c, bytes) == cudaSuccess && cudaEventCreate(&e0) == cudaSuccess &&
	    cudaEventCreate(&e1) == cudaSuccess) {
		/* random operands: zeros would let the tensor cores run cooler and faster */
		cu_fill_synthetic(cb, a, TOAST_DT_BF16, (size_t)n * n, 1, n, n);
		cu_fill_synthetic(cb, b, TOAST_DT_BF16, (size_t)n * n, 2, n, n);
		float alpha = 1.0f, beta = 0.0f;
		for (int i = 0; i < 6; i++) {
			cudaEventRecord(e0, cb->stream);
			cublasStatus_t st = cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n,
							 b, CUDA_R_16BF, n, &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
							 CUBLAS_GEMM_DEFAULT);
			cudaEventRecord(e1, cb->stream);
			float ms = 0;
			if (st != CUBLAS_STATUS_SUCCESS || cudaEventSynchronize(e1) != cudaSuccess ||
			    cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
				break;
			double r = 2.0 * n * (double)n * n / (ms * 1e-3);
			best = i > 0 && r > best ? r : best; /* the first one warms up */
		}
	}
	cudaGetLastError(); /* a failed allocation is not the backend's failure */
	cudaFree(a), cudaFree(b), cudaFree(c);
	if (e0)
		cudaEventDestroy(e0);
	if (e1)
		cudaEventDestroy(e1);
	return best;
}

/* bf16 rows of a quantised weight dequantised into scratch2 at most this many bytes at a time */
#define CU_DEQUANT_PIECE (64u << 20)

/* rows of W a 16-bit copy in scratch2 holds at a time */
static int64_t dequant_rows(const struct toast_weight *W)
{
	int64_t rows = (int64_t)(CU_DEQUANT_PIECE / ((size_t)W->n_in * 2));
	return rows < 1 ? 1 : rows > W->n_out ? W->n_out : rows;
}

void cu_cublas(struct cuda_backend *cb, const struct toast_mm_out *o, const bf16 *in, int T)
{
	const struct toast_weight *W = o->W;
	if (!toast_dtype_is_quant(W->dev_type)) {
		cublas_gemm(cb, o, W->dev, W->n_out, o->out, in, T);
		return;
	}
	/* prefill: a bf16 copy of a block of rows at a time, then the GEMM on tensor cores */
	cu_wd wd = cu_wd_weight(W);
	int64_t rows = dequant_rows(W);
	bf16 *tmp = (bf16 *)cu_scratch2(cb, (size_t)rows * (size_t)W->n_in * 2);
	size_t es = o->mode == TOAST_MM_ACT ? 2 : 4;
	for (int64_t r0 = 0; tmp && r0 < W->n_out; r0 += rows) {
		int64_t n = W->n_out - r0 < rows ? W->n_out - r0 : rows;
		cu_q_dequant_bf16(cb, wd, 0, r0, n, W->n_in, tmp, NULL);
		cublas_gemm(cb, o, tmp, n, (char *)o->out + (size_t)r0 * es, in, T);
	}
}

void cu_cublas_split(struct cuda_backend *cb, float *out, const struct toast_weight *W, const bf16 *hi, const bf16 *lo,
		     int T)
{
	struct toast_mm_out set = {out, TOAST_MM_F32, W}, add = {out, TOAST_MM_ADD, W};
	if (!toast_dtype_is_quant(W->dev_type)) { /* bf16 weights are exact in bf16 */
		cublas_gemm(cb, &set, W->dev, W->n_out, out, hi, T);
		cublas_gemm(cb, &add, W->dev, W->n_out, out, lo, T);
		return;
	}
	size_t n = (size_t)W->n_out * (size_t)W->n_in;
	bf16 *whi = (bf16 *)cu_scratch2(cb, 2 * n * 2);
	if (!whi)
		return;
	cu_q_dequant_bf16(cb, cu_wd_weight(W), 0, 0, W->n_out, W->n_in, whi, whi + n);
	cublas_gemm(cb, &set, whi, W->n_out, out, hi, T);
	cublas_gemm(cb, &add, whi, W->n_out, out, lo, T);
	cublas_gemm(cb, &add, whi + n, W->n_out, out, hi, T);
}

/* the device float holding W's largest |value|, found once per weight (weights live as long as
 * the backend, so dev identifies one), or the shared slot when the table is full */
static float *f16_amax(struct cuda_backend *cb, const struct toast_weight *W)
{
	size_t h = ((uintptr_t)W->dev >> 8) * 0x9E3779B97F4A7C15ull >> 40;
	for (int k = 0; k < CU_F16_KEPT; k++) {
		size_t i = (h + k) % CU_F16_KEPT;
		float *slot = cb->f16_slots + CU_F16_KEPT0 + i;
		if (cb->f16_keys[i] == W->dev)
			return slot;
		if (!cb->f16_keys[i]) {
			cb->f16_keys[i] = W->dev;
			cu_q_amax(cb, cu_wd_weight(W), W->n_out, W->n_in, slot);
			return slot;
		}
	}
	cu_q_amax(cb, cu_wd_weight(W), W->n_out, W->n_in, cb->f16_slots + CU_F16_WMAX);
	return cb->f16_slots + CU_F16_WMAX;
}

void cu_cublas_f16(struct cuda_backend *cb, const struct toast_mm_out *o, const __half *in, int T)
{
	const struct toast_weight *W = o->W;
	int64_t n_in = W->n_in, rows = dequant_rows(W);
	__half *tmp = (__half *)cu_scratch2(cb, (size_t)rows * (size_t)n_in * 2);
	if (!tmp)
		return;
	const float *amax = f16_amax(cb, W);
	/* alpha (undoing the scales) is known on the device only */
	const float *alpha = cb->f16_slots + CU_F16_ALPHA,
		    *beta = cb->f16_slots + (o->mode == TOAST_MM_ADD ? CU_F16_ONE : CU_F16_ZERO);
	cu_wd wd = cu_wd_weight(W);
	cublasSetPointerMode(cb->cublas, CUBLAS_POINTER_MODE_DEVICE);
	for (int64_t r0 = 0; r0 < W->n_out && !cb->failed; r0 += rows) {
		int64_t n = W->n_out - r0 < rows ? W->n_out - r0 : rows;
		cu_q_dequant_f16(cb, wd, r0, n, n_in, tmp, amax);
		cublasStatus_t st = cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, T, (int)n_in, alpha, tmp,
						 CUDA_R_16F, (int)n_in, in, CUDA_R_16F, (int)n_in, beta,
						 (float *)o->out + r0, CUDA_R_32F, (int)W->n_out, CUBLAS_COMPUTE_32F,
						 CUBLAS_GEMM_DEFAULT);
		if (st != CUBLAS_STATUS_SUCCESS)
			cu_fail_msg(cb, "cublasGemmEx (fp16) %lldx%dx%lld: status %d", (long long)n, T, (long long)n_in,
				    (int)st);
		cu_launched(cb, "matmul (cublas, fp16)");
	}
	cublasSetPointerMode(cb->cublas, CUBLAS_POINTER_MODE_HOST);
}

/* the kernel's token count: exact for bf16, 1, 2, 4 or 8 for quantised types (fewer kernels;
 * the extra input rows are zeros and their outputs are not stored) */
static int gemv_tt(int type, int T)
{
	return type == TOAST_DT_BF16 ? T : T <= 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : 8;
}

static bool gemv_fits(struct cuda_backend *cb, const struct toast_weight *W, int T)
{
	int type = W->dev_type;
	if (T > CU_GEMV_MAX_T || !(type == TOAST_DT_BF16 || toast_dtype_is_quant((enum toast_dtype)type)))
		return false;
	if (type == TOAST_DT_BF16 && (W->n_in % 8 || ((uintptr_t)W->dev & 15)))
		return false;
	if (cu_tiled_kind(type) && !cu_tiled(type, W->n_in)) /* (the Q8_0 and MLX kernels read tiled rows) */
		return false;
	return (size_t)gemv_tt(type, T) * (size_t)W->n_in * 4 + 1024 <= cb->smem_optin;
}

/* the dynamic shared memory k_gemv<TYPE, T, ROWS, GLU> may use (set once) */
template <int TYPE, int T, int ROWS, bool GLU = false>
static size_t gemv_room(struct cuda_backend *cb)
{
	static size_t room;
	if (!room)
		room = cu_allow_smem(cb, (const void *)k_gemv<TYPE, T, ROWS, GLU>);
	return room;
}

template <int TYPE, int T, int ROWS, bool GLU = false>
static void gemv_launch(struct cuda_backend *cb, gemv_args &a)
{
	const int out_rows = GEMV_WARPS * (GLU ? ROWS / 2 : ROWS);
	size_t room = gemv_room<TYPE, T, ROWS, GLU>(cb);
	size_t smem = (size_t)T * a.n_in * 4;
	if (smem > room) {
		cu_fail_msg(cb, "gemv: %zu bytes of shared memory needed, %zu allowed", smem, room);
		return;
	}
	int64_t blocks = 0;
	for (int k = 0; k < a.n_jobs; k++) {
		a.job[k].first_block = blocks;
		blocks += (a.job[k].n_out + out_rows - 1) / out_rows;
	}
	cu_launch_pdl(cb, k_gemv<TYPE, T, ROWS, GLU>, (unsigned)blocks, GEMV_WARPS * 32, smem, a);
}

template <int TYPE, int T>
static void gemv_launch_rows(struct cuda_backend *cb, gemv_args &a)
{
	if (a.job[0].mode == TOAST_MM_GLU) { /* a warp takes one row of the gate and of the up matrix */
		if constexpr (T == 1)
			gemv_launch<TYPE, 1, 2, true>(cb, a);
		else
			cu_fail_msg(cb, "gemv: SiLU(gate) * up is a decode kernel (T = 1, not %d)", T);
		return;
	}
	/* four rows a warp stream more bytes per load batch; one row a warp gives small matrices
	 * enough blocks to fill the GPU. Four rows only when their blocks fill whole waves: one
	 * (bf16 qkvz at 3 blocks an SM), or many (lm_head); 4-bit kernels hold twice the registers
	 * and would run 1.5 waves on the same matrix, where one row a warp runs 3 */
	int64_t rows = 0, blocks4 = 0;
	for (int k = 0; k < a.n_jobs; k++) {
		rows += a.job[k].n_out;
		blocks4 += (a.job[k].n_out + GEMV_WARPS * 4 - 1) / (GEMV_WARPS * 4);
	}
	bool four = rows >= (int64_t)cb->n_sm * GEMV_WARPS * 4 * 2;
	if (four && gemv_room<TYPE, T, 4>(cb)) {
		int64_t slots = (int64_t)cu_per_sm((const void *)k_gemv<TYPE, T, 4>, GEMV_WARPS * 32, (size_t)T * a.n_in * 4) *
				cb->n_sm; /* (0 when the query fails: four rows kept) */
		four = blocks4 <= slots || blocks4 >= 4 * slots;
	}
	if (four)
		gemv_launch<TYPE, T, 4>(cb, a);
	else
		gemv_launch<TYPE, T, 1>(cb, a);
}

template <int TYPE>
static void gemv_launch_type(struct cuda_backend *cb, gemv_args &a)
{
	switch (gemv_tt(TYPE, a.nt)) {
	case 1: gemv_launch_rows<TYPE, 1>(cb, a); break;
	case 2: gemv_launch_rows<TYPE, 2>(cb, a); break;
	case 4: gemv_launch_rows<TYPE, 4>(cb, a); break;
	case 8: gemv_launch_rows<TYPE, 8>(cb, a); break;
	default:
		if constexpr (TYPE == TOAST_DT_BF16) {
			if (a.nt == 3)
				gemv_launch_rows<TYPE, 3>(cb, a);
			else if (a.nt == 5)
				gemv_launch_rows<TYPE, 5>(cb, a);
			else if (a.nt == 6)
				gemv_launch_rows<TYPE, 6>(cb, a);
			else
				gemv_launch_rows<TYPE, 7>(cb, a);
		}
	}
}

/* rows of a cu_kq type on tensor cores when the input is bf16 or normed (not the router's f32
 * input) in 16-byte aligned rows of whole superblocks (MLX: groups of 64k, cu_kq_fits) */
template <int T, int TYPE, bool GLU = false>
static bool gq_launch(struct cuda_backend *cb, gemv_args &a)
{
	static size_t room;
	static int per_sm;
	const int sub = cu_kq<TYPE>::SUB;
	if (!room) {
		room = cu_allow_smem(cb, (const void *)k_gemv_k4<T, TYPE, GLU>);
		per_sm = cu_per_sm((const void *)k_gemv_k4<T, TYPE, GLU>, GQ_WARPS * 32, gq_smem(T, 2048, T > 1 ? 32 / T : 8, sub));
	}
	if (a.xf_exact || a.n_in % 256 ||
	    ((uintptr_t)a.act | (uintptr_t)a.xf | (uintptr_t)a.norm_x | (uintptr_t)a.norm_w | (uintptr_t)a.norm_out) & 15)
		return false;
	int64_t tiles = 0, tw = GLU ? 2 : 1; /* GLU: the gate's and the up matrix's tiles */
	for (int k = 0; k < a.n_jobs; k++) {
		if (!cu_kq_fits(a.job[k].W))
			return false;
		tiles += (a.job[k].n_out + 15) / 16 * tw;
	}
	int64_t slots = (int64_t)cb->n_sm * (per_sm > 0 ? per_sm : 1);
	int rt = (int)((tiles + slots - 1) / slots), max_rt = T > 1 ? 32 / T : GQ_MAX_RT;
	rt = rt > max_rt ? max_rt : rt;
	rt = GLU ? (rt + 1) & ~1 : rt; /* whole pairs a block */
	size_t smem = gq_smem(T, a.n_in, rt, sub);
	if (smem > room)
		return false;
	int64_t blocks = 0;
	for (int k = 0; k < a.n_jobs; k++) {
		a.job[k].first_block = blocks;
		blocks += ((a.job[k].n_out + 15) / 16 * tw + rt - 1) / rt;
	}
	cu_launch_pdl(cb, k_gemv_k4<T, TYPE, GLU>, (unsigned)blocks, GQ_WARPS * 32, smem, a, rt, (int)(blocks <= slots));
	return true;
}

template <int TYPE>
static bool gq_launch_t(struct cuda_backend *cb, gemv_args &a)
{
	if (a.job[0].mode == TOAST_MM_GLU) /* (T == 1) */
		return gq_launch<1, TYPE, true>(cb, a);
	return a.nt == 1   ? gq_launch<1, TYPE>(cb, a)
	       : a.nt == 2 ? gq_launch<2, TYPE>(cb, a)
	       : a.nt <= 4 ? gq_launch<4, TYPE>(cb, a)
			   : gq_launch<8, TYPE>(cb, a);
}

/* Q8_0 went SIMT here while it was row-major (its four-rows-a-warp kernel beat the tensor
 * cores': Qwen3-Next Q8_0 qkvz 8.5 us against 11.5 on an H200); tiled, the tensor cores win
 * (24 of its layers on an H100: 757 tok/s, against 661 tiled on the SIMT kernel and 718
 * row-major on it, docs/PERF.md) */
static void gemv_launch_any(struct cuda_backend *cb, int type, gemv_args &a)
{
	bool tc = cu_with_kq(type, [&](auto k) { return gq_launch_t<decltype(k)::value>(cb, a); });
	if (tc) {
		cu_launched(cb, "gemv (tensor cores)");
		return;
	}
	switch (type) {
	case TOAST_DT_BF16: gemv_launch_type<TOAST_DT_BF16>(cb, a); break;
	case TOAST_DT_Q4_0: gemv_launch_type<TOAST_DT_Q4_0>(cb, a); break;
	case TOAST_DT_Q4_1: gemv_launch_type<TOAST_DT_Q4_1>(cb, a); break;
	case TOAST_DT_Q8_0: gemv_launch_type<TOAST_DT_Q8_0>(cb, a); break;
	case TOAST_DT_Q4_K: gemv_launch_type<TOAST_DT_Q4_K>(cb, a); break;
	case TOAST_DT_Q5_K: gemv_launch_type<TOAST_DT_Q5_K>(cb, a); break;
	case TOAST_DT_Q6_K: gemv_launch_type<TOAST_DT_Q6_K>(cb, a); break;
	case TOAST_DT_MLX4: gemv_launch_type<TOAST_DT_MLX4>(cb, a); break;
	default: gemv_launch_type<TOAST_DT_MLX8>(cb, a); break;
	}
	cu_launched(cb, "gemv");
}

void cu_gemv_f32(struct cuda_backend *cb, float *out, const float *x, const struct toast_weight *W, int T)
{
	if (gemv_fits(cb, W, T)) {
		gemv_args a = {};
		a.job[0] = {out, cu_wd_weight(W), (int)TOAST_MM_F32, W->n_out, 0};
		a.n_jobs = 1, a.nt = T, a.n_in = W->n_in, a.xf = x, a.xf_exact = true;
		gemv_launch_any(cb, W->dev_type, a);
		return;
	}
	dim3 grid(cu_blocks((size_t)W->n_out, 8), T);
	cu_launch(cb, k_gemv_plain, grid, 256, 0, out, (int)TOAST_MM_F32, (const bf16 *)NULL, x, cu_wd_weight(W), W->n_out,
		  W->n_in);
	cu_launched(cb, "gemv (f32 input)");
}

/* the GEMVs' input and token count */
static gemv_args gemv_input(const struct toast_mm_in *in, int T, int64_t n_in)
{
	gemv_args a = {};
	a.nt = T, a.n_in = n_in, a.act = (const bf16 *)in->act, a.xf = in->xf, a.norm_x = in->norm_x;
	a.norm_w = in->act || in->xf ? NULL : (const float *)in->norm_w->dev;
	a.eps = in->eps, a.plus_one = in->plus_one, a.norm_out = (bf16 *)in->norm_out;
	a.pf = (const char *)in->prefetch, a.pf_bytes = in->prefetch ? in->prefetch_bytes : 0;
	return a;
}

void cu_matmul(struct cuda_backend *cb, const struct toast_mm_in *in, const struct toast_mm_out *outs, int n_outs,
	       int T)
{
	int64_t n_in = outs[0].W->n_in;
	if (outs[0].mode == TOAST_MM_GLU) {
		const struct toast_weight *G = outs[0].W, *U = outs[0].W2;
		if (T == 1 && G->dev_type == U->dev_type && gemv_fits(cb, G, T)) {
			/* a decode step: one GEMV launch stores SiLU(gate) * up */
			gemv_args a = gemv_input(in, T, n_in);
			a.job[0] = {outs[0].out, cu_wd_weight(G), (int)TOAST_MM_GLU, G->n_out, 0, cu_wd_weight(U)};
			a.n_jobs = 1;
			gemv_launch_any(cb, G->dev_type, a);
			return;
		}
		/* the two products, then SiLU(gate) * up */
		size_t n = (size_t)T * G->n_out;
		float *gu = (float *)cu_scratch3(cb, n * 8);
		if (!gu)
			return;
		struct toast_mm_out two[2] = {{gu, TOAST_MM_F32, G, NULL}, {gu + n, TOAST_MM_F32, U, NULL}};
		cu_matmul(cb, in, two, 2, T);
		cu_swiglu(cb, (bf16 *)outs[0].out, gu, gu + n, T, (int)G->n_out);
		return;
	}
	/* decode-sized T: one GEMV launch per weight type among the outputs */
	bool done[TOAST_MM_MAX_OUT] = {};
	int left = n_outs;
	gemv_args a = gemv_input(in, T, n_in);
	for (int k = 0; k < n_outs; k++) {
		if (done[k] || !gemv_fits(cb, outs[k].W, T))
			continue;
		int type = outs[k].W->dev_type;
		a.n_jobs = 0;
		for (int k2 = k; k2 < n_outs; k2++)
			if (!done[k2] && outs[k2].W->dev_type == type && gemv_fits(cb, outs[k2].W, T)) {
				a.job[a.n_jobs++] = {outs[k2].out, cu_wd_weight(outs[k2].W), (int)outs[k2].mode, outs[k2].W->n_out, 0};
				done[k2] = true;
				left--;
			}
		gemv_launch_any(cb, type, a);
		a.norm_out = NULL; /* written once */
		a.pf = NULL;
	}
	if (!left)
		return;
	/* the general path: the input in memory once (bf16 for tensor cores, f32 too for odd shapes,
	 * fp16 for the products cu_cublas_f16 takes) */
	auto on_cublas = [&](const struct toast_weight *W) {
		return toast_dtype_is_quant(W->dev_type) || (T > CU_GEMV_MAX_T && W->dev_type == TOAST_DT_BF16);
	};
	auto on_f16 = [&](const struct toast_mm_out &o) {
		return !in->act && !cb->gemm_bf16 && on_cublas(o.W) && o.mode != TOAST_MM_ACT;
	};
	bool plain = false, f16 = false, b16 = false; /* what the outputs left read */
	for (int k = 0; k < n_outs; k++) {
		if (done[k])
			continue;
		plain = plain || !on_cublas(outs[k].W);
		f16 = f16 || on_f16(outs[k]);
		b16 = b16 || (on_cublas(outs[k].W) && !on_f16(outs[k]));
	}
	const bf16 *xb = (const bf16 *)in->act;
	const float *xf = in->xf;
	const __half *xh = NULL;
	size_t n = (size_t)T * n_in;
	if (xf && (f16 || b16)) { /* f32 rows: fp16 (and bf16) copies for cuBLAS */
		char *scr = (char *)cu_scratch(cb, n * 4);
		if (!scr)
			return;
		bf16 *yb = b16 ? (bf16 *)(scr + n * 2) : NULL;
		__half *yh = f16 ? (__half *)scr : NULL;
		cu_f16_rows(cb, xf, n, yh, yb);
		xb = yb;
		xh = yh;
	} else if (!xb && !xf) {
		char *scr = (char *)cu_scratch(cb, n * 8);
		if (!scr)
			return;
		float *yf = plain ? (float *)scr : NULL;
		bf16 *yb = in->norm_out ? (bf16 *)in->norm_out : b16 ? (bf16 *)(scr + n * 4) : NULL;
		__half *yh = f16 ? (__half *)(scr + n * 6) : NULL;
		cu_norm_rows(cb, in->norm_x, in->norm_w, T, n_in, in->eps, in->plus_one, yf, yb, NULL, yh);
		xb = yb;
		xf = yf;
		xh = yh;
	}
	for (int k = 0; k < n_outs; k++) {
		const struct toast_weight *W = outs[k].W;
		if (done[k])
			continue;
		if (on_cublas(W)) {
			if (xh && on_f16(outs[k]))
				cu_cublas_f16(cb, &outs[k], xh, T);
			else
				cu_cublas(cb, &outs[k], xb, T);
			continue;
		}
		dim3 grid(cu_blocks((size_t)W->n_out, 8), T);
		cu_launch(cb, k_gemv_plain, grid, 256, 0, outs[k].out, (int)outs[k].mode, xb, xf, cu_wd_weight(W), W->n_out,
			  n_in);
		cu_launched(cb, "matmul (plain)");
	}
}

CU_TL_TU(k_matmul)
