/*
 * cpu_gdn.c - the Gated DeltaNet mixer on the CPU (contract in backend.h).
 *
 * T == 1 runs the token recurrence; T > 1 runs the chunked form (chunks of GDN_CHUNK tokens,
 * the last one partial) which is the same math reorganised around an in-chunk triangular solve:
 * with gamma the in-chunk cumulative log-decay, A[r][s] = beta_r e^(gamma_r - gamma_s) k_r.k_s
 * (s < r), U = (I+A)^-1 diag(beta) V, W = (I+A)^-1 diag(beta e^gamma) K, V' = U - W S0,
 * O = diag(e^gamma) Q S0 + P V' with P[r][s] = e^(gamma_r - gamma_s) q_r.k_s (s <= r), and
 * S = e^gamma_L S0 + (diag(e^(gamma_L - gamma)) K)^T V'. All in f32. A step that keeps its states
 * after each token (ssm_keep) runs the token recurrence.
 */
#include <string.h>

#include "backend/cpu/cpu.h"

#define GDN_CHUNK 64

struct gdn_ctx {
	struct cpu_backend *cb;
	const struct toast_gdn_args *a;
	float *xin, *conv, *z, *beta, *g, *o; /* flat f32 work arrays, see cpu_gdn */
	float *convw;
	int conv_dim;
};

static void gdn_conv_task(void *p, int task, int tid)
{
	struct gdn_ctx *c = p;
	const struct toast_gdn_args *a = c->a;
	int K = a->conv_k, cd = c->conv_dim, T = a->T;
	int c0 = task * 64, c1 = c0 + 64 < cd ? c0 + 64 : cd;
	size_t slot = (size_t)(K - 1) * cd;
	const float *st = a->conv_state + (size_t)(a->pos & 1) * slot;
	float *st_new = a->conv_state + (size_t)((a->pos + T) & 1) * slot;
	float *win = c->cb->scratch[tid]; /* [K-1+T] for one channel */
	for (int ch = c0; ch < c1; ch++) {
		for (int j = 0; j < K - 1; j++)
			win[j] = st[(size_t)j * cd + ch];
		for (int t = 0; t < T; t++)
			win[K - 1 + t] = c->xin[(size_t)t * cd + ch];
		const float *w = c->convw + (size_t)ch * K;
		for (int t = 0; t < T; t++) {
			float s = 0;
			for (int j = 0; j < K; j++)
				s += w[j] * win[t + j];
			c->conv[(size_t)t * cd + ch] = cpu_silu(s);
		}
		for (int j = 0; j < K - 1; j++)
			st_new[(size_t)j * cd + ch] = win[T + j];
		for (int t = 0; a->conv_keep && t < T - 1; t++) /* the window after token t */
			for (int j = 0; j < K - 1; j++)
				a->conv_keep[((size_t)t * (K - 1) + j) * cd + ch] = win[t + 1 + j];
	}
}

/* one value head over all T tokens */
static void gdn_head_task(void *p, int h, int tid)
{
	struct gdn_ctx *c = p;
	const struct toast_gdn_args *a = c->a;
	int dk = a->d_k, dv = a->d_v, T = a->T, cd = c->conv_dim;
	int kh = a->v_heads_tiled ? h % a->n_k_head : h / (a->n_v_head / a->n_k_head);
	int key_dim = a->n_k_head * dk;
	float *S = a->ssm_state + (size_t)h * dv * dk; /* [dv][dk] */
#define Q_(t) (c->conv + (size_t)(t) * cd + (size_t)kh * dk)
#define K_(t) (c->conv + (size_t)(t) * cd + key_dim + (size_t)kh * dk)
#define V_(t) (c->conv + (size_t)(t) * cd + 2 * key_dim + (size_t)h * dv)
#define O_(t) (c->o + (size_t)(t) * a->n_v_head * dv + (size_t)h * dv)
	if (T == 1 || a->ssm_keep) {
		for (int t = 0; t < T; t++) {
			float alpha = expf(c->g[(size_t)t * a->n_v_head + h]), beta = c->beta[(size_t)t * a->n_v_head + h];
			const float *q = Q_(t), *k = K_(t), *v = V_(t);
			float *o = O_(t);
			for (int j = 0; j < dv; j++) {
				float *Sj = S + (size_t)j * dk;
				for (int i = 0; i < dk; i++)
					Sj[i] *= alpha;
				float delta = beta * (v[j] - cpu_dot(Sj, k, dk));
				for (int i = 0; i < dk; i++)
					Sj[i] += k[i] * delta;
				o[j] = cpu_dot(Sj, q, dk);
			}
			if (t < T - 1)
				memcpy(a->ssm_keep + ((size_t)t * a->n_v_head + h) * dv * dk, S, (size_t)dv * dk * sizeof(float));
		}
		return;
	}
	float *ws = c->cb->scratch[tid];
	float *A = ws;                       /* [C][C] */
	float *U = A + GDN_CHUNK * GDN_CHUNK; /* [C][dv], becomes V' */
	float *W = U + GDN_CHUNK * dv;       /* [C][dk] */
	float *gam = W + GDN_CHUNK * dk;     /* [C] */
	for (int t0 = 0; t0 < T; t0 += GDN_CHUNK) {
		int L = T - t0 < GDN_CHUNK ? T - t0 : GDN_CHUNK;
		float acc = 0;
		for (int r = 0; r < L; r++) {
			acc += c->g[(size_t)(t0 + r) * a->n_v_head + h];
			gam[r] = acc;
		}
		for (int r = 0; r < L; r++) {
			float br = c->beta[(size_t)(t0 + r) * a->n_v_head + h];
			for (int s = 0; s < r; s++)
				A[r * GDN_CHUNK + s] = br * expf(gam[r] - gam[s]) * cpu_dot(K_(t0 + r), K_(t0 + s), dk);
			/* forward substitution: (I + A) U = diag(beta) V, (I + A) W = diag(beta e^gamma) K */
			const float *vr = V_(t0 + r), *kr = K_(t0 + r);
			float *Ur = U + (size_t)r * dv, *Wr = W + (size_t)r * dk;
			float ebr = br * expf(gam[r]);
			for (int j = 0; j < dv; j++)
				Ur[j] = br * vr[j];
			for (int i = 0; i < dk; i++)
				Wr[i] = ebr * kr[i];
			for (int s = 0; s < r; s++) {
				float ars = A[r * GDN_CHUNK + s];
				const float *Us = U + (size_t)s * dv, *Ws = W + (size_t)s * dk;
				for (int j = 0; j < dv; j++)
					Ur[j] -= ars * Us[j];
				for (int i = 0; i < dk; i++)
					Wr[i] -= ars * Ws[i];
			}
		}
		/* V' = U - W S0 (into U); O = diag(e^gamma) Q S0 + P V' */
		for (int r = 0; r < L; r++) {
			float *Ur = U + (size_t)r * dv, *o = O_(t0 + r);
			const float *Wr = W + (size_t)r * dk, *qr = Q_(t0 + r);
			float eg = expf(gam[r]);
			for (int j = 0; j < dv; j++) {
				const float *Sj = S + (size_t)j * dk;
				Ur[j] -= cpu_dot(Wr, Sj, dk);
				o[j] = eg * cpu_dot(qr, Sj, dk);
			}
		}
		for (int r = 0; r < L; r++) {
			float *o = O_(t0 + r);
			const float *qr = Q_(t0 + r);
			for (int s = 0; s <= r; s++) {
				float prs = expf(gam[r] - gam[s]) * cpu_dot(qr, K_(t0 + s), dk);
				const float *Us = U + (size_t)s * dv;
				for (int j = 0; j < dv; j++)
					o[j] += prs * Us[j];
			}
		}
		/* S = e^gamma_L S0 + sum_s e^(gamma_L - gamma_s) V'_s k_s^T */
		float egl = expf(gam[L - 1]);
		for (int j = 0; j < dv; j++) {
			float *Sj = S + (size_t)j * dk;
			for (int i = 0; i < dk; i++)
				Sj[i] *= egl;
			for (int s = 0; s < L; s++) {
				float f = expf(gam[L - 1] - gam[s]) * U[(size_t)s * dv + j];
				const float *ks = K_(t0 + s);
				for (int i = 0; i < dk; i++)
					Sj[i] += f * ks[i];
			}
		}
	}
#undef Q_
#undef K_
#undef V_
#undef O_
}

static float gdn_softplus(float x)
{
	return x > 20.0f ? x : log1pf(expf(x));
}

static void gdn_l2norm(float *x, int n, float scale)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	float r = 1.0f / sqrtf((float)ss + 1e-6f) * scale;
	for (int i = 0; i < n; i++)
		x[i] *= r;
}

/* gather the projections into flat f32 arrays: xin [T][conv_dim], z [T][vdim], b/a [T][nv] */
static void gdn_gather(const struct toast_gdn_args *a, int conv_dim, float *xin, float *z, float *b, float *av)
{
	int nk = a->n_k_head, nv = a->n_v_head, dk = a->d_k, dv = a->d_v, r = nv / nk;
	int key_dim = nk * dk, vdim = nv * dv;
	for (int t = 0; t < a->T; t++) {
		float *x = xin + (size_t)t * conv_dim, *zt = z + (size_t)t * vdim;
		if (a->qkvz_grouped) {
			int G = 2 * dk + 2 * r * dv;
			const float *row = (const float *)a->qkv + (size_t)t * (conv_dim + vdim);
			for (int g = 0; g < nk; g++) {
				const float *grp = row + (size_t)g * G;
				for (int i = 0; i < dk; i++) {
					x[g * dk + i] = grp[i];
					x[key_dim + g * dk + i] = grp[dk + i];
				}
				for (int i = 0; i < r * dv; i++) {
					x[2 * key_dim + g * r * dv + i] = grp[2 * dk + i];
					zt[g * r * dv + i] = grp[2 * dk + r * dv + i];
				}
			}
		} else {
			const float *row = (const float *)a->qkv + (size_t)t * conv_dim;
			for (int i = 0; i < conv_dim; i++)
				x[i] = row[i];
			for (int i = 0; i < vdim; i++)
				zt[i] = ((const float *)a->z)[(size_t)t * vdim + i];
		}
		for (int g = 0; g < nk; g++)
			for (int j = 0; j < r; j++) {
				int h = g * r + j;
				if (a->ba_grouped) {
					const float *row = (const float *)a->b + (size_t)t * 2 * nv + (size_t)g * 2 * r;
					b[(size_t)t * nv + h] = row[j];
					av[(size_t)t * nv + h] = row[r + j];
				} else {
					b[(size_t)t * nv + h] = ((const float *)a->b)[(size_t)t * nv + h];
					av[(size_t)t * nv + h] = ((const float *)a->a)[(size_t)t * nv + h];
				}
			}
	}
}

void cpu_gdn(struct toast_backend *be, const struct toast_gdn_args *a)
{
	struct cpu_backend *cb = cpu_of(be);
	int nk = a->n_k_head, nv = a->n_v_head, dk = a->d_k, dv = a->d_v, T = a->T, K = a->conv_k;
	int key_dim = nk * dk, vdim = nv * dv, conv_dim = 2 * key_dim + vdim;
	size_t n_x = (size_t)T * conv_dim, n_z = (size_t)T * vdim, n_h = (size_t)T * nv;
	float *sh = cpu_shared(cb, 2 * n_x + 2 * n_z + 4 * n_h + (size_t)conv_dim * K + 3 * (size_t)nv);
	size_t per_thread = (size_t)GDN_CHUNK * GDN_CHUNK + (size_t)GDN_CHUNK * (dv + dk + 1);
	if (per_thread < (size_t)(K - 1 + T))
		per_thread = (size_t)(K - 1 + T);
	if (!sh || !cpu_scratch(cb, per_thread))
		return;
	struct gdn_ctx c = {.cb = cb, .a = a, .conv_dim = conv_dim};
	c.xin = sh;
	c.conv = c.xin + n_x;
	c.z = c.conv + n_x;
	c.o = c.z + n_z;
	float *b = c.o + n_z, *av = b + n_h;
	c.beta = av + n_h;
	c.g = c.beta + n_h;
	c.convw = c.g + n_h;
	float *A = c.convw + (size_t)conv_dim * K, *dtb = A + nv;

	gdn_gather(a, conv_dim, c.xin, c.z, b, av);
	cpu_to_f32(a->conv_w, 0, (int64_t)conv_dim * K, c.convw);
	toast_pool_for(cb->pool, (conv_dim + 63) / 64, gdn_conv_task, &c);

	cpu_to_f32(a->A_log, 0, nv, A);
	cpu_to_f32(a->dt_bias, 0, nv, dtb);
	for (int h = 0; h < nv; h++)
		A[h] = a->a_is_neg_exp ? A[h] : -expf(A[h]);
	for (int t = 0; t < T; t++) {
		float *row = c.conv + (size_t)t * conv_dim;
		for (int g = 0; g < nk; g++) {
			gdn_l2norm(row + g * dk, dk, 1.0f / sqrtf((float)dk));
			gdn_l2norm(row + key_dim + g * dk, dk, 1.0f);
		}
		for (int h = 0; h < nv; h++) {
			size_t i = (size_t)t * nv + h;
			c.beta[i] = cpu_sigmoid(b[i]);
			c.g[i] = A[h] * gdn_softplus(av[i] + dtb[h]);
		}
	}
	toast_pool_for(cb->pool, nv, gdn_head_task, &c);

	/* gated RMSNorm per (token, value head) */
	float *nw = cb->scratch[0];
	cpu_to_f32(a->norm_w, 0, dv, nw);
	for (int t = 0; t < T; t++)
		for (int h = 0; h < nv; h++) {
			const float *o = c.o + (size_t)t * vdim + (size_t)h * dv;
			const float *zz = c.z + (size_t)t * vdim + (size_t)h * dv;
			float *out = (float *)a->out + (size_t)t * vdim + (size_t)h * dv;
			double ss = 0;
			for (int j = 0; j < dv; j++)
				ss += (double)o[j] * o[j];
			float r = 1.0f / sqrtf((float)(ss / dv) + a->eps);
			for (int j = 0; j < dv; j++)
				out[j] = o[j] * r * nw[j] * cpu_silu(zz[j]);
		}
}
