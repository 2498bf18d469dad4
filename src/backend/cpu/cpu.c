/*
 * cpu.c - the CPU backend: memory, conversions, the small elementwise ops, and the op table.
 * Larger ops live in cpu_matmul.c, cpu_attn.c, cpu_gdn.c, cpu_moe.c.
 */
#include "backend/cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

#include "format/quant.h"
#include "util/half.h"
#include "util/mem.h"

bool cpu_scratch(struct cpu_backend *cb, size_t n)
{
	if (n <= cb->scratch_n)
		return true;
	for (int t = 0; t < cb->n_threads; t++) {
		float *p = toast_aalloc(n * sizeof(float));
		if (!p) {
			cb->oom = true;
			return false;
		}
		toast_afree(cb->scratch[t]);
		cb->scratch[t] = p;
	}
	cb->scratch_n = n;
	return true;
}

float *cpu_shared(struct cpu_backend *cb, size_t n)
{
	if (n > cb->shared_n) {
		float *p = toast_aalloc(n * sizeof(float));
		if (!p) {
			cb->oom = true;
			return NULL;
		}
		toast_afree(cb->shared);
		cb->shared = p;
		cb->shared_n = n;
	}
	return cb->shared;
}

void cpu_to_f32(const struct toast_weight *w, int64_t off, int64_t n, float *dst)
{
	switch (w->type) {
	case TOAST_DT_F32:
		memcpy(dst, (const float *)w->data + off, (size_t)n * sizeof(float));
		break;
	case TOAST_DT_BF16: {
		const uint16_t *s = (const uint16_t *)w->data + off;
		for (int64_t i = 0; i < n; i++)
			dst[i] = toast_bf16_to_f32(s[i]);
		break;
	}
	case TOAST_DT_F16: {
		const uint16_t *s = (const uint16_t *)w->data + off;
		for (int64_t i = 0; i < n; i++)
			dst[i] = toast_f16_to_f32(s[i]);
		break;
	}
	case TOAST_DT_MLX4:
	case TOAST_DT_MLX8: { /* off and n are whole groups (n_in is a multiple of group_size) */
		int bits = w->type == TOAST_DT_MLX4 ? 4 : 8, gs = w->group_size;
		size_t sbs = (size_t)toast_dtypes[w->sb_type].type_size;
		toast_dequant_mlx(bits, gs, (const uint32_t *)w->data + off * bits / 32,
				  (const char *)w->scales + (size_t)(off / gs) * sbs,
				  (const char *)w->biases + (size_t)(off / gs) * sbs, w->sb_type, dst, n);
		break;
	}
	default:
		if (toast_dtype_is_quant(w->type)) { /* off and n are whole blocks (whole rows) */
			int blck = toast_dtypes[w->type].blck;
			toast_dequant(w->type, (const char *)w->data + (size_t)(off / blck) * toast_dtypes[w->type].type_size,
				      dst, n);
		} else { /* the loader only binds computable types */
			memset(dst, 0, (size_t)n * sizeof(float));
		}
		break;
	}
}

float cpu_dot(const float *a, const float *b, int64_t n)
{
	float acc[8] = {0};
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			acc[j] += a[i + j] * b[i + j];
	float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
	for (; i < n; i++)
		s += a[i] * b[i];
	return s;
}

float cpu_dot_row(const struct toast_weight *w, int64_t r, const float *x, float *tmp)
{
	if (w->type == TOAST_DT_F32)
		return cpu_dot((const float *)w->data + r * w->n_in, x, w->n_in);
	cpu_to_f32(w, r * w->n_in, w->n_in, tmp);
	return cpu_dot(tmp, x, w->n_in);
}

/* ---- memory ---- */

static void *cpu_alloc(struct toast_backend *be, size_t n)
{
	return toast_aalloc(n);
}

static void cpu_release(struct toast_backend *be, void *p)
{
	toast_afree(p);
}

static void *cpu_host_alloc(struct toast_backend *be, size_t n)
{
	return malloc(n ? n : 1);
}

static void cpu_host_release(struct toast_backend *be, void *p)
{
	free(p);
}

static size_t cpu_mem_free(struct toast_backend *be)
{
	return toast_mem_available();
}

static int cpu_top(struct toast_backend *be, const float *x, int n, int m, int32_t *ids, float *vals,
		   struct toast_error *err)
{
	return toast_top_host(x, n, m, ids, vals);
}

static void cpu_write(struct toast_backend *be, void *dst, const void *src, size_t n)
{
	memcpy(dst, src, n);
}

static enum toast_status cpu_read(struct toast_backend *be, void *dst, const void *src, size_t n,
				  struct toast_error *err)
{
	if (cpu_of(be)->oom)
		return toast_err_set(err, TOAST_ERR_NOMEM, "cpu backend: out of memory for scratch");
	memcpy(dst, src, n);
	return TOAST_OK;
}

static void cpu_copy(struct toast_backend *be, void *dst, const void *src, size_t n)
{
	memmove(dst, src, n);
}

static void cpu_zero(struct toast_backend *be, void *dst, size_t n)
{
	memset(dst, 0, n);
}

static enum toast_status cpu_sync(struct toast_backend *be, struct toast_error *err)
{
	if (cpu_of(be)->oom)
		return toast_err_set(err, TOAST_ERR_NOMEM, "cpu backend: out of memory for scratch");
	return TOAST_OK;
}

/* a synthetic weight: values per toast_synthetic_value() (BF16 matrices, F32 vectors) or bytes
 * per synth_quant.h (quantised types, as the binder chose) */
static enum toast_status cpu_prepare_weight(struct toast_backend *be, struct toast_weight *w,
					    struct toast_error *err)
{
	struct cpu_backend *cb = cpu_of(be);
	w->dev_type = w->type;
	if (w->data)
		return TOAST_OK;
	bool quant = toast_dtype_is_quant(w->type);
	size_t n = (size_t)w->n_in * (size_t)w->n_out, es = w->n_out == 1 ? 4 : 2;
	size_t bytes = quant ? w->n_bytes : n * es;
	void **owned = realloc(cb->owned, (cb->n_owned + 1) * sizeof(void *));
	void *p = owned ? toast_aalloc(bytes) : NULL;
	if (owned)
		cb->owned = owned;
	if (!p)
		return toast_err_set(err, TOAST_ERR_NOMEM, "%s: cannot allocate %zu bytes", w->name, bytes);
	cb->owned[cb->n_owned++] = p;
	uint64_t seed = toast_synthetic_seed(w->name);
	if (quant) {
		toast_synthetic_fill_quant(w, p);
		return TOAST_OK;
	}
	for (size_t i = 0; i < n; i++) {
		float v = toast_synthetic_value(seed, i, w->n_in, w->n_out);
		if (es == 4)
			((float *)p)[i] = v;
		else
			((uint16_t *)p)[i] = toast_f32_to_bf16(v);
	}
	w->type = w->dev_type = es == 4 ? TOAST_DT_F32 : TOAST_DT_BF16;
	w->data = p;
	w->n_bytes = n * es;
	return TOAST_OK;
}

static enum toast_status cpu_prepare_experts(struct toast_backend *be, struct toast_experts *x,
					     struct toast_error *err)
{
	enum toast_status rc = TOAST_OK;
	for (int e = 0; e < x->n_expert && rc == TOAST_OK; e++)
		rc = cpu_prepare_weight(be, &x->w[e], err);
	return rc;
}

static void cpu_begin_step(struct toast_backend *be, const int32_t *ids, int T, int pos)
{
	struct cpu_backend *cb = cpu_of(be);
	cb->ids = ids;
	cb->step_T = T;
	cb->step_pos = pos;
}

/* picks: the work is done at once, the ring only keeps the contract's order (the engine's
 * chained decoding runs on the CPU in tests, toast_backend.async_steps being false) */
static void cpu_pick(struct toast_backend *be, const float *x, int n, const struct toast_draw *d)
{
	struct cpu_backend *cb = cpu_of(be);
	if (cb->pick_pending == 2 || (d && (d->n_top < 0 || d->n_top > TOAST_TOP_MAX || d->n_recent > TOAST_TOP_MAX ||
					    (d->prev && cb->pick_pending == 0)))) {
		cb->pick_bad = true;
		return;
	}
	int32_t id = toast_pick_host(x, n, d, cb->picks[cb->pick_next ^ 1]); /* (prev: the last queued) */
	if (id < 0) {
		cb->pick_bad = true;
		return;
	}
	cb->picks[cb->pick_next] = id;
	cb->pick_next ^= 1;
	cb->pick_pending++;
}

static void cpu_begin_step_pick(struct toast_backend *be, int pos)
{
	struct cpu_backend *cb = cpu_of(be);
	cb->pick_bad |= cb->pick_pending == 0;
	cpu_begin_step(be, &cb->picks[cb->pick_next ^ 1], 1, pos);
}

static int32_t cpu_pick_read(struct toast_backend *be, struct toast_error *err)
{
	struct cpu_backend *cb = cpu_of(be);
	if (cb->pick_bad || cb->pick_pending == 0) {
		toast_err_set(err, TOAST_ERR_BACKEND,
			      "cpu backend: picks used out of turn, a draw over more than %d logits, or no memory for one",
			      TOAST_TOP_MAX);
		return -1;
	}
	return cb->picks[(cb->pick_next + cb->pick_pending--) & 1];
}

/* ---- small ops ---- */

static void cpu_embed(struct toast_backend *be, float *x, const struct toast_weight *W, int T)
{
	const int32_t *ids = cpu_of(be)->ids;
	for (int t = 0; t < T; t++)
		cpu_to_f32(W, (int64_t)ids[t] * W->n_in, W->n_in, x + (size_t)t * W->n_in);
}

void cpu_norm_rows(const float *x, const struct toast_weight *w, int T, int n, float eps, bool plus_one, float *out,
		   float *wtmp)
{
	cpu_to_f32(w, 0, n, wtmp);
	for (int t = 0; t < T; t++) {
		const float *xr = x + (size_t)t * n;
		float *o = out + (size_t)t * n;
		double ss = 0;
		for (int i = 0; i < n; i++)
			ss += (double)xr[i] * xr[i];
		float r = 1.0f / sqrtf((float)(ss / n) + eps);
		for (int i = 0; i < n; i++)
			o[i] = xr[i] * r * (plus_one ? 1.0f + wtmp[i] : wtmp[i]);
	}
}

static void cpu_free(struct toast_backend *be)
{
	struct cpu_backend *cb = cpu_of(be);
	toast_pool_free(cb->pool);
	if (cb->scratch)
		for (int t = 0; t < cb->n_threads; t++)
			toast_afree(cb->scratch[t]);
	free(cb->scratch);
	toast_afree(cb->shared);
	for (size_t i = 0; i < cb->n_owned; i++)
		toast_afree(cb->owned[i]);
	free(cb->owned);
	free(cb);
}

static const struct toast_backend_ops cpu_ops = {
	.free = cpu_free,
	.alloc = cpu_alloc,
	.release = cpu_release,
	.write = cpu_write,
	.read = cpu_read,
	.copy = cpu_copy,
	.zero = cpu_zero,
	.sync = cpu_sync,
	.prepare_weight = cpu_prepare_weight,
	.prepare_experts = cpu_prepare_experts,
	.begin_step = cpu_begin_step,
	.embed = cpu_embed,
	.matmul = cpu_matmul,
	.attention = cpu_attention,
	.gdn = cpu_gdn,
	.moe = cpu_moe,
	.host_alloc = cpu_host_alloc,
	.host_release = cpu_host_release,
	.mem_free = cpu_mem_free,
	.top = cpu_top,
	.pick = cpu_pick,
	.begin_step_pick = cpu_begin_step_pick,
	.pick_read = cpu_pick_read,
};

enum toast_status toast_backend_cpu_new(int n_threads, struct toast_backend **out, struct toast_error *err)
{
	*out = NULL;
	struct cpu_backend *cb = calloc(1, sizeof(*cb));
	if (!cb)
		return toast_err_set(err, TOAST_ERR_NOMEM, "cpu backend: out of memory");
	cb->pool = toast_pool_new(n_threads);
	cb->n_threads = toast_pool_size(cb->pool);
	cb->scratch = calloc((size_t)cb->n_threads, sizeof(float *));
	if (!cb->pool || !cb->scratch) {
		toast_pool_free(cb->pool);
		free(cb->scratch);
		free(cb);
		return toast_err_set(err, TOAST_ERR_NOMEM, "cpu backend: cannot start %d threads", n_threads);
	}
	cb->base.ops = &cpu_ops;
	cb->base.name = "cpu";
	cb->base.act_type = TOAST_DT_F32;
	cb->base.act_size = sizeof(float);
	cb->base.impl = cb;
	*out = &cb->base;
	return TOAST_OK;
}

void toast_backend_free(struct toast_backend *be)
{
	if (be)
		be->ops->free(be);
}
