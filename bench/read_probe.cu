/*
 * read_probe.cu - the rate at which the GPU at hand reads a stream from DRAM, by the shape of
 * the grid that reads it: what decode attention at long context (a bf16 cache of 139 MB a
 * layer at 68K keys, read by one block an SM of 4 warps, each block a contiguous share) could
 * reach, against the copy bandwidth that toasted bench measures (read + written).
 *
 *   wide       4 blocks an SM of 256 threads, grid-stride, 8 loads of 16 bytes in flight a thread
 *   split F    one block an SM of 128 threads, each block a contiguous share, F loads of 16
 *              bytes in flight a thread (F x 2 KB a block); x2: two blocks an SM
 *   bulk S K   one block an SM of 128 threads, its share by bulk copies (cp.async.bulk, the
 *              TMA) of K KB into a ring of S stages in shared memory, each stage read by the
 *              block once it lands
 *
 *   ring K S   decode attention's reads (k_attn_mma at head_dim 256, 2 KV heads): block (split,
 *              KV head) reads its half of 1 KB K and V rows, K keys a tile, by 16-byte cp.async
 *              into a ring of S stages; one block an SM (2/SM: two, twice the splits; 2xS:
 *              twice the splits at one an SM, two waves)
 *
 * Every variant folds what it reads into one word a thread (XOR) so that no load is dead; the
 * wide, split and bulk rows must give the same fold, and the ring rows theirs (checked). The
 * rate is bytes read / time, best of 10.
 *
 * Usage: read_probe [MB]   (default 139: one attention layer's K and V at 68K keys)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "probe.cuh"

__global__ void k_fill(uint4 *p, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = make_uint4((unsigned)i * 2654435761u, (unsigned)(i >> 7) ^ 0x9e3779b9u, (unsigned)i + 17u, ~(unsigned)i);
}

__device__ __forceinline__ unsigned fold(uint4 v)
{
	return v.x ^ v.y ^ v.z ^ v.w;
}

/* the fold of the whole buffer, by atomicXor of each thread's word */
template <int F>
__global__ void k_wide(const uint4 *p, size_t n, unsigned *out)
{
	unsigned acc = 0;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	for (; i + (F - 1) * stride < n; i += F * stride) {
		uint4 v[F];
#pragma unroll
		for (int u = 0; u < F; u++)
			v[u] = __ldcs(p + i + u * stride);
#pragma unroll
		for (int u = 0; u < F; u++)
			acc ^= fold(v[u]);
	}
	for (; i < n; i += stride)
		acc ^= fold(__ldcs(p + i));
	atomicXor(out, acc);
}

/* block b reads elements [b * n / grid, (b + 1) * n / grid), F loads in flight a thread */
template <int F>
__global__ void k_split(const uint4 *p, size_t n, unsigned *out)
{
	size_t b0 = n * blockIdx.x / gridDim.x, b1 = n * (blockIdx.x + 1) / gridDim.x;
	unsigned acc = 0;
	size_t i = b0 + threadIdx.x;
	for (; i + (F - 1) * blockDim.x < b1; i += F * blockDim.x) {
		uint4 v[F];
#pragma unroll
		for (int u = 0; u < F; u++)
			v[u] = __ldcs(p + i + u * blockDim.x);
#pragma unroll
		for (int u = 0; u < F; u++)
			acc ^= fold(v[u]);
	}
	for (; i < b1; i += blockDim.x)
		acc ^= fold(__ldcs(p + i));
	atomicXor(out, acc);
}

__device__ __forceinline__ unsigned smem_addr(const void *p)
{
	return (unsigned)__cvta_generic_to_shared(p);
}

/* the block's share in chunks of `chunk` bytes through a ring of `stages` in shared memory;
 * the share is whole 16-byte elements, chunks 16-byte multiples */
__global__ void k_bulk(const uint4 *p, size_t n, unsigned *out, int stages, int chunk)
{
	extern __shared__ __align__(128) unsigned char ring[];
	__shared__ __align__(8) uint64_t bar[16];
	size_t b0 = n * blockIdx.x / gridDim.x, b1 = n * (blockIdx.x + 1) / gridDim.x;
	const char *src = (const char *)(p + b0);
	size_t bytes = (b1 - b0) * 16;
	int nch = (int)((bytes + chunk - 1) / chunk);
	if (threadIdx.x == 0) {
		for (int s = 0; s < stages; s++)
			asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar[s])));
		asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
	}
	__syncthreads();
	auto issue = [&](int c) {
		int s = c % stages;
		unsigned sz = (unsigned)min((size_t)chunk, bytes - (size_t)c * chunk);
		asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&bar[s])), "r"(sz)
			     : "memory");
		asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
				     smem_addr(ring + (size_t)s * chunk)),
			     "l"(src + (size_t)c * chunk), "r"(sz), "r"(smem_addr(&bar[s]))
			     : "memory");
	};
	if (threadIdx.x == 0)
		for (int c = 0; c < stages && c < nch; c++)
			issue(c);
	unsigned acc = 0;
	for (int c = 0; c < nch; c++) {
		int s = c % stages;
		unsigned parity = (unsigned)(c / stages) & 1, done = 0;
		while (!done)
			asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
				     : "=r"(done)
				     : "r"(smem_addr(&bar[s])), "r"(parity)
				     : "memory");
		int sz = (int)min((size_t)chunk, bytes - (size_t)c * chunk);
		const uint4 *st = (const uint4 *)(ring + (size_t)s * chunk);
		for (int i = threadIdx.x; i < sz / 16; i += blockDim.x)
			acc ^= fold(st[i]);
		__syncthreads(); /* the stage is read: it may be refilled */
		if (threadIdx.x == 0 && c + stages < nch)
			issue(c + stages);
	}
	atomicXor(out, acc);
}

/* decode attention's reads: the bytes as K and V caches [L][2 KV heads][256] bf16 (1 KB rows),
 * block (split, KV head) reads its head's half of rows [j0, j1) of both, KEYS keys a tile, by
 * 16-byte cp.async into a ring of S stages (a K and a V tile each; all but one in flight while
 * the block folds the oldest), as k_attn_mma does */
template <int KEYS, int S>
__global__ void __launch_bounds__(128) k_ring(const uint4 *kc, const uint4 *vc, int L, unsigned *out)
{
	extern __shared__ __align__(128) unsigned char ring[];
	int n_split = gridDim.x, sp = blockIdx.x, kvh = blockIdx.y;
	int chunk = (L + n_split - 1) / n_split, j0 = sp * chunk, j1 = min(L, j0 + chunk);
	int ch = threadIdx.x & 31, r = threadIdx.x >> 5;
	auto load = [&](int i) {
		int jt = j0 + i * KEYS;
		uint4 *st = (uint4 *)(ring + (size_t)(i % S) * KEYS * 1024);
		if (jt < j1)
#pragma unroll 4
			for (int n = 0; n < KEYS / 4; n++) {
				int row = r + 4 * n;
				bool in = jt + row < j1;
				size_t e = ((size_t)(in ? jt + row : j0) * 2 + kvh) * 32 + ch;
				unsigned dk = smem_addr(st + row * 32 + ch), dv = smem_addr(st + (KEYS + row) * 32 + ch);
				asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dk), "l"(kc + e), "r"(in ? 16 : 0)
					     : "memory");
				asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dv), "l"(vc + e), "r"(in ? 16 : 0)
					     : "memory");
			}
		asm volatile("cp.async.commit_group;" ::: "memory");
	};
	int nt = (j1 - j0 + KEYS - 1) / KEYS;
	for (int i = 0; i < S - 1; i++)
		load(i);
	unsigned acc = 0;
	for (int i = 0; i < nt; i++) {
		asm volatile("cp.async.wait_group %0;" ::"n"(S - 2) : "memory");
		__syncthreads();
		const uint4 *st = (const uint4 *)(ring + (size_t)(i % S) * KEYS * 1024);
		int rows = min(KEYS, j1 - j0 - i * KEYS);
		for (int x = threadIdx.x; x < 2 * KEYS * 32; x += 128)
			if ((x / 32) % KEYS < rows)
				acc ^= fold(st[x]);
		__syncthreads(); /* the oldest stage is read: refill it */
		load(i + S - 1);
	}
	atomicXor(out, acc);
}

int main(int argc, char **argv)
{
	size_t mb = argc > 1 ? strtoull(argv[1], NULL, 10) : 139;
	size_t bytes = mb << 20, n = bytes / 16;
	int dev = 0, n_sm = 0;
	CHECK(cudaGetDevice(&dev));
	CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
	cudaStream_t s;
	CHECK(cudaStreamCreate(&s));
	double copy = probe_copy_bw(s);
	uint4 *p;
	unsigned *out, h = 0, ref = 0;
	CHECK(cudaMalloc(&p, bytes));
	CHECK(cudaMalloc(&out, sizeof(unsigned)));
	k_fill<<<4 * n_sm, 256, 0, s>>>(p, n);
	CHECK(cudaGetLastError());
	cudaEvent_t e0, e1;
	CHECK(cudaEventCreate(&e0));
	CHECK(cudaEventCreate(&e1));
	printf("read_probe: %zu MB, %d SMs, copy bandwidth %.2f TB/s (read + written)\n", mb, n_sm, copy / 1e12);
	printf("%-16s %10s %10s %8s\n", "variant", "us", "TB/s", "of copy");
	auto run = [&](const char *name, auto launch) {
		float best = 1e30f;
		for (int r = 0; r < 11; r++) {
			CHECK(cudaMemsetAsync(out, 0, sizeof(unsigned), s));
			CHECK(cudaEventRecord(e0, s));
			launch();
			CHECK(cudaEventRecord(e1, s));
			CHECK(cudaEventSynchronize(e1));
			CHECK(cudaGetLastError());
			float ms = 0;
			CHECK(cudaEventElapsedTime(&ms, e0, e1));
			if (r > 0 && ms < best)
				best = ms;
		}
		CHECK(cudaMemcpy(&h, out, sizeof(unsigned), cudaMemcpyDeviceToHost));
		if (!ref)
			ref = h;
		double bw = bytes / (best * 1e-3);
		printf("%-16s %10.2f %10.2f %7.0f%%%s\n", name, best * 1e3, bw / 1e12, 100 * bw / copy,
		       h == ref ? "" : "  FOLD MISMATCH");
	};
	run("wide", [&] { k_wide<8><<<4 * n_sm, 256, 0, s>>>(p, n, out); });
	run("split 4", [&] { k_split<4><<<n_sm, 128, 0, s>>>(p, n, out); });
	run("split 8", [&] { k_split<8><<<n_sm, 128, 0, s>>>(p, n, out); });
	run("split 16", [&] { k_split<16><<<n_sm, 128, 0, s>>>(p, n, out); });
	run("split 32", [&] { k_split<32><<<n_sm, 128, 0, s>>>(p, n, out); });
	run("split 16 x2", [&] { k_split<16><<<2 * n_sm, 128, 0, s>>>(p, n, out); });
	CHECK(cudaFuncSetAttribute(k_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
	static const int bulk[][2] = {{2, 32}, {3, 32}, {4, 32}, {6, 32}, {3, 64}, {4, 48}, {8, 16}, {12, 16}};
	for (auto &b : bulk) {
		char name[32];
		snprintf(name, sizeof name, "bulk %d x %d KB", b[0], b[1]);
		int st = b[0], ch = b[1] * 1024;
		run(name, [&] { k_bulk<<<n_sm, 128, (size_t)st * ch, s>>>(p, n, out, st, ch); });
	}
	/* the same bytes as attention's K and V caches (the ring rows checked against each other) */
	int L = (int)(bytes / 2048);
	const uint4 *kc = p, *vc = p + (size_t)L * 64;
	ref = 0;
	auto ring_run = [&](const char *name, auto fn, int keys, int st, int per_sm) {
		size_t sm = (size_t)keys * 1024 * st;
		CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
		dim3 grid(per_sm * n_sm / 2, 2);
		run(name, [&] { fn<<<grid, 128, sm, s>>>(kc, vc, L, out); });
	};
	ring_run("ring 64 x 3", k_ring<64, 3>, 64, 3, 1);
	ring_run("ring 64 x 2", k_ring<64, 2>, 64, 2, 1);
	ring_run("ring 32 x 3", k_ring<32, 3>, 32, 3, 1);
	ring_run("ring 32 x 4", k_ring<32, 4>, 32, 4, 1);
	ring_run("ring 32 x 6", k_ring<32, 6>, 32, 6, 1);
	ring_run("ring 16 x 4", k_ring<16, 4>, 16, 4, 1);
	ring_run("ring 16 x 8", k_ring<16, 8>, 16, 8, 1);
	ring_run("ring 32 x 3 2/SM", k_ring<32, 3>, 32, 3, 2);
	ring_run("ring 16 x 4 2/SM", k_ring<16, 4>, 16, 4, 2);
	ring_run("ring 64 x 3 2xS", k_ring<64, 3>, 64, 3, 2);
	cudaFree(p);
	cudaFree(out);
	return 0;
}
