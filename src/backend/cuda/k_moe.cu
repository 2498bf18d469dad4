/*
 * k_moe.cu - mixture of experts with optional shared expert (contract: toast_moe_args).
 *
 * The input is RMSNorm(x), computed in f32 and kept in f32 for the router, so expert choice
 * does not flip on rounding. Decode (T <= CU_GEMV_MAX_T): one kernel computes the norm, the
 * router logits and the shared expert's gate (a warp of its own); one kernel runs gate/up of
 * every chosen expert and the shared one, each block choosing its slot's expert from the logits
 * (moe_pick_slot; with more experts than a warp holds, the router's last block to finish chooses
 * them all); one runs down for all of them and adds to the residual. Expert ids stay in device
 * memory, so a recorded decode step is valid whatever the router picks. Prefill (longer T,
 * n_embd % 128 == 0, n_ff % 64 == 0): token-slots grouped by expert on the device, gate/up (with
 * SiLU·mul) and down as grouped tensor-core GEMMs (k_moe_gg); other shapes run the decode expert
 * kernels per token.
 */
#include "backend/cuda/cu_quant.cuh"

#include <type_traits>

#define MOE_MAX_K 64
#define MOE_WARPS 8

/* pick: the router leaves only its logits, and each expert kernel chooses its token's experts
 * from them (one warp, ne <= 32 * MOE_WARP_TOPK): no block of the router waits for the others to
 * choose once for all (a fence, a ticket and a top-k on the critical path of every MoE layer) */
struct moe_dims {
	int T, E, ne, k, F, Fs, Fmax, norm_topk, pick;
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
	mx = cu_block_max(mx, red);
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

/* an order-preserving key of a logit (unsigned compare = float compare, -0 = +0, NaN lowest) */
__device__ __forceinline__ unsigned moe_key(float f)
{
	unsigned u = __float_as_uint(f + 0.0f);
	return f != f ? 0u : (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

__device__ __forceinline__ float moe_unkey(unsigned k)
{
	return __uint_as_float(k & 0x80000000u ? k & 0x7fffffffu : ~k);
}

/*
 * The top-k by one warp with the logits in registers (ne <= 32 * MOE_WARP_TOPK, k <= 64): lane l
 * holds logits l, l + 32, .. (past ne: none) and keeps the largest two of those not yet taken
 * (the first on a tie: the lower index). A round is one warp reduction (redux.sync on moe_key: the
 * largest) and a vote, and a second reduction (the lowest index holding it) when lanes tie on
 * it; the winner lane moves its second up, and rescans its logits only when it wins again before
 * that (the rescan, in one lane, held the whole warp: ~125 instructions a round). A round still
 * costs ~380 cycles on an H200 (docs/PERF.md). Keys in place of the logits, converted once, made
 * the gate/up kernel 0.6 us slower.
 */
#define MOE_WARP_TOPK 16
struct moe_warp_topk {
	float v[MOE_WARP_TOPK];
	unsigned taken; /* bit i: v[i] chosen, or past ne */
	float lb, sb;   /* the best and second of the rest, at indices li, si (1 << 30: none) */
	int li, si;
	bool second; /* sb, si are current */

	__device__ __forceinline__ void load(const moe_dims &d, const float *logits, int lane)
	{
#pragma unroll
		for (int i = 0; i < MOE_WARP_TOPK; i++) {
			int e = lane + 32 * i;
			v[i] = e < d.ne ? __ldcg(logits + e) : -INFINITY;
		}
		int n = (d.ne - lane + 31) / 32;
		taken = n >= MOE_WARP_TOPK ? 0u : ~0u << n;
		best2(lane);
	}

	/* the largest of v but the positions in skip (fmaxf: NaN loses), and the first position
	 * holding it (-1: none) */
	__device__ __forceinline__ float best(unsigned skip, int *pos) const
	{
		float m[MOE_WARP_TOPK];
#pragma unroll
		for (int i = 0; i < MOE_WARP_TOPK; i++)
			m[i] = skip >> i & 1 ? -INFINITY : v[i];
#pragma unroll
		for (int w = 1; w < MOE_WARP_TOPK; w *= 2)
#pragma unroll
			for (int i = 0; i < MOE_WARP_TOPK; i += 2 * w)
				m[i] = fmaxf(m[i], m[i + w]);
		unsigned hit = 0;
#pragma unroll
		for (int i = 0; i < MOE_WARP_TOPK; i++)
			hit |= (v[i] == m[0] ? 1u : 0u) << i;
		hit &= ~skip;
		*pos = hit ? __ffs(hit) - 1 : -1;
		return m[0];
	}

	__device__ __forceinline__ void best2(int lane)
	{
		int p, q;
		lb = best(taken, &p);
		sb = best(p < 0 ? taken : taken | 1u << p, &q);
		li = p < 0 ? 1 << 30 : lane + 32 * p;
		si = q < 0 ? 1 << 30 : lane + 32 * q;
		second = true;
	}

	/* the next pick: true in the lane holding it, its index then in *idx; its logit in *val
	 * (every lane) */
	__device__ __forceinline__ bool round(int lane, float *val, int *idx)
	{
		unsigned key = moe_key(lb), top = __reduce_max_sync(0xffffffffu, key);
		bool mine = key == top;
		unsigned tie = __ballot_sync(0xffffffffu, mine);
		if (tie & (tie - 1)) /* (the same in every lane) */
			mine = (unsigned)li == __reduce_min_sync(0xffffffffu, mine ? (unsigned)li : 0xffffffffu);
		*val = moe_unkey(top);
		*idx = li;
		if (mine) {
			taken |= 1u << ((li - lane) >> 5);
			if (second) {
				lb = sb, li = si;
				second = false;
			} else {
				best2(lane);
			}
		}
		return mine;
	}

	/* the softmax's max and sum over all the logits, in every lane */
	__device__ __forceinline__ void softmax(const moe_dims &d, int lane, float *mx, float *sum) const
	{
		float m = -INFINITY, z = 0;
#pragma unroll
		for (int i = 0; i < MOE_WARP_TOPK; i++)
			m = fmaxf(m, v[i]);
		m = cu_warp_max(m);
#pragma unroll
		for (int i = 0; i < MOE_WARP_TOPK; i++)
			z += lane + 32 * i < d.ne ? __expf(v[i] - m) : 0.0f;
		*mx = m, *sum = cu_warp_sum(z);
	}

	/* the index of the pick that round() returned true for in one lane, in every lane */
	static __device__ __forceinline__ int index(bool mine, int idx)
	{
		return (int)__reduce_max_sync(0xffffffffu, mine ? (unsigned)idx : 0u);
	}
};

/* picks j = lane and lane + 32 (experts e0, e1, logits l0, l1) and their weights into sel[j],
 * wt[j], by a warp: softmax weights (mx, sum over all the logits), renormalised over the k picks
 * when asked */
__device__ __forceinline__ void moe_pick_weights(const moe_dims &d, int lane, int e0, int e1, float l0, float l1,
						 float mx, float sum, int32_t *sel, float *wt)
{
	bool a = lane < d.k, b = lane + 32 < d.k;
	float p0 = a ? __expf(l0 - mx) / sum : 0.0f, p1 = b ? __expf(l1 - mx) / sum : 0.0f;
	float tot = cu_warp_sum(p0 + p1);
	if (a)
		sel[lane] = e0, wt[lane] = d.norm_topk ? p0 / tot : p0;
	if (b)
		sel[lane + 32] = e1, wt[lane + 32] = d.norm_topk ? p1 / tot : p1;
}

/* softmax over the logits, the k largest (ties: lower index), renormalised when asked: pick j
 * in sel[j], wt[j], lane j % 32 keeping it; the weights are computed once the rounds are done (a
 * round of shuffles and a division per pick took 5 us of every MoE layer's critical path) */
__device__ __forceinline__ void moe_topk_warp(const moe_dims &d, const float *logits, int32_t *sel, float *wt)
{
	int lane = threadIdx.x & 31;
	moe_warp_topk w;
	w.load(d, logits, lane);
	float mx, sum;
	w.softmax(d, lane, &mx, &sum);
	float pv0 = 0, pv1 = 0;
	int pi0 = 0, pi1 = 0;
	for (int j = 0; j < d.k; j++) {
		float val;
		int ix;
		bool mine = w.round(lane, &val, &ix);
		int bi = min(moe_warp_topk::index(mine, ix), d.ne - 1); /* (NaN logits: some expert) */
		if (lane == (j & 31)) {
			if (j < 32)
				pv0 = val, pi0 = bi;
			else
				pv1 = val, pi1 = bi;
		}
	}
	moe_pick_weights(d, lane, pi0, pi1, pv0, pv1, mx, sum, sel, wt);
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

/* a bf16 row of n elements (any n) times f32 x, element by element: odd shapes */
__device__ __forceinline__ float moe_dot_plain(const uint8_t *row, const float *x, int n, int lane)
{
	float acc = 0;
	for (int i = lane; i < n; i += 32)
		acc += __bfloat162float(((const bf16 *)row)[i]) * x[i];
	return acc;
}

/* a row of n elements of matrix e of w times x (staged for TYPE), lane's share: chunk by chunk,
 * or element by element for a bf16 row that is not whole chunks */
template <int TYPE>
__device__ __forceinline__ float moe_dot_row(const cu_wd &w, size_t e, int64_t r, const float *x, int n, int lane)
{
	cu_wrow row = cu_row(w, e, r);
	if (n % qk<TYPE>::EPC)
		return moe_dot_plain(row.q, x, n, lane);
	float acc = 0;
	for (int c = lane; c < n / qk<TYPE>::EPC; c += 32)
		acc += cu_qdot<TYPE>(cu_qload<TYPE>(w, row, e, r, c), c, x);
	return acc;
}

/* dst (shared memory, stored for TYPE's swizzle) = n floats of src, issued by a whole block:
 * whole aligned float4s by cp.async (every copy in flight at once and no register held; a load
 * then a store per float4 made one L2 round trip each, in a row), else element by element. The
 * caller waits for its copies (cu_cp_commit, cu_cp_wait<0>) and syncs. */
template <int TYPE>
__device__ __forceinline__ void moe_stage_issue(float *dst, const float *src, int n)
{
	if ((n & 3) == 0 && ((uintptr_t)src & 15) == 0) {
		for (int i = threadIdx.x; i < n / 4; i += blockDim.x)
			cu_cp16((float4 *)dst + qk<TYPE>::swz(i), (const float4 *)src + i, true);
		return;
	}
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		dst[cu_qpos<TYPE>(i)] = src[i];
}

template <int TYPE>
__device__ __forceinline__ void moe_stage(float *dst, const float *src, int n)
{
	moe_stage_issue<TYPE>(dst, src, n);
	cu_cp_commit();
	cu_cp_wait<0>();
}

/* the act rows of slots slot0..slot0+nslot-1 (d.Fmax apart) at as + j * d.Fmax, all in flight
 * at once (one after another they were 11 L2 round trips for Qwen3's down; holding them in
 * registers instead cost the bf16 kernel its second block an SM) */
template <int TYPE>
__device__ __forceinline__ void moe_stage_rows(float *as, const float *act, const moe_dims &d, int slot0, int nslot)
{
	for (int j = 0; j < nslot; j++)
		moe_stage_issue<TYPE>(as + j * d.Fmax, act + (size_t)j * d.Fmax, slot0 + j == d.k ? d.Fs : d.F);
	cu_cp_commit();
	cu_cp_wait<0>();
}

/* decode: norm + router + shared gate + (last block, unless d.pick) top-k. smem: hs [T][E]
 * (staged for TYPE) then ne floats for the top-k. A warp per router row; CPL > 0: n_embd == 32 *
 * CPL chunks, the row's loads are issued before the wait. With sgw, one more block (the last)
 * takes the shared expert's gate, h · sh_gate_inp, over all its threads, its first MOE_SG_PER *
 * blockDim floats of sgw loaded before the wait: as one warp's loop of loads after the norm it
 * ended 2.4 us after every router row and set the kernel's end (docs/PERF.md). */
#define MOE_SG_PER 8
template <int TYPE, int CPL, bool DEC>
__global__ void __launch_bounds__(MOE_WARPS * 32)
	k_moe_route(moe_dims d, const float *x, const float *nw, float eps, int plus_one, cu_wd R, const float *sgw,
		    float *h, float *logits, int32_t *sel, float *wt, float *sgate, unsigned *counter)
{
	extern __shared__ float hs[];
	__shared__ float red[32];
	int E = d.E, T = DEC ? 1 : d.T;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int e = blockIdx.x * MOE_WARPS + warp;
	bool sgb = sgw && blockIdx.x == gridDim.x - 1; /* the shared gate's block (no router rows) */
	cu_wrow row = cu_row(R, 0, min(e, d.ne - 1));
	typename qk<TYPE>::chunk rw[CPL > 0 ? CPL : 1];
	if (CPL > 0 && e < d.ne)
#pragma unroll
		for (int p = 0; p < CPL; p++) /* the router rows are weights: their loads fly while the previous kernel ends */
			rw[p] = cu_qload<TYPE>(R, row, 0, e, lane + 32 * p);
	float sg[MOE_SG_PER];
	if (sgb)
#pragma unroll
		for (int k = 0; k < MOE_SG_PER; k++) {
			int i = threadIdx.x + k * blockDim.x;
			sg[k] = i < E ? sgw[i] : 0.0f;
		}
	cu_pdl_wait();
	cu_pdl_trigger(); /* one wave of blocks: the next kernel may take the other SMs now */
	for (int t = 0; t < T; t++)
		cu_stage_norm<TYPE>(x + (size_t)t * E, nw, E, eps, plus_one, hs + t * E, red,
				    blockIdx.x == 0 ? h + (size_t)t * E : NULL, NULL);
	__syncthreads();
	cu_tl_mark(0); /* the norm staged */
	/* one router row per warp */
	if (e < d.ne) {
		float acc[DEC ? 1 : CU_GEMV_MAX_T] = {0};
#pragma unroll
		for (int t = 0; t < (DEC ? 1 : CU_GEMV_MAX_T); t++) {
			if (t >= T)
				break;
			if (CPL > 0) {
#pragma unroll
				for (int p = 0; p < CPL; p++)
					acc[t] += cu_qdot<TYPE>(rw[p], lane + 32 * p, hs + t * E);
			} else {
				acc[t] = moe_dot_row<TYPE>(R, 0, e, hs + t * E, E, lane);
			}
			float v = cu_warp_sum(acc[t]);
			if (lane == 0)
				logits[(size_t)t * d.ne + e] = v;
		}
	} else if (sgb) {
		for (int t = 0; t < T; t++) {
			const float *ht = hs + t * E;
			float v = 0;
#pragma unroll
			for (int k = 0; k < MOE_SG_PER; k++) {
				int i = threadIdx.x + k * blockDim.x;
				if (i < E)
					v += ht[cu_qpos<TYPE>(i)] * sg[k];
			}
			for (int i = threadIdx.x + MOE_SG_PER * blockDim.x; i < E; i += blockDim.x)
				v += ht[cu_qpos<TYPE>(i)] * sgw[i];
			v = cu_block_sum(v, red);
			if (threadIdx.x == 0)
				sgate[t] = cu_sigmoid(v);
		}
	}
	cu_tl_mark(1); /* warp 0's logit */
	if (DEC || d.pick)
		return;
	if (!cu_last_block(counter)) /* the last block to finish chooses the experts */
		return;
	for (int t = 0; t < d.T; t++) {
		if (d.ne <= 32 * MOE_WARP_TOPK) {
			if (threadIdx.x < 32)
				moe_topk_warp(d, logits + (size_t)t * d.ne, sel + (size_t)t * d.k, wt + (size_t)t * d.k);
		} else {
			moe_topk_block(d, logits + (size_t)t * d.ne, hs + d.T * E, sel + (size_t)t * d.k, wt + (size_t)t * d.k);
		}
	}
	if (threadIdx.x == 0)
		*counter = 0;
}

/* prefill, ne <= 32 * MOE_WARP_TOPK: a warp per token, 8 tokens a block */
__global__ void k_moe_topk_warps(moe_dims d, const float *h, const float *logits, const float *sgw, int32_t *sel,
				 float *wt, float *sgate)
{
	int t = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (t >= d.T)
		return;
	moe_topk_warp(d, logits + (size_t)t * d.ne, sel + (size_t)t * d.k, wt + (size_t)t * d.k);
	if (sgw) {
		float v = 0;
		for (int i = lane; i < d.E; i += 32)
			v += h[(size_t)t * d.E + i] * sgw[i];
		v = cu_warp_sum(v);
		if (lane == 0)
			sgate[t] = cu_sigmoid(v);
	}
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

/*
 * With d.pick the expert kernels choose token t's experts from the router's logits. A gate/up
 * block of routed slot j needs pick j alone (j + 1 rounds of moe_warp_topk by warp 0, into
 * *e_s); the first block of the slot also leaves it for the down kernel, which starts before its
 * dependent-launch wait and so could not wait for it otherwise: the expert in sel[t][j], its logit
 * in lv[t][j] and, for slot 0, the softmax's max and sum in ms[t][0..1]. The writer fences them
 * (moe_pick_fence) before a barrier that every thread of its block passes before any of them lets
 * the down kernel be scheduled (cu_pdl_trigger; the first thread of a block to do so does it for
 * the block). A choice of all the picks in each of the down kernel's blocks took 3.8 us of its
 * critical path.
 */
struct moe_picks {
	int32_t *sel;
	float *lv, *ms;
};

__device__ __forceinline__ void moe_pick_slot(const moe_dims &d, const float *logits, const moe_picks &pk, int t,
					      int slot, int *e_s, int warp = 0)
{
	if (!d.pick || threadIdx.x - 32u * warp >= 32u)
		return;
	int lane = threadIdx.x - 32 * warp;
	moe_warp_topk w;
	w.load(d, logits + (size_t)t * d.ne, lane);
	int ix = 0;
	float val = 0;
	bool mine = false;
	for (int r = 0; r <= slot; r++)
		mine = w.round(lane, &val, &ix);
	int e = min(moe_warp_topk::index(mine, ix), d.ne - 1); /* (NaN logits: some expert) */
	if (lane == 0)
		*e_s = e;
	if (blockIdx.x != 0)
		return;
	float mx = 0, sum = 0;
	if (slot == 0)
		w.softmax(d, lane, &mx, &sum);
	if (lane == 0) {
		pk.sel[(size_t)t * d.k + slot] = e;
		pk.lv[(size_t)t * d.k + slot] = val;
		if (slot == 0)
			pk.ms[2 * t] = mx, pk.ms[2 * t + 1] = sum;
	}
}

__device__ __forceinline__ void moe_pick_fence(const moe_dims &d, bool shared)
{
	if (d.pick && !shared && blockIdx.x == 0 && threadIdx.x == 0)
		__threadfence();
}

/* the slot's expert, chosen above or by the router, once a barrier has passed since */
__device__ __forceinline__ int moe_slot_read(const moe_dims &d, const moe_picks &pk, const int *e_s, int t, int slot)
{
	return d.pick ? *e_s : pk.sel[(size_t)t * d.k + slot];
}

/* then, by the whole block: the slot's expert, chosen above or by the router */
__device__ __forceinline__ int moe_slot_expert(const moe_dims &d, const moe_picks &pk, const int *e_s, int t, int slot)
{
	if (d.pick)
		__syncthreads();
	return moe_slot_read(d, pk, e_s, t, slot);
}

/* act[t][slot][r] = SiLU(gate·h) * (up·h), one r per warp, for slots slot0 + blockIdx.y; slot k
 * is the shared expert. CPL > 0: n_embd == 32 * CPL chunks, both rows' loads issued first. */
template <int TYPE, int CPL>
__global__ void __launch_bounds__(MOE_WARPS * 32)
	k_moe_gateup(moe_dims d, const float *h, cu_wd G, cu_wd U, const float *logits, moe_picks pk, cu_wd SG, cu_wd SU,
		     int slot0, float *act, int one_wave)
{
	extern __shared__ float hs[];
	int slot = slot0 + blockIdx.y, t = blockIdx.z, E = d.E;
	bool shared = slot == d.k;
	int n = shared ? d.Fs : d.F;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int r = blockIdx.x * MOE_WARPS + warp, rr = min(r, n - 1);
	__shared__ int e_s;
	if (!shared) { /* the routed experts are known once the router is done; the shared one now */
		cu_pdl_wait();
		moe_pick_slot(d, logits, pk, t, slot, &e_s);
	}
	size_t e = shared ? 0 : (size_t)moe_slot_expert(d, pk, &e_s, t, slot);
	cu_wd gd = shared ? SG : G, ud = shared ? SU : U;
	cu_wrow g = cu_row(gd, e, rr), u = cu_row(ud, e, rr);
	typename qk<TYPE>::chunk gw[CPL > 0 ? CPL : 1], uw[CPL > 0 ? CPL : 1];
	if (CPL > 0 && r < n)
#pragma unroll
		for (int p = 0; p < CPL; p++) {
			gw[p] = cu_qload<TYPE>(gd, g, e, rr, lane + 32 * p);
			uw[p] = cu_qload<TYPE>(ud, u, e, rr, lane + 32 * p);
		}
	if (shared)
		cu_pdl_wait();
	moe_stage<TYPE>(hs, h + (size_t)t * E, E);
	moe_pick_fence(d, shared); /* before any thread of the block passes this barrier, and so its trigger */
	__syncthreads();
	if (one_wave) /* (moe_one_wave) */
		cu_pdl_trigger();
	if (r >= n)
		return;
	float a = 0, b = 0;
	if (CPL > 0) {
#pragma unroll
		for (int p = 0; p < CPL; p++) {
			a += cu_qdot<TYPE>(gw[p], lane + 32 * p, hs);
			b += cu_qdot<TYPE>(uw[p], lane + 32 * p, hs);
		}
	} else {
		a = moe_dot_row<TYPE>(gd, e, rr, hs, E, lane);
		b = moe_dot_row<TYPE>(ud, e, rr, hs, E, lane);
	}
	if (!one_wave)
		cu_pdl_trigger();
	a = cu_warp_sum(a), b = cu_warp_sum(b);
	if (lane == 0)
		act[((size_t)t * (d.k + 1) + slot) * d.Fmax + r] = cu_silu(a) * b;
}

#define MOE_DOWN_SLOTS 12 /* slots whose loads a warp issues together */

/* the experts and weights of token t's slots slot0..slot0+nslot-1 into eid, wts (shared
 * memory; slot k is the shared expert, weighted by its gate): sel and wt as the router chose
 * them or, with d.pick, sel and the picks' logits in wt as the gate/up blocks left them, with
 * the softmax's max and sum in ms (moe_pick_slot), the weights computed here by warp 0; whole
 * block, the caller syncs. Read past L1: the down kernels read them before their
 * dependent-launch wait (see k_moe_down). */
__device__ __forceinline__ void moe_down_slots(const moe_dims &d, int t, const int32_t *sel, const float *wt,
					       const float *ms, const float *sgate, int slot0, int nslot, int32_t *eid,
					       float *wts)
{
	__shared__ int32_t psel[MOE_MAX_K];
	__shared__ float pwt[MOE_MAX_K];
	sel += (size_t)t * d.k, wt += (size_t)t * d.k;
	if (d.pick) { /* the weights as moe_topk_warp computes them; every load in flight at once */
		if (threadIdx.x < 32) {
			int lane = threadIdx.x;
			bool a = lane < d.k, b = lane + 32 < d.k;
			int e0 = a ? __ldcg(sel + lane) : 0, e1 = b ? __ldcg(sel + lane + 32) : 0;
			float l0 = a ? __ldcg(wt + lane) : 0.0f, l1 = b ? __ldcg(wt + lane + 32) : 0.0f;
			moe_pick_weights(d, lane, e0, e1, l0, l1, __ldcg(ms + 2 * t), __ldcg(ms + 2 * t + 1), psel, pwt);
		}
		__syncthreads();
	}
	for (int j = threadIdx.x; j < nslot; j += blockDim.x) {
		int s = slot0 + j;
		bool shared = s == d.k;
		eid[j] = shared ? 0 : d.pick ? psel[s] : __ldcg(sel + s);
		wts[j] = shared ? (sgate ? __ldcg(sgate + t) : 1.0f) : d.pick ? pwt[s] : __ldcg(wt + s);
	}
}

/* x[t][i] += sum over slots slot0..slot0+nslot-1 of weight * down_slot[i] · act[t][slot], one
 * row i per warp (act rows staged for TYPE). CPR > 0: every slot's row is CPR chunks and
 * nslot <= MOE_DOWN_SLOTS: the chunks of all slots are spread over the lanes and loaded first. */
template <int TYPE, int CPR>
__global__ void __launch_bounds__(MOE_WARPS * 32)
	k_moe_down(moe_dims d, float *x, cu_wd D, const int32_t *sel, const float *wt, const float *ms, cu_wd SD,
		   int slot0, int nslot, const float *sgate, const float *act)
{
	extern __shared__ float as[];
	__shared__ int32_t eid[MOE_MAX_K + 1];
	__shared__ float wts[MOE_MAX_K + 1];
	int t = blockIdx.y, E = d.E;
	/* the experts are known before the wait: this kernel starts only once every block of the
	 * gate/up kernel (or of a down kernel before it) has passed its own wait, so the router has
	 * finished, and has let it be scheduled, which the blocks that leave the picks (d.pick) do
	 * after fencing them; read past L1. The rows' loads then fly while gate/up ends. */
	moe_down_slots(d, t, sel, wt, ms, sgate, slot0, nslot, eid, wts);
	__syncthreads();
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int i = blockIdx.x * MOE_WARPS + warp;
	const int NJ = (MOE_DOWN_SLOTS * (CPR > 0 ? CPR : 1) + 31) / 32;
	typename qk<TYPE>::chunk w[CPR > 0 ? NJ : 1];
	if (CPR > 0 && i < E)
#pragma unroll
		for (int j = 0; j < NJ; j++) {
			int idx = lane + 32 * j, s = idx / (CPR > 0 ? CPR : 1), c = idx % (CPR > 0 ? CPR : 1);
			if (s < nslot) {
				cu_wd wd = slot0 + s == d.k ? SD : D;
				w[j] = cu_qload<TYPE>(wd, cu_row(wd, eid[s], i), eid[s], i, c);
			}
		}
	cu_pdl_wait();
	cu_pdl_trigger(); /* one wave of blocks at the Qwen3 shapes */
	moe_stage_rows<TYPE>(as, act + ((size_t)t * (d.k + 1) + slot0) * d.Fmax, d, slot0, nslot);
	__syncthreads();
	if (i >= E)
		return;
	float acc = 0;
	if (CPR > 0) {
#pragma unroll
		for (int j = 0; j < NJ; j++) {
			int idx = lane + 32 * j, s = idx / (CPR > 0 ? CPR : 1), c = idx % (CPR > 0 ? CPR : 1);
			if (s < nslot)
				acc += wts[s] * cu_qdot<TYPE>(w[j], c, as + s * d.Fmax);
		}
	} else {
		for (int s = 0; s < nslot; s++) {
			bool shared = slot0 + s == d.k;
			cu_wd wd = shared ? SD : D;
			acc += wts[s] * moe_dot_row<TYPE>(wd, eid[s], i, as + s * d.Fmax, shared ? d.Fs : d.F, lane);
		}
	}
	acc = cu_warp_sum(acc);
	if (lane == 0)
		x[(size_t)t * E + i] += acc;
}

/* ---- experts on tensor cores (cu_kq: every type but Q4_0 and Q4_1; one token a block, the
 * mma's column 0) ----
 * 16 rows a block, the warps splitting the units (superblocks; 128 elements of 8-bit types) two
 * in flight a warp, every load issued before the block stages its input. Gate/up: 8 warps (4
 * gate, 4 up) and three blocks an SM, so that the 352 blocks of Qwen3-Next's decode (32 row
 * tiles x 11 experts) are one wave: with 16 warps and two blocks an SM a third of them waited
 * for a second round of loads. Down: 16 warps, one block an SM (the grid is the 128 row tiles). */

#define MK_WARPS 16
#define GU_WARPS 8

/* stage nrow rows of n f32 (row j at v + j * stride; n % 256 == 0) in bf16 for cu_kq<TYPE>, with
 * their sub-block sums: xs[j][n], xsum[j][n / SUB]; whole block, a round of two groups of 8 a
 * thread (groups q0 and q0 + blockDim.x of the tot = nrow * n / 8) at a time. A thread's loads
 * of a round are issued before its shared-memory stores (a store then the next load would make
 * one L2 round trip of each: 11 of them for the MoE's down rows); a caller may issue a round's
 * loads early and store them later (moe_k4_load, moe_k4_store). */
__device__ __forceinline__ void moe_k4_load(const float *v, size_t stride, int n, int tot, int q0, float (*f)[8])
{
#pragma unroll
	for (int k = 0; k < 2; k++) {
		int q = q0 + k * blockDim.x, j = q / (n / 8), r = q - j * (n / 8);
		if (q < tot) {
			const float4 *p = (const float4 *)(v + j * stride) + 2 * r;
			float4 a = p[0], b = p[1];
			f[k][0] = a.x, f[k][1] = a.y, f[k][2] = a.z, f[k][3] = a.w;
			f[k][4] = b.x, f[k][5] = b.y, f[k][6] = b.z, f[k][7] = b.w;
		}
	}
}

template <int TYPE>
__device__ __forceinline__ void moe_k4_store(int n, int tot, int q0, float (*f)[8], bf16 *xs, float *xsum)
{
	constexpr int SUB = cu_kq<TYPE>::SUB;
#pragma unroll
	for (int k = 0; k < 2; k++) {
		int q = q0 + k * blockDim.x, j = q / (n / 8), r = q - j * (n / 8);
		if (q < tot) /* whole warps: n / 8 is a multiple of 32 */
			cu_kq_stage8<TYPE>(f[k], xs + j * n, r, xsum + j * (n / SUB) + r / (SUB / 8));
	}
}

template <int TYPE>
__device__ __forceinline__ void moe_k4_stage(const float *v, size_t stride, int nrow, int n, bf16 *xs, float *xsum)
{
	int tot = nrow * (n / 8);
	for (int q0 = threadIdx.x; q0 < tot; q0 += 2 * blockDim.x) {
		float f[2][8];
		moe_k4_load(v, stride, n, tot, q0, f);
		moe_k4_store<TYPE>(n, tot, q0, f, xs, xsum);
	}
}

/* the lane's C fragment, column 0 (c[0] row g, c[2] row g+8), to the warp's part[16] (summed
 * over the warps in a fixed order: the same bits every run) */
__device__ __forceinline__ void moe_k4_part(float *part, const float *acc, int lane)
{
	if ((lane & 3) == 0) {
		part[lane >> 2] = acc[0];
		part[(lane >> 2) + 8] = acc[2];
	}
}

/* the same for every column (the multi-token kernels): the warp's part[column][16] at pw */
__device__ __forceinline__ void moe_k4_part_cols(float *pw, const float *acc, int g, int tq)
{
	pw[16 * (2 * tq) + g] = acc[0], pw[16 * (2 * tq) + g + 8] = acc[2];
	pw[16 * (2 * tq + 1) + g] = acc[1], pw[16 * (2 * tq + 1) + g + 8] = acc[3];
}

/* row r of part[warp][16] (a warp's part every stride floats) summed over warps w0..w1-1 */
__device__ __forceinline__ float moe_k4_sum(const float *part, int r, int w0, int w1, int stride = 16)
{
	float v = 0;
	for (int w = w0; w < w1; w++)
		v += part[w * stride + r];
	return v;
}

/* act[t][slot][r0..r0+15] = SiLU(gate·h) * (up·h): warps 0-3 gate, 4-7 up, each taking
 * units w % 4, w % 4 + 4, .. of n_embd; slot k is the shared expert */
template <int TYPE>
__global__ void __launch_bounds__(GU_WARPS * 32, 3)
	k_moe_gateup_k4(moe_dims d, const float *h, cu_wd G, cu_wd U, const float *logits, moe_picks pk, cu_wd SG,
			cu_wd SU, int slot0, float *act, int one_wave)
{
	typedef cu_kq<TYPE> K;
	constexpr int SUB = K::SUB;
	extern __shared__ __align__(16) unsigned char mk_sm[];
	__shared__ float part[GU_WARPS * 16];
	int slot = slot0 + blockIdx.y, t = blockIdx.z, E = d.E;
	bool shared = slot == d.k;
	int n = shared ? d.Fs : d.F, r0 = blockIdx.x * 16;
	if (r0 >= n)
		return;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, nsb = E / K::EL;
	int up = warp >> 2, w4 = warp & 3;
	bf16 *xs = (bf16 *)mk_sm;
	float *xsum = (float *)(xs + E);
	void *sc = (float4 *)(xsum + E / SUB) + warp * 64;
	/* h (in registers when it is one round, n_embd <= 16 * blockDim.x) is staged while warp 0
	 * picks the expert, before the expert's rows are asked for: a warp's MMAs then start when
	 * its own rows are in. Staged after the loads were issued, h waited behind them (an SM with
	 * ~96 KB in flight holds a load's issue until others return), the barrier after it for
	 * nearly all of the SM's rows, and every warp's MMAs ran after that (2.7 us; 0.7 us a
	 * launch slower, docs/PERF.md). The shared expert's rows too wait for the router: asked
	 * for while it ran, they slowed the step (-1%, docs/PERF.md) */
	bool early = E / 8 <= 2 * (int)blockDim.x;
	float hv[2][8];
	__shared__ int e_s;
	cu_pdl_wait();
	if (early)
		moe_k4_load(h + (size_t)t * E, 0, E, E / 8, threadIdx.x, hv);
	if (!shared)
		moe_pick_slot(d, logits, pk, t, slot, &e_s);
	if (early)
		moe_k4_store<TYPE>(E, E / 8, threadIdx.x, hv, xs, xsum);
	else
		moe_k4_stage<TYPE>(h + (size_t)t * E, 0, 1, E, xs, xsum);
	moe_pick_fence(d, shared); /* before any thread of the block passes this barrier, and so its trigger */
	__syncthreads();
	if (one_wave) /* (moe_one_wave) */
		cu_pdl_trigger();
	size_t e = shared ? 0 : (size_t)moe_slot_read(d, pk, &e_s, t, slot);
	cu_tl_mark(0); /* h staged, the expert picked */
	cu_wd wd = up ? (shared ? SU : U) : (shared ? SG : G);
	cu_krows rows = cu_krows_of<TYPE>(wd, e, r0, lane);
	typename K::ld L[2]; /* two units in flight: n_embd 2048 is two superblocks a warp */
	if (w4 < nsb)
		L[0] = K::load(wd, rows, w4, lane);
	if (w4 + 4 < nsb)
		L[1] = K::load(wd, rows, w4 + 4, lane);
	cu_tl_mark(1); /* warp 0's loads issued */
	float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
	for (int sb0 = w4; sb0 < nsb; sb0 += 8) {
#pragma unroll
		for (int k = 0; k < 2; k++) {
			int sb = sb0 + 4 * k;
			if (sb >= nsb)
				break;
			__syncwarp();
			K::scales(wd, L[k], sc, lane);
			__syncwarp();
			K::template mma<1>(acc, L[k], sc, xs + sb * K::EL, xsum + sb * (K::EL / SUB), NULL, 1.0f, g, tq);
			if (sb + 8 < nsb)
				L[k] = K::load(wd, rows, sb + 8, lane);
		}
	}
	cu_tl_mark(2); /* warp 0's MMAs */
	moe_k4_part(part + 16 * warp, acc, lane);
	__syncthreads();
	cu_tl_mark(3); /* every warp's */
	if (!one_wave)
		cu_pdl_trigger();
	if (threadIdx.x < 16 && r0 + threadIdx.x < n) /* gate: warps 0-3, up: 4-7 */
		act[((size_t)t * (d.k + 1) + slot) * d.Fmax + r0 + threadIdx.x] =
			cu_silu(moe_k4_sum(part, threadIdx.x, 0, 4)) * moe_k4_sum(part, threadIdx.x, 4, 8);
}

/* the same for every token of a step of several (T <= 8) in one block, so that the grid stays
 * the one wave of T = 1 (a block a token made a step of two two waves: 8.1 us became 14.4).
 * The slot's tokens are grouped by the expert they chose (__match_any; the shared expert's are
 * one group) and a unit is (group, superblock): a group's rows are read once, and a lane's mma
 * column c reads token c's h where token c is in the unit's group, zeros elsewhere. A kernel of
 * its own: T = 1's is at its 80 registers, and folding this into it spilled there. */
template <int TYPE>
__global__ void __launch_bounds__(GU_WARPS * 32, 3)
	k_moe_gateup_k4_mt(moe_dims d, const float *h, cu_wd G, cu_wd U, const float *logits, moe_picks pk, cu_wd SG,
			   cu_wd SU, float *act, int one_wave)
{
	typedef cu_kq<TYPE> K;
	constexpr int SUB = K::SUB;
	extern __shared__ __align__(16) unsigned char mk_sm[];
	__shared__ float part[GU_WARPS * 8 * 16];
	__shared__ int e_s[CU_GEMV_MAX_T];
	int slot = blockIdx.y, T = d.T, E = d.E;
	bool shared = slot == d.k;
	int n = shared ? d.Fs : d.F, r0 = blockIdx.x * 16;
	if (r0 >= n)
		return;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, nsb = E / K::EL;
	int up = warp >> 2, w4 = warp & 3;
	bf16 *xs = (bf16 *)mk_sm;
	float *xsum = (float *)(xs + T * E);
	void *sc = (float4 *)(xsum + T * (E / SUB)) + warp * 64;
	bf16 *zx = (bf16 *)((float4 *)sc + (GU_WARPS - warp) * 64); /* E zeros, then E / SUB sums of them */
	float *zsum = (float *)(zx + E);
	/* as k_moe_gateup_k4: h staged (from registers when it is one round) while warp t picks
	 * token t's expert */
	bool early = T * E / 8 <= 2 * (int)blockDim.x;
	float hv[2][8];
	cu_pdl_wait();
	if (early)
		moe_k4_load(h, E, E, T * E / 8, threadIdx.x, hv);
	if (!shared && warp < T)
		moe_pick_slot(d, logits, pk, warp, slot, e_s + warp, warp);
	for (int i = threadIdx.x; i < E / 2 + E / SUB; i += blockDim.x)
		((float *)zx)[i] = 0.0f;
	if (early)
		moe_k4_store<TYPE>(E, T * E / 8, threadIdx.x, hv, xs, xsum);
	else
		moe_k4_stage<TYPE>(h, E, T, E, xs, xsum);
	if (d.pick && !shared && blockIdx.x == 0 && lane == 0 && warp < T) /* (moe_pick_fence, each picker's) */
		__threadfence();
	__syncthreads();
	if (one_wave)
		cu_pdl_trigger();
	/* lane i < ng: group i's tokens gm and its matrix's base gb (tokens past T: no expert's id) */
	int te = lane < T ? (shared ? 0 : moe_slot_read(d, pk, e_s + lane, lane, slot)) : -1 - lane;
	unsigned same = __match_any_sync(0xffffffffu, te);
	unsigned lead = __ballot_sync(0xffffffffu, lane < T && !(same & ((1u << lane) - 1)));
	int ng = __popc(lead), at = __fns(lead, 0, min(lane, ng - 1) + 1);
	unsigned gm = __shfl_sync(0xffffffffu, same, at);
	cu_wd wd = up ? (shared ? SU : U) : (shared ? SG : G);
	unsigned long long gb =
		(unsigned long long)(wd.base + (size_t)__shfl_sync(0xffffffffu, te, at) * wd.stride);
	cu_krows o = cu_krows_of<TYPE>(wd, 0, r0, lane); /* the lane's offsets in a matrix */
	unsigned oa = (unsigned)(o.a - wd.base), oh = (unsigned)(o.h - wd.base); /* (an expert's matrix < 4 GB) */
	cu_tl_mark(0); /* h staged, the experts picked */
	int nw = w4 < nsb ? (nsb - w4 + 3) / 4 : 0, units = ng * nw; /* the warp's units: group u / nw */
	auto load = [&](int u) {
		int gi = u / nw;
		const uint8_t *b = (const uint8_t *)__shfl_sync(0xffffffffu, gb, gi);
		return K::load(wd, cu_krows{b + oa, b + oh}, w4 + 4 * (u - gi * nw), lane);
	};
	typename K::ld L[2];
	if (units > 0)
		L[0] = load(0);
	if (units > 1)
		L[1] = load(1);
	cu_tl_mark(1); /* warp 0's loads issued */
	float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
	for (int u0 = 0; u0 < units; u0 += 2) {
#pragma unroll
		for (int k = 0; k < 2; k++) {
			int u = u0 + k;
			if (u >= units)
				break;
			int gi = u / nw, sb = w4 + 4 * (u - gi * nw);
			unsigned m = __shfl_sync(0xffffffffu, gm, gi);
			const bf16 *xb = m >> g & 1 ? xs + g * E : zx;
			const float *s0 = m >> (2 * tq) & 1 ? xsum + 2 * tq * (E / SUB) : zsum;
			const float *s1 = m >> (2 * tq + 1) & 1 ? xsum + (2 * tq + 1) * (E / SUB) : zsum;
			__syncwarp();
			K::scales(wd, L[k], sc, lane);
			__syncwarp();
			K::template mma<2>(acc, L[k], sc, xb + sb * K::EL, s0 + sb * (K::EL / SUB), s1 + sb * (K::EL / SUB),
					   1.0f, g, tq);
			if (u + 2 < units)
				L[k] = load(u + 2);
		}
	}
	cu_tl_mark(2); /* warp 0's MMAs */
	moe_k4_part_cols(part + 16 * 8 * warp, acc, g, tq); /* part[warp][column][row] */
	__syncthreads();
	cu_tl_mark(3); /* every warp's */
	if (!one_wave)
		cu_pdl_trigger();
	int ot = (int)threadIdx.x >> 4, oi = threadIdx.x & 15; /* gate: warps 0-3, up: 4-7 */
	if (ot < T && r0 + oi < n)
		act[((size_t)ot * (d.k + 1) + slot) * d.Fmax + r0 + oi] =
			cu_silu(moe_k4_sum(part + 16 * ot, oi, 0, 4, 16 * 8)) * moe_k4_sum(part + 16 * ot, oi, 4, 8, 16 * 8);
}

/* the k4 expert kernels' shared memory: rows staged rows of n (bf16, and their sums per sub),
 * each of the warps' scales, and (mt) a row of zeros with its sums */
static size_t moe_k4_smem(size_t rows, int n, int sub, int warps, bool mt)
{
	return (rows + mt) * ((size_t)n * 2 + n / sub * 4) + (size_t)warps * 64 * 16;
}

/* T = 1: h; MT: every token's h */
static size_t moe_k4_gateup_smem(const moe_dims &d, int sub, bool mt)
{
	return moe_k4_smem(mt ? (size_t)d.T : 1, d.E, sub, GU_WARPS, mt);
}

/* x[t][r0..r0+15] += sum over slots slot0.. of weight * down_slot · act[t][slot]: the block's
 * warps take the (slot, unit) pairs in turn, two in flight. One token a block (grid.y), or with
 * MT every token of a step of several (T <= 8, slot0 0) in one block: a unit is then (token,
 * slot, superblock), token t in the mma's column t (the lane's other columns read zeros), so the
 * grid stays one wave of the row tiles (with a block row a token, a step of two took two waves:
 * down's 5.4 us became 11.7) and the shared expert's rows, read by every token, come from L2 */
template <int TYPE, bool MT>
__global__ void __launch_bounds__(MK_WARPS * 32, 1)
	k_moe_down_k4(moe_dims d, float *x, cu_wd D, const int32_t *sel, const float *wt, const float *ms, cu_wd SD,
		      int slot0, int nslot, const float *sgate, const float *act)
{
	typedef cu_kq<TYPE> K;
	constexpr int SUB = K::SUB, NT = MT ? CU_GEMV_MAX_T : 1;
	extern __shared__ __align__(16) unsigned char mk_sm[];
	__shared__ int32_t eid[NT * (MOE_MAX_K + 1)];
	__shared__ float wts[NT * (MOE_MAX_K + 1)];
	__shared__ float part[MK_WARPS * 16 * (MT ? 8 : 1)];
	int T = MT ? d.T : 1, t0 = MT ? 0 : blockIdx.y, E = d.E, F = d.F, r0 = blockIdx.x * 16;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
	int nsb = F / K::EL, tu = nslot * nsb, units = T * tu;
	int srow = MT ? d.k + 1 : nslot; /* staged rows a token (MT: act's own, slot k staged even unused) */
	bf16 *xs = (bf16 *)mk_sm;
	float *xsum = (float *)(xs + T * srow * F);
	void *sc = (float4 *)(xsum + T * srow * (F / SUB)) + warp * 64;
	bf16 *zx = (bf16 *)((float4 *)sc + (MK_WARPS - warp) * 64); /* MT: F zeros, then F / SUB sums of them */
	float *zsum = (float *)(zx + F);
	/* the experts are known before the wait (see k_moe_down) */
	for (int t = 0; t < T; t++) {
		if (t)
			__syncthreads(); /* (moe_down_slots' picks in shared memory, read by every thread) */
		moe_down_slots(d, t0 + t, sel, wt, ms, sgate, slot0, nslot, eid + t * nslot, wts + t * nslot);
	}
	if (MT)
		for (int i = threadIdx.x; i < F / 2 + F / SUB; i += blockDim.x)
			((float *)zx)[i] = 0.0f;
	__syncthreads();
	auto load = [&](int u) {
		int t = MT ? u / tu : 0, j = (u - t * tu) / nsb;
		cu_wd wd = slot0 + j == d.k ? SD : D;
		return K::load(wd, cu_krows_of<TYPE>(wd, (size_t)eid[t * nslot + j], r0, lane), u - t * tu - j * nsb, lane);
	};
	typename K::ld L[2];
	if (warp < units)
		L[0] = load(warp);
	if (warp + MK_WARPS < units)
		L[1] = load(warp + MK_WARPS);
	/* x, the residual this block adds to, is read before the wait too when this is the op's first
	 * down launch: gate/up, the kernel before it, writes only act and lets this kernel start only
	 * after its own wait returned, so x's last writer (the projection before the router) has
	 * completed (a later launch would follow one that adds to x). Its round trip was at the
	 * kernel's end. Thread 16 t + i has row r0 + i of token t. */
	int ot = (int)threadIdx.x >> 4, oi = threadIdx.x & 15;
	bool mine = ot < T && r0 + oi < E, pre = mine && slot0 == 0; /* (mine: an output row) */
	float *xo = x + (size_t)(t0 + ot) * E + r0 + oi, xr = pre ? __ldcg(xo) : 0.0f;
	cu_pdl_wait();
	cu_pdl_trigger(); /* one wave of blocks at the Qwen3 shapes */
	moe_k4_stage<TYPE>(act + ((size_t)t0 * (d.k + 1) + slot0) * d.Fmax, d.Fmax, T * srow, F, xs, xsum);
	__syncthreads();
	cu_tl_mark(0); /* act staged */
	float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
	for (int u0 = warp; u0 < units; u0 += 2 * MK_WARPS) {
#pragma unroll
		for (int k = 0; k < 2; k++) {
			int u = u0 + k * MK_WARPS;
			if (u >= units)
				break;
			int t = MT ? u / tu : 0, j = (u - t * tu) / nsb, sb = u - t * tu - j * nsb, row = t * srow + j;
			const bf16 *xb = xs + row * F;
			const float *s0 = xsum + row * (F / SUB), *s1 = s0;
			if (MT) { /* column t is the token's; the lane's others read zeros */
				xb = g == t ? xb : zx;
				s1 = 2 * tq + 1 == t ? s0 : zsum;
				s0 = 2 * tq == t ? s0 : zsum;
			}
			__syncwarp();
			K::scales(slot0 + j == d.k ? SD : D, L[k], sc, lane);
			__syncwarp();
			K::template mma<MT ? 2 : 1>(acc, L[k], sc, xb + sb * K::EL, s0 + sb * (K::EL / SUB),
						    s1 + sb * (K::EL / SUB), wts[t * nslot + j], g, tq);
			if (u + 2 * MK_WARPS < units)
				L[k] = load(u + 2 * MK_WARPS);
		}
	}
	cu_tl_mark(1); /* warp 0's MMAs */
	if (MT) /* part[warp][column][row] */
		moe_k4_part_cols(part + 16 * 8 * warp, acc, g, tq);
	else
		moe_k4_part(part + 16 * warp, acc, lane);
	__syncthreads();
	cu_tl_mark(2); /* every warp's */
	if (mine)
		*xo = (pre ? xr : *xo) + moe_k4_sum(part + 16 * ot, oi, 0, MK_WARPS, MT ? 16 * 8 : 16);
}

/* the act rows of the nslot slots; MT: every token's (slot k's too) */
static size_t moe_k4_down_smem(const moe_dims &d, int nslot, int sub, bool mt)
{
	return moe_k4_smem(mt ? (size_t)d.T * (d.k + 1) : (size_t)nslot, d.F, sub, MK_WARPS, mt);
}

/* ---- kernel types: a kernel compiled per weight type (the fast ones), any other type through
 * CU_QT_ANY ---- */

static int moe_ktype(int t)
{
	switch (t) {
	case TOAST_DT_BF16:
	case TOAST_DT_Q4_K:
	case TOAST_DT_MLX4:
	case TOAST_DT_Q8_0:
	case TOAST_DT_Q5_K:
	case TOAST_DT_Q6_K:
	case TOAST_DT_MLX8: return t;
	default: return CU_QT_ANY;
	}
}

/* fn(std::integral_constant<int, k>()) for a kernel type k of moe_ktype: the kernels' template
 * argument from a runtime type */
template <typename Fn>
static void moe_with_ktype(int k, Fn fn)
{
	switch (k) {
	case TOAST_DT_BF16: return fn(std::integral_constant<int, TOAST_DT_BF16>());
	case TOAST_DT_Q4_K: return fn(std::integral_constant<int, TOAST_DT_Q4_K>());
	case TOAST_DT_MLX4: return fn(std::integral_constant<int, TOAST_DT_MLX4>());
	case TOAST_DT_Q8_0: return fn(std::integral_constant<int, TOAST_DT_Q8_0>());
	case TOAST_DT_Q5_K: return fn(std::integral_constant<int, TOAST_DT_Q5_K>());
	case TOAST_DT_Q6_K: return fn(std::integral_constant<int, TOAST_DT_Q6_K>());
	case TOAST_DT_MLX8: return fn(std::integral_constant<int, TOAST_DT_MLX8>());
	default: return fn(std::integral_constant<int, CU_QT_ANY>());
	}
}

/* gate and up are read by one kernel: of one type */
static int moe_ktype2(int g, int u)
{
	return g == u ? moe_ktype(g) : CU_QT_ANY;
}

/* the grouped GEMM's kernel type: each weight type; CU_QT_ANY for gate and up of two types or
 * layouts (compiled for a type, the kernel takes up's layout to be gate's) */
static int moe_gg_ktype(const cu_wd &g, const cu_wd &u)
{
	bool same = g.type == u.type && g.stride == u.stride && g.m_off == u.m_off && g.b_off == u.b_off &&
		    g.q_row == u.q_row && g.m_row == u.m_row && g.sb_type == u.sb_type && g.gs == u.gs;
	return same && (g.type == TOAST_DT_BF16 || toast_dtype_is_quant((enum toast_dtype)g.type)) ? cu_ktype(g) : CU_QT_ANY;
}

template <typename Fn>
static void moe_gg_with_ktype(int k, Fn fn)
{
	switch (k) {
	case TOAST_DT_BF16: return fn(std::integral_constant<int, TOAST_DT_BF16>());
	case TOAST_DT_Q4_0: return fn(std::integral_constant<int, TOAST_DT_Q4_0>());
	case TOAST_DT_Q4_1: return fn(std::integral_constant<int, TOAST_DT_Q4_1>());
	case TOAST_DT_Q8_0: return fn(std::integral_constant<int, TOAST_DT_Q8_0>());
	case TOAST_DT_Q4_K: return fn(std::integral_constant<int, TOAST_DT_Q4_K>());
	case TOAST_DT_Q5_K: return fn(std::integral_constant<int, TOAST_DT_Q5_K>());
	case TOAST_DT_Q6_K: return fn(std::integral_constant<int, TOAST_DT_Q6_K>());
	case TOAST_DT_MLX4: return fn(std::integral_constant<int, TOAST_DT_MLX4>());
	case TOAST_DT_MLX8: return fn(std::integral_constant<int, TOAST_DT_MLX8>());
	default: return fn(std::integral_constant<int, CU_QT_ANY>());
	}
}

/* ---- prefill: tokens grouped by expert, grouped tensor-core GEMMs over the groups ---- */

#define GG_BM 64      /* token rows per block (the row tiles of k_moe_scan), or GG_BM2: */
#define GG_BM2 128    /* K-quant and bf16 weights when the groups average this many rows: each
			 tile of weights serves (K-quants: is dequantised for) twice the rows */
#define GG_BN 128     /* weight rows per block: 128 outputs (down), or 64 of gate and 64 of up */
#define GG_BK 64      /* k per pipeline stage: rows of 128 bytes in shared memory */
#define GG_STAGES 3
/* a warp's weight-tile rows: 64 with bf16 weights (copied by cp.async); 32 with packed ones,
 * whose next step waits dequantised in registers (more would not fit beside the accumulators) */
#define GG_WN(TYPE) ((TYPE) == TOAST_DT_BF16 ? 64 : 32)
#define GG_THREADS(TYPE, BM) (GG_BN / GG_WN(TYPE) * 32 * ((BM) / GG_BM)) /* warps: BM / 64 x GG_BN / WN */
#define GG_A_BYTES(BM) ((BM) * GG_BK * 2)
#define GG_STAGE_BYTES(BM) (((BM) + GG_BN) * GG_BK * 2)
#define GG_SMEM(BM) (GG_STAGES * GG_STAGE_BYTES(BM))

__global__ void k_moe_count(const int32_t *sel, int n, int32_t *counts)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		atomicAdd(&counts[sel[i]], 1);
}

/* one block: offsets = exclusive scan of counts, tiles = exclusive scan of the bm-row tiles
 * each expert's group needs; cursors zeroed */
__global__ void k_moe_scan(const int32_t *counts, int ne, int bm, int32_t *offsets, int32_t *tiles, int32_t *cursor)
{
	if (threadIdx.x == 0) {
		int acc = 0, tacc = 0;
		for (int e = 0; e < ne; e++) {
			offsets[e] = acc;
			tiles[e] = tacc;
			acc += counts[e];
			tacc += (counts[e] + bm - 1) / bm;
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

/* x[t][i] += sum_s wt[t][s] * y[inv[t][s]][i] + sgate[t] * ys[t][i], slots in order; eight i
 * a thread (E % 8 == 0) */
__global__ void k_moe_combine(float *x, int E, int k, const int32_t *inv, const float *wt, const bf16 *y,
			      const float *ys, const float *sgate)
{
	int t = blockIdx.x;
	for (int i = 8 * threadIdx.x; i < E; i += 8 * blockDim.x) {
		float acc[8] = {};
		for (int s = 0; s < k; s++) {
			float w = wt[(size_t)t * k + s];
			uint4 v = *(const uint4 *)(y + (size_t)inv[(size_t)t * k + s] * E + i);
			const __nv_bfloat162 *v2 = (const __nv_bfloat162 *)&v;
#pragma unroll
			for (int j = 0; j < 4; j++) {
				float2 f = __bfloat1622float2(v2[j]);
				acc[2 * j] += w * f.x;
				acc[2 * j + 1] += w * f.y;
			}
		}
		float4 *xo = (float4 *)(x + (size_t)t * E + i);
		float g = sgate ? sgate[t] : 1.0f;
#pragma unroll
		for (int h = 0; h < 2; h++) {
			float4 o = xo[h];
			if (ys) {
				float4 sv = *(const float4 *)(ys + (size_t)t * E + i + 4 * h);
				acc[4 * h] += g * sv.x, acc[4 * h + 1] += g * sv.y;
				acc[4 * h + 2] += g * sv.z, acc[4 * h + 3] += g * sv.w;
			}
			o.x += acc[4 * h], o.y += acc[4 * h + 1], o.z += acc[4 * h + 2], o.w += acc[4 * h + 3];
			xo[h] = o;
		}
	}
}

/* the byte offset of 16-byte chunk c (of 8) of row r in a tile of GG_BK-element rows: chunks
 * XOR-swizzled by the row, so the 8 rows an ldmatrix phase reads at one chunk, and the 8 chunks
 * of a row that consecutive threads store, lie in distinct banks */
__device__ __forceinline__ uint32_t gg_swz(int r, int c)
{
	return (uint32_t)(r * (GG_BK * 2) + ((c ^ (r & 7)) << 4));
}

/* a float as the bf16 a GEMM with bf16 output would have stored */
__device__ __forceinline__ float gg_bf16r(float x)
{
	return __bfloat162float(__float2bfloat16(x));
}

/*
 * Grouped GEMM on tensor cores for the experts at prefill: for every expert e,
 * C[rows of e] = X[rows of e] · W[e]ᵀ, X [n_rows][K] bf16 grouped by expert (offsets) or, with
 * xrow, X[xrow[row]] (the token's row read in place: no gathered copy), W [ne][N][K]
 * (bf16 or packed, of kernel type TYPE). A block computes a BM-row tile (64, or 128) of one expert's
 * group (blockIdx.y runs over the groups' row tiles: tiles[] is their exclusive scan, so no host
 * needs the counts) against GG_BN = 128 weight rows (blockIdx.x, fastest, so the column tiles of
 * one row tile run together and read its X rows from DRAM once):
 *   GATEUP: rows col0.. of gate (W) and the same 64 rows of up (U); C = act [n_rows][N] bf16,
 *           bf16(SiLU(bf16(gate)) * bf16(up)): the rounding of separate gate and up GEMMs;
 *   else:   rows col0..col0+127 of W (down); C [n_rows][N] bf16, like every activation.
 * BM / 64 x GG_BN / WN warps, each 64 token rows x WN = GG_WN(TYPE) weight rows (GATEUP: WN / 2 of
 * gate and the same rows of up, so a thread holds both halves of its outputs) as 4 x WN / 8
 * mma.sync m16n8k16 bf16 tiles accumulating in f32, operands from shared memory by ldmatrix (at
 * WN 32, 6 ldmatrix.x4 a 16 MMAs; at 64, 8 a 32: the shared-memory reads, more than the tensor
 * cores, bound this kernel). K runs in steps of GG_BK = 64
 * through a ring of GG_STAGES = 3 stages: X tiles by cp.async two steps ahead (rows past the
 * group zero-filled); bf16 weights the same; packed weights one step ahead into registers
 * (cu_dq8_load: loads only), dequantised into the next stage after the current step's MMAs
 * (cu_dq8_cvt), so their latency hides behind one step of MMAs. One barrier per step.
 * N % 64 (GATEUP) or N % 128, K % 64 == 0; blockDim GG_THREADS(TYPE, BM), GG_SMEM(BM) bytes of
 * shared memory. At BM 128 each thread converts half the weights a step that it does at 64.
 */
template <int TYPE, bool GATEUP, int BM>
__global__ void __launch_bounds__(GG_THREADS(TYPE, BM), (TYPE == TOAST_DT_BF16 ? 3 : 2) / (BM / GG_BM))
	k_moe_gg(const bf16 *X, const int32_t *xrow, cu_wd W, cu_wd U, void *out, const int32_t *offsets,
		 const int32_t *tiles, int ne, int N, int K)
{
	extern __shared__ __align__(128) uint8_t gg_sm[];
	int tile = blockIdx.y;
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
	int row0 = offsets[e] + (tile - tiles[e]) * BM, row_end = offsets[e + 1];
	int col0 = blockIdx.x * (GATEUP ? GG_BN / 2 : GG_BN);
	constexpr int WN = GG_WN(TYPE), RS = GG_THREADS(TYPE, BM) / 8, NX = BM / RS, NW = GG_BN / RS;
	constexpr int A_BYTES = GG_A_BYTES(BM), STAGE_BYTES = GG_STAGE_BYTES(BM);
	/* warp (wm, wn): token rows 64 wm.., weight-tile rows WN wn.. */
	int tid = threadIdx.x, lane = tid & 31;
	int wm = BM > GG_BM ? (tid >> 5) / (GG_BN / WN) : 0, wn = BM > GG_BM ? (tid >> 5) % (GG_BN / WN) : tid >> 5;
	uint32_t sm = cu_smem_addr(gg_sm);

	/* loads: thread tid fills chunk lc of rows lr + RS u: rows 0..BM-1 of the X tile (u < NX),
	 * rows 0..127 of the weight tile (u < NW). GATEUP: each warp's WN weight-tile rows are WN / 2
	 * rows of gate, then the same rows of up: tile row b is row col0 + WN / 2 (b / WN) + b % (WN / 2)
	 * of gate (b % WN < WN / 2) or up. Else tile row b is row col0 + b. */
	int lr = tid >> 3, lc = tid & 7;
	/* a tiled weight's rows g and g + 8 lie together (cu_quant.cuh): a warp's four tile rows
	 * are c, c + 8, c + 1, c + 9, whose 32 bytes of a run are 128 contiguous ones (c, c + 1, c + 2,
	 * c + 3 read every other 8 bytes of 256: the prefill 4% slower) */
	static_assert(!cu_tiled_kind(TYPE) || RS % 16 == 0, "whole tiles a load pass");
	int wr = cu_tiled_kind(TYPE) ? (lr & ~15) | ((lr >> 1) & 7) | ((lr & 1) << 3) : lr;
	const bf16 *xa[NX];
	bool xok[NX];
#pragma unroll
	for (int u = 0; u < NX; u++) {
		int r = row0 + lr + RS * u;
		xok[u] = r < row_end;
		r = xok[u] ? r : row0;
		xa[u] = X + (size_t)(xrow ? xrow[r] : r) * K + 8 * lc;
	}
	constexpr int UW = WN / RS; /* loads a warp's tile rows take: 2 or more at BM 64, 1 at 128 */
	static_assert(UW >= 1 && (UW > 1 || RS == WN), "a load pass covers whole warp tiles");
	auto wup = [&](int u) { /* (which u alone decides, unless a pass covers a whole warp tile) */
		return GATEUP && (UW > 1 ? RS * (u % UW) >= WN / 2 : wr >= WN / 2);
	};
	auto wmat = [&](int u) -> cu_wd { return wup(u) ? U : W; };
	auto wrow = [&](int u, int w_) { /* the row of pass u (w_ = wr) */
		if (!GATEUP)
			return col0 + w_ + RS * u;
		return UW > 1 ? col0 + WN / 2 * (u / UW) + RS * (u % UW) + w_ - (wup(u) ? WN / 2 : 0)
			      : col0 + WN / 2 * u + w_ % (WN / 2);
	};
	/* a pass's packed rows: a tiled weight's row lies at wr % 16 in its tile (the passes' rows are
	 * 16 apart), so the tile alone is figured a step, not the row's place in it */
	auto wload = [&](int u, int k) {
		if constexpr (cu_tiled_kind(TYPE))
			return cu_dq8_at<TYPE>(wmat(u), cu_trow_at(wmat(u), (size_t)e, wrow(u, wr & ~15) >> 4, wr & 15,
							      cu_tmu<TYPE>(W)), k);
		else
			return cu_dq8_load<TYPE>(wmat(u), (size_t)e, wrow(u, wr), k);
	};
	auto load_x = [&](int s, int k0) {
#pragma unroll
		for (int u = 0; u < NX; u++)
			cu_cp16(sm + s * STAGE_BYTES + gg_swz(lr + RS * u, lc), xa[u] + k0, xok[u]);
	};
	auto load_w_async = [&](int s, int k0) { /* bf16 weights */
#pragma unroll
		for (int u = 0; u < NW; u++)
			cu_cp16(sm + s * STAGE_BYTES + A_BYTES + gg_swz(wr + RS * u, lc),
				cu_row(wmat(u), (size_t)e, wrow(u, wr)).q + 2 * (k0 + 8 * lc), true);
	};
	/* packed weights: the raw words of the next step in registers; of any type (CU_QT_ANY) they
	 * would not fit beside the accumulators: loaded and converted at once, not hidden */
	const bool prefetch = TYPE != CU_QT_ANY;
	cu_dq8_raw raw[prefetch ? NW : 1];
	auto load_w_raw = [&](int k0) {
#pragma unroll
		for (int u = 0; u < NW; u++)
			raw[u] = wload(u, k0 + 8 * lc);
	};
	auto store_w = [&](int s, int k0) {
#pragma unroll
		for (int u = 0; u < NW; u++) {
			float y[8];
			cu_dq8_raw r = prefetch ? raw[u] : wload(u, k0 + 8 * lc);
			cu_dq8_cvt<TYPE>(wmat(u), r, k0 + 8 * lc, y);
			__nv_bfloat162 b2[4];
#pragma unroll
			for (int j = 0; j < 4; j++)
				b2[j] = __floats2bfloat162_rn(y[2 * j], y[2 * j + 1]);
			*(uint4 *)(gg_sm + s * STAGE_BYTES + A_BYTES + gg_swz(wr + RS * u, lc)) = *(const uint4 *)b2;
		}
	};

	/* MMAs of one stage: warp (wm, wn) takes X rows 64 wm.. and weight tile rows WN wn.. */
	float acc[4][WN / 8][4] = {};
	auto compute = [&](int s) {
		uint32_t xs = sm + s * STAGE_BYTES, ws = xs + A_BYTES;
#pragma unroll
		for (int kk = 0; kk < GG_BK / 16; kk++) {
			uint32_t af[4][4], bfr[WN / 16][4];
			/* A 16x16: lanes 0-15 rows 0-15 at k 0-7, lanes 16-31 the same rows at k 8-15 */
#pragma unroll
			for (int i = 0; i < 4; i++)
				cu_ldsm4<false>(af[i], xs + gg_swz(64 * wm + 16 * i + (lane & 15), 2 * kk + (lane >> 4)));
			/* B 16 weight rows x 16 k: matrices (rows 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7),
			 * (8-15, 8-15): {r0, r1} is the first n8 tile, {r2, r3} the second */
#pragma unroll
			for (int jj = 0; jj < WN / 16; jj++)
				cu_ldsm4<false>(bfr[jj], ws + gg_swz(WN * wn + 16 * jj + (lane & 7) + ((lane >> 4) << 3),
							      2 * kk + ((lane >> 3) & 1)));
#pragma unroll
			for (int i = 0; i < 4; i++)
#pragma unroll
				for (int j = 0; j < WN / 8; j++)
					cu_mma_bf16(acc[i][j], af[i], bfr[j >> 1][2 * (j & 1)], bfr[j >> 1][2 * (j & 1) + 1]);
		}
	};

	const bool async_w = TYPE == TOAST_DT_BF16;
	int nk = K / GG_BK;
#pragma unroll
	for (int s = 0; s < GG_STAGES - 1; s++) {
		if (s < nk) {
			load_x(s, s * GG_BK);
			if (async_w)
				load_w_async(s, s * GG_BK);
		}
		cu_cp_commit();
	}
	if (!async_w) {
		if (prefetch)
			load_w_raw(0);
		store_w(0, 0);
	}
	for (int kt = 0; kt < nk; kt++) {
		cu_cp_wait<GG_STAGES - 2>(); /* this thread's copies of step kt have landed */
		__syncthreads();          /* everyone's have; step kt - 1's stage is free */
		int kn = kt + GG_STAGES - 1;
		if (kn < nk) {
			load_x(kn % GG_STAGES, kn * GG_BK);
			if (async_w)
				load_w_async(kn % GG_STAGES, kn * GG_BK);
		}
		cu_cp_commit();
		bool next = !async_w && kt + 1 < nk;
		if (next && prefetch)
			load_w_raw((kt + 1) * GG_BK);
		compute(kt % GG_STAGES);
		if (next) /* stage kt + 1 was last read at step kt + 1 - GG_STAGES, before this step's barrier */
			store_w((kt + 1) % GG_STAGES, (kt + 1) * GG_BK);
	}

	/* accumulator (i, j): rows 16 i + g (c0, c1) and 16 i + g + 8 (c2, c3), columns 8 j + 2 t4 + {0, 1} */
	int g = lane >> 2, t4 = lane & 3;
#pragma unroll
	for (int i = 0; i < 4; i++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			int r = row0 + 64 * wm + 16 * i + g + 8 * h;
			if (r >= row_end)
				continue;
			if constexpr (GATEUP) {
				bf16 *o = (bf16 *)out + (size_t)r * N + col0 + WN / 2 * wn + 2 * t4;
#pragma unroll
				for (int j = 0; j < WN / 16; j++) {
					float g0 = gg_bf16r(acc[i][j][2 * h]), g1 = gg_bf16r(acc[i][j][2 * h + 1]);
					float u0 = gg_bf16r(acc[i][j + WN / 16][2 * h]);
					float u1 = gg_bf16r(acc[i][j + WN / 16][2 * h + 1]);
					*(__nv_bfloat162 *)(o + 8 * j) = __floats2bfloat162_rn(cu_silu(g0) * u0, cu_silu(g1) * u1);
				}
			} else {
				bf16 *o = (bf16 *)out + (size_t)r * N + col0 + WN * wn + 2 * t4;
#pragma unroll
				for (int j = 0; j < WN / 8; j++)
					*(__nv_bfloat162 *)(o + 8 * j) =
						__floats2bfloat162_rn(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
			}
		}
}

/* one grouped GEMM: act = SiLU(X·Gᵀ) * (X·Uᵀ) (GATEUP) or out = X·Wᵀ, out bf16 [n_rows][N] */
template <int TYPE, bool GATEUP, int BM>
static void moe_gg(struct cuda_backend *cb, const bf16 *X, const int32_t *xrow, const cu_wd &W, const cu_wd &U,
		   void *out, const int32_t *offs, const int32_t *tiles, unsigned max_tiles, int ne, int N, int K)
{
	static size_t room; /* set once per kernel: GG_SMEM is above the default 48 KiB */
	if (!room)
		room = cu_allow_smem(cb, (const void *)k_moe_gg<TYPE, GATEUP, BM>);
	if (room < GG_SMEM(BM)) {
		cu_fail_msg(cb, "moe: the grouped GEMM needs %d bytes of shared memory", GG_SMEM(BM));
		return;
	}
	dim3 grid(N / (GATEUP ? GG_BN / 2 : GG_BN), max_tiles);
	cu_launch(cb, k_moe_gg<TYPE, GATEUP, BM>, grid, GG_THREADS(TYPE, BM), GG_SMEM(BM), X, xrow, W, U, out, offs, tiles,
		  ne, N, K);
}

/* the kernel types that take GG_BM2-row tiles (docs/PERF.md: 17K prompt, H200, Q4_K -4.2%,
 * Q4_K_M -3.5%, the bf16 slice -2.5%; MLX4, whose conversion is cheap, +5%, so it stays at 64) */
static constexpr bool gg_tall(int t)
{
	return t == TOAST_DT_Q4_K || t == TOAST_DT_Q5_K || t == TOAST_DT_Q6_K || t == TOAST_DT_BF16;
}

/* moe_gg in the tiles of bm rows that k_moe_scan counted (GG_BM2 only for gg_tall types) */
template <int TYPE, bool GATEUP>
static void moe_gg_bm(struct cuda_backend *cb, int bm, const bf16 *X, const int32_t *xrow, const cu_wd &W,
		      const cu_wd &U, void *out, const int32_t *offs, const int32_t *tiles, unsigned max_tiles, int ne,
		      int N, int K)
{
	if constexpr (gg_tall(TYPE))
		if (bm == GG_BM2)
			return moe_gg<TYPE, GATEUP, GG_BM2>(cb, X, xrow, W, U, out, offs, tiles, max_tiles, ne, N, K);
	moe_gg<TYPE, GATEUP, GG_BM>(cb, X, xrow, W, U, out, offs, tiles, max_tiles, ne, N, K);
}

/* the grouped path's shapes: whole tiles of n_embd and n_ff, row tiles within gridDim.y */
static bool moe_grouped_fits(const moe_dims &d)
{
	return d.T > CU_GEMV_MAX_T && d.E % GG_BN == 0 && d.F % GG_BK == 0 &&
	       (size_t)d.T * d.k / GG_BM + (size_t)d.ne <= 65535;
}

/*
 * Prefill: token-slots grouped by expert on the device (count, scan, scatter), then
 * gate/up (fused with SiLU·mul) and down as grouped tensor-core GEMMs over the groups: no host
 * round trip, no padding. The shared expert runs dense on cuBLAS.
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
	size_t o_ys = MOE_TAKE(T * E * 4), o_act = MOE_TAKE(n * F * 2), o_y = MOE_TAKE(n * E * 2);
#undef MOE_TAKE
	char *s = (char *)cu_scratch(cb, off);
	if (!s)
		return;
	float *h = (float *)(s + o_h), *logits = (float *)(s + o_log), *wt = (float *)(s + o_wt), *sgate = (float *)(s + o_sg);
	bf16 *hb = (bf16 *)(s + o_hb), *hlo = (bf16 *)(s + o_hlo), *sact = (bf16 *)(s + o_sact);
	bf16 *act = (bf16 *)(s + o_act), *y = (bf16 *)(s + o_y);
	int32_t *sel = (int32_t *)(s + o_sel), *counts = (int32_t *)(s + o_cnt), *offs = (int32_t *)(s + o_offs);
	int32_t *tiles = (int32_t *)(s + o_tiles), *cursor = (int32_t *)(s + o_cur), *inv = (int32_t *)(s + o_inv);
	int32_t *row_tok = (int32_t *)(s + o_rt);
	float *sgf = (float *)(s + o_sgf), *suf = (float *)(s + o_suf), *ys = (float *)(s + o_ys);
	const float *sgw = a->sh_gate_inp ? (const float *)a->sh_gate_inp->dev : NULL;

	/* route on h = hb + hlo: bf16 GEMMs give the router (nearly) f32 inputs, and a quantised
	 * router (nearly) its exact values, so experts are chosen as in decode */
	cu_norm_rows(cb, a->x, a->norm_w, d.T, d.E, a->eps, a->plus_one, h, hb, hlo, NULL);
	cu_cublas_split(cb, logits, a->router, hb, hlo, d.T);
	if (d.ne <= 32 * MOE_WARP_TOPK)
		cu_launch(cb, k_moe_topk_warps, cu_blocks(T, 8), 256, 0, d, h, logits, sgw, sel, wt, sgate);
	else
		cu_launch(cb, k_moe_topk, d.T, 256, d.ne * 4, d, h, logits, sgw, sel, wt, sgate);
	cu_launched(cb, "moe top-k");
	cu_fail(cb, cudaMemsetAsync(counts, 0, ne * 4, cb->stream), "moe counts");
	cu_launch(cb, k_moe_count, cu_blocks(n, 256), 256, 0, sel, (int)n, counts);
	/* 128-row tiles when the groups average that many rows (a long prompt) and the weights'
	 * types gain by them (gg_tall): a weight tile read (and converted) once for 128 rows */
	cu_wd G = cu_wd_experts(a->gate), U = cu_wd_experts(a->up), D = cu_wd_experts(a->down);
	int bm = gg_tall(moe_gg_ktype(G, U)) && gg_tall(moe_gg_ktype(D, D)) && n >= (size_t)GG_BM2 * ne ? GG_BM2 : GG_BM;
	cu_launch(cb, k_moe_scan, 1, 256, 0, counts, d.ne, bm, offs, tiles, cursor);
	cu_launch(cb, k_moe_scatter, cu_blocks(n, 256), 256, 0, sel, (int)n, d.k, offs, cursor, inv, row_tok);
	cu_launched(cb, "moe grouping");
	unsigned max_tiles = (unsigned)(n / bm + ne);
	moe_gg_with_ktype(moe_gg_ktype(G, U), [&](auto kt) {
		moe_gg_bm<decltype(kt)::value, true>(cb, bm, hb, row_tok, G, U, act, offs, tiles, max_tiles, d.ne, d.F, d.E);
	});
	cu_launched(cb, "moe expert gate/up");
	moe_gg_with_ktype(moe_gg_ktype(D, D), [&](auto kt) {
		moe_gg_bm<decltype(kt)::value, false>(cb, bm, act, NULL, D, D, y, offs, tiles, max_tiles, d.ne, d.E, d.F);
	});
	cu_launched(cb, "moe expert down");
	/* the shared expert: dense over all tokens */
	if (d.Fs) {
		struct toast_mm_out og = {sgf, TOAST_MM_F32, a->sh_gate}, ou = {suf, TOAST_MM_F32, a->sh_up};
		cu_cublas(cb, &og, hb, d.T);
		cu_cublas(cb, &ou, hb, d.T);
		cu_swiglu(cb, sact, sgf, suf, d.T, d.Fs);
		struct toast_mm_out od = {ys, TOAST_MM_F32, a->sh_down};
		cu_cublas(cb, &od, sact, d.T);
	}
	cu_launch(cb, k_moe_combine, d.T, 256, 0, a->x, d.E, d.k, (const int32_t *)inv, (const float *)wt, (const bf16 *)y,
		  (const float *)(d.Fs ? ys : NULL), (const float *)(sgw ? sgate : NULL));
	cu_launched(cb, "moe combine");
}

/* ---- decode launches: rows of 2048 (n_embd of the Qwen3 MoE models) and 512 (their n_ff)
 * loaded whole ---- */

/* chunks per lane of a row of n when the kernels are compiled for it, else 0 */
template <int TYPE>
static constexpr int moe_cpl(int n)
{
	return TYPE == CU_QT_ANY ? 0 : n == 2048 ? 2048 / (32 * qk<TYPE>::EPC) : 0;
}

struct moe_route_args {
	moe_dims d;
	const float *x, *nw;
	float eps;
	int plus_one;
	cu_wd R;
	const float *sgw;
	float *h, *logits;
	int32_t *sel;
	float *wt, *sgate;
	unsigned *counter;
};

template <int TYPE, int CPL, bool DEC>
static void moe_route_launch(struct cuda_backend *cb, const moe_route_args &r, unsigned nb, size_t smem)
{
	cu_launch_pdl(cb, k_moe_route<TYPE, CPL, DEC>, nb, MOE_WARPS * 32, smem, r.d, r.x, r.nw, r.eps, r.plus_one, r.R,
		      r.sgw, r.h, r.logits, r.sel, r.wt, r.sgate, r.counter);
}

/* a decode step's router (one token, the experts picked by gate/up) has an instance of its own,
 * without the token loop and the top-k tail: a quarter of the code (its phase took as long, the
 * step 16 us less, docs/PERF.md) */
template <int TYPE>
static void moe_route(struct cuda_backend *cb, const moe_route_args &r, unsigned nb, size_t smem)
{
	const int CPL = moe_cpl<TYPE>(2048);
	if constexpr (CPL > 0) {
		if (r.d.E == 2048)
			return r.d.T == 1 && r.d.pick ? moe_route_launch<TYPE, CPL, true>(cb, r, nb, smem)
						      : moe_route_launch<TYPE, CPL, false>(cb, r, nb, smem);
	}
	moe_route_launch<TYPE, 0, false>(cb, r, nb, smem);
}

struct moe_ff_args {
	moe_dims d;
	const float *h;
	float *x;
	moe_picks pk;
	const float *logits, *sgate;
	float *act;
	cu_wd G, U, SG, SU, D, SD;
};

/*
 * Whether a gate/up grid is one wave: then its blocks let the down kernel be scheduled once the
 * picks are out and h is staged (after the barrier that follows them), so that down's blocks take
 * the room of the gate/up blocks that end first and ask for their rows while the rest run (the
 * shared expert's and the low slots' blocks end ~2-3 us before slot 9's): Q4_K decode +5.8%
 * on an H200 (docs/PERF.md). In a grid of several waves the trigger stays at the blocks' end.
 * (A host query: decode launches gate/up once, into its graph.)
 */
static bool moe_one_wave(struct cuda_backend *cb, const void *fn, dim3 grid, int threads, size_t smem)
{
	return (int64_t)grid.x * grid.y * grid.z <= (int64_t)cb->n_sm * cu_per_sm(fn, threads, smem);
}

template <int TYPE, int CPL>
static void moe_gateup_cpl(struct cuda_backend *cb, const moe_ff_args &f, int s0, int ns, size_t smem)
{
	dim3 grid(cu_blocks((size_t)f.d.Fmax, MOE_WARPS), ns, f.d.T);
	cu_launch_pdl(cb, k_moe_gateup<TYPE, CPL>, grid, MOE_WARPS * 32, smem, f.d, f.h, f.G, f.U, f.logits, f.pk, f.SG, f.SU, s0,
		      f.act, (int)moe_one_wave(cb, (const void *)k_moe_gateup<TYPE, CPL>, grid, MOE_WARPS * 32, smem));
}

template <int TYPE>
static void moe_gateup_t(struct cuda_backend *cb, const moe_ff_args &f, int s0, int ns, size_t smem)
{
	const int CPL = moe_cpl<TYPE>(2048);
	int E = f.d.E;
	if constexpr (CPL > 0) {
		if (E == 2048)
			return moe_gateup_cpl<TYPE, CPL>(cb, f, s0, ns, smem);
	}
	if constexpr (TYPE == TOAST_DT_BF16) { /* narrower models in bf16 */
		if (E == 1024)
			return moe_gateup_cpl<TYPE, 4>(cb, f, s0, ns, smem);
		if (E == 512)
			return moe_gateup_cpl<TYPE, 2>(cb, f, s0, ns, smem);
		if (E == 256)
			return moe_gateup_cpl<TYPE, 1>(cb, f, s0, ns, smem);
	}
	moe_gateup_cpl<TYPE, 0>(cb, f, s0, ns, smem);
}

static void moe_gateup(struct cuda_backend *cb, int ktype, const moe_ff_args &f, int s0, int ns, size_t smem)
{
	moe_with_ktype(ktype, [&](auto k) { moe_gateup_t<decltype(k)::value>(cb, f, s0, ns, smem); });
}

template <int TYPE, int CPR>
static void moe_down_cpr(struct cuda_backend *cb, const moe_ff_args &f, int s0, int ns, size_t smem)
{
	dim3 grid(cu_blocks((size_t)f.d.E, MOE_WARPS), f.d.T);
	cu_launch_pdl(cb, k_moe_down<TYPE, CPR>, grid, MOE_WARPS * 32, smem, f.d, f.x, f.D, (const int32_t *)f.pk.sel,
		      (const float *)f.pk.lv, (const float *)f.pk.ms, f.SD, s0, ns, f.sgate, (const float *)f.act);
}

template <int TYPE>
static void moe_down_t(struct cuda_backend *cb, const moe_ff_args &f, int s0, int ns, size_t smem)
{
	/* every slot of the launch has rows of d.F (the shared one too when it is in) */
	const int CPR = TYPE == CU_QT_ANY ? 0 : 512 / qk<TYPE>::EPC;
	bool whole = ns <= MOE_DOWN_SLOTS && (s0 + ns <= f.d.k || f.d.Fs == f.d.F);
	if constexpr (CPR > 0) {
		if (whole && f.d.F == 512)
			return moe_down_cpr<TYPE, CPR>(cb, f, s0, ns, smem);
	}
	if constexpr (TYPE == TOAST_DT_BF16) {
		if (whole && f.d.F == 256)
			return moe_down_cpr<TYPE, 32>(cb, f, s0, ns, smem);
	}
	moe_down_cpr<TYPE, 0>(cb, f, s0, ns, smem);
}

static void moe_down(struct cuda_backend *cb, int ktype, const moe_ff_args &f, int s0, int ns, size_t smem)
{
	moe_with_ktype(ktype, [&](auto k) { moe_down_t<decltype(k)::value>(cb, f, s0, ns, smem); });
}

/* gate/up (all nslot slots) on tensor cores when every matrix is of kind TYPE and fits (cu_kq);
 * a step of several tokens in one wave (k_moe_gateup_k4_mt) */
template <int TYPE>
static bool moe_gateup_tc(struct cuda_backend *cb, const moe_ff_args &f, int nslot)
{
	const moe_dims &d = f.d;
	const cu_wd *w[] = {&f.G, &f.U, &f.SG, &f.SU};
	for (const cu_wd *x : w)
		if (x->type != TYPE || !cu_kq_fits(*x))
			return false;
	if (d.E % 256)
		return false;
	dim3 grid((unsigned)(d.Fmax + 15) / 16, nslot);
	if (d.T > 1 && d.T <= CU_GEMV_MAX_T) {
		const void *fn = (const void *)k_moe_gateup_k4_mt<TYPE>;
		static size_t room;
		if (!room)
			room = cu_allow_smem(cb, fn);
		size_t smem = moe_k4_gateup_smem(d, cu_kq<TYPE>::SUB, true);
		if (smem <= room) {
			cu_launch_pdl(cb, k_moe_gateup_k4_mt<TYPE>, grid, GU_WARPS * 32, smem, d, f.h, f.G, f.U, f.logits, f.pk,
				      f.SG, f.SU, f.act, (int)moe_one_wave(cb, fn, grid, GU_WARPS * 32, smem));
			return true;
		}
	}
	size_t smem = moe_k4_gateup_smem(d, cu_kq<TYPE>::SUB, false);
	if (smem > 48 * 1024)
		return false;
	grid.z = d.T;
	cu_launch_pdl(cb, k_moe_gateup_k4<TYPE>, grid, GU_WARPS * 32, smem, d, f.h, f.G, f.U, f.logits, f.pk, f.SG, f.SU, 0,
		      f.act, (int)moe_one_wave(cb, (const void *)k_moe_gateup_k4<TYPE>, grid, GU_WARPS * 32, smem));
	return true;
}

/* down (all nslot slots, the shared expert as wide as the rest) on tensor cores, the same way;
 * a step of several tokens in one wave (k_moe_down_k4's MT) */
template <int TYPE>
static bool moe_down_tc(struct cuda_backend *cb, const moe_ff_args &f, int nslot)
{
	const moe_dims &d = f.d;
	if (f.D.type != TYPE || f.SD.type != TYPE || !cu_kq_fits(f.D) || !cu_kq_fits(f.SD) || (d.Fs && d.Fs != d.F) ||
	    d.F % 256)
		return false;
	if (d.T > 1 && d.T <= CU_GEMV_MAX_T) {
		static size_t room;
		if (!room)
			room = cu_allow_smem(cb, (const void *)k_moe_down_k4<TYPE, true>);
		size_t smem = moe_k4_down_smem(d, nslot, cu_kq<TYPE>::SUB, true);
		if (smem <= room) {
			cu_launch_pdl(cb, k_moe_down_k4<TYPE, true>, dim3((unsigned)(d.E + 15) / 16), MK_WARPS * 32, smem, d,
				      f.x, f.D, (const int32_t *)f.pk.sel, (const float *)f.pk.lv, (const float *)f.pk.ms, f.SD,
				      0, nslot, f.sgate, (const float *)f.act);
			return true;
		}
	}
	size_t smem = moe_k4_down_smem(d, nslot, cu_kq<TYPE>::SUB, false);
	if (smem > 48 * 1024)
		return false;
	dim3 grid((unsigned)(d.E + 15) / 16, d.T);
	cu_launch_pdl(cb, k_moe_down_k4<TYPE, false>, grid, MK_WARPS * 32, smem, d, f.x, f.D, (const int32_t *)f.pk.sel,
		      (const float *)f.pk.lv, (const float *)f.pk.ms, f.SD, 0, nslot, f.sgate, (const float *)f.act);
	return true;
}

void cu_moe(struct cuda_backend *cb, const struct toast_moe_args *a)
{
	moe_dims d;
	d.T = a->T, d.E = a->n_embd, d.ne = a->n_expert, d.k = a->n_expert_used, d.F = a->n_ff;
	d.Fs = a->sh_gate ? a->n_ff_sh : 0, d.Fmax = ((d.F > d.Fs ? d.F : d.Fs) + 7) / 8 * 8;
	d.norm_topk = a->norm_topk, d.pick = 0;
	if (d.k > MOE_MAX_K || d.k > d.ne) {
		cu_fail_msg(cb, "moe: %d experts per token is not supported", d.k);
		return;
	}
	if (moe_grouped_fits(d)) {
		cu_moe_grouped(cb, a, d);
		return;
	}
	size_t T = (size_t)d.T, n_h = T * d.E, n_log = T * d.ne, n_sel = T * d.k, n_act = T * (d.k + 1) * d.Fmax;
	char *scr = (char *)cu_scratch(cb, (n_act + n_h + n_log + 2 * n_sel + 3 * T) * 4);
	if (!scr)
		return;
	float *act = (float *)scr, *h = act + n_act, *logits = h + n_h;
	int32_t *sel = (int32_t *)(logits + n_log);
	float *wt = (float *)(sel + n_sel), *sgate = wt + n_sel, *ms = sgate + T;
	const float *sgw = a->sh_gate_inp ? (const float *)a->sh_gate_inp->dev : NULL;
	size_t route_smem = (n_h + d.ne) * 4;
	int rtype = a->router->dev_type;
	if (d.T <= CU_GEMV_MAX_T && route_smem <= 48 * 1024 &&
	    (rtype == TOAST_DT_BF16 || (toast_dtype_is_quant((enum toast_dtype)rtype) && d.E % 8 == 0))) {
		d.pick = d.ne <= 32 * MOE_WARP_TOPK;
		moe_route_args ra = {d, a->x, (const float *)a->norm_w->dev, a->eps, a->plus_one, cu_wd_weight(a->router), sgw,
				     h, logits, sel, wt, sgate, cb->counters + CU_CTR_ROUTE};
		unsigned nb = cu_blocks((size_t)d.ne, MOE_WARPS) + (sgw ? 1 : 0); /* (+ the shared gate's block) */
		if (rtype == TOAST_DT_BF16)
			moe_route<TOAST_DT_BF16>(cb, ra, nb, route_smem);
		else if (cu_ktype(ra.R) == TOAST_DT_MLX8)
			moe_route<TOAST_DT_MLX8>(cb, ra, nb, route_smem);
		else
			moe_route<CU_QT_ANY>(cb, ra, nb, route_smem);
		cu_launched(cb, "moe route");
	} else {
		cu_norm_rows(cb, a->x, a->norm_w, d.T, d.E, a->eps, a->plus_one, h, NULL, NULL, NULL);
		cu_gemv_f32(cb, logits, h, a->router, d.T); /* router logits from the f32 input */
		cu_launch(cb, k_moe_topk, d.T, 256, d.ne * 4, d, h, logits, sgw, sel, wt, sgate);
		cu_launched(cb, "moe top-k");
	}
	size_t hsm = (size_t)d.E * 4, asm_ = (size_t)(d.k + 1) * d.Fmax * 4;
	if (hsm > 48 * 1024 || asm_ > 48 * 1024) {
		cu_fail_msg(cb, "moe: n_embd %d or %d x %d expert rows are too large", d.E, d.k + 1, d.Fmax);
		return;
	}
	/* gate/up: routed and shared experts in one launch when they share a kernel type */
	cu_wd G = cu_wd_experts(a->gate), U = cu_wd_experts(a->up), D = cu_wd_experts(a->down);
	cu_wd SG = d.Fs ? cu_wd_weight(a->sh_gate) : G, SU = d.Fs ? cu_wd_weight(a->sh_up) : U;
	cu_wd SD = d.Fs ? cu_wd_weight(a->sh_down) : D;
	int tr = moe_ktype2(cu_ktype(G), cu_ktype(U)), ts = d.Fs ? moe_ktype2(cu_ktype(SG), cu_ktype(SU)) : tr;
	moe_ff_args fa = {d, h, a->x, {sel, wt, ms}, logits, a->sh_gate_inp ? sgate : NULL, act, G, U, SG, SU, D, SD};
	int nslot = d.k + (d.Fs ? 1 : 0);
	if (!cu_with_kq(cu_ktype(G), [&](auto k) { return moe_gateup_tc<decltype(k)::value>(cb, fa, nslot); })) {
		if (tr == ts) {
			moe_gateup(cb, tr, fa, 0, nslot, hsm);
		} else {
			moe_gateup(cb, tr, fa, 0, d.k, hsm);
			moe_gateup(cb, ts, fa, d.k, 1, hsm);
		}
	}
	cu_launched(cb, "moe gate/up");
	int td = moe_ktype(cu_ktype(D)), tsd = d.Fs ? moe_ktype(cu_ktype(SD)) : td;
	if (!cu_with_kq(cu_ktype(D), [&](auto k) { return moe_down_tc<decltype(k)::value>(cb, fa, nslot); })) {
		if (td == tsd && (!d.Fs || d.Fs == d.F)) {
			moe_down(cb, td, fa, 0, nslot, asm_);
		} else {
			moe_down(cb, td, fa, 0, d.k, asm_);
			moe_down(cb, tsd, fa, d.k, 1, asm_);
		}
	}
	cu_launched(cb, "moe down");
}

CU_TL_TU(k_moe)
