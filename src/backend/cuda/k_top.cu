/*
 * k_top.cu - the m largest logits on the device, so that sampling moves m (id, value) pairs to
 * the host instead of the whole vocabulary (contract: toast_backend_ops.top); and the picks
 * (toast_backend_ops.pick), where only a token crosses, written by the device into pinned
 * memory and into the next step's input: the largest (k_pick), the sampler's draw over the
 * top 256 at most, penalised or not (k_pick_draw), or over every logit (top-k 0 or over 256:
 * k_pick_wide): draw.h's arithmetic, so the same token as the host's draw.
 *
 * Each value becomes one 64-bit key: the float's bits made order-preserving in the high word
 * (-0 as +0, NaN below everything), the complement of the index in the low word. Keys are then
 * all distinct and "larger key" is exactly "larger value, or the same value at a lower index",
 * so the top m is one well-defined set. m = 1 (greedy decoding) needs no sort: the largest key,
 * by a max per block and a last block's (k_pick). Otherwise runs of R = 32, 64, 128 or 256 keys
 * (the least R >= m) live in a warp's registers, C = R / 32 a lane, sorted by bitonic networks
 * of shuffles and in-register exchanges; a block keeps the best run of its 2048 (or 4096)
 * logits by halving its warps' runs, four barriers, and the last block to finish merges the
 * blocks' runs: one launch. (Block-wide bitonic sorts of 2048 keys, staged until one block was
 * left, took 66 barriers of 1024 threads a stage: the top 20 cost a decode step 16-29 us more
 * than the top 1, 8-13 us as runs; a draw from the top 40 ~50 us, as stages.)
 *
 * A repetition penalty is applied as the runs are made (each block marks the tokens seen in its
 * chunk, top_seen_bits), so the run is of the penalised logits over the whole vocabulary: for a
 * draw from every logit (n_top 0), and for one from the n_top largest where a penalty over 1
 * leaves the k drawn from among them; otherwise (a penalty under 1, or no room for the tokens
 * seen) the last block penalises the n_top largest and sorts them again, as toast_draw_pick does.
 */
#include "backend/cuda/cuda_common.cuh"

#define TOP_BLOCK 1024 /* k_pick */

__device__ __forceinline__ unsigned long long top_key(float v, int i)
{
	return toast_draw_key(toast_draw_order(v), i);
}

/* a key's value (top_key's inverse; -0 comes back as +0) */
__host__ __device__ __forceinline__ float top_key_val(unsigned long long key)
{
	unsigned o = (unsigned)(key >> 32), u = (o & 0x80000000u) ? (o & 0x7fffffffu) : ~o;
	float v;
	memcpy(&v, &u, sizeof(v));
	return v;
}

/* ---- runs: R = 32 * C keys sorted largest first, key e in lane e % 32, register e / 32 ---- */

#define TOP_RWARPS 16 /* warps a block */

/* keys a block takes at a time: P = max(C, 4) a lane (P / C runs a warp) */
__host__ __device__ constexpr int top_chunk(int C)
{
	return TOP_RWARPS * 32 * (C > 4 ? C : 4);
}

/* one compare-exchange step of a bitonic network over run v, at distance j: key e ends the larger
 * of the pair where (e & j) == 0, if (e & k) == 0 (k 0: everywhere), else the smaller */
template <int C>
__device__ __forceinline__ void top_run_step(unsigned long long (&v)[C], int lane, int k, int j)
{
	if (j < 32) {
#pragma unroll
		for (int c = 0; c < C; c++) {
			unsigned long long o = __shfl_xor_sync(0xffffffffu, v[c], j);
			bool big = ((lane & j) == 0) == (((c * 32 + lane) & k) == 0);
			v[c] = big ? (v[c] > o ? v[c] : o) : (v[c] < o ? v[c] : o);
		}
	} else {
#pragma unroll
		for (int c = 0; c < C; c++) {
			int c2 = c | (j >> 5);
			if (c2 == c)
				continue;
			unsigned long long hi = v[c] > v[c2] ? v[c] : v[c2], lo = v[c] > v[c2] ? v[c2] : v[c];
			bool desc = ((c * 32 + lane) & k) == 0;
			v[c] = desc ? hi : lo;
			v[c2] = desc ? lo : hi;
		}
	}
}

/* run v (any order) sorted, largest first: a bitonic sort */
template <int C>
__device__ __forceinline__ void top_run_sort(unsigned long long (&v)[C], int lane)
{
#pragma unroll
	for (int k = 2; k <= 32 * C; k <<= 1)
#pragma unroll
		for (int j = k >> 1; j > 0; j >>= 1)
			top_run_step<C>(v, lane, k == 32 * C ? 0 : k, j);
}

/* the best R of runs a and b (each sorted) into a: a's key e against b's key R - 1 - e keeps the
 * best R as a bitonic sequence, which log2(R) steps sort */
template <int C>
__device__ __forceinline__ void top_run_merge(unsigned long long (&a)[C], const unsigned long long (&b)[C], int lane)
{
#pragma unroll
	for (int c = 0; c < C; c++) {
		unsigned long long r = __shfl_sync(0xffffffffu, b[C - 1 - c], 31 - lane);
		a[c] = a[c] > r ? a[c] : r;
	}
#pragma unroll
	for (int j = 16 * C; j > 0; j >>= 1)
		top_run_step<C>(a, lane, 0, j);
}

/* the best run of keys [i0, i0 + top_chunk(C)) into b, in warp 0 (key(i, q): key i, 0 past the
 * end, the lane's q-th of its P; SORTED: every R from i0 on are a run already); by the block,
 * s a run per warp */
template <int C, bool SORTED, typename F>
__device__ __forceinline__ void top_run_chunk(F key, int i0, unsigned long long *s, unsigned long long (&b)[C])
{
	constexpr int P = C > 4 ? C : 4, R = 32 * C;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, i = i0 + warp * 32 * P + lane;
	unsigned long long v[C];
#pragma unroll
	for (int u = 0; u < P / C; u++) {
#pragma unroll
		for (int c = 0; c < C; c++)
			v[c] = key(i + 32 * (u * C + c), u * C + c);
		if (!SORTED)
			top_run_sort<C>(v, lane);
		if (u == 0)
#pragma unroll
			for (int c = 0; c < C; c++)
				b[c] = v[c];
		else
			top_run_merge<C>(b, v, lane);
	}
#pragma unroll
	for (int c = 0; c < C; c++)
		s[warp * R + c * 32 + lane] = b[c];
	__syncthreads();
#pragma unroll
	for (int h = TOP_RWARPS / 2; h > 0; h >>= 1) {
		if (warp < h) {
#pragma unroll
			for (int c = 0; c < C; c++)
				v[c] = s[(warp + h) * R + c * 32 + lane];
			top_run_merge<C>(b, v, lane);
		}
		__syncthreads(); /* every read of this round before the writes */
		if (warp < h)
#pragma unroll
			for (int c = 0; c < C; c++)
				s[warp * R + c * 32 + lane] = b[c];
		__syncthreads();
	}
}

/* the tokens seen lately, for a draw's penalty (toast_draw.recent, by value) */
struct top_recent {
	int32_t id[TOAST_TOP_MAX];
};

/* a penalty applied while the runs are made (penalty != 1: toast_draw_seen's tokens, the last
 * n_recent of last_n in r, oldest first, and with prev the pending pick's, its key in device
 * memory) */
struct top_pen {
	float penalty;
	int n_recent, last_n;
	bool prev;
	const int32_t *r;
	const unsigned long long *prev_key;
};

/* the bits of the tokens pen counts as seen among [c0, c0 + N), into seen (shared memory), by
 * the block */
template <int N>
__device__ __forceinline__ void top_seen_bits(struct top_pen pen, int c0, unsigned *seen)
{
	for (int j = threadIdx.x; j < N / 32; j += blockDim.x)
		seen[j] = 0;
	__syncthreads();
	int j0 = pen.prev && pen.n_recent >= pen.last_n ? 1 : 0; /* (prev pushes the oldest out) */
	int nw = pen.n_recent - j0 + (pen.prev ? 1 : 0);
	for (int j = threadIdx.x; j < nw; j += blockDim.x) {
		int32_t id = j0 + j < pen.n_recent ? pen.r[j0 + j] : cu_key_id(__ldcg(pen.prev_key));
		unsigned o = (unsigned)(id - c0);
		if (o < (unsigned)N)
			atomicOr(&seen[o >> 5], 1u << (o & 31));
	}
	__syncthreads();
}

/* the best run of x[0, n) in warp 0 of the last block to finish, true there: each block puts
 * the best run of its chunk into part; the last (a ticket in *counter, zeroed by its caller)
 * merges them. With a penalty (pen.penalty != 1), the keys are of the penalised logits
 * (top_seen_bits): every token is in one chunk, so the run is the best of all the penalised
 * logits, exactly. */
template <int C>
__device__ __forceinline__ bool top_runs_last(const float *x, int n, struct top_pen pen, unsigned long long *part,
					      unsigned *counter, unsigned long long *s, unsigned *seen,
					      unsigned long long (&best)[C])
{
	constexpr int P = C > 4 ? C : 4, R = 32 * C;
	int lane = threadIdx.x & 31, c0 = blockIdx.x * top_chunk(C), i = c0 + (threadIdx.x >> 5) * 32 * P + lane;
	bool penal = pen.penalty != 1.0f;
	float v[P]; /* (loaded before the seen bits are made) */
#pragma unroll
	for (int q = 0; q < P; q++)
		v[q] = i + 32 * q < n ? x[i + 32 * q] : 0.0f;
	if (penal)
		top_seen_bits<top_chunk(C)>(pen, c0, seen);
	top_run_chunk<C, false>(
		[&](int j, int q) {
			if (j >= n)
				return 0ull;
			bool hit = penal && (seen[(j - c0) >> 5] >> ((j - c0) & 31) & 1u);
			return top_key(hit ? toast_draw_penalize(v[q], pen.penalty) : v[q], j);
		},
		c0, s, best);
	if (threadIdx.x < 32)
#pragma unroll
		for (int c = 0; c < C; c++)
			part[blockIdx.x * R + c * 32 + lane] = best[c];
	if (!cu_last_block(counter))
		return false;
	int tot = gridDim.x * R;
	unsigned long long b[C];
	for (int i0 = 0; i0 < tot; i0 += top_chunk(C)) {
		top_run_chunk<C, true>([&](int j, int) { return j < tot ? __ldcg(part + j) : 0ull; }, i0, s, b);
		if (i0 == 0)
#pragma unroll
			for (int c = 0; c < C; c++)
				best[c] = b[c];
		else
			top_run_merge<C>(best, b, lane); /* (warp 0's; 0 keys rank last) */
	}
	return true;
}

/* log2 of the runs' C for m keys (1, 2, 4, 8 keys a lane) */
static int top_ci(int m)
{
	return m <= 32 ? 0 : m <= 64 ? 1 : m <= 128 ? 2 : 3;
}

/* the keys the blocks' runs of n logits leave in part */
static size_t top_parts(int n, int C)
{
	return cu_blocks((size_t)n, top_chunk(C)) * 32 * (size_t)C;
}

/* the best m <= R keys of x[0, n) into out, best first (top_runs_last) */
template <int C>
__global__ void __launch_bounds__(TOP_RWARPS * 32) k_top_runs(const float *x, int n, int m, unsigned long long *part,
							       unsigned long long *out, unsigned *counter)
{
	__shared__ unsigned long long s[TOP_RWARPS * 32 * C];
	unsigned long long best[C];
	if (!top_runs_last<C>(x, n, (struct top_pen){1.0f}, part, counter, s, NULL, best) || threadIdx.x >= 32)
		return;
#pragma unroll
	for (int c = 0; c < C; c++)
		if (c * 32 + (int)threadIdx.x < m)
			out[c * 32 + threadIdx.x] = best[c];
	if (threadIdx.x == 0)
		*counter = 0;
}

__device__ __forceinline__ unsigned long long top_warp_max(unsigned long long v)
{
	for (int o = 16; o > 0; o >>= 1) {
		unsigned long long k = __shfl_xor_sync(0xffffffffu, v, o);
		v = k > v ? k : v;
	}
	return v;
}

/* the largest of each thread's key v over the block, in every thread */
__device__ __forceinline__ unsigned long long top_block_max(unsigned long long v)
{
	__shared__ unsigned long long w[32];
	return cu_block_reduce<unsigned long long, top_warp_max>(v, w, 0ull);
}

/* the thread's largest key of x over a grid stride */
__device__ __forceinline__ unsigned long long top_thread_max(const float *x, int n)
{
	unsigned long long best = 0;
	for (int i = blockIdx.x * TOP_BLOCK + threadIdx.x; i < n; i += gridDim.x * TOP_BLOCK) {
		unsigned long long k = top_key(x[i], i);
		best = k > best ? k : best;
	}
	return best;
}

/* where a pick's key goes: host (pinned memory the device writes directly: no copy after the
 * kernel), key (device memory, or NULL: where a later draw reads it as its prev), step (or
 * NULL: the one-token step {pos, 1, its token}, which a step begun by begin_step_pick reads, no
 * copy before it) */
struct pick_out {
	volatile unsigned long long *host;
	unsigned long long *key;
	int32_t *step;
	int pos;
};

/* a pick's end, by one thread of the last block: the key into o's places; the ticket zeroed */
__device__ __forceinline__ void pick_emit(unsigned long long key, struct pick_out o, unsigned *counter)
{
	*o.host = key;
	if (o.key)
		*o.key = key;
	if (o.step) {
		o.step[0] = o.pos;
		o.step[1] = 1;
		o.step[2] = cu_key_id(key);
	}
	if (counter)
		*counter = 0;
}

/* the largest key in one launch (a greedy pick, and top() of 1): each block's largest into
 * part; the last block (a ticket in *counter) the largest of them (pick_emit) */
__global__ void __launch_bounds__(TOP_BLOCK) k_pick(const float *x, int n, unsigned long long *part,
						     unsigned *counter, struct pick_out o)
{
	unsigned long long best = top_block_max(top_thread_max(x, n));
	if (threadIdx.x == 0)
		part[blockIdx.x] = best;
	if (!cu_last_block(counter))
		return;
	best = 0;
	for (int i = threadIdx.x; i < (int)gridDim.x; i += TOP_BLOCK) {
		unsigned long long k = __ldcg(part + i);
		best = k > best ? k : best;
	}
	best = top_block_max(best);
	if (threadIdx.x == 0)
		pick_emit(best, o, counter);
}

/* a drawn pick in one launch: the best run of R = 32 * C keys (top_runs_last; with scan, of the
 * penalised logits), of which the first d.n_top count; without scan, the penalty (r and prev_key:
 * the tokens seen) on them and the run sorted again; then the best or the draw d over the
 * d.top_k best that are not NaN, as the host makes it (toast_draw_pick), by one thread; key 0
 * (token 0) when all are NaN */
template <int C>
__global__ void __launch_bounds__(TOP_RWARPS * 32)
	k_pick_draw(const float *x, int n, struct toast_draw d, const __grid_constant__ struct top_recent r,
		    const unsigned long long *prev_key, bool scan, unsigned long long *part, unsigned *counter,
		    struct pick_out o)
{
	__shared__ unsigned long long s[TOP_RWARPS * 32 * C];
	__shared__ unsigned seen[top_chunk(C) / 32];
	__shared__ float p[32 * C];
	unsigned long long best[C];
	struct top_pen pen = {scan ? d.repeat_penalty : 1.0f, d.n_recent, d.last_n, d.prev, r.id, prev_key};
	if (!top_runs_last<C>(x, n, pen, part, counter, s, seen, best) || threadIdx.x >= 32)
		return;
	int lane = threadIdx.x, nv = 0;
	bool late = !scan && d.repeat_penalty != 1.0f;
	int32_t prev = late && d.prev ? cu_key_id(__ldcg(prev_key)) : -1;
#pragma unroll
	for (int c = 0; c < C; c++) {
		int32_t id = cu_key_id(best[c]);
		if (c * 32 + lane >= d.n_top)
			best[c] = 0;
		else if (late && (best[c] >> 32) != 0 && toast_draw_seen(&d, r.id, prev, id))
			best[c] = top_key(toast_draw_penalize(top_key_val(best[c]), d.repeat_penalty), id);
	}
	if (late)
		top_run_sort<C>(best, lane);
#pragma unroll
	for (int c = 0; c < C; c++) /* (NaN keys, o 0, rank last: the valid ones are a prefix) */
		nv += __popc(__ballot_sync(0xffffffffu, (best[c] >> 32) != 0));
	int k = d.temperature <= 0 ? (nv > 0) : d.top_k > 0 && d.top_k < nv ? d.top_k : nv;
	/* toast_draw_top's arithmetic, its exps a lane each: p = exp(v / temperature - max) */
	float pv[C], max = -INFINITY;
#pragma unroll
	for (int c = 0; c < C; c++) {
		pv[c] = top_key_val(best[c]) / d.temperature;
		max = c * 32 + lane < k && pv[c] > max ? pv[c] : max;
	}
	for (int o = 16; o > 0; o >>= 1)
		max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, o));
#pragma unroll
	for (int c = 0; c < C; c++)
		if (c * 32 + lane < k) {
			s[c * 32 + lane] = best[c];
			p[c * 32 + lane] = toast_draw_exp(pv[c] - max);
		}
	__syncwarp();
	if (lane == 0) {
		int pick = d.temperature > 0 && k > 0 ? toast_draw_tail(p, k, toast_draw_sum(p, k), d.top_p, d.min_p, d.u) : 0;
		pick_emit(k == 0 ? 0ull : s[pick], o, counter);
	}
}

/* ---- a draw from every logit (d.n_top 0; top_k 0 or over TOAST_TOP_MAX): toast_draw_wide's,
 * in one cooperative launch. Every block is resident at once, WIDE_THREADS threads with E logits
 * each (a block's chunk of WIDE_THREADS * E, a thread's E in a row, so that threads in order are
 * logits in order), kept in registers from the first phase to the last; the phases are parted
 * by grid barriers: the largest logit (the penalty applied as in k_pick_draw); with a top_k,
 * the candidates (three rounds of counts and the ties by index); the weights, their sum z and
 * the first round's digit sums; each round's digit found by every block from the grid's sums
 * (in d_pick, zeroed at the start) and the next round's sums; the kept weights, each block's
 * sum; then the block holding the token drawn finds it by its threads' prefix sums. */

#define WIDE_THREADS 1024
#define WIDE_BINS 2048 /* a round's digits at most (11 bits) */
/* d_pick as the draw's sums (zeroed by the kernel before its first barrier, up to WIDE_TIE): the
 * nucleus' three rounds of digit sums, z, the candidates' count, the top-k's three rounds of
 * counts; then a block's tied candidates, a block's kept weights */
#define WIDE_Z (3 * WIDE_BINS)
#define WIDE_N (WIDE_Z + 1)
#define WIDE_CNT (WIDE_N + 1)
#define WIDE_TIE (WIDE_CNT + 3 * WIDE_BINS)
#define WIDE_BSUM (WIDE_TIE + 1024)

/* a barrier of the whole grid (a cooperative launch: every block resident). *bar's top bit flips
 * once a barrier: block 0 adds 2^31 - (blocks - 1), every other block 1, and each waits until the
 * bit it arrived with has changed (one atomic a block, nothing to reset, as cooperative groups'
 * grid sync) */
__device__ __forceinline__ void wide_sync(unsigned *bar)
{
	__syncthreads();
	if (threadIdx.x == 0) {
		unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
		__threadfence();
		unsigned old = atomicAdd(bar, add);
		while (((old ^ *(volatile unsigned *)bar) & 0x80000000u) == 0)
			;
		__threadfence();
	}
	__syncthreads();
}

/* the sum of v over the block's threads before this one (in every thread), *total the block's
 * (sh: 32 words of shared memory; synchronises) */
__device__ __forceinline__ unsigned long long wide_scan(unsigned long long v, unsigned long long *sh,
							unsigned long long *total)
{
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	unsigned long long s = v;
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		unsigned long long t = __shfl_up_sync(0xffffffffu, s, o);
		s += lane >= o ? t : 0;
	}
	if (lane == 31)
		sh[warp] = s;
	__syncthreads();
	if (warp == 0) {
		unsigned long long w = sh[lane]; /* (WIDE_THREADS / 32 = 32 warps) */
#pragma unroll
		for (int o = 1; o < 32; o <<= 1) {
			unsigned long long t = __shfl_up_sync(0xffffffffu, w, o);
			w += lane >= o ? t : 0;
		}
		sh[lane] = w;
	}
	__syncthreads();
	unsigned long long before = (warp ? sh[warp - 1] : 0) + s - v;
	*total = sh[31];
	__syncthreads();
	return before;
}

/* the digit of nb at which the grid's sums (sums[nb], read from the top digit down, after
 * *above) first exceed cut; *above becomes the sum above it (every thread; sh: 34 words) */
__device__ __forceinline__ unsigned wide_digit(const unsigned long long *sums, int nb, unsigned long long cut,
					       unsigned long long *above, unsigned long long *sh)
{
	int t2 = 2 * (int)threadIdx.x;
	unsigned hi = (unsigned)(nb - 1 - t2); /* this thread's two digits: hi, hi - 1 */
	unsigned long long a = t2 < nb ? __ldcg(sums + hi) : 0, b = t2 + 1 < nb ? __ldcg(sums + hi - 1) : 0, tot;
	unsigned long long before = *above + wide_scan(a + b, sh, &tot);
	if (before <= cut && cut < before + a)
		sh[32] = hi, sh[33] = before;
	else if (before + a <= cut && cut < before + a + b)
		sh[32] = hi - 1, sh[33] = before + a;
	__syncthreads(); /* (exactly one thread writes: above <= cut < above + every sum) */
	*above = sh[33];
	return (unsigned)sh[32];
}

/* a round's sums: val (each thread's E; 0 adds nothing) of the orders ov that have the digits
 * found before (pre), by round rd's digit, added into the grid's (gsum) through the block's (s);
 * the caller's barrier then makes them whole */
template <int E>
__device__ __forceinline__ void wide_sums(const unsigned (&ov)[E], const unsigned long long (&val)[E], int rd,
					  unsigned pre, unsigned long long *gsum, unsigned long long *s)
{
	for (int j = threadIdx.x; j < WIDE_BINS; j += WIDE_THREADS)
		s[j] = 0;
	__syncthreads();
#pragma unroll
	for (int q = 0; q < E; q++)
		if (val[q] && toast_draw_has(ov[q], rd, pre))
			atomicAdd(&s[toast_draw_digit(ov[q], rd)], val[q]);
	__syncthreads();
	for (int j = threadIdx.x; j < WIDE_BINS; j += WIDE_THREADS)
		if (s[j])
			atomicAdd(gsum + j, s[j]);
}

/* the sum of what the blocks before this one left at part[b] (warp 0; in every thread after);
 * *all (when not NULL) the sum of every block's */
__device__ __forceinline__ unsigned long long wide_before(const unsigned long long *part, unsigned long long *sh,
							  unsigned long long *all)
{
	if (threadIdx.x < 32) {
		unsigned long long off = 0, tot = 0;
		for (int b = threadIdx.x; b < (int)(all ? gridDim.x : blockIdx.x); b += 32) {
			unsigned long long v = __ldcg(part + b);
			off += b < (int)blockIdx.x ? v : 0;
			tot += v;
		}
		for (int s = 16; s > 0; s >>= 1) {
			off += __shfl_xor_sync(0xffffffffu, off, s);
			tot += __shfl_xor_sync(0xffffffffu, tot, s);
		}
		if (threadIdx.x == 0)
			sh[0] = off, sh[1] = tot;
	}
	__syncthreads();
	unsigned long long off = sh[0];
	if (all)
		*all = sh[1];
	__syncthreads();
	return off;
}

/* the order at which val's sums (the grid's, from the top order down) first exceed cut, by three
 * rounds of digits, each round's sums at gs + rd * WIDE_BINS made whole by a barrier. Round 0's
 * are summed here when f >= 0, and cut is then toast_draw_cut(f, *z) once they are whole; else
 * they are the caller's, whole. *above becomes the sum above the order found. */
template <int E>
__device__ __forceinline__ unsigned wide_search(const unsigned (&ov)[E], const unsigned long long (&val)[E],
						unsigned long long *gs, double f, const unsigned long long *z,
						unsigned long long cut, unsigned long long *above,
						unsigned long long *sums, unsigned long long *sh, unsigned *bar)
{
	unsigned o = 0;
	*above = 0;
	for (int rd = 0; rd < 3; rd++) {
		if (rd > 0 || f >= 0) {
			wide_sums<E>(ov, val, rd, o, gs + rd * WIDE_BINS, sums);
			wide_sync(bar);
		}
		if (rd == 0 && f >= 0)
			cut = toast_draw_cut(f, __ldcg(z));
		o = toast_draw_pre(o, rd, wide_digit(gs + rd * WIDE_BINS, rd == 2 ? 1024 : 2048, cut, above, sh));
	}
	return o;
}

template <int E>
__global__ void __launch_bounds__(WIDE_THREADS)
	k_pick_wide(const float *x, int n, struct toast_draw d, const __grid_constant__ struct top_recent r,
		    const unsigned long long *prev_key, unsigned long long *g, unsigned *bar, struct pick_out o)
{
	__shared__ unsigned long long sums[WIDE_BINS], sh[34];
	__shared__ unsigned seen[WIDE_THREADS * E / 32];
	int tid = threadIdx.x, c0 = blockIdx.x * WIDE_THREADS * E, i0 = c0 + tid * E;
	float v[E], p[E];
	unsigned ov[E], m = 0;
#pragma unroll
	for (int q = 0; q < E; q++)
		v[q] = i0 + q < n ? x[i0 + q] : NAN;
	for (int j = blockIdx.x * WIDE_THREADS + tid; j < WIDE_TIE; j += gridDim.x * WIDE_THREADS)
		g[j] = 0; /* (first added to after the first barrier) */
	bool penal = d.repeat_penalty != 1.0f;
	if (penal)
		top_seen_bits<WIDE_THREADS * E>(
			(struct top_pen){d.repeat_penalty, d.n_recent, d.last_n, d.prev, r.id, prev_key}, c0, seen);
#pragma unroll
	for (int q = 0; q < E; q++) {
		int j = tid * E + q;
		if (penal && (seen[j >> 5] >> (j & 31) & 1u))
			v[q] = toast_draw_penalize(v[q], d.repeat_penalty);
		ov[q] = toast_draw_order(v[q]);
		m = ov[q] > m ? ov[q] : m;
	}
	for (int s = 16; s > 0; s >>= 1)
		m = max(m, __shfl_xor_sync(0xffffffffu, m, s));
	if ((tid & 31) == 0)
		atomicMax(bar + 1, m);
	wide_sync(bar);
	unsigned omax = __ldcg(bar + 1);
	if (omax == 0) { /* nothing but NaN: token 0 */
		if (blockIdx.x == 0 && tid == 0)
			pick_emit(0ull, o, NULL);
		wide_sync(bar);
		if (blockIdx.x == 0 && tid == 0)
			bar[1] = 0;
		return;
	}
	unsigned long long w[E], tot;
	bool cand[E];
#pragma unroll
	for (int q = 0; q < E; q++) {
		w[q] = ov[q] != 0; /* (first a count) */
		cand[q] = ov[q] != 0;
	}
	if (d.top_k > 0) {
		/* the top_k largest keys (toast_top_key's): the order of the k-th found by three rounds
		 * of counts, then, of the candidates of that order, the first need by index */
		unsigned long long cnt = 0;
#pragma unroll
		for (int q = 0; q < E; q++)
			cnt += w[q];
		wide_sums<E>(ov, w, 0, 0, g + WIDE_CNT, sums);
		wide_scan(cnt, sh, &tot);
		if (tid == 0)
			atomicAdd(g + WIDE_N, tot);
		wide_sync(bar);
		if ((unsigned long long)d.top_k < __ldcg(g + WIDE_N)) {
			unsigned long long above, ties = 0;
			unsigned kth = wide_search<E>(ov, w, g + WIDE_CNT, -1, NULL, (unsigned long long)d.top_k - 1, &above,
						      sums, sh, bar);
#pragma unroll
			for (int q = 0; q < E; q++)
				ties += ov[q] == kth;
			unsigned long long before = wide_scan(ties, sh, &tot), need = (unsigned long long)d.top_k - above;
			if (tid == 0)
				g[WIDE_TIE + blockIdx.x] = tot;
			wide_sync(bar);
			before += wide_before(g + WIDE_TIE, sh, NULL);
#pragma unroll
			for (int q = 0; q < E; q++) {
				cand[q] = ov[q] > kth || (ov[q] == kth && before < need);
				before += ov[q] == kth;
			}
		}
	}
	float vmax = top_key_val((unsigned long long)omax << 32), ymax = vmax / d.temperature;
	unsigned long long zs = 0;
#pragma unroll
	for (int q = 0; q < E; q++) {
		p[q] = !cand[q] ? -1.0f : v[q] == vmax ? 1.0f : toast_draw_exp(v[q] / d.temperature - ymax);
		w[q] = cand[q] ? toast_draw_weight(p[q]) : 0;
		zs += w[q];
	}
	wide_scan(zs, sh, &tot);
	if (tid == 0)
		atomicAdd(g + WIDE_Z, tot);
	unsigned least = 0; /* the nucleus' least order */
	if (d.top_p < 1) {
		unsigned long long above;
		least = wide_search<E>(ov, w, g, d.top_p, g + WIDE_Z, 0, &above, sums, sh, bar);
	}
	unsigned long long ts = 0;
	bool kept[E];
#pragma unroll
	for (int q = 0; q < E; q++) {
		kept[q] = cand[q] && ov[q] >= least && (p[q] >= d.min_p || p[q] == 1.0f);
		ts += kept[q] ? w[q] : 0;
	}
	unsigned long long excl = wide_scan(ts, sh, &tot);
	if (tid == 0)
		g[WIDE_BSUM + blockIdx.x] = tot;
	wide_sync(bar);
	unsigned long long kz, off = wide_before(g + WIDE_BSUM, sh, &kz);
	unsigned long long cut = toast_draw_cut(d.u, kz) - off; /* (wraps below: not here) */
	if (cut < tot && excl <= cut && cut < excl + ts) { /* the token is this thread's */
		unsigned long long acc = excl;
#pragma unroll
		for (int q = 0; q < E; q++)
			if (kept[q] && (acc += w[q]) > cut) {
				pick_emit(top_key(v[q], i0 + q), o, NULL);
				break;
			}
	}
	if (blockIdx.x == 0 && tid == 0)
		bar[1] = 0; /* (every block read it before the last barrier) */
}

static void (*const pick_wide_k[])(const float *, int, struct toast_draw, const struct top_recent, const unsigned long long *,
				   unsigned long long *, unsigned *, struct pick_out) = {
	k_pick_wide<1>, k_pick_wide<2>, k_pick_wide<4>, k_pick_wide<8>};

/* the instances by log2 C (top_ci) */
static void (*const top_runs_k[])(const float *, int, int, unsigned long long *, unsigned long long *, unsigned *) = {
	k_top_runs<1>, k_top_runs<2>, k_top_runs<4>, k_top_runs<8>};
static void (*const pick_draw_k[])(const float *, int, struct toast_draw, const struct top_recent, const unsigned long long *,
				   bool, unsigned long long *, unsigned *, struct pick_out) = {
	k_pick_draw<1>, k_pick_draw<2>, k_pick_draw<4>, k_pick_draw<8>};

/* the draw d over every logit (top_k 0 or over TOAST_TOP_MAX) by k_pick_wide: E logits a thread,
 * the least E that lets every block be resident at once */
static void pick_wide(struct cuda_backend *cb, const float *x, int n, const struct toast_draw *d,
		      const struct top_recent &r, struct pick_out o, const unsigned long long *prev_key)
{
	for (int ei = 0; ei < 4; ei++) {
		if (!cb->wide_per_sm[ei])
			cb->wide_per_sm[ei] = cu_per_sm((const void *)pick_wide_k[ei], WIDE_THREADS, 0);
		unsigned blocks = cu_blocks((size_t)n, WIDE_THREADS << ei);
		if (blocks > (unsigned)(cb->wide_per_sm[ei] * cb->n_sm) || blocks > CU_PICK_KEYS - WIDE_BSUM)
			continue;
		cu_launch_coop(cb, pick_wide_k[ei], blocks, WIDE_THREADS, 0, x, n, *d, r, prev_key, cb->d_pick,
			       cb->counters + CU_CTR_WIDE, o);
		cu_launched(cb, "pick (every logit)");
		return;
	}
	cu_fail_msg(cb, "pick: a draw from every one of %d logits (at most %d on this device)", n,
		    cb->wide_per_sm[3] * cb->n_sm * WIDE_THREADS * 8);
}

/* a pick of x[0, n) (d NULL: the largest; else drawn by d) into o; prev_key (device memory):
 * the key of the pick queued before it */
static void pick_launch(struct cuda_backend *cb, const float *x, int n, const struct toast_draw *d,
			struct pick_out o, const unsigned long long *prev_key)
{
	unsigned *counter = cb->counters + CU_CTR_PICK;
	if (!d) {
		unsigned blocks = cu_blocks((size_t)n, 4 * TOP_BLOCK), cap = 2u * cb->n_sm;
		cu_launch(cb, k_pick, blocks < cap ? blocks : cap, TOP_BLOCK, 0, x, n, cb->d_pick, counter, o);
		cu_launched(cb, "pick");
		return;
	}
	/* with a penalty over 1, the runs are made of the penalised logits (scan) where the draw's k
	 * best of them are among the n_top largest, as toast_sampler_top_need says: where the k it
	 * draws from and the tokens seen fit in n_top (toast_draw_pick's answer is then the same);
	 * from every logit (n_top 0), with any penalty: toast_pick_host's answer */
	struct toast_draw dd = *d;
	bool every = d->n_top == 0,
	     wide = every && d->temperature > 0 && (d->top_k == 0 || d->top_k > TOAST_TOP_MAX);
	if (every)
		dd.n_top = d->temperature <= 0 ? 1 : d->top_k;
	int k = d->temperature <= 0 ? 1 : d->top_k > 0 && d->top_k < dd.n_top ? d->top_k : dd.n_top;
	int seen = d->n_recent + (d->prev ? 1 : 0) - (d->prev && d->n_recent >= d->last_n ? 1 : 0);
	bool scan = every || (d->repeat_penalty > 1.0f && d->n_top >= k + seen);
	int ci = top_ci(scan ? k : dd.n_top);
	if ((!wide && (dd.n_top < 1 || dd.n_top > TOAST_TOP_MAX || top_parts(n, 1 << ci) > CU_PICK_KEYS)) || d->n_recent < 0 ||
	    d->n_recent > TOAST_TOP_MAX) {
		cu_fail_msg(cb, "pick: a draw from the %d best of %d logits, %d seen lately (at most %d of %d)", d->n_top,
			    n, d->n_recent, TOAST_TOP_MAX, CU_PICK_KEYS * 16);
		return;
	}
	struct top_recent r = {};
	if (d->repeat_penalty != 1.0f && d->n_recent > 0)
		memcpy(r.id, d->recent, (size_t)d->n_recent * sizeof(r.id[0]));
	if (wide) {
		pick_wide(cb, x, n, &dd, r, o, prev_key);
		return;
	}
	cu_launch(cb, pick_draw_k[ci], cu_blocks((size_t)n, top_chunk(1 << ci)), TOP_RWARPS * 32, 0, x, n, dd, r,
		  prev_key, scan, cb->d_pick, counter, o);
	cu_launched(cb, "pick");
}

void cu_pick(struct cuda_backend *cb, const float *x, int n, const struct toast_draw *d, int slot, int pos)
{
	unsigned long long *keys = cb->d_pick + CU_PICK_KEYS; /* (the two slots' keys) */
	pick_launch(cb, x, n, d, (struct pick_out){cb->dh_pick + slot, keys + slot, cb->d_step, pos}, keys + (slot ^ 1));
}

int cu_pick_rows(struct cuda_backend *cb, const float *x, int n, int rows, const struct toast_draw *d, int32_t *ids)
{
	if (rows < 1 || rows > TOAST_TOP_MAX || n < 1)
		return -1;
	for (int r = 0; r < rows; r++) { /* (keys land in h_top) */
		if (d && d[r].prev)
			return -1;
		pick_launch(cb, x + (size_t)r * n, n, d ? d + r : NULL, (struct pick_out){cb->dh_top + r, NULL, NULL, 0},
			    NULL);
	}
	if (cb->failed || cu_fail(cb, cudaStreamSynchronize(cb->stream), "picks read"))
		return -1;
	for (int r = 0; r < rows; r++)
		ids[r] = (unsigned)(cb->h_top[r] >> 32) ? cu_key_id(cb->h_top[r]) : 0;
	return 0;
}

int cu_top(struct cuda_backend *cb, const float *x, int n, int m, int32_t *ids, float *vals)
{
	if (m < 1 || m > TOAST_TOP_MAX || n < 1)
		return 0;
	unsigned long long *keys = cb->h_top;
	const unsigned long long *res; /* device: the keys in order, best first */
	if (m == 1) {
		pick_launch(cb, x, n, NULL, (struct pick_out){cb->dh_top, NULL, NULL, 0}, NULL); /* (lands in h_top) */
		res = NULL;
	} else {
		int ci = top_ci(m), R = 32 << ci;
		size_t parts = top_parts(n, 1 << ci);
		unsigned long long *buf = (unsigned long long *)cu_scratch(cb, (parts + R) * sizeof(*buf));
		if (!buf)
			return -1;
		cu_launch(cb, top_runs_k[ci], cu_blocks((size_t)n, top_chunk(1 << ci)), TOP_RWARPS * 32, 0, x, n, m, buf + R,
			  buf, cb->counters + CU_CTR_TOP);
		cu_launched(cb, "top");
		res = buf;
	}
	int k = m < n ? m : n;
	if (cb->failed ||
	    (res && cu_fail(cb, cudaMemcpyAsync(keys, res, (size_t)k * sizeof(keys[0]), cudaMemcpyDeviceToHost,
						cb->stream), "top read")) ||
	    cu_fail(cb, cudaStreamSynchronize(cb->stream), "top read"))
		return -1;
	int got = 0;
	for (int j = 0; j < k; j++) {
		unsigned o = (unsigned)(keys[j] >> 32);
		if (o == 0)
			break; /* NaN (or padding): nothing below it counts */
		ids[got] = cu_key_id(keys[j]);
		vals[got++] = top_key_val(keys[j]);
	}
	return got;
}
