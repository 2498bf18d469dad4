/*
 * k_gdn.cu - the Gated DeltaNet mixer (contract: toast_gdn_args in backend.h).
 *
 * Stages: conv (one thread per channel, all T tokens, conv state updated once), prep (L2-norm
 * of q and k per key head, beta and g per value head), the delta rule, and the gated RMSNorm.
 * The delta rule is independent per row j of a value head's state S[j][:] (value dim j,
 * key dims contiguous), so blocks own (value head, 32 rows): that fills the GPU at decode.
 * Value head h reads key head gdn_kh(): h / (n_v/n_k), or h % n_k when the heads are tiled.
 * Decode (T == 1) runs the token recurrence, one warp per row; prefill runs the chunked form
 * (docs/qwen3next-spec.md §4.1) with a chunk in shared memory, all to f32's accuracy: for d_k 128
 * and d_v a multiple of 32 (Qwen3-Next) a register-tiled chunk pass and a state pass on tensor
 * cores (tf32 pairs), simple kernels for other head dims.
 */
#include "backend/cuda/cuda_common.cuh"

#define GDN_ROWS 32

struct gdn_dims {
	int nk, nv, dk, dv, K, r, key_dim, vdim, conv_dim, T;
	int grouped, ba_grouped, tiled;
};

/* the key head value head h reads (toast_gdn_args.v_heads_tiled) */
__device__ __forceinline__ int gdn_kh(const gdn_dims &g, int h)
{
	return g.tiled ? h % g.nk : h / g.r;
}

/* whether value head h is the first to read its key head (its decode block writes the key
 * head's q/k conv state) */
__device__ __forceinline__ bool gdn_first_of_kh(const gdn_dims &g, int h)
{
	return g.tiled ? h < g.nk : h % g.r == 0;
}

/* position of conv channel c in a row of the projection output */
__device__ __forceinline__ int64_t gdn_chan(const gdn_dims &g, int c)
{
	if (!g.grouped)
		return c;
	int G = 2 * g.dk + 2 * g.r * g.dv;
	if (c < g.key_dim)
		return (int64_t)(c / g.dk) * G + c % g.dk;
	if (c < 2 * g.key_dim) {
		c -= g.key_dim;
		return (int64_t)(c / g.dk) * G + g.dk + c % g.dk;
	}
	c -= 2 * g.key_dim;
	int h = c / g.dv;
	return (int64_t)(h / g.r) * G + 2 * g.dk + (h % g.r) * g.dv + c % g.dv;
}

/* prefill: one thread per (channel, run of GDN_CONV_RUN tokens); reads state slot pos & 1 and
 * leaves the new state in slot (pos + T) & 1. Only the first run reads the old state, and the
 * same threads write the new one (the slots may be the same one when T is even). */
#define GDN_CONV_RUN 64
__device__ __forceinline__ float gdn_conv_in(const gdn_dims &g, const float *qkv, const float *st, int64_t col, int c,
					     int t)
{
	int64_t stride = g.grouped ? g.conv_dim + g.vdim : g.conv_dim;
	return t >= 0 ? qkv[t * stride + col] : st[(size_t)(g.K - 1 + t) * g.conv_dim + c];
}

template <int KT>
__global__ void k_gdn_conv(gdn_dims g, const float *qkv, const void *w, int wtype, float *state, int pos, float *out)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	if (c >= g.conv_dim)
		return;
	const int K = KT ? KT : g.K;
	size_t slot = (size_t)(K - 1) * g.conv_dim;
	const float *st = state + (pos & 1) * slot;
	float *sn = state + ((pos + g.T) & 1) * slot;
	int64_t col = gdn_chan(g, c);
	float wc[KT ? KT : 16];
	for (int j = 0; j < K; j++)
		wc[j] = cu_ldw(w, wtype, (size_t)c * K + j);
	int t0 = blockIdx.y * GDN_CONV_RUN, t1 = min(g.T, t0 + GDN_CONV_RUN);
	if constexpr (KT > 0) { /* the window in registers: each input read once */
		float win[KT];
#pragma unroll
		for (int j = 0; j < KT - 1; j++)
			win[j] = gdn_conv_in(g, qkv, st, col, c, t0 - (KT - 1) + j);
		for (int t = t0; t < t1; t++) {
			win[KT - 1] = gdn_conv_in(g, qkv, st, col, c, t);
			float s = 0;
#pragma unroll
			for (int j = 0; j < KT; j++)
				s += wc[j] * win[j];
#pragma unroll
			for (int j = 0; j < KT - 1; j++)
				win[j] = win[j + 1];
			out[(size_t)t * g.conv_dim + c] = cu_silu(s);
		}
	} else {
		for (int t = t0; t < t1; t++) {
			float s = 0;
			for (int j = 0; j < K; j++)
				s += wc[j] * gdn_conv_in(g, qkv, st, col, c, t - (K - 1) + j);
			out[(size_t)t * g.conv_dim + c] = cu_silu(s);
		}
	}
	if (blockIdx.y == 0) {
		float nw[16];
		for (int j = 0; j < K - 1; j++)
			nw[j] = gdn_conv_in(g, qkv, st, col, c, g.T - (K - 1) + j);
		for (int j = 0; j < K - 1; j++)
			sn[(size_t)j * g.conv_dim + c] = nw[j];
	}
}

/* per token: L2-normalise q (with d_k^-1/2) and k of each key head in place; beta and g */
__global__ void k_gdn_prep(gdn_dims g, float *conv, const float *b, const float *a, const float *A, int a_neg_exp,
			   const float *dtb, float *beta, float *gg)
{
	int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
	float *row = conv + (size_t)t * g.conv_dim;
	for (int hk = warp; hk < 2 * g.nk; hk += nw) {
		float *x = row + (size_t)hk * g.dk; /* q heads then k heads */
		float ss = 0;
		for (int i = lane; i < g.dk; i += 32)
			ss += x[i] * x[i];
		ss = cu_warp_sum(ss);
		float sc = rsqrtf(ss + 1e-6f) * (hk < g.nk ? rsqrtf((float)g.dk) : 1.0f);
		for (int i = lane; i < g.dk; i += 32)
			x[i] *= sc;
	}
	for (int h = threadIdx.x; h < g.nv; h += blockDim.x) {
		float bv, av;
		if (g.ba_grouped) {
			const float *r = b + (size_t)t * 2 * g.nv + (h / g.r) * 2 * g.r;
			bv = r[h % g.r];
			av = r[g.r + h % g.r];
		} else {
			bv = b[(size_t)t * g.nv + h];
			av = a[(size_t)t * g.nv + h];
		}
		float x = av + dtb[h];
		float sp = x > 20.0f ? x : log1pf(expf(x));
		float An = a_neg_exp ? A[h] : -expf(A[h]);
		beta[(size_t)t * g.nv + h] = 1.0f / (1.0f + expf(-bv));
		gg[(size_t)t * g.nv + h] = An * sp;
	}
}

/*
 * Decode steps (T <= GDN_DEC_MAX_T): the whole step of one value head in one block, token after
 * token: conv of its q/k/v channels (the block owning a channel writes the new conv state; q/k
 * channels belong to the first value head of their key head), L2 norms, gates, the state update
 * one warp per row, gated RMSNorm. One token: two barriers, after the conv (which leaves each
 * warp's part of q's and k's squared norms in shared words, a thread without a channel making
 * the gates meanwhile) and after the update (each warp's part of the output's norm, from the
 * lanes that hold its rows' outputs). MULTI (T > 1) stages every token's inputs first, then does
 * what does not depend on the state for all tokens at once (conv, L2 norms, gates: a barrier
 * each, not each a token), then each warp carries its own state rows through the tokens with
 * no barrier (a row's update needs only the token's q, k, v[row] and gates), then the output
 * norms of all tokens; an even T leaves the new conv state in the slot it read
 * (pos & 1 == (pos + T) & 1), so the owner of a key head's q/k channels writes them once the
 * other value heads of the key head have read them (a count a key head in cb->counters, which
 * the owner zeroes).
 * smem: q[dk], k[dk], v[dv], o[dv]; MULTI: the conv inputs [T][2 dk + dv], z [T][dv], b and a
 * [T], the conv outputs [T][2 dk + dv], the outputs [T][dv], then per token the q and k norms'
 * factors, beta, alpha and the output norm's factor [T] each (cu_gdn's smem).
 */
#define GDN_DEC_THREADS 512
#define GDN_DEC_TAPS 4 /* a conv of this many taps (Qwen3-Next's) is loaded before the wait */
#define GDN_DEC_MAX_T TOAST_GDN_KEEP_MAX
#define GDN_SIB_MAX (CU_CTR_N - CU_CTR_GDN) /* key heads a multi-token step can count */
/* v[0..N) summed over the lanes whose lane & (2 O - 1) differ, each lane left with one of the
 * sums in v[0] (N a power of two <= 2 O): from O = 16, value lane / (32 / N), in every lane of its
 * group. Each step halves what a lane holds and sends the other half: N - 1 + log2(32 / N)
 * shuffles, not 5 N. */
template <int N, int O>
__device__ __forceinline__ void gdn_warp_sum_scatter(float *v, int lane)
{
	if constexpr (O > 0) {
		if constexpr (N >= 2) {
			bool hi = (lane & O) != 0;
#pragma unroll
			for (int i = 0; i < N / 2; i++) {
				float a = v[i], b = v[i + N / 2];
				v[i] = (hi ? b : a) + __shfl_xor_sync(0xffffffffu, hi ? a : b, O);
			}
		} else {
			v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
		}
		gdn_warp_sum_scatter<N >= 2 ? N / 2 : 1, O / 2>(v, lane);
	}
}

/* One token through a warp's RPW state rows j0.. (registers, the lane's columns lane + 32 k):
 * S = alpha S + k delta^T, delta = beta (v - alpha S k), and the output S q, from the old rows:
 * alpha S q + delta (k q). The rows' products with k and with q are one reduction (2 RPW values,
 * each lane keeps one), the deltas then broadcast: 30 shuffles a token at 8 rows a warp, where a
 * warp sum a product took 80 (the update was bound by them, 16 warps an SM: docs/PERF.md). Returns
 * row r's output in the lanes of value RPW + r (lane / (16 / RPW) - RPW == r), something else
 * elsewhere. Both decode paths (one token, a step of several) take it. */
template <int DPL, int RPW>
__device__ __forceinline__ float gdn_rows_step(float (&Sr)[RPW][DPL], const float *kr, const float *qr,
					     const float *v, int j0, int dv, float alpha, float beta, int lane)
{
	constexpr int L = 16 / RPW; /* lanes a value */
	static_assert(RPW >= 1 && RPW <= 16 && (RPW & (RPW - 1)) == 0, "RPW: a power of two <= 16");
	float x[2 * RPW], kq = 0;
#pragma unroll
	for (int k = 0; k < DPL; k++)
		kq += kr[k] * qr[k];
#pragma unroll
	for (int i = 0; i < RPW; i++) {
		x[i] = x[RPW + i] = 0;
#pragma unroll
		for (int k = 0; k < DPL; k++) {
			x[i] += Sr[i][k] * kr[k];
			x[RPW + i] += Sr[i][k] * qr[k];
		}
	}
	kq = cu_warp_sum(kq);
	gdn_warp_sum_scatter<2 * RPW, 16>(x, lane);
	float y = x[0];
	int idx = lane / L, j = j0 + (idx & (RPW - 1));
	float delta = idx < RPW && j < dv ? beta * (v[j] - alpha * y) : 0.0f;
	float o = alpha * y + __shfl_xor_sync(0xffffffffu, delta, 16) * kq; /* (value RPW + r: lane 16 on) */
#pragma unroll
	for (int i = 0; i < RPW; i++) {
		float d = __shfl_sync(0xffffffffu, delta, i * L);
#pragma unroll
		for (int k = 0; k < DPL; k++)
			Sr[i][k] = fmaf(Sr[i][k], alpha, kr[k] * d);
	}
	return o;
}

/* DPL > 0: dk == 32 * DPL and dv <= 16 * RPW, the state rows of a warp live in registers */
template <int DPL, int RPW, bool MULTI>
__global__ void __launch_bounds__(GDN_DEC_THREADS, 1)
	k_gdn_decode(gdn_dims g, const float *qkv, const float *z, const float *b, const float *a, const void *cw, int cwt,
		     float *conv_state, const int32_t *step, const float *A, int a_neg_exp, const float *dtb,
		     const float *nw, float eps, float *S, float *out, unsigned *sib, float *S_keep, float *conv_keep)
{
	extern __shared__ float sm[];
	__shared__ float red[32];
	__shared__ float gate_beta, gate_alpha;
	int h = blockIdx.x, kh = gdn_kh(g, h), dk = g.dk, dv = g.dv, K = g.K, tid = threadIdx.x;
	int nc = 2 * dk + dv, T = MULTI ? g.T : 1;
	float *qs = sm, *ks = qs + dk, *vs = ks + dk, *os = vs + dv;
	float *xin = os + dv, *zin = xin + T * nc, *bin = zin + T * dv, *ain = bin + T; /* (MULTI) */
	float *cy = ain + T, *oy = cy + T * nc, *fqk = oy + T * dv, *bet = fqk + 2 * T, *alp = bet + T, *rr = alp + T;
	int warp = tid >> 5, lane = tid & 31, nwarp = blockDim.x >> 5;
	/* the state rows in registers (DPL > 0) are loaded before waiting for the previous kernel:
	 * only this kernel, a step ago, wrote them */
	float Sr[RPW][DPL > 0 ? DPL : 1];
	if (DPL > 0)
#pragma unroll
		for (int i = 0; i < RPW; i++) {
			int j = warp * RPW + i;
#pragma unroll
			for (int k = 0; k < DPL; k++)
				Sr[i][k] = j < dv ? S[((size_t)h * dv + j) * dk + lane + 32 * k] : 0.0f;
		}
	/* so are the weights: the conv taps of the thread's first channel, the gates' constants */
	auto chan = [&](int cl) {
		return cl < dk       ? kh * dk + cl
		       : cl < 2 * dk ? g.key_dim + kh * dk + cl - dk
				     : 2 * g.key_dim + h * dv + cl - 2 * dk;
	};
	float tap[GDN_DEC_TAPS];
	bool taps = K == GDN_DEC_TAPS && tid < nc;
	if (taps)
#pragma unroll
		for (int j = 0; j < GDN_DEC_TAPS; j++)
			tap[j] = cu_ldw(cw, cwt, (size_t)chan(tid) * GDN_DEC_TAPS + j);
	float dtbv = 0, An = 0, nwv = tid < dv ? nw[tid] : 0.0f; /* (nwv: the output norm's weight) */
	/* (one token: a thread without a conv channel makes the gates, during the conv) */
	int gt = nc < (int)blockDim.x ? nc : 0;
	if (MULTI ? tid < T : tid == gt) { /* (MULTI: thread t makes token t's gates) */
		dtbv = dtb[h];
		An = a_neg_exp ? A[h] : -expf(A[h]);
	}
	int pos = __ldcg(step); /* uploaded before the step's first kernel; the conv state's slot */
	size_t slot = (size_t)(K - 1) * g.conv_dim;
	const float *st = conv_state + (pos & 1) * slot;
	float *sn = conv_state + ((pos + T) & 1) * slot;
	/* and the conv history of the thread's first channel: this kernel wrote it, a step ago */
	float hist[GDN_DEC_TAPS - 1];
	if (taps)
#pragma unroll
		for (int j = 0; j < GDN_DEC_TAPS - 1; j++)
			hist[j] = st[(size_t)j * g.conv_dim + chan(tid)];
	cu_pdl_wait();
	cu_pdl_trigger(); /* a block per value head: one wave */
	/* what the previous kernel wrote, all loads issued together: the gates' inputs, the output
	 * gate of the thread's value channel, then (below) the conv inputs */
	auto zval = [&](int t, int j) { /* grouped: z lies in the qkvz rows of the key head */
		size_t G = 2 * g.dk + 2 * g.r * g.dv;
		return g.grouped ? qkv[t * (size_t)(g.conv_dim + g.vdim) + (h / g.r) * G + 2 * g.dk + g.r * g.dv +
				       (h % g.r) * g.dv + j]
				 : z[(size_t)t * g.vdim + (size_t)h * dv + j];
	};
	auto gates = [&](int t, float &bv, float &av) {
		if (g.ba_grouped) {
			const float *rw = b + (size_t)t * 2 * g.nv + (size_t)(h / g.r) * 2 * g.r;
			bv = rw[h % g.r];
			av = rw[g.r + h % g.r];
		} else {
			bv = b[(size_t)t * g.nv + h];
			av = a[(size_t)t * g.nv + h];
		}
	};
	int64_t xrow = g.grouped ? g.conv_dim + g.vdim : g.conv_dim; /* a token's qkv row */
	float bv = 0, av = 0, zpre = 0;
	if constexpr (MULTI) {
		for (int i = tid; i < T * nc; i += blockDim.x) {
			int t = i / nc, cl = i - t * nc;
			xin[i] = qkv[t * xrow + gdn_chan(g, chan(cl))];
		}
		for (int i = tid; i < T * dv; i += blockDim.x)
			zin[i] = zval(i / dv, i % dv);
		if (tid < T)
			gates(tid, bin[tid], ain[tid]);
		__syncthreads();
	} else {
		if (tid == gt)
			gates(0, bv, av);
		if (tid < dv)
			zpre = zval(0, tid);
	}
	bool own_qk = gdn_first_of_kh(g, h);
	/* conv input u of channel c (u < 0: the old state) */
	auto conv_in = [&](int cl, int c, int u) { return u >= 0 ? xin[u * nc + cl] : st[(size_t)(K - 1 + u) * g.conv_dim + c]; };
	if constexpr (MULTI) {
		/* conv of every token, a channel a thread (its window slides in registers) */
		for (int cl = tid; cl < nc; cl += blockDim.x) {
			int c = chan(cl);
			bool mine = taps && cl == tid;
			for (int t = 0; t < T; t++) {
				float x = xin[t * nc + cl], acc;
				if (mine) {
					acc = tap[GDN_DEC_TAPS - 1] * x;
#pragma unroll
					for (int j = 0; j < GDN_DEC_TAPS - 1; j++)
						acc += tap[j] * hist[j];
#pragma unroll
					for (int j = 0; j < GDN_DEC_TAPS - 2; j++)
						hist[j] = hist[j + 1];
					hist[GDN_DEC_TAPS - 2] = x;
				} else {
					acc = cu_ldw(cw, cwt, (size_t)c * K + K - 1) * x;
					for (int j = 0; j < K - 1; j++)
						acc += cu_ldw(cw, cwt, (size_t)c * K + j) * conv_in(cl, c, t - (K - 1) + j);
				}
				cy[t * nc + cl] = cu_silu(acc);
				if (conv_keep && t < T - 1 && (cl >= 2 * dk || own_qk)) { /* the window after token t */
					float *ck = conv_keep + (size_t)t * slot + c;
					if (mine)
#pragma unroll
						for (int j = 0; j < GDN_DEC_TAPS - 1; j++)
							ck[(size_t)j * g.conv_dim] = hist[j];
					else
						for (int j = 0; j < K - 1; j++)
							ck[(size_t)j * g.conv_dim] = conv_in(cl, c, t - (K - 2) + j);
				}
			}
		}
		if (tid < T) { /* token tid's gates */
			float xx = ain[tid] + dtbv, sp = xx > 20.0f ? xx : log1pf(expf(xx));
			bet[tid] = 1.0f / (1.0f + expf(-bin[tid]));
			alp[tid] = expf(An * sp);
		}
		__syncthreads();
		cu_tl_mark(0); /* conv, gates */
		for (int w = warp; w < 2 * T; w += nwarp) { /* the L2 norms: q of token w / 2, or its k */
			const float *v = cy + (w >> 1) * nc + (w & 1) * dk;
			float ss = 0;
			for (int i = lane; i < dk; i += 32)
				ss += v[i] * v[i];
			ss = cu_warp_sum(ss);
			if (lane == 0)
				fqk[w] = w & 1 ? rsqrtf(ss + 1e-6f) : rsqrtf(ss + 1e-6f) * rsqrtf((float)dk);
		}
		__syncthreads();
		cu_tl_mark(1); /* norms */
		/* the state: each warp its rows, token after token */
		for (int t = 0; t < T; t++) {
			const float *qt = cy + t * nc, *kt = qt + dk, *vt = kt + dk;
			float fq = fqk[2 * t], fk = fqk[2 * t + 1], alpha = alp[t], beta = bet[t];
			if constexpr (DPL > 0) {
				float kr[DPL > 0 ? DPL : 1], qr[DPL > 0 ? DPL : 1];
#pragma unroll
				for (int k = 0; k < DPL; k++) {
					kr[k] = kt[lane + 32 * k] * fk;
					qr[k] = qt[lane + 32 * k] * fq;
				}
				float o = gdn_rows_step<DPL, RPW>(Sr, kr, qr, vt, warp * RPW, dv, alpha, beta, lane);
#pragma unroll
				for (int i = 0; i < RPW; i++) {
					int j = warp * RPW + i;
					float *sd = t == T - 1 ? S + ((size_t)h * dv + j) * dk
						   : S_keep ? S_keep + (((size_t)t * g.nv + h) * dv + j) * dk : NULL;
					if (j < dv && sd) /* the new state, or (S_keep) the state after token t */
#pragma unroll
						for (int k = 0; k < DPL; k++)
							sd[lane + 32 * k] = Sr[i][k];
				}
				int r = lane / (16 / RPW) - RPW; /* the row whose output the lane has */
				if (r >= 0 && lane % (16 / RPW) == 0 && warp * RPW + r < dv)
					oy[t * dv + warp * RPW + r] = o;
			} else {
				for (int j = warp; j < dv; j += nwarp) {
					float *Sj = S + ((size_t)h * dv + j) * dk;
					float m = 0;
					for (int i = lane; i < dk; i += 32)
						m += (Sj[i] * alpha) * (kt[i] * fk);
					m = cu_warp_sum(m);
					float delta = beta * (vt[j] - m), o = 0;
					for (int i = lane; i < dk; i += 32) {
						float sv = Sj[i] * alpha + (kt[i] * fk) * delta;
						Sj[i] = sv;
						if (S_keep && t < T - 1)
							S_keep[(((size_t)t * g.nv + h) * dv + j) * dk + i] = sv;
						o += sv * (qt[i] * fq);
					}
					o = cu_warp_sum(o);
					if (lane == 0)
						oy[t * dv + j] = o;
				}
			}
		}
		__syncthreads();
		cu_tl_mark(2); /* the state update */
		for (int w = warp; w < T; w += nwarp) { /* the output norms */
			float ss = 0;
			for (int j = lane; j < dv; j += 32)
				ss += oy[w * dv + j] * oy[w * dv + j];
			ss = cu_warp_sum(ss);
			if (lane == 0)
				rr[w] = rsqrtf(ss / dv + eps);
		}
		__syncthreads();
		cu_tl_mark(3); /* the outputs' norms */
		for (int i = tid; i < T * dv; i += blockDim.x) {
			int t = i / dv, j = i - t * dv;
			out[(size_t)t * g.vdim + (size_t)h * dv + j] = oy[i] * rr[t] * nw[j] * cu_silu(zin[i]);
		}
	} else {
		__shared__ float qk_red[2 * (GDN_DEC_THREADS / 32)];
		float sq = 0, sk = 0; /* the thread's part of q's and k's squared norms */
		for (int cl = tid; cl < nc; cl += blockDim.x) {
			int c = chan(cl);
			float x = qkv[gdn_chan(g, c)], acc;
			bool mine = taps && cl == tid;
			if (mine) {
				acc = tap[GDN_DEC_TAPS - 1] * x;
#pragma unroll
				for (int j = 0; j < GDN_DEC_TAPS - 1; j++)
					acc += tap[j] * hist[j];
			} else {
				acc = cu_ldw(cw, cwt, (size_t)c * K + K - 1) * x;
				for (int j = 0; j < K - 1; j++)
					acc += cu_ldw(cw, cwt, (size_t)c * K + j) * st[(size_t)j * g.conv_dim + c];
			}
			float y = cu_silu(acc);
			sm[cl] = y;
			if (cl < dk)
				sq += y * y;
			else if (cl < 2 * dk)
				sk += y * y;
			if (cl >= 2 * dk || own_qk) {
				if (mine)
#pragma unroll
					for (int j = 0; j < GDN_DEC_TAPS - 2; j++)
						sn[(size_t)j * g.conv_dim + c] = hist[j + 1];
				else
					for (int j = 0; j < K - 2; j++)
						sn[(size_t)j * g.conv_dim + c] = st[(size_t)(j + 1) * g.conv_dim + c];
				sn[(size_t)(K - 2) * g.conv_dim + c] = x;
			}
		}
		if (tid == gt) {
			float xx = av + dtbv;
			float sp = xx > 20.0f ? xx : log1pf(expf(xx));
			gate_beta = 1.0f / (1.0f + expf(-bv));
			gate_alpha = expf(An * sp);
		}
		/* the L2 norms of q and k: each warp's parts, summed after the conv's barrier */
		sq = cu_warp_sum(sq);
		sk = cu_warp_sum(sk);
		if (lane == 0)
			qk_red[2 * warp] = sq, qk_red[2 * warp + 1] = sk;
		__syncthreads();
		cu_tl_mark(0); /* conv, gates */
		sq = sk = 0;
		for (int w = 0; w < nwarp; w++)
			sq += qk_red[2 * w], sk += qk_red[2 * w + 1];
		float fq = rsqrtf(sq + 1e-6f) * rsqrtf((float)dk), fk = rsqrtf(sk + 1e-6f);
		float alpha = gate_alpha, beta = gate_beta;
		if constexpr (DPL == 0) { /* (the rows in registers scale q and k as they read them) */
			for (int i = tid; i < dk; i += blockDim.x) {
				qs[i] *= fq;
				ks[i] *= fk;
			}
			__syncthreads();
		}
		cu_tl_mark(1); /* norms */
		if constexpr (DPL > 0) {
			/* the warp's rows are held in registers */
			float kr[DPL > 0 ? DPL : 1], qr[DPL > 0 ? DPL : 1];
#pragma unroll
			for (int k = 0; k < DPL; k++) {
				kr[k] = ks[lane + 32 * k] * fk;
				qr[k] = qs[lane + 32 * k] * fq;
			}
			float o = gdn_rows_step<DPL, RPW>(Sr, kr, qr, vs, warp * RPW, dv, alpha, beta, lane);
#pragma unroll
			for (int i = 0; i < RPW; i++) {
				int j = warp * RPW + i;
				if (j < dv)
#pragma unroll
					for (int k = 0; k < DPL; k++)
						S[((size_t)h * dv + j) * dk + lane + 32 * k] = Sr[i][k];
			}
			int r = lane / (16 / RPW) - RPW; /* the row whose output the lane has */
			bool has = r >= 0 && lane % (16 / RPW) == 0 && warp * RPW + r < dv;
			if (has)
				os[warp * RPW + r] = o;
			float ss = cu_warp_sum(has ? o * o : 0.0f); /* the warp's part of the output's norm */
			if (lane == 0)
				red[warp] = ss;
		} else {
			for (int j = warp; j < dv; j += nwarp) {
				float *Sj = S + ((size_t)h * dv + j) * dk;
				float m = 0;
				for (int i = lane; i < dk; i += 32)
					m += (Sj[i] * alpha) * ks[i];
				m = cu_warp_sum(m);
				float delta = beta * (vs[j] - m), o = 0;
				for (int i = lane; i < dk; i += 32) {
					float sv = Sj[i] * alpha + ks[i] * delta;
					Sj[i] = sv;
					o += sv * qs[i];
				}
				o = cu_warp_sum(o);
				if (lane == 0)
					os[j] = o;
			}
		}
		__syncthreads();
		cu_tl_mark(2); /* the state update */
		float ss = 0;
		if constexpr (DPL > 0) {
			for (int w = 0; w < nwarp; w++)
				ss += red[w];
		} else {
			for (int j = tid; j < dv; j += blockDim.x)
				ss += os[j] * os[j];
			ss = cu_block_sum(ss, red);
		}
		cu_tl_mark(3); /* the output's norm */
		float rr = rsqrtf(ss / dv + eps);
		for (int j = tid; j < dv; j += blockDim.x) {
			float zv = j == tid ? zpre : zval(0, j);
			out[(size_t)h * dv + j] = os[j] * rr * (j == tid ? nwv : nw[j]) * cu_silu(zv);
		}
	}
	if constexpr (MULTI) {
		/* the new conv state, the last K - 1 inputs; input T + j (or the window's j) is read
		 * before j is written, so that the slot may be the one read */
		if (!(T & 1) && g.r > 1) { /* that slot: the key head's other value heads read its q/k channels */
			__syncthreads();
			if (tid == 0) {
				if (!own_qk) {
					__threadfence();
					atomicAdd(sib + kh, 1u);
				} else {
					while (atomicOr(sib + kh, 0u) < (unsigned)(g.r - 1))
						;
					atomicExch(sib + kh, 0u);
				}
			}
			__syncthreads();
		}
		for (int cl = tid; cl < nc; cl += blockDim.x) {
			if (cl < 2 * dk && !own_qk)
				continue;
			int c = chan(cl);
			if (taps && cl == tid)
#pragma unroll
				for (int j = 0; j < GDN_DEC_TAPS - 1; j++)
					sn[(size_t)j * g.conv_dim + c] = hist[j];
			else
				for (int j = 0; j < K - 1; j++)
					sn[(size_t)j * g.conv_dim + c] = conv_in(cl, c, T - (K - 1) + j);
		}
	}
}

/*
 * T > 1: the chunked form in two passes. Pass 1 (k_gdn_intra, all chunks and heads at once)
 * does everything that does not depend on the state: the in-chunk cumulative decay gam, the
 * triangular solve (I + A)^-1 applied to diag(beta e^gam) K (W) and to diag(beta) V (U), and
 * P[r][s] = e^(gam_r - gam_s) q_r.k_s. Pass 2 (k_gdn_state, sequential over chunks, parallel
 * over heads and blocks of GDN_ROWS state rows) carries the state: V' = U - W S0,
 * O = diag(e^gam) Q S0 + P V', S = e^gam_L S0 + sum_s e^(gam_L - gam_s) V'_s k_s^T.
 * Shared-memory rows of dk floats are padded to dk + 1 against bank conflicts.
 */
struct gdn_chunks {
	int C, n_chunks;
	float *W;   /* [n_chunks][nv][C][dk] */
	float *U;   /* [n_chunks][nv][C][dv] */
	float *P;   /* [n_chunks][nv][C][C] */
	float *gam; /* [n_chunks][nv][C] */
};

__global__ void k_gdn_intra(gdn_dims g, gdn_chunks ch, const float *conv, const float *beta, const float *gg)
{
	extern __shared__ float smem[];
	int c = blockIdx.x, h = blockIdx.y, kh = gdn_kh(g, h), dk = g.dk, dv = g.dv, dkp = dk + 1, C = ch.C;
	int t0 = c * C, L = min(C, g.T - t0), tid = threadIdx.x, nt = blockDim.x;
	float *Kc = smem, *Qc = Kc + C * dkp, *W = Qc + C * dkp, *A = W + C * dkp, *U = A + C * C, *gam = U + C * dv,
	      *bet = gam + C;
	for (int x = tid; x < L * dk; x += nt) {
		int r = x / dk, i = x % dk;
		const float *row = conv + (size_t)(t0 + r) * g.conv_dim;
		Kc[r * dkp + i] = row[g.key_dim + kh * dk + i];
		Qc[r * dkp + i] = row[kh * dk + i];
	}
	for (int r = tid; r < L; r += nt)
		bet[r] = beta[(size_t)(t0 + r) * g.nv + h];
	if (tid == 0) {
		float acc = 0;
		for (int r = 0; r < L; r++) {
			acc += gg[(size_t)(t0 + r) * g.nv + h];
			gam[r] = acc;
		}
	}
	__syncthreads();
	for (int x = tid; x < L * L; x += nt) {
		int r = x / L, q = x % L;
		float v = 0;
		if (q < r) {
			for (int i = 0; i < dk; i++)
				v += Kc[r * dkp + i] * Kc[q * dkp + i];
			v *= bet[r] * expf(gam[r] - gam[q]);
		}
		A[r * C + q] = v;
	}
	__syncthreads();
	/* thread x owns column x of W and U through all rows: no barrier between rows */
	for (int r = 0; r < L; r++) {
		const float *vrow = conv + (size_t)(t0 + r) * g.conv_dim + 2 * g.key_dim + (size_t)h * dv;
		for (int x = tid; x < dk + dv; x += nt) {
			if (x < dk) {
				float v = bet[r] * expf(gam[r]) * Kc[r * dkp + x];
				for (int q = 0; q < r; q++)
					v -= A[r * C + q] * W[q * dkp + x];
				W[r * dkp + x] = v;
			} else {
				int j = x - dk;
				float v = bet[r] * vrow[j];
				for (int q = 0; q < r; q++)
					v -= A[r * C + q] * U[q * dv + j];
				U[r * dv + j] = v;
			}
		}
	}
	__syncthreads();
	size_t base = (size_t)c * g.nv + h;
	float *Wg = ch.W + base * C * dk, *Ug = ch.U + base * C * dv, *Pg = ch.P + base * C * C, *Gg = ch.gam + base * C;
	for (int x = tid; x < C * dk; x += nt) {
		int r = x / dk, i = x % dk;
		Wg[x] = r < L ? W[r * dkp + i] : 0.0f;
	}
	for (int x = tid; x < C * dv; x += nt)
		Ug[x] = x / dv < L ? U[x] : 0.0f;
	for (int x = tid; x < C * C; x += nt) {
		int r = x / C, q = x % C;
		float v = 0;
		if (r < L && q <= r) {
			for (int i = 0; i < dk; i++)
				v += Qc[r * dkp + i] * Kc[q * dkp + i];
			v *= expf(gam[r] - gam[q]);
		}
		Pg[x] = v;
	}
	for (int r = tid; r < C; r += nt)
		Gg[r] = r < L ? gam[r] : 0.0f;
}

__global__ void k_gdn_state(gdn_dims g, gdn_chunks ch, const float *conv, float *S, float *o)
{
	extern __shared__ float smem[];
	int h = blockIdx.x, kh = gdn_kh(g, h), dk = g.dk, dv = g.dv, dkp = dk + 1, C = ch.C;
	int jb = blockIdx.y * GDN_ROWS, J = min(GDN_ROWS, dv - jb);
	float *Kc = smem, *Qc = Kc + C * dkp, *W = Qc + C * dkp, *P = W + C * dkp, *U = P + C * C, *Ss = U + C * GDN_ROWS,
	      *gam = Ss + GDN_ROWS * dkp, *dec = gam + C;
	int tid = threadIdx.x, nt = blockDim.x;
	float *Sg = S + ((size_t)h * dv + jb) * dk;
	for (int x = tid; x < J * dk; x += nt)
		Ss[(x / dk) * dkp + x % dk] = Sg[x];
	for (int c = 0; c < ch.n_chunks; c++) {
		int t0 = c * C, L = min(C, g.T - t0);
		size_t base = (size_t)c * g.nv + h;
		__syncthreads();
		for (int x = tid; x < L * dk; x += nt) {
			int r = x / dk, i = x % dk;
			const float *row = conv + (size_t)(t0 + r) * g.conv_dim;
			Kc[r * dkp + i] = row[g.key_dim + kh * dk + i];
			Qc[r * dkp + i] = row[kh * dk + i];
			W[r * dkp + i] = ch.W[(base * C + r) * dk + i];
		}
		for (int x = tid; x < L * C; x += nt)
			P[x] = ch.P[base * C * C + x];
		for (int x = tid; x < L * J; x += nt) {
			int r = x / J, j = x % J;
			U[r * GDN_ROWS + j] = ch.U[(base * C + r) * dv + jb + j];
		}
		for (int r = tid; r < L; r += nt)
			gam[r] = ch.gam[base * C + r];
		__syncthreads();
		for (int r = tid; r < L; r += nt)
			dec[r] = expf(gam[L - 1] - gam[r]);
		/* V' = U - W S0 (in U); O = e^gam Q S0 */
		for (int x = tid; x < L * J; x += nt) {
			int r = x / J, j = x % J;
			float ws = 0, qs = 0;
			for (int i = 0; i < dk; i++) {
				ws += W[r * dkp + i] * Ss[j * dkp + i];
				qs += Qc[r * dkp + i] * Ss[j * dkp + i];
			}
			U[r * GDN_ROWS + j] -= ws;
			o[((size_t)(t0 + r) * g.nv + h) * dv + jb + j] = expf(gam[r]) * qs;
		}
		__syncthreads();
		/* O += P V' */
		for (int x = tid; x < L * J; x += nt) {
			int r = x / J, j = x % J;
			float v = 0;
			for (int q = 0; q <= r; q++)
				v += P[r * C + q] * U[q * GDN_ROWS + j];
			o[((size_t)(t0 + r) * g.nv + h) * dv + jb + j] += v;
		}
		/* S = e^gam_L S0 + sum_s e^(gam_L - gam_s) V'_s k_s^T (the O pass above reads only U) */
		float egl = expf(gam[L - 1]);
		for (int x = tid; x < J * dk; x += nt) {
			int j = x / dk, i = x % dk;
			float v = egl * Ss[j * dkp + i];
			for (int q = 0; q < L; q++)
				v += dec[q] * U[q * GDN_ROWS + j] * Kc[q * dkp + i];
			Ss[j * dkp + i] = v;
		}
	}
	__syncthreads();
	for (int x = tid; x < J * dk; x += nt)
		Sg[x] = Ss[(x / dk) * dkp + x % dk];
}

/*
 * The fast path of both passes for d_k == 128, d_v a multiple of GDN_ROWS and chunks of 64
 * (Qwen3-Next's heads): the same math in f32, tiled in registers. Rows of d_k floats in shared
 * memory are padded to 132: 16-byte aligned for float4 reads, and consecutive rows start 4 banks
 * apart, so 8 threads reading float4s of 8 consecutive rows touch each bank once.
 */
#define GDN_FC 64             /* chunk */
#define GDN_FDK 128           /* d_k */
#define GDN_FKP (GDN_FDK + 4) /* padded row of d_k floats */
#define GDN_FPP (GDN_FC + 4)  /* padded row of a chunk-by-chunk matrix */
#define GDN_FTHREADS 256
/* shared memory of k_gdn_intra_f (K, Q, A, beta, beta e^gam, gam) and k_gdn_state_f (K, Q, W,
 * S as tf32 pairs, P, U, V' decayed, gam) */
#define GDN_FSMEM1 ((2 * GDN_FC * GDN_FKP + GDN_FC * GDN_FPP + 3 * GDN_FC) * sizeof(float))
#define GDN_FKK (GDN_FDK + 8) /* K's rows in the state pass, read down a column: 8 banks apart */
#define GDN_FUP (GDN_ROWS + 8) /* U's and V's rows in the state pass, read down a column */
#define GDN_FSMEM2                                                                                                  \
	((GDN_FC * GDN_FKK + 2 * GDN_FC * GDN_FKP + 2 * GDN_ROWS * GDN_FKP + GDN_FC * GDN_FPP + 2 * GDN_FC * GDN_FUP + \
	  GDN_FC) * sizeof(float))

__device__ __forceinline__ float4 gdn_ld4(const float *p)
{
	return *(const float4 *)p;
}

/* component i of v (i a compile-time constant after unrolling) */
__device__ __forceinline__ float gdn_at(const float4 &v, int i)
{
	return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* acc + a.b, summed in order */
__device__ __forceinline__ float gdn_dot4(float4 a, float4 b, float acc)
{
	acc = fmaf(a.x, b.x, acc);
	acc = fmaf(a.y, b.y, acc);
	acc = fmaf(a.z, b.z, acc);
	return fmaf(a.w, b.w, acc);
}

/* rows [0, n_rows) of vec4 float4s each, global (row stride src_stride floats) -> shared (row
 * stride dst_stride) by cp.async; rows from `valid` on are zero-filled, their source not read */
__device__ __forceinline__ void gdn_cp_rows(float *dst, int dst_stride, const float *src, size_t src_stride, int n_rows,
					    int valid, int vec4)
{
	for (int x = threadIdx.x; x < n_rows * vec4; x += blockDim.x) {
		int r = x / vec4, v = x % vec4;
		bool ok = r < valid;
		cu_cp16(dst + r * dst_stride + 4 * v, src + (ok ? r : 0) * src_stride + 4 * v, ok);
	}
}

/* x = (I + A)^-1 x for A strictly lower triangular ([GDN_FC][GDN_FPP], zero on and above the
 * diagonal), by forward substitution in registers, each row summed in column order */
__device__ __forceinline__ void gdn_solve(float *x, const float *A)
{
#pragma unroll
	for (int r = 1; r < GDN_FC; r++) {
		float v = x[r];
#pragma unroll
		for (int q = 0; q < r; q += 4) {
			float4 a = gdn_ld4(A + r * GDN_FPP + q);
#pragma unroll
			for (int e = 0; e < 4; e++)
				if (q + e < r)
					v -= gdn_at(a, e) * x[q + e];
		}
		x[r] = v;
	}
}

/* pass 1, block (chunk, value head). K Kᵀ and Q Kᵀ in 4x4 register tiles of which the ones
 * above the diagonal are skipped; the solve one column of [W | U] a thread, no barriers. */
__global__ void __launch_bounds__(GDN_FTHREADS, 2)
	k_gdn_intra_f(gdn_dims g, gdn_chunks ch, const float *conv, const float *beta, const float *gg)
{
	extern __shared__ float4 smem4[];
	float *Ks = (float *)smem4, *Qs = Ks + GDN_FC * GDN_FKP, *As = Qs + GDN_FC * GDN_FKP, *bet = As + GDN_FC * GDN_FPP,
	      *bg = bet + GDN_FC, *gam = bg + GDN_FC;
	const int dk = GDN_FDK;
	int c = blockIdx.x, h = blockIdx.y, kh = gdn_kh(g, h), dv = g.dv;
	int t0 = c * GDN_FC, L = min(GDN_FC, g.T - t0), tid = threadIdx.x, w = tid >> 5, l = tid & 31;
	const float *rows = conv + (size_t)t0 * g.conv_dim;
	gdn_cp_rows(Ks, GDN_FKP, rows + g.key_dim + kh * dk, g.conv_dim, GDN_FC, L, dk / 4);
	gdn_cp_rows(Qs, GDN_FKP, rows + kh * dk, g.conv_dim, GDN_FC, L, dk / 4);
	cu_cp_commit();
	if (w == 0) {
		/* the in-chunk cumulative decay: a scan over pairs of rows */
		int r0 = 2 * l, r1 = r0 + 1;
		float a0 = r0 < L ? gg[(size_t)(t0 + r0) * g.nv + h] : 0.0f;
		float a1 = r1 < L ? gg[(size_t)(t0 + r1) * g.nv + h] : 0.0f;
		float inc = a0 + a1;
#pragma unroll
		for (int d = 1; d < 32; d <<= 1) {
			float y = __shfl_up_sync(0xffffffffu, inc, d);
			if (l >= d)
				inc += y;
		}
		float ex = __shfl_up_sync(0xffffffffu, inc, 1);
		gam[r0] = l ? ex + a0 : a0;
		gam[r1] = inc;
	} else if (w == 1) {
		for (int r = l; r < GDN_FC; r += 32)
			bet[r] = r < L ? beta[(size_t)(t0 + r) * g.nv + h] : 0.0f;
	}
	__syncthreads();
	if (tid < GDN_FC)
		bg[tid] = bet[tid] * expf(gam[tid]);
	cu_cp_wait<0>();
	__syncthreads();
	/* thread (rt, qt) owns rows 16 m + rt and columns 16 n + qt: the 8 rows a quarter-warp reads
	 * are consecutive (no bank conflicts), the 4 columns a warp reads are broadcasts */
	int rt = (w & 1) * 8 + (l & 7), qt = (w >> 1) * 4 + (l >> 3);
	float ga[10], pa[10]; /* (m, n <= m) at m (m + 1) / 2 + n */
#pragma unroll
	for (int i = 0; i < 10; i++)
		ga[i] = pa[i] = 0.0f;
	for (int k = 0; k < dk; k += 4) {
		float4 kr[4], qr[4], kq[4];
#pragma unroll
		for (int m = 0; m < 4; m++) {
			kr[m] = gdn_ld4(Ks + (16 * m + rt) * GDN_FKP + k);
			qr[m] = gdn_ld4(Qs + (16 * m + rt) * GDN_FKP + k);
			kq[m] = gdn_ld4(Ks + (16 * m + qt) * GDN_FKP + k);
		}
#pragma unroll
		for (int m = 0; m < 4; m++)
#pragma unroll
			for (int n = 0; n <= m; n++) {
				ga[m * (m + 1) / 2 + n] = gdn_dot4(kr[m], kq[n], ga[m * (m + 1) / 2 + n]);
				pa[m * (m + 1) / 2 + n] = gdn_dot4(qr[m], kq[n], pa[m * (m + 1) / 2 + n]);
			}
	}
	size_t base = (size_t)c * g.nv + h;
	float *Pg = ch.P + base * GDN_FC * GDN_FC;
#pragma unroll
	for (int m = 0; m < 4; m++)
#pragma unroll
		for (int n = 0; n < 4; n++) {
			int r = 16 * m + rt, q = 16 * n + qt;
			float p = 0.0f, a = 0.0f;
			if (n <= m) {
				float e = q <= r && r < L ? expf(gam[r] - gam[q]) : 0.0f;
				p = pa[m * (m + 1) / 2 + n] * e;
				a = q < r ? ga[m * (m + 1) / 2 + n] * (bet[r] * e) : 0.0f;
			}
			Pg[r * GDN_FC + q] = p;
			As[r * GDN_FPP + q] = a;
		}
	if (tid < GDN_FC)
		ch.gam[base * GDN_FC + tid] = tid < L ? gam[tid] : 0.0f;
	__syncthreads();
	/* (I + A) [W | U] = [diag(beta e^gam) K | diag(beta) V]; rows from L on come out zero */
	for (int col = tid; col < dk + dv; col += blockDim.x) {
		float x[GDN_FC];
		if (col < dk) {
#pragma unroll
			for (int r = 0; r < GDN_FC; r++)
				x[r] = bg[r] * Ks[r * GDN_FKP + col];
		} else {
			const float *v = rows + 2 * g.key_dim + (size_t)h * dv + col - dk;
#pragma unroll
			for (int r = 0; r < GDN_FC; r++)
				x[r] = r < L ? bet[r] * v[(size_t)r * g.conv_dim] : 0.0f;
		}
		gdn_solve(x, As);
		float *dst = col < dk ? ch.W + base * GDN_FC * dk + col : ch.U + base * GDN_FC * dv + col - dk;
		int stride = col < dk ? dk : dv;
#pragma unroll
		for (int r = 0; r < GDN_FC; r++)
			dst[(size_t)r * stride] = x[r];
	}
}

/* the state pass loads a chunk in two cp.async groups, each issued as soon as its buffers are
 * free: Q and W (read first, by the S0 products) and K, P, U, gam (read after them) */
__device__ __forceinline__ void gdn_load_qw(const gdn_dims &g, const gdn_chunks &ch, const float *conv, int c, int h,
					    int kh, float *Qs, float *Ws)
{
	int t0 = c * GDN_FC, L = min(GDN_FC, g.T - t0);
	size_t base = (size_t)c * g.nv + h;
	gdn_cp_rows(Qs, GDN_FKP, conv + (size_t)t0 * g.conv_dim + kh * GDN_FDK, g.conv_dim, GDN_FC, L, GDN_FDK / 4);
	gdn_cp_rows(Ws, GDN_FKP, ch.W + base * GDN_FC * GDN_FDK, GDN_FDK, GDN_FC, GDN_FC, GDN_FDK / 4);
	cu_cp_commit();
}

__device__ __forceinline__ void gdn_load_kpu(const gdn_dims &g, const gdn_chunks &ch, const float *conv, int c, int h,
					     int kh, int jb, float *Ks, float *Ps, float *Us, float *gam)
{
	int t0 = c * GDN_FC, L = min(GDN_FC, g.T - t0);
	size_t base = (size_t)c * g.nv + h;
	gdn_cp_rows(Ks, GDN_FKK, conv + (size_t)t0 * g.conv_dim + g.key_dim + kh * GDN_FDK, g.conv_dim, GDN_FC, L,
		    GDN_FDK / 4);
	gdn_cp_rows(Ps, GDN_FPP, ch.P + base * GDN_FC * GDN_FC, GDN_FC, GDN_FC, GDN_FC, GDN_FC / 4);
	gdn_cp_rows(Us, GDN_FUP, ch.U + base * GDN_FC * g.dv + jb, g.dv, GDN_FC, GDN_FC, GDN_ROWS / 4);
	gdn_cp_rows(gam, 0, ch.gam + base * GDN_FC, 0, 1, 1, GDN_FC / 4);
	cu_cp_commit();
}

/* the A fragment of cu_mma_tf32 at p (A[g][t] at p + g rs + t cs: rs the row stride of a
 * row-major A, cs the column stride of a column-major one), as tf32 pairs */
__device__ __forceinline__ void gdn_a_split(const float *p, int rs, int cs, unsigned *hi, unsigned *lo)
{
	cu_tf32_split(p[0], hi[0], lo[0]);
	cu_tf32_split(p[8 * rs], hi[1], lo[1]);
	cu_tf32_split(p[4 * cs], hi[2], lo[2]);
	cu_tf32_split(p[8 * rs + 4 * cs], hi[3], lo[3]);
}

/* d += A B for A and B as tf32 pairs (B's two registers b0, b1 each as hi and lo), the small
 * terms first */
__device__ __forceinline__ void gdn_mma3(float *d, const unsigned *ah, const unsigned *al, unsigned bh0, unsigned bh1,
					 unsigned bl0, unsigned bl1)
{
	cu_mma_tf32(d, al, bh0, bh1);
	cu_mma_tf32(d, ah, bl0, bl1);
	cu_mma_tf32(d, ah, bh0, bh1);
}

/* pass 2, block (value head, GDN_ROWS state rows), sequential over chunks; every product on
 * tensor cores in tf32 pairs (f32 accuracy). Warp w: W S0, Q S0, V' and O at chunk rows 16 (w % 4)..
 * and state rows 16 (w / 4).. of the block's 32; the state update at state rows 16 (w % 2).. and
 * key dims 32 (w / 2)..; the state stays in registers (C fragments) between chunks, and in shared
 * memory as tf32 pairs for the next chunk's S0 products. The next chunk's Q and W load during
 * this chunk's V', O and state update, its K, P and U during its own S0 products. */
__global__ void __launch_bounds__(GDN_FTHREADS, 1)
	k_gdn_state_f(gdn_dims g, gdn_chunks ch, const float *conv, float *S, float *o)
{
	extern __shared__ float4 smem4[];
	float *Ks = (float *)smem4, *Qs = Ks + GDN_FC * GDN_FKK, *Ws = Qs + GDN_FC * GDN_FKP;
	unsigned *Sh = (unsigned *)(Ws + GDN_FC * GDN_FKP), *Sl = Sh + GDN_ROWS * GDN_FKP;
	float *Ps = (float *)(Sl + GDN_ROWS * GDN_FKP), *Us = Ps + GDN_FC * GDN_FPP, *Vd = Us + GDN_FC * GDN_FUP,
	      *gam = Vd + GDN_FC * GDN_FUP;
	int h = blockIdx.x, kh = gdn_kh(g, h), dv = g.dv, jb = blockIdx.y * GDN_ROWS;
	int w = threadIdx.x >> 5, l = threadIdx.x & 31, gq = l >> 2, tq = l & 3;
	int r0 = 16 * (w & 3) + gq, c0 = 16 * (w >> 2);	     /* rows r0, r0 + 8; columns c0 + 8 n + 2 tq (+1) */
	int j0 = 16 * (w & 1) + gq, i0 = 32 * (w >> 1) + 2 * tq; /* state rows j0, j0 + 8; key dims i0 + 8 n (+1) */
	float *Sg = S + ((size_t)h * dv + jb) * GDN_FDK;
	gdn_load_qw(g, ch, conv, 0, h, kh, Qs, Ws);
	gdn_load_kpu(g, ch, conv, 0, h, kh, jb, Ks, Ps, Us, gam);
	float st[4][4]; /* S[j0 (+8)][i0 + 8 n (+1)] */
	auto stash = [&]() { /* the state into shared memory as tf32 pairs */
#pragma unroll
		for (int n = 0; n < 4; n++)
#pragma unroll
			for (int m = 0; m < 2; m++) {
				int b = (j0 + 8 * m) * GDN_FKP + i0 + 8 * n;
				cu_tf32_split(st[n][2 * m], Sh[b], Sl[b]);
				cu_tf32_split(st[n][2 * m + 1], Sh[b + 1], Sl[b + 1]);
			}
	};
#pragma unroll
	for (int n = 0; n < 4; n++)
#pragma unroll
		for (int m = 0; m < 2; m++) {
			float2 v = *(const float2 *)(Sg + (size_t)(j0 + 8 * m) * GDN_FDK + i0 + 8 * n);
			st[n][2 * m] = v.x, st[n][2 * m + 1] = v.y;
		}
	stash();
	for (int c = 0; c < ch.n_chunks; c++) {
		int t0 = c * GDN_FC, L = min(GDN_FC, g.T - t0);
		cu_cp_wait<1>();
		__syncthreads();
		/* W S0 and Q S0: A = W or Q (chunk rows x key dims), B[i][j] = S0[j][i] */
		float wa[2][4], qa[2][4];
#pragma unroll
		for (int n = 0; n < 2; n++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				wa[n][e] = qa[n][e] = 0.0f;
#pragma unroll 4
		for (int k = 0; k < GDN_FDK; k += 8) {
			unsigned wh[4], wl[4], qh[4], ql[4];
			gdn_a_split(Ws + r0 * GDN_FKP + k + tq, GDN_FKP, 1, wh, wl);
			gdn_a_split(Qs + r0 * GDN_FKP + k + tq, GDN_FKP, 1, qh, ql);
#pragma unroll
			for (int n = 0; n < 2; n++) {
				int b = (c0 + 8 * n + gq) * GDN_FKP + k + tq;
				unsigned bh0 = Sh[b], bh1 = Sh[b + 4], bl0 = Sl[b], bl1 = Sl[b + 4];
				gdn_mma3(wa[n], wh, wl, bh0, bh1, bl0, bl1);
				gdn_mma3(qa[n], qh, ql, bh0, bh1, bl0, bl1);
			}
		}
		cu_cp_wait<0>();
		__syncthreads();
		if (c + 1 < ch.n_chunks)
			gdn_load_qw(g, ch, conv, c + 1, h, kh, Qs, Ws);
		/* V' = U - W S0 in place, V'_s e^(gam_L - gam_s) beside it; O starts as e^gam Q S0 */
		float gl = gam[L - 1], oa[2][4];
#pragma unroll
		for (int m = 0; m < 2; m++) {
			int r = r0 + 8 * m;
			float d = expf(gl - gam[r]), eg = expf(gam[r]);
#pragma unroll
			for (int n = 0; n < 2; n++) {
				float *u = Us + r * GDN_FUP + c0 + 8 * n + 2 * tq;
				float2 v = make_float2(u[0] - wa[n][2 * m], u[1] - wa[n][2 * m + 1]);
				*(float2 *)u = v;
				*(float2 *)(Vd + (u - Us)) = make_float2(d * v.x, d * v.y);
				oa[n][2 * m] = eg * qa[n][2 * m];
				oa[n][2 * m + 1] = eg * qa[n][2 * m + 1];
			}
		}
		__syncthreads();
		/* O += P V'; P is zero above the diagonal, so row tile w % 4 stops at column 16 (w % 4 + 1) */
#pragma unroll 2
		for (int s = 0; s < 16 * ((w & 3) + 1); s += 8) {
			unsigned ph[4], pl[4];
			gdn_a_split(Ps + r0 * GDN_FPP + s + tq, GDN_FPP, 1, ph, pl);
#pragma unroll
			for (int n = 0; n < 2; n++) {
				unsigned bh0, bh1, bl0, bl1;
				cu_tf32_split(Us[(s + tq) * GDN_FUP + c0 + 8 * n + gq], bh0, bl0);
				cu_tf32_split(Us[(s + tq + 4) * GDN_FUP + c0 + 8 * n + gq], bh1, bl1);
				gdn_mma3(oa[n], ph, pl, bh0, bh1, bl0, bl1);
			}
		}
#pragma unroll
		for (int m = 0; m < 2; m++) {
			int r = r0 + 8 * m;
			if (r < L)
#pragma unroll
				for (int n = 0; n < 2; n++)
					*(float2 *)(o + ((size_t)(t0 + r) * g.nv + h) * dv + jb + c0 + 8 * n + 2 * tq) =
						make_float2(oa[n][2 * m], oa[n][2 * m + 1]);
		}
		/* S = e^gam_L S0 + sum_s (V'_s e^(gam_L - gam_s)) k_s^T: A[j][s] = V'd[s][j], B = K */
		float egl = expf(gl);
#pragma unroll
		for (int n = 0; n < 4; n++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				st[n][e] *= egl;
#pragma unroll 2
		for (int s = 0; s < GDN_FC; s += 8) {
			unsigned vh[4], vl[4];
			gdn_a_split(Vd + (s + tq) * GDN_FUP + j0, 1, GDN_FUP, vh, vl);
#pragma unroll
			for (int n = 0; n < 4; n++) {
				unsigned bh0, bh1, bl0, bl1;
				const float *kb = Ks + (s + tq) * GDN_FKK + i0 - 2 * tq + 8 * n + gq;
				cu_tf32_split(kb[0], bh0, bl0);
				cu_tf32_split(kb[4 * GDN_FKK], bh1, bl1);
				gdn_mma3(st[n], vh, vl, bh0, bh1, bl0, bl1);
			}
		}
		stash();
		__syncthreads();
		if (c + 1 < ch.n_chunks)
			gdn_load_kpu(g, ch, conv, c + 1, h, kh, jb, Ks, Ps, Us, gam);
	}
#pragma unroll
	for (int n = 0; n < 4; n++)
#pragma unroll
		for (int m = 0; m < 2; m++)
			*(float2 *)(Sg + (size_t)(j0 + 8 * m) * GDN_FDK + i0 + 8 * n) =
				make_float2(st[n][2 * m], st[n][2 * m + 1]);
}

/* out = RMSNorm(o) * w * SiLU(z), one warp per (token, value head): no block barriers */
#define GDN_NORM_WARPS 8
__global__ void k_gdn_gnorm(gdn_dims g, const float *o, const float *qkv, const float *z, const float *w, float eps,
			    float *out)
{
	int row = blockIdx.x * GDN_NORM_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (row >= g.T * g.nv)
		return;
	int t = row / g.nv, h = row % g.nv;
	const float *oh = o + (size_t)row * g.dv;
	float ss = 0;
	for (int j = lane; j < g.dv; j += 32)
		ss += oh[j] * oh[j];
	ss = cu_warp_sum(ss);
	float r = rsqrtf(ss / g.dv + eps);
	for (int j = lane; j < g.dv; j += 32) {
		float zv;
		if (g.grouped) {
			int G = 2 * g.dk + 2 * g.r * g.dv;
			zv = qkv[(size_t)t * (g.conv_dim + g.vdim) + (size_t)(h / g.r) * G + 2 * g.dk + g.r * g.dv +
				 (h % g.r) * g.dv + j];
		} else {
			zv = z[(size_t)row * g.dv + j];
		}
		out[(size_t)row * g.dv + j] = oh[j] * r * w[j] * cu_silu(zv);
	}
}

/* the dynamic shared memory k_gdn_decode<D, R, M> may take: 48 KB, or (a step of several tokens)
 * what the device allows, opted in once */
template <int D, int R, bool M>
static size_t gdn_dec_room(struct cuda_backend *cb)
{
	static size_t room;
	if (!room)
		room = M ? cu_allow_smem(cb, (const void *)k_gdn_decode<D, R, M>) : 48 * 1024;
	return room;
}

void cu_gdn(struct cuda_backend *cb, const struct toast_gdn_args *a)
{
	gdn_dims g;
	g.nk = a->n_k_head, g.nv = a->n_v_head, g.dk = a->d_k, g.dv = a->d_v, g.K = a->conv_k, g.r = g.nv / g.nk;
	g.key_dim = g.nk * g.dk, g.vdim = g.nv * g.dv, g.conv_dim = 2 * g.key_dim + g.vdim, g.T = a->T;
	g.grouped = a->qkvz_grouped, g.ba_grouped = a->ba_grouped, g.tiled = a->v_heads_tiled;
	if (g.K > 16 || g.K < 2) {
		cu_fail_msg(cb, "gdn: conv kernel %d is not supported (2..16)", g.K);
		return;
	}
	size_t smem = (size_t)(2 * g.dk + 2 * g.dv) * sizeof(float);
	if (g.T > 1) /* every token's inputs, conv outputs, outputs and factors (k_gdn_decode) */
		smem += (size_t)g.T * (2 * (2 * g.dk + g.dv) + 2 * g.dv + 7) * sizeof(float);
	if (g.T == 1 && smem > 48 * 1024) {
		cu_fail_msg(cb, "gdn: head dims %d/%d are too large", g.dk, g.dv);
		return;
	}
	if (g.T <= GDN_DEC_MAX_T && g.nk <= GDN_SIB_MAX) {
		const int warps = GDN_DEC_THREADS / 32;
		bool regs = g.dv <= warps * 8 && (g.dk == 32 || g.dk == 64 || g.dk == 128 || g.dk == 256);
		int rpw = (g.dv + warps - 1) / warps;
#define GDN_DEC(D, R)                                                                                               \
	do {                                                                                                       \
		if (g.T == 1)                                                                                      \
			GDN_DEC_M(D, R, false);                                                                    \
		else                                                                                               \
			GDN_DEC_M(D, R, true);                                                                     \
	} while (0)
#define GDN_DEC_M(D, R, M)                                                                                          \
	do {                                                                                                       \
		if (smem > gdn_dec_room<D, R, M>(cb))                                                              \
			break;                                                                                     \
		cu_launch_pdl(cb, k_gdn_decode<D, R, M>, g.nv, GDN_DEC_THREADS, smem, g, a->qkv, a->z, a->b, a->a,   \
			      a->conv_w->dev, a->conv_w->dev_type, a->conv_state, cb->d_step,                      \
			      (const float *)a->A_log->dev, a->a_is_neg_exp, (const float *)a->dt_bias->dev,       \
			      (const float *)a->norm_w->dev, a->eps, a->ssm_state, a->out, cb->counters + CU_CTR_GDN, \
			      a->ssm_keep, a->conv_keep);                                                          \
		cu_launched(cb, "gdn decode");                                                                     \
		return;                                                                                            \
	} while (0)
		if (!regs)
			GDN_DEC(0, 1);
		else if (g.dk == 128 && rpw <= 8)
			GDN_DEC(4, 8);
		else if (g.dk == 64)
			GDN_DEC(2, 8);
		else if (g.dk == 32)
			GDN_DEC(1, 8);
		else
			GDN_DEC(8, 8);
#undef GDN_DEC
#undef GDN_DEC_M
	}
	if (a->ssm_keep) {
		cu_fail_msg(cb, "gdn: a step of %d tokens cannot keep its states (at most %d, head dims %d/%d)", g.T,
			    GDN_DEC_MAX_T, g.dk, g.dv);
		return;
	}
	size_t n_conv = (size_t)g.T * g.conv_dim, n_h = (size_t)g.T * g.nv, n_o = (size_t)g.T * g.vdim;
	float *scr = (float *)cu_scratch(cb, (n_conv + 2 * n_h + n_o) * sizeof(float));
	if (!scr)
		return;
	/* o right after conv: both 16-byte aligned when conv_dim is a multiple of 4 (float4 stores) */
	float *conv = scr, *o = conv + n_conv, *beta = o + n_o, *gg = beta + n_h;
	cu_launch(cb, g.K == 4 ? k_gdn_conv<4> : k_gdn_conv<0>, dim3(cu_blocks((size_t)g.conv_dim, 128), cu_blocks((size_t)g.T, GDN_CONV_RUN)), 128, 0,
		  g, a->qkv, a->conv_w->dev, a->conv_w->dev_type, a->conv_state, a->pos, conv);
	cu_launched(cb, "gdn conv");
	cu_launch(cb, k_gdn_prep, g.T, 256, 0, g, conv, a->b, a->a, (const float *)a->A_log->dev, a->a_is_neg_exp,
						 (const float *)a->dt_bias->dev, beta, gg);
	cu_launched(cb, "gdn prep");
	static size_t room1, room2, room1f, room2f;
	if (!room1) {
		room1 = cu_allow_smem(cb, (const void *)k_gdn_intra);
		room2 = cu_allow_smem(cb, (const void *)k_gdn_state);
		room1f = cu_allow_smem(cb, (const void *)k_gdn_intra_f);
		room2f = cu_allow_smem(cb, (const void *)k_gdn_state_f);
	}
	bool fast = g.dk == GDN_FDK && g.dv % GDN_ROWS == 0 && GDN_FSMEM1 <= room1f && GDN_FSMEM2 <= room2f;
	int C = 64;
	size_t sm1 = 0, sm2 = 0;
	for (; !fast && C >= 8; C /= 2) {
		sm1 = ((size_t)3 * C * (g.dk + 1) + (size_t)C * C + (size_t)C * g.dv + 2 * C) * sizeof(float);
		sm2 = ((size_t)3 * C * (g.dk + 1) + (size_t)C * C + (size_t)C * GDN_ROWS + (size_t)GDN_ROWS * (g.dk + 1) +
		       2 * C) * sizeof(float);
		if (sm1 <= cb->smem_optin && sm2 <= cb->smem_optin)
			break;
	}
	if (!fast && (C < 8 || sm1 > room1 || sm2 > room2)) {
		cu_fail_msg(cb, "gdn: head dims %d/%d too large for shared memory", g.dk, g.dv);
		return;
	}
	gdn_chunks ch;
	ch.C = fast ? GDN_FC : C;
	ch.n_chunks = (g.T + ch.C - 1) / ch.C;
	size_t per = (size_t)ch.n_chunks * g.nv * ch.C;
	float *cs = (float *)cu_scratch2(cb, per * ((size_t)g.dk + g.dv + ch.C + 1) * sizeof(float));
	if (!cs)
		return;
	ch.W = cs, ch.U = ch.W + per * g.dk, ch.P = ch.U + per * g.dv, ch.gam = ch.P + per * ch.C;
	dim3 g1(ch.n_chunks, g.nv), g2(g.nv, cu_blocks((size_t)g.dv, GDN_ROWS));
	if (fast) {
		cu_launch(cb, k_gdn_intra_f, g1, GDN_FTHREADS, GDN_FSMEM1, g, ch, (const float *)conv, (const float *)beta,
			  (const float *)gg);
		cu_launched(cb, "gdn chunks");
		cu_launch(cb, k_gdn_state_f, g2, GDN_FTHREADS, GDN_FSMEM2, g, ch, (const float *)conv, a->ssm_state, o);
		cu_launched(cb, "gdn state");
	} else {
		cu_launch(cb, k_gdn_intra, g1, 256, sm1, g, ch, (const float *)conv, (const float *)beta, (const float *)gg);
		cu_launched(cb, "gdn chunks");
		cu_launch(cb, k_gdn_state, g2, 256, sm2, g, ch, (const float *)conv, a->ssm_state, o);
		cu_launched(cb, "gdn state");
	}
	cu_launch(cb, k_gdn_gnorm, cu_blocks((size_t)g.T * g.nv, GDN_NORM_WARPS), GDN_NORM_WARPS * 32, 0, g, o, a->qkv,
		  a->z, (const float *)a->norm_w->dev, a->eps, a->out);
	cu_launched(cb, "gdn gated norm");
}

CU_TL_TU(k_gdn)
