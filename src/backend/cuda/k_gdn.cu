/*
 * k_gdn.cu - the Gated DeltaNet mixer (contract: toast_gdn_args in backend.h).
 *
 * Stages: conv (one thread per channel, all T tokens, conv state updated once), prep (L2-norm
 * of q and k per key head, beta and g per value head), the delta rule, and the gated RMSNorm.
 * The delta rule is independent per row j of a value head's state S[j][:] (value dim j,
 * key dims contiguous), so blocks own (value head, 32 rows): that fills the GPU at decode.
 * Value head h reads key head gdn_kh(): h / (n_v/n_k), or h % n_k when the heads are tiled.
 * Decode (T == 1) runs the token recurrence, one warp per row; prefill runs the chunked form
 * (docs/qwen3next-spec.md §4.1) with a chunk in shared memory, all in f32.
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

__global__ void k_gdn_conv(gdn_dims g, const float *qkv, const void *w, int wtype, float *state, int pos, float *out)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	if (c >= g.conv_dim)
		return;
	int K = g.K;
	size_t slot = (size_t)(K - 1) * g.conv_dim;
	const float *st = state + (pos & 1) * slot;
	float *sn = state + ((pos + g.T) & 1) * slot;
	int64_t col = gdn_chan(g, c);
	float wc[16];
	for (int j = 0; j < K; j++)
		wc[j] = cu_ldw(w, wtype, (size_t)c * K + j);
	int t0 = blockIdx.y * GDN_CONV_RUN, t1 = min(g.T, t0 + GDN_CONV_RUN);
	for (int t = t0; t < t1; t++) {
		float s = 0;
		for (int j = 0; j < K; j++)
			s += wc[j] * gdn_conv_in(g, qkv, st, col, c, t - (K - 1) + j);
		out[(size_t)t * g.conv_dim + c] = cu_silu(s);
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
 * T == 1: the whole step of one value head in one block: conv of its q/k/v channels (the
 * block owning a channel writes the new conv state; q/k channels belong to the first value
 * head of their key head), L2 norms, gates, the state update one warp per row, gated RMSNorm.
 * smem: q[dk], k[dk], v[dv], o[dv].
 */
#define GDN_DEC_THREADS 512
/* DPL > 0: dk == 32 * DPL and dv <= 16 * RPW, the state rows of a warp live in registers */
template <int DPL, int RPW>
__global__ void __launch_bounds__(GDN_DEC_THREADS)
	k_gdn_decode(gdn_dims g, const float *qkv, const float *z, const float *b, const float *a, const void *cw, int cwt,
		     float *conv_state, const int32_t *step, const float *A, int a_neg_exp, const float *dtb,
		     const float *nw, float eps, float *S, bf16 *out)
{
	extern __shared__ float sm[];
	__shared__ float red[32];
	__shared__ float gate_beta, gate_alpha;
	int h = blockIdx.x, kh = gdn_kh(g, h), dk = g.dk, dv = g.dv, K = g.K, tid = threadIdx.x;
	float *qs = sm, *ks = qs + dk, *vs = ks + dk, *os = vs + dv;
	int pos = step[0];
	size_t slot = (size_t)(K - 1) * g.conv_dim;
	const float *st = conv_state + (pos & 1) * slot;
	float *sn = conv_state + ((pos + 1) & 1) * slot;
	bool own_qk = gdn_first_of_kh(g, h);
	for (int cl = tid; cl < 2 * dk + dv; cl += blockDim.x) {
		int c = cl < dk ? kh * dk + cl : cl < 2 * dk ? g.key_dim + kh * dk + cl - dk : 2 * g.key_dim + h * dv + cl - 2 * dk;
		float x = qkv[gdn_chan(g, c)];
		float acc = cu_ldw(cw, cwt, (size_t)c * K + K - 1) * x;
		for (int j = 0; j < K - 1; j++)
			acc += cu_ldw(cw, cwt, (size_t)c * K + j) * st[(size_t)j * g.conv_dim + c];
		sm[cl] = cu_silu(acc);
		if (cl >= 2 * dk || own_qk) {
			for (int j = 0; j < K - 2; j++)
				sn[(size_t)j * g.conv_dim + c] = st[(size_t)(j + 1) * g.conv_dim + c];
			sn[(size_t)(K - 2) * g.conv_dim + c] = x;
		}
	}
	__syncthreads();
	float sq = 0, sk = 0;
	for (int i = tid; i < dk; i += blockDim.x) {
		sq += qs[i] * qs[i];
		sk += ks[i] * ks[i];
	}
	sq = cu_block_sum(sq, red);
	sk = cu_block_sum(sk, red);
	float fq = rsqrtf(sq + 1e-6f) * rsqrtf((float)dk), fk = rsqrtf(sk + 1e-6f);
	if (tid == 0) {
		float bv, av;
		if (g.ba_grouped) {
			const float *rw = b + (size_t)(h / g.r) * 2 * g.r;
			bv = rw[h % g.r];
			av = rw[g.r + h % g.r];
		} else {
			bv = b[h];
			av = a[h];
		}
		float xx = av + dtb[h];
		float sp = xx > 20.0f ? xx : log1pf(expf(xx));
		gate_beta = 1.0f / (1.0f + expf(-bv));
		gate_alpha = expf((a_neg_exp ? A[h] : -expf(A[h])) * sp);
	}
	__syncthreads();
	for (int i = tid; i < dk; i += blockDim.x) {
		qs[i] *= fq;
		ks[i] *= fk;
	}
	__syncthreads();
	int warp = tid >> 5, lane = tid & 31, nwarp = blockDim.x >> 5;
	float alpha = gate_alpha, beta = gate_beta;
	if (DPL > 0) {
		/* the warp's rows are held in registers: every load is issued before any reduction */
		float Sr[RPW][DPL > 0 ? DPL : 1], kr[DPL > 0 ? DPL : 1], qr[DPL > 0 ? DPL : 1];
#pragma unroll
		for (int k = 0; k < DPL; k++) {
			kr[k] = ks[lane + 32 * k];
			qr[k] = qs[lane + 32 * k];
		}
#pragma unroll
		for (int i = 0; i < RPW; i++) {
			int j = warp * RPW + i;
#pragma unroll
			for (int k = 0; k < DPL; k++)
				Sr[i][k] = j < dv ? S[((size_t)h * dv + j) * dk + lane + 32 * k] * alpha : 0.0f;
		}
		float m[RPW];
#pragma unroll
		for (int i = 0; i < RPW; i++) {
			m[i] = 0;
#pragma unroll
			for (int k = 0; k < DPL; k++)
				m[i] += Sr[i][k] * kr[k];
		}
#pragma unroll
		for (int i = 0; i < RPW; i++)
			m[i] = cu_warp_sum(m[i]);
		float o[RPW];
#pragma unroll
		for (int i = 0; i < RPW; i++) {
			int j = warp * RPW + i;
			float delta = j < dv ? beta * (vs[j] - m[i]) : 0.0f;
			o[i] = 0;
#pragma unroll
			for (int k = 0; k < DPL; k++) {
				Sr[i][k] += kr[k] * delta;
				o[i] += Sr[i][k] * qr[k];
			}
		}
#pragma unroll
		for (int i = 0; i < RPW; i++) {
			int j = warp * RPW + i;
			o[i] = cu_warp_sum(o[i]);
			if (j < dv) {
#pragma unroll
				for (int k = 0; k < DPL; k++)
					S[((size_t)h * dv + j) * dk + lane + 32 * k] = Sr[i][k];
				if (lane == 0)
					os[j] = o[i];
			}
		}
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
	float ss = 0;
	for (int j = tid; j < dv; j += blockDim.x)
		ss += os[j] * os[j];
	ss = cu_block_sum(ss, red);
	float rr = rsqrtf(ss / dv + eps);
	for (int j = tid; j < dv; j += blockDim.x) {
		float zv;
		if (g.grouped) {
			int G = 2 * g.dk + 2 * g.r * g.dv;
			zv = qkv[(size_t)(h / g.r) * G + 2 * g.dk + g.r * g.dv + (h % g.r) * g.dv + j];
		} else {
			zv = z[(size_t)h * dv + j];
		}
		out[(size_t)h * dv + j] = __float2bfloat16(os[j] * rr * nw[j] * cu_silu(zv));
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
		__syncthreads();
	}
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

/* out = RMSNorm(o) * w * SiLU(z) per (token, value head) */
__global__ void k_gdn_gnorm(gdn_dims g, const float *o, const float *qkv, const float *z, const float *w, float eps,
			    bf16 *out)
{
	__shared__ float red[32];
	int t = blockIdx.x, h = blockIdx.y;
	const float *oh = o + ((size_t)t * g.nv + h) * g.dv;
	float ss = 0;
	for (int j = threadIdx.x; j < g.dv; j += blockDim.x)
		ss += oh[j] * oh[j];
	ss = cu_block_sum(ss, red);
	float r = rsqrtf(ss / g.dv + eps);
	for (int j = threadIdx.x; j < g.dv; j += blockDim.x) {
		float zv;
		if (g.grouped) {
			int G = 2 * g.dk + 2 * g.r * g.dv;
			zv = qkv[(size_t)t * (g.conv_dim + g.vdim) + (size_t)(h / g.r) * G + 2 * g.dk + g.r * g.dv +
				 (h % g.r) * g.dv + j];
		} else {
			zv = z[((size_t)t * g.nv + h) * g.dv + j];
		}
		out[((size_t)t * g.nv + h) * g.dv + j] = __float2bfloat16(oh[j] * r * w[j] * cu_silu(zv));
	}
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
	if (g.T == 1) {
		size_t smem = (size_t)(2 * g.dk + 2 * g.dv) * sizeof(float);
		if (smem > 48 * 1024) {
			cu_fail_msg(cb, "gdn: head dims %d/%d are too large", g.dk, g.dv);
			return;
		}
		const int warps = GDN_DEC_THREADS / 32;
		bool regs = g.dv <= warps * 8 && (g.dk == 32 || g.dk == 64 || g.dk == 128 || g.dk == 256);
		int rpw = (g.dv + warps - 1) / warps;
#define GDN_DEC(D, R)                                                                                               \
	cu_launch(cb, k_gdn_decode<D, R>, g.nv, GDN_DEC_THREADS, smem,                                               \
		g, a->qkv, a->z, a->b, a->a, a->conv_w->dev, a->conv_w->dev_type, a->conv_state, cb->d_step,          \
		(const float *)a->A_log->dev, a->a_is_neg_exp, (const float *)a->dt_bias->dev,                        \
		(const float *)a->norm_w->dev, a->eps, a->ssm_state, (bf16 *)a->out)
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
		cu_launched(cb, "gdn decode");
		return;
	}
	size_t n_conv = (size_t)g.T * g.conv_dim, n_h = (size_t)g.T * g.nv, n_o = (size_t)g.T * g.vdim;
	float *scr = (float *)cu_scratch(cb, (n_conv + 2 * n_h + n_o) * sizeof(float));
	if (!scr)
		return;
	float *conv = scr, *beta = conv + n_conv, *gg = beta + n_h, *o = gg + n_h;
	cu_launch(cb, k_gdn_conv, dim3(cu_blocks((size_t)g.conv_dim, 128), cu_blocks((size_t)g.T, GDN_CONV_RUN)), 128, 0,
		  g, a->qkv, a->conv_w->dev, a->conv_w->dev_type, a->conv_state, a->pos, conv);
	cu_launched(cb, "gdn conv");
	cu_launch(cb, k_gdn_prep, g.T, 256, 0, g, conv, a->b, a->a, (const float *)a->A_log->dev, a->a_is_neg_exp,
						 (const float *)a->dt_bias->dev, beta, gg);
	cu_launched(cb, "gdn prep");
	int C = 64;
	size_t sm1 = 0, sm2 = 0;
	for (; C >= 8; C /= 2) {
		sm1 = ((size_t)3 * C * (g.dk + 1) + (size_t)C * C + (size_t)C * g.dv + 2 * C) * sizeof(float);
		sm2 = ((size_t)3 * C * (g.dk + 1) + (size_t)C * C + (size_t)C * GDN_ROWS + (size_t)GDN_ROWS * (g.dk + 1) +
		       2 * C) * sizeof(float);
		if (sm1 <= cb->smem_optin && sm2 <= cb->smem_optin)
			break;
	}
	static size_t room1, room2;
	if (!room1) {
		room1 = cu_allow_smem(cb, (const void *)k_gdn_intra);
		room2 = cu_allow_smem(cb, (const void *)k_gdn_state);
	}
	if (C < 8 || sm1 > room1 || sm2 > room2) {
		cu_fail_msg(cb, "gdn: head dims %d/%d too large for shared memory", g.dk, g.dv);
		return;
	}
	gdn_chunks ch;
	ch.C = C;
	ch.n_chunks = (g.T + C - 1) / C;
	size_t per = (size_t)ch.n_chunks * g.nv * C;
	float *cs = (float *)cu_scratch2(cb, per * ((size_t)g.dk + g.dv + C + 1) * sizeof(float));
	if (!cs)
		return;
	ch.W = cs, ch.U = ch.W + per * g.dk, ch.P = ch.U + per * g.dv, ch.gam = ch.P + per * C;
	cu_launch(cb, k_gdn_intra, dim3(ch.n_chunks, g.nv), 256, sm1, g, ch, (const float *)conv, (const float *)beta,
		  (const float *)gg);
	cu_launched(cb, "gdn chunks");
	cu_launch(cb, k_gdn_state, dim3(g.nv, cu_blocks((size_t)g.dv, GDN_ROWS)), 256, sm2, g, ch, (const float *)conv,
		  a->ssm_state, o);
	cu_launched(cb, "gdn state");
	dim3 ng(g.T, g.nv);
	cu_launch(cb, k_gdn_gnorm, ng, 128, 0, g, o, a->qkv, a->z, (const float *)a->norm_w->dev, a->eps, (bf16 *)a->out);
	cu_launched(cb, "gdn gated norm");
}
