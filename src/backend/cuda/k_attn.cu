/*
 * k_attn.cu - gated attention with a bf16 KV cache (contract: toast_attn_args in backend.h).
 *
 * Three kernels: prep (q/k RMSNorm, partial NeoX RoPE, K/V appended to the cache), a split-K
 * flash-decoding pass (grid: KV head x split x query token; each block serves all query heads
 * of its KV head, so a K/V row is read once for the group; online softmax per warp), and a
 * combine pass that merges the splits and applies the sigmoid output gate. The split count
 * depends only on the cache size, never on pos, so a recorded decode step stays valid while
 * the context grows: empty splits just report nothing.
 */
#include "backend/cuda/cuda_common.cuh"

#define ATTN_WARPS 4
#define ATTN_MAX_REP 8  /* query heads handled per pass over the keys */
#define ATTN_MAX_DPL 8  /* head_dim <= 256 */

__global__ void k_attn_prep(const float *q, const float *k, const float *v, const float *qn, const float *kn,
			    int plus_one, float eps, int n_head, int n_kv, int hd, int n_rot, float theta, int freq_type,
			    int gated, bf16 *kc, bf16 *vc, float *qout, const int32_t *step)
{
	__shared__ float red[32];
	extern __shared__ float sh[];
	int t = blockIdx.x, hh = blockIdx.y, d = threadIdx.x;
	int pos = step[0] + t;
	bool isq = hh < n_head;
	int kvh = hh - n_head, kvd = n_kv * hd, qs = gated ? 2 * hd : hd;
	float x = 0;
	if (d < hd)
		x = isq ? q[((size_t)t * n_head + hh) * qs + d] : k[(size_t)t * kvd + kvh * hd + d];
	const float *nw = isq ? qn : kn;
	if (nw) {
		float ss = cu_block_sum(x * x, red);
		float r = rsqrtf(ss / hd + eps);
		if (d < hd)
			x = x * r * (plus_one ? 1.0f + nw[d] : nw[d]);
	}
	if (d < hd)
		sh[d] = x;
	__syncthreads();
	int half = n_rot / 2;
	if (d < n_rot) {
		int i = d < half ? d : d - half;
		float inv = 1.0f / powf(theta, (float)(2 * i) / (float)n_rot);
		if (freq_type == TOAST_DT_BF16)
			inv = __bfloat162float(__float2bfloat16(inv));
		else if (freq_type == TOAST_DT_F16)
			inv = __half2float(__float2half(inv));
		float s, c;
		sincosf((float)pos * inv, &s, &c);
		x = d < half ? sh[d] * c - sh[d + half] * s : sh[d] * c + sh[d - half] * s;
	}
	if (d >= hd)
		return;
	if (isq) {
		qout[((size_t)t * n_head + hh) * hd + d] = x;
	} else {
		kc[(size_t)pos * kvd + kvh * hd + d] = __float2bfloat16(x);
		vc[(size_t)pos * kvd + kvh * hd + d] = __float2bfloat16(v[(size_t)t * kvd + kvh * hd + d]);
	}
}

/* partial results: per (t, kv head, split, rep) hd accumulators then m and l */
template <int DPL>
__global__ void __launch_bounds__(ATTN_WARPS * 32)
	k_attn_split(const float *qf, const bf16 *kc, const bf16 *vc, float *part, int n_head, int n_kv, int hd,
		     int n_split, const int32_t *step)
{
	__shared__ float sm[ATTN_WARPS][ATTN_MAX_REP][ATTN_MAX_DPL * 32 + 2];
	int kvh = blockIdx.x, split = blockIdx.y, t = blockIdx.z;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int n_rep = n_head / n_kv, kvd = n_kv * hd;
	int L = step[0] + t + 1; /* keys this query sees */
	int chunk = (L + n_split - 1) / n_split;
	int j0 = split * chunk, j1 = min(L, j0 + chunk);
	float scale = rsqrtf((float)hd);
	for (int r0 = 0; r0 < n_rep; r0 += ATTN_MAX_REP) {
		int nr = min(ATTN_MAX_REP, n_rep - r0);
		float qv[ATTN_MAX_REP][DPL], acc[ATTN_MAX_REP][DPL], m[ATTN_MAX_REP], l[ATTN_MAX_REP];
#pragma unroll
		for (int r = 0; r < ATTN_MAX_REP; r++) {
			m[r] = -INFINITY;
			l[r] = 0;
#pragma unroll
			for (int i = 0; i < DPL; i++) {
				int d = lane * DPL + i;
				acc[r][i] = 0;
				qv[r][i] = r < nr && d < hd ? qf[((size_t)t * n_head + kvh * n_rep + r0 + r) * hd + d] * scale : 0.0f;
			}
		}
		for (int j = j0 + warp; j < j1; j += ATTN_WARPS) {
			const bf16 *kr = kc + (size_t)j * kvd + kvh * hd, *vr = vc + (size_t)j * kvd + kvh * hd;
			float kf[DPL], vf[DPL];
			if (DPL * 32 == hd && DPL == 8) {
				cu_bf16x8(*(const uint4 *)(kr + lane * 8), kf);
				cu_bf16x8(*(const uint4 *)(vr + lane * 8), vf);
			} else {
#pragma unroll
				for (int i = 0; i < DPL; i++) {
					int d = lane * DPL + i;
					kf[i] = d < hd ? __bfloat162float(kr[d]) : 0.0f;
					vf[i] = d < hd ? __bfloat162float(vr[d]) : 0.0f;
				}
			}
#pragma unroll
			for (int r = 0; r < ATTN_MAX_REP; r++) {
				if (r >= nr)
					break;
				float s = 0;
#pragma unroll
				for (int i = 0; i < DPL; i++)
					s = fmaf(qv[r][i], kf[i], s);
				s = cu_warp_sum(s);
				float mn = fmaxf(m[r], s), corr = __expf(m[r] - mn), p = __expf(s - mn);
				l[r] = l[r] * corr + p;
#pragma unroll
				for (int i = 0; i < DPL; i++)
					acc[r][i] = acc[r][i] * corr + p * vf[i];
				m[r] = mn;
			}
		}
		/* merge the warps of the block */
		for (int r = 0; r < nr; r++) {
#pragma unroll
			for (int i = 0; i < DPL; i++)
				sm[warp][r][lane * DPL + i] = acc[r][i];
			if (lane == 0) {
				sm[warp][r][ATTN_MAX_DPL * 32] = m[r];
				sm[warp][r][ATTN_MAX_DPL * 32 + 1] = l[r];
			}
		}
		__syncthreads();
		for (int idx = threadIdx.x; idx < nr * (hd + 2); idx += blockDim.x) {
			int r = idx / (hd + 2), d = idx % (hd + 2);
			float mt = -INFINITY;
			for (int w = 0; w < ATTN_WARPS; w++)
				mt = fmaxf(mt, sm[w][r][ATTN_MAX_DPL * 32]);
			float v = 0;
			for (int w = 0; w < ATTN_WARPS; w++) {
				float mw = sm[w][r][ATTN_MAX_DPL * 32];
				float f = mw == -INFINITY ? 0.0f : __expf(mw - mt);
				v += f * (d < hd ? sm[w][r][d] : d == hd ? 0.0f : sm[w][r][ATTN_MAX_DPL * 32 + 1]);
			}
			if (d == hd)
				v = mt;
			size_t base = ((((size_t)t * n_kv + kvh) * n_split + split) * n_rep + r0 + r) * (hd + 2);
			part[base + d] = v;
		}
		__syncthreads();
	}
}

__global__ void k_attn_combine(const float *part, const float *q, bf16 *out, int n_head, int n_kv, int hd, int n_split,
			       int gated)
{
	int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
	int n_rep = n_head / n_kv, kvh = h / n_rep, r = h % n_rep;
	if (d >= hd)
		return;
	const float *p = part + ((((size_t)t * n_kv + kvh) * n_split) * n_rep + r) * (hd + 2);
	size_t stride = (size_t)n_rep * (hd + 2);
	float mt = -INFINITY;
	for (int s = 0; s < n_split; s++)
		mt = fmaxf(mt, p[s * stride + hd]);
	float num = 0, den = 0;
	for (int s = 0; s < n_split; s++) {
		float ms = p[s * stride + hd];
		if (ms == -INFINITY)
			continue;
		float f = __expf(ms - mt);
		num += f * p[s * stride + d];
		den += f * p[s * stride + hd + 1];
	}
	float o = num / den;
	if (gated)
		o *= cu_sigmoid(q[((size_t)t * n_head + h) * 2 * hd + hd + d]);
	out[((size_t)t * n_head + h) * hd + d] = __float2bfloat16(o);
}

void cu_attention(struct cuda_backend *cb, const struct toast_attn_args *a)
{
	int hd = a->head_dim, T = a->T, n_rep = a->n_head / a->n_head_kv;
	if (hd > ATTN_MAX_DPL * 32 || a->n_rot > hd) {
		cu_fail_msg(cb, "attention: head_dim %d is not supported (max %d)", hd, ATTN_MAX_DPL * 32);
		return;
	}
	/* splits: enough blocks to fill the GPU at decode, fixed by the cache size */
	int n_split = 1;
	if (T == 1) {
		n_split = a->n_ctx / 256;
		int cap = (2 * cb->n_sm + a->n_head_kv - 1) / a->n_head_kv;
		n_split = n_split < 1 ? 1 : n_split > cap ? cap : n_split;
	}
	size_t qbytes = (size_t)T * a->n_head * hd * 4;
	size_t pbytes = (size_t)T * a->n_head_kv * n_split * n_rep * (hd + 2) * 4;
	char *scr = (char *)cu_scratch(cb, qbytes + pbytes);
	if (!scr)
		return;
	float *qf = (float *)scr, *part = (float *)(scr + qbytes);
	int threads = (hd + 31) / 32 * 32;
	dim3 pg(T, a->n_head + a->n_head_kv);
	k_attn_prep<<<pg, threads, hd * sizeof(float), cb->stream>>>(
		a->q, a->k, a->v, a->q_norm ? (const float *)a->q_norm->dev : NULL,
		a->k_norm ? (const float *)a->k_norm->dev : NULL, a->norm_plus_one, a->eps, a->n_head, a->n_head_kv, hd,
		a->n_rot, a->rope_theta, a->rope_freq_type, a->gated, (bf16 *)a->k_cache, (bf16 *)a->v_cache, qf, cb->d_step);
	cu_launched(cb, "attention prep");
	dim3 sg(a->n_head_kv, n_split, T);
	int dpl = (hd + 31) / 32;
	if (dpl <= 2)
		k_attn_split<2><<<sg, ATTN_WARPS * 32, 0, cb->stream>>>(qf, (const bf16 *)a->k_cache, (const bf16 *)a->v_cache,
									  part, a->n_head, a->n_head_kv, hd, n_split, cb->d_step);
	else if (dpl <= 4)
		k_attn_split<4><<<sg, ATTN_WARPS * 32, 0, cb->stream>>>(qf, (const bf16 *)a->k_cache, (const bf16 *)a->v_cache,
									  part, a->n_head, a->n_head_kv, hd, n_split, cb->d_step);
	else
		k_attn_split<8><<<sg, ATTN_WARPS * 32, 0, cb->stream>>>(qf, (const bf16 *)a->k_cache, (const bf16 *)a->v_cache,
									  part, a->n_head, a->n_head_kv, hd, n_split, cb->d_step);
	cu_launched(cb, "attention");
	dim3 cg(T, a->n_head);
	k_attn_combine<<<cg, threads, 0, cb->stream>>>(part, a->q, (bf16 *)a->out, a->n_head, a->n_head_kv, hd,
							n_split, a->gated);
	cu_launched(cb, "attention combine");
}
