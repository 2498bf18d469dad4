/*
 * cpu.h - internals shared by the CPU backend's files.
 *
 * The CPU backend is the oracle: fp32 activations, fp32 accumulation, weights converted from
 * their stored type one row at a time (cpu_row_f32). Work is split over a thread pool; every
 * op is deterministic for a given thread count and summation order does not depend on timing.
 */
#ifndef TOAST_BACKEND_CPU_H
#define TOAST_BACKEND_CPU_H

#include <math.h>

#include "backend/backend.h"
#include "util/pool.h"

struct cpu_backend {
	struct toast_backend base;
	struct toast_pool *pool;
	int n_threads;
	/* per-thread scratch, grown (single-threaded, before a parallel loop) by cpu_scratch() */
	float **scratch;
	size_t scratch_n;
	/* shared scratch for an op, grown by cpu_shared() */
	float *shared;
	size_t shared_n;
	const int32_t *ids;
	int step_T, step_pos;
	/* picks (toast_backend_ops.pick), made at once: a ring of two; pick_bad: a call out of
	 * turn or a draw out of bounds, reported by the next pick_read */
	int32_t picks[2];
	int pick_next, pick_pending;
	bool pick_bad;
	bool oom; /* a scratch allocation failed: reported by sync() */
	void **owned; /* synthetic weights made by prepare_weight, freed with the backend */
	size_t n_owned;
};

static inline struct cpu_backend *cpu_of(struct toast_backend *be)
{
	return (struct cpu_backend *)be;
}

/* Make every thread's scratch at least n floats; false on allocation failure. */
bool cpu_scratch(struct cpu_backend *cb, size_t n);
/* A shared buffer of at least n floats (contents undefined), or NULL. */
float *cpu_shared(struct cpu_backend *cb, size_t n);

/* Convert n elements starting at element `off` of w's data to f32. */
void cpu_to_f32(const struct toast_weight *w, int64_t off, int64_t n, float *dst);
/* Dot product of row r of w with x (n_in floats). */
float cpu_dot_row(const struct toast_weight *w, int64_t r, const float *x, float *tmp);
float cpu_dot(const float *a, const float *b, int64_t n);

/* out[t] = RMSNorm(x[t]) with w (f32 rows of n); wtmp holds n floats */
void cpu_norm_rows(const float *x, const struct toast_weight *w, int T, int n, float eps, bool plus_one, float *out,
		   float *wtmp);

/* y[n_out] = W x for one input vector (threaded over rows); mode as in toast_mm_mode, f32 in/out. */
void cpu_matvec_rows(struct cpu_backend *cb, float *out, enum toast_mm_mode mode, const float *in,
		     const struct toast_weight *W, int T);

static inline float cpu_silu(float x)
{
	return x / (1.0f + expf(-x));
}

static inline float cpu_sigmoid(float x)
{
	return 1.0f / (1.0f + expf(-x));
}

void cpu_attention(struct toast_backend *be, const struct toast_attn_args *a);
void cpu_gdn(struct toast_backend *be, const struct toast_gdn_args *a);
void cpu_moe(struct toast_backend *be, const struct toast_moe_args *a);
void cpu_matmul(struct toast_backend *be, const struct toast_mm_in *in, const struct toast_mm_out *outs, int n_outs,
		int T);

#endif
