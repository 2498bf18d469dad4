/*
 * k_moe.cu - mixture of experts with optional shared expert (contract: toast_moe_args).
 *
 * Router logits (GEMV or cuBLAS), then one block per token does softmax + top-k (+ renorm) and
 * the shared expert's sigmoid gate, leaving expert ids and weights in device memory; the
 * expert kernels read them there, so a recorded decode step is valid whatever the router
 * picks. Gate/up: one warp per (row, slot, token) for the routed experts and the shared one;
 * down: one warp per output row summing every slot in order, added to the residual.
 */
#include "backend/cuda/cuda_common.cuh"

#define MOE_MAX_K 64

__global__ void k_moe_topk(const float *logits, int ne, int k, int norm, const bf16 *h, const bf16 *h_lo,
			   const float *sgw, int E,
			   int32_t *sel, float *wt, float *sgate)
{
	__shared__ float red[32];
	__shared__ float sv[32];
	__shared__ int si[32];
	__shared__ int chosen[MOE_MAX_K];
	int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
	const float *l = logits + (size_t)t * ne;
	float mx = -INFINITY;
	for (int e = tid; e < ne; e += blockDim.x)
		mx = fmaxf(mx, l[e]);
	mx = cu_warp_max(mx);
	if (lane == 0)
		red[warp] = mx;
	__syncthreads();
	mx = -INFINITY;
	for (int w = 0; w < nw; w++)
		mx = fmaxf(mx, red[w]);
	__syncthreads();
	float sum = 0;
	for (int e = tid; e < ne; e += blockDim.x)
		sum += __expf(l[e] - mx);
	sum = cu_block_sum(sum, red);
	float tot = 0;
	for (int j = 0; j < k; j++) {
		/* argmax over the experts not chosen yet; ties to the lower index */
		float bv = -INFINITY;
		int bi = ne;
		for (int e = tid; e < ne; e += blockDim.x) {
			bool taken = false;
			for (int i = 0; i < j; i++)
				taken |= chosen[i] == e;
			if (!taken && (l[e] > bv || (l[e] == bv && e < bi))) {
				bv = l[e];
				bi = e;
			}
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
			sv[warp] = bv;
			si[warp] = bi;
		}
		__syncthreads();
		if (tid == 0) {
			float b = -INFINITY;
			int ix = ne;
			for (int w = 0; w < nw; w++)
				if (sv[w] > b || (sv[w] == b && si[w] < ix)) {
					b = sv[w];
					ix = si[w];
				}
			chosen[j] = ix;
		}
		__syncthreads();
		float p = __expf(l[chosen[j]] - mx) / sum;
		tot += p;
		if (tid == 0) {
			sel[(size_t)t * k + j] = chosen[j];
			wt[(size_t)t * k + j] = p;
		}
	}
	if (norm && tid == 0)
		for (int j = 0; j < k; j++)
			wt[(size_t)t * k + j] /= tot;
	if (sgate) {
		float d = 0;
		for (int i = tid; i < E; i += blockDim.x)
			d += sgw[i] * (__bfloat162float(h[(size_t)t * E + i]) +
				       (h_lo ? __bfloat162float(h_lo[(size_t)t * E + i]) : 0.0f));
		d = cu_block_sum(d, red);
		if (tid == 0)
			sgate[t] = cu_sigmoid(d);
	}
}

__device__ __forceinline__ float moe_dot(const bf16 *w, const bf16 *x, int n, int lane)
{
	float acc = 0;
	if ((n & 7) == 0) {
		for (int i = lane; i < n / 8; i += 32) {
			float fw[8], fx[8];
			cu_bf16x8(__ldg((const uint4 *)w + i), fw);
			cu_bf16x8(__ldg((const uint4 *)x + i), fx);
#pragma unroll
			for (int q = 0; q < 8; q++)
				acc = fmaf(fw[q], fx[q], acc);
		}
	} else {
		for (int i = lane; i < n; i += 32)
			acc += __bfloat162float(w[i]) * __bfloat162float(x[i]);
	}
	return cu_warp_sum(acc);
}

/* act[t][slot][r] = SiLU(gate·h) * (up·h); slot k is the shared expert */
__global__ void k_moe_gateup(const bf16 *h, int E, const bf16 *gate, const bf16 *up, int F, const int32_t *sel, int k,
			     const bf16 *sg, const bf16 *su, int Fs, float *act, int Fmax)
{
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int r = blockIdx.x * (blockDim.x >> 5) + warp, slot = blockIdx.y, t = blockIdx.z;
	bool shared = slot == k;
	int n = shared ? Fs : F;
	if (r >= n)
		return;
	const bf16 *G, *U;
	if (shared) {
		G = sg + (size_t)r * E;
		U = su + (size_t)r * E;
	} else {
		size_t e = (size_t)sel[(size_t)t * k + slot];
		G = gate + (e * F + r) * E;
		U = up + (e * F + r) * E;
	}
	const bf16 *x = h + (size_t)t * E;
	float g = moe_dot(G, x, E, lane), u = moe_dot(U, x, E, lane);
	if (lane == 0)
		act[((size_t)t * (k + 1) + slot) * Fmax + r] = cu_silu(g) * u;
}

__device__ __forceinline__ float moe_dot_f(const bf16 *w, const float *x, int n, int lane)
{
	float acc = 0;
	if ((n & 7) == 0) {
		for (int i = lane; i < n / 8; i += 32) {
			float fw[8];
			cu_bf16x8(__ldg((const uint4 *)w + i), fw);
			const float4 *xv = (const float4 *)(x + i * 8);
			float4 a = xv[0], b = xv[1];
			acc += fw[0] * a.x + fw[1] * a.y + fw[2] * a.z + fw[3] * a.w + fw[4] * b.x + fw[5] * b.y + fw[6] * b.z +
			       fw[7] * b.w;
		}
	} else {
		for (int i = lane; i < n; i += 32)
			acc += __bfloat162float(w[i]) * x[i];
	}
	return cu_warp_sum(acc);
}

/* x[t][i] += sum over slots of weight * down_slot[i] · act[t][slot] */
__global__ void k_moe_down(float *x, int E, const bf16 *down, int F, const int32_t *sel, const float *wt, int k,
			   const bf16 *sd, int Fs, const float *sgate, const float *act, int Fmax)
{
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int i = blockIdx.x * (blockDim.x >> 5) + warp, t = blockIdx.y;
	if (i >= E)
		return;
	float acc = 0;
	for (int s = 0; s < k; s++) {
		size_t e = (size_t)sel[(size_t)t * k + s];
		float d = moe_dot_f(down + (e * E + i) * F, act + ((size_t)t * (k + 1) + s) * Fmax, F, lane);
		acc += wt[(size_t)t * k + s] * d;
	}
	if (sd) {
		float d = moe_dot_f(sd + (size_t)i * Fs, act + ((size_t)t * (k + 1) + k) * Fmax, Fs, lane);
		acc += (sgate ? sgate[t] : 1.0f) * d;
	}
	if (lane == 0)
		x[(size_t)t * E + i] += acc;
}

void cu_moe(struct cuda_backend *cb, const struct toast_moe_args *a)
{
	int T = a->T, ne = a->n_expert, k = a->n_expert_used, E = a->n_embd, F = a->n_ff;
	int Fs = a->sh_gate ? a->n_ff_sh : 0, Fmax = ((F > Fs ? F : Fs) + 7) / 8 * 8; /* rows 32-byte aligned */
	if (k > MOE_MAX_K || k > ne) {
		cu_fail_msg(cb, "moe: %d experts per token is not supported", k);
		return;
	}
	/* scratch: act first (its rows are read as float4), then logits, sel, wt, sgate */
	size_t n_log = (size_t)T * ne, n_sel = (size_t)T * k, n_act = (size_t)T * (k + 1) * Fmax;
	char *scr = (char *)cu_scratch(cb, (n_act + n_log + 2 * n_sel + (size_t)T) * 4);
	if (!scr)
		return;
	float *act = (float *)scr, *logits = act + n_act;
	int32_t *sel = (int32_t *)(logits + n_log);
	float *wt = (float *)(sel + n_sel), *sgate = wt + n_sel;
	cu_matmul(cb, logits, TOAST_MM_F32, (const bf16 *)a->h, a->router, T);
	if (a->h_lo) /* route on h + h_lo: what rounding h to bf16 lost */
		cu_matmul(cb, logits, TOAST_MM_ADD, (const bf16 *)a->h_lo, a->router, T);
	k_moe_topk<<<T, 256, 0, cb->stream>>>(logits, ne, k, a->norm_topk, (const bf16 *)a->h, (const bf16 *)a->h_lo,
					       a->sh_gate_inp ? (const float *)a->sh_gate_inp->dev : NULL, E, sel, wt,
					       a->sh_gate_inp ? sgate : NULL);
	cu_launched(cb, "moe top-k");
	dim3 g1(cu_blocks((size_t)Fmax, 8), k + (Fs ? 1 : 0), T);
	k_moe_gateup<<<g1, 256, 0, cb->stream>>>((const bf16 *)a->h, E, (const bf16 *)a->gate->dev, (const bf16 *)a->up->dev,
						  F, sel, k, Fs ? (const bf16 *)a->sh_gate->dev : NULL,
						  Fs ? (const bf16 *)a->sh_up->dev : NULL, Fs, act, Fmax);
	cu_launched(cb, "moe gate/up");
	dim3 g2(cu_blocks((size_t)E, 8), T);
	k_moe_down<<<g2, 256, 0, cb->stream>>>(a->x, E, (const bf16 *)a->down->dev, F, sel, wt, k,
						Fs ? (const bf16 *)a->sh_down->dev : NULL, Fs, a->sh_gate_inp ? sgate : NULL,
						act, Fmax);
	cu_launched(cb, "moe down");
}
