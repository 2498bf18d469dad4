/*
 * k_top.cu - the m largest logits on the device, so that sampling moves m (id, value) pairs to
 * the host instead of the whole vocabulary (contract: toast_backend_ops.top); and the picks
 * (toast_backend_ops.pick), where only a token crosses, written by the device into pinned
 * memory and into the next step's input: the largest (k_pick), or the sampler's draw over the
 * top 32 logits, penalised or not (k_pick_draw), or over the top 256 (the stages below, then
 * k_draw_keys): draw.h's arithmetic, so the same token as the host's draw.
 *
 * Each value becomes one 64-bit key: the float's bits made order-preserving in the high word
 * (-0 as +0, NaN below everything), the complement of the index in the low word. Keys are then
 * all distinct and "larger key" is exactly "larger value, or the same value at a lower index",
 * so the top m is one well-defined set. A stage sorts 2048 keys per block (bitonic, in shared
 * memory) and keeps each block's best m; stages repeat on the survivors until one block is
 * left (151,936 logits: 75 blocks, then 10, then 2, then 1 for m = 256). m = 1 (greedy
 * decoding) needs no sort: the largest key, by a max per block and a last block's (k_pick). m <= 32
 * (sampling's usual top_k, 20 by default) keeps runs of 32 keys in a warp's registers, one a
 * lane, and halves their union by shuffles: one launch, four barriers a block and a last block
 * that merges the blocks' bests (the sorts of 2048 keys took 66 barriers of 1024 threads a stage,
 * and made the top 20 cost a decode step 16-29 us more than the top 1; now 8-13).
 */
#include "backend/cuda/cuda_common.cuh"

#define TOP_BLOCK 1024
#define TOP_CHUNK (2 * TOP_BLOCK)

__device__ __forceinline__ unsigned long long top_key(float v, int i)
{
	unsigned u = __float_as_uint(v == 0.0f ? 0.0f : v);
	unsigned o = isnan(v) ? 0u : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
	return ((unsigned long long)o << 32) | (0xffffffffu - (unsigned)i);
}

/* a key's value (top_key's inverse; -0 comes back as +0) */
__host__ __device__ __forceinline__ float top_key_val(unsigned long long key)
{
	unsigned o = (unsigned)(key >> 32), u = (o & 0x80000000u) ? (o & 0x7fffffffu) : ~o;
	float v;
	memcpy(&v, &u, sizeof(v));
	return v;
}

/* src is the logits (stage 0: x != NULL) or the previous stage's keys */
__global__ void __launch_bounds__(TOP_BLOCK) k_top_stage(const float *x, const unsigned long long *kin, int n, int m,
							 unsigned long long *kout)
{
	__shared__ unsigned long long s[TOP_CHUNK];
	int base = blockIdx.x * TOP_CHUNK;
	for (int j = threadIdx.x; j < TOP_CHUNK; j += TOP_BLOCK) {
		int i = base + j;
		s[j] = i >= n ? 0ull : x ? top_key(x[i], i) : kin[i];
	}
	__syncthreads();
	/* bitonic sort, descending */
	for (int k = 2; k <= TOP_CHUNK; k <<= 1) {
		for (int j = k >> 1; j > 0; j >>= 1) {
			int t = threadIdx.x;
			int a = (t / j) * 2 * j + (t % j), b = a + j;
			bool desc = (a & k) == 0;
			unsigned long long va = s[a], vb = s[b];
			if ((va < vb) == desc) {
				s[a] = vb;
				s[b] = va;
			}
			__syncthreads();
		}
	}
	for (int j = threadIdx.x; j < m; j += TOP_BLOCK)
		kout[(size_t)blockIdx.x * m + j] = s[j];
}

/* the m best keys of x, best first (device memory, NULL on failure): block-wise bitonic sorts,
 * then sorts of the blocks' bests until one block is left */
static const unsigned long long *top_sorted(struct cuda_backend *cb, const float *x, int n, int m)
{
	int g = (int)cu_blocks((size_t)n, TOP_CHUNK);
	/* two ping-pong buffers of g*m keys (the largest stage) */
	unsigned long long *buf = (unsigned long long *)cu_scratch(cb, 2 * (size_t)g * m * sizeof(unsigned long long));
	if (!buf)
		return NULL;
	unsigned long long *a = buf, *b = buf + (size_t)g * m;
	cu_launch(cb, k_top_stage, g, TOP_BLOCK, 0, x, (const unsigned long long *)NULL, n, m, a);
	cu_launched(cb, "top");
	while (g > 1) {
		int n2 = g * m;
		g = (int)cu_blocks((size_t)n2, TOP_CHUNK);
		cu_launch(cb, k_top_stage, g, TOP_BLOCK, 0, (const float *)NULL, (const unsigned long long *)a, n2, m, b);
		cu_launched(cb, "top");
		unsigned long long *t = a;
		a = b;
		b = t;
	}
	return a;
}

/* ---- m <= 32: runs of 32 keys, key i of a run in lane i, largest first ---- */

#define TOP_RUN 32
#define TOP_RWARPS 16                              /* warps a block */
#define TOP_RCHUNK (TOP_RWARPS * 32 * 4)           /* keys a block takes at a time: 4 runs a warp */

/* run v (one key a lane, any order) sorted, largest first: a bitonic sort by shuffles */
__device__ __forceinline__ unsigned long long top_run_sort(unsigned long long v, int lane)
{
#pragma unroll
	for (int k = 2; k <= 32; k <<= 1)
#pragma unroll
		for (int j = k >> 1; j > 0; j >>= 1) {
			unsigned long long o = __shfl_xor_sync(0xffffffffu, v, j);
			bool big = ((lane & j) == 0) == ((lane & k) == 0); /* this lane keeps the larger */
			v = big ? (v > o ? v : o) : (v < o ? v : o);
		}
	return v;
}

/* the best 32 of runs a and b (each sorted): a's key i against b's key 31 - i keeps the best 32
 * as a bitonic sequence, which five steps sort */
__device__ __forceinline__ unsigned long long top_run_merge(unsigned long long a, unsigned long long b, int lane)
{
	unsigned long long r = __shfl_sync(0xffffffffu, b, 31 - lane), v = a > r ? a : r;
#pragma unroll
	for (int j = 16; j > 0; j >>= 1) {
		unsigned long long o = __shfl_xor_sync(0xffffffffu, v, j);
		v = (lane & j) == 0 ? (v > o ? v : o) : (v < o ? v : o);
	}
	return v;
}

/* the best run of keys [i0, i0 + TOP_RCHUNK) (key(i, r): key i, 0 past the end, the thread's r-th
 * of its four; SORTED: every 32 from i0 on are a run already), in warp 0; by the block, s a run
 * per warp */
template <bool SORTED, typename F>
__device__ __forceinline__ unsigned long long top_run_chunk(F key, int i0, unsigned long long *s)
{
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, i = i0 + warp * 128 + lane;
	unsigned long long v[4];
#pragma unroll
	for (int r = 0; r < 4; r++)
		v[r] = SORTED ? key(i + 32 * r, r) : top_run_sort(key(i + 32 * r, r), lane);
	unsigned long long b = top_run_merge(top_run_merge(v[0], v[1], lane), top_run_merge(v[2], v[3], lane), lane);
	s[warp * 32 + lane] = b;
	__syncthreads();
#pragma unroll
	for (int h = TOP_RWARPS / 2; h > 0; h >>= 1) {
		if (warp < h)
			b = top_run_merge(b, s[(warp + h) * 32 + lane], lane);
		__syncthreads(); /* every read of this round before the writes */
		if (warp < h)
			s[warp * 32 + lane] = b;
		__syncthreads();
	}
	return b;
}

/* the tokens seen lately, for a draw's penalty (toast_draw.recent, by value) */
struct top_recent {
	int32_t id[TOAST_TOP_MAX];
};

/* a penalised draw's tokens seen lately (toast_draw_seen's): the last n_recent of last_n in r
 * (oldest first) and, with prev, the pending pick's (its key in device memory) */
struct top_pen {
	float penalty; /* (1: none) */
	int n_recent, last_n;
	bool prev;
	const int32_t *r;
	const unsigned long long *prev_key;
};

/* the bits of the tokens pen counts as seen among [c0, c0 + TOP_RCHUNK), into seen (shared
 * memory), by the block */
__device__ __forceinline__ void top_seen_bits(struct top_pen pen, int c0, unsigned *seen)
{
	if (threadIdx.x < TOP_RCHUNK / 32)
		seen[threadIdx.x] = 0;
	__syncthreads();
	int j0 = pen.prev && pen.n_recent >= pen.last_n ? 1 : 0; /* (prev pushes the oldest out) */
	int nw = pen.n_recent - j0 + (pen.prev ? 1 : 0);
	for (int j = threadIdx.x; j < nw; j += blockDim.x) {
		int32_t id = j0 + j < pen.n_recent ? pen.r[j0 + j] : cu_key_id(__ldcg(pen.prev_key));
		unsigned o = (unsigned)(id - c0);
		if (o < TOP_RCHUNK)
			atomicOr(&seen[o >> 5], 1u << (o & 31));
	}
	__syncthreads();
}

/* the best run of x[0, n) in warp 0 of the last block to finish, true there: each block puts
 * the best run of its chunk into part; the last (a ticket in *counter, zeroed by its caller)
 * merges them. With a penalty (pen.penalty != 1), the keys are of the penalised logits
 * (top_seen_bits): every token is in one chunk, so the run is the best of all the penalised
 * logits, exactly (no wider top needed). */
__device__ __forceinline__ bool top_runs_last(const float *x, int n, struct top_pen pen, unsigned long long *part,
					      unsigned *counter, unsigned long long *s, unsigned *seen,
					      unsigned long long *best)
{
	int lane = threadIdx.x & 31, c0 = blockIdx.x * TOP_RCHUNK, i = c0 + (threadIdx.x >> 5) * 128 + lane;
	bool penal = pen.penalty != 1.0f;
	float v[4]; /* (loaded before the seen bits are made) */
#pragma unroll
	for (int q = 0; q < 4; q++)
		v[q] = i + 32 * q < n ? x[i + 32 * q] : 0.0f;
	if (penal)
		top_seen_bits(pen, c0, seen);
	unsigned long long b = top_run_chunk<false>(
		[&](int j, int q) {
			if (j >= n)
				return 0ull;
			bool hit = penal && (seen[(j - c0) >> 5] >> ((j - c0) & 31) & 1u);
			return top_key(hit ? toast_draw_penalize(v[q], pen.penalty) : v[q], j);
		},
		c0, s);
	if (threadIdx.x < 32)
		part[blockIdx.x * 32 + lane] = b;
	if (!cu_last_block(counter))
		return false;
	int tot = gridDim.x * 32;
	*best = 0;
	for (int i0 = 0; i0 < tot; i0 += TOP_RCHUNK) {
		b = top_run_chunk<true>([&](int j, int) { return j < tot ? __ldcg(part + j) : 0ull; }, i0, s);
		*best = top_run_merge(*best, b, lane); /* (warp 0's; 0 keys rank last) */
	}
	return true;
}

/* the best m <= 32 keys of x[0, n) into out, best first (top_runs_last) */
__global__ void __launch_bounds__(TOP_RWARPS * 32) k_top_runs(const float *x, int n, int m, unsigned long long *part,
							       unsigned long long *out, unsigned *counter)
{
	__shared__ unsigned long long s[TOP_RWARPS * 32];
	unsigned long long best;
	if (!top_runs_last(x, n, (struct top_pen){1.0f}, part, counter, s, NULL, &best))
		return;
	if (threadIdx.x < m)
		out[threadIdx.x] = best;
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

/* a drawn pick in one launch, when the draw d needs only the best 32 (penalised) logits
 * (pick_one_launch): the best run of 32 keys (top_runs_last; with a penalty, of the penalised
 * logits, r and prev_key the tokens seen), then the best or the draw d over the d.top_k best
 * of them that are not NaN, as the host makes it (toast_draw_pick), by one thread; key 0
 * (token 0) when all are NaN */
__global__ void __launch_bounds__(TOP_RWARPS * 32)
	k_pick_draw(const float *x, int n, struct toast_draw d, const __grid_constant__ struct top_recent r,
		    const unsigned long long *prev_key, unsigned long long *part, unsigned *counter, struct pick_out o)
{
	__shared__ unsigned long long s[TOP_RWARPS * 32];
	__shared__ unsigned seen[TOP_RCHUNK / 32];
	__shared__ float vals[TOP_RUN], p[TOP_RUN];
	unsigned long long best;
	struct top_pen pen = {d.repeat_penalty, d.n_recent, d.last_n, d.prev, r.id, prev_key};
	if (!top_runs_last(x, n, pen, part, counter, s, seen, &best) || threadIdx.x >= 32)
		return;
	int lane = threadIdx.x;
	vals[lane] = top_key_val(best);
	/* NaN keys (o 0) rank last: the valid ones are a prefix */
	int k = __popc(__ballot_sync(0xffffffffu, (best >> 32) != 0 && lane < d.n_top));
	k = d.temperature <= 0 ? (k > 0) : d.top_k > 0 && d.top_k < k ? d.top_k : k;
	__syncwarp();
	int pick = lane == 0 && k > 0 && d.temperature > 0 ? toast_draw_top(vals, k, &d, p) : 0;
	best = __shfl_sync(0xffffffffu, best, __shfl_sync(0xffffffffu, pick, 0));
	if (lane == 0)
		pick_emit(k > 0 ? best : 0ull, o, counter);
}

#define TOP_KEYS TOAST_TOP_MAX /* k_draw_keys: a key a thread */

/* a draw of any kind (toast_draw_pick's, draw.h) from the m best keys (top_sorted's), by one
 * block: the penalty on the keys of tokens seen lately (prev_key: the pending pick's, with
 * d.prev), the keys sorted again (bitonic), then the best or the draw by one thread */
__global__ void __launch_bounds__(TOP_KEYS)
	k_draw_keys(const unsigned long long *keys, int m, struct toast_draw d, const __grid_constant__ struct top_recent r,
		    const unsigned long long *prev_key, struct pick_out o)
{
	__shared__ unsigned long long s[TOP_KEYS];
	__shared__ float vals[TOP_KEYS], p[TOP_KEYS];
	int t = threadIdx.x;
	unsigned long long key = t < m ? keys[t] : 0ull;
	if ((key >> 32) != 0 && d.repeat_penalty != 1.0f) {
		int32_t id = cu_key_id(key), prev = d.prev ? cu_key_id(__ldcg(prev_key)) : -1;
		if (toast_draw_seen(&d, r.id, prev, id))
			key = top_key(toast_draw_penalize(top_key_val(key), d.repeat_penalty), id);
	}
	s[t] = key;
	__syncthreads();
	for (int k = 2; k <= TOP_KEYS; k <<= 1) /* bitonic sort, descending */
		for (int j = k >> 1; j > 0; j >>= 1) {
			int q = t ^ j;
			if (q > t) {
				unsigned long long a = s[t], b = s[q];
				if ((a < b) == ((t & k) == 0)) {
					s[t] = b;
					s[q] = a;
				}
			}
			__syncthreads();
		}
	if (t != 0)
		return;
	int n = 0; /* the valid keys (0: NaN or none) are a prefix */
	while (n < m && (s[n] >> 32) != 0)
		n++;
	unsigned long long pick = 0;
	if (n > 0 && d.temperature <= 0) {
		pick = s[0];
	} else if (n > 0) {
		int k = d.top_k > 0 && d.top_k < n ? d.top_k : n;
		for (int i = 0; i < k; i++)
			vals[i] = top_key_val(s[i]);
		pick = s[toast_draw_top(vals, k, &d, p)];
	}
	pick_emit(pick, o, NULL);
}

/* whether the draw d (from the n_top largest logits) is the best or a draw over the best 32 of
 * the (penalised) logits, which k_pick_draw makes in one launch: with no penalty, n_top <= 32;
 * with one over 1, the k it draws from and the tokens seen fit in n_top (the k best penalised
 * logits are then among the n_top largest, as toast_sampler_top_need says) and k <= 32 */
static bool pick_one_launch(const struct toast_draw *d)
{
	int k = d->temperature <= 0 ? 1 : d->top_k > 0 && d->top_k < d->n_top ? d->top_k : d->n_top;
	if (d->repeat_penalty == 1.0f)
		return d->n_top <= TOP_RUN;
	int seen = d->n_recent + (d->prev ? 1 : 0) - (d->prev && d->n_recent >= d->last_n ? 1 : 0); /* (as top_seen_bits) */
	return d->repeat_penalty > 1.0f && k <= TOP_RUN && seen <= TOAST_TOP_MAX && d->n_top >= k + seen;
}

/* a pick of x[0, n) (d NULL: the largest; else drawn by d) into o; prev_key (device memory):
 * the key of the pick queued before it */
static void pick_launch(struct cuda_backend *cb, const float *x, int n, const struct toast_draw *d,
			struct pick_out o, const unsigned long long *prev_key)
{
	unsigned *counter = cb->counters + CU_CTR_PICK;
	unsigned g = cu_blocks((size_t)n, TOP_RCHUNK);
	struct top_recent r = {};
	if (d && (d->n_top < 1 || d->n_top > TOAST_TOP_MAX || d->n_recent < 0 || d->n_recent > TOAST_TOP_MAX)) {
		cu_fail_msg(cb, "pick: a draw from the %d best logits, %d seen lately (at most %d)", d->n_top,
			    d->n_recent, TOAST_TOP_MAX);
		return;
	}
	if (d && d->repeat_penalty != 1.0f)
		memcpy(r.id, d->recent, (size_t)d->n_recent * sizeof(r.id[0]));
	if (d && g <= CU_PICK_BLOCKS && pick_one_launch(d)) {
		cu_launch(cb, k_pick_draw, g, TOP_RWARPS * 32, 0, x, n, *d, r, prev_key, cb->d_pick, counter, o);
	} else if (d) {
		const unsigned long long *keys = top_sorted(cb, x, n, d->n_top);
		if (!keys)
			return;
		cu_launch(cb, k_draw_keys, 1, TOP_KEYS, 0, keys, d->n_top, *d, r, prev_key, o);
	} else {
		unsigned blocks = cu_blocks((size_t)n, 4 * TOP_BLOCK), cap = 2u * cb->n_sm;
		cap = cap < CU_PICK_BLOCKS ? cap : CU_PICK_BLOCKS;
		cu_launch(cb, k_pick, blocks < cap ? blocks : cap, TOP_BLOCK, 0, x, n, cb->d_pick, counter, o);
	}
	cu_launched(cb, "pick");
}

void cu_pick(struct cuda_backend *cb, const float *x, int n, const struct toast_draw *d, int slot, int pos)
{
	unsigned long long *keys = cb->d_pick + CU_PICK_BLOCKS * 32; /* (the two slots' keys) */
	pick_launch(cb, x, n, d, (struct pick_out){cb->dh_pick + slot, keys + slot, cb->d_step, pos}, keys + (slot ^ 1));
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
	} else if (m <= TOP_RUN) {
		unsigned g = cu_blocks((size_t)n, TOP_RCHUNK);
		unsigned long long *buf = (unsigned long long *)cu_scratch(cb, ((size_t)g + 1) * TOP_RUN * sizeof(*buf));
		if (!buf)
			return -1;
		cu_launch(cb, k_top_runs, g, TOP_RWARPS * 32, 0, x, n, m, buf + TOP_RUN, buf, cb->counters + CU_CTR_TOP);
		cu_launched(cb, "top");
		res = buf;
	} else {
		res = top_sorted(cb, x, n, m);
		if (!res)
			return -1;
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
