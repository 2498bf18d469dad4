/*
 * decode_probe.cu - what a chain of dependent GEMVs costs on the GPU at hand, the shape of a
 * decode step: phase p reads the vector that phase p-1 wrote and streams its own weights
 * (distinct for every phase, so they come from DRAM, as a step's do). Each way of running the
 * chain is timed as a CUDA graph's replays, median of several:
 *
 *   launch   empty kernels (no weights, no vector): what a kernel boundary costs
 *   after    a kernel a phase; weights loaded after the dependency wait
 *   regs     a kernel a phase; weights loaded into registers before the wait
 *   regs2    the same with registers for two blocks an SM (the next kernel fits beside)
 *   regstma  regs, the vector staged by a bulk copy (TMA) instead of the threads' loads
 *   smem     a kernel a phase; weights bulk-copied (TMA) into shared memory before the wait
 *   smemrows the same by a bulk copy a row
 *   l2       a kernel a phase; weights after the wait, the next phase's asked into L2 first
 *   persist  one kernel for all phases, a grid barrier between them, the next phase's weights
 *            bulk-copied into shared memory while this one computes
 *   persist0 the same with no weights: what a grid barrier costs
 *   streamD  persist with the weights of the next D phases in flight at once (a ring of D
 *            shared buffers, each refilled by a bulk copy a row as soon as its phase has
 *            ended in the block): whether a resident kernel keeps DRAM busy through the chain
 *   streamcpD the same by every thread's 16-byte cp.async instead of bulk copies
 *   regsll   regs, the vector handed over as tagged words (LL: a 64-bit store of the value and
 *            its phase, polled by the reader) instead of the dependency wait
 *   streamllD streamD with that hand-over instead of the grid barrier
 *   ll0      that hand-over alone (no weights): what passing a vector between phases costs
 *   regsclN  regs launched in clusters of N blocks (2, 4, 8): what a cluster launch costs a
 *            phase (a phase that hands data between its blocks, e.g. a projection and what
 *            its rows feed, would run as clusters)
 *   regsclbN the same with a cluster barrier after the phase's stores (one such hand-over)
 *
 * each kernel-a-phase way plainly (one after the other) and with programmatic dependent
 * launch (the next kernel's blocks start while this one runs). Every way must leave the same
 * final vector (checked), and the copy bandwidth is measured in the same run.
 *
 * Usage: decode_probe [PHASES [ROWS [SETS [SPREAD_KB]]]]   (ROWS weight rows of 2048 bf16 a
 * phase; default 256 phases of 2048 rows: 8 MB a phase, 2 GB a pass, as a 4-bit Qwen3-Next step
 * reads; SETS: distinct weight sets, phase p reading set p % SETS, default PHASES: a few sets stay
 * in L2; SPREAD_KB: each block's rows SPREAD_KB apart from the next block's, not together, so
 * that a pass touches as many pages of as large an allocation as a step's scattered experts do)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh" /* the backend's launches and helpers: what is measured */
#include "probe.cuh"

#define N_IN 2048
#define THREADS 256
#define WARPS (THREADS / 32)
#define MAX_ROWS_BLOCK 16 /* rows a block (2 a warp): 64 KB of weights */
#define CHUNKS (N_IN / 8 / 32) /* 16-byte chunks of a row a lane holds */


struct probe {
	const bf16 *w;  /* [phases][rows][N_IN] */
	float *v;       /* [phases + 1][N_IN]: v[p + 1] = tanh(W_p v[p]) (cyclic when rows < N_IN) */
	int rows, phases, rows_block;
	int sets; /* phase p reads weight set p % sets (sets < phases: the weights stay in L2) */
	size_t spread; /* 0: a set's rows together; else elements from one block's rows to the next's */
	unsigned *count; /* grid barrier (persistent ways) */
	int depth;       /* phases whose weights are in flight at once (stream ways) */
	/* LL ways: [phases + 1][N_IN] words (p + 1) << 32 | bits of v[p] (p > 0), each written by one
	 * store, so a reader that sees the tag sees the value: no fence, barrier or dependency wait
	 * between phases (NULL: the other ways) */
	unsigned long long *ll;
};

__device__ __forceinline__ void mbar_init(uint64_t *bar)
{
	asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(cu_smem_addr(bar)) : "memory");
	asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* one thread: bytes (a multiple of 16) from global src to shared dst, counted on bar */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, unsigned bytes, uint64_t *bar)
{
	asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(cu_smem_addr(bar)), "r"(bytes)
		     : "memory");
	asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
			     cu_smem_addr(dst)),
		     "l"(src), "r"(bytes), "r"(cu_smem_addr(bar))
		     : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity)
{
	unsigned ok = 0;
	while (!ok)
		asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
			     : "=r"(ok)
			     : "r"(cu_smem_addr(bar)), "r"(parity)
			     : "memory");
}

__device__ __forceinline__ void prefetch_l2(const void *src, unsigned bytes)
{
	asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

/* 8 bf16 · 8 floats of x (shared memory, lane l's at 32 l bytes: lanes 4-7 of each quarter
 * warp read their second half first, so a quarter's eight 16-byte loads take every bank once) */
__device__ __forceinline__ float dot8(uint4 u, const float *x)
{
	const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
	int second = (threadIdx.x >> 2) & 1;
	float4 a = ((const float4 *)x)[second], b = ((const float4 *)x)[second ^ 1];
	if (second) {
		float4 t = a;
		a = b;
		b = t;
	}
	float2 p = __bfloat1622float2(h[0]), q = __bfloat1622float2(h[1]), r = __bfloat1622float2(h[2]),
	       s = __bfloat1622float2(h[3]);
	return p.x * a.x + p.y * a.y + q.x * a.z + q.y * a.w + r.x * b.x + r.y * b.y + s.x * b.z + s.y * b.w;
}

__device__ __forceinline__ void stage_v(const probe &P, int p, float *xs)
{
	const float4 *src = (const float4 *)(P.v + (size_t)p * N_IN);
	for (int i = threadIdx.x; i < N_IN / 4; i += THREADS)
		((float4 *)xs)[i] = __ldcg(src + i);
	__syncthreads();
}

/* v[p] into xs from the tagged words, polling each until phase p - 1 has written it */
__device__ __forceinline__ void stage_v_ll(const probe &P, int p, float *xs)
{
	if (p == 0) {
		stage_v(P, p, xs);
		return;
	}
	const unsigned long long *src = P.ll + (size_t)p * N_IN;
	unsigned long long x[N_IN / THREADS] = {};
	bool ready;
	do { /* every missing word asked for at once, then checked */
#pragma unroll
		for (int k = 0; k < N_IN / THREADS; k++)
			if ((unsigned)(x[k] >> 32) != (unsigned)p)
				asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(x[k]) : "l"(src + threadIdx.x + k * THREADS) : "memory");
		ready = true;
#pragma unroll
		for (int k = 0; k < N_IN / THREADS; k++)
			ready = ready && (unsigned)(x[k] >> 32) == (unsigned)p;
	} while (!ready);
#pragma unroll
	for (int k = 0; k < N_IN / THREADS; k++)
		xs[threadIdx.x + k * THREADS] = __uint_as_float((unsigned)x[k]);
	__syncthreads();
}

__device__ __forceinline__ void store_row(const probe &P, int p, int r, float acc)
{
	acc = cu_warp_sum(acc);
	if ((threadIdx.x & 31) == 0)
		for (int i = r; i < N_IN; i += P.rows) { /* rows < N_IN: the vector repeats */
			float y = tanhf(acc);
			P.v[(size_t)(p + 1) * N_IN + i] = y;
			if (P.ll)
				asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(P.ll + (size_t)(p + 1) * N_IN + i),
					     "l"((unsigned long long)(p + 1) << 32 | __float_as_uint(y))
					     : "memory");
		}
}

/* row r (local to the block) of phase p: from registers k, or from global/shared memory row */
__device__ __forceinline__ float row_dot_regs(const uint4 *k, const float *xs)
{
	int lane = threadIdx.x & 31;
	float acc = 0;
#pragma unroll
	for (int c = 0; c < CHUNKS; c++)
		acc += dot8(k[c], xs + 8 * (lane + 32 * c));
	return acc;
}

__device__ __forceinline__ void row_load(uint4 *k, const bf16 *row)
{
	int lane = threadIdx.x & 31;
#pragma unroll
	for (int c = 0; c < CHUNKS; c++)
		k[c] = __ldcs((const uint4 *)row + lane + 32 * c);
}

__device__ __forceinline__ const bf16 *block_rows(const probe &P, int p, int *n)
{
	int r0 = blockIdx.x * P.rows_block;
	*n = max(0, min(P.rows_block, P.rows - r0));
	if (P.spread)
		return P.w + ((size_t)(p % P.sets) * gridDim.x + blockIdx.x) * P.spread;
	return P.w + ((size_t)(p % P.sets) * P.rows + r0) * N_IN;
}

enum { W_AFTER, W_REGS, W_SMEM, W_SMEM_ROWS, W_L2, W_REGS_TMA, W_REGS_LL, W_REGS_CLB };

/* one phase as one kernel; MIN_BLOCKS: blocks an SM the registers must allow (2: the next
 * phase's kernel fits beside this one) */
template <int MODE, int MIN_BLOCKS>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS) k_phase(probe P, int p)
{
	extern __shared__ __align__(16) unsigned char sm[];
	float *xs = (float *)sm;
	uint4 *ws = (uint4 *)(sm + N_IN * 4);
	__shared__ uint64_t bar;
	int n, warp = threadIdx.x >> 5;
	const bf16 *w = block_rows(P, p, &n);
	uint4 k[2][CHUNKS];
	cu_pdl_trigger();
	if (MODE == W_REGS || MODE == W_REGS_TMA || MODE == W_REGS_LL || MODE == W_REGS_CLB)
#pragma unroll
		for (int j = 0; j < 2; j++)
			if (2 * warp + j < n)
				row_load(k[j], w + (size_t)(2 * warp + j) * N_IN);
	if (MODE == W_SMEM && threadIdx.x == 0 && n) {
		mbar_init(&bar);
		bulk_load(ws, w, n * N_IN * 2, &bar);
	}
	if (MODE == W_SMEM_ROWS) { /* a bulk copy a row, issued by one lane of each warp */
		if (threadIdx.x == 0)
			mbar_init(&bar);
		__syncthreads();
		if (threadIdx.x == 0)
			asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(cu_smem_addr(&bar)),
				     "r"(n * N_IN * 2)
				     : "memory");
		__syncthreads();
		if ((threadIdx.x & 31) == 0)
			for (int r = 2 * warp; r < 2 * warp + 2 && r < n; r++)
				asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
						     cu_smem_addr(ws + r * (N_IN / 8))),
					     "l"(w + (size_t)r * N_IN), "r"(N_IN * 2), "r"(cu_smem_addr(&bar))
					     : "memory");
	}
	if (MODE == W_L2 && threadIdx.x == 0 && p + 1 < P.phases) {
		int n1;
		const bf16 *w1 = block_rows(P, p + 1, &n1);
		if (n1)
			prefetch_l2(w1, n1 * N_IN * 2);
	}
	if (MODE == W_REGS_TMA) {
		if (threadIdx.x == 0)
			mbar_init(&bar);
		__syncthreads();
	}
	if (MODE != W_REGS_LL)
		cu_pdl_wait();
	if (MODE == W_REGS_LL) {
		stage_v_ll(P, p, xs);
	} else if (MODE == W_REGS_TMA) { /* the vector by the copy engine: not queued behind the weights' loads */
		if (threadIdx.x == 0)
			bulk_load(xs, P.v + (size_t)p * N_IN, N_IN * 4, &bar);
		mbar_wait(&bar, 0);
	} else {
		stage_v(P, p, xs);
	}
	if ((MODE == W_SMEM || MODE == W_SMEM_ROWS) && n)
		mbar_wait(&bar, 0);
#pragma unroll
	for (int j = 0; j < 2; j++) {
		int r = 2 * warp + j;
		if (r >= n)
			continue;
		if (MODE == W_AFTER || MODE == W_L2)
			row_load(k[j], w + (size_t)r * N_IN);
		if (MODE == W_SMEM || MODE == W_SMEM_ROWS)
#pragma unroll
			for (int c = 0; c < CHUNKS; c++)
				k[j][c] = ws[r * (N_IN / 8) + (threadIdx.x & 31) + 32 * c];
		store_row(P, p, blockIdx.x * P.rows_block + r, row_dot_regs(k[j], xs));
	}
	if (MODE == W_REGS_CLB) /* the cluster's blocks have each other's stores */
		asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

/* a kernel a phase in clusters of cl blocks (grid a multiple of cl) */
static cudaError_t launch_cluster(cudaStream_t s, bool pdl, int cl, void (*k)(probe, int), unsigned grid, size_t smem,
				  probe P, int p)
{
	cudaLaunchAttribute at[2];
	int n = 0;
	if (pdl) {
		at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
		at[n++].val.programmaticStreamSerializationAllowed = 1;
	}
	at[n].id = cudaLaunchAttributeClusterDimension;
	at[n].val.clusterDim.x = cl, at[n].val.clusterDim.y = 1, at[n].val.clusterDim.z = 1;
	n++;
	cudaLaunchConfig_t cfg = {};
	cfg.gridDim = grid;
	cfg.blockDim = THREADS;
	cfg.dynamicSmemBytes = smem;
	cfg.stream = s;
	cfg.attrs = at;
	cfg.numAttrs = n;
	return cudaLaunchKernelEx(&cfg, k, P, p);
}

__global__ void k_empty(probe P, int p)
{
	cu_pdl_trigger();
	cu_pdl_wait();
}

/* every phase in one kernel, one block an SM; WEIGHTS: the next phase's slice bulk-copied into
 * the other of two shared buffers while this phase computes */
template <bool WEIGHTS>
__global__ void __launch_bounds__(THREADS, 1) k_persist(probe P)
{
	extern __shared__ __align__(16) unsigned char sm[];
	float *xs = (float *)sm;
#define WS(b) ((uint4 *)(sm + N_IN * 4 + (size_t)(b) * MAX_ROWS_BLOCK * N_IN * 2))
	__shared__ uint64_t bar[2];
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n;
	block_rows(P, 0, &n);
	if (WEIGHTS && threadIdx.x == 0 && n) {
		mbar_init(&bar[0]);
		mbar_init(&bar[1]);
		bulk_load(WS(0), block_rows(P, 0, &n), n * N_IN * 2, &bar[0]);
	}
	for (int p = 0; p < P.phases; p++) {
		/* buffer (p + 1) & 1 was last read in phase p - 1, before that phase's final barrier */
		if (WEIGHTS && threadIdx.x == 0 && n && p + 1 < P.phases)
			bulk_load(WS((p + 1) & 1), block_rows(P, p + 1, &n), n * N_IN * 2, &bar[(p + 1) & 1]);
		if (p > 0) { /* every block has written phase p - 1 */
			if (threadIdx.x == 0) {
				unsigned want = (unsigned)p * gridDim.x, got;
				do
					asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(got) : "l"(P.count) : "memory");
				while (got < want);
			}
			__syncthreads();
		}
		stage_v(P, p, xs);
		if (WEIGHTS && n)
			mbar_wait(&bar[p & 1], (p >> 1) & 1);
#pragma unroll
		for (int j = 0; WEIGHTS && j < 2; j++) {
			int r = 2 * warp + j;
			if (r >= n)
				continue;
			float acc = 0;
#pragma unroll
			for (int c = 0; c < CHUNKS; c++)
				acc += dot8(WS(p & 1)[r * (N_IN / 8) + lane + 32 * c], xs + 8 * (lane + 32 * c));
			store_row(P, p, blockIdx.x * P.rows_block + r, acc);
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			__threadfence();
			asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(P.count) : "memory");
		}
	}
}

#define MAX_DEPTH 16
#define RING_FIT (-1) /* a stream way's ring as deep as shared memory allows */

/* phase p's rows of this block into buf, counted on bar: TMA, a bulk copy a row by warp 0's
 * lanes (bar expects one arrival); else every thread's 16-byte cp.async, each thread arriving
 * when its copies land (bar expects THREADS) */
template <bool TMA>
__device__ __forceinline__ void ring_fill(const probe &P, int p, uint4 *buf, uint64_t *bar)
{
	int n, lane = threadIdx.x & 31;
	const bf16 *w = block_rows(P, p, &n);
	if (!TMA) {
		for (int i = threadIdx.x; i < n * (N_IN / 8); i += THREADS)
			cu_cp16(buf + i, (const uint4 *)w + i, true);
		asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(cu_smem_addr(bar)) : "memory");
		return;
	}
	if (threadIdx.x >= 32)
		return;
	if (lane == 0)
		asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(cu_smem_addr(bar)), "r"(n * N_IN * 2)
			     : "memory");
	__syncwarp();
	asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* the buffer's last reads were generic */
	for (int r = lane; r < n; r += 32)
		asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
				     cu_smem_addr(buf + r * (N_IN / 8))),
			     "l"(w + (size_t)r * N_IN), "r"(N_IN * 2), "r"(cu_smem_addr(bar))
			     : "memory");
}

/* every phase in one kernel, one block an SM, the weights of P.depth phases in flight */
template <bool TMA, bool LL, bool WEIGHTS = true>
__global__ void __launch_bounds__(THREADS, 1) k_stream(probe P)
{
	extern __shared__ __align__(16) unsigned char sm[];
	float *xs = (float *)sm;
	uint4 *ring = (uint4 *)(sm + N_IN * 4);
	__shared__ uint64_t bar[MAX_DEPTH];
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n, D = P.depth;
	size_t slot = (size_t)P.rows_block * (N_IN / 8);
	block_rows(P, 0, &n);
	if (!WEIGHTS) { /* the hand-over alone: each row's value passed on */
		for (int p = 0; p < P.phases; p++) {
			stage_v_ll(P, p, xs);
			for (int r = 2 * warp; r < 2 * warp + 2 && r < n; r++)
				store_row(P, p, blockIdx.x * P.rows_block + r, lane ? 0.0f : xs[blockIdx.x * P.rows_block + r]);
			__syncthreads();
		}
		return;
	}
	if (threadIdx.x < D) {
		asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(cu_smem_addr(&bar[threadIdx.x])), "r"(TMA ? 1 : THREADS)
			     : "memory");
		asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
	}
	__syncthreads();
	if (n)
		for (int q = 0; q < D && q < P.phases; q++)
			ring_fill<TMA>(P, q, ring + q * slot, &bar[q]);
	for (int p = 0; p < P.phases; p++) {
		int b = p % D;
		if (p > 0 && !LL) {
			if (threadIdx.x == 0) {
				unsigned want = (unsigned)p * gridDim.x, got;
				do
					asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(got) : "l"(P.count) : "memory");
				while (got < want);
			}
			__syncthreads();
		}
		if (LL)
			stage_v_ll(P, p, xs);
		else
			stage_v(P, p, xs);
		if (n)
			mbar_wait(&bar[b], (p / D) & 1);
#pragma unroll
		for (int j = 0; j < 2; j++) {
			int r = 2 * warp + j;
			if (r >= n)
				continue;
			const uint4 *wr = ring + b * slot + r * (N_IN / 8);
			float acc = 0;
#pragma unroll
			for (int c = 0; c < CHUNKS; c++)
				acc += dot8(wr[lane + 32 * c], xs + 8 * (lane + 32 * c));
			store_row(P, p, blockIdx.x * P.rows_block + r, acc);
		}
		__syncthreads(); /* buffer b and xs are read */
		if (threadIdx.x == 0 && !LL) {
			__threadfence();
			asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(P.count) : "memory");
		}
		if (n && p + D < P.phases)
			ring_fill<TMA>(P, p + D, ring + b * slot, &bar[b]);
	}
}

__global__ void k_fill(bf16 *w, size_t n, float scale)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull;
		h ^= h >> 29;
		h *= 0xBF58476D1CE4E5B9ull;
		h ^= h >> 32;
		w[i] = __float2bfloat16(((float)(h & 0xffffff) / 8388608.0f - 1.0f) * scale);
	}
}

static int n_sm;

static float time_graph(cudaGraphExec_t g, cudaStream_t s, int reps)
{
	cudaEvent_t a, b;
	CHECK(cudaEventCreate(&a));
	CHECK(cudaEventCreate(&b));
	CHECK(cudaGraphLaunch(g, s)); /* warm-up */
	CHECK(cudaStreamSynchronize(s));
	float t[32], best;
	for (int i = 0; i < reps; i++) {
		CHECK(cudaEventRecord(a, s));
		CHECK(cudaGraphLaunch(g, s));
		CHECK(cudaEventRecord(b, s));
		CHECK(cudaEventSynchronize(b));
		CHECK(cudaEventElapsedTime(&t[i], a, b));
	}
	for (int i = 1; i < reps; i++) /* sort for the median */
		for (int j = i; j > 0 && t[j] < t[j - 1]; j--)
			best = t[j], t[j] = t[j - 1], t[j - 1] = best;
	cudaEventDestroy(a);
	cudaEventDestroy(b);
	return t[reps / 2];
}

int main(int argc, char **argv)
{
	int phases = argc > 1 ? atoi(argv[1]) : 256, rows = argc > 2 ? atoi(argv[2]) : 2048;
	int sets = argc > 3 ? atoi(argv[3]) : phases;
	long spread_kb = argc > 4 ? atol(argv[4]) : 0;
	cudaDeviceProp prop;
	CHECK(cudaGetDeviceProperties(&prop, 0));
	n_sm = prop.multiProcessorCount;
	if (phases < 2 || phases > 4096 || rows < 1 || rows > n_sm * MAX_ROWS_BLOCK || sets < 1 || sets > phases ||
	    spread_kb < 0 || (spread_kb && spread_kb * 1024 < MAX_ROWS_BLOCK * N_IN * 2) || spread_kb > (1 << 20)) {
		fprintf(stderr, "decode_probe: PHASES 2..4096, ROWS 1..%d, SETS 1..PHASES, SPREAD_KB 0 or 64..2^20\n",
			n_sm * MAX_ROWS_BLOCK);
		return 2;
	}
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	probe P = {};
	P.rows = rows;
	P.phases = phases;
	P.sets = sets;
	P.rows_block = (rows + n_sm - 1) / n_sm;
	P.rows_block = (P.rows_block + 1) & ~1; /* whole warps' pairs */
	int grid = (rows + P.rows_block - 1) / P.rows_block;
	P.spread = (size_t)spread_kb * 512; /* bf16 elements */
	size_t wn = P.spread ? (size_t)sets * grid * P.spread : (size_t)sets * rows * N_IN;
	bf16 *w;
	CHECK(cudaMalloc(&w, wn * 2));
	CHECK(cudaMalloc(&P.v, (size_t)(phases + 1) * N_IN * 4));
	CHECK(cudaMalloc(&P.count, 4));
	k_fill<<<4 * n_sm, 256, 0, s>>>(w, wn, 1.7f / sqrtf((float)N_IN));
	P.w = w;
	float *v0 = (float *)malloc(N_IN * 4), *ref = (float *)malloc(N_IN * 4), *got = (float *)malloc(N_IN * 4);
	for (int i = 0; i < N_IN; i++)
		v0[i] = sinf(0.37f * i);

	double bw = probe_copy_bw(s); /* in the same run */
	cudaGraph_t gr;
	cudaGraphExec_t ge;

	size_t smem_phase = N_IN * 4 + (size_t)P.rows_block * N_IN * 2;
	size_t smem_persist = N_IN * 4 + 2 * (size_t)MAX_ROWS_BLOCK * N_IN * 2;
	CHECK(cudaFuncSetAttribute(k_phase<W_SMEM, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_phase));
	CHECK(cudaFuncSetAttribute(k_phase<W_SMEM_ROWS, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_phase));
	CHECK(cudaFuncSetAttribute(k_persist<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_persist));
	CHECK(cudaFuncSetAttribute(k_persist<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_persist));
	size_t ring_slot = (size_t)P.rows_block * N_IN * 2;
	int max_depth = (int)((prop.sharedMemPerBlockOptin - N_IN * 4 - 1024) / ring_slot);
	max_depth = max_depth > MAX_DEPTH ? MAX_DEPTH : max_depth;
	CHECK(cudaFuncSetAttribute(k_stream<true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				   (int)(N_IN * 4 + max_depth * ring_slot)));
	CHECK(cudaFuncSetAttribute(k_stream<false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				   (int)(N_IN * 4 + max_depth * ring_slot)));
	CHECK(cudaFuncSetAttribute(k_stream<true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				   (int)(N_IN * 4 + max_depth * ring_slot)));

	printf("%s, %d SMs; copy bandwidth %.2f TB/s; %d phases of %d x %d bf16 (%.2f MB a phase, %d blocks of %d rows), "
	       "%d weight sets in %.0f MB (a block's rows %ld KB from the next's; 0: together)\n",
	       prop.name, n_sm, bw / 1e12, phases, rows, N_IN, rows * N_IN * 2 / 1e6, grid, P.rows_block, sets, wn * 2 / 1e6,
	       spread_kb);
	printf("%-10s %-5s %10s %12s %10s %s\n", "way", "pdl", "us/phase", "GB/s", "x floor", "check");
	double floor_us = rows * N_IN * 2.0 / bw * 1e6;
	struct {
		const char *name;
		int kind; /* 0 empty, 1 phase kernels, 2 persistent */
		void (*k)(probe, int);
		void (*kp)(probe);
		size_t smem;
		bool weights, ll; /* streams weights (its final vector is checked); hands over by LL */
		int depth;        /* stream ways (a ring of weights): its depth, RING_FIT as many as fit; else 0 */
		int cluster;      /* kernel-a-phase ways: blocks a cluster (0: none) */
	} ways[] = {
		{"launch", 0, k_empty, NULL, 0, false, false, 0},
		{"after", 1, k_phase<W_AFTER, 1>, NULL, N_IN * 4, true, false, 0},
		{"regs", 1, k_phase<W_REGS, 1>, NULL, N_IN * 4, true, false, 0},
		{"regs2", 1, k_phase<W_REGS, 2>, NULL, N_IN * 4, true, false, 0},
		{"regstma", 1, k_phase<W_REGS_TMA, 1>, NULL, N_IN * 4, true, false, 0},
		{"smem", 1, k_phase<W_SMEM, 1>, NULL, smem_phase, true, false, 0},
		{"smemrows", 1, k_phase<W_SMEM_ROWS, 1>, NULL, smem_phase, true, false, 0},
		{"l2", 1, k_phase<W_L2, 1>, NULL, N_IN * 4, true, false, 0},
		{"persist", 2, NULL, k_persist<true>, smem_persist, true, false, 0},
		{"persist0", 2, NULL, k_persist<false>, smem_persist, false, false, 0},
		{"stream", 2, NULL, k_stream<true, false>, 0, true, false, 2},
		{"stream", 2, NULL, k_stream<true, false>, 0, true, false, 3},
		{"stream", 2, NULL, k_stream<true, false>, 0, true, false, RING_FIT},
		{"streamcp", 2, NULL, k_stream<false, false>, 0, true, false, 2},
		{"streamcp", 2, NULL, k_stream<false, false>, 0, true, false, 3},
		{"streamcp", 2, NULL, k_stream<false, false>, 0, true, false, RING_FIT},
		{"regsll", 1, k_phase<W_REGS_LL, 1>, NULL, N_IN * 4, true, true, 0},
		{"streamll", 2, NULL, k_stream<true, true>, 0, true, true, 3},
		{"streamll", 2, NULL, k_stream<true, true>, 0, true, true, RING_FIT},
		{"ll0", 2, NULL, k_stream<true, true, false>, N_IN * 4, false, true, 0},
		{"regscl2", 1, k_phase<W_REGS, 1>, NULL, N_IN * 4, true, false, 0, 2},
		{"regscl4", 1, k_phase<W_REGS, 1>, NULL, N_IN * 4, true, false, 0, 4},
		{"regscl8", 1, k_phase<W_REGS, 1>, NULL, N_IN * 4, true, false, 0, 8},
		{"regsclb2", 1, k_phase<W_REGS_CLB, 1>, NULL, N_IN * 4, true, false, 0, 2},
		{"regsclb8", 1, k_phase<W_REGS_CLB, 1>, NULL, N_IN * 4, true, false, 0, 8},
	};
	unsigned long long *llbuf;
	CHECK(cudaMalloc(&llbuf, (size_t)(phases + 1) * N_IN * 8));
	int bad = 0;
	bool have_ref = false;
	for (size_t wi = 0; wi < sizeof(ways) / sizeof(ways[0]); wi++) {
		bool stream = ways[wi].depth != 0, ll = ways[wi].ll;
		if (ways[wi].cluster && grid % ways[wi].cluster)
			continue;
		if (stream) {
			P.depth = ways[wi].depth == RING_FIT ? max_depth : ways[wi].depth;
			if (P.depth > max_depth)
				continue;
			ways[wi].smem = N_IN * 4 + P.depth * ring_slot;
		}
		for (int pdl = 0; pdl < (ways[wi].kind == 2 ? 1 : 2); pdl++) {
			CHECK(cudaMemcpyAsync(P.v, v0, N_IN * 4, cudaMemcpyHostToDevice, s));
			CHECK(cudaMemsetAsync(P.v + N_IN, 0, (size_t)phases * N_IN * 4, s));
			CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
			P.ll = ll ? llbuf : NULL;
			if (ll) /* no tags left by the last replay */
				CHECK(cudaMemsetAsync(llbuf, 0, (size_t)(phases + 1) * N_IN * 8, s));
			if (ways[wi].kind == 2) {
				CHECK(cudaMemsetAsync(P.count, 0, 4, s));
				ways[wi].kp<<<grid, THREADS, ways[wi].smem, s>>>(P);
				CHECK(cudaGetLastError());
			} else {
				for (int p = 0; p < phases; p++)
					CHECK(ways[wi].cluster
						      ? launch_cluster(s, pdl, ways[wi].cluster, ways[wi].k, grid, ways[wi].smem, P, p)
						      : cu_launch_on(s, pdl, ways[wi].k, ways[wi].kind ? grid : n_sm, THREADS,
								     ways[wi].smem, P, p));
			}
			CHECK(cudaStreamEndCapture(s, &gr));
			CHECK(cudaGraphInstantiate(&ge, gr, 0));
			float t = time_graph(ge, s, 15);
			CHECK(cudaMemcpy(got, P.v + (size_t)phases * N_IN, N_IN * 4, cudaMemcpyDeviceToHost));
			const char *check = "-";
			bool weights = ways[wi].weights;
			if (weights) {
				if (!have_ref) {
					memcpy(ref, got, N_IN * 4);
					have_ref = true;
				}
				double e = 0;
				for (int i = 0; i < N_IN; i++)
					e = fmax(e, fabs((double)got[i] - ref[i]));
				check = e <= 1e-5 ? "same" : "DIFFERS";
				bad += e > 1e-5;
			}
			double us = t * 1e3 / phases;
			char name[32];
			if (stream) /* the name and the ring's depth */
				snprintf(name, sizeof name, "%s%d", ways[wi].name, P.depth);
			else
				snprintf(name, sizeof name, "%s", ways[wi].name);
			printf("%-10s %-5s %10.2f %12.0f %10.2f %s\n", name, ways[wi].kind == 2 ? "-" : pdl ? "yes" : "no", us,
			       weights ? rows * N_IN * 2.0 / us / 1e3 : 0.0, weights ? us / floor_us : 0.0, check);
			cudaGraphExecDestroy(ge);
			cudaGraphDestroy(gr);
		}
	}
	printf("floor a phase (bytes / copy bandwidth): %.2f us\n", floor_us);
	cudaFree(w);
	cudaFree(P.v);
	cudaFree(P.count);
	cudaFree(llbuf);
	free(v0);
	free(ref);
	free(got);
	return bad ? 1 : 0;
}
