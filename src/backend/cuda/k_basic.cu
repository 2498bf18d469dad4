/*
 * k_basic.cu - small ops: embedding gather (plain or quantised rows), SwiGLU,
 * synthetic weight fill, f32 -> bf16, many copies in one launch.
 */
#include "backend/cuda/cu_quant.cuh"

/* x[t][i] = W[ids[t]][i]; ids from the step's device copy */
__global__ void k_embed(float *x, const void *W, int type, int64_t n, const int32_t *step)
{
	int t = blockIdx.y;
	int64_t row = step[2 + t];
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		x[t * n + i] = cu_ldw(W, type, row * n + i);
}

/* the same from a quantised table, 8 elements a thread */
__global__ void k_embed_q(float *x, cu_wd W, int64_t n, const int32_t *step)
{
	int t = blockIdx.y;
	int64_t row = step[2 + t], i = 8 * (blockIdx.x * (int64_t)blockDim.x + threadIdx.x);
	if (i < n)
		cu_dq8(W, 0, row, i, x + t * n + i);
}

void cu_embed(struct cuda_backend *cb, float *x, const struct toast_weight *W, int T)
{
	if (toast_dtype_is_quant(W->dev_type)) {
		dim3 grid(cu_blocks((size_t)W->n_in / 8, 256), T);
		cu_launch(cb, k_embed_q, grid, 256, 0, x, cu_wd_weight(W), W->n_in, cb->d_step);
	} else {
		dim3 grid(cu_blocks((size_t)W->n_in, 256), T);
		cu_launch(cb, k_embed, grid, 256, 0, x, W->dev, W->dev_type, W->n_in, cb->d_step);
	}
	cu_launched(cb, "embed");
}

__global__ void k_swiglu(bf16 *out, const float *g, const float *u, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		out[i] = cu_swiglu1(g[i], u[i]);
}

void cu_swiglu(struct cuda_backend *cb, bf16 *out, const float *g, const float *u, int T, int n)
{
	size_t N = (size_t)T * n;
	unsigned blocks = cu_blocks(N, 256);
	cu_launch(cb, k_swiglu, blocks < 65535u ? blocks : 65535u, 256, 0, out, g, u, N);
	cu_launched(cb, "swiglu");
}

/* the device twin of toast_synthetic_value() (backend.c) */
__device__ float cu_synth(uint64_t seed, uint64_t i, int64_t n_in, int64_t n_out)
{
	uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	float u = (float)(z >> 40) * (1.0f / 16777216.0f);
	if (n_out == 1)
		return 0.1f * u;
	return (2.0f * u - 1.0f) / sqrtf((float)n_in);
}

__global__ void k_fill_synthetic(void *dst, int type, size_t n, uint64_t seed, int64_t n_in, int64_t n_out)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		float v = cu_synth(seed, i, n_in, n_out);
		if (type == TOAST_DT_F32)
			((float *)dst)[i] = v;
		else
			((bf16 *)dst)[i] = __float2bfloat16(v);
	}
}

void cu_fill_synthetic(struct cuda_backend *cb, void *dst, enum toast_dtype type, size_t n, uint64_t seed,
		       int64_t n_in, int64_t n_out)
{
	unsigned blocks = cu_blocks(n, 256);
	cu_launch(cb, k_fill_synthetic, blocks < 65535u ? blocks : 65535u, 256, 0, dst, type, n, seed, n_in, n_out);
	cu_launched(cb, "synthetic fill");
}

__global__ void k_f32_to_bf16(bf16 *dst, const float *src, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		dst[i] = __float2bfloat16(src[i]);
}

/* copies of whole 4-byte words, CU_COPY_JOBS a launch (passed by value): 16 bytes at a time where
 * a copy's ends and size allow; blockIdx.y a copy */
#define CU_COPY_JOBS 32
struct cu_copy_jobs {
	void *dst[CU_COPY_JOBS];
	const void *src[CU_COPY_JOBS];
	size_t bytes[CU_COPY_JOBS];
};

__global__ void k_copy_many(cu_copy_jobs j)
{
	int k = blockIdx.y;
	size_t n = j.bytes[k], i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x, step = (size_t)gridDim.x * blockDim.x;
	if ((((uintptr_t)j.dst[k] | (uintptr_t)j.src[k] | n) & 15) == 0)
		for (size_t i = i0; i < n / 16; i += step)
			((uint4 *)j.dst[k])[i] = __ldcs((const uint4 *)j.src[k] + i);
	else
		for (size_t i = i0; i < n / 4; i += step)
			((float *)j.dst[k])[i] = ((const float *)j.src[k])[i];
}

void cu_copy_many(struct cuda_backend *cb, void *const *dst, const void *const *src, const size_t *bytes, int n)
{
	for (int k0 = 0; k0 < n; k0 += CU_COPY_JOBS) {
		cu_copy_jobs j = {};
		int m = n - k0 < CU_COPY_JOBS ? n - k0 : CU_COPY_JOBS;
		size_t most = 0;
		for (int k = 0; k < m; k++) {
			j.dst[k] = dst[k0 + k], j.src[k] = src[k0 + k], j.bytes[k] = bytes[k0 + k];
			most = bytes[k0 + k] > most ? bytes[k0 + k] : most;
		}
		unsigned bx = cu_blocks(most / 16, 256 * 8); /* (eight 16-byte words a thread) */
		cu_launch(cb, k_copy_many, dim3(bx ? bx : 1, m), 256, 0, j);
		cu_launched(cb, "copy many");
	}
}

void cu_f32_to_bf16(struct cuda_backend *cb, bf16 *dst, const float *src, size_t n)
{
	unsigned blocks = cu_blocks(n, 256);
	cu_launch(cb, k_f32_to_bf16, blocks < 65535u ? blocks : 65535u, 256, 0, dst, src, n);
	cu_launched(cb, "f32 to bf16");
}
