/*
 * k_moe.cu - mixture of experts with optional shared expert (contract: toast_moe_args).
 *
 * The input is RMSNorm(x), computed in f32 and kept in f32 for the router, so expert choice
 * does not flip on rounding. Decode (T <= CU_GEMV_MAX_T): one kernel computes the norm, the
 * router logits and, in its last block to finish, softmax/top-k and the shared expert's gate;
 * one kernel runs gate/up of every chosen expert and the shared one; one runs down for all of
 * them and adds to the residual. Expert ids stay in device memory, so a recorded decode step
 * is valid whatever the router picks. Longer T runs the same expert kernels per token.
 */
#include "backend/cuda/cuda_common.cuh"

#include <mma.h>

#define MOE_MAX_K 64
#define MOE_WARPS 8

struct moe_dims {
	int T, E, ne, k, F, Fs, Fmax, norm_topk;
};

/* softmax over ne logits, the k largest (ties: lower index), renormalised when asked; s holds ne
 * floats of shared memory; called by a whole block */
__device__ void moe_topk_block(const moe_dims &d, const float *logits, float *s, int32_t *sel, float *wt)
{
	__shared__ float red[32];
	__shared__ float bv_s[32];
	__shared__ int bi_s[32];
	__shared__ int chosen;
	int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
	float mx = -INFINITY;
	for (int e = tid; e < d.ne; e += blockDim.x) {
		s[e] = logits[e];
		mx = fmaxf(mx, s[e]);
	}
	mx = cu_warp_max(mx);
	__syncthreads();
	if (lane == 0)
		red[warp] = mx;
	__syncthreads();
	mx = red[0];
	for (int w = 1; w < nw; w++)
		mx = fmaxf(mx, red[w]);
	float sum = 0;
	for (int e = tid; e < d.ne; e += blockDim.x)
		sum += __expf(s[e] - mx);
	sum = cu_block_sum(sum, red);
	float tot = 0;
	for (int j = 0; j < d.k; j++) {
		float bv = -INFINITY;
		int bi = d.ne;
		for (int e = tid; e < d.ne; e += blockDim.x)
			if (s[e] > bv) { /* increasing e: the first maximum wins */
				bv = s[e];
				bi = e;
			}
		for (int o = 16; o > 0; o >>= 1) {
			float ov = __shfl_xor_sync(0xffffffffu, bv, o);
			int oi = __shfl_xor_sync(0xffffffffu, bi, o);
			if (ov > bv || (ov == bv && oi < bi)) {
				bv = ov;
				bi = oi;
			}
		}
		if (lane == 0) {
			bv_s[warp] = bv;
			bi_s[warp] = bi;
		}
		__syncthreads();
		if (tid == 0) {
			float b = bv_s[0];
			int ix = bi_s[0];
			for (int w = 1; w < nw; w++)
				if (bv_s[w] > b || (bv_s[w] == b && bi_s[w] < ix)) {
					b = bv_s[w];
					ix = bi_s[w];
				}
			chosen = ix;
			sel[j] = ix;
			wt[j] = __expf(b - mx) / sum;
			s[ix] = -INFINITY;
		}
		__syncthreads();
		tot += __expf(logits[chosen] - mx) / sum;
	}
	if (d.norm_topk && tid == 0)
		for (int j = 0; j < d.k; j++)
			wt[j] /= tot;
	__syncthreads();
}

/* the same by one warp with the logits in registers (ne <= 32 * MOE_WARP_TOPK): each lane
 * keeps the best of its own values, so a round is one warp argmax and one lane's rescan */
#define MOE_WARP_TOPK 16
__device__ void moe_topk_warp(const moe_dims &d, const float *logits, int32_t *sel, float *wt)
{
	int lane = threadIdx.x & 31;
	float v[MOE_WARP_TOPK];
	float mx = -INFINITY;
#pragma unroll
	for (int i = 0; i < MOE_WARP_TOPK; i++) {
		int e = lane + 32 * i;
		v[i] = e < d.ne ? logits[e] : -INFINITY;
		mx = fmaxf(mx, v[i]);
	}
	mx = cu_warp_max(mx);
	float sum = 0;
#pragma unroll
	for (int i = 0; i < MOE_WARP_TOPK; i++)
		sum += lane + 32 * i < d.ne ? __expf(v[i] - mx) : 0.0f;
	sum = cu_warp_sum(sum);
	/* the lane's best: increasing index within the lane, so the first maximum wins */
	float lb = -INFINITY;
	int li = 1 << 30;
#pragma unroll
	for (int i = 0; i < MOE_WARP_TOPK; i++)
		if (v[i] > lb) {
			lb = v[i];
			li = lane + 32 * i;
		}
	float tot = 0;
	for (int j = 0; j < d.k; j++) {
		float bv = lb;
		int bi = li;
		for (int o = 16; o > 0; o >>= 1) {
			float ov = __shfl_xor_sync(0xffffffffu, bv, o);
			int oi = __shfl_xor_sync(0xffffffffu, bi, o);
			if (ov > bv || (ov == bv && oi < bi)) {
				bv = ov;
				bi = oi;
			}
		}
		if ((bi & 31) == lane) { /* the winner's lane drops it and finds its next best */
#pragma unroll
			for (int i = 0; i < MOE_WARP_TOPK; i++)
				if (bi == lane + 32 * i)
					v[i] = -INFINITY;
			lb = -INFINITY;
			li = 1 << 30;
#pragma unroll
			for (int i = 0; i < MOE_WARP_TOPK; i++)
				if (v[i] > lb) {
					lb = v[i];
					li = lane + 32 * i;
				}
		}
		float p = __expf(bv - mx) / sum;
		tot += p;
		if (lane == 0) {
			sel[j] = bi;
			wt[j] = p;
		}
	}
	if (d.norm_topk && lane < d.k)
		wt[lane] /= tot;
}

/* h · sh_gate_inp for one token, by the whole block */
__device__ float moe_sgate(const float *h, const float *sgw, int E)
{
	__shared__ float red[32];
	float v = 0;
	for (int i = threadIdx.x; i < E; i += blockDim.x)
		v += h[i] * sgw[i];
	return cu_sigmoid(cu_block_sum(v, red));
}

/* sum over PL uint4 of a bf16 row (lane's share, already loaded) times f32 x in shared memory */
template <int PL>
__device__ __forceinline__ float moe_dot_loaded(const uint4 *w, const float *x, int lane)
{
	float acc = 0;
#pragma unroll
	for (int p = 0; p < PL; p++) {
		float f[8];
		cu_bf16x8(w[p], f);
		const float4 *xv = (const float4 *)(x + (lane + 32 * p) * 8);
		float4 x0 = xv[0], x1 = xv[1];
		acc += f[0] * x0.x + f[1] * x0.y + f[2] * x0.z + f[3] * x0.w + f[4] * x1.x + f[5] * x1.y + f[6] * x1.z +
		       f[7] * x1.w;
	}
	return acc;
}

/* decode: norm + router + (last block) top-k. smem: hs [T][E] then ne floats for the top-k.
 * PL > 0: n_embd == 256 * PL, the router row's loads are issued before the norm is computed. */
template <int PL>
__global__ void __launch_bounds__(MOE_WARPS * 32)
	k_moe_route(moe_dims d, const float *x, const float *nw, float eps, int plus_one, const bf16 *R, const float *sgw,
		    float *h, float *logits, int32_t *sel, float *wt, float *sgate, unsigned *counter)
{
	extern __shared__ float hs[];
	__shared__ float red[32];
	__shared__ unsigned ticket;
	int E = d.E;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int e = blockIdx.x * MOE_WARPS + warp;
	uint4 rw[PL > 0 ? PL : 1];
	if (PL > 0 && e < d.ne)
#pragma unroll
		for (int p = 0; p < PL; p++)
			rw[p] = __ldg((const uint4 *)(R + (size_t)e * E) + lane + 32 * p); /* the router rows are weights: their loads fly while the previous kernel ends */
	for (int t = 0; t < d.T; t++) {
		const float *xr = x + (size_t)t * E;
		float ss = 0;
		for (int i = threadIdx.x; i < E; i += blockDim.x)
			ss += xr[i] * xr[i];
		ss = cu_block_sum(ss, red);
		float r = rsqrtf(ss / E + eps);
		for (int i = threadIdx.x; i < E; i += blockDim.x) {
			float y = xr[i] * r * (plus_one ? 1.0f + nw[i] : nw[i]);
			hs[t * E + i] = y;
			if (blockIdx.x == 0)
				h[(size_t)t * E + i] = y;
		}
	}
	__syncthreads();
	/* one router row per warp */
	if (e < d.ne) {
		const bf16 *w = R + (size_t)e * E;
		float acc[CU_GEMV_MAX_T] = {0};
		if (PL > 0) {
#pragma unroll
			for (int t = 0; t < CU_GEMV_MAX_T; t++)
				if (t < d.T)
					acc[t] = moe_dot_loaded<PL>(rw, hs + t * E, lane);
		} else if ((E & 7) == 0) {
#pragma unroll 4
			for (int i = lane; i < E / 8; i += 32) {
				float f[8];
				cu_bf16x8(__ldg((const uint4 *)w + i), f);
#pragma unroll
				for (int t = 0; t < CU_GEMV_MAX_T; t++)
					if (t < d.T)
#pragma unroll
						for (int q = 0; q < 8; q++)
							acc[t] += f[q] * hs[t * E + i * 8 + q];
			}
		} else {
			for (int i = lane; i < E; i += 32)
#pragma unroll
				for (int t = 0; t < CU_GEMV_MAX_T; t++)
					if (t < d.T)
						acc[t] += __bfloat162float(w[i]) * hs[t * E + i];
		}
#pragma unroll
		for (int t = 0; t < CU_GEMV_MAX_T; t++) {
			if (t >= d.T)
				break;
			float v = cu_warp_sum(acc[t]);
			if (lane == 0)
				logits[(size_t)t * d.ne + e] = v;
		}
	}
	/* the last block to finish chooses the experts */
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0)
		ticket = atomicAdd(counter, 1u);
	__syncthreads();
	if (ticket != gridDim.x - 1)
		return;
	__threadfence();
	for (int t = 0; t < d.T; t++) {
		if (d.ne <= 32 * MOE_WARP_TOPK) {
			if (threadIdx.x < 32)
				moe_topk_warp(d, logits + (size_t)t * d.ne, sel + (size_t)t * d.k, wt + (size_t)t * d.k);
		} else {
			moe_topk_block(d, logits + (size_t)t * d.ne, hs + d.T * E, sel + (size_t)t * d.k, wt + (size_t)t * d.k);
		}
		if (sgw) {
			float g = moe_sgate(hs + t * E, sgw, E);
			if (threadIdx.x == 0)
				sgate[t] = g;
		}
	}
	if (threadIdx.x == 0)
		*counter = 0;
}

/* prefill: one block per token */
__global__ void k_moe_topk(moe_dims d, const float *h, const float *logits, const float *sgw, int32_t *sel, float *wt,
			   float *sgate)
{
	extern __shared__ float s[];
	int t = blockIdx.x;
	moe_topk_block(d, logits + (size_t)t * d.ne, s, sel + (size_t)t * d.k, wt + (size_t)t * d.k);
	if (sgw) {
		float g = moe_sgate(h + (size_t)t * d.E, sgw, d.E);
		if (threadIdx.x == 0)
			sgate[t] = g;
	}
}

/* act[t][slot][r] = SiLU(gate·h) * (up·h), one r per warp; slot k is the shared expert.
 * PL > 0: n_embd == 256 * PL and both rows' loads are issued before any use. */
template <int PL>
__global__ void __launch_bounds__(MOE_WARPS * 32)
	k_moe_gateup(moe_dims d, const float *h, const bf16 *gate, const bf16 *up, const int32_t *sel, const bf16 *sg,
		     const bf16 *su, float *act)
{
	extern __shared__ float hs[];
	int slot = blockIdx.y, t = blockIdx.z, E = d.E;
	bool shared = slot == d.k;
	int n = shared ? d.Fs : d.F;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int r = blockIdx.x * MOE_WARPS + warp;
	size_t e = shared ? 0 : (size_t)sel[(size_t)t * d.k + slot];
	const bf16 *g = (shared ? sg : gate + e * d.F * E) + (size_t)min(r, n - 1) * E;
	const bf16 *u = (shared ? su : up + e * d.F * E) + (size_t)min(r, n - 1) * E;
	uint4 gw[PL > 0 ? PL : 1], uw[PL > 0 ? PL : 1];
	if (PL > 0 && r < n)
#pragma unroll
		for (int p = 0; p < PL; p++) {
			gw[p] = __ldg((const uint4 *)g + lane + 32 * p);
			uw[p] = __ldg((const uint4 *)u + lane + 32 * p);
		}
	for (int i = threadIdx.x; i < E; i += blockDim.x)
		hs[i] = h[(size_t)t * E + i];
	__syncthreads();
	if (r >= n)
		return;
	float a = 0, b = 0;
	if (PL > 0) {
		a = moe_dot_loaded<PL>(gw, hs, lane);
		b = moe_dot_loaded<PL>(uw, hs, lane);
	} else {
		for (int i = lane; i < E; i += 32) {
			a += __bfloat162float(g[i]) * hs[i];
			b += __bfloat162float(u[i]) * hs[i];
		}
	}
	a = cu_warp_sum(a), b = cu_warp_sum(b);
	if (lane == 0)
		act[((size_t)t * (d.k + 1) + slot) * d.Fmax + r] = cu_silu(a) * b;
}

#define MOE_DOWN_SLOTS 12 /* slots whose loads a warp issues together */

/* x[t][i] += sum over slots of weight * down_slot[i] · act[t][slot], one row i per warp.
 * PL > 0: n_ff == n_ff_sh == 256 * PL and at most MOE_DOWN_SLOTS slots: all loads first. */
template <int PL>
__global__ void __launch_bounds__(MOE_WARPS * 32)
	k_moe_down(moe_dims d, float *x, const bf16 *down, const int32_t *sel, const float *wt, const bf16 *sd,
		   const float *sgate, const float *act)
{
	extern __shared__ float as[];
	__shared__ const bf16 *rows_base[MOE_MAX_K + 1];
	__shared__ float wts[MOE_MAX_K + 1];
	int t = blockIdx.y, E = d.E, nslot = d.k + (sd ? 1 : 0);
	for (int s = threadIdx.x; s < nslot; s += blockDim.x) {
		bool shared = s == d.k;
		rows_base[s] = shared ? sd : down + (size_t)sel[(size_t)t * d.k + s] * E * d.F;
		wts[s] = shared ? (sgate ? sgate[t] : 1.0f) : wt[(size_t)t * d.k + s];
	}
	for (int i = threadIdx.x; i < nslot * d.Fmax; i += blockDim.x)
		as[i] = act[(size_t)t * (d.k + 1) * d.Fmax + i];
	__syncthreads();
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int i = blockIdx.x * MOE_WARPS + warp;
	if (i >= E)
		return;
	float acc = 0;
	if (PL > 0) {
		uint4 w[MOE_DOWN_SLOTS][PL > 0 ? PL : 1];
#pragma unroll
		for (int s = 0; s < MOE_DOWN_SLOTS; s++)
			if (s < nslot)
#pragma unroll
				for (int p = 0; p < PL; p++)
					w[s][p] = __ldg((const uint4 *)(rows_base[s] + (size_t)i * d.F) + lane + 32 * p);
#pragma unroll
		for (int s = 0; s < MOE_DOWN_SLOTS; s++)
			if (s < nslot)
				acc += wts[s] * moe_dot_loaded<PL>(w[s], as + s * d.Fmax, lane);
	} else {
		for (int s = 0; s < nslot; s++) {
			int F = s == d.k ? d.Fs : d.F;
			const bf16 *w = rows_base[s] + (size_t)i * F;
			const float *a = as + s * d.Fmax;
			float p = 0;
			for (int q = lane; q < F; q += 32)
				p += __bfloat162float(w[q]) * a[q];
			acc += wts[s] * p;
		}
	}
	acc = cu_warp_sum(acc);
	if (lane == 0)
		x[(size_t)t * E + i] += acc;
}

/* ---- prefill: tokens grouped by expert, one cuBLAS grouped GEMM per matrix ---- */

__global__ void k_moe_count(const int32_t *sel, int n, int32_t *counts)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		atomicAdd(&counts[sel[i]], 1);
}

/* one block: offsets = exclusive scan of counts, tiles = exclusive scan of the 64-row tiles
 * each expert's group needs; cursors zeroed */
__global__ void k_moe_scan(const int32_t *counts, int ne, int32_t *offsets, int32_t *tiles, int32_t *cursor)
{
	if (threadIdx.x == 0) {
		int acc = 0, tacc = 0;
		for (int e = 0; e < ne; e++) {
			offsets[e] = acc;
			tiles[e] = tacc;
			acc += counts[e];
			tacc += (counts[e] + 63) / 64;
		}
		offsets[ne] = acc;
		tiles[ne] = tacc;
	}
	for (int e = threadIdx.x; e < ne; e += blockDim.x)
		cursor[e] = 0;
}

/* each token-slot gets a row in its expert's group; inv maps token-slot -> row */
__global__ void k_moe_scatter(const int32_t *sel, int n, int k, const int32_t *offsets, int32_t *cursor, int32_t *inv,
			      int32_t *row_tok)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n)
		return;
	int e = sel[i], pos = offsets[e] + atomicAdd(&cursor[e], 1);
	inv[i] = pos;
	row_tok[pos] = i / k;
}

/* xs[row] = hb[row_tok[row]] (bf16 rows of E, E % 8 == 0) */
__global__ void k_moe_gather(const bf16 *hb, const int32_t *row_tok, int E, bf16 *xs)
{
	const uint4 *src = (const uint4 *)(hb + (size_t)row_tok[blockIdx.x] * E);
	uint4 *dst = (uint4 *)(xs + (size_t)blockIdx.x * E);
	for (int i = threadIdx.x; i < E / 8; i += blockDim.x)
		dst[i] = src[i];
}

__global__ void k_silu_mul_bf16(bf16 *out, const bf16 *g, const bf16 *u, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		out[i] = __float2bfloat16(cu_silu(__bfloat162float(g[i])) * __bfloat162float(u[i]));
}

/* x[t][i] += sum_s wt[t][s] * y[inv[t][s]][i] + sgate[t] * ys[t][i], slots in order */
__global__ void k_moe_combine(float *x, int E, int k, const int32_t *inv, const float *wt, const float *y,
			      const float *ys, const float *sgate)
{
	int t = blockIdx.x;
	for (int i = threadIdx.x; i < E; i += blockDim.x) {
		float acc = 0;
		for (int s = 0; s < k; s++)
			acc += wt[(size_t)t * k + s] * y[(size_t)inv[(size_t)t * k + s] * E + i];
		if (ys)
			acc += (sgate ? sgate[t] : 1.0f) * ys[(size_t)t * E + i];
		x[(size_t)t * E + i] += acc;
	}
}

/*
 * Grouped GEMM on tensor cores: for every expert e, C[rows of e] = X[rows of e] · W[e]ᵀ, with
 * X [n_rows][K] grouped by expert (offsets), W [ne][N][K], C [n_rows][N]. A block computes one
 * 64x64 tile of one expert's group; blockIdx.x runs over the groups' row tiles (tiles[] is their
 * exclusive scan, so no host needs the counts), blockIdx.y over column tiles. Four warps, each
 * a 32x32 quarter as 2x2 WMMA 16x16x16 bf16 fragments accumulating in f32. N % 64 == 0,
 * K % 32 == 0.
 */
#define GG_TILE 64
#define GG_KSTEP 32
#define GG_PAD 8
template <typename OutT>
__global__ void __launch_bounds__(128)
	k_moe_ggemm(const bf16 *X, const bf16 *W, OutT *C, const int32_t *offsets, const int32_t *tiles, int ne, int N, int K)
{
	using namespace nvcuda;
	__shared__ __align__(32) bf16 As[GG_TILE][GG_KSTEP + GG_PAD];
	__shared__ __align__(32) bf16 Bs[GG_TILE][GG_KSTEP + GG_PAD];
	__shared__ __align__(32) float Cs[GG_TILE][GG_TILE + 4];
	int tile = blockIdx.x;
	if (tile >= tiles[ne])
		return;
	int lo = 0, hi = ne - 1; /* the expert whose tiles contain this one */
	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;
		if (tiles[mid] <= tile)
			lo = mid;
		else
			hi = mid - 1;
	}
	int e = lo;
	int row0 = offsets[e] + (tile - tiles[e]) * GG_TILE, row_end = offsets[e + 1];
	int col0 = blockIdx.y * GG_TILE;
	const bf16 *We = W + (size_t)e * N * K;
	int warp = threadIdx.x >> 5, wm = warp >> 1, wn = warp & 1;
	wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
	for (int i = 0; i < 2; i++)
#pragma unroll
		for (int j = 0; j < 2; j++)
			wmma::fill_fragment(acc[i][j], 0.0f);
	for (int k0 = 0; k0 < K; k0 += GG_KSTEP) {
		/* 64 rows x 32 k of A and of B: 256 uint4 each, two per thread */
#pragma unroll
		for (int u = 0; u < 2; u++) {
			int v = threadIdx.x + u * 128, r = v / 4, c = (v % 4) * 8;
			int row = row0 + r;
			uint4 av = row < row_end ? *(const uint4 *)(X + (size_t)row * K + k0 + c) : make_uint4(0, 0, 0, 0);
			*(uint4 *)&As[r][c] = av;
			*(uint4 *)&Bs[r][c] = *(const uint4 *)(We + (size_t)(col0 + r) * K + k0 + c);
		}
		__syncthreads();
#pragma unroll
		for (int kk = 0; kk < GG_KSTEP; kk += 16) {
			wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
			wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb[2];
#pragma unroll
			for (int i = 0; i < 2; i++)
				wmma::load_matrix_sync(fa[i], &As[wm * 32 + i * 16][kk], GG_KSTEP + GG_PAD);
#pragma unroll
			for (int j = 0; j < 2; j++)
				wmma::load_matrix_sync(fb[j], &Bs[wn * 32 + j * 16][kk], GG_KSTEP + GG_PAD);
#pragma unroll
			for (int i = 0; i < 2; i++)
#pragma unroll
				for (int j = 0; j < 2; j++)
					wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
		}
		__syncthreads();
	}
#pragma unroll
	for (int i = 0; i < 2; i++)
#pragma unroll
		for (int j = 0; j < 2; j++)
			wmma::store_matrix_sync(&Cs[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], GG_TILE + 4,
						wmma::mem_row_major);
	__syncthreads();
	for (int v = threadIdx.x; v < GG_TILE * GG_TILE; v += 128) {
		int r = v / GG_TILE, c = v % GG_TILE;
		if (row0 + r < row_end) {
			float val = Cs[r][c];
			if constexpr (sizeof(OutT) == 2)
				C[(size_t)(row0 + r) * N + col0 + c] = __float2bfloat16(val);
			else
				C[(size_t)(row0 + r) * N + col0 + c] = val;
		}
	}
}

/*
 * Prefill: token-slots grouped by expert on the device (count, scan, scatter, gather), then
 * gate, up and down as grouped tensor-core GEMMs over the groups: no host round trip, no
 * padding. The shared expert runs dense on cuBLAS.
 */
static void cu_moe_grouped(struct cuda_backend *cb, const struct toast_moe_args *a, const moe_dims &d)
{
	size_t T = (size_t)d.T, E = (size_t)d.E, F = (size_t)d.F, Fs = (size_t)d.Fs, ne = (size_t)d.ne, k = (size_t)d.k;
	size_t n = T * k;
	size_t off = 0;
#define MOE_TAKE(bytes) (off = (off + 255) & ~(size_t)255, off += (bytes), off - (bytes))
	size_t o_h = MOE_TAKE(T * E * 4), o_hb = MOE_TAKE(T * E * 2), o_hlo = MOE_TAKE(T * E * 2);
	size_t o_log = MOE_TAKE(T * ne * 4), o_sel = MOE_TAKE(n * 4), o_wt = MOE_TAKE(n * 4), o_sg = MOE_TAKE(T * 4);
	size_t o_cnt = MOE_TAKE(ne * 4), o_offs = MOE_TAKE((ne + 1) * 4), o_tiles = MOE_TAKE((ne + 1) * 4);
	size_t o_cur = MOE_TAKE(ne * 4), o_inv = MOE_TAKE(n * 4), o_rt = MOE_TAKE(n * 4);
	size_t o_sgf = MOE_TAKE(T * Fs * 4), o_suf = MOE_TAKE(T * Fs * 4), o_sact = MOE_TAKE(T * Fs * 2);
	size_t o_ys = MOE_TAKE(T * E * 4), o_xs = MOE_TAKE(n * E * 2), o_g = MOE_TAKE(n * F * 2), o_u = MOE_TAKE(n * F * 2);
	size_t o_act = MOE_TAKE(n * F * 2), o_y = MOE_TAKE(n * E * 4);
#undef MOE_TAKE
	char *s = (char *)cu_scratch(cb, off);
	if (!s)
		return;
	float *h = (float *)(s + o_h), *logits = (float *)(s + o_log), *wt = (float *)(s + o_wt), *sgate = (float *)(s + o_sg);
	bf16 *hb = (bf16 *)(s + o_hb), *hlo = (bf16 *)(s + o_hlo), *sact = (bf16 *)(s + o_sact), *xs = (bf16 *)(s + o_xs);
	bf16 *gg = (bf16 *)(s + o_g), *uu = (bf16 *)(s + o_u), *act = (bf16 *)(s + o_act);
	int32_t *sel = (int32_t *)(s + o_sel), *counts = (int32_t *)(s + o_cnt), *offs = (int32_t *)(s + o_offs);
	int32_t *tiles = (int32_t *)(s + o_tiles), *cursor = (int32_t *)(s + o_cur), *inv = (int32_t *)(s + o_inv);
	int32_t *row_tok = (int32_t *)(s + o_rt);
	float *sgf = (float *)(s + o_sgf), *suf = (float *)(s + o_suf), *ys = (float *)(s + o_ys), *y = (float *)(s + o_y);
	const float *sgw = a->sh_gate_inp ? (const float *)a->sh_gate_inp->dev : NULL;

	/* route on h = hb + hlo: two bf16 GEMMs give the router (nearly) f32 inputs */
	cu_norm_rows(cb, a->x, a->norm_w, d.T, d.E, a->eps, a->plus_one, h, hb, hlo);
	struct toast_mm_out lo = {logits, TOAST_MM_F32, a->router}, lo2 = {logits, TOAST_MM_ADD, a->router};
	cu_cublas(cb, &lo, hb, d.T);
	cu_cublas(cb, &lo2, hlo, d.T);
	cu_launch(cb, k_moe_topk, d.T, 256, d.ne * 4, d, h, logits, sgw, sel, wt, sgate);
	cu_launched(cb, "moe top-k");
	cu_fail(cb, cudaMemsetAsync(counts, 0, ne * 4, cb->stream), "moe counts");
	cu_launch(cb, k_moe_count, cu_blocks(n, 256), 256, 0, sel, (int)n, counts);
	cu_launch(cb, k_moe_scan, 1, 256, 0, counts, d.ne, offs, tiles, cursor);
	cu_launch(cb, k_moe_scatter, cu_blocks(n, 256), 256, 0, sel, (int)n, d.k, offs, cursor, inv, row_tok);
	cu_launch(cb, k_moe_gather, (unsigned)n, 128, 0, (const bf16 *)hb, (const int32_t *)row_tok, d.E, xs);
	cu_launched(cb, "moe grouping");
	unsigned max_tiles = (unsigned)(n / GG_TILE + ne);
	cu_launch(cb, k_moe_ggemm<bf16>, dim3(max_tiles, d.F / GG_TILE), 128, 0, (const bf16 *)xs,
		  (const bf16 *)a->gate->dev, gg, (const int32_t *)offs, (const int32_t *)tiles, d.ne, d.F, d.E);
	cu_launch(cb, k_moe_ggemm<bf16>, dim3(max_tiles, d.F / GG_TILE), 128, 0, (const bf16 *)xs, (const bf16 *)a->up->dev,
		  uu, (const int32_t *)offs, (const int32_t *)tiles, d.ne, d.F, d.E);
	cu_launch(cb, k_silu_mul_bf16, 4096, 256, 0, act, (const bf16 *)gg, (const bf16 *)uu, n * F);
	cu_launch(cb, k_moe_ggemm<float>, dim3(max_tiles, d.E / GG_TILE), 128, 0, (const bf16 *)act,
		  (const bf16 *)a->down->dev, y, (const int32_t *)offs, (const int32_t *)tiles, d.ne, d.E, d.F);
	cu_launched(cb, "moe expert gemm");
	/* the shared expert: dense over all tokens */
	if (d.Fs) {
		struct toast_mm_out og = {sgf, TOAST_MM_F32, a->sh_gate}, ou = {suf, TOAST_MM_F32, a->sh_up};
		cu_cublas(cb, &og, hb, d.T);
		cu_cublas(cb, &ou, hb, d.T);
		cu_swiglu(cb, sact, sgf, suf, d.T, d.Fs);
		struct toast_mm_out od = {ys, TOAST_MM_F32, a->sh_down};
		cu_cublas(cb, &od, sact, d.T);
	}
	cu_launch(cb, k_moe_combine, d.T, 256, 0, a->x, d.E, d.k, (const int32_t *)inv, (const float *)wt, (const float *)y,
		  (const float *)(d.Fs ? ys : NULL), (const float *)(sgw ? sgate : NULL));
	cu_launched(cb, "moe combine");
}

void cu_moe(struct cuda_backend *cb, const struct toast_moe_args *a)
{
	moe_dims d;
	d.T = a->T, d.E = a->n_embd, d.ne = a->n_expert, d.k = a->n_expert_used, d.F = a->n_ff;
	d.Fs = a->sh_gate ? a->n_ff_sh : 0, d.Fmax = ((d.F > d.Fs ? d.F : d.Fs) + 7) / 8 * 8;
	d.norm_topk = a->norm_topk;
	if (d.k > MOE_MAX_K || d.k > d.ne) {
		cu_fail_msg(cb, "moe: %d experts per token is not supported", d.k);
		return;
	}
	/* the grouped path tiles 64 x 64 with 32-wide k steps of 16-byte loads */
	if (d.T > CU_GEMV_MAX_T && d.E % GG_TILE == 0 && d.F % GG_TILE == 0) {
		cu_moe_grouped(cb, a, d);
		return;
	}
	size_t T = (size_t)d.T, n_h = T * d.E, n_log = T * d.ne, n_sel = T * d.k, n_act = T * (d.k + 1) * d.Fmax;
	char *scr = (char *)cu_scratch(cb, (n_act + n_h + n_log + 2 * n_sel + T) * 4);
	if (!scr)
		return;
	float *act = (float *)scr, *h = act + n_act, *logits = h + n_h;
	int32_t *sel = (int32_t *)(logits + n_log);
	float *wt = (float *)(sel + n_sel), *sgate = wt + n_sel;
	const float *sgw = a->sh_gate_inp ? (const float *)a->sh_gate_inp->dev : NULL;
	size_t route_smem = (n_h + d.ne) * 4;
	if (d.T <= CU_GEMV_MAX_T && route_smem <= 48 * 1024 && a->router->dev_type == TOAST_DT_BF16) {
		unsigned nb = cu_blocks((size_t)d.ne, MOE_WARPS);
		const float *nw = (const float *)a->norm_w->dev;
		const bf16 *R = (const bf16 *)a->router->dev;
		if (d.E == 2048)
			cu_launch(cb, k_moe_route<8>, nb, MOE_WARPS * 32, route_smem, d, a->x, nw, a->eps, a->plus_one, R, sgw, h,
										     logits, sel, wt, sgate, cb->counters);
		else
			cu_launch(cb, k_moe_route<0>, nb, MOE_WARPS * 32, route_smem, d, a->x, nw, a->eps, a->plus_one, R, sgw, h,
										     logits, sel, wt, sgate, cb->counters);
		cu_launched(cb, "moe route");
	} else {
		cu_norm_rows(cb, a->x, a->norm_w, d.T, d.E, a->eps, a->plus_one, h, NULL, NULL);
		cu_gemv_f32(cb, logits, h, a->router, d.T); /* router logits from the f32 input */
		cu_launch(cb, k_moe_topk, d.T, 256, d.ne * 4, d, h, logits, sgw, sel, wt, sgate);
		cu_launched(cb, "moe top-k");
	}
	size_t hsm = (size_t)d.E * 4, asm_ = (size_t)(d.k + 1) * d.Fmax * 4;
	if (hsm > 48 * 1024 || asm_ > 48 * 1024) {
		cu_fail_msg(cb, "moe: n_embd %d or %d x %d expert rows are too large", d.E, d.k + 1, d.Fmax);
		return;
	}
	dim3 g1(cu_blocks((size_t)d.Fmax, MOE_WARPS), d.k + (d.Fs ? 1 : 0), d.T);
	const bf16 *G = (const bf16 *)a->gate->dev, *U = (const bf16 *)a->up->dev;
	const bf16 *SG = d.Fs ? (const bf16 *)a->sh_gate->dev : NULL, *SU = d.Fs ? (const bf16 *)a->sh_up->dev : NULL;
	int ple = d.E % 256 == 0 ? d.E / 256 : 0;
	if (ple == 8)
		cu_launch(cb, k_moe_gateup<8>, g1, MOE_WARPS * 32, hsm, d, h, G, U, sel, SG, SU, act);
	else if (ple == 4)
		cu_launch(cb, k_moe_gateup<4>, g1, MOE_WARPS * 32, hsm, d, h, G, U, sel, SG, SU, act);
	else if (ple == 2)
		cu_launch(cb, k_moe_gateup<2>, g1, MOE_WARPS * 32, hsm, d, h, G, U, sel, SG, SU, act);
	else if (ple == 1)
		cu_launch(cb, k_moe_gateup<1>, g1, MOE_WARPS * 32, hsm, d, h, G, U, sel, SG, SU, act);
	else
		cu_launch(cb, k_moe_gateup<0>, g1, MOE_WARPS * 32, hsm, d, h, G, U, sel, SG, SU, act);
	cu_launched(cb, "moe gate/up");
	dim3 g2(cu_blocks((size_t)d.E, MOE_WARPS), d.T);
	const bf16 *D = (const bf16 *)a->down->dev, *SD = d.Fs ? (const bf16 *)a->sh_down->dev : NULL;
	const float *sgp = a->sh_gate_inp ? sgate : NULL;
	int plf = d.F % 256 == 0 && (!d.Fs || d.Fs == d.F) && d.k + (d.Fs ? 1 : 0) <= MOE_DOWN_SLOTS ? d.F / 256 : 0;
	if (plf == 2)
		cu_launch(cb, k_moe_down<2>, g2, MOE_WARPS * 32, asm_, d, a->x, D, sel, wt, SD, sgp, act);
	else if (plf == 1)
		cu_launch(cb, k_moe_down<1>, g2, MOE_WARPS * 32, asm_, d, a->x, D, sel, wt, SD, sgp, act);
	else
		cu_launch(cb, k_moe_down<0>, g2, MOE_WARPS * 32, asm_, d, a->x, D, sel, wt, SD, sgp, act);
	cu_launched(cb, "moe down");
}
