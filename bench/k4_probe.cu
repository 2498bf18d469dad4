/*
 * k4_probe.cu - what bounds a Q4_K decode GEMV's byte rate on the GPU at hand. The kernel's
 * structure is k_gemv_k4's (8 warps a block, two blocks an SM, one wave of blocks each taking
 * consecutive tiles of 16 rows, a warp's units of one superblock of a tile, two in flight, the
 * tensor-core products of cu_kq<Q4_K>), run three ways:
 *
 *   full   the loads, the scales and the products, as the kernel does them
 *   load   the same loads, folded by XOR (no scales, no products): what the reads alone get
 *   comp   no weight loads (each unit's words made from its index): what the work alone gets
 *
 * each in two layouts of the weights on the device:
 *
 *   rows   row-major split planes (Q4_K's device layout until the nineteenth session): a row's
 *          codes 128 bytes a superblock, a lane's 8-byte loads from 8 rows an instruction (a
 *          sector of each); headers 16 bytes from 16 rows
 *   tile   a tile's superblock as its lanes read it (the device layout since, cu_tq_off): a
 *          lane's 64 bytes (rows g and g + 8) together, 4 loads of 16 bytes, an instruction
 *          512 contiguous bytes; the 16 rows' headers in 256 contiguous bytes
 *
 * The tile layout is built from the rows layout on the device, and full/rows and full/tile must
 * give the same sums (checked). The copy bandwidth is measured in the same run.
 *
 * Usage: k4_probe [ROWS [N_IN]]   (default 151936 x 2048, Qwen3-Next's lm_head: 175 MB)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cu_quant.cuh"
#include "probe.cuh"


#define WARPS 8
enum { FULL, LOAD, COMP };
enum { ROWS, TILE };

typedef cu_kq<TOAST_DT_Q4_K> K;

/* unit (tile, superblock sb) of the lane: its loads in layout L */
template <int L>
__device__ __forceinline__ K::ld unit_load(const uint8_t *q, const uint8_t *m, int nsb, int64_t tile, int sb, int lane)
{
	K::ld r;
	if (L == ROWS) {
		int64_t r0 = tile * 16;
		const uint8_t *ra = q + (r0 + (lane >> 2)) * nsb * 128, *rb = q + (r0 + (lane >> 2) + 8) * nsb * 128;
		const uint8_t *rh = m + (r0 + (lane & 15)) * nsb * 16;
		cu_k4_codes(r.a, r.b, ra + sb * 128, rb + sb * 128, lane & 3);
		r.h = cu_ld16(rh + sb * 16);
	} else {
		cu_k4_tile_codes(r.a, r.b, q + (tile * nsb + sb) * 2048 + 16 * lane);
		r.h = cu_ld16(m + (tile * nsb + sb) * 256 + 16 * (lane & 15));
	}
	return r;
}

/* the rows layout rearranged as the tile one: a thread a lane's 16 bytes */
__global__ void k_to_tile(const uint8_t *q, const uint8_t *m, int64_t tiles, int nsb, uint8_t *tq, uint8_t *tm)
{
	int64_t n = tiles * nsb * 128;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		int lane = (int)(i & 31), k = (int)((i >> 5) & 3);
		int64_t us = i >> 7, tile = us / nsb;
		int sb = (int)(us - tile * nsb), g = lane >> 2, t = lane & 3;
		const uint8_t *ra = q + (tile * 16 + g) * nsb * 128 + sb * 128 + 32 * k + 8 * t;
		const uint8_t *rb = q + (tile * 16 + g + 8) * nsb * 128 + sb * 128 + 32 * k + 8 * t;
		uint2 a = *(const uint2 *)ra, b = *(const uint2 *)rb;
		*(uint4 *)(tq + us * 2048 + 512 * k + 16 * lane) = make_uint4(a.x, a.y, b.x, b.y);
		if (k == 0 && lane < 16)
			*(uint4 *)(tm + us * 256 + 16 * lane) = *(const uint4 *)(m + (tile * 16 + lane) * nsb * 16 + sb * 16);
	}
}

template <int MODE, int L>
__global__ void __launch_bounds__(WARPS * 32, 2)
	k_probe(const uint8_t *q, const uint8_t *m, int64_t tiles, int nsb, int rt, float *out)
{
	__shared__ __align__(16) bf16 xs[8192];
	__shared__ float xsum[256];
	__shared__ __align__(16) float4 scs[WARPS][64];
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
	int n_in = nsb * 256;
	for (int i = threadIdx.x; i < n_in; i += blockDim.x)
		xs[i] = __float2bfloat16(0.01f * (i & 63));
	for (int i = threadIdx.x; i < n_in / 32; i += blockDim.x)
		xsum[i] = 0.1f * i;
	int64_t tile0 = (int64_t)blockIdx.x * rt;
	int ntile = (int)min((int64_t)rt, tiles - tile0);
	int mu = warp < nsb ? (nsb - warp + WARPS - 1) / WARPS : 0, units = max(ntile, 0) * mu;
	int lt = 0, lk = 0;
	auto load = [&]() {
		K::ld r;
		if (MODE == COMP) {
			unsigned s = (unsigned)((tile0 + lt) * 977 + lk * 131 + lane);
#pragma unroll
			for (int i = 0; i < 4; i++)
				r.a[i] = make_uint2(s * 0x9e3779b9u + i, s ^ (i << 7)), r.b[i] = make_uint2(s + 3 * i, s * 5 + i);
			r.h = make_uint4(0x3c003c00u ^ (s & 0xff), s, s * 3, s * 7);
		} else
			r = unit_load<L>(q, m, nsb, tile0 + lt, warp + WARPS * lk, lane);
		if (++lk == mu)
			lk = 0, lt++;
		return r;
	};
	K::ld U[2];
	if (units > 0)
		U[0] = load();
	if (units > 1)
		U[1] = load();
	__syncthreads();
	float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
	unsigned fold = 0;
	int ct = 0, ck = 0;
	for (int i0 = 0; i0 < units; i0 += 2) {
#pragma unroll
		for (int k = 0; k < 2; k++) {
			int i = i0 + k;
			if (i >= units)
				break;
			int sb = warp + WARPS * ck;
			if (MODE == LOAD) {
#pragma unroll
				for (int p = 0; p < 4; p++)
					fold ^= U[k].a[p].x ^ U[k].a[p].y ^ U[k].b[p].x ^ U[k].b[p].y;
				fold ^= U[k].h.x ^ U[k].h.y ^ U[k].h.z ^ U[k].h.w;
			} else {
				__syncwarp();
				K::scales(cu_wd{}, U[k], scs[warp], lane);
				__syncwarp();
				K::mma<1>(acc, U[k], scs[warp], xs + sb * 256, xsum + sb * 8, xsum + sb * 8, 1.0f, g, t);
			}
			if (i + 2 < units)
				U[k] = load();
			if (ck == mu - 1) { /* the tile's last unit of this warp */
				if (t == 0) {
					float *o = out + ((tile0 + ct) * WARPS + warp) * 16;
					o[g] = acc[0] + __uint_as_float(fold & 0x007fffffu);
					o[g + 8] = acc[2];
				}
				acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
			}
			if (++ck == mu)
				ck = 0, ct++;
		}
	}
}

__global__ void k_fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n / 4; i += (size_t)gridDim.x * blockDim.x) {
		unsigned x = (unsigned)i * 0x9e3779b9u ^ seed;
		x ^= x >> 15;
		x *= 0x2c1b3c6du;
		x ^= x >> 12;
		((unsigned *)p)[i] = x;
	}
}

/* headers with finite f16 d and dmin (the rest random) */
__global__ void k_fix_headers(uint8_t *m, size_t n_hdr)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_hdr; i += (size_t)gridDim.x * blockDim.x) {
		unsigned *h = (unsigned *)(m + 16 * i);
		h[0] = (h[0] & 0x03ff03ffu) | 0x1c001c00u; /* d, dmin in [2^-8, 2^-7) */
	}
}

static int n_sm;

/* us a launch, the median of 9 runs of 10 launches back to back */
template <int MODE, int L>
static double run(const uint8_t *q, const uint8_t *m, int64_t tiles, int nsb, float *out, cudaStream_t s)
{
	int blocks = 2 * n_sm, rt = (int)((tiles + blocks - 1) / blocks);
	blocks = (int)((tiles + rt - 1) / rt);
	cudaEvent_t e0, e1;
	CHECK(cudaEventCreate(&e0));
	CHECK(cudaEventCreate(&e1));
	float t[9];
	for (int r = 0; r < 9; r++) {
		CHECK(cudaEventRecord(e0, s));
		for (int k = 0; k < 10; k++)
			k_probe<MODE, L><<<blocks, WARPS * 32, 0, s>>>(q, m, tiles, nsb, rt, out);
		CHECK(cudaEventRecord(e1, s));
		CHECK(cudaEventSynchronize(e1));
		CHECK(cudaEventElapsedTime(&t[r], e0, e1));
		t[r] /= 10;
	}
	CHECK(cudaGetLastError());
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	for (int i = 0; i < 9; i++)
		for (int j = i + 1; j < 9; j++)
			if (t[j] < t[i]) {
				float x = t[i];
				t[i] = t[j];
				t[j] = x;
			}
	return t[4] * 1e3;
}

int main(int argc, char **argv)
{
	int64_t rows = argc > 1 ? atoll(argv[1]) : 151936;
	int n_in = argc > 2 ? atoi(argv[2]) : 2048;
	if (rows < 16 || rows % 16 || rows > (1 << 22) || n_in < 256 || n_in % 256 || n_in > 8192) {
		fprintf(stderr, "k4_probe: ROWS a multiple of 16 up to 2^22, N_IN a multiple of 256 up to 8192\n");
		return 2;
	}
	cudaDeviceProp prop;
	CHECK(cudaGetDeviceProperties(&prop, 0));
	n_sm = prop.multiProcessorCount;
	int nsb = n_in / 256;
	int64_t tiles = rows / 16;
	size_t qb = (size_t)rows * nsb * 128, mb = (size_t)rows * nsb * 16, bytes = qb + mb;
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	uint8_t *q, *m, *tq, *tm;
	float *out, *out2;
	CHECK(cudaMalloc(&q, qb));
	CHECK(cudaMalloc(&m, mb));
	CHECK(cudaMalloc(&tq, qb));
	CHECK(cudaMalloc(&tm, mb));
	size_t on = (size_t)tiles * WARPS * 16;
	CHECK(cudaMalloc(&out, on * 4));
	CHECK(cudaMalloc(&out2, on * 4));
	k_fill<<<4 * n_sm, 256, 0, s>>>(q, qb, 1);
	k_fill<<<4 * n_sm, 256, 0, s>>>(m, mb, 2);
	k_fix_headers<<<4 * n_sm, 256, 0, s>>>(m, mb / 16);
	k_to_tile<<<4 * n_sm, 256, 0, s>>>(q, m, tiles, nsb, tq, tm);
	CHECK(cudaStreamSynchronize(s));

	double bw = probe_copy_bw(s); /* in the same run */

	/* the two layouts give the same sums */
	int blocks = 2 * n_sm, rt = (int)((tiles + blocks - 1) / blocks);
	blocks = (int)((tiles + rt - 1) / rt);
	CHECK(cudaMemsetAsync(out, 0, on * 4, s));
	CHECK(cudaMemsetAsync(out2, 0, on * 4, s));
	k_probe<FULL, ROWS><<<blocks, WARPS * 32, 0, s>>>(q, m, tiles, nsb, rt, out);
	k_probe<FULL, TILE><<<blocks, WARPS * 32, 0, s>>>(tq, tm, tiles, nsb, rt, out2);
	CHECK(cudaStreamSynchronize(s));
	float *h1 = (float *)malloc(on * 4), *h2 = (float *)malloc(on * 4);
	CHECK(cudaMemcpy(h1, out, on * 4, cudaMemcpyDeviceToHost));
	CHECK(cudaMemcpy(h2, out2, on * 4, cudaMemcpyDeviceToHost));
	size_t diff = 0, nz = 0;
	for (size_t i = 0; i < on; i++) {
		diff += memcmp(&h1[i], &h2[i], 4) != 0;
		nz += h1[i] != 0.0f;
	}
	printf("k4_probe: %s, %d SMs; %lld x %d Q4_K: %.1f MB; copy %.2f TB/s; layouts agree: %s (%zu of %zu differ, %zu nonzero)\n",
	       prop.name, n_sm, (long long)rows, n_in, bytes / 1e6, bw / 1e12, diff == 0 && nz > on / 4 ? "yes" : "NO",
	       diff, on, nz);
	struct {
		const char *name;
		double us;
	} r[] = {
		{"full rows", run<FULL, ROWS>(q, m, tiles, nsb, out, s)},
		{"full tile", run<FULL, TILE>(tq, tm, tiles, nsb, out, s)},
		{"load rows", run<LOAD, ROWS>(q, m, tiles, nsb, out, s)},
		{"load tile", run<LOAD, TILE>(tq, tm, tiles, nsb, out, s)},
		{"comp", run<COMP, ROWS>(q, m, tiles, nsb, out, s)},
	};
	printf("%-10s %10s %10s %8s\n", "way", "us", "TB/s", "x copy");
	for (auto &x : r)
		printf("%-10s %10.2f %10.3f %8.3f\n", x.name, x.us, bytes / (x.us * 1e-6) / 1e12, bytes / (x.us * 1e-6) / bw);
	free(h1);
	free(h2);
	return diff == 0 && nz > on / 4 ? 0 : 1;
}
