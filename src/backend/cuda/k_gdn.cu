/*
 * k_gdn.cu - the Gated DeltaNet mixer (contract: toast_gdn_args in backend.h).
 *
 * Stages: conv (one thread per channel, all T tokens, conv state updated once), prep (L2-norm
 * of q and k per key head, beta and g per value head), the delta rule, and the gated RMSNorm.
 * The delta rule is independent per row j of a value head's state S[j][:] (value dim j,
 * key dims contiguous), so blocks own (value head, 32 rows): that fills the GPU at decode.
 * Decode (T == 1) runs the token recurrence, one warp per row; prefill runs the chunked form
 * (docs/qwen3next-spec.md §4.1) with a chunk in shared memory, all in f32.
 */
#include "backend/cuda/cuda_common.cuh"

#define GDN_ROWS 32

struct gdn_dims {
	int nk, nv, dk, dv, K, r, key_dim, vdim, conv_dim, T;
	int grouped, ba_grouped;
};

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

/* prefill: one thread per channel over all T tokens; reads state slot pos & 1, writes (pos + T) & 1 */
__global__ void k_gdn_conv(gdn_dims g, const float *qkv, const void *w, int wtype, float *state, int pos, float *out)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	if (c >= g.conv_dim)
		return;
	int K = g.K;
	size_t slot = (size_t)(K - 1) * g.conv_dim;
	const float *st = state + (pos & 1) * slot;
	float *sn = state + ((pos + g.T) & 1) * slot;
	float win[16];
	for (int j = 0; j < K - 1; j++)
		win[j] = st[(size_t)j * g.conv_dim + c];
	int64_t col = gdn_chan(g, c), stride = g.grouped ? g.conv_dim + g.vdim : g.conv_dim;
	float wc[16];
	for (int j = 0; j < K; j++)
		wc[j] = cu_ldw(w, wtype, (size_t)c * K + j);
	for (int t = 0; t < g.T; t++) {
		float x = qkv[t * stride + col];
		float s = wc[K - 1] * x;
		for (int j = 0; j < K - 1; j++)
			s += wc[j] * win[j];
		for (int j = 0; j < K - 2; j++)
			win[j] = win[j + 1];
		win[K - 2] = x;
		out[(size_t)t * g.conv_dim + c] = cu_silu(s);
	}
	for (int j = 0; j < K - 1; j++)
		sn[(size_t)j * g.conv_dim + c] = win[j];
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
	int h = blockIdx.x, kh = h / g.r, dk = g.dk, dv = g.dv, K = g.K, tid = threadIdx.x;
	float *qs = sm, *ks = qs + dk, *vs = ks + dk, *os = vs + dv;
	int pos = step[0];
	size_t slot = (size_t)(K - 1) * g.conv_dim;
	const float *st = conv_state + (pos & 1) * slot;
	float *sn = conv_state + ((pos + 1) & 1) * slot;
	bool own_qk = h % g.r == 0;
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

/* T > 1: chunks of C tokens in shared memory, sequential over chunks. Rows of K, Q, W and S are
 * padded to dk + 1 floats so that threads walking different rows hit different banks. */
__global__ void k_gdn_chunk(gdn_dims g, int C, const float *conv, const float *beta, const float *gg, float *S,
			    float *o)
{
	extern __shared__ float smem[];
	int h = blockIdx.x, kh = h / g.r, dk = g.dk, dkp = dk + 1;
	int jb = blockIdx.y * GDN_ROWS, J = min(GDN_ROWS, g.dv - jb);
	float *Kc = smem, *Qc = Kc + C * dkp, *W = Qc + C * dkp, *A = W + C * dkp, *U = A + C * C;
	float *Ss = U + C * GDN_ROWS, *gam = Ss + GDN_ROWS * dkp, *bet = gam + C;
	int tid = threadIdx.x, nt = blockDim.x;
	float *Sg = S + ((size_t)h * g.dv + jb) * dk;
	for (int x = tid; x < J * dk; x += nt)
		Ss[(x / dk) * dkp + x % dk] = Sg[x];
	for (int t0 = 0; t0 < g.T; t0 += C) {
		int L = min(C, g.T - t0);
		__syncthreads();
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
		/* A[r][s] = beta_r e^(gam_r - gam_s) k_r.k_s, s < r */
		for (int x = tid; x < L * L; x += nt) {
			int r = x / L, s = x % L;
			float v = 0;
			if (s < r) {
				for (int i = 0; i < dk; i++)
					v += Kc[r * dkp + i] * Kc[s * dkp + i];
				v *= bet[r] * expf(gam[r] - gam[s]);
			}
			A[r * C + s] = v;
		}
		__syncthreads();
		/* forward substitution: (I + A) W = diag(beta e^gam) K, (I + A) U = diag(beta) V */
		for (int r = 0; r < L; r++) {
			const float *row = conv + (size_t)(t0 + r) * g.conv_dim + 2 * g.key_dim + (size_t)h * g.dv + jb;
			for (int c = tid; c < dk + J; c += nt) {
				if (c < dk) {
					float v = bet[r] * expf(gam[r]) * Kc[r * dkp + c];
					for (int s = 0; s < r; s++)
						v -= A[r * C + s] * W[s * dkp + c];
					W[r * dkp + c] = v;
				} else {
					int j = c - dk;
					float v = bet[r] * row[j];
					for (int s = 0; s < r; s++)
						v -= A[r * C + s] * U[s * GDN_ROWS + j];
					U[r * GDN_ROWS + j] = v;
				}
			}
			__syncthreads();
		}
		/* V' = U - W S0 (in U); O part 1 = e^gam Q S0 (to global) */
		for (int x = tid; x < L * J; x += nt) {
			int r = x / J, j = x % J;
			float ws = 0, qs = 0;
			for (int i = 0; i < dk; i++) {
				ws += W[r * dkp + i] * Ss[j * dkp + i];
				qs += Qc[r * dkp + i] * Ss[j * dkp + i];
			}
			U[r * GDN_ROWS + j] -= ws;
			o[((size_t)(t0 + r) * g.nv + h) * g.dv + jb + j] = expf(gam[r]) * qs;
		}
		__syncthreads();
		/* P[r][s] = e^(gam_r - gam_s) q_r.k_s, s <= r (into A) */
		for (int x = tid; x < L * L; x += nt) {
			int r = x / L, s = x % L;
			float v = 0;
			if (s <= r) {
				for (int i = 0; i < dk; i++)
					v += Qc[r * dkp + i] * Kc[s * dkp + i];
				v *= expf(gam[r] - gam[s]);
			}
			A[r * C + s] = v;
		}
		__syncthreads();
		for (int x = tid; x < L * J; x += nt) {
			int r = x / J, j = x % J;
			float v = 0;
			for (int s = 0; s <= r; s++)
				v += A[r * C + s] * U[s * GDN_ROWS + j];
			o[((size_t)(t0 + r) * g.nv + h) * g.dv + jb + j] += v;
		}
		/* S = e^gam_L S0 + sum_s e^(gam_L - gam_s) V'_s k_s^T */
		float gl = gam[L - 1];
		for (int x = tid; x < J * dk; x += nt) {
			int j = x / dk, i = x % dk;
			float v = expf(gl) * Ss[j * dkp + i];
			for (int s = 0; s < L; s++)
				v += expf(gl - gam[s]) * U[s * GDN_ROWS + j] * Kc[s * dkp + i];
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
	g.grouped = a->qkvz_grouped, g.ba_grouped = a->ba_grouped;
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
	k_gdn_decode<D, R><<<g.nv, GDN_DEC_THREADS, smem, cb->stream>>>(                                              \
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
	k_gdn_conv<<<cu_blocks((size_t)g.conv_dim, 128), 128, 0, cb->stream>>>(
		g, a->qkv, a->conv_w->dev, a->conv_w->dev_type, a->conv_state, a->pos, conv);
	cu_launched(cb, "gdn conv");
	k_gdn_prep<<<g.T, 256, 0, cb->stream>>>(g, conv, a->b, a->a, (const float *)a->A_log->dev, a->a_is_neg_exp,
						 (const float *)a->dt_bias->dev, beta, gg);
	cu_launched(cb, "gdn prep");
	dim3 grid(g.nv, cu_blocks((size_t)g.dv, GDN_ROWS));
	int C = 64;
	size_t smem = 0;
	for (; C >= 8; C /= 2) {
		smem = ((size_t)3 * C * (g.dk + 1) + (size_t)C * C + (size_t)C * GDN_ROWS + (size_t)GDN_ROWS * (g.dk + 1) +
			2 * C) * sizeof(float);
		if (smem <= cb->smem_optin)
			break;
	}
	if (C < 8) {
		cu_fail_msg(cb, "gdn: key head dim %d too large for shared memory", g.dk);
		return;
	}
	static size_t chunk_room;
	if (!chunk_room)
		chunk_room = cu_allow_smem(cb, (const void *)k_gdn_chunk);
	if (smem > chunk_room) {
		cu_fail_msg(cb, "gdn: key head dim %d too large for shared memory", g.dk);
		return;
	}
	k_gdn_chunk<<<grid, 256, smem, cb->stream>>>(g, C, conv, beta, gg, a->ssm_state, o);
	cu_launched(cb, "gdn chunk");
	dim3 ng(g.T, g.nv);
	k_gdn_gnorm<<<ng, 128, 0, cb->stream>>>(g, o, a->qkv, a->z, (const float *)a->norm_w->dev, a->eps, (bf16 *)a->out);
	cu_launched(cb, "gdn gated norm");
}
