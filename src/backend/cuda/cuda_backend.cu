/*
 * cuda_backend.cu - the CUDA backend: device selection, memory, weight upload, steps, the
 * recording and replay of decode steps as CUDA graphs, and the op table. Kernels live in the
 * k_*.cu files, one op family each.
 *
 * Weights on the device: matrices (n_out > 1) as bf16 (f16/f32 sources are converted once at
 * upload) or packed in their quantised type (layout in cu_quant.cuh), vectors (n_out == 1) as
 * f32 (quantised ones dequantised at upload). Expert sets are packed into one buffer whose base
 * is toast_experts.dev, expert e at e * cu_wd_experts().stride.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cu_quant.cuh"

extern "C" {
#include "format/quant.h"
#include "util/half.h"
}

bool cu_fail(struct cuda_backend *cb, cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return false;
	if (!cb->failed) {
		cb->failed = true;
		snprintf(cb->fail_msg, sizeof(cb->fail_msg), "cuda: %s: %s", what, cudaGetErrorString(e));
	}
	return true;
}

void cu_fail_msg(struct cuda_backend *cb, const char *fmt, ...)
{
	if (cb->failed)
		return;
	cb->failed = true;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cb->fail_msg, sizeof(cb->fail_msg), fmt, ap);
	va_end(ap);
}

/* fold the events recorded since the last sync into the per-kernel table */
static void cu_prof_flush(struct cuda_backend *cb)
{
	for (int i = 1; i < cb->prof_n; i++) {
		float ms = 0;
		cudaEventElapsedTime(&ms, cb->prof_ev[i - 1], cb->prof_ev[i]);
		int r = 0;
		while (r < cb->prof_rows_n && strcmp(cb->prof_rows[r].op, cb->prof_op[i]) != 0)
			r++;
		if (r == cb->prof_rows_n && r < 64)
			cb->prof_rows[cb->prof_rows_n++] = {cb->prof_op[i], 0, 0};
		if (r < 64) {
			cb->prof_rows[r].ms += ms;
			cb->prof_rows[r].calls++;
		}
	}
	cb->prof_n = 0;
	cudaEventRecord(cb->prof_ev[cb->prof_n], cb->stream);
	cb->prof_op[cb->prof_n++] = "idle";
}

static void cu_prof_print(struct cuda_backend *cb)
{
	double tot = 0;
	for (int r = 0; r < cb->prof_rows_n; r++)
		tot += cb->prof_rows[r].ms;
	fprintf(stderr, "cuda profile (TOASTED_CUDA_PROFILE): kernel, calls, total ms, us/call, share\n");
	for (int r = 0; r < cb->prof_rows_n; r++) {
		const struct cuda_backend::cu_prof_row *p = &cb->prof_rows[r];
		fprintf(stderr, "  %-28s %8ld %10.3f %9.2f %5.1f%%\n", p->op, p->calls, p->ms, 1e3 * p->ms / p->calls,
			100 * p->ms / tot);
	}
}

void cu_launched(struct cuda_backend *cb, const char *op)
{
	if (cu_fail(cb, cudaGetLastError(), op))
		return;
	if (cb->prof && !cb->capturing) {
		if (cb->prof_n == 1024)
			cu_prof_flush(cb); /* waits: only in profiling runs */
		cudaEventRecord(cb->prof_ev[cb->prof_n], cb->stream);
		cb->prof_op[cb->prof_n++] = op;
	}
	if (cb->debug_sync && !cb->capturing)
		cu_fail(cb, cudaStreamSynchronize(cb->stream), op);
}

/* Recorded steps hold pointers to the scratch and step buffers: drop them when those move. */
static void cu_forget_graphs(struct cuda_backend *cb)
{
	for (int i = 0; i < CU_MAX_GRAPHS; i++) {
		if (cb->graphs[i].exec)
			cudaGraphExecDestroy(cb->graphs[i].exec);
		cb->graphs[i].exec = NULL;
		cb->graphs[i].key = 0;
	}
}

size_t cu_allow_smem(struct cuda_backend *cb, const void *func)
{
	struct cudaFuncAttributes fa;
	if (cu_fail(cb, cudaFuncGetAttributes(&fa, func), "kernel attributes"))
		return 0;
	size_t room = cb->smem_optin > fa.sharedSizeBytes ? cb->smem_optin - fa.sharedSizeBytes : 0;
	if (cu_fail(cb, cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)room),
		    "shared memory limit"))
		return 0;
	return room;
}

static void *cu_grow(struct cuda_backend *cb, void **buf, size_t *bytes, size_t n)
{
	if (n <= *bytes)
		return *buf;
	if (cb->capturing) {
		cu_fail(cb, cudaErrorStreamCaptureUnsupported, "scratch growth while recording a step");
		return NULL;
	}
	size_t want = n + n / 4;
	cudaStreamSynchronize(cb->stream);
	cu_forget_graphs(cb);
	cudaFree(*buf);
	*buf = NULL;
	*bytes = 0;
	if (cu_fail(cb, cudaMalloc(buf, want), "scratch allocation"))
		return NULL;
	*bytes = want;
	return *buf;
}

void *cu_scratch(struct cuda_backend *cb, size_t n)
{
	return cu_grow(cb, &cb->scratch, &cb->scratch_bytes, n);
}

void *cu_scratch2(struct cuda_backend *cb, size_t n)
{
	return cu_grow(cb, &cb->scratch2, &cb->scratch2_bytes, n);
}

void *cu_scratch3(struct cuda_backend *cb, size_t n)
{
	return cu_grow(cb, &cb->scratch3, &cb->scratch3_bytes, n);
}

/* ---- memory ---- */

static void *cuda_alloc(struct toast_backend *be, size_t n)
{
	void *p = NULL;
	if (cudaMalloc(&p, n ? n : 1) != cudaSuccess) {
		cudaGetLastError(); /* out of memory is reported to the caller, not sticky */
		return NULL;
	}
	/* on the backend's stream: a legacy-stream memset could land after a later kernel's writes */
	if (cudaMemsetAsync(p, 0, n, cu_of(be)->stream) != cudaSuccess) {
		cudaFree(p);
		return NULL;
	}
	return p;
}

static void cuda_release(struct toast_backend *be, void *p)
{
	if (p)
		cudaFree(p);
}

static void *cuda_host_alloc(struct toast_backend *be, size_t n)
{
	void *p = NULL;
	if (cudaHostAlloc(&p, n ? n : 1, cudaHostAllocDefault) != cudaSuccess) {
		cudaGetLastError(); /* out of pinned memory is reported to the caller, not sticky */
		return NULL;
	}
	return p;
}

static void cuda_host_release(struct toast_backend *be, void *p)
{
	if (p)
		cudaFreeHost(p);
}

static size_t cuda_mem_free(struct toast_backend *be)
{
	size_t fr = 0, tot = 0;
	if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	return fr;
}

static void cuda_write(struct toast_backend *be, void *dst, const void *src, size_t n)
{
	struct cuda_backend *cb = cu_of(be);
	if (!cb->failed)
		cu_fail(cb, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, cb->stream), "write");
	if (!cb->failed)
		cu_fail(cb, cudaStreamSynchronize(cb->stream), "write");
}

static enum toast_status cuda_status(struct toast_backend *be, struct toast_error *err)
{
	struct cuda_backend *cb = cu_of(be);
	if (cb->failed)
		return toast_err_set(err, TOAST_ERR_BACKEND, "%s (the CUDA context is unusable: reopen the engine)",
				     cb->fail_msg);
	return TOAST_OK;
}

static enum toast_status cuda_sync(struct toast_backend *be, struct toast_error *err)
{
	struct cuda_backend *cb = cu_of(be);
	if (!cb->failed)
		cu_fail(cb, cudaStreamSynchronize(cb->stream), "sync");
	enum toast_status rc = cuda_status(be, err);
	if (rc == TOAST_OK && cb->prof)
		cu_prof_flush(cb);
	return rc;
}

static enum toast_status cuda_read(struct toast_backend *be, void *dst, const void *src, size_t n,
				   struct toast_error *err)
{
	struct cuda_backend *cb = cu_of(be);
	if (!cb->failed)
		cu_fail(cb, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, cb->stream), "read");
	return cuda_sync(be, err);
}

static void cuda_copy(struct toast_backend *be, void *dst, const void *src, size_t n)
{
	struct cuda_backend *cb = cu_of(be);
	if (!cb->failed)
		cu_fail(cb, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, cb->stream), "copy");
}

static void cuda_copy_many(struct toast_backend *be, void *const *dst, const void *const *src, const size_t *n_bytes,
			   int n)
{
	struct cuda_backend *cb = cu_of(be);
	if (!cb->failed)
		cu_copy_many(cb, dst, src, n_bytes, n);
}

static void cuda_zero(struct toast_backend *be, void *dst, size_t n)
{
	struct cuda_backend *cb = cu_of(be);
	if (!cb->failed)
		cu_fail(cb, cudaMemsetAsync(dst, 0, n, cb->stream), "zero");
}

/* ---- weights ---- */

static enum toast_status cu_own(struct cuda_backend *cb, size_t n, void **out, const char *name,
				struct toast_error *err)
{
	if (cb->n_owned == cb->cap_owned) {
		size_t cap = cb->cap_owned ? cb->cap_owned * 2 : 256;
		void **p = (void **)realloc(cb->owned, cap * sizeof(void *));
		if (!p)
			return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
		cb->owned = p;
		cb->cap_owned = cap;
	}
	if (cudaMalloc(out, n ? n : 1) != cudaSuccess) {
		cudaGetLastError();
		size_t fr = 0, tot = 0;
		cudaMemGetInfo(&fr, &tot);
		return toast_err_set(err, TOAST_ERR_NOMEM, "%s: cannot allocate %zu MB on the GPU (%zu MB free of %zu)",
				     name, n >> 20, fr >> 20, tot >> 20);
	}
	cb->owned[cb->n_owned++] = *out;
	return TOAST_OK;
}

#define CU_STAGE_BYTES ((size_t)32 << 20) /* a pinned upload slot's */

/* memcpy by up to `threads` threads: what bounds a weight upload on one core is reading the
 * mapped file (its page faults, the page cache) */
struct cu_part {
	char *dst;
	const char *src;
	size_t n;
};

static void *cu_part_copy(void *arg)
{
	struct cu_part *c = (struct cu_part *)arg;
	memcpy(c->dst, c->src, c->n);
	return NULL;
}

static void cu_memcpy_par(void *dst, const void *src, size_t n, int threads)
{
	enum { MAX_T = 16 };
	int t = n < ((size_t)4 << 20) ? 1 : threads < MAX_T ? threads : MAX_T;
	size_t per = (n / t + 4095) & ~(size_t)4095;
	struct cu_part part[MAX_T];
	pthread_t th[MAX_T];
	bool started[MAX_T] = {false};
	for (int i = 0; i < t; i++) {
		size_t at = per * i < n ? per * i : n;
		part[i] = (struct cu_part){(char *)dst + at, (const char *)src + at, n - at < per ? n - at : per};
	}
	for (int i = 1; i < t; i++)
		if (part[i].n && !(started[i] = pthread_create(&th[i], NULL, cu_part_copy, &part[i]) == 0))
			cu_part_copy(&part[i]);
	cu_part_copy(&part[0]);
	for (int i = 1; i < t; i++)
		if (started[i])
			pthread_join(th[i], NULL);
}

static void cu_stage_free(struct cuda_backend *cb)
{
	for (int i = 0; i < 2; i++) {
		if (cb->stage_done[i])
			cudaEventSynchronize(cb->stage_done[i]), cudaEventDestroy(cb->stage_done[i]);
		cudaFreeHost(cb->stage[i]); /* (NULL: nothing) */
		cb->stage[i] = NULL;
		cb->stage_done[i] = NULL;
	}
}

static bool cu_stage_init(struct cuda_backend *cb)
{
	for (int i = 0; i < 2; i++)
		if (cudaMallocHost(&cb->stage[i], CU_STAGE_BYTES) != cudaSuccess ||
		    cudaEventCreateWithFlags(&cb->stage_done[i], cudaEventDisableTiming) != cudaSuccess) {
			cudaGetLastError();
			cu_stage_free(cb);
			return false;
		}
	long c = sysconf(_SC_NPROCESSORS_ONLN);
	cb->copy_threads = c < 4 ? 1 : c > 32 ? 16 : (int)(c / 2);
	return true;
}

/* n bytes from host memory to dst, ordered on the backend's stream (a plain cudaMemcpy runs on
 * the legacy stream, which the non-blocking stream does not wait for). src is copied before this
 * returns (it may be freed at once): into a pinned slot whose copy to the device then runs while
 * the next upload fills the other slot, or, where pinned memory is short, by the driver's own
 * staging of pageable memory. */
bool cu_copy_in(struct cuda_backend *cb, void *dst, const void *src, size_t n)
{
	if (!cb->stage[0] && !cu_stage_init(cb))
		return cu_fail(cb, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, cb->stream), "weight upload");
	for (size_t at = 0; at < n; at += CU_STAGE_BYTES) {
		size_t k = n - at < CU_STAGE_BYTES ? n - at : CU_STAGE_BYTES;
		int s = cb->stage_next;
		cb->stage_next ^= 1;
		if (cu_fail(cb, cudaEventSynchronize(cb->stage_done[s]), "weight upload"))
			return true;
		cu_memcpy_par(cb->stage[s], (const char *)src + at, k, cb->copy_threads);
		if (cu_fail(cb, cudaMemcpyAsync((char *)dst + at, cb->stage[s], k, cudaMemcpyHostToDevice, cb->stream),
			    "weight upload") ||
		    cu_fail(cb, cudaEventRecord(cb->stage_done[s], cb->stream), "weight upload"))
			return true;
	}
	return false;
}

/* Upload host weight data (F32, F16 or BF16) into dst as dst_type (BF16 or F32). */
static enum toast_status cu_upload(struct cuda_backend *cb, void *dst, enum toast_dtype dst_type,
				   const struct toast_weight *w, struct toast_error *err)
{
	size_t n = (size_t)w->n_in * (size_t)w->n_out;
	if (w->type == dst_type)
		return cu_copy_in(cb, dst, w->data, w->n_bytes)
			       ? toast_err_set(err, TOAST_ERR_BACKEND, "%s: %s", w->name, cb->fail_msg)
			       : TOAST_OK;
	size_t es = dst_type == TOAST_DT_F32 ? 4 : 2;
	void *tmp = malloc(n * es);
	if (!tmp)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory converting %s", w->name);
	for (size_t i = 0; i < n; i++) {
		float v = w->type == TOAST_DT_F32   ? ((const float *)w->data)[i]
			  : w->type == TOAST_DT_F16 ? toast_f16_to_f32(((const uint16_t *)w->data)[i])
						    : toast_bf16_to_f32(((const uint16_t *)w->data)[i]);
		if (es == 4)
			((float *)tmp)[i] = v;
		else
			((uint16_t *)tmp)[i] = toast_f32_to_bf16(v);
	}
	bool bad = cu_copy_in(cb, dst, tmp, n * es);
	free(tmp);
	return bad ? toast_err_set(err, TOAST_ERR_BACKEND, "%s: %s", w->name, cb->fail_msg) : TOAST_OK;
}

/* matrices: bf16, or a quantised type kept packed (cu_quant.cuh); vectors: f32 */
static enum toast_dtype cu_dev_type(const struct toast_weight *w)
{
	return w->n_out == 1 ? TOAST_DT_F32 : toast_dtype_is_quant(w->type) ? w->type : TOAST_DT_BF16;
}

static enum toast_status cu_check_type(const struct toast_weight *w, struct toast_error *err)
{
	bool ok = w->type == TOAST_DT_F32 || w->type == TOAST_DT_F16 || w->type == TOAST_DT_BF16 ||
		  toast_dtype_is_quant(w->type);
	/* an MLX chunk (16 bytes of codes) must lie in one group */
	if (ok && cu_is_mlx(w->type))
		ok = (w->sb_type == TOAST_DT_BF16 || w->sb_type == TOAST_DT_F16 || w->sb_type == TOAST_DT_F32) &&
		     w->group_size >= 32 && w->group_size % 32 == 0 && w->n_in % w->group_size == 0;
	if (!ok)
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED,
				     "%s: weights of type %s%s are not supported by the CUDA backend", w->name,
				     toast_dtype_name(w->type), cu_is_mlx(w->type) ? " with these scales or this group size" : "");
	/* the contract's whole blocks a row (a partial one launched a split of no bytes, whose error
	 * left the backend failed for good) */
	size_t row;
	if (w->n_in <= 0 || w->n_out <= 0 || !toast_dtype_bytes(w->type, w->n_in, &row))
		return toast_err_set(err, TOAST_ERR_FORMAT, "%s: %lld x %lld %s weights are not whole blocks of %d a row",
				     w->name, (long long)w->n_out, (long long)w->n_in, toast_dtype_name(w->type),
				     toast_dtypes[w->type].blck);
	return TOAST_OK;
}

/* a quantised vector (an MLX shared-expert gate, say) becomes f32 like every vector */
static enum toast_status cu_upload_qvector(struct cuda_backend *cb, void *dst, const struct toast_weight *w,
					   struct toast_error *err)
{
	float *tmp = (float *)malloc((size_t)w->n_in * sizeof(float));
	if (!tmp)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory converting %s", w->name);
	if (cu_is_mlx(w->type))
		toast_dequant_mlx(w->type == TOAST_DT_MLX4 ? 4 : 8, w->group_size, (const uint32_t *)w->data, w->scales,
				  w->biases, w->sb_type, tmp, w->n_in);
	else
		toast_dequant(w->type, w->data, tmp, w->n_in);
	bool bad = cu_copy_in(cb, dst, tmp, (size_t)w->n_in * sizeof(float));
	free(tmp);
	return bad ? toast_err_set(err, TOAST_ERR_BACKEND, "%s: %s", w->name, cb->fail_msg) : TOAST_OK;
}

/* w (its dev_type set) into dst laid out as l: uploaded, converted or made synthetic */
static enum toast_status cu_prepare_into(struct cuda_backend *cb, struct toast_weight *w, void *dst, const cu_layout &l,
					 struct toast_error *err)
{
	bool quant = toast_dtype_is_quant(w->dev_type);
	w->dev = dst;
	if (!w->data) {
		if (quant)
			cu_q_fill_synthetic(cb, dst, w, l);
		else
			cu_fill_synthetic(cb, dst, w->dev_type, (size_t)w->n_in * (size_t)w->n_out,
					  toast_synthetic_seed(w->name), w->n_in, w->n_out);
		return cb->failed ? toast_err_set(err, TOAST_ERR_BACKEND, "%s: %s", w->name, cb->fail_msg) : TOAST_OK;
	}
	if (quant)
		return cu_q_upload(cb, dst, 0, w, 1, l, err);
	if (toast_dtype_is_quant(w->type))
		return cu_upload_qvector(cb, dst, w, err);
	return cu_upload(cb, dst, w->dev_type, w, err);
}

static cu_layout cu_layout_weight(const struct toast_weight *w)
{
	return cu_layout_of(w->dev_type, w->n_in, w->n_out, w->sb_type, w->group_size);
}

static enum toast_status cuda_prepare_weight(struct toast_backend *be, struct toast_weight *w,
					     struct toast_error *err)
{
	struct cuda_backend *cb = cu_of(be);
	enum toast_status rc = cu_check_type(w, err);
	if (rc != TOAST_OK)
		return rc;
	w->dev_type = cu_dev_type(w);
	cu_layout l = cu_layout_weight(w);
	void *d = NULL;
	rc = cu_own(cb, l.bytes, &d, w->name, err);
	if (rc == TOAST_OK)
		rc = cu_prepare_into(cb, w, d, l, err);
	return rc == TOAST_OK ? cuda_sync(be, err) : rc;
}

static enum toast_status cuda_prepare_experts(struct toast_backend *be, struct toast_experts *x,
					      struct toast_error *err)
{
	struct cuda_backend *cb = cu_of(be);
	if (x->n_expert <= 0)
		return TOAST_OK;
	struct toast_weight *w0 = &x->w[0];
	enum toast_status rc = cu_check_type(w0, err);
	if (rc != TOAST_OK)
		return rc;
	/* as matrices even with one row: the kernels read experts as matrices */
	w0->dev_type = toast_dtype_is_quant(w0->type) ? w0->type : TOAST_DT_BF16;
	cu_layout l = cu_layout_weight(w0);
	size_t stride = cu_align256(l.bytes);
	void *d = NULL;
	rc = cu_own(cb, stride * (size_t)x->n_expert, &d, w0->name, err);
	x->dev = d;
	for (int e = 0; rc == TOAST_OK && e < x->n_expert; e++) {
		struct toast_weight *w = &x->w[e];
		if (w->n_in != w0->n_in || w->n_out != w0->n_out || w->type != w0->type ||
		    (cu_is_mlx(w->type) && (w->sb_type != w0->sb_type || w->group_size != w0->group_size)))
			return toast_err_set(err, TOAST_ERR_FORMAT, "%s: experts of different shapes or types", w->name);
		w->dev_type = w0->dev_type;
		w->dev = (char *)d + stride * (size_t)e;
	}
	/* quantised experts whose bytes lie one after another (a GGUF or MLX tensor of them) go up
	 * many at a time; any others one by one */
	bool quant = toast_dtype_is_quant(w0->dev_type);
	for (int e = 0, run; rc == TOAST_OK && e < x->n_expert; e += run) {
		struct toast_weight *w = &x->w[e];
		run = 1;
		while (quant && w->data && e + run < x->n_expert && cu_q_follows(&w[run - 1], &w[run], l))
			run++;
		rc = run > 1 ? cu_q_upload(cb, w->dev, stride, w, run, l, err) : cu_prepare_into(cb, w, w->dev, l, err);
	}
	return rc == TOAST_OK ? cuda_sync(be, err) : rc;
}

/* ---- steps and recorded steps ---- */

static void cuda_begin_step(struct toast_backend *be, const int32_t *ids, int T, int pos)
{
	struct cuda_backend *cb = cu_of(be);
	if (cb->failed)
		return;
	if (T > cb->step_cap) {
		cudaStreamSynchronize(cb->stream);
		cu_forget_graphs(cb);
		cudaFreeHost(cb->h_step);
		cudaFree(cb->d_step);
		cb->h_step = NULL;
		cb->d_step = NULL;
		cb->step_cap = 0;
		int cap = T < 64 ? 64 : T;
		if (cu_fail(cb, cudaMallocHost(&cb->h_step, (size_t)(cap + 2) * 4), "step buffer") ||
		    cu_fail(cb, cudaMalloc(&cb->d_step, (size_t)(cap + 2) * 4), "step buffer"))
			return;
		cb->step_cap = cap;
	}
	/* the previous step's copy may still read h_step */
	cu_fail(cb, cudaEventSynchronize(cb->step_copied), "step event");
	cb->h_step[0] = pos;
	cb->h_step[1] = T;
	memcpy(cb->h_step + 2, ids, (size_t)T * 4);
	cu_fail(cb, cudaMemcpyAsync(cb->d_step, cb->h_step, (size_t)(T + 2) * 4, cudaMemcpyHostToDevice, cb->stream),
		"step upload");
	cu_fail(cb, cudaEventRecord(cb->step_copied, cb->stream), "step event");
	cb->step_T = T;
	cb->step_pos = pos;
}

/* picks on the device (toast_backend_ops.pick): slot pick_next is written next, the oldest
 * pending is pick_pending slots before it */
static void cuda_pick(struct toast_backend *be, const float *x, int n, const struct toast_draw *d)
{
	struct cuda_backend *cb = cu_of(be);
	if (cb->failed)
		return;
	if (cb->pick_pending == 2) {
		cu_fail_msg(cb, "pick: two picks are pending already");
		return;
	}
	/* the step it makes follows the last one begun (whose logits x are, as the engine uses it) */
	int sl = cb->pick_next;
	cb->pick_pos[sl] = cb->d_step ? cb->step_pos + cb->step_T : -1;
	if (d && d->prev && cb->pick_pending == 0) {
		cu_fail_msg(cb, "pick: a draw counting the pending pick, and none is pending");
		return;
	}
	cu_pick(cb, x, n, d, sl, cb->pick_pos[sl]);
	cu_fail(cb, cudaEventRecord(cb->pick_done[sl], cb->stream), "pick event");
	cb->pick_next = sl ^ 1;
	cb->pick_pending++;
}

/* the step's {pos, 1, token} are on the device already, where the last pick left them */
static void cuda_begin_step_pick(struct toast_backend *be, int pos)
{
	struct cuda_backend *cb = cu_of(be);
	if (!cb->failed && (cb->pick_pending == 0 || cb->pick_pos[cb->pick_next ^ 1] != pos))
		cu_fail_msg(cb, "begin_step_pick: no pick of the logits before position %d is queued", pos);
	cb->step_T = 1;
	cb->step_pos = pos;
}

static int32_t cuda_pick_read(struct toast_backend *be, struct toast_error *err)
{
	struct cuda_backend *cb = cu_of(be);
	int sl = (cb->pick_next + cb->pick_pending) & 1; /* the oldest: pick_next - pending, mod 2 */
	if (!cb->failed && cb->pick_pending == 0)
		cu_fail_msg(cb, "pick_read: no pick pending");
	if (!cb->failed)
		cu_fail(cb, cudaEventSynchronize(cb->pick_done[sl]), "pick read");
	if (cb->failed) {
		toast_err_set(err, TOAST_ERR_BACKEND, "%s", cb->fail_msg);
		return -1;
	}
	cb->pick_pending--;
	return cu_key_id(((volatile unsigned long long *)cb->h_pick)[sl]);
}

#ifdef TOAST_TIMELINE
#define CU_TL_CAP ((size_t)CU_TL_GRIDS * CU_TL_BLOCKS)
extern "C" {
void cu_tl_set_k_attn(void *);
void cu_tl_set_k_gdn(void *);
void cu_tl_set_k_matmul(void *);
void cu_tl_set_k_moe(void *);
}

static void cu_tl_init(struct cuda_backend *cb)
{
	const char *path = getenv("TOASTED_TIMELINE"), *step = getenv("TOASTED_TIMELINE_STEP");
	size_t bytes = sizeof(struct cu_tl) + CU_TL_CAP * sizeof(struct cu_tl_rec);
	if (!path || cudaMalloc(&cb->tl, bytes) != cudaSuccess || cudaMemset(cb->tl, 0, bytes) != cudaSuccess)
		return;
	cu_tl_set_k_attn(cb->tl), cu_tl_set_k_gdn(cb->tl), cu_tl_set_k_matmul(cb->tl), cu_tl_set_k_moe(cb->tl);
	cb->tl_path = path;
	cb->tl_step = step ? atol(step) : 16;
}

static void cu_tl_dump(struct cuda_backend *cb)
{
	if (!cb->tl)
		return;
	cudaDeviceSynchronize();
	struct cu_tl_rec *r = (struct cu_tl_rec *)malloc(CU_TL_CAP * sizeof(*r));
	FILE *f = fopen(cb->tl_path, "w");
	size_t n = 0;
	if (r && f && cudaMemcpy(r, cb->tl->r, CU_TL_CAP * sizeof(*r), cudaMemcpyDeviceToHost) == cudaSuccess) {
		fprintf(f, "grid,block,smid,t_in,t_out,mark0,mark1,mark2,mark3\n");
		for (size_t i = 0; i < CU_TL_CAP; i++)
			if (r[i].t_in)
				n++, fprintf(f, "%llu,%u,%u,%llu,%llu,%llu,%llu,%llu,%llu\n", r[i].grid, r[i].block, r[i].smid,
					     r[i].t_in, r[i].t_out, r[i].mark[0], r[i].mark[1], r[i].mark[2], r[i].mark[3]);
	}
	fprintf(stderr, "timeline: %zu block records of replay %ld in %s\n", n, cb->tl_step, cb->tl_path);
	if (f)
		fclose(f);
	free(r);
	cudaFree(cb->tl);
}
#endif

static bool cuda_graph_begin(struct toast_backend *be, uint64_t key)
{
	struct cuda_backend *cb = cu_of(be);
	if (cb->failed)
		return true; /* nothing will run: sync reports the error */
	if (cb->prof)
		return false; /* profiling times each kernel: no recording */
	struct cu_graph *slot = NULL, *lru = &cb->graphs[0];
	for (int i = 0; i < CU_MAX_GRAPHS; i++) {
		if (cb->graphs[i].key == key)
			slot = &cb->graphs[i];
		if (cb->graphs[i].last_use < lru->last_use)
			lru = &cb->graphs[i];
	}
	cb->graph_clock++;
	if (slot && slot->exec) {
		slot->last_use = cb->graph_clock;
#ifdef TOAST_TIMELINE
		bool note = cb->tl && ++cb->tl_replays == cb->tl_step;
		if (note) /* the blocks of this replay take notes */
			cudaMemsetAsync(&cb->tl->on, 0xff, sizeof(unsigned), cb->stream);
#endif
		cu_fail(cb, cudaGraphLaunch(slot->exec, cb->stream), "graph launch");
#ifdef TOAST_TIMELINE
		if (note)
			cudaMemsetAsync(&cb->tl->on, 0, sizeof(unsigned), cb->stream);
#endif
		return true;
	}
	if (!slot) { /* first sight of this key: run normally once (sizes scratch), record next time */
		if (lru->exec)
			cudaGraphExecDestroy(lru->exec);
		lru->exec = NULL;
		lru->key = key;
		lru->last_use = cb->graph_clock;
		return false;
	}
	if (cu_fail(cb, cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal), "begin capture"))
		return true;
	cb->capturing = true;
	cb->capture_key = key;
	return false;
}

static void cuda_graph_end(struct toast_backend *be, uint64_t key)
{
	struct cuda_backend *cb = cu_of(be);
	if (!cb->capturing || cb->capture_key != key)
		return;
	cudaGraph_t g = NULL;
	cb->capturing = false;
	cudaError_t e = cudaStreamEndCapture(cb->stream, &g);
	if (cu_fail(cb, e, "end capture") || cb->failed) {
		if (g)
			cudaGraphDestroy(g);
		return;
	}
	struct cu_graph *slot = NULL;
	for (int i = 0; i < CU_MAX_GRAPHS; i++)
		if (cb->graphs[i].key == key)
			slot = &cb->graphs[i];
	if (slot && !cu_fail(cb, cudaGraphInstantiate(&slot->exec, g, 0), "graph instantiate")) {
		slot->last_use = cb->graph_clock;
		cu_fail(cb, cudaGraphLaunch(slot->exec, cb->stream), "graph launch");
	}
	cudaGraphDestroy(g);
}

/* ---- ops ---- */

static void cuda_embed(struct toast_backend *be, float *x, const struct toast_weight *W, int T)
{
	if (!cu_of(be)->failed)
		cu_embed(cu_of(be), x, W, T);
}

static void cuda_matmul(struct toast_backend *be, const struct toast_mm_in *in, const struct toast_mm_out *outs,
			int n_outs, int T)
{
	if (!cu_of(be)->failed)
		cu_matmul(cu_of(be), in, outs, n_outs, T);
}

static void cuda_attention(struct toast_backend *be, const struct toast_attn_args *a)
{
	if (!cu_of(be)->failed)
		cu_attention(cu_of(be), a);
}

static void cuda_gdn(struct toast_backend *be, const struct toast_gdn_args *a)
{
	if (!cu_of(be)->failed)
		cu_gdn(cu_of(be), a);
}

static void cuda_moe(struct toast_backend *be, const struct toast_moe_args *a)
{
	if (!cu_of(be)->failed)
		cu_moe(cu_of(be), a);
}

static int cuda_top(struct toast_backend *be, const float *x, int n, int m, int32_t *ids, float *vals,
		    struct toast_error *err)
{
	struct cuda_backend *cb = cu_of(be);
	int k = cb->failed ? -1 : cu_top(cb, x, n, m, ids, vals);
	if (k < 0)
		toast_err_set(err, TOAST_ERR_BACKEND, "%s", cb->fail_msg);
	return k;
}

static int cuda_pick_rows(struct toast_backend *be, const float *x, int n, int rows, const struct toast_draw *d,
			  int32_t *ids, struct toast_error *err)
{
	struct cuda_backend *cb = cu_of(be);
	if (cb->failed || cu_pick_rows(cb, x, n, rows, d, ids) < 0)
		return toast_err_set(err, TOAST_ERR_BACKEND, "%s",
				     cb->failed ? cb->fail_msg : "picks of too many rows, or counting a pending pick"),
		       -1;
	return 0;
}

static void cuda_free(struct toast_backend *be)
{
	struct cuda_backend *cb = cu_of(be);
	cudaStreamSynchronize(cb->stream);
#ifdef TOAST_TIMELINE
	cu_tl_dump(cb);
#endif
	if (cb->prof) {
		cu_prof_flush(cb);
		cu_prof_print(cb);
		for (int i = 0; i < 1024; i++)
			cudaEventDestroy(cb->prof_ev[i]);
	}
	for (int i = 0; i < CU_MAX_GRAPHS; i++)
		if (cb->graphs[i].exec)
			cudaGraphExecDestroy(cb->graphs[i].exec);
	for (size_t i = 0; i < cb->n_owned; i++)
		cudaFree(cb->owned[i]);
	free(cb->owned);
	cudaFree(cb->scratch);
	cudaFree(cb->scratch2);
	cudaFree(cb->scratch3);
	cudaFree(cb->d_step);
	cudaFreeHost(cb->h_step);
	cudaFreeHost(cb->h_top);
	cudaFreeHost(cb->h_pick);
	cu_stage_free(cb);
	cudaFree(cb->d_pick);
	cudaFree(cb->cublas_ws);
	cudaFree(cb->counters);
	cudaFree(cb->f16_slots);
	if (cb->cublas)
		cublasDestroy(cb->cublas);
	cudaEventDestroy(cb->step_copied);
	for (int i = 0; i < 2; i++)
		cudaEventDestroy(cb->pick_done[i]);
	cudaStreamDestroy(cb->stream);
	free(cb);
}

static double cuda_gemm_rate(struct toast_backend *be)
{
	return cu_gemm_rate(cu_of(be));
}

static const struct toast_backend_ops cuda_ops = {
	cuda_free,
	cuda_alloc,
	cuda_release,
	cuda_write,
	cuda_read,
	cuda_copy,
	cuda_zero,
	cuda_sync,
	cuda_prepare_weight,
	cuda_prepare_experts,
	cuda_begin_step,
	cuda_graph_begin,
	cuda_graph_end,
	cuda_embed,
	cuda_matmul,
	cuda_attention,
	cuda_gdn,
	cuda_moe,
	cuda_host_alloc,
	cuda_host_release,
	cuda_mem_free,
	cuda_top,
	cuda_gemm_rate,
	cuda_status,
	cuda_pick,
	cuda_begin_step_pick,
	cuda_pick_read,
	cuda_pick_rows,
	cuda_copy_many,
};

extern "C" bool toast_backend_cuda_available(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		cudaGetLastError();
		return false;
	}
	return n > 0;
}

extern "C" enum toast_status toast_backend_cuda_new(struct toast_backend **out, struct toast_error *err)
{
	*out = NULL;
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		cudaGetLastError();
		return toast_err_set(err, TOAST_ERR_UNSUPPORTED, "no usable CUDA device (%s)",
				     e != cudaSuccess ? cudaGetErrorString(e) : "none found");
	}
	struct cuda_backend *cb = (struct cuda_backend *)calloc(1, sizeof(*cb));
	if (!cb)
		return toast_err_set(err, TOAST_ERR_NOMEM, "out of memory");
	cudaDeviceProp prop;
	cb->dev = 0;
	const char *dbg = getenv("TOASTED_CUDA_SYNC"), *b16 = getenv("TOASTED_CUDA_BF16_GEMM");
	cb->debug_sync = dbg && *dbg == '1';
	cb->gemm_bf16 = b16 && *b16 == '1';
	static const float f16_slots[CU_F16_KEPT0] = {1, 0, 1, 0, 1, 0}; /* CU_F16_SX .. CU_F16_XMAX */
	size_t f16_bytes = (CU_F16_KEPT0 + CU_F16_KEPT) * sizeof(float);
	bool ok = cudaSetDevice(cb->dev) == cudaSuccess && cudaGetDeviceProperties(&prop, cb->dev) == cudaSuccess &&
		  cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking) == cudaSuccess &&
		  cudaEventCreateWithFlags(&cb->step_copied, cudaEventDisableTiming) == cudaSuccess &&
		  cudaMallocHost(&cb->h_top, TOAST_TOP_MAX * sizeof(*cb->h_top)) == cudaSuccess &&
		  cudaHostGetDevicePointer((void **)&cb->dh_top, cb->h_top, 0) == cudaSuccess &&
		  cudaMallocHost(&cb->h_pick, 2 * sizeof(*cb->h_pick)) == cudaSuccess &&
		  cudaHostGetDevicePointer((void **)&cb->dh_pick, cb->h_pick, 0) == cudaSuccess &&
		  cudaMalloc(&cb->d_pick, (CU_PICK_KEYS + 2) * sizeof(*cb->d_pick)) == cudaSuccess &&
		  cudaEventCreateWithFlags(&cb->pick_done[0], cudaEventDisableTiming) == cudaSuccess &&
		  cudaEventCreateWithFlags(&cb->pick_done[1], cudaEventDisableTiming) == cudaSuccess &&
		  cublasCreate(&cb->cublas) == CUBLAS_STATUS_SUCCESS &&
		  cublasSetStream(cb->cublas, cb->stream) == CUBLAS_STATUS_SUCCESS &&
		  cudaMalloc(&cb->cublas_ws, 32u << 20) == cudaSuccess &&
		  cudaMalloc(&cb->counters, CU_CTR_N * sizeof(unsigned)) == cudaSuccess &&
		  cudaMemsetAsync(cb->counters, 0, CU_CTR_N * sizeof(unsigned), cb->stream) == cudaSuccess &&
		  cudaMalloc(&cb->f16_slots, f16_bytes) == cudaSuccess &&
		  cudaMemcpyAsync(cb->f16_slots, f16_slots, sizeof(f16_slots), cudaMemcpyHostToDevice, cb->stream) ==
			  cudaSuccess &&
		  cublasSetWorkspace(cb->cublas, cb->cublas_ws, 32u << 20) == CUBLAS_STATUS_SUCCESS;
	if (!ok) {
		cudaError_t le = cudaGetLastError();
		cuda_free(&cb->base);
		return toast_err_set(err, TOAST_ERR_BACKEND, "cannot initialise CUDA device 0: %s", cudaGetErrorString(le));
	}
	const char *prof = getenv("TOASTED_CUDA_PROFILE");
	if (prof && *prof == '1') {
		cb->prof = true;
		for (int i = 0; i < 1024; i++)
			cudaEventCreate(&cb->prof_ev[i]);
		cu_prof_flush(cb);
	}
#ifdef TOAST_TIMELINE
	cu_tl_init(cb);
#endif
	cb->n_sm = prop.multiProcessorCount;
	cb->smem_optin = prop.sharedMemPerBlockOptin;
	cb->base.ops = &cuda_ops;
	cb->base.name = "cuda";
	cb->base.act_type = TOAST_DT_BF16;
	cb->base.act_size = 2;
	cb->base.async_steps = true;
	cb->base.impl = cb;
	*out = &cb->base;
	return TOAST_OK;
}
