/*
 * cpu_moe.c - mixture of experts with optional shared expert on the CPU (contract in backend.h).
 *
 * Tokens are grouped by the expert they chose, so each expert's weight rows are converted once
 * per call however many tokens use it: first gate/up (tasks = expert x block of n_ff rows),
 * then down (tasks = block of n_embd rows, each summing over experts in index order).
 */
#include "backend/cpu/cpu.h"

#include <string.h>

#define MOE_ROWS 16

struct moe_ctx {
	struct cpu_backend *cb;
	const struct toast_moe_args *a;
	const float *h;
	int32_t *sel;   /* [T][k] expert ids */
	float *wt;      /* [T][k] routing weights */
	int32_t *order; /* token-slot ids (t*k + slot) grouped by expert */
	int32_t *start; /* [n_expert + 1] offsets into order */
	int32_t *tasks; /* gate/up tasks: expert * n_blocks + block; the shared expert is n_expert */
	float *act;     /* [T][k][n_ff] */
	float *sact;    /* [T][n_ff_sh] */
	float *sgate;   /* [T] */
};

/* SiLU(gate·h) * (up·h) for rows [r0, r1) of one expert, for the given token-slots */
static void moe_gate_up(struct moe_ctx *c, const struct toast_weight *G, const struct toast_weight *U, int r0,
			int r1, const int32_t *ts, int n_ts, int tsdiv, float *act, int n_ff, float *tmp)
{
	const float *h = c->h;
	int E = c->a->n_embd;
	for (int r = r0; r < r1; r++) {
		cpu_to_f32(G, (int64_t)r * E, E, tmp);
		for (int i = 0; i < n_ts; i++) {
			int ts_i = ts ? ts[i] : i;
			act[(size_t)ts_i * n_ff + r] = cpu_dot(tmp, h + (size_t)(ts_i / tsdiv) * E, E);
		}
		cpu_to_f32(U, (int64_t)r * E, E, tmp);
		for (int i = 0; i < n_ts; i++) {
			int ts_i = ts ? ts[i] : i;
			float *ap = &act[(size_t)ts_i * n_ff + r];
			*ap = cpu_silu(*ap) * cpu_dot(tmp, h + (size_t)(ts_i / tsdiv) * E, E);
		}
	}
}

static void moe_gate_up_task(void *p, int task, int tid)
{
	struct moe_ctx *c = p;
	const struct toast_moe_args *a = c->a;
	int id = c->tasks[task];
	float *tmp = c->cb->scratch[tid];
	if (id >= a->n_expert * ((a->n_ff + MOE_ROWS - 1) / MOE_ROWS)) { /* shared expert block */
		int blk = id - a->n_expert * ((a->n_ff + MOE_ROWS - 1) / MOE_ROWS);
		int r0 = blk * MOE_ROWS, r1 = r0 + MOE_ROWS < a->n_ff_sh ? r0 + MOE_ROWS : a->n_ff_sh;
		moe_gate_up(c, a->sh_gate, a->sh_up, r0, r1, NULL, a->T, 1, c->sact, a->n_ff_sh, tmp);
		return;
	}
	int nb = (a->n_ff + MOE_ROWS - 1) / MOE_ROWS;
	int e = id / nb, blk = id % nb;
	int r0 = blk * MOE_ROWS, r1 = r0 + MOE_ROWS < a->n_ff ? r0 + MOE_ROWS : a->n_ff;
	moe_gate_up(c, &a->gate->w[e], &a->up->w[e], r0, r1, c->order + c->start[e], c->start[e + 1] - c->start[e],
		    a->n_expert_used, c->act, a->n_ff, tmp);
}

static void moe_down_task(void *p, int task, int tid)
{
	struct moe_ctx *c = p;
	const struct toast_moe_args *a = c->a;
	int E = a->n_embd, k = a->n_expert_used, T = a->T;
	int r0 = task * MOE_ROWS, r1 = r0 + MOE_ROWS < E ? r0 + MOE_ROWS : E;
	float *tmp = c->cb->scratch[tid];
	float *y = tmp + (a->n_ff > a->n_ff_sh ? a->n_ff : a->n_ff_sh);
	for (int r = r0; r < r1; r++) {
		for (int t = 0; t < T; t++)
			y[t] = 0;
		for (int e = 0; e < a->n_expert; e++) {
			if (c->start[e + 1] == c->start[e])
				continue;
			cpu_to_f32(&a->down->w[e], (int64_t)r * a->n_ff, a->n_ff, tmp);
			for (int i = c->start[e]; i < c->start[e + 1]; i++) {
				int ts = c->order[i];
				y[ts / k] += c->wt[ts] * cpu_dot(tmp, c->act + (size_t)ts * a->n_ff, a->n_ff);
			}
		}
		if (a->sh_down) {
			cpu_to_f32(a->sh_down, (int64_t)r * a->n_ff_sh, a->n_ff_sh, tmp);
			for (int t = 0; t < T; t++)
				y[t] += c->sgate[t] * cpu_dot(tmp, c->sact + (size_t)t * a->n_ff_sh, a->n_ff_sh);
		}
		for (int t = 0; t < T; t++)
			a->x[(size_t)t * E + r] += y[t];
	}
}

/* softmax over n logits, then the k largest (ties: lower index), optionally renormalised */
static void moe_route(const float *logits, int n, int k, bool norm, int32_t *sel, float *wt, float *p)
{
	float mx = -INFINITY, sum = 0;
	for (int e = 0; e < n; e++)
		mx = logits[e] > mx ? logits[e] : mx;
	for (int e = 0; e < n; e++) {
		p[e] = expf(logits[e] - mx);
		sum += p[e];
	}
	for (int e = 0; e < n; e++)
		p[e] /= sum;
	float tot = 0;
	for (int j = 0; j < k; j++) {
		int best = -1;
		for (int e = 0; e < n; e++) {
			bool taken = false;
			for (int i = 0; i < j && !taken; i++)
				taken = sel[i] == e;
			if (!taken && (best < 0 || p[e] > p[best]))
				best = e;
		}
		sel[j] = best;
		wt[j] = p[best];
		tot += p[best];
	}
	if (norm)
		for (int j = 0; j < k; j++)
			wt[j] /= tot;
}

void cpu_moe(struct toast_backend *be, const struct toast_moe_args *a)
{
	struct cpu_backend *cb = cpu_of(be);
	int T = a->T, k = a->n_expert_used, ne = a->n_expert, E = a->n_embd;
	int nb = (a->n_ff + MOE_ROWS - 1) / MOE_ROWS, nbs = (a->n_ff_sh + MOE_ROWS - 1) / MOE_ROWS;
	size_t n_tk = (size_t)T * k;
	size_t need = (size_t)T * ne * 2 + n_tk * 3 + (size_t)ne + 1 + (size_t)ne * nb + (size_t)nbs +
		      n_tk * a->n_ff + (size_t)T * a->n_ff_sh + (size_t)T + (size_t)T * E;
	float *sh = cpu_shared(cb, need);
	size_t row = (size_t)(E > a->n_ff ? E : a->n_ff);
	row = row > (size_t)a->n_ff_sh ? row : (size_t)a->n_ff_sh;
	if (!sh || !cpu_scratch(cb, row + (size_t)T))
		return;
	struct moe_ctx c = {.cb = cb, .a = a};
	float *h = sh, *logits = h + (size_t)T * E, *prob = logits + (size_t)T * ne;
	cpu_norm_rows(a->x, a->norm_w, T, E, a->eps, a->plus_one, h, cb->scratch[0]);
	c.h = h;
	c.sel = (int32_t *)(prob + (size_t)T * ne);
	c.wt = (float *)(c.sel + n_tk);
	c.order = (int32_t *)(c.wt + n_tk);
	c.start = c.order + n_tk;
	c.tasks = c.start + ne + 1;
	c.act = (float *)(c.tasks + (size_t)ne * nb + nbs);
	c.sact = c.act + n_tk * a->n_ff;
	c.sgate = c.sact + (size_t)T * a->n_ff_sh;

	cpu_matvec_rows(cb, logits, TOAST_MM_F32, h, a->router, T);
	for (int t = 0; t < T; t++)
		moe_route(logits + (size_t)t * ne, ne, k, a->norm_topk, c.sel + (size_t)t * k, c.wt + (size_t)t * k,
			  prob + (size_t)t * ne);
	/* group token-slots by expert (counting sort keeps token order within an expert) */
	memset(c.start, 0, sizeof(int32_t) * (size_t)(ne + 1));
	for (size_t i = 0; i < n_tk; i++)
		c.start[c.sel[i] + 1]++;
	for (int e = 0; e < ne; e++)
		c.start[e + 1] += c.start[e];
	int32_t *fill = c.tasks; /* borrowed as cursors before the task table is built */
	for (int e = 0; e < ne; e++)
		fill[e] = c.start[e];
	for (size_t i = 0; i < n_tk; i++)
		c.order[fill[c.sel[i]]++] = (int32_t)i;
	int n_tasks = 0;
	for (int e = 0; e < ne; e++)
		if (c.start[e + 1] > c.start[e])
			for (int b = 0; b < nb; b++)
				c.tasks[n_tasks++] = e * nb + b;
	if (a->sh_gate) {
		for (int b = 0; b < nbs; b++)
			c.tasks[n_tasks++] = ne * nb + b;
		for (int t = 0; t < T; t++)
			c.sgate[t] = a->sh_gate_inp
					     ? cpu_sigmoid(cpu_dot_row(a->sh_gate_inp, 0, c.h + (size_t)t * E, cb->scratch[0]))
					     : 1.0f;
	}
	toast_pool_for(cb->pool, n_tasks, moe_gate_up_task, &c);
	toast_pool_for(cb->pool, (E + MOE_ROWS - 1) / MOE_ROWS, moe_down_task, &c);
}
