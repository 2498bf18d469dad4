/*
 * cpu_matmul.c - out[T][n_out] = in[T][n_in] · Wᵀ on the CPU (or SiLU(in · Wᵀ) * (in · W2ᵀ)), split
 * over blocks of weight rows.
 * Each weight row is converted to f32 once per call and reused for all T inputs, so prefill
 * chunks read the weights once.
 */
#include "backend/cpu/cpu.h"

#include <string.h>

#define MM_ROWS_PER_TASK 16

struct mm_ctx {
	struct cpu_backend *cb;
	float *out;
	enum toast_mm_mode mode;
	const float *in;
	const struct toast_weight *W, *W2;
	int T;
};

/* row r of W in f32: in place when W is f32, else converted into buf */
static const float *mm_row(const struct toast_weight *W, int64_t r, float *buf)
{
	if (W->type == TOAST_DT_F32)
		return (const float *)W->data + r * W->n_in;
	cpu_to_f32(W, r * W->n_in, W->n_in, buf);
	return buf;
}

static void mm_task(void *p, int task, int tid)
{
	struct mm_ctx *c = p;
	const struct toast_weight *W = c->W;
	int64_t r0 = (int64_t)task * MM_ROWS_PER_TASK;
	int64_t r1 = r0 + MM_ROWS_PER_TASK < W->n_out ? r0 + MM_ROWS_PER_TASK : W->n_out;
	float *row = c->cb->scratch[tid];
	for (int64_t r = r0; r < r1; r++) {
		const float *wr = mm_row(W, r, row), *ur = c->W2 ? mm_row(c->W2, r, row + W->n_in) : NULL;
		for (int t = 0; t < c->T; t++) {
			const float *x = c->in + (size_t)t * W->n_in;
			float v = cpu_dot(wr, x, W->n_in);
			float *o = c->out + (size_t)t * W->n_out + r;
			if (c->mode == TOAST_MM_ADD)
				*o += v;
			else if (c->mode == TOAST_MM_GLU)
				*o = cpu_silu(v) * cpu_dot(ur, x, W->n_in);
			else
				*o = v;
		}
	}
}

static void mm_rows(struct cpu_backend *cb, float *out, enum toast_mm_mode mode, const float *in,
		    const struct toast_weight *W, const struct toast_weight *W2, int T)
{
	if (!cpu_scratch(cb, (size_t)W->n_in * (W2 ? 2 : 1)))
		return;
	struct mm_ctx c = {cb, out, mode, in, W, W2, T};
	int n_tasks = (int)((W->n_out + MM_ROWS_PER_TASK - 1) / MM_ROWS_PER_TASK);
	toast_pool_for(cb->pool, n_tasks, mm_task, &c);
}

void cpu_matvec_rows(struct cpu_backend *cb, float *out, enum toast_mm_mode mode, const float *in,
		     const struct toast_weight *W, int T)
{
	mm_rows(cb, out, mode, in, W, NULL, T);
}

void cpu_matmul(struct toast_backend *be, const struct toast_mm_in *in, const struct toast_mm_out *outs, int n_outs,
		int T)
{
	struct cpu_backend *cb = cpu_of(be);
	const float *x = in->act ? in->act : in->xf;
	if (!x) {
		int64_t n = outs[0].W->n_in;
		float *y = cpu_shared(cb, (size_t)T * n);
		if (!y || !cpu_scratch(cb, (size_t)n))
			return;
		cpu_norm_rows(in->norm_x, in->norm_w, T, (int)n, in->eps, in->plus_one, y, cb->scratch[0]);
		if (in->norm_out)
			memcpy(in->norm_out, y, (size_t)T * n * sizeof(float));
		x = y;
	}
	for (int i = 0; i < n_outs; i++)
		mm_rows(cb, outs[i].out, outs[i].mode, x, outs[i].W, outs[i].mode == TOAST_MM_GLU ? outs[i].W2 : NULL, T);
}
