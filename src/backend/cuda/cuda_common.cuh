/*
 * cuda_common.cuh - internals shared by the CUDA backend's .cu files: the backend struct,
 * error handling, bf16 helpers and the launchers each op family exports to cuda_backend.cu.
 *
 * Invariants: one stream; every launch is followed by cu_launched() (which checks the launch
 * and, with TOASTED_CUDA_SYNC=1, synchronises so an asynchronous fault names its op); once an
 * error is recorded the backend is poisoned (cb->failed) and every later op is a no-op until
 * the engine is reopened. Activations are bf16, accumulation f32, recurrent state f32.
 */
#ifndef TOAST_CUDA_COMMON_CUH
#define TOAST_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

extern "C" {
#include "backend/backend.h"
}

typedef __nv_bfloat16 bf16;

#define CU_MAX_GRAPHS 16

struct cu_graph {
	uint64_t key;
	cudaGraphExec_t exec;
	uint64_t last_use;
};

#define CU_F16_KEPT 1024 /* weights whose largest |value| is kept for the fp16 products */
/* cuda_backend.f16_slots: the input's scale, a weight's largest |value| when not kept, the GEMM's
 * alpha, 0 and 1 (its betas), an f32 input's largest |value|, then the kept weights' */
enum { CU_F16_SX, CU_F16_WMAX, CU_F16_ALPHA, CU_F16_ZERO, CU_F16_ONE, CU_F16_XMAX, CU_F16_KEPT0 };

/* cuda_backend.counters: the tickets of the router (when it picks the experts itself), of top's
 * runs (k_top_runs) and of the picks (k_pick, k_pick_draw) */
enum {
	CU_CTR_ROUTE,
	CU_CTR_TOP,
	CU_CTR_PICK,
	CU_CTR_WIDE, /* two: k_pick_wide's barrier and largest */
	CU_CTR_GDN = 8, /* 256: a multi-token DeltaNet step's count a key head (k_gdn_decode) */
	CU_CTR_N = CU_CTR_GDN + 256
};
#define CU_PICK_KEYS 65536 /* the blocks' keys a pick leaves at most (k_pick_draw: 2^20 logits) */

struct cuda_backend {
	struct toast_backend base;
	int dev, n_sm;
	size_t smem_optin;
	cudaStream_t stream;
	cublasHandle_t cublas;
	void *cublas_ws;
	bool debug_sync;
	bool failed;
	char fail_msg[384];
	/* the current step: pinned host copy and device copy of {pos, T, ids[T]} */
	int32_t *h_step, *d_step;
	int step_cap;
	cudaEvent_t step_copied;
	int step_T, step_pos;
	/* pinned host landing of cu_top's keys: a copy into pageable memory goes through a staging
	 * buffer and waits for it, on every generated token's path */
	unsigned long long *h_top, *dh_top; /* (dh: the device's address of h_top: top 1 lands there) */
	/* picks queued on the device (toast_backend_ops.pick): a ring of two, each a key the
	 * device writes to pinned memory, an event after it, and the position of the step it makes
	 * (a host mirror of what the pick leaves in d_step); d_pick: the blocks' bests, a key each
	 * (k_pick) or a run (k_pick_draw), CU_PICK_KEYS, then the two slots' keys again (a draw's prev) */
	unsigned long long *d_pick;
	unsigned long long *h_pick, *dh_pick; /* the keys picked (dh: the device's address of h_pick) */
	cudaEvent_t pick_done[2];
	int pick_pos[2];
	int pick_next, pick_pending;
	int wide_per_sm[4]; /* blocks of k_pick_wide<1 << i> resident on an SM (0: not asked yet) */
	/* weight uploads (cu_copy_in) go through two pinned slots of 32 MB, filled by up to
	 * copy_threads threads while the other slot's copy to the device runs; stage_done[i]: the
	 * copy that last read slot i. Allocated at the first upload. */
	void *stage[2];
	cudaEvent_t stage_done[2];
	int stage_next, copy_threads;
	/* device scratch for ops, grown outside graph capture; scratch2 for buffers sized later in an
	 * op than the first (growing one must not move the other); scratch3 for an op around another
	 * (a dense MLP's gate and up products around the matmul that makes them) */
	void *scratch, *scratch2, *scratch3;
	size_t scratch_bytes, scratch2_bytes, scratch3_bytes;
	unsigned *counters; /* zeroed device counters for "last block" patterns; each user resets its own (CU_CTR_*) */
	/* the fp16 products of f32 and normed inputs on cuBLAS (k_matmul.cu): device slots (CU_F16_*;
	 * the largest |value| of the weight whose dev is f16_keys[i] at CU_F16_KEPT0 + i);
	 * gemm_bf16 (TOASTED_CUDA_BF16_GEMM=1) takes bf16 products instead */
	float *f16_slots;
	const void *f16_keys[CU_F16_KEPT];
	bool gemm_bf16;
	/* weights uploaded by prepare_weight/prepare_experts, freed with the backend */
	void **owned;
	size_t n_owned, cap_owned;
	/* TOASTED_CUDA_PROFILE=1: an event after every launch, time per kernel name, printed at exit
	 * (steps are then not recorded as graphs, so each kernel is timed on its own) */
	bool prof;
	int prof_n;
	cudaEvent_t prof_ev[1024];
	const char *prof_op[1024];
	struct cu_prof_row {
		const char *op;
		double ms;
		long calls;
	} prof_rows[64];
	int prof_rows_n;
	/* decode-step graphs */
	bool capturing;
	uint64_t capture_key, graph_clock;
	struct cu_graph graphs[CU_MAX_GRAPHS];
#ifdef TOAST_TIMELINE
	struct cu_tl *tl; /* device; see cu_pdl_wait */
	const char *tl_path;
	long tl_replays, tl_step;
#endif
};

static inline struct cuda_backend *cu_of(struct toast_backend *be)
{
	return (struct cuda_backend *)be;
}

/* Record a CUDA error (first one wins); returns true when there is one. */
bool cu_fail(struct cuda_backend *cb, cudaError_t e, const char *what);
/* copy n bytes of host memory to dst in stream order (true: failed, cb->fail_msg says why) */
bool cu_copy_in(struct cuda_backend *cb, void *dst, const void *src, size_t n);
/* Record a failure that is not a cudaError_t (cuBLAS status, an unsupported shape). */
void cu_fail_msg(struct cuda_backend *cb, const char *fmt, ...);
/* Check a launch (and optionally synchronise): call after every kernel launch. */
void cu_launched(struct cuda_backend *cb, const char *op);
/* Let kernel func use as much dynamic shared memory as the device allows beside its static
 * shared memory; returns that many bytes (0 on error, which is then recorded). */
size_t cu_allow_smem(struct cuda_backend *cb, const void *func);
/* Device scratch of at least n bytes (grown when not capturing), or NULL (then failed is set). */
void *cu_scratch(struct cuda_backend *cb, size_t n);
void *cu_scratch2(struct cuda_backend *cb, size_t n);
void *cu_scratch3(struct cuda_backend *cb, size_t n);

static inline unsigned cu_blocks(size_t n, unsigned per)
{
	return (unsigned)((n + per - 1) / per);
}

/* blocks of fn (threads each, smem bytes of dynamic shared memory) resident on one SM at once;
 * 0 when the query fails (its error cleared: a failed query is no launch error) */
static inline int cu_per_sm(const void *fn, int threads, size_t smem)
{
	int n = 0;
	if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, threads, smem) != cudaSuccess)
		cudaGetLastError(), n = 0;
	return n;
}

/* ---- launches ----
 * cu_launch(cb, kernel, grid, block, smem, args...) launches on the backend's stream (cu_launch_on:
 * on any stream, returning the launch's error; bench/decode_probe.cu measures these launches);
 * cu_launch_pdl with programmatic dependent launch (sm_90): the kernel may be scheduled while
 * the one before it drains, so its launch and its first weight loads overlap that kernel's
 * tail. Before cu_pdl_wait() (which returns once the previous kernel has completed and its
 * writes are visible; at once when launched plainly) it may read only what no kernel writes
 * (weights, parameters) and must write nothing. cu_pdl_trigger() lets the next kernel be
 * scheduled once every block of this one has called it: right after the wait in a grid of one
 * wave (the next kernel's blocks take the idle SMs), near the end of each block in a grid of
 * several (earlier, they would take the room this kernel's later blocks need; an H200 run that
 * triggered at every kernel's start decoded 7% slower).
 */
template <typename... KArgs, typename... Args>
static inline cudaError_t cu_launch_attr(cudaStream_t stream, cudaLaunchAttribute *attr, void (*kernel)(KArgs...),
					 dim3 grid, dim3 block, size_t smem, Args &&...args)
{
	cudaLaunchConfig_t cfg = {};
	cfg.gridDim = grid;
	cfg.blockDim = block;
	cfg.dynamicSmemBytes = smem;
	cfg.stream = stream;
	cfg.attrs = attr;
	cfg.numAttrs = attr ? 1 : 0;
	return cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...);
}

template <typename... KArgs, typename... Args>
static inline cudaError_t cu_launch_on(cudaStream_t stream, bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block,
				       size_t smem, Args &&...args)
{
	cudaLaunchAttribute attr;
	attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
	attr.val.programmaticStreamSerializationAllowed = 1;
	return cu_launch_attr(stream, pdl ? &attr : NULL, kernel, grid, block, smem, static_cast<Args &&>(args)...);
}

/* a cooperative launch: every block of the grid resident at once (or the launch fails), so that
 * they may wait for each other */
template <typename... KArgs, typename... Args>
static inline void cu_launch_coop(struct cuda_backend *cb, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
				  Args &&...args)
{
	cudaLaunchAttribute attr;
	attr.id = cudaLaunchAttributeCooperative;
	attr.val.cooperative = 1;
	cu_launch_attr(cb->stream, &attr, kernel, grid, block, smem, static_cast<Args &&>(args)...); /* cu_launched checks */
}

template <typename... KArgs, typename... Args>
static inline void cu_launch_ex(struct cuda_backend *cb, bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block,
				size_t smem, Args &&...args)
{
	cu_launch_on(cb->stream, pdl, kernel, grid, block, smem, static_cast<Args &&>(args)...); /* cu_launched checks */
}

template <typename... KArgs, typename... Args>
static inline void cu_launch(struct cuda_backend *cb, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
			     Args &&...args)
{
	cu_launch_ex(cb, false, kernel, grid, block, smem, static_cast<Args &&>(args)...);
}

template <typename... KArgs, typename... Args>
static inline void cu_launch_pdl(struct cuda_backend *cb, void (*kernel)(KArgs...), dim3 grid, dim3 block,
				 size_t smem, Args &&...args)
{
	cu_launch_ex(cb, true, kernel, grid, block, smem, static_cast<Args &&>(args)...);
}

/*
 * Built with -DTOAST_TIMELINE (bench/timeline.sh), every block's thread 0 notes when it reached
 * cu_pdl_wait() and when the wait returned (%globaltimer, ns), with its grid id and SM, in
 * one chosen decode-graph replay (TOASTED_TIMELINE=out.csv, TOASTED_TIMELINE_STEP=k): when a
 * kernel's blocks became resident and when its input became readable, joined to CUPTI's kernel
 * records by grid id. Each .cu file with kernels that wait has its own copy of the pointer
 * (no relocatable device code), set through CU_TL_TU's setter.
 */
#ifdef TOAST_TIMELINE
#define CU_TL_MARKS 4
struct cu_tl_rec {
	unsigned long long grid, t_in, t_out, mark[CU_TL_MARKS]; /* mark: cu_tl_mark(i), 0 if none */
	unsigned smid, block;
};
/* a record per (grid id % CU_TL_GRIDS, block < CU_TL_BLOCKS), no atomics: the noted replay's
 * grids (graph nodes, consecutive ids) overwrite the zeroed buffer */
#define CU_TL_GRIDS 1024
#define CU_TL_BLOCKS 1024
struct cu_tl {
	unsigned on, pad[3];
	cu_tl_rec r[1];
};
static __device__ cu_tl *cu_tl_dev;
#define CU_TL_TU(NAME)                                                                                              \
	extern "C" void cu_tl_set_##NAME(void *p) { cudaMemcpyToSymbol(cu_tl_dev, &p, sizeof p); }

__device__ __forceinline__ unsigned long long cu_gtime()
{
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/* the block's record, NULL past CU_TL_BLOCKS */
static __device__ __forceinline__ cu_tl_rec *cu_tl_rec_of(cu_tl *tl, unsigned long long grid, unsigned block)
{
	return block < CU_TL_BLOCKS ? &tl->r[(grid % CU_TL_GRIDS) * CU_TL_BLOCKS + block] : NULL;
}

static __device__ __forceinline__ unsigned cu_tl_block()
{
	return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}

static __device__ __forceinline__ unsigned long long cu_tl_grid()
{
	unsigned long long grid;
	asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
	return grid;
}

static __device__ __forceinline__ void cu_tl_note(cu_tl *tl, unsigned long long t_in, unsigned long long t_out)
{
	unsigned long long grid = cu_tl_grid();
	unsigned smid, block = cu_tl_block();
	asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
	if (cu_tl_rec *r = cu_tl_rec_of(tl, grid, block))
		*r = {grid, t_in, t_out, {0, 0, 0, 0}, smid, block};
}

static __device__ __forceinline__ void cu_tl_note_mark(cu_tl *tl, int i, unsigned long long t)
{
	if (cu_tl_rec *r = cu_tl_rec_of(tl, cu_tl_grid(), cu_tl_block()))
		r->mark[i] = t;
}
#else
#define CU_TL_TU(NAME)
#endif

/* a point inside a kernel, after its cu_pdl_wait(), noted by thread 0 in the timeline build
 * (mark i of the block's record); nothing otherwise */
__device__ __forceinline__ void cu_tl_mark(int i)
{
#ifdef TOAST_TIMELINE
	if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
		unsigned long long t = cu_gtime();
		cu_tl *tl = cu_tl_dev;
		if (tl && __ldca(&tl->on)) /* (an L1 hit after the wait's load) */
			cu_tl_note_mark(tl, i, t);
	}
#else
	(void)i;
#endif
}

__device__ __forceinline__ void cu_pdl_wait()
{
#ifdef TOAST_TIMELINE
	/* the flag's loads fly during the wait (host-written before the replay) */
	bool t0 = threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
	unsigned long long t_in = cu_gtime();
	cu_tl *tl = t0 ? cu_tl_dev : NULL;
	unsigned on = tl ? __ldca(&tl->on) : 0; /* (written between replays; L1 starts each kernel cold) */
#endif
	asm volatile("griddepcontrol.wait;" ::: "memory");
#ifdef TOAST_TIMELINE
	unsigned long long t_out = cu_gtime();
	if (on)
		cu_tl_note(tl, t_in, t_out);
#endif
}

__device__ __forceinline__ void cu_pdl_trigger()
{
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/* ---- device helpers ---- */

/* ask L2 for n bytes at p (16-byte aligned, n a multiple of 16; a hint: nothing waits for it) */
__device__ __forceinline__ void cu_prefetch_l2(const void *p, unsigned n)
{
	if (n)
		asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
}

__device__ __forceinline__ float cu_warp_sum(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__device__ __forceinline__ float cu_warp_max(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/* v reduced over the block by the warp reduction WARP (blockDim.x a multiple of 32, <= 1024),
 * id its identity; every thread gets the result. sh must hold 32 values; the function
 * synchronises. */
template <typename T, T (*WARP)(T)>
__device__ __forceinline__ T cu_block_reduce(T v, T *sh, T id)
{
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = WARP(v);
	__syncthreads();
	if (lane == 0)
		sh[w] = v;
	__syncthreads();
	return WARP(lane < nw ? sh[lane] : id);
}

/* Sum over the block (cu_block_reduce) */
__device__ __forceinline__ float cu_block_sum(float v, float *sh)
{
	return cu_block_reduce<float, cu_warp_sum>(v, sh, 0.0f);
}

/* Maximum over the block (cu_block_reduce) */
__device__ __forceinline__ float cu_block_max(float v, float *sh)
{
	return cu_block_reduce<float, cu_warp_max>(v, sh, -INFINITY);
}

/* true, in every thread, in the last block of the grid to pass here (a ticket in *counter, which
 * that block zeroes when done); what any thread of the grid wrote before it is then visible
 * there (read past L1: __ldcg). Every thread of every block calls it. */
__device__ __forceinline__ bool cu_last_block(unsigned *counter)
{
	__shared__ unsigned ticket;
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0)
		ticket = atomicAdd(counter, 1u);
	__syncthreads();
	if (ticket != gridDim.x - 1)
		return false;
	__threadfence();
	return true;
}

/* m (>= 0) into *amax, a float's bits, by the warp's largest: call with every lane, *amax zeroed
 * before the grid (non-negative floats order as their bits) */
__device__ __forceinline__ void cu_amax_add(float m, unsigned *amax)
{
	m = cu_warp_max(m);
	if ((threadIdx.x & 31) == 0)
		atomicMax(amax, __float_as_uint(m));
}

/* RMSNorm's factor 1/rms(x) of n floats, by a whole block (red: 32 floats of shared memory; the
 * function synchronises) */
__device__ __forceinline__ float cu_rms(const float *x, int64_t n, float eps, float *red)
{
	float ss = 0;
	for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
		ss += x[i] * x[i];
	return rsqrtf(cu_block_sum(ss, red) / n + eps);
}

/* the same a float4 at a time (n % 4 == 0, 16-byte aligned rows) */
__device__ __forceinline__ float cu_rms4(const float *x, int64_t n, float eps, float *red)
{
	float ss = 0;
	for (int i = threadIdx.x; i < (int)(n >> 2); i += blockDim.x) {
		float4 v = ((const float4 *)x)[i];
		ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
	}
	return rsqrtf(cu_block_sum(ss, red) / n + eps);
}

/* elements 4i..4i+3 of RMSNorm(x): x * r * (p1 + w), p1 = 1 for a zero-centred weight */
__device__ __forceinline__ float4 cu_norm4(const float *x, const float *w, int i, float r, float p1)
{
	float4 v = ((const float4 *)x)[i], g = ((const float4 *)w)[i];
	return make_float4(v.x * r * (p1 + g.x), v.y * r * (p1 + g.y), v.z * r * (p1 + g.z), v.w * r * (p1 + g.w));
}

/* the power of two s with bound * s < 2^15 (fp16's largest finite value is 65504) and
 * bound * s >= 2^14, so values up to bound keep fp16's 11 bits clear of its range's ends;
 * 1 for a bound of 0 or not finite */
__device__ __forceinline__ float cu_f16_scale(float bound)
{
	if (!(bound > 0.0f) || isinf(bound))
		return 1.0f;
	int p;
	frexpf(bound, &p); /* bound < 2^p */
	p = p < -100 ? -100 : p > 100 ? 100 : p;
	return ldexpf(1.0f, 15 - p);
}

__device__ __forceinline__ float cu_silu(float x)
{
	return x / (1.0f + __expf(-x));
}

/* a dense MLP's act value SiLU(g) * u in bf16: the one rounding of cu_swiglu and the GLU GEMV */
__device__ __forceinline__ bf16 cu_swiglu1(float g, float u)
{
	return __float2bfloat16(cu_silu(g) * u);
}

__device__ __forceinline__ float cu_sigmoid(float x)
{
	return 1.0f / (1.0f + __expf(-x));
}

/* element i of a weight vector stored as dev_type (F32 or BF16) */
__device__ __forceinline__ float cu_ldw(const void *p, int type, int64_t i)
{
	return type == TOAST_DT_F32 ? ((const float *)p)[i] : __bfloat162float(((const bf16 *)p)[i]);
}

/* 8 bf16 in a uint4 -> 8 floats */
__device__ __forceinline__ void cu_bf16x8(uint4 u, float *f)
{
	const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		float2 t = __bfloat1622float2(h[i]);
		f[2 * i] = t.x;
		f[2 * i + 1] = t.y;
	}
}

/* ---- tensor cores (sm_80+ mma.sync; bf16 in, f32 accumulate) ----
 * Fragments of mma.m16n8k16 for lane l (g = l / 4, c = 2 * (l % 4)): A (16 x 16, row-major) a0 =
 * A[g][c..c+1], a1 = A[g+8][c..], a2 = A[g][c+8..], a3 = A[g+8][c+8..]; B (16 x 8, k x n) b0 =
 * B[c..c+1][g], b1 = B[c+8..c+9][g]; C (16 x 8) c0,c1 = C[g][c..c+1], c2,c3 = C[g+8][c..c+1]. */
__device__ __forceinline__ void cu_mma_bf16(float *d, const unsigned *a, unsigned b0, unsigned b1)
{
	asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
	    "{%0,%1,%2,%3};\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* as cu_mma_bf16, with fp16 operands */
__device__ __forceinline__ void cu_mma_f16(float *d, const unsigned *a, unsigned b0, unsigned b1)
{
	asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
	    "{%0,%1,%2,%3};\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* two 8-bit codes (bytes HI of w: 0 -> bytes 0, 1; 1 -> bytes 2, 3), each q + 128, as the fp16
 * pair (q0 + 1152, q1 + 1152): the byte under the exponent of 1024 (0x64), one prmt. A product
 * with such a pair is one with (q0, q1) plus 1152 times one with (1, 1), which the caller takes
 * off once (exact in the f32 accumulator up to its rounding) */
#define CU_Q8_OFS 1152.0f
template <int HI>
__device__ __forceinline__ unsigned cu_q8_h2(unsigned w)
{
	unsigned r;
	asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(w), "r"(0x64646464u), "n"(HI ? 0x4342 : 0x4140));
	return r;
}

/* two floats -> one register of two fp16 (lo in the low half) */
__device__ __forceinline__ unsigned cu_pack_f16(float lo, float hi)
{
	__half2 v = __floats2half2_rn(lo, hi);
	return *(unsigned *)&v;
}

/* mma.m16n8k8 with tf32 operands, lane l (g = l / 4, t = l % 4): A (16 x 8, row-major) a0 = A[g][t],
 * a1 = A[g+8][t], a2 = A[g][t+4], a3 = A[g+8][t+4]; B (8 x 8, k x n) b0 = B[t][g], b1 = B[t+4][g];
 * C as for cu_mma_bf16. */
__device__ __forceinline__ void cu_mma_tf32(float *d, const unsigned *a, unsigned b0, unsigned b1)
{
	asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
	    "{%0,%1,%2,%3};\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* x as two tf32s, hi + lo: hi is x's top 19 bits (sign, exponent, 10 bits of mantissa; exact) and
 * lo = x - hi (exact in f32), of which the tensor core takes 19 bits (a tf32), so the pair holds x
 * to ~2^-20 of it. A product of two such pairs taken as lo*hi + hi*lo + hi*hi (lo*lo is below
 * that) keeps f32's accuracy on tensor cores (the state-pass test holds it to 1e-4). */
__device__ __forceinline__ void cu_tf32_split(float x, unsigned &hi, unsigned &lo)
{
	hi = __float_as_uint(x) & 0xffffe000u;
	lo = __float_as_uint(x - __uint_as_float(hi));
}

/* a shared-memory pointer as the 32-bit address ldmatrix and cp.async take */
__device__ __forceinline__ unsigned cu_smem_addr(const void *p)
{
	return (unsigned)__cvta_generic_to_shared(p);
}

/* four 8 x 8 b16 matrices from shared memory; lane l gives the address of row l % 8 of matrix
 * l / 8; r[i] is matrix i (TRANS: transposed) in the mma fragment layout */
template <bool TRANS>
__device__ __forceinline__ void cu_ldsm4(unsigned *r, unsigned addr)
{
	if (TRANS)
		asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
			     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
			     : "r"(addr));
	else
		asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
			     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
			     : "r"(addr));
}

template <bool TRANS>
__device__ __forceinline__ void cu_ldsm4(unsigned *r, const void *smem)
{
	cu_ldsm4<TRANS>(r, cu_smem_addr(smem));
}

/* 16 bytes global -> shared without registers; !pred writes zeros (src is not read, but must
 * be a mapped address) */
__device__ __forceinline__ void cu_cp16(unsigned dst, const void *src, bool pred)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0)
		     : "memory");
}

__device__ __forceinline__ void cu_cp16(void *smem, const void *src, bool pred)
{
	cu_cp16(cu_smem_addr(smem), src, pred);
}

__device__ __forceinline__ void cu_cp_commit()
{
	asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* wait until at most N of this thread's committed groups are in flight */
template <int N>
__device__ __forceinline__ void cu_cp_wait()
{
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* two floats -> one register of two bf16 (lo in the low half) */
__device__ __forceinline__ unsigned cu_pack_bf16(float lo, float hi)
{
	__nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
	return *(unsigned *)&v;
}

/* ---- launchers (one family per .cu file) ---- */

/* k_basic.cu */
void cu_embed(struct cuda_backend *cb, float *x, const struct toast_weight *W, int T);
void cu_swiglu(struct cuda_backend *cb, bf16 *out, const float *g, const float *u, int T, int n);
void cu_fill_synthetic(struct cuda_backend *cb, void *dst, enum toast_dtype type, size_t n, uint64_t seed,
		       int64_t n_in, int64_t n_out);
void cu_f32_to_bf16(struct cuda_backend *cb, bf16 *dst, const float *src, size_t n);
/* n copies between device buffers in ceil(n / 32) launches; sizes in whole 4-byte words */
void cu_copy_many(struct cuda_backend *cb, void *const *dst, const void *const *src, const size_t *bytes, int n);

/* k_matmul.cu */
#define CU_GEMV_MAX_T 8 /* up to this many tokens a matmul is a GEMV (decode); beyond, cuBLAS */
void cu_matmul(struct cuda_backend *cb, const struct toast_mm_in *in, const struct toast_mm_out *outs, int n_outs,
	       int T);
/* out[T][W.n_out] (f32) = x[T][W.n_in] (f32) · Wᵀ, any weight type: precise and slow */
void cu_gemv_f32(struct cuda_backend *cb, float *out, const float *x, const struct toast_weight *W, int T);
/* rows y = RMSNorm(x) with w, into yf (f32) and/or yb (bf16); ylo = bf16(y - yb); yh = fp16(y * s),
 * s the power of two (in f16_slots[CU_F16_SX]) that keeps sqrt(n) max|w| (a bound on |y|) below 2^15 */
void cu_norm_rows(struct cuda_backend *cb, const float *x, const struct toast_weight *w, int T, int64_t n, float eps,
		  bool plus_one, float *yf, bf16 *yb, bf16 *ylo, __half *yh);
/* o->out [T][W.n_out] (per mode) = in [T][W.n_in] (bf16) · Wᵀ on cuBLAS (a quantised W is
 * dequantised to bf16 in scratch2 first, a block of rows at a time) */
void cu_cublas(struct cuda_backend *cb, const struct toast_mm_out *o, const bf16 *in, int T);
/* x [n] (f32) as fp16 in yh, scaled by the power of two that keeps its largest |value| below 2^15
 * (in f16_slots[CU_F16_SX]), and as bf16 in yb when not NULL */
void cu_f16_rows(struct cuda_backend *cb, const float *x, size_t n, __half *yh, bf16 *yb);
/* the same for an input from cu_norm_rows' or cu_f16_rows' yh (mode F32 or ADD): W converted to fp16 in
 * scratch2 a block of rows at a time, scaled by the power of two that keeps its largest |value|
 * (found at its first product, then kept) below 2^15; alpha undoes both scales. fp16's 11 bits
 * against bf16's 8: the products that feed DeltaNet's and attention's f32 math (q, k, v, gates)
 * and take DeltaNet's f32 output get about decode's precision at prefill */
void cu_cublas_f16(struct cuda_backend *cb, const struct toast_mm_out *o, const __half *in, int T);
/* out (f32) = (hi + lo) · Wᵀ for an input split in two bf16 parts (f32 precision nearly): three
 * GEMMs when W is quantised (its dequantised values need more than bf16's 8 bits: they go in
 * as two parts too; the lo x lo product is left out), two when it is bf16 */
void cu_cublas_split(struct cuda_backend *cb, float *out, const struct toast_weight *W, const bf16 *hi, const bf16 *lo,
		     int T);

/* FLOP/s of an 8192^3 bf16 GEMM (f32 accumulation, random values) on cuBLAS as cu_cublas
 * calls it, best of 5; 0 when it cannot run (no memory) */
double cu_gemm_rate(struct cuda_backend *cb);

/* k_attn.cu */
void cu_attention(struct cuda_backend *cb, const struct toast_attn_args *a);

/* k_gdn.cu */
void cu_gdn(struct cuda_backend *cb, const struct toast_gdn_args *a);

/* k_moe.cu */
void cu_moe(struct cuda_backend *cb, const struct toast_moe_args *a);

/* k_top.cu: toast_backend_ops.top (waits for the stream); -1 when the backend has failed */
int cu_top(struct cuda_backend *cb, const float *x, int n, int m, int32_t *ids, float *vals);
int cu_pick_rows(struct cuda_backend *cb, const float *x, int n, int rows, const struct toast_draw *d, int32_t *ids);
/* the key (top()'s, cu_key_id names its token) of the largest of x[0, n) (d NULL), or drawn by
 * d (toast_draw_pick's; with d->prev, the pick queued before it in the other slot counts), into
 * pick slot `slot` (h_pick's, pinned and device-visible, and the device's copy after d_pick's
 * blocks), queued; d_step (if any) then holds the one-token step {pos, 1, that token}
 * (k_pick or k_pick_draw) */
void cu_pick(struct cuda_backend *cb, const float *x, int n, const struct toast_draw *d, int slot, int pos);
/* the token a key names (top()'s decoding; 0 for a NaN's or no key, as top()'s empty answer
 * makes the sampler choose) */
static inline __host__ __device__ int32_t cu_key_id(unsigned long long key)
{
	return (unsigned)(key >> 32) == 0 ? 0 : (int32_t)(0xffffffffu - (unsigned)key);
}

#endif
