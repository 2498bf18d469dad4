/*
 * k_matmul.cu - out[T][n_out] = in[T][n_in] · Wᵀ with bf16 weights and activations, f32
 * accumulation. Decode-sized T (<= CU_GEMV_MAX_T) runs a GEMV that streams the weight rows
 * with 16-byte loads, two rows per warp; larger T goes to cuBLAS (tensor cores). Shapes that
 * are not 16-byte friendly take a plain kernel.
 */
#include "backend/cuda/cuda_common.cuh"

#define CU_GEMV_MAX_T 8
#define GEMV_WARPS 8
#define GEMV_ROWS_PER_WARP 2

template <int T>
__device__ __forceinline__ void gemv_store(void *out, int mode, int64_t n_out, int64_t r, const float *acc)
{
#pragma unroll
	for (int t = 0; t < T; t++) {
		if (mode == TOAST_MM_ACT)
			((bf16 *)out)[t * n_out + r] = __float2bfloat16(acc[t]);
		else if (mode == TOAST_MM_F32)
			((float *)out)[t * n_out + r] = acc[t];
		else
			((float *)out)[t * n_out + r] += acc[t];
	}
}

/* requires n_in % 8 == 0 and 16-byte aligned W and x */
template <int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32) k_gemv(void *out, int mode, const bf16 *__restrict__ x,
							  const bf16 *__restrict__ W, int64_t n_out, int64_t n_in)
{
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int64_t r0 = ((int64_t)blockIdx.x * GEMV_WARPS + warp) * GEMV_ROWS_PER_WARP;
	if (r0 >= n_out)
		return;
	bool two = r0 + 1 < n_out;
	const uint4 *w0 = (const uint4 *)(W + r0 * n_in);
	const uint4 *w1 = (const uint4 *)(W + (two ? r0 + 1 : r0) * n_in);
	float acc0[T], acc1[T];
#pragma unroll
	for (int t = 0; t < T; t++)
		acc0[t] = acc1[t] = 0.0f;
	int64_t n8 = n_in / 8;
#pragma unroll 2
	for (int64_t i = lane; i < n8; i += 32) {
		uint4 a = __ldg(w0 + i), b = __ldg(w1 + i);
		float fa[8], fb[8];
		cu_bf16x8(a, fa);
		cu_bf16x8(b, fb);
#pragma unroll
		for (int t = 0; t < T; t++) {
			float fx[8];
			cu_bf16x8(__ldg((const uint4 *)(x + t * n_in) + i), fx);
#pragma unroll
			for (int k = 0; k < 8; k++) {
				acc0[t] = fmaf(fa[k], fx[k], acc0[t]);
				acc1[t] = fmaf(fb[k], fx[k], acc1[t]);
			}
		}
	}
#pragma unroll
	for (int t = 0; t < T; t++) {
		acc0[t] = cu_warp_sum(acc0[t]);
		acc1[t] = cu_warp_sum(acc1[t]);
	}
	if (lane == 0) {
		gemv_store<T>(out, mode, n_out, r0, acc0);
		if (two)
			gemv_store<T>(out, mode, n_out, r0 + 1, acc1);
	}
}

/* any shape, any weight dev type: one warp per (row, token) */
__global__ void k_gemv_plain(void *out, int mode, const bf16 *x, const void *W, int wtype, int64_t n_out,
			     int64_t n_in, int T)
{
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp;
	int t = blockIdx.y;
	if (r >= n_out)
		return;
	float acc = 0;
	for (int64_t i = lane; i < n_in; i += 32)
		acc += cu_ldw(W, wtype, r * n_in + i) * __bfloat162float(x[t * n_in + i]);
	acc = cu_warp_sum(acc);
	if (lane == 0)
		gemv_store<1>((char *)out + (size_t)t * n_out * (mode == TOAST_MM_ACT ? 2 : 4), mode, n_out, r, &acc);
}

void cu_gemv(struct cuda_backend *cb, void *out, enum toast_mm_mode mode, const bf16 *in, const bf16 *W,
	     int64_t n_out, int64_t n_in, int T)
{
	unsigned blocks = cu_blocks((size_t)n_out, GEMV_WARPS * GEMV_ROWS_PER_WARP);
	bool fast = n_in % 8 == 0 && (((uintptr_t)in | (uintptr_t)W) & 15) == 0 && T <= CU_GEMV_MAX_T;
	if (!fast) {
		dim3 grid(cu_blocks((size_t)n_out, 8), T);
		k_gemv_plain<<<grid, 256, 0, cb->stream>>>(out, mode, in, W, TOAST_DT_BF16, n_out, n_in, T);
		cu_launched(cb, "gemv (plain)");
		return;
	}
	switch (T) {
#define GEMV_CASE(N)                                                                                          \
	case N:                                                                                               \
		k_gemv<N><<<blocks, GEMV_WARPS * 32, 0, cb->stream>>>(out, mode, in, W, n_out, n_in);         \
		break;
		GEMV_CASE(1)
		GEMV_CASE(2)
		GEMV_CASE(3)
		GEMV_CASE(4)
		GEMV_CASE(5)
		GEMV_CASE(6)
		GEMV_CASE(7)
		GEMV_CASE(8)
#undef GEMV_CASE
	}
	cu_launched(cb, "gemv");
}

void cu_matmul(struct cuda_backend *cb, void *out, enum toast_mm_mode mode, const bf16 *in,
	       const struct toast_weight *W, int T)
{
	if (W->dev_type != TOAST_DT_BF16) {
		dim3 grid(cu_blocks((size_t)W->n_out, 8), T);
		k_gemv_plain<<<grid, 256, 0, cb->stream>>>(out, mode, in, W->dev, W->dev_type, W->n_out, W->n_in, T);
		cu_launched(cb, "matmul (plain)");
		return;
	}
	if (T <= CU_GEMV_MAX_T) {
		cu_gemv(cb, out, mode, in, (const bf16 *)W->dev, W->n_out, W->n_in, T);
		return;
	}
	/* column-major view: outᵀ [n_out x T] = W [n_out x n_in] (row-major = col-major n_in x n_out, op T)
	 * · inᵀ [n_in x T] */
	float alpha = 1.0f, beta = mode == TOAST_MM_ADD ? 1.0f : 0.0f;
	cudaDataType_t ct = mode == TOAST_MM_ACT ? CUDA_R_16BF : CUDA_R_32F;
	cublasStatus_t st = cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)W->n_out, T, (int)W->n_in, &alpha,
					 W->dev, CUDA_R_16BF, (int)W->n_in, in, CUDA_R_16BF, (int)W->n_in, &beta, out, ct,
					 (int)W->n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	if (st != CUBLAS_STATUS_SUCCESS)
		cu_fail_msg(cb, "cublasGemmEx %lldx%dx%lld: status %d", (long long)W->n_out, T, (long long)W->n_in, (int)st);
	cu_launched(cb, "matmul (cublas)");
}
