/*
 * k_attn.cu - gated attention with a KV cache of bf16 rows or 8-bit units (contract:
 * toast_attn_args and TOAST_KV_Q8 in backend.h).
 *
 * Three kernels: prep (q/k RMSNorm, partial NeoX RoPE, K/V appended to the cache), a split-K
 * flash-decoding pass (each block serves all query heads of its KV head, so a K/V row is read
 * once for the group; on tensor cores, k_attn_mma, at head_dim 64/128/256, else the SIMT
 * k_attn_tile), and a combine pass that merges the splits and applies the sigmoid output gate
 * (decode on tensor cores in one split, i.e. at short context, finishes in the split-K pass
 * instead, a block per 64 dims of the output). At decode the split count depends only on the
 * span the step is recorded for (or the cache size), never on pos, so a recorded step stays
 * valid while the context grows within it: empty splits just report nothing.
 */
#include "backend/cuda/cuda_common.cuh"

#define ATTN_MAX_DPL 8 /* head_dim <= 256 */

/* ---- the 8-bit cache (TOAST_KV_Q8, backend.h): units of TOAST_KV_UNIT tokens ---- */

/* value d of head h of token t, dequantised */
__device__ __forceinline__ float cu_kv8_at(const void *buf, int n_kv, int hd, bool is_v, int t, int h, int d)
{
	const unsigned char *b = (const unsigned char *)buf;
	int code = b[toast_kv_q8_code_at(n_kv, hd, is_v, t, h) + (size_t)d * (is_v ? TOAST_KV_UNIT : 1)];
	return (float)(code - 128) * *(const float *)(b + toast_kv_q8_scale_at(n_kv, hd, t, h));
}

/* the keys [x, y) of split sp of n_split over L keys, each split's share rounded up to whole
 * units of `unit` keys: one geometry for the attention kernels */
__device__ __forceinline__ int2 at_split_keys(int L, int n_split, int sp, int unit)
{
	int chunk = (L + n_split - 1) / n_split;
	chunk = (chunk + unit - 1) / unit * unit;
	return make_int2(sp * chunk, min(L, sp * chunk + chunk));
}

__global__ void k_attn_prep(const float *q, const float *k, const float *v, const float *qn, const float *kn,
			    int plus_one, float eps, int n_head, int n_kv, int hd, int n_rot, float theta, int freq_type,
			    int gated, void *kc, void *vc, int q8, float *qout, const int32_t *step)
{
	__shared__ float red[32];
	extern __shared__ float sh[];
	int t = blockIdx.x, hh = blockIdx.y, d = threadIdx.x;
	int pos = __ldcg(step) + t; /* uploaded before the step's first kernel */
	bool isq = hh < n_head;
	int kvh = hh - n_head, kvd = n_kv * hd, qs = gated ? 2 * hd : hd;
	/* before the wait, what depends on no kernel: the norm's weight and the rotation at pos */
	const float *nw = isq ? qn : kn;
	float w = nw && d < hd ? (plus_one ? 1.0f + nw[d] : nw[d]) : 0.0f, c = 1.0f, s = 0.0f;
	int half = n_rot / 2;
	if (d < n_rot) {
		int i = d < half ? d : d - half;
		float inv = 1.0f / powf(theta, (float)(2 * i) / (float)n_rot);
		if (freq_type == TOAST_DT_BF16)
			inv = __bfloat162float(__float2bfloat16(inv));
		else if (freq_type == TOAST_DT_F16)
			inv = __half2float(__float2half(inv));
		sincosf((float)pos * inv, &s, &c);
	}
	cu_pdl_wait();
	cu_pdl_trigger(); /* the decode grids here are one wave */
	float x = 0;
	if (d < hd)
		x = isq ? q[((size_t)t * n_head + hh) * qs + d] : k[(size_t)t * kvd + kvh * hd + d];
	if (nw) {
		float ss = cu_block_sum(x * x, red);
		float r = rsqrtf(ss / hd + eps);
		x = x * r * w;
	}
	if (d < hd)
		sh[d] = x;
	__syncthreads();
	if (d < n_rot)
		x = d < half ? sh[d] * c - sh[d + half] * s : sh[d] * c + sh[d - half] * s;
	float vx = !isq && d < hd ? v[(size_t)t * kvd + kvh * hd + d] : 0.0f, ka = 0, va = 0;
	if (q8 && !isq) { /* the head's largest |K| and |V| (every thread of the block) */
		ka = cu_block_max(d < hd ? fabsf(x) : 0.0f, red);
		va = cu_block_max(fabsf(vx), red);
	}
	if (d >= hd)
		return;
	if (isq) {
		qout[((size_t)t * n_head + hh) * hd + d] = x;
	} else if (!q8) {
		((bf16 *)kc)[(size_t)pos * kvd + kvh * hd + d] = __float2bfloat16(x);
		((bf16 *)vc)[(size_t)pos * kvd + kvh * hd + d] = __float2bfloat16(vx);
	} else {
		unsigned char *k8 = (unsigned char *)kc, *v8 = (unsigned char *)vc;
		k8[toast_kv_q8_code_at(n_kv, hd, false, pos, kvh) + d] = (unsigned char)toast_kv_q8_code(x, ka);
		v8[toast_kv_q8_code_at(n_kv, hd, true, pos, kvh) + (size_t)d * TOAST_KV_UNIT] =
			(unsigned char)toast_kv_q8_code(vx, va);
		if (d == 0) {
			size_t sc = toast_kv_q8_scale_at(n_kv, hd, pos, kvh);
			*(float *)(k8 + sc) = toast_kv_q8_scale(ka);
			*(float *)(v8 + sc) = toast_kv_q8_scale(va);
		}
	}
}

/*
 * The split-K pass. A block serves one KV head, one split of the keys and qt query tokens:
 * R = qt * n_rep query rows (row = token * n_rep + rep). Keys come in tiles of 32, one key per
 * lane: K and V are staged in shared memory as f32, each warp owns rows warp, warp + 8, ...,
 * a lane scores its key against the warp's row, the warp keeps that row's online softmax and
 * accumulates P·V with lanes over dims. Partial results per (token, kv head, split, rep):
 * hd accumulators, then the running max m and sum l.
 */
#define AT_WARPS 8
#define AT_TK 32

/* the K and V rows of a tile, 8 bf16 per uint4; hd % 8 == 0; at most AT_VEC per thread */
#define AT_VEC 4
__device__ __forceinline__ void at_fetch(const bf16 *kc, const bf16 *vc, int kvd, int kvh, int hd, int jt, int nk,
					 uint4 *kr, uint4 *vr)
{
	int per = hd / 8;
#pragma unroll
	for (int u = 0; u < AT_VEC; u++) {
		int x = threadIdx.x + u * blockDim.x, j = x / per, c = x % per;
		bool in = j < nk;
		kr[u] = in ? __ldg((const uint4 *)(kc + (size_t)(jt + j) * kvd + kvh * hd) + c) : make_uint4(0, 0, 0, 0);
		vr[u] = in ? __ldg((const uint4 *)(vc + (size_t)(jt + j) * kvd + kvh * hd) + c) : make_uint4(0, 0, 0, 0);
	}
}

template <int RPW, int DPL>
__global__ void __launch_bounds__(AT_WARPS * 32)
	k_attn_tile(const float *qf, const void *kcv, const void *vcv, int q8, float *part, int n_head, int n_kv, int hd,
		    int n_split, int qt, int T, const int32_t *step)
{
	extern __shared__ float sm[];
	int kvh = blockIdx.x, split = blockIdx.y, t0 = blockIdx.z * qt;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int n_rep = n_head / n_kv, kvd = n_kv * hd, hdp = hd + 4; /* K rows padded: float4 reads without bank conflicts */
	int ntok = min(qt, T - t0), R = ntok * n_rep;
	float *Ks = sm, *Vs = Ks + AT_TK * hdp, *Qs = Vs + AT_TK * hd;
	const bf16 *kc = (const bf16 *)kcv, *vc = (const bf16 *)vcv;
	int pos0 = step[0];
	int L = pos0 + t0 + ntok; /* keys the last query of the block sees */
	int2 jr = at_split_keys(L, n_split, split, 1);
	int j0 = jr.x, j1 = jr.y;
	float scale = rsqrtf((float)hd);
	for (int x = threadIdx.x; x < R * hd; x += blockDim.x) {
		int row = x / hd, d = x % hd;
		Qs[x] = qf[((size_t)(t0 + row / n_rep) * n_head + kvh * n_rep + row % n_rep) * hd + d] * scale;
	}
	float m[RPW], l[RPW], acc[RPW][DPL];
#pragma unroll
	for (int i = 0; i < RPW; i++) {
		m[i] = -INFINITY;
		l[i] = 0;
#pragma unroll
		for (int k = 0; k < DPL; k++)
			acc[i][k] = 0;
	}
	bool vec = !q8 && hd % 8 == 0; /* 16-byte loads and a prefetched next tile; else plain loads */
	uint4 kr[AT_VEC], vr[AT_VEC];
	if (vec && j0 < j1)
		at_fetch(kc, vc, kvd, kvh, hd, j0, min(AT_TK, j1 - j0), kr, vr);
	int per = hd / 8;
	for (int jt = j0; jt < j1; jt += AT_TK) {
		int nk = min(AT_TK, j1 - jt);
		__syncthreads(); /* the previous tile is no longer read */
		if (!vec)
			for (int x = threadIdx.x; x < AT_TK * hd; x += blockDim.x) {
				int j = x / hd, d = x % hd;
				bool in = j < nk;
				Ks[j * hdp + d] = !in ? 0.0f
						  : q8 ? cu_kv8_at(kcv, n_kv, hd, false, jt + j, kvh, d)
						       : __bfloat162float(kc[(size_t)(jt + j) * kvd + kvh * hd + d]);
				Vs[j * hd + d] = !in ? 0.0f
						 : q8 ? cu_kv8_at(vcv, n_kv, hd, true, jt + j, kvh, d)
						      : __bfloat162float(vc[(size_t)(jt + j) * kvd + kvh * hd + d]);
			}
#pragma unroll
		for (int u = 0; u < AT_VEC && vec; u++) {
			int x = threadIdx.x + u * blockDim.x, j = x / per, c = x % per;
			if (j < AT_TK) {
				float f[8];
				cu_bf16x8(kr[u], f);
				float4 *kd = (float4 *)(Ks + j * hdp + c * 8);
				kd[0] = make_float4(f[0], f[1], f[2], f[3]);
				kd[1] = make_float4(f[4], f[5], f[6], f[7]);
				cu_bf16x8(vr[u], f);
				float4 *vd = (float4 *)(Vs + j * hd + c * 8);
				vd[0] = make_float4(f[0], f[1], f[2], f[3]);
				vd[1] = make_float4(f[4], f[5], f[6], f[7]);
			}
		}
		__syncthreads();
		if (vec && jt + AT_TK < j1) /* the next tile's loads fly while this one is computed */
			at_fetch(kc, vc, kvd, kvh, hd, jt + AT_TK, min(AT_TK, j1 - jt - AT_TK), kr, vr);
#pragma unroll
		for (int i = 0; i < RPW; i++) {
			int row = warp + AT_WARPS * i;
			if (row >= R)
				break;
			int qpos = pos0 + t0 + row / n_rep, j = jt + lane;
			float s = -INFINITY;
			if (lane < nk && j <= qpos) {
				float v = 0;
				if (hd % 4 == 0) {
					const float4 *q = (const float4 *)(Qs + row * hd), *k = (const float4 *)(Ks + lane * hdp);
					for (int d = 0; d < hd / 4; d++) {
						float4 a = q[d], b = k[d];
						v += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
					}
				} else {
					for (int d = 0; d < hd; d++)
						v = fmaf(Qs[row * hd + d], Ks[lane * hdp + d], v);
				}
				s = v;
			}
			float mt = cu_warp_max(s), mn = fmaxf(m[i], mt);
			if (mn == -INFINITY)
				continue; /* nothing visible yet for this row */
			float corr = __expf(m[i] - mn), p = __expf(s - mn);
			l[i] = l[i] * corr + cu_warp_sum(p);
#pragma unroll
			for (int k = 0; k < DPL; k++)
				acc[i][k] *= corr;
			for (int jj = 0; jj < nk; jj++) {
				float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
				for (int k = 0; k < DPL; k++) {
					int d = lane + 32 * k;
					if (d < hd)
						acc[i][k] = fmaf(pj, Vs[jj * hd + d], acc[i][k]);
				}
			}
			m[i] = mn;
		}
	}
#pragma unroll
	for (int i = 0; i < RPW; i++) {
		int row = warp + AT_WARPS * i;
		if (row >= R)
			break;
		int t = t0 + row / n_rep, r = row % n_rep;
		float *dst = part + ((((size_t)t * n_kv + kvh) * n_split + split) * n_rep + r) * (hd + 2);
#pragma unroll
		for (int k = 0; k < DPL; k++) {
			int d = lane + 32 * k;
			if (d < hd)
				dst[d] = acc[i][k];
		}
		if (lane == 0) {
			dst[hd] = m[i];
			dst[hd + 1] = l[i];
		}
	}
}

/*
 * The split-K pass on tensor cores (head_dim 64, 128 or 256). Four warps; KW of them share 16
 * query rows and take a quarter (KW = 4: decode, up to 16 heads a KV head) or all (KW = 1:
 * prefill, 64 rows a block) of each tile of 64 keys. Rows are as in k_attn_tile (the query
 * heads of a KV head side by side, so they share every K/V tile). Per tile: S = Q·Kᵀ and
 * O += P·V on mma.m16n8k16 (bf16 in, f32 accumulate), the online softmax in f32 registers in
 * base 2 (Q is staged as bf16 pre-scaled by log2(e)/sqrt(hd)). Q, K and V tiles live in shared
 * memory in 16-byte chunks XOR-swizzled by row (ldmatrix without bank conflicts); K and V
 * arrive by cp.async: in prefill the next tile's K while this one's softmax and P·V run, the
 * next V while the next S runs; in decode through a ring of am_stages() tiles, all but one in
 * flight. Keys past the split are zero-filled (V too: 0 x garbage would be NaN). With KW > 1
 * the warps of a row group merge their softmax states through shared memory at the end.
 * The partials go to k_attn_combine like k_attn_tile's, with m in natural-log units; decode in
 * one split (FO) has no partials: D / 64 blocks a KV head each take 64 dims of P·V and write
 * them gated, as the combine would (at context 0 on an H100: 6.1 us a layer, where two blocks
 * and then the combine took 5.6 + 3.6: docs/PERF.md).
 */
#define AM_KEYS 64

template <int D>
__device__ __forceinline__ int am_swz(int row, int chunk)
{
	return row * D + ((chunk ^ (row & 7)) << 3);
}

/* keys jt.. (those from j1 on: zeros) of one KV head into a tile, by the block's 128 threads:
 * thread i takes chunk i % (D / 8) of rows i / (D / 8), .. every 128 / (D / 8) rows, its
 * addresses a stride apart; a tile wholly before j1 (all but a split's last) without the
 * per-row bound. (Computed from the index per chunk, the copies' addresses were ~600 of the
 * ~2,100 instructions each warp issued for a decode tile, and issuing bound the kernel at one
 * warp a scheduler: docs/PERF.md.) */
template <int D>
__device__ __forceinline__ void am_load_kv(bf16 *dst, const bf16 *src, int kvd, int kvh, int jt, int j1)
{
	constexpr int CPR = D / 8, RP = 128 / CPR; /* chunks a row, rows a pass */
	int r0 = threadIdx.x / CPR, ch = threadIdx.x % CPR;
	const bf16 *s = src + (size_t)(jt + r0) * kvd + kvh * D + ch * 8;
	unsigned d = cu_smem_addr(dst);
	if (jt + AM_KEYS <= j1) {
#pragma unroll 4
		for (int n = 0; n < AM_KEYS / RP; n++)
			cu_cp16(d + 2 * am_swz<D>(r0 + RP * n, ch), s + (size_t)RP * n * kvd, true);
		return;
	}
#pragma unroll 4
	for (int n = 0; n < AM_KEYS / RP; n++) {
		bool in = jt + r0 + RP * n < j1;
		cu_cp16(d + 2 * am_swz<D>(r0 + RP * n, ch), in ? s + (size_t)RP * n * kvd : src, in);
	}
}

/*
 * The 8-bit cache (Q8) on tensor cores. A tile stage holds the K codes [64 keys][D] (32-byte
 * spans XOR-swizzled by row, so the 8-byte loads below take two wavefronts a warp), the V codes
 * [16 units][D][4 keys] (as in the cache; 16-byte chunks XOR-swizzled by unit), then the tile's
 * 64 K scales and 64 V scales: am8_stage(D) bytes. Products are fp16 mma: a code pair becomes
 * an fp16 pair q + 1152 with one prmt (cu_q8_h2), the 1152s taken off in f32 (S: 1152 times the
 * row's sum of Q, found once; O: 1152 times the sum of P, summed by one more mma a k-step), Q is
 * staged in fp16, P is scaled by the V scales (times AM8_PV, undone at the end: fp16 keeps the
 * small weights normal; a V scale past 65504 / AM8_PV, |V| past ~130,000, would overflow).
 * Orders. A thread's 8-byte load of a K row (dims 32 sp + 8 c' .. + 7, c' = lane % 4) gives its B
 * fragments of k-steps 2 sp and 2 sp + 1: k-step 2 sp + j, k-position 2 c' + e holds dim
 * 32 sp + 8 c' + 4 j + e, and 8 + 2 c' + e dim .. + 2 + e; Q is staged in that order. Key
 * order: S's column n of n-tile nt is key 16 (nt / 2) + 4 (n / 2 % 4) + 2 (nt % 2) + n % 2
 * of the warp's, so that P·V's k-positions of a thread (2 c' + e, 8 + 2 c' + e) are the four
 * keys of its unit (unit 4 (nt / 2) + c'), one 32-bit word of V codes a dim.
 */
#define AM8_PV 64.0f

__host__ __device__ static constexpr size_t am8_stage(int D)
{
	return (size_t)2 * AM_KEYS * D + 2 * AM_KEYS * sizeof(float);
}

/* the byte offset of 32-byte span sp of K row r in a stage: the rows a half-warp reads together
 * (r = 4 (g / 2) + g % 2 + const, g < 4) in four bank groups */
template <int D>
__device__ __forceinline__ int am8_kswz(int r, int sp)
{
	int f = D == 64 ? (r >> 2) & 1 : ((r & 1) | ((r >> 1) & 2)) & (D / 32 - 1);
	return r * D + ((sp ^ f) << 5);
}

/* A thread's copies of the Q8 tiles (K codes and scales, V codes and scales of keys jt.., jt a
 * unit's first; keys from j1 on: zeros), addressed once a kernel: a tile adds its first unit's
 * offset, a pass a constant (computed per copy, the addresses were ~22 instructions a copy and
 * the copies ~370 of a decode tile's ~1,000 a warp). */
template <int D>
struct am8_copy {
	static constexpr int CPR = D / 16, RP = 128 / CPR; /* K: chunks a row, rows a pass (whole units) */
	static constexpr int CPU = D / 4, UP = 128 / CPU;  /* V: chunks a unit, units a pass */
	const unsigned char *kb, *vb, *k, *v, *ks, *vs;     /* the caches; the thread's sources at jt = 0 */
	size_t unit;
	int kr, vu;        /* the thread's first K row, first V unit */
	unsigned kd, vd[2]; /* where they go in a stage (V: even passes, odd ones) */

	__device__ __forceinline__ void init(const unsigned char *kc, const unsigned char *vc, int n_kv, int kvh)
	{
		int t = threadIdx.x, kch = t % CPR, vch = t % CPU;
		unit = toast_kv_unit_bytes(n_kv, D);
		kb = kc, vb = vc, kr = t / CPR, vu = t / CPU;
		k = kc + toast_kv_q8_code_at(n_kv, D, false, kr, kvh) + kch * 16;
		v = vc + toast_kv_q8_code_at(n_kv, D, true, TOAST_KV_UNIT * vu, kvh) + vch * 16;
		size_t sc = toast_kv_q8_scale_at(n_kv, D, TOAST_KV_UNIT * t, kvh);
		ks = kc + sc, vs = vc + sc; /* (threads < 16: unit t's) */
		kd = am8_kswz<D>(kr, kch >> 1) + 16 * (kch & 1); /* the same for every pass: RP % 8 == 0 */
#pragma unroll
		for (int p = 0; p < 2; p++) {
			int u = vu + UP * p;
			vd[p] = AM_KEYS * D + u * 4 * D + ((vch ^ (2 * (u & 3))) << 4);
		}
	}
	__device__ __forceinline__ void load_k(unsigned char *st, int jt, int j1) const
	{
		size_t base = (size_t)(jt / TOAST_KV_UNIT) * unit, pass = (size_t)(RP / TOAST_KV_UNIT) * unit;
		unsigned d = cu_smem_addr(st);
		int lim = j1 - jt - kr;
#pragma unroll
		for (int n = 0; n < AM_KEYS / RP; n++) {
			bool in = RP * n < lim;
			cu_cp16(d + kd + n * RP * D, in ? k + base + n * pass : kb, in);
		}
		if (threadIdx.x < AM_KEYS / TOAST_KV_UNIT) {
			bool in = TOAST_KV_UNIT * (int)threadIdx.x < j1 - jt;
			cu_cp16(d + 2 * AM_KEYS * D + 16 * threadIdx.x, in ? ks + base : kb, in);
		}
	}
	__device__ __forceinline__ void load_v(unsigned char *st, int jt, int j1) const
	{
		size_t base = (size_t)(jt / TOAST_KV_UNIT) * unit, pass = (size_t)UP * unit;
		unsigned d = cu_smem_addr(st);
		int lim = j1 - jt - TOAST_KV_UNIT * vu;
#pragma unroll
		for (int n = 0; n < AM_KEYS / TOAST_KV_UNIT / UP; n++) {
			bool in = TOAST_KV_UNIT * UP * n < lim;
			cu_cp16(d + vd[n & 1] + (n >> 1) * 2 * UP * 4 * D, in ? v + base + n * pass : vb, in);
		}
		if (threadIdx.x < AM_KEYS / TOAST_KV_UNIT) {
			bool in = TOAST_KV_UNIT * (int)threadIdx.x < j1 - jt;
			cu_cp16(d + 2 * AM_KEYS * D + AM_KEYS * sizeof(float) + 16 * threadIdx.x, in ? vs + base : vb, in);
		}
	}
};

/* decode (KW > 1): the K and V tiles come through a ring of this many stages, all but one in
 * flight while the warps work on the oldest; at head_dim 256 that is one block an SM, so the
 * decode has half the splits (and the combine half the work) of two blocks with one K and one V
 * tile in flight each, which streamed a 68K cache as fast (68% of the DRAM peak) */
__host__ __device__ static constexpr int am_stages(int KW)
{
	return KW > 1 ? 3 : 1;
}

/* blocks a KV head takes of the output's dims: decode in one split (FO), 64 dims each; else
 * one block has them all (the grid's y is then the split) */
__host__ __device__ static constexpr int am_dslices(int D, bool FO)
{
	return FO ? D / 64 : 1;
}

/* shared memory of k_attn_mma<D, KW>: Q rows, then a K tile and a V tile (bf16) a stage, which
 * the final merge of KW > 1 reuses: KW x 16 rows of am_mrow(D) floats (o, then m and l; the pad
 * puts a warp's float2 stores of 8 rows in two wavefronts), then 16 x (KW + 1) floats (a row's
 * weight of each warp, its denominator) */
__host__ __device__ static constexpr int am_mrow(int D)
{
	return D + 8;
}

__host__ __device__ static constexpr size_t am_stage(int D, bool Q8)
{
	return Q8 ? am8_stage(D) : (size_t)2 * AM_KEYS * D * 2;
}

__host__ __device__ static constexpr size_t am_smem(int D, int KW, bool Q8)
{
	return (size_t)(64 / KW) * D * 2 + am_stage(D, Q8) * am_stages(KW);
}

template <int D, int KW, bool FO, bool Q8>
__global__ void __launch_bounds__(128, 2)
	k_attn_mma(const float *qf, const void *kcv, const void *vcv, float *part, int n_head, int n_kv, int n_split, int T,
		   const int32_t *step, const float *q, bf16 *out, int gated)
{
	constexpr int ROWS = 64 / KW, NT = 8 / KW, KS = 4 / KW; /* rows a block; n-tiles of S and k-steps of P·V a warp */
	constexpr int NS = am_stages(KW); /* KW > 1: a ring of NS (K, V) tile pairs */
	/* FO (decode in one split): block y takes dims y DL.. of P·V and writes them as the output */
	constexpr int DL = D / am_dslices(D, FO);
	static_assert(KW == 1 || KW == 4, "one row group, or four");
	static_assert(!FO || (KW > 1 && D >= 64), "the output in the kernel: decode, 64 dims a block");
	static_assert(KW == 1 || am_smem(D, KW, Q8) >= ((size_t)KW * 16 * am_mrow(DL) + 16 * (KW + 1)) * 4, "merge space");
	extern __shared__ __align__(16) bf16 am[];
	/* Q rows (Q8: fp16), then the stages (K, V) */
	bf16 *Qs = am;
	unsigned char *Ks = (unsigned char *)(Qs + ROWS * D);
	const bf16 *kc = (const bf16 *)kcv, *vc = (const bf16 *)vcv;
	const unsigned char *kc8 = (const unsigned char *)kcv, *vc8 = (const unsigned char *)vcv;
	int rb = gridDim.x - 1 - blockIdx.x, split = FO ? 0 : blockIdx.y, kvh = blockIdx.z; /* the longest rows first */
	int d0 = FO ? blockIdx.y * DL : 0;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = (lane & 3) * 2;
	int rg = warp / KW, kw = warp % KW, kofs = kw * (AM_KEYS / KW); /* row group, its keys in a tile */
	int n_rep = n_head / n_kv, kvd = n_kv * D, R = T * n_rep, r0 = rb * ROWS;
	/* the partial (o, m, l) of query row gr (token gr / n_rep, head kvh * n_rep + gr % n_rep) */
	auto prow = [&](int gr) {
		return part + ((((size_t)(gr / n_rep) * n_kv + kvh) * n_split + split) * n_rep + gr % n_rep) * (D + 2);
	};
	/* FO: where query row gr's head starts in q's rows (its gate: D on) and in out */
	auto orow = [&](int gr) { return ((size_t)(gr / n_rep) * n_head + kvh * n_rep + gr % n_rep) * D; };
	/* FO: the gates of the final merge's items (item k: x = threadIdx.x + 128 k, as below), read
	 * before the wait: the projection that wrote q ended before the prep pass began */
	constexpr int NI = 16 * (DL / 4) / 128;
	float4 gt[FO ? NI : 1];
	if constexpr (FO)
#pragma unroll
		for (int k = 0; k < NI; k++) {
			int x = threadIdx.x + 128 * k, gr = r0 + x / (DL / 4);
			gt[k] = gated && gr < R ? *(const float4 *)(q + 2 * orow(gr) + D + d0 + x % (DL / 4) * 4)
						: make_float4(0, 0, 0, 0);
		}
	/* the position, uploaded before the step's first kernel, is read before the wait: after it, its
	 * round trip came before the keys' loads, which need it */
	int pos0 = __ldcg(step);
	int L = pos0 + min(T - 1, (r0 + ROWS - 1) / n_rep) + 1; /* keys the block's last row sees */
	int2 jr = at_split_keys(L, n_split, split, Q8 ? TOAST_KV_UNIT : 1); /* Q8: splits of whole units */
	int j0 = jr.x, j1 = jr.y;
	if (j0 >= j1) { /* no keys (decode early in a large cache): the combine skips m = -inf */
		cu_pdl_wait();
		for (int row = threadIdx.x; row < ROWS && r0 + row < R; row += 128) {
			float *dst = prow(r0 + row);
			dst[D] = -INFINITY;
			dst[D + 1] = 0;
		}
		return;
	}
	/* decode: tile i (keys j0 + 64 i ..), if the split has it, into stage i % NS, a commit group
	 * each (an empty one past the end keeps the counting simple) */
	am8_copy<D> cp8;
	if constexpr (Q8)
		cp8.init(kc8, vc8, n_kv, kvh);
	auto load_k = [&](unsigned char *st, int jt) {
		if constexpr (Q8)
			cp8.load_k(st, jt, j1);
		else
			am_load_kv<D>((bf16 *)st, kc, kvd, kvh, jt, j1);
	};
	auto load_v = [&](unsigned char *st, int jt) {
		if constexpr (Q8)
			cp8.load_v(st, jt, j1);
		else
			am_load_kv<D>((bf16 *)st + AM_KEYS * D, vc, kvd, kvh, jt, j1);
	};
	auto ring_load = [&](int i) {
		int jt = j0 + i * AM_KEYS;
		unsigned char *st = Ks + (i % NS) * am_stage(D, Q8);
		if (jt < j1) {
			load_k(st, jt);
			load_v(st, jt);
		}
		cu_cp_commit();
	};
	/* decode: the ring's first tiles whose keys all lie before the step's own (which the prep
	 * kernel before this one writes; earlier keys only earlier steps wrote) are asked for before
	 * the wait, so their DRAM latency hides behind that kernel's end */
	int pre = 0;
	if constexpr (KW > 1) {
		while (pre < NS - 1 && min(j0 + (pre + 1) * AM_KEYS, j1) <= pos0)
			pre++;
		for (int i = 0; i < pre; i++)
			ring_load(i);
	}
	cu_pdl_wait();
	if constexpr (KW == 1) {
		load_k(Ks, j0);
		cu_cp_commit();
		load_v(Ks, j0);
		cu_cp_commit();
	} else { /* the rest of the ring's first NS - 1 tiles */
		for (int i = pre; i < NS - 1; i++)
			ring_load(i);
	}
	const float qscale = rsqrtf((float)D) * 1.4426950408889634f;
	for (int i = threadIdx.x; i < ROWS * (D / 8); i += 128) {
		int row = i / (D / 8), ch = i % (D / 8), gr = r0 + row;
		uint4 v = make_uint4(0, 0, 0, 0);
		if (gr < R) {
			const float *qr = qf + ((size_t)(gr / n_rep) * n_head + kvh * n_rep + gr % n_rep) * D;
			if constexpr (Q8) { /* k-positions 8 (ch % 2) .. of k-step ch / 2, in the K loads' order */
				int ks = ch >> 1, b = (ks >> 1) * 32 + 4 * (ks & 1) + 2 * (ch & 1);
				unsigned p[4];
#pragma unroll
				for (int k = 0; k < 4; k++) {
					float2 f = *(const float2 *)(qr + b + 8 * k);
					p[k] = cu_pack_f16(f.x * qscale, f.y * qscale);
				}
				v = make_uint4(p[0], p[1], p[2], p[3]);
			} else {
				const float4 *src = (const float4 *)(qr + ch * 8);
				float4 a = src[0], b = src[1];
				v = make_uint4(cu_pack_bf16(a.x * qscale, a.y * qscale), cu_pack_bf16(a.z * qscale, a.w * qscale),
					       cu_pack_bf16(b.x * qscale, b.y * qscale), cu_pack_bf16(b.z * qscale, b.w * qscale));
			}
		}
		*(uint4 *)(Qs + am_swz<D>(row, ch)) = v;
	}
	int qr0 = rg * 16 + g; /* this thread's rows: qr0 and qr0 + 8 of the block */
	/* Q8: each row's sum of Q as the products take it (fp16), times the codes' offset; P's sums */
	float qofs[2] = {0, 0}, psum[4] = {0, 0, 0, 0};
	if constexpr (Q8) {
		__syncthreads();
		float qs[4] = {0, 0, 0, 0};
#pragma unroll
		for (int ks = 0; ks < D / 16; ks++) {
			unsigned a[4];
			cu_ldsm4<false>(a, Qs + am_swz<D>(rg * 16 + (lane & 15), 2 * ks + (lane >> 4)));
			cu_mma_f16(qs, a, 0x3c003c00u, 0x3c003c00u);
		}
		qofs[0] = CU_Q8_OFS * qs[0], qofs[1] = CU_Q8_OFS * qs[2];
	}
	int qpos0 = pos0 + (r0 + qr0) / n_rep, qpos1 = pos0 + (r0 + qr0 + 8) / n_rep;
	int jall = min(j1, pos0 + r0 / n_rep + 1); /* keys before this one: in the split, seen by every row */
	float o[DL / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
#pragma unroll
	for (int i = 0; i < DL / 8; i++)
		o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0;
	float s[NT][4];
	/* Q8: the key of S's value i of n-tile nt (the key order above) */
	auto key8 = [&](int nt, int i) { return kofs + 16 * (nt >> 1) + 4 * (lane & 3) + 2 * (nt & 1) + (i & 1); };
	/* S = Q·Kᵀ for the warp's keys of the tile in stage st */
	auto scores = [&](const unsigned char *st) {
#pragma unroll
		for (int i = 0; i < NT; i++)
			s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0;
		if constexpr (Q8) {
#pragma unroll
			for (int sp = 0; sp < D / 32; sp++) {
				unsigned a0[4], a1[4];
				cu_ldsm4<false>(a0, Qs + am_swz<D>(rg * 16 + (lane & 15), 4 * sp + (lane >> 4)));
				cu_ldsm4<false>(a1, Qs + am_swz<D>(rg * 16 + (lane & 15), 4 * sp + 2 + (lane >> 4)));
#pragma unroll
				for (int nt = 0; nt < NT; nt++) {
					int r = kofs + 16 * (nt >> 1) + 4 * (g >> 1) + 2 * (nt & 1) + (g & 1);
					uint2 w = *(const uint2 *)(st + am8_kswz<D>(r, sp) + 8 * (lane & 3));
					cu_mma_f16(s[nt], a0, cu_q8_h2<0>(w.x), cu_q8_h2<1>(w.x));
					cu_mma_f16(s[nt], a1, cu_q8_h2<0>(w.y), cu_q8_h2<1>(w.y));
				}
			}
			const float *ksc = (const float *)(st + 2 * AM_KEYS * D);
#pragma unroll
			for (int nt = 0; nt < NT; nt++) {
				float2 k = *(const float2 *)(ksc + key8(nt, 0));
				s[nt][0] = (s[nt][0] - qofs[0]) * k.x, s[nt][1] = (s[nt][1] - qofs[0]) * k.y;
				s[nt][2] = (s[nt][2] - qofs[1]) * k.x, s[nt][3] = (s[nt][3] - qofs[1]) * k.y;
			}
			return;
		}
		const bf16 *K = (const bf16 *)st;
#pragma unroll
		for (int ks = 0; ks < D / 16; ks++) {
			unsigned a[4];
			cu_ldsm4<false>(a, Qs + am_swz<D>(rg * 16 + (lane & 15), 2 * ks + (lane >> 4)));
#pragma unroll
			for (int nt = 0; nt < NT / 2; nt++) {
				unsigned b[4];
				cu_ldsm4<false>(b, K + am_swz<D>(kofs + nt * 16 + (lane & 7) + ((lane >> 4) << 3),
								 2 * ks + ((lane >> 3) & 1)));
				cu_mma_bf16(s[2 * nt], a, b[0], b[1]);
				cu_mma_bf16(s[2 * nt + 1], a, b[2], b[3]);
			}
		}
	};
	/* the online softmax over the tile of keys jt..: s becomes P, o and l are rescaled */
	auto softmax = [&](int jt) {
		/* a tile of keys that every row sees unmasked (all but the last of a split in decode):
		 * no bounds (the rows' positions, rematerialised by division for want of registers,
		 * took ~280 instructions a tile) */
		bool whole = jt + AM_KEYS <= jall;
		float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
		for (int nt = 0; nt < NT; nt++)
#pragma unroll
			for (int i = 0; i < 4; i++) {
				if (!whole) {
					int key = jt + (Q8 ? key8(nt, i) : kofs + nt * 8 + c + (i & 1));
					bool ok = key < j1 && key <= (i < 2 ? qpos0 : qpos1);
					s[nt][i] = ok ? s[nt][i] : -INFINITY;
				}
				mx[i >> 1] = fmaxf(mx[i >> 1], s[nt][i]);
			}
		float corr[2], base[2];
#pragma unroll
		for (int h = 0; h < 2; h++) {
			mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
			mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
			float mn = fmaxf(m[h], mx[h]);
			base[h] = mn == -INFINITY ? 0.0f : mn;
			corr[h] = exp2f(m[h] - base[h]);
			m[h] = mn;
			l[h] *= corr[h];
		}
#pragma unroll
		for (int nt = 0; nt < NT; nt++)
#pragma unroll
			for (int i = 0; i < 4; i++) {
				s[nt][i] = exp2f(s[nt][i] - base[i >> 1]);
				l[i >> 1] += s[nt][i];
			}
		/* o rescaled only when a row's maximum moved (rarely, far into a long context: the
		 * same bits, D / 2 multiplications a thread fewer) */
		if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
			for (int i = 0; i < DL / 8; i++) {
				o[i][0] *= corr[0], o[i][1] *= corr[0];
				o[i][2] *= corr[1], o[i][3] *= corr[1];
			}
			psum[0] *= corr[0], psum[1] *= corr[0], psum[2] *= corr[1], psum[3] *= corr[1];
		}
	};
	/* O += P·V for the warp's keys of the tile in stage st (keys jt..) */
	auto pv = [&](const unsigned char *st, int jt) {
		if constexpr (Q8) {
			const unsigned char *V = st + AM_KEYS * D;
			const float *vsc = (const float *)(st + 2 * AM_KEYS * D) + AM_KEYS;
#pragma unroll
			for (int kk = 0; kk < KS; kk++) {
				int u = kofs / TOAST_KV_UNIT + 4 * kk + (lane & 3); /* the thread's unit */
				float4 f = *(const float4 *)(vsc + TOAST_KV_UNIT * u);
				if (jt + AM_KEYS > j1) { /* keys past the split: P is 0, the scale not one written */
					int k0 = jt + TOAST_KV_UNIT * u;
					f = make_float4(k0 < j1 ? f.x : 0, k0 + 1 < j1 ? f.y : 0, k0 + 2 < j1 ? f.z : 0,
							k0 + 3 < j1 ? f.w : 0);
				}
				f.x *= AM8_PV, f.y *= AM8_PV, f.z *= AM8_PV, f.w *= AM8_PV;
				unsigned pa[4] = {cu_pack_f16(s[2 * kk][0] * f.x, s[2 * kk][1] * f.y),
						  cu_pack_f16(s[2 * kk][2] * f.x, s[2 * kk][3] * f.y),
						  cu_pack_f16(s[2 * kk + 1][0] * f.z, s[2 * kk + 1][1] * f.w),
						  cu_pack_f16(s[2 * kk + 1][2] * f.z, s[2 * kk + 1][3] * f.w)};
				const unsigned char *Vu = V + u * 4 * D;
				cu_mma_f16(psum, pa, 0x3c003c00u, 0x3c003c00u);
#pragma unroll
				for (int dt = 0; dt < DL / 8; dt++) {
					int dim = d0 + 8 * dt + g;
					unsigned w = *(const unsigned *)(Vu + 4 * (dim ^ (8 * (u & 3))));
					cu_mma_f16(o[dt], pa, cu_q8_h2<0>(w), cu_q8_h2<1>(w));
				}
			}
			return;
		}
		const bf16 *V = (const bf16 *)st + AM_KEYS * D;
#pragma unroll
		for (int kk = 0; kk < KS; kk++) {
			unsigned pa[4] = {cu_pack_bf16(s[2 * kk][0], s[2 * kk][1]), cu_pack_bf16(s[2 * kk][2], s[2 * kk][3]),
					  cu_pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
					  cu_pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
			for (int dt = 0; dt < DL / 16; dt++) {
				unsigned b[4];
				cu_ldsm4<true>(b, V + am_swz<D>(kofs + kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
								(d0 / 8) + 2 * dt + (lane >> 4)));
				cu_mma_bf16(o[2 * dt], pa, b[0], b[1]);
				cu_mma_bf16(o[2 * dt + 1], pa, b[2], b[3]);
			}
		}
	};
	if constexpr (KW == 1) {
		for (int jt = j0; jt < j1; jt += AM_KEYS) {
			bool more = jt + AM_KEYS < j1;
			cu_cp_wait<1>(); /* this tile's K (its V may still fly) */
			__syncthreads();
			scores(Ks);
			__syncthreads(); /* every warp is done with K: the next tile's K may land */
			if (more)
				load_k(Ks, jt + AM_KEYS);
			cu_cp_commit(); /* (an empty group at the end keeps the counting simple) */
			softmax(jt);
			cu_cp_wait<1>(); /* this tile's V (the next K may still fly) */
			__syncthreads();
			pv(Ks, jt);
			__syncthreads(); /* every warp is done with V */
			if (more)
				load_v(Ks, jt + AM_KEYS);
			cu_cp_commit();
		}
	} else {
		for (int i = 0, jt = j0; jt < j1; i++, jt += AM_KEYS) {
			cu_cp_wait<NS - 2>(); /* tile i has landed (the NS - 2 after it may still fly) */
			__syncthreads();      /* ... for every thread; and every warp is done with tile i - 1 */
			ring_load(i + NS - 1); /* into the stage tile i - 1 left */
			const unsigned char *st = Ks + (i % NS) * am_stage(D, Q8);
			scores(st);
			softmax(jt);
			pv(st, jt);
		}
	}
	if constexpr (Q8) /* the codes' offset times P's sums */
#pragma unroll
		for (int i = 0; i < DL / 8; i++) {
			o[i][0] -= CU_Q8_OFS * psum[0], o[i][1] -= CU_Q8_OFS * psum[0];
			o[i][2] -= CU_Q8_OFS * psum[2], o[i][3] -= CU_Q8_OFS * psum[2];
		}
	cu_pdl_trigger();
#pragma unroll
	for (int h = 0; h < 2; h++) {
		l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
		l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
	}
	if constexpr (KW > 1) {
		/* merge the warps' states: each stores (o, m, l) of its 16 rows; a thread a row weighs
		 * the warps (their maximum, each warp's factor, the denominator), then every thread
		 * merges 4 dims of some rows. (A thread a (row, dim) that reweighed the warps itself,
		 * with a division to find its row, was ~2,000 of the ~4,150 instructions a warp issued
		 * for a decode block at short context: docs/PERF.md.) */
		constexpr int MR = am_mrow(DL);
		constexpr float OS = Q8 ? 1.0f / AM8_PV : 1.0f; /* P·V's scale undone */
		cu_cp_wait<0>();
		__syncthreads();
		float *mg = (float *)am, *fw = mg + KW * 16 * MR; /* [KW][16][MR], [16][KW + 1] */
#pragma unroll
		for (int h = 0; h < 2; h++) {
			float *dst = mg + (kw * 16 + g + 8 * h) * MR;
#pragma unroll
			for (int i = 0; i < DL / 8; i++)
				*(float2 *)(dst + i * 8 + c) = make_float2(o[i][2 * h] * OS, o[i][2 * h + 1] * OS);
			if ((lane & 3) == 0) {
				dst[DL] = m[h];
				dst[DL + 1] = l[h];
			}
		}
		__syncthreads();
		if (threadIdx.x < 16) {
			int row = threadIdx.x, gr = r0 + row;
			float mt = -INFINITY, den = 0;
#pragma unroll
			for (int w = 0; w < KW; w++)
				mt = fmaxf(mt, mg[(w * 16 + row) * MR + DL]);
#pragma unroll
			for (int w = 0; w < KW; w++) {
				const float *src = mg + (w * 16 + row) * MR;
				float f = src[DL] == -INFINITY ? 0.0f : exp2f(src[DL] - mt);
				fw[row * (KW + 1) + w] = f;
				den += f * src[DL + 1];
			}
			if constexpr (FO) {
				fw[row * (KW + 1) + KW] = den;
			} else if (gr < R) {
				float *dst = prow(gr);
				dst[D] = mt * 0.6931471805599453f; /* -inf stays -inf: combine skips the split */
				dst[D + 1] = den;
			}
		}
		__syncthreads();
#pragma unroll
		for (int k = 0; k < NI; k++) {
			int x = threadIdx.x + 128 * k, row = x / (DL / 4), d = x % (DL / 4) * 4, gr = r0 + row;
			if (gr >= R)
				break; /* the rows only grow with x */
			float4 acc = make_float4(0, 0, 0, 0);
#pragma unroll
			for (int w = 0; w < KW; w++) {
				float f = fw[row * (KW + 1) + w];
				float4 v = *(const float4 *)(mg + (w * 16 + row) * MR + d);
				acc.x += f * v.x, acc.y += f * v.y, acc.z += f * v.z, acc.w += f * v.w;
			}
			if constexpr (FO) { /* as k_attn_combine makes it of one split */
				float den = fw[row * (KW + 1) + KW];
				float v[4] = {acc.x / den, acc.y / den, acc.z / den, acc.w / den};
				float gv[4] = {gt[k].x, gt[k].y, gt[k].z, gt[k].w};
				if (gated)
#pragma unroll
					for (int u = 0; u < 4; u++)
						v[u] *= cu_sigmoid(gv[u]);
				*(uint2 *)(out + orow(gr) + d0 + d) = make_uint2(cu_pack_bf16(v[0], v[1]), cu_pack_bf16(v[2], v[3]));
				continue;
			}
			float *dst = prow(gr);
			*(float2 *)(dst + d) = make_float2(acc.x, acc.y);
			*(float2 *)(dst + d + 2) = make_float2(acc.z, acc.w);
		}
	} else {
		constexpr float OS = Q8 ? 1.0f / AM8_PV : 1.0f;
#pragma unroll
		for (int h = 0; h < 2; h++) {
			int gr = r0 + qr0 + 8 * h;
			if (gr >= R)
				continue;
			float *dst = prow(gr);
#pragma unroll
			for (int i = 0; i < D / 8; i++)
				*(float2 *)(dst + i * 8 + c) = make_float2(o[i][2 * h] * OS, o[i][2 * h + 1] * OS);
			if ((lane & 3) == 0) {
				dst[D] = m[h] * 0.6931471805599453f; /* -inf stays -inf: combine skips the split */
				dst[D + 1] = l[h];
			}
		}
	}
}

/* one (token, head, hw dims of the head) a block, blockDim.x / hw groups of splits (group g
 * takes splits g, g + ng, ..): the o values a thread needs and the splits' m and l are loaded
 * together, AC_BATCH splits a thread in flight. Decode takes hw = 32 and up to AC_GROUPS groups
 * (a 66-split step, or an 8-bit cache's 132 at two blocks an SM: one round of loads spread over
 * 128 blocks; two rounds of 8 took 8.0 us at 132 splits, one of 9 6.6 us; a block per head that
 * read the splits a few at a time took 9.6 us of the step's critical path at 68K); prefill,
 * with few splits and many rows, whole heads and few groups. Each warp takes the max of m and
 * the denominator itself (no barrier; with a few splits each thread does); a split without keys
 * has m = -inf and an o never written: selected away, not multiplied by 0. Shared memory: m
 * [n_split], l [n_split], the groups' sums [ng][hw]. */
#define AC_GROUPS 16
#define AC_BATCH 9
__global__ void __launch_bounds__(512)
	k_attn_combine(const float *part, const float *q, bf16 *out, int n_head, int n_kv, int hd, int n_split, int gated,
		       int hw)
{
	extern __shared__ float ac[];
	int ng = blockDim.x / hw, t = blockIdx.x, h = blockIdx.y, grp = threadIdx.x / hw, dd = threadIdx.x % hw;
	int d = blockIdx.z * hw + dd, lane = threadIdx.x & 31, per = ng * AC_BATCH;
	/* the gate before the wait: the projection that wrote q ended before the prep pass began */
	float gate = gated && grp == 0 && d < hd ? q[((size_t)t * n_head + h) * 2 * hd + hd + d] : 0.0f;
	cu_pdl_wait();
	cu_pdl_trigger();
	bool few = n_split <= 8 && n_split <= per; /* (prefill) every thread reads the few m and l itself */
	int dl = few ? 0 : lane, ds = few ? 1 : 32; /* the splits a thread sums into den: dl, dl + ds, .. */
	int n_rep = n_head / n_kv, kvh = h / n_rep, r = h % n_rep;
	const float *p = part + ((((size_t)t * n_kv + kvh) * n_split) * n_rep + r) * (hd + 2);
	size_t stride = (size_t)n_rep * (hd + 2);
	float *ms = ac, *ls = ms + n_split, *sum = ls + n_split;
	float num = 0, mt = -INFINITY, den = 0;
	for (int s0 = 0; s0 < n_split; s0 += per) {
		float o[AC_BATCH];
#pragma unroll
		for (int i = 0; i < AC_BATCH; i++) {
			int s = s0 + grp + ng * i;
			o[i] = s < n_split && d < hd ? p[s * stride + d] : 0.0f;
		}
		for (int s = s0 + threadIdx.x; s < min(n_split, s0 + per); s += blockDim.x)
			ms[s] = p[s * stride + hd], ls[s] = p[s * stride + hd + 1];
		__syncthreads();
		if (s0 == 0 && few) { /* the max over every split first: this batch's weights need it */
			for (int s = 0; s < n_split; s++)
				mt = fmaxf(mt, ms[s]);
		} else if (s0 == 0) {
			for (int s = lane; s < n_split; s += 32)
				mt = fmaxf(mt, s < per ? ms[s] : p[s * stride + hd]);
			mt = cu_warp_max(mt);
		}
#pragma unroll
		for (int i = 0; i < AC_BATCH; i++) {
			int s = s0 + grp + ng * i;
			if (s < n_split && ms[s] != -INFINITY)
				num += __expf(ms[s] - mt) * o[i];
		}
		for (int s = s0 + dl; s < min(n_split, s0 + per); s += ds)
			den += ms[s] == -INFINITY ? 0.0f : __expf(ms[s] - mt) * ls[s];
	}
	den = few ? den : cu_warp_sum(den);
	sum[grp * hw + dd] = num;
	__syncthreads();
	if (grp > 0 || d >= hd)
		return;
	for (int g = 1; g < ng; g++)
		num += sum[g * hw + dd];
	float v = num / den;
	if (gated)
		v *= cu_sigmoid(gate);
	out[((size_t)t * n_head + h) * hd + d] = __float2bfloat16(v);
}

/* the SIMT split-K pass: decode, and prefill at head dims the tensor-core kernel lacks */
static void attn_tile(struct cuda_backend *cb, const struct toast_attn_args *a, const float *qf, float *part,
		      int n_split)
{
	int hd = a->head_dim, T = a->T, n_rep = a->n_head / a->n_head_kv;
	if (n_rep > AT_WARPS * 8) {
		cu_fail_msg(cb, "attention: %d query heads per KV head is not supported (max %d)", n_rep, AT_WARPS * 8);
		return;
	}
	/* decode: one token per block; prefill: 64 / n_rep tokens per block share each K/V tile */
	int rpw = (n_rep + AT_WARPS - 1) / AT_WARPS, qt = 1;
	if (T > 1) {
		qt = (AT_WARPS * 8) / n_rep;
		rpw = 8;
	}
	rpw = rpw <= 1 ? 1 : rpw <= 2 ? 2 : rpw <= 4 ? 4 : 8;
	int dpl = (hd + 31) / 32;
	dpl = dpl <= 2 ? 2 : dpl <= 4 ? 4 : 8;
	size_t smem = ((size_t)AT_TK * (hd + 4) + (size_t)AT_TK * hd + (size_t)qt * n_rep * hd) * sizeof(float);
	dim3 sg(a->n_head_kv, n_split, (T + qt - 1) / qt);
	const void *fn = NULL;
#define AT_PICK(R, D) if (rpw == R && dpl == D) fn = (const void *)k_attn_tile<R, D>;
	AT_PICK(1, 2) AT_PICK(1, 4) AT_PICK(1, 8) AT_PICK(2, 2) AT_PICK(2, 4) AT_PICK(2, 8)
	AT_PICK(4, 2) AT_PICK(4, 4) AT_PICK(4, 8) AT_PICK(8, 2) AT_PICK(8, 4) AT_PICK(8, 8)
#undef AT_PICK
	static size_t room[4][4];
	int ri = rpw == 1 ? 0 : rpw == 2 ? 1 : rpw == 4 ? 2 : 3, di = dpl == 2 ? 0 : dpl == 4 ? 1 : 2;
	if (!room[ri][di])
		room[ri][di] = cu_allow_smem(cb, fn);
	if (smem > room[ri][di]) {
		cu_fail_msg(cb, "attention: head_dim %d needs more shared memory than the GPU has", hd);
		return;
	}
	const void *kcp = a->k_cache, *vcp = a->v_cache;
	int q8 = a->kv_type == TOAST_KV_Q8;
	void *args[] = {(void *)&qf, (void *)&kcp, (void *)&vcp, (void *)&q8, (void *)&part, (void *)&a->n_head,
			(void *)&a->n_head_kv, (void *)&hd, (void *)&n_split, (void *)&qt, (void *)&T, (void *)&cb->d_step};
	cu_fail(cb, cudaLaunchKernel(fn, sg, dim3(AT_WARPS * 32), args, smem, cb->stream), "attention launch");
	cu_launched(cb, "attention");
}

template <int D, int KW, bool FO, bool Q8>
static void attn_mma_d(struct cuda_backend *cb, const struct toast_attn_args *a, const float *qf, float *part,
		       int n_split)
{
	static size_t room;
	size_t smem = am_smem(D, KW, Q8);
	if (!room)
		room = cu_allow_smem(cb, (const void *)k_attn_mma<D, KW, FO, Q8>);
	if (smem > room) {
		cu_fail_msg(cb, "attention: head_dim %d needs more shared memory than the GPU has", D);
		return;
	}
	dim3 grid(cu_blocks((size_t)a->T * (a->n_head / a->n_head_kv), 64 / KW), FO ? am_dslices(D, FO) : n_split,
		  a->n_head_kv);
	cu_launch_ex(cb, KW > 1, k_attn_mma<D, KW, FO, Q8>, grid, 128, smem, qf, (const void *)a->k_cache,
		     (const void *)a->v_cache, part, a->n_head, a->n_head_kv, n_split, a->T, (const int32_t *)cb->d_step, a->q,
		     (bf16 *)a->out, (int)a->gated);
	cu_launched(cb, "attention (tensor cores)");
}

/* decode (dec) in one split (one) writes the output itself (64 dims a block; part is NULL), with
 * more splits partials for the combine; prefill partials */
template <int D, bool Q8>
static void attn_mma_q(struct cuda_backend *cb, const struct toast_attn_args *a, const float *qf, float *part,
		       int n_split, bool dec, bool one)
{
	if (one)
		attn_mma_d<D, 4, true, Q8>(cb, a, qf, part, n_split);
	else if (dec)
		attn_mma_d<D, 4, false, Q8>(cb, a, qf, part, n_split);
	else
		attn_mma_d<D, 1, false, Q8>(cb, a, qf, part, n_split);
}

template <int D>
static void attn_mma_kw(struct cuda_backend *cb, const struct toast_attn_args *a, const float *qf, float *part,
			int n_split, bool dec, bool one)
{
	if (a->kv_type == TOAST_KV_Q8)
		attn_mma_q<D, true>(cb, a, qf, part, n_split, dec, one);
	else
		attn_mma_q<D, false>(cb, a, qf, part, n_split, dec, one);
}

/* blocks of the decode kernel an SM (its ring of tiles takes most of the shared memory at
 * head_dim 256) */
template <int D, bool Q8>
static int attn_mma_per_sm_q(struct cuda_backend *cb)
{
	static int per_sm;
	if (!per_sm) {
		cu_allow_smem(cb, (const void *)k_attn_mma<D, 4, false, Q8>);
		per_sm = cu_per_sm((const void *)k_attn_mma<D, 4, false, Q8>, 128, am_smem(D, 4, Q8));
		if (per_sm < 1)
			per_sm = 1;
	}
	return per_sm;
}

template <int D>
static int attn_mma_per_sm(struct cuda_backend *cb, const struct toast_attn_args *a)
{
	return a->kv_type == TOAST_KV_Q8 ? attn_mma_per_sm_q<D, true>(cb) : attn_mma_per_sm_q<D, false>(cb);
}

/* head_dim 64, 128 or 256 goes to the tensor cores (decode: up to 16 query heads a KV head) */
static bool attn_mma_fits(const struct toast_attn_args *a)
{
	return (a->head_dim == 64 || a->head_dim == 128 || a->head_dim == 256) &&
	       (a->T > 1 || a->n_head / a->n_head_kv <= 16);
}

void cu_attention(struct cuda_backend *cb, const struct toast_attn_args *a)
{
	int hd = a->head_dim, T = a->T, n_rep = a->n_head / a->n_head_kv;
	if (hd > ATTN_MAX_DPL * 32 || a->n_rot > hd) {
		cu_fail_msg(cb, "attention: head_dim %d is not supported (max %d)", hd, ATTN_MAX_DPL * 32);
		return;
	}
	/* splits: enough blocks to fill the GPU. Decode: as many as are resident at once, fixed by
	 * the span (or the cache size), never by pos, so a recorded step stays valid as the context
	 * grows up to it; at short context a small span launches few splits (at 68K of cache and pos
	 * 0, 132 empty splits and their combine cost the Q4_K step 8%). Prefill on tensor cores: two
	 * blocks an SM, when the rows alone give fewer, and at least 128 keys a split (a short prompt
	 * after a long history) */
	/* a step of a few tokens (speculative decoding's) is decode too when its query rows, 16 a
	 * block, are few: the decode kernel and splits, and one split's output written by it (the
	 * prefill kernel and the combine took a step of 2 twice one's time, docs/PERF.md) */
	int n_split = 1, rows = attn_mma_fits(a) ? (int)cu_blocks((size_t)T * n_rep, 16) : 1;
	bool dec = T == 1 || (T <= CU_GEMV_MAX_T && attn_mma_fits(a) && n_rep <= 16);
	if (dec) {
		n_split = (a->span > 0 ? a->span : a->n_ctx) / 256;
		int per_sm = !attn_mma_fits(a) ? 2
			     : hd == 64	       ? attn_mma_per_sm<64>(cb, a)
			     : hd == 128       ? attn_mma_per_sm<128>(cb, a)
					       : attn_mma_per_sm<256>(cb, a);
		int cap = (per_sm * cb->n_sm / rows + a->n_head_kv - 1) / a->n_head_kv;
		n_split = n_split < 1 ? 1 : n_split > cap ? cap : n_split;
	} else if (attn_mma_fits(a)) {
		int blocks = (int)cu_blocks((size_t)T * n_rep, 64) * a->n_head_kv, by_keys = (a->pos + T) / 128;
		n_split = blocks >= 2 * cb->n_sm ? 1 : (2 * cb->n_sm + blocks - 1) / blocks;
		n_split = n_split > by_keys ? by_keys : n_split;
		n_split = n_split < 1 ? 1 : n_split;
	}
	/* decode on tensor cores in one split: no partials, no combine */
	bool one = dec && n_split == 1 && attn_mma_fits(a);
	size_t qbytes = (size_t)T * a->n_head * hd * 4;
	size_t pbytes = one ? 0 : (size_t)T * a->n_head_kv * n_split * n_rep * (hd + 2) * 4;
	char *scr = (char *)cu_scratch(cb, qbytes + pbytes);
	if (!scr)
		return;
	float *qf = (float *)scr, *part = one ? NULL : (float *)(scr + qbytes);
	int threads = (hd + 31) / 32 * 32;
	dim3 pg(T, a->n_head + a->n_head_kv);
	cu_launch_ex(cb, dec, k_attn_prep, pg, threads, hd * sizeof(float), a->q, a->k, a->v,
		  a->q_norm ? (const float *)a->q_norm->dev : NULL, a->k_norm ? (const float *)a->k_norm->dev : NULL,
		  a->norm_plus_one, a->eps, a->n_head, a->n_head_kv, hd, a->n_rot, a->rope_theta, a->rope_freq_type, a->gated,
		  a->k_cache, a->v_cache, (int)(a->kv_type == TOAST_KV_Q8), qf, cb->d_step);
	cu_launched(cb, "attention prep");
	if (!attn_mma_fits(a))
		attn_tile(cb, a, qf, part, n_split);
	else if (hd == 64)
		attn_mma_kw<64>(cb, a, qf, part, n_split, dec, one);
	else if (hd == 128)
		attn_mma_kw<128>(cb, a, qf, part, n_split, dec, one);
	else
		attn_mma_kw<256>(cb, a, qf, part, n_split, dec, one);
	if (cb->failed || one)
		return;
	/* decode: 32 dims a block, a warp a group of splits; prefill: whole heads (thousands of rows
	 * already fill the GPU), as many groups as 512 threads hold */
	int hw = dec ? 32 : threads, ng = dec ? AC_GROUPS : 512 / hw;
	ng = ng < n_split ? ng : n_split;
	dim3 cg(T, a->n_head, dec ? (hd + 31) / 32 : 1);
	cu_launch_ex(cb, dec, k_attn_combine, cg, ng * hw, (2 * n_split + ng * hw) * sizeof(float), part, a->q,
		     (bf16 *)a->out, a->n_head, a->n_head_kv, hd, n_split, a->gated, hw);
	cu_launched(cb, "attention combine");
}

CU_TL_TU(k_attn)
