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

/* the same by one warp with the logits in registers (ne <= 32 * MOE_WARP_TOPK): no block barriers */
#define MOE_WARP_TOPK 32
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
	float tot = 0;
	for (int j = 0; j < d.k; j++) {
		float bv = -INFINITY;
		int bi = 1 << 30;
#pragma unroll
		for (int i = 0; i < MOE_WARP_TOPK; i++)
			if (v[i] > bv) { /* increasing index within the lane: the first maximum wins */
				bv = v[i];
				bi = lane + 32 * i;
			}
		for (int o = 16; o > 0; o >>= 1) {
			float ov = __shfl_xor_sync(0xffffffffu, bv, o);
			int oi = __shfl_xor_sync(0xffffffffu, bi, o);
			if (ov > bv || (ov == bv && oi < bi)) {
				bv = ov;
				bi = oi;
			}
		}
#pragma unroll
		for (int i = 0; i < MOE_WARP_TOPK; i++)
			if (bi == lane + 32 * i)
				v[i] = -INFINITY;
		float p = __expf(bv - mx) / sum;
		tot += p;
		if (lane == 0) {
			sel[j] = bi;
			wt[j] = p;
		}
	}
	if (d.norm_topk && lane == 0)
		for (int j = 0; j < d.k; j++)
			wt[j] /= tot;
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

/* decode: norm + router + (last block) top-k. smem: hs [T][E] then ne floats for the top-k */
__global__ void __launch_bounds__(MOE_WARPS * 32)
	k_moe_route(moe_dims d, const float *x, const float *nw, float eps, int plus_one, const bf16 *R, const float *sgw,
		    float *h, float *logits, int32_t *sel, float *wt, float *sgate, unsigned *counter)
{
	extern __shared__ float hs[];
	__shared__ float red[32];
	__shared__ unsigned ticket;
	int E = d.E;
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
	/* one router row per warp: many warps in flight, 16-byte loads when the rows allow */
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int e = blockIdx.x * MOE_WARPS + warp;
	if (e < d.ne) {
		const bf16 *w = R + (size_t)e * E;
		float acc[CU_GEMV_MAX_T] = {0};
		if ((E & 7) == 0) {
#pragma unroll 4
			for (int i = lane; i < E / 8; i += 32) {
				float f[8];
				cu_bf16x8(__ldg((const uint4 *)w + i), f);
				for (int t = 0; t < d.T; t++)
#pragma unroll
					for (int q = 0; q < 8; q++)
						acc[t] += f[q] * hs[t * E + i * 8 + q];
			}
		} else {
			for (int i = lane; i < E; i += 32)
				for (int t = 0; t < d.T; t++)
					acc[t] += __bfloat162float(w[i]) * hs[t * E + i];
		}
		for (int t = 0; t < d.T; t++) {
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

/* act[t][slot][r] = SiLU(gate·h) * (up·h), one r per warp; slot k is the shared expert */
__global__ void __launch_bounds__(MOE_WARPS * 32)
	k_moe_gateup(moe_dims d, const float *h, const bf16 *gate, const bf16 *up, const int32_t *sel, const bf16 *sg,
		     const bf16 *su, float *act)
{
	extern __shared__ float hs[];
	int slot = blockIdx.y, t = blockIdx.z, E = d.E;
	for (int i = threadIdx.x; i < E; i += blockDim.x)
		hs[i] = h[(size_t)t * E + i];
	__syncthreads();
	bool shared = slot == d.k;
	int n = shared ? d.Fs : d.F;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int r = blockIdx.x * MOE_WARPS + warp;
	if (r >= n)
		return;
	size_t e = shared ? 0 : (size_t)sel[(size_t)t * d.k + slot];
	const bf16 *g = (shared ? sg : gate + e * d.F * E) + (size_t)r * E;
	const bf16 *u = (shared ? su : up + e * d.F * E) + (size_t)r * E;
	float a = 0, b = 0;
	if ((E & 7) == 0) {
#pragma unroll 4
		for (int i = lane; i < E / 8; i += 32) {
			float fg[8], fu[8];
			cu_bf16x8(__ldg((const uint4 *)g + i), fg);
			cu_bf16x8(__ldg((const uint4 *)u + i), fu);
			const float4 *xv = (const float4 *)(hs + i * 8);
			float4 x0 = xv[0], x1 = xv[1];
			a += fg[0] * x0.x + fg[1] * x0.y + fg[2] * x0.z + fg[3] * x0.w + fg[4] * x1.x + fg[5] * x1.y + fg[6] * x1.z +
			     fg[7] * x1.w;
			b += fu[0] * x0.x + fu[1] * x0.y + fu[2] * x0.z + fu[3] * x0.w + fu[4] * x1.x + fu[5] * x1.y + fu[6] * x1.z +
			     fu[7] * x1.w;
		}
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

/* x[t][i] += sum over slots of weight * down_slot[i] · act[t][slot], one row i per warp, the
 * slots' loads issued together */
__global__ void __launch_bounds__(MOE_WARPS * 32)
	k_moe_down(moe_dims d, float *x, const bf16 *down, const int32_t *sel, const float *wt, const bf16 *sd,
		   const float *sgate, const float *act)
{
	extern __shared__ float as[];
	__shared__ const bf16 *rows_base[MOE_MAX_K + 1];
	__shared__ float wts[MOE_MAX_K + 1];
	int t = blockIdx.y, E = d.E, nslot = d.k + (sd ? 1 : 0);
	for (int i = threadIdx.x; i < nslot * d.Fmax; i += blockDim.x)
		as[i] = act[(size_t)t * (d.k + 1) * d.Fmax + i];
	for (int s = threadIdx.x; s < nslot; s += blockDim.x) {
		bool shared = s == d.k;
		rows_base[s] = shared ? sd : down + (size_t)sel[(size_t)t * d.k + s] * E * d.F;
		wts[s] = shared ? (sgate ? sgate[t] : 1.0f) : wt[(size_t)t * d.k + s];
	}
	__syncthreads();
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int i = blockIdx.x * MOE_WARPS + warp;
	if (i >= E)
		return;
	float acc = 0;
	bool vec = (d.F & 7) == 0 && (d.Fs & 7) == 0;
#pragma unroll 4
	for (int s = 0; s < nslot; s++) {
		int F = s == d.k ? d.Fs : d.F;
		const bf16 *w = rows_base[s] + (size_t)i * F;
		const float *a = as + s * d.Fmax;
		float p = 0;
		if (vec) {
			for (int q8 = lane; q8 < F / 8; q8 += 32) {
				float f[8];
				cu_bf16x8(__ldg((const uint4 *)w + q8), f);
				const float4 *av = (const float4 *)(a + q8 * 8);
				float4 a0 = av[0], a1 = av[1];
				p += f[0] * a0.x + f[1] * a0.y + f[2] * a0.z + f[3] * a0.w + f[4] * a1.x + f[5] * a1.y + f[6] * a1.z +
				     f[7] * a1.w;
			}
		} else {
			for (int q = lane; q < F; q += 32)
				p += __bfloat162float(w[q]) * a[q];
		}
		acc += wts[s] * p;
	}
	acc = cu_warp_sum(acc);
	if (lane == 0)
		x[(size_t)t * E + i] += acc;
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
	size_t T = (size_t)d.T, n_h = T * d.E, n_log = T * d.ne, n_sel = T * d.k, n_act = T * (d.k + 1) * d.Fmax;
	char *scr = (char *)cu_scratch(cb, (n_act + n_h + n_log + 2 * n_sel + T) * 4);
	if (!scr)
		return;
	float *act = (float *)scr, *h = act + n_act, *logits = h + n_h;
	int32_t *sel = (int32_t *)(logits + n_log);
	float *wt = (float *)(sel + n_sel), *sgate = wt + n_sel;
	const float *sgw = a->sh_gate_inp ? (const float *)a->sh_gate_inp->dev : NULL;
	size_t route_smem = (n_h + d.ne) * 4;
	static size_t route_room;
	if (!route_room)
		route_room = cu_allow_smem(cb, (const void *)k_moe_route);
	if (d.T <= CU_GEMV_MAX_T && route_smem <= route_room && a->router->dev_type == TOAST_DT_BF16) {
		k_moe_route<<<cu_blocks((size_t)d.ne, MOE_WARPS), MOE_WARPS * 32, route_smem, cb->stream>>>(
			d, a->x, (const float *)a->norm_w->dev, a->eps, a->plus_one, (const bf16 *)a->router->dev, sgw, h,
			logits, sel, wt, sgate, cb->counters);
		cu_launched(cb, "moe route");
	} else {
		cu_norm_rows(cb, a->x, a->norm_w, d.T, d.E, a->eps, a->plus_one, h, NULL);
		cu_gemv_f32(cb, logits, h, a->router, d.T); /* router logits from the f32 input */
		k_moe_topk<<<d.T, 256, d.ne * 4, cb->stream>>>(d, h, logits, sgw, sel, wt, sgate);
		cu_launched(cb, "moe top-k");
	}
	size_t hsm = (size_t)d.E * 4;
	dim3 g1(cu_blocks((size_t)d.Fmax, MOE_WARPS), d.k + (d.Fs ? 1 : 0), d.T);
	k_moe_gateup<<<g1, MOE_WARPS * 32, hsm, cb->stream>>>(d, h, (const bf16 *)a->gate->dev, (const bf16 *)a->up->dev,
							     sel, d.Fs ? (const bf16 *)a->sh_gate->dev : NULL,
							     d.Fs ? (const bf16 *)a->sh_up->dev : NULL, act);
	cu_launched(cb, "moe gate/up");
	size_t asm_ = (size_t)(d.k + 1) * d.Fmax * 4;
	static size_t up_room, down_room;
	if (!up_room) {
		up_room = cu_allow_smem(cb, (const void *)k_moe_gateup);
		down_room = cu_allow_smem(cb, (const void *)k_moe_down);
	}
	if (hsm > up_room || asm_ > down_room) {
		cu_fail_msg(cb, "moe: n_embd %d or %d x %d expert rows need more shared memory than the GPU has", d.E, d.k + 1,
			    d.Fmax);
		return;
	}
	dim3 g2(cu_blocks((size_t)d.E, MOE_WARPS), d.T);
	k_moe_down<<<g2, MOE_WARPS * 32, asm_, cb->stream>>>(d, a->x, (const bf16 *)a->down->dev, sel, wt,
							      d.Fs ? (const bf16 *)a->sh_down->dev : NULL,
							      a->sh_gate_inp ? sgate : NULL, act);
	cu_launched(cb, "moe down");
}
